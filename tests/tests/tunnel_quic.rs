//! End-to-end tests of the tunnel's QUIC transport: the real proxy-server (`agents.quic`) and
//! proxy-agent (`tunnel.transport: quic`) binaries on loopback, with nothing listening on TCP at
//! the address the agent dials.

use anyhow::Context as _;
use std::time::Duration;
use testbed::tunnel_kit::{
    AgentOpts, ChecksumSink, Dialer, End, Fe, FeKind, Pattern, STEP, TunnelPki, Watcher, agent_yaml, connect,
    connect_tcp, metrics, parse_sum_line, read_checksum, refusal_of, server_yaml, start_agent, start_server,
    wait_agents, write_pattern,
};
use testbed::{Addresses, Proc, TcpEcho, TempDir, http_get, metric_value, poll_until};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};

const TICK: Duration = Duration::from_millis(20);
const MIB: u64 = 1024 * 1024;

struct World {
    dir: TempDir,
    pki: TunnelPki,
    server: Proc,
    saddrs: Addresses,
    agent: Proc,
    aaddrs: Addresses,
}

fn agent_opts(w_saddrs: &Addresses) -> anyhow::Result<AgentOpts> {
    let mut o = AgentOpts::new("shoot-a", w_saddrs.listener("agents-quic")?, &["127.0.0.1/32"]);
    o.tunnel_extra = "  transport: quic\n".into();
    Ok(o)
}

impl World {
    async fn start() -> anyhow::Result<Self> {
        let dir = TempDir::new("tunnel-quic")?;
        let pki = TunnelPki::new(dir.path())?;
        let fe = Fe::new("egress", "shoot-a", FeKind::Plain);
        let mut yaml = server_yaml(&pki, "127.0.0.1:0", &[fe], "");
        // `agents:` is the first block; its keys are indented by two spaces.
        yaml = yaml.replacen("agents:\n", "agents:\n  quic: { listen: 127.0.0.1:0 }\n", 1);
        let (server, saddrs) = start_server(&dir, "server", &yaml).await?;
        let quic = saddrs.listener("agents-quic")?;
        // Nothing takes TCP there: the agent can only be using UDP.
        assert!(std::net::TcpStream::connect(quic).is_err(), "something listens on TCP at {quic}");
        let (agent, aaddrs) = start_agent(&dir, "agent", &agent_yaml(&pki, &agent_opts(&saddrs)?)?, None).await?;
        wait_agents(saddrs.admin()?, "shoot-a", 1.0)
            .await
            .with_context(|| format!("server log:\n{}\nagent log:\n{}", server.log(), agent.log()))?;
        Ok(Self { dir, pki, server, saddrs, agent, aaddrs })
    }

    fn egress(&self) -> anyhow::Result<Dialer> {
        Ok(Dialer::Tcp(self.saddrs.listener("egress")?))
    }

    fn logs(&self) -> String {
        format!("--- proxy-server log:\n{}\n--- proxy-agent log:\n{}", self.server.log(), self.agent.log())
    }
}

/// A CONNECT through the front end reaches an echo backend over the QUIC session; the agent's
/// readiness and metrics name the transport.
#[tokio::test]
async fn connect_over_quic_and_readiness_says_quic() -> anyhow::Result<()> {
    let w = World::start().await?;
    let echo = TcpEcho::start().await?;
    let mut s = connect(&w.egress()?, &echo.addr().to_string()).await.with_context(|| w.logs())?;
    s.write_all(b"over quic").await?;
    s.shutdown().await?;
    let mut back = Vec::new();
    tokio::time::timeout(STEP, s.read_to_end(&mut back)).await.context("echo timed out")??;
    assert_eq!(back, b"over quic");

    let (code, body) = http_get(w.aaddrs.admin()?, "/readyz?verbose").await?;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("transport quic"), "{body}");
    let m = metrics(w.aaddrs.admin()?).await?;
    let server = w.saddrs.listener("agents-quic")?.to_string();
    assert_eq!(
        metric_value(&m, "seedgate_tunnel_transport_info", &[("server", &server), ("transport", "quic")]),
        Some(1.0),
        "{m}"
    );
    let (code, body) = http_get(w.saddrs.admin()?, "/readyz?verbose").await?;
    assert!(code == 200 && body.contains("shoot-a-node-1"), "{code}: {body}");
    Ok(())
}

/// 16 MiB both ways at once, checksummed.
#[tokio::test]
async fn large_transfer_both_ways() -> anyhow::Result<()> {
    let w = World::start().await?;
    let echo = TcpEcho::start().await?;
    const LEN: u64 = 16 * MIB;
    let s = connect(&w.egress()?, &echo.addr().to_string()).await?;
    let (mut r, mut wr) = tokio::io::split(s);
    let writer = async {
        let f = write_pattern(&mut wr, 42, LEN).await?;
        wr.shutdown().await?;
        std::io::Result::Ok(f)
    };
    let (sent, got) =
        tokio::time::timeout(Duration::from_secs(120), async { tokio::try_join!(writer, read_checksum(&mut r)) })
            .await
            .with_context(|| format!("transfer did not finish\n{}", w.logs()))??;
    assert_eq!(got, (LEN, sent));
    Ok(())
}

/// Half-close: the client's FIN reaches the backend, which answers and sends more afterwards.
#[tokio::test]
async fn half_close() -> anyhow::Result<()> {
    let w = World::start().await?;
    const TRAILER: u64 = MIB;
    let sink = ChecksumSink::start_on("127.0.0.1:0".parse()?, TRAILER).await?;
    let s = connect(&w.egress()?, &sink.addr().to_string()).await?;
    let (r, mut wr) = tokio::io::split(s);
    let sent = write_pattern(&mut wr, 5, 2 * MIB).await?;
    wr.shutdown().await?;
    let mut r = BufReader::new(r);
    let mut line = String::new();
    tokio::time::timeout(STEP, r.read_line(&mut line))
        .await
        .with_context(|| format!("our FIN never reached the backend\n{}", w.logs()))??;
    assert_eq!(parse_sum_line(&line)?, (2 * MIB, sent));
    let got = tokio::time::timeout(STEP, read_checksum(&mut r)).await??;
    assert_eq!(got, (TRAILER, Pattern::checksum(2 * MIB, TRAILER)));
    Ok(())
}

/// A backend's reset reaches the client as a reset; the client's reset reaches the backend.
#[tokio::test]
async fn resets_propagate() -> anyhow::Result<()> {
    let w = World::start().await?;
    let fe = w.saddrs.listener("egress")?;
    let resetter = Watcher::start_on("127.0.0.1:0".parse()?, Some(5)).await?;
    let (mut s, _) = connect_tcp(fe, &resetter.addr().to_string()).await?;
    s.write_all(b"hello").await?;
    let mut b = [0u8; 16];
    let r = tokio::time::timeout(STEP, s.read(&mut b)).await.context("no end after the backend reset")?;
    assert!(
        matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
        "the backend reset, the client saw {r:?}\n{}",
        w.logs()
    );

    let watcher = Watcher::start_on("127.0.0.1:0".parse()?, None).await?;
    let (mut s, _) = connect_tcp(fe, &watcher.addr().to_string()).await?;
    s.write_all(b"hello").await?;
    poll_until(STEP, TICK, || async { (watcher.bytes() == 5).then_some(()) }).await?;
    s.set_zero_linger()?;
    drop(s);
    let ends = poll_until(STEP, TICK, || async { Some(watcher.ends()).filter(|e| !e.is_empty()) }).await?;
    assert_eq!(ends, [End::Reset], "the client reset its connection\n{}", w.logs());
    Ok(())
}

/// SIGKILL of the agent ends the server-side streams (QUIC idle timeout = keepalive timeout,
/// 2s); a restarted agent reconnects over QUIC and traffic flows again.
#[tokio::test]
async fn agent_sigkill_ends_streams_and_restart_reconnects() -> anyhow::Result<()> {
    let mut w = World::start().await?;
    let d = w.egress()?;
    let echo = TcpEcho::start().await?;
    let mut s = connect(&d, &echo.addr().to_string()).await?;
    s.write_all(b"abc").await?;
    let mut b = [0u8; 3];
    tokio::time::timeout(STEP, s.read_exact(&mut b)).await??;
    w.agent.signal(libc::SIGKILL)?;
    let mut b = [0u8; 16];
    match tokio::time::timeout(Duration::from_secs(2 + 8), s.read(&mut b)).await {
        Ok(Ok(0) | Err(_)) => {}
        Ok(Ok(n)) => panic!("{n} bytes after the agent died"),
        Err(_) => panic!("stream still open after the agent was killed\n{}", w.logs()),
    }
    wait_agents(w.saddrs.admin()?, "shoot-a", 0.0).await?;
    let e = match connect(&d, &echo.addr().to_string()).await {
        Ok(_) => panic!("CONNECT succeeded without an agent"),
        Err(e) => e,
    };
    let r = refusal_of(&e).with_context(|| format!("{e:#}"))?;
    assert_eq!(r.status, 503, "{r}");

    let (agent, _aaddrs) = start_agent(&w.dir, "agent2", &agent_yaml(&w.pki, &agent_opts(&w.saddrs)?)?, None).await?;
    wait_agents(w.saddrs.admin()?, "shoot-a", 1.0).await.with_context(|| agent.log())?;
    let mut s = connect(&d, &echo.addr().to_string()).await.with_context(|| agent.log())?;
    s.write_all(b"again").await?;
    let mut b = [0u8; 5];
    tokio::time::timeout(STEP, s.read_exact(&mut b)).await??;
    assert_eq!(&b, b"again");
    Ok(())
}

/// SIGTERM: the agent's going-away notice (the GOAWAY equivalent) makes the server open no new
/// stream there (503), the live stream keeps working, the agent exits once it drained.
#[tokio::test]
async fn agent_sigterm_drains() -> anyhow::Result<()> {
    let mut w = World::start().await?;
    let d = w.egress()?;
    let echo = TcpEcho::start().await?;
    let mut live = connect(&d, &echo.addr().to_string()).await?;
    w.agent.signal(libc::SIGTERM)?;
    let r = poll_until(STEP, TICK, || async {
        match connect(&d, &echo.addr().to_string()).await {
            Ok(_) => anyhow::bail!("a new stream still got through the draining agent"),
            Err(e) => refusal_of(&e).cloned().with_context(|| format!("{e:#}")),
        }
    })
    .await?;
    assert_eq!(r.status, 503, "a new CONNECT while the only agent drains: {r}\n{}", w.logs());
    live.write_all(b"still here").await?;
    let mut b = [0u8; 10];
    tokio::time::timeout(STEP, live.read_exact(&mut b)).await.context("the live stream during the agent's drain")??;
    assert_eq!(&b, b"still here");
    let st = w.agent.wait_exit(Duration::from_secs(20)).await.context("the agent did not exit after SIGTERM")?;
    assert!(st.success(), "agent exit {st}");
    wait_agents(w.saddrs.admin()?, "shoot-a", 0.0).await?;
    Ok(())
}

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
        servers.push(start_server(&dir, &format!("server-{cluster}"), &yaml).await?);
    }
    let router_yaml = format!(
        "admin: {{ listen: 127.0.0.1:0 }}\ntimeouts: {{ handshake: 2s, udp_idle: 30s }}\ndrain_grace: 1s\nlisteners:\n  - name: quic\n    listen: 127.0.0.1:0\n    protocol: udp\n    routes:\n      - name: seed-a\n        sni: [{}]\n        upstreams: [{}]\n      - name: seed-b\n        sni: [{SECOND}]\n        upstreams: [{}]\n",
        testbed::tunnel_kit::SERVER_NAME,
        servers[0].1.listener("agents-quic")?,
        servers[1].1.listener("agents-quic")?,
    );
    let cfg = dir.write("router.yaml", &router_yaml)?;
    let (router, raddrs) = Proc::start_seedgate(&testbed::bin_path("sni-router")?, &cfg, &[]).await?;
    let echo = TcpEcho::start().await?;
    let mut agents = Vec::new();
    for (i, (cluster, name)) in
        [("shoot-a", testbed::tunnel_kit::SERVER_NAME), ("shoot-b", SECOND)].into_iter().enumerate()
    {
        let mut o = AgentOpts::new(cluster, raddrs.listener("quic")?, &["127.0.0.1/32"]);
        o.tunnel_extra = "  transport: quic\n".into();
        let y = agent_yaml(&pki, &o)?
            .replace(&format!("server_name: {}", testbed::tunnel_kit::SERVER_NAME), &format!("server_name: {name}"));
        let (agent, _) = start_agent(&dir, &format!("agent-{cluster}"), &y, None).await?;
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
