//! proxy-core's integration tests, one test binary: one module per part (accept loop, admin
//! listener, lifecycle, TLS reloads, the tunnel session seam over both transports, the control-line corpus).

mod accept;
mod admin;
mod control_corpus;
mod lifecycle;
mod seam;
mod tls_watch;
