//! The reverse tunnel between proxy-server (seed) and proxy-agent (shoot): transport-neutral types and wire constants.
//!
//! The agent always dials out. Over its TLS 1.3 session the roles are reversed: the seed side
//! opens one stream per proxied connection (it is the HTTP/2 client), the agent accepts them
//! (it is the HTTP/2 server). Dial and front-end code only see [`Opener`], [`Incoming`] and
//! [`TunnelStream`], so the second transport, QUIC ([`quic`]), sits beside [`h2`] without touching them.
//!
//! Wire protocol, version 1 (ALPN `seedgate-tunnel/1`):
//! - stream open: `CONNECT` with `:authority` = `host:port` of the target in the shoot;
//! - answer: `:status 200` once the agent's dial succeeded; otherwise a status from
//!   [`DialError::http_status`] with headers `seedgate-error: <code>` and `seedgate-reason`;
//! - bytes: DATA frames with per-stream flow control; END_STREAM is a half-close (FIN);
//!   RST_STREAM(CANCEL) is a reset;
//! - control: the seed opens `POST /seedgate/v1/control`; the agent answers 200 with a JSON
//!   hello line; the seed then sends JSON lines ([`ControlMsg`]);
//! - liveness: HTTP/2 PING from both sides every keepalive interval.

#[doc(hidden)]
pub mod fuzzing;
pub mod h2;
pub mod quic;
mod stream;

use crate::io::Resettable;
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

pub use stream::H2Stream;

/// ALPN of tunnel protocol version 1.
pub const ALPN_V1: &[u8] = b"seedgate-tunnel/1";
pub const ERROR_HEADER: &str = "seedgate-error";
pub const REASON_HEADER: &str = "seedgate-reason";
pub const CONTROL_PATH: &str = "/seedgate/v1/control";

/// Why a dial through the tunnel failed. The code travels in `seedgate-error`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DialError {
    #[error("destination not allowed: {0}")]
    NotAllowed(String),
    #[error("connection refused: {0}")]
    Refused(String),
    #[error("destination unreachable: {0}")]
    Unreachable(String),
    #[error("cannot resolve destination: {0}")]
    Resolve(String),
    #[error("dial timed out: {0}")]
    Timeout(String),
    #[error("agent stream limit reached: {0}")]
    Limit(String),
    #[error("agent is draining: {0}")]
    Draining(String),
    #[error("no agent connected: {0}")]
    NoAgent(String),
    #[error("cluster moved: {0}")]
    Moved(String),
    #[error("bad destination: {0}")]
    BadTarget(String),
    #[error("tunnel failure: {0}")]
    Transport(String),
}

impl DialError {
    pub fn code(&self) -> &'static str {
        match self {
            DialError::NotAllowed(_) => "not_allowed",
            DialError::Refused(_) => "refused",
            DialError::Unreachable(_) => "unreachable",
            DialError::Resolve(_) => "resolve_failed",
            DialError::Timeout(_) => "dial_timeout",
            DialError::Limit(_) => "stream_limit",
            DialError::Draining(_) => "draining",
            DialError::NoAgent(_) => "no_agent",
            DialError::Moved(_) => "cluster_moved",
            DialError::BadTarget(_) => "bad_target",
            DialError::Transport(_) => "tunnel_error",
        }
    }

    /// The HTTP status a front end answers with.
    pub fn http_status(&self) -> u16 {
        match self {
            DialError::NotAllowed(_) => 403,
            DialError::Refused(_) | DialError::Unreachable(_) | DialError::Resolve(_) | DialError::Transport(_) => 502,
            DialError::Timeout(_) => 504,
            DialError::Limit(_) | DialError::Draining(_) | DialError::NoAgent(_) | DialError::Moved(_) => 503,
            DialError::BadTarget(_) => 400,
        }
    }

    pub fn detail(&self) -> &str {
        match self {
            DialError::NotAllowed(s)
            | DialError::Refused(s)
            | DialError::Unreachable(s)
            | DialError::Resolve(s)
            | DialError::Timeout(s)
            | DialError::Limit(s)
            | DialError::Draining(s)
            | DialError::NoAgent(s)
            | DialError::Moved(s)
            | DialError::BadTarget(s)
            | DialError::Transport(s) => s,
        }
    }

    /// Rebuild from the wire (`seedgate-error` code and reason).
    pub fn from_code(code: &str, reason: String) -> Self {
        match code {
            "not_allowed" => DialError::NotAllowed(reason),
            "refused" => DialError::Refused(reason),
            "unreachable" => DialError::Unreachable(reason),
            "resolve_failed" => DialError::Resolve(reason),
            "dial_timeout" => DialError::Timeout(reason),
            "stream_limit" => DialError::Limit(reason),
            "draining" => DialError::Draining(reason),
            "bad_target" => DialError::BadTarget(reason),
            _ => DialError::Transport(format!("{code}: {reason}")),
        }
    }

    /// Classify a failed TCP connect of the agent.
    pub fn from_connect(target: &str, e: &io::Error) -> Self {
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
}

/// One proxied connection carried by the tunnel.
pub struct TunnelStream {
    io: Box<dyn Resettable>,
}

impl TunnelStream {
    pub fn new(io: impl Resettable + 'static) -> Self {
        Self { io: Box::new(io) }
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
}

/// Control messages queued for one agent; a slow agent cannot make this grow without bound.
const CONTROL_QUEUE: usize = 16;

/// What every transport's [`Opener`] keeps besides its connection: the streams open on the
/// session, its end, the agent's draining notice and the queue of control messages to it.
pub(crate) struct OpenerState {
    pub(crate) active: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    pub(crate) closed: tokio_util::sync::CancellationToken,
    /// The agent announced its shutdown (GOAWAY, a going-away notice, or a stream refused as
    /// draining): streams it has keep going, new ones must go to another agent.
    draining: std::sync::atomic::AtomicBool,
    control: tokio::sync::mpsc::Sender<ControlMsg>,
}

impl OpenerState {
    /// A session's state, and the receiving end of its control queue.
    pub(crate) fn new(closed: tokio_util::sync::CancellationToken) -> (Self, tokio::sync::mpsc::Receiver<ControlMsg>) {
        let (control, rx) = tokio::sync::mpsc::channel(CONTROL_QUEUE);
        let state = Self { active: Default::default(), closed, draining: Default::default(), control };
        (state, rx)
    }

    pub(crate) fn set_draining(&self) {
        self.draining.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    pub(crate) fn control(&self, msg: &ControlMsg) -> Result<(), DialError> {
        self.control.try_send(msg.clone()).map_err(|e| DialError::Transport(format!("control queue: {e}")))
    }

    pub(crate) fn active_streams(&self) -> usize {
        self.active.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Ended, or the agent is draining.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.is_cancelled() || self.draining.load(std::sync::atomic::Ordering::Relaxed)
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
    /// The session is up: the seed's HTTP/2 preface (TCP) or control stream (QUIC) arrived, so
    /// TLS (the seed's verdict on our certificate included) and the transport handshake passed.
    fn established(&self) {}
}

/// Messages from the seed to an agent on the control stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ControlMsg {
    /// This server stops serving the cluster: open a session to `to` (or re-resolve the
    /// configured server names when empty), move new streams there, let old ones finish within
    /// `drain_deadline_ms`, then close this session.
    Move { to: Vec<String>, drain_deadline_ms: u64 },
    /// This server does not serve the agent's cluster and is about to close the session; the
    /// agent logs `reason` (the session is not used for dials meanwhile).
    Refused { reason: String },
    /// Who this server is: sent when the session is registered and again whenever the count or
    /// the draining flag changes. The agent keeps sessions to `count` distinct server ids behind
    /// the name it dialled.
    Server(ServerInfo),
}

/// A proxy-server replica as it announces itself to its agents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerInfo {
    /// The replica's identity (distinct per replica).
    pub id: String,
    /// How many replicas the agent should reach behind the name it dialled.
    pub count: u32,
    /// When this replica's `count` took its value (Unix milliseconds). Replicas may disagree
    /// for a while (one reloaded, another not yet): the agent trusts the newest.
    #[serde(default)]
    pub since_ms: u64,
    /// The replica is shutting down: its live streams continue until its drain deadline, new
    /// streams should go elsewhere, and the agent looks for a session to a replacement.
    #[serde(default)]
    pub draining: bool,
}

/// What an agent says about itself when the control stream opens.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentHello {
    pub node: String,
    pub version: String,
}

/// Tunnel tuning shared by both ends.
#[derive(Debug, Clone)]
pub struct TunnelSettings {
    /// Per-stream receive window: the most one stream can have in flight unread.
    pub stream_window: u32,
    /// Per-session receive window: bounds the memory of all streams together.
    pub connection_window: u32,
    pub max_frame_size: u32,
    /// Most streams open at once on one session (set by the agent).
    pub max_streams: u32,
    pub keepalive_interval: Duration,
    pub keepalive_timeout: Duration,
}

impl Default for TunnelSettings {
    fn default() -> Self {
        Self {
            stream_window: 256 * 1024,
            connection_window: 64 * 1024 * 1024,
            max_frame_size: 64 * 1024,
            max_streams: 16 * 1024,
            keepalive_interval: Duration::from_secs(5),
            keepalive_timeout: Duration::from_secs(15),
        }
    }
}
