//! What the agent's accept loops, connection tasks, admin hooks and reloader share.

use crate::{ready, tunnel};
use arc_swap::ArcSwap;
use proxy_core::obs::metrics::ConnMetrics;
use seedgate_config::AgentConfig;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// State shared by the accept loops, connection tasks, admin hooks and the reloader.
pub(crate) struct Shared {
    /// The running config; each new connection takes a snapshot.
    pub config: ArcSwap<AgentConfig>,
    pub metrics: ConnMetrics,
    pub gateway: ready::GatewayStatus,
    /// `Shutdown::kill`: the drain grace is over, live connections end now.
    pub kill: CancellationToken,
    /// The reverse tunnel, when configured.
    pub tunnel: Option<Arc<tunnel::Tunnel>>,
}
