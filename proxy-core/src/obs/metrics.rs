//! The metrics registry and the connection metrics every binary shares (prefix `seedgate_`).

use prometheus::core::{Collector, MetricVec, MetricVecBuilder};
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder, exponential_buckets,
};
use std::cell::RefCell;

/// Register `c` in `reg`; while `noting` (test-util) runs on this thread, also note what it is. Every
/// metric of the binaries is registered through here, so the metrics reference lists them all.
pub fn register(reg: &Registry, c: Box<dyn Collector>) -> prometheus::Result<()> {
    NOTED.with(|n| {
        if let Some(list) = n.borrow_mut().as_mut() {
            list.extend(describe(&*c));
        }
    });
    reg.register(c)
}

/// [`register`], for a metric registered once per registry.
fn register_once(reg: &Registry, c: Box<dyn Collector>) {
    register(reg, c).expect("metric registered once");
}

/// One registered metric as the metrics reference shows it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct MetricInfo {
    pub name: String,
    /// `counter`, `gauge`, `histogram`, ...
    pub kind: String,
    pub labels: Vec<String>,
    pub help: String,
}

thread_local! {
    /// `Some` while [`noting`] runs on this thread.
    static NOTED: RefCell<Option<Vec<MetricInfo>>> = const { RefCell::new(None) };
}

/// Run `f` and return, with its result, every metric [`register`] registered on this thread
/// meanwhile (run a binary's `bind` on a current-thread runtime inside it to learn its metrics).
#[cfg(any(test, feature = "test-util"))]
pub fn noting<T>(f: impl FnOnce() -> T) -> (T, Vec<MetricInfo>) {
    let outer = NOTED.with(|n| n.borrow_mut().replace(Vec::new()));
    let out = f();
    let noted = NOTED.with(|n| std::mem::replace(&mut *n.borrow_mut(), outer)).unwrap_or_default();
    (out, noted)
}

fn describe(c: &dyn Collector) -> Vec<MetricInfo> {
    let families = c.collect();
    c.desc()
        .into_iter()
        .map(|d| {
            let kind = families.iter().find(|f| f.name() == d.fq_name).map(|f| f.get_field_type());
            MetricInfo {
                name: d.fq_name.clone(),
                kind: kind.map(|k| format!("{k:?}").to_ascii_lowercase()).unwrap_or_else(|| "untyped".into()),
                labels: d.variable_labels.clone(),
                help: d.help.clone(),
            }
        })
        .collect()
}

/// Build a labelled counter and register it.
pub fn counter_vec(reg: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
    register_once(reg, Box::new(c.clone()));
    c
}

pub fn gauge_vec(reg: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
    register_once(reg, Box::new(g.clone()));
    g
}

pub fn counter(reg: &Registry, name: &str, help: &str) -> IntCounter {
    let c = IntCounter::new(name, help).expect("valid metric");
    register_once(reg, Box::new(c.clone()));
    c
}

pub fn gauge(reg: &Registry, name: &str, help: &str) -> IntGauge {
    let g = IntGauge::new(name, help).expect("valid metric");
    register_once(reg, Box::new(g.clone()));
    g
}

/// Latency histogram in seconds, 50 µs .. ~50 s.
pub fn seconds_histogram(reg: &Registry, name: &str, help: &str, labels: &[&str]) -> HistogramVec {
    let buckets = exponential_buckets(0.00005, 2.0, 21).expect("valid buckets");
    let h = HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), labels).expect("valid metric");
    register_once(reg, Box::new(h.clone()));
    h
}

/// Create the series of `vec` for every combination of `labels` (one list of values per label,
/// in the vector's label order), at 0 where they are new. A family whose label values are known
/// (a closed set of reasons, the configured listeners, routes or clusters) is so exported before
/// its first event: a dashboard or an alert then reads 0, not "no data". Never for open-ended
/// values (client addresses, targets).
pub fn at_zero<T: MetricVecBuilder>(vec: &MetricVec<T>, labels: &[&[&str]]) {
    fn each<'a, T: MetricVecBuilder>(vec: &MetricVec<T>, rest: &[&[&'a str]], chosen: &mut Vec<&'a str>) {
        match rest.split_first() {
            None => {
                let _ = vec.with_label_values(chosen);
            }
            Some((values, rest)) => {
                for v in *values {
                    chosen.push(v);
                    each(vec, rest, chosen);
                    chosen.pop();
                }
            }
        }
    }
    each(vec, labels, &mut Vec::with_capacity(labels.len()));
}

/// Render the registry in the Prometheus text format.
pub fn render(reg: &Registry) -> String {
    let mut out = Vec::new();
    let _ = TextEncoder::new().encode(&reg.gather(), &mut out);
    String::from_utf8(out).unwrap_or_default()
}

/// The direction labels of `seedgate_proxied_bytes_total`.
pub const BYTE_DIRECTIONS: [&str; 2] = ["to_upstream", "to_client"];

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
        let reloads = counter_vec(
            reg,
            "seedgate_config_reloads_total",
            "Config reload attempts, by result (success, failure).",
            &["result"],
        );
        at_zero(&reloads, &[&["success", "failure"]]);
        Self {
            reloads,
            last_success: gauge(
                reg,
                "seedgate_config_last_reload_success_timestamp_seconds",
                "Unix time of the last config (re)load that took effect.",
            ),
        }
    }
}

const BUILD_INFO: &str = "seedgate_build_info";

/// `seedgate_build_info{version, binary} 1`.
pub fn register_build_info(reg: &Registry, binary: &str) {
    let g = gauge_vec(reg, BUILD_INFO, "Build information.", &["binary", "version"]);
    g.with_label_values(&[binary, env!("CARGO_PKG_VERSION")]).set(1);
}

/// Whether `reg` holds `seedgate_build_info` already, i.e. the metrics of a binary.
pub fn holds_build_info(reg: &Registry) -> bool {
    reg.gather().iter().any(|f| f.name() == BUILD_INFO)
}
