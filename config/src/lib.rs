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

/// What every binary's config has, and how its file is read: the process lifecycle needs no more.
pub trait BinaryConfig: Sized {
    /// Parse and validate one config file's text (`file` names it in messages).
    fn parse(text: &str, file: &str) -> Result<Self, ConfigError>;
    fn admin(&self) -> &AdminConfig;
    /// After SIGTERM: how long live connections may continue.
    fn drain_grace(&self) -> std::time::Duration;
    /// `limits.max_connections`: connections the process holds at once.
    fn max_connections(&self) -> usize;
}

macro_rules! binary_config {
    ($t:ty, $parse:path) => {
        impl $crate::BinaryConfig for $t {
            fn parse(text: &str, file: &str) -> Result<Self, $crate::ConfigError> {
                $parse(text, file)
            }
            fn admin(&self) -> &$crate::AdminConfig {
                &self.admin
            }
            fn drain_grace(&self) -> std::time::Duration {
                self.drain_grace.get()
            }
            fn max_connections(&self) -> usize {
                self.limits.max_connections
            }
        }
    };
}

binary_config!(RouterConfig, router::parse);
binary_config!(ServerConfig, server::parse);
binary_config!(AgentConfig, agent::parse);

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
