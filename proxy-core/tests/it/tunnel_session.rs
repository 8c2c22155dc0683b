//! In-process tests of the HTTP/2 tunnel session (`proxy_core::tunnel::h2`): streams, refusals, resets, keepalive, GOAWAY draining, the control stream and stopping, over an in-memory duplex with paused time.
//!
//! The seed end is `run_seed_session`, the agent end `run_agent_session` with a handler that hands
//! every incoming stream and control message to the test. Where a test must send what the
//! provided ends never send (an oversized control line, two lines in one frame), one end is a
//! raw `h2` client instead. Every wait is bounded in virtual time (`within`), so a hang fails the
//! test after a few milliseconds of wall time instead of stalling it.

use bytes::Bytes;
use proxy_core::tunnel::h2::{AgentHandler, H2Opener, SessionError, run_agent_session, run_seed_session};
use proxy_core::tunnel::{
    AgentHello, BoxFuture, CONTROL_PATH, ControlMsg, DialError, ERROR_HEADER, Incoming, Opener, REASON_HEADER,
    TunnelSettings, TunnelStream,
};
use std::future::Future;
use std::io::ErrorKind;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Bound on any single wait, in virtual time (every test runs with paused time).
const BOUND: Duration = Duration::from_secs(60);
/// The `open` timeout where the test is not about it: longer than `BOUND`, so a stuck open fails
/// the test through `within` rather than turning into a dial timeout.
const OPEN_TIMEOUT: Duration = Duration::from_secs(600);
const DUPLEX_BUF: usize = 1 << 20;
/// Size of an HTTP/2 PING frame (9-byte header + 8 bytes of payload); a PING ACK is the same size.
const PING_FRAME: u64 = 17;

async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(BOUND, fut).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: not done within {BOUND:?} of virtual time"),
    }
}

fn agent_hello() -> AgentHello {
    AgentHello { node: "shoot-node-1".into(), version: "9.9.9-test".into(), ..AgentHello::default() }
}

/// Hands every incoming stream and control message to the test.
struct TestAgent {
    incoming: mpsc::UnboundedSender<Incoming>,
    control: mpsc::UnboundedSender<ControlMsg>,
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
}

struct AgentEnd {
    incoming: mpsc::UnboundedReceiver<Incoming>,
    control: mpsc::UnboundedReceiver<ControlMsg>,
    stop: CancellationToken,
    task: JoinHandle<Result<(), SessionError>>,
}

struct SeedEnd {
    opener: Arc<H2Opener>,
    hello: Arc<OnceLock<AgentHello>>,
    stop: CancellationToken,
    task: JoinHandle<Result<(), SessionError>>,
}

fn spawn_agent<T>(io: T, settings: &TunnelSettings) -> AgentEnd
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (itx, incoming) = mpsc::unbounded_channel();
    let (ctx, control) = mpsc::unbounded_channel();
    let handler: Arc<dyn AgentHandler> = Arc::new(TestAgent { incoming: itx, control: ctx });
    let stop = CancellationToken::new();
    let (settings, st) = (settings.clone(), stop.clone());
    let task = tokio::spawn(async move { run_agent_session(io, &settings, handler, st, TaskTracker::new()).await });
    AgentEnd { incoming, control, stop, task }
}

async fn spawn_seed<T>(io: T, settings: &TunnelSettings) -> SeedEnd
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    let stop = CancellationToken::new();
    let (settings, st) = (settings.clone(), stop.clone());
    let task = tokio::spawn(async move {
        run_seed_session(io, &settings, st, move |s| {
            let _ = tx.send(s);
        })
        .await
        .result
    });
    let s = within("seed session ready", rx).await.expect("on_ready called");
    SeedEnd { opener: s.opener, hello: s.hello, stop, task }
}

async fn pair(settings: &TunnelSettings) -> (SeedEnd, AgentEnd) {
    let (a, b) = tokio::io::duplex(DUPLEX_BUF);
    let agent = spawn_agent(b, settings);
    let seed = spawn_seed(a, settings).await;
    (seed, agent)
}

fn spawn_open(seed: &SeedEnd, target: &str) -> JoinHandle<Result<TunnelStream, DialError>> {
    let (opener, target) = (seed.opener.clone(), target.to_owned());
    tokio::spawn(async move { opener.open(&target, OPEN_TIMEOUT).await })
}

async fn next_incoming(agent: &mut AgentEnd) -> Incoming {
    within("incoming stream at the agent", agent.incoming.recv()).await.expect("agent handler alive")
}

/// Open a stream from the seed, check the target the agent sees, accept it: (seed end, agent end).
async fn open_accepted(seed: &SeedEnd, agent: &mut AgentEnd, target: &str) -> (TunnelStream, TunnelStream) {
    let open = spawn_open(seed, target);
    let inc = next_incoming(agent).await;
    assert_eq!(inc.target, target);
    let agent_side = inc.responder.accept().expect("accept");
    let seed_side = within("open", open).await.unwrap().expect("open succeeds once the agent accepted");
    (seed_side, agent_side)
}

/// Open a stream the agent refuses with `err`; the error `open` returns.
async fn open_refused(seed: &SeedEnd, agent: &mut AgentEnd, target: &str, err: &DialError) -> DialError {
    let open = spawn_open(seed, target);
    let inc = next_incoming(agent).await;
    assert_eq!(inc.target, target);
    inc.responder.refuse(err);
    match within("refused open", open).await.unwrap() {
        Ok(_) => panic!("open succeeded though the agent refused with {err:?}"),
        Err(e) => e,
    }
}

async fn read_exact_n(s: &mut TunnelStream, n: usize) -> Vec<u8> {
    let mut buf = vec![0; n];
    within("read", s.read_exact(&mut buf)).await.expect("read_exact");
    buf
}

async fn assert_eof(s: &mut TunnelStream) {
    let mut buf = [0u8; 16];
    let n = within("read to EOF", s.read(&mut buf)).await.expect("read at EOF");
    assert_eq!(n, 0, "expected EOF, got {:?}", &buf[..n]);
}

async fn assert_read_reset(s: &mut TunnelStream) {
    let mut buf = [0u8; 16];
    match within("read after reset", s.read(&mut buf)).await {
        Ok(n) => panic!("read returned {n} bytes / EOF instead of a reset"),
        Err(e) => assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}"),
    }
}

/// Poll `cond` until it holds, within `BOUND` of virtual time.
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    within(what, async {
        while !cond() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

// ---------------------------------------------------------------------------------------------
// Streams
// ---------------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn stream_reaches_the_agent_and_carries_bytes_both_ways_with_half_close() {
    let (seed, mut agent) = pair(&TunnelSettings::default()).await;
    assert_eq!(seed.opener.active_streams(), 0);
    let (mut s, mut a) = open_accepted(&seed, &mut agent, "db.shoot.svc:5432").await;
    assert_eq!(seed.opener.active_streams(), 1);

    s.write_all(b"hello agent").await.unwrap();
    assert_eq!(read_exact_n(&mut a, 11).await, b"hello agent");
    a.write_all(b"hello seed").await.unwrap();
    assert_eq!(read_exact_n(&mut s, 10).await, b"hello seed");

    // Seed half-closes: the agent reads EOF, and can still send.
    s.shutdown().await.unwrap();
    assert_eof(&mut a).await;
    a.write_all(b"after your FIN").await.unwrap();
    assert_eq!(read_exact_n(&mut s, 14).await, b"after your FIN");
    // Writing after our own shutdown is an error, not a silent drop.
    assert_eq!(s.write(b"x").await.unwrap_err().kind(), ErrorKind::BrokenPipe);
    a.shutdown().await.unwrap();
    assert_eof(&mut s).await;

    drop(s);
    assert_eq!(seed.opener.active_streams(), 0, "a dropped stream is no longer counted");
    drop(a);
    assert!(!seed.task.is_finished() && !agent.task.is_finished(), "one stream's end does not end the session");
}

#[tokio::test(start_paused = true)]
async fn half_close_from_the_agent_side_leaves_the_seed_direction_open() {
    let (seed, mut agent) = pair(&TunnelSettings::default()).await;
    let (mut s, mut a) = open_accepted(&seed, &mut agent, "10.0.0.7:443").await;
    a.write_all(b"banner").await.unwrap();
    a.shutdown().await.unwrap();
    assert_eq!(read_exact_n(&mut s, 6).await, b"banner");
    assert_eof(&mut s).await;
    s.write_all(b"still here").await.unwrap();
    assert_eq!(read_exact_n(&mut a, 10).await, b"still here");
    s.shutdown().await.unwrap();
    assert_eof(&mut a).await;
}

/// Several MiB each way at once through windows much smaller than the data: only works if the
/// reader releases flow-control capacity as it consumes.
#[tokio::test(start_paused = true)]
async fn bulk_transfer_both_ways_through_small_windows() {
    let settings = TunnelSettings {
        stream_window: 32 * 1024,
        stream_window_quic: 32 * 1024,
        connection_window: 96 * 1024,
        max_frame_size: 16 * 1024,
        ..TunnelSettings::default()
    };
    let (seed, mut agent) = pair(&settings).await;
    let (s, a) = open_accepted(&seed, &mut agent, "bulk:9000").await;
    const LEN: usize = 3 * 1024 * 1024 + 17;
    let up = pattern(LEN, 1);
    let down = pattern(LEN, 2);

    async fn pump(mut st: TunnelStream, out: Vec<u8>) -> Vec<u8> {
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
    let (got_by_agent, got_by_seed) =
        within("bulk transfer", async { tokio::join!(pump(a, down.clone()), pump(s, up.clone())) }).await;
    assert!(got_by_agent == up, "agent received {} bytes, not the {} sent", got_by_agent.len(), up.len());
    assert!(got_by_seed == down, "seed received {} bytes, not the {} sent", got_by_seed.len(), down.len());
}

#[tokio::test(start_paused = true)]
async fn many_streams_are_independent() {
    let (seed, mut agent) = pair(&TunnelSettings::default()).await;
    let mut ends = Vec::new();
    for i in 0..8 {
        ends.push(open_accepted(&seed, &mut agent, &format!("svc-{i}:80")).await);
    }
    assert_eq!(seed.opener.active_streams(), 8);
    // Answer in reverse order: each stream gets its own bytes.
    for (i, (s, a)) in ends.iter_mut().enumerate().rev() {
        s.write_all(format!("req-{i}").as_bytes()).await.unwrap();
        assert_eq!(read_exact_n(a, 5).await, format!("req-{i}").as_bytes());
        a.write_all(format!("resp-{i}").as_bytes()).await.unwrap();
    }
    for (i, (s, _)) in ends.iter_mut().enumerate() {
        assert_eq!(read_exact_n(s, 6).await, format!("resp-{i}").as_bytes());
    }
    ends.truncate(3);
    assert_eq!(seed.opener.active_streams(), 3);
}

#[tokio::test(start_paused = true)]
async fn unparsable_target_fails_as_bad_target_without_reaching_the_agent() {
    let (seed, mut agent) = pair(&TunnelSettings::default()).await;
    match seed.opener.open("bad target with spaces", OPEN_TIMEOUT).await {
        Ok(_) => panic!("opened a stream to an unparsable target"),
        Err(e) => assert!(matches!(e, DialError::BadTarget(_)), "{e:?}"),
    }
    // The next stream the agent sees is the next valid one: the bad one never went out.
    let (_s, _a) = open_accepted(&seed, &mut agent, "good:1").await;
}

// ---------------------------------------------------------------------------------------------
// Refusals and dial failures
// ---------------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn refusals_arrive_at_the_seed_as_the_same_dial_error() {
    let (seed, mut agent) = pair(&TunnelSettings::default()).await;
    let cases = [
        (DialError::NotAllowed("10.1.2.3:22 is not on the allowlist".into()), "not_allowed", 403),
        (DialError::Refused("10.1.2.3:80: connection refused".into()), "refused", 502),
        (DialError::Unreachable("10.1.2.3:80: no route".into()), "unreachable", 502),
        (DialError::Resolve("nope.svc: NXDOMAIN".into()), "resolve_failed", 502),
        (DialError::Timeout("10.1.2.3:80: timed out".into()), "dial_timeout", 504),
        (DialError::Limit("16384 streams open".into()), "stream_limit", 503),
        (DialError::Draining("agent shutting down".into()), "draining", 503),
        (DialError::BadTarget("no port".into()), "bad_target", 400),
    ];
    for (i, (err, code, status)) in cases.iter().enumerate() {
        let got = open_refused(&seed, &mut agent, &format!("t{i}:1"), err).await;
        assert_eq!(&got, err, "variant and reason survive the trip");
        assert_eq!(got.code(), *code);
        assert_eq!(got.http_status(), *status);
        assert_eq!(seed.opener.active_streams(), 0, "a refused open is not an active stream");
    }
    assert!(!seed.opener.is_closed(), "refusals do not close the session");
    let (_s, _a) = open_accepted(&seed, &mut agent, "after-refusals:1").await;
}

/// Codes the agent never sends (they are made on the seed) have no wire mapping back: they
/// arrive as a transport error that names the code.
#[tokio::test(start_paused = true)]
async fn seed_only_codes_arrive_as_transport_errors_naming_the_code() {
    let (seed, mut agent) = pair(&TunnelSettings::default()).await;
    for (err, code) in [
        (DialError::NoAgent("x".into()), "no_agent"),
        (DialError::Moved("x".into()), "cluster_moved"),
        (DialError::Transport("x".into()), "tunnel_error"),
    ] {
        let got = open_refused(&seed, &mut agent, "t:1", &err).await;
        assert_eq!(got, DialError::Transport(format!("{code}: x")));
    }
}

/// What the agent puts on the wire for a refusal, seen by a raw HTTP/2 client: the status of
/// `DialError::http_status`, the code header, and the reason stripped of what a header value
/// cannot carry and cut to 256 characters.
#[tokio::test(start_paused = true)]
async fn refusal_on_the_wire_has_status_code_header_and_sanitised_reason() {
    let (a, b) = tokio::io::duplex(DUPLEX_BUF);
    let mut agent = spawn_agent(b, &TunnelSettings::default());
    let mut send = raw_seed(a).await;
    let cases = [
        (DialError::NotAllowed("n".into()), 403),
        (DialError::Refused("r".into()), 502),
        (DialError::Timeout("t".into()), 504),
        (DialError::Limit("l".into()), 503),
        (DialError::BadTarget("b".into()), 400),
    ];
    for (err, status) in cases {
        let resp = raw_connect(&mut send, "x:1");
        let inc = next_incoming(&mut agent).await;
        inc.responder.refuse(&err);
        let resp = within("raw response", resp).await.expect("response");
        assert_eq!(resp.status().as_u16(), status, "{err:?}");
        assert_eq!(resp.headers()[ERROR_HEADER], err.code());
        assert_eq!(resp.headers()[REASON_HEADER], err.detail());
        assert!(resp.body().is_end_stream(), "a refusal ends the stream");
    }
    let long = format!("naïve\r\nInjected: yes\u{7f}{}", "a".repeat(400));
    let resp = raw_connect(&mut send, "x:1");
    next_incoming(&mut agent).await.responder.refuse(&DialError::Refused(long));
    let resp = within("raw response", resp).await.expect("response");
    let reason = resp.headers()[REASON_HEADER].to_str().unwrap().to_owned();
    assert!(reason.starts_with("naveInjected: yesaaa"), "{reason}");
    assert_eq!(reason.len(), 256);
}

#[tokio::test(start_paused = true)]
async fn open_times_out_when_the_agent_never_answers() {
    let (seed, mut agent) = pair(&TunnelSettings::default()).await;
    let opener = seed.opener.clone();
    let start = Instant::now();
    let open = tokio::spawn(async move { opener.open("slow:1", Duration::from_secs(7)).await.map(|_| ()) });
    let held = next_incoming(&mut agent).await; // never answered while the open waits
    match within("open with timeout", open).await.unwrap() {
        Err(DialError::Timeout(msg)) => assert!(msg.contains("slow:1"), "{msg}"),
        other => panic!("expected a dial timeout, got {other:?}"),
    }
    assert!(start.elapsed() >= Duration::from_secs(7), "timed out before its timeout");
    drop(held);
    assert!(!seed.opener.is_closed());
    let (_s, _a) = open_accepted(&seed, &mut agent, "after-timeout:1").await;
}

#[tokio::test(start_paused = true)]
async fn a_responder_dropped_unanswered_fails_the_open_as_a_transport_error() {
    let (seed, mut agent) = pair(&TunnelSettings::default()).await;
    let open = spawn_open(&seed, "dropped:1");
    drop(next_incoming(&mut agent).await);
    match within("open", open).await.unwrap() {
        Err(DialError::Transport(_)) => {}
        Err(e) => panic!("expected a transport error, got {e:?}"),
        Ok(_) => panic!("open succeeded though nobody accepted"),
    }
    let (_s, _a) = open_accepted(&seed, &mut agent, "after-drop:1").await;
}

/// An agent answering without `seedgate-error` (not this code's agent) is a transport error
/// that names the status.
#[tokio::test(start_paused = true)]
async fn an_answer_without_the_error_header_is_a_transport_error() {
    let (a, b) = tokio::io::duplex(DUPLEX_BUF);
    let seed = spawn_seed(a, &TunnelSettings::default()).await;
    let mut conn = within("raw agent handshake", h2::server::handshake(b)).await.unwrap();
    let open = spawn_open(&seed, "x:1");
    let answered = within("raw agent", async {
        let mut control = None; // keep the control stream open
        while let Some(r) = conn.accept().await {
            let (req, mut respond) = r.unwrap();
            if req.method() == http::Method::CONNECT {
                let resp = http::Response::builder().status(502).body(()).unwrap();
                respond.send_response(resp, true).unwrap();
                return (conn, control);
            }
            control = Some(respond);
        }
        panic!("raw agent connection ended");
    });
    let (mut conn, _control) = answered.await;
    let drive = tokio::spawn(async move { while conn.accept().await.is_some() {} });
    match within("open", open).await.unwrap() {
        Err(DialError::Transport(msg)) => assert!(msg.contains("502"), "{msg}"),
        Err(e) => panic!("expected a transport error, got {e:?}"),
        Ok(_) => panic!("open succeeded on a 502"),
    }
    drive.abort();
}

// ---------------------------------------------------------------------------------------------
// Resets
// ---------------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn reset_by_the_seed_fails_the_agents_read_with_connection_reset() {
    let (seed, mut agent) = pair(&TunnelSettings::default()).await;
    let (mut s, mut a) = open_accepted(&seed, &mut agent, "r:1").await;
    s.write_all(b"x").await.unwrap();
    assert_eq!(read_exact_n(&mut a, 1).await, b"x");
    s.reset();
    assert_read_reset(&mut a).await;
    // Other streams and the session are unaffected.
    let (mut s2, mut a2) = open_accepted(&seed, &mut agent, "r:2").await;
    s2.write_all(b"ok").await.unwrap();
    assert_eq!(read_exact_n(&mut a2, 2).await, b"ok");
}

#[tokio::test(start_paused = true)]
async fn reset_by_the_agent_fails_the_seeds_read_with_connection_reset() {
    let (seed, mut agent) = pair(&TunnelSettings::default()).await;
    let (mut s, mut a) = open_accepted(&seed, &mut agent, "r:1").await;
    a.reset();
    assert_read_reset(&mut s).await;
}

#[tokio::test(start_paused = true)]
async fn dropping_a_stream_before_its_orderly_end_resets_it() {
    let (seed, mut agent) = pair(&TunnelSettings::default()).await;
    // Agent end dropped mid-stream: the seed's read fails rather than seeing EOF.
    let (mut s, a) = open_accepted(&seed, &mut agent, "d:1").await;
    drop(a);
    assert_read_reset(&mut s).await;
    // Seed end dropped mid-stream: the agent's read fails too.
    let (s, mut a) = open_accepted(&seed, &mut agent, "d:2").await;
    drop(s);
    assert_read_reset(&mut a).await;
    // Seed half-closed, the agent saw the FIN, then the seed drops its end before the agent
    // finished: the agent's writes fail because the stream was reset.
    let (mut s, mut a) = open_accepted(&seed, &mut agent, "d:3").await;
    s.shutdown().await.unwrap();
    assert_eof(&mut a).await;
    drop(s);
    let failed = within("writes after the peer's reset", async {
        for _ in 0..1000 {
            if let Err(e) = a.write_all(&[0u8; 1024]).await {
                return e;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!("writes kept succeeding on a stream the seed dropped");
    })
    .await;
    assert!(matches!(failed.kind(), ErrorKind::ConnectionReset | ErrorKind::BrokenPipe), "{failed}");
}

// ---------------------------------------------------------------------------------------------
// Keepalive
// ---------------------------------------------------------------------------------------------

fn keepalive_settings() -> TunnelSettings {
    TunnelSettings {
        keepalive_interval: Duration::from_secs(5),
        keepalive_timeout: Duration::from_secs(15),
        ..TunnelSettings::default()
    }
}

/// The agent's end of the duplex is held but never read: its PING answers never come.
#[tokio::test(start_paused = true)]
async fn seed_session_ends_with_keepalive_timeout_when_the_agent_freezes() {
    let settings = keepalive_settings();
    let (a, _frozen_agent) = tokio::io::duplex(DUPLEX_BUF);
    let start = Instant::now();
    let mut seed = spawn_seed(a, &settings).await;
    let deadline = start + settings.keepalive_interval + settings.keepalive_timeout;
    // First PING after one interval, declared lost one timeout later: not before...
    assert!(
        tokio::time::timeout_at(deadline - Duration::from_millis(10), &mut seed.task).await.is_err(),
        "seed session ended before interval + timeout"
    );
    assert!(!seed.opener.is_closed());
    // ...but then.
    let r = tokio::time::timeout_at(deadline + Duration::from_secs(1), &mut seed.task)
        .await
        .expect("seed session still up after interval + timeout without PING answers")
        .unwrap();
    match r {
        Err(SessionError::KeepaliveTimeout(t)) => assert_eq!(t, settings.keepalive_timeout),
        other => panic!("expected a keepalive timeout, got {other:?}"),
    }
    assert!(seed.opener.is_closed(), "a dead session takes no new streams");
    match seed.opener.open("x:1", OPEN_TIMEOUT).await {
        Err(DialError::Transport(_)) => {}
        Err(e) => panic!("expected a transport error, got {e:?}"),
        Ok(_) => panic!("opened a stream on a dead session"),
    }
}

/// The seed's HTTP/2 client completes its handshake, then its connection is never polled: the
/// agent's PINGs go unanswered.
#[tokio::test(start_paused = true)]
async fn agent_session_ends_with_keepalive_timeout_when_the_seed_freezes() {
    let settings = keepalive_settings();
    let (a, b) = tokio::io::duplex(DUPLEX_BUF);
    let start = Instant::now();
    let mut agent = spawn_agent(b, &settings);
    let (_send, _frozen_conn) = within("raw seed handshake", h2::client::handshake(a)).await.unwrap();
    let deadline = start + settings.keepalive_interval + settings.keepalive_timeout;
    assert!(
        tokio::time::timeout_at(deadline - Duration::from_millis(10), &mut agent.task).await.is_err(),
        "agent session ended before interval + timeout"
    );
    let r = tokio::time::timeout_at(deadline + Duration::from_secs(1), &mut agent.task)
        .await
        .expect("agent session still up after interval + timeout without PING answers")
        .unwrap();
    assert!(matches!(r, Err(SessionError::KeepaliveTimeout(t)) if t == settings.keepalive_timeout), "{r:?}");
}

/// Counts the bytes read through it.
struct CountingIo<T> {
    inner: T,
    read: Arc<AtomicU64>,
}

impl<T: AsyncRead + Unpin> AsyncRead for CountingIo<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        self.read.fetch_add((buf.filled().len() - before) as u64, Ordering::Relaxed);
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for CountingIo<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[tokio::test(start_paused = true)]
async fn a_live_session_stays_up_across_many_keepalive_intervals() {
    let settings = keepalive_settings();
    let (a, b) = tokio::io::duplex(DUPLEX_BUF);
    let read_by_seed = Arc::new(AtomicU64::new(0));
    let mut agent = spawn_agent(b, &settings);
    let mut seed = spawn_seed(CountingIo { inner: a, read: read_by_seed.clone() }, &settings).await;
    let (mut s, mut a) = open_accepted(&seed, &mut agent, "idle:1").await;
    let before = read_by_seed.load(Ordering::Relaxed);
    // 100 intervals of idle virtual time.
    tokio::time::sleep(settings.keepalive_interval * 100).await;
    let idle_bytes = read_by_seed.load(Ordering::Relaxed) - before;
    assert!(!seed.task.is_finished(), "seed session ended: {:?}", (&mut seed.task).await);
    assert!(!agent.task.is_finished(), "agent session ended: {:?}", (&mut agent.task).await);
    assert!(!seed.opener.is_closed());
    // PINGs went both ways: the seed read at least one PING or PING ACK per interval.
    assert!(idle_bytes >= 100 * PING_FRAME, "only {idle_bytes} bytes of keepalive traffic in 100 intervals");
    // The idle stream and new ones still work.
    s.write_all(b"still alive").await.unwrap();
    assert_eq!(read_exact_n(&mut a, 11).await, b"still alive");
    let (_s2, _a2) = open_accepted(&seed, &mut agent, "after-idle:1").await;
}

// ---------------------------------------------------------------------------------------------
// GOAWAY and stopping
// ---------------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn agent_stop_sends_goaway_new_opens_drain_old_streams_finish() {
    let (seed, mut agent) = pair(&TunnelSettings::default()).await;
    let (mut s, mut a) = open_accepted(&seed, &mut agent, "old:1").await;
    assert!(!seed.opener.is_closed());

    agent.stop.cancel();
    // An open racing the GOAWAY may still reach the agent (its first GOAWAY admits streams
    // in flight); refuse those so the loop below never waits on them.
    let mut incoming = std::mem::replace(&mut agent.incoming, mpsc::unbounded_channel().1);
    let late = tokio::spawn(async move {
        let mut n = 0;
        while let Some(inc) = incoming.recv().await {
            inc.responder.refuse(&DialError::Limit("late".into()));
            n += 1;
        }
        n
    });
    let mut draining = None;
    for _ in 0..10 {
        match within("open after GOAWAY", seed.opener.open("new:1", OPEN_TIMEOUT)).await {
            Err(e @ DialError::Draining(_)) => {
                draining = Some(e);
                break;
            }
            Err(DialError::Limit(_)) => continue, // sent before the GOAWAY arrived
            Err(e) => panic!("unexpected error after GOAWAY: {e:?}"),
            Ok(_) => panic!("a stream opened after GOAWAY was accepted"),
        }
    }
    let e = draining.expect("opens never failed as draining after the agent's GOAWAY");
    assert_eq!(e.http_status(), 503);
    assert!(seed.opener.is_closed(), "the opener reports closed once the agent drains");

    // The stream opened before the GOAWAY keeps working to its end, and holds the session open.
    s.write_all(b"in flight").await.unwrap();
    assert_eq!(read_exact_n(&mut a, 9).await, b"in flight");
    a.write_all(b"answer").await.unwrap();
    assert_eq!(read_exact_n(&mut s, 6).await, b"answer");
    assert!(!agent.task.is_finished(), "agent session ended with a stream in flight");
    s.shutdown().await.unwrap();
    assert_eof(&mut a).await;
    a.write_all(b"last words").await.unwrap();
    a.shutdown().await.unwrap();
    assert_eq!(read_exact_n(&mut s, 10).await, b"last words");
    assert_eof(&mut s).await;
    drop((s, a));

    // With the last stream done, both sessions end cleanly.
    let agent_result = within("agent session end", agent.task).await.unwrap();
    assert!(agent_result.is_ok(), "{agent_result:?}");
    let seed_result = within("seed session end", seed.task).await.unwrap();
    assert!(seed_result.is_ok(), "{seed_result:?}");
    assert!(within("late refuser", late).await.unwrap() <= 1);
}

#[tokio::test(start_paused = true)]
async fn agent_stop_without_streams_ends_both_sessions() {
    let (seed, agent) = pair(&TunnelSettings::default()).await;
    eventually("agent hello", || seed.hello.get().is_some()).await;
    agent.stop.cancel();
    let r = within("agent session end", agent.task).await.unwrap();
    assert!(r.is_ok(), "{r:?}");
    let r = within("seed session end", seed.task).await.unwrap();
    assert!(r.is_ok(), "{r:?}");
    assert!(seed.opener.is_closed());
}

#[tokio::test(start_paused = true)]
async fn seed_stop_ends_the_seed_session_as_stopped_and_the_agent_session_too() {
    let (seed, mut agent) = pair(&TunnelSettings::default()).await;
    let (_s, mut a) = open_accepted(&seed, &mut agent, "cut:1").await;
    seed.stop.cancel();
    let r = within("seed session end", seed.task).await.unwrap();
    assert!(matches!(r, Err(SessionError::Stopped)), "{r:?}");
    // The agent sees its transport close (no GOAWAY comes first); the variant it ends with is not
    // part of the contract, only that it ends.
    let _ = within("agent session end", agent.task).await.unwrap();
    assert!(seed.opener.is_closed());
    match seed.opener.open("x:1", OPEN_TIMEOUT).await {
        Err(DialError::Transport(_)) => {}
        Err(e) => panic!("expected a transport error, got {e:?}"),
        Ok(_) => panic!("opened a stream on a stopped session"),
    }
    assert!(seed.opener.control(&ControlMsg::Move { to: vec![], drain_deadline_ms: 1 }).is_err());
    // A stream cut by the end of the session is not an orderly end on the agent side.
    let mut buf = [0u8; 8];
    let r = within("read on a cut stream", a.read(&mut buf)).await;
    assert!(r.is_err(), "a stream cut with its session read as {r:?} instead of an error");
}

// ---------------------------------------------------------------------------------------------
// Control stream
// ---------------------------------------------------------------------------------------------

fn move_msg(to: &[&str], ms: u64) -> ControlMsg {
    ControlMsg::Move { to: to.iter().map(|s| s.to_string()).collect(), drain_deadline_ms: ms }
}

#[tokio::test(start_paused = true)]
async fn hello_reaches_the_seed_and_control_messages_reach_the_agent_in_order() {
    let (seed, mut agent) = pair(&TunnelSettings::default()).await;
    eventually("agent hello at the seed", || seed.hello.get().is_some()).await;
    assert_eq!(seed.hello.get().cloned(), Some(agent_hello()));

    let msgs = [move_msg(&["seed-b.example:443"], 30_000), move_msg(&[], 0), move_msg(&["a:1", "b:2"], 5)];
    for m in &msgs {
        seed.opener.control(m).expect("control queued");
    }
    for m in &msgs {
        assert_eq!(&within("control at the agent", agent.control.recv()).await.unwrap(), m);
    }
    // A line close to the limit still goes through.
    let big = move_msg(&[&"h".repeat(60 * 1024)], 1);
    seed.opener.control(&big).unwrap();
    assert_eq!(within("big control at the agent", agent.control.recv()).await.unwrap(), big);
}

/// A raw HTTP/2 client as the seed; its connection is driven in a task.
async fn raw_seed(io: DuplexStream) -> h2::client::SendRequest<Bytes> {
    let (send, conn) = within("raw seed handshake", h2::client::handshake(io)).await.unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    send
}

fn raw_connect(
    send: &mut h2::client::SendRequest<Bytes>,
    target: &str,
) -> impl Future<Output = Result<http::Response<h2::RecvStream>, h2::Error>> + use<> {
    let req = http::Request::builder().method(http::Method::CONNECT).uri(target).body(()).unwrap();
    let (resp, _stream) = send.send_request(req, false).expect("send CONNECT");
    async move {
        let _keep = _stream;
        resp.await
    }
}

/// Open the control stream from a raw seed; returns its send half, the response body, and the
/// hello line.
async fn raw_control(send: &mut h2::client::SendRequest<Bytes>) -> (h2::SendStream<Bytes>, h2::RecvStream, Vec<u8>) {
    let req = http::Request::builder()
        .method(http::Method::POST)
        .uri(format!("https://agent{CONTROL_PATH}"))
        .body(())
        .unwrap();
    let (resp, stream) = send.send_request(req, false).expect("send control request");
    let resp = within("control response", resp).await.expect("control response");
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let hello = within("hello", body.data()).await.expect("hello frame").expect("hello data");
    (stream, body, hello.to_vec())
}

fn line(msg: &ControlMsg) -> Vec<u8> {
    let mut v = serde_json::to_vec(msg).unwrap();
    v.push(b'\n');
    v
}

#[tokio::test(start_paused = true)]
async fn control_line_over_the_limit_is_not_delivered_and_the_control_stream_is_reset() {
    let (a, b) = tokio::io::duplex(DUPLEX_BUF);
    let mut agent = spawn_agent(b, &TunnelSettings::default());
    let mut send = raw_seed(a).await;
    let (mut ctl, mut body, hello) = raw_control(&mut send).await;
    assert_eq!(serde_json::from_slice::<AgentHello>(hello.strip_suffix(b"\n").unwrap()).unwrap(), agent_hello());

    // 64 KiB + 1 without a newline: the agent must give up on the line...
    ctl.send_data(Bytes::from(vec![b'x'; 64 * 1024 + 1]), false).unwrap();
    // ...and not resynchronise on the next newline: a valid message after it is not read either.
    ctl.send_data(Bytes::from_static(b"\n"), false).unwrap();
    ctl.send_data(Bytes::from(line(&move_msg(&["smuggled:1"], 1))), false).unwrap();
    // The agent ends the control stream: its response body ends in a reset.
    let end = within("control stream end", body.data()).await;
    match end {
        Some(Err(e)) => assert!(e.is_reset() && e.reason() == Some(h2::Reason::CANCEL), "{e:?}"),
        other => panic!("control stream not reset after an oversized line: {other:?}"),
    }
    assert!(agent.control.try_recv().is_err(), "a control message was delivered from an oversized line");

    // The session survives: streams open, and a new control stream works.
    let resp = raw_connect(&mut send, "after:1");
    let inc = next_incoming(&mut agent).await;
    assert_eq!(inc.target, "after:1");
    let _stream = inc.responder.accept().unwrap();
    assert_eq!(within("response", resp).await.unwrap().status(), 200);
    let (mut ctl2, _body2, _) = raw_control(&mut send).await;
    let m = move_msg(&["fresh:1"], 2);
    ctl2.send_data(Bytes::from(line(&m)), false).unwrap();
    assert_eq!(within("control after reset", agent.control.recv()).await.unwrap(), m);
    assert!(!agent.task.is_finished());
}

#[tokio::test(start_paused = true)]
async fn unknown_control_lines_are_skipped_and_unknown_requests_refused() {
    let (a, b) = tokio::io::duplex(DUPLEX_BUF);
    let mut agent = spawn_agent(b, &TunnelSettings::default());
    let mut send = raw_seed(a).await;
    let (mut ctl, _body, _) = raw_control(&mut send).await;
    ctl.send_data(Bytes::from_static(b"{\"type\":\"reboot\"}\n"), false).unwrap();
    ctl.send_data(Bytes::from_static(b"not json\n"), false).unwrap();
    let m = move_msg(&["next:1"], 3);
    ctl.send_data(Bytes::from(line(&m)), false).unwrap();
    assert_eq!(
        within("control", agent.control.recv()).await.unwrap(),
        m,
        "the first message delivered is the valid one"
    );

    // A request that is neither CONNECT nor the control POST is refused with REFUSED_STREAM.
    let req = http::Request::builder().method(http::Method::GET).uri("https://agent/other").body(()).unwrap();
    let (resp, _s) = send.send_request(req, true).unwrap();
    let e = within("refused request", resp).await.expect_err("a GET was answered");
    assert_eq!(e.reason(), Some(h2::Reason::REFUSED_STREAM), "{e:?}");
}

/// JSON lines must not depend on how the seed frames them.
#[tokio::test(start_paused = true)]
async fn two_control_lines_in_one_data_frame_are_both_delivered() {
    let (a, b) = tokio::io::duplex(DUPLEX_BUF);
    let mut agent = spawn_agent(b, &TunnelSettings::default());
    let mut send = raw_seed(a).await;
    let (mut ctl, _body, _) = raw_control(&mut send).await;
    let (m1, m2) = (move_msg(&["one:1"], 1), move_msg(&["two:2"], 2));
    ctl.send_data(Bytes::from([line(&m1), line(&m2)].concat()), false).unwrap();
    assert_eq!(within("first control", agent.control.recv()).await.unwrap(), m1);
    assert_eq!(within("second control", agent.control.recv()).await.unwrap(), m2);
}

/// The limit holds wherever the newline falls: a line whose newline comes in the frame after the
/// one that crosses 64 KiB is refused too.
#[tokio::test(start_paused = true)]
async fn control_line_over_the_limit_is_not_delivered_even_when_its_newline_follows_in_the_next_frame() {
    let (seed, mut agent) = pair(&TunnelSettings::default()).await;
    eventually("agent hello", || seed.hello.get().is_some()).await;
    let big = move_msg(&[&"h".repeat(100 * 1024)], 1);
    assert!(line(&big).len() > 64 * 1024 + 1);
    seed.opener.control(&big).unwrap();
    if let Ok(Some(m)) = tokio::time::timeout(BOUND, agent.control.recv()).await {
        assert!(m != big, "a {}-byte control line was delivered", line(&big).len());
    }
}

/// Keepalive starts only after the HTTP/2 handshake: the seed's preface has its own deadline, so
/// a seed that completes TLS and then sends nothing cannot hold the agent's session (and its slot).
#[tokio::test(start_paused = true)]
async fn agent_session_ends_when_the_seed_never_sends_its_preface() {
    let settings = keepalive_settings();
    let (_silent_seed, b) = tokio::io::duplex(DUPLEX_BUF);
    let agent = spawn_agent(b, &settings);
    let bound = settings.keepalive_interval + settings.keepalive_timeout + Duration::from_secs(1);
    let r = tokio::time::timeout(bound, agent.task).await;
    assert!(r.is_ok(), "agent session still waiting for the seed's preface after {bound:?}");
}
