//! proxy-core's integration tests, one test binary: one module per part (accept loop, admin
//! listener, lifecycle, TLS reloads, the tunnel session seam over both transports, QUIC's UDP endpoints, the control-line corpus).

// Tests keep std's locks: a lock poisoned by a panicking test fails that test (the root
// clippy.toml forbids them in product code, where proxy_core::sync is the one way to lock).
#![allow(clippy::disallowed_types)]

mod accept;
mod admin;
mod control_corpus;
mod lifecycle;
mod quic_udp;
mod seam;
mod tls_watch;
