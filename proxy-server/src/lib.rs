//! proxy-server: the seed end of the reverse tunnel. Agents dial in; front ends (CONNECT, forward proxy) dial out through them.
//!
//! `bind` opens the agents' listener, every front end and the admin socket; `Bound::run` serves
//! until the shutdown signal, then drains front-end connections for the grace period and closes
//! the agent sessions.

mod agents;
mod frontend;
mod metrics;
mod registry;

use arc_swap::ArcSwap;
use frontend::FrontendRt;
use proxy_core::accept::{ConnLimit, accept_error_label, accept_loop};
use proxy_core::addrs::Addresses;
use proxy_core::admin::{self, AdminHooks, AdminState, Check, ControlRequest};
use proxy_core::prometheus::Registry as PromRegistry;
use proxy_core::shutdown::{Drained, Shutdown};
use registry::Registry;
use seedgate_config::ServerConfig;
use seedgate_config::server::{ClusterMode, ClusterState, Frontend};
use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

pub use metrics::ServerMetrics;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what}: cannot bind {addr}: {source}")]
    Bind { what: String, addr: String, source: std::io::Error },
    #[error("{0}")]
    Tls(#[from] proxy_core::tls::TlsError),
    #[error("admin token: {0}")]
    Token(std::io::Error),
    #[error("writing the addresses file: {0}")]
    AddressesFile(std::io::Error),
}

#[derive(Debug, Clone, Default)]
pub struct Options {
    pub config_path: Option<PathBuf>,
    pub write_addresses: Option<PathBuf>,
    pub registry: Option<PromRegistry>,
}

pub(crate) struct Shared {
    pub(crate) config: ArcSwap<ServerConfig>,
    pub(crate) metrics: ServerMetrics,
    pub(crate) registry: Registry,
    pub(crate) shutdown: Shutdown,
    /// Cluster states set through the admin endpoint; they override the config's until cleared.
    overrides: Mutex<BTreeMap<String, ClusterState>>,
    conn_seq: AtomicU64,
    id_prefix: String,
}

impl Shared {
    pub(crate) fn next_conn_id(&self) -> String {
        format!("{}-{}", self.id_prefix, self.conn_seq.fetch_add(1, Ordering::Relaxed))
    }

    /// Config states with the admin overrides on top.
    fn effective_states(&self) -> BTreeMap<String, ClusterState> {
        let mut s = self.config.load().clusters.clone();
        s.extend(self.overrides.lock().expect("not poisoned").clone());
        s
    }
}

enum FrontendSock {
    Tcp(TcpListener, Option<TlsAcceptor>),
    Unix(UnixListener, PathBuf),
}

pub struct Bound {
    shared: Arc<Shared>,
    agents: TcpListener,
    agents_tls: TlsAcceptor,
    frontends: Vec<(Arc<FrontendRt>, FrontendSock)>,
    admin: Option<TcpListener>,
    admin_token: Option<Arc<str>>,
    prom: PromRegistry,
    addrs: Addresses,
    config_path: Option<PathBuf>,
    write_addresses: Option<PathBuf>,
}

fn resolve_listen(what: &str, hp: &seedgate_config::HostPort) -> Result<SocketAddr, Error> {
    let err = |source| Error::Bind { what: what.to_owned(), addr: hp.to_string(), source };
    match hp.socket_addr() {
        Some(a) => Ok(a),
        None => std::net::ToSocketAddrs::to_socket_addrs(&(hp.host.as_str(), hp.port))
            .map_err(err)?
            .next()
            .ok_or_else(|| err(std::io::Error::new(std::io::ErrorKind::NotFound, "no address"))),
    }
}

fn bind_tcp(what: &str, hp: &seedgate_config::HostPort) -> Result<TcpListener, Error> {
    let addr = resolve_listen(what, hp)?;
    proxy_core::net::bind_tcp(addr).map_err(|source| Error::Bind {
        what: what.to_owned(),
        addr: hp.to_string(),
        source,
    })
}

fn frontend_tls(f: &Frontend) -> Result<Option<TlsAcceptor>, Error> {
    let Some(t) = &f.tls else { return Ok(None) };
    let cfg = proxy_core::tls::server_config(
        t.cert.as_ref(),
        t.key.as_ref(),
        t.client_ca.as_deref().map(AsRef::as_ref),
        &[b"http/1.1"],
        false,
    )?;
    Ok(Some(TlsAcceptor::from(cfg)))
}

pub async fn bind(cfg: ServerConfig, opts: Options) -> Result<Bound, Error> {
    let prom = opts.registry.unwrap_or_default();
    let metrics = ServerMetrics::new(&prom);
    proxy_core::metrics::register_build_info(&prom, "proxy-server");
    let admin_token = admin::load_token(cfg.admin.token_file.as_deref()).map_err(Error::Token)?;
    let admin = match &cfg.admin.listen {
        None => None,
        Some(hp) => {
            let addr = resolve_listen("admin", hp)?;
            Some(admin::bind(addr).await.map_err(|source| Error::Bind {
                what: "admin".into(),
                addr: hp.to_string(),
                source,
            })?)
        }
    };
    let t = &cfg.agents.tls;
    let agents_tls = TlsAcceptor::from(proxy_core::tls::server_config(
        t.cert.as_ref(),
        t.key.as_ref(),
        t.client_ca.as_deref().map(AsRef::as_ref),
        &[proxy_core::tunnel::ALPN_V1],
        true,
    )?);
    let agents = bind_tcp("agents listener", &cfg.agents.listen)?;
    let mut addrs = Addresses { admin: admin.as_ref().and_then(|a| a.local_addr().ok()), listeners: BTreeMap::new() };
    addrs.listeners.insert("agents".into(), agents.local_addr().map(|a| a.to_string()).unwrap_or_default());
    let mut frontends = Vec::new();
    for f in &cfg.frontends {
        let rt = Arc::new(FrontendRt { name: Arc::from(f.name.as_str()), cluster: f.cluster.clone() });
        let sock = match (&f.listen, &f.unix) {
            (Some(hp), _) => {
                let l = bind_tcp(&format!("front end {}", *f.name), hp)?;
                addrs.listeners.insert(f.name.value.clone(), l.local_addr().map(|a| a.to_string()).unwrap_or_default());
                FrontendSock::Tcp(l, frontend_tls(f)?)
            }
            (None, Some(path)) => {
                // A stale socket file from a previous run would make bind fail.
                let _ = std::fs::remove_file(path);
                let l = UnixListener::bind(path).map_err(|source| Error::Bind {
                    what: format!("front end {}", *f.name),
                    addr: path.clone(),
                    source,
                })?;
                addrs.listeners.insert(f.name.value.clone(), format!("unix:{path}"));
                FrontendSock::Unix(l, PathBuf::from(path))
            }
            (None, None) => unreachable!("validated: listen or unix"),
        };
        frontends.push((rt, sock));
    }
    let shared = Arc::new(Shared {
        registry: Registry::new(metrics.clone(), &cfg.clusters),
        config: ArcSwap::from_pointee(cfg),
        metrics,
        shutdown: Shutdown::new(),
        overrides: Mutex::new(BTreeMap::new()),
        conn_seq: AtomicU64::new(0),
        id_prefix: format!("{:08x}", rand::random::<u32>()),
    });
    for (name, mode) in shared.registry.modes() {
        shared.metrics.set_cluster_state(&name, mode.mode);
    }
    proxy_core::reload::mark_loaded(&shared.metrics.reload);
    if let Some(p) = &opts.write_addresses {
        proxy_core::addrs::write(p, &addrs).map_err(Error::AddressesFile)?;
    }
    Ok(Bound {
        shared,
        agents,
        agents_tls,
        frontends,
        admin,
        admin_token,
        prom,
        addrs,
        config_path: opts.config_path,
        write_addresses: opts.write_addresses,
    })
}

/// Apply a reloaded config: timeouts, limits and cluster states. Listener and TLS changes need
/// a restart and are refused, so what runs always matches what the file says.
fn apply(shared: &Shared, new: ServerConfig) -> Result<(), String> {
    let old = shared.config.load_full();
    if new.admin != old.admin || new.agents.listen != old.agents.listen || new.agents.tls != old.agents.tls {
        return Err("admin and agents listener/TLS settings cannot change at runtime; restart to apply".into());
    }
    if new.frontends != old.frontends {
        return Err("front ends cannot change at runtime; restart to apply".into());
    }
    shared.config.store(Arc::new(new));
    shared.registry.set_modes(&shared.effective_states());
    Ok(())
}

struct Hooks(Arc<Shared>);

impl Hooks {
    /// Clusters the operator cares about: those with a front end or a configured state.
    fn clusters(&self) -> Vec<String> {
        let cfg = self.0.config.load();
        let mut v: Vec<String> = cfg.frontends.iter().filter_map(|f| f.cluster.clone()).collect();
        v.extend(self.0.effective_states().keys().cloned());
        v.sort();
        v.dedup();
        v
    }
}

impl AdminHooks for Hooks {
    fn ready(&self) -> Vec<Check> {
        let reg = &self.0.registry;
        self.clusters()
            .into_iter()
            .map(|c| {
                let mode = reg.mode(&c);
                let sessions = reg.sessions(&c);
                let nodes: Vec<String> = sessions
                    .iter()
                    .map(|s| {
                        let node =
                            s.hello.lock().expect("not poisoned").as_ref().map(|h| h.node.clone()).unwrap_or_default();
                        format!("{}{}", s.peer, if node.is_empty() { String::new() } else { format!(" ({node})") })
                    })
                    .collect();
                let state = format!("{:?}", mode.mode).to_lowercase();
                match mode.mode {
                    // A fenced cluster is served elsewhere: no agent is expected here.
                    ClusterMode::Fenced => {
                        Check::new(format!("cluster-{c}"), true, format!("fenced: {} agents", sessions.len()))
                    }
                    _ => Check::new(
                        format!("cluster-{c}"),
                        !sessions.is_empty(),
                        format!("{state}: {} agents [{}]", sessions.len(), nodes.join(", ")),
                    ),
                }
            })
            .collect()
    }

    fn config(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(&**self.0.config.load()).unwrap_or_default();
        v["cluster_overrides"] =
            serde_json::to_value(&*self.0.overrides.lock().expect("not poisoned")).unwrap_or_default();
        v
    }

    fn control(&self, req: ControlRequest<'_>) -> Option<(http::StatusCode, String)> {
        use http::{Method, StatusCode};
        let name = req.path.strip_prefix("/control/clusters/")?;
        if !seedgate_config::server::valid_cluster_name(name) {
            return Some((StatusCode::BAD_REQUEST, format!("{name:?} is not a cluster name\n")));
        }
        match *req.method {
            Method::PUT | Method::POST => {
                let state: ClusterState = match serde_json::from_slice(req.body) {
                    Ok(s) => s,
                    Err(e) => {
                        return Some((
                            StatusCode::BAD_REQUEST,
                            format!(
                                "body must be JSON like {{\"state\":\"draining\",\"move_to\":[\"host:8132\"],\"drain_deadline\":\"30s\"}}: {e}\n"
                            ),
                        ));
                    }
                };
                self.0.overrides.lock().expect("not poisoned").insert(name.to_owned(), state);
            }
            Method::DELETE => {
                self.0.overrides.lock().expect("not poisoned").remove(name);
            }
            _ => return Some((StatusCode::METHOD_NOT_ALLOWED, "use PUT or DELETE\n".into())),
        }
        self.0.registry.set_modes(&self.0.effective_states());
        let mode = self.0.registry.mode(name);
        Some((StatusCode::OK, format!("cluster {name}: {:?}\n", mode.mode).to_lowercase()))
    }
}

impl Bound {
    pub fn local_addrs(&self) -> Addresses {
        self.addrs.clone()
    }

    pub fn shutdown(&self) -> Shutdown {
        self.shared.shutdown.clone()
    }

    pub async fn run(self, signal: impl Future<Output = ()>) -> Drained {
        let shared = self.shared.clone();
        let admin_stop = CancellationToken::new();
        let sessions_stop = CancellationToken::new();
        let _ = &self.write_addresses;
        if let Some(l) = self.admin {
            let state = AdminState {
                registry: self.prom.clone(),
                hooks: Arc::new(Hooks(shared.clone())),
                token: self.admin_token.clone(),
                draining: shared.shutdown.stop.clone(),
            };
            tokio::spawn(admin::serve(l, state, admin_stop.clone()));
        }
        let global = Arc::new(Semaphore::new(shared.config.load().limits.max_connections));
        // Agents: not counted against the front-end limit, not part of the front-end drain.
        {
            let shared = shared.clone();
            let acceptor = self.agents_tls.clone();
            let stop = sessions_stop.clone();
            let errors = shared.metrics.conn.accept_errors.clone();
            tracing::info!(addr = ?self.agents.local_addr().ok(), "agents listener up");
            tokio::spawn(accept_loop(
                self.agents,
                ConnLimit::new(Arc::new(Semaphore::new(Semaphore::MAX_PERMITS)), None),
                shared.shutdown.stop.clone(),
                tokio_util::task::TaskTracker::new(),
                move |e| errors.with_label_values(&["agents", accept_error_label(e)]).inc(),
                move |tcp, peer, permit| {
                    let fut = agents::serve_agent(shared.clone(), acceptor.clone(), tcp, peer, stop.clone());
                    async move {
                        fut.await;
                        drop(permit);
                    }
                },
            ));
        }
        for (fe, sock) in self.frontends {
            let limit = ConnLimit::new(global.clone(), None);
            let errors = shared.metrics.conn.accept_errors.clone();
            let name = fe.name.clone();
            let on_err = move |e: &std::io::Error| errors.with_label_values(&[&name, accept_error_label(e)]).inc();
            let stop = shared.shutdown.stop.clone();
            let tracker = shared.shutdown.tracker.clone();
            match sock {
                FrontendSock::Tcp(l, tls) => {
                    let shared = shared.clone();
                    tracing::info!(frontend = %fe.name, addr = ?l.local_addr().ok(), tls = tls.is_some(), "front end listening");
                    tokio::spawn(accept_loop(l, limit, stop, tracker, on_err, move |tcp, peer, permit| {
                        let conn = frontend::Accepted::Tcp(tcp, tls.clone());
                        frontend::connection(shared.clone(), fe.clone(), conn, peer.to_string(), permit)
                    }));
                }
                FrontendSock::Unix(l, path) => {
                    let shared = shared.clone();
                    tracing::info!(frontend = %fe.name, path = %path.display(), "front end listening");
                    let peer = format!("unix:{}", path.display());
                    tokio::spawn(accept_loop(l, limit, stop, tracker, on_err, move |s, _addr, permit| {
                        frontend::connection(
                            shared.clone(),
                            fe.clone(),
                            frontend::Accepted::Unix(s),
                            peer.clone(),
                            permit,
                        )
                    }));
                }
            }
        }
        if let Some(path) = self.config_path.clone() {
            let sh = shared.clone();
            tokio::spawn(proxy_core::reload::reload_loop(
                path,
                seedgate_config::server::parse,
                move |cfg| apply(&sh, cfg),
                shared.metrics.reload.clone(),
                shared.shutdown.stop.clone(),
            ));
        }
        tokio::select! {
            _ = signal => {}
            _ = shared.shutdown.stop.cancelled() => {}
        }
        let grace = shared.config.load().drain_grace.get();
        tracing::info!(
            grace_s = grace.as_secs_f64(),
            open = shared.shutdown.tracker.len(),
            "stopped accepting; draining"
        );
        let drained = shared.shutdown.drain(grace).await;
        sessions_stop.cancel();
        tracing::info!(forced = drained.forced, "drained");
        admin_stop.cancel();
        drained
    }
}
