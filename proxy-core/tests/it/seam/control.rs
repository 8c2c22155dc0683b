//! The control stream: the agent's hello, the seed's messages in order, lines over the limit, lines the agent does not know, how lines are framed, and which stream may come first.

use super::*;
use proxy_core::tunnel::{AgentHello, DialError, ServerInfo, TunnelSettings};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn hello_reaches_the_seed_and_control_messages_reach_the_agent_in_order<T: Transport>() {
    let (seed, mut agent, _path) = pair::<T>(&TunnelSettings::default()).await;
    eventually("agent hello at the seed", || seed.hello.get().is_some()).await;
    assert_eq!(seed.hello.get().cloned(), Some(agent_hello()));

    let msgs = [move_msg(&["seed-b.example:443"], 30_000), move_msg(&[], 0), move_msg(&["a:1", "b:2"], 5)];
    for m in &msgs {
        seed.opener.control(m).expect("control queued");
    }
    for m in &msgs {
        assert_eq!(&within("control at the agent", agent.control.recv()).await.unwrap(), m);
    }
    // A line close to the limit still goes through.
    let big = move_msg(&[&"h".repeat(60 * 1024)], 1);
    seed.opener.control(&big).unwrap();
    assert_eq!(within("big control at the agent", agent.control.recv()).await.unwrap(), big);
}

/// A stream, a refusal and a control message on one session, one after the other.
async fn streams_refusals_and_control_messages_go_through_one_session<T: Transport>() {
    let (seed, mut agent, _path) = pair::<T>(&TunnelSettings::default()).await;
    eventually("agent hello at the seed", || seed.hello.get().is_some()).await;
    assert_eq!(seed.hello.get().cloned(), Some(agent_hello()));

    let (mut s, mut a) = open_accepted(&seed, &mut agent, "10.0.0.1:443").await;
    assert_eq!(seed.opener.active_streams(), 1);
    s.write_all(b"ping").await.unwrap();
    let mut buf = [0u8; 4];
    a.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"ping");
    a.write_all(b"pong").await.unwrap();
    a.shutdown().await.unwrap();
    let mut back = Vec::new();
    within("answer and FIN", s.read_to_end(&mut back)).await.unwrap();
    assert_eq!(back, b"pong");

    let err = DialError::NotAllowed("10.9.9.9:22 is not on the allowlist".into());
    assert_eq!(open_refused(&seed, &mut agent, "10.9.9.9:22", &err).await, err);
    assert!(!seed.opener.is_closed(), "a refusal does not close the session");

    let msg = ControlMsg::Server(ServerInfo { id: "r0".into(), count: 2, since_ms: 1, draining: false });
    seed.opener.control(&msg).unwrap();
    assert_eq!(within("control at the agent", agent.control.recv()).await.unwrap(), msg);
}

async fn control_line_over_the_limit_is_not_delivered_and_the_control_stream_is_reset<T: Transport>() {
    let (seed_side, agent_side, _path) = T::connect(&TunnelSettings::default()).await;
    let mut agent = spawn_agent::<T>(agent_side, &TunnelSettings::default());
    let mut raw = T::RawSeed::start(seed_side).await;
    let (mut ctl, hello) = raw.control().await;
    assert_eq!(serde_json::from_slice::<AgentHello>(hello.strip_suffix(b"\n").unwrap()).unwrap(), agent_hello());

    // 64 KiB + 1 without a newline: the agent must give up on the line...
    ctl.send(&vec![b'x'; 64 * 1024 + 1]).await;
    // ...and not resynchronise on the next newline: a valid message after it is not read either.
    ctl.send(b"\n").await;
    ctl.send(&line(&move_msg(&["smuggled:1"], 1))).await;
    // The agent ends the control stream.
    ctl.ended_by_agent().await;
    assert!(agent.control.try_recv().is_err(), "a control message was delivered from an oversized line");

    // The session survives: streams open...
    let answer = tokio::spawn(raw.connect("after:1"));
    let inc = next_incoming(&mut agent).await;
    assert_eq!(inc.target, "after:1");
    let _stream = inc.responder.accept().unwrap();
    let a = within("answer", answer).await.unwrap();
    assert!(a.code.is_empty() && a.status.is_none_or(|s| s == 200), "{a:?}");
    // ...and, where the seed may open one again, a new control stream works.
    if !T::CONTROL_FIRST {
        let (mut ctl2, _) = raw.control().await;
        let m = move_msg(&["fresh:1"], 2);
        ctl2.send(&line(&m)).await;
        assert_eq!(within("control after reset", agent.control.recv()).await.unwrap(), m);
    }
    assert!(!agent.task.is_finished());
}

async fn unknown_control_lines_are_skipped_and_unknown_requests_refused<T: Transport>() {
    let (seed_side, agent_side, _path) = T::connect(&TunnelSettings::default()).await;
    let mut agent = spawn_agent::<T>(agent_side, &TunnelSettings::default());
    let mut raw = T::RawSeed::start(seed_side).await;
    let (mut ctl, _) = raw.control().await;
    ctl.send(b"{\"type\":\"reboot\"}\n").await;
    ctl.send(b"not json\n").await;
    let m = move_msg(&["next:1"], 3);
    ctl.send(&line(&m)).await;
    assert_eq!(
        within("control", agent.control.recv()).await.unwrap(),
        m,
        "the first message delivered is the valid one"
    );
    // A request that is neither a stream open nor the control stream is refused.
    raw.unknown_request_refused().await;
}

/// JSON lines must not depend on how the seed frames them.
async fn two_control_lines_in_one_data_frame_are_both_delivered<T: Transport>() {
    let (seed_side, agent_side, _path) = T::connect(&TunnelSettings::default()).await;
    let mut agent = spawn_agent::<T>(agent_side, &TunnelSettings::default());
    let mut raw = T::RawSeed::start(seed_side).await;
    let (mut ctl, _) = raw.control().await;
    let (m1, m2) = (move_msg(&["one:1"], 1), move_msg(&["two:2"], 2));
    ctl.send(&[line(&m1), line(&m2)].concat()).await;
    assert_eq!(within("first control", agent.control.recv()).await.unwrap(), m1);
    assert_eq!(within("second control", agent.control.recv()).await.unwrap(), m2);
}

/// The limit holds wherever the newline falls: a line whose newline comes in the frame after the
/// one that crosses 64 KiB is refused too.
async fn control_line_over_the_limit_is_not_delivered_even_when_its_newline_follows_in_the_next_frame<T: Transport>() {
    let (seed, mut agent, _path) = pair::<T>(&TunnelSettings::default()).await;
    eventually("agent hello", || seed.hello.get().is_some()).await;
    let big = move_msg(&[&"h".repeat(100 * 1024)], 1);
    assert!(line(&big).len() > 64 * 1024 + 1);
    seed.opener.control(&big).unwrap();
    if let Ok(Some(m)) = tokio::time::timeout(BOUND, agent.control.recv()).await {
        assert!(m != big, "a {}-byte control line was delivered", line(&big).len());
    }
}

/// Which stream may come first: over QUIC the seed's first stream is the control stream, and
/// any other ends the agent's session as a protocol error; over HTTP/2 a stream open may come
/// before it.
async fn a_first_stream_that_is_not_the_control_stream<T: Transport>() {
    let (seed_side, agent_side, _path) = T::connect(&TunnelSettings::default()).await;
    let mut agent = spawn_agent::<T>(agent_side, &TunnelSettings::default());
    let mut raw = T::RawSeed::start(seed_side).await;
    let answer = tokio::spawn(raw.connect("x:1"));
    if T::CONTROL_FIRST {
        match within("agent session end", &mut agent.task).await.unwrap() {
            Err(SessionError::Protocol(m)) => assert!(m.contains("not control"), "{m}"),
            other => panic!("{other:?}"),
        }
        raw.closed_for_protocol().await;
        answer.abort();
    } else {
        let inc = next_incoming(&mut agent).await;
        assert_eq!(inc.target, "x:1");
        let _stream = inc.responder.accept().unwrap();
        assert!(within("answer", answer).await.unwrap().code.is_empty());
        assert!(!agent.task.is_finished());
    }
}

over_both!(
    hello_reaches_the_seed_and_control_messages_reach_the_agent_in_order,
    streams_refusals_and_control_messages_go_through_one_session,
    control_line_over_the_limit_is_not_delivered_and_the_control_stream_is_reset,
    unknown_control_lines_are_skipped_and_unknown_requests_refused,
    two_control_lines_in_one_data_frame_are_both_delivered,
    control_line_over_the_limit_is_not_delivered_even_when_its_newline_follows_in_the_next_frame,
    a_first_stream_that_is_not_the_control_stream,
);
