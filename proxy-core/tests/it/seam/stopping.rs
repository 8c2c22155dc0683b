//! Stopping: the agent going away (HTTP/2 GOAWAY, QUIC's notice) drains its session — no new streams, the open ones run to their end, then both ends close in order; the seed's stop cuts its session.

use super::*;
use proxy_core::tunnel::{ControlMsg, DialError, TunnelSettings};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The agent going away: HTTP/2's GOAWAY (the seed learns of it from its next open), QUIC's
/// notice on the control stream (the seed knows at once).
async fn agent_stop_sends_goaway_new_opens_drain_old_streams_finish<T: Transport>() {
    let (seed, mut agent, _path) = pair::<T>(&TunnelSettings::default()).await;
    let (mut s, mut a) = open_accepted(&seed, &mut agent, "old:1").await;
    assert!(!seed.opener.is_closed());

    agent.stop.cancel();
    if T::NOTICE_ON_CONTROL {
        // QUIC's notice comes on the control stream: the seed knows before it opens anything.
        eventually("the seed sees the notice", || seed.opener.is_closed()).await;
    }
    // An open racing the notice may still reach the agent (HTTP/2's first GOAWAY admits streams
    // in flight); refuse those so the loop below never waits on them.
    let mut incoming = std::mem::replace(&mut agent.incoming, mpsc::unbounded_channel().1);
    let late = tokio::spawn(async move {
        let mut n = 0;
        while let Some(inc) = incoming.recv().await {
            inc.responder.refuse(&DialError::Limit("late".into()));
            n += 1;
        }
        n
    });
    let mut draining = None;
    for _ in 0..10 {
        match within("open after the notice", seed.opener.open("new:1", OPEN_TIMEOUT)).await {
            Err(e @ DialError::Draining(_)) => {
                draining = Some(e);
                break;
            }
            Err(DialError::Limit(_)) => continue, // sent before the notice arrived
            Err(e) => panic!("unexpected error after the notice: {e:?}"),
            Ok(_) => panic!("a stream opened after the notice was accepted"),
        }
    }
    let e = draining.expect("opens never failed as draining after the agent's notice");
    assert_eq!(e.http_status(), 503);
    assert!(seed.opener.is_closed(), "the opener reports closed once the agent drains");

    // The stream opened before the notice keeps working to its end, and holds the session open.
    s.write_all(b"in flight").await.unwrap();
    assert_eq!(read_exact_n(&mut a, 9).await, b"in flight");
    a.write_all(b"answer").await.unwrap();
    assert_eq!(read_exact_n(&mut s, 6).await, b"answer");
    assert!(!agent.task.is_finished(), "agent session ended with a stream in flight");
    s.shutdown().await.unwrap();
    assert_eof(&mut a).await;
    a.write_all(b"last words").await.unwrap();
    a.shutdown().await.unwrap();
    assert_eq!(read_exact_n(&mut s, 10).await, b"last words");
    assert_eof(&mut s).await;
    drop((s, a));

    // With the last stream done, both sessions end cleanly.
    let agent_result = within("agent session end", agent.task).await.unwrap();
    assert!(agent_result.is_ok(), "{agent_result:?}");
    let seed_result = within("seed session end", seed.task).await.unwrap();
    assert!(seed_result.is_ok(), "{seed_result:?}");
    assert!(within("late refuser", late).await.unwrap() <= 1);
}

async fn agent_stop_without_streams_ends_both_sessions<T: Transport>() {
    let (seed, agent, _path) = pair::<T>(&TunnelSettings::default()).await;
    eventually("agent hello", || seed.hello.get().is_some()).await;
    agent.stop.cancel();
    let r = within("agent session end", agent.task).await.unwrap();
    assert!(r.is_ok(), "{r:?}");
    let r = within("seed session end", seed.task).await.unwrap();
    assert!(r.is_ok(), "{r:?}");
    assert!(seed.opener.is_closed());
}

async fn seed_stop_ends_the_seed_session_as_stopped_and_the_agent_session_too<T: Transport>() {
    let (seed, mut agent, _path) = pair::<T>(&TunnelSettings::default()).await;
    let (_s, mut a) = open_accepted(&seed, &mut agent, "cut:1").await;
    seed.stop.cancel();
    let r = within("seed session end", seed.task).await.unwrap();
    assert!(matches!(r, Err(SessionError::Stopped)), "{r:?}");
    // The agent sees its transport close (no notice comes first); the variant it ends with is
    // not part of the contract, only that it ends.
    let _ = within("agent session end", agent.task).await.unwrap();
    assert!(seed.opener.is_closed());
    match seed.opener.open("x:1", OPEN_TIMEOUT).await {
        Err(DialError::Transport(_)) => {}
        Err(e) => panic!("expected a transport error, got {e:?}"),
        Ok(_) => panic!("opened a stream on a stopped session"),
    }
    assert!(seed.opener.control(&ControlMsg::Move { to: vec![], drain_deadline_ms: 1 }).is_err());
    // A stream cut by the end of the session is not an orderly end on the agent side.
    let mut buf = [0u8; 8];
    let r = within("read on a cut stream", a.read(&mut buf)).await;
    assert!(r.is_err(), "a stream cut with its session read as {r:?} instead of an error");
}

over_both!(
    agent_stop_sends_goaway_new_opens_drain_old_streams_finish,
    agent_stop_without_streams_ends_both_sessions,
    seed_stop_ends_the_seed_session_as_stopped_and_the_agent_session_too,
);
