//! End-to-end tests of sni-router's pre-routing budget: stalled clients (three bytes of a TLS record, then nothing) cannot starve a real client, an established connection keeps flowing, every cap hit is counted.
//!
//! Stalled clients connect from 127.0.0.2 and up (all of 127.0.0.0/8 is loopback), the real
//! client from 127.0.0.1, so the per-source cap tells them apart. The handshake deadline is 60 s
//! and does not shrink, so a real client that is served while the stalled ones are still held
//! was not waiting for a deadline to free a slot. Every wait polls with a deadline.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;
use testbed::pki::client_config;
use testbed::tls_client::http_get_request;
use testbed::{
    Addresses, Ca, InProc, TcpEcho, TempDir, TlsHttpBackend, http_get, metric_value, poll_until, tls_request,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

const WAIT: Duration = Duration::from_secs(30);
const TICK: Duration = Duration::from_millis(20);
/// The router's handshake deadline in these tests: far beyond anything the test waits for.
const HANDSHAKE: Duration = Duration::from_secs(60);

/// A real ClientHello (openssl s_client, SNI api.shoot-b.example.com).
const HELLO_SHOOT_B: &[u8] = include_bytes!("../../../wire/tests/fixtures/client_hello/openssl.bin");

async fn start_router(dir: &TempDir, yaml: &str) -> anyhow::Result<(InProc, Addresses)> {
    InProc::serve(dir, "sni-router", yaml).await
}

async fn metrics(addrs: &Addresses) -> anyhow::Result<String> {
    let (code, body) = http_get(addrs.admin()?, "/metrics").await?;
    anyhow::ensure!(code == 200, "metrics answered {code}");
    Ok(body)
}

fn value(m: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    metric_value(m, name, labels).unwrap_or(0.0)
}

/// The first three bytes of a TLS handshake record.
const TLS_START: &[u8] = &[0x16, 0x03, 0x01];

/// Open a connection from `source` (a loopback address), send `start` (the beginning of what
/// the listener waits for) and stall. The listener may close it at once (per-source cap): the
/// write error is then ignored, the socket is still returned.
async fn stalled_client(source: Ipv4Addr, gw: SocketAddr, start: &[u8]) -> anyhow::Result<TcpStream> {
    let s = TcpSocket::new_v4()?;
    s.bind(SocketAddr::new(IpAddr::V4(source), 0))?;
    let mut c = tokio::time::timeout(WAIT, s.connect(gw)).await??;
    let _ = c.write_all(start).await;
    Ok(c)
}

/// Poll `/metrics` until `cond` holds for it; returns that text.
async fn metrics_until(addrs: &Addresses, what: &str, cond: impl Fn(&str) -> bool) -> anyhow::Result<String> {
    let mut last = String::new();
    let end = tokio::time::Instant::now() + WAIT;
    // Bounded by count as well as time.
    for _ in 0..(WAIT.as_millis() / TICK.as_millis()) {
        if let Ok(m) = metrics(addrs).await {
            if cond(&m) {
                return Ok(m);
            }
            last = m;
        }
        if tokio::time::Instant::now() >= end {
            break;
        }
        tokio::time::sleep(TICK).await;
    }
    let pending: Vec<&str> = last.lines().filter(|l| l.starts_with("seedgate_pending")).collect();
    anyhow::bail!("{what}: not within {WAIT:?}; last pending metrics: {pending:#?}")
}

/// sni-router with two routes on its `gateway` listener: `api.shoot-a.example.com` to a TLS
/// backend, `*.shoot-b.example.com` to an echo. `head` goes before `listeners:`.
struct Gateway {
    ca: Ca,
    _backend: TlsHttpBackend,
    _echo: TcpEcho,
    _router: InProc,
    addrs: Addresses,
}

impl Gateway {
    async fn start(dir: &TempDir, head: &str) -> anyhow::Result<Self> {
        let ca = Ca::new("seedgate-test-ca")?;
        let backend = TlsHttpBackend::start("shoot-a", &ca.server(&["api.shoot-a.example.com"])?, None).await?;
        let echo = TcpEcho::start().await?;
        let yaml = format!(
            "admin: {{ listen: 127.0.0.1:0 }}\n{head}\
             listeners:\n  - name: gateway\n    listen: 127.0.0.1:0\n    routes:\n\
             \x20     - name: shoot-a\n        sni: [api.shoot-a.example.com]\n        upstreams: [{}]\n\
             \x20     - name: echo\n        sni: [\"*.shoot-b.example.com\"]\n        upstreams: [{}]\n",
            backend.addr(),
            echo.addr()
        );
        let (router, addrs) = start_router(dir, &yaml).await?;
        Ok(Self { ca, _backend: backend, _echo: echo, _router: router, addrs })
    }

    fn gw(&self) -> anyhow::Result<SocketAddr> {
        self.addrs.listener("gateway")
    }

    /// A connection routed by its ClientHello to the echo backend, which returns the hello.
    async fn established(&self) -> anyhow::Result<TcpStream> {
        let mut est = TcpStream::connect(self.gw()?).await?;
        est.write_all(HELLO_SHOOT_B).await?;
        let mut back = vec![0u8; HELLO_SHOOT_B.len()];
        tokio::time::timeout(WAIT, est.read_exact(&mut back)).await??;
        anyhow::ensure!(back == HELLO_SHOOT_B, "the echo returns the replayed hello");
        Ok(est)
    }

    /// A real rustls client's `GET /version` to shoot-a through the router, within `limit`.
    async fn real_client(&self, limit: Duration) -> anyhow::Result<()> {
        let request = http_get_request("api.shoot-a.example.com", "/version");
        let cfg = client_config(&self.ca, None, &[])?;
        let r = tokio::time::timeout(limit, tls_request(self.gw()?, Some("api.shoot-a.example.com"), cfg, &request))
            .await??;
        anyhow::ensure!(r.body().contains("backend=shoot-a"), "{}", r.text());
        Ok(())
    }
}

/// The established connection still echoes.
async fn still_flowing(est: &mut TcpStream) -> anyhow::Result<()> {
    est.write_all(b"still flowing").await?;
    let mut back = [0u8; 13];
    tokio::time::timeout(WAIT, est.read_exact(&mut back)).await??;
    anyhow::ensure!(&back == b"still flowing", "the established connection's echo");
    Ok(())
}

#[tokio::test]
async fn stalled_clients_cannot_starve_a_real_one() -> anyhow::Result<()> {
    let dir = TempDir::new("pending-budget")?;
    // max_connections far below the number of stalled clients: before the pending budget they
    // held every slot until the deadline.
    let head = format!(
        "timeouts: {{ handshake: {0}s, handshake_floor: {0}s, connect: 2s, idle: 1h }}\n\
         drain_grace: 1s\n\
         limits: {{ max_connections: 10, max_pending: 100, pending_per_source: 40 }}\n",
        HANDSHAKE.as_secs(),
    );
    let g = Gateway::start(&dir, &head).await?;
    let (addrs, gw) = (g.addrs.clone(), g.gw()?);

    // An established connection first: routed by its ClientHello to the echo backend.
    let mut est = g.established().await?;

    // 180 stalled clients from three sources, 60 each: 40 per source are admitted, the budget
    // of 100 fills and the oldest are evicted to make room.
    let mut stalled = Vec::new();
    for src in [2u8, 3, 4] {
        for _ in 0..60 {
            stalled.push(stalled_client(Ipv4Addr::new(127, 0, 0, src), gw, TLS_START).await?);
        }
    }
    let total = stalled.len() as f64;
    let m = metrics_until(&addrs, "every stalled client pending or refused", |m| {
        let pending = value(m, "seedgate_pending_connections", &[]);
        let per_source = value(m, "seedgate_pending_rejects_total", &[("reason", "per_source")]);
        let evicted = value(m, "seedgate_pending_rejects_total", &[("reason", "evicted")]);
        pending == 100.0 && pending + per_source + evicted == total
    })
    .await?;
    assert!(value(&m, "seedgate_pending_rejects_total", &[("reason", "per_source")]) > 0.0, "per-source cap hit");
    assert!(value(&m, "seedgate_pending_rejects_total", &[("reason", "evicted")]) > 0.0, "budget full: evictions");
    let evicted_before = value(&m, "seedgate_pending_rejects_total", &[("reason", "evicted")]);

    // A real client from another source is routed and served now, while the stalled clients
    // are held; the step is bounded well below the handshake deadline.
    g.real_client(HANDSHAKE / 2).await?;

    // It took the place of the oldest stalled client; the others are still held, and none was
    // freed by the deadline.
    let m = metrics(&addrs).await?;
    assert_eq!(value(&m, "seedgate_pending_connections", &[]), 99.0, "stalled clients still held");
    assert_eq!(value(&m, "seedgate_pending_rejects_total", &[("reason", "evicted")]), evicted_before + 1.0);
    assert_eq!(value(&m, "seedgate_pending_rejects_total", &[("reason", "deadline")]), 0.0);
    assert_eq!(value(&m, "seedgate_rejects_total", &[("reason", "handshake_timeout")]), 0.0);
    // On the clients' side too: 99 stalled connections are open and unanswered (the others were
    // closed by the router; their FIN or reset may still be on its way, hence the poll).
    let open = || {
        stalled
            .iter()
            .filter(|c| matches!(c.try_read(&mut [0u8; 16]), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock))
            .count()
    };
    poll_until(WAIT, TICK, || async { (open() == 99).then_some(()).ok_or_else(|| anyhow::anyhow!("{} open", open())) })
        .await?;
    // The listener's own reject counters name the reasons too.
    assert!(value(&m, "seedgate_rejects_total", &[("reason", "pending_per_source")]) > 0.0);
    assert!(value(&m, "seedgate_rejects_total", &[("reason", "pending_evicted")]) > 0.0);
    // Two routed connections so far, far below max_connections: no wait at the limit.
    assert_eq!(value(&m, "seedgate_connection_limit_waits_total", &[]), 0.0);

    // The established connection kept flowing through all of it.
    still_flowing(&mut est).await?;

    // Readiness is unchanged by the attack; the verbose form shows the budget.
    let admin = addrs.admin()?;
    assert_eq!(http_get(admin, "/readyz").await?.0, 200);
    let (code, body) = http_get(admin, "/readyz?verbose").await?;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("[i]pending-connections info: 99/100 not yet routed"), "{body}");
    assert!(
        body.contains("[i]connection-limit info: ") && body.contains("/10 connection slots in use, below the limit"),
        "{body}"
    );
    drop(stalled);
    Ok(())
}

/// Above half the budget new connections get a shorter deadline, down to the floor when full:
/// stalled clients admitted then are closed by it and counted.
#[tokio::test]
async fn the_deadline_shrinks_under_pressure() -> anyhow::Result<()> {
    let dir = TempDir::new("pending-deadline")?;
    let echo = TcpEcho::start().await?;
    let yaml = format!(
        "admin: {{ listen: 127.0.0.1:0 }}\n\
         timeouts: {{ handshake: {}s, handshake_floor: 100ms }}\n\
         drain_grace: 1s\n\
         limits: {{ max_pending: 10, pending_per_source: 0 }}\n\
         listeners:\n  - name: gateway\n    listen: 127.0.0.1:0\n    routes:\n\
         \x20     - name: echo\n        sni: [\"*.shoot-b.example.com\"]\n        upstreams: [{}]\n",
        HANDSHAKE.as_secs(),
        echo.addr()
    );
    let (_r, addrs) = start_router(&dir, &yaml).await?;
    let gw = addrs.listener("gateway")?;
    // Ten fill the budget; the next ones meet a full budget: the floor.
    let mut stalled = Vec::new();
    for _ in 0..12 {
        stalled.push(stalled_client(Ipv4Addr::new(127, 0, 0, 2), gw, TLS_START).await?);
    }
    let m = metrics_until(&addrs, "a deadline reject", |m| {
        value(m, "seedgate_pending_rejects_total", &[("reason", "deadline")]) >= 1.0
    })
    .await?;
    assert!(value(&m, "seedgate_rejects_total", &[("reason", "handshake_timeout")]) >= 1.0);
    drop(stalled);
    Ok(())
}

/// proxy-server's front ends have the same budget for the TLS handshake and request head: with
/// stalled clients holding it, a real CONNECT from another source is answered at once (503
/// here: no agent is connected, which is the point: it got past its head).
#[tokio::test]
async fn proxy_server_front_ends_keep_answering_under_stalled_clients() -> anyhow::Result<()> {
    use testbed::tunnel_kit::{Fe, FeKind, TunnelPki, connect_tcp, inproc_server, refusal_of, server_yaml};
    let dir = TempDir::new("pending-frontend")?;
    let pki = TunnelPki::new(dir.path())?;
    let extra = format!(
        "timeouts: {{ handshake: {}s, handshake_floor: {}s }}\nlimits: {{ max_connections: 5, max_pending: 20, pending_per_source: 8 }}\n",
        HANDSHAKE.as_secs(),
        HANDSHAKE.as_secs()
    );
    let yaml = server_yaml(&pki, "127.0.0.1:0", &[Fe::new("egress", "shoot-a", FeKind::Plain)], &extra);
    let (_p, addrs) = inproc_server(&dir, &yaml).await?;
    let fe = addrs.listener("egress")?;

    let mut stalled = Vec::new();
    for src in [2u8, 3, 4] {
        for _ in 0..12 {
            stalled.push(stalled_client(Ipv4Addr::new(127, 0, 0, src), fe, b"CONN").await?);
        }
    }
    let total = stalled.len() as f64;
    let m = metrics_until(&addrs, "every stalled client pending or refused", |m| {
        let pending = value(m, "seedgate_pending_connections", &[]);
        let per_source = value(m, "seedgate_pending_rejects_total", &[("reason", "per_source")]);
        let evicted = value(m, "seedgate_pending_rejects_total", &[("reason", "evicted")]);
        pending == 20.0 && pending + per_source + evicted == total
    })
    .await?;
    assert!(value(&m, "seedgate_pending_rejects_total", &[("reason", "per_source")]) > 0.0);
    assert!(value(&m, "seedgate_pending_rejects_total", &[("reason", "evicted")]) > 0.0);

    let e =
        tokio::time::timeout(HANDSHAKE / 2, connect_tcp(fe, "10.0.0.1:443")).await?.expect_err("no agent is connected");
    let refusal = refusal_of(&e).unwrap_or_else(|| panic!("an HTTP answer, not {e:#}"));
    assert_eq!(refusal.status, 503, "{refusal}");

    let m = metrics(&addrs).await?;
    assert_eq!(value(&m, "seedgate_pending_connections", &[]), 19.0, "stalled clients still held");
    assert_eq!(value(&m, "seedgate_pending_rejects_total", &[("reason", "deadline")]), 0.0);
    assert!(value(&m, "seedgate_rejects_total", &[("reason", "pending_per_source")]) > 0.0);
    let (code, body) = http_get(addrs.admin()?, "/readyz?verbose").await?;
    assert!(body.contains("[i]pending-connections info: 19/20 not yet routed"), "{code} {body}");
    drop(stalled);
    Ok(())
}

/// At `max_connections` accepting pauses; the wait is counted and `/readyz?verbose` says the
/// process is at the limit (while `/readyz` stays ready); a freed slot lets the next one in.
#[tokio::test]
async fn at_the_connection_limit_accepting_pauses_and_says_so() -> anyhow::Result<()> {
    let dir = TempDir::new("pending-limit")?;
    let echo = TcpEcho::start().await?;
    let yaml = format!(
        "admin: {{ listen: 127.0.0.1:0 }}\n\
         drain_grace: 1s\n\
         limits: {{ max_connections: 1 }}\n\
         listeners:\n  - name: gateway\n    listen: 127.0.0.1:0\n    routes:\n\
         \x20     - name: echo\n        sni: [\"*.shoot-b.example.com\"]\n        upstreams: [{}]\n",
        echo.addr()
    );
    let (_r, addrs) = start_router(&dir, &yaml).await?;
    let gw = addrs.listener("gateway")?;
    let admin = addrs.admin()?;

    let mut first = TcpStream::connect(gw).await?;
    first.write_all(HELLO_SHOOT_B).await?;
    let mut back = vec![0u8; HELLO_SHOOT_B.len()];
    tokio::time::timeout(WAIT, first.read_exact(&mut back)).await??;

    // The second waits in the backlog: the router says it is at the limit.
    let mut second = TcpStream::connect(gw).await?;
    second.write_all(HELLO_SHOOT_B).await?;
    // Polled for both: one scrape reads the metrics one after the other, so it may see the gauge
    // of a wait whose counter it read just before the wait began.
    let m = metrics_until(&addrs, "a wait at the connection limit", |m| {
        value(m, "seedgate_connection_limit_waiting", &[]) >= 1.0
            && value(m, "seedgate_connection_limit_waits_total", &[]) >= 1.0
    })
    .await?;
    assert!(value(&m, "seedgate_connection_limit_waits_total", &[]) >= 1.0);
    let (code, body) = http_get(admin, "/readyz?verbose").await?;
    assert_eq!(code, 200, "at the limit is not a fault: {body}");
    assert!(body.contains("[i]connection-limit info: 1/1 connection slots in use, at the limit now"), "{body}");

    // A slot frees: the second is routed and echoed.
    drop(first);
    let mut back = vec![0u8; HELLO_SHOOT_B.len()];
    tokio::time::timeout(WAIT, second.read_exact(&mut back)).await??;
    assert_eq!(back, HELLO_SHOOT_B);
    let m = metrics(&addrs).await?;
    assert!(value(&m, "seedgate_connection_limit_wait_seconds_total", &[]) > 0.0);
    Ok(())
}

/// The attack as it happens, against sni-router's default pending limits (nothing under
/// `timeouts:`, and under `limits:` only `max_connections: 1000`): 2,450 stalled clients from one
/// address range (127.0.2.0/24, 70 from each of 35 addresses), more than the 1,000 connection
/// slots they could once hold and than the budget of 2,000. The budget keeps them to 2,000
/// pending, refuses what is over 64 per address and evicts the oldest; a real client from
/// another address is routed without ever waiting for a connection slot, and a connection
/// established before the attack keeps flowing. (The same at the default `max_connections` of
/// 10,000 takes more than 10,000 stalled clients: the bench's slowloris scenario measures that
/// shape, 2,500 stalled clients against 1,000 slots, next to haproxy and nginx.)
#[tokio::test]
async fn default_limits_thousands_of_stalled_clients() -> anyhow::Result<()> {
    const SOURCES: u8 = 35;
    const PER_SOURCE: usize = 70;
    let total = usize::from(SOURCES) * PER_SOURCE;
    let dir = TempDir::new("pending-defaults")?;
    let g = Gateway::start(&dir, "limits: { max_connections: 1000 }\n").await?;
    let (addrs, gw) = (g.addrs.clone(), g.gw()?);
    let mut est = g.established().await?;

    let mut stalled = Vec::with_capacity(total);
    for i in 0..total {
        let src = Ipv4Addr::new(127, 0, 2, 1 + (i / PER_SOURCE) as u8);
        stalled.push(stalled_client(src, gw, TLS_START).await?);
    }
    // Every stalled client is pending or was refused (over its address's share, evicted for a
    // newer one, or cut by the deadline that shrank under the pressure).
    let m = metrics_until(&addrs, "every stalled client pending or refused", |m| {
        let held = value(m, "seedgate_pending_connections", &[]);
        let refused: f64 = ["per_source", "evicted", "deadline"]
            .iter()
            .map(|r| value(m, "seedgate_pending_rejects_total", &[("reason", r)]))
            .sum();
        held + refused == total as f64
    })
    .await?;
    assert!(value(&m, "seedgate_pending_connections", &[]) <= 2_000.0, "the default budget bounds them");
    let per_source = value(&m, "seedgate_pending_rejects_total", &[("reason", "per_source")]);
    // At most the 6 over each address's share of 64; fewer when the deadline, shrunk by the
    // pressure, freed a place of that address while its clients were still arriving.
    let over = f64::from(SOURCES) * (PER_SOURCE - 64) as f64;
    assert!(per_source > 0.0 && per_source <= over, "per-source refusals {per_source}, at most {over}");

    g.real_client(WAIT).await?;
    // It never waited for a connection slot: stalled clients hold none.
    let m = metrics(&addrs).await?;
    assert_eq!(value(&m, "seedgate_connection_limit_waits_total", &[]), 0.0);

    still_flowing(&mut est).await?;
    drop(stalled);
    Ok(())
}

/// A burst from one address (a node pool or an agent fleet behind one cloud NAT, reconnecting at
/// once) is served with the default limits: 200 connections from 127.0.0.1 are all pending at the
/// same time, far past `pending_per_source` (64), while the budget (2,000) has room; each is then
/// routed and echoes, and none was refused for its source.
#[tokio::test]
async fn a_burst_from_one_address_is_served_while_the_budget_has_room() -> anyhow::Result<()> {
    const BURST: usize = 200;
    let dir = TempDir::new("pending-burst")?;
    let gw = Gateway::start(&dir, "").await?;
    let mut conns = Vec::with_capacity(BURST);
    for _ in 0..BURST {
        conns.push(stalled_client(Ipv4Addr::LOCALHOST, gw.gw()?, &HELLO_SHOOT_B[..TLS_START.len()]).await?);
    }
    let m = metrics_until(&gw.addrs, "the whole burst pending at once", |m| {
        value(m, "seedgate_pending_connections", &[]) == BURST as f64
    })
    .await?;
    assert_eq!(value(&m, "seedgate_pending_rejects_total", &[("reason", "per_source")]), 0.0, "{m}");
    for c in &mut conns {
        c.write_all(&HELLO_SHOOT_B[TLS_START.len()..]).await?;
    }
    for c in &mut conns {
        let mut back = vec![0u8; HELLO_SHOOT_B.len()];
        tokio::time::timeout(WAIT, c.read_exact(&mut back)).await??;
        anyhow::ensure!(back == HELLO_SHOOT_B, "the echo returns the hello");
    }
    let m = metrics(&gw.addrs).await?;
    assert_eq!(value(&m, "seedgate_pending_rejects_total", &[("reason", "per_source")]), 0.0, "{m}");
    assert_eq!(value(&m, "seedgate_pending_connections", &[]), 0.0, "{m}");
    Ok(())
}
