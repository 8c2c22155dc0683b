//! proxy-core: the data plane shared by sni-router, proxy-server and proxy-agent.
//!
//! Sockets and the accept loop, upstream connects, the byte relay, shutdown, config reload,
//! metrics and the admin listener, tracing, and the sans-IO protocol readers (TLS ClientHello,
//! PROXY protocol, HTTP request heads).

pub mod accept;
pub mod addrs;
pub mod admin;
pub mod cli;
pub mod client_hello;
pub mod copy;
pub mod http_head;
pub mod io;
pub mod metrics;
pub mod net;
pub mod proxy_protocol;
pub mod reload;
pub mod shutdown;
mod splice;
pub mod telemetry;
pub mod tls;
pub mod tunnel;

pub use prometheus;
