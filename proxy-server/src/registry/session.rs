//! One connected agent session: its identity, its stream opener, its hello, and its standing for new dials (suspect, superseded, silent) as methods that mark, count and log it.
//!
//! Its standing is the session's own: the dial path asks [`Session::standing`] and
//! [`Session::suspect`], an attempt that went unanswered marks it [`Session::doubt_silent`], a new
//! run of its agent marks it [`Session::superseded_by`], and readiness shows it; the marks
//! themselves are [`Liveness`].

use super::liveness::{Liveness, Standing, supersedes};
use crate::metrics::ServerMetrics;
use proxy_core::tunnel::{AgentHello, Opener, Quiet};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
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
    pub liveness: Liveness,
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

impl Session {
    /// The node its agent named (empty before its hello, or when it named none).
    pub(crate) fn node(&self) -> String {
        self.hello.get().map(|h| h.node.clone()).unwrap_or_default()
    }

    /// How it stands for new dials now (a doubt it outlived is cleared and noted).
    pub(crate) fn standing(&self, metrics: &ServerMetrics) -> Standing {
        let (standing, cleared) = self.liveness.standing(|| self.opener.heard());
        self.revived(cleared, metrics);
        standing
    }

    /// Its keepalive went unanswered for the suspect time: it takes no new dials.
    pub(crate) fn suspect(&self) -> bool {
        self.opener.quiet().is_some_and(Quiet::is_silent)
    }

    /// It left an open unanswered, with no sign the agent got it, for `open_timeout` (`heard`:
    /// its signs of life when the open was sent): it is tried last until it shows life (counted
    /// and logged once per doubt).
    pub(crate) fn doubt_silent(&self, heard: Option<u64>, open_timeout: Duration, metrics: &ServerMetrics) {
        if self.liveness.doubt(Standing::Suspect, heard) {
            metrics.sessions_doubted.with_label_values(&[&self.cluster, "silent"]).inc();
            tracing::warn!(cluster = %self.cluster, session = self.id, peer = %self.peer, node = %self.node(), ?open_timeout, "agent session silent: no answer to a stream open and no sign that the agent got it; tried last until it shows life");
        }
    }

    /// `new`'s agent said who it is (`hello`): this session, if of an earlier run of the same
    /// agent (registered before it, same node, another instance), is superseded. It is gone in
    /// all likelihood (a restart, a node that lost power) but not known to be until its
    /// keepalive times out: until then dials try it last, and nothing on it is cut.
    pub(crate) fn superseded_by(&self, new: &Session, hello: &AgentHello, metrics: &ServerMetrics) {
        if self.id >= new.id || !self.hello.get().is_some_and(|was| supersedes(hello, was)) {
            return;
        }
        if self.liveness.doubt(Standing::Superseded, self.opener.heard()) {
            metrics.sessions_doubted.with_label_values(&[&new.cluster, "superseded"]).inc();
            tracing::info!(
                cluster = %new.cluster, node = %hello.node, old = self.id, new = new.id, old_peer = %self.peer, peer = %new.peer,
                "agent restarted (a new run of its node connected): its earlier session is superseded, tried last until it ends"
            );
        }
    }

    /// Note a doubt that [`Liveness::standing`] cleared, if any: counted, and logged — a
    /// superseded session that shows life is another live agent with the same node name.
    fn revived(&self, cleared: Option<Standing>, metrics: &ServerMetrics) {
        let Some(was) = cleared else { return };
        let reason = if was == Standing::Superseded { "superseded" } else { "silent" };
        metrics.sessions_revived.with_label_values(&[&self.cluster, reason]).inc();
        let node = self.node();
        match was {
            Standing::Superseded => tracing::warn!(
                cluster = %self.cluster, session = self.id, peer = %self.peer, %node,
                "a session superseded by a new run of its node is alive: two agents claim node {node:?} (give each its own tunnel.identifiers.host or tunnel.node_name); both take dials"
            ),
            _ => {
                tracing::info!(cluster = %self.cluster, session = self.id, peer = %self.peer, %node, "suspect agent session showed life again")
            }
        }
    }

    /// Count and log its keepalive turning suspect and back, until the session is gone. Holds it
    /// weakly: the watch ends when the session (and its transport) is dropped.
    pub(crate) fn watch_suspect(self: &Arc<Self>, metrics: ServerMetrics) {
        let Some(mut quiet) = self.opener.quiet().map(Quiet::watch) else { return };
        let (weak, cluster, id, peer) = (Arc::downgrade(self), self.cluster.clone(), self.id, self.peer.clone());
        let gauge = metrics.sessions_suspect.with_label_values(&[&cluster]);
        tokio::spawn(async move {
            let mut since: Option<tokio::time::Instant> = None;
            while quiet.changed().await.is_ok() {
                let silent = *quiet.borrow_and_update();
                let Some(s) = weak.upgrade() else { break };
                match (silent, since) {
                    (true, None) => {
                        since = Some(tokio::time::Instant::now());
                        gauge.inc();
                        metrics.sessions_suspect_total.with_label_values(&[&cluster]).inc();
                        let streams = s.opener.active_streams();
                        tracing::warn!(%cluster, session = id, %peer, node = %s.node(), streams, "agent session suspect: its keepalive went unanswered (the path is quiet); no new dials go to it, its open streams wait for the path");
                    }
                    (false, Some(at)) => {
                        since = None;
                        gauge.dec();
                        let streams = s.opener.active_streams();
                        metrics.streams_survived.with_label_values(&[&cluster]).inc_by(streams as u64);
                        tracing::info!(%cluster, session = id, %peer, quiet = ?at.elapsed(), streams, "suspect agent session answers again: it takes dials, its open streams rode out the outage");
                    }
                    _ => {}
                }
            }
            if since.is_some() {
                gauge.dec();
            }
        });
    }
}
