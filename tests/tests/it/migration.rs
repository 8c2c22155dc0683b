//! Control-plane migration (path P6) end to end: seed A, seed B and a shoot in network namespaces, continuous load, A → B.
//!
//! Topology (all addresses made here; the test process plays the shoot's pods and the operator):
//!
//! ```text
//!  test ── 10.N.0.0/24 ── shoot (proxy-agent: tunnel + apiserver proxy on 10.N.0.2:6443, echo backend)
//!  test ── 10.N.10.0/24 ── seed A (sni-router :8443, proxy-server :8132/egress :9443, apiserver stand-in)
//!  test ── 10.N.20.0/24 ── seed B (the same)
//!  shoot ── 10.N.1.0/24 ── seed A      shoot ── 10.N.2.0/24 ── seed B      A ── 10.N.3.0/24 ── B
//! ```
//! Each test has its own N: the test-side ends of the veth pairs live in the one root namespace,
//! and two worlds on the same subnets would steal each other's traffic.
//! The shoot finds its seed by name (`api.seed.test`, `proxy.seed.test`) through a hosts file the
//! test rewrites in place (what `ip netns exec` bind-mounts over /etc/hosts).

use anyhow::Context as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use testbed::migration::{
    CLUSTER, ConnectLoad, Net, PodLoad, TICK, Targets, WAIT, admin_metric, connect_echo, echo_once, init_dns,
    put_cluster, reload_file, start_apiserver, start_echo, switch_dns, wire,
};
use testbed::netns::{Netns, Veth, require_root};
use testbed::{Ca, Proc, TempDir, bin_path, poll_until};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

struct Seed {
    name: &'static str,
    _ns: Netns,
    /// The address the test reaches this seed's admin and egress front end on.
    mgmt_ip: String,
    /// The address the shoot reaches it on.
    shoot_ip: String,
    _router: Proc,
    router_cfg: std::path::PathBuf,
    server: Proc,
    _apiserver: Proc,
}

impl Seed {
    fn router_admin(&self) -> SocketAddr {
        format!("{}:9901", self.mgmt_ip).parse().expect("addr")
    }
    fn server_admin(&self) -> SocketAddr {
        format!("{}:9902", self.mgmt_ip).parse().expect("addr")
    }
    fn egress(&self) -> SocketAddr {
        format!("{}:9443", self.mgmt_ip).parse().expect("addr")
    }
}

struct World {
    net: Net,
    dir: TempDir,
    ca: Ca,
    shoot: Netns,
    a: Seed,
    b: Seed,
    agent: Proc,
    _shoot_echo: Proc,
    _links: Vec<Veth>,
}

fn router_yaml(net: Net, upstream: &str, handoff: bool) -> String {
    let extra = if handoff { "        send_proxy_protocol: v2\n        drain_deadline: 2s\n" } else { "" };
    format!(
        "admin: {{ listen: 0.0.0.0:9901 }}\ndrain_grace: 2s\nlisteners:\n  - name: p2\n    listen: 0.0.0.0:8443\n    proxy_protocol: optional\n    trusted_proxies: [10.{n}.0.0/16]\n    routes:\n      - name: shoot-a-api\n        destination: [{}/32]\n        upstreams: [{upstream}]\n{extra}",
        net.ip(0, 2),
        n = net.0
    )
}

async fn start_seed(
    dir: &TempDir,
    ca: &Ca,
    net: Net,
    name: &'static str,
    ns: Netns,
    mgmt_ip: String,
    shoot_ip: String,
) -> anyhow::Result<Seed> {
    let apiserver = start_apiserver(&bin_path("stand-in")?, &ns, dir, ca, &format!("apiserver-{name}")).await?;

    let router_cfg = dir.write(&format!("router-{name}.yaml"), router_yaml(net, "127.0.0.1:7443", false))?;
    let (router, _) = Proc::spawn_seedgate(ns.command(bin_path("sni-router")?), &router_cfg, &[]).await?;

    let (srv_crt, srv_key) = ca.server(&["proxy.seed.test"])?.write(dir.path(), &format!("proxy-server-{name}"))?;
    let token = dir.write("admin-token", testbed::migration::TOKEN)?;
    let ca_file = ca.write(dir.path(), "ca")?;
    let server_yaml = format!(
        "admin: {{ listen: {mgmt_ip}:9902, token_file: {} }}\ndrain_grace: 2s\nagents:\n  listen: 0.0.0.0:8132\n  tls: {{ cert: {}, key: {}, client_ca: {} }}\n  keepalive: {{ interval: 500ms, suspect_after: 2s, timeout: 2s }}\nfrontends:\n  - name: egress\n    listen: {mgmt_ip}:9443\n    cluster: {CLUSTER}\n",
        token.display(),
        srv_crt.display(),
        srv_key.display(),
        ca_file.display()
    );
    let server_cfg = dir.write(&format!("proxy-server-{name}.yaml"), &server_yaml)?;
    let (server, _) = Proc::spawn_seedgate(ns.command(bin_path("proxy-server")?), &server_cfg, &[]).await?;
    Ok(Seed { name, _ns: ns, mgmt_ip, shoot_ip, _router: router, router_cfg, server, _apiserver: apiserver })
}

async fn world(label: &str, net: Net) -> anyhow::Result<Option<World>> {
    if !require_root() {
        return Ok(None);
    }
    let dir = TempDir::new(label)?;
    let ca = Ca::new("seedgate-migration-ca")?;
    let mut shoot = Netns::create("shoot")?;
    let na = Netns::create("seeda")?;
    let nb = Netns::create("seedb")?;
    let links = wire(net, &shoot, &na, &nb)?;
    let a = start_seed(&dir, &ca, net, "a", na, net.ip(10, 2), net.ip(1, 2)).await?;
    let b = start_seed(&dir, &ca, net, "b", nb, net.ip(20, 2), net.ip(2, 2)).await?;
    // The hosts file must exist before the agent starts: `ip netns exec` mounts it then.
    init_dns(&mut shoot, &a.shoot_ip)?;

    let shoot_echo = start_echo(&bin_path("stand-in")?, &shoot).await?;

    let (agent_crt, agent_key) = ca.client(CLUSTER)?.write(dir.path(), "agent")?;
    let agent_yaml = format!(
        "admin: {{ listen: 127.0.0.1:0 }}\ndrain_grace: 2s\ntimeouts: {{ connect: 2s }}\napiserver_proxy:\n  listen: [{}]\n  gateway: api.seed.test:8443\n  mode: proxy-protocol-v2\ntunnel:\n  servers: [proxy.seed.test:8132]\n  tls: {{ cert: {}, key: {}, ca: {}, server_name: proxy.seed.test }}\n  allow: [127.0.0.0/8]\n  keepalive: {{ interval: 500ms, suspect_after: 2s, timeout: 2s }}\n  reconnect: {{ initial: 100ms, max: 1s }}\n  rehome_drain: 3s\n",
        net.pod_api(),
        agent_crt.display(),
        agent_key.display(),
        ca.write(dir.path(), "ca")?.display()
    );
    let agent_cfg = dir.write("agent.yaml", &agent_yaml)?;
    let (agent, _) = Proc::spawn_seedgate(shoot.command(bin_path("proxy-agent")?), &agent_cfg, &[]).await?;
    wait_agents(&a, 1.0).await?;
    Ok(Some(World { net, dir, ca, shoot, a, b, agent, _shoot_echo: shoot_echo, _links: links }))
}

async fn server_metric(seed: &Seed, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    admin_metric(seed.server_admin(), name, labels).await
}

async fn wait_agents(seed: &Seed, n: f64) -> anyhow::Result<Duration> {
    let started = Instant::now();
    poll_until(WAIT, TICK, || async {
        (server_metric(seed, "seedgate_agents_connected", &[("cluster", CLUSTER)]).await? == n).then_some(())
    })
    .await
    .with_context(|| format!("seed {} never had {n} agents of {CLUSTER}", seed.name))?;
    Ok(started.elapsed())
}

#[derive(Debug, PartialEq)]
enum StreamEnd {
    CleanEof,
    Reset(String),
    StillOpen,
}

/// The long-lived "exec" stream: ping until it ends, then say how.
async fn watch_long_stream(mut s: TcpStream, stop: Arc<AtomicBool>) -> (StreamEnd, Instant) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
        if let Err(e) = s.write_all(b"ping").await {
            return (StreamEnd::Reset(e.to_string()), Instant::now());
        }
        let mut b = [0u8; 4];
        match tokio::time::timeout(Duration::from_secs(5), s.read(&mut b)).await {
            Ok(Ok(0)) => return (StreamEnd::CleanEof, Instant::now()),
            Ok(Ok(_)) => {
                // Rest of the echo, if it came in pieces.
                let _ = tokio::time::timeout(Duration::from_secs(1), s.read(&mut b)).await;
            }
            Ok(Err(e)) => return (StreamEnd::Reset(e.to_string()), Instant::now()),
            Err(_) => {
                return (StreamEnd::Reset("hung: no echo for 5s".into()), Instant::now());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (StreamEnd::StillOpen, Instant::now())
}

#[tokio::test]
async fn planned_migration_a_to_b_under_load() -> anyhow::Result<()> {
    let Some(w) = world("migration", Net(92)).await? else {
        return Ok(());
    };
    let pods = PodLoad::start(&w.ca, vec![w.net.pod_api().parse()?], Duration::from_millis(20))?;

    // The exec stand-in: a stream through A opened before the move.
    let stop = Arc::new(AtomicBool::new(false));
    let mut long = connect_echo(w.a.egress()).await?.map_err(anyhow::Error::msg)?;
    echo_once(&mut long, b"hello").await?;
    let long_task = tokio::spawn(watch_long_stream(long, stop.clone()));

    // Seed-side dials: through A until the agent is on B, then through B.
    let targets = Targets::new(vec![("a".to_owned(), w.a.egress())]);
    let dials = ConnectLoad::start(targets.clone(), Duration::from_millis(100));
    // Some traffic on A first.
    poll_until(WAIT, TICK, || async { (pods.tally.ok() >= 10).then_some(()) }).await?;

    // 1. Router hand-off on A: the route now goes to B's gateway with PROXY v2 (B trusts A).
    reload_file(w.a.router_admin(), &w.a.router_cfg, &router_yaml(w.net, &format!("{}:8443", w.net.ip(3, 2)), true))
        .await?;
    // 2. Drain the tunnel on A, telling the agents where to go.
    let opened_before_drain =
        server_metric(&w.a, "seedgate_tunnel_streams_opened_total", &[("cluster", CLUSTER)]).await.unwrap_or(0.0);
    let notice = Instant::now();
    put_cluster(
        w.a.server_admin(),
        &format!(r#"{{"state":"draining","move_to":["{}:8132"],"drain_deadline":"3s"}}"#, w.net.ip(2, 2)),
    )
    .await?;
    let rehomed = wait_agents(&w.b, 1.0).await?;
    targets.set(vec![("b".to_owned(), w.b.egress())]);
    // 3. DNS: the shoot's names point at B (the node-local proxy follows on its next connection).
    switch_dns(&w.shoot, &w.b.shoot_ip)?;
    // 4. A's long-lived stream ends cleanly at its drain deadline.
    let (end, ended_at) =
        tokio::time::timeout(Duration::from_secs(30), long_task).await.context("long stream hung")??;
    assert_eq!(end, StreamEnd::CleanEof, "the exec stream must end with a clean close at the drain deadline");
    let long_lived = ended_at.duration_since(notice);
    // 5. Fence A, once no dial that picked it before the switch is under way (fencing closes
    // its sessions). From now on A accepts no stream for the cluster.
    poll_until(WAIT, TICK, || async { (targets.stale() == 0).then_some(()) }).await?;
    put_cluster(w.a.server_admin(), r#"{"state":"fenced"}"#).await?;
    wait_agents(&w.a, 0.0).await?;
    let opened_at_fence =
        server_metric(&w.a, "seedgate_tunnel_streams_opened_total", &[("cluster", CLUSTER)]).await.unwrap_or(-1.0);
    let refused = connect_echo(w.a.egress()).await?;
    let refusal = refused.err().context("a fenced seed must refuse the dial")?;
    assert!(refusal.starts_with("HTTP/1.1 503") && refusal.contains("cluster moved"), "{refusal}");
    // B serves the seed-side dials now.
    let mut via_b = connect_echo(w.b.egress()).await?.map_err(anyhow::Error::msg)?;
    echo_once(&mut via_b, b"through B").await?;
    // More in-cluster traffic after the move, then stop the load.
    let after = pods.tally.ok();
    poll_until(WAIT, TICK, || async { (pods.tally.ok() >= after + 20).then_some(()) }).await?;
    stop.store(true, Ordering::Relaxed);
    let (pods, dials) = (pods.finish().await?, dials.finish().await?);
    let opened_after =
        server_metric(&w.a, "seedgate_tunnel_streams_opened_total", &[("cluster", CLUSTER)]).await.unwrap_or(-1.0);

    let by = pods.by();
    println!(
        "migration: in-cluster ok={} failed={} answered_by={by:?}; agent re-homed to B {rehomed:?} after the move notice; \
         long stream ended {long_lived:?} after the notice (drain_deadline 3s); A streams opened: {opened_before_drain} before drain, \
         {opened_at_fence} at fence, {opened_after} at the end; seed-side dials ok={} failed={} by {:?}",
        pods.ok(),
        pods.failed(),
        dials.ok(),
        dials.failed(),
        dials.by()
    );
    assert_eq!(pods.failed(), 0, "failed in-cluster requests: {:?}", pods.first_errors());
    assert_eq!(dials.failed(), 0, "failed seed-side dials: {:?}", dials.first_errors());
    assert!(by.contains_key("apiserver-a") && by.contains_key("apiserver-b"), "both control planes answered: {by:?}");
    assert_eq!(opened_after, opened_at_fence, "a fenced seed accepted new streams");
    assert!(
        long_lived >= Duration::from_millis(2500),
        "the exec stream ended before its drain deadline: {long_lived:?}"
    );
    // The agent keeps its tunnel on B, and its /readyz says so.
    let _ = &w.agent;
    Ok(())
}

#[tokio::test]
async fn source_proxy_server_killed_agents_find_b_by_name() -> anyhow::Result<()> {
    let Some(mut w) = world("migration-bad", Net(93)).await? else {
        return Ok(());
    };
    let pods = PodLoad::start(&w.ca, vec![w.net.pod_api().parse()?], Duration::from_millis(20))?;
    poll_until(WAIT, TICK, || async { (pods.tally.ok() >= 10).then_some(()) }).await?;
    // The bad case: A cannot be told anything. DNS moves to B, then A's proxy-server dies.
    switch_dns(&w.shoot, &w.b.shoot_ip)?;
    w.a.server.signal(libc::SIGKILL)?;
    let found = wait_agents(&w.b, 1.0).await?;
    // Seed-side dials work through B, with nothing restarted in the shoot.
    let mut via_b = connect_echo(w.b.egress()).await?.map_err(anyhow::Error::msg)?;
    echo_once(&mut via_b, b"after the source died").await?;
    let after = pods.tally.ok();
    poll_until(WAIT, TICK, || async { (pods.tally.ok() >= after + 20).then_some(()) }).await?;
    let pods = pods.finish().await?;
    let by = pods.by();
    println!(
        "bad case: agent found B {found:?} after A's proxy-server was killed; in-cluster ok={} failed={} answered_by={by:?}",
        pods.ok(),
        pods.failed()
    );
    assert!(by.contains_key("apiserver-b"), "in-cluster traffic reached B: {by:?}");
    assert!(w.agent.running(), "nothing in the shoot was restarted");
    let _ = &w.dir;
    Ok(())
}
