//! migration: a shoot's control plane moved from seed A to seed B at production shape, under load.
//!
//! The world is the migration test's (`testbed::migration::HaWorld`), with more agents: seeds A
//! and B in network namespaces, each with sni-router (TCP SNI route to the replicas' h2 agents
//! ports, UDP route to their QUIC ports, an SNI route for the shoot's API, a PROXY-v2 route for
//! the node-local apiserver proxies) and three proxy-server replicas (`server_count: 3`); the
//! shoot's agents in a third namespace, half over h2 and half over QUIC; etcd (TLS) as the
//! shoot's API server, watched by `etcdctl watch` in the shoot through the seed's SNI route
//! while a writer puts one event every 100 ms.
//!
//! The planned move, as the runbook has it: A's routes handed off to B's gateway (PROXY v2,
//! `drain_deadline: 3s`), every A replica set to `draining` with a move notice to B (10 s), the
//! seed-side load and the shoot's DNS switched to B once every agent holds every replica of B,
//! A fenced once its streams ended. Throughout, in-cluster clients send requests through the
//! node-local proxies and seed-side clients send CONNECTs through the egress front ends (A's
//! replicas, then B's). Reported: failed requests, the time from the move notice until each
//! agent holds all of B's replicas and none of A's (p50 and max over agents, per transport),
//! and the watch (events lost or repeated, the longest time without an event).
//!
//! Needs root (namespaces) and etcd (`etcd-server`, `etcd-client`). No anchor plays this role:
//! the figures are seedgate's only, reported, never asserted.

use super::{Ctx, record};
use crate::report::{Better, Kind, MetricId, Results};
use crate::systems;
use anyhow::Context as _;
use std::time::{Duration, Instant};
use testbed::migration::{
    Bins, ConnectLoad, EtcdWatch, EtcdWriter, HaWorld, MoveReport, Net, PodLoad, TICK, Targets, Transport, WAIT,
    WatchReport, percentile,
};

pub(super) const SC: &str = "migration";
const LABEL: &str = "seed A → seed B, proxy-server ×3 each";
/// Its own address range (the migration tests use 10.92 to 10.94).
const NET: Net = Net(96);
const EVENT_EVERY: Duration = Duration::from_millis(100);

/// The rows of the scenario.
struct Rows {
    failed_pods: MetricId,
    failed_dials: MetricId,
    on_b: [(Transport, MetricId, MetricId); 2],
    fenced: MetricId,
    lost: MetricId,
    gap: MetricId,
}

impl Rows {
    fn new(res: &mut Results) -> Self {
        let mut on_b = |t: Transport| {
            let p50 =
                res.metric(SC, &format!("move notice → agent on B, {} agents: p50", t.name()), "ms", Better::Lower);
            let max =
                res.metric(SC, &format!("move notice → agent on B, {} agents: max", t.name()), "ms", Better::Lower);
            (t, p50, max)
        };
        let on_b = [on_b(Transport::H2), on_b(Transport::Quic)];
        Self {
            failed_pods: res.metric(SC, "failed in-cluster requests (node-local proxies)", "requests", Better::Lower),
            failed_dials: res.metric(SC, "failed seed-side CONNECTs (egress front ends)", "dials", Better::Lower),
            on_b,
            fenced: res.metric(SC, "move notice → A fenced (its streams ended, no agent left)", "ms", Better::Lower),
            lost: res.metric(SC, "watch: events lost, repeated or reordered", "events", Better::Lower),
            gap: res.metric(SC, "watch: longest time without an event (one every 100 ms)", "ms", Better::Lower),
        }
    }

    fn all(&self) -> Vec<MetricId> {
        let mut v = vec![self.failed_pods, self.failed_dials, self.fenced, self.lost, self.gap];
        v.extend(self.on_b.iter().flat_map(|&(_, a, b)| [a, b]));
        v
    }
}

/// One move's figures.
struct Run {
    pods: (u64, u64),
    dials: (u64, u64),
    /// The first errors of both loads.
    errors: Vec<String>,
    moved: MoveReport,
    watch: WatchReport,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

pub(super) async fn run(ctx: &Ctx, res: &mut Results) -> anyhow::Result<()> {
    let rows = Rows::new(res);
    let skip = |res: &mut Results, why: &str| {
        for m in rows.all() {
            res.skip(m, LABEL, Kind::Seedgate, why);
        }
    };
    if let Err(e) = systems::check_only(LABEL) {
        skip(res, &format!("{e:#}"));
        return Ok(());
    }
    if !testbed::netns::require_root() {
        skip(res, "needs root (network namespaces)");
        return Ok(());
    }
    let (h2, quic) = if ctx.smoke { (2, 2) } else { (20, 20) };
    let every = Duration::from_millis(if ctx.smoke { 50 } else { 20 });
    remarks(res, h2, quic, every);
    let profile = if ctx.debug { "debug" } else { "release" };
    let stand_in = testbed::proc::bin_path_in(profile, "stand-in")?;
    anyhow::ensure!(stand_in.exists(), "{} missing: cargo build --workspace --bins", stand_in.display());
    let bins = Bins {
        router: ctx.bins.router.clone(),
        server: ctx.bins.server.clone(),
        agent: ctx.bins.agent.clone(),
        stand_in,
        cpu: ctx.pin.proxy_cpu,
    };
    for k in 0..ctx.scale.repeats {
        let r = one_move(&bins, h2, quic, every).await;
        if let Ok(r) = &r {
            eprintln!("  migration {}/{}: {}", k + 1, ctx.scale.repeats, summary(r));
        }
        record_run(res, &rows, r);
    }
    Ok(())
}

fn remarks(res: &mut Results, h2: usize, quic: usize, every: Duration) {
    res.remark(
        SC,
        "seedgate only: no anchor plays this role (konnectivity is not installed), so `vs direct` and `seedgate ÷ this` stay \
         empty; figures are reported, never asserted",
    );
    res.remark(
        SC,
        &format!(
            "in network namespaces: seeds A and B, each sni-router + 3 proxy-server replicas (server_count 3); {h2} agents over \
             h2 and {quic} over QUIC (through the gateway's UDP listener) in the shoot, reconnect {{ initial: 100ms, max: 1s }}, \
             keepalive {{ interval: 500ms, suspect_after: 2s, timeout: 2s }}; in-cluster requests and seed-side CONNECTs each one every {} ms; \
             `etcdctl watch` through A's SNI route to etcd, one event every {} ms; the move: A's routes handed off to B \
             (PROXY v2, drain_deadline 3s), every A replica draining with move_to B (drain_deadline 10s), load and DNS switched to B once every \
             agent is there, A fenced once its streams ended; seedgate processes on the proxy CPU",
            every.as_millis(),
            EVENT_EVERY.as_millis()
        ),
    );
}

/// One world, one move.
async fn one_move(bins: &Bins, h2: usize, quic: usize, every: Duration) -> anyhow::Result<Run> {
    let w = HaWorld::start("bench-migration", NET, bins, h2, quic).await?;
    let started = Instant::now();
    let writer = EtcdWriter::start(w.etcd.clone(), EVENT_EVERY);
    let mut watch = EtcdWatch::start(&w.shoot, &w.etcd.ca_file)?;
    testbed::poll_until(WAIT, TICK, || async { (watch.received() >= 3).then_some(()) })
        .await
        .context("the watch through A saw no event")?;
    let pods = PodLoad::start(&w.ca, w.agents.pod_apis(), every)?;
    let targets = Targets::new(w.a.egresses());
    let dials = ConnectLoad::start(targets.clone(), every);
    testbed::poll_until(WAIT, TICK, || async { (pods.tally.ok() >= 3 && dials.tally.ok() >= 3).then_some(()) })
        .await
        .context("no request got through before the move")?;
    let moved = w.planned_move(&targets).await?;
    // A while on B (30 requests of each load), so that late failures are counted.
    let (p, d) = (pods.tally.ok(), dials.tally.ok());
    let after = || async { (pods.tally.ok() >= p + 30 && dials.tally.ok() >= d + 30).then_some(()) };
    testbed::poll_until(WAIT, TICK, after).await.context("the loads stalled after the move")?;
    let (pods, dials, last) = (pods.finish().await?, dials.finish().await?, writer.finish().await?);
    let watch = watch.report(started, last).await;
    let errors = pods.first_errors().into_iter().chain(dials.first_errors()).take(3).collect();
    Ok(Run { pods: (pods.ok(), pods.failed()), dials: (dials.ok(), dials.failed()), errors, moved, watch })
}

fn summary(r: &Run) -> String {
    format!(
        "in-cluster {} ok / {} failed, CONNECTs {} ok / {} failed, A fenced after {:.0} ms, watch {} events ({} missing, {} \
         repeated/reordered, longest gap {:.0} ms, client errors: {:?}); first failed requests: {:?}",
        r.pods.0,
        r.pods.1,
        r.dials.0,
        r.dials.1,
        ms(r.moved.fenced),
        r.watch.events,
        r.watch.missing.len(),
        r.watch.duplicates_or_reordered,
        ms(r.watch.max_gap),
        r.watch.stderr.trim(),
        r.errors
    )
}

fn record_run(res: &mut Results, rows: &Rows, r: anyhow::Result<Run>) {
    let r = match r {
        Ok(r) => r,
        Err(e) => {
            let text = format!("{e:#}");
            for m in rows.all() {
                record(res, m, LABEL, Kind::Seedgate, Err(anyhow::anyhow!("{text}")));
            }
            return;
        }
    };
    record(res, rows.failed_pods, LABEL, Kind::Seedgate, Ok(r.pods.1 as f64));
    record(res, rows.failed_dials, LABEL, Kind::Seedgate, Ok(r.dials.1 as f64));
    for &(t, p50, max) in &rows.on_b {
        let times: Vec<&Result<Duration, String>> =
            r.moved.on_b.iter().filter(|(tt, _)| *tt == t).map(|(_, d)| d).collect();
        let stuck: Vec<&String> = times.iter().filter_map(|d| d.as_ref().err()).collect();
        let v: Vec<f64> = times.iter().filter_map(|d| d.as_ref().ok()).map(|d| ms(*d)).collect();
        let fig = |p: f64| match stuck.first() {
            Some(last) => Err(anyhow::anyhow!(
                "{} of {} {} agents not on B within {WAIT:?} (one says: {last})",
                stuck.len(),
                times.len(),
                t.name()
            )),
            None => Ok(percentile(&v, p)),
        };
        record(res, p50, LABEL, Kind::Seedgate, fig(50.0));
        record(res, max, LABEL, Kind::Seedgate, fig(100.0));
    }
    record(res, rows.fenced, LABEL, Kind::Seedgate, Ok(ms(r.moved.fenced)));
    let w = &r.watch;
    let bad = (w.missing.len() + w.duplicates_or_reordered) as f64;
    let watch_ok = if w.still_running && w.stderr.trim().is_empty() {
        Ok(())
    } else {
        Err(anyhow::anyhow!("etcdctl ended or reported an error: {}", w.stderr.trim()))
    };
    record(
        res,
        rows.lost,
        LABEL,
        Kind::Seedgate,
        watch_ok.as_ref().map(|()| bad).map_err(|e| anyhow::anyhow!("{e:#}")),
    );
    record(res, rows.gap, LABEL, Kind::Seedgate, watch_ok.map(|()| ms(w.max_gap)));
}
