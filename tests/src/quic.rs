//! QUIC peers for sni-router's UDP listeners: a quinn echo server, quinn clients, and a stand-in NAT that can rebind and reads the server's connection ID off the wire.

use anyhow::Context as _;
use rustls::crypto::CryptoProvider;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::UdpSocket;

use crate::pki::{Ca, Issued, provider};

/// The ALPN the echo server and the clients speak.
pub const ALPN: &[u8] = b"seedgate-echo";
/// One step (a handshake, an echo) must finish within this.
pub const STEP: Duration = Duration::from_secs(15);

/// A quinn server answering each bidirectional stream with `<name>:` and what it read.
pub struct QuicEcho {
    endpoint: quinn::Endpoint,
}

impl QuicEcho {
    pub fn start(name: &'static str, id: &Issued) -> anyhow::Result<Self> {
        let mut tls = rustls::ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_no_client_auth()
            .with_single_cert(id.chain(), id.key())?;
        tls.alpn_protocols = vec![ALPN.to_vec()];
        let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls)?;
        let endpoint =
            quinn::Endpoint::server(quinn::ServerConfig::with_crypto(Arc::new(crypto)), "127.0.0.1:0".parse()?)?;
        let ep = endpoint.clone();
        tokio::spawn(async move {
            while let Some(incoming) = ep.accept().await {
                tokio::spawn(async move {
                    let Ok(conn) = incoming.await else { return };
                    while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                        tokio::spawn(async move {
                            let Ok(data) = recv.read_to_end(64 * 1024).await else { return };
                            let _ = send.write_all(format!("{name}:").as_bytes()).await;
                            let _ = send.write_all(&data).await;
                            let _ = send.finish();
                        });
                    }
                });
            }
        });
        Ok(Self { endpoint })
    }

    pub fn addr(&self) -> anyhow::Result<SocketAddr> {
        Ok(self.endpoint.local_addr()?)
    }
}

/// A client TLS config trusting `ca`, with `provider`'s key exchange groups.
pub fn client_tls(ca: &Ca, provider: Arc<CryptoProvider>) -> anyhow::Result<rustls::ClientConfig> {
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(ca.roots())
        .with_no_client_auth();
    tls.alpn_protocols = vec![ALPN.to_vec()];
    Ok(tls)
}

/// A quinn client endpoint whose connections use `tls` and give up after `idle` of silence.
pub fn client(tls: rustls::ClientConfig, idle: Duration) -> anyhow::Result<quinn::Endpoint> {
    let mut cfg = quinn::ClientConfig::new(Arc::new(quinn::crypto::rustls::QuicClientConfig::try_from(tls)?));
    let mut transport = quinn::TransportConfig::default();
    transport.max_idle_timeout(Some(idle.try_into()?));
    cfg.transport_config(Arc::new(transport));
    let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse()?)?;
    ep.set_default_client_config(cfg);
    Ok(ep)
}

/// One bidirectional stream on `conn`: send `msg`, return the whole answer.
pub async fn echo(conn: &quinn::Connection, msg: &str) -> anyhow::Result<String> {
    let (mut send, mut recv) = conn.open_bi().await?;
    send.write_all(msg.as_bytes()).await?;
    send.finish()?;
    let answer = tokio::time::timeout(STEP, recv.read_to_end(64 * 1024)).await??;
    Ok(String::from_utf8(answer)?)
}

pub async fn connect(ep: &quinn::Endpoint, to: SocketAddr, name: &str) -> anyhow::Result<quinn::Connection> {
    Ok(tokio::time::timeout(STEP, ep.connect(to, name)?).await??)
}

/// A stand-in NAT between a QUIC client and the router: client datagrams leave from its outer
/// socket, answers come back to the client. `rebind` gives it a new outer socket on another
/// address, as a NAT that lost its mapping (or a node whose address changed) does; the client
/// cannot tell. It reads the connection ID the server gives itself off the wire (the source
/// connection ID of its first long-header packet), as an observer on the path can.
pub struct Nat {
    pub addr: SocketAddr,
    pub rebind: tokio::sync::mpsc::Sender<IpAddr>,
    server_cid: Arc<Mutex<Option<Vec<u8>>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Nat {
    pub async fn start(to: SocketAddr) -> anyhow::Result<Self> {
        let inner = UdpSocket::bind("127.0.0.1:0").await?;
        let addr = inner.local_addr()?;
        let (rebind, mut rx) = tokio::sync::mpsc::channel::<IpAddr>(1);
        let mut out = UdpSocket::bind("127.0.0.1:0").await?;
        out.connect(to).await?;
        let server_cid = Arc::new(Mutex::new(None));
        let seen = server_cid.clone();
        let task = tokio::spawn(async move {
            let (mut a, mut b) = (vec![0u8; 65_535], vec![0u8; 65_535]);
            let mut client = None;
            loop {
                tokio::select! {
                    r = inner.recv_from(&mut a) => {
                        let Ok((n, from)) = r else { return };
                        client = Some(from);
                        let _ = out.send(&a[..n]).await;
                    }
                    r = out.recv(&mut b) => {
                        let (Ok(n), Some(c)) = (r, client) else { continue };
                        seen.lock().expect("not poisoned").get_or_insert_with(|| {
                            proxy_wire::quic_cid::long_header_scid(&b[..n]).map(<[u8]>::to_vec).unwrap_or_default()
                        });
                        let _ = inner.send_to(&b[..n], c).await;
                    }
                    ip = rx.recv() => {
                        let Some(ip) = ip else { return };
                        let Ok(s) = UdpSocket::bind(SocketAddr::new(ip, 0)).await else { return };
                        if s.connect(to).await.is_err() {
                            return;
                        }
                        out = s;
                    }
                }
            }
        });
        Ok(Self { addr, rebind, server_cid, task })
    }

    /// The connection ID the server gave itself, once its first long-header packet went by.
    pub fn server_cid(&self) -> anyhow::Result<Vec<u8>> {
        let cid = self.server_cid.lock().expect("not poisoned").clone();
        cid.filter(|c| !c.is_empty()).context("no long-header packet from the server yet")
    }
}

impl Drop for Nat {
    fn drop(&mut self) {
        self.task.abort();
    }
}
