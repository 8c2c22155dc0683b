//! What proxy-server's wings (agents, front ends, registry), admin hooks and reloader share: the config in force, the metrics, the session directory, the shutdown, the cluster states from every source, and the TLS material their listeners reload from files.

use crate::cluster_files::ClusterFiles;
use crate::metrics::ServerMetrics;
use crate::registry::{SessionDirectory, ShareConfig};
use arc_swap::ArcSwap;
use proxy_core::app::shutdown::Shutdown;
use proxy_core::sync::Mutex;
use proxy_core::watch::tls::{ClientFiles, Reloading};
use seedgate_config::ServerConfig;
use seedgate_config::server::{ClusterMode, ClusterState, ServerTls};
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::{CancellationToken, DropGuard};

/// What every wing shares (see the module documentation); each wing holds its own state beside
/// it (`Agents`, `Frontends`).
pub(crate) struct Shared {
    pub(crate) config: ArcSwap<ServerConfig>,
    pub(crate) metrics: ServerMetrics,
    pub(crate) directory: SessionDirectory,
    pub(crate) shutdown: Shutdown,
    /// Where cluster states come from besides the main config.
    pub(crate) states: Mutex<StateSources>,
    /// Bumped when the rules of clusters may have changed (a reload, a cluster file, an
    /// override): live token sessions check theirs.
    pub(crate) rules: watch::Sender<()>,
}

/// Cluster states from elsewhere than the main config.
pub(crate) struct StateSources {
    /// From the files of `clusters_dir`.
    pub(crate) files: ClusterFiles,
    /// Set through the admin endpoint; they override the config's until cleared.
    pub(crate) overrides: BTreeMap<String, ClusterState>,
}

impl StateSources {
    pub(crate) fn new(files: ClusterFiles) -> Self {
        Self { files, overrides: BTreeMap::new() }
    }
}

impl Shared {
    /// Config states (main config and cluster files) with the admin overrides on top.
    pub(crate) fn effective_states(&self) -> BTreeMap<String, ClusterState> {
        let mut s = self.config.load().clusters.clone();
        let sources = self.states.lock();
        s.extend(sources.files.states().map(|(k, v)| (k.clone(), v.clone())));
        for (name, o) in &sources.overrides {
            let mut o = o.clone();
            // An override sets the state; the cluster's strategies, hibernation, agent
            // authentication and token review stay configured unless it names them.
            if o.proxy_strategies.is_none() {
                o.proxy_strategies = s.get(name).and_then(|c| c.proxy_strategies.clone());
            }
            if o.hibernated.is_none() {
                o.hibernated = s.get(name).and_then(|c| c.hibernated);
            }
            if o.agent_auth.is_none() {
                o.agent_auth = s.get(name).and_then(|c| c.agent_auth);
            }
            if o.token_review.is_none() {
                o.token_review = s.get(name).and_then(|c| c.token_review.clone());
            }
            s.insert(name.clone(), o);
        }
        s
    }

    /// The clusters the operator named (front ends, `clusters`, cluster files, admin overrides),
    /// each with whether agents of it are expected here now: `active` and not `hibernated`.
    pub(crate) fn known_clusters(&self) -> BTreeMap<String, bool> {
        let states = self.effective_states();
        let cfg = self.config.load();
        let named = cfg.frontends.iter().filter_map(|f| f.cluster.clone()).chain(states.keys().cloned());
        named
            .map(|c| {
                let expected =
                    states.get(&c).is_none_or(|s| s.state == ClusterMode::Active && s.hibernated != Some(true));
                (c, expected)
            })
            .collect()
    }

    /// Apply the effective cluster states and limits to the session directory (after a reload, a cluster
    /// file change or an admin override), and publish every known cluster's metrics.
    pub(crate) fn apply_states(&self) {
        let states = self.effective_states();
        // A cluster's own limits come from where its state is set; an admin override that gives
        // none keeps those of the config or cluster file.
        let mut own = BTreeMap::new();
        let cfg = self.config.load();
        let sources = self.states.lock();
        for (name, s) in cfg.clusters.iter().chain(sources.files.states()).chain(states.iter()) {
            if let Some(l) = s.limits {
                own.insert(name.clone(), l);
            }
        }
        drop(sources);
        self.directory.set_shares(ShareConfig::of(&cfg, own));
        self.directory.set_modes(&states);
        self.metrics.publish_clusters(&self.known_clusters(), |c| states.get(c).map(|s| s.state).unwrap_or_default());
        // Live token sessions check their cluster's rules (a removed token_review ends them).
        self.rules.send_replace(());
    }

    /// Wakes when the rules of clusters may have changed ([`Shared::apply_states`]).
    pub(crate) fn rules_changed(&self) -> watch::Receiver<()> {
        self.rules.subscribe()
    }
}

/// TLS material reloaded from its files while the guard lives: a listener's, the agents' or a
/// front end's.
pub(crate) struct Tls {
    pub(crate) material: Arc<Reloading<rustls::ServerConfig>>,
    /// Cancelled with the guard: ends what follows the material (revoked sessions or connections).
    pub(crate) watching: CancellationToken,
    _guard: DropGuard,
}

impl Tls {
    /// Watch `material`'s files until `stop` (or the guard is dropped).
    pub(crate) fn watched(material: Arc<Reloading<rustls::ServerConfig>>, stop: &CancellationToken) -> Self {
        let watching = stop.child_token();
        material.watch(watching.clone());
        Self { material, watching: watching.clone(), _guard: watching.drop_guard() }
    }

    pub(crate) fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.material.current())
    }
}

/// How a server's TLS files verify client certificates (`None`: none asked).
pub(crate) fn client_files(t: &ServerTls, optional: bool) -> Option<ClientFiles> {
    let ca = t.client_ca.as_ref()?;
    Some(ClientFiles { ca: ca.into(), crl: t.crl.as_ref().map(Into::into), optional })
}

#[cfg(test)]
pub(crate) fn test_shared() -> Arc<Shared> {
    let cfg = seedgate_config::server::parse(
        "agents: { listen: 127.0.0.1:0, tls: { cert: c, key: k, client_ca: ca } }\n",
        "t.yaml",
    )
    .expect("valid");
    let reg = proxy_core::prometheus::Registry::new();
    let metrics = ServerMetrics::new(&reg);
    Arc::new(Shared {
        directory: SessionDirectory::new(metrics.clone(), &reg, &cfg.clusters, Default::default()),
        config: ArcSwap::from_pointee(cfg.clone()),
        metrics,
        shutdown: Shutdown::new(),
        states: Mutex::new(StateSources::new(ClusterFiles::new(None))),
        rules: watch::Sender::new(()),
    })
}
