//! An agent's way in, as one pipeline: its TLS or QUIC handshake, what the transport shows (ALPN, the certificate's CN), then — once its session runs — its hello where that decides, its identity, its token's review, its cluster known here, and its session filed in the registry; every step returns what the next takes, a refusal leaves by one exit (counted, logged, told to the agent).

use super::identity::{Rules, Shown, decide, needs_hello};
use super::refusal::{Peer, Refusal, tell_and_close};
use super::rereview::{self, TokenState};
use super::tokens::Asker;
use super::wing::{Agents, tunnel_settings};
use crate::registry::{Filed, Identity, Session};
use proxy_core::net::pending::BudgetRules as _;
use proxy_core::obs::Untrusted;
use proxy_core::relay::io::ReadAhead;
use proxy_core::tunnel::h2::SessionSocket;
use proxy_core::tunnel::session::{Presented, SeedConnection, run_seed_session};
use proxy_core::tunnel::{ALPN_V1, AgentHello, Opener};
use seedgate_config::server::valid_cluster_name;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, watch};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

/// The agents' TCP listener: the TLS handshake, then the session.
pub(crate) async fn accept_tls(
    agents: Arc<Agents>,
    acceptor: TlsAcceptor,
    tcp: TcpStream,
    peer: SocketAddr,
    stop: CancellationToken,
) {
    let cfg = agents.shared.config.load();
    let a = &cfg.agents;
    let probe_every = tunnel_settings(&cfg).ping_every();
    proxy_core::net::tune_session_socket(&tcp, a.keepalive.timeout.get(), probe_every, a.tcp_notsent_lowat);
    let tcp = SessionSocket::new(tcp, a.tcp_inflight_bound, Some(agents.shared.metrics.inflight.clone()));
    if let Some(tls) = handshake(&agents, peer, "TLS", acceptor.accept(ReadAhead::new(tcp))).await {
        serve_agent(agents, tls, peer, stop).await;
    }
}

/// The agents' QUIC listener: the handshake (with the server config built for this
/// connection), then the session.
pub(crate) async fn accept_quic(
    agents: Arc<Agents>,
    incoming: quinn::Incoming,
    server_config: Arc<quinn::ServerConfig>,
    stop: CancellationToken,
) {
    let peer = incoming.remote_address();
    let connecting = match incoming.accept_with(server_config) {
        Ok(c) => c,
        Err(e) => {
            agents.shared.metrics.agent_sessions.with_label_values(&["-", "tls_handshake_failed"]).inc();
            tracing::warn!(%peer, error = %e, "agent QUIC connection refused");
            return;
        }
    };
    if let Some(conn) = handshake(&agents, peer, "QUIC", connecting).await {
        serve_agent(agents, conn, peer, stop).await;
    }
}

/// An agent's `over` (TLS or QUIC) handshake, within the handshake timeout; `None` when it
/// failed or timed out (counted and logged).
async fn handshake<C, E>(
    agents: &Agents,
    peer: SocketAddr,
    over: &str,
    h: impl Future<Output = Result<C, E>>,
) -> Option<C>
where
    E: std::error::Error + 'static,
{
    let timeout = agents.shared.config.load().timeouts.handshake.get();
    match tokio::time::timeout(timeout, h).await {
        Ok(Ok(c)) => Some(c),
        Ok(Err(e)) => {
            handshake_failed(agents, peer, over, Some(&e));
            None
        }
        Err(_) => {
            handshake_failed(agents, peer, over, None);
            None
        }
    }
}

/// An agent's `over` (TLS or QUIC) handshake that did not complete: `e` when it failed, `None`
/// when it timed out. Counted by reason and logged with what to fix when a certificate was refused.
fn handshake_failed(agents: &Agents, peer: SocketAddr, over: &str, e: Option<&(dyn std::error::Error + 'static)>) {
    let sessions = &agents.shared.metrics.agent_sessions;
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

/// Serve one agent connection of any transport for its whole life: what its transport shows,
/// then the session, admitted ([`admit`]) and registered while it runs (and, for a token agent,
/// its token reviewed again whenever it expires or is renewed).
async fn serve_agent<C: SeedConnection>(agents: Arc<Agents>, conn: C, peer: SocketAddr, stop: CancellationToken) {
    let who = match shown_by_transport(&agents, &conn, peer) {
        Ok(who) => who,
        Err(answer) => return conn.refuse(answer),
    };
    let transport = who.transport;
    let settings = tunnel_settings(&agents.shared.config.load());
    let session_stop = stop.child_token();
    let (started_tx, started) = oneshot::channel();
    let session = run_seed_session(conn, &settings, session_stop.clone(), |s| {
        let opener: Arc<dyn Opener> = s.opener;
        let _ = started_tx.send(Started { opener, hello: s.hello, presented: s.presented });
    });
    let mut session = std::pin::pin!(session);
    let admitted = tokio::select! {
        r = &mut session => {
            if let Err(e) = r.result {
                tracing::info!(%peer, transport, error = %e, "agent session ended before it was admitted");
            }
            return;
        }
        a = admit(&agents, &who, started, &session_stop) => a,
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
            () = rereview::keep(&agents, &sess, t, &session_stop) => session.await,
        },
    };
    agents.shared.directory.remove(&sess);
    let cluster = &sess.cluster;
    match &ended.result {
        Ok(()) => tracing::info!(%peer, %cluster, session = sess.id, "agent session closed"),
        Err(e) => tracing::info!(%peer, %cluster, session = sess.id, error = %e, "agent session ended"),
    }
}

/// What the transport shows before any session: the protocol, and the cluster its certificate
/// names (its CN, if it presented one), which must not be fenced here. Refused (counted,
/// logged) with what the transport answers.
fn shown_by_transport<C: SeedConnection>(agents: &Agents, conn: &C, peer: SocketAddr) -> Result<Who, &'static str> {
    let transport = conn.transport();
    let alpn = conn.alpn();
    if alpn.as_deref() != Some(ALPN_V1) {
        agents.shared.metrics.agent_sessions.with_label_values(&["-", "bad_alpn"]).inc();
        tracing::warn!(%peer, transport, alpn = ?alpn.as_deref().map(String::from_utf8_lossy), "agent did not negotiate seedgate-tunnel/1");
        return Err("ALPN");
    }
    let cert = conn.peer_certificate();
    let cert_cluster = match &cert {
        None => None,
        Some(c) => match proxy_core::tls::common_name(c).filter(|cn| valid_cluster_name(cn)) {
            Some(cn) => Some(cn),
            None => {
                refused(agents, peer, "-", &Refusal::BadIdentity);
                return Err("refused");
            }
        },
    };
    if let Some(c) = &cert_cluster
        && let Err(r) = agents.shared.directory.admits(c)
    {
        refused(agents, peer, c, &r.into());
        return Err("refused");
    }
    Ok(Who { peer, transport, cert, cert_cluster })
}

/// What the session hands over once it runs.
struct Started {
    opener: Arc<dyn Opener>,
    hello: Arc<OnceLock<AgentHello>>,
    presented: watch::Receiver<Option<Presented>>,
}

/// The agent as the handshake showed it.
struct Who {
    peer: SocketAddr,
    transport: &'static str,
    cert: Option<rustls::pki_types::CertificateDer<'static>>,
    /// The certificate's CN (a valid cluster name).
    cert_cluster: Option<String>,
}

/// One step of an admission: what the next step takes, or the refusal with the cluster its
/// count names (`-` where the cluster is not one this replica knows).
type Step<T> = Result<T, (String, Refusal)>;

/// An admission under way: the agent, its running session, and who a refusal is told to.
struct Admission<'a> {
    agents: &'a Agents,
    who: &'a Who,
    started: Started,
    /// The control stream's credentials, seen as of the hello the admission read.
    presented: watch::Receiver<Option<Presented>>,
    rules: Rules,
    /// A valid client certificate proved the agent's cluster: it may hear more of a refusal
    /// (so may an agent whose token was said yes to).
    told: Peer,
}

/// Decide who the agent is (reading its hello where that decides), review its token where
/// needed, then register the session (announcing this replica), or refuse it with the reason:
/// each step in turn, one exit for a refusal.
async fn admit(
    agents: &Agents,
    who: &Who,
    started: oneshot::Receiver<Started>,
    session_stop: &CancellationToken,
) -> Option<(Arc<Session>, Option<TokenState>)> {
    let started = started.await.ok()?;
    let told = if who.cert_cluster.is_some() { Peer::Authenticated } else { Peer::Anyone };
    let presented = started.presented.clone();
    let mut a = Admission { agents, who, started, presented, rules: Rules::now(&agents.shared), told };
    let admitted = async {
        let presented = a.hello().await?;
        let (cluster, review) = a.identity(&presented)?;
        agents.shared.directory.admits(&cluster).map_err(|r| (cluster.clone(), r.into()))?;
        let token = a.review(&cluster, review, &presented).await?;
        a.known(&cluster)?;
        a.file(cluster, token, session_stop)
    }
    .await;
    match admitted {
        Ok(filed) => filed,
        Err((cluster, r)) => {
            refuse_session(agents, who.peer, &cluster, &r, a.told, &a.started.opener, session_stop);
            None
        }
    }
}

impl Admission<'_> {
    /// What the agent presented on its control stream, read within the handshake timeout
    /// where its certificate alone does not decide (nothing otherwise).
    async fn hello(&mut self) -> Step<Presented> {
        if !needs_hello(self.who.cert_cluster.as_deref(), |c| self.rules.auth(c)) {
            return Ok(Presented::default());
        }
        let wait = self.agents.shared.config.load().timeouts.handshake.get();
        match tokio::time::timeout(wait, self.presented.wait_for(Option::is_some)).await {
            Ok(Ok(p)) => Ok(p.clone().unwrap_or_default()),
            _ => {
                let cluster = self.who.cert_cluster.as_deref().unwrap_or("-");
                Err((cluster.to_owned(), Refusal::NoCredentials(wait)))
            }
        }
    }

    /// The agent's cluster, and whether its token must be reviewed there.
    fn identity(&self, p: &Presented) -> Step<(String, bool)> {
        let shown =
            Shown { cert_cluster: self.who.cert_cluster.as_deref(), named: &p.cluster, token: !p.token.is_empty() };
        decide(shown, |c| self.rules.auth(c), &self.rules.token_clusters()).map_err(|r| {
            // Only a cluster this replica knows names a metric series; a claim does not.
            let label = match &r {
                Refusal::CertificateRequired { cluster, .. } | Refusal::TokenRequired { cluster, .. } => cluster,
                Refusal::ClusterMismatch { cert, .. } => cert,
                _ => "-",
            };
            (label.to_owned(), r)
        })
    }

    /// The token's review at the cluster's kube-apiserver, where the identity needs one: the
    /// session's token state from then on (an authenticated agent hears more of a refusal).
    async fn review(&mut self, cluster: &str, review: bool, p: &Presented) -> Step<Option<TokenState>> {
        if !review {
            return Ok(None);
        }
        let refused = |r: Refusal| (cluster.to_owned(), r);
        let Some(settings) = self.rules.review(&self.agents.shared, cluster) else {
            return Err(refused(Refusal::NoTokenCluster(format!("cluster {cluster:?} has no token_review here"))));
        };
        // An unauthenticated peer's review: its source's place in the cluster's budget.
        let source = self.agents.shared.config.load().pending_budget().source_key(self.who.peer.ip());
        match self.agents.reviewers.review(cluster, &settings, &p.token, Asker::New(source)).await {
            Ok(reviewed) => {
                self.told = Peer::Authenticated;
                let presented = self.presented.clone();
                Ok(Some(TokenState { presented, token: p.token.clone(), seen: p.renewals, reviewed }))
            }
            Err(error) => Err(refused(Refusal::Token { cluster: cluster.to_owned(), error })),
        }
    }

    /// Refused when nothing in the config knows the cluster and `agents.accept_unknown_clusters`
    /// is false (warned about, once, either way).
    fn known(&self, cluster: &str) -> Step<()> {
        let known = self.agents.knows_cluster(cluster, self.who.peer);
        if !known && !self.agents.shared.config.load().agents.accept_unknown_clusters {
            // Bounded label: the name is not one the config knows; logs and /readyz carry it.
            self.agents.refused_unknown(cluster);
            return Err(("-".to_owned(), Refusal::UnknownCluster(cluster.to_owned())));
        }
        Ok(())
    }

    /// File the session in the registry (refused there when the cluster is fenced or at its
    /// cap), then count, log and announce it; `None` when its certificate was revoked meanwhile.
    fn file(
        &self,
        cluster: String,
        token: Option<TokenState>,
        stop: &CancellationToken,
    ) -> Step<Option<(Arc<Session>, Option<TokenState>)>> {
        let (agents, started, peer) = (self.agents, &self.started, self.who.peer);
        let identity =
            Identity { cert: self.who.cert.clone(), account: token.as_ref().map(|t| t.reviewed.account.to_string()) };
        let filed = Filed {
            peer: peer.to_string(),
            transport: self.who.transport,
            opener: started.opener.clone(),
            hello: started.hello.clone(),
            stop: stop.clone(),
            identity,
        };
        let added = agents.shared.directory.add(&cluster, filed);
        let sess = added.map_err(|r| (cluster.clone(), r.into()))?;
        // A revocation list that changed while this session was admitted applies to it too.
        if let Some(serial) = sess.identity.cert.as_ref().and_then(|c| agents.revoked.load().of(c)) {
            agents.shared.directory.remove(&sess);
            super::revocation::ended(agents, &sess, &serial);
            return Ok(None);
        }
        agents.shared.metrics.agent_sessions.with_label_values(&[&cluster, "accepted"]).inc();
        let account = Untrusted::new(sess.identity.account.as_deref().unwrap_or("-"));
        tracing::info!(%peer, %cluster, session = sess.id, transport = self.who.transport, %account, "agent session up");
        // What the agent says of itself is logged once it is admitted, escaped; a hello that
        // comes after the admission (a certificate alone decided) when it comes.
        if sess.hello.get().is_some() {
            log_hello(&sess);
        } else {
            tokio::spawn(log_hello_when_it_comes(started.presented.clone(), sess.clone()));
        }
        agents.replica.announce_to(&agents.shared.metrics, &sess);
        sess.watch_suspect(agents.shared.metrics.clone());
        Ok(Some((sess, token)))
    }
}

/// Log an admitted session's hello, escaped: until now the session took dials only by the
/// `default` strategy.
fn log_hello(sess: &Session) {
    if let Some(h) = sess.hello.get() {
        tracing::info!(
            cluster = %sess.cluster, session = sess.id, node = %Untrusted::new(&h.node), host = %Untrusted::new(&h.host),
            addresses = %Untrusted::new(&h.addresses.join(",")).max(1024), default_route = h.default_route,
            version = %Untrusted::new(&h.version), "agent hello"
        );
    }
}

/// [`log_hello`] once the hello of an admitted session comes (within a minute).
async fn log_hello_when_it_comes(mut presented: watch::Receiver<Option<Presented>>, sess: Arc<Session>) {
    let wait = std::time::Duration::from_secs(60);
    if matches!(tokio::time::timeout(wait, presented.wait_for(Option::is_some)).await, Ok(Ok(_))) {
        log_hello(&sess);
    }
}

/// Count and log a refusal of an agent (before its session began): the details at warn, for
/// the operator (a peer's claim in them escaped).
fn refused(agents: &Agents, peer: SocketAddr, cluster: &str, r: &Refusal) {
    agents.shared.metrics.agent_sessions.with_label_values(&[cluster, r.label()]).inc();
    let reason = Untrusted::new(&r.to_string()).max(1024).to_string();
    tracing::warn!(%peer, %cluster, reason = r.label(), "agent refused: {reason}");
}

/// Refuse a running session: counted and logged, the reason sent to the agent on the control
/// stream (as [`Refusal::told`] tells `told`), and the session closed once the notice had time
/// to arrive.
fn refuse_session(
    agents: &Agents,
    peer: SocketAddr,
    cluster: &str,
    r: &Refusal,
    told: Peer,
    opener: &Arc<dyn Opener>,
    stop: &CancellationToken,
) {
    refused(agents, peer, cluster, r);
    tell_and_close(r, told, opener, stop);
}
