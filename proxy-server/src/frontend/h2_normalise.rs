//! A gRPC front-end connection's reads through `proxy_wire`'s HTTP/2 request normaliser, so the `:authority` real gRPC clients send on a Unix socket (the socket's path, raw or percent-encoded, or nothing) reaches hyper's HTTP/2 server as a request it takes; writes pass untouched.
//!
//! Bytes the normaliser releases stay where the read put them (the server's own buffer), so
//! `DATA` frames are not copied; only header blocks, and the rest of a read that held one, go
//! through the normaliser's output.

use proxy_wire::http2::{Http2Error, Limits, RequestNormaliser};
use std::io;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, ready};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A client connection whose reads are normalised (see the module).
pub(crate) struct Normalised<S> {
    inner: S,
    core: RequestNormaliser,
    /// Where a frame the normaliser gathers is read into (at most one header frame).
    scratch: Vec<u8>,
    failed: Arc<OnceLock<Http2Error>>,
}

impl<S> Normalised<S> {
    /// `inner` must start at the connection preface; `limits` are the server's settings.
    pub(crate) fn new(inner: S, limits: Limits) -> Self {
        Self { inner, core: RequestNormaliser::new(limits), scratch: Vec::new(), failed: Arc::default() }
    }

    /// Where the normaliser's error will be, once the client's HTTP/2 was found malformed.
    pub(crate) fn failure(&self) -> Arc<OnceLock<Http2Error>> {
        self.failed.clone()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Normalised<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        // Bounded: each round passes bytes on and returns, or reads at least one byte into the
        // normaliser (or returns at the end of the stream, an error or Pending).
        loop {
            let out = this.core.output();
            if !out.is_empty() {
                let n = out.len().min(buf.remaining());
                buf.put_slice(out.get(..n).unwrap_or_default());
                this.core.consume(n);
                return Poll::Ready(Ok(()));
            }
            match this.core.read_hint() {
                None => {
                    if this.scratch.capacity() > 0 {
                        // A frame was gathered: an idle connection keeps no frame-sized buffer.
                        this.scratch = Vec::new();
                    }
                    // In place: the bytes the normaliser releases stay in `buf`.
                    let before = buf.filled().len();
                    ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
                    let after = buf.filled().len();
                    if after == before {
                        return Poll::Ready(Ok(()));
                    }
                    let read = buf.filled().get(before..).unwrap_or_default();
                    let released = this.core.feed(read).map_err(|e| invalid(&this.failed, e))?;
                    buf.set_filled(before + released);
                    if released > 0 {
                        return Poll::Ready(Ok(()));
                    }
                }
                Some(want) => {
                    // Gathering a frame: read what completes it, into the scratch buffer.
                    this.scratch.resize(want, 0);
                    let mut rb = ReadBuf::new(&mut this.scratch);
                    ready!(Pin::new(&mut this.inner).poll_read(cx, &mut rb))?;
                    if rb.filled().is_empty() {
                        // The client ended inside a frame: the server sees the end of stream.
                        return Poll::Ready(Ok(()));
                    }
                    let n = this.core.feed(rb.filled()).map_err(|e| invalid(&this.failed, e))?;
                    debug_assert_eq!(n, 0, "a gathering normaliser releases nothing in place");
                }
            }
        }
    }
}

/// The normaliser's error as the reader's, noted for [`Normalised::failure`] (h2 keeps only the
/// kind and text of an I/O error).
fn invalid(failed: &OnceLock<Http2Error>, e: Http2Error) -> io::Error {
    let _ = failed.set(e.clone());
    io::Error::new(io::ErrorKind::InvalidData, format!("the client's HTTP/2: {e}"))
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Normalised<S> {
    proxy_core::write_through!(inner);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proxy_wire::http2::{PREFACE, frame_header, hpack};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    /// A request's header block as gRPC core sends it on a Unix socket (Huffman and indexing
    /// aside): the percent-encoded socket path as `:authority`.
    fn headers(stream: u32) -> Vec<u8> {
        let mut block = Vec::new();
        for (name, value) in [
            (&b":method"[..], &b"POST"[..]),
            (b":scheme", b"http"),
            (b":path", b"/ProxyService/Proxy"),
            (b":authority", b"run%2Fkonnectivity.sock"),
            (b"content-type", b"application/grpc"),
        ] {
            hpack::encode_literal(&mut block, &hpack::Field { name, value, never_indexed: false });
        }
        let mut f = Vec::new();
        frame_header(&mut f, block.len(), 0x1, 0x4, stream);
        f.extend_from_slice(&block);
        f
    }

    fn data(stream: u32, len: usize) -> Vec<u8> {
        let mut f = Vec::new();
        frame_header(&mut f, len, 0x0, 0, stream);
        f.extend((0..len).map(|i| i as u8));
        f
    }

    /// What the server reads, written by the client in pieces of `piece` bytes and read with
    /// a buffer of `read` bytes: the same as the normaliser gives fed at once.
    #[tokio::test]
    async fn reads_in_any_pieces_give_the_normalised_stream() {
        let mut client = PREFACE.to_vec();
        for s in [1u32, 3, 5] {
            client.extend(headers(s));
            client.extend(data(s, 40_000));
            client.extend(data(s, 7));
        }
        let mut want = Vec::new();
        let mut core = RequestNormaliser::new(Limits::default());
        let n = core.feed(&client).unwrap();
        want.extend_from_slice(&client[..n]);
        want.extend_from_slice(core.output());
        assert!(!want.windows(7).any(|w| w == b"run%2Fk"), "the authority is still there");
        assert!(want.len() < client.len());
        for (piece, read) in [(1, 1), (3, 8), (9, 5), (100, 16_384), (client.len(), 70_000), (4096, 3)] {
            let (mut w, r) = tokio::io::duplex(64 * 1024);
            let writer = {
                let client = client.clone();
                tokio::spawn(async move {
                    for c in client.chunks(piece) {
                        w.write_all(c).await.unwrap();
                    }
                })
            };
            let mut n = Normalised::new(r, Limits::default());
            let mut got = Vec::new();
            let mut buf = vec![0u8; read];
            // Bounded: the writer ends, then the reads end.
            loop {
                let k = n.read(&mut buf).await.unwrap();
                if k == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..k]);
            }
            writer.await.unwrap();
            assert_eq!(got, want, "pieces of {piece}, reads of {read}");
        }
    }

    /// What the normaliser costs a bulk upload: 1 GiB of 16 KiB DATA frames (a request's
    /// HEADERS every 64 MiB) read in 64 KiB reads from memory, through it and past it; prints
    /// both rates (best of three). Timing is not asserted: `cargo test --release -p proxy-server
    /// --lib -- --ignored bulk_reads_through_the_normaliser --nocapture`.
    #[tokio::test]
    #[ignore = "a measurement"]
    async fn bulk_reads_through_the_normaliser() {
        let mut client = PREFACE.to_vec();
        for s in 0..16u32 {
            client.extend(headers(2 * s + 1));
            for _ in 0..(64 << 20) / 16_384 {
                client.extend(data(2 * s + 1, 16_384));
            }
        }
        let read_all = |normalise: bool| {
            let client = &client;
            async move {
                let mut buf = vec![0u8; 64 * 1024];
                let started = std::time::Instant::now();
                let mut total = 0usize;
                if normalise {
                    let mut r = Normalised::new(&client[..], Limits::default());
                    // Bounded: the input ends.
                    loop {
                        let n = r.read(&mut buf).await.unwrap();
                        if n == 0 {
                            break;
                        }
                        total += n;
                    }
                } else {
                    let mut r = &client[..];
                    loop {
                        let n = r.read(&mut buf).await.unwrap();
                        if n == 0 {
                            break;
                        }
                        total += n;
                    }
                }
                (total, started.elapsed())
            }
        };
        for normalise in [false, true, false, true, false, true] {
            let (total, took) = read_all(normalise).await;
            let gbit = total as f64 * 8.0 / took.as_secs_f64() / 1e9;
            println!(
                "{}: {total} bytes in {took:?}: {gbit:.1} Gbit/s",
                if normalise { "normalised" } else { "plain     " }
            );
        }
    }

    #[tokio::test]
    async fn a_protocol_error_is_an_invalid_data_error() {
        let mut client = PREFACE.to_vec();
        frame_header(&mut client, 0, 0x5, 0x4, 1);
        let mut n = Normalised::new(&client[..], Limits::default());
        let failure = n.failure();
        let mut got = Vec::new();
        let e = n.read_to_end(&mut got).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("PUSH_PROMISE"), "{e}");
        assert_eq!(failure.get(), Some(&Http2Error::PushPromise));
    }
}
