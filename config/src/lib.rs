//! seedgate configuration: the YAML contract of every binary, its defaults and its validation.
//!
//! Pure data: no sockets, no runtime. Loading is `parse_*(text, file_name)`, which returns either a
//! validated config or every problem found, each with file, line, column and field path.

pub mod agent;
mod common;
mod error;
pub mod router;
pub mod server;

pub use agent::AgentConfig;
pub use common::{AdminConfig, CidrPort, Dur, HostPort, IpCidr, Keepalive, Located, canonical, valid_header_name};
pub use error::{ConfigError, Problem};
pub use router::RouterConfig;
pub use server::ServerConfig;

/// Read `path` and parse it with `parse` (one of the `parse_*` functions of this crate).
pub fn load<T>(path: &std::path::Path, parse: fn(&str, &str) -> Result<T, ConfigError>) -> Result<T, ConfigError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::io(&file, e))?;
    parse(&text, &file)
}

/// Deserialize one YAML document into `T`, mapping serde errors to a located [`ConfigError`].
pub(crate) fn from_yaml<T: serde::de::DeserializeOwned>(text: &str, file: &str) -> Result<T, ConfigError> {
    serde_saphyr::from_str::<T>(text).map_err(|e| ConfigError::from_yaml(file, &e))
}
