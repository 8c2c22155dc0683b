//! The router's listeners: binding, their routing tables, and how a reload changes them without touching live connections.

use crate::running::{Extra, ListenerRt, build_table, route_meters};
use crate::shared::Shared;
use crate::table::{FastMap, FileChange, Route, Table, fast_map, new_route};
use proxy_core::app::{StartError, accept_loops, listen_tcp_shards};
use proxy_core::net::accept::{UNLIMITED, WhileFree, accept_error_label, accept_loop};
use proxy_core::net::resolve_one;
use proxy_core::obs::admin::Check;
use proxy_core::sync::Mutex;
use seedgate_config::RouterConfig;
use seedgate_config::router::{Listener as ListenerCfg, ListenerProtocol, Route as RouteCfg};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::{TcpListener, UdpSocket};

/// Retire the routes of `old` that `new` does not carry over, so their live connections
/// drain by the deadline the new config gives the route (or the old one, if it was removed).
fn retire_replaced(old: &Table, new: Option<&Table>) {
    // Indexed once: a reload of a 10,000-route table must not compare every pair.
    let n = new.map_or(0, |t| t.routes.len());
    let mut kept: FastMap<*const Route, ()> = fast_map(n);
    kept.extend(new.iter().flat_map(|t| t.routes.iter().map(|r| (Arc::as_ptr(r), ()))));
    let mut by_name: FastMap<&str, &Arc<Route>> = fast_map(n);
    by_name.extend(new.iter().flat_map(|t| t.routes.iter().map(|r| (&*r.name, r))));
    for r in &old.routes {
        if kept.contains_key(&Arc::as_ptr(r)) {
            continue;
        }
        let deadline = by_name.get(&*r.name).map(|n| n.cfg.drain_deadline).unwrap_or(r.cfg.drain_deadline);
        r.retire(deadline.map(|d| d.get()));
    }
}

/// A bound listening socket, not serving yet: for TCP, one per worker of the runtime, sharing
/// the address (each gets its own accept loop).
enum Sock {
    Tcp(Vec<TcpListener>),
    Udp(UdpSocket),
}

async fn bind_listener(l: &ListenerCfg, cfg: &RouterConfig) -> Result<(Sock, SocketAddr), StartError> {
    let what = format!("listener {}", *l.name);
    match l.protocol {
        ListenerProtocol::Tcp => {
            listen_tcp_shards(&what, &l.listen, accept_loops()).await.map(|(s, a)| (Sock::Tcp(s), a))
        }
        ListenerProtocol::Udp => {
            let addr = resolve_one(&l.listen).await.map_err(|source| StartError::Resolve {
                what: what.clone(),
                addr: l.listen.to_string(),
                source,
            })?;
            let bind_err = |source| StartError::Bind { what: what.clone(), addr: l.listen.to_string(), source };
            let sock = crate::udp::bind_udp(addr, cfg.limits.udp_socket_buffer, &what).map_err(bind_err)?;
            let local = sock.local_addr().map_err(bind_err)?;
            Ok((Sock::Udp(sock), local))
        }
    }
}

/// Every listener of the router.
#[derive(Default)]
pub(crate) struct Listeners {
    running: Mutex<BTreeMap<String, Arc<ListenerRt>>>,
}

/// The listeners' sockets, bound and not yet serving: what [`Listeners::bind`] hands to
/// [`Listeners::start`].
pub(crate) struct Bound(Vec<(Arc<ListenerRt>, Sock)>);

impl Listeners {
    /// Bind every listener of `cfg` (serving starts with [`Listeners::start`]).
    pub(crate) async fn bind(
        shared: &Shared,
        cfg: &RouterConfig,
        extra: &Extra<'_>,
    ) -> Result<(Self, Bound), StartError> {
        let (this, mut bound) = (Self::default(), Vec::new());
        for l in &cfg.listeners {
            let (sock, addr) = bind_listener(l, cfg).await?;
            let rt = ListenerRt::new(shared, l, extra, addr, None);
            this.running.lock().insert(l.name.value.clone(), rt.clone());
            bound.push((rt, sock));
        }
        this.update_route_gauges(shared);
        Ok((this, Bound(bound)))
    }

    pub(crate) fn start(shared: &Arc<Shared>, bound: Bound) {
        for (rt, sock) in bound.0 {
            serve(shared, rt, sock);
        }
    }

    pub(crate) fn addresses(&self) -> BTreeMap<String, String> {
        self.running.lock().iter().map(|(n, l)| (n.clone(), l.addr.to_string())).collect()
    }

    pub(crate) fn ready(&self) -> Vec<Check> {
        self.running
            .lock()
            .values()
            .map(|l| {
                let routes = l.table.load().routes.len();
                Check::new(format!("listener-{}", l.name), true, format!("{} ({routes} routes)", l.addr))
            })
            .collect()
    }

    fn update_route_gauges(&self, shared: &Shared) {
        for (name, l) in self.running.lock().iter() {
            shared.metrics.routes.with_label_values(&[name]).set(l.table.load().routes.len() as i64);
        }
    }

    /// Apply a new, validated config. Sockets for new or moved listeners are bound first; if any
    /// bind fails nothing changes. Unchanged routes keep their state; live connections of
    /// changed or removed routes drain by the route's `drain_deadline` (or run on without one).
    pub(crate) async fn apply(
        &self,
        shared: &Arc<Shared>,
        new: Arc<RouterConfig>,
        extra: &Extra<'_>,
    ) -> Result<(), StartError> {
        // Phase 1: bind what needs a new socket (reloads run one at a time, so the snapshot holds).
        let moved: Vec<&ListenerCfg> = {
            let running = self.running.lock();
            new.listeners.iter().filter(|l| running.get(l.name.as_str()).is_none_or(|rt| !rt.same_socket(l))).collect()
        };
        let mut fresh = Vec::new();
        for l in moved {
            let (sock, addr) = bind_listener(l, &new).await?;
            fresh.push((l, sock, addr));
        }
        // Phase 2: commit. Tables first, so a rebinding listener starts with the new routes.
        shared.config.store(new.clone());
        let mut running = self.running.lock();
        let mut next: BTreeMap<String, Arc<ListenerRt>> = BTreeMap::new();
        for l in &new.listeners {
            if let Some(rt) = running.get(l.name.as_str()).filter(|rt| rt.same_socket(l)) {
                let old_table = rt.table.load_full();
                let ex = extra.get(l.name.as_str()).map(Vec::as_slice).unwrap_or_default();
                let table = build_table(&shared.metrics, &shared.shutdown.kill, l, ex, Some(&old_table));
                retire_replaced(&old_table, Some(&table));
                rt.table.store(Arc::new(table));
                rt.limit.local.resize(l.max_connections.unwrap_or(UNLIMITED));
                next.insert(l.name.value.clone(), rt.clone());
            }
        }
        for (l, sock, addr) in fresh {
            let old_table = running.get(l.name.as_str()).map(|rt| rt.table.load_full());
            let rt = ListenerRt::new(shared, l, extra, addr, old_table.as_deref());
            if let Some(t) = &old_table {
                retire_replaced(t, Some(&rt.table.load()));
            }
            next.insert(l.name.value.clone(), rt.clone());
            serve(shared, rt, sock);
        }
        // Listeners that are gone or moved stop accepting; their live connections continue.
        for (name, rt) in running.iter() {
            if !next.get(name).is_some_and(|n| Arc::ptr_eq(n, rt)) {
                rt.stop.cancel();
                tracing::info!(listener = %name, addr = %rt.addr, "listener stopped accepting");
                if !next.contains_key(name) {
                    retire_replaced(&rt.table.load(), None);
                }
            }
        }
        *running = next;
        drop(running);
        self.update_route_gauges(shared);
        Ok(())
    }
}

impl Listeners {
    /// Apply a change of listener `name`'s file routes: its table is patched (or, where route
    /// order matters, rebuilt from its listener config and `all_extra`, every file route it has
    /// now) and swapped. Unchanged routes keep their objects (and live connections); changed
    /// and removed ones drain by their deadline.
    pub(crate) fn set_file_routes<'a>(
        &self,
        shared: &Shared,
        name: &str,
        change: &FileChange,
        all_extra: impl FnOnce() -> Vec<&'a Arc<RouteCfg>>,
    ) {
        let Some(rt) = self.running.lock().get(name).cloned() else { return };
        let old = rt.table.load_full();
        let (m, kill) = (&shared.metrics, &shared.shutdown.kill);
        let table = match old.patch(change, |rc| new_route(rc, route_meters(m, &old.cfg, &rc.name), kill)) {
            Some((table, retired)) => {
                for r in retired {
                    let deadline = table.route_named(&r.name).map_or(r.cfg.drain_deadline, |n| n.cfg.drain_deadline);
                    r.retire(deadline.map(|d| d.get()));
                }
                table
            }
            None => {
                let table = build_table(m, kill, &old.cfg, &all_extra(), Some(&old));
                retire_replaced(&old, Some(&table));
                table
            }
        };
        let routes = table.routes.len();
        rt.table.store(Arc::new(table));
        shared.metrics.routes.with_label_values(&[name]).set(routes as i64);
    }

    /// Every running listener, by name (for the status page).
    pub(crate) fn running(&self) -> Vec<Arc<ListenerRt>> {
        self.running.lock().values().cloned().collect()
    }

    /// Routes in every table.
    pub(crate) fn route_count(&self) -> usize {
        self.running.lock().values().map(|l| l.table.load().routes.len()).sum()
    }
}

fn serve(shared: &Arc<Shared>, rt: Arc<ListenerRt>, sock: Sock) {
    let socks = match sock {
        Sock::Tcp(s) => s,
        Sock::Udp(s) => return crate::udp::serve(shared, rt, s),
    };
    tracing::info!(listener = %rt.name, addr = %rt.addr, accept_loops = socks.len(), "listening");
    for sock in socks {
        let (shared, rt) = (shared.clone(), rt.clone());
        let errors = shared.metrics.conn.accept_errors.clone();
        let name = rt.name.clone();
        tokio::spawn(accept_loop(
            sock,
            // A slot is taken when the connection is routed; until then it is in the pending budget.
            WhileFree(rt.limit.clone()),
            rt.stop.clone(),
            shared.shutdown.tracker.clone(),
            move |e| errors.with_label_values(&[&name, accept_error_label(e)]).inc(),
            // The connection future itself is the task (no wrapper around it): every byte of
            // it is held by each open connection.
            move |stream, peer, ()| crate::conn::serve(shared.clone(), rt.clone(), stream, peer),
        ));
    }
}
