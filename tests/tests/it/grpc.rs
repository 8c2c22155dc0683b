//! proxy-server's gRPC front end (`protocol: grpc`, konnectivity's `ProxyService`) with a client generated from the proto, over a Unix socket and over mTLS TCP.
//!
//! Each scenario runs over both: a dial with bytes echoed both ways, 16 MiB with a checksum, the
//! dial errors as `DIAL_RSP.error`, a dial cancelled by `DIAL_CLS`, `CLOSE_REQ` from the client,
//! the shoot side closing first (`CLOSE_RSP`), many `Proxy` streams on one gRPC connection, and
//! one gRPC connection per dial as older kube-apiservers do. And how a connection is admitted:
//! pending until its first request (cut at the deadline, evicted from a full budget), then a
//! connection slot while it lives.

use anyhow::Context as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use testbed::grpc_core::{GrpcCore, Target};
use testbed::konnectivity::{Client, Packet, Payload, close_dial, close_request, dial_request};
use testbed::tunnel_kit::{
    AgentOpts, Crc, Dialer, FRONTEND_NAME, Fe, FeKind, Pattern, SpeakFirst, TunnelPki, agent_yaml, inproc_agent,
    inproc_server, metrics, server_yaml, wait_agents,
};
use testbed::{Addresses, InProc, TcpEcho, TempDir, metric_value, poll_until};

const STEP: Duration = Duration::from_secs(10);
const TICK: Duration = Duration::from_millis(20);
const MIB: u64 = 1024 * 1024;

/// How the test's kube-apiserver reaches the front end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Via {
    Unix,
    Mtls,
}

/// One scenario body per front-end kind: `name` over the Unix socket, `name_over_mtls` over TCP.
macro_rules! over_both {
    ($body:ident: $uds:ident, $mtls:ident) => {
        #[tokio::test]
        async fn $uds() -> anyhow::Result<()> {
            $body(Via::Unix).await
        }

        #[tokio::test]
        async fn $mtls() -> anyhow::Result<()> {
            $body(Via::Mtls).await
        }
    };
}

/// proxy-server with two gRPC front ends of `shoot-a` (`uds`, `mtls`) and one agent of it.
pub(crate) struct World {
    _dir: TempDir,
    pub(crate) pki: TunnelPki,
    pub(crate) sock: PathBuf,
    pub(crate) server: InProc,
    pub(crate) saddrs: Addresses,
    pub(crate) agent: InProc,
}

/// proxy-server YAML whose front ends all speak gRPC.
pub(crate) fn grpc_server_yaml(pki: &TunnelPki, fes: &[Fe], extra: &str) -> String {
    let mut y = server_yaml(pki, "127.0.0.1:0", fes, extra);
    for f in fes {
        let line = format!("  - name: {}\n", f.name);
        y = y.replacen(&line, &format!("{line}    protocol: grpc\n"), 1);
    }
    y
}

impl World {
    pub(crate) async fn start() -> anyhow::Result<Self> {
        Self::start_with("").await
    }

    /// With `extra` top-level keys in the server's config.
    async fn start_with(extra: &str) -> anyhow::Result<Self> {
        let dir = TempDir::new("grpc")?;
        let pki = TunnelPki::new(dir.path())?;
        let sock = dir.join("kas/konnectivity-server.socket");
        let fes = [Fe::new("uds", "shoot-a", FeKind::Unix(sock.clone())), Fe::new("mtls", "shoot-a", FeKind::Mtls)];
        let (server, saddrs) = inproc_server(&dir, &grpc_server_yaml(&pki, &fes, extra)).await?;
        let o = AgentOpts::new("shoot-a", saddrs.listener("agents")?, &["127.0.0.1/32"]);
        let (agent, _) = inproc_agent(&dir, &agent_yaml(&pki, &o)?).await?;
        wait_agents(saddrs.admin()?, "shoot-a", 1.0).await.with_context(|| agent.log())?;
        Ok(Self { _dir: dir, pki, sock, server, saddrs, agent })
    }

    fn dialer(&self, via: Via) -> anyhow::Result<Dialer> {
        Ok(match via {
            Via::Unix => Dialer::Unix(self.sock.clone()),
            Via::Mtls => {
                let tls = testbed::pki::client_config(&self.pki.ca, Some(&self.pki.apiserver), &["h2"])?;
                Dialer::Tls(self.saddrs.listener("mtls")?, tls, FRONTEND_NAME.into())
            }
        })
    }

    async fn client(&self, via: Via) -> anyhow::Result<Client> {
        Client::connect(self.dialer(via)?).await
    }

    /// Where gRPC core (grpcio) reaches the front end `via`.
    pub(crate) fn grpc_core_target(&self, via: Via) -> anyhow::Result<Target> {
        Ok(match via {
            Via::Unix => Target::Unix(self.sock.clone()),
            Via::Mtls => Target::Mtls {
                addr: self.saddrs.listener("mtls")?,
                ca: self.pki.ca.cert_pem.clone(),
                cert: self.pki.apiserver.cert_pem.clone(),
                key: self.pki.apiserver.key_pem.clone(),
                server_name: FRONTEND_NAME.into(),
            },
        })
    }

    /// The front end `via` reaches: its name, the `listener` label of its metrics.
    fn listener(via: Via) -> &'static str {
        match via {
            Via::Unix => "uds",
            Via::Mtls => "mtls",
        }
    }

    /// Every `Proxy` stream ended (none is left open at the server), and both binaries run on.
    pub(crate) async fn all_streams_ended(&self) -> anyhow::Result<()> {
        let admin = self.saddrs.admin()?;
        poll_until(STEP, TICK, || async {
            let m = metrics(admin).await?;
            let active = metric_value(&m, "seedgate_tunnel_streams_active", &[("cluster", "shoot-a")]).unwrap_or(0.0);
            anyhow::ensure!(active == 0.0, "{active} streams active");
            Ok(())
        })
        .await?;
        anyhow::ensure!(self.agent.running() && self.server.running());
        Ok(())
    }

    /// The access event of a `Proxy` stream that ended with `reason`.
    pub(crate) async fn access_event(&self, reason: &str) -> anyhow::Result<String> {
        let reason = format!("reason=\"{reason}\"");
        self.server.wait_log_line(&["connection closed", "kind=\"grpc\"", &reason], STEP).await
    }
}

async fn echo_both_ways(via: Via) -> anyhow::Result<()> {
    let w = World::start().await?;
    let echo = TcpEcho::start().await?;
    let client = w.client(via).await?;
    let mut conn = client.dial(&echo.addr().to_string()).await?.map_err(anyhow::Error::msg)?;
    for msg in [&b"hello"[..], b"kubectl exec", &[0u8; 40_000]] {
        conn.send(msg.to_vec()).await?;
        anyhow::ensure!(conn.read_exact(msg.len()).await? == msg, "echo of {} bytes differs", msg.len());
    }
    // The client's CLOSE_REQ ends the connection: CLOSE_RSP, then the stream's end.
    conn.stream.tx.send(close_request(conn.connect_id)).await?;
    let rest = conn.read_to_close().await?;
    anyhow::ensure!(rest.closed && rest.data.is_empty(), "{rest:?}");
    let line = w.access_event("client_close").await?;
    for field in ["frontend=", "cluster=shoot-a", "strategy=\"default\"", "agent=shoot-a-node-1", "code=200"] {
        anyhow::ensure!(line.contains(field), "{field} not in {line}");
    }
    anyhow::ensure!(line.contains(&format!("target={}", echo.addr())), "{line}");
    Ok(())
}
over_both!(echo_both_ways: echo_and_client_close_over_uds, echo_and_client_close_over_mtls);

/// 16 MiB out through the echo backend and back, checksummed, while both directions run.
async fn sixteen_mib(via: Via) -> anyhow::Result<()> {
    let w = World::start().await?;
    let echo = TcpEcho::start().await?;
    let client = w.client(via).await?;
    let mut conn = client.dial(&echo.addr().to_string()).await?.map_err(anyhow::Error::msg)?;
    let (tx, id) = (conn.stream.tx.clone(), conn.connect_id);
    let writer = tokio::spawn(async move {
        let mut p = Pattern::new(42, 16 * MIB);
        let mut buf = vec![0u8; 32 * 1024];
        // Bounded by 16 MiB / 32 KiB.
        loop {
            let n = p.fill(&mut buf);
            if n == 0 {
                return anyhow::Ok(());
            }
            tx.send(testbed::konnectivity::data(id, buf[..n].to_vec())).await?;
        }
    });
    let mut crc = Crc::default();
    let mut got = 0u64;
    // Bounded: every packet carries at least one byte, or the loop ends with an error.
    while got < 16 * MIB {
        match conn.stream.next().await? {
            Some(Packet { payload: Some(Payload::Data(d)), .. }) if !d.data.is_empty() => {
                crc.update(&d.data);
                got += d.data.len() as u64;
            }
            other => anyhow::bail!("after {got} bytes: {other:?}"),
        }
    }
    writer.await??;
    anyhow::ensure!(got == 16 * MIB, "{got} bytes back");
    anyhow::ensure!(crc == Pattern::checksum(42, 16 * MIB), "checksum differs");
    // The client's end of stream is a half-close: the echo ends its side, which ends ours.
    drop(conn.stream.tx);
    let rest = conn.stream.rx.message().await?;
    let closed = matches!(&rest, Some(p) if matches!(p.payload, Some(Payload::CloseResponse(_))));
    anyhow::ensure!(closed, "after the half-close: {rest:?}");
    w.access_event("closed").await?;
    Ok(())
}
over_both!(sixteen_mib: sixteen_mib_checksummed_over_uds, sixteen_mib_checksummed_over_mtls);

/// Dial errors arrive as `DIAL_RSP.error`, each with its reason in the access event.
async fn dial_errors(via: Via) -> anyhow::Result<()> {
    let w = World::start().await?;
    let client = w.client(via).await?;
    let closed = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let cases = [
        (closed.to_string(), "connection refused", "refused"),
        ("192.0.2.1:80".to_owned(), "destination not allowed", "not_allowed"),
        ("no-port".to_owned(), "bad destination", "bad_target"),
    ];
    for (target, text, reason) in cases {
        let e = match client.dial(&target).await? {
            Err(e) => e,
            Ok(_) => anyhow::bail!("{target}: dialled"),
        };
        anyhow::ensure!(e.contains(text), "{target}: {e:?} does not say {text:?}");
        w.access_event(reason).await?;
    }
    Ok(())
}
over_both!(dial_errors: dial_errors_as_dial_rsp_over_uds, dial_errors_as_dial_rsp_over_mtls);

/// A listener whose accept queue is full, so a connect to it stays pending (its SYN unanswered).
pub(crate) async fn unanswered() -> anyhow::Result<(tokio::net::TcpListener, SocketAddr, Vec<tokio::net::TcpStream>)> {
    let s = tokio::net::TcpSocket::new_v4()?;
    s.bind("127.0.0.1:0".parse()?)?;
    let l = s.listen(0)?;
    let addr = l.local_addr()?;
    let mut fill = Vec::new();
    // The queue takes one or two; more connects stay pending themselves.
    for _ in 0..3 {
        if let Ok(Ok(c)) = tokio::time::timeout(Duration::from_millis(200), tokio::net::TcpStream::connect(addr)).await
        {
            fill.push(c);
        }
    }
    Ok((l, addr, fill))
}

/// `DIAL_CLS` cancels a pending dial: no `DIAL_RSP`, the stream ends, the event says so.
async fn dial_cancelled(via: Via) -> anyhow::Result<()> {
    let w = World::start().await?;
    let (_l, addr, _fill) = unanswered().await?;
    let client = w.client(via).await?;
    let random = 77;
    let mut s = client.open(dial_request(&addr.to_string(), random)).await?;
    // The agent's connect to `addr` cannot complete: the dial is pending until cancelled.
    s.tx.send(close_dial(random)).await?;
    let next = s.next().await?;
    anyhow::ensure!(next.is_none(), "after DIAL_CLS: {next:?}");
    let line = w.access_event("dial_cancelled").await?;
    anyhow::ensure!(line.contains("code=499"), "{line}");
    Ok(())
}
over_both!(dial_cancelled: dial_cancelled_by_dial_cls_over_uds, dial_cancelled_by_dial_cls_over_mtls);

/// The shoot side speaks and closes first: its bytes, then `CLOSE_RSP`.
async fn shoot_closes_first(via: Via) -> anyhow::Result<()> {
    let w = World::start().await?;
    let backend = SpeakFirst::start_on("127.0.0.1:0".parse()?, 100_000).await?;
    let client = w.client(via).await?;
    let mut conn = client.dial(&backend.addr().to_string()).await?.map_err(anyhow::Error::msg)?;
    let r = conn.read_to_close().await?;
    anyhow::ensure!(r.closed, "no CLOSE_RSP");
    let mut crc = Crc::default();
    crc.update(&r.data);
    anyhow::ensure!(
        r.data.len() == 100_000 && crc == Pattern::checksum(SpeakFirst::SEED, 100_000),
        "{} bytes",
        r.data.len()
    );
    w.access_event("closed").await?;
    Ok(())
}
over_both!(shoot_closes_first: shoot_closes_first_close_rsp_over_uds, shoot_closes_first_close_rsp_over_mtls);

/// Many `Proxy` streams at once on one gRPC connection (newer kube-apiservers), and one gRPC
/// connection per dial (older ones): each carries its own bytes.
async fn many_streams(via: Via) -> anyhow::Result<()> {
    let w = World::start().await?;
    let echo = TcpEcho::start().await?;
    let shared = w.client(via).await?;
    let target = echo.addr().to_string();
    let mut tasks = Vec::new();
    for i in 0..64u32 {
        // Even: a stream on the shared connection; odd: a connection of its own.
        let own = if i % 2 == 1 { Some(w.dialer(via)?) } else { None };
        let (shared, target) = (shared.clone(), target.clone());
        tasks.push(tokio::spawn(async move {
            let client = match own {
                Some(d) => Client::connect(d).await?,
                None => shared,
            };
            let mut conn = client.dial(&target).await?.map_err(anyhow::Error::msg)?;
            let msg = format!("stream {i} says hello").into_bytes();
            for _ in 0..3 {
                conn.send(msg.clone()).await?;
                anyhow::ensure!(conn.read_exact(msg.len()).await? == msg, "stream {i}: wrong bytes");
            }
            conn.stream.tx.send(close_request(conn.connect_id)).await?;
            anyhow::ensure!(conn.read_to_close().await?.closed, "stream {i}: no CLOSE_RSP");
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    w.all_streams_ended().await
}
over_both!(many_streams: many_streams_one_connection_and_one_per_dial_over_uds, many_streams_one_connection_and_one_per_dial_over_mtls);

/// The mTLS front end takes only clients with a certificate of its CA.
#[tokio::test]
async fn mtls_front_end_refuses_a_client_without_certificate() -> anyhow::Result<()> {
    let w = World::start().await?;
    let tls = testbed::pki::client_config(&w.pki.ca, None, &["h2"])?;
    let d = Dialer::Tls(w.saddrs.listener("mtls")?, tls, FRONTEND_NAME.into());
    let r = match Client::connect(d).await {
        Ok(c) => c.dial("127.0.0.1:1").await.map(|_| ()),
        Err(e) => Err(e),
    };
    anyhow::ensure!(r.is_err(), "a client without certificate got through");
    Ok(())
}

/// `rejects_total{listener,reason}` of the server.
async fn rejects(w: &World, listener: &str, reason: &str) -> anyhow::Result<f64> {
    let m = metrics(w.saddrs.admin()?).await?;
    Ok(metric_value(&m, "seedgate_rejects_total", &[("listener", listener), ("reason", reason)]).unwrap_or(0.0))
}

/// A connection is pending until its first request: one that sends nothing is closed at the
/// handshake timeout, one that speaks HTTP/1.1 at once; each dialled `Proxy` stream holds a
/// slot of `limits.max_connections` (the first its connection's own), and at the limit its
/// `DIAL_RSP` says so.
#[tokio::test]
async fn pending_until_the_first_request_and_one_slot_per_stream() -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let w =
        World::start_with("timeouts: { handshake: 1s, handshake_floor: 1s }\nlimits: { max_connections: 1 }\n").await?;
    let mut silent = tokio::net::UnixStream::connect(&w.sock).await?;
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(STEP, silent.read(&mut buf)).await.context("still open")??;
    anyhow::ensure!(n == 0, "{n} bytes to a silent client");
    poll_until(STEP, TICK, || async {
        anyhow::ensure!(rejects(&w, "uds", "handshake_timeout").await? == 1.0);
        Ok(())
    })
    .await?;
    let mut h1 = tokio::net::UnixStream::connect(&w.sock).await?;
    h1.write_all(b"CONNECT 127.0.0.1:1 HTTP/1.1\r\nHost: x\r\n\r\n").await?;
    // Closed unread: an end of stream or a reset.
    let r = tokio::time::timeout(STEP, h1.read(&mut buf)).await.context("still open")?;
    anyhow::ensure!(matches!(r, Ok(0) | Err(_)), "{r:?} to an HTTP/1.1 client");
    anyhow::ensure!(rejects(&w, "uds", "not_http2").await? == 1.0);

    let echo = TcpEcho::start().await?;
    let client = w.client(Via::Unix).await?;
    let first = client.dial(&echo.addr().to_string()).await?.map_err(anyhow::Error::msg)?;
    let e = client.dial(&echo.addr().to_string()).await?.err().context("a second stream over the limit")?;
    anyhow::ensure!(e.contains("connection limit"), "{e}");
    w.access_event("connection_limit").await?;
    // The slot is free again once the first stream ends.
    first.stream.tx.send(close_request(first.connect_id)).await?;
    drop(first);
    poll_until(STEP, TICK, || async {
        match client.dial(&echo.addr().to_string()).await? {
            Ok(_) => Ok(()),
            Err(e) => Err(anyhow::anyhow!(e)),
        }
    })
    .await?;
    Ok(())
}

/// A client whose HTTP/2 no server should take (a PUSH_PROMISE from a client) loses its
/// connection, counted as `http2_malformed`; other connections are served on.
#[tokio::test]
async fn malformed_http2_closes_the_connection_and_is_counted() -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let w = World::start().await?;
    let mut s = tokio::net::UnixStream::connect(&w.sock).await?;
    let mut bytes = proxy_wire::http2::PREFACE.to_vec();
    // An empty SETTINGS, then PUSH_PROMISE on stream 1 promising stream 2.
    bytes.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
    bytes.extend_from_slice(&[0, 0, 4, 5, 4, 0, 0, 0, 1, 0, 0, 0, 2]);
    s.write_all(&bytes).await?;
    let mut sink = Vec::new();
    // The server's SETTINGS may come first; then the end (or a reset).
    let _ = tokio::time::timeout(STEP, s.read_to_end(&mut sink)).await.context("still open")?;
    poll_until(STEP, TICK, || async {
        anyhow::ensure!(rejects(&w, "uds", "http2_malformed").await? == 1.0);
        Ok(())
    })
    .await?;
    let echo = TcpEcho::start().await?;
    let client = w.client(Via::Unix).await?;
    let mut conn = client.dial(&echo.addr().to_string()).await?.map_err(anyhow::Error::msg)?;
    conn.send(b"still here".to_vec()).await?;
    anyhow::ensure!(conn.read_exact(10).await? == b"still here");
    Ok(())
}

/// A front end switched by reload from HTTP CONNECT to gRPC keeps its socket; new connections
/// speak gRPC.
#[tokio::test]
async fn protocol_changes_by_reload() -> anyhow::Result<()> {
    let w = World::start().await?;
    let echo = TcpEcho::start().await?;
    let admin = w.saddrs.admin()?;
    let grpc_yaml = std::fs::read_to_string(&w.server.config)?;
    let connect_yaml = grpc_yaml.replace("    protocol: grpc\n", "");
    let before = w.server.reloads(admin, "success").await;
    w.server.reload_with(&connect_yaml).await?;
    w.server.wait_reloads(admin, "success", before + 1.0).await?;
    let mut s = testbed::tunnel_kit::connect(&Dialer::Unix(w.sock.clone()), &echo.addr().to_string()).await?;
    {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        s.write_all(b"connect").await?;
        let mut back = [0u8; 7];
        tokio::time::timeout(STEP, s.read_exact(&mut back)).await??;
        anyhow::ensure!(&back == b"connect");
    }
    w.server.reload_with(&grpc_yaml).await?;
    w.server.wait_reloads(admin, "success", before + 2.0).await?;
    let client = w.client(Via::Unix).await?;
    let mut conn = client.dial(&echo.addr().to_string()).await?.map_err(anyhow::Error::msg)?;
    conn.send(b"grpc".to_vec()).await?;
    anyhow::ensure!(conn.read_exact(4).await? == b"grpc");
    Ok(())
}

/// What a client sends before its first request and never finishes: the preface, an empty
/// SETTINGS, and a request's header block in a HEADERS and a CONTINUATION frame, neither with
/// END_HEADERS.
fn unfinished_header_block() -> Vec<u8> {
    fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
        let len = u32::try_from(payload.len()).expect("a small frame").to_be_bytes();
        out.extend_from_slice(&len[1..]);
        out.extend_from_slice(&[kind, flags]);
        out.extend_from_slice(&stream.to_be_bytes());
        out.extend_from_slice(payload);
    }
    let mut block = Vec::new();
    // Literal fields without indexing, new names; every length below 127 takes one byte.
    for (name, value) in [
        (&b":method"[..], &b"POST"[..]),
        (b":scheme", b"http"),
        (b":path", b"/ProxyService/Proxy"),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
    ] {
        block.push(0);
        block.push(name.len() as u8);
        block.extend_from_slice(name);
        block.push(value.len() as u8);
        block.extend_from_slice(value);
    }
    let (first, rest) = block.split_at(block.len() / 2);
    let mut out = proxy_wire::http2::PREFACE.to_vec();
    frame(&mut out, 0x4, 0, 0, &[]);
    frame(&mut out, 0x1, 0, 1, first);
    frame(&mut out, 0x9, 0, 1, rest);
    out
}

/// Until the server closes `s` (an end of stream, after its SETTINGS, or a reset).
async fn until_closed(mut s: testbed::tunnel_kit::BoxStream) {
    use tokio::io::AsyncReadExt as _;
    let mut buf = [0u8; 1024];
    // Bounded by the server's bytes: it sends its SETTINGS and a few frames at most.
    while let Ok(n) = s.read(&mut buf).await {
        if n == 0 {
            return;
        }
    }
}

/// A gauge or counter of the server, 0 when absent.
async fn value(w: &World, name: &str, labels: &[(&str, &str)]) -> anyhow::Result<f64> {
    let m = metrics(w.saddrs.admin()?).await?;
    Ok(metric_value(&m, name, labels).unwrap_or(0.0))
}

/// Many connections each holding an unfinished header block, against `max_connections: 3` and
/// `max_pending: 5`: the server holds only what the pending budget holds (the oldest evicted for
/// each newer one, each counted), the gauges say so, and real clients (tonic's and gRPC core's)
/// still get through.
async fn unfinished_requests(via: Via) -> anyhow::Result<()> {
    use tokio::io::AsyncWriteExt as _;
    const STALLED: usize = 300;
    const PENDING: usize = 5;
    // A deadline far beyond the test's waits: what closes a stalled connection here is the budget.
    let extra =
        "timeouts: { handshake: 120s, handshake_floor: 120s }\nlimits: { max_connections: 3, max_pending: 5 }\n";
    let w = World::start_with(extra).await?;
    let listener = World::listener(via);
    let stalled = unfinished_header_block();
    let mut held = Vec::new();
    for _ in 0..STALLED {
        let mut s = w.dialer(via)?.connect().await?;
        // A connection already evicted may refuse the write: it is counted below all the same.
        let _ = s.write_all(&stalled).await;
        held.push(tokio::spawn(until_closed(s)));
    }
    let closed = || held.iter().filter(|t| t.is_finished()).count();
    poll_until(STEP, TICK, || async {
        anyhow::ensure!(closed() == STALLED - PENDING, "{} of {STALLED} closed", closed());
        Ok(())
    })
    .await?;
    let evicted = (STALLED - PENDING) as f64;
    // An evicted connection's task counts its refusal as it ends, just after the client saw the
    // close: polled until the last of them has.
    poll_until(STEP, TICK, || async {
        let m = metrics(w.saddrs.admin()?).await?;
        let v = |name: &str, labels: &[(&str, &str)]| metric_value(&m, name, labels).unwrap_or(0.0);
        anyhow::ensure!(v("seedgate_pending_connections", &[]) == PENDING as f64, "pending gauge");
        anyhow::ensure!(v("seedgate_cluster_pending", &[("cluster", "shoot-a")]) == PENDING as f64, "cluster pending");
        anyhow::ensure!(v("seedgate_pending_rejects_total", &[("reason", "evicted")]) == evicted, "evictions");
        let rejects = v("seedgate_rejects_total", &[("listener", listener), ("reason", "pending_evicted")]);
        anyhow::ensure!(rejects == evicted, "{rejects} of {evicted} evictions counted by the listener");
        anyhow::ensure!(v("seedgate_connections_active", &[("listener", listener)]) == PENDING as f64, "active");
        Ok(())
    })
    .await?;

    // A real client's connection takes the oldest stalled one's place, then a slot.
    let echo = TcpEcho::start().await?;
    let client = w.client(via).await?;
    let mut conn = client.dial(&echo.addr().to_string()).await?.map_err(anyhow::Error::msg)?;
    conn.send(b"through".to_vec()).await?;
    anyhow::ensure!(conn.read_exact(7).await? == b"through", "tonic's echo");
    if let Some(mut c) = GrpcCore::start(&w.grpc_core_target(via)?, None).await? {
        c.run(&format!("echo {}", echo.addr())).await?;
    }
    anyhow::ensure!(value(&w, "seedgate_pending_connections", &[]).await? <= PENDING as f64);
    anyhow::ensure!(closed() > STALLED - PENDING, "the real clients' places came from the stalled connections");
    Ok(())
}
over_both!(unfinished_requests: unfinished_header_blocks_are_held_only_within_the_pending_budget_over_uds, unfinished_header_blocks_are_held_only_within_the_pending_budget_over_mtls);

/// A connection that sends half its preface, or its preface and a header block it never
/// finishes, is closed at the handshake deadline, counted as `handshake_timeout`.
async fn slow_first_request(via: Via) -> anyhow::Result<()> {
    use tokio::io::AsyncWriteExt as _;
    let w = World::start_with("timeouts: { handshake: 1s, handshake_floor: 1s }\n").await?;
    let listener = World::listener(via);
    let half_preface = proxy_wire::http2::PREFACE[..12].to_vec();
    for (n, (what, bytes)) in
        [("half a preface", half_preface), ("an unfinished header block", unfinished_header_block())]
            .into_iter()
            .enumerate()
    {
        let mut s = w.dialer(via)?.connect().await?;
        s.write_all(&bytes).await?;
        tokio::time::timeout(STEP, until_closed(s)).await.with_context(|| format!("{what}: still open"))?;
        poll_until(STEP, TICK, || async {
            let labels = [("listener", listener), ("reason", "handshake_timeout")];
            let cut = value(&w, "seedgate_rejects_total", &labels).await?;
            anyhow::ensure!(cut == (n + 1) as f64, "{what}: not counted");
            Ok(())
        })
        .await?;
    }
    Ok(())
}
over_both!(slow_first_request: a_slow_preface_or_header_block_is_cut_at_the_deadline_over_uds, a_slow_preface_or_header_block_is_cut_at_the_deadline_over_mtls);

/// From its first request a connection holds a slot of `limits.max_connections` while it lives,
/// idle or not: at the limit accepting pauses, and the next connection's request is served once
/// one closes. A connection accepted while a slot was free that finds none at its first request
/// waits for one until its deadline, then is refused as a CONNECT is: its stream is answered
/// `UNAVAILABLE` with the refusal's text, counted as `connection_limit`.
#[tokio::test]
async fn a_connection_holds_a_slot_from_its_first_request_while_it_lives() -> anyhow::Result<()> {
    let w =
        World::start_with("timeouts: { handshake: 5s, handshake_floor: 5s }\nlimits: { max_connections: 2 }\n").await?;
    let echo = TcpEcho::start().await?;
    let target = echo.addr().to_string();
    // Three connections while both slots are free: all pending, none holding a slot yet.
    let (late, a, b) = (w.client(Via::Unix).await?, w.client(Via::Unix).await?, w.client(Via::Unix).await?);
    poll_until(STEP, TICK, || async {
        anyhow::ensure!(value(&w, "seedgate_pending_connections", &[]).await? == 3.0, "not all accepted");
        Ok(())
    })
    .await?;
    let mut conns = Vec::new();
    for c in [&a, &b] {
        conns.push(c.dial(&target).await?.map_err(anyhow::Error::msg)?);
    }
    let refused = late.dial(&target).await;
    let status = refused.as_ref().err().and_then(|e| e.downcast_ref::<tonic::Status>());
    let said = status.map(|s| (s.code(), s.message()));
    let want = (tonic::Code::Unavailable, "over capacity: connection limit reached");
    anyhow::ensure!(said == Some(want), "{refused:?}");
    anyhow::ensure!(
        value(&w, "seedgate_rejects_total", &[("listener", "uds"), ("reason", "connection_limit")]).await? == 1.0
    );

    // Their streams end; the connections live on, idle, and keep their slots. The accept loop
    // waits for a free one (after taking in one more connection, as it checked for room before
    // the slots were taken), and that connection's first request waits for a slot too.
    for mut conn in conns {
        conn.stream.tx.send(close_request(conn.connect_id)).await?;
        anyhow::ensure!(conn.read_to_close().await?.closed, "no CLOSE_RSP");
    }
    w.all_streams_ended().await?;
    let next = w.client(Via::Unix).await?;
    let t = target.clone();
    let waiting = tokio::spawn(async move { next.dial(&t).await });
    poll_until(STEP, TICK, || async {
        let waits = value(&w, "seedgate_connection_limit_waiting", &[]).await?;
        anyhow::ensure!(waits == 2.0, "{waits} waits for a slot");
        // The refused connection is gone once it read its answer.
        let active = value(&w, "seedgate_connections_active", &[("listener", "uds")]).await?;
        anyhow::ensure!(active == 3.0, "{active} connections active");
        Ok(())
    })
    .await?;
    if waiting.is_finished() {
        let r = waiting.await?;
        anyhow::bail!("a third connection was served while two idle ones held both slots: {r:?}");
    }
    drop(a);
    let conn = tokio::time::timeout(STEP, waiting).await.context("not served after a slot came free")???;
    conn.map_err(anyhow::Error::msg)?;
    Ok(())
}

/// A connection whose `Proxy` streams all ended gives its slot back after `timeouts.idle`, as an
/// idle CONNECT does: the next client is served while the idle one's client still holds it open.
#[tokio::test]
async fn an_idle_connection_gives_its_slot_back_after_timeouts_idle() -> anyhow::Result<()> {
    let w = World::start_with(
        "timeouts: { handshake: 30s, handshake_floor: 30s, idle: 1s }\nlimits: { max_connections: 1 }\n",
    )
    .await?;
    let echo = TcpEcho::start().await?;
    let target = echo.addr().to_string();
    let idle = w.client(Via::Unix).await?;
    let mut conn = idle.dial(&target).await?.map_err(anyhow::Error::msg)?;
    conn.stream.tx.send(close_request(conn.connect_id)).await?;
    anyhow::ensure!(conn.read_to_close().await?.closed, "no CLOSE_RSP");
    w.all_streams_ended().await?;
    // `idle` is kept: only the server's idle timeout can free the one slot.
    let next = w.client(Via::Unix).await?;
    let served = tokio::time::timeout(STEP, next.dial(&target)).await.context("no slot came free")??;
    served.map_err(anyhow::Error::msg)?;
    drop(idle);
    Ok(())
}
