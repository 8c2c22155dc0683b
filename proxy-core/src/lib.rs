//! proxy-core: the data plane shared by sni-router, proxy-server and proxy-agent.
//!
//! Grouped by what each folder owns; a folder only uses the ones listed before it:
//!
//! - [`sync`]: the one way to lock (locks that a panic elsewhere does not make fail).
//! - [`obs`]: what operators see — the metrics registry, runtime gauges, the admin listener, logs.
//! - [`tls`]: TLS setup from PEM files.
//! - [`net`]: sockets and admission — listening, upstream connects, the accept loop and its
//!   connection slots, the pre-routing budget, tenants' shares, load counters, back-off.
//! - [`relay`]: the byte relay — the copy (and splice), stream types, how both ends close, the
//!   access event.
//! - [`watch`]: files that reload themselves — the config file, per-shoot directories, TLS material.
//! - [`tunnel`]: the reverse tunnel between proxy-server and proxy-agent, over h2 or QUIC.
//! - [`app`]: the process — the lifecycle every binary shares, its flags, shutdown, the addresses file.
//!
//! The sans-IO readers of untrusted bytes live in the `proxy-wire` crate.

pub mod app;
pub mod net;
pub mod obs;
pub mod relay;
pub mod sync;
pub mod tls;
pub mod tunnel;
pub mod watch;

pub use prometheus;
