//! proxy-agent, the shoot end of seedgate: the node-local apiserver proxy (path P2) and the reverse tunnel agent (P3-P5).
//!
//! The process lifecycle (bind, serve, reload, drain) is [`proxy_core::app`]; this crate adds
//! the apiserver-proxy listeners, which forward in-cluster connections for the kube-apiserver's
//! advertised address to the seed gateway (PROXY v2 header or HTTP CONNECT), and the tunnel
//! sessions the agent dials out to the proxy-servers.

mod apiserver_proxy;
mod gateway;
mod ready;
mod replicas;
mod shared;
mod status;
mod tunnel;

use arc_swap::ArcSwap;
use proxy_core::app::{self, Ctx, Service, StartError, fixed, listen_tcp};
use proxy_core::net::accept::{ConnLimit, accept_error_label, accept_loop};
use proxy_core::obs::admin::Check;
use proxy_core::obs::metrics::ConnMetrics;
use proxy_core::obs::status::{StatusPage, StatusQuery};
use seedgate_config::agent::ApiserverProxy;
use shared::Shared;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;

pub use apiserver_proxy::ROUTE;
pub use proxy_core::app::Options;
pub use seedgate_config::AgentConfig;
pub use tunnel::TlsReloadError;

/// proxy-agent as a [`Service`] of the shared lifecycle.
pub struct Agent {
    shared: Arc<Shared>,
    ctx: Ctx,
    addrs: BTreeMap<String, SocketAddr>,
}

pub type Bound = app::Bound<Agent>;

/// Bind the apiserver-proxy listeners and the admin listener of `cfg`; [`app::Bound::run`] serves.
pub async fn bind(cfg: AgentConfig, opts: Options) -> Result<Bound, StartError> {
    app::bind(cfg, opts).await
}

fn gateway_of(c: &AgentConfig) -> Option<&seedgate_config::HostPort> {
    c.apiserver_proxy.as_ref().map(|ap| &ap.gateway)
}

impl Service for Agent {
    type Config = AgentConfig;
    const NAME: &'static str = "proxy-agent";
    /// The apiserver-proxy listeners, by name.
    type Opened = Vec<(String, TcpListener)>;
    type ApplyError = TlsReloadError;

    /// Listen addresses are bound at start, and the tunnel (its metrics, its TLS watch) is set
    /// up at start or not at all; its server list changes live.
    fn restart_only(cfg: &AgentConfig) -> Vec<(&'static str, serde_json::Value)> {
        let listen = cfg.apiserver_proxy.as_ref().map(|ap| ap.listen.iter().map(|l| &l.value).collect::<Vec<_>>());
        vec![fixed("apiserver_proxy.listen", &listen), fixed("tunnel", &cfg.tunnel.is_some())]
    }

    /// A tunnel whose transport is `quic` or `auto` (QUIC when it gets through).
    fn quic_sessions(cfg: &AgentConfig) -> bool {
        cfg.tunnel.as_ref().is_some_and(|t| t.transport != seedgate_config::agent::Transport::H2)
    }

    async fn bind(cfg: Arc<AgentConfig>, ctx: Ctx) -> Result<(Self, Self::Opened), StartError> {
        let mut listeners = Vec::new();
        let mut addrs = BTreeMap::new();
        if let Some(ap) = &cfg.apiserver_proxy {
            for (i, l) in ap.listen.iter().enumerate() {
                let name = ApiserverProxy::listener_name(i);
                let (listener, addr) = listen_tcp(&name, l).await?;
                addrs.insert(name.clone(), addr);
                listeners.push((name, listener));
            }
        }
        let tunnel = match &cfg.tunnel {
            Some(t) => Some(tunnel::Tunnel::new(t.value.clone(), &ctx.registry, ctx.shutdown.kill.clone())?),
            None => None,
        };
        let shared = Arc::new(Shared {
            config: ArcSwap::new(cfg),
            metrics: ConnMetrics::new(&ctx.registry),
            gateway: ready::GatewayStatus::default(),
            kill: ctx.shutdown.kill.clone(),
            tunnel,
        });
        Ok((Self { shared, ctx, addrs }, listeners))
    }

    fn start(self: &Arc<Self>, listeners: Self::Opened) {
        let (shared, shutdown) = (&self.shared, &self.ctx.shutdown);
        let limit = ConnLimit::new(self.ctx.connections.clone(), None);
        for (name, listener) in listeners {
            let l = Arc::new(apiserver_proxy::Listener::new(name.clone(), shared.clone()));
            let accept_errors = shared.metrics.accept_errors.clone();
            tracing::info!(listener = %name, addr = ?self.addrs.get(&name), "apiserver proxy listening");
            tokio::spawn(accept_loop(
                listener,
                limit.clone(),
                shutdown.stop.clone(),
                shutdown.tracker.clone(),
                move |e| accept_errors.with_label_values(&[&name, accept_error_label(e)]).inc(),
                move |conn, peer, permit| apiserver_proxy::handle(l.clone(), conn, peer, permit),
            ));
        }
        let (refresh, stop) = (shared.clone(), shutdown.stop.clone());
        tokio::spawn(async move { ready::refresh_gateway(&refresh.config, &refresh.gateway, stop).await });
        if let Some(t) = &shared.tunnel {
            // Sessions end with a GOAWAY at shutdown; streams in flight are drained with the rest.
            t.start(shutdown.stop.clone(), shutdown.tracker.clone());
        }
    }

    /// New connections and streams take the new config; live ones keep going.
    async fn apply(self: &Arc<Self>, new: Arc<AgentConfig>) -> Result<(), TlsReloadError> {
        if let (Some(t), Some(cfg)) = (&self.shared.tunnel, &new.tunnel) {
            t.reconfigure(cfg.value.clone())?;
        }
        let gateway_changed = gateway_of(&self.shared.config.load()) != gateway_of(&new);
        self.shared.config.store(new);
        if gateway_changed {
            self.shared.gateway.refresh_soon();
        }
        Ok(())
    }

    fn listeners(&self) -> BTreeMap<String, String> {
        self.addrs.iter().map(|(k, v)| (k.clone(), v.to_string())).collect()
    }

    fn status(&self, query: &StatusQuery) -> Option<StatusPage> {
        Some(status::status(&self.shared, query))
    }

    fn ready(&self) -> Vec<Check> {
        let mut checks: Vec<Check> = self
            .addrs
            .iter()
            .map(|(name, a)| Check::new(format!("listener-{name}"), true, format!("bound {a}")))
            .collect();
        if let Some(ap) = &self.shared.config.load().apiserver_proxy {
            checks.push(self.shared.gateway.check(&ap.gateway));
        }
        if let Some(t) = &self.shared.tunnel {
            checks.extend(t.ready_checks());
        }
        checks
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tunnel_that_may_run_over_quic_keeps_the_work_stealing_runtime() {
        let cfg = |transport: &str| {
            let y = format!(
                "tunnel:\n  servers: [a:1]\n  tls: {{ cert: c, key: k, ca: ca }}\n  allow: [10.0.0.0/8]\n{transport}"
            );
            seedgate_config::agent::parse(&y, "a.yaml").expect("valid")
        };
        assert!(!Agent::quic_sessions(&cfg("")), "h2 is the default");
        assert!(!Agent::quic_sessions(&cfg("  transport: h2\n")));
        assert!(Agent::quic_sessions(&cfg("  transport: quic\n")));
        assert!(Agent::quic_sessions(&cfg("  transport: auto\n")));
        let no_tunnel = seedgate_config::agent::parse(
            "apiserver_proxy: { listen: [127.0.0.1:0], gateway: g:1, mode: proxy-protocol-v2 }\n",
            "a.yaml",
        )
        .expect("valid");
        assert!(!Agent::quic_sessions(&no_tunnel), "no tunnel, no QUIC");
    }
}
