//! Agent identifiers and proxy strategies (root): three agents of one cluster, each in a network namespace of its own ("nodes"), each node with a kubelet stand-in on its own address.
//!
//! Node `k` is `10.<net>.k.2` (`net`: each test's own), joined to the seed (this namespace,
//! `10.<net>.k.1`) by a veth pair;
//! no node reaches another's address, except node 1, whose agent offers the default route and
//! has a link of its own to node 3. A dial to a node's address must reach that node's agent
//! (`dest_host`), asserted from the access log of the agent that served it; with node 3's agent
//! stopped its dial falls through to `default_route` (node 1); a reload that leaves only
//! `dest_host` makes it fail with no agent.

use anyhow::Context as _;
use std::net::SocketAddr;
use testbed::netns::{Netns, Veth, require_root, veth};
use testbed::tunnel_kit::{
    AgentOpts, Dialer, Fe, FeKind, STEP, TunnelPki, agent_yaml, connect, ensure_binaries, metrics, refusal_of,
    server_yaml, wait_agents,
};
use testbed::{InProc, Proc, TempDir, bin_path, metric_value};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// One node: its namespace, its link to the seed, its kubelet stand-in and its agent.
struct Node {
    ns: Netns,
    _link: Veth,
    _kubelet: Proc,
    kubelet: SocketAddr,
    agent: Option<Proc>,
}

/// The second octet of the first test's addresses.
const NET: u8 = 221;

fn node_addr(net: u8, k: u8) -> String {
    format!("10.{net}.{k}.2")
}

/// Start the stand-in echo ("kubelet") inside `ns` on `ip`.
async fn kubelet(ns: &Netns, ip: &str) -> anyhow::Result<(Proc, SocketAddr)> {
    let mut cmd = ns.command(bin_path("stand-in")?);
    cmd.args(["echo", "--listen", &format!("{ip}:0")]);
    let p = Proc::spawn(cmd)?;
    let line = p.wait_log_line(&["listening "], STEP).await?;
    let addr = line.trim().strip_prefix("listening ").context("stand-in output")?.parse()?;
    Ok((p, addr))
}

/// Node `k`: its namespace, the veth to the seed, a route to the server's address (on node 1's
/// link; it is local to this namespace, so no forwarding is needed) and its kubelet.
async fn node(net: u8, k: u8) -> anyhow::Result<Node> {
    let ns = Netns::create(&format!("node{k}"))?;
    let link = veth(None, Some(&ns), &format!("10.{net}.{k}.1/24"), &format!("{}/24", node_addr(net, k)))?;
    if k != 1 {
        ns.ip(&["route", "add", &format!("10.{net}.1.1/32"), "via", &format!("10.{net}.{k}.1")])?;
    }
    let (p, addr) = kubelet(&ns, &node_addr(net, k)).await?;
    Ok(Node { ns, _link: link, _kubelet: p, kubelet: addr, agent: None })
}

/// Agent `k` of `shoot-a` inside its node: node 1 from config (with the default route), the
/// others from the downward API's variables, as the DaemonSet sets them.
async fn start_agent(dir: &TempDir, pki: &TunnelPki, server: SocketAddr, k: u8, n: &mut Node) -> anyhow::Result<()> {
    let mut o = AgentOpts::new("shoot-a", server, &["10.221.0.0/16"]);
    o.node_name = format!("node-{k}");
    if k == 1 {
        o.tunnel_extra =
            format!("  identifiers: {{ host: node-1, addresses: [{}], default_route: true }}\n", node_addr(NET, 1));
    }
    let cfg = dir.write(&format!("agent-{k}.yaml"), &agent_yaml(pki, &o)?)?;
    let mut cmd = n.ns.command(bin_path("proxy-agent")?);
    cmd.env("NODE_NAME", format!("node-{k}")).env("HOST_IP", node_addr(NET, k));
    let (p, _) = Proc::spawn_seedgate(cmd, &cfg, &[]).await?;
    n.agent = Some(p);
    Ok(())
}

fn server_config(pki: &TunnelPki, net: u8, strategies: &str) -> String {
    let fes = [Fe::new("egress", "shoot-a", FeKind::Plain)];
    server_yaml(pki, &format!("10.{net}.1.1:0"), &fes, "").replacen(
        "agents:\n",
        &format!("agents:\n  proxy_strategies: [{strategies}]\n"),
        1,
    )
}

/// Echo a line through the tunnel to `target`.
async fn echo(egress: &Dialer, target: SocketAddr) -> anyhow::Result<()> {
    let mut s = connect(egress, &target.to_string()).await?;
    s.write_all(b"kubectl logs").await?;
    s.shutdown().await?;
    let mut back = Vec::new();
    tokio::time::timeout(STEP, s.read_to_end(&mut back)).await??;
    anyhow::ensure!(back == b"kubectl logs", "{back:?}");
    Ok(())
}

/// The agent that served `target` logged its stream.
async fn served_by(n: &Node, target: SocketAddr) -> anyhow::Result<()> {
    let agent = n.agent.as_ref().context("agent stopped")?;
    agent.wait_log_line(&["stream closed", &format!("target={target}")], STEP).await.map(|_| ())
}

/// Once the three agents' hellos came (`hello_key=node-k` in the server's log: a session counts
/// as connected before its hello names its node, and until then only the `default` strategy can
/// pick it), each node's kubelet is reached through its own agent by `dest_host`. The front end.
async fn each_node_by_its_own_agent(server: &InProc, nodes: &[Node], hello_key: &str) -> anyhow::Result<Dialer> {
    let saddrs = server.addrs()?;
    wait_agents(saddrs.admin()?, "shoot-a", 3.0).await?;
    for k in 1..=3 {
        server.wait_log_line(&["agent hello", &format!("{hello_key}=node-{k}")], STEP).await?;
    }
    let egress = Dialer::Tcp(saddrs.listener("egress")?);
    for n in nodes {
        echo(&egress, n.kubelet).await.with_context(|| server.log())?;
        served_by(n, n.kubelet).await?;
    }
    let m = metrics(saddrs.admin()?).await?;
    assert_eq!(strategy_count(&m, "dest_host"), 3.0, "{m}");
    Ok(egress)
}

fn strategy_count(m: &str, strategy: &str) -> f64 {
    metric_value(m, "seedgate_tunnel_dial_strategy_total", &[("cluster", "shoot-a"), ("strategy", strategy)])
        .unwrap_or(0.0)
}

#[tokio::test]
async fn a_dial_reaches_the_agent_on_the_destination_node() -> anyhow::Result<()> {
    if !require_root() {
        return Ok(());
    }
    ensure_binaries()?;
    let dir = TempDir::new("strategies")?;
    let pki = TunnelPki::new(dir.path())?;
    let mut nodes = vec![node(NET, 1).await?, node(NET, 2).await?, node(NET, 3).await?];
    // Node 1 reaches node 3's address over a link of their own.
    let _n13 = veth(Some(&nodes[0].ns), Some(&nodes[2].ns), "10.222.13.1/24", "10.222.13.3/24")?;
    nodes[0].ns.ip(&["route", "add", &format!("{}/32", node_addr(NET, 3)), "via", "10.222.13.3"])?;

    let server =
        InProc::start(&dir, "proxy-server", &server_config(&pki, NET, "dest_host, default_route, default")).await?;
    let saddrs = server.addrs()?;
    let at = saddrs.listener("agents")?;
    for (k, n) in (1..=3).zip(nodes.iter_mut()) {
        start_agent(&dir, &pki, at, k, n).await?;
    }
    // Each node's kubelet through its own agent.
    let egress = each_node_by_its_own_agent(&server, &nodes, "node").await?;
    let line = server.wait_log_line(&["connection closed", &format!("target={}", nodes[1].kubelet)], STEP).await?;
    assert!(line.contains("strategy=\"dest_host\"") && line.contains("agent=node-2"), "{line}");

    // Node 3's agent stopped: its kubelet through the agent offering the default route.
    drop(nodes[2].agent.take().context("agent 3")?);
    wait_agents(saddrs.admin()?, "shoot-a", 2.0).await?;
    echo(&egress, nodes[2].kubelet).await.with_context(|| server.log())?;
    served_by(&nodes[0], nodes[2].kubelet).await?;
    let m = metrics(saddrs.admin()?).await?;
    assert_eq!(strategy_count(&m, "default_route"), 1.0, "{m}");

    // A reload to `dest_host` alone: nothing else may take node 3's dial.
    let admin = saddrs.admin()?;
    let before = server.reloads(admin, "success").await;
    server.reload_with(&server_config(&pki, NET, "dest_host")).await?;
    server.wait_reloads(admin, "success", before + 1.0).await?;
    let e = connect(&egress, &nodes[2].kubelet.to_string()).await.err().context("dialled without its agent")?;
    let r = refusal_of(&e).context("not a refusal")?;
    assert!(r.status == 503 && r.body.contains("dest_host"), "{r:?}");
    // Node 1 still by its own agent.
    echo(&egress, nodes[0].kubelet).await?;
    let m = metrics(saddrs.admin()?).await?;
    assert_eq!((strategy_count(&m, "dest_host"), strategy_count(&m, "default_route")), (4.0, 1.0), "{m}");
    Ok(())
}

/// Three agents of one cluster on one machine, each in a network namespace of its own: they
/// share the host name, and each names its node by `identifiers.host` alone (no
/// `tunnel.node_name`, no `$NODE_NAME`), as an operator setting identifiers by hand does. Each is
/// its own node: none supersedes another, and each node's dials reach its own agent by
/// `dest_host` (none of them can reach another node's kubelet).
#[tokio::test]
async fn agents_that_share_a_host_name_but_not_a_node_each_keep_their_dials() -> anyhow::Result<()> {
    const NET: u8 = 224;
    if !require_root() {
        return Ok(());
    }
    ensure_binaries()?;
    let dir = TempDir::new("one-host")?;
    let pki = TunnelPki::new(dir.path())?;
    let mut nodes = vec![node(NET, 1).await?, node(NET, 2).await?, node(NET, 3).await?];
    let server = InProc::start(&dir, "proxy-server", &server_config(&pki, NET, "dest_host, default")).await?;
    let saddrs = server.addrs()?;
    for (k, n) in (1..=3).zip(nodes.iter_mut()) {
        let mut o = AgentOpts::new("shoot-a", saddrs.listener("agents")?, &[&format!("10.{NET}.0.0/16")]);
        o.node_name = String::new();
        o.tunnel_extra = format!("  identifiers: {{ host: node-{k}, addresses: [{}] }}\n", node_addr(NET, k));
        let cfg = dir.write(&format!("agent-{k}.yaml"), &agent_yaml(&pki, &o)?)?;
        let mut cmd = n.ns.command(bin_path("proxy-agent")?);
        cmd.env_remove("NODE_NAME").env_remove("HOST_IP").env_remove("HOST_IPS");
        n.agent = Some(Proc::spawn_seedgate(cmd, &cfg, &[]).await?.0);
    }
    each_node_by_its_own_agent(&server, &nodes, "host").await?;
    let m = metrics(saddrs.admin()?).await?;
    let superseded =
        metric_value(&m, "seedgate_agent_sessions_doubted_total", &[("cluster", "shoot-a"), ("reason", "superseded")])
            .unwrap_or(0.0);
    assert_eq!(superseded, 0.0, "{m}");
    Ok(())
}
