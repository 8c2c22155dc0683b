//! Front ends: HTTP CONNECT (kube-apiserver egress, Prometheus https targets) and absolute-form forward proxying (Prometheus http targets).

use crate::Shared;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use proxy_core::accept::ConnPermit;
use proxy_core::copy::{Meters, Outcome, Stop, transfer};
use proxy_core::guard::Active;
use proxy_core::ids::ConnId;
use proxy_core::io::Prefixed;
use proxy_core::pending::Admitted;
use proxy_core::relay::Abort;
use proxy_core::tunnel::{DialError, TunnelStream};
use proxy_wire::http_head::{self, HeadReader, RequestHead};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Instant;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

const READ_CHUNK: usize = 4096;

/// A running front end.
pub struct FrontendRt {
    pub name: Arc<str>,
    /// Fixed cluster, or `None` when the client certificate's CN names it.
    pub cluster: Option<String>,
}

/// Everything known about one front-end connection, for its access log.
struct Ctx {
    conn_id: ConnId,
    fe: Arc<FrontendRt>,
    peer: String,
    cluster: String,
    kind: &'static str,
    target: String,
    started: Instant,
}

impl Ctx {
    fn log(&self, code: u16, reason: &str, up: u64, down: u64) {
        tracing::info!(
            target: "access",
            conn_id = %self.conn_id,
            frontend = %self.fe.name,
            client = %self.peer,
            cluster = %self.cluster,
            kind = self.kind,
            target = %self.target,
            code,
            bytes_up = up,
            bytes_down = down,
            duration_ms = self.started.elapsed().as_secs_f64() * 1000.0,
            reason,
            "connection closed"
        );
    }
}

/// A front-end stream of any kind (TCP, TLS over TCP, Unix socket).
pub trait FrontIo: AsyncRead + AsyncWrite + Abort + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Abort + Unpin + Send> FrontIo for T {}

/// Boxed, so every kind of front end shares one (small) relay future.
type BoxIo = Box<dyn FrontIo>;

/// An accepted front-end connection, before any handshake.
pub enum Accepted {
    Tcp(tokio::net::TcpStream, Option<tokio_rustls::TlsAcceptor>),
    Unix(tokio::net::UnixStream),
}

/// A CONNECT that was answered 200: what the relay needs.
struct Ready {
    io: BoxIo,
    stream: TunnelStream,
    pipelined: Vec<u8>,
    ctx: Box<Ctx>,
    /// The established connection's slot.
    _permit: ConnPermit,
}

/// Serve one accepted front-end connection to its end. The handshake, the request head and
/// the dial run in a boxed future that is freed before the relay, so a long-lived (mostly
/// idle) stream holds only the relay's state. `ip`: the TCP peer's address (`None` for a Unix
/// socket), which the pending budget counts by.
pub fn connection(
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
    // Unix-socket client (the local kube-apiserver) is exempt from the per-source cap.
    let admitted = match shared.pending.admit(ip.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)), ip.is_none()) {
        Ok(a) => a,
        Err(_) => {
            shared.metrics.conn.rejects.with_label_values(&[&fe.name, "pending_per_source"]).inc();
            return None;
        }
    };
    match conn {
        Accepted::Unix(s) => serve(shared, fe, Box::new(s), peer, None, admitted).await,
        Accepted::Tcp(tcp, None) => serve(shared, fe, Box::new(tcp), peer, None, admitted).await,
        Accepted::Tcp(tcp, Some(acc)) => {
            let handshake = tokio::select! {
                biased;
                _ = admitted.evicted() => {
                    shared.metrics.conn.rejects.with_label_values(&[&fe.name, "pending_evicted"]).inc();
                    return None;
                }
                r = tokio::time::timeout(admitted.remaining(), acc.accept(tcp)) => r,
            };
            match handshake {
                Ok(Ok(s)) => {
                    let cn = s
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|c| c.first())
                        .and_then(proxy_core::tls::common_name);
                    serve(shared, fe, Box::new(s), peer, cn, admitted).await
                }
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "front-end TLS handshake failed");
                    shared.metrics.conn.rejects.with_label_values(&[&fe.name, "tls_handshake_failed"]).inc();
                    None
                }
                Err(_) => {
                    admitted.deadline_missed();
                    shared.metrics.conn.rejects.with_label_values(&[&fe.name, "handshake_timeout"]).inc();
                    None
                }
            }
        }
    }
}

/// Move a connection whose head was read from the pending budget to an established slot. At
/// the connection limit it waits (still pending, so still evictable) for what is left of its
/// deadline. `Err`: the reject reason.
async fn establish(shared: &Shared, admitted: Admitted) -> Result<ConnPermit, &'static str> {
    if let Some(p) = shared.limit.try_acquire() {
        return Ok(p);
    }
    tokio::select! {
        biased;
        _ = admitted.evicted() => Err("pending_evicted"),
        p = tokio::time::timeout(admitted.remaining(), shared.limit.acquire()) => p.map_err(|_| "connection_limit"),
    }
}

/// Serve one front-end connection (after TLS, if any) up to the relay. `cert_cluster` is the
/// client certificate's CN when the front end derives the cluster from it. `Some` for a CONNECT
/// that was answered 200; everything else is answered (and logged) here.
async fn serve(
    shared: Arc<Shared>,
    fe: Arc<FrontendRt>,
    mut io: BoxIo,
    peer: String,
    cert_cluster: Option<String>,
    admitted: Admitted,
) -> Option<Ready> {
    let cfg = shared.config.load_full();
    let m = &shared.metrics;
    let conn_id = shared.ids.next();
    let started = Instant::now();
    let Some(cluster) = fe.cluster.clone().or(cert_cluster) else {
        m.conn.rejects.with_label_values(&[&fe.name, "no_cluster_identity"]).inc();
        let _ = io.write_all(&http_head::error_response(1, 403, "client certificate names no cluster")).await;
        return None;
    };
    let mut ctx =
        Ctx { conn_id, fe: fe.clone(), peer, cluster: cluster.clone(), kind: "-", target: "-".into(), started };

    // Read the request head under what is left of the handshake deadline.
    let mut buf = Vec::with_capacity(1024);
    let read_head = read_head(&mut io, &mut buf, cfg.limits.request_head_max);
    let read = tokio::select! {
        biased;
        _ = admitted.evicted() => {
            m.conn.rejects.with_label_values(&[&fe.name, "pending_evicted"]).inc();
            ctx.log(0, "pending_evicted", 0, 0);
            return None;
        }
        r = tokio::time::timeout(admitted.remaining(), read_head) => r,
    };
    let head: RequestHead = match read {
        Ok(Ok(h)) => h,
        Ok(Err((reason, status, msg))) => {
            m.conn.rejects.with_label_values(&[&fe.name, reason]).inc();
            if status != 0 {
                let _ = io.write_all(&http_head::error_response(1, status, &format!("bad request: {msg}"))).await;
            }
            ctx.log(status, reason, 0, 0);
            return None;
        }
        Err(_) => {
            admitted.deadline_missed();
            m.conn.rejects.with_label_values(&[&fe.name, "handshake_timeout"]).inc();
            ctx.log(0, "handshake_timeout", 0, 0);
            return None;
        }
    };
    // Routed (the head names where to go): from the pending budget to an established slot.
    let permit = match establish(&shared, admitted).await {
        Ok(p) => p,
        Err("pending_evicted") => {
            m.conn.rejects.with_label_values(&[&fe.name, "pending_evicted"]).inc();
            ctx.log(0, "pending_evicted", 0, 0);
            return None;
        }
        Err(reason) => {
            let msg = "over capacity: connection limit reached";
            reply_error(&shared, &ctx, &mut io, head.version, 503, reason, msg).await;
            return None;
        }
    };

    if head.is_connect() {
        ctx.kind = "connect";
        ctx.target = head.target.clone();
        let target = match head.connect_authority() {
            Ok((h, p)) if h.contains(':') => format!("[{h}]:{p}"),
            Ok((h, p)) => format!("{h}:{p}"),
            Err(e) => {
                reply_error(&shared, &ctx, &mut io, head.version, 400, e.reason(), &format!("bad CONNECT target: {e}"))
                    .await;
                return None;
            }
        };
        // The target, never the Host header, says where to go.
        let stream = match dial(&shared, &cluster, &target).await {
            Ok(s) => s,
            Err(e) => {
                reply_error(&shared, &ctx, &mut io, head.version, e.http_status(), e.code(), &e.to_string()).await;
                return None;
            }
        };
        // 200 alone in its write: the egress dialer fails if tunnel bytes follow the head.
        if io.write_all(&http_head::connect_established(head.version)).await.is_err() {
            ctx.log(200, "client_write_error", 0, 0);
            return None;
        }
        m.requests.with_label_values(&[&fe.name, "connect", "200"]).inc();
        let pipelined = buf.split_off(head.len);
        Some(Ready { io, stream, pipelined, ctx: Box::new(ctx), _permit: permit })
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
        let msg = format!("{} {} is neither CONNECT nor an absolute-form http:// request", head.method, head.target);
        reply_error(&shared, &ctx, &mut io, head.version, 400, "not_a_proxy_request", &msg).await;
        None
    }
}

/// Read a request head into `buf` (which keeps any bytes after it). On failure: the reject
/// reason, the status to answer (0: none, the client is gone) and a message.
async fn read_head(io: &mut BoxIo, buf: &mut Vec<u8>, cap: usize) -> Result<RequestHead, (&'static str, u16, String)> {
    // One reader across reads, so each read costs only its new bytes.
    let mut reader = HeadReader::new(cap);
    loop {
        match reader.poll(buf) {
            Ok(Some(h)) => return Ok(h),
            Ok(None) => {}
            Err(e) => {
                let status = if matches!(e, http_head::HeadError::TooLarge) { 431 } else { 400 };
                return Err((e.reason(), status, e.to_string()));
            }
        }
        let old = buf.len();
        buf.resize(old + READ_CHUNK.min(cap + 1 - old), 0);
        match io.read(&mut buf[old..]).await {
            Ok(0) | Err(_) => {
                buf.truncate(old);
                return Err(("client_closed_early", 0, String::new()));
            }
            Ok(n) => buf.truncate(old + n),
        }
    }
}

async fn reply_error<S: AsyncWrite + Unpin>(
    shared: &Shared,
    ctx: &Ctx,
    io: &mut S,
    version: u8,
    status: u16,
    reason: &str,
    msg: &str,
) {
    let m = &shared.metrics;
    m.requests.with_label_values(&[&ctx.fe.name, ctx.kind, &status.to_string()]).inc();
    m.conn.rejects.with_label_values(&[&ctx.fe.name, reason]).inc();
    let _ = io.write_all(&http_head::error_response(version, status, msg)).await;
    let _ = io.shutdown().await;
    ctx.log(status, reason, 0, 0);
}

/// Dial through the tunnel with the configured timeout, recording metrics.
async fn dial(shared: &Shared, cluster: &str, target: &str) -> Result<TunnelStream, DialError> {
    let m = &shared.metrics;
    let started = Instant::now();
    let timeout = shared.config.load().timeouts.dial.get();
    let r = shared.registry.dial(cluster, target, timeout).await;
    match &r {
        Ok(_) => {
            m.dial_seconds.with_label_values(&[cluster]).observe(started.elapsed().as_secs_f64());
            m.streams_opened.with_label_values(&[cluster]).inc();
        }
        Err(e) => m.dial_failures.with_label_values(&[cluster, e.code()]).inc(),
    }
    r
}

/// Relay a CONNECT client and its tunnel stream until both ends close, the idle timeout, a
/// drain of the cluster, or the end of the shutdown grace period.
async fn relay(shared: &Shared, r: Ready) {
    let Ready { io, mut stream, pipelined, ctx, _permit } = r;
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
    let end = shared.registry.stream_end(&ctx.cluster);
    let mut t = transfer(io, stream, idle, meters);
    let stop = std::pin::pin!(async {
        end.cancelled().await;
        if shared.shutdown.kill.is_cancelled() { Stop::Shutdown } else { Stop::ClusterDrained }
    });
    let done = proxy_core::relay::run(&mut t, stop).await;
    if matches!(done.outcome, Outcome::Stopped(Stop::ClusterDrained)) {
        m.stream_drains.with_label_values(&[&ctx.cluster]).inc();
    }
    ctx.log(200, done.outcome.label(), done.to_upstream + replayed, done.to_client);
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

async fn forward<S>(shared: Arc<Shared>, ctx: &Ctx, io: S)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let cluster = ctx.cluster.clone();
    let fe_name = ctx.fe.name.clone();
    let sh = shared.clone();
    let svc = hyper::service::service_fn(move |mut req: Request<Incoming>| {
        let shared = sh.clone();
        let cluster = cluster.clone();
        let fe_name = fe_name.clone();
        async move {
            let code = |r: &Response<Body>| r.status().as_u16().to_string();
            let uri = req.uri().clone();
            let (Some("http"), Some(auth)) = (uri.scheme_str(), uri.authority()) else {
                let r = simple(StatusCode::BAD_REQUEST, format!("expected an absolute http:// URI, got {uri}"));
                shared.metrics.requests.with_label_values(&[&fe_name, "forward", &code(&r)]).inc();
                return Ok::<_, std::convert::Infallible>(r);
            };
            let target = format!("{}:{}", auth.host(), auth.port_u16().unwrap_or(80));
            let stream = match dial(&shared, &cluster, &target).await {
                Ok(s) => s,
                Err(e) => {
                    let r =
                        simple(StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::BAD_GATEWAY), e.to_string());
                    shared.metrics.requests.with_label_values(&[&fe_name, "forward", &code(&r)]).inc();
                    return Ok(r);
                }
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
            let resp = async {
                let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
                tokio::spawn(async move {
                    let _ = conn.await;
                });
                sender.send_request(req).await
            }
            .await;
            let r = match resp {
                Ok(r) => {
                    // The target's `Connection: close` ends the tunnel stream, not the client's
                    // connection, which stays open for its next request.
                    let mut r = r.map(|b| b.boxed());
                    strip_hop_by_hop(r.headers_mut());
                    r
                }
                Err(e) => simple(StatusCode::BAD_GATEWAY, format!("target {target}: {e}")),
            };
            shared.metrics.requests.with_label_values(&[&fe_name, "forward", &code(&r)]).inc();
            Ok(r)
        }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(shared.config.load().timeouts.handshake.get())
        .serve_connection(TokioIo::new(io), svc);
    let reason = tokio::select! {
        r = conn => if r.is_ok() { "closed" } else { "http_error" },
        _ = shared.shutdown.kill.cancelled() => "shutdown",
    };
    ctx.log(0, reason, 0, 0);
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn connection_future_stays_small() {
        let shared = crate::test_shared();
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = tokio::net::TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let fe = std::sync::Arc::new(super::FrontendRt { name: "fe".into(), cluster: Some("c".into()) });
        let f = super::connection(shared, fe, super::Accepted::Tcp(c, None), "peer".into(), None);
        // Every byte here is held by each open tunnel stream for its whole life (the pre-relay
        // phases are boxed and freed before the relay).
        let size = std::mem::size_of_val(&f);
        eprintln!("front-end connection future: {size} bytes");
        assert!(size <= 768, "per-connection future grew to {size} bytes");
    }
}
