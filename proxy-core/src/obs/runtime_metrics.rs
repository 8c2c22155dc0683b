//! Gauges of the tokio runtime and the process (tasks, workers, open fds, RSS), read at each scrape.
//!
//! A [`Collector`] rather than a ticker: the figures are read only when `/metrics` is asked for,
//! so an idle process does no work for them and a scrape always sees the current values. The
//! prometheus crate's own process collector is not compiled in (default features off), hence
//! the two `seedgate_process_*` gauges.

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntGauge, Registry};

/// Names of the gauges, for tests and the bench.
pub const ALIVE_TASKS: &str = "seedgate_runtime_alive_tasks";
pub const WORKERS: &str = "seedgate_runtime_workers";
pub const OPEN_FDS: &str = "seedgate_process_open_fds";
pub const RESIDENT_MEMORY: &str = "seedgate_process_resident_memory_bytes";

/// Reads the runtime's and the process's figures into its gauges whenever it is collected.
pub struct RuntimeCollector {
    /// The runtime the process serves from; `None` outside one (then only the process gauges).
    handle: Option<tokio::runtime::Handle>,
    alive_tasks: IntGauge,
    workers: IntGauge,
    open_fds: IntGauge,
    resident: IntGauge,
}

impl RuntimeCollector {
    /// Watch the runtime this is called from (if any) and the current process.
    pub fn new() -> Self {
        let g = |name: &str, help: &str| IntGauge::new(name, help).expect("valid metric");
        Self {
            handle: tokio::runtime::Handle::try_current().ok(),
            alive_tasks: g(ALIVE_TASKS, "Tokio tasks spawned and not yet finished (read at scrape)."),
            workers: g(WORKERS, "Worker threads of the tokio runtime."),
            open_fds: g(OPEN_FDS, "Open file descriptors of the process (read at scrape)."),
            resident: g(RESIDENT_MEMORY, "Resident memory of the process in bytes (read at scrape)."),
        }
    }

    /// Read every figure now (what a scrape does before encoding).
    pub fn refresh(&self) {
        if let Some(h) = &self.handle {
            let m = h.metrics();
            self.alive_tasks.set(as_i64(m.num_alive_tasks()));
            self.workers.set(as_i64(m.num_workers()));
        }
        if let Some(n) = open_fds() {
            self.open_fds.set(as_i64(n));
        }
        if let Some(b) = resident_bytes() {
            self.resident.set(i64::try_from(b).unwrap_or(i64::MAX));
        }
    }

    fn gauges(&self) -> [&IntGauge; 4] {
        [&self.alive_tasks, &self.workers, &self.open_fds, &self.resident]
    }
}

impl Default for RuntimeCollector {
    fn default() -> Self {
        Self::new()
    }
}

impl Collector for RuntimeCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.gauges().into_iter().flat_map(|g| g.desc()).collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        self.refresh();
        self.gauges().into_iter().flat_map(|g| g.collect()).collect()
    }
}

fn as_i64(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Register a [`RuntimeCollector`] for the calling runtime. A registry that has one already
/// (several binaries sharing a registry in tests) keeps it.
pub fn register(reg: &Registry) {
    if let Err(e) = crate::obs::metrics::register(reg, Box::new(RuntimeCollector::new())) {
        tracing::debug!(error = %e, "runtime gauges already registered");
    }
}

/// Entries of `/proc/self/fd`, without the one the listing itself holds open.
pub fn open_fds() -> Option<usize> {
    let n = std::fs::read_dir("/proc/self/fd").ok()?.count();
    Some(n.saturating_sub(1))
}

/// Resident set size from `/proc/self/statm` (its second field, in pages).
pub fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * page_size())
}

fn page_size() -> u64 {
    // SAFETY: sysconf takes an integer and reads no memory of ours.
    #[allow(unsafe_code)]
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(text: &str, name: &str) -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} missing in:\n{text}"))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn gauges_follow_tasks_fds_and_memory() {
        let reg = Registry::new();
        register(&reg);
        // A second registration (a shared registry) is not an error.
        register(&reg);
        let before = crate::obs::metrics::render(&reg);
        assert_eq!(value(&before, WORKERS), 2.0, "{before}");
        assert!(value(&before, RESIDENT_MEMORY) > 1e6, "{before}");

        // 50 tasks that stay alive until told, and 200 more open files (the margins leave room
        // for descriptors other tests of this process open and close meanwhile).
        let stop = tokio_util::sync::CancellationToken::new();
        let tasks: Vec<_> = (0..50)
            .map(|_| {
                let stop = stop.clone();
                tokio::spawn(async move { stop.cancelled().await })
            })
            .collect();
        let files: Vec<_> = (0..200).map(|_| std::fs::File::open("/proc/self/statm").unwrap()).collect();
        let during = crate::obs::metrics::render(&reg);
        assert!(value(&during, ALIVE_TASKS) >= value(&before, ALIVE_TASKS) + 50.0, "{before}\n{during}");
        assert!(value(&during, OPEN_FDS) >= value(&before, OPEN_FDS) + 150.0, "{before}\n{during}");

        stop.cancel();
        for t in tasks {
            t.await.unwrap();
        }
        drop(files);
        let after = crate::obs::metrics::render(&reg);
        // A finished task leaves the runtime's count just after its join handle resolves, so one
        // or two may still show: the margin is 45 of the 50.
        assert!(value(&after, ALIVE_TASKS) <= value(&during, ALIVE_TASKS) - 45.0, "{during}\n{after}");
        assert!(value(&after, OPEN_FDS) <= value(&during, OPEN_FDS) - 150.0, "{during}\n{after}");

        // 64 MiB touched page by page shows in RSS.
        let big = std::hint::black_box(vec![1u8; 64 << 20]);
        let grown = crate::obs::metrics::render(&reg);
        assert!(value(&grown, RESIDENT_MEMORY) >= value(&after, RESIDENT_MEMORY) + 32e6, "{after}\n{grown}");
        drop(big);
    }
}
