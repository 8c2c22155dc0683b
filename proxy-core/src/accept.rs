//! The accept loop: a connection permit before `accept`, back-off on fd exhaustion, spawn at once.

use crate::backoff::Backoff;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
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
#[derive(Debug)]
pub struct Slots {
    sem: Arc<Semaphore>,
    size: Mutex<usize>,
}

/// "No limit" for a listener without its own `max_connections`.
pub const UNLIMITED: usize = Semaphore::MAX_PERMITS;

impl Slots {
    pub fn new(size: usize) -> Arc<Self> {
        let size = size.min(UNLIMITED);
        Arc::new(Self { sem: Arc::new(Semaphore::new(size)), size: Mutex::new(size) })
    }

    pub fn size(&self) -> usize {
        *self.size.lock().expect("not poisoned")
    }

    /// Slots free now.
    pub fn available(&self) -> usize {
        self.sem.available_permits()
    }

    /// Change the number of slots to `new`. Must be called inside a tokio runtime (a shrink
    /// below the slots in use waits in a task for connections to end).
    pub fn resize(&self, new: usize) {
        let new = new.min(UNLIMITED);
        let mut size = self.size.lock().expect("not poisoned");
        let old = std::mem::replace(&mut *size, new);
        if new > old {
            self.sem.add_permits(new - old);
        } else if new < old {
            let want = old - new;
            let mut owed = want - self.sem.forget_permits(want);
            while owed > 0 {
                let n = owed.min(u32::MAX as usize);
                owed -= n;
                let sem = self.sem.clone();
                tokio::spawn(async move {
                    if let Ok(p) = sem.acquire_many_owned(n as u32).await {
                        p.forget();
                    }
                });
            }
        }
    }

    async fn acquire(&self) -> OwnedSemaphorePermit {
        self.sem.clone().acquire_owned().await.expect("semaphore never closed")
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
    _global: OwnedSemaphorePermit,
    _local: OwnedSemaphorePermit,
}

impl ConnLimit {
    /// `local`: the listener's own limit, `None` for none (only the global one applies).
    pub fn new(global: Arc<Slots>, local: Option<usize>) -> Self {
        Self { global, local: Slots::new(local.unwrap_or(UNLIMITED)) }
    }

    pub async fn acquire(&self) -> ConnPermit {
        // Local first: a saturated listener must not hold global slots other listeners need.
        let local = self.local.acquire().await;
        let global = self.global.acquire().await;
        ConnPermit { _global: global, _local: local }
    }
}

/// Errors after which accepting again at once would spin: the process or system is out of file
/// descriptors or memory. Everything else (a peer that reset before accept) is retried at once.
fn is_resource_exhaustion(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE) | Some(libc::ENOBUFS) | Some(libc::ENOMEM))
}

/// Accept until `stop` is cancelled. Each connection is handed to `handle` in a task of
/// `tracker`, together with its permit; the loop waits for a permit before it accepts, so at the
/// limit new connections queue in the kernel backlog instead of being accepted and dropped.
/// `on_error` is told about every accept error (for metrics); the loop never ends on one.
pub async fn accept_loop<A, F, Fut>(
    listener: A,
    limit: ConnLimit,
    stop: CancellationToken,
    tracker: TaskTracker,
    mut on_error: impl FnMut(&io::Error),
    mut handle: F,
) where
    A: Acceptor,
    F: FnMut(A::Conn, A::Addr, ConnPermit) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut backoff = Backoff::new(Duration::from_millis(5), Duration::from_secs(1));
    loop {
        let permit = tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            p = limit.acquire() => p,
        };
        let accepted = tokio::select! {
            biased;
            _ = stop.cancelled() => return,
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
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(wait) => {}
                    }
                } else {
                    tracing::debug!(error = %e, "accept error");
                }
            }
        }
    }
}

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
}
