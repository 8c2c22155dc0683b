//! Tests of proxy-server's status document, and the measurement of it at a thousand clusters.

use super::*;
use crate::agents::Agents;
use crate::registry::Filed;
use crate::shared::Shared;
use proxy_core::net::accept::{ConnLimit, Slots};
use proxy_core::net::pending::{Pending, PendingMetrics};
use proxy_core::obs::admin::{AdminHooks, AdminState, Check};
use proxy_core::obs::minutes::MINUTES;
use proxy_core::tunnel::{AgentHello, BoxFuture, ControlMsg, DialError, Opener, TunnelStream};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
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

/// The admin hooks over fresh wings.
fn admin() -> Admin {
    let shared = crate::shared::test_shared();
    let reg = proxy_core::prometheus::Registry::new();
    let tls = proxy_core::watch::tls::TlsMetrics::new(&reg);
    let agents = Arc::new(Agents::new(shared.clone(), &reg, &tls));
    let pending = Pending::new(shared.config.load().pending_budget(), PendingMetrics::unregistered());
    let frontends = Arc::new(Frontends::new(shared.clone(), pending, ConnLimit::new(Slots::new(10), None)));
    Admin { shared, agents, frontends }
}

/// A replica of `clusters` clusters of `per` sessions each, every cluster with a refused dial.
async fn fleet(clusters: usize, per: usize) -> Admin {
    let admin = admin();
    let shared: &Shared = &admin.shared;
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
            let filed = Filed {
                peer,
                transport: "h2",
                opener,
                hello: Arc::new(OnceLock::from(hello)),
                stop: CancellationToken::new(),
                identity: Default::default(),
            };
            let added = shared.directory.add(&cluster, filed);
            assert!(added.is_ok());
        }
        let _ = admin.frontends.dial(&cluster, "10.250.0.5:10250").await;
    }
    admin
}

/// The status document of `admin` for `query`, as `/status` answers it.
fn doc(admin: &Admin, query: &str) -> serde_json::Value {
    admin.status(&BTreeMap::new(), &StatusQuery::parse(Some(query))).doc.to_tree()
}

#[tokio::test]
async fn a_refused_dial_shows_in_its_cluster_and_on_its_session() {
    let admin = fleet(3, 2).await;
    let all = doc(&admin, "");
    assert_eq!(all["version"], 1);
    assert_eq!(all["totals"]["clusters"], 3);
    assert_eq!(all["totals"]["sessions"], 6);
    assert_eq!(all["page"]["returned"], 3);
    let one = doc(&admin, "cluster=shoot--project-0001");
    assert_eq!(one["page"]["matched"], 1);
    let c = &one["clusters"][0];
    assert_eq!(c["name"], "shoot--project-0001");
    assert_eq!(c["health"], "up");
    assert_eq!(c["sessions_here"], 2);
    assert_eq!(c["dials"]["refused"][MINUTES - 1], 1, "{c}");
    assert_eq!(c["dials_failed"][MINUTES - 1], 1);
    let sessions = c["sessions"].as_array().expect("sessions");
    assert!(sessions.iter().all(|s| s["standing"] == "active" && s["transport"] == "h2"));
    let failed: Vec<&serde_json::Value> = sessions.iter().filter(|s| !s["last_error"].is_null()).collect();
    assert_eq!(failed.len(), 1, "the one session the dial went to: {sessions:?}");
    assert!(failed[0]["last_error"].as_str().is_some_and(|e| e.starts_with("refused: ")), "{failed:?}");
    let paged = doc(&admin, "limit=1&offset=2");
    assert_eq!(paged["clusters"][0]["name"], "shoot--project-0002");
    assert_eq!((paged["page"]["total"].as_u64(), paged["page"]["returned"].as_u64()), (Some(3), Some(1)));
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

struct Hooks(Admin);

impl AdminHooks for Hooks {
    fn ready(&self) -> Vec<Check> {
        Vec::new()
    }
    fn config(&self) -> serde_json::Value {
        serde_json::Value::Null
    }
    fn status(&self, query: &StatusQuery) -> Option<StatusPage> {
        Some(self.0.status(&BTreeMap::new(), query))
    }
}

/// Not a test: the measurement of the status of a seed with 1,000 shoots and 10,000 agent
/// sessions (what `/status` and `/` cost to make, and how large they are). Run it in a
/// release build:
///
/// `cargo test --release -p proxy-server --lib admin::status::tests::a_thousand_clusters -- --ignored --nocapture`
///
/// With `SEEDGATE_STATUS_SERVE=<seconds>` it then serves that replica's admin listener (the
/// address printed, and written to `SEEDGATE_STATUS_ADDR_FILE` if set) for a browser to load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, not a test: run it with --ignored --nocapture"]
async fn a_thousand_clusters_of_ten_sessions() {
    let built = Instant::now();
    let admin = fleet(1000, 10).await;
    eprintln!("filled 1000 clusters x 10 sessions in {:?}", built.elapsed());
    for q in ["", "limit=1000", "cluster=shoot--project-0500", "q=ip-10-250-7-"] {
        let query = StatusQuery::parse(Some(q));
        let (made, page) = median(21, || admin.status(&BTreeMap::new(), &query));
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
        admin.status(&BTreeMap::new(), &StatusQuery::parse(Some("cluster=shoot--project-0007"))).doc.to_tree();
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
        Arc::new(Hooks(admin)),
        token,
        CancellationToken::new(),
    );
    let stop = CancellationToken::new();
    let served = tokio::spawn(proxy_core::obs::admin::serve(listener, state, stop.clone()));
    tokio::time::sleep(Duration::from_secs(secs)).await;
    stop.cancel();
    let _ = served.await;
}
