//! The agent's end of a QUIC session: the seed's control stream first, then its streams as dials, the stream allowance raised as they fill, the going-away notice on the control stream.

use super::config::FIRST_STREAM_ALLOWANCE;
use super::liveness::watch_quiet;
use super::stream::{QuicSend, QuicStream, Turns, read_framed};
use crate::net::guard::Active;
use crate::tunnel::session::{self, Accepted, AgentConnection, AgentSession, AgentTransport, Notice, SessionError};
use crate::tunnel::{AgentHandler, BoxFuture, DialError, Incoming, Responder, TunnelSettings, TunnelStream};
use proxy_wire::tunnel::quic::{
    Answer, CLOSE_DONE, CLOSE_PROTOCOL, KIND_CONNECT, KIND_CONTROL, RESET_CODE, StreamHeader,
};
use quinn::{Connection, ConnectionError, RecvStream, SendStream, VarInt};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How long the agent waits for a stream's header once the stream is open.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Answers one incoming stream on the agent.
struct QuicResponder {
    send: SendStream,
    recv: RecvStream,
    active: Active<Arc<AtomicUsize>>,
    turns: Arc<Turns>,
}

impl Responder for QuicResponder {
    fn accept(self: Box<Self>) -> Result<TunnelStream, DialError> {
        let QuicResponder { send, recv, active, turns } = *self;
        let mut stream = QuicStream::new(send, recv, turns);
        stream.prefix = Answer::Connected.encode();
        // A fresh stream has send credit for 3 bytes: queue the answer now, so the seed learns
        // of the dial at once even if the target sends nothing first. Anything left (no credit
        // on the connection) goes out on the stream's next read or write.
        let mut cx = Context::from_waker(std::task::Waker::noop());
        if let Poll::Ready(Err(e)) = stream.poll_prefix(&mut cx) {
            return Err(DialError::Transport(format!("answer to the seed: {e}")));
        }
        Ok(TunnelStream::counted(stream, active))
    }

    fn refuse(self: Box<Self>, err: &DialError) {
        let QuicResponder { send, recv, active, turns } = *self;
        let mut stream = QuicStream::new(send, recv, turns);
        let answer = Answer::refusal(err).encode();
        tokio::spawn(async move {
            if stream.send.send_all(&answer).await.is_ok() {
                let _ = tokio::io::AsyncWriteExt::shutdown(&mut stream).await;
            }
            stream.stop_reading();
            drop(active);
        });
    }
}

/// The agent's end of a QUIC session: the seed's streams after the control stream.
struct QuicAgent {
    conn: Connection,
    /// Streams accepted and not yet ended (the control stream aside).
    active: Arc<AtomicUsize>,
    turns: Arc<Turns>,
    /// Streams the seed may have open now, and at most.
    allowed: u32,
    max_streams: u32,
    /// The going-away notice went out: streams that crossed it are refused.
    draining: bool,
}

/// Read a stream's header and turn it into the dial it asks for; anything else is refused
/// (or, without a header in time, reset).
async fn incoming(
    send: SendStream,
    mut recv: RecvStream,
    active: Active<Arc<AtomicUsize>>,
    turns: Arc<Turns>,
    draining: bool,
) -> Option<Incoming> {
    let Ok(Ok(header)) = tokio::time::timeout(HEADER_TIMEOUT, read_framed(&mut recv, StreamHeader::read)).await else {
        let mut send = send;
        let _ = send.reset(VarInt::from_u32(RESET_CODE));
        return None;
    };
    let responder = Box::new(QuicResponder { send, recv, active, turns });
    if header.kind != KIND_CONNECT {
        responder.refuse(&DialError::BadTarget(format!("unexpected stream kind {}", header.kind)));
        None
    } else if draining {
        responder.refuse(&DialError::Draining("the agent is shutting down".into()));
        None
    } else {
        Some(Incoming { target: header.target, responder })
    }
}

impl QuicAgent {
    /// Double the seed's stream allowance once half of it is in use (the control stream is one
    /// of them), so that opens rarely wait for credit and idle sessions stay small.
    fn allow_more(&mut self) {
        let open = u32::try_from(self.active.load(Ordering::Relaxed)).unwrap_or(u32::MAX).saturating_add(1);
        if open >= self.allowed / 2 && self.allowed < self.max_streams {
            self.allowed = self.max_streams.min(self.allowed.saturating_mul(2));
            self.conn.set_max_concurrent_bi_streams(VarInt::from_u32(self.allowed));
        }
    }
}

impl AgentTransport for QuicAgent {
    type ControlSend = QuicSend;
    type ControlRecv = RecvStream;
    type Pending = BoxFuture<'static, Option<Incoming>>;

    async fn accept(&mut self) -> Result<Option<Accepted<Self>>, SessionError> {
        let (send, recv) = match self.conn.accept_bi().await {
            Ok(s) => s,
            Err(ConnectionError::ApplicationClosed(_) | ConnectionError::LocallyClosed) => return Ok(None),
            Err(e) => return Err(SessionError::transport("QUIC connection", e)),
        };
        let active = Active::new(self.active.clone());
        self.allow_more();
        let pending: BoxFuture<'static, _> = Box::pin(incoming(send, recv, active, self.turns.clone(), self.draining));
        Ok(Some(Accepted::Pending(pending)))
    }

    /// The notice goes on the control stream; the connection closes once the last stream ended.
    fn going_away(&mut self) -> Notice {
        self.draining = true;
        let (conn, active) = (self.conn.clone(), self.active.clone());
        tokio::spawn(async move {
            while active.load(Ordering::Relaxed) > 0 && conn.close_reason().is_none() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            conn.close(VarInt::from_u32(CLOSE_DONE), b"agent shut down");
        });
        Notice::OnControl
    }
}

/// The seed's control stream: the first stream, its header read.
async fn accept_control(conn: &Connection) -> Result<(SendStream, RecvStream), SessionError> {
    let (send, mut recv) = conn.accept_bi().await.map_err(|e| SessionError::transport("QUIC connection", e))?;
    let header = read_framed(&mut recv, StreamHeader::read)
        .await
        .map_err(|e| SessionError::Protocol(format!("stream header: {e}")))?;
    if header.kind != KIND_CONTROL {
        return Err(SessionError::Protocol(format!("first stream is of kind {}, not control", header.kind)));
    }
    Ok((send, recv))
}

/// The agent's end of a session on an established QUIC connection, until it ends
/// ([`session::run_agent`]). `stop` announces the shutdown (streams in flight may finish),
/// then the connection closes once the last stream ended.
async fn agent_session(
    conn: Connection,
    settings: &TunnelSettings,
    handler: Arc<dyn AgentHandler>,
    stop: CancellationToken,
    tracker: TaskTracker,
) -> Result<(), SessionError> {
    // The seed's control stream comes first, within the keepalive timeout.
    let timeout = settings.keepalive_timeout;
    let control = match tokio::time::timeout(timeout, accept_control(&conn)).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            if let SessionError::Protocol(_) = e {
                conn.close(VarInt::from_u32(CLOSE_PROTOCOL), b"protocol error");
            }
            return Err(e);
        }
        Err(_) => {
            conn.close(VarInt::from_u32(CLOSE_PROTOCOL), b"no control stream");
            return Err(SessionError::HandshakeTimeout { waiting_for: "control stream", timeout });
        }
    };
    let h = handler.clone();
    let turns = Arc::new(Turns::default());
    let control = (QuicSend::new(control.0, turns.clone()), control.1);
    watch_quiet(conn.clone(), settings, turns.clone(), move |silent| h.quiet(silent));
    let allowed = settings.max_streams.min(FIRST_STREAM_ALLOWANCE);
    let agent = QuicAgent {
        conn,
        active: Default::default(),
        turns,
        allowed,
        max_streams: settings.max_streams,
        draining: false,
    };
    session::run_agent(agent, Some(control), handler, stop, tracker).await
}

impl AgentConnection for Connection {
    fn run_agent(self: Box<Self>, s: AgentSession<'_>) -> BoxFuture<'_, Result<(), SessionError>> {
        Box::pin(agent_session(*self, s.settings, s.handler, s.stop, s.tracker))
    }
}
