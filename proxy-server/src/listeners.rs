//! proxy-server's sockets: the agents' listener (mTLS) and the front ends (TCP with or without TLS, Unix sockets).

use crate::Shared;
use crate::frontend::{self, FrontendRt};
use proxy_core::accept::{ConnLimit, Slots, UNLIMITED, accept_error_label, accept_loop};
use proxy_core::app::{StartError, listen_tcp};
use proxy_core::tls_watch::{self, Reloading, TlsMetrics};
use proxy_core::tunnel::ALPN_V1;
use seedgate_config::ServerConfig;
use seedgate_config::server::Frontend;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use tokio::net::{TcpListener, UnixListener};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

/// The TLS material of a listener, reloaded from its files when they change.
type Tls = Arc<Reloading<rustls::ServerConfig>>;

enum Sock {
    Tcp(TcpListener, Option<Tls>),
    Unix(UnixListener, PathBuf),
}

/// Every socket, bound at start; served from [`Listeners::start`].
pub(crate) struct Listeners {
    addrs: BTreeMap<String, String>,
    pending: Mutex<Option<Pending>>,
}

struct Pending {
    agents: TcpListener,
    agents_tls: Tls,
    frontends: Vec<(Arc<FrontendRt>, Sock)>,
}

fn frontend_tls(f: &Frontend, metrics: &TlsMetrics) -> Result<Option<Tls>, StartError> {
    let Some(t) = &f.tls else { return Ok(None) };
    let client_ca = t.client_ca.as_deref().map(AsRef::as_ref);
    let use_ = format!("frontend {}", *f.name);
    Ok(Some(tls_watch::server(&use_, t.cert.as_ref(), t.key.as_ref(), client_ca, &[b"http/1.1"], false, metrics)?))
}

fn bind_unix(name: &str, path: &str) -> Result<UnixListener, StartError> {
    // A stale socket file from a previous run would make bind fail.
    let _ = std::fs::remove_file(path);
    UnixListener::bind(path).map_err(|source| StartError::Bind {
        what: format!("front end {name}"),
        addr: path.to_owned(),
        source,
    })
}

impl Listeners {
    pub(crate) async fn bind(cfg: &ServerConfig, metrics: &TlsMetrics) -> Result<Self, StartError> {
        let t = &cfg.agents.tls;
        let client_ca = t.client_ca.as_deref().map(AsRef::as_ref);
        let agents_tls =
            tls_watch::server("agents", t.cert.as_ref(), t.key.as_ref(), client_ca, &[ALPN_V1], true, metrics)?;
        let (agents, agents_addr) = listen_tcp("agents listener", &cfg.agents.listen).await?;
        let mut addrs = BTreeMap::from([("agents".to_owned(), agents_addr.to_string())]);
        let mut frontends = Vec::new();
        for f in &cfg.frontends {
            let rt = Arc::new(FrontendRt { name: Arc::from(f.name.as_str()), cluster: f.cluster.clone() });
            let sock = match (&f.listen, &f.unix) {
                (Some(hp), _) => {
                    let (l, addr) = listen_tcp(&format!("front end {}", *f.name), hp).await?;
                    addrs.insert(f.name.value.clone(), addr.to_string());
                    Sock::Tcp(l, frontend_tls(f, metrics)?)
                }
                (None, Some(path)) => {
                    let l = bind_unix(&f.name, path)?;
                    addrs.insert(f.name.value.clone(), format!("unix:{path}"));
                    Sock::Unix(l, PathBuf::from(path))
                }
                (None, None) => unreachable!("validated: listen or unix"),
            };
            frontends.push((rt, sock));
        }
        Ok(Self { addrs, pending: Mutex::new(Some(Pending { agents, agents_tls, frontends })) })
    }

    pub(crate) fn addresses(&self) -> BTreeMap<String, String> {
        self.addrs.clone()
    }

    /// Start the accept loops. Agent sessions end with `sessions_stop` (after the front ends
    /// drained); front-end connections drain with the process.
    pub(crate) fn start(&self, shared: &Arc<Shared>, sessions_stop: &CancellationToken) {
        let Some(p) = self.pending.lock().expect("not poisoned").take() else { return };
        let stop = shared.shutdown.stop.clone();
        // Certificates and CAs are watched for as long as new handshakes can happen.
        p.agents_tls.watch(stop.clone());
        for (_, sock) in &p.frontends {
            if let Sock::Tcp(_, Some(tls)) = sock {
                tls.watch(stop.clone());
            }
        }
        let errors = shared.metrics.conn.accept_errors.clone();
        // Agents: not counted against the front-end limit, not part of the front-end drain.
        {
            let (shared, tls, sessions) = (shared.clone(), p.agents_tls, sessions_stop.clone());
            let errors = errors.clone();
            tracing::info!(addr = ?p.agents.local_addr().ok(), "agents listener up");
            tokio::spawn(accept_loop(
                p.agents,
                ConnLimit::new(Slots::new(UNLIMITED), None),
                stop.clone(),
                tokio_util::task::TaskTracker::new(),
                move |e| errors.with_label_values(&["agents", accept_error_label(e)]).inc(),
                move |tcp, peer, permit| {
                    let acceptor = TlsAcceptor::from(tls.current());
                    let fut = crate::agents::serve_agent(shared.clone(), acceptor, tcp, peer, sessions.clone());
                    async move {
                        fut.await;
                        drop(permit);
                    }
                },
            ));
        }
        for (fe, sock) in p.frontends {
            let limit = ConnLimit::new(shared.connections.clone(), None);
            let errors = errors.clone();
            let name = fe.name.clone();
            let on_err = move |e: &std::io::Error| errors.with_label_values(&[&name, accept_error_label(e)]).inc();
            let tracker = shared.shutdown.tracker.clone();
            let shared = shared.clone();
            match sock {
                Sock::Tcp(l, tls) => {
                    tracing::info!(frontend = %fe.name, addr = ?l.local_addr().ok(), tls = tls.is_some(), "front end listening");
                    tokio::spawn(accept_loop(l, limit, stop.clone(), tracker, on_err, move |tcp, peer, permit| {
                        let conn = frontend::Accepted::Tcp(tcp, tls.as_ref().map(|t| TlsAcceptor::from(t.current())));
                        frontend::connection(shared.clone(), fe.clone(), conn, peer.to_string(), permit)
                    }));
                }
                Sock::Unix(l, path) => {
                    tracing::info!(frontend = %fe.name, path = %path.display(), "front end listening");
                    let peer = format!("unix:{}", path.display());
                    tokio::spawn(accept_loop(l, limit, stop.clone(), tracker, on_err, move |s, _addr, permit| {
                        let conn = frontend::Accepted::Unix(s);
                        frontend::connection(shared.clone(), fe.clone(), conn, peer.clone(), permit)
                    }));
                }
            }
        }
    }
}
