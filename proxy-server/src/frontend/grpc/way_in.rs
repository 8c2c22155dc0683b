//! A gRPC connection's way in, as its `Proxy` streams see it: pending until its first request, then routed with a connection slot of its own (lent to one stream at a time), or refused while it was being routed; and how many streams it has alive (its idle timeout).

use crate::frontend::refusal::Refusal;
use proxy_core::net::accept::ConnPermit;
use proxy_core::net::admission;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::{Notify, watch};
use tonic::Status;

/// Where a connection's way in stands, as its `Proxy` streams see it.
#[derive(Clone)]
pub(super) enum Verdict {
    /// No request yet, or the first one waits for a slot.
    Pending,
    /// Routed, with its slot.
    Established(Arc<OwnSlot>),
    /// Refused while it was being routed: every waiting stream is answered with it.
    Refused(admission::Refusal),
}

/// What a connection's `Proxy` streams share about its admission.
pub(super) struct WayIn {
    /// A stream's headers were decoded and it was routed here: the connection's first request.
    pub(super) asked: Notify,
    verdict: watch::Receiver<Verdict>,
    /// `Proxy` streams of the connection alive now.
    live: watch::Sender<usize>,
}

impl WayIn {
    pub(super) fn new() -> (watch::Sender<Verdict>, Arc<Self>) {
        let (tx, rx) = watch::channel(Verdict::Pending);
        (tx, Arc::new(Self { asked: Notify::new(), verdict: rx, live: watch::Sender::new(0) }))
    }

    /// One more live `Proxy` stream, until the guard is dropped.
    pub(super) fn stream_alive(self: &Arc<Self>) -> LiveStream {
        self.live.send_modify(|n| *n += 1);
        LiveStream(self.clone())
    }

    /// Completes once the connection has had no `Proxy` stream for `idle` in a row.
    pub(super) async fn idle_for(&self, idle: Duration) {
        let mut live = self.live.subscribe();
        loop {
            // The sender lives as long as `self`: this only waits.
            let _ = live.wait_for(|n| *n == 0).await;
            tokio::select! {
                () = tokio::time::sleep(idle) => return,
                r = live.changed() => if r.is_err() { return },
            }
        }
    }

    /// The connection's slot, once it has one (the first stream asks for it); the refusal's
    /// status when it was refused or ended first.
    pub(super) async fn slot(&self) -> Result<Arc<OwnSlot>, Status> {
        self.asked.notify_one();
        let mut rx = self.verdict.clone();
        let v = rx.wait_for(|v| !matches!(v, Verdict::Pending)).await.map(|v| v.clone());
        match v {
            Ok(Verdict::Established(s)) => Ok(s),
            Ok(Verdict::Refused(r)) => Err(Refusal::from(r).grpc_status()),
            Ok(Verdict::Pending) | Err(_) => Err(Status::unavailable("the connection closed")),
        }
    }
}

/// A `Proxy` stream counted alive in its connection's [`WayIn`].
pub(super) struct LiveStream(Arc<WayIn>);

impl Drop for LiveStream {
    fn drop(&mut self) {
        self.0.live.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// A connection's own slot, held while the connection or one of its streams lives and lent to
/// one `Proxy` stream at a time; other streams take slots of their own. So a connection of an
/// older kube-apiserver (one dial each) holds one slot, as a CONNECT does, and a connection with
/// `n` dialled streams holds `n`.
pub(super) struct OwnSlot {
    _permit: ConnPermit,
    lent: AtomicBool,
}

impl OwnSlot {
    pub(super) fn new(permit: ConnPermit) -> Arc<Self> {
        Arc::new(Self { _permit: permit, lent: AtomicBool::new(false) })
    }

    pub(super) fn lend(self: &Arc<Self>) -> Option<Lent> {
        (!self.lent.swap(true, Ordering::AcqRel)).then(|| Lent(self.clone()))
    }
}

/// The connection's slot, lent to a stream until it ends.
pub(super) struct Lent(Arc<OwnSlot>);

impl Drop for Lent {
    fn drop(&mut self) {
        self.0.lent.store(false, Ordering::Release);
    }
}

/// A dialled stream's connection slot, given back when the stream ends.
pub(super) enum StreamSlot {
    /// Its connection's own.
    Lent { _held: Lent },
    /// One of its own.
    Own { _held: ConnPermit },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection's slot goes to one stream at a time, comes back when that stream ends, and
    /// is given back to the process once neither the connection nor a stream holds it.
    #[test]
    fn the_connections_slot_is_lent_to_one_stream_at_a_time() {
        use proxy_core::net::accept::{ConnLimit, Slots};
        let slots = Slots::new(2);
        let limit = ConnLimit::new(slots.clone(), None);
        let own = OwnSlot::new(limit.try_acquire().expect("a free slot"));
        let first = own.lend().expect("the connection's slot is free");
        assert!(own.lend().is_none(), "lent to one stream at a time");
        drop(first);
        let second = own.lend().expect("given back when the stream ended");
        drop(own);
        assert_eq!(slots.in_use(), 1, "a stream outliving its connection keeps the slot");
        drop(second);
        assert_eq!(slots.in_use(), 0);
    }
}
