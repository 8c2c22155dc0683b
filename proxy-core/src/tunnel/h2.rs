//! The HTTP/2 transport of the tunnel, roles reversed: the seed is the h2 client on the agent's TLS connection.
//!
//! What is HTTP/2's own: the handshakes, PING keepalive, `CONNECT` requests and their answers
//! (`:status`, `seedgate-error`, `seedgate-reason`), the control stream as a `POST`, GOAWAY as
//! the agent's going-away notice. The sessions themselves run in [`super::session`].

use super::session::{
    self, Accepted, AgentTransport, ControlRecv, ControlSend, Notice, OpenError, SeedConn, SeedTransport, SessionError,
    SessionOpener,
};
use super::window::{WindowTuner, stream_window_cap};
use super::{
    AgentConnection, AgentHandler, AgentSession, BoxFuture, CONTROL_PATH, DialError, ERROR_HEADER, Echoes, H2Stream,
    Incoming, Quiet, REASON_HEADER, Responder, SeedConnection, TunnelSettings, TunnelStream,
};
use bytes::Bytes;
use h2::{Ping, PingPong, Reason, client, server};
use http::{Method, Request, Response, StatusCode};
use std::future::Future;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::io::InspectReader;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The seed side of an HTTP/2 session.
pub type H2Opener = SessionOpener<H2Seed>;

fn failed(context: &'static str) -> impl FnOnce(h2::Error) -> SessionError {
    move |e| SessionError::transport(context, e)
}

/// How often a busy session whose window may still grow samples its path (a PING each).
const SAMPLE_GAP: Duration = Duration::from_millis(100);
/// How often an idle session looks whether bytes flow again (an atomic load, no PING).
const IDLE_CHECK: Duration = Duration::from_secs(1);
/// Bytes received since the last look that make a session busy: more than PINGs and a trickle.
const BUSY: u64 = 64 * 1024;

/// What the keepalive loop needs to let a session's stream window follow its path
/// ([`WindowTuner`]): the bytes the session received so far, and where a new window goes (the
/// connection's driver sends it as `SETTINGS_INITIAL_WINDOW_SIZE`).
struct Tuning {
    tuner: WindowTuner,
    received: Arc<AtomicU64>,
    apply: watch::Sender<u32>,
}

impl Tuning {
    fn new(settings: &TunnelSettings, received: Arc<AtomicU64>) -> (Self, Windows) {
        let cap = if settings.h2_adaptive_window {
            stream_window_cap(settings.stream_window, settings.max_stream_window, settings.connection_window)
        } else {
            settings.stream_window
        };
        let (apply, windows) = watch::channel(settings.stream_window);
        (Self { tuner: WindowTuner::new(settings.stream_window, cap), received, apply }, Windows::new(windows))
    }

    fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }
}

/// Send a PING every [`TunnelSettings::ping_every`], and at once when `probes` asks for one (the seed: a dial wants a
/// sign of life; a request made while a PING is out gets one after it). A PING unanswered for
/// the suspect time makes the path quiet (`quiet(true)`; `quiet(false)` once one is answered):
/// the session goes on, its streams wait for the path. It fails when one goes unanswered for the
/// timeout. While the session is busy and its window may still grow, a PING every
/// [`SAMPLE_GAP`] also samples the path for `tuning`. Each answered PING's sending time goes to
/// `echoes`.
fn keepalive(
    mut pp: PingPong,
    settings: &TunnelSettings,
    probes: Option<Arc<Notify>>,
    echoes: Arc<Echoes>,
    quiet: impl Fn(bool) + Send + Sync + 'static,
    mut tuning: Tuning,
) -> impl Future<Output = SessionError> + Send + 'static {
    let (interval, timeout) = (settings.ping_every(), settings.keepalive_timeout);
    let suspect = settings.suspect();
    async move {
        let mut due = Instant::now() + interval;
        let mut seen = tuning.received();
        loop {
            let probed = async {
                match &probes {
                    Some(p) => p.notified().await,
                    None => std::future::pending().await,
                }
            };
            let growing = tuning.tuner.growing();
            let look = Instant::now() + if growing { IDLE_CHECK.min(interval) } else { interval };
            let mut asked = false;
            tokio::select! {
                () = tokio::time::sleep_until(look.min(due)) => {}
                () = probed => asked = true,
            }
            // Bytes since the last look: a busy session samples now and again after SAMPLE_GAP.
            let mut busy = growing && tuning.received().saturating_sub(seen) >= BUSY;
            if !busy {
                seen = tuning.received();
            }
            while asked || busy || Instant::now() >= due {
                let (sent, before) = (Instant::now(), tuning.received());
                if let Err(e) = ping_once(&mut pp, suspect, timeout, &quiet, &echoes).await {
                    return e;
                }
                due = Instant::now() + interval;
                seen = tuning.received();
                if let Some(w) = tuning.tuner.sample(sent.elapsed(), seen.saturating_sub(before)) {
                    tracing::debug!(window = w, "the session's stream window grows with its path");
                    let _ = tuning.apply.send(w);
                }
                if !(busy && tuning.tuner.growing()) {
                    break;
                }
                tokio::time::sleep(SAMPLE_GAP).await;
                busy = tuning.received().saturating_sub(seen) >= BUSY;
                asked = false;
            }
        }
    }
}

/// One PING and its answer: quiet after `suspect` without one, failed after `timeout`.
async fn ping_once(
    pp: &mut PingPong,
    suspect: Duration,
    timeout: Duration,
    quiet: &impl Fn(bool),
    echoes: &Echoes,
) -> Result<(), SessionError> {
    // Taken before it is queued: a dial that took the time after queueing its open knows that a
    // PING sent later cannot have gone out ahead of the open.
    let sent = Instant::now();
    let ping = pp.ping(Ping::opaque());
    tokio::pin!(ping);
    let answer = match tokio::time::timeout(suspect, &mut ping).await {
        Ok(answer) => answer,
        Err(_) => {
            quiet(true);
            tokio::time::timeout(timeout - suspect, &mut ping)
                .await
                .map_err(|_| SessionError::KeepaliveTimeout(timeout))?
        }
    };
    match answer {
        Ok(_) => {
            echoes.answered(sent);
            quiet(false);
            Ok(())
        }
        Err(e) => Err(SessionError::transport("session failed", e)),
    }
}

/// The windows [`Tuning`] chooses, on their way to the connection as `SETTINGS_INITIAL_WINDOW_SIZE`
/// (every stream of the session, new and open). h2 refuses new SETTINGS while the last await
/// their acknowledgement, a round trip behind whatever the peer has queued; a refused window
/// is tried again after [`APPLY_RETRY`], since the growth to the cap has no later one to carry it.
struct Windows {
    chosen: watch::Receiver<u32>,
    retry: Option<Instant>,
}

/// How soon a window h2 refused is offered again.
const APPLY_RETRY: Duration = Duration::from_millis(50);

impl Windows {
    fn new(chosen: watch::Receiver<u32>) -> Self {
        Self { chosen, retry: None }
    }

    /// The window to apply next: a newly chosen one, or the latest once a retry is due. Pending
    /// for good once the chooser is gone with nothing left to retry.
    async fn due(&mut self) -> u32 {
        let retry = self.retry;
        let again = async {
            match retry {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            Ok(()) = self.chosen.changed() => {}
            () = again => {}
        }
        *self.chosen.borrow_and_update()
    }

    /// Apply `window` with `set`, or schedule a retry when it is refused.
    fn apply<E: std::fmt::Display>(&mut self, window: u32, set: impl FnOnce(u32) -> Result<(), E>) {
        self.retry = match set(window) {
            Ok(()) => None,
            Err(e) => {
                tracing::debug!(window, error = %e, "stream window not applied yet");
                Some(Instant::now() + APPLY_RETRY)
            }
        };
    }
}

impl ControlSend for h2::SendStream<Bytes> {
    async fn send(&mut self, line: Vec<u8>) -> io::Result<()> {
        self.send_data(Bytes::from(line), false).map_err(io::Error::other)
    }
}

impl ControlRecv for h2::RecvStream {
    async fn recv(&mut self) -> Option<Bytes> {
        let chunk = self.data().await?.ok()?;
        let _ = self.flow_control().release_capacity(chunk.len());
        Some(chunk)
    }
}

// ---------------------------------------------------------------------------------------------
// Seed side
// ---------------------------------------------------------------------------------------------

/// The seed's end of an HTTP/2 session: opens streams as requests.
pub struct H2Seed {
    send: client::SendRequest<Bytes>,
    /// Bytes read from the agent so far: each is a sign of life.
    heard: Arc<AtomicU64>,
    /// Asks the keepalive loop for a PING now.
    probes: Arc<Notify>,
    /// The keepalive's PING is unanswered past the suspect time.
    quiet: Arc<Quiet>,
    /// When the keepalive's latest answered PING was sent.
    echoes: Arc<Echoes>,
}

/// A failed open: a GOAWAY from the agent means it drains (503, and the dial may be retried on
/// another agent), anything else is a transport failure.
fn open_error(e: h2::Error) -> OpenError {
    if e.is_go_away() && e.is_remote() {
        OpenError::GoingAway(format!("the agent is shutting down ({e})"))
    } else {
        DialError::Transport(e.to_string()).into()
    }
}

fn dial_error_from_response(resp: &Response<h2::RecvStream>) -> DialError {
    let h = |name| resp.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    let code = h(ERROR_HEADER);
    if code.is_empty() {
        DialError::Transport(format!("agent answered {}", resp.status()))
    } else {
        DialError::from_code(&code, h(REASON_HEADER))
    }
}

/// Send `req` and wait for its answer.
async fn request(
    send: &client::SendRequest<Bytes>,
    req: Request<()>,
) -> Result<(Response<h2::RecvStream>, h2::SendStream<Bytes>), h2::Error> {
    let mut ready = send.clone().ready().await?;
    let (resp, stream) = ready.send_request(req, false)?;
    Ok((resp.await?, stream))
}

impl SeedTransport for H2Seed {
    type Stream = H2Stream;
    type ControlSend = h2::SendStream<Bytes>;
    type ControlRecv = h2::RecvStream;

    async fn open(&self, target: &str) -> Result<H2Stream, OpenError> {
        let req = Request::builder()
            .method(Method::CONNECT)
            .uri(target)
            .body(())
            .map_err(|e| DialError::BadTarget(format!("{target}: {e}")))?;
        let (resp, stream) = request(&self.send, req).await.map_err(open_error)?;
        if resp.status() != StatusCode::OK {
            return Err(dial_error_from_response(&resp).into());
        }
        Ok(H2Stream::new(stream, resp.into_body()))
    }

    /// The connection closes when the session drops its driver (the h2 client side cannot send
    /// a GOAWAY).
    fn stop(&self) {}

    fn heard(&self) -> u64 {
        self.heard.load(Ordering::Relaxed)
    }

    /// A `CONNECT` elicits nothing from the agent until its dial is done: a PING does.
    fn probe(&self) {
        self.probes.notify_one();
    }

    fn quiet(&self) -> Option<&Quiet> {
        Some(&self.quiet)
    }

    fn echoes(&self) -> Option<&Echoes> {
        Some(&self.echoes)
    }
}

/// The control stream: a `POST` the agent answers 200 (then its hello line).
async fn open_control(
    send: client::SendRequest<Bytes>,
) -> Result<(h2::SendStream<Bytes>, h2::RecvStream), SessionError> {
    let req = Request::builder()
        .method(Method::POST)
        .uri(format!("https://agent{CONTROL_PATH}"))
        .body(())
        .map_err(|e| SessionError::Protocol(e.to_string()))?;
    let (resp, stream) = request(&send, req).await.map_err(failed("control stream"))?;
    if resp.status() != StatusCode::OK {
        return Err(SessionError::Protocol(format!("the agent refused the control stream: {}", resp.status())));
    }
    Ok((stream, resp.into_body()))
}

/// The seed's end of a session on an established TLS connection: the HTTP/2 handshake.
async fn seed_conn<T>(io: T, settings: &TunnelSettings) -> Result<SeedConn<H2Seed>, SessionError>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let heard = Arc::new(AtomicU64::new(0));
    let counter = heard.clone();
    let io = InspectReader::new(io, move |read: &[u8]| {
        counter.fetch_add(read.len() as u64, Ordering::Relaxed);
    });
    let (send, mut conn) = client::Builder::new()
        .initial_window_size(settings.stream_window)
        .initial_connection_window_size(settings.connection_window)
        .max_frame_size(settings.max_frame_size)
        .max_concurrent_reset_streams(1024)
        .max_send_buffer_size(settings.stream_window as usize)
        .enable_push(false)
        .handshake::<_, Bytes>(io)
        .await
        .map_err(failed("HTTP/2 handshake failed"))?;
    let pp = conn.ping_pong().expect("ping_pong is available once");
    let probes = Arc::new(Notify::new());
    let quiet = Arc::new(Quiet::default());
    let q = quiet.clone();
    let (tuning, mut windows) = Tuning::new(settings, heard.clone());
    let echoes = Arc::new(Echoes::default());
    let ka = keepalive(
        pp,
        settings,
        Some(probes.clone()),
        echoes.clone(),
        move |silent| {
            q.set(silent);
        },
        tuning,
    );
    let ended = async move {
        let mut ka = std::pin::pin!(ka);
        loop {
            tokio::select! {
                r = &mut conn => return r.map_err(failed("session failed")),
                e = &mut ka => return Err(e),
                w = windows.due() => windows.apply(w, |w| conn.set_initial_window_size(w)),
            }
        }
    };
    let transport = H2Seed { send: send.clone(), heard, probes, quiet, echoes };
    Ok(SeedConn { control: Box::pin(open_control(send)), transport, ended: Box::pin(ended) })
}

/// Over TCP directly, or through [`crate::relay::io::ReadAhead`] (what proxy-server does).
impl<IO: AsyncRead + AsyncWrite + Unpin + Send + 'static> SeedConnection for tokio_rustls::server::TlsStream<IO> {
    type Transport = H2Seed;

    fn transport(&self) -> &'static str {
        "h2"
    }

    fn alpn(&self) -> Option<Vec<u8>> {
        self.get_ref().1.alpn_protocol().map(<[u8]>::to_vec)
    }

    fn peer_certificate(&self) -> Option<rustls::pki_types::CertificateDer<'static>> {
        self.get_ref().1.peer_certificates()?.first().map(|c| c.clone().into_owned())
    }

    /// TCP has nothing to say it with: the connection just closes.
    fn refuse(self, _why: &'static str) {}

    fn start(self, settings: &TunnelSettings) -> impl Future<Output = Result<SeedConn<H2Seed>, SessionError>> + Send {
        seed_conn(self, settings)
    }
}

// ---------------------------------------------------------------------------------------------
// Agent side
// ---------------------------------------------------------------------------------------------

struct H2Responder {
    respond: server::SendResponse<Bytes>,
    recv: h2::RecvStream,
}

impl Responder for H2Responder {
    fn accept(mut self: Box<Self>) -> Result<TunnelStream, DialError> {
        let send =
            self.respond.send_response(Response::new(()), false).map_err(|e| DialError::Transport(e.to_string()))?;
        let H2Responder { recv, .. } = *self;
        Ok(TunnelStream::new(H2Stream::new(send, recv)))
    }

    fn refuse(mut self: Box<Self>, err: &DialError) {
        let status = StatusCode::from_u16(err.http_status()).unwrap_or(StatusCode::BAD_GATEWAY);
        let mut resp = Response::builder().status(status).header(ERROR_HEADER, err.code());
        // Header values must be visible ASCII; keep the reason readable but safe.
        let reason: String = err.detail().chars().filter(|c| c.is_ascii() && !c.is_ascii_control()).take(256).collect();
        resp = resp.header(REASON_HEADER, reason);
        if let Ok(resp) = resp.body(()) {
            let _ = self.respond.send_response(resp, true);
        }
    }
}

/// The agent's end of an HTTP/2 session: the seed's requests, and PINGs.
struct H2Agent<T> {
    conn: server::Connection<T, Bytes>,
    keepalive: BoxFuture<'static, SessionError>,
    /// Stream windows from the keepalive loop's [`Tuning`].
    windows: Windows,
}

impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> AgentTransport for H2Agent<T> {
    type ControlSend = h2::SendStream<Bytes>;
    type ControlRecv = h2::RecvStream;
    type Pending = std::future::Ready<Option<Incoming>>;

    async fn accept(&mut self) -> Result<Option<Accepted<Self>>, SessionError> {
        loop {
            let next = tokio::select! {
                r = self.conn.accept() => r,
                e = &mut self.keepalive => return Err(e),
                w = self.windows.due() => {
                    self.windows.apply(w, |w| self.conn.set_initial_window_size(w));
                    continue;
                }
            };
            let (req, mut respond) = match next {
                None => return Ok(None),
                Some(r) => r.map_err(failed("session failed"))?,
            };
            let (parts, recv) = req.into_parts();
            if parts.method == Method::CONNECT {
                let target = parts.uri.authority().map(|a| a.as_str().to_owned()).unwrap_or_default();
                let responder = Box::new(H2Responder { respond, recv });
                return Ok(Some(Accepted::Stream(Incoming { target, responder })));
            }
            if parts.method == Method::POST && parts.uri.path() == CONTROL_PATH {
                match respond.send_response(Response::new(()), false) {
                    Ok(send) => return Ok(Some(Accepted::Control(send, recv))),
                    Err(e) => tracing::debug!(error = %e, "control stream gone before its answer"),
                }
            } else {
                respond.send_reset(Reason::REFUSED_STREAM);
            }
        }
    }

    fn going_away(&mut self) -> Notice {
        self.conn.graceful_shutdown();
        Notice::Sent
    }
}

/// The agent's end of a session on an established TLS connection, until it ends
/// ([`session::run_agent`]). `stop` ends it with a GOAWAY (streams in flight may finish).
async fn agent_session<T>(
    io: T,
    settings: &TunnelSettings,
    handler: Arc<dyn AgentHandler>,
    stop: CancellationToken,
    tracker: TaskTracker,
) -> Result<(), SessionError>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let received = Arc::new(AtomicU64::new(0));
    let counter = received.clone();
    let io = InspectReader::new(io, move |read: &[u8]| {
        counter.fetch_add(read.len() as u64, Ordering::Relaxed);
    });
    let handshake = server::Builder::new()
        .initial_window_size(settings.stream_window)
        .initial_connection_window_size(settings.connection_window)
        .max_frame_size(settings.max_frame_size)
        .max_concurrent_streams(settings.max_streams)
        .max_concurrent_reset_streams(1024)
        .max_send_buffer_size(settings.stream_window as usize)
        .handshake::<_, Bytes>(io);
    // The seed's preface must come within the keepalive timeout: keepalive runs only once the
    // session is up, and a seed that finished TLS and then says nothing must not hold the agent.
    let timeout = settings.keepalive_timeout;
    let mut conn = tokio::time::timeout(timeout, handshake)
        .await
        .map_err(|_| SessionError::HandshakeTimeout { waiting_for: "HTTP/2 preface", timeout })?
        .map_err(failed("HTTP/2 handshake failed"))?;
    let pp = conn.ping_pong().expect("ping_pong is available once");
    let h = handler.clone();
    let (tuning, windows) = Tuning::new(settings, received);
    let echoes = Arc::default();
    let keepalive = Box::pin(keepalive(pp, settings, None, echoes, move |silent| h.quiet(silent), tuning));
    session::run_agent(H2Agent { conn, keepalive, windows }, None, handler, stop, tracker).await
}

/// Over TCP directly, or through [`crate::relay::io::ReadAhead`] (what proxy-agent does).
impl<IO: AsyncRead + AsyncWrite + Unpin + Send + 'static> AgentConnection for tokio_rustls::client::TlsStream<IO> {
    fn run_agent(self: Box<Self>, s: AgentSession<'_>) -> BoxFuture<'_, Result<(), SessionError>> {
        Box::pin(agent_session(*self, s.settings, s.handler, s.stop, s.tracker))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_window_grows_only_when_adaptive_windows_are_on() {
        let received = Arc::new(AtomicU64::new(0));
        let off = TunnelSettings { h2_adaptive_window: false, ..TunnelSettings::default() };
        let (mut t, _) = Tuning::new(&off, received.clone());
        assert!(!t.tuner.growing(), "off: the window is the configured one");
        assert_eq!(t.tuner.sample(Duration::from_millis(150), 1 << 20), None);

        let on = TunnelSettings::default();
        assert!(on.h2_adaptive_window, "on by default");
        let (mut t, _) = Tuning::new(&on, received);
        assert!(t.tuner.growing());
        // A window's worth per 150 ms round trip: the window is the limit and it doubles.
        assert_eq!(t.tuner.sample(Duration::from_millis(150), u64::from(on.stream_window)), Some(2 * on.stream_window));
    }

    const MIB: u32 = 1024 * 1024;

    #[tokio::test(start_paused = true)]
    async fn a_window_refused_while_settings_await_their_acknowledgement_is_applied_on_retry() {
        let (chosen, rx) = watch::channel(MIB / 2);
        let mut windows = Windows::new(rx);
        chosen.send(8 * MIB).unwrap();
        let w = windows.due().await;
        assert_eq!(w, 8 * MIB);
        windows.apply(w, |_| Ok::<_, &str>(()));
        // The growth to the cap comes before the peer acknowledged the last SETTINGS; none follows it.
        chosen.send(16 * MIB).unwrap();
        let w = windows.due().await;
        windows.apply(w, |_| Err("settings pending"));
        let again =
            tokio::time::timeout(Duration::from_secs(1), windows.due()).await.expect("the refused window comes again");
        assert_eq!(again, 16 * MIB);
        let mut applied = None;
        windows.apply(again, |w| {
            applied = Some(w);
            Ok::<_, &str>(())
        });
        assert_eq!(applied, Some(16 * MIB));
        assert!(tokio::time::timeout(Duration::from_secs(60), windows.due()).await.is_err(), "nothing left to apply");
    }

    #[tokio::test(start_paused = true)]
    async fn a_window_chosen_while_a_retry_waits_replaces_the_refused_one() {
        let (chosen, rx) = watch::channel(MIB / 2);
        let mut windows = Windows::new(rx);
        chosen.send(4 * MIB).unwrap();
        let w = windows.due().await;
        windows.apply(w, |_| Err("settings pending"));
        chosen.send(8 * MIB).unwrap();
        let before = Instant::now();
        assert_eq!(windows.due().await, 8 * MIB);
        assert_eq!(before.elapsed(), Duration::ZERO, "at once, not at the retry");
        windows.apply(8 * MIB, |_| Ok::<_, &str>(()));
        assert!(
            tokio::time::timeout(Duration::from_secs(60), windows.due()).await.is_err(),
            "the refused one is not retried"
        );
    }

    /// Offer `window` to the agent's end, driving it between tries, until taken (true) or 10 s pass.
    async fn take(agent: &mut server::Connection<tokio::io::DuplexStream, Bytes>, window: u32) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if agent.set_initial_window_size(window).is_ok() {
                return true;
            }
            let _ = tokio::time::timeout(Duration::from_millis(10), agent.accept()).await;
        }
        false
    }

    /// What [`Windows`] retries for: h2 refuses a second window until the peer acknowledged the first.
    #[tokio::test]
    async fn h2_refuses_new_settings_until_the_last_are_acknowledged() {
        let (a, b) = tokio::io::duplex(1 << 16);
        let seed = tokio::spawn(async move {
            let (send, conn) = client::handshake(a).await.unwrap();
            let driven = tokio::spawn(conn);
            (send, driven)
        });
        let mut agent = server::handshake(b).await.unwrap();
        let (_send, driven) = seed.await.unwrap();
        // The handshake's own SETTINGS await their acknowledgement too: drive the agent's end
        // until a window is taken, then ask for another at once.
        assert!(take(&mut agent, MIB).await, "the seed never acknowledged the handshake's SETTINGS");
        assert!(agent.set_initial_window_size(2 * MIB).is_err(), "refused while the first is unacknowledged");
        assert!(take(&mut agent, 2 * MIB).await, "taken once the seed acknowledged the first");
        driven.abort();
    }
}
