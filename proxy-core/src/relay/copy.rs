//! Bidirectional byte relay: half-close propagation, idle timeout, byte counts, and no buffer held while idle.
//!
//! Two pumps share one driver: [`BufPump`] for any `AsyncRead + AsyncWrite` pair (TLS, tunnel
//! streams), taking a buffer from a per-thread pool only while bytes are in flight; and, for two
//! TCP sockets, [`SplicePump`], which moves bytes through a pooled pipe with splice(2) so they never
//! enter user space. An idle connection holds no buffer and no pipe, only its sockets and state.

use crate::relay::buf::{BUF_SIZE, give_buf, take_buf};
use crate::relay::io::Resettable;
use crate::relay::splice::{Pipe, splice};
use bytes::{Buf, Bytes, BytesMut};
use prometheus::IntCounter;
use socket2::SockRef;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::io::{self, IoSlice};
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;
use tokio::io::{Interest, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

/// Pipes kept per thread for reuse; more are closed.
const PIPE_POOL_MAX: usize = 64;
/// Bytes moved by one splice call (the pipe is grown to this size when possible).
const PIPE_SIZE: usize = 256 * 1024;

thread_local! {
    static PIPES: RefCell<Vec<Pipe>> = const { RefCell::new(Vec::new()) };
}

fn take_pipe() -> io::Result<Pipe> {
    if let Some(p) = PIPES.with(|p| p.borrow_mut().pop()) {
        return Ok(p);
    }
    let p = Pipe::new()?;
    p.set_size(PIPE_SIZE);
    Ok(p)
}

/// Only empty pipes come back: a pipe with bytes in it belongs to its connection.
fn give_pipe(p: Pipe) {
    PIPES.with(|pool| {
        let mut pool = pool.borrow_mut();
        if pool.len() < PIPE_POOL_MAX {
            pool.push(p);
        }
    });
}

/// Which end of a relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The side that connected to us (downstream).
    Client,
    /// The side we connected to (upstream).
    Upstream,
}

impl Side {
    pub fn label(self) -> &'static str {
        match self {
            Side::Client => "client",
            Side::Upstream => "upstream",
        }
    }
}

/// Why a relay was ended from outside, on purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// The shutdown grace period ran out.
    Shutdown,
    /// The route changed or went away on reload, and its `drain_deadline` passed.
    RouteDrained,
    /// The cluster drains to another seed (deadline passed) or is fenced.
    ClusterDrained,
    /// The tunnel session carrying the stream was replaced (re-homing) and its drain passed.
    SessionDrained,
}

/// How a relay ended. The relay's end policy decides from it how both ends close; logs and metrics
/// take their reason from [`Outcome::label`].
#[derive(Debug)]
pub enum Outcome {
    /// Both directions finished with an orderly end of stream.
    Closed,
    /// No byte moved in either direction for the idle timeout.
    Idle,
    /// `side` reset the connection (or failed in a way that is passed on as a reset).
    Reset(Side),
    /// Reading from or writing to `side` failed.
    Error(Side, io::Error),
    /// Ended from outside (drain deadline, shutdown); never produced by [`Transfer`] itself.
    Stopped(Stop),
}

impl Outcome {
    /// How many different outcomes (and labels) there are.
    pub const COUNT: usize = 10;

    /// A number for each outcome below [`Outcome::COUNT`], for tables of per-outcome counters
    /// resolved once instead of looked up by label on every close.
    pub fn index(&self) -> usize {
        match self {
            Outcome::Closed => 0,
            Outcome::Idle => 1,
            Outcome::Reset(Side::Client) => 2,
            Outcome::Reset(Side::Upstream) => 3,
            Outcome::Error(Side::Client, _) => 4,
            Outcome::Error(Side::Upstream, _) => 5,
            Outcome::Stopped(Stop::Shutdown) => 6,
            Outcome::Stopped(Stop::RouteDrained) => 7,
            Outcome::Stopped(Stop::ClusterDrained) => 8,
            Outcome::Stopped(Stop::SessionDrained) => 9,
        }
    }

    /// Every outcome's label, at its [`Outcome::index`].
    pub const LABELS: [&'static str; Self::COUNT] = [
        "closed",
        "idle_timeout",
        "client_reset",
        "upstream_reset",
        "client_error",
        "upstream_error",
        "shutdown",
        "route_drained",
        "cluster_drained",
        "session_drained",
    ];

    /// Short label for logs and metrics.
    pub fn label(&self) -> &'static str {
        Self::LABELS[self.index()]
    }
}

/// Byte counters updated while bytes move (not only at close), so long-lived streams show up.
#[derive(Clone, Default)]
pub struct Meters {
    pub to_upstream: Option<IntCounter>,
    pub to_client: Option<IntCounter>,
}

/// A pump failure: which stream failed (the one read from or the one written to).
pub struct PumpError {
    on_reader: bool,
    err: io::Error,
}

/// One direction of a relay.
pub trait Pump<R, W>: Default + Unpin {
    /// Move bytes until `r` is at end of stream and `w` is shut down (Ready(Ok)), or until
    /// nothing can move now (Pending). `moved` is increased by the bytes written.
    fn poll_pump(&mut self, cx: &mut Context<'_>, r: &mut R, w: &mut W, moved: &mut u64)
    -> Poll<Result<(), PumpError>>;
}

/// Buffered pump for any stream pair. Into a stream that takes chunks by value (a tunnel
/// stream) it reads into a chunk of its own and hands that over, rather than copying out of a
/// pooled buffer; from a stream that hands out what it received by value (a tunnel stream) it
/// gathers the chunks ready at once and writes them with one vectored write. The relay itself
/// then copies no byte that a tunnel carries, in either direction.
#[derive(Default)]
pub struct BufPump {
    buf: Option<Box<[u8]>>,
    pos: usize,
    len: usize,
    /// Chunks read by value, in order, not yet all written. Freed while idle, so that an idle
    /// relay holds no allocation for it.
    owned: VecDeque<Bytes>,
    /// A read error that came after chunks still queued: reported once they are written, so
    /// that what arrived before the failure is delivered.
    read_err: Option<io::Error>,
    eof: bool,
    need_flush: bool,
    done: bool,
}

/// Most chunks gathered into one vectored write. QUIC hands out one packet's payload per chunk
/// (up to ~6.4 KiB), so ten make a relay buffer's worth; an HTTP/2 DATA payload is up to 64 KiB,
/// often less (what one socket read brought at the far end), and a full one is written alone.
const MAX_GATHER: usize = 16;

/// A read of fewer bytes than this is copied into a chunk of its size, so that a queued small
/// chunk does not hold a whole read buffer.
const OWNED_MIN: usize = BUF_SIZE / 4;

fn rd(err: io::Error) -> PumpError {
    PumpError { on_reader: true, err }
}
fn wr(err: io::Error) -> PumpError {
    PumpError { on_reader: false, err }
}

impl BufPump {
    /// Nothing to read now: flush what was written since the last flush, then wait.
    fn idle<W: Resettable>(&mut self, cx: &mut Context<'_>, w: &mut W) -> Poll<Result<(), PumpError>> {
        if self.owned.capacity() > 0 {
            self.owned = VecDeque::new();
        }
        if self.need_flush {
            ready!(Pin::new(&mut *w).poll_flush(cx)).map_err(wr)?;
            self.need_flush = false;
        }
        Poll::Pending
    }

    /// Write the queued chunks in order: several at once with one vectored write where the
    /// writer copies and takes them that way (a socket), else one by one, by value where the
    /// writer takes chunks.
    fn write_owned<W: Resettable>(&mut self, cx: &mut Context<'_>, w: &mut W, moved: &mut u64) -> Poll<io::Result<()>> {
        while !self.owned.is_empty() {
            if self.owned.len() > 1 && w.owned_chunk().is_none() && w.is_write_vectored() {
                let mut slices = [IoSlice::new(&[]); MAX_GATHER];
                let k = self.owned.len().min(MAX_GATHER);
                for (s, c) in slices.iter_mut().zip(&self.owned) {
                    *s = IoSlice::new(c);
                }
                let mut n = ready!(Pin::new(&mut *w).poll_write_vectored(cx, &slices[..k]))?;
                if n == 0 {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                *moved += n as u64;
                while let Some(front) = self.owned.front_mut() {
                    if n < front.len() {
                        front.advance(n);
                        break;
                    }
                    n -= front.len();
                    self.owned.pop_front();
                }
            } else if let Some(front) = self.owned.front_mut() {
                let before = front.len();
                let r = w.poll_write_owned(cx, front);
                *moved += (before - front.len()) as u64;
                ready!(r)?;
                self.owned.pop_front();
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Write what was read and not written yet: the rest of the buffer (then returned to the
    /// pool), then the queued chunks.
    fn write_held<W: Resettable>(
        &mut self,
        cx: &mut Context<'_>,
        w: &mut W,
        moved: &mut u64,
    ) -> Poll<Result<(), PumpError>> {
        if let Some(buf) = &self.buf {
            while self.pos < self.len {
                let n = ready!(Pin::new(&mut *w).poll_write(cx, &buf[self.pos..self.len])).map_err(wr)?;
                if n == 0 {
                    return Poll::Ready(Err(wr(io::ErrorKind::WriteZero.into())));
                }
                self.pos += n;
                *moved += n as u64;
                self.need_flush = true;
            }
            if let Some(b) = self.buf.take() {
                give_buf(b);
            }
        }
        if !self.owned.is_empty() {
            self.need_flush = true;
            ready!(self.write_owned(cx, w, moved)).map_err(wr)?;
        }
        Poll::Ready(Ok(()))
    }

    /// From a reader that hands chunks by value: gather what is ready now, up to a relay
    /// buffer's worth, for one write; note its end or its error.
    fn gather_owned<R: Resettable>(&mut self, cx: &mut Context<'_>, r: &mut R) {
        let mut gathered = 0;
        loop {
            match r.poll_read_owned(cx) {
                Poll::Pending => break,
                Poll::Ready(Err(e)) => {
                    self.read_err = Some(e);
                    break;
                }
                Poll::Ready(Ok(chunk)) if chunk.is_empty() => {
                    self.eof = true;
                    break;
                }
                Poll::Ready(Ok(chunk)) => {
                    gathered += chunk.len();
                    self.owned.push_back(chunk);
                    if gathered >= BUF_SIZE || self.owned.len() >= MAX_GATHER {
                        break;
                    }
                }
            }
        }
    }
}

impl<R: Resettable, W: Resettable> Pump<R, W> for BufPump {
    fn poll_pump(
        &mut self,
        cx: &mut Context<'_>,
        r: &mut R,
        w: &mut W,
        moved: &mut u64,
    ) -> Poll<Result<(), PumpError>> {
        loop {
            if self.done {
                return Poll::Ready(Ok(()));
            }
            ready!(self.write_held(cx, w, moved))?;
            if let Some(e) = self.read_err.take() {
                return Poll::Ready(Err(rd(e)));
            }
            if self.eof {
                if self.need_flush {
                    ready!(Pin::new(&mut *w).poll_flush(cx)).map_err(wr)?;
                    self.need_flush = false;
                }
                ready!(Pin::new(&mut *w).poll_shutdown(cx)).map_err(wr)?;
                self.done = true;
                continue;
            }
            if r.reads_owned() {
                self.gather_owned(cx, r);
                if self.owned.is_empty() && !self.eof && self.read_err.is_none() {
                    return self.idle(cx, w);
                }
                continue;
            }
            if let Some(size) = w.owned_chunk() {
                let mut chunk = BytesMut::with_capacity(size);
                match tokio_util::io::poll_read_buf(Pin::new(&mut *r), cx, &mut chunk) {
                    Poll::Pending => return self.idle(cx, w),
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(rd(e))),
                    Poll::Ready(Ok(0)) => self.eof = true,
                    Poll::Ready(Ok(n)) if n < OWNED_MIN => self.owned.push_back(Bytes::copy_from_slice(&chunk)),
                    Poll::Ready(Ok(_)) => self.owned.push_back(chunk.freeze()),
                }
                continue;
            }
            let mut buf = take_buf();
            let mut rb = ReadBuf::new(&mut buf);
            match Pin::new(&mut *r).poll_read(cx, &mut rb) {
                Poll::Pending => {
                    give_buf(buf);
                    return self.idle(cx, w);
                }
                Poll::Ready(Err(e)) => {
                    give_buf(buf);
                    return Poll::Ready(Err(rd(e)));
                }
                Poll::Ready(Ok(())) => {
                    let n = rb.filled().len();
                    if n == 0 {
                        give_buf(buf);
                        self.eof = true;
                    } else {
                        self.buf = Some(buf);
                        self.pos = 0;
                        self.len = n;
                    }
                }
            }
        }
    }
}

/// Zero-copy pump between two TCP sockets through a pooled pipe.
#[derive(Default)]
pub struct SplicePump {
    pipe: Option<Pipe>,
    in_pipe: usize,
    eof: bool,
    done: bool,
}

fn would_block(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock
}

impl Pump<TcpStream, TcpStream> for SplicePump {
    fn poll_pump(
        &mut self,
        cx: &mut Context<'_>,
        r: &mut TcpStream,
        w: &mut TcpStream,
        moved: &mut u64,
    ) -> Poll<Result<(), PumpError>> {
        loop {
            if self.done {
                return Poll::Ready(Ok(()));
            }
            while self.in_pipe > 0 {
                ready!(w.poll_write_ready(cx)).map_err(wr)?;
                let pipe = self.pipe.as_ref().expect("bytes in pipe imply a pipe");
                let (pr, wfd) = (pipe.read.as_raw_fd(), w.as_raw_fd());
                match w.try_io(Interest::WRITABLE, || splice(pr, wfd, self.in_pipe)) {
                    Ok(0) => return Poll::Ready(Err(wr(io::ErrorKind::WriteZero.into()))),
                    Ok(n) => {
                        self.in_pipe -= n;
                        *moved += n as u64;
                    }
                    Err(e) if would_block(&e) => continue,
                    Err(e) => return Poll::Ready(Err(wr(e))),
                }
            }
            if let Some(p) = self.pipe.take() {
                give_pipe(p);
            }
            if self.eof {
                SockRef::from(&*w).shutdown(std::net::Shutdown::Write).or_else(ignore_not_connected).map_err(wr)?;
                self.done = true;
                continue;
            }
            ready!(r.poll_read_ready(cx)).map_err(rd)?;
            let pipe = take_pipe().map_err(rd)?;
            let (rfd, pw) = (r.as_raw_fd(), pipe.write.as_raw_fd());
            match r.try_io(Interest::READABLE, || splice(rfd, pw, PIPE_SIZE)) {
                Ok(0) => {
                    give_pipe(pipe);
                    self.eof = true;
                }
                Ok(n) => {
                    self.in_pipe = n;
                    self.pipe = Some(pipe);
                }
                Err(e) if would_block(&e) => give_pipe(pipe),
                Err(e) => {
                    give_pipe(pipe);
                    return Poll::Ready(Err(rd(e)));
                }
            }
        }
    }
}

/// A peer that already closed both ways makes shutdown fail with ENOTCONN; nothing is lost.
fn ignore_not_connected(e: io::Error) -> io::Result<()> {
    if e.kind() == io::ErrorKind::NotConnected { Ok(()) } else { Err(e) }
}

fn is_reset(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted | io::ErrorKind::BrokenPipe)
}

/// A relay between a client stream and an upstream stream. Poll it to completion; afterwards
/// [`Transfer::counts`] and [`Transfer::into_inner`] give the bytes and the streams back (for
/// example to pass a reset on to the other side).
pub struct Transfer<C, U, P> {
    client: C,
    upstream: U,
    up: P,
    down: P,
    up_done: bool,
    down_done: bool,
    sent_up: u64,
    sent_down: u64,
    meters: Meters,
    idle: Duration,
    last_activity: Instant,
    timer: Pin<Box<Sleep>>,
}

/// Relay between any two streams with the buffered pump.
pub fn transfer<C, U>(client: C, upstream: U, idle: Duration, meters: Meters) -> Transfer<C, U, BufPump>
where
    C: Resettable,
    U: Resettable,
{
    Transfer::new(client, upstream, idle, meters)
}

/// Relay between two TCP sockets with splice(2).
pub fn transfer_tcp(
    client: TcpStream,
    upstream: TcpStream,
    idle: Duration,
    meters: Meters,
) -> Transfer<TcpStream, TcpStream, SplicePump> {
    Transfer::new(client, upstream, idle, meters)
}

impl<C, U, P> Transfer<C, U, P>
where
    P: Pump<C, U> + Pump<U, C>,
{
    fn new(client: C, upstream: U, idle: Duration, meters: Meters) -> Self {
        let now = Instant::now();
        Self {
            client,
            upstream,
            up: P::default(),
            down: P::default(),
            up_done: false,
            down_done: false,
            sent_up: 0,
            sent_down: 0,
            meters,
            idle,
            last_activity: now,
            timer: Box::pin(tokio::time::sleep_until(now + idle)),
        }
    }

    /// Bytes written to the upstream and to the client so far.
    pub fn counts(&self) -> (u64, u64) {
        (self.sent_up, self.sent_down)
    }

    /// Both ends, to close them once the relay is over.
    pub fn ends_mut(&mut self) -> (&mut C, &mut U) {
        (&mut self.client, &mut self.upstream)
    }

    pub fn into_inner(self) -> (C, U) {
        (self.client, self.upstream)
    }

    pub fn client(&self) -> &C {
        &self.client
    }

    pub fn upstream(&self) -> &U {
        &self.upstream
    }
}

/// How a pump's failure ends the relay: a reset or an error of the side that failed, the
/// reader (`reader`) or the other one.
fn fail(e: PumpError, reader: Side) -> Outcome {
    let side = if e.on_reader {
        reader
    } else {
        match reader {
            Side::Client => Side::Upstream,
            Side::Upstream => Side::Client,
        }
    };
    if is_reset(&e.err) { Outcome::Reset(side) } else { Outcome::Error(side, e.err) }
}

/// One direction of a [`Transfer`]: whether it is done, what it moved, and its meter.
struct Direction<'a> {
    done: &'a mut bool,
    sent: &'a mut u64,
    meter: Option<&'a IntCounter>,
}

impl Direction<'_> {
    /// Pump from `r` (the `reader` side) to `w` once, unless done; the outcome if it failed.
    fn step<R, W, P: Pump<R, W>>(
        self,
        cx: &mut Context<'_>,
        pump: &mut P,
        r: &mut R,
        w: &mut W,
        reader: Side,
    ) -> Option<Outcome> {
        if *self.done {
            return None;
        }
        let mut n = 0;
        let result = pump.poll_pump(cx, r, w, &mut n);
        *self.sent += n;
        if let Some(m) = self.meter {
            m.inc_by(n);
        }
        match result {
            Poll::Ready(Ok(())) => *self.done = true,
            Poll::Ready(Err(e)) => return Some(fail(e, reader)),
            Poll::Pending => {}
        }
        None
    }
}

impl<C, U, P> Future for Transfer<C, U, P>
where
    C: Unpin,
    U: Unpin,
    P: Pump<C, U> + Pump<U, C>,
{
    type Output = Outcome;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Outcome> {
        let this = self.get_mut();
        let before = this.sent_up + this.sent_down;
        let up =
            Direction { done: &mut this.up_done, sent: &mut this.sent_up, meter: this.meters.to_upstream.as_ref() };
        if let Some(failed) = up.step(cx, &mut this.up, &mut this.client, &mut this.upstream, Side::Client) {
            return Poll::Ready(failed);
        }
        let down =
            Direction { done: &mut this.down_done, sent: &mut this.sent_down, meter: this.meters.to_client.as_ref() };
        if let Some(failed) = down.step(cx, &mut this.down, &mut this.upstream, &mut this.client, Side::Upstream) {
            return Poll::Ready(failed);
        }
        if this.up_done && this.down_done {
            return Poll::Ready(Outcome::Closed);
        }
        if this.sent_up + this.sent_down != before {
            this.last_activity = Instant::now();
        }
        // The timer is armed for the idle period after the last activity; when it fires early
        // (activity since it was set) it is simply pushed forward. No timer work per byte.
        loop {
            if this.timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            let deadline = this.last_activity + this.idle;
            if Instant::now() >= deadline {
                return Poll::Ready(Outcome::Idle);
            }
            this.timer.as_mut().reset(deadline);
        }
    }
}

#[cfg(test)]
mod tests;
