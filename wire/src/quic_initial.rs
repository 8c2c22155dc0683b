//! Sans-IO reading of a QUIC client's Initial packets (RFC 9000 §17.2.2, RFC 9001 §5): header protection off, payload decrypted, CRYPTO data reassembled until the ClientHello (and its SNI) can be read.
//!
//! Initial packets are protected with keys anyone can derive from the client's Destination
//! Connection ID (RFC 9001 §5.2), so a router can read the ClientHello without terminating
//! QUIC. The crypto is rustls's QUIC API with the aws-lc-rs provider the workspace builds
//! rustls with; only key derivation and AEAD/header-protection primitives are used, never a
//! TLS state machine.
// Indexing, unwrap and panics are banned here so that hostile input can never crash the router.
#![deny(unsafe_code, clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::client_hello::{self, ClientHelloInfo, HelloError, Status};
use rustls::quic::{DirectionalKeys, Keys, Version};
use rustls::{Side, SupportedCipherSuite};
use std::collections::BTreeMap;

/// QUIC version 1 (RFC 9000).
pub const VERSION_1: u32 = 0x0000_0001;
/// QUIC version 2 (RFC 9369): the same packets with other type bits, salt and labels.
pub const VERSION_2: u32 = 0x6b33_43cf;
/// RFC 9000 §14.1: a server discards a client Initial in a datagram smaller than this.
pub const MIN_INITIAL_DATAGRAM: usize = 1200;
/// RFC 9000 §17.2: connection IDs of v1 (and v2) are at most 20 bytes.
const MAX_CID_LEN: usize = 20;
/// RFC 9001 §5.4.2: the header-protection sample starts 4 bytes after the packet number field.
const PN_MAX_LEN: usize = 4;
const SAMPLE_LEN: usize = 16;
/// AEAD tag of the Initial cipher suite (AES-128-GCM).
const TAG_LEN: usize = 16;

const FRAME_PADDING: u64 = 0x00;
const FRAME_PING: u64 = 0x01;
const FRAME_ACK: u64 = 0x02;
const FRAME_ACK_ECN: u64 = 0x03;
const FRAME_CRYPTO: u64 = 0x06;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InitialError {
    /// Empty, or the first byte has neither header form QUIC uses.
    #[error("not a QUIC packet")]
    NotQuic,
    /// A short-header (1-RTT) packet: a flow's first datagram can never be one.
    #[error("short-header QUIC packet where an Initial was expected")]
    ShortHeader,
    /// A long-header packet of another type (0-RTT, Handshake, Retry) or a Version Negotiation.
    #[error("QUIC long-header packet that is not an Initial")]
    NotInitial,
    /// A version this reader cannot derive Initial keys for.
    #[error("QUIC version {0:#010x} is not supported")]
    UnknownVersion(u32),
    /// RFC 9000 §14.1: Initial packets come in datagrams of at least 1200 bytes.
    #[error("client Initial in a datagram of {0} bytes (at least 1200 required)")]
    ShortDatagram(usize),
    /// A later Initial names another connection (Destination Connection ID or version).
    #[error("QUIC Initial of another connection")]
    OtherConnection,
    /// The packet's framing is broken; the reason is a short static description.
    #[error("malformed QUIC Initial: {0}")]
    Malformed(&'static str),
    /// Authentication failed: not encrypted with this Destination Connection ID's Initial keys.
    #[error("QUIC Initial does not decrypt")]
    Decrypt,
    /// A frame type that has no place in a client Initial (RFC 9000 §12.4, Table 3).
    #[error("frame type {0:#x} is not allowed in a client Initial")]
    Frame(u64),
    /// The ClientHello would need more CRYPTO bytes or more packets than the caps allow.
    #[error("QUIC ClientHello exceeds the size limit")]
    TooLarge,
    /// The reassembled ClientHello itself is invalid.
    #[error(transparent)]
    Hello(#[from] HelloError),
}

impl InitialError {
    /// Every [`InitialError::reason`] but those of [`InitialError::Hello`] (see
    /// [`HelloError::REASONS`]).
    pub const REASONS: [&'static str; 10] = [
        "not_quic",
        "short_header",
        "not_initial",
        "unknown_version",
        "short_datagram",
        "other_connection",
        "malformed",
        "decrypt",
        "bad_frame",
        "too_large",
    ];

    /// Short snake_case label, stable for use as a metric dimension.
    pub fn reason(&self) -> &'static str {
        match self {
            InitialError::NotQuic => "not_quic",
            InitialError::ShortHeader => "short_header",
            InitialError::NotInitial => "not_initial",
            InitialError::UnknownVersion(_) => "unknown_version",
            InitialError::ShortDatagram(_) => "short_datagram",
            InitialError::OtherConnection => "other_connection",
            InitialError::Malformed(_) => "malformed",
            InitialError::Decrypt => "decrypt",
            InitialError::Frame(_) => "bad_frame",
            InitialError::TooLarge => "too_large",
            InitialError::Hello(e) => e.reason(),
        }
    }
}

/// The long-header packet types that matter here, by version (RFC 9000 §17.2, RFC 9369 §3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LongType {
    Initial,
    /// 0-RTT or Handshake: carries a Length field, so a coalesced one can be skipped.
    Other,
    Retry,
}

fn long_type(version: u32, bits: u8) -> Option<LongType> {
    let initial = match version {
        VERSION_1 => 0,
        VERSION_2 => 1,
        _ => return None,
    };
    let retry = (initial + 3) % 4;
    Some(if bits == initial {
        LongType::Initial
    } else if bits == retry {
        LongType::Retry
    } else {
        LongType::Other
    })
}

/// The rustls version whose Initial salt and labels `version` uses.
fn rustls_version(version: u32) -> Option<Version> {
    match version {
        VERSION_1 => Some(Version::V1),
        VERSION_2 => Some(Version::V2),
        _ => None,
    }
}

/// The keys that remove the protection of the client's Initial packets (RFC 9001 §5.2): the
/// server side's "remote" keys, derived with AES-128-GCM as every Initial is.
fn client_initial_keys(version: u32, dcid: &[u8]) -> Option<DirectionalKeys> {
    let SupportedCipherSuite::Tls13(suite) = rustls::crypto::aws_lc_rs::cipher_suite::TLS13_AES_128_GCM_SHA256 else {
        return None;
    };
    let quic = suite.quic?;
    Some(Keys::initial(rustls_version(version)?, suite, quic, dcid, Side::Server).remote)
}

/// Bounds-checked cursor over packet bytes.
struct Cursor<'a> {
    rest: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], InitialError> {
        let (head, tail) = self.rest.split_at_checked(n).ok_or(InitialError::Malformed(what))?;
        self.rest = tail;
        Ok(head)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, InitialError> {
        match self.take(1, what)? {
            [b] => Ok(*b),
            _ => Err(InitialError::Malformed(what)),
        }
    }

    /// RFC 9000 §16 variable-length integer.
    fn varint(&mut self, what: &'static str) -> Result<u64, InitialError> {
        let first = self.u8(what)?;
        let extra = (1usize << (first >> 6)) - 1;
        let mut v = u64::from(first & 0x3f);
        for &b in self.take(extra, what)? {
            v = (v << 8) | u64::from(b);
        }
        Ok(v)
    }

    fn varint_len(&mut self, what: &'static str) -> Result<usize, InitialError> {
        usize::try_from(self.varint(what)?).map_err(|_| InitialError::Malformed(what))
    }
}

/// The connection the first Initial named: later packets must belong to it.
struct Conn {
    version: u32,
    dcid: Vec<u8>,
    keys: DirectionalKeys,
}

/// Reads one client's first datagrams until the ClientHello is complete.
///
/// Bounded: at most `max_crypto` bytes of CRYPTO stream (offsets beyond it are refused, as are
/// buffered fragments adding up to more) and at most `max_packets` Initial packets. Errors are
/// final, as is `Complete`: later calls repeat the verdict.
pub struct InitialReader {
    max_crypto: usize,
    max_packets: usize,
    packets: usize,
    conn: Option<Conn>,
    /// Largest packet number decrypted so far (RFC 9000 §A.3 decoding).
    largest_pn: Option<u64>,
    /// The CRYPTO stream from offset 0, as far as it is contiguous.
    stream: Vec<u8>,
    /// Fragments beyond a gap, by offset; `held` counts their bytes.
    fragments: BTreeMap<usize, Vec<u8>>,
    held: usize,
    outcome: Option<Result<ClientHelloInfo, InitialError>>,
}

impl std::fmt::Debug for InitialReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InitialReader")
            .field("packets", &self.packets)
            .field("stream", &self.stream.len())
            .field("held", &self.held)
            .field("outcome", &self.outcome)
            .finish_non_exhaustive()
    }
}

impl InitialReader {
    pub fn new(max_crypto: usize, max_packets: usize) -> Self {
        Self {
            max_crypto,
            max_packets,
            packets: 0,
            conn: None,
            largest_pn: None,
            stream: Vec::new(),
            fragments: BTreeMap::new(),
            held: 0,
            outcome: None,
        }
    }

    /// Bytes of CRYPTO data the reader holds (contiguous prefix and fragments).
    pub fn buffered(&self) -> usize {
        self.stream.len().saturating_add(self.held)
    }

    /// The QUIC version of the connection, once a packet was read.
    pub fn version(&self) -> Option<u32> {
        self.conn.as_ref().map(|c| c.version)
    }

    /// Feed one datagram from the client. Its Initial packets are read; coalesced packets of
    /// other types (0-RTT, Handshake, a trailing short-header packet) are skipped, as are
    /// packets of another Destination Connection ID after the first (RFC 9000 §12.2).
    pub fn push(&mut self, datagram: &[u8]) -> Result<Status, InitialError> {
        if let Some(outcome) = &self.outcome {
            return outcome.clone().map(Status::Complete);
        }
        match self.read_datagram(datagram) {
            Ok(Some(info)) => {
                self.finish(Ok(info.clone()));
                Ok(Status::Complete(info))
            }
            Ok(None) => Ok(Status::Incomplete),
            Err(e) => {
                self.finish(Err(e.clone()));
                Err(e)
            }
        }
    }

    fn finish(&mut self, outcome: Result<ClientHelloInfo, InitialError>) {
        self.outcome = Some(outcome);
        self.stream = Vec::new();
        self.fragments = BTreeMap::new();
        self.held = 0;
    }

    fn read_datagram(&mut self, datagram: &[u8]) -> Result<Option<ClientHelloInfo>, InitialError> {
        let mut rest = datagram;
        let mut first = true;
        let mut initials = 0usize;
        while let Some(&b0) = rest.first() {
            if b0 & 0x80 == 0 {
                // A short-header packet runs to the end of the datagram.
                if first {
                    return Err(if b0 & 0x40 == 0 { InitialError::NotQuic } else { InitialError::ShortHeader });
                }
                break;
            }
            let (len, initial) = self.read_packet(rest, first, datagram.len())?;
            initials += usize::from(initial);
            rest = rest.get(len..).unwrap_or_default();
            first = false;
        }
        if first {
            return Err(InitialError::NotQuic);
        }
        if initials == 0 {
            return Ok(None);
        }
        self.hello()
    }

    /// Reads the long-header packet at the start of `pkt`; returns its length and whether it was
    /// an Initial of this connection that was absorbed.
    fn read_packet(&mut self, pkt: &[u8], first: bool, datagram_len: usize) -> Result<(usize, bool), InitialError> {
        let mut c = Cursor { rest: pkt };
        let b0 = c.u8("header")?;
        let version =
            u32::from_be_bytes(c.take(4, "version")?.try_into().map_err(|_| InitialError::Malformed("version"))?);
        if version == 0 {
            // Version Negotiation is sent by servers only.
            return Err(InitialError::NotInitial);
        }
        let Some(ty) = long_type(version, (b0 >> 4) & 0x03) else {
            return Err(InitialError::UnknownVersion(version));
        };
        if b0 & 0x40 == 0 {
            return Err(InitialError::Malformed("fixed bit"));
        }
        let dcid_len = usize::from(c.u8("connection id")?);
        if dcid_len > MAX_CID_LEN {
            return Err(InitialError::Malformed("connection id length"));
        }
        let dcid = c.take(dcid_len, "connection id")?;
        let scid_len = usize::from(c.u8("connection id")?);
        if scid_len > MAX_CID_LEN {
            return Err(InitialError::Malformed("connection id length"));
        }
        c.take(scid_len, "connection id")?;
        match ty {
            LongType::Retry => {
                // Servers send Retry; it has no Length field and ends the datagram.
                if first {
                    return Err(InitialError::NotInitial);
                }
                return Ok((pkt.len(), false));
            }
            LongType::Other => {
                if first && self.conn.is_none() {
                    return Err(InitialError::NotInitial);
                }
                let len = c.varint_len("length")?;
                c.take(len, "length")?;
                return Ok((pkt.len() - c.rest.len(), false));
            }
            LongType::Initial => {}
        }
        let token_len = c.varint_len("token length")?;
        c.take(token_len, "token")?;
        let len = c.varint_len("length")?;
        let pn_offset = pkt.len() - c.rest.len();
        let body = c.take(len, "length")?;
        let end = pn_offset + body.len();
        if datagram_len < MIN_INITIAL_DATAGRAM {
            return Err(InitialError::ShortDatagram(datagram_len));
        }

        match &self.conn {
            Some(conn) if conn.version != version || conn.dcid != dcid => {
                // RFC 9000 §12.2: coalesced packets of another connection are not ours to read;
                // a whole datagram of them is a client restarting, which this flow cannot follow.
                return if first { Err(InitialError::OtherConnection) } else { Ok((end, false)) };
            }
            Some(_) => {}
            None => {
                let keys = client_initial_keys(version, dcid).ok_or(InitialError::UnknownVersion(version))?;
                self.conn = Some(Conn { version, dcid: dcid.to_vec(), keys });
            }
        }
        self.packets += 1;
        if self.packets > self.max_packets {
            return Err(InitialError::TooLarge);
        }
        let payload = self.decrypt(pkt.get(..end).unwrap_or_default(), pn_offset)?;
        self.frames(&payload)?;
        Ok((end, true))
    }

    /// Removes header protection and decrypts the packet `pkt` (exactly one packet, its packet
    /// number field at `pn_offset`); returns the plaintext frames.
    fn decrypt(&mut self, pkt: &[u8], pn_offset: usize) -> Result<Vec<u8>, InitialError> {
        let Some(conn) = &self.conn else { return Err(InitialError::Decrypt) };
        let sample_at = pn_offset + PN_MAX_LEN;
        let sample = pkt.get(sample_at..sample_at + SAMPLE_LEN).ok_or(InitialError::Malformed("packet too short"))?;
        let mut first = pkt.first().copied().unwrap_or_default();
        let mut pn = [0u8; PN_MAX_LEN];
        pn.copy_from_slice(pkt.get(pn_offset..sample_at).ok_or(InitialError::Malformed("packet too short"))?);
        conn.keys.header.decrypt_in_place(sample, &mut first, &mut pn).map_err(|_| InitialError::Decrypt)?;
        if first & 0x0c != 0 {
            // RFC 9000 §17.2: reserved bits are 0 once protection is off; otherwise the keys
            // were wrong (or the packet forged).
            return Err(InitialError::Decrypt);
        }
        let pn_len = usize::from(first & 0x03) + 1;
        let truncated = pn.iter().take(pn_len).fold(0u64, |v, &b| (v << 8) | u64::from(b));
        let number = decode_packet_number(self.largest_pn, truncated, pn_len);

        let header_end = pn_offset + pn_len;
        let mut header = pkt.get(..header_end).unwrap_or_default().to_vec();
        if let Some(h0) = header.first_mut() {
            *h0 = first;
        }
        if let Some(h) = header.get_mut(pn_offset..) {
            h.copy_from_slice(pn.get(..pn_len).unwrap_or_default());
        }
        let mut payload = pkt.get(header_end..).unwrap_or_default().to_vec();
        if payload.len() < TAG_LEN {
            return Err(InitialError::Malformed("packet too short"));
        }
        let plain_len =
            conn.keys.packet.decrypt_in_place(number, &header, &mut payload).map_err(|_| InitialError::Decrypt)?.len();
        payload.truncate(plain_len);
        self.largest_pn = Some(self.largest_pn.map_or(number, |l| l.max(number)));
        Ok(payload)
    }

    /// Walks the frames of one decrypted Initial, keeping CRYPTO data.
    fn frames(&mut self, payload: &[u8]) -> Result<(), InitialError> {
        if payload.is_empty() {
            // RFC 9000 §12.4: a packet carries at least one frame.
            return Err(InitialError::Malformed("empty packet"));
        }
        let mut c = Cursor { rest: payload };
        while !c.rest.is_empty() {
            match c.varint("frame type")? {
                FRAME_PADDING | FRAME_PING => {}
                ty @ (FRAME_ACK | FRAME_ACK_ECN) => {
                    c.varint("ack")?; // largest acknowledged
                    c.varint("ack")?; // delay
                    let ranges = c.varint("ack")?;
                    c.varint("ack")?; // first range
                    for _ in 0..ranges {
                        // Each range is at least two bytes, so a huge count runs out of input.
                        c.varint("ack")?;
                        c.varint("ack")?;
                    }
                    if ty == FRAME_ACK_ECN {
                        for _ in 0..3 {
                            c.varint("ack")?;
                        }
                    }
                }
                FRAME_CRYPTO => {
                    let offset = c.varint_len("crypto offset")?;
                    let len = c.varint_len("crypto length")?;
                    let data = c.take(len, "crypto length")?;
                    self.crypto(offset, data)?;
                }
                other => return Err(InitialError::Frame(other)),
            }
        }
        Ok(())
    }

    /// Places CRYPTO data at `offset` of the stream; out-of-order fragments wait in `fragments`.
    fn crypto(&mut self, offset: usize, data: &[u8]) -> Result<(), InitialError> {
        let end = offset.checked_add(data.len()).ok_or(InitialError::TooLarge)?;
        if end > self.max_crypto {
            return Err(InitialError::TooLarge);
        }
        let have = self.stream.len();
        if end <= have {
            return Ok(()); // a retransmission of what we have
        }
        if offset <= have {
            self.stream.extend_from_slice(data.get(have - offset..).unwrap_or_default());
            self.drain_fragments();
            return Ok(());
        }
        // Beyond a gap: keep the longer of two fragments at one offset.
        let prev = self.fragments.get(&offset).map_or(0, Vec::len);
        if data.len() > prev {
            let held = self.held - prev + data.len();
            // Overlapping retransmissions could otherwise hold more than the stream can be long.
            if held > self.max_crypto {
                return Err(InitialError::TooLarge);
            }
            self.held = held;
            self.fragments.insert(offset, data.to_vec());
        }
        Ok(())
    }

    /// Moves fragments that now touch the contiguous prefix into it.
    fn drain_fragments(&mut self) {
        while let Some(entry) = self.fragments.first_entry() {
            let offset = *entry.key();
            let have = self.stream.len();
            if offset > have {
                break;
            }
            let frag = entry.remove();
            self.held -= frag.len();
            if let Some(new) = frag.get(have - offset..) {
                self.stream.extend_from_slice(new);
            }
        }
    }

    fn hello(&self) -> Result<Option<ClientHelloInfo>, InitialError> {
        match client_hello::parse_handshake_message(&self.stream, self.max_crypto)? {
            Status::Complete(info) => Ok(Some(info)),
            Status::Incomplete => Ok(None),
        }
    }
}

/// RFC 9000 §A.3: the full packet number closest to the next expected one.
fn decode_packet_number(largest: Option<u64>, truncated: u64, pn_len: usize) -> u64 {
    let expected = largest.map_or(0, |l| l.saturating_add(1));
    let win = 1u64 << (pn_len * 8);
    let hwin = win / 2;
    let mask = win - 1;
    let candidate = (expected & !mask) | truncated;
    if candidate.saturating_add(hwin) <= expected && candidate < (1u64 << 62) - win {
        candidate + win
    } else if candidate > expected.saturating_add(hwin) && candidate >= win {
        candidate - win
    } else {
        candidate
    }
}

/// What a router needs to know about a datagram before keeping any state for its sender: whether
/// it starts with a long-header Initial of a supported version in a datagram large enough.
/// Cheap (no crypto), so a flood of garbage costs no key derivation.
pub fn looks_like_initial(datagram: &[u8]) -> Result<(), InitialError> {
    let Some(&b0) = datagram.first() else { return Err(InitialError::NotQuic) };
    if b0 & 0x80 == 0 {
        return Err(if b0 & 0x40 == 0 { InitialError::NotQuic } else { InitialError::ShortHeader });
    }
    let Some(v) = datagram.get(1..5).and_then(|v| <[u8; 4]>::try_from(v).ok()) else {
        return Err(InitialError::Malformed("version"));
    };
    let version = u32::from_be_bytes(v);
    if version == 0 {
        return Err(InitialError::NotInitial);
    }
    match long_type(version, (b0 >> 4) & 0x03) {
        None => Err(InitialError::UnknownVersion(version)),
        Some(LongType::Initial) if datagram.len() < MIN_INITIAL_DATAGRAM => {
            Err(InitialError::ShortDatagram(datagram.len()))
        }
        Some(LongType::Initial) => Ok(()),
        Some(_) => Err(InitialError::NotInitial),
    }
}

/// Client Initials built as a client would, for tests here and in the router's (the `test-util`
/// feature): not part of the API.
#[cfg(any(test, feature = "test-util"))]
pub mod build {
    use super::{MIN_INITIAL_DATAGRAM, TAG_LEN, VERSION_2, rustls_version};
    use rustls::quic::Keys;
    use rustls::{Side, SupportedCipherSuite};

    fn varint(v: u64) -> Vec<u8> {
        match v {
            0..=63 => vec![v as u8],
            64..=16383 => (v as u16 | 0x4000).to_be_bytes().to_vec(),
            _ => (v as u32 | 0x8000_0000).to_be_bytes().to_vec(),
        }
    }

    /// Protects an Initial: `header` unprotected, ending in a 4-byte packet number `pn`, with
    /// `payload` (frames) after it. `None` for an unsupported version or a header too short.
    pub fn seal(version: u32, dcid: &[u8], header: &[u8], pn: u64, payload: &[u8]) -> Option<Vec<u8>> {
        let SupportedCipherSuite::Tls13(suite) = rustls::crypto::aws_lc_rs::cipher_suite::TLS13_AES_128_GCM_SHA256
        else {
            return None;
        };
        let keys = Keys::initial(rustls_version(version)?, suite, suite.quic?, dcid, Side::Client);
        let mut body = payload.to_vec();
        let tag = keys.local.packet.encrypt_in_place(pn, header, &mut body).ok()?;
        let mut pkt = header.to_vec();
        pkt.extend_from_slice(&body);
        pkt.extend_from_slice(tag.as_ref());
        let pn_offset = header.len().checked_sub(4)?;
        let sample = pkt.get(pn_offset + 4..pn_offset + 20)?.to_vec();
        let (head, pn_bytes) = pkt.split_at_mut(pn_offset);
        keys.local.header.encrypt_in_place(&sample, head.first_mut()?, pn_bytes.get_mut(..4)?).ok()?;
        Some(pkt)
    }

    /// A whole client Initial of `version` carrying `frames`, padded so the datagram is `size`
    /// bytes (or not at all if the frames are longer).
    pub fn client_initial(version: u32, dcid: &[u8], pn: u64, frames: &[u8], size: usize) -> Option<Vec<u8>> {
        let type_bits = if version == VERSION_2 { 0x10 } else { 0x00 };
        let mut header = vec![0xc3 | type_bits];
        header.extend_from_slice(&version.to_be_bytes());
        header.push(u8::try_from(dcid.len()).ok()?);
        header.extend_from_slice(dcid);
        header.push(0); // scid
        header.push(0); // token
        let fixed = header.len() + 2 + 4 + TAG_LEN;
        let payload_len = size.saturating_sub(fixed).max(frames.len());
        let mut payload = frames.to_vec();
        payload.resize(payload_len, 0);
        // A varint of 2 bytes holds at most 16383: a longer packet (one datagram may hold up to
        // 65527 bytes) takes 4.
        header.extend_from_slice(&varint(u64::try_from(payload_len + 4 + TAG_LEN).ok()?));
        header.extend_from_slice(&(pn as u32).to_be_bytes());
        seal(version, dcid, &header, pn, &payload)
    }

    /// A 1200-byte client Initial of QUIC v1.
    pub fn initial_v1(dcid: &[u8], pn: u64, frames: &[u8]) -> Option<Vec<u8>> {
        client_initial(super::VERSION_1, dcid, pn, frames, MIN_INITIAL_DATAGRAM)
    }

    /// A CRYPTO frame carrying `data` at `offset` of the stream.
    pub fn crypto_frame(offset: usize, data: &[u8]) -> Vec<u8> {
        let mut f = vec![0x06];
        f.extend(varint(offset as u64));
        f.extend(varint(data.len() as u64));
        f.extend_from_slice(data);
        f
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests;
