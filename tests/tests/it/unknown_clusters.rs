//! Agents whose certificate names a cluster the proxy-server config does not know (a CN typo):
//! accepted with one warning and listed by `/readyz?verbose` by default; refused, counted, and
//! told why with `agents.accept_unknown_clusters: false`.

use anyhow::Context as _;
use std::time::Duration;
use testbed::tunnel_kit::{
    AgentOpts, Fe, FeKind, TunnelPki, agent_yaml, inproc_agent, inproc_server, metrics, server_yaml,
};
use testbed::{TempDir, http_get, metric_value, poll_until};

const DEADLINE: Duration = Duration::from_secs(20);
const TICK: Duration = Duration::from_millis(20);
const WARNING: &str = "which no front end or clusters entry knows";

fn server(pki: &TunnelPki, accept: bool) -> String {
    server_yaml(pki, "127.0.0.1:0", &[Fe::new("egress", "shoot-a", FeKind::Plain)], "").replace(
        "  keepalive: { interval: 500ms, suspect_after: 2s, timeout: 2s }\n",
        &format!(
            "  keepalive: {{ interval: 500ms, suspect_after: 2s, timeout: 2s }}\n  accept_unknown_clusters: {accept}\n"
        ),
    )
}

async fn counted(admin: std::net::SocketAddr, cluster: &str, result: &str) -> anyhow::Result<f64> {
    let m = metrics(admin).await?;
    Ok(metric_value(&m, "seedgate_agent_sessions_total", &[("cluster", cluster), ("result", result)]).unwrap_or(0.0))
}

#[tokio::test]
async fn an_unknown_cluster_is_accepted_with_one_warning_and_listed() -> anyhow::Result<()> {
    let dir = TempDir::new("unknown-accepted")?;
    let pki = TunnelPki::new(dir.path())?;
    let (server, saddrs) = inproc_server(&dir, &server(&pki, true)).await?;
    let admin = saddrs.admin()?;
    let o = AgentOpts::new("shoot-typo", saddrs.listener("agents")?, &["127.0.0.0/8"]);
    let (agent, _) = inproc_agent(&dir, &agent_yaml(&pki, &o)?).await?;
    poll_until(DEADLINE, TICK, || async move {
        anyhow::ensure!(counted(admin, "shoot-typo", "accepted").await? >= 1.0, "no session yet");
        Ok(())
    })
    .await
    .with_context(|| format!("agent log:\n{}", agent.log()))?;
    let log = server.log();
    anyhow::ensure!(log.matches(WARNING).count() == 1, "one warning naming the cluster:\n{log}");
    anyhow::ensure!(log.contains("shoot-typo"), "{log}");
    let (code, ready) = http_get(admin, "/readyz?verbose").await?;
    // The start-up wait is for the known clusters (shoot-a has no agent here yet), not for the
    // stray one, which is listed as information.
    anyhow::ensure!(code == 503, "{code}: {ready}");
    anyhow::ensure!(ready.contains("waiting for agents of shoot-a (0 of 1 expected clusters"), "{ready}");
    anyhow::ensure!(ready.contains("[i]unknown-clusters info: ") && ready.contains("shoot-typo (1 agents)"), "{ready}");
    Ok(())
}

#[tokio::test]
async fn an_unknown_cluster_is_refused_when_the_operator_says_so() -> anyhow::Result<()> {
    let dir = TempDir::new("unknown-refused")?;
    let pki = TunnelPki::new(dir.path())?;
    let (_server, saddrs) = inproc_server(&dir, &server(&pki, false)).await?;
    let admin = saddrs.admin()?;
    let o = AgentOpts::new("shoot-typo", saddrs.listener("agents")?, &["127.0.0.0/8"]);
    let (agent, _) = inproc_agent(&dir, &agent_yaml(&pki, &o)?).await?;
    agent
        .wait_log_line(
            &["proxy-server refused this agent's session", "shoot-typo", "accept_unknown_clusters"],
            DEADLINE,
        )
        .await?;
    anyhow::ensure!(counted(admin, "-", "unknown_cluster").await? >= 1.0, "the refusal is counted");
    anyhow::ensure!(counted(admin, "shoot-typo", "accepted").await? == 0.0, "never accepted");
    let m = metrics(admin).await?;
    let connected = metric_value(&m, "seedgate_agents_connected", &[("cluster", "shoot-typo")]).unwrap_or(0.0);
    anyhow::ensure!(connected == 0.0, "{connected} sessions registered");
    let (_, ready) = http_get(admin, "/readyz?verbose").await?;
    anyhow::ensure!(ready.contains("shoot-typo (refused)"), "{ready}");
    Ok(())
}
