//! The HTTP client of one cluster's kube-apiserver for TokenReviews: TLS from its CA (reloaded when the file changes), proxy-server's own credentials, concurrency bounded apart for new sessions and live ones, a whole-request deadline, and a few kept-alive connections.

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use proxy_core::sync::Mutex;
use proxy_core::tls::Handshake;
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

/// The TLS handshake with a cluster's kube-apiserver, as a refused certificate's hint names it
/// (`<name>` stands for the cluster).
const REVIEWER: Handshake = Handshake {
    server: false,
    peer: "the kube-apiserver",
    peer_cert: "the kube-apiserver's serving certificate (verified with clusters.<name>.token_review.ca)",
    peer_ca: "clusters.<name>.token_review.ca",
    peer_crl: "(no revocation list is checked for TokenReviews)",
    peer_name: "the host of clusters.<name>.token_review.url",
    own_cert: "proxy-server's clusters.<name>.token_review.cert",
    own_ca: "the kube-apiserver's client CA (its --client-ca-file)",
    own_name: "",
};

/// Whose reviews a slot is for: new sessions' and live sessions' have places of their own, so a
/// flood of the one never holds up the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lane {
    New,
    Live,
}

/// Why no review came from the kube-apiserver. Details for proxy-server's log: the agent is
/// told only the reason's label.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Unavailable {
    #[error("no review slot free within the timeout ({0} reviews in flight)")]
    Busy(usize),
    #[error("connect {0}: {1}")]
    Connect(HostPort, std::io::Error),
    /// The TLS handshake failed: what to fix when a certificate was refused (naming the key),
    /// else the error.
    #[error("TLS with {at}: {what}")]
    Tls { at: HostPort, what: String },
    #[error("HTTP: {0}")]
    Http(#[from] hyper::Error),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("proxy-server's credentials: {0}")]
    Credentials(String),
    /// The client could not be set up (its CA or credentials' files).
    #[error("{0}")]
    Setup(String),
    /// An answer that is no review and says nothing of the token: the kube-apiserver refused
    /// proxy-server itself (401, 403: its credentials or their RBAC), has no TokenReview API
    /// there (404, 405), is overloaded (408, 429) or failed (5xx).
    #[error("the kube-apiserver answered {status} ({why}): {message}")]
    Status { status: u16, why: String, message: String },
    /// No answer within `agents.token_review.grace` past the token's `exp` (a live session).
    #[error("no review answered within agents.token_review.grace ({0:?}) past the token's exp")]
    PastGrace(Duration),
}

/// What a client was built from: rebuilt when it changes.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Endpoint {
    pub settings: TokenReview,
    pub max_in_flight: usize,
}

pub(crate) struct Client {
    pub(crate) endpoint: Endpoint,
    cluster: String,
    authority: HostPort,
    tls: Arc<Reloading<rustls::ClientConfig>>,
    /// Slots of new sessions' reviews ([`Lane::New`]) and of live sessions' ([`Lane::Live`]).
    new_slots: Semaphore,
    live_slots: Semaphore,
    idle: Mutex<Vec<SendRequest<Full<Bytes>>>>,
}

impl Client {
    /// A client of `cluster`'s kube-apiserver, as `endpoint` names it (its CA and credentials'
    /// files are read now: an error is the review's).
    pub(crate) fn new(cluster: &str, endpoint: Endpoint, metrics: &TlsMetrics) -> Result<Self, String> {
        let use_ = format!("token-review {cluster}");
        let s = &endpoint.settings;
        let (host, port) = s.authority().ok_or_else(|| format!("{}: not https://host[:port]", s.url))?;
        let identity = match (&s.cert, &s.key) {
            (Some(c), Some(k)) => Some((Path::new(c), Path::new(k))),
            _ => None,
        };
        let tls =
            proxy_core::watch::tls::client(&use_, Path::new(&s.ca), None, identity, &[b"http/1.1"], false, metrics)
                .map_err(|e| e.to_string())?;
        let (new_slots, live_slots) = (Semaphore::new(endpoint.max_in_flight), Semaphore::new(endpoint.max_in_flight));
        Ok(Self {
            endpoint,
            cluster: cluster.to_owned(),
            authority: HostPort { host, port },
            tls,
            new_slots,
            live_slots,
            idle: Mutex::new(Vec::new()),
        })
    }

    /// Reviews holding one of the endpoint's slots now, of both lanes (being sent, or awaiting
    /// their answer).
    pub(crate) fn in_flight(&self) -> usize {
        let max = self.endpoint.max_in_flight;
        max.saturating_sub(self.new_slots.available_permits()) + max.saturating_sub(self.live_slots.available_permits())
    }

    /// `POST` a review `body` within `timeout` (waiting for a slot of `lane` included): the
    /// status and the answer's body (at most [`ANSWER_MAX`] bytes), whatever the status.
    pub(crate) async fn post(&self, lane: Lane, body: Vec<u8>, timeout: Duration) -> Result<(u16, Bytes), Unavailable> {
        let deadline = tokio::time::Instant::now() + timeout;
        let in_flight = self.endpoint.max_in_flight;
        let slots = match lane {
            Lane::New => &self.new_slots,
            Lane::Live => &self.live_slots,
        };
        let _slot = tokio::time::timeout_at(deadline, slots.acquire())
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
            .map_err(|e| Unavailable::Status { status, why: "answer unreadable".to_owned(), message: e.to_string() })?
            .to_bytes();
        // The answer was read whole: the connection may carry the next review.
        let mut idle = self.idle.lock();
        if idle.len() < IDLE_MAX && !send.is_closed() {
            idle.push(send);
        }
        drop(idle);
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
            .map_err(|e| Unavailable::Tls { at: self.authority.clone(), what: e.to_string() })?;
        let tls = tokio_rustls::TlsConnector::from(self.tls.current()).connect(name, tcp).await.map_err(|e| {
            let what = match proxy_core::tls::hint_for(&e, &REVIEWER) {
                Some(hint) => hint.replace("<name>", &self.cluster),
                None => e.to_string(),
            };
            Unavailable::Tls { at: self.authority.clone(), what }
        })?;
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(send)
    }
}
