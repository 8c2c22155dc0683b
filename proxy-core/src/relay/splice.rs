//! Zero-copy relaying: thin `unsafe` wrappers over pipe2(2), splice(2) and fcntl(2).
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// A non-blocking pipe used as the in-kernel buffer between two sockets.
pub(super) struct Pipe {
    pub read: OwnedFd,
    pub write: OwnedFd,
}

impl Pipe {
    pub(super) fn new() -> io::Result<Self> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: `fds` is a valid, writable array of two c_ints, as pipe2 requires; on success
        // the kernel stores two new descriptors there that nothing else owns, so wrapping them in
        // OwnedFd (which closes them exactly once) is sound.
        let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: see above; each fd is owned exactly once.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        Ok(Self { read, write })
    }

    /// Ask for a larger pipe; failure (e.g. above /proc/sys/fs/pipe-max-size) is harmless.
    pub(super) fn set_size(&self, bytes: usize) {
        // SAFETY: fcntl on a descriptor we own, with an integer argument; no memory is shared.
        unsafe {
            libc::fcntl(self.write.as_raw_fd(), libc::F_SETPIPE_SZ, bytes as libc::c_int);
        }
    }
}

/// Move up to `len` bytes from `from` to `to` inside the kernel, without blocking.
/// One of the two must be a pipe. Returns 0 at end of stream of `from`.
pub(super) fn splice(from: RawFd, to: RawFd, len: usize) -> io::Result<usize> {
    // SAFETY: splice takes two descriptors and null offset pointers (we pass no memory at all);
    // the callers pass descriptors borrowed from live sockets and pipes, so they are open for
    // the duration of the call. An invalid descriptor would only yield EBADF, not UB.
    let n = unsafe {
        libc::splice(
            from,
            std::ptr::null_mut(),
            to,
            std::ptr::null_mut(),
            len,
            libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
        )
    };
    if n < 0 { Err(io::Error::last_os_error()) } else { Ok(n as usize) }
}
