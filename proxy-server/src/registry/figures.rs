//! The clusters as one look of the directory shows them to the status page ([`ClusterFigures`]: each cluster's mode, sessions and dials of the last minutes), and the count of a dial by its result ([`super::tally`] keeps the counts).

use super::session::Session;
use super::tally::{DIAL_RESULTS, Dials, OTHER};
use super::{Mode, SessionDirectory};
use std::sync::Arc;

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
