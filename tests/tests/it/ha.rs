//! proxy-server replicas (root): three replicas behind one sni-router SNI route, one agent in a
//! shoot network namespace that knows only the gateway's name. The agent must reach every
//! replica, survive a rolling restart without a failed dial, find a replica started in place of
//! a killed one, and follow a replica count that comes from a peers name.

use anyhow::Context as _;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use testbed::netns::{Netns, require_root, veth};
use testbed::tunnel_kit::{
    AgentOpts, Dialer, Fe, FeKind, STEP, TunnelPki, agent_yaml, connect, ensure_binaries, metrics, server_yaml,
    start_agent, wait_agents,
};
use testbed::{Addresses, Proc, TcpEcho, TempDir, bin_path, http_get, metric_value, poll_until};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const CLUSTER: &str = "shoot-a";

/// A free port on 127.0.0.1 (a replica restarted in place must come back on the same port, the
/// one the gateway's route names).
fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The seed side: the gateway (sni-router on the veth address) and the replicas' agent ports.
struct Seed {
    dir: TempDir,
    pki: TunnelPki,
    ports: Vec<u16>,
    _router: Proc,
    gateway: SocketAddr,
}

/// Front end and admin address of each replica in service (`None`: taken out for a restart).
type InService = Arc<tokio::sync::Mutex<Vec<Option<(SocketAddr, SocketAddr)>>>>;

/// One running replica.
struct Replica {
    proc: Proc,
    addrs: Addresses,
}

impl Replica {
    fn admin(&self) -> SocketAddr {
        self.addrs.admin().expect("admin")
    }

    fn egress(&self) -> Dialer {
        Dialer::Tcp(self.addrs.listener("egress").expect("egress"))
    }
}

/// `agents:` keys for replica `i`, `extra` appended inside `agents:`.
fn replica_yaml(seed: &Seed, i: usize, agents_extra: &str) -> String {
    let y = server_yaml(
        &seed.pki,
        &format!("127.0.0.1:{}", seed.ports[i]),
        &[Fe::new("egress", CLUSTER, FeKind::Plain)],
        "drain_grace: 2s\n",
    );
    let ka = "  keepalive: { interval: 500ms, suspect_after: 2s, timeout: 2s }\n";
    y.replacen(ka, &format!("{ka}  server_id: r{i}\n{agents_extra}"), 1)
}

async fn start_replica(
    seed: &Seed,
    i: usize,
    agents_extra: &str,
    cmd: Option<std::process::Command>,
) -> anyhow::Result<Replica> {
    ensure_binaries()?;
    let cfg = seed.dir.write(&format!("replica{i}.yaml"), replica_yaml(seed, i, agents_extra))?;
    let cmd = cmd.unwrap_or_else(|| std::process::Command::new(bin_path("proxy-server").expect("built")));
    let (proc, addrs) = Proc::spawn_seedgate(cmd, &cfg, &[]).await?;
    Ok(Replica { proc, addrs })
}

/// The gateway: one SNI route to every replica's agents port.
async fn start_seed(label: &str, n: usize, veth_ip: &str) -> anyhow::Result<Seed> {
    let dir = TempDir::new(label)?;
    let pki = TunnelPki::new(dir.path())?;
    let ports = (0..n).map(|_| free_port()).collect::<anyhow::Result<Vec<_>>>()?;
    let ups: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let yaml = format!(
        "admin: {{ listen: 127.0.0.1:0 }}\nlisteners:\n  - name: gateway\n    listen: {veth_ip}:0\n    routes:\n      - name: tunnel\n        sni: [{}]\n        upstreams: [{}]\n        balance: least-connections\n",
        testbed::tunnel_kit::SERVER_NAME,
        ups.join(", ")
    );
    let cfg = dir.write("router.yaml", &yaml)?;
    let (router, raddrs) = Proc::start_seedgate(&bin_path("sni-router")?, &cfg, &[]).await?;
    let gateway = raddrs.listener("gateway")?;
    Ok(Seed { dir, pki, ports, _router: router, gateway })
}

/// The shoot: its namespace, joined to the seed by a veth, resolving the gateway's name to the
/// seed's veth address; the agent's admin listens on the shoot's veth address (reachable from here).
struct Shoot {
    ns: Netns,
    seed_ip: String,
    shoot_ip: String,
    _link: testbed::netns::Veth,
}

fn make_shoot(net: u8) -> anyhow::Result<Shoot> {
    let mut ns = Netns::create("shoot")?;
    let (seed_ip, shoot_ip) = (format!("10.217.{net}.1"), format!("10.217.{net}.2"));
    let link = veth(None, Some(&ns), &format!("{seed_ip}/24"), &format!("{shoot_ip}/24"))?;
    ns.set_hosts(&[(&seed_ip, "gateway.seed.test")])?;
    Ok(Shoot { ns, seed_ip, shoot_ip, _link: link })
}

async fn start_shoot_agent(seed: &Seed, shoot: &Shoot, allow: &str) -> anyhow::Result<(Proc, SocketAddr)> {
    let mut o = AgentOpts::new(CLUSTER, format!("gateway.seed.test:{}", seed.gateway.port()), &[allow]);
    o.node_name = "node-1".into();
    let y = agent_yaml(&seed.pki, &o)?.replacen(
        "admin: { listen: 127.0.0.1:0 }",
        &format!("admin: {{ listen: {}:0 }}", shoot.shoot_ip),
        1,
    );
    let (agent, addrs) = start_agent(&seed.dir, "agent", &y, Some(&shoot.ns)).await?;
    let admin = addrs.admin()?;
    Ok((agent, admin))
}

/// Poll until the agent holds `n` sessions to distinct replicas and expects `n`.
async fn wait_agent_sessions(admin: SocketAddr, n: f64, agent: &Proc) -> anyhow::Result<()> {
    poll_until(STEP, Duration::from_millis(50), || async {
        let m = metrics(admin).await?;
        let held = metric_value(&m, "seedgate_agent_server_sessions", &[]).unwrap_or(-1.0);
        let want = metric_value(&m, "seedgate_agent_server_sessions_expected", &[]).unwrap_or(-1.0);
        anyhow::ensure!(held == n && want == n, "agent holds {held} of {want} sessions, want {n} of {n}");
        Ok(())
    })
    .await
    .with_context(|| format!("agent log:\n{}", agent.log()))
}

/// One CONNECT through `r` to the echo backend, bytes echoed back.
async fn echo_through(r: &Dialer, echo: SocketAddr, what: &[u8]) -> anyhow::Result<()> {
    let mut s = connect(r, &echo.to_string()).await?;
    s.write_all(what).await?;
    let mut back = vec![0u8; what.len()];
    tokio::time::timeout(STEP, s.read_exact(&mut back)).await??;
    anyhow::ensure!(back == what, "echo mismatch");
    Ok(())
}

async fn ready(admin: SocketAddr) -> bool {
    matches!(http_get(admin, "/readyz").await, Ok((200, _)))
}

/// Three replicas with `server_count: 3` behind the gateway, an echo backend on the seed's veth
/// address, and the agent in the shoot holding a session to each.
struct Three {
    agent: Proc,
    agent_admin: SocketAddr,
    replicas: Vec<Replica>,
    echo: TcpEcho,
    seed: Seed,
    _shoot: Shoot,
}

async fn three_replicas(net: u8, label: &str) -> anyhow::Result<Three> {
    let shoot = make_shoot(net)?;
    let seed = start_seed(label, 3, &shoot.seed_ip).await?;
    let mut replicas = Vec::new();
    for i in 0..3 {
        replicas.push(start_replica(&seed, i, "  server_count: 3\n", None).await?);
    }
    let echo = TcpEcho::start_on(format!("{}:0", shoot.seed_ip).parse()?).await?;
    let (agent, agent_admin) = start_shoot_agent(&seed, &shoot, &format!("{}/32", shoot.seed_ip)).await?;
    wait_agent_sessions(agent_admin, 3.0, &agent).await?;
    Ok(Three { agent, agent_admin, replicas, echo, seed, _shoot: shoot })
}

/// Three replicas behind the gateway: the agent, knowing one name, reaches all three within
/// seconds; a CONNECT through every replica succeeds; its readiness names the replicas. Then a
/// replica is SIGKILLed and another started in its place: the agent reaches it by itself.
#[tokio::test]
async fn agent_reaches_every_replica_and_finds_a_replacement_after_a_kill() -> anyhow::Result<()> {
    if !require_root() {
        return Ok(());
    }
    let w = three_replicas(1, "ha-reach").await?;
    let (seed, mut replicas, echo, agent, agent_admin) = (&w.seed, w.replicas, &w.echo, &w.agent, w.agent_admin);
    for (i, r) in replicas.iter().enumerate() {
        wait_agents(r.admin(), CLUSTER, 1.0).await.with_context(|| format!("replica {i}:\n{}", r.proc.log()))?;
        echo_through(&r.egress(), echo.addr(), format!("via replica {i}").as_bytes())
            .await
            .with_context(|| format!("CONNECT through replica {i}:\n{}", r.proc.log()))?;
        let m = metrics(r.admin()).await?;
        assert_eq!(metric_value(&m, "seedgate_tunnel_streams_opened_total", &[("cluster", CLUSTER)]), Some(1.0));
        assert_eq!(metric_value(&m, "seedgate_server_replicas_expected", &[]), Some(3.0), "{m}");
        let (_, body) = http_get(r.admin(), "/readyz?verbose").await?;
        assert!(
            body.contains(&format!("replica info: id r{i}, announcing 3 replicas (agents.server_count)")),
            "{body}"
        );
    }
    let (code, body) = http_get(agent_admin, "/readyz?verbose").await?;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("connected: 3 of 3 replicas") && body.contains("r0") && body.contains("r2"), "{body}");

    // SIGKILL replica 1: the agent notices (keepalive), reports the degradation, stays ready.
    replicas[1].proc.signal(libc::SIGKILL)?;
    replicas[1].proc.wait_exit(STEP).await.context("replica 1 did not die")?;
    poll_until(STEP, Duration::from_millis(50), || async {
        let (code, body) = http_get(agent_admin, "/readyz?verbose").await?;
        anyhow::ensure!(code == 200 && body.contains("degraded: 2 of 3 replicas"), "{code} {body}");
        Ok(())
    })
    .await?;
    // A new replica in its place (same port, the same id as a StatefulSet pod would have).
    replicas[1] = start_replica(seed, 1, "  server_count: 3\n", None).await?;
    wait_agents(replicas[1].admin(), CLUSTER, 1.0).await.with_context(|| format!("agent log:\n{}", agent.log()))?;
    wait_agent_sessions(agent_admin, 3.0, agent).await?;
    echo_through(&replicas[1].egress(), echo.addr(), b"via the replacement").await?;
    // Every replica has exactly one session of the agent: duplicates were closed.
    for r in &replicas {
        wait_agents(r.admin(), CLUSTER, 1.0).await?;
    }
    Ok(())
}

/// A rolling restart of all three replicas while a kube-apiserver-like client CONNECTs at a
/// steady rate, each time through a replica whose `/readyz` answers 200: no dial fails. A stream
/// open on a replica when it gets SIGTERM ends with EOF at its drain deadline (not a reset).
#[tokio::test]
async fn a_rolling_restart_fails_no_dial_and_ends_live_streams_cleanly() -> anyhow::Result<()> {
    if !require_root() {
        return Ok(());
    }
    let w = three_replicas(2, "ha-roll").await?;
    let (seed, mut replicas, echo, agent, agent_admin) = (&w.seed, w.replicas, &w.echo, &w.agent, w.agent_admin);

    // The client: front ends and admin ports of the replicas in service. The roller takes a
    // replica out (as an endpoints controller does when a pod terminates) before signalling it;
    // holding `dialing` means no CONNECT is under way.
    let in_service: InService = Arc::new(tokio::sync::Mutex::new(
        replicas.iter().map(|r| Some((r.addrs.listener("egress").expect("egress"), r.admin()))).collect(),
    ));
    let (ok, failed, stop) =
        (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
    let errors = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let client = {
        let (svc, ok, failed, stop, errors) =
            (in_service.clone(), ok.clone(), failed.clone(), stop.clone(), errors.clone());
        let target = echo.addr();
        tokio::spawn(async move {
            let mut turn = 0usize;
            // Bounded: the test stops it; 10 minutes at most regardless.
            let until = tokio::time::Instant::now() + Duration::from_secs(600);
            while !stop.load(Ordering::Relaxed) && tokio::time::Instant::now() < until {
                let svc = svc.lock().await;
                let mut picked = None;
                for k in 0..svc.len() {
                    if let Some((fe, admin)) = svc[(turn + k) % svc.len()]
                        && ready(admin).await
                    {
                        picked = Some(fe);
                        break;
                    }
                }
                turn += 1;
                if let Some(fe) = picked {
                    match echo_through(&Dialer::Tcp(fe), target, b"steady").await {
                        Ok(()) => ok.fetch_add(1, Ordering::Relaxed),
                        Err(e) => {
                            errors.lock().expect("not poisoned").push(format!("{fe}: {e:#}"));
                            failed.fetch_add(1, Ordering::Relaxed)
                        }
                    };
                }
                drop(svc);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };

    #[allow(clippy::needless_range_loop)] // replicas[i] is replaced inside the loop
    for i in 0..3 {
        // A long stream (an exec session) open on replica i when it is told to stop.
        let mut live = connect(&replicas[i].egress(), &echo.addr().to_string()).await?;
        live.write_all(b"before").await?;
        let mut b = [0u8; 6];
        tokio::time::timeout(STEP, live.read_exact(&mut b)).await??;
        in_service.lock().await[i] = None;
        replicas[i].proc.signal(libc::SIGTERM)?;
        // The stream keeps working during the drain ...
        live.write_all(b"during").await?;
        tokio::time::timeout(STEP, live.read_exact(&mut b)).await??;
        assert_eq!(&b, b"during");
        // ... and ends cleanly at the drain deadline: EOF, not a reset.
        let mut rest = Vec::new();
        let end = tokio::time::timeout(STEP, live.read_to_end(&mut rest)).await.context("stream did not end")?;
        assert!(end.is_ok(), "stream ended with an error, not EOF: {end:?}");
        replicas[i].proc.wait_exit(STEP).await.context("replica did not exit after its drain")?;
        let old_log = replicas[i].proc.log();
        replicas[i] = start_replica(seed, i, "  server_count: 3\n", None).await?;
        wait_agents(replicas[i].admin(), CLUSTER, 1.0)
            .await
            .with_context(|| format!("old replica log:\n{old_log}\nagent log:\n{}", agent.log()))?;
        in_service.lock().await[i] = Some((replicas[i].addrs.listener("egress")?, replicas[i].admin()));
    }
    wait_agent_sessions(agent_admin, 3.0, agent).await?;
    // Let the client go through every restarted replica at least once more.
    let before = ok.load(Ordering::Relaxed);
    poll_until(STEP, Duration::from_millis(20), || async {
        anyhow::ensure!(ok.load(Ordering::Relaxed) >= before + 6, "client made no progress");
        Ok(())
    })
    .await?;
    stop.store(true, Ordering::Relaxed);
    client.await?;
    let (ok, failed) = (ok.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    assert!(ok > 0);
    assert_eq!(
        failed,
        0,
        "{failed} failed dials of {}: {:?}\nagent log:\n{}",
        ok + failed,
        errors.lock().expect("not poisoned"),
        agent.log()
    );
    for r in &replicas {
        wait_agents(r.admin(), CLUSTER, 1.0).await?;
    }
    Ok(())
}

/// `/etc/hosts` for the replicas of the peers test: `peers.seed.test` resolves to `n` addresses.
fn write_peers(hosts: &Path, n: usize) -> anyhow::Result<()> {
    let mut s = String::from("127.0.0.1 localhost\n");
    for k in 0..n {
        s.push_str(&format!("127.0.1.{} peers.seed.test\n", k + 1));
    }
    // Written in place: the replicas see this inode through a bind mount.
    std::fs::write(hosts, s)?;
    Ok(())
}

/// The replica count from `agents.peers` instead of a static count: two replicas, then a third
/// added (the peers name resolves to three addresses): the agent follows, without any reload.
#[tokio::test]
async fn the_count_follows_a_peers_name() -> anyhow::Result<()> {
    if !require_root() {
        return Ok(());
    }
    let shoot = make_shoot(3)?;
    let seed = start_seed("ha-peers", 3, &shoot.seed_ip).await?;
    let hosts = seed.dir.path().join("hosts");
    write_peers(&hosts, 2)?;
    // Each replica sees `hosts` as its /etc/hosts (a private mount namespace; same network).
    let with_hosts = || -> anyhow::Result<std::process::Command> {
        let mut c = std::process::Command::new("unshare");
        c.args(["--mount", "--propagation", "private", "--", "/bin/sh", "-c"])
            .arg(format!("mount --bind {} /etc/hosts && exec \"$0\" \"$@\"", hosts.display()))
            .arg(bin_path("proxy-server")?);
        Ok(c)
    };
    let peers = "  peers: peers.seed.test:8132\n  peers_interval: 1s\n";
    let mut replicas = Vec::new();
    for i in 0..2 {
        replicas.push(start_replica(&seed, i, peers, Some(with_hosts()?)).await?);
    }
    let echo = TcpEcho::start_on(format!("{}:0", shoot.seed_ip).parse()?).await?;
    let (agent, agent_admin) = start_shoot_agent(&seed, &shoot, &format!("{}/32", shoot.seed_ip)).await?;
    wait_agent_sessions(agent_admin, 2.0, &agent).await?;
    for r in &replicas {
        let m = metrics(r.admin()).await?;
        assert_eq!(metric_value(&m, "seedgate_server_peers_resolved", &[]), Some(2.0), "{m}");
        let (_, body) = http_get(r.admin(), "/readyz?verbose").await?;
        assert!(body.contains("announcing 2 replicas (from agents.peers peers.seed.test:8132)"), "{body}");
    }

    write_peers(&hosts, 3)?;
    replicas.push(start_replica(&seed, 2, peers, Some(with_hosts()?)).await?);
    wait_agent_sessions(agent_admin, 3.0, &agent).await?;
    for (i, r) in replicas.iter().enumerate() {
        wait_agents(r.admin(), CLUSTER, 1.0).await.with_context(|| format!("replica {i}"))?;
        echo_through(&r.egress(), echo.addr(), b"peers").await?;
    }
    // Back to two: the third replica leaves and the peers name shrinks; the agent expects two.
    replicas[2].proc.signal(libc::SIGTERM)?;
    replicas[2].proc.wait_exit(STEP).await.context("replica 2 did not exit")?;
    write_peers(&hosts, 2)?;
    wait_agent_sessions(agent_admin, 2.0, &agent).await?;
    let (code, body) = http_get(agent_admin, "/readyz?verbose").await?;
    assert!(code == 200 && body.contains("connected: 2 of 2 replicas"), "{code} {body}");
    Ok(())
}

/// Rewrite replica `i`'s config with a new `server_count` (renamed over, as a ConfigMap update
/// does: the replica reloads on the change) and wait until it announces it.
async fn set_count(seed: &Seed, r: &Replica, i: usize, count: u32) -> anyhow::Result<()> {
    let path = seed.dir.path().join(format!("replica{i}.yaml"));
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, replica_yaml(seed, i, &format!("  server_count: {count}\n")))?;
    std::fs::rename(&tmp, &path)?;
    poll_until(STEP, Duration::from_millis(20), || async {
        let m = metrics(r.admin()).await?;
        let have = metric_value(&m, "seedgate_server_replicas_expected", &[]).unwrap_or(0.0);
        anyhow::ensure!(have == f64::from(count), "replica {i} announces {have}");
        Ok(())
    })
    .await
    .with_context(|| format!("replica {i} log:\n{}", r.proc.log()))
}

/// A static count changed by reloads, as a ConfigMap update reaches the replicas one after the
/// other: a third replica starts with `server_count: 3` and one of the two running ones reloads
/// to 3 — the agent follows at once and reaches the third. A restarted agent also ends at 3 although
/// the replica that has not reloaded yet still announces 2 (its count is older). Scaling back, the
/// third stops and both reload to 2: the agent expects 2 again.
#[tokio::test]
async fn a_new_count_is_trusted_over_stale_ones_and_reloads_change_it() -> anyhow::Result<()> {
    if !require_root() {
        return Ok(());
    }
    let shoot = make_shoot(4)?;
    let seed = start_seed("ha-count", 3, &shoot.seed_ip).await?;
    let mut replicas = Vec::new();
    for i in 0..2 {
        replicas.push(start_replica(&seed, i, "  server_count: 2\n", None).await?);
    }
    let allow = format!("{}/32", shoot.seed_ip);
    let (agent, agent_admin) = start_shoot_agent(&seed, &shoot, &allow).await?;
    wait_agent_sessions(agent_admin, 2.0, &agent).await?;

    replicas.push(start_replica(&seed, 2, "  server_count: 3\n", None).await?);
    set_count(&seed, &replicas[0], 0, 3).await?;
    wait_agent_sessions(agent_admin, 3.0, &agent).await?;
    wait_agents(replicas[2].admin(), CLUSTER, 1.0).await?;

    // r1 still announces 2, from before r0's reload and r2's start: a fresh agent ignores it.
    drop(agent);
    let (agent, agent_admin) = start_shoot_agent(&seed, &shoot, &allow).await?;
    wait_agent_sessions(agent_admin, 3.0, &agent).await?;

    replicas[2].proc.signal(libc::SIGTERM)?;
    replicas[2].proc.wait_exit(STEP).await.context("replica 2 did not exit")?;
    for (i, r) in replicas[..2].iter().enumerate() {
        set_count(&seed, r, i, 2).await?;
    }
    wait_agent_sessions(agent_admin, 2.0, &agent).await?;
    for r in &replicas[..2] {
        wait_agents(r.admin(), CLUSTER, 1.0).await?;
    }
    Ok(())
}
