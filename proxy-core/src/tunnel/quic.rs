//! The QUIC transport of the tunnel (quinn): the agent dials over UDP, the seed opens one bidirectional QUIC stream per proxied connection.
//!
//! Same roles as [`super::h2`]: the agent is the QUIC client (it dials out), the seed opens the
//! streams. TLS 1.3, ALPN `seedgate-tunnel/1` and the certificates are those of the TCP
//! transport; QUIC brings per-stream flow control, no head-of-line blocking between streams and
//! connection migration (an agent whose address changes keeps its session).
//!
//! What is QUIC's own: every stream starts with a header, and a connect stream's answer is a few
//! bytes of its own (both in `proxy_wire::tunnel::quic`); the control stream is the first stream
//! the seed opens. When the agent shuts down it writes `{"type":"going_away"}` on the control
//! stream (the GOAWAY equivalent): the seed opens no new stream on the session, streams in
//! flight continue; streams that crossed the notice are refused with `draining`. Once its last
//! stream ends the agent closes the connection with code [`CLOSE_DONE`].
//!
//! Bytes: QUIC stream data, flow control per stream (`max_stream_window`, at least `stream_window_quic`) and per connection
//! (`connection_window`); FIN is a half-close; RESET_STREAM / STOP_SENDING with [`RESET_CODE`]
//! is a reset. Liveness: QUIC keep-alive every [`TunnelSettings::ping_every`], the idle timeout is the
//! keepalive timeout; the path is quiet ([`Quiet`]) while nothing that asked for an
//! acknowledgement is acknowledged for the suspect time ([`Hearing`]).

use super::congestion::{CongestionStats, LossTolerantConfig};
use super::send_turns::{SMALL_WRITE, SendTurns};
use super::session::{
    self, Accepted, AgentTransport, ControlRecv, ControlSend, Notice, OpenError, SeedConn, SeedTransport, SessionError,
    SessionOpener,
};
use super::{
    AgentConnection, AgentHandler, AgentSession, BoxFuture, DialError, Incoming, Quiet, Responder, SeedConnection,
    TunnelSettings, TunnelStream,
};
use crate::net::guard::Active;
use crate::relay::io::Resettable;
use bytes::Bytes;
use proxy_wire::tunnel::quic::{Answer, KIND_CONNECT, KIND_CONTROL, Progress, StreamError, StreamHeader};
pub use proxy_wire::tunnel::quic::{CLOSE_DONE, CLOSE_PROTOCOL, CLOSE_STOPPED, RESET_CODE};
use quinn::{Connection, ConnectionError, RecvStream, SendStream, VarInt};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The seed side of a QUIC session.
pub type QuicOpener = SessionOpener<QuicSeed>;

/// How long the agent waits for a stream's header once the stream is open.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest control-stream chunk read at once.
const CONTROL_CHUNK: usize = 4096;

/// Streams the seed may have open on an agent's session at first. The agent doubles the
/// allowance (up to `max_streams`) whenever half of it is in use: quinn allocates the state of
/// every stream it allows the peer to open at the moment it allows it, about 280 bytes each, so
/// allowing all 16,384 from the start cost 4.4 MiB per session before any stream was opened.
const FIRST_STREAM_ALLOWANCE: u32 = 256;

/// The seed's quinn transport settings. The seed opens every stream of a session (the control
/// stream first), so the agent may open none. `stats`: where `loss_tolerant` controllers count
/// what they do.
pub fn seed_transport_config(s: &TunnelSettings, stats: Option<&CongestionStats>) -> quinn::TransportConfig {
    let mut t = transport_config(s, stats);
    t.max_concurrent_bidi_streams(VarInt::from_u32(0));
    t
}

/// The agent's quinn transport settings: the seed may open [`FIRST_STREAM_ALLOWANCE`] streams
/// at first (the session raises it as they fill).
pub fn agent_transport_config(s: &TunnelSettings, stats: Option<&CongestionStats>) -> quinn::TransportConfig {
    let mut t = transport_config(s, stats);
    t.max_concurrent_bidi_streams(VarInt::from_u32(s.max_streams.min(FIRST_STREAM_ALLOWANCE)));
    t
}

/// Every stream's window: quinn's windows are fixed for a connection's life, so every stream gets
/// the window a fast, long path needs, `max_stream_window` within [`STREAM_SHARES`] of the
/// connection window (16 MiB with the defaults: 300 Mbit/s at 300 ms), never below the
/// configured stream window. A receiver holds only what arrives unread; what a sender holds is
/// bounded for the whole connection by [`send_window`], which follows the path.
fn stream_window(s: &TunnelSettings) -> u32 {
    s.max_stream_window.min(s.connection_window / STREAM_SHARES).max(s.stream_window_quic)
}

/// A QUIC stream's window is at most this share of the connection window (16 MiB by default:
/// 300 Mbit/s at 300 ms). Its window is also what one stream may put in flight, and slow start
/// doubles what is in flight per round trip until a round trip shows the queue, a round trip
/// late: across 300 ms at 100 Mbit/s and 150 ms at 300 Mbit/s (a 50 ms bottleneck queue) it
/// puts twice the path in flight. `loss_tolerant` cuts the loss that ends it to what the path
/// carried in the last round trip, so the overshoot costs one round trip's retransmissions.
/// Four readers that stop reading with full windows are needed to stall a session.
const STREAM_SHARES: u32 = 4;

/// The least a connection's send window is: what a stream's start needs before the congestion
/// window says more (a path's first round trips), and what sixty-four streams answering an open
/// need beside bulk ones.
pub const SEND_WINDOW_FLOOR: u64 = 4 << 20;

/// How many congestion windows a connection's send window holds: one in flight, one held behind
/// a loss until its retransmission is acknowledged (quinn frees a stream's bytes only up to its
/// first hole), and one ready to go out.
const SEND_WINDOW_CWNDS: u64 = 3;

/// How often a connection's send window follows its congestion window: a few times per round
/// trip of a WAN path, and cheap (a copy of the connection's counters under its lock).
const SEND_WINDOW_EVERY: Duration = Duration::from_millis(50);

/// How long a stream may hold its turn at the send window ([`SendTurns`]) without getting a write
/// in: room frees with every acknowledgement, so a head that waits two round trips (at least
/// 100 ms) is held by its own stream's flow control.
fn turn_patience(rtt: Duration) -> Duration {
    (rtt * 2).clamp(Duration::from_millis(100), Duration::from_secs(1))
}

/// The bytes a connection may hold unacknowledged (all its streams together), for a congestion
/// window of `cwnd`: what keeps the path busy through a loss, within [`SEND_WINDOW_FLOOR`] and
/// the configured connection window `cap`. quinn lets a stream buffer up to the window its
/// peer granted, out of this send window shared first come, first served; a fixed send window
/// as large as the stream windows would let one bulk stream hold 16 MiB of a 2 MB path.
pub fn send_window(cwnd: u64, cap: u64) -> u64 {
    cwnd.saturating_mul(SEND_WINDOW_CWNDS).max(SEND_WINDOW_FLOOR).min(cap)
}

/// quinn transport settings from the tunnel's: flow-control windows, keepalive, packet size.
fn transport_config(s: &TunnelSettings, stats: Option<&CongestionStats>) -> quinn::TransportConfig {
    let mut t = quinn::TransportConfig::default();
    t.stream_receive_window(VarInt::from_u32(stream_window(s)));
    t.receive_window(VarInt::from_u32(s.connection_window));
    t.send_window(send_window(0, u64::from(s.connection_window)));
    t.max_concurrent_uni_streams(VarInt::from_u32(0));
    t.keep_alive_interval(Some(s.ping_every()));
    // A quiet path is probed at least as often as a live one is pinged: backed off without bound,
    // the next probe after an outage of some seconds is seconds away, and an open stream waits
    // that long after the path came back.
    t.max_probe_timeout(Some(s.ping_every()));
    // Neither end reads datagrams: the only ones sent are the probes of a quiet path
    // ([`watch_quiet`]), one byte each; a small window bounds what waits unread.
    t.datagram_receive_buffer_size(Some(PROBE_WINDOW));
    t.max_idle_timeout(quinn::IdleTimeout::try_from(s.keepalive_timeout).ok());
    let mut mtu = quinn::MtuDiscoveryConfig::default();
    mtu.upper_bound(MAX_UDP_PAYLOAD);
    t.mtu_discovery_config(Some(mtu));
    t.congestion_controller_factory(congestion_controller(s.congestion, stats));
    t
}

/// The controller for the configured one: quinn's, each with quinn's defaults, or ours.
fn congestion_controller(
    cc: seedgate_config::CongestionControl,
    stats: Option<&CongestionStats>,
) -> Arc<dyn quinn::congestion::ControllerFactory + Send + Sync> {
    use quinn::congestion::{BbrConfig, CubicConfig, NewRenoConfig};
    use seedgate_config::CongestionControl::*;
    match cc {
        Bbr => Arc::new(BbrConfig::default()),
        Cubic => Arc::new(CubicConfig::default()),
        NewReno => Arc::new(NewRenoConfig::default()),
        LossTolerant => Arc::new(match stats {
            Some(stats) => LossTolerantConfig::counted(stats.clone()),
            None => LossTolerantConfig::default(),
        }),
    }
}

/// Largest QUIC packet either end sends, and a server endpoint accepts. Path MTU discovery starts at 1,200 bytes and
/// searches up to this: across Ethernet it settles near 1,450, on jumbo-frame links and loopback
/// it reaches this bound, and fewer, larger packets cost less per byte at both ends (a packet
/// is one decryption, one ACK range and one trip through the UDP stack). Not higher: quinn
/// sends up to 10 packets as one GSO datagram, and 10 × 6,500 stays within the 65,507 bytes an
/// IPv4 UDP datagram can carry; a larger bound makes those sends fail as if the path lost them.
pub const MAX_UDP_PAYLOAD: u16 = 6_500;

/// UDP socket buffer for a tunnel endpoint: room for a burst of the connection window, so the
/// kernel does not drop datagrams before quinn reads them (default buffers of ~200 KiB collapse
/// QUIC throughput under bursts); 1 MiB at least, 8 MiB at most (beyond, the window is flow
/// control's job, not the socket's).
pub fn udp_buffer(s: &TunnelSettings) -> usize {
    (s.connection_window as usize).clamp(1 << 20, 8 << 20)
}

/// A server endpoint: its config, and what makes its stateless resets outlive the process
/// (`None`: keys of this process only).
pub struct Server {
    pub config: quinn::ServerConfig,
    pub stable: Option<StableKeys>,
}

/// Shortest interval between two stateless resets of a server endpoint. quinn's default (20 ms)
/// answers 50 dead connections a second: after a replica restarts in place, a thousand agents'
/// sessions would wait up to 20 s for theirs (or their keepalive timeout). A reset is always
/// smaller than the packet that caused it, so a short interval amplifies nothing.
const MIN_RESET_INTERVAL: std::time::Duration = std::time::Duration::from_millis(1);

/// The keys behind a server endpoint's connection IDs and stateless resets, derived from a
/// secret that outlives the process (e.g. the listener's private key) and the replica's id. A
/// replica restarted in place derives the same keys, so it recognises the connection IDs of its
/// killed predecessor's sessions and answers their packets with a reset their peers accept: they
/// end at once, as a TCP reset ends an h2 session, rather than at their keepalive timeout.
/// Another replica's keys differ: a packet that reaches the wrong replica is dropped, not reset.
pub struct StableKeys([u8; 32]);

impl StableKeys {
    pub fn derive(secret: &[u8], id: &str) -> Self {
        use aws_lc_rs::hmac;
        let key = hmac::Key::new(hmac::HMAC_SHA256, secret);
        let tag = hmac::sign(&key, format!("seedgate QUIC endpoint keys\0{id}").as_bytes());
        let mut out = [0u8; 32];
        out.copy_from_slice(tag.as_ref());
        Self(out)
    }

    fn endpoint_config(&self) -> quinn::EndpointConfig {
        use aws_lc_rs::hmac;
        let reset = hmac::Key::new(hmac::HMAC_SHA256, &self.0);
        let cid_tag = hmac::sign(&reset, b"connection ids");
        let mut cid_key = [0u8; 8];
        cid_key.copy_from_slice(&cid_tag.as_ref()[..8]);
        let cid_key = u64::from_le_bytes(cid_key);
        let mut c = quinn::EndpointConfig::new(Arc::new(reset));
        c.cid_generator(move || Box::new(quinn_proto::HashedConnectionIdGenerator::from_key(cid_key)));
        c
    }
}

/// A quinn endpoint on a UDP socket bound to `addr` with [`udp_buffer`] bytes of buffer (a
/// warning names `key` if the kernel caps it); a server endpoint when `server` is given.
///
/// quinn reads up to 32 datagrams at once, each into room for as many packets as the socket may
/// coalesce (64 with UDP GRO) of the largest size the endpoint accepts. With GRO, an endpoint
/// accepts packets up to [`MAX_UDP_PAYLOAD`]: that room is 13 MiB of address space, but a read
/// brings at most 64 KiB, so what bursts touch (and stays resident) is at most 2 MiB, as with
/// Ethernet-sized packets. With `settings.receive_offload` off, GRO is turned off on the socket,
/// the agent accepts quinn's 1,472-byte packets and the buffer is 47 KiB, all of it touched;
/// receiving then costs more per packet (less than half the bulk throughput into that endpoint
/// on loopback).
pub fn endpoint(
    addr: std::net::SocketAddr,
    settings: &TunnelSettings,
    server: Option<Server>,
    what: &str,
    key: &str,
) -> io::Result<quinn::Endpoint> {
    // Once per process: an agent opens an endpoint per session, and the cap does not change.
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let sock = crate::net::bind_udp(addr, udp_buffer(settings), what, key, Some(&WARNED))?;
    let (mut config, server) = match server {
        None => (quinn::EndpointConfig::default(), None),
        Some(s) => {
            let mut c = s.stable.map(|k| k.endpoint_config()).unwrap_or_default();
            c.min_reset_interval(MIN_RESET_INTERVAL);
            (c, Some(s.config))
        }
    };
    // What the endpoint accepts is what its peer may send: large packets cut the receiver's
    // per-packet work (decryption, ACK ranges, quinn's bookkeeping) several times over; the seed
    // to agent direction moved 1.6x the bytes per CPU second with them. A server endpoint (one
    // per listener) always accepts them. An agent (an endpoint per session) does when GRO is on:
    // its reads are then capped at 64 KiB by the kernel whatever the packet size, so only
    // untouched address space grows. Without GRO its room is a packet per read and it keeps
    // quinn's 1,472. The bound is within quinn's accepted range (1,200 to 65,527).
    if server.is_some() || settings.receive_offload {
        let _ = config.max_udp_payload_size(MAX_UDP_PAYLOAD);
    }
    let runtime: Arc<dyn quinn::Runtime> = Arc::new(quinn::TokioRuntime);
    let gro_off = if settings.receive_offload { None } else { Some(sock.try_clone()?) };
    // quinn turns GRO on as it wraps the socket, so it is turned off afterwards.
    let socket = runtime.wrap_udp_socket(sock)?;
    let socket: Arc<dyn quinn::AsyncUdpSocket> = match gro_off {
        None => socket,
        Some(fd) => {
            use std::os::fd::AsFd;
            crate::net::sockopt::set_udp_gro(fd.as_fd(), false)?;
            Arc::new(OnePacketReads(socket))
        }
    };
    quinn::Endpoint::new_with_abstract_socket(config, server, socket, runtime)
}

/// A UDP socket whose reads bring one packet each (GRO turned off on it), so that quinn sizes its
/// receive buffer for that.
#[derive(Debug)]
struct OnePacketReads(Arc<dyn quinn::AsyncUdpSocket>);

impl quinn::AsyncUdpSocket for OnePacketReads {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn quinn::UdpPoller>> {
        self.0.clone().create_io_poller()
    }

    fn try_send(&self, transmit: &quinn::udp::Transmit<'_>) -> io::Result<()> {
        self.0.try_send(transmit)
    }

    fn poll_recv(
        &self,
        cx: &mut Context<'_>,
        bufs: &mut [io::IoSliceMut<'_>],
        meta: &mut [quinn::udp::RecvMeta],
    ) -> Poll<io::Result<usize>> {
        self.0.poll_recv(cx, bufs, meta)
    }

    fn local_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.0.local_addr()
    }

    fn max_transmit_segments(&self) -> usize {
        self.0.max_transmit_segments()
    }

    fn max_receive_segments(&self) -> usize {
        1
    }

    fn may_fragment(&self) -> bool {
        self.0.may_fragment()
    }
}

/// Why the framing at the start of a stream could not be read.
#[derive(Debug, thiserror::Error)]
enum FramingError {
    #[error("{0}")]
    Read(#[from] quinn::ReadExactError),
    #[error("{0}")]
    Bad(#[from] StreamError),
}

/// Read what `read` frames at the start of `recv` (a stream header, an answer), exactly: the
/// stream's own bytes behind it stay unread.
async fn read_framed<T>(
    recv: &mut RecvStream,
    read: fn(&[u8]) -> Result<Progress<T>, StreamError>,
) -> Result<T, FramingError> {
    let mut buf = Vec::new();
    loop {
        match read(&buf)? {
            Progress::Done(v, _) => return Ok(v),
            Progress::More(n) => {
                let have = buf.len();
                buf.resize(have + n, 0);
                recv.read_exact(buf.get_mut(have..).unwrap_or_default()).await?;
            }
        }
    }
}

/// One QUIC stream as a byte stream. Dropped before an orderly end both ways, it resets.
pub struct QuicStream {
    send: QuicSend,
    recv: RecvStream,
    read_eof: bool,
    write_closed: bool,
    /// Bytes to send before the stream's own (the agent's answer), not yet sent.
    prefix: Vec<u8>,
}

/// One connection's [`SendTurns`], shared by its streams and its watcher.
pub type Turns = crate::sync::Mutex<SendTurns<Waker>>;

/// A QUIC stream's sending half, which writes at its connection's send window in turn
/// ([`SendTurns`]): the streams of a session and the control stream.
pub struct QuicSend {
    send: SendStream,
    /// The connection's queue for its send window, and this stream's place in it.
    turns: Arc<Turns>,
    key: u64,
}

impl QuicSend {
    fn new(send: SendStream, turns: Arc<Turns>) -> Self {
        let key = VarInt::from(send.id()).into_inner();
        Self { send, turns, key }
    }

    /// Whether a write of `len` bytes may try quinn now ([`SendTurns`]); if not, it waits its turn.
    fn poll_turn(&self, cx: &Context<'_>, len: usize) -> Poll<()> {
        let mut turns = self.turns.lock();
        if turns.may_write(self.key, len) {
            return Poll::Ready(());
        }
        turns.wait(self.key, cx.waker().clone(), Instant::now());
        Poll::Pending
    }

    /// What quinn made of a write of `len` bytes: bytes got in (the turn passes on, or bulk
    /// writes held back by a small one go on), or it found the window full (a bulk write queues
    /// for a turn; a small one holds bulk writes back until it gets in).
    fn after_write(&self, cx: &Context<'_>, len: usize, got_in: bool) {
        let mut turns = self.turns.lock();
        let next = if got_in {
            turns.wrote(self.key, Instant::now())
        } else {
            if len > SMALL_WRITE {
                turns.wait(self.key, cx.waker().clone(), Instant::now());
            } else {
                turns.wait_small(self.key, Instant::now());
            }
            None
        };
        drop(turns);
        if let Some(w) = next {
            w.wake();
        }
    }

    /// This stream writes no more: its place in the queue goes to the next.
    fn leave_turns(&self) {
        let next = self.turns.lock().left(self.key, Instant::now());
        if let Some(w) = next {
            w.wake();
        }
    }

    /// A write of `buf`, in turn.
    fn poll_send(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        std::task::ready!(self.poll_turn(cx, buf.len()));
        let polled = AsyncWrite::poll_write(Pin::new(&mut self.send), cx, buf);
        self.after_write(cx, buf.len(), polled.is_ready());
        polled
    }

    /// The whole of `buf`, in turn.
    async fn send_all(&mut self, mut buf: &[u8]) -> io::Result<()> {
        while !buf.is_empty() {
            let n = std::future::poll_fn(|cx| self.poll_send(cx, buf)).await?;
            buf = buf.get(n..).unwrap_or_default();
        }
        Ok(())
    }
}

impl Drop for QuicSend {
    fn drop(&mut self) {
        self.leave_turns();
    }
}

impl QuicStream {
    fn new(send: SendStream, recv: RecvStream, turns: Arc<Turns>) -> Self {
        Self { send: QuicSend::new(send, turns), recv, read_eof: false, write_closed: false, prefix: Vec::new() }
    }

    /// Send what is left of the prefix.
    fn poll_prefix(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.prefix.is_empty() {
            let n = std::task::ready!(self.send.poll_send(cx, &self.prefix))?;
            self.prefix.drain(..n);
        }
        Poll::Ready(Ok(()))
    }

    /// Reads nothing more: the peer is asked to stop sending, and dropping the stream after an
    /// orderly end of writing does not reset it.
    fn stop_reading(&mut self) {
        let _ = self.recv.stop(VarInt::from_u32(RESET_CODE));
        self.read_eof = true;
    }
}

impl Resettable for QuicStream {
    fn reset(&mut self) {
        let _ = self.send.send.reset(VarInt::from_u32(RESET_CODE));
        let _ = self.recv.stop(VarInt::from_u32(RESET_CODE));
        self.write_closed = true;
        self.read_eof = true;
        self.send.leave_turns();
    }

    /// quinn queues a chunk as it is (its `poll_write` copies).
    fn owned_chunk(&self) -> Option<usize> {
        Some(crate::relay::copy::BUF_SIZE)
    }

    fn poll_write_owned(&mut self, cx: &mut Context<'_>, chunk: &mut Bytes) -> Poll<io::Result<()>> {
        if self.write_closed {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        std::task::ready!(self.poll_prefix(cx))?;
        while !chunk.is_empty() {
            let len = chunk.len();
            let send = &mut self.send;
            std::task::ready!(send.poll_turn(cx, len));
            // quinn offers chunk writes as a future only; polled once here, it registers the
            // waker as its poll method would, and leaves in `bufs` what it did not take.
            let mut bufs = [std::mem::take(chunk)];
            let polled = std::pin::pin!(send.send.write_chunks(&mut bufs)).poll(cx);
            *chunk = std::mem::take(&mut bufs[0]);
            send.after_write(cx, len, polled.is_ready());
            std::task::ready!(polled).map_err(io::Error::from)?;
        }
        Poll::Ready(Ok(()))
    }

    /// The chunks quinn received, taken as they are: one packet's payload each, which the relay
    /// gathers into one vectored write (a write per chunk cost more than the copy it saved).
    fn reads_owned(&self) -> bool {
        true
    }

    fn poll_read_owned(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Bytes>> {
        if let Poll::Ready(Err(e)) = self.poll_prefix(cx) {
            return Poll::Ready(Err(e));
        }
        loop {
            // quinn offers chunk reads as a future only; polled once, as in `poll_write_owned`.
            let polled = std::pin::pin!(self.recv.read_chunk(usize::MAX, true)).poll(cx);
            match std::task::ready!(polled).map_err(io::Error::from)? {
                Some(chunk) if chunk.bytes.is_empty() => continue,
                Some(chunk) => return Poll::Ready(Ok(chunk.bytes)),
                None => {
                    self.read_eof = true;
                    return Poll::Ready(Ok(Bytes::new()));
                }
            }
        }
    }
}

impl AsyncRead for QuicStream {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if let Poll::Ready(Err(e)) = this.poll_prefix(cx) {
            return Poll::Ready(Err(e));
        }
        let before = buf.filled().len();
        let r = Pin::new(&mut this.recv).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = &r
            && buf.filled().len() == before
            && buf.remaining() > 0
        {
            this.read_eof = true;
        }
        r
    }
}

impl AsyncWrite for QuicStream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if self.write_closed {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        std::task::ready!(self.poll_prefix(cx))?;
        self.send.poll_send(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.send.send).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.write_closed {
            std::task::ready!(self.poll_prefix(cx))?;
            self.write_closed = true;
            self.send.leave_turns();
            // FIN: the half-close the far side turns into a TCP FIN.
            self.send.send.finish().map_err(|e| io::Error::new(io::ErrorKind::BrokenPipe, e))?;
        }
        Poll::Ready(Ok(()))
    }
}

impl Drop for QuicStream {
    fn drop(&mut self) {
        // quinn finishes a dropped send stream; an unfinished exchange must look like a reset.
        if !(self.write_closed && self.read_eof) {
            let _ = self.send.send.reset(VarInt::from_u32(RESET_CODE));
            let _ = self.recv.stop(VarInt::from_u32(RESET_CODE));
        }
    }
}

impl ControlSend for QuicSend {
    async fn send(&mut self, line: Vec<u8>) -> io::Result<()> {
        self.send_all(&line).await
    }
}

impl ControlRecv for RecvStream {
    async fn recv(&mut self) -> Option<Bytes> {
        Some(self.read_chunk(CONTROL_CHUNK, true).await.ok()??.bytes)
    }
}

// ---------------------------------------------------------------------------------------------
// Seed side
// ---------------------------------------------------------------------------------------------

/// The seed's end of a QUIC session: opens streams on the agent's connection.
pub struct QuicSeed {
    conn: Connection,
    quiet: Arc<Quiet>,
    turns: Arc<Turns>,
}

impl SeedTransport for QuicSeed {
    type Stream = QuicStream;
    type ControlSend = QuicSend;
    type ControlRecv = RecvStream;

    async fn open(&self, target: &str) -> Result<QuicStream, OpenError> {
        let header =
            StreamHeader::connect(target).encode().map_err(|e| DialError::BadTarget(format!("{target:.64}: {e}")))?;
        let (send, recv) = self.conn.open_bi().await.map_err(|e| DialError::Transport(e.to_string()))?;
        // Dropped unanswered (the dial gave up), the stream resets rather than ends.
        let mut stream = QuicStream::new(send, recv, self.turns.clone());
        stream.send.send_all(&header).await.map_err(|e| DialError::Transport(e.to_string()))?;
        let answer = read_framed(&mut stream.recv, Answer::read)
            .await
            .map_err(|e| DialError::Transport(format!("answer from the agent: {e}")))?;
        match answer.into_result() {
            Ok(()) => Ok(stream),
            // Only a stream that crossed the going-away notice is refused so.
            Err(DialError::Draining(why)) => Err(OpenError::GoingAway(why)),
            Err(e) => Err(e.into()),
        }
    }

    fn is_closed(&self) -> bool {
        self.conn.close_reason().is_some()
    }

    /// Datagrams received: a live agent acknowledges a stream's first packet within its ACK
    /// delay, and answers the keep-alive PINGs.
    fn heard(&self) -> u64 {
        self.conn.stats().udp_rx.datagrams
    }

    fn stop(&self) {
        self.conn.close(VarInt::from_u32(CLOSE_STOPPED), b"stopped");
    }

    fn quiet(&self) -> Option<&Quiet> {
        Some(&self.quiet)
    }
}

/// Whether what a connection sends is being acknowledged, from its counters: the path is quiet
/// once something that asks for an acknowledgement (a keep-alive PING, stream data) has gone out
/// and no acknowledgement came back for the suspect time. An acknowledgement shows as a new
/// round-trip sample (quinn takes one from every ACK that newly acknowledges an ack-eliciting
/// packet, and the smoothed RTT moves with it by the nanosecond). Datagrams or ACK frames
/// received would not do: with only the seed's direction lost, the agent's packets (and the old
/// ACK ranges they repeat) still arrive while nothing the seed sends does. Fed samples; sans-IO.
#[derive(Debug, Default)]
pub struct Hearing {
    acked: u64,
    asked: u64,
    /// The first sample that saw a request for an acknowledgement go out since the last datagram.
    waiting_since: Option<tokio::time::Instant>,
    /// The last sample saw an acknowledgement and, since the one before, more requests for one:
    /// the acknowledgement may not cover them.
    unsure: bool,
}

impl Hearing {
    /// Take a sample (`acked`: changes with every acknowledgement, the smoothed RTT in
    /// nanoseconds; `asked`: frames out that ask for one) at `now`; true while the path is quiet.
    /// `can_ask`: the caller sends a request of its own ([`Hearing::unsure`]) when the counters
    /// cannot tell whether what went out last was acknowledged; without one such frames count
    /// as acknowledged (a silence is then noticed from the next request on).
    pub fn sample(
        &mut self,
        now: tokio::time::Instant,
        acked: u64,
        asked: u64,
        suspect: Duration,
        can_ask: bool,
    ) -> bool {
        self.unsure = false;
        if acked != self.acked {
            // What went out since the last sample may be just what this acknowledgement left
            // unanswered (a dial's first packet into a path that failed a moment ago): it waits
            // from now, until the caller's request is acknowledged.
            self.unsure = can_ask && asked != self.asked;
            (self.acked, self.asked, self.waiting_since) = (acked, asked, self.unsure.then_some(now));
        } else if asked != self.asked {
            self.asked = asked;
            self.waiting_since.get_or_insert(now);
        }
        self.waiting_since.is_some_and(|t| now.duration_since(t) >= suspect)
    }

    /// The last sample could not tell whether the latest requests were acknowledged: ask for
    /// an acknowledgement (one the counters in `asked` do not count).
    pub fn unsure(&self) -> bool {
        self.unsure
    }
}

/// Frames sent that ask for an acknowledgement (those a live peer answers within its ACK delay);
/// not datagrams: the only ones sent are [`watch_quiet`]'s own requests.
fn asked(s: &quinn::ConnectionStats) -> u64 {
    let f = &s.frame_tx;
    f.ping + f.stream + f.reset_stream + f.stop_sending + f.max_data + f.max_stream_data + f.crypto
}

/// What a connection keeps of the datagrams it receives (they are never read): a few probes.
const PROBE_WINDOW: usize = 1024;

/// While the path is quiet, this often a probe asks the peer for an acknowledgement.
const PROBE_PACE: Duration = Duration::from_millis(200);

/// Tell `quiet` whether `conn`'s path is quiet ([`Hearing`]), sampled eight times per suspect
/// time (at most every 500 ms: a dial waits for the verdict, and the first thing sent into the
/// silence is seen one sample late), until the connection closes. A sample copies the
/// connection's counters under its lock: some microseconds. A one-byte datagram (ack-eliciting)
/// goes out when a sample is [`Hearing::unsure`] (on a busy connection, about one per sample),
/// and while the path is quiet every [`PROBE_PACE`], the samples following it: quinn's
/// own retransmissions back off exponentially during an outage, so without this the first
/// acknowledgement after the path heals could come seconds later; with it, within a round trip
/// and a pace. The same task keeps the connection's send window at [`send_window`] of its
/// congestion window and passes on a turn at it ([`SendTurns`]) held past [`turn_patience`].
fn watch_quiet(conn: Connection, settings: &TunnelSettings, turns: Arc<Turns>, quiet: impl Fn(bool) + Send + 'static) {
    let suspect = settings.suspect();
    let tick = (suspect / 8).clamp(Duration::from_millis(20), Duration::from_millis(500));
    let cap = u64::from(settings.connection_window);
    tokio::spawn(async move {
        let mut hearing = Hearing::default();
        let mut sent_window = send_window(0, cap);
        let mut hear_at = tokio::time::Instant::now() + tick;
        let mut busy = false;
        loop {
            // Between samples of the path: while the send window moves or streams wait for a
            // turn, every [`SEND_WINDOW_EVERY`]; an idle connection wakes only to sample.
            let at = if busy { hear_at.min(tokio::time::Instant::now() + SEND_WINDOW_EVERY) } else { hear_at };
            tokio::select! {
                _ = conn.closed() => return,
                () = tokio::time::sleep_until(at) => {}
            }
            // One copy of the counters serves the send window, the turns and the path sample.
            let s = conn.stats();
            let window = send_window(s.path.cwnd, cap);
            busy = window != sent_window;
            if busy {
                conn.set_send_window(window);
                sent_window = window;
            }
            let mut t = turns.lock();
            let expired = t.expire(Instant::now(), turn_patience(s.path.rtt));
            busy |= t.waiting() > 0;
            drop(t);
            if let Some(w) = expired {
                w.wake();
            }
            if tokio::time::Instant::now() < hear_at {
                continue;
            }
            let acked = u64::try_from(s.path.rtt.as_nanos()).unwrap_or(u64::MAX);
            // A peer that takes no datagrams would close the connection on one.
            let can_ask = conn.max_datagram_size().is_some();
            let silent = hearing.sample(tokio::time::Instant::now(), acked, asked(&s), suspect, can_ask);
            quiet(silent);
            if can_ask && (silent || hearing.unsure()) {
                let _ = conn.send_datagram(Bytes::from_static(b"p"));
            }
            hear_at = tokio::time::Instant::now() + if silent { tick.min(PROBE_PACE) } else { tick };
        }
    });
}

/// The seed's end of a session on an established QUIC connection. Opens the control stream
/// first: the agent takes the first stream as the control stream.
async fn seed_conn(conn: Connection, settings: TunnelSettings) -> Result<SeedConn<QuicSeed>, SessionError> {
    let (mut ctl_send, ctl_recv) = conn.open_bi().await.map_err(|e| SessionError::transport("QUIC connection", e))?;
    let header = StreamHeader::control().encode().map_err(|e| SessionError::Protocol(e.to_string()))?;
    ctl_send.write_all(&header).await.map_err(|e| SessionError::Protocol(format!("control stream: {e}")))?;
    let closed = conn.clone();
    let ended = async move {
        match closed.closed().await {
            ConnectionError::ApplicationClosed(c) if c.error_code == VarInt::from_u32(CLOSE_DONE) => Ok(()),
            ConnectionError::LocallyClosed => Ok(()),
            e => Err(SessionError::transport("QUIC connection", e)),
        }
    };
    let quiet = Arc::new(Quiet::default());
    let q = quiet.clone();
    let turns = Arc::new(Turns::default());
    let control = Box::pin(std::future::ready(Ok((QuicSend::new(ctl_send, turns.clone()), ctl_recv))));
    watch_quiet(conn.clone(), &settings, turns.clone(), move |silent| {
        q.set(silent);
    });
    Ok(SeedConn { transport: QuicSeed { conn, quiet, turns }, control, ended: Box::pin(ended) })
}

impl SeedConnection for Connection {
    type Transport = QuicSeed;

    fn transport(&self) -> &'static str {
        "quic"
    }

    fn alpn(&self) -> Option<Vec<u8>> {
        self.handshake_data()?.downcast::<quinn::crypto::rustls::HandshakeData>().ok()?.protocol
    }

    fn peer_certificate(&self) -> Option<rustls::pki_types::CertificateDer<'static>> {
        let certs = self.peer_identity()?.downcast::<Vec<rustls::pki_types::CertificateDer<'static>>>().ok()?;
        certs.first().cloned()
    }

    fn refuse(self, why: &'static str) {
        self.close(VarInt::from_u32(CLOSE_PROTOCOL), why.as_bytes());
    }

    fn start(self, settings: &TunnelSettings) -> impl Future<Output = Result<SeedConn<QuicSeed>, SessionError>> + Send {
        seed_conn(self, settings.clone())
    }
}

// ---------------------------------------------------------------------------------------------
// Agent side
// ---------------------------------------------------------------------------------------------

/// Answers one incoming stream on the agent.
struct QuicResponder {
    send: SendStream,
    recv: RecvStream,
    active: Active<Arc<AtomicUsize>>,
    turns: Arc<Turns>,
}

impl Responder for QuicResponder {
    fn accept(self: Box<Self>) -> Result<TunnelStream, DialError> {
        let QuicResponder { send, recv, active, turns } = *self;
        let mut stream = QuicStream::new(send, recv, turns);
        stream.prefix = Answer::Connected.encode();
        // A fresh stream has send credit for 3 bytes: queue the answer now, so the seed learns
        // of the dial at once even if the target sends nothing first. Anything left (no credit
        // on the connection) goes out on the stream's next read or write.
        let mut cx = Context::from_waker(std::task::Waker::noop());
        if let Poll::Ready(Err(e)) = stream.poll_prefix(&mut cx) {
            return Err(DialError::Transport(format!("answer to the seed: {e}")));
        }
        Ok(TunnelStream::counted(stream, active))
    }

    fn refuse(self: Box<Self>, err: &DialError) {
        let QuicResponder { send, recv, active, turns } = *self;
        let mut stream = QuicStream::new(send, recv, turns);
        let answer = Answer::refusal(err).encode();
        tokio::spawn(async move {
            if stream.send.send_all(&answer).await.is_ok() {
                let _ = tokio::io::AsyncWriteExt::shutdown(&mut stream).await;
            }
            stream.stop_reading();
            drop(active);
        });
    }
}

/// The agent's end of a QUIC session: the seed's streams after the control stream.
struct QuicAgent {
    conn: Connection,
    /// Streams accepted and not yet ended (the control stream aside).
    active: Arc<AtomicUsize>,
    turns: Arc<Turns>,
    /// Streams the seed may have open now, and at most.
    allowed: u32,
    max_streams: u32,
    /// The going-away notice went out: streams that crossed it are refused.
    draining: bool,
}

/// Read a stream's header and turn it into the dial it asks for; anything else is refused
/// (or, without a header in time, reset).
async fn incoming(
    send: SendStream,
    mut recv: RecvStream,
    active: Active<Arc<AtomicUsize>>,
    turns: Arc<Turns>,
    draining: bool,
) -> Option<Incoming> {
    let Ok(Ok(header)) = tokio::time::timeout(HEADER_TIMEOUT, read_framed(&mut recv, StreamHeader::read)).await else {
        let mut send = send;
        let _ = send.reset(VarInt::from_u32(RESET_CODE));
        return None;
    };
    let responder = Box::new(QuicResponder { send, recv, active, turns });
    if header.kind != KIND_CONNECT {
        responder.refuse(&DialError::BadTarget(format!("unexpected stream kind {}", header.kind)));
        None
    } else if draining {
        responder.refuse(&DialError::Draining("the agent is shutting down".into()));
        None
    } else {
        Some(Incoming { target: header.target, responder })
    }
}

impl QuicAgent {
    /// Double the seed's stream allowance once half of it is in use (the control stream is one
    /// of them), so that opens rarely wait for credit and idle sessions stay small.
    fn allow_more(&mut self) {
        let open = u32::try_from(self.active.load(Ordering::Relaxed)).unwrap_or(u32::MAX).saturating_add(1);
        if open >= self.allowed / 2 && self.allowed < self.max_streams {
            self.allowed = self.max_streams.min(self.allowed.saturating_mul(2));
            self.conn.set_max_concurrent_bi_streams(VarInt::from_u32(self.allowed));
        }
    }
}

impl AgentTransport for QuicAgent {
    type ControlSend = QuicSend;
    type ControlRecv = RecvStream;
    type Pending = BoxFuture<'static, Option<Incoming>>;

    async fn accept(&mut self) -> Result<Option<Accepted<Self>>, SessionError> {
        let (send, recv) = match self.conn.accept_bi().await {
            Ok(s) => s,
            Err(ConnectionError::ApplicationClosed(_) | ConnectionError::LocallyClosed) => return Ok(None),
            Err(e) => return Err(SessionError::transport("QUIC connection", e)),
        };
        let active = Active::new(self.active.clone());
        self.allow_more();
        let pending: BoxFuture<'static, _> = Box::pin(incoming(send, recv, active, self.turns.clone(), self.draining));
        Ok(Some(Accepted::Pending(pending)))
    }

    /// The notice goes on the control stream; the connection closes once the last stream ended.
    fn going_away(&mut self) -> Notice {
        self.draining = true;
        let (conn, active) = (self.conn.clone(), self.active.clone());
        tokio::spawn(async move {
            while active.load(Ordering::Relaxed) > 0 && conn.close_reason().is_none() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            conn.close(VarInt::from_u32(CLOSE_DONE), b"agent shut down");
        });
        Notice::OnControl
    }
}

/// The seed's control stream: the first stream, its header read.
async fn accept_control(conn: &Connection) -> Result<(SendStream, RecvStream), SessionError> {
    let (send, mut recv) = conn.accept_bi().await.map_err(|e| SessionError::transport("QUIC connection", e))?;
    let header = read_framed(&mut recv, StreamHeader::read)
        .await
        .map_err(|e| SessionError::Protocol(format!("stream header: {e}")))?;
    if header.kind != KIND_CONTROL {
        return Err(SessionError::Protocol(format!("first stream is of kind {}, not control", header.kind)));
    }
    Ok((send, recv))
}

/// The agent's end of a session on an established QUIC connection, until it ends
/// ([`session::run_agent`]). `stop` announces the shutdown (streams in flight may finish),
/// then the connection closes once the last stream ended.
async fn agent_session(
    conn: Connection,
    settings: &TunnelSettings,
    handler: Arc<dyn AgentHandler>,
    stop: CancellationToken,
    tracker: TaskTracker,
) -> Result<(), SessionError> {
    // The seed's control stream comes first, within the keepalive timeout.
    let timeout = settings.keepalive_timeout;
    let control = match tokio::time::timeout(timeout, accept_control(&conn)).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            if let SessionError::Protocol(_) = e {
                conn.close(VarInt::from_u32(CLOSE_PROTOCOL), b"protocol error");
            }
            return Err(e);
        }
        Err(_) => {
            conn.close(VarInt::from_u32(CLOSE_PROTOCOL), b"no control stream");
            return Err(SessionError::HandshakeTimeout { waiting_for: "control stream", timeout });
        }
    };
    let h = handler.clone();
    let turns = Arc::new(Turns::default());
    let control = (QuicSend::new(control.0, turns.clone()), control.1);
    watch_quiet(conn.clone(), settings, turns.clone(), move |silent| h.quiet(silent));
    let allowed = settings.max_streams.min(FIRST_STREAM_ALLOWANCE);
    let agent = QuicAgent {
        conn,
        active: Default::default(),
        turns,
        allowed,
        max_streams: settings.max_streams,
        draining: false,
    };
    session::run_agent(agent, Some(control), handler, stop, tracker).await
}

impl AgentConnection for Connection {
    fn run_agent(self: Box<Self>, s: AgentSession<'_>) -> BoxFuture<'_, Result<(), SessionError>> {
        Box::pin(agent_session(*self, s.settings, s.handler, s.stop, s.tracker))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_stream_window_is_max_stream_window_within_a_quarter_of_the_connection_window() {
        const MIB: u32 = 1024 * 1024;
        let d = TunnelSettings::default();
        assert_eq!((d.connection_window, d.max_stream_window), (64 * MIB, 16 * MIB));
        assert_eq!(stream_window(&d), 16 * MIB, "max_stream_window, a quarter of 64 MiB");
        let short = TunnelSettings { connection_window: 32 * MIB, ..TunnelSettings::default() };
        assert_eq!(stream_window(&short), 8 * MIB, "a quarter of the connection window");
        let big = TunnelSettings { connection_window: 2047 * MIB, ..TunnelSettings::default() };
        assert_eq!(stream_window(&big), 16 * MIB, "max_stream_window caps it");
        let small = TunnelSettings { connection_window: 2 * MIB, ..TunnelSettings::default() };
        assert_eq!(stream_window(&small), d.stream_window_quic, "never below the configured window");
    }

    #[test]
    fn the_send_window_holds_three_congestion_windows_within_the_floor_and_the_connection_window() {
        const MIB: u64 = 1024 * 1024;
        assert_eq!(send_window(0, 64 * MIB), SEND_WINDOW_FLOOR, "before the path is known");
        assert_eq!(send_window(MIB, 64 * MIB), SEND_WINDOW_FLOOR, "a short path");
        assert_eq!(send_window(2 * MIB, 64 * MIB), 6 * MIB, "150 ms at 100 Mbit/s");
        assert_eq!(send_window(12 * MIB, 64 * MIB), 36 * MIB, "300 ms at 300 Mbit/s");
        assert_eq!(send_window(40 * MIB, 64 * MIB), 64 * MIB, "the connection window caps it");
        assert_eq!(send_window(u64::MAX, 64 * MIB), 64 * MIB, "no overflow");
        assert_eq!(send_window(0, 2 * MIB), 2 * MIB, "a connection window below the floor");
    }

    /// A [`Hearing`] fed samples at milliseconds from a start, with a suspect time of 3 s.
    struct Samples {
        t0: tokio::time::Instant,
        h: Hearing,
    }

    impl Samples {
        fn new() -> Self {
            Self { t0: tokio::time::Instant::now(), h: Hearing::default() }
        }

        fn at(&mut self, ms: u64, acked: u64, asked: u64, can_ask: bool) -> bool {
            self.h.sample(self.t0 + Duration::from_millis(ms), acked, asked, Duration::from_secs(3), can_ask)
        }
    }

    /// Quiet only once something asked for an acknowledgement and none came back for the
    /// suspect time; the next acknowledgement clears it.
    #[test]
    fn a_path_is_quiet_once_an_ack_eliciting_frame_waits_the_suspect_time_unanswered() {
        let mut s = Samples::new();
        let mut sample = |ms, acked, asked| s.at(ms, acked, asked, true);
        assert!(!sample(0, 10, 5), "acknowledged");
        assert!(!sample(100, 11, 5), "the request the first sample was unsure of is acknowledged");
        assert!(!sample(5_000, 11, 5), "idle both ways is not quiet: nothing was asked");
        assert!(!sample(6_000, 11, 6), "a PING went out");
        assert!(!sample(8_000, 11, 7), "2 s unanswered");
        assert!(sample(9_000, 11, 7), "3 s since the first unanswered PING");
        assert!(sample(20_000, 11, 9), "still nothing heard");
        assert!(!sample(20_100, 12, 9), "an acknowledgement: the path is back");
        assert!(!sample(30_000, 12, 9));
        // An acknowledgement arrives in the same sample as something new goes out, then nothing:
        // what went out waits from that sample on.
        assert!(!sample(31_000, 13, 10), "acknowledged, and asked again");
        assert!(!sample(33_000, 13, 10), "2 s unanswered");
        assert!(sample(34_000, 13, 10), "3 s since it went out unanswered");
        assert!(!sample(34_100, 14, 10), "acknowledged, nothing new: the path is back");
    }

    /// The watch asks for an acknowledgement exactly when a sample cannot tell; a caller that
    /// cannot ask counts such frames as acknowledged.
    #[test]
    fn an_acknowledgement_that_may_not_cover_the_latest_requests_is_settled_by_asking() {
        let mut s = Samples::new();
        assert!(!s.at(0, 10, 5, true));
        assert!(s.h.unsure(), "acknowledged and asked since the last sample");
        assert!(!s.at(100, 11, 5, true));
        assert!(!s.h.unsure(), "acknowledged, nothing new");
        assert!(!s.at(200, 12, 6, false));
        assert!(!s.h.unsure(), "cannot ask");
        assert!(!s.at(9_000, 12, 6, false), "taken as acknowledged");
    }
}
