//! Changes that take effect without a restart, end to end: a proxy-server front end added and
//! removed by a config change (a live stream on the removed one keeps going), and the agents
//! listeners (TCP and QUIC) added, moved and removed while sessions hold on, and the agent's
//! `tunnel.servers` changed under a live stream.

use anyhow::Context as _;
use std::time::Duration;
use testbed::tunnel_kit::{AgentOpts, Fe, FeKind, TunnelPki, agent_yaml, connect_tcp, server_yaml, wait_agents};
use testbed::{InProc, TcpEcho, TempDir, poll_until};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const DEADLINE: Duration = Duration::from_secs(20);
const TICK: Duration = Duration::from_millis(20);

async fn echo_once(s: &mut TcpStream, msg: &[u8]) -> anyhow::Result<()> {
    s.write_all(msg).await?;
    let mut back = vec![0u8; msg.len()];
    tokio::time::timeout(DEADLINE, s.read_exact(&mut back)).await.context("no echo")??;
    anyhow::ensure!(back == msg, "echo corrupted");
    Ok(())
}

#[tokio::test]
async fn a_front_end_added_then_removed_by_config_change() -> anyhow::Result<()> {
    let dir = TempDir::new("runtime-frontends")?;
    let pki = TunnelPki::new(dir.path())?;
    let echo = TcpEcho::start().await?;
    let base = server_yaml(&pki, "127.0.0.1:0", &[Fe::new("first", "shoot-a", FeKind::Plain)], "");
    let server = InProc::start(&dir, "proxy-server", &base).await?;
    let a = server.read_addresses().context("addresses")?;
    let agent_cfg = agent_yaml(&pki, &AgentOpts::new("shoot-a", a.listener("agents")?, &["127.0.0.0/8"]))?;
    let agent = InProc::start(&dir, "proxy-agent", &agent_cfg).await?;
    wait_agents(a.admin()?, "shoot-a", 1.0).await.with_context(|| agent.log())?;

    // Added: it listens and dials through the tunnel.
    let two = server_yaml(
        &pki,
        "127.0.0.1:0",
        &[Fe::new("first", "shoot-a", FeKind::Plain), Fe::new("late", "shoot-a", FeKind::Plain)],
        "",
    );
    server.reload_with(&two).await?;
    let added = server.addresses_where(|a| a.listeners.contains_key("late")).await?;
    let late = added.listener("late")?;
    anyhow::ensure!(added.listener("first")? == a.listener("first")?, "an unchanged front end keeps its socket");
    let target = echo.addr().to_string();
    let (mut live, _) = connect_tcp(late, &target).await.context("CONNECT through the added front end")?;
    echo_once(&mut live, b"through the new front end").await?;

    // Removed: it stops accepting; the stream opened on it keeps going.
    server.reload_with(&base).await?;
    server.addresses_where(|a| !a.listeners.contains_key("late")).await?;
    poll_until(DEADLINE, TICK, || async move {
        match TcpStream::connect(late).await {
            Err(_) => Ok(()),
            Ok(_) => Err(anyhow::anyhow!("the removed front end still accepts")),
        }
    })
    .await?;
    for i in 0..5 {
        echo_once(&mut live, format!("still alive {i}").as_bytes()).await.context("the live stream was cut")?;
    }
    let (mut other, _) = connect_tcp(a.listener("first")?, &target).await?;
    echo_once(&mut other, b"the other front end is untouched").await?;
    anyhow::ensure!(server.reloads(a.admin()?, "failure").await == 0.0, "{}", server.log());
    Ok(())
}

#[tokio::test]
async fn the_agents_listener_moves_and_sessions_on_the_old_one_hold() -> anyhow::Result<()> {
    let dir = TempDir::new("runtime-agents")?;
    let pki = TunnelPki::new(dir.path())?;
    let echo = TcpEcho::start().await?;
    let fe = [Fe::new("egress", "shoot-a", FeKind::Plain)];
    let yaml = server_yaml(&pki, "127.0.0.1:0", &fe, "");
    let server = InProc::start(&dir, "proxy-server", &yaml).await?;
    let a = server.read_addresses().context("addresses")?;
    let old = a.listener("agents")?;
    let agent =
        InProc::start(&dir, "proxy-agent", &agent_yaml(&pki, &AgentOpts::new("shoot-a", old, &["127.0.0.0/8"]))?)
            .await?;
    wait_agents(a.admin()?, "shoot-a", 1.0).await.with_context(|| agent.log())?;
    let (mut live, _) = connect_tcp(a.listener("egress")?, &echo.addr().to_string()).await?;
    echo_once(&mut live, b"before the move").await?;

    let moved = server_yaml(&pki, "127.0.0.2:0", &fe, "");
    server.reload_with(&moved).await?;
    let b = server.addresses_where(|x| x.listener("agents").is_ok_and(|l| l.ip().to_string() == "127.0.0.2")).await?;
    // New agents can reach the new address; the old one no longer accepts.
    TcpStream::connect(b.listener("agents")?).await.context("the moved agents listener")?;
    poll_until(DEADLINE, TICK, || async move {
        match TcpStream::connect(old).await {
            Err(_) => Ok(()),
            Ok(_) => Err(anyhow::anyhow!("the old agents listener still accepts")),
        }
    })
    .await?;
    // The agent's session, made on the old listener, still carries streams.
    echo_once(&mut live, b"after the move").await?;
    let (mut fresh, _) = connect_tcp(a.listener("egress")?, &echo.addr().to_string()).await?;
    echo_once(&mut fresh, b"a new stream over the held session").await?;
    Ok(())
}

/// `agents.quic` added, moved and removed by reloads: each new socket takes QUIC agents, and the
/// session made on the first one keeps carrying its stream (and new ones) through all of it.
#[tokio::test]
async fn the_agents_quic_listener_is_added_moved_and_removed_by_reload() -> anyhow::Result<()> {
    let dir = TempDir::new("runtime-quic")?;
    let pki = TunnelPki::new(dir.path())?;
    let echo = TcpEcho::start().await?;
    let fe = [Fe::new("egress", "shoot-a", FeKind::Plain)];
    let base = server_yaml(&pki, "127.0.0.1:0", &fe, "");
    let with_quic = |ip: &str| base.replacen("agents:\n", &format!("agents:\n  quic: {{ listen: {ip}:0 }}\n"), 1);
    let server = InProc::start(&dir, "proxy-server", &base).await?;
    let a = server.read_addresses().context("addresses")?;
    anyhow::ensure!(!a.listeners.contains_key("agents-quic"), "no QUIC listener configured yet");
    let quic_agent = |name: &str, at: std::net::SocketAddr| {
        let mut o = AgentOpts::new("shoot-a", at, &["127.0.0.0/8"]);
        o.node_name = name.into();
        o.tunnel_extra = "  transport: quic\n".into();
        agent_yaml(&pki, &o)
    };

    // Added.
    server.reload_with(&with_quic("127.0.0.1")).await?;
    let first = server.addresses_where(|x| x.listeners.contains_key("agents-quic")).await?.listener("agents-quic")?;
    let one = InProc::start(&dir, "proxy-agent", &quic_agent("node-1", first)?).await?;
    wait_agents(a.admin()?, "shoot-a", 1.0).await.with_context(|| one.log())?;
    let (mut live, _) = connect_tcp(a.listener("egress")?, &echo.addr().to_string()).await?;
    echo_once(&mut live, b"over the added QUIC listener").await?;

    // Moved: a second agent reaches the new socket; the first session holds on the old one.
    server.reload_with(&with_quic("127.0.0.2")).await?;
    let moved = server
        .addresses_where(|x| x.listener("agents-quic").is_ok_and(|l| l.ip().to_string() == "127.0.0.2"))
        .await?
        .listener("agents-quic")?;
    // Its own directory: config and addresses files are named by the binary.
    let dir2 = TempDir::new("runtime-quic-2")?;
    let two = InProc::start(&dir2, "proxy-agent", &quic_agent("node-2", moved)?).await?;
    let logs = || format!("--- server:\n{}\n--- one:\n{}\n--- two:\n{}", server.log(), one.log(), two.log());
    wait_agents(a.admin()?, "shoot-a", 2.0).await.with_context(logs)?;
    echo_once(&mut live, b"after the move").await?;

    // Removed: both sessions continue.
    server.reload_with(&base).await?;
    server.addresses_where(|x| !x.listeners.contains_key("agents-quic")).await?;
    for i in 0..5 {
        echo_once(&mut live, format!("after the removal {i}").as_bytes()).await.context("the live stream was cut")?;
    }
    wait_agents(a.admin()?, "shoot-a", 2.0).await.with_context(logs)?;
    let (mut fresh, _) = connect_tcp(a.listener("egress")?, &echo.addr().to_string()).await?;
    echo_once(&mut fresh, b"a new stream over the held sessions").await?;
    anyhow::ensure!(server.reloads(a.admin()?, "failure").await == 0.0, "{}", server.log());
    Ok(())
}

/// The agent's `tunnel.servers` changed by reloads: a server added gets a session at once; a
/// server removed gets GOAWAY (no new streams there) while the stream it carries runs on.
#[tokio::test]
async fn the_agents_servers_are_added_and_removed_by_reload() -> anyhow::Result<()> {
    let dir = TempDir::new("runtime-servers")?;
    let pki = TunnelPki::new(dir.path())?;
    let echo = TcpEcho::start().await?;
    let target = echo.addr().to_string();
    let fe = [Fe::new("egress", "shoot-a", FeKind::Plain)];
    // Each process has its own directory: its config and addresses files are named by the binary.
    let dir2 = TempDir::new("runtime-servers-2")?;
    let one = InProc::start(&dir, "proxy-server", &server_yaml(&pki, "127.0.0.1:0", &fe, "")).await?;
    let two = InProc::start(&dir2, "proxy-server", &server_yaml(&pki, "127.0.0.1:0", &fe, "")).await?;
    let (a1, a2) = (one.read_addresses().context("addresses")?, two.read_addresses().context("addresses")?);
    let agent_cfg = |servers: &[std::net::SocketAddr]| {
        let mut o = AgentOpts::new("shoot-a", servers[0], &["127.0.0.0/8"]);
        o.servers = servers.iter().map(|s| s.to_string()).collect();
        agent_yaml(&pki, &o)
    };
    let agent = InProc::start(&dir, "proxy-agent", &agent_cfg(&[a1.listener("agents")?])?).await?;
    let admin = agent.read_addresses().context("agent addresses")?.admin()?;
    wait_agents(a1.admin()?, "shoot-a", 1.0).await.with_context(|| agent.log())?;
    let (mut live, _) = connect_tcp(a1.listener("egress")?, &target).await?;
    echo_once(&mut live, b"through the first server").await?;

    // Added.
    agent.reload_with(&agent_cfg(&[a1.listener("agents")?, a2.listener("agents")?])?).await?;
    wait_agents(a2.admin()?, "shoot-a", 1.0).await.with_context(|| agent.log())?;
    let (mut second, _) = connect_tcp(a2.listener("egress")?, &target).await?;
    echo_once(&mut second, b"through the added server").await?;
    echo_once(&mut live, b"the first one untouched").await?;

    // Removed: the first server opens no new stream on the agent's session, the live one runs on.
    agent.reload_with(&agent_cfg(&[a2.listener("agents")?])?).await?;
    let e1 = a1.listener("egress")?;
    let refused = poll_until(DEADLINE, TICK, || async {
        match connect_tcp(e1, &target).await {
            Ok(_) => Err(anyhow::anyhow!("the removed server still opens streams on the agent")),
            Err(e) => testbed::tunnel_kit::refusal_of(&e).cloned().with_context(|| format!("{e:#}")),
        }
    })
    .await?;
    anyhow::ensure!(refused.status == 503, "{refused}");
    for i in 0..5 {
        echo_once(&mut live, format!("still running {i}").as_bytes()).await.context("the live stream was cut")?;
    }
    echo_once(&mut second, b"the kept server untouched").await?;
    drop(live);
    wait_agents(a1.admin()?, "shoot-a", 0.0).await.context("the removed server's session ends with its stream")?;
    let (_, body) = testbed::http_get(admin, "/readyz?verbose").await?;
    let first_name = a1.listener("agents")?.to_string();
    anyhow::ensure!(!body.contains(&first_name) && body.contains(&a2.listener("agents")?.to_string()), "{body}");
    anyhow::ensure!(agent.reloads(admin, "failure").await == 0.0, "{}", agent.log());
    Ok(())
}
