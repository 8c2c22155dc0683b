//! The accept loop: a connection permit before `accept`, back-off on fd exhaustion, spawn at once.
//!
//! At a connection limit accepting pauses and new connections wait in the kernel backlog; every
//! such wait is counted on the process-wide [`Slots`] ([`LimitStats`]), so overload shows in
//! metrics and `/readyz?verbose` instead of looking like a fault.

use crate::net::backoff::Backoff;
use prometheus::{Counter, IntCounter, IntGauge, Registry};
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// A listening socket the loop can accept from (TCP or Unix).
pub trait Acceptor: Send + Sync + 'static {
    type Conn: Send + 'static;
    type Addr: Send + 'static;
    fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<io::Result<(Self::Conn, Self::Addr)>>;
}

impl Acceptor for TcpListener {
    type Conn = TcpStream;
    type Addr = SocketAddr;
    fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<io::Result<(TcpStream, SocketAddr)>> {
        TcpListener::poll_accept(self, cx)
    }
}

impl Acceptor for UnixListener {
    type Conn = UnixStream;
    type Addr = tokio::net::unix::SocketAddr;
    fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<io::Result<(UnixStream, Self::Addr)>> {
        UnixListener::poll_accept(self, cx)
    }
}

/// Connection slots whose number can change while connections hold them (a reload of
/// `max_connections`). Growing adds slots at once; shrinking takes free slots at once and the
/// rest as live connections end, so no live connection is ever cut by it.
///
/// Every connection takes a slot and gives it back, on whichever worker thread it runs: both
/// are one atomic operation on the count, with no lock. Only at the limit does anything wait:
/// connections for a slot (woken one per slot given back) and accept loops for a free slot
/// (all woken, they are few).
#[derive(Debug)]
pub struct Slots {
    /// Slots held now (above `size` for a while after a shrink).
    used: AtomicUsize,
    size: AtomicUsize,
    /// Connections waiting to take a slot, and accept loops waiting for one to be free: a slot
    /// given back wakes someone only when there is someone.
    takers: AtomicUsize,
    watchers: AtomicUsize,
    taken: Notify,
    freed: Notify,
    stats: LimitStats,
}

/// How often and how long connections waited at a connection limit. Kept on the process-wide
/// [`Slots`]; waits at a listener's own limit are counted there too.
#[derive(Debug, Clone)]
pub struct LimitStats {
    /// Waits for a slot (each one: accepting paused, or a routed connection held back).
    pub waits: IntCounter,
    /// Time spent in those waits, summed (two waiting listeners count twice).
    pub wait_seconds: Counter,
    /// Waits going on now: above 0 means the process is at a limit.
    pub waiting: IntGauge,
}

impl LimitStats {
    fn new() -> Self {
        Self {
            waits: IntCounter::new(
                "seedgate_connection_limit_waits_total",
                "Times a connection slot was not free (limits.max_connections or a listener's max_connections): accepting paused, new connections wait in the kernel backlog.",
            )
            .expect("valid metric"),
            wait_seconds: Counter::new(
                "seedgate_connection_limit_wait_seconds_total",
                "Time spent waiting for a free connection slot, summed over the waits.",
            )
            .expect("valid metric"),
            waiting: IntGauge::new(
                "seedgate_connection_limit_waiting",
                "Waits for a connection slot going on now; above 0 means the process is at a connection limit.",
            )
            .expect("valid metric"),
        }
    }
}

/// A wait at a limit: counted when it starts, timed until it ends (or is cancelled).
struct Waiting<'a> {
    stats: &'a LimitStats,
    started: Instant,
}

impl<'a> Waiting<'a> {
    fn start(stats: &'a LimitStats) -> Self {
        stats.waits.inc();
        stats.waiting.inc();
        Self { stats, started: Instant::now() }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.stats.waiting.dec();
        self.stats.wait_seconds.inc_by(self.started.elapsed().as_secs_f64());
    }
}

/// "No limit" for a listener without its own `max_connections`.
pub const UNLIMITED: usize = usize::MAX >> 4;

/// Counts one waiter in `n` while it lives (a cancelled wait counts out too).
struct Registered<'a>(&'a AtomicUsize);

impl<'a> Registered<'a> {
    fn new(n: &'a AtomicUsize) -> Self {
        n.fetch_add(1, Ordering::SeqCst);
        Self(n)
    }
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Slots {
    pub fn new(size: usize) -> Arc<Self> {
        Arc::new(Self {
            used: AtomicUsize::new(0),
            size: AtomicUsize::new(size.min(UNLIMITED)),
            takers: AtomicUsize::new(0),
            watchers: AtomicUsize::new(0),
            taken: Notify::new(),
            freed: Notify::new(),
            stats: LimitStats::new(),
        })
    }

    /// Export the wait statistics in `reg` (done once, for the process-wide slots).
    pub fn register(&self, reg: &Registry) {
        let s = &self.stats;
        for m in [
            Box::new(s.waits.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(s.wait_seconds.clone()),
            Box::new(s.waiting.clone()),
        ] {
            crate::obs::metrics::register(reg, m).expect("metric registered once");
        }
    }

    pub fn stats(&self) -> &LimitStats {
        &self.stats
    }

    /// Slots in use now (may exceed the size for a while after a shrink).
    pub fn in_use(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    pub fn size(&self) -> usize {
        self.size.load(Ordering::Acquire)
    }

    /// Slots free now.
    pub fn available(&self) -> usize {
        self.size().saturating_sub(self.in_use())
    }

    /// Change the number of slots to `new`: more are free at once; fewer are taken from the
    /// free ones, and the rest as connections give theirs back.
    pub fn resize(&self, new: usize) {
        let old = self.size.swap(new.min(UNLIMITED), Ordering::SeqCst);
        if new > old {
            self.wake(new - old);
        }
    }

    /// A slot if one is free now.
    fn try_take(&self) -> bool {
        let size = self.size();
        self.used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| (u < size).then_some(u + 1)).is_ok()
    }

    fn give_back(&self) {
        self.used.fetch_sub(1, Ordering::SeqCst);
        self.wake(1);
    }

    /// `n` slots became free: wake as many connections waiting to take one, and every accept
    /// loop waiting for one (each checks again; a connection's wake-up that finds its waiter
    /// gone is passed to the next one).
    fn wake(&self, n: usize) {
        if self.takers.load(Ordering::SeqCst) > 0 {
            for _ in 0..n.min(self.takers.load(Ordering::SeqCst)) {
                self.taken.notify_one();
            }
        }
        if self.watchers.load(Ordering::SeqCst) > 0 {
            self.freed.notify_waiters();
        }
    }

    /// Take a slot, waiting for one if none is free.
    async fn take(&self) {
        if self.try_take() {
            return;
        }
        let _waiter = Registered::new(&self.takers);
        // Bounded by the slots given back: each round waits for a wake-up.
        loop {
            let woken = self.taken.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            if self.try_take() {
                return;
            }
            woken.await;
        }
    }

    /// Wait until a slot is free, without taking it.
    async fn until_free(&self) {
        if self.available() > 0 {
            return;
        }
        let _waiter = Registered::new(&self.watchers);
        // Bounded by the slots given back: each round waits for a wake-up.
        loop {
            let woken = self.freed.notified();
            if self.available() > 0 {
                return;
            }
            woken.await;
        }
    }
}

/// Connection limits: the process-wide slots and the listener's own.
#[derive(Clone)]
pub struct ConnLimit {
    pub global: Arc<Slots>,
    pub local: Arc<Slots>,
}

/// Held by a connection task for its whole life; dropping it frees the slot.
pub struct ConnPermit {
    limit: ConnLimit,
}

impl Drop for ConnPermit {
    fn drop(&mut self) {
        self.limit.local.give_back();
        self.limit.global.give_back();
    }
}

impl ConnLimit {
    /// `local`: the listener's own limit, `None` for none (only the global one applies).
    pub fn new(global: Arc<Slots>, local: Option<usize>) -> Self {
        Self { global, local: Slots::new(local.unwrap_or(UNLIMITED)) }
    }

    pub async fn acquire(&self) -> ConnPermit {
        // Local first: a saturated listener must not hold global slots other listeners need.
        self.wait(&self.local).await;
        self.wait(&self.global).await;
        ConnPermit { limit: self.clone() }
    }

    /// A permit if both limits have a free slot now.
    pub fn try_acquire(&self) -> Option<ConnPermit> {
        if !self.local.try_take() {
            return None;
        }
        if !self.global.try_take() {
            self.local.give_back();
            return None;
        }
        Some(ConnPermit { limit: self.clone() })
    }

    /// One slot of `slots`, counting the wait in the process-wide statistics when there is one.
    async fn wait(&self, slots: &Slots) {
        if slots.try_take() {
            return;
        }
        let _waiting = Waiting::start(&self.global.stats);
        slots.take().await
    }

    /// Until both limits have a free slot (counted as a wait when one has none).
    async fn until_free(&self) {
        if self.local.available() > 0 && self.global.available() > 0 {
            return;
        }
        let _waiting = Waiting::start(&self.global.stats);
        // Bounded by the slots given back: each round waits until one limit has room.
        loop {
            self.local.until_free().await;
            self.global.until_free().await;
            if self.local.available() > 0 && self.global.available() > 0 {
                return;
            }
        }
    }
}

/// What the accept loop waits for before each `accept`, and hands to the connection with it.
pub trait Admission: Send + Sync + 'static {
    type Permit: Send + 'static;
    fn admit(&self) -> impl Future<Output = Self::Permit> + Send;
}

/// A permit held by the connection for its whole life.
impl Admission for ConnLimit {
    type Permit = ConnPermit;
    fn admit(&self) -> impl Future<Output = ConnPermit> + Send {
        self.acquire()
    }
}

/// Accept only while the limit has a free slot, but let the connection take its slot itself
/// later (when it is routed): pre-routing connections then hold no slot of established ones.
#[derive(Clone)]
pub struct WhileFree(pub ConnLimit);

impl Admission for WhileFree {
    type Permit = ();
    async fn admit(&self) {
        self.0.until_free().await
    }
}

/// Errors after which accepting again at once would spin: the process or system is out of file
/// descriptors or memory. Everything else (a peer that reset before accept) is retried at once.
fn is_resource_exhaustion(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE) | Some(libc::ENOBUFS) | Some(libc::ENOMEM))
}

/// Accept until `stop` is cancelled. Each connection is handed to `handle` in a task of
/// `tracker`, together with what `limit` admitted it with (its permit, or nothing with
/// [`WhileFree`]); the loop waits for `limit` before it accepts, so at the limit new connections
/// queue in the kernel backlog instead of being accepted and dropped.
/// `on_error` is told about every accept error (for metrics); the loop never ends on one.
pub async fn accept_loop<A, L, F, Fut>(
    listener: A,
    limit: L,
    stop: CancellationToken,
    tracker: TaskTracker,
    mut on_error: impl FnMut(&io::Error),
    mut handle: F,
) where
    A: Acceptor,
    L: Admission,
    F: FnMut(A::Conn, A::Addr, L::Permit) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut backoff = Backoff::new(Duration::from_millis(5), Duration::from_secs(1));
    // One wait for the stop, for the loop's whole life: a new one per connection would register
    // with the token (under its lock) and leave it again each time.
    let stopped = stop.cancelled();
    tokio::pin!(stopped);
    loop {
        let permit = tokio::select! {
            biased;
            _ = &mut stopped => return,
            p = limit.admit() => p,
        };
        let accepted = tokio::select! {
            biased;
            _ = &mut stopped => return,
            r = std::future::poll_fn(|cx| listener.poll_accept(cx)) => r,
        };
        match accepted {
            Ok((conn, addr)) => {
                backoff.reset();
                tracker.spawn(handle(conn, addr, permit));
            }
            Err(e) => {
                on_error(&e);
                if is_resource_exhaustion(&e) {
                    let wait = backoff.next_wait();
                    tracing::warn!(error = %e, backoff_ms = wait.as_millis() as u64, "accept failed, backing off");
                    tokio::select! {
                        _ = &mut stopped => return,
                        _ = tokio::time::sleep(wait) => {}
                    }
                } else {
                    tracing::debug!(error = %e, "accept error");
                }
            }
        }
    }
}

/// Every label [`accept_error_label`] gives.
pub const ACCEPT_ERROR_LABELS: [&str; 3] = ["fd_exhausted", "no_memory", "other"];

/// Label for an accept error in metrics.
pub fn accept_error_label(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::EMFILE) | Some(libc::ENFILE) => "fd_exhausted",
        Some(libc::ENOBUFS) | Some(libc::ENOMEM) => "no_memory",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn slots_grow_and_shrink_without_touching_holders() {
        let s = Slots::new(2);
        let limit = ConnLimit { global: s.clone(), local: Slots::new(UNLIMITED) };
        let a = limit.acquire().await;
        let b = limit.acquire().await;
        assert_eq!(s.available(), 0);
        s.resize(3);
        assert_eq!(s.available(), 1);
        // Shrink below what is held: nothing is taken from the holders, the slots are
        // retired as they come back.
        s.resize(1);
        assert_eq!((s.size(), s.available()), (1, 0));
        drop(a);
        tokio::task::yield_now().await;
        drop(b);
        for _ in 0..100 {
            if s.available() == 1 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(s.available(), 1, "one slot after shrinking to 1 and releasing both");
    }

    /// At the limit, each slot given back lets one waiting connection in; a waiter that gives
    /// up passes its turn on, and an accept loop waiting for room is woken too.
    #[tokio::test]
    async fn a_slot_given_back_wakes_one_waiter_and_the_accept_loops() {
        let limit = ConnLimit::new(Slots::new(2), None);
        let held: Vec<ConnPermit> = vec![limit.acquire().await, limit.acquire().await];
        let spawn_taker = |l: ConnLimit| tokio::spawn(async move { l.acquire().await });
        let (a, b) = (spawn_taker(limit.clone()), spawn_taker(limit.clone()));
        let gives_up = spawn_taker(limit.clone());
        let l2 = limit.clone();
        let watcher = tokio::spawn(async move { WhileFree(l2).admit().await });
        let settle = || async {
            for _ in 0..100 {
                tokio::task::yield_now().await;
            }
        };
        settle().await;
        assert!(!a.is_finished() && !b.is_finished() && !watcher.is_finished());
        gives_up.abort();
        let mut held = held;
        held.pop();
        let first = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                if a.is_finished() || b.is_finished() {
                    break;
                }
                tokio::task::yield_now().await;
            }
        })
        .await;
        assert!(first.is_ok(), "a waiter took the slot given back");
        settle().await;
        assert!(!(a.is_finished() && b.is_finished()), "one slot, one waiter in");
        assert_eq!(limit.global.in_use(), 2);
        held.pop();
        let both = tokio::time::timeout(Duration::from_secs(5), async { (a.await.unwrap(), b.await.unwrap()) }).await;
        let permits = both.expect("the second waiter got the second slot");
        assert_eq!(limit.global.in_use(), 2);
        drop(permits);
        assert_eq!(limit.global.in_use(), 0);
        tokio::time::timeout(Duration::from_secs(5), watcher).await.expect("the accept loop saw room").unwrap();
    }

    #[tokio::test]
    async fn waits_at_the_limit_are_counted_and_while_free_holds_no_slot() {
        let global = Slots::new(1);
        let limit = ConnLimit::new(global.clone(), None);
        // Admitted while free: the slot is still free afterwards.
        WhileFree(limit.clone()).admit().await;
        assert_eq!((global.in_use(), global.stats().waits.get()), (0, 0));
        let first = limit.try_acquire().expect("a free slot");
        assert!(limit.try_acquire().is_none(), "the only slot is taken");
        let l2 = limit.clone();
        let second = tokio::spawn(async move { l2.acquire().await });
        for _ in 0..1000 {
            if global.stats().waiting.get() == 1 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!((global.stats().waiting.get(), global.stats().waits.get()), (1, 1), "one wait going on");
        drop(first);
        let _second = tokio::time::timeout(Duration::from_secs(5), second).await.expect("admitted").expect("task");
        assert_eq!(global.stats().waiting.get(), 0, "the wait ended");
        assert_eq!(global.stats().waits.get(), 1);
        // A listener's own limit counts in the process-wide statistics too.
        let local = ConnLimit::new(Slots::new(10), Some(1));
        let held = local.acquire().await;
        let l3 = local.clone();
        let t = tokio::spawn(async move { l3.acquire().await });
        for _ in 0..1000 {
            if local.global.stats().waiting.get() == 1 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(local.global.stats().waits.get(), 1);
        drop(held);
        let _ = tokio::time::timeout(Duration::from_secs(5), t).await.expect("admitted");
    }
}
