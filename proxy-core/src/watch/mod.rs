//! Files that reload themselves: the config file (with SIGHUP), a directory of per-shoot files, and TLS material.

pub mod config;
pub mod dir;
pub mod tls;
