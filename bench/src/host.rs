//! The machine: CPU pinning, the fd limit, facts for the report header, process memory, ports.

use anyhow::{Context as _, ensure};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};

/// The soft fd limit the harness raises itself (and so its children) to.
pub(crate) const NOFILE: u64 = 20_000;

/// How processes are placed on CPUs for a run.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Pinning {
    /// CPU the systems under test run on (`taskset -c`), if pinning.
    pub proxy_cpu: Option<usize>,
    /// CPU the harness (load generators, backends, echo helper) runs on (sched_setaffinity).
    pub load_cpu: Option<usize>,
    /// `GLIBC_TUNABLES` of every system under test, seedgate and anchors alike.
    pub glibc_tunables: Option<String>,
    /// Systems under test on these CPUs instead of `proxy_cpu` (a `taskset -c` list).
    #[serde(skip)]
    pub proxy_set: Option<String>,
    /// Every CPU the harness could use before it pinned itself.
    #[serde(skip)]
    pub cpus: Vec<usize>,
}

impl Pinning {
    pub(crate) fn describe(&self) -> String {
        match (self.proxy_cpu, self.load_cpu) {
            (Some(p), Some(l)) => format!(
                "systems under test (every process of a proxy or tunnel, seedgate and anchors alike) on CPU {p} with `taskset -c {p}`; \
                 load generators, backends and the echo helper on CPU {l} (sched_setaffinity); one worker thread/process per system"
            ),
            _ => "not pinned (fewer than 2 CPUs available)".into(),
        }
    }

    /// How the systems' environment differs from the harness's, for the report.
    pub(crate) fn describe_env(&self) -> String {
        match &self.glibc_tunables {
            Some(t) => format!(
                "every system under test, seedgate and anchors alike, runs with `GLIBC_TUNABLES={t}` (what the seedgate image sets: \
                 glibc's vector copy loop instead of `rep movsb` below 1 MiB)"
            ),
            None => {
                "systems under test run with the harness's environment (no `GLIBC_TUNABLES` set by the bench)".into()
            }
        }
    }

    /// The same, with the systems under test on `cpus` (every process of a system shares them).
    pub(crate) fn on(&self, cpus: &[usize]) -> Self {
        let list = cpus.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
        Self { proxy_set: Some(list), ..self.clone() }
    }

    /// `taskset -c <cpus> <program>` when pinning, else just the program; with the systems'
    /// `GLIBC_TUNABLES`.
    pub(crate) fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> std::process::Command {
        self.command_in(None, program)
    }

    /// [`Pinning::command`] inside network namespace `netns` (`ip netns exec`, which execs the
    /// rest: the process keeps the pid the harness sees), or where the harness is (`None`).
    pub(crate) fn command_in(
        &self,
        netns: Option<&str>,
        program: impl AsRef<std::ffi::OsStr>,
    ) -> std::process::Command {
        let mut argv: Vec<std::ffi::OsString> = Vec::new();
        if let Some(ns) = netns {
            argv.extend(["ip", "netns", "exec", ns].map(Into::into));
        }
        if let Some(cpus) = self.proxy_set.clone().or_else(|| self.proxy_cpu.map(|c| c.to_string())) {
            argv.extend(["taskset".into(), "-c".into(), cpus.into()]);
        }
        argv.push(program.as_ref().to_owned());
        let mut c = std::process::Command::new(&argv[0]);
        c.args(&argv[1..]);
        match &self.glibc_tunables {
            Some(t) => c.env("GLIBC_TUNABLES", t),
            None => c.env_remove("GLIBC_TUNABLES"),
        };
        c
    }
}

/// CPUs this process may run on.
pub(crate) fn allowed_cpus() -> Vec<usize> {
    let mut set = std::mem::MaybeUninit::<libc::cpu_set_t>::zeroed();
    // SAFETY: sched_getaffinity writes at most size_of::<cpu_set_t>() bytes into the zeroed set
    // we own; CPU_ISSET only reads it.
    #[allow(unsafe_code)]
    unsafe {
        let set_ptr = set.as_mut_ptr();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set_ptr) != 0 {
            return Vec::new();
        }
        let set = set.assume_init();
        (0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &set)).collect()
    }
}

/// Pin the calling thread (and every thread and process it creates afterwards) to `cpu`.
pub(crate) fn pin_self(cpu: usize) -> anyhow::Result<()> {
    let set = std::mem::MaybeUninit::<libc::cpu_set_t>::zeroed();
    // SAFETY: the set is zero-initialised and ours; CPU_SET writes inside it; sched_setaffinity
    // reads size_of::<cpu_set_t>() bytes of it.
    #[allow(unsafe_code)]
    let rc = unsafe {
        let mut set = set.assume_init();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).context(format!("sched_setaffinity(CPU {cpu})"));
    }
    Ok(())
}

/// Choose and apply the pinning: with two or more CPUs, the harness takes the second allowed
/// CPU and the systems the first. `glibc_tunables` goes into every system's environment (empty:
/// none).
pub(crate) fn pin(enabled: bool, glibc_tunables: &str) -> anyhow::Result<Pinning> {
    let glibc_tunables = Some(glibc_tunables.to_owned()).filter(|t| !t.is_empty());
    let cpus = allowed_cpus();
    if !enabled || cpus.len() < 2 {
        return Ok(Pinning { proxy_cpu: None, load_cpu: None, glibc_tunables, proxy_set: None, cpus });
    }
    let (proxy, load) = (cpus[0], cpus[1]);
    pin_self(load)?;
    Ok(Pinning { proxy_cpu: Some(proxy), load_cpu: Some(load), glibc_tunables, proxy_set: None, cpus })
}

/// Raise the soft RLIMIT_NOFILE to `want` (capped at the hard limit); returns the new soft limit.
pub(crate) fn raise_nofile(want: u64) -> anyhow::Result<u64> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit read and write the rlimit struct we own, nothing else.
    #[allow(unsafe_code)]
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return Err(std::io::Error::last_os_error()).context("getrlimit");
        }
        let target = want.min(lim.rlim_max);
        if lim.rlim_cur < target {
            lim.rlim_cur = target;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error()).context("setrlimit");
            }
        }
        Ok(lim.rlim_cur)
    }
}

/// Lock a mutex, taking the data of a poisoned one (a panicked task's half-update is still the
/// best the harness has to report).
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// CPU time (user + system) one process has used so far, from `/proc/<pid>/stat`.
pub(crate) fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command (which may contain spaces) start after the last ')': state is
    // field 3, utime and stime are fields 14 and 15.
    let rest: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: f64 = rest.get(11)?.parse::<f64>().ok()? + rest.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf takes an integer and touches no memory of ours.
    #[allow(unsafe_code)]
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    Some(ticks / if hz > 0 { hz as f64 } else { 100.0 })
}

/// VmRSS of one process in KiB.
pub(crate) fn rss_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// `pid` and all its descendants (nginx workers, sshd session processes, squid's kids).
pub(crate) fn process_tree(pid: u32) -> Vec<u32> {
    let mut parent_of = Vec::new();
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Some(p) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
                continue;
            };
            // Fields after the command (which may contain spaces) start after the last ')'.
            let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
                continue;
            };
            if let Some(ppid) = rest.split_whitespace().nth(1).and_then(|v| v.parse::<u32>().ok()) {
                parent_of.push((p, ppid));
            }
        }
    }
    let mut out = vec![pid];
    let mut i = 0;
    // Breadth-first over a finite process list.
    while i < out.len() {
        let cur = out[i];
        out.extend(parent_of.iter().filter(|(_, pp)| *pp == cur).map(|(p, _)| *p));
        i += 1;
    }
    out
}

/// Send `sig` to `pid` (a descendant of a process the harness started); errors are ignored
/// (it may have exited already).
pub(crate) fn kill(pid: u32, sig: i32) {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return };
    // SAFETY: kill(2) takes plain integers and touches no memory of ours.
    #[allow(unsafe_code)]
    unsafe {
        libc::kill(pid, sig);
    }
}

/// Summed VmRSS (KiB) of the given processes and all their descendants.
pub(crate) fn tree_rss_kib(pids: &[u32]) -> u64 {
    let mut all: Vec<u32> = pids.iter().flat_map(|&p| process_tree(p)).collect();
    all.sort_unstable();
    all.dedup();
    all.iter().filter_map(|&p| rss_kib(p)).sum()
}

/// The first port of the kernel's ephemeral range (what it hands out as the local port of an
/// outgoing connection).
fn ephemeral_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768)
}

/// A port free on `ip` right now for TCP and UDP alike (for systems given their ports in a
/// config), chosen below the kernel's ephemeral range: a port from that range, which binding
/// port 0 gives, may meanwhile become the local port of any outgoing connection, and the
/// process it was meant for then fails with "address in use".
pub(crate) fn free_port(ip: [u8; 4]) -> anyhow::Result<SocketAddr> {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let end = u32::from(ephemeral_start());
    let start = 10_000.min(end / 2);
    let span = end - start;
    ensure!(span > 0, "no ports below the ephemeral range ({end})");
    // Spread over the range by process, so that two harnesses rarely try the same ports.
    let seed = std::process::id().wrapping_mul(2_654_435_761);
    for _ in 0..2_000 {
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let port = u16::try_from(start + seed.wrapping_add(n.wrapping_mul(7_919)) % span)?;
        let addr = SocketAddr::from((ip, port));
        if TcpListener::bind(addr).is_ok() && std::net::UdpSocket::bind(addr).is_ok() {
            return Ok(addr);
        }
    }
    anyhow::bail!("no free port on {ip:?} among 2,000 tried below {end}")
}

/// The first existing path among `candidates`, or a program found on PATH.
pub(crate) fn find_program(name: &str, candidates: &[PathBuf]) -> Option<PathBuf> {
    if let Some(p) = candidates.iter().find(|p| p.is_file()) {
        return Some(p.clone());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
    // Debian puts daemons in sbin, which a non-root PATH may lack.
    dirs.extend(["/usr/sbin", "/sbin", "/usr/local/sbin"].map(PathBuf::from));
    dirs.into_iter().map(|d| d.join(name)).find(|p| p.is_file())
}

/// First line of `program args` output (stdout or stderr), for version strings.
pub(crate) fn version_of(program: &Path, args: &[&str], ld_path: Option<&std::ffi::OsStr>) -> String {
    let mut cmd = std::process::Command::new(program);
    if let Some(p) = ld_path {
        cmd.env("LD_LIBRARY_PATH", p);
    }
    match cmd.args(args).output() {
        Ok(o) => {
            let text = if o.stdout.is_empty() { o.stderr } else { o.stdout };
            String::from_utf8_lossy(&text).lines().next().unwrap_or("").trim().to_owned()
        }
        Err(e) => format!("unknown ({e})"),
    }
}

/// Facts about the machine for the report header.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Machine {
    pub date_utc: String,
    pub cpu_model: String,
    pub cpus: usize,
    pub mem_gib: f64,
    pub kernel: String,
    pub loadavg_start: String,
    pub loadavg_end: String,
    pub nofile: u64,
}

pub(crate) fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

impl Machine {
    pub(crate) fn probe(nofile: u64) -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| {
                l.strip_prefix("model name").and_then(|r| r.split_once(':')).map(|(_, v)| v.trim().to_owned())
            })
            .unwrap_or_else(|| "unknown".into());
        let mem_kib: f64 = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find_map(|l| l.strip_prefix("MemTotal:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            })
            .unwrap_or(0.0);
        Self {
            date_utc: utc_now(),
            cpu_model,
            cpus: cpuinfo.lines().filter(|l| l.starts_with("processor")).count().max(1),
            mem_gib: (mem_kib / 1024.0 / 1024.0 * 10.0).round() / 10.0,
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_owned(),
            loadavg_start: loadavg(),
            loadavg_end: String::new(),
            nofile,
        }
    }
}

/// `YYYY-MM-DD HH:MM` UTC from the system clock (civil-from-days, no date crate needed).
pub(crate) fn utc_now() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02} UTC", rem / 3600, rem % 3600 / 60)
}

/// Make sure a directory exists with the given mode (for daemons that drop privileges).
pub(crate) fn dir_with_mode(p: &Path, mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::create_dir_all(p).with_context(|| format!("creating {}", p.display()))?;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))?;
    ensure!(p.is_dir());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_lie_below_the_ephemeral_range_and_differ() {
        let end = ephemeral_start();
        let a = free_port([127, 0, 0, 1]).unwrap();
        let b = free_port([127, 0, 0, 1]).unwrap();
        assert!(a.port() < end && b.port() < end, "{a} {b} below {end}");
        assert_ne!(a, b);
        std::net::TcpListener::bind(a).expect("still free for TCP");
        std::net::UdpSocket::bind(a).expect("and for UDP");
    }

    #[test]
    fn own_rss_and_tree() {
        let me = std::process::id();
        assert!(rss_kib(me).unwrap() > 0);
        assert!(process_tree(me).contains(&me));
        assert!(utc_now().ends_with("UTC"));
        assert!(cpu_seconds(me).is_some_and(|s| s >= 0.0));
    }
}
