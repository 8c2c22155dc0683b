//! The session seam's one test suite: every case runs over HTTP/2 and over QUIC, on a paused clock, through the entry points the binaries use.
//!
//! A case is a function generic over a [`Transport`]; [`over_both!`] makes it a test once per
//! transport (`seam::<topic>::h2::<case>` and `seam::<topic>::quic::<case>`). The seed end is
//! `run_seed_session` on the transport's [`SeedConnection`], the agent end `run_agent_session`
//! on its [`AgentConnection`] with a handler that hands every stream and control message to the
//! test. Where a case must say what the provided ends never say (an oversized control line, an
//! answer no agent of ours gives) one end is a raw peer of the transport instead
//! ([`RawSeed`], [`RawAgent`]), which also reads what is on the wire as that transport frames it.
//!
//! Both transports run on an in-memory path ([`Path`]): HTTP/2 over TLS over a duplex pipe,
//! QUIC (quinn) over a datagram link of its own ([`quic::Link`]) rather than UDP sockets. Real
//! sockets are I/O the runtime only polls when it parks, and a paused clock jumps to the next
//! timer whenever it parks, so quinn's loss and idle timers would fire while packets are still
//! in the kernel; an in-memory path wakes the receiving task directly, as the duplex does for
//! HTTP/2, and the clock only jumps when both ends are idle. Every wait is bounded in virtual
//! time ([`within`]). A path can go silent ([`Path::go_silent`]): what either end sends is lost.
//! quinn's own UDP behaviour (packet sizes, GRO) is tested on loopback in `quic_udp`.

mod control;
mod h2;
mod keepalive;
mod quic;
mod refusals;
mod resets;
mod stopping;
mod streams;

use proxy_core::tunnel::session::{
    AgentConnection, AgentSession, SeedConnection, SessionError, run_agent_session, run_seed_session,
};
use proxy_core::tunnel::{
    AgentHandler, AgentHello, BoxFuture, ControlMsg, DialError, Incoming, Opener, TunnelSettings, TunnelStream,
};
use std::future::Future;
use std::io::ErrorKind;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Each case, once per transport: `h2::<case>` and `quic::<case>` in the calling module.
macro_rules! over_both {
    ($($case:ident),+ $(,)?) => {
        mod h2 {
            $(
                #[tokio::test(start_paused = true)]
                async fn $case() {
                    super::$case::<crate::seam::h2::H2>().await
                }
            )+
        }
        mod quic {
            $(
                #[tokio::test(start_paused = true)]
                async fn $case() {
                    super::$case::<crate::seam::quic::Quic>().await
                }
            )+
        }
    };
}
use over_both;

/// Bound on any single wait, in virtual time.
pub(crate) const BOUND: Duration = Duration::from_secs(60);
/// The `open` timeout where the case is not about it: longer than `BOUND`, so a stuck open fails
/// the case through `within` rather than turning into a dial timeout.
pub(crate) const OPEN_TIMEOUT: Duration = Duration::from_secs(600);

/// What a transport gives the suite: a connected pair of ends on a [`Path`], raw peers, and the
/// few things the transports say differently.
pub(crate) trait Transport: Sized + 'static {
    type SeedSide: SeedConnection;
    type AgentSide: AgentConnection;
    type RawSeed: RawSeed<Side = Self::SeedSide>;
    type RawAgent: RawAgent<Side = Self::AgentSide>;

    /// A connection between the two ends, its handshake done (TLS, or QUIC's): the seed's side
    /// (the server), the agent's (the client), and the path between them.
    fn connect(settings: &TunnelSettings) -> impl Future<Output = (Self::SeedSide, Self::AgentSide, Path)>;

    /// How long after its path went silent an end gives up on a session at the earliest, and at
    /// the latest; and whether `e` is the error it gives up with. HTTP/2: its first unanswered
    /// PING goes out one interval after the last, and is lost one timeout later. QUIC: the idle
    /// timeout, from the last packet received; but the idle timer also restarts at the first
    /// ack-eliciting packet sent after a receipt (RFC 9000, 10.1), and a keepalive goes out
    /// within one PING interval, so it may end up to that much later.
    fn silence_noticed_after(settings: &TunnelSettings) -> Duration;
    fn silence_noticed_by(settings: &TunnelSettings) -> Duration {
        Self::silence_noticed_after(settings)
    }
    fn is_silence(e: &SessionError, settings: &TunnelSettings) -> bool;

    /// What `Opener::heard` counts at least per keepalive interval of an idle session (HTTP/2:
    /// bytes read, one PING frame; QUIC: datagrams).
    const HEARD_PER_INTERVAL: u64;
    /// The seed's first stream must be the control stream (QUIC); else any stream may come
    /// first, and a control stream may come again and replace the last (HTTP/2).
    const CONTROL_FIRST: bool;
    /// A stream refused as `draining` stops new opens on the session (QUIC: it is how the
    /// going-away notice reaches a stream that crossed it); else only the GOAWAY does (HTTP/2).
    const DRAINING_REFUSAL_STOPS_OPENS: bool;
    /// The agent's going-away notice reaches the seed by itself (QUIC: on the control stream);
    /// else the seed learns of it from its next open (HTTP/2's GOAWAY).
    const NOTICE_ON_CONTROL: bool;
    /// On the suite's path in virtual time, a live path is told from a quiet one (HTTP/2: PING
    /// answers). QUIC tells an acknowledgement by the new round-trip sample it brings, and on a
    /// path without delay in virtual time every sample is the same: there it cannot tell (the
    /// link emulator's tests check it in real time).
    const LIVE_PATH_TOLD_IN_VIRTUAL_TIME: bool;
}

/// A seed that speaks the transport by hand, for what our seed never sends.
pub(crate) trait RawSeed: Sized {
    type Side;
    type Control: RawControl;
    /// Start a session as a seed does (HTTP/2: the preface; QUIC: nothing yet).
    fn start(side: Self::Side) -> impl Future<Output = Self>;
    /// Open the control stream: its send half and the agent's hello line (with its newline).
    fn control(&mut self) -> impl Future<Output = (Self::Control, Vec<u8>)>;
    /// Ask for a stream to `target`; resolves to the agent's answer as it is on the wire.
    fn connect(&mut self, target: &str) -> impl Future<Output = RawAnswer> + Send + use<Self>;
    /// A request the protocol has no place for (HTTP/2: a GET; QUIC: a stream of an unknown
    /// kind): asserts it is refused as the transport refuses it.
    fn unknown_request_refused(&mut self) -> impl Future<Output = ()>;
    /// After the agent ended the session for a protocol error: asserts the transport said so.
    fn closed_for_protocol(&mut self) -> impl Future<Output = ()>;
}

/// The seed's half of a raw control stream.
pub(crate) trait RawControl {
    /// Send `bytes` as they are, in one piece (HTTP/2: one DATA frame; QUIC: one write).
    fn send(&mut self, bytes: &[u8]) -> impl Future<Output = ()>;
    /// Asserts the agent ended the stream (HTTP/2: reset with CANCEL; QUIC: its end).
    fn ended_by_agent(&mut self) -> impl Future<Output = ()>;
}

/// An agent's answer to a raw CONNECT, as the wire carries it.
#[derive(Debug)]
pub(crate) struct RawAnswer {
    /// The HTTP status, where the transport has one.
    pub(crate) status: Option<u16>,
    /// Empty when the stream was accepted.
    pub(crate) code: String,
    pub(crate) reason: String,
    /// The answer ended the stream.
    pub(crate) ended: bool,
}

/// An agent that speaks the transport by hand, for what our agent never answers.
pub(crate) trait RawAgent: Sized {
    type Side;
    /// Be there for the seed's session (its control stream taken, held open).
    fn start(side: Self::Side) -> impl Future<Output = Self>;
    /// Answer the next stream open the way no agent of ours does (HTTP/2: 502 without
    /// `seedgate-error`; QUIC: bytes that are no answer). The text the seed's transport error
    /// then names.
    fn answer_foreign(&mut self) -> impl Future<Output = &'static str>;
}

/// The in-memory path between two ends: while silent, whatever either end sends is lost. It
/// holds what the ends need to live as long as it does (QUIC's endpoints).
#[derive(Clone, Default)]
pub(crate) struct Path {
    silent: Arc<AtomicBool>,
    held: Arc<proxy_core::sync::Mutex<Vec<Box<dyn std::any::Any + Send>>>>,
}

impl Path {
    pub(crate) fn go_silent(&self) {
        self.silent.store(true, Ordering::Relaxed);
    }

    /// The path carries again (QUIC only: the HTTP/2 pipe lost what was written meanwhile).
    pub(crate) fn go_live(&self) {
        self.silent.store(false, Ordering::Relaxed);
    }

    pub(crate) fn silent(&self) -> bool {
        self.silent.load(Ordering::Relaxed)
    }

    pub(crate) fn hold(&self, x: impl std::any::Any + Send) {
        self.held.lock().push(Box::new(x));
    }
}

pub(crate) async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(BOUND, fut).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: not done within {BOUND:?} of virtual time"),
    }
}

pub(crate) fn agent_hello() -> AgentHello {
    AgentHello { node: "shoot-node-1".into(), version: "9.9.9-test".into(), ..AgentHello::default() }
}

/// Hands every incoming stream and control message to the test.
struct TestAgent {
    incoming: mpsc::UnboundedSender<Incoming>,
    control: mpsc::UnboundedSender<ControlMsg>,
    established: watch::Sender<bool>,
    quiet: watch::Sender<bool>,
}

impl AgentHandler for TestAgent {
    fn incoming(&self, inc: Incoming) -> BoxFuture<'static, ()> {
        let _ = self.incoming.send(inc);
        Box::pin(async {})
    }
    fn control(&self, msg: ControlMsg) {
        let _ = self.control.send(msg);
    }
    fn hello(&self) -> AgentHello {
        agent_hello()
    }
    fn established(&self) {
        let _ = self.established.send(true);
    }
    fn quiet(&self, silent: bool) {
        self.quiet.send_replace(silent);
    }
}

pub(crate) struct AgentEnd {
    pub(crate) incoming: mpsc::UnboundedReceiver<Incoming>,
    pub(crate) control: mpsc::UnboundedReceiver<ControlMsg>,
    pub(crate) established: watch::Receiver<bool>,
    /// What the session's keepalive last said of the path (true: quiet).
    pub(crate) quiet: watch::Receiver<bool>,
    pub(crate) stop: CancellationToken,
    pub(crate) task: JoinHandle<Result<(), SessionError>>,
}

pub(crate) struct SeedEnd {
    pub(crate) opener: Arc<dyn Opener>,
    pub(crate) hello: Arc<OnceLock<AgentHello>>,
    pub(crate) stop: CancellationToken,
    pub(crate) task: JoinHandle<Result<(), SessionError>>,
}

/// The agent's end of a session on `side`, run as proxy-agent runs it.
pub(crate) fn spawn_agent<T: Transport>(side: T::AgentSide, settings: &TunnelSettings) -> AgentEnd {
    let (itx, incoming) = mpsc::unbounded_channel();
    let (ctx, control) = mpsc::unbounded_channel();
    let (etx, established) = watch::channel(false);
    let (qtx, quiet) = watch::channel(false);
    let handler: Arc<dyn AgentHandler> =
        Arc::new(TestAgent { incoming: itx, control: ctx, established: etx, quiet: qtx });
    let stop = CancellationToken::new();
    let (settings, st) = (settings.clone(), stop.clone());
    let task = tokio::spawn(async move {
        let session = AgentSession { settings: &settings, handler, stop: st, tracker: TaskTracker::new() };
        run_agent_session(Box::new(side), session).await
    });
    AgentEnd { incoming, control, established, quiet, stop, task }
}

/// The seed's end of a session on `side`, run as proxy-server runs it; returns once it is up.
pub(crate) async fn spawn_seed<T: Transport>(side: T::SeedSide, settings: &TunnelSettings) -> SeedEnd {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let stop = CancellationToken::new();
    let (settings, st) = (settings.clone(), stop.clone());
    let task = tokio::spawn(async move {
        run_seed_session(side, &settings, st, move |s| {
            let opener: Arc<dyn Opener> = s.opener;
            let _ = tx.send((opener, s.hello));
        })
        .await
        .result
    });
    let (opener, hello) = within("seed session ready", rx).await.expect("on_ready called");
    SeedEnd { opener, hello, stop, task }
}

/// Both ends of a session over `T`, and its path.
pub(crate) async fn pair<T: Transport>(settings: &TunnelSettings) -> (SeedEnd, AgentEnd, Path) {
    let (seed, agent, path) = T::connect(settings).await;
    let agent = spawn_agent::<T>(agent, settings);
    let seed = spawn_seed::<T>(seed, settings).await;
    (seed, agent, path)
}

pub(crate) fn spawn_open(seed: &SeedEnd, target: &str) -> JoinHandle<Result<TunnelStream, DialError>> {
    let (opener, target) = (seed.opener.clone(), target.to_owned());
    tokio::spawn(async move { opener.open(&target, OPEN_TIMEOUT).await })
}

pub(crate) async fn next_incoming(agent: &mut AgentEnd) -> Incoming {
    within("incoming stream at the agent", agent.incoming.recv()).await.expect("agent handler alive")
}

/// Open a stream from the seed, check the target the agent sees, accept it: (seed end, agent end).
pub(crate) async fn open_accepted(seed: &SeedEnd, agent: &mut AgentEnd, target: &str) -> (TunnelStream, TunnelStream) {
    let open = spawn_open(seed, target);
    let inc = next_incoming(agent).await;
    assert_eq!(inc.target, target);
    let agent_side = inc.responder.accept().expect("accept");
    let seed_side = within("open", open).await.unwrap().expect("open succeeds once the agent accepted");
    (seed_side, agent_side)
}

/// Open a stream the agent refuses with `err`; the error `open` returns.
pub(crate) async fn open_refused(seed: &SeedEnd, agent: &mut AgentEnd, target: &str, err: &DialError) -> DialError {
    let open = spawn_open(seed, target);
    let inc = next_incoming(agent).await;
    assert_eq!(inc.target, target);
    inc.responder.refuse(err);
    match within("refused open", open).await.unwrap() {
        Ok(_) => panic!("open succeeded though the agent refused with {err:?}"),
        Err(e) => e,
    }
}

pub(crate) async fn read_exact_n(s: &mut TunnelStream, n: usize) -> Vec<u8> {
    let mut buf = vec![0; n];
    within("read", s.read_exact(&mut buf)).await.expect("read_exact");
    buf
}

pub(crate) async fn assert_eof(s: &mut TunnelStream) {
    let mut buf = [0u8; 16];
    let n = within("read to EOF", s.read(&mut buf)).await.expect("read at EOF");
    assert_eq!(n, 0, "expected EOF, got {:?}", &buf[..n]);
}

pub(crate) async fn assert_read_reset(s: &mut TunnelStream) {
    let mut buf = [0u8; 16];
    match within("read after reset", s.read(&mut buf)).await {
        Ok(n) => panic!("read returned {n} bytes / EOF instead of a reset"),
        Err(e) => assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}"),
    }
}

/// Write `data` and shut down, while reading to the end: what was read.
pub(crate) async fn pump(mut st: TunnelStream, out: Vec<u8>) -> Vec<u8> {
    let (mut r, mut w) = tokio::io::split(&mut st);
    let write = async {
        w.write_all(&out).await.unwrap();
        w.shutdown().await.unwrap();
    };
    let read = async {
        let mut got = Vec::new();
        r.read_to_end(&mut got).await.unwrap();
        got
    };
    let ((), got) = tokio::join!(write, read);
    got
}

/// Poll `cond` until it holds, within `BOUND` of virtual time.
pub(crate) async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    within(what, async {
        while !cond() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
}

pub(crate) fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

pub(crate) fn keepalive_settings() -> TunnelSettings {
    TunnelSettings {
        keepalive_interval: Duration::from_secs(5),
        keepalive_timeout: Duration::from_secs(15),
        ..TunnelSettings::default()
    }
}

pub(crate) fn move_msg(to: &[&str], ms: u64) -> ControlMsg {
    ControlMsg::Move { to: to.iter().map(|s| s.to_string()).collect(), drain_deadline_ms: ms }
}

/// A control message as one JSON line.
pub(crate) fn line(msg: &ControlMsg) -> Vec<u8> {
    let mut v = serde_json::to_vec(msg).unwrap();
    v.push(b'\n');
    v
}

/// The TLS material both transports use: a self-signed certificate for `seed.test`, the
/// tunnel's ALPN.
pub(crate) mod pki {
    use std::sync::Arc;

    pub(crate) const SERVER_NAME: &str = "seed.test";

    pub(crate) fn configs() -> (Arc<rustls::ServerConfig>, Arc<rustls::ClientConfig>) {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let key = rcgen::generate_simple_self_signed(vec![SERVER_NAME.to_owned()]).unwrap();
        let cert = key.cert.der().clone();
        let pkcs8 = rustls::pki_types::PrivatePkcs8KeyDer::from(key.signing_key.serialize_der());
        let mut server = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(vec![cert.clone()], pkcs8.into())
            .unwrap();
        server.alpn_protocols = vec![proxy_core::tunnel::ALPN_V1.to_vec()];
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert).unwrap();
        let mut client = rustls::ClientConfig::builder().with_root_certificates(roots).with_no_client_auth();
        client.alpn_protocols = vec![proxy_core::tunnel::ALPN_V1.to_vec()];
        (Arc::new(server), Arc::new(client))
    }

    /// quinn's server and client configs from [`configs`], with the tunnel's transport settings
    /// for the seed and the agent.
    pub(crate) fn quic_configs(
        settings: &proxy_core::tunnel::TunnelSettings,
    ) -> (quinn::ServerConfig, quinn::ClientConfig) {
        use proxy_core::tunnel::quic;
        use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
        let (server, client) = configs();
        let mut sc = quinn::ServerConfig::with_crypto(Arc::new(QuicServerConfig::try_from(server).unwrap()));
        sc.transport_config(Arc::new(quic::seed_transport_config(settings, None)));
        let mut cc = quinn::ClientConfig::new(Arc::new(QuicClientConfig::try_from(client).unwrap()));
        cc.transport_config(Arc::new(quic::agent_transport_config(settings, None)));
        (sc, cc)
    }
}
