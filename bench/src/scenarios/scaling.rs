//! scaling: the gateway and the tunnel given N = 1, 2, 4, … CPUs, beside haproxy (`nbthread N`) and nginx (`worker_processes N`), with load from worker processes on the other CPUs.
//!
//! For each N the system under test runs on the first N CPUs this process may use (`taskset`;
//! sni-router sizes its runtime to them, haproxy gets `nbthread N`, nginx `worker_processes N`),
//! and one `bench load-worker` process runs on each remaining CPU: each serves the backends on
//! ports they all share (`SO_REUSEPORT`) and drives its part of the load. Through the tunnel,
//! proxy-server gets the first N CPUs, proxy-agent the next N, the load the rest (on a machine too
//! small for that, both ends share the N CPUs). N goes up in powers of two while the load keeps at
//! least as many CPUs as the system under test (and the largest N that does, if not a power of
//! two); `--scaling-cpus` chooses others.
//!
//! Figures per N: full-TLS connections/s through SNI routing (the backend completes each
//! handshake; its CPUs are the load's), time to first byte p99 at that saturation, SNI bulk with
//! 64 streams, PROXY-v2 connections/s, CONNECT opens/s, and through the tunnel CONNECT opens/s and
//! bulk with 64 streams. Beside each, read from `/proc` over the measuring window: how busy the
//! system's CPUs and the load's were, the system's CPU time per connection (or per GB), each
//! thread's share of a CPU, context switches and run-queue waits, and where its threads were
//! (user space, or which system call) sampled every 10 ms. A summary gives every figure by N with
//! the scaling efficiency (figure at N ÷ (N × figure at 1)) and seedgate's ratio to each anchor,
//! and marks figures the load set (its CPUs busy, the system's not).

mod probe;

use super::sni_bulk::{haproxy_sni_frontend, nginx_sni_server, router_sni_listener};
use super::{Ctx, record};
use crate::host;
use crate::load::{Latencies, client_hello};
use crate::load_worker::{Backends, Command, Pool, PreSpec, Reply, TxnSpec, spread};
use crate::report::{Better, FigureId, Kind, MetricId, Read, Results, Targets, at, fmt_num};
use crate::systems::{self, Running, Slot};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

pub(super) const SC: &str = "scaling";
const SNI_API: &str = "api.bench.example";
const SNI_BULK: &str = "bulk.bench.example";
const BULK_STREAMS: usize = 64;
/// Closed-loop clients per CPU of the system under test.
const CLIENTS_PER_CPU: usize = 32;
/// A set of CPUs this busy (mean over the window) is taken as saturated.
const SATURATED: f64 = 0.9;
const TUNNEL: &str = "proxy-server + proxy-agent";
/// The CPU list to use instead of this process's (see [`run`]).
const CPU_LIST_ENV: &str = "BENCH_SCALING_CPU_LIST";

/// The figures, in the order of the summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fig {
    Tls,
    TlsP99,
    Bulk,
    Proxy,
    Connect,
    TunnelConnect,
    TunnelBulk,
}

impl Fig {
    const ALL: [Fig; 7] =
        [Fig::Tls, Fig::TlsP99, Fig::Bulk, Fig::Proxy, Fig::Connect, Fig::TunnelConnect, Fig::TunnelBulk];

    fn name(self) -> &'static str {
        match self {
            Fig::Tls => "full-TLS connections/s through SNI routing",
            Fig::TlsP99 => "full-TLS time to first byte p99 at saturation",
            Fig::Bulk => "SNI bulk, 64 streams",
            Fig::Proxy => "PROXY-v2 listener connections/s",
            Fig::Connect => "CONNECT opens/s",
            Fig::TunnelConnect => "CONNECT through the tunnel, opens/s",
            Fig::TunnelBulk => "tunnel bulk upload, 64 streams",
        }
    }

    fn unit(self) -> &'static str {
        match self {
            Fig::Bulk | Fig::TunnelBulk => "Gbit/s",
            Fig::TlsP99 => "µs",
            _ => "conn/s",
        }
    }

    fn better(self) -> Better {
        if self == Fig::TlsP99 { Better::Lower } else { Better::Higher }
    }

    /// Whether a figure grows with the CPUs (the efficiency applies).
    fn scales(self) -> bool {
        self != Fig::TlsP99
    }

    /// The figure's id; its parameter is N.
    fn id(self) -> FigureId {
        FigureId::new(
            SC,
            match self {
                Fig::Tls => "tls-conn-rate",
                Fig::TlsP99 => "tls-ttfb-p99",
                Fig::Bulk => "sni-bulk-64",
                Fig::Proxy => "proxy-v2-conn-rate",
                Fig::Connect => "connect-opens",
                Fig::TunnelConnect => "tunnel-connect-opens",
                Fig::TunnelBulk => "tunnel-bulk-64",
            },
        )
    }

    fn metric_name(self, n: usize) -> String {
        format!("{}, {n} CPU{}", self.name(), if n == 1 { "" } else { "s" })
    }
}

/// Where everything runs for one N.
#[derive(Debug, Clone)]
struct Layout {
    n: usize,
    /// The gateway's CPUs and its load's (`None`: not pinned).
    sut: Option<Vec<usize>>,
    load: Option<Vec<usize>>,
    tunnel: Option<TunnelLayout>,
}

#[derive(Debug, Clone)]
struct TunnelLayout {
    server: Option<Vec<usize>>,
    agent: Option<Vec<usize>>,
    load: Option<Vec<usize>>,
    /// Both ends share the N CPUs (the machine is too small to give each its own).
    shared: bool,
}

/// The N to run: powers of two while the load keeps at least N CPUs, the largest such N too;
/// or those asked for that leave the load a CPU.
fn plan_ns(m: usize, asked: Option<&[usize]>) -> (Vec<usize>, Vec<usize>) {
    match asked {
        Some(a) => {
            let (ok, dropped): (Vec<usize>, Vec<usize>) = a.iter().copied().partition(|&n| n >= 1 && n < m);
            let mut ok = ok;
            ok.sort_unstable();
            ok.dedup();
            (ok, dropped)
        }
        None => {
            let half = (m / 2).max(1);
            let mut v: Vec<usize> =
                std::iter::successors(Some(1usize), |n| Some(n * 2)).take_while(|&n| n <= half).collect();
            if v.last() != Some(&half) {
                v.push(half);
            }
            (v, Vec::new())
        }
    }
}

fn layouts(cpus: &[usize], pinned: bool, asked: Option<&[usize]>) -> (Vec<Layout>, Vec<usize>) {
    if !pinned || cpus.len() < 2 {
        let t = TunnelLayout { server: None, agent: None, load: None, shared: true };
        return (vec![Layout { n: 1, sut: None, load: None, tunnel: Some(t) }], Vec::new());
    }
    let m = cpus.len();
    let (ns, dropped) = plan_ns(m, asked);
    let v = ns
        .into_iter()
        .map(|n| {
            let set = |a: usize, b: usize| Some(cpus[a..b.min(m)].to_vec());
            let tunnel = if 3 * n <= m {
                Some(TunnelLayout { server: set(0, n), agent: set(n, 2 * n), load: set(2 * n, m), shared: false })
            } else if n == 1 {
                Some(TunnelLayout { server: set(0, 1), agent: set(0, 1), load: set(1, m), shared: true })
            } else {
                None
            };
            Layout { n, sut: set(0, n), load: set(n, m), tunnel }
        })
        .collect();
    (v, dropped)
}

/// What the window showed besides the figure.
#[derive(Debug, Clone, Default)]
struct Seen {
    sut: probe::CpuUse,
    load: probe::CpuUse,
    threads: probe::ThreadUse,
    samples: BTreeMap<String, u64>,
    secs: f64,
}

/// The CPUs and processes a measurement watches.
struct Watch<'a> {
    sut: Option<&'a [usize]>,
    load: Option<&'a [usize]>,
    pids: Vec<u32>,
}

impl Watch<'_> {
    /// Read everything at `from` and at `until` while `work` runs.
    async fn during<F: std::future::Future>(
        &self,
        from: tokio::time::Instant,
        until: tokio::time::Instant,
        work: F,
    ) -> (F::Output, Seen) {
        let (sut, load) = (self.sut.unwrap_or_default(), self.load.unwrap_or_default());
        let watch = async {
            tokio::time::sleep_until(from).await;
            let (s0, l0, t0) = (probe::cpu_ticks(sut), probe::cpu_ticks(load), probe::threads(&self.pids));
            let sampler = (!self.pids.is_empty()).then(|| probe::Sampler::start(self.pids.clone()));
            let started = tokio::time::Instant::now();
            tokio::time::sleep_until(until).await;
            let secs = started.elapsed().as_secs_f64();
            let samples = sampler.map(probe::Sampler::finish).unwrap_or_default();
            Seen {
                sut: probe::cpu_use(&s0, &probe::cpu_ticks(sut)),
                load: probe::cpu_use(&l0, &probe::cpu_ticks(load)),
                threads: probe::thread_use(&t0, &probe::threads(&self.pids), secs),
                samples,
                secs,
            }
        };
        tokio::join!(work, watch)
    }
}

/// `per`: what the figure's unit of work is (a connection, a GB), and how many were done.
fn describe(seen: &Seen, n: usize, k: usize, per: (&str, f64), has_sut: bool) -> String {
    let pct = |x: f64| format!("{:.0}%", x * 100.0);
    let mut s = String::new();
    if has_sut {
        let _ = write!(
            s,
            "its {n} CPU(s) {} busy (user {}, system {}, softirq {})",
            pct(seen.sut.busy),
            pct(seen.sut.user),
            pct(seen.sut.system),
            pct(seen.sut.softirq)
        );
        if per.1 > 0.0 {
            let (what, count) = per;
            let scale = if what == "GB" { 1.0 } else { 1e6 };
            let unit = if what == "GB" { "CPU s" } else { "µs" };
            let _ = write!(
                s,
                ", {} {unit} of them per {what} ({} in its processes)",
                fmt_num(seen.sut.busy_s * scale / count),
                fmt_num(seen.threads.cpu_s * scale / count)
            );
        }
        let _ = write!(s, "; ");
    }
    let _ = write!(s, "the load's {k} CPU(s) {} busy", pct(seen.load.busy));
    let t = &seen.threads;
    if has_sut && !t.busy.is_empty() {
        let shares: Vec<String> = t.busy.iter().take(16).map(|(_, f)| format!("{f:.2}")).collect();
        let _ = write!(
            s,
            "; threads' CPU shares {} ({} thread(s)); context switches {} voluntary + {} involuntary",
            shares.join(" "),
            t.busy.len(),
            fmt_num(t.voluntary as f64),
            fmt_num(t.involuntary as f64)
        );
        if per.1 > 0.0 && per.0 != "GB" {
            let _ = write!(s, " ({:.2} per connection)", (t.voluntary + t.involuntary) as f64 / per.1);
        }
        let _ = write!(
            s,
            "; run-queue wait {:.0} ms per s; sampled: {}",
            t.wait_s * 1000.0 / seen.secs.max(1e-9),
            probe::describe_samples(&seen.samples)
        );
    }
    s
}

/// One system for one N: how to reach each role, which figures it has, and why the others are
/// missing.
struct Sys {
    run: Running,
    figs: Vec<Fig>,
    missing: Vec<(Fig, String)>,
}

/// Every result of the run the summary needs beyond the medians: the load-bound marks.
#[derive(Default)]
struct Marks {
    /// (figure, N, system) → the system's CPUs and the load's, busy (last repeat).
    busy: BTreeMap<(Fig, usize, String), (f64, f64)>,
}

struct Run<'a> {
    ctx: &'a Ctx,
    res: &'a mut Results,
    marks: Marks,
    hello: Vec<u8>,
    ca_files: (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf),
}

pub(super) async fn run(ctx: &Ctx, res: &mut Results) -> anyhow::Result<()> {
    // BENCH_SCALING_CPU_LIST=0,1,1,1 plays a larger machine on a small one (CPUs may repeat):
    // for trying the layouts of several N, not for figures.
    let cpus = std::env::var(CPU_LIST_ENV)
        .ok()
        .and_then(|v| v.split(',').map(|c| c.trim().parse::<usize>().ok()).collect::<Option<Vec<_>>>())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| ctx.pin.cpus.clone());
    let pinned = ctx.pin.proxy_cpu.is_some();
    let (plan, dropped) = layouts(&cpus, pinned, ctx.scale.scaling_cpus.as_deref());
    anyhow::ensure!(!plan.is_empty(), "no N fits: {} CPU(s) here, asked {dropped:?}", cpus.len());
    let dir = ctx.dir.path();
    let ca = ctx.ca.write(dir, "scaling-ca")?;
    let (cert, key) = ctx.ca.server(&[SNI_API, SNI_BULK])?.write(dir, "scaling-backend")?;
    let hello = client_hello(ctx.tls_client.clone(), SNI_BULK)?;
    let mut r = Run { ctx, res, marks: Marks::default(), hello, ca_files: (ca, cert, key) };
    r.remarks(&cpus, &plan, &dropped);
    let result = async {
        for l in &plan {
            r.gateway(l).await?;
            if let Some(t) = &l.tunnel {
                r.tunnel(l.n, t).await?;
            }
        }
        anyhow::Ok(())
    }
    .await;
    // Later scenarios find the harness where the run put it.
    if let Some(c) = ctx.pin.load_cpu {
        host::pin_self(c)?;
    }
    let ns: Vec<usize> = plan.iter().map(|l| l.n).collect();
    let summary = summary(r.res, &ns, &r.marks);
    r.res.tables.push((SC.into(), summary));
    result
}

impl Run<'_> {
    fn remarks(&mut self, cpus: &[usize], plan: &[Layout], dropped: &[usize]) {
        let ns: Vec<String> = plan.iter().map(|l| l.n.to_string()).collect();
        let tunnel_ns: Vec<String> = plan.iter().filter(|l| l.tunnel.is_some()).map(|l| l.n.to_string()).collect();
        let shared = plan.iter().any(|l| l.tunnel.as_ref().is_some_and(|t| t.shared));
        let mut text = format!(
            "{} CPU(s) here; N = {} for the gateway (its CPUs the first N, the load's the others), N = {} for the tunnel ({}); \
             sni-router sizes its runtime to its CPUs, haproxy `nbthread N` (one listener, its default), nginx `worker_processes N` \
             (`listen … reuseport`); closed loops with {CLIENTS_PER_CPU} clients per CPU of the system, {BULK_STREAMS} bulk streams, \
             each spread over one load-worker process per load CPU that also serves the backends (TLS \"kube-apiserver\": every \
             handshake completes there, on the load's CPUs)",
            cpus.len(),
            ns.join(", "),
            if tunnel_ns.is_empty() { "none".to_owned() } else { tunnel_ns.join(", ") },
            if shared {
                "proxy-server and proxy-agent share the N CPUs: too few CPUs to give each its own"
            } else {
                "proxy-server on the first N CPUs, proxy-agent on the next N, the load on the rest"
            },
        );
        if !dropped.is_empty() {
            let _ = write!(text, "; asked N = {dropped:?} left out (the load needs at least one CPU)");
        }
        if std::env::var_os(CPU_LIST_ENV).is_some() {
            let _ = write!(text, "; CPUs from {CPU_LIST_ENV} {cpus:?}: a layout trial, not figures");
        }
        self.res.remark(SC, &text);
        let missing = self.ctx.anchors.missing(&["haproxy", "nginx", "nginx njs"]);
        if !missing.is_empty() && !crate::systems::SEEDGATE_ONLY.load(std::sync::atomic::Ordering::Relaxed) {
            self.res.remark(SC, &format!("anchors missing here: {}", missing.join("; ")));
        }
        self.res.remark(
            SC,
            "each row's note: how busy the system's CPUs and the load's were over the window (/proc/stat), the system's CPU per \
             connection (or per GB), each thread's share of a CPU, context switches and run-queue wait (/proc/<pid>/task), and \
             where its threads were, sampled every 10 ms (/proc/<pid>/task/<tid>/syscall)",
        );
    }

    fn backends(&self) -> anyhow::Result<Backends> {
        let (ca, cert, key) = self.ca_files.clone();
        let port = || host::free_port([127, 0, 0, 1]).map(|a| a.port());
        Ok(Backends { ca, cert, key, ping: port()?, tls: port()?, sink: port()? })
    }

    fn metric(&mut self, f: Fig, n: usize) -> MetricId {
        self.res.figure_at(f.id(), n, &f.metric_name(n), f.unit(), f.better())
    }

    /// The gateway systems for one N.
    async fn gateway(&mut self, l: &Layout) -> anyhow::Result<()> {
        let ctx = self.ctx;
        let s = &ctx.scale;
        let n = l.n;
        if let Some(load) = &l.load
            && let Some(&last) = load.last()
        {
            host::pin_self(last)?;
        }
        let b = self.backends()?;
        let mut pool = Pool::start(l.load.as_deref(), &b, ctx.dir.path()).await?;
        eprintln!("bench: scaling: N = {n}, system on CPUs {:?}, load on {:?} ({} workers)", l.sut, l.load, pool.len());
        let pin = match &l.sut {
            Some(c) => ctx.pin.on(c),
            None => ctx.pin.clone(),
        };
        let env = systems::Env { pin: &pin, workers: n, ..ctx.env() };
        let slots = vec![
            Sys::direct(&b),
            sys_slot("sni-router", Kind::Seedgate, Sys::router(&env, &b).await),
            sys_slot("haproxy", Kind::Anchor, Sys::haproxy(&env, &b).await),
            sys_slot("nginx", Kind::Anchor, Sys::nginx(&env, &b).await),
        ];
        let mut slots = slots;
        let gw_figs = [Fig::Tls, Fig::TlsP99, Fig::Bulk, Fig::Proxy, Fig::Connect];
        for f in gw_figs {
            self.metric(f, n);
        }
        for _ in 0..s.repeats {
            for slot in &mut slots {
                let SysSlot::Up(sys) = slot else { continue };
                let watch = Watch { sut: l.sut.as_deref(), load: l.load.as_deref(), pids: sys.run.pids() };
                for f in sys.figs.clone() {
                    if f == Fig::TlsP99 {
                        continue;
                    }
                    self.measure(&mut pool, sys, f, n, &watch).await;
                }
            }
        }
        for slot in &slots {
            for f in gw_figs {
                let m = self.metric(f, n);
                match slot {
                    SysSlot::Skipped { label, kind, reason } => self.res.skip(m, label, *kind, reason),
                    SysSlot::Up(sys) => {
                        if let Some((_, why)) = sys.missing.iter().find(|(g, _)| *g == f) {
                            self.res.skip(m, &sys.run.label, sys.run.kind, why);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    async fn tunnel(&mut self, n: usize, t: &TunnelLayout) -> anyhow::Result<()> {
        let ctx = self.ctx;
        let s = &ctx.scale;
        if let Some(load) = &t.load
            && let Some(&last) = load.last()
        {
            host::pin_self(last)?;
        }
        let b = self.backends()?;
        let mut pool = Pool::start(t.load.as_deref(), &b, ctx.dir.path()).await?;
        eprintln!(
            "bench: scaling: N = {n}, tunnel: proxy-server on CPUs {:?}, proxy-agent on {:?}, load on {:?}",
            t.server, t.agent, t.load
        );
        let (spin, apin) = match (&t.server, &t.agent) {
            (Some(sc), Some(ac)) => (ctx.pin.on(sc), ctx.pin.on(ac)),
            _ => (ctx.pin.clone(), ctx.pin.clone()),
        };
        let env = systems::Env { pin: &spin, workers: n, ..ctx.env() };
        let figs = [Fig::TunnelConnect, Fig::TunnelBulk];
        for f in figs {
            self.metric(f, n);
        }
        let top = "limits: { max_connections: 19000 }\n";
        let started = systems::seedgate_tunnel_pinned(&env, &apin, TUNNEL, b.ping(), top, false).await;
        let mut sys = match started {
            Ok(mut run) => {
                run.set_addr("ping", b.ping());
                run.set_addr("sink", b.sink());
                Sys { run, figs: figs.to_vec(), missing: Vec::new() }
            }
            Err(e) => {
                let why = format!("{e:#}");
                eprintln!("bench: {TUNNEL} did not start: {why}");
                for f in figs {
                    let m = self.metric(f, n);
                    self.res.skip(m, TUNNEL, Kind::Seedgate, why.lines().next().unwrap_or(""));
                }
                return Ok(());
            }
        };
        // The system's CPUs: both ends'.
        let mut cpus: Vec<usize> = t.server.iter().chain(&t.agent).flatten().copied().collect();
        cpus.sort_unstable();
        cpus.dedup();
        for _ in 0..s.repeats {
            let watch = Watch {
                sut: t.server.as_ref().map(|_| cpus.as_slice()),
                load: t.load.as_deref(),
                pids: sys.run.pids(),
            };
            for f in figs {
                self.measure(&mut pool, &mut sys, f, n, &watch).await;
            }
        }
        Ok(())
    }

    /// One measurement of figure `f` through `sys`, recorded with what the window showed.
    async fn measure(&mut self, pool: &mut Pool, sys: &mut Sys, f: Fig, n: usize, watch: &Watch<'_>) {
        let s = &self.ctx.scale;
        let (warmup, window) = (s.warmup, s.window);
        let k = pool.len();
        let start = Pool::start_time();
        let at = Pool::instant(start);
        let (from, until) = (at + warmup, at + warmup + window);
        let (start_ms, warmup_ms, window_ms) = (Pool::ms(start), warmup.as_millis() as u64, window.as_millis() as u64);
        let (label, kind) = (sys.run.label.clone(), sys.run.kind);
        let bulk = matches!(f, Fig::Bulk | Fig::TunnelBulk);
        let direct = kind == Kind::Direct;
        let cmds: anyhow::Result<Vec<Command>> = (|| {
            if bulk {
                let (addr, pre) = match f {
                    Fig::TunnelBulk if !direct => (
                        sys.run.addr("frontend")?,
                        PreSpec::Connect { head: crate::load::connect_head(&sys.run.addr("sink")?.to_string(), "") },
                    ),
                    _ => (sys.run.addr("sni")?, PreSpec::Raw { bytes: self.hello.clone() }),
                };
                return Ok(spread(BULK_STREAMS, k)
                    .into_iter()
                    .map(|st| Command::Bulk { addr, pre: pre.clone(), streams: st, start_ms, warmup_ms, window_ms })
                    .collect());
            }
            let spec = match f {
                Fig::Tls | Fig::TlsP99 => TxnSpec::Tls { addr: sys.run.addr("tls")?, sni: SNI_API.into() },
                Fig::Proxy => {
                    let pre = if direct {
                        Vec::new()
                    } else {
                        crate::load::proxy_v2("10.9.9.9:40000".parse()?, "10.1.2.3:443".parse()?)?
                    };
                    TxnSpec::Plain { addr: sys.run.addr("pp")?, pre }
                }
                Fig::Connect | Fig::TunnelConnect if direct => {
                    TxnSpec::Plain { addr: sys.run.addr("connect")?, pre: Vec::new() }
                }
                Fig::Connect => TxnSpec::Connect {
                    addr: sys.run.addr("connect")?,
                    head: super::connect::head(sys.run.addr("ping")?, super::connect::DEST_PING).to_vec(),
                },
                Fig::TunnelConnect => TxnSpec::Connect {
                    addr: sys.run.addr("frontend")?,
                    head: crate::load::connect_head(&sys.run.addr("ping")?.to_string(), ""),
                },
                Fig::Bulk | Fig::TunnelBulk => anyhow::bail!("{} is not a rate", f.name()),
            };
            Ok(spread(CLIENTS_PER_CPU * n, k)
                .into_iter()
                .map(|c| Command::Rate {
                    txn: spec.clone(),
                    concurrency: c,
                    latency: f == Fig::Tls,
                    start_ms,
                    warmup_ms,
                    window_ms,
                })
                .collect())
        })();
        let cmds = match cmds {
            Ok(c) => c,
            Err(e) => {
                let m = self.metric(f, n);
                record(self.res, m, &label, kind, Err(e));
                return;
            }
        };
        let (replies, seen) = watch.during(from, until, pool.call(cmds, warmup + window)).await;
        let alive = sys.run.check_alive();
        let m = self.metric(f, n);
        let replies = match (replies, alive) {
            (Ok(r), Ok(())) => r,
            (Err(e), _) | (_, Err(e)) => {
                record(self.res, m, &label, kind, Err(e));
                return;
            }
        };
        let errors: u64 = replies.iter().map(|r| r.errors).sum();
        let first_error = replies.iter().find_map(|r| r.first_error.clone());
        let has_sut = !direct;
        if bulk {
            let bytes: u64 = replies.iter().map(|r| r.bytes).sum();
            let secs = replies.iter().map(|r| r.secs).fold(0.0, f64::max).max(1e-9);
            let v = if errors > 0 {
                Err(anyhow::anyhow!("a stream failed: {}", first_error.unwrap_or_default()))
            } else {
                Ok(bytes as f64 * 8.0 / secs / 1e9)
            };
            let info = describe(&seen, n, k, ("GB", bytes as f64 / 1e9), has_sut);
            self.done(m, f, n, &label, kind, v, info, &seen);
            return;
        }
        let done: u64 = replies.iter().map(|r| r.done).sum();
        let rate: f64 =
            replies.iter().map(|r: &Reply| if r.span_s > 0.0 { r.done as f64 / r.span_s } else { 0.0 }).sum();
        let first = first_error.map(|e| format!(" (first: {e})")).unwrap_or_default();
        let v = if done == 0 || errors * 100 > done + errors {
            Err(anyhow::anyhow!("{errors} errors, {done} completed{first}"))
        } else {
            Ok(rate)
        };
        if v.is_ok() && errors > 0 {
            self.res.note(m, &label, kind, &format!("{errors} errors of {}{first}", done + errors));
        }
        let info = describe(&seen, n, k, ("connection", done as f64), has_sut);
        let ok = v.is_ok();
        self.done(m, f, n, &label, kind, v, info, &seen);
        if f == Fig::Tls && ok {
            let mut l = Latencies::default();
            for r in &replies {
                for &us in &r.first_byte_us {
                    l.push(Duration::from_micros(u64::from(us)));
                }
            }
            l.finish();
            let m99 = self.metric(Fig::TlsP99, n);
            record(self.res, m99, &label, kind, Ok(l.quantile_us(0.99)));
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn done(
        &mut self,
        m: MetricId,
        f: Fig,
        n: usize,
        label: &str,
        kind: Kind,
        v: anyhow::Result<f64>,
        info: String,
        seen: &Seen,
    ) {
        let ok = v.is_ok();
        record(self.res, m, label, kind, v);
        if ok {
            self.res.note_split(m, label, kind, &info);
            self.marks.busy.insert((f, n, label.to_owned()), (seen.sut.busy, seen.load.busy));
        }
    }
}

/// A system started for one N, or why not.
enum SysSlot {
    Up(Sys),
    Skipped { label: String, kind: Kind, reason: String },
}

/// A start attempt as a slot; a failure is skipped with its reason (as [`Slot::from`] says it).
fn sys_slot(label: &str, kind: Kind, r: anyhow::Result<Sys>) -> SysSlot {
    match r {
        Ok(s) => SysSlot::Up(s),
        Err(e) => match Slot::from(label, kind, Err(e)) {
            Slot::Skipped { label, kind, reason } => SysSlot::Skipped { label, kind, reason },
            Slot::Up(run) => SysSlot::Up(Sys { run, figs: Vec::new(), missing: Vec::new() }),
        },
    }
}

impl Sys {
    fn direct(b: &Backends) -> SysSlot {
        let run = Running::direct(&[("tls", b.tls()), ("sni", b.sink()), ("pp", b.ping()), ("connect", b.ping())]);
        SysSlot::Up(Sys { run, figs: vec![Fig::Tls, Fig::Bulk, Fig::Proxy, Fig::Connect], missing: Vec::new() })
    }

    /// sni-router with three listeners: SNI (`api` to the TLS backend, `bulk` to the sink),
    /// PROXY v2 (by destination to the small answer) and CONNECT (by header to the same).
    async fn router(env: &systems::Env<'_>, b: &Backends) -> anyhow::Result<Sys> {
        let mut yaml =
            router_sni_listener(&[("api".into(), SNI_API.into(), b.tls()), ("bulk".into(), SNI_BULK.into(), b.sink())]);
        yaml.push_str(&super::proxy_protocol::receivers_yaml(b.ping()));
        yaml.push_str(&super::connect::router_connect_listener(b.ping(), b.sink()).replacen(
            "name: gateway",
            "name: connect",
            1,
        ));
        let mut run = systems::sni_router(env, "sni-router", &yaml).await?;
        let (gw, connect) = (run.addr("gateway")?, run.addr("connect")?);
        run.set_addr("tls", gw);
        run.set_addr("sni", gw);
        run.set_addr("ping", b.ping());
        run.set_addr("connect", connect);
        Ok(Sys { run, figs: vec![Fig::Tls, Fig::Bulk, Fig::Proxy, Fig::Connect], missing: Vec::new() })
    }

    /// haproxy: the SNI frontend (both names) and the PROXY-v2 frontend; it does not terminate
    /// CONNECT.
    async fn haproxy(env: &systems::Env<'_>, b: &Backends) -> anyhow::Result<Sys> {
        let (sni, pp) = (host::free_port([127, 0, 0, 1])?, host::free_port([127, 0, 0, 1])?);
        let (pp_fe, pp_files) = super::proxy_protocol::haproxy_pp_frontend(pp, b.ping());
        let body = format!(
            "{}backend be_api\n    server up {}\nbackend be_bulk\n    server up {}\n{pp_fe}",
            haproxy_sni_frontend(sni, "sni.map"),
            b.tls(),
            b.sink()
        );
        let mut files = vec![("sni.map", format!("{SNI_API} be_api\n{SNI_BULK} be_bulk\n"))];
        files.extend(pp_files);
        let run =
            systems::haproxy(env, "haproxy", &body, &files, &[("tls", sni), ("sni", sni), ("pp", pp)], false).await?;
        let missing = vec![(Fig::Connect, "haproxy does not terminate HTTP CONNECT".to_owned())];
        Ok(Sys { run, figs: vec![Fig::Tls, Fig::Bulk, Fig::Proxy], missing })
    }

    /// nginx: `ssl_preread` (both names), PROXY v2 by destination, and CONNECT through njs when
    /// its module is there.
    async fn nginx(env: &systems::Env<'_>, b: &Backends) -> anyhow::Result<Sys> {
        let (sni, pp, connect) =
            (host::free_port([127, 0, 0, 1])?, host::free_port([127, 0, 0, 1])?, host::free_port([127, 0, 0, 1])?);
        let entries = format!("        {SNI_API} {};\n        {SNI_BULK} {};\n", b.tls(), b.sink());
        let mut body = nginx_sni_server(sni, &entries);
        body.push_str(&super::proxy_protocol::nginx_pp_server(pp, b.ping()));
        let njs = env.anchors.nginx_njs();
        let mut listen = vec![("tls", sni), ("sni", sni), ("pp", pp)];
        let mut files = Vec::new();
        let mut missing = Vec::new();
        let mut figs = vec![Fig::Tls, Fig::Bulk, Fig::Proxy];
        match &njs {
            Ok(_) => {
                // One map_hash_bucket_size per stream block: the SNI server set it.
                let c = super::connect::nginx_connect_server(connect, b.ping(), b.sink());
                body.push_str(&c.replace("    map_hash_bucket_size 128;\n", ""));
                files.push(("connect.js", super::connect::CONNECT_JS.to_owned()));
                listen.push(("connect", connect));
                figs.push(Fig::Connect);
            }
            Err(e) => missing.push((Fig::Connect, format!("nginx njs: {e}"))),
        }
        let mut run = systems::nginx_with(env, "nginx", &body, &files, &listen, njs.is_ok(), None).await?;
        run.set_addr("ping", b.ping());
        Ok(Sys { run, figs, missing })
    }
}

/// The median of `label`'s row of figure `f` at `n`.
fn median(res: &Results, f: Fig, n: usize, label: &str) -> Option<f64> {
    res.find(f.id(), Some(&n.to_string()))?.rows.iter().find(|r| r.system == label)?.median()
}

/// The summary: each figure by N with its efficiency, seedgate ÷ each anchor, and the marks.
fn summary(res: &Results, ns: &[usize], marks: &Marks) -> String {
    let mut out = String::from(
        "#### scaling summary\n\nMedians; in brackets the scaling efficiency, figure at N ÷ (N × figure at 1 CPU); \
         ‡ the load's CPUs were saturated and the system's were not: the load set that figure, not the system. \
         `÷` rows: seedgate's figure ÷ the anchor's at the same N.\n\n",
    );
    let head: Vec<String> = ns.iter().map(|n| format!("{n} CPU{}", if *n == 1 { "" } else { "s" })).collect();
    let _ = writeln!(out, "| figure | system | {} |", head.join(" | "));
    let _ = writeln!(out, "|---|---|{}", "---:|".repeat(ns.len()));
    for f in Fig::ALL {
        let systems: Vec<&str> = match f {
            Fig::TunnelConnect | Fig::TunnelBulk => vec![TUNNEL],
            Fig::Connect => vec!["sni-router", "nginx", "direct"],
            _ => vec!["sni-router", "haproxy", "nginx", "direct"],
        };
        let mut first = true;
        for sys in &systems {
            let cells: Vec<String> = ns
                .iter()
                .map(|&n| {
                    let Some(v) = median(res, f, n, sys) else { return "–".into() };
                    let mut c = fmt_num(v);
                    if f.scales()
                        && n > 1
                        && let Some(one) = median(res, f, 1, sys)
                        && one > 0.0
                    {
                        let _ = write!(c, " ({:.2})", v / (n as f64 * one));
                    }
                    if let Some((s, l)) = marks.busy.get(&(f, n, (*sys).to_owned()))
                        && *l >= SATURATED
                        && (*s < SATURATED || *sys == "direct")
                    {
                        c.push_str(" ‡");
                    }
                    c
                })
                .collect();
            if cells.iter().all(|c| c == "–") {
                continue;
            }
            let fig = if first { format!("{} ({})", f.name(), f.unit()) } else { String::new() };
            first = false;
            let _ = writeln!(out, "| {fig} | {sys} | {} |", cells.join(" | "));
        }
        for anchor in ["haproxy", "nginx"] {
            if !systems.contains(&anchor) {
                continue;
            }
            let cells: Vec<String> = ns
                .iter()
                .map(|&n| match (median(res, f, n, "sni-router"), median(res, f, n, anchor)) {
                    (Some(a), Some(b)) if b > 0.0 => format!("{:.2}×", a / b),
                    _ => "–".into(),
                })
                .collect();
            if cells.iter().any(|c| c != "–") {
                let _ = writeln!(out, "| | sni-router ÷ {anchor} | {} |", cells.join(" | "));
            }
        }
    }
    out
}

/// The scaling targets: efficiency at 8 CPUs where the run had 8, and sni-router ahead of haproxy
/// and nginx at every N it measured.
pub(super) fn targets(t: &mut Targets<'_>) {
    for (f, sys, min) in [
        (Fig::Tls, "sni-router", 0.85),
        (Fig::Proxy, "sni-router", 0.85),
        (Fig::Bulk, "sni-router", 0.85),
        (Fig::TunnelConnect, TUNNEL, 0.8),
    ] {
        if !t.res.params(f.id()).contains(&"8") {
            continue;
        }
        t.check(
            &format!("{sys} {} scaling efficiency ≥ {min} at 8 CPUs", f.name()),
            &[at(f.id(), "8", sys), at(f.id(), "1", sys)],
            |v| {
                let (a, one) = (v[0], v[1]);
                (one > 0.0).then(|| {
                    let e = a / (8.0 * one);
                    (format!("{} ÷ (8 × {}) = {e:.2}", fmt_num(a), fmt_num(one)), e >= min)
                })
            },
        );
    }
    for f in [Fig::Tls, Fig::Proxy, Fig::Bulk] {
        for (anchor, min) in [("haproxy", 1.2), ("nginx", 1.0)] {
            let ahead = if min > 1.0 { format!("≥ {min}×") } else { "ahead of".to_owned() };
            let what = format!("sni-router {} {ahead} {anchor} at every N", f.name());
            at_every_n(
                t,
                &what,
                f,
                anchor,
                false,
                |w| format!("lowest {w:.2}×"),
                |w| if min > 1.0 { w >= min } else { w > 1.0 },
            );
        }
    }
    at_every_n(
        t,
        "sni-router full-TLS p99 time to first byte at saturation no worse than haproxy's, at every N",
        Fig::TlsP99,
        "haproxy",
        true,
        |w| format!("highest {w:.2}× haproxy's"),
        |w| w <= 1.0,
    );
}

/// A target on sni-router ÷ `anchor` of figure `f` at every N recorded: the worst ratio (the
/// highest if `highest`, else the lowest) decides.
fn at_every_n(
    t: &mut Targets<'_>,
    what: &str,
    f: Fig,
    anchor: &str,
    highest: bool,
    show: impl Fn(f64) -> String,
    ok: impl Fn(f64) -> bool,
) {
    let ns: Vec<String> = t.res.params(f.id()).into_iter().map(str::to_owned).collect();
    let mut ratios: Vec<(&str, f64)> = Vec::new();
    let mut gaps: Vec<Read> = Vec::new();
    if ns.is_empty() {
        gaps.push(Read::Missing(format!("figure {SC}/{} not recorded", f.id().key)));
    }
    for n in &ns {
        match [t.read(at(f.id(), n, "sni-router")), t.read(at(f.id(), n, anchor))] {
            [Read::Value(a), Read::Value(b)] => {
                if b > 0.0 {
                    ratios.push((n, a / b));
                }
            }
            reads => gaps.extend(reads),
        }
    }
    let worst = if highest {
        ratios.iter().max_by(|x, y| x.1.total_cmp(&y.1))
    } else {
        ratios.iter().min_by(|x, y| x.1.total_cmp(&y.1))
    };
    match worst {
        Some(&(n, w)) if !gaps.iter().any(|g| matches!(g, Read::Missing(_))) => {
            let value = format!("{} (at {n} CPU{})", show(w), if n == "1" { "" } else { "s" });
            t.push(what, value, ok(w));
        }
        _ => t.not_evaluated(what, &gaps),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Verdict;

    #[test]
    fn n_doubles_while_the_load_keeps_as_many_cpus() {
        assert_eq!(plan_ns(2, None).0, vec![1]);
        assert_eq!(plan_ns(3, None).0, vec![1]);
        assert_eq!(plan_ns(16, None).0, vec![1, 2, 4, 8]);
        assert_eq!(plan_ns(12, None).0, vec![1, 2, 4, 6]);
        assert_eq!(plan_ns(16, Some(&[1, 12, 16, 0])), (vec![1, 12], vec![16, 0]));
    }

    #[test]
    fn the_tunnel_gets_each_end_its_own_cpus_where_they_fit() {
        let cpus: Vec<usize> = (0..16).collect();
        let (plan, _) = layouts(&cpus, true, None);
        let t: Vec<(usize, bool)> = plan.iter().filter_map(|l| l.tunnel.as_ref().map(|t| (l.n, t.shared))).collect();
        assert_eq!(t, vec![(1, false), (2, false), (4, false)]);
        let four = plan[2].tunnel.as_ref().unwrap();
        assert_eq!((four.server.clone(), four.agent.clone()), (Some(vec![0, 1, 2, 3]), Some(vec![4, 5, 6, 7])));
        assert_eq!(plan[3].load, Some((8..16).collect()));
        // Two CPUs: N = 1, both tunnel ends on CPU 0, the load on CPU 1.
        let (plan, _) = layouts(&[0, 1], true, None);
        let t = plan[0].tunnel.as_ref().unwrap();
        assert!(t.shared && t.server == Some(vec![0]) && t.load == Some(vec![1]));
    }

    #[test]
    fn the_summary_gives_efficiency_ratios_and_load_marks() {
        let mut res = Results::default();
        for (n, router, haproxy) in [(1, 1000.0, 900.0), (2, 1900.0, 1800.0)] {
            let m = res.figure_at(Fig::Proxy.id(), n, &Fig::Proxy.metric_name(n), "conn/s", Better::Higher);
            res.add(m, "sni-router", Kind::Seedgate, router);
            res.add(m, "haproxy", Kind::Anchor, haproxy);
        }
        let mut marks = Marks::default();
        marks.busy.insert((Fig::Proxy, 2, "haproxy".into()), (0.5, 0.97));
        let s = summary(&res, &[1, 2], &marks);
        assert!(s.contains("| sni-router | 1,000 | 1,900 (0.95) |"), "{s}");
        assert!(s.contains("| haproxy | 900 | 1,800 (1.00) ‡ |"), "{s}");
        assert!(s.contains("| | sni-router ÷ haproxy | 1.11× | 1.06× |"), "{s}");
        let mut t = Targets::new(&res, true);
        targets(&mut t);
        let t = t.rows;
        assert!(
            t.iter()
                .any(|t| t.what.contains("≥ 1.2× haproxy") && t.value.contains("1.06×") && t.verdict == Verdict::Unmet),
            "{t:?}"
        );
        // The full-TLS figures were not recorded: missing, not left out.
        assert!(t.iter().any(|t| t.what.contains("full-TLS connections/s") && t.verdict == Verdict::Missing), "{t:?}");
    }
}
