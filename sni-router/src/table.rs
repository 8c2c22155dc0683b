//! The compiled routing table of one listener: SNI (exact, then `*.` wildcard), PROXY destination and CONNECT matches.

use crate::upstream::Upstream;
use proxy_core::net::share::{Shares, Tenant};
use proxy_core::obs::minutes::PerMinute;
use proxy_core::prometheus::{Histogram, IntCounter};
use regex::Regex;
use seedgate_config::router::{
    Balance, ConnectUnmatched, Listener as ListenerCfg, ProxyProtocolMode, Route as RouteCfg, SendProxy,
    normalize_sni_pattern,
};
use seedgate_config::{CidrPort, IpCidr};
use std::collections::HashMap;
use std::hash::Hash;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The maps of a table and of a rebuild: a fast hasher, since a 10,000-route rebuild hashes every
/// key. Its seed is random per process; clients only look keys up, they cannot insert any.
pub(crate) type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

pub(crate) fn fast_map<K: Hash + Eq, V>(capacity: usize) -> FastMap<K, V> {
    FastMap::with_capacity_and_hasher(capacity, foldhash::fast::RandomState::default())
}

/// Pre-resolved counters of one route, so the hot path does no label lookups.
pub(crate) struct RouteMeters {
    pub ok: IntCounter,
    pub to_upstream: IntCounter,
    pub to_client: IntCounter,
    /// `seedgate_upstream_connect_duration_seconds` of the route, resolved at its first connect
    /// (so a route that never connects exports no series).
    pub connect_seconds: OnceLock<Histogram>,
}

/// One route as the data plane uses it. Shared by every connection it carries; a reload that
/// leaves the route unchanged keeps the same object (and its upstream state).
pub(crate) struct Route {
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
    /// The route's counts against its share of the process limits, found on first use (so a
    /// reload that builds 10,000 routes does no work for them): the same counts for every
    /// object of this route name on this listener.
    tenant: OnceLock<Arc<Tenant>>,
    /// Its connections of the last minutes (the status page's): [`ROUTED`] and
    /// [`UPSTREAM_FAILED`] per minute.
    pub minutes: PerMinute<2>,
    /// When this route object was made: at start, or by the reload that changed the route.
    pub since: Instant,
}

/// A connection routed and handed to its upstream, in [`Route::minutes`].
pub(crate) const ROUTED: usize = 0;
/// A failed upstream connect attempt, in [`Route::minutes`].
pub(crate) const UPSTREAM_FAILED: usize = 1;

impl Route {
    /// The route's counts of routed and pending connections, shared with earlier objects of the
    /// same route (a reload that changed it), so its share holds across reloads.
    pub(crate) fn tenant(&self, shares: &Shares, listener: &str) -> &Arc<Tenant> {
        self.tenant.get_or_init(|| shares.tenant(&[listener, &self.name]))
    }

    pub(crate) fn source_allowed(&self, ip: IpAddr) -> bool {
        self.allowed_sources.is_empty() || self.allowed_sources.iter().any(|c| c.contains(ip))
    }

    /// Mark the route as changed/removed; its live connections end after `deadline` if given,
    /// otherwise they run until they close by themselves.
    pub(crate) fn retire(&self, deadline: Option<Duration>) {
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
#[derive(Clone)]
struct ConnectRule {
    header: Option<String>,
    values: Vec<String>,
    regex: Option<Regex>,
    authority: Vec<String>,
    route: Arc<Route>,
}

/// What a CONNECT request offers for matching.
pub(crate) struct ConnectQuery<'a> {
    pub authority: &'a str,
    pub header: &'a dyn Fn(&str) -> Option<&'a [u8]>,
}

/// Lookups give the route object itself (not an index), so a table can be patched — one shoot's
/// file changed — without renumbering the rest.
#[derive(Clone)]
pub(crate) struct Table {
    pub cfg: ListenerCfg,
    /// Every route: the listener's own, then file routes (a patch appends).
    pub routes: Vec<Arc<Route>>,
    /// When this table was built or patched (the listener's last reload).
    pub built: Instant,
    by_name: FastMap<Arc<str>, Arc<Route>>,
    exact: FastMap<Arc<str>, Arc<Route>>,
    wildcard: FastMap<Arc<str>, Arc<Route>>,
    dest_exact: FastMap<(IpAddr, u16), Arc<Route>>,
    /// Prefix (or port-less) destinations, most specific first.
    dest_prefix: Vec<(CidrPort, Arc<Route>)>,
    connect: Vec<ConnectRule>,
    default: Option<Arc<Route>>,
}

/// A destination that is one address and port (a map key), not a prefix or port-less match.
fn exact_destination(d: &CidrPort) -> Option<(IpAddr, u16)> {
    let full = d.net.prefix_len() == if d.net.0.addr().is_ipv4() { 32 } else { 128 };
    d.port.filter(|_| full).map(|p| (d.net.0.addr(), p))
}

/// Whether a route's place among the others matters (CONNECT rules match first-listed first;
/// destination prefixes are sorted): such a route is not patched in or out.
fn ordered(r: &RouteCfg) -> bool {
    r.connect.is_some() || r.destination.iter().any(|d| exact_destination(d).is_none())
}

/// The file routes of one listener that one update of the route directory changed.
#[derive(Default)]
pub(crate) struct FileChange {
    /// Configs that are no longer in force (of changed or removed files).
    pub gone: Vec<Arc<RouteCfg>>,
    /// Configs newly in force.
    pub added: Vec<Arc<RouteCfg>>,
}

impl Table {
    /// Compile a listener's routes: its own, then `extra` (from route files). `reuse` returns the
    /// running route of the same name when its config is unchanged, so reloads keep upstream
    /// state and never disturb such routes.
    pub(crate) fn build(
        cfg: &ListenerCfg,
        extra: &[&Arc<RouteCfg>],
        mut reuse: impl FnMut(&Arc<RouteCfg>) -> Option<Arc<Route>>,
        mut new_route: impl FnMut(&Arc<RouteCfg>) -> Arc<Route>,
    ) -> Self {
        let own: Vec<Arc<RouteCfg>> = cfg.routes.iter().map(|r| Arc::new(r.clone())).collect();
        let n = cfg.routes.len() + extra.len();
        let mut t = Table {
            cfg: cfg.clone(),
            routes: Vec::with_capacity(n),
            built: Instant::now(),
            by_name: fast_map(n),
            exact: fast_map(n),
            wildcard: fast_map(0),
            dest_exact: fast_map(0),
            dest_prefix: Vec::new(),
            connect: Vec::new(),
            default: None,
        };
        for r in own.iter().chain(extra.iter().copied()) {
            let route = reuse(r).unwrap_or_else(|| new_route(r));
            t.index(&route);
            for d in r.destination.iter().filter(|d| exact_destination(d).is_none()) {
                t.dest_prefix.push((*d, route.clone()));
            }
            if let Some(c) = &r.connect {
                t.connect.push(ConnectRule {
                    header: c.header.clone(),
                    values: c.values.clone(),
                    regex: c.regex.as_ref().and_then(|re| Regex::new(&format!("^(?:{re})$")).ok()),
                    authority: c.authority.iter().map(|a| a.to_ascii_lowercase()).collect(),
                    route: route.clone(),
                });
            }
            if cfg.default_route.as_deref() == Some(r.name.as_str()) {
                t.default = Some(route.clone());
            }
            t.routes.push(route);
        }
        // Longest prefix first; among equal prefixes a port-specific entry first.
        t.dest_prefix.sort_by_key(|(c, _)| (std::cmp::Reverse(c.net.prefix_len()), c.port.is_none()));
        t
    }

    /// Enter a route in the maps keyed by name, SNI and exact destination.
    fn index(&mut self, route: &Arc<Route>) {
        self.by_name.insert(route.name.clone(), route.clone());
        for k in &route.exact_keys {
            self.exact.insert(k.clone(), route.clone());
        }
        for k in &route.wildcard_keys {
            self.wildcard.insert(k.clone(), route.clone());
        }
        for key in route.cfg.destination.iter().filter_map(exact_destination) {
            self.dest_exact.insert(key, route.clone());
        }
    }

    /// Take a route out of those maps (only where it is the one entered).
    fn unindex(&mut self, route: &Arc<Route>) {
        fn out<K: Hash + Eq>(m: &mut FastMap<K, Arc<Route>>, k: &K, route: &Arc<Route>) {
            if m.get(k).is_some_and(|r| Arc::ptr_eq(r, route)) {
                m.remove(k);
            }
        }
        out(&mut self.by_name, &route.name, route);
        for k in &route.exact_keys {
            out(&mut self.exact, k, route);
        }
        for k in &route.wildcard_keys {
            out(&mut self.wildcard, k, route);
        }
        for key in route.cfg.destination.iter().filter_map(exact_destination) {
            out(&mut self.dest_exact, &key, route);
        }
    }

    /// This table with one update of the route files applied in place of a rebuild: the work is
    /// a copy of the maps plus the changed routes, not a pass over every route's config. Returns
    /// the new table and the routes it no longer carries; `None` when a changed route's place
    /// matters (CONNECT rules, destination prefixes), so the caller rebuilds in full.
    pub(crate) fn patch(
        &self,
        change: &FileChange,
        mut new_route: impl FnMut(&Arc<RouteCfg>) -> Arc<Route>,
    ) -> Option<(Table, Vec<Arc<Route>>)> {
        if change.gone.iter().chain(&change.added).any(|r| ordered(r)) {
            return None;
        }
        let mut added: FastMap<&str, &Arc<RouteCfg>> = fast_map(change.added.len());
        added.extend(change.added.iter().map(|r| (r.name.as_str(), r)));
        let mut t = self.clone();
        t.built = Instant::now();
        let mut retired = Vec::new();
        for g in &change.gone {
            let Some(old) = t.by_name.get(g.name.as_str()).cloned() else { continue };
            // A file rewritten with this route unchanged: the running route stays as it is.
            if added.get(g.name.as_str()).is_some_and(|a| ***a == *old.cfg) {
                added.remove(g.name.as_str());
                continue;
            }
            t.unindex(&old);
            retired.push(old);
        }
        if !retired.is_empty() {
            let out: std::collections::HashSet<*const Route> = retired.iter().map(Arc::as_ptr).collect();
            t.routes.retain(|r| !out.contains(&Arc::as_ptr(r)));
        }
        // In the order of the change (file, then route order), for a stable `routes` listing.
        for a in change.added.iter().filter(|a| added.contains_key(a.name.as_str())) {
            let route = new_route(a);
            t.index(&route);
            t.routes.push(route);
        }
        Some((t, retired))
    }

    pub(crate) fn route_named(&self, name: &str) -> Option<&Arc<Route>> {
        self.by_name.get(name)
    }

    pub(crate) fn proxy_mode(&self) -> ProxyProtocolMode {
        self.cfg.proxy_protocol
    }

    pub(crate) fn trusted(&self, ip: IpAddr) -> bool {
        self.cfg.trusted_proxies.iter().any(|c| c.contains(ip))
    }

    pub(crate) fn connect_unmatched(&self) -> ConnectUnmatched {
        self.cfg.connect_unmatched
    }

    pub(crate) fn default_route(&self) -> Option<&Arc<Route>> {
        self.default.as_ref()
    }

    /// The header names CONNECT routes look at (to name the offered value in a 403).
    pub(crate) fn connect_headers(&self) -> impl Iterator<Item = &str> {
        self.connect.iter().filter_map(|r| r.header.as_deref())
    }

    /// Route by SNI: exact name, then the one-label wildcard, then nothing (caller decides on
    /// the default route). `sni` is already lower-case without a trailing dot.
    pub(crate) fn by_sni(&self, sni: &str) -> Option<&Arc<Route>> {
        if let Some(r) = self.exact.get(sni) {
            return Some(r);
        }
        let (_, parent) = sni.split_once('.')?;
        self.wildcard.get(parent)
    }

    pub(crate) fn by_destination(&self, dst: SocketAddr) -> Option<&Arc<Route>> {
        let ip = seedgate_config::canonical(dst.ip());
        if let Some(r) = self.dest_exact.get(&(ip, dst.port())) {
            return Some(r);
        }
        self.dest_prefix.iter().find(|(c, _)| c.matches_ip_port(ip, dst.port())).map(|(_, r)| r)
    }

    /// First CONNECT rule (in config order) whose every given condition holds.
    pub(crate) fn by_connect(&self, q: &ConnectQuery<'_>) -> Option<&Arc<Route>> {
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
            .map(|rule| &rule.route)
    }
}

/// Build a fresh route object (new upstream state). `kill` is the shutdown kill token.
pub(crate) fn new_route(cfg: &Arc<RouteCfg>, meters: RouteMeters, kill: &CancellationToken) -> Arc<Route> {
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
        tenant: OnceLock::new(),
        minutes: PerMinute::default(),
        since: Instant::now(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proxy_core::prometheus::IntCounter;
    use seedgate_config::router::parse_route_file;

    fn cfgs(text: &str) -> Vec<Arc<RouteCfg>> {
        parse_route_file(text, "t.yaml").expect("valid").into_iter().map(Arc::new).collect()
    }

    fn route(text: &str) -> Arc<RouteCfg> {
        cfgs(&format!("routes:\n{text}")).remove(0)
    }

    fn fresh(rc: &Arc<RouteCfg>) -> Arc<Route> {
        let c = || IntCounter::new("c", "c").expect("counter");
        new_route(
            rc,
            RouteMeters { ok: c(), to_upstream: c(), to_client: c(), connect_seconds: OnceLock::new() },
            &CancellationToken::new(),
        )
    }

    fn listener() -> ListenerCfg {
        let cfg = seedgate_config::router::parse("listeners:\n  - name: gateway\n    listen: 127.0.0.1:0\n", "m.yaml");
        cfg.expect("valid").listeners.remove(0)
    }

    fn sni(t: &Table, name: &str) -> Option<String> {
        t.by_sni(name).map(|r| r.name.to_string())
    }

    /// Patching one file's change gives the lookups a full rebuild gives, keeps unchanged routes
    /// as the same objects, and returns exactly the routes it dropped.
    #[test]
    fn a_patch_is_a_rebuild_of_the_changed_routes_only() {
        let a = route("  - { listener: gateway, name: a, sni: [a.example], upstreams: [127.0.0.1:1] }");
        let b = route("  - { listener: gateway, name: b, sni: ['*.b.example'], upstreams: [127.0.0.1:1] }");
        let c = route(
            "  - { listener: gateway, name: c, sni: [c.example], destination: [10.0.0.3:443], upstreams: [127.0.0.1:1] }",
        );
        let l = listener();
        let t = Table::build(&l, &[&a, &b, &c], |_| None, fresh);
        assert_eq!(sni(&t, "x.b.example").as_deref(), Some("b"));
        // b changes its SNI, c goes away, d arrives; a is rewritten unchanged (a new allocation).
        let a2 = route("  - { listener: gateway, name: a, sni: [a.example], upstreams: [127.0.0.1:1] }");
        let b2 = route("  - { listener: gateway, name: b, sni: [b2.example], upstreams: [127.0.0.1:1] }");
        let d = route("  - { listener: gateway, name: d, sni: [d.example], upstreams: [127.0.0.1:1] }");
        let change =
            FileChange { gone: vec![a.clone(), b.clone(), c.clone()], added: vec![a2.clone(), b2.clone(), d.clone()] };
        let (p, retired) = t.patch(&change, fresh).expect("no ordered routes");
        let full = Table::build(&l, &[&a2, &b2, &d], |_| None, fresh);
        for name in ["a.example", "x.b.example", "b2.example", "c.example", "d.example", "z.example"] {
            assert_eq!(sni(&p, name), sni(&full, name), "{name}");
        }
        assert_eq!(p.by_destination("10.0.0.3:443".parse().unwrap()).map(|r| r.name.to_string()), None);
        let mut gone: Vec<&str> = retired.iter().map(|r| &*r.name).collect();
        gone.sort_unstable();
        assert_eq!(gone, ["b", "c"]);
        assert!(Arc::ptr_eq(p.route_named("a").unwrap(), t.route_named("a").unwrap()), "unchanged route kept");
        assert_eq!(p.routes.len(), 3);
        // The table patched from is untouched (connections that loaded it keep it).
        assert_eq!(sni(&t, "c.example").as_deref(), Some("c"));
    }

    #[test]
    fn routes_whose_order_matters_are_rebuilt_not_patched() {
        let t = Table::build(&listener(), &[], |_| None, fresh);
        let connect =
            route("  - { listener: gateway, name: k, connect: { authority: ['k:443'] }, upstreams: [127.0.0.1:1] }");
        let prefix = route("  - { listener: gateway, name: p, destination: [10.0.0.0/8], upstreams: [127.0.0.1:1] }");
        for r in [connect, prefix] {
            assert!(t.patch(&FileChange { gone: vec![], added: vec![r.clone()] }, fresh).is_none());
            assert!(t.patch(&FileChange { gone: vec![r], added: vec![] }, fresh).is_none());
        }
    }
}
