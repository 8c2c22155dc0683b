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
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use testbed::admin::http_request;
use testbed::netns::{Netns, Veth, require_root, veth};
use testbed::pki::client_config;
use testbed::tls_client::http_get_request;
use testbed::{Ca, Proc, TempDir, bin_path, http_get, metric_value, poll_until, tls_request};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const WAIT: Duration = Duration::from_secs(20);
const TICK: Duration = Duration::from_millis(20);
const CLUSTER: &str = "shoot-a";
const API_NAME: &str = "kubernetes.default.svc";
const TOKEN: &str = "migration-test-token";

/// One test's address plan, `10.<n>.<subnet>.<host>`.
#[derive(Clone, Copy)]
struct Net(u8);

impl Net {
    fn ip(self, subnet: u8, host: u8) -> String {
        format!("10.{}.{subnet}.{host}", self.0)
    }
    fn cidr(self, subnet: u8, host: u8) -> String {
        format!("{}/24", self.ip(subnet, host))
    }
    /// Where the pods reach the kube-apiserver: the node-local proxy's listen address.
    fn pod_api(self) -> String {
        format!("{}:6443", self.ip(0, 2))
    }
}
const ECHO: &str = "127.0.0.1:7000";

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
    let (api_crt, api_key) = ca.server(&[API_NAME])?.write(dir.path(), &format!("apiserver-{name}"))?;
    let mut api = ns.command(bin_path("stand-in")?);
    api.args(["tls-http", "--listen", "127.0.0.1:7443", "--name", &format!("apiserver-{name}"), "--cert"])
        .arg(&api_crt)
        .arg("--key")
        .arg(&api_key);
    let apiserver = Proc::spawn(api)?;
    apiserver.wait_log_line(&["listening"], WAIT).await?;

    let router_cfg = dir.write(&format!("router-{name}.yaml"), router_yaml(net, "127.0.0.1:7443", false))?;
    let (router, _) = Proc::spawn_seedgate(ns.command(bin_path("sni-router")?), &router_cfg, &[]).await?;

    let (srv_crt, srv_key) = ca.server(&["proxy.seed.test"])?.write(dir.path(), &format!("proxy-server-{name}"))?;
    let token = dir.write("admin-token", TOKEN)?;
    let ca_file = ca.write(dir.path(), "ca")?;
    let server_yaml = format!(
        "admin: {{ listen: {mgmt_ip}:9902, token_file: {} }}\ndrain_grace: 2s\nagents:\n  listen: 0.0.0.0:8132\n  tls: {{ cert: {}, key: {}, client_ca: {} }}\n  keepalive: {{ interval: 500ms, timeout: 2s }}\nfrontends:\n  - name: egress\n    listen: {mgmt_ip}:9443\n    cluster: {CLUSTER}\n",
        token.display(),
        srv_crt.display(),
        srv_key.display(),
        ca_file.display()
    );
    let server_cfg = dir.write(&format!("proxy-server-{name}.yaml"), &server_yaml)?;
    let (server, _) = Proc::spawn_seedgate(ns.command(bin_path("proxy-server")?), &server_cfg, &[]).await?;
    Ok(Seed { name, _ns: ns, mgmt_ip, shoot_ip, _router: router, router_cfg, server, _apiserver: apiserver })
}

fn hosts_text(seed: &Seed) -> String {
    format!("127.0.0.1 localhost\n{0} api.seed.test\n{0} proxy.seed.test\n", seed.shoot_ip)
}

/// Point the shoot's names at `seed`. The file is rewritten in place without truncating (both
/// seeds' addresses have the same length), so a lookup racing with the switch sees the old or
/// the new address, never an empty file.
fn switch_dns(shoot: &Netns, seed: &Seed) -> anyhow::Result<()> {
    use std::io::Write as _;
    let path = format!("/etc/netns/{}/hosts", shoot.name());
    let mut f = std::fs::OpenOptions::new().write(true).open(&path).with_context(|| path.clone())?;
    f.write_all(hosts_text(seed).as_bytes())?;
    Ok(())
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
    let links = vec![
        veth(None, Some(&shoot), &net.cidr(0, 1), &net.cidr(0, 2))?,
        veth(None, Some(&na), &net.cidr(10, 1), &net.cidr(10, 2))?,
        veth(None, Some(&nb), &net.cidr(20, 1), &net.cidr(20, 2))?,
        veth(Some(&shoot), Some(&na), &net.cidr(1, 1), &net.cidr(1, 2))?,
        veth(Some(&shoot), Some(&nb), &net.cidr(2, 1), &net.cidr(2, 2))?,
        veth(Some(&na), Some(&nb), &net.cidr(3, 1), &net.cidr(3, 2))?,
    ];
    let a = start_seed(&dir, &ca, net, "a", na, net.ip(10, 2), net.ip(1, 2)).await?;
    let b = start_seed(&dir, &ca, net, "b", nb, net.ip(20, 2), net.ip(2, 2)).await?;
    // The hosts file must exist before the agent starts: `ip netns exec` mounts it then.
    shoot.set_hosts(&[(&a.shoot_ip, "api.seed.test"), (&a.shoot_ip, "proxy.seed.test")])?;
    anyhow::ensure!(hosts_text(&a).len() == hosts_text(&b).len(), "in-place DNS switch needs equal lengths");
    switch_dns(&shoot, &a)?;

    let mut echo = shoot.command(bin_path("stand-in")?);
    echo.args(["echo", "--listen", ECHO]);
    let shoot_echo = Proc::spawn(echo)?;
    shoot_echo.wait_log_line(&["listening"], WAIT).await?;

    let (agent_crt, agent_key) = ca.client(CLUSTER)?.write(dir.path(), "agent")?;
    let agent_yaml = format!(
        "admin: {{ listen: 127.0.0.1:0 }}\ndrain_grace: 2s\ntimeouts: {{ connect: 2s }}\napiserver_proxy:\n  listen: [{}]\n  gateway: api.seed.test:8443\n  mode: proxy-protocol-v2\ntunnel:\n  servers: [proxy.seed.test:8132]\n  tls: {{ cert: {}, key: {}, ca: {}, server_name: proxy.seed.test }}\n  allow: [127.0.0.0/8]\n  keepalive: {{ interval: 500ms, timeout: 2s }}\n  reconnect: {{ initial: 100ms, max: 1s }}\n  rehome_drain: 3s\n",
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
    let (_, text) = http_get(seed.server_admin(), "/metrics").await.ok()?;
    Some(metric_value(&text, name, labels).unwrap_or(0.0))
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

/// In-cluster clients: TLS requests through the node-local proxy at a steady rate.
#[derive(Default)]
struct PodLoad {
    ok: AtomicU64,
    failed: AtomicU64,
    answered_by: Mutex<std::collections::BTreeMap<String, u64>>,
    errors: Mutex<Vec<String>>,
}

fn start_pod_load(
    ca: &Ca,
    net: Net,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<(Arc<PodLoad>, tokio::task::JoinHandle<()>)> {
    let load = Arc::new(PodLoad::default());
    let cfg = client_config(ca, None, &["http/1.1"])?;
    let l = load.clone();
    let h = tokio::spawn(async move {
        let addr: SocketAddr = net.pod_api().parse().expect("addr");
        // Bounded: at most one request every 20 ms, and the loop ends when told (or after 2 min).
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
            tick.tick().await;
            let r = tokio::time::timeout(
                Duration::from_secs(10),
                tls_request(addr, Some(API_NAME), cfg.clone(), &http_get_request(API_NAME, "/api")),
            )
            .await;
            match r {
                Ok(Ok(res)) if res.status() == Some(200) => {
                    l.ok.fetch_add(1, Ordering::Relaxed);
                    let body = res.body();
                    let who =
                        body.split_whitespace().find_map(|w| w.strip_prefix("backend=")).unwrap_or("?").to_owned();
                    *l.answered_by.lock().expect("lock").entry(who).or_default() += 1;
                }
                other => {
                    l.failed.fetch_add(1, Ordering::Relaxed);
                    l.errors.lock().expect("lock").push(format!("{other:?}").chars().take(300).collect());
                }
            }
        }
    });
    Ok((load, h))
}

/// Open a CONNECT through a seed's egress front end to the shoot's echo backend.
async fn connect_echo(seed: &Seed) -> anyhow::Result<Result<TcpStream, String>> {
    let mut s = TcpStream::connect(seed.egress()).await?;
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

async fn echo_once(s: &mut TcpStream, msg: &[u8]) -> anyhow::Result<()> {
    s.write_all(msg).await?;
    let mut b = vec![0u8; msg.len()];
    tokio::time::timeout(WAIT, s.read_exact(&mut b)).await??;
    anyhow::ensure!(b == msg, "echo mismatch");
    Ok(())
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

async fn put_cluster(seed: &Seed, body: &str) -> anyhow::Result<()> {
    let path = format!("/control/clusters/{CLUSTER}");
    let (code, text) = http_request(seed.server_admin(), "PUT", &path, Some(body), Some(TOKEN)).await?;
    anyhow::ensure!(code == 200, "PUT {path} answered {code}: {text}");
    Ok(())
}

async fn reload_count(seed: &Seed) -> f64 {
    let Ok((_, text)) = http_get(seed.router_admin(), "/metrics").await else {
        return -1.0;
    };
    metric_value(&text, "seedgate_config_reloads_total", &[("result", "success")]).unwrap_or(0.0)
}

#[tokio::test]
async fn planned_migration_a_to_b_under_load() -> anyhow::Result<()> {
    let Some(w) = world("migration", Net(92)).await? else {
        return Ok(());
    };
    let stop = Arc::new(AtomicBool::new(false));
    let (pods, pods_task) = start_pod_load(&w.ca, w.net, stop.clone())?;

    // The exec stand-in: a stream through A opened before the move.
    let mut long = connect_echo(&w.a).await?.map_err(anyhow::Error::msg)?;
    echo_once(&mut long, b"hello").await?;
    let long_task = tokio::spawn(watch_long_stream(long, stop.clone()));

    // Seed-side dials through A keep going during the move.
    let dial_results: Arc<Mutex<Vec<String>>> = Arc::default();
    let dials = {
        let egress = w.a.egress();
        let results = dial_results.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(120);
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                let r = async {
                    let mut s = TcpStream::connect(egress).await?;
                    s.write_all(format!("CONNECT {ECHO} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").as_bytes()).await?;
                    let mut b = vec![0u8; 512];
                    let n = tokio::time::timeout(WAIT, s.read(&mut b)).await??;
                    anyhow::Ok(String::from_utf8_lossy(&b[..n]).lines().next().unwrap_or("").to_owned())
                }
                .await;
                results.lock().expect("lock").push(r.unwrap_or_else(|e| format!("error: {e}")));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    // Some traffic on A first.
    poll_until(WAIT, TICK, || async { (pods.ok.load(Ordering::Relaxed) >= 10).then_some(()) }).await?;

    // 1. Router hand-off on A: the route now goes to B's gateway with PROXY v2 (B trusts A).
    let before = reload_count(&w.a).await;
    std::fs::write(&w.a.router_cfg, router_yaml(w.net, &format!("{}:8443", w.net.ip(3, 2)), true))?;
    poll_until(WAIT, TICK, || async { (reload_count(&w.a).await > before).then_some(()) }).await?;
    // 2. Drain the tunnel on A, telling the agents where to go.
    let opened_before_drain =
        server_metric(&w.a, "seedgate_tunnel_streams_opened_total", &[("cluster", CLUSTER)]).await.unwrap_or(0.0);
    let notice = Instant::now();
    put_cluster(
        &w.a,
        &format!(r#"{{"state":"draining","move_to":["{}:8132"],"drain_deadline":"3s"}}"#, w.net.ip(2, 2)),
    )
    .await?;
    let rehomed = wait_agents(&w.b, 1.0).await?;
    // 3. DNS: the shoot's names point at B (the node-local proxy follows on its next connection).
    switch_dns(&w.shoot, &w.b)?;
    // 4. A's long-lived stream ends cleanly at its drain deadline.
    let (end, ended_at) =
        tokio::time::timeout(Duration::from_secs(30), long_task).await.context("long stream hung")??;
    assert_eq!(end, StreamEnd::CleanEof, "the exec stream must end with a clean close at the drain deadline");
    let long_lived = ended_at.duration_since(notice);
    // 5. Fence A. From now on A accepts no stream for the cluster.
    put_cluster(&w.a, r#"{"state":"fenced"}"#).await?;
    wait_agents(&w.a, 0.0).await?;
    let opened_at_fence =
        server_metric(&w.a, "seedgate_tunnel_streams_opened_total", &[("cluster", CLUSTER)]).await.unwrap_or(-1.0);
    let refused = connect_echo(&w.a).await?;
    let refusal = refused.err().context("a fenced seed must refuse the dial")?;
    assert!(refusal.starts_with("HTTP/1.1 503") && refusal.contains("cluster moved"), "{refusal}");
    // B serves the seed-side dials now.
    let mut via_b = connect_echo(&w.b).await?.map_err(anyhow::Error::msg)?;
    echo_once(&mut via_b, b"through B").await?;
    // More in-cluster traffic after the move, then stop the load.
    let after = pods.ok.load(Ordering::Relaxed);
    poll_until(WAIT, TICK, || async { (pods.ok.load(Ordering::Relaxed) >= after + 20).then_some(()) }).await?;
    stop.store(true, Ordering::Relaxed);
    pods_task.await?;
    dials.await?;
    let opened_after =
        server_metric(&w.a, "seedgate_tunnel_streams_opened_total", &[("cluster", CLUSTER)]).await.unwrap_or(-1.0);

    let by = pods.answered_by.lock().expect("lock").clone();
    let dial_codes = dial_results.lock().expect("lock").clone();
    println!(
        "migration: in-cluster ok={} failed={} answered_by={by:?}; agent re-homed to B {:?} after the move notice; \
         long stream ended {:?} after the notice (drain_deadline 3s); A streams opened: {opened_before_drain} before drain, \
         {opened_at_fence} at fence, {opened_after} at the end; seed-side dials through A: {} ({} x 200)",
        pods.ok.load(Ordering::Relaxed),
        pods.failed.load(Ordering::Relaxed),
        rehomed,
        long_lived,
        dial_codes.len(),
        dial_codes.iter().filter(|c| c.contains(" 200 ")).count()
    );
    assert_eq!(
        pods.failed.load(Ordering::Relaxed),
        0,
        "failed in-cluster requests: {:?}",
        pods.errors.lock().expect("lock")
    );
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
    let stop = Arc::new(AtomicBool::new(false));
    let (pods, pods_task) = start_pod_load(&w.ca, w.net, stop.clone())?;
    poll_until(WAIT, TICK, || async { (pods.ok.load(Ordering::Relaxed) >= 10).then_some(()) }).await?;
    // The bad case: A cannot be told anything. DNS moves to B, then A's proxy-server dies.
    switch_dns(&w.shoot, &w.b)?;
    w.a.server.signal(libc::SIGKILL)?;
    let found = wait_agents(&w.b, 1.0).await?;
    // Seed-side dials work through B, with nothing restarted in the shoot.
    let mut via_b = connect_echo(&w.b).await?.map_err(anyhow::Error::msg)?;
    echo_once(&mut via_b, b"after the source died").await?;
    let after = pods.ok.load(Ordering::Relaxed);
    poll_until(WAIT, TICK, || async { (pods.ok.load(Ordering::Relaxed) >= after + 20).then_some(()) }).await?;
    stop.store(true, Ordering::Relaxed);
    pods_task.await?;
    let by = pods.answered_by.lock().expect("lock").clone();
    println!(
        "bad case: agent found B {found:?} after A's proxy-server was killed; in-cluster ok={} failed={} answered_by={by:?}",
        pods.ok.load(Ordering::Relaxed),
        pods.failed.load(Ordering::Relaxed)
    );
    assert!(by.contains_key("apiserver-b"), "in-cluster traffic reached B: {by:?}");
    assert!(w.agent.running(), "nothing in the shoot was restarted");
    let _ = &w.dir;
    Ok(())
}
