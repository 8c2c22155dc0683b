//! Tests of `copy`.

use super::*;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;

async fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
    let (b, _) = l.accept().await.unwrap();
    (a, b)
}

/// client_end <-> [c_srv  relay  u_cli] <-> upstream_end
async fn relay_tcp(splice: bool) {
    let (mut client_end, c_srv) = pair().await;
    let (u_cli, mut upstream_end) = pair().await;
    let relay = tokio::spawn(async move {
        if splice {
            let mut t = transfer_tcp(c_srv, u_cli, Duration::from_secs(30), Meters::default());
            let o = (&mut t).await;
            (o.label(), t.counts())
        } else {
            let mut t = transfer(c_srv, u_cli, Duration::from_secs(30), Meters::default());
            let o = (&mut t).await;
            (o.label(), t.counts())
        }
    });
    let payload: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let p2 = payload.clone();
    let writer = tokio::spawn(async move {
        client_end.write_all(&p2).await.unwrap();
        client_end.shutdown().await.unwrap(); // half-close towards the upstream
        let mut back = Vec::new();
        client_end.read_to_end(&mut back).await.unwrap();
        back
    });
    let mut got = Vec::new();
    upstream_end.read_to_end(&mut got).await.unwrap();
    assert_eq!(got, payload, "client->upstream bytes intact after half-close");
    // The other direction still works after the client's FIN.
    upstream_end.write_all(b"reply after half-close").await.unwrap();
    upstream_end.shutdown().await.unwrap();
    let back = writer.await.unwrap();
    assert_eq!(back, b"reply after half-close");
    let (outcome, counts) = relay.await.unwrap();
    assert_eq!(outcome, "closed");
    assert_eq!(counts, (3_000_000, 22));
}

#[tokio::test]
async fn splice_relay_half_close_both_ways() {
    relay_tcp(true).await;
}

#[tokio::test]
async fn buffered_relay_half_close_both_ways() {
    relay_tcp(false).await;
}

/// A writer that takes chunks by value, at most 10,000 bytes of one at a time and every other
/// call not at all (it asks to be polled again); a copying write would panic. It reads as
/// an empty stream.
#[derive(Default)]
struct ChunkTaker {
    got: Vec<Bytes>,
    calls: usize,
    shut: bool,
}

impl AsyncRead for ChunkTaker {
    fn poll_read(self: Pin<&mut Self>, _: &mut Context<'_>, _: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for ChunkTaker {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, _: &[u8]) -> Poll<io::Result<usize>> {
        panic!("a writer that takes chunks was handed a slice to copy");
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.shut = true;
        Poll::Ready(Ok(()))
    }
}

impl Resettable for ChunkTaker {
    fn reset(&mut self) {}
    fn owned_chunk(&self) -> Option<usize> {
        Some(BUF_SIZE)
    }
    fn poll_write_owned(&mut self, cx: &mut Context<'_>, chunk: &mut Bytes) -> Poll<io::Result<()>> {
        while !chunk.is_empty() {
            self.calls += 1;
            if self.calls.is_multiple_of(2) {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            let n = chunk.len().min(10_000);
            self.got.push(chunk.split_to(n));
        }
        Poll::Ready(Ok(()))
    }
}

#[tokio::test]
async fn into_a_writer_that_takes_chunks_the_bytes_go_by_value_whole_and_counted() {
    let (mut client_end, c_srv) = pair().await;
    let payload: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let p2 = payload.clone();
    let writer = tokio::spawn(async move {
        client_end.write_all(&p2).await.unwrap();
        client_end.shutdown().await.unwrap();
        client_end
    });
    let mut t = transfer(c_srv, ChunkTaker::default(), Duration::from_secs(30), Meters::default());
    assert_eq!((&mut t).await.label(), "closed");
    assert_eq!(t.counts(), (3_000_000, 0));
    let (_, taker) = t.into_inner();
    assert!(taker.shut, "the end of the client's stream is passed on");
    assert_eq!(taker.got.concat(), payload);
    drop(writer.await.unwrap());
}

/// A reader that hands out chunks by value, every other call none yet (it asks to be polled
/// again) unless `all_ready`, then ends or fails; a copying read would panic. Writes vanish.
struct ChunkGiver {
    chunks: VecDeque<Bytes>,
    calls: usize,
    fail_at_end: bool,
    all_ready: bool,
}

impl ChunkGiver {
    fn new(chunks: Vec<Bytes>, fail_at_end: bool) -> Self {
        Self { chunks: chunks.into(), calls: 0, fail_at_end, all_ready: false }
    }
}

impl AsyncRead for ChunkGiver {
    fn poll_read(self: Pin<&mut Self>, _: &mut Context<'_>, _: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        panic!("a reader that hands out chunks was read into a buffer");
    }
}

impl AsyncWrite for ChunkGiver {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        Poll::Ready(Ok(b.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl Resettable for ChunkGiver {
    fn reset(&mut self) {}
    fn reads_owned(&self) -> bool {
        true
    }
    fn poll_read_owned(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Bytes>> {
        self.calls += 1;
        if !self.all_ready && self.calls.is_multiple_of(2) {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        match self.chunks.pop_front() {
            Some(c) => Poll::Ready(Ok(c)),
            None if self.fail_at_end => Poll::Ready(Err(io::ErrorKind::ConnectionReset.into())),
            None => Poll::Ready(Ok(Bytes::new())),
        }
    }
}

fn chunks_of(payload: &[u8], size: usize) -> Vec<Bytes> {
    payload.chunks(size).map(Bytes::copy_from_slice).collect()
}

#[tokio::test]
async fn from_a_reader_that_hands_out_chunks_they_are_written_whole_and_counted_then_the_end() {
    let (u_cli, mut upstream_end) = pair().await;
    let payload: Vec<u8> = (0..1_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let giver = ChunkGiver::new(chunks_of(&payload, 65_527), false);
    let relay = tokio::spawn(async move {
        let mut t = transfer(giver, u_cli, Duration::from_secs(30), Meters::default());
        let o = (&mut t).await;
        (o.label(), t.counts())
    });
    let mut got = Vec::new();
    upstream_end.read_to_end(&mut got).await.unwrap();
    assert_eq!(got, payload, "every chunk arrives, in order, and then the FIN");
    upstream_end.shutdown().await.unwrap();
    assert_eq!(relay.await.unwrap(), ("closed", (1_000_000, 0)));
}

#[tokio::test]
async fn a_reader_that_hands_out_chunks_and_then_fails_is_the_side_that_reset() {
    // Chunks one at a time, and all ready at once (gathered with the failure behind them).
    for all_ready in [false, true] {
        let (u_cli, mut upstream_end) = pair().await;
        let mut giver = ChunkGiver::new(chunks_of(b"partial answer", 5), true);
        giver.all_ready = all_ready;
        let relay = tokio::spawn(async move {
            let mut t = transfer(giver, u_cli, Duration::from_secs(30), Meters::default());
            let o = (&mut t).await;
            (o.label(), t.counts().0)
        });
        let mut got = vec![0u8; 14];
        upstream_end.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"partial answer", "what arrived before the failure is delivered ({all_ready})");
        assert_eq!(relay.await.unwrap(), ("client_reset", 14), "all ready: {all_ready}");
    }
}

/// A writer that copies, takes vectored writes, at most `max` bytes per call and every other
/// call nothing (it asks to be polled again); it records the slices each write was given.
#[derive(Default)]
struct VectoredSink {
    got: Vec<u8>,
    slices_per_write: Vec<usize>,
    calls: usize,
    max: usize,
    shut: bool,
}

impl VectoredSink {
    fn accept(&mut self, cx: &mut Context<'_>, bufs: &[IoSlice<'_>]) -> Poll<io::Result<usize>> {
        self.calls += 1;
        if self.calls.is_multiple_of(2) {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        self.slices_per_write.push(bufs.len());
        let mut n = 0;
        for b in bufs {
            let k = b.len().min(self.max - n);
            self.got.extend_from_slice(&b[..k]);
            n += k;
            if n == self.max {
                break;
            }
        }
        Poll::Ready(Ok(n))
    }
}

impl AsyncRead for VectoredSink {
    fn poll_read(self: Pin<&mut Self>, _: &mut Context<'_>, _: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for VectoredSink {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        self.accept(cx, &[IoSlice::new(b)])
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.accept(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        true
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.shut = true;
        Poll::Ready(Ok(()))
    }
}

impl Resettable for VectoredSink {
    fn reset(&mut self) {}
}

#[tokio::test]
async fn chunks_ready_at_once_are_gathered_into_vectored_writes_in_order_even_when_split() {
    let payload: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let mut giver = ChunkGiver::new(chunks_of(&payload, 1_000), false);
    giver.all_ready = true;
    // 2,500 bytes per write: most writes end inside a chunk.
    let sink = VectoredSink { max: 2_500, ..Default::default() };
    let mut t = transfer(giver, sink, Duration::from_secs(30), Meters::default());
    assert_eq!((&mut t).await.label(), "closed");
    assert_eq!(t.counts(), (200_000, 0));
    let (_, sink) = t.into_inner();
    assert_eq!(sink.got, payload, "every byte, in order");
    assert!(sink.shut, "then the end");
    let most = sink.slices_per_write.iter().max().copied().unwrap_or(0);
    assert!(most > 1 && most <= MAX_GATHER, "writes gather chunks, at most {MAX_GATHER}: {most}");
}

#[tokio::test(start_paused = true)]
async fn idle_timeout_fires_only_without_traffic() {
    let (mut client_end, c_srv) = pair().await;
    let (u_cli, mut upstream_end) = pair().await;
    let t = transfer_tcp(c_srv, u_cli, Duration::from_secs(10), Meters::default());
    let mut t = std::pin::pin!(t);
    // Traffic every 6 s keeps it alive past 10 s.
    for _ in 0..3 {
        tokio::select! {
            o = &mut t => panic!("ended early: {}", o.label()),
            _ = tokio::time::sleep(Duration::from_secs(6)) => {}
        }
        client_end.write_all(b"x").await.unwrap();
        let mut b = [0u8; 1];
        tokio::select! {
            o = &mut t => panic!("ended early: {}", o.label()),
            r = upstream_end.read_exact(&mut b) => { r.unwrap(); }
        }
    }
    let o = t.await;
    assert_eq!(o.label(), "idle_timeout");
}

#[tokio::test]
async fn reset_is_reported_by_side() {
    let (client_end, c_srv) = pair().await;
    let (u_cli, _upstream_end) = pair().await;
    let t = tokio::spawn(async move { transfer_tcp(c_srv, u_cli, Duration::from_secs(30), Meters::default()).await });
    crate::net::reset_on_close(&client_end);
    drop(client_end);
    let o = t.await.unwrap();
    assert_eq!(o.label(), "client_reset");
}
