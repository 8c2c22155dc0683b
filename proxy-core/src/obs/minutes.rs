//! Per-minute counts of a few kinds of event over the last [`MINUTES`] minutes (a cluster's dials by result, a route's connections): a fixed ring of atomics that the counting path updates without a lock or an allocation.
//!
//! Each cell packs the minute it counts with its count, so a cell of an earlier minute is
//! replaced by a compare-and-swap of the one word, never reset separately (no count lost to a
//! reset racing an increment). The status page reads the ring; nothing else does.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// How many minutes a ring holds: the current one and those before it.
pub const MINUTES: usize = 10;

/// Bits of a cell that hold the count; the minute takes the rest.
const COUNT_BITS: u32 = 40;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;

/// Counts of `K` kinds of event per minute, for the last [`MINUTES`] minutes.
pub struct PerMinute<const K: usize> {
    /// `cells[slot][kind]`: minute (+1, so 0 is "never") in the high bits, count in the low ones.
    cells: [[AtomicU64; K]; MINUTES],
}

impl<const K: usize> Default for PerMinute<K> {
    fn default() -> Self {
        Self { cells: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))) }
    }
}

impl<const K: usize> std::fmt::Debug for PerMinute<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PerMinute").field("kinds", &K).finish()
    }
}

/// The minute now, counted from the first time any ring asked (the tokio clock, so that tests on
/// a paused clock move it), plus one.
pub fn minute_now() -> u64 {
    static EPOCH: OnceLock<tokio::time::Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(tokio::time::Instant::now);
    tokio::time::Instant::now().saturating_duration_since(epoch).as_secs() / 60 + 1
}

impl<const K: usize> PerMinute<K> {
    /// Count `n` events of kind `kind` (out of range: ignored) now.
    pub fn add(&self, kind: usize, n: u64) {
        self.add_at(minute_now(), kind, n);
    }

    /// Count `n` events of kind `kind` in `minute` (a value of [`minute_now`]).
    pub fn add_at(&self, minute: u64, kind: usize, n: u64) {
        let slot = (minute % MINUTES as u64) as usize;
        let Some(cell) = self.cells.get(slot).and_then(|s| s.get(kind)) else { return };
        let stamp = (minute & (u64::MAX >> COUNT_BITS)) << COUNT_BITS;
        let mut now = cell.load(Ordering::Relaxed);
        // Bounded by the number of writers racing on this one cell.
        loop {
            let next = if now & !COUNT_MASK == stamp {
                stamp | ((now & COUNT_MASK).saturating_add(n) & COUNT_MASK)
            } else if now >> COUNT_BITS > minute {
                // A later minute already holds the cell: this count is too old to keep.
                return;
            } else {
                stamp | (n & COUNT_MASK)
            };
            match cell.compare_exchange_weak(now, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return,
                Err(seen) => now = seen,
            }
        }
    }

    /// Kind `kind`'s counts of the last [`MINUTES`] minutes, oldest first (the last is the
    /// current, unfinished minute).
    pub fn series(&self, kind: usize) -> [u64; MINUTES] {
        self.series_at(minute_now(), kind)
    }

    /// [`series`](Self::series) as of `minute`.
    pub fn series_at(&self, minute: u64, kind: usize) -> [u64; MINUTES] {
        std::array::from_fn(|i| {
            let Some(m) = (minute + 1 + i as u64).checked_sub(MINUTES as u64).filter(|m| *m > 0) else { return 0 };
            let slot = (m % MINUTES as u64) as usize;
            let stamp = (m & (u64::MAX >> COUNT_BITS)) << COUNT_BITS;
            let v = self.cells.get(slot).and_then(|s| s.get(kind)).map_or(0, |c| c.load(Ordering::Relaxed));
            if v & !COUNT_MASK == stamp { v & COUNT_MASK } else { 0 }
        })
    }

    /// Whether kind `kind` counted anything in the last [`MINUTES`] minutes.
    pub fn any(&self, kind: usize) -> bool {
        self.series(kind).iter().any(|n| *n > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_stay_in_their_minute_and_age_out_of_the_ring() {
        let r = PerMinute::<2>::default();
        r.add_at(5, 0, 3);
        r.add_at(5, 0, 1);
        r.add_at(6, 1, 7);
        let s = r.series_at(6, 0);
        assert_eq!(s[MINUTES - 2], 4, "minute 5, one before the current");
        assert_eq!(s[MINUTES - 1], 0);
        assert_eq!(r.series_at(6, 1)[MINUTES - 1], 7);
        // Minute 15 reuses minute 5's cell: the old count is replaced, not added to.
        r.add_at(15, 0, 2);
        assert_eq!(r.series_at(15, 0)[MINUTES - 1], 2);
        assert_eq!(r.series_at(15, 0).iter().sum::<u64>(), 2, "minute 5 has left the window");
        // A count for a minute older than the cell's is dropped.
        r.add_at(5, 0, 9);
        assert_eq!(r.series_at(15, 0).iter().sum::<u64>(), 2);
        // Out of range kinds are ignored.
        r.add_at(15, 9, 1);
        assert_eq!(r.series_at(15, 9), [0; MINUTES]);
        // Long after, nothing is left.
        assert_eq!(r.series_at(100, 0), [0; MINUTES]);
    }

    #[test]
    fn concurrent_counts_of_one_minute_all_land() {
        let r = std::sync::Arc::new(PerMinute::<1>::default());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let r = r.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        r.add_at(3, 0, 1);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread");
        }
        assert_eq!(r.series_at(3, 0)[MINUTES - 1], 40_000);
    }
}
