//! Establishing one tunnel session: TCP and TLS for h2, or QUIC (addresses tried in turn), each within the dial timeout, and why it failed, typed; and the settings the session runs with.

use super::Tunnel;
use proxy_core::tunnel::session::AgentConnection;
use proxy_core::tunnel::{ALPN_V1, TunnelSettings, h2, quic};
use seedgate_config::HostPort;
use seedgate_config::agent::Tunnel as TunnelCfg;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio_rustls::TlsConnector;

/// The agent's session settings: the keys both ends share, and the agent's own stream limit and
/// UDP receive offload.
pub(super) fn settings(cfg: &TunnelCfg) -> TunnelSettings {
    TunnelSettings {
        max_streams: cfg.max_streams as u32 + 16,
        receive_offload: cfg.quic_gro,
        ..TunnelSettings::new(&cfg.session(), cfg.quic_congestion_control)
    }
}

/// Why a tunnel session could not be established (the slot logs it and tries again).
#[derive(Debug, thiserror::Error)]
pub(super) enum EstablishError {
    #[error("connect {target}: {source}")]
    Connect { target: HostPort, source: std::io::Error },
    #[error("server_name {name:?}: {source}")]
    ServerName { name: String, source: rustls::pki_types::InvalidDnsNameError },
    #[error("TLS handshake with {addr} timed out")]
    TlsTimeout { addr: SocketAddr },
    #[error("TLS handshake with {addr}: {}", hinted(.source))]
    Tls { addr: SocketAddr, source: std::io::Error },
    #[error("{addr} does not speak seedgate-tunnel/1")]
    NotTunnel { addr: SocketAddr },
    #[error("tunnel TLS material unusable for QUIC: {0}")]
    QuicMaterial(#[source] quinn::crypto::rustls::NoInitialCipherSuite),
    #[error("resolve {target}: timed out")]
    ResolveTimeout { target: HostPort },
    #[error("resolve {target}: {source}")]
    Resolve { target: HostPort, source: std::io::Error },
    #[error("resolve {target}: no address")]
    NoAddress { target: HostPort },
    #[error("QUIC socket: {0}")]
    QuicSocket(#[source] std::io::Error),
    #[error("QUIC connect {addr}: {source}")]
    QuicConnect { addr: SocketAddr, source: quinn::ConnectError },
    #[error("QUIC handshake with {addr} timed out")]
    QuicTimeout { addr: SocketAddr },
    #[error("QUIC handshake with {addr}: {}", hinted(.source))]
    Quic { addr: SocketAddr, source: quinn::ConnectionError },
}

impl EstablishError {
    /// Nothing answered at all (no SYN-ACK, no QUIC packet in time): the path or the server is
    /// silent. Trying again costs the server nothing, so the slot probes at a short pace instead
    /// of backing off; anything else (a refusal, a handshake that failed or stalled half-way, a
    /// name that does not resolve) is backed off from.
    pub(super) fn silent(&self) -> bool {
        match self {
            EstablishError::Connect { source, .. } => source.kind() == std::io::ErrorKind::TimedOut,
            EstablishError::QuicTimeout { .. } => true,
            _ => false,
        }
    }
}

/// How many TCP connects one try starts, a fraction of its time apart. A SYN sent while the path
/// is silent is sent again by the kernel only after a second, as long as a short try (a rescue,
/// a probe of a silent server) lasts: without a fresh one a path that heals mid-try would stay
/// unused until the next try, up to a second and a half later.
const CONNECTS_PER_TRY: u32 = 3;

/// Connect to `target` within `timeout`, starting another connect every third of it while none
/// has succeeded: the first to succeed is kept, the others are dropped. A connect that fails
/// while no other is under way ends the try (a refusal is an answer).
async fn connect_staggered(
    target: &HostPort,
    timeout: Duration,
) -> std::io::Result<(tokio::net::TcpStream, SocketAddr)> {
    let deadline = tokio::time::Instant::now() + timeout;
    let step = timeout / CONNECTS_PER_TRY;
    let mut tries = tokio::task::JoinSet::new();
    let (mut started, mut next) = (0, tokio::time::Instant::now());
    loop {
        if started < CONNECTS_PER_TRY && tokio::time::Instant::now() >= next {
            let (t, left) = (target.clone(), deadline.saturating_duration_since(tokio::time::Instant::now()));
            tries.spawn(async move { proxy_core::net::connect_host(&t, left).await });
            (started, next) = (started + 1, next + step);
        }
        tokio::select! {
            r = tries.join_next() => match r {
                Some(Ok(Ok(c))) => return Ok(c),
                Some(Ok(Err(e))) if tries.is_empty() => return Err(e),
                Some(Err(e)) if tries.is_empty() => return Err(std::io::Error::other(e)),
                None => return Err(std::io::Error::other("no connect under way")),
                Some(_) => {}
            },
            () = tokio::time::sleep_until(next), if started < CONNECTS_PER_TRY => {}
        }
    }
}

/// Connect and handshake with `target` (resolved afresh), each step within `timeout`.
pub(super) async fn establish(
    t: &Tunnel,
    target: &HostPort,
    timeout: Duration,
) -> Result<(Box<dyn AgentConnection>, SocketAddr), EstablishError> {
    let cfg = t.cfg.load_full();
    let (tcp, addr) = connect_staggered(target, timeout)
        .await
        .map_err(|source| EstablishError::Connect { target: target.clone(), source })?;
    let probe_every = settings(&cfg).ping_every();
    proxy_core::net::tune_session_socket(&tcp, cfg.keepalive.timeout.get(), probe_every, cfg.tcp_notsent_lowat);
    let tcp = h2::SessionSocket::new(tcp, cfg.tcp_inflight_bound, Some(t.metrics.inflight.clone()));
    let name = cfg.tls.server_name.clone().unwrap_or_else(|| target.host.clone());
    let sni = rustls::pki_types::ServerName::try_from(name.clone())
        .map_err(|source| EstablishError::ServerName { name, source })?;
    let connector = TlsConnector::from(t.tls.load().material.current());
    let tls = tokio::time::timeout(timeout, connector.connect(sni, proxy_core::relay::io::ReadAhead::new(tcp)))
        .await
        .map_err(|_| EstablishError::TlsTimeout { addr })?
        .map_err(|source| EstablishError::Tls { addr, source })?;
    if tls.get_ref().1.alpn_protocol() != Some(ALPN_V1) {
        return Err(EstablishError::NotTunnel { addr });
    }
    Ok((Box::new(tls), addr))
}

/// Dial `target` over QUIC (UDP; resolved afresh, addresses tried in turn) and handshake. Each
/// session has its own client endpoint (its own UDP socket); quinn follows the agent when its
/// address changes (connection migration).
pub(super) async fn establish_quic(
    t: &Tunnel,
    target: &HostPort,
    timeout: Duration,
) -> Result<(Box<dyn AgentConnection>, SocketAddr), EstablishError> {
    let cfg = t.cfg.load_full();
    let name = cfg.tls.server_name.clone().unwrap_or_else(|| target.host.clone());
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(t.tls.load().material.current())
        .map_err(EstablishError::QuicMaterial)?;
    let mut client = quinn::ClientConfig::new(Arc::new(crypto));
    client.transport_config(Arc::new(quic::agent_transport_config(&settings(&cfg), Some(&t.metrics.quic_congestion))));
    let addrs: Vec<SocketAddr> = tokio::time::timeout(timeout, tokio::net::lookup_host(target.to_string()))
        .await
        .map_err(|_| EstablishError::ResolveTimeout { target: target.clone() })?
        .map_err(|source| EstablishError::Resolve { target: target.clone(), source })?
        .collect();
    let mut last = EstablishError::NoAddress { target: target.clone() };
    for addr in addrs {
        let local: SocketAddr = if addr.is_ipv4() {
            (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
        } else {
            (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
        };
        let endpoint = quic::endpoint(local, &settings(&cfg), None, "tunnel QUIC session", "tunnel.connection_window")
            .map_err(EstablishError::QuicSocket)?;
        let connecting = match endpoint.connect_with(client.clone(), addr, &name) {
            Ok(c) => c,
            Err(source) => {
                last = EstablishError::QuicConnect { addr, source };
                continue;
            }
        };
        match tokio::time::timeout(timeout, connecting).await {
            Ok(Ok(conn)) => {
                let alpn = conn
                    .handshake_data()
                    .and_then(|h| h.downcast::<quinn::crypto::rustls::HandshakeData>().ok())
                    .and_then(|h| h.protocol);
                if alpn.as_deref() != Some(ALPN_V1) {
                    return Err(EstablishError::NotTunnel { addr });
                }
                return Ok((Box::new(conn), addr));
            }
            Ok(Err(source)) => last = EstablishError::Quic { addr, source },
            Err(_) => last = EstablishError::QuicTimeout { addr },
        }
    }
    Err(last)
}

/// A session's error, with the hint for a certificate the server refused.
pub(super) fn hinted(e: &(dyn std::error::Error + 'static)) -> String {
    match proxy_core::tls::hint_for(e, &proxy_core::tls::AGENT_TUNNEL) {
        Some(hint) => format!("{e}: {hint}"),
        None => e.to_string(),
    }
}
