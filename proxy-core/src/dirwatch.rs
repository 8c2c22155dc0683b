//! Watching a directory of small config files (one per shoot): which appeared, changed or went away, so only those are read and parsed.
//!
//! The directory's own metadata is checked every [`DIR_POLL_INTERVAL`]: adding, removing or
//! renaming an entry changes its mtime, so a file written beside and renamed into place (as
//! tools and Kubernetes' ConfigMap mounts do) is seen within that, and such a check costs one
//! `stat`. Only then is the directory listed, and only entries that are new or carry a new inode
//! are `stat`ed. Every [`POLL_INTERVAL`] all files are `stat`ed (following symlinks), which
//! catches a file rewritten in place (that leaves the directory untouched). Polling rather than
//! inotify: the same code follows symlink swaps, needs no extra dependency, and its cost is
//! bounded and visible.

use crate::metrics;
use crate::reload::{POLL_INTERVAL, Stamp, stamp};
use prometheus::{IntCounterVec, IntGauge, Registry};
use seedgate_config::ConfigError;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// How often the directory's own metadata is checked.
pub const DIR_POLL_INTERVAL: Duration = Duration::from_millis(10);

/// A parser of one file's text (`file` names it in messages), e.g. `parse_route_file`.
pub type Parse<T> = fn(&str, &str) -> Result<T, ConfigError>;

/// Files new or changed since the last scan (read and parsed, in name order), and files gone.
#[derive(Debug)]
pub struct Update<T> {
    /// The file's path (as messages name it) and what parsing it gave.
    pub loaded: Vec<(String, Result<T, ConfigError>)>,
    pub removed: Vec<String>,
}

impl<T> Update<T> {
    pub fn is_empty(&self) -> bool {
        self.loaded.is_empty() && self.removed.is_empty()
    }
}

/// Whether a directory entry is a watched file: `*.yaml` and not hidden (a ConfigMap mount's
/// `..data` and `..2024_01_01...` entries are hidden).
pub fn is_watched(name: &str) -> bool {
    !name.starts_with('.') && name.ends_with(".yaml")
}

struct Known {
    /// The directory entry's inode (the link itself for a symlink): a file renamed over it shows.
    entry_ino: u64,
    stamp: Stamp,
}

/// The files of one directory as last seen. Scans block (they read the disk): run them off the
/// runtime.
pub struct DirScan {
    dir: PathBuf,
    known: HashMap<String, Known>,
    unreadable: bool,
}

impl DirScan {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into(), known: HashMap::new(), unreadable: false }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// How many files are known.
    pub fn len(&self) -> usize {
        self.known.len()
    }

    pub fn is_empty(&self) -> bool {
        self.known.is_empty()
    }

    /// List the directory; read and parse the files that are new or changed. `full`: `stat`
    /// every file; otherwise only entries that are new, carry a new inode, or are symlinks.
    pub fn scan<T>(&mut self, full: bool, parse: Parse<T>) -> Update<T> {
        use std::os::unix::fs::DirEntryExt;
        let mut up = Update { loaded: Vec::new(), removed: Vec::new() };
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(rd) => rd,
            Err(e) => {
                // Like a config file that vanished mid-swap: what is loaded stays in force.
                if !self.unreadable {
                    tracing::error!(dir = %self.dir.display(), error = %e, "cannot list the directory; keeping what is loaded");
                }
                self.unreadable = true;
                return up;
            }
        };
        self.unreadable = false;
        let mut present = HashSet::with_capacity(self.known.len());
        for entry in entries.flatten() {
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else { continue };
            if !is_watched(&name) {
                continue;
            }
            let entry_ino = entry.ino();
            let symlink = entry.file_type().is_ok_and(|t| t.is_symlink());
            let known = self.known.get(&name);
            if !full && !symlink && known.is_some_and(|k| k.entry_ino == entry_ino) {
                present.insert(name);
                continue;
            }
            let path = self.dir.join(&name);
            // Follows symlinks; a file gone between listing and now counts as removed.
            let Some(now) = stamp(&path) else { continue };
            present.insert(name.clone());
            if known.is_some_and(|k| k.stamp == now) {
                continue;
            }
            let file = path.display().to_string();
            let parsed = match std::fs::read_to_string(&path) {
                Ok(text) => parse(&text, &file),
                Err(e) => Err(ConfigError::internal(&file, &format!("cannot read: {e}"))),
            };
            up.loaded.push((file, parsed));
            self.known.insert(name, Known { entry_ino, stamp: now });
        }
        let gone: Vec<String> = self.known.keys().filter(|n| !present.contains(*n)).cloned().collect();
        for name in gone {
            self.known.remove(&name);
            up.removed.push(self.dir.join(&name).display().to_string());
        }
        up.loaded.sort_by(|a, b| a.0.cmp(&b.0));
        up.removed.sort();
        up
    }
}

/// Scans a directory when it or (every [`POLL_INTERVAL`]) its files change; see the module doc.
pub struct DirWatch<T> {
    scan: Arc<Mutex<DirScan>>,
    parse: Parse<T>,
    dir_stamp: Option<Stamp>,
    last_full: Instant,
    tick: tokio::time::Interval,
}

impl<T: Send + 'static> DirWatch<T> {
    /// Scan `dir` once, completely (on a blocking thread), and return the watch with what the
    /// scan found.
    pub async fn start(dir: impl Into<PathBuf>, parse: Parse<T>) -> (Self, Update<T>) {
        let mut scan = DirScan::new(dir);
        let dir_stamp = stamp(scan.dir());
        let (scan, first) = tokio::task::spawn_blocking(move || {
            let first = scan.scan(true, parse);
            (scan, first)
        })
        .await
        .expect("the first scan does not panic");
        let mut tick = tokio::time::interval(DIR_POLL_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let w = Self { scan: Arc::new(Mutex::new(scan)), parse, dir_stamp, last_full: Instant::now(), tick };
        (w, first)
    }

    /// How many files are loaded or refused (i.e. present).
    pub fn files(&self) -> usize {
        self.scan.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// The next non-empty update. Reading and parsing run on a blocking thread.
    pub async fn next(&mut self) -> Update<T> {
        loop {
            self.tick.tick().await;
            let dir = self.scan.lock().unwrap_or_else(|e| e.into_inner()).dir().to_owned();
            let now = stamp(&dir);
            let full = self.last_full.elapsed() >= POLL_INTERVAL;
            if now == self.dir_stamp && !full {
                continue;
            }
            // The kernel stamps mtimes with a coarse clock: a second entry added within the same
            // clock tick as the one just seen leaves the mtime as it is. So while the mtime is
            // that recent, the next check scans again.
            let recent = now
                .as_ref()
                .and_then(|s| s.modified)
                .is_some_and(|m| SystemTime::now().duration_since(m).unwrap_or_default() < 2 * DIR_POLL_INTERVAL);
            self.dir_stamp = if recent { None } else { now };
            if full {
                self.last_full = Instant::now();
            }
            let (scan, parse) = (self.scan.clone(), self.parse);
            let up =
                tokio::task::spawn_blocking(move || scan.lock().unwrap_or_else(|e| e.into_inner()).scan(full, parse))
                    .await;
            match up {
                Ok(up) if !up.is_empty() => return up,
                Ok(_) => {}
                Err(e) => tracing::error!(dir = %dir.display(), error = %e, "directory scan failed"),
            }
        }
    }
}

/// Counters of one watched directory's files.
#[derive(Clone)]
pub struct FileMetrics {
    /// Files read by result (`success`, `failure`, `removed`).
    pub reloads: IntCounterVec,
    /// Files in force.
    pub files: IntGauge,
}

impl FileMetrics {
    /// `kind` names the files in the metric names: `seedgate_<kind>_file_reloads_total`, `seedgate_<kind>_files`.
    pub fn new(reg: &Registry, kind: &str) -> Self {
        Self {
            reloads: metrics::counter_vec(
                reg,
                &format!("seedgate_{kind}_file_reloads_total"),
                &format!("Files of the {kind} directory read, by result (success, failure, removed)."),
                &["result"],
            ),
            files: metrics::gauge(
                reg,
                &format!("seedgate_{kind}_files"),
                &format!("Files of the {kind} directory in force."),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_len(text: &str, file: &str) -> Result<usize, ConfigError> {
        if text.starts_with("bad") { Err(ConfigError::internal(file, "bad")) } else { Ok(text.len()) }
    }

    fn names<T>(u: &Update<T>) -> (Vec<String>, Vec<String>) {
        let base = |p: &String| Path::new(p).file_name().and_then(|n| n.to_str()).unwrap_or_default().to_owned();
        (u.loaded.iter().map(|(f, _)| base(f)).collect(), u.removed.iter().map(base).collect())
    }

    #[test]
    fn only_new_changed_and_removed_files_are_reported() {
        let dir = std::env::temp_dir().join(format!("seedgate-dirscan-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("v1")).unwrap();
        std::fs::write(dir.join("a.yaml"), "a").unwrap();
        std::fs::write(dir.join("b.yaml"), "bb").unwrap();
        std::fs::write(dir.join("notes.txt"), "x").unwrap();
        std::fs::write(dir.join(".hidden.yaml"), "x").unwrap();
        std::fs::write(dir.join("v1/c.yaml"), "ccc").unwrap();
        std::os::unix::fs::symlink("v1", dir.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/c.yaml", dir.join("c.yaml")).unwrap();
        let mut s = DirScan::new(&dir);
        let u = s.scan(true, parse_len);
        assert_eq!(names(&u), (vec!["a.yaml".into(), "b.yaml".into(), "c.yaml".into()], vec![]));
        assert_eq!(u.loaded[2].1.as_ref().ok(), Some(&3));
        assert!(s.scan(true, parse_len).is_empty());
        // Renamed over (new inode): seen without a full scan.
        std::fs::write(dir.join("a.tmp"), "bad").unwrap();
        std::fs::rename(dir.join("a.tmp"), dir.join("a.yaml")).unwrap();
        std::fs::remove_file(dir.join("b.yaml")).unwrap();
        let u = s.scan(false, parse_len);
        assert_eq!(names(&u), (vec!["a.yaml".into()], vec!["b.yaml".into()]));
        assert!(u.loaded[0].1.is_err());
        // Rewritten in place: only a full scan sees it (the periodic one).
        std::fs::write(dir.join("c.yaml"), "cccc").unwrap();
        std::fs::write(dir.join("a.yaml"), "aaaaa").unwrap();
        assert_eq!(names(&s.scan(false, parse_len)).0, vec!["c.yaml".to_owned()], "symlinks are always stat'ed");
        assert_eq!(names(&s.scan(true, parse_len)).0, vec!["a.yaml".to_owned()]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_new_file_is_seen_without_waiting_for_the_full_scan() {
        let dir = std::env::temp_dir().join(format!("seedgate-dirwatch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (mut w, first) = DirWatch::start(&dir, parse_len).await;
        assert!(first.is_empty());
        std::fs::write(dir.join("n.tmp"), "new").unwrap();
        std::fs::rename(dir.join("n.tmp"), dir.join("n.yaml")).unwrap();
        let u = tokio::time::timeout(Duration::from_secs(10), w.next()).await.expect("an update");
        assert_eq!(names(&u).0, vec!["n.yaml".to_owned()]);
        assert_eq!(w.files(), 1);
        std::fs::remove_file(dir.join("n.yaml")).unwrap();
        let u = tokio::time::timeout(Duration::from_secs(10), w.next()).await.expect("an update");
        assert_eq!(names(&u).1, vec!["n.yaml".to_owned()]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
