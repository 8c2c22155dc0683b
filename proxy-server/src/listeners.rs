//! proxy-server's sockets — the agents' listener (mTLS) and the front ends (TCP with or without TLS, Unix sockets) — and how a reload changes them.
//!
//! A reload binds what needs a new socket first (if a bind fails, nothing changes), then swaps
//! in what new connections use: a front end whose socket stays keeps it and takes its new
//! cluster and TLS files at once; a moved one starts on its new socket and stops accepting on
//! the old; a removed one stops accepting. Live connections of a moved or removed front end and
//! agent sessions on a moved agents listener are never cut: they end by themselves (or at the
//! end of the shutdown grace).

use crate::Shared;
use crate::frontend::{self, FrontendRt};
use crate::unix_socket::{self, Access, SocketFile};
use arc_swap::ArcSwap;
use proxy_core::app::{StartError, listen_tcp};
use proxy_core::net::accept::{ConnLimit, Slots, UNLIMITED, WhileFree, accept_error_label, accept_loop};
use proxy_core::tunnel::ALPN_V1;
use proxy_core::watch::{
    self,
    tls::{Reloading, TlsMetrics},
};
use seedgate_config::server::{Frontend, FrontendProtocol, ServerTls};
use seedgate_config::{HostPort, ServerConfig};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tokio::net::{TcpListener, UnixListener};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::{CancellationToken, DropGuard};

/// TLS material reloaded from its files while the guard lives.
struct Tls {
    material: Arc<Reloading<rustls::ServerConfig>>,
    _watching: DropGuard,
}

impl Tls {
    fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.material.current())
    }
}

fn watched(material: Arc<Reloading<rustls::ServerConfig>>, stop: &CancellationToken) -> Tls {
    let watching = stop.child_token();
    material.watch(watching.clone());
    Tls { material, _watching: watching.drop_guard() }
}

fn agents_tls(t: &ServerTls, m: &TlsMetrics) -> Result<Arc<Reloading<rustls::ServerConfig>>, StartError> {
    let ca = t.client_ca.as_deref().map(AsRef::as_ref);
    Ok(watch::tls::server("agents", t.cert.as_ref(), t.key.as_ref(), ca, &[ALPN_V1], true, m)?)
}

/// What a front end reads from files: its TLS material and its proxy token.
struct FeFiles {
    tls: Option<Arc<Reloading<rustls::ServerConfig>>>,
    token: Option<Arc<str>>,
}

fn frontend_files(f: &Frontend, m: &TlsMetrics) -> Result<FeFiles, StartError> {
    let token = match &f.proxy_token_file {
        None => None,
        Some(file) => {
            let err = |detail: String| {
                StartError::Tls(proxy_core::tls::TlsError::File {
                    path: file.clone(),
                    what: "frontends[].proxy_token_file",
                    detail,
                })
            };
            let t = std::fs::read_to_string(file).map_err(|e| err(e.to_string()))?;
            let t = t.trim();
            if t.is_empty() {
                return Err(err("the file is empty".into()));
            }
            Some(Arc::from(t))
        }
    };
    Ok(FeFiles { tls: frontend_tls(f, m)?, token })
}

fn frontend_tls(f: &Frontend, m: &TlsMetrics) -> Result<Option<Arc<Reloading<rustls::ServerConfig>>>, StartError> {
    let Some(t) = &f.tls else { return Ok(None) };
    let ca = t.client_ca.as_deref().map(AsRef::as_ref);
    let use_ = format!("frontend {}", *f.name);
    let alpn: &[&[u8]] = match f.protocol {
        FrontendProtocol::HttpConnect => &[b"http/1.1"],
        FrontendProtocol::Grpc => &[b"h2"],
    };
    Ok(Some(watch::tls::server(&use_, t.cert.as_ref(), t.key.as_ref(), ca, alpn, false, m)?))
}

/// Where a front end listens: its socket is kept across a reload while this stays the same.
#[derive(Clone, PartialEq, Eq)]
enum Place {
    Tcp(HostPort),
    Unix(String),
}

fn place(f: &Frontend) -> Place {
    match (&f.listen, &f.unix) {
        (Some(hp), _) => Place::Tcp(hp.clone()),
        (None, Some(p)) => Place::Unix(p.clone()),
        (None, None) => unreachable!("validated: listen or unix"),
    }
}

/// Mode and group of a front end's socket file.
fn access(f: &Frontend) -> Access {
    Access { mode: f.unix_mode, group: f.unix_group.clone() }
}

enum Sock {
    Tcp(TcpListener),
    Unix(UnixListener, SocketFile),
}

async fn bind_place(f: &Frontend) -> Result<(Sock, String), StartError> {
    let name = f.name.as_str();
    match place(f) {
        Place::Tcp(hp) => {
            let (l, addr) = listen_tcp(&format!("front end {name}"), &hp).await?;
            Ok((Sock::Tcp(l), addr.to_string()))
        }
        Place::Unix(path) => {
            let (l, file) = unix_socket::bind(path.as_ref(), &access(f)).map_err(|e| StartError::Bind {
                what: format!("front end {name}"),
                addr: path.clone(),
                source: std::io::Error::other(e),
            })?;
            Ok((Sock::Unix(l, file), format!("unix:{path}")))
        }
    }
}

/// What a front end's new connections use; swapped whole on reload.
struct Served {
    rt: Arc<FrontendRt>,
    tls: Option<Tls>,
}

/// A running front end.
struct FrontendEntry {
    cfg: Frontend,
    addr: String,
    served: Arc<ArcSwap<Served>>,
    /// Stops its accept loop.
    stop: CancellationToken,
    /// A Unix socket's file, removed when the front end stops.
    socket: Option<SocketFile>,
}

impl FrontendEntry {
    /// Stop accepting; live connections continue.
    fn stop(&self) {
        self.stop.cancel();
        if let Some(s) = &self.socket {
            s.remove();
        }
    }
}

/// The agents' listener.
struct AgentsEntry {
    listen: HostPort,
    addr: String,
    tls_cfg: ServerTls,
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

/// Every socket of the server.
pub(crate) struct Listeners {
    metrics: TlsMetrics,
    agents: Mutex<Option<AgentsEntry>>,
    quic: Mutex<Option<QuicEntry>>,
    frontends: Mutex<BTreeMap<String, FrontendEntry>>,
    /// Bound by [`Listeners::bind`], served from [`Listeners::start`].
    pending: Mutex<Vec<Pending>>,
}

enum Pending {
    Agents(TcpListener, Arc<Reloading<rustls::ServerConfig>>, ServerTls, HostPort, String),
    AgentsQuic(quinn::Endpoint, HostPort, String),
    Frontend(Frontend, Sock, String),
}

impl Listeners {
    pub(crate) async fn bind(cfg: &ServerConfig, metrics: &TlsMetrics) -> Result<Self, StartError> {
        let material = agents_tls(&cfg.agents.tls, metrics)?;
        let (agents, addr) = listen_tcp("agents listener", &cfg.agents.listen).await?;
        let mut pending = vec![Pending::Agents(
            agents,
            material.clone(),
            cfg.agents.tls.clone(),
            cfg.agents.listen.clone(),
            addr.to_string(),
        )];
        if let Some(q) = &cfg.agents.quic {
            let (endpoint, addr) = listen_quic(&q.listen, &material, cfg).await?;
            pending.push(Pending::AgentsQuic(endpoint, q.listen.clone(), addr.to_string()));
        }
        for f in &cfg.frontends {
            // TLS files are checked before the socket is bound, so a bad file fails the start.
            frontend_files(f, metrics)?;
            let (sock, addr) = bind_place(f).await?;
            pending.push(Pending::Frontend(f.clone(), sock, addr));
        }
        Ok(Self {
            metrics: metrics.clone(),
            agents: Mutex::new(None),
            quic: Mutex::new(None),
            frontends: Mutex::new(BTreeMap::new()),
            pending: Mutex::new(pending),
        })
    }

    pub(crate) fn addresses(&self) -> BTreeMap<String, String> {
        let mut out: BTreeMap<String, String> =
            self.frontends.lock().expect("not poisoned").iter().map(|(n, f)| (n.clone(), f.addr.clone())).collect();
        if let Some(a) = &*self.agents.lock().expect("not poisoned") {
            out.insert("agents".into(), a.addr.clone());
        }
        if let Some(q) = &*self.quic.lock().expect("not poisoned") {
            out.insert("agents-quic".into(), q.addr.clone());
        }
        for p in self.pending.lock().expect("not poisoned").iter() {
            match p {
                Pending::Agents(.., addr) => out.insert("agents".into(), addr.clone()),
                Pending::AgentsQuic(.., addr) => out.insert("agents-quic".into(), addr.clone()),
                Pending::Frontend(f, _, addr) => out.insert(f.name.value.clone(), addr.clone()),
            };
        }
        out
    }

    /// Start the accept loops. Agent sessions end with `sessions_stop` (after the front ends
    /// drained); front-end connections drain with the process.
    pub(crate) fn start(&self, shared: &Arc<Shared>, sessions_stop: &CancellationToken) {
        for p in std::mem::take(&mut *self.pending.lock().expect("not poisoned")) {
            match p {
                Pending::Agents(l, material, tls_cfg, listen, addr) => {
                    let tls = Arc::new(ArcSwap::from_pointee(watched(material, &shared.shutdown.stop)));
                    let entry = self.serve_agents(shared, sessions_stop, l, tls, tls_cfg, listen, addr);
                    *self.agents.lock().expect("not poisoned") = Some(entry);
                }
                Pending::AgentsQuic(endpoint, listen, addr) => {
                    // The agents' listener is first in `pending`: its TLS material is running.
                    let tls = self.agents.lock().expect("not poisoned").as_ref().map(|a| a.tls.clone());
                    if let Some(tls) = tls {
                        let entry = serve_quic(shared, sessions_stop, endpoint, tls, listen, addr);
                        *self.quic.lock().expect("not poisoned") = Some(entry);
                    }
                }
                Pending::Frontend(f, sock, addr) => {
                    // Built at bind time already; a failure now (a file changed meanwhile) is logged.
                    match frontend_files(&f, &self.metrics) {
                        Ok(files) => {
                            let entry = self.serve_frontend(shared, f, sock, addr, files);
                            self.frontends.lock().expect("not poisoned").insert(entry.cfg.name.value.clone(), entry);
                        }
                        Err(e) => {
                            if let Sock::Unix(_, file) = &sock {
                                file.remove();
                            }
                            tracing::error!(frontend = %f.name, error = %e, "front end not started")
                        }
                    }
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn serve_agents(
        &self,
        shared: &Arc<Shared>,
        sessions_stop: &CancellationToken,
        l: TcpListener,
        tls: Arc<ArcSwap<Tls>>,
        tls_cfg: ServerTls,
        listen: HostPort,
        addr: String,
    ) -> AgentsEntry {
        let stop = shared.shutdown.stop.child_token();
        let errors = shared.metrics.conn.accept_errors.clone();
        let (sh, t, sessions) = (shared.clone(), tls.clone(), sessions_stop.clone());
        tracing::info!(%addr, "agents listener up");
        // Agents: not counted against the front-end limit, not part of the front-end drain.
        tokio::spawn(accept_loop(
            l,
            ConnLimit::new(Slots::new(UNLIMITED), None),
            stop.clone(),
            tokio_util::task::TaskTracker::new(),
            move |e| errors.with_label_values(&["agents", accept_error_label(e)]).inc(),
            move |tcp, peer, permit| {
                let fut = crate::agents::accept_tls(sh.clone(), t.load().acceptor(), tcp, peer, sessions.clone());
                async move {
                    fut.await;
                    drop(permit);
                }
            },
        ));
        AgentsEntry { listen, addr, tls_cfg, tls, stop }
    }

    fn served(&self, shared: &Shared, f: &Frontend, files: FeFiles) -> Served {
        let rt = Arc::new(FrontendRt {
            name: Arc::from(f.name.as_str()),
            cluster: f.cluster.clone(),
            proxy_token: files.token,
            grpc: f.protocol == FrontendProtocol::Grpc,
        });
        Served { rt, tls: files.tls.map(|m| watched(m, &shared.shutdown.stop)) }
    }

    fn serve_frontend(
        &self,
        shared: &Arc<Shared>,
        f: Frontend,
        sock: Sock,
        addr: String,
        files: FeFiles,
    ) -> FrontendEntry {
        let served = Arc::new(ArcSwap::from_pointee(self.served(shared, &f, files)));
        let stop = shared.shutdown.stop.child_token();
        // A slot is taken once the request head is read; until then the connection is in the
        // pending budget.
        let limit = WhileFree(shared.limit.clone());
        let errors = shared.metrics.conn.accept_errors.clone();
        let name: Arc<str> = Arc::from(f.name.as_str());
        let on_err = move |e: &std::io::Error| errors.with_label_values(&[&name, accept_error_label(e)]).inc();
        let tracker = shared.shutdown.tracker.clone();
        let (sh, sv) = (shared.clone(), served.clone());
        tracing::info!(frontend = %f.name, %addr, tls = f.tls.is_some(), "front end listening");
        match sock {
            Sock::Tcp(l) => {
                tokio::spawn(accept_loop(l, limit, stop.clone(), tracker, on_err, move |tcp, peer, ()| {
                    let s = sv.load();
                    let conn = frontend::Accepted::Tcp(tcp, s.tls.as_ref().map(Tls::acceptor));
                    frontend::connection(sh.clone(), s.rt.clone(), conn, peer.to_string(), Some(peer.ip()))
                }));
            }
            Sock::Unix(l, file) => {
                let peer = addr.clone();
                tokio::spawn(accept_loop(l, limit, stop.clone(), tracker, on_err, move |s, _addr, ()| {
                    let rt = sv.load().rt.clone();
                    frontend::connection(sh.clone(), rt, frontend::Accepted::Unix(s), peer.clone(), None)
                }));
                return FrontendEntry { cfg: f, addr, served, stop, socket: Some(file) };
            }
        }
        FrontendEntry { cfg: f, addr, served, stop, socket: None }
    }

    /// Apply a new config's sockets and TLS files, or change nothing.
    pub(crate) async fn apply(
        &self,
        shared: &Arc<Shared>,
        sessions_stop: &CancellationToken,
        new: &ServerConfig,
    ) -> Result<(), String> {
        // Phase 1: everything that can fail — TLS files read, new sockets bound.
        let (agents_now, frontends_now): (Option<(HostPort, ServerTls)>, BTreeMap<String, Frontend>) = {
            let a = self.agents.lock().expect("not poisoned");
            let f = self.frontends.lock().expect("not poisoned");
            (
                a.as_ref().map(|a| (a.listen.clone(), a.tls_cfg.clone())),
                f.iter().map(|(n, e)| (n.clone(), e.cfg.clone())).collect(),
            )
        };
        let Some((agents_listen, agents_tls_cfg)) = agents_now else { return Err("not started yet".into()) };
        let e = |e: StartError| e.to_string();
        let agents_material = if new.agents.tls != agents_tls_cfg {
            Some(agents_tls(&new.agents.tls, &self.metrics).map_err(e)?)
        } else {
            None
        };
        let agents_sock = if new.agents.listen != agents_listen {
            Some(listen_tcp("agents listener", &new.agents.listen).await.map_err(e)?)
        } else {
            None
        };
        // The QUIC listener: bound anew when added or moved (with the TLS material it will
        // serve: the new one if the agents' files changed too).
        let quic_now = self.quic.lock().expect("not poisoned").as_ref().map(|q| q.listen.clone());
        let quic_sock = match (&new.agents.quic, &quic_now) {
            (Some(q), now) if now.as_ref() != Some(&q.listen) => {
                let material = match &agents_material {
                    Some(m) => m.clone(),
                    None => {
                        self.agents.lock().expect("not poisoned").as_ref().expect("checked").tls.load().material.clone()
                    }
                };
                let (endpoint, addr) = listen_quic(&q.listen, &material, new).await.map_err(e)?;
                Some((endpoint, q.listen.clone(), addr.to_string()))
            }
            _ => None,
        };
        let mut fresh = Vec::new();
        for f in &new.frontends {
            let old = frontends_now.get(f.name.as_str());
            if old == Some(f) {
                continue;
            }
            let tls = frontend_files(f, &self.metrics).map_err(e)?;
            let sock = match old {
                Some(o) if place(o) == place(f) => {
                    if access(o) != access(f) {
                        self.reapply_access(f)?;
                    }
                    None
                }
                _ => Some(bind_place(f).await.map_err(e)?),
            };
            fresh.push((f.clone(), tls, sock));
        }
        // Phase 2: commit.
        {
            let mut agents = self.agents.lock().expect("not poisoned");
            let a = agents.as_mut().expect("checked above");
            if let Some(m) = agents_material {
                a.tls.store(Arc::new(watched(m, &shared.shutdown.stop)));
                a.tls_cfg = new.agents.tls.clone();
            }
            if let Some((l, addr)) = agents_sock {
                // The same TLS material (shared with the QUIC listener, which stays).
                let moved = self.serve_agents(
                    shared,
                    sessions_stop,
                    l,
                    a.tls.clone(),
                    a.tls_cfg.clone(),
                    new.agents.listen.clone(),
                    addr.to_string(),
                );
                let old = std::mem::replace(a, moved);
                old.stop.cancel();
                tracing::info!(old = %old.addr, new = %a.addr, "agents listener moved; sessions on the old one continue");
            }
            let mut quic = self.quic.lock().expect("not poisoned");
            let old = match quic_sock {
                Some((endpoint, listen, addr)) => {
                    quic.replace(serve_quic(shared, sessions_stop, endpoint, a.tls.clone(), listen, addr))
                }
                None if new.agents.quic.is_none() => quic.take(),
                None => None,
            };
            if let Some(old) = old {
                old.stop.cancel();
                match &*quic {
                    Some(q) => {
                        tracing::info!(old = %old.addr, new = %q.addr, "agents QUIC listener moved; sessions on the old one continue")
                    }
                    None => tracing::info!(addr = %old.addr, "agents QUIC listener removed; its sessions continue"),
                }
            }
        }
        let mut frontends = self.frontends.lock().expect("not poisoned");
        for (f, tls, sock) in fresh {
            let name = f.name.value.clone();
            match sock {
                None => {
                    let entry = frontends.get_mut(&name).expect("an unchanged place has a running entry");
                    entry.served.store(Arc::new(self.served(shared, &f, tls)));
                    entry.cfg = f;
                    tracing::info!(frontend = %name, "front end changed; new connections use the new settings");
                }
                Some((sock, addr)) => {
                    let entry = self.serve_frontend(shared, f, sock, addr, tls);
                    if let Some(old) = frontends.insert(name.clone(), entry) {
                        old.stop();
                        tracing::info!(frontend = %name, old = %old.addr, "front end moved; its live connections continue");
                    }
                }
            }
        }
        let keep: std::collections::HashSet<&str> = new.frontends.iter().map(|f| f.name.as_str()).collect();
        frontends.retain(|name, entry| {
            let kept = keep.contains(name.as_str());
            if !kept {
                entry.stop();
                tracing::info!(frontend = %name, addr = %entry.addr, "front end removed: stopped accepting; its live connections continue");
            }
            kept
        });
        Ok(())
    }

    /// A kept socket's new mode or group, set on its file.
    fn reapply_access(&self, f: &Frontend) -> Result<(), String> {
        let frontends = self.frontends.lock().expect("not poisoned");
        match frontends.get(f.name.as_str()).and_then(|e| e.socket.as_ref()) {
            Some(s) => s.apply(&access(f)).map_err(|e| format!("front end {}: {e}", *f.name)),
            None => Ok(()),
        }
    }

    /// At exit: remove every socket file this process made.
    pub(crate) fn remove_socket_files(&self) {
        for entry in self.frontends.lock().expect("not poisoned").values() {
            entry.stop();
        }
        for p in self.pending.lock().expect("not poisoned").iter() {
            if let Pending::Frontend(_, Sock::Unix(_, file), _) = p {
                file.remove();
            }
        }
    }
}

/// Bind the agents' QUIC listener (UDP) with the agents' TLS material.
async fn listen_quic(
    hp: &HostPort,
    material: &Reloading<rustls::ServerConfig>,
    cfg: &ServerConfig,
) -> Result<(quinn::Endpoint, std::net::SocketAddr), StartError> {
    let what = "agents QUIC listener";
    let addr = proxy_core::net::resolve_one(hp).await.map_err(|source| StartError::Resolve {
        what: what.to_owned(),
        addr: hp.to_string(),
        source,
    })?;
    let bind_err = |source| StartError::Bind { what: what.to_owned(), addr: hp.to_string(), source };
    let server_config =
        crate::agents::quic_server_config(material.current(), cfg).map_err(|e| bind_err(std::io::Error::other(e)))?;
    let settings = crate::agents::settings(cfg);
    let endpoint =
        proxy_core::tunnel::quic::endpoint(addr, &settings, Some(server_config), what, "agents.connection_window")
            .map_err(bind_err)?;
    let local = endpoint.local_addr().map_err(bind_err)?;
    Ok((endpoint, local))
}

/// Serve the agents' QUIC listener until shutdown or until the entry's `stop`.
fn serve_quic(
    shared: &Arc<Shared>,
    sessions_stop: &CancellationToken,
    endpoint: quinn::Endpoint,
    tls: Arc<ArcSwap<Tls>>,
    listen: HostPort,
    addr: String,
) -> QuicEntry {
    let stop = shared.shutdown.stop.child_token();
    tracing::info!(%addr, "agents QUIC listener up");
    tokio::spawn(serve_agents_quic(shared.clone(), sessions_stop.clone(), endpoint, tls, stop.clone()));
    QuicEntry { listen, addr, stop }
}

/// Accept agents' QUIC connections until `stop`; each gets a server config built from the
/// agents' TLS material as it is now (reloaded files included) and the current settings.
async fn serve_agents_quic(
    shared: Arc<Shared>,
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
        let cfg = shared.config.load_full();
        match crate::agents::quic_server_config(tls.load().material.current(), &cfg) {
            Ok(sc) => {
                tokio::spawn(crate::agents::accept_quic(shared.clone(), incoming, Arc::new(sc), sessions_stop.clone()));
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
