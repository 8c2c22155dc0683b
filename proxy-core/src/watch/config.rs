//! What triggers a config reload: SIGHUP, or a change of the config file (polled, following symlink swaps).

use super::{Poll, Seen};
use crate::obs::metrics::ReloadMetrics;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::signal::unix::{Signal, SignalKind, signal};

/// Record a successful (re)load in the metrics.
pub fn mark_loaded(metrics: &ReloadMetrics) {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    metrics.last_success.set(now as i64);
}

/// Why a reload was triggered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    Signal,
    FileChanged,
}

impl Trigger {
    pub fn label(self) -> &'static str {
        match self {
            Trigger::Signal => "SIGHUP",
            Trigger::FileChanged => "file changed",
        }
    }
}

/// Watches one config file and SIGHUP.
pub struct Watch {
    path: PathBuf,
    seen: Seen,
    hup: Option<Signal>,
    tick: tokio::time::Interval,
}

impl Watch {
    /// Must be called inside a tokio runtime. Without a SIGHUP handler (it cannot be installed)
    /// only file changes trigger.
    pub fn new(path: PathBuf) -> Self {
        let hup = match signal(SignalKind::hangup()) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::error!(error = %e, "cannot install the SIGHUP handler; reloading only on file change");
                None
            }
        };
        Self { seen: Seen::now(&path), path, hup, tick: Poll::CONFIG.ticker() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The next trigger. A file that vanished (mid-swap) is not a change; its reappearance is.
    pub async fn next(&mut self) -> Trigger {
        loop {
            let hup = async {
                match &mut self.hup {
                    Some(h) => h.recv().await,
                    None => std::future::pending().await,
                }
            };
            let why = tokio::select! {
                _ = hup => Trigger::Signal,
                _ = self.tick.tick() => {
                    if !self.seen.changed_present(&self.path) {
                        continue;
                    }
                    Trigger::FileChanged
                }
            };
            if why == Trigger::Signal {
                // What the reload reads now is not a change to report again.
                self.seen = Seen::now(&self.path);
            }
            return why;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_change_and_a_symlink_swap_trigger_but_a_vanished_file_does_not() {
        let dir = std::env::temp_dir().join(format!("seedgate-watch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("v1")).unwrap();
        std::fs::create_dir_all(dir.join("v2")).unwrap();
        std::fs::write(dir.join("v1/c.yaml"), "a: 1\n").unwrap();
        std::fs::write(dir.join("v2/c.yaml"), "a: 2\n").unwrap();
        std::os::unix::fs::symlink("v1", dir.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/c.yaml", dir.join("c.yaml")).unwrap();
        let mut w = Watch::new(dir.join("c.yaml"));
        async fn next(w: &mut Watch) -> Option<Trigger> {
            tokio::time::timeout(Duration::from_secs(10), w.next()).await.ok()
        }
        // The way Kubernetes updates a mounted ConfigMap: a new `..data` link renamed over the old.
        std::os::unix::fs::symlink("v2", dir.join("..data_tmp")).unwrap();
        std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
        assert_eq!(next(&mut w).await, Some(Trigger::FileChanged));
        // Gone, then back with other content: one trigger, for the reappearance.
        std::fs::remove_file(dir.join("c.yaml")).unwrap();
        let quiet = tokio::time::timeout(Poll::CONFIG.period() * 3, w.next()).await;
        assert!(quiet.is_err(), "a vanished file is not a change");
        std::fs::write(dir.join("c.yaml"), "a: 3\n").unwrap();
        assert_eq!(next(&mut w).await, Some(Trigger::FileChanged));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
