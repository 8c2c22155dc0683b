//! reload: with 10,000 SNI routes loaded (1,000 in a smoke run), the time from a config change
//! to the new route serving, and the connections reset by the reload.
//!
//! Before each reload, 200 connections are streaming through the proxy (SNI route to an echo
//! backend; each writes 1 KiB and reads it back every 5 ms). The harness then writes the new
//! config (one route more, written to a sibling file and renamed over the old one, as a
//! ConfigMap update does) and triggers the reload: SIGHUP for sni-router and nginx, a new
//! `haproxy -sf <old pid>` for haproxy. It polls a connection with the new SNI every
//! millisecond until the new backend answers: that time is the reload time. The streams go on
//! for 300 ms more; any that saw an error or EOF counts as reset, and the longest round trip any
//! of them saw from the reload on shows whether the reload stalled the data plane.
//!
//! sni-router is measured a second way, the per-shoot one: its N routes are N files of one route
//! each in `routes_dir` (the main config holds only the stream route), and the change is one new
//! file (written beside and renamed in), which is all it reads. haproxy and nginx have no per-file
//! route reload: their figure is the full reload above (haproxy's map could be changed through
//! its runtime API, which this scenario does not drive).

use super::sni_bulk::{haproxy_sni_frontend, nginx_sni_server, router_sni_listener};
use super::{Ctx, record};
use crate::host;
use crate::load::{Echo, PING_RESPONSE, Ping, Preamble, client_hello, open};
use crate::report::{Better, FigureId, Kind, Results, Targets, of};
use crate::systems::{self, Running, write_atomic};
use anyhow::{Context as _, ensure};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;
use testbed::Proc;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::task::JoinSet;
use tokio::time::Instant;

pub(super) const SC: &str = "reload";
const ROUTE_LIVE: FigureId = FigureId::new(SC, "new-route-live");
const RESET: FigureId = FigureId::new(SC, "connections-reset");
const STREAM_SNI: &str = "stream.bench.example";

fn route_name(i: usize) -> String {
    format!("r{i}.bench.example")
}

fn new_name(rep: usize) -> String {
    format!("new{rep}.bench.example")
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Sys {
    Router,
    RouterFiles,
    Haproxy,
    Nginx,
}

impl Sys {
    fn label(self) -> &'static str {
        match self {
            Self::Router => "sni-router (SIGHUP)",
            Self::RouterFiles => "sni-router (routes_dir, one new file)",
            Self::Haproxy => "haproxy (-sf)",
            Self::Nginx => "nginx (SIGHUP)",
        }
    }

    fn kind(self) -> Kind {
        if matches!(self, Self::Router | Self::RouterFiles) { Kind::Seedgate } else { Kind::Anchor }
    }
}

/// Routes of the config after `reloads` reloads: N numbered routes and the stream route to
/// echo, and one `new<k>` route to ping for every reload so far.
fn routes(n: usize, reloads: usize, echo: SocketAddr, ping: SocketAddr) -> Vec<(String, String, SocketAddr)> {
    let mut v: Vec<(String, String, SocketAddr)> = (0..n).map(|i| (format!("r{i}"), route_name(i), echo)).collect();
    v.push(("stream".into(), STREAM_SNI.into(), echo));
    for k in 0..reloads {
        v.push((format!("new{k}"), new_name(k), ping));
    }
    v
}

struct Target {
    run: Running,
    front: SocketAddr,
    sys: Sys,
    /// `routes_dir` of [`Sys::RouterFiles`].
    routes_dir: Option<std::path::PathBuf>,
}

fn route_file(name: &str, sni: &str, up: SocketAddr) -> String {
    format!("routes:\n  - listener: gateway\n    name: {name}\n    sni: [{sni}]\n    upstreams: [{up}]\n")
}

async fn start(ctx: &Ctx, sys: Sys, n: usize, echo: SocketAddr, ping: SocketAddr) -> anyhow::Result<Target> {
    let env = ctx.env();
    let r = routes(n, 0, echo, ping);
    match sys {
        Sys::Router => {
            let run = systems::sni_router(&env, sys.label(), &router_sni_listener(&r)).await?;
            let front = run.addr("gateway")?;
            Ok(Target { run, front, sys, routes_dir: None })
        }
        Sys::RouterFiles => {
            systems::check_only(sys.label())?;
            // One file per shoot, as a seed's shoot controller would keep them.
            let dir = env.dir.join("reload-routes-dir");
            let _ = std::fs::remove_dir_all(&dir);
            host::dir_with_mode(&dir, 0o777)?;
            let (main, files): (Vec<_>, Vec<_>) = r.into_iter().partition(|(name, _, _)| name == "stream");
            for (name, sni, up) in &files {
                std::fs::write(dir.join(format!("{name}.yaml")), route_file(name, sni, *up))?;
            }
            let yaml = format!("{}routes_dir: {}\n", router_sni_listener(&main), dir.display());
            let run = systems::sni_router(&env, sys.label(), &yaml).await?;
            let front = run.addr("gateway")?;
            Ok(Target { run, front, sys, routes_dir: Some(dir) })
        }
        Sys::Haproxy => {
            let front = host::free_port([127, 0, 0, 1])?;
            let body = format!(
                "{}backend be_echo\n    server e {echo}\nbackend be_ping\n    server p {ping}\n",
                haproxy_sni_frontend(front, "sni.map")
            );
            let run = systems::haproxy(
                &env,
                sys.label(),
                &body,
                &[("sni.map", haproxy_map(&r, echo))],
                &[("front", front)],
                false,
            )
            .await?;
            Ok(Target { run, front, sys, routes_dir: None })
        }
        Sys::Nginx => {
            let front = host::free_port([127, 0, 0, 1])?;
            let run = systems::nginx(
                &env,
                sys.label(),
                &nginx_sni_server(front, &nginx_entries(&r)),
                &[],
                &[("front", front)],
                false,
            )
            .await?;
            Ok(Target { run, front, sys, routes_dir: None })
        }
    }
}

fn haproxy_map(routes: &[(String, String, SocketAddr)], echo: SocketAddr) -> String {
    let mut m = String::new();
    for (_, sni, up) in routes {
        let _ = writeln!(m, "{sni} {}", if *up == echo { "be_echo" } else { "be_ping" });
    }
    m
}

fn nginx_entries(routes: &[(String, String, SocketAddr)]) -> String {
    let mut m = String::new();
    for (_, sni, up) in routes {
        let _ = writeln!(m, "        {sni} {up};");
    }
    m
}

/// Apply the config with `reloads` new routes and trigger the reload.
fn reload(
    ctx: &Ctx,
    t: &mut Target,
    n: usize,
    reloads: usize,
    echo: SocketAddr,
    ping: SocketAddr,
) -> anyhow::Result<()> {
    let r = routes(n, reloads, echo, ping);
    match t.sys {
        Sys::Router => {
            let cfg = t.run.dir.join("sni-router.yaml");
            let old = std::fs::read_to_string(&cfg)?;
            let head = old.split("listeners:\n").next().context("config without listeners")?;
            write_atomic(&cfg, &format!("{head}listeners:\n{}", router_sni_listener(&r)))?;
            t.run.signal_first(libc::SIGHUP)
        }
        Sys::RouterFiles => {
            let dir = t.routes_dir.as_ref().context("no routes_dir")?;
            let k = reloads - 1;
            write_atomic(&dir.join(format!("new{k}.yaml")), &route_file(&format!("new{k}"), &new_name(k), ping))
        }
        Sys::Nginx => {
            let cfg = t.run.dir.join("nginx.conf");
            let old = std::fs::read_to_string(&cfg)?;
            // Replace the map's entries (between "hostnames;" and "default").
            let (a, rest) = old.split_once("hostnames;\n").context("no map in nginx.conf")?;
            let (_, b) = rest.split_once("        default").context("no default in the map")?;
            write_atomic(&cfg, &format!("{a}hostnames;\n{}        default{b}", nginx_entries(&r)))?;
            t.run.signal_first(libc::SIGHUP)
        }
        Sys::Haproxy => {
            write_atomic(&t.run.dir.join("sni.map"), &haproxy_map(&r, echo))?;
            let bin = ctx.anchors.haproxy.clone().map_err(anyhow::Error::msg)?;
            let old_pid = t.run.pids().last().copied().context("no haproxy process")?;
            let mut cmd = ctx.env().anchor_command(&bin);
            cmd.arg("-db").arg("-f").arg(t.run.dir.join("haproxy.cfg")).arg("-sf").arg(old_pid.to_string());
            t.run.push_proc(Proc::spawn(cmd)?);
            Ok(())
        }
    }
}

/// One attempt: the new SNI is routed to the ping backend (which answers the ClientHello).
async fn routed(front: SocketAddr, hello: &Arc<[u8]>) -> bool {
    let attempt = async {
        let mut s = open(front, &Preamble::Raw(hello.clone())).await?;
        let mut b = vec![0u8; PING_RESPONSE.len()];
        s.read_exact(&mut b).await?;
        anyhow::Ok(b == PING_RESPONSE)
    };
    matches!(tokio::time::timeout(Duration::from_millis(500), attempt).await, Ok(Ok(true)))
}

/// Start `n` streaming connections; returns them with the count of broken ones.
async fn streams(
    front: SocketAddr,
    hello: Arc<[u8]>,
    n: usize,
    stop: Arc<AtomicBool>,
    max_rtt_us: Arc<AtomicU64>,
) -> anyhow::Result<(JoinSet<()>, Arc<AtomicUsize>)> {
    let broken = Arc::new(AtomicUsize::new(0));
    let up = Arc::new(AtomicUsize::new(0));
    let mut set = JoinSet::new();
    for _ in 0..n {
        let (hello, stop, broken, up) = (hello.clone(), stop.clone(), broken.clone(), up.clone());
        let max_rtt_us = max_rtt_us.clone();
        set.spawn(async move {
            let r = async {
                let mut s = open(front, &Preamble::Raw(hello.clone())).await?;
                let mut back = vec![0u8; hello.len()];
                s.read_exact(&mut back).await?;
                up.fetch_add(1, Ordering::Relaxed);
                let msg = [0x42u8; 1024];
                let mut buf = [0u8; 1024];
                // Until told to stop; every round is bounded by the 5 s timeout.
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    tokio::time::timeout(Duration::from_secs(5), async {
                        s.write_all(&msg).await?;
                        s.read_exact(&mut buf).await
                    })
                    .await??;
                    let us = u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX);
                    max_rtt_us.fetch_max(us, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                anyhow::Ok(())
            }
            .await;
            if r.is_err() {
                broken.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    // Bounded by the deadline.
    while up.load(Ordering::Relaxed) + broken.load(Ordering::Relaxed) < n {
        ensure!(Instant::now() < deadline, "streams did not open within 20 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    ensure!(broken.load(Ordering::Relaxed) == 0, "{} streams failed before the reload", broken.load(Ordering::Relaxed));
    Ok((set, broken))
}

pub(super) async fn run(ctx: &Ctx, res: &mut Results) -> anyhow::Result<()> {
    let s = &ctx.scale;
    let n = s.reload_routes;
    let echo = Echo::start().await?;
    let ping = Ping::start().await?;
    let stream_hello: Arc<[u8]> = client_hello(ctx.tls_client.clone(), STREAM_SNI)?.into();
    let m_time =
        res.figure(ROUTE_LIVE, &format!("new route live after a config change, {n} routes"), "ms", Better::Lower);
    let m_stall =
        res.metric(SC, "longest echo round trip of a streaming connection across the reload", "ms", Better::Lower);
    let m_reset = res.figure(
        RESET,
        &format!("connections reset by the reload, of {} streaming", s.reload_streams),
        "conns",
        Better::Lower,
    );
    res.remark(
        SC,
        "config written to a sibling and renamed over; sni-router and nginx: SIGHUP to the (master) process; haproxy: a new `haproxy -sf <old pid>` (old process finishes its connections); \
         sni-router (routes_dir): the routes are one file per shoot and the change is one new file renamed into the directory, no signal (haproxy and nginx have no per-file reload: their figure is the full reload); \
         time = from the write until a connection with the new SNI reaches the new backend (polled every 1 ms)",
    );
    for sys in [Sys::Router, Sys::RouterFiles, Sys::Haproxy, Sys::Nginx] {
        let (label, kind) = (sys.label(), sys.kind());
        let t0 = Instant::now();
        let mut t = match start(ctx, sys, n, echo.addr(), ping.addr()).await {
            Ok(t) => t,
            Err(e) => {
                let why = format!("{e:#}");
                if !why.contains("filtered out") {
                    eprintln!("bench: {label} did not start: {why}");
                }
                for m in [m_time, m_stall, m_reset] {
                    res.skip(m, label, kind, why.lines().next().unwrap_or(""));
                }
                continue;
            }
        };
        eprintln!("bench: {label} with {n} routes up in {:.2} s", t0.elapsed().as_secs_f64());
        for rep in 0..s.repeats {
            let r = one_reload(ctx, &mut t, n, rep, echo.addr(), ping.addr(), &stream_hello, s.reload_streams).await;
            match r {
                Ok((ms, resets, stall)) => {
                    record(res, m_time, label, kind, Ok(ms));
                    record(res, m_stall, label, kind, Ok(stall));
                    record(res, m_reset, label, kind, Ok(resets as f64));
                }
                Err(e) => {
                    let e = format!("{e:#}");
                    record(res, m_time, label, kind, Err(anyhow::anyhow!("{e}")));
                    record(res, m_stall, label, kind, Err(anyhow::anyhow!("{e}")));
                    record(res, m_reset, label, kind, Err(anyhow::anyhow!("{e}")));
                }
            }
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn one_reload(
    ctx: &Ctx,
    t: &mut Target,
    n: usize,
    rep: usize,
    echo: SocketAddr,
    ping: SocketAddr,
    stream_hello: &Arc<[u8]>,
    nstreams: usize,
) -> anyhow::Result<(f64, usize, f64)> {
    let new_hello: Arc<[u8]> = client_hello(ctx.tls_client.clone(), &new_name(rep))?.into();
    ensure!(!routed(t.front, &new_hello).await, "the new route answers before the reload");
    let stop = Arc::new(AtomicBool::new(false));
    let max_rtt_us = Arc::new(AtomicU64::new(0));
    let (mut set, broken) = streams(t.front, stream_hello.clone(), nstreams, stop.clone(), max_rtt_us.clone()).await?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    // From here on: the longest round trip of any stream (a reload that blocks the data plane
    // shows up here).
    max_rtt_us.store(0, Ordering::Relaxed);
    let t0 = Instant::now();
    reload(ctx, t, n, rep + 1, echo, ping)?;
    let deadline = t0 + Duration::from_secs(30);
    let mut live = None;
    // Polled every millisecond until the deadline.
    while Instant::now() < deadline {
        if routed(t.front, &new_hello).await {
            live = Some(t0.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    while set.join_next().await.is_some() {}
    t.run.check_alive_any()?;
    let live = live.context("the new route did not serve within 30 s")?;
    Ok((
        live.as_secs_f64() * 1000.0,
        broken.load(Ordering::Relaxed),
        max_rtt_us.load(Ordering::Relaxed) as f64 / 1000.0,
    ))
}

/// No connection reset, and the new route live quickly, by a full reload and by a shoot file.
pub(super) fn targets(t: &mut Targets<'_>) {
    t.value("reload resets 0 connections", of(RESET, "sni-router"), |v| format!("{v:.0}"), |v| v == 0.0);
    t.value(
        "new route live < 100 ms at 10,000 routes (full reload)",
        of(ROUTE_LIVE, "sni-router (SIGHUP)"),
        |v| format!("{v:.0} ms"),
        |v| v < 100.0,
    );
    t.value(
        "one new shoot file live < 20 ms at 10,000 routes",
        of(ROUTE_LIVE, "sni-router (routes_dir"),
        |v| format!("{v:.1} ms"),
        |v| v < 20.0,
    );
}
