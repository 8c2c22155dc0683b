//! The registry: the cluster directory — one entry per cluster: its mode (active, draining, fenced), its limits, its agent sessions and the token that ends its streams, under one lock — the dial path through it, each session's standing, and the start-up wait.
//!
//! Front ends dial through [`dial`] (the dial path, top to bottom, each attempt included;
//! [`strategy`] names the sessions a dial may take); agents' sessions come and go through
//! [`SessionDirectory::add`] and [`SessionDirectory::remove`], refused with a [`Refusal`] (a
//! fenced cluster is decided by [`Mode::fenced`], and nowhere else); a session's standing for
//! new dials is the [`Session`]'s own; reloads, cluster files and the admin endpoint set modes
//! and limits ([`modes`]: what each mode does to a cluster's streams and agents). What the status
//! page reads besides — each cluster's dials per minute, each session's bytes and last failed
//! dial — is counted where dials already are ([`tally`]) and read at one look ([`figures`]). The
//! registry knows nothing of who an agent is beyond what it was filed with.
//!
//! Lock order: `Replica`'s announcement lock, then the directory, then a session's
//! `Liveness` (supersession marks sessions while the directory is locked). Agents' hellos are
//! written once (`OnceLock`) and need no lock.

pub(crate) mod dial;
mod figures;
mod modes;
mod refusal;
mod session;
mod settle;
mod strategy;
mod tally;

pub(crate) use dial::{DialTimes, Dialed};
pub(crate) use figures::ClusterFigures;
pub(crate) use refusal::{DialRefusal, Refusal};
pub(crate) use session::{Filed, Identity, Session, Standing};
pub(crate) use tally::{DIAL_RESULTS, Dials, Tally};

use crate::metrics::ServerMetrics;
use proxy_core::net::pending::TenantShare;
use proxy_core::net::share::{Cap, Kind, Naming, Shares};
use proxy_core::obs::admin::Check;
use proxy_core::sync::RwLock;
use proxy_core::tunnel::AgentHello;
use seedgate_config::ServerConfig;
use seedgate_config::server::{ClusterLimits, ClusterMode, ClusterState, ProxyStrategy};
use settle::Settle;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use strategy::NodeIndex;
use tokio_util::sync::CancellationToken;

/// How clusters are named as tenants: `seedgate_cluster_streams{cluster}` and friends.
const CLUSTER_SHARES: Naming = Naming { tenant: "cluster", labels: &["cluster"], established: "streams" };

/// A cluster's mode as the data plane applies it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Mode {
    pub mode: ClusterMode,
    pub move_to: Vec<String>,
    pub drain_deadline: Option<Duration>,
    /// When the current mode was entered (drain deadlines count from here).
    pub since: Instant,
    /// The cluster's own proxy strategies (`None`: the global `agents.proxy_strategies`).
    pub strategies: Option<Vec<ProxyStrategy>>,
}

impl Mode {
    fn from_cfg(c: Option<&ClusterState>) -> Self {
        Self {
            mode: c.map(|c| c.state).unwrap_or_default(),
            move_to: c.map(|c| c.move_to.iter().map(|h| h.to_string()).collect()).unwrap_or_default(),
            drain_deadline: c.and_then(|c| c.drain_deadline).map(|d| d.get()),
            since: Instant::now(),
            strategies: c.and_then(|c| c.proxy_strategies.clone()),
        }
    }

    /// Fenced here: the cluster's agents get no session and its dials none (it moved to
    /// another seed). The one place that decides it.
    pub(crate) fn fenced(&self) -> bool {
        self.mode == ClusterMode::Fenced
    }

    fn same_as(&self, other: &Mode) -> bool {
        self.mode == other.mode && self.move_to == other.move_to && self.drain_deadline == other.drain_deadline
    }
}

/// One cluster: everything the data plane knows of it.
struct Entry {
    /// Its mode as configured (config, cluster file or admin override); `None`: not
    /// configured, so active.
    mode: Option<Mode>,
    /// Its own limits (`limits` of its state), if any.
    limits: Option<ClusterLimits>,
    sessions: Vec<Arc<Session>>,
    /// The sessions by the identifiers their agents announced.
    index: NodeIndex,
    /// Ends the cluster's live streams: cancelled when the cluster is fenced, or at the drain
    /// deadline; then replaced by a fresh one for streams admitted later. A child of the
    /// shutdown kill token, so the end of the grace period ends the streams too. One token per
    /// cluster keeps an idle stream's wait to a single small future.
    end: CancellationToken,
    /// Bumped by every mode change, so a drain timer of an earlier mode does nothing.
    generation: u64,
    /// Its dials of the last minutes, by result (the status page's).
    dials: Arc<Dials>,
}

impl Entry {
    fn new(kill: &CancellationToken) -> Self {
        Self {
            mode: None,
            limits: None,
            sessions: Vec::new(),
            index: NodeIndex::default(),
            end: kill.child_token(),
            generation: 0,
            dials: Arc::default(),
        }
    }

    fn mode(&self) -> Mode {
        self.mode.clone().unwrap_or_else(|| Mode::from_cfg(None))
    }

    /// End every stream admitted so far.
    fn end_streams(&mut self, kill: &CancellationToken) {
        std::mem::replace(&mut self.end, kill.child_token()).cancel();
    }
}

/// How clusters' shares are set: their own limits and the default share of the process limits.
#[derive(Debug, Clone, Default)]
pub(crate) struct ShareConfig {
    pub own: BTreeMap<String, ClusterLimits>,
    pub defaults: ShareDefaults,
}

/// The share of the process limits a cluster without limits of its own has.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ShareDefaults {
    /// `limits.tenant_share`, of `limits.max_connections` (streams) and `limits.max_pending`.
    pub fraction: f64,
    pub max_streams: usize,
    pub max_pending: usize,
    /// `agents.max_sessions_per_cluster`: the agent sessions of a cluster without its own limit.
    pub max_sessions: usize,
}

/// No limits until a config is applied: what a directory starts with.
impl Default for ShareDefaults {
    fn default() -> Self {
        Self { fraction: 0.0, max_streams: 0, max_pending: 0, max_sessions: usize::MAX }
    }
}

impl ShareConfig {
    pub(crate) fn of(cfg: &ServerConfig, own: BTreeMap<String, ClusterLimits>) -> Self {
        let l = &cfg.limits;
        let defaults = ShareDefaults {
            fraction: l.tenant_share,
            max_streams: l.max_connections,
            max_pending: l.max_pending,
            max_sessions: cfg.agents.max_sessions_per_cluster,
        };
        Self { own, defaults }
    }
}

impl ShareDefaults {
    /// The cap of a cluster with `own` limits on its `kind` of work.
    fn cap(&self, own: Option<ClusterLimits>, kind: Kind) -> Cap {
        let own = own.unwrap_or_default();
        match kind {
            Kind::Established => Cap::new(own.max_streams, self.fraction, self.max_streams),
            Kind::Pending | Kind::Handshake => Cap::new(own.max_pending, self.fraction, self.max_pending),
        }
    }
}

/// Every cluster's entry, and the default share.
struct Clusters {
    by_name: HashMap<String, Entry>,
    share: ShareDefaults,
}

impl Clusters {
    /// The entry of `cluster`, made when it has none yet.
    fn entry(&mut self, cluster: &str, kill: &CancellationToken) -> &mut Entry {
        self.by_name.entry(cluster.to_owned()).or_insert_with(|| Entry::new(kill))
    }

    /// The most agent sessions `cluster` may hold here.
    fn session_cap(&self, cluster: &str) -> usize {
        self.by_name.get(cluster).and_then(|e| e.limits).and_then(|l| l.max_sessions).unwrap_or(self.share.max_sessions)
    }

    /// The cap of `cluster`'s share of `kind`.
    fn cap(&self, cluster: &str, kind: Kind) -> Cap {
        self.share.cap(self.by_name.get(cluster).and_then(|e| e.limits), kind)
    }
}

/// The cluster entries (see the module documentation), the clusters' shares of the process
/// limits, and what a dial finds its agent in.
pub(crate) struct SessionDirectory {
    clusters: Arc<RwLock<Clusters>>,
    /// Each cluster's streams and pending work against its share of the process limits.
    pub shares: Shares,
    /// The shutdown kill token (the streams' end tokens are its children).
    kill: CancellationToken,
    next_id: AtomicU64,
    metrics: ServerMetrics,
    /// The start-up wait for agents (readiness).
    settle: Settle,
}

impl SessionDirectory {
    pub(crate) fn new(
        metrics: ServerMetrics,
        reg: &proxy_core::prometheus::Registry,
        states: &BTreeMap<String, ClusterState>,
        kill: CancellationToken,
    ) -> Self {
        let mut by_name = HashMap::new();
        for (name, state) in states {
            let e = by_name.entry(name.clone()).or_insert_with(|| Entry::new(&kill));
            e.mode = Some(Mode::from_cfg(Some(state)));
        }
        let shares = Shares::new(reg, CLUSTER_SHARES);
        // A known cluster's shares have their series from when it is known (`publish_clusters`).
        let _ = metrics.cluster_shares.set(shares.series());
        Self {
            clusters: Arc::new(RwLock::new(Clusters { by_name, share: ShareDefaults::default() })),
            kill,
            next_id: AtomicU64::new(1),
            metrics,
            shares,
            settle: Settle::new(Instant::now()),
        }
    }

    /// New cluster limits (config, cluster files, admin overrides); for work admitted from now.
    pub(crate) fn set_shares(&self, cfg: ShareConfig) {
        let mut c = self.clusters.write();
        for e in c.by_name.values_mut() {
            e.limits = None;
        }
        for (name, limits) in cfg.own {
            c.entry(&name, &self.kill).limits = Some(limits);
        }
        c.share = cfg.defaults;
    }

    /// `cluster` as a tenant of the front ends' pending budget, with its cap there.
    pub(crate) fn pending_share(&self, cluster: &str) -> TenantShare {
        let cap = self.clusters.read().cap(cluster, Kind::Pending);
        TenantShare { name: Arc::from(cluster), cap }
    }

    pub(crate) fn mode(&self, cluster: &str) -> Mode {
        self.clusters.read().by_name.get(cluster).map_or_else(|| Mode::from_cfg(None), Entry::mode)
    }

    /// Whether an agent of `cluster` may have a session here, asked before its session is
    /// filed (its certificate, or the identity decided, named the cluster): refused when the
    /// cluster is fenced. [`add`](Self::add) asks again under the lock.
    pub(crate) fn admits(&self, cluster: &str) -> Result<(), Refusal> {
        fenced(cluster, &self.mode(cluster))
    }

    /// Register a new agent session. Refused (with the reason) when the cluster is fenced, or
    /// holds its limit of sessions (a new session never ends an older one: who an agent says it
    /// is in its hello is a claim, which must not displace a proven agent's session).
    pub(crate) fn add(&self, cluster: &str, filed: Filed) -> Result<Arc<Session>, Refusal> {
        let (s, mode) = {
            let mut c = self.clusters.write();
            let cap = c.session_cap(cluster);
            let e = c.entry(cluster, &self.kill);
            let mode = e.mode();
            fenced(cluster, &mode)?;
            if e.sessions.len() >= cap {
                return Err(Refusal::SessionLimit { cluster: cluster.to_owned(), cap });
            }
            let s = Arc::new(Session::new(self.next_id.fetch_add(1, Ordering::Relaxed), cluster, filed));
            e.sessions.push(s.clone());
            e.index.add(s.clone());
            // Set under the lock: set after it, an add and a remove racing could leave the
            // gauge at the count of whichever wrote last, not of what is registered.
            self.metrics.agents.with_label_values(&[cluster]).set(e.sessions.len() as i64);
            (s, mode)
        };
        if mode.mode == ClusterMode::Draining {
            // An agent that connects to a draining seed is told to move at once.
            self.send_move(&s, &mode);
        }
        Ok(s)
    }

    pub(crate) fn remove(&self, s: &Session) {
        let mut c = self.clusters.write();
        let Some(e) = c.by_name.get_mut(&s.cluster) else { return };
        e.sessions.retain(|x| x.id != s.id);
        e.index.remove(s.id);
        // Under the lock, as in `add`.
        self.metrics.agents.with_label_values(&[&s.cluster]).set(e.sessions.len() as i64);
    }

    /// Clusters with at least one agent session.
    pub(crate) fn connected(&self) -> Vec<String> {
        let c = self.clusters.read();
        c.by_name.iter().filter(|(_, e)| !e.sessions.is_empty()).map(|(n, _)| n.clone()).collect()
    }

    /// Every agent session of every cluster.
    pub(crate) fn all_sessions(&self) -> Vec<Arc<Session>> {
        self.clusters.read().by_name.values().flat_map(|e| e.sessions.iter().cloned()).collect()
    }

    pub(crate) fn sessions(&self, cluster: &str) -> Vec<Arc<Session>> {
        self.clusters.read().by_name.get(cluster).map(|e| e.sessions.clone()).unwrap_or_default()
    }

    /// The token that ends a stream admitted now: cancelled at once when the cluster is fenced,
    /// at the drain deadline when it drains with one, at the end of the shutdown grace; never
    /// while the cluster stays active or drains without a deadline.
    pub(crate) fn stream_end(&self, cluster: &str) -> CancellationToken {
        self.clusters.write().entry(cluster, &self.kill).end.clone()
    }

    /// File the hellos of `cluster`'s sessions that arrived since the last look (they come on
    /// the control stream after the session registered); a session of a new run of an agent
    /// supersedes those of its earlier runs then.
    pub(crate) fn file_hellos(&self, cluster: &str) {
        let unread = self.clusters.read().by_name.get(cluster).is_some_and(|e| e.index.has_unread());
        if !unread {
            return;
        }
        let mut c = self.clusters.write();
        let Some(e) = c.by_name.get_mut(cluster) else { return };
        for (new, hello) in e.index.refresh() {
            self.supersede(&e.sessions, &new, &hello);
        }
    }

    /// `new`'s agent said who it is (`hello`): the sessions of an earlier run of the same agent
    /// are superseded ([`Session::superseded_by`]).
    fn supersede(&self, sessions: &[Arc<Session>], new: &Session, hello: &AgentHello) {
        for old in sessions {
            old.superseded_by(new, hello, &self.metrics);
        }
    }

    /// `cluster` as readiness and the admin pages show it: its mode and its sessions, the hellos
    /// that came since the last look filed first.
    pub(crate) fn cluster(&self, cluster: &str) -> ClusterView {
        self.file_hellos(cluster);
        ClusterView { mode: self.mode(cluster), sessions: self.sessions(cluster) }
    }

    /// The start-up wait's check (`agents-settled`) at `now`: `known` are the clusters the
    /// operator named, each with whether its agents are expected here; `limit` the settle time.
    pub(crate) fn settled(&self, now: Instant, limit: Duration, known: &BTreeMap<String, bool>) -> Check {
        let waiting: Vec<String> = known
            .iter()
            .filter(|(c, expected)| **expected && self.sessions(c).is_empty())
            .map(|(c, _)| c.clone())
            .collect();
        let expected = known.values().filter(|e| **e).count();
        self.settle.check(now, limit, expected, &waiting)
    }

    /// The `/readyz?verbose` line of the clusters' shares (`fraction`: `limits.tenant_share`).
    pub(crate) fn shares_check(&self, fraction: f64) -> Check {
        self.shares.readiness(fraction)
    }
}

/// A cluster's mode and sessions at one look ([`SessionDirectory::cluster`]).
pub(crate) struct ClusterView {
    pub mode: Mode,
    pub sessions: Vec<Arc<Session>>,
}

/// An agent session of `cluster`, in `mode`, is refused when the cluster is fenced.
fn fenced(cluster: &str, mode: &Mode) -> Result<(), Refusal> {
    if mode.fenced() { Err(Refusal::Fenced(cluster.to_owned())) } else { Ok(()) }
}

#[cfg(test)]
mod dial_tests;

#[cfg(test)]
mod tests {
    use super::*;

    fn directory() -> SessionDirectory {
        let reg = proxy_core::prometheus::Registry::new();
        SessionDirectory::new(ServerMetrics::new(&reg), &reg, &BTreeMap::new(), CancellationToken::new())
    }

    fn state(mode: ClusterMode, deadline: Option<u64>) -> BTreeMap<String, ClusterState> {
        let s = ClusterState {
            state: mode,
            move_to: Vec::new(),
            drain_deadline: deadline.map(seedgate_config::Dur::secs),
            proxy_strategies: None,
            limits: None,
            hibernated: None,
            agent_auth: None,
            token_review: None,
        };
        BTreeMap::from([("a".to_owned(), s)])
    }

    #[tokio::test]
    async fn a_fence_after_a_drain_without_deadline_ends_streams_admitted_while_active() {
        let r = directory();
        let end = r.stream_end("a");
        r.set_modes(&state(ClusterMode::Draining, None));
        tokio::task::yield_now().await;
        assert!(!end.is_cancelled(), "a drain without a deadline ends nothing");
        r.set_modes(&state(ClusterMode::Fenced, None));
        assert!(end.is_cancelled(), "fencing ends every live stream");
        assert!(!r.stream_end("a").is_cancelled(), "streams admitted later get a fresh token");
    }

    #[tokio::test(start_paused = true)]
    async fn a_drain_deadline_ends_streams_unless_the_cluster_came_back() {
        let r = directory();
        let end = r.stream_end("a");
        r.set_modes(&state(ClusterMode::Draining, Some(30)));
        let during = r.stream_end("a");
        tokio::time::sleep(Duration::from_secs(29)).await;
        assert!(!end.is_cancelled());
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(end.is_cancelled() && during.is_cancelled(), "at the deadline every live stream ends");

        let end = r.stream_end("a");
        r.set_modes(&state(ClusterMode::Draining, Some(30)));
        r.set_modes(&BTreeMap::new());
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!end.is_cancelled(), "a drain rolled back before its deadline ends nothing");
    }
}
