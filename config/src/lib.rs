//! seedgate configuration: the YAML contract of every binary, its defaults and its validation.
//!
//! Pure data: no sockets, no runtime. Loading is `parse_*(text, file_name)`, which returns either a
//! validated config or every problem found, each with file, line, column and field path.

pub mod agent;
mod binary;
mod common;
mod error;
pub mod reference;
pub mod router;
pub mod schema;
pub mod server;
mod session;
mod size;
mod yaml;

pub use agent::AgentConfig;
pub use binary::{BinaryConfig, load};
pub use common::{
    AdminConfig, CidrPort, CidrPortFault, CongestionControl, Dur, FileMode, HostPort, IpCidr, Located, PendingBudget,
    TlsFiles, TlsRole, ValueError, canonical, valid_header_name,
};
pub use error::{ConfigError, Problem};
pub use router::RouterConfig;
pub use server::ServerConfig;
pub use session::{Keepalive, MAX_STREAM_WINDOW, STREAM_WINDOW_H2, STREAM_WINDOW_QUIC, SessionSettings};
pub use size::parse_size;
pub use yaml::locate;
