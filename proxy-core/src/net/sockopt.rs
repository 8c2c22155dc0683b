//! Socket options and state that neither std nor socket2 reaches: UDP GRO, a TCP socket's path and unacknowledged bytes, its pacing and retransmission back-off (the `unsafe` of setsockopt(2), getsockopt(2) and ioctl(2) is isolated here).
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::Duration;

/// Option values: plain data, valid for every bit pattern, so the kernel may fill one.
///
/// # Safety
/// Every bit pattern of the type's size is a valid value of it (integers, and structs of them).
unsafe trait Plain: Copy {}
// SAFETY: integers.
unsafe impl Plain for libc::c_int {}
// SAFETY: integers.
unsafe impl Plain for u64 {}
// SAFETY: tcp_info is a struct of integers only.
unsafe impl Plain for libc::tcp_info {}

/// setsockopt(2) of `fd` with a value of type `T`, which must be the type the option reads
/// (`c_int`, or `u64` where the kernel reads an unsigned long on 64-bit targets).
fn set_opt<T: Plain>(fd: BorrowedFd<'_>, level: libc::c_int, name: libc::c_int, value: T) -> io::Result<()> {
    // SAFETY: the descriptor is borrowed, so it is open for the duration of the call; the value
    // points at a live `T` and the length is that of a `T`, the type the option reads (the
    // callers' contract). The kernel only reads through the pointer.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&raw const value).cast::<libc::c_void>(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// getsockopt(2) of `fd` into `value` (its type must be the one the option writes; what the
/// kernel does not fill keeps the value given).
fn get_opt<T: Plain>(fd: BorrowedFd<'_>, level: libc::c_int, name: libc::c_int, mut value: T) -> io::Result<T> {
    let mut len = std::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: the descriptor is borrowed, so open for the call; `value` and `len` are live and
    // writable, `len` says how much of `value` the kernel may fill (it fills at most that), and
    // any bytes it writes make a valid `T` (`Plain`).
    let rc =
        unsafe { libc::getsockopt(fd.as_raw_fd(), level, name, (&raw mut value).cast::<libc::c_void>(), &raw mut len) };
    if rc == 0 { Ok(value) } else { Err(io::Error::last_os_error()) }
}

/// Turn UDP generic receive offload on or off on `fd`. Off, every read returns one datagram,
/// never a run of up to 64 coalesced ones.
pub fn set_udp_gro(fd: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    set_opt(fd, libc::SOL_UDP, libc::UDP_GRO, libc::c_int::from(on))
}

/// What `TCP_INFO` says of a TCP socket's path; zero where the kernel has nothing yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpPath {
    pub srtt: Duration,
    pub min_rtt: Duration,
    /// The latest delivery-rate sample, bytes a second.
    pub delivery_rate: u64,
    /// Of the unacknowledged bytes, those no longer in the network: selectively acknowledged,
    /// or counted lost and not yet sent again (segments times the sending MSS).
    pub left_network: u64,
    /// Time since the last acknowledgement came, and since data was last sent (millisecond
    /// resolution).
    pub since_ack: Duration,
    pub since_sent: Duration,
    /// Whether the socket is recovering from a loss or a timeout (its congestion state is not
    /// open): its congestion control's state then holds what it needs to recover.
    pub recovering: bool,
}

/// What `TCP_INFO` says of a TCP socket: its round trips, delivery rate, holes and last activity.
pub fn tcp_path(fd: BorrowedFd<'_>) -> io::Result<TcpPath> {
    // SAFETY: tcp_info is plain old data (integers only): all zeroes is a valid value.
    let zero: libc::tcp_info = unsafe { std::mem::zeroed() };
    let info = get_opt(fd, libc::IPPROTO_TCP, libc::TCP_INFO, zero)?;
    // The minimum is all ones until the first sample.
    let min = if info.tcpi_min_rtt == u32::MAX { 0 } else { info.tcpi_min_rtt };
    Ok(TcpPath {
        srtt: Duration::from_micros(info.tcpi_rtt.into()),
        min_rtt: Duration::from_micros(min.into()),
        delivery_rate: info.tcpi_delivery_rate,
        left_network: u64::from((info.tcpi_sacked + info.tcpi_lost).saturating_sub(info.tcpi_retrans))
            * u64::from(info.tcpi_snd_mss),
        since_ack: Duration::from_millis(info.tcpi_last_ack_recv.into()),
        since_sent: Duration::from_millis(info.tcpi_last_data_sent.into()),
        // TCP_CA_Open is 0; Disorder, CWR, Recovery and Loss follow it.
        recovering: info.tcpi_ca_state != 0,
    })
}

/// `SO_MAX_PACING_RATE` in the kernel's generic socket options (x86-64, arm64; the libc crate
/// does not export it for glibc targets).
const SO_MAX_PACING_RATE: libc::c_int = 47;

/// The fastest a socket's packets may leave, in bytes a second (`SO_MAX_PACING_RATE`; it also
/// turns on TCP's own pacing where the congestion control did not); `u64::MAX`: no limit.
pub fn set_max_pacing_rate(fd: BorrowedFd<'_>, bytes_per_second: u64) -> io::Result<()> {
    set_opt(fd, libc::SOL_SOCKET, SO_MAX_PACING_RATE, bytes_per_second)
}

/// `TCP_RTO_MAX_MS` (Linux 6.15 and later; the libc crate does not export it).
const TCP_RTO_MAX_MS: libc::c_int = 44;

/// The range of `TCP_RTO_MAX_MS` the kernel accepts.
pub const TCP_RTO_MAX_RANGE: std::ops::RangeInclusive<Duration> = Duration::from_secs(1)..=Duration::from_secs(120);

/// The longest a TCP socket's retransmission timeout may back off to (`TCP_RTO_MAX_MS`; the
/// kernel's default is 120 s), clamped to the range the kernel takes ([`TCP_RTO_MAX_RANGE`]).
/// A kernel without the option answers `ENOPROTOOPT`.
pub fn set_tcp_rto_max(fd: BorrowedFd<'_>, max: Duration) -> io::Result<()> {
    let max = max.clamp(*TCP_RTO_MAX_RANGE.start(), *TCP_RTO_MAX_RANGE.end());
    let ms = libc::c_int::try_from(max.as_millis()).unwrap_or(libc::c_int::MAX);
    set_opt(fd, libc::IPPROTO_TCP, TCP_RTO_MAX_MS, ms)
}

/// A TCP socket's bound on its retransmission timeout ([`set_tcp_rto_max`]).
pub fn tcp_rto_max(fd: BorrowedFd<'_>) -> io::Result<Duration> {
    let ms: libc::c_int = get_opt(fd, libc::IPPROTO_TCP, TCP_RTO_MAX_MS, 0)?;
    Ok(Duration::from_millis(u64::try_from(ms).unwrap_or(0)))
}

/// Bytes written to a TCP socket and not yet acknowledged by its peer, sent or not (`SIOCOUTQ`).
pub fn tcp_unacknowledged(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut n: libc::c_int = 0;
    // SAFETY: the descriptor is borrowed, so open for the call; SIOCOUTQ (TIOCOUTQ) writes one
    // c_int through the pointer, which points at a live one.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCOUTQ, &raw mut n) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(u64::try_from(n).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn gro(sock: &std::net::UdpSocket) -> libc::c_int {
        get_opt(sock.as_fd(), libc::SOL_UDP, libc::UDP_GRO, -1).unwrap()
    }

    fn pacing(sock: &std::net::TcpStream) -> u64 {
        get_opt(sock.as_fd(), libc::SOL_SOCKET, SO_MAX_PACING_RATE, 0).unwrap()
    }

    #[test]
    fn the_retransmission_back_off_is_bounded_within_the_range_the_kernel_takes() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        if let Err(e) = tcp_rto_max(c.as_fd()) {
            // A kernel before 6.15: the setter says so too, and callers go on without it.
            assert_eq!(e.raw_os_error(), Some(libc::ENOPROTOOPT), "{e}");
            let e = set_tcp_rto_max(c.as_fd(), Duration::from_secs(2)).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::ENOPROTOOPT), "{e}");
            return;
        }
        set_tcp_rto_max(c.as_fd(), Duration::from_millis(2500)).unwrap();
        assert_eq!(tcp_rto_max(c.as_fd()).unwrap(), Duration::from_millis(2500));
        // Below the kernel's floor and above its ceiling: clamped, not refused.
        set_tcp_rto_max(c.as_fd(), Duration::from_millis(10)).unwrap();
        assert_eq!(tcp_rto_max(c.as_fd()).unwrap(), Duration::from_secs(1));
        set_tcp_rto_max(c.as_fd(), Duration::from_secs(600)).unwrap();
        assert_eq!(tcp_rto_max(c.as_fd()).unwrap(), Duration::from_secs(120));
    }

    #[test]
    fn gro_turns_on_and_off() {
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        set_udp_gro(sock.as_fd(), true).unwrap();
        assert_ne!(gro(&sock), 0);
        set_udp_gro(sock.as_fd(), false).unwrap();
        assert_eq!(gro(&sock), 0);
    }

    #[test]
    fn a_connected_tcp_socket_tells_its_round_trips_and_what_its_peer_has_not_acknowledged() {
        use std::io::Write;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (_peer, _) = l.accept().unwrap();
        let p = tcp_path(c.as_fd()).unwrap();
        assert!(p.min_rtt > Duration::ZERO && p.min_rtt < Duration::from_secs(1), "{p:?}");
        assert!(p.srtt >= p.min_rtt, "{p:?}");
        assert!(!p.recovering, "an idle loopback connection is open: {p:?}");
        c.write_all(b"x").unwrap();
        // Loopback acknowledges within microseconds: bounded wait for it.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while tcp_unacknowledged(c.as_fd()).unwrap() != 0 {
            assert!(std::time::Instant::now() < deadline, "one byte never acknowledged");
            std::thread::yield_now();
        }
        assert!(tcp_unacknowledged(l.as_fd()).is_err() || tcp_unacknowledged(l.as_fd()).unwrap() == 0);
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        assert!(tcp_path(udp.as_fd()).is_err(), "not a TCP socket");
        set_max_pacing_rate(c.as_fd(), 12_500_000).unwrap();
        assert_eq!(pacing(&c), 12_500_000);
        set_max_pacing_rate(c.as_fd(), u64::MAX).unwrap();
        assert_eq!(pacing(&c), u64::MAX);
    }

    #[test]
    fn a_tcp_socket_is_refused_with_the_kernels_error() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        assert!(set_udp_gro(l.as_fd(), false).is_err());
    }
}
