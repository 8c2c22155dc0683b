//! Sans-IO HTTP/1.x heads: the request-head reader for CONNECT and absolute-form proxy requests, the response heads the proxy writes back, and the reader of an upstream's response head.

use std::net::Ipv6Addr;

/// Most headers accepted in one request head.
pub const MAX_HEADERS: usize = 64;
/// Most headers accepted in one response head (an answer to CONNECT is a few lines).
pub const MAX_RESPONSE_HEADERS: usize = 32;
/// Suggested `max_len` for callers without their own limit.
pub const DEFAULT_MAX_LEN: usize = 8192;
/// Longest method token [`looks_like_http`] waits for before answering `No`.
const MAX_METHOD_LEN: usize = 16;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    pub method: String,
    pub target: String,
    /// Minor version: 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub version: u8,
    /// Names as sent (case preserved), values as raw bytes, in order.
    pub headers: Vec<(String, Vec<u8>)>,
    /// Bytes of the head including the blank line that ends it.
    pub len: usize,
}

#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum HeadError {
    #[error("request head exceeds the size limit")]
    TooLarge,
    #[error("request head has more than {MAX_HEADERS} headers")]
    TooManyHeaders,
    #[error("malformed request head: {0}")]
    Malformed(&'static str),
    #[error("unsupported HTTP version (only HTTP/1.0 and HTTP/1.1)")]
    BadVersion,
    #[error("request method is not CONNECT")]
    NotConnect,
    #[error("bad CONNECT authority: {0}")]
    BadAuthority(&'static str),
    #[error("bad absolute-form target: {0}")]
    BadTarget(&'static str),
}

impl HeadError {
    /// Every [`HeadError::reason`].
    pub const REASONS: [&'static str; 7] = [
        "head_too_large",
        "head_too_many_headers",
        "head_malformed",
        "head_bad_version",
        "head_not_connect",
        "head_bad_authority",
        "head_bad_target",
    ];

    /// Short, stable snake_case label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            HeadError::TooLarge => "head_too_large",
            HeadError::TooManyHeaders => "head_too_many_headers",
            HeadError::Malformed(_) => "head_malformed",
            HeadError::BadVersion => "head_bad_version",
            HeadError::NotConnect => "head_not_connect",
            HeadError::BadAuthority(_) => "head_bad_authority",
            HeadError::BadTarget(_) => "head_bad_target",
        }
    }
}

impl RequestHead {
    /// First value of header `name`, compared case-insensitively.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_slice())
    }

    /// Case-sensitive, as methods are.
    pub fn is_connect(&self) -> bool {
        self.method == "CONNECT"
    }

    /// CONNECT authority-form `host:port` -> `(host, port)`.
    ///
    /// IPv6 literals must be bracketed (`[::1]:443`) and are returned without brackets, so
    /// the pair can go straight to `ToSocketAddrs`. The port is mandatory and 1..=65535.
    /// Hosts are limited to IPv4/IPv6 literals and DNS-style names (`A-Z a-z 0-9 - . _`);
    /// userinfo, paths, percent-encoding and IPv6 zone ids are rejected.
    pub fn connect_authority(&self) -> Result<(String, u16), HeadError> {
        if !self.is_connect() {
            return Err(HeadError::NotConnect);
        }
        let (host, port) = split_host_port(&self.target).map_err(HeadError::BadAuthority)?;
        let port = port.ok_or(HeadError::BadAuthority("missing port"))?;
        Ok((host, port))
    }

    /// Absolute-form `http://host[:port]/path?q` -> `(host, port, origin-form)`, as sent to
    /// forward proxies. Scheme must be `http` (any case); port defaults to 80; an empty
    /// path becomes `/`. Userinfo and fragments are rejected. Host rules as in
    /// [`RequestHead::connect_authority`].
    pub fn absolute_form(&self) -> Result<(String, u16, String), HeadError> {
        if self.is_connect() {
            return Err(HeadError::BadTarget("CONNECT uses authority-form"));
        }
        let t = self.target.as_str();
        let rest = match t.get(..7) {
            Some(s) if s.eq_ignore_ascii_case("http://") => &t[7..],
            _ => return Err(HeadError::BadTarget("not an http:// absolute URI")),
        };
        if rest.contains('#') {
            return Err(HeadError::BadTarget("fragment in request target"));
        }
        let auth_end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, path) = rest.split_at(auth_end);
        let (host, port) = split_host_port(authority).map_err(HeadError::BadTarget)?;
        let path = if path.starts_with('/') { path.to_owned() } else { format!("/{path}") };
        Ok((host, port.unwrap_or(80), path))
    }
}

/// `host[:port]` with the host checks shared by CONNECT and absolute-form.
fn split_host_port(s: &str) -> Result<(String, Option<u16>), &'static str> {
    if s.contains('@') {
        return Err("userinfo not allowed");
    }
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let close = rest.find(']').ok_or("unclosed '['")?;
        let ip = &rest[..close];
        ip.parse::<Ipv6Addr>().map_err(|_| "bad IPv6 literal")?;
        let after = &rest[close + 1..];
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or("junk after IPv6 literal")?),
        };
        (ip, port)
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        }
    };
    if host.is_empty() {
        return Err("empty host");
    }
    if !s.starts_with('[') {
        if host.len() > 255 {
            return Err("host too long");
        }
        if !host.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_')) {
            return Err("invalid character in host");
        }
    }
    let port = match port {
        None => None,
        Some(p) => {
            // u16::from_str would accept "+443"; require plain digits.
            if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
                return Err("bad port");
            }
            match p.parse::<u16>() {
                Ok(0) | Err(_) => return Err("bad port"),
                Ok(n) => Some(n),
            }
        }
    };
    Ok((host.to_owned(), port))
}

/// Answer of [`looks_like_http`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detect3 {
    Incomplete,
    Yes,
    No,
}

/// Could `buf` be the start of an HTTP/1.x request line, i.e. 1..=16 uppercase ASCII
/// letters then a space? Answers `No` on the first byte that rules it out.
///
/// `PROXY ` is answered `No`: it is the PROXY protocol v1 signature, not a method.
pub fn looks_like_http(buf: &[u8]) -> Detect3 {
    for (i, &b) in buf.iter().enumerate() {
        match b {
            b'A'..=b'Z' if i < MAX_METHOD_LEN => {}
            b' ' if i > 0 => {
                return if buf.get(..i) == Some(b"PROXY".as_slice()) { Detect3::No } else { Detect3::Yes };
            }
            _ => return Detect3::No,
        }
    }
    Detect3::Incomplete
}

/// Incremental request-head reader: remembers how far the end-of-head search got, so feeding a
/// slowly growing buffer costs O(new bytes) per call until the head is complete. Keep one reader
/// per connection across reads; a fresh reader on a whole buffer is a one-shot parse.
///
/// Behaviour worth knowing:
/// * Methods are case-sensitive (RFC 9110 §9.1): `connect` parses as a request but
///   [`RequestHead::is_connect`] is false and [`looks_like_http`] answers `No`.
/// * Line endings follow httparse: bare LF is accepted (`len` then covers `\n\n`);
///   obs-fold (a header line starting with SP/HTAB) is rejected, as are NUL bytes in
///   header values and versions other than HTTP/1.0 and HTTP/1.1.
/// * The request line must start at byte 0 (no leading empty lines); a first byte that
///   cannot start a method is rejected at once.
#[derive(Debug, Clone)]
pub struct HeadReader {
    max_len: usize,
    /// Every `\n` before this index has been ruled out as the start of the final blank line.
    scanned: usize,
}

impl HeadReader {
    pub fn new(max_len: usize) -> Self {
        HeadReader { max_len, scanned: 0 }
    }

    /// Parse the request head at the start of `buf`. `Ok(None)` = need more bytes.
    ///
    /// `buf` must be the same stream as in earlier calls, only longer. Bytes after the head
    /// (e.g. a TLS ClientHello pipelined after CONNECT) are not part of it: they start at
    /// `buf[head.len..]`. A buffer that reaches `max_len` bytes without the end of the head
    /// fails with [`HeadError::TooLarge`] at once.
    pub fn poll(&mut self, buf: &[u8]) -> Result<Option<RequestHead>, HeadError> {
        if let Some(&b) = buf.first()
            && !is_tchar(b)
        {
            return Err(HeadError::Malformed("request line must start with a method"));
        }
        let window = buf.get(..self.max_len).unwrap_or(buf);
        match self.find_end(window).and_then(|end| window.get(..end)) {
            Some(head) => parse_complete(head).map(Some),
            None if buf.len() >= self.max_len => Err(HeadError::TooLarge),
            None => Ok(None),
        }
    }

    /// End of the blank line that closes the head (`\n\n` or `\n\r\n`, the forms httparse
    /// accepts), searched from where the previous call stopped.
    fn find_end(&mut self, buf: &[u8]) -> Option<usize> {
        while let Some(rel) = memchr::memchr(b'\n', buf.get(self.scanned..)?) {
            let i = self.scanned + rel;
            match (buf.get(i + 1), buf.get(i + 2)) {
                (Some(b'\n'), _) => return Some(i + 2),
                (Some(b'\r'), Some(b'\n')) => return Some(i + 3),
                // Can't decide yet: look at this '\n' again next time.
                (None, _) | (Some(b'\r'), None) => {
                    self.scanned = i;
                    return None;
                }
                _ => self.scanned = i + 1,
            }
        }
        self.scanned = buf.len();
        None
    }
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// httparse on a buffer known to hold exactly one complete head.
fn parse_complete(head: &[u8]) -> Result<RequestHead, HeadError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let n = match req.parse(head) {
        Ok(httparse::Status::Complete(n)) => n,
        // Our end-of-head scan found a blank line, so httparse must be complete too.
        Ok(httparse::Status::Partial) => return Err(HeadError::Malformed("incomplete head")),
        Err(e) => return Err(map_httparse(e)),
    };
    if n != head.len() {
        return Err(HeadError::Malformed("head ends early"));
    }
    let version = req.version.ok_or(HeadError::BadVersion)?;
    let mut out = Vec::with_capacity(req.headers.len());
    for h in req.headers.iter() {
        // httparse allows NUL-free values today; keep the guarantee explicit.
        if memchr::memchr(0, h.value).is_some() {
            return Err(HeadError::Malformed("NUL in header value"));
        }
        out.push((h.name.to_owned(), h.value.to_vec()));
    }
    Ok(RequestHead {
        method: req.method.unwrap_or_default().to_owned(),
        target: req.path.unwrap_or_default().to_owned(),
        version,
        headers: out,
        len: n,
    })
}

fn map_httparse(e: httparse::Error) -> HeadError {
    match e {
        httparse::Error::TooManyHeaders => HeadError::TooManyHeaders,
        httparse::Error::Version => HeadError::BadVersion,
        httparse::Error::HeaderName => HeadError::Malformed("invalid header name (or obs-fold)"),
        httparse::Error::HeaderValue => HeadError::Malformed("invalid byte in header value"),
        httparse::Error::NewLine => HeadError::Malformed("invalid line ending"),
        httparse::Error::Token => HeadError::Malformed("invalid method or request target"),
        httparse::Error::Status => HeadError::Malformed("invalid status"),
    }
}

fn http_version(version: u8) -> &'static str {
    if version == 0 { "HTTP/1.0" } else { "HTTP/1.1" }
}

fn reason_phrase(status: u16) -> &'static str {
    match status {
        200 => "OK",
        301 => "Moved Permanently",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        407 => "Proxy Authentication Required",
        408 => "Request Timeout",
        421 => "Misdirected Request",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Error",
    }
}

/// `HTTP/1.x <status> <phrase>` (status expected in 100..=599; unknown codes get the
/// phrase "Error") with a one-line `text/plain` body and `Connection: close`.
/// CR/LF and other control bytes in `reason_line` become spaces so the body stays one line.
pub fn error_response(version: u8, status: u16, reason_line: &str) -> Vec<u8> {
    let body: String =
        reason_line.chars().map(|c| if c.is_control() { ' ' } else { c }).chain(std::iter::once('\n')).collect();
    format!(
        "{} {} {}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
        http_version(version),
        status,
        reason_phrase(status),
        body.len(),
        body
    )
    .into_bytes()
}

/// `HTTP/1.x 200 Connection established` and the blank line; no body, no headers.
pub fn connect_established(version: u8) -> Vec<u8> {
    format!("{} 200 Connection established\r\n\r\n", http_version(version)).into_bytes()
}

/// 301 to `location` with an empty body. Bytes that could break the header (controls,
/// space, non-ASCII) are percent-encoded rather than trusted.
pub fn redirect_response(version: u8, location: &str) -> Vec<u8> {
    let mut loc = String::with_capacity(location.len());
    for b in location.bytes() {
        if b.is_ascii_graphic() {
            loc.push(char::from(b));
        } else {
            loc.push_str(&format!("%{b:02X}"));
        }
    }
    format!(
        "{} 301 Moved Permanently\r\nLocation: {}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        http_version(version),
        loc
    )
    .into_bytes()
}

/// Status and size of a response head read by [`ResponseHeadReader`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseHead {
    pub status: u16,
    /// Bytes of the head including the blank line that ends it; what the peer sent after it
    /// (e.g. the first tunnel bytes after a 200 to CONNECT) starts at `buf[len..]`.
    pub len: usize,
}

#[derive(thiserror::Error, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseHeadError {
    /// httparse's own verdict, kept so callers can report exactly what was wrong.
    #[error("response head is not valid HTTP: {0}")]
    Malformed(httparse::Error),
    #[error("response head exceeds the size limit")]
    TooLarge,
}

/// Incremental response-head reader, e.g. for the answer to a CONNECT sent upstream.
///
/// Gives httparse's verdict on the head (at most [`MAX_RESPONSE_HEADERS`] headers; empty lines
/// before the status line are skipped, as httparse does), but checks each line once, when its
/// `\n` arrives, so feeding a slowly growing buffer costs O(new bytes) per call. An error is
/// therefore reported once the line holding it is complete, except in the version at the start
/// of the status line: that is checked byte by byte, so a peer that does not speak HTTP (an SSH
/// banner, a TLS record) is refused on its first bytes, without waiting for a line end.
#[derive(Debug, Clone)]
pub struct ResponseHeadReader {
    max_len: usize,
    /// Start of the first line not checked yet.
    line: usize,
    status_line_seen: bool,
    headers: usize,
}

impl ResponseHeadReader {
    pub fn new(max_len: usize) -> Self {
        ResponseHeadReader { max_len, line: 0, status_line_seen: false, headers: 0 }
    }

    /// Parse the response head at the start of `buf`. `Ok(None)` = need more bytes.
    ///
    /// `buf` must be the same stream as in earlier calls, only longer. A buffer that reaches
    /// `max_len` bytes without the end of the head fails with [`ResponseHeadError::TooLarge`].
    pub fn poll(&mut self, buf: &[u8]) -> Result<Option<ResponseHead>, ResponseHeadError> {
        let window = buf.get(..self.max_len).unwrap_or(buf);
        // The next whole line, and the head up to its end.
        while let Some(rest) = window.get(self.line..)
            && let Some(rel) = memchr::memchr(b'\n', rest)
            && let Some((line, _)) = rest.split_at_checked(rel + 1)
            && let Some((head, _)) = window.split_at_checked(self.line + rel + 1)
        {
            let end = head.len();
            let blank = line == b"\n" || line == b"\r\n";
            if !self.status_line_seen {
                if !blank {
                    check_status_line(head)?;
                    self.status_line_seen = true;
                }
            } else if blank {
                return parse_complete_response(head).map(Some);
            } else {
                self.headers += 1;
                check_header_line(line, self.headers)?;
            }
            self.line = end;
        }
        if !self.status_line_seen {
            check_version_prefix(window.get(self.line..).unwrap_or_default())?;
        }
        if buf.len() >= self.max_len { Err(ResponseHeadError::TooLarge) } else { Ok(None) }
    }
}

/// The unfinished status line could still start with `HTTP/1.0` or `HTTP/1.1` (the check
/// httparse makes on a partial version).
fn check_version_prefix(partial: &[u8]) -> Result<(), ResponseHeadError> {
    // An empty line in the making: httparse skips it or rejects a lone CR once the line ends.
    if matches!(partial.first(), None | Some(b'\r' | b'\n')) {
        return Ok(());
    }
    let seen = partial.get(..8).unwrap_or(partial);
    if b"HTTP/1.0".starts_with(seen) || b"HTTP/1.1".starts_with(seen) {
        Ok(())
    } else {
        Err(ResponseHeadError::Malformed(httparse::Error::Version))
    }
}

/// `upto` ends with the status line (possibly after empty lines).
fn check_status_line(upto: &[u8]) -> Result<(), ResponseHeadError> {
    // No header slots: only the status line is parsed, and httparse answers Partial if it is good.
    let mut none: [httparse::Header<'_>; 0] = [];
    httparse::Response::new(&mut none).parse(upto).map(drop).map_err(ResponseHeadError::Malformed)
}

/// `line` is the `count`-th header line, complete and not empty.
fn check_header_line(line: &[u8], count: usize) -> Result<(), ResponseHeadError> {
    let mut one = [httparse::EMPTY_HEADER; 1];
    httparse::parse_headers(line, &mut one).map_err(ResponseHeadError::Malformed)?;
    // After the line's own checks, as httparse counts a header only once it has parsed it.
    if count > MAX_RESPONSE_HEADERS {
        return Err(ResponseHeadError::Malformed(httparse::Error::TooManyHeaders));
    }
    Ok(())
}

/// httparse on a buffer known to hold exactly one complete response head, every line of it checked.
fn parse_complete_response(head: &[u8]) -> Result<ResponseHead, ResponseHeadError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_RESPONSE_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    match resp.parse(head).map_err(ResponseHeadError::Malformed)? {
        httparse::Status::Complete(len) => Ok(ResponseHead { status: resp.code.unwrap_or(0), len }),
        // Cannot happen (the blank line after checked lines ends the head for httparse too);
        // answered as the broken line ending it would be.
        httparse::Status::Partial => Err(ResponseHeadError::Malformed(httparse::Error::NewLine)),
    }
}
