//! sni-router: the seed's ingress gateway. Routes TLS by SNI, PROXY-protocol destination or HTTP CONNECT header, and QUIC by SNI, without terminating TLS or QUIC.
//!
//! The process lifecycle (bind, serve, reload, drain) is [`proxy_core::app`]; this crate adds
//! the listeners and their routing tables. Reloads swap the tables atomically: new connections
//! see the new routes, live connections keep the route they were admitted with.

mod conn;
mod files;
mod flow_budget;
mod listeners;
mod migration;
mod refusal;
mod running;
mod shared;
mod status;
mod table;
mod udp;
mod upstream;

use shared::{Shared, new_shared};

use files::RouteFiles;
use listeners::Listeners;
use proxy_core::app::{self, Ctx, Service, StartError};
use proxy_core::obs::admin::Check;
use proxy_core::obs::status::{StatusPage, StatusQuery};
use proxy_core::watch::dir::{DirWatch, FileMetrics};
use seedgate_config::RouterConfig;
use seedgate_config::router::Route as RouteCfg;
use std::collections::BTreeMap;
use std::sync::Arc;

pub use files::RouteFileConflict;
pub use proxy_core::app::Options;

/// Why sni-router refuses a reloaded config (then nothing changed).
#[derive(Debug, thiserror::Error)]
pub enum ReloadRefused {
    /// A route file in force does not fit the new config.
    #[error(transparent)]
    RouteFile(#[from] RouteFileConflict),
    /// A listener's new socket could not be bound.
    #[error(transparent)]
    Listener(#[from] StartError),
}

/// The router as a [`Service`] of the shared lifecycle.
pub struct Router {
    shared: Arc<Shared>,
    listeners: Listeners,
    /// The route files in force. Held across every table change, so a main-config reload and a
    /// route-file change never interleave.
    files: tokio::sync::Mutex<RouteFiles>,
}

pub type Bound = app::Bound<Router>;

/// What `bind` opened for `start`: the listeners' sockets, and the watch of `routes_dir`.
pub struct Opened {
    listeners: listeners::Bound,
    watch: Option<DirWatch<Vec<RouteCfg>>>,
}

/// Bind every listener and the admin socket of `cfg`; [`app::Bound::run`] serves.
pub async fn bind(cfg: RouterConfig, opts: Options) -> Result<Bound, StartError> {
    app::bind(cfg, opts).await
}

impl Service for Router {
    type Config = RouterConfig;
    const NAME: &'static str = "sni-router";
    type Opened = Opened;
    type ApplyError = ReloadRefused;

    fn restart_only(cfg: &RouterConfig) -> Vec<(&'static str, serde_json::Value)> {
        vec![app::fixed("routes_dir", &cfg.routes_dir)]
    }

    async fn bind(cfg: Arc<RouterConfig>, ctx: Ctx) -> Result<(Self, Self::Opened), StartError> {
        let shared = Arc::new(new_shared(cfg.clone(), &ctx));
        let (files, watch) = match &cfg.routes_dir {
            None => (RouteFiles::new(&cfg, None), None),
            Some(dir) => {
                let (watch, first) = DirWatch::start(dir, seedgate_config::router::parse_route_file).await;
                let mut files = RouteFiles::new(&cfg, Some(FileMetrics::new(&ctx.registry, "route")));
                files.absorb(first);
                (files, Some(watch))
            }
        };
        let (listeners, bound) = Listeners::bind(&shared, &cfg, &files.extra()).await?;
        if files.summary().0 > 0 {
            let (n, routes, refused) = files.summary();
            tracing::info!(files = n, routes, refused, "route files loaded");
        }
        Ok((Self { shared, listeners, files: tokio::sync::Mutex::new(files) }, Opened { listeners: bound, watch }))
    }

    fn start(self: &Arc<Self>, Opened { listeners, watch }: Opened) {
        Listeners::start(&self.shared, listeners);
        if let Some(watch) = watch {
            let this = self.clone();
            watch.follow(self.shared.shutdown.stop.clone(), "route files", move |up| {
                let started = std::time::Instant::now();
                let mut files = this.files.blocking_lock();
                let changes = files.absorb(up);
                files.apply(&this.shared, &this.listeners, &changes);
                drop(files);
                let apply_ms = started.elapsed().as_secs_f64() * 1e3;
                tracing::info!(listeners = changes.len(), apply_ms, "route files applied");
            });
        }
    }

    async fn apply(self: &Arc<Self>, new: Arc<RouterConfig>) -> Result<(), ReloadRefused> {
        // The route files stay as parsed; only their fit with the new listeners is checked.
        let mut files = self.files.lock().await;
        let claims = files.rebase(&new)?;
        let limits = new.pending_budget();
        self.listeners.apply(&self.shared, new, &files.extra()).await?;
        self.shared.pending.set_limits(limits);
        files.set_claims(claims);
        Ok(())
    }

    fn listeners(&self) -> BTreeMap<String, String> {
        self.listeners.addresses()
    }

    fn ready(&self) -> Vec<Check> {
        let share = self.shared.config.load().limits.tenant_share;
        let mut checks = vec![self.shared.pending.readiness(), self.shared.shares.readiness(share)];
        checks.extend(self.listeners.ready());
        if let Some(dir) = &self.shared.config.load().routes_dir
            && let Ok(files) = self.files.try_lock()
        {
            let (n, routes, refused) = files.summary();
            let total = self.listeners.route_count();
            checks.push(Check::info(
                "route-files",
                format!("{dir}: {n} files, {routes} routes ({refused} files refused); {total} routes in all"),
            ));
        }
        checks
    }

    fn status(&self, query: &StatusQuery) -> Option<StatusPage> {
        Some(status::status(&self.shared, &self.listeners.running(), query))
    }

    fn show_config(&self, running: &RouterConfig) -> serde_json::Value {
        let mut v = serde_json::to_value(running).unwrap_or_default();
        if running.routes_dir.is_some()
            && let Ok(files) = self.files.try_lock()
        {
            v["route_files"] = files.show();
        }
        v
    }
}
