//! proxy-server: the seed end of the reverse tunnel. Agents dial in; front ends (CONNECT, forward proxy) dial out through them.
//!
//! The process lifecycle (bind, serve, reload, drain) is [`proxy_core::app`]; this crate adds
//! the agents' listener and sessions (with their identities: certificates, revocation lists,
//! ServiceAccount tokens), the front ends and the per-cluster state. At shutdown the
//! front-end connections drain for the grace period, then the agent sessions close.

mod agents;
mod attempt;
mod cluster_files;
mod control;
mod frontend;
mod identity;
mod listeners;
mod liveness;
mod metrics;
mod registry;
mod replica;
mod rereview;
mod revocation;
mod session;
mod settle;
mod shared;
mod status;
mod strategy;
mod tokens;
mod unix_socket;

use shared::Shared;

use arc_swap::ArcSwap;
use cluster_files::ClusterFiles;
use listeners::Listeners;
use proxy_core::app::{self, Ctx, Service, StartError};
use proxy_core::net::accept::ConnLimit;
use proxy_core::net::ids::ConnIds;
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
use tokio_util::sync::CancellationToken;

pub use cluster_files::DefinedTwice;
pub use listeners::ApplyError as ListenersRefused;
pub use metrics::ServerMetrics;
pub use proxy_core::app::Options;
pub use unix_socket::SocketError;

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

/// proxy-server as a [`Service`] of the shared lifecycle.
pub struct Server {
    shared: Arc<Shared>,
    listeners: Listeners,
    /// Ends the agent sessions, after the front ends drained.
    sessions_stop: CancellationToken,
}

/// What [`Server`]'s `bind` opened for its `start`: the sockets, and the watch of `clusters_dir`.
pub struct Opened {
    listeners: listeners::Opened,
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
        let (listeners, opened) = Listeners::bind(&cfg, &tls_metrics, &ctx.shutdown.stop).await?;
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
            pending: Pending::new(cfg.pending_budget(), PendingMetrics::new(&ctx.registry)),
            limit: ConnLimit::new(ctx.connections.clone(), None),
            config: ArcSwap::new(cfg.clone()),
            metrics,
            shutdown: ctx.shutdown,
            ids: ConnIds::default(),
            states: Mutex::new(shared::StateSources::new(files)),
            unknown: Mutex::default(),
            replica: replica::Replica::new(&cfg),
            settle: settle::Settle::new(std::time::Instant::now()),
            reviewers: tokens::Reviewers::new(&ctx.registry, &tls_metrics, cfg.agents.token_review.cache_size),
            agents_revoked: Default::default(),
        });
        shared.apply_states();
        let this = Self { shared, listeners, sessions_stop: CancellationToken::new() };
        Ok((this, Opened { listeners: opened, watch }))
    }

    fn start(self: &Arc<Self>, opened: Opened) {
        self.listeners.start(&self.shared, &self.sessions_stop, opened.listeners);
        let shared = &self.shared;
        shared.metrics.replica_count.set(i64::from(shared.replica.info().count));
        tracing::info!(id = %shared.replica.info().id, count = shared.replica.info().count, peers = ?shared.config.load().agents.peers, "replica identity");
        tokio::spawn(shared.clone().follow_peers());
        // SIGTERM: tell the agents before the drain, so they find another replica while their
        // live streams here finish.
        let (s, stop) = (shared.clone(), shared.shutdown.stop.clone());
        tokio::spawn(async move {
            stop.cancelled().await;
            s.replica.draining(&s.metrics, &s.directory);
        });
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
        self.listeners.apply(&self.shared, &self.sessions_stop, &new).await?;
        self.shared.pending.set_limits(new.pending_budget());
        self.shared.reviewers.resize(new.agents.token_review.cache_size);
        self.shared.replica.reconfigure(&self.shared.metrics, &self.shared.directory, &new);
        self.shared.config.store(new);
        self.shared.apply_states();
        Ok(())
    }

    fn listeners(&self) -> BTreeMap<String, String> {
        self.listeners.addresses()
    }

    fn ready(&self) -> Vec<Check> {
        let mut checks = control::ready(&self.shared);
        checks.push(self.shared.pending.readiness());
        checks.push(self.shared.directory.shares.readiness(self.shared.config.load().limits.tenant_share));
        checks.push(self.shared.replica.check(&self.shared.config.load()));
        if let Some(dir) = &self.shared.config.load().clusters_dir {
            let (n, clusters, refused) = self.shared.states.lock().files.summary();
            let detail = format!("{dir}: {n} files, {clusters} clusters ({refused} files refused)");
            checks.push(Check::info("cluster-files", detail));
        }
        checks
    }

    fn show_config(&self, running: &ServerConfig) -> serde_json::Value {
        let mut v = serde_json::to_value(running).unwrap_or_default();
        let sources = self.shared.states.lock();
        v["cluster_overrides"] = serde_json::to_value(&sources.overrides).unwrap_or_default();
        if running.clusters_dir.is_some() {
            v["cluster_files"] = sources.files.show();
        }
        v
    }

    fn control(&self, req: ControlRequest<'_>) -> Option<(http::StatusCode, String)> {
        control::control(&self.shared, req)
    }

    fn status(&self, query: &StatusQuery) -> Option<StatusPage> {
        Some(status::status(&self.shared, &self.listeners.addresses(), query))
    }

    async fn stopped(&self) {
        self.sessions_stop.cancel();
        self.listeners.remove_socket_files();
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
