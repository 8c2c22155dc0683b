//! In-process tests of the accept loop (`proxy_core::net::accept::accept_loop`): a connection permit before accept (global and per-listener limits), stop while waiting, and no error reports for normal accepts.
//!
//! The handler hands each connection and its permit to the test, which decides when the
//! connection ends (by dropping the permit). Whether a connection is still in the kernel's accept
//! queue is read from `/proc/net/tcp` where available. Every wait is bounded.

use proxy_core::net::accept::{ConnLimit, ConnPermit, Slots, accept_loop};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Bound on any single wait (real time).
const BOUND: Duration = Duration::from_secs(20);
/// How long a connection that must *not* be handed over is watched. Only bounds a negative check:
/// a slow machine can make it pass wrongly, never fail wrongly.
const QUIET: Duration = Duration::from_millis(300);

async fn within<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(BOUND, fut).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: not done within {BOUND:?}"),
    }
}

type Handed = (TcpStream, SocketAddr, ConnPermit);

struct Loop {
    addr: SocketAddr,
    handed: mpsc::UnboundedReceiver<Handed>,
    errors: Arc<AtomicUsize>,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

/// Run `accept_loop` on a fresh listener; every connection goes to `handed` with its permit.
async fn start(limit: ConnLimit) -> Loop {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, handed) = mpsc::unbounded_channel();
    let errors = Arc::new(AtomicUsize::new(0));
    let stop = CancellationToken::new();
    let (errs, st) = (errors.clone(), stop.clone());
    let task = tokio::spawn(async move {
        accept_loop(
            listener,
            limit,
            st,
            TaskTracker::new(),
            move |_e| {
                errs.fetch_add(1, Ordering::Relaxed);
            },
            move |conn, peer, permit| {
                let _ = tx.send((conn, peer, permit));
                async {}
            },
        )
        .await
    });
    Loop { addr, handed, errors, stop, task }
}

async fn next_handed(l: &mut Loop) -> Handed {
    within("a connection handed to the handler", l.handed.recv()).await.expect("loop alive")
}

/// Nothing is handed over while we watch.
async fn assert_none_handed(l: &mut Loop, why: &str) {
    if let Ok(h) = tokio::time::timeout(QUIET, l.handed.recv()).await {
        panic!("{why}: a connection was handed over: {:?}", h.map(|h| h.1));
    }
}

/// Connections waiting in the kernel's accept queue of the listener on `port`, from
/// `/proc/net/tcp` (for a LISTEN socket, `rx_queue` is the accept queue length). `None` where
/// that file cannot be read (not Linux).
fn accept_queue_len(port: u16) -> Option<u32> {
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    for line in table.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (local, state, queues) = (f[1], f[3], f[4]);
        let p = u16::from_str_radix(local.rsplit(':').next().unwrap(), 16).unwrap();
        if p == port && state == "0A" {
            return Some(u32::from_str_radix(queues.split(':').nth(1).unwrap(), 16).unwrap());
        }
    }
    panic!("no listener on port {port} in /proc/net/tcp");
}

async fn connect(addr: SocketAddr) -> TcpStream {
    within("connect", TcpStream::connect(addr)).await.unwrap()
}

#[tokio::test]
async fn at_the_global_limit_the_next_connection_waits_in_the_backlog_until_one_ends() {
    let global = Slots::new(2);
    let mut l = start(ConnLimit::new(global.clone(), None)).await;
    let c1 = connect(l.addr).await;
    let h1 = next_handed(&mut l).await;
    let c2 = connect(l.addr).await;
    let h2 = next_handed(&mut l).await;
    assert_eq!(global.available(), 0, "each handed connection holds a permit");
    // The peers are who connected.
    assert_eq!(h1.1, c1.local_addr().unwrap());
    assert_eq!(h2.1, c2.local_addr().unwrap());

    // The third connection completes its TCP handshake (the kernel queues it) but is not accepted.
    let c3 = connect(l.addr).await;
    assert_none_handed(&mut l, "at the limit").await;
    if let Some(q) = accept_queue_len(l.addr.port()) {
        assert_eq!(q, 1, "the third connection is not waiting in the kernel's accept queue");
    }

    // One connection ends: its permit goes to the waiting loop, which accepts the third.
    drop(h1);
    let h3 = next_handed(&mut l).await;
    assert_eq!(h3.1, c3.local_addr().unwrap());
    assert_eq!(global.available(), 0);
    if let Some(q) = accept_queue_len(l.addr.port()) {
        assert_eq!(q, 0);
    }
    drop((h2, h3));
    // Freed permits are back once nothing holds them (the loop may already hold one for the next accept).
    assert!(global.available() >= 1);
    assert_eq!(l.errors.load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn the_per_listener_limit_holds_connections_back_without_taking_global_permits() {
    let global = Slots::new(100);
    let mut l = start(ConnLimit::new(global.clone(), Some(1))).await;
    let _c1 = connect(l.addr).await;
    let h1 = next_handed(&mut l).await;
    let c2 = connect(l.addr).await;
    assert_none_handed(&mut l, "at the listener's limit").await;
    // Waiting for its own limit, the listener holds only the one global permit in use.
    assert_eq!(global.available(), 99, "a saturated listener holds global permits it cannot use");
    if let Some(q) = accept_queue_len(l.addr.port()) {
        assert_eq!(q, 1, "the second connection is not waiting in the kernel's accept queue");
    }
    drop(h1);
    let h2 = next_handed(&mut l).await;
    assert_eq!(h2.1, c2.local_addr().unwrap());
    assert_eq!(global.available(), 99);
    assert_eq!(l.errors.load(Ordering::Relaxed), 0);
}

/// Permits held elsewhere (another listener's connections) count against this listener too.
#[tokio::test]
async fn permits_taken_by_another_listener_count() {
    let global = Slots::new(1);
    let other = ConnLimit::new(global.clone(), None).acquire().await;
    let mut l = start(ConnLimit::new(global.clone(), None)).await;
    let c = connect(l.addr).await;
    assert_none_handed(&mut l, "with the only permit held elsewhere").await;
    drop(other);
    let h = next_handed(&mut l).await;
    assert_eq!(h.1, c.local_addr().unwrap());
}

#[tokio::test]
async fn stop_ends_the_loop_while_it_waits_for_a_permit() {
    let global = Slots::new(1);
    let mut l = start(ConnLimit::new(global.clone(), None)).await;
    let _c1 = connect(l.addr).await;
    let _h1 = next_handed(&mut l).await; // holds the only permit
    let _c2 = connect(l.addr).await;
    l.stop.cancel();
    within("accept loop ends", l.task).await.unwrap();
    // The listener is gone with the loop.
    assert!(TcpStream::connect(l.addr).await.is_err(), "the listener still accepts after stop");
    assert_eq!(l.errors.load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn stop_ends_the_loop_while_it_waits_for_a_connection() {
    let l = start(ConnLimit::new(Slots::new(10), Some(5))).await;
    l.stop.cancel();
    within("accept loop ends", l.task).await.unwrap();
    assert!(TcpStream::connect(l.addr).await.is_err(), "the listener still accepts after stop");
}

/// The handler's future runs in the tracker with its connection and permit; the permit is freed
/// when it ends, which lets the next connection in. No accept error is reported on the way.
#[tokio::test]
async fn handler_futures_run_with_their_permit_and_normal_accepts_report_no_error() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let global = Slots::new(1);
    let errors = Arc::new(AtomicUsize::new(0));
    let (stop, tracker) = (CancellationToken::new(), TaskTracker::new());
    let task = {
        let (errors, stop, tracker) = (errors.clone(), stop.clone(), tracker.clone());
        tokio::spawn(accept_loop(
            listener,
            ConnLimit::new(global, None),
            stop,
            tracker,
            move |_e| {
                errors.fetch_add(1, Ordering::Relaxed);
            },
            |mut conn: TcpStream, _peer, permit: ConnPermit| async move {
                // Echo until EOF, holding the permit.
                let mut buf = [0u8; 64];
                while let Ok(n @ 1..) = conn.read(&mut buf).await {
                    if conn.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
                drop(permit);
            },
        ))
    };
    // One permit: each client is served only once the previous one is done, all in order.
    for i in 0..5u8 {
        let mut c = connect(addr).await;
        c.write_all(&[i; 3]).await.unwrap();
        let mut got = [0u8; 3];
        within("echo", c.read_exact(&mut got)).await.unwrap();
        assert_eq!(got, [i; 3]);
        drop(c);
    }
    assert_eq!(errors.load(Ordering::Relaxed), 0, "on_error called for normal accepts");
    stop.cancel();
    within("accept loop ends", task).await.unwrap();
    tracker.close();
    within("handler tasks end", tracker.wait()).await;
}
