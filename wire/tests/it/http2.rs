//! The HTTP/2 request normaliser: real clients' first bytes (the fuzz corpus captures of gRPC core and tonic), padded, prioritised and continued header blocks, blocks framed again and lists cut at the limit, and every connection error, each fed in every split.

use proxy_wire::fuzzing::{self, H2Event, SMALL_H2_LIMITS, h2_sent, h2_work_bound, normalise, normalise_counted};
use proxy_wire::http2::hpack::{self, Field};
use proxy_wire::http2::{FILLER, Http2Error, Limits, MAX_BLOCK_FRAMES, PREFACE, RequestNormaliser, frame_header};
use std::path::{Path, PathBuf};

const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/http2_requests")
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    frame_header(&mut f, payload.len(), kind, flags, stream);
    f.extend_from_slice(payload);
    f
}

/// A header block of literals (with incremental indexing when `index`).
fn block(fields: &[(&[u8], &[u8])], index: bool) -> Vec<u8> {
    let mut b = Vec::new();
    for &(name, value) in fields {
        if index {
            b.push(0x40);
            for s in [name, value] {
                assert!(s.len() < 127);
                b.push(s.len() as u8);
                b.extend_from_slice(s);
            }
        } else {
            hpack::encode_literal(&mut b, &Field { name, value, never_indexed: false });
        }
    }
    b
}

const REQUEST: &[(&[u8], &[u8])] = &[
    (b":method", b"POST"),
    (b":scheme", b"http"),
    (b":path", b"/ProxyService/Proxy"),
    (b":authority", b"/run/kas/konnectivity.sock"),
    (b"content-type", b"application/grpc"),
    (b"te", b"trailers"),
];

fn owned(fields: &[(&[u8], &[u8])]) -> Vec<(Vec<u8>, Vec<u8>, bool)> {
    fields.iter().map(|(n, v)| (n.to_vec(), v.to_vec(), false)).collect()
}

fn without_authority(fields: &[(&[u8], &[u8])]) -> Vec<(Vec<u8>, Vec<u8>, bool)> {
    owned(&fields.iter().copied().filter(|(n, _)| *n != b":authority").collect::<Vec<_>>())
}

/// The whole stream through the normaliser (checked in every split), and what a server reads
/// of what it passes on.
fn through(stream: &[u8], limits: Limits) -> Vec<H2Event> {
    assert_eq!(fuzzing::check_http2_requests(stream), None);
    let (out, e) = normalise(stream, limits, &[stream.len()]);
    assert_eq!(e, None);
    h2_sent(&out[PREFACE.len()..], 0).expect("decodes with an empty table")
}

/// `block` as HEADERS and CONTINUATIONs of at most `max` bytes each.
fn header_frames(stream: u32, block: &[u8], max: usize) -> Vec<Vec<u8>> {
    let chunks: Vec<&[u8]> = block.chunks(max).collect();
    let last = chunks.len() - 1;
    let kind = |i| if i == 0 { HEADERS } else { CONTINUATION };
    chunks.iter().enumerate().map(|(i, c)| frame(kind(i), if i == last { END_HEADERS } else { 0 }, stream, c)).collect()
}

fn with_preface(frames: &[Vec<u8>]) -> Vec<u8> {
    let mut s = PREFACE.to_vec();
    for f in frames {
        s.extend_from_slice(f);
    }
    s
}

/// gRPC core's percent-encoded path, its raw path, an empty authority and grpc-go's raw path
/// (Huffman-coded; grpc-go 1.33.3 dialling the socket's path as konnectivity-client does,
/// captured by hand) are left out; the localhost one and tonic's stay; every other field and
/// frame is as it came.
#[test]
fn real_clients_lose_only_a_refused_authority() {
    for (name, dropped) in [
        ("grpcio_default.bin", true),
        ("grpcio_path.bin", true),
        ("grpcio_empty.bin", true),
        ("grpcio_localhost.bin", false),
        ("grpc_go_path.bin", true),
        ("tonic.bin", false),
    ] {
        let stream = std::fs::read(corpus().join(name)).unwrap();
        let sent = h2_sent(&stream[PREFACE.len()..], 4096).unwrap();
        let passed = through(&stream, Limits::default());
        let mut want = sent.clone();
        for e in &mut want {
            if let H2Event::Block { fields, .. } = e {
                fields.retain(|f| !(dropped && f.0 == b":authority"));
            }
        }
        assert_eq!(passed, want, "{name}");
        let blocks = sent.iter().filter(|e| matches!(e, H2Event::Block { .. })).count();
        assert!(blocks >= 1 && sent.len() > blocks, "{name}: {sent:?}");
        let mut n = RequestNormaliser::new(Limits::default());
        n.feed(&stream).unwrap();
        assert_eq!(n.dropped(), u64::from(dropped), "{name}");
    }
}

/// Padding and priority fields are dropped, CONTINUATIONs gathered into one frame, END_STREAM
/// kept; the frames around pass as they came.
#[test]
fn padded_prioritised_and_continued_blocks() {
    let b = block(REQUEST, true);
    let (one, rest) = b.split_at(10);
    let (two, three) = rest.split_at(20);
    let mut headers = vec![3u8];
    headers.extend_from_slice(&[0x80, 0, 0, 1, 200]);
    headers.extend_from_slice(one);
    headers.extend_from_slice(&[0; 3]);
    let ping = frame(0x6, 0, 0, &[7; 8]);
    let data = frame(0x0, END_STREAM, 1, b"hello");
    let stream = with_preface(&[
        frame(HEADERS, PADDED | PRIORITY | END_STREAM, 1, &headers),
        frame(CONTINUATION, 0, 1, two),
        frame(CONTINUATION, END_HEADERS, 1, three),
        ping.clone(),
        data.clone(),
    ]);
    let passed = through(&stream, Limits::default());
    assert_eq!(
        passed,
        [
            H2Event::Block { stream: 1, end_stream: true, fields: without_authority(REQUEST) },
            H2Event::Frame(ping),
            H2Event::Frame(data),
        ]
    );
    // The second request refers to the table the first one filled (te is entry 62, :method
    // 67): it decodes the same.
    let again = [0xc3, 0xc2, 0xc1, 0xc0, 0xbf, 0xbe];
    let stream2 = [stream.clone(), frame(HEADERS, END_HEADERS, 3, &again)].concat();
    let passed = through(&stream2, Limits::default());
    let fields: Vec<_> = without_authority(REQUEST);
    assert_eq!(passed[3], H2Event::Block { stream: 3, end_stream: false, fields });
}

/// A block larger than a frame once re-encoded (here: table references to a long value) goes
/// out as HEADERS and CONTINUATIONs of the frame size.
#[test]
fn blocks_are_framed_again_within_the_frame_size() {
    let long = [b'v'; 100];
    let mut b = block(&[(b":method", b"POST"), (b"x-long", &long)], true);
    // x-long three more times, by its index (62).
    b.extend_from_slice(&[0xbe, 0xbe, 0xbe]);
    let limits = Limits { max_frame_size: 64, header_table_size: 4096, max_header_list_size: 16_384 };
    let stream = with_preface(&header_frames(1, &b, 64));
    let (out, e) = normalise(&stream, limits, &[stream.len()]);
    assert_eq!(e, None);
    let mut rest = &out[PREFACE.len()..];
    let mut kinds = Vec::new();
    while rest.len() >= 9 {
        let len = usize::from(rest[1]) << 8 | usize::from(rest[2]);
        assert!(len <= 64, "a frame of {len}");
        kinds.push((rest[3], rest[4]));
        rest = &rest[9 + len..];
    }
    assert!(rest.is_empty());
    assert!(kinds.len() > 6, "{kinds:?}");
    assert_eq!(kinds[0], (HEADERS, 0));
    assert!(kinds[1..kinds.len() - 1].iter().all(|&k| k == (CONTINUATION, 0)), "{kinds:?}");
    assert_eq!(kinds[kinds.len() - 1], (CONTINUATION, END_HEADERS));
    let long: &[u8] = &long;
    let fields =
        owned(&[(b":method", b"POST"), (b"x-long", long), (b"x-long", long), (b"x-long", long), (b"x-long", long)]);
    assert_eq!(through(&stream, limits), [H2Event::Block { stream: 1, end_stream: false, fields }]);
}

/// A list that reaches the server's limit is passed on up to the field before the one that
/// reaches it, then a filler that brings it to the limit exactly; the fields after it still
/// enter the table, so the next block decodes.
#[test]
fn a_list_over_the_limit_ends_with_a_filler_at_it() {
    let limits = SMALL_H2_LIMITS;
    let big = [b'x'; 100];
    // 135 + 85, then 135 reaches 300: a filler of 80 (its name, 32 and 36 octets of value).
    let fields: Vec<(&[u8], &[u8])> = vec![(b"x-a", &big), (b"x-b", &big[..50]), (b"x-c", &big), (b"x-d", b"1")];
    let b = block(&fields, true);
    let mut frames = header_frames(1, &b, limits.max_frame_size);
    frames.push(frame(HEADERS, END_HEADERS, 3, &[0xbe]));
    let stream = with_preface(&frames);
    let passed = through(&stream, limits);
    let H2Event::Block { fields: got, .. } = &passed[0] else { panic!("{passed:?}") };
    let size: usize = got.iter().map(|f| f.0.len() + f.1.len() + 32).sum();
    assert_eq!(size, limits.max_header_list_size);
    assert_eq!(got.len(), 3);
    assert_eq!((&got[2].0[..], got[2].1.len()), (FILLER, 36));
    // x-d: 1 was indexed last, so it is entry 62.
    assert_eq!(passed[1], H2Event::Block { stream: 3, end_stream: false, fields: owned(&[(b"x-d", b"1")]) });
}

/// An `:authority` no URI authority, as long as the table takes (4,054 octets: an entry of
/// 4,096), put in the table by one request.
fn bad_authority_request() -> (Vec<u8>, Vec<u8>) {
    let mut value = vec![b'a'; 4053];
    value.push(b'/');
    assert!(http::uri::Authority::try_from(&value[..]).is_err());
    // POST, http and / from the static table; the authority with incremental indexing (its
    // name: static entry 1).
    let mut b = vec![0x83, 0x86, 0x84, 0x41];
    // 4,054 with a 7-bit prefix: 127, then 3,927 in two octets.
    b.extend_from_slice(&[0x7f, 0x80 | (3927 & 0x7f) as u8, (3927 >> 7) as u8]);
    b.extend_from_slice(&value);
    (b, value)
}

/// The attack on the normaliser: one request puts a 4 KiB `:authority` that is no URI authority
/// in the table, then blocks of 64 KiB (four full frames) refer to it with one octet each. Every
/// reference counts against the list: the fourth reaches the 16 KiB limit, so each block is
/// passed on as a list at the limit (the server refuses the stream, `431`), the authority was
/// judged once in all, and what was decoded is what the bound allows, less than what was sent.
#[test]
fn references_to_a_refused_authority_count_against_the_list_and_are_judged_once() {
    let limits = Limits::default();
    let (request, value) = bad_authority_request();
    let mut frames = vec![frame(HEADERS, END_HEADERS | END_STREAM, 1, &request)];
    let refs = vec![0xbe; 4 * limits.max_frame_size];
    let attacks = 4u32;
    for i in 0..attacks {
        frames.extend(header_frames(3 + 2 * i, &refs, limits.max_frame_size));
    }
    let stream = with_preface(&frames);
    let (out, e, work) = normalise_counted(&stream, limits, &[stream.len()]);
    assert_eq!(e, None);
    let passed = h2_sent(&out[PREFACE.len()..], 0).expect("decodes with an empty table");
    assert_eq!(passed.len(), 1 + attacks as usize);
    let request: &[(&[u8], &[u8])] = &[(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/")];
    assert_eq!(passed[0], H2Event::Block { stream: 1, end_stream: true, fields: owned(request) });
    // Each list is a filler of the whole limit: (stream, name, value length, list size).
    let lists: Vec<_> = passed[1..]
        .iter()
        .map(|p| {
            let H2Event::Block { stream, fields, .. } = p else { panic!("a frame passed on") };
            let size: usize = fields.iter().map(|f| f.0.len() + f.1.len() + 32).sum();
            (
                *stream,
                fields.iter().map(|f| (String::from_utf8_lossy(&f.0).into_owned(), f.1.len())).collect::<Vec<_>>(),
                size,
            )
        })
        .collect();
    let filler =
        || vec![(String::from_utf8_lossy(FILLER).into_owned(), limits.max_header_list_size - FILLER.len() - 32)];
    let want: Vec<_> = (0..attacks).map(|i| (3 + 2 * i, filler(), limits.max_header_list_size)).collect();
    assert_eq!(lists, want);
    // Judged once: when it came as a literal.
    assert_eq!(work.judged, value.len() as u64);
    // The request's fields, then four references per block.
    let entry = (10 + value.len() + 32) as u64;
    assert_eq!(entry, 4096);
    assert_eq!(work.decoded, 43 + 43 + 38 + entry + u64::from(attacks) * 4 * entry);
    assert!(work.decoded <= h2_work_bound(limits, work) && work.decoded < work.received, "{work:?}");
}

/// Every connection error, fed whole and in every split.
#[test]
fn connection_errors() {
    let ok = block(REQUEST, false);
    let big = vec![0u8; 16_384];
    let mut too_large = vec![frame(HEADERS, 0, 1, &big)];
    too_large.extend((0..4).map(|_| frame(CONTINUATION, 0, 1, &big)));
    let mut too_many = vec![frame(HEADERS, 0, 1, &ok)];
    too_many.extend((0..MAX_BLOCK_FRAMES).map(|_| frame(CONTINUATION, 0, 1, &[])));
    let cases: Vec<(Vec<u8>, Http2Error)> = vec![
        (b"GET / HTTP/1.1\r\n\r\n".to_vec(), Http2Error::NotPreface),
        (with_preface(&[frame(0x5, END_HEADERS, 1, &[0, 0, 0, 2])]), Http2Error::PushPromise),
        (with_preface(&[frame(HEADERS, END_HEADERS, 0, &ok)]), Http2Error::StreamZero),
        (with_preface(&[frame(CONTINUATION, END_HEADERS, 1, &ok)]), Http2Error::StrayContinuation),
        (with_preface(&[frame(HEADERS, 0, 1, &ok), frame(0x0, 0, 1, b"x")]), Http2Error::ExpectedContinuation(0)),
        (
            with_preface(&[frame(HEADERS, 0, 1, &ok), frame(CONTINUATION, END_HEADERS, 3, &[])]),
            Http2Error::ContinuationStream(3, 1),
        ),
        (with_preface(&[frame(HEADERS, END_HEADERS | PADDED, 1, &[5, 0x82, 0, 0])]), Http2Error::BadPadding),
        (with_preface(&[frame(HEADERS, END_HEADERS | PADDED, 1, &[])]), Http2Error::BadPadding),
        (with_preface(&[frame(HEADERS, END_HEADERS | PRIORITY, 1, &[0, 0, 0])]), Http2Error::BadPadding),
        (with_preface(&[frame(HEADERS, END_HEADERS, 1, &[0; 16_385])]), Http2Error::FrameTooLarge(16_385, 16_384)),
        (with_preface(&too_large), Http2Error::BlockTooLarge(4 * 16_384)),
        (with_preface(&too_many), Http2Error::TooManyFrames),
        (with_preface(&[frame(HEADERS, END_HEADERS, 1, &[0x80])]), Http2Error::Hpack(hpack::HpackError::BadIndex(0))),
    ];
    for (stream, want) in cases {
        assert_eq!(fuzzing::check_http2_requests(&stream), Some(want.clone()), "{want}");
    }
}

/// DATA passes in place, however it is cut; a partial frame header, or a header frame, is
/// gathered, and the normaliser asks for exactly what completes it.
#[test]
fn data_passes_in_place_and_hints_ask_for_the_rest_of_a_frame() {
    let mut n = RequestNormaliser::new(Limits::default());
    let data = frame(0x0, 0, 1, &[9; 1000]);
    let stream = with_preface(std::slice::from_ref(&data));
    assert_eq!(n.feed(&stream[..500]), Ok(500));
    assert_eq!(n.feed(&stream[500..]), Ok(stream.len() - 500));
    assert!(n.output().is_empty());
    assert_eq!(n.read_hint(), None);
    // 4 bytes of a frame header: held, 5 more wanted.
    let h = frame(HEADERS, END_HEADERS, 3, &block(REQUEST, false));
    assert_eq!(n.feed(&h[..4]), Ok(0));
    assert_eq!(n.read_hint(), Some(5));
    assert_eq!(n.feed(&h[4..9]), Ok(0));
    assert_eq!(n.read_hint(), Some(h.len() - 9));
    assert_eq!(n.feed(&h[9..]), Ok(0));
    assert!(!n.output().is_empty());
    let len = n.output().len();
    n.consume(len);
    assert_eq!(n.read_hint(), None);
    // A read that ends with a frame header in it: released up to it.
    let two = [data.clone(), data[..4].to_vec()].concat();
    assert_eq!(n.feed(&two), Ok(data.len()));
    assert_eq!(n.read_hint(), Some(5));
}

/// The corpus mutated (bytes replaced, flipped, inserted, removed, the input cut), each
/// mutant through every check of the fuzz target: no panic, the same result in any split.
#[test]
fn mutated_captures_keep_every_check() {
    let mut corpus: Vec<Vec<u8>> =
        std::fs::read_dir(corpus()).unwrap().map(|e| std::fs::read(e.unwrap().path()).unwrap()).collect();
    corpus.sort();
    assert!(corpus.len() >= 5);
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut below = |n: usize| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % n.max(1) as u64) as usize
    };
    let interesting = [0x00, 0x01, 0x04, 0x05, 0x08, 0x09, 0x20, 0x3f, 0x40, 0x7f, 0x80, 0xbe, 0xff];
    let mut errors = 0;
    for _ in 0..2_000 {
        let mut b = corpus[below(corpus.len())].clone();
        for _ in 0..=below(3) {
            // Past the preface, mostly: a broken preface ends the check at once.
            let i = PREFACE.len() + below(b.len() - PREFACE.len());
            match below(5) {
                0 => b[i] = interesting[below(interesting.len())],
                1 => b[i] ^= 1 << below(8),
                2 => b.insert(i, interesting[below(interesting.len())]),
                3 if b.len() > PREFACE.len() + 1 => {
                    b.remove(i);
                }
                _ => b.truncate(i.max(PREFACE.len() + 1)),
            }
        }
        errors += usize::from(fuzzing::check_http2_requests(&b).is_some());
    }
    // Both sides of the checks were reached.
    assert!(errors > 100 && errors < 1_900, "{errors} errors in 2,000");
}

/// Hand-made seeds for the `http2_requests` fuzz target (the connection errors' inputs and the
/// constructed blocks above are among them).
/// `cargo test -p proxy-wire --test it -- --ignored write_http2_seeds`
#[test]
#[ignore = "writes wire/fuzz/corpus/http2_requests/"]
fn write_http2_seeds() {
    let b = block(REQUEST, true);
    let mut padded = vec![2u8, 0x80, 0, 0, 1, 16];
    padded.extend_from_slice(&b[..8]);
    padded.extend_from_slice(&[0, 0]);
    let seeds = [
        (
            "padded_priority_continued.bin",
            with_preface(&[
                frame(HEADERS, PADDED | PRIORITY, 1, &padded),
                frame(CONTINUATION, END_HEADERS, 1, &b[8..]),
                frame(0x0, END_STREAM, 1, b"hi"),
                frame(HEADERS, END_HEADERS | END_STREAM, 3, &[0xc3, 0xc2, 0xc1, 0xc0, 0xbf, 0xbe]),
            ]),
        ),
        (
            "size_update_then_huffman.bin",
            with_preface(&[frame(
                HEADERS,
                END_HEADERS,
                1,
                &[
                    0x3f, 0x61, 0x82, 0x86, 0x41, 0x8c, 0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab, 0x90,
                    0xf4, 0xff,
                ],
            )]),
        ),
        ("push_promise.bin", with_preface(&[frame(0x5, END_HEADERS, 1, &[0, 0, 0, 2, 0x82])])),
        ("interrupted_block.bin", with_preface(&[frame(HEADERS, 0, 1, &b[..5]), frame(0x8, 0, 0, &[0, 0, 1, 0])])),
        // The attack on the normaliser's work: a refused `:authority` as large as the table
        // takes, then blocks of one-octet references to it (eight reach the list limit twice
        // over; two stay under it), one of them continued.
        ("referenced_bad_authority.bin", {
            let (request, _) = bad_authority_request();
            with_preface(&[
                frame(HEADERS, END_HEADERS | END_STREAM, 1, &request),
                frame(HEADERS, END_HEADERS, 3, &[0xbe; 8]),
                frame(HEADERS, 0, 5, &[0xbe]),
                frame(CONTINUATION, END_HEADERS, 5, &[0xbe]),
            ])
        }),
        // The same at the small limits (a 256-octet table, a 300-octet list).
        ("referenced_bad_authority_small.bin", {
            let mut request = vec![0x83, 0x86, 0x84, 0x41, 0x7f, 200 - 127];
            request.extend(std::iter::repeat_n(b'a', 199));
            request.push(b'/');
            with_preface(&[
                frame(HEADERS, END_HEADERS | END_STREAM, 1, &request),
                frame(HEADERS, END_HEADERS, 3, &[0xbe; 4]),
                frame(HEADERS, END_HEADERS, 5, &[0x82, 0xbe]),
            ])
        }),
    ];
    for (name, bytes) in seeds {
        std::fs::write(corpus().join(name), bytes).unwrap();
    }
}
