//! proxy-wire: the sans-IO readers of untrusted bytes (TLS ClientHello over TCP or in QUIC Initial packets, PROXY protocol, HTTP/1.x heads and proxy credentials, the tunnel's own protocol), with no async runtime.

pub mod client_hello;
#[doc(hidden)]
pub mod fuzzing;
pub mod http_head;
pub mod lines;
pub mod proxy_auth;
pub mod proxy_protocol;
pub mod quic_cid;
pub mod quic_initial;
pub mod tunnel;
