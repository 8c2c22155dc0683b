//! What the process tells its operators: the metrics registry and shared metrics, runtime gauges, the admin listener, the status page and log setup.

pub mod admin;
pub mod metrics;
pub mod minutes;
pub mod runtime_metrics;
pub mod status;
pub mod telemetry;
