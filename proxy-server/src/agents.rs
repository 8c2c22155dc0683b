//! The agents' listener: mTLS (TLS 1.3) handshake, cluster identity from the certificate CN, one HTTP/2 session per agent.

use crate::Shared;
use proxy_core::tunnel::h2::run_seed_session;
use proxy_core::tunnel::{ALPN_V1, ControlMsg, Opener, TunnelSettings};
use seedgate_config::server::valid_cluster_name;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

/// How long a refused session stays open so the refusal reaches the agent.
const REFUSAL_LINGER: std::time::Duration = std::time::Duration::from_secs(1);

pub fn settings(cfg: &seedgate_config::ServerConfig) -> TunnelSettings {
    TunnelSettings {
        stream_window: cfg.agents.stream_window,
        connection_window: cfg.agents.connection_window,
        keepalive_interval: cfg.agents.keepalive.interval.get(),
        keepalive_timeout: cfg.agents.keepalive.timeout.get(),
        ..TunnelSettings::default()
    }
}

/// Serve one agent connection for its whole life.
pub async fn serve_agent(
    shared: Arc<Shared>,
    acceptor: TlsAcceptor,
    tcp: TcpStream,
    peer: SocketAddr,
    stop: CancellationToken,
) {
    let m = &shared.metrics;
    let cfg = shared.config.load_full();
    let tls = match tokio::time::timeout(cfg.timeouts.handshake.get(), acceptor.accept(tcp)).await {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => {
            m.agent_sessions.with_label_values(&["-", "tls_handshake_failed"]).inc();
            match proxy_core::tls::hint_for(&e, &proxy_core::tls::AGENTS_LISTENER) {
                Some(hint) => tracing::warn!(%peer, error = %e, "agent TLS handshake failed: {hint}"),
                None => tracing::warn!(%peer, error = %e, "agent TLS handshake failed"),
            }
            return;
        }
        Err(_) => {
            m.agent_sessions.with_label_values(&["-", "handshake_timeout"]).inc();
            tracing::warn!(%peer, "agent TLS handshake timed out");
            return;
        }
    };
    let (_, conn) = tls.get_ref();
    if conn.alpn_protocol() != Some(ALPN_V1) {
        m.agent_sessions.with_label_values(&["-", "bad_alpn"]).inc();
        tracing::warn!(%peer, alpn = ?conn.alpn_protocol().map(String::from_utf8_lossy), "agent did not negotiate seedgate-tunnel/1");
        return;
    }
    let cluster = conn
        .peer_certificates()
        .and_then(|c| c.first())
        .and_then(proxy_core::tls::common_name)
        .filter(|cn| valid_cluster_name(cn));
    let Some(cluster) = cluster else {
        m.agent_sessions.with_label_values(&["-", "bad_identity"]).inc();
        tracing::warn!(%peer, "agent certificate has no usable CN (the cluster name)");
        return;
    };
    if shared.registry.mode(&cluster).mode == seedgate_config::server::ClusterMode::Fenced {
        m.agent_sessions.with_label_values(&[&cluster, "cluster_fenced"]).inc();
        tracing::info!(%peer, %cluster, "agent refused: cluster is fenced on this seed");
        return;
    }
    let refuse = !shared.knows_cluster(&cluster, peer) && !cfg.agents.accept_unknown_clusters;
    let settings = settings(&cfg);
    let session_stop = stop.child_token();
    let registered = std::sync::Mutex::new(None);
    let result = run_seed_session(tls, &settings, session_stop.clone(), |s| {
        let opener: Arc<dyn Opener> = s.opener;
        if refuse {
            // Bounded label: the name is not one the config knows; logs and /readyz carry it.
            m.agent_sessions.with_label_values(&["-", "unknown_cluster"]).inc();
            shared.unknown_refused.lock().expect("not poisoned").insert(cluster.clone());
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
            return;
        }
        match shared.registry.add(&cluster, peer.to_string(), opener, s.hello, session_stop.clone()) {
            Ok(sess) => {
                m.agent_sessions.with_label_values(&[&cluster, "accepted"]).inc();
                tracing::info!(%peer, %cluster, session = sess.id, "agent session up");
                shared.replica.announce_to(&shared, &sess);
                *registered.lock().expect("not poisoned") = Some(sess);
            }
            Err(reason) => {
                m.agent_sessions.with_label_values(&[&cluster, reason]).inc();
                session_stop.cancel();
            }
        }
    })
    .await;
    let sess = registered.lock().expect("not poisoned").take();
    if let Some(sess) = sess {
        shared.registry.remove(&sess);
        match &result {
            Ok(()) => tracing::info!(%peer, %cluster, session = sess.id, "agent session closed"),
            Err(e) => tracing::info!(%peer, %cluster, session = sess.id, error = %e, "agent session ended"),
        }
    }
}
