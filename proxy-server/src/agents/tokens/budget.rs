//! The places a cluster's new (unauthenticated) sessions' token reviews may hold, apart from live sessions' reviews: bounded in all and per source address, a source's share tightening as the places fill.
//!
//! A place is held from before a review of a new session asks for a slot at the kube-apiserver
//! until its answer (or its timeout). Per cluster, the places are twice its `max_in_flight`: as
//! many in flight and as many waiting. One source (its address masked as the pending budget
//! masks it) may hold an eighth of them (at least one) once all are taken, and up to half while
//! the rest is free ([`proxy_core::net::share::share_at`], the rule of every share here). Over
//! either, the review is not asked for: the session is refused at once, and the refusal is
//! counted by which limit it hit.

use proxy_core::net::pending::SourceKey;
use proxy_core::net::share::share_at;
use proxy_core::sync::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

/// Which limit refused a review of a new session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Limit {
    #[error("its source address holds its share of the cluster's reviews of new sessions")]
    PerSource,
    #[error("the cluster's reviews of new sessions hold every place")]
    InAll,
}

impl Limit {
    /// The `limit` label of `seedgate_token_review_budget_refused_total`.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Limit::PerSource => "per_source",
            Limit::InAll => "in_all",
        }
    }
}

/// The places of a cluster whose `max_in_flight` is `in_flight`, and one source's share of a
/// full budget.
pub(super) fn sizes(in_flight: usize) -> (usize, usize) {
    let places = 2 * in_flight.max(1);
    (places, places.div_ceil(8))
}

#[derive(Default)]
struct Held {
    total: usize,
    by_source: HashMap<SourceKey, usize>,
}

/// The places held, per cluster (a cluster with none held has no entry).
#[derive(Default)]
pub(super) struct Budgets {
    clusters: HashMap<String, Held>,
}

impl Budgets {
    /// Take a place for `source` in `cluster`'s `places`, of which one source may hold `share`
    /// of a full budget.
    fn take(&mut self, cluster: &str, source: SourceKey, places: usize, share: usize) -> Result<(), Limit> {
        let held = self.clusters.entry(cluster.to_owned()).or_default();
        if held.total >= places {
            return Err(Limit::InAll);
        }
        let mine = held.by_source.get(&source).copied().unwrap_or(0);
        if mine >= share_at(share, places, held.total) {
            return Err(Limit::PerSource);
        }
        held.total += 1;
        *held.by_source.entry(source).or_default() += 1;
        Ok(())
    }

    fn give(&mut self, cluster: &str, source: SourceKey) {
        let Some(held) = self.clusters.get_mut(cluster) else { return };
        held.total = held.total.saturating_sub(1);
        if let Some(n) = held.by_source.get_mut(&source) {
            *n -= 1;
            if *n == 0 {
                held.by_source.remove(&source);
            }
        }
        if held.total == 0 {
            self.clusters.remove(cluster);
        }
    }
}

/// One place, given back when dropped.
pub(super) struct Place {
    budgets: Arc<Mutex<Budgets>>,
    cluster: String,
    source: SourceKey,
}

impl Drop for Place {
    fn drop(&mut self) {
        self.budgets.lock().give(&self.cluster, self.source);
    }
}

/// Take a place (see [`Budgets::take`]), held as long as the returned [`Place`].
pub(super) fn take(
    budgets: &Arc<Mutex<Budgets>>,
    cluster: &str,
    source: SourceKey,
    in_flight: usize,
) -> Result<Place, Limit> {
    let (places, share) = sizes(in_flight);
    budgets.lock().take(cluster, source, places, share)?;
    Ok(Place { budgets: budgets.clone(), cluster: cluster.to_owned(), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src(n: u32) -> SourceKey {
        SourceKey::V4(n)
    }

    #[test]
    fn the_places_are_twice_the_slots_and_a_source_holds_an_eighth_of_a_full_budget() {
        assert_eq!(sizes(8), (16, 2));
        assert_eq!(sizes(2), (4, 1));
        assert_eq!(sizes(1), (2, 1));
        assert_eq!(sizes(1024), (2048, 256));
    }

    /// One source alone takes up to half; others still get in until the budget is full, and
    /// each holds at most its share of a full one.
    #[test]
    fn a_flooding_source_leaves_room_for_the_others() {
        let b = Arc::new(Mutex::new(Budgets::default()));
        let mut held = Vec::new();
        let mut refused = Vec::new();
        for _ in 0..20 {
            match take(&b, "a", src(1), 8) {
                Ok(p) => held.push(p),
                Err(l) => refused.push(l),
            }
        }
        assert_eq!(held.len(), 8, "half of 16 while the rest is free");
        assert!(refused.iter().all(|l| *l == Limit::PerSource));
        // Seven more sources of one or two each: the budget fills, then refuses in all.
        for s in 2..=9 {
            for _ in 0..2 {
                match take(&b, "a", src(s), 8) {
                    Ok(p) => held.push(p),
                    Err(l) => refused.push(l),
                }
            }
        }
        assert_eq!(held.len(), 16);
        assert_eq!(refused.last(), Some(&Limit::InAll));
        // Another cluster has places of its own.
        let other = take(&b, "b", src(1), 8).expect("another cluster");
        drop(other);
        // Given back: all of them, and nothing is left behind.
        held.clear();
        assert!(b.lock().clusters.is_empty());
        assert!(take(&b, "a", src(1), 8).is_ok());
    }

    #[test]
    fn with_two_slots_one_source_holds_two_places_of_four() {
        let b = Arc::new(Mutex::new(Budgets::default()));
        // Budget 4 (max_in_flight 2), share 1, up to 2 while half is free.
        let p1 = take(&b, "a", src(1), 2).unwrap();
        let _p2 = take(&b, "a", src(1), 2).unwrap();
        assert_eq!(take(&b, "a", src(1), 2).err(), Some(Limit::PerSource));
        let _q1 = take(&b, "a", src(2), 2).unwrap();
        let _q2 = take(&b, "a", src(2), 2).unwrap();
        assert_eq!(take(&b, "a", src(3), 2).err(), Some(Limit::InAll));
        // A place given back is the next comer's.
        drop(p1);
        let _r1 = take(&b, "a", src(3), 2).expect("the place given back");
        assert_eq!(take(&b, "a", src(1), 2).err(), Some(Limit::InAll));
    }
}
