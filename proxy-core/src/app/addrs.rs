//! The bound-addresses file (`--write-addresses`): lets tests and tooling use port 0 and learn the real ports.

use serde::Serialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;

/// Every socket a binary listens on, by name.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Addresses {
    pub admin: Option<SocketAddr>,
    pub listeners: BTreeMap<String, String>,
}

impl Addresses {
    pub fn listener(&self, name: &str) -> Option<SocketAddr> {
        self.listeners.get(name).and_then(|a| a.parse().ok())
    }
}

/// Write `addrs` as JSON to `path` atomically (temp file + rename), so a reader never sees a
/// half-written file.
pub fn write(path: &Path, addrs: &Addresses) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let json = serde_json::to_vec_pretty(addrs).map_err(std::io::Error::other)?;
    std::fs::write(&tmp, json)?;
    std::fs::rename(&tmp, path)
}
