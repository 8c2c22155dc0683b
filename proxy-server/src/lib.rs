//! proxy-server: the seed end of the reverse tunnel. Agents dial in; front ends (CONNECT, forward proxy) dial out through them.
//!
//! The process lifecycle (bind, serve, reload, drain) is [`proxy_core::app`]; this crate
//! composes three wings: [`agents`] (the agents' listeners, who an agent is and whether its
//! session may live: certificates, revocation lists, ServiceAccount tokens), [`frontend`] (the
//! front ends' listeners, a connection's life from accept to relay) and [`registry`] (the
//! cluster directory, the dial path, each session's standing), with what they share
//! ([`shared`], [`metrics`], [`cluster_files`]) and the admin hooks ([`admin`]). At shutdown
//! the front-end connections drain for the grace period, then the agent sessions close.

mod admin;
mod agents;
mod cluster_files;
mod frontend;
mod metrics;
mod registry;
mod shared;

use shared::Shared;

use admin::Admin;
use agents::Agents;
use arc_swap::ArcSwap;
use cluster_files::ClusterFiles;
use frontend::Frontends;
use proxy_core::app::{self, Ctx, Service, StartError};
use proxy_core::net::accept::ConnLimit;
use proxy_core::net::pending::{Pending, PendingMetrics};
use proxy_core::obs::admin::{Check, ControlRequest};
use proxy_core::obs::status::{StatusPage, StatusQuery};
use proxy_core::sync::Mutex;
use proxy_core::watch::dir::{DirWatch, FileMetrics};
use proxy_core::watch::tls::TlsMetrics;
use registry::SessionDirectory;
use seedgate_config::ServerConfig;
use seedgate_config::server::ClusterState;
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub use cluster_files::DefinedTwice;
pub use frontend::ApplyError as ListenersRefused;
pub use frontend::SocketError;
pub use metrics::ServerMetrics;
pub use proxy_core::app::Options;

/// Why proxy-server refuses a reloaded config (then nothing changed).
#[derive(Debug, thiserror::Error)]
pub enum ReloadRefused {
    /// The new main config defines a cluster a file of `clusters_dir` defines.
    #[error(transparent)]
    Clusters(#[from] DefinedTwice),
    /// A listener's new socket, TLS files or socket access could not be taken up.
    #[error(transparent)]
    Listeners(#[from] ListenersRefused),
}

type States = BTreeMap<String, ClusterState>;

/// proxy-server as a [`Service`] of the shared lifecycle: the wings it composes.
pub struct Server {
    shared: Arc<Shared>,
    agents: Arc<Agents>,
    frontends: Arc<Frontends>,
    admin: Admin,
    agent_listeners: agents::Listeners,
    frontend_listeners: frontend::Listeners,
    /// Ends the agent sessions, after the front ends drained.
    sessions_stop: CancellationToken,
}

/// What [`Server`]'s `bind` opened for its `start`: the sockets, and the watch of `clusters_dir`.
pub struct Opened {
    agents: agents::Opened,
    frontends: frontend::Opened,
    watch: Option<DirWatch<States>>,
}

pub type Bound = app::Bound<Server>;

/// Bind the agents' listener, every front end and the admin socket; [`app::Bound::run`] serves.
pub async fn bind(cfg: ServerConfig, opts: Options) -> Result<Bound, StartError> {
    app::bind(cfg, opts).await
}

impl Service for Server {
    type Config = ServerConfig;
    const NAME: &'static str = "proxy-server";
    type Opened = Opened;
    type ApplyError = ReloadRefused;

    fn restart_only(cfg: &ServerConfig) -> Vec<(&'static str, serde_json::Value)> {
        vec![app::fixed("clusters_dir", &cfg.clusters_dir)]
    }

    /// Agents may come over QUIC when `agents.quic` listens.
    fn quic_sessions(cfg: &ServerConfig) -> bool {
        cfg.agents.quic.is_some()
    }

    async fn bind(cfg: Arc<ServerConfig>, ctx: Ctx) -> Result<(Self, Opened), StartError> {
        let tls_metrics = TlsMetrics::new(&ctx.registry);
        let (agent_listeners, agents_opened) = agents::Listeners::bind(&cfg, &tls_metrics, &ctx.shutdown.stop).await?;
        let (frontend_listeners, frontends_opened) =
            frontend::Listeners::bind(&cfg, &tls_metrics, &ctx.shutdown.stop).await?;
        let metrics = ServerMetrics::new(&ctx.registry);
        let (files, watch) = match &cfg.clusters_dir {
            None => (ClusterFiles::new(None), None),
            Some(dir) => {
                let (watch, first) = DirWatch::start(dir, seedgate_config::server::parse_cluster_file).await;
                let mut files = ClusterFiles::new(Some(FileMetrics::new(&ctx.registry, "cluster")));
                files.absorb(first, &cfg.clusters);
                (files, Some(watch))
            }
        };
        let mut states = cfg.clusters.clone();
        states.extend(files.states().map(|(k, v)| (k.clone(), v.clone())));
        let shared = Arc::new(Shared {
            directory: SessionDirectory::new(metrics.clone(), &ctx.registry, &states, ctx.shutdown.kill.clone()),
            config: ArcSwap::new(cfg.clone()),
            metrics,
            shutdown: ctx.shutdown,
            states: Mutex::new(shared::StateSources::new(files)),
            rules: watch::Sender::new(()),
        });
        let agents = Arc::new(Agents::new(shared.clone(), &ctx.registry, &tls_metrics));
        let pending = Pending::new(cfg.pending_budget(), PendingMetrics::new(&ctx.registry));
        let limit = ConnLimit::new(ctx.connections.clone(), None);
        let frontends = Arc::new(Frontends::new(shared.clone(), pending, limit));
        shared.apply_states();
        let admin = Admin { shared: shared.clone(), agents: agents.clone(), frontends: frontends.clone() };
        let sessions_stop = CancellationToken::new();
        let this = Self { shared, agents, frontends, admin, agent_listeners, frontend_listeners, sessions_stop };
        Ok((this, Opened { agents: agents_opened, frontends: frontends_opened, watch }))
    }

    fn start(self: &Arc<Self>, opened: Opened) {
        self.agent_listeners.start(&self.agents, &self.sessions_stop, opened.agents);
        self.frontend_listeners.start(&self.frontends, opened.frontends);
        self.agents.announce();
        if let Some(watch) = opened.watch {
            let shared = self.shared.clone();
            watch.follow(self.shared.shutdown.stop.clone(), "cluster files", move |up| {
                let main = shared.config.load_full();
                let changed = shared.states.lock().files.absorb(up, &main.clusters);
                if changed {
                    // As a config reload of the states: admin overrides still win.
                    shared.apply_states();
                }
            });
        }
    }

    /// Sockets and TLS files first (they can fail), then timeouts, limits and cluster states.
    async fn apply(self: &Arc<Self>, new: Arc<ServerConfig>) -> Result<(), ReloadRefused> {
        if let Some(e) = self.shared.states.lock().files.conflict_with(&new.clusters) {
            return Err(e.into());
        }
        // Everything that can fail first (new TLS material, new sockets), then the swap.
        let agents = self.agent_listeners.stage(&new).await.map_err(ListenersRefused::from)?;
        let frontends = self.frontend_listeners.stage(&new).await?;
        self.agent_listeners.commit(&self.agents, &self.sessions_stop, &new, agents);
        self.frontend_listeners.commit(&self.frontends, &new, frontends);
        self.frontends.pending.set_limits(new.pending_budget());
        self.agents.reconfigure(&new);
        self.shared.config.store(new);
        self.shared.apply_states();
        Ok(())
    }

    fn listeners(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        self.frontend_listeners.addresses(&mut out);
        self.agent_listeners.addresses(&mut out);
        out
    }

    fn ready(&self) -> Vec<Check> {
        self.admin.ready()
    }

    fn show_config(&self, running: &ServerConfig) -> serde_json::Value {
        self.admin.show_config(running)
    }

    fn control(&self, req: ControlRequest<'_>) -> Option<(http::StatusCode, String)> {
        self.admin.endpoint(req)
    }

    fn status(&self, query: &StatusQuery) -> Option<StatusPage> {
        let mut addresses = BTreeMap::new();
        self.frontend_listeners.addresses(&mut addresses);
        Some(self.admin.status(&addresses, query))
    }

    async fn stopped(&self) {
        self.sessions_stop.cancel();
        self.frontend_listeners.remove_socket_files();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quic_listener_for_agents_keeps_the_work_stealing_runtime() {
        let cfg = |extra: &str| {
            let y = format!("agents: {{ listen: 127.0.0.1:0, tls: {{ cert: c, key: k, client_ca: ca }}{extra} }}\n");
            seedgate_config::server::parse(&y, "t.yaml").expect("valid")
        };
        assert!(!Server::quic_sessions(&cfg("")));
        assert!(Server::quic_sessions(&cfg(", quic: { listen: 127.0.0.1:0 }")));
    }
}
