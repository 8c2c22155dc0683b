//! An agent written by hand over QUIC: the control stream's lines sent as given (a hello with any fields, renewals of any token, anything), and what proxy-server writes back, for tests of what a hostile or broken agent can make proxy-server do.
//!
//! It speaks only what a session needs to start: it takes the first stream the seed opens as
//! the control stream (its header read off), and answers nothing else. Its source address is
//! the loopback address it is told, so tests can play several sources on one host.

use crate::pki::{self, Ca, Issued};
use anyhow::Context as _;
use proxy_core::sync::Mutex;
use proxy_wire::tunnel::quic::{KIND_CONTROL, Progress, StreamHeader};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

/// The name on the agents' listener certificate (as [`crate::tunnel_kit::SERVER_NAME`]).
const SERVER_NAME: &str = crate::tunnel_kit::SERVER_NAME;
/// Connecting and the control stream's arrival must each be done within this.
const STEP: Duration = Duration::from_secs(15);
/// The most read from the control stream (the seed's messages are short).
const RECEIVED_MAX: usize = 1 << 20;

/// A QUIC session to proxy-server's agents listener, its control stream open.
pub struct RawAgent {
    conn: quinn::Connection,
    send: quinn::SendStream,
    received: Arc<Mutex<Vec<u8>>>,
    reader: JoinHandle<()>,
    _endpoint: quinn::Endpoint,
}

impl std::fmt::Debug for RawAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawAgent").field("remote", &self.conn.remote_address()).finish_non_exhaustive()
    }
}

impl Drop for RawAgent {
    fn drop(&mut self) {
        self.reader.abort();
        self.conn.close(0u32.into(), b"raw agent dropped");
    }
}

impl RawAgent {
    /// Connect from `from` (port chosen by the system) to the agents' QUIC listener `to` with
    /// `tls` (see [`tls`]); return once the seed opened the control stream.
    pub async fn connect(to: SocketAddr, from: IpAddr, tls: Arc<rustls::ClientConfig>) -> anyhow::Result<Self> {
        let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls)?;
        let mut endpoint = quinn::Endpoint::client(SocketAddr::new(from, 0))?;
        endpoint.set_default_client_config(quinn::ClientConfig::new(Arc::new(crypto)));
        let conn = tokio::time::timeout(STEP, endpoint.connect(to, SERVER_NAME)?).await.context("QUIC handshake")??;
        let (send, mut recv) = tokio::time::timeout(STEP, conn.accept_bi()).await.context("no control stream")??;
        let received = Arc::new(Mutex::new(Vec::new()));
        let into = received.clone();
        let reader = tokio::spawn(async move {
            let mut buf = vec![0u8; 16 * 1024];
            while let Ok(Some(n)) = recv.read(&mut buf).await {
                let mut r = into.lock();
                if r.len() + n > RECEIVED_MAX {
                    return;
                }
                r.extend_from_slice(buf.get(..n).unwrap_or_default());
            }
        });
        Ok(Self { conn, send, received, reader, _endpoint: endpoint })
    }

    /// Write `line` and its newline on the control stream.
    pub async fn send_line(&mut self, line: &str) -> anyhow::Result<()> {
        self.send.write_all(format!("{line}\n").as_bytes()).await.context("control stream")?;
        Ok(())
    }

    /// What the seed wrote on the control stream so far, after the stream's header (its lines).
    pub fn received(&self) -> anyhow::Result<String> {
        let r = self.received.lock();
        match StreamHeader::read(&r)? {
            Progress::More(_) => Ok(String::new()),
            Progress::Done(h, used) => {
                anyhow::ensure!(h.kind == KIND_CONTROL, "the first stream is of kind {}", h.kind);
                Ok(String::from_utf8_lossy(r.get(used..).unwrap_or_default()).into_owned())
            }
        }
    }

    /// Wait until the seed wrote a line holding `needle` (within `deadline`), and return it.
    pub async fn wait_line(&self, needle: &str, deadline: Duration) -> anyhow::Result<String> {
        crate::poll_until(deadline, Duration::from_millis(20), || async {
            let text = self.received()?;
            match text.lines().find(|l| l.contains(needle)) {
                Some(l) => Ok(l.to_owned()),
                None => anyhow::bail!("no line with {needle:?} yet; received: {text:?}"),
            }
        })
        .await
    }

    /// The seed registered the session: it announced itself (its first `server` message).
    pub async fn wait_admitted(&self, deadline: Duration) -> anyhow::Result<()> {
        self.wait_line("\"type\":\"server\"", deadline).await.map(|_| ())
    }

    /// Whether the connection has closed (the seed closed it, or it timed out).
    pub fn is_closed(&self) -> bool {
        self.conn.close_reason().is_some()
    }

    /// Wait until the connection closed (within `deadline`).
    pub async fn wait_closed(&self, deadline: Duration) -> anyhow::Result<()> {
        tokio::time::timeout(deadline, self.conn.closed()).await.context("the connection is still open")?;
        Ok(())
    }
}

/// The TLS of an agent trusting `ca` for the listener's certificate, with `client` as its
/// client certificate if given.
pub fn tls(ca: &Ca, client: Option<&Issued>) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    pki::client_config(ca, client, &[std::str::from_utf8(proxy_core::tunnel::ALPN_V1)?])
}

/// An agent's hello: `node`, `cluster` and `token` as given (any bytes), version `raw`.
pub fn hello(node: &str, cluster: &str, token: &str) -> String {
    serde_json::json!({"node": node, "version": "raw", "cluster": cluster, "token": token}).to_string()
}

/// A token renewal carrying `token`.
pub fn renewal(token: &str) -> String {
    serde_json::json!({"type": "token", "token": token}).to_string()
}
