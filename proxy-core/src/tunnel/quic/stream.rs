//! One QUIC stream as a byte stream, its sending half writing in turn at the connection's send window, the framing at a stream's start, and the control stream's halves.

use super::send_turns::{SMALL_WRITE, SendTurns};
use crate::relay::io::Resettable;
use crate::tunnel::session::{ControlRecv, ControlSend};
use bytes::Bytes;
use proxy_wire::tunnel::quic::{Progress, RESET_CODE, StreamError};
use quinn::{RecvStream, SendStream, VarInt};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Instant;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Largest control-stream chunk read at once.
const CONTROL_CHUNK: usize = 4096;

/// Why the framing at the start of a stream could not be read.
#[derive(Debug, thiserror::Error)]
pub(super) enum FramingError {
    #[error("{0}")]
    Read(#[from] quinn::ReadExactError),
    #[error("{0}")]
    Bad(#[from] StreamError),
}

/// Read what `read` frames at the start of `recv` (a stream header, an answer), exactly: the
/// stream's own bytes behind it stay unread.
pub(super) async fn read_framed<T>(
    recv: &mut RecvStream,
    read: fn(&[u8]) -> Result<Progress<T>, StreamError>,
) -> Result<T, FramingError> {
    let mut buf = Vec::new();
    loop {
        match read(&buf)? {
            Progress::Done(v, _) => return Ok(v),
            Progress::More(n) => {
                let have = buf.len();
                buf.resize(have + n, 0);
                recv.read_exact(buf.get_mut(have..).unwrap_or_default()).await?;
            }
        }
    }
}

/// One QUIC stream as a byte stream. Dropped before an orderly end both ways, it resets.
pub struct QuicStream {
    pub(super) send: QuicSend,
    pub(super) recv: RecvStream,
    read_eof: bool,
    write_closed: bool,
    /// Bytes to send before the stream's own (the agent's answer), not yet sent.
    pub(super) prefix: Vec<u8>,
}

/// One connection's [`SendTurns`], shared by its streams and its watcher.
pub type Turns = crate::sync::Mutex<SendTurns<Waker>>;

/// A QUIC stream's sending half, which writes at its connection's send window in turn
/// ([`SendTurns`]): the streams of a session and the control stream.
pub struct QuicSend {
    send: SendStream,
    /// The connection's queue for its send window, and this stream's place in it.
    turns: Arc<Turns>,
    key: u64,
}

impl QuicSend {
    pub(super) fn new(send: SendStream, turns: Arc<Turns>) -> Self {
        let key = VarInt::from(send.id()).into_inner();
        Self { send, turns, key }
    }

    /// Whether a write of `len` bytes may try quinn now ([`SendTurns`]); if not, it waits its turn.
    fn poll_turn(&self, cx: &Context<'_>, len: usize) -> Poll<()> {
        let mut turns = self.turns.lock();
        if turns.may_write(self.key, len) {
            return Poll::Ready(());
        }
        turns.wait(self.key, cx.waker().clone(), Instant::now());
        Poll::Pending
    }

    /// What quinn made of a write of `len` bytes: bytes got in (the turn passes on, or bulk
    /// writes held back by a small one go on), or it found the window full (a bulk write queues
    /// for a turn; a small one holds bulk writes back until it gets in).
    fn after_write(&self, cx: &Context<'_>, len: usize, got_in: bool) {
        let mut turns = self.turns.lock();
        let next = if got_in {
            turns.wrote(self.key, Instant::now())
        } else {
            if len > SMALL_WRITE {
                turns.wait(self.key, cx.waker().clone(), Instant::now());
            } else {
                turns.wait_small(self.key, Instant::now());
            }
            None
        };
        drop(turns);
        if let Some(w) = next {
            w.wake();
        }
    }

    /// This stream writes no more: its place in the queue goes to the next.
    fn leave_turns(&self) {
        let next = self.turns.lock().left(self.key, Instant::now());
        if let Some(w) = next {
            w.wake();
        }
    }

    /// A write of `buf`, in turn.
    fn poll_send(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        std::task::ready!(self.poll_turn(cx, buf.len()));
        let polled = AsyncWrite::poll_write(Pin::new(&mut self.send), cx, buf);
        self.after_write(cx, buf.len(), polled.is_ready());
        polled
    }

    /// The whole of `buf`, in turn.
    pub(super) async fn send_all(&mut self, mut buf: &[u8]) -> io::Result<()> {
        while !buf.is_empty() {
            let n = std::future::poll_fn(|cx| self.poll_send(cx, buf)).await?;
            buf = buf.get(n..).unwrap_or_default();
        }
        Ok(())
    }
}

impl Drop for QuicSend {
    fn drop(&mut self) {
        self.leave_turns();
    }
}

impl QuicStream {
    pub(super) fn new(send: SendStream, recv: RecvStream, turns: Arc<Turns>) -> Self {
        Self { send: QuicSend::new(send, turns), recv, read_eof: false, write_closed: false, prefix: Vec::new() }
    }

    /// Send what is left of the prefix.
    pub(super) fn poll_prefix(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.prefix.is_empty() {
            let n = std::task::ready!(self.send.poll_send(cx, &self.prefix))?;
            self.prefix.drain(..n);
        }
        Poll::Ready(Ok(()))
    }

    /// Reads nothing more: the peer is asked to stop sending, and dropping the stream after an
    /// orderly end of writing does not reset it.
    pub(super) fn stop_reading(&mut self) {
        let _ = self.recv.stop(VarInt::from_u32(RESET_CODE));
        self.read_eof = true;
    }
}

impl Resettable for QuicStream {
    fn reset(&mut self) {
        let _ = self.send.send.reset(VarInt::from_u32(RESET_CODE));
        let _ = self.recv.stop(VarInt::from_u32(RESET_CODE));
        self.write_closed = true;
        self.read_eof = true;
        self.send.leave_turns();
    }

    /// quinn queues a chunk as it is (its `poll_write` copies).
    fn owned_chunk(&self) -> Option<usize> {
        Some(crate::relay::buf::BUF_SIZE)
    }

    fn poll_write_owned(&mut self, cx: &mut Context<'_>, chunk: &mut Bytes) -> Poll<io::Result<()>> {
        if self.write_closed {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        std::task::ready!(self.poll_prefix(cx))?;
        while !chunk.is_empty() {
            let len = chunk.len();
            let send = &mut self.send;
            std::task::ready!(send.poll_turn(cx, len));
            // quinn offers chunk writes as a future only; polled once here, it registers the
            // waker as its poll method would, and leaves in `bufs` what it did not take.
            let mut bufs = [std::mem::take(chunk)];
            let polled = std::pin::pin!(send.send.write_chunks(&mut bufs)).poll(cx);
            *chunk = std::mem::take(&mut bufs[0]);
            send.after_write(cx, len, polled.is_ready());
            std::task::ready!(polled).map_err(io::Error::from)?;
        }
        Poll::Ready(Ok(()))
    }

    /// The chunks quinn received, taken as they are: one packet's payload each, which the relay
    /// gathers into one vectored write (a write per chunk cost more than the copy it saved).
    fn reads_owned(&self) -> bool {
        true
    }

    fn poll_read_owned(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Bytes>> {
        if let Poll::Ready(Err(e)) = self.poll_prefix(cx) {
            return Poll::Ready(Err(e));
        }
        loop {
            // quinn offers chunk reads as a future only; polled once, as in `poll_write_owned`.
            let polled = std::pin::pin!(self.recv.read_chunk(usize::MAX, true)).poll(cx);
            match std::task::ready!(polled).map_err(io::Error::from)? {
                Some(chunk) if chunk.bytes.is_empty() => continue,
                Some(chunk) => return Poll::Ready(Ok(chunk.bytes)),
                None => {
                    self.read_eof = true;
                    return Poll::Ready(Ok(Bytes::new()));
                }
            }
        }
    }
}

impl AsyncRead for QuicStream {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if let Poll::Ready(Err(e)) = this.poll_prefix(cx) {
            return Poll::Ready(Err(e));
        }
        let before = buf.filled().len();
        let r = Pin::new(&mut this.recv).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = &r
            && buf.filled().len() == before
            && buf.remaining() > 0
        {
            this.read_eof = true;
        }
        r
    }
}

impl AsyncWrite for QuicStream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if self.write_closed {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        std::task::ready!(self.poll_prefix(cx))?;
        self.send.poll_send(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.send.send).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.write_closed {
            std::task::ready!(self.poll_prefix(cx))?;
            self.write_closed = true;
            self.send.leave_turns();
            // FIN: the half-close the far side turns into a TCP FIN.
            self.send.send.finish().map_err(|e| io::Error::new(io::ErrorKind::BrokenPipe, e))?;
        }
        Poll::Ready(Ok(()))
    }
}

impl Drop for QuicStream {
    fn drop(&mut self) {
        // quinn finishes a dropped send stream; an unfinished exchange must look like a reset.
        if !(self.write_closed && self.read_eof) {
            let _ = self.send.send.reset(VarInt::from_u32(RESET_CODE));
            let _ = self.recv.stop(VarInt::from_u32(RESET_CODE));
        }
    }
}

impl ControlSend for QuicSend {
    async fn send(&mut self, line: Vec<u8>) -> io::Result<()> {
        self.send_all(&line).await
    }
}

impl ControlRecv for RecvStream {
    async fn recv(&mut self) -> Option<Bytes> {
        Some(self.read_chunk(CONTROL_CHUNK, true).await.ok()??.bytes)
    }
}
