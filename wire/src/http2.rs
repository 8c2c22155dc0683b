//! HTTP/2 from a client on its way to an HTTP/2 server: its request header blocks re-encoded with an `:authority` that is no URI authority dropped, every other byte passed as it came.
//!
//! gRPC clients on a Unix socket fill `:authority` from the socket's path (gRPC core percent-
//! encodes it, grpc-java sends it raw) or leave it empty; the `h2` crate refuses every one of
//! these as a malformed request. [`RequestNormaliser`] stands in front of the server's reads:
//!
//! - the connection preface and every frame but `HEADERS` and `CONTINUATION` pass through
//!   unchanged, in place ([`RequestNormaliser::feed`] says how many of the bytes just read go
//!   on as they are), so `DATA` costs a look at each frame header and no copy;
//! - a header block (`HEADERS` and its `CONTINUATION`s) is taken whole, HPACK-decoded with the
//!   connection's context (dynamic table bounded by what the server advertises) and re-encoded
//!   as literals that are never indexed by the server's decoder, so the server's HPACK table
//!   stays empty and in step whatever the client's encoder did; an `:authority` that
//!   `http::uri::Authority` refuses (the parser `h2` uses) is left out (a request without one is
//!   valid HTTP/2); padding and the deprecated priority fields are dropped; the block is framed
//!   again within the server's frame size;
//! - a header list that reaches the server's `SETTINGS_MAX_HEADER_LIST_SIZE`, counting every
//!   field the client sent (name, value and 32 octets each, as the setting counts them; an
//!   `:authority` left out counts too), is passed on as far as the field before the one that
//!   reaches it, then a filler field ([`FILLER`]) that brings what the server counts to the
//!   limit, so the server refuses that one stream (h2: `431`, then `RST_STREAM`) as it would
//!   have refused the whole list; the rest of the block only keeps the HPACK context in step,
//!   so the connection goes on;
//! - what no server should get is a connection error ([`Http2Error`]): a `PUSH_PROMISE` from a
//!   client, a header block broken across other frames, a malformed header frame or block, a
//!   compressed block above four times the list limit or spread over more than
//!   [`MAX_BLOCK_FRAMES`] frames.
//!
//! # The work is bounded by what the client sends
//!
//! HPACK lets one octet name a table entry of up to the table's size (4 KiB), so decoding a
//! block costs more than its length only through what it refers to. The bound, for a header
//! block of `B` octets with the server's list limit `L` and table size `T` (counted by
//! [`Work`]; the fuzz target checks it on every input):
//!
//! - decoding: each octet of the block is read once; a reference is looked up, never copied
//!   (a literal that names an entry shares its name); Huffman decoding makes at most 8 octets
//!   of 5. Work linear in `B`.
//! - judging an `:authority`: once per field that arrives as a literal, its verdict kept with
//!   the table entry; a reference is never judged again. At most `8/5 B` octets judged.
//! - fields handed on ([`Work::decoded`], each octet copied once into the block passed on, then
//!   read once by the server): those under the list limit, and the one that reaches it (at most
//!   a table entry, or a literal of the block); nothing after it. At most `L + T + 32 + 8/5 B`.
//!
//! So a connection's decoded list bytes are at most `blocks * (L + T + 32) + 8/5 * received`:
//! a 64 KiB block of references costs what a 16 KiB list of literals does, less than its own
//! length. A block of a few octets that reaches the limit costs a list of `L` octets, which the
//! server is handed and refuses: per byte received, what a flood of the smallest ordinary
//! requests costs it (the architecture page has the figures).

pub mod hpack;
pub mod huffman;

use hpack::{Decoder, HpackError};
use std::ops::ControlFlow;

/// What every HTTP/2 connection starts with (RFC 9113 §3.4).
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// A frame header's length.
pub const FRAME_HEADER: usize = 9;
/// Frames one header block may span (`HEADERS` and its `CONTINUATION`s): a flood of empty
/// `CONTINUATION` frames costs no memory but would cost time without end.
pub const MAX_BLOCK_FRAMES: usize = 32;

const HEADERS: u8 = 0x1;
const PUSH_PROMISE: u8 = 0x5;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

/// The server's settings the normaliser must respect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// `SETTINGS_MAX_FRAME_SIZE`: the largest header frame taken, and the size frames are cut to.
    pub max_frame_size: usize,
    /// `SETTINGS_HEADER_TABLE_SIZE`: the largest dynamic table the client may use.
    pub header_table_size: usize,
    /// `SETTINGS_MAX_HEADER_LIST_SIZE`: a list that reaches it is refused by the server.
    pub max_header_list_size: usize,
}

impl Default for Limits {
    /// HTTP/2's defaults, and hyper's server list limit (16 KiB).
    fn default() -> Self {
        Self { max_frame_size: 16_384, header_table_size: 4_096, max_header_list_size: 16_384 }
    }
}

/// Why the client's connection must end (an HTTP/2 connection error).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Http2Error {
    #[error("the client did not start with the HTTP/2 connection preface")]
    NotPreface,
    #[error("a client sent PUSH_PROMISE")]
    PushPromise,
    #[error("HEADERS on stream 0")]
    StreamZero,
    #[error("a header frame of {0} bytes is larger than the {1} the server allows")]
    FrameTooLarge(usize, usize),
    #[error("a HEADERS frame is shorter than its padding and priority fields")]
    BadPadding,
    #[error("frame type {0:#x} inside a header block: only CONTINUATION may follow HEADERS without END_HEADERS")]
    ExpectedContinuation(u8),
    #[error("CONTINUATION for stream {0} inside the header block of stream {1}")]
    ContinuationStream(u32, u32),
    #[error("CONTINUATION without a header block to continue")]
    StrayContinuation,
    #[error("a header block larger than {0} bytes")]
    BlockTooLarge(usize),
    #[error("a header block spread over more than {MAX_BLOCK_FRAMES} frames")]
    TooManyFrames,
    #[error("header block: {0}")]
    Hpack(#[from] HpackError),
}

/// The work a normaliser has done, in the units its bound is stated in (see the module).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Work {
    /// Bytes the client sent (everything fed).
    pub received: u64,
    /// Header blocks decoded.
    pub blocks: u64,
    /// List bytes (name, value and 32 per field, as `SETTINGS_MAX_HEADER_LIST_SIZE` counts them)
    /// of the decoded fields the normaliser looked at, kept or dropped.
    pub decoded: u64,
    /// Value octets handed to the judge of what goes on (an `:authority`'s are parsed; any
    /// other field is judged by its name): each field once, when it arrives as a literal.
    pub judged: u64,
}

/// A header block being gathered.
#[derive(Debug)]
struct Block {
    stream: u32,
    end_stream: bool,
    fragment: Vec<u8>,
    frames: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// This many bytes of the preface seen.
    Preface(usize),
    /// This many bytes of a passed frame's payload still to pass; 0 at a frame header.
    Frames(usize),
}

/// What the bytes at the start of a buffer are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// So many bytes pass unchanged.
    Pass(usize),
    /// A whole header frame of so many bytes, taken into the block (and, at its end, its
    /// re-encoded frames into the output).
    Taken(usize),
    /// Not enough bytes to know.
    More,
}

/// The client-to-server direction of one HTTP/2 connection, normalised (see the module).
///
/// The caller reads the client, hands each read to [`feed`](Self::feed), passes on the bytes
/// it releases, then [`output`](Self::output) (and [`consume`](Self::consume)s it) before the
/// bytes of any later read.
#[derive(Debug)]
pub struct RequestNormaliser {
    limits: Limits,
    decoder: Decoder,
    state: State,
    /// Bytes taken but not yet understood: a partial frame header or header frame, and what
    /// came after them in the same read.
    held: Vec<u8>,
    /// Bytes to pass on before anything later; `sent` of them already went.
    out: Vec<u8>,
    sent: usize,
    block: Option<Block>,
    dropped: u64,
    work: Work,
    failed: Option<Http2Error>,
}

impl RequestNormaliser {
    /// A normaliser for a connection whose first byte is the first of the preface.
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            decoder: Decoder::with_judge(limits.header_table_size, fits),
            state: State::Preface(0),
            held: Vec::new(),
            out: Vec::new(),
            sent: 0,
            block: None,
            dropped: 0,
            work: Work::default(),
            failed: None,
        }
    }

    /// Bytes just read from the client. Returns how many of the first of them go on to the
    /// server unchanged (before the current output, which is then empty); the normaliser took
    /// the rest, and whatever of them is ready is in [`output`](Self::output). After an error
    /// every call returns it again.
    pub fn feed(&mut self, input: &[u8]) -> Result<usize, Http2Error> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        self.work.received += input.len() as u64;
        let r = self.feed_inner(input);
        if let Err(e) = &r {
            self.failed = Some(e.clone());
            self.held = Vec::new();
            self.out = Vec::new();
            self.sent = 0;
        }
        r
    }

    fn feed_inner(&mut self, input: &[u8]) -> Result<usize, Http2Error> {
        let mut pos = 0;
        if self.is_clean() {
            loop {
                let rest = input.get(pos..).unwrap_or_default();
                if rest.is_empty() {
                    return Ok(pos);
                }
                match self.step(rest)? {
                    Step::Pass(n) => pos += n,
                    Step::Taken(n) => {
                        self.held.extend_from_slice(rest.get(n..).unwrap_or_default());
                        break;
                    }
                    Step::More => {
                        self.held.extend_from_slice(rest);
                        break;
                    }
                }
            }
        } else {
            self.held.extend_from_slice(input);
        }
        self.process_held()?;
        Ok(pos)
    }

    /// Work through the held bytes: what passes is copied to the output.
    fn process_held(&mut self) -> Result<(), Http2Error> {
        let mut pos = 0;
        let held = std::mem::take(&mut self.held);
        let r = loop {
            let rest = held.get(pos..).unwrap_or_default();
            if rest.is_empty() {
                break Ok(());
            }
            match self.step(rest) {
                Ok(Step::Pass(n)) => {
                    self.out.extend_from_slice(rest.get(..n).unwrap_or_default());
                    pos += n;
                }
                Ok(Step::Taken(n)) => pos += n,
                Ok(Step::More) => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        self.held = held;
        self.held.drain(..pos.min(self.held.len()));
        if self.held.is_empty() {
            self.held = Vec::new();
        }
        r
    }

    /// Whether the next byte read may go on in place: nothing held, nothing waiting to go out,
    /// no header block open.
    fn is_clean(&self) -> bool {
        self.held.is_empty() && self.sent == self.out.len() && self.block.is_none()
    }

    /// The bytes that must reach the server next.
    pub fn output(&self) -> &[u8] {
        self.out.get(self.sent..).unwrap_or_default()
    }

    /// `n` bytes of [`output`](Self::output) were passed on.
    pub fn consume(&mut self, n: usize) {
        self.sent = (self.sent + n).min(self.out.len());
        if self.sent == self.out.len() {
            // Given back: it is used only around header blocks, and an idle connection keeps
            // no buffer.
            self.out = Vec::new();
            self.sent = 0;
        }
    }

    /// How many bytes to read next, when the normaliser is gathering a frame: exactly what
    /// completes it, so that what follows is read in place again. `None`: any amount.
    pub fn read_hint(&self) -> Option<usize> {
        if self.is_clean() {
            return None;
        }
        let Some(head) = self.held.get(..FRAME_HEADER) else {
            return Some(FRAME_HEADER - self.held.len());
        };
        let want = FRAME_HEADER + frame_len(head);
        Some(want.saturating_sub(self.held.len()).max(1))
    }

    /// `:authority` fields left out so far.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// The work done so far.
    pub fn work(&self) -> Work {
        self.work
    }

    /// The bytes at the start of `buf` (not empty), with the state moved past them.
    fn step(&mut self, buf: &[u8]) -> Result<Step, Http2Error> {
        match self.state {
            State::Preface(seen) => {
                let want = PREFACE.get(seen..).unwrap_or_default();
                let n = want.len().min(buf.len());
                if buf.get(..n) != want.get(..n) {
                    return Err(Http2Error::NotPreface);
                }
                self.state = if seen + n == PREFACE.len() { State::Frames(0) } else { State::Preface(seen + n) };
                Ok(Step::Pass(n))
            }
            State::Frames(left) if left > 0 => {
                let n = left.min(buf.len());
                self.state = State::Frames(left - n);
                Ok(Step::Pass(n))
            }
            State::Frames(_) => {
                let Some(&[l0, l1, l2, kind, flags, s0, s1, s2, s3]) = buf.first_chunk::<FRAME_HEADER>() else {
                    return Ok(Step::More);
                };
                let len = frame_len(&[l0, l1, l2]);
                let stream = u32::from_be_bytes([s0, s1, s2, s3]) & 0x7fff_ffff;
                if let Some(b) = &self.block {
                    if kind != CONTINUATION {
                        return Err(Http2Error::ExpectedContinuation(kind));
                    }
                    if stream != b.stream {
                        return Err(Http2Error::ContinuationStream(stream, b.stream));
                    }
                }
                match kind {
                    HEADERS | CONTINUATION => {
                        if len > self.limits.max_frame_size {
                            return Err(Http2Error::FrameTooLarge(len, self.limits.max_frame_size));
                        }
                        let Some(payload) = buf.get(FRAME_HEADER..FRAME_HEADER + len) else { return Ok(Step::More) };
                        self.header_frame(kind, flags, stream, payload)?;
                        Ok(Step::Taken(FRAME_HEADER + len))
                    }
                    PUSH_PROMISE => Err(Http2Error::PushPromise),
                    _ => {
                        self.state = State::Frames(len);
                        Ok(Step::Pass(FRAME_HEADER))
                    }
                }
            }
        }
    }

    /// A whole `HEADERS` or `CONTINUATION` frame.
    fn header_frame(&mut self, kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Result<(), Http2Error> {
        let block = match (&mut self.block, kind) {
            (None, HEADERS) => {
                if stream == 0 {
                    return Err(Http2Error::StreamZero);
                }
                let mut p = payload;
                let mut pad = 0;
                if flags & PADDED != 0 {
                    let (&n, rest) = p.split_first().ok_or(Http2Error::BadPadding)?;
                    (pad, p) = (usize::from(n), rest);
                }
                if flags & PRIORITY != 0 {
                    p = p.get(5..).ok_or(Http2Error::BadPadding)?;
                }
                let fragment = p.len().checked_sub(pad).and_then(|n| p.get(..n)).ok_or(Http2Error::BadPadding)?;
                let b = Block { stream, end_stream: flags & END_STREAM != 0, fragment: fragment.to_vec(), frames: 1 };
                self.block.insert(b)
            }
            (None, _) => return Err(Http2Error::StrayContinuation),
            (Some(b), _) => {
                b.frames += 1;
                if b.frames > MAX_BLOCK_FRAMES {
                    return Err(Http2Error::TooManyFrames);
                }
                b.fragment.extend_from_slice(payload);
                b
            }
        };
        let max = self.limits.max_header_list_size.saturating_mul(4);
        if block.fragment.len() > max {
            return Err(Http2Error::BlockTooLarge(max));
        }
        if flags & END_HEADERS != 0
            && let Some(b) = self.block.take()
        {
            self.rewrite(&b)?;
        }
        Ok(())
    }

    /// A complete header block, decoded and appended to the output as frames of its own.
    fn rewrite(&mut self, b: &Block) -> Result<(), Http2Error> {
        let limit = self.limits.max_header_list_size;
        // What goes out is at most the list limit and the filler's name and encoding.
        let mut block = Vec::with_capacity(b.fragment.len().saturating_mul(2).min(limit.saturating_add(64)));
        // The list's size as the client sent it, and of what is kept.
        let (mut listed, mut kept, mut dropped, mut decoded) = (0usize, 0usize, 0u64, 0u64);
        self.decoder.decode(&b.fragment, |f, fits| {
            decoded += f.size() as u64;
            listed = listed.saturating_add(f.size());
            if listed >= limit {
                // This field reaches the server's limit, counting every field the client sent,
                // kept or left out: the server must refuse the stream. A filler brings what it
                // counts to the limit; nothing after it is looked at.
                encode_filler(&mut block, limit - kept);
                return ControlFlow::Break(());
            }
            if !fits {
                dropped += 1;
                return ControlFlow::Continue(());
            }
            kept += f.size();
            hpack::encode_literal(&mut block, &f);
            ControlFlow::Continue(())
        })?;
        self.dropped += dropped;
        self.work.blocks += 1;
        self.work.decoded += decoded;
        self.work.judged = self.decoder.judged();
        let max = self.limits.max_frame_size.max(1);
        let mut chunks = block.chunks(max).peekable();
        let mut kind = HEADERS;
        let mut flags = if b.end_stream { END_STREAM } else { 0 };
        loop {
            let chunk = chunks.next().unwrap_or_default();
            let last = chunks.peek().is_none();
            if last {
                flags |= END_HEADERS;
            }
            frame_header(&mut self.out, chunk.len(), kind, flags, b.stream);
            self.out.extend_from_slice(chunk);
            if last {
                return Ok(());
            }
            (kind, flags) = (CONTINUATION, 0);
        }
    }
}

/// Whether a field goes on to the server: any but an `:authority` that `http::uri::Authority`
/// (the parser h2 checks it with) refuses. Judged once per field the client sends as a literal.
fn fits(name: &[u8], value: &[u8]) -> bool {
    name != b":authority" || http::uri::Authority::try_from(value).is_ok()
}

/// The name of the field that stands for the one that reaches the list limit: a regular field,
/// so that whatever field it replaces (a pseudo-header, an `:authority` left out) the server
/// counts it without judging it, and refuses the stream with `431` (h2 keeps no field of a list
/// at its limit).
pub const FILLER: &[u8] = b"x-list-limit";

/// Append a filler field whose size (RFC 7541 §4.1) is `room`, or the smallest a filler has
/// when `room` is smaller.
fn encode_filler(out: &mut Vec<u8>, room: usize) {
    let len = room.saturating_sub(FILLER.len() + 32);
    out.push(0x00);
    hpack::encode_integer(out, 0x00, 7, FILLER.len());
    out.extend_from_slice(FILLER);
    hpack::encode_integer(out, 0x00, 7, len);
    out.resize(out.len() + len, b'-');
}

/// The payload length of the frame whose header `head` is.
fn frame_len(head: &[u8]) -> usize {
    head.first_chunk::<3>().map_or(0, |&[a, b, c]| usize::from(a) << 16 | usize::from(b) << 8 | usize::from(c))
}

/// Append a frame header.
pub fn frame_header(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream: u32) {
    // Frame lengths are 24 bits; ours are at most the frame size.
    let len = (len as u32).to_be_bytes();
    out.extend_from_slice(&[len[1], len[2], len[3], kind, flags]);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
}
