//! proxy-server's sockets — the agents' listener (mTLS) and the front ends (TCP with or without TLS, Unix sockets) — and how a reload changes them.
//!
//! A reload binds what needs a new socket first (if a bind fails, nothing changes), then swaps
//! in what new connections use: a front end whose socket stays keeps it and takes its new
//! cluster and TLS files at once; a moved one starts on its new socket and stops accepting on
//! the old; a removed one stops accepting. Live connections of a moved or removed front end and
//! agent sessions on a moved agents listener are never cut: they end by themselves (or at the
//! end of the shutdown grace).

use crate::frontend::{self, FrontendRt};
use crate::shared::Shared;
use crate::unix_socket::{self, Access, SocketFile};
use arc_swap::ArcSwap;
use proxy_core::app::{StartError, listen_tcp, resolve_listen};
use proxy_core::net::accept::{ConnLimit, Slots, UNLIMITED, WhileFree, accept_error_label, accept_loop};
use proxy_core::sync::Mutex;
use proxy_core::tunnel::{ALPN_V1, quic};
use proxy_core::watch::{
    self,
    tls::{ClientFiles, Reloading, TlsMetrics},
};
use seedgate_config::server::{Frontend, FrontendProtocol, ServerTls};
use seedgate_config::{HostPort, ServerConfig};
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::net::{TcpListener, UnixListener};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::{CancellationToken, DropGuard};

/// Why a reload's sockets or TLS files could not be taken up (then nothing changed).
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// A TLS file, or a new or moved socket.
    #[error(transparent)]
    Start(#[from] StartError),
    /// A kept Unix socket's new mode or group.
    #[error("front end {frontend}: {error}")]
    SocketAccess { frontend: String, error: unix_socket::SocketError },
}

/// TLS material reloaded from its files while the guard lives.
struct Tls {
    material: Arc<Reloading<rustls::ServerConfig>>,
    /// Cancelled with the guard: ends what follows the material (revoked sessions).
    watching: CancellationToken,
    _guard: DropGuard,
}

impl Tls {
    fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.material.current())
    }
}

fn watched(material: Arc<Reloading<rustls::ServerConfig>>, stop: &CancellationToken) -> Tls {
    let watching = stop.child_token();
    material.watch(watching.clone());
    Tls { material, watching: watching.clone(), _guard: watching.drop_guard() }
}

/// How a server's TLS files verify client certificates (`None`: none asked).
fn client_files(t: &ServerTls, optional: bool) -> Option<ClientFiles> {
    let ca = t.client_ca.as_ref()?;
    Some(ClientFiles { ca: ca.into(), crl: t.crl.as_ref().map(Into::into), optional })
}

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
fn follow_revocations(shared: &Arc<Shared>, tls: &Tls) {
    crate::revocation::follow(shared, &tls.material, tls.watching.clone());
}

/// Follow a TLS front end's material: its live connections that a reloaded list revokes end.
fn follow_frontend_revocations(shared: &Shared, name: &str, served: &Served) {
    if let Some(tls) = &served.tls {
        shared.frontend_certs.follow(name, &tls.material, tls.watching.clone());
    }
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
    let use_ = format!("frontend {}", *f.name);
    let alpn: &[&[u8]] = match f.protocol {
        FrontendProtocol::HttpConnect => &[b"http/1.1"],
        FrontendProtocol::Grpc => &[b"h2"],
        // A port forward's clients speak whatever their target does.
        FrontendProtocol::Tcp => &[],
    };
    Ok(Some(watch::tls::server(&use_, t.cert.as_ref(), t.key.as_ref(), client_files(t, false), alpn, false, m)?))
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

/// A front end's listening socket, its file (if any) kept by its entry.
enum Listening {
    Tcp(TcpListener),
    Unix(UnixListener),
}

impl Sock {
    fn split(self) -> (Listening, Option<SocketFile>) {
        match self {
            Sock::Tcp(l) => (Listening::Tcp(l), None),
            Sock::Unix(l, file) => (Listening::Unix(l), Some(file)),
        }
    }
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

/// Every socket of the server: what each serves, from [`Listeners::bind`] on (so the addresses
/// are known before serving); the accept loops run from [`Listeners::start`].
pub(crate) struct Listeners {
    metrics: TlsMetrics,
    entries: Mutex<Entries>,
}

/// What each socket serves.
struct Entries {
    agents: AgentsEntry,
    quic: Option<QuicEntry>,
    frontends: BTreeMap<String, FrontendEntry>,
}

/// The sockets [`Listeners::bind`] opened, served by [`Listeners::start`].
pub(crate) struct Opened {
    agents: TcpListener,
    quic: Option<quinn::Endpoint>,
    /// By front-end name.
    frontends: Vec<(String, Listening)>,
}

/// What a reload needs that could fail, taken before anything changes: new TLS material, new
/// sockets, changed front ends.
struct Staged {
    agents_material: Option<Arc<Reloading<rustls::ServerConfig>>>,
    agents_sock: Option<(TcpListener, std::net::SocketAddr)>,
    /// A new or moved QUIC listener: its endpoint, its place and its address.
    quic_sock: Option<(quinn::Endpoint, HostPort, String)>,
    frontends: Vec<ChangedFrontend>,
}

/// A changed or new front end: its config, its files, and a new socket (with its address)
/// unless it keeps its own.
struct ChangedFrontend {
    cfg: Frontend,
    files: FeFiles,
    sock: Option<(Sock, String)>,
}

impl Listeners {
    /// Bind every socket of `cfg` and read its TLS files (a bad file fails the start). `stop`
    /// (the process's) ends what each entry runs.
    pub(crate) async fn bind(
        cfg: &ServerConfig,
        metrics: &TlsMetrics,
        stop: &CancellationToken,
    ) -> Result<(Self, Opened), StartError> {
        let agents_cfg = AgentsTls::of(cfg);
        let material = agents_tls(&agents_cfg, metrics)?;
        let (agents_sock, addr) = listen_tcp("agents listener", &cfg.agents.listen).await?;
        let agents = AgentsEntry {
            listen: cfg.agents.listen.clone(),
            addr: addr.to_string(),
            tls_cfg: agents_cfg,
            tls: Arc::new(ArcSwap::from_pointee(watched(material.clone(), stop))),
            stop: stop.child_token(),
        };
        let (mut quic, mut quic_sock) = (None, None);
        if let Some(q) = &cfg.agents.quic {
            let (endpoint, addr) = listen_quic(&q.listen, &material, cfg).await?;
            quic = Some(QuicEntry { listen: q.listen.clone(), addr: addr.to_string(), stop: stop.child_token() });
            quic_sock = Some(endpoint);
        }
        let (mut frontends, mut fe_socks) = (BTreeMap::new(), Vec::new());
        for f in &cfg.frontends {
            // TLS files are read before the socket is bound, so a bad file fails the start.
            let files = frontend_files(f, metrics)?;
            let (sock, addr) = bind_place(f).await?;
            let (listening, file) = sock.split();
            let name = f.name.value.clone();
            frontends.insert(name.clone(), frontend_entry(stop, f.clone(), addr, files, file));
            fe_socks.push((name, listening));
        }
        let this = Self { metrics: metrics.clone(), entries: Mutex::new(Entries { agents, quic, frontends }) };
        Ok((this, Opened { agents: agents_sock, quic: quic_sock, frontends: fe_socks }))
    }

    pub(crate) fn addresses(&self) -> BTreeMap<String, String> {
        let e = self.entries.lock();
        let mut out: BTreeMap<String, String> = e.frontends.iter().map(|(n, f)| (n.clone(), f.addr.clone())).collect();
        out.insert("agents".into(), e.agents.addr.clone());
        if let Some(q) = &e.quic {
            out.insert("agents-quic".into(), q.addr.clone());
        }
        out
    }

    /// Start the accept loops on what [`Listeners::bind`] opened. Agent sessions end with
    /// `sessions_stop` (after the front ends drained); front-end connections drain with the
    /// process.
    pub(crate) fn start(&self, shared: &Arc<Shared>, sessions_stop: &CancellationToken, opened: Opened) {
        let e = self.entries.lock();
        follow_revocations(shared, &e.agents.tls.load());
        serve_agents(shared, sessions_stop, opened.agents, &e.agents);
        if let (Some(endpoint), Some(q)) = (opened.quic, &e.quic) {
            serve_quic(shared, sessions_stop, endpoint, e.agents.tls.clone(), q);
        }
        for (name, listening) in opened.frontends {
            if let Some(entry) = e.frontends.get(&name) {
                follow_frontend_revocations(shared, &name, &entry.served.load());
                serve_frontend(shared, entry, listening);
            }
        }
    }

    /// Apply a new config's sockets and TLS files, or change nothing: first everything that can
    /// fail ([`Listeners::stage`]), then the swap ([`Listeners::commit`]).
    pub(crate) async fn apply(
        &self,
        shared: &Arc<Shared>,
        sessions_stop: &CancellationToken,
        new: &ServerConfig,
    ) -> Result<(), ApplyError> {
        let staged = self.stage(new).await?;
        self.commit(shared, sessions_stop, new, staged);
        Ok(())
    }

    /// Read the TLS files and bind the sockets `new` needs, changing nothing that serves. The
    /// lock is not held while binding.
    async fn stage(&self, new: &ServerConfig) -> Result<Staged, ApplyError> {
        let (agents_now, quic_now, material_now, frontends_now) = {
            let e = self.entries.lock();
            let fes: BTreeMap<String, Frontend> = e.frontends.iter().map(|(n, f)| (n.clone(), f.cfg.clone())).collect();
            let agents = (e.agents.listen.clone(), e.agents.tls_cfg.clone());
            (agents, e.quic.as_ref().map(|q| q.listen.clone()), e.agents.tls.load().material.clone(), fes)
        };
        let (agents_listen, agents_tls_cfg) = agents_now;
        let new_agents_tls = AgentsTls::of(new);
        let agents_material =
            if new_agents_tls != agents_tls_cfg { Some(agents_tls(&new_agents_tls, &self.metrics)?) } else { None };
        let agents_sock = match new.agents.listen != agents_listen {
            true => Some(listen_tcp("agents listener", &new.agents.listen).await?),
            false => None,
        };
        // The QUIC listener: bound anew when added or moved (with the TLS material it will
        // serve: the new one if the agents' files changed too).
        let quic_sock = match (&new.agents.quic, &quic_now) {
            (Some(q), now) if now.as_ref() != Some(&q.listen) => {
                let material = agents_material.as_ref().unwrap_or(&material_now);
                let (endpoint, addr) = listen_quic(&q.listen, material, new).await?;
                Some((endpoint, q.listen.clone(), addr.to_string()))
            }
            _ => None,
        };
        let mut frontends = Vec::new();
        for f in &new.frontends {
            let old = frontends_now.get(f.name.as_str());
            if old == Some(f) {
                continue;
            }
            let tls = frontend_files(f, &self.metrics)?;
            let sock = match old {
                Some(o) if place(o) == place(f) => {
                    if access(o) != access(f) {
                        self.reapply_access(f)?;
                    }
                    None
                }
                _ => Some(bind_place(f).await?),
            };
            frontends.push(ChangedFrontend { cfg: f.clone(), files: tls, sock });
        }
        Ok(Staged { agents_material, agents_sock, quic_sock, frontends })
    }

    /// Swap in what `staged` prepared: what new connections and sessions use from now.
    fn commit(&self, shared: &Arc<Shared>, sessions_stop: &CancellationToken, new: &ServerConfig, staged: Staged) {
        let Staged { agents_material, agents_sock, quic_sock, frontends } = staged;
        let mut e = self.entries.lock();
        let e = &mut *e;
        let a = &mut e.agents;
        if let Some(m) = agents_material {
            let new_agents_tls = AgentsTls::of(new);
            let tls = watched(m, &shared.shutdown.stop);
            follow_revocations(shared, &tls);
            a.tls.store(Arc::new(tls));
            a.tls_cfg = new_agents_tls;
        }
        if let Some((l, addr)) = agents_sock {
            // The same TLS material (shared with the QUIC listener, which stays).
            let moved = AgentsEntry {
                listen: new.agents.listen.clone(),
                addr: addr.to_string(),
                tls_cfg: a.tls_cfg.clone(),
                tls: a.tls.clone(),
                stop: shared.shutdown.stop.child_token(),
            };
            serve_agents(shared, sessions_stop, l, &moved);
            let old = std::mem::replace(a, moved);
            old.stop.cancel();
            tracing::info!(old = %old.addr, new = %a.addr, "agents listener moved; sessions on the old one continue");
        }
        let old = match quic_sock {
            Some((endpoint, listen, addr)) => {
                let entry = QuicEntry { listen, addr, stop: shared.shutdown.stop.child_token() };
                serve_quic(shared, sessions_stop, endpoint, a.tls.clone(), &entry);
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
        commit_frontends(shared, &mut e.frontends, new, frontends);
    }

    /// A kept socket's new mode or group, set on its file.
    fn reapply_access(&self, f: &Frontend) -> Result<(), ApplyError> {
        let e = self.entries.lock();
        match e.frontends.get(f.name.as_str()).and_then(|e| e.socket.as_ref()) {
            Some(s) => {
                s.apply(&access(f)).map_err(|error| ApplyError::SocketAccess { frontend: f.name.value.clone(), error })
            }
            None => Ok(()),
        }
    }

    /// At exit: remove every socket file this process made.
    pub(crate) fn remove_socket_files(&self) {
        for entry in self.entries.lock().frontends.values() {
            entry.stop();
        }
    }
}

/// Swap in the changed front ends: a kept socket serves the new settings, a moved or new one
/// starts serving (the old one stops accepting), a removed one stops accepting. Live
/// connections continue in every case.
fn commit_frontends(
    shared: &Arc<Shared>,
    running: &mut BTreeMap<String, FrontendEntry>,
    new: &ServerConfig,
    changed: Vec<ChangedFrontend>,
) {
    for ChangedFrontend { cfg: f, files: tls, sock } in changed {
        let name = f.name.value.clone();
        match sock {
            None => {
                let entry = running.get_mut(&name).expect("an unchanged place has a running entry");
                let served = served(&shared.shutdown.stop, &f, tls);
                follow_frontend_revocations(shared, &name, &served);
                entry.served.store(Arc::new(served));
                entry.cfg = f;
                tracing::info!(frontend = %name, "front end changed; new connections use the new settings");
            }
            Some((sock, addr)) => {
                let (listening, file) = sock.split();
                let entry = frontend_entry(&shared.shutdown.stop, f, addr, tls, file);
                follow_frontend_revocations(shared, &name, &entry.served.load());
                serve_frontend(shared, &entry, listening);
                if let Some(old) = running.insert(name.clone(), entry) {
                    old.stop();
                    tracing::info!(frontend = %name, old = %old.addr, "front end moved; its live connections continue");
                }
            }
        }
    }
    let keep: std::collections::HashSet<&str> = new.frontends.iter().map(|f| f.name.as_str()).collect();
    running.retain(|name, entry| {
        let kept = keep.contains(name.as_str());
        if !kept {
            entry.stop();
            tracing::info!(frontend = %name, addr = %entry.addr, "front end removed: stopped accepting; its live connections continue");
        }
        kept
    });
}

/// Bind the agents' QUIC listener (UDP) with the agents' TLS material.
async fn listen_quic(
    hp: &HostPort,
    material: &Reloading<rustls::ServerConfig>,
    cfg: &ServerConfig,
) -> Result<(quinn::Endpoint, std::net::SocketAddr), StartError> {
    let what = "agents QUIC listener";
    let addr = resolve_listen(what, hp).await?;
    let bind_err = |source| StartError::Bind { what: what.to_owned(), addr: hp.to_string(), source };
    // No stats: every connection is accepted with a config of its own (`accept_quic`), which has them.
    let server_config = crate::agents::quic_server_config(material.current(), cfg, None)
        .map_err(|e| bind_err(std::io::Error::other(e)))?;
    let settings = crate::agents::settings(cfg);
    // The key file outlives the process and the id names this replica: a replica restarted in
    // place resets its predecessor's sessions (see `StableKeys`). Unreadable now: keys of this
    // run only, and such sessions end at their keepalive timeout.
    let stable = std::fs::read(&cfg.agents.tls.key)
        .ok()
        .map(|secret| quic::StableKeys::derive(&secret, &crate::replica::server_id(cfg)));
    let server = quic::Server { config: server_config, stable };
    let endpoint = quic::endpoint(addr, &settings, Some(server), what, "agents.connection_window").map_err(bind_err)?;
    let local = endpoint.local_addr().map_err(bind_err)?;
    Ok((endpoint, local))
}

/// Serve the agents' QUIC listener until shutdown or until the entry's `stop`.
fn serve_quic(
    shared: &Arc<Shared>,
    sessions_stop: &CancellationToken,
    endpoint: quinn::Endpoint,
    tls: Arc<ArcSwap<Tls>>,
    entry: &QuicEntry,
) {
    tracing::info!(addr = %entry.addr, "agents QUIC listener up");
    tokio::spawn(serve_agents_quic(shared.clone(), sessions_stop.clone(), endpoint, tls, entry.stop.clone()));
}

/// Serve the agents' listener until shutdown or until the entry's `stop`. Agents: not counted
/// against the front-end limit, not part of the front-end drain.
fn serve_agents(shared: &Arc<Shared>, sessions_stop: &CancellationToken, l: TcpListener, entry: &AgentsEntry) {
    let errors = shared.metrics.conn.accept_errors.clone();
    proxy_core::obs::metrics::at_zero(&errors, &[&["agents"], &proxy_core::net::accept::ACCEPT_ERROR_LABELS]);
    let (sh, t, sessions) = (shared.clone(), entry.tls.clone(), sessions_stop.clone());
    tracing::info!(addr = %entry.addr, "agents listener up");
    tokio::spawn(accept_loop(
        l,
        ConnLimit::new(Slots::new(UNLIMITED), None),
        entry.stop.clone(),
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
}

/// What a front end's new connections use, with its TLS material watched until `stop`.
fn served(stop: &CancellationToken, f: &Frontend, files: FeFiles) -> Served {
    let rt = Arc::new(FrontendRt {
        name: Arc::from(f.name.as_str()),
        cluster: f.cluster.clone(),
        proxy_token: files.token,
        grpc: f.protocol == FrontendProtocol::Grpc,
        target: f.target.as_ref().filter(|_| f.protocol == FrontendProtocol::Tcp).map(|t| Arc::from(t.to_string())),
    });
    Served { rt, tls: files.tls.map(|m| watched(m, stop)) }
}

/// A front end not yet serving: what it will serve, and the token that stops it (a child of
/// the process's `stop`).
fn frontend_entry(
    stop: &CancellationToken,
    f: Frontend,
    addr: String,
    files: FeFiles,
    socket: Option<SocketFile>,
) -> FrontendEntry {
    let served = Arc::new(ArcSwap::from_pointee(served(stop, &f, files)));
    FrontendEntry { cfg: f, addr, served, stop: stop.child_token(), socket }
}

/// Serve a front end until shutdown or until its entry's `stop`.
fn serve_frontend(shared: &Arc<Shared>, entry: &FrontendEntry, listening: Listening) {
    // A slot is taken once the request head is read; until then the connection is in the
    // pending budget.
    let limit = WhileFree(shared.limit.clone());
    shared.metrics.frontend_at_zero(&entry.cfg, &frontend::Refusal::labels());
    let errors = shared.metrics.conn.accept_errors.clone();
    let name: Arc<str> = Arc::from(entry.cfg.name.as_str());
    let on_err = move |e: &std::io::Error| errors.with_label_values(&[&name, accept_error_label(e)]).inc();
    let (tracker, stop) = (shared.shutdown.tracker.clone(), entry.stop.clone());
    let (sh, sv) = (shared.clone(), entry.served.clone());
    tracing::info!(frontend = %entry.cfg.name, addr = %entry.addr, tls = entry.cfg.tls.is_some(), "front end listening");
    match listening {
        Listening::Tcp(l) => {
            tokio::spawn(accept_loop(l, limit, stop, tracker, on_err, move |tcp, peer, ()| {
                let s = sv.load();
                let conn = frontend::Accepted::Tcp(tcp, s.tls.as_ref().map(Tls::acceptor));
                frontend::connection(sh.clone(), s.rt.clone(), conn, peer.to_string(), Some(peer.ip()))
            }));
        }
        Listening::Unix(l) => {
            let peer = entry.addr.clone();
            tokio::spawn(accept_loop(l, limit, stop, tracker, on_err, move |s, _addr, ()| {
                let rt = sv.load().rt.clone();
                frontend::connection(sh.clone(), rt, frontend::Accepted::Unix(s), peer.clone(), None)
            }));
        }
    }
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
        match crate::agents::quic_server_config(
            tls.load().material.current(),
            &cfg,
            Some(&shared.metrics.quic_congestion),
        ) {
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
