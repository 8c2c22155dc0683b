//! TLS client requests that report what the client saw: the server's certificate, ALPN, the
//! response, or the TLS alert / error that ended the attempt.

use crate::pki;
use anyhow::Context as _;
use rustls::{AlertDescription, ClientConfig};
use rustls_pki_types::ServerName;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// Connect + handshake, and separately the request/response, must each finish within this.
const STEP_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_RESPONSE: u64 = 16 << 20;

/// What a TLS client saw.
#[derive(Debug, Clone)]
pub struct TlsResult {
    /// Subject CN of the certificate the server presented.
    pub peer_cn: Option<String>,
    /// Its DNS and IP subject-alternative names.
    pub peer_sans: Vec<String>,
    pub alpn: Option<String>,
    /// Everything the server sent after the handshake, until it closed.
    pub response: Vec<u8>,
}

impl TlsResult {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.response).into_owned()
    }

    /// The HTTP status, if the response is HTTP.
    pub fn status(&self) -> Option<u16> {
        crate::admin::parse_response(&self.response).ok().map(|(s, _)| s)
    }

    /// The HTTP body (the whole response when it is not HTTP).
    pub fn body(&self) -> String {
        match crate::admin::parse_response(&self.response) {
            Ok((_, b)) => String::from_utf8_lossy(&b).into_owned(),
            Err(_) => self.text(),
        }
    }
}

/// How a TLS attempt failed, as the client saw it.
#[derive(Debug, Clone, PartialEq)]
pub enum TlsFailure {
    /// The peer sent this alert (e.g. `UnrecognisedName` from the router for an unknown SNI,
    /// `CertificateRequired` from a backend that wants a client certificate).
    Alert(AlertDescription),
    /// Any other rustls or I/O error, or a timeout, as text.
    Other(String),
}

impl TlsFailure {
    /// Classify an error from [`tls_request`] / [`tls_connect`].
    pub fn of(e: &anyhow::Error) -> Self {
        for cause in e.chain() {
            let tls = cause.downcast_ref::<rustls::Error>().or_else(|| {
                cause
                    .downcast_ref::<std::io::Error>()
                    .and_then(|io| io.get_ref())
                    .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            });
            if let Some(rustls::Error::AlertReceived(a)) = tls {
                return Self::Alert(*a);
            }
        }
        Self::Other(format!("{e:#}"))
    }

    pub fn is_alert(&self, a: AlertDescription) -> bool {
        *self == Self::Alert(a)
    }
}

impl fmt::Display for TlsFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // rustls spells them `UnrecognisedName`; print the RFC name `unrecognized_name`.
            Self::Alert(a) => write!(f, "alert {}", rfc_alert_name(*a)),
            Self::Other(s) => f.write_str(s),
        }
    }
}

fn rfc_alert_name(a: AlertDescription) -> String {
    let camel = format!("{a:?}");
    let mut out = String::with_capacity(camel.len() + 4);
    for (i, c) in camel.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_lowercase());
    }
    // RFC 8446 spells it with a z.
    out.replace("unrecognised", "unrecognized")
}

/// Connect and complete a TLS handshake. With `sni: None` no SNI is sent and the server
/// certificate is verified against the IP of `addr` (issue it with that IP as a SAN).
pub async fn tls_connect(
    addr: SocketAddr,
    sni: Option<&str>,
    cfg: Arc<ClientConfig>,
) -> anyhow::Result<TlsStream<TcpStream>> {
    let (name, cfg) = match sni {
        Some(s) => (ServerName::try_from(s.to_owned()).with_context(|| format!("bad SNI {s:?}"))?, cfg),
        None => {
            let mut c = (*cfg).clone();
            c.enable_sni = false;
            (ServerName::IpAddress(addr.ip().into()), Arc::new(c))
        }
    };
    let connector = tokio_rustls::TlsConnector::from(cfg);
    tokio::time::timeout(STEP_TIMEOUT, async {
        let tcp = TcpStream::connect(addr).await.with_context(|| format!("connecting {addr}"))?;
        let tls = connector.connect(name, tcp).await.context("TLS handshake")?;
        anyhow::Ok(tls)
    })
    .await
    .with_context(|| format!("TLS handshake with {addr} timed out"))?
}

/// The peer certificate's CN and SANs, and the negotiated ALPN, of a connected stream.
pub fn peer_info(tls: &TlsStream<TcpStream>) -> (Option<String>, Vec<String>, Option<String>) {
    let conn = tls.get_ref().1;
    let (cn, sans) = conn.peer_certificates().and_then(|c| c.first()).map(|c| pki::cert_names(c)).unwrap_or_default();
    let alpn = conn.alpn_protocol().map(|a| String::from_utf8_lossy(a).into_owned());
    (cn, sans, alpn)
}

/// Handshake, send `request`, read until the server closes. A server that closes without
/// close_notify after sending something still yields its response.
pub async fn tls_request(
    addr: SocketAddr,
    sni: Option<&str>,
    cfg: Arc<ClientConfig>,
    request: &[u8],
) -> anyhow::Result<TlsResult> {
    let mut tls = tls_connect(addr, sni, cfg).await?;
    let (peer_cn, peer_sans, alpn) = peer_info(&tls);
    let mut response = Vec::new();
    let read = tokio::time::timeout(STEP_TIMEOUT, async {
        tls.write_all(request).await?;
        tls.flush().await?;
        (&mut tls).take(MAX_RESPONSE).read_to_end(&mut response).await
    })
    .await
    .with_context(|| format!("no complete response from {addr} within {STEP_TIMEOUT:?}"))?;
    if let Err(e) = read
        && (response.is_empty() || e.kind() != std::io::ErrorKind::UnexpectedEof)
    {
        return Err(anyhow::Error::new(e).context(format!("TLS request to {addr}")));
    }
    Ok(TlsResult { peer_cn, peer_sans, alpn, response })
}

/// A minimal HTTP/1.1 GET for [`tls_request`].
pub fn http_get_request(host: &str, path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").into_bytes()
}

/// Try a handshake only: `None` if it completed, else how it failed (for an unknown SNI the
/// router is expected to answer with `Alert(UnrecognisedName)`).
pub async fn tls_handshake_error(addr: SocketAddr, sni: Option<&str>, cfg: Arc<ClientConfig>) -> Option<TlsFailure> {
    match tls_connect(addr, sni, cfg).await {
        Ok(_) => None,
        Err(e) => Some(TlsFailure::of(&e)),
    }
}
