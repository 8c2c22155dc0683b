//! An HTTP/2 session's bound on the bytes its TCP socket holds unacknowledged: what the path carries plus a short queue, from the socket's own round trips (sans-IO).
//!
//! Every stream of an HTTP/2 session shares one TCP connection, which delivers in order. The
//! kernel's congestion control (BBR, Cubic) fills the path's bottleneck queue and then overflows
//! it, by design: a lost packet costs a bulk transfer little. Inside a tunnel it costs every
//! stream behind it a round trip or more, and a queue costs every stream its length: a keystroke
//! behind a download waits for both. So the session writes no more than this bound into its
//! socket, counting what its bytes occupy of the path (written and not yet acknowledged, unsent
//! ones included, less those that left the network: selectively acknowledged, or lost and not
//! yet sent again, so that random loss does not shrink what is in flight). The bound follows the
//! socket's smoothed round trip against its minimum, once per round trip:
//!
//! | queueing delay (smoothed − minimum) | the bound |
//! |---|---|
//! | within the margin, and the bound held a write back | at once to the delivery rate times the path plus the margin where that is more, else by half a margin's worth of the path, up to what the delivery rate fills with twice the margin |
//! | within twice the margin | holds: the path is full |
//! | beyond, the session busy for two round trips | the delivery rate times the path plus the margin (no more than halved) |
//!
//! The margin is the one QUIC's controller reads too ([`queue_margin`]: an eighth of the minimum round trip,
//! 2-10 ms, so that twice it fits in a bottleneck's queue); the delivery rate
//! is the largest recent sample (each adjustment forgets an eighth of it). While a queue stands
//! the bottleneck is busy, so the delivery rate is what the path gives the session. Until the
//! first standing queue the socket has no bound: TCP's own start-up finds the path's rate, and
//! the bound starts at that rate across the path plus the margin. The bound outlives idle
//! periods (after one, TCP restarts from ten segments and grows up to the bound, not past the
//! bottleneck), and [`InflightBound::pacing_rate`] keeps the restart's burst from overflowing a
//! short queue. A session that sends little does not move it: a queue it did not build is not its
//! own. The smoothed round trip averages acknowledgements, so after an idle period (a
//! keepalive's, acknowledged late) it says nothing of the load until the socket has been busy
//! for two round trips. A long queue that stays at the floor is read as a longer route, whose
//! round trip becomes the minimum. On a local path (below [`LOCAL_RTT`]) there is no bound.
//!
//! Where the kernel's congestion control is BBR, it would drain a connection that has been busy
//! for 10 s without a round trip at or below its minimum to four packets for 200 ms and a round
//! trip (ProbeRTT), and every stream of the session, a keystroke's included, would wait for it:
//! half a second at 150 ms. Under the bound BBR never reads its minimum again (the bound keeps a
//! queue of up to twice the margin, and an empty queue only matches the minimum by chance) and
//! never leaves its start-up either (the bound, not BBR, limits what is sent, so every rate sample
//! is limited by the application), so ProbeRTT would come every 10 s. What ProbeRTT is for, the
//! bound does already: it keeps the queue short and follows a longer route. So while the bound is
//! set, [`InflightBound::restart_min_rtt_clock`] says when to start BBR afresh (every
//! [`MIN_RTT_CLOCK`], never while the socket recovers from a loss), which starts its 10 s again;
//! the congestion window and what is in flight stay, and the pacing cap holds the start-up's.

use crate::tunnel::path::{LOCAL_RTT, Queue, queue_margin, read_queue};
use std::time::{Duration, Instant};

/// The bound never goes below this: a few dozen packets, enough for a trickle's bursts.
pub const FLOOR: u64 = 64 * 1024;

/// Nor above this (the kernel's send buffer is smaller anyway unless raised).
pub const CEILING: u64 = 256 * 1024 * 1024;

/// The deepest cut of one adjustment.
const MIN_CUT: f64 = 0.5;

/// How much faster than the bound's own rate the socket may send ([`InflightBound::pacing_rate`]).
const PACING_GAIN: f64 = 1.1;

/// How often a bounded socket's BBR is started afresh: well within its 10 s minimum-round-trip
/// window ([`InflightBound::restart_min_rtt_clock`]).
pub const MIN_RTT_CLOCK: Duration = Duration::from_secs(5);

/// What the socket says of its path at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathSample {
    /// The smoothed round trip.
    pub srtt: Duration,
    /// The smallest round trip the socket has seen.
    pub min_rtt: Duration,
    /// Bytes written and not yet acknowledged (sent or not).
    pub held: u64,
    /// The latest delivery-rate sample, bytes a second (0: none). While a queue stands at the
    /// bottleneck the bottleneck is busy, so this is the rate the path gives the session.
    pub delivery_rate: u64,
}

/// One session socket's bound; see the module's doc.
#[derive(Debug, Clone, Default)]
pub struct InflightBound {
    bound: Option<u64>,
    next_adjust: Option<Instant>,
    held_back: bool,
    /// A minimum raised above the socket's own after a long queue at the floor (a longer route).
    raised_min: Option<Duration>,
    /// The minimum round trip of the latest sample (the raised one where it is higher).
    min: Duration,
    /// Since when the socket holds enough to be the cause of a queue (half its bound).
    busy_since: Option<Instant>,
    /// The largest recent delivery rate: each adjustment forgets an eighth of it.
    rate: u64,
    /// When BBR was last started afresh ([`Self::restart_min_rtt_clock`]).
    clock_restarted: Option<Instant>,
}

impl InflightBound {
    pub fn new() -> Self {
        Self::default()
    }

    /// The most bytes the socket may hold unacknowledged; `None`: no bound (yet).
    pub fn bound(&self) -> Option<u64> {
        self.bound
    }

    /// A write waited for the bound since the last adjustment: the bound may be what limits.
    pub fn held_back(&mut self) {
        self.held_back = true;
    }

    /// How much of `len` bytes the socket may take now, holding `held`: all of them without a
    /// bound, else what fits under it (0: the write waits, and [`Self::held_back`] is noted).
    pub fn room(&mut self, held: u64, len: usize) -> usize {
        let Some(bound) = self.bound else { return len };
        let room = usize::try_from(bound.saturating_sub(held)).unwrap_or(usize::MAX).min(len);
        if room == 0 {
            self.held_back();
        }
        room
    }

    /// The fastest the socket may send, in bytes a second, while it has a bound: the bound's rate
    /// across the path plus the margin, and a tenth more. Without it a transfer after an idle
    /// period (or a start-up's pacing, at nearly three times the rate; or the refill after BBR's
    /// ProbeRTT, which drains the path to four packets every 10 s) sends the whole bound in a
    /// burst that overflows a bottleneck queue shorter than it; with it the queue grows by at
    /// most an eleventh of the bound: 28 ms of a path's rate at 300 ms (a quarter more let it
    /// grow by 60 ms there, past a 50 ms queue).
    pub fn pacing_rate(&self) -> Option<u64> {
        let bound = self.bound?;
        let per = (self.min + queue_margin(self.min)).as_secs_f64();
        Some(scale(bound, PACING_GAIN / per))
    }

    /// Whether a socket whose congestion control is BBR should start it afresh at `now`, before
    /// its minimum round trip expires into ProbeRTT (see the module's doc): while the bound is
    /// set (it, not BBR, limits what is sent), at most once per [`MIN_RTT_CLOCK`], and not while
    /// the socket is `recovering` from a loss (BBR afresh would forget the window to restore).
    /// `true` counts as done.
    pub fn restart_min_rtt_clock(&mut self, now: Instant, recovering: bool) -> bool {
        if self.bound.is_none() || recovering || self.clock_restarted.is_some_and(|t| now < t + MIN_RTT_CLOCK) {
            return false;
        }
        self.clock_restarted = Some(now);
        true
    }

    /// One look at the socket at `now`.
    pub fn sample(&mut self, now: Instant, s: PathSample) {
        if s.srtt.is_zero() || s.min_rtt < LOCAL_RTT {
            return;
        }
        if let Some(raised) = &mut self.raised_min {
            *raised = (*raised).min(s.srtt);
        }
        let min = self.raised_min.map_or(s.min_rtt, |r| r.max(s.min_rtt));
        self.min = min;
        let margin = queue_margin(min);
        let queue = read_queue(s.srtt, min);
        // What the path carries plus the margin: from the delivery rate (the path's, while a
        // queue stands), or from what the socket holds at `srtt`.
        let plus_margin = (min + margin).as_secs_f64();
        self.rate = self.rate.max(s.delivery_rate);
        let by_rate = scale(self.rate, plus_margin);
        let by_held = scale(s.held, plus_margin / s.srtt.as_secs_f64());
        // The smoothed round trip is an average over acknowledgements: after an idle period
        // (a keepalive's, whose acknowledgements come late) it says nothing of the load until
        // the socket has been busy for a couple of round trips.
        let busy = s.held >= self.bound.map_or(2 * FLOOR, |b| b / 2);
        self.busy_since = if busy { self.busy_since.or(Some(now)) } else { None };
        let settled = self.busy_since.is_some_and(|t| now >= t + 2 * s.srtt);
        let Some(bound) = self.bound else {
            // TCP's start-up until the first standing queue the session built itself. Start-up
            // paces at up to three times the rate it has seen, so a queue shows before the
            // session holds the path's worth: the delivery rate says what the path carries.
            if queue != Queue::None && settled {
                self.bound = Some(by_held.max(by_rate).clamp(FLOOR, CEILING));
                self.next_adjust = Some(now + s.srtt);
                self.held_back = false;
            }
            return;
        };
        if self.next_adjust.is_some_and(|t| now < t) {
            return;
        }
        self.next_adjust = Some(now + s.srtt);
        let rate = self.rate;
        self.rate = s.delivery_rate.max(self.rate - self.rate / 8);
        match queue {
            Queue::Long { .. } if settled && bound <= FLOOR => self.raised_min = Some(s.srtt),
            Queue::Long { .. } if settled => {
                let target = if rate > 0 { by_rate } else { scale(bound, plus_margin / s.srtt.as_secs_f64()) };
                self.bound = Some(target.clamp(scale(bound, MIN_CUT), bound).max(FLOOR));
            }
            Queue::None if self.held_back => {
                // Where the delivery rate says the path carries more than the bound, the bound
                // goes there at once: one set while start-up's rate was still climbing (the
                // queue shows before the path is full) would take dozens of round trips to grow
                // by half-margins on a long path, 7 s at 300 ms. Past that, half a margin's
                // worth of the path per round trip, but never past what the delivery rate says
                // fills the path and twice the margin: a queue that reads empty just after
                // losses drained it is no room to grow into.
                let step = scale(bound, margin.as_secs_f64() / (2.0 * s.srtt.as_secs_f64())).max(1500);
                let mut grown = bound.saturating_add(step);
                if rate > 0 {
                    grown = grown.max(by_rate).min(scale(rate, (min + 2 * margin).as_secs_f64()).max(bound));
                }
                self.bound = Some(grown.min(CEILING));
            }
            _ => {}
        }
        self.held_back = false;
    }
}

fn scale(bytes: u64, factor: f64) -> u64 {
    // Bytes up to CEILING times a factor of at most a few: exact enough in f64.
    (bytes as f64 * factor) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1_000_000;

    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    fn s(srtt_ms: u64, min_ms: u64, held: u64) -> PathSample {
        PathSample {
            srtt: Duration::from_millis(srtt_ms),
            min_rtt: Duration::from_millis(min_ms),
            held,
            delivery_rate: 0,
        }
    }

    fn rated(srtt_ms: u64, min_ms: u64, held: u64, bytes_per_second: u64) -> PathSample {
        PathSample { delivery_rate: bytes_per_second, ..s(srtt_ms, min_ms, held) }
    }

    /// `sample` at `t0`, the socket having held as much for two round trips before.
    fn settled(b: &mut InflightBound, t0: Instant, sample: PathSample) {
        b.sample(t0 - 2 * sample.srtt, sample);
        b.sample(t0, sample);
    }

    /// A bound set by a standing queue at 150 ms: 2.5 MB held at 175 ms.
    fn started(t0: Instant) -> InflightBound {
        let mut b = InflightBound::new();
        settled(&mut b, t0, s(175, 150, 2_500_000));
        b
    }

    #[test]
    fn no_bound_until_the_session_builds_a_standing_queue() {
        let t0 = Instant::now();
        let mut b = InflightBound::new();
        b.sample(t0, s(150, 150, 10 * MB));
        b.sample(at(t0, 150), s(158, 150, 10 * MB));
        assert_eq!(b.bound(), None, "a queue within the margin (10 ms at 150 ms)");
        b.sample(at(t0, 300), s(175, 150, 100_000));
        assert_eq!(b.bound(), None, "a queue the session did not build: it holds little");
        assert_eq!(b.room(10 * MB, 4096), 4096, "no bound: every write goes");
        b.sample(at(t0, 450), s(175, 150, 2_500_000));
        assert_eq!(b.bound(), None, "busy for less than two round trips: the average still holds the idle period");
        b.sample(at(t0, 800), s(175, 150, 2_500_000));
        // 2.5 MB at 175 ms is what 160 ms (the path plus the margin) holds × 175 / 160.
        assert_eq!(b.bound(), Some(2_285_714));
    }

    #[test]
    fn a_start_up_queue_before_the_path_is_full_starts_the_bound_at_the_paths_rate() {
        // Start-up pacing fills the queue while the session holds 300 KB of a 3.75 MB path
        // (100 Mbit/s, 300 ms): the delivery rate is the link's.
        let t0 = Instant::now();
        let mut b = InflightBound::new();
        settled(&mut b, t0, rated(325, 300, 300_000, 12_500_000));
        assert_eq!(b.bound(), Some(scale(12_500_000, 0.310)), "the path plus 10 ms");
    }

    #[test]
    fn a_long_queue_cuts_to_the_delivery_rate_plus_the_margin() {
        let t0 = Instant::now();
        let mut b = started(t0);
        // 10 MB/s at 150 ms is 1.6 MB with the margin.
        b.sample(at(t0, 200), rated(200, 150, 2_000_000, 10_000_000));
        assert_eq!(b.bound(), Some(1_600_000));
        // A rate above the bound never grows it on a long queue.
        b.sample(at(t0, 400), rated(200, 150, 1_600_000, 100_000_000));
        assert_eq!(b.bound(), Some(1_600_000));
    }

    #[test]
    fn growth_stops_where_the_delivery_rate_fills_the_path_and_twice_the_margin() {
        let t0 = Instant::now();
        let mut b = started(t0);
        let first = b.bound().unwrap();
        // 14 MB/s across 150 ms and twice 10 ms: 2.38 MB, a few steps above the bound.
        let ceiling = scale(14_000_000, 0.170);
        let mut t = 0;
        for _ in 0..20 {
            t += 200;
            b.held_back();
            b.sample(at(t0, t), rated(150, 150, b.bound().unwrap(), 14_000_000));
        }
        assert!(first < ceiling);
        assert_eq!(b.bound(), Some(ceiling));
        // A rate below the bound never cuts it while no queue shows.
        b.held_back();
        b.sample(at(t0, t + 200), rated(150, 150, ceiling, 1_000_000));
        assert_eq!(b.bound(), Some(ceiling));
    }

    #[test]
    fn a_bound_set_while_start_up_climbed_goes_to_the_paths_rate_in_one_round_trip() {
        // 300 ms at 100 Mbit/s: the queue showed while the socket held 2.75 MB of a 3.75 MB
        // path and the delivery rate still read 7.5 MB/s.
        let t0 = Instant::now();
        let mut b = InflightBound::new();
        settled(&mut b, t0, rated(318, 300, 2_750_000, 7_500_000));
        let first = b.bound().unwrap();
        assert_eq!(first, scale(2_750_000, 310.0 / 318.0), "what the socket held, less its queue");
        // The next round trip holds writes back with no queue, at the link's 12 MB/s.
        b.held_back();
        b.sample(at(t0, 320), rated(301, 300, first, 12_000_000));
        let path = scale(12_000_000, 0.310);
        assert_eq!(b.bound(), Some(path), "the path plus the margin at once, not half-margins");
        // From there growth is by half-margins again, to the ceiling.
        b.held_back();
        b.sample(at(t0, 640), rated(301, 300, path, 12_000_000));
        let next = b.bound().unwrap();
        assert!(next > path && next < path + path / 50, "{next} after {path}");
    }

    #[test]
    fn the_pacing_rate_is_the_bounds_rate_and_a_tenth() {
        let t0 = Instant::now();
        assert_eq!(InflightBound::new().pacing_rate(), None);
        let b = started(t0);
        // 2,285,714 bytes per 160 ms is 14.3 MB/s (114 Mbit/s); a tenth more.
        assert_eq!(b.pacing_rate(), Some(scale(2_285_714, 1.1 / 0.160)));
        assert!((15_714_000..=15_714_300).contains(&b.pacing_rate().unwrap()));
    }

    #[test]
    fn room_is_what_fits_under_the_bound() {
        let t0 = Instant::now();
        let mut b = started(t0);
        let bound = b.bound().unwrap();
        assert_eq!(b.room(bound - 1000, 16384), 1000);
        assert_eq!(b.room(0, 16384), 16384);
        assert_eq!(b.room(bound, 16384), 0);
        assert!(b.held_back, "a write that waits is noted");
        assert_eq!(b.room(bound + 5, 16384), 0);
    }

    #[test]
    fn a_bound_that_holds_writes_back_grows_while_no_queue_shows() {
        let t0 = Instant::now();
        let mut b = started(t0);
        let first = b.bound().unwrap();
        b.held_back();
        b.sample(at(t0, 100), s(150, 150, first));
        assert_eq!(b.bound(), Some(first), "at most one adjustment per round trip");
        b.sample(at(t0, 175), s(150, 150, first));
        // Half a margin (5 ms) of a 150 ms round trip: a thirtieth.
        let grown = b.bound().unwrap();
        assert_eq!(grown, first + first / 30);
        b.sample(at(t0, 400), s(150, 150, grown));
        assert_eq!(b.bound(), Some(grown), "no write waited: the bound is not what limits");
    }

    #[test]
    fn a_full_path_holds_the_bound() {
        let t0 = Instant::now();
        let mut b = started(t0);
        let first = b.bound().unwrap();
        for i in 1..10 {
            b.held_back();
            b.sample(at(t0, 200 * i), s(165, 150, first));
        }
        assert_eq!(b.bound(), Some(first), "a queue between the margin and twice it");
    }

    #[test]
    fn a_long_queue_shrinks_the_bound_to_the_path_plus_the_margin_at_most_by_half() {
        let t0 = Instant::now();
        let mut b = started(t0);
        b.sample(at(t0, 200), s(200, 150, 2_000_000));
        assert_eq!(b.bound(), Some(scale(2_285_714, 160.0 / 200.0)));
        let now = b.bound().unwrap();
        b.sample(at(t0, 1000), s(600, 150, now));
        assert_eq!(b.bound(), Some(now / 2), "never below half in one step");
    }

    #[test]
    fn a_long_queue_the_session_did_not_build_leaves_the_bound() {
        let t0 = Instant::now();
        let mut b = started(t0);
        let first = b.bound().unwrap();
        b.sample(at(t0, 200), s(250, 150, first / 4));
        assert_eq!(b.bound(), Some(first));
    }

    #[test]
    fn the_bound_never_leaves_its_floor_and_ceiling() {
        let t0 = Instant::now();
        let mut b = InflightBound::new();
        settled(&mut b, t0, s(60, 50, 2 * FLOOR));
        assert!(b.bound().unwrap() >= FLOOR);
        for i in 1..20 {
            b.sample(at(t0, 100 * i), s(400, 50, 10 * MB));
        }
        assert_eq!(b.bound(), Some(FLOOR));
        let mut b = InflightBound { bound: Some(CEILING - 10), ..InflightBound::default() };
        b.held_back();
        b.sample(t0, s(50, 50, CEILING));
        assert_eq!(b.bound(), Some(CEILING));
    }

    #[test]
    fn a_long_queue_at_the_floor_is_a_longer_route() {
        // The route went from 50 to 150 ms: the kernel's minimum still says 50.
        let t0 = Instant::now();
        let mut b = InflightBound { bound: Some(FLOOR), ..InflightBound::default() };
        settled(&mut b, t0, s(150, 50, FLOOR));
        assert_eq!(b.bound(), Some(FLOOR));
        // Now 150 ms is the path, and the bound grows again.
        for i in 1..=10 {
            b.held_back();
            b.sample(at(t0, 150 * i), s(150, 50, FLOOR));
        }
        assert!(b.bound().unwrap() > FLOOR, "{:?}", b.bound());
    }

    #[test]
    fn a_local_path_has_no_bound() {
        let t0 = Instant::now();
        let mut b = InflightBound::new();
        let local = PathSample { min_rtt: Duration::from_micros(50), ..s(5, 1, 10 * MB) };
        for i in 0..10 {
            b.sample(at(t0, 10 * i), local);
        }
        assert_eq!(b.bound(), None);
        b.sample(t0, PathSample { srtt: Duration::ZERO, ..s(0, 50, 10 * MB) });
        assert_eq!(b.bound(), None, "no round trip yet");
    }

    #[test]
    fn bbr_is_started_afresh_while_the_bound_is_set_every_five_seconds_and_never_in_recovery() {
        let t0 = Instant::now();
        let mut b = InflightBound::new();
        assert!(!b.restart_min_rtt_clock(t0, false), "no bound: BBR's start-up finds the path");
        let mut b = started(t0);
        assert!(b.bound().is_some());
        assert!(!b.restart_min_rtt_clock(t0, true), "recovering from a loss");
        assert!(b.restart_min_rtt_clock(at(t0, 1), false), "the first look with the bound set");
        assert!(!b.restart_min_rtt_clock(at(t0, 1), false), "once");
        assert!(!b.restart_min_rtt_clock(at(t0, 5_000), false), "within five seconds");
        assert!(!b.restart_min_rtt_clock(at(t0, 5_001), true), "due, but recovering");
        assert!(b.restart_min_rtt_clock(at(t0, 5_002), false), "due, and open again");
        // After an idle minute the first look is due at once: the transfer that ends the idle
        // period is not drained to four packets by the first acknowledgement.
        assert!(b.restart_min_rtt_clock(at(t0, 65_000), false));
        assert!(!b.restart_min_rtt_clock(at(t0, 65_100), false));
    }
}
