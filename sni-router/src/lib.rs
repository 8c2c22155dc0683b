//! sni-router: the seed's ingress gateway. Routes TLS by SNI, PROXY-protocol destination or HTTP CONNECT header, without terminating TLS.
//!
//! The process lifecycle (bind, serve, reload, drain) is [`proxy_core::app`]; this crate adds
//! the listeners and their routing tables. Reloads swap the tables atomically: new connections
//! see the new routes, live connections keep the route they were admitted with.

mod conn;
mod listeners;
mod table;
mod upstream;

use arc_swap::ArcSwap;
use listeners::Listeners;
use proxy_core::accept::Slots;
use proxy_core::admin::Check;
use proxy_core::app::{self, Ctx, Service, StartError};
use proxy_core::ids::ConnIds;
use proxy_core::metrics::{self, ConnMetrics};
use proxy_core::prometheus::IntGaugeVec;
use proxy_core::shutdown::Shutdown;
use seedgate_config::RouterConfig;
use std::collections::BTreeMap;
use std::sync::Arc;

pub use proxy_core::app::Options;

pub(crate) struct Metrics {
    pub(crate) conn: ConnMetrics,
    routes: IntGaugeVec,
}

/// State every connection task can reach.
pub(crate) struct Shared {
    pub(crate) config: ArcSwap<RouterConfig>,
    pub(crate) metrics: Metrics,
    pub(crate) shutdown: Shutdown,
    pub(crate) ids: ConnIds,
    connections: Arc<Slots>,
}

/// The router as a [`Service`] of the shared lifecycle.
pub struct Router {
    shared: Arc<Shared>,
    listeners: Listeners,
}

pub type Bound = app::Bound<Router>;

/// Bind every listener and the admin socket of `cfg`; [`app::Bound::run`] serves.
pub async fn bind(cfg: RouterConfig, opts: Options) -> Result<Bound, StartError> {
    app::bind(cfg, opts).await
}

fn new_shared(cfg: Arc<RouterConfig>, ctx: &Ctx) -> Shared {
    let reg = &ctx.registry;
    Shared {
        config: ArcSwap::new(cfg),
        metrics: Metrics {
            conn: ConnMetrics::new(reg),
            routes: metrics::gauge_vec(reg, "seedgate_routes", "Routes loaded, by listener.", &["listener"]),
        },
        shutdown: ctx.shutdown.clone(),
        ids: ConnIds::default(),
        connections: ctx.connections.clone(),
    }
}

impl Service for Router {
    type Config = RouterConfig;
    const NAME: &'static str = "sni-router";

    async fn bind(cfg: Arc<RouterConfig>, ctx: Ctx) -> Result<Self, StartError> {
        let shared = Arc::new(new_shared(cfg.clone(), &ctx));
        let listeners = Listeners::bind(&shared, &cfg).await?;
        Ok(Self { shared, listeners })
    }

    fn start(self: &Arc<Self>) {
        self.listeners.start(&self.shared);
    }

    async fn apply(self: &Arc<Self>, new: Arc<RouterConfig>) -> Result<(), String> {
        self.listeners.apply(&self.shared, new).await
    }

    fn listeners(&self) -> BTreeMap<String, String> {
        self.listeners.addresses()
    }

    fn ready(&self) -> Vec<Check> {
        self.listeners.ready()
    }
}

#[cfg(test)]
pub(crate) fn test_shared() -> Shared {
    let cfg =
        seedgate_config::router::parse("listeners:\n  - name: gw\n    listen: 127.0.0.1:0\n", "t.yaml").expect("valid");
    let ctx = Ctx { registry: Default::default(), shutdown: Shutdown::new(), connections: Slots::new(10) };
    new_shared(Arc::new(cfg), &ctx)
}
