//! The reverse tunnel between proxy-server (seed) and proxy-agent (shoot): transport-neutral types, the session seam, and the transports.
//!
//! The agent always dials out. Over its session the roles are reversed: the seed side opens one
//! stream per proxied connection, the agent accepts them. Dial and front-end code only see
//! [`Opener`], [`Incoming`] and [`TunnelStream`]. Below them each side runs one session loop
//! ([`session`]) over whichever transport carries it: HTTP/2 over TLS ([`h2`]) or QUIC
//! ([`quic`]); a transport implements the seam of [`session`] and nothing else. The protocol's
//! own messages and codes (control lines, dial errors, QUIC's stream framing) are sans-IO, in
//! `proxy_wire::tunnel`.
//!
//! The seam's types live here and the session and both transports use them, so this module names
//! none of its children (a file that re-exported theirs would depend on files that depend on it):
//! a session of either transport starts from [`session`] (`run_seed_session`, `run_agent_session`,
//! the connections they take), each transport's own API is under [`h2`] and [`quic`], and what
//! both read of a session's path is in [`path`].
//!
//! Wire protocol, version 1 (ALPN `seedgate-tunnel/1`), over HTTP/2:
//! - stream open: `CONNECT` with `:authority` = `host:port` of the target in the shoot;
//! - answer: `:status 200` once the agent's dial succeeded; otherwise a status from
//!   [`DialError::http_status`] with headers `seedgate-error: <code>` and `seedgate-reason`;
//! - bytes: DATA frames with per-stream flow control; END_STREAM is a half-close (FIN);
//!   RST_STREAM(CANCEL) is a reset;
//! - control: the seed opens `POST /seedgate/v1/control`; the agent answers 200 with a JSON
//!   hello line; the seed then sends JSON lines ([`ControlMsg`]);
//! - liveness: HTTP/2 PING from both sides every keepalive interval; one unanswered for the
//!   suspect time makes the path [`Quiet`] (the session goes on), for the keepalive timeout ends
//!   the session.
//!
//! Over QUIC: see [`quic`].

pub mod h2;
pub mod path;
pub mod quic;
pub mod session;

use crate::net::guard::Active;
use crate::relay::io::Resettable;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

pub use proxy_wire::tunnel::{ALPN_V1, AgentHello, AgentMsg, ControlMsg, DialError, Secret, ServerInfo};

pub const ERROR_HEADER: &str = "seedgate-error";
pub const REASON_HEADER: &str = "seedgate-reason";
pub const CONTROL_PATH: &str = "/seedgate/v1/control";

/// Classify a failed TCP connect of the agent as the dial error the seed gets.
pub fn connect_failed(target: &str, e: &io::Error) -> DialError {
    use crate::net::ConnectFailure::*;
    let msg = format!("{target}: {e}");
    match crate::net::ConnectFailure::classify(e) {
        Timeout => DialError::Timeout(msg),
        Refused => DialError::Refused(msg),
        Unreachable => DialError::Unreachable(msg),
        Resolve => DialError::Resolve(msg),
        Other => DialError::Unreachable(msg),
    }
}

/// One proxied connection carried by the tunnel.
pub struct TunnelStream {
    io: Box<dyn Resettable>,
    /// Counts the stream on its session until dropped (after the stream itself).
    _active: Option<Active<Arc<AtomicUsize>>>,
}

impl TunnelStream {
    pub fn new(io: impl Resettable + 'static) -> Self {
        Self { io: Box::new(io), _active: None }
    }

    /// A stream counted in its session's active streams while it lives.
    pub(crate) fn counted(io: impl Resettable + 'static, active: Active<Arc<AtomicUsize>>) -> Self {
        Self { io: Box::new(io), _active: Some(active) }
    }

    /// Abort the stream: the peer sees a reset rather than an orderly end.
    pub fn reset(&mut self) {
        self.io.reset();
    }
}

impl Resettable for TunnelStream {
    fn reset(&mut self) {
        self.io.reset();
    }
    fn owned_chunk(&self) -> Option<usize> {
        self.io.owned_chunk()
    }
    fn poll_write_owned(&mut self, cx: &mut Context<'_>, chunk: &mut bytes::Bytes) -> Poll<io::Result<()>> {
        self.io.poll_write_owned(cx, chunk)
    }
    fn reads_owned(&self) -> bool {
        self.io.reads_owned()
    }
    fn poll_read_owned(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<bytes::Bytes>> {
        self.io.poll_read_owned(cx)
    }
}

impl AsyncRead for TunnelStream {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for TunnelStream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.io).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.io).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.io).poll_shutdown(cx)
    }
}

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The seed side of one agent session: opens streams to targets in the shoot.
pub trait Opener: Send + Sync + 'static {
    /// Open a stream to `target` (`host:port`); resolves once the agent answered.
    fn open(&self, target: &str, timeout: Duration) -> BoxFuture<'_, Result<TunnelStream, DialError>>;
    /// Send a control message to the agent.
    fn control(&self, msg: &ControlMsg) -> Result<(), DialError>;
    /// Streams open on this session now.
    fn active_streams(&self) -> usize;
    /// True once the session takes no new streams: it is gone (the transport closed or
    /// keepalive failed) or the agent announced its shutdown.
    fn is_closed(&self) -> bool;
    /// Signs of life the agent has given so far (a count of what arrived from it on the
    /// session): a dial compares two readings to tell a session gone silent from an agent that
    /// is only slow to reach its target. `None`: the transport cannot tell (never doubted).
    fn heard(&self) -> Option<u64> {
        None
    }
    /// Ask the agent for a sign of life now, where a stream open elicits none by itself until
    /// the agent's dial is done (HTTP/2: a PING).
    fn probe(&self) {}
    /// The session's path is quiet now ([`Quiet`]): its keepalive went unanswered for the
    /// suspect time. `None`: the transport cannot tell.
    fn quiet(&self) -> Option<&Quiet> {
        None
    }
    /// When the latest PING the agent answered on this session was sent ([`Echoes`]). `None`:
    /// the transport's PINGs are not in order with its streams.
    fn echoes(&self) -> Option<&Echoes> {
        None
    }
}

/// When the latest PING the agent answered was sent, on the seed's end of an HTTP/2 session.
/// One TCP connection delivers in order, so a PING sent after a stream open and answered shows
/// the agent has the open; that, not any byte from the agent (its own PINGs cross a path that
/// carries nothing the other way), tells a dial that its open got through, and PINGs answered on
/// and on tell it that the path still carries the answer.
#[derive(Debug, Default)]
pub struct Echoes(crate::sync::Mutex<Option<tokio::time::Instant>>);

impl Echoes {
    /// A PING sent at `sent` was answered (one is out at a time: each is later than the last).
    pub fn answered(&self, sent: tokio::time::Instant) {
        *self.0.lock() = Some(sent);
    }

    /// When the latest PING answered so far was sent.
    pub fn last_answered(&self) -> Option<tokio::time::Instant> {
        *self.0.lock()
    }
}

/// Whether a session's path is quiet: a keepalive PING (QUIC: anything that asks for an
/// acknowledgement) has gone unanswered for the suspect time. Set by the session's transport,
/// cleared by the next sign of life; the session itself goes on until the keepalive timeout.
#[derive(Debug)]
pub struct Quiet(tokio::sync::watch::Sender<bool>);

impl Default for Quiet {
    fn default() -> Self {
        Self(tokio::sync::watch::Sender::new(false))
    }
}

impl Quiet {
    /// Record what the keepalive sees; true when that changed the state.
    pub fn set(&self, silent: bool) -> bool {
        self.0.send_if_modified(|s| std::mem::replace(s, silent) != silent)
    }

    pub fn is_silent(&self) -> bool {
        *self.0.borrow()
    }

    /// Every change from now on.
    pub fn watch(&self) -> tokio::sync::watch::Receiver<bool> {
        self.0.subscribe()
    }
}

/// A stream the seed asked the agent to open.
pub struct Incoming {
    pub target: String,
    pub responder: Box<dyn Responder>,
}

/// Answers one incoming stream: accept (the dial succeeded) or refuse.
pub trait Responder: Send {
    fn accept(self: Box<Self>) -> Result<TunnelStream, DialError>;
    fn refuse(self: Box<Self>, err: &DialError);
}

/// Agent side: what to do with streams and control messages.
pub trait AgentHandler: Send + Sync + 'static {
    /// A new stream to dial; called in its own task.
    fn incoming(&self, inc: Incoming) -> BoxFuture<'static, ()>;
    /// A control message from the seed.
    fn control(&self, msg: ControlMsg);
    fn hello(&self) -> AgentHello;
    /// The agent's token as it is renewed (the hello carries the one of the session's start):
    /// each new value is sent to the seed on the control stream, an empty one too (the agent has
    /// no token any more). `None`: no token.
    fn token_renewals(&self) -> Option<tokio::sync::watch::Receiver<Secret>> {
        None
    }
    /// The session is up: the transport's handshake passed (TLS, the seed's verdict on our
    /// certificate included, and the seed's HTTP/2 preface or QUIC control stream arrived).
    fn established(&self) {}
    /// The session's path went quiet (`true`: its keepalive unanswered for the suspect time) or
    /// showed life again (`false`).
    fn quiet(&self, _silent: bool) {}
}

/// Tunnel tuning shared by both ends.
#[derive(Debug, Clone)]
pub struct TunnelSettings {
    /// Per-stream receive window: the most one stream can have in flight unread (HTTP/2).
    pub stream_window: u32,
    /// The same for a QUIC session (see `seedgate_config::STREAM_WINDOW_QUIC` for why it differs).
    pub stream_window_quic: u32,
    /// Per-session receive window: bounds the memory of all streams together.
    pub connection_window: u32,
    /// The most a stream's window grows to on a path that needs it (HTTP/2: the session's
    /// estimate of its bandwidth-delay product, [`h2::window`]; QUIC: every stream's window), within
    /// a quarter of `connection_window` and never below the stream window.
    pub max_stream_window: u32,
    /// HTTP/2: the session's stream window follows its path up to `max_stream_window`; off, it
    /// stays `stream_window`. (What keeps the bytes a grown window lets into flight from
    /// overflowing the path is the session socket's in-flight bound, [`h2::inflight`].)
    pub h2_adaptive_window: bool,
    pub max_frame_size: u32,
    /// Most streams open at once on one session (set by the agent).
    pub max_streams: u32,
    pub keepalive_interval: Duration,
    /// A PING (QUIC: anything ack-eliciting) unanswered this long, at most the timeout
    /// ([`TunnelSettings::suspect`]): the session is suspect ([`Quiet`]); it goes on.
    pub keepalive_suspect: Duration,
    /// ... this long: the session is dead.
    pub keepalive_timeout: Duration,
    /// QUIC: the kernel may hand a read up to 64 coalesced packets (UDP GRO). quinn sizes an
    /// endpoint's receive buffer for 32 such reads; see [`quic::endpoint`].
    pub receive_offload: bool,
    /// QUIC: the congestion controller of what this end sends.
    pub congestion: seedgate_config::CongestionControl,
}

impl TunnelSettings {
    /// One end's settings from the session keys both ends share (the agent's `tunnel`,
    /// proxy-server's `agents`) and the congestion controller of what this end sends (a key of
    /// each end's own). The rest is the same for both ends unless an end sets it from keys of
    /// its own (the agent: its stream limit and UDP receive offload).
    pub fn new(session: &seedgate_config::SessionSettings, congestion: seedgate_config::CongestionControl) -> Self {
        let (stream_window, stream_window_quic) = session.stream_windows();
        Self {
            stream_window,
            stream_window_quic,
            connection_window: session.connection_window,
            max_stream_window: session.max_stream_window,
            h2_adaptive_window: session.h2_adaptive_window,
            max_frame_size: 64 * 1024,
            max_streams: 16 * 1024,
            keepalive_interval: session.keepalive.interval.get(),
            keepalive_suspect: session.keepalive.suspect_after.get(),
            keepalive_timeout: session.keepalive.timeout.get(),
            receive_offload: true,
            congestion,
        }
    }

    /// How long a PING may go unanswered before the session is suspect: `keepalive_suspect`, at
    /// most `keepalive_timeout` (equal to it, a session is never suspect before it is dead).
    pub fn suspect(&self) -> Duration {
        self.keepalive_suspect.min(self.keepalive_timeout)
    }

    /// How often a keepalive PING goes out: every keepalive interval, and at least three times
    /// per suspect time, so that a few seconds of silence are noticed whether or not anything
    /// else is sent (a PING is some 40 bytes on the wire).
    pub fn ping_every(&self) -> Duration {
        self.keepalive_interval.min(self.suspect() / 3).max(Duration::from_millis(10))
    }
}

/// The settings of a config that leaves every session key out.
impl Default for TunnelSettings {
    fn default() -> Self {
        Self::new(&seedgate_config::SessionSettings::default(), seedgate_config::CongestionControl::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The PING pace is the interval, or a third of the suspect time where that is shorter (so a
    /// silence is seen within the suspect time and a third), never zero.
    #[test]
    fn pings_go_out_at_least_three_times_per_suspect_time() {
        let s = |interval: u64, suspect: u64, timeout: u64| TunnelSettings {
            keepalive_interval: Duration::from_millis(interval),
            keepalive_suspect: Duration::from_millis(suspect),
            keepalive_timeout: Duration::from_millis(timeout),
            ..TunnelSettings::default()
        };
        assert_eq!(TunnelSettings::default().ping_every(), Duration::from_secs(1), "5s interval, 3s suspect");
        assert_eq!(s(500, 2_000, 2_000).ping_every(), Duration::from_millis(500), "the interval is shorter");
        assert_eq!(
            s(5_000, 9_000, 3_000).ping_every(),
            Duration::from_secs(1),
            "the suspect time is at most the timeout"
        );
        assert_eq!(s(5_000, 0, 60_000).ping_every(), Duration::from_millis(10), "never a busy loop");
        assert_eq!(s(5_000, 9_000, 3_000).suspect(), Duration::from_secs(3), "suspect at most at the timeout");
        assert_eq!(s(5_000, 2_000, 3_000).suspect(), Duration::from_secs(2));
    }

    /// An end's settings are its session keys as given, with the transports' own stream windows
    /// where `stream_window` is left out.
    #[test]
    fn an_end_s_settings_are_its_session_keys() {
        use seedgate_config::{CongestionControl, Dur, Keepalive, SessionSettings};
        let keepalive = Keepalive { interval: Dur::millis(500), suspect_after: Dur::secs(9), timeout: Dur::secs(2) };
        let session = SessionSettings {
            keepalive,
            connection_window: 768 * 1024,
            max_stream_window: 4 << 20,
            h2_adaptive_window: false,
            ..SessionSettings::default()
        };
        let t = TunnelSettings::new(&session, CongestionControl::Bbr);
        assert_eq!((t.stream_window, t.stream_window_quic), (512 * 1024, 768 * 1024), "at most the session's");
        assert_eq!((t.connection_window, t.max_stream_window, t.h2_adaptive_window), (768 * 1024, 4 << 20, false));
        assert_eq!(t.keepalive_interval, Duration::from_millis(500));
        assert_eq!((t.suspect(), t.keepalive_timeout), (Duration::from_secs(2), Duration::from_secs(2)));
        assert_eq!(t.congestion, CongestionControl::Bbr);
        let t = TunnelSettings::new(&SessionSettings { stream_window: Some(65_535), ..session }, t.congestion);
        assert_eq!((t.stream_window, t.stream_window_quic), (65_535, 65_535), "a given window holds for both");
    }
}
