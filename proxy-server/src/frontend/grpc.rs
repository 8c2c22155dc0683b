//! The gRPC front end: konnectivity's `ProxyService.Proxy` (kube-apiserver's `proxyProtocol: GRPC`), one tunnel stream per `Proxy` stream.
//!
//! A `Proxy` stream carries one connection: the client's first packet is a `DIAL_REQ`; the dial
//! goes through the tunnel exactly as a CONNECT's does (cluster, proxy strategies, limits,
//! metrics, access event) and is answered by a `DIAL_RSP` (a connect id, or the dial error's
//! text). Then `DATA` packets carry the bytes both ways. The client's `CLOSE_REQ` ends the
//! connection (answered by `CLOSE_RSP`); the end of the client's send side passes on as a
//! half-close; the shoot side's end is a `CLOSE_RSP`. A `DIAL_CLS` cancels the pending dial.
//!
//! Flow control is HTTP/2's, end to end: a `DATA` packet is taken off the client's stream only
//! once its bytes were written to the tunnel stream, and bytes are read from the tunnel stream
//! only while the client's stream has room (a queue of [`OUT_QUEUE`] packets between them), so a
//! slow reader on either side stalls its own `Proxy` stream alone.

use super::admission::{Handshaken, Pre};
use super::h2_normalise::Normalised;
use super::{Ctx, FrontendRt, Refusal, rejected};
use crate::registry::DialRefused;
use crate::shared::Shared;
use bytes::BytesMut;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use proxy_core::net::accept::ConnPermit;
use proxy_core::net::admission;
use proxy_core::net::guard::Active;
use proxy_core::net::share::Hold;
use proxy_core::prometheus::IntCounter;
use proxy_core::relay::copy::Stop;
use proxy_core::relay::io::Prefixed;
use proxy_core::tunnel::{DialError, TunnelStream};
use proxy_wire::http2::{Limits, PREFACE};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tonic::codegen::Service as _;
use tonic::{Request, Response, Status, Streaming};

#[allow(clippy::all, clippy::pedantic, missing_docs, rust_2018_idioms, unreachable_pub)]
mod pb {
    tonic::include_proto!("_");
}

use pb::packet::Payload;
use pb::proxy_service_server::{ProxyService, ProxyServiceServer};
use pb::{CloseResponse, Data, DialResponse, Packet, PacketType};

/// The HTTP/2 settings the server advertises that the request normaliser must know: given to
/// both. HTTP/2's defaults, and hyper's 16 KiB header list.
const H2_LIMITS: Limits = Limits { max_frame_size: 16_384, header_table_size: 4_096, max_header_list_size: 16_384 };
/// `Proxy` streams one gRPC connection may have open at once.
pub(super) const MAX_STREAMS: u32 = 1024;
/// Bytes one `Proxy` stream may have in flight towards us unread: small beside the connection's
/// window, so a stalled stream cannot hold the whole connection's window.
const STREAM_WINDOW: u32 = 256 * 1024;
const CONNECTION_WINDOW: u32 = 16 * 1024 * 1024;
/// Largest read from a tunnel stream, so the largest `DATA` payload we send.
const READ_CHUNK: usize = 16 * 1024;
/// The first read from a tunnel stream, and the smallest.
const FIRST_READ: usize = 2 * 1024;
/// `DATA` packets read from the tunnel stream and not yet taken by HTTP/2.
const OUT_QUEUE: usize = 2;

/// First size of a `Proxy` stream's encode and decode buffers: tonic's default (8 KiB each) is
/// most of what an idle stream holds; they grow for larger packets.
const CODEC_BUFFER: usize = 1024;
/// Encoded bytes a stream gathers before handing them to HTTP/2 (tonic's default).
const CODEC_YIELD: usize = 32 * 1024;

/// prost's codec for `Packet`s with [`CODEC_BUFFER`]-sized first buffers.
#[derive(Debug, Default)]
pub(super) struct Codec;

impl tonic::codec::Codec for Codec {
    type Encode = Packet;
    type Decode = Packet;
    type Encoder = tonic_prost::ProstEncoder<Packet>;
    type Decoder = tonic_prost::ProstDecoder<Packet>;

    fn encoder(&mut self) -> Self::Encoder {
        tonic_prost::ProstEncoder::new(tonic::codec::BufferSettings::new(CODEC_BUFFER, CODEC_YIELD))
    }

    fn decoder(&mut self) -> Self::Decoder {
        tonic_prost::ProstDecoder::new(tonic::codec::BufferSettings::new(CODEC_BUFFER, CODEC_YIELD))
    }
}

/// Connect ids of this process (positive, unique per process as konnectivity's are per server).
static CONNECT_IDS: AtomicI64 = AtomicI64::new(1);

/// Serve one front-end connection (after TLS, if any) as gRPC: pending until its HTTP/2
/// preface arrived, then its `Proxy` streams until the client closes it or the process stops.
pub(crate) async fn serve(shared: Arc<Shared>, fe: Arc<FrontendRt>, conn: Handshaken) {
    let Handshaken { mut io, peer, cert_cluster, pre } = conn;
    let Pre { admitted, share: pending } = pre;
    let reject = |r: Refusal| {
        rejected::<()>(&shared, &fe, &r);
    };
    let Some(cluster) = fe.cluster.clone().or(cert_cluster) else {
        let r = Refusal::NoClusterIdentity;
        shared.metrics.conn.connections.with_label_values(&[&fe.name, "-", r.label()]).inc();
        return reject(r);
    };
    let mut preface = [0u8; PREFACE.len()];
    match admitted.within(io.read_exact(&mut preface)).await {
        Ok(Ok(_)) if &preface == PREFACE => {}
        Ok(Ok(_)) => return reject(Refusal::NotHttp2),
        Ok(Err(_)) => return reject(Refusal::ClosedEarly),
        Err(r) => return reject(r.into()),
    }
    // Out of the pending budget (and its cluster's pending work): each `Proxy` stream takes a
    // connection slot and a place in its cluster's share of streams of its own.
    drop(pending);
    if let Err(r) = admitted.leave() {
        return reject(r.into());
    }
    let proxy = Proxy { shared: shared.clone(), fe: fe.clone(), peer: peer.into(), cluster: cluster.into() };
    let svc = ProxyServiceServer::new(proxy);
    let svc = hyper::service::service_fn(move |req| svc.clone().call(req));
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_STREAMS)
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .max_frame_size(H2_LIMITS.max_frame_size as u32)
        .header_table_size(H2_LIMITS.header_table_size as u32)
        .max_header_list_size(H2_LIMITS.max_header_list_size as u32);
    // Real gRPC clients send an `:authority` hyper's HTTP/2 refuses (on a Unix socket, the
    // socket's path); the normaliser leaves such a one out (see h2_normalise).
    let io = Normalised::new(Prefixed::new(preface.to_vec(), io), H2_LIMITS);
    let failure = io.failure();
    let conn = builder.serve_connection(TokioIo::new(io), svc);
    let mut conn = std::pin::pin!(conn);
    let r = tokio::select! {
        r = conn.as_mut() => r,
        _ = shared.shutdown.stop.cancelled() => {
            // GOAWAY: no new streams; the open ones run on until they end or the grace is over.
            conn.as_mut().graceful_shutdown();
            tokio::select! {
                r = conn.as_mut() => r,
                _ = shared.shutdown.kill.cancelled() => Ok(()),
            }
        }
    };
    if let Some(bad) = failure.get() {
        reject(Refusal::Http2Malformed);
        tracing::debug!(error = %bad, "gRPC front-end connection closed: the client's HTTP/2 is malformed");
    } else if let Err(e) = r {
        tracing::debug!(error = %e, "gRPC front-end connection ended with an error");
    }
}

/// The `ProxyService` of one gRPC connection.
struct Proxy {
    shared: Arc<Shared>,
    fe: Arc<FrontendRt>,
    peer: Arc<str>,
    cluster: Arc<str>,
}

/// The packets of one `Proxy` stream towards the client.
pub(super) struct Outbound(mpsc::Receiver<Packet>);

impl futures_util::Stream for Outbound {
    type Item = Result<Packet, Status>;
    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.0.poll_recv(cx).map(|p| p.map(Ok))
    }
}

#[tonic::async_trait]
impl ProxyService for Proxy {
    type ProxyStream = Outbound;

    async fn proxy(&self, req: Request<Streaming<Packet>>) -> Result<Response<Outbound>, Status> {
        let (tx, rx) = mpsc::channel(OUT_QUEUE);
        let ctx = Ctx {
            conn_id: self.shared.ids.next(),
            fe: self.fe.clone(),
            peer: self.peer.to_string(),
            cluster: self.cluster.to_string(),
            kind: "grpc",
            target: "-".into(),
            strategy: "-",
            agent: String::new(),
            started: Instant::now(),
            results: self.shared.metrics.conn.connections.clone(),
            session: None,
        };
        let shared = self.shared.clone();
        // Tracked as a connection, so a drain waits for it.
        self.shared.shutdown.tracker.spawn(async move { stream(&shared, ctx, req.into_inner(), tx).await });
        Ok(Response::new(Outbound(rx)))
    }
}

/// A dialled `Proxy` stream: what the relay needs.
struct Open {
    stream: TunnelStream,
    connect_id: i64,
    _permit: ConnPermit,
    /// Its place in the cluster's share of streams.
    _share: Hold,
}

/// One `Proxy` stream from its `DIAL_REQ` to its end.
async fn stream(shared: &Shared, mut ctx: Ctx, mut inbound: Streaming<Packet>, tx: mpsc::Sender<Packet>) {
    let Some(open) = dial(shared, &mut ctx, &mut inbound, &tx).await else { return };
    let m = &shared.metrics;
    let _active = Active::new(m.streams_active.with_label_values(&[&ctx.cluster]));
    let r = Relay {
        connect_id: open.connect_id,
        to_shoot: m.tunnel_bytes.with_label_values(&[&ctx.cluster, "to_shoot"]),
        to_seed: m.tunnel_bytes.with_label_values(&[&ctx.cluster, "to_seed"]),
        up: AtomicU64::new(0),
        down: AtomicU64::new(0),
        last: AtomicU64::new(0),
        started: Instant::now(),
    };
    let idle = shared.config.load().timeouts.idle.get();
    let end = shared.directory.stream_end(&ctx.cluster);
    let stop = proxy_core::relay::stop_on(&end, &shared.shutdown.kill, Stop::ClusterDrained);
    let reason = r.run(open.stream, &mut inbound, &tx, idle, stop).await;
    if reason == "cluster_drained" {
        m.stream_drains.with_label_values(&[&ctx.cluster]).inc();
    }
    ctx.log(200, reason, r.up.load(Ordering::Relaxed), r.down.load(Ordering::Relaxed));
}

/// The `DIAL_REQ` of a `Proxy` stream: read it, take a connection slot, dial (cancelled by a
/// `DIAL_CLS` or the client's end) and answer with `DIAL_RSP`. `None`: the stream ended here
/// (answered and logged).
async fn dial(
    shared: &Shared,
    ctx: &mut Ctx,
    inbound: &mut Streaming<Packet>,
    tx: &mpsc::Sender<Packet>,
) -> Option<Open> {
    let m = &shared.metrics;
    let deadline = shared.config.load().timeouts.handshake.get();
    let req = match tokio::time::timeout(deadline, inbound.message()).await {
        Ok(Ok(Some(Packet { payload: Some(Payload::DialRequest(d)), .. }))) => d,
        Ok(Ok(Some(_))) => return refuse(shared, ctx, &Refusal::NotADialRequest),
        Ok(_) => return refuse(shared, ctx, &Refusal::ClosedEarly),
        Err(_) => return refuse(shared, ctx, &admission::Refusal::HandshakeTimeout.into()),
    };
    ctx.target = req.address.clone();
    let answer = |error: String, connect_id: i64| Packet {
        r#type: PacketType::DialRsp.into(),
        payload: Some(Payload::DialResponse(DialResponse {
            error,
            connect_id,
            random: req.random,
            ..Default::default()
        })),
    };
    // Refused with its text in the `DIAL_RSP`.
    let refused = async |r: Refusal| {
        let _ = tx.send(answer(r.to_string(), 0)).await;
        refuse(shared, ctx, &r)
    };
    let target = match dial_target(&req.protocol, &req.address) {
        Ok(t) => t,
        Err(e) => return refused(DialRefused::from(e).into()).await,
    };
    let Some(permit) = shared.limit.try_acquire() else {
        return refused(admission::Refusal::ConnectionLimit.into()).await;
    };
    let dialed = tokio::select! {
        r = super::dial(shared, &ctx.cluster, &target) => r,
        _ = cancelled(inbound) => {
            // The client gave up on the dial: nothing is answered.
            m.requests.with_label_values(&[&ctx.fe.name, ctx.kind, "499"]).inc();
            ctx.log(499, "dial_cancelled", 0, 0);
            return None;
        }
    };
    match dialed {
        Ok(d) => {
            let (stream, share) = ctx.dialed(d);
            let connect_id = CONNECT_IDS.fetch_add(1, Ordering::Relaxed);
            if tx.send(answer(String::new(), connect_id)).await.is_err() {
                ctx.log(200, "client_closed_early", 0, 0);
                return None;
            }
            m.requests.with_label_values(&[&ctx.fe.name, ctx.kind, "200"]).inc();
            Some(Open { stream, connect_id, _permit: permit, _share: share })
        }
        Err(e) => refused(e.into()).await,
    }
}

/// Until the client cancels a pending dial: `DIAL_CLS`, the end of its stream, or a packet that
/// has no place before the dial's answer.
async fn cancelled(inbound: &mut Streaming<Packet>) {
    loop {
        match inbound.message().await {
            Ok(Some(Packet { payload: Some(Payload::CloseDial(_)), .. })) | Ok(None) | Err(_) => return,
            // Anything else before `DIAL_RSP` is ignored, as konnectivity does.
            Ok(Some(_)) => {}
        }
    }
}

/// `host:port` for the tunnel from a `DIAL_REQ`'s protocol and address.
fn dial_target(protocol: &str, address: &str) -> Result<String, DialError> {
    if !protocol.is_empty() && protocol != "tcp" {
        return Err(DialError::BadTarget(format!("protocol {protocol:?} is not supported; only tcp")));
    }
    match address.rsplit_once(':') {
        Some((h, p)) if !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p != 0) => Ok(address.to_owned()),
        _ => Err(DialError::BadTarget(format!("{address:?} is not host:port"))),
    }
}

/// Count and log a `Proxy` stream that ends before its relay.
fn refuse<T>(shared: &Shared, ctx: &Ctx, r: &Refusal) -> Option<T> {
    let (m, code) = (&shared.metrics, r.status());
    if code != 0 {
        m.requests.with_label_values(&[&ctx.fe.name, ctx.kind, &code.to_string()]).inc();
    }
    m.conn.rejects.with_label_values(&[&ctx.fe.name, r.label()]).inc();
    ctx.log(code, r.label(), 0, 0);
    None
}

/// The relay of one dialled `Proxy` stream, with its byte counts.
struct Relay {
    connect_id: i64,
    to_shoot: IntCounter,
    to_seed: IntCounter,
    up: AtomicU64,
    down: AtomicU64,
    /// Milliseconds since `started` when a byte last moved (the idle timeout).
    last: AtomicU64,
    started: Instant,
}

/// How the client's side of a relay ended.
enum Up {
    /// `CLOSE_REQ`: the whole connection ends.
    Close,
    /// The client's send side ended (half-close): passed on, the shoot may still answer.
    HalfClosed,
    /// The stream failed or was reset.
    Gone,
    TunnelError,
}

impl Relay {
    fn touch(&self) {
        self.last.store(self.started.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// Relay until one end closes, the idle timeout, or `stop`; returns the access event's reason.
    async fn run(
        &self,
        stream: TunnelStream,
        inbound: &mut Streaming<Packet>,
        tx: &mpsc::Sender<Packet>,
        idle: Duration,
        stop: impl Future<Output = Stop>,
    ) -> &'static str {
        let (rd, wr) = tokio::io::split(stream);
        let mut up = std::pin::pin!(self.up(inbound, wr));
        let mut down = std::pin::pin!(self.down(rd, tx));
        let mut stop = std::pin::pin!(stop);
        let mut up_open = true;
        let reason = loop {
            tokio::select! {
                u = &mut up, if up_open => match u {
                    Up::HalfClosed => up_open = false,
                    Up::Close => break "client_close",
                    Up::Gone => return "client_reset",
                    Up::TunnelError => break "upstream_error",
                },
                d = &mut down => break d,
                s = &mut stop => break proxy_core::relay::copy::Outcome::Stopped(s).label(),
                _ = self.idle(idle) => break "idle_timeout",
            }
        };
        // The connection is over: tell the client, after the data queued before, and end the
        // stream (a client that stopped reading gets no more than the idle timeout).
        let close = CloseResponse { connect_id: self.connect_id, error: String::new() };
        let packet = Packet { r#type: PacketType::CloseRsp.into(), payload: Some(Payload::CloseResponse(close)) };
        tokio::select! {
            _ = tx.send(packet) => {}
            _ = &mut stop => {}
            _ = tokio::time::sleep(idle) => {}
        }
        reason
    }

    /// Client to shoot: `DATA` written to the tunnel stream, until `CLOSE_REQ` or the client's end.
    async fn up(&self, inbound: &mut Streaming<Packet>, mut wr: tokio::io::WriteHalf<TunnelStream>) -> Up {
        loop {
            match inbound.message().await {
                Ok(Some(Packet { payload: Some(Payload::Data(d)), .. })) => {
                    if wr.write_all(&d.data).await.is_err() {
                        return Up::TunnelError;
                    }
                    let n = d.data.len() as u64;
                    self.up.fetch_add(n, Ordering::Relaxed);
                    self.to_shoot.inc_by(n);
                    self.touch();
                }
                Ok(Some(Packet { payload: Some(Payload::CloseRequest(_)), .. })) => {
                    let _ = wr.shutdown().await;
                    return Up::Close;
                }
                // DIAL_CLS after the answer, stray packets: nothing to do.
                Ok(Some(_)) => {}
                Ok(None) => {
                    let _ = wr.shutdown().await;
                    return Up::HalfClosed;
                }
                Err(_) => return Up::Gone,
            }
        }
    }

    /// Shoot to client: the tunnel stream's bytes as `DATA`, until its end. Returns the reason.
    async fn down(&self, mut rd: tokio::io::ReadHalf<TunnelStream>, tx: &mpsc::Sender<Packet>) -> &'static str {
        let mut buf = BytesMut::new();
        // Small while the stream is quiet (an idle `kubectl logs -f` holds this), doubling up to
        // READ_CHUNK while reads fill it.
        let mut want = FIRST_READ;
        loop {
            // Reuses the last chunk's memory once HTTP/2 has sent it.
            buf.reserve(want);
            match rd.read_buf(&mut buf).await {
                Ok(0) => return "closed",
                Ok(n) => {
                    want = if n >= want { (want * 2).min(READ_CHUNK) } else { FIRST_READ.max(want / 2) };
                    self.down.fetch_add(n as u64, Ordering::Relaxed);
                    self.to_seed.inc_by(n as u64);
                    self.touch();
                    let data = Data { connect_id: self.connect_id, error: String::new(), data: buf.split().freeze() };
                    let packet = Packet { r#type: PacketType::Data.into(), payload: Some(Payload::Data(data)) };
                    if tx.send(packet).await.is_err() {
                        return "client_reset";
                    }
                }
                Err(_) => return "upstream_error",
            }
        }
    }

    /// Completes once no byte moved either way for `idle`.
    async fn idle(&self, idle: Duration) {
        loop {
            let last = Duration::from_millis(self.last.load(Ordering::Relaxed));
            let due = last + idle;
            let now = self.started.elapsed();
            if now >= due {
                return;
            }
            tokio::time::sleep(due - now).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dial_targets() {
        assert_eq!(dial_target("tcp", "10.0.0.1:10250").ok().as_deref(), Some("10.0.0.1:10250"));
        assert_eq!(dial_target("", "[fd00::1]:443").ok().as_deref(), Some("[fd00::1]:443"));
        assert!(matches!(dial_target("udp", "a:1"), Err(DialError::BadTarget(_))));
        for bad in ["a", "a:", ":1", "a:0", "a:65536", "a:x"] {
            assert!(dial_target("tcp", bad).is_err(), "{bad}");
        }
    }
}
