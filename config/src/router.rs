//! The sni-router config: listeners, their routes (by SNI, PROXY destination or CONNECT header) and limits.

use crate::common::{
    AdminConfig, CidrPort, Dur, HostPort, IpCidr, Located, config_file, default_fn, limits_with_pending_budget,
    null_is_default, pending_budget_of, timeouts_with_pending_budget, valid_header_name, validate_pending_budget,
};
use crate::error::{ConfigError, Problems};
use serde::{Deserialize, Serialize};
use std::borrow::Borrow;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// One maximal TLS record as it is on the wire: 5-byte record header plus 2^14 bytes of payload.
/// `limits.client_hello_max` counts wire bytes (record headers included), since that is what the
/// router buffers and replays, so this is the smallest cap that takes every single-record hello.
pub const CLIENT_HELLO_ONE_RECORD: usize = 5 + 16 * 1024;

default_fn! {
    admin_default: AdminConfig = AdminConfig::on(9901);
    drain_grace_default: Dur = Dur::secs(30);
    connect_default: Dur = Dur::secs(5);
    idle_default: Dur = Dur::secs(3600);
    max_connections_default: usize = 10_000;
    client_hello_max_default: usize = CLIENT_HELLO_ONE_RECORD;
    connect_head_max_default: usize = 8 * 1024;
    proxy_depth_default: u8 = 2;
    eject_default: Dur = Dur::secs(10);
    udp_idle_default: Dur = Dur::secs(30);
    udp_flows_default: usize = 10_000;
    udp_socket_buffer_default: usize = 4 * 1024 * 1024;
    tenant_share_default: f64 = 0.25;
}

config_file! {
    /// The whole sni-router config file.
    #[derive(Debug, Clone, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub struct RouterConfig {
        /// The admin listener (`/metrics`, `/healthz`, `/readyz`, `/config`, the status page `/`
        /// and `/status`); absent or `null`: `{ listen: 127.0.0.1:9901 }`. There is no
        /// `/control/` endpoint on sni-router yet, so `token_file` guards only the status page,
        /// with `status_requires_token`.
        pub admin,
        /// Deadlines of each phase of a connection; absent or `null`: every default.
        pub timeouts,
        /// After SIGTERM: how long live connections may continue before the process exits (the
        /// grace in force at SIGTERM counts).
        pub drain_grace,
        /// Bounds of what the process holds; absent or `null`: every default.
        pub limits (reload = "new connections"),
        /// How long an upstream that refused or timed out a connect is skipped (tried last); after a
        /// refused connect at most 1s, so a restarted upstream is back within a second.
        #[serde(default = "eject_default")]
        #[schemars(extend("x-reload" = "new connections"))]
        pub upstream_eject: Dur,
        /// A directory of route files (`*.yaml`, one per shoot), watched and merged with the
        /// listeners' own routes; `null` (the default): none. Relative to the working directory.
        #[serde(default)]
        #[schemars(extend("x-reload" = "restart"))]
        pub routes_dir: Option<String>,
        /// The listening sockets and their routes; at least one. A reload adds, removes and moves
        /// listeners (new sockets are bound first; removed or moved ones stop accepting, their
        /// connections continue).
        #[schemars(length(min = 1), extend("x-reload" = "live"))]
        pub listeners: Vec<Listener>,
    }
}

timeouts_with_pending_budget! {
    /// Deadlines of each phase of a connection (and of a UDP flow).
    pub struct Timeouts {
        /// The whole pre-routing phase: PROXY header(s), ClientHello or CONNECT head. Also how long
        /// a UDP flow may wait for its ClientHello.
        pub handshake,
        /// What `handshake` shrinks to for a connection accepted while the pending budget is full
        /// (linearly from half full). At or above `handshake`: no shrinking.
        pub handshake_floor,
        /// One upstream TCP connect attempt; on timeout the next upstream is tried.
        #[serde(default = "connect_default")]
        pub connect: Dur,
        /// A proxied connection with no byte in either direction for this long is closed.
        #[serde(default = "idle_default")]
        pub idle: Dur,
        /// A UDP flow (QUIC routed by SNI) with no datagram in either direction for this long is
        /// forgotten; the client's next datagram must then be a new Initial. A flow whose client
        /// has sent nothing for a third of this no longer counts for balancing (UDP shows no
        /// end of a QUIC session, and a live one sends at least every keep-alive interval); its
        /// client's next datagram counts it again. Keep it above three times the clients' QUIC
        /// keep-alive interval.
        #[serde(default = "udp_idle_default")]
        pub udp_idle: Dur,
    }
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            handshake: handshake_default(),
            handshake_floor: handshake_floor_default(),
            connect: connect_default(),
            idle: idle_default(),
            udp_idle: udp_idle_default(),
        }
    }
}

limits_with_pending_budget! {
    /// Bounds of what the process holds.
    pub struct Limits {
        /// Routed (established) connections held at once by the whole process; accepting pauses at
        /// the limit. Connections still being routed count in `max_pending` instead. A reload
        /// resizes it at once (slots grow at once, shrink as connections end).
        pub max_connections,
        /// Connections accepted and not yet routed; when full, the oldest of them is closed to make
        /// room for a new one.
        pub max_pending,
        /// One source's share of a full budget of not-yet-routed connections (source: the TCP peer
        /// address masked by `source_prefix_v4` / `source_prefix_v6`); the share is half the budget
        /// while at most half of it is in use and shrinks linearly to this when it is full. More are
        /// closed at once. 0: no per-source cap. Peers in a listener's `trusted_proxies` are exempt
        /// (all their clients share their address).
        pub pending_per_source = 64,
        /// Largest ClientHello the router buffers, in bytes on the wire: all the records carrying it,
        /// their 5-byte headers included. The default takes one maximal record (5-byte header plus
        /// 16 KiB). Larger: TLS alert `decode_error`.
        #[serde(default = "client_hello_max_default", deserialize_with = "crate::size::de")]
        #[schemars(schema_with = "crate::schema::size::<512, 262144>")]
        pub client_hello_max: usize,
        /// Largest HTTP CONNECT request head, in bytes. Larger: `431`.
        #[serde(default = "connect_head_max_default", deserialize_with = "crate::size::de")]
        #[schemars(schema_with = "crate::schema::size::<256, 65536>")]
        pub connect_head_max: usize,
        /// How many stacked PROXY headers one connection may carry (load balancer + node proxy).
        #[serde(default = "proxy_depth_default")]
        #[schemars(range(min = 1, max = 4))]
        pub proxy_protocol_depth: u8,
        /// UDP flows (one per client address) the whole process holds, routed or still waiting for
        /// their ClientHello; when full, Initials of new clients are dropped (and counted). For
        /// agents' QUIC sessions: at least twice agents × replicas, since the flow of a session that
        /// ended (a duplicate closed, a replica restarted) stays until `timeouts.udp_idle`. Each
        /// flow holds a socket: keep the process's open-file limit above it.
        #[serde(default = "udp_flows_default")]
        #[schemars(range(min = 1, max = 1000000))]
        pub udp_flows: usize,
        /// SO_RCVBUF / SO_SNDBUF asked for each UDP listener socket, in bytes (each flow's upstream
        /// socket asks for a sixteenth of it, at least 64 KiB); the kernel may grant less
        /// (`net.core.rmem_max`), which is logged.
        #[serde(default = "udp_socket_buffer_default", deserialize_with = "crate::size::de")]
        #[schemars(schema_with = "crate::schema::size::<65536, 268435456>")]
        pub udp_socket_buffer: usize,
        /// The default share of each route, as a fraction of `max_connections` (its routed
        /// connections) and of `max_pending` (its connections waiting for an upstream connect), for
        /// routes without their own `limits`. A route may hold up to half of the process limit while
        /// at most half of it is in use; the share tightens linearly to this fraction as it fills.
        #[serde(default = "tenant_share_default")]
        pub tenant_share: f64,
    }
}
pending_budget_of!(RouterConfig);

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: max_connections_default(),
            max_pending: max_pending_default(),
            pending_per_source: pending_per_source_default(),
            source_prefix_v4: source_prefix_v4_default(),
            source_prefix_v6: source_prefix_v6_default(),
            client_hello_max: client_hello_max_default(),
            connect_head_max: connect_head_max_default(),
            proxy_protocol_depth: proxy_depth_default(),
            udp_flows: udp_flows_default(),
            udp_socket_buffer: udp_socket_buffer_default(),
            tenant_share: tenant_share_default(),
        }
    }
}

/// Whether a listener reads PROXY protocol headers (v1 or v2) before the payload.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ProxyProtocolMode {
    #[default]
    Off,
    Optional,
    Required,
}

/// Which PROXY protocol header a route sends its upstream, if any.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SendProxy {
    #[default]
    Off,
    V1,
    V2,
}

/// How a route picks one of its upstreams.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Balance {
    /// Two upstreams picked at random, the one with fewer active connections wins.
    #[default]
    PowerOfTwo,
    /// The upstream with the fewest active connections (ties: the first listed).
    LeastConnections,
}

/// The answer to a CONNECT that matches no route.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ConnectUnmatched {
    /// `403 Forbidden` with a one-line reason.
    #[default]
    Forbidden,
    /// Gardener-compatible `301` to `https://<authority host>:443`.
    Redirect,
}

/// What a listener accepts.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Hash, Default, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ListenerProtocol {
    /// TLS (routed by SNI), PROXY protocol, HTTP CONNECT.
    #[default]
    Tcp,
    /// QUIC, routed by the SNI of the ClientHello in the client's Initial packets.
    Udp,
}

/// One listening socket (TCP, or UDP for QUIC) and its routes.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("x-reload" = "new connections"))]
pub struct Listener {
    /// The listener's name: unique, a word without spaces; the metric label `listener`.
    #[schemars(extend("x-reload" = "live"))]
    pub name: Located<String>,
    /// Where to listen. A reload that changes it moves the listener (the new socket is bound
    /// first; if that fails, nothing changes).
    #[schemars(extend("x-reload" = "live"))]
    pub listen: HostPort,
    /// `tcp` (the default): TLS routed by SNI, PROXY protocol, HTTP CONNECT. `udp`: QUIC routed
    /// by SNI (SNI and default routes only). A `tcp` and a `udp` listener may share a port.
    #[serde(default, deserialize_with = "null_is_default")]
    #[schemars(with = "Option<ListenerProtocol>", extend("x-reload" = "live"))]
    pub protocol: ListenerProtocol,
    /// Whether PROXY headers are read: `off`, `optional` or `required` (then `trusted_proxies`
    /// is required).
    #[serde(default, deserialize_with = "null_is_default")]
    #[schemars(with = "Option<ProxyProtocolMode>")]
    pub proxy_protocol: ProxyProtocolMode,
    /// Peers allowed to send PROXY headers (CIDRs on the TCP peer address); a header from
    /// anyone else is rejected. Required when `proxy_protocol` is on.
    #[serde(default, deserialize_with = "null_is_default")]
    #[schemars(with = "Option<Vec<IpCidr>>")]
    pub trusted_proxies: Vec<IpCidr>,
    /// Route for connections nothing else matched (never used for a CONNECT); `null` rejects
    /// them. Must name a route of this listener in the main config.
    #[serde(default)]
    pub default_route: Option<String>,
    /// Answer to a CONNECT that matches no route: `forbidden` (`403` with a one-line reason) or
    /// `redirect` (`301` to `https://<authority host>:443`).
    #[serde(default, deserialize_with = "null_is_default")]
    #[schemars(with = "Option<ConnectUnmatched>")]
    pub connect_unmatched: ConnectUnmatched,
    /// Per-listener cap of routed connections, below the process-wide
    /// `limits.max_connections`; `null`: none. Not on a `udp` listener (see `limits.udp_flows`).
    #[serde(default)]
    #[schemars(range(min = 1), extend("x-reload" = "live"))]
    pub max_connections: Option<usize>,
    /// The routes. A connection keeps the route it was given; one of a changed or removed
    /// route ends by the route's `drain_deadline` if set (a clean FIN), else runs on.
    #[serde(default, deserialize_with = "null_is_default")]
    #[schemars(with = "Option<Vec<Route>>")]
    pub routes: Vec<Route>,
}

/// One route: what it matches (SNI, PROXY destination or CONNECT request) and where it goes.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("x-reload" = "new connections"))]
pub struct Route {
    /// The route's name: unique in its listener (across the main config and every route file),
    /// a word without spaces; the metric label `route`.
    pub name: Located<String>,
    /// Only in a file of `routes_dir`: the listener this route belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listener: Option<Located<String>>,
    /// Exact names or `*.suffix` (one label), case-insensitive, trailing dot ignored. Exact
    /// names beat wildcards.
    #[serde(default, deserialize_with = "null_is_default")]
    #[schemars(with = "Option<Vec<String>>")]
    pub sni: Vec<String>,
    /// PROXY header destinations, `ip[/prefix][:port]`; longest prefix wins. Matched before
    /// the payload is read.
    #[serde(default, deserialize_with = "null_is_default")]
    #[schemars(with = "Option<Vec<CidrPort>>")]
    pub destination: Vec<CidrPort>,
    /// How a CONNECT request selects this route; `null`: it does not route CONNECTs.
    #[serde(default)]
    pub connect: Option<ConnectMatch>,
    /// Where the route's connections go, `host:port` each (names resolved on every connect);
    /// at least one. A connect that fails before any byte was forwarded is retried on the next.
    #[schemars(length(min = 1))]
    pub upstreams: Vec<HostPort>,
    /// How an upstream is picked: `power-of-two` (the default) or `least-connections`.
    #[serde(default, deserialize_with = "null_is_default")]
    #[schemars(with = "Option<Balance>")]
    pub balance: Balance,
    /// A PROXY header sent to the upstream first: `off` (the default), `v1` or `v2`. It carries
    /// the real client address and the original destination; v2 adds the TLVs AUTHORITY (the
    /// SNI) and UNIQUE_ID (the connection id).
    #[serde(default, deserialize_with = "null_is_default")]
    #[schemars(with = "Option<SendProxy>")]
    pub send_proxy_protocol: SendProxy,
    /// Real client addresses allowed to use this route (CIDRs on the real client address, the
    /// outer PROXY header's source when there is one); empty = any.
    #[serde(default, deserialize_with = "null_is_default")]
    #[schemars(with = "Option<Vec<IpCidr>>")]
    pub allowed_sources: Vec<IpCidr>,
    /// Live connections of this route end (a clean FIN both ways) this long after a reload
    /// changed or removed the route; `null` (the default) lets them run until they close by
    /// themselves. The deadline of the reloaded config applies.
    #[serde(default)]
    #[schemars(extend("x-reload" = "live"))]
    pub drain_deadline: Option<Dur>,
    /// This route's own share of the process limits; unset keys take the default share
    /// (`limits.tenant_share`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-reload" = "new connections"))]
    pub limits: Option<RouteLimits>,
}

/// One route's limits: hard caps, whatever else the process holds.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("x-reload" = "new connections"))]
pub struct RouteLimits {
    /// Routed connections of this route held at once (relaying or connecting upstream).
    #[serde(default)]
    pub max_connections: Option<usize>,
    /// Connections of this route routed and not relaying yet (waiting for their upstream
    /// connect), so an upstream that does not answer holds at most this many.
    #[serde(default)]
    pub max_pending: Option<usize>,
}

/// How a CONNECT request selects this route. Either `header` with `values` and/or `regex`, or
/// `authority` (the request target), or both (all given conditions must hold).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("x-reload" = "new connections"))]
pub struct ConnectMatch {
    /// The request header whose value selects the route, e.g. `X-Gardener-Destination`.
    #[schemars(regex(pattern = r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$"))]
    pub header: Option<String>,
    /// Header values (trimmed) that select the route.
    #[serde(default, deserialize_with = "null_is_default")]
    #[schemars(with = "Option<Vec<String>>")]
    pub values: Vec<String>,
    /// A regular expression the header value (trimmed) must match; anchored: it must match the
    /// whole value.
    pub regex: Option<String>,
    /// Request targets (`host:port`) that select the route.
    #[serde(default, deserialize_with = "null_is_default")]
    #[schemars(with = "Option<Vec<String>>")]
    pub authority: Vec<String>,
}

impl RouterConfig {
    /// Token files other than `admin.token_file`: none.
    pub fn token_files(&self) -> Vec<(String, String)> {
        Vec::new()
    }

    /// None: the router passes TLS through and holds no certificate.
    pub fn tls_files(&self) -> Vec<crate::common::TlsFiles> {
        Vec::new()
    }

    /// None: the router listens on TCP and UDP only.
    pub fn unix_sockets(&self) -> Vec<(String, String)> {
        Vec::new()
    }
}

/// Parse and validate an sni-router config.
pub fn parse(text: &str, file: &str) -> Result<RouterConfig, ConfigError> {
    crate::yaml::parse(text, file, validate)
}

/// Normalise an SNI pattern: lower case, no trailing dot. `None` if it is not a valid pattern.
pub fn normalize_sni_pattern(s: &str) -> Option<String> {
    let s = s.trim().trim_end_matches('.').to_ascii_lowercase();
    let body = s.strip_prefix("*.").unwrap_or(&s);
    let ok = !body.is_empty()
        && body.len() <= 253
        && body.split('.').all(|l| {
            !l.is_empty() && l.len() <= 63 && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    ok.then_some(s)
}

pub(crate) fn validate(cfg: &RouterConfig, p: &mut Problems) {
    if cfg.listeners.is_empty() {
        p.push("listeners", "at least one listener is required");
    }
    validate_limits(cfg, p);
    let mut listener_names = HashSet::new();
    let mut addrs = HashSet::new();
    for (li, l) in cfg.listeners.iter().enumerate() {
        let lf = format!("listeners[{li}]");
        if !listener_names.insert(l.name.value.clone()) {
            p.push(format!("{lf}.name"), format!("duplicate listener name {:?}", *l.name));
        }
        // Port 0 (the kernel picks one) never collides; TCP and UDP on one port do not either.
        if l.listen.port != 0 && !addrs.insert((l.protocol, l.listen.clone())) {
            p.push(format!("{lf}.listen"), format!("{} is used by another listener", l.listen));
        }
        validate_listener(l, &lf, p);
    }
    crate::common::validate_positive(
        &[
            ("timeouts.handshake", cfg.timeouts.handshake),
            ("timeouts.handshake_floor", cfg.timeouts.handshake_floor),
            ("timeouts.connect", cfg.timeouts.connect),
            ("timeouts.idle", cfg.timeouts.idle),
            ("timeouts.udp_idle", cfg.timeouts.udp_idle),
        ],
        p,
    );
}

fn validate_limits(cfg: &RouterConfig, p: &mut Problems) {
    let l = &cfg.limits;
    if l.max_connections == 0 {
        p.push("limits.max_connections", "must be at least 1");
    }
    validate_pending_budget(&cfg.pending_budget(), p);
    if l.client_hello_max < 512 || l.client_hello_max > 256 * 1024 {
        p.push(
            "limits.client_hello_max",
            "must be between 512 and 262144 bytes (256Ki; TLS records, headers included)",
        );
    }
    if l.connect_head_max < 256 || l.connect_head_max > 64 * 1024 {
        p.push("limits.connect_head_max", "must be between 256 and 65536 bytes (64Ki)");
    }
    if l.proxy_protocol_depth == 0 || l.proxy_protocol_depth > 4 {
        p.push("limits.proxy_protocol_depth", "must be between 1 and 4");
    }
    if l.udp_flows == 0 || l.udp_flows > 1_000_000 {
        p.push("limits.udp_flows", "must be between 1 and 1000000");
    }
    if l.udp_socket_buffer < 64 * 1024 || l.udp_socket_buffer > 256 * 1024 * 1024 {
        p.push("limits.udp_socket_buffer", "must be between 65536 and 268435456 bytes (64Ki and 256Mi)");
    }
    crate::common::validate_share(l.tenant_share, "limits.tenant_share", p);
}

/// What a route of a UDP listener may not have: it routes QUIC by SNI only. Each entry is the
/// offending key (relative to the route) and why.
fn udp_route_problems(r: &Route) -> Vec<(&'static str, &'static str)> {
    let mut out = Vec::new();
    if !r.destination.is_empty() {
        out.push(("destination", "a udp listener routes by SNI only (there is no PROXY header on QUIC)"));
    }
    if r.connect.is_some() {
        out.push(("connect", "a udp listener routes by SNI only (there is no CONNECT on QUIC)"));
    }
    if r.send_proxy_protocol != SendProxy::Off {
        out.push(("send_proxy_protocol", "a udp listener relays datagrams and cannot send PROXY headers"));
    }
    out
}

fn valid_name(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_graphic())
}

/// Names, SNI patterns and destinations already routed within one listener.
#[derive(Default)]
struct Seen {
    routes: HashSet<String>,
    snis: HashSet<String>,
    dests: HashSet<CidrPort>,
}

/// One listener (`lf` is its field path), its routes included.
fn validate_listener(l: &Listener, lf: &str, p: &mut Problems) {
    if !valid_name(&l.name) {
        p.push(format!("{lf}.name"), "must be a non-empty word without spaces");
    }
    if l.proxy_protocol != ProxyProtocolMode::Off && l.trusted_proxies.is_empty() {
        p.push(
            format!("{lf}.trusted_proxies"),
            "proxy_protocol is on but no peer is trusted to send it; list the load balancers' CIDRs",
        );
    }
    if l.max_connections == Some(0) {
        p.push(format!("{lf}.max_connections"), "must be at least 1");
    }
    if l.protocol == ListenerProtocol::Udp {
        if l.proxy_protocol != ProxyProtocolMode::Off || !l.trusted_proxies.is_empty() {
            p.push(format!("{lf}.proxy_protocol"), "a udp listener takes no PROXY protocol; set it off");
        }
        if l.max_connections.is_some() {
            p.push(format!("{lf}.max_connections"), "a udp listener has flows, not connections: see limits.udp_flows");
        }
        for (ri, r) in l.routes.iter().enumerate() {
            for (key, why) in udp_route_problems(r) {
                p.push(format!("{lf}.routes[{ri}].{key}"), why);
            }
        }
    }
    let mut seen = Seen::default();
    for (ri, r) in l.routes.iter().enumerate() {
        let is_default = l.default_route.as_deref() == Some(r.name.as_str());
        let rf = format!("{lf}.routes[{ri}]");
        if r.listener.is_some() {
            p.push(format!("{rf}.listener"), "only routes in the files of routes_dir name their listener");
        }
        validate_route(r, &rf, &l.name, is_default, &mut seen, p);
    }
    if let Some(d) = &l.default_route
        && !l.routes.iter().any(|r| r.name.as_str() == d)
    {
        p.push(format!("{lf}.default_route"), format!("no route named {d:?} in this listener"));
    }
}

/// One route (`rf` is its field path) of listener `listener`.
fn validate_route(r: &Route, rf: &str, listener: &str, is_default: bool, seen: &mut Seen, p: &mut Problems) {
    if !valid_name(&r.name) {
        p.push(format!("{rf}.name"), "must be a non-empty word without spaces");
    }
    if !seen.routes.insert(r.name.value.clone()) {
        p.push(format!("{rf}.name"), format!("duplicate route name {:?} in listener {listener:?}", *r.name));
    }
    if r.upstreams.is_empty() {
        p.push(format!("{rf}.upstreams"), "at least one upstream is required");
    }
    if r.sni.is_empty() && r.destination.is_empty() && r.connect.is_none() && !is_default {
        p.push(rf, "the route matches nothing: give sni, destination or connect (or make it the default_route)");
    }
    for (i, s) in r.sni.iter().enumerate() {
        match normalize_sni_pattern(s) {
            None => p.push(format!("{rf}.sni[{i}]"), format!("{s:?} is not a host name or *.suffix pattern")),
            Some(n) if !seen.snis.insert(n.clone()) => {
                p.push(format!("{rf}.sni[{i}]"), format!("{n:?} is routed by another route of this listener"))
            }
            Some(_) => {}
        }
    }
    for (i, d) in r.destination.iter().enumerate() {
        if !seen.dests.insert(*d) {
            p.push(format!("{rf}.destination[{i}]"), format!("{d} is routed by another route of this listener"));
        }
    }
    if let Some(c) = &r.connect {
        validate_connect(c, &format!("{rf}.connect"), p);
    }
    if let Some(d) = r.drain_deadline
        && d.get().is_zero()
    {
        p.push(format!("{rf}.drain_deadline"), "must be positive (or null for no deadline)");
    }
    if let Some(l) = &r.limits {
        let keys = [("max_connections", l.max_connections), ("max_pending", l.max_pending)];
        crate::common::validate_tenant_limits(&keys, &format!("{rf}.limits"), p);
    }
}

fn validate_connect(c: &ConnectMatch, cf: &str, p: &mut Problems) {
    match &c.header {
        Some(h) if !valid_header_name(h) => {
            p.push(format!("{cf}.header"), format!("{h:?} is not a valid HTTP header name"))
        }
        Some(_) if c.values.is_empty() && c.regex.is_none() => p.push(cf, "a header match needs values or regex"),
        None if !c.values.is_empty() || c.regex.is_some() => p.push(cf, "values/regex need a header name"),
        None if c.authority.is_empty() => p.push(cf, "give a header (with values or regex) or authority"),
        _ => {}
    }
    if let Some(re) = &c.regex
        && let Err(e) = regex::Regex::new(&format!("^(?:{re})$"))
    {
        p.push(format!("{cf}.regex"), format!("invalid regex: {e}"));
    }
    for (i, a) in c.authority.iter().enumerate() {
        if a.parse::<HostPort>().is_err() {
            p.push(format!("{cf}.authority[{i}]"), format!("{a:?} is not host:port"));
        }
    }
}

/// The contents of one file of `routes_dir`.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RouteFile {
    /// The file's routes, each a route as in `listeners[].routes[]` plus the `listener` it
    /// belongs to.
    #[serde(default)]
    #[schemars(extend("x-reload" = "new connections"))]
    routes: Vec<Route>,
}

/// Parse and validate one file of `routes_dir` on its own: every route names its listener, is a
/// valid route, and no two routes of the file collide. Collisions with the main config and the
/// other files are [`Claims::check`]'s, so a changed file never re-validates the others.
pub fn parse_route_file(text: &str, file: &str) -> Result<Vec<Route>, ConfigError> {
    // An empty file (e.g. truncated before being rewritten) holds no routes.
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    let f: RouteFile = crate::yaml::parse(text, file, |f: &RouteFile, p| {
        let mut seen: HashMap<String, Seen> = HashMap::new();
        for (ri, r) in f.routes.iter().enumerate() {
            let rf = format!("routes[{ri}]");
            let Some(listener) = &r.listener else {
                p.push(format!("{rf}.listener"), "name the listener this route belongs to");
                continue;
            };
            let seen = seen.entry(listener.value.clone()).or_default();
            validate_route(r, &rf, listener, false, seen, p);
        }
    })?;
    Ok(f.routes)
}

/// Who owns each listener's route names, SNI patterns and destinations: the main config or one
/// route file. A changed file is checked against everything else in time proportional to its
/// own routes, whatever the total.
#[derive(Debug, Default, Clone)]
pub struct Claims {
    listeners: HashMap<String, ListenerClaims>,
}

#[derive(Debug, Default, Clone)]
struct ListenerClaims {
    udp: bool,
    names: HashMap<String, Arc<str>>,
    snis: HashMap<String, Arc<str>>,
    dests: HashMap<CidrPort, Arc<str>>,
}

impl ListenerClaims {
    fn add(&mut self, r: &Route, owner: &Arc<str>) {
        self.names.insert(r.name.value.clone(), owner.clone());
        for n in r.sni.iter().filter_map(|s| normalize_sni_pattern(s)) {
            self.snis.insert(n, owner.clone());
        }
        for d in &r.destination {
            self.dests.insert(*d, owner.clone());
        }
    }
}

impl Claims {
    /// The listeners and routes of a validated main config, owned by `owner`.
    pub fn of_config(cfg: &RouterConfig, owner: &str) -> Self {
        let owner: Arc<str> = Arc::from(owner);
        let mut c = Self::default();
        for l in &cfg.listeners {
            let lc = c.listeners.entry(l.name.value.clone()).or_default();
            lc.udp = l.protocol == ListenerProtocol::Udp;
            for r in &l.routes {
                lc.add(r, &owner);
            }
        }
        c
    }

    /// Whether the routes of `file` (parsed by [`parse_route_file`], replacing whatever that file
    /// had) fit with the rest: each names a known listener and claims no route name, SNI pattern
    /// or destination that another file or the main config has.
    pub fn check<R: Borrow<Route>>(&self, routes: &[R], file: &str) -> Result<(), ConfigError> {
        let mut p = Problems::new(file);
        for (ri, r) in routes.iter().map(Borrow::borrow).enumerate() {
            let (rf, at) = (format!("routes[{ri}]"), r.name.at());
            let Some(l) = &r.listener else { continue };
            let Some(lc) = self.listeners.get(l.as_str()) else {
                p.push_at(l.at(), format!("{rf}.listener"), format!("no listener named {:?}", l.value));
                continue;
            };
            if lc.udp {
                for (key, why) in udp_route_problems(r) {
                    p.push_at(at, format!("{rf}.{key}"), format!("listener {:?} is udp: {why}", **l));
                }
            }
            let other = |o: Option<&Arc<str>>| o.filter(|o| &***o != file).cloned();
            if let Some(o) = other(lc.names.get(r.name.as_str())) {
                p.push_at(
                    at,
                    format!("{rf}.name"),
                    format!("route {:?} of listener {:?} is already in {o}", *r.name, **l),
                );
            }
            for (i, s) in r.sni.iter().enumerate() {
                let Some(n) = normalize_sni_pattern(s) else { continue };
                if let Some(o) = other(lc.snis.get(&n)) {
                    p.push_at(at, format!("{rf}.sni[{i}]"), format!("{n:?} is routed by a route in {o}"));
                }
            }
            for (i, d) in r.destination.iter().enumerate() {
                if let Some(o) = other(lc.dests.get(d)) {
                    p.push_at(at, format!("{rf}.destination[{i}]"), format!("{d} is routed by a route in {o}"));
                }
            }
        }
        p.finish(())
    }

    /// Record the routes of `file` (after [`Claims::check`] passed).
    pub fn insert<R: Borrow<Route>>(&mut self, routes: &[R], file: &str) {
        let owner: Arc<str> = Arc::from(file);
        for r in routes.iter().map(Borrow::borrow) {
            if let Some(lc) = r.listener.as_ref().and_then(|l| self.listeners.get_mut(l.as_str())) {
                lc.add(r, &owner);
            }
        }
    }

    /// Forget the routes of `file` (what an earlier [`Claims::insert`] recorded).
    pub fn remove<R: Borrow<Route>>(&mut self, routes: &[R], file: &str) {
        for r in routes.iter().map(Borrow::borrow) {
            let Some(lc) = r.listener.as_ref().and_then(|l| self.listeners.get_mut(l.as_str())) else { continue };
            let mine = |o: Option<&Arc<str>>| o.is_some_and(|o| &**o == file);
            if mine(lc.names.get(r.name.as_str())) {
                lc.names.remove(r.name.as_str());
            }
            for n in r.sni.iter().filter_map(|s| normalize_sni_pattern(s)) {
                if mine(lc.snis.get(&n)) {
                    lc.snis.remove(&n);
                }
            }
            for d in &r.destination {
                if mine(lc.dests.get(d)) {
                    lc.dests.remove(d);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
