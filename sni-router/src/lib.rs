//! sni-router: the seed's ingress gateway. Routes TLS by SNI, PROXY-protocol destination or HTTP CONNECT header, without terminating TLS.
//!
//! `bind` opens every socket (so tests can use port 0 and read the real ports), `Bound::run`
//! serves until the shutdown signal, then drains. Config reloads swap routing tables atomically:
//! new connections see the new routes, live connections keep the route they were admitted with.

mod conn;
mod table;
mod upstream;

use arc_swap::ArcSwap;
use proxy_core::accept::{ConnLimit, accept_error_label, accept_loop};
use proxy_core::addrs::Addresses;
use proxy_core::admin::{self, AdminHooks, AdminState, Check};
use proxy_core::metrics::{self, ConnMetrics, ReloadMetrics};
use proxy_core::prometheus::{IntGauge, IntGaugeVec, Registry};
use proxy_core::shutdown::{Drained, Shutdown};
use seedgate_config::RouterConfig;
use seedgate_config::router::{Listener as ListenerCfg, Route as RouteCfg};
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use table::{Route, RouteMeters, Table, new_route};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// Errors of start-up.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("listener {name}: cannot bind {addr}: {source}")]
    Bind { name: String, addr: String, source: std::io::Error },
    #[error("admin listener: cannot bind {addr}: {source}")]
    Admin { addr: String, source: std::io::Error },
    #[error("admin token: {0}")]
    Token(std::io::Error),
    #[error("writing the addresses file: {0}")]
    AddressesFile(std::io::Error),
}

/// Where the config came from (for reloads) and where to report bound addresses.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The config file; watched for changes and re-read on SIGHUP. `None`: no reloads.
    pub config_path: Option<PathBuf>,
    /// Write the bound addresses here (JSON) after binding and after each reload.
    pub write_addresses: Option<PathBuf>,
    /// Use this registry (tests run several routers in one process); default: a new one.
    pub registry: Option<Registry>,
}

pub(crate) struct Metrics {
    pub(crate) conn: ConnMetrics,
    reload: ReloadMetrics,
    routes: IntGaugeVec,
}

/// State every connection task can reach.
pub(crate) struct Shared {
    pub(crate) config: ArcSwap<RouterConfig>,
    pub(crate) metrics: Metrics,
    pub(crate) shutdown: Shutdown,
    conn_seq: AtomicU64,
    /// Random per process, so connection ids (and PROXY v2 UNIQUE_IDs) differ across restarts.
    id_prefix: u32,
    global_limit: Arc<Semaphore>,
}

impl Shared {
    pub(crate) fn next_conn_id(&self) -> ConnId {
        ConnId { prefix: self.id_prefix, n: self.conn_seq.fetch_add(1, Ordering::Relaxed) }
    }
}

/// A connection id, unique per process run: `<random prefix>-<sequence>`. Formatted only when
/// logged, so an open connection holds 12 bytes for it, not a string.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ConnId {
    prefix: u32,
    n: u64,
}

impl std::fmt::Display for ConnId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:08x}-{}", self.prefix, self.n)
    }
}

/// A running listener: its routing table (swapped by reloads) and accept-loop stop switch.
pub(crate) struct ListenerRt {
    pub(crate) name: Arc<str>,
    pub(crate) table: ArcSwap<Table>,
    addr: SocketAddr,
    cfg_listen: seedgate_config::HostPort,
    max_connections: Option<usize>,
    local_limit: Option<Arc<Semaphore>>,
    stop: CancellationToken,
    active: IntGauge,
}

/// Decrements the listener's active gauge when the connection ends.
pub(crate) struct ActiveGuard(IntGauge);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl ListenerRt {
    pub(crate) fn active_guard(&self) -> ActiveGuard {
        self.active.inc();
        ActiveGuard(self.active.clone())
    }
}

struct Router {
    shared: Arc<Shared>,
    listeners: Mutex<BTreeMap<String, Arc<ListenerRt>>>,
    admin_addr: Option<SocketAddr>,
    write_addresses: Option<PathBuf>,
}

/// A router whose sockets are bound; call [`Bound::run`] to serve.
pub struct Bound {
    router: Arc<Router>,
    pending: Vec<(Arc<ListenerRt>, TcpListener)>,
    admin: Option<TcpListener>,
    admin_token: Option<Arc<str>>,
    registry: Registry,
    config_path: Option<PathBuf>,
}

fn route_meters(m: &Metrics, listener: &str, route: &str) -> RouteMeters {
    RouteMeters {
        ok: m.conn.connections.with_label_values(&[listener, route, "ok"]),
        to_upstream: m.conn.bytes.with_label_values(&[listener, route, "to_upstream"]),
        to_client: m.conn.bytes.with_label_values(&[listener, route, "to_client"]),
    }
}

fn build_table(m: &Metrics, kill: &CancellationToken, cfg: &ListenerCfg, old: Option<&Table>) -> Table {
    let old_routes: HashMap<&str, &Arc<Route>> =
        old.map(|t| t.routes.iter().map(|r| (&*r.name, r)).collect()).unwrap_or_default();
    Table::build(
        cfg,
        |rc: &RouteCfg| old_routes.get(rc.name.as_str()).filter(|r| r.cfg == *rc).map(|r| (*r).clone()),
        |rc: &RouteCfg| new_route(rc, route_meters(m, &cfg.name, &rc.name), kill),
    )
}

/// Retire the routes of `old` that `new` does not carry over, so their live connections
/// drain by the deadline the new config gives the route (or the old one, if it was removed).
fn retire_replaced(old: &Table, new: Option<&Table>) {
    // Indexed once: a reload of a 10,000-route table must not compare every pair.
    let kept: std::collections::HashSet<*const Route> =
        new.map(|t| t.routes.iter().map(Arc::as_ptr).collect()).unwrap_or_default();
    let by_name: HashMap<&str, &Arc<Route>> =
        new.map(|t| t.routes.iter().map(|n| (&*n.name, n)).collect()).unwrap_or_default();
    for r in &old.routes {
        if kept.contains(&Arc::as_ptr(r)) {
            continue;
        }
        let deadline = by_name.get(&*r.name).map(|n| n.cfg.drain_deadline).unwrap_or(r.cfg.drain_deadline);
        r.retire(deadline.map(|d| d.get()));
    }
}

fn bind_listener(l: &ListenerCfg) -> Result<(TcpListener, SocketAddr), Error> {
    let err = |source| Error::Bind { name: l.name.value.clone(), addr: l.listen.to_string(), source };
    let addr = match l.listen.socket_addr() {
        Some(a) => a,
        None => std::net::ToSocketAddrs::to_socket_addrs(&(l.listen.host.as_str(), l.listen.port))
            .map_err(err)?
            .next()
            .ok_or_else(|| err(std::io::Error::new(std::io::ErrorKind::NotFound, "no address")))?,
    };
    let sock = proxy_core::net::bind_tcp(addr).map_err(err)?;
    let local = sock.local_addr().map_err(err)?;
    Ok((sock, local))
}

/// Grow or shrink a semaphore from `old` to `new` permits. Shrinking takes permits as they are
/// released, so live connections are never affected.
fn resize(sem: &Arc<Semaphore>, old: usize, new: usize) {
    if new > old {
        sem.add_permits(new - old);
    } else if new < old {
        let want = old - new;
        let got = sem.forget_permits(want);
        if got < want {
            let sem = sem.clone();
            tokio::spawn(async move {
                if let Ok(p) = sem.acquire_many_owned((want - got) as u32).await {
                    p.forget();
                }
            });
        }
    }
}

/// Bind every listener and the admin socket of `cfg`.
pub async fn bind(cfg: RouterConfig, opts: Options) -> Result<Bound, Error> {
    let registry = opts.registry.unwrap_or_default();
    let metrics = Metrics {
        conn: ConnMetrics::new(&registry),
        reload: ReloadMetrics::new(&registry),
        routes: metrics::gauge_vec(&registry, "seedgate_routes", "Routes loaded, by listener.", &["listener"]),
    };
    metrics::register_build_info(&registry, "sni-router");
    let admin_token = admin::load_token(cfg.admin.token_file.as_deref()).map_err(Error::Token)?;
    let admin = match &cfg.admin.listen {
        None => None,
        Some(hp) => {
            let addr = proxy_core::net::resolve_one(hp)
                .await
                .map_err(|source| Error::Admin { addr: hp.to_string(), source })?;
            Some(admin::bind(addr).await.map_err(|source| Error::Admin { addr: hp.to_string(), source })?)
        }
    };
    let shared = Arc::new(Shared {
        global_limit: Arc::new(Semaphore::new(cfg.limits.max_connections)),
        config: ArcSwap::from_pointee(cfg.clone()),
        metrics,
        shutdown: Shutdown::new(),
        conn_seq: AtomicU64::new(0),
        id_prefix: rand::random::<u32>(),
    });
    let mut pending = Vec::new();
    let mut listeners = BTreeMap::new();
    for l in &cfg.listeners {
        let (sock, addr) = bind_listener(l)?;
        let rt = new_listener_rt(&shared, l, addr, None);
        listeners.insert(l.name.value.clone(), rt.clone());
        pending.push((rt, sock));
    }
    let router = Arc::new(Router {
        shared,
        listeners: Mutex::new(listeners),
        admin_addr: admin.as_ref().and_then(|a| a.local_addr().ok()),
        write_addresses: opts.write_addresses,
    });
    router.update_route_gauges();
    proxy_core::reload::mark_loaded(&router.shared.metrics.reload);
    router.write_addresses().map_err(Error::AddressesFile)?;
    Ok(Bound { router, pending, admin, admin_token, registry, config_path: opts.config_path })
}

fn new_listener_rt(shared: &Arc<Shared>, l: &ListenerCfg, addr: SocketAddr, old: Option<&Table>) -> Arc<ListenerRt> {
    let table = build_table(&shared.metrics, &shared.shutdown.kill, l, old);
    Arc::new(ListenerRt {
        name: Arc::from(l.name.as_str()),
        table: ArcSwap::from_pointee(table),
        addr,
        cfg_listen: l.listen.clone(),
        max_connections: l.max_connections,
        local_limit: l.max_connections.map(|n| Arc::new(Semaphore::new(n))),
        stop: shared.shutdown.stop.child_token(),
        active: shared.metrics.conn.active.with_label_values(&[l.name.as_str()]),
    })
}

impl Router {
    fn addresses(&self) -> Addresses {
        Addresses {
            admin: self.admin_addr,
            listeners: self
                .listeners
                .lock()
                .expect("not poisoned")
                .iter()
                .map(|(n, l)| (n.clone(), l.addr.to_string()))
                .collect(),
        }
    }

    fn write_addresses(&self) -> std::io::Result<()> {
        match &self.write_addresses {
            Some(p) => proxy_core::addrs::write(p, &self.addresses()),
            None => Ok(()),
        }
    }

    fn update_route_gauges(&self) {
        for (name, l) in self.listeners.lock().expect("not poisoned").iter() {
            self.shared.metrics.routes.with_label_values(&[name]).set(l.table.load().routes.len() as i64);
        }
    }

    fn start(self: &Arc<Self>, rt: Arc<ListenerRt>, sock: TcpListener) {
        let shared = self.shared.clone();
        let limit = ConnLimit { global: shared.global_limit.clone(), local: rt.local_limit.clone() };
        let errors = shared.metrics.conn.accept_errors.clone();
        let name = rt.name.clone();
        tracing::info!(listener = %rt.name, addr = %rt.addr, "listening");
        tokio::spawn(accept_loop(
            sock,
            limit,
            rt.stop.clone(),
            shared.shutdown.tracker.clone(),
            move |e| errors.with_label_values(&[&name, accept_error_label(e)]).inc(),
            // The connection future itself is the task (no wrapper around it): every byte of
            // it is held by each open connection.
            move |stream, peer, permit| conn::serve(shared.clone(), rt.clone(), stream, peer, permit),
        ));
    }

    /// Apply a new, already validated config. Sockets for new or moved listeners are bound
    /// first; if any bind fails nothing changes.
    fn apply(self: &Arc<Self>, new: RouterConfig) -> Result<(), String> {
        let old_cfg = self.shared.config.load_full();
        if new.admin.listen != old_cfg.admin.listen || new.admin.token_file != old_cfg.admin.token_file {
            return Err("admin settings cannot change at runtime; restart to apply them".into());
        }
        // Shared, not cloned: a 10,000-route config is a few MB of strings.
        let new = Arc::new(new);
        let mut listeners = self.listeners.lock().expect("not poisoned");
        // Phase 1: bind what needs a new socket.
        let mut fresh = Vec::new();
        for l in &new.listeners {
            let moved = listeners.get(l.name.as_str()).is_none_or(|rt| rt.cfg_listen != l.listen);
            if moved {
                let (sock, addr) = bind_listener(l).map_err(|e| e.to_string())?;
                fresh.push((l, sock, addr));
            }
        }
        // Phase 2: commit. Tables first, so a rebinding listener starts with the new routes.
        resize(&self.shared.global_limit, old_cfg.limits.max_connections, new.limits.max_connections);
        self.shared.config.store(new.clone());
        let mut next: BTreeMap<String, Arc<ListenerRt>> = BTreeMap::new();
        for l in &new.listeners {
            match listeners.get(l.name.as_str()) {
                Some(rt) if rt.cfg_listen == l.listen => {
                    let old_table = rt.table.load_full();
                    let table = build_table(&self.shared.metrics, &self.shared.shutdown.kill, l, Some(&old_table));
                    retire_replaced(&old_table, Some(&table));
                    rt.table.store(Arc::new(table));
                    if let (Some(sem), Some(old_n), Some(new_n)) =
                        (&rt.local_limit, rt.max_connections, l.max_connections)
                    {
                        resize(sem, old_n, new_n);
                    } else if rt.max_connections != l.max_connections {
                        tracing::warn!(listener = %l.name, "adding or removing max_connections takes effect when the listener is re-bound (change of listen address or restart)");
                    }
                    next.insert(l.name.value.clone(), rt.clone());
                }
                _ => {}
            }
        }
        for (l, sock, addr) in fresh {
            let old = listeners.get(l.name.as_str());
            let old_table = old.map(|rt| rt.table.load_full());
            let rt = new_listener_rt(&self.shared, l, addr, old_table.as_deref());
            if let Some(t) = &old_table {
                retire_replaced(t, Some(&rt.table.load()));
            }
            next.insert(l.name.value.clone(), rt.clone());
            self.start(rt, sock);
        }
        // Listeners that are gone or moved stop accepting; their live connections continue.
        for (name, rt) in listeners.iter() {
            let same = next.get(name).is_some_and(|n| Arc::ptr_eq(n, rt));
            if !same {
                rt.stop.cancel();
                tracing::info!(listener = %name, addr = %rt.addr, "listener stopped accepting");
                if !next.contains_key(name) {
                    retire_replaced(&rt.table.load(), None);
                }
            }
        }
        *listeners = next;
        drop(listeners);
        self.update_route_gauges();
        if let Err(e) = self.write_addresses() {
            tracing::warn!(error = %e, "cannot write the addresses file");
        }
        Ok(())
    }
}

struct Hooks(Arc<Router>);

impl AdminHooks for Hooks {
    fn ready(&self) -> Vec<Check> {
        self.0
            .listeners
            .lock()
            .expect("not poisoned")
            .values()
            .map(|l| {
                let routes = l.table.load().routes.len();
                Check::new(format!("listener-{}", l.name), true, format!("{} ({routes} routes)", l.addr))
            })
            .collect()
    }

    fn config(&self) -> serde_json::Value {
        serde_json::to_value(&**self.0.shared.config.load()).unwrap_or_default()
    }
}

impl Bound {
    pub fn local_addrs(&self) -> Addresses {
        self.router.addresses()
    }

    /// The shutdown handle: cancelling `stop` has the same effect as the signal given to `run`.
    pub fn shutdown(&self) -> Shutdown {
        self.router.shared.shutdown.clone()
    }

    /// Serve until `signal` completes (or `shutdown().stop` is cancelled), then stop accepting
    /// and drain for the configured grace period.
    pub async fn run(self, signal: impl Future<Output = ()>) -> Drained {
        let shared = self.router.shared.clone();
        let admin_stop = CancellationToken::new();
        if let Some(l) = self.admin {
            let state = AdminState {
                registry: self.registry.clone(),
                hooks: Arc::new(Hooks(self.router.clone())),
                token: self.admin_token.clone(),
                draining: shared.shutdown.stop.clone(),
            };
            tracing::info!(addr = ?l.local_addr().ok(), "admin listening");
            tokio::spawn(admin::serve(l, state, admin_stop.clone()));
        }
        for (rt, sock) in self.pending {
            self.router.start(rt, sock);
        }
        if let Some(path) = self.config_path.clone() {
            let router = self.router.clone();
            tokio::spawn(proxy_core::reload::reload_loop(
                path,
                seedgate_config::router::parse,
                move |cfg| router.apply(cfg),
                shared.metrics.reload.clone(),
                shared.shutdown.stop.clone(),
            ));
        }
        tokio::select! {
            _ = signal => {}
            _ = shared.shutdown.stop.cancelled() => {}
        }
        let grace = shared.config.load().drain_grace.get();
        tracing::info!(
            grace_s = grace.as_secs_f64(),
            open = shared.shutdown.tracker.len(),
            "stopped accepting; draining"
        );
        let drained = shared.shutdown.drain(grace).await;
        tracing::info!(forced = drained.forced, "drained");
        admin_stop.cancel();
        drained
    }
}

#[cfg(test)]
pub(crate) fn test_shared() -> Shared {
    let reg = Registry::new();
    let cfg =
        seedgate_config::router::parse("listeners:\n  - name: gw\n    listen: 127.0.0.1:0\n", "t.yaml").expect("valid");
    Shared {
        global_limit: Arc::new(Semaphore::new(10)),
        config: ArcSwap::from_pointee(cfg),
        metrics: Metrics {
            conn: ConnMetrics::new(&reg),
            reload: ReloadMetrics::new(&reg),
            routes: metrics::gauge_vec(&reg, "seedgate_routes", "r", &["listener"]),
        },
        shutdown: Shutdown::new(),
        conn_seq: AtomicU64::new(0),
        id_prefix: 0,
    }
}

#[cfg(test)]
pub(crate) fn test_listener(shared: &Arc<Shared>) -> Arc<ListenerRt> {
    let cfg = shared.config.load_full();
    new_listener_rt(shared, &cfg.listeners[0], "127.0.0.1:1".parse().expect("addr"), None)
}
