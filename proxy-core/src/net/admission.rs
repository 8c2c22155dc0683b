//! Admitting a connection through its pre-routing phase: the one helper every front end and listener runs that phase under, and the typed refusal it ends with.
//!
//! A connection comes out of the pending budget ([`Pending::admit_as`]) as an [`Admitted`]. Each
//! pre-routing step (TLS handshake, PROXY header, ClientHello, request head, HTTP/2 preface)
//! runs under [`Admitted::within`], which ends it when a newer connection evicts this one or its
//! deadline passes. Once routed, [`Admitted::establish`] moves it to an established slot (waiting,
//! still evictable, for what is left of its deadline at the connection limit). Every way this
//! fails is a [`Refusal`], whose metric label and answer (HTTP status, TLS alert, or none) are
//! said here once; what a caller learns is always what the pending metrics counted.
//!
//! [`Pending::admit_as`]: super::pending::Pending::admit_as

use super::accept::{ConnLimit, ConnPermit};
use super::pending::{self, Admitted};
use std::future::Future;

/// Why the pre-routing phase turned a connection away.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Its source already held its share of the pending budget (refused at accept).
    #[error("too many pending connections from this source")]
    PerSource,
    /// The budget was full and a newer connection took its place.
    #[error("evicted from the full pending budget by a newer connection")]
    Evicted,
    /// It did not finish its pre-routing phase within its deadline.
    #[error("the pre-routing phase did not finish within its deadline")]
    HandshakeTimeout,
    /// Routed, but no established slot came free within what was left of its deadline.
    #[error("over capacity: connection limit reached")]
    ConnectionLimit,
}

impl Refusal {
    /// Every refusal.
    pub const ALL: [Refusal; 4] = [Self::PerSource, Self::Evicted, Self::HandshakeTimeout, Self::ConnectionLimit];

    /// The reason label (`seedgate_rejects_total{reason}`, the access event's `reason`).
    pub fn label(self) -> &'static str {
        match self {
            Refusal::PerSource => "pending_per_source",
            Refusal::Evicted => "pending_evicted",
            Refusal::HandshakeTimeout => "handshake_timeout",
            Refusal::ConnectionLimit => "connection_limit",
        }
    }

    /// The status an HTTP client is answered with; `None`: it is closed without an answer
    /// (the budget's verdicts: a client that stalled would not read one).
    pub fn http_status(self) -> Option<u16> {
        match self {
            Refusal::ConnectionLimit => Some(503),
            Refusal::PerSource | Refusal::Evicted | Refusal::HandshakeTimeout => None,
        }
    }

    /// The alert a TLS client is answered with; `None`: closed without one.
    pub fn tls_alert(self) -> Option<u8> {
        match self {
            Refusal::ConnectionLimit => Some(proxy_wire::client_hello::ALERT_INTERNAL_ERROR),
            Refusal::PerSource | Refusal::Evicted | Refusal::HandshakeTimeout => None,
        }
    }

    /// Closed at once, without waiting for the client to read an answer: freeing the budget's
    /// place is the point.
    pub fn aborts(self) -> bool {
        matches!(self, Refusal::PerSource | Refusal::Evicted)
    }
}

impl From<pending::SourceAtCap> for Refusal {
    fn from(_: pending::SourceAtCap) -> Self {
        Refusal::PerSource
    }
}

impl Admitted {
    /// Run one pre-routing step under this connection's admission: its output, or the refusal
    /// when a newer connection evicts it first or what is left of its deadline passes (a miss
    /// counted as such, or as the eviction that came first).
    pub async fn within<F: Future>(&self, step: F) -> Result<F::Output, Refusal> {
        tokio::select! {
            biased;
            _ = self.evicted() => Err(Refusal::Evicted),
            r = tokio::time::timeout(self.remaining(), step) => r.map_err(|_| self.missed()),
        }
    }

    /// The deadline passed: a miss, unless a newer connection evicted it first.
    fn missed(&self) -> Refusal {
        if self.deadline_missed() { Refusal::HandshakeTimeout } else { Refusal::Evicted }
    }

    /// Routed: from the pending budget to an established slot of `limit`. At the limit it waits
    /// (still pending, so still evictable) for what is left of its deadline.
    pub async fn establish(self, limit: &ConnLimit) -> Result<ConnPermit, Refusal> {
        let permit = match limit.try_acquire() {
            Some(p) => p,
            None => tokio::select! {
                biased;
                _ = self.evicted() => Err(Refusal::Evicted),
                p = tokio::time::timeout(self.remaining(), limit.acquire()) => p.map_err(|_| Refusal::ConnectionLimit),
            }?,
        };
        self.leave()?;
        Ok(permit)
    }

    /// Leave the pending phase (routed, with no slot of its own to take here). `Evicted` when a
    /// newer connection evicted it meanwhile: it was counted so, and is refused as counted.
    pub fn leave(self) -> Result<(), Refusal> {
        if self.release() { Ok(()) } else { Err(Refusal::Evicted) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::accept::Slots;
    use crate::net::pending::{Pending, PendingBudget, PendingMetrics};
    use std::time::Duration;

    fn pending(max: usize) -> std::sync::Arc<Pending> {
        let limits = PendingBudget {
            max_pending: max,
            per_source: 1,
            prefix_v4: 32,
            prefix_v6: 64,
            deadline: Duration::from_secs(5),
            deadline_floor: Duration::from_secs(5),
        };
        Pending::new(limits, PendingMetrics::unregistered())
    }

    fn ip(last: u8) -> std::net::IpAddr {
        std::net::IpAddr::from([10, 0, 0, last])
    }

    /// Each verdict of the pending phase comes out as the refusal the metrics counted.
    #[tokio::test(start_paused = true)]
    async fn a_step_ends_as_evicted_timed_out_or_done() {
        let p = pending(2);
        let first = p.admit(ip(1), false).expect("room");
        assert_eq!(p.admit(ip(1), false).err().map(Refusal::from), Some(Refusal::PerSource));
        drop(first);
        let a = p.admit(ip(2), false).expect("room");
        let _full = p.admit(ip(4), false).expect("room");
        assert_eq!(a.within(async { 7 }).await, Ok(7));
        let evicting = a.within(std::future::pending::<()>());
        let newer = async {
            tokio::task::yield_now().await;
            p.admit(ip(3), false).expect("evicts the older one")
        };
        let (r, b) = tokio::join!(evicting, newer);
        assert_eq!(r, Err(Refusal::Evicted));
        assert_eq!(a.leave(), Err(Refusal::Evicted), "an evicted connection leaves as evicted");
        assert_eq!(b.within(std::future::pending::<()>()).await, Err(Refusal::HandshakeTimeout));
        assert_eq!(p.rejects().map(|(_, n)| n), [1, 1, 1], "per_source, evicted, deadline: once each");
        let answer = |r: Refusal| (r.label(), r.http_status(), r.tls_alert(), r.aborts());
        assert_eq!(answer(Refusal::Evicted), ("pending_evicted", None, None, true));
        assert_eq!(answer(Refusal::HandshakeTimeout), ("handshake_timeout", None, None, false));
        assert_eq!(answer(Refusal::ConnectionLimit), ("connection_limit", Some(503), Some(80), false));
    }

    /// At the connection limit a routed connection waits for a slot for what is left of its
    /// deadline, and is refused for the limit after it.
    #[tokio::test(start_paused = true)]
    async fn establishing_waits_for_a_slot_within_the_deadline() {
        let p = pending(4);
        let limit = ConnLimit::new(Slots::new(1), None);
        let held = p.admit(ip(1), false).expect("room").establish(&limit).await.expect("a free slot");
        let waiting = p.admit(ip(2), false).expect("room");
        let freed = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            drop(held);
        };
        let (got, ()) = tokio::join!(waiting.establish(&limit), freed);
        let _slot = got.expect("the slot freed within the deadline");
        let late = p.admit(ip(3), false).expect("room");
        assert_eq!(late.establish(&limit).await.err(), Some(Refusal::ConnectionLimit));
        assert!(p.is_empty(), "every connection left the pending phase");
    }
}
