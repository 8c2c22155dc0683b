//! Control-plane migration at production shape (root): seeds A and B each with sni-router and
//! three proxy-server replicas, agents over h2 and over QUIC (through the gateway's UDP listener),
//! a real `etcdctl watch` through A's SNI route, and the planned move A → B under steady load.
//!
//! The world is `testbed::migration::HaWorld` (the bench's `migration` scenario runs the same one
//! with more agents). etcd stands in for the shoot's kube-apiserver because its watch is a real
//! long-lived gRPC stream with a client that resumes from the last revision it saw: whether an
//! event is lost or the client reports an error is the client's own verdict, not a stand-in's.

use anyhow::Context as _;
use std::time::{Duration, Instant};
use testbed::migration::{
    Bins, ConnectLoad, EtcdWatch, EtcdWriter, HaWorld, LoadTally, MoveReport, Net, PodLoad, TICK, Targets, Transport,
    WAIT, WatchReport, admin_metric, connect_echo,
};
use testbed::netns::require_root;
use testbed::poll_until;

/// How often the writer puts an event, and the loads send a request.
const EVENT_EVERY: Duration = Duration::from_millis(100);
const REQUEST_EVERY: Duration = Duration::from_millis(50);

fn slowest(on_b: &[(Transport, Result<Duration, String>)], t: Transport) -> Option<Duration> {
    on_b.iter().filter(|(tt, _)| *tt == t).map(|(_, d)| *d.as_ref().unwrap_or(&Duration::MAX)).max()
}

#[tokio::test]
async fn planned_move_with_replicas_quic_agents_and_a_live_etcd_watch() -> anyhow::Result<()> {
    if !require_root() {
        return Ok(());
    }
    let w = HaWorld::start("migration-ha", Net(94), &Bins::current()?, 2, 2).await?;
    let started = Instant::now();
    let writer = EtcdWriter::start(w.etcd.clone(), EVENT_EVERY);
    let mut watch = EtcdWatch::start(&w.shoot, &w.etcd.ca_file)?;
    poll_until(WAIT, TICK, || async { (watch.received() >= 3).then_some(()) })
        .await
        .with_context(|| format!("the watch through A saw no event; etcd log:\n{}", w.etcd.log()))?;
    let pods = PodLoad::start(&w.ca, w.agents.pod_apis(), REQUEST_EVERY)?;
    let targets = Targets::new(w.a.egresses());
    let dials = ConnectLoad::start(targets.clone(), REQUEST_EVERY);
    poll_until(WAIT, TICK, || async { (pods.tally.ok() >= 5 && dials.tally.ok() >= 5).then_some(()) }).await?;

    let moved = w.planned_move(&targets).await.with_context(|| w.logs())?;
    // The watch's connection through A ends at the hand-off's drain deadline (a clean close).
    let drained = || async {
        let closes = admin_metric(
            w.a.router_admin(),
            "seedgate_connection_closes_total",
            &[("listener", "api"), ("reason", "route_drained")],
        );
        closes.await.unwrap_or(-1.0)
    };
    poll_until(WAIT, TICK, || async { (drained().await >= 1.0).then_some(()) })
        .await
        .context("the watch's connection through A was not ended by the hand-off's drain deadline")?;

    // Traffic and events keep flowing through B.
    let (p, d, e) = (pods.tally.ok(), dials.tally.ok(), watch.received());
    poll_until(WAIT, TICK, || async {
        (pods.tally.ok() >= p + 10 && dials.tally.ok() >= d + 10 && watch.received() >= e + 10).then_some(())
    })
    .await
    .with_context(|| w.logs())?;
    let (pods, dials, last) = (pods.finish().await?, dials.finish().await?, writer.finish().await?);
    let report = watch.report(started, last).await;
    let refusal = connect_echo(w.a.egress(0)).await?.err().context("a fenced replica of A must refuse the dial")?;
    let drained = drained().await;
    let b_api =
        admin_metric(w.b.router_admin(), "seedgate_connections_total", &[("listener", "api"), ("result", "ok")])
            .await
            .unwrap_or(-1.0);

    println!(
        "migration (3+3 replicas, 2 h2 + 2 QUIC agents): {}; A's api connections closed at the hand-off deadline \
         {drained}, B's api connections {b_api}",
        summary(&moved, &pods, &dials, &report)
    );
    assert!(moved.on_b.iter().all(|(_, d)| d.is_ok()), "an agent stayed off B: {:?}\n{}", moved.on_b, w.logs());
    assert_eq!(pods.failed(), 0, "failed in-cluster requests: {:?}", pods.first_errors());
    assert_eq!(dials.failed(), 0, "failed seed-side dials: {:?}", dials.first_errors());
    let (by, dialled) = (pods.by(), dials.by());
    assert!(by.contains_key("apiserver-a") && by.contains_key("apiserver-b"), "both control planes answered: {by:?}");
    assert!(dialled.keys().any(|k| k.starts_with("a-")) && dialled.keys().any(|k| k.starts_with("b-")), "{dialled:?}");
    assert!(refusal.starts_with("HTTP/1.1 503") && refusal.contains("cluster moved"), "{refusal}");
    assert_watch(&report, drained, b_api);
    Ok(())
}

fn summary(moved: &MoveReport, pods: &LoadTally, dials: &LoadTally, report: &WatchReport) -> String {
    format!(
        "every agent on B after {:?} (h2) / {:?} (QUIC) [{:?}]; A fenced {:?} after the notice; in-cluster ok={} \
         failed={} by {:?}; seed-side dials ok={} failed={} by {:?}; watch: {} events {}..={}, missing {:?}, \
         duplicated/reordered {}, longest gap {:?} (ending {:?} into the run), running {}, stderr {:?}",
        slowest(&moved.on_b, Transport::H2),
        slowest(&moved.on_b, Transport::Quic),
        moved.on_b,
        moved.fenced,
        pods.ok(),
        pods.failed(),
        pods.by(),
        dials.ok(),
        dials.failed(),
        dials.by(),
        report.events,
        report.first,
        report.last,
        report.missing,
        report.duplicates_or_reordered,
        report.max_gap,
        report.max_gap_end,
        report.still_running,
        report.stderr,
    )
}

/// The watch: its connection through A ended at the hand-off's drain deadline (a clean close),
/// etcdctl re-established it through B's gateway and resumed: every event once, in order, and no
/// error from the client.
fn assert_watch(report: &WatchReport, drained: f64, b_api: f64) {
    assert!(drained >= 1.0, "the watch's connection through A was not ended by the hand-off ({drained})");
    assert!(b_api >= 1.0, "the watch was not re-established through B's gateway ({b_api})");
    assert!(report.missing.is_empty(), "events lost: {:?}", report.missing);
    assert_eq!(report.duplicates_or_reordered, 0, "events duplicated or out of order");
    assert!(report.still_running && report.stderr.trim().is_empty(), "etcdctl failed: {:?}", report.stderr);
}
