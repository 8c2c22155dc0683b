//! The QUIC transport's framing of its streams: the header the seed writes first on every stream, the agent's answer on a connect stream, and the stream and connection codes.
//!
//! Stream header (seed → agent), the first bytes of every stream the seed opens:
//! `[version = 1: u8][kind: u8][len: u16 big-endian][target: len bytes, UTF-8 host:port]`,
//! kind `0` = connect to `target`, kind `1` = the control stream (`len` = 0).
//!
//! Answer (agent → seed) on a connect stream: `[status: u8][len: u16 big-endian][payload: len
//! bytes]`: status `0` = the dial succeeded (`len` = 0; the stream's bytes follow), `1` =
//! refused, payload `<code>\n<reason>` (the codes of [`DialError::code`]); the agent then
//! finishes the stream.
//!
//! Both readers take the bytes received so far and say how many more they need before they
//! can go on ([`Progress::More`]), so a caller reads exactly the header or the answer and
//! leaves the stream's own bytes behind it unread.

#![deny(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used)]

use super::DialError;

/// Version byte of the stream header.
pub const HEADER_VERSION: u8 = 1;
pub const KIND_CONNECT: u8 = 0;
pub const KIND_CONTROL: u8 = 1;
pub const STATUS_OK: u8 = 0;
pub const STATUS_REFUSED: u8 = 1;
/// Application error code of a reset stream (RESET_STREAM, STOP_SENDING).
pub const RESET_CODE: u32 = 0x10;
/// Connection close: the session ended in order (the agent drained after its going-away notice).
pub const CLOSE_DONE: u32 = 0;
/// Connection close: the seed stopped the session.
pub const CLOSE_STOPPED: u32 = 1;
/// Connection close: a peer broke the protocol (or was refused before its session started).
pub const CLOSE_PROTOCOL: u32 = 2;
/// Largest refusal payload (code and reason) an answer may carry.
pub const ANSWER_MAX: usize = 1024;

/// Fixed part of the stream header: version, kind, target length.
const HEADER_FIXED: usize = 4;
/// Fixed part of the answer: status, payload length.
const ANSWER_FIXED: usize = 3;

/// What a reader made of the bytes so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress<T> {
    /// At least this many more bytes are needed (and no more than them can belong to it yet).
    More(usize),
    /// Read: the value, and the bytes it took from the start of the input.
    Done(T, usize),
}

#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum StreamError {
    #[error("stream header version {0} (want {HEADER_VERSION})")]
    Version(u8),
    #[error("stream header: target is not UTF-8")]
    TargetNotUtf8,
    #[error("target too long for a stream header: {0} bytes")]
    TargetTooLong(usize),
    #[error("answer of {0} bytes (at most {ANSWER_MAX})")]
    AnswerTooLong(usize),
    #[error("answer status {0}")]
    Status(u8),
}

/// The first bytes of a stream the seed opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamHeader {
    /// [`KIND_CONNECT`], [`KIND_CONTROL`], or a kind this version does not know.
    pub kind: u8,
    pub target: String,
}

impl StreamHeader {
    pub fn connect(target: &str) -> Self {
        Self { kind: KIND_CONNECT, target: target.to_owned() }
    }

    pub fn control() -> Self {
        Self { kind: KIND_CONTROL, target: String::new() }
    }

    pub fn encode(&self) -> Result<Vec<u8>, StreamError> {
        let len = u16::try_from(self.target.len()).map_err(|_| StreamError::TargetTooLong(self.target.len()))?;
        let mut h = Vec::with_capacity(HEADER_FIXED + self.target.len());
        h.extend_from_slice(&[HEADER_VERSION, self.kind]);
        h.extend_from_slice(&len.to_be_bytes());
        h.extend_from_slice(self.target.as_bytes());
        Ok(h)
    }

    /// Read a header from the start of `buf` (the bytes received so far).
    pub fn read(buf: &[u8]) -> Result<Progress<Self>, StreamError> {
        let Some((&[version, kind, l0, l1], rest)) = split_fixed::<HEADER_FIXED>(buf) else {
            return Ok(Progress::More(HEADER_FIXED - buf.len()));
        };
        if version != HEADER_VERSION {
            return Err(StreamError::Version(version));
        }
        let len = usize::from(u16::from_be_bytes([l0, l1]));
        let Some(target) = rest.get(..len) else { return Ok(Progress::More(len - rest.len())) };
        let target = std::str::from_utf8(target).map_err(|_| StreamError::TargetNotUtf8)?;
        Ok(Progress::Done(Self { kind, target: target.to_owned() }, HEADER_FIXED + len))
    }
}

/// The agent's answer on a connect stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// The dial succeeded: the stream's bytes follow.
    Connected,
    /// The dial failed; `code` is one of [`DialError::code`].
    Refused { code: String, reason: String },
}

impl Answer {
    /// The refusal of `err`, as the agent sends it.
    pub fn refusal(err: &DialError) -> Self {
        Answer::Refused { code: err.code().to_owned(), reason: err.detail().to_owned() }
    }

    /// The answer's bytes. A refusal's payload is cut to [`ANSWER_MAX`] bytes (its reason may
    /// then end mid-character: it is read back lossily).
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Answer::Connected => vec![STATUS_OK, 0, 0],
            Answer::Refused { code, reason } => {
                let mut payload = format!("{code}\n{reason}").into_bytes();
                payload.truncate(ANSWER_MAX);
                let len = u16::try_from(payload.len()).unwrap_or(u16::MAX);
                let mut a = vec![STATUS_REFUSED];
                a.extend_from_slice(&len.to_be_bytes());
                a.extend_from_slice(&payload);
                a
            }
        }
    }

    /// Read an answer from the start of `buf` (the bytes received so far). A success's payload,
    /// if any, is skipped.
    pub fn read(buf: &[u8]) -> Result<Progress<Self>, StreamError> {
        let Some((&[status, l0, l1], rest)) = split_fixed::<ANSWER_FIXED>(buf) else {
            return Ok(Progress::More(ANSWER_FIXED - buf.len()));
        };
        let len = usize::from(u16::from_be_bytes([l0, l1]));
        if len > ANSWER_MAX {
            return Err(StreamError::AnswerTooLong(len));
        }
        let Some(payload) = rest.get(..len) else { return Ok(Progress::More(len - rest.len())) };
        let answer = match status {
            STATUS_OK => Answer::Connected,
            STATUS_REFUSED => {
                let payload = String::from_utf8_lossy(payload);
                let (code, reason) = payload.split_once('\n').unwrap_or((&payload, ""));
                Answer::Refused { code: code.to_owned(), reason: reason.to_owned() }
            }
            s => return Err(StreamError::Status(s)),
        };
        Ok(Progress::Done(answer, ANSWER_FIXED + len))
    }

    /// What the seed's open returns: `Ok` once connected, the agent's error otherwise.
    pub fn into_result(self) -> Result<(), DialError> {
        match self {
            Answer::Connected => Ok(()),
            Answer::Refused { code, reason } => Err(DialError::from_code(&code, reason)),
        }
    }
}

/// The first `N` bytes as an array and the rest; `None` while fewer than `N` have arrived.
fn split_fixed<const N: usize>(buf: &[u8]) -> Option<(&[u8; N], &[u8])> {
    let (fixed, rest) = buf.split_at_checked(N)?;
    Some((fixed.try_into().ok()?, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `wire` as a caller does: exactly the bytes the reader asks for, until it is done.
    fn read_as_asked<T>(wire: &[u8], read: impl Fn(&[u8]) -> Result<Progress<T>, StreamError>) -> (T, usize) {
        let mut have = 0;
        loop {
            match read(wire.get(..have).unwrap_or(wire)) {
                Ok(Progress::More(n)) => {
                    assert!(n > 0 && have + n <= wire.len(), "asked for {n} more at {have}");
                    have += n;
                }
                Ok(Progress::Done(v, used)) => {
                    assert_eq!(used, have, "took other bytes than it asked for");
                    return (v, used);
                }
                Err(e) => panic!("{e}"),
            }
        }
    }

    /// The bytes of version 1: agents and servers of the previous version read them.
    #[test]
    fn headers_and_answers_are_the_wire_format_of_version_1() {
        let h = StreamHeader::connect("10.0.0.1:443").encode();
        assert_eq!(h.as_deref(), Ok(&b"\x01\x00\x00\x0c10.0.0.1:443"[..]));
        assert_eq!(StreamHeader::control().encode().as_deref(), Ok(&b"\x01\x01\x00\x00"[..]));
        assert_eq!(Answer::Connected.encode(), b"\x00\x00\x00");
        let refused = Answer::refusal(&DialError::NotAllowed("x:1 is not on the allowlist".into())).encode();
        assert_eq!(refused, b"\x01\x00\x27not_allowed\nx:1 is not on the allowlist");
    }

    #[test]
    fn a_header_is_read_without_the_bytes_behind_it() {
        let mut wire = StreamHeader::connect("api:443").encode().unwrap_or_default();
        wire.extend_from_slice(b"GET / HTTP/1.1\r\n");
        let (h, used) = read_as_asked(&wire, StreamHeader::read);
        assert_eq!((h, used), (StreamHeader::connect("api:443"), 4 + 7));
        assert_eq!(StreamHeader::read(&wire), Ok(Progress::Done(StreamHeader::connect("api:443"), 11)));
    }

    #[test]
    fn an_answer_comes_back_as_the_agents_dial_error() {
        for err in [DialError::Refused("r".into()), DialError::Draining("d".into()), DialError::Limit(String::new())] {
            let (a, _) = read_as_asked(&Answer::refusal(&err).encode(), Answer::read);
            assert_eq!(a.into_result(), Err(err));
        }
        assert_eq!(read_as_asked(b"\x00\x00\x00data", Answer::read), (Answer::Connected, 3));
        // A success with a payload (not this version's agent): the payload is skipped.
        assert_eq!(read_as_asked(b"\x00\x00\x02xydata", Answer::read), (Answer::Connected, 5));
    }

    #[test]
    fn a_long_reason_is_cut_to_the_answer_limit_and_still_reads() {
        let err = DialError::Refused(format!("{}é", "a".repeat(ANSWER_MAX)));
        let wire = Answer::refusal(&err).encode();
        assert_eq!(wire.len(), 3 + ANSWER_MAX);
        match Answer::read(&wire) {
            Ok(Progress::Done(Answer::Refused { code, reason }, n)) => {
                assert_eq!((code.as_str(), reason.len(), n), ("refused", ANSWER_MAX - "refused\n".len(), wire.len()));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn bad_headers_and_answers_are_refused() {
        assert_eq!(StreamHeader::read(b"\x02\x00\x00\x00"), Err(StreamError::Version(2)));
        assert_eq!(StreamHeader::read(b"\x01\x00\x00\x02\xff\xfe"), Err(StreamError::TargetNotUtf8));
        assert_eq!(StreamHeader::read(b"\x01\x00\x00\x05ab"), Ok(Progress::More(3)));
        assert_eq!(StreamHeader::read(b""), Ok(Progress::More(4)));
        let long = "a".repeat(70_000);
        assert_eq!(StreamHeader::connect(&long).encode(), Err(StreamError::TargetTooLong(70_000)));
        assert_eq!(Answer::read(b"\x01\x04\x01"), Err(StreamError::AnswerTooLong(1025)));
        assert_eq!(Answer::read(b"\x07\x00\x00"), Err(StreamError::Status(7)));
        assert_eq!(Answer::read(b"\x01\x00\x03ab"), Ok(Progress::More(1)));
    }
}
