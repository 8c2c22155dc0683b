//! What every sni-router connection task, listener and reloader can reach: config, metrics, budgets and shares.

use crate::flow_budget::{FlowBudget, UdpMetrics};
use arc_swap::ArcSwap;
use proxy_core::app::Ctx;
use proxy_core::app::shutdown::Shutdown;
use proxy_core::net::accept::Slots;
use proxy_core::net::ids::ConnIds;
use proxy_core::net::pending::{Pending, PendingMetrics};
use proxy_core::net::share::{Naming, Shares, TenantSeries};
use proxy_core::obs::metrics::{self, ConnMetrics};
use proxy_core::prometheus::IntGaugeVec;
use seedgate_config::RouterConfig;
use std::sync::Arc;

pub(crate) struct Metrics {
    pub(crate) conn: ConnMetrics,
    pub(crate) routes: IntGaugeVec,
    pub(crate) udp: UdpMetrics,
    /// The routes' shares' series, which a route has from when it is configured.
    pub(crate) route_shares: TenantSeries,
}

/// State every connection task can reach.
pub(crate) struct Shared {
    pub(crate) config: ArcSwap<RouterConfig>,
    pub(crate) metrics: Metrics,
    pub(crate) shutdown: Shutdown,
    pub(crate) ids: ConnIds,
    pub(crate) connections: Arc<Slots>,
    /// Connections accepted and not yet routed (`limits.max_pending` and friends).
    pub(crate) pending: Arc<Pending>,
    /// UDP flows held by every UDP listener (`limits.udp_flows`).
    pub(crate) udp_flows: Arc<FlowBudget>,
    /// Each route's routed and pending connections against its share of the process limits.
    pub(crate) shares: Shares,
}

/// How routes are named as tenants: `seedgate_route_connections{listener,route}` and friends.
const ROUTE_SHARES: Naming = Naming { tenant: "route", labels: &["listener", "route"], established: "connections" };

pub(crate) fn new_shared(cfg: Arc<RouterConfig>, ctx: &Ctx) -> Shared {
    let reg = &ctx.registry;
    let shares = Shares::new(reg, ROUTE_SHARES);
    Shared {
        pending: Pending::new(cfg.pending_budget(), PendingMetrics::new(reg)),
        config: ArcSwap::new(cfg),
        metrics: Metrics {
            conn: ConnMetrics::new(reg),
            routes: metrics::gauge_vec(reg, "seedgate_routes", "Routes loaded, by listener.", &["listener"]),
            udp: UdpMetrics::new(reg),
            route_shares: shares.series(),
        },
        udp_flows: Arc::default(),
        shares,
        shutdown: ctx.shutdown.clone(),
        ids: ConnIds::default(),
        connections: ctx.connections.clone(),
    }
}

#[cfg(test)]
pub(crate) fn test_shared() -> Shared {
    test_shared_with("listeners:\n  - name: gw\n    listen: 127.0.0.1:0\n")
}

#[cfg(test)]
pub(crate) fn test_shared_with(yaml: &str) -> Shared {
    let cfg = seedgate_config::router::parse(yaml, "t.yaml").expect("valid");
    let ctx = Ctx { registry: Default::default(), shutdown: Shutdown::new(), connections: Slots::new(10) };
    new_shared(Arc::new(cfg), &ctx)
}
