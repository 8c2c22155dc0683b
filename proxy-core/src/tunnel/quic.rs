//! The QUIC transport of the tunnel (quinn): the agent dials over UDP, the seed opens one bidirectional QUIC stream per proxied connection.
//!
//! Same roles as [`super::h2`]: the agent is the QUIC client (it dials out), the seed opens the
//! streams. TLS 1.3, ALPN `seedgate-tunnel/1` and the certificates are those of the TCP
//! transport; QUIC brings per-stream flow control, no head-of-line blocking between streams and
//! connection migration (an agent whose address changes keeps its session).
//!
//! Stream header (seed → agent), first bytes of every stream the seed opens:
//! `[version = 1: u8][kind: u8][len: u16 big-endian][target: len bytes, UTF-8 host:port]`,
//! kind `0` = connect to `target`, kind `1` = the control stream (`len` = 0).
//!
//! Answer (agent → seed) on a connect stream:
//! `[status: u8][len: u16 big-endian][payload: len bytes]`: status `0` = the dial succeeded
//! (`len` = 0; the stream's bytes follow), `1` = refused, payload `<code>\n<reason>` (the codes
//! of [`DialError::code`]); the agent then finishes the stream.
//!
//! Control stream: the first stream the seed opens. The agent writes its [`AgentHello`] as a
//! JSON line, the seed then writes [`ControlMsg`] JSON lines. When the agent shuts down it writes
//! the line `{"type":"going_away"}` (the GOAWAY equivalent): the seed opens no new stream on the
//! session, streams in flight continue; streams that crossed the notice are refused with
//! `draining`. Once its last stream ends the agent closes the connection with code
//! [`CLOSE_DONE`].
//!
//! Bytes: QUIC stream data, flow control per stream (`stream_window`) and per connection
//! (`connection_window`); FIN is a half-close; RESET_STREAM / STOP_SENDING with [`RESET_CODE`]
//! is a reset. Liveness: QUIC keep-alive every keepalive interval, the idle timeout is the
//! keepalive timeout.

use super::h2::CONTROL_LINE_MAX;
use super::{
    AgentHandler, AgentHello, BoxFuture, ControlMsg, DialError, Incoming, Opener, OpenerState, Responder,
    TunnelSettings, TunnelStream,
};
use crate::guard::Active;
use crate::io::Resettable;
use proxy_wire::lines::LineFramer;
use quinn::{Connection, ConnectionError, RecvStream, SendStream, VarInt};
use serde::{Deserialize, Serialize};
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Version byte of the stream header.
pub const HEADER_VERSION: u8 = 1;
pub const KIND_CONNECT: u8 = 0;
pub const KIND_CONTROL: u8 = 1;
pub const STATUS_OK: u8 = 0;
pub const STATUS_REFUSED: u8 = 1;
/// Application error code of a reset stream (RESET_STREAM, STOP_SENDING).
pub const RESET_CODE: u32 = 0x10;
/// Connection close: the session ended in order (the agent drained after its going-away notice).
pub const CLOSE_DONE: u32 = 0;
/// Connection close: the seed stopped the session.
pub const CLOSE_STOPPED: u32 = 1;
/// Connection close: a peer broke the protocol.
pub const CLOSE_PROTOCOL: u32 = 2;
/// Largest refusal payload (code and reason).
const ANSWER_MAX: usize = 1024;

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("QUIC connection: {0}")]
    Connection(#[from] ConnectionError),
    #[error("no control stream from the seed within {0:?}")]
    HandshakeTimeout(Duration),
    #[error("protocol error: {0}")]
    Protocol(String),
    #[error("session stopped")]
    Stopped,
}

/// What the agent writes on the control stream after its hello.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AgentMsg {
    /// The agent shuts down: no new streams on this session.
    GoingAway,
}

/// quinn transport settings from the tunnel's: flow-control windows, stream limit, keepalive.
pub fn transport_config(s: &TunnelSettings) -> quinn::TransportConfig {
    let mut t = quinn::TransportConfig::default();
    t.stream_receive_window(VarInt::from_u32(s.stream_window));
    t.receive_window(VarInt::from_u32(s.connection_window));
    t.send_window(u64::from(s.connection_window));
    t.max_concurrent_bidi_streams(VarInt::from_u32(s.max_streams));
    t.max_concurrent_uni_streams(VarInt::from_u32(0));
    t.keep_alive_interval(Some(s.keepalive_interval));
    t.max_idle_timeout(quinn::IdleTimeout::try_from(s.keepalive_timeout).ok());
    t
}

/// UDP socket buffer for a tunnel endpoint: room for a burst of the connection window, so the
/// kernel does not drop datagrams before quinn reads them (default buffers of ~200 KiB collapse
/// QUIC throughput under bursts); 1 MiB at least, 8 MiB at most (beyond, the window is flow
/// control's job, not the socket's).
pub fn udp_buffer(s: &TunnelSettings) -> usize {
    (s.connection_window as usize).clamp(1 << 20, 8 << 20)
}

/// A quinn endpoint on a UDP socket bound to `addr` with [`udp_buffer`] bytes of buffer (a
/// warning names `key` if the kernel caps it); a server endpoint when `server` is given.
pub fn endpoint(
    addr: std::net::SocketAddr,
    settings: &TunnelSettings,
    server: Option<quinn::ServerConfig>,
    what: &str,
    key: &str,
) -> io::Result<quinn::Endpoint> {
    // Once per process: an agent opens an endpoint per session, and the cap does not change.
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let sock = crate::net::bind_udp(addr, udp_buffer(settings), what, key, Some(&WARNED))?;
    quinn::Endpoint::new(quinn::EndpointConfig::default(), server, sock, Arc::new(quinn::TokioRuntime))
}

/// Encode a stream header.
pub fn encode_header(kind: u8, target: &str) -> Result<Vec<u8>, DialError> {
    let len =
        u16::try_from(target.len()).map_err(|_| DialError::BadTarget(format!("target too long: {target:.64}")))?;
    let mut h = Vec::with_capacity(4 + target.len());
    h.extend_from_slice(&[HEADER_VERSION, kind]);
    h.extend_from_slice(&len.to_be_bytes());
    h.extend_from_slice(target.as_bytes());
    Ok(h)
}

/// Read a stream header: the kind and the target.
pub async fn read_header(recv: &mut RecvStream) -> Result<(u8, String), String> {
    let mut fixed = [0u8; 4];
    recv.read_exact(&mut fixed).await.map_err(|e| format!("stream header: {e}"))?;
    if fixed[0] != HEADER_VERSION {
        return Err(format!("stream header version {} (want {HEADER_VERSION})", fixed[0]));
    }
    let len = u16::from_be_bytes([fixed[2], fixed[3]]) as usize;
    let mut target = vec![0u8; len];
    recv.read_exact(&mut target).await.map_err(|e| format!("stream header: {e}"))?;
    let target = String::from_utf8(target).map_err(|_| "stream header: target is not UTF-8".to_owned())?;
    Ok((fixed[1], target))
}

fn encode_answer(err: Option<&DialError>) -> Vec<u8> {
    match err {
        None => vec![STATUS_OK, 0, 0],
        Some(e) => {
            let mut payload = format!("{}\n{}", e.code(), e.detail()).into_bytes();
            payload.truncate(ANSWER_MAX);
            let mut a = vec![STATUS_REFUSED];
            a.extend_from_slice(&(payload.len() as u16).to_be_bytes());
            a.extend_from_slice(&payload);
            a
        }
    }
}

async fn read_answer(recv: &mut RecvStream) -> Result<(), DialError> {
    let t = |e: String| DialError::Transport(format!("answer from the agent: {e}"));
    let mut fixed = [0u8; 3];
    recv.read_exact(&mut fixed).await.map_err(|e| t(e.to_string()))?;
    let len = u16::from_be_bytes([fixed[1], fixed[2]]) as usize;
    if len > ANSWER_MAX {
        return Err(t(format!("{len} bytes")));
    }
    let mut payload = vec![0u8; len];
    recv.read_exact(&mut payload).await.map_err(|e| t(e.to_string()))?;
    match fixed[0] {
        STATUS_OK => Ok(()),
        STATUS_REFUSED => {
            let payload = String::from_utf8_lossy(&payload);
            let (code, reason) = payload.split_once('\n').unwrap_or((&payload, ""));
            Err(DialError::from_code(code, reason.to_owned()))
        }
        s => Err(t(format!("status {s}"))),
    }
}

/// One QUIC stream as a byte stream. Dropped before an orderly end both ways, it resets.
pub struct QuicStream {
    send: SendStream,
    recv: RecvStream,
    read_eof: bool,
    write_closed: bool,
    /// Bytes to send before the stream's own (the agent's answer), not yet sent.
    prefix: Vec<u8>,
    /// Counts the stream as active (on its session) until dropped.
    _active: Option<Active<Arc<AtomicUsize>>>,
}

impl QuicStream {
    fn new(send: SendStream, recv: RecvStream, active: Option<Active<Arc<AtomicUsize>>>) -> Self {
        Self { send, recv, read_eof: false, write_closed: false, prefix: Vec::new(), _active: active }
    }

    /// Send what is left of the prefix.
    fn poll_prefix(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.prefix.is_empty() {
            let n = std::task::ready!(Pin::new(&mut self.send).poll_write(cx, &self.prefix))?;
            self.prefix.drain(..n);
        }
        Poll::Ready(Ok(()))
    }
}

impl Resettable for QuicStream {
    fn reset(&mut self) {
        let _ = self.send.reset(VarInt::from_u32(RESET_CODE));
        let _ = self.recv.stop(VarInt::from_u32(RESET_CODE));
        self.write_closed = true;
        self.read_eof = true;
    }
}

impl AsyncRead for QuicStream {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if let Poll::Ready(Err(e)) = this.poll_prefix(cx) {
            return Poll::Ready(Err(e));
        }
        let before = buf.filled().len();
        let r = Pin::new(&mut this.recv).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = &r
            && buf.filled().len() == before
            && buf.remaining() > 0
        {
            this.read_eof = true;
        }
        r
    }
}

impl AsyncWrite for QuicStream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if self.write_closed {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        std::task::ready!(self.poll_prefix(cx))?;
        AsyncWrite::poll_write(Pin::new(&mut self.send), cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.send).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.write_closed {
            std::task::ready!(self.poll_prefix(cx))?;
            self.write_closed = true;
            // FIN: the half-close the far side turns into a TCP FIN.
            self.send.finish().map_err(|e| io::Error::new(io::ErrorKind::BrokenPipe, e))?;
        }
        Poll::Ready(Ok(()))
    }
}

impl Drop for QuicStream {
    fn drop(&mut self) {
        // quinn finishes a dropped send stream; an unfinished exchange must look like a reset.
        if !(self.write_closed && self.read_eof) {
            let _ = self.send.reset(VarInt::from_u32(RESET_CODE));
            let _ = self.recv.stop(VarInt::from_u32(RESET_CODE));
        }
    }
}

/// Seed side of a QUIC session: opens streams on the agent's connection.
pub struct QuicOpener {
    conn: Connection,
    state: OpenerState,
}

impl Opener for QuicOpener {
    fn open(&self, target: &str, timeout: Duration) -> BoxFuture<'_, Result<TunnelStream, DialError>> {
        let target = target.to_owned();
        Box::pin(async move {
            if self.is_closed() {
                return Err(DialError::Draining("the agent is shutting down".into()));
            }
            let header = encode_header(KIND_CONNECT, &target)?;
            let run = async {
                let (mut send, mut recv) =
                    self.conn.open_bi().await.map_err(|e| DialError::Transport(e.to_string()))?;
                let active = Active::new(self.state.active.clone());
                send.write_all(&header).await.map_err(|e| DialError::Transport(e.to_string()))?;
                match read_answer(&mut recv).await {
                    Ok(()) => Ok(TunnelStream::new(QuicStream::new(send, recv, Some(active)))),
                    Err(e) => {
                        if matches!(e, DialError::Draining(_)) {
                            self.state.set_draining();
                        }
                        Err(e)
                    }
                }
            };
            match tokio::time::timeout(timeout, run).await {
                Ok(r) => r,
                Err(_) => Err(DialError::Timeout(format!("{target}: no answer from the agent within {timeout:?}"))),
            }
        })
    }

    fn control(&self, msg: &ControlMsg) -> Result<(), DialError> {
        self.state.control(msg)
    }

    fn active_streams(&self) -> usize {
        self.state.active_streams()
    }

    fn is_closed(&self) -> bool {
        self.state.is_closed() || self.conn.close_reason().is_some()
    }
}

/// Everything the seed learns when an agent session starts.
pub struct SeedSession {
    pub opener: Arc<QuicOpener>,
    /// What the agent said about itself on the control stream (may arrive after the start).
    pub hello: Arc<Mutex<Option<AgentHello>>>,
}

/// Run the seed side of a session on an established QUIC connection. Opens the control stream,
/// hands the opener to `on_ready` and completes when the session ends. `stop` closes the
/// connection (streams in flight are cut).
pub async fn run_seed_session_quic(
    conn: Connection,
    _settings: &TunnelSettings,
    stop: CancellationToken,
    on_ready: impl FnOnce(SeedSession),
) -> Result<(), SessionError> {
    // The control stream is the first stream: opened (and made visible by its header) before
    // any connect stream can be.
    let (mut ctl_send, ctl_recv) = conn.open_bi().await?;
    let header = encode_header(KIND_CONTROL, "").map_err(|e| SessionError::Protocol(e.to_string()))?;
    ctl_send.write_all(&header).await.map_err(|e| SessionError::Protocol(format!("control stream: {e}")))?;
    let closed = CancellationToken::new();
    let (state, ctl_rx) = OpenerState::new(closed.clone());
    let opener = Arc::new(QuicOpener { conn: conn.clone(), state });
    let hello = Arc::new(Mutex::new(None));
    on_ready(SeedSession { opener: opener.clone(), hello: hello.clone() });
    let control = tokio::spawn(seed_control(ctl_send, ctl_recv, ctl_rx, hello, opener.clone()));
    let result = tokio::select! {
        e = conn.closed() => match e {
            ConnectionError::ApplicationClosed(c) if c.error_code == VarInt::from_u32(CLOSE_DONE) => Ok(()),
            ConnectionError::LocallyClosed => Ok(()),
            e => Err(SessionError::Connection(e)),
        },
        _ = stop.cancelled() => {
            conn.close(VarInt::from_u32(CLOSE_STOPPED), b"stopped");
            Err(SessionError::Stopped)
        }
    };
    closed.cancel();
    control.abort();
    result
}

/// Read the agent's hello (and later its going-away notice); write queued control messages.
async fn seed_control(
    mut send: SendStream,
    recv: RecvStream,
    mut rx: mpsc::Receiver<ControlMsg>,
    hello: Arc<Mutex<Option<AgentHello>>>,
    opener: Arc<QuicOpener>,
) {
    let reader = async move {
        let mut lines = Lines::new(recv);
        if let Some(line) = lines.next().await
            && let Ok(h) = serde_json::from_slice::<AgentHello>(&line)
        {
            *hello.lock().expect("not poisoned") = Some(h);
        }
        while let Some(line) = lines.next().await {
            match serde_json::from_slice::<AgentMsg>(&line) {
                Ok(AgentMsg::GoingAway) => {
                    tracing::debug!("agent going away: no new streams on this session");
                    opener.state.set_draining();
                }
                Err(e) => tracing::warn!(error = %e, "unknown message from the agent ignored"),
            }
        }
    };
    let writer = async move {
        while let Some(msg) = rx.recv().await {
            let Ok(mut line) = serde_json::to_vec(&msg) else { continue };
            line.push(b'\n');
            if send.write_all(&line).await.is_err() {
                return;
            }
        }
    };
    tokio::join!(reader, writer);
}

/// JSON lines on a control stream, framed by [`LineFramer`].
struct Lines {
    recv: RecvStream,
    framer: LineFramer,
}

impl Lines {
    fn new(recv: RecvStream) -> Self {
        Self { recv, framer: LineFramer::new(CONTROL_LINE_MAX) }
    }

    async fn next(&mut self) -> Option<Vec<u8>> {
        let mut buf = [0u8; 4096];
        loop {
            if let Some(line) = self.framer.next_line().ok()? {
                return Some(line);
            }
            let n = self.recv.read(&mut buf).await.ok()??;
            self.framer.push(&buf[..n]);
        }
    }
}

/// Answers one incoming stream on the agent.
struct QuicResponder {
    send: SendStream,
    recv: RecvStream,
    active: Active<Arc<AtomicUsize>>,
}

impl Responder for QuicResponder {
    fn accept(self: Box<Self>) -> Result<TunnelStream, DialError> {
        let QuicResponder { send, recv, active } = *self;
        let mut stream = QuicStream::new(send, recv, Some(active));
        stream.prefix = encode_answer(None);
        // A fresh stream has send credit for 3 bytes: queue the answer now, so the seed learns
        // of the dial at once even if the target sends nothing first. Anything left (no credit
        // on the connection) goes out on the stream's next read or write.
        let mut cx = Context::from_waker(std::task::Waker::noop());
        if let Poll::Ready(Err(e)) = stream.poll_prefix(&mut cx) {
            return Err(DialError::Transport(format!("answer to the seed: {e}")));
        }
        Ok(TunnelStream::new(stream))
    }

    fn refuse(self: Box<Self>, err: &DialError) {
        let QuicResponder { mut send, recv, active } = *self;
        let answer = encode_answer(Some(err));
        tokio::spawn(async move {
            let _ = send.write_all(&answer).await;
            let _ = send.finish();
            drop(recv);
            drop(active);
        });
    }
}

/// Run the agent side of a session on an established QUIC connection until it ends.
/// `stop` announces the shutdown (streams in flight may finish), then the connection closes
/// once the last stream ended.
pub async fn run_agent_session_quic(
    conn: Connection,
    settings: &TunnelSettings,
    handler: Arc<dyn AgentHandler>,
    stop: CancellationToken,
    tracker: tokio_util::task::TaskTracker,
) -> Result<(), SessionError> {
    // The seed's control stream comes first, within the keepalive timeout.
    let first = async {
        let (send, mut recv) = conn.accept_bi().await?;
        let (kind, _) = read_header(&mut recv).await.map_err(SessionError::Protocol)?;
        if kind != KIND_CONTROL {
            return Err(SessionError::Protocol(format!("first stream is of kind {kind}, not control")));
        }
        Ok((send, recv))
    };
    let (ctl_send, ctl_recv) = match tokio::time::timeout(settings.keepalive_timeout, first).await {
        Ok(Ok(x)) => x,
        Ok(Err(e)) => {
            if let SessionError::Protocol(_) = e {
                conn.close(VarInt::from_u32(CLOSE_PROTOCOL), b"protocol error");
            }
            return Err(e);
        }
        Err(_) => {
            conn.close(VarInt::from_u32(CLOSE_PROTOCOL), b"no control stream");
            return Err(SessionError::HandshakeTimeout(settings.keepalive_timeout));
        }
    };
    handler.established();
    let (away_tx, away_rx) = mpsc::channel::<()>(1);
    let control = tokio::spawn(agent_control(ctl_send, ctl_recv, handler.clone(), away_rx));
    let active = Arc::new(AtomicUsize::new(0));
    let mut going_away = false;
    let result = loop {
        let next = tokio::select! {
            r = conn.accept_bi() => r,
            _ = stop.cancelled(), if !going_away => {
                going_away = true;
                let _ = away_tx.try_send(());
                let (conn, active) = (conn.clone(), active.clone());
                // Close once the last stream ended.
                tokio::spawn(async move {
                    while active.load(Ordering::Relaxed) > 0 && conn.close_reason().is_none() {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    conn.close(VarInt::from_u32(CLOSE_DONE), b"agent shut down");
                });
                continue;
            }
        };
        let (send, mut recv) = match next {
            Ok(x) => x,
            Err(ConnectionError::ApplicationClosed(_) | ConnectionError::LocallyClosed) => break Ok(()),
            Err(e) => break Err(SessionError::Connection(e)),
        };
        let guard = Active::new(active.clone());
        let (handler, draining) = (handler.clone(), going_away);
        tracker.spawn(async move {
            let Ok(Ok((kind, target))) = tokio::time::timeout(Duration::from_secs(10), read_header(&mut recv)).await
            else {
                let mut send = send;
                let _ = send.reset(VarInt::from_u32(RESET_CODE));
                return;
            };
            let responder = Box::new(QuicResponder { send, recv, active: guard });
            if kind != KIND_CONNECT {
                responder.refuse(&DialError::BadTarget(format!("unexpected stream kind {kind}")));
            } else if draining {
                responder.refuse(&DialError::Draining("the agent is shutting down".into()));
            } else {
                handler.incoming(Incoming { target, responder }).await;
            }
        });
    };
    control.abort();
    result
}

async fn agent_control(
    mut send: SendStream,
    recv: RecvStream,
    handler: Arc<dyn AgentHandler>,
    mut away: mpsc::Receiver<()>,
) {
    let mut hello = serde_json::to_vec(&handler.hello()).unwrap_or_default();
    hello.push(b'\n');
    if send.write_all(&hello).await.is_err() {
        return;
    }
    let reader = async {
        let mut lines = Lines::new(recv);
        while let Some(line) = lines.next().await {
            match serde_json::from_slice::<ControlMsg>(&line) {
                Ok(msg) => handler.control(msg),
                Err(e) => tracing::warn!(error = %e, "unknown control message ignored"),
            }
        }
    };
    let notice = async {
        if away.recv().await.is_some()
            && let Ok(mut line) = serde_json::to_vec(&AgentMsg::GoingAway)
        {
            line.push(b'\n');
            let _ = send.write_all(&line).await;
        }
        // Keep the send side open: the seed reads until the connection closes.
        std::future::pending::<()>().await;
    };
    tokio::join!(reader, notice);
}
