//! Finding, building and running the workspace binaries, and the `--write-addresses` contract.

use crate::tmp::TempDir;
use anyhow::{Context as _, bail};
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, SystemTime};

/// The workspace root, fixed when the testbed is compiled.
pub const WORKSPACE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

/// How long a seedgate binary may take to bind and write its address file.
pub const START_DEADLINE: Duration = Duration::from_secs(20);

/// The profile directory (`<target>/<profile>`) of the running executable: test executables
/// live in `<target>/<profile>/deps/`, binaries and examples one level up or in `examples/`.
fn current_profile_dir() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("current_exe")?;
    let mut dir = exe.parent().context("executable has no parent directory")?.to_path_buf();
    if matches!(dir.file_name().and_then(OsStr::to_str), Some("deps" | "examples")) {
        dir.pop();
    }
    Ok(dir)
}

/// The target directory: `CARGO_TARGET_DIR` when set, else the one the running executable is in.
pub fn target_dir() -> anyhow::Result<PathBuf> {
    if let Some(d) = std::env::var_os("CARGO_TARGET_DIR") {
        let d = PathBuf::from(d);
        return Ok(if d.is_relative() { Path::new(WORKSPACE).join(d) } else { d });
    }
    let p = current_profile_dir()?;
    Ok(p.parent().context("profile directory has no parent")?.to_path_buf())
}

/// Set to a directory to run the seedgate binaries found there and never build them.
pub const BIN_DIR_ENV: &str = "SEEDGATE_BIN_DIR";

fn bin_dir_override() -> Option<PathBuf> {
    std::env::var_os(BIN_DIR_ENV).map(PathBuf::from)
}

/// `<target>/<profile of the running executable>/<name>` (or `$SEEDGATE_BIN_DIR/<name>`).
pub fn bin_path(name: &str) -> anyhow::Result<PathBuf> {
    if let Some(d) = bin_dir_override() {
        return Ok(d.join(name));
    }
    let profile = current_profile_dir()?;
    let profile = profile.file_name().and_then(OsStr::to_str).unwrap_or("debug");
    Ok(target_dir()?.join(profile).join(name))
}

/// `<target>/<profile>/<name>` for an explicit profile (`debug` or `release`), or
/// `$SEEDGATE_BIN_DIR/<name>`.
pub fn bin_path_in(profile: &str, name: &str) -> anyhow::Result<PathBuf> {
    if let Some(d) = bin_dir_override() {
        return Ok(d.join(name));
    }
    Ok(target_dir()?.join(profile).join(name))
}

/// Newest modification time of the sources a binary is built from: its package, the shared
/// crates, and the workspace manifests. Bounded walk (source trees are small).
fn newest_source(pkg: &str) -> Option<SystemTime> {
    let ws = Path::new(WORKSPACE);
    let mut newest = None;
    let mut stack: Vec<PathBuf> = vec![ws.join(pkg), ws.join("wire"), ws.join("proxy-core"), ws.join("config")];
    for f in ["Cargo.toml", "Cargo.lock"] {
        stack.push(ws.join(f));
    }
    for _ in 0..10_000 {
        let Some(p) = stack.pop() else { break };
        let Ok(meta) = std::fs::metadata(&p) else { continue };
        if meta.is_dir() {
            if let Ok(rd) = std::fs::read_dir(&p) {
                stack.extend(rd.flatten().map(|e| e.path()));
            }
        } else if let Ok(m) = meta.modified() {
            newest = newest.max(Some(m));
        }
    }
    newest
}

/// Make sure `<target>/<profile>/<bin>` exists and is newer than its sources; otherwise run
/// `$CARGO build [--release] --bins -p <bin> ...` (package name = binary name) in the workspace
/// with `--target-dir <target>`, printing the command. Returns the binaries' paths, in order.
/// With `SEEDGATE_BIN_DIR` set, only checks that the binaries are there.
pub fn ensure_built(profile: &str, bins: &[&str]) -> anyhow::Result<Vec<PathBuf>> {
    anyhow::ensure!(matches!(profile, "debug" | "release"), "profile must be debug or release, not {profile:?}");
    let paths = bins.iter().map(|b| bin_path_in(profile, b)).collect::<anyhow::Result<Vec<_>>>()?;
    if bin_dir_override().is_some() {
        for p in &paths {
            anyhow::ensure!(p.exists(), "{} missing (from ${BIN_DIR_ENV})", p.display());
        }
        return Ok(paths);
    }
    // Tests run in parallel threads: one build at a time, the others then find it fresh (so
    // staleness is judged under the lock).
    static BUILDING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
    let stale: Vec<&str> = bins
        .iter()
        .zip(&paths)
        .filter(|(b, p)| {
            let built = std::fs::metadata(p).and_then(|m| m.modified()).ok();
            match (built, newest_source(b)) {
                (None, _) => true,
                (Some(built), Some(src)) => src > built,
                (Some(_), None) => false,
            }
        })
        .map(|(b, _)| *b)
        .collect();
    if stale.is_empty() {
        return Ok(paths);
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = std::process::Command::new(&cargo);
    cmd.current_dir(WORKSPACE).arg("build").arg("--bins").arg("--target-dir").arg(target_dir()?);
    if profile == "release" {
        cmd.arg("--release");
    }
    for b in &stale {
        cmd.arg("-p").arg(b);
    }
    eprintln!("testbed: building {}: {cmd:?}", stale.join(", "));
    let st = cmd.status().with_context(|| format!("running {cargo:?}"))?;
    anyhow::ensure!(st.success(), "building {} failed: {st}", stale.join(", "));
    for p in &paths {
        anyhow::ensure!(p.exists(), "{} still missing after the build", p.display());
    }
    Ok(paths)
}

/// What a seedgate binary wrote to `--write-addresses`: the admin address and every listener's
/// bound address by listener name (`ip:port`, or `unix:<path>` for a Unix socket).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Addresses {
    pub admin: Option<SocketAddr>,
    #[serde(default)]
    pub listeners: BTreeMap<String, String>,
}

impl Addresses {
    pub fn admin(&self) -> anyhow::Result<SocketAddr> {
        self.admin.context("the process has no admin listener")
    }

    pub fn listener(&self, name: &str) -> anyhow::Result<SocketAddr> {
        let a = self.raw(name)?;
        a.parse().with_context(|| format!("listener {name:?} is {a:?}, not ip:port"))
    }

    /// The socket path of a Unix-socket listener.
    pub fn unix(&self, name: &str) -> anyhow::Result<PathBuf> {
        let a = self.raw(name)?;
        a.strip_prefix("unix:")
            .map(PathBuf::from)
            .with_context(|| format!("listener {name:?} is {a:?}, not unix:<path>"))
    }

    fn raw(&self, name: &str) -> anyhow::Result<&str> {
        self.listeners
            .get(name)
            .map(String::as_str)
            .with_context(|| format!("no listener {name:?} in {:?}", self.listeners.keys().collect::<Vec<_>>()))
    }
}

/// A child process whose stdout and stderr go to one log file. Dropping it kills the child
/// (SIGKILL) and reaps it; the log is removed with its temp dir (see [`TempDir`]).
#[derive(Debug)]
pub struct Proc {
    child: tokio::process::Child,
    pid: u32,
    label: String,
    log_path: PathBuf,
    dir: TempDir,
}

impl Proc {
    /// Start `bin args...` with extra environment variables (inside a tokio runtime).
    pub fn start(bin: impl AsRef<OsStr>, args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<Self> {
        let mut cmd = std::process::Command::new(bin);
        cmd.args(args).envs(env.iter().copied());
        Self::spawn(cmd)
    }

    /// Start a prepared command (e.g. `ns.command(bin)` to run inside a network namespace).
    /// Its stdio is replaced: stdin null, stdout and stderr to the log; `NO_COLOR=1` is set
    /// unless the command sets it.
    pub fn spawn(cmd: std::process::Command) -> anyhow::Result<Self> {
        let label = Path::new(cmd.get_program())
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_else(|| "proc".into());
        let dir = TempDir::new(&label)?;
        let log_path = dir.join("output.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("creating {}", log_path.display()))?;
        let mut cmd = cmd;
        // Plain logs: tests search them for `key=value`, which ANSI colour codes would split.
        if !cmd.get_envs().any(|(k, _)| k == "NO_COLOR") {
            cmd.env("NO_COLOR", "1");
        }
        let mut cmd = tokio::process::Command::from(cmd);
        cmd.stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log).kill_on_drop(true);
        let child = cmd.spawn().with_context(|| format!("starting {cmd:?}"))?;
        let pid = child.id().context("child has no pid")?;
        Ok(Self { child, pid, label, log_path, dir })
    }

    /// Start a seedgate binary with `--config <config> --write-addresses <file> extra_args...`
    /// and wait (up to [`START_DEADLINE`]) for the address file.
    pub async fn start_seedgate(bin: &Path, config: &Path, extra_args: &[&str]) -> anyhow::Result<(Self, Addresses)> {
        Self::spawn_seedgate(std::process::Command::new(bin), config, extra_args).await
    }

    /// Write `yaml` to `<dir>/<stem>.yaml` and start the seedgate binary `bin` on it; also returns
    /// the config's path (rewrite it, or signal SIGHUP, to reload).
    pub async fn start_with_config(
        dir: &TempDir,
        bin: &str,
        stem: &str,
        yaml: &str,
    ) -> anyhow::Result<(Self, Addresses, PathBuf)> {
        let cfg = dir.write(&format!("{stem}.yaml"), yaml)?;
        let (p, addrs) = Self::start_seedgate(&bin_path(bin)?, &cfg, &[]).await?;
        Ok((p, addrs, cfg))
    }

    /// [`Proc::start_seedgate`] for a prepared command (e.g. `ns.command(bin)`).
    pub async fn spawn_seedgate(
        mut cmd: std::process::Command,
        config: &Path,
        extra_args: &[&str],
    ) -> anyhow::Result<(Self, Addresses)> {
        // The file lives next to the log; its name is fixed before spawning so it can go on argv.
        let addr_dir = TempDir::new("addresses")?;
        let file = addr_dir.join("addresses.json");
        cmd.arg("--config").arg(config).arg("--write-addresses").arg(&file).args(extra_args);
        let mut p = Self::spawn(cmd)?;
        let addrs = p.wait_addresses(&file).await;
        drop(addr_dir);
        Ok((p, addrs?))
    }

    async fn wait_addresses(&mut self, file: &Path) -> anyhow::Result<Addresses> {
        let label = self.label.clone();
        let child = &mut self.child;
        // Ok(result) ends the wait (an exit or a parsed file); Err means "not yet".
        let r = crate::poll::poll_until(START_DEADLINE, Duration::from_millis(10), || {
            let exited = child.try_wait();
            let read = std::fs::read(file);
            let label = &label;
            async move {
                if let Ok(Some(st)) = exited {
                    return Ok(Err(anyhow::anyhow!("{label} exited with {st} before writing {}", file.display())));
                }
                // The binary writes FILE.tmp and renames it, so a file that exists is complete.
                match read {
                    Ok(bytes) => Ok(serde_json::from_slice::<Addresses>(&bytes)
                        .with_context(|| format!("parsing {}: {}", file.display(), String::from_utf8_lossy(&bytes)))),
                    Err(e) => Err(anyhow::anyhow!("{}: {e}", file.display())),
                }
            }
        })
        .await;
        let r = match r {
            Ok(done) => done,
            Err(e) => Err(e.context(format!("{label} did not write its address file"))),
        };
        r.map_err(|e| e.context(format!("log of {label}:\n{}", self.log())))
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Send a signal (`libc::SIGHUP`, `libc::SIGTERM`, ...). Refused once the child has been
    /// reaped, so a recycled pid is never signalled.
    pub fn signal(&mut self, sig: i32) -> anyhow::Result<()> {
        if let Some(st) = self.child.try_wait()? {
            bail!("{} already exited ({st})", self.label);
        }
        let pid = libc::pid_t::try_from(self.pid)?;
        // SAFETY: kill(2) takes plain integers and touches no memory of ours; the pid is our
        // own unreaped child (checked just above), so it cannot name another process.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::kill(pid, sig) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error()).with_context(|| format!("kill({pid}, {sig})"));
        }
        Ok(())
    }

    /// Wait up to `deadline` for the child to exit; `None` if it is still running.
    pub async fn wait_exit(&mut self, deadline: Duration) -> Option<ExitStatus> {
        tokio::time::timeout(deadline, self.child.wait()).await.ok()?.ok()
    }

    /// Whether the child is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Everything the child wrote to stdout and stderr so far.
    pub fn log(&self) -> String {
        std::fs::read(&self.log_path).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
    }

    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// A scratch directory that lives as long as the process handle.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Wait up to `deadline` for a log line containing every one of `needles`; returns the line.
    /// (Access-log events are written when a connection closes, so they trail the client.)
    pub async fn wait_log_line(&self, needles: &[&str], deadline: Duration) -> anyhow::Result<String> {
        wait_log_line(&self.label, || self.log(), needles, deadline).await
    }
}

/// Poll `log` of `label` for up to `deadline` for a line containing every one of `needles`.
pub(crate) async fn wait_log_line(
    label: &str,
    log: impl Fn() -> String,
    needles: &[&str],
    deadline: Duration,
) -> anyhow::Result<String> {
    crate::poll::poll_until(deadline, Duration::from_millis(20), || async {
        log().lines().find(|l| needles.iter().all(|n| l.contains(n))).map(str::to_owned)
    })
    .await
    .with_context(|| format!("no log line of {label} with {needles:?}; log:\n{}", log()))
}

impl Drop for Proc {
    fn drop(&mut self) {
        // kill_on_drop would also SIGKILL, but only this reaps at once (tokio reaps orphans
        // lazily), so a test that starts many processes does not pile up zombies.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.start_kill();
            for _ in 0..1000 {
                if !matches!(self.child.try_wait(), Ok(None)) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    }
}

/// Polling bound for [`Files`].
const RUNNING_DEADLINE: Duration = Duration::from_secs(20);
const RUNNING_TICK: Duration = Duration::from_millis(20);

/// A binary's config file, which a reload rewrites, and the addresses file the binary rewrites
/// after every reload. Shared by a process ([`Running`]) and a binary in this process
/// ([`crate::inproc::InProc`]).
#[derive(Debug)]
pub struct Files {
    pub config: PathBuf,
    pub addresses: PathBuf,
}

impl Files {
    /// `<dir>/<stem>.yaml` holding `yaml`, and `<dir>/<stem>.addresses.json` (not written yet).
    pub fn write(dir: &crate::TempDir, stem: &str, yaml: &str) -> anyhow::Result<Self> {
        let config = dir.write(&format!("{stem}.yaml"), yaml)?;
        Ok(Self { config, addresses: dir.join(format!("{stem}.addresses.json")) })
    }

    pub fn read_addresses(&self) -> Option<Addresses> {
        serde_json::from_slice(&std::fs::read(&self.addresses).ok()?).ok()
    }

    /// Poll the addresses file until `pred` holds.
    pub async fn addresses_where(&self, pred: impl Fn(&Addresses) -> bool) -> anyhow::Result<Addresses> {
        crate::poll_until(RUNNING_DEADLINE, RUNNING_TICK, || {
            let a = self.read_addresses();
            let ok = a.as_ref().is_some_and(&pred);
            async move { if ok { Ok(a.expect("checked")) } else { Err(anyhow::anyhow!("not yet")) } }
        })
        .await
        .with_context(|| format!("addresses file now: {:?}", self.read_addresses()))
    }

    pub async fn reload_with(&self, yaml: &str) -> anyhow::Result<()> {
        // Written aside and renamed over, as tools and ConfigMap updates do.
        let tmp = self.config.with_extension("new");
        std::fs::write(&tmp, yaml)?;
        std::fs::rename(&tmp, &self.config)?;
        Ok(())
    }

    pub async fn reloads(&self, admin: SocketAddr, result: &str) -> f64 {
        let text = crate::http_get(admin, "/metrics").await.map(|(_, b)| b).unwrap_or_default();
        crate::metric_value(&text, "seedgate_config_reloads_total", &[("result", result)]).unwrap_or(0.0)
    }

    pub async fn wait_reloads(&self, admin: SocketAddr, result: &str, n: f64) -> anyhow::Result<()> {
        crate::poll_until(RUNNING_DEADLINE, RUNNING_TICK, || async move {
            if self.reloads(admin, result).await >= n { Ok(()) } else { Err(anyhow::anyhow!("not yet")) }
        })
        .await
        .with_context(|| format!("no {result} reload counted"))
    }
}

/// One of the three binaries as a process, started with `--write-addresses` on a file that
/// outlives the start (so rewrites after a reload can be read). Its [`Files`] are reached
/// through `Deref`.
pub struct Running {
    pub proc: Proc,
    pub files: Files,
}

impl std::ops::Deref for Running {
    type Target = Files;
    fn deref(&self) -> &Files {
        &self.files
    }
}

impl Running {
    pub async fn start(dir: &crate::TempDir, bin: &str, yaml: &str) -> anyhow::Result<Self> {
        Self::start_in(dir, bin, yaml, None).await
    }

    /// [`Running::start`] inside the network namespace `ns` when given.
    pub async fn start_in(
        dir: &crate::TempDir,
        bin: &str,
        yaml: &str,
        ns: Option<&crate::netns::Netns>,
    ) -> anyhow::Result<Self> {
        crate::tunnel_kit::ensure_binaries()?;
        ensure_built("debug", &["sni-router"]).ok();
        let files = Files::write(dir, bin, yaml)?;
        let mut cmd = match ns {
            Some(ns) => ns.command(bin_path(bin)?),
            None => std::process::Command::new(bin_path(bin)?),
        };
        cmd.arg("--config").arg(&files.config).arg("--write-addresses").arg(&files.addresses);
        let proc = Proc::spawn(cmd)?;
        let r = Self { proc, files };
        r.addresses_where(|_| true).await?;
        Ok(r)
    }

    /// [`Files::addresses_where`], with the process's log when it fails.
    pub async fn addresses_where(&self, pred: impl Fn(&Addresses) -> bool) -> anyhow::Result<Addresses> {
        self.files.addresses_where(pred).await.with_context(|| format!("log:\n{}", self.proc.log()))
    }

    /// [`Files::wait_reloads`], with the process's log when it fails.
    pub async fn wait_reloads(&self, admin: SocketAddr, result: &str, n: f64) -> anyhow::Result<()> {
        self.files.wait_reloads(admin, result, n).await.with_context(|| format!("log:\n{}", self.proc.log()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn captures_output_and_exit() {
        let mut p = Proc::start("/bin/sh", &["-c", "echo hi; echo err >&2; exit 3"], &[]).unwrap();
        let st = p.wait_exit(Duration::from_secs(10)).await.expect("exits");
        assert_eq!(st.code(), Some(3));
        assert_eq!(p.log(), "hi\nerr\n");
        assert!(p.signal(libc::SIGTERM).is_err(), "no signal to a reaped child");
    }

    #[tokio::test]
    async fn signal_and_kill_on_drop() {
        let mut p = Proc::start("/bin/sh", &["-c", "echo up; exec sleep 1000"], &[]).unwrap();
        p.wait_log_line(&["up"], Duration::from_secs(10)).await.unwrap();
        assert!(p.running());
        p.signal(libc::SIGTERM).unwrap();
        let st = p.wait_exit(Duration::from_secs(10)).await.expect("exits on SIGTERM");
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(st.signal(), Some(libc::SIGTERM));

        let p = Proc::start("/bin/sh", &["-c", "exec sleep 1000"], &[]).unwrap();
        let pid = p.pid();
        drop(p);
        assert!(!Path::new(&format!("/proc/{pid}")).exists(), "killed and reaped on drop");
    }

    #[tokio::test]
    async fn address_file_contract() {
        // A stand-in for a seedgate binary: writes the file the way the contract says.
        let script = r#"f=""; while [ $# -gt 0 ]; do [ "$1" = --write-addresses ] && f="$2"; shift; done
printf '{"admin":"127.0.0.1:9901","listeners":{"gateway":"127.0.0.1:8443"}}' > "$f.tmp" && mv "$f.tmp" "$f"
exec sleep 1000"#;
        let cmd = {
            let mut c = std::process::Command::new("/bin/sh");
            c.args(["-c", script, "sh"]);
            c
        };
        let (_p, a) = Proc::spawn_seedgate(cmd, Path::new("/nonexistent.yaml"), &[]).await.unwrap();
        assert_eq!(a.admin().unwrap().port(), 9901);
        assert_eq!(a.listener("gateway").unwrap().port(), 8443);
        assert!(a.listener("nope").is_err());

        let mut c = std::process::Command::new("/bin/sh");
        c.args(["-c", "echo config is broken >&2; exit 2", "sh"]);
        let e = Proc::spawn_seedgate(c, Path::new("/x.yaml"), &[]).await.unwrap_err();
        let e = format!("{e:#}");
        assert!(e.contains("exited") && e.contains("config is broken"), "{e}");
    }

    #[test]
    fn paths_follow_the_target_dir() {
        let p = bin_path("sni-router").unwrap();
        assert!(p.ends_with("debug/sni-router") || p.ends_with("release/sni-router"), "{}", p.display());
    }
}
