//! HPACK's Huffman code (RFC 7541 Appendix B): decoding the strings a client sends, and (for tests) encoding.
//!
//! The code is canonical (codes of one length are consecutive, in symbol order, and every code
//! sorts below the longer ones), so the 257 code lengths define it; the decoder walks it one bit
//! at a time the way a canonical decoder does, which is plenty for header blocks.

/// Bit length of each symbol's code: the octets 0-255, then EOS (256). RFC 7541 Appendix B.
const LENGTHS: [u8; 257] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, //
    28, 28, 28, 28, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 28, //
    6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6, //
    5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10, //
    13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, //
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6, //
    15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6, 6, 5, //
    6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28, //
    20, 22, 20, 20, 22, 22, 22, 23, 22, 23, 23, 23, 23, 23, 24, 23, //
    24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, //
    22, 21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23, //
    21, 21, 22, 21, 23, 22, 23, 23, 20, 22, 22, 22, 23, 22, 22, 23, //
    26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, //
    19, 21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27, //
    20, 24, 20, 21, 22, 21, 21, 23, 22, 22, 25, 25, 24, 24, 26, 23, //
    26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26, //
    30,
];

const EOS: u16 = 256;
const MAX_LEN: usize = 30;

/// The canonical code's shape: how many codes each length has, and the symbols in code order.
struct Canonical {
    count: [u16; MAX_LEN + 1],
    symbols: [u16; 257],
}

// Evaluated at compile time: an index out of bounds here fails the build, it cannot panic a
// running process.
#[allow(clippy::indexing_slicing)]
const fn canonical() -> Canonical {
    let mut count = [0u16; MAX_LEN + 1];
    let mut s = 0;
    while s < LENGTHS.len() {
        count[LENGTHS[s] as usize] += 1;
        s += 1;
    }
    // Where each length's symbols start in code order.
    let mut next = [0u16; MAX_LEN + 1];
    let mut len = 1;
    while len <= MAX_LEN {
        next[len] = next[len - 1] + count[len - 1];
        len += 1;
    }
    let mut symbols = [0u16; 257];
    s = 0;
    while s < LENGTHS.len() {
        let l = LENGTHS[s] as usize;
        symbols[next[l] as usize] = s as u16;
        next[l] += 1;
        s += 1;
    }
    Canonical { count, symbols }
}

const CODE: Canonical = canonical();

/// Decode a Huffman-coded string, appending its octets to `out`; the error says what is wrong.
pub(crate) fn decode(input: &[u8], out: &mut Vec<u8>) -> Result<(), &'static str> {
    // The symbol being read: its bits so far, the first code of their length, and the index in
    // code order of that code.
    let (mut code, mut first, mut index, mut len) = (0u32, 0u32, 0usize, 0usize);
    let mut ones = true;
    for byte in input {
        for shift in (0..8).rev() {
            let bit = u32::from((byte >> shift) & 1);
            ones &= bit == 1;
            code |= bit;
            len += 1;
            let count = u32::from(CODE.count.get(len).copied().ok_or("code longer than 30 bits")?);
            if code < first + count {
                let at = index + (code - first) as usize;
                match CODE.symbols.get(at).copied() {
                    Some(EOS) => return Err("EOS inside a string"),
                    // Symbols other than EOS are octets.
                    Some(sym) => out.push(sym as u8),
                    None => return Err("code out of the table"),
                }
                (code, first, index, len, ones) = (0, 0, 0, 0, true);
            } else {
                index += count as usize;
                first = (first + count) << 1;
                code <<= 1;
            }
        }
    }
    // What is left must be padding: fewer than 8 bits, the most significant bits of EOS (ones).
    if len > 7 || !ones {
        return Err("padding is not the start of EOS or longer than 7 bits");
    }
    Ok(())
}

/// Huffman-code `input` (for tests: the normaliser never Huffman-codes what it re-encodes).
#[cfg(any(test, feature = "test-util"))]
pub fn encode(input: &[u8]) -> Vec<u8> {
    let codes = codes();
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u64, 0u32);
    for &b in input {
        let (code, len) = codes.get(usize::from(b)).copied().unwrap_or_default();
        acc = (acc << len) | u64::from(code);
        bits += len;
        while bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
        acc &= (1u64 << bits) - 1;
    }
    if bits > 0 {
        // Padded with the most significant bits of EOS.
        out.push(((acc << (8 - bits)) | ((1u64 << (8 - bits)) - 1)) as u8);
    }
    out
}

/// Each symbol's code and its length, assigned in code order.
#[cfg(any(test, feature = "test-util"))]
fn codes() -> Vec<(u32, u32)> {
    let mut codes = vec![(0u32, 0u32); LENGTHS.len()];
    let (mut code, mut prev) = (0u32, 0u32);
    for (i, &sym) in CODE.symbols.iter().enumerate() {
        let len = u32::from(LENGTHS.get(usize::from(sym)).copied().unwrap_or_default());
        if i > 0 {
            code = (code + 1) << (len - prev);
        }
        prev = len;
        if let Some(c) = codes.get_mut(usize::from(sym)) {
            *c = (code, len);
        }
    }
    codes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    fn decoded(input: &[u8]) -> Result<Vec<u8>, &'static str> {
        let mut out = Vec::new();
        decode(input, &mut out).map(|()| out)
    }

    /// The Huffman-coded strings of RFC 7541 Appendix C.4 and C.6.
    const RFC_EXAMPLES: &[(&str, &str)] = &[
        ("www.example.com", "f1e3c2e5f23a6ba0ab90f4ff"),
        ("no-cache", "a8eb10649cbf"),
        ("custom-key", "25a849e95ba97d7f"),
        ("custom-value", "25a849e95bb8e8b4bf"),
        ("302", "6402"),
        ("private", "aec3771a4b"),
        ("Mon, 21 Oct 2013 20:13:21 GMT", "d07abe941054d444a8200595040b8166e082a62d1bff"),
        ("https://www.example.com", "9d29ad171863c78f0b97c8e9ae82ae43d3"),
        ("307", "640eff"),
        ("gzip", "9bd9ab"),
        (
            "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1",
            "94e7821dd7f2e6c7b335dfdfcd5b3960d5af27087f3672c1ab270fb5291f9587316065c003ed4ee5b1063d5007",
        ),
    ];

    #[test]
    fn rfc_examples_decode_and_encode() {
        for &(text, coded) in RFC_EXAMPLES {
            assert_eq!(decoded(&hex(coded)).unwrap(), text.as_bytes(), "{text}");
            assert_eq!(encode(text.as_bytes()), hex(coded), "{text}");
        }
    }

    /// The lengths make a complete prefix code (Kraft's sum is exactly 1), EOS is 30 ones, and
    /// the shortest codes are those of the RFC's table ('0' is 00000, 'a' is 00011).
    #[test]
    fn the_code_is_complete() {
        let kraft: u64 = LENGTHS.iter().map(|&l| 1u64 << (MAX_LEN - usize::from(l))).sum();
        assert_eq!(kraft, 1 << MAX_LEN);
        let codes = codes();
        assert_eq!(codes[256], ((1 << 30) - 1, 30));
        assert_eq!(codes[usize::from(b'0')], (0, 5));
        assert_eq!(codes[usize::from(b'a')], (3, 5));
        assert_eq!(codes[usize::from(b'\n')], (0x3fff_fffc, 30));
    }

    #[test]
    fn every_octet_round_trips() {
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(decoded(&encode(&all)).unwrap(), all);
        for b in 0..=255u8 {
            assert_eq!(decoded(&encode(&[b, b, b])).unwrap(), [b, b, b]);
        }
        assert_eq!(decoded(&[]).unwrap(), b"");
    }

    #[test]
    fn bad_padding_and_eos_are_refused() {
        // '0' (00000) padded with zeros, and with a full octet of ones.
        assert!(decoded(&[0b0000_0000]).is_err());
        assert!(decoded(&[0b0000_0111, 0xff]).is_err());
        // EOS itself (30 ones), padded.
        assert!(decoded(&[0xff, 0xff, 0xff, 0xff]).is_err());
        // Ones only, fewer than 8: the empty string's padding is fine; 8 are not.
        assert!(decoded(&[0xff]).is_err());
        // '0' then 3 one bits of padding.
        assert_eq!(decoded(&[0b0000_0111]).unwrap(), b"0");
    }
}
