//! The QUIC transport of the tunnel (quinn): the agent dials over UDP, the seed opens one bidirectional QUIC stream per proxied connection.
//!
//! Same roles as [`super::h2`]: the agent is the QUIC client (it dials out), the seed opens the
//! streams. TLS 1.3, ALPN `seedgate-tunnel/1` and the certificates are those of the TCP
//! transport; QUIC brings per-stream flow control, no head-of-line blocking between streams and
//! connection migration (an agent whose address changes keeps its session).
//!
//! What is QUIC's own: every stream starts with a header, and a connect stream's answer is a few
//! bytes of its own (both in `proxy_wire::tunnel::quic`); the control stream is the first stream
//! the seed opens. When the agent shuts down it writes `{"type":"going_away"}` on the control
//! stream (the GOAWAY equivalent): the seed opens no new stream on the session, streams in
//! flight continue; streams that crossed the notice are refused with `draining`. Once its last
//! stream ends the agent closes the connection with code [`CLOSE_DONE`].
//!
//! Bytes: QUIC stream data, flow control per stream (`max_stream_window`, at least `stream_window_quic`) and per connection
//! (`connection_window`); FIN is a half-close; RESET_STREAM / STOP_SENDING with [`RESET_CODE`]
//! is a reset. Liveness: QUIC keep-alive every [`TunnelSettings::ping_every`], the idle timeout is the
//! keepalive timeout; the path is quiet ([`Quiet`]) while nothing that asked for an
//! acknowledgement is acknowledged for the suspect time ([`Hearing`]).
//!
//! - `seed` and `agent`: the two ends of a session; `stream`: a stream as a byte stream
//!   ([`QuicStream`]), writing in turn at the connection's send window ([`send_turns`]).
//! - `liveness`: whether the path is quiet ([`Hearing`]), the task that watches each connection.
//! - `config`: quinn's transport settings; [`congestion`]: the `loss_tolerant` controller;
//!   `endpoint`: the UDP endpoint and its stable keys.
//!
//! [`TunnelSettings::ping_every`]: crate::tunnel::TunnelSettings::ping_every
//! [`Quiet`]: crate::tunnel::Quiet

mod agent;
mod config;
pub mod congestion;
mod endpoint;
mod liveness;
mod seed;
pub mod send_turns;
mod stream;

use crate::tunnel::session::SessionOpener;
pub use config::{SEND_WINDOW_FLOOR, agent_transport_config, seed_transport_config, send_window};
pub use endpoint::{MAX_UDP_PAYLOAD, Server, StableKeys, endpoint, udp_buffer};
pub use liveness::Hearing;
pub use proxy_wire::tunnel::quic::{CLOSE_DONE, CLOSE_PROTOCOL, CLOSE_STOPPED, RESET_CODE};
pub use seed::QuicSeed;
pub use stream::{QuicSend, QuicStream, Turns};

/// The seed side of a QUIC session.
pub type QuicOpener = SessionOpener<QuicSeed>;
