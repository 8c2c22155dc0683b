//! TLS material that reloads itself: certificate, key and CA files watched, rebuilt on change, the old kept when the new is broken.
//!
//! Every TLS identity a binary serves or presents is a [`Reloading`]: it polls its files every
//! [`Poll::TLS`] period (following symlinks, so the atomic `..data` swap of a Kubernetes secret
//! volume is seen), rebuilds the rustls config when one changed, and swaps it in for new
//! handshakes. Established sessions keep the config they were made with. A file that is
//! half-written, or a key that does not match its certificate, fails the rebuild: it is logged
//! and counted and the running material stays. Each rebuilt config has a fresh session cache,
//! so after a change of the trusted CAs no peer can resume a session verified against the old
//! set.

use super::{Poll, Seen};
use crate::sync::Mutex;
use crate::tls::TlsError;
use arc_swap::ArcSwap;
use prometheus::{GaugeVec, IntCounterVec, Opts, Registry};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// TLS reload and expiry metrics, shared by every [`Reloading`] of a process.
#[derive(Clone)]
pub struct TlsMetrics {
    reloads: IntCounterVec,
    expiry: GaugeVec,
}

impl TlsMetrics {
    pub fn new(reg: &Registry) -> Self {
        let reloads = crate::obs::metrics::counter_vec(
            reg,
            "seedgate_tls_reloads_total",
            "TLS material reloads after a file changed, by use, file and result (success, failure).",
            &["use", "file", "result"],
        );
        let expiry = GaugeVec::new(
            Opts::new(
                "seedgate_tls_certificate_expiry_timestamp_seconds",
                "Unix time at which each certificate in use expires, by use, file and subject common name.",
            ),
            &["use", "file", "subject"],
        )
        .expect("valid metric");
        crate::obs::metrics::register(reg, Box::new(expiry.clone())).expect("metric registered once");
        Self { reloads, expiry }
    }
}

/// The certificates in `path` with their subject CN and expiry (for the expiry metric).
fn expiries(path: &Path) -> Vec<(String, f64)> {
    let Ok(certs) = crate::tls::load_certs(path) else { return Vec::new() };
    certs
        .iter()
        .filter_map(|c| {
            let (_, x) = x509_parser::parse_x509_certificate(c.as_ref()).ok()?;
            let cn = x.subject().iter_common_name().next().and_then(|n| n.as_str().ok()).unwrap_or("").to_owned();
            Some((cn, x.validity().not_after.timestamp() as f64))
        })
        .collect()
}

type Build<T> = Box<dyn Fn() -> Result<T, TlsError> + Send + Sync>;

/// A rustls config (server or client) rebuilt from its files when they change.
pub struct Reloading<T> {
    /// What this material is for (a metric label and in logs): `agents`, `frontend egress`, ...
    use_: String,
    files: Vec<PathBuf>,
    current: ArcSwap<T>,
    seen: Mutex<Vec<Seen>>,
    /// The (file, subject) label pairs of the expiry metric now set, to remove them on change.
    recorded: Mutex<Vec<(String, String)>>,
    build: Build<T>,
    metrics: TlsMetrics,
}

impl<T: Send + Sync + 'static> Reloading<T> {
    /// Build once from `files` (an error here is a start error); `build` reads them again on
    /// every change.
    pub fn new(
        use_: impl Into<String>,
        files: Vec<PathBuf>,
        metrics: &TlsMetrics,
        build: impl Fn() -> Result<T, TlsError> + Send + Sync + 'static,
    ) -> Result<Arc<Self>, TlsError> {
        let seen = files.iter().map(|f| Seen::now(f)).collect();
        let first = build()?;
        let this = Arc::new(Self {
            use_: use_.into(),
            files,
            current: ArcSwap::from_pointee(first),
            seen: Mutex::new(seen),
            recorded: Mutex::new(Vec::new()),
            build: Box::new(build),
            metrics: metrics.clone(),
        });
        this.record_expiry();
        Ok(this)
    }

    /// The material for a new handshake.
    pub fn current(&self) -> Arc<T> {
        self.current.load_full()
    }

    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    fn record_expiry(&self) {
        let mut recorded = self.recorded.lock();
        for f in &self.files {
            let file = f.display().to_string();
            for (subject, at) in expiries(f) {
                self.metrics.expiry.with_label_values(&[&self.use_, &file, &subject]).set(at);
                recorded.push((file.clone(), subject));
            }
        }
    }

    fn forget_expiry(&self) {
        for (file, subject) in std::mem::take(&mut *self.recorded.lock()) {
            let _ = self.metrics.expiry.remove_label_values(&[&self.use_, &file, &subject]);
        }
    }

    /// Check the files now; rebuild if one changed. `Some(Ok)` = new material in use,
    /// `Some(Err)` = a change was refused (the old material stays), `None` = nothing changed.
    pub fn check(&self) -> Option<Result<(), TlsError>> {
        // Each look is remembered, so a broken file is reported once, not every second; fixing it
        // (another write) is a new change.
        let changed: Vec<String> = {
            let mut seen = self.seen.lock();
            let changed: Vec<bool> = self.files.iter().zip(seen.iter_mut()).map(|(f, s)| s.changed(f)).collect();
            self.files.iter().zip(changed).filter(|(_, c)| *c).map(|(f, _)| f.display().to_string()).collect()
        };
        if changed.is_empty() {
            return None;
        }
        let result = (self.build)();
        let label = if result.is_ok() { "success" } else { "failure" };
        for f in &changed {
            self.metrics.reloads.with_label_values(&[&self.use_, f, label]).inc();
        }
        Some(match result {
            Ok(new) => {
                self.forget_expiry();
                self.current.store(Arc::new(new));
                self.record_expiry();
                tracing::info!(tls = %self.use_, files = ?changed, "TLS material reloaded; new handshakes use it");
                Ok(())
            }
            Err(e) => {
                tracing::error!(tls = %self.use_, files = ?changed, error = %e, "TLS material refused; the running certificates stay in use");
                Err(e)
            }
        })
    }

    /// Check every [`Poll::TLS`] period until `stop`.
    pub fn watch(self: &Arc<Self>, stop: CancellationToken) {
        let this = self.clone();
        tokio::spawn(async move {
            let mut tick = Poll::TLS.ticker();
            loop {
                tokio::select! {
                    _ = stop.cancelled() => {
                        this.forget_expiry();
                        return;
                    }
                    _ = tick.tick() => {}
                }
                // Reading and parsing files is blocking work; it is small and rare.
                let t = this.clone();
                let _ = tokio::task::spawn_blocking(move || t.check()).await;
            }
        });
    }
}

/// A server identity (`cert`, `key`) and, with `client_ca`, the CA clients must chain to.
pub fn server(
    use_: &str,
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
    alpn: &'static [&'static [u8]],
    tls13_only: bool,
    metrics: &TlsMetrics,
) -> Result<Arc<Reloading<rustls::ServerConfig>>, TlsError> {
    let (c, k, ca) = (cert.to_owned(), key.to_owned(), client_ca.map(Path::to_owned));
    let mut files = vec![c.clone(), k.clone()];
    files.extend(ca.clone());
    Reloading::new(use_, files, metrics, move || {
        crate::tls::server_config(&c, &k, ca.as_deref(), alpn, tls13_only).map(Arc::unwrap_or_clone)
    })
}

/// A client identity (`cert`, `key`) trusting `ca`.
pub fn client(
    use_: &str,
    ca: &Path,
    cert: &Path,
    key: &Path,
    alpn: &'static [&'static [u8]],
    tls13_only: bool,
    metrics: &TlsMetrics,
) -> Result<Arc<Reloading<rustls::ClientConfig>>, TlsError> {
    let (ca, c, k) = (ca.to_owned(), cert.to_owned(), key.to_owned());
    let files = vec![c.clone(), k.clone(), ca.clone()];
    Reloading::new(use_, files, metrics, move || {
        crate::tls::client_config(&ca, Some((&c, &k)), alpn, tls13_only).map(Arc::unwrap_or_clone)
    })
}
