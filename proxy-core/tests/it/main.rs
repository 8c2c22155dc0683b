//! proxy-core's integration tests, one test binary: one module per part (accept loop, admin
//! listener, lifecycle, TLS reloads, tunnel session, the control-line corpus).

mod accept;
mod admin;
mod control_corpus;
mod lifecycle;
mod tls_watch;
mod tunnel_session;
