//! Which agents of a cluster a dial may go to: the identifiers agents announce, indexed per cluster, and the proxy strategies tried in order.
//!
//! An agent's hello names its node (`host`), the node's addresses and whether it offers a default
//! route. A dial to `host:port` tries the strategies in order and takes the first that names a
//! usable agent: `dest_host` (an agent whose identifiers include the host), `default_route` (an
//! agent offering a default route), `default` (any agent). A host no connected agent claims
//! falls through to the next strategy. The least loaded of the candidates is the caller's pick.

use super::session::Session;
use proxy_core::tunnel::AgentHello;
use seedgate_config::server::ProxyStrategy;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

/// One cluster's agents by identifier. The hello arrives on the control stream after the
/// session is registered, so a new session waits in `unread` until its hello is there.
#[derive(Default)]
pub(crate) struct NodeIndex {
    by_id: HashMap<String, Vec<Arc<Session>>>,
    default_route: Vec<Arc<Session>>,
    /// The identifiers each indexed session is filed under (to remove it again).
    filed: HashMap<u64, Vec<String>>,
    unread: Vec<Arc<Session>>,
}

/// The form an identifier or a dial's host is compared in: an address in its canonical text, a
/// name in lower case without a trailing dot. `None`: nothing to match.
pub(crate) fn normalize(host: &str) -> Option<String> {
    let h = host.trim().trim_start_matches('[').trim_end_matches(']').trim_end_matches('.');
    if h.is_empty() {
        return None;
    }
    Some(match h.parse::<IpAddr>() {
        Ok(ip) => ip.to_canonical().to_string(),
        Err(_) => h.to_ascii_lowercase(),
    })
}

/// The host of a dial target `host:port` (`[v6]:port` too).
pub(crate) fn target_host(target: &str) -> &str {
    match target.rsplit_once(':') {
        Some((h, p)) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => target,
    }
}

impl NodeIndex {
    pub(crate) fn add(&mut self, s: Arc<Session>) {
        self.unread.push(s);
    }

    pub(crate) fn remove(&mut self, id: u64) {
        self.unread.retain(|s| s.id != id);
        self.default_route.retain(|s| s.id != id);
        for key in self.filed.remove(&id).unwrap_or_default() {
            if let Some(v) = self.by_id.get_mut(&key) {
                v.retain(|s| s.id != id);
                if v.is_empty() {
                    self.by_id.remove(&key);
                }
            }
        }
    }

    /// Sessions registered whose hello has not been filed yet.
    pub(crate) fn has_unread(&self) -> bool {
        !self.unread.is_empty()
    }

    /// File the sessions whose hello has arrived since; returns them with their hellos.
    pub(crate) fn refresh(&mut self) -> Vec<(Arc<Session>, AgentHello)> {
        let mut waiting = Vec::new();
        let mut filed = Vec::new();
        for s in std::mem::take(&mut self.unread) {
            let Some(hello) = s.hello.get().cloned() else {
                waiting.push(s);
                continue;
            };
            let mut keys: Vec<String> = std::iter::once(hello.host.as_str())
                .chain(hello.addresses.iter().map(String::as_str))
                .filter_map(normalize)
                .collect();
            keys.sort();
            keys.dedup();
            for k in &keys {
                self.by_id.entry(k.clone()).or_default().push(s.clone());
            }
            if hello.default_route {
                self.default_route.push(s.clone());
            }
            self.filed.insert(s.id, keys);
            filed.push((s, hello));
        }
        self.unread = waiting;
        filed
    }

    /// The sessions a strategy names for a dial to `host` (normalized); `all` for `default`.
    pub(crate) fn named<'a>(
        &'a self,
        strategy: ProxyStrategy,
        host: Option<&str>,
        all: &'a [Arc<Session>],
    ) -> &'a [Arc<Session>] {
        match strategy {
            ProxyStrategy::DestHost => host.and_then(|h| self.by_id.get(h)).map_or(&[], Vec::as_slice),
            ProxyStrategy::DefaultRoute => &self.default_route,
            ProxyStrategy::Default => all,
        }
    }
}

/// The first strategy that names a usable session, with those sessions.
pub(crate) fn candidates(
    index: &NodeIndex,
    all: &[Arc<Session>],
    strategies: &[ProxyStrategy],
    target: &str,
    usable: impl Fn(&Session) -> bool,
) -> Option<(ProxyStrategy, Vec<Arc<Session>>)> {
    let host = normalize(target_host(target));
    strategies.iter().find_map(|&st| {
        let c: Vec<Arc<Session>> =
            index.named(st, host.as_deref(), all).iter().filter(|s| usable(s)).cloned().collect();
        (!c.is_empty()).then_some((st, c))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proxy_core::tunnel::{BoxFuture, ControlMsg, DialError, Opener, TunnelStream};
    use std::sync::OnceLock;
    use std::time::Duration;
    use tokio_util::sync::CancellationToken;

    struct Idle;

    impl Opener for Idle {
        fn open(&self, _: &str, _: Duration) -> BoxFuture<'_, Result<TunnelStream, DialError>> {
            Box::pin(async { Err(DialError::Transport("test".into())) })
        }
        fn control(&self, _: &ControlMsg) -> Result<(), DialError> {
            Ok(())
        }
        fn active_streams(&self) -> usize {
            0
        }
        fn is_closed(&self) -> bool {
            false
        }
    }

    fn session(id: u64, hello: Option<(&str, &[&str], bool)>) -> Arc<Session> {
        let hello = hello.map(|(host, addrs, default_route)| AgentHello {
            host: host.into(),
            addresses: addrs.iter().map(|a| a.to_string()).collect(),
            default_route,
            ..AgentHello::default()
        });
        Arc::new(Session {
            id,
            cluster: "c".into(),
            peer: "p".into(),
            opener: Arc::new(Idle),
            hello: Arc::new(hello.map(OnceLock::from).unwrap_or_default()),
            stop: CancellationToken::new(),
            liveness: Default::default(),
            identity: Default::default(),
            transport: "h2",
            since: std::time::Instant::now(),
            tally: Default::default(),
        })
    }

    fn ids(c: Option<(ProxyStrategy, Vec<Arc<Session>>)>) -> Option<(&'static str, Vec<u64>)> {
        c.map(|(st, v)| (st.as_str(), v.iter().map(|s| s.id).collect()))
    }

    #[test]
    fn hosts_and_targets_compare_in_one_form() {
        assert_eq!(target_host("10.0.0.1:10250"), "10.0.0.1");
        assert_eq!(target_host("[fd00::7]:10250"), "[fd00::7]");
        assert_eq!(target_host("node-1"), "node-1");
        assert_eq!(normalize("[FD00:0::7]").as_deref(), Some("fd00::7"));
        assert_eq!(normalize("::ffff:10.0.0.1").as_deref(), Some("10.0.0.1"));
        assert_eq!(normalize("Node-1.").as_deref(), Some("node-1"));
        assert_eq!(normalize(" "), None);
    }

    #[test]
    fn strategies_are_tried_in_order_and_fall_through() {
        let (a, b, c) = (
            session(1, Some(("node-a", &["10.0.0.1"], false))),
            session(2, Some(("node-b", &["10.0.0.2", "fd00::2"], true))),
            session(3, None),
        );
        let all = vec![a.clone(), b.clone(), c.clone()];
        let mut idx = NodeIndex::default();
        for s in &all {
            idx.add(s.clone());
        }
        idx.refresh();
        assert!(idx.has_unread(), "a session without its hello waits");
        let order = [ProxyStrategy::DestHost, ProxyStrategy::DefaultRoute, ProxyStrategy::Default];
        let ok = |_: &Session| true;
        assert_eq!(ids(candidates(&idx, &all, &order, "10.0.0.1:10250", ok)), Some(("dest_host", vec![1])));
        assert_eq!(ids(candidates(&idx, &all, &order, "NODE-B:10250", ok)), Some(("dest_host", vec![2])));
        assert_eq!(ids(candidates(&idx, &all, &order, "[fd00::2]:10250", ok)), Some(("dest_host", vec![2])));
        // Nobody's address: the agent offering a default route.
        assert_eq!(ids(candidates(&idx, &all, &order, "10.0.0.9:80", ok)), Some(("default_route", vec![2])));
        // Its agent unusable (gone, draining): down the list.
        let not_a = |s: &Session| s.id != 1;
        assert_eq!(ids(candidates(&idx, &all, &order, "10.0.0.1:1", not_a)), Some(("default_route", vec![2])));
        let only_dest = [ProxyStrategy::DestHost, ProxyStrategy::Default];
        assert_eq!(ids(candidates(&idx, &all, &only_dest, "10.0.0.9:1", ok)), Some(("default", vec![1, 2, 3])));
        assert_eq!(ids(candidates(&idx, &all, &[ProxyStrategy::DestHost], "10.0.0.9:1", ok)), None);

        // The hello arrives later; a removed session leaves every list.
        let _ = c.hello.set(AgentHello { host: "node-c".into(), ..AgentHello::default() });
        idx.refresh();
        assert!(!idx.has_unread());
        assert_eq!(ids(candidates(&idx, &all, &order, "node-c:1", ok)), Some(("dest_host", vec![3])));
        idx.remove(2);
        let rest = vec![a, c];
        assert_eq!(ids(candidates(&idx, &rest, &order, "10.0.0.2:1", ok)), Some(("default", vec![1, 3])));
        assert!(!idx.by_id.contains_key("fd00::2") && !idx.filed.contains_key(&2));
    }
}
