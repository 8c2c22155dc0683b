//! proxy-server's admin hooks: readiness (the start-up wait, one line per cluster, the budgets, the replica, the cluster files), `/control/clusters/<name>` (setting a cluster's state: migration), the running config shown and the status page (`/status`, `/`: [`status`]); each asks the wings (the registry's methods), not their parts.

mod status;

use crate::agents::Agents;
use crate::frontend::Frontends;
use crate::registry::{ClusterView, Session, Standing};
use crate::shared::Shared;
use proxy_core::obs::admin::{Check, ControlRequest};
use seedgate_config::ServerConfig;
use seedgate_config::server::{ClusterMode, ClusterState};
use std::sync::Arc;

/// What the admin hooks read and change: the wings.
pub(crate) struct Admin {
    pub(crate) shared: Arc<Shared>,
    pub(crate) agents: Arc<Agents>,
    pub(crate) frontends: Arc<Frontends>,
}

impl Admin {
    /// `/readyz` (`?verbose` shows every line).
    pub(crate) fn ready(&self) -> Vec<Check> {
        let shared = &self.shared;
        let cfg = shared.config.load();
        let mut checks = ready(shared, &self.agents);
        checks.push(self.frontends.pending.readiness());
        checks.push(shared.directory.shares_check(cfg.limits.tenant_share));
        checks.push(self.agents.replica.check(&cfg));
        if let Some(dir) = &cfg.clusters_dir {
            let (n, clusters, refused) = shared.states.lock().files.summary();
            let detail = format!("{dir}: {n} files, {clusters} clusters ({refused} files refused)");
            checks.push(Check::info("cluster-files", detail));
        }
        checks
    }

    /// The admin endpoints under `/control/`: `PUT|POST|DELETE /control/clusters/<name>` (`None`
    /// for any other path).
    pub(crate) fn endpoint(&self, req: ControlRequest<'_>) -> Option<(http::StatusCode, String)> {
        set_cluster_state(&self.shared, req)
    }

    /// The running config as `/config` shows it, with the admin overrides and, with
    /// `clusters_dir`, what its files hold.
    pub(crate) fn show_config(&self, running: &ServerConfig) -> serde_json::Value {
        let mut v = serde_json::to_value(running).unwrap_or_default();
        let sources = self.shared.states.lock();
        v["cluster_overrides"] = serde_json::to_value(&sources.overrides).unwrap_or_default();
        if running.clusters_dir.is_some() {
            v["cluster_files"] = sources.files.show();
        }
        v
    }
}

/// Readiness of the replica, and one line of information per cluster. The only agent-related
/// condition is the start-up wait ([`SessionDirectory::settled`](crate::registry::SessionDirectory::settled)); afterwards no cluster's agents, or lack of
/// them, makes the replica unready: a cluster without agents fails its own dials (`503`), and its
/// line, `seedgate_agents_connected` and `seedgate_cluster_agents_expected` show it. Agents of
/// clusters nothing in the config knows are listed too.
fn ready(shared: &Shared, agents: &Agents) -> Vec<Check> {
    let known = shared.known_clusters();
    let limit = shared.config.load().agents.settle_time.get();
    let mut checks = vec![shared.directory.settled(std::time::Instant::now(), limit, &known)];
    checks.extend(known.iter().map(|(c, expected)| cluster_line(shared, c, *expected)));
    let mut unknown: Vec<String> =
        shared.directory.connected().into_iter().filter(|c| !known.contains_key(c)).collect();
    let refused = agents.unknown_refused();
    unknown.extend(refused.into_iter().filter(|c| !known.contains_key(c)));
    unknown.sort();
    unknown.dedup();
    if !unknown.is_empty() {
        let list: Vec<String> = unknown
            .iter()
            .map(|c| match shared.directory.sessions(c).len() {
                0 => format!("{c} (refused)"),
                n => format!("{c} ({n} agents)"),
            })
            .collect();
        let detail =
            format!("agents of clusters no front end or clusters entry knows (a CN typo?): {}", list.join(", "));
        checks.push(Check::info("unknown-clusters", detail));
    }
    checks
}

/// `cluster-<name>`: its state, its agents here and, without any, what that means for its dials.
fn cluster_line(shared: &Shared, c: &str, expected: bool) -> Check {
    let ClusterView { mode, sessions } = shared.directory.cluster(c);
    let nodes: Vec<String> = sessions.iter().map(|s| session_detail(s)).collect();
    let state = format!("{:?}", mode.mode).to_lowercase();
    let detail = match mode.mode {
        // A fenced cluster is served elsewhere: no agent is expected here.
        ClusterMode::Fenced => format!("fenced: {} agents", sessions.len()),
        _ => {
            let marked = if mode.mode == ClusterMode::Active && !expected { ", hibernated" } else { "" };
            let none = match (sessions.is_empty(), expected) {
                (true, true) => " (none connected here: its dials answer 503)",
                _ => "",
            };
            format!("{state}{marked}: {} agents [{}]{none}", sessions.len(), nodes.join(", "))
        }
    };
    Check::info(format!("cluster-{c}"), detail)
}

/// A session as readiness lists it: its peer, its node and how dials trust it, if not fully.
fn session_detail(s: &Session) -> String {
    let node = s.node();
    let standing = match s.looked_at() {
        _ if s.suspect() => "suspect: keepalive unanswered, takes no new dials",
        Standing::Healthy => "",
        doubted => doubted.label(),
    };
    let notes: Vec<&str> = [node.as_str(), standing].into_iter().filter(|n| !n.is_empty()).collect();
    match notes.is_empty() {
        true => s.peer.clone(),
        false => format!("{} ({})", s.peer, notes.join(", ")),
    }
}

/// `PUT|POST|DELETE /control/clusters/<name>`: set or clear an admin override of a cluster's state.
fn set_cluster_state(shared: &Shared, req: ControlRequest<'_>) -> Option<(http::StatusCode, String)> {
    use http::{Method, StatusCode};
    let name = req.path.strip_prefix("/control/clusters/")?;
    if !seedgate_config::server::valid_cluster_name(name) {
        return Some((StatusCode::BAD_REQUEST, format!("{name:?} is not a cluster name\n")));
    }
    match *req.method {
        Method::PUT | Method::POST => {
            let state: ClusterState = match serde_json::from_slice(req.body) {
                Ok(s) => s,
                Err(e) => {
                    return Some((
                        StatusCode::BAD_REQUEST,
                        format!(
                            "body must be JSON like {{\"state\":\"draining\",\"move_to\":[\"host:8132\"],\"drain_deadline\":\"30s\"}}: {e}\n"
                        ),
                    ));
                }
            };
            shared.states.lock().overrides.insert(name.to_owned(), state);
        }
        Method::DELETE => {
            shared.states.lock().overrides.remove(name);
        }
        _ => return Some((StatusCode::METHOD_NOT_ALLOWED, "use PUT or DELETE\n".into())),
    }
    shared.apply_states();
    let mode = shared.directory.mode(name);
    Some((StatusCode::OK, format!("cluster {name}: {:?}\n", mode.mode).to_lowercase()))
}
