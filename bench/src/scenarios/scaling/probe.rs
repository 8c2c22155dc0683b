//! What the kernel tells about a measuring window without perf: busy time of a set of CPUs (`/proc/stat`), each thread's CPU time, context switches and run-queue wait (`/proc/<pid>/task/*`), and where the threads are, sampled (`/proc/<pid>/task/*/syscall`).

use crate::host;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Ticks of one CPU from `/proc/stat`: user, nice, system, idle, iowait, irq, softirq, steal.
type Ticks = [u64; 8];

/// The ticks of each CPU of a set, in the set's order (missing CPUs count nothing).
pub(crate) fn cpu_ticks(cpus: &[usize]) -> Vec<Ticks> {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let mut by_cpu = BTreeMap::new();
    for line in stat.lines() {
        let Some(rest) = line.strip_prefix("cpu") else { continue };
        let mut f = rest.split_whitespace();
        let Some(Ok(cpu)) = f.next().map(str::parse::<usize>) else { continue };
        let mut t = [0u64; 8];
        for (slot, v) in t.iter_mut().zip(f) {
            *slot = v.parse().unwrap_or(0);
        }
        by_cpu.insert(cpu, t);
    }
    cpus.iter().map(|c| by_cpu.get(c).copied().unwrap_or_default()).collect()
}

/// How busy a set of CPUs was between two readings: fractions of its time (0–1), averaged
/// over the set, and the busy CPU-seconds in all.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CpuUse {
    pub busy: f64,
    pub user: f64,
    pub system: f64,
    pub softirq: f64,
    pub busy_s: f64,
}

pub(crate) fn cpu_use(before: &[Ticks], after: &[Ticks]) -> CpuUse {
    let hz = clock_ticks();
    let (mut total, mut busy, mut user, mut system, mut soft) = (0u64, 0u64, 0u64, 0u64, 0u64);
    for (b, a) in before.iter().zip(after) {
        let d: Vec<u64> = a.iter().zip(b).map(|(x, y)| x.saturating_sub(*y)).collect();
        let all: u64 = d.iter().sum();
        total += all;
        busy += all - d[3] - d[4];
        user += d[0] + d[1];
        system += d[2] + d[5];
        soft += d[6];
    }
    if total == 0 {
        return CpuUse::default();
    }
    let f = |x: u64| x as f64 / total as f64;
    CpuUse { busy: f(busy), user: f(user), system: f(system), softirq: f(soft), busy_s: busy as f64 / hz }
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf takes an integer and touches no memory of ours.
    #[allow(unsafe_code)]
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 { hz as f64 } else { 100.0 }
}

/// One thread's counters.
#[derive(Debug, Clone)]
pub(crate) struct ThreadSnap {
    pub tid: u32,
    pub comm: String,
    /// utime + stime, in ticks.
    ticks: u64,
    voluntary: u64,
    involuntary: u64,
    /// From `schedstat`: time waiting on a run queue (ns).
    wait_ns: u64,
}

/// Every thread of `pids` and their descendants.
pub(crate) fn threads(pids: &[u32]) -> Vec<ThreadSnap> {
    let mut all: Vec<u32> = pids.iter().flat_map(|&p| host::process_tree(p)).collect();
    all.sort_unstable();
    all.dedup();
    let mut out = Vec::new();
    for p in all {
        let Ok(rd) = std::fs::read_dir(format!("/proc/{p}/task")) else { continue };
        for e in rd.flatten() {
            let Some(tid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
            let base = e.path();
            let Ok(stat) = std::fs::read_to_string(base.join("stat")) else { continue };
            let comm = stat.split_once('(').and_then(|(_, r)| r.rsplit_once(')')).map(|(c, _)| c.to_owned());
            let rest: Vec<&str> =
                stat.rsplit_once(')').map(|(_, r)| r.split_whitespace().collect()).unwrap_or_default();
            let num = |i: usize| rest.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            let status = std::fs::read_to_string(base.join("status")).unwrap_or_default();
            let field = |k: &str| {
                status.lines().find_map(|l| l.strip_prefix(k)).and_then(|v| v.trim().parse::<u64>().ok()).unwrap_or(0)
            };
            let sched = std::fs::read_to_string(base.join("schedstat")).unwrap_or_default();
            out.push(ThreadSnap {
                tid,
                comm: comm.unwrap_or_default(),
                ticks: num(11) + num(12),
                voluntary: field("voluntary_ctxt_switches:"),
                involuntary: field("nonvoluntary_ctxt_switches:"),
                wait_ns: sched.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or(0),
            });
        }
    }
    out
}

/// What the threads did between two readings over `secs` seconds.
#[derive(Debug, Clone, Default)]
pub(crate) struct ThreadUse {
    /// CPU of each thread that used any, as a fraction of the window, busiest first.
    pub busy: Vec<(String, f64)>,
    pub cpu_s: f64,
    pub voluntary: u64,
    pub involuntary: u64,
    /// Time the threads waited on a run queue for a CPU (s, summed).
    pub wait_s: f64,
}

pub(crate) fn thread_use(before: &[ThreadSnap], after: &[ThreadSnap], secs: f64) -> ThreadUse {
    let hz = clock_ticks();
    let mut u = ThreadUse::default();
    for a in after {
        // A thread that started during the window counts from zero.
        let b = before.iter().find(|b| b.tid == a.tid);
        let d = |f: fn(&ThreadSnap) -> u64| f(a).saturating_sub(b.map_or(0, f));
        let cpu = d(|t| t.ticks) as f64 / hz;
        u.cpu_s += cpu;
        u.voluntary += d(|t| t.voluntary);
        u.involuntary += d(|t| t.involuntary);
        u.wait_s += d(|t| t.wait_ns) as f64 / 1e9;
        if cpu > 0.0 && secs > 0.0 {
            u.busy.push((a.comm.clone(), cpu / secs));
        }
    }
    u.busy.sort_by(|x, y| y.1.total_cmp(&x.1));
    u
}

/// Samples, every 10 ms until stopped, what each thread of some processes is doing: running
/// in user space, or which system call it waits in.
pub(crate) struct Sampler {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<BTreeMap<String, u64>>,
}

/// The name of an x86-64 system call number as `/proc/<tid>/syscall` gives it (the usual
/// ones of a proxy; others by number).
fn syscall_name(nr: &str) -> String {
    let known = if cfg!(target_arch = "x86_64") {
        match nr {
            "0" => Some("read"),
            "1" => Some("write"),
            "3" => Some("close"),
            "7" => Some("poll"),
            "20" => Some("writev"),
            "35" => Some("nanosleep"),
            "42" => Some("connect"),
            "43" => Some("accept"),
            "44" => Some("sendto"),
            "45" => Some("recvfrom"),
            "46" => Some("sendmsg"),
            "47" => Some("recvmsg"),
            "48" => Some("shutdown"),
            "61" => Some("wait4"),
            "130" => Some("rt_sigsuspend"),
            "202" => Some("futex"),
            "230" => Some("clock_nanosleep"),
            "232" => Some("epoll_wait"),
            "233" => Some("epoll_ctl"),
            "281" => Some("epoll_pwait"),
            "271" => Some("ppoll"),
            "288" => Some("accept4"),
            "441" => Some("epoll_pwait2"),
            _ => None,
        }
    } else {
        None
    };
    known.map_or_else(|| format!("syscall {nr}"), str::to_owned)
}

impl Sampler {
    pub(crate) fn start(pids: Vec<u32>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let handle = std::thread::spawn(move || {
            let tids: Vec<(u32, u32)> = threads(&pids)
                .iter()
                .filter_map(|t| {
                    let pid = std::fs::read_to_string(format!("/proc/{}/status", t.tid))
                        .ok()?
                        .lines()
                        .find_map(|l| l.strip_prefix("Tgid:"))?
                        .trim()
                        .parse()
                        .ok()?;
                    Some((pid, t.tid))
                })
                .collect();
            let mut counts = BTreeMap::new();
            // Until told to stop (the window's end); each round reads one small file per thread.
            while !s.load(Ordering::Relaxed) {
                for (pid, tid) in &tids {
                    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall")) else { continue };
                    let what = match text.split_whitespace().next() {
                        Some("running") => "running (user space)".to_owned(),
                        Some("-1") => "in the kernel, not in a system call".to_owned(),
                        Some(nr) => syscall_name(nr),
                        None => continue,
                    };
                    *counts.entry(what).or_insert(0u64) += 1;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            counts
        });
        Self { stop, handle }
    }

    /// Stop and return the samples by state.
    pub(crate) fn finish(self) -> BTreeMap<String, u64> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap_or_default()
    }
}

/// "running (user space) 41%, epoll_wait 35%, …": the largest shares of the samples.
pub(crate) fn describe_samples(counts: &BTreeMap<String, u64>) -> String {
    let total: u64 = counts.values().sum();
    if total == 0 {
        return "no samples".into();
    }
    let mut v: Vec<(&String, &u64)> = counts.iter().collect();
    v.sort_by(|a, b| b.1.cmp(a.1));
    v.iter()
        .take(6)
        .map(|(k, n)| format!("{k} {:.0}%", **n as f64 * 100.0 / total as f64))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_machine() {
        let cpus = host::allowed_cpus();
        let a = cpu_ticks(&cpus);
        assert_eq!(a.len(), cpus.len());
        // Burn a little CPU so the second reading differs.
        let t0 = std::time::Instant::now();
        let mut x = 0u64;
        while t0.elapsed() < Duration::from_millis(30) {
            x = x.wrapping_mul(31).wrapping_add(1);
        }
        std::hint::black_box(x);
        let u = cpu_use(&a, &cpu_ticks(&cpus));
        assert!((0.0..=1.0).contains(&u.busy), "{u:?}");
        let me = threads(&[std::process::id()]);
        assert!(!me.is_empty());
        let s = Sampler::start(vec![std::process::id()]);
        std::thread::sleep(Duration::from_millis(50));
        let counts = s.finish();
        assert!(counts.values().sum::<u64>() > 0, "{counts:?}");
        assert!(!describe_samples(&counts).is_empty());
    }
}
