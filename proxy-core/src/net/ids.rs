//! Connection ids: unique per process run, cheap to hold, formatted only when logged.

use std::sync::atomic::{AtomicU64, Ordering};

/// `<random per-process prefix>-<sequence>`. An open connection holds 12 bytes for it, not a
/// string; the prefix makes ids (and PROXY v2 UNIQUE_IDs) differ across restarts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnId {
    prefix: u32,
    n: u64,
}

impl std::fmt::Display for ConnId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:08x}-{}", self.prefix, self.n)
    }
}

/// Hands out [`ConnId`]s.
#[derive(Debug)]
pub struct ConnIds {
    prefix: u32,
    seq: AtomicU64,
}

impl Default for ConnIds {
    fn default() -> Self {
        Self { prefix: rand::random(), seq: AtomicU64::new(0) }
    }
}

impl ConnIds {
    pub fn next(&self) -> ConnId {
        ConnId { prefix: self.prefix, n: self.seq.fetch_add(1, Ordering::Relaxed) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_distinct_and_share_the_process_prefix() {
        let ids = ConnIds::default();
        let (a, b) = (ids.next().to_string(), ids.next().to_string());
        assert_ne!(a, b);
        assert_eq!(a.split('-').next(), b.split('-').next());
        assert_eq!(a.len(), 10, "{a}");
    }
}
