//! Files that reload themselves: the config file (with SIGHUP), a directory of per-shoot files, and TLS material.
//!
//! All three watchers tell a change the same way ([`Seen`]: modification time, length and inode,
//! after following symlinks) and poll on the same kind of timer ([`Poll`]): polling (rather than
//! inotify alone) also follows the symlink swap Kubernetes uses to update a mounted ConfigMap or
//! Secret.

pub mod config;
pub mod dir;
pub mod tls;

use std::path::Path;
use std::time::{Duration, SystemTime};

/// What tells a file changed: modification time, length and inode (after following symlinks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
    ino: u64,
}

impl Stamp {
    /// The file's stamp now; `None` when it is gone (or a dangling link).
    pub(crate) fn of(path: &Path) -> Option<Stamp> {
        use std::os::unix::fs::MetadataExt;
        // `metadata` follows symlinks: a swapped `..data` link changes the inode seen here.
        let m = std::fs::metadata(path).ok()?;
        Some(Stamp { modified: m.modified().ok(), len: m.len(), ino: m.ino() })
    }

    /// Whether the modification time is within `window` of now. The kernel stamps mtimes with a
    /// coarse clock: a second write within the same tick leaves the stamp as it is, so a stamp
    /// this recent cannot yet be trusted to tell the next change.
    fn is_recent(&self, window: Duration) -> bool {
        self.modified.is_some_and(|m| SystemTime::now().duration_since(m).unwrap_or_default() < window)
    }
}

/// One file as last looked at: says whether it changed since.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Seen(Option<Stamp>);

impl Seen {
    /// Look at `path` now.
    pub(crate) fn now(path: &Path) -> Self {
        Self(Stamp::of(path))
    }

    /// Whether the file is gone (or was, at the last look).
    pub(crate) fn is_gone(&self) -> bool {
        self.0.is_none()
    }

    /// Look again and remember it: whether the file differs from the last look (appearing and
    /// vanishing are changes).
    pub(crate) fn changed(&mut self, path: &Path) -> bool {
        let now = Self::now(path);
        let changed = now != *self;
        *self = now;
        changed
    }

    /// Like [`Seen::changed`], but a file that is gone is no change and is not remembered: its
    /// reappearance is compared with what was there before (a file replaced mid-swap).
    pub(crate) fn changed_present(&mut self, path: &Path) -> bool {
        let now = Self::now(path);
        if now.is_gone() {
            return false;
        }
        let changed = now != *self;
        *self = now;
        changed
    }

    /// Like [`Seen::changed`], but a stamp whose mtime is within `window` of now is not
    /// remembered (see [`Stamp::is_recent`]): the next look reports a change again.
    pub(crate) fn changed_settled(&mut self, path: &Path, window: Duration) -> bool {
        let now = Self::now(path);
        let changed = now != *self;
        *self = match &now.0 {
            Some(s) if s.is_recent(window) => Seen(None),
            _ => now,
        };
        changed
    }
}

/// How often a watcher looks. One policy for every watcher: the first look is one period after
/// the start (the start took its own look), and looks missed while the runtime was busy are not
/// made up in a burst.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Poll(pub Duration);

impl Poll {
    /// The config file.
    pub const CONFIG: Poll = Poll(Duration::from_millis(200));
    /// Each file of a watched directory, when inotify cannot be had.
    pub const DIR_FILES: Poll = Poll(Duration::from_millis(200));
    /// A watched directory's own metadata, when inotify cannot be had.
    pub const DIR: Poll = Poll(Duration::from_millis(10));
    /// With inotify: every file of a watched directory, for changes no event names.
    pub const DIR_FULL_SCAN: Poll = Poll(Duration::from_secs(10));
    /// TLS certificate, key and CA files: rotations show up within this (plus the build time).
    pub const TLS: Poll = Poll(Duration::from_secs(1));

    pub fn period(self) -> Duration {
        self.0
    }

    /// The timer of this policy, from now.
    pub(crate) fn ticker(self) -> tokio::time::Interval {
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + self.0, self.0);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_look_tells_a_change_a_vanishing_and_a_return() {
        let dir = std::env::temp_dir().join(format!("seedgate-seen-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("a.yaml");
        std::fs::write(&f, "a: 1\n").unwrap();
        let (mut any, mut present) = (Seen::now(&f), Seen::now(&f));
        assert!(!any.changed(&f) && !present.changed_present(&f), "nothing changed yet");
        std::fs::write(&f, "a: 12\n").unwrap();
        assert!(any.changed(&f) && present.changed_present(&f), "a new length is a change");
        assert!(!any.changed(&f) && !present.changed_present(&f), "a change is reported once");
        std::fs::remove_file(&f).unwrap();
        assert!(any.changed(&f), "vanishing is a change");
        assert!(!present.changed_present(&f), "... unless only present files count");
        assert!(!any.changed(&f) && !present.changed_present(&f));
        std::fs::write(&f, "a: 3\n").unwrap();
        assert!(any.changed(&f) && present.changed_present(&f), "a return is a change");
        let mut settled = Seen::default();
        assert!(settled.changed_settled(&f, Duration::from_secs(3600)), "appeared");
        assert!(settled.changed_settled(&f, Duration::from_secs(3600)), "too recent to be trusted: again");
        assert!(settled.changed_settled(&f, Duration::ZERO));
        assert!(!settled.changed_settled(&f, Duration::ZERO), "settled: no change");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_look_is_one_period_after_the_start() {
        let started = tokio::time::Instant::now();
        let mut tick = Poll::TLS.ticker();
        tick.tick().await;
        assert_eq!(started.elapsed(), Poll::TLS.period());
        tick.tick().await;
        assert_eq!(started.elapsed(), 2 * Poll::TLS.period());
    }
}
