//! End-to-end tests of `tunnel.transport: auto`: the agent tries QUIC first, falls back to h2 over
//! TCP to the same address when QUIC does not get through, and moves to QUIC make-before-break
//! once it does (the live h2 stream keeps going).

use anyhow::Context as _;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use testbed::tunnel_kit::{
    AgentOpts, BoxStream, Dialer, Fe, FeKind, STEP, TunnelPki, agent_yaml, connect, inproc_agent, inproc_server,
    metrics, server_yaml, start_agent, wait_agents,
};
use testbed::{Addresses, InProc, Proc, TcpEcho, TempDir, http_get, metric_value, poll_until};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::UdpSocket;

const TICK: Duration = Duration::from_millis(50);

struct World {
    _dir: TempDir,
    server: InProc,
    saddrs: Addresses,
    agent: InProc,
    aaddrs: Addresses,
}

impl World {
    /// proxy-server with its TCP agents listener (and, with `quic`, a QUIC listener on a port of
    /// its own); the agent dials the TCP listener's address with `transport: auto`.
    async fn start(quic: bool) -> anyhow::Result<Self> {
        let dir = TempDir::new("tunnel-auto")?;
        let pki = TunnelPki::new(dir.path())?;
        let fe = Fe::new("egress", "shoot-a", FeKind::Plain);
        let mut yaml = server_yaml(&pki, "127.0.0.1:0", &[fe], "");
        if quic {
            yaml = yaml.replacen("agents:\n", "agents:\n  quic: { listen: 127.0.0.1:0 }\n", 1);
        }
        let (server, saddrs) = inproc_server(&dir, &yaml).await?;
        let mut o = AgentOpts::new("shoot-a", saddrs.listener("agents")?, &["127.0.0.1/32"]);
        o.tunnel_extra = "  transport: auto\n  quic_timeout: 500ms\n  quic_probe_interval: 1s\n".into();
        let (agent, aaddrs) = inproc_agent(&dir, &agent_yaml(&pki, &o)?).await?;
        wait_agents(saddrs.admin()?, "shoot-a", 1.0)
            .await
            .with_context(|| format!("server log:\n{}\nagent log:\n{}", server.log(), agent.log()))?;
        Ok(Self { _dir: dir, server, saddrs, agent, aaddrs })
    }

    fn egress(&self) -> anyhow::Result<Dialer> {
        Ok(Dialer::Tcp(self.saddrs.listener("egress")?))
    }

    fn server_label(&self) -> anyhow::Result<String> {
        Ok(self.saddrs.listener("agents")?.to_string())
    }

    fn logs(&self) -> String {
        format!("--- proxy-server log:\n{}\n--- proxy-agent log:\n{}", self.server.log(), self.agent.log())
    }

    async fn readiness(&self) -> anyhow::Result<String> {
        let (code, body) = http_get(self.aaddrs.admin()?, "/readyz?verbose").await?;
        anyhow::ensure!(code == 200, "agent not ready: {body}");
        Ok(body)
    }

    async fn metric(&self, name: &str, labels: &[(&str, &str)]) -> anyhow::Result<Option<f64>> {
        let m = metrics(self.aaddrs.admin()?).await?;
        Ok(metric_value(&m, name, labels))
    }
}

/// Send `round` through the stream and expect it back.
async fn echo_round(s: &mut BoxStream, round: u32) -> anyhow::Result<()> {
    let msg = format!("round {round:06}\n");
    s.write_all(msg.as_bytes()).await?;
    let mut back = vec![0u8; msg.len()];
    tokio::time::timeout(STEP, s.read_exact(&mut back)).await.context("echo timed out")??;
    anyhow::ensure!(back == msg.as_bytes(), "echo garbled: {:?}", String::from_utf8_lossy(&back));
    Ok(())
}

/// A one-shot CONNECT through the front end to `echo`.
async fn one_shot(w: &World, echo: &TcpEcho) -> anyhow::Result<()> {
    let mut s = connect(&w.egress()?, &echo.addr().to_string()).await?;
    s.write_all(b"hello").await?;
    s.shutdown().await?;
    let mut back = Vec::new();
    tokio::time::timeout(STEP, s.read_to_end(&mut back)).await.context("echo timed out")??;
    anyhow::ensure!(back == b"hello", "{back:?}");
    Ok(())
}

/// A UDP relay: datagrams to `listen` go to `to` from a socket per client, answers go back.
/// Dropped: the relay stops.
struct UdpRelay(tokio::task::JoinHandle<()>);

impl Drop for UdpRelay {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl UdpRelay {
    async fn start(listen: SocketAddr, to: SocketAddr) -> anyhow::Result<Self> {
        let front = Arc::new(UdpSocket::bind(listen).await.with_context(|| format!("bind UDP {listen}"))?);
        Ok(Self(tokio::spawn(async move {
            let mut peers: HashMap<SocketAddr, Arc<UdpSocket>> = HashMap::new();
            let mut tasks = tokio::task::JoinSet::new();
            let mut buf = vec![0u8; 65_536];
            loop {
                let Ok((n, from)) = front.recv_from(&mut buf).await else { return };
                let up = match peers.get(&from) {
                    Some(up) => up.clone(),
                    None => {
                        let Ok(up) = UdpSocket::bind("127.0.0.1:0").await else { return };
                        if up.connect(to).await.is_err() {
                            return;
                        }
                        let up = Arc::new(up);
                        let (back, front) = (up.clone(), front.clone());
                        tasks.spawn(async move {
                            let mut buf = vec![0u8; 65_536];
                            while let Ok(n) = back.recv(&mut buf).await {
                                let _ = front.send_to(&buf[..n], from).await;
                            }
                        });
                        peers.insert(from, up.clone());
                        up
                    }
                };
                let _ = up.send(&buf[..n]).await;
            }
        })))
    }
}

/// Nothing answers on UDP at the server's address: the agent falls back to h2, a CONNECT works,
/// and readiness and metrics say h2.
#[tokio::test]
async fn falls_back_to_h2_when_quic_does_not_get_through() -> anyhow::Result<()> {
    let w = World::start(false).await?;
    let echo = TcpEcho::start().await?;
    one_shot(&w, &echo).await.with_context(|| w.logs())?;
    let body = w.readiness().await?;
    assert!(body.contains("over h2") && body.contains("transport auto"), "{body}");
    let server = w.server_label()?;
    assert_eq!(
        w.metric("seedgate_tunnel_transport_info", &[("server", &server), ("transport", "h2")]).await?,
        Some(1.0)
    );
    assert_eq!(
        w.metric("seedgate_tunnel_transport_info", &[("server", &server), ("transport", "quic")]).await?,
        Some(0.0)
    );
    let fallbacks = w
        .metric("seedgate_tunnel_transport_changes_total", &[("server", &server), ("from", "quic"), ("to", "h2")])
        .await?;
    assert!(fallbacks.is_some_and(|n| n >= 1.0), "{fallbacks:?}");
    Ok(())
}

/// The agent runs over h2 because UDP at the dialled address reaches nothing; then QUIC becomes
/// reachable there (a UDP relay to the server's QUIC listener on the same port): within the
/// probe interval the agent moves to QUIC, and the stream opened over h2 keeps echoing.
#[tokio::test]
async fn moves_to_quic_once_it_gets_through_without_cutting_streams() -> anyhow::Result<()> {
    let w = World::start(true).await?;
    let echo = TcpEcho::start().await?;
    let body = w.readiness().await?;
    assert!(body.contains("over h2"), "{body}");
    let mut long = connect(&w.egress()?, &echo.addr().to_string()).await.with_context(|| w.logs())?;
    let mut round = 0;
    echo_round(&mut long, round).await?;

    // UDP on the TCP agents listener's port now reaches the QUIC listener.
    let _relay = UdpRelay::start(w.saddrs.listener("agents")?, w.saddrs.listener("agents-quic")?).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        round += 1;
        echo_round(&mut long, round).await.with_context(|| format!("the h2 stream broke\n{}", w.logs()))?;
        if w.readiness().await?.contains("over quic") {
            break;
        }
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "never moved to QUIC\n{}", w.logs());
        tokio::time::sleep(TICK).await;
    }
    // The stream opened over h2 keeps going after the move.
    for _ in 0..20 {
        round += 1;
        echo_round(&mut long, round)
            .await
            .with_context(|| format!("the h2 stream broke after the move\n{}", w.logs()))?;
        tokio::time::sleep(TICK).await;
    }
    // New streams go over QUIC; the agent holds one session again once the h2 one ends.
    one_shot(&w, &echo).await.with_context(|| w.logs())?;
    let server = w.server_label()?;
    assert_eq!(
        w.metric("seedgate_tunnel_transport_changes_total", &[("server", &server), ("from", "h2"), ("to", "quic")])
            .await?,
        Some(1.0)
    );
    assert_eq!(
        w.metric("seedgate_tunnel_transport_info", &[("server", &server), ("transport", "quic")]).await?,
        Some(1.0)
    );
    let body = w.readiness().await?;
    assert!(body.contains("connected: 1 of 1") && !body.contains("over h2"), "{body}");
    drop(long);
    poll_until(STEP, TICK, || async { wait_agents(w.saddrs.admin()?, "shoot-a", 1.0).await })
        .await
        .with_context(|| w.logs())?;
    Ok(())
}

/// Connection migration (root): the agent runs in its own network namespace over QUIC with a
/// stream echoing; its address changes (a new address becomes the source of the route to the
/// seed, the old one is deleted) and the stream keeps echoing over the same QUIC session.
#[tokio::test]
async fn quic_session_survives_an_agent_address_change() -> anyhow::Result<()> {
    migration(None).await
}

/// The same with the agent reaching proxy-server through sni-router's UDP listener, as in a
/// seed: the router's flow follows the agent to its new address by the connection ID.
#[tokio::test]
async fn quic_session_survives_an_agent_address_change_through_the_gateway() -> anyhow::Result<()> {
    migration(Some("gw")).await
}

/// `router`: the name of the sni-router's UDP listener the agent dials, if any. Each case has
/// its own addresses (10.215/10.216 direct, 10.225/10.226 through the router), so both can run
/// at once.
async fn migration(router: Option<&str>) -> anyhow::Result<()> {
    use testbed::netns::{Netns, require_root, veth};
    use testbed::tunnel_kit::RouteGuard;
    if !require_root() {
        return Ok(());
    }
    let n = if router.is_some() { 225 } else { 215 };
    let (seed, node, moved, backend) =
        (format!("10.{n}.1.1"), format!("10.{n}.1.2"), format!("10.{n}.9.2"), format!("10.{}.1.5", n + 1));
    let dir = TempDir::new("tunnel-migrate")?;
    let pki = TunnelPki::new(dir.path())?;
    let shoot = Netns::create(if router.is_some() { "migr-gw" } else { "migr" })?;
    // seed <-> shoot node (later `moved`); the backend is on the shoot's loopback, reachable
    // only through the tunnel.
    let link = veth(None, Some(&shoot), &format!("{seed}/24"), &format!("{node}/24"))?;
    shoot.ip(&["addr", "add", &format!("{backend}/32"), "dev", "lo"])?;
    let fe = Fe::new("egress", "shoot-a", FeKind::Plain);
    let yaml = server_yaml(&pki, &format!("{seed}:0"), &[fe], "").replacen(
        "agents:\n",
        &format!("agents:\n  quic: {{ listen: {seed}:0 }}\n"),
        1,
    );
    // The seed's binaries run in this process (the test's namespace is the seed); the agent runs
    // in the shoot's namespace.
    let (server, saddrs) = inproc_server(&dir, &yaml).await?;
    let quic = saddrs.listener("agents-quic")?;
    let gateway = match router {
        None => None,
        Some(name) => {
            let y = format!(
                "admin: {{ listen: 127.0.0.1:0 }}\nlisteners:\n  - name: {name}\n    listen: {seed}:0\n    protocol: udp\n    routes:\n      - name: tunnel\n        sni: [{}]\n        upstreams: [{quic}]\n",
                testbed::tunnel_kit::SERVER_NAME
            );
            Some(InProc::serve(&dir, "sni-router", &y).await?)
        }
    };
    let mut echo_cmd = shoot.command(testbed::bin_path("stand-in")?);
    echo_cmd.args(["echo", "--listen", &format!("{backend}:0")]);
    let echo_proc = Proc::spawn(echo_cmd)?;
    let line = echo_proc.wait_log_line(&["listening "], STEP).await?;
    let echo: SocketAddr = line.trim().strip_prefix("listening ").context("stand-in output")?.parse()?;

    let dial = match (&gateway, router) {
        (Some((_, raddrs)), Some(name)) => raddrs.listener(name)?,
        _ => quic,
    };
    let mut o = AgentOpts::new("shoot-a", dial, &[&format!("10.{}.1.0/24", n + 1)]);
    o.tunnel_extra = "  transport: quic\n".into();
    let (agent, _) = start_agent(&dir, "agent", &agent_yaml(&pki, &o)?, Some(&shoot)).await?;
    let logs = || {
        let router = gateway.as_ref().map(|(p, _)| p.log()).unwrap_or_default();
        format!(
            "--- proxy-server log:\n{}\n--- proxy-agent log:\n{}\n--- sni-router log:\n{router}",
            server.log(),
            agent.log()
        )
    };
    wait_agents(saddrs.admin()?, "shoot-a", 1.0).await.with_context(logs)?;

    let mut long = connect(&Dialer::Tcp(saddrs.listener("egress")?), &echo.to_string()).await.with_context(logs)?;
    let mut round = 0;
    for _ in 0..5 {
        round += 1;
        echo_round(&mut long, round).await.with_context(logs)?;
    }

    // The node's address changes: `moved` becomes the source towards the seed, then the old
    // address goes. The seed routes the new address over the same link.
    let _back = RouteGuard::add(&[&format!("{moved}/32"), "dev", &link.a])?;
    shoot.ip(&["addr", "add", &format!("{moved}/32"), "dev", &link.b])?;
    shoot.ip(&["route", "add", &format!("{seed}/32"), "dev", &link.b, "src", &moved])?;
    shoot.ip(&["addr", "del", &format!("{node}/24"), "dev", &link.b])?;

    for _ in 0..40 {
        round += 1;
        echo_round(&mut long, round)
            .await
            .with_context(|| format!("the stream broke after the address change\n{}", logs()))?;
        tokio::time::sleep(TICK).await;
    }
    // Still the one session, now from the new address.
    let m = metrics(saddrs.admin()?).await?;
    assert_eq!(metric_value(&m, "seedgate_agents_connected", &[("cluster", "shoot-a")]), Some(1.0), "{m}");
    assert!(!agent.log().contains("tunnel session ended"), "{}", logs());
    if let Some((_, raddrs)) = &gateway {
        let m = metrics(raddrs.admin()?).await?;
        assert_eq!(metric_value(&m, "seedgate_udp_flows_migrated_total", &[("route", "tunnel")]), Some(1.0), "{m}");
        assert_eq!(metric_value(&m, "seedgate_udp_flows_total", &[("route", "tunnel"), ("result", "ok")]), Some(1.0));
    }
    Ok(())
}
