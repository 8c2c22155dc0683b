//! Streams: bytes both ways, half-close, bulk through small windows, many streams at once, a target that cannot be sent.

use super::*;
use proxy_core::tunnel::{DialError, TunnelSettings};
use std::io::ErrorKind;
use tokio::io::AsyncWriteExt;

async fn stream_reaches_the_agent_and_carries_bytes_both_ways_with_half_close<T: Transport>() {
    let (seed, mut agent, _path) = pair::<T>(&TunnelSettings::default()).await;
    assert_eq!(seed.opener.active_streams(), 0);
    let (mut s, mut a) = open_accepted(&seed, &mut agent, "db.shoot.svc:5432").await;
    assert_eq!(seed.opener.active_streams(), 1);

    s.write_all(b"hello agent").await.unwrap();
    assert_eq!(read_exact_n(&mut a, 11).await, b"hello agent");
    a.write_all(b"hello seed").await.unwrap();
    assert_eq!(read_exact_n(&mut s, 10).await, b"hello seed");

    // Seed half-closes: the agent reads EOF, and can still send.
    s.shutdown().await.unwrap();
    assert_eof(&mut a).await;
    a.write_all(b"after your FIN").await.unwrap();
    assert_eq!(read_exact_n(&mut s, 14).await, b"after your FIN");
    // Writing after our own shutdown is an error, not a silent drop.
    assert_eq!(s.write(b"x").await.unwrap_err().kind(), ErrorKind::BrokenPipe);
    a.shutdown().await.unwrap();
    assert_eof(&mut s).await;

    drop(s);
    assert_eq!(seed.opener.active_streams(), 0, "a dropped stream is no longer counted");
    drop(a);
    assert!(!seed.task.is_finished() && !agent.task.is_finished(), "one stream's end does not end the session");
}

async fn half_close_from_the_agent_side_leaves_the_seed_direction_open<T: Transport>() {
    let (seed, mut agent, _path) = pair::<T>(&TunnelSettings::default()).await;
    let (mut s, mut a) = open_accepted(&seed, &mut agent, "10.0.0.7:443").await;
    a.write_all(b"banner").await.unwrap();
    a.shutdown().await.unwrap();
    assert_eq!(read_exact_n(&mut s, 6).await, b"banner");
    assert_eof(&mut s).await;
    s.write_all(b"still here").await.unwrap();
    assert_eq!(read_exact_n(&mut a, 10).await, b"still here");
    s.shutdown().await.unwrap();
    assert_eof(&mut a).await;
}

/// Several MiB each way at once through windows much smaller than the data: only works if the
/// reader releases flow-control capacity as it consumes.
async fn bulk_transfer_both_ways_through_small_windows<T: Transport>() {
    let settings = TunnelSettings {
        stream_window: 32 * 1024,
        stream_window_quic: 32 * 1024,
        connection_window: 96 * 1024,
        max_frame_size: 16 * 1024,
        ..TunnelSettings::default()
    };
    let (seed, mut agent, _path) = pair::<T>(&settings).await;
    let (s, a) = open_accepted(&seed, &mut agent, "bulk:9000").await;
    const LEN: usize = 3 * 1024 * 1024 + 17;
    let up = pattern(LEN, 1);
    let down = pattern(LEN, 2);
    let (got_by_agent, got_by_seed) =
        within("bulk transfer", async { tokio::join!(pump(a, down.clone()), pump(s, up.clone())) }).await;
    assert!(got_by_agent == up, "agent received {} bytes, not the {} sent", got_by_agent.len(), up.len());
    assert!(got_by_seed == down, "seed received {} bytes, not the {} sent", got_by_seed.len(), down.len());
}

async fn many_streams_are_independent<T: Transport>() {
    let (seed, mut agent, _path) = pair::<T>(&TunnelSettings::default()).await;
    let mut ends = Vec::new();
    for i in 0..8 {
        ends.push(open_accepted(&seed, &mut agent, &format!("svc-{i}:80")).await);
    }
    assert_eq!(seed.opener.active_streams(), 8);
    // Answer in reverse order: each stream gets its own bytes.
    for (i, (s, a)) in ends.iter_mut().enumerate().rev() {
        s.write_all(format!("req-{i}").as_bytes()).await.unwrap();
        assert_eq!(read_exact_n(a, 5).await, format!("req-{i}").as_bytes());
        a.write_all(format!("resp-{i}").as_bytes()).await.unwrap();
    }
    for (i, (s, _)) in ends.iter_mut().enumerate() {
        assert_eq!(read_exact_n(s, 6).await, format!("resp-{i}").as_bytes());
    }
    ends.truncate(3);
    assert_eq!(seed.opener.active_streams(), 3);
}

/// QUIC lets the seed open a first allowance of streams on a new session (quinn allocates each
/// allowed stream's state up front) and the agent raises it as they fill: a thousand streams
/// open one after the other and stay open together, over either transport.
async fn streams_beyond_the_first_allowance_open_and_stay_open_together<T: Transport>() {
    let (seed, mut agent, _path) = pair::<T>(&TunnelSettings::default()).await;
    let mut held = Vec::new();
    for i in 0..1_000 {
        held.push(open_accepted(&seed, &mut agent, &format!("10.0.0.1:{}", 1_000 + i)).await);
    }
    assert_eq!(held.len(), 1_000);
    assert_eq!(seed.opener.active_streams(), 1_000);
}

async fn unparsable_target_fails_as_bad_target_without_reaching_the_agent<T: Transport>() {
    let (seed, mut agent, _path) = pair::<T>(&TunnelSettings::default()).await;
    match seed.opener.open("bad target with spaces", OPEN_TIMEOUT).await {
        Ok(_) => panic!("opened a stream to an unparsable target"),
        Err(e) => assert!(matches!(e, DialError::BadTarget(_)), "{e:?}"),
    }
    // The next stream the agent sees is the next valid one: the bad one never went out.
    let (_s, _a) = open_accepted(&seed, &mut agent, "good:1").await;
}

over_both!(
    stream_reaches_the_agent_and_carries_bytes_both_ways_with_half_close,
    half_close_from_the_agent_side_leaves_the_seed_direction_open,
    bulk_transfer_both_ways_through_small_windows,
    many_streams_are_independent,
    streams_beyond_the_first_allowance_open_and_stay_open_together,
    unparsable_target_fails_as_bad_target_without_reaching_the_agent,
);
