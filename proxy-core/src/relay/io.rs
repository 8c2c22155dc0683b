//! Byte streams: the one trait for a stream that can end in a reset, replaying bytes already read in front of a stream, and reading ahead for a reader that asks for little at a time.

use bytes::{Buf, Bytes};
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A byte stream that can end in a reset instead of an orderly close: both ends of every relay
/// and every tunnel stream.
pub trait Resettable: AsyncRead + AsyncWrite + Unpin + Send {
    /// Make the peer see a reset rather than an orderly end: at once where the stream has a
    /// reset of its own (RST_STREAM, RESET_STREAM on a tunnel stream), else when it is closed
    /// (TCP: zero linger, so the close sends an RST). A Unix socket has no reset: its close is
    /// all the peer gets.
    fn reset(&mut self);

    /// `Some(size)` when [`Resettable::poll_write_owned`] queues a chunk as it is, without
    /// copying it (a tunnel stream: an HTTP/2 DATA frame, a QUIC stream chunk): a relay writing
    /// to such a stream reads into chunks of its own of up to `size` bytes and hands them over,
    /// saving a copy per byte. `None`: the stream copies; the relay reads into its buffer.
    fn owned_chunk(&self) -> Option<usize> {
        None
    }

    /// `true` when [`Resettable::poll_read_owned`] hands over the chunks the stream received as
    /// they are (a tunnel stream: each HTTP/2 DATA frame's payload, each QUIC packet's): a relay
    /// reading from such a stream gathers the chunks ready at once and writes them out, instead
    /// of copying them into its buffer first. `false`: the relay reads into its buffer.
    fn reads_owned(&self) -> bool {
        false
    }

    /// The next chunk received, by value; an empty chunk at the end of the stream. The default
    /// reads up to one relay buffer's worth into a chunk of its own.
    fn poll_read_owned(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Bytes>> {
        let mut chunk = bytes::BytesMut::with_capacity(crate::relay::buf::BUF_SIZE);
        ready!(tokio_util::io::poll_read_buf(Pin::new(&mut *self), cx, &mut chunk))?;
        Poll::Ready(Ok(chunk.freeze()))
    }

    /// Write all of `chunk`, taking its bytes by value; while Pending, `chunk` holds what is
    /// left. The default copies it through `poll_write`.
    fn poll_write_owned(&mut self, cx: &mut Context<'_>, chunk: &mut Bytes) -> Poll<io::Result<()>> {
        while !chunk.is_empty() {
            let n = ready!(Pin::new(&mut *self).poll_write(cx, chunk))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            chunk.advance(n);
        }
        Poll::Ready(Ok(()))
    }
}

impl Resettable for tokio::net::TcpStream {
    fn reset(&mut self) {
        crate::net::reset_on_close(self);
    }
}

impl Resettable for tokio::net::UnixStream {
    fn reset(&mut self) {}
}

impl Resettable for tokio_rustls::server::TlsStream<tokio::net::TcpStream> {
    fn reset(&mut self) {
        crate::net::reset_on_close(self.get_ref().0);
    }
}

impl Resettable for tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    fn reset(&mut self) {
        crate::net::reset_on_close(self.get_ref().0);
    }
}

impl<T: Resettable + ?Sized> Resettable for Box<T> {
    fn reset(&mut self) {
        (**self).reset();
    }
    fn owned_chunk(&self) -> Option<usize> {
        (**self).owned_chunk()
    }
    fn poll_write_owned(&mut self, cx: &mut Context<'_>, chunk: &mut Bytes) -> Poll<io::Result<()>> {
        (**self).poll_write_owned(cx, chunk)
    }
    fn reads_owned(&self) -> bool {
        (**self).reads_owned()
    }
    fn poll_read_owned(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Bytes>> {
        (**self).poll_read_owned(cx)
    }
}

impl<S: Resettable> Resettable for Prefixed<S> {
    fn reset(&mut self) {
        self.inner.reset();
    }
    fn owned_chunk(&self) -> Option<usize> {
        self.inner.owned_chunk()
    }
    fn poll_write_owned(&mut self, cx: &mut Context<'_>, chunk: &mut Bytes) -> Poll<io::Result<()>> {
        self.inner.poll_write_owned(cx, chunk)
    }
    fn reads_owned(&self) -> bool {
        self.inner.reads_owned()
    }
    /// The prefix first, as one chunk, then the inner stream's chunks.
    fn poll_read_owned(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Bytes>> {
        if self.pos < self.prefix.len() {
            let rest = Bytes::copy_from_slice(&self.prefix[self.pos..]);
            self.prefix = Vec::new();
            self.pos = 0;
            return Poll::Ready(Ok(rest));
        }
        self.inner.poll_read_owned(cx)
    }
}

/// The body of an `AsyncWrite` impl that hands every write to the field `$inner`, for a
/// wrapper that changes only what is read:
/// `impl<S: AsyncWrite + Unpin> AsyncWrite for W<S> { proxy_core::write_through!(inner); }`.
#[macro_export]
macro_rules! write_through {
    ($inner:ident) => {
        fn poll_write(
            mut self: ::std::pin::Pin<&mut Self>,
            cx: &mut ::std::task::Context<'_>,
            buf: &[u8],
        ) -> ::std::task::Poll<::std::io::Result<usize>> {
            ::std::pin::Pin::new(&mut self.$inner).poll_write(cx, buf)
        }
        fn poll_write_vectored(
            mut self: ::std::pin::Pin<&mut Self>,
            cx: &mut ::std::task::Context<'_>,
            bufs: &[::std::io::IoSlice<'_>],
        ) -> ::std::task::Poll<::std::io::Result<usize>> {
            ::std::pin::Pin::new(&mut self.$inner).poll_write_vectored(cx, bufs)
        }
        fn is_write_vectored(&self) -> bool {
            self.$inner.is_write_vectored()
        }
        fn poll_flush(
            mut self: ::std::pin::Pin<&mut Self>,
            cx: &mut ::std::task::Context<'_>,
        ) -> ::std::task::Poll<::std::io::Result<()>> {
            ::std::pin::Pin::new(&mut self.$inner).poll_flush(cx)
        }
        fn poll_shutdown(
            mut self: ::std::pin::Pin<&mut Self>,
            cx: &mut ::std::task::Context<'_>,
        ) -> ::std::task::Poll<::std::io::Result<()>> {
            ::std::pin::Pin::new(&mut self.$inner).poll_shutdown(cx)
        }
    };
}

/// A stream whose first reads return `prefix` (bytes a protocol detector already consumed).
pub struct Prefixed<S> {
    prefix: Vec<u8>,
    pos: usize,
    inner: S,
}

impl<S> Prefixed<S> {
    pub fn new(prefix: Vec<u8>, inner: S) -> Self {
        Self { prefix, pos: 0, inner }
    }

    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if self.pos < self.prefix.len() {
            let n = (self.prefix.len() - self.pos).min(buf.remaining());
            let start = self.pos;
            buf.put_slice(&self.prefix[start..start + n]);
            self.pos += n;
            if self.pos == self.prefix.len() {
                self.prefix = Vec::new();
                self.pos = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A stream whose small reads are served from one read of up to a relay buffer (64 KiB). rustls
/// reads a TLS connection at most 4 KiB beyond what it holds, so a 64 KiB HTTP/2 DATA frame (four
/// 16 KiB records) cost the tunnel's receiving end about seven `recvfrom` calls; read ahead, it
/// costs one or two, for a copy out of this buffer. The buffer comes from the relay's per-thread
/// pool only while read bytes wait in it, so an idle tunnel session holds none. Writes pass through.
pub struct ReadAhead<S> {
    inner: S,
    buf: Option<Box<[u8]>>,
    pos: usize,
    len: usize,
}

impl<S> ReadAhead<S> {
    pub fn new(inner: S) -> Self {
        Self { inner, buf: None, pos: 0, len: 0 }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for ReadAhead<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, out: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.buf.is_none() {
            if out.remaining() >= crate::relay::buf::BUF_SIZE {
                return Pin::new(&mut this.inner).poll_read(cx, out);
            }
            let mut b = crate::relay::buf::take_buf();
            let mut rb = ReadBuf::new(&mut b);
            let r = Pin::new(&mut this.inner).poll_read(cx, &mut rb);
            let n = rb.filled().len();
            match r {
                Poll::Ready(Ok(())) if n > 0 => (this.buf, this.pos, this.len) = (Some(b), 0, n),
                // End of stream, an error or nothing yet: the buffer goes back at once.
                r => {
                    crate::relay::buf::give_buf(b);
                    return r;
                }
            }
        }
        if let Some(b) = &this.buf {
            let n = (this.len - this.pos).min(out.remaining());
            out.put_slice(&b[this.pos..this.pos + n]);
            this.pos += n;
        }
        if this.pos == this.len
            && let Some(b) = this.buf.take()
        {
            crate::relay::buf::give_buf(b);
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for ReadAhead<S> {
    crate::write_through!(inner);
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    /// A reader that hands out its script one step per call: bytes, "nothing yet" (it asks to be
    /// polled again), or an error; then the end. It records the room each read offered.
    struct Script {
        steps: std::collections::VecDeque<Option<io::Result<Vec<u8>>>>,
        offered: Vec<usize>,
    }

    impl AsyncRead for Script {
        fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
            self.offered.push(buf.remaining());
            match self.steps.pop_front() {
                None => Poll::Ready(Ok(())),
                Some(None) => {
                    cx.waker().wake_by_ref();
                    Poll::Pending
                }
                Some(Some(Err(e))) => Poll::Ready(Err(e)),
                Some(Some(Ok(b))) => {
                    buf.put_slice(&b);
                    Poll::Ready(Ok(()))
                }
            }
        }
    }

    #[tokio::test]
    async fn small_reads_are_served_from_one_large_read_in_order_through_pauses_to_the_end() {
        let data: Vec<u8> = (0..50_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let steps = vec![Some(Ok(data[..30_000].to_vec())), None, Some(Ok(data[30_000..].to_vec())), None];
        let mut r = ReadAhead::new(Script { steps: steps.into_iter().collect(), offered: Vec::new() });
        let mut got = Vec::new();
        let mut small = [0u8; 4096];
        loop {
            let n = r.read(&mut small).await.unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&small[..n]);
        }
        assert_eq!(got, data, "every byte, in order, then the end");
        assert!(r.buf.is_none(), "no buffer held once drained");
        // Two data reads and the end, each offered a whole buffer (not the caller's 4 KiB), plus
        // the two pauses.
        assert_eq!(r.inner.offered, vec![crate::relay::buf::BUF_SIZE; 5]);
    }

    #[tokio::test]
    async fn an_error_comes_through_after_the_bytes_before_it_and_a_large_read_goes_straight() {
        let steps = vec![Some(Ok(b"before".to_vec())), Some(Err(io::ErrorKind::ConnectionReset.into()))];
        let mut r = ReadAhead::new(Script { steps: steps.into_iter().collect(), offered: Vec::new() });
        let mut b = [0u8; 3];
        r.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"bef");
        r.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"ore");
        assert!(r.buf.is_none());
        let e = r.read(&mut b).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionReset);
        let mut big = vec![0u8; crate::relay::buf::BUF_SIZE];
        assert_eq!(r.read(&mut big).await.unwrap(), 0, "the end, read straight into the caller's room");
        assert_eq!(r.inner.offered.last(), Some(&crate::relay::buf::BUF_SIZE));
    }

    #[tokio::test]
    async fn prefix_then_inner() {
        let inner: &[u8] = b" world";
        let mut p = Prefixed::new(b"hello".to_vec(), inner);
        let mut s = String::new();
        p.read_to_string(&mut s).await.unwrap();
        assert_eq!(s, "hello world");
    }

    #[tokio::test]
    async fn chunks_by_value_prefix_first_then_the_stream_then_empty_at_its_end() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut peer = tokio::net::TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        let mut p = Prefixed::new(b"hello".to_vec(), s);
        tokio::io::AsyncWriteExt::write_all(&mut peer, b" world").await.unwrap();
        drop(peer);
        let mut got = Vec::new();
        let mut reads = 0;
        loop {
            let chunk = std::future::poll_fn(|cx| p.poll_read_owned(cx)).await.unwrap();
            if reads == 0 {
                assert_eq!(&chunk[..], b"hello", "the prefix comes whole, on its own");
            }
            reads += 1;
            assert!(reads < 10, "ends after the peer's close");
            if chunk.is_empty() {
                break;
            }
            got.extend_from_slice(&chunk);
        }
        assert_eq!(got, b"hello world");
    }
}
