//! The production shape of a move: seeds A and B each with sni-router and three proxy-server
//! replicas behind it (TCP SNI route for h2 sessions, UDP route for QUIC), etcd as the shoot's API
//! server behind each seed's SNI route, agents over h2 and QUIC in the shoot, and the planned move.

use super::{
    CLUSTER, Etcd, Net, TICK, TOKEN, WAIT, admin_metric, init_dns, put_cluster, reload_file, start_apiserver,
    start_echo, switch_dns, wire,
};
use crate::netns::{Netns, Veth};
use crate::{Ca, Proc, TempDir, http_get};
use anyhow::Context as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// proxy-server replicas per seed.
pub const REPLICAS: usize = 3;
/// How long connections of the source's handed-off routes run on (the watch's connection through
/// A ends then, and is re-established).
const ROUTE_DRAIN: &str = "3s";
/// How long the source's tunnel streams (and the agents' old sessions, still open to it for new
/// streams) may run on after the move notice; fencing ends them as soon as the streams ended.
const TUNNEL_DRAIN: &str = "10s";

/// The programs a world runs.
#[derive(Clone, Debug)]
pub struct Bins {
    pub router: PathBuf,
    pub server: PathBuf,
    pub agent: PathBuf,
    pub stand_in: PathBuf,
    /// Run the seedgate binaries on this CPU (`taskset -c`; the bench keeps them apart from its
    /// load generators).
    pub cpu: Option<usize>,
}

impl Bins {
    /// The running executable's profile (tests).
    pub fn current() -> anyhow::Result<Self> {
        crate::tunnel_kit::ensure_binaries()?;
        let p = crate::bin_path;
        Ok(Self {
            router: p("sni-router")?,
            server: p("proxy-server")?,
            agent: p("proxy-agent")?,
            stand_in: p("stand-in")?,
            cpu: None,
        })
    }

    /// `bin` inside `ns`, on [`Bins::cpu`] if set.
    fn command(&self, ns: &Netns, bin: &std::path::Path) -> std::process::Command {
        match self.cpu {
            Some(cpu) => {
                let mut c = ns.command("taskset");
                c.arg("-c").arg(cpu.to_string()).arg(bin);
                c
            }
            None => ns.command(bin),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    H2,
    Quic,
}

impl Transport {
    pub fn name(self) -> &'static str {
        match self {
            Self::H2 => "h2",
            Self::Quic => "quic",
        }
    }
}

/// One seed: its namespace, gateway (sni-router) and replicas, and a kube-apiserver stand-in.
pub struct HaSeed {
    /// `a` or `b`: the prefix of the replicas' ids (`a-r0`...).
    pub name: &'static str,
    replicas: Vec<Proc>,
    router: Proc,
    _apiserver: Proc,
    router_cfg: PathBuf,
    /// The address the caller reaches admins and egress front ends on.
    pub mgmt_ip: String,
    /// The address the shoot reaches the gateway on.
    pub shoot_ip: String,
    /// The address the other seed reaches the gateway on.
    pub peer_ip: String,
    _ns: Netns,
}

impl HaSeed {
    pub fn router_admin(&self) -> SocketAddr {
        format!("{}:9901", self.mgmt_ip).parse().expect("addr")
    }
    pub fn replica_admin(&self, i: usize) -> SocketAddr {
        format!("{}:{}", self.mgmt_ip, 9910 + i).parse().expect("addr")
    }
    pub fn egress(&self, i: usize) -> SocketAddr {
        format!("{}:{}", self.mgmt_ip, 9443 + i).parse().expect("addr")
    }
    /// Every replica's egress front end, labelled `<seed>-r<i>`.
    pub fn egresses(&self) -> Vec<(String, SocketAddr)> {
        (0..REPLICAS).map(|i| (format!("{}-r{i}", self.name), self.egress(i))).collect()
    }
    pub fn logs(&self) -> String {
        let mut s = format!("--- sni-router {}:\n{}", self.name, self.router.log());
        for (i, r) in self.replicas.iter().enumerate() {
            s.push_str(&format!("--- proxy-server {}-r{i}:\n{}", self.name, r.log()));
        }
        s
    }

    /// A metric summed over the replicas (`None`: a replica's admin did not answer).
    pub async fn replicas_metric(&self, name: &str) -> Option<f64> {
        let mut sum = 0.0;
        for i in 0..REPLICAS {
            sum += admin_metric(self.replica_admin(i), name, &[("cluster", CLUSTER)]).await?;
        }
        Some(sum)
    }

    /// Wait until every replica counts `n` agents of the cluster.
    pub async fn wait_agents(&self, n: usize) -> anyhow::Result<()> {
        crate::poll_until(WAIT, TICK, || async {
            for i in 0..REPLICAS {
                let have =
                    admin_metric(self.replica_admin(i), "seedgate_agents_connected", &[("cluster", CLUSTER)]).await?;
                if have != n as f64 {
                    return None;
                }
            }
            Some(())
        })
        .await
        .with_context(|| format!("seed {}: not every replica had {n} agents of {CLUSTER}", self.name))
    }

    /// `PUT /control/clusters/<CLUSTER>` with `body` on every replica, at once.
    pub async fn put_all(&self, body: &str) -> anyhow::Result<()> {
        let puts = (0..REPLICAS).map(|i| put_cluster(self.replica_admin(i), body));
        futures_util::future::try_join_all(puts).await.map(|_| ())
    }
}

/// What the seed's gateway serves: the tunnel (TCP and UDP, to the replicas), the shoot's API by
/// SNI (to etcd) and the node-local proxies' PROXY-v2 path by destination (to the stand-in);
/// `handoff` sends the last two to `handoff`'s gateway instead, with PROXY v2.
fn router_yaml(net: Net, etcd: &str, handoff: Option<&str>) -> String {
    let list = |base: u16| (0..REPLICAS).map(|i| format!("127.0.0.1:{}", base + i as u16)).collect::<Vec<_>>();
    let (api_up, p2_up, extra) = match handoff {
        None => (etcd.to_owned(), "127.0.0.1:7443".to_owned(), String::new()),
        Some(to) => (
            format!("{to}:443"),
            format!("{to}:8443"),
            format!("        send_proxy_protocol: v2\n        drain_deadline: {ROUTE_DRAIN}\n"),
        ),
    };
    let tunnel = |name: &str, proto: &str, base| {
        format!(
            "  - name: {name}\n    listen: 0.0.0.0:8132\n{proto}    routes:\n      - name: {name}\n        sni: [proxy.seed.test]\n        upstreams: [{}]\n        balance: least-connections\n",
            list(base).join(", ")
        )
    };
    let trusted = format!("    proxy_protocol: optional\n    trusted_proxies: [{}]\n", net.range());
    format!(
        "admin: {{ listen: 0.0.0.0:9901 }}\ndrain_grace: 2s\nlisteners:\n{}{}  - name: api\n    listen: 0.0.0.0:443\n{trusted}    routes:\n      - name: shoot-a-api\n        sni: [{}]\n        upstreams: [{api_up}]\n{extra}  - name: p2\n    listen: 0.0.0.0:8443\n{trusted}    routes:\n      - name: shoot-a-p2\n        destination: [{}/32]\n        upstreams: [{p2_up}]\n{extra}",
        tunnel("tunnel", "", 8140),
        tunnel("tunnel-quic", "    protocol: udp\n", 8150),
        super::SHOOT_API,
        net.ip(0, 2),
    )
}

/// Replica `i` of seed `name`: agents on TCP 127.0.0.1:814i and UDP :815i, admin and egress
/// front end on the caller-facing address.
fn replica_yaml(name: &str, i: usize, mgmt_ip: &str, files: &SeedFiles) -> String {
    format!(
        "admin: {{ listen: {mgmt_ip}:{}, token_file: {} }}\ndrain_grace: 2s\nagents:\n  listen: 127.0.0.1:{}\n  quic: {{ listen: 127.0.0.1:{} }}\n  tls: {{ cert: {}, key: {}, client_ca: {} }}\n  keepalive: {{ interval: 500ms, suspect_after: 2s, timeout: 2s }}\n  server_id: {name}-r{i}\n  server_count: {REPLICAS}\nfrontends:\n  - name: egress\n    listen: {mgmt_ip}:{}\n    cluster: {CLUSTER}\n",
        9910 + i,
        files.token.display(),
        8140 + i,
        8150 + i,
        files.cert.display(),
        files.key.display(),
        files.ca.display(),
        9443 + i,
    )
}

/// Files every replica of a world reads.
struct SeedFiles {
    token: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    ca: PathBuf,
}

/// Addresses of one seed: `(name, caller-facing, shoot-facing, seed-facing)`.
type SeedIps = (&'static str, String, String, String);

async fn start_seed(
    bins: &Bins,
    dir: &TempDir,
    ca: &Ca,
    net: Net,
    ns: Netns,
    ips: SeedIps,
    etcd: &str,
) -> anyhow::Result<HaSeed> {
    let (name, mgmt_ip, shoot_ip, peer_ip) = ips;
    let apiserver = start_apiserver(&bins.stand_in, &ns, dir, ca, &format!("apiserver-{name}")).await?;
    let router_cfg = dir.write(&format!("router-{name}.yaml"), router_yaml(net, etcd, None))?;
    let (router, _) = Proc::spawn_seedgate(bins.command(&ns, &bins.router), &router_cfg, &[]).await?;
    let (cert, key) = ca.server(&["proxy.seed.test"])?.write(dir.path(), &format!("proxy-server-{name}"))?;
    let files = SeedFiles { token: dir.write("admin-token", TOKEN)?, cert, key, ca: ca.write(dir.path(), "ca")? };
    let mut replicas = Vec::with_capacity(REPLICAS);
    for i in 0..REPLICAS {
        let cfg = dir.write(&format!("proxy-server-{name}-r{i}.yaml"), replica_yaml(name, i, &mgmt_ip, &files))?;
        replicas.push(Proc::spawn_seedgate(bins.command(&ns, &bins.server), &cfg, &[]).await?.0);
    }
    Ok(HaSeed { name, replicas, router, _apiserver: apiserver, router_cfg, mgmt_ip, shoot_ip, peer_ip, _ns: ns })
}

/// One agent process in the shoot.
pub struct Agent {
    pub transport: Transport,
    pub admin: SocketAddr,
    /// Its node-local apiserver proxy, if it runs one.
    pub pod_api: Option<SocketAddr>,
    pub proc: Proc,
}

/// The shoot's agents: `h2` over h2, then `quic` over QUIC; the first of each runs a node-local
/// apiserver proxy.
pub struct AgentSet {
    pub agents: Vec<Agent>,
}

fn agent_yaml(net: Net, j: usize, t: Transport, proxy: bool, files: &SeedFiles) -> String {
    let apiserver_proxy = if proxy {
        format!(
            "apiserver_proxy:\n  listen: [{}]\n  gateway: api.seed.test:8443\n  mode: proxy-protocol-v2\n",
            net.shoot_addr(6443 + j as u16)
        )
    } else {
        String::new()
    };
    format!(
        "admin: {{ listen: {} }}\ndrain_grace: 2s\ntimeouts: {{ connect: 2s }}\n{apiserver_proxy}tunnel:\n  servers: [proxy.seed.test:8132]\n  transport: {}\n  tls: {{ cert: {}, key: {}, ca: {}, server_name: proxy.seed.test }}\n  allow: [127.0.0.0/8]\n  keepalive: {{ interval: 500ms, suspect_after: 2s, timeout: 2s }}\n  reconnect: {{ initial: 100ms, max: 1s }}\n  rehome_drain: {TUNNEL_DRAIN}\n  node_name: node-{j}\n",
        net.shoot_addr(9700 + j as u16),
        t.name(),
        files.cert.display(),
        files.key.display(),
        files.ca.display(),
    )
}

impl AgentSet {
    async fn start(
        bins: &Bins,
        dir: &TempDir,
        ca: &Ca,
        net: Net,
        shoot: &Netns,
        h2: usize,
        quic: usize,
    ) -> anyhow::Result<Self> {
        let (cert, key) = ca.client(CLUSTER)?.write(dir.path(), "agent")?;
        let files = SeedFiles { token: PathBuf::new(), cert, key, ca: ca.write(dir.path(), "ca")? };
        let plan: Vec<(usize, Transport, bool)> = (0..h2 + quic)
            .map(|j| if j < h2 { (j, Transport::H2, j == 0) } else { (j, Transport::Quic, j == h2) })
            .collect();
        let starts = plan.iter().map(|&(j, t, proxy)| {
            let yaml = agent_yaml(net, j, t, proxy, &files);
            async move {
                let cfg = dir.write(&format!("agent-{j}.yaml"), &yaml)?;
                let (proc, addrs) = Proc::spawn_seedgate(bins.command(shoot, &bins.agent), &cfg, &[]).await?;
                let pod_api = proxy.then(|| net.shoot_addr(6443 + j as u16).parse()).transpose()?;
                anyhow::Ok(Agent { transport: t, admin: addrs.admin()?, pod_api, proc })
            }
        });
        Ok(Self { agents: futures_util::future::try_join_all(starts).await? })
    }

    /// The node-local apiserver proxies.
    pub fn pod_apis(&self) -> Vec<SocketAddr> {
        self.agents.iter().filter_map(|a| a.pod_api).collect()
    }

    /// For every agent, how long after `since` it held a session to every replica of `seed` and
    /// to no other (polling its `/readyz?verbose`); for one that did not within [`WAIT`], its
    /// last tunnel readiness line.
    pub async fn time_until_on(&self, seed: &str, since: Instant) -> Vec<(Transport, Result<Duration, String>)> {
        let waits = self.agents.iter().map(|a| async move {
            let last = std::sync::Mutex::new(String::new());
            let on = crate::poll_until(WAIT, Duration::from_millis(25), || async {
                let (_, body) = http_get(a.admin, "/readyz?verbose").await.ok()?;
                let line = body.lines().find(|l| l.contains("tunnel-")).unwrap_or_default().to_owned();
                let on = holds_only(&line, seed).then(Instant::now);
                *last.lock().expect("lock") = line;
                on
            })
            .await;
            let last = last.into_inner().expect("lock");
            (a.transport, on.map(|t| t.duration_since(since)).map_err(|_| last))
        });
        futures_util::future::join_all(waits).await
    }

    pub fn logs(&self) -> String {
        self.agents
            .iter()
            .enumerate()
            .map(|(j, a)| format!("--- proxy-agent {j} ({}):\n{}", a.transport.name(), a.proc.log()))
            .collect()
    }
}

/// Whether an agent's tunnel line of `/readyz?verbose` says it holds every replica of `seed`
/// and nothing else.
fn holds_only(line: &str, seed: &str) -> bool {
    let held = |s: &str| (0..REPLICAS).filter(|i| line.contains(&format!("{s}-r{i}: "))).count();
    let other = if seed == "a" { "b" } else { "a" };
    line.contains(&format!("connected: {REPLICAS} of {REPLICAS} replicas"))
        && held(seed) == REPLICAS
        && held(other) == 0
}

/// Two seeds, etcd, the shoot with its agents and echo backend (fields drop processes first,
/// then namespaces and links, then files).
pub struct HaWorld {
    pub agents: AgentSet,
    _echo: Proc,
    pub a: HaSeed,
    pub b: HaSeed,
    pub etcd: Arc<Etcd>,
    pub shoot: Netns,
    _links: Vec<Veth>,
    pub ca: Ca,
    pub dir: TempDir,
    pub net: Net,
}

impl HaWorld {
    /// Everything up, every agent holding every replica of A.
    pub async fn start(label: &str, net: Net, bins: &Bins, h2: usize, quic: usize) -> anyhow::Result<Self> {
        let dir = TempDir::new(label)?;
        let ca = Ca::new("seedgate-migration-ca")?;
        let mut shoot = Netns::create("shoot")?;
        let (na, nb) = (Netns::create("seeda")?, Netns::create("seedb")?);
        let links = wire(net, &shoot, &na, &nb)?;
        // The shoot's data store, reachable from each seed on its link to the caller.
        let etcd = Arc::new(Etcd::start(&dir, &ca, &[net.ip(10, 1), net.ip(20, 1)]).await?);
        let ips_a = ("a", net.ip(10, 2), net.ip(1, 2), net.ip(3, 1));
        let ips_b = ("b", net.ip(20, 2), net.ip(2, 2), net.ip(3, 2));
        let a = start_seed(bins, &dir, &ca, net, na, ips_a, &format!("{}:2379", net.ip(10, 1))).await?;
        let b = start_seed(bins, &dir, &ca, net, nb, ips_b, &format!("{}:2379", net.ip(20, 1))).await?;
        init_dns(&mut shoot, &a.shoot_ip)?;
        let echo = start_echo(&bins.stand_in, &shoot).await?;
        let agents = AgentSet::start(bins, &dir, &ca, net, &shoot, h2, quic).await?;
        let w = Self { agents, _echo: echo, a, b, etcd, shoot, _links: links, ca, dir, net };
        w.a.wait_agents(h2 + quic).await.with_context(|| w.logs())?;
        Ok(w)
    }

    pub fn logs(&self) -> String {
        format!("{}{}{}--- etcd:\n{}", self.a.logs(), self.b.logs(), self.agents.logs(), self.etcd.log())
    }
}

/// What the planned move measured.
#[derive(Debug)]
pub struct MoveReport {
    /// Per agent: its transport, and the time from the move notice until it held every replica
    /// of B and none of A (or its last tunnel readiness line, if it did not within the wait).
    pub on_b: Vec<(Transport, Result<Duration, String>)>,
    /// From the move notice until A was fenced and counted no agent.
    pub fenced: Duration,
}

impl HaWorld {
    /// The planned move A → B, as the runbook has it: A's routes handed off to B's gateway, every
    /// A replica draining with a move notice to B, the seed-side load (`targets`) and the shoot's
    /// DNS switched to B once every agent is there, A fenced once its streams ended.
    pub async fn planned_move(&self, targets: &super::load::Targets) -> anyhow::Result<MoveReport> {
        let handoff = router_yaml(self.net, "", Some(&self.b.peer_ip));
        reload_file(self.a.router_admin(), &self.a.router_cfg, &handoff).await?;
        let notice = Instant::now();
        let drain = format!(
            r#"{{"state":"draining","move_to":["{}:8132"],"drain_deadline":"{TUNNEL_DRAIN}"}}"#,
            self.b.shoot_ip
        );
        self.a.put_all(&drain).await?;
        let on_b = self.agents.time_until_on("b", notice).await;
        targets.set(self.b.egresses());
        switch_dns(&self.shoot, &self.b.shoot_ip)?;
        // Dials that picked A before the switch end first: fencing closes A's sessions.
        crate::poll_until(WAIT, TICK, || async {
            (targets.stale() == 0 && self.a.replicas_metric("seedgate_tunnel_streams_active").await? == 0.0)
                .then_some(())
        })
        .await
        .context("A's tunnel streams did not end")?;
        self.a.put_all(r#"{"state":"fenced"}"#).await?;
        self.a.wait_agents(0).await?;
        Ok(MoveReport { on_b, fenced: notice.elapsed() })
    }
}
