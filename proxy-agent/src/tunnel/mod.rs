//! The agent end of the reverse tunnel: outbound sessions to every replica behind each configured server name (re-homed make-before-break), and dials within the allowlist.

mod establish;
mod machine;
mod metrics;
mod session;
mod slot;
mod stream;

pub(crate) use session::node_name;
pub(crate) use slot::slot_label;

use crate::replicas::Replicas;
use arc_swap::ArcSwap;
use metrics::TunnelMetrics;
use proxy_core::obs::minutes::PerMinute;
use proxy_core::prometheus::Registry;
use proxy_core::sync::Mutex;
use proxy_core::tunnel::{ALPN_V1, Secret};
use proxy_core::watch::{
    self,
    tls::{Reloading, TlsMetrics},
};
use seedgate_config::HostPort;
use seedgate_config::agent::Tunnel as TunnelCfg;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// State shared by all sessions of the agent.
pub(crate) struct Tunnel {
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
    /// This run of the agent (random, in every session's hello): a seed lets a session of a new
    /// run supersede those of an earlier run of the same node, which may be dead without a word.
    instance: String,
    /// The ServiceAccount token of `tunnel.token_file` as last read (empty: it held none):
    /// live sessions send each new value to their server, an empty one included.
    token: tokio::sync::watch::Sender<Secret>,
    /// Held while the file is read and `token` set, so that a slower read never replaces a
    /// newer one: `token` is always what the file held last.
    reading: Mutex<()>,
    /// The dials of the last minutes, by [`DIAL_RESULTS`] (the status page's).
    pub dials: PerMinute<{ DIAL_RESULTS.len() }>,
}

/// What the seed's dials in the shoot came to, as [`Tunnel::dials`] counts them: `ok`, or the
/// refusal's code.
pub(crate) const DIAL_RESULTS: [&str; 8] =
    ["ok", "not_allowed", "refused", "unreachable", "resolve_failed", "dial_timeout", "stream_limit", "bad_target"];

/// Count a dial that came to `code` (`ok` or a refusal's code; an unknown code counts as
/// `unreachable`, as the agent answers it).
pub(crate) fn count_dial(t: &Tunnel, code: &str) {
    t.dials.add(DIAL_RESULTS.iter().position(|c| *c == code).unwrap_or(3), 1);
}

/// How often `tunnel.token_file` is read for a renewed token (the kubelet renews a projected
/// token at 80 % of its life: minutes to hours ahead of its expiry).
const TOKEN_POLL: std::time::Duration = std::time::Duration::from_secs(1);

/// The token in `tunnel.token_file` (surrounding whitespace trimmed); empty when there is no
/// such file, or it holds none, or it cannot be read (logged when `warn`: the server then
/// refuses the session as `token_required`, saying why).
pub(crate) fn read_token(cfg: &TunnelCfg, warn: bool) -> Secret {
    let Some(file) = &cfg.token_file else { return Secret::default() };
    match std::fs::read_to_string(file) {
        Ok(t) if !t.trim().is_empty() => Secret::new(t.trim()),
        Ok(_) => {
            if warn {
                tracing::warn!(%file, "tunnel.token_file holds no token: this session goes without one");
            }
            Secret::default()
        }
        Err(e) => {
            if warn {
                tracing::warn!(%file, error = %e, "tunnel.token_file cannot be read: this session goes without a token");
            }
            Secret::default()
        }
    }
}

/// One configured server name and the loop keeping its sessions.
struct Name {
    configured: HostPort,
    replicas: Arc<Replicas>,
    /// Ends the name's loop: its sessions get GOAWAY, their streams run to their end.
    stop: CancellationToken,
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

/// The new `tunnel.tls` files of a reload could not be loaded (the reload is refused).
#[derive(Debug, thiserror::Error)]
#[error("tunnel.tls: {0}")]
pub struct TlsReloadError(#[source] proxy_core::tls::TlsError);

fn client_tls(cfg: &TunnelCfg, metrics: &TlsMetrics) -> Result<ClientTls, proxy_core::tls::TlsError> {
    let t = &cfg.tls;
    let identity = t.identity().map(|(c, k)| (c.as_ref(), k.as_ref()));
    let crl = t.crl.as_deref().map(AsRef::as_ref);
    let material = watch::tls::client("tunnel", t.ca.as_ref(), crl, identity, &[ALPN_V1], true, metrics)?;
    Ok(ClientTls { material, watching: CancellationToken::new() })
}

impl Tunnel {
    pub(crate) fn new(
        cfg: TunnelCfg,
        reg: &Registry,
        kill: CancellationToken,
    ) -> Result<Arc<Self>, proxy_core::tls::TlsError> {
        let tls_metrics = TlsMetrics::new(reg);
        let tls = client_tls(&cfg, &tls_metrics)?;
        let token = tokio::sync::watch::Sender::new(read_token(&cfg, false));
        Ok(Arc::new(Self {
            tls: ArcSwap::from_pointee(tls),
            tls_metrics,
            cfg: ArcSwap::from_pointee(cfg),
            metrics: TunnelMetrics::new(reg),
            active: AtomicUsize::new(0),
            names: Mutex::new(Vec::new()),
            run: Mutex::new(None),
            token,
            reading: Mutex::new(()),
            kill,
            instance: format!("{:016x}", rand::random::<u64>()),
            dials: PerMinute::default(),
        }))
    }

    /// Take a reloaded tunnel config (allowlist, timeouts, TLS file paths) for new sessions and
    /// streams. Changed TLS contents need no reload: they are watched. A server name added to
    /// `servers` gets its sessions now; one removed has its sessions closed with GOAWAY (their
    /// streams run to their end); names in both are untouched.
    pub(crate) fn reconfigure(self: &Arc<Self>, cfg: TunnelCfg) -> Result<(), TlsReloadError> {
        if cfg.tls != self.cfg.load().tls {
            let tls = client_tls(&cfg, &self.tls_metrics).map_err(TlsReloadError)?;
            tls.material.watch(tls.watching.clone());
            self.tls.store(Arc::new(tls));
        }
        let servers = cfg.servers.clone();
        self.cfg.store(Arc::new(cfg));
        let run = self.run.lock().clone();
        if let Some((stop, tracker)) = run {
            let mut names = self.names.lock();
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

    /// One check per configured server name: ready while a session is up, "degraded" while
    /// fewer replicas than announced are reached.
    pub(crate) fn ready_checks(&self) -> Vec<proxy_core::obs::admin::Check> {
        let transport = self.cfg.load().transport.as_str();
        self.names
            .lock()
            .iter()
            .map(|n| {
                let mut c = n.replicas.check();
                c.detail = format!("{} (transport {transport})", c.detail);
                c
            })
            .collect()
    }

    /// Start, per configured server name, the loop that keeps a session to each of its replicas.
    pub(crate) fn start(self: &Arc<Self>, stop: CancellationToken, tracker: TaskTracker) {
        let tls = self.tls.load();
        tls.material.watch(tls.watching.clone());
        *self.run.lock() = Some((stop.clone(), tracker.clone()));
        for server in self.cfg.load().servers.clone() {
            self.add_name(server, &stop, &tracker);
        }
        tokio::spawn(self.clone().follow_token(stop));
    }

    /// Read `tunnel.token_file` (the one the config in force names) every [`TOKEN_POLL`], and
    /// hand a changed token to the live sessions; an emptied or removed file too, which ends
    /// them (an agent never stays on a token its file no longer holds).
    async fn follow_token(self: Arc<Self>, stop: CancellationToken) {
        let mut tick = tokio::time::interval(TOKEN_POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            if self.cfg.load().token_file.is_none() {
                continue;
            }
            let this = self.clone();
            let _ = tokio::task::spawn_blocking(move || this.current_token(false)).await;
        }
    }

    /// Every configured server name with its replicas and the label of each slot (the status
    /// page's).
    pub(crate) fn servers(&self) -> Vec<(String, Arc<Replicas>)> {
        self.names.lock().iter().map(|n| (n.configured.to_string(), n.replicas.clone())).collect()
    }

    /// This run of the agent, as its hellos say.
    pub(crate) fn instance(&self) -> &str {
        &self.instance
    }

    /// Streams open across every session now.
    pub(crate) fn streams(&self) -> usize {
        self.active.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The token `tunnel.token_file` holds now (read now; `warn`: say so when it holds none),
    /// which live sessions then send if it changed.
    pub(crate) fn current_token(&self, warn: bool) -> Secret {
        let _reading = self.reading.lock();
        let now = read_token(&self.cfg.load(), warn);
        self.token.send_if_modified(|t| {
            if *t == now {
                return false;
            }
            if now.is_empty() {
                tracing::warn!(
                    "tunnel.token_file no longer holds a token: live sessions tell their server, which ends them; new ones go without a token until it holds one again"
                );
            } else {
                tracing::info!("tunnel.token_file: a renewed token; live sessions send it to their server");
            }
            *t = now.clone();
            true
        });
        now
    }

    /// The token renewals live sessions send (`None` without `tunnel.token_file`).
    pub(crate) fn token_renewals(&self) -> Option<tokio::sync::watch::Receiver<Secret>> {
        self.cfg.load().token_file.as_ref().map(|_| self.token.subscribe())
    }
}
