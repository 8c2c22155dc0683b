//! proxy-core: the data plane shared by sni-router, proxy-server and proxy-agent.
//!
//! The process lifecycle ([`app`]), sockets and the accept loop, upstream connects, the byte
//! relay, how it ends ([`relay`]) and its access event ([`access`]), shutdown, config reload, metrics and the admin listener,
//! tracing, TLS files and the tunnel protocol. The sans-IO readers of untrusted bytes live in the
//! `proxy-wire` crate.

pub mod accept;
pub mod access;
pub mod addrs;
pub mod admin;
pub mod app;
pub mod backoff;
pub mod balance;
pub mod cli;
pub mod copy;
pub mod dirwatch;
pub mod guard;
pub mod ids;
pub mod io;
pub mod metrics;
pub mod net;
pub mod pending;
pub mod relay;
pub mod reload;
pub mod runtime_metrics;
pub mod share;
pub mod shutdown;
mod splice;
pub mod telemetry;
pub mod tls;
pub mod tls_watch;
pub mod tunnel;

pub use prometheus;
