//! The agent end of the reverse tunnel: outbound sessions to every replica behind each configured server name (re-homed make-before-break), and dials within the allowlist.

use crate::replicas::{Replicas, Verdict};
use arc_swap::ArcSwap;
use proxy_core::backoff::Backoff;
use proxy_core::copy::{Meters, Stop, transfer};
use proxy_core::guard::Active;
use proxy_core::metrics::{counter_vec, gauge, gauge_vec, seconds_histogram};
use proxy_core::net::connect_in_turn;
use proxy_core::prometheus::{HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Registry};
use proxy_core::relay;
use proxy_core::tls_watch::{self, Reloading, TlsMetrics};
use proxy_core::tunnel::quic;
use proxy_core::tunnel::{
    ALPN_V1, AgentConnection, AgentHandler, AgentHello, AgentSession, BoxFuture, ControlMsg, DialError, Incoming,
    ServerInfo, TunnelSettings, connect_failed, run_agent_session,
};
use seedgate_config::agent::{Transport, Tunnel as TunnelCfg};
use seedgate_config::{CidrPort, HostPort};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};
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
    pub server_sessions: IntGaugeVec,
    pub server_sessions_expected: IntGaugeVec,
    pub duplicates: IntCounterVec,
    pub transport: IntGaugeVec,
    pub transport_changes: IntCounterVec,
}

impl TunnelMetrics {
    pub fn new(reg: &Registry) -> Self {
        Self {
            sessions: gauge_vec(
                reg,
                "seedgate_tunnel_sessions_connected",
                "1 while the session to a server is up, by server.",
                &["server"],
            ),
            reconnects: counter_vec(
                reg,
                "seedgate_tunnel_reconnects_total",
                "Session (re)connect attempts after the first, by server and result (ok: the session came up, failed: it did not).",
                &["server", "result"],
            ),
            streams_active: gauge(reg, "seedgate_tunnel_streams_active", "Tunnel streams open now."),
            streams_opened: counter_vec(
                reg,
                "seedgate_tunnel_streams_opened_total",
                "Tunnel streams dialled successfully, by server.",
                &["server"],
            ),
            dial_seconds: seconds_histogram(
                reg,
                "seedgate_tunnel_dial_duration_seconds",
                "Time to connect to a target in the shoot, by result.",
                &["result"],
            ),
            dial_failures: counter_vec(
                reg,
                "seedgate_tunnel_dial_failures_total",
                "Dials refused or failed, by reason.",
                &["reason"],
            ),
            bytes: counter_vec(
                reg,
                "seedgate_tunnel_bytes_total",
                "Bytes carried by tunnel streams, by direction (to_shoot, to_seed).",
                &["direction"],
            ),
            limit_hits: counter_vec(
                reg,
                "seedgate_tunnel_stream_limit_hits_total",
                "Streams refused because a limit was reached, by limit.",
                &["limit"],
            ),
            moves: counter_vec(
                reg,
                "seedgate_tunnel_move_notices_total",
                "Move notices received from servers, by server.",
                &["server"],
            ),
            server_sessions: gauge_vec(
                reg,
                "seedgate_agent_server_sessions",
                "Sessions up to distinct replicas behind a configured server name.",
                &["server"],
            ),
            server_sessions_expected: gauge_vec(
                reg,
                "seedgate_agent_server_sessions_expected",
                "Replicas behind a configured server name, as the newest announcement says (1 if none announces).",
                &["server"],
            ),
            duplicates: counter_vec(
                reg,
                "seedgate_agent_duplicate_sessions_total",
                "Sessions closed because they reached a replica another session already held, by server name.",
                &["server"],
            ),
            transport: gauge_vec(
                reg,
                "seedgate_tunnel_transport_info",
                "1 for the transport (h2 or quic) of the live session to a server, by server.",
                &["server", "transport"],
            ),
            transport_changes: counter_vec(
                reg,
                "seedgate_tunnel_transport_changes_total",
                "transport auto: sessions dialled over h2 because QUIC did not get through (from quic, to h2), and moves of a session from h2 to QUIC (from h2, to quic), by server.",
                &["server", "from", "to"],
            ),
        }
    }
}

/// State shared by all sessions of the agent.
pub struct Tunnel {
    pub cfg: ArcSwap<TunnelCfg>,
    pub metrics: TunnelMetrics,
    /// The agent's certificate and the servers' CA, reloaded when the files change.
    tls: ArcSwap<ClientTls>,
    tls_metrics: TlsMetrics,
    /// Streams open across all sessions (the `max_streams` limit applies to the sum).
    active: AtomicUsize,
    /// The replicas behind each configured server name, and what each slot holds.
    names: Mutex<Vec<Name>>,
    /// Set by [`Tunnel::start`]: the shutdown token and tracker new name loops run under.
    run: Mutex<Option<(CancellationToken, TaskTracker)>>,
    /// The shutdown grace is over: live streams end now.
    kill: CancellationToken,
}

/// One configured server name and the loop keeping its sessions.
struct Name {
    configured: HostPort,
    replicas: Arc<Replicas>,
    /// Ends the name's loop: its sessions get GOAWAY, their streams run to their end.
    stop: CancellationToken,
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

/// The tunnel's client TLS material and the watcher that reloads it.
struct ClientTls {
    material: Arc<Reloading<rustls::ClientConfig>>,
    /// Stops the watcher when other files replace these (a config reload).
    watching: CancellationToken,
}

impl Drop for ClientTls {
    fn drop(&mut self) {
        self.watching.cancel();
    }
}

fn client_tls(cfg: &TunnelCfg, metrics: &TlsMetrics) -> Result<ClientTls, proxy_core::tls::TlsError> {
    let t = &cfg.tls;
    let material =
        tls_watch::client("tunnel", t.ca.as_ref(), t.cert.as_ref(), t.key.as_ref(), &[ALPN_V1], true, metrics)?;
    Ok(ClientTls { material, watching: CancellationToken::new() })
}

fn node_name(cfg: &TunnelCfg) -> String {
    cfg.node_name
        .clone()
        .or_else(|| std::env::var("NODE_NAME").ok())
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok().map(|s| s.trim().to_owned()))
        .unwrap_or_default()
}

impl Tunnel {
    pub fn new(
        cfg: TunnelCfg,
        reg: &Registry,
        kill: CancellationToken,
    ) -> Result<Arc<Self>, proxy_core::tls::TlsError> {
        let tls_metrics = TlsMetrics::new(reg);
        let tls = client_tls(&cfg, &tls_metrics)?;
        Ok(Arc::new(Self {
            tls: ArcSwap::from_pointee(tls),
            tls_metrics,
            cfg: ArcSwap::from_pointee(cfg),
            metrics: TunnelMetrics::new(reg),
            active: AtomicUsize::new(0),
            names: Mutex::new(Vec::new()),
            run: Mutex::new(None),
            kill,
        }))
    }

    /// Take a reloaded tunnel config (allowlist, timeouts, TLS file paths) for new sessions and
    /// streams. Changed TLS contents need no reload: they are watched. A server name added to
    /// `servers` gets its sessions now; one removed has its sessions closed with GOAWAY (their
    /// streams run to their end); names in both are untouched.
    pub fn reconfigure(self: &Arc<Self>, cfg: TunnelCfg) -> Result<(), String> {
        if cfg.tls != self.cfg.load().tls {
            let tls = client_tls(&cfg, &self.tls_metrics).map_err(|e| format!("tunnel.tls: {e}"))?;
            tls.material.watch(tls.watching.clone());
            self.tls.store(Arc::new(tls));
        }
        let servers = cfg.servers.clone();
        self.cfg.store(Arc::new(cfg));
        let run = self.run.lock().expect("not poisoned").clone();
        if let Some((stop, tracker)) = run {
            let mut names = self.names.lock().expect("not poisoned");
            names.retain(|n| {
                let kept = servers.contains(&n.configured);
                if !kept {
                    tracing::info!(server = %n.configured, "server removed from tunnel.servers: its sessions get GOAWAY, their streams run to their end");
                    n.stop.cancel();
                    self.forget_metrics(n);
                }
                kept
            });
            let added: Vec<HostPort> =
                servers.into_iter().filter(|s| !names.iter().any(|n| &n.configured == s)).collect();
            drop(names);
            for server in added {
                tracing::info!(%server, "server added to tunnel.servers");
                self.add_name(server, &stop, &tracker);
            }
        }
        Ok(())
    }

    /// Start the loop that keeps a session to each replica behind `server`.
    fn add_name(self: &Arc<Self>, server: HostPort, stop: &CancellationToken, tracker: &TaskTracker) {
        let name = server.to_string();
        let m = &self.metrics;
        let replicas = Arc::new(Replicas::new(
            name.clone(),
            m.server_sessions.with_label_values(&[&name]),
            m.server_sessions_expected.with_label_values(&[&name]),
        ));
        let stop = stop.child_token();
        self.names.lock().expect("not poisoned").push(Name {
            configured: server.clone(),
            replicas: replicas.clone(),
            stop: stop.clone(),
        });
        tokio::spawn(name_loop(self.clone(), replicas, server, stop, tracker.clone()));
    }

    /// A removed name's gauges go (its counters stay: they are history).
    fn forget_metrics(&self, n: &Name) {
        let m = &self.metrics;
        let name = n.configured.to_string();
        let _ = m.server_sessions.remove_label_values(&[&name]);
        let _ = m.server_sessions_expected.remove_label_values(&[&name]);
        for slot in 0..n.replicas.slots() {
            let label = if slot == 0 { name.clone() } else { format!("{name}#{slot}") };
            let _ = m.sessions.remove_label_values(&[&label]);
            for transport in ["h2", "quic"] {
                let _ = m.transport.remove_label_values(&[&label, transport]);
            }
        }
    }

    /// One check per configured server name: ready while a session is up, "degraded" while
    /// fewer replicas than announced are reached.
    pub fn ready_checks(&self) -> Vec<proxy_core::admin::Check> {
        let transport = self.cfg.load().transport.as_str();
        self.names
            .lock()
            .expect("not poisoned")
            .iter()
            .map(|n| {
                let mut c = n.replicas.check();
                c.detail = format!("{} (transport {transport})", c.detail);
                c
            })
            .collect()
    }

    /// Start, per configured server name, the loop that keeps a session to each of its replicas.
    pub fn start(self: &Arc<Self>, stop: CancellationToken, tracker: TaskTracker) {
        let tls = self.tls.load();
        tls.material.watch(tls.watching.clone());
        *self.run.lock().expect("not poisoned") = Some((stop.clone(), tracker.clone()));
        for server in self.cfg.load().servers.clone() {
            self.add_name(server, &stop, &tracker);
        }
    }
}

/// What a session's handler has seen: the HTTP/2 handshake passed, and the replica's announcement.
#[derive(Debug, Clone, Default, PartialEq)]
struct SessionState {
    up: bool,
    info: Option<ServerInfo>,
}

/// A session being served in its own task.
struct Live {
    target: HostPort,
    peer: SocketAddr,
    /// Cancel to send GOAWAY: the seed opens no new stream; streams in flight continue.
    stop: CancellationToken,
    /// Cancel to end the session's streams now.
    kill: CancellationToken,
    done: tokio::task::JoinHandle<Result<(), String>>,
    since: Instant,
    /// What the handler reports; the slot acts on each change.
    state: watch::Receiver<SessionState>,
    /// The part of `state` the slot has acted on.
    seen: SessionState,
    /// The handler (the sender of `state`) is dropped: nothing more will change.
    handler_gone: bool,
    /// Not the slot's first attempt: its outcome counts as a reconnect.
    reconnect: bool,
    /// What the session runs over (never `Auto`).
    transport: Transport,
}

/// Connect and handshake with `target` (resolved afresh).
async fn establish(t: &Tunnel, target: &HostPort) -> Result<(Box<dyn AgentConnection>, SocketAddr), String> {
    let cfg = t.cfg.load_full();
    let timeout = cfg.dial_timeout.get();
    let (tcp, addr) =
        proxy_core::net::connect_host(target, timeout).await.map_err(|e| format!("connect {target}: {e}"))?;
    let name = cfg.tls.server_name.clone().unwrap_or_else(|| target.host.clone());
    let sni =
        rustls::pki_types::ServerName::try_from(name.clone()).map_err(|e| format!("server_name {name:?}: {e}"))?;
    let connector = TlsConnector::from(t.tls.load().material.current());
    let tls = tokio::time::timeout(timeout, connector.connect(sni, tcp))
        .await
        .map_err(|_| format!("TLS handshake with {addr} timed out"))?
        .map_err(|e| match proxy_core::tls::hint_for(&e, &proxy_core::tls::AGENT_TUNNEL) {
            Some(hint) => format!("TLS handshake with {addr}: {e}: {hint}"),
            None => format!("TLS handshake with {addr}: {e}"),
        })?;
    if tls.get_ref().1.alpn_protocol() != Some(ALPN_V1) {
        return Err(format!("{addr} does not speak seedgate-tunnel/1"));
    }
    Ok((Box::new(tls), addr))
}

/// Dial `target` over QUIC (UDP; resolved afresh, addresses tried in turn) and handshake. Each
/// session has its own client endpoint (its own UDP socket); quinn follows the agent when its
/// address changes (connection migration).
async fn establish_quic(
    t: &Tunnel,
    target: &HostPort,
    timeout: Duration,
) -> Result<(Box<dyn AgentConnection>, SocketAddr), String> {
    let cfg = t.cfg.load_full();
    let name = cfg.tls.server_name.clone().unwrap_or_else(|| target.host.clone());
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(t.tls.load().material.current())
        .map_err(|e| format!("tunnel TLS material unusable for QUIC: {e}"))?;
    let mut client = quinn::ClientConfig::new(Arc::new(crypto));
    client.transport_config(Arc::new(quic::transport_config(&settings(&cfg))));
    let addrs: Vec<SocketAddr> = tokio::time::timeout(timeout, tokio::net::lookup_host(target.to_string()))
        .await
        .map_err(|_| format!("resolve {target}: timed out"))?
        .map_err(|e| format!("resolve {target}: {e}"))?
        .collect();
    let mut last = format!("resolve {target}: no address");
    for addr in addrs {
        let local: SocketAddr = if addr.is_ipv4() {
            (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
        } else {
            (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
        };
        let endpoint = quic::endpoint(local, &settings(&cfg), None, "tunnel QUIC session", "tunnel.connection_window")
            .map_err(|e| format!("QUIC socket: {e}"))?;
        let connecting = match endpoint.connect_with(client.clone(), addr, &name) {
            Ok(c) => c,
            Err(e) => {
                last = format!("QUIC connect {addr}: {e}");
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
                    return Err(format!("{addr} does not speak seedgate-tunnel/1"));
                }
                return Ok((Box::new(conn), addr));
            }
            Ok(Err(e)) => {
                last = match proxy_core::tls::hint_for(&e, &proxy_core::tls::AGENT_TUNNEL) {
                    Some(hint) => format!("QUIC handshake with {addr}: {e}: {hint}"),
                    None => format!("QUIC handshake with {addr}: {e}"),
                }
            }
            Err(_) => last = format!("QUIC handshake with {addr} timed out"),
        }
    }
    Err(last)
}

/// Everything a slot's sessions share.
struct SlotCtx {
    t: Arc<Tunnel>,
    replicas: Arc<Replicas>,
    slot: usize,
    label: String,
    moves: mpsc::Sender<ControlMsg>,
    stop: CancellationToken,
    tracker: TaskTracker,
}

impl SlotCtx {
    /// Connect to `target` and run a session there. `reconnect`: not the slot's first attempt
    /// (counted in `seedgate_tunnel_reconnects_total` once the session is up or has failed).
    async fn connect(&self, target: &HostPort, reconnect: bool) -> Result<Live, String> {
        self.connect_over(target, reconnect, self.t.cfg.load().transport).await
    }

    /// [`Self::connect`] over `transport`; `Auto` tries QUIC for `quic_timeout`, then h2.
    async fn connect_over(&self, target: &HostPort, reconnect: bool, transport: Transport) -> Result<Live, String> {
        let cfg = self.t.cfg.load_full();
        let ((conn, peer), transport) = match transport {
            Transport::H2 => (establish(&self.t, target).await?, Transport::H2),
            Transport::Quic => {
                // Under `auto` this is a probe from h2: it gets the (short) QUIC timeout too.
                let timeout =
                    if cfg.transport == Transport::Auto { cfg.quic_timeout.get() } else { cfg.dial_timeout.get() };
                (establish_quic(&self.t, target, timeout).await?, Transport::Quic)
            }
            Transport::Auto => match establish_quic(&self.t, target, cfg.quic_timeout.get()).await {
                Ok(q) => (q, Transport::Quic),
                Err(e) => {
                    tracing::info!(server = %self.label, target = %target, error = %e, "transport auto: QUIC did not get through; using h2");
                    let h2 = establish(&self.t, target).await?;
                    self.t.metrics.transport_changes.with_label_values(&[&self.label, "quic", "h2"]).inc();
                    (h2, Transport::H2)
                }
            },
        };
        let stop = self.stop.child_token();
        let kill = self.t.kill.child_token();
        let (state_tx, state) = watch::channel(SessionState::default());
        let handler: Arc<dyn AgentHandler> = Arc::new(Handler {
            t: self.t.clone(),
            server: self.label.clone(),
            moves: self.moves.clone(),
            kill: kill.clone(),
            state: state_tx,
        });
        let settings = settings(&self.t.cfg.load());
        let (st, tracker) = (stop.clone(), self.tracker.clone());
        let done = tokio::spawn(async move {
            let session = AgentSession { settings: &settings, handler, stop: st, tracker };
            // With TLS 1.3 the server checks our certificate after our side of the handshake is
            // done: its refusal arrives as an alert on the session's first read.
            run_agent_session(conn, session).await.map_err(|e| {
                match proxy_core::tls::hint_for(&e, &proxy_core::tls::AGENT_TUNNEL) {
                    Some(hint) => format!("{e}: {hint}"),
                    None => e.to_string(),
                }
            })
        });
        tracing::debug!(server = %self.label, target = %target, %peer, transport = transport.as_str(), "TLS up; waiting for the seed's first stream");
        Ok(Live {
            target: target.clone(),
            peer,
            stop,
            kill,
            done,
            since: Instant::now(),
            state,
            seen: SessionState::default(),
            handler_gone: false,
            reconnect,
            transport,
        })
    }

    /// Act on what the session's handler reported since last time. Returns `false` when the
    /// session must go: it reached a replica another slot already holds.
    fn observe(&self, cur: &mut Live) -> bool {
        let now = cur.state.borrow_and_update().clone();
        if now.up && !cur.seen.up {
            let (server, target, peer) = (&self.label, &cur.target, cur.peer);
            let transport = cur.transport;
            tracing::info!(%server, %target, %peer, transport = transport.as_str(), "tunnel session up");
            self.replicas.up(self.slot, &format!("session up to {target} ({peer}) over {}", transport.as_str()));
            self.t.metrics.sessions.with_label_values(&[server]).set(1);
            for t in [Transport::H2, Transport::Quic] {
                self.t.metrics.transport.with_label_values(&[server, t.as_str()]).set(i64::from(t == transport));
            }
            if cur.reconnect {
                self.t.metrics.reconnects.with_label_values(&[server.as_str(), "ok"]).inc();
            }
        }
        let mut keep = true;
        if let Some(info) = now.info.as_ref().filter(|i| cur.seen.info.as_ref() != Some(*i)) {
            match self.replicas.announced(self.slot, info) {
                Verdict::Keep => {
                    tracing::info!(server = %self.label, id = %info.id, count = info.count, draining = info.draining, "server replica announced");
                }
                Verdict::Duplicate => {
                    tracing::info!(server = %self.label, id = %info.id, "session reached a replica another session holds; closing it and dialing again");
                    self.t.metrics.duplicates.with_label_values(&[&self.replicas.name]).inc();
                    keep = false;
                }
            }
        }
        cur.seen = now;
        keep
    }

    /// The slot's session is gone (ended, or given up as a duplicate).
    fn lost(&self, detail: &str) {
        self.replicas.down(self.slot, detail);
        self.t.metrics.sessions.with_label_values(&[&self.label]).set(0);
    }

    /// Open a session to the name and wait until its replica announced itself: a replacement
    /// for a session to a draining replica. Kept only if it reached a replica not draining and
    /// not held by another slot (a server that announces nothing is taken as it is).
    /// `transport`: what to dial over (the configured one, or QUIC when moving up from h2).
    async fn candidate(&self, name: &HostPort, transport: Transport) -> Option<Live> {
        let wait = self.t.cfg.load().dial_timeout.get();
        let mut c = match self.connect_over(name, true, transport).await {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(server = %self.label, error = %e, "no replacement session yet");
                return None;
            }
        };
        let deadline = tokio::time::Instant::now() + wait;
        let info = loop {
            if let Some(i) = c.state.borrow_and_update().info.clone() {
                break Some(i);
            }
            tokio::select! {
                r = c.state.changed() => if r.is_err() { break None },
                _ = tokio::time::sleep_until(deadline) => break None,
            }
        };
        let good = match &info {
            Some(i) => self.replicas.acceptable(self.slot, i),
            // A server that announces nothing (an older version) is taken once the session is up.
            None => c.state.borrow().up && !c.done.is_finished(),
        };
        if good {
            Some(c)
        } else {
            tracing::debug!(server = %self.label, id = ?info.as_ref().map(|i| &i.id), "replacement reached a replica already held or draining; trying again later");
            c.seen.info = info;
            // No deadline: the seed may already have opened a stream on it (a fresh session is
            // the least busy one); GOAWAY stops new ones, and the session closes when those end.
            retire(&self.label, c, None, "replacement candidate not kept; closing it");
            None
        }
    }
}

/// End a replaced session make-before-break: GOAWAY now (the seed can open no new stream on
/// it), let its streams finish for `drain` (or until the server ends them, with `None`), then
/// end what is left and close it.
fn retire(label: &str, old: Live, drain: Option<Duration>, why: &'static str) {
    let label = label.to_owned();
    let id = old.seen.info.as_ref().map(|i| i.id.clone()).unwrap_or_default();
    tracing::info!(server = %label, target = %old.target, peer = %old.peer, %id, drain = ?drain, "{why}");
    old.stop.cancel();
    tokio::spawn(async move {
        let mut done = old.done;
        let finished = match drain {
            Some(d) => tokio::time::timeout(d, &mut done).await.is_ok(),
            None => {
                let _ = (&mut done).await;
                true
            }
        };
        if !finished {
            old.kill.cancel();
            if tokio::time::timeout(Duration::from_secs(5), &mut done).await.is_err() {
                // Bounded: the session is dropped (its TLS connection closed) regardless.
                done.abort();
            }
        }
        tracing::info!(server = %label, target = %old.target, %id, "retired tunnel session closed");
    });
}

/// The wait before the next QUIC probe: between ¾ of `interval` and all of it (jitter, so that
/// agents that fell back at the same moment do not probe in step).
fn probe_wait(interval: Duration) -> Duration {
    interval.mul_f64(0.5) + Backoff::new(interval / 2, interval / 2).next_wait()
}

/// Longest wait between attempts to reach one more replica while the ones reached answer:
/// after a duplicate, or while looking for a draining replica's replacement.
const PROBE_MAX: Duration = Duration::from_secs(5);

/// Keep as many slots for one configured name as its replicas announce (up to the maximum).
async fn name_loop(
    t: Arc<Tunnel>,
    replicas: Arc<Replicas>,
    configured: HostPort,
    stop: CancellationToken,
    tracker: TaskTracker,
) {
    let mut changed = replicas.subscribe();
    loop {
        while (replicas.slots() as u32) < replicas.count() {
            let slot = replicas.add_slot();
            tokio::spawn(slot_loop(
                t.clone(),
                replicas.clone(),
                slot,
                configured.clone(),
                stop.clone(),
                tracker.clone(),
            ));
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            r = changed.changed() => if r.is_err() { return },
        }
    }
}

/// Keep one session of a configured name up while the name's replicas want one more. After a
/// session ends, reconnect with exponential back-off and jitter, resolving the name afresh on
/// every attempt. On a move notice from the server, or when the server name starts resolving
/// to other addresses, or when the replica announces it is draining, open a session to the new
/// place first and only then retire the old one (make-before-break).
async fn slot_loop(
    t: Arc<Tunnel>,
    replicas: Arc<Replicas>,
    slot: usize,
    configured: HostPort,
    stop: CancellationToken,
    tracker: TaskTracker,
) {
    let label = if slot == 0 { configured.to_string() } else { format!("{configured}#{slot}") };
    let (moves, mut moves_rx) = mpsc::channel(4);
    let ctx = SlotCtx {
        t: t.clone(),
        replicas: replicas.clone(),
        slot,
        label: label.clone(),
        moves,
        stop: stop.clone(),
        tracker,
    };
    t.metrics.sessions.with_label_values(&[&label]).set(0);
    let mut wanted = replicas.subscribe();
    let mut target = configured.clone();
    let mut live: Option<Live> = None;
    let rc = t.cfg.load().reconnect.clone();
    let mut backoff = Backoff::new(rc.initial.get(), rc.max.get());
    // Retries after reaching a replica already held (or a draining one): the server answered,
    // so this is not a failure to back off from for long; a replica that just came up should
    // be found within seconds.
    let mut probe = Backoff::new(rc.initial.get(), rc.max.get().min(PROBE_MAX));
    let mut first = true;
    let mut reresolve = tokio::time::interval(t.cfg.load().keepalive.interval.get());
    reresolve.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // When a session's replica is draining: the next attempt to find a replacement.
    let mut replace_at: Option<tokio::time::Instant> = None;
    // transport auto, while the session runs over h2: the next try to move it to QUIC.
    let mut upgrade_at: Option<tokio::time::Instant> = None;
    loop {
        if stop.is_cancelled() {
            return;
        }
        let cfg = t.cfg.load_full();
        let Some(cur) = live.as_mut() else {
            if !replicas.wants_session(slot) {
                // Enough sessions to distinct replicas: wait until one goes or the count grows.
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = wanted.changed() => {}
                }
                continue;
            }
            match ctx.connect(&target, !first).await {
                Ok(l) => live = Some(l),
                Err(e) => {
                    tracing::warn!(server = %label, target = %target, error = %e, "tunnel session failed");
                    ctx.lost(&format!("not connected: {e}"));
                    if !first {
                        t.metrics.reconnects.with_label_values(&[label.as_str(), "failed"]).inc();
                    }
                    // A move target that does not answer is not kept: fall back to the name.
                    target = configured.clone();
                    backoff.set_bounds(cfg.reconnect.initial.get(), cfg.reconnect.max.get());
                    let wait = backoff.next_wait();
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(wait) => {}
                    }
                }
            }
            first = false;
            continue;
        };
        if cfg.transport == Transport::Auto && cur.transport == Transport::H2 {
            if upgrade_at.is_none() {
                upgrade_at = Some(tokio::time::Instant::now() + probe_wait(cfg.quic_probe_interval.get()));
            }
        } else {
            upgrade_at = None;
        }
        tokio::select! {
            r = &mut cur.done => {
                let lived = cur.since.elapsed();
                let (was_up, reconnect) = (cur.seen.up || cur.state.borrow().up, cur.reconnect);
                live = None;
                replace_at = None;
                upgrade_at = None;
                ctx.lost("not connected");
                match r {
                    Ok(Ok(())) => tracing::info!(server = %label, "tunnel session closed"),
                    // TLS passed on our side but the seed never spoke HTTP/2: typically it refused
                    // our certificate (its verdict arrives after our side of the handshake).
                    Ok(Err(e)) if !was_up => tracing::warn!(server = %label, error = %e, "tunnel session failed before it was up (is this agent's certificate accepted by the server?)"),
                    Ok(Err(e)) => tracing::warn!(server = %label, error = %e, "tunnel session ended"),
                    Err(e) => tracing::warn!(server = %label, error = %e, "tunnel session task failed"),
                }
                if !was_up && reconnect {
                    t.metrics.reconnects.with_label_values(&[label.as_str(), "failed"]).inc();
                }
                // A session that stayed up a while resets the back-off: the next failure is fresh.
                backoff.set_bounds(cfg.reconnect.initial.get(), cfg.reconnect.max.get());
                if lived > cfg.reconnect.max.get() {
                    backoff.reset();
                }
                let wait = backoff.next_wait();
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(wait) => {}
                }
            }
            r = cur.state.changed(), if !cur.handler_gone => {
                if r.is_err() {
                    // The session task is ending: its `done` branch follows.
                    cur.handler_gone = true;
                    continue;
                }
                if !ctx.observe(cur) {
                    let dup = live.take().expect("live");
                    // No deadline, as for a candidate: streams the seed opened on it run to their end.
                    retire(&label, dup, None, "closing the duplicate session");
                    // Dial the same place again (a move target stays the target: behind it is the
                    // replica set the slot was sent to); a failed connect falls back to the name.
                    ctx.lost("closed a duplicate session; dialing again");
                    probe.set_bounds(cfg.reconnect.initial.get(), cfg.reconnect.max.get().min(PROBE_MAX));
                    let wait = probe.next_wait();
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(wait) => {}
                    }
                    continue;
                }
                if cur.seen.up {
                    backoff.reset();
                }
                if cur.seen.info.is_some() {
                    probe.reset();
                }
                let draining = cur.seen.info.as_ref().is_some_and(|i| i.draining);
                if draining && replace_at.is_none() {
                    tracing::info!(server = %label, target = %cur.target, "replica is draining: keeping its live streams, looking for a replacement");
                    replace_at = Some(tokio::time::Instant::now());
                }
            }
            _ = tokio::time::sleep_until(upgrade_at.unwrap_or_else(tokio::time::Instant::now)), if upgrade_at.is_some() && replace_at.is_none() => {
                upgrade_at = None;
                if !cur.seen.up {
                    continue;
                }
                // The same place the h2 session reached; kept if it reached that replica (or
                // another one no other slot holds, not draining).
                let place = cur.target.clone();
                match ctx.candidate(&place, Transport::Quic).await {
                    Some(new) => {
                        let old = live.replace(new).expect("live");
                        // Make-before-break, as for re-homing: GOAWAY on the h2 session, whose
                        // streams run to their end.
                        retire(&label, old, None, "transport auto: QUIC gets through now; moved the session to QUIC, the h2 session's streams finish there");
                        t.metrics.transport_changes.with_label_values(&[label.as_str(), "h2", "quic"]).inc();
                        let cur = live.as_mut().expect("live");
                        ctx.replicas.down(slot, "moving to QUIC");
                        ctx.observe(cur);
                    }
                    None => tracing::debug!(server = %label, target = %place, "transport auto: QUIC still does not get through; staying on h2"),
                }
            }
            _ = tokio::time::sleep_until(replace_at.unwrap_or_else(tokio::time::Instant::now)), if replace_at.is_some() => {
                if !replicas.wants_session(slot) {
                    // The other sessions already reach as many replicas as announced.
                    replace_at = Some(tokio::time::Instant::now() + probe.next_wait());
                    continue;
                }
                match ctx.candidate(&configured, cfg.transport).await {
                    Some(new) => {
                        replace_at = None;
                        probe.reset();
                        let old = live.replace(new).expect("live");
                        // The draining replica ends the old session's streams at its own deadline.
                        retire(&label, old, None, "replica draining: replaced; its streams finish there");
                        target = configured.clone();
                        let cur = live.as_mut().expect("live");
                        ctx.replicas.down(slot, "re-homing");
                        ctx.observe(cur);
                    }
                    None => replace_at = Some(tokio::time::Instant::now() + probe.next_wait()),
                }
            }
            Some(msg) = moves_rx.recv() => {
                let ControlMsg::Move { to, drain_deadline_ms } = msg else { continue };
                let next = to.iter().find_map(|s| s.parse::<HostPort>().ok()).unwrap_or_else(|| configured.clone());
                let drain = (drain_deadline_ms > 0).then(|| Duration::from_millis(drain_deadline_ms));
                t.metrics.moves.with_label_values(&[&label]).inc();
                // A notice that reaches us after we already moved there (e.g. DNS got us there
                // first, and the old session delivered the notice late) changes nothing.
                let already = tokio::time::timeout(cfg.dial_timeout.get(), proxy_core::net::resolve(&next))
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .is_some_and(|addrs| addrs.contains(&cur.peer));
                if already {
                    tracing::info!(server = %label, to = %next, "move notice: already connected there");
                    continue;
                }
                tracing::info!(server = %label, from = %cur.target, to = %next, "move notice: re-homing");
                if let Some(target_now) = rehome(&ctx, &mut live, next, drain).await {
                    target = target_now;
                }
            }
            _ = reresolve.tick(), if cur.target.socket_addr().is_none() => {
                // Follow DNS: the name we dialled no longer includes the address we are on.
                let name = cur.target.clone();
                let peer = cur.peer;
                if let Ok(Ok(addrs)) = tokio::time::timeout(cfg.dial_timeout.get(), proxy_core::net::resolve(&name)).await
                    && !addrs.is_empty() && !addrs.contains(&peer) {
                        tracing::info!(server = %label, %name, old = %peer, new = ?addrs, "server name resolves elsewhere: re-homing");
                        t.metrics.moves.with_label_values(&[&label]).inc();
                        if let Some(target_now) = rehome(&ctx, &mut live, name, Some(cfg.rehome_drain.get())).await {
                            target = target_now;
                        }
                    }
            }
            _ = stop.cancelled() => return,
        }
    }
}

/// Make-before-break: connect to `next`; only once that session is up is the current one
/// retired. If `next` cannot be reached the current session stays (returns `None`).
async fn rehome(ctx: &SlotCtx, live: &mut Option<Live>, next: HostPort, drain: Option<Duration>) -> Option<HostPort> {
    match ctx.connect(&next, true).await {
        Ok(new) => {
            if let Some(old) = live.replace(new) {
                retire(&ctx.label, old, drain, "tunnel session replaced; draining the old one");
            }
            ctx.replicas.down(ctx.slot, "re-homing");
            Some(next)
        }
        Err(e) => {
            tracing::warn!(server = %ctx.label, target = %next, error = %e, "cannot reach the new server; staying on the current session");
            None
        }
    }
}

struct Handler {
    t: Arc<Tunnel>,
    server: String,
    moves: mpsc::Sender<ControlMsg>,
    /// Ends this session's streams (re-homing drain deadline, or the shutdown grace).
    kill: CancellationToken,
    /// What the slot acts on: the session is up, the replica announced itself.
    state: watch::Sender<SessionState>,
}

impl AgentHandler for Handler {
    fn incoming(&self, inc: Incoming) -> BoxFuture<'static, ()> {
        Box::pin(serve_stream(self.t.clone(), self.server.clone(), self.kill.clone(), inc))
    }

    fn control(&self, msg: ControlMsg) {
        match msg {
            ControlMsg::Refused { reason } => {
                tracing::error!(server = %self.server, %reason, "proxy-server refused this agent's session");
            }
            ControlMsg::Server(info) => self.state.send_modify(|s| s.info = Some(info)),
            msg @ ControlMsg::Move { .. } => {
                tracing::info!(server = %self.server, ?msg, "control message");
                if self.moves.try_send(msg).is_err() {
                    tracing::warn!(server = %self.server, "control message dropped: a move is already being handled");
                }
            }
        }
    }

    fn hello(&self) -> AgentHello {
        // From the config in force: a reload of `node_name` shows in the next session's hello.
        AgentHello { node: node_name(&self.t.cfg.load()), version: env!("CARGO_PKG_VERSION").into() }
    }

    fn established(&self) {
        self.state.send_modify(|s| s.up = true);
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
        return if allowed(allow, sa) {
            Ok(vec![sa])
        } else {
            Err(DialError::NotAllowed(format!("{target} is not on the agent's allowlist")))
        };
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

async fn serve_stream(t: Arc<Tunnel>, server: String, kill: CancellationToken, inc: Incoming) {
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
    // Counted once above (the limit check); released with the stream.
    let _slot = (Active::new(m.streams_active.clone()), Active::adopt(&t.active));
    let timeout = cfg.dial_timeout.get();
    let dialled = async {
        let addrs = resolve_allowed(&cfg.allow, &target, timeout).await?;
        connect_in_turn(&addrs, addrs.len(), timeout, |_, _| {}).await.map_err(|e| connect_failed(&target, &e))
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
    let meters = Meters {
        to_upstream: Some(m.bytes.with_label_values(&["to_shoot"])),
        to_client: Some(m.bytes.with_label_values(&["to_seed"])),
    };
    let mut relay = transfer(stream, tcp, cfg.idle_timeout.get(), meters);
    // The session's kill token: its re-homing drain passed, or the shutdown grace is over.
    let stop = std::pin::pin!(relay::stop_on(&kill, &t.kill, Stop::SessionDrained));
    let done = relay::run(&mut relay, stop).await;
    proxy_core::access_event!(
        "stream closed", done.bytes, started, done.outcome.label();
        server = %server, target = %target, upstream = %addr
    );
}
