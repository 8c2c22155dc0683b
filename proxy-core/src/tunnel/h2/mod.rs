//! The HTTP/2 transport of the tunnel, roles reversed: the seed is the h2 client on the agent's TLS connection.
//!
//! What is HTTP/2's own: the handshakes, PING keepalive, `CONNECT` requests and their answers
//! (`:status`, `seedgate-error`, `seedgate-reason`), the control stream as a `POST`, GOAWAY as
//! the agent's going-away notice. The sessions themselves run in [`super::session`].
//!
//! - `seed` and `agent`: the two ends of a session; `stream`: a stream as a byte stream
//!   ([`H2Stream`]); `errors`: h2's errors and the agent's answers as the tunnel's.
//! - `keepalive`: PINGs, a quiet path, a dead session, and the samples behind [`window`], the
//!   session's stream window that follows its path (`tuning` carries it to the connection).
//! - `session_socket`: the session's TCP socket ([`SessionSocket`]) under its [`inflight`] bound.

mod agent;
mod errors;
pub mod inflight;
mod keepalive;
mod seed;
mod session_socket;
mod stream;
mod tuning;
pub mod window;

use crate::tunnel::session::SessionOpener;
pub use seed::H2Seed;
pub use session_socket::{InflightStats, SessionSocket};
pub use stream::H2Stream;

/// The seed side of an HTTP/2 session.
pub type H2Opener = SessionOpener<H2Seed>;
