//! Tests for the PROXY protocol reader/writer against real haproxy/curl captures and haproxy itself.

use proxy_wire::proxy_protocol::*;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

fn fixture(name: &str) -> Vec<u8> {
    let p = format!("{}/tests/fixtures/pp/{name}.bin", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&p).unwrap_or_else(|e| panic!("{p}: {e}"))
}

/// Every PROXY fixture; each also exists as `<name>.with_payload` (header + what followed).
const PP_FIXTURES: &[&str] = &[
    "pp_v2_haproxy_tcp4",
    "pp_v2_haproxy_tlvs_crc",
    "pp_v2_haproxy_ssl_nested",
    "pp_v2_haproxy_tcp6_crc",
    "pp_v2_haproxy_check_local",
    "pp_v1_haproxy_tcp4",
    "pp_v1_haproxy_tcp6",
    "pp_v1_haproxy_check",
    "pp_v1_curl_tcp4",
    "pp_v1_curl_tcp6",
];

const SNI: &str = "kube-apiserver.shoot--a.svc.cluster.local";

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// Addresses of a v1 fixture read with plain string splitting, independent of the parser.
fn v1_expected(raw: &[u8]) -> (SocketAddr, SocketAddr) {
    let line = std::str::from_utf8(raw).unwrap().trim_end();
    let f: Vec<&str> = line.split(' ').collect();
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    (SocketAddr::new(ip(f[2]), f[4].parse().unwrap()), SocketAddr::new(ip(f[3]), f[5].parse().unwrap()))
}

/// Parse a known-good input the way a server would: every prefix is "need more", and the
/// full header gives one result, also when payload follows.
fn parse_incrementally(header: &[u8], with_payload: &[u8]) -> ProxyHeader {
    let full = parse(header).unwrap().expect("complete header");
    assert_eq!(full.len, header.len());
    for i in 0..header.len() {
        // Split point: prefix, then everything.
        assert_eq!(parse(&header[..i]), Ok(None), "prefix of {i} bytes");
        assert_eq!(parse(header).unwrap().as_ref(), Some(&full));
    }
    // Byte-by-byte through the stream that carries payload.
    let mut got = None;
    for i in 1..=with_payload.len() {
        match parse(&with_payload[..i]).unwrap() {
            None => assert!(i < header.len(), "incomplete at {i} after header end"),
            Some(h) => {
                assert_eq!(i, header.len(), "header must complete exactly at its end");
                got = Some(h);
                break;
            }
        }
    }
    assert_eq!(got.as_ref(), Some(&full));
    assert_eq!(parse(with_payload).unwrap().as_ref(), Some(&full));
    full
}

#[test]
fn every_fixture_every_prefix_then_identical_result() {
    for name in PP_FIXTURES {
        let h = fixture(name);
        let s = fixture(&format!("{name}.with_payload"));
        assert!(s.starts_with(&h), "{name}");
        let parsed = parse_incrementally(&h, &s);
        assert_eq!(parsed.len, h.len(), "{name}");
        assert_eq!(detect(&h), if h[0] == b'P' { Detect::ProxyV1 } else { Detect::ProxyV2 });
    }
}

#[test]
fn payload_starts_at_len() {
    for name in PP_FIXTURES {
        let s = fixture(&format!("{name}.with_payload"));
        let h = parse(&s).unwrap().unwrap();
        let payload = &s[h.len..];
        if name.contains("check") {
            assert!(payload.is_empty(), "{name}: health checks send no payload");
        } else {
            assert!(payload.starts_with(b"GET / HTTP/1.1\r\n"), "{name}");
        }
    }
}

#[test]
fn haproxy_v2_tcp4() {
    let raw = fixture("pp_v2_haproxy_tcp4");
    let h = parse(&raw).unwrap().unwrap();
    let port = |i: usize| u16::from_be_bytes([raw[i], raw[i + 1]]);
    assert_eq!(h.version, 2);
    assert_eq!(h.command, Command::Proxy);
    assert_eq!(h.transport, Transport::Tcp4);
    assert_eq!(h.source, Some(SocketAddr::from(([127, 0, 0, 1], port(24)))));
    assert_eq!(h.destination, Some(SocketAddr::from(([127, 0, 0, 1], port(26)))));
    assert!(h.tlvs.is_empty() && h.authority.is_none() && h.unique_id.is_none());
}

#[test]
fn haproxy_v2_authority_unique_id_crc() {
    let raw = fixture("pp_v2_haproxy_tlvs_crc");
    let h = parse(&raw).unwrap().unwrap();
    assert_eq!(h.transport, Transport::Tcp4);
    assert_eq!(h.authority.as_deref(), Some(SNI));
    // unique-id-format %{+X}o\ %ci:%cp_%fi:%fp_%Ts_%rt:%pid -> "7F000001:<hex port>_..."
    let uid = String::from_utf8(h.unique_id.clone().unwrap()).unwrap();
    assert!(uid.starts_with("7F000001:"), "{uid}");
    assert_eq!(uid.split('_').count(), 4, "{uid}");
    let types: Vec<u8> = h.tlvs.iter().map(|t| t.0).collect();
    // HAProxy writes CRC32C first.
    assert_eq!(types, [PP2_TYPE_CRC32C, PP2_TYPE_AUTHORITY, PP2_TYPE_UNIQUE_ID]);
    assert_eq!(h.tlvs[0].1.len(), 4);
}

#[test]
fn haproxy_v2_ssl_tlv_with_sub_tlvs() {
    let raw = fixture("pp_v2_haproxy_ssl_nested");
    let h = parse(&raw).unwrap().unwrap();
    let ssl = &h.tlvs.iter().find(|t| t.0 == PP2_TYPE_SSL).unwrap().1;
    assert_eq!(ssl[0] & 0x01, 0x01, "PP2_CLIENT_SSL set");
    // Walk sub-TLVs by hand: version (0x21) must say TLSv1.3.
    let mut subs = Vec::new();
    let mut i = 5;
    while i < ssl.len() {
        let l = usize::from(u16::from_be_bytes([ssl[i + 1], ssl[i + 2]]));
        subs.push((ssl[i], ssl[i + 3..i + 3 + l].to_vec()));
        i += 3 + l;
    }
    assert_eq!(i, ssl.len());
    assert!(subs.contains(&(0x21, b"TLSv1.3".to_vec())), "{subs:?}");
    assert!(subs.iter().any(|s| s.0 == 0x23), "cipher sub-TLV present");
}

#[test]
fn haproxy_v2_tcp6_with_crc() {
    let raw = fixture("pp_v2_haproxy_tcp6_crc");
    let h = parse(&raw).unwrap().unwrap();
    assert_eq!(h.transport, Transport::Tcp6);
    assert_eq!(h.source.unwrap().ip(), IpAddr::V6(Ipv6Addr::LOCALHOST));
    assert_eq!(h.destination.unwrap().ip(), IpAddr::V6(Ipv6Addr::LOCALHOST));
    assert_eq!(h.tlvs.len(), 1);
    assert_eq!(h.tlvs[0].0, PP2_TYPE_CRC32C);
}

#[test]
fn haproxy_health_check_is_local_without_addresses() {
    let raw = fixture("pp_v2_haproxy_check_local");
    let h = parse(&raw).unwrap().unwrap();
    assert_eq!(h.command, Command::Local);
    assert_eq!(h.transport, Transport::Unspec);
    assert_eq!((h.source, h.destination), (None, None));
    // LOCAL + UNSPEC still carries a (valid) CRC32C TLV right after the fixed block.
    assert_eq!(h.tlvs.len(), 1);
    assert_eq!(h.tlvs[0].0, PP2_TYPE_CRC32C);
}

#[test]
fn v1_fixtures_match_text() {
    for name in
        ["pp_v1_haproxy_tcp4", "pp_v1_haproxy_tcp6", "pp_v1_haproxy_check", "pp_v1_curl_tcp4", "pp_v1_curl_tcp6"]
    {
        let raw = fixture(name);
        let h = parse(&raw).unwrap().unwrap();
        let (s, d) = v1_expected(&raw);
        assert_eq!(h.version, 1);
        assert_eq!(h.command, Command::Proxy);
        assert_eq!(h.transport, if s.is_ipv4() { Transport::Tcp4 } else { Transport::Tcp6 });
        assert_eq!((h.source, h.destination), (Some(s), Some(d)), "{name}");
    }
}

#[test]
fn detect_rejects_on_first_differing_byte() {
    assert_eq!(detect(b""), Detect::Incomplete);
    assert_eq!(detect(&[0x16]), Detect::NotProxy, "TLS handshake record");
    assert_eq!(detect(b"C"), Detect::NotProxy, "CONNECT");
    assert_eq!(detect(b"G"), Detect::NotProxy);
    assert_eq!(parse(&[0x16, 0x03, 0x01]), Err(ProxyError::BadSignature));
    let v1 = b"PROXY ";
    for sig in [v1.as_slice(), V2_SIGNATURE.as_slice()] {
        for i in 0..sig.len() {
            assert_eq!(detect(&sig[..i]), Detect::Incomplete, "prefix {i}");
            assert_eq!(parse(&sig[..i]), Ok(None));
            let mut bad = sig[..=i].to_vec();
            bad[i] ^= 0x80;
            assert_eq!(detect(&bad), Detect::NotProxy, "byte {i} off");
            assert_eq!(parse(&bad), Err(ProxyError::BadSignature), "byte {i} off");
            assert_eq!(parse(&bad).unwrap_err().reason(), "pp_bad_signature");
        }
    }
    assert_eq!(detect(b"PROXY "), Detect::ProxyV1);
    assert_eq!(detect(V2_SIGNATURE), Detect::ProxyV2);
    // "PROXY" without the space could still be a v1 header.
    assert_eq!(detect(b"PROXY"), Detect::Incomplete);
    assert_eq!(detect(b"PROXYX"), Detect::NotProxy);
}

#[test]
fn v1_length_limit() {
    // Longest possible real line: 104 bytes.
    let max =
        "PROXY TCP6 ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff 65535 65535\r\n";
    assert_eq!(parse(max.as_bytes()).unwrap().unwrap().len, max.len());

    // 107 bytes without CRLF: rejected right there, without waiting for more.
    let mut long = b"PROXY UNKNOWN ".to_vec();
    long.resize(V1_MAX_LEN - 1, b'x');
    assert_eq!(parse(&long), Ok(None));
    long.push(b'x');
    assert_eq!(parse(&long), Err(ProxyError::V1TooLong));
    assert_eq!(parse(&long).unwrap_err().reason(), "pp_v1_too_long");
    // A CR as byte 107 means the line would be 108 bytes.
    let mut cr_last = long[..V1_MAX_LEN - 1].to_vec();
    cr_last.push(b'\r');
    assert_eq!(parse(&cr_last), Err(ProxyError::V1TooLong));
    // Exactly 107 bytes including CRLF is allowed (UNKNOWN ignores the rest of the line).
    let mut exact = long[..V1_MAX_LEN - 2].to_vec();
    exact.extend_from_slice(b"\r\n");
    let h = parse(&exact).unwrap().unwrap();
    assert_eq!((h.len, h.transport, h.source), (V1_MAX_LEN, Transport::Unspec, None));
}

#[test]
fn v1_unknown_ignores_rest_of_line() {
    for line in [
        "PROXY UNKNOWN\r\n",
        "PROXY UNKNOWN ffff:f::f 1.2.3.4 1 2\r\n",
        // ppp alone rejects this (more than four trailing fields).
        "PROXY UNKNOWN a b c d e f g\r\n",
    ] {
        let h = parse(line.as_bytes()).unwrap().unwrap();
        assert_eq!(h.transport, Transport::Unspec, "{line}");
        assert_eq!((h.source, h.destination), (None, None));
        assert_eq!(h.command, Command::Proxy);
    }
}

#[test]
fn v1_malformed_fields() {
    let bad = [
        "PROXY TCP4 256.1.1.1 1.2.3.4 1 2\r\n",
        "PROXY TCP4 1.2.3.4 1.2.3.4 65536 2\r\n",
        "PROXY TCP4 1.2.3.4 1.2.3.4 1 99999\r\n",
        "PROXY TCP4 1.2.3.4 1.2.3.4 080 2\r\n",
        "PROXY TCP4 01.2.3.4 1.2.3.4 1 2\r\n",
        "PROXY TCP4 ::1 ::1 1 2\r\n",
        "PROXY TCP6 1.2.3.4 1.2.3.4 1 2\r\n",
        "PROXY TCP6 fe80::1%eth0 ::1 1 2\r\n",
        "PROXY  TCP4 1.2.3.4 1.2.3.4 1 2\r\n",
        "PROXY TCP4  1.2.3.4 1.2.3.4 1 2\r\n",
        "PROXY TCP4 1.2.3.4 1.2.3.4 1  2\r\n",
        "PROXY TCP4 1.2.3.4 1.2.3.4 1 2 \r\n",
        "PROXY TCP4 1.2.3.4 1.2.3.4 1 2 3\r\n",
        "PROXY TCP4 1.2.3.4 1.2.3.4 1\r\n",
        "PROXY TCP4 1.2.3.4 1.2.3.4 +1 2\r\n", // ppp accepts "+1"; we do not
        "PROXY TCP4 1.2.3.4 1.2.3.4 1 +2\r\n",
        "PROXY TCP4 1.2.3.4 1.2.3.4 -1 2\r\n",
        "PROXY tcp4 1.2.3.4 1.2.3.4 1 2\r\n",
        "PROXY TCP5 1.2.3.4 1.2.3.4 1 2\r\n",
        "PROXY UDP4 1.2.3.4 1.2.3.4 1 2\r\n",
        "PROXY UNKNOWNX\r\n",
        "PROXY \r\n",
        "PROXY TCP4\r\n",
        "PROXY TCP4 1.2.3.4\t1.2.3.4 1 2\r\n",
    ];
    for line in bad {
        let e = parse(line.as_bytes()).unwrap_err();
        assert_eq!(e.reason(), "pp_v1_malformed", "{line:?} gave {e:?}");
    }
    // CR not followed by LF: decided on the byte after the CR.
    assert_eq!(parse(b"PROXY TCP4 1.2.3.4 1.2.3.4 1 2\r"), Ok(None));
    assert_eq!(parse(b"PROXY TCP4 1.2.3.4 1.2.3.4 1 2\rX").unwrap_err().reason(), "pp_v1_malformed");
    // Non-printable byte before any CRLF: rejected early.
    assert_eq!(parse(b"PROXY TCP4 1.2.3.4\x00").unwrap_err(), ProxyError::V1Malformed("non-printable byte"));
    // Port 0 and the full range are fine.
    let h = parse(b"PROXY TCP4 1.2.3.4 5.6.7.8 0 65535\r\n").unwrap().unwrap();
    assert_eq!(h.source, Some(sa("1.2.3.4:0")));
    assert_eq!(h.destination, Some(sa("5.6.7.8:65535")));
}

/// v2 header from parts, with a correct length field.
fn v2(ver_cmd: u8, fam: u8, body: &[u8]) -> Vec<u8> {
    let mut v = V2_SIGNATURE.to_vec();
    v.push(ver_cmd);
    v.push(fam);
    v.extend_from_slice(&u16::try_from(body.len()).unwrap().to_be_bytes());
    v.extend_from_slice(body);
    v
}

fn tlv(t: u8, value: &[u8]) -> Vec<u8> {
    let mut v = vec![t];
    v.extend_from_slice(&u16::try_from(value.len()).unwrap().to_be_bytes());
    v.extend_from_slice(value);
    v
}

const ADDR4: [u8; 12] = [192, 0, 2, 1, 198, 51, 100, 2, 0x9c, 0x40, 0x01, 0xbb];

#[test]
fn v2_bad_version_command_family_decided_early() {
    let mut h = v2(0x21, 0x11, &ADDR4);
    h[12] = 0x11;
    assert_eq!(parse(&h[..13]), Err(ProxyError::BadVersion(1)));
    h[12] = 0x31;
    assert_eq!(parse(&h[..13]).unwrap_err().reason(), "pp_bad_version");
    h[12] = 0x22;
    assert_eq!(parse(&h[..13]), Err(ProxyError::BadCommand(2)));
    assert_eq!(parse(&h).unwrap_err().reason(), "pp_bad_command");
    h[12] = 0x2f;
    assert_eq!(parse(&h).unwrap_err().reason(), "pp_bad_command");
    h[12] = 0x21;
    // ppp accepts 0x01, 0x02, 0x10, 0x20, 0x30; the spec does not.
    for fam in [0x01u8, 0x02, 0x03, 0x10, 0x13, 0x20, 0x23, 0x30, 0x33, 0x41, 0x51, 0xff] {
        h[13] = fam;
        assert_eq!(parse(&h[..14]), Err(ProxyError::BadFamily(fam)), "{fam:#x}");
        assert_eq!(parse(&h).unwrap_err().reason(), "pp_bad_family");
    }
}

#[test]
fn v2_length_smaller_than_address_block() {
    for (fam, need) in [(0x11u8, 12usize), (0x12, 12), (0x21, 36), (0x22, 36), (0x31, 216), (0x32, 216)] {
        let h = v2(0x21, fam, &vec![0; need - 1]);
        // Rejected as soon as the length field is in, not after the body.
        let e = parse(&h[..16]).unwrap_err();
        assert_eq!(e, ProxyError::V2BadLength { declared: u16::try_from(need - 1).unwrap(), required: need });
        assert_eq!(e.reason(), "pp_v2_bad_length");
        assert!(parse(&v2(0x21, fam, &vec![0; need])).unwrap().is_some());
    }
}

#[test]
fn v2_unspec_unix_udp_local() {
    // UNSPEC + PROXY: accepted, no addresses, TLVs start right after the fixed block.
    let h = parse(&v2(0x21, 0x00, &tlv(PP2_TYPE_AUTHORITY, b"a.example"))).unwrap().unwrap();
    assert_eq!((h.command, h.transport, h.source), (Command::Proxy, Transport::Unspec, None));
    assert_eq!(h.authority.as_deref(), Some("a.example"));
    // UNIX: accepted, addresses not decoded.
    let h = parse(&v2(0x21, 0x31, &[b'x'; 216])).unwrap().unwrap();
    assert_eq!((h.transport, h.source, h.destination), (Transport::Unix, None, None));
    // UDP4: addresses decoded.
    let h = parse(&v2(0x21, 0x12, &ADDR4)).unwrap().unwrap();
    assert_eq!(h.transport, Transport::Udp4);
    assert_eq!(h.source, Some(sa("192.0.2.1:40000")));
    assert_eq!(h.destination, Some(sa("198.51.100.2:443")));
    let h = parse(&v2(0x21, 0x22, &[1; 36])).unwrap().unwrap();
    assert_eq!(h.transport, Transport::Udp6);
    // LOCAL with a real address block: the addresses are ignored.
    let h = parse(&v2(0x20, 0x11, &ADDR4)).unwrap().unwrap();
    assert_eq!((h.command, h.transport, h.source), (Command::Local, Transport::Tcp4, None));
    // Our LOCAL writer.
    let l = encode_v2_local();
    let h = parse(&l).unwrap().unwrap();
    assert_eq!((h.command, h.transport, h.len), (Command::Local, Transport::Unspec, 16));
    // Same bytes haproxy's health check sends, minus its CRC TLV.
    let hc = fixture("pp_v2_haproxy_check_local");
    assert_eq!(l[..14], hc[..14]);
}

#[test]
fn v2_max_length_header_is_fine() {
    // Declared length 65535 (address block + one NOOP TLV filling the rest).
    let mut body = ADDR4.to_vec();
    body.extend(tlv(PP2_TYPE_NOOP, &vec![0xAA; 65535 - 12 - 3]));
    let h = v2(0x21, 0x11, &body);
    assert_eq!(h.len(), V2_MAX_LEN);
    for i in (0..h.len()).step_by(97).chain(h.len() - 3..h.len()) {
        assert_eq!(parse(&h[..i]), Ok(None), "{i}");
    }
    let mut with_payload = h.clone();
    with_payload.extend_from_slice(b"payload");
    let p = parse(&with_payload).unwrap().unwrap();
    assert_eq!(p.len, V2_MAX_LEN);
    assert_eq!(p.tlvs[0].1.len(), 65520);
}

#[test]
fn v2_tlv_overruns() {
    // TLV claims more than the header holds.
    let mut t = tlv(PP2_TYPE_NOOP, b"abcd");
    t[2] = 5;
    let mut body = ADDR4.to_vec();
    body.extend(&t);
    assert_eq!(parse(&v2(0x21, 0x11, &body)), Err(ProxyError::TlvOverrun { tlv_type: PP2_TYPE_NOOP, nested: false }));
    // One or two stray bytes: not even a TLV head.
    for extra in [&[0x04u8][..], &[0x04, 0x00]] {
        let mut body = ADDR4.to_vec();
        body.extend_from_slice(extra);
        let e = parse(&v2(0x21, 0x11, &body)).unwrap_err();
        assert_eq!(e.reason(), "pp_tlv_overrun");
    }
    // Nested: SSL TLV whose sub-TLV runs past the SSL TLV (but not past the header).
    let mut sub = tlv(0x21, b"TLSv1.3");
    sub[2] = 20;
    let mut ssl = vec![0x01, 0, 0, 0, 0];
    ssl.extend(&sub);
    let mut body = ADDR4.to_vec();
    body.extend(tlv(PP2_TYPE_SSL, &ssl));
    body.extend(tlv(PP2_TYPE_NOOP, &[0; 32]));
    let e = parse(&v2(0x21, 0x11, &body)).unwrap_err();
    assert_eq!(e, ProxyError::TlvOverrun { tlv_type: 0x21, nested: true });
    assert_eq!(e.reason(), "pp_tlv_overrun");
    // SSL TLV too short for its fixed part.
    let mut body = ADDR4.to_vec();
    body.extend(tlv(PP2_TYPE_SSL, &[1, 0, 0]));
    assert_eq!(parse(&v2(0x21, 0x11, &body)).unwrap_err().reason(), "pp_tlv_bad_value");
    // Overrun in the haproxy fixture: grow the last TLV's length by one.
    let mut raw = fixture("pp_v2_haproxy_tlvs_crc");
    let uid_at = raw.len() - 46 - 3;
    assert_eq!(raw[uid_at], PP2_TYPE_UNIQUE_ID);
    raw[uid_at + 2] += 1;
    assert_eq!(parse(&raw), Err(ProxyError::TlvOverrun { tlv_type: PP2_TYPE_UNIQUE_ID, nested: false }));
}

#[test]
fn v2_special_tlv_values() {
    let with = |tlvs: &[Vec<u8>]| {
        let mut body = ADDR4.to_vec();
        for t in tlvs {
            body.extend(t);
        }
        parse(&v2(0x21, 0x11, &body))
    };
    assert!(with(&[tlv(PP2_TYPE_UNIQUE_ID, &[7; 128])]).unwrap().is_some());
    assert_eq!(with(&[tlv(PP2_TYPE_UNIQUE_ID, &[7; 129])]), Err(ProxyError::UniqueIdTooLong(129)));
    assert_eq!(with(&[tlv(PP2_TYPE_AUTHORITY, b"\xff\xfe")]).unwrap_err().reason(), "pp_tlv_bad_value");
    assert_eq!(with(&[tlv(PP2_TYPE_AUTHORITY, &[b'a'; 256])]).unwrap_err().reason(), "pp_tlv_bad_value");
    assert_eq!(with(&[tlv(PP2_TYPE_CRC32C, &[0; 3])]).unwrap_err().reason(), "pp_tlv_bad_value");
    assert_eq!(
        with(&[tlv(PP2_TYPE_AUTHORITY, b"a"), tlv(PP2_TYPE_AUTHORITY, b"b")]),
        Err(ProxyError::TlvDuplicate(PP2_TYPE_AUTHORITY))
    );
    assert_eq!(
        with(&[tlv(PP2_TYPE_CRC32C, &[0; 4]), tlv(PP2_TYPE_CRC32C, &[0; 4])]),
        Err(ProxyError::TlvDuplicate(PP2_TYPE_CRC32C))
    );
    // Unknown and repeated ordinary TLVs are kept in order.
    let h = with(&[tlv(0xE0, b"x"), tlv(0xE0, b"y"), tlv(PP2_TYPE_NETNS, b"ns")]).unwrap().unwrap();
    assert_eq!(h.tlvs, vec![(0xE0, b"x".to_vec()), (0xE0, b"y".to_vec()), (0x30, b"ns".to_vec())]);
}

#[test]
fn crc_mismatch_on_any_flipped_byte() {
    for name in
        ["pp_v2_haproxy_tlvs_crc", "pp_v2_haproxy_tcp6_crc", "pp_v2_haproxy_ssl_nested", "pp_v2_haproxy_check_local"]
    {
        let raw = fixture(name);
        assert!(parse(&raw).unwrap().is_some());
        // Flip each byte after the fixed block (addresses, TLV values, the CRC itself):
        // the CRC must catch whatever the TLV walk does not.
        for i in 16..raw.len() {
            let mut bad = raw.clone();
            bad[i] ^= 0x01;
            let e = parse(&bad).expect_err(&format!("{name}: flip at {i} accepted"));
            assert!(
                matches!(
                    e,
                    ProxyError::CrcMismatch { .. }
                        | ProxyError::TlvOverrun { .. }
                        | ProxyError::TlvBadValue { .. }
                        | ProxyError::TlvDuplicate(_)
                        | ProxyError::UniqueIdTooLong(_)
                ),
                "{name} {i}: {e:?}"
            );
        }
        // A flip in the address block is only caught by the CRC.
        if name != "pp_v2_haproxy_check_local" {
            let mut bad = raw.clone();
            bad[17] ^= 0xff;
            let e = parse(&bad).unwrap_err();
            assert!(matches!(e, ProxyError::CrcMismatch { .. }), "{e:?}");
            assert_eq!(e.reason(), "pp_crc_mismatch");
        }
    }
}

#[test]
fn encode_v1_roundtrip() {
    for (s, d, t) in [
        ("192.0.2.1:40000", "198.51.100.2:443", Transport::Tcp4),
        ("[2001:db8::1]:1", "[2001:db8::2]:65535", Transport::Tcp6),
    ] {
        let b = encode_v1(sa(s), sa(d));
        let h = parse(&b).unwrap().unwrap();
        assert_eq!((h.source, h.destination, h.transport), (Some(sa(s)), Some(sa(d)), t));
        assert_eq!(h.len, b.len());
    }
    assert_eq!(
        encode_v1(sa("192.0.2.1:40000"), sa("198.51.100.2:443")),
        b"PROXY TCP4 192.0.2.1 198.51.100.2 40000 443\r\n"
    );
    // Mixed families: the IPv4 side becomes IPv4-mapped IPv6.
    let b = encode_v1(sa("192.0.2.1:5"), sa("[2001:db8::2]:6"));
    assert_eq!(b, b"PROXY TCP6 ::ffff:192.0.2.1 2001:db8::2 5 6\r\n");
    let h = parse(&b).unwrap().unwrap();
    assert_eq!(h.source.unwrap().ip(), IpAddr::V6(Ipv4Addr::new(192, 0, 2, 1).to_ipv6_mapped()));
}

#[test]
fn encode_v2_roundtrip_and_ppp_agrees() {
    let ssl = {
        let mut v = vec![1, 0, 0, 0, 0];
        v.extend(tlv(0x21, b"TLSv1.3"));
        v
    };
    let extra: [(u8, &[u8]); 2] = [(PP2_TYPE_SSL, &ssl), (0xE1, b"custom")];
    let pairs = [
        (sa("192.0.2.1:40000"), sa("198.51.100.2:443")),
        (sa("[2001:db8::1]:1"), sa("[2001:db8::2]:6443")),
        (sa("192.0.2.1:40000"), sa("[2001:db8::2]:6443")),
    ];
    let options = [
        V2Options::default(),
        V2Options { crc32c: true, ..Default::default() },
        V2Options { authority: Some(SNI), unique_id: Some(b"req-1"), crc32c: true, extra_tlvs: &extra },
        V2Options { authority: Some(SNI), unique_id: Some(&[9; 128]), crc32c: false, extra_tlvs: &extra },
    ];
    for (s, d) in pairs {
        for o in &options {
            let b = encode_v2(s, d, o);
            let h = parse_incrementally(&b, &[b.as_slice(), b"\x16\x03\x01"].concat());
            let (es, ed) = if s.is_ipv4() == d.is_ipv4() {
                (s, d)
            } else {
                let m = |a: SocketAddr| match a.ip() {
                    IpAddr::V4(v4) => SocketAddr::new(IpAddr::V6(v4.to_ipv6_mapped()), a.port()),
                    IpAddr::V6(_) => a,
                };
                (m(s), m(d))
            };
            assert_eq!((h.source, h.destination), (Some(es), Some(ed)));
            assert_eq!(h.transport, if es.is_ipv4() { Transport::Tcp4 } else { Transport::Tcp6 });
            assert_eq!(h.authority.as_deref(), o.authority);
            assert_eq!(h.unique_id.as_deref(), o.unique_id);
            assert_eq!(h.tlvs.iter().any(|t| t.0 == PP2_TYPE_CRC32C), o.crc32c);
            let others: Vec<(u8, &[u8])> = h
                .tlvs
                .iter()
                .filter(|t| !matches!(t.0, PP2_TYPE_CRC32C | PP2_TYPE_AUTHORITY | PP2_TYPE_UNIQUE_ID))
                .map(|t| (t.0, t.1.as_slice()))
                .collect();
            assert_eq!(others, o.extra_tlvs);

            // ppp's own parser reads the same header.
            let p = ppp::v2::Header::try_from(b.as_slice()).unwrap();
            assert_eq!(p.len(), b.len());
            assert_eq!(p.tlvs().count(), h.tlvs.len());
            assert!(p.tlvs().all(|t| t.is_ok()));
            match p.addresses {
                ppp::v2::Addresses::IPv4(a) => {
                    assert_eq!(SocketAddr::from((a.source_address, a.source_port)), es)
                }
                ppp::v2::Addresses::IPv6(a) => {
                    assert_eq!(SocketAddr::from((a.source_address, a.source_port)), es)
                }
                other => panic!("{other:?}"),
            }
        }
    }
}

#[test]
fn encode_v2_rejects_what_parse_rejects() {
    let (s, d) = (sa("192.0.2.1:1"), sa("192.0.2.2:2"));
    let e = |o: V2Options<'_>| try_encode_v2(s, d, &o).unwrap_err().reason();
    assert_eq!(e(V2Options { unique_id: Some(&[0; 129]), ..Default::default() }), "pp_unique_id_too_long");
    let long = "a".repeat(256);
    assert_eq!(e(V2Options { authority: Some(&long), ..Default::default() }), "pp_tlv_bad_value");
    assert_eq!(
        e(V2Options { crc32c: true, extra_tlvs: &[(PP2_TYPE_CRC32C, &[0; 4])], ..Default::default() }),
        "pp_tlv_duplicate"
    );
    assert_eq!(
        e(V2Options { authority: Some("a"), extra_tlvs: &[(PP2_TYPE_AUTHORITY, b"b")], ..Default::default() }),
        "pp_tlv_duplicate"
    );
    let big = vec![0u8; 65535];
    assert_eq!(e(V2Options { extra_tlvs: &[(0xE0, &big)], ..Default::default() }), "pp_v2_too_long");
    // Largest TLV that fits: 65535 - 12 (addresses) - 3 (TLV head).
    let fits = vec![0u8; 65520];
    let b = try_encode_v2(s, d, &V2Options { extra_tlvs: &[(0xE0, &fits)], ..Default::default() }).unwrap();
    assert_eq!(b.len(), V2_MAX_LEN);
    assert_eq!(parse(&b).unwrap().unwrap().len, V2_MAX_LEN);
}

/// SSL TLVs parse refuses are refused by the encoder with the same error; good ones round-trip.
#[test]
fn encode_v2_ssl_tlv_agrees_with_parse() {
    let (s, d) = (sa("192.0.2.1:1"), sa("192.0.2.2:2"));
    let mut overrun = vec![0x01, 0, 0, 0, 0];
    overrun.extend([0x21, 0x00, 0x09, b'T', b'L', b'S']);
    let bad: [&[u8]; 4] = [&[], &[1, 0, 0], &[1, 0, 0, 0, 0, 0x21], &overrun];
    for value in bad {
        let extra: [(u8, &[u8]); 1] = [(PP2_TYPE_SSL, value)];
        let err = try_encode_v2(s, d, &V2Options { extra_tlvs: &extra, ..Default::default() }).unwrap_err();
        // What parse says about the same bytes, written by hand.
        let mut raw = try_encode_v2(s, d, &V2Options::default()).unwrap();
        raw.push(PP2_TYPE_SSL);
        raw.extend((value.len() as u16).to_be_bytes());
        raw.extend(value);
        let len = (raw.len() - 16) as u16;
        raw[14..16].copy_from_slice(&len.to_be_bytes());
        assert_eq!(parse(&raw), Err(err), "{value:?}");
    }
    let mut good = vec![0x07, 0, 0, 0, 0];
    good.extend([0x21, 0x00, 0x07, b'T', b'L', b'S', b'v', b'1', b'.', b'3']);
    for value in [&[0x01, 0, 0, 0, 0][..], &good] {
        let extra: [(u8, &[u8]); 1] = [(PP2_TYPE_SSL, value)];
        let b = try_encode_v2(s, d, &V2Options { extra_tlvs: &extra, ..Default::default() }).unwrap();
        let h = parse(&b).unwrap().unwrap();
        assert_eq!(h.tlvs, vec![(PP2_TYPE_SSL, value.to_vec())]);
        assert_eq!(h.len, b.len());
    }
}

#[test]
fn error_reasons_are_snake_case_labels() {
    let all = [
        ProxyError::BadSignature,
        ProxyError::V1TooLong,
        ProxyError::V1Malformed("x"),
        ProxyError::BadVersion(1),
        ProxyError::BadCommand(2),
        ProxyError::BadFamily(3),
        ProxyError::V2BadLength { declared: 1, required: 12 },
        ProxyError::V2TooLong(70000),
        ProxyError::TlvOverrun { tlv_type: 1, nested: true },
        ProxyError::TlvBadValue { tlv_type: 2, what: "x" },
        ProxyError::TlvDuplicate(3),
        ProxyError::CrcMismatch { expected: 1, computed: 2 },
        ProxyError::UniqueIdTooLong(129),
    ];
    let mut seen = std::collections::HashSet::new();
    for e in all {
        let r = e.reason();
        assert!(
            r.starts_with("pp_") && r.bytes().all(|b| b.is_ascii_lowercase() || b == b'_' || b.is_ascii_digit()),
            "{r}"
        );
        assert!(seen.insert(r), "duplicate label {r}");
        assert!(!e.to_string().is_empty());
    }
}

/// xorshift64: deterministic, dependency-free.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % u64::try_from(n.max(1)).unwrap()).unwrap()
    }
}

#[test]
fn mutation_loop_never_panics_and_stays_consistent() {
    let corpus: Vec<Vec<u8>> =
        PP_FIXTURES.iter().flat_map(|n| [fixture(n), fixture(&format!("{n}.with_payload"))]).collect();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut accepted = 0;
    for _ in 0..20_000 {
        let mut b = corpus[rng.below(corpus.len())].clone();
        for _ in 0..=rng.below(4) {
            let i = rng.below(b.len());
            match rng.below(6) {
                0 if !b.is_empty() => b[i] ^= 1 << rng.below(8),
                1 if !b.is_empty() => b[i] = rng.next() as u8,
                2 => b.truncate(i),
                3 => b.insert(i.min(b.len()), rng.next() as u8),
                4 if !b.is_empty() => {
                    b.remove(i);
                }
                // Length/type bytes are where parsers break: hit them often.
                _ if b.len() > 16 => b[12 + rng.below(4)] = rng.next() as u8,
                _ => {}
            }
        }
        let _ = detect(&b);
        let full = parse(&b);
        let cut = rng.below(b.len() + 1);
        let prefix = parse(&b[..cut]);
        match &full {
            Ok(Some(h)) => {
                accepted += 1;
                assert!(h.len <= b.len());
                assert!(h.version == 1 || h.version == 2);
                // The header is self-contained and every shorter prefix needs more bytes.
                assert_eq!(parse(&b[..h.len]).as_ref(), Ok(&Some(h.clone())));
                if cut < h.len {
                    assert_eq!(prefix, Ok(None), "prefix {cut} of accepted input");
                }
            }
            Ok(None) => assert_eq!(prefix, Ok(None), "prefix of incomplete input"),
            Err(e) => {
                // An error on a prefix must be the final answer (never an error unless certain).
                if let Err(pe) = &prefix {
                    assert_eq!(pe, e);
                }
                assert!(e.reason().starts_with("pp_"));
            }
        }
        // Errors on a prefix must persist however the input continues.
        if let Err(pe) = &prefix {
            assert_eq!(full.as_ref().err(), Some(pe), "prefix error not final: {b:?}");
        }
    }
    assert!(accepted > 100, "mutations too destructive to be useful: {accepted}");
}

// ---------------------------------------------------------------------------------------
// haproxy as the receiver: it must accept what we write (including CRC32C) and take the
// client address from our header.
// ---------------------------------------------------------------------------------------

mod haproxy {
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpListener, TcpStream};
    use std::process::{Child, Command, Stdio};
    use std::time::{Duration, Instant};

    pub(super) const BIN: &str = "/usr/sbin/haproxy";

    pub(super) struct Haproxy {
        child: Child,
        pub addr: SocketAddr,
        _dir: TempDir,
    }

    struct TempDir(std::path::PathBuf);
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    impl Drop for Haproxy {
        fn drop(&mut self) {
            // Kill exactly the process we started.
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    /// `None` when haproxy is absent and PP_SKIP_HAPROXY=1 says that is acceptable.
    pub(super) fn start() -> Option<Haproxy> {
        if !std::path::Path::new(BIN).exists() {
            if std::env::var_os("PP_SKIP_HAPROXY").is_some() {
                eprintln!("SKIPPED: {BIN} not installed (PP_SKIP_HAPROXY set)");
                return None;
            }
            panic!("{BIN} not installed: install haproxy or set PP_SKIP_HAPROXY=1 to skip this test");
        }
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let dir = std::env::temp_dir().join(format!("pp-haproxy-test-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = format!(
            r#"global
    nbthread 1
defaults
    mode http
    timeout connect 2s
    timeout client 5s
    timeout server 5s
frontend echo
    bind 127.0.0.1:{port} accept-proxy
    http-request return status 200 content-type text/plain lf-string "%[src] %[src_port] %[dst] %[dst_port] %[fc_pp_authority] %[fc_pp_unique_id]"
"#
        );
        let cfg_path = dir.join("haproxy.cfg");
        std::fs::write(&cfg_path, cfg).unwrap();
        let child = Command::new(BIN)
            .arg("-db")
            .arg("-f")
            .arg(&cfg_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn haproxy");
        let h = Haproxy { child, addr: SocketAddr::from(([127, 0, 0, 1], port)), _dir: TempDir(dir) };
        let deadline = Instant::now() + Duration::from_secs(10);
        // A bare connect+close is harmless to an accept-proxy frontend.
        while TcpStream::connect_timeout(&h.addr, Duration::from_millis(200)).is_err() {
            assert!(Instant::now() < deadline, "haproxy did not start");
            std::thread::sleep(Duration::from_millis(30));
        }
        Some(h)
    }

    /// Send `header` + a GET, return the response (empty if haproxy closed on us).
    pub(super) fn exchange(addr: SocketAddr, header: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut req = header.to_vec();
        req.extend_from_slice(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n");
        let _ = s.write_all(&req);
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    }

    pub(super) fn body(resp: &str) -> &str {
        assert!(resp.starts_with("HTTP/1.0 200") || resp.starts_with("HTTP/1.1 200"), "{resp:?}");
        resp.split("\r\n\r\n").nth(1).unwrap()
    }
}

#[test]
fn haproxy_accepts_our_headers() {
    let Some(hp) = haproxy::start() else { return };
    let (s, d) = (sa("192.0.2.10:40000"), sa("198.51.100.7:443"));

    // v2 with CRC32C, AUTHORITY and UNIQUE_ID: haproxy verifies the CRC and exposes the TLVs.
    let opts =
        V2Options { authority: Some(SNI), unique_id: Some(b"uid-123"), crc32c: true, extra_tlvs: &[(0xE0, b"x")] };
    let r = haproxy::exchange(hp.addr, &encode_v2(s, d, &opts));
    assert_eq!(haproxy::body(&r), format!("192.0.2.10 40000 198.51.100.7 443 {SNI} uid-123"));

    // v2 IPv6.
    let (s6, d6) = (sa("[2001:db8::1]:1234"), sa("[2001:db8::2]:6443"));
    let r = haproxy::exchange(hp.addr, &encode_v2(s6, d6, &V2Options { crc32c: true, ..Default::default() }));
    assert_eq!(haproxy::body(&r), "2001:db8::1 1234 2001:db8::2 6443  ");

    // v1.
    let r = haproxy::exchange(hp.addr, &encode_v1(s, d));
    assert_eq!(haproxy::body(&r), "192.0.2.10 40000 198.51.100.7 443  ");

    // Mixed families -> IPv4-mapped.
    let r = haproxy::exchange(hp.addr, &encode_v1(s, d6));
    assert_eq!(haproxy::body(&r), "::ffff:192.0.2.10 40000 2001:db8::2 6443  ");

    // LOCAL: haproxy keeps the real connection addresses.
    let r = haproxy::exchange(hp.addr, &encode_v2_local());
    assert!(haproxy::body(&r).starts_with("127.0.0.1 "), "{r}");

    // Control: haproxy really checks the CRC, so the passes above mean something.
    let mut bad = encode_v2(s, d, &opts);
    bad[16] ^= 1;
    let r = haproxy::exchange(hp.addr, &bad);
    assert!(!r.contains(" 200 "), "haproxy accepted a bad CRC: {r:?}");
    drop(hp);
}
