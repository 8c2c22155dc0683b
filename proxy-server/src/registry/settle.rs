//! The start-up wait: a replica turns ready once every cluster it expects has an agent here, or after `agents.settle_time`, and from then on its readiness never depends on agents.
//!
//! The wait keeps a replica that has just started (a rolling update, a rescheduled pod) out of
//! its Service until its clusters' agents had a chance to reach it, while the other replicas
//! serve: its dials would otherwise answer `503` for want of an agent. It is a property of the
//! start, never of a tenant's health: once over, a cluster without agents fails only its own
//! dials.

use proxy_core::obs::admin::Check;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const NAME: &str = "agents-settled";
/// Clusters named in one line at most (a seed serves hundreds).
const LISTED: usize = 5;

pub(crate) struct Settle {
    started: Instant,
    /// How the wait ended; set once.
    ended: OnceLock<String>,
}

impl Settle {
    pub(crate) fn new(started: Instant) -> Self {
        Self { started, ended: OnceLock::new() }
    }

    /// The `agents-settled` check at `now`, with `limit` the settle time and `waiting` the
    /// clusters of `expected` (those whose agents are expected here) that have none here now.
    pub(crate) fn check(&self, now: Instant, limit: Duration, expected: usize, waiting: &[String]) -> Check {
        if let Some(how) = self.ended.get() {
            return Check::new(NAME, true, how.clone());
        }
        let waited = now.saturating_duration_since(self.started);
        let how = if expected == 0 {
            "no cluster known here expects agents".to_owned()
        } else if waiting.is_empty() {
            format!(
                "every cluster expected here had an agent ({expected}) {:.1}s after the start",
                waited.as_secs_f64()
            )
        } else if waited >= limit {
            format!(
                "agents.settle_time ({}s) passed; {} of {expected} expected clusters had no agent here then: {}",
                limit.as_secs_f64(),
                waiting.len(),
                list(waiting)
            )
        } else {
            let left = limit - waited;
            return Check::new(
                NAME,
                false,
                format!(
                    "started {:.1}s ago; waiting for agents of {} ({} of {expected} expected clusters have one here); ready in {:.1}s at the latest (agents.settle_time)",
                    waited.as_secs_f64(),
                    list(waiting),
                    expected - waiting.len(),
                    left.as_secs_f64()
                ),
            );
        };
        let how = self.ended.get_or_init(|| {
            tracing::info!("start-up wait over, ready: {how}");
            format!("{how}; since then readiness does not depend on agents")
        });
        Check::new(NAME, true, how.clone())
    }
}

fn list(names: &[String]) -> String {
    match names.len() {
        n if n > LISTED => format!("{} and {} more", names[..LISTED].join(", "), n - LISTED),
        _ => names.join(", "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    const LIMIT: Duration = Duration::from_secs(30);

    #[test]
    fn waits_until_every_expected_cluster_has_an_agent_then_never_again() {
        let t0 = Instant::now();
        let s = Settle::new(t0);
        let c = s.check(t0 + Duration::from_secs(2), LIMIT, 2, &names(&["shoot-a", "shoot-b"]));
        assert!(!c.ok(), "{c:?}");
        assert!(
            c.detail.contains("waiting for agents of shoot-a, shoot-b (0 of 2") && c.detail.contains("28.0s"),
            "{c:?}"
        );
        let c = s.check(t0 + Duration::from_secs(3), LIMIT, 2, &names(&["shoot-b"]));
        assert!(!c.ok() && c.detail.contains("shoot-b (1 of 2"), "{c:?}");
        let c = s.check(t0 + Duration::from_secs(4), LIMIT, 2, &[]);
        assert!(c.ok() && c.detail.starts_with("every cluster expected here had an agent (2) 4.0s"), "{c:?}");
        // Agents gone later do not matter any more.
        let later = s.check(t0 + Duration::from_secs(5), LIMIT, 2, &names(&["shoot-a", "shoot-b"]));
        assert!(later.ok() && later.detail == c.detail, "{later:?}");
    }

    #[test]
    fn the_settle_time_ends_the_wait_for_clusters_without_agents() {
        let t0 = Instant::now();
        let s = Settle::new(t0);
        let missing = names(&["c1", "c2", "c3", "c4", "c5", "c6", "c7"]);
        let c = s.check(t0 + Duration::from_secs(29), LIMIT, 9, &missing);
        assert!(!c.ok() && c.detail.contains("c1, c2, c3, c4, c5 and 2 more (2 of 9"), "{c:?}");
        let c = s.check(t0 + LIMIT, LIMIT, 9, &missing);
        assert!(c.ok() && c.detail.starts_with("agents.settle_time (30s) passed; 7 of 9 expected"), "{c:?}");
        assert!(s.check(t0 + LIMIT, Duration::from_secs(60), 9, &missing).ok(), "a longer settle time read later");
    }

    #[test]
    fn nothing_to_wait_for_or_no_settle_time_is_ready_at_once() {
        let t0 = Instant::now();
        let c = Settle::new(t0).check(t0, LIMIT, 0, &[]);
        assert!(c.ok() && c.detail.starts_with("no cluster known here expects agents"), "{c:?}");
        assert!(Settle::new(t0).check(t0, Duration::ZERO, 1, &names(&["a"])).ok());
    }
}
