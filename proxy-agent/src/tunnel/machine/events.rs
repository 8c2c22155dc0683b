//! What passes between a slot's machine and its driver: who the slot is, the settings it acts on, the events it is fed, the actions it asks for, and its own kind of failure.

use crate::replicas::Replicas;
use proxy_core::tunnel::ServerInfo;
use seedgate_config::HostPort;
use seedgate_config::agent::{Transport, Tunnel as TunnelCfg};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// A session the machine asked for; never reused within a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SessionId(pub(super) u64);

/// A name resolution the machine asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QueryId(pub(super) u64);

/// What a session runs over (`auto` is a choice between these, made per dial).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Carrier {
    H2,
    Quic,
}

impl Carrier {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Carrier::H2 => "h2",
            Carrier::Quic => "quic",
        }
    }
}

/// Who the slot is, for its whole life.
pub(crate) struct Slot {
    pub index: usize,
    pub configured: HostPort,
    pub replicas: Arc<Replicas>,
}

/// The random draw (`0.0..=1.0`) behind every jittered wait; injected so tests are deterministic.
pub(crate) type Draw = Box<dyn FnMut() -> f64 + Send>;

/// The part of the tunnel config the slot acts on; the driver hands it over again before every
/// event, so a reload applies to the next decision.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Settings {
    pub transport: Transport,
    pub reconnect_initial: Duration,
    pub reconnect_max: Duration,
    /// How long a replacement (or a move target) may take to come up and announce itself.
    pub dial_timeout: Duration,
    pub rehome_drain: Duration,
    pub quic_probe_interval: Duration,
    /// How often the name of the live session's target is resolved again (to follow DNS).
    pub reresolve: Duration,
}

impl From<&TunnelCfg> for Settings {
    fn from(c: &TunnelCfg) -> Self {
        Self {
            transport: c.transport,
            reconnect_initial: c.reconnect.initial.get(),
            reconnect_max: c.reconnect.max.get(),
            dial_timeout: c.dial_timeout.get(),
            rehome_drain: c.rehome_drain.get(),
            quic_probe_interval: c.quic_probe_interval.get(),
            reresolve: c.keepalive.interval.get(),
        }
    }
}

/// Why a session of the slot did not come up, ended, or was not kept: the machine's own account,
/// which the driver builds from what it saw (a failed establishment, the end of a session's task)
/// and which the slot's log lines and readiness detail show.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Failure {
    /// Nothing answered the dial at all (no SYN-ACK, no QUIC packet in time): the path or the
    /// server is silent. Trying again costs the server nothing, so the slot probes at a short
    /// pace instead of backing off.
    #[error("{0}")]
    Unanswered(String),
    /// The dial failed otherwise (a refusal, a handshake that failed or stalled half-way, a name
    /// that does not resolve): backed off from.
    #[error("{0}")]
    Failed(String),
    /// The session ended with an error.
    #[error("{0}")]
    Ended(String),
    /// The session closed without an error.
    #[error("the session closed")]
    Closed,
    /// A candidate reached a replica another slot holds, or one that drains.
    #[error("it reached a replica already held or draining")]
    HeldOrDraining,
    /// A candidate did not come up before its deadline.
    #[error("it did not come up in time")]
    NotUpInTime,
}

impl Failure {
    /// Nothing answered: see [`Failure::Unanswered`].
    pub(crate) fn silent(&self) -> bool {
        matches!(self, Failure::Unanswered(_))
    }
}

/// What happened, as the driver tells it.
#[derive(Debug)]
pub(crate) enum Event {
    /// A dial finished: the session runs (not up yet) with the peer it reached, or why it failed.
    Dialed { id: SessionId, result: Result<SocketAddr, Failure> },
    /// The session passed its handshake (the seed spoke the transport's protocol).
    Up(SessionId),
    /// The session's keepalive went unanswered for the suspect time (`silent`), or it showed
    /// life again.
    Quiet { id: SessionId, silent: bool },
    /// The seed opened a stream on the session (the first one is reported).
    Carried(SessionId),
    /// The session's replica announced itself (first time, or a change such as draining).
    Announced(SessionId, ServerInfo),
    /// The session ended (`error`: why, if it did not end cleanly).
    Ended { id: SessionId, error: Option<Failure> },
    /// A server (on any of the slot's sessions) asked the agent to move.
    Move { to: Vec<String>, drain_deadline_ms: u64 },
    /// A resolution finished (`None`: it failed or timed out).
    Resolved { query: QueryId, addrs: Option<Vec<SocketAddr>> },
    /// The time of the machine's `poll_timeout` came.
    Timer,
    /// The replica set changed: the slot may be wanted (or not) now.
    Wanted,
    /// The slot ends; its sessions get GOAWAY from their own stop tokens.
    Stop,
}

/// What the driver does.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Action {
    /// Establish a session to `target` (resolved afresh) over `over`, within `patience` (`None`:
    /// the configured timeouts); answer with [`Event::Dialed`].
    Dial { id: SessionId, target: HostPort, over: Carrier, patience: Option<Duration> },
    /// Resolve `name`; answer with [`Event::Resolved`].
    Resolve { query: QueryId, name: HostPort },
    /// GOAWAY on the session now (with `open`: only once `drain` is over, so the server it
    /// leaves can still open streams until then); end its streams after `drain` (`None`: when
    /// the server ends them), then close it. `why` is logged.
    Retire { id: SessionId, drain: Option<Duration>, open: bool, why: &'static str },
}
