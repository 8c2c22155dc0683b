//! Sans-IO, incremental parsing of a TLS ClientHello (SNI, ALPN, versions) from the first bytes of a connection, plus fatal alert bytes for rejecting a client.
// Indexing, unwrap and panics are banned here so that hostile input can never crash the proxy.
#![deny(unsafe_code, clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

/// Cap used by the project (and by [`HelloParser::default`]): one maximal TLS record as it is on
/// the wire, 5-byte header included. The cap counts wire bytes because that is what the router
/// buffers (the records are replayed to the backend as they came).
pub const DEFAULT_MAX_LEN: usize = RECORD_HEADER_LEN + MAX_RECORD_BODY;

pub const ALERT_HANDSHAKE_FAILURE: u8 = 40;
pub const ALERT_DECODE_ERROR: u8 = 50;
pub const ALERT_INTERNAL_ERROR: u8 = 80;
pub const ALERT_UNRECOGNIZED_NAME: u8 = 112;

const RECORD_HANDSHAKE: u8 = 0x16;
const RECORD_ALERT: u8 = 0x15;
const RECORD_HEADER_LEN: usize = 5;
/// RFC 8446 5.1: a plaintext record body never exceeds 2^14 bytes.
const MAX_RECORD_BODY: usize = 16384;
const HANDSHAKE_HEADER_LEN: usize = 4;
const HANDSHAKE_CLIENT_HELLO: u8 = 1;

const EXT_SERVER_NAME: u16 = 0;
const EXT_ALPN: u16 = 16;
const EXT_SUPPORTED_VERSIONS: u16 = 43;
const SNI_HOST_NAME: u8 = 0;
const TLS13: u16 = 0x0304;

/// What the router needs from a ClientHello.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientHelloInfo {
    /// Lower-cased, one trailing dot removed; `None` if there was no server_name extension.
    pub sni: Option<String>,
    /// Protocols in offered order (lossy UTF-8).
    pub alpn: Vec<String>,
    /// The ClientHello's `legacy_version` (client_version) field.
    pub legacy_version: u16,
    /// `supported_versions` lists TLS 1.3.
    pub supported_versions_tls13: bool,
    /// Bytes of the buffer occupied by the records that carried the hello (end of the last one).
    pub len: usize,
    /// How many TLS records carried the hello.
    pub records: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    Incomplete,
    Complete(ClientHelloInfo),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HelloError {
    /// The connection does not start with a TLS handshake record.
    #[error("not a TLS handshake")]
    NotTls,
    /// The hello (or the records needed to carry it) would exceed the configured cap.
    #[error("TLS ClientHello exceeds the size limit")]
    TooLarge,
    /// Framing or content is invalid; the reason is a short static description.
    #[error("malformed TLS ClientHello: {0}")]
    Malformed(&'static str),
}

impl HelloError {
    /// Every [`HelloError::reason`].
    pub const REASONS: [&'static str; 3] = ["not_tls", "too_large", "malformed"];

    /// Short snake_case label, stable for use as a metric dimension.
    pub fn reason(&self) -> &'static str {
        match self {
            HelloError::NotTls => "not_tls",
            HelloError::TooLarge => "too_large",
            HelloError::Malformed(_) => "malformed",
        }
    }
}

/// Bytes of a fatal alert record. Version 0x0303 because every TLS version's client accepts it before negotiation.
pub fn alert_record(description: u8) -> [u8; 7] {
    // level 2 = fatal; body length 2.
    [RECORD_ALERT, 0x03, 0x03, 0x00, 0x02, 0x02, description]
}

/// Accumulates nothing itself: caller owns the buffer and calls `parse` again with the whole prefix read so far.
///
/// Internally only the handshake bytes are copied out of the records (so that a hello split across
/// records can be parsed as one message); record framing is consumed once, so each call costs
/// O(new bytes) and a hello fed byte by byte stays linear overall.
#[derive(Debug)]
pub struct HelloParser {
    max_len: usize,
    /// Offset in the caller's buffer of the next byte not yet consumed.
    pos: usize,
    /// Body bytes of the current record not yet consumed; 0 means a record header is expected next.
    rec_remaining: usize,
    /// End offset of the current (or last) record.
    rec_end: usize,
    records: usize,
    /// Reassembled handshake message (header + body), never longer than `hs_total`.
    hs: Vec<u8>,
    /// Length of the whole handshake message once its header has been seen.
    hs_total: Option<usize>,
    /// Parsed hello waiting only for the rest of its last record to arrive.
    pending: Option<ClientHelloInfo>,
    /// Final verdict: an error later calls repeat, or success (its hello handed out; a later
    /// call parses the same prefix again rather than keep a copy every connection would pay for).
    outcome: Option<Result<(), HelloError>>,
}

impl Default for HelloParser {
    /// A derived default would have a cap of 0 and reject everything, so use the project's cap.
    fn default() -> Self {
        Self::new(DEFAULT_MAX_LEN)
    }
}

impl HelloParser {
    /// `max_len`: the most bytes of records we are willing to buffer for one hello.
    pub fn new(max_len: usize) -> Self {
        HelloParser {
            max_len,
            pos: 0,
            rec_remaining: 0,
            rec_end: 0,
            records: 0,
            hs: Vec::new(),
            hs_total: None,
            pending: None,
            outcome: None,
        }
    }

    /// `buf` is the complete prefix of the connection read so far (it only ever grows between calls).
    ///
    /// Errors are final: once returned, every later call returns the same error, as does `Complete`.
    pub fn parse(&mut self, buf: &[u8]) -> Result<Status, HelloError> {
        match self.outcome {
            Some(Err(e)) => return Err(e),
            Some(Ok(())) => return HelloParser::new(self.max_len).parse(buf),
            None => {}
        }
        if buf.len() < self.pos {
            // The caller broke the "only grows" contract; start over rather than read stale state.
            *self = HelloParser::new(self.max_len);
        }
        match self.advance(buf) {
            Ok(Some(info)) => {
                self.outcome = Some(Ok(()));
                self.hs = Vec::new();
                Ok(Status::Complete(info))
            }
            Ok(None) => Ok(Status::Incomplete),
            Err(e) => {
                self.outcome = Some(Err(e));
                self.hs = Vec::new();
                Err(e)
            }
        }
    }

    /// Consumes as much of `buf` as possible; `Ok(None)` means more bytes are needed.
    fn advance(&mut self, buf: &[u8]) -> Result<Option<ClientHelloInfo>, HelloError> {
        // Each iteration consumes a record header or at least one body byte, or returns,
        // so the loop is bounded by the buffer length.
        loop {
            if self.rec_remaining == 0 {
                if let Some(info) = self.pending.take() {
                    return Ok(Some(info));
                }
                let rest = buf.get(self.pos..).unwrap_or_default();
                if !self.read_record_header(rest)? {
                    return Ok(None);
                }
                continue;
            }
            let avail = buf.len().saturating_sub(self.pos);
            let take = avail.min(self.rec_remaining);
            if take == 0 {
                return Ok(None);
            }
            let chunk = buf.get(self.pos..self.pos.saturating_add(take)).unwrap_or_default();
            self.pos = self.pos.saturating_add(take);
            self.absorb(chunk)?;
        }
    }

    /// Validates as much of the next record header as is available; true once it is consumed.
    fn read_record_header(&mut self, rest: &[u8]) -> Result<bool, HelloError> {
        let first = self.records == 0;
        // Checked byte by byte so a non-TLS peer is recognised from its very first byte.
        if let Some(&ty) = rest.first()
            && ty != RECORD_HANDSHAKE
        {
            return Err(if first { HelloError::NotTls } else { HelloError::Malformed("interleaved record type") });
        }
        if let Some(&major) = rest.get(1)
            && major != 3
        {
            return Err(if first { HelloError::NotTls } else { HelloError::Malformed("record version") });
        }
        if let Some(&minor) = rest.get(2)
            && minor > 4
        {
            return Err(HelloError::Malformed("record version"));
        }
        let (Some(&hi), Some(&lo)) = (rest.get(3), rest.get(4)) else {
            return Ok(false);
        };
        let len = usize::from(u16::from_be_bytes([hi, lo]));
        if len == 0 || len > MAX_RECORD_BODY {
            return Err(HelloError::Malformed("record length"));
        }
        let end = self.pos.saturating_add(RECORD_HEADER_LEN).saturating_add(len);
        if end > self.max_len {
            return Err(HelloError::TooLarge);
        }
        self.pos = self.pos.saturating_add(RECORD_HEADER_LEN);
        self.rec_end = end;
        self.rec_remaining = len;
        self.records = self.records.saturating_add(1);
        self.check_cap()?;
        Ok(true)
    }

    /// Moves record body bytes into the handshake message; bytes after the hello are skipped.
    ///
    /// `rec_remaining` is decremented as bytes move, so `hs.len() + rec_remaining` stays exact for
    /// `check_cap` however the bytes were split into reads.
    fn absorb(&mut self, mut chunk: &[u8]) -> Result<(), HelloError> {
        if self.pending.is_some() {
            // Hello done; the rest of its last record is not ours to judge.
            self.rec_remaining = self.rec_remaining.saturating_sub(chunk.len());
            return Ok(());
        }
        if self.hs.is_empty() && self.parse_in_place(chunk)? {
            return Ok(());
        }
        // At most two rounds: one to complete the 4-byte header, one for the body.
        while !chunk.is_empty() {
            let want = match self.hs_total {
                Some(total) => total.saturating_sub(self.hs.len()),
                None => HANDSHAKE_HEADER_LEN.saturating_sub(self.hs.len()),
            };
            if want == 0 {
                // Hello done; anything else in its last record is not ours to judge.
                self.rec_remaining = self.rec_remaining.saturating_sub(chunk.len());
                return Ok(());
            }
            let (now, later) = chunk.split_at(want.min(chunk.len()));
            self.hs.extend_from_slice(now);
            self.rec_remaining = self.rec_remaining.saturating_sub(now.len());
            chunk = later;

            if self.hs_total.is_none() {
                if let Some(&ty) = self.hs.first()
                    && ty != HANDSHAKE_CLIENT_HELLO
                {
                    return Err(HelloError::Malformed("handshake type"));
                }
                if let &[_, a, b, c] = self.hs.as_slice() {
                    let body = (usize::from(a) << 16) | (usize::from(b) << 8) | usize::from(c);
                    let total = HANDSHAKE_HEADER_LEN.saturating_add(body);
                    self.hs_total = Some(total);
                    // No reserve from `total`: it is the peer's claim, and thousands of stalled
                    // peers each claiming the cap would cost memory they never sent.
                    self.check_cap()?;
                }
            }
            if let Some(total) = self.hs_total
                && self.hs.len() == total
                && self.pending.is_none()
            {
                let body = self.hs.get(HANDSHAKE_HEADER_LEN..).unwrap_or_default();
                let mut info = parse_client_hello(body)?;
                info.len = self.rec_end;
                info.records = self.records;
                self.pending = Some(info);
            }
        }
        Ok(())
    }

    /// The usual case: the whole hello at the start of `chunk` (one record, read at once) is
    /// parsed where it lies, without copying it out of the record. `false` when it is not all
    /// there (the bytes are then taken the general way).
    fn parse_in_place(&mut self, chunk: &[u8]) -> Result<bool, HelloError> {
        let Some(&[ty, a, b, c]) = chunk.first_chunk::<HANDSHAKE_HEADER_LEN>() else {
            return Ok(false);
        };
        let total =
            HANDSHAKE_HEADER_LEN.saturating_add((usize::from(a) << 16) | (usize::from(b) << 8) | usize::from(c));
        let Some(msg) = chunk.get(..total) else {
            return Ok(false);
        };
        if ty != HANDSHAKE_CLIENT_HELLO {
            return Err(HelloError::Malformed("handshake type"));
        }
        let mut info = parse_client_hello(msg.get(HANDSHAKE_HEADER_LEN..).unwrap_or_default())?;
        info.len = self.rec_end;
        info.records = self.records;
        self.hs_total = Some(total);
        self.pending = Some(info);
        self.rec_remaining = self.rec_remaining.saturating_sub(chunk.len());
        Ok(true)
    }

    /// Bytes the parser holds allocated for the handshake message, for tests that check memory
    /// grows with the bytes received rather than with the length the peer declared.
    #[doc(hidden)]
    pub fn buffer_capacity(&self) -> usize {
        self.hs.capacity()
    }

    /// TooLarge as soon as the declared handshake length implies records beyond the cap.
    fn check_cap(&self) -> Result<(), HelloError> {
        let Some(total) = self.hs_total else {
            return Ok(());
        };
        // Handshake bytes already copied or still inside the current record.
        let covered = self.hs.len().saturating_add(self.rec_remaining);
        let deficit = total.saturating_sub(covered);
        let needed_end = if deficit == 0 {
            self.rec_end
        } else {
            // Lower bound: the missing bytes in maximal records, each with its own header.
            let extra_records = deficit.div_ceil(MAX_RECORD_BODY);
            self.rec_end.saturating_add(deficit).saturating_add(extra_records.saturating_mul(RECORD_HEADER_LEN))
        };
        if needed_end > self.max_len {
            return Err(HelloError::TooLarge);
        }
        Ok(())
    }
}

/// Reads a ClientHello from the handshake stream itself, without TLS record framing: what QUIC
/// carries in CRYPTO frames (RFC 9001 §4). `msg` is the contiguous prefix of the stream received
/// so far; `max_len` caps the whole handshake message (4-byte header included).
///
/// Stateless (the caller keeps the bytes): a hello is parsed once, when it is all there, and the
/// length check before that costs nothing per call. `len` of the result is the message length;
/// `records` is 0 (there are none).
pub fn parse_handshake_message(msg: &[u8], max_len: usize) -> Result<Status, HelloError> {
    if let Some(&ty) = msg.first()
        && ty != HANDSHAKE_CLIENT_HELLO
    {
        return Err(HelloError::Malformed("handshake type"));
    }
    let Some(&[_, a, b, c]) = msg.first_chunk::<HANDSHAKE_HEADER_LEN>() else {
        return Ok(Status::Incomplete);
    };
    let total = HANDSHAKE_HEADER_LEN.saturating_add((usize::from(a) << 16) | (usize::from(b) << 8) | usize::from(c));
    if total > max_len {
        return Err(HelloError::TooLarge);
    }
    let Some(body) = msg.get(HANDSHAKE_HEADER_LEN..total) else {
        return Ok(Status::Incomplete);
    };
    let mut info = parse_client_hello(body)?;
    info.len = total;
    Ok(Status::Complete(info))
}

/// Bounds-checked cursor; every read names the field so errors say what was wrong.
struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn new(rest: &'a [u8]) -> Self {
        Reader { rest }
    }

    fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }

    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], HelloError> {
        let (head, tail) = self.rest.split_at_checked(n).ok_or(HelloError::Malformed(what))?;
        self.rest = tail;
        Ok(head)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, HelloError> {
        match self.take(1, what)? {
            [b] => Ok(*b),
            _ => Err(HelloError::Malformed(what)),
        }
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, HelloError> {
        match self.take(2, what)? {
            [a, b] => Ok(u16::from_be_bytes([*a, *b])),
            _ => Err(HelloError::Malformed(what)),
        }
    }

    fn vec8(&mut self, what: &'static str) -> Result<&'a [u8], HelloError> {
        let n = self.u8(what)?;
        self.take(usize::from(n), what)
    }

    fn vec16(&mut self, what: &'static str) -> Result<&'a [u8], HelloError> {
        let n = self.u16(what)?;
        self.take(usize::from(n), what)
    }
}

/// Parses the ClientHello body (after the 4-byte handshake header); `len`/`records` are filled in by the caller.
fn parse_client_hello(body: &[u8]) -> Result<ClientHelloInfo, HelloError> {
    let mut r = Reader::new(body);
    let legacy_version = r.u16("client version")?;
    if legacy_version >> 8 != 3 {
        return Err(HelloError::Malformed("client version"));
    }
    r.take(32, "random")?;
    if r.vec8("session id length")?.len() > 32 {
        return Err(HelloError::Malformed("session id length"));
    }
    let suites = r.vec16("cipher suites length")?;
    if suites.is_empty() || suites.len() % 2 != 0 {
        return Err(HelloError::Malformed("cipher suites length"));
    }
    if r.vec8("compression methods")?.is_empty() {
        return Err(HelloError::Malformed("compression methods"));
    }

    let mut info = ClientHelloInfo {
        sni: None,
        alpn: Vec::new(),
        legacy_version,
        supported_versions_tls13: false,
        len: 0,
        records: 0,
    };
    // Extensions are optional (pre-TLS 1.2 clients), but if present must fill the message exactly.
    if r.is_empty() {
        return Ok(info);
    }
    let exts = r.vec16("extensions length")?;
    if !r.is_empty() {
        return Err(HelloError::Malformed("extensions length"));
    }

    // First pass checks framing and duplicates, so a duplicated extension is reported as such
    // regardless of what its contents look like.
    let mut seen = Vec::new();
    let mut er = Reader::new(exts);
    while !er.is_empty() {
        seen.push(er.u16("extension overrun")?);
        er.vec16("extension overrun")?;
    }
    seen.sort_unstable();
    if seen.windows(2).any(|w| matches!(w, [a, b] if a == b)) {
        return Err(HelloError::Malformed("duplicate extension"));
    }

    let mut er = Reader::new(exts);
    while !er.is_empty() {
        let ty = er.u16("extension overrun")?;
        let data = er.vec16("extension overrun")?;
        match ty {
            EXT_SERVER_NAME => info.sni = Some(parse_server_name(data)?),
            EXT_ALPN => info.alpn = parse_alpn(data)?,
            EXT_SUPPORTED_VERSIONS => info.supported_versions_tls13 = parse_supported_versions(data)?,
            _ => {}
        }
    }
    Ok(info)
}

fn parse_server_name(data: &[u8]) -> Result<String, HelloError> {
    let mut r = Reader::new(data);
    let list = r.vec16("sni list length")?;
    if !r.is_empty() {
        return Err(HelloError::Malformed("sni list length"));
    }
    if list.is_empty() {
        return Err(HelloError::Malformed("sni empty list"));
    }
    let mut lr = Reader::new(list);
    let mut host = None;
    while !lr.is_empty() {
        // Like OpenSSL, treat host_name as the only name type that can exist (RFC 6066 never grew others).
        if lr.u8("sni entry")? != SNI_HOST_NAME {
            return Err(HelloError::Malformed("sni name type"));
        }
        let name = lr.vec16("sni entry")?;
        // RFC 6066: at most one name per type; two would make routing ambiguous.
        if host.replace(name).is_some() {
            return Err(HelloError::Malformed("duplicate sni host name"));
        }
    }
    normalize_hostname(host.unwrap_or_default())
}

/// Lower-cases and strips one trailing dot; only LDH plus '_' (seen in real names) is accepted.
fn normalize_hostname(name: &[u8]) -> Result<String, HelloError> {
    if name.is_empty() {
        return Err(HelloError::Malformed("empty hostname"));
    }
    if name.len() > 255 {
        return Err(HelloError::Malformed("bad hostname"));
    }
    let name = name.strip_suffix(b".").unwrap_or(name);
    let valid_char = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_');
    if !name.iter().all(valid_char) || name.split(|&b| b == b'.').any(<[u8]>::is_empty) {
        return Err(HelloError::Malformed("bad hostname"));
    }
    // All bytes are ASCII here, so this conversion cannot lose anything.
    String::from_utf8(name.to_ascii_lowercase()).map_err(|_| HelloError::Malformed("bad hostname"))
}

fn parse_alpn(data: &[u8]) -> Result<Vec<String>, HelloError> {
    let mut r = Reader::new(data);
    let list = r.vec16("alpn list length")?;
    if !r.is_empty() {
        return Err(HelloError::Malformed("alpn list length"));
    }
    if list.is_empty() {
        return Err(HelloError::Malformed("alpn empty list"));
    }
    let mut lr = Reader::new(list);
    let mut protos = Vec::new();
    while !lr.is_empty() {
        let p = lr.vec8("alpn overrun")?;
        if p.is_empty() {
            return Err(HelloError::Malformed("alpn empty protocol"));
        }
        protos.push(String::from_utf8_lossy(p).into_owned());
    }
    Ok(protos)
}

fn parse_supported_versions(data: &[u8]) -> Result<bool, HelloError> {
    let mut r = Reader::new(data);
    let list = r.vec8("supported versions length")?;
    if !r.is_empty() || list.is_empty() || list.len() % 2 != 0 {
        return Err(HelloError::Malformed("supported versions length"));
    }
    Ok(list.chunks_exact(2).any(|v| matches!(v, [a, b] if u16::from_be_bytes([*a, *b]) == TLS13)))
}
