//! Text a peer chose, as a log line or a message may show it: control characters (newlines, ANSI escapes, bidirectional overrides) made visible, the length cut, so no peer can forge a log line or fill one.

use std::fmt;

/// Characters shown of an [`Untrusted`] text unless told otherwise.
pub const UNTRUSTED_MAX: usize = 256;

/// A peer's text, shown escaped and cut (see the module documentation). Printable text,
/// quotes and backslashes included, shows as it is; a control character as Rust writes it
/// escaped (`\n`, `\u{1b}`); past the limit, `…` and how many bytes were left out.
#[derive(Debug, Clone, Copy)]
pub struct Untrusted<'a> {
    text: &'a str,
    max: usize,
}

impl<'a> Untrusted<'a> {
    /// `text`, at most [`UNTRUSTED_MAX`] characters of it.
    pub fn new(text: &'a str) -> Self {
        Self { text, max: UNTRUSTED_MAX }
    }

    /// At most `max` characters of the text.
    pub fn max(self, max: usize) -> Self {
        Self { max, ..self }
    }
}

/// What a log viewer or terminal may take for a line break or an instruction: C0 and C1
/// controls and DEL, the Unicode line and paragraph separators, and the bidirectional
/// embeddings, overrides and isolates.
fn hidden(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{2028}' | '\u{2029}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

impl fmt::Display for Untrusted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (shown, (i, c)) in self.text.char_indices().enumerate() {
            if shown == self.max {
                return write!(f, "…(+{} bytes)", self.text.len() - i);
            }
            if hidden(c) {
                // `escape_debug` may leave one of these as it is: then the code point.
                if c.escape_debug().any(|e| e == '\\') {
                    write!(f, "{}", c.escape_debug())?;
                } else {
                    write!(f, "\\u{{{:x}}}", c as u32)?;
                }
            } else {
                f.write_fmt(format_args!("{c}"))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_shown_escaped_and_the_rest_as_it_is() {
        let forged = "node-1\n2026-01-01T00:00:00Z  INFO agent session up cluster=shoot-b\r\u{1b}[31m\u{9b}1m\u{7f}";
        let shown = Untrusted::new(forged).to_string();
        assert_eq!(
            shown,
            "node-1\\n2026-01-01T00:00:00Z  INFO agent session up cluster=shoot-b\\r\\u{1b}[31m\\u{9b}1m\\u{7f}"
        );
        assert!(!shown.chars().any(hidden), "{shown:?}");
        assert_eq!(Untrusted::new("a \"quoted\" \\ name, ünïcode").to_string(), "a \"quoted\" \\ name, ünïcode");
        for c in ['\u{2028}', '\u{2029}', '\u{202e}', '\u{2066}', '\u{200f}'] {
            let s = Untrusted::new(&format!("a{c}b")).to_string();
            assert!(!s.contains(c) && s.starts_with("a\\u{") && s.ends_with('b'), "{c:?} shown as {s:?}");
        }
    }

    #[test]
    fn a_long_text_is_cut_saying_how_much_was_left_out() {
        let long = "é".repeat(1000);
        let shown = Untrusted::new(&long).to_string();
        assert_eq!(shown, format!("{}…(+{} bytes)", "é".repeat(UNTRUSTED_MAX), 2 * (1000 - UNTRUSTED_MAX)));
        assert_eq!(Untrusted::new("abc").max(3).to_string(), "abc", "exactly at the limit: whole");
        assert_eq!(Untrusted::new("abcd").max(3).to_string(), "abc…(+1 bytes)");
        assert_eq!(Untrusted::new("").to_string(), "");
    }
}
