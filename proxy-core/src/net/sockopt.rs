//! Socket options that neither std nor socket2 sets: UDP GRO, through setsockopt(2) (the `unsafe` is isolated here).
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// Turn UDP generic receive offload on or off on `fd`. Off, every read returns one datagram,
/// never a run of up to 64 coalesced ones.
pub fn set_udp_gro(fd: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    let value = libc::c_int::from(on);
    // SAFETY: the descriptor is borrowed, so it is open for the duration of the call; the option
    // value points at a live c_int and its length is that of a c_int, as setsockopt(2) requires
    // for SOL_UDP/UDP_GRO. The kernel only reads through the pointer.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_UDP,
            libc::UDP_GRO,
            (&raw const value).cast::<libc::c_void>(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn gro(sock: &std::net::UdpSocket) -> libc::c_int {
        let mut v: libc::c_int = -1;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: as in set_udp_gro; `v` and `len` are live and writable for the kernel's answer.
        let rc = unsafe {
            libc::getsockopt(
                sock.as_raw_fd(),
                libc::SOL_UDP,
                libc::UDP_GRO,
                (&raw mut v).cast::<libc::c_void>(),
                &raw mut len,
            )
        };
        assert_eq!(rc, 0, "{}", io::Error::last_os_error());
        v
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
    fn a_tcp_socket_is_refused_with_the_kernels_error() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        assert!(set_udp_gro(l.as_fd(), false).is_err());
    }
}
