//! What the status page counts of a cluster's dials and of a session, beside what dials need: a cluster's dials of the last minutes by result ([`Dials`], a ring of per-minute atomics counted once per dial, after it ended), a session's bytes (added once per stream, when the stream ends: [`Tally::ended`]) and its last failed dial ([`Tally::failed`]: a lock on the failure's path only) — nothing per byte.

use proxy_core::obs::minutes::PerMinute;
use proxy_core::sync::Mutex;
use proxy_core::tunnel::DialError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// What a dial came to, as a cluster counts its dials per minute: `ok`, or the refusal's code
/// ([`DialRefusal::code`](super::DialRefusal::code)).
pub(crate) const DIAL_RESULTS: [&str; DialError::CODES.len() + 3] = {
    // `ok`, the tunnel's dial codes as the wire names them, then the cluster's share refusals.
    let codes = DialError::CODES;
    let mut all = [""; DialError::CODES.len() + 3];
    all[0] = "ok";
    let mut i = 0;
    while i < codes.len() {
        all[1 + i] = codes[i];
        i += 1;
    }
    all[codes.len() + 1] = "cluster_stream_limit";
    all[codes.len() + 2] = "cluster_pending_limit";
    all
};

/// The code a dial's result is counted as when [`DIAL_RESULTS`] does not name it: `tunnel_error`.
pub(super) const OTHER: usize = 11;

/// A cluster's dials of the last minutes, by [`DIAL_RESULTS`].
pub(crate) type Dials = PerMinute<{ DIAL_RESULTS.len() }>;

/// A session's figures for the status page (see the module documentation).
#[derive(Debug, Default)]
pub(crate) struct Tally {
    to_shoot: AtomicU64,
    to_seed: AtomicU64,
    last_error: Mutex<Option<(Instant, String)>>,
}

impl Tally {
    /// A stream of this session ended, having moved these bytes.
    pub(crate) fn ended(&self, to_shoot: u64, to_seed: u64) {
        self.to_shoot.fetch_add(to_shoot, Ordering::Relaxed);
        self.to_seed.fetch_add(to_seed, Ordering::Relaxed);
    }

    /// A dial on this session failed with `error`.
    pub(crate) fn failed(&self, error: String) {
        *self.last_error.lock() = Some((Instant::now(), error));
    }

    /// Bytes to the shoot and to the seed of the streams that ended.
    pub(crate) fn bytes(&self) -> (u64, u64) {
        (self.to_shoot.load(Ordering::Relaxed), self.to_seed.load(Ordering::Relaxed))
    }

    /// The last failed dial: when, and why.
    pub(crate) fn last_error(&self) -> Option<(Instant, String)> {
        self.last_error.lock().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::{DIAL_RESULTS, OTHER};

    #[test]
    fn every_dial_result_is_named_once_and_other_is_the_tunnel_error() {
        assert_eq!(DIAL_RESULTS[OTHER], "tunnel_error");
        let names: std::collections::BTreeSet<&str> = DIAL_RESULTS.iter().copied().collect();
        assert_eq!(names.len(), DIAL_RESULTS.len(), "a result named twice: {DIAL_RESULTS:?}");
        assert!(!names.contains(""), "a result left unnamed: {DIAL_RESULTS:?}");
    }
}
