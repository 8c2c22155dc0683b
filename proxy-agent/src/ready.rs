//! Readiness of the apiserver proxy: the last resolution of the gateway name, refreshed in the background.

use proxy_core::obs::admin::Check;
use proxy_core::sync::Mutex;
use seedgate_config::HostPort;
use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// How often the background task resolves the gateway. `/readyz` only reads the cached answer,
/// so a probe never waits for DNS.
pub(crate) const REFRESH: Duration = Duration::from_secs(5);
/// An answer older than this no longer counts (the refresher is stuck or gone).
const STALE: Duration = Duration::from_secs(30);

struct Resolution {
    gateway: HostPort,
    at: Instant,
    result: Result<Vec<SocketAddr>, String>,
}

/// The latest resolution of the gateway, fed by the refresher and by every connection.
#[derive(Default)]
pub(crate) struct GatewayStatus {
    last: Mutex<Option<Resolution>>,
    wake: Notify,
}

impl GatewayStatus {
    pub(crate) fn record(&self, gateway: &HostPort, result: &io::Result<Vec<SocketAddr>>) {
        let r = Resolution {
            gateway: gateway.clone(),
            at: Instant::now(),
            result: match result {
                Ok(addrs) => Ok(addrs.clone()),
                Err(e) => Err(e.to_string()),
            },
        };
        // A poisoned lock only means a panic elsewhere mid-assignment; the value is still usable.
        *self.last.lock() = Some(r);
    }

    /// Ask the refresher to resolve now (the gateway changed on reload).
    pub(crate) fn refresh_soon(&self) {
        self.wake.notify_one();
    }

    pub(crate) async fn woken(&self) {
        self.wake.notified().await;
    }

    /// The readiness check for `gateway`, the currently configured one.
    pub(crate) fn check(&self, gateway: &HostPort) -> Check {
        const NAME: &str = "gateway-resolves";
        let last = self.last.lock();
        match &*last {
            Some(r) if &r.gateway == gateway && r.at.elapsed() < STALE => match &r.result {
                Ok(addrs) => {
                    let list: Vec<String> = addrs.iter().map(ToString::to_string).collect();
                    Check::new(NAME, true, format!("{gateway} -> {}", list.join(", ")))
                }
                Err(e) => Check::new(NAME, false, format!("{gateway}: {e}")),
            },
            _ => Check::new(NAME, false, format!("{gateway}: not resolved yet")),
        }
    }
}

/// Resolve the configured gateway every few seconds (and at once after a reload changed it) so
/// `/readyz` answers from a recent result without waiting for DNS.
pub(crate) async fn refresh_gateway(
    config: &arc_swap::ArcSwap<seedgate_config::AgentConfig>,
    status: &GatewayStatus,
    stop: tokio_util::sync::CancellationToken,
) {
    loop {
        let cfg = config.load_full();
        if let Some(ap) = &cfg.apiserver_proxy {
            let r = tokio::select! {
                () = stop.cancelled() => return,
                r = crate::gateway::resolve(&ap.gateway, cfg.timeouts.connect.get()) => r,
            };
            status.record(&ap.gateway, &r);
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = status.woken() => {}
            () = tokio::time::sleep(REFRESH) => {}
        }
    }
}
