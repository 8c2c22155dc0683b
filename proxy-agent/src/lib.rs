//! proxy-agent, the shoot end of seedgate: the node-local apiserver proxy (path P2) and the reverse tunnel agent (P3-P5).
//!
//! In-cluster clients connect to the kube-apiserver's advertised address, where the agent listens
//! on every node; each connection is forwarded to the seed gateway (sni-router) with a PROXY v2
//! header or an HTTP CONNECT naming the destination. [`bind`] opens every socket, [`Bound::run`]
//! serves until `shutdown.stop` and then drains.

mod apiserver_proxy;
mod gateway;
mod ready;
mod tunnel;

use arc_swap::ArcSwap;
use proxy_core::accept::{ConnLimit, accept_error_label, accept_loop};
use proxy_core::admin::{self, AdminHooks, AdminState, Check};
use proxy_core::metrics::{ConnMetrics, ReloadMetrics, register_build_info};
use proxy_core::net;
use proxy_core::prometheus::Registry;
use proxy_core::reload;
use proxy_core::shutdown::Shutdown;
use seedgate_config::agent::ApiserverProxy;
use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

pub use apiserver_proxy::ROUTE;
pub use seedgate_config::AgentConfig;

/// Why [`bind`] failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind {
        what: String,
        addr: String,
        #[source]
        source: io::Error,
    },
    #[error("apiserver_proxy.listen {0} is not an IP address")]
    NotAnIp(String),
    #[error("cannot resolve admin.listen {addr}: {source}")]
    AdminResolve {
        addr: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot read admin.token_file: {0}")]
    AdminToken(#[source] io::Error),
    #[error("tunnel TLS: {0}")]
    TunnelTls(#[from] proxy_core::tls::TlsError),
}

/// The addresses actually bound (port 0 in the config becomes the port the kernel chose).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Addresses {
    pub admin: Option<SocketAddr>,
    /// By listener name: `apiserver-proxy` for `listen[0]`, `apiserver-proxy-<i>` for `listen[i]`.
    pub listeners: BTreeMap<String, SocketAddr>,
}

impl Addresses {
    /// `{"admin": "ip:port" | null, "listeners": {"<name>": "ip:port", ...}}`, the format of
    /// `--write-addresses`.
    pub fn to_json(&self) -> serde_json::Value {
        let listeners: serde_json::Map<String, serde_json::Value> =
            self.listeners.iter().map(|(k, v)| (k.clone(), v.to_string().into())).collect();
        serde_json::json!({
            "admin": self.admin.map(|a| a.to_string()),
            "listeners": listeners,
        })
    }
}

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

impl Shared {
    /// Take a reloaded config for new connections. Refused (the running config stays) when it
    /// changes what only a restart can: the listen addresses, the admin listener or the limits.
    fn apply(&self, new: AgentConfig) -> Result<(), String> {
        let old = self.config.load();
        let listens = |c: &AgentConfig| {
            c.apiserver_proxy.as_ref().map(|ap| ap.listen.iter().map(|l| l.value.clone()).collect::<Vec<_>>())
        };
        if listens(&old) != listens(&new) {
            return Err("apiserver_proxy.listen (or the section's presence) changed; listen addresses are bound at start, restart proxy-agent to change them".into());
        }
        if old.admin != new.admin {
            return Err("admin changed; the admin listener is set up at start, restart proxy-agent to change it".into());
        }
        if old.limits != new.limits {
            return Err("limits changed; they are set up at start, restart proxy-agent to change them".into());
        }
        match (&self.tunnel, &new.tunnel) {
            (Some(t), Some(cfg)) => t.reconfigure(cfg.value.clone())?,
            (None, None) => {}
            _ => return Err("the tunnel section was added or removed; restart proxy-agent to apply".into()),
        }
        let gateway_changed = gateway_of(&old) != gateway_of(&new);
        self.config.store(Arc::new(new));
        if gateway_changed {
            self.gateway.refresh_soon();
        }
        Ok(())
    }
}

fn gateway_of(c: &AgentConfig) -> Option<&seedgate_config::HostPort> {
    c.apiserver_proxy.as_ref().map(|ap| &ap.gateway)
}

/// Every socket bound, ready to [`run`](Bound::run).
pub struct Bound {
    shared: Arc<Shared>,
    shutdown: Shutdown,
    listeners: Vec<(String, TcpListener)>,
    admin: Option<TcpListener>,
    admin_token: Option<Arc<str>>,
    registry: Registry,
    reload_metrics: ReloadMetrics,
    addrs: Addresses,
    config_path: Option<PathBuf>,
}

/// Bind the apiserver-proxy listeners and the admin listener of `cfg`. Nothing is served until
/// [`Bound::run`].
pub async fn bind(cfg: AgentConfig, shutdown: Shutdown) -> Result<Bound, Error> {
    let registry = Registry::new();
    let metrics = ConnMetrics::new(&registry);
    let reload_metrics = ReloadMetrics::new(&registry);
    register_build_info(&registry, "proxy-agent");

    let mut listeners = Vec::new();
    let mut addrs = Addresses { admin: None, listeners: BTreeMap::new() };
    if let Some(ap) = &cfg.apiserver_proxy {
        for (i, l) in ap.listen.iter().enumerate() {
            let name = ApiserverProxy::listener_name(i);
            let addr = l.socket_addr().ok_or_else(|| Error::NotAnIp(l.to_string()))?;
            let bind_err = |source| Error::Bind { what: name.clone(), addr: addr.to_string(), source };
            let listener = net::bind_tcp(addr).map_err(bind_err)?;
            addrs.listeners.insert(name.clone(), listener.local_addr().map_err(bind_err)?);
            listeners.push((name, listener));
        }
    }
    let admin = match &cfg.admin.listen {
        None => None,
        Some(hp) => {
            let addr =
                net::resolve_one(hp).await.map_err(|source| Error::AdminResolve { addr: hp.to_string(), source })?;
            let bind_err = |source| Error::Bind { what: "admin".into(), addr: addr.to_string(), source };
            let l = admin::bind(addr).await.map_err(bind_err)?;
            addrs.admin = Some(l.local_addr().map_err(bind_err)?);
            Some(l)
        }
    };
    let admin_token = admin::load_token(cfg.admin.token_file.as_deref()).map_err(Error::AdminToken)?;
    reload::mark_loaded(&reload_metrics);

    let tunnel = match &cfg.tunnel {
        Some(t) => Some(tunnel::Tunnel::new(t.value.clone(), &registry, shutdown.kill.clone())?),
        None => None,
    };
    let shared = Arc::new(Shared {
        config: ArcSwap::from_pointee(cfg),
        metrics,
        gateway: ready::GatewayStatus::default(),
        kill: shutdown.kill.clone(),
        tunnel,
    });
    Ok(Bound { shared, shutdown, listeners, admin, admin_token, registry, reload_metrics, addrs, config_path: None })
}

impl Bound {
    pub fn local_addrs(&self) -> Addresses {
        self.addrs.clone()
    }

    /// Reload the config from `path` on SIGHUP and whenever the file changes, while running.
    pub fn reload_from(mut self, path: PathBuf) -> Self {
        self.config_path = Some(path);
        self
    }

    /// Serve until `shutdown.stop` is cancelled, then stop accepting and drain live connections
    /// for `drain_grace` (from the config in force at that moment) before returning.
    pub async fn run(self) {
        let Bound { shared, shutdown, listeners, admin, admin_token, registry, reload_metrics, addrs, config_path } =
            self;
        let max = shared.config.load().limits.max_connections.min(Semaphore::MAX_PERMITS);
        let limit = ConnLimit::new(Arc::new(Semaphore::new(max)), None);

        let mut loops = Vec::new();
        for (name, listener) in listeners {
            let l = Arc::new(apiserver_proxy::Listener::new(name.clone(), shared.clone()));
            let accept_errors = shared.metrics.accept_errors.clone();
            tracing::info!(listener = %name, addr = ?addrs.listeners.get(&name), "apiserver proxy listening");
            loops.push(tokio::spawn(accept_loop(
                listener,
                limit.clone(),
                shutdown.stop.clone(),
                shutdown.tracker.clone(),
                move |e| accept_errors.with_label_values(&[&name, accept_error_label(e)]).inc(),
                move |conn, peer, permit| apiserver_proxy::handle(l.clone(), conn, peer, permit),
            )));
        }

        // The admin listener outlives the drain so `/readyz` can report it.
        let admin_stop = CancellationToken::new();
        if let Some(listener) = admin {
            let hooks = Hooks { shared: shared.clone(), listeners: addrs.listeners.clone() };
            let state =
                AdminState { registry, hooks: Arc::new(hooks), token: admin_token, draining: shutdown.stop.clone() };
            tracing::info!(addr = ?addrs.admin, "admin listening");
            tokio::spawn(admin::serve(listener, state, admin_stop.clone()));
        }
        if let Some(path) = config_path {
            let s = shared.clone();
            tokio::spawn(reload::reload_loop(
                path,
                seedgate_config::agent::parse,
                move |cfg| s.apply(cfg),
                reload_metrics,
                shutdown.stop.clone(),
            ));
        }
        tokio::spawn(refresh_gateway(shared.clone(), shutdown.stop.clone()));
        if let Some(t) = &shared.tunnel {
            // Sessions end with a GOAWAY at shutdown; streams in flight are drained with the rest.
            t.start(shutdown.stop.clone(), shutdown.tracker.clone());
        }

        shutdown.stop.cancelled().await;
        let grace = shared.config.load().drain_grace.get();
        tracing::info!(grace = ?grace, open = shutdown.tracker.len(), "stopped accepting, draining");
        let drained = shutdown.drain(grace).await;
        tracing::info!(forced = drained.forced, "drained");
        admin_stop.cancel();
        for l in loops {
            let _ = l.await;
        }
    }
}

/// Resolve the configured gateway every few seconds (and at once after a reload changed it) so
/// `/readyz` answers from a recent result without waiting for DNS.
async fn refresh_gateway(shared: Arc<Shared>, stop: CancellationToken) {
    loop {
        let cfg = shared.config.load_full();
        if let Some(ap) = &cfg.apiserver_proxy {
            let r = tokio::select! {
                () = stop.cancelled() => return,
                r = gateway::resolve(&ap.gateway, cfg.timeouts.connect.get()) => r,
            };
            shared.gateway.record(&ap.gateway, &r);
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = shared.gateway.woken() => {}
            () = tokio::time::sleep(ready::REFRESH) => {}
        }
    }
}

struct Hooks {
    shared: Arc<Shared>,
    listeners: BTreeMap<String, SocketAddr>,
}

impl AdminHooks for Hooks {
    fn ready(&self) -> Vec<Check> {
        let mut checks: Vec<Check> = self
            .listeners
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

    fn config(&self) -> serde_json::Value {
        // The agent config holds no secrets (admin.token_file is a path, not the token).
        serde_json::to_value(&**self.shared.config.load()).unwrap_or_default()
    }
}
