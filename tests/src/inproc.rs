//! A seedgate binary running in the test's own process (`bind` → `run`), with a metrics registry of its own that the test reads directly.

use proxy_core::addrs::Addresses;
use proxy_core::app::{Bound, Options, Service};
use proxy_core::prometheus::Registry;
use proxy_core::shutdown::Shutdown;
use std::net::SocketAddr;

/// A bound binary serving in a task of this runtime; it stops accepting when dropped (and the
/// runtime's end stops the rest).
pub struct InProc {
    pub addrs: Addresses,
    registry: Registry,
    shutdown: Shutdown,
}

impl InProc {
    /// The registry every in-process binary must be bound with (one each: their metric names
    /// would collide in a shared one).
    pub fn options() -> (Options, Registry) {
        let registry = Registry::new();
        (Options { registry: Some(registry.clone()), ..Options::default() }, registry)
    }

    /// Serve `bound` (bound with [`InProc::options`]'s `registry`) until dropped.
    pub fn serve<S: Service>(bound: Bound<S>, registry: Registry) -> Self {
        let addrs = bound.local_addrs();
        let shutdown = bound.shutdown();
        tokio::spawn(bound.run(std::future::pending()));
        Self { addrs, registry, shutdown }
    }

    /// The named listener's address.
    pub fn listener(&self, name: &str) -> anyhow::Result<SocketAddr> {
        self.addrs.listener(name).ok_or_else(|| anyhow::anyhow!("no listener {name:?} in {:?}", self.addrs))
    }

    pub fn admin(&self) -> anyhow::Result<SocketAddr> {
        self.addrs.admin.ok_or_else(|| anyhow::anyhow!("no admin listener"))
    }

    /// Its metrics now, in the Prometheus text format.
    pub fn metrics(&self) -> String {
        proxy_core::metrics::render(&self.registry)
    }
}

impl Drop for InProc {
    fn drop(&mut self) {
        self.shutdown.stop.cancel();
    }
}
