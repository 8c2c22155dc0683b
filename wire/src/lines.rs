//! Sans-IO framing of newline-terminated lines with a length limit (the tunnel's JSON control lines).

/// A line longer than the limit arrived (or is arriving: no newline within the limit).
#[derive(thiserror::Error, Debug, Clone, Copy, PartialEq, Eq)]
#[error("line longer than {limit} bytes")]
pub struct TooLong {
    pub limit: usize,
}

/// Splits a byte stream into lines. The buffer lives across lines, since one read may carry
/// several lines or the end of one and the start of the next.
///
/// A line (without its `\n`) longer than the limit is refused wherever its newline falls: in
/// the same chunk, in a later chunk, or not at all yet (refused as soon as more than `limit`
/// bytes are buffered without one), so the buffer never needs to hold much more than `limit`
/// plus one chunk. The refusal is final: the stream has lost its framing.
#[derive(Debug, Clone)]
pub struct LineFramer {
    limit: usize,
    buf: Vec<u8>,
    /// Start of the first line not yet returned; bytes before it are dropped on the next push,
    /// so taking many lines out of one chunk costs one move, not one per line.
    start: usize,
    /// Bytes from `start` known to hold no `\n`, so a line arriving a byte at a time is scanned once.
    scanned: usize,
    failed: bool,
}

impl LineFramer {
    /// `limit`: the longest line accepted, in bytes, not counting the `\n`.
    pub fn new(limit: usize) -> Self {
        LineFramer { limit, buf: Vec::new(), start: 0, scanned: 0, failed: false }
    }

    /// Appends bytes received. Call [`LineFramer::next_line`] until it returns `Ok(None)`
    /// before pushing more, or the buffer grows with what is pushed.
    pub fn push(&mut self, chunk: &[u8]) {
        if self.failed {
            return;
        }
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(chunk);
    }

    /// The next complete line without its `\n`; `Ok(None)` until one has arrived.
    pub fn next_line(&mut self) -> Result<Option<Vec<u8>>, TooLong> {
        if self.failed {
            return Err(TooLong { limit: self.limit });
        }
        let pending = self.buf.get(self.start..).unwrap_or_default();
        let from = self.scanned.min(pending.len());
        match memchr::memchr(b'\n', pending.get(from..).unwrap_or_default()) {
            Some(rel) => {
                let i = from + rel;
                if i > self.limit {
                    return Err(self.fail());
                }
                let line = pending.get(..i).unwrap_or_default().to_vec();
                self.start += i + 1;
                self.scanned = 0;
                Ok(Some(line))
            }
            None if pending.len() > self.limit => Err(self.fail()),
            None => {
                self.scanned = pending.len();
                Ok(None)
            }
        }
    }

    /// Bytes received but not yet returned as lines (the start of an unfinished line).
    pub fn pending(&self) -> usize {
        self.buf.len() - self.start
    }

    fn fail(&mut self) -> TooLong {
        self.failed = true;
        self.buf = Vec::new();
        self.start = 0;
        self.scanned = 0;
        TooLong { limit: self.limit }
    }
}
