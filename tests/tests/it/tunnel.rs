//! End-to-end tests of the reverse tunnel (paths P3, P4, P5) on loopback: the real proxy-server
//! and proxy-agent binaries, real clients (a strict kube-apiserver-style CONNECT client, curl),
//! real TCP/TLS backends. Every data-path scenario runs over both transports (HTTP/2 over TCP,
//! and QUIC with nothing listening on TCP at the address the agent dials). Topology tests
//! (separate namespaces) are in `tunnel_topology.rs`, Prometheus in `tunnel_prometheus.rs`.

use anyhow::Context as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use testbed::tunnel_kit::{
    AgentOpts, ChecksumSink, Crc, Dialer, End, FRONTEND_NAME, Fe, FeKind, Pattern, STEP, SpeakFirst, Stall, TunnelPki,
    Watcher, agent_yaml, connect, connect_strict, connect_tcp, fd_count, inproc_agent, inproc_server, metrics,
    parse_sum_line, read_checksum, refusal_of, server_yaml, start_agent, start_server, tls_get_over, wait_agents,
    write_pattern,
};
use testbed::{
    Addresses, HttpBackend, InProc, Proc, TcpEcho, TempDir, TlsHttpBackend, http_get, metric_sum, metric_value,
    poll_until,
};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};

const TICK: Duration = Duration::from_millis(20);
const MIB: u64 = 1024 * 1024;
/// The smallest flow-control windows both ends accept (`stream_window`, `connection_window`):
/// 64 KiB a stream, 1 MiB a session, so that a transfer of a few MiB spans many windows.
const WINDOWS: &str = "  stream_window: 65535\n  connection_window: 1048576\n";
/// The keepalive of every config `server_yaml` and `agent_yaml` write.
const KEEPALIVE: &str = "keepalive: { interval: 500ms, suspect_after: 2s, timeout: 2s }";

/// The tunnel transport a test runs over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    H2,
    Quic,
}

/// One test per transport from one scenario body: `name` over HTTP/2, `name_over_quic` over QUIC.
macro_rules! over_both {
    ($body:ident: $h2:ident, $quic:ident) => {
        #[tokio::test]
        async fn $h2() -> anyhow::Result<()> {
            $body(Transport::H2).await
        }

        #[tokio::test]
        async fn $quic() -> anyhow::Result<()> {
            $body(Transport::Quic).await
        }
    };
}

/// proxy-server or proxy-agent in a [`World`]: served in this process, or a process where a
/// signal or the process's descriptors are the point.
enum Node {
    InProc(InProc),
    Process(Proc),
}

impl Node {
    fn log(&self) -> String {
        match self {
            Self::InProc(p) => p.log(),
            Self::Process(p) => p.log(),
        }
    }

    /// The process; a test that signals it must have built its world with [`World::processes`].
    fn process(&mut self) -> &mut Proc {
        match self {
            Self::Process(p) => p,
            Self::InProc(_) => panic!("in this process: a test that signals must start processes"),
        }
    }

    fn pid(&self) -> u32 {
        match self {
            Self::Process(p) => p.pid(),
            Self::InProc(_) => panic!("in this process: a test that counts descriptors must start processes"),
        }
    }
}

/// Where the binaries of a [`World`] run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Run {
    InProcess,
    Processes,
}

/// A proxy-server with the given front ends and one agent of `shoot-a` connected to it.
struct World {
    dir: TempDir,
    pki: TunnelPki,
    /// How the agent was started, so a test can start it again.
    agent_opts: AgentOpts,
    server: Node,
    saddrs: Addresses,
    agent: Node,
    aaddrs: Addresses,
}

impl World {
    async fn start(frontends: &[Fe], allow: &[&str]) -> anyhow::Result<Self> {
        Self::start_with(frontends, "", |_| {}, allow).await
    }

    async fn start_with(
        frontends: &[Fe],
        agents_extra: &str,
        agent: impl FnOnce(&mut AgentOpts),
        allow: &[&str],
    ) -> anyhow::Result<Self> {
        Self::start_over(Transport::H2, frontends, agents_extra, agent, allow).await
    }

    /// The same over `transport`: with QUIC the server also listens on UDP (`agents.quic`) and
    /// the agent dials that address, where this server listens on nothing over TCP.
    async fn start_over(
        transport: Transport,
        frontends: &[Fe],
        agents_extra: &str,
        agent: impl FnOnce(&mut AgentOpts),
        allow: &[&str],
    ) -> anyhow::Result<Self> {
        Self::build(Run::InProcess, transport, frontends, agents_extra, agent, allow, KEEPALIVE).await
    }

    /// [`World::plain_over`] with flow-control windows of [`WINDOWS`] on both ends, so that a few
    /// MiB are many windows.
    async fn small_windows_over(transport: Transport) -> anyhow::Result<Self> {
        let agent = |o: &mut AgentOpts| o.tunnel_extra.push_str(WINDOWS);
        Self::build(Run::InProcess, transport, &[plain_fe()], WINDOWS, agent, &["127.0.0.1/32"], KEEPALIVE).await
    }

    /// The plain front end `egress` in front of one agent over `transport`, both as processes.
    async fn processes(transport: Transport) -> anyhow::Result<Self> {
        Self::processes_with_keepalive(transport, KEEPALIVE).await
    }

    /// [`World::processes`] with `keepalive` (a `keepalive: {...}` line) on both ends.
    async fn processes_with_keepalive(transport: Transport, keepalive: &str) -> anyhow::Result<Self> {
        Self::build(Run::Processes, transport, &[plain_fe()], "", |_| {}, &["127.0.0.1/32"], keepalive).await
    }

    /// `agents_extra`: keys under the server's `agents:`; `agent` adjusts the agent's options;
    /// `keepalive` replaces [`KEEPALIVE`] in both configs.
    async fn build(
        run: Run,
        transport: Transport,
        frontends: &[Fe],
        agents_extra: &str,
        agent: impl FnOnce(&mut AgentOpts),
        allow: &[&str],
        keepalive: &str,
    ) -> anyhow::Result<Self> {
        let dir = TempDir::new("tunnel")?;
        let pki = TunnelPki::new(dir.path())?;
        let mut yaml = server_yaml(&pki, "127.0.0.1:0", frontends, "").replace(KEEPALIVE, keepalive);
        // Extra keys go under `agents:` on the server (and the agent's `tunnel:` extras do there).
        yaml = yaml.replacen("agents:\n", &format!("agents:\n{agents_extra}"), 1);
        if transport == Transport::Quic {
            yaml = yaml.replacen("agents:\n", "agents:\n  quic: { listen: 127.0.0.1:0 }\n", 1);
        }
        let (server, saddrs) = match run {
            Run::InProcess => inproc_server(&dir, &yaml).await.map(|(p, a)| (Node::InProc(p), a))?,
            Run::Processes => start_server(&dir, "server", &yaml).await.map(|(p, a)| (Node::Process(p), a))?,
        };
        let listener = if transport == Transport::Quic { "agents-quic" } else { "agents" };
        let at = saddrs.listener(listener)?;
        if transport == Transport::Quic {
            // No TCP socket of this server is there: the agent can only be using UDP. (Whether
            // anything at all answers TCP there is not asked: another test running at the same
            // time may have that port number for TCP, and it is no proxy-server of this CA.)
            let tcp_there = saddrs.listeners.iter().any(|(name, a)| name != "agents-quic" && *a == at.to_string());
            anyhow::ensure!(!tcp_there, "a TCP listener at {at}: {saddrs:?}");
        }
        let mut o = AgentOpts::new("shoot-a", at, allow);
        if transport == Transport::Quic {
            o.tunnel_extra = "  transport: quic\n".into();
        }
        agent(&mut o);
        let yaml = agent_yaml(&pki, &o)?.replace(KEEPALIVE, keepalive);
        let (agent, aaddrs) = match run {
            Run::InProcess => inproc_agent(&dir, &yaml).await.map(|(p, a)| (Node::InProc(p), a))?,
            Run::Processes => start_agent(&dir, "agent", &yaml, None).await.map(|(p, a)| (Node::Process(p), a))?,
        };
        wait_agents(saddrs.admin()?, "shoot-a", 1.0).await.with_context(|| format!("agent log:\n{}", agent.log()))?;
        Ok(Self { dir, pki, agent_opts: o, server, saddrs, agent, aaddrs })
    }

    /// The plain front end `egress` in front of one agent over `transport`.
    async fn plain_over(transport: Transport) -> anyhow::Result<Self> {
        Self::start_over(transport, &[plain_fe()], "", |_| {}, &["127.0.0.1/32"]).await
    }

    fn plain(&self, name: &str) -> anyhow::Result<Dialer> {
        Ok(Dialer::Tcp(self.saddrs.listener(name)?))
    }

    fn logs(&self) -> String {
        format!("--- proxy-server log:\n{}\n--- proxy-agent log:\n{}", self.server.log(), self.agent.log())
    }
}

fn plain_fe() -> Fe {
    Fe::new("egress", "shoot-a", FeKind::Plain)
}

/// One CONNECT through the tunnel to an echo backend: bytes go there and back.
pub(crate) async fn echo_roundtrip(d: &Dialer, target: SocketAddr, msg: &[u8]) -> anyhow::Result<()> {
    let mut s = connect(d, &target.to_string()).await?;
    s.write_all(msg).await?;
    s.shutdown().await?;
    let mut back = Vec::new();
    tokio::time::timeout(STEP, s.read_to_end(&mut back)).await.context("echo timed out")??;
    anyhow::ensure!(back == msg, "echo returned {} bytes, sent {}", back.len(), msg.len());
    Ok(())
}

async fn curl(args: &[&str]) -> anyhow::Result<String> {
    let out = tokio::time::timeout(
        STEP,
        tokio::process::Command::new("curl")
            .args(["-sS", "--max-time", "10"])
            .args(args)
            // An explicit -x must not be bypassed by the environment.
            .env_remove("no_proxy")
            .env_remove("NO_PROXY")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .context("curl did not finish")?
    .context("running curl (Debian package curl)")?;
    anyhow::ensure!(
        out.status.success(),
        "curl {args:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

// Test 2: kube-apiserver's egress selector over mTLS TCP and over a Unix socket, then curl with
// CONNECT (`-p`) and with absolute-form requests.
over_both!(
    kube_apiserver_style:
    kube_apiserver_style_connect_over_mtls_and_uds_and_curl,
    kube_apiserver_style_connect_over_mtls_and_uds_and_curl_over_quic
);

async fn kube_apiserver_style(transport: Transport) -> anyhow::Result<()> {
    let tmp = TempDir::new("tunnel-uds")?;
    let sock = tmp.join("shoot-a.sock");
    let fes = [
        Fe::new("egress-mtls", "shoot-a", FeKind::Mtls),
        Fe::new("egress-uds", "shoot-a", FeKind::Unix(sock.clone())),
        plain_fe(),
    ];
    let w = World::start_over(transport, &fes, "", |_| {}, &["127.0.0.1/32"]).await?;
    assert_eq!(w.saddrs.unix("egress-uds")?, sock);
    let (kubelet_id, _, _) = w.pki.backend("kubelet", &["kubelet.shoot-a.test", "127.0.0.1"])?;
    // The TLS backend waits for the client's ClientHello: any byte before it would be ours.
    let kubelet = TlsHttpBackend::start("kubelet", &kubelet_id, None).await?;
    let target = kubelet.addr().to_string();

    let mtls = Dialer::Tls(w.saddrs.listener("egress-mtls")?, w.pki.apiserver_tls()?, FRONTEND_NAME.into());
    let uds = Dialer::Unix(sock.clone());
    for (what, d) in [("mTLS TCP", &mtls), ("UDS", &uds)] {
        let s = connect_strict(d, &target).await.with_context(|| format!("{what}\n{}", w.logs()))?;
        let resp = tls_get_over(s, &w.pki.ca, "kubelet.shoot-a.test", "/containerLogs/x").await.context(what)?;
        assert!(resp.starts_with("HTTP/1.1 200"), "{what}: {resp}");
        assert!(
            resp.contains("backend=kubelet sni=kubelet.shoot-a.test") && resp.contains("path=/containerLogs/x"),
            "{what}: {resp}"
        );
    }

    // Without a client certificate the mTLS front end refuses the handshake.
    let anon = Dialer::Tls(
        w.saddrs.listener("egress-mtls")?,
        testbed::pki::client_config(&w.pki.ca, None, &[])?,
        FRONTEND_NAME.into(),
    );
    let e = match connect_strict(&anon, &target).await {
        Ok(_) => panic!("an anonymous client got through the mTLS front end"),
        Err(e) => e,
    };
    assert!(refusal_of(&e).is_none(), "refused by TLS, not by an HTTP answer: {e:#}");

    // curl -p: CONNECT, then TLS end to end (curl verifies the kubelet's certificate).
    let fe = w.saddrs.listener("egress")?;
    let ca = w.pki.ca_file.display().to_string();
    let body =
        curl(&["-p", "-x", &format!("http://{fe}"), "--cacert", &ca, &format!("https://{target}/healthz")]).await?;
    assert!(body.starts_with("backend=kubelet sni=- ") && body.contains("path=/healthz"), "{body}");

    // curl with an absolute-form request to a plain-HTTP target; keep-alive to the front end.
    let page = HttpBackend::start("text/plain", "pod page\n").await?;
    let url = format!("http://{}/metrics?x=1", page.addr());
    let sadmin = w.saddrs.admin()?;
    let tunnel_bytes = |m: &str, dir: &str| {
        metric_value(m, "seedgate_tunnel_bytes_total", &[("cluster", "shoot-a"), ("direction", dir)]).unwrap_or(0.0)
    };
    let before = metrics(sadmin).await?;
    let out = curl(&["-x", &format!("http://{fe}"), &url, &url]).await?;
    assert_eq!(out, "pod page\npod page\n");
    let heads = page.requests();
    assert_eq!(heads.len(), 2, "{heads:?}");
    // Both requests on one client connection, although the target closes after each answer
    // (its `Connection: close` is hop-by-hop: it concerns the tunnel stream, not the client).
    let sadmin = w.saddrs.admin()?;
    poll_until(STEP, TICK, || async {
        let m = metrics(sadmin).await?;
        anyhow::ensure!(
            metric_value(&m, "seedgate_connections_active", &[("listener", "egress")]) == Some(0.0),
            "front-end connections still open"
        );
        Ok(())
    })
    .await?;
    let slog = w.server.log();
    let forward_conns =
        slog.lines().filter(|l| l.contains("connection closed") && l.contains("kind=\"forward\"")).count();
    assert_eq!(forward_conns, 1, "curl's two requests did not share a connection\n{slog}");
    // One access event per forwarded request, with its status and the bytes it moved.
    let requests: Vec<&str> = slog.lines().filter(|l| l.contains("request forwarded")).collect();
    assert_eq!(requests.len(), 2, "{slog}");
    for l in &requests {
        assert!(l.contains("code=200") && l.contains("reason=\"closed\""), "{l}");
        let down = field_u64(l, "bytes_to_client").unwrap_or(0);
        let up = field_u64(l, "bytes_to_upstream").unwrap_or(0);
        assert!(down > "pod page\n".len() as u64 && up > 0, "{l}");
    }
    // The tunnel's byte counters include forwarded traffic.
    let after = metrics(sadmin).await?;
    assert!(tunnel_bytes(&after, "to_seed") - tunnel_bytes(&before, "to_seed") >= 2.0 * "pod page\n".len() as f64);
    assert!(tunnel_bytes(&after, "to_shoot") > tunnel_bytes(&before, "to_shoot"));
    // The agent saw each forwarded stream end in order, not by a reset.
    let forwarded_target = format!("target={}", page.addr());
    poll_until(STEP, TICK, || async {
        let alog = w.agent.log();
        let ends: Vec<&str> =
            alog.lines().filter(|l| l.contains("stream closed") && l.contains(&forwarded_target)).collect();
        anyhow::ensure!(ends.len() == 2, "{} stream ends for the forwarded requests:\n{alog}", ends.len());
        anyhow::ensure!(ends.iter().all(|l| l.contains("reason=\"closed\"")), "{ends:#?}");
        Ok(())
    })
    .await?;
    // A target the agent does not allow: 403, counted as a reject like the same CONNECT, and
    // logged as its own request.
    let denied = curl(&["-x", &format!("http://{fe}"), "http://10.255.255.1:81/"]).await?;
    assert!(denied.contains("not allowed") || denied.contains("10.255.255.1"), "{denied}");
    let m = metrics(sadmin).await?;
    assert_eq!(
        metric_value(&m, "seedgate_rejects_total", &[("listener", "egress"), ("reason", "not_allowed")]),
        Some(1.0),
        "{m}"
    );
    assert_eq!(
        metric_value(
            &m,
            "seedgate_frontend_requests_total",
            &[("frontend", "egress"), ("kind", "forward"), ("code", "403")]
        ),
        Some(1.0),
        "{m}"
    );
    assert!(w.server.log().lines().any(|l| l.contains("request forwarded") && l.contains("code=403")));
    // Every front-end connection is counted once, by result.
    assert!(
        metric_value(
            &m,
            "seedgate_connections_total",
            &[("listener", "egress"), ("route", "shoot-a"), ("result", "ok")]
        )
        .is_some_and(|v| v >= 2.0),
        "{m}"
    );
    for h in &heads {
        // Origin-form towards the target, the Host header kept, no proxy headers passed on.
        assert!(h.starts_with("GET /metrics?x=1 HTTP/1.1\r\n"), "{h}");
        assert!(h.to_ascii_lowercase().contains(&format!("host: {}", page.addr())), "{h}");
        assert!(!h.to_ascii_lowercase().contains("proxy-connection"), "{h}");
    }

    let m = metrics(w.saddrs.admin()?).await?;
    assert_eq!(
        metric_value(
            &m,
            "seedgate_frontend_requests_total",
            &[("frontend", "egress-mtls"), ("kind", "connect"), ("code", "200")]
        ),
        Some(1.0),
        "{m}"
    );
    assert_eq!(
        metric_value(
            &m,
            "seedgate_frontend_requests_total",
            &[("frontend", "egress-uds"), ("kind", "connect"), ("code", "200")]
        ),
        Some(1.0),
        "{m}"
    );
    assert_eq!(
        metric_value(
            &m,
            "seedgate_frontend_requests_total",
            &[("frontend", "egress"), ("kind", "forward"), ("code", "200")]
        ),
        Some(2.0),
        "{m}"
    );
    Ok(())
}

// Test 4: one stream whose reader never reads fills its window (the client's writes block),
// and one whose seed-side client never reads while its backend floods, while 50 other streams
// each move 1 MiB (half of them towards the shoot, half back) with correct checksums, through
// windows of 64 KiB a stream and 1 MiB a session.
over_both!(
    stalled_stream:
    stalled_stream_does_not_block_the_others,
    stalled_stream_does_not_block_the_others_over_quic
);

async fn stalled_stream(transport: Transport) -> anyhow::Result<()> {
    let w = World::small_windows_over(transport).await?;
    let d = w.plain("egress")?;
    let stall = Stall::start_on("127.0.0.1:0".parse()?).await?;
    // 16 stream windows each; all 50 together are 50 session windows.
    const LEN: u64 = MIB;
    let sink = ChecksumSink::start_on("127.0.0.1:0".parse()?, 0).await?;
    // Answers a 1-byte upload with a LEN download.
    let source = ChecksumSink::start_on("127.0.0.1:0".parse()?, LEN).await?;
    // The reverse stall: this backend sends 1 GiB to a client that reads nothing for now.
    let flood = SpeakFirst::start_on("127.0.0.1:0".parse()?, 1024 * MIB).await?;
    let mut flooded = connect(&d, &flood.addr().to_string()).await?;

    // The stalled stream: write until a write does not complete. Everything between the client
    // and the stalled backend is bounded (socket buffers, one relay buffer, the stream window),
    // so this must happen long before 256 MiB.
    let mut stalled = connect(&d, &stall.addr().to_string()).await?;
    let written = Arc::new(AtomicU64::new(0));
    let chunk = vec![0x5au8; 64 * 1024];
    let mut blocked = false;
    for _ in 0..(256 * MIB / chunk.len() as u64) {
        match tokio::time::timeout(Duration::from_secs(2), stalled.write_all(&chunk)).await {
            Ok(r) => {
                r.context("writing to the stalled stream")?;
                written.fetch_add(chunk.len() as u64, Ordering::Relaxed);
            }
            Err(_) => {
                blocked = true;
                break;
            }
        }
    }
    let stalled_bytes = written.load(Ordering::Relaxed);
    assert!(
        blocked,
        "writes to a stream whose reader never reads never blocked ({stalled_bytes} bytes buffered somewhere)"
    );
    eprintln!("the stalled stream took {stalled_bytes} bytes before its writes blocked");
    assert_eq!(stall.connections(), 1);

    // 50 streams × LEN while the stalled ones hold their windows.
    const N: u64 = 50;
    let mut set = tokio::task::JoinSet::new();
    for i in 0..N {
        let d = d.clone();
        let (up, target) = if i % 2 == 0 { (LEN, sink.addr().to_string()) } else { (1, source.addr().to_string()) };
        set.spawn(async move {
            let s = connect(&d, &target).await?;
            let (r, mut wr) = tokio::io::split(s);
            let sent = write_pattern(&mut wr, 1000 + i, up).await?;
            wr.shutdown().await?;
            let mut r = BufReader::new(r);
            let mut line = String::new();
            r.read_line(&mut line).await?;
            let (n, sum) = parse_sum_line(&line)?;
            anyhow::ensure!(
                (n, sum) == (up, sent),
                "stream {i}: backend got {n} bytes sum {sum:?}, sent {up} sum {sent:?}"
            );
            let down = read_checksum(&mut r).await?;
            let want = if up == 1 { (LEN, Pattern::checksum(1, LEN)) } else { (0, Crc::default()) };
            anyhow::ensure!(down == want, "stream {i}: received {down:?}, want {want:?}");
            anyhow::Ok(())
        });
    }
    let all = tokio::time::timeout(Duration::from_secs(300), async {
        let mut done = 0;
        while let Some(r) = set.join_next().await {
            r??;
            done += 1;
        }
        anyhow::Ok(done)
    })
    .await
    .with_context(|| format!("the 50 streams did not finish while one stream was stalled\n{}", w.logs()))??;
    assert_eq!(all, N);
    assert_eq!(sink.connections() + source.connections(), N);

    // The stalled streams are still open: neither cut nor drained.
    let m = metrics(w.aaddrs.admin()?).await?;
    assert_eq!(metric_value(&m, "seedgate_tunnel_streams_active", &[]), Some(2.0), "{m}");
    // The flooded one delivers its bytes intact once its client reads.
    let mut head = vec![0u8; 4 * MIB as usize];
    tokio::time::timeout(STEP, flooded.read_exact(&mut head)).await.context("reading the flooded stream")??;
    let mut want = vec![0u8; head.len()];
    Pattern::new(SpeakFirst::SEED, 4 * MIB).fill(&mut want);
    assert!(head == want, "the flooded stream's first 4 MiB are not what the backend sent");
    Ok(())
}

// Test 5a: concurrent large transfers in both directions at once, with checksums.
over_both!(
    concurrent_large_transfers:
    concurrent_large_transfers_both_ways,
    concurrent_large_transfers_both_ways_over_quic
);

async fn concurrent_large_transfers(transport: Transport) -> anyhow::Result<()> {
    let w = World::small_windows_over(transport).await?;
    let d = w.plain("egress")?;
    let echo = TcpEcho::start().await?;
    // 32 stream windows each; 16 session windows each way in all.
    const N: u64 = 8;
    const LEN: u64 = 2 * MIB;
    let mut set = tokio::task::JoinSet::new();
    for i in 0..N {
        let d = d.clone();
        let target = echo.addr().to_string();
        set.spawn(async move {
            let s = connect(&d, &target).await?;
            let (mut r, mut wr) = tokio::io::split(s);
            // Write and read at the same time: the echo sends back while we still send.
            let writer = async {
                let f = write_pattern(&mut wr, 77 + i, LEN).await?;
                wr.shutdown().await?;
                std::io::Result::Ok(f)
            };
            let (sent, got) = tokio::try_join!(writer, read_checksum(&mut r))?;
            anyhow::ensure!(
                got == (LEN, sent),
                "stream {i}: got back {} bytes {:?}, sent {LEN} {sent:?}",
                got.0,
                got.1
            );
            anyhow::Ok(())
        });
    }
    tokio::time::timeout(Duration::from_secs(300), async {
        while let Some(r) = set.join_next().await {
            r??;
        }
        anyhow::Ok(())
    })
    .await
    .with_context(|| format!("transfers did not finish\n{}", w.logs()))??;
    assert_eq!(echo.echoed_bytes(), N * LEN);
    // A relay counts a chunk after writing it, so the last count may come just after the client
    // read the last byte: poll (bounded) for the exact totals.
    let sadmin = w.saddrs.admin()?;
    let counted = |m: &str, dir: &str| {
        metric_value(m, "seedgate_tunnel_bytes_total", &[("cluster", "shoot-a"), ("direction", dir)])
    };
    let m = poll_until(STEP, TICK, || async {
        let m = metrics(sadmin).await?;
        let done = [counted(&m, "to_shoot"), counted(&m, "to_seed")] == [Some((N * LEN) as f64); 2];
        if done { Ok(m) } else { Err(anyhow::anyhow!("not yet")) }
    })
    .await
    .unwrap_or_default();
    assert_eq!(counted(&m, "to_shoot"), Some((N * LEN) as f64), "{m}");
    assert_eq!(counted(&m, "to_seed"), Some((N * LEN) as f64), "{m}");
    Ok(())
}

// Test 5b: half-close both ways, over TCP and over the Unix-socket front end.
over_both!(half_close: half_close_both_ways, half_close_both_ways_over_quic);

async fn half_close(transport: Transport) -> anyhow::Result<()> {
    let tmp = TempDir::new("tunnel-hc")?;
    let sock = tmp.join("hc.sock");
    let fes = [plain_fe(), Fe::new("uds", "shoot-a", FeKind::Unix(sock.clone()))];
    let w = World::start_over(transport, &fes, "", |_| {}, &["127.0.0.1/32"]).await?;
    const TRAILER: u64 = 3 * MIB;
    let sink = ChecksumSink::start_on("127.0.0.1:0".parse()?, TRAILER).await?;
    let speaker = SpeakFirst::start_on("127.0.0.1:0".parse()?, 2 * MIB).await?;
    for (what, d) in [("tcp", w.plain("egress")?), ("uds", Dialer::Unix(sock.clone()))] {
        // Client FIN reaches the backend while the backend keeps sending: the sink answers only
        // after our EOF, then sends 3 MiB more after it.
        let s = connect(&d, &sink.addr().to_string()).await?;
        let (r, mut wr) = tokio::io::split(s);
        let sent = write_pattern(&mut wr, 5, 2 * MIB).await?;
        wr.shutdown().await?;
        let mut r = BufReader::new(r);
        let mut line = String::new();
        tokio::time::timeout(STEP, r.read_line(&mut line))
            .await
            .with_context(|| format!("{what}: our FIN never reached the backend"))??;
        assert_eq!(parse_sum_line(&line)?, (2 * MIB, sent), "{what}");
        let got = tokio::time::timeout(STEP, read_checksum(&mut r)).await.context(what)??;
        assert_eq!(got, (TRAILER, Pattern::checksum(2 * MIB, TRAILER)), "{what}: what the backend sent after our FIN");

        // Backend FIN reaches the client while the client keeps sending: read to EOF first, then
        // send 3 MiB; the backend receives all of it after its own FIN.
        let before = speaker.received().len();
        let s = connect(&d, &speaker.addr().to_string()).await?;
        let (mut r, mut wr) = tokio::io::split(s);
        let got = tokio::time::timeout(STEP, read_checksum(&mut r))
            .await
            .with_context(|| format!("{what}: the backend's FIN never arrived"))??;
        assert_eq!(got, (2 * MIB, Pattern::checksum(SpeakFirst::SEED, 2 * MIB)), "{what}");
        let sent = write_pattern(&mut wr, 9, 3 * MIB)
            .await
            .with_context(|| format!("{what}: writing after the backend's FIN"))?;
        wr.shutdown().await?;
        let rec = poll_until(STEP, TICK, || async { speaker.received().get(before).copied() }).await.context(what)?;
        assert_eq!(rec, (3 * MIB, sent), "{what}: what the backend got after its FIN");
    }
    Ok(())
}

// Test 7a: an agent killed with SIGKILL ends the streams it carried, the front end answers 503
// until an agent is back, and a restarted agent carries traffic again.
over_both!(agent_sigkill: agent_sigkill_ends_server_side_streams, agent_sigkill_ends_server_side_streams_over_quic);

async fn agent_sigkill(transport: Transport) -> anyhow::Result<()> {
    let mut w = World::processes(transport).await?;
    let d = w.plain("egress")?;
    let echo = TcpEcho::start().await?;
    let mut streams = Vec::new();
    for i in 0..3u8 {
        let mut s = connect(&d, &echo.addr().to_string()).await?;
        s.write_all(&[i; 10]).await?;
        let mut b = [0u8; 10];
        tokio::time::timeout(STEP, s.read_exact(&mut b)).await??;
        assert_eq!(b, [i; 10]);
        streams.push(s);
    }
    w.agent.process().signal(libc::SIGKILL)?;
    // The bound: the keepalive timeout (2s) catches a silent peer; over TCP SIGKILL closes the
    // socket, so the end comes at once, while QUIC learns it only from the idle timeout (the
    // keepalive timeout). Slack for a loaded machine.
    for (i, s) in streams.iter_mut().enumerate() {
        let mut b = [0u8; 16];
        match tokio::time::timeout(Duration::from_secs(2 + 8), s.read(&mut b)).await {
            Ok(Ok(0) | Err(_)) => {}
            Ok(Ok(n)) => panic!("stream {i}: {n} bytes after the agent died"),
            Err(_) => panic!("stream {i} still open after the agent was killed\n{}", w.logs()),
        }
    }
    wait_agents(w.saddrs.admin()?, "shoot-a", 0.0).await?;
    let e = match connect(&d, &echo.addr().to_string()).await {
        Ok(_) => panic!("CONNECT succeeded without an agent"),
        Err(e) => e,
    };
    let r = refusal_of(&e).with_context(|| format!("{e:#}"))?;
    assert_eq!(r.status, 503, "{r}");
    assert!(r.body.contains("no agent"), "{r}");

    let (agent, _) = start_agent(&w.dir, "agent2", &agent_yaml(&w.pki, &w.agent_opts)?, None).await?;
    wait_agents(w.saddrs.admin()?, "shoot-a", 1.0).await.with_context(|| agent.log())?;
    echo_roundtrip(&d, echo.addr(), b"again").await.with_context(|| agent.log())?;
    Ok(())
}

/// Test 7b: proxy-server restarted on the same agents port: the agent reconnects with back-off
/// and traffic resumes; its reconnect counter moved.
#[tokio::test]
async fn server_restart_agent_reconnects() -> anyhow::Result<()> {
    let dir = TempDir::new("tunnel-restart")?;
    let pki = TunnelPki::new(dir.path())?;
    // A fixed port, so the restarted server is where the agent looks (free now; the agent keeps
    // retrying if the restart takes a while).
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let yaml = server_yaml(&pki, &format!("127.0.0.1:{port}"), &[plain_fe()], "drain_grace: 1s\n");
    let (mut server, saddrs) = start_server(&dir, "server", &yaml).await?;
    let o = AgentOpts::new("shoot-a", format!("127.0.0.1:{port}"), &["127.0.0.1/32"]);
    let (agent, aaddrs) = start_agent(&dir, "agent", &agent_yaml(&pki, &o)?, None).await?;
    wait_agents(saddrs.admin()?, "shoot-a", 1.0).await?;
    let echo = TcpEcho::start().await?;
    echo_roundtrip(&Dialer::Tcp(saddrs.listener("egress")?), echo.addr(), b"before restart").await?;
    let reconnects = |m: &str| metric_sum(m, "seedgate_tunnel_reconnects_total", &[]);
    let before = reconnects(&metrics(aaddrs.admin()?).await?);

    // A stream that is live at SIGTERM keeps working through the drain grace, then ends.
    let mut live = connect(&Dialer::Tcp(saddrs.listener("egress")?), &echo.addr().to_string()).await?;
    server.signal(libc::SIGTERM)?;
    live.write_all(b"during the drain").await?;
    let mut b = [0u8; 16];
    tokio::time::timeout(STEP, live.read_exact(&mut b)).await.context("echo during the drain")??;
    assert_eq!(&b, b"during the drain");
    let mut rest = Vec::new();
    tokio::time::timeout(STEP, live.read_to_end(&mut rest))
        .await
        .context("the live stream outlived the drain grace")??;
    let st = server.wait_exit(Duration::from_secs(20)).await.context("proxy-server did not exit on SIGTERM")?;
    assert!(st.success(), "proxy-server exited with {st}\n{}", server.log());
    drop(server);
    // The agent notices: its readiness drops.
    poll_until(STEP, TICK, || async {
        let (code, body) = http_get(aaddrs.admin()?, "/readyz?verbose").await?;
        anyhow::ensure!(code == 503 && body.contains("not connected"), "{code}: {body}");
        Ok(())
    })
    .await?;

    let (server, saddrs) = start_server(&dir, "server", &yaml).await?;
    assert_eq!(saddrs.listener("agents")?.port(), port);
    wait_agents(saddrs.admin()?, "shoot-a", 1.0).await.with_context(|| format!("agent log:\n{}", agent.log()))?;
    testbed::wait_ready(aaddrs.admin()?, STEP).await?;
    echo_roundtrip(&Dialer::Tcp(saddrs.listener("egress")?), echo.addr(), b"after restart")
        .await
        .with_context(|| format!("server log:\n{}\nagent log:\n{}", server.log(), agent.log()))?;
    let after = reconnects(&metrics(aaddrs.admin()?).await?);
    assert!(after > before, "seedgate_tunnel_reconnects_total did not move: {before} -> {after}");
    Ok(())
}

/// Test 8: two clusters on one server never see each other's streams.
#[tokio::test]
async fn two_clusters_never_see_each_others_streams() -> anyhow::Result<()> {
    let dir = TempDir::new("tunnel-two")?;
    let pki = TunnelPki::new(dir.path())?;
    let fes = [Fe::new("fe-a", "shoot-a", FeKind::Plain), Fe::new("fe-b", "shoot-b", FeKind::Plain)];
    let (server, saddrs) = inproc_server(&dir, &server_yaml(&pki, "127.0.0.1:0", &fes, "")).await?;
    let agents_addr = saddrs.listener("agents")?;
    // Each shoot's network holds one backend; each agent may only reach its own.
    let (echo_a, echo_b) = (TcpEcho::start().await?, TcpEcho::start().await?);
    let allow_a = format!("127.0.0.1/32:{}", echo_a.addr().port());
    let allow_b = format!("127.0.0.1/32:{}", echo_b.addr().port());
    let (agent_a, a_addrs) =
        inproc_agent(&dir, &agent_yaml(&pki, &AgentOpts::new("shoot-a", agents_addr, &[&allow_a]))?).await?;
    let (agent_b, b_addrs) =
        inproc_agent(&dir, &agent_yaml(&pki, &AgentOpts::new("shoot-b", agents_addr, &[&allow_b]))?).await?;
    wait_agents(saddrs.admin()?, "shoot-a", 1.0).await?;
    wait_agents(saddrs.admin()?, "shoot-b", 1.0).await?;
    let fe_a = Dialer::Tcp(saddrs.listener("fe-a")?);
    let fe_b = Dialer::Tcp(saddrs.listener("fe-b")?);

    echo_roundtrip(&fe_a, echo_a.addr(), b"a to a").await?;
    echo_roundtrip(&fe_b, echo_b.addr(), b"b to b").await?;
    // Across: only the other cluster's agent could reach it, and it is never asked.
    for (d, target, what) in [(&fe_a, echo_b.addr(), "a to b"), (&fe_b, echo_a.addr(), "b to a")] {
        let e = match connect(d, &target.to_string()).await {
            Ok(_) => panic!("{what}: CONNECT succeeded across clusters"),
            Err(e) => e,
        };
        let r = refusal_of(&e).with_context(|| format!("{what}: {e:#}"))?;
        assert_eq!(r.status, 403, "{what}: {r}");
    }
    assert_eq!((echo_a.connections(), echo_b.connections()), (1, 1));

    let m = metrics(saddrs.admin()?).await?;
    for c in ["shoot-a", "shoot-b"] {
        assert_eq!(metric_value(&m, "seedgate_tunnel_streams_opened_total", &[("cluster", c)]), Some(1.0), "{c}\n{m}");
        assert_eq!(
            metric_value(&m, "seedgate_tunnel_dial_failures_total", &[("cluster", c), ("reason", "not_allowed")]),
            Some(1.0),
            "{c}\n{m}"
        );
    }
    // Each agent saw exactly its own cluster's two dials: one opened, one refused.
    for (agent, addrs, own, other) in
        [(&agent_a, &a_addrs, echo_a.addr(), echo_b.addr()), (&agent_b, &b_addrs, echo_b.addr(), echo_a.addr())]
    {
        let m = metrics(addrs.admin()?).await?;
        assert_eq!(metric_sum(&m, "seedgate_tunnel_streams_opened_total", &[]), 1.0, "{m}");
        assert_eq!(metric_sum(&m, "seedgate_tunnel_dial_failures_total", &[]), 1.0, "{m}");
        assert_eq!(
            metric_value(&m, "seedgate_tunnel_dial_failures_total", &[("reason", "not_allowed")]),
            Some(1.0),
            "{m}"
        );
        agent.wait_log_line(&["stream closed", &format!("target={own}")], STEP).await?;
        agent.wait_log_line(&["dial refused", &format!("target={other}"), "reason=\"not_allowed\""], STEP).await?;
        let log = agent.log();
        assert!(
            !log.lines().any(|l| l.contains("stream closed") && l.contains(&format!("target={other}"))),
            "an agent carried the other cluster's stream:\n{log}"
        );
    }
    drop(server);
    Ok(())
}

/// Test 9: after thousands of short connections (orderly, aborted, refused, forward-proxy) the active-stream
/// gauges of both processes return to zero and their descriptor counts to the baseline.
#[tokio::test]
async fn thousands_of_short_connections_leave_nothing_behind() -> anyhow::Result<()> {
    let w = World::processes(Transport::H2).await?;
    let d = w.plain("egress")?;
    let echo = TcpEcho::start().await?;
    let page = HttpBackend::start("text/plain", "page\n").await?;
    let closed_port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let (sadmin, aadmin) = (w.saddrs.admin()?, w.aaddrs.admin()?);
    let gauges_zero = || async {
        let (s, a) = (metrics(sadmin).await?, metrics(aadmin).await?);
        let sv = metric_sum(&s, "seedgate_tunnel_streams_active", &[]);
        let av = metric_sum(&a, "seedgate_tunnel_streams_active", &[]);
        anyhow::ensure!(sv == 0.0 && av == 0.0, "streams active: server {sv}, agent {av}");
        Ok(())
    };
    // Warm up (lazily created state, thread pools), then take the baseline.
    for _ in 0..20 {
        echo_roundtrip(&d, echo.addr(), b"warm up").await?;
    }
    poll_until(STEP, TICK, gauges_zero).await?;
    let base = (fd_count(w.server.pid())?, fd_count(w.agent.pid())?);

    const TOTAL: u64 = 3000;
    const CONCURRENCY: u64 = 32;
    let next = Arc::new(AtomicU64::new(0));
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..CONCURRENCY {
        let (d, next, echo, closed, page) =
            (d.clone(), next.clone(), echo.addr(), closed_port.to_string(), page.addr());
        set.spawn(async move {
            // Each worker takes the next number until all are taken (at most TOTAL rounds).
            for _ in 0..TOTAL {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= TOTAL {
                    break;
                }
                match i % 6 {
                    // A refused dial (502): no stream may be left behind either.
                    0 => {
                        let e = connect(&d, &closed).await.err().context("CONNECT to a closed port succeeded")?;
                        let r = refusal_of(&e).with_context(|| format!("{e:#}"))?;
                        anyhow::ensure!(r.status == 502, "{r}");
                    }
                    // Aborted: data in flight both ways, then the client just goes away.
                    1 => {
                        let mut s = connect(&d, &echo.to_string()).await?;
                        s.write_all(&[1u8; 64 * 1024]).await?;
                        drop(s);
                    }
                    // Absolute-form (forward proxy): one tunnel stream per request.
                    2 => {
                        let mut s = d.connect().await?;
                        s.write_all(
                            format!("GET http://{page}/{i} HTTP/1.1\r\nHost: {page}\r\nConnection: close\r\n\r\n")
                                .as_bytes(),
                        )
                        .await?;
                        let mut out = Vec::new();
                        tokio::time::timeout(STEP, s.read_to_end(&mut out))
                            .await
                            .context("forward request timed out")??;
                        anyhow::ensure!(
                            out.starts_with(b"HTTP/1.1 200") && out.ends_with(b"page\n"),
                            "{}",
                            String::from_utf8_lossy(&out)
                        );
                    }
                    _ => echo_roundtrip(&d, echo, format!("conn {i}").as_bytes()).await?,
                }
            }
            anyhow::Ok(())
        });
    }
    tokio::time::timeout(Duration::from_secs(300), async {
        while let Some(r) = set.join_next().await {
            r??;
        }
        anyhow::Ok(())
    })
    .await
    .with_context(|| format!("short connections did not finish\n{}", w.logs()))??;

    poll_until(STEP, TICK, gauges_zero).await.with_context(|| w.logs())?;
    // Slack: a few descriptors that come and go on their own and are not per connection: the
    // admin connection serving our /metrics request, the config file the reload watcher opens
    // every 200 ms, a pooled relay pipe/buffer per worker thread. A leak of even 0.2% of the
    // 3000 connections would exceed it.
    const SLACK: usize = 5;
    let counts = poll_until(STEP, TICK, || async {
        let now = (fd_count(w.server.pid())?, fd_count(w.agent.pid())?);
        anyhow::ensure!(
            now.0 <= base.0 + SLACK && now.1 <= base.1 + SLACK,
            "fds (server, agent): baseline {base:?}, now {now:?}"
        );
        Ok(now)
    })
    .await
    .with_context(|| w.logs())?;
    eprintln!("fds (server, agent): baseline {base:?}, after {TOTAL} connections {counts:?}");
    let m = metrics(sadmin).await?;
    assert_eq!(
        metric_value(&m, "seedgate_agents_connected", &[("cluster", "shoot-a")]),
        Some(1.0),
        "the session survived"
    );
    assert!(metric_sum(&m, "seedgate_tunnel_streams_opened_total", &[]) >= (TOTAL * 5 / 6) as f64, "{m}");
    assert_eq!(page.connections(), TOTAL / 6);
    Ok(())
}

/// Test 10: a starting server's `/readyz` waits for an agent of its configured cluster (within
/// `agents.settle_time`); the agent's `/readyz` is ready only while connected to its server.
#[tokio::test]
async fn readiness_follows_agent_sessions() -> anyhow::Result<()> {
    let dir = TempDir::new("tunnel-ready")?;
    let pki = TunnelPki::new(dir.path())?;
    let (mut server, saddrs) =
        start_server(&dir, "server", &server_yaml(&pki, "127.0.0.1:0", &[plain_fe()], "")).await?;
    let sadmin = saddrs.admin()?;
    let (code, body) = http_get(sadmin, "/readyz?verbose").await?;
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("[-]agents-settled failed: ") && body.contains("[i]cluster-shoot-a info: active: 0 agents"),
        "{body}"
    );

    let o = AgentOpts::new("shoot-a", saddrs.listener("agents")?, &["127.0.0.1/32"]);
    let (_agent, aaddrs) = start_agent(&dir, "agent", &agent_yaml(&pki, &o)?, None).await?;
    let body = poll_until(STEP, TICK, || async {
        let (code, body) = http_get(sadmin, "/readyz?verbose").await?;
        anyhow::ensure!(code == 200 && body.contains("shoot-a-node-1"), "{code}: {body}");
        Ok(body)
    })
    .await?;
    assert!(body.contains("cluster-shoot-a") && body.contains("1 agents"), "{body}");
    let (code, body) = http_get(aaddrs.admin()?, "/readyz?verbose").await?;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains(&format!("tunnel-{}", saddrs.listener("agents")?)) && body.contains("session up"), "{body}");

    // A stream live when the server dies: the agent ends its side towards the shoot too.
    let watcher = Watcher::start_on("127.0.0.1:0".parse()?, None).await?;
    let mut live = connect(&Dialer::Tcp(saddrs.listener("egress")?), &watcher.addr().to_string()).await?;
    live.write_all(b"x").await?;
    poll_until(STEP, TICK, || async { (watcher.bytes() == 1).then_some(()) }).await?;

    server.signal(libc::SIGKILL)?;
    poll_until(STEP, TICK, || async {
        let (code, body) = http_get(aaddrs.admin()?, "/readyz?verbose").await?;
        anyhow::ensure!(code == 503 && body.contains("not connected"), "{code}: {body}");
        Ok(())
    })
    .await?;
    let ends = poll_until(STEP, TICK, || async { Some(watcher.ends()).filter(|e| !e.is_empty()) }).await?;
    assert_eq!(ends, [End::Reset], "the backend connection of a stream whose session died");
    let m = metrics(aaddrs.admin()?).await?;
    assert_eq!(metric_value(&m, "seedgate_tunnel_streams_active", &[]), Some(0.0), "{m}");
    Ok(())
}

/// The agent's readiness and metrics name the transport its session runs over, and the server
/// lists the agent whichever transport it came in by.
#[tokio::test]
async fn readiness_names_the_transport() -> anyhow::Result<()> {
    for transport in [Transport::H2, Transport::Quic] {
        let w = World::plain_over(transport).await?;
        let echo = TcpEcho::start().await?;
        echo_roundtrip(&w.plain("egress")?, echo.addr(), b"which transport").await.with_context(|| w.logs())?;
        let (name, listener) = match transport {
            Transport::H2 => ("h2", "agents"),
            Transport::Quic => ("quic", "agents-quic"),
        };
        let (code, body) = http_get(w.aaddrs.admin()?, "/readyz?verbose").await?;
        assert_eq!(code, 200, "{body}");
        assert!(body.contains(&format!("over {name}")) && body.contains(&format!("transport {name}")), "{body}");
        let m = metrics(w.aaddrs.admin()?).await?;
        let server = w.saddrs.listener(listener)?.to_string();
        assert_eq!(
            metric_value(&m, "seedgate_tunnel_transport_info", &[("server", &server), ("transport", name)]),
            Some(1.0),
            "{m}"
        );
        let (code, body) = http_get(w.saddrs.admin()?, "/readyz?verbose").await?;
        assert!(code == 200 && body.contains("shoot-a-node-1"), "{code}: {body}");
    }
    Ok(())
}

// An agent stopped with SIGTERM drains: a stream it carries keeps working for the drain grace,
// and a new CONNECT meanwhile gets 503 (no agent takes new streams) rather than a hang or a
// 502; once it is gone the front end says so (503 no agent).
over_both!(agent_sigterm: agent_sigterm_drains, agent_sigterm_drains_over_quic);

async fn agent_sigterm(transport: Transport) -> anyhow::Result<()> {
    let mut w = World::processes(transport).await?;
    let d = w.plain("egress")?;
    let echo = TcpEcho::start().await?;
    let mut live = connect(&d, &echo.addr().to_string()).await?;
    w.agent.process().signal(libc::SIGTERM)?;
    // The agent's GOAWAY is on its way; wait until the server has it (a new dial no longer
    // gets through), then check the answer.
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
    let st =
        w.agent.process().wait_exit(Duration::from_secs(20)).await.context("the agent did not exit after SIGTERM")?;
    assert!(st.success(), "agent exit {st}");
    wait_agents(w.saddrs.admin()?, "shoot-a", 0.0).await?;
    Ok(())
}

// A reset on one side resets the other: the backend's RST reaches the seed-side client as a
// reset (not an orderly end), the client's RST reaches the backend as one; a FIN stays a FIN.
over_both!(resets_propagate: resets_propagate_both_ways, resets_propagate_both_ways_over_quic);

async fn resets_propagate(transport: Transport) -> anyhow::Result<()> {
    let w = World::plain_over(transport).await?;
    let fe = w.saddrs.listener("egress")?;

    let resetter = Watcher::start_on("127.0.0.1:0".parse()?, Some(5)).await?;
    let (mut s, _) = connect_tcp(fe, &resetter.addr().to_string()).await?;
    s.write_all(b"hello").await?;
    let mut b = [0u8; 16];
    let r = tokio::time::timeout(STEP, s.read(&mut b)).await.context("no end after the backend reset")?;
    assert_eq!(resetter.ends(), [End::ResetSent]);
    assert!(
        matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
        "the backend reset its connection, the client saw {r:?} instead of a reset\n{}",
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

    let (mut s, _) = connect_tcp(fe, &watcher.addr().to_string()).await?;
    s.write_all(b"bye").await?;
    s.shutdown().await?;
    let ends = poll_until(STEP, TICK, || async { Some(watcher.ends()).filter(|e| e.len() == 2) }).await?;
    assert_eq!(ends[1], End::Eof);
    Ok(())
}

/// The keepalive of [`keepalive_detects_a_frozen_peer`].
const SHORT_KEEPALIVE: &str = "keepalive: { interval: 250ms, timeout: 1s }";

/// Keepalive: a frozen peer (SIGSTOP: its socket stays open, it only stops answering) is noticed
/// within the keepalive timeout by either end; after SIGCONT the agent reconnects and traffic
/// flows again. Short timers (interval 250ms, timeout 1s): the timing itself is tested with paused
/// time, over both transports, in proxy-core's seam suite (seed_session_ends_with_keepalive_timeout_when_the_agent_freezes,
/// agent_session_ends_with_keepalive_timeout_when_the_seed_freezes).
#[tokio::test]
async fn keepalive_detects_a_frozen_peer() -> anyhow::Result<()> {
    let mut w = World::processes_with_keepalive(Transport::H2, SHORT_KEEPALIVE).await?;
    let d = w.plain("egress")?;
    let echo = TcpEcho::start().await?;
    let sadmin = w.saddrs.admin()?;
    let aadmin = w.aaddrs.admin()?;

    let mut s = connect(&d, &echo.addr().to_string()).await?;
    s.write_all(b"ping").await?;
    let mut b = [0u8; 4];
    tokio::time::timeout(STEP, s.read_exact(&mut b)).await??;
    w.agent.process().signal(libc::SIGSTOP)?;
    // The bound: one keepalive interval plus its timeout, and slack for a loaded machine.
    let r = tokio::time::timeout(Duration::from_millis(250 + 1000 + 5000), s.read(&mut b)).await;
    let resumed = w.agent.process().signal(libc::SIGCONT);
    assert!(matches!(r, Ok(Ok(0) | Err(_))), "a stream of a frozen agent stayed open: {r:?}\n{}", w.logs());
    resumed?;
    // The server dropped the session; the agent, thawed, finds it gone and reconnects.
    wait_agents(sadmin, "shoot-a", 1.0).await.with_context(|| w.logs())?;
    // Right after the thaw, the session counted may yet be found dead by one end (its timers ran
    // on while the agent was stopped) and replaced: dials work again, not at once.
    poll_until(STEP, TICK, || echo_roundtrip(&d, echo.addr(), b"after the agent thawed"))
        .await
        .with_context(|| w.logs())?;

    w.server.process().signal(libc::SIGSTOP)?;
    let r = poll_until(Duration::from_millis(250 + 1000 + 5000), TICK, || async {
        let (code, body) = http_get(aadmin, "/readyz?verbose").await?;
        anyhow::ensure!(code == 503 && body.contains("not connected"), "{code}: {body}");
        Ok(())
    })
    .await;
    w.server.process().signal(libc::SIGCONT)?;
    r.with_context(|| format!("the agent did not notice its frozen server\n{}", w.logs()))?;
    testbed::wait_ready(aadmin, STEP).await?;
    wait_agents(sadmin, "shoot-a", 1.0).await.with_context(|| w.logs())?;
    // The thawed server may still list the session the agent gave up on, and drop it only when
    // it finds it dead, before the agent's new session registers: a dial in that moment is
    // answered "no agent connected". What must hold is that dials work again, not at once.
    poll_until(STEP, TICK, || echo_roundtrip(&d, echo.addr(), b"after the server thawed"))
        .await
        .with_context(|| w.logs())?;
    Ok(())
}

/// The agent's `max_streams`: one stream more is refused with 503 (stream_limit) and a one-line
/// reason; once a stream ends there is room again.
#[tokio::test]
async fn agent_stream_limit_answers_503() -> anyhow::Result<()> {
    let w = World::start_with(&[plain_fe()], "", |o| o.tunnel_extra = "  max_streams: 2\n".into(), &["127.0.0.1/32"])
        .await?;
    let d = w.plain("egress")?;
    let echo = TcpEcho::start().await?;
    let target = echo.addr().to_string();
    let a = connect(&d, &target).await?;
    let _b = connect(&d, &target).await?;
    let e = connect(&d, &target).await.err().context("a third stream got through max_streams: 2")?;
    let r = refusal_of(&e).with_context(|| format!("{e:#}"))?;
    assert_eq!(r.status, 503, "{r}");
    assert!(r.body.contains("stream limit") && r.body.trim_end().lines().count() == 1, "{r}");
    let m = metrics(w.aaddrs.admin()?).await?;
    assert_eq!(
        metric_value(&m, "seedgate_tunnel_stream_limit_hits_total", &[("limit", "max_streams")]),
        Some(1.0),
        "{m}"
    );
    drop(a);
    poll_until(STEP, TICK, || async {
        let m = metrics(w.aaddrs.admin()?).await?;
        anyhow::ensure!(metric_value(&m, "seedgate_tunnel_streams_active", &[]) == Some(1.0), "streams still active");
        Ok(())
    })
    .await?;
    echo_roundtrip(&d, echo.addr(), b"room again").await?;
    Ok(())
}

/// Bytes a client sends right behind its CONNECT head, before the 200, are not lost.
#[tokio::test]
async fn bytes_pipelined_after_the_connect_head_are_forwarded() -> anyhow::Result<()> {
    let w = World::start(&[plain_fe()], &["127.0.0.1/32"]).await?;
    let echo = TcpEcho::start().await?;
    let mut s = tokio::net::TcpStream::connect(w.saddrs.listener("egress")?).await?;
    let t = echo.addr();
    s.write_all(format!("CONNECT {t} HTTP/1.1\r\nHost: {t}\r\n\r\nearly bytes").as_bytes()).await?;
    s.shutdown().await?;
    let mut out = Vec::new();
    tokio::time::timeout(STEP, s.read_to_end(&mut out)).await??;
    assert_eq!(String::from_utf8_lossy(&out), "HTTP/1.1 200 Connection established\r\n\r\nearly bytes");
    Ok(())
}

#[test]
fn checksums_tell_streams_apart() {
    let a = Pattern::checksum(1, 1000);
    assert_eq!(a, Pattern::checksum(1, 1000));
    assert_ne!(a, Pattern::checksum(2, 1000));
    assert_ne!(a, Pattern::checksum(1, 999));
    let mut f = Crc::default();
    f.update(b"a");
    assert_eq!(f.0, 0xc1d0_4330, "CRC-32C of \"a\"");
}

/// The value of `key=<number>` in a log line.
fn field_u64(line: &str, key: &str) -> Option<u64> {
    let at = line.find(&format!("{key}="))? + key.len() + 1;
    line[at..].split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// An agent whose certificate the server does not trust (issued by another CA): its side of the
/// TLS handshake passes, the server's verdict comes after. The agent must not report the
/// session up, count it as a successful reconnect, or turn ready; it says what failed.
#[tokio::test]
async fn an_agent_refused_by_the_server_is_never_reported_up() -> anyhow::Result<()> {
    let dir = TempDir::new("tunnel-refused")?;
    let pki = TunnelPki::new(dir.path())?;
    let rogue_dir = dir.path().join("rogue");
    std::fs::create_dir_all(&rogue_dir)?;
    let rogue = TunnelPki::new(&rogue_dir)?;
    let (server, saddrs) = inproc_server(&dir, &server_yaml(&pki, "127.0.0.1:0", &[plain_fe()], "")).await?;
    let o = AgentOpts::new("shoot-a", saddrs.listener("agents")?, &["127.0.0.1/32"]);
    let (good_cert, good_key) = pki.agent("shoot-a")?;
    let (bad_cert, bad_key) = rogue.agent("shoot-a")?;
    let yaml = agent_yaml(&pki, &o)?
        .replace(&good_cert.display().to_string(), &bad_cert.display().to_string())
        .replace(&good_key.display().to_string(), &bad_key.display().to_string());
    anyhow::ensure!(yaml.contains(&bad_cert.display().to_string()), "{yaml}");
    let (agent, aaddrs) = inproc_agent(&dir, &yaml).await?;
    let aadmin = aaddrs.admin()?;
    // Its second attempt (the first reconnect) failed: counted as failed, never as ok.
    poll_until(STEP, TICK, || async {
        let m = metrics(aadmin).await?;
        let failed = metric_sum(&m, "seedgate_tunnel_reconnects_total", &[("result", "failed")]);
        anyhow::ensure!(failed >= 1.0, "no failed reconnect counted yet\n{}", agent.log());
        Ok(())
    })
    .await?;
    let m = metrics(aadmin).await?;
    assert_eq!(metric_sum(&m, "seedgate_tunnel_reconnects_total", &[("result", "ok")]), 0.0, "{m}");
    let log = agent.log();
    assert!(!log.contains("tunnel session up"), "{log}");
    assert!(log.contains("failed before it was up"), "{log}");
    let (code, body) = http_get(aadmin, "/readyz?verbose").await?;
    assert_ne!(code, 200, "{body}");
    let sm = metrics(saddrs.admin()?).await?;
    assert_eq!(metric_value(&sm, "seedgate_agents_connected", &[("cluster", "shoot-a")]).unwrap_or(0.0), 0.0);
    drop(server);
    Ok(())
}
