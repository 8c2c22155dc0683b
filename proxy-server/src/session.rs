//! One connected agent session: its identity, its stream opener and its hello, shared by the session directory, the dial strategies and the replicas' announcements.

use proxy_core::tunnel::{AgentHello, Opener};
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;

/// One connected agent.
pub(crate) struct Session {
    pub id: u64,
    pub cluster: String,
    pub peer: String,
    pub opener: Arc<dyn Opener>,
    pub hello: Arc<Mutex<Option<AgentHello>>>,
    /// Cancel to end the session (GOAWAY and close).
    pub stop: CancellationToken,
    /// Whether dials trust it (superseded, suspect).
    pub liveness: crate::liveness::Liveness,
}
