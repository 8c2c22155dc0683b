//! What proxy-server's listeners, sessions, front ends, admin hooks and reloader share.

use crate::cluster_files::ClusterFiles;
use crate::metrics::ServerMetrics;
use crate::registry::{SessionDirectory, ShareConfig};
use crate::replica;
use arc_swap::ArcSwap;
use proxy_core::app::shutdown::Shutdown;
use proxy_core::net::accept::ConnLimit;
use proxy_core::net::ids::ConnIds;
use proxy_core::net::pending::Pending;
use proxy_core::sync::Mutex;
use seedgate_config::ServerConfig;
use seedgate_config::server::{ClusterMode, ClusterState};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Duration;

pub(crate) struct Shared {
    pub(crate) config: ArcSwap<ServerConfig>,
    pub(crate) metrics: ServerMetrics,
    pub(crate) directory: SessionDirectory,
    pub(crate) shutdown: Shutdown,
    pub(crate) ids: ConnIds,
    /// The front ends' established connections (`limits.max_connections`), taken once the
    /// request head is read.
    pub(crate) limit: ConnLimit,
    /// Front-end connections in the TLS handshake or request head (`limits.max_pending` ...).
    pub(crate) pending: Arc<Pending>,
    /// Where cluster states come from besides the main config.
    pub(crate) states: Mutex<StateSources>,
    /// Agents' clusters that nothing in the config knows.
    pub(crate) unknown: Mutex<UnknownClusters>,
    /// This replica's identity and the count it announces to agents.
    pub(crate) replica: replica::Replica,
    /// The TokenReview clients of the clusters and their cache.
    pub(crate) reviewers: crate::tokens::Reviewers,
    /// The revocation lists of `agents.tls.crl` in force (empty: none).
    pub(crate) agents_revoked: ArcSwap<proxy_core::tls::Revoked>,
    /// The live TLS front-end connections with a client certificate, ended when revoked.
    pub(crate) frontend_certs: crate::frontend_revocation::Live,
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

/// Clusters named by agents' certificates that no front end or cluster state names.
#[derive(Default)]
pub(crate) struct UnknownClusters {
    /// Warned about already (once each).
    pub(crate) warned: HashSet<String>,
    /// Whose agents were refused (`agents.accept_unknown_clusters: false`).
    pub(crate) refused: BTreeSet<String>,
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
        self.reviewers.rules_changed();
    }

    /// Resolve `agents.peers` now and every `peers_interval`, announcing the number of addresses
    /// as the count. A failed lookup keeps the last count (a DNS hiccup must not shrink it).
    pub(crate) async fn follow_peers(self: Arc<Self>) {
        let shared = self;
        let stop = shared.shutdown.stop.clone();
        loop {
            let cfg = shared.config.load_full();
            let wait = cfg.agents.peers_interval.get();
            if let Some(peers) = &cfg.agents.peers {
                let lookup = tokio::time::timeout(Duration::from_secs(5), proxy_core::net::resolve(peers)).await;
                match lookup {
                    Ok(Ok(addrs)) if !addrs.is_empty() => {
                        let mut ips: Vec<_> = addrs.iter().map(|a| a.ip()).collect();
                        ips.sort();
                        ips.dedup();
                        let n = (ips.len() as u32).min(seedgate_config::server::MAX_SERVER_COUNT);
                        shared.metrics.peers.set(i64::from(n));
                        shared.replica.update(&shared.metrics, &shared.directory, |i| i.count = n);
                    }
                    Ok(Ok(_)) => tracing::warn!(%peers, "agents.peers resolves to no address; keeping the last count"),
                    Ok(Err(e)) => {
                        tracing::warn!(%peers, error = %e, "cannot resolve agents.peers; keeping the last count")
                    }
                    Err(_) => tracing::warn!(%peers, "resolving agents.peers timed out; keeping the last count"),
                }
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }
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
        pending: Pending::new(cfg.pending_budget(), proxy_core::net::pending::PendingMetrics::unregistered()),
        directory: SessionDirectory::new(metrics.clone(), &reg, &cfg.clusters, Default::default()),
        config: ArcSwap::from_pointee(cfg.clone()),
        metrics,
        shutdown: Shutdown::new(),
        ids: ConnIds::default(),
        limit: ConnLimit::new(proxy_core::net::accept::Slots::new(10), None),
        states: Mutex::new(StateSources::new(ClusterFiles::new(None))),
        unknown: Mutex::default(),
        replica: replica::Replica::new(&cfg),
        reviewers: crate::tokens::Reviewers::new(&reg, &proxy_core::watch::tls::TlsMetrics::new(&reg), 16),
        agents_revoked: Default::default(),
        frontend_certs: Default::default(),
    })
}
