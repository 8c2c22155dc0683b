//! Faults on the seed–shoot path, on the emulated link (proxy-server in the seed namespace, proxy-agent in the shoot's): a short black hole, one direction gone silent and a flapping link, with a stream open and dials made throughout — the stream carries bytes again after it, every dial is served or refused with a reason, none left without an answer; two replicas reached over two paths, one path black-holed, where every dial is served; and a middlebox that accepts sessions and cuts them at once, which the agent does not redial in a storm. Over h2 and QUIC (the storm: h2, the machine test covers both).
//!
//! Outcomes only: how long each fault took to notice and to heal is the bench's to measure.

use anyhow::Context as _;
use std::net::SocketAddr;
use std::time::Duration;
use testbed::faults::{Outcome, Rig, RigOpts, dial, roundtrip};
use testbed::link::{Dir, LinkOpts, Shape, Wan};
use testbed::netns::require_root;
use testbed::tunnel_kit::{
    AgentOpts, Fe, FeKind, STEP, TunnelPki, agent_yaml, inproc_server, metrics, server_yaml, start_agent,
};
use testbed::{TempDir, metric_sum, metric_value, poll_until};

/// Both ends: PING every 500ms, suspect after 1.5s unanswered, dead only after 30s.
const KEEPALIVE: &str = "keepalive: { interval: 500ms, suspect_after: 1500ms, timeout: 30s }";
/// How long the path stays down: well past the suspect time, well within the keepalive timeout.
const OUTAGE: Duration = Duration::from_secs(5);
/// Dials made while the path is down, one every [`DIAL_EVERY`].
const DIALS: u32 = 10;
const DIAL_EVERY: Duration = Duration::from_millis(500);
/// The client's own patience with a dial (below the server's 10s dial timeout): a dial not
/// answered by then was left hanging.
const CLIENT_WAIT: Duration = Duration::from_secs(8);
/// The most an open stream may take to carry bytes again once the path is back (TCP and QUIC
/// retransmit on their own back-off).
const RESUME: Duration = Duration::from_secs(30);

fn opts(quic: bool) -> RigOpts {
    RigOpts { quic, keepalive: Some(KEEPALIVE.into()), agent_bin: None }
}

/// A link of 25 ms each way between fresh namespaces (`paths` of them).
fn wan(label: &str, net: u8, paths: u8) -> anyhow::Result<Wan> {
    let shape = Shape { delay: Duration::from_millis(25), ..Shape::CLEAR };
    let mut wan = Wan::new(label, net, shape, LinkOpts::default())?;
    for p in 1..paths {
        wan.add_path(net + 100 + p, shape, LinkOpts::default())?;
    }
    Ok(wan)
}

/// The open stream carries bytes again once the path is back.
async fn resumes(rig: &Rig, open: &mut testbed::tunnel_kit::BoxStream) -> anyhow::Result<()> {
    tokio::time::timeout(RESUME, roundtrip(open, b"after the outage"))
        .await
        .context("the open stream carries nothing after the outage")
        .with_context(|| rig.logs())?
        .context("the open stream failed across the outage")
        .with_context(|| rig.logs())
}

/// Served, or refused at once with `503` and a reason: the suspect session, or (when the agent's
/// make-before-break replacement took over and its GOAWAY crossed the dial before the seed had
/// the replacement's session) the old session draining.
fn answered(o: &Outcome) -> bool {
    matches!(o, Outcome::Served)
        || matches!(o, Outcome::Refused(503, why) if why.contains("suspect") || why.contains("draining"))
}

/// The outcomes of the dials made `during` a fault, once each open stream carried bytes again;
/// every one of them must have been [`answered`].
async fn settle(
    rig: &Rig,
    during: &str,
    open: &mut [testbed::tunnel_kit::BoxStream],
    dials: Vec<tokio::task::JoinHandle<testbed::faults::Dialled>>,
) -> anyhow::Result<Vec<Outcome>> {
    for s in open {
        resumes(rig, s).await?;
    }
    let mut done = Vec::new();
    for t in dials {
        done.push(t.await?);
    }
    if let Some(bad) = done.iter().find(|d| !answered(&d.outcome)) {
        // Each dial with its times: a dial answered `200` whose echo then waited differs from
        // one never answered.
        let all: Vec<String> =
            done.iter().map(|d| format!("{:?} after {:?} (200 after {:?})", d.outcome, d.took, d.answered)).collect();
        anyhow::bail!("a dial {during}: {:?}; all, in order:\n{}\n{}", bad.outcome, all.join("\n"), rig.logs());
    }
    Ok(done.into_iter().map(|d| d.outcome).collect())
}

/// The path goes down (`dirs`) for [`OUTAGE`] with a stream open and dials made throughout;
/// then it comes back.
async fn outage(label: &str, net: u8, quic: bool, dirs: &[Dir]) -> anyhow::Result<()> {
    if !require_root() {
        return Ok(());
    }
    let wan = wan(label, net, 1)?;
    let link = wan.link();
    // Every socket of this thread (and the in-process server's threads) lives in the seed
    // namespace from here on.
    let _in_seed = wan.seed().enter()?;
    let rig = Rig::one(&wan, label, &opts(quic)).await?;
    let mut open = rig.open_stream(0).await.with_context(|| rig.logs())?;

    link.black_hole(dirs, true);
    let mut dials = Vec::new();
    for _ in 0..DIALS {
        dials.push(tokio::spawn(dial(rig.fronts[0].clone(), rig.echo.addr(), CLIENT_WAIT)));
        tokio::time::sleep(DIAL_EVERY).await;
    }
    tokio::time::sleep(OUTAGE.saturating_sub(DIAL_EVERY * DIALS)).await;
    link.black_hole(dirs, false);

    // Every dial made during the outage was answered: served (by a session that got through),
    // or refused at once with the reason; none was left hanging.
    let outcomes = settle(&rig, "during the outage", std::slice::from_mut(&mut open), dials).await?;
    assert!(
        outcomes.iter().any(|o| matches!(o, Outcome::Refused(..))),
        "the only path was down, yet no dial was refused: {outcomes:?}"
    );
    // New dials are served again.
    rig.until_served(0, STEP).await.context("no dial served after the outage").with_context(|| rig.logs())?;

    assert!(rig.server_sum("seedgate_agent_sessions_suspect_total") >= 1.0, "{}", rig.logs());
    assert!(rig.server_sum("seedgate_tunnel_streams_survived_outage_total") >= 1.0, "{}", rig.logs());
    let am = rig.agent_metrics(&wan).await?;
    let suspect = metric_sum(&am, "seedgate_tunnel_sessions_suspect_total", &[]);
    assert!(suspect >= 1.0, "the agent saw no suspect session: {am}");
    drop(open);
    Ok(())
}

#[tokio::test]
async fn an_open_stream_rides_out_a_black_hole_and_dials_meanwhile_are_answered_h2() -> anyhow::Result<()> {
    outage("faults-hole-h2", 41, false, Dir::BOTH).await
}

#[tokio::test]
async fn an_open_stream_rides_out_a_black_hole_and_dials_meanwhile_are_answered_quic() -> anyhow::Result<()> {
    outage("faults-hole-quic", 42, true, Dir::BOTH).await
}

/// Only what the seed sends is lost: both ends' keepalives go unanswered all the same.
#[tokio::test]
async fn an_open_stream_rides_out_one_direction_going_silent_h2() -> anyhow::Result<()> {
    outage("faults-oneway-h2", 43, false, &[Dir::ToShoot]).await
}

#[tokio::test]
async fn an_open_stream_rides_out_one_direction_going_silent_quic() -> anyhow::Result<()> {
    outage("faults-oneway-quic", 44, true, &[Dir::ToShoot]).await
}

/// Time the link flaps: down for [`FLAP`], up for [`FLAP`], over and over.
const FLAPPING: Duration = Duration::from_secs(8);
const FLAP: Duration = Duration::from_secs(1);
/// A dial is made every this long throughout.
const FLAP_DIAL_EVERY: Duration = Duration::from_millis(250);

/// The link goes down for a second and up for a second, again and again, with a stream open
/// and a dial every 250 ms: the stream carries bytes afterwards, and every dial is answered
/// (served, or refused with the reason), none left past the client's wait.
async fn flapping(label: &str, net: u8, quic: bool) -> anyhow::Result<()> {
    if !require_root() {
        return Ok(());
    }
    let wan = wan(label, net, 1)?;
    let link = wan.link();
    let _in_seed = wan.seed().enter()?;
    let rig = Rig::one(&wan, label, &opts(quic)).await?;
    let mut open = rig.open_stream(0).await.with_context(|| rig.logs())?;

    let mut dials = Vec::new();
    let ticks = (FLAPPING.as_millis() / FLAP_DIAL_EVERY.as_millis()) as u32;
    let per_flap = (FLAP.as_millis() / FLAP_DIAL_EVERY.as_millis()) as u32;
    for tick in 0..ticks {
        if tick % per_flap == 0 {
            // Down for the first flap, up for the next, and so on.
            link.black_hole(Dir::BOTH, (tick / per_flap).is_multiple_of(2));
        }
        dials.push(tokio::spawn(dial(rig.fronts[0].clone(), rig.echo.addr(), CLIENT_WAIT)));
        tokio::time::sleep(FLAP_DIAL_EVERY).await;
    }
    link.black_hole(Dir::BOTH, false);

    let outcomes = settle(&rig, "while the link flapped", std::slice::from_mut(&mut open), dials).await?;
    let served = outcomes.iter().filter(|o| **o == Outcome::Served).count();
    eprintln!("{label}: {} dials while the link flapped, {served} served", outcomes.len());
    assert!(served > 0, "the link was up half the time, yet no dial was served: {outcomes:?}\n{}", rig.logs());
    rig.until_served(0, STEP).await.context("no dial served after the flapping").with_context(|| rig.logs())?;
    Ok(())
}

#[tokio::test]
async fn a_flapping_link_loses_no_open_stream_and_leaves_no_dial_unanswered_h2() -> anyhow::Result<()> {
    flapping("faults-flap-h2", 45, false).await
}

#[tokio::test]
async fn a_flapping_link_loses_no_open_stream_and_leaves_no_dial_unanswered_quic() -> anyhow::Result<()> {
    flapping("faults-flap-quic", 46, true).await
}

/// Dials through the two replicas' front ends, alternating, one every this long.
const HA_DIAL_EVERY: Duration = Duration::from_millis(250);
/// From this long into the black hole, every path-2 session is suspect (1.5 s) and every dial
/// must be served over path 1.
const HA_GRACE: Duration = Duration::from_secs(3);

/// Two replicas behind a gateway reachable over two paths; the agent lists the gateway once per
/// path, so each replica holds a session of the cluster over each. Path 2 goes black for
/// [`OUTAGE`]: every dial made after the first 3 s is served over path 1, and a dial sent on a
/// path-2 session before it turned suspect is served late by the path-1 session rather than
/// refused. The streams open across path 2 carry bytes again after it.
async fn two_paths(label: &str, net: u8, quic: bool) -> anyhow::Result<()> {
    if !require_root() {
        return Ok(());
    }
    let wan = wan(label, net, 2)?;
    let path2 = wan.path(1).context("second path")?;
    let _in_seed = wan.seed().enter()?;
    let rig = Rig::two_replicas(&wan, label, &opts(quic)).await?;
    // Streams through both replicas: some of them on path-2 sessions.
    let mut open = Vec::new();
    for i in 0..4 {
        open.push(rig.open_stream(i % 2).await.with_context(|| rig.logs())?);
    }

    path2.black_hole(Dir::BOTH, true);
    let started = tokio::time::Instant::now();
    let (mut dials, mut made) = (Vec::new(), Vec::new());
    let n = (OUTAGE.as_millis() / HA_DIAL_EVERY.as_millis()) as usize;
    for i in 0..n {
        made.push(started.elapsed());
        dials.push(tokio::spawn(dial(rig.fronts[i % 2].clone(), rig.echo.addr(), CLIENT_WAIT)));
        tokio::time::sleep(HA_DIAL_EVERY).await;
    }
    tokio::time::sleep(OUTAGE.saturating_sub(started.elapsed())).await;
    path2.black_hole(Dir::BOTH, false);

    // Every dial is answered; those of the first seconds served or refused with the reason.
    let outcomes = settle(&rig, "while path 2 was black", &mut open, dials).await?;
    let (early, late): (Vec<_>, Vec<_>) = made.iter().zip(outcomes).partition(|(at, _)| **at < HA_GRACE);
    let (early, late): (Vec<Outcome>, Vec<Outcome>) =
        (early.into_iter().map(|(_, o)| o).collect(), late.into_iter().map(|(_, o)| o).collect());
    let lost = |v: &[Outcome]| v.iter().filter(|o| **o != Outcome::Served).count();
    let moved = |reason: &str| rig.server_sum_by("seedgate_tunnel_dial_retries_total", &[("reason", reason)]) as u64;
    eprintln!(
        "{label}: dials in the first {HA_GRACE:?} of the black hole: {} of {} not served; after: {} of {} not served; \
         moved to another session: {} when theirs turned suspect, {} silent",
        lost(&early),
        early.len(),
        lost(&late),
        late.len(),
        moved("suspect"),
        moved("silent"),
    );
    assert!(!late.is_empty(), "no dial after the first {HA_GRACE:?}");
    assert_eq!(lost(&late), 0, "dials after the first {HA_GRACE:?} failed: {late:?}\n{}", rig.logs());
    assert!(rig.server_sum("seedgate_agent_sessions_suspect_total") >= 1.0, "{}", rig.logs());
    assert!(
        rig.server_sum("seedgate_tunnel_dials_around_suspect_total") >= 1.0,
        "no dial went around a suspect session\n{}",
        rig.logs()
    );
    Ok(())
}

#[tokio::test]
async fn two_replicas_over_two_paths_serve_every_dial_while_one_path_is_black_h2() -> anyhow::Result<()> {
    two_paths("faults-2path-h2", 47, false).await
}

#[tokio::test]
async fn two_replicas_over_two_paths_serve_every_dial_while_one_path_is_black_quic() -> anyhow::Result<()> {
    two_paths("faults-2path-quic", 48, true).await
}

/// A relay (a middlebox) that passes each connection to `to` and cuts it `after` it opened.
async fn cutting_relay(to: SocketAddr, after: Duration) -> anyhow::Result<SocketAddr> {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = l.local_addr()?;
    tokio::spawn(async move {
        // Ends with the test's runtime.
        while let Ok((mut a, _)) = l.accept().await {
            tokio::spawn(async move {
                let Ok(mut b) = tokio::net::TcpStream::connect(to).await else { return };
                let _ = tokio::time::timeout(after, tokio::io::copy_bidirectional(&mut a, &mut b)).await;
            });
        }
    });
    Ok(addr)
}

/// A middlebox accepts each session and cuts it at once: the session comes up, then ends. The
/// agent does not redial every `reconnect.initial` (a storm): the back-off grows, and each such
/// session is counted as a storm avoided.
#[tokio::test]
async fn sessions_cut_at_once_are_not_redialled_in_a_storm() -> anyhow::Result<()> {
    let dir = TempDir::new("faults-storm")?;
    let pki = TunnelPki::new(dir.path())?;
    let fe = Fe::new("egress", "shoot-a", FeKind::Plain);
    let (server, saddrs) = inproc_server(&dir, &server_yaml(&pki, "127.0.0.1:0", &[fe], "")).await?;
    let admin = saddrs.admin()?;
    let relay = cutting_relay(saddrs.listener("agents")?, Duration::from_millis(300)).await?;
    let o = AgentOpts::new("shoot-a", relay, &["127.0.0.1/32"]);
    // A session must live 5s to reset the back-off (or carry a stream).
    let yaml = agent_yaml(&pki, &o)?
        .replace("reconnect: { initial: 100ms, max: 1s }", "reconnect: { initial: 100ms, max: 5s }");
    let (agent, aaddrs) = start_agent(&dir, "agent", &yaml, None).await?;
    let logs = || format!("--- server:\n{}\n--- agent:\n{}", server.log(), agent.log());
    let accepted = || async {
        let m = metrics(admin).await?;
        anyhow::Ok(
            metric_value(&m, "seedgate_agent_sessions_total", &[("cluster", "shoot-a"), ("result", "accepted")])
                .unwrap_or(0.0),
        )
    };
    // The first session comes up (and is cut): the window starts there.
    poll_until(STEP, Duration::from_millis(20), || async {
        anyhow::ensure!(accepted().await? >= 1.0, "no session yet");
        Ok(())
    })
    .await
    .with_context(logs)?;
    let first = accepted().await?;
    tokio::time::sleep(Duration::from_secs(8)).await;
    let in_window = accepted().await? - first;
    // Redialled every 100-200ms after each 300ms session, 8s would hold some 20 sessions; a
    // back-off doubling from 100ms to 5s (each wait at least half its step) holds at most 7.
    assert!(in_window <= 9.0, "{in_window} sessions in 8s: a reconnect storm\n{}", logs());
    assert!(in_window >= 2.0, "the agent stopped dialing: {in_window}\n{}", logs());
    let am = metrics(aaddrs.admin()?).await?;
    let avoided = metric_sum(&am, "seedgate_tunnel_reconnect_storms_avoided_total", &[]);
    assert!(avoided >= in_window, "storms avoided {avoided}, sessions cut {in_window}\n{am}");
    Ok(())
}
