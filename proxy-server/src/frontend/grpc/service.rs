//! konnectivity's `ProxyService` for one gRPC connection: each `Proxy` stream's life as its own small pipeline — its `DIAL_REQ` read, a connection slot, the dial (cancelled by `DIAL_CLS`), the `DIAL_RSP` — then the relay and the access event.

use super::pb::{DialResponse, Packet, PacketType, Payload, ProxyService};
use super::relay::Relay;
use super::way_in::{OwnSlot, StreamSlot, WayIn};
use crate::frontend::refusal::Refusal;
use crate::frontend::revocation::{self, RevokedNote};
use crate::frontend::wing::Ctx;
use crate::frontend::wing::{FrontendRt, Frontends};
use crate::registry::DialRefusal;
use proxy_core::net::admission;
use proxy_core::net::guard::Active;
use proxy_core::net::share::Hold;
use proxy_core::relay::copy::Stop;
use proxy_core::tunnel::{DialError, TunnelStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};

/// `DATA` packets read from the tunnel stream and not yet taken by HTTP/2.
const OUT_QUEUE: usize = 2;

/// Connect ids of this process (positive, unique per process as konnectivity's are per server).
static CONNECT_IDS: AtomicI64 = AtomicI64::new(1);

/// The `ProxyService` of one gRPC connection.
pub(super) struct Proxy {
    pub(super) fes: Arc<Frontends>,
    pub(super) fe: Arc<FrontendRt>,
    pub(super) peer: Arc<str>,
    pub(super) cluster: Arc<str>,
    pub(super) way_in: Arc<WayIn>,
    /// Set when the connection failed because its client certificate was revoked.
    pub(super) revoked: RevokedNote,
}

/// The packets of one `Proxy` stream towards the client.
pub(crate) struct Outbound(mpsc::Receiver<Packet>);

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
        let alive = self.way_in.stream_alive();
        let slot = self.way_in.slot().await?;
        let (tx, rx) = mpsc::channel(OUT_QUEUE);
        let ctx = Ctx::new(&self.fes, self.fe.clone(), self.peer.to_string(), self.cluster.to_string(), "grpc");
        let (fes, revoked) = (self.fes.clone(), self.revoked.clone());
        // Tracked as a connection, so a drain waits for it.
        self.fes.shared.shutdown.tracker.spawn(async move {
            let _alive = alive;
            stream(&fes, ctx, req.into_inner(), tx, slot, &revoked).await
        });
        Ok(Response::new(Outbound(rx)))
    }
}

/// A dialled `Proxy` stream: what the relay needs.
struct Open {
    stream: TunnelStream,
    connect_id: i64,
    _slot: StreamSlot,
    /// Its place in the cluster's share of streams.
    _share: Hold,
}

/// One `Proxy` stream from its `DIAL_REQ` to its end: dial, relay, log. A stream reset
/// because its connection's client certificate was revoked (`revoked`) ends for that reason, as
/// a CONNECT does.
async fn stream(
    fes: &Frontends,
    mut ctx: Ctx,
    mut inbound: Streaming<Packet>,
    tx: mpsc::Sender<Packet>,
    own: Arc<OwnSlot>,
    revoked: &RevokedNote,
) {
    let Some(open) = dial(fes, &mut ctx, &mut inbound, &tx, own).await else { return };
    let shared = &fes.shared;
    let m = &shared.metrics;
    let _active = Active::new(m.streams_active.with_label_values(&[&ctx.cluster]));
    let to_shoot = m.tunnel_bytes.with_label_values(&[&ctx.cluster, "to_shoot"]);
    let to_seed = m.tunnel_bytes.with_label_values(&[&ctx.cluster, "to_seed"]);
    let r = Relay::new(open.connect_id, to_shoot, to_seed);
    let idle = shared.config.load().timeouts.idle.get();
    let end = shared.directory.stream_end(&ctx.cluster);
    let stop = proxy_core::relay::stop_on(&end, &shared.shutdown.kill, Stop::ClusterDrained);
    let reason = r.run(open.stream, &mut inbound, &tx, idle, stop).await;
    if reason == "cluster_drained" {
        m.stream_drains.with_label_values(&[&ctx.cluster]).inc();
    }
    let reason = if reason == "client_reset" && revoked.revoked() { revocation::REASON } else { reason };
    let (up, down) = r.moved();
    ctx.log(200, reason, up, down);
}

/// The `DIAL_REQ` of a `Proxy` stream: read it, take a connection slot (its connection's own,
/// `own`, when no other stream holds it), dial (cancelled by a `DIAL_CLS` or the client's end)
/// and answer with `DIAL_RSP`. `None`: the stream ended here (answered and logged).
async fn dial(
    fes: &Frontends,
    ctx: &mut Ctx,
    inbound: &mut Streaming<Packet>,
    tx: &mpsc::Sender<Packet>,
    own: Arc<OwnSlot>,
) -> Option<Open> {
    let m = &fes.shared.metrics;
    let deadline = fes.shared.config.load().timeouts.handshake.get();
    let req = match tokio::time::timeout(deadline, inbound.message()).await {
        Ok(Ok(Some(Packet { payload: Some(Payload::DialRequest(d)), .. }))) => d,
        Ok(Ok(Some(_))) => return refuse(fes, ctx, &Refusal::NotADialRequest),
        Ok(_) => return refuse(fes, ctx, &Refusal::ClosedEarly),
        Err(_) => return refuse(fes, ctx, &admission::Refusal::HandshakeTimeout.into()),
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
        refuse(fes, ctx, &r)
    };
    let target = match dial_target(&req.protocol, &req.address) {
        Ok(t) => t,
        Err(e) => return refused(DialRefusal::from(e).into()).await,
    };
    let slot = match own.lend() {
        Some(lent) => StreamSlot::Lent { _held: lent },
        None => match fes.limit.try_acquire() {
            Some(p) => StreamSlot::Own { _held: p },
            None => return refused(admission::Refusal::ConnectionLimit.into()).await,
        },
    };
    // A stream with a slot of its own does not keep its connection's alive.
    drop(own);
    let dialed = tokio::select! {
        r = fes.dial(&ctx.cluster, &target) => r,
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
            Some(Open { stream, connect_id, _slot: slot, _share: share })
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
fn refuse<T>(fes: &Frontends, ctx: &Ctx, r: &Refusal) -> Option<T> {
    let (m, code) = (&fes.shared.metrics, r.status());
    if code != 0 {
        m.requests.with_label_values(&[&ctx.fe.name, ctx.kind, &code.to_string()]).inc();
    }
    m.conn.rejects.with_label_values(&[&ctx.fe.name, r.label()]).inc();
    ctx.log(code, r.label(), 0, 0);
    None
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
