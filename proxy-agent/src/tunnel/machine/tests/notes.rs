//! The notes the slot machine returns: what it counts and logs, where that matters.

use super::*;

/// How many of `notes` are `note`.
fn times(notes: &[Note], note: &Note) -> usize {
    notes.iter().filter(|n| *n == note).count()
}

/// A reconnect that fails is counted once, however it fails (refused at connect, or ended before
/// it was up: the server's verdict on our certificate comes after TLS), and warned about once.
#[test]
fn a_failed_reconnect_is_counted_once_and_logged_once() {
    let mut b = Bed::new(Transport::H2);
    let (id, ..) = dial_of(&b.wake().1);
    assert_eq!(b.take_notes(), [Note::Metric(Metric::Down)], "a new slot has no session");
    let failed = Note::Log(Log::Failed { target: hp("192.0.2.1:8132"), error: refused() });
    let reconnect_failed = Note::Metric(Metric::Reconnect { ok: false });
    b.fail(id);
    assert_eq!(b.take_notes(), [failed.clone(), Note::Metric(Metric::Down)], "the first dial is no reconnect");
    let (id, ..) = dial_of(&b.wake().1);
    b.fail(id);
    assert_eq!(b.take_notes(), [failed, Note::Metric(Metric::Down), reconnect_failed.clone()]);
    let (id, ..) = dial_of(&b.wake().1);
    assert_eq!(b.feed(Event::Dialed { id, result: Ok(addr(1)) }), vec![]);
    assert_eq!(b.take_notes(), [], "running, not up: nothing to report yet");
    assert_eq!(b.feed(Event::Ended { id, error: ended("certificate unknown") }), vec![]);
    let error = Failure::Ended("certificate unknown".into());
    assert_eq!(
        b.take_notes(),
        [Note::Log(Log::FailedBeforeUp { error }), Note::Metric(Metric::Down), reconnect_failed]
    );
    assert_eq!(b.metrics.reconnects("failed"), 2);
}

/// A server that answers nothing is warned about once; the tries after that are logged with
/// their count, each one still a failed reconnect. A refusal is warned about again.
#[test]
fn a_silent_server_is_warned_about_once_then_logged_with_its_tries() {
    let mut b = Bed::new(Transport::H2);
    let (target, error) = (hp("192.0.2.1:8132"), Failure::Unanswered("connect 192.0.2.1:8132: timed out".into()));
    let (_, mut id) = b.wake_dial();
    let mut logs = Vec::new();
    for _ in 0..3 {
        b.take_notes();
        assert_eq!(b.feed(Event::Dialed { id, result: Err(error.clone()) }), vec![]);
        logs.extend(b.take_notes().into_iter().filter(|n| matches!(n, Note::Log(_))));
        id = b.wake_dial().1;
    }
    let still = |tries| Note::Log(Log::StillNoAnswer { target: target.clone(), error: error.clone(), tries });
    assert_eq!(logs, [Note::Log(Log::Failed { target: target.clone(), error: error.clone() }), still(1), still(2)]);
    assert_eq!(b.metrics.reconnects("failed"), 2, "every try after the first is a failed reconnect");
    b.take_notes();
    b.fail(id);
    assert_eq!(times(&b.take_notes(), &Note::Log(Log::Failed { target, error: refused() })), 1);
}

/// A replacement for a draining replica that is not kept is logged with the reason; one that is
/// kept retires the old session with the reason the driver logs.
#[test]
fn a_replacement_is_logged_with_its_reason() {
    let (mut b, old) = draining_bed(2);
    b.take_notes();
    let (c1, ..) = dial_of(&b.feed(Event::Announced(old, info("a", 2, 1, true))));
    let announced = Note::Log(Log::Announced { id: "a".into(), count: 2, draining: true });
    let draining = Note::Log(Log::Draining { target: hp("192.0.2.1:8132") });
    assert_eq!(b.take_notes(), [announced, draining]);
    // It reached the replica slot 1 holds.
    assert_eq!(b.bring_up(c1, addr(2), None), vec![]);
    assert_eq!(b.take_notes(), [], "a candidate is no live session: not reported up");
    assert_eq!(retire_of(&b.feed(Event::Announced(c1, info("b", 2, 1, false)))), (c1, None));
    let rejected = |id: Option<&str>| Note::Log(Log::Rejected { id: id.map(String::from) });
    let no_replacement = |error| Note::Log(Log::NoReplacement { error });
    assert_eq!(b.take_notes(), [rejected(Some("b")), no_replacement(Failure::HeldOrDraining)]);
    // It did not come up by its deadline.
    let (c2, ..) = dial_of(&b.wake().1);
    assert_eq!(b.feed(Event::Dialed { id: c2, result: Ok(addr(3)) }), vec![]);
    assert_eq!(retire_of(&b.wake().1), (c2, None));
    assert_eq!(b.take_notes(), [rejected(None), no_replacement(Failure::NotUpInTime)]);
    // It was refused.
    let (c3, ..) = dial_of(&b.wake().1);
    assert_eq!(b.fail(c3), vec![]);
    assert_eq!(b.take_notes(), [no_replacement(refused())]);
    // A restarted "a" is kept: the old session is retired, saying why; the new one is up.
    let (c4, ..) = dial_of(&b.wake().1);
    let a = b.bring_up(c4, addr(4), Some(info("a", 2, 5, false)));
    let [Action::Retire { id, drain: None, open: false, why }] = a.as_slice() else { panic!("{a:?}") };
    assert_eq!((*id, *why), (old, "replica draining: replaced; its streams finish there"));
    let up = Note::Log(Log::Up { target: hp("192.0.2.1:8132"), peer: addr(4), over: Carrier::H2 });
    let notes = b.take_notes();
    assert_eq!(notes[..3], [up, Note::Metric(Metric::Up(Carrier::H2)), Note::Metric(Metric::Reconnect { ok: true })]);
}

/// `auto`'s fallback is logged when QUIC fails and counted only once h2 gets through; a probe
/// that moves the session back to QUIC is counted once.
#[test]
fn auto_s_fallback_is_logged_when_quic_fails_and_counted_once_h2_gets_through() {
    let mut b = Bed::new(Transport::Auto);
    let (q0, ..) = dial_of(&b.wake().1);
    b.take_notes();
    let (h2, ..) = dial_of(&b.fail(q0));
    let fell_back = Note::Log(Log::FallBack { target: hp("192.0.2.1:8132"), error: refused() });
    assert_eq!(b.take_notes(), std::slice::from_ref(&fell_back), "not counted yet: h2 may fail too");
    assert_eq!(b.fail(h2), vec![]);
    let to_h2 = Note::Metric(Metric::TransportChange { from: Carrier::Quic, to: Carrier::H2 });
    assert_eq!(times(&b.take_notes(), &to_h2), 0, "h2 failed as well");
    let (q1, ..) = dial_of(&b.wake().1);
    let (h2, ..) = dial_of(&b.fail(q1));
    assert_eq!(b.bring_up(h2, addr(1), None), vec![]);
    let notes = b.take_notes();
    assert_eq!((times(&notes, &fell_back), times(&notes, &to_h2)), (1, 1));
    let (q2, ..) = dial_of(&b.wake().1);
    assert_eq!(b.bring_up(q2, addr(1), None), vec![]);
    assert_eq!(retire_of(&b.feed(Event::Announced(q2, info("a", 1, 1, false)))), (h2, None));
    let to_quic = Note::Metric(Metric::TransportChange { from: Carrier::H2, to: Carrier::Quic });
    assert_eq!(times(&b.take_notes(), &to_quic), 1);
}
