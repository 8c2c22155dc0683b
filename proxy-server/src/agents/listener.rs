//! The agents' listeners — TCP (TLS 1.3, a client certificate asked) and QUIC — their TLS material (reloaded from its files, its revocation lists followed), and how a reload moves them.
//!
//! A reload binds what needs a new socket first (if a bind fails, nothing changes), then swaps
//! in what new sessions use. Sessions on a moved or removed listener are never cut: they end by
//! themselves, or with `sessions_stop` after the front ends drained.

use super::admit::{accept_quic, accept_tls};
use super::replica::server_id;
use super::wing::{Agents, tunnel_settings};
use crate::shared::{Tls, client_files};
use arc_swap::ArcSwap;
use proxy_core::app::{StartError, listen_tcp, resolve_listen};
use proxy_core::net::accept::{ConnLimit, Slots, UNLIMITED, accept_error_label, accept_loop};
use proxy_core::sync::Mutex;
use proxy_core::tunnel::ALPN_V1;
use proxy_core::tunnel::quic::{self, congestion::CongestionStats};
use proxy_core::watch::{
    self,
    tls::{Reloading, TlsMetrics},
};
use seedgate_config::server::ServerTls;
use seedgate_config::{HostPort, ServerConfig};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// What the agents' listener's TLS is made of: the files, and whether an agent may come
/// without a certificate (with a token alone).
#[derive(Clone, PartialEq)]
struct AgentsTls {
    tls: ServerTls,
    optional: bool,
}

impl AgentsTls {
    fn of(cfg: &ServerConfig) -> Self {
        let optional = cfg.agents.auth.certificate_optional()
            || cfg.clusters.values().any(|c| c.agent_auth.is_some_and(|a| a.certificate_optional()));
        Self { tls: cfg.agents.tls.clone(), optional }
    }
}

fn agents_tls(a: &AgentsTls, m: &TlsMetrics) -> Result<Arc<Reloading<rustls::ServerConfig>>, StartError> {
    let t = &a.tls;
    let client = client_files(t, a.optional);
    Ok(watch::tls::server("agents", t.cert.as_ref(), t.key.as_ref(), client, &[ALPN_V1], true, m)?)
}

/// Follow the agents' material: the sessions a reloaded revocation list names end.
fn follow_revocations(agents: &Arc<Agents>, tls: &Tls) {
    super::revocation::follow(agents, &tls.material, tls.watching.clone());
}

/// The agents' TCP listener.
struct TcpEntry {
    listen: HostPort,
    addr: String,
    tls_cfg: AgentsTls,
    tls: Arc<ArcSwap<Tls>>,
    stop: CancellationToken,
}

/// The agents' QUIC listener.
struct QuicEntry {
    listen: HostPort,
    addr: String,
    /// Stops accepting; sessions made on it continue until `sessions_stop`.
    stop: CancellationToken,
}

/// The agents' sockets: what each serves, from [`Listeners::bind`] on (so the addresses are
/// known before serving); the accept loops run from [`Listeners::start`].
pub(crate) struct Listeners {
    metrics: TlsMetrics,
    entries: Mutex<Entries>,
}

struct Entries {
    tcp: TcpEntry,
    quic: Option<QuicEntry>,
}

/// The sockets [`Listeners::bind`] opened, served by [`Listeners::start`].
pub(crate) struct Opened {
    tcp: TcpListener,
    quic: Option<quinn::Endpoint>,
}

/// What a reload needs that could fail, taken before anything changes: new TLS material, new
/// sockets.
pub(crate) struct Staged {
    material: Option<Arc<Reloading<rustls::ServerConfig>>>,
    tcp: Option<(TcpListener, SocketAddr)>,
    /// A new or moved QUIC listener: its endpoint, its place and its address.
    quic: Option<(quinn::Endpoint, HostPort, String)>,
}

impl Listeners {
    /// Bind the agents' sockets of `cfg` and read their TLS files (a bad file fails the start).
    /// `stop` (the process's) ends what each entry runs.
    pub(crate) async fn bind(
        cfg: &ServerConfig,
        metrics: &TlsMetrics,
        stop: &CancellationToken,
    ) -> Result<(Self, Opened), StartError> {
        let tls_cfg = AgentsTls::of(cfg);
        let material = agents_tls(&tls_cfg, metrics)?;
        let (sock, addr) = listen_tcp("agents listener", &cfg.agents.listen).await?;
        let tcp = TcpEntry {
            listen: cfg.agents.listen.clone(),
            addr: addr.to_string(),
            tls_cfg,
            tls: Arc::new(ArcSwap::from_pointee(Tls::watched(material.clone(), stop))),
            stop: stop.child_token(),
        };
        let (mut quic, mut quic_sock) = (None, None);
        if let Some(q) = &cfg.agents.quic {
            let (endpoint, addr) = listen_quic(&q.listen, &material, cfg).await?;
            quic = Some(QuicEntry { listen: q.listen.clone(), addr: addr.to_string(), stop: stop.child_token() });
            quic_sock = Some(endpoint);
        }
        let this = Self { metrics: metrics.clone(), entries: Mutex::new(Entries { tcp, quic }) };
        Ok((this, Opened { tcp: sock, quic: quic_sock }))
    }

    /// `agents` and, with QUIC, `agents-quic`: their addresses.
    pub(crate) fn addresses(&self, out: &mut BTreeMap<String, String>) {
        let e = self.entries.lock();
        out.insert("agents".into(), e.tcp.addr.clone());
        if let Some(q) = &e.quic {
            out.insert("agents-quic".into(), q.addr.clone());
        }
    }

    /// Start the accept loops on what [`Listeners::bind`] opened. Agent sessions end with
    /// `sessions_stop` (after the front ends drained).
    pub(crate) fn start(&self, agents: &Arc<Agents>, sessions_stop: &CancellationToken, opened: Opened) {
        let e = self.entries.lock();
        follow_revocations(agents, &e.tcp.tls.load());
        serve_tcp(agents, sessions_stop, opened.tcp, &e.tcp);
        if let (Some(endpoint), Some(q)) = (opened.quic, &e.quic) {
            serve_quic(agents, sessions_stop, endpoint, e.tcp.tls.clone(), q);
        }
    }

    /// Read the TLS files and bind the sockets `new` needs, changing nothing that serves. The
    /// lock is not held while binding.
    pub(crate) async fn stage(&self, new: &ServerConfig) -> Result<Staged, StartError> {
        let (listen_now, tls_cfg_now, quic_now, material_now) = {
            let e = self.entries.lock();
            let quic = e.quic.as_ref().map(|q| q.listen.clone());
            (e.tcp.listen.clone(), e.tcp.tls_cfg.clone(), quic, e.tcp.tls.load().material.clone())
        };
        let new_tls = AgentsTls::of(new);
        let material = if new_tls != tls_cfg_now { Some(agents_tls(&new_tls, &self.metrics)?) } else { None };
        let tcp = match new.agents.listen != listen_now {
            true => Some(listen_tcp("agents listener", &new.agents.listen).await?),
            false => None,
        };
        // The QUIC listener: bound anew when added or moved (with the TLS material it will
        // serve: the new one if the agents' files changed too).
        let quic = match (&new.agents.quic, &quic_now) {
            (Some(q), now) if now.as_ref() != Some(&q.listen) => {
                let material = material.as_ref().unwrap_or(&material_now);
                let (endpoint, addr) = listen_quic(&q.listen, material, new).await?;
                Some((endpoint, q.listen.clone(), addr.to_string()))
            }
            _ => None,
        };
        Ok(Staged { material, tcp, quic })
    }

    /// Swap in what `staged` prepared: what new sessions use from now.
    pub(crate) fn commit(
        &self,
        agents: &Arc<Agents>,
        sessions_stop: &CancellationToken,
        new: &ServerConfig,
        staged: Staged,
    ) {
        let Staged { material, tcp, quic } = staged;
        let stop = &agents.shared.shutdown.stop;
        let mut e = self.entries.lock();
        let e = &mut *e;
        let a = &mut e.tcp;
        if let Some(m) = material {
            let tls = Tls::watched(m, stop);
            follow_revocations(agents, &tls);
            a.tls.store(Arc::new(tls));
            a.tls_cfg = AgentsTls::of(new);
        }
        if let Some((l, addr)) = tcp {
            // The same TLS material (shared with the QUIC listener, which stays).
            let moved = TcpEntry {
                listen: new.agents.listen.clone(),
                addr: addr.to_string(),
                tls_cfg: a.tls_cfg.clone(),
                tls: a.tls.clone(),
                stop: stop.child_token(),
            };
            serve_tcp(agents, sessions_stop, l, &moved);
            let old = std::mem::replace(a, moved);
            old.stop.cancel();
            tracing::info!(old = %old.addr, new = %a.addr, "agents listener moved; sessions on the old one continue");
        }
        let old = match quic {
            Some((endpoint, listen, addr)) => {
                let entry = QuicEntry { listen, addr, stop: stop.child_token() };
                serve_quic(agents, sessions_stop, endpoint, a.tls.clone(), &entry);
                e.quic.replace(entry)
            }
            None if new.agents.quic.is_none() => e.quic.take(),
            None => None,
        };
        if let Some(old) = old {
            old.stop.cancel();
            match &e.quic {
                Some(q) => {
                    tracing::info!(old = %old.addr, new = %q.addr, "agents QUIC listener moved; sessions on the old one continue")
                }
                None => tracing::info!(addr = %old.addr, "agents QUIC listener removed; its sessions continue"),
            }
        }
    }
}

/// The quinn server config of one agent connection: the agents' current TLS material and the
/// current tunnel settings; its congestion controllers count into `stats`.
fn quic_server_config(
    tls: Arc<rustls::ServerConfig>,
    cfg: &ServerConfig,
    stats: Option<&CongestionStats>,
) -> Result<quinn::ServerConfig, quinn::crypto::rustls::NoInitialCipherSuite> {
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls)?;
    let mut sc = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    sc.transport_config(Arc::new(quic::seed_transport_config(&tunnel_settings(cfg), stats)));
    Ok(sc)
}

/// Bind the agents' QUIC listener (UDP) with the agents' TLS material.
async fn listen_quic(
    hp: &HostPort,
    material: &Reloading<rustls::ServerConfig>,
    cfg: &ServerConfig,
) -> Result<(quinn::Endpoint, SocketAddr), StartError> {
    let what = "agents QUIC listener";
    let addr = resolve_listen(what, hp).await?;
    let bind_err = |source| StartError::Bind { what: what.to_owned(), addr: hp.to_string(), source };
    // No stats: every connection is accepted with a config of its own (`accept_quic`), which has them.
    let server_config =
        quic_server_config(material.current(), cfg, None).map_err(|e| bind_err(std::io::Error::other(e)))?;
    let settings = tunnel_settings(cfg);
    // The key file outlives the process and the id names this replica: a replica restarted in
    // place resets its predecessor's sessions (see `StableKeys`). Unreadable now: keys of this
    // run only, and such sessions end at their keepalive timeout.
    let stable =
        std::fs::read(&cfg.agents.tls.key).ok().map(|secret| quic::StableKeys::derive(&secret, &server_id(cfg)));
    let server = quic::Server { config: server_config, stable };
    let endpoint = quic::endpoint(addr, &settings, Some(server), what, "agents.connection_window").map_err(bind_err)?;
    let local = endpoint.local_addr().map_err(bind_err)?;
    Ok((endpoint, local))
}

/// Serve the agents' QUIC listener until shutdown or until the entry's `stop`.
fn serve_quic(
    agents: &Arc<Agents>,
    sessions_stop: &CancellationToken,
    endpoint: quinn::Endpoint,
    tls: Arc<ArcSwap<Tls>>,
    entry: &QuicEntry,
) {
    tracing::info!(addr = %entry.addr, "agents QUIC listener up");
    tokio::spawn(accept_quic_loop(agents.clone(), sessions_stop.clone(), endpoint, tls, entry.stop.clone()));
}

/// Serve the agents' listener until shutdown or until the entry's `stop`. Agents: not counted
/// against the front-end limit, not part of the front-end drain.
fn serve_tcp(agents: &Arc<Agents>, sessions_stop: &CancellationToken, l: TcpListener, entry: &TcpEntry) {
    let errors = agents.shared.metrics.conn.accept_errors.clone();
    proxy_core::obs::metrics::at_zero(&errors, &[&["agents"], &proxy_core::net::accept::ACCEPT_ERROR_LABELS]);
    let (a, t, sessions) = (agents.clone(), entry.tls.clone(), sessions_stop.clone());
    tracing::info!(addr = %entry.addr, "agents listener up");
    tokio::spawn(accept_loop(
        l,
        ConnLimit::new(Slots::new(UNLIMITED), None),
        entry.stop.clone(),
        tokio_util::task::TaskTracker::new(),
        move |e| errors.with_label_values(&["agents", accept_error_label(e)]).inc(),
        move |tcp, peer, permit| {
            let fut = accept_tls(a.clone(), t.load().acceptor(), tcp, peer, sessions.clone());
            async move {
                fut.await;
                drop(permit);
            }
        },
    ));
}

/// Accept agents' QUIC connections until `stop`; each gets a server config built from the
/// agents' TLS material as it is now (reloaded files included) and the current settings.
async fn accept_quic_loop(
    agents: Arc<Agents>,
    sessions_stop: CancellationToken,
    endpoint: quinn::Endpoint,
    tls: Arc<ArcSwap<Tls>>,
    stop: CancellationToken,
) {
    loop {
        let incoming = tokio::select! {
            _ = stop.cancelled() => break,
            i = endpoint.accept() => match i {
                Some(i) => i,
                None => break,
            },
        };
        let cfg = agents.shared.config.load_full();
        let stats = &agents.shared.metrics.quic_congestion;
        match quic_server_config(tls.load().material.current(), &cfg, Some(stats)) {
            Ok(sc) => {
                tokio::spawn(accept_quic(agents.clone(), incoming, Arc::new(sc), sessions_stop.clone()));
            }
            Err(e) => {
                tracing::error!(error = %e, "agents QUIC listener: TLS material unusable for QUIC");
                incoming.refuse();
            }
        }
    }
    // New connections are refused from now on; sessions continue until `sessions_stop`.
    endpoint.set_server_config(None);
}
