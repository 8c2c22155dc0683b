//! The side-by-side benchmark: options, the run context, the scenario list, and the runner
//! that prints the Markdown table and writes the JSON file and the SVG chart.
//!
//! Every scenario runs the same load in the same run against direct (no proxy), seedgate and
//! each anchor that can play the role; repeats are interleaved (repeat 1 of every system, then
//! repeat 2, ...) so that drift in the machine's state spreads over all systems alike.

mod connect;
mod faults;
mod fleet;
mod ha;
mod identity;
mod idle_memory;
mod leak;
mod migration;
mod noisy_neighbour;
mod proxy_protocol;
mod reload;
mod scaling;
mod slowloris;
mod sni_bulk;
mod sni_connrate;
mod soak;
mod tunnel;
mod wan;

pub(crate) use faults::SC as FAULTS;
pub(crate) use wan::{ONE_STREAM as WAN_ONE_STREAM, Profile as WanProfile};

use crate::host::{self, Machine, Pinning};
use crate::load::RateResult;
use crate::report::{self, Kind, MetricId, Results, Target, Targets, Verdict};
use crate::systems::{Anchors, Bins, Env, Running, Slot};
use anyhow::Context as _;
use rustls::ClientConfig;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};
use testbed::{Ca, TempDir};

/// Options shared by every scenario subcommand (also accepted before the subcommand).
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Opts {
    /// Run every scenario briefly (short windows, one repeat, fewer connections) to prove the
    /// harness works; figures are reported, never asserted (a seedgate row that errors still
    /// fails the run, as it does in a full run).
    #[arg(long, global = true)]
    pub smoke: bool,
    /// Run the debug build of the binaries (`<target>/debug`, built first when stale) instead of
    /// the release build: quick to build, slow to run. For proving that every scenario works
    /// (CI's smoke run); its figures say nothing about seedgate's speed.
    #[arg(long, global = true)]
    pub debug: bool,
    /// Repeats of each measurement (default 5; 1 with --smoke).
    #[arg(long, global = true)]
    pub repeats: Option<usize>,
    /// Measuring window of one throughput or rate measurement, in seconds (default 3; 0.25 with
    /// --smoke). A warm-up of a quarter of it (at least 0.1 s) comes first.
    #[arg(long, global = true)]
    pub window: Option<f64>,
    /// Where to write the results as JSON (default bench/results/latest.json, or
    /// bench/results/smoke.json with --smoke).
    #[arg(long, global = true)]
    pub json: Option<PathBuf>,
    /// Where to write the chart (default: beside --json when that is given, with the extension
    /// .svg; else bench/results/latest.svg, or smoke.svg with --smoke).
    #[arg(long, global = true)]
    pub svg: Option<PathBuf>,
    /// Merge into the JSON file: keep its results for the scenarios not run now, so that a full
    /// table can be assembled from scenarios run one at a time (each keeps its date and machine
    /// load); the Markdown and the chart show the merged results.
    #[arg(long, global = true)]
    pub merge: bool,
    /// Do not pin processes to CPUs.
    #[arg(long, global = true)]
    pub no_pin: bool,
    /// `GLIBC_TUNABLES` for every system under test, seedgate and anchors alike. The default is
    /// what the seedgate image sets (glibc's vector copy loop below 1 MiB instead of `rep movsb`,
    /// which has a cliff on AMD Zen); an empty value leaves the variable unset.
    #[arg(long, global = true, default_value = proxy_core::app::memcpy::TUNABLE)]
    pub glibc_tunables: String,
    /// Start only the systems whose label contains this text (direct always runs): for
    /// profiling one system (see BENCH_PERF_DIR in bench/README.md).
    #[arg(long, global = true)]
    pub only: Option<String>,
    /// Start no anchor, only seedgate's systems (and direct): for checking that every seedgate
    /// row works (CI's smoke run); the anchors' rows say they were left out.
    #[arg(long, global = true)]
    pub seedgate_only: bool,
    /// Keep the directory with every config and process log, and print its path.
    #[arg(long, global = true)]
    pub keep: bool,
    /// Connections the leak scenario pushes through (default 100,000; 2,000 with --smoke).
    #[arg(long, global = true)]
    pub leak_connections: Option<u64>,
    /// Minutes of the soak scenario (default 10; 0.2 with --smoke). With `all`, giving it adds
    /// the soak scenario to the run.
    #[arg(long, global = true)]
    pub soak_minutes: Option<f64>,
    /// Connections/s the soak scenario offers (default 200).
    #[arg(long, global = true)]
    pub soak_rate: Option<f64>,
    /// Agents of the fleet scenario (default 1,000; 12 with --smoke).
    #[arg(long, global = true)]
    pub agents: Option<usize>,
    /// CPUs of the system under test in the scaling scenario, e.g. `1,2,4,8` (default: 1, 2,
    /// 4, … while the load keeps as many CPUs).
    #[arg(long, global = true, value_delimiter = ',')]
    pub scaling_cpus: Option<Vec<usize>>,
    /// wan: the higher of the two link rates, in Mbit/s (default: the highest rate the link
    /// emulator was shown to carry faithfully on a 2-CPU machine; check it with `--only direct`).
    #[arg(long, global = true)]
    pub wan_rate: Option<f64>,
    /// wan: run only the profiles whose name contains this text (e.g. "150 ms" or "loss").
    #[arg(long, global = true)]
    pub wan_profile: Option<String>,
    /// faults: run only the faults whose name contains this text (e.g. "black hole" or "flapping").
    #[arg(long, global = true)]
    pub fault: Option<String>,
    /// Fetch every seedgate process's status page (`/` and `/status`) every second while it
    /// runs, as an operator's open browser tab does: run a scenario with and without it to see
    /// that the page costs the data path nothing. The count of pages fetched goes to stderr.
    #[arg(long, global = true)]
    pub status_poll: bool,
}

/// One scenario: its subcommand and help, whether `all` runs it, and what the runner calls. The
/// CLI's subcommands, `all`, the runner and the order of merged results all come from
/// [`SCENARIOS`]; nothing else names a scenario.
pub(crate) struct Scenario {
    /// The subcommand, and the scenario's name in the results.
    pub name: &'static str,
    /// The subcommand's help.
    pub about: &'static str,
    /// Whether `all` runs it under these options.
    in_all: fn(&Opts) -> bool,
    /// Measure, recording every figure into the results.
    run: Run,
    /// Repeats of each measurement, as the run's record gives them.
    repeats: fn(&Scale) -> usize,
    /// Its targets, on the figures it recorded (see [`report::Targets`]).
    targets: fn(&mut Targets<'_>),
}

impl std::fmt::Debug for Scenario {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

type Run = for<'a> fn(&'a Ctx, &'a mut Results) -> Pin<Box<dyn Future<Output = anyhow::Result<()>> + 'a>>;

/// A scenario module's `run`, as a [`Run`].
macro_rules! run {
    ($m:ident) => {
        |ctx, res| Box::pin($m::run(ctx, res))
    };
}

fn always(_: &Opts) -> bool {
    true
}

fn repeats(s: &Scale) -> usize {
    s.repeats
}

/// Leak and soak run once, with no measuring window of their own.
fn once(_: &Scale) -> usize {
    1
}

fn no_targets(_: &mut Targets<'_>) {}

/// The scenarios, in the order `all` runs them.
pub(crate) static SCENARIOS: &[Scenario] = &[
    Scenario {
        name: sni_bulk::SC,
        about: "A real ClientHello with SNI, then bulk bytes to a sink, 1 and 64 streams (Gbit/s): \
                direct, sni-router, haproxy (with and without splice-auto), nginx ssl_preread",
        in_all: always,
        run: run!(sni_bulk),
        repeats,
        targets: sni_bulk::targets,
    },
    Scenario {
        name: sni_connrate::SC,
        about: "New connections/s with full TLS handshakes through SNI routing, and time to first \
                response byte (p50/p99/p99.9) at saturation and at a fixed offered rate",
        in_all: always,
        run: run!(sni_connrate),
        repeats,
        targets: sni_connrate::targets,
    },
    Scenario {
        name: proxy_protocol::SC,
        about: "Connections/s through a PROXY-v2 listener routing by destination, with the header sent \
                by the harness and by real senders (proxy-agent, haproxy send-proxy-v2)",
        in_all: always,
        run: run!(proxy_protocol),
        repeats,
        targets: proxy_protocol::targets,
    },
    Scenario {
        name: connect::SC,
        about: "HTTP CONNECT open rate and open latency, and bulk through one CONNECT tunnel: \
                sni-router vs squid, tinyproxy and nginx+njs",
        in_all: always,
        run: run!(connect),
        repeats,
        targets: no_targets,
    },
    Scenario {
        name: tunnel::SC,
        about: "The reverse tunnel (proxy-server + proxy-agent, h2 and quic transports side by side) vs \
                rathole and ssh -R: bulk, CPU per GB, new connections/s, CONNECT through a tunnel (vs \
                squid behind rathole), 1k/10k concurrent streams, head-of-line blocking",
        in_all: always,
        run: run!(tunnel),
        repeats,
        targets: tunnel::targets,
    },
    Scenario {
        name: idle_memory::SC,
        about: "RSS per established idle proxied connection, for every system",
        in_all: always,
        run: run!(idle_memory),
        repeats,
        targets: idle_memory::targets,
    },
    Scenario {
        name: reload::SC,
        about: "With 10,000 routes loaded: time from a config change to the new route serving, and \
                connections reset by the reload (sni-router vs haproxy -sf and nginx reload)",
        in_all: always,
        run: run!(reload),
        repeats,
        targets: reload::targets,
    },
    Scenario {
        name: slowloris::SC,
        about: "With thousands of clients that sent three bytes of a TLS record and stalled: time for a \
                real client to be served through SNI routing, with the same cap of 1,000 client \
                connections: sni-router, haproxy (maxconn) and nginx ssl_preread (worker_connections)",
        in_all: always,
        run: run!(slowloris),
        repeats,
        targets: no_targets,
    },
    Scenario {
        name: noisy_neighbour::SC,
        about: "Shoot B's time to first byte through SNI routing (p50/p99), quiet and while shoot A's \
                clients hold the gateway at its connection limit: sni-router (default route share), \
                haproxy (per-backend server maxconn + queue) and nginx ssl_preread, each capped at 1,000",
        in_all: always,
        run: run!(noisy_neighbour),
        repeats,
        targets: noisy_neighbour::targets,
    },
    Scenario {
        name: leak::SC,
        about: "N connections (--leak-connections, default 100,000) of every kind — complete, client \
                reset, stalled until the handshake deadline, refused dial — through every path (SNI, \
                PROXY v2, CONNECT, tunnel CONNECT, forward proxy): open fds, tokio tasks and RSS of each \
                seedgate process before and after",
        in_all: always,
        run: run!(leak),
        repeats: once,
        targets: no_targets,
    },
    Scenario {
        name: ha::SC,
        about: "proxy-server replicas behind one sni-router route and one proxy-agent: time from a \
                replica's start to the agent's first session (after a SIGKILL), and the CONNECT success \
                rate while every replica is restarted in turn (seedgate only)",
        in_all: always,
        run: run!(ha),
        repeats,
        targets: no_targets,
    },
    Scenario {
        name: migration::SC,
        about: "A shoot's control plane moved between two seeds of three proxy-server replicas each \
                (network namespaces, root; etcd): failed requests during the move, time until every h2 \
                and QUIC agent is on the new seed, and a live etcd watch's gap (seedgate only)",
        in_all: always,
        run: run!(migration),
        repeats,
        targets: no_targets,
    },
    Scenario {
        name: fleet::SC,
        about: "N agents (--agents, default 1,000) of ten clusters through one sni-router to three \
                proxy-server replicas, over h2 and over QUIC: memory per session, time for the fleet to \
                connect, and the reconnect storm after a replica's SIGKILL (seedgate only)",
        in_all: always,
        run: run!(fleet),
        repeats: |s| s.fleet_kills,
        targets: no_targets,
    },
    Scenario {
        name: identity::SC,
        about: "An agent session's set-up time by how the agent proves its cluster: a client \
                certificate, a ServiceAccount token reviewed at a stand-in kube-apiserver, the same token \
                with its review cached (seedgate only)",
        in_all: always,
        run: run!(identity),
        repeats,
        targets: no_targets,
    },
    Scenario {
        name: scaling::SC,
        about: "The gateway and the tunnel given N = 1, 2, 4, … CPUs (--scaling-cpus), beside haproxy \
                (nbthread N) and nginx (worker_processes N), with load from one process per other CPU: \
                full-TLS connections/s, SNI bulk, PROXY-v2 connections/s, CONNECT opens/s, tunnel CONNECT \
                opens/s and bulk; scaling efficiency and what /proc shows of each window",
        in_all: always,
        run: run!(scaling),
        repeats,
        targets: scaling::targets,
    },
    Scenario {
        name: wan::SC,
        about: "The reverse tunnel across an emulated WAN link (two network namespaces, a user-space \
                link with delay, rate limit, bottleneck queue and loss): one stream up and down, 16 and 64 \
                streams down, a 1-byte round trip behind a bulk stream, memory: direct TCP (BBR, Cubic), \
                seedgate h2 and QUIC, rathole, ssh -R; 50/150/300 ms at two rates, 50 ms with loss",
        in_all: always,
        run: run!(wan),
        repeats: |s| s.wan_repeats,
        targets: wan::targets,
    },
    Scenario {
        name: faults::SC,
        about: "The reverse tunnel through faults on an emulated 50 ms path (black holes of 5 to 30 s, one \
                direction silent, a flapping link, two replicas with one of two paths black): whether an open \
                stream survives, what came of the dials meanwhile, the first good dial after the heal; h2 and \
                QUIC, direct TCP's open stream beside them (about 7 minutes)",
        in_all: always,
        run: run!(faults),
        repeats: once,
        targets: faults::targets,
    },
    Scenario {
        name: soak::SC,
        about: "Minutes (--soak-minutes, default 10) of the leak scenario's mix at a fixed rate: RSS, fds \
                and tasks of each process sampled every second, start, end and slope per minute \
                (with `all` only when --soak-minutes is given)",
        in_all: |o| o.soak_minutes.is_some(),
        run: run!(soak),
        repeats: once,
        targets: no_targets,
    },
];

impl Scenario {
    /// The scenario named `name` (a subcommand).
    pub(crate) fn by_name(name: &str) -> Option<&'static Scenario> {
        SCENARIOS.iter().find(|s| s.name == name)
    }

    /// What `all` runs under these options, in order.
    pub(crate) fn all(opts: &Opts) -> Vec<&'static Scenario> {
        SCENARIOS.iter().filter(|s| (s.in_all)(opts)).collect()
    }
}

/// How much load: full runs and smoke runs differ only here.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Scale {
    pub repeats: usize,
    pub warmup: Duration,
    pub window: Duration,
    /// Closed-loop workers for connection-rate runs ("saturation").
    pub concurrency: usize,
    /// Offered rate (connections/s) of the fixed-rate latency runs.
    pub fixed_rate: f64,
    /// Idle connections held per system in idle-memory.
    pub idle_conns: usize,
    /// Concurrent open tunnel streams (the two sizes).
    pub streams: [usize; 2],
    /// Routes loaded in the reload scenario, and connections streaming through the reload.
    pub reload_routes: usize,
    pub reload_streams: usize,
    /// Streams of the head-of-line test.
    pub hol_streams: usize,
    /// Stalled clients of the slowloris scenario, and the real clients timed among them.
    pub stalled: usize,
    pub slowloris_clients: usize,
    /// Connections of the leak scenario, its warm-up (also the soak's) and how many in flight.
    pub leak_conns: u64,
    pub leak_warmup: u64,
    pub leak_concurrency: usize,
    /// Longest wait for the processes' counts to stop falling after the connections.
    pub settle_max: Duration,
    /// Length and offered rate (connections/s) of the soak scenario.
    pub soak_minutes: f64,
    pub soak_rate: f64,
    /// ha: replica kills timed (replica start → first agent session), rolling restarts, the
    /// CONNECTs/s the client offers during a roll, streams held open on each stopped replica,
    /// and the replicas' drain_grace.
    pub ha_kills: usize,
    pub ha_rolls: usize,
    pub ha_rate: f64,
    pub ha_live_streams: usize,
    pub ha_drain_grace: Duration,
    /// fleet: agents, the CONNECTs/s offered during the storm, and runs per transport.
    pub fleet_agents: usize,
    pub fleet_rate: f64,
    pub fleet_kills: usize,
    /// scaling: the CPUs of the system under test asked for (`--scaling-cpus`).
    pub scaling_cpus: Option<Vec<usize>>,
    /// wan: repeats (each profile takes minutes), the higher link rate (Mbit/s), and the
    /// profiles to run (a text their names contain).
    pub wan_repeats: usize,
    pub wan_rate_mbit: f64,
    pub wan_profile: Option<String>,
    /// faults: only the faults whose name contains this.
    pub fault: Option<String>,
}

impl Scale {
    fn new(o: &Opts) -> Self {
        let window = o.window.unwrap_or(if o.smoke { 0.25 } else { 3.0 }).max(0.05);
        let s = o.smoke;
        Self {
            repeats: o.repeats.unwrap_or(if s { 1 } else { 5 }).max(1),
            warmup: Duration::from_secs_f64((window / 4.0).max(0.1)),
            window: Duration::from_secs_f64(window),
            concurrency: 32,
            // Well below every system's saturation, so that latency is the path's, not a queue's.
            fixed_rate: 200.0,
            idle_conns: if s { 300 } else { 9_000 },
            streams: if s { [100, 1_000] } else { [1_000, 10_000] },
            // Smoke runs prove that the scenarios work: a tenth of the routes, and stalled clients
            // still beyond the slowloris cap of 1,000 connections, but within the pending budget.
            reload_routes: if s { 1_000 } else { 10_000 },
            reload_streams: if s { 50 } else { 200 },
            hol_streams: 50,
            stalled: if s { 1_500 } else { 2_500 },
            slowloris_clients: if s { 3 } else { 10 },
            leak_conns: o.leak_connections.unwrap_or(if s { 2_000 } else { 100_000 }),
            leak_warmup: if s { 400 } else { 2_000 },
            leak_concurrency: 200,
            settle_max: Duration::from_secs(if s { 15 } else { 60 }),
            soak_minutes: o.soak_minutes.unwrap_or(if s { 0.2 } else { 10.0 }).max(0.0),
            soak_rate: o.soak_rate.unwrap_or(200.0),
            ha_kills: o.repeats.unwrap_or(if s { 2 } else { 5 }).max(1),
            ha_rolls: o.repeats.unwrap_or(if s { 1 } else { 5 }).max(1),
            ha_rate: if s { 20.0 } else { 100.0 },
            ha_live_streams: if s { 3 } else { 10 },
            ha_drain_grace: Duration::from_secs(if s { 1 } else { 2 }),
            fleet_agents: o.agents.unwrap_or(if s { 12 } else { 1_000 }).max(1),
            fleet_rate: if s { 20.0 } else { 100.0 },
            // Each run starts the fleet afresh: one per transport unless asked for more.
            fleet_kills: o.repeats.unwrap_or(1).max(1),
            scaling_cpus: o.scaling_cpus.clone(),
            wan_repeats: o.repeats.unwrap_or(if s { 1 } else { 3 }).max(1),
            wan_rate_mbit: o.wan_rate.unwrap_or(wan::HIGH_RATE_MBIT).max(1.0),
            wan_profile: o.wan_profile.clone(),
            fault: o.fault.clone(),
        }
    }
}

/// What every scenario gets.
pub(crate) struct Ctx {
    pub scale: Scale,
    pub smoke: bool,
    /// The binaries are the debug build (`--debug`).
    pub debug: bool,
    pub pin: Pinning,
    pub bins: Bins,
    pub anchors: Anchors,
    pub dir: TempDir,
    pub ca: Ca,
    /// A rustls client trusting [`Ctx::ca`], with session resumption off (every handshake full).
    pub tls_client: Arc<ClientConfig>,
}

impl Ctx {
    pub(crate) fn env(&self) -> Env<'_> {
        self.env_with(crate::systems::Ends::default())
    }

    /// [`Ctx::env`] with the two ends of a tunnel placed as `ends` says (e.g. across a WAN).
    pub(crate) fn env_with(&self, ends: crate::systems::Ends) -> Env<'_> {
        Env {
            pin: &self.pin,
            dir: self.dir.path(),
            bins: &self.bins,
            anchors: &self.anchors,
            ca: &self.ca,
            workers: 1,
            ends,
        }
    }
}

/// Record one measurement of system `label`: a value, or the error as a note on the row.
pub(crate) fn record(res: &mut Results, m: MetricId, label: &str, kind: Kind, r: anyhow::Result<f64>) {
    let what = res.describe(m);
    match r {
        Ok(v) => {
            eprintln!("  {what} | {label} | {}", report::fmt_num(v));
            res.add(m, label, kind, v);
        }
        Err(e) => {
            let text = format!("{e:#}");
            let first: String = text.lines().next().unwrap_or("").chars().take(200).collect();
            eprintln!("  {what} | {label} | error: {text}");
            res.note(m, label, kind, &format!("error: {first}"));
        }
    }
}

/// Record the figures of one rate run. They count if the system is still alive and at most 1%
/// of the transactions failed (else the error is reported instead); fewer errors are noted.
pub(crate) fn record_rate(res: &mut Results, sys: &mut Running, r: &RateResult, figs: &[(MetricId, f64)]) {
    let done = r.first_byte.len() as u64;
    let first = r.first_error.as_deref().map(|e| format!(" (first: {e})")).unwrap_or_default();
    let verdict = match sys.check_alive() {
        Err(e) => Err(e),
        Ok(()) if done == 0 || r.errors * 100 > done + r.errors => {
            Err(anyhow::anyhow!("{} errors, {done} completed{first}", r.errors))
        }
        Ok(()) => Ok(()),
    };
    for &(m, v) in figs {
        let one = match &verdict {
            Ok(()) => Ok(v),
            Err(e) => Err(anyhow::anyhow!("{e:#}")),
        };
        record(res, m, &sys.label, sys.kind, one);
        if verdict.is_ok() && r.errors > 0 {
            res.note(m, &sys.label, sys.kind, &format!("{} errors of {}{first}", r.errors, done + r.errors));
        }
        if r.dropped > 0 {
            res.note(
                m,
                &sys.label,
                sys.kind,
                &format!("{} fixed-rate starts dropped (too many outstanding)", r.dropped),
            );
        }
    }
}

/// Add a skipped row for every skipped slot to each metric (so none is silently dropped).
pub(crate) fn record_skips(res: &mut Results, metrics: &[MetricId], slots: &[Slot]) {
    for s in slots {
        if let Slot::Skipped { label, kind, reason } = s {
            for &m in metrics {
                res.skip(m, label, *kind, reason);
            }
        }
    }
}

/// Run the scenarios (CLI entry point for everything but the demo).
pub(crate) fn main(opts: Opts, which: Vec<&'static Scenario>) -> ExitCode {
    match run_main(opts, which) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run_main(opts: Opts, which: Vec<&'static Scenario>) -> anyhow::Result<ExitCode> {
    // Build first (with every CPU), then pin the harness.
    let profile = if opts.debug { "debug" } else { "release" };
    let bins = testbed::ensure_built(profile, &["sni-router", "proxy-server", "proxy-agent"])?;
    let bins = Bins { router: bins[0].clone(), server: bins[1].clone(), agent: bins[2].clone() };
    let nofile = host::raise_nofile(host::NOFILE)?;
    let pin = host::pin(!opts.no_pin, &opts.glibc_tunables)?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(run_async(opts, which, bins, pin, nofile))
}

async fn run_async(
    opts: Opts,
    which: Vec<&'static Scenario>,
    bins: Bins,
    pin: Pinning,
    nofile: u64,
) -> anyhow::Result<ExitCode> {
    let scale = Scale::new(&opts);
    if let Some(o) = &opts.only {
        let _ = crate::systems::ONLY.set(o.clone());
    }
    crate::systems::SEEDGATE_ONLY.store(opts.seedgate_only, std::sync::atomic::Ordering::Relaxed);
    crate::systems::STATUS_POLL.store(opts.status_poll, std::sync::atomic::Ordering::Relaxed);
    let mut machine = Machine::probe(nofile);
    let anchors = Anchors::find();
    let mut dir = TempDir::new("bench")?;
    if opts.keep {
        dir.keep();
    }
    let ca = Ca::new("seedgate bench CA")?;
    let mut tls = (*testbed::pki::client_config(&ca, None, &["http/1.1"])?).clone();
    tls.resumption = rustls::client::Resumption::disabled();
    let ctx =
        Ctx { scale, smoke: opts.smoke, debug: opts.debug, pin, bins, anchors, dir, ca, tls_client: Arc::new(tls) };

    let versions = ctx.anchors.versions();
    eprintln!("bench: pinning: {}", ctx.pin.describe());
    eprintln!("bench: load average at start: {}", machine.loadavg_start);
    let mut res = Results::default();
    let mut failed = Vec::new();
    let started = Instant::now();
    // SIGINT/SIGTERM end the run cleanly: the running scenario is dropped (which stops every
    // process it started) and what was measured so far is still reported.
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut interrupted = false;
    for sc in &which {
        eprintln!("bench: == {} ==", sc.name);
        let t = Instant::now();
        let (date, load0) = (host::utc_now(), host::loadavg());
        let fut = (sc.run)(&ctx, &mut res);
        let r = tokio::select! {
            r = fut => Some(r),
            _ = tokio::signal::ctrl_c() => None,
            _ = sigterm.recv() => None,
        };
        res.runs.push(report::ScenarioRun {
            completed: matches!(r, Some(Ok(()))),
            scenario: sc.name.into(),
            date_utc: date,
            loadavg_start: load0,
            loadavg_end: host::loadavg(),
            repeats: (sc.repeats)(&ctx.scale),
            window_s: ctx.scale.window.as_secs_f64(),
            smoke: opts.smoke,
            seconds: t.elapsed().as_secs_f64(),
            glibc_tunables: ctx.pin.glibc_tunables.clone(),
        });
        match r {
            None => {
                eprintln!("bench: interrupted during {}", sc.name);
                res.remark(sc.name, "interrupted: the figures of this scenario are incomplete");
                interrupted = true;
                break;
            }
            Some(Err(e)) => {
                eprintln!("bench: scenario {} failed: {e:#}", sc.name);
                let first = format!("{e:#}").lines().next().unwrap_or("").to_owned();
                res.remark(sc.name, &format!("scenario failed: {first}"));
                failed.push(format!("{} (scenario error)", sc.name));
            }
            Some(Ok(())) => {}
        }
        eprintln!("bench: {} took {:.1} s", sc.name, t.elapsed().as_secs_f64());
    }
    machine.loadavg_end = host::loadavg();
    if opts.status_poll {
        use std::sync::atomic::Ordering::Relaxed;
        let (ok, failed) =
            (crate::systems::STATUS_POLLED.load(Relaxed), crate::systems::STATUS_POLL_FAILED.load(Relaxed));
        eprintln!("bench: --status-poll: {ok} status pages fetched (/ and /status), {failed} failed");
    }
    // A seedgate system that could not start, or a seedgate measurement that errored, means the
    // harness or the binaries are broken (an anchor that is missing or fails is only reported).
    failed.extend(res.seedgate_failures());
    let names: Vec<&str> = which.iter().map(|s| s.name).collect();

    let ws = workspace();
    let (json_path, svg_path) = result_paths(&opts, &ws);
    if opts.merge {
        match std::fs::read(&json_path) {
            Ok(bytes) => {
                let v: serde_json::Value =
                    serde_json::from_slice(&bytes).with_context(|| format!("parsing {}", json_path.display()))?;
                let older: Results = serde_json::from_value(v["results"].clone())
                    .with_context(|| format!("reading the results in {}", json_path.display()))?;
                let order: Vec<&str> = SCENARIOS.iter().map(|s| s.name).collect();
                res.merge_older(older, &order);
            }
            Err(e) => eprintln!("bench: --merge: nothing to merge from {} ({e})", json_path.display()),
        }
    }
    // Targets after the merge (they cover what the table shows); only this run's scenarios'
    // missing figures fail it.
    let targets = targets(&res, &names);
    failed.extend(
        targets.iter().filter(|t| t.verdict == Verdict::Missing).map(|t| format!("target \"{}\": {}", t.what, t.value)),
    );
    let header = header(&ctx, &machine, &versions, started.elapsed(), &which);
    let md = report::markdown(&res, &header) + &report::targets_markdown(&targets);
    println!("{md}");
    let json = serde_json::json!({
        "machine": machine,
        "pinning": ctx.pin,
        "pinning_text": ctx.pin.describe(),
        "scale": ctx.scale,
        "smoke": opts.smoke,
        "debug_binaries": opts.debug,
        "scenarios": which.iter().map(|s| s.name).collect::<Vec<_>>(),
        "anchors": versions.iter().map(|(k, v)| serde_json::json!({"name": k, "version": v})).collect::<Vec<_>>(),
        "duration_s": started.elapsed().as_secs_f64(),
        "results": res,
        "markdown": md,
    });
    write_file(&json_path, &serde_json::to_string_pretty(&json)?)?;
    let title = format!(
        "seedgate bench — {} — {} × {}, {}{}",
        machine.date_utc,
        machine.cpus,
        machine.cpu_model,
        if opts.smoke { "SMOKE (not figures to quote), " } else { "" },
        format_args!("medians of {} (bars), min–max (whiskers)", ctx.scale.repeats)
    );
    write_file(&svg_path, &report::svg(&res, &title))?;
    eprintln!("bench: wrote {} and {}", json_path.display(), svg_path.display());
    if opts.keep {
        eprintln!("bench: configs and logs kept in {}", ctx.dir.path().display());
    }
    if interrupted {
        Ok(ExitCode::from(130))
    } else if failed.is_empty() {
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("bench: FAILED:\n  {}", failed.join("\n  "));
        Ok(ExitCode::FAILURE)
    }
}

/// The workspace this bench was built in, or the current directory where that is not there (a
/// bench binary copied to another machine).
fn workspace() -> PathBuf {
    std::fs::canonicalize(testbed::proc::WORKSPACE).or_else(|_| std::env::current_dir()).unwrap_or_default()
}

/// The targets of every scenario the results hold, in the table's order. A missing figure fails
/// only a scenario of `this_run` that ran to its end (one merged from an older file is shown).
fn targets(res: &Results, this_run: &[&str]) -> Vec<Target> {
    let mut rows = Vec::new();
    for sc in SCENARIOS {
        let runs: Vec<&report::ScenarioRun> = res.runs.iter().filter(|r| r.scenario == sc.name).collect();
        if runs.is_empty() && !res.metrics.iter().any(|m| m.scenario == sc.name) {
            continue;
        }
        let missing_fails = this_run.contains(&sc.name) && runs.iter().all(|r| r.completed);
        let mut t = Targets::new(res, missing_fails);
        (sc.targets)(&mut t);
        rows.extend(t.rows);
    }
    rows
}

/// Where the results go: `--json` and `--svg` as given; a chart not given goes beside a results
/// file that is (so that a run or report into a scratch file leaves the committed chart alone),
/// else both go under `bench/results/` (`latest`, or `smoke` with `--smoke`).
fn result_paths(opts: &Opts, ws: &std::path::Path) -> (PathBuf, PathBuf) {
    let stem = if opts.smoke { "smoke" } else { "latest" };
    let json = opts.json.clone().unwrap_or_else(|| ws.join(format!("bench/results/{stem}.json")));
    let svg = match (&opts.svg, &opts.json) {
        (Some(svg), _) => svg.clone(),
        (None, Some(json)) => json.with_extension("svg"),
        (None, None) => ws.join(format!("bench/results/{stem}.svg")),
    };
    (json, svg)
}

/// `bench report`: print the Markdown of a results file and rewrite its chart, without running
/// anything (e.g. after merging scenarios run one at a time); with `charts`, draw the small
/// charts there too.
pub(crate) fn report_main(opts: Opts, charts: Option<&Path>) -> ExitCode {
    let r = (|| -> anyhow::Result<()> {
        let ws = workspace();
        let (json_path, svg_path) = result_paths(&opts, &ws);
        let bytes = std::fs::read(&json_path).with_context(|| format!("reading {}", json_path.display()))?;
        let v: serde_json::Value = serde_json::from_slice(&bytes)?;
        let res: Results = serde_json::from_value(v["results"].clone()).context("the results in the file")?;
        let m = &v["machine"];
        let header = format!(
            "## seedgate bench — {}\n\n- machine: {} × {}, {} GiB, Linux {}\n- pinning: {}\n- anchors: {}\n",
            // Relative to the workspace: the Markdown is committed and must not name a checkout.
            json_path.strip_prefix(&ws).unwrap_or(&json_path).display(),
            m["cpus"],
            m["cpu_model"].as_str().unwrap_or("?"),
            m["mem_gib"],
            m["kernel"].as_str().unwrap_or("?"),
            v["pinning_text"].as_str().unwrap_or("?"),
            v["anchors"]
                .as_array()
                .map(|a| a
                    .iter()
                    .map(|x| format!("{}: {}", x["name"].as_str().unwrap_or(""), x["version"].as_str().unwrap_or("")))
                    .collect::<Vec<_>>()
                    .join("; "))
                .unwrap_or_default(),
        );
        println!("{}{}", report::markdown(&res, &header), report::targets_markdown(&targets(&res, &[])));
        let dates: Vec<&str> = res.runs.iter().map(|r| r.date_utc.as_str()).collect();
        let title = format!(
            "seedgate bench — {} — {} × {}, medians (bars), min–max (whiskers)",
            dates.first().copied().unwrap_or("?"),
            m["cpus"],
            m["cpu_model"].as_str().unwrap_or("?"),
        );
        write_file(&svg_path, &report::svg(&res, &title))?;
        eprintln!("bench: wrote {}", svg_path.display());
        if let Some(dir) = charts {
            write_charts(&res, dir)?;
        }
        Ok(())
    })();
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench report: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The small charts into `dir`; a chart the results cannot draw is removed there (so that the
/// directory shows what the results hold, not an older run's picture) and said why.
fn write_charts(res: &Results, dir: &Path) -> anyhow::Result<()> {
    for (name, chart) in crate::charts::all(res) {
        let path = dir.join(name);
        match chart {
            Ok(svg) => {
                write_file(&path, &svg)?;
                eprintln!("bench: wrote {}", path.display());
            }
            Err(why) => match std::fs::remove_file(&path) {
                Ok(()) => eprintln!("bench: removed {}: {why}", path.display()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => eprintln!("bench: no {name}: {why}"),
                Err(e) => return Err(e).with_context(|| format!("removing {}", path.display())),
            },
        }
    }
    Ok(())
}

fn write_file(p: &Path, text: &str) -> anyhow::Result<()> {
    if let Some(d) = p.parent() {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    std::fs::write(p, text).with_context(|| format!("writing {}", p.display()))
}

fn header(ctx: &Ctx, m: &Machine, versions: &[(String, String)], took: Duration, which: &[&Scenario]) -> String {
    let s = &ctx.scale;
    let mut h = String::new();
    h.push_str(&format!(
        "## seedgate bench{} — {}\n\n",
        if ctx.smoke { " (smoke run: brief, figures are not to be quoted)" } else { "" },
        m.date_utc
    ));
    h.push_str(&format!(
        "- machine: {} × {}, {} GiB, Linux {}; load average (1/5/15 min) {} at start, {} at end; fd limit {}\n",
        m.cpus, m.cpu_model, m.mem_gib, m.kernel, m.loadavg_start, m.loadavg_end, m.nofile
    ));
    h.push_str(&format!("- pinning: {}\n", ctx.pin.describe()));
    h.push_str(&format!("- environment: {}\n", ctx.pin.describe_env()));
    if ctx.debug {
        h.push_str("- binaries: the debug build (`--debug`): these figures say nothing about seedgate's speed\n");
    }
    h.push_str(&format!(
        "- each figure: median of {} repeat(s) (interleaved across systems), spread min–max; windows of {:.2} s after {:.2} s warm-up; \
         connection rates closed-loop with {} concurrent clients, fixed-rate latency at {} connections/s (open loop)\n",
        s.repeats,
        s.window.as_secs_f64(),
        s.warmup.as_secs_f64(),
        s.concurrency,
        s.fixed_rate
    ));
    h.push_str(
        "- every system logs no per-connection access line (seedgate RUST_LOG=warn; haproxy without `log`; nginx stream without access_log; squid access_log none; tinyproxy LogLevel Critical; rathole RUST_LOG=error)\n",
    );
    h.push_str(&format!(
        "- anchors: {}\n",
        versions.iter().map(|(k, v)| format!("{k}: {v}")).collect::<Vec<_>>().join("; ")
    ));
    h.push_str(&format!(
        "- scenarios: {}; took {:.0} s\n- columns: `vs direct` = system ÷ direct (for latencies: the added time); `seedgate ÷ this` = the first seedgate row ÷ this row (> 1 means seedgate's number is larger: better for ↑ figures, worse for ↓ ones); ⚠ = errors, listed under the table\n",
        which.iter().map(|s| s.name).collect::<Vec<_>>().join(", "),
        took.as_secs_f64()
    ));
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        opts: Opts,
    }

    fn paths(args: &[&str]) -> (PathBuf, PathBuf) {
        let cli = Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied())).unwrap();
        result_paths(&cli.opts, std::path::Path::new("/ws"))
    }

    #[test]
    fn a_chart_goes_beside_a_results_file_given_and_to_the_committed_place_only_by_default() {
        let p = |a: &str| PathBuf::from(a);
        assert_eq!(paths(&[]), (p("/ws/bench/results/latest.json"), p("/ws/bench/results/latest.svg")));
        assert_eq!(paths(&["--smoke"]), (p("/ws/bench/results/smoke.json"), p("/ws/bench/results/smoke.svg")));
        assert_eq!(paths(&["--json", "/tmp/q.json"]), (p("/tmp/q.json"), p("/tmp/q.svg")));
        assert_eq!(paths(&["--json", "/tmp/q.json", "--svg", "/c.svg"]), (p("/tmp/q.json"), p("/c.svg")));
        assert_eq!(paths(&["--svg", "/c.svg"]), (p("/ws/bench/results/latest.json"), p("/c.svg")));
    }
}
