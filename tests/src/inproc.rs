//! The three binaries in this process: bound by their library's `bind()` and served by
//! `run(stop)`, for tests where no process boundary is the point.
//!
//! Each [`InProc`] gets what a process would give it and a test may look at: its own runtime
//! (multi-threaded, as `main` builds it), its own log (the text format of the binary, captured
//! in memory), the config file it watches and the addresses file it rewrites after every reload
//! (the same [`Files`] as a [`Running`](crate::proc::Running) process). Signals, exit codes and a
//! descriptor table of its own stay with processes.

use crate::proc::{Addresses, Files};
use crate::tmp::TempDir;
use anyhow::{Context as _, bail};
use proxy_core::app::shutdown::{Drained, Shutdown};
use proxy_core::app::{Bound, Options, Service};
use proxy_core::prometheus::Registry;
use std::cell::RefCell;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::task::JoinHandle;

/// How long [`InProc::stop`] waits for `run` to return: longer than any drain grace the tests
/// configure.
const STOP_DEADLINE: Duration = Duration::from_secs(30);
/// Worker threads of each binary's runtime (the binaries run on every core; tests run several).
const WORKERS: usize = 2;

/// A binary served in this process. Dropping it ends its runtime: every socket it holds closes,
/// as when a process is killed.
pub struct InProc {
    pub files: Files,
    label: String,
    log: Log,
    /// Its metrics registry (one per binary: their metric names would collide in a shared one).
    registry: Registry,
    shutdown: Shutdown,
    task: Option<JoinHandle<Drained>>,
    rt: Option<tokio::runtime::Runtime>,
}

impl std::ops::Deref for InProc {
    type Target = Files;
    fn deref(&self) -> &Files {
        &self.files
    }
}

impl InProc {
    /// Parse `yaml` as the config of `bin` (`sni-router`, `proxy-server` or `proxy-agent`), bind
    /// and serve it. The config file (`<dir>/<bin>-<n>.yaml`, `n` counting the binaries this
    /// process started) is watched: rewriting it reloads.
    pub async fn start(dir: &TempDir, bin: &str, yaml: &str) -> anyhow::Result<Self> {
        static STARTED: AtomicU32 = AtomicU32::new(0);
        let n = STARTED.fetch_add(1, Ordering::Relaxed);
        let files = Files::write(dir, &format!("{bin}-{n}"), yaml)?;
        let log = Log::default();
        let registry = Registry::new();
        let rt = runtime(bin, &log)?;
        let opts = Options {
            config_path: Some(files.config.clone()),
            write_addresses: Some(files.addresses.clone()),
            registry: Some(registry.clone()),
        };
        let (file, yaml) = (files.config.display().to_string(), yaml.to_owned());
        // Bound on its own runtime, so its sockets belong to that runtime's reactor.
        let started = match bin {
            "sni-router" => rt.spawn(async move {
                let cfg = seedgate_config::router::parse(&yaml, &file)?;
                anyhow::Ok(serve(sni_router::bind(cfg, opts).await?))
            }),
            "proxy-server" => rt.spawn(async move {
                let cfg = seedgate_config::server::parse(&yaml, &file)?;
                anyhow::Ok(serve(proxy_server::bind(cfg, opts).await?))
            }),
            "proxy-agent" => rt.spawn(async move {
                let cfg = seedgate_config::agent::parse(&yaml, &file)?;
                anyhow::Ok(serve(proxy_agent::bind(cfg, opts).await?))
            }),
            other => bail!("{other} is not one of the three binaries"),
        };
        let label = bin.to_owned();
        let (shutdown, task) = match started.await? {
            Ok(s) => s,
            Err(e) => {
                rt.shutdown_background();
                return Err(e.context(format!("{label} did not start; its log:\n{}", log.text())));
            }
        };
        Ok(Self { files, label, log, registry, shutdown, task: Some(task), rt: Some(rt) })
    }

    /// [`InProc::start`], and the addresses it bound.
    pub async fn serve(dir: &TempDir, bin: &str, yaml: &str) -> anyhow::Result<(Self, Addresses)> {
        let p = Self::start(dir, bin, yaml).await?;
        let addrs = p.addrs()?;
        Ok((p, addrs))
    }

    /// The addresses it is bound to now (rewritten after every reload).
    pub fn addrs(&self) -> anyhow::Result<Addresses> {
        self.read_addresses().with_context(|| format!("reading {}", self.addresses.display()))
    }

    /// The address of its listener `name` now.
    pub fn listener(&self, name: &str) -> anyhow::Result<std::net::SocketAddr> {
        self.addrs()?.listener(name)
    }

    /// The address of its admin listener.
    pub fn admin(&self) -> anyhow::Result<std::net::SocketAddr> {
        self.addrs()?.admin()
    }

    /// Its metrics now, in the Prometheus text format (read from its registry, not over HTTP).
    pub fn metrics(&self) -> String {
        proxy_core::obs::metrics::render(&self.registry)
    }

    /// Everything it logged so far (the binary's text format).
    pub fn log(&self) -> String {
        self.log.text()
    }

    /// Wait up to `deadline` for a log line containing every one of `needles`; returns the line.
    pub async fn wait_log_line(&self, needles: &[&str], deadline: Duration) -> anyhow::Result<String> {
        crate::proc::wait_log_line(&self.label, || self.log(), needles, deadline).await
    }

    /// Whether `run` is still serving (it has not returned, nor panicked).
    pub fn running(&self) -> bool {
        self.task.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// What SIGTERM starts: stop accepting and drain for `drain_grace` (the admin listener keeps
    /// answering meanwhile); [`InProc::stop`] waits for the end.
    pub fn drain(&self) {
        self.shutdown.stop.cancel();
    }

    /// What SIGTERM does to the process: stop accepting, drain for `drain_grace`, return.
    pub async fn stop(mut self) -> anyhow::Result<Drained> {
        self.shutdown.stop.cancel();
        let task = self.task.take().context("already stopped")?;
        Ok(tokio::time::timeout(STOP_DEADLINE, task).await.context("run() did not return after stop")??)
    }
}

impl Drop for InProc {
    fn drop(&mut self) {
        // Not waited for: this may run inside the test's runtime, where blocking is not allowed.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

fn serve<S: Service>(bound: Bound<S>) -> (Shutdown, JoinHandle<Drained>) {
    let shutdown = bound.shutdown();
    (shutdown, tokio::spawn(bound.run(std::future::pending())))
}

/// A multi-threaded runtime whose every thread (workers and blocking pool) logs into `log`.
fn runtime(bin: &str, log: &Log) -> anyhow::Result<tokio::runtime::Runtime> {
    thread_local! {
        static LOGGING: RefCell<Option<tracing::dispatcher::DefaultGuard>> = const { RefCell::new(None) };
    }
    let dispatch = tracing::Dispatch::new(proxy_core::obs::telemetry::text_subscriber(log.clone(), false));
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKERS)
        .thread_name(format!("inproc-{bin}"))
        .enable_all()
        .on_thread_start(move || {
            LOGGING.with(|g| *g.borrow_mut() = Some(tracing::dispatcher::set_default(&dispatch)));
        })
        .on_thread_stop(|| LOGGING.with(|g| drop(g.borrow_mut().take())))
        .build()?)
}

/// One binary's log in memory.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl Log {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
    }
}

impl std::io::Write for Log {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Log {
    type Writer = Log;
    fn make_writer(&'a self) -> Log {
        self.clone()
    }
}
