//! Byte sizes in config files: a plain count (`16777216`) or a number with a unit as Kubernetes writes quantities (`16Mi`, `64M`).
//!
//! A size key keeps its integer type in the config structs; `#[serde(deserialize_with =
//! "crate::size::de")]` (or [`de_opt`] for an optional one) reads either form, and
//! `#[schemars(with = "crate::schema::Size")]` describes both in the JSON Schema.

use crate::common::ValueError;
use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};
use std::fmt;

/// The units, longest first (so `Mi` is not read as `M` then `i`), and what each multiplies by:
/// Kubernetes' binary suffixes (also with a `B`), its decimal ones (`k`, and `K` too, as a
/// kilobyte is often written).
const UNITS: [(&str, u64); 13] = [
    ("KiB", 1 << 10),
    ("MiB", 1 << 20),
    ("GiB", 1 << 30),
    ("TiB", 1 << 40),
    ("Ki", 1 << 10),
    ("Mi", 1 << 20),
    ("Gi", 1 << 30),
    ("Ti", 1 << 40),
    ("k", 1_000),
    ("K", 1_000),
    ("M", 1_000_000),
    ("G", 1_000_000_000),
    ("T", 1_000_000_000_000),
];

/// Parse a size written as a string: digits, an optional fraction, an optional unit; the
/// result must be a whole number of bytes.
pub fn parse_size(text: &str) -> Result<u64, ValueError> {
    let bad = |why: &'static str| ValueError::Size { text: text.to_owned(), why };
    let s = text.trim();
    let split = s.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let multiplier = match unit {
        "" => 1,
        u => UNITS.iter().find(|(name, _)| *name == u).map(|(_, m)| *m).ok_or(bad("unknown unit"))?,
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() || (number.contains('.') && fraction.is_empty()) || fraction.contains('.') {
        return Err(bad("not a number"));
    }
    // Exact: digits as an integer, scaled down by the fraction's places after multiplying.
    let digits: u128 = format!("{whole}{fraction}").parse().map_err(|_| bad("too large"))?;
    let scale = 10u128.checked_pow(u32::try_from(fraction.len()).unwrap_or(u32::MAX)).ok_or(bad("too precise"))?;
    let bytes = digits.checked_mul(u128::from(multiplier)).ok_or(bad("too large"))?;
    if !bytes.is_multiple_of(scale) {
        return Err(bad("not a whole number of bytes"));
    }
    u64::try_from(bytes / scale).map_err(|_| bad("too large"))
}

/// The integer types size keys have.
pub(crate) trait Bytes: Sized {
    const MAX: u64;
    /// Why a size above `MAX` is refused.
    const TOO_LARGE: &'static str;
    fn of(n: u64) -> Self;
}

impl Bytes for u32 {
    const MAX: u64 = u32::MAX as u64;
    const TOO_LARGE: &'static str = "more than 4294967295 bytes";
    fn of(n: u64) -> Self {
        u32::try_from(n).unwrap_or(u32::MAX)
    }
}

impl Bytes for usize {
    const MAX: u64 = usize::MAX as u64;
    const TOO_LARGE: &'static str = "too large";
    fn of(n: u64) -> Self {
        usize::try_from(n).unwrap_or(usize::MAX)
    }
}

/// A size as read from YAML (an integer, or a string to parse) and how it was written. Any
/// other scalar is a value problem of its own (reported with the others), not the end of the
/// parse.
struct Input {
    text: String,
    bytes: Result<u64, ValueError>,
}

impl<'de> Deserialize<'de> for Input {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(InputVisitor)
    }
}

struct InputVisitor;

impl InputVisitor {
    fn number<E>(v: impl TryInto<u64> + ToString + Copy, why: &'static str) -> Result<Input, E> {
        let text = v.to_string();
        let bytes = v.try_into().map_err(|_| ValueError::Size { text: text.clone(), why });
        Ok(Input { text, bytes })
    }

    fn refused<E>(v: impl ToString, why: &'static str) -> Result<Input, E> {
        let text = v.to_string();
        Ok(Input { bytes: Err(ValueError::Size { text: text.clone(), why }), text })
    }
}

impl Visitor<'_> for InputVisitor {
    type Value = Input;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a byte count or a number with a unit (16Mi)")
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Input, E> {
        Self::number(v, "too large")
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Input, E> {
        Self::number(v, "negative")
    }
    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Input, E> {
        Self::number(v, "too large")
    }
    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Input, E> {
        Self::number(v, if v < 0 { "negative" } else { "too large" })
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Input, E> {
        Self::refused(v, "not a whole number of bytes")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Input, E> {
        Self::refused(v, "not a number")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Input, E> {
        Ok(Input { text: v.to_owned(), bytes: parse_size(v) })
    }
}

/// A size within `T`'s range, or the problem with it.
fn within<T: Bytes>(input: Input) -> Result<T, ValueError> {
    let n = input.bytes?;
    if n > T::MAX {
        return Err(ValueError::Size { text: input.text, why: T::TOO_LARGE });
    }
    Ok(T::of(n))
}

/// `#[serde(deserialize_with)]` for a size key. While a config file is parsed (see `yaml`), a
/// bad value is recorded with its position and read as 0, so the parse goes on to find the
/// others (the file is refused).
pub(crate) fn de<'de, D: Deserializer<'de>, T: Bytes>(d: D) -> Result<T, D::Error> {
    if !crate::yaml::collecting() {
        return within(Input::deserialize(d)?).map_err(de::Error::custom);
    }
    let s = serde_saphyr::Spanned::<Input>::deserialize(d)?;
    within(s.value).or_else(|e| {
        crate::yaml::record(s.referenced.line(), s.referenced.column(), e.to_string());
        Ok(T::of(0))
    })
}

/// [`de`] for an optional size key: `null` (or `key:` with nothing) is `None`.
pub(crate) fn de_opt<'de, D: Deserializer<'de>, T: Bytes>(d: D) -> Result<Option<T>, D::Error> {
    if !crate::yaml::collecting() {
        return match Option::<Input>::deserialize(d)? {
            Some(i) => within(i).map(Some).map_err(de::Error::custom),
            None => Ok(None),
        };
    }
    let Some(s) = Option::<serde_saphyr::Spanned<Input>>::deserialize(d)? else { return Ok(None) };
    within(s.value).map(Some).or_else(|e| {
        crate::yaml::record(s.referenced.line(), s.referenced.column(), e.to_string());
        Ok(Some(T::of(0)))
    })
}

#[cfg(test)]
mod tests;
