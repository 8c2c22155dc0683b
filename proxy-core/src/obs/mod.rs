//! What the process tells its operators: the metrics registry and shared metrics, runtime gauges, the admin listener, the status page, log setup, and how a peer's text is shown in them.

pub mod admin;
pub mod metrics;
pub mod minutes;
pub mod runtime_metrics;
pub mod status;
pub mod telemetry;
pub mod untrusted;

pub use untrusted::Untrusted;
