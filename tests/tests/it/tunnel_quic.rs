//! The tunnel's QUIC transport through the seed's gateway: agents reach their proxy-servers
//! through sni-router's UDP listener, routed by the SNI of their QUIC Initials. The tunnel's
//! data-path scenarios over QUIC (CONNECT, bulk, half-close, resets, SIGKILL, SIGTERM) run in
//! `tunnel.rs` next to their HTTP/2 twins.

use anyhow::Context as _;
use testbed::tunnel_kit::{
    AgentOpts, Dialer, Fe, FeKind, STEP, TunnelPki, agent_yaml, connect, inproc_agent, inproc_server, metrics,
    server_yaml, start_server, wait_agents,
};
use testbed::{InProc, TcpEcho, TempDir, metric_value};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// Two proxy-servers (two seeds' tunnel names) behind one sni-router UDP listener: each agent's
/// QUIC Initials are routed by the SNI it sends (its `server_name`), so each reaches its own
/// server, and a CONNECT through each server's front end reaches its own agent.
#[tokio::test]
async fn through_sni_router_udp_listener() -> anyhow::Result<()> {
    let dir = TempDir::new("tunnel-quic-router")?;
    let pki = TunnelPki::new(dir.path())?;
    const SECOND: &str = "proxy2.seed.test";
    let (_, c2, k2) = pki.backend("proxy2", &[SECOND])?;
    let mut servers = Vec::new();
    for (cluster, cert) in [("shoot-a", None), ("shoot-b", Some((&c2, &k2)))] {
        let fe = Fe::new("egress", cluster, FeKind::Plain);
        let mut yaml = server_yaml(&pki, "127.0.0.1:0", &[fe], "").replacen(
            "agents:\n",
            "agents:\n  quic: { listen: 127.0.0.1:0 }\n",
            1,
        );
        if let Some((c, k)) = cert {
            let (c1, k1) = &pki.agents_cert;
            yaml = yaml
                .replace(&c1.display().to_string(), &c.display().to_string())
                .replace(&k1.display().to_string(), &k.display().to_string());
        }
        servers.push(inproc_server(&dir, &yaml).await?);
    }
    let router_yaml = format!(
        "admin: {{ listen: 127.0.0.1:0 }}\ntimeouts: {{ handshake: 2s, udp_idle: 30s }}\ndrain_grace: 1s\nlisteners:\n  - name: quic\n    listen: 127.0.0.1:0\n    protocol: udp\n    routes:\n      - name: seed-a\n        sni: [{}]\n        upstreams: [{}]\n      - name: seed-b\n        sni: [{SECOND}]\n        upstreams: [{}]\n",
        testbed::tunnel_kit::SERVER_NAME,
        servers[0].1.listener("agents-quic")?,
        servers[1].1.listener("agents-quic")?,
    );
    let (router, raddrs) = InProc::serve(&dir, "sni-router", &router_yaml).await?;
    let echo = TcpEcho::start().await?;
    let mut agents = Vec::new();
    for (i, (cluster, name)) in
        [("shoot-a", testbed::tunnel_kit::SERVER_NAME), ("shoot-b", SECOND)].into_iter().enumerate()
    {
        let mut o = AgentOpts::new(cluster, raddrs.listener("quic")?, &["127.0.0.1/32"]);
        o.tunnel_extra = "  transport: quic\n".into();
        let y = agent_yaml(&pki, &o)?
            .replace(&format!("server_name: {}", testbed::tunnel_kit::SERVER_NAME), &format!("server_name: {name}"));
        let (agent, _) = inproc_agent(&dir, &y).await?;
        let (server, saddrs) = &servers[i];
        let logs =
            || format!("--- server:\n{}\n--- router:\n{}\n--- agent:\n{}", server.log(), router.log(), agent.log());
        wait_agents(saddrs.admin()?, cluster, 1.0).await.with_context(logs)?;
        let mut s =
            connect(&Dialer::Tcp(saddrs.listener("egress")?), &echo.addr().to_string()).await.with_context(logs)?;
        s.write_all(b"via the router").await?;
        s.shutdown().await?;
        let mut back = Vec::new();
        tokio::time::timeout(STEP, s.read_to_end(&mut back)).await.context("echo timed out")??;
        assert_eq!(back, b"via the router");
        agents.push(agent);
    }
    // Each server holds only its own cluster's agent.
    for ((_, saddrs), other) in servers.iter().zip(["shoot-b", "shoot-a"]) {
        let m = metrics(saddrs.admin()?).await?;
        assert_eq!(metric_value(&m, "seedgate_agents_connected", &[("cluster", other)]).unwrap_or(0.0), 0.0, "{m}");
    }
    let m = metrics(raddrs.admin()?).await?;
    for route in ["seed-a", "seed-b"] {
        assert_eq!(
            metric_value(&m, "seedgate_udp_flows_total", &[("route", route), ("result", "ok")]),
            Some(1.0),
            "{m}"
        );
    }
    Ok(())
}

/// A replica SIGKILLed and started again in place (same UDP port, same id, same key) answers
/// its predecessor's QUIC sessions with a stateless reset their agents accept: the session ends
/// at the agent's next packet and the agent dials the new replica, as an h2 session ends at the
/// kernel's reset, instead of lingering until its keepalive timeout (60 s here, longer than the
/// test's every wait).
#[tokio::test]
async fn a_replica_restarted_in_place_resets_its_predecessors_sessions() -> anyhow::Result<()> {
    let dir = TempDir::new("tunnel-quic-reset")?;
    let pki = TunnelPki::new(dir.path())?;
    let udp = std::net::UdpSocket::bind("127.0.0.1:0")?.local_addr()?;
    let long = "keepalive: { interval: 500ms, timeout: 60s }";
    let yaml = server_yaml(&pki, "127.0.0.1:0", &[Fe::new("egress", "shoot-a", FeKind::Plain)], "")
        .replacen("agents:\n", &format!("agents:\n  quic: {{ listen: {udp} }}\n  server_id: r1\n"), 1)
        .replace("keepalive: { interval: 500ms, suspect_after: 2s, timeout: 2s }", long);
    let (mut first, faddrs) = start_server(&dir, "server", &yaml).await?;
    let mut o = AgentOpts::new("shoot-a", udp, &["127.0.0.1/32"]);
    o.tunnel_extra = "  transport: quic\n".into();
    let agent_yaml =
        agent_yaml(&pki, &o)?.replace("keepalive: { interval: 500ms, suspect_after: 2s, timeout: 2s }", long);
    let (agent, _) = inproc_agent(&dir, &agent_yaml).await?;
    wait_agents(faddrs.admin()?, "shoot-a", 1.0).await.with_context(|| agent.log())?;

    first.signal(libc::SIGKILL)?;
    first.wait_exit(STEP).await.context("the server did not die")?;
    let (_second, saddrs) = start_server(&dir, "server", &yaml).await?;
    wait_agents(saddrs.admin()?, "shoot-a", 1.0).await.with_context(|| agent.log())?;
    let ended = agent.wait_log_line(&["tunnel session ended", "reset"], STEP).await?;
    assert!(!ended.contains("timed out"), "{ended}");
    Ok(())
}
