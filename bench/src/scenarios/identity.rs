//! identity: what it costs to set an agent session up, by how the agent proves its cluster: a client certificate (mTLS), a ServiceAccount token reviewed at the cluster's kube-apiserver (a new token each session: every review asked), or the same token again (a positive review reused from the cache).
//!
//! One proxy-server (pinned like every system under test) whose agents may come with a
//! certificate or a token (`agents.auth: mtls_or_token`): cluster `shoot-m` by certificate,
//! cluster `shoot-t` by token, reviewed by the testbed's stand-in kube-apiserver (TokenReviews
//! over TLS, on the harness CPU, its connections kept alive by proxy-server). The harness plays
//! the agent with the tunnel's own agent side (`proxy_core::tunnel`), one session at a time, the
//! three kinds interleaved: from the TCP connect, through the TLS 1.3 handshake (full: no
//! resumption), HTTP/2, the hello on the control stream, the review where there is one, to the
//! replica's announcement, which proxy-server sends once the session is registered; then the
//! session is closed before the next. No anchor plays this role here (konnectivity's server
//! reviews tokens too, but is not installed): the figures are seedgate's only, and the table
//! gives each as a ratio to the mTLS session.
//!
//! Self-contained (its own metrics, remark and table): it can move with the scenario list.

use super::{Ctx, record};
use crate::report::{Better, Kind, Results};
use anyhow::Context as _;
use proxy_core::tunnel::session::AgentSession;
use proxy_core::tunnel::{AgentHandler, AgentHello, BoxFuture, ControlMsg, Incoming, Secret, TunnelSettings};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use testbed::Proc;
use testbed::token_review::TokenReviewer;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub(super) const SC: &str = "identity";
const NAME: &str = "proxy.identity.bench";
const ACCOUNT: &str = "kube-system/proxy-agent";
/// One session's set-up must be done within this.
const STEP: Duration = Duration::from_secs(10);

/// The three ways an agent proves its cluster, as the table's rows name them.
#[derive(Clone, Copy, PartialEq)]
enum Way {
    Mtls,
    TokenUncached,
    TokenCached,
}

impl Way {
    const ALL: [Way; 3] = [Way::Mtls, Way::TokenUncached, Way::TokenCached];

    fn label(self) -> &'static str {
        match self {
            Way::Mtls => "mTLS (client certificate)",
            Way::TokenUncached => "token, TokenReview asked",
            Way::TokenCached => "token, review cached",
        }
    }
}

/// The agent side the harness plays: the hello names the cluster (and carries the token); the
/// replica's announcement says the session was admitted.
struct Agent {
    hello: AgentHello,
    admitted: Arc<Notify>,
}

impl AgentHandler for Agent {
    fn incoming(&self, inc: Incoming) -> BoxFuture<'static, ()> {
        inc.responder.refuse(&proxy_core::tunnel::DialError::NotAllowed("bench agent".into()));
        Box::pin(async {})
    }

    fn control(&self, msg: ControlMsg) {
        if matches!(msg, ControlMsg::Server(_)) {
            self.admitted.notify_one();
        }
    }

    fn hello(&self) -> AgentHello {
        self.hello.clone()
    }
}

/// Open one session `way` and return how long it took to be admitted; the session is closed.
async fn one_session(
    agents: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
    cluster: &str,
    token: Secret,
) -> anyhow::Result<Duration> {
    let admitted = Arc::new(Notify::new());
    let hello = AgentHello {
        node: "bench".into(),
        version: "bench".into(),
        cluster: cluster.into(),
        token,
        ..Default::default()
    };
    let handler: Arc<dyn AgentHandler> = Arc::new(Agent { hello, admitted: admitted.clone() });
    let started = Instant::now();
    let tcp = tokio::net::TcpStream::connect(agents).await?;
    // As the agent's own sockets: no Nagle delay between the control stream's answer and hello.
    proxy_core::net::tune_stream(&tcp);
    let name = rustls::pki_types::ServerName::try_from(NAME)?;
    let conn = tokio_rustls::TlsConnector::from(tls).connect(name, tcp).await.context("TLS")?;
    let stop = CancellationToken::new();
    let settings = TunnelSettings::default();
    let st = stop.clone();
    let session = tokio::spawn(async move {
        let session = AgentSession { settings: &settings, handler, stop: st, tracker: TaskTracker::new() };
        proxy_core::tunnel::session::run_agent_session(Box::new(conn), session).await
    });
    let waited = tokio::time::timeout(STEP, admitted.notified()).await;
    let took = started.elapsed();
    stop.cancel();
    let _ = tokio::time::timeout(STEP, session).await;
    waited.context("not admitted in time")?;
    Ok(took)
}

pub(super) async fn run(ctx: &Ctx, res: &mut Results) -> anyhow::Result<()> {
    let label = |w: Way| format!("proxy-server, {}", w.label());
    let m_median = res.metric(SC, "agent session set-up (connect → admitted)", "ms", Better::Lower);
    if let Err(e) = crate::systems::check_only("proxy-server") {
        for w in Way::ALL {
            res.skip(m_median, &label(w), Kind::Seedgate, &format!("{e:#}"));
        }
        return Ok(());
    }
    let samples = if ctx.smoke { 20 } else { 200 };
    let dir = ctx.dir.path().join("identity");
    std::fs::create_dir_all(&dir)?;
    let kas = TokenReviewer::start(&ctx.ca, &dir, "shoot-t-kas").await?;
    let (sc, sk) = ctx.ca.server(&[NAME])?.write(&dir, "agents")?;
    let ca = ctx.ca.write(&dir, "ca")?;
    let cfg = dir.join("proxy-server.yaml");
    crate::systems::write_atomic(
        &cfg,
        &format!(
            "admin: {{ listen: 127.0.0.1:0 }}\nagents:\n  listen: 127.0.0.1:0\n  tls: {{ cert: {}, key: {}, client_ca: {} }}\n  \
             auth: mtls_or_token\n  settle_time: 0s\n  token_review: {{ cache_ttl: 1h, service_accounts: [{ACCOUNT}] }}\n\
             frontends:\n  - {{ name: egress, listen: 127.0.0.1:0, cluster: shoot-m }}\n\
             clusters:\n  shoot-m: {{ agent_auth: mtls }}\n  shoot-t: {{ agent_auth: token, token_review: {} }}\n",
            sc.display(),
            sk.display(),
            ca.display(),
            kas.section("")
        ),
    )?;
    let mut cmd = ctx.pin.command(&ctx.bins.server);
    cmd.env("RUST_LOG", "warn");
    let (server, addrs) = Proc::spawn_seedgate(cmd, &cfg, &[]).await.context("starting proxy-server")?;
    let agents = addrs.listener("agents")?;
    res.remark(
        SC,
        &format!(
            "on 127.0.0.1: one proxy-server (agents.auth mtls_or_token; shoot-m by certificate, shoot-t by token, \
             token_review.cache_ttl 1h) and the testbed's stand-in kube-apiserver answering TokenReviews over TLS on the \
             harness CPU (proxy-server keeps its connections alive); the harness plays the agent with proxy_core's own \
             agent side, {samples} sessions of each kind, interleaved, one at a time, each closed before the next; full TLS \
             1.3 handshakes (no resumption), P-256 certificates; a session counts from the TCP connect to the replica's \
             announcement, which proxy-server sends once it registered the session. seedgate only: no anchor plays this \
             role here (konnectivity's server reviews tokens too, but is not installed)"
        ),
    );
    let mut mtls = testbed::pki::client_config(&ctx.ca, Some(&ctx.ca.client("shoot-m")?), &["seedgate-tunnel/1"])?;
    let mut bare = testbed::pki::client_config(&ctx.ca, None, &["seedgate-tunnel/1"])?;
    for c in [&mut mtls, &mut bare] {
        Arc::make_mut(c).resumption = rustls::client::Resumption::disabled();
    }
    let cached = Secret::new(kas.issue(ACCOUNT, &["seedgate"], Duration::from_secs(7200)));
    // The cached token's first review, and a session of each kind to warm up.
    let mut times: [Vec<f64>; 3] = Default::default();
    let mut errors = Vec::new();
    for round in 0..=samples {
        for (i, w) in Way::ALL.into_iter().enumerate() {
            let r = match w {
                Way::Mtls => one_session(agents, mtls.clone(), "", Secret::default()).await,
                Way::TokenUncached => {
                    let fresh = Secret::new(kas.issue(ACCOUNT, &["seedgate"], Duration::from_secs(7200)));
                    one_session(agents, bare.clone(), "shoot-t", fresh).await
                }
                Way::TokenCached => one_session(agents, bare.clone(), "shoot-t", cached.clone()).await,
            };
            match r {
                Ok(d) if round > 0 => times[i].push(d.as_secs_f64() * 1e3),
                Ok(_) => {}
                Err(e) => errors.push(format!("{}: {e:#}", w.label())),
            }
        }
    }
    let _ = std::fs::write(dir.join("proxy-server.log"), server.log());
    drop(server);
    let mut medians = [None; 3];
    for (i, w) in Way::ALL.into_iter().enumerate() {
        let mut t = times[i].clone();
        t.sort_by(f64::total_cmp);
        let median = t.get(t.len() / 2).copied();
        medians[i] = median;
        let r = median.with_context(|| format!("no session admitted: {}", errors.first().cloned().unwrap_or_default()));
        record(res, m_median, &label(w), Kind::Seedgate, r);
    }
    let mut table = String::from(
        "| agent proves its cluster with | session set-up, median (ms) | p90 (ms) | ÷ mTLS |\n|---|---|---|---|\n",
    );
    for (i, w) in Way::ALL.into_iter().enumerate() {
        let mut t = times[i].clone();
        t.sort_by(f64::total_cmp);
        let p90 = t.get(t.len() * 9 / 10).copied();
        let fmt = |v: Option<f64>| v.map(|v| format!("{v:.2}")).unwrap_or_else(|| "—".into());
        let ratio = match (medians[i], medians[0]) {
            (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
            _ => "—".into(),
        };
        table.push_str(&format!("| {} | {} | {} | {ratio} |\n", w.label(), fmt(medians[i]), fmt(p90)));
    }
    if !errors.is_empty() {
        table.push_str(&format!("\n{} sessions failed; first: {}\n", errors.len(), errors[0]));
    }
    res.tables.push((SC.into(), table));
    eprintln!("  identity: {} TokenReviews answered by the stand-in", kas.reviews());
    Ok(())
}
