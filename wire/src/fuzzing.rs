//! Checks shared by the AFL targets (`wire/fuzz/`) and the corpus replay test: no panic, split invariance, round trips.
//!
//! Every `check_*` function panics when an invariant fails, which is what both AFL (a crash)
//! and `cargo test` (a failure) need. Not part of the API: hidden from the docs.

// A panic here is a finding, not a failure mode of the readers: the crate's bans on indexing
// and unwrap are for the code that reads untrusted bytes.
#![allow(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used)]

use crate::client_hello::{self, HelloParser};
use crate::http_head::{self, HeadReader, RequestHead, ResponseHeadReader};
use crate::lines::{LineFramer, TooLong};
use crate::proxy_auth;
use crate::proxy_protocol::{self, Command, ProxyHeader, Transport, V2Options};
use crate::quic_initial::{self, InitialError, InitialReader};
use crate::tunnel::control::{self, AgentHello, AgentMsg, CONTROL_LINE_MAX, ControlMsg, ControlReader, Line};
use crate::tunnel::quic::{ANSWER_MAX, Answer, Progress, StreamError, StreamHeader};
use serde::{Serialize, de::DeserializeOwned};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Inputs up to this length are also fed cut at every single point and byte by byte; longer
/// ones only at the derived cut points (every cut point would make an execution quadratic).
const EVERY_CUT_MAX: usize = 256;
/// Most derived cut points per input.
const MAX_CUTS: usize = 16;

/// The ways `data` is fed: each is an increasing list of prefix lengths ending at `data.len()`.
///
/// Besides the whole input at once: every single cut and byte by byte for short inputs, and
/// for any input a set of cut points drawn from a hash of the input itself, so the fuzzer
/// chooses them by choosing the bytes without a separate encoding that would stop the
/// captured fixtures from being usable as they are.
pub fn splits(data: &[u8]) -> Vec<Vec<usize>> {
    let n = data.len();
    let mut out = vec![vec![n]];
    if (1..=EVERY_CUT_MAX).contains(&n) {
        out.extend((1..n).map(|c| vec![c, n]));
        out.push((1..=n).collect());
    }
    // FNV-1a seed, xorshift draws: deterministic, so a replayed corpus file is fed the same way.
    let mut x = data.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    if n > 1 {
        let mut cuts: Vec<usize> = (0..MAX_CUTS)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Truncation is fine: any value maps to a valid cut point.
                1 + (x as usize) % (n - 1)
            })
            .collect();
        cuts.push(n);
        cuts.sort_unstable();
        cuts.dedup();
        out.push(cuts);
    }
    out
}

/// Feeds growing prefixes to `poll` until it gives a verdict (`Some`), as a connection would;
/// `None` if even the whole input was not enough.
fn first_verdict<T>(cuts: &[usize], data: &[u8], mut poll: impl FnMut(&[u8]) -> Option<T>) -> Option<T> {
    cuts.iter().find_map(|&c| poll(&data[..c]))
}

/// Panics unless every way of feeding `data` gives the verdict the whole input gives at once.
fn split_invariant<T: PartialEq + std::fmt::Debug, R>(
    data: &[u8],
    mut new_reader: impl FnMut() -> R,
    mut poll: impl FnMut(&mut R, &[u8]) -> Option<T>,
) -> Option<T> {
    let whole = poll(&mut new_reader(), data);
    for cuts in splits(data) {
        let mut r = new_reader();
        let fed = first_verdict(&cuts, data, |prefix| poll(&mut r, prefix));
        assert_eq!(fed, whole, "fed at {cuts:?} differs from the whole input");
    }
    whole
}

// ---------------------------------------------------------------- ClientHello

/// `HelloParser` at the project's cap and at a small one.
pub fn check_client_hello(data: &[u8]) {
    for cap in [client_hello::DEFAULT_MAX_LEN, 512] {
        let verdict = split_invariant(
            data,
            || HelloParser::new(cap),
            |p, buf| match p.parse(buf) {
                Ok(client_hello::Status::Incomplete) => None,
                Ok(client_hello::Status::Complete(info)) => Some(Ok(info)),
                Err(e) => Some(Err(e)),
            },
        );
        if let Some(Ok(info)) = verdict {
            assert!(info.len <= data.len() && info.len <= cap, "hello of {} bytes, cap {cap}", info.len);
            assert!(info.records >= 1);
            if let Some(sni) = &info.sni {
                assert!(!sni.is_empty() && !sni.ends_with('.') && sni.bytes().all(|b| !b.is_ascii_uppercase()));
            }
        }
    }
}

// ---------------------------------------------------------------- PROXY protocol

/// `parse` (and `detect`) fed in any split; a parsed header is re-encoded and parsed back.
pub fn check_proxy_protocol(data: &[u8]) {
    let detected = split_invariant(
        data,
        || (),
        |_, buf| match proxy_protocol::detect(buf) {
            proxy_protocol::Detect::Incomplete => None,
            d => Some(d),
        },
    );
    let verdict = split_invariant(data, || (), |_, buf| proxy_protocol::parse(buf).transpose());
    if let Some(Ok(h)) = verdict {
        assert!(h.len <= data.len());
        assert!(detected.is_some());
        reencode(&h);
    }
}

/// A header with addresses, encoded again by us, parses back to the same addresses.
fn reencode(h: &ProxyHeader) {
    let (Some(src), Some(dst)) = (h.source, h.destination) else { return };
    if h.version == 1 {
        let line = proxy_protocol::encode_v1(src, dst);
        let back = proxy_protocol::parse(&line).expect("our v1 line parses").expect("complete");
        assert_eq!((back.source, back.destination, back.len), (Some(src), Some(dst), line.len()));
    }
    if matches!(h.transport, Transport::Tcp4 | Transport::Tcp6) {
        let b = proxy_protocol::try_encode_v2(src, dst, &V2Options::default()).expect("plain v2 encodes");
        let back = proxy_protocol::parse(&b).expect("our v2 header parses").expect("complete");
        assert_eq!((back.source, back.destination), (Some(src), Some(dst)));
    }
}

/// Little cursor over fuzzer bytes; reads past the end give zeros so every input means something.
struct Bytes<'a>(&'a [u8]);

impl<'a> Bytes<'a> {
    fn take(&mut self, n: usize) -> &'a [u8] {
        let (head, tail) = self.0.split_at(n.min(self.0.len()));
        self.0 = tail;
        head
    }
    fn u8(&mut self) -> u8 {
        self.take(1).first().copied().unwrap_or(0)
    }
    fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }
    fn addr(&mut self, v6: bool) -> SocketAddr {
        let ip = if v6 {
            let mut o = [0u8; 16];
            for b in &mut o {
                *b = self.u8();
            }
            IpAddr::V6(Ipv6Addr::from(o))
        } else {
            IpAddr::V4(Ipv4Addr::new(self.u8(), self.u8(), self.u8(), self.u8()))
        };
        SocketAddr::new(ip, self.u16())
    }
}

/// Addresses and TLVs chosen by the fuzzer: whatever `try_encode_v2` accepts must parse back
/// (in any split) to the same fields, and `encode_v1` must round-trip its addresses.
///
/// Layout: flags (bit 0/1: source/destination IPv6, bit 2: CRC32C, bit 3: authority, bit 4:
/// unique id), source, destination (4 or 16 address bytes, then a u16 port), authority (u8
/// length, bytes, read as lossy UTF-8), unique id (u8 length, bytes), then extra TLVs (type,
/// u16 length, value) to the end.
pub fn check_proxy_roundtrip(data: &[u8]) {
    let mut r = Bytes(data);
    let flags = r.u8();
    let src = r.addr(flags & 1 != 0);
    let dst = r.addr(flags & 2 != 0);
    let authority = (flags & 8 != 0).then(|| {
        let n = r.u8();
        String::from_utf8_lossy(r.take(usize::from(n))).into_owned()
    });
    let unique_id = (flags & 16 != 0).then(|| {
        let n = r.u8();
        r.take(usize::from(n)).to_vec()
    });
    let mut extra = Vec::new();
    while !r.0.is_empty() {
        let t = r.u8();
        let n = r.u16();
        extra.push((t, r.take(usize::from(n))));
    }
    let opts = V2Options {
        authority: authority.as_deref(),
        unique_id: unique_id.as_deref(),
        crc32c: flags & 4 != 0,
        extra_tlvs: &extra,
    };

    // v1 carries only addresses: they always round-trip (mixed families as IPv4-mapped IPv6).
    let pair = same_family(src, dst);
    let v1 = proxy_protocol::encode_v1(src, dst);
    let back = proxy_protocol::parse(&v1).expect("encode_v1 output parses").expect("complete");
    assert_eq!((back.source, back.destination, back.len), (Some(pair.0), Some(pair.1), v1.len()));

    let Ok(wire) = proxy_protocol::try_encode_v2(src, dst, &opts) else { return };
    let parsed = split_invariant(&wire, || (), |_, buf| proxy_protocol::parse(buf).transpose());
    let h = match parsed {
        Some(Ok(h)) => h,
        other => panic!("try_encode_v2 accepted {opts:?} but parse says {other:?}"),
    };
    assert_eq!((h.version, h.command, h.len), (2, Command::Proxy, wire.len()));
    assert_eq!(h.transport, if pair.0.is_ipv4() { Transport::Tcp4 } else { Transport::Tcp6 });
    assert_eq!((h.source, h.destination), (Some(pair.0), Some(pair.1)));
    // TLV order as documented: CRC32C, AUTHORITY, UNIQUE_ID, then the extras.
    let mut want: Vec<(u8, Vec<u8>)> = Vec::new();
    if opts.crc32c {
        let crc = h.tlvs.first().map(|t| t.1.clone()).unwrap_or_default();
        want.push((proxy_protocol::PP2_TYPE_CRC32C, crc));
    }
    want.extend(opts.authority.map(|a| (proxy_protocol::PP2_TYPE_AUTHORITY, a.as_bytes().to_vec())));
    want.extend(opts.unique_id.map(|u| (proxy_protocol::PP2_TYPE_UNIQUE_ID, u.to_vec())));
    want.extend(extra.iter().map(|&(t, v)| (t, v.to_vec())));
    assert_eq!(h.tlvs, want);
    let tlv = |ty| extra.iter().find(|e| e.0 == ty).map(|e| e.1);
    let authority = opts.authority.map(str::to_owned).or_else(|| {
        tlv(proxy_protocol::PP2_TYPE_AUTHORITY).map(|v| String::from_utf8(v.to_vec()).expect("accepted as UTF-8"))
    });
    assert_eq!(h.authority, authority);
    let unique_id = opts.unique_id.or_else(|| tlv(proxy_protocol::PP2_TYPE_UNIQUE_ID)).map(<[u8]>::to_vec);
    assert_eq!(h.unique_id, unique_id);
}

/// What the encoders do with a mixed pair (documented: IPv4-mapped IPv6 for both).
fn same_family(src: SocketAddr, dst: SocketAddr) -> (SocketAddr, SocketAddr) {
    let v6 = |a: SocketAddr| match a.ip() {
        IpAddr::V4(v4) => SocketAddr::from((v4.to_ipv6_mapped(), a.port())),
        IpAddr::V6(_) => a,
    };
    if src.is_ipv4() == dst.is_ipv4() { (src, dst) } else { (v6(src), v6(dst)) }
}

// ---------------------------------------------------------------- HTTP heads

/// `HeadReader` (project default cap and a small one) and `looks_like_http` in any split; on a
/// parsed head, `connect_authority` and `absolute_form`; and those two on the input taken
/// directly as a request target (no httparse in front), since CONNECT authorities and
/// absolute-form targets are what the peer chooses.
pub fn check_http_request(data: &[u8]) {
    split_invariant(
        data,
        || (),
        |_, buf| match http_head::looks_like_http(buf) {
            http_head::Detect3::Incomplete => None,
            d => Some(d),
        },
    );
    for cap in [http_head::DEFAULT_MAX_LEN, 128] {
        let verdict = split_invariant(data, || HeadReader::new(cap), |r, buf| r.poll(buf).transpose());
        if let Some(Ok(head)) = verdict {
            assert!(head.len <= data.len() && head.len <= cap);
            assert!(head.version <= 1);
            check_targets(&head);
        }
    }
    if let Ok(target) = std::str::from_utf8(data) {
        for method in ["CONNECT", "GET"] {
            let head = RequestHead {
                method: method.to_owned(),
                target: target.to_owned(),
                version: 1,
                headers: Vec::new(),
                len: 0,
            };
            check_targets(&head);
        }
    }
}

fn check_targets(head: &RequestHead) {
    if let Ok((host, port)) = head.connect_authority() {
        assert!(head.is_connect() && port != 0 && !host.is_empty());
        check_host(&host, head.target.starts_with('['));
    }
    if let Ok((host, port, path)) = head.absolute_form() {
        assert!(!head.is_connect() && port != 0 && !host.is_empty());
        assert!(path.starts_with('/'), "{path:?}");
        check_host(&host, head.target.get(7..).is_some_and(|t| t.starts_with('[')));
    }
}

/// A host handed to the resolver: an IPv6 literal (brackets removed) or a DNS-style name.
fn check_host(host: &str, bracketed: bool) {
    if bracketed {
        assert!(host.parse::<Ipv6Addr>().is_ok(), "{host:?}");
    } else {
        assert!(
            host.len() <= 255 && host.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b)),
            "{host:?}"
        );
    }
}

/// `ResponseHeadReader` in any split; what it accepts httparse accepts with the same length and
/// status, and a head httparse finds complete within the cap is accepted.
pub fn check_http_response(data: &[u8]) {
    let cap = http_head::DEFAULT_MAX_LEN;
    let verdict = split_invariant(data, || ResponseHeadReader::new(cap), |r, buf| r.poll(buf).transpose());
    let mut headers = [httparse::EMPTY_HEADER; http_head::MAX_RESPONSE_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    let reference = resp.parse(data);
    match (&verdict, reference) {
        (Some(Ok(h)), Ok(httparse::Status::Complete(n))) => {
            assert_eq!((h.len, Some(h.status)), (n, resp.code), "reader and httparse disagree");
        }
        (Some(Ok(h)), other) => panic!("reader accepted {h:?}, httparse says {other:?}"),
        (_, Ok(httparse::Status::Complete(n))) if n < cap => {
            panic!("httparse accepts a {n}-byte head, reader says {verdict:?}")
        }
        _ => {}
    }
}

// ---------------------------------------------------------------- QUIC Initials

/// The reader's caps as the router sets them for a ClientHello cap: CRYPTO bytes, Initial packets.
fn quic_caps(hello_max: usize) -> (usize, usize) {
    (hello_max, hello_max.div_ceil(1000) + 4)
}

/// What one `push` said.
pub type Pushed = Result<client_hello::Status, InitialError>;

/// Feeds `datagrams` to a fresh reader until its verdict; returns what each push said. Panics
/// if the reader holds more than its caps allow, holds anything after its verdict, or a later
/// push does not repeat the verdict.
fn feed_initials(datagrams: &[Vec<u8>], max_crypto: usize, max_packets: usize) -> Vec<Pushed> {
    let mut r = InitialReader::new(max_crypto, max_packets);
    let mut out = Vec::new();
    for d in datagrams {
        let pushed = r.push(d);
        // The contiguous stream and the fragments beyond a gap are each capped at `max_crypto`.
        assert!(r.buffered() <= 2 * max_crypto, "{} bytes buffered, cap {max_crypto}", r.buffered());
        let verdict = !matches!(pushed, Ok(client_hello::Status::Incomplete));
        if verdict {
            assert_eq!(r.buffered(), 0, "bytes held after the verdict {pushed:?}");
            assert_eq!(r.push(d), pushed, "a later datagram changed the verdict");
        }
        out.push(pushed);
        if verdict {
            break;
        }
    }
    out
}

/// A complete hello is within what was fed and the cap, its name normalised.
fn check_quic_hello(pushed: &[Pushed], max_crypto: usize) {
    if let Some(Ok(client_hello::Status::Complete(info))) = pushed.last() {
        assert!(info.len <= max_crypto, "hello of {} bytes, cap {max_crypto}", info.len);
        if let Some(sni) = &info.sni {
            assert!(!sni.is_empty() && !sni.ends_with('.') && sni.bytes().all(|b| !b.is_ascii_uppercase()));
        }
    }
}

/// `InitialReader` at the router's caps for the default ClientHello cap and for a small one.
///
/// The first byte chooses how the rest is read. Bit 0 clear: datagrams as they came off the
/// wire, each a big-endian u16 length and that many bytes (the last one cut short if the input
/// ends): fed twice to fresh readers, which must say the same; anything the reader accepts as a
/// first datagram must pass `looks_like_initial`. Bit 0 set: a ClientHello message, cut into
/// CRYPTO frames that are shuffled, one repeated, packed into Initials (bit 1 set: QUIC v2)
/// sealed with the Initial keys, so the fuzzer reaches the frame and reassembly code past the
/// AEAD: the verdict must be the one the whole message in one frame gives. Layout: flags, a u16
/// length `n`, `n` layout bytes (see [`quic_layout`]), the message. Returns the verdict at the
/// default cap (`None`: still incomplete after all of it).
pub fn check_quic_initial(data: &[u8]) -> Option<Pushed> {
    let Some((&flags, rest)) = data.split_first() else {
        return feed_initials(&[Vec::new()], 64, 1).pop();
    };
    let mut verdict = None;
    if flags & 1 == 0 {
        let mut r = Bytes(rest);
        let mut datagrams = Vec::new();
        while !r.0.is_empty() {
            let n = r.u16();
            datagrams.push(r.take(usize::from(n)).to_vec());
        }
        for hello_max in [client_hello::DEFAULT_MAX_LEN, 1024] {
            let (max_crypto, max_packets) = quic_caps(hello_max);
            let pushed = feed_initials(&datagrams, max_crypto, max_packets);
            assert_eq!(feed_initials(&datagrams, max_crypto, max_packets), pushed, "not deterministic");
            if let (Some(Ok(_)), Some(first)) = (pushed.first(), datagrams.first()) {
                assert_eq!(quic_initial::looks_like_initial(first), Ok(()), "the reader took {pushed:?}");
            }
            check_quic_hello(&pushed, max_crypto);
            verdict = verdict.or_else(|| pushed.last().cloned());
        }
        return verdict.filter(|v| !matches!(v, Ok(client_hello::Status::Incomplete)));
    }
    let version = if flags & 2 == 0 { quic_initial::VERSION_1 } else { quic_initial::VERSION_2 };
    let mut r = Bytes(rest);
    let n = r.u16();
    let layout = r.take(usize::from(n));
    let dcid = [0x5a; 8];
    let seal = |pn: usize, frames: &[u8]| {
        quic_initial::build::client_initial(version, &dcid, pn as u64, frames, quic_initial::MIN_INITIAL_DATAGRAM)
            .expect("an Initial of a supported version seals")
    };
    for hello_max in [client_hello::DEFAULT_MAX_LEN, 1024] {
        let (max_crypto, _) = quic_caps(hello_max);
        // A stream longer than the cap is refused by the piece that crosses it, which may come
        // after the hello completed: not a property of the split.
        let msg = &r.0[..r.0.len().min(max_crypto)];
        let packets = quic_layout(msg, layout);
        // Enough packets for any layout: the packet cap is not what this compares.
        let whole = feed_initials(&[seal(0, &quic_initial::build::crypto_frame(0, msg))], max_crypto, 16);
        let datagrams: Vec<Vec<u8>> = packets.iter().enumerate().map(|(pn, f)| seal(pn, f)).collect();
        let fed = feed_initials(&datagrams, max_crypto, 16);
        assert_eq!(fed.last(), whole.last(), "the hello cut and packed as {packets:?}");
        check_quic_hello(&fed, max_crypto);
        verdict = verdict.or_else(|| fed.last().cloned());
    }
    verdict.filter(|v| !matches!(v, Ok(client_hello::Status::Incomplete)))
}

/// The frames of each Initial: `msg` cut into at most 8 pieces at points the layout bytes
/// choose (u8 count, u16 cut points), the pieces shuffled (u8 per swap), one of them sent twice
/// (u8: bit 7 whether, the rest which), then packed in order (per piece a u8: bit 0 starts a new
/// packet, bit 1 puts a PING before it). Layout bytes past the end read as zeros.
pub fn quic_layout(msg: &[u8], layout: &[u8]) -> Vec<Vec<u8>> {
    let mut r = Bytes(layout);
    let count = 1 + usize::from(r.u8() % 8);
    let mut cuts: Vec<usize> = (1..count).map(|_| usize::from(r.u16()) % (msg.len() + 1)).collect();
    cuts.push(0);
    cuts.push(msg.len());
    cuts.sort_unstable();
    cuts.dedup();
    let mut pieces: Vec<(usize, &[u8])> = cuts.windows(2).map(|w| (w[0], &msg[w[0]..w[1]])).collect();
    if pieces.is_empty() {
        pieces.push((0, &[]));
    }
    for i in (1..pieces.len()).rev() {
        pieces.swap(i, usize::from(r.u8()) % (i + 1));
    }
    let again = r.u8();
    if again & 0x80 != 0 {
        pieces.push(pieces[usize::from(again & 0x7f) % pieces.len()]);
    }
    let mut packets: Vec<Vec<u8>> = Vec::new();
    for (offset, piece) in pieces {
        let how = r.u8();
        if packets.is_empty() || how & 1 != 0 {
            packets.push(Vec::new());
        }
        let p = packets.last_mut().expect("a packet");
        if how & 2 != 0 {
            p.push(0x01);
        }
        p.extend(quic_initial::build::crypto_frame(offset, piece));
    }
    packets
}

// ---------------------------------------------------------------- control lines

/// What framing a stream gives: the lines, then the refusal if a line was too long.
pub type Framed = (Vec<Vec<u8>>, Option<TooLong>);

/// Frames `data` with `limit` as a whole and in every split of [`splits`]; panics unless all
/// agree, and returns the lines. Small limits reach the refusal with small inputs.
pub fn check_lines(data: &[u8], limit: usize) -> Framed {
    let frame = |cuts: &[usize]| {
        let mut f = LineFramer::new(limit);
        let mut lines = Vec::new();
        let mut from = 0;
        for &c in cuts {
            f.push(&data[from..c]);
            from = c;
            loop {
                match f.next_line() {
                    Ok(Some(line)) => {
                        assert!(line.len() <= limit && !line.contains(&b'\n'));
                        lines.push(line);
                    }
                    Ok(None) => break,
                    Err(e) => return (lines, Some(e)),
                }
            }
            assert!(f.pending() <= limit, "{} bytes pending, limit {limit}", f.pending());
        }
        (lines, None)
    };
    let whole = frame(&[data.len()]);
    for cuts in splits(data) {
        assert_eq!(frame(&cuts), whole, "framing fed at {cuts:?} differs");
    }
    if whole.1.is_none() {
        // Lossless: the lines and what is pending are the input minus the newlines.
        let joined: usize = whole.0.iter().map(|l| l.len() + 1).sum();
        assert!(joined <= data.len());
    }
    whole
}

/// Line framing at the first byte's choice of a small limit and at `big_limit` (the real one).
/// Returns the lines at `big_limit`, for the caller to decode.
pub fn check_control_framing(data: &[u8], big_limit: usize) -> Framed {
    let small = usize::from(data.first().copied().unwrap_or(0) % 64);
    check_lines(data, small);
    check_lines(data, big_limit)
}

/// The tunnel's control stream: framing at a small limit and the real one, then every line
/// decoded as each message a reader may expect; a decoded message encodes to a line that
/// decodes to it again; and [`ControlReader`] (framing and decoding together) reads the same
/// messages, then the same end, in every split.
pub fn check_control_input(data: &[u8]) {
    let (lines, end) = check_control_framing(data, CONTROL_LINE_MAX);
    for line in &lines {
        roundtrip::<ControlMsg>(line);
        roundtrip::<AgentHello>(line);
        roundtrip::<AgentMsg>(line);
        if let Ok(h) = serde_json::from_slice::<AgentHello>(line) {
            check_hello_bounds(&h);
        }
    }
    let read = |cuts: &[usize]| {
        let mut r = ControlReader::new(CONTROL_LINE_MAX);
        let mut msgs = Vec::new();
        let mut from = 0;
        for &c in cuts {
            r.push(data.get(from..c).unwrap_or_default());
            from = c;
            loop {
                match r.next_msg::<ControlMsg>() {
                    Ok(Some(Line::Msg(m))) => msgs.push(Some(m)),
                    Ok(Some(Line::Unknown(_))) => msgs.push(None),
                    Ok(None) => break,
                    Err(e) => return (msgs, Some(e)),
                }
            }
        }
        (msgs, None)
    };
    let whole = read(&[data.len()]);
    assert_eq!((whole.0.len(), whole.1), (lines.len(), end), "the reader and the framing disagree");
    for cuts in splits(data) {
        assert_eq!(read(&cuts), whole, "control messages fed at {cuts:?} differ");
    }
}

/// What the seed keeps of a hello is within the limits, a prefix of what was sent, and stable.
fn check_hello_bounds(h: &AgentHello) {
    let b = h.clone().bounded();
    let fields = [
        (&h.node, &b.node),
        (&h.version, &b.version),
        (&h.instance, &b.instance),
        (&h.host, &b.host),
        (&h.cluster, &b.cluster),
    ];
    for (sent, kept) in fields.into_iter().chain(h.addresses.iter().zip(&b.addresses)) {
        assert!(kept.len() <= control::HELLO_FIELD_MAX && sent.starts_with(kept.as_str()), "{sent:?} kept as {kept:?}");
    }
    assert!(b.addresses.len() <= control::HELLO_ADDRESSES_MAX);
    assert_eq!(b.clone().bounded(), b, "bounding again changed the hello");
}

fn roundtrip<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(line: &[u8]) {
    let Ok(msg) = serde_json::from_slice::<T>(line) else { return };
    let again = match control::encode_line(&msg) {
        Ok(l) => l,
        Err(e) => panic!("{msg:?} decoded but does not encode: {e}"),
    };
    assert_eq!(again.last(), Some(&b'\n'));
    let body = again.strip_suffix(b"\n").unwrap_or_default();
    assert!(!body.contains(&b'\n'), "an encoded message spans lines");
    assert_eq!(serde_json::from_slice::<T>(body).ok().as_ref(), Some(&msg), "{msg:?} does not survive encoding");
}

// ---------------------------------------------------------------- QUIC stream header and answer

/// A QUIC stream reader's verdict on a whole input: the value and the bytes it took, or the error.
type StreamVerdict<T> = Option<Result<(T, usize), StreamError>>;

/// `read` fed every split of `data`, and fed as the transport feeds it (exactly the bytes it
/// asks for, never more): always the verdict of the whole input at once, and a value takes only
/// bytes it asked for.
fn check_stream_reader<T: PartialEq + std::fmt::Debug>(
    data: &[u8],
    read: impl Fn(&[u8]) -> Result<Progress<T>, StreamError>,
) -> StreamVerdict<T> {
    let verdict = |buf: &[u8]| match read(buf) {
        Ok(Progress::More(n)) => {
            assert!(n > 0, "asked for nothing more");
            None
        }
        Ok(Progress::Done(v, used)) => {
            assert!(used <= buf.len(), "took {used} of {} bytes", buf.len());
            Some(Ok((v, used)))
        }
        Err(e) => Some(Err(e)),
    };
    let whole = split_invariant(data, || (), |_, buf| verdict(buf));
    let mut have = 0;
    let asked = loop {
        match read(data.get(..have).unwrap_or_default()) {
            Ok(Progress::More(n)) if have + n <= data.len() => have += n,
            Ok(Progress::More(_)) => break None,
            Ok(Progress::Done(v, used)) => {
                assert_eq!(used, have, "took other bytes than it asked for");
                break Some(Ok((v, used)));
            }
            Err(e) => break Some(Err(e)),
        }
    };
    assert_eq!(asked, whole, "fed as asked differs from the whole input");
    whole
}

/// The QUIC transport's stream header and dial answer, both read from the same input: a header
/// read encodes to the bytes it was read from; an answer read encodes to bytes that read back
/// to it, or, when lossy UTF-8 decoding grew its payload past [`ANSWER_MAX`], to that payload cut
/// to the cap, read back as a refusal.
pub fn check_quic_stream(data: &[u8]) {
    if let Some(Ok((h, used))) = check_stream_reader(data, StreamHeader::read) {
        assert_eq!(h.encode().ok().as_deref(), data.get(..used), "{h:?} re-encodes differently");
    }
    if let Some(Ok((a, _))) = check_stream_reader(data, Answer::read) {
        let again = a.encode();
        let back = Answer::read(&again);
        match &a {
            // Lossy decoding grew the payload past the cap (an invalid byte becomes a 3-byte
            // U+FFFD): it is sent cut to the cap, and read back as a refusal of that size.
            Answer::Refused { code, reason } if code.len() + 1 + reason.len() > ANSWER_MAX => {
                let sent = format!("{code}\n{reason}");
                assert_eq!(again.get(3..), sent.as_bytes().get(..ANSWER_MAX), "{a:?} is not sent cut to the cap");
                assert!(
                    matches!(back, Ok(Progress::Done(Answer::Refused { .. }, n)) if n == again.len()),
                    "{a:?} cut to the cap reads back as {back:?}"
                );
            }
            _ => assert_eq!(back, Ok(Progress::Done(a.clone(), again.len())), "{a:?}"),
        }
        let _ = a.into_result();
    }
}

// ---------------------------------------------------------------- proxy credentials

/// `Proxy-Authorization` values: the input taken as a header value, and the input as a request
/// head (read in any split) whose header is then decoded. Credentials decoded from a value
/// encode to a value that decodes to them again.
pub fn check_proxy_auth(data: &[u8]) {
    check_credentials(data);
    let head = split_invariant(data, || HeadReader::new(http_head::DEFAULT_MAX_LEN), |r, buf| r.poll(buf).transpose());
    if let Some(Ok(head)) = head
        && let Some(value) = head.header("proxy-authorization")
    {
        check_credentials(value);
    }
}

fn check_credentials(value: &[u8]) {
    if let Ok(c) = proxy_auth::basic(value) {
        assert!(!c.user.contains(':'), "{c:?}");
        let again = proxy_auth::encode_basic(&c.user, &c.password);
        assert_eq!(proxy_auth::basic(again.as_bytes()), Ok(c), "{again}");
    }
}

mod http2;
pub use http2::{H2Event, SMALL_H2_LIMITS, check_http2_requests, h2_sent, h2_work_bound, normalise, normalise_counted};

#[cfg(test)]
mod tests {
    use super::*;

    /// The harness itself: a reader whose answer depends on how its input was cut is caught.
    #[test]
    #[should_panic(expected = "differs from the whole input")]
    fn a_split_dependent_reader_is_caught() {
        // Answers with the length of the first prefix it sees: right only when fed whole.
        split_invariant(b"abcdef", || (), |_, buf| Some(buf.len()));
    }

    /// A refusal whose reason is invalid UTF-8 up to the cap reads as U+FFFD, three bytes each,
    /// so the answer made of it again is cut to the cap: the check takes it as cut (it once
    /// demanded the cut answer read back whole, a failure AFL found in the harness, not the reader).
    #[test]
    fn a_refusal_grown_past_the_cap_by_lossy_decoding_is_checked_as_cut() {
        let payload: Vec<u8> = b"refused\n".iter().copied().chain(std::iter::repeat_n(0xff, ANSWER_MAX - 8)).collect();
        let len = u16::try_from(payload.len()).unwrap_or(u16::MAX).to_be_bytes();
        let wire: Vec<u8> = [crate::tunnel::quic::STATUS_REFUSED].iter().chain(&len).chain(&payload).copied().collect();
        let Ok(Progress::Done(Answer::Refused { reason, .. }, _)) = Answer::read(&wire) else {
            panic!("not a refusal")
        };
        assert_eq!(reason.len(), 3 * (ANSWER_MAX - 8));
        check_quic_stream(&wire);
    }

    /// The QUIC target's seeds (RFC 9001 Appendix A, quinn's) reach the hello in both modes,
    /// the cut ones over several packets with a piece repeated.
    #[test]
    fn quic_seeds_reach_the_hello() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/quic_initial");
        for (name, sni) in [
            ("rfc9001_a2.bin", "example.com"),
            ("rfc9001_a2_hello.bin", "example.com"),
            ("rfc9001_a2_hello_cut.bin", "example.com"),
            ("rfc9001_a2_hello_v2.bin", "example.com"),
            ("quinn_default.bin", "a.quic.example"),
            ("quinn_default_hello.bin", "a.quic.example"),
            ("quinn_mlkem.bin", "a.quic.example"),
            ("quinn_mlkem_hello.bin", "a.quic.example"),
        ] {
            let seed = std::fs::read(dir.join(name)).unwrap();
            match check_quic_initial(&seed) {
                Some(Ok(client_hello::Status::Complete(info))) => assert_eq!(info.sni.as_deref(), Some(sni), "{name}"),
                other => panic!("{name}: {other:?}"),
            }
        }
        let seed = std::fs::read(dir.join("rfc9001_a2_hello_cut.bin")).unwrap();
        let n = usize::from(u16::from_be_bytes([seed[1], seed[2]]));
        let msg = &seed[3 + n..];
        let packets = quic_layout(msg, &seed[3..3 + n]);
        // The smallest piece is 41 bytes: one was sent twice.
        let total: usize = packets.iter().map(Vec::len).sum();
        assert!(packets.len() >= 3 && total > msg.len() + 41, "{packets:?}");
    }

    #[test]
    fn splits_end_at_the_whole_input_and_grow() {
        for data in [&b""[..], b"x", &[7u8; 300], &[1u8; 100]] {
            for cuts in splits(data) {
                assert_eq!(cuts.last(), Some(&data.len()));
                assert!(cuts.windows(2).all(|w| w[0] < w[1]), "{cuts:?}");
            }
        }
    }
}
