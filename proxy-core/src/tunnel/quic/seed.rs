//! The seed's end of a QUIC session: the control stream opened first, then a stream per dial with its header and the agent's answer.

use super::liveness::watch_quiet;
use super::stream::{QuicSend, QuicStream, Turns, read_framed};
use crate::tunnel::session::{OpenError, SeedConn, SeedConnection, SeedTransport, SessionError};
use crate::tunnel::{DialError, Quiet, TunnelSettings};
use proxy_wire::tunnel::quic::{Answer, CLOSE_DONE, CLOSE_PROTOCOL, CLOSE_STOPPED, StreamHeader};
use quinn::{Connection, ConnectionError, RecvStream, VarInt};
use std::future::Future;
use std::sync::Arc;

/// The seed's end of a QUIC session: opens streams on the agent's connection.
pub struct QuicSeed {
    conn: Connection,
    quiet: Arc<Quiet>,
    turns: Arc<Turns>,
}

impl SeedTransport for QuicSeed {
    type Stream = QuicStream;
    type ControlSend = QuicSend;
    type ControlRecv = RecvStream;

    async fn open(&self, target: &str) -> Result<QuicStream, OpenError> {
        let header =
            StreamHeader::connect(target).encode().map_err(|e| DialError::BadTarget(format!("{target:.64}: {e}")))?;
        let (send, recv) = self.conn.open_bi().await.map_err(|e| DialError::Transport(e.to_string()))?;
        // Dropped unanswered (the dial gave up), the stream resets rather than ends.
        let mut stream = QuicStream::new(send, recv, self.turns.clone());
        stream.send.send_all(&header).await.map_err(|e| DialError::Transport(e.to_string()))?;
        let answer = read_framed(&mut stream.recv, Answer::read)
            .await
            .map_err(|e| DialError::Transport(format!("answer from the agent: {e}")))?;
        match answer.into_result() {
            Ok(()) => Ok(stream),
            // Only a stream that crossed the going-away notice is refused so.
            Err(DialError::Draining(why)) => Err(OpenError::GoingAway(why)),
            Err(e) => Err(e.into()),
        }
    }

    fn is_closed(&self) -> bool {
        self.conn.close_reason().is_some()
    }

    /// Datagrams received: a live agent acknowledges a stream's first packet within its ACK
    /// delay, and answers the keep-alive PINGs.
    fn heard(&self) -> u64 {
        self.conn.stats().udp_rx.datagrams
    }

    fn stop(&self) {
        self.conn.close(VarInt::from_u32(CLOSE_STOPPED), b"stopped");
    }

    fn quiet(&self) -> Option<&Quiet> {
        Some(&self.quiet)
    }
}

/// The seed's end of a session on an established QUIC connection. Opens the control stream
/// first: the agent takes the first stream as the control stream.
async fn seed_conn(conn: Connection, settings: TunnelSettings) -> Result<SeedConn<QuicSeed>, SessionError> {
    let (mut ctl_send, ctl_recv) = conn.open_bi().await.map_err(|e| SessionError::transport("QUIC connection", e))?;
    let header = StreamHeader::control().encode().map_err(|e| SessionError::Protocol(e.to_string()))?;
    ctl_send.write_all(&header).await.map_err(|e| SessionError::Protocol(format!("control stream: {e}")))?;
    let closed = conn.clone();
    let ended = async move {
        match closed.closed().await {
            ConnectionError::ApplicationClosed(c) if c.error_code == VarInt::from_u32(CLOSE_DONE) => Ok(()),
            ConnectionError::LocallyClosed => Ok(()),
            e => Err(SessionError::transport("QUIC connection", e)),
        }
    };
    let quiet = Arc::new(Quiet::default());
    let q = quiet.clone();
    let turns = Arc::new(Turns::default());
    let control = Box::pin(std::future::ready(Ok((QuicSend::new(ctl_send, turns.clone()), ctl_recv))));
    watch_quiet(conn.clone(), &settings, turns.clone(), move |silent| {
        q.set(silent);
    });
    Ok(SeedConn { transport: QuicSeed { conn, quiet, turns }, control, ended: Box::pin(ended) })
}

impl SeedConnection for Connection {
    type Transport = QuicSeed;

    fn transport(&self) -> &'static str {
        "quic"
    }

    fn alpn(&self) -> Option<Vec<u8>> {
        self.handshake_data()?.downcast::<quinn::crypto::rustls::HandshakeData>().ok()?.protocol
    }

    fn peer_certificate(&self) -> Option<rustls::pki_types::CertificateDer<'static>> {
        let certs = self.peer_identity()?.downcast::<Vec<rustls::pki_types::CertificateDer<'static>>>().ok()?;
        certs.first().cloned()
    }

    fn refuse(self, why: &'static str) {
        self.close(VarInt::from_u32(CLOSE_PROTOCOL), why.as_bytes());
    }

    fn start(self, settings: &TunnelSettings) -> impl Future<Output = Result<SeedConn<QuicSeed>, SessionError>> + Send {
        seed_conn(self, settings.clone())
    }
}
