//! The agent end of the reverse tunnel: one outbound session per configured server, and dials within the allowlist.

use arc_swap::ArcSwap;
use proxy_core::copy::{transfer, Meters, Outcome, Side};
use proxy_core::metrics::{counter_vec, gauge, gauge_vec, seconds_histogram};
use proxy_core::net::{connect_addr, reset_on_close, tune_stream};
use proxy_core::prometheus::{HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Registry};
use proxy_core::tunnel::h2::{run_agent_session, AgentHandler};
use proxy_core::tunnel::{AgentHello, BoxFuture, ControlMsg, DialError, Incoming, TunnelSettings, ALPN_V1};
use seedgate_config::agent::Tunnel as TunnelCfg;
use seedgate_config::{CidrPort, HostPort};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_rustls::TlsConnector;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

#[derive(Clone)]
pub struct TunnelMetrics {
    pub sessions: IntGaugeVec,
    pub reconnects: IntCounterVec,
    pub streams_active: IntGauge,
    pub streams_opened: IntCounterVec,
    pub dial_seconds: HistogramVec,
    pub dial_failures: IntCounterVec,
    pub bytes: IntCounterVec,
    pub limit_hits: IntCounterVec,
    pub moves: IntCounterVec,
}

impl TunnelMetrics {
    pub fn new(reg: &Registry) -> Self {
        Self {
            sessions: gauge_vec(reg, "seedgate_tunnel_sessions_connected", "1 while the session to a server is up, by server.", &["server"]),
            reconnects: counter_vec(reg, "seedgate_tunnel_reconnects_total", "Session (re)connect attempts after the first, by server and result (ok: the session came up, failed: it did not).", &["server", "result"]),
            streams_active: gauge(reg, "seedgate_tunnel_streams_active", "Tunnel streams open now."),
            streams_opened: counter_vec(reg, "seedgate_tunnel_streams_opened_total", "Tunnel streams dialled successfully, by server.", &["server"]),
            dial_seconds: seconds_histogram(reg, "seedgate_tunnel_dial_duration_seconds", "Time to connect to a target in the shoot, by result.", &["result"]),
            dial_failures: counter_vec(reg, "seedgate_tunnel_dial_failures_total", "Dials refused or failed, by reason.", &["reason"]),
            bytes: counter_vec(reg, "seedgate_tunnel_bytes_total", "Bytes carried by tunnel streams, by direction (to_shoot, to_seed).", &["direction"]),
            limit_hits: counter_vec(reg, "seedgate_tunnel_stream_limit_hits_total", "Streams refused because a limit was reached, by limit.", &["limit"]),
            moves: counter_vec(reg, "seedgate_tunnel_move_notices_total", "Move notices received from servers, by server.", &["server"]),
        }
    }
}

/// State shared by all sessions of the agent.
pub struct Tunnel {
    pub cfg: ArcSwap<TunnelCfg>,
    pub metrics: TunnelMetrics,
    connector: ArcSwap<TlsConnector>,
    /// Streams open across all sessions (the `max_streams` limit applies to the sum).
    active: AtomicUsize,
    node: String,
    /// Per-server session state for readiness.
    pub status: Mutex<std::collections::BTreeMap<String, bool>>,
    /// The shutdown grace is over: live streams end now.
    kill: CancellationToken,
}

pub fn settings(cfg: &TunnelCfg) -> TunnelSettings {
    TunnelSettings {
        stream_window: cfg.stream_window,
        connection_window: cfg.connection_window,
        max_streams: cfg.max_streams as u32 + 16,
        keepalive_interval: cfg.keepalive.interval.get(),
        keepalive_timeout: cfg.keepalive.timeout.get(),
        ..TunnelSettings::default()
    }
}

pub fn connector(cfg: &TunnelCfg) -> Result<TlsConnector, proxy_core::tls::TlsError> {
    let t = &cfg.tls;
    let cc = proxy_core::tls::client_config(t.ca.as_ref(), Some((t.cert.as_ref(), t.key.as_ref())), &[ALPN_V1], true)?;
    Ok(TlsConnector::from(cc))
}

fn node_name(cfg: &TunnelCfg) -> String {
    cfg.node_name
        .clone()
        .or_else(|| std::env::var("NODE_NAME").ok())
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok().map(|s| s.trim().to_owned()))
        .unwrap_or_default()
}

impl Tunnel {
    pub fn new(cfg: TunnelCfg, reg: &Registry, kill: CancellationToken) -> Result<Arc<Self>, proxy_core::tls::TlsError> {
        let conn = connector(&cfg)?;
        Ok(Arc::new(Self {
            node: node_name(&cfg),
            connector: ArcSwap::from_pointee(conn),
            cfg: ArcSwap::from_pointee(cfg),
            metrics: TunnelMetrics::new(reg),
            active: AtomicUsize::new(0),
            status: Mutex::new(Default::default()),
            kill,
        }))
    }

    /// Take a reloaded tunnel config (allowlist, timeouts, TLS files) for new sessions/streams.
    pub fn reconfigure(&self, cfg: TunnelCfg) -> Result<(), String> {
        if cfg.servers != self.cfg.load().servers {
            return Err("tunnel.servers cannot change at runtime; restart to apply".into());
        }
        let conn = connector(&cfg).map_err(|e| e.to_string())?;
        self.connector.store(Arc::new(conn));
        self.cfg.store(Arc::new(cfg));
        Ok(())
    }

    pub fn ready_checks(&self) -> Vec<proxy_core::admin::Check> {
        self.status
            .lock()
            .expect("not poisoned")
            .iter()
            .map(|(s, up)| proxy_core::admin::Check::new(format!("tunnel-{s}"), *up, if *up { "session up" } else { "not connected" }))
            .collect()
    }

    fn set_status(&self, server: &str, up: bool) {
        self.status.lock().expect("not poisoned").insert(server.to_owned(), up);
        self.metrics.sessions.with_label_values(&[server]).set(i64::from(up));
    }

    /// Start one session loop per configured server.
    pub fn start(self: &Arc<Self>, stop: CancellationToken, tracker: TaskTracker) {
        for server in self.cfg.load().servers.clone() {
            self.set_status(&server.to_string(), false);
            tokio::spawn(session_loop(self.clone(), server, stop.clone(), tracker.clone()));
        }
    }
}

/// Keep a session to `server` up: connect, serve, and after it ends reconnect with exponential
/// back-off and jitter. The name is resolved afresh on every attempt.
async fn session_loop(t: Arc<Tunnel>, server: HostPort, stop: CancellationToken, tracker: TaskTracker) {
    let label = server.to_string();
    let mut backoff = t.cfg.load().reconnect.initial.get();
    let mut first = true;
    loop {
        if stop.is_cancelled() {
            return;
        }
        let started = Instant::now();
        let mut up = false;
        let result = connect_and_serve(&t, &server, &label, !first, &mut up, stop.clone(), tracker.clone()).await;
        t.set_status(&label, false);
        let cfg = t.cfg.load();
        match &result {
            Ok(()) => tracing::info!(server = %label, "tunnel session closed"),
            Err(e) => tracing::warn!(server = %label, error = %e, "tunnel session failed"),
        }
        // A reconnect that came up was counted at once (in connect_and_serve), not only when
        // that session ends too; one that failed is counted here.
        if !first && !up {
            t.metrics.reconnects.with_label_values(&[label.as_str(), "failed"]).inc();
        }
        first = false;
        // A session that stayed up a while resets the back-off: the next failure is fresh.
        if started.elapsed() > cfg.reconnect.max.get() {
            backoff = cfg.reconnect.initial.get();
        }
        let jitter = rand::random_range(0.5..1.0);
        let wait = backoff.mul_f64(jitter);
        backoff = (backoff * 2).min(cfg.reconnect.max.get());
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// Connect, then serve the session until it ends. `up` is set once the session is established
/// (then a `reconnect` is counted as `ok`).
async fn connect_and_serve(
    t: &Arc<Tunnel>,
    server: &HostPort,
    label: &str,
    reconnect: bool,
    up: &mut bool,
    stop: CancellationToken,
    tracker: TaskTracker,
) -> Result<(), String> {
    let cfg = t.cfg.load_full();
    let timeout = cfg.dial_timeout.get();
    let (tcp, addr) = proxy_core::net::connect_host(server, timeout).await.map_err(|e| format!("connect {server}: {e}"))?;
    let name = cfg.tls.server_name.clone().unwrap_or_else(|| server.host.clone());
    let sni = rustls::pki_types::ServerName::try_from(name.clone()).map_err(|e| format!("server_name {name:?}: {e}"))?;
    let connector = t.connector.load_full();
    let tls = tokio::time::timeout(timeout, connector.connect(sni, tcp))
        .await
        .map_err(|_| format!("TLS handshake with {addr} timed out"))?
        .map_err(|e| format!("TLS handshake with {addr}: {e}"))?;
    if tls.get_ref().1.alpn_protocol() != Some(ALPN_V1) {
        return Err(format!("{addr} does not speak seedgate-tunnel/1"));
    }
    tracing::info!(server = %label, %addr, "tunnel session up");
    t.set_status(label, true);
    *up = true;
    if reconnect {
        t.metrics.reconnects.with_label_values(&[label, "ok"]).inc();
    }
    let handler: Arc<dyn AgentHandler> = Arc::new(Handler { t: t.clone(), server: label.to_owned() });
    run_agent_session(tls, &settings(&cfg), handler, stop, tracker).await.map_err(|e| e.to_string())
}

struct Handler {
    t: Arc<Tunnel>,
    server: String,
}

impl AgentHandler for Handler {
    fn incoming(&self, inc: Incoming) -> BoxFuture<'static, ()> {
        Box::pin(serve_stream(self.t.clone(), self.server.clone(), inc))
    }

    fn control(&self, msg: ControlMsg) {
        self.t.metrics.moves.with_label_values(&[&self.server]).inc();
        tracing::info!(server = %self.server, ?msg, "control message");
    }

    fn hello(&self) -> AgentHello {
        AgentHello { node: self.t.node.clone(), version: env!("CARGO_PKG_VERSION").into() }
    }
}

fn allowed(allow: &[CidrPort], addr: SocketAddr) -> bool {
    allow.iter().any(|c| c.matches(addr))
}

/// Resolve and check the target: every address dialled must be on the allowlist (a name that
/// resolves to a forbidden address is refused, so DNS cannot be used to escape the list).
async fn resolve_allowed(allow: &[CidrPort], target: &str, timeout: Duration) -> Result<Vec<SocketAddr>, DialError> {
    let hp: HostPort = target.parse().map_err(|e: String| DialError::BadTarget(e))?;
    if let Some(sa) = hp.socket_addr() {
        return if allowed(allow, sa) { Ok(vec![sa]) } else { Err(DialError::NotAllowed(format!("{target} is not on the agent's allowlist"))) };
    }
    let addrs = tokio::time::timeout(timeout, proxy_core::net::resolve(&hp))
        .await
        .map_err(|_| DialError::Timeout(format!("resolving {} timed out", hp.host)))?
        .map_err(|e| DialError::Resolve(format!("{}: {e}", hp.host)))?;
    let ok: Vec<SocketAddr> = addrs.iter().copied().filter(|a| allowed(allow, *a)).collect();
    if ok.is_empty() {
        return Err(DialError::NotAllowed(format!("{target} resolves to {addrs:?}, none on the agent's allowlist")));
    }
    Ok(ok)
}

/// Decrements the active-stream count when a stream ends.
struct StreamSlot<'a>(&'a Tunnel);

impl Drop for StreamSlot<'_> {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::Relaxed);
        self.0.metrics.streams_active.dec();
    }
}

async fn serve_stream(t: Arc<Tunnel>, server: String, inc: Incoming) {
    let cfg = t.cfg.load_full();
    let m = &t.metrics;
    let started = Instant::now();
    let target = inc.target.clone();
    if t.active.fetch_add(1, Ordering::Relaxed) >= cfg.max_streams {
        t.active.fetch_sub(1, Ordering::Relaxed);
        m.limit_hits.with_label_values(&["max_streams"]).inc();
        inc.responder.refuse(&DialError::Limit(format!("{} streams open", cfg.max_streams)));
        return;
    }
    m.streams_active.inc();
    let _slot = StreamSlot(&t);
    let timeout = cfg.dial_timeout.get();
    let dialled = async {
        let addrs = resolve_allowed(&cfg.allow, &target, timeout).await?;
        let mut last = DialError::Unreachable(target.clone());
        for a in addrs {
            match connect_addr(a, timeout).await {
                Ok(s) => return Ok((s, a)),
                Err(e) => last = DialError::from_connect(&target, &e),
            }
        }
        Err(last)
    }
    .await;
    let (tcp, addr) = match dialled {
        Ok(x) => x,
        Err(e) => {
            m.dial_failures.with_label_values(&[e.code()]).inc();
            m.dial_seconds.with_label_values(&["failed"]).observe(started.elapsed().as_secs_f64());
            tracing::info!(target: "access", server = %server, target = %target, reason = e.code(), detail = %e, "dial refused");
            inc.responder.refuse(&e);
            return;
        }
    };
    m.dial_seconds.with_label_values(&["ok"]).observe(started.elapsed().as_secs_f64());
    let stream = match inc.responder.accept() {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!(error = %e, "stream vanished before it was answered");
            return;
        }
    };
    m.streams_opened.with_label_values(&[&server]).inc();
    tune_stream(&tcp);
    let meters = Meters {
        to_upstream: Some(m.bytes.with_label_values(&["to_shoot"])),
        to_client: Some(m.bytes.with_label_values(&["to_seed"])),
    };
    let mut relay = transfer(stream, tcp, cfg.idle_timeout.get(), meters);
    let outcome = tokio::select! {
        o = &mut relay => Some(o),
        _ = t.kill.cancelled() => None,
    };
    let (up, down) = relay.counts();
    let (mut stream, tcp) = relay.into_inner();
    // Pass a reset on to the other side; an orderly end was already passed on by the relay.
    let reason = match &outcome {
        Some(o @ (Outcome::Reset(Side::Client) | Outcome::Error(Side::Client, _))) => {
            reset_on_close(&tcp);
            o.label()
        }
        Some(o @ (Outcome::Reset(Side::Upstream) | Outcome::Error(Side::Upstream, _) | Outcome::Idle)) => {
            stream.reset();
            o.label()
        }
        Some(o @ Outcome::Closed) => o.label(),
        None => {
            stream.reset();
            "shutdown"
        }
    };
    tracing::info!(
        target: "access",
        server = %server,
        target = %target,
        upstream = %addr,
        bytes_to_shoot = up,
        bytes_to_seed = down,
        duration_ms = started.elapsed().as_secs_f64() * 1000.0,
        reason,
        "stream closed"
    );
}
