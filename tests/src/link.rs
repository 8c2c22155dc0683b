//! A WAN link emulated in user space between two network namespaces (a seed and a shoot): one-way
//! delay, a rate limit behind a bounded FIFO bottleneck, random loss and a black hole, per
//! direction, changeable while traffic flows.
//!
//! Each namespace gets a TUN device (`wan<net>`, MTU 1500, no offloads: the kernel hands over
//! and takes back plain IP packets) holding `10.<net>.0.1` (seed) or `10.<net>.0.2` (shoot) as a
//! point-to-point link. One OS thread, the forwarder, reads the packets each side's stack writes
//! into its device and writes them into the other side's device when their time has come. The
//! model of a direction, applied to each packet read at time `t`:
//!
//! 1. black hole on: dropped;
//! 2. with probability `loss`: dropped (a generator seeded per link and direction, so the same
//!    seed drops the same packets of the same sequence);
//! 3. with a `rate`: the bottleneck sends one packet after the other at that rate, so the packet
//!    would leave it at `max(t, when the one before left) + size / rate`; if the bytes still
//!    waiting there (the packet being sent included) plus its own would exceed `queue`, it is
//!    dropped instead (tail drop);
//! 4. it is delivered `delay` after it left the bottleneck (at `t + delay` without a rate).
//!
//! Packets leave in the order they came. A change of shape applies to packets read after it;
//! packets already on their way keep their times (a path that goes black still delivers what had
//! passed the break). Every packet is accounted for in [`LaneStats`], and so is how late the
//! forwarder wrote a packet against its due time: the emulator's own error.
//!
//! The forwarder is a plain thread waiting in `ppoll` with nanosecond timeouts, not a task of an
//! async runtime (whose timers tick in milliseconds and which the systems under test share); it
//! serves both directions in turns, a batch of reads each, then what is due, so neither waits
//! behind the other's burst. With [`LinkOpts::realtime`] it runs under `SCHED_FIFO`, so that
//! other work on the machine delays a packet by microseconds, not by a scheduler time slice.
//! Writing a packet into a TUN device runs the receiving stack in the writer's thread, so the
//! forwarder's CPU time ([`Link::cpu_time`]) includes the receivers' kernel work: one CPU's worth
//! is the emulator's ceiling.
//!
//! Both namespaces get TCP buffer limits that let one connection keep a bandwidth-delay product
//! of tens of megabytes in flight ([`TCP_RMEM`], [`TCP_WMEM`]) and IPv6 off on the link (so that
//! router solicitations do not count as traffic); TCP across a link uses BBR where the kernel
//! has it ([`Link::set_congestion_control`] changes it).

use crate::netns::Netns;
use anyhow::{Context as _, bail};
use rand::{Rng as _, SeedableRng as _};
use std::collections::VecDeque;
use std::fs::File;
use std::io::{Read as _, Write as _};
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// `net.ipv4.tcp_rmem` in both namespaces: the usual minimum and default, and a maximum of
/// 64 MiB (what is recommended for hosts that move data across long paths at gigabit rates),
/// so that the receive window autotunes up to the path's bandwidth-delay product.
pub const TCP_RMEM: &str = "4096 131072 67108864";
/// `net.ipv4.tcp_wmem` in both namespaces: the usual minimum and default, and 64 MiB, so that a
/// sender can keep a window of tens of megabytes unacknowledged.
pub const TCP_WMEM: &str = "4096 16384 67108864";
/// The link's MTU: a WAN's, no jumbo frames.
pub const MTU: usize = 1500;
/// Packets a TUN device holds for its reader before it drops (its `txqueuelen`).
const DEVICE_QUEUE: u32 = 1000;
/// Longest wait of a forwarder between looks at its stop flag and its shape.
const MAX_WAIT: Duration = Duration::from_millis(5);
/// Packets read in one go before due packets are written.
const READ_BATCH: usize = 64;
/// Bytes one direction holds at most (bottleneck and delay line together); beyond this a packet
/// is dropped and counted as an overflow. 256 MiB: 2 s at 1 Gbit/s.
const MAX_HELD: u64 = 256 << 20;
/// A delivery later than this against its due time counts as late.
const LATE: Duration = Duration::from_millis(1);

/// What one direction of the link does to packets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    /// One-way delay.
    pub delay: Duration,
    /// Bottleneck rate in bit/s; `None`: no limit (and no queue).
    pub rate: Option<u64>,
    /// Bytes the bottleneck holds, the packet being sent included; a packet that would not fit
    /// is dropped (tail drop). Only with a `rate`.
    pub queue: u64,
    /// Probability that a packet is lost, independently of the others (0.0 to 1.0).
    pub loss: f64,
    /// Drop every packet.
    pub black_hole: bool,
}

impl Shape {
    /// No delay, no limit, no loss.
    pub const CLEAR: Shape = Shape { delay: Duration::ZERO, rate: None, queue: 0, loss: 0.0, black_hole: false };

    /// One direction of a WAN path of round-trip time `rtt` (half of it each way) and `rate` bit/s,
    /// whose bottleneck holds 50 ms of traffic at that rate.
    pub fn wan(rtt: Duration, rate: u64) -> Self {
        Shape { delay: rtt / 2, rate: Some(rate), queue: rate / 8 / 20, ..Self::CLEAR }
    }

    /// The same with random loss `p` (0.0 to 1.0).
    pub fn with_loss(self, p: f64) -> Self {
        Shape { loss: p, ..self }
    }
}

/// A direction of the link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// Packets from the seed to the shoot.
    ToShoot,
    /// Packets from the shoot to the seed.
    ToSeed,
}

impl Dir {
    /// Both directions, for the setters.
    pub const BOTH: &'static [Dir] = &[Dir::ToShoot, Dir::ToSeed];
}

/// Options of a link that do not change while it runs.
#[derive(Debug, Clone, Copy)]
pub struct LinkOpts {
    /// Seed of the loss generators (each direction derives its own).
    pub rng_seed: u64,
    /// Run the forwarder under `SCHED_FIFO` (root; if refused it runs as an ordinary thread and
    /// [`Link::realtime`] says so).
    pub realtime: bool,
}

impl Default for LinkOpts {
    fn default() -> Self {
        Self { rng_seed: 1, realtime: false }
    }
}

/// What one direction did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LaneStats {
    /// Packets and bytes read from the sending side.
    pub packets: u64,
    pub bytes: u64,
    /// Packets and bytes written into the receiving side.
    pub delivered: u64,
    pub delivered_bytes: u64,
    /// Dropped by random loss, by the bottleneck's tail drop, by the black hole, and because the
    /// direction held too much (only without a rate limit).
    pub lost: u64,
    pub tail_dropped: u64,
    pub black_holed: u64,
    pub overflowed: u64,
    /// Reads or writes the kernel refused.
    pub errors: u64,
    /// Deliveries later than 1 ms against their due time, and the latest one.
    pub late: u64,
    pub max_late: Duration,
    /// Bytes held now (bottleneck and delay line) and the most the bottleneck ever held.
    pub held_bytes: u64,
    pub max_queue_bytes: u64,
}

impl LaneStats {
    /// Packets that went in and will not come out: every drop.
    pub fn dropped(&self) -> u64 {
        self.lost + self.tail_dropped + self.black_holed + self.overflowed
    }
}

/// A lane's counters, written by its thread and read by anyone.
#[derive(Debug, Default)]
struct Counters {
    packets: AtomicU64,
    bytes: AtomicU64,
    delivered: AtomicU64,
    delivered_bytes: AtomicU64,
    lost: AtomicU64,
    tail_dropped: AtomicU64,
    black_holed: AtomicU64,
    overflowed: AtomicU64,
    errors: AtomicU64,
    late: AtomicU64,
    max_late_ns: AtomicU64,
    held_bytes: AtomicU64,
    max_queue_bytes: AtomicU64,
}

/// What a lane shares with the [`Link`] handle.
#[derive(Debug)]
struct LaneShared {
    shape: Mutex<Shape>,
    /// Bumped on every change of `shape`, so the thread copies it only then.
    version: AtomicU64,
    counters: Counters,
}

impl LaneShared {
    fn stats(&self) -> LaneStats {
        let c = &self.counters;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        LaneStats {
            packets: g(&c.packets),
            bytes: g(&c.bytes),
            delivered: g(&c.delivered),
            delivered_bytes: g(&c.delivered_bytes),
            lost: g(&c.lost),
            tail_dropped: g(&c.tail_dropped),
            black_holed: g(&c.black_holed),
            overflowed: g(&c.overflowed),
            errors: g(&c.errors),
            late: g(&c.late),
            max_late: Duration::from_nanos(g(&c.max_late_ns)),
            held_bytes: g(&c.held_bytes),
            max_queue_bytes: g(&c.max_queue_bytes),
        }
    }
}

/// One direction's state inside its thread: the model of the module doc.
struct Model {
    shape: Shape,
    rng: rand::rngs::StdRng,
    /// When the bottleneck finishes sending what it holds (ns on the link's clock).
    free_at: u64,
    /// The latest due time handed out (deliveries stay in order when the delay shrinks).
    last_due: u64,
    /// Bytes held (bottleneck and delay line).
    held: u64,
}

/// What the model decided for a packet.
#[derive(Debug, PartialEq, Eq)]
enum Fate {
    Deliver { due: u64, backlog: u64 },
    Lost,
    TailDrop,
    BlackHole,
    Overflow,
}

impl Model {
    fn admit(&mut self, len: u64, now: u64) -> Fate {
        let s = self.shape;
        if s.black_hole {
            return Fate::BlackHole;
        }
        if s.loss > 0.0 && self.rng.random::<f64>() < s.loss {
            return Fate::Lost;
        }
        if self.held + len > MAX_HELD {
            return Fate::Overflow;
        }
        let (left, backlog) = match s.rate {
            Some(rate) if rate > 0 => {
                let start = self.free_at.max(now);
                // Bytes still waiting ahead of this packet: what the bottleneck sends until it is free.
                let ahead =
                    u64::try_from(u128::from(start - now) * u128::from(rate) / 8_000_000_000).unwrap_or(u64::MAX);
                if ahead + len > s.queue {
                    return Fate::TailDrop;
                }
                let send = u64::try_from(u128::from(len) * 8_000_000_000 / u128::from(rate)).unwrap_or(u64::MAX);
                self.free_at = start + send;
                (self.free_at, ahead + len)
            }
            _ => (now, 0),
        };
        let delay = u64::try_from(s.delay.as_nanos()).unwrap_or(u64::MAX);
        let due = left.saturating_add(delay).max(self.last_due);
        self.last_due = due;
        self.held += len;
        Fate::Deliver { due, backlog }
    }
}

/// One direction inside the forwarder: where packets come from and go to, its model, and the
/// packets on their way (due time, bytes), oldest first.
struct Lane {
    input: File,
    output: File,
    shared: Arc<LaneShared>,
    version: u64,
    model: Model,
    line: VecDeque<(u64, Vec<u8>)>,
}

impl Lane {
    /// Take a changed shape.
    fn refresh(&mut self) {
        let v = self.shared.version.load(Ordering::Acquire);
        if v != self.version {
            self.version = v;
            self.model.shape = *self.shared.shape.lock().unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Read what the sending side has written, up to a batch; true when nothing more waits.
    fn read(&mut self, clock: &Clock, buf: &mut [u8], spare: &mut Vec<Vec<u8>>) -> bool {
        let c = &self.shared.counters;
        for _ in 0..READ_BATCH {
            match (&self.input).read(buf) {
                Ok(0) => return true,
                Ok(n) => {
                    let Some(pkt) = buf.get(..n) else { continue };
                    let len = n as u64;
                    c.packets.fetch_add(1, Ordering::Relaxed);
                    c.bytes.fetch_add(len, Ordering::Relaxed);
                    match self.model.admit(len, clock.now()) {
                        Fate::Deliver { due, backlog } => {
                            c.max_queue_bytes.fetch_max(backlog, Ordering::Relaxed);
                            let mut p = spare.pop().unwrap_or_default();
                            p.clear();
                            p.extend_from_slice(pkt);
                            self.line.push_back((due, p));
                        }
                        Fate::Lost => bump(&c.lost),
                        Fate::TailDrop => bump(&c.tail_dropped),
                        Fate::BlackHole => bump(&c.black_holed),
                        Fate::Overflow => bump(&c.overflowed),
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => {
                    bump(&c.errors);
                    return true;
                }
            }
        }
        false
    }

    /// Write every packet whose time has come into the receiving side.
    fn deliver(&mut self, clock: &Clock, spare: &mut Vec<Vec<u8>>) {
        let c = &self.shared.counters;
        // Bounded by the packets on their way.
        while let Some((due, _)) = self.line.front() {
            let now = clock.now();
            if *due > now {
                break;
            }
            let Some((due, p)) = self.line.pop_front() else { break };
            let len = p.len() as u64;
            self.model.held -= len;
            match (&self.output).write(&p) {
                Ok(_) => {
                    c.delivered.fetch_add(1, Ordering::Relaxed);
                    c.delivered_bytes.fetch_add(len, Ordering::Relaxed);
                }
                Err(_) => bump(&c.errors),
            }
            let late = now - due;
            if u128::from(late) > LATE.as_nanos() {
                bump(&c.late);
            }
            c.max_late_ns.fetch_max(late, Ordering::Relaxed);
            if spare.len() < 4096 {
                spare.push(p);
            }
        }
        c.held_bytes.store(self.model.held, Ordering::Relaxed);
    }

    fn next_due(&self) -> Option<u64> {
        self.line.front().map(|(due, _)| *due)
    }
}

/// Nanoseconds since the link started: the time every due date is on.
struct Clock(Instant);

impl Clock {
    fn now(&self) -> u64 {
        u64::try_from(self.0.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// The forwarder: one thread for both directions, so that neither waits behind the other's
/// burst (two threads of equal real-time priority on one CPU would take turns only when one
/// sleeps) and the machine gives the emulator one CPU's worth at most.
struct Forwarder {
    lanes: [Lane; 2],
    stop: Arc<AtomicBool>,
    clock: Clock,
    realtime: bool,
    cpu: Arc<(AtomicU64, AtomicBool)>,
}

impl Forwarder {
    fn run(mut self) {
        if let Some(tid) = thread_id() {
            self.cpu.0.store(tid, Ordering::Relaxed);
        }
        if self.realtime && set_realtime() {
            self.cpu.1.store(true, Ordering::Relaxed);
        }
        let mut spare: Vec<Vec<u8>> = Vec::new();
        let mut buf = vec![0u8; 65536];
        // Until the link is dropped; every wait is bounded by MAX_WAIT.
        while !self.stop.load(Ordering::Relaxed) {
            let mut drained = true;
            for lane in &mut self.lanes {
                lane.refresh();
                drained &= lane.read(&self.clock, &mut buf, &mut spare);
            }
            for lane in &mut self.lanes {
                lane.deliver(&self.clock, &mut spare);
            }
            if drained {
                let now = self.clock.now();
                let wait = match self.lanes.iter().filter_map(Lane::next_due).min() {
                    Some(due) => Duration::from_nanos(due.saturating_sub(now)),
                    None => MAX_WAIT,
                };
                let [a, b] = &self.lanes;
                if !wait.is_zero() && wait_readable(&[&a.input, &b.input], wait.min(MAX_WAIT)).is_err() {
                    bump(&a.shared.counters.errors);
                }
            }
        }
    }
}

fn bump(a: &AtomicU64) {
    a.fetch_add(1, Ordering::Relaxed);
}

/// The emulated link: two TUN devices, one in each namespace, and the forwarder between them.
/// Dropping it stops the forwarder and removes the devices (with their addresses and routes).
#[derive(Debug)]
pub struct Link {
    lanes: [Arc<LaneShared>; 2],
    thread: Option<std::thread::JoinHandle<()>>,
    /// The forwarder's thread id (0 until it started) and whether it got SCHED_FIFO.
    cpu: Arc<(AtomicU64, AtomicBool)>,
    stop: Arc<AtomicBool>,
    net: u8,
    device: String,
    namespaces: [String; 2],
}

impl Link {
    /// A link between `seed` and `shoot` on `10.<net>.0.0/30`, both directions shaped alike.
    pub fn new(seed: &Netns, shoot: &Netns, net: u8, shape: Shape, opts: LinkOpts) -> anyhow::Result<Self> {
        let device = format!("wan{net}");
        let seed_tun = open_tun(seed, &device)?;
        let shoot_tun = open_tun(shoot, &device)?;
        let (seed_ip, shoot_ip) = (Ipv4Addr::new(10, net, 0, 1), Ipv4Addr::new(10, net, 0, 2));
        for (ns, me, peer) in [(seed, seed_ip, shoot_ip), (shoot, shoot_ip, seed_ip)] {
            ns.ip(&["link", "set", "dev", &device, "mtu", &MTU.to_string(), "txqueuelen", &DEVICE_QUEUE.to_string()])?;
            ns.ip(&["addr", "add", &me.to_string(), "peer", &format!("{peer}/32"), "dev", &device])?;
            ns.ip(&["link", "set", "dev", &device, "up"])?;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let shared = || {
            Arc::new(LaneShared { shape: Mutex::new(shape), version: AtomicU64::new(0), counters: Counters::default() })
        };
        let lanes = [shared(), shared()];
        let cpu = Arc::new((AtomicU64::new(0), AtomicBool::new(false)));
        let ends = [(seed_tun.try_clone()?, shoot_tun.try_clone()?), (shoot_tun, seed_tun)];
        let lane = |i: u64, (input, output): (File, File), shared: &Arc<LaneShared>| {
            // Each direction its own stream of draws.
            let rng = rand::rngs::StdRng::seed_from_u64(opts.rng_seed.wrapping_mul(2).wrapping_add(i));
            let model = Model { shape, rng, free_at: 0, last_due: 0, held: 0 };
            Lane { input, output, shared: shared.clone(), version: 0, model, line: VecDeque::new() }
        };
        let [to_shoot, to_seed] = ends;
        let forwarder = Forwarder {
            lanes: [lane(0, to_shoot, &lanes[0]), lane(1, to_seed, &lanes[1])],
            stop: stop.clone(),
            clock: Clock(Instant::now()),
            realtime: opts.realtime,
            cpu: cpu.clone(),
        };
        let thread = std::thread::Builder::new()
            .name(format!("wan{net}-link"))
            .spawn(move || forwarder.run())
            .context("starting the link's forwarder")?;
        let link = Self {
            lanes,
            thread: Some(thread),
            cpu,
            stop,
            net,
            device,
            namespaces: [seed.name().to_owned(), shoot.name().to_owned()],
        };
        Ok(link)
    }

    /// The seed's address on the link (`10.<net>.0.1`).
    pub fn seed_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, self.net, 0, 1)
    }

    /// The shoot's address on the link (`10.<net>.0.2`).
    pub fn shoot_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, self.net, 0, 2)
    }

    /// The TUN device's name (the same in both namespaces).
    pub fn device(&self) -> &str {
        &self.device
    }

    fn lane(&self, dir: Dir) -> &LaneShared {
        match dir {
            Dir::ToShoot => &self.lanes[0],
            Dir::ToSeed => &self.lanes[1],
        }
    }

    /// Replace the shape of each direction in `dirs`.
    pub fn set(&self, dirs: &[Dir], shape: Shape) {
        self.update(dirs, |s| *s = shape);
    }

    /// Change the shape of each direction in `dirs` in place (e.g. `|s| s.black_hole = true`).
    pub fn update(&self, dirs: &[Dir], f: impl Fn(&mut Shape)) {
        for &d in dirs {
            let lane = self.lane(d);
            let mut s = lane.shape.lock().unwrap_or_else(|e| e.into_inner());
            f(&mut s);
            lane.version.fetch_add(1, Ordering::Release);
        }
    }

    /// Turn the black hole of each direction in `dirs` on or off.
    pub fn black_hole(&self, dirs: &[Dir], on: bool) {
        self.update(dirs, |s| s.black_hole = on);
    }

    /// The shape of one direction.
    pub fn shape(&self, dir: Dir) -> Shape {
        *self.lane(dir).shape.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What one direction did so far.
    pub fn stats(&self, dir: Dir) -> LaneStats {
        self.lane(dir).stats()
    }

    /// Start both directions' running maxima (the latest delivery, the bottleneck's peak) over,
    /// so that a later [`Link::stats`] gives those of one part of a run; the counters go on.
    pub fn reset_peaks(&self) {
        for &d in Dir::BOTH {
            let c = &self.lane(d).counters;
            c.max_late_ns.store(0, Ordering::Relaxed);
            c.max_queue_bytes.store(0, Ordering::Relaxed);
        }
    }

    /// Bytes on their way in both directions now.
    pub fn held_bytes(&self) -> u64 {
        Dir::BOTH.iter().map(|&d| self.stats(d).held_bytes).sum()
    }

    /// Whether the forwarder runs under `SCHED_FIFO` (asked for with [`LinkOpts::realtime`]).
    pub fn realtime(&self) -> bool {
        self.cpu.1.load(Ordering::Relaxed)
    }

    /// CPU time the forwarder used so far (with the receiving stacks' work it runs).
    pub fn cpu_time(&self) -> Duration {
        thread_cpu(self.cpu.0.load(Ordering::Relaxed)).unwrap_or_default()
    }

    /// The congestion control of TCP connections across this link made from now on, in both
    /// namespaces (the route's `congctl`; a connection keeps the one it started with). Unlike the
    /// namespace's default (`net.ipv4.tcp_congestion_control`, which a namespace may set only to
    /// what `tcp_allowed_congestion_control` lists), a route may name any the kernel has.
    pub fn set_congestion_control(&self, cc: &str) -> anyhow::Result<()> {
        for (ns, me, peer) in [
            (&self.namespaces[0], self.seed_ip(), self.shoot_ip()),
            (&self.namespaces[1], self.shoot_ip(), self.seed_ip()),
        ] {
            let (me, peer) = (me.to_string(), format!("{peer}/32"));
            crate::netns::ip_in(
                ns,
                &[
                    "route",
                    "replace",
                    &peer,
                    "dev",
                    &self.device,
                    "proto",
                    "kernel",
                    "scope",
                    "link",
                    "src",
                    &me,
                    "congctl",
                    cc,
                ],
            )
            .with_context(|| format!("setting {cc} on the link's route in {ns}"))?;
        }
        Ok(())
    }

    /// Packets the TUN devices dropped before a forwarder read them (their queue was full): the
    /// forwarder fell behind, which the model does not do. 0 when the emulator kept up.
    pub fn device_drops(&self) -> anyhow::Result<u64> {
        let mut n = 0;
        for ns in &self.namespaces {
            let out = crate::netns::ip_in(ns, &["-s", "-j", "link", "show", "dev", &self.device])?;
            let v: serde_json::Value = serde_json::from_str(&out).context("parsing `ip -j -s link`")?;
            n += v
                .get(0)
                .and_then(|d| d.pointer("/stats64/tx/dropped"))
                .and_then(serde_json::Value::as_u64)
                .with_context(|| format!("no tx dropped count in {out}"))?;
        }
        Ok(n)
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // The forwarder sees the flag within MAX_WAIT; its end closes the devices' descriptors,
        // which removes the devices.
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A seed and a shoot namespace joined by one emulated [`Link`] (more with [`Wan::add_path`]).
/// Dropping it stops the links and deletes both namespaces, on a panic too.
#[derive(Debug)]
pub struct Wan {
    // Dropped in this order: the links (their devices live in the namespaces), then these.
    links: Vec<Link>,
    seed: Netns,
    shoot: Netns,
}

impl Wan {
    /// Namespaces `<label>-seed` and `<label>-shoot` with [`TCP_RMEM`] and [`TCP_WMEM`], joined by
    /// a link on `10.<net>.0.0/30` shaped `shape` both ways, whose TCP uses BBR if the kernel has it.
    pub fn new(label: &str, net: u8, shape: Shape, opts: LinkOpts) -> anyhow::Result<Self> {
        let seed = Netns::create(&format!("{label}-seed"))?;
        let shoot = Netns::create(&format!("{label}-shoot"))?;
        for ns in [&seed, &shoot] {
            ns.sysctl(&[
                ("net.ipv4.tcp_rmem", TCP_RMEM),
                ("net.ipv4.tcp_wmem", TCP_WMEM),
                ("net.ipv6.conf.default.disable_ipv6", "1"),
            ])?;
        }
        let mut wan = Self { links: Vec::new(), seed, shoot };
        wan.add_path(net, shape, opts)?;
        Ok(wan)
    }

    /// Another path between the same namespaces, on `10.<net>.0.0/30` (e.g. to a second server
    /// replica that listens on this path's seed address), with BBR like the first; returns its
    /// index for [`Wan::path`].
    pub fn add_path(&mut self, net: u8, shape: Shape, opts: LinkOpts) -> anyhow::Result<usize> {
        if self.links.iter().any(|l| l.net == net) {
            bail!("a path on 10.{net}.0.0/30 exists already");
        }
        let link = Link::new(&self.seed, &self.shoot, net, shape, opts)?;
        if kernel_has("bbr") {
            link.set_congestion_control("bbr")?;
        }
        self.links.push(link);
        Ok(self.links.len() - 1)
    }

    pub fn seed(&self) -> &Netns {
        &self.seed
    }

    pub fn shoot(&self) -> &Netns {
        &self.shoot
    }

    /// The first path.
    pub fn link(&self) -> &Link {
        // `new` made one, and paths are never removed.
        self.links.first().expect("a Wan has its first path")
    }

    /// Path `i` (0 is the first).
    pub fn path(&self, i: usize) -> Option<&Link> {
        self.links.get(i)
    }

    /// The congestion control of new TCP connections across every path (e.g. "cubic"; see
    /// [`Link::set_congestion_control`]).
    pub fn set_congestion_control(&self, cc: &str) -> anyhow::Result<()> {
        self.links.iter().try_for_each(|l| l.set_congestion_control(cc))
    }

    /// Forget what the kernels learned about earlier connections across the link (`ip tcp_metrics
    /// flush`): a new connection then starts as the first one did, not from a cached slow-start
    /// threshold.
    pub fn forget_tcp_metrics(&self) -> anyhow::Result<()> {
        for ns in [&self.seed, &self.shoot] {
            ns.ip(&["tcp_metrics", "flush", "all"])?;
        }
        Ok(())
    }
}

/// Whether the kernel has TCP congestion control `cc` (e.g. "bbr").
pub fn kernel_has(cc: &str) -> bool {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_congestion_control")
        .is_ok_and(|a| a.split_whitespace().any(|c| c == cc))
}

/// Create a TUN device `name` (IP packets, no packet-information header, no offloads) inside
/// `ns`, non-blocking; it lives while a descriptor of it is open.
fn open_tun(ns: &Netns, name: &str) -> anyhow::Result<File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let bytes = name.as_bytes();
    if bytes.len() >= libc::IFNAMSIZ {
        bail!("device name {name} too long");
    }
    // The device is made in the namespace of the thread that asks for it.
    let _inside = ns.enter()?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open("/dev/net/tun")
        .context("opening /dev/net/tun")?;
    set_tun(&file, bytes).with_context(|| format!("creating TUN device {name} in {}", ns.name()))?;
    Ok(file)
}

/// TUNSETIFF on an open `/dev/net/tun`: make it the device `name` (shorter than IFNAMSIZ).
fn set_tun(file: &File, name: &[u8]) -> std::io::Result<()> {
    use std::os::fd::AsRawFd as _;
    // SAFETY: `req` is a zeroed ifreq we own (all-zero is a valid value of this plain C struct);
    // the name copied in is shorter than ifr_name, so it stays NUL-terminated; TUNSETIFF reads
    // and writes only that struct, and the descriptor is open for the call.
    #[allow(unsafe_code)]
    let rc = unsafe {
        let mut req: libc::ifreq = std::mem::zeroed();
        for (d, s) in req.ifr_name.iter_mut().zip(name) {
            *d = *s as libc::c_char;
        }
        req.ifr_ifru.ifru_flags = (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short;
        libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF, &mut req)
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Wait until one of `files` is readable or `timeout` passed (nanosecond resolution, unlike
/// poll(2)).
fn wait_readable(files: &[&File; 2], timeout: Duration) -> std::io::Result<()> {
    use std::os::fd::AsRawFd as _;
    let mut pfd = files.map(|f| libc::pollfd { fd: f.as_raw_fd(), events: libc::POLLIN, revents: 0 });
    let ts = libc::timespec {
        tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
        // Below 10^9: fits.
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: ppoll reads the two pollfds and the timespec, all ours and alive for the call,
    // writes only the pollfds' revents, and gets no signal mask (null).
    #[allow(unsafe_code)]
    let rc = unsafe { libc::ppoll(pfd.as_mut_ptr(), pfd.len() as libc::nfds_t, &ts, std::ptr::null()) };
    if rc < 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok(())
}

/// Move the calling thread to `SCHED_FIFO` (priority 10); false if refused.
fn set_realtime() -> bool {
    let p = libc::sched_param { sched_priority: 10 };
    // SAFETY: sched_setscheduler reads the sched_param we own for the call; pid 0 is the
    // calling thread.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &p) };
    rc == 0
}

/// The calling thread's id, from `/proc/thread-self` (a link to `<pid>/task/<tid>`).
fn thread_id() -> Option<u64> {
    let t = std::fs::read_link("/proc/thread-self").ok()?;
    t.file_name()?.to_str()?.parse().ok()
}

/// CPU time of thread `tid` of this process: nanoseconds on the CPU from `schedstat`.
fn thread_cpu(tid: u64) -> Option<Duration> {
    if tid == 0 {
        return None;
    }
    let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).ok()?;
    s.split_whitespace().next()?.parse().ok().map(Duration::from_nanos)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(shape: Shape) -> Model {
        Model { shape, rng: rand::rngs::StdRng::seed_from_u64(7), free_at: 0, last_due: 0, held: 0 }
    }

    #[test]
    fn the_bottleneck_serializes_at_its_rate_and_drops_at_the_tail() {
        // 8 Mbit/s: 1,000 bytes take 1 ms; the queue holds 3,000 bytes.
        let mut m =
            model(Shape { delay: Duration::from_millis(10), rate: Some(8_000_000), queue: 3000, ..Shape::CLEAR });
        let ms = 1_000_000;
        assert_eq!(m.admit(1000, 0), Fate::Deliver { due: ms + 10 * ms, backlog: 1000 });
        assert_eq!(m.admit(1000, 0), Fate::Deliver { due: 2 * ms + 10 * ms, backlog: 2000 });
        assert_eq!(m.admit(1000, 0), Fate::Deliver { due: 3 * ms + 10 * ms, backlog: 3000 });
        assert_eq!(m.admit(1000, 0), Fate::TailDrop);
        // Half a millisecond later 500 bytes have left: a 500-byte packet fits, a 1,000-byte one not.
        assert_eq!(m.admit(1000, ms / 2), Fate::TailDrop);
        assert_eq!(m.admit(500, ms / 2), Fate::Deliver { due: 3 * ms + ms / 2 + 10 * ms, backlog: 3000 });
        // Once the bottleneck is idle a packet leaves after its own sending time only.
        assert_eq!(m.admit(1000, 100 * ms), Fate::Deliver { due: 101 * ms + 10 * ms, backlog: 1000 });
    }

    #[test]
    fn deliveries_stay_in_order_when_the_delay_shrinks() {
        let mut m = model(Shape { delay: Duration::from_millis(50), ..Shape::CLEAR });
        let Fate::Deliver { due: first, .. } = m.admit(100, 0) else { panic!() };
        m.shape.delay = Duration::from_millis(5);
        let Fate::Deliver { due: second, .. } = m.admit(100, 1) else { panic!() };
        assert_eq!(first, 50_000_000);
        assert_eq!(second, first);
    }

    #[test]
    fn black_hole_loss_and_the_bound_on_what_is_held() {
        let mut m = model(Shape { black_hole: true, ..Shape::CLEAR });
        assert_eq!(m.admit(100, 0), Fate::BlackHole);
        m.shape = Shape::CLEAR.with_loss(1.0);
        assert_eq!(m.admit(100, 0), Fate::Lost);
        m.shape = Shape::CLEAR;
        m.held = MAX_HELD - 50;
        assert_eq!(m.admit(100, 0), Fate::Overflow);
        assert!(matches!(m.admit(50, 0), Fate::Deliver { .. }));
    }

    #[test]
    fn the_same_seed_loses_the_same_packets() {
        let pattern = |seed: u64| {
            let mut m = model(Shape::CLEAR.with_loss(0.3));
            m.rng = rand::rngs::StdRng::seed_from_u64(seed);
            (0..200).map(|i| m.admit(100, i) == Fate::Lost).collect::<Vec<_>>()
        };
        assert_eq!(pattern(3), pattern(3));
        assert_ne!(pattern(3), pattern(4));
        let lost = pattern(3).iter().filter(|&&l| l).count();
        assert!((20..=100).contains(&lost), "{lost} of 200 lost at 30 %");
    }
}
