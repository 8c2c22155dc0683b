//! proxy-server's status page (`/status`, `/`): each cluster (its state, its agents here and how each session stands, its dials of the last minutes by result), each front end (its connections and refusals), the token reviews — assembled from what the directory, the listeners and the metrics already keep.
//!
//! Everything here reads through accessors of the modules that own the data
//! ([`SessionDirectory::views`](crate::registry::SessionDirectory::views), the sessions'
//! [`Tally`](crate::session::Tally), the share counts, the token reviewers' figures, the
//! metrics); nothing here is on a dial's or a stream's path.

use crate::liveness::Standing;
use crate::registry::ClusterView;
use crate::registry::dial::{DIAL_RESULTS, Dials};
use crate::session::Session;
use crate::shared::Shared;
use proxy_core::obs::minutes::MINUTES;
use proxy_core::obs::status::{
    Field, Format, Header, Page, Paging, StatusPage, StatusQuery, Table, col, group_by, readings, sum_by,
};
use seedgate_config::server::ClusterMode;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

/// proxy-server's `/status` document (version [`proxy_core::obs::status::VERSION`]).
#[derive(Debug, Serialize)]
pub(crate) struct ServerStatus {
    #[serde(flatten)]
    pub header: Header,
    pub replica: Replica,
    pub totals: Totals,
    /// Which clusters this document holds (`?limit=`, `?offset=`, filtered by `?cluster=` or `?q=`).
    pub page: Paging,
    pub clusters: Vec<Cluster>,
    pub frontends: Vec<Frontend>,
    pub token_reviews: TokenReviews,
}

/// This replica as it announces itself to its agents.
#[derive(Debug, Serialize)]
pub(crate) struct Replica {
    pub id: String,
    /// The replica count it announces.
    pub count: u32,
    /// It is shutting down (its agents look for another replica).
    pub draining: bool,
}

/// Counts over every cluster, whatever the page holds.
#[derive(Debug, Default, Serialize)]
pub(crate) struct Totals {
    pub clusters: usize,
    /// Clusters whose agents are expected here and that have none.
    pub clusters_without_agents: usize,
    pub sessions: usize,
    /// Sessions not `active` (suspect, doubted, draining, fenced).
    pub sessions_not_active: usize,
    /// Tunnel streams open now.
    pub streams: usize,
}

/// One cluster.
#[derive(Debug, Serialize)]
pub(crate) struct Cluster {
    pub name: String,
    /// `active`, `draining` or `fenced`.
    pub state: &'static str,
    /// What the page colours it by: `up`, `degraded` (a session not active), `no-agents`
    /// (expected here, none connected: its dials answer 503), `hibernated`, `draining`, `fenced`.
    pub health: &'static str,
    pub hibernated: bool,
    /// Its agents are expected here (active, not hibernated).
    pub expected: bool,
    /// Something in the config names it (a front end, `clusters`, a cluster file, an override).
    pub known: bool,
    pub move_to: Vec<String>,
    /// Its agent sessions on this replica.
    pub sessions_here: usize,
    /// Its tunnel streams open now (on its sessions here), and dials in flight.
    pub streams: usize,
    pub pending: usize,
    /// Its cap of streams at its last dial (its share of `limits.max_connections`; 0 before any).
    pub streams_cap: usize,
    /// Dials and streams refused for its share so far.
    pub share_refused: u64,
    /// Its dials of the last [`Header::minutes`] minutes: `ok` and each refusal's code, each an
    /// array of per-minute counts, oldest first (codes without any are left out).
    pub dials: BTreeMap<&'static str, [u64; MINUTES]>,
    /// The same minutes: dials that failed (every code but `ok`), summed per minute.
    pub dials_failed: [u64; MINUTES],
    /// Its tunnel bytes so far (`seedgate_tunnel_bytes_total`), by direction.
    pub bytes_to_shoot: u64,
    pub bytes_to_seed: u64,
    /// Agent sessions so far, by result: `accepted` or why one was refused.
    pub agent_sessions: BTreeMap<String, u64>,
    pub sessions: Vec<SessionStatus>,
}

/// One agent session.
#[derive(Debug, Serialize)]
pub(crate) struct SessionStatus {
    pub id: u64,
    /// What its agent said in its hello (empty before it came).
    pub node: String,
    pub instance: String,
    pub version: String,
    pub host: String,
    /// The agent's address as this replica sees it.
    pub peer: String,
    /// `h2` or `quic`.
    pub transport: &'static str,
    /// The replica it is on (this one).
    pub replica: String,
    pub age_s: u64,
    /// `active`, `suspect` (its keepalive unanswered: no new dials), `doubted` (dials try it
    /// last: see `doubt`), `draining` (the agent or the cluster is going away), `fenced`.
    pub standing: &'static str,
    /// Why it is doubted: `superseded` (a new run of its node connected) or `silent` (a stream
    /// open it left unanswered).
    pub doubt: Option<&'static str>,
    /// Streams open on it now.
    pub streams: usize,
    /// Bytes of its streams that have ended (a stream's bytes count when it ends).
    pub bytes_to_shoot: u64,
    pub bytes_to_seed: u64,
    /// Its last failed dial (the code and the reason), and how long ago.
    pub last_error: Option<String>,
    pub last_error_age_s: Option<u64>,
    /// The ServiceAccount a token review named, if it came with a token.
    pub account: Option<String>,
}

/// One front end.
#[derive(Debug, Serialize)]
pub(crate) struct Frontend {
    pub name: String,
    /// `http-connect`, `grpc` or `tcp`.
    pub kind: &'static str,
    /// `ip:port` or `unix:<path>`.
    pub listen: String,
    /// Its cluster, or where it takes it from (`client_certificate`, `proxy_authorization`).
    pub cluster: String,
    pub tls: bool,
    /// Connections open now.
    pub connections: u64,
    /// Connections so far, by result (`ok`, or the reason).
    pub results: BTreeMap<String, u64>,
    /// Connections refused so far, by reason (`seedgate_rejects_total`).
    pub refusals: BTreeMap<String, u64>,
}

/// The TokenReviews of agents that come with ServiceAccount tokens.
#[derive(Debug, Serialize)]
pub(crate) struct TokenReviews {
    /// Positive answers cached now, and the cache's size.
    pub cached: usize,
    pub cache_size: usize,
    /// Reviews in flight now, in all and by cluster.
    pub in_flight: usize,
    pub in_flight_by_cluster: BTreeMap<String, usize>,
    /// Reviews so far by result: `authenticated`, `cached`, or why the token was refused.
    pub results: BTreeMap<String, u64>,
}

const SESSIONS: Table = Table {
    key: "sessions",
    title: "sessions",
    row_key: "id",
    state: "standing",
    columns: &[
        col("node", "node", Format::Text),
        col("standing", "standing", Format::State),
        col("doubt", "doubt", Format::Text),
        col("transport", "transport", Format::Text),
        col("peer", "peer", Format::Text),
        col("replica", "replica", Format::Text),
        col("age_s", "age", Format::Secs),
        col("streams", "streams", Format::Int),
        col("bytes_to_shoot", "to shoot", Format::Bytes),
        col("bytes_to_seed", "to seed", Format::Bytes),
        col("last_error", "last error", Format::Text),
        col("version", "version", Format::Text),
    ],
    nested: None,
    paged: false,
    empty: "no sessions",
};

const SUMMARY: &[Field] = &[
    col("replica.id", "replica", Format::Text),
    col("replica.count", "replicas announced", Format::Int),
    col("replica.draining", "draining", Format::Bool),
    col("totals.clusters", "clusters", Format::Int),
    col("totals.clusters_without_agents", "without agents", Format::Int),
    col("totals.sessions", "sessions", Format::Int),
    col("totals.sessions_not_active", "sessions not active", Format::Int),
    col("totals.streams", "streams", Format::Int),
    col("uptime_s", "up", Format::Secs),
    col("token_reviews.cached", "token answers cached", Format::Int),
    col("token_reviews.in_flight", "token reviews in flight", Format::Int),
    col("token_reviews.results", "token reviews", Format::Counts),
];

/// The page: the summary (with the token reviews), clusters (each opening its sessions), front ends.
pub(crate) const PAGE: Page = Page {
    title: "proxy-server",
    summary: SUMMARY,
    tables: &[
        Table {
            key: "clusters",
            title: "Clusters",
            row_key: "name",
            state: "health",
            columns: &[
                col("name", "cluster", Format::Text),
                col("health", "health", Format::State),
                col("state", "state", Format::Text),
                col("sessions_here", "agents", Format::Int),
                col("streams", "streams", Format::Int),
                col("dials.ok", "dials ok (1m / 10m)", Format::Series),
                col("dials_failed", "failed (1m / 10m)", Format::Series),
                col("dials", "dials by result (10m)", Format::Counts),
                col("bytes_to_shoot", "to shoot", Format::Bytes),
                col("bytes_to_seed", "to seed", Format::Bytes),
                col("agent_sessions", "agent sessions", Format::Counts),
                col("move_to", "move to", Format::List),
            ],
            nested: Some(&SESSIONS),
            paged: true,
            empty: "no cluster matches",
        },
        Table {
            key: "frontends",
            title: "Front ends",
            row_key: "name",
            state: "",
            columns: &[
                col("name", "front end", Format::Text),
                col("kind", "kind", Format::Text),
                col("listen", "listen", Format::Text),
                col("cluster", "cluster", Format::Text),
                col("tls", "TLS", Format::Bool),
                col("connections", "open", Format::Int),
                col("results", "connections by result", Format::Counts),
                col("refusals", "refused by reason", Format::Counts),
            ],
            nested: None,
            paged: false,
            empty: "no front ends",
        },
    ],
};

/// How a session stands, as the page names it, and why it is doubted.
fn standing(shared: &Shared, s: &Session, mode: ClusterMode) -> (&'static str, Option<&'static str>) {
    if mode == ClusterMode::Fenced {
        return ("fenced", None);
    }
    if s.opener.is_closed() || mode == ClusterMode::Draining {
        return ("draining", None);
    }
    if crate::attempt::suspect(s) {
        return ("suspect", None);
    }
    match crate::attempt::standing(s, &shared.metrics) {
        Standing::Healthy => ("active", None),
        Standing::Suspect => ("doubted", Some("silent")),
        Standing::Superseded => ("doubted", Some("superseded")),
    }
}

fn session(shared: &Shared, s: &Session, mode: ClusterMode, replica: &str, now: Instant) -> SessionStatus {
    let hello = s.hello.get();
    let text = |f: fn(&proxy_core::tunnel::AgentHello) -> &String| hello.map(|h| f(h).clone()).unwrap_or_default();
    let (standing, doubt) = standing(shared, s, mode);
    let (bytes_to_shoot, bytes_to_seed) = s.tally.bytes();
    let last = s.tally.last_error();
    SessionStatus {
        id: s.id,
        node: text(|h| &h.node),
        instance: text(|h| &h.instance),
        version: text(|h| &h.version),
        host: text(|h| &h.host),
        peer: s.peer.clone(),
        transport: s.transport,
        replica: replica.to_owned(),
        age_s: now.saturating_duration_since(s.since).as_secs(),
        standing,
        doubt,
        streams: s.opener.active_streams(),
        bytes_to_shoot,
        bytes_to_seed,
        last_error_age_s: last.as_ref().map(|(at, _)| now.saturating_duration_since(*at).as_secs()),
        last_error: last.map(|(_, e)| e),
        account: s.identity.account.clone(),
    }
}

/// What a cluster's dials of the last minutes came to, by result, and the failures per minute.
fn dials(d: &Dials) -> (BTreeMap<&'static str, [u64; MINUTES]>, [u64; MINUTES]) {
    let mut by = BTreeMap::new();
    let mut failed = [0; MINUTES];
    for (i, code) in DIAL_RESULTS.iter().enumerate() {
        let s = d.series(i);
        if s.iter().all(|n| *n == 0) {
            continue;
        }
        if i > 0 {
            for (f, n) in failed.iter_mut().zip(s) {
                *f += n;
            }
        }
        by.insert(*code, s);
    }
    (by, failed)
}

/// A cluster as the directory and the config know it (no entry: a known cluster that never had a
/// session or a dial here).
struct Known<'a> {
    name: &'a str,
    view: Option<&'a ClusterView>,
    expected: bool,
    known: bool,
}

/// The status document for `query`; `addresses`: the listeners' addresses by name.
pub(crate) fn status(shared: &Shared, addresses: &BTreeMap<String, String>, query: &StatusQuery) -> StatusPage {
    let header = Header::new("proxy-server");
    let now = Instant::now();
    let info = shared.replica.info();
    let cfg = shared.config.load();
    let known = shared.known_clusters();
    let states = shared.effective_states();
    let views = shared.directory.views();
    let by_name: HashMap<&str, &ClusterView> = views.iter().map(|v| (v.name.as_str(), v)).collect();
    let mut names: Vec<&str> = views.iter().map(|v| v.name.as_str()).chain(known.keys().map(String::as_str)).collect();
    names.sort_unstable();
    names.dedup();
    // Entries the dial path made for clusters nothing names and nothing uses now stay out.
    let all: Vec<Known<'_>> = names
        .into_iter()
        .map(|name| {
            let view = by_name.get(name).copied();
            Known { name, view, expected: known.get(name).copied().unwrap_or(false), known: known.contains_key(name) }
        })
        .filter(|k| {
            k.known || k.view.is_some_and(|v| !v.sessions.is_empty() || (0..DIAL_RESULTS.len()).any(|i| v.dials.any(i)))
        })
        .collect();

    let mode_of = |k: &Known<'_>| k.view.and_then(|v| v.mode.as_ref()).map_or(ClusterMode::Active, |m| m.mode);
    let shares: HashMap<String, proxy_core::net::share::TenantFigures> = shared
        .directory
        .shares
        .figures()
        .into_iter()
        .filter_map(|t| t.labels.first().cloned().map(|c| (c, t)))
        .collect();
    let mut totals = Totals { clusters: all.len(), ..Totals::default() };
    for k in &all {
        let sessions = k.view.map(|v| v.sessions.as_slice()).unwrap_or_default();
        let mode = mode_of(k);
        totals.sessions += sessions.len();
        totals.sessions_not_active += sessions.iter().filter(|s| standing(shared, s, mode).0 != "active").count();
        totals.streams += sessions.iter().map(|s| s.opener.active_streams()).sum::<usize>();
        if k.expected && sessions.is_empty() && mode == ClusterMode::Active {
            totals.clusters_without_agents += 1;
        }
    }

    let exact = query.get("cluster");
    let matched: Vec<&Known<'_>> = all
        .iter()
        .filter(|k| exact.is_none_or(|c| c == k.name))
        .filter(|k| {
            let sessions = k.view.map(|v| v.sessions.as_slice()).unwrap_or_default();
            let nodes = sessions.iter().filter_map(|s| s.hello.get().map(|h| h.node.as_str()));
            query.matches(std::iter::once(k.name).chain(nodes).chain(sessions.iter().map(|s| s.peer.as_str())))
        })
        .collect();
    let (rows, page) = query.page(matched, all.len());

    let bytes = group_by(&readings(&shared.metrics.tunnel_bytes), "cluster", "direction");
    let mut agent_sessions = group_by(&readings(&shared.metrics.agent_sessions), "cluster", "result");
    let clusters = rows
        .into_iter()
        .map(|k| {
            let mode = mode_of(k);
            let move_to = k.view.and_then(|v| v.mode.as_ref()).map(|m| m.move_to.clone()).unwrap_or_default();
            let hibernated = states.get(k.name).and_then(|s| s.hibernated).unwrap_or(false);
            let sessions: Vec<SessionStatus> = k
                .view
                .map(|v| v.sessions.as_slice())
                .unwrap_or_default()
                .iter()
                .map(|s| session(shared, s, mode, &info.id, now))
                .collect();
            let health = match mode {
                ClusterMode::Fenced => "fenced",
                ClusterMode::Draining => "draining",
                ClusterMode::Active if sessions.is_empty() && hibernated => "hibernated",
                ClusterMode::Active if sessions.is_empty() && k.expected => "no-agents",
                ClusterMode::Active if sessions.is_empty() => "idle",
                ClusterMode::Active if sessions.iter().any(|s| s.standing != "active") => "degraded",
                ClusterMode::Active => "up",
            };
            let (dials, dials_failed) = k.view.map(|v| dials(&v.dials)).unwrap_or_default();
            let share = shares.get(k.name);
            let by_dir = bytes.get(k.name);
            let bytes_of = |d: &str| by_dir.and_then(|b| b.get(d)).copied().unwrap_or(0);
            Cluster {
                name: k.name.to_owned(),
                state: match mode {
                    ClusterMode::Active => "active",
                    ClusterMode::Draining => "draining",
                    ClusterMode::Fenced => "fenced",
                },
                health,
                hibernated,
                expected: k.expected,
                known: k.known,
                move_to,
                sessions_here: sessions.len(),
                streams: sessions.iter().map(|s| s.streams).sum(),
                pending: share.map_or(0, |s| s.pending),
                streams_cap: share.map_or(0, |s| s.established_cap),
                share_refused: share.map_or(0, |s| s.refused),
                dials,
                dials_failed,
                bytes_to_shoot: bytes_of("to_shoot"),
                bytes_to_seed: bytes_of("to_seed"),
                agent_sessions: agent_sessions.remove(k.name).unwrap_or_default(),
                sessions,
            }
        })
        .collect();

    let conn = &shared.metrics.conn;
    let (active, results, rejects) = (readings(&conn.active), readings(&conn.connections), readings(&conn.rejects));
    let frontends = cfg
        .frontends
        .iter()
        .map(|f| {
            let name = f.name.as_str();
            Frontend {
                name: name.to_owned(),
                kind: f.protocol.as_str(),
                listen: addresses.get(name).cloned().unwrap_or_default(),
                cluster: f.cluster.clone().unwrap_or_else(|| match f.cluster_from {
                    seedgate_config::server::ClusterFrom::ClientCertificate => "(client certificate)".into(),
                    seedgate_config::server::ClusterFrom::ProxyAuthorization => "(proxy credentials)".into(),
                }),
                tls: f.tls.is_some(),
                connections: active
                    .iter()
                    .filter(|r| r.label("listener") == name)
                    .map(|r| r.value.max(0.0) as u64)
                    .sum(),
                results: sum_by(&results, Some(("listener", name)), "result"),
                refusals: sum_by(&rejects, Some(("listener", name)), "reason"),
            }
        })
        .collect();

    let figures = shared.reviewers.figures();
    let in_flight_by_cluster: BTreeMap<String, usize> = figures.in_flight.into_iter().filter(|(_, n)| *n > 0).collect();
    let token_reviews = TokenReviews {
        cached: figures.cached,
        cache_size: figures.capacity,
        in_flight: in_flight_by_cluster.values().sum(),
        in_flight_by_cluster,
        results: figures.results,
    };
    let doc = ServerStatus {
        header,
        replica: Replica { id: info.id.clone(), count: info.count, draining: info.draining },
        totals,
        page,
        clusters,
        frontends,
        token_reviews,
    };
    StatusPage::new(doc, &PAGE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proxy_core::obs::admin::{AdminHooks, AdminState, Check};
    use proxy_core::tunnel::{AgentHello, BoxFuture, ControlMsg, DialError, Opener, TunnelStream};
    use std::sync::{Arc, OnceLock};
    use std::time::Duration;
    use tokio_util::sync::CancellationToken;

    /// An agent session whose agent refuses every dial at once.
    struct Refusing;

    impl Opener for Refusing {
        fn open(&self, target: &str, _: Duration) -> BoxFuture<'_, Result<TunnelStream, DialError>> {
            let e = DialError::Refused(format!("{target}: connection refused"));
            Box::pin(async move { Err(e) })
        }
        fn control(&self, _: &ControlMsg) -> Result<(), DialError> {
            Ok(())
        }
        fn active_streams(&self) -> usize {
            3
        }
        fn is_closed(&self) -> bool {
            false
        }
    }

    /// A replica of `clusters` clusters of `per` sessions each, every cluster with a refused dial.
    async fn fleet(clusters: usize, per: usize) -> Arc<Shared> {
        let shared = crate::shared::test_shared();
        for c in 0..clusters {
            let cluster = format!("shoot--project-{c:04}");
            for s in 0..per {
                let hello = AgentHello {
                    node: format!("ip-10-250-{}-{s}.eu-west-1.compute.internal", c % 250),
                    instance: format!("{:016x}", c * 100 + s),
                    version: "1.0.0".into(),
                    ..AgentHello::default()
                };
                let opener: Arc<dyn Opener> = Arc::new(Refusing);
                let peer = format!("10.{}.{}.{s}:{}", c / 250, c % 250, 40000 + s);
                let added = shared.directory.add(
                    &cluster,
                    peer,
                    opener,
                    Arc::new(OnceLock::from(hello)),
                    CancellationToken::new(),
                    Default::default(),
                    "h2",
                );
                assert!(added.is_ok());
            }
            let _ = crate::frontend::dial(&shared, &cluster, "10.250.0.5:10250").await;
        }
        shared
    }

    /// The median of `f`'s times over `n` runs, and its last result.
    fn median<T>(n: usize, mut f: impl FnMut() -> T) -> (Duration, T) {
        let mut times = Vec::with_capacity(n);
        let mut last = None;
        for _ in 0..n {
            let t = Instant::now();
            last = Some(f());
            times.push(t.elapsed());
        }
        times.sort();
        (times[n / 2], last.expect("n > 0"))
    }

    struct Hooks(Arc<Shared>);

    impl AdminHooks for Hooks {
        fn ready(&self) -> Vec<Check> {
            Vec::new()
        }
        fn config(&self) -> serde_json::Value {
            serde_json::Value::Null
        }
        fn status(&self, query: &StatusQuery) -> Option<StatusPage> {
            Some(status(&self.0, &BTreeMap::new(), query))
        }
    }

    /// Not a test: the measurement of the status of a seed with 1,000 shoots and 10,000 agent
    /// sessions (what `/status` and `/` cost to make, and how large they are). Run it in a
    /// release build:
    ///
    /// `cargo test --release -p proxy-server --lib status::tests::a_thousand_clusters -- --ignored --nocapture`
    ///
    /// With `SEEDGATE_STATUS_SERVE=<seconds>` it then serves that replica's admin listener (the
    /// address printed, and written to `SEEDGATE_STATUS_ADDR_FILE` if set) for a browser to load.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "a measurement, not a test: run it with --ignored --nocapture"]
    async fn a_thousand_clusters_of_ten_sessions() {
        let built = Instant::now();
        let shared = fleet(1000, 10).await;
        eprintln!("filled 1000 clusters x 10 sessions in {:?}", built.elapsed());
        for q in ["", "limit=1000", "cluster=shoot--project-0500", "q=ip-10-250-7-"] {
            let query = StatusQuery::parse(Some(q));
            let (made, page) = median(21, || status(&shared, &BTreeMap::new(), &query));
            let (json_t, json) = median(21, || page.doc.to_json());
            let (html_t, html) = median(11, || proxy_core::obs::status::render(page.page, &page.doc.to_tree(), &query));
            let tree = page.doc.to_tree();
            let whole = made + json_t;
            eprintln!(
                "?{q:<30} clusters {:>4}, sessions {:>5}: document made {made:?}, JSON {json_t:?} ({} KiB; /status in all {whole:?}), tree and HTML {html_t:?} ({} KiB; / in all {:?})",
                tree["clusters"].as_array().map_or(0, Vec::len),
                tree["clusters"]
                    .as_array()
                    .map_or(0, |c| c.iter().map(|c| c["sessions"].as_array().map_or(0, Vec::len)).sum::<usize>()),
                json.len() / 1024,
                html.len() / 1024,
                made + html_t,
            );
        }
        // One cluster's document, its sessions cut to one (the admin reference's example).
        let mut one =
            status(&shared, &BTreeMap::new(), &StatusQuery::parse(Some("cluster=shoot--project-0007"))).doc.to_tree();
        if let Some(s) = one["clusters"][0]["sessions"].as_array_mut() {
            // The session the cluster's dial went to (its last error), alone.
            s.sort_by_key(|s| s["last_error"].is_null());
            s.truncate(1);
        }
        eprintln!("{}", serde_json::to_string_pretty(&one).expect("json"));
        let Some(secs) = std::env::var("SEEDGATE_STATUS_SERVE").ok().and_then(|s| s.parse::<u64>().ok()) else {
            return;
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        if let Ok(f) = std::env::var("SEEDGATE_STATUS_ADDR_FILE") {
            std::fs::write(f, addr.to_string()).expect("address file");
        }
        eprintln!("serving http://{addr}/ for {secs}s");
        let token = Arc::new(proxy_core::sync::RwLock::new(None));
        let state = AdminState::new(
            proxy_core::prometheus::Registry::new(),
            Arc::new(Hooks(shared)),
            token,
            CancellationToken::new(),
        );
        let stop = CancellationToken::new();
        let served = tokio::spawn(proxy_core::obs::admin::serve(listener, state, stop.clone()));
        tokio::time::sleep(Duration::from_secs(secs)).await;
        stop.cancel();
        let _ = served.await;
    }
}
