//! In-process tests of the QUIC transport over loopback: both session loops on real quinn connections, QUIC's framing on the wire, the going-away notice; and the fuzzing corpora captured from such sessions.

use super::quic::{self, QuicOpener};
use super::{AgentHandler, AgentHello, BoxFuture, ControlMsg, DialError, Incoming, Opener, SeedSession, SessionError};
use super::{ServerInfo, TunnelSettings, TunnelStream};
use proxy_wire::tunnel::quic::{Answer, StreamHeader};
use std::future::Future;
use std::sync::Arc;
use std::sync::OnceLock;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Bound on any single wait (real time: quinn runs on real sockets and timers).
const BOUND: Duration = Duration::from_secs(10);

async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, fut).await.unwrap_or_else(|_| panic!("{what}: not done within {BOUND:?}"))
}

fn agent_hello() -> AgentHello {
    AgentHello { node: "shoot-node-1".into(), version: "9.9.9-test".into(), ..AgentHello::default() }
}

/// A quinn connection from an agent endpoint to a seed endpoint on loopback: (seed's, agent's).
async fn connected() -> (quinn::Connection, quinn::Connection, [quinn::Endpoint; 2]) {
    connected_with(&TunnelSettings::default()).await
}

/// As [`connected`], the agent's endpoint made with `agent_settings`.
async fn connected_with(
    agent_settings: &TunnelSettings,
) -> (quinn::Connection, quinn::Connection, [quinn::Endpoint; 2]) {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let key = rcgen::generate_simple_self_signed(vec!["seed.test".to_owned()]).unwrap();
    let cert = key.cert.der().clone();
    let pkcs8 = rustls::pki_types::PrivatePkcs8KeyDer::from(key.signing_key.serialize_der());
    let mut server = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(vec![cert.clone()], pkcs8.into())
        .unwrap();
    server.alpn_protocols = vec![super::ALPN_V1.to_vec()];
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert).unwrap();
    let mut client = rustls::ClientConfig::builder().with_root_certificates(roots).with_no_client_auth();
    client.alpn_protocols = vec![super::ALPN_V1.to_vec()];
    let settings = TunnelSettings::default();
    let (seed_transport, agent_transport) =
        (Arc::new(quic::seed_transport_config(&settings)), Arc::new(quic::agent_transport_config(&settings)));
    let mut sc = quinn::ServerConfig::with_crypto(Arc::new(
        quinn::crypto::rustls::QuicServerConfig::try_from(Arc::new(server)).unwrap(),
    ));
    sc.transport_config(seed_transport);
    let mut cc = quinn::ClientConfig::new(Arc::new(
        quinn::crypto::rustls::QuicClientConfig::try_from(Arc::new(client)).unwrap(),
    ));
    cc.transport_config(agent_transport);
    // The endpoints the binaries make (endpoint and transport settings, socket buffers).
    let local = "127.0.0.1:0".parse().unwrap();
    let seed_ep = quic::endpoint(
        local,
        &settings,
        Some(quic::Server { config: sc, stable: None }),
        "the seed's test endpoint",
        "-",
    )
    .unwrap();
    let agent_ep = quic::endpoint(local, agent_settings, None, "the agent's test endpoint", "-").unwrap();
    let connecting = agent_ep.connect_with(cc, seed_ep.local_addr().unwrap(), "seed.test").unwrap();
    let (agent, seed) = tokio::join!(connecting, async { seed_ep.accept().await.unwrap().await });
    (seed.unwrap(), agent.unwrap(), [seed_ep, agent_ep])
}

/// What the agent's handler saw, in order.
enum Seen {
    Stream(Incoming),
    Control(ControlMsg),
}

/// An agent handler that hands all it sees to the test.
struct Recorder(mpsc::UnboundedSender<Seen>);

impl AgentHandler for Recorder {
    fn incoming(&self, inc: Incoming) -> BoxFuture<'static, ()> {
        let _ = self.0.send(Seen::Stream(inc));
        Box::pin(std::future::ready(()))
    }
    fn control(&self, msg: ControlMsg) {
        let _ = self.0.send(Seen::Control(msg));
    }
    fn hello(&self) -> AgentHello {
        agent_hello()
    }
}

struct AgentEnd {
    seen: mpsc::UnboundedReceiver<Seen>,
    stop: CancellationToken,
    task: JoinHandle<Result<(), SessionError>>,
}

impl AgentEnd {
    async fn next(&mut self) -> Seen {
        within("the agent's handler", self.seen.recv()).await.expect("agent session alive")
    }

    async fn incoming(&mut self) -> Incoming {
        match self.next().await {
            Seen::Stream(inc) => inc,
            Seen::Control(m) => panic!("control message {m:?} where a stream was expected"),
        }
    }
}

fn spawn_agent(conn: quinn::Connection) -> AgentEnd {
    let (tx, seen) = mpsc::unbounded_channel();
    let handler: Arc<dyn AgentHandler> = Arc::new(Recorder(tx));
    let stop = CancellationToken::new();
    let st = stop.clone();
    let task = tokio::spawn(async move {
        quic::run_agent_session(conn, &TunnelSettings::default(), handler, st, TaskTracker::new()).await
    });
    AgentEnd { seen, stop, task }
}

struct SeedEnd {
    opener: Arc<QuicOpener>,
    hello: Arc<OnceLock<AgentHello>>,
    task: JoinHandle<Result<(), SessionError>>,
}

async fn spawn_seed(conn: quinn::Connection) -> SeedEnd {
    let (tx, rx) = tokio::sync::oneshot::channel::<SeedSession<QuicOpener>>();
    let task = tokio::spawn(async move {
        super::run_seed_session(conn, &TunnelSettings::default(), CancellationToken::new(), move |s| {
            let _ = tx.send(s);
        })
        .await
        .result
    });
    let s = within("seed session ready", rx).await.unwrap();
    SeedEnd { opener: s.opener, hello: s.hello, task }
}

async fn pair() -> (SeedEnd, AgentEnd, [quinn::Endpoint; 2]) {
    let (seed, agent, eps) = connected().await;
    let agent = spawn_agent(agent);
    (spawn_seed(seed).await, agent, eps)
}

async fn open_accepted(seed: &SeedEnd, agent: &mut AgentEnd, target: &str) -> (TunnelStream, TunnelStream) {
    let (opener, t) = (seed.opener.clone(), target.to_owned());
    let open = tokio::spawn(async move { opener.open(&t, BOUND).await });
    let inc = agent.incoming().await;
    assert_eq!(inc.target, target);
    let agent_side = inc.responder.accept().unwrap();
    (within("open", open).await.unwrap().unwrap(), agent_side)
}

async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    within(what, async {
        while !cond() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

#[tokio::test]
async fn streams_refusals_and_control_messages_go_through_a_quic_session() {
    let (seed, mut agent, _eps) = pair().await;
    eventually("agent hello at the seed", || seed.hello.get().is_some()).await;
    assert_eq!(seed.hello.get().cloned(), Some(agent_hello()));

    let (mut s, mut a) = open_accepted(&seed, &mut agent, "10.0.0.1:443").await;
    assert_eq!(seed.opener.active_streams(), 1);
    s.write_all(b"ping").await.unwrap();
    let mut buf = [0u8; 4];
    a.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"ping");
    a.write_all(b"pong").await.unwrap();
    a.shutdown().await.unwrap();
    let mut back = Vec::new();
    within("answer and FIN", s.read_to_end(&mut back)).await.unwrap();
    assert_eq!(back, b"pong");

    let err = DialError::NotAllowed("10.9.9.9:22 is not on the allowlist".into());
    let opener = seed.opener.clone();
    let open = tokio::spawn(async move { opener.open("10.9.9.9:22", BOUND).await.map(|_| ()) });
    agent.incoming().await.responder.refuse(&err);
    assert_eq!(within("refused open", open).await.unwrap(), Err(err));
    assert!(!seed.opener.is_closed(), "a refusal does not close the session");

    let msg = ControlMsg::Server(ServerInfo { id: "r0".into(), count: 2, since_ms: 1, draining: false });
    seed.opener.control(&msg).unwrap();
    match agent.next().await {
        Seen::Control(m) => assert_eq!(m, msg),
        Seen::Stream(inc) => panic!("a stream to {} where the control message was expected", inc.target),
    }
}

#[tokio::test]
async fn the_agents_going_away_notice_drains_the_session_then_both_ends_close() {
    let (seed, mut agent, _eps) = pair().await;
    eventually("agent hello at the seed", || seed.hello.get().is_some()).await;
    let (mut s, mut a) = open_accepted(&seed, &mut agent, "old:1").await;
    agent.stop.cancel();
    eventually("the seed sees the notice", || seed.opener.is_closed()).await;
    match seed.opener.open("new:1", BOUND).await {
        Err(e @ DialError::Draining(_)) => assert_eq!(e.http_status(), 503),
        other => panic!("open after the notice: {:?}", other.map(|_| ())),
    }
    // The stream opened before goes on to its end, and holds the session open.
    s.write_all(b"in flight").await.unwrap();
    let mut buf = [0u8; 9];
    a.read_exact(&mut buf).await.unwrap();
    assert!(!agent.task.is_finished());
    s.shutdown().await.unwrap();
    a.shutdown().await.unwrap();
    let (mut x, mut y) = (Vec::new(), Vec::new());
    within("FIN at the agent", a.read_to_end(&mut x)).await.unwrap();
    within("FIN at the seed", s.read_to_end(&mut y)).await.unwrap();
    drop((s, a));
    assert!(within("agent session end", agent.task).await.unwrap().is_ok());
    assert!(within("seed session end", seed.task).await.unwrap().is_ok());
}

#[tokio::test]
async fn a_first_stream_that_is_not_the_control_stream_ends_the_agents_session() {
    let (seed, agent_conn, _eps) = connected().await;
    let agent = spawn_agent(agent_conn);
    let (mut send, _recv) = seed.open_bi().await.unwrap();
    send.write_all(&StreamHeader::connect("x:1").encode().unwrap()).await.unwrap();
    match within("agent session end", agent.task).await.unwrap() {
        Err(SessionError::Protocol(m)) => assert!(m.contains("not control"), "{m}"),
        other => panic!("{other:?}"),
    }
    let e = within("connection close", seed.closed()).await;
    assert!(
        matches!(&e, quinn::ConnectionError::ApplicationClosed(c) if c.error_code == quinn::VarInt::from_u32(quic::CLOSE_PROTOCOL)),
        "{e:?}"
    );
}

/// A stream's bytes as the far end received them within a short wait (the stream is not ended).
async fn received(recv: &mut quinn::RecvStream) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(Ok(Some(n))) = tokio::time::timeout(Duration::from_millis(200), recv.read(&mut buf)).await {
        out.extend_from_slice(&buf[..n]);
    }
    out
}

/// Seeds for the fuzzing corpora (`wire/fuzz/corpus/{quic_stream,control_lines}/`), captured
/// from real sessions: our seed against a raw QUIC agent that records what it receives, and our
/// agent against a raw QUIC seed. Run by hand: `cargo test -p proxy-core --lib -- --ignored
/// write_tunnel_corpus`.
#[tokio::test]
#[ignore]
async fn write_tunnel_corpus() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../wire/fuzz/corpus");
    let write = |dir: &str, name: &str, bytes: &[u8]| {
        std::fs::create_dir_all(root.join(dir)).unwrap();
        std::fs::write(root.join(dir).join(name), bytes).unwrap();
    };
    // Our seed → a raw agent: the control stream's header and lines, a connect stream's header
    // and the client's first bytes.
    let (seed_conn, agent_conn, _eps) = connected().await;
    let seed = spawn_seed(seed_conn).await;
    let (mut ctl_send, mut ctl_recv) = agent_conn.accept_bi().await.unwrap();
    ctl_send.write_all(b"{\"node\":\"shoot-node-1\",\"version\":\"0.1.0\"}\n").await.unwrap();
    for msg in [
        ControlMsg::Server(ServerInfo {
            id: "proxy-server-0".into(),
            count: 3,
            since_ms: 1764084000000,
            draining: false,
        }),
        ControlMsg::Move { to: vec!["proxy.seed-b.example.com:8132".into()], drain_deadline_ms: 30000 },
        ControlMsg::Refused {
            reason: "cluster \"shoot-x\" (the certificate's CN) is not served by this proxy-server".into(),
        },
    ] {
        seed.opener.control(&msg).unwrap();
    }
    let control = received(&mut ctl_recv).await;
    write("quic_stream", "seed_control_stream.bin", &control);
    write("control_lines", "seed_control_lines.jsonl", &control[4..]);
    let opener = seed.opener.clone();
    let open = tokio::spawn(async move {
        let mut s = opener.open("kube-apiserver.shoot--a--b.svc.cluster.local:443", BOUND).await.unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: kube-apiserver\r\n\r\n").await.unwrap();
        s
    });
    let (mut send, mut recv) = agent_conn.accept_bi().await.unwrap();
    let header = received(&mut recv).await;
    send.write_all(&Answer::Connected.encode()).await.unwrap();
    let _stream = within("open", open).await.unwrap();
    let header = [header, received(&mut recv).await].concat();
    write("quic_stream", "seed_connect_header_and_request.bin", &header);

    // Our agent → a raw seed: the hello, the answers (accepted with the target's first bytes,
    // refused), the going-away notice.
    let (seed_conn, agent_conn, _eps) = connected().await;
    let mut agent = spawn_agent(agent_conn);
    let (mut ctl_send, mut ctl_recv) = seed_conn.open_bi().await.unwrap();
    ctl_send.write_all(&StreamHeader::control().encode().unwrap()).await.unwrap();
    let (mut answers, mut open_streams) = (Vec::new(), Vec::new());
    for (i, refusal) in [
        None,
        Some(DialError::NotAllowed("10.250.0.9:22 is not on the agent's allowlist".into())),
        Some(DialError::Refused("10.250.0.7:10250: Connection refused (os error 111)".into())),
        Some(DialError::Timeout("10.250.0.8:10250: dial timed out after 10s".into())),
        Some(DialError::Limit("16384 streams open".into())),
    ]
    .into_iter()
    .enumerate()
    {
        let (mut send, mut recv) = seed_conn.open_bi().await.unwrap();
        send.write_all(&StreamHeader::connect(&format!("10.250.0.{i}:10250")).encode().unwrap()).await.unwrap();
        let inc = agent.incoming().await;
        match &refusal {
            None => {
                let mut s = inc.responder.accept().unwrap();
                s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").await.unwrap();
                answers.push(("agent_answer_connected_and_response.bin".to_owned(), received(&mut recv).await));
                // Open while the agent goes away, so it sends its notice before it closes.
                open_streams.push((s, send, recv));
            }
            Some(e) => {
                inc.responder.refuse(e);
                answers.push((format!("agent_answer_{}.bin", e.code()), received(&mut recv).await));
            }
        }
    }
    for (name, bytes) in answers {
        write("quic_stream", &name, &bytes);
    }
    let hello = received(&mut ctl_recv).await;
    agent.stop.cancel();
    let notice = received(&mut ctl_recv).await;
    drop(open_streams);
    write("control_lines", "agent_hello_and_going_away.jsonl", &[hello, notice].concat());
}

/// On loopback (MTU 65,536) path MTU discovery lifts the packet size from 1,200 to the bound,
/// and quinn's GSO batches of such packets still fit one datagram: a bound too large for them
/// makes every batch fail to send, which quinn takes for a black hole and falls back to 1,200.
#[tokio::test]
async fn bulk_data_on_loopback_goes_in_packets_of_the_largest_size_without_a_black_hole() {
    let (seed, agent, _eps) = connected().await;
    // The seed opens every stream; the agent sends on its half.
    let (mut seed_tx, mut rx) = seed.open_bi().await.unwrap();
    seed_tx.write_all(b"x").await.unwrap();
    let (mut tx, _agent_rx) = within("the agent's accept", agent.accept_bi()).await.unwrap();
    tx.write_all(b"x").await.unwrap();
    let reader = tokio::spawn(async move { rx.read_to_end(32 << 20).await.unwrap().len() });
    let chunk = vec![7u8; 64 * 1024];
    // 16 MiB: discovery's probes are answered long before the end.
    for _ in 0..256 {
        within("a write", tx.write_all(&chunk)).await.unwrap();
    }
    tx.finish().unwrap();
    assert_eq!(within("the reader", reader).await.unwrap(), 1 + 256 * chunk.len());
    let path = agent.stats().path;
    assert_eq!(path.black_holes_detected, 0, "{path:?}");
    // Above what the default bound (Ethernet's 1,452) would reach; the bound itself once every
    // probe was answered.
    assert!(path.current_mtu > 1_452, "{path:?}");
}

/// The seed sends in packets as large as an agent's endpoint accepts (up to 6,500 with receive
/// offload; quinn's 1,472 without): a bulk transfer arrives whole and in order.
#[tokio::test]
async fn bulk_data_from_the_seed_reaches_an_agent_endpoint_whole() {
    bulk_from_the_seed(&TunnelSettings::default()).await;
}

/// With receive offload off, the agent's endpoint reads one packet per datagram: GRO must be off
/// on its socket too, or the kernel would coalesce packets into reads too small for them and cut
/// off all but the first (the transfer would stall on retransmissions).
#[tokio::test]
async fn bulk_data_from_the_seed_reaches_an_agent_endpoint_without_receive_offload_whole() {
    bulk_from_the_seed(&TunnelSettings { receive_offload: false, ..TunnelSettings::default() }).await;
}

async fn bulk_from_the_seed(agent_settings: &TunnelSettings) {
    let (seed, agent, _eps) = connected_with(agent_settings).await;
    let (mut tx, _rx) = seed.open_bi().await.unwrap();
    let sent: Vec<u8> = (0..16 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    let expected = sent.clone();
    let writer = tokio::spawn(async move {
        tx.write_all(&sent).await.unwrap();
        tx.finish().unwrap();
        tx
    });
    let (_agent_tx, mut rx) = within("the agent's accept", agent.accept_bi()).await.unwrap();
    let got = within("the transfer", rx.read_to_end(32 << 20)).await.unwrap();
    assert!(got == expected, "{} bytes arrived, {} sent, or not in order", got.len(), expected.len());
    drop(within("the writer", writer).await.unwrap());
    // The seed's packets: above the 1,472 quinn accepts by default once discovery ran, where
    // the agent accepts them; never above it for an agent without receive offload.
    let path = seed.stats().path;
    if agent_settings.receive_offload {
        assert!(path.current_mtu > 1_472, "{path:?}");
    } else {
        assert!(path.current_mtu <= 1_472, "{path:?}");
    }
}

/// The seed may open only a first allowance of streams on a new session (quinn allocates each
/// allowed stream's state up front); the agent raises it as streams fill it, so a thousand
/// streams open one after the other and stay open together.
#[tokio::test]
async fn streams_beyond_the_first_allowance_open_and_stay_open_together() {
    let (seed, mut agent, _eps) = pair().await;
    let mut held = Vec::new();
    for i in 0..1_000 {
        held.push(open_accepted(&seed, &mut agent, &format!("10.0.0.1:{}", 1_000 + i)).await);
    }
    assert_eq!(held.len(), 1_000);
}
