//! Network namespaces and veth pairs for topology tests (seed, shoot, second seed as "hosts").
//! Everything goes through the `ip` tool; processes run inside with `ip netns exec`, and sockets
//! of this process are made inside one while a thread has [entered](Netns::enter) it.

use anyhow::{Context as _, bail};
use std::ffi::OsStr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Once;
use std::sync::atomic::{AtomicU32, Ordering};

static COUNTER: AtomicU32 = AtomicU32::new(0);
static CLEANUP: Once = Once::new();

/// True when running as root. Otherwise prints `SKIP: needs root` so an unprivileged run shows
/// which tests did not run; use as `if !require_root() { return; }`.
pub fn require_root() -> bool {
    // The effective uid is the 'Uid:' line's second field in /proc/self/status (no libc call).
    let euid = std::fs::read_to_string("/proc/self/status").ok().and_then(|s| {
        s.lines().find_map(|l| l.strip_prefix("Uid:")).and_then(|l| l.split_whitespace().nth(1).map(str::to_owned))
    });
    let root = euid.as_deref() == Some("0");
    if !root {
        eprintln!("SKIP: needs root (network namespaces)");
    }
    root
}

/// Run a command to completion; an error carries its stderr.
fn run(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn ip(args: &[&str]) -> anyhow::Result<String> {
    run(Command::new("ip").args(args))
}

/// `ip -n <ns> args...`.
pub(crate) fn ip_in(ns: &str, args: &[&str]) -> anyhow::Result<String> {
    run(Command::new("ip").arg("-n").arg(ns).args(args))
}

/// Delete namespaces a killed earlier run left behind: `sg-<pid>-...` whose pid is gone.
fn cleanup_stale() {
    let Ok(list) = ip(&["netns", "list"]) else { return };
    for name in list.lines().filter_map(|l| l.split_whitespace().next()) {
        let Some(pid) = name.strip_prefix("sg-").and_then(|r| r.split('-').next()) else {
            continue;
        };
        if pid.parse::<u32>().is_ok() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(&["netns", "del", name]);
            let _ = std::fs::remove_dir_all(format!("/etc/netns/{name}"));
        }
    }
}

/// A network namespace named `sg-<pid>-<n>-<label>`, with `lo` up. Dropping it deletes it (and
/// the veth ends inside it) and its `/etc/netns/<name>` directory if this created one.
#[derive(Debug)]
pub struct Netns {
    name: String,
    etc_dir: Option<PathBuf>,
}

impl Netns {
    pub fn create(label: &str) -> anyhow::Result<Self> {
        CLEANUP.call_once(cleanup_stale);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("sg-{}-{n}-{label}", std::process::id());
        ip(&["netns", "add", &name])?;
        let ns = Self { name, etc_dir: None };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `ip -n <name> args...` (addresses, routes, links inside the namespace).
    pub fn ip(&self, args: &[&str]) -> anyhow::Result<String> {
        ip_in(&self.name, args)
    }

    /// `ip netns exec <name> <program>`: add arguments, then run it or hand it to
    /// [`crate::proc::Proc::spawn`]. `ip` execs the program, so its pid is the program's.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name]).arg(program);
        c
    }

    /// Run `program args...` inside the namespace to completion; returns its stdout.
    pub fn exec(&self, program: &str, args: &[&str]) -> anyhow::Result<String> {
        run(self.command(program).args(args))
    }

    /// Set sysctls inside the namespace (`net.ipv4.*` and most of `net.core.*` are per
    /// namespace), e.g. `[("net.ipv4.tcp_congestion_control", "cubic")]`.
    pub fn sysctl(&self, settings: &[(&str, &str)]) -> anyhow::Result<()> {
        let mut cmd = self.command("sysctl");
        cmd.arg("-q").arg("-w");
        for (k, v) in settings {
            cmd.arg(format!("{k}={v}"));
        }
        run(&mut cmd).map(drop)
    }

    /// Read one sysctl inside the namespace (whitespace-separated fields as `sysctl -n` prints them).
    pub fn sysctl_value(&self, key: &str) -> anyhow::Result<String> {
        Ok(self.exec("sysctl", &["-n", key])?.trim().to_owned())
    }

    /// Move the calling thread into the namespace until the guard drops (it moves back to where
    /// it was): every socket the thread creates meanwhile, and every process it starts, lives in
    /// the namespace. Sockets keep their namespace afterwards, so a listener made here is served
    /// from anywhere. The guard is not `Send`: it must drop on the thread it was made on.
    pub fn enter(&self) -> anyhow::Result<Entered<'_>> {
        let here = std::fs::File::open("/proc/thread-self/ns/net").context("opening this thread's namespace")?;
        let there = std::fs::File::open(format!("/run/netns/{}", self.name))
            .with_context(|| format!("opening namespace {}", self.name))?;
        set_thread_netns(&there).with_context(|| format!("entering namespace {}", self.name))?;
        Ok(Entered { back: here, _ns: std::marker::PhantomData, _not_send: std::marker::PhantomData })
    }

    /// Write `/etc/netns/<name>/hosts`, which `ip netns exec` bind-mounts over `/etc/hosts`.
    pub fn set_hosts(&mut self, entries: &[(&str, &str)]) -> anyhow::Result<()> {
        let dir = PathBuf::from(format!("/etc/netns/{}", self.name));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        self.etc_dir = Some(dir.clone());
        let mut text = String::from("127.0.0.1 localhost\n::1 localhost\n");
        for (ip, name) in entries {
            text.push_str(&format!("{ip} {name}\n"));
        }
        std::fs::write(dir.join("hosts"), text).context("writing hosts")?;
        Ok(())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.name]);
        if let Some(d) = &self.etc_dir {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// The calling thread is inside a namespace until this drops (see [`Netns::enter`]).
#[derive(Debug)]
pub struct Entered<'a> {
    back: std::fs::File,
    _ns: std::marker::PhantomData<&'a Netns>,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        // Failing to go back would leave the thread where it should not be: nothing can carry on.
        if let Err(e) = set_thread_netns(&self.back) {
            panic!("cannot move the thread back to its network namespace: {e}");
        }
    }
}

/// setns(2) of the calling thread into the network namespace `ns` (an open namespace file).
fn set_thread_netns(ns: &std::fs::File) -> std::io::Result<()> {
    use std::os::fd::AsRawFd as _;
    // SAFETY: setns takes a descriptor that `ns` keeps open for the call and a flag; it touches
    // no memory of ours. CLONE_NEWNET changes only this thread's network namespace.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A veth pair; dropping it deletes the pair (a no-op when a namespace holding an end was
/// deleted first, which takes the pair with it).
#[derive(Debug)]
pub struct Veth {
    /// Interface names (at most 15 characters).
    pub a: String,
    pub b: String,
    /// The namespace of end `a`, `None` for the test's own (root) namespace.
    ns_a: Option<String>,
}

/// Create a veth pair with end `a` in `ns_a` and end `b` in `ns_b` (`None`: the test's own
/// namespace), assign `addr_a`/`addr_b` (CIDR form, e.g. `10.200.1.1/24`) and bring both up.
pub fn veth(ns_a: Option<&Netns>, ns_b: Option<&Netns>, addr_a: &str, addr_b: &str) -> anyhow::Result<Veth> {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    // Interface names are limited to 15 bytes: "sg" + pid (<= 7 digits) + "v" + n + "a|b".
    let base = format!("sg{}v{n}", std::process::id());
    anyhow::ensure!(base.len() <= 14, "interface name {base} too long");
    let v = Veth { a: format!("{base}a"), b: format!("{base}b"), ns_a: ns_a.map(|n| n.name.clone()) };
    ip(&["link", "add", &v.a, "type", "veth", "peer", "name", &v.b])?;
    for (end, ns, addr) in [(&v.a, ns_a, addr_a), (&v.b, ns_b, addr_b)] {
        let in_ns = |args: &[&str]| match ns {
            Some(ns) => ns.ip(args),
            None => ip(args),
        };
        if let Some(ns) = ns {
            ip(&["link", "set", end, "netns", &ns.name])?;
        }
        in_ns(&["addr", "add", addr, "dev", end])?;
        in_ns(&["link", "set", end, "up"])?;
    }
    Ok(v)
}

impl Drop for Veth {
    fn drop(&mut self) {
        let _ = match &self.ns_a {
            Some(ns) => ip(&["-n", ns, "link", "del", &self.a]),
            None => ip(&["link", "del", &self.a]),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn namespaces_talk_over_veth() {
        if !require_root() {
            return;
        }
        let mut a = Netns::create("a").unwrap();
        let b = Netns::create("b").unwrap();
        let _ab = veth(Some(&a), Some(&b), "10.231.1.1/24", "10.231.1.2/24").unwrap();
        // The test's own namespace hosts a backend that a client inside `a` reaches by name.
        let _root_a = veth(None, Some(&a), "10.231.2.1/24", "10.231.2.2/24").unwrap();
        let page =
            crate::HttpBackend::start_on("10.231.2.1:0".parse().unwrap(), "text/plain", "from root\n").await.unwrap();
        a.set_hosts(&[("10.231.2.1", "root.test"), ("10.231.1.2", "b.test")]).unwrap();
        let url = format!("http://root.test:{}/", page.addr().port());
        let ns = a.name().to_owned();
        // Blocking child processes run off the runtime so the in-process backend can answer.
        let (out, hosts) = tokio::task::spawn_blocking(move || {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", &ns, "curl", "-sS", "--max-time", "10", &url]);
            let out = run(&mut c);
            let mut c = Command::new("ip");
            c.args(["netns", "exec", &ns, "getent", "hosts", "b.test"]);
            (out, run(&mut c))
        })
        .await
        .unwrap();
        assert_eq!(out.unwrap(), "from root\n");
        assert!(hosts.unwrap().starts_with("10.231.1.2"));
        let name = a.name().to_owned();
        drop(a);
        assert!(!ip(&["netns", "list"]).unwrap().contains(&name));
        assert!(!std::path::Path::new(&format!("/etc/netns/{name}")).exists());
    }
}
