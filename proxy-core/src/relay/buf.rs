//! The relay's read buffers: their size, and a per-thread pool of them, so that a buffer is held only while bytes are in flight.

use std::cell::RefCell;

/// Size of a relay buffer taken from the pool for one read. 64 KiB rather than 16: into a tunnel
/// stream one read becomes one 64 KiB HTTP/2 DATA frame (or QUIC chunk), so every layer below
/// (h2, TLS records written in one call, the socket) runs a quarter as often per byte; the tunnel's
/// CPU per GB fell by a fifth. An idle relay still holds no buffer.
pub const BUF_SIZE: usize = 64 * 1024;
/// Buffers kept per thread for reuse (1 MiB); more are freed.
const BUF_POOL_MAX: usize = 16;

thread_local! {
    static BUFS: RefCell<Vec<Box<[u8]>>> = const { RefCell::new(Vec::new()) };
}

/// A buffer of [`BUF_SIZE`] bytes: the pool's, or a new one.
pub(crate) fn take_buf() -> Box<[u8]> {
    BUFS.with(|p| p.borrow_mut().pop()).unwrap_or_else(|| vec![0u8; BUF_SIZE].into_boxed_slice())
}

/// Back to the pool (freed once the pool is full).
pub(crate) fn give_buf(b: Box<[u8]>) {
    BUFS.with(|p| {
        let mut p = p.borrow_mut();
        if p.len() < BUF_POOL_MAX {
            p.push(b);
        }
    });
}
