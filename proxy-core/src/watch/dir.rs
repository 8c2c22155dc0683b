//! Watching a directory of small config files (one per shoot): which appeared, changed or went away, so only those are read and parsed.
//!
//! The directory is watched with inotify: an event names the entry that was created, renamed in
//! or out, deleted or closed after writing, so only that file is `stat`ed, read and parsed — no
//! listing of a directory of thousands of files per change. A hidden entry changing (a ConfigMap
//! mount's `..data` symlink swap) rescans the entries that are symlinks; an event-queue overflow
//! rescans everything; and every [`Poll::DIR_FULL_SCAN`] period a full scan (`stat` of every file)
//! catches what no event names (a hard link made with `ln`, a network filesystem that sends no
//! events). Where inotify cannot be had (its per-user instance or watch limit reached), the watch
//! polls instead: the directory's own metadata every [`Poll::DIR`] period (adding, removing or
//! renaming an entry changes its mtime; then the listing is compared) and every file every
//! [`Poll::DIR_FILES`] period.

use super::{Poll, Seen};
use crate::obs::metrics;
use crate::sync::Mutex;
use futures_util::{FutureExt, StreamExt};
use inotify::{EventMask, EventStream, Inotify, WatchMask};
use prometheus::{IntCounterVec, IntGauge, Registry};
use seedgate_config::ConfigError;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

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
    seen: Seen,
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
            let now = Seen::now(&path);
            if now.is_gone() {
                continue;
            }
            present.insert(name.clone());
            if known.is_some_and(|k| k.seen == now) {
                continue;
            }
            let file = path.display().to_string();
            let parsed = read_parse(&path, &file, parse);
            up.loaded.push((file, parsed));
            self.known.insert(name, Known { entry_ino, seen: now });
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

impl DirScan {
    /// Read and parse the named entries (watched names only) if they are new or changed; a named
    /// entry that is gone counts as removed. No listing of the directory.
    pub fn scan_named<T>(&mut self, names: &BTreeSet<String>, parse: Parse<T>) -> Update<T> {
        use std::os::unix::fs::MetadataExt;
        let mut up = Update { loaded: Vec::new(), removed: Vec::new() };
        for name in names.iter().filter(|n| is_watched(n)) {
            let path = self.dir.join(name);
            let entry = std::fs::symlink_metadata(&path).ok();
            // Follows symlinks; a dangling link is as good as gone.
            let now = Seen::now(&path);
            let Some(entry) = entry.filter(|_| !now.is_gone()) else {
                if self.known.remove(name).is_some() {
                    up.removed.push(path.display().to_string());
                }
                continue;
            };
            if self.known.get(name).is_some_and(|k| k.seen == now) {
                continue;
            }
            let file = path.display().to_string();
            up.loaded.push((file.clone(), read_parse(&path, &file, parse)));
            self.known.insert(name.clone(), Known { entry_ino: entry.ino(), seen: now });
        }
        up.loaded.sort_by(|a, b| a.0.cmp(&b.0));
        up.removed.sort();
        up
    }
}

fn read_parse<T>(path: &Path, file: &str, parse: Parse<T>) -> Result<T, ConfigError> {
    match std::fs::read_to_string(path) {
        Ok(text) => parse(&text, file),
        Err(e) => Err(ConfigError::internal(file, &format!("cannot read: {e}"))),
    }
}

/// What the next scan must look at.
#[derive(Debug, PartialEq, Eq)]
enum Dirty {
    /// Only these entries.
    Names(BTreeSet<String>),
    /// The listing (new, renamed and symlinked entries), without `stat`ing every file.
    Listing,
    /// Every file.
    Full,
}

impl Dirty {
    fn merge(self, other: Dirty) -> Dirty {
        match (self, other) {
            (Dirty::Full, _) | (_, Dirty::Full) => Dirty::Full,
            (Dirty::Listing, _) | (_, Dirty::Listing) => Dirty::Listing,
            (Dirty::Names(mut a), Dirty::Names(b)) => {
                a.extend(b);
                Dirty::Names(a)
            }
        }
    }

    /// What one inotify event on the directory asks for (`None`: nothing).
    fn of_event(mask: EventMask, name: Option<&str>) -> Option<Dirty> {
        if mask.intersects(EventMask::Q_OVERFLOW | EventMask::DELETE_SELF | EventMask::MOVE_SELF | EventMask::IGNORED) {
            return Some(Dirty::Full);
        }
        let name = name?;
        if name.starts_with('.') {
            // A ConfigMap's `..data` swap (or its timestamped directories): the visible entries
            // are symlinks through it.
            return mask
                .intersects(EventMask::MOVED_TO | EventMask::CREATE | EventMask::DELETE)
                .then_some(Dirty::Listing);
        }
        if !is_watched(name) {
            return None;
        }
        // A plain file created in place is read when it is closed after writing (CLOSE_WRITE),
        // not half-written at CREATE; a symlink only ever shows as CREATE, so CREATE counts too
        // (the scan of a still-empty file gives a refused file at worst, corrected at CLOSE_WRITE).
        mask.intersects(
            EventMask::CREATE
                | EventMask::MOVED_TO
                | EventMask::MOVED_FROM
                | EventMask::DELETE
                | EventMask::CLOSE_WRITE,
        )
        .then(|| Dirty::Names(BTreeSet::from([name.to_owned()])))
    }
}

/// The events of the directory (inotify), or polling where inotify cannot be had.
enum Source {
    Notify(EventStream<Vec<u8>>),
    Poll { dir: Seen },
}

fn notify(dir: &Path) -> std::io::Result<EventStream<Vec<u8>>> {
    let ino = Inotify::init()?;
    ino.watches().add(
        dir,
        WatchMask::CREATE
            | WatchMask::MOVED_TO
            | WatchMask::MOVED_FROM
            | WatchMask::DELETE
            | WatchMask::CLOSE_WRITE
            | WatchMask::DELETE_SELF
            | WatchMask::MOVE_SELF
            | WatchMask::ONLYDIR,
    )?;
    ino.into_event_stream(vec![0u8; 8192])
}

/// Wait for an event, then take every event already queued (a bounded number), merged.
async fn events(stream: &mut EventStream<Vec<u8>>) -> std::io::Result<Dirty> {
    let ended = || std::io::Error::other("the inotify event stream ended");
    let of = |e: inotify::EventOwned| Dirty::of_event(e.mask, e.name.as_deref().and_then(|n| n.to_str()));
    let mut dirty = of(stream.next().await.ok_or_else(ended)??).unwrap_or(Dirty::Names(BTreeSet::new()));
    // Bounded: a directory rewritten without pause must not keep the scan from running.
    for _ in 0..4096 {
        match stream.next().now_or_never() {
            None => break,
            Some(None) => return Err(ended()),
            Some(Some(e)) => {
                if let Some(d) = of(e?) {
                    dirty = dirty.merge(d);
                }
            }
        }
    }
    Ok(dirty)
}

/// Scans a directory when inotify reports a change in it (or when polling sees one); see the
/// module doc.
pub struct DirWatch<T> {
    scan: Arc<Mutex<DirScan>>,
    parse: Parse<T>,
    source: Source,
    last_full: Instant,
    tick: tokio::time::Interval,
}

impl<T: Send + 'static> DirWatch<T> {
    /// Scan `dir` once, completely (on a blocking thread), and return the watch with what the
    /// scan found. The inotify watch is set up first, so nothing changed during the scan is missed.
    pub async fn start(dir: impl Into<PathBuf>, parse: Parse<T>) -> (Self, Update<T>) {
        Self::start_with(dir, parse, Poll::DIR_FULL_SCAN.period()).await
    }

    /// [`DirWatch::start`] with another period of full scans when inotify works (tests make it
    /// long, to see that events alone find a change).
    async fn start_with(dir: impl Into<PathBuf>, parse: Parse<T>, full_scan: Duration) -> (Self, Update<T>) {
        let mut scan = DirScan::new(dir);
        let source = match notify(scan.dir()) {
            Ok(fd) => Source::Notify(fd),
            Err(e) => {
                tracing::warn!(dir = %scan.dir().display(), error = %e,
                    "cannot watch the directory with inotify (see fs.inotify.max_user_instances and max_user_watches); polling it instead");
                Source::Poll { dir: Seen::now(scan.dir()) }
            }
        };
        let (scan, first) = tokio::task::spawn_blocking(move || {
            let first = scan.scan(true, parse);
            (scan, first)
        })
        .await
        .expect("the first scan does not panic");
        let period = match source {
            Source::Notify(_) => full_scan,
            Source::Poll { .. } => Poll::DIR.period(),
        };
        let tick = Poll(period).ticker();
        let w = Self { scan: Arc::new(Mutex::new(scan)), parse, source, last_full: Instant::now(), tick };
        (w, first)
    }

    /// Whether changes are seen by inotify events (rather than by polling).
    pub fn notified(&self) -> bool {
        matches!(self.source, Source::Notify(_))
    }

    /// How many files are loaded or refused (i.e. present).
    pub fn files(&self) -> usize {
        self.scan.lock().len()
    }

    /// The next non-empty update. Reading and parsing run on a blocking thread.
    pub async fn next(&mut self) -> Update<T> {
        loop {
            let dirty = self.dirty().await;
            if dirty == Dirty::Names(BTreeSet::new()) {
                continue;
            }
            if dirty == Dirty::Full {
                self.last_full = Instant::now();
            }
            let (scan, parse) = (self.scan.clone(), self.parse);
            let up = tokio::task::spawn_blocking(move || {
                let mut scan = scan.lock();
                match &dirty {
                    Dirty::Names(names) => scan.scan_named(names, parse),
                    Dirty::Listing => scan.scan(false, parse),
                    Dirty::Full => scan.scan(true, parse),
                }
            })
            .await;
            match up {
                Ok(up) if !up.is_empty() => return up,
                Ok(_) => {}
                Err(e) => tracing::error!(error = %e, "directory scan failed"),
            }
        }
    }

    /// Hand every update to `apply` until `stop`, one at a time, on a blocking thread: applying
    /// rebuilds tables (CPU work proportional to their size, milliseconds at 10,000 entries),
    /// which must not stall live relays. `what` names the files in the log when applying fails.
    pub fn follow(
        mut self,
        stop: CancellationToken,
        what: &'static str,
        apply: impl Fn(Update<T>) + Send + Sync + 'static,
    ) {
        let apply = Arc::new(apply);
        tokio::spawn(async move {
            loop {
                let up = tokio::select! {
                    _ = stop.cancelled() => return,
                    up = self.next() => up,
                };
                let apply = apply.clone();
                if let Err(e) = tokio::task::spawn_blocking(move || apply(up)).await {
                    tracing::error!(error = %e, "applying {what} failed");
                }
            }
        });
    }

    /// Wait until something may have changed and say what to scan.
    async fn dirty(&mut self) -> Dirty {
        let dir = self.scan.lock().dir().to_owned();
        match &mut self.source {
            Source::Notify(fd) => {
                let got = tokio::select! {
                    got = events(fd) => got,
                    _ = self.tick.tick() => return Dirty::Full,
                };
                match got {
                    Ok(Dirty::Full) => {
                        // The queue overflowed, or the directory itself was removed or moved:
                        // watch it afresh (or poll, if it cannot be watched now) and rescan.
                        self.source = match notify(&dir) {
                            Ok(fd) => Source::Notify(fd),
                            Err(e) => {
                                tracing::warn!(dir = %dir.display(), error = %e, "cannot watch the directory again; polling it instead");
                                self.poll_from_now()
                            }
                        };
                        Dirty::Full
                    }
                    Ok(d) => d,
                    Err(e) => {
                        tracing::warn!(dir = %dir.display(), error = %e, "reading inotify events failed; polling the directory instead");
                        self.source = self.poll_from_now();
                        Dirty::Full
                    }
                }
            }
            Source::Poll { dir: seen } => loop {
                self.tick.tick().await;
                let full = self.last_full.elapsed() >= Poll::DIR_FILES.period();
                // A second entry added within the mtime clock tick of the one just seen leaves
                // the mtime as it is: while it is that recent, the next check scans again.
                if !seen.changed_settled(&dir, 2 * Poll::DIR.period()) && !full {
                    continue;
                }
                return if full { Dirty::Full } else { Dirty::Listing };
            },
        }
    }

    fn poll_from_now(&mut self) -> Source {
        self.tick = Poll::DIR.ticker();
        Source::Poll { dir: Seen::default() }
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
        let reloads = metrics::counter_vec(
            reg,
            &format!("seedgate_{kind}_file_reloads_total"),
            &format!("Files of the {kind} directory read, by result (success, failure, removed)."),
            &["result"],
        );
        metrics::at_zero(&reloads, &[&["success", "failure", "removed"]]);
        Self {
            reloads,
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

    /// Events alone (full scans pushed out of reach) see a file rewritten in place, a ConfigMap
    /// style `..data` swap, a rename over, and a removal.
    #[tokio::test]
    async fn inotify_events_name_what_changed() {
        let dir = std::env::temp_dir().join(format!("seedgate-dirnotify-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("..v1")).unwrap();
        std::fs::write(dir.join("..v1/cm.yaml"), "one").unwrap();
        std::os::unix::fs::symlink("..v1", dir.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/cm.yaml", dir.join("cm.yaml")).unwrap();
        std::fs::write(dir.join("a.yaml"), "a").unwrap();
        let (mut w, first) = DirWatch::start_with(&dir, parse_len, Duration::from_secs(3600)).await;
        assert!(w.notified(), "inotify is available here");
        assert_eq!(names(&first).0, vec!["a.yaml".to_owned(), "cm.yaml".to_owned()]);
        let next = async |w: &mut DirWatch<usize>| {
            tokio::time::timeout(Duration::from_secs(60), w.next()).await.expect("an update from an event")
        };
        // In place (the directory's listing does not change).
        std::fs::write(dir.join("a.yaml"), "aaaa").unwrap();
        let u = next(&mut w).await;
        assert_eq!(names(&u).0, vec!["a.yaml".to_owned()]);
        assert_eq!(u.loaded[0].1.as_ref().ok(), Some(&4));
        // The ConfigMap swap: a new timestamped directory, `..data` renamed over.
        std::fs::create_dir_all(dir.join("..v2")).unwrap();
        std::fs::write(dir.join("..v2/cm.yaml"), "two!").unwrap();
        std::os::unix::fs::symlink("..v2", dir.join("..data_tmp")).unwrap();
        std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
        let u = next(&mut w).await;
        assert_eq!(names(&u).0, vec!["cm.yaml".to_owned()]);
        assert_eq!(u.loaded[0].1.as_ref().ok(), Some(&4));
        // Written beside, renamed over; then removed.
        std::fs::write(dir.join("b.tmp"), "bad").unwrap();
        std::fs::rename(dir.join("b.tmp"), dir.join("b.yaml")).unwrap();
        let u = next(&mut w).await;
        assert_eq!(names(&u).0, vec!["b.yaml".to_owned()]);
        assert!(u.loaded[0].1.is_err());
        std::fs::remove_file(dir.join("a.yaml")).unwrap();
        let u = next(&mut w).await;
        assert_eq!(names(&u), (vec![], vec!["a.yaml".to_owned()]));
        assert_eq!(w.files(), 2);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn events_map_to_what_is_scanned() {
        let n = |s: &str| Some(Dirty::Names(BTreeSet::from([s.to_owned()])));
        assert_eq!(Dirty::of_event(EventMask::MOVED_TO, Some("a.yaml")), n("a.yaml"));
        assert_eq!(Dirty::of_event(EventMask::CLOSE_WRITE, Some("a.yaml")), n("a.yaml"));
        assert_eq!(Dirty::of_event(EventMask::DELETE, Some("a.yaml")), n("a.yaml"));
        assert_eq!(Dirty::of_event(EventMask::CLOSE_WRITE, Some("a.tmp")), None, "not a watched name");
        assert_eq!(Dirty::of_event(EventMask::MOVED_TO, Some("..data")), Some(Dirty::Listing));
        assert_eq!(Dirty::of_event(EventMask::Q_OVERFLOW, None), Some(Dirty::Full));
        assert_eq!(Dirty::of_event(EventMask::DELETE_SELF, None), Some(Dirty::Full));
        assert_eq!(
            n("a.yaml").unwrap().merge(n("b.yaml").unwrap()),
            Dirty::Names(["a.yaml", "b.yaml"].map(String::from).into())
        );
        assert_eq!(n("a.yaml").unwrap().merge(Dirty::Listing), Dirty::Listing);
        assert_eq!(Dirty::Listing.merge(Dirty::Full), Dirty::Full);
    }
}
