//! What the registry keeps for the status page beside what dials need: each cluster's dials of the last minutes by result, each session's bytes and last failed dial, and the clusters as one look shows them — kept where the dial path already is, at no cost per byte.
//!
//! A cluster counts its dials in a ring of per-minute atomics ([`Dials`]) once per dial, after
//! it ended; a session adds its streams' bytes once per stream, when the stream ends
//! ([`Tally::ended`]), and notes the error of a dial it failed ([`Tally::failed`]: a lock on the
//! failure's path only).

use super::session::Session;
use super::{Mode, SessionDirectory};
use proxy_core::obs::minutes::PerMinute;
use proxy_core::sync::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// What a dial came to, as a cluster counts its dials per minute: `ok`, or the refusal's code
/// ([`DialRefusal::code`](super::DialRefusal::code)).
pub(crate) const DIAL_RESULTS: [&str; 14] = [
    "ok",
    "not_allowed",
    "refused",
    "unreachable",
    "resolve_failed",
    "dial_timeout",
    "stream_limit",
    "draining",
    "no_agent",
    "cluster_moved",
    "bad_target",
    "tunnel_error",
    "cluster_stream_limit",
    "cluster_pending_limit",
];

/// The code a dial's result is counted as when [`DIAL_RESULTS`] does not name it.
const OTHER: usize = 11;

/// A cluster's dials of the last minutes, by [`DIAL_RESULTS`].
pub(crate) type Dials = PerMinute<{ DIAL_RESULTS.len() }>;

/// A session's figures for the status page (see the module documentation).
#[derive(Debug, Default)]
pub(crate) struct Tally {
    to_shoot: AtomicU64,
    to_seed: AtomicU64,
    last_error: Mutex<Option<(Instant, String)>>,
}

impl Tally {
    /// A stream of this session ended, having moved these bytes.
    pub(crate) fn ended(&self, to_shoot: u64, to_seed: u64) {
        self.to_shoot.fetch_add(to_shoot, Ordering::Relaxed);
        self.to_seed.fetch_add(to_seed, Ordering::Relaxed);
    }

    /// A dial on this session failed with `error`.
    pub(crate) fn failed(&self, error: String) {
        *self.last_error.lock() = Some((Instant::now(), error));
    }

    /// Bytes to the shoot and to the seed of the streams that ended.
    pub(crate) fn bytes(&self) -> (u64, u64) {
        (self.to_shoot.load(Ordering::Relaxed), self.to_seed.load(Ordering::Relaxed))
    }

    /// The last failed dial: when, and why.
    pub(crate) fn last_error(&self) -> Option<(Instant, String)> {
        self.last_error.lock().clone()
    }
}

/// One cluster as the status page shows it, read at one look of the directory.
pub(crate) struct ClusterFigures {
    pub name: String,
    /// Its mode as configured; `None`: not configured, so active.
    pub mode: Option<Mode>,
    pub sessions: Vec<Arc<Session>>,
    pub dials: Arc<Dials>,
}

impl ClusterFigures {
    /// Whether it ever had a dial in the last minutes.
    pub(crate) fn dialled(&self) -> bool {
        (0..DIAL_RESULTS.len()).any(|i| self.dials.any(i))
    }
}

impl SessionDirectory {
    /// Every cluster entry, for the status page (its sessions' hellos filed first).
    pub(crate) fn figures(&self) -> Vec<ClusterFigures> {
        let unread: Vec<String> = {
            let c = self.clusters.read();
            c.by_name.iter().filter(|(_, e)| e.index.has_unread()).map(|(n, _)| n.clone()).collect()
        };
        for cluster in unread {
            self.file_hellos(&cluster);
        }
        let c = self.clusters.read();
        c.by_name
            .iter()
            .map(|(name, e)| ClusterFigures {
                name: name.clone(),
                mode: e.mode.clone(),
                sessions: e.sessions.clone(),
                dials: e.dials.clone(),
            })
            .collect()
    }

    /// Count a dial of `cluster` that came to `code` (its entry made if it had none: a front
    /// end's cluster without any agent counts its refused dials too).
    pub(super) fn count_dial(&self, cluster: &str, code: &str) {
        let kind = DIAL_RESULTS.iter().position(|c| *c == code).unwrap_or(OTHER);
        if let Some(e) = self.clusters.read().by_name.get(cluster) {
            e.dials.add(kind, 1);
            return;
        }
        self.clusters.write().entry(cluster, &self.kill).dials.add(kind, 1);
    }
}
