//! proxy-wire: the sans-IO readers of untrusted bytes (TLS ClientHello, PROXY protocol, HTTP/1.x heads), with no async runtime.

pub mod client_hello;
pub mod http_head;
pub mod proxy_protocol;
