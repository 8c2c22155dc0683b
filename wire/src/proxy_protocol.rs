//! Sans-IO PROXY protocol v1/v2: detection, strict parsing (ppp plus the checks ppp lacks) and encoding.

use std::net::{IpAddr, SocketAddr};

/// Longest v1 line including the trailing CRLF (spec: 107 bytes + NUL fit a 108-byte buffer).
pub const V1_MAX_LEN: usize = 107;
/// Longest v2 header: 16-byte fixed block plus the largest u16 payload length.
pub const V2_MAX_LEN: usize = 16 + 65535;

/// 12-byte v2 signature.
pub const V2_SIGNATURE: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";
const V1_SIGNATURE: &[u8; 6] = b"PROXY ";
const V2_FIXED_LEN: usize = 16;

// PP2 TLV types this module interprets (PROXY protocol spec, section 2.2.x).
pub const PP2_TYPE_ALPN: u8 = 0x01;
pub const PP2_TYPE_AUTHORITY: u8 = 0x02;
pub const PP2_TYPE_CRC32C: u8 = 0x03;
pub const PP2_TYPE_NOOP: u8 = 0x04;
pub const PP2_TYPE_UNIQUE_ID: u8 = 0x05;
pub const PP2_TYPE_SSL: u8 = 0x20;
pub const PP2_TYPE_NETNS: u8 = 0x30;

/// Spec limit for PP2_TYPE_UNIQUE_ID.
pub const UNIQUE_ID_MAX_LEN: usize = 128;
/// HAProxy's limit for PP2_TYPE_AUTHORITY (it rejects longer ones); we match it.
pub const AUTHORITY_MAX_LEN: usize = 255;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Local,
    Proxy,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Tcp4,
    Tcp6,
    Udp4,
    Udp6,
    /// v2 AF_UNSPEC, or v1 `UNKNOWN`.
    Unspec,
    /// v2 AF_UNIX (stream or datagram); addresses are not decoded.
    Unix,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyHeader {
    /// 1 or 2.
    pub version: u8,
    /// v1 is always `Proxy` (including `UNKNOWN`).
    pub command: Command,
    pub transport: Transport,
    /// `None` for LOCAL, UNSPEC, UNIX and v1 UNKNOWN.
    pub source: Option<SocketAddr>,
    pub destination: Option<SocketAddr>,
    /// PP2_TYPE_AUTHORITY (0x02), validated UTF-8, at most 255 bytes.
    pub authority: Option<String>,
    /// PP2_TYPE_UNIQUE_ID (0x05), at most 128 bytes.
    pub unique_id: Option<Vec<u8>>,
    /// Every top-level TLV in wire order, including the ones decoded above and CRC32C.
    /// Sub-TLVs of PP2_TYPE_SSL stay inside its value (they are validated, not flattened).
    pub tlvs: Vec<(u8, Vec<u8>)>,
    /// Bytes the header occupied; the payload starts at `buf[len..]`.
    pub len: usize,
}

#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum ProxyError {
    #[error("input does not start with a PROXY protocol signature")]
    BadSignature,
    #[error("PROXY v1 line has no CRLF within {V1_MAX_LEN} bytes")]
    V1TooLong,
    #[error("malformed PROXY v1 line: {0}")]
    V1Malformed(&'static str),
    #[error("PROXY v2 version nibble is {0:#x}, expected 0x2")]
    BadVersion(u8),
    #[error("PROXY v2 command {0:#x} is neither LOCAL (0x0) nor PROXY (0x1)")]
    BadCommand(u8),
    #[error("PROXY v2 family/transport byte {0:#04x} is not one of the defined combinations")]
    BadFamily(u8),
    #[error("PROXY v2 length {declared} is smaller than the {required}-byte address block")]
    V2BadLength { declared: u16, required: usize },
    #[error("PROXY v2 header would be {0} bytes, more than {V2_MAX_LEN}")]
    V2TooLong(usize),
    #[error("PROXY v2 TLV {tlv_type:#04x} overruns its enclosing {}", if *.nested { "TLV" } else { "header" })]
    TlvOverrun { tlv_type: u8, nested: bool },
    #[error("PROXY v2 TLV {tlv_type:#04x} has an invalid value: {what}")]
    TlvBadValue { tlv_type: u8, what: &'static str },
    #[error("PROXY v2 TLV {0:#04x} appears more than once")]
    TlvDuplicate(u8),
    #[error("PROXY v2 CRC32C mismatch: header says {expected:#010x}, computed {computed:#010x}")]
    CrcMismatch { expected: u32, computed: u32 },
    #[error("PROXY v2 UNIQUE_ID is {0} bytes, limit is {UNIQUE_ID_MAX_LEN}")]
    UniqueIdTooLong(usize),
}

impl ProxyError {
    /// Every [`ProxyError::reason`].
    pub const REASONS: [&'static str; 13] = [
        "pp_bad_signature",
        "pp_v1_too_long",
        "pp_v1_malformed",
        "pp_bad_version",
        "pp_bad_command",
        "pp_bad_family",
        "pp_v2_bad_length",
        "pp_v2_too_long",
        "pp_tlv_overrun",
        "pp_tlv_bad_value",
        "pp_tlv_duplicate",
        "pp_crc_mismatch",
        "pp_unique_id_too_long",
    ];

    /// Short, stable snake_case label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            ProxyError::BadSignature => "pp_bad_signature",
            ProxyError::V1TooLong => "pp_v1_too_long",
            ProxyError::V1Malformed(_) => "pp_v1_malformed",
            ProxyError::BadVersion(_) => "pp_bad_version",
            ProxyError::BadCommand(_) => "pp_bad_command",
            ProxyError::BadFamily(_) => "pp_bad_family",
            ProxyError::V2BadLength { .. } => "pp_v2_bad_length",
            ProxyError::V2TooLong(_) => "pp_v2_too_long",
            ProxyError::TlvOverrun { .. } => "pp_tlv_overrun",
            ProxyError::TlvBadValue { .. } => "pp_tlv_bad_value",
            ProxyError::TlvDuplicate(_) => "pp_tlv_duplicate",
            ProxyError::CrcMismatch { .. } => "pp_crc_mismatch",
            ProxyError::UniqueIdTooLong(_) => "pp_unique_id_too_long",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detect {
    /// Every byte so far matches a signature prefix; need more.
    Incomplete,
    ProxyV1,
    ProxyV2,
    NotProxy,
}

/// Decide from the first bytes whether a PROXY header starts here.
///
/// Answers `NotProxy` on the first byte that differs from both signatures, so TLS (`0x16`)
/// or `CONNECT` is recognised on byte 0 (the signatures already differ there: `P` vs `\r`).
pub fn detect(buf: &[u8]) -> Detect {
    fn prefix_state(buf: &[u8], sig: &[u8]) -> Option<bool> {
        // Some(true) = full signature present, Some(false) = matching prefix, None = mismatch.
        let seen = buf.get(..sig.len()).unwrap_or(buf);
        sig.starts_with(seen).then_some(seen.len() == sig.len())
    }
    if buf.is_empty() {
        return Detect::Incomplete;
    }
    match (prefix_state(buf, V1_SIGNATURE), prefix_state(buf, V2_SIGNATURE)) {
        (Some(true), _) => Detect::ProxyV1,
        (_, Some(true)) => Detect::ProxyV2,
        (None, None) => Detect::NotProxy,
        _ => Detect::Incomplete,
    }
}

/// Parse one header at the start of `buf`.
///
/// `Ok(None)` means "need more bytes": call again with a longer prefix of the same stream.
/// An error is returned only once the bytes seen cannot start a valid header, regardless
/// of what follows (e.g. a v1 line is rejected once 107 bytes contain no CRLF), so the
/// caller can close the connection and count [`ProxyError::reason`]. On success the payload
/// starts at `buf[header.len..]`.
///
/// Fixed-format work (v1 grammar, v2 fixed block and addresses) is done by `ppp`; the
/// checks it lacks are added here and marked "ppp gap" in the source.
///
/// Address rules:
/// * `LOCAL` (v2 command 0x0): accepted, `source`/`destination` are `None` even if an
///   address block is present. Load balancers send it for health checks; the caller keeps
///   the real peer address. TLVs of a LOCAL header are still validated (HAProxy's own
///   health checks send LOCAL + CRC32C, which passes).
/// * `UNSPEC` and `UNIX` families (v2), `UNKNOWN` (v1): accepted, addresses are `None`; the
///   caller treats the connection like `LOCAL` and keeps the real peer address.
/// * `UDP4`/`UDP6` (v2): accepted with addresses; whether a datagram transport is
///   acceptable on a TCP listener is the caller's policy.
/// * TLVs: every top-level TLV and every PP2_TYPE_SSL sub-TLV must fit its container;
///   CRC32C (type 0x03) must be 4 bytes and match; UNIQUE_ID at most 128 bytes; AUTHORITY
///   UTF-8 and at most 255 bytes (HAProxy's limit); AUTHORITY/CRC32C/UNIQUE_ID at most once.
pub fn parse(buf: &[u8]) -> Result<Option<ProxyHeader>, ProxyError> {
    match detect(buf) {
        Detect::Incomplete => Ok(None),
        Detect::NotProxy => Err(ProxyError::BadSignature),
        Detect::ProxyV1 => parse_v1(buf),
        Detect::ProxyV2 => parse_v2(buf),
    }
}

fn parse_v1(buf: &[u8]) -> Result<Option<ProxyHeader>, ProxyError> {
    use ppp::v1::{Addresses, Header};

    let window = buf.get(..V1_MAX_LEN).unwrap_or(buf);
    let printable = |b: &u8| (0x20..0x7f).contains(b);
    // Find the end of the line ourselves so "incomplete" vs "broken" is decided here, not by
    // ppp's error classification (ppp reports some complete-but-bad lines as incomplete).
    // The spec grammar is printable US-ASCII: reject anything else without waiting for the
    // CRLF. Checked before the CR so the first problem by position is the one reported,
    // whatever the length of the prefix seen.
    let cr = memchr::memchr(b'\r', window);
    if !window.iter().take_while(|&&b| b != b'\r').all(printable) {
        return Err(ProxyError::V1Malformed("non-printable byte"));
    }
    // The CR and the byte after it, once that has arrived.
    let line = match cr.and_then(|i| Some((i, *window.get(i + 1)?))) {
        Some((i, b'\n')) => window.get(..i + 2).unwrap_or(window),
        Some(_) => return Err(ProxyError::V1Malformed("CR not followed by LF")),
        // No CR yet, or CR is the last byte seen. A CR at index 106 still needs its LF at
        // 107: the line would be 108 bytes.
        None if window.len() >= V1_MAX_LEN => return Err(ProxyError::V1TooLong),
        None => return Ok(None),
    };
    let line_len = line.len();
    // ppp gap: the spec says a receiver must ignore whatever follows "UNKNOWN" up to the
    // CRLF, but ppp fails on five or more extra fields. Handle UNKNOWN here.
    if let Some(rest) = line.strip_prefix(b"PROXY UNKNOWN".as_slice())
        && matches!(rest.first(), Some(b' ' | b'\r'))
    {
        return Ok(Some(ProxyHeader {
            version: 1,
            command: Command::Proxy,
            transport: Transport::Unspec,
            source: None,
            destination: None,
            authority: None,
            unique_id: None,
            tlvs: Vec::new(),
            len: line_len,
        }));
    }
    let header = Header::try_from(line).map_err(map_v1_error)?;

    let (transport, addrs) = match header.addresses {
        Addresses::Tcp4(a) => (
            Transport::Tcp4,
            Some((
                SocketAddr::from((a.source_address, a.source_port)),
                SocketAddr::from((a.destination_address, a.destination_port)),
            )),
        ),
        Addresses::Tcp6(a) => (
            Transport::Tcp6,
            Some((
                SocketAddr::from((a.source_address, a.source_port)),
                SocketAddr::from((a.destination_address, a.destination_port)),
            )),
        ),
        Addresses::Unknown => (Transport::Unspec, None),
    };
    if addrs.is_some() {
        // ppp gap: ports go through u16::from_str, which accepts a leading '+' ("+80").
        // The spec grammar is digits only. ppp already rejects leading zeros.
        let text = line.strip_suffix(b"\r\n").unwrap_or(line);
        let ports_ok = text.split(|&b| b == b' ').skip(4).all(|p| !p.is_empty() && p.iter().all(u8::is_ascii_digit));
        if !ports_ok {
            return Err(ProxyError::V1Malformed("port is not a decimal number"));
        }
    }

    Ok(Some(ProxyHeader {
        version: 1,
        command: Command::Proxy,
        transport,
        source: addrs.map(|a| a.0),
        destination: addrs.map(|a| a.1),
        authority: None,
        unique_id: None,
        tlvs: Vec::new(),
        len: line_len,
    }))
}

fn map_v1_error(e: ppp::v1::BinaryParseError) -> ProxyError {
    use ppp::v1::{BinaryParseError as B, ParseError as P};
    // The line is complete here, so ppp's "missing"/"partial" kinds are definitive too.
    ProxyError::V1Malformed(match e {
        B::InvalidUtf8(_) => "not UTF-8",
        B::Parse(p) => match p {
            P::InvalidPrefix | P::Partial | P::MissingPrefix => "bad prefix",
            P::MissingProtocol | P::InvalidProtocol => "protocol is not TCP4, TCP6 or UNKNOWN",
            P::MissingSourceAddress | P::InvalidSourceAddress(_) => "bad source address for the protocol",
            P::MissingDestinationAddress | P::InvalidDestinationAddress(_) => {
                "bad destination address for the protocol"
            }
            P::MissingSourcePort | P::InvalidSourcePort(_) => "bad source port",
            P::MissingDestinationPort | P::InvalidDestinationPort(_) => "bad destination port",
            P::MissingNewLine | P::InvalidSuffix => "wrong number of fields or stray spaces",
            P::HeaderTooLong => "line too long",
        },
    })
}

/// Address-block size for a validated family/transport byte.
fn v2_address_len(fam: u8) -> usize {
    match fam >> 4 {
        0x1 => 12,
        0x2 => 36,
        0x3 => 216,
        _ => 0,
    }
}

fn parse_v2(buf: &[u8]) -> Result<Option<ProxyHeader>, ProxyError> {
    let Some((raw, addr_len)) = v2_header(buf)? else {
        return Ok(None);
    };
    let total = raw.len();

    let hdr = ppp::v2::Header::try_from(raw).map_err(map_v2_error)?;
    let command = match hdr.command {
        ppp::v2::Command::Local => Command::Local,
        ppp::v2::Command::Proxy => Command::Proxy,
    };
    let (transport, addrs) = v2_addresses(&hdr);
    // Spec: with LOCAL the receiver must ignore the address block.
    let addrs = if command == Command::Local { None } else { addrs };

    let tlvs = walk_tlvs(raw, V2_FIXED_LEN + addr_len)?;
    if let Some((at, expected)) = tlvs.crc {
        check_crc(raw, at, expected)?;
    }

    Ok(Some(ProxyHeader {
        version: 2,
        command,
        transport,
        source: addrs.map(|a| a.0),
        destination: addrs.map(|a| a.1),
        authority: tlvs.authority,
        unique_id: tlvs.unique_id,
        tlvs: tlvs.all,
        len: total,
    }))
}

/// The v2 header starting `buf` and the length of its address block, once all of it has
/// arrived; `None` before.
///
/// The fixed block is validated byte by byte as it arrives so a bad header is rejected without
/// waiting for its (possibly 64 KiB) declared length.
fn v2_header(buf: &[u8]) -> Result<Option<(&[u8], usize)>, ProxyError> {
    if let Some(&ver_cmd) = buf.get(12) {
        if ver_cmd >> 4 != 0x2 {
            return Err(ProxyError::BadVersion(ver_cmd >> 4));
        }
        if ver_cmd & 0x0f > 1 {
            return Err(ProxyError::BadCommand(ver_cmd & 0x0f));
        }
    }
    if let Some(&fam) = buf.get(13) {
        // ppp gap: ppp accepts any family nibble 0..3 combined with any protocol nibble 0..2
        // (e.g. 0x01, 0x10); the spec says only these seven values are valid.
        if !matches!(fam, 0x00 | 0x11 | 0x12 | 0x21 | 0x22 | 0x31 | 0x32) {
            return Err(ProxyError::BadFamily(fam));
        }
    }
    let Some(&[.., fam, len_hi, len_lo]) = buf.first_chunk::<V2_FIXED_LEN>() else {
        return Ok(None);
    };
    let declared = u16::from_be_bytes([len_hi, len_lo]);
    let addr_len = v2_address_len(fam);
    if usize::from(declared) < addr_len {
        return Err(ProxyError::V2BadLength { declared, required: addr_len });
    }
    Ok(buf.get(..V2_FIXED_LEN + usize::from(declared)).map(|raw| (raw, addr_len)))
}

/// Transport and (source, destination) as ppp decoded them from the address block.
fn v2_addresses(hdr: &ppp::v2::Header<'_>) -> (Transport, Option<(SocketAddr, SocketAddr)>) {
    let datagram = hdr.protocol == ppp::v2::Protocol::Datagram;
    match hdr.addresses {
        ppp::v2::Addresses::IPv4(a) => (
            if datagram { Transport::Udp4 } else { Transport::Tcp4 },
            Some((
                SocketAddr::from((a.source_address, a.source_port)),
                SocketAddr::from((a.destination_address, a.destination_port)),
            )),
        ),
        ppp::v2::Addresses::IPv6(a) => (
            if datagram { Transport::Udp6 } else { Transport::Tcp6 },
            Some((
                SocketAddr::from((a.source_address, a.source_port)),
                SocketAddr::from((a.destination_address, a.destination_port)),
            )),
        ),
        ppp::v2::Addresses::Unix(_) => (Transport::Unix, None),
        ppp::v2::Addresses::Unspecified => (Transport::Unspec, None),
    }
}

/// What the TLV walk keeps: every TLV, the decoded special ones, and where the CRC32C value sits.
struct Tlvs {
    all: Vec<(u8, Vec<u8>)>,
    authority: Option<String>,
    unique_id: Option<Vec<u8>>,
    /// Offset of the 4-byte CRC32C value in the header, and the value.
    crc: Option<(usize, u32)>,
}

/// Walk the TLVs of `raw` (one whole header) from `start` to its end.
///
/// ppp gap: ppp validates TLVs only lazily through its iterator, treats the whole AF_UNSPEC
/// payload as "address bytes" (hiding its TLVs), and checks neither nested SSL sub-TLVs,
/// CRC32C, UNIQUE_ID length nor AUTHORITY encoding. So the TLV walk is done here.
fn walk_tlvs(raw: &[u8], start: usize) -> Result<Tlvs, ProxyError> {
    let mut t = Tlvs { all: Vec::new(), authority: None, unique_id: None, crc: None };
    let mut off = start;
    while off < raw.len() {
        let (tlv_type, value) = next_tlv(raw, off, raw.len(), false)?;
        let value_at = off + 3;
        off = value_at + value.len();
        match tlv_type {
            PP2_TYPE_AUTHORITY => {
                if t.authority.is_some() {
                    return Err(ProxyError::TlvDuplicate(tlv_type));
                }
                if value.len() > AUTHORITY_MAX_LEN {
                    return Err(ProxyError::TlvBadValue { tlv_type, what: "longer than 255 bytes" });
                }
                let s =
                    std::str::from_utf8(value).map_err(|_| ProxyError::TlvBadValue { tlv_type, what: "not UTF-8" })?;
                t.authority = Some(s.to_owned());
            }
            PP2_TYPE_CRC32C => {
                if t.crc.is_some() {
                    return Err(ProxyError::TlvDuplicate(tlv_type));
                }
                let Ok(expected) = <[u8; 4]>::try_from(value) else {
                    return Err(ProxyError::TlvBadValue { tlv_type, what: "CRC32C value must be 4 bytes" });
                };
                t.crc = Some((value_at, u32::from_be_bytes(expected)));
            }
            PP2_TYPE_UNIQUE_ID => {
                if t.unique_id.is_some() {
                    return Err(ProxyError::TlvDuplicate(tlv_type));
                }
                if value.len() > UNIQUE_ID_MAX_LEN {
                    return Err(ProxyError::UniqueIdTooLong(value.len()));
                }
                t.unique_id = Some(value.to_vec());
            }
            PP2_TYPE_SSL => check_ssl_tlv(value)?,
            _ => {}
        }
        t.all.push((tlv_type, value.to_vec()));
    }
    Ok(t)
}

/// PP2_TYPE_SSL value: `struct pp2_tlv_ssl { u8 client; u32 verify; struct pp2_tlv sub_tlv[]; }`,
/// every sub-TLV within the value.
fn check_ssl_tlv(value: &[u8]) -> Result<(), ProxyError> {
    if value.len() < 5 {
        return Err(ProxyError::TlvBadValue {
            tlv_type: PP2_TYPE_SSL,
            what: "SSL TLV shorter than its 5-byte fixed part",
        });
    }
    let mut sub = 5;
    while sub < value.len() {
        let (_, v) = next_tlv(value, sub, value.len(), true)?;
        sub += 3 + v.len();
    }
    Ok(())
}

/// The CRC32C TLV whose value `expected` sits at `raw[at..at + 4]` matches the header (spec
/// section 2.2.5).
fn check_crc(raw: &[u8], at: usize, expected: u32) -> Result<(), ProxyError> {
    let computed = crc32c_with_zeroed(raw, at);
    if expected != computed {
        return Err(ProxyError::CrcMismatch { expected, computed });
    }
    Ok(())
}

/// One TLV at `buf[off..end]`; errors if its 3-byte head or its value crosses `end`.
fn next_tlv(buf: &[u8], off: usize, end: usize, nested: bool) -> Result<(u8, &[u8]), ProxyError> {
    // Callers pass `off < end <= buf.len()`.
    let tlv = buf.get(off..end).unwrap_or_default();
    let overrun = || ProxyError::TlvOverrun { tlv_type: tlv.first().copied().unwrap_or_default(), nested };
    let Some((&[tlv_type, len_hi, len_lo], rest)) = tlv.split_first_chunk::<3>() else {
        return Err(overrun());
    };
    let value = rest.get(..usize::from(u16::from_be_bytes([len_hi, len_lo]))).ok_or_else(overrun)?;
    Ok((tlv_type, value))
}

/// CRC32C of `hdr` with the 4 bytes at `at` taken as zero (spec section 2.2.5).
fn crc32c_with_zeroed(hdr: &[u8], at: usize) -> u32 {
    let (before, rest) = hdr.split_at_checked(at).unwrap_or((hdr, &[]));
    let crc = crc32c::crc32c(before);
    let crc = crc32c::crc32c_append(crc, &[0; 4]);
    crc32c::crc32c_append(crc, rest.get(4..).unwrap_or_default())
}

fn map_v2_error(e: ppp::v2::ParseError) -> ProxyError {
    use ppp::v2::ParseError as P;
    // Our own checks run first, so these are fallbacks if ppp ever gets stricter.
    match e {
        P::Version(v) => ProxyError::BadVersion(v >> 4),
        P::Command(c) => ProxyError::BadCommand(c),
        P::AddressFamily(f) | P::Protocol(f) => ProxyError::BadFamily(f),
        P::InvalidAddresses(declared, required) => {
            ProxyError::V2BadLength { declared: u16::try_from(declared).unwrap_or(u16::MAX), required }
        }
        P::InvalidTLV(t, _) => ProxyError::TlvOverrun { tlv_type: t, nested: false },
        P::Leftovers(_) => ProxyError::TlvOverrun { tlv_type: 0, nested: false },
        P::Prefix | P::Incomplete(_) | P::Partial(..) => ProxyError::BadSignature,
    }
}

/// v1 and v2 carry one address family; a mixed pair is sent as IPv6 with the IPv4 side
/// written as an IPv4-mapped address (`::ffff:a.b.c.d`).
fn same_family(src: SocketAddr, dst: SocketAddr) -> (SocketAddr, SocketAddr) {
    fn to_v6(a: SocketAddr) -> SocketAddr {
        match a.ip() {
            IpAddr::V4(v4) => SocketAddr::from((v4.to_ipv6_mapped(), a.port())),
            IpAddr::V6(_) => a,
        }
    }
    if src.is_ipv4() == dst.is_ipv4() { (src, dst) } else { (to_v6(src), to_v6(dst)) }
}

/// `PROXY TCP4|TCP6 src dst sport dport\r\n`. Mixed families are sent as TCP6 with the IPv4
/// address IPv4-mapped (`::ffff:a.b.c.d`).
pub fn encode_v1(src: SocketAddr, dst: SocketAddr) -> Vec<u8> {
    let pair = same_family(src, dst);
    ppp::v1::Addresses::from(pair).to_string().into_bytes()
}

/// Options for [`encode_v2`].
#[derive(Debug, Clone, Copy, Default)]
pub struct V2Options<'a> {
    /// PP2_TYPE_AUTHORITY, at most 255 bytes.
    pub authority: Option<&'a str>,
    /// PP2_TYPE_UNIQUE_ID, at most 128 bytes.
    pub unique_id: Option<&'a [u8]>,
    /// Append PP2_TYPE_CRC32C computed over the finished header.
    pub crc32c: bool,
    /// Written after authority and unique id, in order. Must not contain CRC32C (use the
    /// flag) nor repeat AUTHORITY/UNIQUE_ID given above; a PP2_TYPE_SSL value must have the
    /// spec's structure (client u8, verify u32, then sub-TLVs that fill it exactly).
    pub extra_tlvs: &'a [(u8, &'a [u8])],
}

/// PROXY v2 `PROXY` command over TCP. Mixed families are sent as TCP6 with the IPv4 address
/// IPv4-mapped. TLV order: CRC32C (if requested, like HAProxy), AUTHORITY, UNIQUE_ID, extras.
///
/// # Panics
/// If the options are invalid (see [`try_encode_v2`]); they come from configuration/code,
/// not from the peer, so this is a programming error.
pub fn encode_v2(src: SocketAddr, dst: SocketAddr, opts: &V2Options<'_>) -> Vec<u8> {
    match try_encode_v2(src, dst, opts) {
        Ok(v) => v,
        Err(e) => panic!("encode_v2: invalid options: {e}"),
    }
}

/// Fallible [`encode_v2`]: rejects what [`parse`] would reject (oversized unique id or
/// authority, duplicate special TLVs, CRC32C in `extra_tlvs`, a PP2_TYPE_SSL value without its
/// 5-byte fixed part or with sub-TLVs overrunning it) and headers over 64 KiB, so whatever it
/// returns parses back to the same fields.
pub fn try_encode_v2(src: SocketAddr, dst: SocketAddr, opts: &V2Options<'_>) -> Result<Vec<u8>, ProxyError> {
    use ppp::v2::{Builder, Command as C, Protocol, Version};

    if opts.authority.is_some_and(|a| a.len() > AUTHORITY_MAX_LEN) {
        return Err(ProxyError::TlvBadValue { tlv_type: PP2_TYPE_AUTHORITY, what: "longer than 255 bytes" });
    }
    if let Some(u) = opts.unique_id
        && u.len() > UNIQUE_ID_MAX_LEN
    {
        return Err(ProxyError::UniqueIdTooLong(u.len()));
    }
    for &(t, v) in opts.extra_tlvs {
        let dup = match t {
            PP2_TYPE_CRC32C => true,
            PP2_TYPE_AUTHORITY => opts.authority.is_some(),
            PP2_TYPE_UNIQUE_ID => opts.unique_id.is_some(),
            _ => false,
        };
        let repeated = is_special(t) && opts.extra_tlvs.iter().filter(|e| e.0 == t).count() > 1;
        if dup || repeated {
            return Err(ProxyError::TlvDuplicate(t));
        }
        if t == PP2_TYPE_AUTHORITY && (v.len() > AUTHORITY_MAX_LEN || std::str::from_utf8(v).is_err()) {
            return Err(ProxyError::TlvBadValue { tlv_type: t, what: "bad authority" });
        }
        if t == PP2_TYPE_UNIQUE_ID && v.len() > UNIQUE_ID_MAX_LEN {
            return Err(ProxyError::UniqueIdTooLong(v.len()));
        }
        if t == PP2_TYPE_SSL {
            // The spec gives the SSL value a fixed structure; writing one parse refuses would
            // make our own peer drop the connection.
            check_ssl_tlv(v)?;
        }
    }

    let pair = same_family(src, dst);
    let addr_len = if pair.0.is_ipv4() { 12 } else { 36 };
    let tlv_len: usize = opts.authority.map_or(0, |a| 3 + a.len())
        + opts.unique_id.map_or(0, |u| 3 + u.len())
        + if opts.crc32c { 7 } else { 0 }
        + opts.extra_tlvs.iter().map(|(_, v)| 3 + v.len()).sum::<usize>();
    let total = V2_FIXED_LEN + addr_len + tlv_len;
    if total > V2_MAX_LEN {
        return Err(ProxyError::V2TooLong(total));
    }

    let too_long = |_| ProxyError::V2TooLong(total);
    let mut b = Builder::with_addresses(Version::Two | C::Proxy, Protocol::Stream, pair).reserve_capacity(tlv_len);
    if opts.crc32c {
        b = b.write_tlv(PP2_TYPE_CRC32C, &[0; 4]).map_err(too_long)?;
    }
    if let Some(a) = opts.authority {
        b = b.write_tlv(PP2_TYPE_AUTHORITY, a.as_bytes()).map_err(too_long)?;
    }
    if let Some(u) = opts.unique_id {
        b = b.write_tlv(PP2_TYPE_UNIQUE_ID, u).map_err(too_long)?;
    }
    for &(t, v) in opts.extra_tlvs {
        b = b.write_tlv(t, v).map_err(too_long)?;
    }
    let mut out = b.build().map_err(too_long)?;
    if opts.crc32c {
        let at = V2_FIXED_LEN + addr_len + 3;
        let crc = crc32c_with_zeroed(&out, at);
        if let Some(value) = out.get_mut(at..at + 4) {
            value.copy_from_slice(&crc.to_be_bytes());
        }
    }
    Ok(out)
}

fn is_special(t: u8) -> bool {
    matches!(t, PP2_TYPE_AUTHORITY | PP2_TYPE_CRC32C | PP2_TYPE_UNIQUE_ID)
}

/// PROXY v2 `LOCAL` command, AF_UNSPEC, no TLVs (what HAProxy sends for health checks).
pub fn encode_v2_local() -> Vec<u8> {
    // ver/cmd 0x20 (v2 LOCAL), fam 0x00 (UNSPEC), length 0. Too trivial to need ppp's builder.
    let mut out = V2_SIGNATURE.to_vec();
    out.extend_from_slice(&[0x20, 0x00, 0x00, 0x00]);
    out
}
