//! The agents' wing: what only agents' sessions use — the TokenReview clients and their cache, the revocation lists of `agents.tls.crl` in force, this replica's announcement, the clusters nothing in the config knows — beside what every wing shares.

use super::replica::Replica;
use super::tokens::Reviewers;
use crate::shared::Shared;
use arc_swap::ArcSwap;
use proxy_core::prometheus::Registry;
use proxy_core::sync::Mutex;
use proxy_core::tls::Revoked;
use proxy_core::tunnel::TunnelSettings;
use proxy_core::watch::tls::TlsMetrics;
use seedgate_config::ServerConfig;
use std::collections::{BTreeSet, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Everything about who an agent is and whether its session may live.
pub(crate) struct Agents {
    pub(crate) shared: Arc<Shared>,
    /// The TokenReview clients of the clusters and their cache.
    pub(crate) reviewers: Reviewers,
    /// The revocation lists of `agents.tls.crl` in force (empty: none).
    pub(crate) revoked: ArcSwap<Revoked>,
    /// This replica's identity and the count it announces to agents.
    pub(crate) replica: Replica,
    /// Agents' clusters that nothing in the config knows.
    unknown: Mutex<UnknownClusters>,
}

/// Clusters named by agents' certificates that no front end or cluster state names.
#[derive(Default)]
struct UnknownClusters {
    /// Warned about already (once each).
    warned: HashSet<String>,
    /// Whose agents were refused (`agents.accept_unknown_clusters: false`).
    refused: BTreeSet<String>,
}

/// The tunnel's settings for agents' sessions under `cfg`.
pub(crate) fn tunnel_settings(cfg: &ServerConfig) -> TunnelSettings {
    let congestion = cfg.agents.quic.as_ref().map(|q| q.congestion_control).unwrap_or_default();
    TunnelSettings::new(&cfg.agents.session(), congestion)
}

impl Agents {
    pub(crate) fn new(shared: Arc<Shared>, reg: &Registry, tls_metrics: &TlsMetrics) -> Self {
        let cfg = shared.config.load_full();
        Self {
            reviewers: Reviewers::new(reg, tls_metrics, cfg.agents.token_review.cache_size),
            revoked: Default::default(),
            replica: Replica::new(&cfg),
            unknown: Mutex::default(),
            shared,
        }
    }

    /// Announce this replica to its agents from now on: its count (followed from
    /// `agents.peers` when set) and, at SIGTERM, that it drains.
    pub(crate) fn announce(self: &Arc<Self>) {
        let (shared, replica) = (&self.shared, &self.replica);
        shared.metrics.replica_count.set(i64::from(replica.info().count));
        tracing::info!(id = %replica.info().id, count = replica.info().count, peers = ?shared.config.load().agents.peers, "replica identity");
        tokio::spawn(self.clone().follow_peers());
        self.reviews_at_zero();
        tokio::spawn(self.clone().follow_rules());
        // SIGTERM: tell the agents before the drain, so they find another replica while their
        // live streams here finish.
        let (a, stop) = (self.clone(), shared.shutdown.stop.clone());
        tokio::spawn(async move {
            stop.cancelled().await;
            a.replica.draining(&a.shared.metrics, &a.shared.directory);
        });
    }

    /// A reloaded config (`new`, not yet in force): the review cache's size, and what this
    /// replica announces.
    pub(crate) fn reconfigure(&self, new: &ServerConfig) {
        self.reviewers.resize(new.agents.token_review.cache_size);
        self.replica.reconfigure(&self.shared.metrics, &self.shared.directory, new);
    }

    /// Whether a front end or a cluster state names `cluster`; if not, warn (once per name).
    pub(crate) fn knows_cluster(&self, cluster: &str, peer: SocketAddr) -> bool {
        if self.shared.known_clusters().contains_key(cluster) {
            return true;
        }
        if self.unknown.lock().warned.insert(cluster.to_owned()) {
            tracing::warn!(
                %cluster,
                %peer,
                accept = self.shared.config.load().agents.accept_unknown_clusters,
                "agent of cluster {cluster:?}, which no front end or clusters entry knows: probably a typo in the \
                 certificate's CN (agents.accept_unknown_clusters: false refuses such agents)"
            );
        }
        false
    }

    /// Note that an agent of `cluster`, which nothing in the config knows, was refused.
    pub(crate) fn refused_unknown(&self, cluster: &str) {
        self.unknown.lock().refused.insert(cluster.to_owned());
    }

    /// The clusters nothing in the config knows whose agents were refused.
    pub(crate) fn unknown_refused(&self) -> BTreeSet<String> {
        self.unknown.lock().refused.clone()
    }

    /// The review metrics of every cluster with a `token_review` at 0, so that alerts tell
    /// "none yet" from "missing".
    fn reviews_at_zero(&self) {
        for (name, _) in self.shared.effective_states().iter().filter(|(_, s)| s.token_review.is_some()) {
            self.reviewers.at_zero(name);
        }
    }

    /// Until shutdown: the review metrics at 0 for the clusters a change of the states gives a
    /// `token_review`.
    async fn follow_rules(self: Arc<Self>) {
        let mut rules = self.shared.rules_changed();
        loop {
            tokio::select! {
                () = self.shared.shutdown.stop.cancelled() => return,
                changed = rules.changed() => if changed.is_err() { return },
            }
            self.reviews_at_zero();
        }
    }

    /// Resolve `agents.peers` now and every `peers_interval`, announcing the number of addresses
    /// as the count. A failed lookup keeps the last count (a DNS hiccup must not shrink it).
    async fn follow_peers(self: Arc<Self>) {
        let shared = &self.shared;
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
                        self.replica.update(&shared.metrics, &shared.directory, |i| i.count = n);
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
