//! The HTTP/2 transport of the tunnel, roles reversed: the seed is the h2 client on the agent's TLS connection.

pub use super::AgentHandler;
use super::{
    AgentHello, BoxFuture, CONTROL_PATH, ControlMsg, DialError, ERROR_HEADER, H2Stream, Incoming, Opener, OpenerState,
    REASON_HEADER, Responder, TunnelSettings, TunnelStream,
};
use crate::guard::Active;
use bytes::Bytes;
use h2::{Ping, PingPong, Reason, client, server};
use http::{Method, Request, Response, StatusCode};
use proxy_wire::lines::LineFramer;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Largest control line accepted (bytes before its newline).
pub const CONTROL_LINE_MAX: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("HTTP/2 handshake failed: {0}")]
    Handshake(#[source] h2::Error),
    #[error("HTTP/2 handshake: no preface from the peer within {0:?}")]
    HandshakeTimeout(Duration),
    #[error("keepalive: no PING answer within {0:?}")]
    KeepaliveTimeout(Duration),
    #[error("session failed: {0}")]
    H2(#[from] h2::Error),
    #[error("session stopped")]
    Stopped,
}

/// Send a PING every interval; fail when one goes unanswered for the timeout.
async fn keepalive(mut pp: PingPong, interval: Duration, timeout: Duration) -> SessionError {
    loop {
        tokio::time::sleep(interval).await;
        match tokio::time::timeout(timeout, pp.ping(Ping::opaque())).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return SessionError::H2(e),
            Err(_) => return SessionError::KeepaliveTimeout(timeout),
        }
    }
}

/// Seed side of a session: opens streams on the agent's connection.
pub struct H2Opener {
    send: client::SendRequest<Bytes>,
    state: OpenerState,
}

impl H2Opener {
    /// A failed open: a GOAWAY from the agent means it drains (503, and the dial may be retried
    /// on another agent), anything else is a transport failure.
    fn open_error(&self, e: h2::Error) -> DialError {
        if e.is_go_away() && e.is_remote() {
            self.state.set_draining();
            DialError::Draining(format!("the agent is shutting down ({e})"))
        } else {
            DialError::Transport(e.to_string())
        }
    }
}

/// Counts a stream as active until dropped.
struct ActiveStream {
    inner: H2Stream,
    _active: Active<Arc<AtomicUsize>>,
}

impl crate::io::Resettable for ActiveStream {
    fn reset(&mut self) {
        crate::io::Resettable::reset(&mut self.inner);
    }
}

impl AsyncRead for ActiveStream {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for ActiveStream {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

fn dial_error_from_response(resp: &Response<h2::RecvStream>) -> DialError {
    let h = |name| resp.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    let code = h(ERROR_HEADER);
    let reason = h(REASON_HEADER);
    if code.is_empty() {
        DialError::Transport(format!("agent answered {}", resp.status()))
    } else {
        DialError::from_code(&code, reason)
    }
}

impl Opener for H2Opener {
    fn open(&self, target: &str, timeout: Duration) -> BoxFuture<'_, Result<TunnelStream, DialError>> {
        let target = target.to_owned();
        Box::pin(async move {
            if self.state.closed.is_cancelled() {
                return Err(DialError::Transport("session closed".into()));
            }
            let req = Request::builder()
                .method(Method::CONNECT)
                .uri(target.as_str())
                .body(())
                .map_err(|e| DialError::BadTarget(format!("{target}: {e}")))?;
            let send = self.send.clone();
            let fut = async move {
                let mut ready = send.ready().await.map_err(|e| self.open_error(e))?;
                let (resp, stream) = ready.send_request(req, false).map_err(|e| self.open_error(e))?;
                let resp = resp.await.map_err(|e| self.open_error(e))?;
                Ok::<_, DialError>((resp, stream))
            };
            let (resp, stream) = match tokio::time::timeout(timeout, fut).await {
                Ok(r) => r?,
                Err(_) => {
                    return Err(DialError::Timeout(format!("{target}: no answer from the agent within {timeout:?}")));
                }
            };
            if resp.status() != StatusCode::OK {
                return Err(dial_error_from_response(&resp));
            }
            Ok(TunnelStream::new(ActiveStream {
                inner: H2Stream::new(stream, resp.into_body()),
                _active: Active::new(self.state.active.clone()),
            }))
        })
    }

    fn control(&self, msg: &ControlMsg) -> Result<(), DialError> {
        self.state.control(msg)
    }

    fn active_streams(&self) -> usize {
        self.state.active_streams()
    }

    fn is_closed(&self) -> bool {
        self.state.is_closed()
    }
}

/// Everything the seed learns when an agent session starts.
pub struct SeedSession {
    pub opener: Arc<H2Opener>,
    /// What the agent said about itself on the control stream (may arrive after the start).
    pub hello: Arc<Mutex<Option<AgentHello>>>,
}

/// Run the seed side of a session on an established TLS connection. Returns the opener at once
/// (through `on_ready`) and completes when the session ends. `stop` ends it early: the
/// connection closes (the h2 client side cannot send a GOAWAY), so streams in flight are cut.
pub async fn run_seed_session<T>(
    io: T,
    settings: &TunnelSettings,
    stop: CancellationToken,
    on_ready: impl FnOnce(SeedSession),
) -> Result<(), SessionError>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (send, mut conn) = client::Builder::new()
        .initial_window_size(settings.stream_window)
        .initial_connection_window_size(settings.connection_window)
        .max_frame_size(settings.max_frame_size)
        .max_concurrent_reset_streams(1024)
        .max_send_buffer_size(settings.stream_window as usize)
        .enable_push(false)
        .handshake::<_, Bytes>(io)
        .await
        .map_err(SessionError::Handshake)?;
    let pp = conn.ping_pong().expect("ping_pong is available once");
    let closed = CancellationToken::new();
    let (state, ctl_rx) = OpenerState::new(closed.clone());
    let opener = Arc::new(H2Opener { send: send.clone(), state });
    let hello = Arc::new(Mutex::new(None));
    on_ready(SeedSession { opener: opener.clone(), hello: hello.clone() });
    let control = tokio::spawn(seed_control(send, ctl_rx, hello, closed.clone()));
    let result = tokio::select! {
        r = &mut conn => r.map_err(SessionError::H2),
        e = keepalive(pp, settings.keepalive_interval, settings.keepalive_timeout) => Err(e),
        _ = stop.cancelled() => Err(SessionError::Stopped),
    };
    closed.cancel();
    control.abort();
    result
}

/// Open the control stream, read the agent's hello, then forward queued control messages.
async fn seed_control(
    send: client::SendRequest<Bytes>,
    mut rx: mpsc::Receiver<ControlMsg>,
    hello: Arc<Mutex<Option<AgentHello>>>,
    closed: CancellationToken,
) {
    let run = async {
        let req = Request::builder().method(Method::POST).uri(format!("https://agent{CONTROL_PATH}")).body(()).ok()?;
        let mut ready = send.ready().await.ok()?;
        let (resp, mut stream) = ready.send_request(req, false).ok()?;
        let resp = resp.await.ok()?;
        if resp.status() != StatusCode::OK {
            tracing::warn!(status = %resp.status(), "agent refused the control stream");
            return None;
        }
        let mut lines = Lines::new(resp.into_body());
        if let Some(line) = lines.next().await
            && let Ok(h) = serde_json::from_slice::<AgentHello>(&line)
        {
            *hello.lock().expect("not poisoned") = Some(h);
        }
        while let Some(msg) = rx.recv().await {
            let mut line = serde_json::to_vec(&msg).ok()?;
            line.push(b'\n');
            stream.send_data(Bytes::from(line), false).ok()?;
        }
        Some(())
    };
    tokio::select! {
        _ = run => {}
        _ = closed.cancelled() => {}
    }
}

/// JSON lines on a control stream, framed by [`LineFramer`] (sans-IO, so it is fuzzed and
/// tested without a session).
struct Lines {
    recv: h2::RecvStream,
    framer: LineFramer,
}

impl Lines {
    fn new(recv: h2::RecvStream) -> Self {
        Self { recv, framer: LineFramer::new(CONTROL_LINE_MAX) }
    }

    /// The next line without its `\n`; `None` at the end of the stream, on an error, or when a
    /// line is longer than [`CONTROL_LINE_MAX`] (the stream is then useless: it is dropped).
    async fn next(&mut self) -> Option<Vec<u8>> {
        loop {
            if let Some(line) = self.framer.next_line().ok()? {
                return Some(line);
            }
            let chunk = self.recv.data().await?.ok()?;
            let _ = self.recv.flow_control().release_capacity(chunk.len());
            self.framer.push(&chunk);
        }
    }
}

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

/// Run the agent side of a session on an established TLS connection until it ends.
/// `stop` ends it with a GOAWAY (streams in flight may finish).
pub async fn run_agent_session<T>(
    io: T,
    settings: &TunnelSettings,
    handler: Arc<dyn AgentHandler>,
    stop: CancellationToken,
    tracker: tokio_util::task::TaskTracker,
) -> Result<(), SessionError>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
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
    let mut conn = tokio::time::timeout(settings.keepalive_timeout, handshake)
        .await
        .map_err(|_| SessionError::HandshakeTimeout(settings.keepalive_timeout))?
        .map_err(SessionError::Handshake)?;
    handler.established();
    let pp = conn.ping_pong().expect("ping_pong is available once");
    let ka = keepalive(pp, settings.keepalive_interval, settings.keepalive_timeout);
    tokio::pin!(ka);
    let going_away = AtomicBool::new(false);
    // The control stream lives as long as the session; it must not keep a draining session open.
    let mut control: Option<tokio::task::JoinHandle<()>> = None;
    loop {
        let next = tokio::select! {
            r = conn.accept() => r,
            e = &mut ka => return Err(e),
            _ = stop.cancelled(), if !going_away.load(Ordering::Relaxed) => {
                going_away.store(true, Ordering::Relaxed);
                if let Some(c) = control.take() {
                    c.abort();
                }
                conn.graceful_shutdown();
                continue;
            }
        };
        let (req, respond) = match next {
            None => return Ok(()),
            Some(Err(e)) => return Err(SessionError::H2(e)),
            Some(Ok(x)) => x,
        };
        let (parts, recv) = req.into_parts();
        if parts.method == Method::CONNECT {
            let target = parts.uri.authority().map(|a| a.as_str().to_owned()).unwrap_or_default();
            let inc = Incoming { target, responder: Box::new(H2Responder { respond, recv }) };
            tracker.spawn(handler.incoming(inc));
        } else if parts.method == Method::POST && parts.uri.path() == CONTROL_PATH {
            let task = tokio::spawn(agent_control(respond, recv, handler.clone()));
            if going_away.load(Ordering::Relaxed) {
                task.abort();
            } else if let Some(old) = control.replace(task) {
                old.abort();
            }
        } else {
            let mut respond = respond;
            respond.send_reset(Reason::REFUSED_STREAM);
        }
    }
}

async fn agent_control(mut respond: server::SendResponse<Bytes>, recv: h2::RecvStream, handler: Arc<dyn AgentHandler>) {
    let Ok(mut send) = respond.send_response(Response::new(()), false) else { return };
    let mut hello = serde_json::to_vec(&handler.hello()).unwrap_or_default();
    hello.push(b'\n');
    if send.send_data(Bytes::from(hello), false).is_err() {
        return;
    }
    let mut lines = Lines::new(recv);
    while let Some(line) = lines.next().await {
        match serde_json::from_slice::<ControlMsg>(&line) {
            Ok(msg) => handler.control(msg),
            Err(e) => tracing::warn!(error = %e, "unknown control message ignored"),
        }
    }
}
