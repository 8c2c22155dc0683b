//! The steps of proxy-server's agent choice for a dial (`agents.proxy_strategies`) and their check.

use crate::error::Problems;
use serde::{Deserialize, Serialize};

/// One step of the agent choice of a dial (`agents.proxy_strategies`).
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Hash, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ProxyStrategy {
    /// The agent whose identifiers (node name, node addresses) include the destination's host.
    DestHost,
    /// An agent that offers a default route (`tunnel.identifiers.default_route: true`).
    DefaultRoute,
    /// Any agent of the cluster.
    Default,
}

impl ProxyStrategy {
    /// The config spelling, also the `strategy` label of metrics and access events.
    pub fn as_str(self) -> &'static str {
        match self {
            ProxyStrategy::DestHost => "dest_host",
            ProxyStrategy::DefaultRoute => "default_route",
            ProxyStrategy::Default => "default",
        }
    }
}

pub(super) fn proxy_strategies_default() -> Vec<ProxyStrategy> {
    vec![ProxyStrategy::Default]
}

pub(super) fn validate_strategies(key: &str, s: &[ProxyStrategy], p: &mut Problems) {
    if s.is_empty() {
        p.push(key, "give at least one of dest_host, default_route, default");
    }
    if s.iter().enumerate().any(|(i, x)| s[..i].contains(x)) {
        p.push(key, "a strategy is listed twice");
    }
}
