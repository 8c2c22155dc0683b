//! Path P2, the router's HTTP CONNECT routing: curl (`-p -x` with `--proxy-header`) and an
//! OpenVPN-style HTTP/1.0 CONNECT with a custom header reach the right upstream; the 200 comes
//! alone and pipelined bytes are forwarded; unlisted or missing headers get 403 (never the
//! default route, never the authority), `redirect` gives 301, a refused upstream 502, a connect
//! timeout 504; bad heads get 400/405/431 or a close at the handshake deadline, all counted.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use testbed::peers::{self, read_response_head, read_to_close, tls_over};
use testbed::pki::client_config;
use testbed::tls_client::{http_get_request, peer_info};
use testbed::{Addresses, Ca, InProc, TempDir, TlsHttpBackend, http_get, metric_value, poll_until};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

const WAIT: Duration = Duration::from_secs(15);
const API_HOST: &str = "kube-apiserver.shoot--a.svc.cluster.local";
const API_DEST: &str = "outbound|443||kube-apiserver.shoot--a.svc.cluster.local";
const VPN_DEST: &str = "outbound|1194||vpn-seed-server.shoot--a.svc.cluster.local";

/// An upstream that stays silent until the client's FIN, records every byte of each
/// connection, then answers `got <n>` and closes: whatever the client reads before its FIN
/// comes from the router, not from the upstream.
struct Recorder {
    addr: SocketAddr,
    conns: Arc<Mutex<Vec<Vec<u8>>>>,
    accepted: Arc<Mutex<usize>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Recorder {
    async fn start() -> anyhow::Result<Self> {
        let l = TcpListener::bind("127.0.0.1:0").await?;
        let addr = l.local_addr()?;
        let conns = Arc::new(Mutex::new(Vec::new()));
        let accepted = Arc::new(Mutex::new(0));
        let (c, a) = (conns.clone(), accepted.clone());
        let task = tokio::spawn(async move {
            // Serves until dropped (the task is aborted); every connection ends at its EOF.
            while let Ok((mut s, _)) = l.accept().await {
                *a.lock().unwrap() += 1;
                let c = c.clone();
                tokio::spawn(async move {
                    let mut got = Vec::new();
                    if s.read_to_end(&mut got).await.is_ok() {
                        let _ = s.write_all(format!("got {}", got.len()).as_bytes()).await;
                        let _ = s.shutdown().await;
                    }
                    c.lock().unwrap().push(got);
                });
            }
        });
        Ok(Self { addr, conns, accepted, task })
    }

    fn accepted(&self) -> usize {
        *self.accepted.lock().unwrap()
    }

    fn finished(&self) -> Vec<Vec<u8>> {
        self.conns.lock().unwrap().clone()
    }
}

/// A listener that accepts nothing more: its accept queue (backlog 0) is filled by a
/// connection nobody accepts, so the kernel drops further SYNs and a connect to it times out.
/// Checked with a probe connect before use.
struct Blackhole {
    addr: SocketAddr,
    _listener: TcpListener,
    _fillers: Vec<TcpStream>,
}

async fn blackhole() -> anyhow::Result<Blackhole> {
    let sock = TcpSocket::new_v4()?;
    sock.bind("127.0.0.1:0".parse()?)?;
    let listener = sock.listen(0)?;
    let addr = listener.local_addr()?;
    // The first connection always fits (the queue is empty); it fills a queue of backlog 0.
    let first = tokio::time::timeout(Duration::from_secs(10), TcpStream::connect(addr)).await??;
    let mut fillers = vec![first];
    // Probe until a connect stays unanswered; a few rounds in case the kernel rounds up.
    for _ in 0..8 {
        match tokio::time::timeout(Duration::from_millis(500), TcpStream::connect(addr)).await {
            Ok(Ok(s)) => fillers.push(s),
            Ok(Err(e)) => anyhow::bail!("filling the accept queue of {addr}: {e}"),
            Err(_) => return Ok(Blackhole { addr, _listener: listener, _fillers: fillers }),
        }
    }
    anyhow::bail!("the kernel kept completing connects to a full accept queue; cannot make a connect time out here")
}

struct World {
    dir: TempDir,
    ca: Ca,
    api: TlsHttpBackend,
    vpn: Recorder,
    fallback: Recorder,
    _hole: Blackhole,
    router: InProc,
    addrs: Addresses,
}

async fn world() -> anyhow::Result<World> {
    let dir = TempDir::new("p2-connect")?;
    let ca = Ca::new("p2-connect-ca")?;
    let api = TlsHttpBackend::start("shoot-a", &ca.server(&[API_HOST])?, None).await?;
    let vpn = Recorder::start().await?;
    let fallback = Recorder::start().await?;
    let hole = blackhole().await?;
    let refused = {
        let l = TcpListener::bind("127.0.0.1:0").await?;
        l.local_addr()?
        // dropped: a connect there is refused
    };
    let vpn_re = r#"outbound\\|1194\\|\\|vpn-seed-server\\.shoot--a\\.svc\\.cluster\\.local"#;
    let yaml = format!(
        r#"admin: {{ listen: 127.0.0.1:0 }}
timeouts: {{ handshake: 1s, connect: 1s, idle: 1h }}
drain_grace: 1s
listeners:
  - name: connect
    listen: 127.0.0.1:0
    default_route: fallback
    routes:
      - name: shoot-a-api
        connect: {{ header: X-Gardener-Destination, values: ["{API_DEST}"] }}
        upstreams: [{api}]
      - name: shoot-a-vpn
        connect: {{ header: Reversed-VPN, regex: "{vpn_re}" }}
        upstreams: [{vpn}]
      - name: refused
        connect: {{ header: X-Gardener-Destination, values: ["outbound|443||refused"] }}
        upstreams: [{refused}]
      - name: silent
        connect: {{ header: X-Gardener-Destination, values: ["outbound|443||silent"] }}
        upstreams: [{hole}]
      - name: fallback
        upstreams: [{fallback}]
  - name: redirect
    listen: 127.0.0.11:0
    connect_unmatched: redirect
    routes:
      - name: shoot-a-api
        connect: {{ header: X-Gardener-Destination, values: ["{API_DEST}"] }}
        upstreams: [{api}]
"#,
        api = api.addr(),
        vpn = vpn.addr,
        fallback = fallback.addr,
        hole = hole.addr,
    );
    let (router, addrs) = InProc::serve(&dir, "sni-router", &yaml).await?;
    Ok(World { dir, ca, api, vpn, fallback, _hole: hole, router, addrs })
}

impl World {
    fn connect_addr(&self) -> SocketAddr {
        self.addrs.listener("connect").expect("connect listener")
    }

    async fn metrics(&self) -> anyhow::Result<String> {
        let (code, body) = http_get(self.addrs.admin()?, "/metrics").await?;
        anyhow::ensure!(code == 200, "/metrics answered {code}");
        Ok(body)
    }

    async fn rejects(&self, reason: &str) -> anyhow::Result<f64> {
        let m = self.metrics().await?;
        Ok(metric_value(&m, "seedgate_rejects_total", &[("listener", "connect"), ("reason", reason)]).unwrap_or(0.0))
    }

    /// Nothing reached an upstream it should not have: the default route never serves CONNECT.
    fn assert_no_fallback(&self) {
        assert_eq!(self.fallback.accepted(), 0, "a CONNECT must never use the default route");
    }
}

/// Send a raw request and read the whole answer until the router closes.
async fn exchange(addr: SocketAddr, req: &[u8]) -> anyhow::Result<String> {
    let mut s = TcpStream::connect(addr).await?;
    s.write_all(req).await?;
    // Our FIN: the router's linger ends as soon as it has answered.
    s.shutdown().await?;
    Ok(String::from_utf8_lossy(&read_to_close(&mut s).await?).into_owned())
}

/// Status code, and the body which must be exactly one line.
fn status_and_line(resp: &str) -> (u16, String) {
    let (head, body) = resp.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no head in {resp:?}"));
    let status =
        head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("bad status line in {resp:?}"));
    assert!(head.contains("Connection: close"), "{resp:?}");
    (status, body.to_owned())
}

fn one_line(body: &str) -> &str {
    let line = body.strip_suffix('\n').unwrap_or_else(|| panic!("body must end with a newline: {body:?}"));
    assert!(!line.is_empty() && !line.contains('\n'), "one-line reason expected: {body:?}");
    line
}

#[tokio::test]
async fn curl_connect_with_proxy_header_reaches_the_apiserver() -> anyhow::Result<()> {
    let w = world().await?;
    let ca = w.ca.write(w.dir.path(), "ca")?;
    let ca = ca.to_string_lossy();
    let proxy = format!("http://{}", w.connect_addr());
    let header = format!("X-Gardener-Destination: {API_DEST}");
    let url = format!("https://{API_HOST}:443/version");
    let Some(out) =
        peers::curl(&["-sS", "--fail", "-p", "-x", &proxy, "--proxy-header", &header, "--cacert", &ca, &url]).await?
    else {
        return Ok(());
    };
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "curl: {}\n{}", String::from_utf8_lossy(&out.stderr), w.router.log());
    assert!(body.contains("backend=shoot-a ") && body.contains(&format!("sni={API_HOST} ")), "{body}");
    w.router
        .wait_log_line(
            &[
                "connection closed",
                "route=\"shoot-a-api\"",
                &format!("connect=\"{API_HOST}:443\""),
                "protocol=\"connect\"",
            ],
            WAIT,
        )
        .await?;

    // curl with a value nobody listed: 403, and curl says so.
    let header = "X-Gardener-Destination: outbound|443||kube-apiserver.shoot--zzz.svc.cluster.local";
    let Some(out) = peers::curl(&["-sS", "-p", "-x", &proxy, "--proxy-header", header, "--cacert", &ca, &url]).await?
    else {
        return Ok(());
    };
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("403"), "curl must report the 403: {err}");
    assert_eq!(w.api.connections(), 1);
    w.assert_no_fallback();
    Ok(())
}

#[tokio::test]
async fn openvpn_style_connect_gets_a_lone_200_and_pipelined_bytes_arrive() -> anyhow::Result<()> {
    let w = world().await?;
    for (version, early) in [("1.0", "EARLY-BYTES"), ("1.1", "")] {
        let mut s = TcpStream::connect(w.connect_addr()).await?;
        let head = format!(
            "CONNECT vpn-seed-server:1194 HTTP/{version}\r\nHost: vpn-seed-server:1194\r\nReversed-VPN: {VPN_DEST}\r\n\r\n"
        );
        // The head and the first tunnel bytes in one write, as a client that does not wait.
        s.write_all(format!("{head}{early}").as_bytes()).await?;
        let got = read_response_head(&mut s).await?;
        assert_eq!(
            String::from_utf8_lossy(&got),
            format!("HTTP/{version} 200 Connection established\r\n\r\n"),
            "the 200 head alone, nothing after it (the upstream is silent until our FIN)"
        );
        s.write_all(b"LATE").await?;
        s.shutdown().await?;
        let answer = read_to_close(&mut s).await?;
        let n = early.len() + 4;
        assert_eq!(String::from_utf8_lossy(&answer), format!("got {n}"), "upstream answer after our FIN");
    }
    poll_until(WAIT, Duration::from_millis(20), || async { (w.vpn.finished().len() == 2).then_some(()) }).await?;
    let mut seen = w.vpn.finished();
    seen.sort();
    assert_eq!(seen, vec![b"EARLY-BYTESLATE".to_vec(), b"LATE".to_vec()], "upstream got exactly the tunnel bytes");
    w.router
        .wait_log_line(
            &[
                "connection closed",
                "route=\"shoot-a-vpn\"",
                "connect=\"vpn-seed-server:1194\"",
                "bytes_to_upstream=15 ",
            ],
            WAIT,
        )
        .await?;
    let m = w.metrics().await?;
    assert_eq!(
        metric_value(&m, "seedgate_connections_total", &[("route", "shoot-a-vpn"), ("result", "ok")]),
        Some(2.0)
    );
    w.assert_no_fallback();

    // And a TLS client through the same kind of tunnel (HTTP/1.1, X-Gardener-Destination).
    let mut s = TcpStream::connect(w.connect_addr()).await?;
    s.write_all(
        format!(
            "CONNECT {API_HOST}:443 HTTP/1.1\r\nHost: {API_HOST}:443\r\nX-Gardener-Destination: {API_DEST}\r\n\r\n"
        )
        .as_bytes(),
    )
    .await?;
    let got = read_response_head(&mut s).await?;
    assert_eq!(got, b"HTTP/1.1 200 Connection established\r\n\r\n");
    let mut tls = tls_over(s, API_HOST, client_config(&w.ca, None, &[])?).await?;
    assert_eq!(peer_info(&tls).0.as_deref(), Some(API_HOST));
    tls.write_all(&http_get_request(API_HOST, "/tunnel")).await?;
    let mut out = String::new();
    let _ = tokio::time::timeout(WAIT, tls.read_to_string(&mut out)).await?;
    assert!(out.contains("backend=shoot-a ") && out.contains("path=/tunnel"), "{out}");
    Ok(())
}

#[tokio::test]
async fn unrouted_connects_get_403_or_301_and_upstream_failures_502_504() -> anyhow::Result<()> {
    let w = world().await?;
    let gw = w.connect_addr();
    let api = w.api.addr();

    // A value nobody listed: 403 naming it.
    let resp = exchange(gw, format!("CONNECT {api} HTTP/1.1\r\nHost: {api}\r\nX-Gardener-Destination: outbound|443||kube-apiserver.shoot--zzz.svc.cluster.local\r\n\r\n").as_bytes()).await?;
    let (status, body) = status_and_line(&resp);
    assert_eq!(status, 403, "{resp}");
    assert!(one_line(&body).contains("outbound|443||kube-apiserver.shoot--zzz.svc.cluster.local"), "{body}");
    // No header at all, with the real upstream's address as authority: still 403, no dial.
    let resp = exchange(gw, format!("CONNECT {api} HTTP/1.1\r\nHost: {api}\r\n\r\n").as_bytes()).await?;
    let (status, body) = status_and_line(&resp);
    assert_eq!(status, 403, "{resp}");
    assert!(one_line(&body).contains(&api.to_string()), "{body}");
    // HTTP/1.0 client: answered in HTTP/1.0.
    let resp =
        exchange(gw, b"CONNECT vpn:1194 HTTP/1.0\r\nReversed-VPN: outbound|1194||vpn-seed-server.shoot--zzz\r\n\r\n")
            .await?;
    assert!(resp.starts_with("HTTP/1.0 403 "), "{resp}");
    assert_eq!(w.api.connections(), 0, "never a fall-back to the authority");
    assert_eq!(w.vpn.accepted(), 0);
    w.assert_no_fallback();
    assert_eq!(w.rejects("connect_no_route").await?, 3.0);

    // connect_unmatched: redirect.
    let redirect = w.addrs.listener("redirect")?;
    let resp = exchange(
        redirect,
        b"CONNECT api.shoot--x.example.com:443 HTTP/1.1\r\nHost: api.shoot--x.example.com:443\r\n\r\n",
    )
    .await?;
    assert!(resp.starts_with("HTTP/1.1 301 "), "{resp}");
    assert!(resp.contains("\r\nLocation: https://api.shoot--x.example.com:443\r\n"), "{resp}");

    // Upstream refused: 502 with a one-line reason.
    let resp = exchange(gw, b"CONNECT x:443 HTTP/1.1\r\nX-Gardener-Destination: outbound|443||refused\r\n\r\n").await?;
    let (status, body) = status_and_line(&resp);
    assert_eq!(status, 502, "{resp}");
    one_line(&body);
    assert_eq!(w.rejects("connect_refused").await?, 1.0);

    // Upstream connect timeout (the accept queue is full, SYNs are dropped): 504.
    let resp = exchange(gw, b"CONNECT x:443 HTTP/1.1\r\nX-Gardener-Destination: outbound|443||silent\r\n\r\n").await?;
    let (status, body) = status_and_line(&resp);
    assert_eq!(status, 504, "{resp}\n{}", w.router.log());
    one_line(&body);
    assert_eq!(w.rejects("connect_timeout").await?, 1.0);
    let m = w.metrics().await?;
    assert_eq!(
        metric_value(
            &m,
            "seedgate_upstream_connect_failures_total",
            &[("route", "silent"), ("reason", "connect_timeout")]
        ),
        Some(1.0),
        "{m}"
    );
    w.assert_no_fallback();
    Ok(())
}

#[tokio::test]
async fn bad_connect_heads_are_answered_and_counted() -> anyhow::Result<()> {
    let w = world().await?;
    let gw = w.connect_addr();

    // A 64 KiB head (limit 8 KiB): 431.
    let big = format!("CONNECT x:443 HTTP/1.1\r\nX-Pad: {}\r\n\r\n", "a".repeat(64 * 1024));
    let resp = exchange(gw, big.as_bytes()).await?;
    let (status, body) = status_and_line(&resp);
    assert_eq!(status, 431, "{resp}");
    one_line(&body);
    // Not HTTP that parses: 400; not CONNECT: 405.
    let resp = exchange(gw, b"CONNECT x:443 HTTP/1.1\r\nBad Header\r\n\r\n").await?;
    assert_eq!(status_and_line(&resp).0, 400, "{resp}");
    let resp = exchange(gw, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await?;
    assert_eq!(status_and_line(&resp).0, 405, "{resp}");

    // A head that never completes: closed at the 1 s handshake deadline, without an answer.
    let mut s = TcpStream::connect(gw).await?;
    s.write_all(format!("CONNECT x:443 HTTP/1.1\r\nX-Gardener-Destination: {}", &API_DEST[..10]).as_bytes()).await?;
    let got = read_to_close(&mut s).await?;
    assert!(got.is_empty(), "{:?}", String::from_utf8_lossy(&got));
    // The same, one byte at a time and complete: routed.
    let mut s = TcpStream::connect(gw).await?;
    s.set_nodelay(true)?;
    let req = format!("CONNECT v:1194 HTTP/1.1\r\nReversed-VPN: {VPN_DEST}\r\n\r\n");
    for b in req.as_bytes() {
        s.write_all(std::slice::from_ref(b)).await?;
        tokio::task::yield_now().await;
    }
    assert_eq!(read_response_head(&mut s).await?, b"HTTP/1.1 200 Connection established\r\n\r\n");
    s.shutdown().await?;
    assert_eq!(read_to_close(&mut s).await?, b"got 0");

    let m = w.metrics().await?;
    for (reason, n) in
        [("head_too_large", 1.0), ("head_malformed", 1.0), ("not_connect", 1.0), ("handshake_timeout", 1.0)]
    {
        let got =
            metric_value(&m, "seedgate_rejects_total", &[("listener", "connect"), ("reason", reason)]).unwrap_or(0.0);
        assert_eq!(got, n, "{reason}\n{m}");
    }
    w.assert_no_fallback();
    let (code, _) = http_get(w.addrs.admin()?, "/healthz").await?;
    assert_eq!(code, 200);
    assert!(w.router.running());
    Ok(())
}
