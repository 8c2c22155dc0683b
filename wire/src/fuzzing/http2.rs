//! The HTTP/2 request normaliser's fuzzing checks: any split, the output a valid HTTP/2 stream, requests kept.

#![allow(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used)]

use super::*;
use crate::http2::{FILLER, Http2Error, Limits, PREFACE, RequestNormaliser, Work, hpack};
use std::ops::ControlFlow;

/// Limits small enough that short inputs reach every one: frames cut at 40 bytes, a 256-byte
/// table, a 300-byte header list.
pub const SMALL_H2_LIMITS: Limits = Limits { max_frame_size: 40, header_table_size: 256, max_header_list_size: 300 };

/// What a connection carries, as the normaliser's checks compare it: frames that pass as they
/// are, and header blocks by what they decode to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum H2Event {
    Frame(Vec<u8>),
    Block { stream: u32, end_stream: bool, fields: Vec<(Vec<u8>, Vec<u8>, bool)> },
}

/// The normaliser fed `cuts` (growing prefix lengths of `stream`) as a reader would pass them
/// on: each piece's released bytes, then the output. The bytes passed on, and the error.
pub fn normalise(stream: &[u8], limits: Limits, cuts: &[usize]) -> (Vec<u8>, Option<Http2Error>) {
    let (out, e, _) = normalise_counted(stream, limits, cuts);
    (out, e)
}

/// [`normalise`], and the work the normaliser counted.
pub fn normalise_counted(stream: &[u8], limits: Limits, cuts: &[usize]) -> (Vec<u8>, Option<Http2Error>, Work) {
    let mut n = RequestNormaliser::new(limits);
    let mut out = Vec::new();
    let mut from = 0;
    for &c in cuts {
        let piece = &stream[from..c];
        from = c;
        match n.feed(piece) {
            Ok(k) => {
                assert!(k <= piece.len());
                out.extend_from_slice(&piece[..k]);
                out.extend_from_slice(n.output());
                let len = n.output().len();
                n.consume(len);
            }
            Err(e) => {
                assert_eq!(n.feed(b"more"), Err(e.clone()), "an error must stick");
                return (out, Some(e), n.work());
            }
        }
    }
    (out, None, n.work())
}

/// The normaliser read as the front end reads it: the output first, then a read of at most
/// what [`RequestNormaliser::read_hint`] asks for (`chunk` when it asks for nothing).
fn normalise_as_read(stream: &[u8], limits: Limits, chunk: usize) -> (Vec<u8>, Option<Http2Error>) {
    let mut n = RequestNormaliser::new(limits);
    let mut out = Vec::new();
    let mut rest = stream;
    // Bounded: each round takes at least one byte of the stream.
    while !rest.is_empty() {
        let want = n.read_hint().unwrap_or(chunk).max(1);
        assert!(n.read_hint().is_none_or(|h| h > 0), "a hint of nothing");
        let (piece, tail) = rest.split_at(want.min(rest.len()));
        rest = tail;
        match n.feed(piece) {
            Ok(k) => {
                out.extend_from_slice(&piece[..k]);
                out.extend_from_slice(n.output());
                let len = n.output().len();
                n.consume(len);
            }
            Err(e) => return (out, Some(e)),
        }
    }
    (out, None)
}

/// A frame: type, flags, stream, payload, the whole frame.
type H2Frame<'a> = (u8, u8, u32, &'a [u8], &'a [u8]);

/// The frames after the preface. A frame the bytes end inside is left out.
fn h2_frames(mut b: &[u8]) -> Vec<H2Frame<'_>> {
    let mut out = Vec::new();
    while b.len() >= 9 {
        let len = (usize::from(b[0]) << 16) | (usize::from(b[1]) << 8) | usize::from(b[2]);
        if b.len() < 9 + len {
            break;
        }
        let stream = u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & 0x7fff_ffff;
        out.push((b[3], b[4], stream, &b[9..9 + len], &b[..9 + len]));
        b = &b[9 + len..];
    }
    out
}

/// A field as the checks compare it: name, value, never indexed.
type Owned = (Vec<u8>, Vec<u8>, bool);

/// The events of a client's stream (after the preface): header blocks decoded with `decoder`
/// (`None` once one does not decode). `rule` is given each field with the list's size before
/// it (every field of the block so far) and the fields kept so far, pushes what to keep, and
/// breaks to end the list.
fn h2_events(
    after_preface: &[u8],
    decoder: &mut hpack::Decoder,
    mut rule: impl FnMut(&hpack::Field<'_>, usize, &mut Vec<Owned>) -> ControlFlow<()>,
) -> Option<Vec<H2Event>> {
    let mut events = Vec::new();
    let mut open: Option<(u32, bool, Vec<u8>)> = None;
    for (kind, flags, stream, payload, whole) in h2_frames(after_preface) {
        match kind {
            0x1 => {
                let mut p = payload;
                let mut pad = 0;
                if flags & 0x8 != 0 {
                    pad = usize::from(p[0]);
                    p = &p[1..];
                }
                if flags & 0x20 != 0 {
                    p = &p[5..];
                }
                open = Some((stream, flags & 0x1 != 0, p[..p.len() - pad].to_vec()));
            }
            0x9 => open.as_mut().expect("CONTINUATION in a block").2.extend_from_slice(payload),
            _ => {
                events.push(H2Event::Frame(whole.to_vec()));
                continue;
            }
        }
        if flags & 0x4 != 0 {
            let (stream, end_stream, block) = open.take().expect("a block");
            let mut fields = Vec::new();
            let mut listed = 0;
            decoder
                .decode(&block, |f, _| {
                    let flow = rule(&f, listed, &mut fields);
                    listed += f.size();
                    flow
                })
                .ok()?;
            events.push(H2Event::Block { stream, end_stream, fields });
        }
    }
    Some(events)
}

fn keep_all(f: &hpack::Field<'_>, _: usize, out: &mut Vec<Owned>) -> ControlFlow<()> {
    out.push((f.name.to_vec(), f.value.to_vec(), f.never_indexed));
    ControlFlow::Continue(())
}

/// The normaliser's rules, written again: every field counts against `limit`; the one that
/// reaches it is replaced by a filler that brings the kept fields to it, and ends the list; an
/// `:authority` that `http::uri::Authority` refuses is left out.
fn normaliser_rule(limit: usize) -> impl FnMut(&hpack::Field<'_>, usize, &mut Vec<Owned>) -> ControlFlow<()> {
    move |f, listed, out| {
        if listed + f.size() >= limit {
            let kept: usize = out.iter().map(|(n, v, _)| n.len() + v.len() + 32).sum();
            let len = (limit - kept).saturating_sub(FILLER.len() + 32);
            out.push((FILLER.to_vec(), vec![b'-'; len], false));
            return ControlFlow::Break(());
        }
        if f.name != b":authority" || http::uri::Authority::try_from(f.value).is_ok() {
            out.push((f.name.to_vec(), f.value.to_vec(), f.never_indexed));
        }
        ControlFlow::Continue(())
    }
}

/// The header blocks and other frames of a client's stream (after the preface) as a server
/// with the HPACK table `header_table_size` reads them; `None` if a block does not decode.
pub fn h2_sent(after_preface: &[u8], header_table_size: usize) -> Option<Vec<H2Event>> {
    h2_events(after_preface, &mut hpack::Decoder::new(header_table_size), keep_all)
}

/// The most list bytes the normaliser may decode for `work`: each block's fields up to the
/// list limit, the one that reaches it (at most a table entry, or a literal of the block:
/// Huffman decoding makes at most 8 octets of 5), nothing after it.
pub fn h2_work_bound(limits: Limits, work: Work) -> u64 {
    let per_block = (limits.max_header_list_size + limits.header_table_size + 32) as u64;
    work.blocks * per_block + work.received * 8 / 5
}

/// The normaliser on a client's stream (and on the preface followed by it, when it does not
/// start with one), at HTTP/2's default limits and at [`SMALL_H2_LIMITS`]:
///
/// - fed whole, in every split of [`splits`], and read as the front end reads it (honouring
///   `read_hint`), it passes on the same bytes or stops with the same error;
/// - what it passes on starts with the preface; its header frames fit the frame size, carry no
///   padding or priority, and decode with an empty table that they never add to; no
///   `:authority` in them is one `http::uri::Authority` refuses;
/// - without an error, what it passes on is what came, frame for frame, except that each
///   header block decodes to the client's fields minus each refused `:authority`, up to the
///   field that reaches the list limit, cut to reach it exactly.
///
/// Returns the error at the default limits of the input as it is.
pub fn check_http2_requests(data: &[u8]) -> Option<Http2Error> {
    let mut verdict = None;
    let with_preface: Vec<u8>;
    let mut inputs = vec![data];
    if !data.starts_with(PREFACE) {
        with_preface = [&PREFACE[..], data].concat();
        inputs.push(&with_preface);
    }
    for (i, stream) in inputs.into_iter().enumerate() {
        for limits in [Limits::default(), SMALL_H2_LIMITS] {
            let e = check_h2_stream(stream, limits);
            if i == 0 && limits == Limits::default() {
                verdict = e;
            }
        }
    }
    verdict
}

fn check_h2_stream(stream: &[u8], limits: Limits) -> Option<Http2Error> {
    let (out, error, work) = normalise_counted(stream, limits, &[stream.len()]);
    // The bound the module states: every field counts against the list limit, and a value is
    // judged once, when it arrives as a literal.
    assert!(work.decoded <= h2_work_bound(limits, work), "{work:?} decoded past the bound");
    assert!(work.judged * 5 <= work.received * 8, "{work:?}: values judged more than once");
    let whole = (out, error);
    for cuts in splits(stream) {
        let fed = normalise(stream, limits, &cuts);
        assert_eq!(fed.1, whole.1, "fed at {cuts:?}: another error");
        if whole.1.is_none() {
            assert!(fed.0 == whole.0, "fed at {cuts:?}: other bytes passed on");
        }
    }
    for chunk in [1, 7, 4096] {
        let read = normalise_as_read(stream, limits, chunk);
        assert_eq!(read.1, whole.1, "read {chunk} at a time: another error");
        if whole.1.is_none() {
            assert!(read.0 == whole.0, "read {chunk} at a time: other bytes passed on");
        }
    }
    let (out, error) = whole;
    let n = out.len().min(PREFACE.len());
    assert_eq!(out[..n], PREFACE[..n]);
    let after = out.get(PREFACE.len()..).unwrap_or_default();
    for (kind, flags, _, payload, _) in h2_frames(after) {
        if kind == 0x1 || kind == 0x9 {
            assert!(payload.len() <= limits.max_frame_size, "a header frame of {} bytes", payload.len());
            assert_eq!(flags & !0x5, 0, "flags {flags:#x} on a header frame");
        }
        assert_ne!(kind, 0x5, "PUSH_PROMISE passed on");
    }
    // What the server decodes: never a table entry, never a refused authority.
    let mut empty = hpack::Decoder::new(0);
    let passed = h2_events(after, &mut empty, |f, listed, out| {
        assert!(
            f.name != b":authority" || http::uri::Authority::try_from(f.value).is_ok(),
            "{:?} passed on",
            String::from_utf8_lossy(f.value)
        );
        keep_all(f, listed, out)
    })
    .expect("what the normaliser passes on decodes with an empty table");
    assert_eq!(empty.table(), (0, 0));
    if error.is_none() && stream.len() >= PREFACE.len() {
        // What the client sent, with the normaliser's rules applied by this oracle.
        let mut decoder = hpack::Decoder::new(limits.header_table_size);
        let rule = normaliser_rule(limits.max_header_list_size);
        let sent = h2_events(&stream[PREFACE.len()..], &mut decoder, rule).expect("blocks the normaliser took decode");
        assert_eq!(passed, sent, "what was passed on differs from what came");
    }
    error
}
