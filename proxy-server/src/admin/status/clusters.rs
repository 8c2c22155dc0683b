//! The clusters of proxy-server's status document: which clusters it lists (those the config names, and those with sessions or dials here), their totals, the filter and the page, and each cluster's row with its sessions — read through the registry's [`figures`](crate::registry::SessionDirectory::figures) and the sessions' own methods.

use super::doc::{Cluster, SessionStatus, Totals};
use crate::registry::{ClusterFigures, DIAL_RESULTS, Dials, Session};
use crate::shared::Shared;
use proxy_core::net::share::TenantFigures;
use proxy_core::obs::minutes::MINUTES;
use proxy_core::obs::status::{Paging, StatusQuery, group_by, readings};
use seedgate_config::server::ClusterMode;
use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

/// A cluster as the directory and the config know it (no figures: a known cluster that never had
/// a session or a dial here).
pub(super) struct Known<'a> {
    name: &'a str,
    figures: Option<&'a ClusterFigures>,
    /// Its agents are expected here (active, not hibernated).
    expected: bool,
    /// Something in the config names it.
    known: bool,
}

impl Known<'_> {
    fn sessions(&self) -> &[std::sync::Arc<Session>] {
        self.figures.map(|v| v.sessions.as_slice()).unwrap_or_default()
    }

    fn mode(&self) -> ClusterMode {
        self.figures.and_then(|v| v.mode.as_ref()).map_or(ClusterMode::Active, |m| m.mode)
    }
}

/// Every cluster the page lists, by name: those the config names (`known`, each with whether its
/// agents are expected here), and those the directory holds with a session or a dial of the last
/// minutes (an entry the dial path made for a cluster nothing names and nothing uses stays out).
pub(super) fn listed<'a>(figures: &'a [ClusterFigures], known: &'a BTreeMap<String, bool>) -> Vec<Known<'a>> {
    let by_name: HashMap<&str, &ClusterFigures> = figures.iter().map(|v| (v.name.as_str(), v)).collect();
    let mut names: Vec<&str> =
        figures.iter().map(|v| v.name.as_str()).chain(known.keys().map(String::as_str)).collect();
    names.sort_unstable();
    names.dedup();
    names
        .into_iter()
        .map(|name| Known {
            name,
            figures: by_name.get(name).copied(),
            expected: known.get(name).copied().unwrap_or(false),
            known: known.contains_key(name),
        })
        .filter(|k| k.known || k.figures.is_some_and(|v| !v.sessions.is_empty() || v.dialled()))
        .collect()
}

/// Counts over every listed cluster, whatever the page holds.
pub(super) fn totals(all: &[Known<'_>]) -> Totals {
    let mut totals = Totals { clusters: all.len(), ..Totals::default() };
    for k in all {
        let (sessions, mode) = (k.sessions(), k.mode());
        totals.sessions += sessions.len();
        totals.sessions_not_active += sessions.iter().filter(|s| s.shown(mode).0 != "active").count();
        totals.streams += sessions.iter().map(|s| s.opener.active_streams()).sum::<usize>();
        if k.expected && sessions.is_empty() && mode == ClusterMode::Active {
            totals.clusters_without_agents += 1;
        }
    }
    totals
}

/// The clusters `query` asks for (`cluster=` exactly, `q=` in its name, its agents' nodes or
/// addresses), and the page of them it gets.
pub(super) fn page<'k, 'a>(all: &'k [Known<'a>], query: &StatusQuery) -> (Vec<&'k Known<'a>>, Paging) {
    let exact = query.get("cluster");
    let matched: Vec<&Known<'_>> = all
        .iter()
        .filter(|k| exact.is_none_or(|c| c == k.name))
        .filter(|k| {
            let sessions = k.sessions();
            let nodes = sessions.iter().filter_map(|s| s.hello.get().map(|h| h.node.as_str()));
            query.matches(std::iter::once(k.name).chain(nodes).chain(sessions.iter().map(|s| s.peer.as_str())))
        })
        .collect();
    query.page(matched, all.len())
}

/// What the rows of a page read besides each cluster's own figures, read once per document.
pub(super) struct Shown {
    replica: String,
    now: Instant,
    states: BTreeMap<String, seedgate_config::server::ClusterState>,
    shares: HashMap<String, TenantFigures>,
    /// Tunnel bytes by cluster and direction, and agent sessions by cluster and result.
    bytes: HashMap<String, BTreeMap<String, u64>>,
    agent_sessions: HashMap<String, BTreeMap<String, u64>>,
}

impl Shown {
    pub(super) fn read(shared: &Shared, replica: String) -> Self {
        let shares = shared.directory.shares.figures();
        let m = &shared.metrics;
        Self {
            replica,
            now: Instant::now(),
            states: shared.effective_states(),
            shares: shares.into_iter().filter_map(|t| t.labels.first().cloned().map(|c| (c, t))).collect(),
            bytes: group_by(&readings(&m.tunnel_bytes), "cluster", "direction"),
            agent_sessions: group_by(&readings(&m.agent_sessions), "cluster", "result"),
        }
    }
}

/// One cluster's row, with its sessions.
pub(super) fn row(k: &Known<'_>, shown: &mut Shown) -> Cluster {
    let mode = k.mode();
    let move_to = k.figures.and_then(|v| v.mode.as_ref()).map(|m| m.move_to.clone()).unwrap_or_default();
    let hibernated = shown.states.get(k.name).and_then(|s| s.hibernated).unwrap_or(false);
    let sessions: Vec<SessionStatus> = k.sessions().iter().map(|s| session(s, mode, shown)).collect();
    let health = match mode {
        ClusterMode::Fenced => "fenced",
        ClusterMode::Draining => "draining",
        ClusterMode::Active if sessions.is_empty() && hibernated => "hibernated",
        ClusterMode::Active if sessions.is_empty() && k.expected => "no-agents",
        ClusterMode::Active if sessions.is_empty() => "idle",
        ClusterMode::Active if sessions.iter().any(|s| s.standing != "active") => "degraded",
        ClusterMode::Active => "up",
    };
    let (dials, dials_failed) = k.figures.map(|v| dials(&v.dials)).unwrap_or_default();
    let share = shown.shares.get(k.name);
    let by_dir = shown.bytes.get(k.name);
    let bytes_of = |d: &str| by_dir.and_then(|b| b.get(d)).copied().unwrap_or(0);
    Cluster {
        name: k.name.to_owned(),
        state: match mode {
            ClusterMode::Active => "active",
            ClusterMode::Draining => "draining",
            ClusterMode::Fenced => "fenced",
        },
        health,
        hibernated,
        expected: k.expected,
        known: k.known,
        move_to,
        sessions_here: sessions.len(),
        streams: sessions.iter().map(|s| s.streams).sum(),
        pending: share.map_or(0, |s| s.pending),
        streams_cap: share.map_or(0, |s| s.established_cap),
        share_refused: share.map_or(0, |s| s.refused),
        dials,
        dials_failed,
        bytes_to_shoot: bytes_of("to_shoot"),
        bytes_to_seed: bytes_of("to_seed"),
        agent_sessions: shown.agent_sessions.remove(k.name).unwrap_or_default(),
        sessions,
    }
}

/// One agent session's row.
fn session(s: &Session, mode: ClusterMode, shown: &Shown) -> SessionStatus {
    let hello = s.hello.get();
    let text = |f: fn(&proxy_core::tunnel::AgentHello) -> &String| hello.map(|h| f(h).clone()).unwrap_or_default();
    let (standing, doubt) = s.shown(mode);
    let (bytes_to_shoot, bytes_to_seed) = s.tally.bytes();
    let last = s.tally.last_error();
    let now = shown.now;
    SessionStatus {
        id: s.id,
        node: text(|h| &h.node),
        instance: text(|h| &h.instance),
        version: text(|h| &h.version),
        host: text(|h| &h.host),
        peer: s.peer.clone(),
        transport: s.transport,
        replica: shown.replica.clone(),
        age_s: now.saturating_duration_since(s.since).as_secs(),
        standing,
        doubt,
        streams: s.opener.active_streams(),
        bytes_to_shoot,
        bytes_to_seed,
        last_error_age_s: last.as_ref().map(|(at, _)| now.saturating_duration_since(*at).as_secs()),
        last_error: last.map(|(_, e)| e),
        account: s.identity.account.clone(),
    }
}

/// What a cluster's dials of the last minutes came to, by result, and the failures per minute.
fn dials(d: &Dials) -> (BTreeMap<&'static str, [u64; MINUTES]>, [u64; MINUTES]) {
    let mut by = BTreeMap::new();
    let mut failed = [0; MINUTES];
    for (i, code) in DIAL_RESULTS.iter().enumerate() {
        let s = d.series(i);
        if s.iter().all(|n| *n == 0) {
            continue;
        }
        if i > 0 {
            for (f, n) in failed.iter_mut().zip(s) {
                *f += n;
            }
        }
        by.insert(*code, s);
    }
    (by, failed)
}
