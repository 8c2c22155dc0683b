//! proxy-wire: the sans-IO readers of untrusted bytes (TLS ClientHello over TCP or in QUIC Initial packets, PROXY protocol, HTTP/1.x heads and proxy credentials, HTTP/2 request header blocks, Kubernetes TokenReview answers and ServiceAccount tokens, the tunnel's own protocol), with no async runtime.
// Untrusted bytes must never panic a reader: no indexing or slicing that could be out of
// bounds, no unwrap or expect (tests may).
#![cfg_attr(not(test), deny(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used))]

pub mod client_hello;
#[cfg(any(test, feature = "test-util"))]
pub mod fuzzing;
pub mod http2;
pub mod http_head;
pub mod lines;
pub mod proxy_auth;
pub mod proxy_protocol;
pub mod quic_cid;
pub mod quic_initial;
pub mod token_review;
pub mod tunnel;
