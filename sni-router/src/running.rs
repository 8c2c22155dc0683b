//! One running listener: its routing table (built from its config and file routes), its limits and its accept-loop switch; what the accept loops, connection tasks and reloads share.

use crate::refusal::Proto;
use crate::shared::Metrics;
use crate::shared::Shared;
use crate::table::{FastMap, Route, RouteMeters, Table, fast_map, new_route};
use arc_swap::ArcSwap;
use proxy_core::net::accept::ConnLimit;
use proxy_core::net::guard::Active;
use proxy_core::prometheus::{Histogram, IntCounter, IntGauge};
use proxy_core::relay::copy::Outcome;
use seedgate_config::router::{Listener as ListenerCfg, ListenerProtocol, Route as RouteCfg};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::OnceLock;
use tokio_util::sync::CancellationToken;

/// A running listener: its routing table (swapped by reloads), limits and accept-loop switch.
pub(crate) struct ListenerRt {
    pub(crate) name: Arc<str>,
    pub(crate) table: ArcSwap<Table>,
    pub(crate) addr: SocketAddr,
    cfg_listen: seedgate_config::HostPort,
    protocol: ListenerProtocol,
    /// Established (routed) connections: the listener's own cap and the process-wide one.
    pub(crate) limit: ConnLimit,
    pub(crate) stop: CancellationToken,
    active: IntGauge,
    /// This listener's series of `seedgate_handshake_duration_seconds` (by protocol) and
    /// `seedgate_connection_closes_total` (by how the relay ended), each resolved on first use:
    /// a connection does no label lookup (a hash and a lock of the metric family each).
    handshake: [OnceLock<Histogram>; 3],
    closes: [OnceLock<IntCounter>; Outcome::COUNT],
}

/// Route-file routes of each listener, by listener name.
pub(crate) type Extra<'a> = HashMap<&'a str, Vec<&'a Arc<RouteCfg>>>;

impl ListenerRt {
    /// Listener `l` bound at `addr`, its table built from `l`, its file routes in `extra` and
    /// (routes carried over) the `old` table.
    pub(crate) fn new(
        shared: &Shared,
        l: &ListenerCfg,
        extra: &Extra<'_>,
        addr: SocketAddr,
        old: Option<&Table>,
    ) -> Arc<Self> {
        let extra = extra.get(l.name.as_str()).map(Vec::as_slice).unwrap_or_default();
        let table = build_table(&shared.metrics, &shared.shutdown.kill, l, extra, old);
        let m = &shared.metrics;
        let name = l.name.as_str();
        // Every series the listener's connections count in is exported from its start.
        let (handshake, closes): ([OnceLock<Histogram>; 3], [OnceLock<IntCounter>; Outcome::COUNT]) =
            Default::default();
        match l.protocol {
            ListenerProtocol::Tcp => {
                m.conn.listener_at_zero(
                    name,
                    &[crate::refusal::unrouted_reasons(), crate::refusal::routed_reasons()].concat(),
                );
                proxy_core::obs::metrics::at_zero(
                    &m.conn.connections,
                    &[&[name], &["-"], &crate::refusal::unrouted_reasons()],
                );
                for p in Proto::ROUTED {
                    let _ = handshake[p.index()].set(m.conn.handshake_seconds.with_label_values(&[name, p.label()]));
                }
                for (i, label) in Outcome::LABELS.iter().enumerate().filter(|(_, l)| RELAY_ENDS.contains(l)) {
                    let _ = closes[i].set(m.conn.closes.with_label_values(&[name, label]));
                }
            }
            ListenerProtocol::Udp => m.udp.listener_at_zero(name),
        }
        Arc::new(Self {
            name: Arc::from(l.name.as_str()),
            table: ArcSwap::from_pointee(table),
            addr,
            cfg_listen: l.listen.clone(),
            protocol: l.protocol,
            limit: ConnLimit::new(shared.connections.clone(), l.max_connections),
            stop: shared.shutdown.stop.child_token(),
            active: shared.metrics.conn.active.with_label_values(&[l.name.as_str()]),
            handshake,
            closes,
        })
    }

    /// The handshake-time histogram of protocol `proto` (`i` its index among the three).
    pub(crate) fn handshake_seconds(&self, m: &Metrics, i: usize, proto: &str) -> Option<&Histogram> {
        let slot = self.handshake.get(i)?;
        Some(slot.get_or_init(|| m.conn.handshake_seconds.with_label_values(&[&self.name, proto])))
    }

    /// The counter of relays of this listener that ended with `o`.
    pub(crate) fn closes(&self, m: &Metrics, o: &Outcome) -> Option<&IntCounter> {
        let slot = self.closes.get(o.index())?;
        Some(slot.get_or_init(|| m.conn.closes.with_label_values(&[&self.name, o.label()])))
    }

    /// Counts the connection in `seedgate_connections_active` while it lives.
    pub(crate) fn active_guard(&self) -> Active<IntGauge> {
        Active::new(self.active.clone())
    }

    /// `tcp` or `udp`.
    pub(crate) fn protocol(&self) -> &'static str {
        match self.protocol {
            ListenerProtocol::Tcp => "tcp",
            ListenerProtocol::Udp => "udp",
        }
    }

    /// Whether this listener can take config `l` without a new socket.
    pub(crate) fn same_socket(&self, l: &ListenerCfg) -> bool {
        self.cfg_listen == l.listen && self.protocol == l.protocol
    }
}

/// How a relay of sni-router may end (no cluster or session drains here).
const RELAY_ENDS: &[&str] = Outcome::LABELS.split_at(8).0;

/// A new route's meters; every series it counts in is exported from when it is configured.
pub(crate) fn route_meters(m: &Metrics, listener: &ListenerCfg, route: &str) -> RouteMeters {
    let name = listener.name.as_str();
    match listener.protocol {
        ListenerProtocol::Tcp => {
            m.conn.route_at_zero(name, route, &crate::refusal::routed_reasons());
            m.route_shares.at_zero(&[name, route]);
        }
        ListenerProtocol::Udp => m.udp.route_at_zero(name, route),
    }
    let listener = name;
    RouteMeters {
        ok: m.conn.connections.with_label_values(&[listener, route, "ok"]),
        to_upstream: m.conn.bytes.with_label_values(&[listener, route, "to_upstream"]),
        to_client: m.conn.bytes.with_label_values(&[listener, route, "to_client"]),
        connect_seconds: std::sync::OnceLock::new(),
    }
}

/// Listener `cfg`'s table with its file routes `extra`; routes unchanged since `old` are
/// carried over (with their live connections).
pub(crate) fn build_table(
    m: &Metrics,
    kill: &CancellationToken,
    cfg: &ListenerCfg,
    extra: &[&Arc<RouteCfg>],
    old: Option<&Table>,
) -> Table {
    let mut old_routes: FastMap<&str, &Arc<Route>> = fast_map(old.map_or(0, |t| t.routes.len()));
    old_routes.extend(old.iter().flat_map(|t| t.routes.iter().map(|r| (&*r.name, r))));
    Table::build(
        cfg,
        extra,
        // An unchanged file route is the same allocation: no config comparison needed.
        |rc: &Arc<RouteCfg>| {
            old_routes.get(rc.name.as_str()).filter(|r| Arc::ptr_eq(&r.cfg, rc) || r.cfg == *rc).map(|r| (*r).clone())
        },
        |rc: &Arc<RouteCfg>| new_route(rc, route_meters(m, cfg, &rc.name), kill),
    )
}

#[cfg(test)]
pub(crate) fn test_listener(shared: &Arc<Shared>) -> Arc<ListenerRt> {
    let cfg = shared.config.load_full();
    ListenerRt::new(shared, &cfg.listeners[0], &Extra::new(), "127.0.0.1:1".parse().expect("addr"), None)
}
