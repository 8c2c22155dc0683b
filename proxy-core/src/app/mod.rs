//! The process every binary runs: the shared lifecycle (bind, serve, reload, drain — and the whole `main`), its flags, shutdown and addresses file.
//!
//! A binary implements [`Service`] (what is particular to it: its sockets, how it applies a new
//! config, its readiness checks); this module does the rest the same way for all three: the admin
//! listener, the metrics registry, the connection slots, the reload loop (parse off the runtime,
//! refuse restart-only changes naming the key, apply, count, log), signals, the drain and the
//! addresses file. The shape follows mini-redis's `run(listener, shutdown)` and linkerd2-proxy's
//! build → spawn → drain.

pub mod addrs;
pub mod cli;
pub mod malloc;
pub mod memcpy;
pub mod shutdown;

use crate::app::addrs::Addresses;
use crate::app::shutdown::{Drained, Shutdown};
use crate::net::accept::Slots;
use crate::obs::admin::{self, AdminHooks, AdminState, Check, ControlRequest, StatusAccess, Token};
use crate::obs::metrics::{self, ReloadMetrics};
use crate::obs::status::{StatusPage, StatusQuery};
use crate::sync::Mutex;
use crate::tls::TlsError;
use crate::watch::config::{Trigger, Watch, mark_loaded};
use prometheus::Registry;
use seedgate_config::{AdminConfig, BinaryConfig, ConfigError, HostPort};
use serde::Serialize;
use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Where the config came from (for reloads) and where to report the bound addresses.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The config file; watched for changes and re-read on SIGHUP. `None`: no reloads.
    pub config_path: Option<PathBuf>,
    /// Write the bound addresses here (JSON) after binding and after every reload.
    pub write_addresses: Option<PathBuf>,
    /// This binary's metrics registry; default: a new one. Several binaries in one process (as
    /// tests run them) each need their own: their metrics have the same names. A registry that
    /// already holds a binary's metrics is refused at start ([`StartError::RegistryInUse`]).
    pub registry: Option<Registry>,
}

/// Why a binary could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{what}: cannot resolve {addr}: {source}")]
    Resolve {
        what: String,
        addr: String,
        #[source]
        source: io::Error,
    },
    #[error("{what}: cannot listen on {addr}: {source}")]
    Bind {
        what: String,
        addr: String,
        #[source]
        source: io::Error,
    },
    #[error("admin.token_file: {0}")]
    Token(#[source] io::Error),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("the metrics registry already holds the metrics of another binary; give each binary its own")]
    RegistryInUse,
    #[error("writing the addresses file {path}: {source}")]
    AddressesFile {
        path: String,
        #[source]
        source: io::Error,
    },
}

/// Why a reloaded config was refused; the running config stays in force.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError<E: std::error::Error + 'static> {
    /// The file could not be read or is not a valid config.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A part only a restart can change differs ([`Service::restart_only`]).
    #[error("{key} cannot change at runtime; restart {binary} to apply it")]
    RestartOnly { key: String, binary: &'static str },
    /// The new admin token file or listen address cannot be used.
    #[error(transparent)]
    Admin(#[from] StartError),
    /// The service refused it ([`Service::apply`]).
    #[error(transparent)]
    Service(E),
}

/// What the lifecycle hands a service when it binds.
#[derive(Clone)]
pub struct Ctx {
    pub registry: Registry,
    pub shutdown: Shutdown,
    /// Process-wide connection slots (`limits.max_connections`), resized on reload.
    pub connections: Arc<Slots>,
}

/// What is particular to one binary. Everything else about the process is [`bind`] and
/// [`Bound::run`].
pub trait Service: Sized + Send + Sync + 'static {
    type Config: BinaryConfig + Serialize + Send + Sync + 'static;
    /// The binary's name (logs, `seedgate_build_info`, messages, `--help`).
    const NAME: &'static str;

    /// The parts of the config only a restart can change, each under its key path. A reload that
    /// changes one is refused with a message naming the key that differs (never accepted and
    /// ignored). The `admin` section is handled by the lifecycle and must not be listed.
    fn restart_only(_cfg: &Self::Config) -> Vec<(&'static str, serde_json::Value)> {
        Vec::new()
    }
    /// `true` when `cfg` carries QUIC tunnel sessions: the process then keeps the work-stealing
    /// runtime even with one worker (see [`runtime_builder`]).
    fn quic_sessions(_cfg: &Self::Config) -> bool {
        false
    }
    /// Why [`Service::apply`] refuses a config.
    type ApplyError: std::error::Error + Send + Sync + 'static;
    /// What [`Service::bind`] opened for [`Service::start`] to serve (listening sockets, directory
    /// watches): handed over by value, so nothing holds it in between.
    type Opened: Send + 'static;

    /// Open every socket of `cfg`; serve nothing yet.
    fn bind(cfg: Arc<Self::Config>, ctx: Ctx) -> impl Future<Output = Result<(Self, Self::Opened), StartError>> + Send;
    /// Start serving what `bind` opened: accept loops and background tasks. Called once, inside
    /// the runtime.
    fn start(self: &Arc<Self>, opened: Self::Opened);
    /// Take a reloaded config (valid, restart-only parts unchanged). On `Err` nothing may have
    /// changed: the running config stays in force.
    fn apply(self: &Arc<Self>, new: Arc<Self::Config>) -> impl Future<Output = Result<(), Self::ApplyError>> + Send;
    /// Every listening socket by name (`ip:port`, or `unix:<path>`).
    fn listeners(&self) -> BTreeMap<String, String>;
    /// Readiness checks; the process is ready when all pass (and it is not draining).
    fn ready(&self) -> Vec<Check>;
    /// `/config`: the running config with secrets redacted.
    fn show_config(&self, running: &Self::Config) -> serde_json::Value {
        serde_json::to_value(running).unwrap_or_default()
    }
    /// Authenticated `/control/` endpoints; `None` = no such endpoint.
    fn control(&self, _req: ControlRequest<'_>) -> Option<(http::StatusCode, String)> {
        None
    }
    /// `/status` and `/`: the binary's status document for `query` and the page that shows it;
    /// `None`: no status page. Runs on a blocking thread, never on the runtime's workers.
    fn status(&self, _query: &StatusQuery) -> Option<StatusPage> {
        None
    }
    /// After the connections drained: end what does not drain with them (e.g. tunnel sessions).
    fn stopped(&self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// One entry of [`Service::restart_only`]: `value` under its key path.
pub fn fixed<T: Serialize + ?Sized>(key: &'static str, value: &T) -> (&'static str, serde_json::Value) {
    (key, serde_json::to_value(value).unwrap_or_default())
}

/// Resolve the listen address of `what` without blocking a runtime thread.
pub async fn resolve_listen(what: &str, hp: &HostPort) -> Result<SocketAddr, StartError> {
    crate::net::resolve_one(hp).await.map_err(|source| StartError::Resolve {
        what: what.to_owned(),
        addr: hp.to_string(),
        source,
    })
}

/// Resolve (without blocking a runtime thread) and bind a TCP listener for `what`.
pub async fn listen_tcp(what: &str, hp: &HostPort) -> Result<(TcpListener, SocketAddr), StartError> {
    let (mut socks, local) = listen_tcp_shards(what, hp, 1).await?;
    let sock = socks.pop().ok_or_else(|| StartError::Bind {
        what: what.to_owned(),
        addr: hp.to_string(),
        source: io::Error::other("no socket"),
    })?;
    Ok((sock, local))
}

/// [`listen_tcp`] for one accept loop per worker of the runtime that runs it: as many sockets
/// sharing the address (see [`crate::net::bind_tcp_shards`]); one socket on a one-worker runtime.
pub async fn listen_tcp_shards(
    what: &str,
    hp: &HostPort,
    n: usize,
) -> Result<(Vec<TcpListener>, SocketAddr), StartError> {
    let addr = resolve_listen(what, hp).await?;
    let bind_err = |source| StartError::Bind { what: what.to_owned(), addr: hp.to_string(), source };
    let socks = crate::net::bind_tcp_shards(addr, n).map_err(bind_err)?;
    let local = socks.first().map(TcpListener::local_addr).transpose().map_err(bind_err)?.unwrap_or(addr);
    Ok((socks, local))
}

/// How many accept loops a listener should run: one per worker of the current runtime.
pub fn accept_loops() -> usize {
    tokio::runtime::Handle::try_current().map(|h| h.metrics().num_workers()).unwrap_or(1).max(1)
}

/// The running admin listener.
struct AdminRt {
    listen: Option<HostPort>,
    addr: Option<SocketAddr>,
    stop: CancellationToken,
}

struct App<S: Service> {
    service: Arc<S>,
    ctx: Ctx,
    running: Mutex<Arc<S::Config>>,
    reload: ReloadMetrics,
    admin: Mutex<AdminRt>,
    token: Token,
    /// Who may read the status page (`admin.status_requires_token`), for every admin listener.
    status: StatusAccess,
    write_addresses: Option<PathBuf>,
}

/// A binary whose sockets are bound; [`Bound::run`] serves.
pub struct Bound<S: Service> {
    app: Arc<App<S>>,
    admin: Option<TcpListener>,
    watch: Option<Watch>,
    opened: S::Opened,
}

fn load_token(admin: &AdminConfig) -> Result<Option<Arc<str>>, StartError> {
    admin::load_token(admin.token_file.as_deref()).map_err(StartError::Token)
}

async fn bind_admin(admin: &AdminConfig) -> Result<Option<(TcpListener, SocketAddr)>, StartError> {
    match &admin.listen {
        None => Ok(None),
        Some(hp) => listen_tcp("admin listener", hp).await.map(Some),
    }
}

/// Bind everything `cfg` asks for: the admin listener, then the service's sockets.
pub async fn bind<S: Service>(cfg: S::Config, opts: Options) -> Result<Bound<S>, StartError> {
    // Watched from here, not from when the reload task first runs: a change made between start
    // and then would otherwise go unnoticed.
    let watch = opts.config_path.map(Watch::new);
    let registry = opts.registry.unwrap_or_default();
    // The status page's uptime counts from here.
    let _ = crate::obs::status::started();
    if metrics::holds_build_info(&registry) {
        return Err(StartError::RegistryInUse);
    }
    metrics::register_build_info(&registry, S::NAME);
    crate::obs::runtime_metrics::register(&registry);
    let reload = ReloadMetrics::new(&registry);
    let cfg = Arc::new(cfg);
    let token = Arc::new(crate::sync::RwLock::new(load_token(cfg.admin())?));
    let admin = bind_admin(cfg.admin()).await?;
    let ctx = Ctx { registry, shutdown: Shutdown::new(), connections: Slots::new(cfg.max_connections()) };
    ctx.connections.register(&ctx.registry);
    let (service, opened) = S::bind(cfg.clone(), ctx.clone()).await?;
    let service = Arc::new(service);
    let app = Arc::new(App {
        service,
        ctx,
        admin: Mutex::new(AdminRt {
            listen: cfg.admin().listen.clone(),
            addr: admin.as_ref().map(|(_, a)| *a),
            stop: CancellationToken::new(),
        }),
        status: StatusAccess::default(),
        running: Mutex::new(cfg),
        reload,
        token,
        write_addresses: opts.write_addresses,
    });
    app.status.requires_token.store(app.running().admin().status_requires_token, Ordering::Relaxed);
    mark_loaded(&app.reload);
    app.write_addresses().map_err(|source| StartError::AddressesFile {
        path: app.write_addresses.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
        source,
    })?;
    Ok(Bound { app, admin: admin.map(|(l, _)| l), watch, opened })
}

impl<S: Service> Bound<S> {
    pub fn local_addrs(&self) -> Addresses {
        self.app.addresses()
    }

    /// The shutdown handle: cancelling `stop` has the same effect as the signal given to `run`.
    pub fn shutdown(&self) -> Shutdown {
        self.app.ctx.shutdown.clone()
    }

    pub fn service(&self) -> &Arc<S> {
        &self.app.service
    }

    /// Serve until `signal` completes (or `shutdown().stop` is cancelled), then stop accepting,
    /// drain for `drain_grace` (of the config in force then) and stop.
    pub async fn run(self, signal: impl Future<Output = ()>) -> Drained {
        let app = self.app;
        let shutdown = app.ctx.shutdown.clone();
        // Started before the admin listener answers, so that no probe sees a service that has
        // not started (its readiness lines not there yet).
        app.service.start(self.opened);
        if let Some(l) = self.admin {
            app.serve_admin(l, app.admin.lock().stop.clone());
        }
        if let Some(watch) = self.watch {
            tokio::spawn(app.clone().reload_loop(watch));
        }
        tokio::select! {
            _ = signal => {}
            _ = shutdown.stop.cancelled() => {}
        }
        let grace = app.running().drain_grace();
        tracing::info!(grace_s = grace.as_secs_f64(), open = shutdown.tracker.len(), "stopped accepting; draining");
        let drained = shutdown.drain(grace).await;
        app.service.stopped().await;
        tracing::info!(forced = drained.forced, "drained");
        app.admin.lock().stop.cancel();
        drained
    }
}

impl<S: Service> App<S> {
    fn running(&self) -> Arc<S::Config> {
        self.running.lock().clone()
    }

    fn addresses(&self) -> Addresses {
        Addresses { admin: self.admin.lock().addr, listeners: self.service.listeners() }
    }

    fn write_addresses(&self) -> io::Result<()> {
        match &self.write_addresses {
            Some(p) => crate::app::addrs::write(p, &self.addresses()),
            None => Ok(()),
        }
    }

    fn serve_admin(self: &Arc<Self>, l: TcpListener, stop: CancellationToken) {
        let state = AdminState {
            status: self.status.clone(),
            ..AdminState::new(
                self.ctx.registry.clone(),
                Arc::new(Hooks(self.clone())),
                self.token.clone(),
                self.ctx.shutdown.stop.clone(),
            )
        };
        tracing::info!(addr = ?l.local_addr().ok(), "admin listening");
        tokio::spawn(admin::serve(l, state, stop));
    }

    async fn reload_loop(self: Arc<Self>, mut watch: Watch) {
        let stop = self.ctx.shutdown.stop.clone();
        loop {
            let why = tokio::select! {
                _ = stop.cancelled() => return,
                w = watch.next() => w,
            };
            self.reload(why, &watch).await;
        }
    }

    /// Parse (off the runtime: tens of ms for 10,000 routes), check, apply; count and log.
    async fn reload(self: &Arc<Self>, why: Trigger, watch: &Watch) {
        let started = Instant::now();
        let path = watch.path().to_owned();
        let file = path.display().to_string();
        let loaded = tokio::task::spawn_blocking(move || seedgate_config::load(&path, S::Config::parse))
            .await
            .unwrap_or_else(|e| Err(ConfigError::internal(&file, &e.to_string())));
        let parse_ms = started.elapsed().as_secs_f64() * 1e3;
        let result = match loaded {
            Ok(cfg) => self.apply(Arc::new(cfg)).await,
            Err(e) => Err(ReloadError::Config(e)),
        };
        let total_ms = started.elapsed().as_secs_f64() * 1e3;
        match result {
            Ok(()) => {
                // The line first, then the count: whoever polls the count finds the line written.
                tracing::info!(trigger = why.label(), %file, parse_ms, total_ms, "config reloaded");
                self.reload.reloads.with_label_values(&["success"]).inc();
                mark_loaded(&self.reload);
            }
            Err(e) => {
                tracing::error!(trigger = why.label(), %file, error = %e, "config reload refused; the running config stays in force");
                self.reload.reloads.with_label_values(&["failure"]).inc();
            }
        }
    }

    /// Apply `new`, or change nothing. Public to tests through [`Bound`]'s reload path only.
    async fn apply(self: &Arc<Self>, new: Arc<S::Config>) -> Result<(), ReloadError<S::ApplyError>> {
        let old = self.running();
        for ((key, was), (_, now)) in S::restart_only(&old).into_iter().zip(S::restart_only(&new)) {
            if let Some(path) = first_difference(key, &was, &now) {
                return Err(ReloadError::RestartOnly { key: path, binary: S::NAME });
            }
        }
        // Admin first (bind before anything changes), committed only if the service applies.
        let token = load_token(new.admin())?;
        let admin = if old.admin().listen != new.admin().listen { Some(bind_admin(new.admin()).await?) } else { None };
        self.service.apply(new.clone()).await.map_err(ReloadError::Service)?;
        *self.token.write() = token;
        self.status.requires_token.store(new.admin().status_requires_token, Ordering::Relaxed);
        if let Some(bound) = admin {
            self.move_admin(new.admin().listen.clone(), bound);
        }
        if new.max_connections() != old.max_connections() {
            self.ctx.connections.resize(new.max_connections());
        }
        *self.running.lock() = new;
        if let Err(e) = self.write_addresses() {
            tracing::warn!(error = %e, "cannot write the addresses file");
        }
        Ok(())
    }

    fn move_admin(self: &Arc<Self>, listen: Option<HostPort>, bound: Option<(TcpListener, SocketAddr)>) {
        let stop = CancellationToken::new();
        let old = {
            let mut a = self.admin.lock();
            let old = std::mem::replace(&mut a.stop, stop.clone());
            a.listen = listen;
            a.addr = bound.as_ref().map(|(_, addr)| *addr);
            old
        };
        old.cancel();
        if let Some((l, _)) = bound {
            self.serve_admin(l, stop);
        }
    }
}

/// The key path of the first difference between `a` and `b` under `key`, descending into
/// objects and equally long arrays, so a message names `agents.tls.cert`, not `agents`.
pub fn first_difference(key: &str, a: &serde_json::Value, b: &serde_json::Value) -> Option<String> {
    use serde_json::Value;
    if a == b {
        return None;
    }
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            keys.into_iter().find_map(|k| {
                let (p, q) = (x.get(k).unwrap_or(&Value::Null), y.get(k).unwrap_or(&Value::Null));
                first_difference(&format!("{key}.{k}"), p, q)
            })
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            x.iter().zip(y).enumerate().find_map(|(i, (p, q))| first_difference(&format!("{key}[{i}]"), p, q))
        }
        _ => Some(key.to_owned()),
    }
}

struct Hooks<S: Service>(Arc<App<S>>);

impl<S: Service> AdminHooks for Hooks<S> {
    fn ready(&self) -> Vec<Check> {
        let mut checks = vec![connection_limit_check(&self.0.ctx.connections)];
        checks.extend(self.0.service.ready());
        checks
    }

    fn config(&self) -> serde_json::Value {
        self.0.service.show_config(&self.0.running())
    }

    fn control(&self, req: ControlRequest<'_>) -> Option<(http::StatusCode, String)> {
        self.0.service.control(req)
    }

    fn status(&self, query: &StatusQuery) -> Option<StatusPage> {
        self.0.service.status(query)
    }
}

/// `/readyz?verbose` line of `limits.max_connections`, information only: at the limit the process
/// still serves every connection it holds, and failing readiness would only move load that then
/// comes back; the line (and `seedgate_connection_limit_*`) tells overload from a fault.
fn connection_limit_check(slots: &Slots) -> Check {
    let st = slots.stats();
    let now = if st.waiting.get() > 0 {
        "at the limit now: accepting paused, new connections wait in the kernel backlog"
    } else {
        "below the limit"
    };
    Check::info(
        "connection-limit",
        format!(
            "{}/{} connection slots in use, {now}; waited for a slot {} times, {:.3}s in all",
            slots.in_use(),
            slots.size(),
            st.waits.get(),
            st.wait_seconds.get()
        ),
    )
}

/// The number of threads `TOKIO_WORKER_THREADS` (tokio's own override) names, if it names a
/// positive one.
fn named_workers(env: Option<&str>) -> Option<usize> {
    env.and_then(|v| v.trim().parse::<usize>().ok()).filter(|n| *n > 0)
}

/// How many worker threads the runtime should have: what `TOKIO_WORKER_THREADS` names, else the
/// CPUs this process may use (`available_parallelism`: its affinity and its cgroup's CPU quota);
/// `None` when neither says.
fn workers(env: Option<&str>) -> Option<usize> {
    named_workers(env).or_else(|| std::thread::available_parallelism().ok().map(std::num::NonZeroUsize::get))
}

/// The runtime for `workers` threads. With one, a current-thread runtime: the work-stealing
/// scheduler with a single worker costs atomics, queue hand-offs and separate passes over the
/// I/O driver on every wake-up, and it runs a task another one woke at once (its LIFO slot),
/// where the current-thread runtime queues it behind the tasks ready before it, which lets an
/// HTTP/2 session gather more frames per write: a quarter more CONNECTs per second through the
/// tunnel when both ends share one CPU. Except with `quic` sessions: quinn's drivers hand work
/// to each other and to the streams by waking them, and they lose the most from waiting in
/// line (a QUIC tunnel with 64 busy streams moved a sixth less on the current-thread runtime).
/// With more workers, or when unknown, the work-stealing runtime, sized here.
fn runtime_builder(workers: Option<usize>, quic: bool) -> tokio::runtime::Builder {
    let mut b = match workers {
        Some(1) if !quic => tokio::runtime::Builder::new_current_thread(),
        Some(n) => {
            // Sized here, so tokio does not read (and panic on) a malformed variable itself.
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n);
            b
        }
        None => tokio::runtime::Builder::new_multi_thread(),
    };
    b.enable_all();
    b
}

/// The whole `main` of a binary: flags, logging, config (`--check` exits here), bind, serve
/// until SIGTERM/SIGINT, drain. Exit codes: 0 after a drain, 2 for an invalid config, 1 when the
/// binary cannot start (the reason on stderr).
pub fn main<S: Service>(about: &'static str) -> std::process::ExitCode {
    use std::process::ExitCode;
    // Before any thread (and its heap) exists.
    let trim = crate::app::malloc::keep_heap_top();
    let args = crate::app::cli::CommonArgs::parse_for::<S::Config>(S::NAME, about);
    crate::obs::telemetry::init(args.log_format);
    let cfg = crate::app::cli::load_or_exit::<S::Config>(&args);
    crate::app::memcpy::log_advice();
    if trim == Some(false) {
        tracing::warn!(
            threshold = crate::app::malloc::TRIM_THRESHOLD,
            "glibc refused the heap trim threshold: bulk transfers cost more CPU in page faults"
        );
    }
    let env = std::env::var("TOKIO_WORKER_THREADS").ok();
    let workers = workers(env.as_deref());
    if let Some(v) = env.as_deref().filter(|v| named_workers(Some(v)).is_none()) {
        tracing::warn!(value = %v, "TOKIO_WORKER_THREADS is not a positive number of threads; ignored");
    }
    let rt = match runtime_builder(workers, S::quic_sessions(&cfg)).build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{}: cannot start the async runtime: {e}", S::NAME);
            return ExitCode::FAILURE;
        }
    };
    tracing::info!(?workers, flavor = ?rt.handle().runtime_flavor(), "async runtime");
    let code = rt.block_on(async {
        // Handlers first: the addresses file tells others we are up and may be signalled.
        let signal = crate::app::shutdown::termination_signal();
        let opts =
            Options { config_path: Some(args.config.clone()), write_addresses: args.write_addresses, registry: None };
        match bind::<S>(cfg, opts).await {
            Ok(bound) => {
                bound.run(signal).await;
                ExitCode::SUCCESS
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot start");
                eprintln!("{}: {e}", S::NAME);
                ExitCode::FAILURE
            }
        }
    });
    // A DNS lookup still running on a blocking thread must not hold the exit.
    rt.shutdown_timeout(Duration::from_secs(1));
    code
}

#[cfg(test)]
mod tests {
    use super::{first_difference, runtime_builder, workers};
    use serde_json::json;
    use tokio::runtime::RuntimeFlavor;

    #[test]
    fn one_cpu_gets_a_current_thread_runtime_and_more_get_workers() {
        let flavor = |n, quic| runtime_builder(n, quic).build().expect("runtime").handle().runtime_flavor();
        assert_eq!(flavor(Some(1), false), RuntimeFlavor::CurrentThread);
        assert_eq!(flavor(Some(2), false), RuntimeFlavor::MultiThread);
        assert_eq!(runtime_builder(Some(3), false).build().expect("runtime").metrics().num_workers(), 3);
        assert_eq!(flavor(None, false), RuntimeFlavor::MultiThread);
        // QUIC sessions keep the work-stealing runtime, with the one worker asked for.
        assert_eq!(flavor(Some(1), true), RuntimeFlavor::MultiThread);
        assert_eq!(runtime_builder(Some(1), true).build().expect("runtime").metrics().num_workers(), 1);
        // tokio's own override counts; one that is not a positive number does not.
        assert_eq!(workers(Some("1")), Some(1));
        assert_eq!(workers(Some(" 3 ")), Some(3));
        let cpus = std::thread::available_parallelism().ok().map(std::num::NonZeroUsize::get);
        for junk in [Some("0"), Some("many"), Some(""), None] {
            assert_eq!(workers(junk), cpus, "{junk:?}");
        }
        // Timers and sockets work in either.
        let rt = runtime_builder(Some(1), false).build().expect("runtime");
        rt.block_on(async {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
            tokio::time::timeout(
                std::time::Duration::from_secs(5),
                tokio::net::TcpStream::connect(l.local_addr().unwrap()),
            )
            .await
            .expect("in time")
            .expect("connected");
        });
    }

    #[test]
    fn names_the_deepest_key_that_differs() {
        let a = json!({"listen": "127.0.0.1:1", "tls": {"cert": "a.crt", "key": "k"}});
        let b = json!({"listen": "127.0.0.1:1", "tls": {"cert": "b.crt", "key": "k"}});
        assert_eq!(first_difference("agents", &a, &b).as_deref(), Some("agents.tls.cert"));
        assert_eq!(first_difference("agents", &a, &a), None);
        let (x, y) = (json!([{"n": 1}, {"n": 2}]), json!([{"n": 1}, {"n": 3}]));
        assert_eq!(first_difference("frontends", &x, &y).as_deref(), Some("frontends[1].n"));
        assert_eq!(first_difference("frontends", &x, &json!([])).as_deref(), Some("frontends"));
        assert_eq!(first_difference("t", &json!({"a": 1}), &json!({})).as_deref(), Some("t.a"));
    }
}
