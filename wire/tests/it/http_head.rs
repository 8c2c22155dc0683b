//! Tests for the HTTP/1.x head readers (CONNECT / absolute-form requests against curl captures and hand-written heads; upstream response heads against httparse) and the response writers.

use proxy_wire::http_head::*;

fn fixture(name: &str) -> Vec<u8> {
    let p = format!("{}/tests/fixtures/pp/{name}.bin", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&p).unwrap_or_else(|e| panic!("{p}: {e}"))
}

const HEAD_FIXTURES: &[&str] = &[
    "http_connect_curl",
    "http_connect_curl_gardener_header",
    "http_connect_curl_http10_reversed_vpn",
    "http_connect_openvpn_http10",
    "http_connect_kube_apiserver_egress",
    "http_absolute_form_curl",
];

/// Start of a TLS ClientHello, as a client would pipeline after CONNECT.
const TLS_BYTES: &[u8] = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03";

/// One-shot parse: a fresh reader on the whole buffer.
fn parse_with(buf: &[u8], max_len: usize) -> Result<Option<RequestHead>, HeadError> {
    HeadReader::new(max_len).poll(buf)
}

fn parse(buf: &[u8]) -> Result<Option<RequestHead>, HeadError> {
    parse_with(buf, DEFAULT_MAX_LEN)
}

/// Every prefix is "need more" (fresh reader and one reader across calls), the end gives one
/// result, and trailing bytes are not part of it.
fn parse_incrementally(head: &[u8]) -> RequestHead {
    let full = parse(head).unwrap().expect("complete head");
    assert_eq!(full.len, head.len());
    let stream = [head, TLS_BYTES].concat();
    for i in 0..head.len() {
        // Split point: prefix then full, each with a fresh reader and with one reader across both calls.
        assert_eq!(parse(&head[..i]), Ok(None), "prefix {i}");
        assert_eq!(parse(&stream).unwrap().as_ref(), Some(&full));
        let mut r = HeadReader::new(DEFAULT_MAX_LEN);
        assert_eq!(r.poll(&stream[..i]), Ok(None));
        assert_eq!(r.poll(&stream).unwrap().as_ref(), Some(&full), "split at {i}");
    }
    // Byte by byte through one reader.
    let mut r = HeadReader::new(DEFAULT_MAX_LEN);
    for i in 1..=stream.len() {
        match r.poll(&stream[..i]).unwrap() {
            None => assert!(i < head.len()),
            Some(h) => {
                assert_eq!(i, head.len(), "complete exactly at the end of the head");
                assert_eq!(h, full);
                break;
            }
        }
    }
    assert_eq!(&stream[full.len..], TLS_BYTES);
    full
}

#[test]
fn every_fixture_every_prefix_then_identical_result() {
    for name in HEAD_FIXTURES {
        let h = parse_incrementally(&fixture(name));
        assert_eq!(looks_like_http(&fixture(name)), Detect3::Yes, "{name}");
        assert!(h.version <= 1);
    }
}

#[test]
fn curl_connect() {
    let h = parse_incrementally(&fixture("http_connect_curl"));
    assert_eq!((h.method.as_str(), h.target.as_str(), h.version), ("CONNECT", "example.test:443", 1));
    assert!(h.is_connect());
    assert_eq!(h.connect_authority(), Ok(("example.test".to_owned(), 443)));
    assert_eq!(h.header("host"), Some(&b"example.test:443"[..]));
    assert_eq!(h.header("PROXY-CONNECTION"), Some(&b"Keep-Alive"[..]));
    assert!(h.header("user-agent").unwrap().starts_with(b"curl/"));
    assert_eq!(h.header("absent"), None);
    assert_eq!(h.headers[0].0, "Host", "case preserved");
    assert_eq!(h.absolute_form().unwrap_err().reason(), "head_bad_target");
}

#[test]
fn curl_connect_gardener_header() {
    let h = parse_incrementally(&fixture("http_connect_curl_gardener_header"));
    assert_eq!(h.connect_authority(), Ok(("kube-apiserver.shoot--a.svc.cluster.local".to_owned(), 443)));
    assert_eq!(
        h.header("x-gardener-destination"),
        Some(&b"outbound|443||kube-apiserver.shoot--a.svc.cluster.local"[..])
    );
}

#[test]
fn http10_connect_reversed_vpn() {
    for name in ["http_connect_curl_http10_reversed_vpn", "http_connect_openvpn_http10"] {
        let h = parse_incrementally(&fixture(name));
        assert_eq!(h.version, 0, "{name}");
        assert_eq!(h.connect_authority(), Ok(("vpn-seed-server".to_owned(), 1194)));
        assert_eq!(h.header("Reversed-VPN"), Some(&b"outbound|1194||vpn-seed-server.shoot--a.svc.cluster.local"[..]));
        assert!(connect_established(h.version).starts_with(b"HTTP/1.0 200 "));
    }
}

#[test]
fn kube_apiserver_egress_connect() {
    let h = parse_incrementally(&fixture("http_connect_kube_apiserver_egress"));
    assert_eq!(h.connect_authority(), Ok(("10.250.0.5".to_owned(), 10250)));
    // The Host header is not the tunnel target; the request-target is.
    assert_eq!(h.header("host"), Some(&b"127.0.0.1"[..]));
    assert_eq!(h.headers.len(), 1);
}

#[test]
fn curl_absolute_form() {
    let h = parse_incrementally(&fixture("http_absolute_form_curl"));
    assert_eq!((h.method.as_str(), h.target.as_str()), ("GET", "http://10.0.0.1:9100/metrics"));
    assert!(!h.is_connect());
    assert_eq!(h.absolute_form(), Ok(("10.0.0.1".to_owned(), 9100, "/metrics".to_owned())));
    assert_eq!(h.connect_authority(), Err(HeadError::NotConnect));
}

fn head_with_target(method: &str, target: &str) -> RequestHead {
    let raw = format!("{method} {target} HTTP/1.1\r\nHost: x\r\n\r\n");
    parse(raw.as_bytes()).unwrap().unwrap()
}

#[test]
fn connect_authority_forms() {
    let ok = |t: &str| head_with_target("CONNECT", t).connect_authority();
    assert_eq!(ok("[::1]:443"), Ok(("::1".to_owned(), 443)));
    assert_eq!(ok("[2001:db8::5]:6443"), Ok(("2001:db8::5".to_owned(), 6443)));
    assert_eq!(ok("a_b.svc:65535"), Ok(("a_b.svc".to_owned(), 65535)));
    for bad in [
        "example.test",   // no port
        "example.test:",  // empty port
        "example.test:0", // port 0
        "example.test:65536",
        "example.test:+443",
        "example.test:44a",
        ":443",
        "[::1]",
        "[::1]443",
        "[::1:443",
        "[zz::1]:443",
        "[fe80::1%25eth0]:443",
        "::1:443", // unbracketed IPv6
        "user@example.test:443",
        "example.test:443/x",
        "exa%41mple:443",
    ] {
        let e = ok(bad).unwrap_err();
        assert_eq!(e.reason(), "head_bad_authority", "{bad}: {e:?}");
    }
    assert_eq!(ok("example.test"), Err(HeadError::BadAuthority("missing port")));
    // Origin-form target on CONNECT.
    assert_eq!(ok("/").unwrap_err().reason(), "head_bad_authority");
}

#[test]
fn absolute_form_variants() {
    let af = |t: &str| head_with_target("GET", t).absolute_form();
    assert_eq!(af("http://host"), Ok(("host".into(), 80, "/".into())));
    assert_eq!(af("http://host?x=1"), Ok(("host".into(), 80, "/?x=1".into())));
    assert_eq!(af("HTTP://Host:8080/a/b?c"), Ok(("Host".into(), 8080, "/a/b?c".into())));
    assert_eq!(af("http://[::1]:8080/x"), Ok(("::1".into(), 8080, "/x".into())));
    assert_eq!(af("http://[::1]/x"), Ok(("::1".into(), 80, "/x".into())));
    for bad in [
        "https://host/",
        "/metrics",
        "http://",
        "http://u:p@host/",
        "http://host:/",
        "http://host:99999/",
        "http://host/#frag",
        "ftp://h/",
    ] {
        assert_eq!(af(bad).unwrap_err().reason(), "head_bad_target", "{bad}");
    }
}

#[test]
fn version_and_method_rules() {
    for v in ["HTTP/2.0", "HTTP/1.2", "HTTP/0.9", "HTTPS/1.1"] {
        let raw = format!("CONNECT a:1 {v}\r\n\r\n");
        assert_eq!(parse(raw.as_bytes()), Err(HeadError::BadVersion), "{v}");
        assert_eq!(HeadError::BadVersion.reason(), "head_bad_version");
    }
    // Methods are case-sensitive: lowercase parses but is not CONNECT.
    let h = parse(b"connect a:1 HTTP/1.1\r\n\r\n").unwrap().unwrap();
    assert_eq!(h.method, "connect");
    assert!(!h.is_connect());
    assert_eq!(h.connect_authority(), Err(HeadError::NotConnect));
    assert_eq!(looks_like_http(b"connect "), Detect3::No);
}

#[test]
fn size_limit_is_enforced_at_max_len() {
    let max = 8192;
    // 64 KiB head: rejected as soon as max_len bytes are in, not later.
    let mut big = b"CONNECT a:1 HTTP/1.1\r\nX-Pad: ".to_vec();
    big.resize(64 * 1024, b'a');
    big.extend_from_slice(b"\r\n\r\n");
    assert_eq!(parse_with(&big[..max - 1], max), Ok(None));
    assert_eq!(parse_with(&big[..max], max), Err(HeadError::TooLarge));
    assert_eq!(parse_with(&big, max), Err(HeadError::TooLarge));
    assert_eq!(HeadError::TooLarge.reason(), "head_too_large");
    let mut r = HeadReader::new(max);
    for i in (1..max).step_by(7) {
        assert_eq!(r.poll(&big[..i]), Ok(None));
    }
    assert_eq!(r.poll(&big[..max]), Err(HeadError::TooLarge));

    // A head of exactly max_len bytes fits; one more byte does not.
    let mut exact = b"CONNECT a:1 HTTP/1.1\r\nX-Pad: ".to_vec();
    exact.resize(max - 4, b'a');
    exact.extend_from_slice(b"\r\n\r\n");
    assert_eq!(parse_with(&exact, max).unwrap().unwrap().len, max);
    let mut over = exact.clone();
    over.insert(30, b'a');
    assert_eq!(parse_with(&over, max), Err(HeadError::TooLarge));
    // Payload after an exact-size head does not count against the limit.
    let with_payload = [exact.as_slice(), TLS_BYTES].concat();
    assert_eq!(parse_with(&with_payload, max).unwrap().unwrap().len, max);
}

#[test]
fn header_count_limit() {
    let build = |n: usize| {
        let mut s = String::from("CONNECT a:1 HTTP/1.1\r\n");
        for i in 0..n {
            s.push_str(&format!("X-{i}: v\r\n"));
        }
        s.push_str("\r\n");
        s.into_bytes()
    };
    assert_eq!(parse(&build(MAX_HEADERS)).unwrap().unwrap().headers.len(), MAX_HEADERS);
    let e = parse(&build(MAX_HEADERS + 1)).unwrap_err();
    assert_eq!(e, HeadError::TooManyHeaders);
    assert_eq!(e.reason(), "head_too_many_headers");
}

#[test]
fn malformed_heads() {
    let cases: &[&[u8]] = &[
        b"CONNECT a:1 HTTP/1.1\r\nX: a\0b\r\n\r\n",         // NUL in value
        b"CONNECT a:1 HTTP/1.1\r\nX: a\r\n folded\r\n\r\n", // obs-fold
        b"CONNECT a:1 HTTP/1.1\r\nX: a\r\n\tfolded\r\n\r\n",
        b"CONNECT a:1 HTTP/1.1\r\nBad Name: a\r\n\r\n",
        b"CONNECT a:1 HTTP/1.1\r\n: a\r\n\r\n",
        b"CONNECT a:1 HTTP/1.1\r\nX: a\rb\r\n\r\n", // bare CR
        b"CONNECT  a:1 HTTP/1.1\r\n\r\n",
        b"CONNECT a:1\r\n\r\n",
        b"\r\nCONNECT a:1 HTTP/1.1\r\n\r\n", // leading empty line
        b" CONNECT a:1 HTTP/1.1\r\n\r\n",
    ];
    for c in cases {
        let e = parse(c).unwrap_err();
        assert_eq!(e.reason(), "head_malformed", "{:?}: {e:?}", String::from_utf8_lossy(c));
    }
    // Leading junk is rejected on the first byte.
    assert_eq!(parse(b"\x16").unwrap_err().reason(), "head_malformed");
    assert_eq!(parse(b"\r").unwrap_err().reason(), "head_malformed");
}

#[test]
fn bare_lf_follows_httparse() {
    // httparse accepts LF-only line endings, so we do too; len covers exactly the head.
    let raw = b"CONNECT a:1 HTTP/1.1\nHost: a\n\nTLS";
    let h = parse(raw).unwrap().unwrap();
    assert_eq!(h.len, raw.len() - 3);
    assert_eq!(h.connect_authority(), Ok(("a".to_owned(), 1)));
    let raw = b"CONNECT a:1 HTTP/1.1\r\nHost: a\n\r\nTLS";
    assert_eq!(parse(raw).unwrap().unwrap().len, raw.len() - 3);
}

#[test]
fn looks_like_http_answers_early() {
    assert_eq!(looks_like_http(b""), Detect3::Incomplete);
    assert_eq!(looks_like_http(b"C"), Detect3::Incomplete);
    assert_eq!(looks_like_http(b"CONNECT"), Detect3::Incomplete);
    assert_eq!(looks_like_http(b"CONNECT "), Detect3::Yes);
    assert_eq!(looks_like_http(b"GET /"), Detect3::Yes);
    assert_eq!(looks_like_http(&[0x16]), Detect3::No, "TLS on byte 0");
    assert_eq!(looks_like_http(b"\r\n\r\n\0\r\nQUIT\n"), Detect3::No, "PROXY v2 on byte 0");
    assert_eq!(looks_like_http(b"PROXY "), Detect3::No, "PROXY v1 is not a method");
    assert_eq!(looks_like_http(b"PROXYX "), Detect3::Yes);
    assert_eq!(looks_like_http(b" GET"), Detect3::No);
    assert_eq!(looks_like_http(b"Get "), Detect3::No);
    assert_eq!(looks_like_http(b"GET/"), Detect3::No);
    assert_eq!(looks_like_http(b"ABCDEFGHIJKLMNOP"), Detect3::Incomplete);
    assert_eq!(looks_like_http(b"ABCDEFGHIJKLMNOPQ"), Detect3::No, "method too long");
}

#[test]
fn response_heads() {
    let r = error_response(1, 403, "destination not allowed");
    assert_eq!(
        r,
        b"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nContent-Length: 24\r\nConnection: close\r\n\r\ndestination not allowed\n"
    );
    assert!(error_response(0, 502, "x").starts_with(b"HTTP/1.0 502 Bad Gateway\r\n"));
    assert_eq!(connect_established(1), b"HTTP/1.1 200 Connection established\r\n\r\n");
    assert_eq!(connect_established(0), b"HTTP/1.0 200 Connection established\r\n\r\n");
    assert_eq!(
        redirect_response(1, "https://example.test:443/"),
        b"HTTP/1.1 301 Moved Permanently\r\nLocation: https://example.test:443/\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );

    // Every response is a valid HTTP response whose Content-Length matches its body, and
    // hostile text cannot add headers.
    let responses = [
        error_response(1, 400, "bad\r\nX-Injected: 1"),
        error_response(0, 599, "odd status"),
        error_response(1, 431, ""),
        connect_established(1),
        redirect_response(0, "https://a/\r\nX-Injected: 1"),
    ];
    for r in responses {
        let mut hs = [httparse::EMPTY_HEADER; 16];
        let mut resp = httparse::Response::new(&mut hs);
        let n = match resp.parse(&r).unwrap() {
            httparse::Status::Complete(n) => n,
            httparse::Status::Partial => panic!("partial: {r:?}"),
        };
        assert!(resp.headers.iter().all(|h| h.name != "X-Injected"));
        let cl = resp.headers.iter().find(|h| h.name == "Content-Length");
        let body = &r[n..];
        match cl {
            Some(h) => assert_eq!(std::str::from_utf8(h.value).unwrap().parse::<usize>().unwrap(), body.len()),
            None => assert!(body.is_empty()),
        }
        if resp.code == Some(400) {
            assert_eq!(body, b"bad  X-Injected: 1\n");
        }
        if resp.code == Some(301) {
            let loc = resp.headers.iter().find(|h| h.name == "Location").unwrap();
            assert_eq!(loc.value, b"https://a/%0D%0AX-Injected:%201");
        }
    }
}

#[test]
fn error_reasons_are_snake_case_labels() {
    let all = [
        HeadError::TooLarge,
        HeadError::TooManyHeaders,
        HeadError::Malformed("x"),
        HeadError::BadVersion,
        HeadError::NotConnect,
        HeadError::BadAuthority("x"),
        HeadError::BadTarget("x"),
    ];
    let mut seen = std::collections::HashSet::new();
    for e in all {
        let r = e.reason();
        assert!(r.starts_with("head_") && r.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'), "{r}");
        assert!(seen.insert(r), "duplicate {r}");
        assert!(!e.to_string().is_empty());
    }
}

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
    let corpus: Vec<Vec<u8>> = HEAD_FIXTURES
        .iter()
        .flat_map(|n| {
            let f = fixture(n);
            [f.clone(), [f.as_slice(), TLS_BYTES].concat()]
        })
        .collect();
    let interesting = b"\r\n :[]@/?#\0\t\x7f\x80";
    let mut rng = Rng(0xD1B5_4A32_D192_ED03);
    let mut accepted = 0;
    for _ in 0..20_000 {
        let mut b = corpus[rng.below(corpus.len())].clone();
        for _ in 0..=rng.below(4) {
            let i = rng.below(b.len());
            match rng.below(5) {
                0 if !b.is_empty() => b[i] = interesting[rng.below(interesting.len())],
                1 if !b.is_empty() => b[i] ^= 1 << rng.below(8),
                2 => b.truncate(i),
                3 => b.insert(i.min(b.len()), interesting[rng.below(interesting.len())]),
                _ if !b.is_empty() => {
                    b.remove(i);
                }
                _ => {}
            }
        }
        let max = 64 + rng.below(256);
        let _ = looks_like_http(&b);
        let full = parse_with(&b, max);
        let cut = rng.below(b.len() + 1);
        let prefix = parse_with(&b[..cut], max);
        if let Ok(Some(h)) = &full {
            accepted += 1;
            assert!(h.len <= b.len() && h.len <= max);
            assert_eq!(parse_with(&b[..h.len], max).as_ref(), Ok(&Some(h.clone())));
            let _ = h.connect_authority();
            let _ = h.absolute_form();
            if cut < h.len {
                assert_eq!(prefix, Ok(None));
            }
        }
        if let Ok(None) = &full {
            assert_eq!(prefix, Ok(None));
        }
        // An error on a prefix is final.
        if let Err(pe) = &prefix {
            assert_eq!(full.as_ref().err(), Some(pe), "{:?}", String::from_utf8_lossy(&b));
        }
        // One reader across the prefix and the whole agrees with a fresh reader on the whole.
        let mut r = HeadReader::new(max);
        let _ = r.poll(&b[..cut]);
        if prefix == Ok(None) {
            assert_eq!(r.poll(&b), full);
        }
    }
    assert!(accepted > 100, "mutations too destructive: {accepted}");
}

// ---------------------------------------------------------------- response heads read from upstream

/// The agent's buffer for a gateway's answer to CONNECT.
const RESPONSE_MAX: usize = 8 * 1024;

fn parse_response(buf: &[u8]) -> Result<Option<(u16, usize)>, ResponseHeadError> {
    ResponseHeadReader::new(RESPONSE_MAX).poll(buf).map(|h| h.map(|h| (h.status, h.len)))
}

/// What httparse says of the whole buffer at once: the verdict the incremental reader must give.
fn one_shot_response(buf: &[u8], max_len: usize) -> Result<Option<ResponseHead>, ResponseHeadError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_RESPONSE_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    match resp.parse(buf) {
        Ok(httparse::Status::Complete(len)) => Ok(Some(ResponseHead { status: resp.code.unwrap_or(0), len })),
        Ok(httparse::Status::Partial) if buf.len() >= max_len => Err(ResponseHeadError::TooLarge),
        Ok(httparse::Status::Partial) => Ok(None),
        Err(e) => Err(ResponseHeadError::Malformed(e)),
    }
}

#[test]
fn response_heads_read() {
    assert_eq!(parse_response(b"HTTP/1.1 200 OK\r\n").unwrap(), None);
    assert_eq!(parse_response(b"HTTP/1.1 200 OK\r\n\r\nxyz").unwrap(), Some((200, 19)));
    assert_eq!(parse_response(b"HTTP/1.0 403 Forbidden\r\nA: b\r\n\r\n").unwrap(), Some((403, 32)));
    assert!(matches!(parse_response(b"SSH-2.0-x\r\n\r\n"), Err(ResponseHeadError::Malformed(_))));
    let long = [b"HTTP/1.1 200 OK\r\nX: ".as_slice(), &vec![b'a'; RESPONSE_MAX]].concat();
    assert!(matches!(parse_response(&long), Err(ResponseHeadError::TooLarge)));
    // Exactly at the limit still fits.
    let mut exact = b"HTTP/1.1 200 OK\r\nX: ".to_vec();
    exact.resize(RESPONSE_MAX - 4, b'a');
    exact.extend_from_slice(b"\r\n\r\n");
    assert_eq!(parse_response(&exact), Ok(Some((200, RESPONSE_MAX))));
    assert_eq!(parse_response(&[exact.as_slice(), b"tunnel"].concat()), Ok(Some((200, RESPONSE_MAX))));
}

/// Every split point and byte by byte: one reader across calls gives what a fresh one gives on
/// the whole, exactly when the head is complete; bytes after the head are not part of it.
#[test]
fn response_heads_every_split_point() {
    let heads: Vec<Vec<u8>> = vec![
        connect_established(1),
        connect_established(0),
        b"HTTP/1.1 200 OK\r\nServer: x\r\nVia: 1.1 gw\r\n\r\n".to_vec(),
        b"HTTP/1.1 200 OK\nA: b\n\n".to_vec(),
        b"HTTP/1.1 200\r\n\r\n".to_vec(),
        b"\r\n\nHTTP/1.1 407 Proxy Authentication Required\r\n\r\n".to_vec(),
        b"HTTP/1.1 200 \xe9t\xe9\r\nX-Obs: caf\xe9\r\n\r\n".to_vec(),
    ];
    for head in heads {
        let stream = [head.as_slice(), TLS_BYTES].concat();
        let full = ResponseHeadReader::new(RESPONSE_MAX).poll(&stream).unwrap().expect("complete head");
        assert_eq!(full.len, head.len(), "{:?}", String::from_utf8_lossy(&head));
        assert_eq!(Ok(Some(full)), one_shot_response(&stream, RESPONSE_MAX));
        for i in 0..head.len() {
            assert_eq!(ResponseHeadReader::new(RESPONSE_MAX).poll(&stream[..i]), Ok(None), "prefix {i}");
            let mut r = ResponseHeadReader::new(RESPONSE_MAX);
            assert_eq!(r.poll(&stream[..i]), Ok(None));
            assert_eq!(r.poll(&stream), Ok(Some(full)), "split at {i}");
        }
        let mut r = ResponseHeadReader::new(RESPONSE_MAX);
        for i in 1..=stream.len() {
            match r.poll(&stream[..i]).unwrap() {
                None => assert!(i < head.len()),
                Some(h) => {
                    assert_eq!(i, head.len(), "complete exactly at the end of the head");
                    assert_eq!(h, full);
                    break;
                }
            }
        }
    }
    // What we write, we read back.
    let err = error_response(1, 502, "upstream down");
    let h = ResponseHeadReader::new(RESPONSE_MAX).poll(&err).unwrap().unwrap();
    assert_eq!(h.status, 502);
    assert_eq!(&err[h.len..], b"upstream down\n");
}

#[test]
fn non_http_peer_is_refused_on_its_first_bytes() {
    for bad in [&b"S"[..], b"SSH-2.0-OpenSSH_9.2", b"\x16\x03\x01", b"HTTP/2", b"HTTP/1.2", b"http/1.1", b"\r\nX"] {
        assert_eq!(
            parse_response(bad),
            Err(ResponseHeadError::Malformed(httparse::Error::Version)),
            "{:?}",
            String::from_utf8_lossy(bad)
        );
        assert_eq!(one_shot_response(bad, RESPONSE_MAX), Err(ResponseHeadError::Malformed(httparse::Error::Version)));
    }
    for fine in [&b""[..], b"H", b"HTTP/1.", b"HTTP/1.1", b"\r", b"\r\n", b"\n\r\nHTTP/1.0"] {
        assert_eq!(parse_response(fine), Ok(None), "{:?}", String::from_utf8_lossy(fine));
    }
}

#[test]
fn response_errors_once_their_line_is_complete() {
    let cases: &[(&[u8], httparse::Error)] = &[
        (b"HTTP/1.1 2x0 OK\r\n", httparse::Error::Status),
        (b"HTTP/1.1 200 O\x01K\r\n", httparse::Error::Status),
        (b"HTTP/1.1 200 OK\rX\n", httparse::Error::Status),
        (b"HTTP/1.1 200 OK\r\nBad Name: x\r\n", httparse::Error::HeaderName),
        (b"HTTP/1.1 200 OK\r\nA: b\r\n folded\r\n", httparse::Error::HeaderName),
        (b"HTTP/1.1 200 OK\r\nA: b\0c\r\n", httparse::Error::HeaderValue),
        (b"HTTP/1.1 200 OK\r\n\rX\n", httparse::Error::NewLine),
    ];
    for (raw, want) in cases {
        let want = ResponseHeadError::Malformed(*want);
        assert_eq!(parse_response(raw), Err(want), "{:?}", String::from_utf8_lossy(raw));
        assert_eq!(one_shot_response(raw, RESPONSE_MAX).err(), Some(want));
        // Until the line ends, the reader is still waiting.
        assert_eq!(parse_response(&raw[..raw.len() - 1]), Ok(None));
    }

    let build = |n: usize| {
        let mut s = String::from("HTTP/1.1 200 OK\r\n");
        for i in 0..n {
            s.push_str(&format!("X-{i}: v\r\n"));
        }
        s.push_str("\r\n");
        s.into_bytes()
    };
    let ok = build(MAX_RESPONSE_HEADERS);
    assert_eq!(parse_response(&ok), Ok(Some((200, ok.len()))));
    let too_many = build(MAX_RESPONSE_HEADERS + 1);
    let want = ResponseHeadError::Malformed(httparse::Error::TooManyHeaders);
    assert_eq!(parse_response(&too_many), Err(want));
    assert_eq!(one_shot_response(&too_many, RESPONSE_MAX).err(), Some(want));
}

#[test]
fn response_mutations_agree_with_httparse_on_the_whole_buffer() {
    let corpus: Vec<Vec<u8>> = vec![
        [connect_established(1).as_slice(), TLS_BYTES].concat(),
        b"HTTP/1.0 403 Forbidden\r\nContent-Type: text/plain\r\nContent-Length: 4\r\n\r\nno\r\n".to_vec(),
        b"HTTP/1.1 200 OK\nA: b\n\nxyz".to_vec(),
        error_response(1, 431, "too big"),
        redirect_response(0, "https://a/"),
    ];
    let interesting = b"\r\n :/\0\t\x7f\x80HTP1.02";
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut complete = 0;
    for _ in 0..20_000 {
        let mut b = corpus[rng.below(corpus.len())].clone();
        for _ in 0..=rng.below(4) {
            let i = rng.below(b.len());
            match rng.below(5) {
                0 if !b.is_empty() => b[i] = interesting[rng.below(interesting.len())],
                1 if !b.is_empty() => b[i] ^= 1 << rng.below(8),
                2 => b.truncate(i),
                3 => b.insert(i.min(b.len()), interesting[rng.below(interesting.len())]),
                _ if !b.is_empty() => {
                    b.remove(i);
                }
                _ => {}
            }
        }
        let reference = one_shot_response(&b, RESPONSE_MAX);
        let fresh = ResponseHeadReader::new(RESPONSE_MAX).poll(&b);
        match &reference {
            Ok(Some(_)) | Ok(None) => assert_eq!(fresh, reference, "{:?}", String::from_utf8_lossy(&b)),
            // httparse rejects a bad byte at once; the reader when its line ends.
            Err(_) => {
                assert!(fresh == reference || fresh == Ok(None), "{fresh:?} vs {reference:?}: {b:?}");
                let ended = ResponseHeadReader::new(RESPONSE_MAX).poll(&[b.as_slice(), b"\n"].concat());
                assert_eq!(ended, reference, "{:?}", String::from_utf8_lossy(&b));
            }
        }
        complete += usize::from(matches!(reference, Ok(Some(_))));

        // One reader fed a prefix, then the whole, or byte by byte, answers as a fresh one.
        let cut = rng.below(b.len() + 1);
        let mut r = ResponseHeadReader::new(RESPONSE_MAX);
        if r.poll(&b[..cut]) == Ok(None) {
            assert_eq!(r.poll(&b), fresh);
        }
        let mut r = ResponseHeadReader::new(RESPONSE_MAX);
        let mut last = Ok(None);
        for i in 1..=b.len() {
            last = r.poll(&b[..i]);
            if last != Ok(None) {
                break;
            }
        }
        assert_eq!(last, fresh, "{:?}", String::from_utf8_lossy(&b));
    }
    assert!(complete > 100, "mutations too destructive: {complete}");
}
