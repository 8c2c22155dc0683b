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
//!
//! [`MIN_QUEUE_MARGIN`]: crate::tunnel::path::MIN_QUEUE_MARGIN
//! [`MAX_QUEUE_MARGIN`]: crate::tunnel::path::MAX_QUEUE_MARGIN

use std::any::Any;
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus::{IntCounter, Registry};
use quinn::congestion::{Controller, ControllerFactory, ControllerMetrics};

use crate::obs::metrics::{counter, counter_vec};
use crate::tunnel::path::{LOCAL_RTT, Queue, queue_margin, read_queue};

/// How long a minimum round trip holds without a sample confirming it.
pub const MIN_RTT_WINDOW: Duration = Duration::from_secs(10);

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
mod tests;
