//! Sockets and what admits a connection: listening sockets (socket2 options), upstream connects with timeout and DNS re-resolution, the accept loop, the pre-routing budget, tenants' shares and load counters.

pub mod accept;
pub mod admission;
pub mod backoff;
pub mod balance;
pub mod guard;
pub mod ids;
pub mod pending;
pub mod share;
pub mod sockopt;

use crate::obs::metrics;
use seedgate_config::HostPort;
use socket2::{Domain, Protocol, SockRef, Socket, TcpKeepalive, Type};
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};

/// Accept backlog: above the kernel default so connection bursts queue instead of being dropped
/// (the kernel caps it at `net.core.somaxconn`).
pub const BACKLOG: i32 = 4096;

/// Keepalive on proxied sockets so a vanished peer is noticed even when idle timeouts are long.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(60);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_RETRIES: u32 = 6;

/// Bind a TCP listener with SO_REUSEADDR (restart while old connections sit in TIME_WAIT) and a
/// large backlog. TCP_NODELAY and keepalive are set on the listening socket: Linux copies them
/// to every accepted socket, which saves five setsockopt calls per connection.
/// Must be called inside a tokio runtime.
pub fn bind_tcp(addr: SocketAddr) -> io::Result<TcpListener> {
    bind_tcp_with(addr, false)
}

/// `n` listening sockets on one address, for one accept loop each: with `n` above 1 they share
/// the address with `SO_REUSEPORT`, and the kernel spreads new connections over them by their
/// addresses, so that each of a runtime's workers accepts its own and no one socket's queue or
/// accept loop carries all of them. Port 0 is resolved by the first socket; the others take
/// the port it got. Must be called inside a tokio runtime.
pub fn bind_tcp_shards(addr: SocketAddr, n: usize) -> io::Result<Vec<TcpListener>> {
    if n <= 1 {
        return Ok(vec![bind_tcp(addr)?]);
    }
    let first = bind_tcp_with(addr, true)?;
    let at = first.local_addr()?;
    let mut v = vec![first];
    for _ in 1..n {
        v.push(bind_tcp_with(at, true)?);
    }
    Ok(v)
}

fn bind_tcp_with(addr: SocketAddr, reuse_port: bool) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    if reuse_port {
        socket.set_reuse_port(true)?;
    }
    socket.set_tcp_nodelay(true)?;
    socket.set_tcp_keepalive(&keepalive())?;
    if addr.is_ipv6() {
        socket.set_only_v6(false).ok();
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    TcpListener::from_std(socket.into())
}

/// Resolve `host:port` to one socket address: IP literals without a lookup, names through
/// tokio's resolver (on a blocking thread, never a runtime worker). Listen addresses use it too.
/// Ask for `want` bytes of UDP send and receive buffer; warn (once per `warned`, every time
/// without one) when the kernel grants less, which it does silently above `net.core.rmem_max` /
/// `wmem_max`. `key` names the setting the operator asked with.
pub fn set_udp_buffers(s: &Socket, want: usize, what: &str, key: &str, warned: Option<&std::sync::atomic::AtomicBool>) {
    let _ = s.set_recv_buffer_size(want);
    let _ = s.set_send_buffer_size(want);
    // Linux reports twice what it granted (it counts its bookkeeping overhead in), capped at
    // twice rmem_max/wmem_max: halve it to compare with what was asked.
    let granted = |v: usize| if cfg!(target_os = "linux") { v / 2 } else { v };
    let rcv = granted(s.recv_buffer_size().unwrap_or(0));
    let snd = granted(s.send_buffer_size().unwrap_or(0));
    if (rcv < want || snd < want) && !warned.is_some_and(|w| w.swap(true, std::sync::atomic::Ordering::Relaxed)) {
        tracing::warn!(
            socket = what,
            asked = want,
            rcvbuf = rcv,
            sndbuf = snd,
            "the kernel capped the UDP socket buffers below {key}; raise net.core.rmem_max and net.core.wmem_max"
        );
    }
}

/// A non-blocking UDP socket bound to `addr` (dual-stack for `[::]`), its buffers asked for as
/// [`set_udp_buffers`] does; for tokio (`UdpSocket::from_std`) or quinn (`Endpoint::new`).
pub fn bind_udp(
    addr: SocketAddr,
    buffer: usize,
    what: &str,
    key: &str,
    warned: Option<&std::sync::atomic::AtomicBool>,
) -> io::Result<std::net::UdpSocket> {
    let s = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() {
        s.set_only_v6(false).ok();
    }
    set_udp_buffers(&s, buffer, what, key, warned);
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    Ok(s.into())
}

pub async fn resolve_one(hp: &HostPort) -> io::Result<SocketAddr> {
    resolve(hp)
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("{} resolved to no address", hp.host)))
}

/// Resolve `host:port` freshly (names are looked up on every call, never cached here, so a DNS
/// change is followed by the next connection).
pub async fn resolve(hp: &HostPort) -> io::Result<Vec<SocketAddr>> {
    if let Some(sa) = hp.socket_addr() {
        return Ok(vec![sa]);
    }
    Ok(tokio::net::lookup_host((hp.host.as_str(), hp.port)).await?.collect())
}

/// Below this round trip a path is local (loopback, a LAN, one zone): what a tunnel session does
/// for a WAN (a grown h2 window, the in-flight bound, the unsent limit, QUIC reading a queue from
/// its round trips) stays off there.
pub const LOCAL_RTT: Duration = Duration::from_millis(1);

fn keepalive() -> TcpKeepalive {
    TcpKeepalive::new().with_time(KEEPALIVE_IDLE).with_interval(KEEPALIVE_INTERVAL).with_retries(KEEPALIVE_RETRIES)
}

/// Options for a connected (upstream) socket; accepted sockets inherit them from a listener
/// made by [`bind_tcp`].
pub fn tune_stream(s: &TcpStream) {
    let _ = s.set_nodelay(true);
    let _ = SockRef::from(s).set_tcp_keepalive(&keepalive());
}

/// Options of a tunnel session's TCP socket, at either end (one function, so that every option
/// of that socket is set in one place).
/// - `patience`: `TCP_USER_TIMEOUT`, as the session's keepalive timeout: the kernel's own
///   patience (15 retransmissions, about 15 minutes) would keep a session its keepalive already
///   ended, and a shorter one would end it — and every stream on it — before that timeout.
/// - `probe_every`: `TCP_RTO_MAX_MS`, as the keepalive's PING interval (within the kernel's
///   1-120 s): the retransmission timeout backs off no further, so a quiet path is probed at
///   least that often, and the session (every stream on it) carries on within about that long of
///   the path's return. Backed off to the kernel's 120 s, it stayed silent seconds after a heal
///   that followed an outage of a few seconds. Kernels before 6.15 lack the option.
/// - `notsent_lowat`: `TCP_NOTSENT_LOWAT`, the most bytes the kernel holds unsent (`0`: no
///   limit): the socket then reports writable only below it, and what HTTP/2 has not yet written
///   stays in the session, where a stream that sends little (a keystroke, a round trip) goes out
///   next rather than behind everything bulk streams queued. Not on a local path (see
///   [`session_notsent_lowat`]).
pub fn tune_session_socket(s: &TcpStream, patience: Duration, probe_every: Duration, notsent_lowat: u32) {
    let sock = SockRef::from(s);
    let _ = sock.set_tcp_user_timeout(Some(patience));
    if let Err(e) = sockopt::set_tcp_rto_max(s.as_fd(), probe_every) {
        tracing::debug!(error = %e, "TCP_RTO_MAX_MS not set on a tunnel session's socket");
    }
    // Zero: the kernel has no sample of the path yet.
    let path_rtt = sockopt::tcp_path(s.as_fd()).ok().map(|p| p.min_rtt).filter(|rtt| !rtt.is_zero());
    set_notsent_lowat(&sock, session_notsent_lowat(path_rtt, notsent_lowat));
}

/// The `TCP_NOTSENT_LOWAT` of a session socket whose handshake took `path_rtt` (`None`: unknown):
/// `configured`, but none (`0`) on a local path, under [`LOCAL_RTT`]. There the kernel hands what
/// it holds to the peer within microseconds, so the limit shortens no wait behind bulk, and the
/// session pays for it in writes cut short and wake-ups: on loopback, bulk through 50 or 64
/// streams moved 5-10 % less with it.
pub fn session_notsent_lowat(path_rtt: Option<Duration>, configured: u32) -> u32 {
    match path_rtt {
        Some(rtt) if rtt < LOCAL_RTT => 0,
        _ => configured,
    }
}

fn set_notsent_lowat(sock: &SockRef<'_>, lowat: u32) {
    if lowat > 0
        && let Err(e) = sock.set_tcp_notsent_lowat(lowat)
    {
        tracing::debug!(error = %e, "TCP_NOTSENT_LOWAT not set on a tunnel session's socket");
    }
}

/// The connection metrics' series a listener or route has from the start (here, beside the
/// labels they take).
impl metrics::ConnMetrics {
    /// A listener's series at 0: connections open, accept errors by reason, and refusals by
    /// each of `refusals` (every reason it may refuse a connection for).
    pub fn listener_at_zero(&self, listener: &str, refusals: &[&str]) {
        let _ = self.active.with_label_values(&[listener]);
        metrics::at_zero(&self.accept_errors, &[&[listener], &accept::ACCEPT_ERROR_LABELS]);
        metrics::at_zero(&self.rejects, &[&[listener], refusals]);
    }

    /// A listener's relay series at 0: the time to its routing decision for each of
    /// `protocols`, and how its relays end, by each of `outcomes`.
    pub fn relays_at_zero(&self, listener: &str, protocols: &[&str], outcomes: &[&str]) {
        metrics::at_zero(&self.handshake_seconds, &[&[listener], protocols]);
        metrics::at_zero(&self.closes, &[&[listener], outcomes]);
    }

    /// A route's series at 0: its connections relayed (`ok`) and refused once routed (each of
    /// `refusals`), bytes both ways, upstream connects and their failures by reason. (A
    /// connection refused before it has a route counts under the route `-`.)
    pub fn route_at_zero(&self, listener: &str, route: &str, refusals: &[&str]) {
        metrics::at_zero(&self.connections, &[&[listener], &[route], &["ok"]]);
        metrics::at_zero(&self.connections, &[&[listener], &[route], refusals]);
        metrics::at_zero(&self.bytes, &[&[listener], &[route], &metrics::BYTE_DIRECTIONS]);
        let _ = self.connect_seconds.with_label_values(&[listener, route]);
        let failures = ConnectFailure::ALL.map(ConnectFailure::label);
        metrics::at_zero(&self.connect_failures, &[&[listener], &[route], &failures]);
    }
}

/// Why an upstream connect failed, as a metric label and an HTTP status class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectFailure {
    Timeout,
    Refused,
    Unreachable,
    Resolve,
    Other,
}

impl ConnectFailure {
    /// Every failure, in the order of their labels.
    pub const ALL: [ConnectFailure; 5] = [Self::Timeout, Self::Refused, Self::Unreachable, Self::Resolve, Self::Other];

    pub fn classify(e: &io::Error) -> Self {
        match e.kind() {
            io::ErrorKind::TimedOut => Self::Timeout,
            io::ErrorKind::ConnectionRefused => Self::Refused,
            io::ErrorKind::HostUnreachable | io::ErrorKind::NetworkUnreachable => Self::Unreachable,
            io::ErrorKind::NotFound => Self::Resolve,
            _ => match e.raw_os_error() {
                Some(libc::EHOSTUNREACH) | Some(libc::ENETUNREACH) => Self::Unreachable,
                _ => Self::Other,
            },
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Self::Timeout => "connect_timeout",
            Self::Refused => "connect_refused",
            Self::Unreachable => "unreachable",
            Self::Resolve => "resolve_failed",
            Self::Other => "connect_error",
        }
    }
}

/// Connect to one address with a timeout and the standard socket options.
pub async fn connect_addr(addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    let stream = match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
        Ok(r) => r?,
        Err(_) => {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("connect to {addr} timed out after {timeout:?}"),
            ));
        }
    };
    tune_stream(&stream);
    Ok(stream)
}

/// Connect to `addrs` in turn, wrapping around, for at most `attempts` attempts in total, each
/// bounded by `timeout`. Nothing has been written when an attempt fails, so moving on is always
/// safe. `on_failure` hears about every failed attempt (for metrics and logs).
pub async fn connect_in_turn(
    addrs: &[SocketAddr],
    attempts: usize,
    timeout: Duration,
    mut on_failure: impl FnMut(SocketAddr, &io::Error),
) -> io::Result<(TcpStream, SocketAddr)> {
    // The error is made only when there is one (an eager one cost three allocations a connect).
    let mut last = None;
    for &addr in addrs.iter().cycle().take(attempts) {
        match connect_addr(addr, timeout).await {
            Ok(s) => return Ok((s, addr)),
            Err(e) => {
                on_failure(addr, &e);
                last = Some(e);
            }
        }
    }
    Err(last.unwrap_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no address to connect to")))
}

/// Resolve `hp` (bounded by `timeout`) and connect to its addresses in turn, each attempt
/// bounded by `timeout`. An IP literal is connected to at once.
pub async fn connect_host(hp: &HostPort, timeout: Duration) -> io::Result<(TcpStream, SocketAddr)> {
    if let Some(addr) = hp.socket_addr() {
        return connect_in_turn(&[addr], 1, timeout, |_, _| {}).await;
    }
    let addrs = resolve_within(hp, timeout).await?;
    connect_in_turn(&addrs, addrs.len(), timeout, |_, _| {}).await
}

/// [`resolve`] bounded by `timeout`; an empty answer is an error.
pub async fn resolve_within(hp: &HostPort, timeout: Duration) -> io::Result<Vec<SocketAddr>> {
    match tokio::time::timeout(timeout, resolve(hp)).await {
        Ok(Ok(addrs)) if addrs.is_empty() => {
            Err(io::Error::new(io::ErrorKind::NotFound, format!("{} resolved to no address", hp.host)))
        }
        Ok(r) => r,
        Err(_) => {
            Err(io::Error::new(io::ErrorKind::TimedOut, format!("resolving {} timed out after {timeout:?}", hp.host)))
        }
    }
}

/// Close `s` with a TCP RST instead of a FIN, to pass a peer's reset on.
pub fn reset_on_close(s: &TcpStream) {
    let _ = SockRef::from(s).set_linger(Some(Duration::ZERO));
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    async fn refused_addr() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap()
        // dropped: nothing listens there any more, so a connect is refused at once
    }

    /// A tunnel session's socket: the kernel's patience is the keepalive timeout, its
    /// retransmission back-off stops at the PING interval (where the kernel has the option).
    #[tokio::test]
    async fn a_session_socket_gives_up_with_the_keepalive_and_probes_at_its_pace() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let default = sockopt::tcp_rto_max(c.as_fd());
        tune_session_socket(&c, Duration::from_secs(60), Duration::from_millis(1500), 0);
        assert_eq!(SockRef::from(&c).tcp_user_timeout().unwrap(), Some(Duration::from_secs(60)));
        match default {
            Ok(_) => assert_eq!(sockopt::tcp_rto_max(c.as_fd()).unwrap(), Duration::from_millis(1500)),
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::ENOPROTOOPT), "{e}"),
        }
    }

    /// A session socket on a local path gets no `TCP_NOTSENT_LOWAT`, whatever the setting; on a
    /// longer one it gets the setting (a handshake's round trip stands in for the path here, as
    /// loopback has no other).
    #[tokio::test]
    async fn a_session_socket_limits_its_unsent_bytes_only_on_a_path_longer_than_local() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (a, _) = l.accept().await.unwrap();
        let lowat = |s: &TcpStream| SockRef::from(s).tcp_notsent_lowat().unwrap();
        let unset = lowat(&c);
        for s in [&c, &a] {
            tune_session_socket(s, Duration::from_secs(60), Duration::from_millis(1500), 128 * 1024);
            assert_eq!(lowat(s), unset, "loopback is a local path");
        }
        set_notsent_lowat(&SockRef::from(&c), session_notsent_lowat(Some(Duration::from_millis(50)), 128 * 1024));
        assert_eq!(lowat(&c), 128 * 1024);
    }

    #[test]
    fn the_unsent_limit_of_a_session_socket_by_its_path() {
        let ms = Duration::from_millis;
        for (rtt, configured, want) in [
            (Some(Duration::from_micros(40)), 131_072, 0),
            (Some(ms(1) - Duration::from_nanos(1)), 131_072, 0),
            (Some(ms(1)), 131_072, 131_072),
            (Some(ms(150)), 16_384, 16_384),
            (Some(ms(150)), 0, 0),
            // No round trip known: the setting, as on a long path.
            (None, 131_072, 131_072),
        ] {
            assert_eq!(session_notsent_lowat(rtt, configured), want, "{rtt:?} {configured}");
        }
    }

    /// Four sockets on one port: each accepts connections of its own, and a port in use by a
    /// socket without `SO_REUSEPORT` is still refused.
    #[tokio::test]
    async fn shards_share_one_port_and_each_accepts() {
        let shards = bind_tcp_shards("127.0.0.1:0".parse().unwrap(), 4).unwrap();
        let at = shards[0].local_addr().unwrap();
        assert!(at.port() != 0 && shards.iter().all(|s| s.local_addr().unwrap() == at));
        let mut clients = Vec::new();
        for _ in 0..64 {
            clients.push(TcpStream::connect(at).await.unwrap());
        }
        let mut per_shard = Vec::new();
        for s in &shards {
            let mut n = 0;
            // Bounded: the 64 connections are queued already; a short wait ends each shard.
            while let Ok(Ok(_)) = tokio::time::timeout(Duration::from_millis(100), s.accept()).await {
                n += 1;
            }
            per_shard.push(n);
        }
        assert_eq!(per_shard.iter().sum::<usize>(), 64, "{per_shard:?}");
        assert!(per_shard.iter().filter(|&&n| n > 0).count() >= 2, "spread over the shards: {per_shard:?}");
        let plain = bind_tcp("127.0.0.1:0".parse().unwrap()).unwrap();
        let taken = plain.local_addr().unwrap();
        assert!(bind_tcp_shards(taken, 2).is_err(), "a port held without SO_REUSEPORT is not shared");
        assert_eq!(bind_tcp_shards("127.0.0.1:0".parse().unwrap(), 1).unwrap().len(), 1);
    }

    #[tokio::test]
    async fn retry_moves_to_the_next_address() {
        let dead = refused_addr().await;
        let live = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let live_addr = live.local_addr().unwrap();
        let mut failed = Vec::new();
        let (_s, used) = connect_in_turn(&[dead, live_addr], 3, Duration::from_secs(5), |a, e| {
            failed.push((a, ConnectFailure::classify(e).label()))
        })
        .await
        .unwrap();
        assert_eq!(used, live_addr);
        assert_eq!(failed, vec![(dead, "connect_refused")]);
    }

    #[tokio::test]
    async fn retries_bound_the_attempts_and_wrap_around() {
        let dead = refused_addr().await;
        let mut n = 0;
        let e = connect_in_turn(&[dead], 3, Duration::from_secs(5), |_, _| n += 1).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused);
        assert_eq!(n, 3, "one address, three attempts");

        let live = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut n = 0;
        let r = connect_in_turn(&[dead, live.local_addr().unwrap()], 1, Duration::from_secs(5), |_, _| n += 1).await;
        assert!(r.is_err(), "a single attempt never reaches the second address");
        assert_eq!(n, 1);
        assert!(connect_in_turn(&[], 3, Duration::from_secs(1), |_, _| {}).await.is_err());
    }
}
