//! Agent sessions by cluster, cluster state (active, draining, fenced), and the dial entry point front ends use.

use crate::attempt::{self, Attempt};
use crate::liveness::{self, Standing};
use crate::metrics::ServerMetrics;
use crate::session::Session;
use crate::strategy::{self, NodeIndex};
use proxy_core::net::pending::TenantShare;
use proxy_core::net::share::{Cap, Hold, Kind, Naming, Shares};
use proxy_core::tunnel::{AgentHello, ControlMsg, DialError, Opener, TunnelStream};
use seedgate_config::ServerConfig;
use seedgate_config::server::{ClusterLimits, ClusterMode, ClusterState, ProxyStrategy};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
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

    fn same_as(&self, other: &Mode) -> bool {
        self.mode == other.mode && self.move_to == other.move_to && self.drain_deadline == other.drain_deadline
    }
}

struct Cluster {
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
}

impl Cluster {
    fn new(kill: &CancellationToken) -> Self {
        Self { sessions: Vec::new(), index: NodeIndex::default(), end: kill.child_token(), generation: 0 }
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
    /// `limits.tenant_share`, of `limits.max_connections` (streams) and `limits.max_pending`.
    pub fraction: f64,
    pub max_streams: usize,
    pub max_pending: usize,
}

impl ShareConfig {
    pub(crate) fn of(cfg: &ServerConfig, own: BTreeMap<String, ClusterLimits>) -> Self {
        let l = &cfg.limits;
        Self { own, fraction: l.tenant_share, max_streams: l.max_connections, max_pending: l.max_pending }
    }

    fn cap(&self, cluster: &str, kind: Kind) -> Cap {
        let own = self.own.get(cluster).copied().unwrap_or_default();
        match kind {
            Kind::Established => Cap::new(own.max_streams, self.fraction, self.max_streams),
            Kind::Pending | Kind::Handshake => Cap::new(own.max_pending, self.fraction, self.max_pending),
        }
    }
}

/// Why a dial was not made or failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DialRefused {
    #[error(transparent)]
    Dial(#[from] DialError),
    /// The cluster holds its share of streams or pending dials: refused before any dial.
    #[error("over capacity: cluster {cluster} holds its share of {} ({cap})", share_name(*.kind))]
    Share { cluster: String, kind: Kind, cap: usize },
}

/// What a cluster's share of `kind` counts, as a refusal names it.
fn share_name(kind: Kind) -> &'static str {
    if kind == Kind::Established { "streams" } else { "pending dials" }
}

impl DialRefused {
    pub(crate) fn code(&self) -> &'static str {
        match self {
            DialRefused::Dial(e) => e.code(),
            DialRefused::Share { kind: Kind::Established, .. } => "cluster_stream_limit",
            DialRefused::Share { .. } => "cluster_pending_limit",
        }
    }

    pub(crate) fn http_status(&self) -> u16 {
        match self {
            DialRefused::Dial(e) => e.http_status(),
            DialRefused::Share { .. } => 503,
        }
    }
}

/// Most sessions one dial is tried on (each at most once, all within the dial deadline).
const DIAL_ATTEMPTS: usize = 3;

/// The deadlines of one dial.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DialTimes {
    /// The whole dial, every attempt included (`timeouts.dial`).
    pub dial: Duration,
    /// How long one session may stay silent before the dial moves on (`agents.open_timeout`).
    pub open: Duration,
}

/// A dialled tunnel stream, its place in its cluster's share of streams, and how its agent was
/// chosen.
pub(crate) struct Dialed {
    pub stream: TunnelStream,
    pub share: Hold,
    /// The proxy strategy that chose the agent.
    pub strategy: ProxyStrategy,
    /// The node the agent announced (empty when it named none).
    pub node: String,
}

/// The agent sessions of every cluster, and each cluster's mode and share of the process limits:
/// where a dial finds its agent.
pub(crate) struct SessionDirectory {
    clusters: Arc<RwLock<HashMap<String, Cluster>>>,
    /// Each cluster's streams and pending work against its share of the process limits.
    pub shares: Shares,
    share_cfg: RwLock<ShareConfig>,
    /// The shutdown kill token (the streams' end tokens are its children).
    kill: CancellationToken,
    modes: Arc<RwLock<BTreeMap<String, Mode>>>,
    next_id: AtomicU64,
    metrics: ServerMetrics,
}

impl SessionDirectory {
    pub(crate) fn new(
        metrics: ServerMetrics,
        reg: &proxy_core::prometheus::Registry,
        states: &BTreeMap<String, ClusterState>,
        kill: CancellationToken,
    ) -> Self {
        let modes = states.iter().map(|(k, v)| (k.clone(), Mode::from_cfg(Some(v)))).collect();
        Self {
            clusters: Arc::new(RwLock::new(HashMap::new())),
            kill,
            modes: Arc::new(RwLock::new(modes)),
            next_id: AtomicU64::new(1),
            metrics,
            shares: Shares::new(reg, CLUSTER_SHARES),
            share_cfg: RwLock::default(),
        }
    }

    /// New cluster limits (config, cluster files, admin overrides); for work admitted from now.
    pub(crate) fn set_shares(&self, cfg: ShareConfig) {
        *self.share_cfg.write().expect("not poisoned") = cfg;
    }

    /// `cluster` as a tenant of the front ends' pending budget, with its cap there.
    pub(crate) fn pending_share(&self, cluster: &str) -> TenantShare {
        let cap = self.share_cfg.read().expect("not poisoned").cap(cluster, Kind::Pending);
        TenantShare { name: Arc::from(cluster), cap }
    }

    /// Take a place in `cluster`'s share of streams and of pending dials (in that order), or say
    /// why not. The config, the tenant and the other clusters are looked at once for both.
    fn take_shares(&self, cluster: &str) -> Result<(Hold, Hold), DialRefused> {
        let caps = {
            let cfg = self.share_cfg.read().expect("not poisoned");
            [cfg.cap(cluster, Kind::Established), cfg.cap(cluster, Kind::Pending)]
        };
        // Nobody else could use what a default share would keep free: only the process limit applies.
        let alone = caps.iter().any(|c| matches!(c, Cap::Share { .. })) && !self.others_served(cluster);
        let tenant = self.shares.tenant(&[cluster]);
        let take = |kind: Kind, cap: Cap| {
            let cap = if alone && matches!(cap, Cap::Share { .. }) { Cap::Fixed(usize::MAX) } else { cap };
            let in_use = self.shares.total(kind);
            tenant.try_take_at(kind, cap, in_use).ok_or_else(|| DialRefused::Share {
                cluster: cluster.to_owned(),
                kind,
                cap: cap.at(in_use),
            })
        };
        let streams = take(Kind::Established, caps[0])?;
        Ok((streams, take(Kind::Pending, caps[1])?))
    }

    /// Whether a cluster other than `cluster` has an agent session. Only such a cluster can
    /// want the streams and dials a default share keeps free (without a session it can carry
    /// none), so a cluster alone on its proxy-server — the usual deployment, one per control
    /// plane — may use the whole process.
    fn others_served(&self, cluster: &str) -> bool {
        self.clusters.read().expect("not poisoned").iter().any(|(c, e)| c != cluster && !e.sessions.is_empty())
    }

    pub(crate) fn mode(&self, cluster: &str) -> Mode {
        self.modes.read().expect("not poisoned").get(cluster).cloned().unwrap_or_else(|| Mode::from_cfg(None))
    }

    /// Apply cluster states (from config or the admin endpoint). Returns the clusters whose
    /// mode changed.
    pub(crate) fn set_modes(&self, states: &BTreeMap<String, ClusterState>) -> Vec<String> {
        let mut changed = Vec::new();
        {
            let mut modes = self.modes.write().expect("not poisoned");
            let mut next = BTreeMap::new();
            let names: std::collections::BTreeSet<&String> = modes.keys().chain(states.keys()).collect();
            for name in names {
                let new = Mode::from_cfg(states.get(name));
                match modes.get(name) {
                    Some(old) if old.same_as(&new) => {
                        // The same state (no notices, deadlines keep counting); strategies as now.
                        next.insert(name.clone(), Mode { strategies: new.strategies, ..old.clone() });
                    }
                    old => {
                        if old.is_some() || new.mode != ClusterMode::Active {
                            changed.push(name.clone());
                        }
                        if states.contains_key(name) {
                            next.insert(name.clone(), new);
                        }
                    }
                }
            }
            *modes = next;
        }
        for name in &changed {
            self.on_mode_change(name);
        }
        changed
    }

    /// Tell agents and live streams about a new mode of `cluster`.
    fn on_mode_change(&self, cluster: &str) {
        let mode = self.mode(cluster);
        self.metrics.set_cluster_state(cluster, mode.mode);
        let sessions = {
            let mut clusters = self.clusters.write().expect("not poisoned");
            let c = clusters.entry(cluster.to_owned()).or_insert_with(|| Cluster::new(&self.kill));
            c.generation += 1;
            match (mode.mode, mode.drain_deadline) {
                (ClusterMode::Fenced, _) => c.end_streams(&self.kill),
                (ClusterMode::Draining, Some(d)) => self.end_streams_at(cluster, c.generation, mode.since + d),
                _ => {}
            }
            c.sessions.clone()
        };
        tracing::info!(cluster, mode = ?mode.mode, move_to = ?mode.move_to, "cluster state changed");
        match mode.mode {
            ClusterMode::Active => {}
            ClusterMode::Draining => {
                for s in &sessions {
                    self.send_move(s, &mode);
                }
            }
            ClusterMode::Fenced => {
                // Fenced: this seed must not act for the cluster any more.
                for s in &sessions {
                    s.stop.cancel();
                }
            }
        }
    }

    fn send_move(&self, s: &Session, mode: &Mode) {
        let msg = ControlMsg::Move {
            to: mode.move_to.clone(),
            drain_deadline_ms: mode.drain_deadline.map(|d| d.as_millis() as u64).unwrap_or(0),
        };
        if let Err(e) = s.opener.control(&msg) {
            tracing::warn!(cluster = %s.cluster, session = s.id, error = %e, "cannot send the move notice");
        } else {
            self.metrics.move_notices.with_label_values(&[&s.cluster]).inc();
        }
    }

    /// Register a new agent session. Refused (with the reason) when the cluster is fenced.
    pub(crate) fn add(
        &self,
        cluster: &str,
        peer: String,
        opener: Arc<dyn Opener>,
        hello: Arc<Mutex<Option<AgentHello>>>,
        stop: CancellationToken,
    ) -> Result<Arc<Session>, &'static str> {
        let mode = self.mode(cluster);
        if mode.mode == ClusterMode::Fenced {
            return Err("cluster_fenced");
        }
        let s = Arc::new(Session {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            cluster: cluster.to_owned(),
            peer,
            opener,
            hello,
            stop,
            liveness: Default::default(),
        });
        {
            let mut clusters = self.clusters.write().expect("not poisoned");
            let c = clusters.entry(cluster.to_owned()).or_insert_with(|| Cluster::new(&self.kill));
            c.sessions.push(s.clone());
            c.index.add(s.clone());
            // Set under the lock: set after it, an add and a remove racing could leave the
            // gauge at the count of whichever wrote last, not of what is registered.
            self.metrics.agents.with_label_values(&[cluster]).set(c.sessions.len() as i64);
        }
        if mode.mode == ClusterMode::Draining {
            // An agent that connects to a draining seed is told to move at once.
            self.send_move(&s, &mode);
        }
        Ok(s)
    }

    pub(crate) fn remove(&self, s: &Session) {
        let mut clusters = self.clusters.write().expect("not poisoned");
        let Some(c) = clusters.get_mut(&s.cluster) else { return };
        c.sessions.retain(|x| x.id != s.id);
        c.index.remove(s.id);
        // Under the lock, as in `add`.
        self.metrics.agents.with_label_values(&[&s.cluster]).set(c.sessions.len() as i64);
    }

    /// Clusters with at least one agent session.
    pub(crate) fn connected(&self) -> Vec<String> {
        let clusters = self.clusters.read().expect("not poisoned");
        clusters.iter().filter(|(_, c)| !c.sessions.is_empty()).map(|(n, _)| n.clone()).collect()
    }

    /// Every agent session of every cluster.
    pub(crate) fn all_sessions(&self) -> Vec<Arc<Session>> {
        let clusters = self.clusters.read().expect("not poisoned");
        clusters.values().flat_map(|c| c.sessions.iter().cloned()).collect()
    }

    pub(crate) fn sessions(&self, cluster: &str) -> Vec<Arc<Session>> {
        self.clusters.read().expect("not poisoned").get(cluster).map(|c| c.sessions.clone()).unwrap_or_default()
    }

    /// At `at` (the drain deadline), end the cluster's live streams, unless its mode changed again.
    fn end_streams_at(&self, cluster: &str, generation: u64, at: Instant) {
        let (clusters, kill, cluster) = (self.clusters.clone(), self.kill.clone(), cluster.to_owned());
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep_until(at.into()) => {}
                _ = kill.cancelled() => return,
            }
            let mut clusters = clusters.write().expect("not poisoned");
            if let Some(c) = clusters.get_mut(&cluster).filter(|c| c.generation == generation) {
                c.end_streams(&kill);
            }
        });
    }

    /// The token that ends a stream admitted now: cancelled at once when the cluster is fenced,
    /// at the drain deadline when it drains with one, at the end of the shutdown grace; never
    /// while the cluster stays active or drains without a deadline.
    pub(crate) fn stream_end(&self, cluster: &str) -> CancellationToken {
        let mut clusters = self.clusters.write().expect("not poisoned");
        clusters.entry(cluster.to_owned()).or_insert_with(|| Cluster::new(&self.kill)).end.clone()
    }

    /// Open a stream to `target` through an agent of `cluster`, within the cluster's shares: a
    /// place among its streams (held by the returned stream) and, while the dial is in flight,
    /// among its pending work, so an agent that does not answer holds at most that share. The
    /// agent is chosen by the cluster's proxy strategies, else `strategies` (the global list).
    pub(crate) async fn dial(
        &self,
        cluster: &str,
        target: &str,
        times: DialTimes,
        strategies: &[ProxyStrategy],
    ) -> Result<Dialed, DialRefused> {
        let mode = self.mode(cluster);
        if mode.mode == ClusterMode::Fenced {
            let msg = format!("cluster {cluster} moved to another seed; this seed no longer serves it");
            return Err(DialError::Moved(msg).into());
        }
        let strategies = mode.strategies.as_deref().unwrap_or(strategies);
        let (share, dialing) = self.take_shares(cluster)?;
        let chosen = self.dial_agent(cluster, target, times, strategies).await;
        drop(dialing);
        let (stream, strategy, node) = chosen?;
        Ok(Dialed { stream, share, strategy, node })
    }

    /// Among the sessions of the first of `strategies` that names a trusted one (else a usable
    /// one: [`liveness`]), the least busy of two random ones. The dial moves to another
    /// session (up to [`DIAL_ATTEMPTS`] in all, within `times.dial`) when the transport failed
    /// before the agent answered, when the agent turns out to be shutting down, or when the
    /// session stays silent past `times.open`. Returns the stream, the strategy and the agent's
    /// node.
    async fn dial_agent(
        &self,
        cluster: &str,
        target: &str,
        times: DialTimes,
        strategies: &[ProxyStrategy],
    ) -> Result<(TunnelStream, ProxyStrategy, String), DialError> {
        let deadline = tokio::time::Instant::now() + times.dial;
        let mut tried: Vec<u64> = Vec::new();
        let mut last = DialError::NoAgent(match self.sessions(cluster).is_empty() {
            true => format!("no agent of cluster {cluster} is connected"),
            false => format!("no agent of cluster {cluster} for {target} by proxy strategies {}", names(strategies)),
        });
        let mut retry: Option<(&'static str, u64)> = None;
        while tried.len() < DIAL_ATTEMPTS {
            let Some((strategy, candidates)) = self.candidates(cluster, target, strategies, &tried) else { break };
            let Some(s) = self.pick(&candidates) else { break };
            if let Some((reason, from)) = retry.take() {
                self.metrics.dial_retries.with_label_values(&[cluster, reason]).inc();
                tracing::info!(cluster, target, reason, from, to = s.id, "dial moved to another agent session");
            }
            tried.push(s.id);
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let others = || self.candidates(cluster, target, strategies, &tried).is_some();
            match attempt::attempt(&s, target, left, times.open, others, &self.metrics).await {
                Attempt::Answered(Ok(stream)) => {
                    self.metrics.dial_strategy.with_label_values(&[cluster, strategy.as_str()]).inc();
                    return Ok((stream, strategy, attempt::node(&s)));
                }
                // Nothing reached the target: another agent may take it.
                Attempt::Answered(Err(e @ (DialError::Transport(_) | DialError::Draining(_)))) => {
                    let reason = if matches!(e, DialError::Transport(_)) { "transport" } else { "draining" };
                    retry = Some((reason, s.id));
                    last = e;
                }
                Attempt::Answered(Err(e)) => return Err(e),
                Attempt::Silent => {
                    retry = Some(("silent", s.id));
                    last = DialError::Timeout(format!("{target}: no answer from the agent within {:?}", times.open));
                }
            }
        }
        Err(last)
    }

    /// Of `candidates`, those of the best standing (a doubt they outlived is cleared here),
    /// then the least busy of two.
    fn pick(&self, candidates: &[Arc<Session>]) -> Option<Arc<Session>> {
        let standings: Vec<Standing> = candidates.iter().map(|s| attempt::standing(s, &self.metrics)).collect();
        let best: Vec<Arc<Session>> =
            liveness::preferred(&standings).into_iter().map(|i| candidates[i].clone()).collect();
        p2c(&best)
    }

    /// The sessions of `cluster` the first fitting strategy names (open, not tried yet).
    fn candidates(
        &self,
        cluster: &str,
        target: &str,
        strategies: &[ProxyStrategy],
        tried: &[u64],
    ) -> Option<(ProxyStrategy, Vec<Arc<Session>>)> {
        self.file_hellos(cluster);
        let usable = |s: &Session| !s.opener.is_closed() && !tried.contains(&s.id);
        let clusters = self.clusters.read().expect("not poisoned");
        let c = clusters.get(cluster)?;
        // A doubted session is tried last: a later strategy's trusted one comes first.
        let trusted = |s: &Session| usable(s) && attempt::standing(s, &self.metrics) == Standing::Healthy;
        strategy::candidates(&c.index, &c.sessions, strategies, target, trusted)
            .or_else(|| strategy::candidates(&c.index, &c.sessions, strategies, target, usable))
    }

    /// File the hellos of `cluster`'s sessions that arrived since the last look (they come on
    /// the control stream after the session registered); a session of a new run of an agent
    /// supersedes those of its earlier runs then.
    pub(crate) fn file_hellos(&self, cluster: &str) {
        let unread = self.clusters.read().expect("not poisoned").get(cluster).is_some_and(|c| c.index.has_unread());
        if !unread {
            return;
        }
        let mut clusters = self.clusters.write().expect("not poisoned");
        let Some(c) = clusters.get_mut(cluster) else { return };
        for (new, hello) in c.index.refresh() {
            self.supersede(&c.sessions, &new, &hello);
        }
    }

    /// `new`'s agent said who it is (`hello`): the sessions of an earlier run of the same agent
    /// (registered before it, same node, another instance) are superseded. They are gone in all
    /// likelihood (a restart, a node that lost power) but not known to be until their keepalive
    /// times out: until then dials try them last, and nothing on them is cut.
    fn supersede(&self, sessions: &[Arc<Session>], new: &Session, hello: &AgentHello) {
        for old in sessions.iter().filter(|o| o.id < new.id) {
            let was = old.hello.lock().expect("not poisoned").clone();
            if !was.is_some_and(|was| liveness::supersedes(hello, &was)) {
                continue;
            }
            if old.liveness.doubt(Standing::Superseded, old.opener.heard()) {
                self.metrics.sessions_doubted.with_label_values(&[&new.cluster, "superseded"]).inc();
                tracing::info!(
                    cluster = %new.cluster, node = %hello.node, old = old.id, new = new.id, old_peer = %old.peer, peer = %new.peer,
                    "agent restarted (a new run of its node connected): its earlier session is superseded, tried last until it ends"
                );
            }
        }
    }
}

fn names(s: &[ProxyStrategy]) -> String {
    s.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
}

/// Power of two choices on active streams.
fn p2c(c: &[Arc<Session>]) -> Option<Arc<Session>> {
    proxy_core::net::balance::p2c(c.len(), |i| c[i].opener.active_streams()).map(|i| c[i].clone())
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
