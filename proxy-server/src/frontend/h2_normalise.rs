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

    /// A client's frames for the attack on the normaliser: a request that puts a 4 KiB
    /// `:authority` that is no URI authority in the HPACK table, then `attacks` requests whose
    /// 64 KiB header blocks are one-octet references to it, then a plain request.
    fn reference_attack(attacks: u32) -> Vec<u8> {
        let mut client = PREFACE.to_vec();
        frame_header(&mut client, 0, 0x4, 0, 0);
        // POST, http and / by static index; the authority (4,054 octets: a 4,096-octet entry)
        // with incremental indexing.
        let mut first = vec![0x83, 0x86, 0x84, 0x41, 0x7f, 0x80 | (3927 & 0x7f) as u8, (3927 >> 7) as u8];
        first.extend(std::iter::repeat_n(b'a', 4053));
        first.push(b'/');
        frame_header(&mut client, first.len(), 0x1, 0x5, 1);
        client.extend_from_slice(&first);
        let refs = [0xbe; 16_384];
        for i in 0..attacks {
            for (kind, flags) in [(0x1, 0), (0x9, 0), (0x9, 0), (0x9, 0x4)] {
                frame_header(&mut client, refs.len(), kind, flags, 3 + 2 * i);
                client.extend_from_slice(&refs);
            }
        }
        // GET / by static index, a plain authority.
        let mut last = vec![0x82, 0x86, 0x84];
        hpack::encode_literal(
            &mut last,
            &hpack::Field { name: b":authority", value: b"localhost", never_indexed: false },
        );
        frame_header(&mut client, last.len(), 0x1, 0x5, 5 + 2 * attacks);
        client.extend_from_slice(&last);
        client
    }

    /// The attack on the normaliser against hyper's HTTP/2 server (the front end's settings):
    /// each block of references is refused as a list over the limit (`431`, then the stream
    /// reset), the requests around them are served on the same connection, the authority was
    /// judged once in all, and the list bytes the normaliser decoded are fewer than the bytes
    /// the client sent.
    #[tokio::test]
    async fn references_to_a_refused_authority_get_431_and_the_connection_serves_on() {
        use http_body_util::Empty;
        use hyper_util::rt::{TokioExecutor, TokioIo};

        let limits = Limits::default();
        let attacks = 2;
        let (mut client, front) = tokio::io::duplex(1 << 20);
        let (server_io, back) = tokio::io::duplex(1 << 20);
        let (from_client, mut to_client) = tokio::io::split(front);
        let (mut from_server, mut to_server) = tokio::io::split(back);
        let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        builder
            .max_frame_size(limits.max_frame_size as u32)
            .header_table_size(limits.header_table_size as u32)
            .max_header_list_size(limits.max_header_list_size as u32);
        let svc = hyper::service::service_fn(|_req| async {
            Ok::<_, std::convert::Infallible>(hyper::Response::new(Empty::<bytes::Bytes>::new()))
        });
        let server = tokio::spawn(builder.serve_connection(TokioIo::new(server_io), svc));
        // The normaliser between the client and the server, as the front end puts it.
        let reads = tokio::spawn(async move {
            let mut n = Normalised::new(from_client, limits);
            tokio::io::copy(&mut n, &mut to_server).await.unwrap();
            to_server.shutdown().await.unwrap();
            n.core.work()
        });
        let writes = tokio::spawn(async move { tokio::io::copy(&mut from_server, &mut to_client).await });

        let sent = reference_attack(attacks);
        client.write_all(&sent).await.unwrap();
        let mut written = sent.len();
        // What the server answers each stream: its status, or the reset's error code.
        let mut decoder = hpack::Decoder::new(4096);
        let mut answers = std::collections::BTreeMap::<u32, Vec<String>>::new();
        let mut buf = Vec::new();
        let want_streams = attacks as usize + 2;
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
        // Bounded: until every stream is answered (and the refused ones reset), or the deadline.
        while answers.len() < want_streams || answers.values().any(|a| a.len() < 2 && a[0] == "431") {
            let mut chunk = [0u8; 4096];
            let n = tokio::time::timeout_at(deadline, client.read(&mut chunk)).await.expect("answers in time").unwrap();
            assert!(n > 0, "the server closed the connection: {answers:?}");
            buf.extend_from_slice(&chunk[..n]);
            while buf.len() >= 9 {
                let len = usize::from(buf[0]) << 16 | usize::from(buf[1]) << 8 | usize::from(buf[2]);
                if buf.len() < 9 + len {
                    break;
                }
                let frame: Vec<u8> = buf.drain(..9 + len).collect();
                let (kind, flags, stream) = (frame[3], frame[4], u32::from_be_bytes(frame[5..9].try_into().unwrap()));
                let payload = &frame[9..];
                match kind {
                    0x1 => {
                        assert_ne!(flags & 0x4, 0, "an answer's header block in one frame");
                        let mut status = String::new();
                        decoder
                            .decode(payload, |f, _| {
                                if f.name == b":status" {
                                    status = String::from_utf8_lossy(f.value).into_owned();
                                }
                                std::ops::ControlFlow::Continue(())
                            })
                            .unwrap();
                        answers.entry(stream).or_default().push(status);
                    }
                    0x3 => answers.entry(stream).or_default().push(format!("reset {:?}", payload)),
                    0x4 if flags & 0x1 == 0 => {
                        let mut ack = Vec::new();
                        frame_header(&mut ack, 0, 0x4, 0x1, 0);
                        client.write_all(&ack).await.unwrap();
                        written += ack.len();
                    }
                    0x7 => panic!("GOAWAY {payload:?}: {answers:?}"),
                    _ => {}
                }
            }
        }
        let last = 5 + 2 * attacks;
        assert_eq!(answers.remove(&1), Some(vec!["200".to_string()]));
        assert_eq!(answers.remove(&last), Some(vec!["200".to_string()]));
        for i in 0..attacks {
            // 431, then RST_STREAM (PROTOCOL_ERROR: h2's reset after its 431).
            let a = answers.remove(&(3 + 2 * i)).unwrap();
            assert_eq!(a, ["431".to_string(), "reset [0, 0, 0, 1]".to_string()], "stream {}", 3 + 2 * i);
        }
        client.shutdown().await.unwrap();
        let work = reads.await.unwrap();
        assert_eq!(work.received, written as u64);
        // The bad authority once, and the last request's.
        assert_eq!(work.judged, 4054 + b"localhost".len() as u64);
        // The first request (43, 43, 38 and the 4,096-octet authority), four references per
        // block of them (four reach the list limit), the last request (42, 43, 38, 51).
        assert_eq!(work.decoded, 4220 + u64::from(attacks) * 4 * 4096 + 174, "{work:?}");
        assert!(work.decoded < work.received, "{work:?}");
        drop(client);
        let _ = server.await;
        let _ = writes.await;
    }
}
