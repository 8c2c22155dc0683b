//! Control-plane migration worlds (root only): seeds and a shoot in network namespaces, the loads
//! that run through a move, and the operator's steps; shared by the migration tests and the bench.
//!
//! Address plan of one world, `10.<n>.<subnet>.<host>` ([`Net`]); the caller's process is the
//! operator and the seed-side clients:
//!
//! ```text
//!  caller ── 10.N.0.0/24 ── shoot (agents, their apiserver proxies and admins on 10.N.0.2, echo backend)
//!  caller ── 10.N.10.0/24 ── seed A (admins, egress front ends)   caller ── 10.N.20.0/24 ── seed B
//!  shoot ── 10.N.1.0/24 ── seed A      shoot ── 10.N.2.0/24 ── seed B      A ── 10.N.3.0/24 ── B
//! ```
//! The shoot finds its seed by name (`api.seed.test`, `proxy.seed.test`, `api.shoot.test`)
//! through a hosts file rewritten in place (what `ip netns exec` bind-mounts over /etc/hosts).

mod etcd;
mod ha;
mod load;

pub use etcd::{Etcd, EtcdWatch, EtcdWriter, WatchReport};
pub use ha::{Agent, AgentSet, Bins, HaSeed, HaWorld, MoveReport, REPLICAS, Transport};
pub use load::{ConnectLoad, LoadTally, PodLoad, Running, Targets};

use crate::admin::{http_get, http_request, metric_value};
use crate::netns::Netns;
use anyhow::Context as _;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// The longest wait for one step (a process up, agents connected, a reload).
pub const WAIT: Duration = Duration::from_secs(20);
/// How often a waiting step polls.
pub const TICK: Duration = Duration::from_millis(20);
/// The shoot's cluster name (the agents' certificate CN).
pub const CLUSTER: &str = "shoot-a";
/// The kube-apiserver's name, as in-cluster clients see it.
pub const API_NAME: &str = "kubernetes.default.svc";
/// The shoot's API name outside the cluster (the SNI route of the seed's :443 listener).
pub const SHOOT_API: &str = "api.shoot.test";
/// proxy-server's admin token (for `PUT /control/clusters/...`).
pub const TOKEN: &str = "migration-test-token";
/// The shoot's echo backend, reachable only through the tunnel.
pub const ECHO: &str = "127.0.0.1:7000";

/// One world's address plan, `10.<n>.<subnet>.<host>`. Each world has its own `n`: the
/// caller-side ends of the veth pairs live in the one root namespace, and two worlds on the same
/// subnets would steal each other's traffic.
#[derive(Clone, Copy, Debug)]
pub struct Net(pub u8);

impl Net {
    pub fn ip(self, subnet: u8, host: u8) -> String {
        format!("10.{}.{subnet}.{host}", self.0)
    }
    pub fn cidr(self, subnet: u8, host: u8) -> String {
        format!("{}/24", self.ip(subnet, host))
    }
    /// Where the pods reach the kube-apiserver: a node-local proxy's listen address.
    pub fn pod_api(self) -> String {
        self.shoot_addr(6443)
    }
    /// An address of the shoot's node (its veth to the caller) on `port`.
    pub fn shoot_addr(self, port: u16) -> String {
        format!("{}:{port}", self.ip(0, 2))
    }
    /// The whole world's range (routers trust PROXY headers from it).
    pub fn range(self) -> String {
        format!("10.{}.0.0/16", self.0)
    }
}

/// The shoot's hosts file with every seed name on `seed_ip`.
pub fn hosts_text(seed_ip: &str) -> String {
    format!("127.0.0.1 localhost\n{0} api.seed.test\n{0} proxy.seed.test\n{0} {SHOOT_API}\n", seed_ip)
}

/// Write the shoot's hosts file (before anything starts in it: `ip netns exec` mounts it then).
pub fn init_dns(shoot: &mut Netns, seed_ip: &str) -> anyhow::Result<()> {
    shoot.set_hosts(&[])?;
    switch_dns(shoot, seed_ip)
}

/// Point the shoot's names at `seed_ip`. The file is rewritten in place without truncating (both
/// seeds' addresses have the same length), so a lookup racing with the switch sees the old or
/// the new address, never an empty file.
pub fn switch_dns(shoot: &Netns, seed_ip: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    let path = format!("/etc/netns/{}/hosts", shoot.name());
    let mut f = std::fs::OpenOptions::new().write(true).open(&path).with_context(|| path.clone())?;
    f.write_all(hosts_text(seed_ip).as_bytes())?;
    Ok(())
}

/// A value of proxy-server's `/metrics` (0 when absent); `None` when the admin does not answer.
pub async fn admin_metric(admin: SocketAddr, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let (_, text) = http_get(admin, "/metrics").await.ok()?;
    Some(metric_value(&text, name, labels).unwrap_or(0.0))
}

/// `PUT /control/clusters/<CLUSTER>` on a proxy-server admin.
pub async fn put_cluster(admin: SocketAddr, body: &str) -> anyhow::Result<()> {
    let path = format!("/control/clusters/{CLUSTER}");
    let (code, text) = http_request(admin, "PUT", &path, Some(body), Some(TOKEN)).await?;
    anyhow::ensure!(code == 200, "PUT {admin}{path} answered {code}: {text}");
    Ok(())
}

/// Successful config reloads of a binary (-1 when its admin does not answer).
pub async fn reload_count(admin: SocketAddr) -> f64 {
    let Ok((_, text)) = http_get(admin, "/metrics").await else {
        return -1.0;
    };
    metric_value(&text, "seedgate_config_reloads_total", &[("result", "success")]).unwrap_or(0.0)
}

/// Rewrite a watched config file and wait for the binary to load it.
pub async fn reload_file(admin: SocketAddr, path: &std::path::Path, yaml: &str) -> anyhow::Result<()> {
    let before = reload_count(admin).await;
    std::fs::write(path, yaml).with_context(|| path.display().to_string())?;
    crate::poll_until(WAIT, TICK, || async { (reload_count(admin).await > before).then_some(()) })
        .await
        .with_context(|| format!("{} was not reloaded", path.display()))
}

/// Open a CONNECT through an egress front end to the shoot's echo backend: the stream, or the
/// refusal's status line and body.
pub async fn connect_echo(egress: SocketAddr) -> anyhow::Result<Result<TcpStream, String>> {
    let mut s = TcpStream::connect(egress).await?;
    s.write_all(format!("CONNECT {ECHO} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").as_bytes()).await?;
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        anyhow::ensure!(tokio::time::timeout(WAIT, s.read(&mut b)).await?? == 1, "closed before the response head");
        head.push(b[0]);
        anyhow::ensure!(head.len() < 4096, "response head too long");
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    if head.starts_with("HTTP/1.1 200") {
        Ok(Ok(s))
    } else {
        let mut body = String::new();
        let _ = tokio::time::timeout(WAIT, s.read_to_string(&mut body)).await;
        Ok(Err(format!("{} {}", head.lines().next().unwrap_or(""), body.trim())))
    }
}

/// Write `msg` and read it back.
pub async fn echo_once(s: &mut TcpStream, msg: &[u8]) -> anyhow::Result<()> {
    s.write_all(msg).await?;
    let mut b = vec![0u8; msg.len()];
    tokio::time::timeout(WAIT, s.read_exact(&mut b)).await??;
    anyhow::ensure!(b == msg, "echo mismatch");
    Ok(())
}

/// Start the kube-apiserver stand-in (`stand-in tls-http`, answering with `backend=<name>`) on
/// 127.0.0.1:7443 inside `ns`.
pub async fn start_apiserver(
    stand_in: &std::path::Path,
    ns: &Netns,
    dir: &crate::TempDir,
    ca: &crate::Ca,
    name: &str,
) -> anyhow::Result<crate::Proc> {
    let (crt, key) = ca.server(&[API_NAME])?.write(dir.path(), name)?;
    let mut api = ns.command(stand_in);
    api.args(["tls-http", "--listen", "127.0.0.1:7443", "--name", name, "--cert"]).arg(&crt).arg("--key").arg(&key);
    let apiserver = crate::Proc::spawn(api)?;
    apiserver.wait_log_line(&["listening"], WAIT).await?;
    Ok(apiserver)
}

/// The veth pairs of a world ([`Net`]'s plan) between the caller, the shoot and seeds A and B.
pub fn wire(net: Net, shoot: &Netns, a: &Netns, b: &Netns) -> anyhow::Result<Vec<crate::netns::Veth>> {
    use crate::netns::veth;
    Ok(vec![
        veth(None, Some(shoot), &net.cidr(0, 1), &net.cidr(0, 2))?,
        veth(None, Some(a), &net.cidr(10, 1), &net.cidr(10, 2))?,
        veth(None, Some(b), &net.cidr(20, 1), &net.cidr(20, 2))?,
        veth(Some(shoot), Some(a), &net.cidr(1, 1), &net.cidr(1, 2))?,
        veth(Some(shoot), Some(b), &net.cidr(2, 1), &net.cidr(2, 2))?,
        veth(Some(a), Some(b), &net.cidr(3, 1), &net.cidr(3, 2))?,
    ])
}

/// The shoot's echo backend on [`ECHO`] inside `shoot`.
pub async fn start_echo(stand_in: &std::path::Path, shoot: &Netns) -> anyhow::Result<crate::Proc> {
    let mut echo = shoot.command(stand_in);
    echo.args(["echo", "--listen", ECHO]);
    let echo = crate::Proc::spawn(echo)?;
    echo.wait_log_line(&["listening"], WAIT).await?;
    Ok(echo)
}

/// Percentile `p` (0..=100) of `v` by nearest rank (`NaN` when empty).
pub fn percentile(v: &[f64], p: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * s.len() as f64).ceil().max(1.0) as usize;
    s[rank.min(s.len()) - 1]
}
