//! Stand-in upstreams: a TLS "kube-apiserver", TCP echo and sink, a plain HTTP page. Each runs
//! in-process on its own listener and stops when its handle is dropped.

use crate::pki::{self, Ca, Issued};
use anyhow::Context as _;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

/// A TLS handshake or an HTTP request head must arrive within this.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
const HEAD_MAX: usize = 16 * 1024;

fn localhost() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// The accept loop of one stand-in. Dropping it aborts the loop, and with it (through the
/// JoinSet it owns) every connection it is serving.
#[derive(Debug)]
pub(crate) struct Serving(tokio::task::JoinHandle<()>);

impl Drop for Serving {
    fn drop(&mut self) {
        self.0.abort();
    }
}

pub(crate) fn serve<F, Fut>(listener: TcpListener, accepted: Arc<AtomicU64>, handle: F) -> Serving
where
    F: Fn(TcpStream) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    Serving(tokio::spawn(async move {
        let mut conns = JoinSet::new();
        // Runs until the handle is dropped; each round either reaps or accepts.
        loop {
            tokio::select! {
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
                r = listener.accept() => match r {
                    Ok((s, _)) => {
                        accepted.fetch_add(1, Ordering::Relaxed);
                        conns.spawn(handle(s));
                    }
                    // EMFILE and friends: back off briefly instead of spinning.
                    Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                },
            }
        }
    }))
}

/// Read until the end of an HTTP head (`\r\n\r\n`); returns the head (without the blank line)
/// and any bytes after it.
async fn read_head<S: AsyncRead + Unpin>(s: &mut S) -> anyhow::Result<(String, Vec<u8>)> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    tokio::time::timeout(HEAD_TIMEOUT, async {
        // Each round reads at least one byte or returns, and the buffer is capped.
        loop {
            if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let rest = buf.split_off(p + 4);
                return Ok((String::from_utf8_lossy(&buf[..p]).into_owned(), rest));
            }
            anyhow::ensure!(buf.len() <= HEAD_MAX, "request head larger than {HEAD_MAX} bytes");
            let n = s.read(&mut chunk).await?;
            anyhow::ensure!(n > 0, "EOF before the end of the request head");
            buf.extend_from_slice(&chunk[..n]);
        }
    })
    .await
    .context("request head timed out")?
}

fn request_path(head: &str) -> &str {
    head.lines().next().and_then(|l| l.split(' ').nth(1)).unwrap_or("-")
}

/// Consume a PROXY protocol v1 or v2 header if the connection starts with one; returns the
/// source address it names (`None` for no header, `LOCAL`, `UNKNOWN` or a non-IP family).
async fn read_proxy_header(s: &mut TcpStream) -> anyhow::Result<Option<SocketAddr>> {
    const V2_SIG: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";
    let mut first = [0u8; 1];
    if s.peek(&mut first).await? == 0 {
        return Ok(None);
    }
    match first[0] {
        b'P' => {
            let mut line = Vec::with_capacity(108);
            // A v1 header is at most 107 bytes.
            for _ in 0..107 {
                line.push(s.read_u8().await?);
                if line.ends_with(b"\r\n") {
                    break;
                }
            }
            let text = String::from_utf8_lossy(&line);
            let f: Vec<&str> = text.trim_end().split(' ').collect();
            anyhow::ensure!(f.first() == Some(&"PROXY"), "bad PROXY v1 header {text:?}");
            if f.len() == 6 {
                let ip: std::net::IpAddr = f[2].parse()?;
                return Ok(Some(SocketAddr::new(ip, f[4].parse()?)));
            }
            Ok(None)
        }
        b'\r' => {
            let mut hdr = [0u8; 16];
            s.read_exact(&mut hdr).await?;
            anyhow::ensure!(&hdr[..12] == V2_SIG, "bad PROXY v2 signature");
            let len = u16::from_be_bytes([hdr[14], hdr[15]]) as usize;
            let mut body = vec![0u8; len];
            s.read_exact(&mut body).await?;
            let local = hdr[12] & 0x0f == 0;
            Ok(match (local, hdr[13] >> 4) {
                (false, 1) if len >= 12 => {
                    Some(SocketAddr::from((<[u8; 4]>::try_from(&body[0..4])?, u16::from_be_bytes([body[8], body[9]]))))
                }
                (false, 2) if len >= 36 => Some(SocketAddr::from((
                    <[u8; 16]>::try_from(&body[0..16])?,
                    u16::from_be_bytes([body[32], body[33]]),
                ))),
                _ => None,
            })
        }
        _ => Ok(None),
    }
}

/// Echo every byte back until EOF, then shut the write side (half-close aware).
async fn echo<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    r: &mut R,
    w: &mut W,
    counted: &AtomicU64,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    // Ends at EOF or an error; the peer decides how long that takes (long-lived tests).
    loop {
        let n = r.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        counted.fetch_add(n as u64, Ordering::Relaxed);
        w.write_all(&buf[..n]).await?;
    }
    w.shutdown().await
}

fn dash(s: Option<String>) -> String {
    s.filter(|s| !s.is_empty()).unwrap_or_else(|| "-".into())
}

/// A kube-apiserver stand-in: TLS with its own certificate (optionally requiring a client
/// certificate), then one HTTP/1.1 request per connection.
///
/// - Any path but `/echo` is answered `200` with `Connection: close` and the one-line body
///   `backend=<name> sni=<sni|-> alpn=<alpn|-> client_cn=<cn|-> path=<path> proxy=<src|->\n`,
///   where `proxy` is the source address of a PROXY v1/v2 header that preceded the TLS
///   ClientHello (the router's `send_proxy_protocol`), if any.
/// - `/echo` is answered with a head only (`200`, header `x-testbed` carrying the same line, no
///   length), after which every byte the client sends is echoed back until the client's EOF
///   (close_notify or FIN); then the backend closes its side. For long-lived and half-close tests.
#[derive(Debug)]
pub struct TlsHttpBackend {
    addr: SocketAddr,
    accepted: Arc<AtomicU64>,
    echoed: Arc<AtomicU64>,
    _serving: Serving,
}

impl TlsHttpBackend {
    /// Serve `cert` on 127.0.0.1 (ephemeral port), offering ALPN `http/1.1`; with `client_ca`,
    /// a client certificate from that CA is required.
    pub async fn start(name: &str, cert: &Issued, client_ca: Option<&Ca>) -> anyhow::Result<Self> {
        Self::start_with(name, pki::server_config(cert, client_ca, &["http/1.1"])?, localhost()).await
    }

    /// Serve with any rustls config (ALPN, client auth) on `addr`.
    pub async fn start_with(name: &str, cfg: Arc<rustls::ServerConfig>, addr: SocketAddr) -> anyhow::Result<Self> {
        let listener = TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
        Self::serve_on(name, cfg, listener)
    }

    /// Serve on a listener the caller bound (e.g. with `SO_REUSEPORT`, shared by several
    /// processes).
    pub fn serve_on(name: &str, cfg: Arc<rustls::ServerConfig>, listener: TcpListener) -> anyhow::Result<Self> {
        let addr = listener.local_addr()?;
        let accepted = Arc::new(AtomicU64::new(0));
        let echoed = Arc::new(AtomicU64::new(0));
        let acceptor = tokio_rustls::TlsAcceptor::from(cfg);
        let name: Arc<str> = name.into();
        let e = echoed.clone();
        let serving = serve(listener, accepted.clone(), move |s| {
            let (acceptor, name, echoed) = (acceptor.clone(), name.clone(), e.clone());
            async move {
                // Errors only end this connection; the client sees the TLS alert or the close.
                let _ = tls_http_conn(s, acceptor, &name, &echoed).await;
            }
        });
        Ok(Self { addr, accepted, echoed, _serving: serving })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// TCP connections accepted so far (whether or not TLS succeeded).
    pub fn connections(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    /// Bytes echoed back by `/echo` connections so far.
    pub fn echoed_bytes(&self) -> u64 {
        self.echoed.load(Ordering::Relaxed)
    }
}

async fn tls_http_conn(
    mut s: TcpStream,
    acceptor: tokio_rustls::TlsAcceptor,
    name: &str,
    echoed: &AtomicU64,
) -> anyhow::Result<()> {
    let proxy = tokio::time::timeout(HEAD_TIMEOUT, read_proxy_header(&mut s)).await??;
    let mut tls = tokio::time::timeout(HEAD_TIMEOUT, acceptor.accept(s)).await??;
    let (_, conn) = tls.get_ref();
    let sni = conn.server_name().map(str::to_owned);
    let alpn = conn.alpn_protocol().map(|a| String::from_utf8_lossy(a).into_owned());
    let client_cn = conn.peer_certificates().and_then(|c| c.first()).and_then(|c| pki::cert_names(c).0);
    let (head, rest) = read_head(&mut tls).await?;
    let path = request_path(&head).to_owned();
    let line = format!(
        "backend={name} sni={} alpn={} client_cn={} path={path} proxy={}",
        dash(sni),
        dash(alpn),
        dash(client_cn),
        proxy.map_or_else(|| "-".to_owned(), |a| a.to_string()),
    );
    if path == "/echo" {
        tls.write_all(format!("HTTP/1.1 200 OK\r\nx-testbed: {line}\r\n\r\n").as_bytes()).await?;
        tls.write_all(&rest).await?;
        echoed.fetch_add(rest.len() as u64, Ordering::Relaxed);
        let (mut r, mut w) = tokio::io::split(tls);
        echo(&mut r, &mut w, echoed).await?;
    } else {
        let body = format!("{line}\n");
        let resp = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        tls.write_all(resp.as_bytes()).await?;
        tls.shutdown().await?;
    }
    Ok(())
}

/// Plain TCP echo: echoes until the client's FIN, finishes writing, then sends its own FIN.
#[derive(Debug)]
pub struct TcpEcho {
    addr: SocketAddr,
    accepted: Arc<AtomicU64>,
    echoed: Arc<AtomicU64>,
    _serving: Serving,
}

impl TcpEcho {
    pub async fn start() -> anyhow::Result<Self> {
        Self::start_on(localhost()).await
    }

    pub async fn start_on(addr: SocketAddr) -> anyhow::Result<Self> {
        let listener = TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
        let addr = listener.local_addr()?;
        let accepted = Arc::new(AtomicU64::new(0));
        let echoed = Arc::new(AtomicU64::new(0));
        let e = echoed.clone();
        let serving = serve(listener, accepted.clone(), move |s| {
            let echoed = e.clone();
            async move {
                let (mut r, mut w) = s.into_split();
                let _ = echo(&mut r, &mut w, &echoed).await;
            }
        });
        Ok(Self { addr, accepted, echoed, _serving: serving })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn connections(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    pub fn echoed_bytes(&self) -> u64 {
        self.echoed.load(Ordering::Relaxed)
    }
}

/// Plain TCP sink: reads and counts every byte, closes at the client's FIN.
#[derive(Debug)]
pub struct TcpSink {
    addr: SocketAddr,
    accepted: Arc<AtomicU64>,
    bytes: Arc<AtomicU64>,
    completed: Arc<AtomicU64>,
    _serving: Serving,
}

impl TcpSink {
    pub async fn start() -> anyhow::Result<Self> {
        Self::start_on(localhost()).await
    }

    pub async fn start_on(addr: SocketAddr) -> anyhow::Result<Self> {
        let listener = TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
        let addr = listener.local_addr()?;
        let accepted = Arc::new(AtomicU64::new(0));
        let bytes = Arc::new(AtomicU64::new(0));
        let completed = Arc::new(AtomicU64::new(0));
        let (b, c) = (bytes.clone(), completed.clone());
        let serving = serve(listener, accepted.clone(), move |mut s| {
            let (bytes, completed) = (b.clone(), c.clone());
            async move {
                let mut buf = vec![0u8; 64 * 1024];
                // Ends at EOF or error.
                loop {
                    match s.read(&mut buf).await {
                        Ok(0) => {
                            completed.fetch_add(1, Ordering::Relaxed);
                            break;
                        }
                        Ok(n) => {
                            bytes.fetch_add(n as u64, Ordering::Relaxed);
                        }
                        Err(_) => break,
                    }
                }
            }
        });
        Ok(Self { addr, accepted, bytes, completed, _serving: serving })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn connections(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    /// Bytes received over all connections.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Connections that ended with a clean EOF.
    pub fn completed(&self) -> u64 {
        self.completed.load(Ordering::Relaxed)
    }
}

/// Plain HTTP/1.1 responder: answers every request `200` with a fixed body and
/// `Connection: close`, and remembers the request heads it saw (the last 100).
#[derive(Debug)]
pub struct HttpBackend {
    addr: SocketAddr,
    accepted: Arc<AtomicU64>,
    heads: Arc<Mutex<Vec<String>>>,
    _serving: Serving,
}

impl HttpBackend {
    pub async fn start(content_type: &str, body: &str) -> anyhow::Result<Self> {
        Self::start_on(localhost(), content_type, body).await
    }

    /// A scrape target: a Prometheus text page with `testbed_up{target="<name>"} 1`.
    pub async fn metrics(name: &str) -> anyhow::Result<Self> {
        let body = format!(
            "# HELP testbed_up A stand-in scrape target.\n# TYPE testbed_up gauge\ntestbed_up{{target=\"{name}\"}} 1\n"
        );
        Self::start("text/plain; version=0.0.4", &body).await
    }

    pub async fn start_on(addr: SocketAddr, content_type: &str, body: &str) -> anyhow::Result<Self> {
        let listener = TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
        let addr = listener.local_addr()?;
        let accepted = Arc::new(AtomicU64::new(0));
        let heads = Arc::new(Mutex::new(Vec::new()));
        let resp: Arc<[u8]> = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
        .into();
        let h = heads.clone();
        let serving = serve(listener, accepted.clone(), move |mut s| {
            let (resp, heads) = (resp.clone(), h.clone());
            async move {
                let Ok((head, _)) = read_head(&mut s).await else { return };
                {
                    let mut v = heads.lock().unwrap_or_else(|e| e.into_inner());
                    if v.len() >= 100 {
                        v.remove(0);
                    }
                    v.push(head);
                }
                let _ = s.write_all(&resp).await;
                let _ = s.shutdown().await;
            }
        });
        Ok(Self { addr, accepted, heads, _serving: serving })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn connections(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    /// The request heads received so far (request line and headers, without the blank line).
    pub fn requests(&self) -> Vec<String> {
        self.heads.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls_client::{TlsFailure, http_get_request, tls_connect, tls_handshake_error, tls_request};
    use rustls::AlertDescription;

    const DEADLINE: Duration = Duration::from_secs(10);

    #[tokio::test]
    async fn tls_backend_reports_what_it_saw() {
        let ca = Ca::new("ca").unwrap();
        let b = TlsHttpBackend::start("a", &ca.server(&["api.a.test", "127.0.0.1"]).unwrap(), None).await.unwrap();
        let cfg = pki::client_config(&ca, None, &["h2", "http/1.1"]).unwrap();
        let r = tls_request(b.addr(), Some("api.a.test"), cfg.clone(), &http_get_request("api.a.test", "/x"))
            .await
            .unwrap();
        assert_eq!(r.peer_cn.as_deref(), Some("api.a.test"));
        assert_eq!(r.peer_sans, ["api.a.test", "127.0.0.1"]);
        assert_eq!(r.alpn.as_deref(), Some("http/1.1"));
        assert_eq!(r.status(), Some(200));
        assert_eq!(r.body(), "backend=a sni=api.a.test alpn=http/1.1 client_cn=- path=/x proxy=-\n");

        // No SNI: verified against the IP SAN, and the backend saw none.
        let r = tls_request(b.addr(), None, cfg.clone(), &http_get_request("x", "/")).await.unwrap();
        assert!(r.body().contains("sni=- "), "{}", r.body());

        // A name the certificate does not carry fails on the client side, not with an alert.
        let f = tls_handshake_error(b.addr(), Some("other.test"), cfg).await.unwrap();
        assert!(matches!(f, TlsFailure::Other(ref s) if s.contains("not valid for name")), "{f}");
        assert_eq!(b.connections(), 3);
    }

    #[tokio::test]
    async fn mtls_backend_requires_a_client_certificate() {
        let ca = Ca::new("ca").unwrap();
        let b = TlsHttpBackend::start("b", &ca.server(&["api.b.test"]).unwrap(), Some(&ca)).await.unwrap();
        let req = http_get_request("api.b.test", "/");
        let with = pki::client_config(&ca, Some(&ca.client("shoot--b").unwrap()), &[]).unwrap();
        let r = tls_request(b.addr(), Some("api.b.test"), with, &req).await.unwrap();
        assert!(r.body().contains("client_cn=shoot--b "), "{}", r.body());
        assert_eq!(r.alpn, None);

        // TLS 1.3: the client's handshake completes first; the alert arrives on the first read.
        let without = pki::client_config(&ca, None, &[]).unwrap();
        let e = tls_request(b.addr(), Some("api.b.test"), without, &req).await.unwrap_err();
        let f = TlsFailure::of(&e);
        assert!(f.is_alert(AlertDescription::CertificateRequired), "{f}");
        assert_eq!(f.to_string(), "alert certificate_required");

        // A certificate from another CA is refused too.
        let other = Ca::new("other").unwrap();
        let wrong = pki::client_config(&ca, Some(&other.client("x").unwrap()), &[]).unwrap();
        let e = tls_request(b.addr(), Some("api.b.test"), wrong, &req).await.unwrap_err();
        assert!(matches!(TlsFailure::of(&e), TlsFailure::Alert(_)), "{e:#}");
    }

    #[tokio::test]
    async fn tls_echo_half_close_and_proxy_header() {
        let ca = Ca::new("ca").unwrap();
        let b = TlsHttpBackend::start("e", &ca.server(&["e.test"]).unwrap(), None).await.unwrap();
        let cfg = pki::client_config(&ca, None, &[]).unwrap();

        // A PROXY v2 header before the ClientHello, as the router's send_proxy_protocol writes it.
        let mut tcp = TcpStream::connect(b.addr()).await.unwrap();
        let mut v2 = b"\r\n\r\n\0\r\nQUIT\n\x21\x11\x00\x0c".to_vec();
        v2.extend_from_slice(&[10, 1, 2, 3, 10, 9, 9, 9, 0x30, 0x39, 0x01, 0xbb]);
        tcp.write_all(&v2).await.unwrap();
        let connector = tokio_rustls::TlsConnector::from(cfg.clone());
        let mut tls = connector.connect("e.test".try_into().unwrap(), tcp).await.unwrap();
        tls.write_all(&http_get_request("e.test", "/")).await.unwrap();
        let mut out = String::new();
        tls.read_to_string(&mut out).await.unwrap();
        assert!(out.contains("proxy=10.1.2.3:12345\n"), "{out}");

        // /echo: the head, then our bytes back; our close_notify ends it and the backend closes.
        let mut tls = tls_connect(b.addr(), Some("e.test"), cfg).await.unwrap();
        tls.write_all(b"GET /echo HTTP/1.1\r\nHost: e.test\r\n\r\nearly ").await.unwrap();
        tls.write_all(b"late").await.unwrap();
        tls.shutdown().await.unwrap();
        let mut out = String::new();
        tokio::time::timeout(DEADLINE, tls.read_to_string(&mut out)).await.unwrap().unwrap();
        let (head, body) = out.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 200") && head.contains("x-testbed: backend=e"), "{head}");
        assert_eq!(body, "early late");
        assert_eq!(b.echoed_bytes(), 10);
    }

    #[tokio::test]
    async fn tcp_echo_sink_and_http() {
        let e = TcpEcho::start().await.unwrap();
        let mut s = TcpStream::connect(e.addr()).await.unwrap();
        s.write_all(b"hello").await.unwrap();
        s.shutdown().await.unwrap(); // half-close: the echo must still answer, then FIN
        let mut out = Vec::new();
        tokio::time::timeout(DEADLINE, s.read_to_end(&mut out)).await.unwrap().unwrap();
        assert_eq!(out, b"hello");

        let sink = TcpSink::start().await.unwrap();
        let mut s = TcpStream::connect(sink.addr()).await.unwrap();
        s.write_all(&[7u8; 100_000]).await.unwrap();
        drop(s);
        crate::poll_until(DEADLINE, Duration::from_millis(5), || async { (sink.completed() == 1).then_some(()) })
            .await
            .unwrap();
        assert_eq!((sink.bytes(), sink.connections()), (100_000, 1));

        let h = HttpBackend::metrics("node-1").await.unwrap();
        let (status, body) = crate::http_get(h.addr(), "/metrics").await.unwrap();
        assert_eq!(status, 200);
        assert_eq!(crate::metric_value(&body, "testbed_up", &[("target", "node-1")]), Some(1.0));
        assert!(h.requests()[0].starts_with("GET /metrics HTTP/1.1\r\nHost: "), "{:?}", h.requests());
    }

    #[tokio::test]
    async fn certificates_are_written_as_pem() {
        let dir = crate::TempDir::new("pki").unwrap();
        let ca = Ca::new("ca").unwrap();
        let ca_path = ca.write(dir.path(), "ca").unwrap();
        let (c, k) = ca.client("shoot--a").unwrap().write(dir.path(), "agent").unwrap();
        assert!(std::fs::read_to_string(ca_path).unwrap().starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(std::fs::read_to_string(c).unwrap().starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(std::fs::read_to_string(k).unwrap().starts_with("-----BEGIN PRIVATE KEY-----"));
        let issued = ca.client("shoot--a").unwrap();
        assert_eq!(pki::cert_names(&issued.cert_der), (Some("shoot--a".into()), vec![]));
    }
}
