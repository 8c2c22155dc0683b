//! The seed's end of an HTTP/2 session: the h2 client on the agent's TLS connection, a `CONNECT` per stream, the control stream as a `POST`.

use super::errors::{dial_error_from_response, failed, open_error};
use super::keepalive::keepalive;
use super::stream::H2Stream;
use super::tuning::Tuning;
use crate::tunnel::session::{OpenError, SeedConn, SeedConnection, SeedTransport, SessionError};
use crate::tunnel::{CONTROL_PATH, DialError, Echoes, Quiet, TunnelSettings};
use bytes::Bytes;
use h2::client;
use http::{Method, Request, Response, StatusCode};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::Notify;
use tokio_util::io::InspectReader;

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
