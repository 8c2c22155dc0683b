//! Tests for the ClientHello parser: real captured hellos (tests/fixtures), targeted malformations, caps, non-TLS input, fuzzing.
// That rustls itself accepts the fixtures is checked in the tests/ crate (client_hello_rustls.rs):
// this crate runs no TLS session, not even for tests.

#[path = "../support/refragment.rs"]
mod refragment;

use proxy_wire::client_hello::{
    ALERT_DECODE_ERROR, ALERT_HANDSHAKE_FAILURE, ALERT_INTERNAL_ERROR, ALERT_UNRECOGNIZED_NAME, ClientHelloInfo,
    DEFAULT_MAX_LEN, HelloError, HelloParser, Status, alert_record, parse_handshake_message,
};

const RUSTLS_PQ: &[u8] = include_bytes!("../fixtures/client_hello/rustls_pq.bin");
const RUSTLS_FRAGMENTED: &[u8] = include_bytes!("../fixtures/client_hello/rustls_fragmented.bin");
const OPENSSL: &[u8] = include_bytes!("../fixtures/client_hello/openssl.bin");
const CURL: &[u8] = include_bytes!("../fixtures/client_hello/curl.bin");
const BIG: &[u8] = include_bytes!("../fixtures/client_hello/big.bin");
const MULTI_RECORD: &[u8] = include_bytes!("../fixtures/client_hello/multi_record.bin");
const NO_SNI: &[u8] = include_bytes!("../fixtures/client_hello/no_sni.bin");

const MAX: usize = DEFAULT_MAX_LEN;

struct Fixture {
    name: &'static str,
    bytes: &'static [u8],
    expected: ClientHelloInfo,
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn info(sni: Option<&str>, alpn: Vec<String>, len: usize, records: usize) -> ClientHelloInfo {
    ClientHelloInfo {
        sni: sni.map(str::to_string),
        alpn,
        legacy_version: 0x0303,
        supported_versions_tls13: true,
        len,
        records,
    }
}

fn fixtures() -> Vec<Fixture> {
    let mut big_alpn = strings(&["h2", "http/1.1"]);
    big_alpn.extend((0..100).map(|i| format!("seedgate-big-alpn-proto-{i:03}")));
    let h2_h1 = || strings(&["h2", "http/1.1"]);
    vec![
        Fixture {
            name: "rustls_pq",
            bytes: RUSTLS_PQ,
            expected: info(Some("api.shoot-a.example.com"), h2_h1(), RUSTLS_PQ.len(), 1),
        },
        Fixture {
            name: "rustls_fragmented",
            bytes: RUSTLS_FRAGMENTED,
            expected: info(Some("api.shoot-a.example.com"), strings(&["h2"]), RUSTLS_FRAGMENTED.len(), 3),
        },
        Fixture {
            name: "openssl",
            bytes: OPENSSL,
            expected: info(Some("api.shoot-b.example.com"), strings(&["h2"]), OPENSSL.len(), 1),
        },
        Fixture { name: "curl", bytes: CURL, expected: info(Some("api.example.com"), h2_h1(), CURL.len(), 1) },
        Fixture { name: "big", bytes: BIG, expected: info(Some("api.shoot-b.example.com"), big_alpn, BIG.len(), 1) },
        Fixture {
            name: "multi_record",
            bytes: MULTI_RECORD,
            expected: info(Some("api.shoot-a.example.com"), h2_h1(), MULTI_RECORD.len(), 4),
        },
        Fixture { name: "no_sni", bytes: NO_SNI, expected: info(None, vec![], NO_SNI.len(), 1) },
    ]
}

fn parse_once(buf: &[u8], max: usize) -> Result<Status, HelloError> {
    HelloParser::new(max).parse(buf)
}

fn complete(buf: &[u8]) -> ClientHelloInfo {
    match parse_once(buf, MAX) {
        Ok(Status::Complete(i)) => i,
        other => panic!("expected Complete, got {other:?}"),
    }
}

fn malformed(buf: &[u8]) -> &'static str {
    match parse_once(buf, MAX) {
        Err(HelloError::Malformed(why)) => why,
        other => panic!("expected Malformed, got {other:?}"),
    }
}

// ---------------------------------------------------------------- fixtures

#[test]
fn fixtures_are_what_the_readme_says() {
    for f in fixtures() {
        // Independent framing check: each fixture is exactly one complete hello.
        assert_eq!(refragment::first_handshake_len(f.bytes), Some(f.bytes.len()), "{}", f.name);
        assert_eq!(refragment::split_records(f.bytes).len(), f.expected.records, "{}", f.name);
    }
    assert!(RUSTLS_PQ.len() > 1024, "rustls hello should carry an ML-KEM key share");
    // X25519MLKEM768 (0x11ec) key share of 1216 bytes: group id followed by its length.
    assert!(RUSTLS_PQ.windows(4).any(|w| w == [0x11, 0xec, 0x04, 0xc0]));
    assert!(BIG.len() > 2048);
    assert!(refragment::split_records(MULTI_RECORD).len() >= 3);
}

#[test]
fn fixtures_parse_whole() {
    for f in fixtures() {
        assert_eq!(parse_once(f.bytes, MAX), Ok(Status::Complete(f.expected.clone())), "{}", f.name);
    }
}

#[test]
fn fixtures_split_at_every_point() {
    for f in fixtures() {
        for i in 0..=f.bytes.len() {
            let mut p = HelloParser::new(MAX);
            let first = p.parse(&f.bytes[..i]);
            if i < f.bytes.len() {
                assert_eq!(first, Ok(Status::Incomplete), "{} prefix {i}", f.name);
            }
            assert_eq!(p.parse(f.bytes), Ok(Status::Complete(f.expected.clone())), "{} split {i}", f.name);
        }
    }
}

/// The handshake stream without TLS record framing, as QUIC's CRYPTO frames carry it: every
/// prefix is incomplete, the whole gives what the record reader gives (less the framing).
#[test]
fn fixtures_without_records_at_every_split() {
    for f in fixtures() {
        let stream: Vec<u8> = refragment::split_records(f.bytes).into_iter().flat_map(|(_, _, body)| body).collect();
        for cut in 0..stream.len() {
            assert_eq!(parse_handshake_message(&stream[..cut], MAX), Ok(Status::Incomplete), "{} at {cut}", f.name);
        }
        let want = ClientHelloInfo { len: stream.len(), records: 0, ..f.expected.clone() };
        assert_eq!(parse_handshake_message(&stream, MAX), Ok(Status::Complete(want)), "{}", f.name);
        assert_eq!(parse_handshake_message(&stream, stream.len() - 1), Err(HelloError::TooLarge), "{}", f.name);
    }
    assert_eq!(parse_handshake_message(&[2, 0, 0, 1], MAX), Err(HelloError::Malformed("handshake type")));
}

#[test]
fn fixtures_byte_by_byte() {
    for f in fixtures() {
        let mut p = HelloParser::new(MAX);
        for i in 0..f.bytes.len() {
            assert_eq!(p.parse(&f.bytes[..i]), Ok(Status::Incomplete), "{} at {i}", f.name);
        }
        assert_eq!(p.parse(f.bytes), Ok(Status::Complete(f.expected.clone())), "{}", f.name);
        // The verdict is sticky.
        assert_eq!(p.parse(f.bytes), Ok(Status::Complete(f.expected.clone())), "{}", f.name);
    }
}

#[test]
fn trailing_records_after_hello_are_not_part_of_it() {
    for f in fixtures() {
        let mut buf = f.bytes.to_vec();
        buf.extend_from_slice(&[0x14, 0x03, 0x03, 0x00, 0x01, 0x01]); // change_cipher_spec
        buf.extend_from_slice(&[0x17, 0x03, 0x03, 0x00, 0x03, 1, 2, 3]); // early data
        assert_eq!(parse_once(&buf, MAX), Ok(Status::Complete(f.expected.clone())), "{}", f.name);
        let mut p = HelloParser::new(MAX);
        let mut last = Ok(Status::Incomplete);
        for i in 0..=buf.len() {
            last = p.parse(&buf[..i]);
        }
        assert_eq!(last, Ok(Status::Complete(f.expected)), "{}", f.name);
    }
}

#[test]
fn cap_exactly_at_fixture_size() {
    for f in fixtures() {
        let n = f.bytes.len();
        assert!(matches!(parse_once(f.bytes, n), Ok(Status::Complete(_))), "{}", f.name);
        assert_eq!(parse_once(f.bytes, n - 1), Err(HelloError::TooLarge), "{}", f.name);
        // TooLarge must be known before the last record's body arrives.
        let last_body_start = n - refragment::split_records(f.bytes).last().unwrap().2.len();
        let first_err = (0..=n).find(|&i| parse_once(&f.bytes[..i], n - 1).is_err()).unwrap();
        assert!(first_err <= last_body_start, "{}: TooLarge only at {first_err}", f.name);
    }
}

/// The same handshake bytes re-framed into other record sizes (down to one byte) read the same.
#[test]
fn refragmented_fixtures_parse_the_same() {
    for f in fixtures() {
        for sizes in [&[4, usize::MAX][..], &[2, 100, usize::MAX], &[1, 1, 1, usize::MAX]] {
            let reframed = refragment::refragment(f.bytes, sizes);
            let want = ClientHelloInfo { len: reframed.len(), records: sizes.len(), ..f.expected.clone() };
            assert_eq!(complete(&reframed), want, "{} {sizes:?}", f.name);
        }
    }
}

#[test]
fn uppercase_sni_in_real_hello_is_lowered() {
    let mut buf = RUSTLS_PQ.to_vec();
    let at = buf.windows(23).position(|w| w == b"api.shoot-a.example.com").unwrap();
    buf[at..at + 23].copy_from_slice(b"API.Shoot-A.Example.COM");
    assert_eq!(complete(&buf).sni.as_deref(), Some("api.shoot-a.example.com"));
}

// ---------------------------------------------------------------- synthetic hellos

/// Offsets inside the ClientHello body built by `body_with`.
const SID_LEN: usize = 34;
const SUITES_LEN: usize = SID_LEN + 1 + 32;
const COMP_LEN: usize = SUITES_LEN + 2 + 4;
const EXTS_LEN: usize = COMP_LEN + 1 + 1;

fn ext(ty: u16, data: &[u8]) -> Vec<u8> {
    let mut v = ty.to_be_bytes().to_vec();
    v.extend_from_slice(&(data.len() as u16).to_be_bytes());
    v.extend_from_slice(data);
    v
}

fn vec16(data: &[u8]) -> Vec<u8> {
    let mut v = (data.len() as u16).to_be_bytes().to_vec();
    v.extend_from_slice(data);
    v
}

fn sni_ext(entries: &[(u8, &[u8])]) -> Vec<u8> {
    let mut list = Vec::new();
    for (ty, name) in entries {
        list.push(*ty);
        list.extend(vec16(name));
    }
    ext(0, &vec16(&list))
}

fn host(name: &[u8]) -> Vec<u8> {
    sni_ext(&[(0, name)])
}

fn alpn_ext(protos: &[&[u8]]) -> Vec<u8> {
    let mut list = Vec::new();
    for p in protos {
        list.push(p.len() as u8);
        list.extend_from_slice(p);
    }
    ext(16, &vec16(&list))
}

fn versions_ext(v: &[u16]) -> Vec<u8> {
    let mut data = vec![(v.len() * 2) as u8];
    v.iter().for_each(|x| data.extend_from_slice(&x.to_be_bytes()));
    ext(43, &data)
}

/// ClientHello body with a 32-byte session id, two suites, null compression and `exts` (None: no extensions block).
fn body_with(exts: Option<&[u8]>) -> Vec<u8> {
    let mut b = vec![0x03, 0x03];
    b.extend([0x11; 32]);
    b.push(32);
    b.extend([0x22; 32]);
    b.extend([0x00, 0x04, 0x13, 0x01, 0x13, 0x02]);
    b.extend([0x01, 0x00]);
    if let Some(e) = exts {
        b.extend(vec16(e));
    }
    b
}

fn handshake(body: &[u8]) -> Vec<u8> {
    let mut h = vec![1];
    h.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    h.extend_from_slice(body);
    h
}

/// Frames handshake bytes into records of at most `chunk` bytes.
fn records(hs: &[u8], chunk: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for c in hs.chunks(chunk) {
        out.extend([0x16, 0x03, 0x01]);
        out.extend((c.len() as u16).to_be_bytes());
        out.extend_from_slice(c);
    }
    out
}

/// Handshake message of exactly `total` bytes: `exts` followed by a padding extension (21) that fills the rest.
fn padded_handshake(total: usize, exts: &[u8]) -> Vec<u8> {
    let base = handshake(&body_with(Some(&[exts, &ext(21, &[])].concat()))).len();
    let hs = handshake(&body_with(Some(&[exts, &ext(21, &vec![0; total - base])].concat())));
    assert_eq!(hs.len(), total);
    hs
}

fn wire(body: &[u8]) -> Vec<u8> {
    records(&handshake(body), 16384)
}

fn standard_exts() -> Vec<u8> {
    [host(b"api.example.com"), alpn_ext(&[b"h2", b"http/1.1"]), versions_ext(&[0x0304, 0x0303])].concat()
}

fn wire_exts(exts: &[u8]) -> Vec<u8> {
    wire(&body_with(Some(exts)))
}

#[test]
fn synthetic_baseline() {
    let w = wire_exts(&standard_exts());
    let i = complete(&w);
    assert_eq!(i.sni.as_deref(), Some("api.example.com"));
    assert_eq!(i.alpn, strings(&["h2", "http/1.1"]));
    assert!(i.supported_versions_tls13);
    assert_eq!((i.len, i.records, i.legacy_version), (w.len(), 1, 0x0303));
}

#[test]
fn sni_case_and_trailing_dot() {
    let i = complete(&wire_exts(&host(b"API.Shoot-A.Example.COM.")));
    assert_eq!(i.sni.as_deref(), Some("api.shoot-a.example.com"));
    assert_eq!(complete(&wire_exts(&host(b"_acme.x_y.Example"))).sni.as_deref(), Some("_acme.x_y.example"));
    assert_eq!(complete(&wire_exts(&host(b"10.0.0.1"))).sni.as_deref(), Some("10.0.0.1"));
    let long = [b"a".repeat(63), b"b".repeat(63), b"c".repeat(63), b"d".repeat(63)].join(&b'.');
    assert_eq!(long.len(), 255);
    assert_eq!(complete(&wire_exts(&host(&long))).sni.map(|s| s.len()), Some(255));
}

#[test]
fn bad_hostnames() {
    for name in [
        &b"exa mple.com"[..],
        b"a*b.example.com",
        "b\u{fc}cher.example".as_bytes(),
        b"a/b",
        b"example.com:443",
        b"a\0b",
        b".",
        b"..",
        b"a..b",
        b".a",
        b"a..",
        &[b'a'; 256],
    ] {
        assert_eq!(malformed(&wire_exts(&host(name))), "bad hostname", "{name:?}");
    }
    assert_eq!(malformed(&wire_exts(&host(b""))), "empty hostname");
}

#[test]
fn server_name_structure() {
    assert_eq!(malformed(&wire_exts(&ext(0, &vec16(&[])))), "sni empty list");
    assert_eq!(malformed(&wire_exts(&ext(0, &[]))), "sni list length");
    assert_eq!(malformed(&wire_exts(&sni_ext(&[(1, b"example.com")]))), "sni name type");
    assert_eq!(malformed(&wire_exts(&sni_ext(&[(0, b"a.com"), (1, b"b.com")]))), "sni name type");
    assert_eq!(malformed(&wire_exts(&sni_ext(&[(0, b"a.com"), (0, b"b.com")]))), "duplicate sni host name");
    // List length says more than the extension holds, and less.
    let mut over = host(b"a.com");
    over[5] += 1;
    assert_eq!(malformed(&wire_exts(&over)), "sni list length");
    let mut under = host(b"a.com");
    under[5] -= 1;
    assert_eq!(malformed(&wire_exts(&under)), "sni list length");
    // Entry name length overruns the list.
    let mut entry = host(b"a.com");
    entry[8] += 1;
    assert_eq!(malformed(&wire_exts(&entry)), "sni entry");
}

#[test]
fn alpn_structure() {
    assert_eq!(malformed(&wire_exts(&ext(16, &vec16(&[])))), "alpn empty list");
    assert_eq!(malformed(&wire_exts(&ext(16, &vec16(&[2, b'h', b'2', 0])))), "alpn empty protocol");
    assert_eq!(malformed(&wire_exts(&ext(16, &vec16(&[3, b'h', b'2'])))), "alpn overrun");
    assert_eq!(malformed(&wire_exts(&ext(16, &[0, 9, 2, b'h', b'2']))), "alpn list length");
    // Non-UTF-8 names are kept, lossily.
    let i = complete(&wire_exts(&alpn_ext(&[&[0xff, b'x'], b"h2"])));
    assert_eq!(i.alpn, strings(&["\u{fffd}x", "h2"]));
}

#[test]
fn supported_versions_structure() {
    assert!(!complete(&wire_exts(&versions_ext(&[0x0303]))).supported_versions_tls13);
    assert!(complete(&wire_exts(&versions_ext(&[0x0a0a, 0x0304]))).supported_versions_tls13);
    assert_eq!(malformed(&wire_exts(&ext(43, &[3, 3, 4, 3]))), "supported versions length");
    assert_eq!(malformed(&wire_exts(&ext(43, &[0]))), "supported versions length");
    assert_eq!(malformed(&wire_exts(&ext(43, &[4, 3, 4]))), "supported versions length");
}

#[test]
fn extension_framing() {
    assert_eq!(malformed(&wire_exts(&[host(b"a.com"), host(b"b.com")].concat())), "duplicate extension");
    assert_eq!(
        malformed(&wire_exts(&[ext(0xff01, &[0]), alpn_ext(&[b"h2"]), ext(0xff01, &[0])].concat())),
        "duplicate extension"
    );
    // An extension whose length runs past the block.
    let mut over = standard_exts();
    over.extend([0x00, 0x15, 0x00, 0x09, 0, 0]);
    assert_eq!(malformed(&wire_exts(&over)), "extension overrun");
    // A dangling partial extension header.
    let mut dangling = standard_exts();
    dangling.push(0x00);
    assert_eq!(malformed(&wire_exts(&dangling)), "extension overrun");
    // No extensions at all, and an empty block, are both fine.
    let none = complete(&wire(&body_with(None)));
    assert_eq!((none.sni, none.alpn, none.supported_versions_tls13), (None, vec![], false));
    assert_eq!(complete(&wire_exts(&[])).sni, None);
}

/// Each length field in the body, made too long, too short, or invalid.
#[test]
fn body_length_fields() {
    let good = body_with(Some(&standard_exts()));
    let patch = |at: usize, v: &[u8]| {
        let mut b = good.clone();
        b[at..at + v.len()].copy_from_slice(v);
        malformed(&wire(&b))
    };
    assert_eq!(patch(SID_LEN, &[33]), "session id length");
    assert_eq!(patch(SID_LEN, &[0xff]), "session id length");
    assert_eq!(patch(SUITES_LEN, &[0, 3]), "cipher suites length");
    assert_eq!(patch(SUITES_LEN, &[0, 0]), "cipher suites length");
    assert_eq!(patch(SUITES_LEN, &[0xff, 0xff]), "cipher suites length");
    assert_eq!(patch(COMP_LEN, &[0]), "compression methods");
    assert_eq!(patch(COMP_LEN, &[0xff]), "compression methods");
    let exts_len = u16::from_be_bytes([good[EXTS_LEN], good[EXTS_LEN + 1]]);
    assert_eq!(patch(EXTS_LEN, &(exts_len + 1).to_be_bytes()), "extensions length");
    assert_eq!(patch(EXTS_LEN, &(exts_len - 1).to_be_bytes()), "extensions length");
    assert_eq!(patch(0, &[0x02, 0x00]), "client version");
    // Bodies cut short inside the fixed fields.
    for (cut, why) in [
        (1, "client version"),
        (20, "random"),
        (SID_LEN, "session id length"),
        (SUITES_LEN + 3, "cipher suites length"),
    ] {
        assert_eq!(malformed(&wire(&good[..cut])), why, "cut at {cut}");
    }
}

#[test]
fn handshake_and_record_length_fields() {
    let w = wire_exts(&standard_exts());
    // Handshake length one short: the body loses its last byte.
    let mut short = w.clone();
    short[8] -= 1;
    assert!(matches!(parse_once(&short, MAX), Err(HelloError::Malformed(_))));
    // Handshake length one long: waits for another record, then finds a stray byte.
    let mut long = w.clone();
    long[8] += 1;
    assert_eq!(parse_once(&long, MAX), Ok(Status::Incomplete));
    long.extend([0x16, 0x03, 0x03, 0x00, 0x01, 0x00]);
    assert_eq!(malformed(&long), "extensions length");
    // Record length zero, above 2^14, and longer than what arrived.
    let mut zero = w.clone();
    zero[3..5].copy_from_slice(&[0, 0]);
    assert_eq!(malformed(&zero[..5]), "record length");
    let mut huge = w.clone();
    huge[3..5].copy_from_slice(&16385u16.to_be_bytes());
    assert_eq!(parse_once(&huge[..5], 20_000), Err(HelloError::Malformed("record length")));
    let mut more = w.clone();
    more[4] += 1;
    assert_eq!(parse_once(&more, MAX), Ok(Status::Incomplete));
    // Wrong handshake type is reported on its first byte.
    let mut ty = w.clone();
    ty[5] = 2;
    assert_eq!(parse_once(&ty[..5], MAX), Ok(Status::Incomplete));
    assert_eq!(malformed(&ty[..6]), "handshake type");
    // Record minor version above TLS 1.3's 0x0304.
    let mut minor = w.clone();
    minor[2] = 5;
    assert_eq!(malformed(&minor[..3]), "record version");
    // Extra handshake bytes after the hello inside its last record: complete once that record is whole.
    let mut hs = handshake(&body_with(Some(&standard_exts())));
    let hello_len = hs.len();
    hs.extend([20, 0, 0, 1, 0]);
    let tail = records(&hs, 16384);
    let mut p = HelloParser::new(MAX);
    assert_eq!(p.parse(&tail[..5 + hello_len]), Ok(Status::Incomplete));
    let i = match p.parse(&tail) {
        Ok(Status::Complete(i)) => i,
        other => panic!("{other:?}"),
    };
    assert_eq!(i.len, tail.len());
}

#[test]
fn interleaved_records() {
    let recs = refragment::split_records(MULTI_RECORD);
    let second = 5 + recs[0].2.len();
    let mut ty = MULTI_RECORD.to_vec();
    ty[second] = 0x17;
    assert_eq!(parse_once(&ty[..second], MAX), Ok(Status::Incomplete));
    assert_eq!(malformed(&ty[..second + 1]), "interleaved record type");
    let mut alert = MULTI_RECORD.to_vec();
    alert[second] = 0x15;
    assert_eq!(malformed(&alert), "interleaved record type");
    let mut ver = MULTI_RECORD.to_vec();
    ver[second + 1] = 2;
    assert_eq!(malformed(&ver[..second + 2]), "record version");
    let mut zero = MULTI_RECORD.to_vec();
    zero[second + 3..second + 5].copy_from_slice(&[0, 0]);
    assert_eq!(malformed(&zero[..second + 5]), "record length");
}

#[test]
fn handshake_header_split_across_tiny_records() {
    let hs = handshake(&body_with(Some(&standard_exts())));
    for chunk in [1, 2, 3, 5, 7] {
        let w = records(&hs, chunk);
        let i = complete(&w);
        assert_eq!((i.records, i.len), (hs.len().div_ceil(chunk), w.len()));
        assert_eq!(i.sni.as_deref(), Some("api.example.com"));
    }
}

// ---------------------------------------------------------------- caps

#[test]
fn declared_handshake_length_above_cap_is_too_large_early() {
    // Record says 100 bytes, handshake header says 20000: known after 9 bytes.
    let mut w = vec![0x16, 0x03, 0x01, 0x00, 0x64, 0x01, 0x00, 0x4e, 0x20];
    w.extend([0u8; 100]);
    assert_eq!(parse_once(&w[..8], MAX), Ok(Status::Incomplete));
    assert_eq!(parse_once(&w[..9], MAX), Err(HelloError::TooLarge));
    // Maximal handshake length (2^24-1) must not overflow or allocate.
    let mut max = w.clone();
    max[6..9].copy_from_slice(&[0xff, 0xff, 0xff]);
    assert_eq!(parse_once(&max[..9], usize::MAX), Ok(Status::Incomplete));
    assert_eq!(parse_once(&max[..9], MAX), Err(HelloError::TooLarge));
    // Record header alone already exceeds the cap.
    let rec = [0x16, 0x03, 0x01, 0x40, 0x00];
    assert_eq!(parse_once(&rec, 1000), Err(HelloError::TooLarge));
    assert_eq!(parse_once(&rec[..4], 1000), Ok(Status::Incomplete));
    // Fits in the cap only without record overhead: a 16384-byte hello in 2 records is 16394 bytes.
    let hs = padded_handshake(16384, &[]);
    let two = records(&hs, 16000);
    assert_eq!(parse_once(&two[..9], MAX), Err(HelloError::TooLarge));
    assert_eq!(complete(&records(&hs, 16384)).len, 16389);
}

/// The default cap is one maximal record on the wire: 5-byte header plus 2^14 bytes of payload.
#[test]
fn default_parser_uses_project_cap() {
    assert_eq!(DEFAULT_MAX_LEN, 16389);
    let w = records(&padded_handshake(16384, &[]), 16384);
    assert_eq!(w.len(), 16389);
    assert!(matches!(HelloParser::default().parse(&w), Ok(Status::Complete(_))));
    // One more handshake byte needs a second record, past the cap.
    let w = records(&padded_handshake(16385, &[]), 16384);
    assert_eq!(HelloParser::default().parse(&w[..9]), Err(HelloError::TooLarge));
}

/// Memory follows the bytes received, not the length the peer declared: 10,000 peers that send
/// 9 bytes declaring a 200 KiB hello must not cost 2 GiB.
#[test]
fn declared_length_reserves_nothing() {
    let mut w = vec![0x16, 0x03, 0x01, 0x40, 0x00, 0x01, 0x03, 0x20, 0x00];
    let mut p = HelloParser::new(256 * 1024);
    assert_eq!(p.parse(&w), Ok(Status::Incomplete));
    assert!(p.buffer_capacity() < 64, "reserved {} bytes for 9 received", p.buffer_capacity());
    // It grows with what arrives (amortised doubling at most).
    w.extend([0u8; 1000]);
    assert_eq!(p.parse(&w), Ok(Status::Incomplete));
    assert!(p.buffer_capacity() <= 2 * (w.len() - 5), "{} bytes held for {} received", p.buffer_capacity(), w.len());
}

/// Byte-by-byte feeding of 16 KiB hellos stays linear (a re-scanning parser would make this test crawl).
#[test]
fn byte_by_byte_16k_is_cheap() {
    let hs = padded_handshake(16379, &host(b"big.example"));
    for (w, cap) in [(records(&hs, 16384), MAX), (records(&hs, 16), 40_000), (records(&hs, 1), 100_000)] {
        let start = std::time::Instant::now();
        let mut p = HelloParser::new(cap);
        for i in 0..w.len() {
            assert_eq!(p.parse(&w[..i]), Ok(Status::Incomplete));
        }
        let i = match p.parse(&w) {
            Ok(Status::Complete(i)) => i,
            other => panic!("{other:?}"),
        };
        assert_eq!((i.len, i.sni.as_deref()), (w.len(), Some("big.example")));
        eprintln!("{} bytes in {} records byte-by-byte: {:?}", w.len(), i.records, start.elapsed());
    }
}

// ---------------------------------------------------------------- not TLS

#[test]
fn non_tls_is_rejected_on_first_byte() {
    for input in [
        &b"CONNECT api.example.com:443 HTTP/1.1\r\n\r\n"[..],
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"PROXY TCP4 192.0.2.1 192.0.2.2 1234 443\r\n",
        b"\r\n\r\n\0\r\nQUIT\n", // PROXY v2 signature
        b"SSH-2.0-OpenSSH_9.6\r\n",
        b"\x80\x2e\x01\x03\x01", // SSLv2-compatible hello
        b"\x17\x03\x03\x00\x10",
        b"\x00\x00\x00\x00",
        b"\xff",
    ] {
        assert_eq!(parse_once(&input[..1], MAX), Err(HelloError::NotTls), "{input:?}");
        assert_eq!(parse_once(input, MAX), Err(HelloError::NotTls), "{input:?}");
    }
    assert_eq!(parse_once(b"", MAX), Ok(Status::Incomplete));
    assert_eq!(parse_once(b"\x16", MAX), Ok(Status::Incomplete));
    assert_eq!(parse_once(b"\x16\x04", MAX), Err(HelloError::NotTls));
    assert_eq!(parse_once(b"\x16\x02\x00", MAX), Err(HelloError::NotTls));
    for minor in 0..=4 {
        assert_eq!(parse_once(&[0x16, 3, minor, 0], MAX), Ok(Status::Incomplete));
    }
}

#[test]
fn errors_are_sticky_and_labelled() {
    let mut p = HelloParser::new(MAX);
    assert_eq!(p.parse(b"G"), Err(HelloError::NotTls));
    assert_eq!(p.parse(b"GET /"), Err(HelloError::NotTls));
    assert_eq!(HelloError::NotTls.reason(), "not_tls");
    assert_eq!(HelloError::TooLarge.reason(), "too_large");
    assert_eq!(HelloError::Malformed("x").reason(), "malformed");
    assert_eq!(HelloError::Malformed("bad hostname").to_string(), "malformed TLS ClientHello: bad hostname");
    assert!(!HelloError::NotTls.to_string().is_empty());
    assert!(!HelloError::TooLarge.to_string().is_empty());
}

#[test]
fn alert_records() {
    assert_eq!(alert_record(ALERT_UNRECOGNIZED_NAME), [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 112]);
    assert_eq!(alert_record(ALERT_DECODE_ERROR)[6], 50);
    assert_eq!(alert_record(ALERT_HANDSHAKE_FAILURE)[6], 40);
    assert_eq!(alert_record(ALERT_INTERNAL_ERROR)[6], 80);
}

/// The buffer contract ("only grows") broken: the parser restarts instead of misbehaving.
#[test]
fn shrinking_buffer_restarts() {
    let mut p = HelloParser::new(MAX);
    assert_eq!(p.parse(&OPENSSL[..100]), Ok(Status::Incomplete));
    assert_eq!(p.parse(&OPENSSL[..10]), Ok(Status::Incomplete));
    assert_eq!(p.parse(OPENSSL), Ok(Status::Complete(fixtures()[2].expected.clone())));
}

// ---------------------------------------------------------------- fuzz

struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn mutate(rng: &mut XorShift, buf: &mut Vec<u8>, all: &[&[u8]]) {
    for _ in 0..1 + rng.below(3) {
        let len = buf.len();
        match rng.below(7) {
            0 => {
                let at = rng.below(len);
                if let Some(b) = buf.get_mut(at) {
                    *b ^= 1 << rng.below(8);
                }
            }
            1 => {
                // Headers and length fields live near the start; hit them more often.
                let at = rng.below(len.min(120));
                if let Some(b) = buf.get_mut(at) {
                    *b = [0, 1, 0x7f, 0x80, 0xff][rng.below(5)];
                }
            }
            2 => buf.truncate(rng.below(len + 1)),
            3 => {
                let other = all[rng.below(all.len())];
                let from = rng.below(other.len());
                let n = rng.below(64).min(other.len() - from);
                let at = rng.below(len + 1);
                buf.splice(at..at, other[from..from + n].iter().copied());
            }
            4 => {
                let at = rng.below(len + 1);
                let n = rng.below(16).min(len - at);
                buf.drain(at..at + n);
            }
            5 => {
                let at = rng.below(len + 1);
                let n = rng.below(8);
                let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                buf.splice(at..at, bytes);
            }
            _ => {
                let at = rng.below(len);
                if let Some(b) = buf.get_mut(at) {
                    *b = rng.next() as u8;
                }
            }
        }
    }
}

#[test]
fn fuzz_mutated_fixtures() {
    let all: Vec<&[u8]> = fixtures().iter().map(|f| f.bytes).collect();
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let (mut completes, mut errors, mut incompletes) = (0, 0, 0);
    for iter in 0..20_000 {
        let mut buf = all[rng.below(all.len())].to_vec();
        mutate(&mut rng, &mut buf, &all);
        let cap = if rng.below(4) == 0 { rng.below(4000) } else { MAX };
        let whole = parse_once(&buf, cap);
        match &whole {
            Ok(Status::Complete(i)) => {
                completes += 1;
                assert!(i.len <= buf.len() && i.records >= 1 && i.len <= cap, "iter {iter}: {i:?}");
                if let Some(s) = &i.sni {
                    assert!(!s.is_empty() && s.len() <= 255 && !s.ends_with('.'));
                    assert!(s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-._".contains(&b)));
                }
            }
            Ok(Status::Incomplete) => incompletes += 1,
            Err(_) => errors += 1,
        }
        // Same verdict when the same bytes arrive in a few random reads.
        let mut p = HelloParser::new(cap);
        let mut cuts: Vec<usize> = (0..rng.below(4)).map(|_| rng.below(buf.len() + 1)).collect();
        cuts.sort_unstable();
        for c in cuts {
            let r = p.parse(&buf[..c]);
            if r.is_err() || matches!(r, Ok(Status::Complete(_))) {
                assert_eq!(r, whole, "iter {iter}: early verdict at {c} differs");
            }
        }
        assert_eq!(p.parse(&buf), whole, "iter {iter}: chunked verdict differs");
    }
    eprintln!("fuzz: {completes} complete, {errors} errors, {incompletes} incomplete");
    assert!(completes > 1000 && errors > 1000 && incompletes > 100);
}
