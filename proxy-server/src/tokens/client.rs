//! The HTTP client of one cluster's kube-apiserver for TokenReviews: TLS from its CA (reloaded when the file changes), proxy-server's own credentials, bounded concurrency, a whole-request deadline, and a few kept-alive connections.

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use proxy_core::sync::Mutex;
use proxy_core::watch::tls::{Reloading, TlsMetrics};
use proxy_wire::token_review::{ANSWER_MAX, PATH};
use seedgate_config::HostPort;
use seedgate_config::server::TokenReview;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// Kept-alive connections per kube-apiserver: reviews come in bursts (a fleet reconnecting) and
/// a connection saves a TLS handshake each.
const IDLE_MAX: usize = 4;

/// Why no answer came from the kube-apiserver.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Unavailable {
    #[error("no review slot free within the timeout ({0} reviews in flight)")]
    Busy(usize),
    #[error("connect {0}: {1}")]
    Connect(HostPort, std::io::Error),
    #[error("TLS with {0}: {1}")]
    Tls(HostPort, std::io::Error),
    #[error("HTTP: {0}")]
    Http(#[from] hyper::Error),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("proxy-server's credentials: {0}")]
    Credentials(String),
    /// An answer that is no review: the kube-apiserver refused proxy-server itself (401, 403:
    /// its credentials or their RBAC), or failed (5xx).
    #[error("the kube-apiserver answered {status}: {body}")]
    Status { status: u16, body: String },
}

/// What a client was built from: rebuilt when it changes.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Endpoint {
    pub settings: TokenReview,
    pub max_in_flight: usize,
}

pub(crate) struct Client {
    pub(crate) endpoint: Endpoint,
    authority: HostPort,
    tls: Arc<Reloading<rustls::ClientConfig>>,
    slots: Semaphore,
    idle: Mutex<Vec<SendRequest<Full<Bytes>>>>,
}

impl Client {
    /// A client of the kube-apiserver `endpoint` names (its CA and credentials' files are read
    /// now: an error is the review's).
    pub(crate) fn new(use_: &str, endpoint: Endpoint, metrics: &TlsMetrics) -> Result<Self, String> {
        let s = &endpoint.settings;
        let (host, port) = s.authority().ok_or_else(|| format!("{}: not https://host[:port]", s.url))?;
        let identity = match (&s.cert, &s.key) {
            (Some(c), Some(k)) => Some((Path::new(c), Path::new(k))),
            _ => None,
        };
        let tls =
            proxy_core::watch::tls::client(use_, Path::new(&s.ca), None, identity, &[b"http/1.1"], false, metrics)
                .map_err(|e| e.to_string())?;
        let slots = Semaphore::new(endpoint.max_in_flight);
        Ok(Self { endpoint, authority: HostPort { host, port }, tls, slots, idle: Mutex::new(Vec::new()) })
    }

    /// Reviews holding one of the endpoint's slots now (being sent, or awaiting their answer).
    pub(crate) fn in_flight(&self) -> usize {
        self.endpoint.max_in_flight.saturating_sub(self.slots.available_permits())
    }

    /// `POST` a review `body` within `timeout` (waiting for a slot included): the status and
    /// the answer's body (at most [`ANSWER_MAX`] bytes).
    pub(crate) async fn post(&self, body: Vec<u8>, timeout: Duration) -> Result<(u16, Bytes), Unavailable> {
        let deadline = tokio::time::Instant::now() + timeout;
        let in_flight = self.endpoint.max_in_flight;
        let _slot = tokio::time::timeout_at(deadline, self.slots.acquire())
            .await
            .map_err(|_| Unavailable::Busy(in_flight))?
            .map_err(|_| Unavailable::Busy(in_flight))?;
        tokio::time::timeout_at(deadline, self.exchange(body, timeout))
            .await
            .map_err(|_| Unavailable::Timeout(timeout))?
    }

    async fn exchange(&self, body: Vec<u8>, timeout: Duration) -> Result<(u16, Bytes), Unavailable> {
        let bearer = match &self.endpoint.settings.token_file {
            None => None,
            Some(f) => {
                let t = std::fs::read_to_string(f).map_err(|e| Unavailable::Credentials(format!("{f}: {e}")))?;
                let t = t.trim().to_owned();
                if t.is_empty() {
                    return Err(Unavailable::Credentials(format!("{f}: the file is empty")));
                }
                Some(t)
            }
        };
        let mut send = self.connection(timeout).await?;
        let mut req = http::Request::post(PATH)
            .header(http::header::HOST, self.authority.to_string())
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::ACCEPT, "application/json");
        if let Some(t) = bearer {
            req = req.header(http::header::AUTHORIZATION, format!("Bearer {t}"));
        }
        let req = req.body(Full::new(Bytes::from(body))).map_err(|e| Unavailable::Credentials(e.to_string()))?;
        let resp = send.send_request(req).await?;
        let status = resp.status().as_u16();
        let body = Limited::new(resp.into_body(), ANSWER_MAX)
            .collect()
            .await
            .map_err(|e| Unavailable::Status { status, body: format!("answer unreadable: {e}") })?
            .to_bytes();
        // The answer was read whole: the connection may carry the next review.
        let mut idle = self.idle.lock();
        if idle.len() < IDLE_MAX && !send.is_closed() {
            idle.push(send);
        }
        drop(idle);
        if !(200..300).contains(&status) {
            let text: String = String::from_utf8_lossy(&body).chars().take(256).collect();
            return Err(Unavailable::Status { status, body: text });
        }
        Ok((status, body))
    }

    /// A kept-alive connection, or a new one.
    async fn connection(&self, timeout: Duration) -> Result<SendRequest<Full<Bytes>>, Unavailable> {
        loop {
            let kept = self.idle.lock().pop();
            let Some(mut s) = kept else { break };
            // Bounded by IDLE_MAX: each round takes one kept connection out.
            if !s.is_closed() && s.ready().await.is_ok() {
                return Ok(s);
            }
        }
        // A changed CA or client certificate counts from the next connection.
        let _ = self.tls.check();
        let (tcp, _) = proxy_core::net::connect_host(&self.authority, timeout)
            .await
            .map_err(|e| Unavailable::Connect(self.authority.clone(), e))?;
        let name = rustls::pki_types::ServerName::try_from(self.authority.host.clone())
            .map_err(|e| Unavailable::Tls(self.authority.clone(), std::io::Error::other(e)))?;
        let tls = tokio_rustls::TlsConnector::from(self.tls.current())
            .connect(name, tcp)
            .await
            .map_err(|e| Unavailable::Tls(self.authority.clone(), e))?;
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(send)
    }
}
