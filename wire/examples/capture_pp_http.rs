//! Captures the real-world PROXY protocol and HTTP head fixtures in wire/tests/fixtures/pp/ from haproxy and curl (see its README).
//!
//! Run: `cargo run -p proxy-wire --example capture_pp_http [-- OUT_DIR]`
//! Needs /usr/sbin/haproxy, curl and openssl. Only loopback addresses are used; haproxy is
//! killed before exit (also on panic, via the guard's Drop).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

struct KillOnDrop(Child);
impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // Only the process we spawned, by its handle.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn listener(addr: &str) -> TcpListener {
    TcpListener::bind(addr).unwrap_or_else(|e| panic!("bind {addr}: {e}"))
}

fn free_port(ip: &str) -> u16 {
    listener(&format!("{ip}:0")).local_addr().unwrap().port()
}

/// Accept one connection on `l` (10 s limit), read until EOF, until `done(buf)` holds, or
/// until 500 ms of silence; then optionally send `reply` and close.
fn start_capture(l: &TcpListener, reply: Option<&'static [u8]>, done: fn(&[u8]) -> bool) -> mpsc::Receiver<Vec<u8>> {
    let l = l.try_clone().unwrap();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        l.set_nonblocking(true).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut s = loop {
            match l.accept() {
                Ok((s, _)) => break s,
                Err(_) if Instant::now() < deadline => thread::sleep(Duration::from_millis(10)),
                Err(e) => panic!("no connection arrived: {e}"),
            }
        };
        s.set_nonblocking(false).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            match s.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
            if done(&buf) {
                break;
            }
        }
        if let Some(r) = reply {
            let _ = s.write_all(r);
        }
        tx.send(buf).unwrap();
    });
    rx
}

fn recv(rx: mpsc::Receiver<Vec<u8>>, what: &str) -> Vec<u8> {
    let v = rx.recv_timeout(Duration::from_secs(15)).unwrap_or_else(|_| panic!("{what}: nothing captured"));
    assert!(!v.is_empty(), "{what}: empty capture");
    v
}

fn curl(args: &[&str]) {
    let st = Command::new("curl")
        .args(["-s", "-o", "/dev/null", "--max-time", "5"])
        .args(args)
        // Keep the environment from redirecting curl anywhere but the loopback targets.
        .env_remove("http_proxy")
        .env_remove("https_proxy")
        .env_remove("HTTPS_PROXY")
        .env_remove("all_proxy")
        .env_remove("ALL_PROXY")
        .env_remove("no_proxy")
        .env_remove("NO_PROXY")
        .status()
        .expect("run curl");
    // Failure is expected where the fake proxy closes without answering.
    eprintln!("curl {args:?} -> {st}");
}

/// End of a PROXY header computed straight from the spec (not with the code under test):
/// v2 = 16 + big-endian length at bytes 14..16; v1 = through the first CRLF.
fn pp_header_end(b: &[u8]) -> usize {
    if b.starts_with(b"\r\n\r\n\0\r\nQUIT\n") {
        16 + usize::from(u16::from_be_bytes([b[14], b[15]]))
    } else {
        b.windows(2).position(|w| w == b"\r\n").expect("v1 CRLF") + 2
    }
}

fn has_blank_line(b: &[u8]) -> bool {
    b.windows(4).any(|w| w == b"\r\n\r\n")
}

/// PROXY header followed by a complete HTTP request head.
fn pp_then_head(b: &[u8]) -> bool {
    b.len() > 16 && has_blank_line(&b[pp_header_end_lenient(b)..])
}

fn pp_header_end_lenient(b: &[u8]) -> usize {
    if b.starts_with(b"\r\n\r\n\0\r\nQUIT\n") && b.len() >= 16 {
        (16 + usize::from(u16::from_be_bytes([b[14], b[15]]))).min(b.len())
    } else {
        b.windows(2).position(|w| w == b"\r\n").map_or(b.len(), |p| p + 2)
    }
}

fn save_pp(dir: &Path, name: &str, stream: &[u8]) {
    let end = pp_header_end(stream);
    std::fs::write(dir.join(format!("{name}.bin")), &stream[..end]).unwrap();
    std::fs::write(dir.join(format!("{name}.with_payload.bin")), stream).unwrap();
    eprintln!("{name}: header {end} bytes, stream {} bytes", stream.len());
}

fn save(dir: &Path, name: &str, bytes: &[u8]) {
    std::fs::write(dir.join(format!("{name}.bin")), bytes).unwrap();
    eprintln!("{name}: {} bytes", bytes.len());
}

fn wait_listening(addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        assert!(Instant::now() < deadline, "haproxy did not start listening on {addr}");
        thread::sleep(Duration::from_millis(50));
    }
}

const HTTP_OK: &[u8] = b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
const SNI: &str = "kube-apiserver.shoot--a.svc.cluster.local";

fn main() {
    let out: PathBuf = std::env::args()
        .nth(1)
        .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/pp").into())
        .into();
    std::fs::create_dir_all(&out).unwrap();
    let tmp = std::env::temp_dir().join(format!("pp-capture-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();

    // Self-signed certificate so haproxy has an SNI to put in AUTHORITY and an SSL TLV.
    let key = tmp.join("key.pem");
    let crt = tmp.join("crt.pem");
    let st = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"])
        .args(["-nodes", "-days", "1", "-subj", &format!("/CN={SNI}")])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&crt)
        .stderr(Stdio::null())
        .status()
        .expect("openssl");
    assert!(st.success());
    let pem = tmp.join("both.pem");
    let mut both = std::fs::read(&crt).unwrap();
    both.extend(std::fs::read(&key).unwrap());
    std::fs::write(&pem, both).unwrap();

    // Capture listeners (haproxy backends).
    let l_v2 = listener("127.0.0.1:0");
    let l_v2opts = listener("127.0.0.1:0");
    let l_v2ssl = listener("127.0.0.1:0");
    let l_v1 = listener("127.0.0.1:0");
    let l_v2_6 = listener("[::1]:0");
    let l_v1_6 = listener("[::1]:0");
    let l_chk_v2 = listener("127.0.0.1:0");
    let l_chk_v1 = listener("127.0.0.1:0");
    let port = |l: &TcpListener| l.local_addr().unwrap().port();

    let (f_v2, f_v2opts, f_v2ssl, f_v1, f_ready) = (
        free_port("127.0.0.1"),
        free_port("127.0.0.1"),
        free_port("127.0.0.1"),
        free_port("127.0.0.1"),
        free_port("127.0.0.1"),
    );
    let (f_v2_6, f_v1_6) = (free_port("[::1]"), free_port("[::1]"));

    let cfg = format!(
        r#"global
    nbthread 1
defaults
    mode tcp
    timeout connect 2s
    timeout client 5s
    timeout server 5s
frontend ready
    bind 127.0.0.1:{f_ready}
    tcp-request connection reject
frontend f_v2
    bind 127.0.0.1:{f_v2}
    default_backend b_v2
backend b_v2
    server s 127.0.0.1:{p_v2} send-proxy-v2
frontend f_v2opts
    bind 127.0.0.1:{f_v2opts} ssl crt {pem}
    unique-id-format %{{+X}}o\ %ci:%cp_%fi:%fp_%Ts_%rt:%pid
    default_backend b_v2opts
backend b_v2opts
    server s 127.0.0.1:{p_v2opts} send-proxy-v2 proxy-v2-options authority,unique-id,crc32c
frontend f_v2ssl
    bind 127.0.0.1:{f_v2ssl} ssl crt {pem}
    unique-id-format %{{+X}}o\ %ci:%cp_%fi:%fp_%Ts_%rt:%pid
    default_backend b_v2ssl
backend b_v2ssl
    server s 127.0.0.1:{p_v2ssl} send-proxy-v2 proxy-v2-options ssl,cert-cn,ssl-cipher,cert-sig,cert-key,authority,unique-id,crc32c
frontend f_v1
    bind 127.0.0.1:{f_v1}
    default_backend b_v1
backend b_v1
    server s 127.0.0.1:{p_v1} send-proxy
frontend f_v2_6
    bind [::1]:{f_v2_6}
    default_backend b_v2_6
backend b_v2_6
    server s [::1]:{p_v2_6} send-proxy-v2 proxy-v2-options crc32c
frontend f_v1_6
    bind [::1]:{f_v1_6}
    default_backend b_v1_6
backend b_v1_6
    server s [::1]:{p_v1_6} send-proxy
backend b_chk_v2
    server s 127.0.0.1:{p_chk_v2} send-proxy-v2 proxy-v2-options crc32c check inter 300ms
backend b_chk_v1
    server s 127.0.0.1:{p_chk_v1} send-proxy check inter 300ms
"#,
        pem = pem.display(),
        p_v2 = port(&l_v2),
        p_v2opts = port(&l_v2opts),
        p_v2ssl = port(&l_v2ssl),
        p_v1 = port(&l_v1),
        p_v2_6 = port(&l_v2_6),
        p_v1_6 = port(&l_v1_6),
        p_chk_v2 = port(&l_chk_v2),
        p_chk_v1 = port(&l_chk_v1),
    );
    let cfg_path = tmp.join("haproxy.cfg");
    std::fs::write(&cfg_path, &cfg).unwrap();

    // Health checks start as soon as haproxy does, so arm those captures first.
    let rx_chk_v2 = start_capture(&l_chk_v2, None, |_| false);
    let rx_chk_v1 = start_capture(&l_chk_v1, None, |_| false);

    let haproxy = KillOnDrop(
        Command::new("/usr/sbin/haproxy")
            .arg("-db")
            .arg("-f")
            .arg(&cfg_path)
            .stdin(Stdio::null())
            .spawn()
            .expect("start haproxy"),
    );
    wait_listening(SocketAddr::from(([127, 0, 0, 1], f_ready)));

    let run = |l: &TcpListener, url: String, extra: &[&str]| {
        let rx = start_capture(l, Some(HTTP_OK), pp_then_head);
        let mut args: Vec<&str> = extra.to_vec();
        args.push(&url);
        curl(&args);
        recv(rx, &url)
    };

    save_pp(&out, "pp_v2_haproxy_tcp4", &run(&l_v2, format!("http://127.0.0.1:{f_v2}/"), &[]));
    let resolve = |p: u16| format!("{SNI}:{p}:127.0.0.1");
    let r = resolve(f_v2opts);
    save_pp(
        &out,
        "pp_v2_haproxy_tlvs_crc",
        &run(&l_v2opts, format!("https://{SNI}:{f_v2opts}/"), &["-k", "--resolve", &r]),
    );
    let r = resolve(f_v2ssl);
    save_pp(
        &out,
        "pp_v2_haproxy_ssl_nested",
        &run(&l_v2ssl, format!("https://{SNI}:{f_v2ssl}/"), &["-k", "--resolve", &r]),
    );
    save_pp(&out, "pp_v1_haproxy_tcp4", &run(&l_v1, format!("http://127.0.0.1:{f_v1}/"), &[]));
    save_pp(&out, "pp_v2_haproxy_tcp6_crc", &run(&l_v2_6, format!("http://[::1]:{f_v2_6}/"), &[]));
    save_pp(&out, "pp_v1_haproxy_tcp6", &run(&l_v1_6, format!("http://[::1]:{f_v1_6}/"), &[]));
    save_pp(&out, "pp_v2_haproxy_check_local", &recv(rx_chk_v2, "v2 health check"));
    save_pp(&out, "pp_v1_haproxy_check", &recv(rx_chk_v1, "v1 health check"));
    drop(haproxy);

    // curl speaking PROXY v1 itself, straight to our listener.
    let l = listener("127.0.0.1:0");
    save_pp(&out, "pp_v1_curl_tcp4", &run(&l, format!("http://127.0.0.1:{}/", port(&l)), &["--haproxy-protocol"]));
    let l = listener("[::1]:0");
    save_pp(&out, "pp_v1_curl_tcp6", &run(&l, format!("http://[::1]:{}/", port(&l)), &["--haproxy-protocol"]));

    // Heads curl sends to an HTTP proxy; the fake proxy closes without answering.
    let proxy = listener("127.0.0.1:0");
    let purl = format!("http://127.0.0.1:{}", port(&proxy));
    let head = |args: &[&str]| {
        let rx = start_capture(&proxy, None, has_blank_line);
        curl(args);
        recv(rx, &format!("{args:?}"))
    };
    save(&out, "http_connect_curl", &head(&["-p", "-x", &purl, "https://example.test:443/"]));
    save(
        &out,
        "http_connect_curl_gardener_header",
        &head(&[
            "-p",
            "-x",
            &purl,
            "--proxy-header",
            "X-Gardener-Destination: outbound|443||kube-apiserver.shoot--a.svc.cluster.local",
            "https://kube-apiserver.shoot--a.svc.cluster.local:443/",
        ]),
    );
    let p10 = format!("127.0.0.1:{}", port(&proxy));
    save(
        &out,
        "http_connect_curl_http10_reversed_vpn",
        &head(&[
            "-p",
            "--proxy1.0",
            &p10,
            "--proxy-header",
            "Reversed-VPN: outbound|1194||vpn-seed-server.shoot--a.svc.cluster.local",
            "https://vpn-seed-server:1194/",
        ]),
    );
    save(&out, "http_absolute_form_curl", &head(&["-x", &purl, "http://10.0.0.1:9100/metrics"]));

    // Hand-written heads (documented in the README).
    save(
        &out,
        "http_connect_openvpn_http10",
        b"CONNECT vpn-seed-server:1194 HTTP/1.0\r\nReversed-VPN: outbound|1194||vpn-seed-server.shoot--a.svc.cluster.local\r\n\r\n",
    );
    save(&out, "http_connect_kube_apiserver_egress", b"CONNECT 10.250.0.5:10250 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");

    let _ = std::fs::remove_dir_all(&tmp);
}
