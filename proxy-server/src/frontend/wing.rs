//! The front ends' wing: what only front-end connections use — their ids, the established slots (`limits.max_connections`), the pending budget, the live TLS connections by client certificate — beside what every wing shares, and each running front end's settings.

use super::refusal::Refusal;
use super::revocation::Live;
use crate::registry::{DialRefusal, DialTimes, Dialed};
use crate::shared::Shared;
use proxy_core::net::accept::ConnLimit;
use proxy_core::net::ids::ConnIds;
use proxy_core::net::pending::Pending;
use std::sync::Arc;

/// Everything a front-end connection uses, from its accept to the end of its relay.
pub(crate) struct Frontends {
    pub(crate) shared: Arc<Shared>,
    pub(crate) ids: ConnIds,
    /// The front ends' established connections (`limits.max_connections`), taken once the
    /// request head is read.
    pub(crate) limit: ConnLimit,
    /// Front-end connections in the TLS handshake or request head (`limits.max_pending` ...).
    pub(crate) pending: Arc<Pending>,
    /// The live TLS front-end connections with a client certificate, ended when revoked.
    pub(crate) certs: Live,
}

/// A running front end.
pub(crate) struct FrontendRt {
    pub name: Arc<str>,
    /// Fixed cluster, or `None` when the client certificate's CN or the proxy credentials name it.
    pub cluster: Option<String>,
    /// `cluster_from: proxy_authorization`: the token each request's proxy credentials must carry
    /// as the password (their user name is the cluster).
    pub proxy_token: Option<Arc<str>>,
    /// `grpc`: konnectivity's `ProxyService` over HTTP/2 rather than CONNECT.
    pub grpc: bool,
    /// `tcp`: a port forward, every connection to this target.
    pub target: Option<Arc<str>>,
}

impl Frontends {
    pub(crate) fn new(shared: Arc<Shared>, pending: Arc<Pending>, limit: ConnLimit) -> Self {
        Self { shared, ids: ConnIds::default(), limit, pending, certs: Live::default() }
    }

    /// Dial `target` through an agent of `cluster` with the configured timeouts and proxy
    /// strategies (the dial path: [`crate::registry::dial`]).
    pub(crate) async fn dial(&self, cluster: &str, target: &str) -> Result<Dialed, DialRefusal> {
        let cfg = self.shared.config.load();
        let times = DialTimes { dial: cfg.timeouts.dial.get(), open: cfg.agents.open_timeout.get() };
        self.shared.directory.dial(cluster, target, times, &cfg.agents.proxy_strategies).await
    }

    /// Count a connection refused before anything about it is known but its front end (no
    /// access event; nothing is answered).
    pub(crate) fn rejected(&self, fe: &FrontendRt, r: &Refusal) {
        self.shared.metrics.conn.rejects.with_label_values(&[&fe.name, r.label()]).inc();
    }
}

/// The front ends of [`crate::shared::test_shared`]: ten slots, the default pending budget.
#[cfg(test)]
pub(crate) fn test_frontends() -> Arc<Frontends> {
    let shared = crate::shared::test_shared();
    let budget = shared.config.load().pending_budget();
    let pending = Pending::new(budget, proxy_core::net::pending::PendingMetrics::unregistered());
    let limit = ConnLimit::new(proxy_core::net::accept::Slots::new(10), None);
    Arc::new(Frontends::new(shared, pending, limit))
}
