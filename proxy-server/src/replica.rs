//! This replica's identity, the replica count it announces to its agents (static, or the number of addresses a peers name resolves to), and its draining notice.

use crate::Shared;
use proxy_core::tunnel::{ControlMsg, ServerInfo};
use seedgate_config::ServerConfig;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// What this replica tells its agents.
pub struct Replica {
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
pub fn server_id(cfg: &ServerConfig) -> String {
    cfg.agents.server_id.clone().unwrap_or_else(host_name)
}

/// The static count of a config (`peers` overrides it once resolved).
fn static_count(cfg: &ServerConfig) -> u32 {
    cfg.agents.server_count.unwrap_or(1)
}

impl Replica {
    pub fn new(cfg: &ServerConfig) -> Self {
        let info = ServerInfo { id: server_id(cfg), count: static_count(cfg), since_ms: now_ms(), draining: false };
        Self { info: Mutex::new(info) }
    }

    pub fn info(&self) -> ServerInfo {
        self.info.lock().expect("not poisoned").clone()
    }

    /// The `/readyz?verbose` line: what this replica announces (always passes).
    pub fn check(&self, cfg: &ServerConfig) -> proxy_core::obs::admin::Check {
        let i = self.info();
        let from = match &cfg.agents.peers {
            Some(p) => format!("from agents.peers {p}"),
            None => "agents.server_count".to_owned(),
        };
        let draining = if i.draining { ", draining" } else { "" };
        proxy_core::obs::admin::Check::new(
            "replica",
            true,
            format!("id {}, announcing {} replicas ({from}){draining}", i.id, i.count),
        )
    }

    /// Tell a session just registered who we are.
    pub fn announce_to(&self, shared: &Shared, s: &crate::session::Session) {
        let info = self.info.lock().expect("not poisoned");
        send(shared, s, &info);
    }

    /// Change what we announce and tell every agent. No-op when nothing changed.
    fn update(&self, shared: &Shared, change: impl FnOnce(&mut ServerInfo)) {
        let mut info = self.info.lock().expect("not poisoned");
        let before = info.clone();
        change(&mut info);
        if *info == before {
            return;
        }
        if info.count != before.count {
            info.since_ms = now_ms().max(before.since_ms + 1);
        }
        shared.metrics.replica_count.set(i64::from(info.count));
        tracing::info!(id = %info.id, count = info.count, draining = info.draining, "announcing this replica to its agents");
        for s in shared.directory.all_sessions() {
            send(shared, &s, &info);
        }
    }

    /// A reload: a new static count or id. (With `peers`, the count comes from its next lookup.)
    pub fn reconfigure(&self, shared: &Shared, cfg: &ServerConfig) {
        let id = server_id(cfg);
        let count = cfg.agents.peers.is_none().then(|| static_count(cfg));
        self.update(shared, |i| {
            i.id = id;
            if let Some(c) = count {
                i.count = c;
            }
        });
    }

    /// SIGTERM: agents keep their live streams here and look for another replica.
    pub fn draining(&self, shared: &Shared) {
        self.update(shared, |i| i.draining = true);
    }

    /// Resolve `agents.peers` now and every `peers_interval`, announcing the number of addresses
    /// as the count. A failed lookup keeps the last count (a DNS hiccup must not shrink it).
    pub async fn follow_peers(shared: std::sync::Arc<Shared>) {
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
                        shared.replica.update(&shared, |i| i.count = n);
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

fn send(shared: &Shared, s: &crate::session::Session, info: &ServerInfo) {
    match s.opener.control(&ControlMsg::Server(info.clone())) {
        Ok(()) => shared.metrics.announcements.inc(),
        Err(e) => tracing::warn!(cluster = %s.cluster, session = s.id, error = %e, "cannot announce this replica"),
    }
}
