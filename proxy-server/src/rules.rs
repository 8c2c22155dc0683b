//! How agents' sessions are checked, per cluster, as the config, the cluster files and the admin overrides say now: each cluster's mode of authentication and its token review settings.

use crate::shared::Shared;
use crate::tokens::ClusterReview;
use seedgate_config::server::AgentAuth;

/// How an agent's sessions are checked, per cluster: its mode and the clusters with reviews.
pub(crate) struct Rules {
    states: std::collections::BTreeMap<String, seedgate_config::server::ClusterState>,
    default: AgentAuth,
}

impl Rules {
    /// The rules in force now (config, cluster files, overrides).
    pub(crate) fn now(shared: &Shared) -> Self {
        Self { states: shared.effective_states(), default: shared.config.load().agents.auth }
    }

    pub(crate) fn auth(&self, cluster: &str) -> AgentAuth {
        self.states.get(cluster).and_then(|s| s.agent_auth).unwrap_or(self.default)
    }

    /// The clusters with a `token_review`.
    pub(crate) fn token_clusters(&self) -> Vec<String> {
        self.states.iter().filter(|(_, s)| s.token_review.is_some()).map(|(c, _)| c.clone()).collect()
    }

    /// The cluster's review settings, if it takes tokens.
    pub(crate) fn review(&self, shared: &Shared, cluster: &str) -> Option<ClusterReview> {
        let r = self.states.get(cluster)?.token_review.as_ref()?;
        Some(ClusterReview::of(r, &shared.config.load().agents.token_review))
    }
}
