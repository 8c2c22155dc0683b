//! One connected agent session: its identity, its stream opener and its hello, shared by the session directory, the dial strategies and the replicas' announcements.

use proxy_core::sync::Mutex;
use proxy_core::tunnel::{AgentHello, Opener};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;
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
    /// `h2` or `quic`.
    pub transport: &'static str,
    /// When it was registered.
    pub since: Instant,
    /// What the status page shows of it besides: bytes and the last failed dial.
    pub tally: Arc<Tally>,
}

/// A session's figures for the status page, kept where they cost nothing per byte: the bytes of
/// each stream are added once, when the stream ends; a failed dial notes its error.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    to_shoot: AtomicU64,
    to_seed: AtomicU64,
    last_error: Mutex<Option<(Instant, String)>>,
}

impl Tally {
    /// A stream of this session ended, having moved these bytes.
    pub(crate) fn ended(&self, to_shoot: u64, to_seed: u64) {
        self.to_shoot.fetch_add(to_shoot, Ordering::Relaxed);
        self.to_seed.fetch_add(to_seed, Ordering::Relaxed);
    }

    /// A dial on this session failed with `error`.
    pub(crate) fn failed(&self, error: String) {
        *self.last_error.lock() = Some((Instant::now(), error));
    }

    /// Bytes to the shoot and to the seed of the streams that ended.
    pub(crate) fn bytes(&self) -> (u64, u64) {
        (self.to_shoot.load(Ordering::Relaxed), self.to_seed.load(Ordering::Relaxed))
    }

    /// The last failed dial: when, and why.
    pub(crate) fn last_error(&self) -> Option<(Instant, String)> {
        self.last_error.lock().clone()
    }
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
