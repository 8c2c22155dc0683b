//! One agent session whatever carries it: the seed's and the agent's session loops, the control stream's protocol, and the seam a transport implements.
//!
//! A transport ([`super::h2`], [`super::quic`]) sets its connection up (handshake, first
//! stream) and hands it to [`run_seed`] or [`run_agent`] through the traits here: on the seed,
//! open a stream to a target and read the agent's answer ([`SeedTransport`]); on the agent,
//! accept the seed's next stream as the control stream or a dial, and announce going away
//! ([`AgentTransport`]); on both, send and receive the control stream's bytes ([`ControlSend`],
//! [`ControlRecv`]). The control protocol (the agent's hello, the seed's messages, the agent's
//! notices, as `proxy_wire::tunnel::control` frames them) and the session's errors exist only
//! here. [`SeedConnection`] and [`AgentConnection`] are what proxy-server and proxy-agent hold:
//! a connection of any transport, ready to run its session.

use super::TunnelStream;
use super::{
    AgentHandler, AgentHello, AgentMsg, BoxFuture, ControlMsg, DialError, Incoming, Opener, Secret, TunnelSettings,
};
use crate::net::guard::Active;
use crate::obs::Untrusted;
use crate::relay::io::Resettable;
use bytes::Bytes;
use proxy_wire::tunnel::control::{ControlReader, Line, encode_line};
use serde::de::DeserializeOwned;
use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a session ended (other than in order).
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The transport failed: its handshake, or the connection later.
    #[error("{context}: {source}")]
    Transport {
        context: &'static str,
        #[source]
        source: BoxError,
    },
    /// The peer did not start the session in time (no HTTP/2 preface, no QUIC control stream).
    #[error("no {waiting_for} from the peer within {timeout:?}")]
    HandshakeTimeout { waiting_for: &'static str, timeout: Duration },
    /// A PING went unanswered.
    #[error("keepalive: no PING answer within {0:?}")]
    KeepaliveTimeout(Duration),
    #[error("protocol error: {0}")]
    Protocol(String),
    /// Ended by this side's stop.
    #[error("session stopped")]
    Stopped,
}

impl SessionError {
    pub fn transport(context: &'static str, source: impl Into<BoxError>) -> Self {
        SessionError::Transport { context, source: source.into() }
    }
}

// ---------------------------------------------------------------------------------------------
// The control stream
// ---------------------------------------------------------------------------------------------

/// The sending half of a control stream.
pub trait ControlSend: Send + 'static {
    /// Send one line (its newline included).
    fn send(&mut self, line: Vec<u8>) -> impl Future<Output = io::Result<()>> + Send;
}

/// The receiving half of a control stream.
pub trait ControlRecv: Send + 'static {
    /// The next bytes; `None` at the end of the stream or on an error.
    fn recv(&mut self) -> impl Future<Output = Option<Bytes>> + Send;
}

/// A control stream's receiving half, read as lines.
struct Lines<R> {
    recv: R,
    reader: ControlReader,
}

impl<R: ControlRecv> Lines<R> {
    fn new(recv: R) -> Self {
        Self { recv, reader: ControlReader::default() }
    }

    /// The next line, as a `T` if it is one; `None` at the end of the stream, on an error, or
    /// when a line is longer than the limit (the stream is then useless: the caller drops it).
    async fn next<T: DeserializeOwned>(&mut self) -> Option<Line<T>> {
        loop {
            if let Some(line) = self.reader.next_msg::<T>().ok()? {
                return Some(line);
            }
            let chunk = self.recv.recv().await?;
            self.reader.push(&chunk);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Seed side
// ---------------------------------------------------------------------------------------------

/// Why the seed's transport could not open a stream.
#[derive(Debug)]
pub enum OpenError {
    /// The dial failed: the agent's refusal, or the transport's failure.
    Dial(DialError),
    /// The agent is going away (a GOAWAY, or a refusal of a stream that crossed its going-away
    /// notice): the open fails as [`DialError::Draining`] and the session takes no new streams.
    GoingAway(String),
}

impl From<DialError> for OpenError {
    fn from(e: DialError) -> Self {
        OpenError::Dial(e)
    }
}

/// The seed's end of a transport, as [`run_seed`] uses it.
pub trait SeedTransport: Send + Sync + 'static {
    /// A stream the agent accepted.
    type Stream: Resettable + 'static;
    type ControlSend: ControlSend;
    type ControlRecv: ControlRecv;
    /// Open a stream to `target`, send its request and read the agent's answer: the stream, or
    /// why not.
    fn open(&self, target: &str) -> impl Future<Output = Result<Self::Stream, OpenError>> + Send;
    /// The connection is gone, by the transport's own account.
    fn is_closed(&self) -> bool {
        false
    }
    /// Signs of life the agent has given on this connection so far (a count of what arrived
    /// from it); only whether it changes matters.
    fn heard(&self) -> u64;
    /// Ask the agent for a sign of life now, where opening a stream elicits none by itself
    /// (HTTP/2: a PING; a QUIC peer acknowledges the stream's first packet anyway).
    fn probe(&self) {}
    /// Whether the path is quiet now, where the transport can tell.
    fn quiet(&self) -> Option<&super::Quiet> {
        None
    }
    /// When its latest answered PING was sent, where PINGs are in order with the streams (HTTP/2).
    fn echoes(&self) -> Option<&super::Echoes> {
        None
    }
    /// The seed stops the session: the connection closes, streams in flight are cut.
    fn stop(&self);
}

/// The seed's control stream: its sending and receiving halves.
pub type SeedControl<T> = (<T as SeedTransport>::ControlSend, <T as SeedTransport>::ControlRecv);

/// A transport's seed end, set up and ready for [`run_seed`].
pub struct SeedConn<T: SeedTransport> {
    pub transport: T,
    /// The control stream once it is open: opened by the session (HTTP/2), or already opened
    /// while setting up because it must be the first stream (QUIC).
    pub control: BoxFuture<'static, Result<SeedControl<T>, SessionError>>,
    /// Completes when the connection ends (`Ok`: in order); drives it where the transport
    /// needs that. Dropped, it ends the connection.
    pub ended: BoxFuture<'static, Result<(), SessionError>>,
}

/// Everything the seed learns when an agent session starts.
pub struct SeedSession<O: ?Sized> {
    pub opener: Arc<O>,
    /// What the agent said about itself on the control stream (may arrive after the start;
    /// it comes once), without its token.
    pub hello: Arc<OnceLock<AgentHello>>,
    /// The credentials the agent presented: `None` until its hello arrived, then the cluster it
    /// names and its latest token (renewed ones replace it).
    pub presented: watch::Receiver<Option<Presented>>,
}

/// What an agent presented on its control stream to prove who it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Presented {
    /// The cluster it names: a claim (empty: none).
    pub cluster: String,
    /// Its latest ServiceAccount token: the hello's, then each renewal's (empty: none, or none
    /// any more).
    pub token: Secret,
    /// Renewals received since the hello (the same token again, or an empty one, included).
    pub renewals: u64,
}

/// How a seed session ended: what its `on_ready` made of it (`None`: it never came up) and why
/// it ended (`Ok`: in order).
pub struct Ended<R> {
    pub ready: Option<R>,
    pub result: Result<(), SessionError>,
}

/// Control messages queued for one agent; a slow agent cannot make this grow without bound.
const CONTROL_QUEUE: usize = 16;

/// The seed side of a session, whatever its transport: the streams open on it, its end, the
/// agent's draining notice and the queue of control messages to the agent.
pub struct SessionOpener<T> {
    transport: T,
    active: Arc<AtomicUsize>,
    closed: CancellationToken,
    /// The agent announced its shutdown (GOAWAY, a going-away notice, or a stream refused as
    /// draining): streams it has keep going, new ones must go to another agent.
    draining: AtomicBool,
    control: mpsc::Sender<ControlMsg>,
}

impl<T: SeedTransport> SessionOpener<T> {
    fn set_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }
}

impl<T: SeedTransport> Opener for SessionOpener<T> {
    fn open(&self, target: &str, timeout: Duration) -> BoxFuture<'_, Result<TunnelStream, DialError>> {
        let target = target.to_owned();
        Box::pin(async move {
            if self.closed.is_cancelled() {
                return Err(DialError::Transport("session closed".into()));
            }
            if self.draining.load(Ordering::Relaxed) {
                return Err(DialError::Draining("the agent is shutting down".into()));
            }
            // What a target may be does not depend on the transport: what HTTP/2 cannot send as
            // its request's URI is refused here for QUIC too, before it reaches any agent.
            if let Err(e) = http::Uri::try_from(target.as_str()) {
                return Err(DialError::BadTarget(format!("{target}: {e}")));
            }
            let opened = tokio::time::timeout(timeout, self.transport.open(&target)).await.unwrap_or_else(|_| {
                Err(DialError::Timeout(format!("{target}: no answer from the agent within {timeout:?}")).into())
            });
            match opened {
                Ok(stream) => Ok(TunnelStream::counted(stream, Active::new(self.active.clone()))),
                Err(OpenError::Dial(e)) => Err(e),
                Err(OpenError::GoingAway(why)) => {
                    self.set_draining();
                    Err(DialError::Draining(why))
                }
            }
        })
    }

    fn control(&self, msg: &ControlMsg) -> Result<(), DialError> {
        self.control.try_send(msg.clone()).map_err(|e| DialError::Transport(format!("control queue: {e}")))
    }

    fn active_streams(&self) -> usize {
        self.active.load(Ordering::Relaxed)
    }

    fn is_closed(&self) -> bool {
        self.closed.is_cancelled() || self.draining.load(Ordering::Relaxed) || self.transport.is_closed()
    }

    fn heard(&self) -> Option<u64> {
        Some(self.transport.heard())
    }

    fn probe(&self) {
        self.transport.probe();
    }

    fn quiet(&self) -> Option<&super::Quiet> {
        self.transport.quiet()
    }

    fn echoes(&self) -> Option<&super::Echoes> {
        self.transport.echoes()
    }
}

/// Run the seed side of a session until it ends. Hands the opener to `on_ready` at once (what
/// it returns is handed back at the end); the control stream (the agent's hello, then the
/// queued control messages) runs beside it. `stop` ends the session early: the connection
/// closes, streams in flight are cut.
pub async fn run_seed<T: SeedTransport, R>(
    conn: SeedConn<T>,
    stop: CancellationToken,
    on_ready: impl FnOnce(SeedSession<SessionOpener<T>>) -> R + Send,
) -> Ended<R> {
    let SeedConn { transport, control, ended } = conn;
    let closed = CancellationToken::new();
    let (control_tx, control_rx) = mpsc::channel(CONTROL_QUEUE);
    let opener = Arc::new(SessionOpener {
        transport,
        active: Default::default(),
        closed: closed.clone(),
        draining: Default::default(),
        control: control_tx,
    });
    let hello = Arc::new(OnceLock::new());
    let (presented_tx, presented) = watch::channel(None);
    let ready = on_ready(SeedSession { opener: opener.clone(), hello: hello.clone(), presented });
    let control = tokio::spawn(seed_control(control, control_rx, hello, presented_tx, opener.clone()));
    let result = tokio::select! {
        r = ended => r,
        _ = stop.cancelled() => {
            opener.transport.stop();
            Err(SessionError::Stopped)
        }
    };
    closed.cancel();
    control.abort();
    Ended { ready: Some(ready), result }
}

/// Read the agent's hello (and later its notices); write the queued control messages.
async fn seed_control<T: SeedTransport>(
    control: BoxFuture<'static, Result<SeedControl<T>, SessionError>>,
    mut queue: mpsc::Receiver<ControlMsg>,
    hello: Arc<OnceLock<AgentHello>>,
    presented: watch::Sender<Option<Presented>>,
    opener: Arc<SessionOpener<T>>,
) {
    let (mut send, recv) = match control.await {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "no control stream to the agent");
            return;
        }
    };
    let reader = async move {
        let mut lines = Lines::new(recv);
        if let Some(Line::Msg(h)) = lines.next::<AgentHello>().await {
            // Kept within its limits. Until admitted the peer is anyone: what it says is logged
            // (escaped) at debug only; the binary logs it with the session once admitted.
            let mut h = h.bounded();
            tracing::debug!(
                node = %Untrusted::new(&h.node), host = %Untrusted::new(&h.host),
                addresses = h.addresses.len(), default_route = h.default_route,
                version = %Untrusted::new(&h.version), cluster = %Untrusted::new(&h.cluster),
                token = !h.token.is_empty(), "agent hello"
            );
            // The token goes to whoever checks it, not into the hello the session keeps. The hello
            // is set first: whoever sees the credentials arrive finds it there.
            let token = std::mem::take(&mut h.token);
            let cluster = h.cluster.clone();
            let _ = hello.set(h);
            presented.send_replace(Some(Presented { cluster, token, renewals: 0 }));
        }
        while let Some(line) = lines.next::<AgentMsg>().await {
            match line {
                Line::Msg(AgentMsg::GoingAway) => {
                    tracing::debug!("agent going away: no new streams on this session");
                    opener.set_draining();
                }
                Line::Msg(AgentMsg::Token { token }) => {
                    tracing::debug!(empty = token.is_empty(), "agent renewed its token");
                    // Every renewal counts, the same token again and an empty one included:
                    // the session's owner decides what each is worth.
                    presented.send_modify(|p| {
                        if let Some(p) = p {
                            p.token = token;
                            p.renewals += 1;
                        }
                    });
                }
                Line::Unknown(e) => {
                    tracing::debug!(error = %Untrusted::new(&e.to_string()), "unknown message from the agent ignored")
                }
            }
        }
    };
    let writer = async move {
        while let Some(msg) = queue.recv().await {
            let Ok(line) = encode_line(&msg) else { continue };
            if send.send(line).await.is_err() {
                return;
            }
        }
    };
    tokio::join!(reader, writer);
}

// ---------------------------------------------------------------------------------------------
// Agent side
// ---------------------------------------------------------------------------------------------

/// What the agent's transport accepted from the seed.
pub enum Accepted<T: AgentTransport + ?Sized> {
    /// The seed's control stream (over HTTP/2 it may come again: the new one replaces the old).
    Control(T::ControlSend, T::ControlRecv),
    /// A stream to dial.
    Stream(Incoming),
    /// A stream whose request is still to be read (QUIC's stream header): read in the stream's
    /// own task, it yields the dial to serve, if any.
    Pending(T::Pending),
}

/// How a transport tells the seed that the agent is going away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notice {
    /// The transport said it itself (HTTP/2 GOAWAY). The control stream ends now: it must not
    /// hold the session open.
    Sent,
    /// The notice goes on the control stream ([`AgentMsg::GoingAway`]), which stays open.
    OnControl,
}

/// The agent's end of a transport, as [`run_agent`] uses it.
pub trait AgentTransport: Send + 'static {
    type ControlSend: ControlSend;
    type ControlRecv: ControlRecv;
    type Pending: Future<Output = Option<Incoming>> + Send + 'static;
    /// The seed's next stream; `Ok(None)` once the session ended in order. The transport's
    /// own liveness checks (HTTP/2 PINGs) fail the session here too.
    fn accept(&mut self) -> impl Future<Output = Result<Option<Accepted<Self>>, SessionError>> + Send;
    /// The agent shuts down: the seed must open no new stream; streams in flight continue,
    /// and the session ends once the last one has.
    fn going_away(&mut self) -> Notice;
}

/// Run the agent side of a session until it ends. `control`: the control stream, if the
/// transport had to accept it while setting up (QUIC: it is the first stream). `stop` announces
/// the shutdown; streams in flight may finish.
pub async fn run_agent<T: AgentTransport>(
    mut transport: T,
    control: Option<(T::ControlSend, T::ControlRecv)>,
    handler: Arc<dyn AgentHandler>,
    stop: CancellationToken,
    tracker: TaskTracker,
) -> Result<(), SessionError> {
    handler.established();
    let mut ctl = AgentControl::default();
    if let Some((send, recv)) = control {
        ctl.start(send, recv, &handler);
    }
    let mut going_away = false;
    loop {
        let next = tokio::select! {
            r = transport.accept() => r?,
            _ = stop.cancelled(), if !going_away => {
                going_away = true;
                match transport.going_away() {
                    Notice::Sent => ctl.end(),
                    Notice::OnControl => ctl.notify(AgentMsg::GoingAway),
                }
                continue;
            }
        };
        match next {
            None => return Ok(()),
            // After the notice a control stream would only hold the session open.
            Some(Accepted::Control(send, recv)) if !going_away => ctl.start(send, recv, &handler),
            Some(Accepted::Control(..)) => {}
            Some(Accepted::Stream(inc)) => {
                tracker.spawn(handler.incoming(inc));
            }
            Some(Accepted::Pending(pending)) => {
                let handler = handler.clone();
                tracker.spawn(async move {
                    if let Some(inc) = pending.await {
                        handler.incoming(inc).await;
                    }
                });
            }
        }
    }
}

/// The agent's control stream, run in its own task: the hello, then the seed's messages to the
/// handler and the agent's notices to the seed.
#[derive(Default)]
struct AgentControl {
    task: Option<JoinHandle<()>>,
    notices: Option<mpsc::Sender<AgentMsg>>,
}

impl AgentControl {
    fn start<S: ControlSend, R: ControlRecv>(&mut self, send: S, recv: R, handler: &Arc<dyn AgentHandler>) {
        self.end();
        let (tx, rx) = mpsc::channel(1);
        self.task = Some(tokio::spawn(agent_control(send, recv, handler.clone(), rx)));
        self.notices = Some(tx);
    }

    fn notify(&self, msg: AgentMsg) {
        if let Some(n) = &self.notices {
            let _ = n.try_send(msg);
        }
    }

    fn end(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
        self.notices = None;
    }
}

impl Drop for AgentControl {
    fn drop(&mut self) {
        self.end();
    }
}

/// Ends when the seed's side of the stream does (or breaks the framing): the stream is then
/// dropped, which resets it.
async fn agent_control<S: ControlSend, R: ControlRecv>(
    mut send: S,
    recv: R,
    handler: Arc<dyn AgentHandler>,
    mut notices: mpsc::Receiver<AgentMsg>,
) {
    let hello = handler.hello();
    let mut renewals = handler.token_renewals();
    let sent = hello.token.clone();
    let Ok(hello) = encode_line(&hello) else { return };
    if send.send(hello).await.is_err() {
        return;
    }
    let reader = async {
        let mut lines = Lines::new(recv);
        while let Some(line) = lines.next::<ControlMsg>().await {
            match line {
                Line::Msg(msg) => handler.control(msg),
                Line::Unknown(e) => tracing::warn!(error = %e, "unknown control message ignored"),
            }
        }
    };
    let writer = async {
        // A token renewed since the hello read its file goes out at once; so does the news
        // that there is none any more (an empty renewal): the agent never leaves a session on
        // a token its file no longer holds.
        let mut last = sent;
        loop {
            let token = match &mut renewals {
                Some(r) => {
                    let now = r.borrow_and_update().clone();
                    if now != last {
                        last = now.clone();
                        Some(now)
                    } else {
                        None
                    }
                }
                None => None,
            };
            let msg = match token {
                Some(token) => AgentMsg::Token { token },
                None => {
                    let renewed = async {
                        let more = match &mut renewals {
                            Some(r) => r.changed().await.is_ok(),
                            None => false,
                        };
                        if !more {
                            // No renewals (or no more): only notices from now on.
                            std::future::pending::<()>().await;
                        }
                    };
                    tokio::select! {
                        n = notices.recv() => match n {
                            Some(n) => n,
                            None => break,
                        },
                        () = renewed => continue,
                    }
                }
            };
            let Ok(line) = encode_line(&msg) else { continue };
            if send.send(line).await.is_err() {
                break;
            }
        }
        // Keep the send side open: the seed reads until the connection closes.
        std::future::pending::<()>().await;
    };
    tokio::select! {
        () = reader => {}
        () = writer => {}
    }
}

// ---------------------------------------------------------------------------------------------
// Connections, as the binaries hold them
// ---------------------------------------------------------------------------------------------

/// A connection an agent dialled and the seed accepted (its TLS handshake done), of any
/// transport: what proxy-server's one `serve_agent` needs.
pub trait SeedConnection: Send + Sized + 'static {
    /// The transport's name in logs (`h2`, `quic`).
    fn transport(&self) -> &'static str;
    /// The application protocol the handshake agreed (ALPN).
    fn alpn(&self) -> Option<Vec<u8>>;
    /// The agent's certificate (its CN names its cluster).
    fn peer_certificate(&self) -> Option<rustls::pki_types::CertificateDer<'static>>;
    /// Close without a session (a refused identity or protocol); `why` goes to the agent where
    /// the transport can carry it.
    fn refuse(self, why: &'static str);
    type Transport: SeedTransport;
    /// Set the seed's end of the session up on this connection (the transport's handshake,
    /// its first stream).
    fn start(
        self,
        settings: &TunnelSettings,
    ) -> impl Future<Output = Result<SeedConn<Self::Transport>, SessionError>> + Send;
}

/// Run the seed side of a session on `conn`, whatever its transport, until it ends
/// ([`run_seed`]).
pub async fn run_seed_session<C: SeedConnection, R>(
    conn: C,
    settings: &TunnelSettings,
    stop: CancellationToken,
    on_ready: impl FnOnce(SeedSession<SessionOpener<C::Transport>>) -> R + Send,
) -> Ended<R> {
    match conn.start(settings).await {
        Ok(c) => run_seed(c, stop, on_ready).await,
        Err(e) => Ended { ready: None, result: Err(e) },
    }
}

/// What the agent runs a session with, whatever its transport.
pub struct AgentSession<'a> {
    pub settings: &'a TunnelSettings,
    pub handler: Arc<dyn AgentHandler>,
    /// Announces the shutdown: streams in flight may finish.
    pub stop: CancellationToken,
    /// Tracks the streams' tasks.
    pub tracker: TaskTracker,
}

/// A connection the agent dialled (its TLS handshake done), of any transport.
pub trait AgentConnection: Send + 'static {
    /// Run the agent side of the session until it ends ([`run_agent`]).
    fn run_agent(self: Box<Self>, session: AgentSession<'_>) -> BoxFuture<'_, Result<(), SessionError>>;
}

/// Run the agent side of a session on `conn`, whatever its transport, until it ends.
pub async fn run_agent_session(conn: Box<dyn AgentConnection>, session: AgentSession<'_>) -> Result<(), SessionError> {
    conn.run_agent(session).await
}
