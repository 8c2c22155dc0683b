//! Rigs for faults on the seed–shoot path (the emulated link of [`crate::link`]): proxy-server in process in the seed namespace, proxy-agent as a process in the shoot's, one replica or two behind sni-router on two paths; and what a dial made during a fault came to.
//!
//! The caller makes the [`Wan`] and enters its seed namespace on the thread that builds the rig
//! and dials (sockets keep the namespace they were made in; the in-process binaries' threads
//! start there too). The echo target listens on the shoot's address of the first path.

use crate::link::Wan;
use crate::proc::Proc;
use crate::tunnel_kit::{
    AgentOpts, BoxStream, Dialer, Fe, FeKind, SERVER_NAME, TunnelPki, agent_yaml, connect, inproc_server, metrics,
    refusal_of, server_yaml, start_agent, wait_agents,
};
use crate::{InProc, TcpEcho, TempDir, metric_sum, poll_until};
use anyhow::Context as _;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// The cluster the rigs' agent serves.
pub const CLUSTER: &str = "shoot-a";
/// The test kit's keepalive line (both ends), which [`RigOpts::keepalive`] replaces.
const KIT_KEEPALIVE: &str = "keepalive: { interval: 500ms, suspect_after: 2s, timeout: 2s }";

/// What differs between rigs.
#[derive(Debug, Clone)]
pub struct RigOpts {
    pub quic: bool,
    /// The `keepalive:` line of both ends (e.g. `keepalive: { interval: 500ms, suspect_after:
    /// 1500ms, timeout: 30s }`); `None`: the products' defaults.
    pub keepalive: Option<String>,
    /// The proxy-agent binary (`None`: the one of this build's profile, built when stale).
    pub agent_bin: Option<std::path::PathBuf>,
}

/// What came of one dial: an echo round trip through a front end.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Served,
    /// Refused: the status and the reason the front end gave.
    Refused(u16, String),
    /// Neither within the client's wait.
    NoAnswer,
    /// The connection to the front end failed otherwise (why).
    Failed(String),
}

/// One dial and how long it took to come to its outcome.
#[derive(Debug, Clone)]
pub struct Dialled {
    pub outcome: Outcome,
    pub took: Duration,
    /// How long the front end took to answer the CONNECT with `200` (`None`: it did not), the
    /// echo round trip after it aside.
    pub answered: Option<Duration>,
}

impl Dialled {
    /// How long the dial waited for its answer: the CONNECT's `200` when it was served (the echo
    /// round trip after it is the new stream's bytes crossing the link), else its outcome.
    pub fn waited(&self) -> Duration {
        match (&self.outcome, self.answered) {
            (Outcome::Served, Some(answered)) => answered,
            _ => self.took,
        }
    }
}

/// One echo round trip of `msg`.
pub async fn roundtrip(s: &mut BoxStream, msg: &[u8]) -> anyhow::Result<()> {
    s.write_all(msg).await?;
    let mut back = vec![0u8; msg.len()];
    s.read_exact(&mut back).await?;
    anyhow::ensure!(back == msg, "echo mismatch");
    Ok(())
}

/// A CONNECT to `target` through `d` and an echo round trip, given up after `wait` (the
/// client's patience).
pub async fn dial(d: Dialer, target: SocketAddr, wait: Duration) -> Dialled {
    let start = Instant::now();
    let mut answered = None;
    let attempt = async {
        let mut s = connect(&d, &target.to_string()).await?;
        answered = Some(start.elapsed());
        roundtrip(&mut s, b"dial").await
    };
    let outcome = match tokio::time::timeout(wait, attempt).await {
        Err(_) => Outcome::NoAnswer,
        Ok(Ok(())) => Outcome::Served,
        Ok(Err(e)) => match refusal_of(&e) {
            Some(r) => Outcome::Refused(r.status, r.body.clone()),
            None => Outcome::Failed(format!("{e:#}")),
        },
    };
    Dialled { outcome, took: start.elapsed(), answered }
}

/// proxy-server replicas in the seed namespace, an agent in the shoot's, an echo target there.
pub struct Rig {
    pub echo: TcpEcho,
    /// The replicas, in order.
    pub servers: Vec<InProc>,
    /// Each replica's front end (plain CONNECT) and admin address.
    pub fronts: Vec<Dialer>,
    pub admins: Vec<SocketAddr>,
    /// The gateway in front of two replicas.
    pub router: Option<InProc>,
    pub agent: Proc,
    /// The agent's admin address, in the shoot namespace (see [`Rig::agent_metrics`]).
    pub agent_admin: SocketAddr,
    _dir: TempDir,
}

fn keepalive(yaml: &str, o: &RigOpts) -> String {
    match &o.keepalive {
        Some(k) => yaml.replace(KIT_KEEPALIVE, k),
        None => yaml.replace(&format!("  {KIT_KEEPALIVE}\n"), ""),
    }
}

/// A replica's config: agents on `listen` (TCP, and UDP too over QUIC), front end `egress`.
fn replica_yaml(pki: &TunnelPki, listen: &str, o: &RigOpts, agents_extra: &str) -> String {
    let mut y = server_yaml(pki, listen, &[Fe::new("egress", CLUSTER, FeKind::Plain)], "");
    let quic = if o.quic { format!("  quic: {{ listen: {listen} }}\n") } else { String::new() };
    y = y.replacen("agents:\n", &format!("agents:\n{quic}{agents_extra}"), 1);
    keepalive(&y, o)
}

impl Rig {
    /// One proxy-server on the first path's seed address, the agent dialing it there.
    pub async fn one(wan: &Wan, label: &str, o: &RigOpts) -> anyhow::Result<Self> {
        let link = wan.link();
        let dir = TempDir::new(label)?;
        let pki = TunnelPki::new(dir.path())?;
        let yaml = replica_yaml(&pki, &format!("{}:0", link.seed_ip()), o, "");
        let (server, addrs) = inproc_server(&dir, &yaml).await?;
        let agents = addrs.listener(if o.quic { "agents-quic" } else { "agents" })?;
        Self::finish(wan, dir, &pki, vec![server], None, &[agents.to_string()], o, 1.0).await
    }

    /// Two replicas (`server_count: 2`) behind sni-router, which listens on the seed's address
    /// of each of the first two paths (a gateway reachable two ways); the agent lists the
    /// gateway once per path, so it holds a session to each replica over each path.
    pub async fn two_replicas(wan: &Wan, label: &str, o: &RigOpts) -> anyhow::Result<Self> {
        let dir = TempDir::new(label)?;
        let pki = TunnelPki::new(dir.path())?;
        let mut servers = Vec::new();
        let mut ups = Vec::new();
        for i in 0..2 {
            let yaml = replica_yaml(&pki, "127.0.0.1:0", o, &format!("  server_id: r{i}\n  server_count: 2\n"));
            let (s, addrs) = inproc_server(&dir, &yaml).await?;
            ups.push(addrs.listener(if o.quic { "agents-quic" } else { "agents" })?.to_string());
            servers.push(s);
        }
        let protocol = if o.quic { "    protocol: udp\n" } else { "" };
        let mut yaml =
            "admin: { listen: 127.0.0.1:0 }\ntimeouts: { handshake: 5s, udp_idle: 60s }\nlisteners:\n".to_owned();
        let paths = [wan.link(), wan.path(1).context("two_replicas needs a second path")?];
        for (i, p) in paths.iter().enumerate() {
            yaml.push_str(&format!(
                "  - name: path{i}\n    listen: {}:0\n{protocol}    routes:\n      - name: tunnel\n        sni: [{SERVER_NAME}]\n        upstreams: [{}]\n        balance: least-connections\n",
                p.seed_ip(),
                ups.join(", ")
            ));
        }
        let (router, raddrs) = InProc::serve(&dir, "sni-router", &yaml).await?;
        let gateways = [raddrs.listener("path0")?.to_string(), raddrs.listener("path1")?.to_string()];
        Self::finish(wan, dir, &pki, servers, Some(router), &gateways, o, 2.0).await
    }

    #[allow(clippy::too_many_arguments)]
    async fn finish(
        wan: &Wan,
        dir: TempDir,
        pki: &TunnelPki,
        servers: Vec<InProc>,
        router: Option<InProc>,
        gateways: &[String],
        o: &RigOpts,
        sessions_each: f64,
    ) -> anyhow::Result<Self> {
        let link = wan.link();
        let echo = {
            let _in_shoot = wan.shoot().enter()?;
            TcpEcho::start_on(SocketAddr::from((link.shoot_ip(), 0))).await?
        };
        let mut ao = AgentOpts::new(CLUSTER, &gateways[0], &[&format!("{}/32", link.shoot_ip())]);
        ao.servers = gateways.to_vec();
        if o.quic {
            ao.tunnel_extra = "  transport: quic\n".into();
        }
        let yaml = keepalive(&agent_yaml(pki, &ao)?, o);
        let (agent, aaddrs) = match &o.agent_bin {
            None => start_agent(&dir, "agent", &yaml, Some(wan.shoot())).await?,
            Some(bin) => Proc::spawn_seedgate(wan.shoot().command(bin), &dir.write("agent.yaml", &yaml)?, &[]).await?,
        };
        let mut fronts = Vec::new();
        let mut admins = Vec::new();
        for s in &servers {
            let a = s.addrs()?;
            fronts.push(Dialer::Tcp(a.listener("egress")?));
            admins.push(a.admin()?);
        }
        let rig = Self { echo, servers, fronts, admins, router, agent, agent_admin: aaddrs.admin()?, _dir: dir };
        for a in &rig.admins {
            wait_agents(*a, CLUSTER, sessions_each).await.with_context(|| rig.logs())?;
        }
        Ok(rig)
    }

    /// Every binary's log, for a failure message.
    pub fn logs(&self) -> String {
        let mut l = String::new();
        for (i, s) in self.servers.iter().enumerate() {
            l.push_str(&format!("--- server r{i}:\n{}\n", s.log()));
        }
        if let Some(r) = &self.router {
            l.push_str(&format!("--- sni-router:\n{}\n", r.log()));
        }
        l.push_str(&format!("--- agent:\n{}", self.agent.log()));
        l
    }

    /// The agent's metrics (its admin listens on the shoot namespace's loopback).
    pub async fn agent_metrics(&self, wan: &Wan) -> anyhow::Result<String> {
        let _in_shoot = wan.shoot().enter()?;
        metrics(self.agent_admin).await
    }

    /// A counter of the replicas for the cluster, summed over them.
    pub fn server_sum(&self, name: &str) -> f64 {
        self.server_sum_by(name, &[])
    }

    /// The same, of the samples with `labels` too.
    pub fn server_sum_by(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let mut l = vec![("cluster", CLUSTER)];
        l.extend_from_slice(labels);
        self.servers.iter().map(|s| metric_sum(&s.metrics(), name, &l)).sum()
    }

    /// A stream through replica `i` to the echo target, one round trip done.
    pub async fn open_stream(&self, i: usize) -> anyhow::Result<BoxStream> {
        let mut s = connect(&self.fronts[i], &self.echo.addr().to_string()).await?;
        roundtrip(&mut s, b"before").await?;
        Ok(s)
    }

    /// Poll until a dial through replica `i` is served.
    pub async fn until_served(&self, i: usize, within: Duration) -> anyhow::Result<()> {
        poll_until(within, Duration::from_millis(50), || async {
            let d = dial(self.fronts[i].clone(), self.echo.addr(), Duration::from_secs(2)).await;
            anyhow::ensure!(d.outcome == Outcome::Served, "{d:?}");
            Ok(())
        })
        .await
    }
}
