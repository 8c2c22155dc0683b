//! What the process lifecycle reads from any binary's config: the [`BinaryConfig`] trait, its
//! three impls, and [`load`].

use crate::agent::{self, AgentConfig};
use crate::common::TlsFiles;
use crate::error::{ConfigError, Problem};
use crate::router::{self, RouterConfig};
use crate::schema;
use crate::server::{self, ServerConfig};

/// What every binary's config has, and how its file is read: the process lifecycle needs no more.
pub trait BinaryConfig: Sized {
    /// The config file's JSON Schema as `--print-schema` prints it.
    fn schema_text() -> String;
    /// Parse and validate one config file's text (`file` names it in messages).
    fn parse(text: &str, file: &str) -> Result<Self, ConfigError>;
    /// Every problem [`BinaryConfig::parse`] finds, and the config too when its structure could
    /// be read (bad values replaced by placeholders): for checks that go on to the files it names.
    fn parse_partial(text: &str, file: &str) -> (Option<Self>, Vec<Problem>) {
        match Self::parse(text, file) {
            Ok(c) => (Some(c), Vec::new()),
            Err(e) => (None, e.problems),
        }
    }
    fn admin(&self) -> &crate::common::AdminConfig;
    /// After SIGTERM: how long live connections may continue.
    fn drain_grace(&self) -> std::time::Duration;
    /// `limits.max_connections`: connections the process holds at once.
    fn max_connections(&self) -> usize;
    /// The certificate, key and CA files the config names, so they can be loaded (and checked
    /// to belong together) before anything starts.
    fn tls_files(&self) -> Vec<TlsFiles> {
        Vec::new()
    }
    /// `(key path, socket path)` of every Unix socket the binary listens on, so that a path
    /// taken by something that is not a socket is reported before start.
    fn unix_sockets(&self) -> Vec<(String, String)> {
        Vec::new()
    }
    /// `(key path, file)` of every token file other than `admin.token_file`, so that a missing or
    /// empty one is reported before start.
    fn token_files(&self) -> Vec<(String, String)> {
        Vec::new()
    }
}

macro_rules! binary_config {
    ($t:ty, $file:expr, $parse:path, $validate:path) => {
        impl BinaryConfig for $t {
            fn schema_text() -> String {
                $file.schema_text()
            }
            fn parse(text: &str, file: &str) -> Result<Self, ConfigError> {
                $parse(text, file)
            }
            fn parse_partial(text: &str, file: &str) -> (Option<Self>, Vec<Problem>) {
                crate::yaml::parse_partial(text, file, $validate)
            }
            fn admin(&self) -> &crate::common::AdminConfig {
                &self.admin
            }
            fn drain_grace(&self) -> std::time::Duration {
                self.drain_grace.get()
            }
            fn max_connections(&self) -> usize {
                self.limits.max_connections
            }
            fn tls_files(&self) -> Vec<TlsFiles> {
                <$t>::tls_files(self)
            }
            fn unix_sockets(&self) -> Vec<(String, String)> {
                <$t>::unix_sockets(self)
            }
            fn token_files(&self) -> Vec<(String, String)> {
                <$t>::token_files(self)
            }
        }
    };
}

binary_config!(RouterConfig, schema::ConfigFile::Router, router::parse, router::validate);
binary_config!(ServerConfig, schema::ConfigFile::Server, server::parse, server::validate);
binary_config!(AgentConfig, schema::ConfigFile::Agent, agent::parse, agent::validate);

/// Read `path` and parse it with `parse` (one of the `parse_*` functions of this crate).
pub fn load<T>(path: &std::path::Path, parse: fn(&str, &str) -> Result<T, ConfigError>) -> Result<T, ConfigError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::io(&file, e))?;
    parse(&text, &file)
}
