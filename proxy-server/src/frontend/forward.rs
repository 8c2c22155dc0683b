//! The forward-proxy front end: absolute-form `http://` requests (Prometheus' http targets), each through a tunnel stream of its own with its bytes counted, its own access event and count, and the connection's end logged once more.

use super::proxy_auth::PROXY_CHALLENGE;
use super::proxy_auth::{ProxyAuth, proxy_auth_cluster};
use super::refusal::Refusal;
use super::revocation;
use super::wing::Ctx;
use super::wing::Frontends;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper::body::{Frame, SizeHint};
use hyper_util::rt::TokioIo;
use proxy_core::net::ids::ConnId;
use proxy_core::net::share::Hold;
use proxy_core::prometheus::IntCounter;
use proxy_core::relay::access::Bytes as Moved;
use proxy_core::tunnel::TunnelStream;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Instant;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

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
pub(super) async fn forward<S>(fes: Arc<Frontends>, ctx: &Ctx, io: S)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (frontend, client, cluster): (Arc<str>, Arc<str>, Arc<str>) =
        (ctx.fe.name.clone(), Arc::from(ctx.peer.as_str()), Arc::from(ctx.cluster.as_str()));
    let conn_id = ctx.conn_id;
    let sh = fes.clone();
    let token = ctx.fe.proxy_token.clone();
    let forwarded = Arc::new(Forwarded::default());
    let totals = forwarded.clone();
    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
        let fes = sh.clone();
        let log = RequestLog {
            conn_id,
            frontend: frontend.clone(),
            client: client.clone(),
            cluster: cluster.clone(),
            target: req.uri().to_string(),
            code: 0,
            strategy: "-",
            agent: String::new(),
            started: Instant::now(),
            sent: Arc::default(),
            received: Arc::default(),
            conn: forwarded.clone(),
        };
        // Per request: each may name another cluster in its proxy credentials.
        let by_auth = token.as_ref().map(|t| {
            let v = req.headers().get(http::header::PROXY_AUTHORIZATION).map(|v| v.as_bytes());
            proxy_auth_cluster(v, t)
        });
        async move { Ok::<_, std::convert::Infallible>(request(&fes, req, log, by_auth).await) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(fes.shared.config.load().timeouts.handshake.get())
        .serve_connection(TokioIo::new(io), svc);
    // The connection (and any answer in flight, which logs itself when dropped) is gone
    // once the select is: the totals are complete.
    let reason = tokio::select! {
        r = conn => match r {
            Ok(()) => "closed",
            Err(e) if revocation::ended_by(&e) => revocation::REASON,
            Err(_) => "http_error",
        },
        _ = fes.shared.shutdown.kill.cancelled() => "shutdown",
    };
    let code = totals.last_code.load(Ordering::Relaxed);
    ctx.log(code, reason, totals.to_upstream.load(Ordering::Relaxed), totals.to_client.load(Ordering::Relaxed));
}

/// One forwarded request: its cluster (from the connection, or `by_auth`: its proxy
/// credentials), the dial, the exchange with the target; an answer of our own (no target
/// reached) is counted as a reject and logged now, the target's logs itself when its body ends.
async fn request(
    fes: &Frontends,
    mut req: Request<Incoming>,
    mut log: RequestLog,
    by_auth: Option<Result<String, ProxyAuth>>,
) -> Response<Body> {
    let m = &fes.shared.metrics;
    match by_auth {
        Some(Ok(c)) => log.cluster = Arc::from(c),
        Some(Err(e)) => return log.refuse(m, &Refusal::ProxyAuth(e)),
        None => {}
    }
    let uri = req.uri().clone();
    let (Some("http"), Some(auth)) = (uri.scheme_str(), uri.authority()) else {
        return log.refuse(m, &Refusal::NotAbsoluteUri(uri.to_string()));
    };
    let target = format!("{}:{}", auth.host(), auth.port_u16().unwrap_or(80));
    let dialed = match fes.dial(&log.cluster, &target).await {
        Ok(d) => d,
        Err(e) => return log.refuse(m, &e.into()),
    };
    (log.strategy, log.agent) = (dialed.strategy.as_str(), dialed.node);
    let stream = Counted {
        io: dialed.stream,
        _share: dialed.share,
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
    // One tunnel stream per request: the target closes after its answer, so the stream ends in
    // order at both ends.
    req.headers_mut().insert(http::header::CONNECTION, http::HeaderValue::from_static("close"));
    match exchange(stream, req).await {
        Ok(r) => {
            // The target's `Connection: close` ends the tunnel stream, not the client's
            // connection, which stays open for its next request.
            log.code = r.status().as_u16();
            m.requests.with_label_values(&[&log.frontend, "forward", r.status().as_str()]).inc();
            let mut r = r.map(|b| Logged { body: b.boxed(), log: Some(log) }.boxed());
            strip_hop_by_hop(r.headers_mut());
            r
        }
        Err(e) => log.refuse(m, &Refusal::Target { target, error: e.to_string() }),
    }
}

/// Send `req` over `stream` (HTTP/1.1) and return the target's answer. The stream's end is
/// driven in a task of its own: shut after the answer, then drained for a while so the agent's
/// end closes in order.
async fn exchange(stream: Counted<TunnelStream>, req: Request<Incoming>) -> hyper::Result<Response<Incoming>> {
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
