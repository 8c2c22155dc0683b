//! The front ends' sockets (TCP with or without TLS, Unix sockets) and how a reload changes them.
//!
//! A reload binds what needs a new socket first (if a bind fails, nothing changes), then swaps
//! in what new connections use: a front end whose socket stays keeps it and takes its new
//! cluster and TLS files at once; a moved one starts on its new socket and stops accepting on
//! the old; a removed one stops accepting. Live connections of a moved or removed front end are
//! never cut: they end by themselves (or at the end of the shutdown grace).

use super::pipeline::connection;
use super::unix_socket::{self, Access, SocketFile};
use super::wing::Accepted;
use super::wing::{FrontendRt, Frontends};
use crate::shared::{Tls, client_files};
use arc_swap::ArcSwap;
use proxy_core::app::{StartError, listen_tcp};
use proxy_core::net::accept::{WhileFree, accept_error_label, accept_loop};
use proxy_core::sync::Mutex;
use proxy_core::watch::{
    self,
    tls::{Reloading, TlsMetrics},
};
use seedgate_config::server::{Frontend, FrontendProtocol};
use seedgate_config::{HostPort, ServerConfig};
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::net::{TcpListener, UnixListener};
use tokio_util::sync::CancellationToken;

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

/// Follow a TLS front end's material: its live connections that a reloaded list revokes end.
fn follow_frontend_revocations(fes: &Frontends, name: &str, served: &Served) {
    if let Some(tls) = &served.tls {
        fes.certs.follow(name, &tls.material, tls.watching.clone());
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

/// The front ends' sockets: what each serves, from [`Listeners::bind`] on (so the addresses are
/// known before serving); the accept loops run from [`Listeners::start`].
pub(crate) struct Listeners {
    metrics: TlsMetrics,
    entries: Mutex<Entries>,
}

/// What each socket serves.
struct Entries {
    frontends: BTreeMap<String, FrontendEntry>,
}

/// The sockets [`Listeners::bind`] opened, served by [`Listeners::start`].
pub(crate) struct Opened {
    /// By front-end name.
    frontends: Vec<(String, Listening)>,
}

/// What a reload needs that could fail, taken before anything changes: the changed front ends.
pub(crate) struct Staged {
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
    /// Bind every front end of `cfg` and read its TLS files (a bad file fails the start).
    /// `stop` (the process's) ends what each entry runs.
    pub(crate) async fn bind(
        cfg: &ServerConfig,
        metrics: &TlsMetrics,
        stop: &CancellationToken,
    ) -> Result<(Self, Opened), StartError> {
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
        let this = Self { metrics: metrics.clone(), entries: Mutex::new(Entries { frontends }) };
        Ok((this, Opened { frontends: fe_socks }))
    }

    /// Each front end's address, by name.
    pub(crate) fn addresses(&self, out: &mut BTreeMap<String, String>) {
        let e = self.entries.lock();
        out.extend(e.frontends.iter().map(|(n, f)| (n.clone(), f.addr.clone())));
    }

    /// Start the accept loops on what [`Listeners::bind`] opened. Front-end connections drain
    /// with the process.
    pub(crate) fn start(&self, fes: &Arc<Frontends>, opened: Opened) {
        let e = self.entries.lock();
        for (name, listening) in opened.frontends {
            if let Some(entry) = e.frontends.get(&name) {
                follow_frontend_revocations(fes, &name, &entry.served.load());
                serve_frontend(fes, entry, listening);
            }
        }
    }

    /// Read the TLS files and bind the sockets `new` needs, changing nothing that serves. The
    /// lock is not held while binding.
    pub(crate) async fn stage(&self, new: &ServerConfig) -> Result<Staged, ApplyError> {
        let frontends_now: BTreeMap<String, Frontend> = {
            let e = self.entries.lock();
            e.frontends.iter().map(|(n, f)| (n.clone(), f.cfg.clone())).collect()
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
        Ok(Staged { frontends })
    }

    /// Swap in what `staged` prepared: what new connections use from now.
    pub(crate) fn commit(&self, fes: &Arc<Frontends>, new: &ServerConfig, staged: Staged) {
        commit_frontends(fes, &mut self.entries.lock().frontends, new, staged.frontends);
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
    fes: &Arc<Frontends>,
    running: &mut BTreeMap<String, FrontendEntry>,
    new: &ServerConfig,
    changed: Vec<ChangedFrontend>,
) {
    for ChangedFrontend { cfg: f, files: tls, sock } in changed {
        let name = f.name.value.clone();
        match sock {
            None => {
                let entry = running.get_mut(&name).expect("an unchanged place has a running entry");
                let served = served(&fes.shared.shutdown.stop, &f, tls);
                follow_frontend_revocations(fes, &name, &served);
                entry.served.store(Arc::new(served));
                entry.cfg = f;
                tracing::info!(frontend = %name, "front end changed; new connections use the new settings");
            }
            Some((sock, addr)) => {
                let (listening, file) = sock.split();
                let entry = frontend_entry(&fes.shared.shutdown.stop, f, addr, tls, file);
                follow_frontend_revocations(fes, &name, &entry.served.load());
                serve_frontend(fes, &entry, listening);
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

/// What a front end's new connections use, with its TLS material watched until `stop`.
fn served(stop: &CancellationToken, f: &Frontend, files: FeFiles) -> Served {
    let rt = Arc::new(FrontendRt {
        name: Arc::from(f.name.as_str()),
        cluster: f.cluster.clone(),
        proxy_token: files.token,
        grpc: f.protocol == FrontendProtocol::Grpc,
        target: f.target.as_ref().filter(|_| f.protocol == FrontendProtocol::Tcp).map(|t| Arc::from(t.to_string())),
    });
    Served { rt, tls: files.tls.map(|m| Tls::watched(m, stop)) }
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
fn serve_frontend(fes: &Arc<Frontends>, entry: &FrontendEntry, listening: Listening) {
    // A slot is taken once the request head is read; until then the connection is in the
    // pending budget.
    let limit = WhileFree(fes.limit.clone());
    fes.shared.metrics.frontend_at_zero(&entry.cfg, &super::refusal::Refusal::labels());
    let errors = fes.shared.metrics.conn.accept_errors.clone();
    let name: Arc<str> = Arc::from(entry.cfg.name.as_str());
    let on_err = move |e: &std::io::Error| errors.with_label_values(&[&name, accept_error_label(e)]).inc();
    let (tracker, stop) = (fes.shared.shutdown.tracker.clone(), entry.stop.clone());
    let (sh, sv) = (fes.clone(), entry.served.clone());
    tracing::info!(frontend = %entry.cfg.name, addr = %entry.addr, tls = entry.cfg.tls.is_some(), "front end listening");
    match listening {
        Listening::Tcp(l) => {
            tokio::spawn(accept_loop(l, limit, stop, tracker, on_err, move |tcp, peer, ()| {
                let s = sv.load();
                let conn = Accepted::Tcp(tcp, s.tls.as_ref().map(Tls::acceptor));
                connection(sh.clone(), s.rt.clone(), conn, peer.to_string(), Some(peer.ip()))
            }));
        }
        Listening::Unix(l) => {
            let peer = entry.addr.clone();
            tokio::spawn(accept_loop(l, limit, stop, tracker, on_err, move |s, _addr, ()| {
                let rt = sv.load().rt.clone();
                connection(sh.clone(), rt, Accepted::Unix(s), peer.clone(), None)
            }));
        }
    }
}
