//! What every UDP listener of the process draws on: the flow budget (`limits.udp_flows`) and the UDP metrics.

use proxy_core::obs::metrics::{at_zero, counter_vec, gauge_vec};
use proxy_core::prometheus::{IntCounterVec, IntGauge, IntGaugeVec, Registry};
use proxy_wire::client_hello::HelloError;
use proxy_wire::quic_initial::InitialError;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The UDP listeners' metrics.
pub(crate) struct UdpMetrics {
    pub(crate) flows_active: IntGaugeVec,
    pub(crate) flows: IntCounterVec,
    pub(crate) dropped: IntCounterVec,
    pub(crate) migrated: IntCounterVec,
    pub(crate) migrations_refused: IntCounterVec,
}

/// Why a UDP listener drops datagrams, besides the reasons its flows are refused for.
const DROPS: [&str; 10] = [
    "queue_full",
    "source_not_allowed",
    "stopping",
    "pending_full",
    "flows_full",
    "timeout",
    "upstream_busy",
    "upstream_error",
    "client_error",
    "upstream_unreachable",
];

/// Why a flow is refused before it has a route (counted under the route ``), besides the
/// Initial's and the ClientHello's readers' reasons.
const UNROUTED: [&str; 4] = ["pending_full", "flows_full", "timeout", "unknown_sni"];

/// How a flow with a route ends up: `ok`, or refused.
const ROUTED: [&str; 3] = ["ok", "source_not_allowed", "upstream_unreachable"];

/// Why a datagram from another address does not move a flow there (see `migration`).
const MIGRATIONS_REFUSED: [&str; 5] =
    ["client_active", "too_few_packets", "duplicate", "too_many_addresses", "source_not_allowed"];

/// The results of flows refused before routing: [`UNROUTED`] and the readers' reasons.
pub(crate) fn unrouted_results() -> Vec<&'static str> {
    let mut all = UNROUTED.to_vec();
    all.extend(InitialError::REASONS);
    all.extend(HelloError::REASONS);
    all
}

/// Every reason datagrams are dropped for.
pub(crate) fn drop_reasons() -> Vec<&'static str> {
    let mut all = DROPS.to_vec();
    all.extend(unrouted_results());
    all
}

/// Every result a flow with a route is counted with.
pub(crate) fn routed_results() -> &'static [&'static str] {
    &ROUTED
}

impl UdpMetrics {
    /// A UDP listener's series at 0: its flows held, datagrams dropped and flows refused
    /// before routing, by each reason.
    pub(crate) fn listener_at_zero(&self, listener: &str) {
        let _ = self.flows_active.with_label_values(&[listener]);
        at_zero(&self.dropped, &[&[listener], &drop_reasons()]);
        at_zero(&self.flows, &[&[listener], &[""], &unrouted_results()]);
    }

    /// A route of a UDP listener: its flows by result, migrations and refused migrations.
    pub(crate) fn route_at_zero(&self, listener: &str, route: &str) {
        at_zero(&self.flows, &[&[listener], &[route], &ROUTED]);
        let _ = self.migrated.with_label_values(&[listener, route]);
        at_zero(&self.migrations_refused, &[&[listener], &[route], &MIGRATIONS_REFUSED]);
    }

    pub(crate) fn new(reg: &Registry) -> Self {
        Self {
            flows_active: gauge_vec(
                reg,
                "seedgate_udp_flows_active",
                "UDP flows held now (routed or waiting for their ClientHello), by listener.",
                &["listener"],
            ),
            flows: counter_vec(
                reg,
                "seedgate_udp_flows_total",
                "UDP flows by listener, route and result (ok, or why the flow was refused).",
                &["listener", "route", "result"],
            ),
            dropped: counter_vec(
                reg,
                "seedgate_udp_datagrams_dropped_total",
                "Datagrams from clients or upstreams not relayed, by listener and reason.",
                &["listener", "reason"],
            ),
            migrated: counter_vec(
                reg,
                "seedgate_udp_flows_migrated_total",
                "UDP flows that moved to a new client address (found by their connection ID), by listener and route.",
                &["listener", "route"],
            ),
            migrations_refused: counter_vec(
                reg,
                "seedgate_udp_migrations_refused_total",
                "Datagrams for a UDP flow from an address it did not move to, by listener, route and reason \
                 (client_active, too_few_packets, duplicate, too_many_addresses, source_not_allowed).",
                &["listener", "route", "reason"],
            ),
        }
    }
}

/// Flows held by the whole process, against `limits.udp_flows`.
#[derive(Default)]
pub(crate) struct FlowBudget {
    used: AtomicUsize,
}

impl FlowBudget {
    /// A slot if fewer than `limit` are taken; it is given back when dropped.
    pub(crate) fn try_take(self: &Arc<Self>, limit: usize, gauge: IntGauge) -> Option<FlowSlot> {
        self.used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < limit).then_some(n + 1)).ok()?;
        gauge.inc();
        Some(FlowSlot { budget: self.clone(), gauge })
    }

    #[cfg(test)]
    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }
}

/// One flow's place in the [`FlowBudget`] and in `seedgate_udp_flows_active`.
pub(crate) struct FlowSlot {
    budget: Arc<FlowBudget>,
    gauge: IntGauge,
}

impl Drop for FlowSlot {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(1, Ordering::AcqRel);
        self.gauge.dec();
    }
}
