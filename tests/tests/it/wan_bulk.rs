//! Bulk through the tunnel across a long emulated link (300 ms round trip, 100 Mbit/s), over h2 and QUIC with the windows and send bounds a WAN gets by default: an upload of megabytes reaches its target whole, one stream carries megabytes up and back down whole, sixteen streams at once each carry theirs, and a new stream is served while one bulk stream fills the session's send window, up and down.
//!
//! Outcomes only (bytes arrive whole, no stream is left behind); how fast is the bench's to measure.

use anyhow::Context as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use testbed::faults::{Outcome, Rig, RigOpts, dial};
use testbed::link::{LinkOpts, Shape, Wan};
use testbed::netns::require_root;
use testbed::tunnel_kit::{SpeakFirst, connect};
use testbed::{TcpSink, poll_until};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Far beyond what the transfers take at the link's rate (under 10 s each), short of a hang.
const WITHIN: Duration = Duration::from_secs(120);

/// Bytes each stream sends to the echo target and reads back.
const BULK: usize = 12 << 20;

fn link(label: &str, net: u8) -> anyhow::Result<Wan> {
    Wan::new(label, net, Shape::wan(Duration::from_millis(300), 100_000_000), LinkOpts::default())
}

/// Through `rig`'s replica: `streams` streams at once, each sending `bytes` (a pattern of its
/// own) to the echo target while reading them back; every byte comes back, in order.
async fn echo_bulk(rig: &Rig, streams: usize, bytes: usize) -> anyhow::Result<()> {
    let mut tasks = Vec::new();
    for i in 0..streams {
        let s = rig.open_stream(0).await.with_context(|| format!("stream {i}: open"))?;
        tasks.push(tokio::spawn(async move {
            let (mut r, mut w) = tokio::io::split(s);
            let byte = move |n: usize| (n as u8).wrapping_mul(31).wrapping_add(i as u8);
            let write = async move {
                let chunk: Vec<u8> = (0..64 * 1024).map(byte).collect();
                let mut sent = 0;
                while sent < bytes {
                    let n = chunk.len().min(bytes - sent);
                    w.write_all(&chunk[..n]).await?;
                    sent += n;
                }
                anyhow::Ok(w)
            };
            let read = async move {
                let mut buf = vec![0u8; 64 * 1024];
                let mut got = 0;
                while got < bytes {
                    let n = r.read(&mut buf).await?;
                    anyhow::ensure!(n > 0, "the stream ended after {got} of {bytes} bytes");
                    let want: Vec<u8> = (got..got + n).map(|k| byte(k % (64 * 1024))).collect();
                    anyhow::ensure!(buf[..n] == want[..], "bytes {got}..{} came back changed", got + n);
                    got += n;
                }
                anyhow::Ok(())
            };
            let (w, ()) = tokio::try_join!(write, read)?;
            drop(w);
            anyhow::Ok(())
        }));
    }
    for (i, t) in tasks.into_iter().enumerate() {
        tokio::time::timeout(WITHIN, t)
            .await
            .with_context(|| format!("stream {i} of {streams}: not done within {WITHIN:?}"))?
            .with_context(|| format!("stream {i} of {streams}"))?
            .with_context(|| format!("stream {i} of {streams}"))?;
    }
    Ok(())
}

/// One stream sends `bytes` to `sink` and half-closes: the sink counts every byte and sees the end
/// (the only upload to it meanwhile).
async fn upload(rig: &Rig, sink: &TcpSink, bytes: usize) -> anyhow::Result<()> {
    let (done, before) = (sink.completed(), sink.bytes());
    let mut s = connect(&rig.fronts[0], &sink.addr().to_string()).await.context("upload: open")?;
    let chunk = vec![0xa5u8; 64 * 1024];
    let mut sent = 0;
    tokio::time::timeout(WITHIN, async {
        while sent < bytes {
            let n = chunk.len().min(bytes - sent);
            s.write_all(&chunk[..n]).await?;
            sent += n;
        }
        s.shutdown().await
    })
    .await
    .with_context(|| format!("upload: {sent} of {bytes} bytes written within {WITHIN:?}"))??;
    let want = bytes as u64;
    poll_until(WITHIN, Duration::from_millis(100), || async {
        let got = sink.bytes() - before;
        anyhow::ensure!(sink.completed() == done + 1, "the sink counted {got} of {want} bytes, no end yet");
        anyhow::ensure!(got == want, "the sink counted {got} of {want} bytes");
        Ok(())
    })
    .await
    .context("upload")?;
    drop(s);
    Ok(())
}

/// Bytes a bulk stream has moved before a dial beside it: far past slow start, so the session's
/// send window on the sending end is full (the writer outruns the link).
const BESIDE_AFTER: u64 = 16 << 20;

/// A dial through `rig` once `moved()` passed [`BESIDE_AFTER`]: the open (a few bytes on the seed)
/// and its answer (a few bytes on the agent) share a send window that one bulk stream keeps
/// full, and must get through beside it. The front end's own answer decides (the client waits
/// longer than the dial timeout).
async fn dial_beside(rig: &Rig, what: &str, moved: impl Fn() -> u64) -> anyhow::Result<()> {
    poll_until(WITHIN, Duration::from_millis(20), || async {
        anyhow::ensure!(moved() >= BESIDE_AFTER, "{what}: {} bytes moved", moved());
        Ok(())
    })
    .await?;
    let d = dial(rig.fronts[0].clone(), rig.echo.addr(), WITHIN).await;
    anyhow::ensure!(d.outcome == Outcome::Served, "a dial beside {what}: {d:?}");
    Ok(())
}

/// A dial beside an upload (the seed's send window full), then beside a download (the agent's).
async fn dials_beside_bulk(rig: &Rig, sink: &TcpSink, source: &SpeakFirst) -> anyhow::Result<()> {
    let base = sink.bytes();
    let up = upload(rig, sink, 4 * BULK);
    let beside = dial_beside(rig, "an upload", || sink.bytes() - base);
    tokio::try_join!(up, beside)?;
    let mut s = connect(&rig.fronts[0], &source.addr().to_string()).await.context("download: open")?;
    let got = Arc::new(AtomicU64::new(0));
    let g = got.clone();
    let down = async move {
        let mut buf = vec![0u8; 64 * 1024];
        tokio::time::timeout(WITHIN, async {
            loop {
                let n = s.read(&mut buf).await?;
                if n == 0 {
                    return anyhow::Ok(());
                }
                g.fetch_add(n as u64, Ordering::Relaxed);
            }
        })
        .await
        .context("download: not done")?
    };
    let beside = dial_beside(rig, "a download", || got.load(Ordering::Relaxed));
    tokio::try_join!(down, beside)?;
    let want = 4 * BULK as u64;
    anyhow::ensure!(got.load(Ordering::Relaxed) == want, "download: {} of {want} bytes", got.load(Ordering::Relaxed));
    Ok(())
}

async fn bulk(label: &str, net: u8, quic: bool) -> anyhow::Result<()> {
    if !require_root() {
        return Ok(());
    }
    let wan = link(label, net)?;
    let _in_seed = wan.seed().enter()?;
    let rig = Rig::one(&wan, label, &RigOpts { quic, keepalive: None, agent_bin: None }).await?;
    let (sink, source) = {
        let _in_shoot = wan.shoot().enter()?;
        let at = std::net::SocketAddr::from((wan.link().shoot_ip(), 0));
        (TcpSink::start_on(at).await?, SpeakFirst::start_on(at, 4 * BULK as u64).await?)
    };
    upload(&rig, &sink, 2 * BULK).await.with_context(|| rig.logs())?;
    echo_bulk(&rig, 1, BULK).await.with_context(|| rig.logs())?;
    echo_bulk(&rig, 16, BULK / 8).await.with_context(|| rig.logs())?;
    dials_beside_bulk(&rig, &sink, &source).await.with_context(|| rig.logs())?;
    Ok(())
}

#[tokio::test]
async fn megabytes_cross_a_long_link_whole_one_stream_and_sixteen_at_once_h2() -> anyhow::Result<()> {
    bulk("wan-bulk-h2", 51, false).await
}

#[tokio::test]
async fn megabytes_cross_a_long_link_whole_one_stream_and_sixteen_at_once_quic() -> anyhow::Result<()> {
    bulk("wan-bulk-quic", 52, true).await
}
