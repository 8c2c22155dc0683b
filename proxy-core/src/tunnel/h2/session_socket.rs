//! A tunnel session's TCP socket, writing no more than its [`InflightBound`] lets it hold unacknowledged (the tokio glue of that bound).

use super::inflight::{InflightBound, PathSample};
use crate::net::sockopt::{set_max_pacing_rate, tcp_path, tcp_unacknowledged};
use crate::obs::metrics::{counter, gauge};
use crate::tunnel::path::LOCAL_RTT;
use prometheus::{IntCounter, IntGauge, Registry};
use socket2::SockRef;
use std::future::Future;
use std::io;
use std::os::fd::AsFd;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

/// How long a write waits before it looks at a full bound again while the path is silent.
const SILENT_PAUSE: Duration = Duration::from_millis(200);

/// What the in-flight bounds of a process's session sockets do (one set per process).
#[derive(Debug, Clone)]
pub struct InflightStats {
    /// Session sockets whose bound is set now.
    pub bounded: IntGauge,
    /// Writes that found their socket's bound full and waited.
    pub waits: IntCounter,
    /// Times a bounded socket's BBR was started afresh before its ProbeRTT.
    pub bbr_restarts: IntCounter,
}

impl InflightStats {
    pub fn new(reg: &Registry) -> Self {
        Self {
            bounded: gauge(
                reg,
                "seedgate_tunnel_inflight_bounded",
                "HTTP/2 tunnel sessions whose TCP socket has an in-flight bound now (tcp_inflight_bound: a path of 1 ms or more that has shown a queue).",
            ),
            waits: counter(
                reg,
                "seedgate_tunnel_inflight_waits_total",
                "Writes to an HTTP/2 tunnel session's TCP socket that waited because the session's bytes in flight reached its bound (a wait is a sixteenth of the path's round trip, 1-10 ms, or 200 ms once data sent two round trips ago got no acknowledgement): the session moves what its path carries.",
            ),
            bbr_restarts: counter(
                reg,
                "seedgate_tunnel_inflight_bbr_restarts_total",
                "Times the BBR congestion control of an HTTP/2 tunnel session's TCP socket was started afresh while the session's in-flight bound was set (every 5 s of sending, never during loss recovery): this keeps BBR from draining the connection to four packets for 200 ms and a round trip every 10 s (ProbeRTT), which every stream of the session would wait for.",
            ),
        }
    }
}

/// A session's TCP stream; reads pass through, writes wait for the bound (none on a local path).
#[derive(Debug)]
pub struct SessionSocket {
    inner: TcpStream,
    bounding: Option<Box<Bounding>>,
}

#[derive(Debug)]
struct Bounding {
    bound: InflightBound,
    /// The latest look at the socket, and when the next one is due.
    last: PathSample,
    next_look: Instant,
    /// Wakes a write that waits for acknowledgements (the kernel says nothing when they come).
    wait: Pin<Box<Sleep>>,
    stats: Option<InflightStats>,
    /// Counted in `stats.bounded`.
    counted: bool,
    /// The socket's congestion control is BBR (started afresh while bounded).
    bbr: bool,
}

impl Drop for Bounding {
    fn drop(&mut self) {
        if let Some(s) = self.stats.as_ref().filter(|_| self.counted) {
            s.bounded.dec();
        }
    }
}

impl SessionSocket {
    /// `bound`: whether the setting asks for one. A socket whose handshake took less than
    /// [`LOCAL_RTT`] never gets one (its path does not change, and its minimum only falls).
    pub fn new(inner: TcpStream, bound: bool, stats: Option<InflightStats>) -> Self {
        let path = if bound { tcp_path(inner.as_fd()).ok() } else { None };
        let bounding = path.filter(|p| p.min_rtt >= LOCAL_RTT).map(|p| {
            Box::new(Bounding {
                bound: InflightBound::new(),
                last: PathSample { srtt: p.srtt, min_rtt: p.min_rtt, held: 0, delivery_rate: 0 },
                next_look: Instant::now(),
                wait: Box::pin(tokio::time::sleep(Duration::ZERO)),
                stats,
                counted: false,
                bbr: is_bbr(&inner),
            })
        });
        Self { inner, bounding }
    }

    /// The bound now: `None` without one (a local path, the setting off, or none learnt yet).
    pub fn bound(&self) -> Option<u64> {
        self.bounding.as_ref().and_then(|b| b.bound.bound())
    }

    pub fn get_ref(&self) -> &TcpStream {
        &self.inner
    }

    #[cfg(test)]
    fn with_bound(inner: TcpStream, bound: InflightBound) -> Self {
        let mut s = Self::new(inner, false, None);
        s.bounding = Some(Box::new(Bounding {
            bound,
            stats: None,
            counted: false,
            bbr: false,
            last: PathSample {
                srtt: Duration::from_millis(50),
                min_rtt: Duration::from_millis(50),
                held: 0,
                delivery_rate: 0,
            },
            next_look: Instant::now() + Duration::from_secs(3600),
            wait: Box::pin(tokio::time::sleep(Duration::ZERO)),
        }));
        s
    }
}

/// Whether the socket's congestion control is BBR (the kernel pads the name with NULs).
fn is_bbr(sock: &TcpStream) -> bool {
    SockRef::from(sock).tcp_congestion().is_ok_and(|name| name.split(|&b| b == 0).next() == Some(&b"bbr"[..]))
}

/// Start the socket's BBR again from its initial state, through `reno` (which every kernel has
/// and allows): the kernel starts a congestion control afresh only when it changes. The
/// congestion window and what is in flight stay as they are. Should BBR be refused on the way
/// back (twice), the socket is left with `reno` and the error says so.
fn restart_bbr(sock: &TcpStream) -> io::Result<()> {
    let sock = SockRef::from(sock);
    sock.set_tcp_congestion(b"reno")?;
    sock.set_tcp_congestion(b"bbr")
        .or_else(|_| sock.set_tcp_congestion(b"bbr"))
        .map_err(|e| io::Error::new(e.kind(), format!("bbr refused after reno ({e}): the socket is left with reno")))
}

impl Bounding {
    /// How often the socket's round trips are read: eight times a round trip, within 1–25 ms.
    fn look_gap(&self) -> Duration {
        (self.last.srtt / 8).clamp(Duration::from_millis(1), Duration::from_millis(25))
    }

    /// How long a write that found the bound full waits before it looks again: a sixteenth of
    /// the path (what drains meanwhile is a small part of the bound), within 1–10 ms; but
    /// [`SILENT_PAUSE`] once data sent two round trips ago (at least 100 ms) got no
    /// acknowledgement since: a path gone silent costs a few wake-ups a second, not hundreds.
    /// (After an idle period the last acknowledgement is old too, but data was just sent.)
    fn pause(&self, since_ack: Duration, since_sent: Duration) -> Duration {
        let silence = (2 * self.last.srtt).max(Duration::from_millis(100));
        if since_ack > silence && since_sent > silence {
            return SILENT_PAUSE;
        }
        (self.last.min_rtt / 16).clamp(Duration::from_millis(1), Duration::from_millis(10))
    }

    /// How much of `len` may be written now; `Pending` (the timer armed) when nothing may.
    fn room(&mut self, sock: &TcpStream, cx: &mut Context<'_>, len: usize) -> Poll<io::Result<usize>> {
        let now = Instant::now();
        // Without a bound yet, the socket is only read when a look is due.
        if self.bound.bound().is_none() && now < self.next_look {
            return Poll::Ready(Ok(len));
        }
        // What the session's bytes occupy of the path: unacknowledged, less what has left the
        // network (a hole's selectively acknowledged bytes wait only for the retransmission).
        let p = tcp_path(sock.as_fd())?;
        let held = tcp_unacknowledged(sock.as_fd())?.saturating_sub(p.left_network);
        if now >= self.next_look {
            self.last = PathSample { srtt: p.srtt, min_rtt: p.min_rtt, held, delivery_rate: p.delivery_rate };
            let pacing = self.bound.pacing_rate();
            self.bound.sample(now.into_std(), self.last);
            self.next_look = now + self.look_gap();
            if let Some(rate) = self.bound.pacing_rate().filter(|&r| Some(r) != pacing) {
                set_max_pacing_rate(sock.as_fd(), rate)?;
                if let Some(s) = self.stats.as_ref().filter(|_| !self.counted) {
                    s.bounded.inc();
                    self.counted = true;
                }
            }
            if self.bbr && self.bound.restart_min_rtt_clock(now.into_std(), p.recovering) {
                match restart_bbr(sock) {
                    Ok(()) => self.stats.iter().for_each(|s| s.bbr_restarts.inc()),
                    Err(e) => {
                        // The kernel let the socket choose BBR before and no longer does: the
                        // socket goes on with what it has now (the error says which).
                        tracing::warn!(error = %e, "a tunnel session's BBR could not be started afresh");
                        self.bbr = false;
                    }
                }
            }
        }
        let room = self.bound.room(held, len);
        if room > 0 {
            return Poll::Ready(Ok(room));
        }
        if let Some(s) = &self.stats {
            s.waits.inc();
        }
        let pause = self.pause(p.since_ack, p.since_sent);
        self.wait.as_mut().reset(now + pause);
        // A timer just armed in the future is pending: this registers the task's waker.
        match self.wait.as_mut().poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(()) => {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
        }
    }
}

impl AsyncRead for SessionSocket {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for SessionSocket {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let Some(b) = this.bounding.as_deref_mut() else {
            return Pin::new(&mut this.inner).poll_write(cx, buf);
        };
        match b.room(&this.inner, cx, buf.len()) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(room)) => Pin::new(&mut this.inner).poll_write(cx, buf.get(..room).unwrap_or(buf)),
            Poll::Ready(Err(e)) => {
                // The socket cannot say (it always should): write without a bound.
                tracing::debug!(error = %e, "a tunnel session's socket writes without an in-flight bound");
                this.bounding = None;
                Pin::new(&mut this.inner).poll_write(cx, buf)
            }
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.bounding.is_none() {
            return Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        }
        let first = bufs.iter().find(|b| !b.is_empty()).map_or(&[][..], |b| &**b);
        self.poll_write(cx, first)
    }

    fn is_write_vectored(&self) -> bool {
        self.bounding.is_none() && self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tunnel::path::queue_margin;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn pair() -> (TcpStream, TcpStream) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        (c, s)
    }

    #[tokio::test]
    async fn a_local_socket_gets_no_bound_and_writes_through() {
        let (c, mut s) = pair().await;
        let reg = Registry::new();
        let stats = InflightStats::new(&reg);
        let mut c = SessionSocket::new(c, true, Some(stats.clone()));
        assert!(c.bounding.is_none(), "loopback's handshake is far below a millisecond");
        assert!(c.is_write_vectored());
        c.write_all(&[7; 100_000]).await.unwrap();
        let mut got = vec![0; 100_000];
        s.read_exact(&mut got).await.unwrap();
        assert!(got.iter().all(|&b| b == 7));
        assert_eq!(c.bound(), None);
        assert_eq!((stats.bounded.get(), stats.waits.get()), (0, 0));
    }

    /// The peer stops reading: what the socket holds unacknowledged (unsent, once the peer's
    /// window is shut) stops at the bound, and writing goes on once the peer reads.
    #[tokio::test]
    async fn writes_stop_at_the_bound_and_go_on_when_acknowledgements_come() {
        let (c, mut s) = pair().await;
        let _ = SockRef::from(&s).set_recv_buffer_size(64 * 1024);
        let bound = 128 * 1024;
        let mut c = SessionSocket::with_bound(c, bounded(bound));
        let stats = InflightStats::new(&Registry::new());
        c.bounding.as_mut().unwrap().stats = Some(stats.clone());
        let chunk = [1u8; 16 * 1024];
        let mut written = 0u64;
        // Bounded: the write that never completes within 200 ms is the one held back.
        for _ in 0..10_000 {
            match tokio::time::timeout(Duration::from_millis(200), c.write(&chunk)).await {
                Ok(n) => written += n.unwrap() as u64,
                Err(_) => break,
            }
        }
        let held = tcp_unacknowledged(c.get_ref().as_fd()).unwrap();
        assert!(held <= bound, "held {held} over the bound {bound} ({written} written)");
        assert!(held + chunk.len() as u64 > bound, "held {held}: stopped early");
        assert!(c.bounding.as_ref().unwrap().bound.bound().is_some());
        assert!(stats.waits.get() > 0, "the held-back write is counted");
        // The peer reads everything: writing resumes and everything arrives.
        let reader = tokio::spawn(async move {
            let mut n = 0u64;
            let mut buf = vec![0; 64 * 1024];
            loop {
                match s.read(&mut buf).await.unwrap() {
                    0 => return n,
                    k => n += k as u64,
                }
            }
        });
        let more = 4 * bound;
        for _ in 0..more / chunk.len() as u64 {
            tokio::time::timeout(Duration::from_secs(10), c.write_all(&chunk)).await.unwrap().unwrap();
        }
        c.shutdown().await.unwrap();
        let n = tokio::time::timeout(Duration::from_secs(10), reader).await.unwrap().unwrap();
        assert_eq!(n, written + more);
    }

    #[tokio::test]
    async fn the_pause_is_a_sixteenth_of_the_path_and_long_once_the_path_is_silent() {
        let (c, _s) = pair().await;
        let c = SessionSocket::with_bound(c, bounded(128 * 1024));
        let b = c.bounding.as_ref().unwrap();
        let ms = Duration::from_millis;
        let base = Duration::from_micros(3125);
        assert_eq!(b.pause(ms(0), ms(0)), base, "a sixteenth of 50 ms");
        assert_eq!(b.pause(ms(100), ms(101)), base, "acknowledgements 100 ms apart: a slow path");
        assert_eq!(b.pause(ms(5000), ms(2)), base, "the first write after an idle period");
        assert_eq!(b.pause(ms(101), ms(101)), SILENT_PAUSE, "sent long ago, nothing acknowledged since");
    }

    /// A bounded socket whose congestion control is BBR starts it afresh at its first look and
    /// then not again within five seconds, and keeps BBR.
    #[tokio::test]
    async fn a_bounded_bbr_socket_is_started_afresh_and_stays_bbr() {
        let (c, mut s) = pair().await;
        SockRef::from(&c).set_tcp_congestion(b"reno").unwrap();
        assert!(!is_bbr(&c), "reno is not BBR");
        if let Err(e) = SockRef::from(&c).set_tcp_congestion(b"bbr") {
            eprintln!("skipped: this kernel has no BBR ({e})");
            return;
        }
        let mut c = SessionSocket::with_bound(c, bounded(1 << 20));
        let stats = InflightStats::new(&Registry::new());
        let b = c.bounding.as_mut().unwrap();
        (b.stats, b.bbr, b.next_look) = (Some(stats.clone()), true, Instant::now());
        c.write_all(&[3; 1000]).await.unwrap();
        assert_eq!(stats.bbr_restarts.get(), 1, "the first look restarts BBR");
        assert!(is_bbr(c.get_ref()), "still BBR after the restart");
        c.bounding.as_mut().unwrap().next_look = Instant::now();
        c.write_all(&[3; 1000]).await.unwrap();
        assert_eq!(stats.bbr_restarts.get(), 1, "not again within five seconds");
        let mut got = vec![0; 2000];
        s.read_exact(&mut got).await.unwrap();
        assert!(got.iter().all(|&b| b == 3), "what was written arrives");
    }

    fn bounded(bytes: u64) -> InflightBound {
        // A standing queue with `bytes` × 1.1 held makes a bound of about `bytes`.
        let mut b = InflightBound::new();
        let min = Duration::from_millis(100);
        let srtt = min + queue_margin(min) * 3 / 2;
        let held = (bytes as f64 * srtt.as_secs_f64() / (min + queue_margin(min)).as_secs_f64()) as u64;
        let sample = PathSample { srtt, min_rtt: min, held: held + 1, delivery_rate: 0 };
        // Busy for two round trips: the queue is the session's.
        let now = std::time::Instant::now();
        b.sample(now - 2 * srtt, sample);
        b.sample(now, sample);
        assert!(b.bound().unwrap().abs_diff(bytes) < 2, "{:?}", b.bound());
        b
    }
}
