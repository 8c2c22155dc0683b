//! The relay of one dialled `Proxy` stream: `DATA` packets to the tunnel stream and back, a `CLOSE_REQ` or the client's end, the shoot side's end (`CLOSE_RSP`), the idle timeout; with HTTP/2's flow control end to end (a packet is taken off the client's stream only once written to the tunnel stream, and the tunnel stream is read only while the client's stream has room).

use super::pb::{CloseResponse, Data, Packet, PacketType, Payload};
use bytes::BytesMut;
use proxy_core::prometheus::IntCounter;
use proxy_core::relay::copy::Stop;
use proxy_core::tunnel::TunnelStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tonic::Streaming;

/// Largest read from a tunnel stream, so the largest `DATA` payload we send.
const READ_CHUNK: usize = 16 * 1024;
/// The first read from a tunnel stream, and the smallest.
const FIRST_READ: usize = 2 * 1024;

/// The relay of one dialled `Proxy` stream, with its byte counts.
pub(super) struct Relay {
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
    /// The relay of the stream `connect_id`, its bytes counted into `to_shoot` and `to_seed`.
    pub(super) fn new(connect_id: i64, to_shoot: IntCounter, to_seed: IntCounter) -> Self {
        let zero = || AtomicU64::new(0);
        Self { connect_id, to_shoot, to_seed, up: zero(), down: zero(), last: zero(), started: Instant::now() }
    }

    /// The bytes moved so far: to the shoot, to the client.
    pub(super) fn moved(&self) -> (u64, u64) {
        (self.up.load(Ordering::Relaxed), self.down.load(Ordering::Relaxed))
    }

    fn touch(&self) {
        self.last.store(self.started.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// Relay until one end closes, the idle timeout, or `stop`; returns the access event's reason.
    pub(super) async fn run(
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
