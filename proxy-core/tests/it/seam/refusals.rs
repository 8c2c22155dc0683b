//! Refusals and failed opens: the agent's dial errors arrive at the seed as the same error, what a refusal is on the wire, opens the agent never answers or answers as no agent of ours would.

use super::*;
use proxy_core::tunnel::{DialError, TunnelSettings};
use tokio::time::Instant;

async fn refusals_arrive_at_the_seed_as_the_same_dial_error<T: Transport>() {
    let (seed, mut agent, _path) = pair::<T>(&TunnelSettings::default()).await;
    let cases = [
        (DialError::NotAllowed("10.1.2.3:22 is not on the allowlist".into()), "not_allowed", 403),
        (DialError::Refused("10.1.2.3:80: connection refused".into()), "refused", 502),
        (DialError::Unreachable("10.1.2.3:80: no route".into()), "unreachable", 502),
        (DialError::Resolve("nope.svc: NXDOMAIN".into()), "resolve_failed", 502),
        (DialError::Timeout("10.1.2.3:80: timed out".into()), "dial_timeout", 504),
        (DialError::Limit("16384 streams open".into()), "stream_limit", 503),
        (DialError::BadTarget("no port".into()), "bad_target", 400),
        (DialError::Draining("agent shutting down".into()), "draining", 503),
    ];
    for (i, (err, code, status)) in cases.iter().enumerate() {
        let got = open_refused(&seed, &mut agent, &format!("t{i}:1"), err).await;
        assert_eq!(&got, err, "variant and reason survive the trip");
        assert_eq!(got.code(), *code);
        assert_eq!(got.http_status(), *status);
        assert_eq!(seed.opener.active_streams(), 0, "a refused open is not an active stream");
        if i + 2 == cases.len() {
            assert!(!seed.opener.is_closed(), "refusals do not close the session");
            let (_s, _a) = open_accepted(&seed, &mut agent, "after-refusals:1").await;
        }
    }
    // The last refusal, as draining: over QUIC that is how the agent's going-away notice
    // reaches a stream that crossed it, so the session takes no new streams; over HTTP/2 the
    // GOAWAY says so, and a refusal is one stream's.
    assert_eq!(seed.opener.is_closed(), T::DRAINING_REFUSAL_STOPS_OPENS);
}

/// Codes the agent never sends (they are made on the seed) have no wire mapping back: they
/// arrive as a transport error that names the code.
async fn seed_only_codes_arrive_as_transport_errors_naming_the_code<T: Transport>() {
    let (seed, mut agent, _path) = pair::<T>(&TunnelSettings::default()).await;
    for (err, code) in [
        (DialError::NoAgent("x".into()), "no_agent"),
        (DialError::Moved("x".into()), "cluster_moved"),
        (DialError::Transport("x".into()), "tunnel_error"),
    ] {
        let got = open_refused(&seed, &mut agent, "t:1", &err).await;
        assert_eq!(got, DialError::Transport(format!("{code}: x")));
    }
}

/// What the agent puts on the wire for a refusal, read by a raw seed of the transport: the
/// status of `DialError::http_status` (HTTP/2), the code, and the reason as the transport
/// carries it (HTTP/2: stripped of what a header value cannot carry and cut to 256
/// characters; QUIC: cut to the answer's 1 KiB); the refusal ends the stream.
async fn refusal_on_the_wire_has_the_code_and_the_reason_the_transport_carries<T: Transport>() {
    let (seed_side, agent_side, _path) = T::connect(&TunnelSettings::default()).await;
    let mut agent = spawn_agent::<T>(agent_side, &TunnelSettings::default());
    let mut raw = T::RawSeed::start(seed_side).await;
    let _control = raw.control().await;
    let cases = [
        (DialError::NotAllowed("n".into()), 403),
        (DialError::Refused("r".into()), 502),
        (DialError::Timeout("t".into()), 504),
        (DialError::Limit("l".into()), 503),
        (DialError::BadTarget("b".into()), 400),
    ];
    for (err, status) in cases {
        let answer = tokio::spawn(raw.connect("x:1"));
        let inc = next_incoming(&mut agent).await;
        inc.responder.refuse(&err);
        let a = within("raw answer", answer).await.unwrap();
        if let Some(s) = a.status {
            assert_eq!(s, status, "{err:?}");
        }
        assert_eq!(a.code, err.code());
        assert_eq!(a.reason, err.detail());
        assert!(a.ended, "a refusal ends the stream");
    }
    let long = format!("naïve\r\nInjected: yes\u{7f}{}", "a".repeat(2000));
    let answer = tokio::spawn(raw.connect("x:1"));
    next_incoming(&mut agent).await.responder.refuse(&DialError::Refused(long.clone()));
    let a = within("raw answer", answer).await.unwrap();
    if a.status.is_some() {
        assert!(a.reason.starts_with("naveInjected: yesaaa"), "{}", a.reason);
        assert_eq!(a.reason.len(), 256);
    } else {
        let carried = proxy_wire::tunnel::quic::ANSWER_MAX - "refused\n".len();
        assert_eq!(a.reason.as_bytes(), &long.as_bytes()[..carried]);
    }
}

async fn open_times_out_when_the_agent_never_answers<T: Transport>() {
    let (seed, mut agent, _path) = pair::<T>(&TunnelSettings::default()).await;
    let opener = seed.opener.clone();
    let start = Instant::now();
    let open = tokio::spawn(async move { opener.open("slow:1", Duration::from_secs(7)).await.map(|_| ()) });
    let held = next_incoming(&mut agent).await; // never answered while the open waits
    match within("open with timeout", open).await.unwrap() {
        Err(DialError::Timeout(msg)) => assert!(msg.contains("slow:1"), "{msg}"),
        other => panic!("expected a dial timeout, got {other:?}"),
    }
    assert!(start.elapsed() >= Duration::from_secs(7), "timed out before its timeout");
    drop(held);
    assert!(!seed.opener.is_closed());
    let (_s, _a) = open_accepted(&seed, &mut agent, "after-timeout:1").await;
}

async fn a_responder_dropped_unanswered_fails_the_open_as_a_transport_error<T: Transport>() {
    let (seed, mut agent, _path) = pair::<T>(&TunnelSettings::default()).await;
    let open = spawn_open(&seed, "dropped:1");
    drop(next_incoming(&mut agent).await);
    match within("open", open).await.unwrap() {
        Err(DialError::Transport(_)) => {}
        Err(e) => panic!("expected a transport error, got {e:?}"),
        Ok(_) => panic!("open succeeded though nobody accepted"),
    }
    let (_s, _a) = open_accepted(&seed, &mut agent, "after-drop:1").await;
}

/// An agent answering as no agent of ours does (HTTP/2: a status without `seedgate-error`;
/// QUIC: bytes that are no answer) fails the open as a transport error that names what came.
async fn an_answer_no_agent_of_ours_gives_is_a_transport_error<T: Transport>() {
    let (seed_side, agent_side, _path) = T::connect(&TunnelSettings::default()).await;
    let seed = spawn_seed::<T>(seed_side, &TunnelSettings::default()).await;
    let mut raw = T::RawAgent::start(agent_side).await;
    let open = spawn_open(&seed, "x:1");
    let named = raw.answer_foreign().await;
    match within("open", open).await.unwrap() {
        Err(DialError::Transport(msg)) => assert!(msg.contains(named), "{msg}"),
        Err(e) => panic!("expected a transport error, got {e:?}"),
        Ok(_) => panic!("open succeeded on a foreign answer"),
    }
}

over_both!(
    refusals_arrive_at_the_seed_as_the_same_dial_error,
    seed_only_codes_arrive_as_transport_errors_naming_the_code,
    refusal_on_the_wire_has_the_code_and_the_reason_the_transport_carries,
    open_times_out_when_the_agent_never_answers,
    a_responder_dropped_unanswered_fails_the_open_as_a_transport_error,
    an_answer_no_agent_of_ours_gives_is_a_transport_error,
);
