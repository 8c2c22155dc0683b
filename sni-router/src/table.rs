//! The compiled routing table of one listener: SNI (exact, then `*.` wildcard), PROXY destination and CONNECT matches.

use crate::upstream::Upstream;
use proxy_core::prometheus::IntCounter;
use regex::Regex;
use seedgate_config::router::{
    Balance, ConnectUnmatched, Listener as ListenerCfg, ProxyProtocolMode, Route as RouteCfg, SendProxy,
    normalize_sni_pattern,
};
use seedgate_config::{CidrPort, IpCidr};
use std::collections::HashMap;
use std::hash::Hash;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The maps of a table and of a rebuild: a fast hasher, since a 10,000-route rebuild hashes every
/// key. Its seed is random per process; clients only look keys up, they cannot insert any.
pub type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

pub fn fast_map<K: Hash + Eq, V>(capacity: usize) -> FastMap<K, V> {
    FastMap::with_capacity_and_hasher(capacity, foldhash::fast::RandomState::default())
}

/// Pre-resolved counters of one route, so the hot path does no label lookups.
pub struct RouteMeters {
    pub ok: IntCounter,
    pub to_upstream: IntCounter,
    pub to_client: IntCounter,
}

/// One route as the data plane uses it. Shared by every connection it carries; a reload that
/// leaves the route unchanged keeps the same object (and its upstream state).
pub struct Route {
    pub name: Arc<str>,
    /// Shared with the route file it came from, so a rebuild recognises an unchanged route by
    /// pointer instead of comparing configs.
    pub cfg: Arc<RouteCfg>,
    pub upstreams: Vec<Arc<Upstream>>,
    pub balance: Balance,
    pub send_proxy: SendProxy,
    pub allowed_sources: Vec<IpCidr>,
    pub meters: RouteMeters,
    /// The route's SNI patterns, normalized once: exact names and `*.` wildcard suffixes. Shared
    /// keys, so rebuilding a table allocates nothing for a route it keeps.
    exact_keys: Vec<Arc<str>>,
    wildcard_keys: Vec<Arc<str>>,
    /// Cancelled when this route's live connections must end: at the end of the shutdown grace
    /// (it is a child of the kill token), or `drain_deadline` after a reload changed or removed
    /// the route. One token per route, so a connection waits on a single small future.
    pub end: CancellationToken,
}

impl Route {
    pub fn source_allowed(&self, ip: IpAddr) -> bool {
        self.allowed_sources.is_empty() || self.allowed_sources.iter().any(|c| c.contains(ip))
    }

    /// Mark the route as changed/removed; its live connections end after `deadline` if given,
    /// otherwise they run until they close by themselves.
    pub fn retire(&self, deadline: Option<Duration>) {
        if let Some(d) = deadline {
            let end = self.end.clone();
            tokio::spawn(async move {
                tokio::select! {
                    _ = tokio::time::sleep(d) => end.cancel(),
                    _ = end.cancelled() => {}
                }
            });
        }
    }
}

/// A CONNECT route's condition.
struct ConnectRule {
    header: Option<String>,
    values: Vec<String>,
    regex: Option<Regex>,
    authority: Vec<String>,
    route: usize,
}

/// What a CONNECT request offers for matching.
pub struct ConnectQuery<'a> {
    pub authority: &'a str,
    pub header: &'a dyn Fn(&str) -> Option<&'a [u8]>,
}

pub struct Table {
    pub cfg: ListenerCfg,
    pub routes: Vec<Arc<Route>>,
    exact: FastMap<Arc<str>, usize>,
    wildcard: FastMap<Arc<str>, usize>,
    dest_exact: FastMap<(IpAddr, u16), usize>,
    /// Prefix (or port-less) destinations, most specific first.
    dest_prefix: Vec<(CidrPort, usize)>,
    connect: Vec<ConnectRule>,
    default: Option<usize>,
}

impl Table {
    /// Compile a listener's routes: its own, then `extra` (from route files). `reuse` returns the
    /// running route of the same name when its config is unchanged, so reloads keep upstream
    /// state and never disturb such routes.
    pub fn build(
        cfg: &ListenerCfg,
        extra: &[&Arc<RouteCfg>],
        mut reuse: impl FnMut(&Arc<RouteCfg>) -> Option<Arc<Route>>,
        mut new_route: impl FnMut(&Arc<RouteCfg>) -> Arc<Route>,
    ) -> Self {
        let own: Vec<Arc<RouteCfg>> = cfg.routes.iter().map(|r| Arc::new(r.clone())).collect();
        let mut t = Table {
            cfg: cfg.clone(),
            routes: Vec::with_capacity(cfg.routes.len() + extra.len()),
            exact: fast_map(cfg.routes.len() + extra.len()),
            wildcard: fast_map(0),
            dest_exact: fast_map(0),
            dest_prefix: Vec::new(),
            connect: Vec::new(),
            default: None,
        };
        for (i, r) in own.iter().chain(extra.iter().copied()).enumerate() {
            let route = reuse(r).unwrap_or_else(|| new_route(r));
            for k in &route.exact_keys {
                t.exact.insert(k.clone(), i);
            }
            for k in &route.wildcard_keys {
                t.wildcard.insert(k.clone(), i);
            }
            t.routes.push(route);
            for d in &r.destination {
                let full = d.net.prefix_len() == if d.net.0.addr().is_ipv4() { 32 } else { 128 };
                match (full, d.port) {
                    (true, Some(p)) => {
                        t.dest_exact.insert((d.net.0.addr(), p), i);
                    }
                    _ => t.dest_prefix.push((*d, i)),
                }
            }
            if let Some(c) = &r.connect {
                t.connect.push(ConnectRule {
                    header: c.header.clone(),
                    values: c.values.clone(),
                    regex: c.regex.as_ref().and_then(|re| Regex::new(&format!("^(?:{re})$")).ok()),
                    authority: c.authority.iter().map(|a| a.to_ascii_lowercase()).collect(),
                    route: i,
                });
            }
            if cfg.default_route.as_deref() == Some(r.name.as_str()) {
                t.default = Some(i);
            }
        }
        // Longest prefix first; among equal prefixes a port-specific entry first.
        t.dest_prefix.sort_by_key(|(c, _)| (std::cmp::Reverse(c.net.prefix_len()), c.port.is_none()));
        t
    }

    pub fn proxy_mode(&self) -> ProxyProtocolMode {
        self.cfg.proxy_protocol
    }

    pub fn trusted(&self, ip: IpAddr) -> bool {
        self.cfg.trusted_proxies.iter().any(|c| c.contains(ip))
    }

    pub fn connect_unmatched(&self) -> ConnectUnmatched {
        self.cfg.connect_unmatched
    }

    pub fn default_route(&self) -> Option<&Arc<Route>> {
        self.default.map(|i| &self.routes[i])
    }

    /// The header names CONNECT routes look at (to name the offered value in a 403).
    pub fn connect_headers(&self) -> impl Iterator<Item = &str> {
        self.connect.iter().filter_map(|r| r.header.as_deref())
    }

    /// Route by SNI: exact name, then the one-label wildcard, then nothing (caller decides on
    /// the default route). `sni` is already lower-case without a trailing dot.
    pub fn by_sni(&self, sni: &str) -> Option<&Arc<Route>> {
        if let Some(&i) = self.exact.get(sni) {
            return Some(&self.routes[i]);
        }
        let (_, parent) = sni.split_once('.')?;
        self.wildcard.get(parent).map(|&i| &self.routes[i])
    }

    pub fn by_destination(&self, dst: SocketAddr) -> Option<&Arc<Route>> {
        let ip = seedgate_config::canonical(dst.ip());
        if let Some(&i) = self.dest_exact.get(&(ip, dst.port())) {
            return Some(&self.routes[i]);
        }
        self.dest_prefix.iter().find(|(c, _)| c.matches_ip_port(ip, dst.port())).map(|&(_, i)| &self.routes[i])
    }

    /// First CONNECT rule (in config order) whose every given condition holds.
    pub fn by_connect(&self, q: &ConnectQuery<'_>) -> Option<&Arc<Route>> {
        let authority = q.authority.to_ascii_lowercase();
        self.connect
            .iter()
            .find(|rule| {
                if !rule.authority.is_empty() && !rule.authority.contains(&authority) {
                    return false;
                }
                match &rule.header {
                    None => true,
                    Some(h) => match (q.header)(h).and_then(|v| std::str::from_utf8(v).ok()) {
                        None => false,
                        Some(v) => {
                            let v = v.trim();
                            rule.values.iter().any(|x| x == v) || rule.regex.as_ref().is_some_and(|re| re.is_match(v))
                        }
                    },
                }
            })
            .map(|rule| &self.routes[rule.route])
    }
}

/// Build a fresh route object (new upstream state). `kill` is the shutdown kill token.
pub fn new_route(cfg: &Arc<RouteCfg>, meters: RouteMeters, kill: &CancellationToken) -> Arc<Route> {
    let (mut exact_keys, mut wildcard_keys) = (Vec::new(), Vec::new());
    // Validation guarantees the patterns are valid; skip defensively otherwise.
    for n in cfg.sni.iter().filter_map(|s| normalize_sni_pattern(s)) {
        match n.strip_prefix("*.") {
            Some(suffix) => wildcard_keys.push(Arc::from(suffix)),
            None => exact_keys.push(Arc::from(n)),
        }
    }
    Arc::new(Route {
        exact_keys,
        wildcard_keys,
        name: Arc::from(cfg.name.as_str()),
        cfg: cfg.clone(),
        upstreams: cfg.upstreams.iter().map(|u| Arc::new(Upstream::new(u.clone()))).collect(),
        balance: cfg.balance,
        send_proxy: cfg.send_proxy_protocol,
        allowed_sources: cfg.allowed_sources.clone(),
        meters,
        end: kill.child_token(),
    })
}
