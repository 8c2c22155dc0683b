//! End-to-end tests of shoots kept apart: one shoot's flood, stalled clients or dead upstream cannot take what another shoot needs, on sni-router (by route) and proxy-server (by cluster); an agent only ever gets its own cluster's dials.
//!
//! The binaries run in this process (`bind` → `run`), each with its own metrics registry. Every
//! process limit here is 40 with `tenant_share: 0.25`: a tenant's share is 10 when the process is
//! full and up to 20 (half the process) while the rest is idle, so a lone flooding tenant is held
//! to 20 and every refusal past that is counted under its name. Every wait polls with a deadline.

use anyhow::Context as _;
use rustls::RootCertStore;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use testbed::inproc::InProc;
use testbed::pki::provider;
use testbed::tunnel_kit::{
    AgentOpts, Fe, FeKind, SilentPort, TunnelPki, agent_yaml, connect_tcp, refusal_of, server_yaml, wait_agents,
};
use testbed::{TcpEcho, TempDir, http_get, metric_sum, metric_value, poll_until};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const WAIT: Duration = Duration::from_secs(30);
const TICK: Duration = Duration::from_millis(20);
/// Connections shoot A opens: far past its share.
const FLOOD: usize = 60;
/// A lone tenant's most: half of each process limit (40) of these tests.
const HALF: usize = 20;

fn value(m: &str, name: &str, labels: &[(&str, &str)]) -> usize {
    metric_value(m, name, labels).unwrap_or(0.0) as usize
}

/// The ClientHello rustls sends for `name` (the router routes by it; the echo backend returns it).
fn client_hello(name: &str) -> anyhow::Result<Vec<u8>> {
    let cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(RootCertStore::empty())
        .with_no_client_auth();
    let mut c = rustls::ClientConnection::new(Arc::new(cfg), name.to_owned().try_into()?)?;
    let mut out = Vec::new();
    c.write_tls(&mut out)?;
    Ok(out)
}

/// sni-router in this process: `gateway` routes `*.shoot-a.example.com` to `a` and
/// `*.shoot-b.example.com` to `b`; `limits` is its `limits:` line.
async fn router(limits: &str, a: SocketAddr, b: SocketAddr) -> anyhow::Result<(TempDir, InProc)> {
    let yaml = format!(
        "admin: {{ listen: 127.0.0.1:0 }}\ndrain_grace: 1s\n\
         timeouts: {{ handshake: 60s, handshake_floor: 60s, connect: 60s }}\n{limits}\
         listeners:\n  - name: gateway\n    listen: 127.0.0.1:0\n    routes:\n\
         \x20     - name: shoot-a\n        sni: [\"*.shoot-a.example.com\"]\n        upstreams: [{a}]\n\
         \x20     - name: shoot-b\n        sni: [\"*.shoot-b.example.com\"]\n        upstreams: [{b}]\n"
    );
    let dir = TempDir::new("tenant-routes")?;
    let r = InProc::start(&dir, "sni-router", &yaml).await?;
    Ok((dir, r))
}

/// Send `hello` on a new connection. `Some` when it was routed to the echo (which returns it),
/// `None` when the router refused it (a TLS alert).
async fn open(gw: SocketAddr, hello: &[u8]) -> anyhow::Result<Option<TcpStream>> {
    let mut s = TcpStream::connect(gw).await?;
    s.write_all(hello).await?;
    let mut back = vec![0u8; hello.len()];
    tokio::time::timeout(WAIT, s.read_exact(&mut back[..1])).await.context("no answer")??;
    match back[0] {
        0x15 => Ok(None),
        0x16 => {
            tokio::time::timeout(WAIT, s.read_exact(&mut back[1..])).await??;
            anyhow::ensure!(back == hello, "the echo returns the hello");
            Ok(Some(s))
        }
        b => anyhow::bail!("unexpected first byte {b:#04x}"),
    }
}

/// An established connection still carries bytes both ways.
async fn still_flowing(s: &mut TcpStream) -> anyhow::Result<()> {
    s.write_all(b"still flowing").await?;
    let mut back = [0u8; 13];
    tokio::time::timeout(WAIT, s.read_exact(&mut back)).await??;
    anyhow::ensure!(&back == b"still flowing", "the established connection's echo");
    Ok(())
}

/// Poll until `expect_held` of shoot A's [`FLOOD`] clients are counted as pending work of its
/// `tenant` (`route` or `cluster`) and the rest as refused (or evicted) for its pending share:
/// the metrics then, or the counts last seen in the error. A newcomer can be counted pending a
/// moment before the client it evicts is counted refused, so the sum alone is reached in passing.
async fn pending_or_refused(p: &InProc, tenant: &str, expect_held: usize) -> anyhow::Result<String> {
    let (held, rejects) = (format!("seedgate_{tenant}_pending"), format!("seedgate_{tenant}_limit_rejects_total"));
    let counts = |m: &str| {
        (value(m, &held, &[(tenant, "shoot-a")]), value(m, &rejects, &[(tenant, "shoot-a"), ("limit", "pending")]))
    };
    let settled = poll_until(WAIT, TICK, || async {
        let m = p.metrics();
        (counts(&m) == (expect_held, FLOOD - expect_held)).then_some(m)
    })
    .await;
    settled.with_context(|| {
        let m = p.metrics();
        format!("(held, refused) = {:?}, want ({expect_held}, {}):\n{m}", counts(&m), FLOOD - expect_held)
    })
}

async fn readiness(admin: SocketAddr) -> anyhow::Result<String> {
    let (code, body) = http_get(admin, "/readyz?verbose").await?;
    anyhow::ensure!(code == 200, "a tenant at its share is not a fault: {code} {body}");
    Ok(body)
}

/// Shoot A's clients open routed connections far past its share: A is held to half the
/// process, the rest is refused at once (a TLS alert) and counted under A's route; a shoot-B
/// client is routed at once and B's established connection keeps flowing.
#[tokio::test]
async fn a_flooding_route_is_held_to_its_share_of_connections() -> anyhow::Result<()> {
    let (echo_a, echo_b) = (TcpEcho::start().await?, TcpEcho::start().await?);
    let (_dir, r) =
        router("limits: { max_connections: 40, tenant_share: 0.25 }\n", echo_a.addr(), echo_b.addr()).await?;
    let gw = r.listener("gateway")?;
    let (hello_a, hello_b) = (client_hello("api.shoot-a.example.com")?, client_hello("api.shoot-b.example.com")?);
    let mut est_b = open(gw, &hello_b).await?.context("shoot-b's first connection")?;

    let (mut held, mut refused) = (Vec::new(), 0);
    for _ in 0..FLOOD {
        match open(gw, &hello_a).await? {
            Some(s) => held.push(s),
            None => refused += 1,
        }
    }
    assert_eq!(held.len(), HALF, "shoot-a alone is held to half the process limit");
    assert_eq!(refused, FLOOD - HALF);

    let mut b = open(gw, &hello_b).await?.context("a new shoot-b client is routed while shoot-a floods")?;
    still_flowing(&mut b).await?;
    still_flowing(&mut est_b).await?;

    let m = r.metrics();
    let a = [("route", "shoot-a")];
    assert_eq!(value(&m, "seedgate_route_connections", &a), HALF, "{m}");
    assert_eq!(value(&m, "seedgate_route_limit_rejects_total", &[a[0], ("limit", "connections")]), refused);
    let result = [a[0], ("result", "route_connection_limit")];
    assert_eq!(value(&m, "seedgate_connections_total", &result), refused);
    assert_eq!(value(&m, "seedgate_rejects_total", &[("reason", "route_connection_limit")]), refused);
    assert_eq!(value(&m, "seedgate_route_connections", &[("route", "shoot-b")]), 2);
    assert_eq!(metric_sum(&m, "seedgate_route_limit_rejects_total", &[("route", "shoot-b")]), 0.0);
    let ready = readiness(r.admin()?).await?;
    assert!(ready.contains("[i]route-shares info: ") && ready.contains("shoot-a (connections 20/20)"), "{ready}");
    assert!(ready.contains(&format!("refused so far: shoot-a {refused}")), "{ready}");
    drop(held);
    Ok(())
}

/// Shoot A's upstream takes connects and never answers them: A's routed connections wait in
/// their connect, held to A's pending share; the rest are refused at once and counted under A.
/// Shoot B is routed and connected at once.
#[tokio::test]
async fn a_dead_upstream_holds_only_its_routes_share_of_connects() -> anyhow::Result<()> {
    let silent = SilentPort::start_on("127.0.0.1:0".parse()?).await?;
    let echo_b = TcpEcho::start().await?;
    let (_dir, r) = router("limits: { max_pending: 40, tenant_share: 0.25 }\n", silent.addr(), echo_b.addr()).await?;
    let gw = r.listener("gateway")?;
    let (hello_a, hello_b) = (client_hello("api.shoot-a.example.com")?, client_hello("api.shoot-b.example.com")?);
    let mut est_b = open(gw, &hello_b).await?.context("shoot-b's first connection")?;

    let mut waiting = Vec::new();
    for _ in 0..FLOOD {
        let mut s = TcpStream::connect(gw).await?;
        s.write_all(&hello_a).await?;
        waiting.push(s);
    }
    pending_or_refused(&r, "route", HALF).await.context("every shoot-a connection connecting or refused")?;
    // One scrape is not one instant: a burst of refusals can land between the reading of
    // `seedgate_connections_total` and that of the route's counters, so this one is polled too.
    let result = [("route", "shoot-a"), ("result", "route_pending_limit")];
    poll_until(WAIT, TICK, || async {
        (value(&r.metrics(), "seedgate_connections_total", &result) == FLOOD - HALF).then_some(())
    })
    .await
    .with_context(|| {
        format!("{} connections counted refused for the route's pending share:\n{}", FLOOD - HALF, r.metrics())
    })?;

    let mut b = open(gw, &hello_b).await?.context("shoot-b is routed and connected while shoot-a's connects hang")?;
    still_flowing(&mut b).await?;
    still_flowing(&mut est_b).await?;
    let ready = readiness(r.admin()?).await?;
    assert!(ready.contains("shoot-a (pending 20/20)"), "{ready}");
    drop(waiting);
    Ok(())
}

/// proxy-server with front ends `fe-a` (cluster shoot-a) and `fe-b` (shoot-b), limits 40 and
/// `tenant_share: 0.25`, and an agent in this process for each of `clusters`, allowed 127.0.0.1.
struct Seed {
    server: InProc,
    agents: Vec<(String, InProc)>,
    _dir: TempDir,
}

impl Seed {
    async fn start(clusters: &[&str]) -> anyhow::Result<Self> {
        let dir = TempDir::new("tenant-clusters")?;
        let pki = TunnelPki::new(dir.path())?;
        let fes = [Fe::new("fe-a", "shoot-a", FeKind::Plain), Fe::new("fe-b", "shoot-b", FeKind::Plain)];
        let extra = "drain_grace: 1s\nlimits: { max_connections: 40, max_pending: 40, tenant_share: 0.25 }\n\
                     timeouts: { handshake: 60s, handshake_floor: 60s }\n";
        let server = InProc::start(&dir, "proxy-server", &server_yaml(&pki, "127.0.0.1:0", &fes, extra)).await?;
        let mut agents = Vec::new();
        for c in clusters {
            let o = AgentOpts::new(c, server.listener("agents")?, &["127.0.0.1/32"]);
            agents.push((c.to_string(), InProc::start(&dir, "proxy-agent", &agent_yaml(&pki, &o)?).await?));
            wait_agents(server.admin()?, c, 1.0).await?;
        }
        Ok(Self { server, agents, _dir: dir })
    }

    /// Dials agent `cluster` received: opened and refused.
    fn dials(&self, cluster: &str) -> f64 {
        let (_, agent) = self.agents.iter().find(|(c, _)| c == cluster).expect("an agent of that cluster");
        let m = agent.metrics();
        metric_sum(&m, "seedgate_tunnel_streams_opened_total", &[])
            + metric_sum(&m, "seedgate_tunnel_dial_failures_total", &[])
    }
}

/// A CONNECT through `fe` to an echo; `Ok(None)` when answered 503 (over capacity).
async fn connect_echo(fe: SocketAddr, echo: SocketAddr) -> anyhow::Result<Option<TcpStream>> {
    match connect_tcp(fe, &echo.to_string()).await {
        Ok((mut s, _)) => {
            still_flowing(&mut s).await?;
            Ok(Some(s))
        }
        Err(e) => match refusal_of(&e) {
            Some(r) if r.status == 503 && r.body.contains("holds its share") => Ok(None),
            _ => Err(e),
        },
    }
}

/// Cluster A's front end opens tunnel streams far past A's share: A is held to half the
/// process, the rest answered 503 and counted under A; a CONNECT to cluster B goes through at
/// once and B's established stream keeps flowing. And whatever the load, each agent gets only
/// its own cluster's dials.
#[tokio::test]
async fn a_flooding_cluster_is_held_to_its_share_of_streams() -> anyhow::Result<()> {
    let seed = Seed::start(&["shoot-a", "shoot-b"]).await?;
    let (fe_a, fe_b) = (seed.server.listener("fe-a")?, seed.server.listener("fe-b")?);
    let (echo_a, echo_b) = (TcpEcho::start().await?, TcpEcho::start().await?);
    let mut est_b = connect_echo(fe_b, echo_b.addr()).await?.context("shoot-b's first stream")?;

    let (mut held, mut refused) = (Vec::new(), 0);
    for _ in 0..FLOOD {
        match connect_echo(fe_a, echo_a.addr()).await? {
            Some(s) => held.push(s),
            None => refused += 1,
        }
    }
    assert_eq!(held.len(), HALF, "shoot-a alone is held to half the process limit");
    assert_eq!(refused, FLOOD - HALF);
    let mut b = connect_echo(fe_b, echo_b.addr()).await?.context("a shoot-b CONNECT while shoot-a floods")?;
    still_flowing(&mut b).await?;
    still_flowing(&mut est_b).await?;

    let m = seed.server.metrics();
    let a = ("cluster", "shoot-a");
    assert_eq!(value(&m, "seedgate_cluster_streams", &[a]), HALF, "{m}");
    assert_eq!(value(&m, "seedgate_cluster_limit_rejects_total", &[a, ("limit", "streams")]), refused);
    let result = [("listener", "fe-a"), ("route", "shoot-a"), ("result", "cluster_stream_limit")];
    assert_eq!(value(&m, "seedgate_connections_total", &result), refused);
    let code = [("frontend", "fe-a"), ("kind", "connect"), ("code", "503")];
    assert_eq!(value(&m, "seedgate_frontend_requests_total", &code), refused);
    assert_eq!(metric_sum(&m, "seedgate_cluster_limit_rejects_total", &[("cluster", "shoot-b")]), 0.0);
    // Refused for its share is not a failed dial: no agent was asked.
    assert_eq!(metric_sum(&m, "seedgate_tunnel_dial_failures_total", &[]), 0.0);
    // Each agent got exactly its own cluster's dials.
    assert_eq!(seed.dials("shoot-a"), HALF as f64);
    assert_eq!(seed.dials("shoot-b"), 2.0);
    assert_eq!((echo_a.connections(), echo_b.connections()), (HALF as u64, 2));
    let ready = readiness(seed.server.admin()?).await?;
    assert!(ready.contains("[i]cluster-shares info: ") && ready.contains("shoot-a (streams 20/20)"), "{ready}");
    drop(held);
    Ok(())
}

/// Cluster A's clients open front-end connections and stall before their request head, far past
/// the front ends' pending budget (40), while one cluster-B client is slow with its head: A's
/// newcomers evict A's own oldest (counted under A), never B's. A holds what B leaves of the
/// budget; B's slow client is served when its head is complete, and a new B CONNECT at once.
#[tokio::test]
async fn stalled_clients_of_one_cluster_make_room_among_themselves() -> anyhow::Result<()> {
    const MAX_PENDING: usize = 40;
    let seed = Seed::start(&["shoot-a", "shoot-b"]).await?;
    let (fe_a, fe_b) = (seed.server.listener("fe-a")?, seed.server.listener("fe-b")?);
    let echo_b = TcpEcho::start().await?;
    let mut est_b = connect_echo(fe_b, echo_b.addr()).await?.context("shoot-b's first stream")?;

    // B's slow client sends the first bytes of its head, and is pending.
    let head = format!("CONNECT {0} HTTP/1.1\r\nHost: {0}\r\n\r\n", echo_b.addr());
    let mut slow_b = TcpStream::connect(fe_b).await?;
    slow_b.write_all(&head.as_bytes()[..8]).await?;
    poll_until(WAIT, TICK, || async {
        (value(&seed.server.metrics(), "seedgate_cluster_pending", &[("cluster", "shoot-b")]) == 1).then_some(())
    })
    .await
    .context("shoot-b's slow client pending")?;

    let mut stalled = Vec::new();
    for _ in 0..FLOOD {
        let mut s = TcpStream::connect(fe_a).await?;
        // Evicted at once is fine: the write error says only that.
        let _ = s.write_all(b"CONN").await;
        stalled.push(s);
    }
    let m = pending_or_refused(&seed.server, "cluster", MAX_PENDING - 1)
        .await
        .context("every stalled shoot-a client pending or evicted")?;
    let refused = FLOOD - (MAX_PENDING - 1);
    assert_eq!(value(&m, "seedgate_pending_rejects_total", &[("reason", "evicted")]), refused);
    assert_eq!(value(&m, "seedgate_cluster_pending", &[("cluster", "shoot-b")]), 1, "{m}");

    // B's slow client was never evicted: its head completes and it is served.
    slow_b.write_all(&head.as_bytes()[8..]).await?;
    let mut answer = [0u8; 12];
    tokio::time::timeout(WAIT, slow_b.read_exact(&mut answer)).await??;
    anyhow::ensure!(answer.starts_with(b"HTTP/1.1 200"), "{:?}", String::from_utf8_lossy(&answer));
    let mut b = connect_echo(fe_b, echo_b.addr()).await?.context("a shoot-b CONNECT while shoot-a's clients stall")?;
    still_flowing(&mut b).await?;
    still_flowing(&mut est_b).await?;
    // No stalled client got as far as a dial.
    assert_eq!((seed.dials("shoot-a"), seed.dials("shoot-b")), (0.0, 3.0));
    let m = seed.server.metrics();
    assert_eq!(metric_sum(&m, "seedgate_cluster_limit_rejects_total", &[("cluster", "shoot-b")]), 0.0);
    let ready = readiness(seed.server.admin()?).await?;
    assert!(ready.contains(&format!("refused so far: shoot-a {refused}")), "{ready}");
    drop(stalled);
    Ok(())
}

/// A cluster alone on its proxy-server (no other cluster has an agent) is held by the process
/// limits only: nobody else could use what a share would keep free. 30 streams, more than the
/// half a share would allow (20) and fewer than the process limit (40), all go through.
#[tokio::test]
async fn a_cluster_alone_on_its_proxy_server_may_use_the_whole_process() -> anyhow::Result<()> {
    const STREAMS: usize = HALF + 10;
    let seed = Seed::start(&["shoot-a"]).await?;
    let fe_a = seed.server.listener("fe-a")?;
    let echo = TcpEcho::start().await?;
    let mut held = Vec::new();
    for _ in 0..STREAMS {
        held.push(connect_echo(fe_a, echo.addr()).await?.context("a stream of the lone cluster")?);
    }
    let m = seed.server.metrics();
    assert_eq!(value(&m, "seedgate_cluster_streams", &[("cluster", "shoot-a")]), STREAMS, "{m}");
    assert_eq!(metric_sum(&m, "seedgate_cluster_limit_rejects_total", &[]), 0.0, "{m}");
    for s in &mut held {
        still_flowing(s).await?;
    }
    Ok(())
}
