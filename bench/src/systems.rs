//! Starting and stopping every system the scenarios compare: seedgate's binaries and the anchors
//! (haproxy, nginx, squid, tinyproxy, rathole, sshd + `ssh -R`), each with a config the harness
//! writes into its own directory, each pinned to the proxy CPU. A [`Running`] system stops
//! (SIGKILL, reaped) when dropped.

use crate::host::{self, Pinning};
use crate::report::Kind;
use anyhow::{Context as _, bail, ensure};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use testbed::{Ca, Proc};

/// How long an anchor may take to start listening.
const ANCHOR_START: Duration = Duration::from_secs(15);

/// `--only`: start only systems whose label contains this (direct always runs).
pub(crate) static ONLY: std::sync::OnceLock<String> = std::sync::OnceLock::new();

pub(crate) fn check_only(label: &str) -> anyhow::Result<()> {
    match ONLY.get() {
        Some(o) if !label.contains(o.as_str()) => bail!("filtered out (--only {o})"),
        _ => Ok(()),
    }
}

/// `--seedgate-only`: start no anchor.
pub(crate) static SEEDGATE_ONLY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// `--status-poll`: every seedgate process's status page (`/` and `/status`) is fetched every
/// [`STATUS_POLL_EVERY`] while it runs, as an open browser tab does.
pub(crate) static STATUS_POLL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// Status pages fetched so far with `--status-poll` (each `/` or `/status` answered 200), and
/// those that failed.
pub(crate) static STATUS_POLLED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
pub(crate) static STATUS_POLL_FAILED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
const STATUS_POLL_EVERY: Duration = Duration::from_secs(1);

/// Fetch `admin`'s `/` and `/status` every [`STATUS_POLL_EVERY`] until aborted.
async fn poll_status(admin: SocketAddr) {
    use std::sync::atomic::Ordering::Relaxed;
    let mut tick = tokio::time::interval(STATUS_POLL_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        for path in ["/", "/status"] {
            match testbed::http_get(admin, path).await {
                Ok((200, _)) => STATUS_POLLED.fetch_add(1, Relaxed),
                _ => STATUS_POLL_FAILED.fetch_add(1, Relaxed),
            };
        }
    }
}

/// [`check_only`] for an anchor, which `--seedgate-only` leaves out too.
fn check_anchor(label: &str) -> anyhow::Result<()> {
    if SEEDGATE_ONLY.load(std::sync::atomic::Ordering::Relaxed) {
        bail!("filtered out (--seedgate-only)");
    }
    check_only(label)
}

/// A program the harness may run, or why it cannot.
pub(crate) type Tool = Result<PathBuf, String>;

/// The third-party programs, found once per run.
#[derive(Debug)]
pub(crate) struct Anchors {
    pub haproxy: Tool,
    pub nginx: Tool,
    /// nginx with the stream module (and njs, for CONNECT) loadable: the module files.
    pub nginx_stream: Result<PathBuf, String>,
    pub nginx_js: Result<PathBuf, String>,
    pub squid: Tool,
    pub tinyproxy: Tool,
    pub sshd: Tool,
    pub ssh: Tool,
    pub ssh_keygen: Tool,
    pub rathole: Tool,
    pub openssl: Tool,
    /// `LD_LIBRARY_PATH` for anchors found under `BENCH_ANCHORS_ROOT` (Debian packages unpacked
    /// there with their libraries, for a machine without them installed).
    pub ld_path: Option<std::ffi::OsString>,
}

const INSTALL_HINT: &str = "run bench/install-anchors.sh";
/// The environment variable naming a directory of anchors: `bin/rathole`, and Debian packages
/// unpacked there (`usr/sbin/haproxy`, `usr/sbin/nginx`, `usr/lib/nginx/modules/`, their
/// libraries under `usr/lib/<arch>` and `lib/<arch>`).
pub(crate) const ANCHORS_ROOT_ENV: &str = "BENCH_ANCHORS_ROOT";

fn tool(name: &str, candidates: &[PathBuf]) -> Tool {
    host::find_program(name, candidates).ok_or_else(|| format!("{name} not installed ({INSTALL_HINT})"))
}

impl Anchors {
    pub(crate) fn find() -> Self {
        let ws = Path::new(testbed::proc::WORKSPACE);
        let root = std::env::var_os(ANCHORS_ROOT_ENV).map(PathBuf::from);
        // The unpacked tree first, then the system's.
        let under = |p: &str| {
            let mut v: Vec<PathBuf> = root.iter().map(|r| r.join(p.trim_start_matches('/'))).collect();
            v.push(PathBuf::from(p));
            v
        };
        let mut rathole_paths = root.iter().map(|r| r.join("bin/rathole")).collect::<Vec<_>>();
        rathole_paths.push(ws.join("target/anchors/bin/rathole"));
        rathole_paths.push(PathBuf::from("/tmp/bench-anchors/bin/rathole"));
        let rathole = host::find_program("rathole", &rathole_paths)
            .ok_or_else(|| "rathole not installed (bench/install-anchors.sh; CI does not build it)".to_owned());
        let so = |p: &str, pkg: &str| {
            under(p)
                .into_iter()
                .find(|c| c.is_file())
                .ok_or_else(|| format!("{p} missing (Debian {pkg}; {INSTALL_HINT})"))
        };
        let ld_path = root.as_ref().and_then(|r| {
            let dirs: Vec<PathBuf> = ["usr/lib", "lib"]
                .iter()
                .flat_map(|d| std::fs::read_dir(r.join(d)).into_iter().flatten().flatten())
                .map(|e| e.path())
                .filter(|p| p.is_dir() && p.file_name().is_some_and(|n| n.to_string_lossy().ends_with("-linux-gnu")))
                .collect();
            std::env::join_paths(dirs).ok().filter(|p| !p.is_empty())
        });
        Self {
            haproxy: tool("haproxy", &under("/usr/sbin/haproxy")),
            nginx: tool("nginx", &under("/usr/sbin/nginx")),
            nginx_stream: so("/usr/lib/nginx/modules/ngx_stream_module.so", "libnginx-mod-stream"),
            nginx_js: so("/usr/lib/nginx/modules/ngx_stream_js_module.so", "libnginx-mod-stream-js"),
            squid: tool("squid", &under("/usr/sbin/squid")),
            tinyproxy: tool("tinyproxy", &[PathBuf::from("/usr/bin/tinyproxy"), PathBuf::from("/usr/sbin/tinyproxy")]),
            sshd: tool("sshd", &under("/usr/sbin/sshd")),
            ssh: tool("ssh", &under("/usr/bin/ssh")),
            ssh_keygen: tool("ssh-keygen", &under("/usr/bin/ssh-keygen")),
            rathole,
            openssl: tool("openssl", &under("/usr/bin/openssl")),
            ld_path,
        }
    }

    /// Version lines of what is installed, for the report header.
    pub(crate) fn versions(&self) -> Vec<(String, String)> {
        let mut v = Vec::new();
        let mut one = |name: &str, t: &Tool, args: &[&str]| {
            let line = match t {
                Ok(p) => host::version_of(p, args, self.ld_path.as_deref()),
                Err(e) => format!("missing: {e}"),
            };
            v.push((name.to_owned(), line));
        };
        one("haproxy", &self.haproxy, &["-v"]);
        one("nginx", &self.nginx, &["-v"]);
        one("squid", &self.squid, &["-v"]);
        one("tinyproxy", &self.tinyproxy, &["-v"]);
        one("ssh", &self.ssh, &["-V"]);
        one("rathole", &self.rathole, &["--version"]);
        v
    }

    pub(crate) fn nginx_stream(&self) -> Result<PathBuf, String> {
        let p = self.nginx.clone()?;
        self.nginx_stream.clone()?;
        Ok(p)
    }

    /// The anchors that are not there, each with why (for a report that must say so).
    pub(crate) fn missing(&self, names: &[&str]) -> Vec<String> {
        let mut v = Vec::new();
        for n in names {
            let r = match *n {
                "haproxy" => self.haproxy.as_ref().map(|_| ()).map_err(Clone::clone),
                "nginx" => self.nginx_stream().map(|_| ()),
                "nginx njs" => self.nginx_njs().map(|_| ()),
                _ => Ok(()),
            };
            if let Err(e) = r {
                v.push(format!("{n}: {e}"));
            }
        }
        v
    }

    pub(crate) fn nginx_njs(&self) -> Result<PathBuf, String> {
        let p = self.nginx_stream()?;
        self.nginx_js.clone()?;
        Ok(p)
    }
}

/// The seedgate binaries.
#[derive(Debug, Clone)]
pub(crate) struct Bins {
    pub router: PathBuf,
    pub server: PathBuf,
    pub agent: PathBuf,
}

/// What systems need from the run: pinning, a directory for configs, the CA, where the ends of
/// a tunnel run.
pub(crate) struct Env<'a> {
    pub pin: &'a Pinning,
    pub dir: &'a Path,
    pub bins: &'a Bins,
    pub anchors: &'a Anchors,
    pub ca: &'a Ca,
    /// Threads or worker processes of an anchor (haproxy `nbthread`, nginx
    /// `worker_processes`); seedgate sizes its runtime to the CPUs it is pinned to.
    pub workers: usize,
    pub ends: Ends,
}

/// Where the two ends of a reverse tunnel run. By default both run where the harness is and meet
/// on loopback; across an emulated WAN the far end (proxy-agent, rathole's client, `ssh -R`) runs
/// in the shoot's network namespace and dials the near end (proxy-server, rathole's server, sshd)
/// at its address on the link.
#[derive(Debug, Clone)]
pub(crate) struct Ends {
    /// The far end's network namespace; `None`: the harness's.
    pub far_netns: Option<String>,
    /// The address the near end listens on for the far end.
    pub near_ip: std::net::IpAddr,
    /// The networks the far end may dial (proxy-agent's `tunnel.allow`).
    pub far_allow: Vec<String>,
}

impl Default for Ends {
    fn default() -> Self {
        Self { far_netns: None, near_ip: [127, 0, 0, 1].into(), far_allow: vec!["127.0.0.0/8".into()] }
    }
}

impl Env<'_> {
    /// The pinned command of an anchor, with the libraries of an unpacked one.
    pub(crate) fn anchor_command(&self, bin: &Path) -> std::process::Command {
        let mut cmd = self.pin.command(bin);
        if let Some(p) = &self.anchors.ld_path {
            cmd.env("LD_LIBRARY_PATH", p);
        }
        cmd
    }

    /// The pinned command of a far-end process (inside the far end's namespace, if any), with
    /// an unpacked anchor's libraries.
    fn far_command(&self, program: &Path) -> std::process::Command {
        let mut cmd = self.pin.command_in(self.ends.far_netns.as_deref(), program);
        if let Some(p) = &self.anchors.ld_path {
            cmd.env("LD_LIBRARY_PATH", p);
        }
        cmd
    }

    /// A free port on the near end's address.
    fn near_port(&self) -> anyhow::Result<SocketAddr> {
        match self.ends.near_ip {
            std::net::IpAddr::V4(ip) => host::free_port(ip.octets()),
            std::net::IpAddr::V6(_) => bail!("IPv4 only"),
        }
    }
}

/// A started system: its processes and the addresses clients use, by role name.
#[derive(Debug)]
pub(crate) struct Running {
    pub label: String,
    pub kind: Kind,
    procs: Vec<Proc>,
    addrs: BTreeMap<String, SocketAddr>,
    /// The directory holding the system's configs (empty for direct).
    pub dir: PathBuf,
    /// `perf record` processes following seedgate processes (see [`PERF_DIR_ENV`]).
    profilers: Vec<Proc>,
    /// With `--status-poll`: the tasks fetching its seedgate processes' status pages.
    pollers: Vec<tokio::task::JoinHandle<()>>,
}

/// Set to a directory to profile every seedgate process with `perf record -g` while it runs.
pub(crate) const PERF_DIR_ENV: &str = "BENCH_PERF_DIR";

impl Running {
    pub(crate) fn direct(addrs: &[(&str, SocketAddr)]) -> Self {
        Self {
            label: "direct".into(),
            kind: Kind::Direct,
            procs: Vec::new(),
            addrs: addrs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect(),
            dir: PathBuf::new(),
            profilers: Vec::new(),
            pollers: Vec::new(),
        }
    }

    fn new(label: &str, kind: Kind) -> Self {
        Self {
            label: label.into(),
            kind,
            procs: Vec::new(),
            addrs: BTreeMap::new(),
            dir: PathBuf::new(),
            profilers: Vec::new(),
            pollers: Vec::new(),
        }
    }

    pub(crate) fn addr(&self, role: &str) -> anyhow::Result<SocketAddr> {
        self.addrs.get(role).copied().with_context(|| {
            format!("{} has no {role:?} address ({:?})", self.label, self.addrs.keys().collect::<Vec<_>>())
        })
    }

    /// Name the address of a role; a seedgate process's admin listener (`admin`, `server-admin`,
    /// `agent-admin`) is polled from now on with `--status-poll`.
    pub(crate) fn set_addr(&mut self, role: &str, a: SocketAddr) {
        if self.kind == Kind::Seedgate
            && role.ends_with("admin")
            && STATUS_POLL.load(std::sync::atomic::Ordering::Relaxed)
        {
            self.pollers.push(tokio::spawn(poll_status(a)));
        }
        self.addrs.insert(role.into(), a);
    }

    /// Merge another system's processes and addresses into this one (a sender in front of a
    /// receiver, squid behind rathole).
    pub(crate) fn absorb(&mut self, mut other: Running, prefix: &str) {
        self.procs.append(&mut other.procs);
        self.profilers.append(&mut other.profilers);
        self.pollers.append(&mut other.pollers);
        for (k, v) in std::mem::take(&mut other.addrs) {
            self.addrs.insert(format!("{prefix}{k}"), v);
        }
    }

    pub(crate) fn pids(&self) -> Vec<u32> {
        self.procs.iter().map(Proc::pid).collect()
    }

    /// Open sockets of every process of the system and their children (nginx's worker): what an
    /// anchor without an admin endpoint holds, read from `/proc/<pid>/fd`.
    pub(crate) fn socket_fds(&self) -> usize {
        let mut all: Vec<u32> = self.pids().into_iter().flat_map(host::process_tree).collect();
        all.sort_unstable();
        all.dedup();
        all.iter()
            .filter_map(|p| std::fs::read_dir(format!("/proc/{p}/fd")).ok())
            .flat_map(|d| d.flatten())
            .filter(|e| std::fs::read_link(e.path()).is_ok_and(|t| t.to_string_lossy().starts_with("socket:")))
            .count()
    }

    /// RSS (KiB) of every process of the system and their children.
    pub(crate) fn rss_kib(&self) -> u64 {
        host::tree_rss_kib(&self.pids())
    }

    /// RSS (KiB) of each started process with its children, named by executable.
    pub(crate) fn rss_by_process(&self) -> Vec<(String, u64)> {
        self.pids()
            .into_iter()
            .map(|p| {
                let name = std::fs::read_link(format!("/proc/{p}/exe"))
                    .ok()
                    .and_then(|e| e.file_name().map(|f| f.to_string_lossy().into_owned()))
                    .unwrap_or_else(|| p.to_string());
                (name, host::tree_rss_kib(&[p]))
            })
            .collect()
    }

    /// An error naming any process that exited, with the tail of its log.
    pub(crate) fn check_alive(&mut self) -> anyhow::Result<()> {
        for p in &mut self.procs {
            if !p.running() {
                bail!("{} exited; log tail:\n{}", p.log_path().display(), tail(&p.log(), 15));
            }
        }
        Ok(())
    }

    /// Signal the system's first process (sni-router, nginx's master).
    pub(crate) fn signal_first(&mut self, sig: i32) -> anyhow::Result<()> {
        self.procs.first_mut().context("no process")?.signal(sig)
    }

    /// Add a seedgate process; with `BENCH_PERF_DIR` set, `perf record -g` follows it until the
    /// system stops (`<dir>/<label>-<binary>-<pid>.data`), for finding hot spots.
    pub(crate) fn push_seedgate(&mut self, p: Proc) {
        if let Some(dir) = std::env::var_os(PERF_DIR_ENV) {
            let dir = PathBuf::from(dir);
            let _ = std::fs::create_dir_all(&dir);
            let bin = std::fs::read_link(format!("/proc/{}/exe", p.pid()))
                .ok()
                .and_then(|e| e.file_name().map(|f| f.to_string_lossy().into_owned()))
                .unwrap_or_else(|| "proc".into());
            let safe: String = self.label.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
            let out = dir.join(format!("{safe}-{bin}-{}.data", p.pid()));
            // Frame pointers are absent in release builds: BENCH_PERF_DWARF=1 unwinds with DWARF
            // (bigger files, real call stacks).
            let graph = if std::env::var_os("BENCH_PERF_DWARF").is_some() { "dwarf,16384" } else { "fp" };
            let mut cmd = std::process::Command::new("perf");
            cmd.args(["record", "-q", "-F", "499", "--call-graph", graph, "-p", &p.pid().to_string(), "-o"]).arg(&out);
            match Proc::spawn(cmd) {
                Ok(perf) => self.profilers.push(perf),
                Err(e) => eprintln!("bench: perf record failed to start: {e:#}"),
            }
        }
        self.procs.push(p);
    }

    /// Add a process (a reloaded haproxy) to the system.
    pub(crate) fn push_proc(&mut self, p: Proc) {
        self.procs.push(p);
    }

    /// Like [`Running::check_alive`], but only the newest process must live (haproxy's old
    /// process exits after `-sf` once its connections are done).
    pub(crate) fn check_alive_any(&mut self) -> anyhow::Result<()> {
        if let Some(p) = self.procs.last_mut()
            && !p.running()
        {
            bail!("{} exited; log tail:\n{}", p.log_path().display(), tail(&p.log(), 15));
        }
        Ok(())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        for p in &self.pollers {
            p.abort();
        }
        // perf writes a usable file only when stopped with SIGINT; give it a moment.
        for p in &mut self.profilers {
            let _ = p.signal(libc::SIGINT);
        }
        for p in &mut self.profilers {
            for _ in 0..300 {
                if !p.running() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        // Proc's own drop kills and reaps the process we started; its children (nginx workers,
        // sshd session processes) would outlive it, so they are killed first, by pid.
        let roots = self.pids();
        let mut children: Vec<u32> =
            roots.iter().flat_map(|&p| host::process_tree(p).into_iter().filter(move |&c| c != p)).collect();
        children.retain(|c| !roots.contains(c));
        for c in children {
            host::kill(c, libc::SIGKILL);
        }
    }
}

/// The last non-empty line of a log (usually the reason a daemon gave up).
fn last_line(s: &str) -> String {
    s.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("(empty log)").trim().to_owned()
}

fn tail(s: &str, lines: usize) -> String {
    let v: Vec<&str> = s.lines().collect();
    v[v.len().saturating_sub(lines)..].join("\n")
}

/// Start a prepared command (already wrapped in `taskset`) and wait until it listens on every
/// address in `listen`; fails with the log if it exits first.
async fn start_listening(cmd: std::process::Command, listen: &[SocketAddr]) -> anyhow::Result<Proc> {
    let mut p = Proc::spawn(cmd)?;
    for &a in listen {
        let deadline = tokio::time::Instant::now() + ANCHOR_START;
        // Bounded by the deadline.
        loop {
            if !p.running() {
                let log = p.log();
                bail!("exited before listening on {a}: {}\nlog:\n{}", last_line(&log), tail(&log, 20));
            }
            if tokio::net::TcpStream::connect(a).await.is_ok() {
                break;
            }
            ensure!(
                tokio::time::Instant::now() < deadline,
                "not listening on {a} after {ANCHOR_START:?}; log:\n{}",
                tail(&p.log(), 20)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(p)
}

fn subdir(env: &Env<'_>, label: &str) -> anyhow::Result<PathBuf> {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let safe: String = label.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
    let d = env.dir.join(format!("{n:02}-{safe}"));
    // World-writable: squid and tinyproxy drop privileges and still write logs and pid files.
    host::dir_with_mode(&d, 0o777)?;
    Ok(d)
}

/// seedgate's processes log at warn: access logs off, as they are for every anchor.
const SEEDGATE_LOG: &str = "warn";

async fn seedgate(env: &Env<'_>, bin: &Path, config: &Path) -> anyhow::Result<(Proc, testbed::Addresses)> {
    seedgate_cmd(env.pin.command(bin), config).await
}

async fn seedgate_cmd(mut cmd: std::process::Command, config: &Path) -> anyhow::Result<(Proc, testbed::Addresses)> {
    cmd.env("RUST_LOG", SEEDGATE_LOG);
    Proc::spawn_seedgate(cmd, config, &[]).await
}

/// sni-router with `listeners_yaml` (the `listeners:` list, indented as a YAML sequence).
/// Addresses: each listener by name, and `admin`.
pub(crate) async fn sni_router(env: &Env<'_>, label: &str, listeners_yaml: &str) -> anyhow::Result<Running> {
    sni_router_with(env, label, "limits: { max_connections: 19000 }\n", listeners_yaml).await
}

/// [`sni_router`] with `limits_yaml` (top-level keys, e.g. a `limits:` line) instead of the
/// bench's usual limits.
pub(crate) async fn sni_router_with(
    env: &Env<'_>,
    label: &str,
    limits_yaml: &str,
    listeners_yaml: &str,
) -> anyhow::Result<Running> {
    let top = format!("timeouts: {{ handshake: 5s, connect: 5s, idle: 1h }}\n{limits_yaml}");
    sni_router_top(env, label, &top, listeners_yaml).await
}

/// sni-router with `top_yaml` (every top-level key but `admin`, `drain_grace` and `listeners`:
/// timeouts and limits of the caller's choosing).
pub(crate) async fn sni_router_top(
    env: &Env<'_>,
    label: &str,
    top_yaml: &str,
    listeners_yaml: &str,
) -> anyhow::Result<Running> {
    check_only(label)?;
    let d = subdir(env, label)?;
    let cfg = d.join("sni-router.yaml");
    let text = format!("admin: {{ listen: 127.0.0.1:0 }}\ndrain_grace: 1s\n{top_yaml}listeners:\n{listeners_yaml}");
    write_atomic(&cfg, &text)?;
    let (p, a) = seedgate(env, &env.bins.router, &cfg).await?;
    let mut r = Running::new(label, Kind::Seedgate);
    for name in a.listeners.keys() {
        r.set_addr(name, a.listener(name)?);
    }
    r.set_addr("admin", a.admin()?);
    r.dir = d;
    r.push_seedgate(p);
    Ok(r)
}

/// Write a file by writing a sibling and renaming it over (what a config reload sees).
pub(crate) fn write_atomic(path: &Path, text: &str) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming onto {}", path.display()))?;
    Ok(())
}

/// proxy-server (one plain-TCP CONNECT front end for cluster `shoot-a`, the agents listener
/// with mTLS) and one proxy-agent tunnelled to it, allowed to dial loopback. Ready once a
/// CONNECT to `probe` is answered 200. Addresses: `frontend`, `grpc`, `server-admin`, `agent-admin`.
pub(crate) async fn seedgate_tunnel(env: &Env<'_>, label: &str, probe: SocketAddr) -> anyhow::Result<Running> {
    seedgate_tunnel_with(env, label, probe, "limits: { max_connections: 19000 }\n", false).await
}

/// [`seedgate_tunnel`] with `server_top_yaml` (proxy-server's top-level keys other than
/// `admin`, `drain_grace`, `agents` and `frontends`: its timeouts and limits) instead of the
/// bench's usual limits. `quic`: proxy-server also listens on UDP (`agents.quic`) and the agent
/// dials that with `tunnel.transport: quic`.
pub(crate) async fn seedgate_tunnel_with(
    env: &Env<'_>,
    label: &str,
    probe: SocketAddr,
    server_top_yaml: &str,
    quic: bool,
) -> anyhow::Result<Running> {
    seedgate_tunnel_pinned(env, env.pin, label, probe, server_top_yaml, quic).await
}

/// [`seedgate_tunnel_with`] with proxy-agent on the CPUs of `agent_pin` (proxy-server on
/// `env`'s).
pub(crate) async fn seedgate_tunnel_pinned(
    env: &Env<'_>,
    agent_pin: &Pinning,
    label: &str,
    probe: SocketAddr,
    server_top_yaml: &str,
    quic: bool,
) -> anyhow::Result<Running> {
    check_only(label)?;
    let d = subdir(env, label)?;
    let server_id = env.ca.server(&["proxy.bench.local"])?;
    let agent_id = env.ca.client("shoot-a")?;
    let ca = env.ca.write(&d, "ca")?;
    let (sc, sk) = server_id.write(&d, "server")?;
    let (ac, ak) = agent_id.write(&d, "agent")?;
    let server_cfg = d.join("proxy-server.yaml");
    let near = SocketAddr::new(env.ends.near_ip, 0);
    write_atomic(
        &server_cfg,
        &format!(
            "admin: {{ listen: 127.0.0.1:0 }}\ndrain_grace: 1s\n{server_top_yaml}\
             agents:\n  listen: {near}\n{}  tls: {{ cert: {}, key: {}, client_ca: {} }}\n\
             frontends:\n  - name: egress\n    listen: 127.0.0.1:0\n    cluster: shoot-a\n\
             \x20 - name: grpc\n    listen: 127.0.0.1:0\n    cluster: shoot-a\n    protocol: grpc\n",
            if quic {
                format!("  quic: {{ listen: {near}{} }}\n", quic_cc(", congestion_control: ", ""))
            } else {
                String::new()
            },
            sc.display(),
            sk.display(),
            ca.display()
        ),
    )?;
    let (sp, sa) = seedgate(env, &env.bins.server, &server_cfg).await?;
    let agents = if quic { sa.listener("agents-quic") } else { sa.listener("agents") }.or_else(|_| {
        // The agents listener's name in the address file.
        sa.listeners
            .iter()
            .find(|(k, _)| k.contains("agent"))
            .map(|(_, v)| v.parse().map_err(anyhow::Error::from))
            .unwrap_or_else(|| bail!("no agents listener in {:?}", sa.listeners))
    })?;
    let frontend = sa.listener("egress")?;
    let agent_cfg = d.join("proxy-agent.yaml");
    write_atomic(
        &agent_cfg,
        &format!(
            "admin: {{ listen: 127.0.0.1:0 }}\ndrain_grace: 1s\nlimits: {{ max_connections: 19000 }}\n\
             tunnel:\n  servers: [{agents}]\n{}  tls: {{ cert: {}, key: {}, ca: {}, server_name: proxy.bench.local }}\n\
             \x20 allow: [{}]\n  max_streams: 16384\n",
            if quic {
                format!("  transport: quic\n{}", quic_cc("  quic_congestion_control: ", "\n"))
            } else {
                String::new()
            },
            ac.display(),
            ak.display(),
            ca.display(),
            env.ends.far_allow.join(", "),
        ),
    )?;
    let (ap, aa) =
        seedgate_cmd(agent_pin.command_in(env.ends.far_netns.as_deref(), &env.bins.agent), &agent_cfg).await?;
    let mut r = Running::new(label, Kind::Seedgate);
    r.push_seedgate(sp);
    r.push_seedgate(ap);
    r.set_addr("frontend", frontend);
    // konnectivity's gRPC front end (cleartext HTTP/2 on TCP, so its cost beside CONNECT's is
    // the framing alone).
    r.set_addr("grpc", sa.listener("grpc")?);
    r.set_addr("server-admin", sa.admin()?);
    r.set_addr("agent-admin", aa.admin()?);
    wait_connect_ok(&mut r, frontend, probe).await?;
    Ok(r)
}

/// Names the congestion controller of both ends' QUIC sessions instead of the default, for
/// comparing controllers: `BENCH_QUIC_CC=cubic bench wan ...`.
const QUIC_CC_ENV: &str = "BENCH_QUIC_CC";

/// The congestion controller of seedgate's QUIC sessions in this run, for the remarks.
pub(crate) fn quic_congestion_control() -> String {
    std::env::var(QUIC_CC_ENV)
        .map(|cc| format!("{cc} ({QUIC_CC_ENV})"))
        .unwrap_or_else(|_| format!("{} (the default)", seedgate_config::CongestionControl::default().as_str()))
}

/// `<key><controller><end>` when [`QUIC_CC_ENV`] names one, else nothing.
fn quic_cc(key: &str, end: &str) -> String {
    std::env::var(QUIC_CC_ENV).map(|cc| format!("{key}{cc}{end}")).unwrap_or_default()
}

/// Poll a CONNECT to `target` through `proxy` until it succeeds (the tunnel is up).
async fn wait_connect_ok(r: &mut Running, proxy: SocketAddr, target: SocketAddr) -> anyhow::Result<()> {
    let pre = crate::load::Preamble::Connect(crate::load::connect_head(&target.to_string(), "").into());
    let deadline = tokio::time::Instant::now() + ANCHOR_START;
    let mut last = None;
    // Bounded by the deadline.
    while tokio::time::Instant::now() < deadline {
        r.check_alive()?;
        match tokio::time::timeout(Duration::from_secs(2), crate::load::open(proxy, &pre)).await {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(e)) => last = Some(e),
            Err(e) => last = Some(e.into()),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(last
        .unwrap_or_else(|| anyhow::anyhow!("timeout"))
        .context(format!("{}: no working CONNECT to {target}", r.label)))
}

/// proxy-agent's node-local apiserver proxy in proxy-protocol-v2 mode: listens on `listen`
/// (an address of the "kube-apiserver", e.g. 127.0.0.3:0) and sends each connection, with a
/// PROXY v2 header, to `gateway`. Address: `listen`.
pub(crate) async fn agent_pp_sender(
    env: &Env<'_>,
    label: &str,
    listen: SocketAddr,
    gateway: SocketAddr,
) -> anyhow::Result<Running> {
    check_only(label)?;
    let d = subdir(env, label)?;
    let cfg = d.join("proxy-agent.yaml");
    write_atomic(
        &cfg,
        &format!(
            "admin: {{ listen: 127.0.0.1:0 }}\ndrain_grace: 1s\nlimits: {{ max_connections: 19000 }}\n\
             apiserver_proxy:\n  listen: [{listen}]\n  gateway: {gateway}\n  mode: proxy-protocol-v2\n"
        ),
    )?;
    let (p, a) = seedgate(env, &env.bins.agent, &cfg).await?;
    let mut r = Running::new(label, Kind::Seedgate);
    let l = a
        .listeners
        .values()
        .next()
        .context("the agent reported no listener")?
        .parse()
        .context("agent listener address")?;
    r.set_addr("listen", l);
    r.push_seedgate(p);
    Ok(r)
}

/// Start a one-process anchor and wait until it listens on every address of `listen`, each
/// exposed under its role name.
async fn start_anchor(
    label: &str,
    cmd: std::process::Command,
    listen: &[(&str, SocketAddr)],
) -> anyhow::Result<Running> {
    let addrs: Vec<SocketAddr> = listen.iter().map(|(_, a)| *a).collect();
    let p = start_listening(cmd, &addrs).await.with_context(|| format!("starting {label}"))?;
    let mut r = Running::new(label, Kind::Anchor);
    r.procs.push(p);
    for (k, a) in listen {
        r.set_addr(k, *a);
    }
    Ok(r)
}

/// haproxy in the foreground (`-db`), one thread, with `body` (frontends and backends) after
/// a global/defaults section; `splice` adds `option splice-auto` to the defaults.
/// `listen` names the addresses to wait for (and to expose as roles).
pub(crate) async fn haproxy(
    env: &Env<'_>,
    label: &str,
    body: &str,
    files: &[(&str, String)],
    listen: &[(&str, SocketAddr)],
    splice: bool,
) -> anyhow::Result<Running> {
    haproxy_with(env, label, body, files, listen, splice, None).await
}

/// [`haproxy`] with `maxconn` of the caller's choosing instead of the bench's usual one: the
/// global `maxconn` and, through the defaults section, every frontend's.
pub(crate) async fn haproxy_with(
    env: &Env<'_>,
    label: &str,
    body: &str,
    files: &[(&str, String)],
    listen: &[(&str, SocketAddr)],
    splice: bool,
    maxconn: Option<u32>,
) -> anyhow::Result<Running> {
    check_anchor(label)?;
    let bin = env.anchors.haproxy.clone().map_err(anyhow::Error::msg)?;
    let d = subdir(env, label)?;
    for (name, text) in files {
        std::fs::write(d.join(name), text)?;
    }
    let cfg = d.join("haproxy.cfg");
    let body = body.replace("@DIR@", &d.display().to_string());
    let text = format!(
        "global\n    maxconn {maxconn}\n    nbthread {threads}\n    stats socket {dir}/haproxy.sock mode 600 level admin\n\
         defaults\n    mode tcp\n    timeout connect 5s\n    timeout client 1h\n    timeout server 1h\n    timeout client-fin 30s\n{fe_maxconn}{splice}\
         {body}",
        dir = d.display(),
        threads = env.workers,
        // splice needs pipes (maxpipes defaults to maxconn/4, two fds each): fewer connections
        // fit under the 20,000-fd limit.
        maxconn = maxconn.unwrap_or(if splice { 7000 } else { 9500 }),
        fe_maxconn = maxconn.map(|m| format!("    maxconn {m}\n")).unwrap_or_default(),
        splice = if splice { "    option splice-auto\n" } else { "" },
    );
    std::fs::write(&cfg, text)?;
    let mut cmd = env.anchor_command(&bin);
    cmd.arg("-db").arg("-f").arg(&cfg);
    let mut r = start_anchor(label, cmd, listen).await?;
    r.dir = d;
    Ok(r)
}

/// nginx (master + one worker, foreground) with a `stream { ... }` block. `@DIR@` in the body
/// and files is replaced by the system's directory. `njs` loads the njs stream module.
pub(crate) async fn nginx(
    env: &Env<'_>,
    label: &str,
    stream_body: &str,
    files: &[(&str, String)],
    listen: &[(&str, SocketAddr)],
    njs: bool,
) -> anyhow::Result<Running> {
    nginx_with(env, label, stream_body, files, listen, njs, None).await
}

/// [`nginx`] with `worker_connections` of the caller's choosing instead of the bench's usual
/// 19,500 (it counts every connection of the worker: client and upstream sides, listening
/// sockets, the channel to the master).
pub(crate) async fn nginx_with(
    env: &Env<'_>,
    label: &str,
    stream_body: &str,
    files: &[(&str, String)],
    listen: &[(&str, SocketAddr)],
    njs: bool,
    worker_connections: Option<u32>,
) -> anyhow::Result<Running> {
    check_anchor(label)?;
    let bin = if njs { env.anchors.nginx_njs() } else { env.anchors.nginx_stream() }.map_err(anyhow::Error::msg)?;
    let d = subdir(env, label)?;
    let dir = d.display().to_string();
    for (name, text) in files {
        std::fs::write(d.join(name), text.replace("@DIR@", &dir))?;
    }
    let mut conf = String::new();
    let module = |r: &Result<PathBuf, String>| r.clone().map_err(anyhow::Error::msg);
    let _ = writeln!(conf, "load_module {};", module(&env.anchors.nginx_stream)?.display());
    if njs {
        let _ = writeln!(conf, "load_module {};", module(&env.anchors.nginx_js)?.display());
    }
    let _ = write!(
        conf,
        "daemon off;\nworker_processes {};\nworker_rlimit_nofile 20000;\npid {dir}/nginx.pid;\nerror_log {dir}/error.log warn;\n\
         events {{ worker_connections {}; }}\nstream {{\n{}\n}}\n",
        env.workers,
        worker_connections.unwrap_or(19500),
        stream_body.replace("@DIR@", &dir)
    );
    let cfg = d.join("nginx.conf");
    std::fs::write(&cfg, conf)?;
    let mut cmd = env.anchor_command(&bin);
    cmd.arg("-p").arg(&d).arg("-e").arg(d.join("error.log")).arg("-c").arg(&cfg);
    let mut r = start_anchor(label, cmd, listen).await?;
    r.dir = d;
    Ok(r)
}

/// squid as a CONNECT proxy for loopback clients (no cache, no access log, one worker).
/// Address: `proxy`.
pub(crate) async fn squid(env: &Env<'_>, label: &str) -> anyhow::Result<Running> {
    check_anchor(label)?;
    let bin = env.anchors.squid.clone().map_err(anyhow::Error::msg)?;
    let d = subdir(env, label)?;
    let port = host::free_port([127, 0, 0, 1])?;
    let dir = d.display();
    let conf = format!(
        "http_port {port}\n\
         acl localnet src 127.0.0.0/8\n\
         http_access allow localnet\n\
         http_access deny all\n\
         cache deny all\n\
         access_log none\n\
         cache_store_log none\n\
         cache_log {dir}/cache.log\n\
         pid_filename {dir}/squid.pid\n\
         coredump_dir {dir}\n\
         max_filedescriptors 20000\n\
         workers 1\n\
         shutdown_lifetime 1 seconds\n\
         via off\n\
         forwarded_for delete\n"
    );
    let cfg = d.join("squid.conf");
    std::fs::write(&cfg, conf)?;
    let mut cmd = env.anchor_command(&bin);
    cmd.arg("-N").arg("-f").arg(&cfg);
    start_anchor(label, cmd, &[("proxy", port)]).await
}

/// tinyproxy as a CONNECT proxy (any port allowed, loopback clients). Address: `proxy`.
pub(crate) async fn tinyproxy(env: &Env<'_>, label: &str) -> anyhow::Result<Running> {
    check_anchor(label)?;
    let bin = env.anchors.tinyproxy.clone().map_err(anyhow::Error::msg)?;
    let d = subdir(env, label)?;
    let port = host::free_port([127, 0, 0, 1])?;
    let root = nix_is_root();
    let conf = format!(
        "{user}Port {}\nListen 127.0.0.1\nTimeout 600\nMaxClients 19000\nLogLevel Critical\nPidFile \"{}/tinyproxy.pid\"\n\
         Allow 127.0.0.1\nDisableViaHeader Yes\n",
        port.port(),
        d.display(),
        user = if root { "User nobody\nGroup nogroup\n" } else { "" },
    );
    let cfg = d.join("tinyproxy.conf");
    std::fs::write(&cfg, conf)?;
    let mut cmd = env.anchor_command(&bin);
    cmd.arg("-d").arg("-c").arg(&cfg);
    start_anchor(label, cmd, &[("proxy", port)]).await
}

fn nix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Uid:")).map(|v| v.split_whitespace().next() == Some("0")))
        .unwrap_or(false)
}

/// A rathole server and client (TCP transport, or TLS with `tls`), one service per
/// `(name, target)`: the server listens for visitors (address role = name) and the client
/// forwards each visitor connection to the target over its own data channel.
pub(crate) async fn rathole(
    env: &Env<'_>,
    label: &str,
    services: &[(&str, SocketAddr)],
    tls: bool,
) -> anyhow::Result<Running> {
    check_anchor(label)?;
    let bin = env.anchors.rathole.clone().map_err(anyhow::Error::msg)?;
    let d = subdir(env, label)?;
    let ctrl = env.near_port()?;
    let mut server = format!("[server]\nbind_addr = \"{ctrl}\"\ndefault_token = \"seedgate-bench\"\n");
    let mut client = format!("[client]\nremote_addr = \"{ctrl}\"\ndefault_token = \"seedgate-bench\"\n");
    if tls {
        let openssl = env.anchors.openssl.clone().map_err(anyhow::Error::msg)?;
        let id = env.ca.server(&["proxy.bench.local"])?;
        let (crt, key) = id.write(&d, "server")?;
        let ca = env.ca.write(&d, "ca")?;
        let p12 = d.join("server.p12");
        let st = std::process::Command::new(&openssl)
            .args(["pkcs12", "-export", "-passout", "pass:bench", "-out"])
            .arg(&p12)
            .arg("-inkey")
            .arg(&key)
            .arg("-in")
            .arg(&crt)
            .output()
            .context("running openssl pkcs12")?;
        ensure!(st.status.success(), "openssl pkcs12: {}", String::from_utf8_lossy(&st.stderr));
        let _ = write!(
            server,
            "[server.transport]\ntype = \"tls\"\n[server.transport.tls]\npkcs12 = \"{}\"\npkcs12_password = \"bench\"\n",
            p12.display()
        );
        let _ = write!(
            client,
            "[client.transport]\ntype = \"tls\"\n[client.transport.tls]\ntrusted_root = \"{}\"\nhostname = \"proxy.bench.local\"\n",
            ca.display()
        );
    }
    let mut visitors = Vec::new();
    for (name, target) in services {
        let v = host::free_port([127, 0, 0, 1])?;
        let _ = write!(server, "[server.services.{name}]\nbind_addr = \"{v}\"\n");
        let _ = write!(client, "[client.services.{name}]\nlocal_addr = \"{target}\"\n");
        visitors.push((*name, v));
    }
    let (sc, cc) = (d.join("server.toml"), d.join("client.toml"));
    std::fs::write(&sc, server)?;
    std::fs::write(&cc, client)?;
    let mut scmd = env.anchor_command(&bin);
    scmd.arg("-s").arg(&sc).env("RUST_LOG", "error");
    let sp = start_listening(scmd, &[ctrl]).await.with_context(|| format!("starting the {label} server"))?;
    let mut ccmd = env.far_command(&bin);
    ccmd.arg("-c").arg(&cc).env("RUST_LOG", "error");
    let cp = Proc::spawn(ccmd)?;
    let mut r = Running::new(label, Kind::Anchor);
    r.procs.push(sp);
    r.procs.push(cp);
    // The server binds a service's visitor port once the client has registered it.
    for (name, v) in visitors {
        wait_listening_alive(&mut r, v).await?;
        r.set_addr(name, v);
    }
    Ok(r)
}

async fn wait_listening_alive(r: &mut Running, a: SocketAddr) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + ANCHOR_START;
    // Bounded by the deadline.
    loop {
        r.check_alive()?;
        if tokio::net::TcpStream::connect(a).await.is_ok() {
            return Ok(());
        }
        ensure!(tokio::time::Instant::now() < deadline, "{}: nothing listening on {a}", r.label);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// sshd on a loopback port with its own config and throw-away keys, and `ssh -N -R` from the
/// "shoot" to it: one SSH connection whose channels carry every forwarded connection. For each
/// `(name, target)` sshd listens on a loopback port (role = name) forwarded to the target.
pub(crate) async fn ssh_reverse(
    env: &Env<'_>,
    label: &str,
    forwards: &[(&str, SocketAddr)],
) -> anyhow::Result<Running> {
    check_anchor(label)?;
    let sshd = env.anchors.sshd.clone().map_err(anyhow::Error::msg)?;
    let ssh = env.anchors.ssh.clone().map_err(anyhow::Error::msg)?;
    let keygen = env.anchors.ssh_keygen.clone().map_err(anyhow::Error::msg)?;
    let d = subdir(env, label)?;
    host::dir_with_mode(&d, 0o700)?;
    for k in ["host_key", "user_key"] {
        let out = std::process::Command::new(&keygen)
            .args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(d.join(k))
            .output()
            .context("ssh-keygen")?;
        ensure!(out.status.success(), "ssh-keygen: {}", String::from_utf8_lossy(&out.stderr));
    }
    std::fs::copy(d.join("user_key.pub"), d.join("authorized_keys"))?;
    // sshd's privilege-separation directory (Debian's service script normally makes it).
    let _ = std::fs::create_dir_all("/run/sshd");
    let port = env.near_port()?;
    let conf = format!(
        "ListenAddress {port}\nHostKey {dir}/host_key\nPidFile {dir}/sshd.pid\nAuthorizedKeysFile {dir}/authorized_keys\n\
         PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n\
         StrictModes no\nAllowTcpForwarding yes\nGatewayPorts no\nUseDNS no\nPrintMotd no\nLogLevel ERROR\n\
         MaxStartups 100\nClientAliveInterval 0\n",
        dir = d.display()
    );
    std::fs::write(d.join("sshd_config"), conf)?;
    let mut scmd = env.anchor_command(&sshd);
    scmd.arg("-D").arg("-e").arg("-f").arg(d.join("sshd_config"));
    let sp = start_listening(scmd, &[port]).await.with_context(|| format!("starting sshd for {label}"))?;
    let user = if nix_is_root() { "root".to_owned() } else { std::env::var("USER").unwrap_or_else(|_| "root".into()) };
    let mut ccmd = env.far_command(&ssh);
    ccmd.args([
        "-N",
        "-T",
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=no",
        "-o",
        "UserKnownHostsFile=/dev/null",
    ])
    .args(["-o", "ExitOnForwardFailure=yes", "-o", "LogLevel=ERROR", "-i"])
    .arg(d.join("user_key"))
    .arg("-p")
    .arg(port.port().to_string());
    let mut visitors = Vec::new();
    for (name, target) in forwards {
        let v = host::free_port([127, 0, 0, 1])?;
        ccmd.arg("-R").arg(format!("{v}:{}:{}", target.ip(), target.port()));
        visitors.push((*name, v));
    }
    ccmd.arg(format!("{user}@{}", env.ends.near_ip));
    let cp = Proc::spawn(ccmd)?;
    let mut r = Running::new(label, Kind::Anchor);
    r.procs.push(sp);
    r.procs.push(cp);
    for (name, v) in visitors {
        wait_listening_alive(&mut r, v).await?;
        r.set_addr(name, v);
    }
    Ok(r)
}

/// Start the echo helper process (`bench serve-echo`), pinned like the harness (it inherits
/// the harness's CPU). Returns the process and the echo address.
pub(crate) async fn echo_helper(dir: &Path) -> anyhow::Result<(Proc, SocketAddr)> {
    let exe = std::env::current_exe()?;
    let file = dir.join("echo-helper.addr");
    let _ = std::fs::remove_file(&file);
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("serve-echo").arg("--addr-file").arg(&file);
    let mut p = Proc::spawn(cmd)?;
    let f = file.clone();
    let addr = testbed::poll_until(Duration::from_secs(10), Duration::from_millis(10), || {
        let f = f.clone();
        async move { std::fs::read_to_string(&f).ok().and_then(|s| s.trim().parse::<SocketAddr>().ok()) }
    })
    .await;
    match addr {
        Ok(a) => Ok((p, a)),
        Err(e) => {
            let alive = p.running();
            Err(e.context(format!("echo helper (running: {alive}) wrote no address; log:\n{}", p.log())))
        }
    }
}

/// A system that could not be started: a skipped row with the reason.
#[derive(Debug)]
pub(crate) enum Slot {
    Up(Running),
    Skipped { label: String, kind: Kind, reason: String },
}

impl Slot {
    /// Turn a start attempt into a slot; a failure becomes the skip reason (first line of the
    /// error chain plus the log tail are printed to stderr).
    pub(crate) fn from(label: &str, kind: Kind, r: anyhow::Result<Running>) -> Self {
        match r {
            Ok(run) => Self::Up(run),
            Err(e) => {
                let full = format!("{e:#}");
                let first = full.lines().next().unwrap_or("").chars().take(160).collect::<String>();
                if !full.contains("not installed") && !full.contains("missing") && !full.contains("filtered out") {
                    eprintln!("bench: {label} did not start: {full}");
                }
                Self::Skipped { label: label.into(), kind, reason: first }
            }
        }
    }

    pub(crate) fn skipped(label: &str, kind: Kind, reason: &str) -> Self {
        Self::Skipped { label: label.into(), kind, reason: reason.into() }
    }
}
