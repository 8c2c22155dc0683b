//! Resets: a stream aborted at either end, or dropped before its orderly end, fails the other end's reads as a reset; the session and its other streams go on.

use super::*;
use proxy_core::tunnel::TunnelSettings;
use std::io::ErrorKind;
use tokio::io::AsyncWriteExt;

async fn reset_by_the_seed_fails_the_agents_read_with_connection_reset<T: Transport>() {
    let (seed, mut agent, _path) = pair::<T>(&TunnelSettings::default()).await;
    let (mut s, mut a) = open_accepted(&seed, &mut agent, "r:1").await;
    s.write_all(b"x").await.unwrap();
    assert_eq!(read_exact_n(&mut a, 1).await, b"x");
    s.reset();
    assert_read_reset(&mut a).await;
    // Other streams and the session are unaffected.
    let (mut s2, mut a2) = open_accepted(&seed, &mut agent, "r:2").await;
    s2.write_all(b"ok").await.unwrap();
    assert_eq!(read_exact_n(&mut a2, 2).await, b"ok");
}

async fn reset_by_the_agent_fails_the_seeds_read_with_connection_reset<T: Transport>() {
    let (seed, mut agent, _path) = pair::<T>(&TunnelSettings::default()).await;
    let (mut s, mut a) = open_accepted(&seed, &mut agent, "r:1").await;
    a.reset();
    assert_read_reset(&mut s).await;
}

async fn dropping_a_stream_before_its_orderly_end_resets_it<T: Transport>() {
    let (seed, mut agent, _path) = pair::<T>(&TunnelSettings::default()).await;
    // Agent end dropped mid-stream: the seed's read fails rather than seeing EOF.
    let (mut s, a) = open_accepted(&seed, &mut agent, "d:1").await;
    drop(a);
    assert_read_reset(&mut s).await;
    // Seed end dropped mid-stream: the agent's read fails too.
    let (s, mut a) = open_accepted(&seed, &mut agent, "d:2").await;
    drop(s);
    assert_read_reset(&mut a).await;
    // Seed half-closed, the agent saw the FIN, then the seed drops its end before the agent
    // finished: the agent's writes fail because the stream was reset.
    let (mut s, mut a) = open_accepted(&seed, &mut agent, "d:3").await;
    s.shutdown().await.unwrap();
    assert_eof(&mut a).await;
    drop(s);
    let failed = within("writes after the peer's reset", async {
        for _ in 0..1000 {
            if let Err(e) = a.write_all(&[0u8; 1024]).await {
                return e;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!("writes kept succeeding on a stream the seed dropped");
    })
    .await;
    assert!(matches!(failed.kind(), ErrorKind::ConnectionReset | ErrorKind::BrokenPipe), "{failed}");
}

over_both!(
    reset_by_the_seed_fails_the_agents_read_with_connection_reset,
    reset_by_the_agent_fails_the_seeds_read_with_connection_reset,
    dropping_a_stream_before_its_orderly_end_resets_it,
);
