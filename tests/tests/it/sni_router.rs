//! End-to-end tests of the sni-router binary (path P1): real rustls clients and backends, curl and openssl as third-party clients.
//!
//! The router runs in this process; SIGHUP, SIGTERM and `--check` are tested on the process.

use anyhow::Context as _;
use rustls::AlertDescription;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use testbed::pki::client_config;
use testbed::tls_client::{http_get_request, tls_connect};
use testbed::{
    Addresses, Ca, InProc, Proc, TcpEcho, TempDir, TlsHttpBackend, bin_path, http_get, metric_sum, metric_value,
    poll_until, tls_handshake_error, tls_request,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const WAIT: Duration = Duration::from_secs(15);
const TICK: Duration = Duration::from_millis(20);

/// A real ClientHello (openssl s_client, SNI api.shoot-b.example.com) for raw-socket tests.
const HELLO_SHOOT_B: &[u8] = include_bytes!("../../../wire/tests/fixtures/client_hello/openssl.bin");

struct World {
    dir: TempDir,
    ca: Ca,
    a: TlsHttpBackend,
    b: TlsHttpBackend,
}

async fn world() -> anyhow::Result<World> {
    let dir = TempDir::new("sni-router")?;
    let ca = Ca::new("seedgate-test-ca")?;
    let a = TlsHttpBackend::start("shoot-a", &ca.server(&["api.shoot-a.example.com"])?, None).await?;
    // Backend B requires a client certificate: mTLS must pass through the router untouched.
    let b =
        TlsHttpBackend::start("shoot-b", &ca.server(&["api.shoot-b.example.com", "x.shoot-b.example.com"])?, Some(&ca))
            .await?;
    Ok(World { dir, ca, a, b })
}

fn router_config(extra_listener: &str, routes: &str) -> String {
    format!(
        "admin: {{ listen: 127.0.0.1:0 }}\ntimeouts: {{ handshake: 2s, connect: 2s, idle: 1h }}\ndrain_grace: 5s\nlisteners:\n  - name: gateway\n    listen: 127.0.0.1:0\n{extra_listener}    routes:\n{routes}"
    )
}

fn ab_routes(w: &World) -> String {
    format!(
        "      - name: shoot-a\n        sni: [api.shoot-a.example.com]\n        upstreams: [{}]\n      - name: shoot-b\n        sni: [\"*.shoot-b.example.com\"]\n        upstreams: [{}]\n",
        w.a.addr(),
        w.b.addr()
    )
}

/// The router in this process.
async fn start_router(dir: &TempDir, yaml: &str) -> anyhow::Result<(InProc, Addresses)> {
    InProc::serve(dir, "sni-router", yaml).await
}

/// The router as a process, for what only a process has: signals and its exit.
async fn start_router_process(dir: &TempDir, yaml: &str) -> anyhow::Result<(Proc, Addresses, PathBuf)> {
    Proc::start_with_config(dir, "sni-router", "router", yaml).await
}

async fn metrics(addrs: &Addresses) -> anyhow::Result<String> {
    let (code, body) = http_get(addrs.admin()?, "/metrics").await?;
    anyhow::ensure!(code == 200, "metrics answered {code}");
    Ok(body)
}

#[tokio::test]
async fn routes_by_sni_and_passes_mtls_through() -> anyhow::Result<()> {
    let w = world().await?;
    let (_r, addrs) = start_router(&w.dir, &router_config("", &ab_routes(&w))).await?;
    let gw = addrs.listener("gateway")?;
    let client_id = w.ca.client("kubectl-user")?;

    let r = tls_request(
        gw,
        Some("api.shoot-a.example.com"),
        client_config(&w.ca, None, &["h2", "http/1.1"])?,
        &http_get_request("api.shoot-a.example.com", "/version"),
    )
    .await?;
    assert_eq!(r.peer_cn.as_deref(), Some("api.shoot-a.example.com"));
    assert!(r.body().contains("backend=shoot-a"), "{}", r.text());
    assert!(r.body().contains("sni=api.shoot-a.example.com"), "{}", r.text());

    // Wildcard, upper case and a trailing dot all land on B; B sees the client certificate.
    for sni in ["x.shoot-b.example.com", "X.Shoot-B.Example.COM"] {
        let r = tls_request(gw, Some(sni), client_config(&w.ca, Some(&client_id), &[])?, &http_get_request(sni, "/"))
            .await?;
        assert_eq!(r.peer_cn.as_deref(), Some("api.shoot-b.example.com"), "{sni}");
        assert!(r.body().contains("client_cn=kubectl-user"), "{}", r.text());
    }
    // B refuses a client without a certificate: the router does not terminate TLS.
    let e =
        tls_request(gw, Some("x.shoot-b.example.com"), client_config(&w.ca, None, &[])?, &http_get_request("x", "/"))
            .await;
    assert!(
        e.is_err() || !e.as_ref().unwrap().body().contains("backend=shoot-b"),
        "backend B must require the client cert"
    );

    let m = metrics(&addrs).await?;
    assert_eq!(metric_value(&m, "seedgate_connections_total", &[("route", "shoot-a"), ("result", "ok")]), Some(1.0));
    assert!(metric_sum(&m, "seedgate_proxied_bytes_total", &[("route", "shoot-b"), ("direction", "to_client")]) > 0.0);
    assert!(
        metric_value(&m, "seedgate_handshake_duration_seconds_count", &[("protocol", "tls")]).unwrap_or(0.0) >= 3.0
    );
    assert!(
        metric_value(&m, "seedgate_upstream_connect_duration_seconds_count", &[("route", "shoot-a")]).unwrap_or(0.0)
            >= 1.0
    );
    Ok(())
}

#[tokio::test]
async fn unknown_name_no_sni_and_garbage_are_refused_and_counted() -> anyhow::Result<()> {
    let w = world().await?;
    let (_r, addrs) = start_router(&w.dir, &router_config("", &ab_routes(&w))).await?;
    let gw = addrs.listener("gateway")?;
    let cc = client_config(&w.ca, None, &[])?;

    let f =
        tls_handshake_error(gw, Some("api.nobody.example.com"), cc.clone()).await.context("unknown SNI must fail")?;
    assert!(f.is_alert(AlertDescription::UnrecognisedName), "{f:?}");
    let f = tls_handshake_error(gw, None, cc.clone()).await.context("no SNI must fail")?;
    assert!(f.is_alert(AlertDescription::UnrecognisedName), "{f:?}");

    // Not TLS at all: closed without a byte of answer.
    let mut s = TcpStream::connect(gw).await?;
    s.write_all(b"SSH-2.0-OpenSSH_9.2\r\n").await?;
    let mut buf = Vec::new();
    tokio::time::timeout(WAIT, s.read_to_end(&mut buf)).await??;
    assert!(buf.is_empty(), "no answer to non-TLS input, got {buf:?}");

    // A ClientHello with a broken length: decode_error alert.
    let mut bad = HELLO_SHOOT_B.to_vec();
    bad[5] = 2; // handshake type server_hello
    let mut s = TcpStream::connect(gw).await?;
    s.write_all(&bad).await?;
    let mut buf = Vec::new();
    tokio::time::timeout(WAIT, s.read_to_end(&mut buf)).await??;
    assert_eq!(buf, [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 50], "fatal decode_error alert");

    let m = metrics(&addrs).await?;
    for reason in ["unknown_sni", "no_sni", "unknown_protocol", "client_hello_malformed"] {
        assert_eq!(metric_value(&m, "seedgate_rejects_total", &[("reason", reason)]), Some(1.0), "{reason}\n{m}");
    }
    Ok(())
}

#[tokio::test]
async fn hello_one_byte_at_a_time_routes_and_a_stuck_hello_is_cut() -> anyhow::Result<()> {
    let w = world().await?;
    let routes = format!(
        "{}      - name: echo\n        sni: [echo.example.com]\n        upstreams: [{}]\n",
        ab_routes(&w),
        w.a.addr()
    );
    let (_r, addrs) = start_router(&w.dir, &router_config("", &routes)).await?;
    let gw = addrs.listener("gateway")?;

    // A dribbling relay between a rustls client and the router: client bytes go one per write.
    let relay = TcpListener::bind("127.0.0.1:0").await?;
    let relay_addr = relay.local_addr()?;
    tokio::spawn(async move {
        let (mut c, _) = relay.accept().await.expect("accept");
        let mut r = TcpStream::connect(gw).await.expect("connect router");
        r.set_nodelay(true).expect("nodelay");
        let (mut cr, mut cw) = c.split();
        let (mut rr, mut rw) = r.split();
        let up = async {
            let mut b = [0u8; 4096];
            loop {
                let n = cr.read(&mut b).await.unwrap_or(0);
                if n == 0 {
                    let _ = rw.shutdown().await;
                    break;
                }
                for byte in &b[..n] {
                    if rw.write_all(&[*byte]).await.is_err() {
                        return;
                    }
                    tokio::task::yield_now().await;
                }
            }
        };
        let down = tokio::io::copy(&mut rr, &mut cw);
        let _ = tokio::join!(up, down);
    });
    let r = tls_request(
        relay_addr,
        Some("api.shoot-a.example.com"),
        client_config(&w.ca, None, &[])?,
        &http_get_request("a", "/"),
    )
    .await?;
    assert!(r.body().contains("backend=shoot-a"), "{}", r.text());

    // Half a ClientHello, then silence: the router ends it at the handshake deadline (2 s).
    let mut s = TcpStream::connect(gw).await?;
    s.write_all(&HELLO_SHOOT_B[..HELLO_SHOOT_B.len() / 2]).await?;
    let mut buf = Vec::new();
    let read = tokio::time::timeout(WAIT, s.read_to_end(&mut buf)).await;
    assert!(read.is_ok(), "router must close a stuck handshake");
    let m = metrics(&addrs).await?;
    assert_eq!(metric_value(&m, "seedgate_rejects_total", &[("reason", "handshake_timeout")]), Some(1.0), "{m}");
    Ok(())
}

/// A backend that says "bye", half-closes, then reports how many bytes it still received.
async fn half_closing_backend() -> anyhow::Result<(SocketAddr, tokio::sync::oneshot::Receiver<usize>)> {
    let l = TcpListener::bind("127.0.0.1:0").await?;
    let addr = l.local_addr()?;
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut s, _) = l.accept().await.expect("accept");
        s.write_all(b"bye").await.expect("write");
        s.shutdown().await.expect("half-close");
        let mut got = Vec::new();
        let _ = s.read_to_end(&mut got).await;
        let _ = tx.send(got.len());
    });
    Ok((addr, rx))
}

#[tokio::test]
async fn half_close_propagates_both_ways() -> anyhow::Result<()> {
    let dir = TempDir::new("sni-halfclose")?;
    let echo = TcpEcho::start().await?;
    let (closer, got) = half_closing_backend().await?;
    let routes = format!(
        "      - name: echo\n        sni: [api.shoot-b.example.com]\n        upstreams: [{}]\n      - name: closer\n        sni: [closer.example.com]\n        upstreams: [{closer}]\n",
        echo.addr()
    );
    // The closer route is reached through the default route (the fixture's SNI is fixed).
    let yaml = router_config("    default_route: closer\n", &routes.replace("sni: [closer.example.com]\n        ", ""));
    let (_r, addrs) = start_router(&dir, &yaml).await?;
    let gw = addrs.listener("gateway")?;

    // Client FIN first: the echo backend sees EOF and still sends everything back.
    let mut s = TcpStream::connect(gw).await?;
    let payload: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8).collect();
    s.write_all(HELLO_SHOOT_B).await?;
    s.write_all(&payload).await?;
    s.shutdown().await?;
    let mut back = Vec::new();
    tokio::time::timeout(WAIT, s.read_to_end(&mut back)).await??;
    assert_eq!(back.len(), HELLO_SHOOT_B.len() + payload.len());
    assert_eq!(&back[HELLO_SHOOT_B.len()..], &payload[..]);

    // Upstream FIN first: the client reads EOF and can still send.
    let mut hello_other = HELLO_SHOOT_B.to_vec();
    // Same hello with an SNI no route names ("api.rhoot-b..."), so the default route takes it.
    let pos = hello_other.windows(7).position(|w| w == b"shoot-b").context("sni in fixture")?;
    hello_other[pos] = b'r';
    let mut s = TcpStream::connect(gw).await?;
    s.write_all(&hello_other).await?;
    let mut bye = [0u8; 3];
    tokio::time::timeout(WAIT, s.read_exact(&mut bye)).await??;
    assert_eq!(&bye, b"bye");
    let mut rest = Vec::new();
    tokio::time::timeout(WAIT, s.read_to_end(&mut rest)).await??;
    assert!(rest.is_empty(), "EOF after the upstream's FIN");
    s.write_all(b"still talking").await?;
    s.shutdown().await?;
    let n = tokio::time::timeout(WAIT, got).await??;
    assert_eq!(n, hello_other.len() + b"still talking".len());
    Ok(())
}

fn write_atomic(path: &Path, text: &str) -> anyhow::Result<()> {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

#[tokio::test]
async fn reload_switches_a_route_and_keeps_live_connections() -> anyhow::Result<()> {
    let dir = TempDir::new("sni-reload")?;
    let echo_a = TcpEcho::start().await?;
    let echo_b = TcpEcho::start().await?;
    let route = |up: SocketAddr| {
        format!("      - name: api\n        sni: [api.shoot-b.example.com]\n        upstreams: [{up}]\n")
    };
    let (mut p, addrs, cfg) = start_router_process(&dir, &router_config("", &route(echo_a.addr()))).await?;
    let gw = addrs.listener("gateway")?;

    let mut live = TcpStream::connect(gw).await?;
    live.write_all(HELLO_SHOOT_B).await?;
    let mut buf = vec![0u8; HELLO_SHOOT_B.len()];
    live.read_exact(&mut buf).await?;
    assert_eq!(echo_a.connections(), 1);

    // An invalid file is refused and counted; the running routes stay.
    write_atomic(&cfg, "listeners: [ {name: broken")?;
    poll_until(WAIT, TICK, || async {
        let m = metrics(&addrs).await.ok()?;
        (metric_value(&m, "seedgate_config_reloads_total", &[("result", "failure")]) == Some(1.0)).then_some(())
    })
    .await?;

    // Switch the route to B by rewriting the file (no signal): new connections go to B.
    write_atomic(&cfg, &router_config("", &route(echo_b.addr())))?;
    poll_until(WAIT, TICK, || async {
        let mut s = TcpStream::connect(gw).await.ok()?;
        s.write_all(HELLO_SHOOT_B).await.ok()?;
        let mut b = vec![0u8; HELLO_SHOOT_B.len()];
        s.read_exact(&mut b).await.ok()?;
        (echo_b.connections() > 0).then_some(())
    })
    .await?;

    // SIGHUP also reloads (same file: still a success).
    p.signal(libc::SIGHUP)?;
    poll_until(WAIT, TICK, || async {
        let m = metrics(&addrs).await.ok()?;
        (metric_value(&m, "seedgate_config_reloads_total", &[("result", "success")]).unwrap_or(0.0) >= 2.0)
            .then_some(())
    })
    .await?;

    // The connection admitted before the reload still streams, still to A.
    let before = echo_a.echoed_bytes();
    for _ in 0..5 {
        live.write_all(b"ping").await?;
        let mut b = [0u8; 4];
        tokio::time::timeout(WAIT, live.read_exact(&mut b)).await??;
        assert_eq!(&b, b"ping");
    }
    assert_eq!(echo_a.echoed_bytes(), before + 20);
    Ok(())
}

#[tokio::test]
async fn sigterm_stops_accepting_and_drains() -> anyhow::Result<()> {
    let dir = TempDir::new("sni-drain")?;
    let echo = TcpEcho::start().await?;
    let routes =
        format!("      - name: api\n        sni: [api.shoot-b.example.com]\n        upstreams: [{}]\n", echo.addr());
    let yaml = router_config("", &routes).replace("drain_grace: 5s", "drain_grace: 30s");
    let (mut p, addrs, _) = start_router_process(&dir, &yaml).await?;
    let gw = addrs.listener("gateway")?;
    let mut live = TcpStream::connect(gw).await?;
    live.write_all(HELLO_SHOOT_B).await?;
    let mut buf = vec![0u8; HELLO_SHOOT_B.len()];
    live.read_exact(&mut buf).await?;

    p.signal(libc::SIGTERM)?;
    // Readiness fails while draining, and new connections are not served.
    poll_until(WAIT, TICK, || async {
        let (code, _) = http_get(addrs.admin().ok()?, "/readyz").await.ok()?;
        (code == 503).then_some(())
    })
    .await?;
    let refused = match TcpStream::connect(gw).await {
        Err(_) => true,
        Ok(mut s) => {
            let _ = s.write_all(HELLO_SHOOT_B).await;
            let mut b = Vec::new();
            matches!(
                tokio::time::timeout(Duration::from_secs(3), s.read_to_end(&mut b)).await,
                Ok(Ok(0)) | Ok(Err(_)) | Err(_)
            )
        }
    };
    assert!(refused, "a new connection during the drain must not be proxied");
    // The live connection keeps working during the drain...
    live.write_all(b"during drain").await?;
    let mut b = [0u8; 12];
    tokio::time::timeout(WAIT, live.read_exact(&mut b)).await??;
    assert_eq!(&b, b"during drain");
    // ...and when it ends the process exits 0 without waiting for the 30 s grace.
    drop(live);
    let st = p.wait_exit(WAIT).await.context("router did not exit after its last connection")?;
    assert!(st.success(), "{st:?}");
    Ok(())
}

#[tokio::test]
async fn drain_grace_ends_connections_that_outlive_it() -> anyhow::Result<()> {
    let dir = TempDir::new("sni-grace")?;
    let echo = TcpEcho::start().await?;
    let routes =
        format!("      - name: api\n        sni: [api.shoot-b.example.com]\n        upstreams: [{}]\n", echo.addr());
    let yaml = router_config("", &routes).replace("drain_grace: 5s", "drain_grace: 1s");
    let (mut p, addrs, _) = start_router_process(&dir, &yaml).await?;
    let mut live = TcpStream::connect(addrs.listener("gateway")?).await?;
    live.write_all(HELLO_SHOOT_B).await?;
    let mut buf = vec![0u8; HELLO_SHOOT_B.len()];
    live.read_exact(&mut buf).await?;
    p.signal(libc::SIGTERM)?;
    let mut rest = Vec::new();
    tokio::time::timeout(WAIT, live.read_to_end(&mut rest)).await??;
    let st = p.wait_exit(WAIT).await.context("router must exit after the grace period")?;
    assert!(st.success(), "{st:?}");
    Ok(())
}

#[tokio::test]
async fn sends_proxy_v2_with_the_client_address_and_fails_over() -> anyhow::Result<()> {
    let dir = TempDir::new("sni-ppout")?;
    let l = TcpListener::bind("127.0.0.1:0").await?;
    let up = l.local_addr()?;
    // A port with nothing listening comes first: the router must fail over before any byte. The
    // socket stays bound (not listening) so no other test can take the port meanwhile.
    let dead_sock = tokio::net::TcpSocket::new_v4()?;
    dead_sock.bind("127.0.0.1:0".parse()?)?;
    let dead = dead_sock.local_addr()?;
    let routes = format!(
        "      - name: api\n        sni: [api.shoot-b.example.com]\n        upstreams: [{dead}, {up}]\n        balance: least-connections\n        send_proxy_protocol: v2\n"
    );
    let (_r, addrs) = start_router(&dir, &router_config("", &routes)).await?;
    let mut c = TcpStream::connect(addrs.listener("gateway")?).await?;
    let client_addr = c.local_addr()?;
    c.write_all(HELLO_SHOOT_B).await?;
    let (mut s, _) = tokio::time::timeout(WAIT, l.accept()).await??;
    let mut got = Vec::new();
    let header = loop {
        let mut b = [0u8; 4096];
        let n = tokio::time::timeout(WAIT, s.read(&mut b)).await??;
        anyhow::ensure!(n > 0, "upstream closed before the PROXY header");
        got.extend_from_slice(&b[..n]);
        if let Some(h) = proxy_wire::proxy_protocol::parse(&got)? {
            break h;
        }
    };
    assert_eq!(header.source, Some(client_addr));
    assert_eq!(header.authority.as_deref(), Some("api.shoot-b.example.com"));
    assert!(header.unique_id.is_some());
    while got.len() < header.len + HELLO_SHOOT_B.len() {
        let mut b = [0u8; 4096];
        let n = tokio::time::timeout(WAIT, s.read(&mut b)).await??;
        anyhow::ensure!(n > 0, "upstream closed early");
        got.extend_from_slice(&b[..n]);
    }
    assert_eq!(&got[header.len..], HELLO_SHOOT_B, "the ClientHello follows the header unchanged");
    let m = metrics(&addrs).await?;
    assert_eq!(metric_sum(&m, "seedgate_upstream_connect_failures_total", &[("route", "api")]), 1.0, "{m}");
    Ok(())
}

#[tokio::test]
async fn third_party_clients_curl_and_openssl() -> anyhow::Result<()> {
    let w = world().await?;
    let (_r, addrs) = start_router(&w.dir, &router_config("", &ab_routes(&w))).await?;
    let gw = addrs.listener("gateway")?;
    let ca = w.ca.write(w.dir.path(), "ca")?;
    let port = gw.port().to_string();
    let host = "api.shoot-a.example.com";
    let out = tokio::process::Command::new("curl")
        .args(["-sS", "--max-time", "10", "--cacert"])
        .arg(&ca)
        .args(["--resolve", &format!("{host}:{port}:127.0.0.1"), &format!("https://{host}:{port}/healthz")])
        .output()
        .await
        .context("curl must be installed (.ci/run installs it)")?;
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && body.contains("backend=shoot-a"),
        "curl: {body} {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let out = tokio::process::Command::new("openssl")
        .args(["s_client", "-connect", &gw.to_string(), "-servername", "x.shoot-b.example.com", "-CAfile"])
        .arg(&ca)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .context("openssl must be installed")?;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("CN = api.shoot-b.example.com"), "{text}");
    assert!(text.contains("Verify return code: 0"), "{text}");

    let out = tokio::process::Command::new("openssl")
        .args(["s_client", "-connect", &gw.to_string(), "-servername", "nope.example.com"])
        .stdin(std::process::Stdio::null())
        .output()
        .await?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unrecognized name"), "{err}");
    Ok(())
}

#[tokio::test]
async fn check_flag_validates_configs() -> anyhow::Result<()> {
    let dir = TempDir::new("sni-check")?;
    let good = dir.write("good.yaml", "listeners:\n  - name: a\n    listen: 127.0.0.1:0\n    routes: []\n")?;
    let bad = dir.write("bad.yaml", "listeners:\n  - name: a\n    listen: 127.0.0.1:0\n    routes:\n      - name: r\n        sni: [ok.example]\n        upstreams: []\n        bogus: 1\n")?;
    let run = |f: PathBuf| async move {
        tokio::process::Command::new(bin_path("sni-router").expect("binary"))
            .arg("--check")
            .arg("--config")
            .arg(f)
            .output()
            .await
    };
    let ok = run(good).await?;
    assert_eq!(ok.status.code(), Some(0), "{}", String::from_utf8_lossy(&ok.stderr));
    let out = run(bad).await?;
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.yaml:8:9") && err.contains("bogus"), "{err}");
    Ok(())
}

#[tokio::test]
async fn admin_endpoints() -> anyhow::Result<()> {
    let w = world().await?;
    let (_r, addrs) = start_router(&w.dir, &router_config("", &ab_routes(&w))).await?;
    let admin = addrs.admin()?;
    assert_eq!(http_get(admin, "/healthz").await?.0, 200);
    let (code, body) = http_get(admin, "/readyz?verbose").await?;
    assert_eq!(code, 200);
    assert!(body.contains("[+]listener-gateway ok") && body.contains("2 routes"), "{body}");
    let (code, body) = http_get(admin, "/config").await?;
    assert_eq!(code, 200);
    let v: serde_json::Value = serde_json::from_str(&body)?;
    assert_eq!(v["listeners"][0]["routes"][1]["sni"][0], "*.shoot-b.example.com");
    let m = metrics(&addrs).await?;
    assert_eq!(metric_value(&m, "seedgate_routes", &[("listener", "gateway")]), Some(2.0));
    assert_eq!(http_get(admin, "/nope").await?.0, 404);
    // An established TLS session counts as active while it lasts.
    let _tls =
        tls_connect(addrs.listener("gateway")?, Some("api.shoot-a.example.com"), client_config(&w.ca, None, &[])?)
            .await?;
    poll_until(WAIT, TICK, || async {
        let m = metrics(&addrs).await.ok()?;
        (metric_value(&m, "seedgate_connections_active", &[("listener", "gateway")]) == Some(1.0)).then_some(())
    })
    .await?;
    Ok(())
}
