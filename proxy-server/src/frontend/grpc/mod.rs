//! The gRPC front end, a protocol step of the pipeline: konnectivity's `ProxyService.Proxy` (kube-apiserver's `proxyProtocol: GRPC`), one tunnel stream per `Proxy` stream, the connection served to its end.
//!
//! A `Proxy` stream carries one connection: the client's first packet is a `DIAL_REQ`; the dial
//! goes through the tunnel exactly as a CONNECT's does (cluster, proxy strategies, limits,
//! metrics, access event) and is answered by a `DIAL_RSP` (a connect id, or the dial error's
//! text). Then `DATA` packets carry the bytes both ways. The client's `CLOSE_REQ` ends the
//! connection (answered by `CLOSE_RSP`); the end of the client's send side passes on as a
//! half-close; the shoot side's end is a `CLOSE_RSP`. A `DIAL_CLS` cancels the pending dial.
//! Each stream: [`service`]; its relay: [`relay`].
//!
//! A connection is admitted as a CONNECT is: pending (the pending budget, its deadline, per-source
//! and cluster caps) until its first request, the first `Proxy` stream whose headers h2 decoded
//! and tonic routed here; then it takes a connection slot (`Admitted::establish`) that it holds
//! while it lives, lent to one of its `Proxy` streams at a time ([`way_in`]): a connection holds
//! as many slots as it has streams dialled, and one while it has none.
//!
//! Flow control is HTTP/2's, end to end: a `DATA` packet is taken off the client's stream only
//! once its bytes were written to the tunnel stream, and bytes are read from the tunnel stream
//! only while the client's stream has room (a queue of two packets between them), so a slow
//! reader on either side stalls its own `Proxy` stream alone.

mod pb;
mod relay;
mod service;
mod way_in;

use super::h2_normalise::Normalised;
use super::refusal::Refusal;
use super::revocation::Noted;
use super::wing::{BoxIo, Exit, Handshaken, Pre};
use super::wing::{FrontendRt, Frontends};
use hyper::body::Incoming;
use hyper::server::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use pb::ProxyServiceServer;
use proxy_core::net::admission;
use proxy_core::relay::io::Prefixed;
use proxy_wire::http2::{Http2Error, Limits, PREFACE};
use service::Proxy;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::sync::watch;
use tonic::codegen::Service as _;
use way_in::{OwnSlot, Verdict, WayIn};

/// The HTTP/2 settings the server advertises that the request normaliser must know: given to
/// both. HTTP/2's defaults, and hyper's 16 KiB header list.
const H2_LIMITS: Limits = Limits { max_frame_size: 16_384, header_table_size: 4_096, max_header_list_size: 16_384 };
/// `Proxy` streams one gRPC connection may have open at once.
const MAX_STREAMS: u32 = 1024;
/// Bytes one `Proxy` stream may have in flight towards us unread: small beside the connection's
/// window, so a stalled stream cannot hold the whole connection's window.
const STREAM_WINDOW: u32 = 256 * 1024;
const CONNECTION_WINDOW: u32 = 16 * 1024 * 1024;
/// How long a connection refused while it was being routed may take to read its answer (a
/// gRPC status on each waiting `Proxy` stream, then GOAWAY) before it is closed.
const ANSWER_GRACE: Duration = Duration::from_secs(1);

/// The `ProxyService` as hyper serves it: tonic's server, cloned for each request.
#[derive(Clone)]
struct Routed(ProxyServiceServer<Proxy>);

type Served = <ProxyServiceServer<Proxy> as tonic::codegen::Service<http::Request<Incoming>>>::Future;

impl hyper::service::Service<http::Request<Incoming>> for Routed {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = Served;

    fn call(&self, req: http::Request<Incoming>) -> Self::Future {
        self.0.clone().call(req)
    }
}

/// One gRPC front-end connection as hyper serves it.
type Conn = http2::Connection<TokioIo<Normalised<Prefixed<Noted<BoxIo>>>>, Routed, TokioExecutor>;

/// The malformed HTTP/2 the normaliser found on a connection, once it found one.
type Failure = Arc<OnceLock<Http2Error>>;

/// Serve one front-end connection (after TLS, if any) as gRPC: pending until its first request,
/// then with a connection slot, its `Proxy` streams until the client closes it or the process
/// stops. Always an exit: served to its end, or refused (its streams answered).
pub(super) async fn serve(fes: &Arc<Frontends>, fe: &Arc<FrontendRt>, conn: Handshaken) -> Exit {
    let Handshaken { mut io, peer, cert_cluster, pre } = conn;
    let Some(cluster) = fe.cluster.clone().or(cert_cluster) else {
        let r = Refusal::NoClusterIdentity;
        fes.shared.metrics.conn.connections.with_label_values(&[&fe.name, "-", r.label()]).inc();
        return Exit::Early(r);
    };
    let mut preface = [0u8; PREFACE.len()];
    match pre.admitted.within(io.read_exact(&mut preface)).await {
        Ok(Ok(_)) if &preface == PREFACE => {}
        Ok(Ok(_)) => return Exit::Early(Refusal::NotHttp2),
        Ok(Err(_)) => return Exit::Early(Refusal::ClosedEarly),
        Err(r) => return Exit::Early(r.into()),
    }
    // A revoked client certificate fails the connection's reads and writes; hyper resets its
    // streams for it, which read the cause from the note.
    let (io, revoked) = Noted::new(io);
    let (verdict, way_in) = WayIn::new();
    let (peer, cluster) = (peer.into(), cluster.into());
    let proxy = Proxy { fes: fes.clone(), fe: fe.clone(), peer, cluster, way_in: way_in.clone(), revoked };
    // Real gRPC clients send an `:authority` hyper's HTTP/2 refuses (on a Unix socket, the
    // socket's path); the normaliser leaves such a one out (see h2_normalise).
    let io = Normalised::new(Prefixed::new(preface.to_vec(), io), H2_LIMITS);
    let failure = io.failure();
    let conn = http2_server().serve_connection(TokioIo::new(io), Routed(ProxyServiceServer::new(proxy)));
    let mut conn = std::pin::pin!(conn);
    if let Err(exit) = route(fes, fe, conn.as_mut(), &failure, pre, &way_in, &verdict).await {
        return exit;
    }
    serve_streams(fes, fe, conn, &way_in, &failure).await
}

/// hyper's HTTP/2 server as a gRPC connection is served.
fn http2_server() -> http2::Builder<TokioExecutor> {
    let mut builder = http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_STREAMS)
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .max_frame_size(H2_LIMITS.max_frame_size as u32)
        .header_table_size(H2_LIMITS.header_table_size as u32)
        .max_header_list_size(H2_LIMITS.max_header_list_size as u32);
    builder
}

/// Route the connection: pending until its first request (whatever the client sends before it
/// — a header block it never finishes, frames that open no stream — is held only within the
/// budget's deadline, and an eviction ends it; dropped unanswered, as the budget's verdicts
/// are), then from the pending budget to a connection slot, waiting for one, still evictable,
/// for what is left of the deadline. A connection refused then has its waiting streams
/// answered with the refusal, counted before they are.
async fn route(
    fes: &Frontends,
    fe: &FrontendRt,
    mut conn: Pin<&mut Conn>,
    failure: &Failure,
    pre: Pre,
    way_in: &WayIn,
    verdict: &watch::Sender<Verdict>,
) -> Result<(), Exit> {
    let Pre { admitted, share: pending } = pre;
    let first = tokio::select! {
        r = conn.as_mut() => return Err(ended_early(failure, r)),
        a = admitted.within(way_in.asked.notified()) => a,
    };
    first.map_err(|r| Exit::Early(r.into()))?;
    // Routed (the front end or the certificate named the cluster; the request is a `Proxy`
    // stream): from the pending budget to a connection slot.
    drop(pending);
    let established = tokio::select! {
        r = conn.as_mut() => return Err(ended_early(failure, r)),
        p = admitted.establish(&fes.limit) => p,
    };
    match established {
        Ok(permit) => {
            verdict.send_replace(Verdict::Established(OwnSlot::new(permit)));
            Ok(())
        }
        Err(r) => Err(refused_while_routed(fes, fe, conn, verdict, r).await),
    }
}

/// The connection found no slot at its first request: counted (before its streams hear of it),
/// then each waiting stream answered with the refusal's status, GOAWAY, closed.
async fn refused_while_routed(
    fes: &Frontends,
    fe: &FrontendRt,
    mut conn: Pin<&mut Conn>,
    verdict: &watch::Sender<Verdict>,
    r: admission::Refusal,
) -> Exit {
    tracing::debug!(frontend = %fe.name, reason = r.label(), "gRPC front-end connection refused at its first request");
    fes.rejected(fe, &r.into());
    verdict.send_replace(Verdict::Refused(r));
    if !r.aborts() {
        conn.as_mut().graceful_shutdown();
        let _ = tokio::time::timeout(ANSWER_GRACE, conn.as_mut()).await;
    }
    Exit::Served
}

/// The connection ended before its first request was routed: malformed HTTP/2 (as the
/// normaliser found it), or the client closed.
fn ended_early(failure: &Failure, r: Result<(), hyper::Error>) -> Exit {
    match failure.get() {
        Some(bad) => {
            tracing::debug!(error = %bad, "gRPC front-end connection closed before its first request: malformed HTTP/2");
            Exit::Early(Refusal::Http2Malformed)
        }
        None => {
            if let Err(e) = r {
                tracing::debug!(error = %e, "gRPC front-end connection ended before its first request");
            }
            Exit::Early(Refusal::ClosedEarly)
        }
    }
}

/// Serve the routed connection's `Proxy` streams until the client closes it, it has had none
/// for `timeouts.idle` (its slot goes back, as an idle CONNECT's does), or the process stops
/// (GOAWAY: the open streams run on until they end or the grace is over).
async fn serve_streams(
    fes: &Frontends,
    fe: &FrontendRt,
    mut conn: Pin<&mut Conn>,
    way_in: &WayIn,
    failure: &Failure,
) -> Exit {
    let shutdown = &fes.shared.shutdown;
    let idle = fes.shared.config.load().timeouts.idle.get();
    let r = tokio::select! {
        r = conn.as_mut() => r,
        () = way_in.idle_for(idle) => {
            tracing::debug!(frontend = %fe.name, ?idle, "gRPC front-end connection idle: closed");
            conn.as_mut().graceful_shutdown();
            tokio::time::timeout(ANSWER_GRACE, conn.as_mut()).await.unwrap_or(Ok(()))
        }
        _ = shutdown.stop.cancelled() => {
            conn.as_mut().graceful_shutdown();
            tokio::select! {
                r = conn.as_mut() => r,
                _ = shutdown.kill.cancelled() => Ok(()),
            }
        }
    };
    if let Some(bad) = failure.get() {
        tracing::debug!(error = %bad, "gRPC front-end connection closed: the client's HTTP/2 is malformed");
        return Exit::Early(Refusal::Http2Malformed);
    }
    if let Err(e) = r {
        tracing::debug!(error = %e, "gRPC front-end connection ended with an error");
    }
    Exit::Served
}
