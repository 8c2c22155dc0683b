//! Liveness: a session whose path goes silent ends at either end once its keepalive gives up (not before), a live idle session stays up for ever, and a peer that never starts the session cannot hold the agent.

use super::*;
use tokio::io::AsyncWriteExt;
use tokio::time::Instant;

/// The agent's end never runs and its path is silent: the seed's keepalive gets no answer.
async fn seed_session_ends_with_keepalive_timeout_when_the_agent_freezes<T: Transport>() {
    let settings = keepalive_settings();
    let (seed_side, _frozen_agent, path) = T::connect(&settings).await;
    path.go_silent();
    let start = Instant::now();
    let mut seed = spawn_seed::<T>(seed_side, &settings).await;
    let (earliest, latest) = (start + T::silence_noticed_after(&settings), start + T::silence_noticed_by(&settings));
    // Not before the keepalive could tell...
    assert!(
        tokio::time::timeout_at(earliest - Duration::from_millis(10), &mut seed.task).await.is_err(),
        "seed session ended before its keepalive could tell"
    );
    assert!(!seed.opener.is_closed());
    // ...but then.
    let r = tokio::time::timeout_at(latest + Duration::from_secs(1), &mut seed.task)
        .await
        .expect("seed session still up after its keepalive went unanswered")
        .unwrap();
    match r {
        Err(e) if T::is_silence(&e, &settings) => {}
        other => panic!("expected a keepalive timeout, got {other:?}"),
    }
    assert!(seed.opener.is_closed(), "a dead session takes no new streams");
    match seed.opener.open("x:1", OPEN_TIMEOUT).await {
        Err(DialError::Transport(_)) => {}
        Err(e) => panic!("expected a transport error, got {e:?}"),
        Ok(_) => panic!("opened a stream on a dead session"),
    }
}

/// The seed starts the session by hand, then its path goes silent: the agent's keepalive gets
/// no answer.
async fn agent_session_ends_with_keepalive_timeout_when_the_seed_freezes<T: Transport>() {
    let settings = keepalive_settings();
    let (seed_side, agent_side, path) = T::connect(&settings).await;
    let mut agent = spawn_agent::<T>(agent_side, &settings);
    let mut raw = T::RawSeed::start(seed_side).await;
    let _control = raw.control().await;
    within("the agent's session up", agent.established.wait_for(|up| *up)).await.unwrap();
    path.go_silent();
    let gone = Instant::now();
    let (earliest, latest) = (gone + T::silence_noticed_after(&settings), gone + T::silence_noticed_by(&settings));
    assert!(
        tokio::time::timeout_at(earliest - Duration::from_millis(10), &mut agent.task).await.is_err(),
        "agent session ended before its keepalive could tell"
    );
    let r = tokio::time::timeout_at(latest + Duration::from_secs(1), &mut agent.task)
        .await
        .expect("agent session still up after its keepalive went unanswered")
        .unwrap();
    assert!(matches!(&r, Err(e) if T::is_silence(e, &settings)), "{r:?}");
}

/// A path gone silent makes the session suspect at both ends once a keepalive has waited the
/// suspect time unanswered — long before the keepalive timeout ends it: it is still open, and
/// the seed could still open streams on it (a dial chooses not to).
async fn a_silent_path_makes_the_session_quiet_at_both_ends_long_before_it_ends<T: Transport>() {
    let settings = TunnelSettings {
        keepalive_suspect: Duration::from_secs(3),
        keepalive_timeout: Duration::from_secs(60),
        ..keepalive_settings()
    };
    let (seed, mut agent, path) = pair::<T>(&settings).await;
    let mut seed_quiet = seed.opener.quiet().expect("both transports tell").watch();
    let (_s, _a) = open_accepted(&seed, &mut agent, "open:1").await;
    tokio::time::sleep(settings.keepalive_interval * 4).await;
    if T::LIVE_PATH_TOLD_IN_VIRTUAL_TIME {
        assert!(!*seed_quiet.borrow() && !*agent.quiet.borrow(), "a live path is not quiet");
    }
    path.go_silent();
    let gone = Instant::now();
    // The first unanswered keepalive goes out within an interval; it waits the suspect time.
    let noticed = settings.keepalive_interval + settings.keepalive_suspect + Duration::from_secs(1);
    tokio::time::timeout(noticed, seed_quiet.wait_for(|q| *q)).await.expect("the seed saw the path quiet").unwrap();
    tokio::time::timeout_at(gone + noticed, agent.quiet.wait_for(|q| *q))
        .await
        .expect("the agent saw the path quiet")
        .unwrap();
    assert!(!seed.opener.is_closed() && !seed.task.is_finished() && !agent.task.is_finished(), "quiet is not dead");
    assert!(gone.elapsed() < settings.keepalive_timeout / 2);
}

async fn a_live_session_stays_up_across_many_keepalive_intervals<T: Transport>() {
    let settings = keepalive_settings();
    let (mut seed, mut agent, _path) = pair::<T>(&settings).await;
    let (mut s, mut a) = open_accepted(&seed, &mut agent, "idle:1").await;
    let before = seed.opener.heard().expect("both transports count signs of life");
    // 100 intervals of idle virtual time.
    tokio::time::sleep(settings.keepalive_interval * 100).await;
    let idle = seed.opener.heard().unwrap() - before;
    assert!(!seed.task.is_finished(), "seed session ended: {:?}", (&mut seed.task).await);
    assert!(!agent.task.is_finished(), "agent session ended: {:?}", (&mut agent.task).await);
    assert!(!seed.opener.is_closed());
    // Keepalives went both ways: the seed heard from the agent at least once per interval.
    assert!(idle >= 100 * T::HEARD_PER_INTERVAL, "only {idle} of keepalive traffic heard in 100 intervals");
    // The idle stream and new ones still work.
    s.write_all(b"still alive").await.unwrap();
    assert_eq!(read_exact_n(&mut a, 11).await, b"still alive");
    let (_s2, _a2) = open_accepted(&seed, &mut agent, "after-idle:1").await;
}

/// Keepalive starts only once the session is up: the seed's first words (HTTP/2: its preface;
/// QUIC: its control stream) have a deadline of their own, so a seed that completes its
/// handshake and then says nothing cannot hold the agent's session (and its slot).
async fn agent_session_ends_when_the_seed_never_starts_the_session<T: Transport>() {
    let settings = keepalive_settings();
    let (_silent_seed, agent_side, _path) = T::connect(&settings).await;
    let agent = spawn_agent::<T>(agent_side, &settings);
    let bound = settings.keepalive_interval + settings.keepalive_timeout + Duration::from_secs(1);
    let r = tokio::time::timeout(bound, agent.task).await;
    assert!(r.is_ok(), "agent session still waiting for the seed after {bound:?}");
}

/// QUIC: a silence of 20 s with both ends sending into it (each end's congestion window full of
/// what it lost, more waiting): once the path carries again, an open stream carries both ways
/// within about one PING interval, not after a retransmission back-off grown to seconds (the
/// back-off stops at the PING interval, and an end whose window is full still acknowledges the
/// first probe that crosses).
#[tokio::test(start_paused = true)]
async fn quic_an_open_stream_carries_again_within_a_ping_interval_of_a_long_silence() {
    let settings = TunnelSettings {
        keepalive_interval: Duration::from_secs(1),
        keepalive_suspect: Duration::from_secs(3),
        keepalive_timeout: Duration::from_secs(60),
        ..keepalive_settings()
    };
    let (seed, mut agent, path) = pair::<crate::seam::quic::Quic>(&settings).await;
    let (mut s, mut a) = open_accepted(&seed, &mut agent, "resume:1").await;
    path.go_silent();
    const LEN: usize = 256 * 1024;
    // Into quinn's send buffers at once; what goes out is lost.
    within("write up", s.write_all(&pattern(LEN, 1))).await.unwrap();
    within("write down", a.write_all(&pattern(LEN, 2))).await.unwrap();
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert!(!seed.task.is_finished() && !agent.task.is_finished(), "a silence shorter than the timeout ended it");

    path.go_live();
    let back = Instant::now();
    assert_eq!(read_exact_n(&mut a, LEN).await, pattern(LEN, 1));
    assert_eq!(read_exact_n(&mut s, LEN).await, pattern(LEN, 2));
    let took = back.elapsed();
    assert!(took <= settings.ping_every() * 2, "the stream carried again {took:?} after the path came back");
}

over_both!(
    seed_session_ends_with_keepalive_timeout_when_the_agent_freezes,
    agent_session_ends_with_keepalive_timeout_when_the_seed_freezes,
    a_live_session_stays_up_across_many_keepalive_intervals,
    a_silent_path_makes_the_session_quiet_at_both_ends_long_before_it_ends,
    agent_session_ends_when_the_seed_never_starts_the_session,
);
