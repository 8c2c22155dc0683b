//! A cluster's mode as the directory applies it: the changes (a reload, a cluster file, an admin override), what each mode does to the cluster's live streams (fenced: ended; draining with a deadline: ended then) and agents (draining: told to move; fenced: sessions ended), and the move notices.

use super::{Entry, Mode, Session, SessionDirectory};
use proxy_core::tunnel::ControlMsg;
use seedgate_config::server::{ClusterMode, ClusterState};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

/// A cluster whose mode changed, as the change is told to its agents and logged once the
/// directory is unlocked.
struct Changed {
    cluster: String,
    mode: Mode,
    sessions: Vec<Arc<Session>>,
}

impl SessionDirectory {
    /// Apply cluster states (from config or the admin endpoint). Returns the clusters whose
    /// mode changed.
    pub(crate) fn set_modes(&self, states: &BTreeMap<String, ClusterState>) -> Vec<String> {
        let changes = {
            let mut c = self.clusters.write();
            let configured = c.by_name.iter().filter(|(_, e)| e.mode.is_some()).map(|(n, _)| n.clone());
            let names: BTreeSet<String> = configured.chain(states.keys().cloned()).collect();
            let mut changes = Vec::new();
            for name in names {
                let new = Mode::from_cfg(states.get(&name));
                let e = c.entry(&name, &self.kill);
                match e.mode.take() {
                    // The same state (no notices, deadlines keep counting); strategies as now.
                    Some(old) if old.same_as(&new) => e.mode = Some(Mode { strategies: new.strategies, ..old }),
                    old => {
                        let changed = old.is_some() || new.mode != ClusterMode::Active;
                        e.mode = states.contains_key(&name).then_some(new);
                        if changed {
                            changes.push(self.mode_changed(&name, e));
                        }
                    }
                }
            }
            changes
        };
        changes.into_iter().map(|c| self.tell(c)).collect()
    }

    /// `cluster`'s mode changed (under the lock): its state gauge, its live streams by the new
    /// mode, and who is to be told.
    fn mode_changed(&self, cluster: &str, e: &mut Entry) -> Changed {
        let mode = e.mode();
        self.metrics.set_cluster_state(cluster, mode.mode);
        e.generation += 1;
        match (mode.mode, mode.drain_deadline) {
            (ClusterMode::Fenced, _) => e.end_streams(&self.kill),
            (ClusterMode::Draining, Some(d)) => self.end_streams_at(cluster, e.generation, mode.since + d),
            _ => {}
        }
        Changed { cluster: cluster.to_owned(), mode, sessions: e.sessions.clone() }
    }

    /// Tell a cluster's agents about its new mode (the directory unlocked).
    fn tell(&self, c: Changed) -> String {
        let Changed { cluster, mode, sessions } = c;
        tracing::info!(%cluster, mode = ?mode.mode, move_to = ?mode.move_to, "cluster state changed");
        match mode.mode {
            ClusterMode::Active => {}
            ClusterMode::Draining => {
                for s in &sessions {
                    self.send_move(s, &mode);
                }
            }
            ClusterMode::Fenced => {
                // Fenced: this seed must not act for the cluster any more.
                for s in &sessions {
                    s.stop.cancel();
                }
            }
        }
        cluster
    }

    pub(super) fn send_move(&self, s: &Session, mode: &Mode) {
        let msg = ControlMsg::Move {
            to: mode.move_to.clone(),
            drain_deadline_ms: mode.drain_deadline.map(|d| d.as_millis() as u64).unwrap_or(0),
        };
        if let Err(e) = s.opener.control(&msg) {
            tracing::warn!(cluster = %s.cluster, session = s.id, error = %e, "cannot send the move notice");
        } else {
            self.metrics.move_notices.with_label_values(&[&s.cluster]).inc();
        }
    }

    /// At `at` (the drain deadline), end the cluster's live streams, unless its mode changed again.
    fn end_streams_at(&self, cluster: &str, generation: u64, at: Instant) {
        let (clusters, kill, cluster) = (self.clusters.clone(), self.kill.clone(), cluster.to_owned());
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep_until(at.into()) => {}
                _ = kill.cancelled() => return,
            }
            let mut c = clusters.write();
            if let Some(e) = c.by_name.get_mut(&cluster).filter(|e| e.generation == generation) {
                e.end_streams(&kill);
            }
        });
    }
}
