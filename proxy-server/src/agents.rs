//! The agents' listeners: the TLS 1.3 handshake, the agent's identity (its certificate's CN, or a ServiceAccount token reviewed at the cluster it names), one HTTP/2 (TCP) or QUIC (UDP) session per agent.

use crate::identity::{Refused, Shown};
use crate::shared::Shared;
use crate::tokens::ClusterReview;
use proxy_core::relay::io::ReadAhead;
use proxy_core::tunnel::congestion::CongestionStats;
use proxy_core::tunnel::quic;
use proxy_core::tunnel::session_socket::SessionSocket;
use proxy_core::tunnel::{ALPN_V1, Opener, Presented, SeedConnection, TunnelSettings, run_seed_session};
use seedgate_config::server::{AgentAuth, ClusterMode, valid_cluster_name};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

pub(crate) fn settings(cfg: &seedgate_config::ServerConfig) -> TunnelSettings {
    let (stream_window, stream_window_quic) =
        seedgate_config::stream_windows(cfg.agents.stream_window, cfg.agents.connection_window);
    TunnelSettings {
        stream_window,
        stream_window_quic,
        connection_window: cfg.agents.connection_window,
        max_stream_window: cfg.agents.max_stream_window,
        h2_adaptive_window: cfg.agents.h2_adaptive_window,
        keepalive_interval: cfg.agents.keepalive.interval.get(),
        keepalive_suspect: cfg.agents.keepalive.suspect(),
        keepalive_timeout: cfg.agents.keepalive.timeout.get(),
        congestion: cfg.agents.quic.as_ref().map(|q| q.congestion_control).unwrap_or_default(),
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
    let cfg = shared.config.load();
    let agents = &cfg.agents;
    let probe_every = settings(&cfg).ping_every();
    proxy_core::net::tune_session_socket(&tcp, agents.keepalive.timeout.get(), probe_every, agents.tcp_notsent_lowat);
    let tcp = SessionSocket::new(tcp, agents.tcp_inflight_bound, Some(shared.metrics.inflight.clone()));
    if let Some(tls) = handshake(&shared, peer, "TLS", acceptor.accept(ReadAhead::new(tcp))).await {
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
/// checks, then the session, registered while it runs (and, for a token agent, its token
/// reviewed again whenever it expires or is renewed).
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
    let cert = conn.peer_certificate();
    let cert_cluster = match &cert {
        None => None,
        Some(c) => match proxy_core::tls::common_name(c).filter(|cn| valid_cluster_name(cn)) {
            Some(cn) => Some(cn),
            None => {
                refused(&shared, peer, "-", &Refused::BadIdentity);
                return conn.refuse("refused");
            }
        },
    };
    if let Some(c) = &cert_cluster
        && shared.directory.mode(c).mode == ClusterMode::Fenced
    {
        refused(&shared, peer, c, &Refused::Fenced(c.clone()));
        return conn.refuse("refused");
    }
    let settings = settings(&shared.config.load());
    let session_stop = stop.child_token();
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let session = run_seed_session(conn, &settings, session_stop.clone(), |s| {
        let opener: Arc<dyn Opener> = s.opener;
        let _ = started_tx.send(Started { opener, hello: s.hello, presented: s.presented });
    });
    let mut session = std::pin::pin!(session);
    let who = Who { peer, transport, cert, cert_cluster };
    let admitted = tokio::select! {
        r = &mut session => {
            if let Err(e) = r.result {
                tracing::info!(%peer, transport, error = %e, "agent session ended before it was admitted");
            }
            return;
        }
        a = admit(&shared, &who, started, &session_stop) => a,
    };
    let Some((sess, token)) = admitted else {
        // Refused after the session began (the notice lingers, then the session closes).
        let _ = session.await;
        return;
    };
    let ended = match token {
        None => session.await,
        Some(t) => tokio::select! {
            r = &mut session => r,
            () = crate::rereview::keep(&shared, &sess, t, &session_stop) => session.await,
        },
    };
    let result = ended.result;
    shared.directory.remove(&sess);
    let cluster = &sess.cluster;
    match &result {
        Ok(()) => tracing::info!(%peer, %cluster, session = sess.id, "agent session closed"),
        Err(e) => tracing::info!(%peer, %cluster, session = sess.id, error = %e, "agent session ended"),
    }
}

/// What the session hands over once it runs.
struct Started {
    opener: Arc<dyn Opener>,
    hello: Arc<OnceLock<proxy_core::tunnel::AgentHello>>,
    presented: tokio::sync::watch::Receiver<Option<Presented>>,
}

/// The agent as the handshake showed it.
struct Who {
    peer: SocketAddr,
    transport: &'static str,
    cert: Option<rustls::pki_types::CertificateDer<'static>>,
    /// The certificate's CN (a valid cluster name).
    cert_cluster: Option<String>,
}

/// How an agent's sessions are checked, per cluster: its mode and the clusters with reviews.
struct Rules {
    states: std::collections::BTreeMap<String, seedgate_config::server::ClusterState>,
    default: AgentAuth,
}

impl Rules {
    fn now(shared: &Shared) -> Self {
        Self { states: shared.effective_states(), default: shared.config.load().agents.auth }
    }

    fn auth(&self, cluster: &str) -> AgentAuth {
        self.states.get(cluster).and_then(|s| s.agent_auth).unwrap_or(self.default)
    }

    fn token_clusters(&self) -> Vec<String> {
        self.states.iter().filter(|(_, s)| s.token_review.is_some()).map(|(c, _)| c.clone()).collect()
    }

    fn review(&self, shared: &Shared, cluster: &str) -> Option<ClusterReview> {
        let r = self.states.get(cluster)?.token_review.as_ref()?;
        Some(ClusterReview::of(r, &shared.config.load().agents.token_review))
    }
}

/// Decide who the agent is (reading its hello where that decides), review its token where
/// needed, then register the session (announcing this replica) or refuse it with the reason.
async fn admit(
    shared: &Shared,
    who: &Who,
    started: tokio::sync::oneshot::Receiver<Started>,
    session_stop: &CancellationToken,
) -> Option<(Arc<crate::session::Session>, Option<crate::rereview::TokenState>)> {
    let started = started.await.ok()?;
    let rules = Rules::now(shared);
    let peer = who.peer;
    let mut presented = started.presented.clone();
    let shown = if crate::identity::needs_hello(who.cert_cluster.as_deref(), |c| rules.auth(c)) {
        let wait = shared.config.load().timeouts.handshake.get();
        match tokio::time::timeout(wait, presented.wait_for(Option::is_some)).await {
            Ok(Ok(p)) => p.clone(),
            _ => {
                let cluster = who.cert_cluster.as_deref().unwrap_or("-");
                refuse_session(shared, peer, cluster, &Refused::NoCredentials(wait), &started.opener, session_stop);
                return None;
            }
        }
    } else {
        None
    };
    let p = shown.unwrap_or_default();
    let shown = Shown { cert_cluster: who.cert_cluster.as_deref(), named: &p.cluster, token: !p.token.is_empty() };
    let token_clusters = rules.token_clusters();
    let (cluster, review) = match crate::identity::decide(shown, |c| rules.auth(c), &token_clusters) {
        Ok(d) => d,
        Err(r) => {
            // Only a cluster this replica knows names a metric series; a claim does not.
            let label = match &r {
                Refused::CertificateRequired { cluster, .. } | Refused::TokenRequired { cluster, .. } => cluster,
                Refused::ClusterMismatch { cert, .. } => cert,
                _ => "-",
            };
            refuse_session(shared, peer, label, &r, &started.opener, session_stop);
            return None;
        }
    };
    if shared.directory.mode(&cluster).mode == ClusterMode::Fenced {
        refuse_session(shared, peer, &cluster, &Refused::Fenced(cluster.clone()), &started.opener, session_stop);
        return None;
    }
    let mut token = None;
    if review {
        let Some(settings) = rules.review(shared, &cluster) else {
            let r = Refused::NoTokenCluster(format!("cluster {cluster:?} has no token_review here"));
            refuse_session(shared, peer, &cluster, &r, &started.opener, session_stop);
            return None;
        };
        match shared.reviewers.review(&cluster, &settings, &p.token).await {
            Ok(reviewed) => token = Some(crate::rereview::TokenState { presented, reviewed, settings }),
            Err(error) => {
                let r = Refused::Token { cluster: cluster.clone(), error };
                refuse_session(shared, peer, &cluster, &r, &started.opener, session_stop);
                return None;
            }
        }
    }
    let known = crate::control::knows_cluster(shared, &cluster, peer);
    if !known && !shared.config.load().agents.accept_unknown_clusters {
        // Bounded label: the name is not one the config knows; logs and /readyz carry it.
        shared.unknown.lock().refused.insert(cluster.clone());
        refuse_session(shared, peer, "-", &Refused::UnknownCluster(cluster), &started.opener, session_stop);
        return None;
    }
    let identity = crate::session::Identity {
        cert: who.cert.clone(),
        account: token.as_ref().map(|t| t.reviewed.account.to_string()),
    };
    let added = shared.directory.add(
        &cluster,
        peer.to_string(),
        started.opener.clone(),
        started.hello,
        session_stop.clone(),
        identity,
        who.transport,
    );
    match added {
        Ok(sess) => {
            // A revocation list that changed while this session was admitted applies to it too.
            if let Some(serial) = sess.identity.cert.as_ref().and_then(|c| shared.agents_revoked.load().of(c)) {
                shared.directory.remove(&sess);
                crate::revocation::ended(shared, &sess, &serial);
                return None;
            }
            shared.metrics.agent_sessions.with_label_values(&[&cluster, "accepted"]).inc();
            let account = sess.identity.account.as_deref().unwrap_or("-");
            tracing::info!(%peer, %cluster, session = sess.id, transport = who.transport, %account, "agent session up");
            shared.replica.announce_to(&shared.metrics, &sess);
            crate::attempt::watch_suspect(shared.metrics.clone(), &sess);
            Some((sess, token))
        }
        Err(r) => {
            refuse_session(shared, peer, &cluster, &r, &started.opener, session_stop);
            None
        }
    }
}

/// Count and log a refusal of an agent (before its session began).
fn refused(shared: &Shared, peer: SocketAddr, cluster: &str, r: &Refused) {
    shared.metrics.agent_sessions.with_label_values(&[cluster, r.label()]).inc();
    tracing::warn!(%peer, %cluster, reason = r.label(), "agent refused: {r}");
}

/// Refuse a running session: counted and logged, the reason sent to the agent on the control
/// stream, and the session closed once the notice had time to arrive.
pub(crate) fn refuse_session(
    shared: &Shared,
    peer: SocketAddr,
    cluster: &str,
    r: &Refused,
    opener: &Arc<dyn Opener>,
    stop: &CancellationToken,
) {
    refused(shared, peer, cluster, r);
    crate::identity::tell_and_close(r, opener, stop);
}

/// The quinn server config of one agent connection: the agents' current TLS material and the
/// current tunnel settings; its congestion controllers count into `stats`.
pub(crate) fn quic_server_config(
    tls: Arc<rustls::ServerConfig>,
    cfg: &seedgate_config::ServerConfig,
    stats: Option<&CongestionStats>,
) -> Result<quinn::ServerConfig, quinn::crypto::rustls::NoInitialCipherSuite> {
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls)?;
    let mut sc = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    sc.transport_config(Arc::new(quic::seed_transport_config(&settings(cfg), stats)));
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
