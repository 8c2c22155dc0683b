//! The agent's end of an HTTP/2 session: the h2 server on its own TLS connection, answering the seed's `CONNECT`s and its control stream, GOAWAY as the going-away notice.

use super::errors::failed;
use super::keepalive::keepalive;
use super::stream::H2Stream;
use super::tuning::{Tuning, Windows};
use crate::tunnel::session::{self, Accepted, AgentConnection, AgentSession, AgentTransport, Notice, SessionError};
use crate::tunnel::{
    AgentHandler, BoxFuture, CONTROL_PATH, DialError, ERROR_HEADER, Incoming, REASON_HEADER, Responder, TunnelSettings,
    TunnelStream,
};
use bytes::Bytes;
use h2::{Reason, server};
use http::{Method, Response, StatusCode};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::io::InspectReader;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

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
