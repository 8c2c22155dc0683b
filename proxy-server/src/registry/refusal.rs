//! Why the directory turns an agent session or a dial away: [`Refusal`] (a session: its cluster fenced, or at its session cap) and [`DialRefusal`] (a dial: the cluster's share, or what the tunnel answered), the latter with its reason code and HTTP status.
//!
//! A session's refusal says only what the directory decided; the agents' wing maps it to its
//! own refusal, which carries the label and what the agent is told.

use proxy_core::net::share::Kind;
use proxy_core::tunnel::DialError;

/// Why the directory files no session for an agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The cluster is fenced here: its agents belong to the seed it moved to.
    Fenced(String),
    /// The cluster holds its cap of agent sessions on this replica.
    SessionLimit { cluster: String, cap: usize },
}

/// Why a dial was not made or failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DialRefusal {
    #[error(transparent)]
    Dial(#[from] DialError),
    /// The cluster holds its share of streams or pending dials: refused before any dial.
    #[error("over capacity: cluster {cluster} holds its share of {} ({cap})", share_name(*.kind))]
    Share { cluster: String, kind: Kind, cap: usize },
}

/// What a cluster's share of `kind` counts, as a refusal names it.
fn share_name(kind: Kind) -> &'static str {
    if kind == Kind::Established { "streams" } else { "pending dials" }
}

impl DialRefusal {
    /// The reason code (`seedgate_rejects_total{reason}`, the access event's `reason`).
    pub(crate) fn code(&self) -> &'static str {
        match self {
            DialRefusal::Dial(e) => e.code(),
            DialRefusal::Share { kind: Kind::Established, .. } => "cluster_stream_limit",
            DialRefusal::Share { .. } => "cluster_pending_limit",
        }
    }

    pub(crate) fn http_status(&self) -> u16 {
        match self {
            DialRefusal::Dial(e) => e.http_status(),
            DialRefusal::Share { .. } => 503,
        }
    }
}
