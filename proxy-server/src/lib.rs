//! proxy-server: the seed end of the reverse tunnel. Agents dial in; front ends (CONNECT, forward proxy) dial out through them.
//!
//! The process lifecycle (bind, serve, reload, drain) is [`proxy_core::app`]; this crate adds
//! the agents' listener and sessions, the front ends and the per-cluster state. At shutdown the
//! front-end connections drain for the grace period, then the agent sessions close.

mod agents;
mod control;
mod frontend;
mod listeners;
mod metrics;
mod registry;

use arc_swap::ArcSwap;
use listeners::Listeners;
use proxy_core::accept::Slots;
use proxy_core::admin::{Check, ControlRequest};
use proxy_core::app::{self, Ctx, Service, StartError};
use proxy_core::ids::ConnIds;
use proxy_core::shutdown::Shutdown;
use proxy_core::tls_watch::TlsMetrics;
use registry::Registry;
use seedgate_config::ServerConfig;
use seedgate_config::server::ClusterState;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;

pub use metrics::ServerMetrics;
pub use proxy_core::app::Options;

pub(crate) struct Shared {
    pub(crate) config: ArcSwap<ServerConfig>,
    pub(crate) metrics: ServerMetrics,
    pub(crate) registry: Registry,
    pub(crate) shutdown: Shutdown,
    pub(crate) ids: ConnIds,
    connections: Arc<Slots>,
    /// Cluster states set through the admin endpoint; they override the config's until cleared.
    overrides: Mutex<BTreeMap<String, ClusterState>>,
}

impl Shared {
    /// Config states with the admin overrides on top.
    fn effective_states(&self) -> BTreeMap<String, ClusterState> {
        let mut s = self.config.load().clusters.clone();
        s.extend(self.overrides.lock().expect("not poisoned").clone());
        s
    }
}

/// proxy-server as a [`Service`] of the shared lifecycle.
pub struct Server {
    shared: Arc<Shared>,
    listeners: Listeners,
    /// Ends the agent sessions, after the front ends drained.
    sessions_stop: CancellationToken,
}

pub type Bound = app::Bound<Server>;

/// Bind the agents' listener, every front end and the admin socket; [`app::Bound::run`] serves.
pub async fn bind(cfg: ServerConfig, opts: Options) -> Result<Bound, StartError> {
    app::bind(cfg, opts).await
}

impl Service for Server {
    type Config = ServerConfig;
    const NAME: &'static str = "proxy-server";

    async fn bind(cfg: Arc<ServerConfig>, ctx: Ctx) -> Result<Self, StartError> {
        let listeners = Listeners::bind(&cfg, &TlsMetrics::new(&ctx.registry)).await?;
        let metrics = ServerMetrics::new(&ctx.registry);
        let shared = Arc::new(Shared {
            registry: Registry::new(metrics.clone(), &cfg.clusters, ctx.shutdown.kill.clone()),
            config: ArcSwap::new(cfg),
            metrics,
            shutdown: ctx.shutdown,
            ids: ConnIds::default(),
            connections: ctx.connections,
            overrides: Mutex::new(BTreeMap::new()),
        });
        for (name, mode) in shared.registry.modes() {
            shared.metrics.set_cluster_state(&name, mode.mode);
        }
        Ok(Self { shared, listeners, sessions_stop: CancellationToken::new() })
    }

    fn start(self: &Arc<Self>) {
        self.listeners.start(&self.shared, &self.sessions_stop);
    }

    /// Sockets and TLS files first (they can fail), then timeouts, limits and cluster states.
    async fn apply(self: &Arc<Self>, new: Arc<ServerConfig>) -> Result<(), String> {
        self.listeners.apply(&self.shared, &self.sessions_stop, &new).await?;
        self.shared.config.store(new);
        self.shared.registry.set_modes(&self.shared.effective_states());
        Ok(())
    }

    fn listeners(&self) -> BTreeMap<String, String> {
        self.listeners.addresses()
    }

    fn ready(&self) -> Vec<Check> {
        control::ready(&self.shared)
    }

    fn show_config(&self, running: &ServerConfig) -> serde_json::Value {
        let mut v = serde_json::to_value(running).unwrap_or_default();
        v["cluster_overrides"] =
            serde_json::to_value(&*self.shared.overrides.lock().expect("not poisoned")).unwrap_or_default();
        v
    }

    fn control(&self, req: ControlRequest<'_>) -> Option<(http::StatusCode, String)> {
        control::control(&self.shared, req)
    }

    async fn stopped(&self) {
        self.sessions_stop.cancel();
    }
}

#[cfg(test)]
pub(crate) fn test_shared() -> Arc<Shared> {
    let cfg = seedgate_config::server::parse(
        "agents: { listen: 127.0.0.1:0, tls: { cert: c, key: k, client_ca: ca } }\n",
        "t.yaml",
    )
    .expect("valid");
    let reg = proxy_core::prometheus::Registry::new();
    let metrics = ServerMetrics::new(&reg);
    Arc::new(Shared {
        registry: Registry::new(metrics.clone(), &cfg.clusters, CancellationToken::new()),
        config: ArcSwap::from_pointee(cfg),
        metrics,
        shutdown: Shutdown::new(),
        ids: ConnIds::default(),
        connections: Slots::new(10),
        overrides: Mutex::new(BTreeMap::new()),
    })
}
