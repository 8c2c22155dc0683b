//! The metrics registry and the connection metrics every binary shares (prefix `seedgate_`).

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder, exponential_buckets,
};

/// Build a labelled counter and register it.
pub fn counter_vec(reg: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
    reg.register(Box::new(c.clone())).expect("metric registered once");
    c
}

pub fn gauge_vec(reg: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
    reg.register(Box::new(g.clone())).expect("metric registered once");
    g
}

pub fn counter(reg: &Registry, name: &str, help: &str) -> IntCounter {
    let c = IntCounter::new(name, help).expect("valid metric");
    reg.register(Box::new(c.clone())).expect("metric registered once");
    c
}

pub fn gauge(reg: &Registry, name: &str, help: &str) -> IntGauge {
    let g = IntGauge::new(name, help).expect("valid metric");
    reg.register(Box::new(g.clone())).expect("metric registered once");
    g
}

/// Latency histogram in seconds, 50 µs .. ~50 s.
pub fn seconds_histogram(reg: &Registry, name: &str, help: &str, labels: &[&str]) -> HistogramVec {
    let buckets = exponential_buckets(0.00005, 2.0, 21).expect("valid buckets");
    let h = HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), labels).expect("valid metric");
    reg.register(Box::new(h.clone())).expect("metric registered once");
    h
}

/// Render the registry in the Prometheus text format.
pub fn render(reg: &Registry) -> String {
    let mut out = Vec::new();
    let _ = TextEncoder::new().encode(&reg.gather(), &mut out);
    String::from_utf8(out).unwrap_or_default()
}

/// Metrics of connection handling, shared by every listener of a binary.
#[derive(Clone)]
pub struct ConnMetrics {
    /// Connections by listener, route and result (`ok`, or the reject/failure reason).
    pub connections: IntCounterVec,
    pub active: IntGaugeVec,
    /// Bytes relayed, by listener, route and direction (`to_upstream`, `to_client`).
    pub bytes: IntCounterVec,
    /// Connections refused before relaying, by listener and reason.
    pub rejects: IntCounterVec,
    /// Time from accept to the routing decision (PROXY header, ClientHello or CONNECT head).
    pub handshake_seconds: HistogramVec,
    pub connect_seconds: HistogramVec,
    pub connect_failures: IntCounterVec,
    pub accept_errors: IntCounterVec,
    /// How relays ended, by listener and reason (closed, idle_timeout, client_reset, ...).
    pub closes: IntCounterVec,
}

impl ConnMetrics {
    pub fn new(reg: &Registry) -> Self {
        Self {
            connections: counter_vec(
                reg,
                "seedgate_connections_total",
                "Connections handled, by listener, route and result.",
                &["listener", "route", "result"],
            ),
            active: gauge_vec(reg, "seedgate_connections_active", "Connections open now, by listener.", &["listener"]),
            bytes: counter_vec(
                reg,
                "seedgate_proxied_bytes_total",
                "Bytes relayed, by listener, route and direction.",
                &["listener", "route", "direction"],
            ),
            rejects: counter_vec(
                reg,
                "seedgate_rejects_total",
                "Connections refused before relaying, by listener and reason.",
                &["listener", "reason"],
            ),
            handshake_seconds: seconds_histogram(
                reg,
                "seedgate_handshake_duration_seconds",
                "Time from accept to the routing decision, by listener and protocol.",
                &["listener", "protocol"],
            ),
            connect_seconds: seconds_histogram(
                reg,
                "seedgate_upstream_connect_duration_seconds",
                "Upstream TCP connect time, by listener and route.",
                &["listener", "route"],
            ),
            connect_failures: counter_vec(
                reg,
                "seedgate_upstream_connect_failures_total",
                "Failed upstream connect attempts, by listener, route and reason.",
                &["listener", "route", "reason"],
            ),
            accept_errors: counter_vec(
                reg,
                "seedgate_accept_errors_total",
                "accept() errors, by listener and reason.",
                &["listener", "reason"],
            ),
            closes: counter_vec(
                reg,
                "seedgate_connection_closes_total",
                "How relayed connections ended, by listener and reason.",
                &["listener", "reason"],
            ),
        }
    }
}

/// Config reload outcome metrics.
#[derive(Clone)]
pub struct ReloadMetrics {
    pub reloads: IntCounterVec,
    pub last_success: IntGauge,
}

impl ReloadMetrics {
    pub fn new(reg: &Registry) -> Self {
        Self {
            reloads: counter_vec(
                reg,
                "seedgate_config_reloads_total",
                "Config reload attempts, by result (success, failure).",
                &["result"],
            ),
            last_success: gauge(
                reg,
                "seedgate_config_last_reload_success_timestamp_seconds",
                "Unix time of the last config (re)load that took effect.",
            ),
        }
    }
}

/// `seedgate_build_info{version, binary} 1`.
pub fn register_build_info(reg: &Registry, binary: &str) {
    let g = gauge_vec(reg, "seedgate_build_info", "Build information.", &["binary", "version"]);
    g.with_label_values(&[binary, env!("CARGO_PKG_VERSION")]).set(1);
}
