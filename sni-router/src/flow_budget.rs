//! What every UDP listener of the process draws on: the flow budget (`limits.udp_flows`) and the UDP metrics.

use proxy_core::obs::metrics::{counter_vec, gauge_vec};
use proxy_core::prometheus::{IntCounterVec, IntGauge, IntGaugeVec, Registry};
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

impl UdpMetrics {
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
