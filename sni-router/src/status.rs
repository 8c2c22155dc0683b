//! sni-router's status page (`/status`, `/`): each listener (its connections now and per minute, refusals, its last reload), each route (connections now and per minute, upstreams and their errors, when it last changed), and the UDP listeners' flows — from the routing tables, the shares and the metrics the router already keeps.

use crate::running::ListenerRt;
use crate::shared::Shared;
use crate::table::{ROUTED, Route, UPSTREAM_FAILED};
use proxy_core::obs::minutes::MINUTES;
use proxy_core::obs::status::{Format, Header, Page, Paging, StatusPage, StatusQuery, Table, col, readings, sum_by};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

/// sni-router's `/status` document (version [`proxy_core::obs::status::VERSION`]).
#[derive(Debug, Serialize)]
pub(crate) struct RouterStatus {
    #[serde(flatten)]
    pub header: Header,
    pub totals: Totals,
    pub listeners: Vec<Listener>,
    /// Which routes this document holds (`?limit=`, `?offset=`, filtered by `?route=`,
    /// `?listener=` or `?q=`).
    pub page: Paging,
    pub routes: Vec<RouteStatus>,
    /// The UDP listeners' flows.
    pub udp: Vec<Udp>,
}

/// Counts over every listener and route, whatever the page holds.
#[derive(Debug, Default, Serialize)]
pub(crate) struct Totals {
    pub listeners: usize,
    pub routes: usize,
    /// Connections open now (`seedgate_connections_active`).
    pub connections: u64,
    /// Connections routed in the current minute and in the whole window.
    pub routed_last_minute: u64,
    pub routed_window: u64,
    /// UDP flows held now.
    pub udp_flows: u64,
}

/// One listener.
#[derive(Debug, Serialize)]
pub(crate) struct Listener {
    pub name: String,
    /// `tcp` or `udp`.
    pub protocol: &'static str,
    pub listen: String,
    /// `listening`.
    pub state: &'static str,
    pub routes: usize,
    /// Connections open now.
    pub connections: u64,
    /// Connections routed per minute (its routes summed), oldest first.
    pub routed: [u64; MINUTES],
    /// Upstream connect failures per minute (its routes summed), oldest first.
    pub upstream_errors: [u64; MINUTES],
    /// Connections refused so far, by reason (`seedgate_rejects_total`).
    pub refusals: BTreeMap<String, u64>,
    /// Seconds since its routing table last changed (start, reload, route file).
    pub since_reload_s: u64,
}

/// One route.
#[derive(Debug, Serialize)]
pub(crate) struct RouteStatus {
    pub listener: String,
    pub name: String,
    /// `up` (an upstream not ejected), `degraded` (some ejected) or `down` (all ejected).
    pub health: &'static str,
    pub sni: Vec<String>,
    pub upstreams: Vec<UpstreamStatus>,
    /// The upstreams as one line: `addr (n open)`, ejected ones marked.
    pub upstream_list: Vec<String>,
    /// Connections routed through it open now, and connects in flight.
    pub connections: usize,
    pub pending: usize,
    /// Connections routed per minute, oldest first.
    pub routed: [u64; MINUTES],
    /// Failed upstream connect attempts per minute, oldest first.
    pub upstream_errors: [u64; MINUTES],
    /// Routed connections so far, and upstream connect failures so far by reason.
    pub routed_total: u64,
    pub upstream_failures: BTreeMap<String, u64>,
    /// Connections refused for its share so far.
    pub share_refused: u64,
    /// Seconds since this route took its current config.
    pub since_change_s: u64,
}

/// One upstream of a route.
#[derive(Debug, Serialize)]
pub(crate) struct UpstreamStatus {
    pub addr: String,
    /// Connections to it open now.
    pub connections: usize,
    /// Skipped after a failed connect, for `upstream_eject`.
    pub ejected: bool,
}

/// One UDP listener's flows.
#[derive(Debug, Serialize)]
pub(crate) struct Udp {
    pub listener: String,
    /// Flows held now (routed or waiting for their ClientHello).
    pub flows: u64,
    /// Flows so far, by result (`ok`, or why it was refused).
    pub results: BTreeMap<String, u64>,
    /// Datagrams not relayed so far, by reason.
    pub dropped: BTreeMap<String, u64>,
    /// Flows that moved to a new client address so far.
    pub migrated: u64,
}

const PAGE: Page = Page {
    title: "sni-router",
    summary: &[
        col("totals.listeners", "listeners", Format::Int),
        col("totals.routes", "routes", Format::Int),
        col("totals.connections", "connections open", Format::Int),
        col("totals.routed_last_minute", "routed this minute", Format::Int),
        col("totals.routed_window", "routed (10 min)", Format::Int),
        col("totals.udp_flows", "UDP flows", Format::Int),
        col("uptime_s", "up", Format::Secs),
    ],
    tables: &[
        Table {
            key: "listeners",
            title: "Listeners",
            row_key: "name",
            state: "state",
            columns: &[
                col("name", "listener", Format::Text),
                col("protocol", "protocol", Format::Text),
                col("listen", "listen", Format::Text),
                col("routes", "routes", Format::Int),
                col("connections", "open", Format::Int),
                col("routed", "routed (1m / 10m)", Format::Series),
                col("upstream_errors", "upstream errors (1m / 10m)", Format::Series),
                col("refusals", "refused by reason", Format::Counts),
                col("since_reload_s", "since reload", Format::Secs),
            ],
            nested: None,
            paged: false,
            empty: "no listeners",
        },
        Table {
            key: "routes",
            title: "Routes",
            row_key: "name",
            state: "health",
            columns: &[
                col("listener", "listener", Format::Text),
                col("name", "route", Format::Text),
                col("health", "health", Format::State),
                col("sni", "SNI", Format::List),
                col("upstream_list", "upstreams", Format::List),
                col("connections", "open", Format::Int),
                col("routed", "routed (1m / 10m)", Format::Series),
                col("upstream_errors", "upstream errors (1m / 10m)", Format::Series),
                col("routed_total", "routed", Format::Int),
                col("upstream_failures", "upstream failures", Format::Counts),
                col("share_refused", "share refused", Format::Int),
                col("since_change_s", "since change", Format::Secs),
            ],
            nested: None,
            paged: true,
            empty: "no route matches",
        },
        Table {
            key: "udp",
            title: "UDP flows",
            row_key: "listener",
            state: "",
            columns: &[
                col("listener", "listener", Format::Text),
                col("flows", "flows now", Format::Int),
                col("results", "flows by result", Format::Counts),
                col("dropped", "datagrams dropped", Format::Counts),
                col("migrated", "migrated", Format::Int),
            ],
            nested: None,
            paged: false,
            empty: "no UDP listener",
        },
    ],
};

fn add(a: &mut [u64; MINUTES], b: [u64; MINUTES]) {
    for (x, y) in a.iter_mut().zip(b) {
        *x += y;
    }
}

fn route_status(
    l: &ListenerRt,
    r: &Route,
    shares: &HashMap<(String, String), proxy_core::net::share::TenantFigures>,
    failures: &HashMap<(String, String), BTreeMap<String, u64>>,
    now: Instant,
) -> RouteStatus {
    let upstreams: Vec<UpstreamStatus> = r
        .upstreams
        .iter()
        .map(|u| UpstreamStatus { addr: u.addr.to_string(), connections: u.active(), ejected: u.ejected() })
        .collect();
    let ejected = upstreams.iter().filter(|u| u.ejected).count();
    let health = match ejected {
        0 => "up",
        n if n < upstreams.len() => "degraded",
        _ => "down",
    };
    let key = (l.name.to_string(), r.name.to_string());
    let share = shares.get(&key);
    RouteStatus {
        listener: l.name.to_string(),
        name: r.name.to_string(),
        health,
        sni: r.cfg.sni.clone(),
        upstream_list: upstreams
            .iter()
            .map(|u| match u.ejected {
                true => format!("{} ({} open, ejected)", u.addr, u.connections),
                false => format!("{} ({} open)", u.addr, u.connections),
            })
            .collect(),
        upstreams,
        connections: share.map_or(0, |s| s.established),
        pending: share.map_or(0, |s| s.pending),
        routed: r.minutes.series(ROUTED),
        upstream_errors: r.minutes.series(UPSTREAM_FAILED),
        routed_total: r.meters.ok.get(),
        upstream_failures: failures.get(&key).cloned().unwrap_or_default(),
        share_refused: share.map_or(0, |s| s.refused),
        since_change_s: now.saturating_duration_since(r.since).as_secs(),
    }
}

/// The status document for `query`.
pub(crate) fn status(shared: &Shared, listeners: &[Arc<ListenerRt>], query: &StatusQuery) -> StatusPage {
    let header = Header::new("sni-router");
    let now = Instant::now();
    let m = &shared.metrics;
    let (active, rejects) = (readings(&m.conn.active), readings(&m.conn.rejects));
    let mut failures: HashMap<(String, String), BTreeMap<String, u64>> = HashMap::new();
    for f in readings(&m.conn.connect_failures).iter().filter(|f| f.value > 0.0) {
        let key = (f.label("listener").to_owned(), f.label("route").to_owned());
        *failures.entry(key).or_default().entry(f.label("reason").to_owned()).or_insert(0) += f.value as u64;
    }
    let shares: HashMap<(String, String), proxy_core::net::share::TenantFigures> = shared
        .shares
        .figures()
        .into_iter()
        .filter_map(|t| match t.labels.as_slice() {
            [l, r] => Some(((l.clone(), r.clone()), t)),
            _ => None,
        })
        .collect();
    let open =
        |name: &str| active.iter().filter(|r| r.label("listener") == name).map(|r| r.value.max(0.0) as u64).sum();
    let tables: Vec<(Arc<ListenerRt>, Arc<crate::table::Table>)> =
        listeners.iter().map(|l| (l.clone(), l.table.load_full())).collect();

    let mut totals = Totals { listeners: tables.len(), ..Totals::default() };
    let mut out_listeners = Vec::new();
    for (l, t) in &tables {
        let (mut routed, mut errors) = ([0; MINUTES], [0; MINUTES]);
        for r in &t.routes {
            add(&mut routed, r.minutes.series(ROUTED));
            add(&mut errors, r.minutes.series(UPSTREAM_FAILED));
        }
        totals.routes += t.routes.len();
        totals.routed_last_minute += routed[MINUTES - 1];
        totals.routed_window += routed.iter().sum::<u64>();
        let connections = open(&l.name);
        totals.connections += connections;
        out_listeners.push(Listener {
            name: l.name.to_string(),
            protocol: l.protocol(),
            listen: l.addr.to_string(),
            state: "listening",
            routes: t.routes.len(),
            connections,
            routed,
            upstream_errors: errors,
            refusals: sum_by(&rejects, Some(("listener", &l.name)), "reason"),
            since_reload_s: now.saturating_duration_since(t.built).as_secs(),
        });
    }

    let (want_route, want_listener) = (query.get("route"), query.get("listener"));
    let all = tables.iter().flat_map(|(l, t)| t.routes.iter().map(move |r| (l, r)));
    let matched: Vec<(&Arc<ListenerRt>, &Arc<Route>)> = all
        .filter(|(l, r)| want_route.is_none_or(|w| w == &*r.name) && want_listener.is_none_or(|w| w == &*l.name))
        .filter(|(l, r)| {
            let upstreams: Vec<String> = r.upstreams.iter().map(|u| u.addr.to_string()).collect();
            query.matches(
                [&*l.name, &*r.name]
                    .into_iter()
                    .chain(r.cfg.sni.iter().map(String::as_str))
                    .chain(upstreams.iter().map(String::as_str)),
            )
        })
        .collect();
    let (rows, page) = query.page(matched, totals.routes);
    let routes = rows.into_iter().map(|(l, r)| route_status(l, r, &shares, &failures, now)).collect();

    let udp = udp(m, &tables, &mut totals);
    let doc = RouterStatus { header, totals, listeners: out_listeners, page, routes, udp };
    StatusPage::new(doc, &PAGE)
}

/// The UDP listeners' flows (held now, by result, dropped, migrated), added to `totals`.
fn udp(
    m: &crate::shared::Metrics,
    tables: &[(Arc<ListenerRt>, Arc<crate::table::Table>)],
    totals: &mut Totals,
) -> Vec<Udp> {
    let u = &m.udp;
    let (flows_active, flows, dropped, migrated) =
        (readings(&u.flows_active), readings(&u.flows), readings(&u.dropped), readings(&u.migrated));
    tables
        .iter()
        .filter(|(l, _)| l.protocol() == "udp")
        .map(|(l, _)| {
            let name: &str = &l.name;
            let held =
                flows_active.iter().filter(|r| r.label("listener") == name).map(|r| r.value.max(0.0) as u64).sum();
            totals.udp_flows += held;
            Udp {
                listener: name.to_owned(),
                flows: held,
                results: sum_by(&flows, Some(("listener", name)), "result"),
                dropped: sum_by(&dropped, Some(("listener", name)), "reason"),
                migrated: migrated.iter().filter(|r| r.label("listener") == name).map(|r| r.value as u64).sum(),
            }
        })
        .collect()
}
