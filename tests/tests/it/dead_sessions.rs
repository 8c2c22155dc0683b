//! No dial goes to a dead agent session: an agent restarted after SIGKILL over QUIC supersedes its old session at once, and an HTTP/2 session whose peer went silent (its link down in a network namespace) loses its dials to another session after `agents.open_timeout`. Both with a keepalive timeout far longer than the dial timeout, so a dial that waited for it would fail.

use crate::tunnel::echo_roundtrip;
use anyhow::Context as _;
use testbed::netns::{Netns, require_root, veth};
use testbed::tunnel_kit::{
    AgentOpts, Dialer, Fe, FeKind, STEP, TunnelPki, agent_yaml, inproc_agent, inproc_server, metrics, server_yaml,
    start_agent, wait_agents,
};
use testbed::{TcpEcho, TempDir, http_get, metric_value, poll_until};

/// Dials made after the dead session's peer is gone (each must succeed).
const DIALS: usize = 8;
/// The keepalive of both ends: nothing here may wait for it (the dial timeout is 10s).
const KEEPALIVE: &str = "keepalive: { interval: 500ms, timeout: 60s }";

fn long_keepalive(yaml: &str) -> String {
    yaml.replace("keepalive: { interval: 500ms, suspect_after: 2s, timeout: 2s }", KEEPALIVE)
}

/// The counter `name{cluster="shoot-a", reason}` of a proxy-server.
async fn counted(admin: std::net::SocketAddr, name: &str, reason: &str) -> anyhow::Result<f64> {
    let m = metrics(admin).await?;
    Ok(metric_value(&m, name, &[("cluster", "shoot-a"), ("reason", reason)]).unwrap_or(0.0))
}

#[tokio::test]
async fn a_quic_agent_killed_and_restarted_at_once_takes_every_dial() -> anyhow::Result<()> {
    let dir = TempDir::new("dead-quic")?;
    let pki = TunnelPki::new(dir.path())?;
    let fe = Fe::new("egress", "shoot-a", FeKind::Plain);
    let yaml = server_yaml(&pki, "127.0.0.1:0", &[fe], "").replacen(
        "agents:\n",
        "agents:\n  quic: { listen: 127.0.0.1:0 }\n",
        1,
    );
    let (server, saddrs) = inproc_server(&dir, &long_keepalive(&yaml)).await?;
    let admin = saddrs.admin()?;
    let mut o = AgentOpts::new("shoot-a", saddrs.listener("agents-quic")?, &["127.0.0.1/32"]);
    o.tunnel_extra = "  transport: quic\n".into();
    let agent_cfg = long_keepalive(&agent_yaml(&pki, &o)?);
    let (mut first, _) = start_agent(&dir, "agent-1", &agent_cfg, None).await?;
    wait_agents(admin, "shoot-a", 1.0).await.with_context(|| first.log())?;
    let echo = TcpEcho::start().await?;
    let d = Dialer::Tcp(saddrs.listener("egress")?);
    echo_roundtrip(&d, echo.addr(), b"first run").await?;

    // A node crash or an OOM kill: no CONNECTION_CLOSE, the old session lingers at the server.
    first.signal(libc::SIGKILL)?;
    let (second, _) = start_agent(&dir, "agent-2", &agent_cfg, None).await?;
    let logs = || format!("--- server:\n{}\n--- agent:\n{}", server.log(), second.log());
    wait_agents(admin, "shoot-a", 2.0).await.with_context(logs)?;
    poll_until(STEP, std::time::Duration::from_millis(20), || async {
        let (_, body) = http_get(admin, "/readyz?verbose").await?;
        anyhow::ensure!(body.contains("superseded"), "the old session is not superseded yet: {body}");
        Ok(())
    })
    .await
    .with_context(logs)?;

    for i in 0..DIALS {
        echo_roundtrip(&d, echo.addr(), format!("dial {i}").as_bytes()).await.with_context(logs)?;
    }
    assert_eq!(counted(admin, "seedgate_agent_sessions_doubted_total", "superseded").await?, 1.0);
    assert_eq!(
        counted(admin, "seedgate_tunnel_dial_retries_total", "silent").await?,
        0.0,
        "no dial tried the dead one"
    );
    // Still there: the keepalive did not end it, superseding did the work.
    wait_agents(admin, "shoot-a", 2.0).await.with_context(logs)?;
    Ok(())
}

#[tokio::test]
async fn an_h2_session_gone_silent_loses_its_dials_to_a_live_one() -> anyhow::Result<()> {
    if !require_root() {
        return Ok(());
    }
    let dir = TempDir::new("dead-h2")?;
    let pki = TunnelPki::new(dir.path())?;
    let ns = Netns::create("silent")?;
    let link = veth(None, Some(&ns), "10.238.1.1/24", "10.238.1.2/24")?;
    // The target is the seed end's address, which both agents reach; the silent node's agent
    // claims it, so `dest_host` sends the first dial there.
    let echo = TcpEcho::start_on("10.238.1.1:0".parse()?).await?;
    let fe = Fe::new("egress", "shoot-a", FeKind::Plain);
    let yaml = server_yaml(&pki, "10.238.1.1:0", &[fe], "").replacen(
        "agents:\n",
        "agents:\n  proxy_strategies: [dest_host, default]\n",
        1,
    );
    let (server, saddrs) = inproc_server(&dir, &long_keepalive(&yaml)).await?;
    let admin = saddrs.admin()?;
    let agents = saddrs.listener("agents")?;

    let mut o = AgentOpts::new("shoot-a", agents, &["10.238.1.1/32"]);
    o.node_name = "node-silent".into();
    o.tunnel_extra = "  identifiers: { addresses: ['10.238.1.1'] }\n".into();
    let (silent, _) = start_agent(&dir, "agent-silent", &long_keepalive(&agent_yaml(&pki, &o)?), Some(&ns)).await?;
    o.node_name = "node-live".into();
    o.tunnel_extra = String::new();
    let (live, _) = inproc_agent(&dir, &long_keepalive(&agent_yaml(&pki, &o)?)).await?;
    let logs = || format!("--- server:\n{}\n--- silent:\n{}\n--- live:\n{}", server.log(), silent.log(), live.log());
    wait_agents(admin, "shoot-a", 2.0).await.with_context(logs)?;
    let d = Dialer::Tcp(saddrs.listener("egress")?);
    echo_roundtrip(&d, echo.addr(), b"both up").await.with_context(logs)?;

    // The node vanishes: its packets go nowhere, no RST, no FIN.
    ns.ip(&["link", "set", &link.b, "down"])?;
    for i in 0..DIALS {
        echo_roundtrip(&d, echo.addr(), format!("dial {i}").as_bytes()).await.with_context(logs)?;
    }
    // One dial found the session silent and moved on; the rest went to the live one at once.
    assert_eq!(counted(admin, "seedgate_agent_sessions_doubted_total", "silent").await?, 1.0, "{}", logs());
    assert_eq!(counted(admin, "seedgate_tunnel_dial_retries_total", "silent").await?, 1.0);
    wait_agents(admin, "shoot-a", 2.0).await.with_context(logs)?;
    drop(link);
    Ok(())
}
