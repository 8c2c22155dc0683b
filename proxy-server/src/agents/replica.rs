//! This replica's identity, the replica count it announces to its agents (static, or the number of addresses a peers name resolves to), and its draining notice.

use crate::metrics::ServerMetrics;
use crate::registry::SessionDirectory;
use proxy_core::sync::Mutex;
use proxy_core::tunnel::{ControlMsg, ServerInfo};
use seedgate_config::ServerConfig;
use std::time::{SystemTime, UNIX_EPOCH};

/// What this replica tells its agents.
pub(crate) struct Replica {
    /// Guarded together with the sends, so an agent never receives an older state after a
    /// newer one (a registration and a change racing each other).
    info: Mutex<ServerInfo>,
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// The host name: a pod's name in Kubernetes, distinct per replica.
fn host_name() -> String {
    std::env::var("POD_NAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| format!("proxy-server-{}", std::process::id()))
}

/// The id a config gives this replica.
pub(crate) fn server_id(cfg: &ServerConfig) -> String {
    cfg.agents.server_id.clone().unwrap_or_else(host_name)
}

/// The static count of a config (`peers` overrides it once resolved).
fn static_count(cfg: &ServerConfig) -> u32 {
    cfg.agents.server_count.unwrap_or(1)
}

impl Replica {
    pub(crate) fn new(cfg: &ServerConfig) -> Self {
        let info = ServerInfo { id: server_id(cfg), count: static_count(cfg), since_ms: now_ms(), draining: false };
        Self { info: Mutex::new(info) }
    }

    pub(crate) fn info(&self) -> ServerInfo {
        self.info.lock().clone()
    }

    /// The `/readyz?verbose` line (information): what this replica announces.
    pub(crate) fn check(&self, cfg: &ServerConfig) -> proxy_core::obs::admin::Check {
        let i = self.info();
        let from = match &cfg.agents.peers {
            Some(p) => format!("from agents.peers {p}"),
            None => "agents.server_count".to_owned(),
        };
        let draining = if i.draining { ", draining" } else { "" };
        proxy_core::obs::admin::Check::info(
            "replica",
            format!("id {}, announcing {} replicas ({from}){draining}", i.id, i.count),
        )
    }

    /// Tell a session just registered who we are.
    pub(crate) fn announce_to(&self, metrics: &ServerMetrics, s: &crate::registry::Session) {
        let info = self.info.lock();
        send(metrics, s, &info);
    }

    /// Change what we announce and tell every agent. No-op when nothing changed.
    pub(crate) fn update(
        &self,
        metrics: &ServerMetrics,
        directory: &SessionDirectory,
        change: impl FnOnce(&mut ServerInfo),
    ) {
        let mut info = self.info.lock();
        let before = info.clone();
        change(&mut info);
        if *info == before {
            return;
        }
        if info.count != before.count {
            info.since_ms = now_ms().max(before.since_ms + 1);
        }
        metrics.replica_count.set(i64::from(info.count));
        tracing::info!(id = %info.id, count = info.count, draining = info.draining, "announcing this replica to its agents");
        for s in directory.all_sessions() {
            send(metrics, &s, &info);
        }
    }

    /// A reload: a new static count or id. (With `peers`, the count comes from its next lookup.)
    pub(crate) fn reconfigure(&self, metrics: &ServerMetrics, directory: &SessionDirectory, cfg: &ServerConfig) {
        let id = server_id(cfg);
        let count = cfg.agents.peers.is_none().then(|| static_count(cfg));
        self.update(metrics, directory, |i| {
            i.id = id;
            if let Some(c) = count {
                i.count = c;
            }
        });
    }

    /// SIGTERM: agents keep their live streams here and look for another replica.
    pub(crate) fn draining(&self, metrics: &ServerMetrics, directory: &SessionDirectory) {
        self.update(metrics, directory, |i| i.draining = true);
    }
}

fn send(metrics: &ServerMetrics, s: &crate::registry::Session, info: &ServerInfo) {
    match s.opener.control(&ControlMsg::Server(info.clone())) {
        Ok(()) => metrics.announcements.inc(),
        Err(e) => tracing::warn!(cluster = %s.cluster, session = s.id, error = %e, "cannot announce this replica"),
    }
}
