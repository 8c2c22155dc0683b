//! The accept loop: a connection permit before `accept`, back-off on fd exhaustion, spawn at once.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
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

/// Connection limits: one process-wide semaphore and an optional per-listener one.
#[derive(Clone)]
pub struct ConnLimit {
    pub global: Arc<Semaphore>,
    pub local: Option<Arc<Semaphore>>,
}

/// Held by a connection task for its whole life; dropping it frees the slot.
pub struct ConnPermit {
    _global: OwnedSemaphorePermit,
    _local: Option<OwnedSemaphorePermit>,
}

impl ConnLimit {
    pub fn new(global: Arc<Semaphore>, local: Option<usize>) -> Self {
        Self { global, local: local.map(|n| Arc::new(Semaphore::new(n))) }
    }

    pub async fn acquire(&self) -> ConnPermit {
        // Local first: a saturated listener must not hold global slots other listeners need.
        let local = match &self.local {
            Some(s) => Some(s.clone().acquire_owned().await.expect("semaphore never closed")),
            None => None,
        };
        let global = self.global.clone().acquire_owned().await.expect("semaphore never closed");
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
    let mut backoff = Duration::from_millis(5);
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
                backoff = Duration::from_millis(5);
                tracker.spawn(handle(conn, addr, permit));
            }
            Err(e) => {
                on_error(&e);
                if is_resource_exhaustion(&e) {
                    tracing::warn!(error = %e, backoff_ms = backoff.as_millis() as u64, "accept failed, backing off");
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(1));
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
