//! Front ends: HTTP CONNECT (kube-apiserver egress, Prometheus https targets) and absolute-form forward proxying (Prometheus http targets).
//!
//! konnectivity's gRPC protocol is one of them too ([`grpc`]): it shares this module's
//! handshake, dial and accounting, and only its framing differs.

mod grpc;
mod h2_normalise;
mod refusal;

use crate::registry::{DialRefused, DialTimes, Dialed};
use crate::shared::Shared;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper::body::{Frame, SizeHint};
use hyper_util::rt::TokioIo;
use proxy_core::net::accept::ConnPermit;
use proxy_core::net::guard::Active;
use proxy_core::net::ids::ConnId;
use proxy_core::net::pending::Admitted;
use proxy_core::net::share::{Hold, Kind};
use proxy_core::prometheus::{IntCounter, IntCounterVec};
use proxy_core::relay::access::Bytes as Moved;
use proxy_core::relay::copy::{Meters, Outcome, Stop, transfer};
use proxy_core::relay::io::{Prefixed, Resettable};
use proxy_core::tunnel::TunnelStream;
use proxy_wire::http_head::{self, HeadReader, RequestHead};
use refusal::PROXY_CHALLENGE;
pub(crate) use refusal::{ProxyAuth, Refusal};
use std::net::{IpAddr, Ipv4Addr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Instant;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

const READ_CHUNK: usize = 4096;

/// A running front end.
pub(crate) struct FrontendRt {
    pub name: Arc<str>,
    /// Fixed cluster, or `None` when the client certificate's CN or the proxy credentials name it.
    pub cluster: Option<String>,
    /// `cluster_from: proxy_authorization`: the token each request's proxy credentials must carry
    /// as the password (their user name is the cluster).
    pub proxy_token: Option<Arc<str>>,
    /// `grpc`: konnectivity's `ProxyService` over HTTP/2 rather than CONNECT.
    pub grpc: bool,
}

/// The cluster that `Proxy-Authorization: Basic base64(cluster:token)` names, if its password is
/// `token`.
fn proxy_auth_cluster(value: Option<&[u8]>, token: &str) -> Result<String, ProxyAuth> {
    let value = value.ok_or(ProxyAuth::Missing)?;
    let creds = proxy_wire::proxy_auth::basic(value).map_err(|_| ProxyAuth::Invalid)?;
    // Compare without an early exit so the time taken does not reveal the matching prefix.
    let (a, b) = (creds.password.as_bytes(), token.as_bytes());
    let same = a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0;
    if !same || !seedgate_config::server::valid_cluster_name(&creds.user) {
        return Err(ProxyAuth::Invalid);
    }
    Ok(creds.user)
}

/// Everything known about one front-end connection (or gRPC `Proxy` stream), for its access log.
pub(crate) struct Ctx {
    pub(crate) conn_id: ConnId,
    pub(crate) fe: Arc<FrontendRt>,
    pub(crate) peer: String,
    pub(crate) cluster: String,
    pub(crate) kind: &'static str,
    pub(crate) target: String,
    /// How the agent was chosen (the proxy strategy) and its node, once a dial succeeded.
    pub(crate) strategy: &'static str,
    pub(crate) agent: String,
    pub(crate) started: Instant,
    /// `seedgate_connections_total`, counted once per connection when it is logged.
    pub(crate) results: IntCounterVec,
}

impl Ctx {
    /// The access event of the connection's end, and its count by result (`ok` for a CONNECT
    /// answered 200 or a forward-proxy connection, else the reject reason).
    pub(crate) fn log(&self, code: u16, reason: &str, up: u64, down: u64) {
        let result = if code == 200 || self.kind == "forward" { "ok" } else { reason };
        self.results.with_label_values(&[&*self.fe.name, self.cluster.as_str(), result]).inc();
        proxy_core::access_event!(
            "connection closed", Moved::new(up, down), self.started, reason;
            conn_id = %self.conn_id,
            frontend = %self.fe.name,
            client = %self.peer,
            cluster = %self.cluster,
            kind = self.kind,
            target = %self.target,
            strategy = self.strategy,
            agent = %self.agent,
            code
        );
    }

    /// The agent a dial reached: its stream and its place in the cluster's share, with how it
    /// was chosen noted for the access event.
    pub(crate) fn dialed(&mut self, d: Dialed) -> (TunnelStream, Hold) {
        self.strategy = d.strategy.as_str();
        self.agent = d.node;
        (d.stream, d.share)
    }
}

/// A front-end stream of any kind (TCP, TLS over TCP, Unix socket), boxed so every kind of
/// front end shares one (small) relay future.
pub(crate) type BoxIo = Box<dyn Resettable>;

/// An accepted front-end connection, before any handshake.
pub(crate) enum Accepted {
    Tcp(tokio::net::TcpStream, Option<tokio_rustls::TlsAcceptor>),
    Unix(tokio::net::UnixStream),
}

/// A CONNECT that was answered 200: what the relay needs.
struct Ready {
    io: BoxIo,
    stream: TunnelStream,
    pipelined: Vec<u8>,
    ctx: Box<Ctx>,
    /// Its places in the process and cluster limits, boxed: every byte of the relay future is
    /// held by each open stream for its whole life.
    _places: Box<Places>,
}

/// What an established stream holds while it relays.
struct Places {
    /// The established connection's slot.
    _permit: ConnPermit,
    /// The stream's place in its cluster's share.
    _share: Hold,
}

/// Serve one accepted front-end connection to its end. The handshake, the request head and
/// the dial run in a boxed future that is freed before the relay, so a long-lived (mostly
/// idle) stream holds only the relay's state. `ip`: the TCP peer's address (`None` for a Unix
/// socket), which the pending budget counts by.
pub(crate) fn connection(
    shared: Arc<Shared>,
    fe: Arc<FrontendRt>,
    conn: Accepted,
    peer: String,
    ip: Option<IpAddr>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let active = Active::new(shared.metrics.conn.active.with_label_values(&[&fe.name]));
    let prepare = Box::pin(prepare(shared.clone(), fe, conn, peer, ip));
    async move {
        let _active = active;
        if let Some(r) = prepare.await {
            relay(&shared, r).await;
        }
    }
}

async fn prepare(
    shared: Arc<Shared>,
    fe: Arc<FrontendRt>,
    conn: Accepted,
    peer: String,
    ip: Option<IpAddr>,
) -> Option<Ready> {
    // Until its request head is read the connection is pending, counted by its TCP peer; a
    // Unix-socket client (the local kube-apiserver) is exempt from the per-source cap. A front
    // end of one cluster admits it for that cluster: at the cluster's share, the cluster's own
    // oldest pending connection makes room, never another cluster's.
    let tenant = fe.cluster.as_deref().map(|c| shared.directory.pending_share(c));
    let ip_or_unix = ip.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
    let admitted = match shared.pending.admit_as(ip_or_unix, ip.is_none(), tenant.as_ref()) {
        Ok(a) => a,
        Err(r) => return rejected(&shared, &fe, &Refusal::Admission(r.into())),
    };
    let share = fe.cluster.as_deref().map(|c| {
        let t = shared.directory.shares.tenant(&[c]);
        t.count_refused(Kind::Handshake, admitted.own_evicted());
        t.hold(Kind::Handshake)
    });
    let pre = Pre { admitted, share };
    match conn {
        Accepted::Unix(s) => {
            by_protocol(shared, fe, Handshaken { io: Box::new(s), peer, cert_cluster: None, pre }).await
        }
        Accepted::Tcp(tcp, None) => {
            by_protocol(shared, fe, Handshaken { io: Box::new(tcp), peer, cert_cluster: None, pre }).await
        }
        Accepted::Tcp(tcp, Some(acc)) => {
            let handshake = match pre.admitted.within(acc.accept(tcp)).await {
                Ok(h) => h,
                Err(r) => return rejected(&shared, &fe, &r.into()),
            };
            match handshake {
                Ok(s) => {
                    let cn = s
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|c| c.first())
                        .and_then(proxy_core::tls::common_name);
                    by_protocol(shared, fe, Handshaken { io: Box::new(s), peer, cert_cluster: cn, pre }).await
                }
                Err(e) => {
                    // A refused certificate is the operator's to fix; other failures (scanners,
                    // resets, a client without a certificate) stay at debug.
                    let hint = proxy_core::tls::find_rustls_error(&e)
                        .filter(|r| !matches!(r, rustls::Error::NoCertificatesPresented))
                        .and_then(|r| proxy_core::tls::certificate_hint(r, &proxy_core::tls::FRONTEND));
                    match hint {
                        Some(hint) => {
                            tracing::warn!(%peer, frontend = %fe.name, error = %e, "front-end TLS handshake failed: {hint}")
                        }
                        None => tracing::debug!(%peer, error = %e, "front-end TLS handshake failed"),
                    }
                    rejected(&shared, &fe, &Refusal::TlsHandshake)
                }
            }
        }
    }
}

/// Serve a connection by its front end's protocol: gRPC to its end, CONNECT up to the relay.
async fn by_protocol(shared: Arc<Shared>, fe: Arc<FrontendRt>, conn: Handshaken) -> Option<Ready> {
    if fe.grpc {
        grpc::serve(shared, fe, conn).await;
        return None;
    }
    serve(shared, fe, conn).await
}

/// A front-end connection after its TLS handshake (if any), still pending.
pub(crate) struct Handshaken {
    pub(crate) io: BoxIo,
    pub(crate) peer: String,
    /// The client certificate's CN.
    pub(crate) cert_cluster: Option<String>,
    pub(crate) pre: Pre,
}

/// A front-end connection before its request head is read: its place in the pending budget,
/// and in its cluster's count of pending work when its front end names the cluster.
pub(crate) struct Pre {
    pub(crate) admitted: Admitted,
    pub(crate) share: Option<Hold>,
}

/// Count a connection refused before anything about it is known but its front end (no access
/// event; nothing is answered).
pub(crate) fn rejected<T>(shared: &Shared, fe: &FrontendRt, r: &Refusal) -> Option<T> {
    shared.metrics.conn.rejects.with_label_values(&[&fe.name, r.label()]).inc();
    None
}

/// Serve one front-end connection (after TLS, if any) up to the relay. `cert_cluster` is the
/// client certificate's CN when the front end derives the cluster from it. `Some` for a CONNECT
/// that was answered 200; everything else is answered (and logged) here.
async fn serve(shared: Arc<Shared>, fe: Arc<FrontendRt>, conn: Handshaken) -> Option<Ready> {
    let Handshaken { mut io, peer, cert_cluster, pre } = conn;
    let Pre { admitted, share: pending } = pre;
    let cfg = shared.config.load_full();
    let m = &shared.metrics;
    let conn_id = shared.ids.next();
    let started = Instant::now();
    // With proxy credentials the cluster is known once the request head is read.
    let conn_cluster = fe.cluster.clone().or(cert_cluster);
    if conn_cluster.is_none() && fe.proxy_token.is_none() {
        let r = Refusal::NoClusterIdentity;
        m.conn.connections.with_label_values(&[&fe.name, "-", r.label()]).inc();
        let _ = io.write_all(&r.answer(1)).await;
        return rejected(&shared, &fe, &r);
    }
    let mut ctx = Ctx {
        conn_id,
        fe: fe.clone(),
        peer,
        cluster: conn_cluster.clone().unwrap_or_else(|| "-".into()),
        kind: "-",
        target: "-".into(),
        strategy: "-",
        agent: String::new(),
        started,
        results: m.conn.connections.clone(),
    };

    // Read the request head under what is left of the handshake deadline.
    let mut buf = Vec::with_capacity(1024);
    let read = admitted.within(read_head(&mut io, &mut buf, cfg.limits.request_head_max)).await;
    let head: RequestHead = match read.map_err(Refusal::from).and_then(|r| r) {
        Ok(h) => h,
        Err(r) => return refuse(&shared, &ctx, &mut io, None, &r).await,
    };
    // Routed (the head names where to go): from the pending budget to an established slot.
    drop(pending);
    let permit = match admitted.establish(&shared.limit).await {
        Ok(p) => p,
        Err(r) => return refuse(&shared, &ctx, &mut io, Some(head.version), &r.into()).await,
    };

    if head.is_connect() {
        ctx.kind = "connect";
        ctx.target = head.target.clone();
        let target = match head.connect_authority() {
            Ok((h, p)) if h.contains(':') => format!("[{h}]:{p}"),
            Ok((h, p)) => format!("{h}:{p}"),
            Err(e) => return refuse(&shared, &ctx, &mut io, Some(head.version), &Refusal::BadConnectTarget(e)).await,
        };
        let cluster = match (&fe.proxy_token, conn_cluster) {
            (Some(token), _) => match proxy_auth_cluster(head.header("proxy-authorization"), token) {
                Ok(c) => c,
                Err(e) => return refuse(&shared, &ctx, &mut io, Some(head.version), &Refusal::ProxyAuth(e)).await,
            },
            (None, c) => c.expect("checked above"),
        };
        ctx.cluster = cluster.clone();
        // The target, never the Host header, says where to go.
        let (stream, share) = match dial(&shared, &cluster, &target).await {
            Ok(d) => ctx.dialed(d),
            Err(e) => return refuse(&shared, &ctx, &mut io, Some(head.version), &e.into()).await,
        };
        // 200 alone in its write: the egress dialer fails if tunnel bytes follow the head.
        if io.write_all(&http_head::connect_established(head.version)).await.is_err() {
            ctx.log(200, "client_write_error", 0, 0);
            return None;
        }
        m.requests.with_label_values(&[&fe.name, "connect", "200"]).inc();
        let pipelined = buf.split_off(head.len);
        Some(Ready {
            io,
            stream,
            pipelined,
            ctx: Box::new(ctx),
            _places: Box::new(Places { _permit: permit, _share: share }),
        })
    } else if head.target.starts_with("http://") {
        ctx.kind = "forward";
        ctx.target = head.target.clone();
        drop(head);
        // Hand the connection, with the bytes already read, to an HTTP/1.1 server that
        // forwards each request through its own tunnel stream (keep-alive works as usual).
        let io = Prefixed::new(buf, io);
        forward(shared.clone(), &ctx, io).await;
        drop(permit);
        None
    } else {
        let r = Refusal::NotAProxyRequest { method: head.method.clone(), target: head.target.clone() };
        refuse(&shared, &ctx, &mut io, Some(head.version), &r).await
    }
}

/// Read a request head into `buf` (which keeps any bytes after it).
async fn read_head(io: &mut BoxIo, buf: &mut Vec<u8>, cap: usize) -> Result<RequestHead, Refusal> {
    // One reader across reads, so each read costs only its new bytes.
    let mut reader = HeadReader::new(cap);
    loop {
        if let Some(h) = reader.poll(buf).map_err(Refusal::BadHead)? {
            return Ok(h);
        }
        let old = buf.len();
        buf.resize(old + READ_CHUNK.min(cap + 1 - old), 0);
        match io.read(&mut buf[old..]).await {
            Ok(0) | Err(_) => {
                buf.truncate(old);
                return Err(Refusal::ClosedEarly);
            }
            Ok(n) => buf.truncate(old + n),
        }
    }
}

/// Refuse a front-end connection before its relay: counted by reason, answered where the
/// refusal has an answer, logged. `version`: the request head's, once it was read (then the
/// refusal answers a request, counted in `seedgate_requests_total`); before, the answer is in
/// HTTP/1.1 and no request is counted.
async fn refuse<T>(shared: &Shared, ctx: &Ctx, io: &mut BoxIo, version: Option<u8>, r: &Refusal) -> Option<T> {
    let (m, status) = (&shared.metrics, r.status());
    m.conn.rejects.with_label_values(&[&ctx.fe.name, r.label()]).inc();
    match version {
        _ if status == 0 => {}
        None => {
            let _ = io.write_all(&r.answer(1)).await;
        }
        Some(v) => {
            m.requests.with_label_values(&[&ctx.fe.name, ctx.kind, &status.to_string()]).inc();
            let _ = io.write_all(&r.answer(v)).await;
            let _ = io.shutdown().await;
        }
    }
    ctx.log(status, r.label(), 0, 0);
    None
}

/// Dial through the tunnel with the configured timeout and proxy strategies, recording metrics
/// (a refusal for the cluster's share is no dial: its caller counts it as a reject).
pub(crate) async fn dial(shared: &Shared, cluster: &str, target: &str) -> Result<Dialed, DialRefused> {
    let m = &shared.metrics;
    let started = Instant::now();
    let cfg = shared.config.load();
    let times = DialTimes { dial: cfg.timeouts.dial.get(), open: cfg.agents.open_timeout.get() };
    let r = shared.directory.dial(cluster, target, times, &cfg.agents.proxy_strategies).await;
    match &r {
        Ok(_) => {
            m.dial_seconds.with_label_values(&[cluster]).observe(started.elapsed().as_secs_f64());
            m.streams_opened.with_label_values(&[cluster]).inc();
        }
        Err(DialRefused::Dial(e)) => m.dial_failures.with_label_values(&[cluster, e.code()]).inc(),
        Err(DialRefused::Share { .. }) => {}
    }
    r
}

/// Relay a CONNECT client and its tunnel stream until both ends close, the idle timeout, a
/// drain of the cluster, or the end of the shutdown grace period.
async fn relay(shared: &Shared, r: Ready) {
    let Ready { io, mut stream, pipelined, ctx, _places } = r;
    let m = &shared.metrics;
    let _active = Active::new(m.streams_active.with_label_values(&[&ctx.cluster]));
    let replayed = pipelined.len() as u64;
    if !pipelined.is_empty() && stream.write_all(&pipelined).await.is_err() {
        ctx.log(200, "tunnel_write_error", 0, 0);
        return;
    }
    drop(pipelined);
    let meters = Meters {
        to_upstream: Some(m.tunnel_bytes.with_label_values(&[&ctx.cluster, "to_shoot"])),
        to_client: Some(m.tunnel_bytes.with_label_values(&[&ctx.cluster, "to_seed"])),
    };
    let idle = shared.config.load().timeouts.idle.get();
    let end = shared.directory.stream_end(&ctx.cluster);
    let mut t = transfer(io, stream, idle, meters);
    let stop = std::pin::pin!(proxy_core::relay::stop_on(&end, &shared.shutdown.kill, Stop::ClusterDrained));
    let done = proxy_core::relay::run(&mut t, stop).await;
    if matches!(done.outcome, Outcome::Stopped(Stop::ClusterDrained)) {
        m.stream_drains.with_label_values(&[&ctx.cluster]).inc();
    }
    ctx.log(200, done.outcome.label(), done.bytes.to_upstream + replayed, done.bytes.to_client);
}

type Body = BoxBody<Bytes, hyper::Error>;

fn simple(status: StatusCode, msg: String) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "text/plain")
        .body(Full::new(Bytes::from(msg + "\n")).map_err(|never| match never {}).boxed())
        .expect("valid response")
}

/// Hop-by-hop headers a forward proxy must not pass on (RFC 9110 §7.6.1).
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "upgrade",
];

/// Remove the hop-by-hop headers, and those the `Connection` header names, in either direction:
/// they describe one hop (client to us, or the tunnel stream to the target), not the other.
fn strip_hop_by_hop(h: &mut http::HeaderMap) {
    let named: Vec<http::HeaderName> = h
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| http::HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in named {
        h.remove(n);
    }
    for n in HOP_BY_HOP {
        h.remove(*n);
    }
}

/// How long a forwarded request's tunnel stream waits, after the answer, for the agent's end of
/// it, so the stream ends in order on both sides rather than by a reset.
const FORWARD_STREAM_LINGER: std::time::Duration = std::time::Duration::from_secs(5);

/// A forwarded request's tunnel stream, counting its bytes for the tunnel metrics and for the
/// request's access event.
struct Counted<S> {
    io: S,
    /// The stream's place in its cluster's share.
    _share: Hold,
    to_shoot: IntCounter,
    to_seed: IntCounter,
    sent: Arc<AtomicU64>,
    received: Arc<AtomicU64>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.io).poll_read(cx, buf);
        let n = (buf.filled().len() - before) as u64;
        if n > 0 {
            this.to_seed.inc_by(n);
            this.received.fetch_add(n, Ordering::Relaxed);
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write(cx, data);
        if let Poll::Ready(Ok(n)) = r {
            this.to_shoot.inc_by(n as u64);
            this.sent.fetch_add(n as u64, Ordering::Relaxed);
        }
        r
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// What the requests of one forward-proxy connection moved, for the connection's end event:
/// the bytes of their tunnel streams, and the status of the last one answered.
#[derive(Default)]
struct Forwarded {
    to_upstream: AtomicU64,
    to_client: AtomicU64,
    last_code: AtomicU16,
}

impl Forwarded {
    fn add(&self, moved: Moved, code: u16) {
        self.to_upstream.fetch_add(moved.to_upstream, Ordering::Relaxed);
        self.to_client.fetch_add(moved.to_client, Ordering::Relaxed);
        self.last_code.store(code, Ordering::Relaxed);
    }
}

/// One forwarded request: its own access event once its answer has been sent (or failed).
struct RequestLog {
    conn_id: ConnId,
    frontend: Arc<str>,
    client: Arc<str>,
    cluster: Arc<str>,
    target: String,
    code: u16,
    strategy: &'static str,
    agent: String,
    started: Instant,
    sent: Arc<AtomicU64>,
    received: Arc<AtomicU64>,
    conn: Arc<Forwarded>,
}

impl RequestLog {
    /// A request answered by us (no target reached): counted as a reject, logged now.
    fn refuse(&mut self, m: &crate::metrics::ServerMetrics, r: &Refusal) -> Response<Body> {
        let status = StatusCode::from_u16(r.status()).unwrap_or(StatusCode::BAD_GATEWAY);
        self.code = status.as_u16();
        m.requests.with_label_values(&[&self.frontend, "forward", status.as_str()]).inc();
        m.conn.rejects.with_label_values(&[&self.frontend, r.label()]).inc();
        self.emit(r.label());
        let mut answer = simple(status, r.to_string());
        if let Refusal::ProxyAuth(_) = r {
            answer
                .headers_mut()
                .insert(http::header::PROXY_AUTHENTICATE, http::HeaderValue::from_static(PROXY_CHALLENGE));
        }
        answer
    }

    /// Log the request, once, and count it into its connection's totals.
    fn emit(&self, reason: &str) {
        let moved = Moved::new(self.sent.load(Ordering::Relaxed), self.received.load(Ordering::Relaxed));
        self.conn.add(moved, self.code);
        proxy_core::access_event!(
            "request forwarded", moved, self.started, reason;
            conn_id = %self.conn_id,
            frontend = %self.frontend,
            client = %self.client,
            cluster = %self.cluster,
            kind = "forward",
            target = %self.target,
            strategy = self.strategy,
            agent = %self.agent,
            code = self.code
        );
    }
}

/// A forwarded answer's body that logs the request when it ends: sent in full (`closed`), the
/// target failing mid-body (`upstream_error`), or dropped unfinished (`client_closed`).
struct Logged {
    body: Body,
    log: Option<RequestLog>,
}

impl hyper::body::Body for Logged {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.body).poll_frame(cx);
        let end = match &r {
            Poll::Ready(None) => Some("closed"),
            Poll::Ready(Some(Err(_))) => Some("upstream_error"),
            _ => None,
        };
        if let Some(reason) = end
            && let Some(log) = this.log.take()
        {
            log.emit(reason);
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        if let Some(log) = self.log.take() {
            // An empty body may never be polled: it was sent in full with the head.
            log.emit(if hyper::body::Body::is_end_stream(&self.body) { "closed" } else { "client_closed" });
        }
    }
}

/// Serve absolute-form requests on a front-end connection: each goes through its own tunnel
/// stream and gets its own access event and count; the connection's end is logged once more.
async fn forward<S>(shared: Arc<Shared>, ctx: &Ctx, io: S)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (frontend, client, cluster): (Arc<str>, Arc<str>, Arc<str>) =
        (ctx.fe.name.clone(), Arc::from(ctx.peer.as_str()), Arc::from(ctx.cluster.as_str()));
    let conn_id = ctx.conn_id;
    let sh = shared.clone();
    let token = ctx.fe.proxy_token.clone();
    let forwarded = Arc::new(Forwarded::default());
    let totals = forwarded.clone();
    let svc = hyper::service::service_fn(move |mut req: Request<Incoming>| {
        let shared = sh.clone();
        let (frontend, client, cluster) = (frontend.clone(), client.clone(), cluster.clone());
        let conn = forwarded.clone();
        // Per request: each may name another cluster in its proxy credentials.
        let by_auth = token.as_ref().map(|t| {
            let v = req.headers().get(http::header::PROXY_AUTHORIZATION).map(|v| v.as_bytes());
            proxy_auth_cluster(v, t)
        });
        async move {
            let m = &shared.metrics;
            let mut log = RequestLog {
                conn_id,
                frontend,
                client,
                cluster,
                target: req.uri().to_string(),
                code: 0,
                strategy: "-",
                agent: String::new(),
                started: Instant::now(),
                sent: Arc::default(),
                received: Arc::default(),
                conn,
            };
            // An answer of our own (no target reached): counted as a reject, logged now.
            let refuse = |log: &mut RequestLog, r: Refusal| Ok::<_, std::convert::Infallible>(log.refuse(m, &r));
            match by_auth {
                Some(Ok(c)) => log.cluster = Arc::from(c),
                Some(Err(e)) => return refuse(&mut log, Refusal::ProxyAuth(e)),
                None => {}
            }
            let uri = req.uri().clone();
            let (Some("http"), Some(auth)) = (uri.scheme_str(), uri.authority()) else {
                return refuse(&mut log, Refusal::NotAbsoluteUri(uri.to_string()));
            };
            let target = format!("{}:{}", auth.host(), auth.port_u16().unwrap_or(80));
            let stream = match dial(&shared, &log.cluster, &target).await {
                Ok(d) => {
                    log.strategy = d.strategy.as_str();
                    log.agent = d.node.clone();
                    d
                }
                Err(e) => return refuse(&mut log, e.into()),
            };
            let stream = Counted {
                io: stream.stream,
                _share: stream.share,
                to_shoot: m.tunnel_bytes.with_label_values(&[&log.cluster, "to_shoot"]),
                to_seed: m.tunnel_bytes.with_label_values(&[&log.cluster, "to_seed"]),
                sent: log.sent.clone(),
                received: log.received.clone(),
            };
            // Origin-form towards the target; the Host header stays as the client sent it.
            let path = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
            *req.uri_mut() = path.parse().unwrap_or_else(|_| http::Uri::from_static("/"));
            strip_hop_by_hop(req.headers_mut());
            if !req.headers().contains_key(http::header::HOST)
                && let Ok(v) = http::HeaderValue::from_str(auth.as_str())
            {
                req.headers_mut().insert(http::header::HOST, v);
            }
            // One tunnel stream per request: the target closes after its answer, so the stream
            // ends in order at both ends.
            req.headers_mut().insert(http::header::CONNECTION, http::HeaderValue::from_static("close"));
            let resp = async {
                let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
                tokio::spawn(async move {
                    if let Ok(parts) = conn.without_shutdown().await {
                        let mut io = parts.io.into_inner();
                        let _ = io.shutdown().await;
                        let mut sink = [0u8; 256];
                        let drain = async { while matches!(io.read(&mut sink).await, Ok(n) if n > 0) {} };
                        let _ = tokio::time::timeout(FORWARD_STREAM_LINGER, drain).await;
                    }
                });
                sender.send_request(req).await
            }
            .await;
            match resp {
                Ok(r) => {
                    // The target's `Connection: close` ends the tunnel stream, not the client's
                    // connection, which stays open for its next request.
                    log.code = r.status().as_u16();
                    m.requests.with_label_values(&[&log.frontend, "forward", r.status().as_str()]).inc();
                    let mut r = r.map(|b| Logged { body: b.boxed(), log: Some(log) }.boxed());
                    strip_hop_by_hop(r.headers_mut());
                    Ok(r)
                }
                Err(e) => refuse(&mut log, Refusal::Target { target, error: e.to_string() }),
            }
        }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(shared.config.load().timeouts.handshake.get())
        .serve_connection(TokioIo::new(io), svc);
    // The connection (and any answer in flight, which logs itself when dropped) is gone
    // once the select is: the totals are complete.
    let reason = tokio::select! {
        r = conn => if r.is_ok() { "closed" } else { "http_error" },
        _ = shared.shutdown.kill.cancelled() => "shutdown",
    };
    let code = totals.last_code.load(Ordering::Relaxed);
    ctx.log(code, reason, totals.to_upstream.load(Ordering::Relaxed), totals.to_client.load(Ordering::Relaxed));
}

#[cfg(test)]
mod tests {
    #[test]
    fn proxy_credentials_name_the_cluster_with_the_right_token() {
        use super::{Refusal, proxy_auth_cluster};
        let label = |r: Result<String, super::ProxyAuth>| r.map_err(|e| Refusal::ProxyAuth(e).label());
        for bad in ["YQ=", "Y===", "YQ==YQ==", "YQ!=", "YQ=="] {
            let value = format!("Basic {bad}");
            assert_eq!(label(proxy_auth_cluster(Some(value.as_bytes()), "s3cret")), Err("proxy_auth_invalid"), "{bad}");
        }
        let ok = proxy_auth_cluster(Some(b"Basic c2hvb3QtYTpzM2NyZXQ="), "s3cret");
        assert_eq!(ok.as_deref(), Ok("shoot-a"));
        assert_eq!(proxy_auth_cluster(Some(b"basic  c2hvb3QtYTpzM2NyZXQ= "), "s3cret").as_deref(), Ok("shoot-a"));
        assert_eq!(label(proxy_auth_cluster(None, "s3cret")), Err("proxy_auth_missing"));
        assert_eq!(label(proxy_auth_cluster(Some(b"Basic c2hvb3QtYTpzM2NyZXQ="), "s3cre")), Err("proxy_auth_invalid"));
        assert_eq!(label(proxy_auth_cluster(Some(b"Bearer s3cret"), "s3cret")), Err("proxy_auth_invalid"));
        let r = String::from_utf8(Refusal::ProxyAuth(super::ProxyAuth::Missing).answer(1)).unwrap();
        assert!(
            r.starts_with(
                "HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=\"seedgate\"\r\n"
            ),
            "{r}"
        );
        // "a b:s3cret": not a cluster name.
        assert_eq!(label(proxy_auth_cluster(Some(b"Basic YSBiOnMzY3JldA=="), "s3cret")), Err("proxy_auth_invalid"));
    }

    #[tokio::test]
    async fn connection_future_stays_small() {
        let shared = crate::shared::test_shared();
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = tokio::net::TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let fe = std::sync::Arc::new(super::FrontendRt {
            name: "fe".into(),
            cluster: Some("c".into()),
            proxy_token: None,
            grpc: false,
        });
        let f = super::connection(shared, fe, super::Accepted::Tcp(c, None), "peer".into(), None);
        // Every byte here is held by each open tunnel stream for its whole life (the pre-relay
        // phases are boxed and freed before the relay).
        let size = std::mem::size_of_val(&f);
        eprintln!("front-end connection future: {size} bytes");
        assert!(size <= 768, "per-connection future grew to {size} bytes");
    }
}
