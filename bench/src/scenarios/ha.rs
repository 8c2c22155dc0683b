//! ha: proxy-server replicas behind one name: how soon a replica started in place of a killed one
//! gets the agent's session, and how many CONNECTs fail while every replica is restarted in turn.
//!
//! Three proxy-server replicas (`server_id` r0..r2, `server_count: 3`, fixed agents ports) sit
//! behind one sni-router SNI route (`balance: least-connections`) on 127.0.0.1; one proxy-agent
//! knows only the router's listener (and the SNI) and keeps a session to every replica. Each
//! replica has a plain CONNECT front end for cluster `shoot-a`; the agent may dial the harness's
//! echo backend on 127.0.0.1.
//!
//! - Replica start → first agent session: a replica is SIGKILLed (rotating), and as soon as it
//!   has exited a new one is started on the same agents port; from the spawn, its admin endpoint
//!   is polled every 5 ms for `seedgate_agents_connected{cluster="shoot-a"}` ≥ 1 and for
//!   `/readyz` 200. The agent's reconnect back-off (`initial: 100ms, max: 1s`) is part of it.
//! - Rolling restart: a client offers CONNECTs at a steady rate, each through a replica whose
//!   `/readyz` answered 200 at its latest check (every 50 ms, a separate task), writes a few
//!   bytes and reads them back. The roller takes a replica out of the client's set (as an
//!   endpoints controller does), waits until no CONNECT is still opening through it, sends
//!   SIGTERM, waits for the exit, starts a new one on the same port and puts it back once it is
//!   ready; one replica after the other. Streams held open on the stopped replica must keep
//!   working during its drain and end with EOF (not a reset) at `drain_grace`.
//!
//! No anchor plays this role (konnectivity is not installed): the figures are seedgate's only,
//! reported, never asserted.

use super::{Ctx, record};
use crate::host::{self, lock};
use crate::load::{Echo, connect_head, read_connect_response};
use crate::report::{Better, Kind, Results};
use crate::systems::{self, Running};
use anyhow::{Context as _, bail, ensure};
use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use testbed::{Proc, http_get, metric_value};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::task::JoinSet;
use tokio::time::Instant;

pub(super) const SC: &str = "ha";
/// The remark of every scenario no anchor plays (ha, fleet).
pub(super) const SEEDGATE_ONLY: &str = "seedgate only: no anchor plays this role here (konnectivity, the upstream reverse \
     tunnel with several servers, is not installed), so `vs direct` and `seedgate ÷ this` stay empty; figures are \
     reported, never asserted";
/// The system's label (every row of the scenario).
const LABEL: &str = "proxy-server ×3 + proxy-agent";
const CLUSTER: &str = "shoot-a";
/// The agents listener's certificate name, the router's SNI route and the agent's server_name.
pub(super) const SNI: &str = "proxy.bench.local";
pub(super) const REPLICAS: usize = 3;
/// The agent's reconnect back-off and both ends' keepalive.
const RECONNECT: &str = "{ initial: 100ms, max: 1s }";
const KEEPALIVE: &str = "{ interval: 500ms, suspect_after: 2s, timeout: 2s }";
/// Replicas and agent log their session events (kept with `--keep`), not one line per stream.
const LOG: &str = "info,access=warn";
/// How often a new replica's admin endpoint is polled while its first session is timed.
const METRICS_POLL: Duration = Duration::from_millis(5);
/// How often the client's readiness checker asks every replica in service.
const READY_POLL: Duration = Duration::from_millis(50);
/// Longest wait for any one step (a session, readiness, an exit after the drain).
const STEP: Duration = Duration::from_secs(30);
/// One client CONNECT (connect, 200, echo) must be done within this.
pub(super) const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the client runs with every replica in service before and after the roll.
const CALM: Duration = Duration::from_secs(1);
const PAYLOAD: &[u8] = b"seedgate-ha-0123";

/// Files and addresses every replica and the agent are started with.
struct Setup {
    ctx_pin: host::Pinning,
    ca: PathBuf,
    server_bin: PathBuf,
    agent_bin: PathBuf,
    dir: PathBuf,
    ports: [SocketAddr; REPLICAS],
    configs: [PathBuf; REPLICAS],
    /// Replaced replicas' logs are copied here (`--keep` keeps them).
    saved: std::cell::Cell<usize>,
}

/// One running replica.
struct Replica {
    proc: Proc,
    frontend: SocketAddr,
    admin: SocketAddr,
    /// From spawning the process to its address file (it listens).
    listening: Duration,
    spawned: Instant,
}

impl Setup {
    fn new(ctx: &Ctx, gateway_ports: [SocketAddr; REPLICAS], drain_grace: Duration) -> anyhow::Result<Self> {
        let dir = ctx.dir.path().join("ha");
        host::dir_with_mode(&dir, 0o755)?;
        let ca = ctx.ca.write(&dir, "ca")?;
        let (sc, sk) = ctx.ca.server(&[SNI])?.write(&dir, "agents-listener")?;
        let mut configs: [PathBuf; REPLICAS] = Default::default();
        for (i, cfg) in configs.iter_mut().enumerate() {
            *cfg = dir.join(format!("replica{i}.yaml"));
            systems::write_atomic(
                cfg,
                &format!(
                    "admin: {{ listen: 127.0.0.1:0 }}\ndrain_grace: {}ms\nlimits: {{ max_connections: 19000 }}\n\
                     agents:\n  listen: {}\n  tls: {{ cert: {}, key: {}, client_ca: {} }}\n  keepalive: {KEEPALIVE}\n\
                     \x20 server_id: r{i}\n  server_count: {REPLICAS}\n\
                     frontends:\n  - name: egress\n    listen: 127.0.0.1:0\n    cluster: {CLUSTER}\n",
                    drain_grace.as_millis(),
                    gateway_ports[i],
                    sc.display(),
                    sk.display(),
                    ca.display()
                ),
            )?;
        }
        Ok(Self {
            ctx_pin: ctx.pin.clone(),
            ca,
            server_bin: ctx.bins.server.clone(),
            agent_bin: ctx.bins.agent.clone(),
            dir,
            ports: gateway_ports,
            configs,
            saved: std::cell::Cell::new(0),
        })
    }

    /// Start replica `i` on its agents port; returns once it wrote its address file.
    async fn start_replica(&self, i: usize) -> anyhow::Result<Replica> {
        let mut cmd = self.ctx_pin.command(&self.server_bin);
        cmd.env("RUST_LOG", LOG);
        let spawned = Instant::now();
        let (proc, a) = Proc::spawn_seedgate(cmd, &self.configs[i], &[])
            .await
            .with_context(|| format!("starting replica r{i} on {}", self.ports[i]))?;
        let listening = spawned.elapsed();
        Ok(Replica { frontend: a.listener("egress")?, admin: a.admin()?, proc, listening, spawned })
    }

    /// The agent: knows only the router's listener, verifies the SNI name, may dial 127.0.0.1.
    async fn start_agent(&self, ctx: &Ctx, gateway: SocketAddr) -> anyhow::Result<(Proc, SocketAddr)> {
        let (ac, ak) = ctx.ca.client(CLUSTER)?.write(&self.dir, "agent")?;
        let cfg = self.dir.join("proxy-agent.yaml");
        systems::write_atomic(
            &cfg,
            &format!(
                "admin: {{ listen: 127.0.0.1:0 }}\ndrain_grace: 1s\nlimits: {{ max_connections: 19000 }}\n\
                 tunnel:\n  servers: [{gateway}]\n  tls: {{ cert: {}, key: {}, ca: {}, server_name: {SNI} }}\n\
                 \x20 allow: [127.0.0.1/32]\n  keepalive: {KEEPALIVE}\n  reconnect: {RECONNECT}\n",
                ac.display(),
                ak.display(),
                self.ca.display()
            ),
        )?;
        let mut cmd = self.ctx_pin.command(&self.agent_bin);
        cmd.env("RUST_LOG", LOG);
        let (p, a) = Proc::spawn_seedgate(cmd, &cfg, &[]).await.context("starting proxy-agent")?;
        Ok((p, a.admin()?))
    }

    /// Copy a process's log next to the configs before its handle goes.
    fn save_log(&self, what: &str, p: &Proc) {
        let n = self.saved.get();
        self.saved.set(n + 1);
        let _ = std::fs::write(self.dir.join(format!("{n:03}-{what}.log")), p.log());
    }
}

pub(super) async fn metrics(admin: SocketAddr) -> anyhow::Result<String> {
    let (code, body) = http_get(admin, "/metrics").await?;
    ensure!(code == 200, "{admin}/metrics answered {code}");
    Ok(body)
}

pub(super) async fn ready(admin: SocketAddr) -> bool {
    matches!(tokio::time::timeout(Duration::from_secs(2), http_get(admin, "/readyz")).await, Ok(Ok((200, _))))
}

/// Agent sessions held and expected, and each replica's count of shoot-a agents.
async fn state(agent_admin: SocketAddr, replicas: &[Replica]) -> anyhow::Result<(f64, f64, Vec<f64>)> {
    let m = metrics(agent_admin).await?;
    let held = metric_value(&m, "seedgate_agent_server_sessions", &[]).unwrap_or(-1.0);
    let want = metric_value(&m, "seedgate_agent_server_sessions_expected", &[]).unwrap_or(-1.0);
    let mut per = Vec::with_capacity(replicas.len());
    for r in replicas {
        let m = metrics(r.admin).await?;
        per.push(metric_value(&m, "seedgate_agents_connected", &[("cluster", CLUSTER)]).unwrap_or(0.0));
    }
    Ok((held, want, per))
}

/// Wait until the agent holds a session to each of the three replicas and each replica counts
/// exactly one; returns how long that took.
async fn wait_steady(agent: &Proc, agent_admin: SocketAddr, replicas: &[Replica]) -> anyhow::Result<Duration> {
    let t = Instant::now();
    let mut last = String::new();
    // Bounded by STEP.
    while t.elapsed() < STEP {
        match state(agent_admin, replicas).await {
            Ok((held, want, per)) => {
                let n = REPLICAS as f64;
                if held == n && want == n && per.iter().all(|&c| c == 1.0) {
                    return Ok(t.elapsed());
                }
                last = format!("agent holds {held} of {want} sessions; replicas count {per:?} shoot-a agents");
            }
            Err(e) => last = format!("{e:#}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    bail!("not steady within {STEP:?}: {last}; agent log tail:\n{}", tail(&agent.log(), 20))
}

pub(super) fn tail(s: &str, n: usize) -> String {
    let v: Vec<&str> = s.lines().collect();
    v[v.len().saturating_sub(n)..].join("\n")
}

pub(super) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

pub(super) fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() { f64::NAN } else { s[(s.len() - 1) / 2] }
}

/// SIGKILL replica `i`, start a new one on its port at once; (start → listening, → first agent
/// session, → /readyz 200).
async fn kill_and_restart(
    setup: &Setup,
    replicas: &mut [Replica],
    i: usize,
) -> anyhow::Result<(Duration, anyhow::Result<Duration>, anyhow::Result<Duration>)> {
    replicas[i].proc.signal(libc::SIGKILL)?;
    replicas[i].proc.wait_exit(STEP).await.with_context(|| format!("r{i} did not die after SIGKILL"))?;
    setup.save_log(&format!("r{i}-killed"), &replicas[i].proc);
    replicas[i] = setup.start_replica(i).await?;
    let r = &replicas[i];
    let (mut session, mut ready_at) = (None, None);
    let mut last = String::new();
    // Bounded by STEP.
    while session.is_none() || ready_at.is_none() {
        if r.spawned.elapsed() > STEP {
            break;
        }
        // Both asked at once, so that which came first is not an artefact of the order.
        let (m, rz) = tokio::join!(metrics(r.admin), http_get(r.admin, "/readyz"));
        let now = r.spawned.elapsed();
        match m {
            Ok(m) => {
                let n = metric_value(&m, "seedgate_agents_connected", &[("cluster", CLUSTER)]).unwrap_or(0.0);
                if n >= 1.0 && session.is_none() {
                    session = Some(now);
                }
            }
            Err(e) => last = format!("{e:#}"),
        }
        if ready_at.is_none() && matches!(rz, Ok((200, _))) {
            ready_at = Some(now);
        }
        tokio::time::sleep(METRICS_POLL).await;
    }
    let missing = |what: &str| anyhow::anyhow!("r{i}: no {what} within {STEP:?} {last}");
    Ok((r.listening, session.ok_or_else(|| missing("agent session")), ready_at.ok_or_else(|| missing("ready"))))
}

// ---------------------------------------------------------------------------------------------
// The rolling restart

/// A replica as the client sees it: its front end and admin address while in service.
#[derive(Debug, Default, Clone)]
struct Endpoint {
    addrs: Option<(SocketAddr, SocketAddr)>,
    /// Bumped whenever `addrs` changes, so a late readiness answer for an old replica is dropped.
    generation: u64,
    ready: bool,
}

/// What the client counted.
#[derive(Debug, Default, Clone)]
struct Tally {
    dials: u64,
    failed: u64,
    /// Ticks at which no replica was in service and ready (no dial made).
    no_ready: u64,
    reasons: BTreeMap<String, u64>,
    failed_by_replica: [u64; REPLICAS],
}

struct Shared {
    endpoints: Mutex<Vec<Endpoint>>,
    /// CONNECTs through each replica that have not had their answer yet.
    opening: [AtomicUsize; REPLICAS],
    stop: AtomicBool,
    tally: Mutex<Tally>,
}

/// Decrements a replica's count of opening CONNECTs when dropped.
struct Opening<'a>(&'a AtomicUsize);

impl Drop for Opening<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One step of a dial, bounded by the dial's deadline; the error names the step.
async fn step<T, E: std::fmt::Display>(
    deadline: Instant,
    what: &str,
    f: impl Future<Output = Result<T, E>>,
) -> Result<T, String> {
    match tokio::time::timeout_at(deadline, f).await {
        Err(_) => Err(format!("{what}: timed out ({DIAL_TIMEOUT:?} for the whole dial)")),
        Ok(Err(e)) => Err(format!("{what}: {e}")),
        Ok(Ok(v)) => Ok(v),
    }
}

/// `head` (a CONNECT) through `frontend`, up to its 200 answer.
pub(super) async fn open_stream(frontend: SocketAddr, head: &[u8], deadline: Instant) -> Result<TcpStream, String> {
    let mut s = step(deadline, "connect to the front end", TcpStream::connect(frontend)).await?;
    let _ = s.set_nodelay(true);
    step(deadline, "sending CONNECT", s.write_all(head)).await?;
    step(deadline, "CONNECT answer", read_connect_response(&mut s)).await?;
    Ok(s)
}

/// Write `what`, read it back.
pub(super) async fn echo(s: &mut TcpStream, what: &[u8], deadline: Instant) -> Result<(), String> {
    step(deadline, "writing through the tunnel", s.write_all(what)).await?;
    let mut back = vec![0u8; what.len()];
    step(deadline, "reading the echo", s.read_exact(&mut back)).await?;
    if back != what {
        return Err("echo mismatch".into());
    }
    Ok(())
}

/// One client dial through replica `j`: CONNECT, a few bytes echoed, close.
async fn dial(sh: Arc<Shared>, j: usize, frontend: SocketAddr, head: Arc<[u8]>) {
    let deadline = Instant::now() + DIAL_TIMEOUT;
    let r = async {
        let guard = Opening(&sh.opening[j]);
        let mut s = open_stream(frontend, &head, deadline).await?;
        drop(guard);
        echo(&mut s, PAYLOAD, deadline).await
    }
    .await;
    let mut t = lock(&sh.tally);
    t.dials += 1;
    if let Err(e) = r {
        t.failed += 1;
        t.failed_by_replica[j] += 1;
        // Numbers that differ per connection (ports) would split one reason into many.
        let e: String = e.chars().take(160).collect();
        *t.reasons.entry(e).or_default() += 1;
    }
}

/// Start `next(k)` (k counting the ticks) `rate` times per second until `stop`, open loop; waits
/// for the ones started before returning.
pub(super) async fn at_rate<F>(stop: &AtomicBool, rate: f64, mut next: impl FnMut(usize) -> Option<F>)
where
    F: Future<Output = ()> + Send + 'static,
{
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut started = JoinSet::new();
    let mut k = 0usize;
    // Until stopped.
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        if let Some(f) = next(k) {
            started.spawn(f);
        }
        k = k.wrapping_add(1);
        while started.try_join_next().is_some() {}
    }
    while started.join_next().await.is_some() {}
}

/// Offer CONNECTs at `rate` per second until told to stop (the roller always stops it), each
/// through the next replica that is in service and ready.
async fn client(sh: Arc<Shared>, rate: f64, head: Arc<[u8]>) {
    at_rate(&sh.stop, rate, |turn| {
        let pick = {
            let eps = lock(&sh.endpoints);
            let n = eps.len();
            (0..n).map(|k| (turn + k) % n).find(|&j| eps[j].ready && eps[j].addrs.is_some()).map(|j| {
                // Counted while the set is locked: once the roller took j out, no new CONNECT
                // through j starts, and the count says when the last one got its answer.
                sh.opening[j].fetch_add(1, Ordering::Relaxed);
                (j, eps[j].addrs.map(|(fe, _)| fe).unwrap_or(SocketAddr::from(([127, 0, 0, 1], 0))))
            })
        };
        match pick {
            Some((j, fe)) => Some(dial(sh.clone(), j, fe, head.clone())),
            None => {
                lock(&sh.tally).no_ready += 1;
                None
            }
        }
    })
    .await
}

/// Ask every replica in service for `/readyz` every [`READY_POLL`] until told to stop.
async fn readiness(sh: Arc<Shared>) {
    // Until stopped.
    while !sh.stop.load(Ordering::Relaxed) {
        let snapshot: Vec<(usize, SocketAddr, u64)> = lock(&sh.endpoints)
            .iter()
            .enumerate()
            .filter_map(|(i, e)| e.addrs.map(|(_, admin)| (i, admin, e.generation)))
            .collect();
        for (i, admin, generation) in snapshot {
            let ok = ready(admin).await;
            let mut eps = lock(&sh.endpoints);
            if eps[i].generation == generation {
                eps[i].ready = ok;
            }
        }
        tokio::time::sleep(READY_POLL).await;
    }
}

/// How a stream held open on a stopped replica ended.
#[derive(Debug, Clone, PartialEq)]
enum LiveEnd {
    Eof,
    Reset,
    Other(String),
    StillOpen,
}

/// One stream held open across its replica's SIGTERM: whether an echo still worked during the
/// drain, how it ended and when (after the SIGTERM).
async fn watch_live(mut s: TcpStream, term: Instant, limit: Duration) -> (bool, LiveEnd, Duration) {
    let during = echo(&mut s, b"during the drain", Instant::now() + DIAL_TIMEOUT).await.is_ok();
    let mut buf = [0u8; 1024];
    let end = tokio::time::timeout(limit, async {
        // Ends at EOF or an error; bounded by the timeout.
        loop {
            match s.read(&mut buf).await {
                Ok(0) => return LiveEnd::Eof,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return LiveEnd::Reset,
                Err(e) => return LiveEnd::Other(e.to_string()),
            }
        }
    })
    .await
    .unwrap_or(LiveEnd::StillOpen);
    (during, end, term.elapsed())
}

/// What one rolling restart measured.
#[derive(Debug, Default)]
struct Roll {
    tally: Tally,
    live: usize,
    live_during_ok: usize,
    live_eof: usize,
    live_other: Vec<String>,
    live_end_ms: Vec<f64>,
    exit_ms: Vec<f64>,
    ready_ms: Vec<f64>,
    /// Exit statuses other than success.
    exits: Vec<String>,
    seconds: f64,
}

/// Restart the three replicas one after the other under a steady CONNECT load.
async fn rolling_restart(
    ctx: &Ctx,
    setup: &Setup,
    replicas: &mut [Replica],
    agent: &Proc,
    agent_admin: SocketAddr,
    echo_addr: SocketAddr,
) -> anyhow::Result<Roll> {
    let s = &ctx.scale;
    let head: Arc<[u8]> = connect_head(&echo_addr.to_string(), "").into();
    let sh = Arc::new(Shared {
        endpoints: Mutex::new(
            replicas
                .iter()
                .map(|r| Endpoint { addrs: Some((r.frontend, r.admin)), generation: 0, ready: true })
                .collect(),
        ),
        opening: Default::default(),
        stop: AtomicBool::new(false),
        tally: Mutex::new(Tally::default()),
    });
    let checker = tokio::spawn(readiness(sh.clone()));
    let load = tokio::spawn(client(sh.clone(), s.ha_rate, head.clone()));
    let t0 = Instant::now();
    let mut roll = Roll::default();
    let r: anyhow::Result<()> = async {
        tokio::time::sleep(CALM).await;
        for i in 0..REPLICAS {
            // Streams open on replica i when it is told to stop (exec sessions, watches).
            let mut live = Vec::new();
            for _ in 0..s.ha_live_streams {
                let deadline = Instant::now() + DIAL_TIMEOUT;
                let mut st = open_stream(replicas[i].frontend, &head, deadline)
                    .await
                    .map_err(|e| anyhow::anyhow!("a long stream through r{i}: {e}"))?;
                echo(&mut st, b"before", deadline).await.map_err(|e| anyhow::anyhow!("a long stream: {e}"))?;
                live.push(st);
            }
            // Out of the client's set; then wait until no CONNECT through it awaits its answer.
            {
                let mut eps = lock(&sh.endpoints);
                eps[i] = Endpoint { addrs: None, generation: eps[i].generation + 1, ready: false };
            }
            let t = Instant::now();
            // Bounded by the dial timeout.
            while sh.opening[i].load(Ordering::Relaxed) > 0 && t.elapsed() < DIAL_TIMEOUT {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let quiet = t.elapsed();
            let term = Instant::now();
            replicas[i].proc.signal(libc::SIGTERM)?;
            let limit = s.ha_drain_grace + STEP;
            let mut watchers = JoinSet::new();
            for st in live {
                watchers.spawn(watch_live(st, term, limit));
            }
            let status = replicas[i]
                .proc
                .wait_exit(limit)
                .await
                .with_context(|| format!("r{i} did not exit within {limit:?} of SIGTERM"))?;
            roll.exit_ms.push(ms(term.elapsed()));
            if !status.success() {
                roll.exits.push(format!("r{i}: {status}"));
            }
            while let Some(w) = watchers.join_next().await {
                let (during, end, after) = w?;
                roll.live += 1;
                roll.live_during_ok += usize::from(during);
                match end {
                    LiveEnd::Eof => roll.live_eof += 1,
                    other => roll.live_other.push(format!("{other:?}")),
                }
                roll.live_end_ms.push(ms(after));
            }
            setup.save_log(&format!("r{i}-terminated"), &replicas[i].proc);
            replicas[i] = setup.start_replica(i).await?;
            let r = &replicas[i];
            // Bounded by STEP.
            while !ready(r.admin).await {
                ensure!(r.spawned.elapsed() < STEP, "the new r{i} was not ready within {STEP:?}");
                tokio::time::sleep(METRICS_POLL).await;
            }
            roll.ready_ms.push(ms(r.spawned.elapsed()));
            eprintln!(
                "  ha:   r{i}: {:.0} ms until no CONNECT through it awaited its answer; exited {:.0} ms after SIGTERM; \
                 the new one ready {:.0} ms after its start",
                ms(quiet),
                roll.exit_ms.last().copied().unwrap_or(f64::NAN),
                ms(r.spawned.elapsed())
            );
            let mut eps = lock(&sh.endpoints);
            eps[i] = Endpoint { addrs: Some((r.frontend, r.admin)), generation: eps[i].generation + 1, ready: true };
        }
        let steady = wait_steady(agent, agent_admin, replicas).await?;
        eprintln!("  ha:   the agent held a session to each replica again {:.0} ms later", ms(steady));
        tokio::time::sleep(CALM).await;
        Ok(())
    }
    .await;
    sh.stop.store(true, Ordering::Relaxed);
    let _ = load.await;
    let _ = checker.await;
    roll.seconds = t0.elapsed().as_secs_f64();
    roll.tally = lock(&sh.tally).clone();
    r.map(|()| roll)
}

// ---------------------------------------------------------------------------------------------

pub(super) async fn run(ctx: &Ctx, res: &mut Results) -> anyhow::Result<()> {
    let s = &ctx.scale;
    let m_listen = res.metric(SC, "replica start → listening (address file written)", "ms", Better::Lower);
    let m_session = res.metric(SC, "replica start → first agent session (after a SIGKILL)", "ms", Better::Lower);
    let m_ready = res.metric(SC, "replica start → /readyz 200 (after a SIGKILL)", "ms", Better::Lower);
    let m_dials = res.metric(SC, "rolling restart: dials", "dials", Better::Higher);
    let m_failed = res.metric(SC, "rolling restart: failed dials", "dials", Better::Lower);
    let m_rate = res.metric(SC, "rolling restart: dial success rate", "%", Better::Higher);
    let per_roll = s.ha_live_streams * REPLICAS;
    let m_live = res.metric(
        SC,
        &format!("rolling restart: of {per_roll} streams open on stopped replicas, ended with EOF"),
        "streams",
        Better::Higher,
    );
    let m_live_end = res.metric(SC, "rolling restart: SIGTERM → open stream ended (every stream)", "ms", Better::Lower);
    let m_exit = res.metric(SC, "rolling restart: SIGTERM → replica exited (every replica)", "ms", Better::Lower);
    let m_rready = res.metric(SC, "rolling restart: replica start → /readyz 200 (every replica)", "ms", Better::Lower);
    let all = [m_listen, m_session, m_ready, m_dials, m_failed, m_rate, m_live, m_live_end, m_exit, m_rready];
    if let Err(e) = systems::check_only(LABEL) {
        for m in all {
            res.skip(m, LABEL, Kind::Seedgate, &format!("{e:#}"));
        }
        return Ok(());
    }
    eprintln!("  ha: seedgate only — no anchor plays this role here (konnectivity is not installed)");
    let grace = s.ha_drain_grace;
    res.remark(SC, SEEDGATE_ONLY);
    res.remark(
        SC,
        &format!(
            "on 127.0.0.1: {REPLICAS} proxy-server replicas (server_id r0..r2, server_count {REPLICAS}, fixed agents ports, \
             drain_grace {} ms, agents keepalive {KEEPALIVE}, a plain CONNECT front end each for cluster {CLUSTER}) behind one \
             sni-router SNI route ({SNI}, balance: least-connections); one proxy-agent with tunnel.servers = the router's \
             listener, tls server_name {SNI}, **reconnect {RECONNECT}**, keepalive {KEEPALIVE}, allow [127.0.0.1/32]; an echo \
             backend on 127.0.0.1; every seedgate process on the proxy CPU, the harness on the other",
            grace.as_millis()
        ),
    );

    let ports = [host::free_port([127, 0, 0, 1])?, host::free_port([127, 0, 0, 1])?, host::free_port([127, 0, 0, 1])?];
    let listeners = format!(
        "  - name: gateway\n    listen: 127.0.0.1:0\n    routes:\n      - name: replicas\n        sni: [{SNI}]\n        \
         upstreams: [{}]\n        balance: least-connections\n",
        ports.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
    );
    let env = ctx.env();
    let mut router: Running = systems::sni_router_top(
        &env,
        &format!("{LABEL} gateway"),
        "timeouts: { handshake: 5s, connect: 5s, idle: 1h }\nlimits: { max_connections: 19000 }\n",
        &listeners,
    )
    .await?;
    let gateway = router.addr("gateway")?;
    let setup = Setup::new(ctx, ports, grace)?;
    let echo_backend = Echo::start().await?;
    let mut replicas = Vec::with_capacity(REPLICAS);
    for i in 0..REPLICAS {
        replicas.push(setup.start_replica(i).await?);
    }
    let (agent, agent_admin) = setup.start_agent(ctx, gateway).await?;
    let first = wait_steady(&agent, agent_admin, &replicas).await?;
    eprintln!(
        "  ha: the agent holds a session to each of the {REPLICAS} replicas {:.0} ms after it started",
        ms(first)
    );

    // A: replica start → first agent session, after a SIGKILL of the one it replaces.
    let mut a = (Vec::new(), Vec::new(), Vec::new());
    for k in 0..s.ha_kills {
        let i = k % REPLICAS;
        wait_steady(&agent, agent_admin, &replicas).await?;
        let (listening, session, ready_at) = kill_and_restart(&setup, &mut replicas, i).await?;
        eprintln!(
            "  ha: kill {}/{} (r{i}): listening {:.1} ms, first agent session {}, ready {}",
            k + 1,
            s.ha_kills,
            ms(listening),
            session.as_ref().map_or_else(|e| format!("error: {e:#}"), |d| format!("{:.1} ms", ms(*d))),
            ready_at.as_ref().map_or_else(|e| format!("error: {e:#}"), |d| format!("{:.1} ms", ms(*d))),
        );
        a.0.push(ms(listening));
        if let Ok(d) = &session {
            a.1.push(ms(*d));
        }
        if let Ok(d) = &ready_at {
            a.2.push(ms(*d));
        }
        record(res, m_listen, LABEL, Kind::Seedgate, Ok(ms(listening)));
        record(res, m_session, LABEL, Kind::Seedgate, session.map(ms));
        record(res, m_ready, LABEL, Kind::Seedgate, ready_at.map(ms));
    }
    let max = |v: &[f64]| v.iter().copied().fold(f64::NAN, f64::max);
    res.remark(
        SC,
        &format!(
            "replica start → first agent session: {} times a replica (r0, r1, r2, r0, ...) got SIGKILL and, once it had exited, a \
             new one was started at once on the same agents port; timed from spawning the process to its address file, to \
             `seedgate_agents_connected{{cluster=\"{CLUSTER}\"}}` ≥ 1 and to /readyz 200 (admin polled every {} ms): session \
             median {:.0} ms, max {:.0} ms; ready median {:.0} ms, max {:.0} ms. The agent's back-off (reconnect {RECONNECT}) \
             is part of it: the agent lost its session to the killed replica and retries at growing intervals",
            s.ha_kills,
            METRICS_POLL.as_millis(),
            median(&a.1),
            max(&a.1),
            median(&a.2),
            max(&a.2),
        ),
    );

    // B: rolling restarts under a steady CONNECT load.
    let mut total = Tally::default();
    let (mut live, mut live_eof, mut live_during, mut live_other) = (0, 0, 0, Vec::new());
    let mut exits = Vec::new();
    let mut ready_text = Vec::new();
    for k in 0..s.ha_rolls {
        wait_steady(&agent, agent_admin, &replicas).await?;
        let roll = match rolling_restart(ctx, &setup, &mut replicas, &agent, agent_admin, echo_backend.addr()).await {
            Ok(r) => r,
            Err(e) => {
                let e = e.context(format!("agent log tail:\n{}", tail(&agent.log(), 30)));
                for m in [m_dials, m_failed, m_rate, m_live, m_live_end, m_exit, m_rready] {
                    record(res, m, LABEL, Kind::Seedgate, Err(anyhow::anyhow!("{e:#}")));
                }
                setup.save_log("agent", &agent);
                return Err(e);
            }
        };
        let t = &roll.tally;
        eprintln!(
            "  ha: roll {}/{}: {:.1} s, {} dials, {} failed, {} ticks with no ready replica; {} of {} open streams ended with EOF \
             ({} echoed during the drain); failures: {:?}",
            k + 1,
            s.ha_rolls,
            roll.seconds,
            t.dials,
            t.failed,
            t.no_ready,
            roll.live_eof,
            roll.live,
            roll.live_during_ok,
            t.reasons
        );
        let rate = if t.dials == 0 { f64::NAN } else { 100.0 * (t.dials - t.failed) as f64 / t.dials as f64 };
        record(res, m_dials, LABEL, Kind::Seedgate, Ok(t.dials as f64));
        record(res, m_failed, LABEL, Kind::Seedgate, Ok(t.failed as f64));
        record(res, m_rate, LABEL, Kind::Seedgate, Ok(rate));
        record(res, m_live, LABEL, Kind::Seedgate, Ok(roll.live_eof as f64));
        for (m, v) in [(m_live_end, &roll.live_end_ms), (m_exit, &roll.exit_ms), (m_rready, &roll.ready_ms)] {
            for &x in v {
                res.add(m, LABEL, Kind::Seedgate, x);
            }
        }
        ready_text
            .push(roll.ready_ms.iter().enumerate().map(|(i, x)| format!("r{i} {x:.0}")).collect::<Vec<_>>().join(", "));
        total.dials += t.dials;
        total.failed += t.failed;
        total.no_ready += t.no_ready;
        for (r, n) in &t.reasons {
            *total.reasons.entry(r.clone()).or_default() += n;
        }
        for (sum, n) in total.failed_by_replica.iter_mut().zip(t.failed_by_replica) {
            *sum += n;
        }
        live += roll.live;
        live_eof += roll.live_eof;
        live_during += roll.live_during_ok;
        live_other.extend(roll.live_other);
        exits.extend(roll.exits);
    }
    let reasons = if total.reasons.is_empty() {
        "none".to_owned()
    } else {
        total.reasons.iter().map(|(r, n)| format!("{n} × {r}")).collect::<Vec<_>>().join("; ")
    };
    res.remark(
        SC,
        &format!(
            "rolling restart ({} time(s)): a client offers {} CONNECTs/s (open loop) to the echo backend, each through the next \
             replica whose /readyz answered 200 at its latest check (every {} ms, a separate task), writes {} bytes and reads \
             them back; the roller takes a replica out of the client's set, waits until no CONNECT through it awaits its \
             answer, sends SIGTERM, waits for the exit, starts a new one on the same port and puts it back once /readyz is \
             200; r0, r1, r2 in turn, with {} s of calm before and after; sni-router keeps its default upstream_eject (10 s; \
             an upstream that refused a connect, as a stopped replica's port does, is tried last for at most 1 s, \
             which bounds how long the first replica of each roll waits for its agents). Replica start → /readyz 200 in ms, per roll: \
             {}. In all: {} dials, {} failed ({:.3}% succeeded; \
             failed by replica {:?}), {} ticks found no ready replica; failure reasons: {reasons}",
            s.ha_rolls,
            s.ha_rate,
            READY_POLL.as_millis(),
            PAYLOAD.len(),
            CALM.as_secs(),
            ready_text.join("; "),
            total.dials,
            total.failed,
            if total.dials == 0 { f64::NAN } else { 100.0 * (total.dials - total.failed) as f64 / total.dials as f64 },
            total.failed_by_replica,
            total.no_ready,
        ),
    );
    res.remark(
        SC,
        &format!(
            "streams open on a stopped replica: {} per replica ({live} in all) opened through it (CONNECT, echo) before its \
             SIGTERM; {live_during} still echoed during the drain, {live_eof} ended with EOF at drain_grace ({} ms){}{}",
            s.ha_live_streams,
            grace.as_millis(),
            if live_other.is_empty() { String::new() } else { format!("; otherwise: {live_other:?}") },
            if exits.is_empty() { String::new() } else { format!("; unclean exits: {exits:?}") },
        ),
    );
    router.check_alive()?;
    setup.save_log("agent", &agent);
    for (i, r) in replicas.iter().enumerate() {
        setup.save_log(&format!("r{i}-last"), &r.proc);
    }
    drop(echo_backend);
    Ok(())
}
