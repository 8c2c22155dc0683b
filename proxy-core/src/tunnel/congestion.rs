//! The `loss_tolerant` congestion controller of QUIC tunnel sessions: Cubic's growth, cut only by loss that comes with a standing queue (sans-IO).
//!
//! A loss-based controller (Cubic, NewReno) reads every loss as a full bottleneck queue and cuts
//! its window; across a path that drops a packet in a few hundred at random (a lossy WAN, a
//! radio hop) that happens every round trip or two and the window never grows: at 0.5 % loss
//! and 50 ms quinn's Cubic moved 3-4 Mbit/s of a 100 Mbit/s link. This controller tells the two
//! apart by the queueing delay, the smoothed round trip less the path's minimum (a cut on an
//! acknowledgement needs the packet's own round trip to show the queue too: the smoothed one lags
//! a queue that drained; a cut for a loss needs the smallest round trip of the last quarter to
//! half a round trip to show it: a burst or a stall at either end delays some packets, a
//! standing queue every one), against a
//! margin (an eighth of the minimum, between [`MIN_QUEUE_MARGIN`] and [`MAX_QUEUE_MARGIN`]):
//!
//! | queueing delay | acknowledgements | a loss |
//! |---|---|---|
//! | within the margin | grow the window (slow start, then Cubic's curve) | random: counted, ignored |
//! | within twice the margin | hold it: the path is full | congestion: the window becomes what the path holds without its queue (× min ÷ smoothed round trip) of the window, or after an overshoot of what the last round trip carried where less |
//! | beyond | once per round trip, shrink it to what the path holds plus the margin (of what the last round trip carried, after an overshoot) | the same |
//!
//! The cut that ends an overshoot (slow start, or Cubic's curve grown to twice the window the
//! last cut left) finds the window up to twice what the path and its queue hold: growth runs a
//! round trip ahead of the queue that shows it, and the smoothed round trip lags the queue by
//! another. So the cut starts from what the path carried, not from the window, and Cubic's
//! curve then aims at what the path carried too: the window before the event is one the path
//! never held, and the curve's TCP-friendly estimate (0.7 of it) alone would take the window
//! back past the queue the moment it drained, and keep the queue overflowing for seconds at
//! 300 ms. No cut goes below half the window. The bottleneck queue so stays near the margin,
//! and interactive streams behind a bulk one wait little longer than the path's round trip.
//! Persistent congestion (RFC 9002 §7.6) collapses the window to the minimum and ECN congestion
//! marks cut it by Cubic's factor, queue or not.
//!
//! On a local path (a minimum round trip under [`LOCAL_RTT`]: loopback, a LAN) the window is
//! neither held nor shrunk for delay, only losses are told apart: the queue there is the hosts'
//! own, and bounding it made quinn pace a loopback stream at a few per cent less throughput.
//!
//! The minimum round trip is the smallest sample of the last [`MIN_RTT_WINDOW`]; a sample
//! within a quarter of the margin of it confirms it. One left unconfirmed that long while the
//! session sends bulk (a queue stood throughout, or the route changed) is measured again: for
//! two round trips the window is halved, which drains the bottleneck queue, and the smallest
//! round trip of the packets sent meanwhile becomes the minimum (as BBR's ProbeRTT does). A
//! route that got much longer shows at once as a long queue that stays at the minimum window;
//! the round trip is then learnt again at once, and the path's rate in slow start.

use std::any::Any;
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus::{IntCounter, Registry};
use quinn::congestion::{Controller, ControllerFactory, ControllerMetrics};

use super::window::LOCAL_RTT;
use crate::obs::metrics::{counter, counter_vec};

/// How long a minimum round trip holds without a sample confirming it.
pub const MIN_RTT_WINDOW: Duration = Duration::from_secs(10);

/// The smallest queueing delay read as a standing queue, whatever the minimum round trip: below
/// it, scheduling and timer noise at the ends (a few hundred microseconds on a busy host) would
/// read as congestion on short paths.
pub const MIN_QUEUE_MARGIN: Duration = Duration::from_millis(2);

/// The largest queueing delay read as no queue, however long the path. The window holds while the
/// queue is within twice the margin, so twice it must fit in the bottleneck's queue, which is often
/// no deeper than a few tens of milliseconds: an eighth of 300 ms held a 50 ms queue full, and
/// every overflow cost an interactive stream behind the bulk a retransmission's round trip.
pub const MAX_QUEUE_MARGIN: Duration = Duration::from_millis(10);

/// The queueing delay read as a standing queue is the minimum round trip over this (between
/// [`MIN_QUEUE_MARGIN`] and [`MAX_QUEUE_MARGIN`]): 6.25 ms at 50 ms, 10 ms from 80 ms on, a few
/// packets' worth of a window.
const QUEUE_FRACTION: u32 = 8;

/// The deepest cut of one congestion event: a loss with a queue as long as the path's round trip
/// halves the window (as NewReno does); a shorter queue cuts less.
const MIN_CUT: f64 = 0.5;

/// Cubic's cut on an ECN congestion mark, and the factor of its TCP-friendly estimate
/// (RFC 9438 §4.6, §4.3).
const BETA: f64 = 0.7;

/// Cubic's constant C (RFC 9438 §5), in datagrams per second cubed.
const C: f64 = 0.4;

/// How many round trips a measurement of the minimum round trip lasts: one for the queue to
/// drain, one for the packets sent after it to be acknowledged.
const PROBE_RTTS: u32 = 2;

/// How many spans of a smoothed round trip the recent delivery rate is measured over.
const RECENT_SPANS: u32 = 8;

/// How many spans of a smoothed round trip the floor of the round trip is kept over: it is the
/// smallest sample of the last whole span and of this one, a quarter to half a round trip.
const FLOOR_SPANS: u32 = 4;

/// The shortest measurement of the minimum round trip (short paths' acknowledgements may be
/// delayed by more than their round trip).
const MIN_PROBE: Duration = Duration::from_millis(20);

/// quinn's initial window (RFC 9002 §7.2: ten datagrams, at most 14,720 bytes), in its smallest
/// datagrams.
const INITIAL_WINDOW: u64 = 10 * 1200;

/// Builds a [`LossTolerant`] controller per QUIC path.
#[derive(Debug, Clone)]
pub struct LossTolerantConfig {
    initial_window: u64,
    stats: Option<CongestionStats>,
}

impl Default for LossTolerantConfig {
    fn default() -> Self {
        Self { initial_window: INITIAL_WINDOW, stats: None }
    }
}

impl LossTolerantConfig {
    /// Controllers that count what they do into `stats`.
    pub fn counted(stats: CongestionStats) -> Self {
        Self { stats: Some(stats), ..Self::default() }
    }
}

impl ControllerFactory for LossTolerantConfig {
    fn build(self: Arc<Self>, now: Instant, current_mtu: u16) -> Box<dyn Controller> {
        let mut cc = LossTolerant::new(self.initial_window, now, current_mtu);
        cc.stats = self.stats.clone();
        Box::new(cc)
    }
}

/// What a controller did since it was built.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Losses read as random (no standing queue): the window was kept.
    pub random_losses: u64,
    /// Cuts for a loss that came with a standing queue.
    pub loss_cuts: u64,
    /// Cuts for a queue past twice the margin, without a loss.
    pub queue_cuts: u64,
    /// Cuts for an ECN congestion mark.
    pub ecn_cuts: u64,
    /// Collapses to the minimum window for persistent congestion.
    pub collapses: u64,
    /// Measurements of the minimum round trip begun (the window halved for two round trips).
    pub min_rtt_probes: u64,
}

/// What the `loss_tolerant` controllers of a process do, all paths together (one set per
/// process): whether a path's losses are read as random or as congestion, and how often its
/// window is cut, is what says why a QUIC session moves less than its link.
#[derive(Debug, Clone)]
pub struct CongestionStats {
    random_losses: IntCounter,
    loss_cuts: IntCounter,
    queue_cuts: IntCounter,
    ecn_cuts: IntCounter,
    collapses: IntCounter,
    min_rtt_probes: IntCounter,
}

impl CongestionStats {
    pub fn new(reg: &Registry) -> Self {
        let cuts = counter_vec(
            reg,
            "seedgate_tunnel_quic_window_cuts_total",
            "Congestion window cuts of QUIC tunnel sessions whose congestion control is loss_tolerant, by cause: `loss` (a loss while the round trip showed a queue at the bottleneck), `queue` (the queue grew past twice the margin, no loss), `ecn` (an ECN congestion mark), `persistent` (every packet of several round trips lost: the window collapsed to its minimum).",
            &["cause"],
        );
        Self {
            random_losses: counter(
                reg,
                "seedgate_tunnel_quic_random_losses_total",
                "Losses of QUIC tunnel sessions whose congestion control is loss_tolerant that came while the round trip showed no queue at the bottleneck: read as random (a lossy link), they left the window as it was.",
            ),
            loss_cuts: cuts.with_label_values(&["loss"]),
            queue_cuts: cuts.with_label_values(&["queue"]),
            ecn_cuts: cuts.with_label_values(&["ecn"]),
            collapses: cuts.with_label_values(&["persistent"]),
            min_rtt_probes: counter(
                reg,
                "seedgate_tunnel_quic_min_rtt_probes_total",
                "Measurements of the minimum round trip by QUIC tunnel sessions whose congestion control is loss_tolerant (none confirmed it for 10 s while the session sent bulk): the window is halved for two round trips, which drains the bottleneck queue.",
            ),
        }
    }

    /// Adds what a controller did between `before` and `after`.
    fn add(&self, before: Counts, after: Counts) {
        let pairs = [
            (&self.random_losses, before.random_losses, after.random_losses),
            (&self.loss_cuts, before.loss_cuts, after.loss_cuts),
            (&self.queue_cuts, before.queue_cuts, after.queue_cuts),
            (&self.ecn_cuts, before.ecn_cuts, after.ecn_cuts),
            (&self.collapses, before.collapses, after.collapses),
            (&self.min_rtt_probes, before.min_rtt_probes, after.min_rtt_probes),
        ];
        for (c, b, a) in pairs {
            if a > b {
                c.inc_by(a - b);
            }
        }
    }
}

/// Cubic's curve since the last congestion event (RFC 9438 §4.2), in bytes.
#[derive(Debug, Clone, Copy)]
struct Epoch {
    start: Instant,
    /// The window before the event.
    w_max: f64,
    /// Seconds until the curve is back at `w_max`.
    k: f64,
}

/// What the smoothed round trip says of the bottleneck queue (see [`queue_margin`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Queue {
    /// Within the margin of the minimum: none, or one too short to matter.
    None,
    /// Past the margin, within twice it: the path is full.
    Standing,
    /// Past twice the margin.
    Long { min: Duration },
}

/// The queueing delay above the minimum round trip `min` read as a standing queue.
pub(crate) fn queue_margin(min: Duration) -> Duration {
    (min / QUEUE_FRACTION).clamp(MIN_QUEUE_MARGIN, MAX_QUEUE_MARGIN)
}

/// What a smoothed round trip `srtt` shows of the bottleneck queue of a path whose minimum round
/// trip is `min`.
pub(crate) fn read_queue(srtt: Duration, min: Duration) -> Queue {
    let margin = queue_margin(min);
    if srtt > min + 2 * margin {
        Queue::Long { min }
    } else if srtt > min + margin {
        Queue::Standing
    } else {
        Queue::None
    }
}

/// A measurement of the minimum round trip under way.
#[derive(Debug, Clone, Copy)]
struct Probe {
    start: Instant,
    until: Instant,
    /// The smallest round trip of a packet sent since `start`.
    min: Option<Duration>,
}

/// The controller's state; see the module doc.
#[derive(Debug, Clone)]
pub struct LossTolerant {
    initial_window: u64,
    mtu: u64,
    window: u64,
    ssthresh: u64,
    /// Growth not yet a whole byte of window.
    carry: f64,
    /// Losses of packets sent before this belong to the congestion event answered then.
    recovery_start: Option<Instant>,
    epoch: Option<Epoch>,
    /// The smoothed round trip at the last acknowledgement.
    srtt: Duration,
    /// The minimum round trip and when a sample last set or confirmed it.
    min_rtt: Option<(Duration, Instant)>,
    probe: Option<Probe>,
    counts: Counts,
    delivery: Delivery,
    /// The same in spans of an eighth of the smoothed round trip: an overshoot shows as a queue
    /// within a round trip of the bottleneck filling, so only the last acknowledgements came at
    /// its rate; a whole round's count is short of it by the ramp before.
    recent: Delivery,
    /// The smallest round trip of the last acknowledgements (see [`Floor`]).
    floor: Floor,
    /// Slow start grew the window since the last cut: the next cut, for a queue or a loss, ends
    /// an overshoot (see [`Self::carried`]).
    overshoot: bool,
    /// Where the [`Controller`] glue adds [`Self::counts`] (the sans-IO core never touches it).
    stats: Option<CongestionStats>,
}

/// Bytes acknowledged per smoothed round trip: what the path carried while the window was full.
/// The loss that ends an overshoot (slow start runs a round trip ahead of the queue that shows it,
/// so the window may be twice what the path and its queue hold) cuts from this, not the window.
#[derive(Debug, Clone, Copy, Default)]
struct Delivery {
    start: Option<Instant>,
    bytes: u64,
    /// Whether an acknowledgement of this span was of an application-limited packet.
    app_limited: bool,
    /// The last whole span's bytes and length, unless it was application-limited.
    last: Option<(u64, Duration)>,
}

impl Delivery {
    /// Counts an acknowledgement of `bytes` at `now` into spans of at least `span`.
    fn ack(&mut self, now: Instant, bytes: u64, app_limited: bool, span: Duration) {
        match self.start {
            Some(start) if now.saturating_duration_since(start) < span => {}
            Some(start) => {
                let last = (!self.app_limited).then_some((self.bytes, now.saturating_duration_since(start)));
                *self = Self { start: Some(now), last, ..Self::default() };
            }
            None => self.start = Some(now),
        }
        self.bytes = self.bytes.saturating_add(bytes);
        self.app_limited |= app_limited;
    }

    /// The last whole span's bytes scaled to `srtt`, unless it or this one so far was
    /// application-limited (the sender, not the path, set it).
    fn per(&self, srtt: Duration) -> Option<u64> {
        if self.app_limited {
            return None;
        }
        let (bytes, length) = self.last?;
        Some((bytes as f64 * srtt.as_secs_f64() / length.as_secs_f64().max(1e-6)) as u64)
    }
}

/// The smallest round trip of the last acknowledgements. A standing queue delays every packet;
/// a burst queued for a few milliseconds, or a stall of either end's event loop, delays some,
/// yet lifts the smoothed round trip past the margin for a while: a random loss read against it
/// alone cut a window already below the path's, and at 1 % loss Cubic's curve took seconds to
/// grow it back (one stream a sixth below the link's rate).
#[derive(Debug, Clone, Copy, Default)]
struct Floor {
    start: Option<Instant>,
    /// This span's smallest sample so far.
    now: Option<Duration>,
    /// The last whole span's.
    last: Option<Duration>,
}

impl Floor {
    /// Takes a sample of `rtt` at `now` into spans of at least `span`.
    fn sample(&mut self, now: Instant, rtt: Duration, span: Duration) {
        match self.start {
            Some(start) if now.saturating_duration_since(start) < span => {}
            Some(_) => *self = Self { start: Some(now), now: None, last: self.now },
            None => self.start = Some(now),
        }
        self.now = Some(self.now.map_or(rtt, |m| m.min(rtt)));
    }

    /// The smallest sample of the last whole span and this one; none before any sample.
    fn get(&self) -> Option<Duration> {
        match (self.last, self.now) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

impl LossTolerant {
    /// A controller for a new path, at `now`, whose datagrams are `mtu` bytes.
    pub fn new(initial_window: u64, _now: Instant, mtu: u16) -> Self {
        Self {
            initial_window,
            mtu: u64::from(mtu),
            window: initial_window,
            ssthresh: u64::MAX,
            carry: 0.0,
            recovery_start: None,
            epoch: None,
            srtt: Duration::ZERO,
            min_rtt: None,
            probe: None,
            counts: Counts::default(),
            delivery: Delivery::default(),
            recent: Delivery::default(),
            floor: Floor::default(),
            overshoot: false,
            stats: None,
        }
    }

    /// How many losses were read as random (no standing queue) and left the window as it was.
    pub fn random_losses(&self) -> u64 {
        self.counts.random_losses
    }

    /// What the controller did since it was built.
    pub fn counts(&self) -> Counts {
        self.counts
    }

    /// The minimum round trip in effect, if any sample was taken.
    pub fn min_rtt(&self) -> Option<Duration> {
        self.min_rtt.map(|(m, _)| m)
    }

    /// Whether a measurement of the minimum round trip is under way (the window is halved).
    pub fn probing(&self) -> bool {
        self.probe.is_some()
    }

    fn minimum_window(&self) -> u64 {
        2 * self.mtu
    }

    /// Whether the path's minimum round trip is a local one (see [`LOCAL_RTT`]).
    fn local(&self) -> bool {
        self.min_rtt.is_some_and(|(min, _)| min < LOCAL_RTT)
    }

    /// What the smoothed round trip shows of the bottleneck queue.
    fn queue(&self) -> Queue {
        self.queue_at(self.srtt)
    }

    /// What a round trip of `rtt` shows of the bottleneck queue.
    fn queue_at(&self, rtt: Duration) -> Queue {
        self.min_rtt.map_or(Queue::None, |(min, _)| read_queue(rtt, min))
    }

    /// A packet sent at `sent` was acknowledged at `now`; `srtt` is the path's smoothed round
    /// trip after it. Takes the round-trip sample, then grows the window while the path shows
    /// no standing queue, holds it while the queue is within twice the margin, and beyond that
    /// shrinks it to what the path holds plus the margin.
    pub fn ack(&mut self, now: Instant, sent: Instant, bytes: u64, app_limited: bool, srtt: Duration) {
        self.srtt = srtt;
        self.delivery.ack(now, bytes, app_limited, srtt);
        self.recent.ack(now, bytes, app_limited, srtt / RECENT_SPANS);
        let rtt = now.saturating_duration_since(sent);
        self.floor.sample(now, rtt, srtt / FLOOR_SPANS);
        self.sample(now, rtt, sent, app_limited);
        if app_limited || self.recovery_start.is_some_and(|r| sent <= r) {
            return;
        }
        // On a local path the queue is the hosts' own (socket buffers, a busy CPU), not a
        // bottleneck's: bounding it there only makes quinn pace (and cost CPU per byte).
        let queue = if self.local() { Queue::None } else { self.queue() };
        match queue {
            Queue::None if self.window < self.ssthresh => {
                self.window = self.window.saturating_add(bytes);
                self.overshoot = true;
            }
            Queue::None => self.grow(now, bytes),
            // Within reach of the margin: the path is full. Hold, in slow start too (a
            // moment's delay on a busy host must not end it).
            Queue::Standing => {}
            // Well past it: more in flight than the path holds plus the margin (growth runs a
            // round trip ahead of the round trip that shows it). Once per round trip.
            Queue::Long { .. } if self.window <= self.minimum_window() => self.forget_min_rtt(),
            // The smoothed round trip lags by several acknowledgements: the first packets sent
            // after a cut come back while it still shows the queue they no longer waited behind.
            // A cut needs the packet's own round trip to show the long queue too (it never reads
            // a queue shorter than the one it met); growth still waits for the smoothed one.
            Queue::Long { min } if !matches!(read_queue(rtt, min), Queue::Long { .. }) => {}
            Queue::Long { min } => {
                let target = (min + queue_margin(min)).as_secs_f64() / srtt.min(rtt).as_secs_f64();
                let carried = self.carried();
                self.counts.queue_cuts += 1;
                self.reduce(now, target * carried, carried);
            }
        }
    }

    /// Congestion avoidance: Cubic's curve, or its TCP-friendly estimate where that is ahead,
    /// at most half again the window one round trip ahead (RFC 9438 §4.2-4.4).
    fn grow(&mut self, now: Instant, bytes: u64) {
        let window = self.window as f64;
        let epoch = *self.epoch.get_or_insert(Epoch { start: now, w_max: window, k: 0.0 });
        let mtu = self.mtu as f64;
        let rtt = self.srtt.max(Duration::from_micros(1)).as_secs_f64();
        let t = now.saturating_duration_since(epoch.start).as_secs_f64();
        let cubic = C * (t + rtt - epoch.k).powi(3) * mtu + epoch.w_max;
        let friendly = epoch.w_max * BETA + 3.0 * (1.0 - BETA) / (1.0 + BETA) * (t / rtt) * mtu;
        let target = cubic.max(friendly).min(1.5 * window);
        if target > window {
            self.carry += (target - window) / window * bytes as f64;
            let whole = self.carry.floor();
            self.carry -= whole;
            self.window = self.window.saturating_add(whole as u64);
        }
    }

    /// Takes one round-trip sample of a packet sent at `sent`. An application-limited one
    /// (a keepalive, a request on an idle session) may be late by the peer's acknowledgement
    /// delay: it lowers or confirms the minimum but neither measures it nor starts a measurement.
    fn sample(&mut self, now: Instant, rtt: Duration, sent: Instant, app_limited: bool) {
        match self.min_rtt {
            Some((min, _)) if rtt < min => self.set_min(rtt, now),
            Some((min, _)) if rtt <= min + queue_margin(min) / 4 => self.min_rtt = Some((min, now)),
            Some(_) => {}
            None => self.set_min(rtt, now),
        }
        if app_limited {
            return;
        }
        if let Some(p) = &mut self.probe {
            if sent >= p.start {
                p.min = Some(p.min.map_or(rtt, |m| m.min(rtt)));
            }
            if now >= p.until {
                match p.min {
                    Some(m) => self.set_min(m, now),
                    // Nothing sent since it began: measure again at the next expiry.
                    None => {
                        self.probe = None;
                        self.min_rtt = self.min_rtt.map(|(min, _)| (min, now));
                    }
                }
            }
        } else if let Some((_, at)) = self.min_rtt
            && now.saturating_duration_since(at) > MIN_RTT_WINDOW
        {
            let length = (self.srtt * PROBE_RTTS).max(MIN_PROBE);
            self.probe = Some(Probe { start: now, until: now + length, min: None });
            self.counts.min_rtt_probes += 1;
        }
    }

    /// The queue stays long at the minimum window, where this end queues next to nothing: the
    /// minimum is stale (the route got longer, or other traffic fills the queue). Learn the
    /// round trip again from the next sample, and the path's rate in slow start.
    fn forget_min_rtt(&mut self) {
        self.min_rtt = None;
        self.probe = None;
        self.ssthresh = u64::MAX;
        self.epoch = None;
    }

    fn set_min(&mut self, min: Duration, now: Instant) {
        self.min_rtt = Some((min, now));
        self.probe = None;
    }

    /// Packets sent at `sent` were lost (`lost_bytes` of them; 0 for an ECN congestion mark)
    /// at `now`; `persistent`: all sent over the persistent-congestion period were.
    pub fn congestion(&mut self, now: Instant, sent: Instant, persistent: bool, lost_bytes: u64) {
        if persistent {
            // The path went dark for several round trips (RFC 9002 §7.6.2): start over, and
            // learn its round trip again (it may be another path now).
            self.ssthresh = (self.window / 2).max(self.minimum_window());
            self.window = self.minimum_window();
            self.recovery_start = None;
            self.epoch = None;
            self.carry = 0.0;
            self.min_rtt = None;
            self.probe = None;
            self.counts.collapses += 1;
            return;
        }
        if self.recovery_start.is_some_and(|r| sent <= r) {
            return;
        }
        // The queue as every recent packet met it, not only the smoothed round trip.
        let srtt = self.floor.get().map_or(self.srtt, |f| f.min(self.srtt));
        let (cut, carried) = match self.queue_at(srtt) {
            _ if lost_bytes == 0 => {
                self.counts.ecn_cuts += 1;
                (BETA, 1.0)
            }
            // What the path holds without its queue (at most 8/9 of the window: the queue is
            // past the margin), of the window or, after an overshoot, of what the path carried
            // in the last round trip where less. Only then: across a lossy path in congestion
            // avoidance, a round trip's count read short of the window often enough to cost a
            // fifth of the rate.
            Queue::Standing | Queue::Long { .. } => {
                let min = self.min_rtt.map_or(Duration::ZERO, |(m, _)| m);
                let drained = min.as_secs_f64() / srtt.as_secs_f64();
                let carried = self.carried();
                self.counts.loss_cuts += 1;
                (drained * carried, carried)
            }
            Queue::None => {
                self.counts.random_losses += 1;
                return;
            }
        };
        self.reduce(now, cut, carried);
    }

    /// What the path carried in a round trip: the most of the last whole round, this one so far,
    /// and the last eighth of one at its rate; none while the last round or this one was
    /// application-limited (the sender, not the path, set it).
    fn per_round(&self) -> Option<u64> {
        if self.delivery.app_limited || self.recent.app_limited {
            return None;
        }
        let (last, _) = self.delivery.last?;
        Some(last.max(self.delivery.bytes).max(self.recent.per(self.srtt).unwrap_or(0)))
    }

    /// Whether Cubic's curve grew the window to twice what the last cut left: far past the
    /// window before that cut (a session whose first cut came at its initial window, before
    /// any bulk), the curve grows half again the window per round trip and, like slow start,
    /// runs a round trip ahead of the queue that shows it. Growth within twice is not one.
    fn overshooting(&self) -> bool {
        self.window >= self.ssthresh.saturating_mul(2)
    }

    /// The share of the window the path carried in the last round trip, its queue included,
    /// after an overshoot, else 1. Read once per overshoot.
    fn carried(&mut self) -> f64 {
        let overshoot = self.overshoot || self.overshooting();
        let carried = match self.per_round() {
            Some(d) if overshoot => (d as f64 / self.window.max(1) as f64).min(1.0),
            _ => 1.0,
        };
        self.overshoot = false;
        carried
    }

    /// Multiplies the window by `factor` (at least [`MIN_CUT`]), ends slow start, and starts
    /// Cubic's curve back towards the window before, times `carried` (the share of it the path
    /// carried): later losses or delays of packets sent before `now` belong to this event.
    fn reduce(&mut self, now: Instant, factor: f64, carried: f64) {
        self.recovery_start = Some(now);
        let before = self.window as f64;
        self.window = ((before * factor.clamp(MIN_CUT, 1.0)) as u64).max(self.minimum_window());
        // After an overshoot the window before the event is one the path never held: Cubic's
        // curve and its TCP-friendly estimate (0.7 of it) aim at what the path carried instead,
        // or the estimate alone would take the window back past the queue once it drained.
        let w_max = (before * carried).max(self.window as f64);
        self.ssthresh = self.window;
        self.carry = 0.0;
        let k = ((w_max - self.window as f64) / self.mtu as f64 / C).max(0.0).cbrt();
        self.epoch = Some(Epoch { start: now, w_max, k });
    }
}

impl LossTolerant {
    /// Adds what the last event did to the process's stats, if counted.
    fn report(&self, before: Counts) {
        if let Some(s) = self.stats.as_ref().filter(|_| before != self.counts) {
            s.add(before, self.counts);
        }
    }
}

impl Controller for LossTolerant {
    fn on_ack(&mut self, now: Instant, sent: Instant, bytes: u64, app_limited: bool, rtt: &quinn_proto::RttEstimator) {
        let before = self.counts;
        self.ack(now, sent, bytes, app_limited, rtt.get());
        self.report(before);
    }

    fn on_congestion_event(&mut self, now: Instant, sent: Instant, is_persistent_congestion: bool, lost_bytes: u64) {
        let before = self.counts;
        self.congestion(now, sent, is_persistent_congestion, lost_bytes);
        self.report(before);
    }

    fn on_mtu_update(&mut self, new_mtu: u16) {
        self.mtu = u64::from(new_mtu);
        self.window = self.window.max(self.minimum_window());
    }

    fn window(&self) -> u64 {
        if self.probe.is_some() { (self.window / 2).max(self.minimum_window()) } else { self.window }
    }

    fn metrics(&self) -> ControllerMetrics {
        let mut m = ControllerMetrics::default();
        m.congestion_window = self.window();
        m.ssthresh = Some(self.ssthresh);
        m
    }

    fn clone_box(&self) -> Box<dyn Controller> {
        Box::new(self.clone())
    }

    fn initial_window(&self) -> u64 {
        self.initial_window
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MTU: u16 = 1200;
    const MS: Duration = Duration::from_millis(1);
    const MICROS: Duration = Duration::from_micros(1);
    const MAX_ROUND: u64 = 1000;

    /// A path on a virtual clock: acknowledges a window's worth of packets per round trip (at
    /// most [`MAX_ROUND`], so that long runs stay short).
    struct Path {
        cc: LossTolerant,
        now: Instant,
    }

    impl Path {
        fn new() -> Self {
            let now = Instant::now();
            Self { cc: LossTolerant::new(INITIAL_WINDOW, now, MTU), now }
        }

        /// A path after `rounds` round trips of `rtt` without a queue (slow start).
        fn after(rounds: usize, rtt: Duration) -> Self {
            let mut p = Self::new();
            for _ in 0..rounds {
                p.round(rtt, rtt);
            }
            p
        }

        /// One round trip of `rtt` in which the whole window is sent and acknowledged, each
        /// packet with that round trip and the smoothed round trip `srtt`.
        fn round(&mut self, rtt: Duration, srtt: Duration) {
            let packets = (self.cc.window() / u64::from(MTU)).min(MAX_ROUND);
            self.carry(rtt, srtt, packets);
        }

        /// One round trip of `rtt` in which the path carries `packets`, each acknowledged with
        /// that round trip and the smoothed round trip `srtt`.
        fn carry(&mut self, rtt: Duration, srtt: Duration, packets: u64) {
            let sent = self.now;
            self.now += rtt;
            for _ in 0..packets {
                self.cc.ack(self.now, sent, u64::from(MTU), false, srtt);
            }
        }

        /// The smoothed round trip reads `srtt`, and so did every packet of the last round trip.
        fn queue(&mut self, srtt: Duration) {
            self.cc.srtt = srtt;
            self.cc.floor = Floor { start: Some(self.now), now: Some(srtt), last: Some(srtt) };
        }

        /// The floor of the round trip holds only the round trip just carried (a real path's
        /// acknowledgements come spread across it; these came at one instant).
        fn spread(&mut self) {
            self.cc.floor.last = self.cc.floor.now;
        }

        /// A loss of a packet sent half a round trip ago.
        fn lose(&mut self, rtt: Duration) {
            self.cc.congestion(self.now, self.now - rtt / 2, false, u64::from(MTU));
        }
    }

    #[test]
    fn window_grows_on_acks_in_slow_start_and_after() {
        let mut p = Path::new();
        let w0 = p.cc.window();
        p.round(50 * MS, 50 * MS);
        assert_eq!(p.cc.window(), 2 * w0, "slow start doubles per round trip");
        // Congestion avoidance: still grows, slower.
        p.cc.ssthresh = p.cc.window;
        let w1 = p.cc.window();
        for _ in 0..40 {
            let before = p.cc.window();
            p.round(50 * MS, 50 * MS);
            assert!(p.cc.window() <= before + before / 2, "{} after {before}", p.cc.window());
        }
        assert!(p.cc.window() > w1, "{} > {w1}", p.cc.window());
    }

    #[test]
    fn app_limited_acks_do_not_grow_the_window_but_sample_the_path() {
        let mut p = Path::new();
        let w0 = p.cc.window();
        let sent = p.now;
        p.now += 30 * MS;
        p.cc.ack(p.now, sent, u64::from(MTU), true, 30 * MS);
        assert_eq!(p.cc.window(), w0);
        assert_eq!(p.cc.min_rtt(), Some(30 * MS));
    }

    #[test]
    fn random_loss_without_a_queue_keeps_the_window() {
        let mut p = Path::after(5, 50 * MS);
        let w = p.cc.window();
        for i in 0..10 {
            // A smoothed round trip within the margin (6.25 ms at 50 ms) is no queue.
            p.queue(55 * MS);
            p.lose(50 * MS);
            assert_eq!(p.cc.window(), w, "loss {i}");
        }
        assert_eq!(p.cc.random_losses(), 10);
        // Slow start goes on past them.
        p.round(50 * MS, 50 * MS);
        assert_eq!(p.cc.window(), 2 * w);
    }

    #[test]
    fn loss_with_a_standing_queue_cuts_to_what_the_path_holds() {
        let mut p = Path::after(6, 50 * MS);
        let w = p.cc.window();
        // A path that carried the whole window in the last round trip, and a 20 ms queue: the
        // window becomes 50/70 of what it was.
        p.cc.delivery.last = Some((w, 50 * MS));
        p.queue(70 * MS);
        p.lose(50 * MS);
        let cut = p.cc.window();
        assert_eq!(cut, (w as f64 * 50.0 / 70.0) as u64);
        assert_eq!(p.cc.random_losses(), 0);
        // More losses of packets sent before the cut are the same event.
        p.lose(50 * MS);
        assert_eq!(p.cc.window(), cut);
        // A full queue (as long as the path) halves it, no more.
        p.now += 100 * MS;
        p.queue(200 * MS);
        p.cc.congestion(p.now, p.now - MS, false, u64::from(MTU));
        assert_eq!(p.cc.window(), cut / 2);
        // Just past the margin: a ninth at least.
        p.now += 100 * MS;
        p.queue(57 * MS);
        let before = p.cc.window();
        p.cc.congestion(p.now, p.now - MS, false, u64::from(MTU));
        assert_eq!(p.cc.window(), (before as f64 * 50.0 / 57.0) as u64);
    }

    #[test]
    fn a_loss_is_read_against_the_round_trip_every_recent_packet_met() {
        let packet = u64::from(MTU);
        let mut p = Path::after(6, 50 * MS);
        p.queue(70 * MS);
        p.lose(50 * MS);
        let w = p.cc.window();
        // A burst or a stall delays some packets: the smoothed round trip reads 58 ms, past the
        // margin (6.25 ms), while one packet in four of the last few came back in 50.
        p.now += 100 * MS;
        for i in 0..20 {
            let rtt = if i % 4 == 0 { 50 * MS } else { 70 * MS };
            p.cc.ack(p.now, p.now - rtt, packet, false, 58 * MS);
            p.now += MS;
        }
        assert_eq!(p.cc.window(), w, "held: the smoothed round trip shows a queue");
        p.lose(50 * MS);
        assert_eq!((p.cc.window(), p.cc.counts().loss_cuts, p.cc.random_losses()), (w, 1, 1), "random");
        // A queue that every packet of the last half round trip met: the loss is congestion.
        for _ in 0..30 {
            p.cc.ack(p.now, p.now - 58 * MS, packet, false, 58 * MS);
            p.now += MS;
        }
        p.lose(50 * MS);
        assert_eq!(p.cc.window(), (w as f64 * 50.0 / 58.0) as u64);
        assert_eq!(p.cc.counts().loss_cuts, 2);
    }

    #[test]
    fn a_loss_that_ends_an_overshoot_cuts_to_what_the_path_carried() {
        let packet = u64::from(MTU);
        // Slow start reaches 160 packets in flight on a path that holds 100 and queues 20: the
        // round trip that doubled the window showed no queue yet.
        let mut p = Path::after(3, 50 * MS);
        p.carry(50 * MS, 50 * MS, 80);
        assert_eq!(p.cc.window(), 160 * packet);
        // The next round trip carries what the path and its queue hold (the queue shows: the
        // window holds), then a loss.
        p.carry(60 * MS, 60 * MS, 120);
        assert_eq!(p.cc.window(), 160 * packet);
        p.spread();
        p.lose(60 * MS);
        // What the path carried without its queue, not 50/60 of the window (133 packets, a third
        // more than the path holds: lost again next round trip).
        let w = p.cc.window();
        assert!(w.abs_diff(100 * packet) <= packet, "{} packets", w / packet);
        // Past slow start a loss cuts from the window again, whatever a round trip counted (on a
        // lossy path the count often reads short of the window).
        p.carry(60 * MS, 60 * MS, 70);
        p.carry(60 * MS, 60 * MS, 70);
        p.spread();
        p.lose(60 * MS);
        assert_eq!(p.cc.window(), (w as f64 * 50.0 / 60.0) as u64);
        // No cut below half, whatever the path carried.
        let mut p = Path::after(3, 50 * MS);
        p.carry(50 * MS, 50 * MS, 80);
        p.carry(60 * MS, 60 * MS, 20);
        p.spread();
        p.lose(60 * MS);
        assert_eq!(p.cc.window(), 80 * packet);
    }

    #[test]
    fn an_application_limited_round_trip_does_not_measure_the_path() {
        let packet = u64::from(MTU);
        let mut p = Path::after(3, 50 * MS);
        p.carry(50 * MS, 50 * MS, 80);
        // A quiet round trip: the sender, not the path, sent little.
        let sent = p.now;
        p.now += 60 * MS;
        for _ in 0..20 {
            p.cc.ack(p.now, sent, packet, true, 60 * MS);
        }
        p.spread();
        p.lose(60 * MS);
        assert_eq!(p.cc.window(), (160.0 * packet as f64 * 50.0 / 60.0) as u64);
    }

    #[test]
    fn ecn_marks_cut_without_a_queue() {
        let mut p = Path::after(4, 50 * MS);
        let w = p.cc.window();
        p.cc.congestion(p.now, p.now - MS, false, 0);
        assert_eq!(p.cc.window(), (w as f64 * BETA) as u64);
    }

    #[test]
    fn a_queue_within_twice_the_margin_holds_the_window_in_slow_start_too() {
        let mut p = Path::after(4, 50 * MS);
        let w = p.cc.window();
        // 10 ms at 50 ms: past the margin (6.25 ms), within twice it.
        for _ in 0..10 {
            p.round(60 * MS, 60 * MS);
            assert_eq!(p.cc.window(), w);
        }
        // A moment's delay (a busy host) does not end slow start: once it passes, the window
        // doubles again.
        p.round(50 * MS, 50 * MS);
        assert_eq!(p.cc.window(), 2 * w);
        assert_eq!(p.cc.ssthresh, u64::MAX);
    }

    #[test]
    fn a_local_path_grows_whatever_its_round_trip_says_but_still_tells_losses_apart() {
        let mut p = Path::after(3, 200 * MICROS);
        // The hosts queue 10 ms behind bulk: no hold, no shrink.
        for _ in 0..4 {
            let w = p.cc.window();
            p.round(10 * MS, 10 * MS);
            assert_eq!(p.cc.window(), 2 * w);
        }
        // A loss within the margin (2 ms) is random; past it, congestion.
        let w = p.cc.window();
        p.queue(1500 * MICROS);
        p.lose(MS);
        assert_eq!(p.cc.window(), w);
        p.queue(10 * MS);
        p.lose(MS);
        assert_eq!(p.cc.window(), w / 2);
    }

    #[test]
    fn a_queue_past_twice_the_margin_shrinks_the_window_once_per_round_trip() {
        // (path, smoothed round trip, margin): slow start overshot by 30 ms at 50 ms; at 300 ms a
        // full 50 ms bottleneck queue, which an eighth of the path (37.5 ms) would read as within
        // twice the margin and hold, keeping the queue full until it overflowed.
        for (rtt, srtt, margin) in [(50 * MS, 80 * MS, 6250 * MICROS), (300 * MS, 350 * MS, 10 * MS)] {
            let mut p = Path::after(6, rtt);
            let w = p.cc.window();
            // A path that carried the whole window in the last round trip: the window becomes
            // what the path holds plus the margin, and slow start ends.
            p.cc.delivery.bytes = w;
            p.round(srtt, srtt);
            let shrunk = (w as f64 * ((rtt + margin).as_secs_f64() / srtt.as_secs_f64())) as u64;
            assert_eq!(p.cc.window(), shrunk, "{rtt:?}");
            assert_eq!(p.cc.ssthresh, shrunk);
            // The packets sent before it still show the queue: no second cut for them.
            p.cc.ack(p.now + srtt / 2, p.now - srtt / 2, u64::from(MTU), false, srtt);
            assert_eq!(p.cc.window(), shrunk);
            // A round trip later the queue is within twice the margin: held.
            let held = rtt + margin * 3 / 2;
            p.round(held, held);
            assert_eq!(p.cc.window(), shrunk);
            // A loss with it is congestion: the window becomes what the path holds without it.
            p.lose(held);
            assert_eq!(p.cc.window(), (shrunk as f64 * (rtt.as_secs_f64() / held.as_secs_f64())) as u64);
            assert_eq!(p.cc.counts(), Counts { queue_cuts: 1, loss_cuts: 1, ..Counts::default() });
        }
    }

    #[test]
    fn a_queue_that_ends_slow_start_cuts_from_what_the_path_carried_and_cubic_aims_there() {
        // Slow start at 300 ms doubled the window a round trip before the queue showed, and the
        // path carried 0.6 of it in the round trip that ends.
        let mut p = Path::after(6, 300 * MS);
        let w = p.cc.window();
        p.cc.delivery.bytes = w * 6 / 10;
        p.round(350 * MS, 350 * MS);
        let carried = (w * 6 / 10) as f64;
        let cut = carried * (310.0 / 350.0);
        assert!((p.cc.window() as f64 - cut).abs() <= 1.0, "{} is {cut}", p.cc.window());
        assert_eq!(p.cc.counts().queue_cuts, 1);
        assert_eq!(p.cc.epoch.map(|e| e.w_max.round()), Some(carried.round()));
        // The queue drained: the packets sent after the cut grow the window towards what the
        // path carried, not past it (the TCP-friendly estimate of the overshot window, 0.7 of
        // it, would take it there in a round trip, and the queue would overflow again).
        p.now += MS;
        p.round(300 * MS, 300 * MS);
        assert!(p.cc.window() as f64 > cut, "{} > {cut}", p.cc.window());
        assert!((p.cc.window() as f64) < carried, "{} < {carried}", p.cc.window());
    }

    #[test]
    fn an_overshoot_is_measured_at_the_rate_of_its_last_acknowledgements() {
        // Slow start at 50 ms: the bottleneck filled within the round trip that shows the queue,
        // so the whole round counted 0.4 of the window, but its last eighth came at a rate of
        // 0.8 of the window per (70 ms) round trip.
        let packet = u64::from(MTU);
        let mut p = Path::after(6, 50 * MS);
        let w = p.cc.window();
        p.cc.delivery.bytes = w * 4 / 10;
        let sent = p.now;
        p.now += 70 * MS;
        p.cc.recent.start = Some(p.now - 70 * MS / RECENT_SPANS);
        p.cc.recent.bytes = w / 10;
        p.cc.ack(p.now, sent, packet, false, 70 * MS);
        // Of 0.8 of the window: (50 + 6.25) / 70 of it.
        let cut = (w / 10) as f64 * 8.0 * (56.25 / 70.0);
        assert!((p.cc.window() as f64 - cut).abs() <= 2.0, "{} is {cut}", p.cc.window());
    }

    #[test]
    fn growth_to_twice_the_window_the_last_cut_left_ends_as_slow_start_does() {
        // A session's first cut came at its initial window (a loss with a queue on a 300 ms
        // path), and its first bulk a minute later.
        let mut p = Path::after(1, 300 * MS);
        p.queue(350 * MS);
        p.lose(300 * MS);
        assert_eq!(p.cc.counts().loss_cuts, 1);
        p.now += Duration::from_secs(60);
        // Cubic's curve is far past the window: half again the window per round trip.
        for _ in 0..8 {
            let w = p.cc.window();
            p.round(300 * MS, 300 * MS);
            assert!(p.cc.window() + u64::from(MTU) >= w * 3 / 2, "{} after {w}", p.cc.window());
        }
        // A queue shows, and the path carried 0.6 of the window in the round trip that ended:
        // the cut is from that, as at the end of slow start.
        let w = p.cc.window();
        p.cc.delivery.bytes = w * 6 / 10;
        p.cc.recent.bytes = 0;
        p.round(350 * MS, 350 * MS);
        let cut = (w * 6 / 10) as f64 * (310.0 / 350.0);
        assert!((p.cc.window() as f64 - cut).abs() <= 1.0, "{} is {cut}", p.cc.window());
        assert_eq!(p.cc.counts().queue_cuts, 1);
        // Bulk again a minute later: the curve races again, but a queue within twice the window
        // the cut left is no overshoot, whatever the first round trip after the spell carried.
        p.now += Duration::from_secs(60);
        p.round(300 * MS, 300 * MS);
        let w = p.cc.window();
        assert!(w > cut as u64 && w < 2 * cut as u64, "{w} after {cut}");
        p.cc.delivery.bytes = w * 6 / 10;
        p.round(350 * MS, 350 * MS);
        let cut = w as f64 * (310.0 / 350.0);
        assert!((p.cc.window() as f64 - cut).abs() <= 1.0, "{} is {cut}", p.cc.window());
        assert_eq!(p.cc.counts().queue_cuts, 2);
    }

    #[test]
    fn a_cut_for_the_queue_needs_the_packets_own_round_trip_to_show_it_too() {
        let packet = u64::from(MTU);
        // Slow start overshot a 50 ms path into a full 50 ms queue, and a loss cut the window.
        let mut p = Path::after(6, 50 * MS);
        p.queue(100 * MS);
        p.lose(100 * MS);
        let cut = p.cc.window();
        // The first packets sent after the cut come back in 52 ms (the queue drained meanwhile)
        // while the smoothed round trip still shows most of it: held, not cut again.
        let sent = p.now + MS;
        p.now = sent + 52 * MS;
        for _ in 0..10 {
            p.cc.ack(p.now, sent, packet, false, 90 * MS);
        }
        assert_eq!(p.cc.window(), cut);
        assert_eq!(p.cc.counts().queue_cuts, 0);
        // Nor does a short round trip of its own grow the window while the smoothed one shows a
        // standing queue (10 ms at 50 ms: within twice the 6.25 ms margin).
        p.now += 60 * MS;
        p.cc.ack(p.now, p.now - 50 * MS, packet, false, 60 * MS);
        assert_eq!(p.cc.window(), cut);
        // A packet that met a long queue is cut for it: the window becomes what the path holds
        // plus the margin, of the shorter of the two round trips.
        p.now += 90 * MS;
        p.cc.ack(p.now, p.now - 80 * MS, packet, false, 90 * MS);
        assert_eq!(p.cc.window(), (cut as f64 * (56.25 / 80.0)) as u64);
        assert_eq!(p.cc.counts().queue_cuts, 1);
    }

    #[test]
    fn the_margin_is_an_eighth_of_the_path_within_its_limits() {
        assert_eq!(queue_margin(50 * MS), 6250 * MICROS);
        assert_eq!(queue_margin(5 * MS), MIN_QUEUE_MARGIN);
        assert_eq!(queue_margin(80 * MS), MAX_QUEUE_MARGIN);
        assert_eq!(queue_margin(300 * MS), MAX_QUEUE_MARGIN);
    }

    #[test]
    fn after_a_cut_the_window_grows_back_to_where_it_was() {
        let mut p = Path::after(6, 50 * MS);
        let w = p.cc.window();
        p.queue(70 * MS);
        p.lose(50 * MS);
        assert!(p.cc.window() < w);
        let mut rounds = 0;
        while p.cc.window() < w {
            p.round(50 * MS, 50 * MS);
            rounds += 1;
            assert!(rounds < 400, "{} after {rounds} round trips, short of {w}", p.cc.window());
        }
    }

    #[test]
    fn persistent_congestion_collapses_to_the_minimum_window() {
        let mut p = Path::after(6, 50 * MS);
        let w = p.cc.window();
        // Without a queue too: the path went dark.
        p.cc.congestion(p.now, p.now - MS, true, 10 * u64::from(MTU));
        assert_eq!(p.cc.window(), 2 * u64::from(MTU));
        assert_eq!(p.cc.ssthresh, w / 2);
        assert_eq!(p.cc.min_rtt(), None, "the round trip is learnt again");
        p.round(80 * MS, 80 * MS);
        assert_eq!(p.cc.min_rtt(), Some(80 * MS));
        assert_eq!(p.cc.window(), 4 * u64::from(MTU), "slow start again");
    }

    #[test]
    fn a_route_that_gets_longer_is_learnt_again() {
        let mut p = Path::after(6, 20 * MS);
        assert_eq!(p.cc.min_rtt(), Some(20 * MS));
        // The route changes to 100 ms: it looks like a long queue, and the window shrinks
        // round trip after round trip, until at the minimum window the queue cannot be this
        // end's: the round trip is learnt again, and the path's rate in slow start.
        let mut rounds = 0;
        while p.cc.min_rtt() != Some(100 * MS) {
            p.round(100 * MS, 100 * MS);
            rounds += 1;
            assert!(rounds <= 20, "{:?} after {rounds} round trips", p.cc.min_rtt());
        }
        assert_eq!(p.cc.ssthresh, u64::MAX);
        let w = p.cc.window();
        p.round(100 * MS, 100 * MS);
        assert_eq!(p.cc.window(), 2 * w);
        // Random losses are random again.
        let w = p.cc.window();
        p.queue(101 * MS);
        p.lose(100 * MS);
        assert_eq!(p.cc.window(), w);
    }

    #[test]
    fn a_minimum_round_trip_left_unconfirmed_is_measured_again() {
        let mut p = Path::new();
        p.round(20 * MS, 20 * MS);
        p.cc.ssthresh = p.cc.window;
        // The route changes to 24 ms: within the margin and never confirming 20 ms.
        let mut rounds = 0;
        while !p.cc.probing() {
            p.round(24 * MS, 24 * MS);
            rounds += 1;
            assert!(rounds <= 10_000 / 24 + 1, "no measurement after {rounds} round trips");
        }
        // The window is halved for two round trips, whose smallest sample is the minimum.
        let held = p.cc.window;
        assert_eq!(p.cc.window(), held / 2);
        for _ in 0..3 {
            p.round(24 * MS, 24 * MS);
        }
        assert!(!p.cc.probing());
        assert_eq!(p.cc.min_rtt(), Some(24 * MS));
        assert!(p.cc.window() >= held, "the whole window again");
        assert_eq!(p.cc.counts().min_rtt_probes, 1);
    }

    #[test]
    fn late_acknowledgements_of_an_idle_session_do_not_raise_the_minimum() {
        let mut p = Path::new();
        p.round(50 * MS, 50 * MS);
        // Twenty seconds of keepalives, each acknowledged 25 ms late.
        for _ in 0..20 {
            p.now += 1000 * MS;
            p.cc.ack(p.now, p.now - 75 * MS, u64::from(MTU), true, 52 * MS);
            assert!(!p.cc.probing());
        }
        assert_eq!(p.cc.min_rtt(), Some(50 * MS));
        // Bulk again, behind a queue: the unconfirmed minimum is measured then.
        p.round(60 * MS, 60 * MS);
        assert!(p.cc.probing());
    }

    #[test]
    fn samples_near_the_minimum_confirm_it() {
        let mut p = Path::new();
        p.round(50 * MS, 50 * MS);
        // Twenty seconds of round trips within a quarter of the margin (1.56 ms) of 50 ms.
        for _ in 0..400 {
            p.round(51 * MS, 51 * MS);
            assert!(!p.cc.probing());
        }
        assert_eq!(p.cc.min_rtt(), Some(50 * MS));
    }

    #[test]
    fn a_standing_queue_throughout_is_drained_to_measure() {
        let mut p = Path::new();
        p.round(50 * MS, 50 * MS);
        // A queue of 5 ms (within the margin) that never drains: no sample confirms the minimum.
        let mut rounds = 0;
        while !p.cc.probing() {
            p.round(55 * MS, 55 * MS);
            rounds += 1;
            assert!(rounds <= 190, "no measurement after {rounds} round trips");
        }
        // The halved window drains the queue: the packets sent then see the path's own 50 ms.
        p.round(55 * MS, 55 * MS);
        p.round(50 * MS, 52 * MS);
        p.round(50 * MS, 50 * MS);
        assert!(!p.cc.probing());
        assert_eq!(p.cc.min_rtt(), Some(50 * MS));
    }

    #[test]
    fn the_factory_builds_it_at_quinns_initial_window() {
        let cc = Arc::new(LossTolerantConfig::default()).build(Instant::now(), MTU);
        assert_eq!(cc.window(), INITIAL_WINDOW);
        assert_eq!(cc.initial_window(), INITIAL_WINDOW);
        assert!(cc.into_any().downcast::<LossTolerant>().is_ok());
    }

    #[test]
    fn a_counted_factory_adds_what_its_controllers_do_to_the_process_stats() {
        let reg = Registry::new();
        let stats = CongestionStats::new(&reg);
        let factory = Arc::new(LossTolerantConfig::counted(stats));
        let (mut a, mut b) = (factory.clone().build(Instant::now(), MTU), factory.build(Instant::now(), MTU));
        let now = Instant::now();
        // No round trip yet, so no queue: random. Then the path goes dark.
        a.on_congestion_event(now, now, false, u64::from(MTU));
        b.on_congestion_event(now, now, false, u64::from(MTU));
        b.on_congestion_event(now + MS, now, true, 10 * u64::from(MTU));
        let text = crate::obs::metrics::render(&reg);
        assert!(text.contains("seedgate_tunnel_quic_random_losses_total 2"), "{text}");
        assert!(text.contains(r#"seedgate_tunnel_quic_window_cuts_total{cause="persistent"} 1"#), "{text}");
        assert!(text.contains(r#"seedgate_tunnel_quic_window_cuts_total{cause="loss"} 0"#), "{text}");
        assert!(text.contains("seedgate_tunnel_quic_min_rtt_probes_total 0"), "{text}");
        // The core counts as well, without stats.
        let b = b.into_any().downcast::<LossTolerant>().unwrap();
        assert_eq!(b.counts(), Counts { random_losses: 1, collapses: 1, ..Counts::default() });
    }
}
