//! Why TLS material could not be loaded: a file (which, doing what, and why) or the configuration rustls refused.

use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {what}: {detail}")]
    File { path: String, what: &'static str, detail: String },
    #[error("TLS configuration: {0}")]
    Config(String),
}

/// A problem with the file at `path`, met while doing `what`.
pub(crate) fn file_err(path: &Path, what: &'static str, e: impl std::fmt::Display) -> TlsError {
    TlsError::File { path: path.display().to_string(), what, detail: e.to_string() }
}
