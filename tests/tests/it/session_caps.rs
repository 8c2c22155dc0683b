//! Agent sessions per cluster are capped (`clusters.<name>.limits.max_sessions`, default
//! `agents.max_sessions_per_cluster`): at the cap a new session is refused with the reason (the
//! agent is told, and tries again), the sessions already there are untouched, other clusters are
//! not affected, and a freed place is taken at the agent's next attempt.

use anyhow::Context as _;
use std::time::Duration;
use testbed::tunnel_kit::{AgentOpts, Fe, FeKind, TunnelPki, agent_yaml, inproc_agent, inproc_server, server_yaml};
use testbed::{InProc, TempDir, metric_value, poll_until};

const DEADLINE: Duration = Duration::from_secs(20);
const TICK: Duration = Duration::from_millis(20);

fn value(m: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    metric_value(m, name, labels).unwrap_or(0.0)
}

async fn wait(server: &InProc, what: &str, cluster: &str, check: impl Fn(f64) -> bool) -> anyhow::Result<()> {
    poll_until(DEADLINE, TICK, || async {
        let m = server.metrics();
        let v = match what {
            "connected" => value(&m, "seedgate_agents_connected", &[("cluster", cluster)]),
            result => value(&m, "seedgate_agent_sessions_total", &[("cluster", cluster), ("result", result)]),
        };
        anyhow::ensure!(check(v), "{what} of {cluster}: {v}");
        Ok(())
    })
    .await
    .with_context(|| format!("server log:\n{}", server.log()))
}

#[tokio::test]
async fn at_the_cap_a_new_session_is_refused_and_the_others_stay() -> anyhow::Result<()> {
    let dir = TempDir::new("session-caps")?;
    let pki = TunnelPki::new(dir.path())?;
    let fes = [Fe::new("a", "shoot-a", FeKind::Plain), Fe::new("b", "shoot-b", FeKind::Plain)];
    let yaml = server_yaml(&pki, "127.0.0.1:0", &fes, "clusters:\n  shoot-a: { limits: { max_sessions: 2 } }\n")
        .replacen("agents:\n", "agents:\n  max_sessions_per_cluster: 1\n", 1);
    let (server, saddrs) = inproc_server(&dir, &yaml).await?;
    let agents_addr = saddrs.listener("agents")?;
    let start = |cluster: &str, node: &str| {
        let mut o = AgentOpts::new(cluster, agents_addr, &["127.0.0.0/8"]);
        o.node_name = node.into();
        let yaml = agent_yaml(&pki, &o);
        let dir = &dir;
        async move { inproc_agent(dir, &yaml?).await.map(|(a, _)| a) }
    };
    let a1 = start("shoot-a", "a-1").await?;
    let _a2 = start("shoot-a", "a-2").await?;
    wait(&server, "connected", "shoot-a", |v| v == 2.0).await?;
    // The third agent of shoot-a is one too many; its refusal says which limit.
    let a3 = start("shoot-a", "a-3").await?;
    wait(&server, "cluster_session_limit", "shoot-a", |v| v >= 1.0).await?;
    a3.wait_log_line(
        &["proxy-server refused this agent's session", "holds its limit of 2 agent sessions", "max_sessions"],
        DEADLINE,
    )
    .await?;
    // shoot-b has the default (1): its first agent is in, its second is refused.
    let _b1 = start("shoot-b", "b-1").await?;
    wait(&server, "connected", "shoot-b", |v| v == 1.0).await?;
    let _b2 = start("shoot-b", "b-2").await?;
    wait(&server, "cluster_session_limit", "shoot-b", |v| v >= 1.0).await?;
    let m = server.metrics();
    anyhow::ensure!(value(&m, "seedgate_agents_connected", &[("cluster", "shoot-a")]) == 2.0, "shoot-a's stay");
    anyhow::ensure!(value(&m, "seedgate_agents_connected", &[("cluster", "shoot-b")]) == 1.0, "shoot-b's stays");
    // A place freed is taken at the refused agent's next attempt.
    drop(a1);
    wait(&server, "accepted", "shoot-a", |v| v == 3.0).await.with_context(|| a3.log())?;
    wait(&server, "connected", "shoot-a", |v| v == 2.0).await?;
    Ok(())
}
