//! Faults on the seed–shoot path, on the emulated link (proxy-server in the seed namespace, proxy-agent in the shoot's): a short black hole and one direction gone silent, with a stream open and dials made throughout — the stream carries bytes again after it, every dial is served or refused with a reason, none left without an answer — and a middlebox that accepts sessions and cuts them at once, which the agent does not redial in a storm. Over h2 and QUIC (the storm: h2, the machine test covers both).
//!
//! Outcomes only: how long each fault took to notice and to heal is the bench's to measure.

use anyhow::Context as _;
use std::net::SocketAddr;
use std::time::Duration;
use testbed::link::{Dir, LinkOpts, Shape, Wan};
use testbed::netns::require_root;
use testbed::tunnel_kit::{
    AgentOpts, BoxStream, Dialer, Fe, FeKind, STEP, TunnelPki, agent_yaml, connect, inproc_server, metrics, refusal_of,
    server_yaml, start_agent, wait_agents,
};
use testbed::{Proc, TcpEcho, TempDir, metric_sum, metric_value, poll_until};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

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

fn patient(yaml: &str) -> String {
    yaml.replace("keepalive: { interval: 500ms, suspect_after: 2s, timeout: 2s }", KEEPALIVE)
}

/// What came of one dial made during a fault.
#[derive(Debug)]
enum Outcome {
    Served,
    /// Refused: the status and the reason the front end gave.
    Refused(u16, String),
    /// Neither within [`CLIENT_WAIT`].
    NoAnswer,
    /// The connection to the front end failed otherwise (why, for the failure message).
    Failed(#[allow(dead_code)] String),
}

/// One echo round trip through the front end: served, refused (with its reason), or nothing.
async fn dial(d: Dialer, target: SocketAddr) -> Outcome {
    let attempt = async {
        let mut s = connect(&d, &target.to_string()).await?;
        roundtrip(&mut s, b"during").await
    };
    match tokio::time::timeout(CLIENT_WAIT, attempt).await {
        Err(_) => Outcome::NoAnswer,
        Ok(Ok(())) => Outcome::Served,
        Ok(Err(e)) => match refusal_of(&e) {
            Some(r) => Outcome::Refused(r.status, r.body.clone()),
            None => Outcome::Failed(format!("{e:#}")),
        },
    }
}

async fn roundtrip(s: &mut BoxStream, msg: &[u8]) -> anyhow::Result<()> {
    s.write_all(msg).await?;
    let mut back = vec![0u8; msg.len()];
    s.read_exact(&mut back).await?;
    anyhow::ensure!(back == msg, "echo mismatch");
    Ok(())
}

/// A counter of proxy-server for the cluster.
fn server_count(m: &str, name: &str) -> f64 {
    metric_value(m, name, &[("cluster", "shoot-a")]).unwrap_or(0.0)
}

/// The agent's metrics (its admin listens on the shoot namespace's loopback).
async fn agent_metrics(wan: &Wan, admin: SocketAddr) -> anyhow::Result<String> {
    let _in_shoot = wan.shoot().enter()?;
    metrics(admin).await
}

/// The path goes down (`dirs`) for [`OUTAGE`] with a stream open and dials made throughout;
/// then it comes back.
async fn outage(label: &str, net: u8, quic: bool, dirs: &[Dir]) -> anyhow::Result<()> {
    if !require_root() {
        return Ok(());
    }
    let rtt_half = Duration::from_millis(25);
    let wan = Wan::new(label, net, Shape { delay: rtt_half, ..Shape::CLEAR }, LinkOpts::default())?;
    let link = wan.link();
    // Every socket of this thread (and the in-process server's threads) lives in the seed
    // namespace from here on.
    let _in_seed = wan.seed().enter()?;
    let echo = {
        let _in_shoot = wan.shoot().enter()?;
        TcpEcho::start_on(SocketAddr::from((link.shoot_ip(), 0))).await?
    };
    let dir = TempDir::new(label)?;
    let pki = TunnelPki::new(dir.path())?;
    let fe = Fe::new("egress", "shoot-a", FeKind::Plain);
    let listen = format!("{}:0", link.seed_ip());
    let mut yaml = patient(&server_yaml(&pki, &listen, &[fe], ""));
    if quic {
        yaml = yaml.replacen("agents:\n", &format!("agents:\n  quic: {{ listen: {listen} }}\n"), 1);
    }
    let (server, saddrs) = inproc_server(&dir, &yaml).await?;
    let admin = saddrs.admin()?;
    let agents = saddrs.listener(if quic { "agents-quic" } else { "agents" })?;
    let mut o = AgentOpts::new("shoot-a", agents, &[&format!("{}/32", link.shoot_ip())]);
    if quic {
        o.tunnel_extra = "  transport: quic\n".into();
    }
    let (agent, aaddrs): (Proc, _) =
        start_agent(&dir, "agent", &patient(&agent_yaml(&pki, &o)?), Some(wan.shoot())).await?;
    let logs = || format!("--- server:\n{}\n--- agent:\n{}", server.log(), agent.log());
    wait_agents(admin, "shoot-a", 1.0).await.with_context(logs)?;
    let d = Dialer::Tcp(saddrs.listener("egress")?);
    let mut open = connect(&d, &echo.addr().to_string()).await.with_context(logs)?;
    roundtrip(&mut open, b"before").await.with_context(logs)?;

    link.black_hole(dirs, true);
    let mut dials = Vec::new();
    for _ in 0..DIALS {
        dials.push(tokio::spawn(dial(d.clone(), echo.addr())));
        tokio::time::sleep(DIAL_EVERY).await;
    }
    tokio::time::sleep(OUTAGE.saturating_sub(DIAL_EVERY * DIALS)).await;
    link.black_hole(dirs, false);

    // The stream open across the outage carries bytes again.
    tokio::time::timeout(RESUME, roundtrip(&mut open, b"after the outage"))
        .await
        .context("the open stream carries nothing after the outage")
        .with_context(logs)?
        .context("the open stream failed across the outage")
        .with_context(logs)?;
    let mut outcomes = Vec::new();
    for t in dials {
        outcomes.push(t.await?);
    }
    // Every dial made during the outage was answered: served (by a session that got through),
    // or refused at once with the reason; none was left hanging.
    for o in &outcomes {
        match o {
            Outcome::Served => {}
            Outcome::Refused(503, why) if why.contains("suspect") => {}
            other => anyhow::bail!("a dial during the outage: {other:?}; all: {outcomes:?}\n{}", logs()),
        }
    }
    assert!(
        outcomes.iter().any(|o| matches!(o, Outcome::Refused(..))),
        "the only path was down, yet no dial was refused: {outcomes:?}"
    );
    // New dials are served again.
    poll_until(STEP, Duration::from_millis(100), || async {
        let mut s = connect(&d, &echo.addr().to_string()).await?;
        roundtrip(&mut s, b"healed").await
    })
    .await
    .context("no dial served after the outage")
    .with_context(logs)?;

    let m = metrics(admin).await?;
    assert!(server_count(&m, "seedgate_agent_sessions_suspect_total") >= 1.0, "{m}");
    assert!(server_count(&m, "seedgate_tunnel_streams_survived_outage_total") >= 1.0, "{m}\n{}", logs());
    let am = agent_metrics(&wan, aaddrs.admin()?).await?;
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
