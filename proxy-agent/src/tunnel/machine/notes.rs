//! What a slot's machine reports for its driver to count and log: each [`Note`] is one change of the slot's metrics or one log line, in the order the machine decided them.

use super::events::{Carrier, Failure};
use seedgate_config::HostPort;
use std::net::SocketAddr;
use std::time::Duration;

/// One thing the slot reports. The driver performs a step's notes in order (before its actions):
/// a metric of the slot's series, or a log line with the slot's label as `server`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Note {
    Metric(Metric),
    Log(Log),
}

/// A change of the slot's metrics (the series it names are in the metrics reference).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Metric {
    /// The slot's session is up over this transport (`seedgate_tunnel_sessions_connected`,
    /// `seedgate_tunnel_transport_info`).
    Up(Carrier),
    /// The slot has no session up.
    Down,
    /// A reconnect attempt ended: its session came up (`ok`), or it failed before that
    /// (`seedgate_tunnel_reconnects_total`).
    Reconnect { ok: bool },
    /// `auto` changed the slot's transport: a session over h2 because QUIC did not get through,
    /// or moved back to QUIC (`seedgate_tunnel_transport_changes_total`).
    TransportChange { from: Carrier, to: Carrier },
    /// A move notice came, or the live session's name resolves elsewhere
    /// (`seedgate_tunnel_move_notices_total`).
    Move,
    /// The live session became suspect (`seedgate_tunnel_sessions_suspect_total`).
    Suspect,
    /// A suspect session was replaced (`seedgate_tunnel_sessions_replaced_total`).
    Replaced,
    /// A session ended before it proved itself; the back-off kept growing
    /// (`seedgate_tunnel_reconnect_storms_avoided_total`).
    StormAvoided,
    /// A session reached a replica another slot holds (`seedgate_agent_duplicate_sessions_total`).
    Duplicate,
}

/// A log line of the slot; each variant is one message, its fields named as in the line.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Log {
    /// The slot's session is up.
    Up { target: HostPort, peer: SocketAddr, over: Carrier },
    /// `auto`: QUIC did not get through, so the same place is dialled over h2.
    FallBack { target: HostPort, error: Failure },
    /// The slot's dial failed (a warning: once per run of silent tries).
    Failed { target: HostPort, error: Failure },
    /// The slot's dial got no answer again, `tries` in a row (debug).
    StillNoAnswer { target: HostPort, error: Failure, tries: u32 },
    /// The live session's keepalive went unanswered: a rescue is dialled beside it.
    Suspect { target: HostPort, peer: SocketAddr },
    /// The suspect session answers again.
    AnswersAgain { target: HostPort, peer: SocketAddr },
    /// The live session reached a replica another session holds: closed, dialled again.
    Duplicate { id: String },
    /// The live session's replica announced itself.
    Announced { id: String, count: u32, draining: bool },
    /// The live session's replica drains: a replacement is looked for.
    Draining { target: HostPort },
    /// The live session closed without an error.
    Closed,
    /// The live session failed before it was up (typically the server refused the certificate).
    FailedBeforeUp { error: Failure },
    /// The live session ended with an error.
    Ended { error: Failure },
    /// A session that came up ended before it proved itself: the back-off grows.
    Unproven { lived: Duration },
    /// A move notice for where the slot already is.
    AlreadyThere { to: HostPort },
    /// A move notice: the slot re-homes.
    Rehoming { from: HostPort, to: HostPort },
    /// The live session's name no longer includes its peer: the slot re-homes.
    NameMoved { name: HostPort, old: SocketAddr, new: Vec<SocketAddr> },
    /// A candidate reached a replica already held or draining, or did not come up (debug).
    Rejected { id: Option<String> },
    /// A re-homing's session did not make it: the slot stays on its session.
    RehomeFailed { target: HostPort, error: Failure },
    /// No replacement for the draining replica yet (debug).
    NoReplacement { error: Failure },
    /// `auto` on h2: QUIC still does not get through (debug).
    StillOnH2 { target: HostPort, error: Failure },
    /// No replacement for the suspect session yet (debug).
    NoRescue { target: HostPort, error: Failure },
}
