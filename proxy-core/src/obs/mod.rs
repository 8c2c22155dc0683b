//! What the process tells its operators: the metrics registry and shared metrics, runtime gauges, the admin listener and log setup.

pub mod admin;
pub mod metrics;
pub mod runtime_metrics;
pub mod telemetry;
