//! Test support: record framing helpers shared by the capture example and the integration tests.
// Independent of the parser under test, so fixtures are not produced by the code they check.

/// Splits `wire` into its TLS records: (content type, record version, body).
pub(super) fn split_records(wire: &[u8]) -> Vec<(u8, [u8; 2], Vec<u8>)> {
    let mut out = Vec::new();
    let mut rest = wire;
    while rest.len() >= 5 {
        let len = u16::from_be_bytes([rest[3], rest[4]]) as usize;
        assert!(rest.len() >= 5 + len, "truncated record");
        out.push((rest[0], [rest[1], rest[2]], rest[5..5 + len].to_vec()));
        rest = &rest[5 + len..];
    }
    assert!(rest.is_empty(), "trailing partial record header");
    out
}

/// Length of the complete first handshake message (header + body) framed in `wire`, if all of it has arrived.
pub(super) fn first_handshake_len(wire: &[u8]) -> Option<usize> {
    let mut hs = Vec::new();
    let mut rest = wire;
    let mut end = 0;
    while rest.len() >= 5 {
        let len = u16::from_be_bytes([rest[3], rest[4]]) as usize;
        if rest.len() < 5 + len {
            return None;
        }
        hs.extend_from_slice(&rest[5..5 + len]);
        end += 5 + len;
        rest = &rest[5 + len..];
        if hs.len() >= 4 {
            let need = 4 + (u32::from_be_bytes([0, hs[1], hs[2], hs[3]]) as usize);
            if hs.len() >= need {
                return Some(end);
            }
        }
    }
    None
}

/// Re-frames the handshake bytes carried by `wire`'s handshake records into records whose bodies
/// have the given sizes (the last size absorbs whatever remains). Record version is kept from the
/// first record.
pub(super) fn refragment(wire: &[u8], sizes: &[usize]) -> Vec<u8> {
    let records = split_records(wire);
    let version = records[0].1;
    let hs: Vec<u8> = records
        .iter()
        .inspect(|r| assert_eq!(r.0, 0x16, "only handshake records can be re-framed"))
        .flat_map(|r| r.2.iter().copied())
        .collect();
    let mut out = Vec::new();
    let mut rest = &hs[..];
    for (i, &size) in sizes.iter().enumerate() {
        let n = if i + 1 == sizes.len() { rest.len() } else { size.min(rest.len()) };
        assert!(n > 0 && n <= 16384, "fragment sizes do not fit the hello");
        out.push(0x16);
        out.extend_from_slice(&version);
        out.extend_from_slice(&(n as u16).to_be_bytes());
        out.extend_from_slice(&rest[..n]);
        rest = &rest[n..];
    }
    out
}
