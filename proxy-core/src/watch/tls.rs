//! TLS material that reloads itself: certificate, key and CA files watched, rebuilt on change, the old kept when the new is broken.
//!
//! Every TLS identity a binary serves or presents is a [`Reloading`]: it polls its files every
//! [`Poll::TLS`] period (following symlinks, so the atomic `..data` swap of a Kubernetes secret
//! volume is seen), rebuilds the rustls config when one changed, and swaps it in for new
//! handshakes. Established sessions keep the config they were made with. A file that is
//! half-written, or a key that does not match its certificate, fails the rebuild: it is logged
//! and counted and the running material stays. Each rebuilt config has a fresh session cache,
//! so after a change of the trusted CAs no peer can resume a session verified against the old
//! set. With revocation lists, the lists matched to the CAs ([`crate::tls::Revoked`]) are
//! swapped in with the config whose verifier checks them, for those who look again at sessions
//! verified before ([`Reloading::revoked`]); a list that matches no CA is logged at each load.

use super::{Poll, Seen};
use crate::sync::Mutex;
use crate::tls::{Revoked, TlsError};
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
    crl_next_update: GaugeVec,
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
        let crl_next_update = GaugeVec::new(
            Opts::new(
                "seedgate_tls_crl_next_update_timestamp_seconds",
                "Unix time of the earliest nextUpdate of the revocation lists in use, by use and file: past it, the issuer should have published a newer list.",
            ),
            &["use", "file"],
        )
        .expect("valid metric");
        crate::obs::metrics::register(reg, Box::new(crl_next_update.clone())).expect("metric registered once");
        Self { reloads, expiry, crl_next_update }
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

/// The subject recorded for a revocation list's series (no certificate's CN has a NUL).
const CRL_MARK: &str = "\0crl";

type Build<T> = Box<dyn Fn() -> Result<(T, Arc<Revoked>), TlsError> + Send + Sync>;

/// The files of a verifier with revocation lists: the lists and the CAs they are matched to.
#[derive(Debug, Clone)]
pub struct ListFiles {
    pub crl: PathBuf,
    pub ca: PathBuf,
}

/// A rustls config (server or client) rebuilt from its files when they change.
pub struct Reloading<T> {
    /// What this material is for (a metric label and in logs): `agents`, `frontend egress`, ...
    use_: String,
    files: Vec<PathBuf>,
    current: ArcSwap<T>,
    /// The lists `current`'s verifier checks peers' certificates against (empty without lists).
    revoked: ArcSwap<Revoked>,
    lists: Option<ListFiles>,
    seen: Mutex<Vec<Seen>>,
    /// The (file, subject) label pairs of the expiry metric now set ([`CRL_MARK`]: the
    /// revocation lists' metric), to remove them on change.
    recorded: Mutex<Vec<(String, String)>>,
    build: Build<T>,
    metrics: TlsMetrics,
    /// Counts the rebuilds that took effect: what was verified with the old material (a
    /// revocation list) may be looked at again.
    rebuilt: tokio::sync::watch::Sender<u64>,
}

impl<T: Send + Sync + 'static> Reloading<T> {
    /// Build once from `files` (an error here is a start error); `build` reads them again on
    /// every change. `lists`: which of them are revocation lists and their CAs.
    pub fn new(
        use_: impl Into<String>,
        files: Vec<PathBuf>,
        lists: Option<ListFiles>,
        metrics: &TlsMetrics,
        build: impl Fn() -> Result<(T, Arc<Revoked>), TlsError> + Send + Sync + 'static,
    ) -> Result<Arc<Self>, TlsError> {
        let seen = files.iter().map(|f| Seen::now(f)).collect();
        let (first, revoked) = build()?;
        let this = Arc::new(Self {
            use_: use_.into(),
            files,
            current: ArcSwap::from_pointee(first),
            revoked: ArcSwap::new(revoked),
            lists,
            seen: Mutex::new(seen),
            recorded: Mutex::new(Vec::new()),
            build: Box::new(build),
            metrics: metrics.clone(),
            rebuilt: tokio::sync::watch::Sender::new(0),
        });
        // Each file's reloads are exported from the start: a refused change is a 0 turned 1.
        for f in &this.files {
            let file = f.display().to_string();
            crate::obs::metrics::at_zero(&this.metrics.reloads, &[&[&this.use_], &[&file], &["success", "failure"]]);
        }
        this.record_expiry();
        this.report_unused();
        Ok(this)
    }

    /// The material for a new handshake.
    pub fn current(&self) -> Arc<T> {
        self.current.load_full()
    }

    /// The revocation lists [`Reloading::current`]'s verifier checks, matched to its CAs.
    pub fn revoked(&self) -> Arc<Revoked> {
        self.revoked.load_full()
    }

    /// Log the lists that match no CA (they revoke nothing): once per load.
    fn report_unused(&self) {
        let Some(l) = &self.lists else { return };
        for u in self.revoked.load().unused() {
            tracing::warn!(tls = %self.use_, file = %l.crl.display(), "{}", u.message(&l.ca));
        }
    }

    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    /// Changes each time new material took effect.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.rebuilt.subscribe()
    }

    fn record_expiry(&self) {
        let mut recorded = self.recorded.lock();
        for f in &self.files {
            let file = f.display().to_string();
            if self.lists.as_ref().is_some_and(|l| &l.crl == f) {
                if let Some(next) = self.revoked.load().next_update() {
                    self.metrics.crl_next_update.with_label_values(&[&self.use_, &file]).set(next as f64);
                    recorded.push((file.clone(), CRL_MARK.to_owned()));
                }
                continue;
            }
            for (subject, at) in expiries(f) {
                self.metrics.expiry.with_label_values(&[&self.use_, &file, &subject]).set(at);
                recorded.push((file.clone(), subject));
            }
        }
    }

    fn forget_expiry(&self) {
        for (file, subject) in std::mem::take(&mut *self.recorded.lock()) {
            let _ = match subject == CRL_MARK {
                true => self.metrics.crl_next_update.remove_label_values(&[&self.use_, &file]),
                false => self.metrics.expiry.remove_label_values(&[&self.use_, &file, &subject]),
            };
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
            Ok((new, revoked)) => {
                self.forget_expiry();
                self.current.store(Arc::new(new));
                self.revoked.store(revoked);
                self.record_expiry();
                self.report_unused();
                self.rebuilt.send_modify(|n| *n += 1);
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

/// What a server verifies client certificates with: its CA, revocation lists, and whether a
/// client may come without one ([`crate::tls::ClientAuth`] as files).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientFiles {
    pub ca: PathBuf,
    pub crl: Option<PathBuf>,
    pub optional: bool,
}

/// A server identity (`cert`, `key`) and, with `client`, how client certificates are verified.
pub fn server(
    use_: &str,
    cert: &Path,
    key: &Path,
    client: Option<ClientFiles>,
    alpn: &'static [&'static [u8]],
    tls13_only: bool,
    metrics: &TlsMetrics,
) -> Result<Arc<Reloading<rustls::ServerConfig>>, TlsError> {
    let (c, k) = (cert.to_owned(), key.to_owned());
    let mut files = vec![c.clone(), k.clone()];
    if let Some(cl) = &client {
        files.push(cl.ca.clone());
        files.extend(cl.crl.clone());
    }
    let lists = client.as_ref().and_then(|cl| Some(ListFiles { crl: cl.crl.clone()?, ca: cl.ca.clone() }));
    Reloading::new(use_, files, lists, metrics, move || {
        let auth = client.as_ref().map(|cl| crate::tls::ClientAuth {
            ca: &cl.ca,
            crl: cl.crl.as_deref(),
            optional: cl.optional,
        });
        let (cfg, revoked) = crate::tls::server_config(&c, &k, auth, alpn, tls13_only)?;
        Ok((Arc::unwrap_or_clone(cfg), revoked))
    })
}

/// A client trusting `ca` (less what the lists in `crl` revoke), presenting `identity` (a
/// certificate and its key) when given.
pub fn client(
    use_: &str,
    ca: &Path,
    crl: Option<&Path>,
    identity: Option<(&Path, &Path)>,
    alpn: &'static [&'static [u8]],
    tls13_only: bool,
    metrics: &TlsMetrics,
) -> Result<Arc<Reloading<rustls::ClientConfig>>, TlsError> {
    let (ca, crl) = (ca.to_owned(), crl.map(Path::to_owned));
    let identity = identity.map(|(c, k)| (c.to_owned(), k.to_owned()));
    let mut files = Vec::new();
    if let Some((c, k)) = &identity {
        files.extend([c.clone(), k.clone()]);
    }
    files.push(ca.clone());
    files.extend(crl.clone());
    let lists = crl.clone().map(|crl| ListFiles { crl, ca: ca.clone() });
    Reloading::new(use_, files, lists, metrics, move || {
        let id = identity.as_ref().map(|(c, k)| (c.as_path(), k.as_path()));
        let (cfg, revoked) = crate::tls::client_config(&ca, crl.as_deref(), id, alpn, tls13_only)?;
        Ok((Arc::unwrap_or_clone(cfg), revoked))
    })
}
