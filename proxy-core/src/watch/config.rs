//! What triggers a config reload: SIGHUP, or a change of the config file (polled, following symlink swaps).

use crate::obs::metrics::ReloadMetrics;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::signal::unix::{Signal, SignalKind, signal};

/// How often the file's metadata is checked. Polling (rather than inotify) also follows the
/// symlink swap Kubernetes uses to update a mounted ConfigMap.
pub const POLL_INTERVAL: Duration = Duration::from_millis(200);

/// What tells a file changed: modification time, length and inode (after following symlinks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stamp {
    pub(crate) modified: Option<SystemTime>,
    len: u64,
    ino: u64,
}

pub(crate) fn stamp(path: &Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    // `metadata` follows symlinks: a swapped `..data` link changes the inode seen here.
    let m = std::fs::metadata(path).ok()?;
    Some(Stamp { modified: m.modified().ok(), len: m.len(), ino: m.ino() })
}

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
    last: Option<Stamp>,
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
        let mut tick = tokio::time::interval(POLL_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Self { last: stamp(&path), path, hup, tick }
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
                    let now = stamp(&self.path);
                    if now == self.last || now.is_none() {
                        continue;
                    }
                    Trigger::FileChanged
                }
            };
            self.last = stamp(&self.path);
            return why;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let quiet = tokio::time::timeout(POLL_INTERVAL * 3, w.next()).await;
        assert!(quiet.is_err(), "a vanished file is not a change");
        std::fs::write(dir.join("c.yaml"), "a: 3\n").unwrap();
        assert_eq!(next(&mut w).await, Some(Trigger::FileChanged));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
