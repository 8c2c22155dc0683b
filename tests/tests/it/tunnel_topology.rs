//! Reverse-tunnel topology tests (root): the shoot is its own network namespace, joined to the
//! seed (the test's namespace) by a veth pair; proxy-agent and the shoot's backends run inside
//! it, so the seed reaches them only through the session the agent dialled out.

use anyhow::Context as _;
use std::net::SocketAddr;
use testbed::netns::{Netns, require_root, veth};
use testbed::tunnel_kit::{
    AgentOpts, Dialer, FRONTEND_NAME, Fe, FeKind, RouteGuard, STEP, SilentPort, TunnelPki, agent_yaml, connect,
    connect_strict, metrics, refusal_of, server_yaml, start_agent, start_server, tls_get_over, wait_agents,
};
use testbed::{Proc, TempDir, bin_path, metric_value};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// Start the stand-in binary inside `ns`; returns it and the address it bound.
async fn stand_in(ns: &Netns, args: &[&str]) -> anyhow::Result<(Proc, SocketAddr)> {
    let mut cmd = ns.command(bin_path("stand-in")?);
    cmd.args(args);
    let p = Proc::spawn(cmd)?;
    let line = p.wait_log_line(&["listening "], STEP).await?;
    let addr = line.trim().strip_prefix("listening ").context("stand-in output")?.parse()?;
    Ok((p, addr))
}

/// Test 1: a backend in the shoot namespace that the seed cannot reach directly is reachable
/// through the tunnel, by a strict CONNECT client (TLS end to end) and by a plain one (echo).
#[tokio::test]
async fn shoot_backend_is_reachable_only_through_the_tunnel() -> anyhow::Result<()> {
    if !require_root() {
        return Ok(());
    }
    let dir = TempDir::new("tunnel-topo")?;
    let pki = TunnelPki::new(dir.path())?;
    let shoot = Netns::create("shoot")?;
    // seed 10.213.1.1 <-> 10.213.1.2 shoot node; the kubelet/pod address 10.214.1.5 lives only
    // inside the shoot. The seed has no way there: the route below rejects it locally (so a
    // connect fails at once and no packet leaves this host whatever its default route is).
    let _link = veth(None, Some(&shoot), "10.213.1.1/24", "10.213.1.2/24")?;
    shoot.ip(&["addr", "add", "10.214.1.5/32", "dev", "lo"])?;
    let _no_route = RouteGuard::add(&["unreachable", "10.214.1.0/24"])?;

    let fes = [Fe::new("egress-mtls", "shoot-a", FeKind::Mtls), Fe::new("egress", "shoot-a", FeKind::Plain)];
    let (server, saddrs) = start_server(&dir, "server", &server_yaml(&pki, "10.213.1.1:0", &fes, "")).await?;
    let (_, cert, key) = pki.backend("kubelet", &["kubelet.shoot-a.test", "10.214.1.5"])?;
    let (_kubelet, kubelet) = stand_in(
        &shoot,
        &[
            "tls-http",
            "--listen",
            "10.214.1.5:0",
            "--cert",
            &cert.display().to_string(),
            "--key",
            &key.display().to_string(),
            "--name",
            "kubelet",
        ],
    )
    .await?;
    let (_echo, echo) = stand_in(&shoot, &["echo", "--listen", "10.214.1.5:0"]).await?;

    // The seed cannot reach the shoot's backend directly.
    let direct = tokio::time::timeout(STEP, tokio::net::TcpStream::connect(kubelet)).await;
    assert!(matches!(direct, Ok(Err(_))), "a direct connect from the seed to {kubelet} did not fail: {direct:?}");

    let o = AgentOpts::new("shoot-a", saddrs.listener("agents")?, &["10.214.1.0/24"]);
    let (agent, aaddrs) = start_agent(&dir, "agent", &agent_yaml(&pki, &o)?, Some(&shoot)).await?;
    wait_agents(saddrs.admin()?, "shoot-a", 1.0).await.with_context(|| format!("agent log:\n{}", agent.log()))?;
    // The agent's admin listener is on the shoot's loopback: not reachable from here either,
    // which is why readiness is checked from the server's side only.
    let _ = aaddrs;

    let mtls = Dialer::Tls(saddrs.listener("egress-mtls")?, pki.apiserver_tls()?, FRONTEND_NAME.into());
    let s = connect_strict(&mtls, &kubelet.to_string())
        .await
        .with_context(|| format!("server:\n{}\nagent:\n{}", server.log(), agent.log()))?;
    let resp = tls_get_over(s, &pki.ca, "kubelet.shoot-a.test", "/logs/").await?;
    assert!(
        resp.starts_with("HTTP/1.1 200") && resp.contains("backend=kubelet") && resp.contains("path=/logs/"),
        "{resp}"
    );

    let mut s = connect(&Dialer::Tcp(saddrs.listener("egress")?), &echo.to_string()).await?;
    s.write_all(b"through the tunnel").await?;
    s.shutdown().await?;
    let mut back = Vec::new();
    tokio::time::timeout(STEP, s.read_to_end(&mut back)).await??;
    assert_eq!(back, b"through the tunnel");

    // The agent's session came from the shoot's address over the veth.
    let m = metrics(saddrs.admin()?).await?;
    assert_eq!(metric_value(&m, "seedgate_tunnel_streams_opened_total", &[("cluster", "shoot-a")]), Some(2.0), "{m}");
    let (code, body) = testbed::http_get(saddrs.admin()?, "/readyz?verbose").await?;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("10.213.1.2:") && body.contains("shoot-a-node-1"), "{body}");
    Ok(())
}

/// Test 6: every dial error maps to its status with a one-line reason. The agent runs in a shoot
/// namespace whose resolver points at its own loopback (where nothing answers), so an unknown
/// name fails at once without any DNS traffic leaving.
///
/// Dial timeout: the target is a listener on the seed's veth address whose accept queue is full
/// (`listen(fd, 0)` plus one queued connection that is never accepted); the kernel drops every
/// further SYN without an answer, so the agent's connect can only time out (agent
/// `dial_timeout: 1s`, below the server's `timeouts.dial: 10s`, so it is the agent that answers).
#[tokio::test]
async fn dial_errors_map_to_statuses() -> anyhow::Result<()> {
    if !require_root() {
        return Ok(());
    }
    let dir = TempDir::new("tunnel-errors")?;
    let pki = TunnelPki::new(dir.path())?;
    let mut shoot = Netns::create("shoot")?;
    let _link = veth(None, Some(&shoot), "10.213.2.1/24", "10.213.2.2/24")?;
    shoot.set_hosts(&[("169.254.169.254", "metadata.shoot.test")])?;
    std::fs::write(
        format!("/etc/netns/{}/resolv.conf", shoot.name()),
        "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n",
    )?;

    let fes = [Fe::new("egress", "shoot-a", FeKind::Plain), Fe::new("nobody", "shoot-nobody", FeKind::Plain)];
    let (server, saddrs) = start_server(&dir, "server", &server_yaml(&pki, "10.213.2.1:0", &fes, "")).await?;
    let silent = SilentPort::start_on("10.213.2.1:0".parse()?).await?;
    let mut o = AgentOpts::new("shoot-a", saddrs.listener("agents")?, &["10.213.2.0/24", "127.0.0.0/8"]);
    o.dial_timeout = "1s".into();
    let (agent, _aaddrs) = start_agent(&dir, "agent", &agent_yaml(&pki, &o)?, Some(&shoot)).await?;
    wait_agents(saddrs.admin()?, "shoot-a", 1.0).await.with_context(|| format!("agent log:\n{}", agent.log()))?;

    let egress = Dialer::Tcp(saddrs.listener("egress")?);
    let nobody = Dialer::Tcp(saddrs.listener("nobody")?);
    let silent_target = silent.addr().to_string();
    let cases: [(&Dialer, &str, u16, &str, &str); 6] = [
        (&egress, "169.254.169.254:80", 403, "not_allowed", "allowlist"),
        (&egress, "metadata.shoot.test:80", 403, "not_allowed", "allowlist"),
        // Nothing listens on the shoot's loopback port 9.
        (&egress, "127.0.0.1:9", 502, "refused", "refused"),
        (&egress, "no-such-host.shoot.invalid:443", 502, "resolve_failed", "resolve"),
        (&egress, &silent_target, 504, "dial_timeout", "timed out"),
        (&nobody, "10.213.2.2:443", 503, "no_agent", "no agent"),
    ];
    for (d, target, status, code, text) in cases {
        let e = match connect(d, target).await {
            Ok(_) => panic!("CONNECT {target} succeeded"),
            Err(e) => e,
        };
        let r = refusal_of(&e).with_context(|| format!("{target}: {e:#}"))?;
        assert_eq!(r.status, status, "{target}: {r}\n{}", agent.log());
        assert!(
            r.body.ends_with('\n') && r.body.trim_end().lines().count() == 1 && r.body.len() > 1,
            "{target}: not a one-line reason: {r}"
        );
        assert!(r.body.to_lowercase().contains(text), "{target}: reason {:?} does not say {text:?}", r.body);
        let cluster = if status == 503 { "shoot-nobody" } else { "shoot-a" };
        let m = metrics(saddrs.admin()?).await?;
        assert!(
            metric_value(&m, "seedgate_tunnel_dial_failures_total", &[("cluster", cluster), ("reason", code)])
                .unwrap_or(0.0)
                >= 1.0,
            "{target}: no dial failure {code} counted\n{m}"
        );
    }
    // The agent itself classified its failures (the server did not time out first).
    agent.wait_log_line(&["dial refused", &format!("target={silent_target}"), "reason=\"dial_timeout\""], STEP).await?;
    agent
        .wait_log_line(&["dial refused", "target=no-such-host.shoot.invalid:443", "reason=\"resolve_failed\""], STEP)
        .await?;

    // The same answers for absolute-form requests (Prometheus' plain-HTTP targets).
    let mut s = egress.connect().await?;
    s.write_all(
        b"GET http://169.254.169.254/latest/meta-data/ HTTP/1.1\r\nHost: 169.254.169.254\r\nConnection: close\r\n\r\n",
    )
    .await?;
    let mut out = Vec::new();
    tokio::time::timeout(STEP, s.read_to_end(&mut out)).await??;
    let out = String::from_utf8_lossy(&out);
    assert!(out.starts_with("HTTP/1.1 403"), "{out}");
    drop(server);
    Ok(())
}

/// The front end must not wait on a dial forever: a shoot that never answers a SYN is covered by
/// the agent's `dial_timeout`; this checks the server's own `timeouts.dial` too, for an agent
/// whose dial outlasts it (agent `dial_timeout: 30s`, server `timeouts.dial: 1s`).
#[tokio::test]
async fn server_dial_timeout_answers_504() -> anyhow::Result<()> {
    if !require_root() {
        return Ok(());
    }
    let dir = TempDir::new("tunnel-srv-timeout")?;
    let pki = TunnelPki::new(dir.path())?;
    let shoot = Netns::create("shoot")?;
    let _link = veth(None, Some(&shoot), "10.213.3.1/24", "10.213.3.2/24")?;
    let fes = [Fe::new("egress", "shoot-a", FeKind::Plain)];
    let (_server, saddrs) =
        start_server(&dir, "server", &server_yaml(&pki, "10.213.3.1:0", &fes, "timeouts: { dial: 1s }\n")).await?;
    let silent = SilentPort::start_on("10.213.3.1:0".parse()?).await?;
    let mut o = AgentOpts::new("shoot-a", saddrs.listener("agents")?, &["10.213.3.0/24"]);
    o.dial_timeout = "30s".into();
    let (agent, _) = start_agent(&dir, "agent", &agent_yaml(&pki, &o)?, Some(&shoot)).await?;
    wait_agents(saddrs.admin()?, "shoot-a", 1.0).await?;
    let e = match connect(&Dialer::Tcp(saddrs.listener("egress")?), &silent.addr().to_string()).await {
        Ok(_) => panic!("CONNECT to a silent port succeeded"),
        Err(e) => e,
    };
    let r = refusal_of(&e).with_context(|| format!("{e:#}"))?;
    assert_eq!(r.status, 504, "{r}\n{}", agent.log());
    assert!(r.body.contains("no answer from the agent"), "{r}");
    Ok(())
}
