//! The QUIC transport on the suite's path: quinn endpoints over an in-memory datagram link that can go silent ([`Link`]), and a raw QUIC seed and agent that speak the tunnel's framing by hand.

use super::{Path, RawAgent, RawAnswer, RawControl, RawSeed, Transport, pki, within};
use proxy_core::sync::Mutex;
use proxy_core::tunnel::TunnelSettings;
use proxy_core::tunnel::quic::CLOSE_PROTOCOL;
use proxy_core::tunnel::session::SessionError;
use proxy_wire::tunnel::quic::{Answer, Progress, StreamHeader};
use std::collections::VecDeque;
use std::io::IoSliceMut;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

pub(crate) struct Quic;

const SEED_ADDR: &str = "192.0.2.1:8132";
const AGENT_ADDR: &str = "192.0.2.2:40000";

impl Transport for Quic {
    type SeedSide = quinn::Connection;
    type AgentSide = quinn::Connection;
    type RawSeed = RawQuicSeed;
    type RawAgent = RawQuicAgent;

    async fn connect(settings: &TunnelSettings) -> (quinn::Connection, quinn::Connection, Path) {
        let path = Path::default();
        let (sc, cc) = pki::quic_configs(settings);
        let (seed_sock, agent_sock) = Link::pair(SEED_ADDR.parse().unwrap(), AGENT_ADDR.parse().unwrap(), &path);
        let runtime: Arc<dyn quinn::Runtime> = Arc::new(quinn::TokioRuntime);
        let ep = |sock, server| {
            quinn::Endpoint::new_with_abstract_socket(quinn::EndpointConfig::default(), server, sock, runtime.clone())
                .unwrap()
        };
        let (seed_ep, agent_ep) = (ep(seed_sock, Some(sc)), ep(agent_sock, None));
        let connecting = agent_ep.connect_with(cc, SEED_ADDR.parse().unwrap(), pki::SERVER_NAME).unwrap();
        let accepted = async { seed_ep.accept().await.expect("an incoming connection").await };
        let (agent, seed) = within("QUIC handshake", async { tokio::join!(connecting, accepted) }).await;
        path.hold((seed_ep, agent_ep));
        (seed.unwrap(), agent.unwrap(), path)
    }

    fn silence_noticed_after(s: &TunnelSettings) -> Duration {
        s.keepalive_timeout
    }

    fn silence_noticed_by(s: &TunnelSettings) -> Duration {
        s.keepalive_timeout + s.ping_every()
    }

    fn is_silence(e: &SessionError, _s: &TunnelSettings) -> bool {
        let SessionError::Transport { source, .. } = e else { return false };
        matches!(source.downcast_ref::<quinn::ConnectionError>(), Some(quinn::ConnectionError::TimedOut))
    }

    const HEARD_PER_INTERVAL: u64 = 1;
    const DRAINING_REFUSAL_STOPS_OPENS: bool = true;
    const NOTICE_ON_CONTROL: bool = true;
    const CONTROL_FIRST: bool = true;
    const LIVE_PATH_TOLD_IN_VIRTUAL_TIME: bool = false;
}

/// Two quinn sockets joined in memory: a datagram one sends is queued for the other and wakes
/// it; while the path is silent it is lost.
#[derive(Debug)]
pub(crate) struct Link {
    addr: SocketAddr,
    peer: SocketAddr,
    inbox: Arc<Inbox>,
    peer_inbox: Arc<Inbox>,
    silent: SilentFlag,
}

/// Datagrams waiting for a socket, and the task waiting for them.
#[derive(Debug, Default)]
struct Inbox {
    queue: Mutex<Queued>,
}

#[derive(Debug, Default)]
struct Queued {
    /// By sender.
    datagrams: VecDeque<(SocketAddr, Vec<u8>)>,
    reader: Option<Waker>,
}

/// The path's silence, as a socket sees it.
struct SilentFlag(Path);

impl std::fmt::Debug for SilentFlag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "silent: {}", self.0.silent())
    }
}

/// Datagrams one inbox holds at most (beyond, as a full socket buffer does, they are lost).
const INBOX_MAX: usize = 4096;

impl Link {
    fn pair(
        a: SocketAddr,
        b: SocketAddr,
        path: &Path,
    ) -> (Arc<dyn quinn::AsyncUdpSocket>, Arc<dyn quinn::AsyncUdpSocket>) {
        let (ia, ib) = (Arc::new(Inbox::default()), Arc::new(Inbox::default()));
        let end = |addr, peer, inbox: &Arc<Inbox>, peer_inbox: &Arc<Inbox>| -> Arc<dyn quinn::AsyncUdpSocket> {
            Arc::new(Link {
                addr,
                peer,
                inbox: inbox.clone(),
                peer_inbox: peer_inbox.clone(),
                silent: SilentFlag(path.clone()),
            })
        };
        (end(a, b, &ia, &ib), end(b, a, &ib, &ia))
    }
}

/// A socket of the link can always send.
#[derive(Debug)]
struct Writable;

impl quinn::UdpPoller for Writable {
    fn poll_writable(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl quinn::AsyncUdpSocket for Link {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn quinn::UdpPoller>> {
        Box::pin(Writable)
    }

    fn try_send(&self, t: &quinn::udp::Transmit<'_>) -> std::io::Result<()> {
        if self.silent.0.silent() || t.destination != self.peer {
            return Ok(());
        }
        let mut q = self.peer_inbox.queue.lock();
        let size = t.segment_size.unwrap_or(t.contents.len()).max(1);
        for datagram in t.contents.chunks(size) {
            if q.datagrams.len() < INBOX_MAX {
                q.datagrams.push_back((self.addr, datagram.to_vec()));
            }
        }
        if let Some(w) = q.reader.take() {
            w.wake();
        }
        Ok(())
    }

    fn poll_recv(
        &self,
        cx: &mut Context<'_>,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [quinn::udp::RecvMeta],
    ) -> Poll<std::io::Result<usize>> {
        let mut q = self.inbox.queue.lock();
        let mut n = 0;
        for (buf, m) in bufs.iter_mut().zip(meta.iter_mut()) {
            let Some((from, d)) = q.datagrams.pop_front() else { break };
            let len = d.len().min(buf.len());
            buf[..len].copy_from_slice(&d[..len]);
            *m = quinn::udp::RecvMeta::default();
            (m.addr, m.len, m.stride, m.dst_ip) = (from, len, len, Some(self.addr.ip()));
            n += 1;
        }
        if n == 0 {
            q.reader = Some(cx.waker().clone());
            return Poll::Pending;
        }
        Poll::Ready(Ok(n))
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.addr)
    }

    fn may_fragment(&self) -> bool {
        false
    }
}

/// Read one framed message (a stream header, an answer) off `recv`.
async fn read_framed<T, E: std::fmt::Debug>(
    recv: &mut quinn::RecvStream,
    read: fn(&[u8]) -> Result<Progress<T>, E>,
) -> T {
    let mut buf = Vec::new();
    loop {
        match read(&buf).expect("well framed") {
            Progress::Done(v, _) => return v,
            Progress::More(n) => {
                let mut more = vec![0; n];
                recv.read_exact(&mut more).await.expect("the rest of the message");
                buf.extend_from_slice(&more);
            }
        }
    }
}

/// A raw QUIC connection as the seed.
pub(crate) struct RawQuicSeed {
    conn: quinn::Connection,
}

pub(crate) struct RawQuicControl {
    send: quinn::SendStream,
    recv: quinn::RecvStream,
}

impl RawSeed for RawQuicSeed {
    type Side = quinn::Connection;
    type Control = RawQuicControl;

    async fn start(side: quinn::Connection) -> Self {
        Self { conn: side }
    }

    async fn control(&mut self) -> (RawQuicControl, Vec<u8>) {
        let (mut send, mut recv) = self.conn.open_bi().await.unwrap();
        send.write_all(&StreamHeader::control().encode().unwrap()).await.unwrap();
        let mut hello = Vec::new();
        while !hello.ends_with(b"\n") {
            let mut byte = [0u8];
            within("hello", recv.read_exact(&mut byte)).await.expect("the agent's hello");
            hello.push(byte[0]);
        }
        (RawQuicControl { send, recv }, hello)
    }

    fn connect(&mut self, target: &str) -> impl Future<Output = RawAnswer> + Send + use<> {
        let (conn, header) = (self.conn.clone(), StreamHeader::connect(target).encode().unwrap());
        async move {
            let (mut send, mut recv) = conn.open_bi().await.unwrap();
            send.write_all(&header).await.unwrap();
            let (code, reason) = match read_framed(&mut recv, Answer::read).await {
                Answer::Connected => (String::new(), String::new()),
                Answer::Refused { code, reason } => (code, reason),
            };
            // A refusal ends the stream; an accepted stream's bytes follow.
            let ended = !code.is_empty() && matches!(recv.read(&mut [0u8; 1]).await, Ok(None));
            RawAnswer { status: None, code, reason, ended }
        }
    }

    async fn unknown_request_refused(&mut self) {
        let (mut send, mut recv) = self.conn.open_bi().await.unwrap();
        let header = StreamHeader { kind: 0x7f, target: String::new() };
        send.write_all(&header.encode().unwrap()).await.unwrap();
        match within("answer to an unknown kind", read_framed(&mut recv, Answer::read)).await {
            Answer::Refused { code, reason } => {
                assert_eq!(code, "bad_target");
                assert!(reason.contains("unexpected stream kind"), "{reason}");
            }
            Answer::Connected => panic!("a stream of an unknown kind was taken"),
        }
    }

    async fn closed_for_protocol(&mut self) {
        let e = within("connection close", self.conn.closed()).await;
        assert!(
            matches!(&e, quinn::ConnectionError::ApplicationClosed(c) if c.error_code == quinn::VarInt::from_u32(CLOSE_PROTOCOL)),
            "{e:?}"
        );
    }
}

impl RawControl for RawQuicControl {
    async fn send(&mut self, bytes: &[u8]) {
        self.send.write_all(bytes).await.unwrap();
    }

    async fn ended_by_agent(&mut self) {
        let end = within("control stream end", self.recv.read(&mut [0u8; 64])).await;
        assert!(matches!(end, Ok(None) | Err(_)), "control stream not ended by the agent: {end:?}");
    }
}

/// A raw QUIC connection as the agent: it takes the seed's control stream and holds it.
pub(crate) struct RawQuicAgent {
    conn: quinn::Connection,
    _control: (quinn::SendStream, quinn::RecvStream),
}

impl RawAgent for RawQuicAgent {
    type Side = quinn::Connection;

    async fn start(side: quinn::Connection) -> Self {
        let (send, mut recv) = within("the seed's control stream", side.accept_bi()).await.unwrap();
        let header = read_framed(&mut recv, StreamHeader::read).await;
        assert_eq!(header, StreamHeader::control());
        Self { conn: side, _control: (send, recv) }
    }

    async fn answer_foreign(&mut self) -> &'static str {
        let (mut send, mut recv) = within("a stream open", self.conn.accept_bi()).await.unwrap();
        let _ = read_framed(&mut recv, StreamHeader::read).await;
        send.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n").await.unwrap();
        let _ = send.finish();
        tokio::spawn(async move {
            let _streams = (send, recv);
            std::future::pending::<()>().await
        });
        "answer from the agent"
    }
}

/// A stream's bytes as the far end received them until the path fell quiet (the stream is not
/// ended).
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
/// agent against a raw QUIC seed. Run by hand: `cargo test -p proxy-core --test it --
/// --ignored write_tunnel_corpus`.
#[tokio::test(start_paused = true)]
#[ignore]
async fn write_tunnel_corpus() {
    use super::{next_incoming, spawn_agent, spawn_seed};
    use proxy_core::tunnel::{ControlMsg, DialError, ServerInfo};
    use tokio::io::AsyncWriteExt;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../wire/fuzz/corpus");
    let write = |dir: &str, name: &str, bytes: &[u8]| {
        std::fs::create_dir_all(root.join(dir)).unwrap();
        std::fs::write(root.join(dir).join(name), bytes).unwrap();
    };
    let settings = TunnelSettings::default();
    // Our seed → a raw agent: the control stream's header and lines, a connect stream's header
    // and the client's first bytes.
    let (seed_conn, agent_conn, _path) = Quic::connect(&settings).await;
    let seed = spawn_seed::<Quic>(seed_conn, &settings).await;
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
        let mut s = opener.open("kube-apiserver.shoot--a--b.svc.cluster.local:443", super::BOUND).await.unwrap();
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
    let (seed_conn, agent_conn, _path) = Quic::connect(&settings).await;
    let mut agent = spawn_agent::<Quic>(agent_conn, &settings);
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
        let inc = next_incoming(&mut agent).await;
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
