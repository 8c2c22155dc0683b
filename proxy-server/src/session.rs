//! One connected agent session: its identity, its stream opener and its hello, shared by the session directory, the dial strategies and the replicas' announcements.

use proxy_core::tunnel::{AgentHello, Opener};
use std::sync::{Arc, OnceLock};
use tokio_util::sync::CancellationToken;

/// One connected agent.
pub(crate) struct Session {
    pub id: u64,
    pub cluster: String,
    pub peer: String,
    pub opener: Arc<dyn Opener>,
    /// What its agent said about itself, once its hello came.
    pub hello: Arc<OnceLock<AgentHello>>,
    /// Cancel to end the session (GOAWAY and close).
    pub stop: CancellationToken,
    /// Whether dials trust it (superseded, suspect).
    pub liveness: crate::liveness::Liveness,
    /// Who the agent proved to be.
    pub identity: Identity,
}

/// What an agent proved about itself when its session was admitted.
#[derive(Debug, Clone, Default)]
pub(crate) struct Identity {
    /// The client certificate it was verified with, if it presented one (a revocation list
    /// loaded later is checked against it).
    pub cert: Option<rustls::pki_types::CertificateDer<'static>>,
    /// The ServiceAccount a token review named, if it came with a token.
    pub account: Option<String>,
}
