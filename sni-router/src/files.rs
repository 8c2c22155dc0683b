//! Routes from the files of `routes_dir` (one per shoot): each changed file is validated on its own, cross-checked against the rest, and rebuilds only the listeners it touches.

use crate::listeners::Listeners;
use crate::running::Extra;
use crate::shared::Shared;
use crate::table::FileChange;
use proxy_core::watch::dir::{FileMetrics, Update};
use seedgate_config::ConfigError;
use seedgate_config::RouterConfig;
use seedgate_config::router::{Claims, Route as RouteCfg};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

/// What [`Claims`] calls the main config in messages.
pub(crate) const MAIN: &str = "the main config";

/// A route file in force that a new main config does not fit (the reload is refused).
#[derive(Debug, thiserror::Error)]
#[error("{0}\n(a route file conflicts with the new config)")]
pub struct RouteFileConflict(ConfigError);

/// The route files in force, and what their routes claim.
pub(crate) struct RouteFiles {
    /// Routes by file (its path), in name order: a listener's file routes follow its own routes in
    /// this order (CONNECT rules match first-listed first).
    files: BTreeMap<String, Vec<Arc<RouteCfg>>>,
    /// The same routes by listener, then file: rebuilding one listener's table walks only its
    /// routes.
    by_listener: BTreeMap<String, BTreeMap<String, Vec<Arc<RouteCfg>>>>,
    /// Files refused, with why; their earlier routes (if any) stay in `files`.
    refused: BTreeMap<String, String>,
    claims: Claims,
    metrics: Option<FileMetrics>,
}

impl RouteFiles {
    pub(crate) fn new(main: &RouterConfig, metrics: Option<FileMetrics>) -> Self {
        Self {
            files: BTreeMap::new(),
            by_listener: BTreeMap::new(),
            refused: BTreeMap::new(),
            claims: Claims::of_config(main, MAIN),
            metrics,
        }
    }

    /// The file routes of every listener.
    pub(crate) fn extra(&self) -> Extra<'_> {
        let mut m = Extra::new();
        for r in self.files.values().flatten() {
            if let Some(l) = &r.listener {
                m.entry(l.as_str()).or_default().push(r);
            }
        }
        m
    }

    /// The file routes of listener `name` (a walk over every file, not a re-validation).
    fn extra_of(&self, name: &str) -> Vec<&Arc<RouteCfg>> {
        self.by_listener.get(name).map(|files| files.values().flatten().collect()).unwrap_or_default()
    }

    /// Put `routes` in force for `file` (none: remove the file); returns the routes it had.
    fn set(&mut self, file: &str, routes: Option<Vec<Arc<RouteCfg>>>) -> Option<Vec<Arc<RouteCfg>>> {
        let old = match routes {
            Some(routes) => self.files.insert(file.to_owned(), routes),
            None => self.files.remove(file),
        };
        // Re-index the file under every listener it names now or named before.
        let new = self.files.get(file);
        for l in old.iter().chain(new).flatten().filter_map(|r| r.listener.as_ref()) {
            let per_file = self.by_listener.entry(l.value.clone()).or_default();
            let mine: Vec<Arc<RouteCfg>> = new
                .into_iter()
                .flatten()
                .filter(|r| r.listener.as_ref().is_some_and(|x| x.as_str() == l.as_str()))
                .cloned()
                .collect();
            if mine.is_empty() {
                per_file.remove(file);
            } else {
                per_file.insert(file.to_owned(), mine);
            }
        }
        self.by_listener.retain(|_, per_file| !per_file.is_empty());
        old
    }

    pub(crate) fn summary(&self) -> (usize, usize, usize) {
        (self.files.len(), self.files.values().map(Vec::len).sum(), self.refused.len())
    }

    pub(crate) fn show(&self) -> serde_json::Value {
        let (files, routes, refused) = self.summary();
        serde_json::json!({ "files": files, "routes": routes, "refused": self.refused, "refused_count": refused })
    }

    /// The claims of a new main config with the files in force, if they all fit; `Err` names
    /// the first misfit. [`RouteFiles::set_claims`] commits them once the config is applied.
    pub(crate) fn rebase(&self, main: &RouterConfig) -> Result<Claims, RouteFileConflict> {
        let mut claims = Claims::of_config(main, MAIN);
        for (file, routes) in &self.files {
            claims.check(routes, file).map_err(RouteFileConflict)?;
            claims.insert(routes, file);
        }
        Ok(claims)
    }

    pub(crate) fn set_claims(&mut self, claims: Claims) {
        self.claims = claims;
    }

    /// Take in an update of the directory; returns, per listener, the file routes it changed.
    pub(crate) fn absorb(&mut self, up: Update<Vec<RouteCfg>>) -> BTreeMap<String, FileChange> {
        let mut changes: BTreeMap<String, FileChange> = BTreeMap::new();
        let mut note = |rs: &[Arc<RouteCfg>], added: bool| {
            for r in rs {
                let Some(l) = &r.listener else { continue };
                let c = changes.entry(l.value.clone()).or_default();
                if added { c.added.push(r.clone()) } else { c.gone.push(r.clone()) }
            }
        };
        for (file, parsed) in up.loaded {
            let started = Instant::now();
            let routes = match parsed.and_then(|routes| self.fit(&file, routes)) {
                Ok(routes) => routes,
                Err(e) => {
                    tracing::error!(%file, error = %e, "route file refused; its earlier routes (if any) stay in force");
                    self.count("failure");
                    self.refused.insert(file, e.to_string());
                    continue;
                }
            };
            self.refused.remove(&file);
            self.count("success");
            let n = routes.len();
            note(&routes, true);
            if let Some(old) = self.set(&file, Some(routes)) {
                note(&old, false);
            }
            let check_ms = started.elapsed().as_secs_f64() * 1e3;
            tracing::info!(%file, routes = n, check_ms, "route file loaded");
        }
        for file in up.removed {
            self.refused.remove(&file);
            if let Some(old) = self.set(&file, None) {
                self.claims.remove(&old, &file);
                note(&old, false);
                self.count("removed");
                tracing::info!(%file, routes = old.len(), "route file removed");
            }
        }
        if let Some(m) = &self.metrics {
            m.files.set(self.files.len() as i64);
        }
        changes
    }

    /// Check `routes` of `file` against everything else and, if they fit, make them the file's
    /// claims (in place of its earlier ones).
    fn fit(&mut self, file: &str, routes: Vec<RouteCfg>) -> Result<Vec<Arc<RouteCfg>>, ConfigError> {
        self.claims.check(&routes, file)?;
        if let Some(old) = self.files.get(file) {
            self.claims.remove(old, file);
        }
        self.claims.insert(&routes, file);
        Ok(routes.into_iter().map(Arc::new).collect())
    }

    fn count(&self, result: &str) {
        if let Some(m) = &self.metrics {
            m.reloads.with_label_values(&[result]).inc();
        }
    }

    /// Apply the `changes` to the listeners' tables (patched, or rebuilt with all their file
    /// routes where order matters).
    pub(crate) fn apply(&self, shared: &Shared, listeners: &Listeners, changes: &BTreeMap<String, FileChange>) {
        for (name, change) in changes {
            listeners.set_file_routes(shared, name, change, || self.extra_of(name));
        }
    }
}
