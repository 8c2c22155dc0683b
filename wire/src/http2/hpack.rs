//! HPACK (RFC 7541): a decoder of the header blocks a client sends (static and dynamic tables, table size updates, Huffman) and an encoder of literal fields that never touch the receiver's dynamic table.
//!
//! The decoder's work is linear in the block it is given, however the block refers to the
//! table: it hands each field to a callback as borrowed slices (a reference to a large entry is
//! never copied), a table entry shares the name it took from another entry, the caller's judge
//! of a field runs once when the field arrives as a literal and its verdict stays with the
//! table entry, and once the callback has had enough the rest of the block only keeps the
//! table in step.

use super::huffman;
use std::borrow::Cow;
use std::collections::VecDeque;
use std::ops::ControlFlow;
use std::sync::Arc;

/// Why a header block could not be decoded (an HTTP/2 `COMPRESSION_ERROR`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HpackError {
    #[error("the header block ends inside a field")]
    Truncated,
    #[error("an integer is longer than 4 continuation octets")]
    IntegerTooLong,
    #[error("index {0} is in neither table")]
    BadIndex(usize),
    #[error("Huffman-coded string: {0}")]
    Huffman(&'static str),
    #[error("dynamic table size update to {0} bytes, above the {1} the server allows")]
    TableTooLarge(usize, usize),
    #[error("dynamic table size update after a header field")]
    LateSizeUpdate,
}

/// One decoded header field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field<'a> {
    pub name: &'a [u8],
    pub value: &'a [u8],
    /// Sent as "never indexed" (RFC 7541 §6.2.3): an intermediary must keep that representation.
    pub never_indexed: bool,
}

impl Field<'_> {
    /// Its size in a header list (RFC 7541 §4.1), the unit of `SETTINGS_MAX_HEADER_LIST_SIZE`.
    pub fn size(&self) -> usize {
        self.name.len() + self.value.len() + ENTRY_OVERHEAD
    }
}

/// What each table entry or list field costs beyond its octets.
const ENTRY_OVERHEAD: usize = 32;

/// RFC 7541 Appendix A: index 1 is the first entry.
const STATIC: [(&[u8], &[u8]); 61] = [
    (b":authority", b""),
    (b":method", b"GET"),
    (b":method", b"POST"),
    (b":path", b"/"),
    (b":path", b"/index.html"),
    (b":scheme", b"http"),
    (b":scheme", b"https"),
    (b":status", b"200"),
    (b":status", b"204"),
    (b":status", b"206"),
    (b":status", b"304"),
    (b":status", b"400"),
    (b":status", b"404"),
    (b":status", b"500"),
    (b"accept-charset", b""),
    (b"accept-encoding", b"gzip, deflate"),
    (b"accept-language", b""),
    (b"accept-ranges", b""),
    (b"accept", b""),
    (b"access-control-allow-origin", b""),
    (b"age", b""),
    (b"allow", b""),
    (b"authorization", b""),
    (b"cache-control", b""),
    (b"content-disposition", b""),
    (b"content-encoding", b""),
    (b"content-language", b""),
    (b"content-length", b""),
    (b"content-location", b""),
    (b"content-range", b""),
    (b"content-type", b""),
    (b"cookie", b""),
    (b"date", b""),
    (b"etag", b""),
    (b"expect", b""),
    (b"expires", b""),
    (b"from", b""),
    (b"host", b""),
    (b"if-match", b""),
    (b"if-modified-since", b""),
    (b"if-none-match", b""),
    (b"if-range", b""),
    (b"if-unmodified-since", b""),
    (b"last-modified", b""),
    (b"link", b""),
    (b"location", b""),
    (b"max-forwards", b""),
    (b"proxy-authenticate", b""),
    (b"proxy-authorization", b""),
    (b"range", b""),
    (b"referer", b""),
    (b"refresh", b""),
    (b"retry-after", b""),
    (b"server", b""),
    (b"set-cookie", b""),
    (b"strict-transport-security", b""),
    (b"transfer-encoding", b""),
    (b"user-agent", b""),
    (b"vary", b""),
    (b"via", b""),
    (b"www-authenticate", b""),
];

/// A caller's verdict on a field (its name and value), given once per field that arrives as a
/// literal and kept with the table entry the field becomes.
pub type Judge = fn(&[u8], &[u8]) -> bool;

/// A literal's name: from the static table, shared with a dynamic table entry (never copied:
/// a two-octet literal may name a 4 KiB entry), or as the block sent it.
enum Name<'b> {
    Static(&'static [u8]),
    Shared(Arc<[u8]>),
    Sent(Cow<'b, [u8]>),
}

impl Name<'_> {
    fn as_slice(&self) -> &[u8] {
        match self {
            Name::Static(n) => n,
            Name::Shared(n) => n,
            Name::Sent(n) => n,
        }
    }

    fn into_shared(self) -> Arc<[u8]> {
        match self {
            Name::Static(n) => Arc::from(n),
            Name::Shared(n) => n,
            Name::Sent(n) => Arc::from(n),
        }
    }
}

/// A dynamic table entry: its name (shared with the entries that took it by index), its value
/// and the judge's verdict on it.
#[derive(Debug)]
struct Entry {
    name: Arc<[u8]>,
    value: Box<[u8]>,
    fits: bool,
}

impl Entry {
    fn size(&self) -> usize {
        self.name.len() + self.value.len() + ENTRY_OVERHEAD
    }
}

/// The decoding context of one connection's client-to-server direction.
#[derive(Debug)]
pub struct Decoder {
    /// Newest first: index 62 is the front.
    table: VecDeque<Entry>,
    /// The entries' size (RFC 7541 §4.1).
    size: usize,
    /// The table's current maximum size, as the client's last size update set it.
    max: usize,
    /// `SETTINGS_HEADER_TABLE_SIZE` of the server: no size update may go above it.
    limit: usize,
    judge: Judge,
    /// The judge's verdict on each static entry, given once.
    static_fits: [bool; STATIC.len()],
    /// Value octets handed to the judge so far.
    judged: u64,
}

impl Decoder {
    /// A decoder for a server that advertises `SETTINGS_HEADER_TABLE_SIZE = limit` (4,096 when
    /// it advertises none); the table starts at that size. Every field fits.
    pub fn new(limit: usize) -> Self {
        Self::with_judge(limit, |_, _| true)
    }

    /// A decoder whose fields come with `judge`'s verdict: judged once per field that arrives
    /// as a literal (and once per static entry), the verdict kept with the table entry, so a
    /// field referred to many times is judged once.
    pub fn with_judge(limit: usize, judge: Judge) -> Self {
        let static_fits = STATIC.map(|(n, v)| judge(n, v));
        Self { table: VecDeque::new(), size: 0, max: limit, limit, judge, static_fits, judged: 0 }
    }

    /// The dynamic table's size (RFC 7541 §4.1) and its entry count.
    pub fn table(&self) -> (usize, usize) {
        (self.size, self.table.len())
    }

    /// Value octets handed to the judge so far (after the static table's): at most the octets
    /// of the literal values decoded, each judged once.
    pub fn judged(&self) -> u64 {
        self.judged
    }

    /// Decode one complete header block, handing each field and the judge's verdict on it to
    /// `each` in order until `each` breaks; the rest of the block is decoded only to keep the
    /// table in step (no field handed on, no verdict asked for one that is not kept). On an
    /// error the connection's HPACK context is lost: the connection must end.
    pub fn decode(
        &mut self,
        block: &[u8],
        mut each: impl FnMut(Field<'_>, bool) -> ControlFlow<()>,
    ) -> Result<(), HpackError> {
        let mut buf = block;
        let mut fields = false;
        let mut wanted = true;
        while let Some(&first) = buf.first() {
            if first & 0x80 != 0 {
                let i = integer(&mut buf, 7)?;
                let (name, value, fits) = self.entry(i)?;
                if wanted {
                    wanted = each(Field { name, value, never_indexed: false }, fits).is_continue();
                }
            } else if first & 0x40 != 0 {
                let (name, value) = self.literal(&mut buf, 6)?;
                let fits = self.judge(name.as_slice(), &value);
                if wanted {
                    let f = Field { name: name.as_slice(), value: &value, never_indexed: false };
                    wanted = each(f, fits).is_continue();
                }
                self.insert(Entry { name: name.into_shared(), value: value.into_owned().into(), fits });
            } else if first & 0x20 != 0 {
                if fields {
                    return Err(HpackError::LateSizeUpdate);
                }
                let max = integer(&mut buf, 5)?;
                if max > self.limit {
                    return Err(HpackError::TableTooLarge(max, self.limit));
                }
                self.max = max;
                self.evict(0);
                continue;
            } else {
                let never_indexed = first & 0x10 != 0;
                let (name, value) = self.literal(&mut buf, 4)?;
                if wanted {
                    let fits = self.judge(name.as_slice(), &value);
                    wanted = each(Field { name: name.as_slice(), value: &value, never_indexed }, fits).is_continue();
                }
            }
            fields = true;
        }
        Ok(())
    }

    fn judge(&mut self, name: &[u8], value: &[u8]) -> bool {
        self.judged += value.len() as u64;
        (self.judge)(name, value)
    }

    /// The entry at `index` of the static table, then the dynamic one, and its verdict.
    fn entry(&self, index: usize) -> Result<(&[u8], &[u8], bool), HpackError> {
        let bad = HpackError::BadIndex(index);
        let i = index.checked_sub(1).ok_or(bad.clone())?;
        if let (Some(&(n, v)), Some(&fits)) = (STATIC.get(i), self.static_fits.get(i)) {
            return Ok((n, v, fits));
        }
        let e = self.table.get(i - STATIC.len()).ok_or(bad)?;
        Ok((&e.name, &e.value, e.fits))
    }

    /// A literal field whose name index has a `prefix`-bit integer: its name and value.
    fn literal<'b>(&self, buf: &mut &'b [u8], prefix: u8) -> Result<(Name<'b>, Cow<'b, [u8]>), HpackError> {
        let index = integer(buf, prefix)?;
        let name = match index {
            0 => Name::Sent(string(buf)?),
            i => match STATIC.get(i - 1) {
                Some(&(n, _)) => Name::Static(n),
                None => {
                    let e = self.table.get(i - 1 - STATIC.len()).ok_or(HpackError::BadIndex(i))?;
                    Name::Shared(e.name.clone())
                }
            },
        };
        Ok((name, string(buf)?))
    }

    fn insert(&mut self, entry: Entry) {
        let size = entry.size();
        // An entry larger than the table empties it and is not added (RFC 7541 §4.4).
        self.evict(size);
        if size <= self.max {
            self.size += size;
            self.table.push_front(entry);
        }
    }

    /// Evict the oldest entries until `room` more octets fit (all of them if it cannot fit).
    fn evict(&mut self, room: usize) {
        while self.size + room > self.max {
            let Some(e) = self.table.pop_back() else { break };
            self.size -= e.size();
        }
    }
}

/// An integer with a `prefix`-bit prefix (RFC 7541 §5.1), at most 4 continuation octets: more
/// than any size a header block can use.
fn integer(buf: &mut &[u8], prefix: u8) -> Result<usize, HpackError> {
    let (&first, rest) = buf.split_first().ok_or(HpackError::Truncated)?;
    *buf = rest;
    let max = (1usize << prefix) - 1;
    let mut value = usize::from(first) & max;
    if value < max {
        return Ok(value);
    }
    for shift in [0, 7, 14, 21] {
        let (&b, rest) = buf.split_first().ok_or(HpackError::Truncated)?;
        *buf = rest;
        value += usize::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(HpackError::IntegerTooLong)
}

/// A string literal (RFC 7541 §5.2): borrowed when sent as it is, decoded when Huffman-coded.
fn string<'b>(buf: &mut &'b [u8]) -> Result<Cow<'b, [u8]>, HpackError> {
    let huffman = buf.first().is_some_and(|b| b & 0x80 != 0);
    let len = integer(buf, 7)?;
    let (s, rest) = buf.split_at_checked(len).ok_or(HpackError::Truncated)?;
    *buf = rest;
    if !huffman {
        return Ok(Cow::Borrowed(s));
    }
    let mut out = Vec::with_capacity(len + len / 2);
    huffman::decode(s, &mut out).map_err(HpackError::Huffman)?;
    Ok(Cow::Owned(out))
}

/// Append `field` as a literal that is not indexed (or never indexed, as it came), its name by
/// static index where the static table has it, its octets not Huffman-coded: the receiver's
/// dynamic table is never touched, whatever it held.
pub fn encode_literal(out: &mut Vec<u8>, field: &Field<'_>) {
    let flag = if field.never_indexed { 0x10 } else { 0x00 };
    match STATIC.iter().position(|(n, _)| *n == field.name) {
        Some(i) => encode_integer(out, flag, 4, i + 1),
        None => {
            out.push(flag);
            encode_string(out, field.name);
        }
    }
    encode_string(out, field.value);
}

fn encode_string(out: &mut Vec<u8>, s: &[u8]) {
    encode_integer(out, 0x00, 7, s.len());
    out.extend_from_slice(s);
}

/// `value` with a `prefix`-bit prefix, the first octet's other bits from `flags`.
pub(crate) fn encode_integer(out: &mut Vec<u8>, flags: u8, prefix: u8, value: usize) {
    let max = (1usize << prefix) - 1;
    if value < max {
        // Below the prefix's maximum: fits its bits.
        out.push(flags | value as u8);
        return;
    }
    out.push(flags | max as u8);
    let mut rest = value - max;
    while rest >= 0x80 {
        out.push(0x80 | (rest & 0x7f) as u8);
        rest >>= 7;
    }
    out.push(rest as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    fn decode(d: &mut Decoder, block: &[u8]) -> Result<Vec<(String, String, bool)>, HpackError> {
        let mut out = Vec::new();
        d.decode(block, |f, _| {
            out.push((
                String::from_utf8_lossy(f.name).into_owned(),
                String::from_utf8_lossy(f.value).into_owned(),
                f.never_indexed,
            ));
            ControlFlow::Continue(())
        })?;
        Ok(out)
    }

    fn fields(list: &[(&str, &str)]) -> Vec<(String, String, bool)> {
        list.iter().map(|(n, v)| (n.to_string(), v.to_string(), false)).collect()
    }

    /// RFC 7541 Appendix C.3 and C.4: three requests on one connection, without and with
    /// Huffman coding; the table after each as the RFC lists it.
    #[test]
    fn rfc_request_examples() {
        let requests = [
            [
                "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
                "8286 84be 5808 6e6f 2d63 6163 6865",
                "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
            ],
            [
                "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
                "8286 84be 5886 a8eb 1064 9cbf",
                "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
            ],
        ];
        let want = [
            (
                fields(&[(":method", "GET"), (":scheme", "http"), (":path", "/"), (":authority", "www.example.com")]),
                (57, 1),
            ),
            (
                fields(&[
                    (":method", "GET"),
                    (":scheme", "http"),
                    (":path", "/"),
                    (":authority", "www.example.com"),
                    ("cache-control", "no-cache"),
                ]),
                (110, 2),
            ),
            (
                fields(&[
                    (":method", "GET"),
                    (":scheme", "https"),
                    (":path", "/index.html"),
                    (":authority", "www.example.com"),
                    ("custom-key", "custom-value"),
                ]),
                (164, 3),
            ),
        ];
        for blocks in requests {
            let mut d = Decoder::new(4096);
            for (block, (list, table)) in blocks.iter().zip(&want) {
                assert_eq!(&decode(&mut d, &hex(block)).unwrap(), list);
                assert_eq!(d.table(), *table);
            }
        }
    }

    /// RFC 7541 Appendix C.5: responses with a 256-octet table, so entries are evicted.
    #[test]
    fn rfc_response_examples_evict() {
        let mut d = Decoder::new(256);
        let blocks = [
            "4803 3330 3258 0770 7269 7661 7465 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 \
             2032 303a 3133 3a32 3120 474d 546e 1768 7474 7073 3a2f 2f77 7777 2e65 7861 6d70 \
             6c65 2e63 6f6d",
            "4803 3330 37c1 c0bf",
            "88c1 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 2032 303a 3133 3a32 3220 474d \
             54c0 5a04 677a 6970 7738 666f 6f3d 4153 444a 4b48 514b 425a 584f 5157 454f 5049 \
             5541 5851 5745 4f49 553b 206d 6178 2d61 6765 3d33 3630 303b 2076 6572 7369 6f6e \
             3d31",
        ];
        let tables = [(222, 4), (222, 4), (215, 3)];
        for (block, table) in blocks.iter().zip(tables) {
            decode(&mut d, &hex(block)).unwrap();
            assert_eq!(d.table(), table);
        }
        let last = decode(&mut d, &hex("be")).unwrap();
        assert_eq!(last[0].0, "set-cookie");
    }

    #[test]
    fn integers_of_rfc_examples_and_limits() {
        // RFC 7541 C.1: 10 in a 5-bit prefix, 1337 in a 5-bit prefix, 42 in an octet.
        for (bytes, prefix, value) in [(&[0x0a][..], 5, 10), (&[0x1f, 0x9a, 0x0a], 5, 1337), (&[0x2a], 8, 42)] {
            let mut b = bytes;
            assert_eq!(integer(&mut b, prefix), Ok(value));
            assert!(b.is_empty());
            let mut out = Vec::new();
            encode_integer(&mut out, 0, prefix, value);
            assert_eq!(out, bytes);
        }
        let mut b: &[u8] = &[0x1f, 0xff, 0xff, 0xff, 0x7f];
        assert_eq!(integer(&mut b, 5), Ok(31 + (1 << 28) - 1));
        let mut b: &[u8] = &[0x1f, 0x80, 0x80, 0x80, 0x80, 0x00];
        assert_eq!(integer(&mut b, 5), Err(HpackError::IntegerTooLong));
        let mut b: &[u8] = &[0x1f, 0x80];
        assert_eq!(integer(&mut b, 5), Err(HpackError::Truncated));
    }

    #[test]
    fn bad_blocks_are_errors() {
        let mut d = Decoder::new(4096);
        // Index 0, an index past both tables, a string past the block's end.
        assert_eq!(decode(&mut d, &[0x80]), Err(HpackError::BadIndex(0)));
        assert_eq!(decode(&mut d, &[0xbe]), Err(HpackError::BadIndex(62)));
        assert_eq!(decode(&mut d, &[0x04, 0x05, b'a']), Err(HpackError::Truncated));
        // A size update above the server's setting, and one after a field.
        assert_eq!(decode(&mut d, &[0x3f, 0xe1, 0x1f]), Ok(vec![]));
        assert_eq!(decode(&mut d, &[0x3f, 0xe2, 0x1f]), Err(HpackError::TableTooLarge(4097, 4096)));
        assert_eq!(decode(&mut d, &[0x82, 0x20]), Err(HpackError::LateSizeUpdate));
        // Bad Huffman: a string of EOS.
        assert!(matches!(decode(&mut d, &[0x04, 0x84, 0xff, 0xff, 0xff, 0xff]), Err(HpackError::Huffman(_))));
    }

    #[test]
    fn size_updates_evict_and_empty_the_table() {
        let mut d = Decoder::new(4096);
        // custom-key: custom-value, indexed.
        decode(&mut d, &hex("400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65")).unwrap();
        assert_eq!(d.table(), (54, 1));
        decode(&mut d, &[0x20]).unwrap();
        assert_eq!(d.table(), (0, 0));
        assert_eq!(decode(&mut d, &[0xbe]), Err(HpackError::BadIndex(62)));
        // Two updates in a row at the start are fine; an entry larger than the table empties it.
        decode(&mut d, &[0x20, 0x3f, 0x10]).unwrap();
        decode(&mut d, &hex("400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65")).unwrap();
        assert_eq!(d.table(), (0, 0));
    }

    #[test]
    fn literals_round_trip_without_indexing() {
        let list = [
            Field { name: b":authority", value: b"/run/x.sock", never_indexed: false },
            Field { name: b"x-custom", value: &[0xff; 300], never_indexed: false },
            Field { name: b"authorization", value: b"secret", never_indexed: true },
        ];
        let mut out = Vec::new();
        for f in &list {
            encode_literal(&mut out, f);
        }
        // A decoder with no table at all reads it: nothing refers to or adds table entries.
        let mut d = Decoder::new(0);
        let mut back = Vec::new();
        d.decode(&out, |f, _| {
            back.push((f.name.to_vec(), f.value.to_vec(), f.never_indexed));
            ControlFlow::Continue(())
        })
        .unwrap();
        let want: Vec<_> = list.iter().map(|f| (f.name.to_vec(), f.value.to_vec(), f.never_indexed)).collect();
        assert_eq!(back, want);
        assert_eq!(d.table(), (0, 0));
        // :authority by its static index, without indexing.
        assert_eq!(out[0], 0x01);
    }

    /// A literal is judged once, when it arrives; references to its entry carry the verdict
    /// without judging it again, and a literal naming a table entry shares its name.
    #[test]
    fn a_field_is_judged_once_and_its_entry_keeps_the_verdict() {
        let mut d = Decoder::with_judge(4096, |n, v| n != b"x-bad" || !v.starts_with(b"bad"));
        let value = [b'b', b'a', b'd', b'!'].repeat(100);
        let mut block = vec![0x40, 5];
        block.extend_from_slice(b"x-bad");
        encode_string(&mut block, &value);
        // Indexed, twice; then a literal named by the entry (indexing) and one not indexed.
        block.extend_from_slice(&[0xbe, 0xbe, 0x7e, 0x02, b'o', b'k', 0x0f, 0x2f, 0x03, b'b', b'a', b'd']);
        let mut got = Vec::new();
        d.decode(&block, |f, fits| {
            got.push((f.name.to_vec(), f.value.len(), fits));
            ControlFlow::Continue(())
        })
        .unwrap();
        let name = b"x-bad".to_vec();
        let want = [(name.clone(), 400, false), (name.clone(), 400, false), (name.clone(), 400, false)];
        assert_eq!(got[..3], want);
        assert_eq!(got[3..], [(name.clone(), 2, true), (name, 3, false)]);
        // The 400-octet value once, then the three literal values that came after it.
        assert_eq!(d.judged(), 400 + 2 + 3);
        // The entry that took its name by index shares it with the first.
        assert!(Arc::ptr_eq(&d.table[0].name, &d.table[1].name));
        // References in a later block: their verdicts without judging again.
        let mut verdicts = Vec::new();
        d.decode(&[0xbe, 0xbf, 0xbf], |_, fits| {
            verdicts.push(fits);
            ControlFlow::Continue(())
        })
        .unwrap();
        assert_eq!(verdicts, [true, false, false]);
        assert_eq!(d.judged(), 405);
    }

    /// Once the callback breaks, it sees no more fields, nothing more is judged unless it enters
    /// the table, and the table still takes every entry the block adds.
    #[test]
    fn after_a_break_the_block_only_keeps_the_table() {
        let mut d = Decoder::with_judge(4096, |_, _| true);
        let mut block = hex("400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65");
        // Two references, a literal not indexed, one with indexing.
        block.extend_from_slice(&[0xbe, 0xbe, 0x0f, 0x2f, 0x01, b'x', 0x7e, 0x01, b'y']);
        let mut seen = 0;
        d.decode(&block, |_, _| {
            seen += 1;
            if seen == 2 { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
        })
        .unwrap();
        assert_eq!(seen, 2);
        assert_eq!(d.table(), (54 + 43, 2));
        // Judged: custom-value, and y (it entered the table); not x.
        assert_eq!(d.judged(), 12 + 1);
        assert_eq!(decode(&mut d, &[0xbe]).unwrap(), fields(&[("custom-key", "y")]));
    }
}
