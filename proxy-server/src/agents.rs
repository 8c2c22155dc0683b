//! The agents' listeners: mTLS (TLS 1.3) handshake, cluster identity from the certificate CN, one HTTP/2 (TCP) or QUIC (UDP) session per agent.

use crate::session::Session;
use crate::shared::Shared;
use proxy_core::tunnel::quic;
use proxy_core::tunnel::{
    ALPN_V1, AgentHello, ControlMsg, Opener, SeedConnection, SessionError, TunnelSettings, run_seed_session,
};
use seedgate_config::server::valid_cluster_name;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

/// How long a refused session stays open so the refusal reaches the agent.
const REFUSAL_LINGER: std::time::Duration = std::time::Duration::from_secs(1);

pub(crate) fn settings(cfg: &seedgate_config::ServerConfig) -> TunnelSettings {
    let (stream_window, stream_window_quic) =
        seedgate_config::stream_windows(cfg.agents.stream_window, cfg.agents.connection_window);
    TunnelSettings {
        stream_window,
        stream_window_quic,
        connection_window: cfg.agents.connection_window,
        keepalive_interval: cfg.agents.keepalive.interval.get(),
        keepalive_timeout: cfg.agents.keepalive.timeout.get(),
        ..TunnelSettings::default()
    }
}

/// The agents' TCP listener: the TLS handshake, then the session.
pub(crate) async fn accept_tls(
    shared: Arc<Shared>,
    acceptor: TlsAcceptor,
    tcp: TcpStream,
    peer: SocketAddr,
    stop: CancellationToken,
) {
    if let Some(tls) =
        handshake(&shared, peer, "TLS", acceptor.accept(proxy_core::relay::io::ReadAhead::new(tcp))).await
    {
        serve_agent(shared, tls, peer, stop).await;
    }
}

/// The agents' QUIC listener: the handshake (with the server config built for this
/// connection), then the session.
pub(crate) async fn accept_quic(
    shared: Arc<Shared>,
    incoming: quinn::Incoming,
    server_config: Arc<quinn::ServerConfig>,
    stop: CancellationToken,
) {
    let peer = incoming.remote_address();
    let connecting = match incoming.accept_with(server_config) {
        Ok(c) => c,
        Err(e) => {
            shared.metrics.agent_sessions.with_label_values(&["-", "tls_handshake_failed"]).inc();
            tracing::warn!(%peer, error = %e, "agent QUIC connection refused");
            return;
        }
    };
    if let Some(conn) = handshake(&shared, peer, "QUIC", connecting).await {
        serve_agent(shared, conn, peer, stop).await;
    }
}

/// An agent's `over` (TLS or QUIC) handshake, within the handshake timeout; `None` when it
/// failed or timed out (counted and logged).
async fn handshake<C, E>(
    shared: &Shared,
    peer: SocketAddr,
    over: &str,
    h: impl Future<Output = Result<C, E>>,
) -> Option<C>
where
    E: std::error::Error + 'static,
{
    let timeout = shared.config.load().timeouts.handshake.get();
    match tokio::time::timeout(timeout, h).await {
        Ok(Ok(c)) => Some(c),
        Ok(Err(e)) => {
            handshake_failed(shared, peer, over, Some(&e));
            None
        }
        Err(_) => {
            handshake_failed(shared, peer, over, None);
            None
        }
    }
}

/// Serve one agent connection of any transport for its whole life: the protocol and identity
/// checks, then the session, registered while it runs.
pub(crate) async fn serve_agent<C: SeedConnection>(
    shared: Arc<Shared>,
    conn: C,
    peer: SocketAddr,
    stop: CancellationToken,
) {
    let transport = conn.transport();
    let alpn = conn.alpn();
    if alpn.as_deref() != Some(ALPN_V1) {
        shared.metrics.agent_sessions.with_label_values(&["-", "bad_alpn"]).inc();
        tracing::warn!(%peer, transport, alpn = ?alpn.as_deref().map(String::from_utf8_lossy), "agent did not negotiate seedgate-tunnel/1");
        return conn.refuse("ALPN");
    }
    let Some(admit) = admit(&shared, peer, conn.peer_certificate().as_ref(), transport) else {
        return conn.refuse("refused");
    };
    let settings = settings(&shared.config.load());
    let session_stop = stop.child_token();
    let ended = run_seed_session(conn, &settings, session_stop.clone(), |s| {
        admit.register(&shared, s.opener, s.hello, &session_stop)
    })
    .await;
    admit.unregister(&shared, ended.ready.flatten(), ended.result);
}

/// An agent whose certificate names a cluster this seed may serve (not fenced).
struct Admitted {
    peer: SocketAddr,
    cluster: String,
    /// Not a cluster this seed knows, and unknown clusters are refused: the session only
    /// carries the refusal.
    refuse: bool,
    transport: &'static str,
}

/// The cluster from the certificate CN, fencing, the unknown-cluster rule.
fn admit(
    shared: &Shared,
    peer: SocketAddr,
    cert: Option<&rustls::pki_types::CertificateDer<'_>>,
    transport: &'static str,
) -> Option<Admitted> {
    let m = &shared.metrics;
    let cfg = shared.config.load_full();
    let cluster = cert.and_then(proxy_core::tls::common_name).filter(|cn| valid_cluster_name(cn));
    let Some(cluster) = cluster else {
        m.agent_sessions.with_label_values(&["-", "bad_identity"]).inc();
        tracing::warn!(%peer, "agent certificate has no usable CN (the cluster name)");
        return None;
    };
    if shared.directory.mode(&cluster).mode == seedgate_config::server::ClusterMode::Fenced {
        m.agent_sessions.with_label_values(&[&cluster, "cluster_fenced"]).inc();
        tracing::info!(%peer, %cluster, "agent refused: cluster is fenced on this seed");
        return None;
    }
    let refuse = !crate::control::knows_cluster(shared, &cluster, peer) && !cfg.agents.accept_unknown_clusters;
    Some(Admitted { peer, cluster, refuse, transport })
}

impl Admitted {
    /// Once the session runs: send the refusal (then close), or register the session and
    /// announce this replica to the agent. The session registered, if it was.
    fn register(
        &self,
        shared: &Shared,
        opener: Arc<dyn Opener>,
        hello: Arc<OnceLock<AgentHello>>,
        session_stop: &CancellationToken,
    ) -> Option<Arc<Session>> {
        let (m, peer, cluster) = (&shared.metrics, self.peer, &self.cluster);
        if self.refuse {
            // Bounded label: the name is not one the config knows; logs and /readyz carry it.
            m.agent_sessions.with_label_values(&["-", "unknown_cluster"]).inc();
            shared.unknown.lock().refused.insert(cluster.clone());
            let reason = format!(
                "cluster {cluster:?} (the certificate's CN) is not served by this proxy-server: no front end or \
                 clusters entry names it, and agents.accept_unknown_clusters is false"
            );
            tracing::warn!(%peer, %cluster, "agent refused: unknown cluster");
            let _ = opener.control(&ControlMsg::Refused { reason });
            // The notice goes out on the control stream once the agent opened it; then close.
            let stop = session_stop.clone();
            tokio::spawn(async move {
                tokio::time::sleep(REFUSAL_LINGER).await;
                stop.cancel();
            });
            return None;
        }
        match shared.directory.add(cluster, peer.to_string(), opener, hello, session_stop.clone()) {
            Ok(sess) => {
                m.agent_sessions.with_label_values(&[cluster, "accepted"]).inc();
                tracing::info!(%peer, %cluster, session = sess.id, transport = self.transport, "agent session up");
                shared.replica.announce_to(&shared.metrics, &sess);
                Some(sess)
            }
            Err(reason) => {
                m.agent_sessions.with_label_values(&[cluster, reason]).inc();
                session_stop.cancel();
                None
            }
        }
    }

    /// The session ended: remove it (`registered`, if it was) from the session directory.
    fn unregister(&self, shared: &Shared, registered: Option<Arc<Session>>, result: Result<(), SessionError>) {
        let (peer, cluster) = (self.peer, &self.cluster);
        if let Some(sess) = registered {
            shared.directory.remove(&sess);
            match &result {
                Ok(()) => tracing::info!(%peer, %cluster, session = sess.id, "agent session closed"),
                Err(e) => tracing::info!(%peer, %cluster, session = sess.id, error = %e, "agent session ended"),
            }
        }
    }
}

/// The quinn server config of one agent connection: the agents' current TLS material and the
/// current tunnel settings.
pub(crate) fn quic_server_config(
    tls: Arc<rustls::ServerConfig>,
    cfg: &seedgate_config::ServerConfig,
) -> Result<quinn::ServerConfig, quinn::crypto::rustls::NoInitialCipherSuite> {
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls)?;
    let mut sc = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    sc.transport_config(Arc::new(quic::seed_transport_config(&settings(cfg))));
    Ok(sc)
}

/// An agent's `over` (TLS or QUIC) handshake that did not complete: `e` when it failed, `None`
/// when it timed out. Counted by reason and logged with what to fix when a certificate was refused.
fn handshake_failed(shared: &Shared, peer: SocketAddr, over: &str, e: Option<&(dyn std::error::Error + 'static)>) {
    let sessions = &shared.metrics.agent_sessions;
    let Some(e) = e else {
        sessions.with_label_values(&["-", "handshake_timeout"]).inc();
        tracing::warn!(%peer, "agent {over} handshake timed out");
        return;
    };
    sessions.with_label_values(&["-", "tls_handshake_failed"]).inc();
    match proxy_core::tls::hint_for(e, &proxy_core::tls::AGENTS_LISTENER) {
        Some(hint) => tracing::warn!(%peer, error = %e, "agent {over} handshake failed: {hint}"),
        None => tracing::warn!(%peer, error = %e, "agent {over} handshake failed"),
    }
}
