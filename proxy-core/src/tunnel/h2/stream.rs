//! One HTTP/2 stream as a byte stream: flow-control capacity is released only as the reader consumes, so a stalled reader stalls only its stream; and the control stream's halves.

use crate::relay::io::Resettable;
use crate::tunnel::session::{ControlRecv, ControlSend};
use bytes::{Buf, Bytes};
use h2::{Reason, RecvStream, SendStream};
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Largest chunk handed to h2 per write: one frame's worth keeps framing overhead low while
/// bounding what a single write can buffer.
const WRITE_CHUNK: usize = 64 * 1024;

/// An HTTP/2 frame header, and the largest TLS record rustls sends (its default fragment size).
const FRAME_HEADER: usize = 9;
const TLS_RECORD: usize = 16 * 1024;

/// What a relay reads for one DATA frame: with its header the frame is 64 KiB, four whole TLS
/// records. A 64 KiB read made a frame of 65,545 bytes, four records and a fifth of 9 bytes,
/// which went out in a `writev` and a TCP segment of its own (rustls takes 64 KiB of plaintext
/// per write).
const DATA_CHUNK: usize = 4 * TLS_RECORD - FRAME_HEADER;

pub struct H2Stream {
    send: SendStream<Bytes>,
    recv: RecvStream,
    /// Part of the last DATA frame not yet read by the caller (its capacity not yet released).
    unread: Bytes,
    read_eof: bool,
    write_closed: bool,
}

fn h2_to_io(e: h2::Error) -> io::Error {
    match e.reason() {
        Some(Reason::CANCEL) | Some(Reason::REFUSED_STREAM) | Some(Reason::STREAM_CLOSED) | Some(Reason::NO_ERROR)
            if e.is_remote() || e.is_reset() =>
        {
            io::Error::new(io::ErrorKind::ConnectionReset, e)
        }
        _ if e.is_io() => e.into_io().unwrap_or_else(|| io::Error::other("tunnel i/o error")),
        _ if e.is_go_away() || e.is_reset() => io::Error::new(io::ErrorKind::ConnectionReset, e),
        _ => io::Error::new(io::ErrorKind::ConnectionAborted, e),
    }
}

impl H2Stream {
    pub fn new(send: SendStream<Bytes>, recv: RecvStream) -> Self {
        Self { send, recv, unread: Bytes::new(), read_eof: false, write_closed: false }
    }

    /// How many of `len` bytes the stream may send now (at least one), once flow control grants
    /// any: h2 queues no more than that.
    fn poll_send_capacity(&mut self, cx: &mut Context<'_>, len: usize) -> Poll<io::Result<usize>> {
        if self.write_closed {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        self.send.reserve_capacity(len.min(WRITE_CHUNK));
        loop {
            let cap = self.send.capacity();
            if cap > 0 {
                return Poll::Ready(Ok(cap.min(len)));
            }
            match ready!(self.send.poll_capacity(cx)) {
                Some(Ok(_)) => continue,
                Some(Err(e)) => return Poll::Ready(Err(h2_to_io(e))),
                None => return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into())),
            }
        }
    }

    /// Until `unread` holds bytes, or the stream ended (then it stays empty).
    fn poll_unread(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.unread.is_empty() && !self.read_eof {
            match ready!(self.recv.poll_data(cx)) {
                Some(Ok(b)) => self.unread = b,
                Some(Err(e)) => return Poll::Ready(Err(h2_to_io(e))),
                None => self.read_eof = true,
            }
        }
        Poll::Ready(Ok(()))
    }

    /// `n` bytes left h2's hands: only now may the peer send more on this stream.
    fn release(&mut self, n: usize) {
        if n > 0 {
            let _ = self.recv.flow_control().release_capacity(n);
        }
    }
}

impl Resettable for H2Stream {
    fn reset(&mut self) {
        self.send.send_reset(Reason::CANCEL);
    }

    /// A chunk becomes DATA frames as it is: h2 writes it from the chunk itself.
    fn owned_chunk(&self) -> Option<usize> {
        Some(DATA_CHUNK)
    }

    fn poll_write_owned(&mut self, cx: &mut Context<'_>, chunk: &mut Bytes) -> Poll<io::Result<()>> {
        while !chunk.is_empty() {
            let n = ready!(self.poll_send_capacity(cx, chunk.len()))?;
            self.send.send_data(chunk.split_to(n), false).map_err(h2_to_io)?;
        }
        Poll::Ready(Ok(()))
    }

    /// A DATA frame's payload as h2 received it, taken whole: the relay writes it to the socket
    /// from h2's own buffer, saving the copy a read into the relay's buffer costs.
    fn reads_owned(&self) -> bool {
        true
    }

    fn poll_read_owned(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Bytes>> {
        ready!(self.poll_unread(cx))?;
        let chunk = std::mem::take(&mut self.unread);
        self.release(chunk.len());
        Poll::Ready(Ok(chunk))
    }
}

impl AsyncRead for H2Stream {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        ready!(this.poll_unread(cx))?;
        let n = this.unread.len().min(buf.remaining());
        buf.put_slice(&this.unread[..n]);
        this.unread.advance(n);
        this.release(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for H2Stream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let this = &mut *self;
        let n = ready!(this.poll_send_capacity(cx, buf.len()))?;
        this.send.send_data(Bytes::copy_from_slice(&buf[..n]), false).map_err(h2_to_io)?;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // h2 writes queued frames as the connection task runs; nothing to push from here.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if !this.write_closed {
            this.write_closed = true;
            // END_STREAM on an empty DATA frame: the half-close the far side turns into a FIN.
            this.send.send_data(Bytes::new(), true).map_err(h2_to_io)?;
        }
        Poll::Ready(Ok(()))
    }
}

impl Drop for H2Stream {
    fn drop(&mut self) {
        // Dropped before an orderly end in both directions: tell the peer so it does not wait.
        if !(self.write_closed && self.read_eof) {
            self.send.send_reset(Reason::CANCEL);
        }
    }
}

impl ControlSend for h2::SendStream<Bytes> {
    async fn send(&mut self, line: Vec<u8>) -> io::Result<()> {
        self.send_data(Bytes::from(line), false).map_err(io::Error::other)
    }
}

impl ControlRecv for h2::RecvStream {
    async fn recv(&mut self) -> Option<Bytes> {
        let chunk = self.data().await?.ok()?;
        let _ = self.flow_control().release_capacity(chunk.len());
        Some(chunk)
    }
}
