//! The slot machine driven on a virtual clock: every path of a slot, event by event.

use super::Machine;
use super::events::{Action, Carrier, Event, Failure, QueryId, SessionId, Settings, Slot};
use super::notes::{Log, Metric, Note};
use super::state::RESCUE_PATIENCE;
use crate::replicas::{Replicas, Verdict};
use crate::tunnel::metrics::{SlotMetrics, TunnelMetrics};
use proxy_core::prometheus::{IntGauge, Registry};
use proxy_core::tunnel::ServerInfo;
use seedgate_config::HostPort;
use seedgate_config::agent::Transport;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn hp(s: &str) -> HostPort {
    s.parse().expect("host:port")
}

/// 192.0.2.n:8132
fn addr(n: u8) -> SocketAddr {
    SocketAddr::from(([192, 0, 2, n], 8132))
}

fn info(id: &str, count: u32, since_ms: u64, draining: bool) -> ServerInfo {
    ServerInfo { id: id.into(), count, since_ms, draining }
}

fn settings(transport: Transport) -> Settings {
    Settings {
        transport,
        reconnect_initial: ms(250),
        reconnect_max: secs(30),
        dial_timeout: secs(5),
        rehome_drain: secs(30),
        quic_probe_interval: secs(60),
        reresolve: secs(10),
    }
}

fn replicas() -> Arc<Replicas> {
    let g = |n: &str| IntGauge::new(n, n).expect("gauge");
    Arc::new(Replicas::new("ps".into(), g("held"), g("expected")))
}

/// One slot's machine on a virtual clock; its metric notes are performed on `metrics` as the
/// driver does, and every note is kept in `notes`.
struct Bed {
    m: Machine,
    r: Arc<Replicas>,
    metrics: SlotMetrics,
    notes: Vec<Note>,
    now: Instant,
}

impl Bed {
    /// Slot 0 of a fresh replica set, dialing the IP literal 192.0.2.1:8132.
    fn new(transport: Transport) -> Self {
        let r = replicas();
        r.add_slot();
        Self::slot(&r, 0, "192.0.2.1:8132", settings(transport), 1.0)
    }

    /// Slot `index` (already added) of `r`; every jitter draw is `draw`.
    fn slot(r: &Arc<Replicas>, index: usize, configured: &str, s: Settings, draw: f64) -> Self {
        let tm = TunnelMetrics::new(&Registry::new());
        let label = format!("slot{index}");
        let metrics = SlotMetrics::new(&tm.session, &label, &r.name);
        let now = Instant::now();
        let slot = Slot { index, configured: hp(configured), replicas: r.clone() };
        let m = Machine::new(now, slot, s, Box::new(move || draw));
        Self { m, r: r.clone(), metrics, notes: Vec::new(), now }
    }

    /// The actions of one step; its notes are performed and kept.
    fn feed(&mut self, e: Event) -> Vec<Action> {
        let step = self.m.handle(self.now, e);
        for note in step.notes {
            if let Note::Metric(m) = note {
                self.metrics.record(m);
            }
            self.notes.push(note);
        }
        step.actions
    }

    /// The notes since the last call.
    fn take_notes(&mut self) -> Vec<Note> {
        std::mem::take(&mut self.notes)
    }

    /// Move the clock to the machine's next timer and fire it: how long that was, what it did.
    fn wake(&mut self) -> (Duration, Vec<Action>) {
        let at = self.m.poll_timeout().expect("a timer is armed");
        let waited = at.saturating_duration_since(self.now);
        self.now = at;
        (waited, self.feed(Event::Timer))
    }

    fn advance(&mut self, d: Duration) -> Vec<Action> {
        self.now += d;
        self.feed(Event::Timer)
    }

    /// `id` was dialled and reached `peer`; it comes up, and its replica announces `info`.
    fn bring_up(&mut self, id: SessionId, peer: SocketAddr, info: Option<ServerInfo>) -> Vec<Action> {
        assert_eq!(self.feed(Event::Dialed { id, result: Ok(peer) }), vec![]);
        let up = self.feed(Event::Up(id));
        match info {
            Some(i) => self.feed(Event::Announced(id, i)),
            None => up,
        }
    }

    /// The next timer dials; that session comes up at `peer`.
    fn connect(&mut self, peer: SocketAddr, info: Option<ServerInfo>) -> SessionId {
        let (id, ..) = dial_of(&self.wake().1);
        assert_eq!(self.bring_up(id, peer, info), vec![]);
        id
    }

    /// The next timer dials: how long it waited, and the session's id.
    fn wake_dial(&mut self) -> (Duration, SessionId) {
        let (waited, a) = self.wake();
        (waited, dial_of(&a).0)
    }

    /// `id`'s dial is refused.
    fn fail(&mut self, id: SessionId) -> Vec<Action> {
        self.feed(Event::Dialed { id, result: Err(refused()) })
    }

    /// The readiness detail of the slot's replica set.
    fn detail(&self) -> String {
        self.r.check().detail
    }
}

fn refused() -> Failure {
    Failure::Failed("connect proxy.seed.example.com:8132: Connection refused".into())
}

fn ended(why: &str) -> Option<Failure> {
    Some(Failure::Ended(why.into()))
}

fn dial_of(a: &[Action]) -> (SessionId, HostPort, Carrier) {
    match a {
        [Action::Dial { id, target, over, .. }] => (*id, target.clone(), *over),
        other => panic!("expected one dial, got {other:?}"),
    }
}

fn retire_of(a: &[Action]) -> (SessionId, Option<Duration>) {
    let (id, drain, _) = retire_open_of(a);
    (id, drain)
}

/// The retirement, and whether the old server may still open streams on it until its drain ends.
fn retire_open_of(a: &[Action]) -> (SessionId, Option<Duration>, bool) {
    match a {
        [Action::Retire { id, drain, open, .. }] => (*id, *drain, *open),
        other => panic!("expected one retirement, got {other:?}"),
    }
}

fn resolve_of(a: &[Action]) -> (QueryId, HostPort) {
    match a {
        [Action::Resolve { query, name }] => (*query, name.clone()),
        other => panic!("expected one resolution, got {other:?}"),
    }
}

fn moved(to: &str, drain_deadline_ms: u64) -> Event {
    Event::Move { to: vec![to.into()], drain_deadline_ms }
}

#[test]
fn a_move_notice_re_homes_make_before_break_with_its_drain_deadline() {
    let mut b = Bed::new(Transport::H2);
    let old = b.connect(addr(1), Some(info("a", 1, 1, false)));
    assert!(b.detail().contains("session up to 192.0.2.1:8132"), "{}", b.detail());
    let (q, name) = resolve_of(&b.feed(moved("192.0.2.9:8132", 3000)));
    assert_eq!(name, hp("192.0.2.9:8132"));
    let (new, target, over) = dial_of(&b.feed(Event::Resolved { query: q, addrs: Some(vec![addr(9)]) }));
    assert_eq!((target, over), (hp("192.0.2.9:8132"), Carrier::H2));
    // Dialled, not up yet: the old session stays live.
    assert_eq!(b.feed(Event::Dialed { id: new, result: Ok(addr(9)) }), vec![]);
    assert!(b.detail().contains("session up to 192.0.2.1:8132"), "{}", b.detail());
    // Up: now the old one is retired; the seed it leaves may still open streams on it for the
    // notice's 3 s (its kube-apiserver serves until the move completes), then GOAWAY.
    assert_eq!(retire_open_of(&b.feed(Event::Up(new))), (old, Some(ms(3000)), true));
    assert!(b.detail().contains("session up to 192.0.2.9:8132"), "{}", b.detail());
    assert_eq!(b.metrics.counts().0, 1, "one move notice counted");
    assert_eq!(b.metrics.reconnects("ok"), 1, "the new session is a reconnect that came up");
    assert_eq!(b.feed(Event::Announced(new, info("b", 1, 2, false))), vec![]);
    // The slot stays where it was sent: after that session ends, it dials there again.
    assert_eq!(b.feed(Event::Ended { id: new, error: None }), vec![]);
    let (again, target, _) = dial_of(&b.wake().1);
    assert_eq!(target, hp("192.0.2.9:8132"));
    // Until it does not answer there: then the slot falls back to its configured name.
    assert_eq!(b.fail(again), vec![]);
    assert_eq!(dial_of(&b.wake().1).1, hp("192.0.2.1:8132"));
}

#[test]
fn a_move_notice_without_a_deadline_or_a_target_goes_to_the_name_and_waits_for_the_server() {
    let mut b = Bed::new(Transport::H2);
    let old = b.connect(addr(1), None);
    let (q, name) = resolve_of(&b.feed(Event::Move { to: vec!["not an address".into()], drain_deadline_ms: 0 }));
    assert_eq!(name, hp("192.0.2.1:8132"), "nothing parsable: the configured name");
    let (new, ..) = dial_of(&b.feed(Event::Resolved { query: q, addrs: None }));
    assert_eq!(retire_of(&b.bring_up(new, addr(2), None)), (old, None), "no deadline: the server ends them");
}

#[test]
fn a_move_target_that_does_not_answer_leaves_the_slot_on_its_session() {
    let mut b = Bed::new(Transport::H2);
    let live = b.connect(addr(1), None);
    let (q, _) = resolve_of(&b.feed(moved("192.0.2.9:8132", 3000)));
    let (gone, ..) = dial_of(&b.feed(Event::Resolved { query: q, addrs: Some(vec![addr(9)]) }));
    assert_eq!(b.fail(gone), vec![], "refused: nothing retired");
    assert!(b.detail().contains("session up to 192.0.2.1:8132"), "{}", b.detail());
    // A target that accepts but never comes up is closed at the deadline; the session stays.
    let (q, _) = resolve_of(&b.feed(moved("192.0.2.9:8132", 3000)));
    let (mute, ..) = dial_of(&b.feed(Event::Resolved { query: q, addrs: Some(vec![addr(9)]) }));
    assert_eq!(b.feed(Event::Dialed { id: mute, result: Ok(addr(9)) }), vec![]);
    let (waited, a) = b.wake();
    assert_eq!((waited, retire_of(&a)), (secs(5), (mute, None)));
    assert!(b.detail().contains("session up to 192.0.2.1:8132"), "{}", b.detail());
    // The live session was never retired, and the slot still dials its own name after it.
    assert_eq!(b.feed(Event::Ended { id: live, error: None }), vec![]);
    assert_eq!(dial_of(&b.wake().1).1, hp("192.0.2.1:8132"));
}

#[test]
fn a_move_notice_for_where_the_slot_already_is_changes_nothing() {
    let mut b = Bed::new(Transport::H2);
    b.connect(addr(1), None);
    let (q, _) = resolve_of(&b.feed(moved("seed-b:8132", 3000)));
    assert_eq!(b.feed(Event::Resolved { query: q, addrs: Some(vec![addr(7), addr(1)]) }), vec![]);
    assert_eq!(b.m.poll_timeout(), None, "no errand, no timer");
    assert!(b.detail().contains("session up to 192.0.2.1:8132"), "{}", b.detail());
}

#[test]
fn a_move_notice_that_comes_while_the_slot_is_busy_is_acted_on_after() {
    let mut b = Bed::new(Transport::H2);
    // Before the session is even dialled: kept until there is one.
    let (_, a) = b.wake();
    let (first, ..) = dial_of(&a);
    assert_eq!(b.feed(moved("192.0.2.8:8132", 0)), vec![]);
    let (_, name) = resolve_of(&b.feed(Event::Dialed { id: first, result: Ok(addr(1)) }));
    assert_eq!(name, hp("192.0.2.8:8132"), "resolved once there is a session");
    let mut b = Bed::new(Transport::H2);
    b.connect(addr(1), None);
    let (q, _) = resolve_of(&b.feed(moved("192.0.2.8:8132", 0)));
    // A newer notice while the first is handled replaces any other waiting one.
    assert_eq!(b.feed(moved("192.0.2.7:8132", 0)), vec![]);
    assert_eq!(b.feed(moved("192.0.2.9:8132", 0)), vec![]);
    let (_, name) = resolve_of(&b.feed(Event::Resolved { query: q, addrs: Some(vec![addr(1)]) }));
    assert_eq!(name, hp("192.0.2.9:8132"), "the newest waiting notice, once the first is done");
    assert_eq!(b.metrics.counts().0, 3, "every notice counted");
}

#[test]
fn the_slot_follows_its_name_when_it_resolves_elsewhere() {
    let r = replicas();
    r.add_slot();
    let mut b = Bed::slot(&r, 0, "ps.seed:8132", settings(Transport::H2), 1.0);
    let old = b.connect(addr(1), None);
    // Every `reresolve`: the name still includes the peer, nothing happens.
    let (waited, a) = b.wake();
    let (q, name) = resolve_of(&a);
    assert_eq!((waited, name), (secs(10), hp("ps.seed:8132")));
    assert_eq!(b.feed(Event::Resolved { query: q, addrs: Some(vec![addr(1), addr(2)]) }), vec![]);
    // A failed or empty answer is no reason to move either.
    let (q, _) = resolve_of(&b.wake().1);
    assert_eq!(b.feed(Event::Resolved { query: q, addrs: None }), vec![]);
    let (q, _) = resolve_of(&b.wake().1);
    assert_eq!(b.feed(Event::Resolved { query: q, addrs: Some(vec![]) }), vec![]);
    // The name moved: a session to it first, then the old one drains for `rehome_drain`.
    let (q, _) = resolve_of(&b.wake().1);
    let (new, target, _) = dial_of(&b.feed(Event::Resolved { query: q, addrs: Some(vec![addr(5)]) }));
    assert_eq!(target, hp("ps.seed:8132"));
    assert_eq!(b.feed(Event::Dialed { id: new, result: Ok(addr(5)) }), vec![]);
    assert_eq!(retire_open_of(&b.feed(Event::Up(new))), (old, Some(secs(30)), true));
    assert_eq!(b.metrics.counts().0, 1);
    // A target given as an address has nothing to follow.
    let mut b = Bed::new(Transport::H2);
    b.connect(addr(1), None);
    assert_eq!(b.m.poll_timeout(), None);
}

/// Slot 0 of a set of `count` replicas whose slot 1 holds replica "b"; slot 0 is up at
/// replica "a", which now drains.
fn draining_bed(count: u32) -> (Bed, SessionId) {
    let r = replicas();
    r.add_slot();
    let other = r.add_slot();
    let mut b = Bed::slot(&r, 0, "192.0.2.1:8132", settings(Transport::H2), 1.0);
    let old = b.connect(addr(1), Some(info("a", count, 1, false)));
    r.up(other, "x");
    assert_eq!(r.announced(other, &info("b", count, 1, false)), Verdict::Keep);
    (b, old)
}

#[test]
fn a_draining_replica_is_replaced_by_one_neither_held_nor_draining() {
    let (mut b, old) = draining_bed(2);
    // Draining: the slot looks for a replacement right away, behind the configured name.
    let (c1, target, _) = dial_of(&b.feed(Event::Announced(old, info("a", 2, 1, true))));
    assert_eq!(target, hp("192.0.2.1:8132"));
    assert!(b.detail().starts_with("degraded"), "{}", b.detail());
    // It reached "b", which slot 1 holds: closed, tried again after the probe back-off.
    assert_eq!(b.bring_up(c1, addr(2), None), vec![], "up, but not judged before it announces");
    assert_eq!(retire_of(&b.feed(Event::Announced(c1, info("b", 2, 1, false)))), (c1, None));
    let (waited, a) = b.wake();
    assert_eq!(waited, ms(250));
    // ... another draining replica is no replacement either.
    let (c2, ..) = dial_of(&a);
    assert_eq!(retire_of(&b.bring_up(c2, addr(3), Some(info("c", 2, 1, true)))), (c2, None));
    let (waited, a) = b.wake();
    assert_eq!(waited, ms(500), "the probe back-off grows");
    // A restarted "a" (same id, not draining) is: it takes over, the old session is retired.
    let (c3, ..) = dial_of(&a);
    // GOAWAY at once: the draining replica's own front ends take no new connection anyway.
    assert_eq!(retire_open_of(&b.bring_up(c3, addr(4), Some(info("a", 2, 5, false)))), (old, None, false));
    assert!(b.detail().starts_with("connected: 2 of 2"), "{}", b.detail());
    assert!(b.detail().contains("(192.0.2.4:8132)"), "{}", b.detail());
    assert_eq!(b.m.poll_timeout(), None, "nothing more to look for");
}

#[test]
fn a_replacement_is_not_dialled_while_the_other_slots_already_reach_the_count() {
    let (mut b, old) = draining_bed(1);
    // Count 1, and slot 1 holds a replica that does not drain: this slot does not dial.
    assert_eq!(b.feed(Event::Announced(old, info("a", 1, 1, true))), vec![]);
    let (waited, a) = b.wake();
    assert_eq!((waited, a), (ms(250), vec![]));
    // Slot 1's session goes: now the slot looks.
    b.r.down(1, "gone");
    let (waited, a) = b.wake();
    assert_eq!(waited, ms(500));
    dial_of(&a);
}

#[test]
fn a_replacement_from_a_server_that_announces_nothing_is_taken_once_up_at_the_deadline() {
    let (mut b, old) = draining_bed(2);
    let (c1, ..) = dial_of(&b.feed(Event::Announced(old, info("a", 2, 1, true))));
    assert_eq!(b.bring_up(c1, addr(2), None), vec![]);
    let (waited, a) = b.wake();
    assert_eq!((waited, retire_of(&a)), (secs(5), (old, None)));
    // One that does not even come up is closed at the deadline instead.
    let (mut b, old) = draining_bed(2);
    let (c1, ..) = dial_of(&b.feed(Event::Announced(old, info("a", 2, 1, true))));
    assert_eq!(b.feed(Event::Dialed { id: c1, result: Ok(addr(2)) }), vec![]);
    assert_eq!(retire_of(&b.wake().1), (c1, None));
}

#[test]
fn the_live_session_ending_during_a_replacement_hands_the_slot_to_the_candidate() {
    let (mut b, old) = draining_bed(2);
    let (c1, ..) = dial_of(&b.feed(Event::Announced(old, info("a", 2, 1, true))));
    assert_eq!(b.feed(Event::Dialed { id: c1, result: Ok(addr(2)) }), vec![]);
    // The draining replica closes its session before the candidate is judged.
    assert_eq!(b.feed(Event::Ended { id: old, error: None }), vec![], "no back-off: a session is on its way");
    assert!(b.detail().starts_with("degraded: 1 of 2"), "{}", b.detail());
    assert_eq!(b.feed(Event::Up(c1)), vec![]);
    assert!(b.detail().contains("(192.0.2.2:8132)"), "{}", b.detail());
    // It is the live session now, judged as one: a duplicate of slot 1's replica is closed.
    assert_eq!(retire_of(&b.feed(Event::Announced(c1, info("b", 2, 1, false)))), (c1, None));
    // Still dialing: a dial in flight is handed over the same way.
    let (mut b, old) = draining_bed(2);
    let (c1, ..) = dial_of(&b.feed(Event::Announced(old, info("a", 2, 1, true))));
    assert_eq!(b.feed(Event::Ended { id: old, error: ended("reset") }), vec![]);
    assert_eq!(b.m.poll_timeout(), None, "waiting for the dial, not a timer");
    assert_eq!(b.bring_up(c1, addr(3), Some(info("c", 2, 1, false))), vec![]);
    assert!(b.detail().starts_with("connected: 2 of 2"), "{}", b.detail());
}

#[test]
fn a_duplicate_is_closed_and_the_slot_dials_again_after_the_probe_back_off() {
    let r = replicas();
    let (held, mine) = (r.add_slot(), r.add_slot());
    r.up(held, "x");
    assert_eq!(r.announced(held, &info("a", 2, 1, false)), Verdict::Keep);
    let mut b = Bed::slot(&r, mine, "192.0.2.1:8132", settings(Transport::H2), 1.0);
    // The slot reaches "a", which the other slot holds: a duplicate, closed.
    let (_, id) = b.wake_dial();
    assert_eq!(b.bring_up(id, addr(1), None), vec![]);
    assert_eq!(retire_of(&b.feed(Event::Announced(id, info("a", 2, 1, false)))), (id, None));
    assert_eq!(b.metrics.counts().1, 1, "counted");
    assert_eq!(b.metrics.gauges().0, 0, "the slot has no session");
    assert!(b.detail().starts_with("degraded: 1 of 2"), "{}", b.detail());
    // It dials the same place again after the probe back-off, which grows up to its 5 s cap
    // (far below `reconnect.max`, 30 s).
    let mut waits = Vec::new();
    for _ in 0..7 {
        let (waited, id) = b.wake_dial();
        waits.push(waited);
        assert_eq!(retire_of(&b.bring_up(id, addr(1), Some(info("a", 2, 1, false)))), (id, None));
    }
    assert_eq!(waits, [250, 500, 1000, 2000, 4000, 5000, 5000].map(ms));
    // A session that reaches another replica is kept.
    let (_, id) = b.wake_dial();
    assert_eq!(b.bring_up(id, addr(2), Some(info("c", 2, 1, false))), vec![]);
    assert!(b.detail().starts_with("connected: 2 of 2"), "{}", b.detail());
}

#[test]
fn auto_falls_back_to_h2_and_moves_back_to_quic_once_it_gets_through() {
    let mut b = Bed::new(Transport::Auto);
    let (q0, target, over) = dial_of(&b.wake().1);
    assert_eq!((target, over), (hp("192.0.2.1:8132"), Carrier::Quic));
    let (h2, target, over) = dial_of(&b.fail(q0));
    assert_eq!((target, over), (hp("192.0.2.1:8132"), Carrier::H2), "same place, over h2");
    assert_eq!(b.bring_up(h2, addr(1), None), vec![]);
    assert_eq!(b.metrics.transport_changes(Carrier::Quic, Carrier::H2), 1);
    assert_eq!(b.metrics.gauges(), (1, 1, 0));
    assert!(b.detail().contains("over h2"), "{}", b.detail());
    // The periodic probe: QUIC still blocked, the h2 session stays.
    let (waited, a) = b.wake();
    let (q1, target, over) = dial_of(&a);
    assert_eq!((waited, target, over), (secs(60), hp("192.0.2.1:8132"), Carrier::Quic));
    assert_eq!(b.fail(q1), vec![], "no fallback for a probe: it is over h2 already");
    // The next one gets through: the QUIC session takes over, the h2 one finishes its streams.
    let (waited, a) = b.wake();
    let (q2, _, over) = dial_of(&a);
    assert_eq!((waited, over), (secs(60), Carrier::Quic));
    assert_eq!(b.bring_up(q2, addr(1), None), vec![], "judged on its announcement");
    assert_eq!(retire_of(&b.feed(Event::Announced(q2, info("a", 1, 1, false)))), (h2, None));
    assert_eq!(b.metrics.transport_changes(Carrier::H2, Carrier::Quic), 1);
    assert_eq!(b.metrics.gauges(), (1, 0, 1));
    assert!(b.detail().contains("over quic"), "{}", b.detail());
    assert_eq!(b.m.poll_timeout(), None, "on QUIC: no more probes");
}

#[test]
fn auto_probes_quic_only_while_the_h2_session_is_up_and_no_replacement_is_looked_for() {
    let mut b = Bed::new(Transport::Auto);
    let (q0, ..) = dial_of(&b.wake().1);
    let (h2, ..) = dial_of(&b.fail(q0));
    assert_eq!(b.feed(Event::Dialed { id: h2, result: Ok(addr(1)) }), vec![]);
    // Not up yet when the probe is due: no probe, the next one is armed.
    let (waited, a) = b.wake();
    assert_eq!((waited, a), (secs(60), vec![]));
    assert_eq!(b.feed(Event::Up(h2)), vec![]);
    // Its replica drains: the replacement (auto: QUIC first) is looked for, the probe waits.
    let (r1, _, over) = dial_of(&b.feed(Event::Announced(h2, info("a", 1, 1, true))));
    assert_eq!(over, Carrier::Quic);
    assert_eq!(b.m.poll_timeout(), None, "the dial is under way; no probe meanwhile");
    let (r2, _, over) = dial_of(&b.fail(r1));
    assert_eq!(over, Carrier::H2);
    assert_eq!(b.fail(r2), vec![]);
    // The probe is long due, but the replacement search comes first, and only it.
    let (r3, _, over) = dial_of(&b.advance(secs(61)));
    assert_eq!(over, Carrier::Quic);
    let (_, _, over) = dial_of(&b.fail(r3));
    assert_eq!(over, Carrier::H2, "the replacement's dial: a probe would not fall back to h2");
}

#[test]
fn the_back_off_grows_to_reconnect_max_and_resets_only_after_a_session_that_lived_reconnect_max() {
    let mut s = settings(Transport::H2);
    s.reconnect_max = secs(2);
    let r = replicas();
    r.add_slot();
    let mut b = Bed::slot(&r, 0, "192.0.2.1:8132", s, 1.0);
    let (_, mut id) = b.wake_dial();
    let mut waits = Vec::new();
    for _ in 0..5 {
        assert_eq!(b.fail(id), vec![]);
        let (waited, next) = b.wake_dial();
        waits.push(waited);
        id = next;
    }
    assert_eq!(waits, [250, 500, 1000, 2000, 2000].map(ms));
    // A session that lived longer than `reconnect.max` (never up: a slow server) resets it.
    assert_eq!(b.feed(Event::Dialed { id, result: Ok(addr(1)) }), vec![]);
    b.now += secs(3);
    assert_eq!(b.feed(Event::Ended { id, error: ended("reset") }), vec![]);
    let (waited, id) = b.wake_dial();
    assert_eq!(waited, ms(250));
    // A short one that never came up does not...
    assert_eq!(b.feed(Event::Dialed { id, result: Ok(addr(1)) }), vec![]);
    assert_eq!(b.feed(Event::Ended { id, error: ended("reset") }), vec![]);
    let (waited, mut id) = b.wake_dial();
    assert_eq!(waited, ms(500));
    // ... nor does one that came up and was closed at once (a server that accepts sessions and
    // drops them): it is redialled at a growing interval...
    for want in [1000, 2000, 2000] {
        assert_eq!(b.bring_up(id, addr(1), None), vec![]);
        b.now += ms(10);
        assert_eq!(b.feed(Event::Ended { id, error: None }), vec![]);
        let (waited, next) = b.wake_dial();
        assert_eq!(waited, ms(want));
        id = next;
    }
    // ... while one that came up and lived `reconnect.max` does.
    assert_eq!(b.bring_up(id, addr(1), None), vec![]);
    b.now += secs(2);
    assert_eq!(b.feed(Event::Ended { id, error: None }), vec![]);
    let (waited, id) = b.wake_dial();
    assert_eq!(waited, ms(250));
    // A reload lowers the cap: the wait armed stands, the next one is clamped.
    assert_eq!(b.fail(id), vec![]);
    s.reconnect_max = ms(300);
    b.m.configure(s);
    let (waited, id) = b.wake_dial();
    assert_eq!(waited, ms(500));
    assert_eq!(b.fail(id), vec![]);
    assert_eq!(b.wake_dial().0, ms(300));
}

/// A server, or a middlebox before it, that accepts sessions and closes them at once is not
/// redialled every `reconnect.initial`: only a session that carried a stream (or lived
/// `reconnect.max`) resets the back-off. Each one that did not is counted as a storm avoided.
#[test]
fn only_a_session_that_carried_a_stream_or_lived_resets_the_back_off_and_storms_avoided_are_counted() {
    let mut b = Bed::new(Transport::H2);
    let mut id = b.connect(addr(1), None);
    let mut waits = Vec::new();
    // Accepted and closed at once, ten times: 1 minute of such a server.
    for _ in 0..10 {
        b.now += ms(20);
        assert_eq!(b.feed(Event::Ended { id, error: None }), vec![]);
        let (waited, next) = b.wake_dial();
        assert_eq!(b.bring_up(next, addr(1), None), vec![]);
        waits.push(waited);
        id = next;
    }
    assert_eq!(waits, [250, 500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000].map(ms));
    let dials_in_a_minute = waits
        .iter()
        .scan(Duration::ZERO, |t, w| {
            *t += *w;
            Some(*t)
        })
        .filter(|t| *t <= secs(60))
        .count();
    assert_eq!(dials_in_a_minute, 7, "not one every 250-500 ms (over 120 a minute)");
    assert_eq!(b.metrics.counted()[2], 10, "storms avoided");
    // One that carried a stream proved itself, however short it was.
    assert_eq!(b.feed(Event::Carried(id)), vec![]);
    b.now += ms(20);
    assert_eq!(b.feed(Event::Ended { id, error: None }), vec![]);
    assert_eq!(b.wake_dial().0, ms(250));
    assert_eq!(b.metrics.counted()[2], 10, "not a storm");
}

/// The live session goes quiet: rescue dials to the same place (each within the rescue patience,
/// the next one a jittered pace after a failure) until one comes up; it takes over and the quiet
/// one is retired make-before-break, its streams left to run. A session that answers again stops
/// the rescue.
#[test]
fn a_quiet_session_is_rescued_make_before_break_and_one_that_answers_again_is_kept() {
    let mut b = Bed::new(Transport::H2);
    let live = b.connect(addr(1), Some(info("a", 1, 1, false)));
    assert_eq!(b.m.phase(), ("connected", None));
    let a = b.feed(Event::Quiet { id: live, silent: true });
    assert_eq!(b.m.phase(), ("suspect", None), "the status page shows the slot suspect");
    let [Action::Dial { id: r1, target, over: Carrier::H2, patience: Some(p) }] = a.as_slice() else { panic!("{a:?}") };
    assert_eq!((target, *p), (&hp("192.0.2.1:8132"), RESCUE_PATIENCE));
    assert_eq!(b.metrics.counted()[0], 1);
    // The path is still silent: the dial times out; the next one follows within the pace.
    b.now += RESCUE_PATIENCE;
    assert_eq!(b.fail(*r1), vec![]);
    let (waited, r2) = b.wake_dial();
    assert_eq!(waited, ms(500));
    // The path heals: the rescue comes up at the same replica and takes over; the quiet session
    // gets GOAWAY at once, its streams run to their end (no drain deadline).
    assert_eq!(b.feed(Event::Dialed { id: r2, result: Ok(addr(1)) }), vec![]);
    assert_eq!(b.feed(Event::Up(r2)), vec![]);
    assert_eq!(retire_open_of(&b.feed(Event::Announced(r2, info("a", 1, 1, false)))), (live, None, false));
    assert_eq!(b.metrics.counted()[..2], [1, 1], "one suspect, one replaced");
    assert!(b.detail().starts_with("connected"), "{}", b.detail());
    // The old session's later news changes nothing.
    assert_eq!(b.feed(Event::Quiet { id: live, silent: false }), vec![]);
    assert_eq!(b.m.poll_timeout(), None);

    // Quiet, then it answers again before any rescue got through: no more rescue dials.
    let a = b.feed(Event::Quiet { id: r2, silent: true });
    let (r3, ..) = dial_of(&a);
    assert_eq!(b.feed(Event::Quiet { id: r2, silent: false }), vec![]);
    assert_eq!(b.m.phase(), ("connected", None), "and connected once it answers again");
    b.now += RESCUE_PATIENCE;
    assert_eq!(b.fail(r3), vec![]);
    assert_eq!(b.m.poll_timeout(), None, "nothing to rescue");
    assert_eq!(b.metrics.counted()[..2], [2, 1]);
}

/// A rescue that reaches a replica another slot holds is closed, and the next one waits for the
/// growing probe back-off, not the short pace: the other replicas are not handed a session every
/// half second while this slot's path stays silent.
#[test]
fn a_rescue_reaching_a_replica_held_elsewhere_is_retried_on_the_probe_back_off() {
    let (mut b, old) = draining_bed(2);
    let (r1, ..) = dial_of(&b.feed(Event::Quiet { id: old, silent: true }));
    let mut waits = Vec::new();
    let mut id = r1;
    for _ in 0..4 {
        assert_eq!(retire_of(&b.bring_up(id, addr(2), Some(info("b", 2, 1, false)))), (id, None));
        let (waited, next) = b.wake_dial();
        waits.push(waited);
        id = next;
    }
    assert_eq!(waits, [500, 500, 1000, 2000].map(ms));
    assert_eq!(b.metrics.counted()[1], 0, "nothing replaced");
}

/// A server that answers nothing at all (the path is silent) is probed at the rescue pace with
/// short tries, every fourth with the full timeouts, so a healed path is used within about a
/// second; the back-off neither grows meanwhile nor applies. One that refuses is backed off from.
#[test]
fn a_silent_server_is_probed_at_a_short_pace_and_a_refusing_one_backed_off_from() {
    let mut b = Bed::new(Transport::H2);
    let timed_out = |b: &mut Bed, id| {
        let error = Failure::Unanswered("connect 192.0.2.1:8132: timed out".into());
        b.feed(Event::Dialed { id, result: Err(error) })
    };
    let a = b.wake().1;
    let [Action::Dial { id, patience: None, .. }] = a.as_slice() else { panic!("{a:?}") };
    let mut id = *id;
    let mut seen = Vec::new();
    for _ in 0..6 {
        assert_eq!(timed_out(&mut b, id), vec![]);
        let (waited, a) = b.wake();
        let [Action::Dial { id: next, patience, .. }] = a.as_slice() else { panic!("{a:?}") };
        seen.push((waited, *patience));
        id = *next;
    }
    let quick = Some(RESCUE_PATIENCE);
    assert_eq!(
        seen,
        [(ms(500), quick), (ms(500), quick), (ms(500), quick), (ms(500), None), (ms(500), quick), (ms(500), quick)]
    );
    // The path answers with a refusal: back-off from its first step.
    assert_eq!(b.fail(id), vec![]);
    let (waited, a) = b.wake();
    assert_eq!(waited, ms(250));
    let [Action::Dial { patience: None, .. }] = a.as_slice() else { panic!("{a:?}") };
}

#[test]
fn a_session_failing_before_it_was_up_is_a_failed_reconnect_after_it_is_not() {
    let mut b = Bed::new(Transport::H2);
    // The first attempt is not a reconnect.
    let (id, ..) = dial_of(&b.wake().1);
    b.fail(id);
    assert_eq!((b.metrics.reconnects("ok"), b.metrics.reconnects("failed")), (0, 0));
    // Refused after TLS (the server's verdict on our certificate): failed.
    let (id, ..) = dial_of(&b.wake().1);
    assert_eq!(b.feed(Event::Dialed { id, result: Ok(addr(1)) }), vec![]);
    assert_eq!(b.feed(Event::Ended { id, error: ended("certificate unknown") }), vec![]);
    assert_eq!((b.metrics.reconnects("ok"), b.metrics.reconnects("failed")), (0, 1));
    // Readiness names the cause, not only the state.
    assert!(b.detail().contains("not connected: ") && b.detail().contains("certificate unknown"), "{}", b.detail());
    // Up, then it ends: an ok reconnect, and its end is no failure.
    let id = b.connect(addr(1), None);
    assert_eq!(b.metrics.gauges().0, 1);
    assert_eq!(b.feed(Event::Ended { id, error: ended("reset") }), vec![]);
    assert_eq!((b.metrics.reconnects("ok"), b.metrics.reconnects("failed")), (1, 1));
    assert_eq!(b.metrics.gauges().0, 0);
    // Refused at connect: failed.
    let (id, ..) = dial_of(&b.wake().1);
    b.fail(id);
    assert_eq!(b.metrics.reconnects("failed"), 2);
}

#[test]
fn a_rising_count_gets_a_new_slot_and_a_shrinking_one_parks_a_slot() {
    let r = replicas();
    assert_eq!(r.grow(), 0..1);
    let mut b0 = Bed::slot(&r, 0, "192.0.2.1:8132", settings(Transport::H2), 1.0);
    let s0 = b0.connect(addr(1), Some(info("a", 2, 1, false)));
    // Two replicas announced: a second slot, which dials.
    assert_eq!(r.grow(), 1..2);
    let mut b1 = Bed::slot(&r, 1, "192.0.2.1:8132", settings(Transport::H2), 1.0);
    let s1 = b1.connect(addr(2), Some(info("b", 2, 1, false)));
    assert!(b0.detail().starts_with("connected: 2 of 2"), "{}", b0.detail());
    // A newer announcement: one replica. Slot 1's session ends; it does not dial again.
    assert_eq!(b0.feed(Event::Announced(s0, info("a", 1, 2, false))), vec![]);
    assert_eq!(b1.feed(Event::Ended { id: s1, error: None }), vec![]);
    assert_eq!(b1.wake().1, vec![], "parked");
    assert_eq!(b1.m.poll_timeout(), None);
    assert_eq!(b1.feed(Event::Wanted), vec![], "still not wanted");
    // Slot 0's session goes: slot 1 is wanted again (and dials at once).
    assert_eq!(b0.feed(Event::Ended { id: s0, error: None }), vec![]);
    dial_of(&b1.feed(Event::Wanted));
    assert_eq!(r.grow(), 2..2);
}

#[test]
fn stop_ends_the_slot() {
    let mut b = Bed::new(Transport::Auto);
    let (id, ..) = dial_of(&b.wake().1);
    assert_eq!(b.feed(Event::Stop), vec![]);
    assert_eq!(b.m.poll_timeout(), None);
    for e in [Event::Dialed { id, result: Ok(addr(1)) }, Event::Up(id), moved("192.0.2.9:8132", 1), Event::Timer] {
        assert_eq!(b.feed(e), vec![], "nothing after stop");
    }
}

#[test]
fn jitter_draws_spread_the_waits() {
    let r = replicas();
    r.add_slot();
    let mut b = Bed::slot(&r, 0, "192.0.2.1:8132", settings(Transport::Auto), 0.0);
    let (_, q) = b.wake_dial();
    let (h2, ..) = dial_of(&b.fail(q));
    assert_eq!(b.fail(h2), vec![]);
    // The lowest draw: half the back-off step, ¾ of the QUIC probe interval.
    let (waited, q) = b.wake_dial();
    assert_eq!(waited, ms(125));
    let (h2, ..) = dial_of(&b.fail(q));
    assert_eq!(b.bring_up(h2, addr(1), None), vec![]);
    let (waited, a) = b.wake();
    assert_eq!((waited, dial_of(&a).2), (secs(45), Carrier::Quic));
}

mod notes;
