//! fleet: N proxy-agents (default 1,000) of ten clusters through one sni-router to three proxy-server replicas, over h2 and over QUIC: what a session costs, how soon the fleet is connected, and the reconnect storm after a replica's SIGKILL.
//!
//! Three proxy-server replicas (`server_id` r0..r2, `server_count: 3`, fixed agents ports on TCP
//! and UDP, one plain CONNECT front end per cluster) sit behind one sni-router: a TCP listener
//! with an SNI route and a UDP listener with the same SNI route for QUIC, both
//! `balance: least-connections`. The agents know only the router (and the SNI name); each keeps
//! a session to every replica. They run as instances in one helper process (`bench
//! fleet-agents`, through the agent's library), not as N processes: each has its own node name,
//! its cluster's client certificate and its own metrics registry, no admin listener and no
//! apiserver proxy.
//!
//! Per transport (h2, then QUIC; everything started afresh):
//! - Memory: RSS of each replica, of sni-router and of the helper before the agents start and
//!   once every agent holds all three replicas, divided by the sessions (each replica holds N,
//!   the router relays 3N, the helper serves N instances).
//! - Cold start: from spawning the helper until every instance holds all three replicas.
//! - Storm: under a steady CONNECT load (each dial to the echo backend through the next replica
//!   in service, front end of cluster k mod 10), replica r1 gets SIGKILL and a new r1 starts at
//!   once on the same ports; it is out of the load's set until its `/readyz` answers 200. Each
//!   instance's time from the kill until it has lost its session to r1 and holds all three again
//!   is taken on the agents' side (each instance's readiness, swept every 10 ms); the CPU the new
//!   r1 used until then and the CPU sni-router used from the kill until then come from
//!   `/proc/<pid>/stat`.
//!
//! No anchor plays this role (konnectivity is not installed): the figures are seedgate's only,
//! reported, never asserted.

use super::ha::{
    DIAL_TIMEOUT, REPLICAS, SEEDGATE_ONLY, SNI, at_rate, echo, median, metrics, ms, open_stream, ready, tail,
};
use super::{Ctx, record};
use crate::host::{self, lock};
use crate::load::{Echo, connect_head};
use crate::report::{Better, Kind, MetricId, Results};
use crate::systems::{self, Running};
use anyhow::{Context as _, bail, ensure};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use testbed::{Proc, metric_sum};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio::time::Instant;

pub(super) const SC: &str = "fleet";
const CLUSTERS: usize = 10;
/// The replica killed (its id is `r1`).
const KILLED: usize = 1;
/// Both ends' keepalive: over QUIC a killed replica's sessions end only at its timeout.
const KEEPALIVE: &str = "{ interval: 2s, timeout: 6s }";
/// Replicas and the helper log warnings only (kept with `--keep`).
const LOG: &str = "warn";
const POLL: Duration = Duration::from_millis(50);
/// Longest wait for the fleet to connect, or to come back after the kill.
const FLEET_MAX: Duration = Duration::from_secs(240);
/// How long the load runs before the kill and after every agent is back (a quarter in smoke runs).
const CALM: Duration = Duration::from_secs(1);
/// Sockets one host process may hold with the harness's fd limit (three sessions per agent).
const FDS_PER_HOST: usize = 16_000;
const PAYLOAD: &[u8] = b"seedgate-fleet-0";

#[derive(Debug, Clone, Copy, PartialEq)]
enum Over {
    H2,
    Quic,
}

impl Over {
    fn label(self, n: usize) -> String {
        let t = match self {
            Over::H2 => "h2",
            Over::Quic => "QUIC",
        };
        format!("{n} agents over {t} → sni-router → proxy-server ×3")
    }
}

fn cluster(j: usize) -> String {
    format!("shoot-{j:02}")
}

/// Files and ports every replica is started with.
struct Seed {
    pin: host::Pinning,
    server_bin: PathBuf,
    dir: PathBuf,
    ca: PathBuf,
    configs: Vec<PathBuf>,
}

struct Replica {
    proc: Proc,
    admin: SocketAddr,
    /// One CONNECT front end per cluster, by cluster index.
    frontends: Vec<SocketAddr>,
    spawned: Instant,
}

impl Seed {
    fn new(ctx: &Ctx, dir: PathBuf, tcp: &[SocketAddr], udp: &[SocketAddr]) -> anyhow::Result<Self> {
        host::dir_with_mode(&dir, 0o755)?;
        let ca = ctx.ca.write(&dir, "ca")?;
        let (sc, sk) = ctx.ca.server(&[SNI])?.write(&dir, "agents-listener")?;
        let frontends: String = (0..CLUSTERS)
            .map(|j| format!("  - {{ name: c{j}, listen: 127.0.0.1:0, cluster: {} }}\n", cluster(j)))
            .collect();
        let mut configs = Vec::new();
        for i in 0..REPLICAS {
            let cfg = dir.join(format!("replica{i}.yaml"));
            systems::write_atomic(
                &cfg,
                &format!(
                    "admin: {{ listen: 127.0.0.1:0 }}\ndrain_grace: 1s\nlimits: {{ max_connections: 19000 }}\n\
                     agents:\n  listen: {}\n  quic: {{ listen: {} }}\n  tls: {{ cert: {}, key: {}, client_ca: {} }}\n\
                     \x20 keepalive: {KEEPALIVE}\n  server_id: r{i}\n  server_count: {REPLICAS}\nfrontends:\n{frontends}",
                    tcp[i],
                    udp[i],
                    sc.display(),
                    sk.display(),
                    ca.display()
                ),
            )?;
            configs.push(cfg);
        }
        Ok(Self { pin: ctx.pin.clone(), server_bin: ctx.bins.server.clone(), dir, ca, configs })
    }

    async fn start_replica(&self, i: usize) -> anyhow::Result<Replica> {
        let mut cmd = self.pin.command(&self.server_bin);
        cmd.env("RUST_LOG", LOG);
        let spawned = Instant::now();
        let (proc, a) =
            Proc::spawn_seedgate(cmd, &self.configs[i], &[]).await.with_context(|| format!("starting replica r{i}"))?;
        let frontends = (0..CLUSTERS).map(|j| a.listener(&format!("c{j}"))).collect::<anyhow::Result<_>>()?;
        Ok(Replica { proc, admin: a.admin()?, frontends, spawned })
    }

    /// The agents' config, with `{node}` and `{cluster}` for the helper to fill in.
    fn agent_template(&self, ctx: &Ctx, over: Over, server: SocketAddr) -> anyhow::Result<PathBuf> {
        for j in 0..CLUSTERS {
            ctx.ca.client(&cluster(j))?.write(&self.dir, &format!("agent-{j}"))?;
        }
        // Over QUIC the instances read without UDP GRO: quinn keeps room for 32 coalesced reads
        // per session (up to 2 MiB touched), and thousands of sessions in one process would not
        // fit in memory.
        let transport = if over == Over::Quic { "quic\n  quic_gro: false" } else { "h2" };
        let d = self.dir.display();
        let p = self.dir.join("agent-template.yaml");
        systems::write_atomic(
            &p,
            &format!(
                "admin: {{ listen: null }}\ndrain_grace: 1s\nlimits: {{ max_connections: 100 }}\n\
                 tunnel:\n  servers: [{server}]\n  transport: {transport}\n  node_name: \"{{node}}\"\n\
                 \x20 tls: {{ cert: {d}/agent-{{cluster}}.crt, key: {d}/agent-{{cluster}}.key, ca: {}, server_name: {SNI} }}\n\
                 \x20 allow: [127.0.0.1/32]\n  keepalive: {KEEPALIVE}\n{}",
                self.ca.display(),
                // Smoke runs: a shorter search for the replicas not held yet (the probe back-off is
                // capped at reconnect.max), so CI's run takes seconds; full runs keep the defaults.
                if ctx.smoke { "  reconnect: { initial: 100ms, max: 1s }\n" } else { "" }
            ),
        )?;
        Ok(p)
    }
}

// ---------------------------------------------------------------------------------------------
// The helper process hosting the agents

/// `bench fleet-agents`, spoken to over its stdin and stdout.
struct Fleet {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    log: PathBuf,
    /// RSS (KiB) of the helper before it bound the instances.
    rss_before: u64,
}

impl Fleet {
    async fn spawn(dir: &Path, n: usize, template: &Path) -> anyhow::Result<Self> {
        ensure!(n * REPLICAS <= FDS_PER_HOST, "{n} agents need more than one helper's {FDS_PER_HOST} sockets");
        let log = dir.join("fleet-agents.log");
        let mut cmd = tokio::process::Command::new(std::env::current_exe()?);
        cmd.arg("fleet-agents").args(["--count", &n.to_string(), "--clusters", &CLUSTERS.to_string()]);
        cmd.args(["--replicas", &REPLICAS.to_string(), "--template"]).arg(template);
        cmd.env("RUST_LOG", LOG).stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped());
        cmd.stderr(std::fs::File::create(&log)?).kill_on_drop(true);
        let mut child = cmd.spawn().context("starting bench fleet-agents")?;
        let stdin = child.stdin.take().context("no stdin")?;
        let mut lines = BufReader::new(child.stdout.take().context("no stdout")?).lines();
        let bound = tokio::time::timeout(FLEET_MAX, lines.next_line()).await;
        let line = match bound {
            Ok(Ok(Some(l))) => l,
            other => bail!("fleet-agents did not bind ({other:?}); log:\n{}", tail(&read(&log), 20)),
        };
        let rss_before = line.split_whitespace().nth(2).and_then(|v| v.parse().ok()).unwrap_or(0);
        Ok(Self { child, stdin, lines, log, rss_before })
    }

    async fn ask(&mut self, cmd: &str) -> anyhow::Result<Vec<String>> {
        self.stdin.write_all(format!("{cmd}\n").as_bytes()).await?;
        let line = tokio::time::timeout(Duration::from_secs(30), self.lines.next_line())
            .await
            .with_context(|| format!("fleet-agents did not answer {cmd:?}"))??
            .with_context(|| format!("fleet-agents exited; log:\n{}", tail(&read(&self.log), 20)))?;
        let words: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
        let verb = cmd.split(' ').next().unwrap_or("");
        ensure!(words.first().is_some_and(|w| w.starts_with(verb)), "fleet-agents answered {line:?} to {cmd:?}");
        Ok(words)
    }

    fn pid(&self) -> u32 {
        self.child.id().unwrap_or(0)
    }
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

fn num(words: &[String], i: usize) -> f64 {
    words.get(i).and_then(|w| w.parse().ok()).unwrap_or(f64::NAN)
}

/// Poll until every one of the `n` instances holds all three replicas; returns the time.
async fn wait_all_held(fleet: &mut Fleet, n: usize, since: Instant) -> anyhow::Result<Duration> {
    let mut last = Vec::new();
    // Bounded by FLEET_MAX.
    while since.elapsed() < FLEET_MAX {
        last = fleet.ask("status").await?;
        if num(&last, 1) >= n as f64 {
            return Ok(since.elapsed());
        }
        tokio::time::sleep(POLL).await;
    }
    bail!("after {FLEET_MAX:?} only {} of {n} agents hold all {REPLICAS} replicas ({last:?})", num(&last, 1))
}

// ---------------------------------------------------------------------------------------------
// The CONNECT load

/// What the load counted.
#[derive(Debug, Default, Clone)]
struct Tally {
    dials: u64,
    failed: u64,
    reasons: BTreeMap<String, u64>,
}

struct Load {
    /// Each replica's front ends while it is in service.
    endpoints: Mutex<Vec<Option<Vec<SocketAddr>>>>,
    stop: AtomicBool,
    tally: Mutex<Tally>,
}

/// One CONNECT to the echo backend through replica `via`'s `frontend`, a few bytes echoed.
async fn dial(load: Arc<Load>, via: usize, frontend: SocketAddr, head: Arc<[u8]>) {
    let deadline = Instant::now() + DIAL_TIMEOUT;
    let r = match open_stream(frontend, &head, deadline).await {
        Ok(mut s) => echo(&mut s, PAYLOAD, deadline).await,
        Err(e) => Err(e),
    };
    let mut t = lock(&load.tally);
    t.dials += 1;
    if let Err(e) = r {
        t.failed += 1;
        *t.reasons.entry(format!("through r{via}: {}", e.chars().take(160).collect::<String>())).or_default() += 1;
    }
}

/// `rate` CONNECTs/s until stopped: dial k goes to cluster k mod 10 through the next replica in
/// service.
async fn offer(load: Arc<Load>, rate: f64, head: Arc<[u8]>) {
    at_rate(&load.stop, rate, |k| {
        let eps = lock(&load.endpoints);
        let pick =
            (0..REPLICAS).map(|r| (k + r) % REPLICAS).find_map(|r| eps[r].as_ref().map(|f| (r, f[k % CLUSTERS])));
        pick.map(|(r, fe)| dial(load.clone(), r, fe, head.clone()))
    })
    .await
}

// ---------------------------------------------------------------------------------------------
// One transport's run

/// What one transport's run measured.
#[derive(Debug, Default)]
struct Figures {
    agent_kib: f64,
    replica_kib: f64,
    router_kib: f64,
    cold_ms: f64,
    /// Per agent: kill → it holds every replica again (those that made it).
    back_ms: Vec<f64>,
    back_missing: usize,
    /// Kill → every agent back; the new replica's start → its /readyz 200.
    all_back_ms: f64,
    ready_ms: f64,
    tally: Tally,
    replica_cpu_s: f64,
    router_cpu_s: f64,
    /// duplicate sessions closed, reconnects ok, failed (all instances, the whole run).
    totals: [f64; 3],
    /// What sni-router refused over the whole run: flows by result, datagrams dropped by reason.
    router_refused: String,
}

/// RSS (KiB) of each replica and of the router.
fn seed_rss(replicas: &[Replica], router: &Running) -> (Vec<u64>, u64) {
    (replicas.iter().map(|r| host::rss_kib(r.proc.pid()).unwrap_or(0)).collect(), router.rss_kib())
}

async fn run_over(ctx: &Ctx, over: Over, n: usize, echo_addr: SocketAddr) -> anyhow::Result<Figures> {
    let tcp: Vec<SocketAddr> = (0..REPLICAS).map(|_| host::free_port([127, 0, 0, 1])).collect::<anyhow::Result<_>>()?;
    let udp: Vec<SocketAddr> = (0..REPLICAS).map(|_| host::free_port([127, 0, 0, 1])).collect::<anyhow::Result<_>>()?;
    let join = |v: &[SocketAddr]| v.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
    let listeners = format!(
        "  - name: gateway\n    listen: 127.0.0.1:0\n    routes:\n      - name: replicas\n        sni: [{SNI}]\n        \
         upstreams: [{}]\n        balance: least-connections\n  - name: gateway-quic\n    listen: 127.0.0.1:0\n    \
         protocol: udp\n    routes:\n      - name: replicas-quic\n        sni: [{SNI}]\n        upstreams: [{}]\n        \
         balance: least-connections\n",
        join(&tcp),
        join(&udp)
    );
    // Smoke runs: the UDP flows of ended QUIC sessions stop counting for least-connections
    // sooner (after a third of udp_idle, still above the agents' 2 s keep-alive interval), so
    // CI's run takes seconds; full runs keep the default.
    let udp_idle = if ctx.smoke { ", udp_idle: 7s" } else { "" };
    // Every agent's session to every replica is a flow, and the flow of a session that ended (a
    // duplicate closed, a session reset by the restarted replica) stays until udp_idle: room for
    // twice the live ones. The default (10,000) refused flows from about 1,700 agents on.
    let udp_flows = (2 * REPLICAS * n).max(10_000);
    let top = format!(
        "timeouts: {{ handshake: 5s, connect: 5s, idle: 1h{udp_idle} }}\n\
         limits: {{ max_connections: 19000, udp_flows: {udp_flows} }}\n"
    );
    let mut router = systems::sni_router_top(&ctx.env(), &over.label(n), &top, &listeners).await?;
    let seed = Seed::new(ctx, router.dir.join("seed"), &tcp, &udp)?;
    let mut replicas = Vec::with_capacity(REPLICAS);
    for i in 0..REPLICAS {
        replicas.push(seed.start_replica(i).await?);
    }
    let server = router.addr(if over == Over::Quic { "gateway-quic" } else { "gateway" })?;
    let template = seed.agent_template(ctx, over, server)?;
    let (rss0, router0) = seed_rss(&replicas, &router);
    let mut f = Figures::default();
    let t0 = Instant::now();
    let mut fleet = Fleet::spawn(&seed.dir, n, &template).await?;
    let cold = wait_all_held(&mut fleet, n, t0).await?;
    f.cold_ms = ms(cold);
    eprintln!(
        "  fleet: {}: every agent holds all {REPLICAS} replicas {:.0} ms after the helper started",
        over.label(n),
        f.cold_ms
    );
    let (rss1, router1) = seed_rss(&replicas, &router);
    let per = |a: u64, b: u64, sessions: usize| (b.saturating_sub(a) as f64) / sessions.max(1) as f64;
    f.replica_kib = median(&rss0.iter().zip(&rss1).map(|(&a, &b)| per(a, b, n)).collect::<Vec<_>>());
    f.router_kib = per(router0, router1, REPLICAS * n);
    f.agent_kib = per(fleet.rss_before, host::rss_kib(fleet.pid()).unwrap_or(0), n);
    let r = storm(ctx, &seed, &mut replicas, &mut fleet, &mut router, n, echo_addr, &mut f).await;
    f.totals = match fleet.ask("totals").await {
        Ok(w) => [num(&w, 1), num(&w, 2), num(&w, 3)],
        Err(_) => [f64::NAN; 3],
    };
    for (i, r) in replicas.iter().enumerate() {
        let _ = std::fs::write(seed.dir.join(format!("r{i}.log")), r.proc.log());
    }
    f.router_refused = match metrics(router.addr("admin")?).await {
        Ok(m) => {
            let flows = by_label(&m, "seedgate_udp_flows_total", "result", "ok");
            let dropped = by_label(&m, "seedgate_udp_datagrams_dropped_total", "reason", "");
            format!("UDP flows refused: {flows}; datagrams dropped: {dropped}")
        }
        Err(e) => format!("its metrics: {e:#}"),
    };
    router.check_alive()?;
    r.map(|()| f)
}

/// SIGKILL r1 under the load, start it again at once; until every agent holds it again.
#[allow(clippy::too_many_arguments)]
async fn storm(
    ctx: &Ctx,
    seed: &Seed,
    replicas: &mut [Replica],
    fleet: &mut Fleet,
    router: &mut Running,
    n: usize,
    echo_addr: SocketAddr,
    f: &mut Figures,
) -> anyhow::Result<()> {
    let load = Arc::new(Load {
        endpoints: Mutex::new(replicas.iter().map(|r| Some(r.frontends.clone())).collect()),
        stop: AtomicBool::new(false),
        tally: Mutex::new(Tally::default()),
    });
    let head: Arc<[u8]> = connect_head(&echo_addr.to_string(), "").into();
    let offered = tokio::spawn(offer(load.clone(), ctx.scale.fleet_rate, head));
    let calm = if ctx.smoke { CALM / 4 } else { CALM };
    let r = async {
        tokio::time::sleep(calm).await;
        let router_pid = *router.pids().first().context("no sni-router process")?;
        let cpu0 = host::cpu_seconds(router_pid).unwrap_or(f64::NAN);
        fleet.ask(&format!("mark r{KILLED}")).await?;
        let kill = Instant::now();
        lock(&load.endpoints)[KILLED] = None;
        replicas[KILLED].proc.signal(libc::SIGKILL)?;
        replicas[KILLED].proc.wait_exit(FLEET_MAX).await.context("r1 did not die after SIGKILL")?;
        let _ = std::fs::write(seed.dir.join("r1-killed.log"), replicas[KILLED].proc.log());
        replicas[KILLED] = seed.start_replica(KILLED).await?;
        f.ready_ms = back_in_service(&replicas[KILLED], &load).await?;
        let (all, times) = wait_back(fleet, n, kill).await?;
        f.all_back_ms = ms(all);
        f.replica_cpu_s = host::cpu_seconds(replicas[KILLED].proc.pid()).unwrap_or(f64::NAN);
        f.router_cpu_s = host::cpu_seconds(router_pid).unwrap_or(f64::NAN) - cpu0;
        f.back_missing = n.saturating_sub(times.len());
        f.back_ms = times;
        if f.back_missing > 0 {
            let w = fleet.ask("missing").await?;
            eprintln!("  fleet:   not back: {}", w.get(1..).unwrap_or_default().join(" "));
        }
        let m = metrics(replicas[KILLED].admin).await?;
        let on_new = metric_sum(&m, "seedgate_agents_connected", &[]);
        eprintln!("  fleet:   the new r1 counts {on_new} agents; it was ready {:.0} ms after its start", f.ready_ms);
        tokio::time::sleep(calm).await;
        Ok(())
    }
    .await;
    load.stop.store(true, Ordering::Relaxed);
    let _ = offered.await;
    f.tally = lock(&load.tally).clone();
    r
}

/// Poll the new replica's /readyz until 200, then put it back in the load's set; returns the
/// time from its start.
async fn back_in_service(r: &Replica, load: &Load) -> anyhow::Result<f64> {
    // Bounded by FLEET_MAX.
    while !ready(r.admin).await {
        ensure!(r.spawned.elapsed() < FLEET_MAX, "the new r1 was not ready within {FLEET_MAX:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    lock(&load.endpoints)[KILLED] = Some(r.frontends.clone());
    Ok(ms(r.spawned.elapsed()))
}

/// Poll the helper until every instance is back (or [`FLEET_MAX`]); the time and every
/// instance's own time (ms from the kill).
async fn wait_back(fleet: &mut Fleet, n: usize, kill: Instant) -> anyhow::Result<(Duration, Vec<f64>)> {
    // Bounded by FLEET_MAX.
    loop {
        let w = fleet.ask("times").await?;
        let done = num(&w, 1) as usize;
        if done >= n || kill.elapsed() > FLEET_MAX {
            let times: Vec<f64> = w.iter().skip(3).filter_map(|v| v.parse().ok()).collect();
            let all = times.iter().copied().fold(0.0, f64::max);
            return Ok((Duration::from_secs_f64(all / 1e3), times));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ---------------------------------------------------------------------------------------------

fn quantile(v: &[f64], q: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() { f64::NAN } else { s[((s.len() - 1) as f64 * q).round() as usize] }
}

struct Rows {
    agent: MetricId,
    replica: MetricId,
    router: MetricId,
    cold: MetricId,
    p50: MetricId,
    p99: MetricId,
    max: MetricId,
    failed: MetricId,
    replica_cpu: MetricId,
    router_cpu: MetricId,
}

impl Rows {
    fn new(res: &mut Results, n: usize) -> Self {
        let mut m = |name: &str, unit: &str, b: Better| res.metric(SC, name, unit, b);
        Self {
            agent: m("memory per agent instance (helper process RSS ÷ instances)", "KiB", Better::Lower),
            replica: m(
                "memory per agent session on a proxy-server replica (RSS delta ÷ sessions)",
                "KiB",
                Better::Lower,
            ),
            router: m("memory per agent session on sni-router (RSS delta ÷ sessions)", "KiB", Better::Lower),
            cold: m(&format!("cold start: all {n} agents hold all 3 replicas"), "ms", Better::Lower),
            p50: m("replica SIGKILL + restart → an agent holds it again, p50 over agents", "ms", Better::Lower),
            p99: m("replica SIGKILL + restart → an agent holds it again, p99 over agents", "ms", Better::Lower),
            max: m("replica SIGKILL + restart → every agent holds it again (max)", "ms", Better::Lower),
            failed: m("dials failed from the kill until every agent is back", "dials", Better::Lower),
            replica_cpu: m("CPU of the restarted replica until every agent is back", "s", Better::Lower),
            router_cpu: m("CPU of sni-router from the kill until every agent is back", "s", Better::Lower),
        }
    }

    fn all(&self) -> [MetricId; 10] {
        [
            self.agent,
            self.replica,
            self.router,
            self.cold,
            self.p50,
            self.p99,
            self.max,
            self.failed,
            self.replica_cpu,
            self.router_cpu,
        ]
    }

    fn record(&self, res: &mut Results, label: &str, f: &Figures) {
        let missing = || anyhow::anyhow!("{} agents did not come back within {FLEET_MAX:?}", f.back_missing);
        let back = |q: f64| if f.back_missing == 0 { Ok(quantile(&f.back_ms, q)) } else { Err(missing()) };
        let figs = [
            (self.agent, Ok(f.agent_kib)),
            (self.replica, Ok(f.replica_kib)),
            (self.router, Ok(f.router_kib)),
            (self.cold, Ok(f.cold_ms)),
            (self.p50, back(0.5)),
            (self.p99, back(0.99)),
            (self.max, back(1.0)),
            (self.failed, Ok(f.tally.failed as f64)),
            (self.replica_cpu, Ok(f.replica_cpu_s)),
            (self.router_cpu, Ok(f.router_cpu_s)),
        ];
        for (m, v) in figs {
            record(res, m, label, Kind::Seedgate, v);
        }
    }
}

/// The sum of metric `name` per value of `label` (all but `except`), e.g. "3 × flows_full", or "none".
fn by_label(metrics: &str, name: &str, label: &str, except: &str) -> String {
    let mut sums: BTreeMap<String, f64> = BTreeMap::new();
    let key = format!("{label}=\"");
    for line in metrics.lines().filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{')) {
        let Some(rest) = line.split_once(&key).map(|(_, r)| r) else { continue };
        let Some((value, _)) = rest.split_once('"') else { continue };
        let n: f64 = line.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or(0.0);
        if value != except && n > 0.0 {
            *sums.entry(value.to_owned()).or_default() += n;
        }
    }
    if sums.is_empty() {
        return "none".to_owned();
    }
    sums.iter().map(|(v, n)| format!("{n} × {v}")).collect::<Vec<_>>().join(", ")
}

fn remark_run(res: &mut Results, label: &str, f: &Figures) {
    let reasons = if f.tally.reasons.is_empty() {
        "none".to_owned()
    } else {
        f.tally.reasons.iter().map(|(r, k)| format!("{k} × {r}")).collect::<Vec<_>>().join("; ")
    };
    res.remark(
        SC,
        &format!(
            "{label}: the new r1 answered /readyz 200 {:.0} ms after its start; {} of {} dials failed during the storm \
             (reasons: {reasons}); over the whole run the agents closed {} duplicate sessions (reached a replica they \
             already held through the router) and counted {} reconnects ok, {} failed; sni-router: {}",
            f.ready_ms, f.tally.failed, f.tally.dials, f.totals[0], f.totals[1], f.totals[2], f.router_refused
        ),
    );
}

pub(super) async fn run(ctx: &Ctx, res: &mut Results) -> anyhow::Result<()> {
    let n = ctx.scale.fleet_agents;
    // A replica is ready once every cluster it serves has an agent.
    ensure!(n >= CLUSTERS, "--agents {n}: the fleet needs at least one agent per cluster ({CLUSTERS})");
    let rows = Rows::new(res, n);
    let labels = [Over::H2, Over::Quic].map(|o| (o, o.label(n)));
    // `--only` may name one transport's label (e.g. `over QUIC`): the other is left out.
    let (labels, left_out): (Vec<_>, Vec<_>) = labels.into_iter().partition(|(_, l)| systems::check_only(l).is_ok());
    for (_, l) in &left_out {
        for m in rows.all() {
            res.skip(m, l, Kind::Seedgate, "filtered out (--only)");
        }
    }
    if labels.is_empty() {
        return Ok(());
    }
    res.remark(SC, SEEDGATE_ONLY);
    res.remark(
        SC,
        &format!(
            "on 127.0.0.1: {n} agents of {CLUSTERS} clusters, as instances of the agent library in one helper process (own \
             node name, cluster certificate and metrics registry each; no admin listener) on the harness's CPU, dial one \
             sni-router (TCP SNI route, or UDP SNI route for QUIC; balance: least-connections) to {REPLICAS} proxy-server \
             replicas (server_count {REPLICAS}, keepalive {KEEPALIVE}, one CONNECT front end per cluster) on the proxy CPU. \
             Storm: {} CONNECTs/s to an echo backend spread over the clusters and the replicas in service; r{KILLED} gets \
             SIGKILL and a new one starts at once on its ports, back in the load's set once /readyz is 200. Per-agent times \
             come from each instance's readiness (sessions up, replica ids), swept every 10 ms from the kill. Over QUIC the \
             instances run with quic_gro: false (quinn's receive room per session is then 47 KiB, not up to 2 MiB)",
            ctx.scale.fleet_rate
        ),
    );
    let echo_backend = Echo::start().await?;
    let mut failed = Vec::new();
    for (over, label) in &labels {
        for _ in 0..ctx.scale.fleet_kills {
            match run_over(ctx, *over, n, echo_backend.addr()).await {
                Ok(f) => {
                    rows.record(res, label, &f);
                    remark_run(res, label, &f);
                }
                Err(e) => {
                    for m in rows.all() {
                        record(res, m, label, Kind::Seedgate, Err(anyhow::anyhow!("{e:#}")));
                    }
                    failed.push(format!("{label}: {e:#}"));
                }
            }
        }
    }
    ensure!(failed.is_empty(), "{}", failed.join("\n"));
    Ok(())
}
