//! The `loss_tolerant` controller on a virtual path: growth, the queue it reads, losses told apart, cuts, the minimum round trip, and the quinn glue.

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
