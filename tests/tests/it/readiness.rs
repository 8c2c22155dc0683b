//! proxy-server's readiness is the replica's own: listening, not draining, and after a start a
//! bounded wait for its clusters' agents (`agents.settle_time`). A cluster without agents never
//! makes the replica unready: it fails its own dials, shows in `/readyz?verbose` as information and
//! in `seedgate_agents_connected` / `seedgate_cluster_agents_expected`, while every other
//! cluster's dials are served.

use anyhow::Context as _;
use std::time::Duration;
use testbed::tunnel_kit::{
    AgentOpts, Dialer, FRONTEND_NAME, Fe, FeKind, STEP, TunnelPki, agent_yaml, connect, inproc_agent, inproc_server,
    metrics, refusal_of, server_yaml, wait_agents,
};
use testbed::{TcpEcho, TempDir, http_get, metric_value, poll_until, wait_ready};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const TICK: Duration = Duration::from_millis(20);
const KEEPALIVE: &str = "  keepalive: { interval: 500ms, suspect_after: 2s, timeout: 2s }\n";

/// `yaml` (from [`server_yaml`]) with `agents.settle_time: settle`.
fn settle(yaml: &str, settle: &str) -> String {
    yaml.replacen(KEEPALIVE, &format!("{KEEPALIVE}  settle_time: {settle}\n"), 1)
}

async fn verbose(admin: std::net::SocketAddr) -> anyhow::Result<(u16, String)> {
    http_get(admin, "/readyz?verbose").await
}

/// One CONNECT through `fe` to the echo backend, bytes echoed back.
async fn echo_through(fe: &Dialer, echo: &TcpEcho, what: &[u8]) -> anyhow::Result<()> {
    let mut s = connect(fe, &echo.addr().to_string()).await?;
    echo_on(&mut s, what).await
}

async fn echo_on(s: &mut testbed::tunnel_kit::BoxStream, what: &[u8]) -> anyhow::Result<()> {
    s.write_all(what).await?;
    let mut back = vec![0u8; what.len()];
    tokio::time::timeout(STEP, s.read_exact(&mut back)).await.context("no echo in time")??;
    anyhow::ensure!(back == what, "echo mismatch");
    Ok(())
}

/// The status a CONNECT through `fe` is refused with.
async fn refused_with(fe: &Dialer, echo: &TcpEcho) -> anyhow::Result<(u16, String)> {
    match connect(fe, &echo.addr().to_string()).await {
        Ok(_) => anyhow::bail!("CONNECT through {fe:?} succeeded"),
        Err(e) => {
            let r = refusal_of(&e).with_context(|| format!("not a refusal: {e:#}"))?;
            Ok((r.status, r.body.clone()))
        }
    }
}

fn gauge(m: &str, name: &str, cluster: &str) -> Option<f64> {
    metric_value(m, name, &[("cluster", cluster)])
}

/// A replica that started waits for the agents of the clusters it knows, turns ready once each
/// has one, and stays ready when a cluster's last agent goes: that cluster's dials answer 503,
/// the other's are served.
#[tokio::test]
async fn a_replica_waits_for_its_clusters_agents_then_stays_ready_without_them() -> anyhow::Result<()> {
    let dir = TempDir::new("ready-arrive")?;
    let pki = TunnelPki::new(dir.path())?;
    let fes = [Fe::new("a-egress", "shoot-a", FeKind::Plain), Fe::new("b-egress", "shoot-b", FeKind::Plain)];
    let clusters = "clusters:\n  shoot-a: { state: active }\n  shoot-b: { state: active }\n";
    // Only the agents' arrival can end this wait.
    let yaml = settle(&server_yaml(&pki, "127.0.0.1:0", &fes, clusters), "1h");
    let (server, saddrs) = inproc_server(&dir, &yaml).await?;
    let admin = saddrs.admin()?;
    let (code, body) = verbose(admin).await?;
    anyhow::ensure!(code == 503, "{code}: {body}");
    anyhow::ensure!(
        body.contains("[-]agents-settled failed: started ")
            && body.contains("waiting for agents of shoot-a, shoot-b (0 of 2 expected clusters have one here)"),
        "{body}"
    );

    let agent = |cluster: &str| -> anyhow::Result<String> {
        agent_yaml(&pki, &AgentOpts::new(cluster, saddrs.listener("agents")?, &["127.0.0.1/32"]))
    };
    let (_a, _) = inproc_agent(&dir, &agent("shoot-a")?).await?;
    wait_agents(admin, "shoot-a", 1.0).await?;
    let (code, body) = verbose(admin).await?;
    anyhow::ensure!(code == 503 && body.contains("waiting for agents of shoot-b (1 of 2"), "{code}: {body}");

    let (b, _) = inproc_agent(&dir, &agent("shoot-b")?).await?;
    wait_ready(admin, STEP).await.with_context(|| server.log())?;
    let (_, body) = verbose(admin).await?;
    anyhow::ensure!(body.contains("[+]agents-settled ok: every cluster expected here had an agent (2) "), "{body}");

    // shoot-b's only agent goes (its node scaled away).
    drop(b);
    wait_agents(admin, "shoot-b", 0.0).await?;
    let (code, body) = verbose(admin).await?;
    anyhow::ensure!(code == 200, "a cluster without agents made the replica unready: {body}");
    anyhow::ensure!(
        body.contains("[i]cluster-shoot-b info: active: 0 agents [] (none connected here: its dials answer 503)\n")
            && body.contains("[i]cluster-shoot-a info: active: 1 agents [")
            && body.ends_with("readyz check passed\n"),
        "{body}"
    );
    let echo = TcpEcho::start().await?;
    echo_through(&Dialer::Tcp(saddrs.listener("a-egress")?), &echo, b"shoot-a is served").await?;
    let (status, why) = refused_with(&Dialer::Tcp(saddrs.listener("b-egress")?), &echo).await?;
    anyhow::ensure!(status == 503 && why.contains("no agent of cluster shoot-b"), "{status} {why}");
    let m = metrics(admin).await?;
    anyhow::ensure!(gauge(&m, "seedgate_agents_connected", "shoot-b") == Some(0.0), "{m}");
    anyhow::ensure!(gauge(&m, "seedgate_cluster_agents_expected", "shoot-b") == Some(1.0), "{m}");
    Ok(())
}

/// The case of a seed: one mTLS front end whose client certificate names the cluster, clusters
/// listed, one of them hibernated, and agents for one only. The settle time ends the wait for
/// the cluster whose agents never come (not for the hibernated one, which is not waited for);
/// then the replica is ready and serves the cluster that has agents.
#[tokio::test]
async fn the_settle_time_ends_the_wait_for_a_cluster_whose_agents_never_come() -> anyhow::Result<()> {
    let dir = TempDir::new("ready-settle")?;
    let pki = TunnelPki::new(dir.path())?;
    let (c, k) = &pki.frontend_cert;
    let egress = format!(
        "  - name: egress\n    listen: 127.0.0.1:0\n    tls: {{ cert: {}, key: {}, client_ca: {} }}\n",
        c.display(),
        k.display(),
        pki.ca_file.display()
    );
    let clusters =
        "clusters:\n  shoot-a: { state: active }\n  shoot-b: { state: active }\n  shoot-c: { hibernated: true }\n";
    let yaml = settle(&server_yaml(&pki, "127.0.0.1:0", &[], &format!("{egress}{clusters}")), "1s");
    let (server, saddrs) = inproc_server(&dir, &yaml).await?;
    let admin = saddrs.admin()?;
    let o = AgentOpts::new("shoot-a", saddrs.listener("agents")?, &["127.0.0.1/32"]);
    let (_a, _) = inproc_agent(&dir, &agent_yaml(&pki, &o)?).await?;
    wait_agents(admin, "shoot-a", 1.0).await?;
    wait_ready(admin, STEP).await.with_context(|| server.log())?;
    let (_, body) = verbose(admin).await?;
    let settled = body.lines().find(|l| l.starts_with("[+]agents-settled ok: ")).with_context(|| body.clone())?;
    anyhow::ensure!(
        settled.contains("agents.settle_time (1s) passed; ")
            && settled.contains("shoot-b")
            && !settled.contains("shoot-c"),
        "{body}"
    );
    anyhow::ensure!(body.contains("[i]cluster-shoot-c info: active, hibernated: 0 agents []\n"), "{body}");
    anyhow::ensure!(body.contains("[i]cluster-shoot-b info: active: 0 agents [] (none connected here"), "{body}");

    let echo = TcpEcho::start().await?;
    let fe = saddrs.listener("egress")?;
    let as_cluster = |cn: &str| -> anyhow::Result<Dialer> {
        let tls = testbed::pki::client_config(&pki.ca, Some(&pki.ca.client(cn)?), &["http/1.1"])?;
        Ok(Dialer::Tls(fe, tls, FRONTEND_NAME.into()))
    };
    echo_through(&as_cluster("shoot-a")?, &echo, b"shoot-a is served").await?;
    let (status, why) = refused_with(&as_cluster("shoot-b")?, &echo).await?;
    anyhow::ensure!(status == 503 && why.contains("no agent of cluster shoot-b"), "{status} {why}");
    let m = metrics(admin).await?;
    for (cluster, connected, expected) in [("shoot-a", 1.0, 1.0), ("shoot-b", 0.0, 1.0), ("shoot-c", 0.0, 0.0)] {
        anyhow::ensure!(gauge(&m, "seedgate_agents_connected", cluster) == Some(connected), "{cluster}: {m}");
        anyhow::ensure!(gauge(&m, "seedgate_cluster_agents_expected", cluster) == Some(expected), "{cluster}: {m}");
    }

    // A reload marks shoot-b hibernated and forgets shoot-c: the expectation follows.
    let clusters = "clusters:\n  shoot-a: { state: active }\n  shoot-b: { hibernated: true }\n";
    let yaml = settle(&server_yaml(&pki, "127.0.0.1:0", &[], &format!("{egress}{clusters}")), "1s");
    server.reload_with(&yaml).await?;
    server.wait_reloads(admin, "success", 1.0).await?;
    poll_until(STEP, TICK, || async {
        let m = metrics(admin).await?;
        let (b, c) = (
            gauge(&m, "seedgate_cluster_agents_expected", "shoot-b"),
            gauge(&m, "seedgate_cluster_agents_expected", "shoot-c"),
        );
        anyhow::ensure!(b == Some(0.0) && c.is_none(), "shoot-b {b:?}, shoot-c {c:?}");
        Ok(())
    })
    .await
    .with_context(|| server.log())?;
    let (code, body) = verbose(admin).await?;
    anyhow::ensure!(code == 200 && !body.contains("cluster-shoot-c"), "{code}: {body}");
    Ok(())
}

/// SIGTERM: the replica turns unready at once (its endpoints go) while the streams it carries
/// continue for the drain grace.
#[tokio::test]
async fn a_draining_replica_is_unready_while_its_streams_continue() -> anyhow::Result<()> {
    let dir = TempDir::new("ready-drain")?;
    let pki = TunnelPki::new(dir.path())?;
    let fes = [Fe::new("egress", "shoot-a", FeKind::Plain)];
    let (server, saddrs) = inproc_server(&dir, &server_yaml(&pki, "127.0.0.1:0", &fes, "drain_grace: 20s\n")).await?;
    let admin = saddrs.admin()?;
    let o = AgentOpts::new("shoot-a", saddrs.listener("agents")?, &["127.0.0.1/32"]);
    let (_a, _) = inproc_agent(&dir, &agent_yaml(&pki, &o)?).await?;
    wait_ready(admin, STEP).await.with_context(|| server.log())?;
    let echo = TcpEcho::start().await?;
    let mut live = connect(&Dialer::Tcp(saddrs.listener("egress")?), &echo.addr().to_string()).await?;
    echo_on(&mut live, b"before").await?;

    server.drain();
    let body = poll_until(STEP, TICK, || async {
        let (code, body) = verbose(admin).await?;
        anyhow::ensure!(code == 503, "{code}: {body}");
        Ok(body)
    })
    .await?;
    anyhow::ensure!(body.starts_with("[-]not-draining failed: draining for shutdown\n"), "{body}");
    anyhow::ensure!(body.contains("[+]agents-settled ok: ") && body.ends_with("readyz check failed\n"), "{body}");
    echo_on(&mut live, b"during the drain").await?;
    Ok(())
}
