//! The reverse tunnel's own protocol, sans-IO: control messages, dial errors and the QUIC transport's stream framing.
//!
//! Version 1 (ALPN `seedgate-tunnel/1`). Both transports carry the same control stream (one
//! JSON object per line, [`control`]) and the same dial errors ([`dial`]); HTTP/2 frames the
//! rest with its own headers, QUIC with the header and answer of [`quic`]. The transports'
//! I/O lives in proxy-core; here are only the bytes.

pub mod control;
pub mod dial;
pub mod quic;

pub use control::{AgentHello, AgentMsg, CONTROL_LINE_MAX, ControlMsg, ControlReader, Line, Secret, ServerInfo};
pub use dial::DialError;

/// ALPN of tunnel protocol version 1.
pub const ALPN_V1: &[u8] = b"seedgate-tunnel/1";
