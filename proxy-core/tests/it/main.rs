//! proxy-core's integration tests, one test binary: one module per part (accept loop, admin
//! listener, lifecycle, TLS reloads, the tunnel session seam over both transports, QUIC's UDP endpoints, the control-line corpus).

mod accept;
mod admin;
mod control_corpus;
mod lifecycle;
mod quic_udp;
mod seam;
mod tls_watch;
