//! The pre-routing budget: connections accepted but not yet routed, capped per source, oldest evicted when full.
//!
//! A connection is *pending* from accept until its route is known (PROXY header, ClientHello or
//! request head read). Pending connections have a budget of their own, apart from established
//! (routed) ones, so clients that open connections and stall cannot hold the slots a real client
//! needs:
//!
//! - **Per-source share, tightening under pressure**: a source key is the TCP peer address masked
//!   to `/prefix_v4` or `/prefix_v6` (IPv4-mapped IPv6 counts as IPv4); the TCP peer, never an
//!   address from a PROXY header: that header is itself pending input. With `P` pending when a
//!   connection comes out of a budget of `B` and a configured `per_source` of `S`, one source may
//!   hold `H = max(S, B/2)` while `P <= B/2`, and `max(S, H - (H - S) * (2P/B - 1))` above,
//!   reaching `S` when the budget is full. A connection over its source's share is refused at
//!   once. So a burst from one address (a node pool behind one NAT reconnecting) is served while
//!   the budget has room, and a source that stalls connections holds at most `S` of a full one.
//! - **Oldest evicted**: when the budget is full, the oldest pending connection is cancelled
//!   (its [`Admitted::evicted`] fires) and the new one takes its place, so a full budget costs
//!   the stalled client, not the next one.
//! - **A tenant's oldest first** (connections admitted for a known tenant, see [`TenantShare`]):
//!   a tenant may hold its share `S` of the budget, or more while the others leave room: with
//!   `O` pending for everyone else, at most `max(S, B - O)` (an explicit cap is a hard one). A
//!   connection of a tenant at that cap evicts the tenant's own oldest pending connection, never
//!   another tenant's: one tenant's stalled clients can fill a budget nobody else wants, and make
//!   way as soon as others come, without costing them.
//! - **Deadline shrinks under pressure**: with `P` pending when a connection comes (the new one
//!   not counted, those it evicts counted) out of a budget of `B`, base deadline `D` and floor
//!   `F`, a new connection gets `D` while `P <= B/2`, and `max(F, D - (D - F) * (2P/B - 1))`
//!   above, reaching `F` when the budget is full. (When `F >= D` the deadline is always `D`.)
//!
//! [`Budget`] is the bookkeeping without I/O or clock; [`Pending`] puts it behind a lock, gives
//! every entry a cancellation token and counts what happens in metrics.

use crate::net::share::Cap;
use crate::sync::Mutex;
use prometheus::{IntCounterVec, IntGauge, Registry};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The settings of a pending budget, as a binary's config gives them (`limits` and `timeouts`
/// keys); a reload may replace them, and they apply to new admissions.
pub use seedgate_config::PendingBudget;

/// The budget's rules, from its settings: what a source may hold and how long a newcomer may
/// stay pending under the pressure of the moment.
pub trait BudgetRules {
    /// The most pending connections one source key may hold when `pending` connections are
    /// pending in all (see the module documentation for the formula); `usize::MAX` with no
    /// per-source cap.
    fn per_source_at(&self, pending: usize) -> usize;
    /// The deadline of a connection admitted while `pending` others are pending (see the
    /// module documentation for the formula).
    fn deadline_at(&self, pending: usize) -> Duration;
    /// The source key of `ip`: the address with the bits past the prefix cleared.
    fn source_key(&self, ip: IpAddr) -> SourceKey;
}

impl BudgetRules for PendingBudget {
    fn per_source_at(&self, pending: usize) -> usize {
        crate::net::share::share_at(self.per_source, self.max_pending, pending)
    }

    fn deadline_at(&self, pending: usize) -> Duration {
        let (d, f) = (self.deadline, self.deadline_floor);
        let b = self.max_pending.max(1) as f64;
        let p = pending as f64;
        if f >= d || p <= b / 2.0 {
            return d;
        }
        let frac = (2.0 * p / b - 1.0).min(1.0);
        (d - (d - f).mul_f64(frac)).max(f)
    }

    fn source_key(&self, ip: IpAddr) -> SourceKey {
        match ip {
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => SourceKey::V4(mask32(u32::from(v4), self.prefix_v4)),
                None => SourceKey::V6(mask128(u128::from(v6), self.prefix_v6)),
            },
            IpAddr::V4(v4) => SourceKey::V4(mask32(u32::from(v4), self.prefix_v4)),
        }
    }
}

fn mask32(a: u32, prefix: u8) -> u32 {
    match prefix.min(32) {
        0 => 0,
        p => a & (u32::MAX << (32 - p)),
    }
}

fn mask128(a: u128, prefix: u8) -> u128 {
    match prefix.min(128) {
        0 => 0,
        p => a & (u128::MAX << (128 - p)),
    }
}

/// A source address masked to its prefix: the per-source cap counts by this.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SourceKey {
    V4(u32),
    V6(u128),
}

impl SourceKey {
    pub fn ip(self) -> IpAddr {
        match self {
            SourceKey::V4(a) => IpAddr::V4(a.into()),
            SourceKey::V6(a) => IpAddr::V6(a.into()),
        }
    }
}

/// The budget's verdict on a connection it does not admit: its source already holds its share
/// of the budget (the admission refuses it as [`PerSource`](super::admission::Refusal::PerSource)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("too many pending connections from {0:?}")]
pub struct SourceAtCap(pub SourceKey);

/// Identifies one admitted entry (admission order: a smaller id is older).
pub type EntryId = u64;

struct Entry<T> {
    /// `None` when the entry is exempt from the per-source cap (not counted there).
    key: Option<SourceKey>,
    /// The tenant the entry was admitted for, if known.
    tenant: Option<Arc<str>>,
    handle: T,
}

/// The tenant a connection is admitted for (a cluster, when its front end names one) and the
/// tenant's cap: `Cap::Share { share, .. }` holds `share` of a full budget, more while the
/// others leave room; `Cap::Fixed(n)` at most `n`.
#[derive(Debug, Clone)]
pub struct TenantShare {
    pub name: Arc<str>,
    pub cap: Cap,
}

/// The bookkeeping of a pending budget, without I/O: entries in admission order, counts per
/// source. `T` is what the caller needs to end an evicted entry (a cancellation token).
pub struct Budget<T> {
    limits: PendingBudget,
    next: EntryId,
    /// By admission order, so the oldest is the first.
    entries: BTreeMap<EntryId, Entry<T>>,
    /// Only sources with at least one entry (bounded by `max_pending`).
    per_source: HashMap<SourceKey, usize>,
    /// Each tenant's entries, oldest first (only tenants with at least one).
    tenants: HashMap<Arc<str>, BTreeSet<EntryId>>,
}

/// A successful admission.
#[derive(Debug)]
pub struct Admission<T> {
    pub id: EntryId,
    /// How long the new entry may stay pending.
    pub deadline: Duration,
    /// Handles of the entries evicted to make room, oldest first (more than one only after
    /// `max_pending` shrank).
    pub evicted: Vec<T>,
    /// How many of them were the tenant's own (it was at its cap).
    pub own_evicted: usize,
}

impl<T> Budget<T> {
    pub fn new(limits: PendingBudget) -> Self {
        Self { limits, next: 0, entries: BTreeMap::new(), per_source: HashMap::new(), tenants: HashMap::new() }
    }

    pub fn limits(&self) -> &PendingBudget {
        &self.limits
    }

    /// New limits; they apply from the next admission (nothing is evicted now).
    pub fn set_limits(&mut self, limits: PendingBudget) {
        self.limits = limits;
    }

    /// Entries pending now.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Pending entries counted for the source of `ip`.
    #[cfg(test)]
    fn held_by_source(&self, ip: IpAddr) -> usize {
        self.per_source.get(&self.limits.source_key(ip)).copied().unwrap_or(0)
    }

    /// Admit a connection from `ip`. `exempt`: not subject to the per-source cap (e.g. a
    /// trusted load balancer whose address all its clients share); it still takes a place in
    /// the budget and can be evicted.
    pub fn admit(&mut self, ip: IpAddr, exempt: bool, handle: T) -> Result<Admission<T>, SourceAtCap> {
        self.admit_as(ip, exempt, None, handle)
    }

    /// Pending entries of tenant `name`.
    pub fn of_tenant(&self, name: &str) -> usize {
        self.tenants.get(name).map_or(0, BTreeSet::len)
    }

    /// [`Budget::admit`] for `tenant`: when the tenant is at its cap, its own oldest entries make
    /// room (see the module documentation).
    pub fn admit_as(
        &mut self,
        ip: IpAddr,
        exempt: bool,
        tenant: Option<&TenantShare>,
        handle: T,
    ) -> Result<Admission<T>, SourceAtCap> {
        let key = (!exempt).then(|| self.limits.source_key(ip));
        if let Some(k) = key
            && self.per_source.get(&k).copied().unwrap_or(0) >= self.limits.per_source_at(self.entries.len())
        {
            return Err(SourceAtCap(k));
        }
        let max = self.limits.max_pending.max(1);
        // The pressure the new entry meets is what was pending when it came (evictions make
        // room for it, not less pressure): a full budget gives the floor.
        let deadline = self.limits.deadline_at(self.entries.len());
        let mut evicted = self.evict_own(tenant);
        let own_evicted = evicted.len();
        // Bounded: each turn removes an entry.
        while self.entries.len() >= max {
            let Some(&id) = self.entries.keys().next() else { break };
            evicted.extend(self.release(id));
        }
        let id = self.next;
        self.next += 1;
        if let Some(k) = key {
            *self.per_source.entry(k).or_insert(0) += 1;
        }
        let tenant = tenant.map(|t| t.name.clone());
        if let Some(t) = &tenant {
            self.tenants.entry(t.clone()).or_default().insert(id);
        }
        self.entries.insert(id, Entry { key, tenant, handle });
        Ok(Admission { id, deadline, evicted, own_evicted })
    }

    /// Make room for one more entry of `tenant` among its own: its oldest entries while it holds
    /// its cap (the cap is at least 1, so this ends).
    fn evict_own(&mut self, tenant: Option<&TenantShare>) -> Vec<T> {
        let Some(t) = tenant else { return Vec::new() };
        let own = self.of_tenant(&t.name);
        let others = self.entries.len() - own;
        let cap = match t.cap {
            Cap::Fixed(n) => n,
            Cap::Share { share, .. } => share.max(self.limits.max_pending.saturating_sub(others)),
        }
        .max(1);
        let mut evicted = Vec::new();
        // Bounded: each turn removes one of the tenant's entries.
        for _ in cap..=own {
            let Some(id) = self.tenants.get(&t.name).and_then(|ids| ids.first().copied()) else { break };
            evicted.extend(self.release(id));
        }
        evicted
    }

    /// The entry left the pending phase (routed, refused or closed). `None` if it was evicted
    /// before (or never admitted).
    pub fn release(&mut self, id: EntryId) -> Option<T> {
        let e = self.entries.remove(&id)?;
        if let Some(k) = e.key
            && let Some(n) = self.per_source.get_mut(&k)
        {
            *n -= 1;
            if *n == 0 {
                self.per_source.remove(&k);
            }
        }
        if let Some(t) = &e.tenant
            && let Some(ids) = self.tenants.get_mut(t)
        {
            ids.remove(&id);
            if ids.is_empty() {
                self.tenants.remove(t);
            }
        }
        Some(e.handle)
    }
}

/// Why the budget ended a pending connection (refused at accept, evicted, or past its
/// deadline), as `seedgate_pending_rejects_total{reason}` says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Its source already held its share of the budget (`per_source` when full, more below).
    PerSource,
    /// The budget was full and it was the oldest.
    Evicted,
    /// It did not finish the pre-routing phase within its deadline.
    Deadline,
}

impl Ended {
    pub fn label(self) -> &'static str {
        match self {
            Ended::PerSource => "per_source",
            Ended::Evicted => "evicted",
            Ended::Deadline => "deadline",
        }
    }
}

/// `seedgate_pending_connections` and `seedgate_pending_rejects_total{reason}`.
#[derive(Clone)]
pub struct PendingMetrics {
    pub pending: IntGauge,
    pub rejects: IntCounterVec,
}

impl PendingMetrics {
    pub fn new(reg: &Registry) -> Self {
        let rejects = crate::obs::metrics::counter_vec(
            reg,
            "seedgate_pending_rejects_total",
            "Connections ended in the pre-routing phase by its budget, by reason (per_source, evicted, deadline).",
            &["reason"],
        );
        // Every reason is exported from the start, so a rate() has a series before the first hit.
        for r in [Ended::PerSource, Ended::Evicted, Ended::Deadline] {
            rejects.with_label_values(&[r.label()]);
        }
        Self {
            pending: crate::obs::metrics::gauge(
                reg,
                "seedgate_pending_connections",
                "Connections accepted and not yet routed (PROXY header, ClientHello or request head still being read).",
            ),
            rejects,
        }
    }

    /// Metrics not registered anywhere (tests).
    #[cfg(any(test, feature = "test-util"))]
    pub fn unregistered() -> Self {
        Self::new(&Registry::new())
    }
}

/// A pending budget shared by the connection tasks of a process.
pub struct Pending {
    budget: Mutex<Budget<CancellationToken>>,
    metrics: PendingMetrics,
}

/// A connection in the pending phase. Dropping it (or [`Admitted::release`]) leaves the phase.
pub struct Admitted {
    pending: Arc<Pending>,
    id: EntryId,
    token: CancellationToken,
    deadline: Duration,
    since: Instant,
    own_evicted: usize,
    /// Left the budget already (routed, or its deadline missed): dropping it takes no lock.
    left: std::sync::atomic::AtomicBool,
}

impl Admitted {
    /// How many pending connections of its own tenant were evicted to make room for it.
    pub fn own_evicted(&self) -> usize {
        self.own_evicted
    }

    /// How long this connection may take to be routed.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// What is left of the deadline now.
    pub fn remaining(&self) -> Duration {
        self.deadline.saturating_sub(self.since.elapsed())
    }

    /// Completes when the connection was evicted to make room for a newer one.
    pub async fn evicted(&self) {
        self.token.cancelled().await
    }

    /// The connection missed its deadline (the caller enforces it, with [`Admitted::deadline`]):
    /// it leaves the budget and the miss is counted. `false` when a newer connection evicted it
    /// first: it was counted as evicted then, and must be refused as evicted. Leaving and counting
    /// happen under the budget's lock, so each connection is counted once, whatever races it.
    pub fn deadline_missed(&self) -> bool {
        if self.left.swap(true, std::sync::atomic::Ordering::Relaxed) {
            return false;
        }
        let still = self.pending.release(self.id);
        if still {
            self.pending.metrics.rejects.with_label_values(&[Ended::Deadline.label()]).inc();
        }
        still
    }

    /// Leave the pending phase: the connection was routed. `false` when it was evicted (and
    /// counted as such) meanwhile; the caller then refuses it as evicted, so what the metrics
    /// say happened is what happened.
    pub fn release(self) -> bool {
        !self.left.swap(true, std::sync::atomic::Ordering::Relaxed) && self.pending.release(self.id)
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        if !*self.left.get_mut() {
            self.pending.release(self.id);
        }
    }
}

impl Pending {
    pub fn new(limits: PendingBudget, metrics: PendingMetrics) -> Arc<Self> {
        Arc::new(Self { budget: Mutex::new(Budget::new(limits)), metrics })
    }

    pub fn set_limits(&self, limits: PendingBudget) {
        self.lock().set_limits(limits);
    }

    pub fn limits(&self) -> PendingBudget {
        *self.lock().limits()
    }

    /// Pending connections now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Counts by reason so far (per_source, evicted, deadline), for readiness details.
    pub fn rejects(&self) -> [(Ended, u64); 3] {
        [Ended::PerSource, Ended::Evicted, Ended::Deadline]
            .map(|r| (r, self.metrics.rejects.with_label_values(&[r.label()]).get()))
    }

    /// The `/readyz?verbose` line, information only: a full budget is what eviction is for, and
    /// the counts tell whether someone holds connections open without routing them.
    pub fn readiness(&self) -> crate::obs::admin::Check {
        let l = self.limits();
        let counts = self.rejects().map(|(r, n)| format!("{} {n}", r.label())).join(", ");
        let pending = self.len();
        let per_source = match l.per_source {
            0 => "no per-source cap".to_owned(),
            n => format!(
                "at most {} per source /{} or /{} now, {n} when full",
                l.per_source_at(pending),
                l.prefix_v4,
                l.prefix_v6
            ),
        };
        crate::obs::admin::Check::info(
            "pending-connections",
            format!("{pending}/{} not yet routed ({per_source}); closed so far: {counts}", l.max_pending),
        )
    }

    fn lock(&self) -> crate::sync::MutexGuard<'_, Budget<CancellationToken>> {
        self.budget.lock()
    }

    /// Admit a connection whose TCP peer is `ip` (see [`Budget::admit`]); evicted entries are
    /// cancelled and counted here.
    pub fn admit(self: &Arc<Self>, ip: IpAddr, exempt: bool) -> Result<Admitted, SourceAtCap> {
        self.admit_as(ip, exempt, None)
    }

    /// Admit a connection of `tenant` (see [`Budget::admit_as`]); [`Admitted::own_evicted`]
    /// says how many of the tenant's own connections made room for it.
    pub fn admit_as(
        self: &Arc<Self>,
        ip: IpAddr,
        exempt: bool,
        tenant: Option<&TenantShare>,
    ) -> Result<Admitted, SourceAtCap> {
        let token = CancellationToken::new();
        let adm = {
            let mut b = self.lock();
            let r = b.admit_as(ip, exempt, tenant, token.clone());
            // Under the lock, so concurrent admissions and releases cannot leave it stale.
            self.metrics.pending.set(b.len() as i64);
            r
        };
        match adm {
            Ok(a) => {
                if !a.evicted.is_empty() {
                    self.metrics.rejects.with_label_values(&[Ended::Evicted.label()]).inc_by(a.evicted.len() as u64);
                }
                for t in a.evicted {
                    t.cancel();
                }
                Ok(Admitted {
                    pending: self.clone(),
                    id: a.id,
                    token,
                    deadline: a.deadline,
                    since: Instant::now(),
                    own_evicted: a.own_evicted,
                    left: std::sync::atomic::AtomicBool::new(false),
                })
            }
            Err(e) => {
                self.metrics.rejects.with_label_values(&[Ended::PerSource.label()]).inc();
                Err(e)
            }
        }
    }

    /// `true` when `id` was still pending (not evicted, not released before).
    fn release(&self, id: EntryId) -> bool {
        let mut b = self.lock();
        let was = b.release(id).is_some();
        self.metrics.pending.set(b.len() as i64);
        was
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max: usize, per_source: usize) -> PendingBudget {
        PendingBudget {
            max_pending: max,
            per_source,
            prefix_v4: 32,
            prefix_v6: 64,
            deadline: Duration::from_secs(5),
            deadline_floor: Duration::from_millis(500),
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn per_source_cap_counts_pending_only() {
        // A budget of 4 with 2 per source: half the budget is the configured share, so it
        // applies at every pressure.
        let mut b = Budget::new(limits(4, 2));
        let a1 = b.admit(ip("10.0.0.1"), false, 1).expect("first");
        b.admit(ip("10.0.0.1"), false, 2).expect("second");
        assert!(matches!(b.admit(ip("10.0.0.1"), false, 3), Err(SourceAtCap(_))));
        // Another source is not affected; an exempt connection is not counted.
        b.admit(ip("10.0.0.2"), false, 4).expect("other source");
        b.admit(ip("10.0.0.1"), true, 5).expect("exempt");
        assert_eq!(b.held_by_source(ip("10.0.0.1")), 2);
        // Routed: its place is free again.
        assert_eq!(b.release(a1.id), Some(1));
        assert_eq!(b.release(a1.id), None, "released once");
        b.admit(ip("10.0.0.1"), false, 6).expect("after release");
        // 0 = no cap.
        let mut b = Budget::new(limits(100, 0));
        for i in 0..50 {
            b.admit(ip("10.0.0.1"), false, i).expect("no cap");
        }
    }

    #[test]
    fn full_budget_evicts_the_oldest_in_order() {
        let mut b = Budget::new(limits(3, 0));
        let ids: Vec<_> = (0..3).map(|i| b.admit(ip("10.0.0.1"), false, i).expect("room").id).collect();
        let a = b.admit(ip("10.0.0.2"), false, 10).expect("evicts");
        assert_eq!(a.evicted, vec![0]);
        // Releasing the second makes room: nothing evicted.
        b.release(ids[1]);
        assert!(b.admit(ip("10.0.0.3"), false, 11).expect("room").evicted.is_empty());
        assert_eq!(b.admit(ip("10.0.0.3"), false, 12).expect("evicts").evicted, vec![2]);
        assert_eq!(b.admit(ip("10.0.0.3"), false, 13).expect("evicts").evicted, vec![10]);
        assert_eq!(b.len(), 3);
        // The evicted entry's source count went down with it.
        assert_eq!(b.held_by_source(ip("10.0.0.1")), 0);
        // A budget shrunk by a reload evicts down to the new size on the next admission.
        b.set_limits(limits(1, 0));
        assert_eq!(b.admit(ip("10.0.0.4"), false, 14).expect("evicts").evicted, vec![11, 12, 13]);
        assert_eq!(b.len(), 1);
    }

    /// A tenant alone may fill the budget; once another tenant holds some of it, the first
    /// tenant's newcomers evict its own oldest, never the other's.
    #[test]
    fn a_tenant_at_its_cap_evicts_its_own_oldest_never_another_tenants() {
        let share = |name: &str| TenantShare { name: name.into(), cap: Cap::Share { share: 2, budget: 10 } };
        let (a, other) = (share("a"), share("b"));
        let mut b = Budget::new(limits(10, 0));
        for i in 0..10 {
            assert!(b.admit_as(ip("10.0.0.1"), false, Some(&a), i).expect("room").evicted.is_empty());
        }
        let x = b.admit_as(ip("10.0.0.1"), false, Some(&a), 10).expect("full: its own oldest goes");
        assert_eq!((x.evicted, x.own_evicted), (vec![0], 1));
        // Another tenant, below its share, finds the budget full: the oldest (a's) makes room.
        let y = b.admit_as(ip("10.0.0.2"), false, Some(&other), 11).expect("room made");
        assert_eq!((y.evicted, y.own_evicted), (vec![1], 0));
        // a holds 9 beside 1 of b: its cap is now 10 - 1; its newcomer evicts its own oldest.
        let z = b.admit_as(ip("10.0.0.1"), false, Some(&a), 12).expect("its own oldest goes");
        assert_eq!((z.evicted, z.own_evicted), (vec![2], 1));
        assert_eq!((b.of_tenant("a"), b.of_tenant("b"), b.len()), (9, 1, 10));
        // A connection of no known tenant is counted among the others.
        let n = b.admit(ip("10.0.0.3"), false, 13).expect("the oldest goes");
        assert_eq!((n.evicted, n.own_evicted), (vec![3], 0));
        // An explicit cap is hard, whatever room there is; released entries leave the count.
        let f = TenantShare { name: "f".into(), cap: Cap::Fixed(1) };
        let mut c = Budget::new(limits(10, 0));
        c.admit_as(ip("10.0.0.1"), false, Some(&f), 0).expect("room");
        let w = c.admit_as(ip("10.0.0.1"), false, Some(&f), 1).expect("its own oldest goes");
        assert_eq!((w.evicted, w.own_evicted), (vec![0], 1));
        c.release(w.id);
        assert_eq!((c.of_tenant("f"), c.len()), (0, 0));
    }

    #[test]
    fn per_source_refusal_evicts_nothing() {
        let mut b = Budget::new(limits(2, 1));
        b.admit(ip("10.0.0.1"), false, 1).expect("room");
        b.admit(ip("10.0.0.2"), false, 2).expect("room");
        assert!(b.admit(ip("10.0.0.1"), false, 3).is_err());
        assert_eq!(b.len(), 2);
    }

    #[test]
    fn deadline_shrinks_linearly_above_half() {
        let l = limits(100, 0);
        let ms = |p| l.deadline_at(p).as_millis();
        assert_eq!(ms(0), 5000);
        assert_eq!(ms(50), 5000, "no pressure up to half the budget");
        assert_eq!(ms(75), 2750, "halfway between half and full: halfway between D and F");
        assert_eq!(ms(100), 500);
        assert_eq!(ms(1000), 500, "never below the floor");
        let mut prev = u128::MAX;
        for p in 0..=100 {
            assert!(ms(p) <= prev, "monotone");
            prev = ms(p);
        }
        // A floor at or above the base: no shrinking.
        let flat = PendingBudget { deadline_floor: Duration::from_secs(9), ..l };
        assert_eq!(flat.deadline_at(100), Duration::from_secs(5));
        // Admission gives the deadline for the pressure the new entry meets.
        let mut b = Budget::new(limits(4, 0));
        let d: Vec<_> = (0..4).map(|i| b.admit(ip("10.0.0.1"), false, i).expect("room").deadline.as_millis()).collect();
        assert_eq!(d, vec![5000, 5000, 5000, 2750]);
        assert_eq!(b.admit(ip("10.0.0.1"), false, 9).expect("evicts").deadline.as_millis(), 500, "full: the floor");
    }

    #[test]
    fn per_source_share_tightens_as_the_budget_fills() {
        let l = limits(100, 10);
        // Half the budget while at most half full, then linearly down to `per_source` when full.
        assert_eq!(l.per_source_at(0), 50);
        assert_eq!(l.per_source_at(50), 50, "no pressure up to half the budget");
        assert_eq!(l.per_source_at(51), 50, "rounded up: never below the line");
        assert_eq!(l.per_source_at(75), 30, "halfway between half and full: halfway between B/2 and S");
        assert_eq!(l.per_source_at(99), 11);
        assert_eq!(l.per_source_at(100), 10);
        assert_eq!(l.per_source_at(5000), 10, "never below per_source");
        let mut prev = usize::MAX;
        for p in 0..=120 {
            assert!(l.per_source_at(p) <= prev, "monotone");
            prev = l.per_source_at(p);
        }
        // A configured share of half the budget or more does not change; 0 is no cap.
        assert_eq!(limits(10, 8).per_source_at(0), 8);
        assert_eq!(limits(10, 8).per_source_at(10), 8);
        assert_eq!(limits(10, 5).per_source_at(10), 5);
        assert_eq!(limits(10, 0).per_source_at(10), usize::MAX);
    }

    /// 200 connections at once from one address (a node pool behind one NAT reconnecting) meet an
    /// empty default budget: all are admitted. A stalling source meeting a full budget gets
    /// exactly `per_source` places.
    #[test]
    fn a_burst_is_served_while_the_budget_has_room_a_full_budget_caps_each_source() {
        let mut b = Budget::new(limits(2000, 64));
        for i in 0..200 {
            b.admit(ip("192.0.2.1"), false, i).expect("a burst into an empty budget");
        }
        // Up to half the budget from one source, then the share shrinks below what it holds.
        for i in 200..1000 {
            b.admit(ip("192.0.2.1"), false, i).expect("up to half the budget");
        }
        assert!(matches!(b.admit(ip("192.0.2.1"), false, 0), Err(SourceAtCap(_))), "half the budget");
        // Other sources fill it; the first source's oldest entries are evicted for them.
        for i in 0..1000 {
            let other = IpAddr::V4(std::net::Ipv4Addr::from(0xc633_6400 + i));
            b.admit(other, false, i as usize).expect("other sources");
        }
        assert_eq!(b.len(), 2000);
        for i in 0..64 {
            b.admit(ip("203.0.113.1"), false, i).expect("its share of a full budget");
        }
        assert!(matches!(b.admit(ip("203.0.113.1"), false, 64), Err(SourceAtCap(_))), "64 when full");
        assert_eq!(b.held_by_source(ip("203.0.113.1")), 64);
        assert_eq!(b.held_by_source(ip("192.0.2.1")), 1000 - 64, "the oldest were evicted for the newest");
    }

    #[test]
    fn prefix_masking_v4_and_v6() {
        let l = PendingBudget { prefix_v4: 24, prefix_v6: 64, ..limits(2, 1) };
        assert_eq!(l.source_key(ip("192.0.2.77")).ip(), ip("192.0.2.0"));
        assert_eq!(l.source_key(ip("::ffff:192.0.2.77")), l.source_key(ip("192.0.2.1")), "mapped = v4");
        assert_eq!(l.source_key(ip("2001:db8:1:2:aaaa::1")).ip(), ip("2001:db8:1:2::"));
        assert_ne!(l.source_key(ip("2001:db8:1:3::1")), l.source_key(ip("2001:db8:1:2::1")));
        let full = PendingBudget { prefix_v4: 32, prefix_v6: 128, ..l };
        assert_eq!(full.source_key(ip("192.0.2.77")).ip(), ip("192.0.2.77"));
        assert_eq!(full.source_key(ip("2001:db8::7")).ip(), ip("2001:db8::7"));
        let none = PendingBudget { prefix_v4: 0, prefix_v6: 0, ..l };
        assert_eq!(none.source_key(ip("192.0.2.77")).ip(), ip("0.0.0.0"));
        assert_eq!(none.source_key(ip("2001:db8::7")).ip(), ip("::"));
        // Same /24: one shares the other's cap.
        let mut b = Budget::new(l);
        b.admit(ip("192.0.2.1"), false, 1).expect("first");
        assert!(b.admit(ip("192.0.2.200"), false, 2).is_err(), "same /24");
        b.admit(ip("192.0.3.1"), false, 3).expect("other /24");
        b.admit(ip("2001:db8:1:2::1"), false, 4).expect("v6");
        assert!(b.admit(ip("2001:db8:1:2:ffff::1"), false, 5).is_err(), "same /64");
    }

    #[tokio::test]
    async fn eviction_cancels_the_oldest_and_counts() {
        let p = Pending::new(limits(2, 0), PendingMetrics::unregistered());
        let a = p.admit(ip("10.0.0.1"), false).expect("room");
        let b = p.admit(ip("10.0.0.1"), false).expect("room");
        assert_eq!(p.len(), 2);
        let c = p.admit(ip("10.0.0.2"), false).expect("evicts a");
        // `a` was evicted: its token fired, its place is `c`'s.
        tokio::time::timeout(Duration::from_secs(5), a.evicted()).await.expect("a evicted");
        assert!(!b.token.is_cancelled() && !c.token.is_cancelled());
        assert_eq!(p.len(), 2);
        drop(a);
        assert_eq!(p.len(), 2, "dropping an evicted entry changes nothing");
        assert!(b.release(), "b was still pending");
        assert_eq!(p.len(), 1);
        assert_eq!(p.metrics.pending.get(), 1);
        let counts = p.rejects();
        assert_eq!(counts[1], (Ended::Evicted, 1));
        assert!(c.deadline_missed(), "c was still pending");
        assert_eq!(p.rejects()[2], (Ended::Deadline, 1));
    }

    /// A connection evicted while it was missing its deadline, or while it was being routed, is
    /// counted once, as evicted, and told so.
    #[tokio::test]
    async fn an_evicted_connection_is_counted_once() {
        let p = Pending::new(limits(1, 0), PendingMetrics::unregistered());
        let a = p.admit(ip("10.0.0.1"), false).expect("room");
        let b = p.admit(ip("10.0.0.2"), false).expect("evicts a");
        assert!(!a.deadline_missed(), "a was evicted before its deadline was noticed");
        assert_eq!(p.rejects().map(|(_, n)| n), [0, 1, 0], "per_source, evicted, deadline");
        let c = p.admit(ip("10.0.0.3"), false).expect("evicts b");
        assert!(!b.release(), "b was evicted while it was being routed");
        assert_eq!(p.rejects().map(|(_, n)| n), [0, 2, 0]);
        assert!(c.deadline_missed());
        assert!(!c.deadline_missed(), "a second call counts nothing");
        assert_eq!(p.rejects().map(|(_, n)| n), [0, 2, 1]);
        assert_eq!(p.len(), 0);
    }
}
