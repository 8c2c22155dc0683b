//! Path P2, the router's PROXY-protocol listener with real senders: haproxy (`send-proxy-v2`)
//! and curl (`--haproxy-protocol`, v1) route by the header's destination; untrusted senders,
//! missing headers and `optional` mode; and bad PROXY input on a raw socket.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;
use testbed::peers::{self, connect_from, free_port, read_to_close, start_haproxy, tls_over};
use testbed::pki::client_config;
use testbed::tls_client::{http_get_request, peer_info};
use testbed::{
    Addresses, Ca, InProc, TempDir, TlsHttpBackend, http_get, metric_value, tls_handshake_error, tls_request,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const WAIT: Duration = Duration::from_secs(15);
/// The name in-cluster clients use for the kube-apiserver; every backend's certificate carries
/// it, with its own CN, so the CN tells which backend answered.
const IN_CLUSTER: &str = "kubernetes.default.svc";
const CN_A: &str = "kube-apiserver.shoot--a.svc.cluster.local";
const CN_B: &str = "kube-apiserver.shoot--b.svc.cluster.local";
const CN_C: &str = "kube-apiserver.shoot--c.svc.cluster.local";
/// The "pod" address clients connect from, so the real client address is recognisable.
const POD: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 9);

fn ip(last: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, last)
}

struct World {
    dir: TempDir,
    ca: Ca,
    a: TlsHttpBackend,
    b: TlsHttpBackend,
    c: TlsHttpBackend,
}

async fn world() -> anyhow::Result<World> {
    let dir = TempDir::new("p2-pp")?;
    let ca = Ca::new("p2-ca")?;
    let a = TlsHttpBackend::start("shoot-a", &ca.server(&[CN_A, IN_CLUSTER])?, None).await?;
    let b = TlsHttpBackend::start("shoot-b", &ca.server(&[CN_B, IN_CLUSTER])?, None).await?;
    let c = TlsHttpBackend::start("shoot-c", &ca.server(&[CN_C, IN_CLUSTER])?, None).await?;
    Ok(World { dir, ca, a, b, c })
}

impl World {
    fn ca_file(&self) -> anyhow::Result<PathBuf> {
        self.ca.write(self.dir.path(), "ca")
    }
}

async fn start_router(dir: &TempDir, listeners: &str) -> anyhow::Result<(InProc, Addresses)> {
    let yaml = format!(
        "admin: {{ listen: 127.0.0.1:0 }}\ntimeouts: {{ handshake: 1s, connect: 2s, idle: 1h }}\ndrain_grace: 1s\nlisteners:\n{listeners}"
    );
    InProc::serve(dir, "sni-router", &yaml).await
}

async fn metrics(addrs: &Addresses) -> anyhow::Result<String> {
    let (code, body) = http_get(addrs.admin()?, "/metrics").await?;
    anyhow::ensure!(code == 200, "/metrics answered {code}");
    Ok(body)
}

fn rejects(m: &str, listener: &str, reason: &str) -> f64 {
    metric_value(m, "seedgate_rejects_total", &[("listener", listener), ("reason", reason)]).unwrap_or(0.0)
}

/// The router's access-log line (written when the connection closes) with all of `needles`.
async fn access_line(router: &InProc, needles: &[&str]) -> anyhow::Result<String> {
    let mut all = vec!["access", "connection closed"];
    all.extend_from_slice(needles);
    router.wait_log_line(&all, WAIT).await
}

/// A TLS GET through `tcp` (already connected, possibly with a PROXY header written): the CN
/// the client saw and the backend's answer.
async fn tls_get(tcp: TcpStream, w: &World, path: &str) -> anyhow::Result<(Option<String>, String)> {
    let mut tls = tls_over(tcp, IN_CLUSTER, client_config(&w.ca, None, &["http/1.1"])?).await?;
    let (cn, _, _) = peer_info(&tls);
    tls.write_all(&http_get_request(IN_CLUSTER, path)).await?;
    let mut out = Vec::new();
    let r = tokio::time::timeout(WAIT, tls.read_to_end(&mut out)).await?;
    if let Err(e) = r {
        anyhow::ensure!(!out.is_empty(), "reading the response: {e}");
    }
    Ok((cn, String::from_utf8_lossy(&out).into_owned()))
}

#[tokio::test]
async fn haproxy_v2_and_curl_v1_route_by_destination() -> anyhow::Result<()> {
    let w = world().await?;
    // haproxy plays the shoot-node proxy on two "advertised apiserver addresses" (same port).
    let port = free_port(&[ip(3), ip(4)])?;
    let listeners = format!(
        "  - name: apiserver-proxy\n    listen: 127.0.0.5:0\n    proxy_protocol: required\n    trusted_proxies: [127.0.0.0/8]\n    routes:\n\
         \x20     - name: shoot-a\n        destination: [127.0.0.3/32:{port}]\n        upstreams: [{a}]\n\
         \x20     - name: shoot-b\n        destination: [127.0.0.4/32:{port}]\n        upstreams: [{b}]\n\
         \x20     - name: shoot-c\n        destination: [127.0.0.5/32]\n        upstreams: [{c}]\n",
        a = w.a.addr(),
        b = w.b.addr(),
        c = w.c.addr()
    );
    let (router, addrs) = start_router(&w.dir, &listeners).await?;
    let gw = addrs.listener("apiserver-proxy")?;

    let front = [SocketAddr::from((ip(3), port)), SocketAddr::from((ip(4), port))];
    let hcfg = format!(
        "global\n    maxconn 100\ndefaults\n    mode tcp\n    timeout connect 5s\n    timeout client 30s\n    timeout server 30s\n\
         frontend shoot_node\n    bind {}\n    bind {}\n    default_backend seed\n\
         backend seed\n    server router {gw} send-proxy-v2 proxy-v2-options crc32c\n",
        front[0], front[1]
    );
    let Some(_haproxy) = start_haproxy(&hcfg, &front).await? else { return Ok(()) };

    for (dst, cn, backend, route) in [(front[0], CN_A, "shoot-a", "shoot-a"), (front[1], CN_B, "shoot-b", "shoot-b")] {
        let tcp = connect_from(IpAddr::V4(POD), dst).await?;
        let me = tcp.local_addr()?;
        let (seen_cn, resp) = tls_get(tcp, &w, "/via-haproxy").await?;
        assert_eq!(seen_cn.as_deref(), Some(cn), "client via {dst} must see {cn}");
        assert!(resp.contains(&format!("backend={backend} ")), "{resp}");
        // The real client (as haproxy saw it), not haproxy's own address, and the destination.
        let line = access_line(&router, &[&format!("client={me} "), &format!("proxy_destination=\"{dst}\"")]).await?;
        assert!(line.contains(&format!("route=\"{route}\"")), "{line}");
        assert!(line.contains("reason=") && !line.contains(&format!("peer={me}")), "{line}");
    }

    // curl sends a v1 header naming itself and the address it connected to (127.0.0.5:<port>):
    // the port-less destination route takes it.
    let ca = w.ca_file()?;
    let ca = ca.to_string_lossy();
    let url = format!("https://{IN_CLUSTER}:{}/via-curl", gw.port());
    let resolve = format!("{IN_CLUSTER}:{}:{}", gw.port(), gw.ip());
    let out = peers::curl(&[
        "-sS",
        "--fail",
        "--haproxy-protocol",
        "--interface",
        "127.0.0.9",
        "--cacert",
        &ca,
        "--resolve",
        &resolve,
        &url,
    ])
    .await?;
    let Some(out) = out else { return Ok(()) };
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "curl failed: {}\n{}", String::from_utf8_lossy(&out.stderr), router.log());
    assert!(body.contains("backend=shoot-c ") && body.contains("path=/via-curl"), "{body}");
    access_line(&router, &["client=127.0.0.9:", &format!("proxy_destination=\"{gw}\""), "route=\"shoot-c\""]).await?;

    let m = metrics(&addrs).await?;
    for route in ["shoot-a", "shoot-b", "shoot-c"] {
        let ok = metric_value(&m, "seedgate_connections_total", &[("route", route), ("result", "ok")]);
        assert_eq!(ok, Some(1.0), "{route}\n{m}");
    }
    assert_eq!(
        metric_value(&m, "seedgate_handshake_duration_seconds_count", &[("protocol", "proxy_destination")]),
        Some(3.0)
    );
    Ok(())
}

#[tokio::test]
async fn untrusted_sender_missing_header_and_optional_mode() -> anyhow::Result<()> {
    let w = world().await?;
    let a = w.a.addr();
    let listeners = format!(
        "  - name: untrusted\n    listen: 127.0.0.1:0\n    proxy_protocol: required\n    trusted_proxies: [127.0.0.2/32]\n    routes:\n\
         \x20     - name: by-dst\n        destination: [10.1.2.3/32:443, 127.0.0.0/8]\n        upstreams: [{a}]\n\
         \x20 - name: required\n    listen: 127.0.0.11:0\n    proxy_protocol: required\n    trusted_proxies: [127.0.0.0/8]\n    routes:\n\
         \x20     - name: by-sni\n        sni: [{IN_CLUSTER}]\n        upstreams: [{a}]\n\
         \x20 - name: optional\n    listen: 127.0.0.12:0\n    proxy_protocol: optional\n    trusted_proxies: [127.0.0.0/8]\n    routes:\n\
         \x20     - name: by-sni\n        sni: [{IN_CLUSTER}]\n        upstreams: [{a}]\n"
    );
    // (Distinct addresses: the config refuses two listeners on the same host:port, port 0 too.)
    let (router, addrs) = start_router(&w.dir, &listeners).await?;
    let (untrusted, required, optional) =
        (addrs.listener("untrusted")?, addrs.listener("required")?, addrs.listener("optional")?);
    let cc = client_config(&w.ca, None, &[])?;

    // curl (from 127.0.0.1) is not a trusted sender: its header is refused, nothing reaches A.
    let ca = w.ca_file()?;
    let ca = ca.to_string_lossy();
    let url = format!("https://{IN_CLUSTER}:{}/", untrusted.port());
    let resolve = format!("{IN_CLUSTER}:{}:127.0.0.1", untrusted.port());
    let Some(out) = peers::curl(&["-sS", "--haproxy-protocol", "--cacert", &ca, "--resolve", &resolve, &url]).await?
    else {
        return Ok(());
    };
    assert!(
        !out.status.success(),
        "an untrusted PROXY header must be refused: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(w.a.connections(), 0, "nothing may reach the upstream");
    access_line(&router, &["client=127.0.0.1:", "reason=\"pp_untrusted_source\""]).await?;

    // The trusted sender 127.0.0.2: its header's source is the client the router logs.
    let mut tcp = connect_from(IpAddr::V4(ip(2)), untrusted).await?;
    let claimed: SocketAddr = "192.0.2.10:5555".parse()?;
    let hdr = proxy_wire::proxy_protocol::encode_v2(claimed, "10.1.2.3:443".parse()?, &Default::default());
    tcp.write_all(&hdr).await?;
    let (cn, resp) = tls_get(tcp, &w, "/trusted").await?;
    assert_eq!(cn.as_deref(), Some(CN_A));
    assert!(resp.contains("backend=shoot-a "), "{resp}");
    access_line(&router, &["client=192.0.2.10:5555 ", "proxy_destination=\"10.1.2.3:443\"", "peer=127.0.0.2:"]).await?;

    // required + no header: refused before routing, even though the SNI has a route.
    let f = tls_handshake_error(required, Some(IN_CLUSTER), cc.clone()).await;
    assert!(f.is_some(), "a connection without a PROXY header must be refused on a required listener");

    // optional + no header: routed by SNI as usual.
    let r = tls_request(optional, Some(IN_CLUSTER), cc.clone(), &http_get_request(IN_CLUSTER, "/plain")).await?;
    assert_eq!(r.peer_cn.as_deref(), Some(CN_A));
    assert!(r.body().contains("backend=shoot-a "), "{}", r.text());
    // optional + a header (curl, v1): still routed by SNI (no destination route), real client logged.
    let url = format!("https://{IN_CLUSTER}:{}/optional-v1", optional.port());
    let resolve = format!("{IN_CLUSTER}:{}:{}", optional.port(), optional.ip());
    let Some(out) = peers::curl(&[
        "-sS",
        "--fail",
        "--haproxy-protocol",
        "--interface",
        "127.0.0.9",
        "--cacert",
        &ca,
        "--resolve",
        &resolve,
        &url,
    ])
    .await?
    else {
        return Ok(());
    };
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("path=/optional-v1"));
    access_line(&router, &["client=127.0.0.9:", "listener=\"optional\"", &format!("sni=\"{IN_CLUSTER}\"")]).await?;

    let m = metrics(&addrs).await?;
    assert_eq!(rejects(&m, "untrusted", "pp_untrusted_source"), 1.0, "{m}");
    assert_eq!(rejects(&m, "required", "pp_missing"), 1.0, "{m}");
    assert_eq!(rejects(&m, "optional", "pp_missing"), 0.0, "{m}");
    Ok(())
}

/// Connect, write `bytes`, and read until the router closes (within [`WAIT`]); returns what
/// the router sent (a PROXY-protocol listener answers bad input with a bare close).
async fn send_and_wait_close(addr: SocketAddr, bytes: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut s = TcpStream::connect(addr).await?;
    s.write_all(bytes).await?;
    read_to_close(&mut s).await
}

#[tokio::test]
async fn bad_proxy_input_is_closed_and_counted() -> anyhow::Result<()> {
    let w = world().await?;
    // A server-speaks-first upstream (SSH style): it greets as soon as it accepts.
    let greeter = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let greeter_addr = greeter.local_addr()?;
    let greeting = tokio::spawn(async move {
        let (mut s, _) = greeter.accept().await?;
        s.write_all(b"SSH-2.0-greeter\r\n").await?;
        s.shutdown().await?;
        let mut rest = Vec::new();
        s.read_to_end(&mut rest).await?;
        anyhow::Ok(rest)
    });
    let listeners = format!(
        "  - name: pp\n    listen: 127.0.0.1:0\n    proxy_protocol: required\n    trusted_proxies: [127.0.0.0/8]\n    routes:\n\
         \x20     - name: by-dst\n        destination: [10.1.2.3/32:443]\n        upstreams: [{}]\n\
         \x20     - name: greeter\n        destination: [10.1.2.4/32:22]\n        upstreams: [{greeter_addr}]\n",
        w.a.addr()
    );
    let (router, addrs) = start_router(&w.dir, &listeners).await?;
    let pp = addrs.listener("pp")?;
    let src: SocketAddr = "192.0.2.7:40000".parse()?;
    let dst: SocketAddr = "10.1.2.3:443".parse()?;
    let opts = proxy_wire::proxy_protocol::V2Options { crc32c: true, ..Default::default() };
    let good = proxy_wire::proxy_protocol::encode_v2(src, dst, &opts);

    // Truncated headers (v2 and v1), then silence: closed at the 1 s handshake deadline.
    for partial in [&good[..20], b"PROXY TCP4 192.0.2.7 ".as_slice()] {
        let got = send_and_wait_close(pp, partial).await?;
        assert!(got.is_empty(), "no answer to a truncated header: {got:?}");
    }
    // v1 longer than 107 bytes without CRLF.
    let long = [b"PROXY TCP4 ".as_slice(), &[b'1'; 120]].concat();
    assert!(send_and_wait_close(pp, &long).await?.is_empty());
    // One wrong byte in the v2 signature: not a PROXY header, so none was sent.
    let mut bad_sig = good.clone();
    bad_sig[8] = b'q';
    assert!(send_and_wait_close(pp, &bad_sig).await?.is_empty());
    // A TLV whose length runs past the header (NOOP, says 10 bytes, 2 present).
    let mut overrun = proxy_wire::proxy_protocol::V2_SIGNATURE.to_vec();
    overrun.extend_from_slice(&[0x21, 0x11, 0, 12 + 5]);
    overrun.extend_from_slice(&[192, 0, 2, 7, 10, 1, 2, 3, 0x9c, 0x40, 0x01, 0xbb]);
    overrun.extend_from_slice(&[proxy_wire::proxy_protocol::PP2_TYPE_NOOP, 0, 10, 0xaa, 0xbb]);
    assert!(send_and_wait_close(pp, &overrun).await?.is_empty());
    // CRC32C that does not match (the first TLV, right after the 12 address bytes).
    let mut bad_crc = good.clone();
    assert_eq!(bad_crc[28], proxy_wire::proxy_protocol::PP2_TYPE_CRC32C, "encoder puts CRC32C first");
    bad_crc[31] ^= 0xff;
    assert!(send_and_wait_close(pp, &bad_crc).await?.is_empty());
    // A LOCAL header (a load balancer's health check) and then the close.
    let local = proxy_wire::proxy_protocol::encode_v2_local();
    {
        let mut s = TcpStream::connect(pp).await?;
        s.write_all(&local).await?;
        s.shutdown().await?;
        assert!(read_to_close(&mut s).await?.is_empty());
    }

    // Stacked headers: the inner one was written by the host the outer one names, which must
    // be trusted too (here 192.0.2.7 is not; 127.0.0.2 is).
    let outer_untrusted = proxy_wire::proxy_protocol::encode_v2(src, "127.0.0.1:443".parse()?, &Default::default());
    assert!(send_and_wait_close(pp, &[outer_untrusted, good.clone()].concat()).await?.is_empty());
    let node: SocketAddr = "127.0.0.2:31000".parse()?;
    let outer = proxy_wire::proxy_protocol::encode_v2(node, "127.0.0.1:443".parse()?, &Default::default());
    let inner = proxy_wire::proxy_protocol::encode_v1("10.250.0.8:42000".parse()?, dst);
    let mut tcp = TcpStream::connect(pp).await?;
    tcp.write_all(&[outer, inner].concat()).await?;
    let (cn, _) = tls_get(tcp, &w, "/stacked").await?;
    assert_eq!(cn.as_deref(), Some(CN_A));
    access_line(&router, &["client=127.0.0.2:31000 ", "proxy_destination=\"10.1.2.3:443\""]).await?;

    // The good header (with its CRC) one byte per write, then TLS: routed by its destination.
    let mut tcp = TcpStream::connect(pp).await?;
    tcp.set_nodelay(true)?;
    for b in &good {
        tcp.write_all(std::slice::from_ref(b)).await?;
        tcp.flush().await?;
        tokio::task::yield_now().await;
    }
    let (cn, resp) = tls_get(tcp, &w, "/dribbled").await?;
    assert_eq!(cn.as_deref(), Some(CN_A));
    assert!(resp.contains("backend=shoot-a "), "{resp}");
    access_line(&router, &["client=192.0.2.7:40000 ", "proxy_destination=\"10.1.2.3:443\""]).await?;

    // A header alone, the client then waits for the server's greeting: a destination route is
    // taken without waiting for payload (or for a second, stacked header that never comes).
    let mut s = TcpStream::connect(pp).await?;
    s.write_all(&proxy_wire::proxy_protocol::encode_v2(src, "10.1.2.4:22".parse()?, &Default::default())).await?;
    let mut hello = [0u8; 17];
    tokio::time::timeout(WAIT, s.read_exact(&mut hello)).await??;
    assert_eq!(&hello, b"SSH-2.0-greeter\r\n");
    s.write_all(b"client").await?;
    s.shutdown().await?;
    assert_eq!(tokio::time::timeout(WAIT, greeting).await???, b"client");

    let m = metrics(&addrs).await?;
    for (reason, n) in [
        ("handshake_timeout", 2.0),
        ("pp_v1_too_long", 1.0),
        ("pp_missing", 1.0),
        ("pp_tlv_overrun", 1.0),
        ("pp_crc_mismatch", 1.0),
        ("pp_local_health_check", 1.0),
        ("pp_untrusted_source", 1.0),
    ] {
        assert_eq!(rejects(&m, "pp", reason), n, "{reason}\n{m}\n{}", router.log());
    }
    assert_eq!(metric_value(&m, "seedgate_connections_total", &[("route", "by-dst"), ("result", "ok")]), Some(2.0));
    assert_eq!(w.a.connections(), 2, "only the good headers reached the upstream");
    let (code, _) = http_get(addrs.admin()?, "/healthz").await?;
    assert_eq!(code, 200);
    assert!(router.running(), "the router survived:\n{}", router.log());
    Ok(())
}
