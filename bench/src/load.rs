//! Load generators and the backends they talk to. Everything here runs in the harness process
//! (pinned to the load core), except the echo helper, a child process that holds the backend
//! ends of many idle connections (so that harness and backends each stay under the fd limit).
//!
//! - backends: [`Sink`] (counts bytes), [`Ping`] (one small answer, then FIN), [`Source`]
//!   (writes bytes until the peer goes away), [`Echo`] (echoes; also run as a helper process);
//! - generators: [`bulk_upload`], [`bulk_download`] (Gbit/s), [`closed_loop`] and [`open_loop`]
//!   (transactions per second and latency percentiles), [`hold`] (many idle connections);
//! - [`Latencies`]: a sorted-vector percentile summary.

use anyhow::{Context as _, bail, ensure};
use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio::time::Instant;

/// Bytes one bulk write hands to the kernel.
const BULK_CHUNK: usize = 256 * 1024;
/// Read buffer of the sink and of download readers.
const READ_BUF: usize = 256 * 1024;
/// What [`Ping`] answers: small, like an HTTP error page or a kubelet healthz.
pub(crate) const PING_REQUEST: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: bench\r\n\r\n";
pub(crate) const PING_RESPONSE: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok";
/// Per-step deadline of one transaction: a transaction that takes longer counts as an error.
const TXN_TIMEOUT: Duration = Duration::from_secs(10);

fn localhost() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// An accept loop; dropping the handle aborts it and every connection it serves.
#[derive(Debug)]
struct Serving(tokio::task::JoinHandle<()>);

impl Drop for Serving {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn serve<F, Fut>(listener: TcpListener, handle: F) -> Serving
where
    F: Fn(TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    Serving(tokio::spawn(async move {
        let mut conns = JoinSet::new();
        // Until the handle is dropped: each round reaps a finished connection or accepts one.
        loop {
            tokio::select! {
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
                r = listener.accept() => match r {
                    Ok((s, _)) => { conns.spawn(handle(s)); }
                    Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
                },
            }
        }
    }))
}

/// A backend listener on 127.0.0.1 with a deep accept queue: thousands of connections opened
/// in a burst must not overflow it (a dropped SYN costs a 1 s retransmission).
async fn bind() -> anyhow::Result<TcpListener> {
    bind_at(localhost().ip()).await
}

/// [`bind`] on a port of `ip` (an address of the namespace the calling thread is in).
async fn bind_at(ip: IpAddr) -> anyhow::Result<TcpListener> {
    let sock = match ip {
        IpAddr::V4(_) => tokio::net::TcpSocket::new_v4(),
        IpAddr::V6(_) => tokio::net::TcpSocket::new_v6(),
    }
    .context("backend socket")?;
    sock.bind(SocketAddr::new(ip, 0)).with_context(|| format!("binding a backend on {ip}"))?;
    sock.listen(4096).context("listen")
}

/// A backend listener on 127.0.0.1:`port` with `SO_REUSEPORT`: several load processes bind the
/// same port and the kernel spreads the connections over them.
pub(crate) fn bind_shared(port: u16) -> anyhow::Result<TcpListener> {
    let sock = tokio::net::TcpSocket::new_v4().context("backend socket")?;
    sock.set_reuseport(true)?;
    sock.set_reuseaddr(true)?;
    sock.bind(SocketAddr::from(([127, 0, 0, 1], port))).with_context(|| format!("binding 127.0.0.1:{port}"))?;
    sock.listen(4096).context("listen")
}

/// Counts every byte it receives; closes at EOF.
#[derive(Debug)]
pub(crate) struct Sink {
    addr: SocketAddr,
    bytes: Arc<AtomicU64>,
    _serving: Serving,
}

impl Sink {
    pub(crate) async fn start() -> anyhow::Result<Self> {
        Self::start_on(bind().await?)
    }

    /// A sink on a port of `ip`.
    pub(crate) async fn start_at(ip: IpAddr) -> anyhow::Result<Self> {
        Self::start_on(bind_at(ip).await?)
    }

    pub(crate) fn start_on(l: TcpListener) -> anyhow::Result<Self> {
        let addr = l.local_addr()?;
        let bytes = Arc::new(AtomicU64::new(0));
        let b = bytes.clone();
        let serving = serve(l, move |mut s| {
            let bytes = b.clone();
            async move {
                let mut buf = vec![0u8; READ_BUF];
                // Ends at EOF or an error (the peer decides).
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    bytes.fetch_add(n as u64, Ordering::Relaxed);
                }
            }
        });
        Ok(Self { addr, bytes, _serving: serving })
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub(crate) fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }
}

/// Answers the first read with [`PING_RESPONSE`] and closes (FIN): one small request per
/// connection, the shape of an HTTP/1.0 exchange.
#[derive(Debug)]
pub(crate) struct Ping {
    addr: SocketAddr,
    _serving: Serving,
}

impl Ping {
    pub(crate) async fn start() -> anyhow::Result<Self> {
        Self::start_on(bind().await?)
    }

    pub(crate) fn start_on(l: TcpListener) -> anyhow::Result<Self> {
        let addr = l.local_addr()?;
        let serving = serve(l, |mut s| async move {
            let _ = s.set_nodelay(true);
            let mut buf = [0u8; 2048];
            if let Ok(Ok(n)) = tokio::time::timeout(TXN_TIMEOUT, s.read(&mut buf)).await
                && n > 0
            {
                let _ = s.write_all(PING_RESPONSE).await;
                let _ = s.shutdown().await;
                // Wait for the peer's FIN so that the close is orderly (no RST on unread data).
                let _ = tokio::time::timeout(TXN_TIMEOUT, s.read(&mut buf)).await;
            }
        });
        Ok(Self { addr, _serving: serving })
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// Writes bytes as fast as the peer reads them, until the peer goes away.
#[derive(Debug)]
pub(crate) struct Source {
    addr: SocketAddr,
    _serving: Serving,
}

impl Source {
    pub(crate) async fn start() -> anyhow::Result<Self> {
        Self::start_on(bind().await?)
    }

    /// A source on a port of `ip`.
    pub(crate) async fn start_at(ip: IpAddr) -> anyhow::Result<Self> {
        Self::start_on(bind_at(ip).await?)
    }

    fn start_on(l: TcpListener) -> anyhow::Result<Self> {
        let addr = l.local_addr()?;
        let serving = serve(l, |s| async move {
            let (mut r, mut w) = s.into_split();
            // Anything the client sends (a CONNECT's pipelined bytes, nothing else) is drained
            // so that the close is orderly; the writer ends when the peer is gone.
            let drain = tokio::spawn(async move {
                let mut b = [0u8; 4096];
                while let Ok(n) = r.read(&mut b).await {
                    if n == 0 {
                        break;
                    }
                }
            });
            let buf = vec![0x5au8; BULK_CHUNK];
            while w.write_all(&buf).await.is_ok() {}
            drain.abort();
        });
        Ok(Self { addr, _serving: serving })
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// Echoes every byte until EOF, then closes. Small buffer: it holds thousands of idle
/// connections in the echo helper.
#[derive(Debug)]
pub(crate) struct Echo {
    addr: SocketAddr,
    _serving: Serving,
}

impl Echo {
    pub(crate) async fn start() -> anyhow::Result<Self> {
        Self::start_on(bind().await?)
    }

    /// An echo on a port of `ip`.
    pub(crate) async fn start_at(ip: IpAddr) -> anyhow::Result<Self> {
        Self::start_on(bind_at(ip).await?)
    }

    fn start_on(l: TcpListener) -> anyhow::Result<Self> {
        let addr = l.local_addr()?;
        let serving = serve(l, |mut s| async move {
            let mut buf = vec![0u8; 16 * 1024];
            // Ends at EOF or an error.
            while let Ok(n) = s.read(&mut buf).await {
                if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
            let _ = s.shutdown().await;
        });
        Ok(Self { addr, _serving: serving })
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// The echo helper process (`bench serve-echo --addr-file F`): binds 127.0.0.1:0, writes the
/// address to F (atomically), serves until killed.
pub(crate) fn run_echo_helper(addr_file: &Path) -> anyhow::Result<()> {
    crate::host::raise_nofile(crate::host::NOFILE)?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        let echo = Echo::start().await?;
        let tmp = addr_file.with_extension("tmp");
        std::fs::write(&tmp, echo.addr().to_string())?;
        std::fs::rename(&tmp, addr_file)?;
        // Serve until the parent kills us.
        std::future::pending::<()>().await;
        drop(echo);
        anyhow::Ok(())
    })
}

/// What a connection sends before its payload.
#[derive(Debug, Clone)]
pub(crate) enum Preamble {
    None,
    /// Bytes written first, answered by nothing (a ClientHello, a PROXY header, or both).
    Raw(Arc<[u8]>),
    /// An HTTP CONNECT head; the payload starts after a `200` response head.
    Connect(Arc<[u8]>),
}

pub(crate) fn connect_head(authority: &str, extra_headers: &str) -> Vec<u8> {
    format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n{extra_headers}\r\n").into_bytes()
}

/// Read an HTTP response head (up to the blank line) byte-exactly and require status 200.
/// Never reads past the head (the bytes after it belong to the tunnel), and without a read per
/// byte: it peeks at what has arrived and consumes only the head's part of it, so a head that
/// arrives in one segment costs two calls, as a buffered client's one read would (a read per
/// byte would put ~40 calls of the harness's own into every CONNECT latency it measures).
pub(crate) async fn read_connect_response(s: &mut TcpStream) -> anyhow::Result<()> {
    let mut head = Vec::with_capacity(128);
    let mut seen = [0u8; 1024];
    // A head longer than 8 KiB is an error; each round consumes at least one byte.
    while head.len() < 8192 {
        let n = s.peek(&mut seen).await?;
        ensure!(n > 0, "EOF in the CONNECT response head ({:?})", String::from_utf8_lossy(&head));
        let start = head.len();
        let mut end = None;
        for (i, &b) in seen[..n].iter().enumerate() {
            head.push(b);
            if head.ends_with(b"\r\n\r\n") {
                end = Some(i + 1);
                break;
            }
        }
        let take = end.unwrap_or(n);
        s.read_exact(&mut seen[..take]).await?;
        debug_assert_eq!(&seen[..take], &head[start..]);
        if end.is_some() {
            let line = head.split(|&c| c == b'\r').next().unwrap_or_default();
            let ok = line.starts_with(b"HTTP/1.") && line.get(9..12) == Some(b"200".as_slice());
            ensure!(ok, "CONNECT answered {:?}", String::from_utf8_lossy(line));
            return Ok(());
        }
    }
    bail!("CONNECT response head larger than 8 KiB")
}

/// Connect and send the preamble (for CONNECT: wait for the 200).
pub(crate) async fn open(addr: SocketAddr, pre: &Preamble) -> anyhow::Result<TcpStream> {
    let mut s = TcpStream::connect(addr).await.with_context(|| format!("connecting {addr}"))?;
    match pre {
        Preamble::None => {}
        Preamble::Raw(b) => s.write_all(b).await?,
        Preamble::Connect(head) => {
            s.write_all(head).await?;
            read_connect_response(&mut s).await?;
        }
    }
    Ok(s)
}

/// Wait until `n` of the tasks have reported in `up`, or one of them failed.
async fn wait_up(
    up: &AtomicUsize,
    failed: &AtomicUsize,
    n: usize,
    first_err: &std::sync::Mutex<Option<String>>,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    // Bounded by the deadline.
    while up.load(Ordering::Relaxed) < n {
        if failed.load(Ordering::Relaxed) > 0 {
            let e = first_err.lock().unwrap_or_else(|e| e.into_inner()).clone();
            bail!("a stream failed to open: {}", e.unwrap_or_default());
        }
        ensure!(Instant::now() < deadline, "only {} of {n} streams opened within 30s", up.load(Ordering::Relaxed));
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(())
}

/// Bits per second as Gbit/s.
fn gbit(bytes: u64, d: Duration) -> f64 {
    bytes as f64 * 8.0 / d.as_secs_f64() / 1e9
}

/// `streams` connections each write bulk bytes (after the preamble) to a [`Sink`] behind
/// `addr`; the sink's byte count over the measuring window, after `warmup`, gives Gbit/s.
pub(crate) async fn bulk_upload(
    addr: SocketAddr,
    pre: &Preamble,
    streams: usize,
    sink: &Sink,
    warmup: Duration,
    measure: Duration,
) -> anyhow::Result<f64> {
    let up = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    let first_err = Arc::new(std::sync::Mutex::new(None));
    let mut tasks = JoinSet::new();
    for _ in 0..streams {
        let (pre, up, failed, first_err) = (pre.clone(), up.clone(), failed.clone(), first_err.clone());
        tasks.spawn(async move {
            let mut s = match open(addr, &pre).await {
                Ok(s) => s,
                Err(e) => {
                    failed.fetch_add(1, Ordering::Relaxed);
                    first_err.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(format!("{e:#}"));
                    return;
                }
            };
            up.fetch_add(1, Ordering::Relaxed);
            let buf = vec![0xa5u8; BULK_CHUNK];
            // Until aborted (or the path breaks).
            while s.write_all(&buf).await.is_ok() {}
        });
    }
    let r = async {
        wait_up(&up, &failed, streams, &first_err).await?;
        tokio::time::sleep(warmup).await;
        let (b0, t0) = (sink.bytes(), Instant::now());
        tokio::time::sleep(measure).await;
        let (b1, t1) = (sink.bytes(), Instant::now());
        ensure!(failed.load(Ordering::Relaxed) == 0, "a stream failed");
        Ok(gbit(b1 - b0, t1 - t0))
    }
    .await;
    tasks.shutdown().await;
    // Bytes the path still holds (socket buffers, a tunnel's windows) keep arriving after the
    // writers stopped; the next measurement starts once the sink is quiet.
    settle(sink).await;
    r
}

/// Wait until the sink has received nothing for 200 ms (at most 20 s).
pub(crate) async fn settle(sink: &Sink) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = sink.bytes();
    // Bounded by the deadline.
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = sink.bytes();
        if now == last {
            return;
        }
        last = now;
    }
}

/// `streams` connections each read what a [`Source`] behind `addr` sends; with `stalled`, one
/// more connection is opened first and never read (its reader is stalled: the path fills up
/// behind it). Gbit/s received by the reading streams over the measuring window.
pub(crate) async fn bulk_download(
    addr: SocketAddr,
    pre: &Preamble,
    streams: usize,
    stalled: bool,
    warmup: Duration,
    measure: Duration,
) -> anyhow::Result<f64> {
    Ok(bulk_download_each(addr, pre, streams, stalled, warmup, measure).await?.iter().sum())
}

/// [`bulk_download`], stream by stream: the Gbit/s each reading stream received over the window.
pub(crate) async fn bulk_download_each(
    addr: SocketAddr,
    pre: &Preamble,
    streams: usize,
    stalled: bool,
    warmup: Duration,
    measure: Duration,
) -> anyhow::Result<Vec<f64>> {
    let mut held = None;
    if stalled {
        let s = open(addr, pre).await.context("opening the stalled stream")?;
        // Let the source fill every buffer and window on the stalled stream's path.
        tokio::time::sleep(warmup.max(Duration::from_millis(200))).await;
        held = Some(s);
    }
    let counts: Vec<Arc<AtomicU64>> = (0..streams).map(|_| Arc::new(AtomicU64::new(0))).collect();
    let up = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    let first_err = Arc::new(std::sync::Mutex::new(None));
    let mut tasks = JoinSet::new();
    for bytes in &counts {
        let (pre, up, failed, first_err, bytes) =
            (pre.clone(), up.clone(), failed.clone(), first_err.clone(), bytes.clone());
        tasks.spawn(async move {
            let mut s = match open(addr, &pre).await {
                Ok(s) => s,
                Err(e) => {
                    failed.fetch_add(1, Ordering::Relaxed);
                    first_err.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(format!("{e:#}"));
                    return;
                }
            };
            up.fetch_add(1, Ordering::Relaxed);
            let mut buf = vec![0u8; READ_BUF];
            // Until aborted, EOF or an error.
            while let Ok(n) = s.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                bytes.fetch_add(n as u64, Ordering::Relaxed);
            }
        });
    }
    let read = |counts: &[Arc<AtomicU64>]| counts.iter().map(|c| c.load(Ordering::Relaxed)).collect::<Vec<_>>();
    let r = async {
        wait_up(&up, &failed, streams, &first_err).await?;
        tokio::time::sleep(warmup).await;
        let (b0, t0) = (read(&counts), Instant::now());
        tokio::time::sleep(measure).await;
        let (b1, t1) = (read(&counts), Instant::now());
        Ok(b0.iter().zip(&b1).map(|(a, b)| gbit(b - a, t1 - t0)).collect())
    }
    .await;
    tasks.shutdown().await;
    drop(held);
    // Let the path discard what it held for the closed readers before the next measurement.
    tokio::time::sleep(Duration::from_millis(200)).await;
    r
}

/// One transaction of a connection-rate test: open a connection, do one small exchange, close.
#[derive(Clone)]
pub(crate) enum Txn {
    /// TCP connect, a full TLS handshake (configure the client without resumption), an HTTP
    /// request, the response to its end.
    Tls { addr: SocketAddr, sni: ServerName<'static>, cfg: Arc<ClientConfig>, request: Arc<[u8]> },
    /// TCP connect, `pre` and the request in one write, the response to EOF ([`Ping`]).
    Plain { addr: SocketAddr, pre: Arc<[u8]> },
    /// TCP connect, a CONNECT head, its 200, then the request and the response to EOF.
    Connect { addr: SocketAddr, head: Arc<[u8]> },
}

impl std::fmt::Debug for Txn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Tls { addr, sni, .. } => write!(f, "Tls({addr}, {sni:?})"),
            Self::Plain { addr, .. } => write!(f, "Plain({addr})"),
            Self::Connect { addr, .. } => write!(f, "Connect({addr})"),
        }
    }
}

/// What one transaction took: until the channel was open (TLS handshake done, CONNECT 200
/// received, TCP connected) and until the first response byte.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TxnTimes {
    pub open: Duration,
    pub first_byte: Duration,
}

async fn read_to_end_after_first<R: AsyncRead + Unpin>(r: &mut R, start: Instant) -> anyhow::Result<Duration> {
    let mut buf = [0u8; 4096];
    let n = r.read(&mut buf).await?;
    ensure!(n > 0, "EOF before any response byte");
    let first = start.elapsed();
    let mut total = n;
    // Bounded by the server closing; small responses.
    loop {
        match r.read(&mut buf).await {
            Ok(0) => break,
            Ok(k) => total += k,
            // A peer that closes without close_notify after answering is fine here.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(e.into()),
        }
        ensure!(total < 1 << 20, "response larger than 1 MiB");
    }
    Ok(first)
}

impl Txn {
    pub(crate) async fn run(&self) -> anyhow::Result<TxnTimes> {
        self.run_within(TXN_TIMEOUT).await
    }

    /// [`Txn::run`] with a deadline of the caller's choosing for the whole transaction.
    pub(crate) async fn run_within(&self, limit: Duration) -> anyhow::Result<TxnTimes> {
        tokio::time::timeout(limit, self.run_inner())
            .await
            .with_context(|| format!("transaction timed out after {limit:?}"))?
    }

    async fn run_inner(&self) -> anyhow::Result<TxnTimes> {
        let start = Instant::now();
        match self {
            Self::Tls { addr, sni, cfg, request } => {
                let tcp = TcpStream::connect(addr).await?;
                tcp.set_nodelay(true)?;
                let connector = tokio_rustls::TlsConnector::from(cfg.clone());
                let mut tls = connector.connect(sni.clone(), tcp).await.context("TLS handshake")?;
                let open = start.elapsed();
                tls.write_all(request).await?;
                tls.flush().await?;
                let first_byte = read_to_end_after_first(&mut tls, start).await?;
                Ok(TxnTimes { open, first_byte })
            }
            Self::Plain { addr, pre } => {
                let mut s = TcpStream::connect(addr).await?;
                let open = start.elapsed();
                s.set_nodelay(true)?;
                let mut msg = Vec::with_capacity(pre.len() + PING_REQUEST.len());
                msg.extend_from_slice(pre);
                msg.extend_from_slice(PING_REQUEST);
                s.write_all(&msg).await?;
                let first_byte = read_to_end_after_first(&mut s, start).await?;
                Ok(TxnTimes { open, first_byte })
            }
            Self::Connect { addr, head } => {
                let mut s = TcpStream::connect(addr).await?;
                s.set_nodelay(true)?;
                s.write_all(head).await?;
                read_connect_response(&mut s).await?;
                let open = start.elapsed();
                s.write_all(PING_REQUEST).await?;
                let first_byte = read_to_end_after_first(&mut s, start).await?;
                Ok(TxnTimes { open, first_byte })
            }
        }
    }
}

/// Latency samples; percentiles by nearest rank over the sorted samples.
#[derive(Debug, Default, Clone)]
pub(crate) struct Latencies {
    ns: Vec<u64>,
}

impl Latencies {
    pub(crate) fn push(&mut self, d: Duration) {
        self.ns.push(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    }

    /// The samples in whole microseconds (for handing them to another process).
    pub(crate) fn micros(&self) -> Vec<u32> {
        self.ns.iter().map(|&n| u32::try_from(n / 1000).unwrap_or(u32::MAX)).collect()
    }

    pub(crate) fn extend(&mut self, o: Latencies) {
        self.ns.extend(o.ns);
    }

    pub(crate) fn len(&self) -> usize {
        self.ns.len()
    }

    pub(crate) fn finish(&mut self) {
        self.ns.sort_unstable();
    }

    /// The `q`-quantile (0 < q ≤ 1) in microseconds; call [`Latencies::finish`] first.
    pub(crate) fn quantile_us(&self, q: f64) -> f64 {
        if self.ns.is_empty() {
            return f64::NAN;
        }
        let rank = (q * self.ns.len() as f64).ceil() as usize;
        let i = rank.clamp(1, self.ns.len()) - 1;
        self.ns[i] as f64 / 1000.0
    }
}

/// What a connection-rate run produced.
#[derive(Debug, Default)]
pub(crate) struct RateResult {
    /// Transactions completed per second in the measuring window.
    pub rate: f64,
    pub open: Latencies,
    pub first_byte: Latencies,
    pub errors: u64,
    pub first_error: Option<String>,
    /// Open loop: starts skipped because too many transactions were outstanding.
    pub dropped: u64,
}

/// Closed loop: `concurrency` workers each run transactions back to back. Completions that end
/// inside the measuring window (after `warmup`) count; their latencies are kept. A window in
/// which nothing completed and nothing failed is stretched (by at most [`TXN_TIMEOUT`]) until
/// something does: a system slower than the window (a debug build in a brief smoke window) then
/// gets a figure over the longer window, not an empty one.
pub(crate) async fn closed_loop(txn: &Txn, concurrency: usize, warmup: Duration, measure: Duration) -> RateResult {
    let t0 = Instant::now();
    let (ws, we) = (t0 + warmup, t0 + warmup + measure);
    // Outcomes inside the window so far, shared by the workers: while it is 0 the window stretches.
    let outcomes = Arc::new(AtomicU64::new(0));
    let open =
        move |o: &AtomicU64, now: Instant| now < we || (o.load(Ordering::Relaxed) == 0 && now < we + TXN_TIMEOUT);
    let mut tasks = JoinSet::new();
    for _ in 0..concurrency {
        let (txn, outcomes) = (txn.clone(), outcomes.clone());
        tasks.spawn(async move {
            let mut r = RateResult::default();
            let (mut done, mut last) = (0u64, we);
            // Ends at the window's end (every transaction is bounded by TXN_TIMEOUT).
            while open(&outcomes, Instant::now()) {
                let res = txn.run().await;
                let now = Instant::now();
                let inside = now >= ws && (now <= we || outcomes.load(Ordering::Relaxed) == 0);
                match res {
                    Ok(t) if inside => {
                        outcomes.fetch_add(1, Ordering::Relaxed);
                        done += 1;
                        last = last.max(now);
                        r.open.push(t.open);
                        r.first_byte.push(t.first_byte);
                    }
                    Ok(_) => {}
                    Err(e) => {
                        if now >= ws {
                            outcomes.fetch_add(1, Ordering::Relaxed);
                        }
                        r.errors += 1;
                        r.first_error.get_or_insert_with(|| format!("{e:#}"));
                        // Do not spin on a refused connection.
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
            }
            (done, last, r)
        });
    }
    let mut out = RateResult::default();
    let (mut done, mut last) = (0, we);
    while let Some(j) = tasks.join_next().await {
        if let Ok((d, l, r)) = j {
            done += d;
            last = last.max(l);
            out.open.extend(r.open);
            out.first_byte.extend(r.first_byte);
            out.errors += r.errors;
            if out.first_error.is_none() {
                out.first_error = r.first_error;
            }
        }
    }
    out.rate = done as f64 / (last - ws).as_secs_f64();
    out.open.finish();
    out.first_byte.finish();
    out
}

/// Open loop: start a transaction every `1/rate` seconds regardless of completions (at most
/// `max_outstanding` at once; starts beyond that are counted as dropped). Latency is measured
/// from each transaction's own start. Transactions started inside the window count.
pub(crate) async fn open_loop(
    txn: &Txn,
    rate: f64,
    warmup: Duration,
    measure: Duration,
    max_outstanding: usize,
) -> RateResult {
    let period = Duration::from_secs_f64(1.0 / rate);
    let t0 = Instant::now();
    let (ws, we) = (t0 + warmup, t0 + warmup + measure);
    let mut tasks = JoinSet::new();
    let mut out = RateResult::default();
    let mut done = 0u64;
    let mut take = |j: Result<(bool, anyhow::Result<TxnTimes>), tokio::task::JoinError>, out: &mut RateResult| {
        if let Ok((true, r)) = j {
            match r {
                Ok(t) => {
                    done += 1;
                    out.open.push(t.open);
                    out.first_byte.push(t.first_byte);
                }
                Err(e) => {
                    out.errors += 1;
                    out.first_error.get_or_insert_with(|| format!("{e:#}"));
                }
            }
        }
    };
    let mut next = t0;
    // One start per period until the window ends: bounded by (warmup + measure) / period.
    while next < we {
        tokio::time::sleep_until(next).await;
        let in_window = next >= ws;
        next += period;
        // Reap finished ones as we go so the set stays small.
        while let Some(j) = tasks.try_join_next() {
            take(j, &mut out);
        }
        if tasks.len() >= max_outstanding {
            if in_window {
                out.dropped += 1;
            }
            continue;
        }
        let txn = txn.clone();
        tasks.spawn(async move { (in_window, txn.run().await) });
    }
    while let Some(j) = tasks.join_next().await {
        take(j, &mut out);
    }
    out.rate = done as f64 / measure.as_secs_f64();
    out.open.finish();
    out.first_byte.finish();
    out
}

/// Round trips of `msg` on one connection opened through `addr` (the preamble first), one
/// started every `1/rate` seconds, to an [`Echo`] behind it: what a client sees per request on a
/// kept-alive connection (a webhook call on a reused connection), without the open. Round trips
/// started inside the window count; an echo that differs from `msg`, an EOF or a round trip
/// beyond [`TXN_TIMEOUT`] is an error.
pub(crate) async fn round_trips(
    addr: SocketAddr,
    pre: &Preamble,
    msg: &[u8],
    rate: f64,
    warmup: Duration,
    measure: Duration,
) -> anyhow::Result<Latencies> {
    let mut s = open(addr, pre).await?;
    s.set_nodelay(true)?;
    let period = Duration::from_secs_f64(1.0 / rate);
    let t0 = Instant::now();
    let (ws, we) = (t0 + warmup, t0 + warmup + measure);
    let mut back = vec![0u8; msg.len()];
    let mut out = Latencies::default();
    let (mut next, mut k) = (t0, 0u64);
    // One round trip per period until the window ends: bounded by (warmup + measure) / period.
    while next < we {
        tokio::time::sleep_until(next).await;
        k += 1;
        let start = Instant::now();
        tokio::time::timeout(TXN_TIMEOUT, async {
            s.write_all(msg).await?;
            s.read_exact(&mut back).await
        })
        .await
        .with_context(|| format!("round trip {k} timed out"))?
        .with_context(|| format!("round trip {k}"))?;
        ensure!(back == msg, "the echo differs from what was sent");
        if start >= ws {
            out.push(start.elapsed());
        }
        // A round trip longer than the period delays the next start rather than queueing one.
        next = (next + period).max(Instant::now());
    }
    ensure!(out.len() > 0, "no round trip started inside the {measure:?} window");
    out.finish();
    Ok(out)
}

/// Open `n` connections through `addr` (at most `parallel` opening at once), each with the
/// preamble, then `probe` written and `expect_back` bytes read back (an [`Echo`] behind the
/// proxy confirms the whole path). Returns the open connections.
pub(crate) async fn hold(
    addr: SocketAddr,
    pre: &Preamble,
    probe: &[u8],
    expect_back: usize,
    n: usize,
    parallel: usize,
) -> anyhow::Result<Vec<TcpStream>> {
    let sem = Arc::new(tokio::sync::Semaphore::new(parallel.max(1)));
    let probe: Arc<[u8]> = probe.into();
    let mut tasks = JoinSet::new();
    for _ in 0..n {
        let (pre, probe, sem) = (pre.clone(), probe.clone(), sem.clone());
        tasks.spawn(async move {
            let _permit = sem.acquire_owned().await?;
            tokio::time::timeout(TXN_TIMEOUT, async {
                let mut s = open(addr, &pre).await?;
                s.write_all(&probe).await?;
                let mut back = vec![0u8; expect_back];
                s.read_exact(&mut back).await.context("reading the echo")?;
                anyhow::Ok(s)
            })
            .await
            .context("opening a held connection timed out")?
        });
    }
    let mut held = Vec::with_capacity(n);
    let mut first_err = None;
    // The first failure ends the attempt (a system out of descriptors would otherwise make
    // every remaining connection wait for its timeout).
    while let Some(j) = tasks.join_next().await {
        match j {
            Ok(Ok(s)) => held.push(s),
            Ok(Err(e)) => {
                if first_err.is_none() {
                    tasks.abort_all();
                }
                first_err.get_or_insert(e);
            }
            Err(e) if e.is_cancelled() => {}
            Err(e) => {
                first_err.get_or_insert(e.into());
            }
        }
    }
    if let Some(e) = first_err {
        let opened = held.len();
        drop(held);
        return Err(e.context(format!("{opened} of {n} connections opened before the first failure")));
    }
    Ok(held)
}

/// Each held connection sends `msg` and reads it back (echo); returns how many completed.
pub(crate) async fn echo_all(held: Vec<TcpStream>, msg: &[u8], parallel: usize) -> usize {
    let ok = Arc::new(AtomicUsize::new(0));
    let sem = Arc::new(tokio::sync::Semaphore::new(parallel.max(1)));
    let msg: Arc<[u8]> = msg.into();
    let mut tasks = JoinSet::new();
    for mut s in held {
        let (ok, sem, msg) = (ok.clone(), sem.clone(), msg.clone());
        tasks.spawn(async move {
            let Ok(_permit) = sem.acquire_owned().await else { return };
            let r = tokio::time::timeout(TXN_TIMEOUT, async {
                s.write_all(&msg).await?;
                let mut back = vec![0u8; msg.len()];
                s.read_exact(&mut back).await?;
                std::io::Result::Ok(back == *msg)
            })
            .await;
            if matches!(r, Ok(Ok(true))) {
                ok.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    ok.load(Ordering::Relaxed)
}

/// The ClientHello a rustls client sends for `sni` (one TLS record): the preamble of SNI-routed
/// connections whose backend does not speak TLS.
pub(crate) fn client_hello(cfg: Arc<ClientConfig>, sni: &str) -> anyhow::Result<Vec<u8>> {
    let name = ServerName::try_from(sni.to_owned()).context("SNI")?;
    let mut conn = rustls::ClientConnection::new(cfg, name)?;
    let mut out = Vec::new();
    // write_tls drains what is pending: the ClientHello.
    while conn.wants_write() {
        conn.write_tls(&mut out)?;
    }
    ensure!(out.first() == Some(&0x16), "not a TLS handshake record");
    Ok(out)
}

/// A PROXY protocol v2 header (PROXY command, TCP over IPv4) naming `src` → `dst`.
pub(crate) fn proxy_v2(src: SocketAddr, dst: SocketAddr) -> anyhow::Result<Vec<u8>> {
    let (SocketAddr::V4(s), SocketAddr::V4(d)) = (src, dst) else {
        bail!("IPv4 only");
    };
    let mut h = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    h.push(0x21); // version 2, PROXY
    h.push(0x11); // AF_INET, STREAM
    h.extend_from_slice(&12u16.to_be_bytes());
    h.extend_from_slice(&s.ip().octets());
    h.extend_from_slice(&d.ip().octets());
    h.extend_from_slice(&s.port().to_be_bytes());
    h.extend_from_slice(&d.port().to_be_bytes());
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_by_nearest_rank() {
        let mut l = Latencies::default();
        for us in 1..=1000u64 {
            l.push(Duration::from_micros(us));
        }
        l.finish();
        assert_eq!(l.quantile_us(0.5), 500.0);
        assert_eq!(l.quantile_us(0.99), 990.0);
        assert_eq!(l.quantile_us(0.999), 999.0);
        assert_eq!(l.quantile_us(1.0), 1000.0);
    }

    /// A server that writes `parts` to its one client, each its own segment (a pause between).
    async fn answering(parts: &'static [&'static [u8]]) -> TcpStream {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            s.set_nodelay(true).unwrap();
            for p in parts {
                s.write_all(p).await.unwrap();
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        TcpStream::connect(addr).await.unwrap()
    }

    #[tokio::test]
    async fn a_connect_answer_is_read_to_its_blank_line_and_no_further() {
        // In one segment with tunnel bytes behind it, and split inside the blank line.
        let whole: &[&[u8]] = &[b"HTTP/1.1 200 Connection established\r\n\r\nfirst tunnel bytes"];
        let split: &[&[u8]] = &[b"HTTP/1.1 200 OK\r\nVia: x\r", b"\n\r", b"\nfirst tunnel bytes"];
        for parts in [whole, split] {
            let mut s = answering(parts).await;
            read_connect_response(&mut s).await.unwrap();
            let mut rest = Vec::new();
            s.read_to_end(&mut rest).await.unwrap();
            assert_eq!(rest, b"first tunnel bytes");
        }
        let e = read_connect_response(&mut answering(&[b"HTTP/1.1 503 No agent\r\n\r\n"]).await).await;
        assert!(e.unwrap_err().to_string().contains("503"));
        let e = read_connect_response(&mut answering(&[b"HTTP/1.1 200 OK\r\n"]).await).await;
        assert!(e.unwrap_err().to_string().contains("EOF in the CONNECT response head"));
    }

    #[tokio::test]
    async fn generators_against_local_backends() {
        let sink = Sink::start().await.unwrap();
        let g =
            bulk_upload(sink.addr(), &Preamble::None, 2, &sink, Duration::from_millis(20), Duration::from_millis(50))
                .await
                .unwrap();
        assert!(g > 0.0);
        let src = Source::start().await.unwrap();
        let g =
            bulk_download(src.addr(), &Preamble::None, 2, true, Duration::from_millis(20), Duration::from_millis(50))
                .await
                .unwrap();
        assert!(g > 0.0);
        let ping = Ping::start().await.unwrap();
        let txn = Txn::Plain { addr: ping.addr(), pre: Arc::from(&b""[..]) };
        let r = closed_loop(&txn, 4, Duration::from_millis(20), Duration::from_millis(100)).await;
        assert!(r.rate > 0.0 && r.errors == 0, "{r:?}");
        let r = open_loop(&txn, 500.0, Duration::from_millis(20), Duration::from_millis(100), 100).await;
        assert!(r.first_byte.len() > 10 && r.errors == 0, "{r:?}");
        let echo = Echo::start().await.unwrap();
        let held = hold(echo.addr(), &Preamble::None, b"hi", 2, 20, 8).await.unwrap();
        assert_eq!(echo_all(held, b"again", 8).await, 20);
        let rt = round_trips(echo.addr(), &Preamble::None, &[7u8; 64], 500.0, ms(20), ms(100)).await.unwrap();
        assert!(rt.len() > 10, "{rt:?}");
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A server that reads one 4-byte message from its one client, writes `answer(message)` and
    /// closes.
    async fn answering_once(answer: fn([u8; 4]) -> [u8; 4]) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut b = [0u8; 4];
            s.read_exact(&mut b).await.unwrap();
            s.write_all(&answer(b)).await.unwrap();
        });
        addr
    }

    #[tokio::test]
    async fn round_trips_fail_on_a_wrong_echo_and_on_eof() {
        // Other bytes of the same length.
        let addr = answering_once(|_| *b"nope").await;
        let e = round_trips(addr, &Preamble::None, b"ping", 500.0, ms(0), ms(50)).await.unwrap_err();
        assert!(format!("{e:#}").contains("the echo differs"), "{e:#}");
        // One good echo, then the second round trip meets EOF.
        let addr = answering_once(|b| b).await;
        let e = round_trips(addr, &Preamble::None, b"ping", 500.0, ms(0), ms(50)).await.unwrap_err();
        assert!(format!("{e:#}").contains("round trip 2"), "{e:#}");
    }
}
