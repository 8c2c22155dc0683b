//! wan: the reverse tunnel across an emulated WAN link, beside direct TCP over the same link.
//!
//! A seed and a shoot network namespace are joined by the testbed's user-space link emulator
//! (`testbed::link`: a TUN device in each, one forwarder thread per direction applying a one-way
//! delay, a rate limit behind a FIFO bottleneck of 50 ms at that rate with tail drop, and random
//! loss). The harness's client side lives in the seed namespace (this thread enters it for the
//! whole scenario); the targets (a sink, a source and an echo) in the shoot namespace, on the
//! shoot's address on the link. proxy-server, rathole's server and sshd run in the seed
//! namespace and listen on the seed's link address; proxy-agent, rathole's client and `ssh -R`
//! run in the shoot namespace and dial across the link. Load enters seedgate as `CONNECT
//! <target>` at proxy-server's front end, rathole and ssh through a visitor port per target.
//! Direct TCP crosses the link from the seed to the targets, with the kernel's BBR and again
//! with Cubic (the congestion control of new connections across the link, set on its routes
//! around the row; every other system's TCP uses BBR).
//!
//! Per profile (round-trip time, rate, loss), every system is started afresh, then measured (a
//! repeat of every system, then the next repeat):
//! - the round trip of 1 byte on an idle connection (for direct: the link's own round trip);
//! - one stream up (client → target) and, meanwhile, the round trip of 1 byte on a second
//!   connection through the same tunnel (the same session for seedgate and ssh; for direct a
//!   second TCP connection over the link): what an interactive stream sees behind a bulk one;
//! - the same with one stream down (target → client);
//! - 16 streams down: the aggregate and the slowest stream;
//! - 64 streams down: the aggregate, and the memory (RSS) of both ends of the tunnel meanwhile.
//!
//! Each transfer gets a warm-up long enough for the windows to open at that round-trip time
//! before its window is counted. Before every transfer the kernels forget what they learned about
//! earlier connections (`ip tcp_metrics flush`), and after it the link drains. The emulator's
//! own figures (its CPU time, deliveries later than 1 ms, packets its devices dropped, the
//! bottleneck's fill) go into the remarks; the targets table starts with the checks that the
//! emulator carried each profile (direct TCP's rate and idle round trip against the
//! configuration).

use super::{Ctx, record, record_skips};
use crate::load::{
    Echo, Latencies, Preamble, Sink, Source, bulk_download_each, bulk_upload, connect_head, round_trips,
};
use crate::report::{self, Better, FigureId, Kind, MetricId, Read, Results, at, fmt_num};
use crate::systems::{self, Ends, Running, Slot};
use anyhow::Context as _;
use std::net::SocketAddr;
use std::time::Duration;
use testbed::link::{Dir, Link, LinkOpts, Shape, Wan, kernel_has};
use tokio::time::Instant;

pub(super) const SC: &str = "wan";
/// The link's subnet (10.97.0.0/30), inside the scenario's own namespaces.
const NET: u8 = 97;
/// The highest rate (Mbit/s) the emulator carries faithfully on the 2-CPU machine the bench was
/// calibrated on (direct TCP ≥ 0.9× the rate at every round-trip time, the round trip as
/// configured); `--wan-rate` replaces it.
pub(crate) const HIGH_RATE_MBIT: f64 = 300.0;

const H2: &str = "proxy-server + proxy-agent (h2)";
const QUIC: &str = "proxy-server + proxy-agent (quic)";
const DIRECT_BBR: &str = "direct TCP (bbr)";
const DIRECT_CUBIC: &str = "direct TCP (cubic)";

/// One path: round-trip time, rate, random loss (each direction).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Profile {
    pub rtt_ms: u32,
    pub mbit: f64,
    /// Per cent of packets lost, each direction.
    pub loss_pct: f64,
}

impl Profile {
    fn name(&self) -> String {
        let mut n = format!("{} ms, {} Mbit/s", self.rtt_ms, crate::report::fmt_num(self.mbit));
        if self.loss_pct > 0.0 {
            n.push_str(&format!(", {} % loss", self.loss_pct));
        }
        n
    }

    /// The profile a metric name starts with (`<profile>: <figure>`).
    pub(crate) fn parse(metric: &str) -> Option<Self> {
        let (p, _) = metric.split_once(": ")?;
        let mut parts = p.split(", ");
        let rtt_ms = parts.next()?.strip_suffix(" ms")?.parse().ok()?;
        let mbit = parts.next()?.strip_suffix(" Mbit/s")?.replace(',', "").parse().ok()?;
        let loss_pct = match parts.next() {
            Some(l) => l.strip_suffix(" % loss")?.parse().ok()?,
            None => 0.0,
        };
        Some(Self { rtt_ms, mbit, loss_pct })
    }

    fn rtt(&self) -> Duration {
        Duration::from_millis(u64::from(self.rtt_ms))
    }

    fn bps(&self) -> u64 {
        (self.mbit * 1e6) as u64
    }

    fn shape(&self) -> Shape {
        Shape::wan(self.rtt(), self.bps()).with_loss(self.loss_pct / 100.0)
    }

    /// Warm-up and measuring window of one transfer. The warm-up covers the windows' opening: a
    /// connection starts with ten segments and at best doubles them per round trip; with a
    /// bottleneck of 50 ms, slow start (or BBR's startup) overshoots it, and the receiver then
    /// holds what arrived after the losses until the retransmissions fill the holes. On this
    /// link both take about 20 round trips (6 s at 300 ms) before what the receiver reads
    /// follows the link; the window spans 20 round trips, so that one loss recovery does not
    /// decide it. A transfer that runs past [`PROBE_RTT_CYCLE`] meets BBR's ProbeRTT, which
    /// drains a connection to four packets for 200 ms and a round trip (0.6-0.8 s of a 300 ms
    /// path's rate) when 10 s passed without a round trip below its minimum: a fresh
    /// connection (direct TCP, rathole's) meets it about 10 s after its start-up, a tunnel's
    /// long-lived session at any moment. So such a window spans the whole cycle, and every
    /// system meets one ProbeRTT in it, not one by chance and another never.
    fn timing(&self, smoke: bool) -> (Duration, Duration) {
        if smoke {
            return (Duration::from_millis(500), Duration::from_millis(500));
        }
        let rtt = self.rtt().as_secs_f64();
        let warmup = (20.0 * rtt).clamp(2.0, 6.0);
        let mut window = (20.0 * rtt).clamp(3.0, 6.0);
        if warmup + window >= PROBE_RTT_CYCLE.as_secs_f64() {
            window = PROBE_RTT_CYCLE.as_secs_f64();
        }
        (Duration::from_secs_f64(warmup), Duration::from_secs_f64(window))
    }

    /// Whether a (full) measuring window spans BBR's ProbeRTT cycle.
    fn spans_probe_rtt(&self) -> bool {
        self.timing(false).1 >= PROBE_RTT_CYCLE
    }
}

/// How often BBR's ProbeRTT comes to a busy connection (its minimum round trip's lifetime).
const PROBE_RTT_CYCLE: Duration = Duration::from_secs(10);

fn profiles(ctx: &Ctx) -> Vec<Profile> {
    if ctx.smoke {
        return vec![Profile { rtt_ms: 50, mbit: 100.0, loss_pct: 0.0 }];
    }
    let high = ctx.scale.wan_rate_mbit;
    let mut v = Vec::new();
    for mbit in [100.0, high] {
        for rtt_ms in [50, 150, 300] {
            v.push(Profile { rtt_ms, mbit, loss_pct: 0.0 });
        }
    }
    for loss_pct in [0.5, 1.0] {
        v.push(Profile { rtt_ms: 50, mbit: 100.0, loss_pct });
    }
    v.dedup();
    if let Some(f) = &ctx.scale.wan_profile {
        v.retain(|p| p.name().contains(f.as_str()));
    }
    v
}

/// The systems compared on every profile.
#[derive(Debug, Clone, Copy, PartialEq)]
enum System {
    /// Direct TCP with this kernel congestion control.
    Direct(&'static str),
    H2,
    Quic,
    Rathole,
    Ssh,
}

const SYSTEMS: [System; 6] =
    [System::Direct("bbr"), System::Direct("cubic"), System::H2, System::Quic, System::Rathole, System::Ssh];

impl System {
    fn label(self) -> &'static str {
        match self {
            Self::Direct("cubic") => DIRECT_CUBIC,
            Self::Direct(_) => DIRECT_BBR,
            Self::H2 => H2,
            Self::Quic => QUIC,
            Self::Rathole => "rathole (tcp)",
            Self::Ssh => "ssh -R",
        }
    }

    fn kind(self) -> Kind {
        match self {
            Self::Direct(_) => Kind::Direct,
            Self::H2 | Self::Quic => Kind::Seedgate,
            _ => Kind::Anchor,
        }
    }

    /// The kernel congestion control of the connections made while this system is measured:
    /// BBR for all but direct's Cubic row (where the kernel has no BBR, whatever it uses).
    fn cc(self) -> Option<&'static str> {
        match self {
            Self::Direct(cc) => Some(cc),
            _ => Some("bbr").filter(|cc| kernel_has(cc)),
        }
    }

    async fn start(self, ctx: &Ctx, ends: &Ends, t: &Targets) -> anyhow::Result<Running> {
        let env = ctx.env_with(ends.clone());
        let top = "limits: { max_connections: 19000 }\n";
        match self {
            Self::Direct(cc) => {
                anyhow::ensure!(kernel_has(cc), "the kernel has no {cc}");
                let mut r = Running::direct(&t.services());
                r.label = self.label().into();
                Ok(r)
            }
            Self::H2 => systems::seedgate_tunnel_with(&env, self.label(), t.echo, top, false).await,
            Self::Quic => systems::seedgate_tunnel_with(&env, self.label(), t.echo, top, true).await,
            Self::Rathole => systems::rathole(&env, self.label(), &t.services(), false).await,
            Self::Ssh => systems::ssh_reverse(&env, self.label(), &t.services()).await,
        }
    }
}

/// The shoot-side targets, on the shoot's link address.
#[derive(Debug, Clone, Copy)]
struct Targets {
    sink: SocketAddr,
    source: SocketAddr,
    echo: SocketAddr,
}

impl Targets {
    fn services(&self) -> [(&'static str, SocketAddr); 3] {
        [("sink", self.sink), ("source", self.source), ("echo", self.echo)]
    }
}

/// How a client reaches `role` through `sys`: a CONNECT to the target at seedgate's front end,
/// else the system's address for the role (a visitor port, or the target itself for direct).
fn route(sys: &Running, t: &Targets, role: &str) -> anyhow::Result<(SocketAddr, Preamble)> {
    let target = t.services().into_iter().find(|(r, _)| *r == role).map(|(_, a)| a).context("no such target")?;
    match sys.addr("frontend") {
        Ok(fe) => Ok((fe, Preamble::Connect(connect_head(&target.to_string(), "").into()))),
        Err(_) => Ok((sys.addr(role)?, Preamble::None)),
    }
}

/// One profile's figures.
struct Rows {
    idle: MetricId,
    up: MetricId,
    up_rt: [MetricId; 2],
    down: MetricId,
    down_rt: [MetricId; 2],
    agg16: MetricId,
    slow16: MetricId,
    agg64: MetricId,
    rss64: MetricId,
}

const F_IDLE: &str = "1-byte round trip, idle, p50";
const F_UP: &str = "one stream up";
const F_DOWN: &str = "one stream down";
/// One stream up and one stream down, per profile (the WAN chart draws them).
pub(crate) const ONE_STREAM: [FigureId; 2] = [FigureId::new(SC, F_UP), FigureId::new(SC, F_DOWN)];
const F_AGG16: &str = "16 streams down, aggregate";
const F_SLOW16: &str = "16 streams down, slowest stream";
const F_AGG64: &str = "64 streams down, aggregate";
const F_RSS64: &str = "RSS of both ends, 64 streams down";

/// The round trip of 1 byte during one stream `during` ("up" or "down"), quantile `q`.
fn f_rt(during: &str, q: &str) -> &'static str {
    match (during, q) {
        ("up", "p50") => "1-byte round trip during one stream up, p50",
        ("up", _) => "1-byte round trip during one stream up, p99",
        (_, "p50") => "1-byte round trip during one stream down, p50",
        _ => "1-byte round trip during one stream down, p99",
    }
}

/// Figure `f` (one of the `F_` names or [`f_rt`]'s) of every profile: the profile's name is its
/// parameter.
fn fig(f: &'static str) -> FigureId {
    FigureId::new(SC, f)
}

impl Rows {
    fn new(res: &mut Results, p: &Profile) -> Self {
        let n = p.name();
        let mut m =
            |f: &'static str, unit: &str, better: Better| res.figure_at(fig(f), &n, &format!("{n}: {f}"), unit, better);
        Self {
            idle: m(F_IDLE, "ms", Better::Lower),
            up: m(F_UP, "Mbit/s", Better::Higher),
            up_rt: [m(f_rt("up", "p50"), "ms", Better::Lower), m(f_rt("up", "p99"), "ms", Better::Lower)],
            down: m(F_DOWN, "Mbit/s", Better::Higher),
            down_rt: [m(f_rt("down", "p50"), "ms", Better::Lower), m(f_rt("down", "p99"), "ms", Better::Lower)],
            agg16: m(F_AGG16, "Mbit/s", Better::Higher),
            slow16: m(F_SLOW16, "Mbit/s", Better::Higher),
            agg64: m(F_AGG64, "Mbit/s", Better::Higher),
            rss64: m(F_RSS64, "MiB", Better::Lower),
        }
    }

    fn all(&self) -> Vec<MetricId> {
        let mut v = vec![self.idle, self.up, self.down, self.agg16, self.slow16, self.agg64, self.rss64];
        v.extend(self.up_rt);
        v.extend(self.down_rt);
        v
    }
}

/// Why a scenario on the link emulator cannot run here, if it cannot.
pub(super) fn unavailable() -> Option<&'static str> {
    if !testbed::netns::require_root() {
        return Some("needs root (network namespaces, TUN devices)");
    }
    if !std::path::Path::new("/dev/net/tun").exists() {
        return Some("/dev/net/tun missing (the link emulator's devices)");
    }
    None
}

pub(super) async fn run(ctx: &Ctx, res: &mut Results) -> anyhow::Result<()> {
    let profiles = profiles(ctx);
    let rows: Vec<(Profile, Rows)> = profiles.iter().map(|p| (*p, Rows::new(res, p))).collect();
    if let Some(why) = unavailable() {
        for (_, r) in &rows {
            for m in r.all() {
                for s in SYSTEMS {
                    res.skip(m, s.label(), s.kind(), why);
                }
            }
        }
        return Ok(());
    }
    remarks(res);
    let wan = Wan::new("bench-wan", NET, Shape::CLEAR, LinkOpts { realtime: true, ..LinkOpts::default() })?;
    let link = wan.link();
    // Every socket the harness opens from here on, and every process it starts without naming a
    // namespace, lives in the seed namespace.
    let _in_seed = wan.seed().enter()?;
    let (sink, source, echo) = {
        let _in_shoot = wan.shoot().enter()?;
        let ip = link.shoot_ip().into();
        (Sink::start_at(ip).await?, Source::start_at(ip).await?, Echo::start_at(ip).await?)
    };
    let t = Targets { sink: sink.addr(), source: source.addr(), echo: echo.addr() };
    let ends = Ends {
        far_netns: Some(wan.shoot().name().to_owned()),
        near_ip: link.seed_ip().into(),
        far_allow: vec![format!("{}/32", link.shoot_ip()), "127.0.0.0/8".into()],
    };
    if !link.realtime() {
        res.remark(SC, "the link's forwarder could not get SCHED_FIFO: it ran as an ordinary thread");
    }
    let repeats = ctx.scale.wan_repeats;
    for (p, rows) in &rows {
        eprintln!("bench: wan profile {}", p.name());
        link.set(Dir::BOTH, p.shape());
        let (cpu0, t0) = (link.cpu_time(), Instant::now());
        link.reset_peaks();
        let before = [link.stats(Dir::ToShoot), link.stats(Dir::ToSeed)];
        let mut slots = Vec::new();
        for s in SYSTEMS {
            slots.push(Slot::from(s.label(), s.kind(), s.start(ctx, &ends, &t).await));
        }
        for _ in 0..repeats {
            for (slot, sys) in slots.iter_mut().zip(SYSTEMS) {
                let Slot::Up(running) = slot else { continue };
                if let Some(Err(e)) = sys.cc().map(|cc| wan.set_congestion_control(cc)) {
                    for m in rows.all().into_iter().filter(|&m| running.kind != Kind::Direct || m != rows.rss64) {
                        record(res, m, &running.label, running.kind, Err(anyhow::anyhow!("{e:#}")));
                    }
                    continue;
                }
                measure(ctx, res, &wan, p, rows, running, &t, &sink).await;
            }
        }
        if let Some(cc) = System::H2.cc() {
            wan.set_congestion_control(cc)?;
        }
        record_skips(res, &rows.all(), &slots);
        drop(slots);
        quiet(link, p.rtt()).await;
        let after = [link.stats(Dir::ToShoot), link.stats(Dir::ToSeed)];
        let secs = t0.elapsed().as_secs_f64();
        let cpu = (link.cpu_time().saturating_sub(cpu0)).as_secs_f64() / secs;
        link_remark(res, p, link, secs, cpu, before, after);
    }
    Ok(())
}

/// The scenario's fixed remarks: topology, sysctls, timing.
fn remarks(res: &mut Results) {
    res.remark(
        SC,
        &format!(
            "link: a TUN device in a seed and a shoot namespace, MTU {}, no offloads; one forwarder thread for both \
             directions (SCHED_FIFO, on the harness's CPU) applies the one-way delay (half the round trip), the rate limit behind a FIFO \
             bottleneck holding 50 ms at that rate (tail drop), and the loss (each direction, seeded); both namespaces: \
             net.ipv4.tcp_rmem = {}, tcp_wmem = {}, TCP across the link with BBR (the link's routes' congctl; Cubic for the direct (cubic) row), metrics flushed before every transfer",
            testbed::link::MTU,
            testbed::link::TCP_RMEM,
            testbed::link::TCP_WMEM,
        ),
    );
    res.remark(
        SC,
        &format!(
            "seedgate: proxy-server (seed namespace, agents listener on the seed's link address) and proxy-agent (shoot \
             namespace) over h2 (mTLS HTTP/2 over TCP with BBR) or QUIC (congestion control: {}); load: CONNECT \
             <target> at proxy-server's front end; rathole (tcp transport: a connection across the link per visitor) and \
             ssh -R (one SSH connection, a channel per visitor) likewise across the link; direct: the harness in the seed \
             namespace to the targets in the shoot namespace, with BBR, and with Cubic",
            systems::quic_congestion_control()
        ),
    );
    res.remark(
        SC,
        "per transfer: a warm-up of 20 round trips (2–6 s; half of it for 16 and 64 streams, whose aggregate opens \
         faster) before a window of 20 round trips (3–6 s; 10 s where the transfer would run past 10 s, at 300 ms: \
         BBR's ProbeRTT comes to a busy connection every 10 s, so every system meets one in the window); round trips \
         during a transfer are 1 byte echoed on a second connection through the same tunnel, back to back, over the \
         window (p99 of a few dozen samples at 150–300 ms: close to their maximum); RSS is the largest of three \
         samples of both ends' processes during the 64-stream window",
    );
}

/// The emulator's own account of one profile.
fn link_remark(
    res: &mut Results,
    p: &Profile,
    link: &Link,
    secs: f64,
    cpu: f64,
    before: [testbed::link::LaneStats; 2],
    after: [testbed::link::LaneStats; 2],
) {
    let mut parts = Vec::new();
    for (i, dir) in ["to the shoot", "to the seed"].into_iter().enumerate() {
        let (a, b) = (&before[i], &after[i]);
        parts.push(format!(
            "{dir}: {} packets, {} tail-dropped, {} lost, {} later than 1 ms (latest {:.2} ms), bottleneck peak {} KB of {} KB",
            b.packets - a.packets,
            b.tail_dropped - a.tail_dropped,
            b.lost - a.lost,
            b.late - a.late,
            b.max_late.as_secs_f64() * 1e3,
            b.max_queue_bytes / 1000,
            p.shape().queue / 1000,
        ));
    }
    let drops = match link.device_drops() {
        Ok(n) => n.to_string(),
        Err(e) => format!("unknown ({e:#})"),
    };
    res.remark(
        SC,
        &format!(
            "emulator, {}: {:.0} s; the forwarder used {:.0} % of a CPU over the profile; {}; packets the TUN devices \
             dropped before the forwarder read them (whole run so far): {drops}",
            p.name(),
            secs,
            cpu * 100.0,
            parts.join("; ")
        ),
    );
}

/// Wait until the link holds (almost) nothing for a round trip: what earlier transfers left on
/// it must not count in the next one. At most 15 s.
async fn quiet(link: &Link, rtt: Duration) {
    let deadline = Instant::now() + Duration::from_secs(15);
    let need = rtt + Duration::from_millis(100);
    let mut since = Instant::now();
    // Bounded by the deadline.
    while Instant::now() < deadline {
        if link.held_bytes() > 64 * 1024 {
            since = Instant::now();
        } else if since.elapsed() >= need {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn mbit(gbit: f64) -> f64 {
    gbit * 1000.0
}

fn ms(l: &Latencies, q: f64) -> f64 {
    l.quantile_us(q) / 1000.0
}

/// Every figure of one system on one profile.
#[allow(clippy::too_many_arguments)]
async fn measure(
    ctx: &Ctx,
    res: &mut Results,
    wan: &Wan,
    p: &Profile,
    rows: &Rows,
    sys: &mut Running,
    t: &Targets,
    sink: &Sink,
) {
    let (warmup, window) = p.timing(ctx.smoke);
    let rtt = p.rtt();
    let link = wan.link();
    let (label, kind) = (sys.label.clone(), sys.kind);
    let fresh = || {
        // A failed flush only means a cached threshold may shape the next connection's start.
        let _ = wan.forget_tcp_metrics();
    };

    fresh();
    let r = async {
        let (addr, pre) = route(sys, t, "echo")?;
        round_trips(addr, &pre, b"i", 1000.0, 2 * rtt, 8 * rtt + Duration::from_millis(200)).await
    }
    .await;
    record(res, rows.idle, &label, kind, r.map(|l| ms(&l, 0.5)));

    for up in [true, false] {
        fresh();
        let r = with_round_trips(sys, t, sink, up, warmup, window).await;
        let r = r.and_then(|v| sys.check_alive().map(|()| v));
        let (m_rate, m_rt) = if up { (rows.up, rows.up_rt) } else { (rows.down, rows.down_rt) };
        match r {
            Ok((rate, lat)) => {
                record(res, m_rate, &label, kind, Ok(mbit(rate)));
                record(res, m_rt[0], &label, kind, Ok(ms(&lat, 0.5)));
                record(res, m_rt[1], &label, kind, Ok(ms(&lat, 0.99)));
            }
            Err(e) => {
                for m in [m_rate, m_rt[0], m_rt[1]] {
                    record(res, m, &label, kind, Err(anyhow::anyhow!("{e:#}")));
                }
            }
        }
        quiet(link, rtt).await;
    }

    fresh();
    let r = async {
        let (addr, pre) = route(sys, t, "source")?;
        bulk_download_each(addr, &pre, 16, false, warmup / 2, window).await
    }
    .await
    .and_then(|v| sys.check_alive().map(|()| v));
    match r {
        Ok(each) => {
            record(res, rows.agg16, &label, kind, Ok(mbit(each.iter().sum())));
            let slowest = each.iter().copied().fold(f64::INFINITY, f64::min);
            record(res, rows.slow16, &label, kind, Ok(mbit(slowest)));
        }
        Err(e) => {
            for m in [rows.agg16, rows.slow16] {
                record(res, m, &label, kind, Err(anyhow::anyhow!("{e:#}")));
            }
        }
    }
    quiet(link, rtt).await;

    fresh();
    let r = async {
        let (addr, pre) = route(sys, t, "source")?;
        let sample = async {
            tokio::time::sleep(warmup / 2 + window / 4).await;
            let mut top = 0;
            for _ in 0..3 {
                top = top.max(sys.rss_kib());
                tokio::time::sleep(window / 4).await;
            }
            top
        };
        let (each, rss) = tokio::join!(bulk_download_each(addr, &pre, 64, false, warmup / 2, window), sample);
        anyhow::Ok((each?, rss))
    }
    .await;
    let r = r.and_then(|v| sys.check_alive().map(|()| v));
    match r {
        Ok((each, rss)) => {
            record(res, rows.agg64, &label, kind, Ok(mbit(each.iter().sum())));
            if kind != Kind::Direct {
                record(res, rows.rss64, &label, kind, Ok(rss as f64 / 1024.0));
                let split: Vec<String> = sys
                    .rss_by_process()
                    .iter()
                    .map(|(n, kib)| format!("{n} {:.1} MiB", *kib as f64 / 1024.0))
                    .collect();
                res.note_split(rows.rss64, &label, kind, &format!("after the transfer: {}", split.join(", ")));
            }
        }
        Err(e) => {
            for m in [rows.agg64, rows.rss64] {
                if kind == Kind::Direct && m == rows.rss64 {
                    continue;
                }
                record(res, m, &label, kind, Err(anyhow::anyhow!("{e:#}")));
            }
        }
    }
    quiet(link, rtt).await;
}

/// One bulk stream (up: to the sink; down: from the source) and, over its measuring window, 1-byte
/// round trips on a second connection through the same system. Gbit/s of the bulk stream and
/// the round trips.
async fn with_round_trips(
    sys: &Running,
    t: &Targets,
    sink: &Sink,
    up: bool,
    warmup: Duration,
    window: Duration,
) -> anyhow::Result<(f64, Latencies)> {
    let (eaddr, epre) = route(sys, t, "echo")?;
    let (baddr, bpre) = route(sys, t, if up { "sink" } else { "source" })?;
    let bulk = async {
        if up {
            bulk_upload(baddr, &bpre, 1, sink, warmup, window).await
        } else {
            Ok(bulk_download_each(baddr, &bpre, 1, false, warmup, window).await?.iter().sum())
        }
    };
    // The round trips start once the bulk stream's window is open and stop before it closes.
    let pings = async {
        tokio::time::sleep(warmup).await;
        round_trips(eaddr, &epre, b"x", 1000.0, Duration::ZERO, window.mul_f64(0.9)).await
    };
    let (b, l) = tokio::join!(bulk, pings);
    Ok((b?, l.context("the round trips")?))
}

/// The emulator carries the link's rate if the kernel's TCP gets ≥ 0.9× of it through with
/// either of its controllers: the better of direct TCP with BBR and with Cubic, which ran in the
/// same profile. Either alone can fall short for its own reasons: 64 BBR flows on one tail-drop
/// queue of 50 ms lose a few per cent to each other's probing at 150 ms and 300 Mbit/s, where
/// Cubic fills the link. A controller left out of the run (`--only`) is left out here; with
/// neither, or a figure never recorded, the row is not evaluated.
fn emulator_rate(t: &mut report::Targets<'_>, profile: &str, f: &'static str, mbit: f64) {
    let what = format!(
        "emulator, {profile}: direct TCP {f}, the better of bbr and cubic, ≥ 0.9× the link's {} Mbit/s",
        fmt_num(mbit)
    );
    let reads =
        [("bbr", t.read(at(fig(f), profile, DIRECT_BBR))), ("cubic", t.read(at(fig(f), profile, DIRECT_CUBIC)))];
    let values: Vec<(&str, f64)> =
        reads.iter().filter_map(|(cc, r)| if let Read::Value(v) = r { Some((*cc, *v)) } else { None }).collect();
    let missing = reads.iter().any(|(_, r)| matches!(r, Read::Missing(_)));
    let best = values.iter().map(|&(_, v)| v).reduce(f64::max);
    let Some(best) = best.filter(|_| !missing) else {
        let reads: Vec<Read> = reads.into_iter().map(|(_, r)| r).collect();
        return t.not_evaluated(&what, &reads);
    };
    let shown: Vec<String> = values.iter().map(|(cc, v)| format!("{cc} {}", fmt_num(*v))).collect();
    t.push(&what, format!("{} Mbit/s", shown.join(", ")), best >= 0.9 * mbit);
}

/// The targets of the WAN figures, one row per profile run and figure.
pub(super) fn targets(t: &mut report::Targets<'_>) {
    let names: Vec<String> = t.res.params(fig(F_UP)).into_iter().map(str::to_owned).collect();
    if names.is_empty() {
        t.not_evaluated("wan figures", &[Read::Missing(format!("figure {SC}/{F_UP} not recorded for any profile"))]);
    }
    let ratio =
        |v: &[f64]| Some((format!("{} ÷ {} = {:.2}×", fmt_num(v[0]), fmt_num(v[1]), v[0] / v[1]), v[0] >= 0.9 * v[1]));
    for name in &names {
        let Some(p) = Profile::parse(&format!("{name}: x")) else { continue };
        let n = name.as_str();
        let q = |f: &'static str, sys: &'static str| at(fig(f), n, sys);
        if p.loss_pct == 0.0 {
            // One BBR stream whose window spans a ProbeRTT gives up to 8 % of the rate to it (at
            // 300 ms): there the link's rate is shown by 64 streams, whose ProbeRTTs fall apart.
            let one = if p.spans_probe_rtt() { &[][..] } else { &[F_UP, F_DOWN][..] };
            for &f in one.iter().chain(&[F_AGG64]) {
                emulator_rate(t, n, f, p.mbit);
            }
            let rtt = f64::from(p.rtt_ms);
            t.value(
                &format!("emulator, {n}: idle round trip of {DIRECT_BBR} = the configured {} ms (+2 %)", p.rtt_ms),
                q(F_IDLE, DIRECT_BBR),
                |o| format!("{o:.2} ms"),
                |o| o >= rtt && o <= rtt * 1.02,
            );
        }
        for (sys, short) in [(H2, "h2"), (QUIC, "QUIC")] {
            let reference = if p.loss_pct > 0.0 && sys == QUIC { H2 } else { DIRECT_BBR };
            let rshort = if reference == H2 { "h2" } else { "direct" };
            // Under loss the targets are for one stream only.
            let figures: &[&'static str] = if p.loss_pct > 0.0 { &[F_UP, F_DOWN] } else { &[F_UP, F_DOWN, F_AGG16] };
            for &f in figures {
                t.check(&format!("{n}: {short} {f} ≥ 0.9× {rshort}"), &[q(f, sys), q(f, reference)], ratio);
            }
            if p.loss_pct > 0.0 {
                continue;
            }
            t.check(
                &format!("{n}: {short} slowest of 16 streams ≥ 0.5× a fair share (its aggregate ÷ 16)"),
                &[q(F_SLOW16, sys), q(F_AGG16, sys)],
                |v| {
                    Some((
                        format!("{} of a fair {} Mbit/s", fmt_num(v[0]), fmt_num(v[1] / 16.0)),
                        v[0] >= 0.5 * v[1] / 16.0,
                    ))
                },
            );
            if p.rtt_ms <= 150 {
                for during in ["up", "down"] {
                    let f = f_rt(during, "p99");
                    t.check(
                        &format!("{n}: {short} 1-byte round trip p99 during one stream {during} ≤ 1.25× direct's"),
                        &[q(f, sys), q(f, DIRECT_BBR)],
                        |v| Some((format!("{:.0} ÷ {:.0} ms = {:.2}×", v[0], v[1], v[0] / v[1]), v[0] <= 1.25 * v[1])),
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_profile_is_read_back_from_its_metric_names() {
        for p in [
            Profile { rtt_ms: 50, mbit: 100.0, loss_pct: 0.0 },
            Profile { rtt_ms: 300, mbit: 1500.0, loss_pct: 0.0 },
            Profile { rtt_ms: 50, mbit: 100.0, loss_pct: 0.5 },
        ] {
            assert_eq!(Profile::parse(&format!("{}: {F_UP}", p.name())), Some(p), "{}", p.name());
        }
        assert_eq!(Profile::parse("no profile here"), None);
    }

    #[test]
    fn a_window_spans_bbrs_probe_rtt_cycle_where_the_transfer_runs_past_one() {
        let timing = |rtt_ms| Profile { rtt_ms, mbit: 100.0, loss_pct: 0.0 }.timing(false);
        let s = Duration::from_secs_f64;
        assert_eq!(timing(50), (s(2.0), s(3.0)), "5 s in all: no ProbeRTT for a fresh connection");
        assert_eq!(timing(150), (s(3.0), s(3.0)));
        assert_eq!(timing(300), (s(6.0), PROBE_RTT_CYCLE), "20 round trips each would be 12 s");
        assert_eq!(Profile { rtt_ms: 300, mbit: 100.0, loss_pct: 0.0 }.timing(true), (s(0.5), s(0.5)));
        assert!(Profile { rtt_ms: 300, mbit: 100.0, loss_pct: 0.0 }.spans_probe_rtt());
        assert!(!Profile { rtt_ms: 150, mbit: 300.0, loss_pct: 0.0 }.spans_probe_rtt());
    }

    #[test]
    fn a_missing_figure_is_a_target_row_that_says_so() {
        use crate::report::Verdict;
        let mut r = Results::default();
        let p = Profile { rtt_ms: 50, mbit: 100.0, loss_pct: 0.0 };
        let up = r.figure_at(fig(F_UP), p.name(), &format!("{}: {F_UP}", p.name()), "Mbit/s", Better::Higher);
        r.add(up, DIRECT_BBR, Kind::Direct, 95.0);
        r.add(up, H2, Kind::Seedgate, 50.0);
        r.skip(up, QUIC, Kind::Seedgate, "did not start");
        let mut t = report::Targets::new(&r, true);
        targets(&mut t);
        let t = t.rows;
        let find = |what: &str| t.iter().find(|t| t.what.contains(what)).unwrap_or_else(|| panic!("{what}: {t:?}"));
        assert_eq!(find("h2 one stream up ≥ 0.9× direct").verdict, Verdict::Unmet);
        assert!(find("h2 one stream up ≥ 0.9× direct").value.contains("0.53×"));
        // A system that did not start is shown, not evaluated (its own row fails the run).
        let q = find("QUIC one stream up ≥ 0.9× direct");
        assert_eq!(q.verdict, Verdict::Unavailable);
        assert!(q.value.contains(QUIC) && q.value.contains("skipped: did not start"), "{q:?}");
        // Direct TCP with Cubic has no row in this figure: the scenario and its targets disagree.
        assert_eq!(find("direct TCP one stream up, the better of").verdict, Verdict::Missing);
        // A figure never recorded is missing, which fails the run.
        assert_eq!(find("h2 one stream down ≥ 0.9× direct").verdict, Verdict::Missing);
    }

    #[test]
    fn the_emulator_carries_the_rate_if_either_kernel_controller_gets_it_through() {
        use crate::report::Verdict;
        let p = Profile { rtt_ms: 150, mbit: 300.0, loss_pct: 0.0 };
        let verdict = |bbr: Option<f64>, cubic: Option<f64>| {
            let mut r = Results::default();
            let id = r.figure_at(fig(F_AGG64), p.name(), &format!("{}: {F_AGG64}", p.name()), "Mbit/s", Better::Higher);
            for (sys, v) in [(DIRECT_BBR, bbr), (DIRECT_CUBIC, cubic)] {
                match v {
                    Some(v) => r.add(id, sys, Kind::Direct, v),
                    None => r.skip(id, sys, Kind::Direct, "left out by --only"),
                }
            }
            let mut t = report::Targets::new(&r, true);
            emulator_rate(&mut t, &p.name(), F_AGG64, p.mbit);
            let row = t.rows.pop().expect("one row");
            (row.verdict, row.value)
        };
        // 270 is 0.9× of 300 Mbit/s.
        assert_eq!(verdict(Some(264.0), Some(290.0)), (Verdict::Met, "bbr 264, cubic 290 Mbit/s".to_owned()));
        assert_eq!(verdict(Some(290.0), Some(264.0)).0, Verdict::Met);
        assert_eq!(verdict(Some(264.0), Some(269.0)).0, Verdict::Unmet);
        assert_eq!(verdict(Some(264.0), None), (Verdict::Unmet, "bbr 264 Mbit/s".to_owned()));
        assert_eq!(verdict(None, Some(270.0)).0, Verdict::Met);
        assert_eq!(verdict(None, None).0, Verdict::Unavailable);
    }
}
