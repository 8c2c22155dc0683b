//! proxy-agent's status page (`/status`, `/`): each configured server and the replica each of its slots holds (the session's standing, since when, what it went through: replacements, back-off, transport changes), and the seed's dials in the shoot of the last minutes by result.

use crate::shared::Shared;
use crate::tunnel::{DIAL_RESULTS, Tunnel, node_name, slot_label};
use proxy_core::obs::minutes::MINUTES;
use proxy_core::obs::status::{Format, Header, Page, Reading, StatusPage, StatusQuery, Table, col, readings};
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Instant;

/// proxy-agent's `/status` document (version [`proxy_core::obs::status::VERSION`]).
#[derive(Debug, Serialize)]
pub(crate) struct AgentStatus {
    #[serde(flatten)]
    pub header: Header,
    pub agent: About,
    pub totals: Totals,
    /// Each configured server name (filtered by `?server=` or `?q=`).
    pub servers: Vec<Server>,
    /// The seed's dials in the shoot of the last minutes: `ok` and each refusal's code, each an
    /// array of per-minute counts, oldest first.
    pub dials: Vec<Dials>,
}

/// What this agent says of itself in its hellos.
#[derive(Debug, Serialize)]
pub(crate) struct About {
    pub node: String,
    pub instance: String,
    /// `h2`, `quic` or `auto` (`tunnel.transport`).
    pub transport: String,
    pub cluster: String,
}

#[derive(Debug, Default, Serialize)]
pub(crate) struct Totals {
    pub servers: usize,
    /// Sessions up, and the replicas the servers announce in all.
    pub sessions_up: usize,
    pub replicas_expected: u64,
    /// Streams open now.
    pub streams: usize,
}

/// One configured server name.
#[derive(Debug, Serialize)]
pub(crate) struct Server {
    pub name: String,
    /// `connected` (a session to every announced replica), `degraded` (fewer, or one draining),
    /// `not-connected`.
    pub health: &'static str,
    /// Replicas the newest announcement names.
    pub replicas_expected: u32,
    pub sessions_up: usize,
    pub slots: Vec<SlotStatus>,
}

/// One slot: at most one session, to one replica.
#[derive(Debug, Serialize)]
pub(crate) struct SlotStatus {
    /// The slot's name in logs and metrics (`server`, `server#1`, ...).
    pub slot: String,
    /// `connected`, `suspect` (its keepalive unanswered: a rescue is dialled beside it),
    /// `draining` (its replica is shutting down), `backoff`, `connecting`, `parked`.
    pub state: &'static str,
    /// The replica it reached (as it announced itself).
    pub replica: String,
    /// `h2` or `quic` while up.
    pub transport: String,
    /// Where the session is, or why there is none.
    pub detail: String,
    /// Seconds since the session came up or went.
    pub since_s: Option<u64>,
    /// While it backs off: seconds until it dials again.
    pub retry_in_s: Option<u64>,
    /// Its history: reconnects by result, times it turned suspect, suspect sessions replaced,
    /// move notices, sessions that ended before they proved themselves (back-off kept growing),
    /// duplicates closed, transport changes.
    pub history: BTreeMap<&'static str, u64>,
}

/// One result of the seed's dials in the shoot.
#[derive(Debug, Serialize)]
pub(crate) struct Dials {
    pub result: &'static str,
    /// `up` for `ok`, `failed` for a refusal.
    pub state: &'static str,
    pub per_minute: [u64; MINUTES],
    /// So far (`seedgate_tunnel_dial_failures_total`; for `ok`, streams opened).
    pub total: u64,
}

const PAGE: Page = Page {
    title: "proxy-agent",
    summary: &[
        col("agent.node", "node", Format::Text),
        col("agent.cluster", "cluster", Format::Text),
        col("agent.transport", "transport", Format::Text),
        col("agent.instance", "instance", Format::Text),
        col("totals.sessions_up", "sessions up", Format::Int),
        col("totals.replicas_expected", "replicas expected", Format::Int),
        col("totals.streams", "streams", Format::Int),
        col("uptime_s", "up", Format::Secs),
    ],
    tables: &[
        Table {
            key: "servers",
            title: "Servers",
            row_key: "name",
            state: "health",
            columns: &[
                col("name", "server", Format::Text),
                col("health", "health", Format::State),
                col("sessions_up", "sessions up", Format::Int),
                col("replicas_expected", "replicas", Format::Int),
            ],
            nested: Some(&Table {
                key: "slots",
                title: "slots",
                row_key: "slot",
                state: "state",
                columns: &[
                    col("slot", "slot", Format::Text),
                    col("state", "state", Format::State),
                    col("replica", "replica", Format::Text),
                    col("transport", "transport", Format::Text),
                    col("since_s", "since", Format::Secs),
                    col("retry_in_s", "retry in", Format::Secs),
                    col("history", "history", Format::Counts),
                    col("detail", "detail", Format::Text),
                ],
                nested: None,
                paged: false,
                empty: "no slots",
            }),
            paged: false,
            empty: "no server matches",
        },
        Table {
            key: "dials",
            title: "Dials in the shoot",
            row_key: "result",
            state: "state",
            columns: &[
                col("result", "result", Format::Text),
                col("per_minute", "per minute (1m / 10m)", Format::Series),
                col("total", "so far", Format::Int),
            ],
            nested: None,
            paged: false,
            empty: "no dial in the last minutes",
        },
    ],
};

/// The sum of the `readings` whose label `server` is `slot` (and whose other labels match `more`).
fn of_slot(r: &[Reading], slot: &str, more: &[(&str, &str)]) -> u64 {
    r.iter()
        .filter(|x| x.label("server") == slot && more.iter().all(|(k, v)| x.label(k) == *v))
        .map(|x| x.value as u64)
        .sum()
}

fn servers(t: &Tunnel, query: &StatusQuery, totals: &mut Totals) -> Vec<Server> {
    let m = &t.metrics.session;
    let (reconnects, suspect, replaced, moves, storms, transport, changes) = (
        readings(&m.reconnects),
        readings(&m.suspect),
        readings(&m.replaced),
        readings(&m.moves),
        readings(&m.storms_avoided),
        readings(&m.transport),
        readings(&m.transport_changes),
    );
    let duplicates = readings(&m.duplicates);
    let now = Instant::now();
    let mut out = Vec::new();
    for (name, replicas) in t.servers() {
        let (count, slots) = replicas.snapshot();
        totals.servers += 1;
        totals.replicas_expected += u64::from(count);
        let up = slots.iter().filter(|s| s.up).count();
        totals.sessions_up += up;
        if query.get("server").is_some_and(|s| s != name) || !query.matches([name.as_str()]) {
            continue;
        }
        let health = match up {
            0 => "not-connected",
            n if n < count as usize || slots.iter().any(|s| s.up && s.draining) => "degraded",
            _ => "connected",
        };
        let slots = slots
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let label = slot_label(&name, i);
                let mut history = BTreeMap::new();
                for (k, v) in [
                    ("reconnected", of_slot(&reconnects, &label, &[("result", "ok")])),
                    ("reconnect_failed", of_slot(&reconnects, &label, &[("result", "failed")])),
                    ("suspect", of_slot(&suspect, &label, &[])),
                    ("replaced", of_slot(&replaced, &label, &[])),
                    ("moves", of_slot(&moves, &label, &[])),
                    ("backed_off", of_slot(&storms, &label, &[])),
                    ("transport_changes", of_slot(&changes, &label, &[])),
                ] {
                    if v > 0 {
                        history.insert(k, v);
                    }
                }
                if i == 0 && of_slot(&duplicates, &name, &[]) > 0 {
                    history.insert("duplicates", of_slot(&duplicates, &name, &[]));
                }
                let on = transport.iter().find(|r| r.label("server") == label && r.value > 0.0);
                SlotStatus {
                    state: match (s.up, s.draining) {
                        (true, true) => "draining",
                        (true, false) if s.phase == "suspect" => "suspect",
                        (true, false) => "connected",
                        _ if s.phase.is_empty() => "connecting",
                        _ => s.phase,
                    },
                    replica: s.server.clone().unwrap_or_default(),
                    transport: on.filter(|_| s.up).map(|r| r.label("transport").to_owned()).unwrap_or_default(),
                    detail: s.detail.clone(),
                    since_s: s.changed.map(|c| now.saturating_duration_since(c).as_secs()),
                    retry_in_s: s.retry_at.filter(|_| !s.up).map(|at| at.saturating_duration_since(now).as_secs()),
                    history,
                    slot: label,
                }
            })
            .collect();
        out.push(Server { name, health, replicas_expected: count, sessions_up: up, slots });
    }
    out
}

/// The status document for `query`.
pub(crate) fn status(shared: &Shared, query: &StatusQuery) -> StatusPage {
    let header = Header::new("proxy-agent");
    let mut totals = Totals::default();
    let (agent, servers, dials) = match &shared.tunnel {
        None => (
            About { node: String::new(), instance: String::new(), transport: String::new(), cluster: String::new() },
            Vec::new(),
            Vec::new(),
        ),
        Some(t) => {
            let cfg = t.cfg.load();
            let agent = About {
                node: node_name(&cfg, |k| std::env::var(k).ok()),
                instance: t.instance().to_owned(),
                transport: cfg.transport.as_str().to_owned(),
                cluster: cfg.cluster.clone().unwrap_or_default(),
            };
            totals.streams = t.streams();
            let servers = servers(t, query, &mut totals);
            let s = &t.metrics.stream;
            let (failures, opened) = (readings(&s.dial_failures), readings(&s.streams_opened));
            let dials = DIAL_RESULTS
                .iter()
                .enumerate()
                .filter_map(|(i, result)| {
                    let per_minute = t.dials.series(i);
                    let total = match *result {
                        "ok" => opened.iter().map(|r| r.value as u64).sum(),
                        "stream_limit" => readings(&s.limit_hits).iter().map(|r| r.value as u64).sum(),
                        code => failures.iter().filter(|r| r.label("reason") == code).map(|r| r.value as u64).sum(),
                    };
                    (total > 0 || per_minute.iter().any(|n| *n > 0)).then_some(Dials {
                        result,
                        state: if *result == "ok" { "up" } else { "failed" },
                        per_minute,
                        total,
                    })
                })
                .collect();
            (agent, servers, dials)
        }
    };
    let doc = AgentStatus { header, agent, totals, servers, dials };
    StatusPage::new(doc, &PAGE)
}
