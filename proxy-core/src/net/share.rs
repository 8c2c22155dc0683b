//! Tenants' shares of the process limits: each route's (sni-router) or cluster's (proxy-server) count of established and pending work, capped so one tenant cannot take what the others need.
//!
//! A tenant's limit of one kind is either explicit (its own `limits:` in the config: a hard cap)
//! or the default: a share `S` of the process budget `B` (`limits.tenant_share` × the process
//! limit, rounded up). The default share tightens as the process fills, with the same rule as
//! the pending budget's per-source share: with `P` of the budget in use, one tenant may hold
//! `H = max(S, B/2)` while `P <= B/2`, and `max(S, H - (H - S) * (2P/B - 1))` above (rounded
//! up), reaching `S` when the budget is full ([`share_at`]). So a lone busy tenant may use up to
//! half the process while the rest is idle, and once others want the rest each holds at most
//! `S` more than nothing: a tenant already above its share is refused until it is below again.
//!
//! [`Tenant`] counts, [`Hold`] keeps one unit for as long as it lives, [`Shares`] is the
//! process-wide side: the totals the pressure is read from, the metrics and the readiness line.

use crate::sync::Mutex;
use prometheus::{IntCounterVec, IntGaugeVec, Registry};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};

/// The most one holder may have of a budget of `budget` when `in_use` of it is in use, given its
/// `share` of a full budget (see the module documentation). No cap (`usize::MAX`) for `share` 0,
/// or for a share of the whole budget: then the budget's own limit is the one that applies.
pub fn share_at(share: usize, budget: usize, in_use: usize) -> usize {
    let b = budget.max(1);
    let h = share.max(b / 2);
    if share == 0 || h >= b {
        return usize::MAX;
    }
    if h == share || 2 * in_use <= b {
        return h;
    }
    let frac = (2.0 * in_use as f64 / b as f64 - 1.0).min(1.0);
    // Rounded up, so the share never drops below `share` by rounding and reaches it only when full.
    let cap = h as f64 - (h - share) as f64 * frac;
    (cap.ceil() as usize).clamp(share, h)
}

/// How one of a tenant's limits is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cap {
    /// The tenant's own limit from the config: a hard cap.
    Fixed(usize),
    /// The default: `share` of a full process `budget`, more while it has room ([`share_at`]).
    Share { share: usize, budget: usize },
}

impl Cap {
    /// `explicit` if set, else `fraction` of `budget` (rounded up, at least 1).
    pub fn new(explicit: Option<usize>, fraction: f64, budget: usize) -> Self {
        match explicit {
            Some(n) => Cap::Fixed(n),
            None => {
                let share = (budget as f64 * fraction.clamp(0.0, 1.0)).ceil() as usize;
                Cap::Share { share: share.clamp(1, budget.max(1)), budget }
            }
        }
    }

    /// The cap when `in_use` of the process budget is in use.
    pub fn at(self, in_use: usize) -> usize {
        match self {
            Cap::Fixed(n) => n,
            Cap::Share { share, budget } => share_at(share, budget, in_use),
        }
    }
}

/// The kinds of work a tenant holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Relayed connections (sni-router) or tunnel streams (proxy-server).
    Established = 0,
    /// Work attributed to the tenant, not relaying yet and not to be cut: routed connections
    /// in their upstream connect, dials in flight.
    Pending = 1,
    /// Connections of the tenant still in their handshake. Capped by the pending budget, which
    /// evicts the tenant's oldest (its `TenantShare`); counted here with the pending work (same
    /// gauge and refusal label), apart from its cap.
    Handshake = 2,
}

impl Kind {
    /// Which gauge and refusal label the kind counts in: established, or pending.
    fn shown_as(self) -> usize {
        match self {
            Kind::Established => 0,
            Kind::Pending | Kind::Handshake => 1,
        }
    }
}

/// One tenant's counts. Shared by every connection it carries; [`Shares::tenant`] gives the
/// same one to every route object (or cluster entry) of the same name, across reloads.
pub struct Tenant {
    labels: Vec<String>,
    held: [AtomicUsize; 3],
    /// The caps last applied, for the readiness line.
    caps: [AtomicUsize; 3],
    refused: [AtomicU64; 3],
    metrics: Arc<ShareMetrics>,
    /// The process-wide totals (the pressure shares are computed from).
    totals: Arc<[AtomicUsize; 3]>,
    gauges: OnceLock<[prometheus::IntGauge; 2]>,
}

/// One unit of a tenant's work, given back when dropped.
pub struct Hold {
    tenant: Arc<Tenant>,
    kind: Kind,
}

impl Drop for Hold {
    fn drop(&mut self) {
        let k = self.kind as usize;
        self.tenant.held[k].fetch_sub(1, Ordering::AcqRel);
        self.tenant.totals[k].fetch_sub(1, Ordering::AcqRel);
        self.tenant.gauges()[self.kind.shown_as()].dec();
    }
}

impl Tenant {
    fn gauges(&self) -> &[prometheus::IntGauge; 2] {
        self.gauges.get_or_init(|| {
            let l: Vec<&str> = self.labels.iter().map(String::as_str).collect();
            [self.metrics.held[0].with_label_values(&l), self.metrics.held[1].with_label_values(&l)]
        })
    }

    /// Units of `kind` held now.
    pub fn held(&self, kind: Kind) -> usize {
        self.held[kind as usize].load(Ordering::Acquire)
    }

    /// The process-wide units of `kind` held by every tenant now.
    pub fn total(&self, kind: Kind) -> usize {
        self.totals[kind as usize].load(Ordering::Acquire)
    }

    /// Take one unit of `kind` if the tenant holds fewer than `cap`; a refusal is counted (in
    /// `seedgate_<tenant>_limit_rejects_total` and the readiness line).
    pub fn try_take(self: &Arc<Self>, kind: Kind, cap: usize) -> Option<Hold> {
        let k = kind as usize;
        // Written only when it changed: a store on every connection would pull the line away
        // from every other CPU taking from the same tenant.
        if self.caps[k].load(Ordering::Relaxed) != cap {
            self.caps[k].store(cap, Ordering::Relaxed);
        }
        let taken = self.held[k].fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < cap).then_some(n + 1));
        if taken.is_err() {
            self.count_refused(kind, 1);
            return None;
        }
        self.totals[k].fetch_add(1, Ordering::AcqRel);
        self.gauges()[kind.shown_as()].inc();
        Some(Hold { tenant: self.clone(), kind })
    }

    /// One unit of `kind` whose cap is kept elsewhere (the pending budget's for
    /// [`Kind::Handshake`]): counted, never refused.
    pub fn hold(self: &Arc<Self>, kind: Kind) -> Hold {
        self.held[kind as usize].fetch_add(1, Ordering::AcqRel);
        self.totals[kind as usize].fetch_add(1, Ordering::AcqRel);
        self.gauges()[kind.shown_as()].inc();
        Hold { tenant: self.clone(), kind }
    }

    /// `n` units of the tenant's work of `kind` refused or cut for its share.
    pub fn count_refused(&self, kind: Kind, n: usize) {
        if n == 0 {
            return;
        }
        self.refused[kind as usize].fetch_add(n as u64, Ordering::Relaxed);
        let mut l: Vec<&str> = self.labels.iter().map(String::as_str).collect();
        l.push(self.metrics.kind_labels[kind.shown_as()]);
        self.metrics.rejects.with_label_values(&l).inc_by(n as u64);
    }

    /// Take one unit of `kind` against `cap` applied at the process-wide pressure of that kind.
    pub fn try_take_at(self: &Arc<Self>, kind: Kind, cap: Cap, in_use: usize) -> Option<Hold> {
        self.try_take(kind, cap.at(in_use))
    }
}

/// Tenants' series at 0 before their first unit (see [`Shares::series`]): a configured route
/// or a known cluster shows what it holds, 0, and its refusals by limit, none, from the start.
#[derive(Clone)]
pub struct TenantSeries(Arc<ShareMetrics>);

impl TenantSeries {
    /// The series of the tenant with these label values, at 0 where they are new.
    pub fn at_zero(&self, labels: &[&str]) {
        let m = &self.0;
        for held in &m.held {
            let _ = held.with_label_values(labels);
        }
        let mut with_limit = labels.to_vec();
        for kind in m.kind_labels {
            with_limit.push(kind);
            let _ = m.rejects.with_label_values(&with_limit);
            with_limit.pop();
        }
    }
}

struct ShareMetrics {
    /// By the tenant's labels: established, pending.
    held: [IntGaugeVec; 2],
    /// By the tenant's labels and `limit`.
    rejects: IntCounterVec,
    kind_labels: [&'static str; 2],
}

/// One tenant's counts as the status page shows them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantFigures {
    /// Its label values (`[cluster]`, `[listener, route]`).
    pub labels: Vec<String>,
    /// Established work held now (streams, routed connections).
    pub established: usize,
    /// Pending work held now (dials in flight, connects, handshakes).
    pub pending: usize,
    /// The cap of its established work at its last take (0 before any).
    pub established_cap: usize,
    /// Work refused or cut for its share so far.
    pub refused: u64,
}

/// How a binary names its tenants in metrics and readiness.
#[derive(Debug, Clone, Copy)]
pub struct Naming {
    /// `route` or `cluster`: the metrics are `seedgate_<tenant>_<established>`,
    /// `seedgate_<tenant>_pending` and `seedgate_<tenant>_limit_rejects_total`.
    pub tenant: &'static str,
    /// The label names of a tenant (e.g. `listener`, `route`).
    pub labels: &'static [&'static str],
    /// What established work is called: `connections` or `streams`.
    pub established: &'static str,
}

/// The process-wide side of tenant shares.
pub struct Shares {
    naming: Naming,
    metrics: Arc<ShareMetrics>,
    totals: Arc<[AtomicUsize; 3]>,
    /// Every tenant alive, by labels (for the same tenant across reloads, and readiness).
    tenants: Mutex<HashMap<Vec<String>, Weak<Tenant>>>,
}

impl Shares {
    pub fn new(reg: &Registry, naming: Naming) -> Self {
        let t = naming.tenant;
        let gauge = |what: &str| {
            crate::obs::metrics::gauge_vec(
                reg,
                &format!("seedgate_{t}_{what}"),
                &format!("{what} held now by each {t} (its share of the process limit; see limits.tenant_share)."),
                naming.labels,
            )
        };
        let held = [gauge(naming.established), gauge("pending")];
        let mut labels = naming.labels.to_vec();
        labels.push("limit");
        let rejects = crate::obs::metrics::counter_vec(
            reg,
            &format!("seedgate_{t}_limit_rejects_total"),
            &format!(
                "Work refused because its {t} held its share, by {t} and limit ({}, pending).",
                naming.established
            ),
            &labels,
        );
        let kind_labels = [naming.established, "pending"];
        Self {
            naming,
            metrics: Arc::new(ShareMetrics { held, rejects, kind_labels }),
            totals: Arc::default(),
            tenants: Mutex::default(),
        }
    }

    /// Shares whose metrics are registered nowhere (tests).
    #[cfg(test)]
    fn unregistered(naming: Naming) -> Self {
        Self::new(&Registry::new(), naming)
    }

    fn lock(&self) -> crate::sync::MutexGuard<'_, HashMap<Vec<String>, Weak<Tenant>>> {
        self.tenants.lock()
    }

    /// What gives a configured tenant its series from the start.
    pub fn series(&self) -> TenantSeries {
        TenantSeries(self.metrics.clone())
    }

    /// The tenant with these label values: the live one if any (so a route rebuilt by a reload
    /// keeps counting what its connections hold), else a new one.
    pub fn tenant(&self, labels: &[&str]) -> Arc<Tenant> {
        let key: Vec<String> = labels.iter().map(|s| (*s).to_owned()).collect();
        let mut map = self.lock();
        if let Some(t) = map.get(&key).and_then(Weak::upgrade) {
            return t;
        }
        // Forget the dead before the map doubles: bounded by the tenants alive.
        if map.len() >= 64 && map.len().is_power_of_two() {
            map.retain(|_, w| w.strong_count() > 0);
        }
        let t = Arc::new(Tenant {
            labels: key.clone(),
            held: Default::default(),
            caps: Default::default(),
            refused: Default::default(),
            metrics: self.metrics.clone(),
            totals: self.totals.clone(),
            gauges: OnceLock::new(),
        });
        map.insert(key, Arc::downgrade(&t));
        t
    }

    /// Units of `kind` held by every tenant now.
    pub fn total(&self, kind: Kind) -> usize {
        self.totals[kind as usize].load(Ordering::Acquire)
    }

    /// Every live tenant's counts, for the status page.
    pub fn figures(&self) -> Vec<TenantFigures> {
        let live: Vec<Arc<Tenant>> = self.lock().values().filter_map(Weak::upgrade).collect();
        live.iter()
            .map(|t| TenantFigures {
                labels: t.labels.clone(),
                established: t.held(Kind::Established),
                pending: t.held(Kind::Pending) + t.held(Kind::Handshake),
                established_cap: t.caps[Kind::Established as usize].load(Ordering::Relaxed),
                refused: t.refused.iter().map(|r| r.load(Ordering::Relaxed)).sum(),
            })
            .collect()
    }

    /// The `/readyz?verbose` line, information only (a tenant at its share is handled, not a
    /// fault); names the tenants at their share now and those refused most so far.
    pub fn readiness(&self, share: f64) -> crate::obs::admin::Check {
        const LISTED: usize = 5;
        let name = |t: &Tenant| t.labels.last().cloned().unwrap_or_default();
        let live: Vec<Arc<Tenant>> = self.lock().values().filter_map(Weak::upgrade).collect();
        let kinds = [Kind::Established, Kind::Pending];
        let mut full: Vec<String> = Vec::new();
        for t in &live {
            for k in kinds {
                let (held, cap) = (t.held(k), t.caps[k as usize].load(Ordering::Relaxed));
                if held > 0 && held >= cap {
                    full.push(format!("{} ({} {held}/{cap})", name(t), self.metrics.kind_labels[k as usize]));
                }
            }
        }
        let mut refused: Vec<(u64, String)> = live
            .iter()
            .map(|t| {
                let n = t.refused.iter().map(|r| r.load(Ordering::Relaxed)).sum::<u64>();
                (n, name(t))
            })
            .filter(|(n, _)| *n > 0)
            .collect();
        refused.sort_by(|a, b| b.cmp(a));
        let list = |v: Vec<String>| match v.len() {
            0 => "none".to_owned(),
            n if n > LISTED => format!("{} and {} more", v[..LISTED].join(", "), n - LISTED),
            _ => v.join(", "),
        };
        full.sort();
        let refused = list(refused.into_iter().map(|(n, who)| format!("{who} {n}")).collect());
        let detail = format!(
            "default share {:.0}% of each process limit per {}; at their share now: {}; refused so far: {refused}",
            share * 100.0,
            self.naming.tenant,
            list(full),
        );
        crate::obs::admin::Check::info(format!("{}-shares", self.naming.tenant), detail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAMING: Naming = Naming { tenant: "route", labels: &["listener", "route"], established: "connections" };

    #[test]
    fn the_share_is_half_the_budget_without_pressure_and_s_when_full() {
        assert_eq!(share_at(10, 100, 0), 50);
        assert_eq!(share_at(10, 100, 50), 50);
        assert_eq!(share_at(10, 100, 75), 30);
        assert_eq!(share_at(10, 100, 100), 10);
        assert_eq!(share_at(10, 100, 1_000), 10);
        assert_eq!(share_at(60, 100, 0), 60, "a share above half the budget is fixed");
        assert_eq!(share_at(0, 100, 100), usize::MAX, "0: no cap");
        assert_eq!(share_at(100, 100, 100), usize::MAX, "all of it: no cap of its own");
        let mut prev = usize::MAX;
        for p in 0..=120 {
            assert!(share_at(10, 100, p) <= prev, "monotone");
            prev = share_at(10, 100, p);
        }
    }

    #[test]
    fn caps_explicit_or_a_share_of_the_budget() {
        assert_eq!(Cap::new(Some(7), 0.25, 1000), Cap::Fixed(7));
        assert_eq!(Cap::new(Some(7), 0.25, 1000).at(1000), 7, "explicit: hard, whatever the pressure");
        assert_eq!(Cap::new(None, 0.25, 1000), Cap::Share { share: 250, budget: 1000 });
        assert_eq!(Cap::new(None, 0.25, 1000).at(0), 500);
        assert_eq!(Cap::new(None, 0.25, 1000).at(1000), 250);
        assert_eq!(Cap::new(None, 0.001, 10), Cap::Share { share: 1, budget: 10 }, "at least 1");
        assert_eq!(Cap::new(None, 1.0, 10).at(10), usize::MAX, "the whole budget: the process limit applies");
        assert_eq!(Cap::new(None, 0.25, 1).at(1), usize::MAX, "a budget of one: the process limit applies");
    }

    #[test]
    fn holds_count_per_tenant_and_in_total_and_refusals_are_counted() {
        let s = Shares::unregistered(NAMING);
        let a = s.tenant(&["gw", "a"]);
        let b = s.tenant(&["gw", "b"]);
        let h1 = a.try_take(Kind::Established, 2).expect("room");
        let h2 = a.try_take(Kind::Established, 2).expect("room");
        assert!(a.try_take(Kind::Established, 2).is_none(), "a is at its cap");
        let hb = b.try_take(Kind::Established, 2).expect("b has its own");
        let p = a.try_take(Kind::Pending, 1).expect("pending counts apart");
        assert_eq!((a.held(Kind::Established), s.total(Kind::Established), s.total(Kind::Pending)), (2, 3, 1));
        assert_eq!(s.metrics.rejects.with_label_values(&["gw", "a", "connections"]).get(), 1);
        assert_eq!(s.metrics.held[0].with_label_values(&["gw", "a"]).get(), 2);
        let ready = s.readiness(0.25);
        assert!(
            ready.status == crate::obs::admin::Status::Info
                && ready.detail.contains("at their share now: a (connections 2/2), a (pending 1/1)"),
            "{ready:?}"
        );
        assert!(ready.detail.contains("refused so far: a 1"), "{ready:?}");
        drop((h1, h2, hb, p));
        assert_eq!((s.total(Kind::Established), s.total(Kind::Pending)), (0, 0));
        assert_eq!(s.metrics.held[0].with_label_values(&["gw", "a"]).get(), 0);
        a.try_take(Kind::Established, 2).expect("room again");
    }

    #[test]
    fn work_capped_elsewhere_is_held_uncapped_and_its_refusals_counted_as_pending() {
        let s = Shares::unregistered(NAMING);
        let a = s.tenant(&["gw", "a"]);
        let h = a.hold(Kind::Handshake);
        let p = a.try_take(Kind::Pending, 1).expect("dials count apart from handshakes");
        assert_eq!((a.held(Kind::Handshake), a.held(Kind::Pending)), (1, 1));
        assert_eq!(s.metrics.held[1].with_label_values(&["gw", "a"]).get(), 2, "one pending gauge for both");
        a.count_refused(Kind::Handshake, 3);
        a.count_refused(Kind::Handshake, 0);
        assert_eq!(s.metrics.rejects.with_label_values(&["gw", "a", "pending"]).get(), 3);
        drop((h, p));
        assert_eq!(s.metrics.held[1].with_label_values(&["gw", "a"]).get(), 0);
        assert_eq!(s.total(Kind::Handshake), 0);
    }

    #[test]
    fn the_same_labels_give_the_same_tenant_while_it_lives() {
        let s = Shares::unregistered(NAMING);
        let a = s.tenant(&["gw", "a"]);
        let _h = a.try_take(Kind::Established, 5).expect("room");
        let again = s.tenant(&["gw", "a"]);
        assert!(Arc::ptr_eq(&a, &again), "a rebuilt route keeps its counts");
        assert_eq!(again.held(Kind::Established), 1);
        assert!(!Arc::ptr_eq(&a, &s.tenant(&["other", "a"])), "another listener's route of that name");
        drop((a, again, _h));
        assert_eq!(s.tenant(&["gw", "a"]).held(Kind::Established), 0, "a new one once the old is gone");
        // Dead entries are forgotten as the map grows.
        for i in 0..200 {
            drop(s.tenant(&["gw", &i.to_string()]));
        }
        assert!(s.lock().len() < 200, "{}", s.lock().len());
    }
}
