//! The proxy-agent config: admin listener, timeouts, limits, the node-local apiserver proxy and the reverse tunnel.

use crate::common::{
    AdminConfig, CidrPort, CongestionControl, Dur, HostPort, Located, config_file, default_fn, null_is_default,
    valid_header_name,
};
use crate::error::{ConfigError, Problems};
use crate::session::with_session_settings;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;

default_fn! {
    admin_default: AdminConfig = AdminConfig::on(9903);
    drain_grace_default: Dur = Dur::secs(30);
    handshake_default: Dur = Dur::secs(5);
    connect_default: Dur = Dur::secs(5);
    idle_default: Dur = Dur::secs(3600);
    max_connections_default: usize = 10_000;
    destination_header_default: String = DEFAULT_DESTINATION_HEADER.into();
    retries_default: u32 = 3;
    dial_timeout_default: Dur = Dur::secs(5);
    tunnel_idle_default: Dur = Dur::secs(3600);
    max_streams_default: usize = 16_384;
    reconnect_initial_default: Dur = Dur::millis(250);
    reconnect_max_default: Dur = Dur::secs(30);
    rehome_drain_default: Dur = Dur::secs(30);
    quic_timeout_default: Dur = Dur::secs(3);
    quic_probe_interval_default: Dur = Dur::secs(60);
    quic_gro_default: bool = true;
}

/// Header that carries `destination` in `http-connect` mode unless `destination_header` says otherwise.
pub const DEFAULT_DESTINATION_HEADER: &str = "X-Gardener-Destination";
/// Upper bound of `apiserver_proxy.retries`.
pub const MAX_RETRIES: u32 = 16;
/// Longest `apiserver_proxy.destination` value accepted.
pub const MAX_DESTINATION_LEN: usize = 1024;

config_file! {
    /// The whole proxy-agent config file.
    #[derive(Debug, Clone, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub struct AgentConfig {
        /// Admin HTTP listener; absent or `null`: `{ listen: 127.0.0.1:9903 }`.
        pub admin,
        /// Deadlines of the apiserver proxy's connections; absent or `null`:
        /// `{ handshake: 5s, connect: 5s, idle: 1h }`.
        pub timeouts,
        /// After SIGTERM: how long live connections may continue before the process exits. Default `30s`.
        pub drain_grace,
        /// Absent or `null`: `{ max_connections: 10000 }`.
        pub limits (reload = "live"),
        /// The node-local apiserver proxy; absent or `null` = not run. Adding or removing it changes
        /// `apiserver_proxy.listen`, which needs a restart.
        #[serde(default)]
        #[schemars(extend("x-reload" = "restart"))]
        pub apiserver_proxy: Option<Located<ApiserverProxy>>,
        /// The reverse tunnel to the seed's proxy-server(s); absent or `null` = not run. Adding or
        /// removing the section needs a restart; its keys change as each says.
        #[serde(default)]
        #[schemars(extend("x-reload" = "restart"))]
        pub tunnel: Option<Located<Tunnel>>,
    }
}

/// TLS identity of the agent (its certificate CN names its cluster) and the CA of the servers.
/// The files themselves are watched: a changed file is reloaded within a second, without a
/// config reload, and new sessions use it.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("x-reload" = "new sessions"))]
pub struct TunnelTls {
    /// The agent's client certificate (PEM); its subject CN is the cluster name. Give it with
    /// `key`, or leave both out for an agent that authenticates with `tunnel.token_file` alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert: Option<String>,
    /// The private key (PEM) of `cert`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// CA that issued the proxy-servers' certificates.
    pub ca: String,
    /// Certificate revocation lists (PEM `X509 CRL` blocks, or one DER list) of `ca`'s
    /// issuers: a proxy-server certificate a list of its issuer names is refused. Watched like
    /// the certificates. `null` (the default): none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crl: Option<String>,
    /// Name to verify in the server certificate (and send as SNI, which the seed's sni-router
    /// routes by). Default: the host part of each server address.
    #[serde(default)]
    pub server_name: Option<String>,
}

impl TunnelTls {
    /// The certificate and its key, when the agent has them.
    pub fn identity(&self) -> Option<(&str, &str)> {
        Some((self.cert.as_deref()?, self.key.as_deref()?))
    }
}

/// Back-off between session attempts.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("x-reload" = "new sessions"))]
pub struct Reconnect {
    /// First wait after a session ends or fails; doubles per failure and per session that ended
    /// before it lived `max` (with jitter). Only a session that lived at least `max` starts the
    /// back-off again from here, so a server that accepts sessions and closes them at once is
    /// redialled at a growing interval. Default `250ms`.
    #[serde(default = "reconnect_initial_default")]
    pub initial: Dur,
    /// Longest wait between attempts. Default `30s`.
    #[serde(default = "reconnect_max_default")]
    pub max: Dur,
}

impl Default for Reconnect {
    fn default() -> Self {
        Self { initial: reconnect_initial_default(), max: reconnect_max_default() }
    }
}

with_session_settings! {
    /// The agent end of the reverse tunnel: it dials out to every server and keeps a session to each.
    #[derive(Debug, Clone, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    #[schemars(extend("x-reload" = "new sessions"), transform = crate::common::Require("allow"))]
    pub struct Tunnel {
        /// proxy-server tunnel addresses (`host:port`); names are resolved again on every connect.
        /// The agent keeps sessions to every replica behind each. A reload gives an added server its
        /// sessions at once; a removed one's sessions get GOAWAY (no new streams; live ones run to
        /// their end); the others are untouched.
        #[schemars(length(min = 1), extend("x-reload" = "live"))]
        pub servers: Vec<HostPort>,
        /// The agent's client certificate and the servers' CA. Required.
        pub tls: TunnelTls,
        /// A ServiceAccount token (a projected volume's file, with the audience proxy-server
        /// requires) the agent presents on every session, instead of or besides its client
        /// certificate; proxy-server checks it with a TokenReview at the cluster's kube-apiserver.
        /// Read again for every new session and whenever it changes (the kubelet rotates it), and
        /// sent on the live sessions then, so they outlive the first token. Never logged. `null`
        /// (the default): no token.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(extend("x-reload" = "new sessions"))]
        pub token_file: Option<String>,
        /// The cluster this agent belongs to, as proxy-server names it: with a token, proxy-server
        /// asks that cluster's kube-apiserver (and only it) whether the token is valid; with a
        /// certificate, it must equal the certificate's CN. `null` (the default): proxy-server
        /// takes its only cluster with token reviews (or the certificate's CN).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(extend("x-reload" = "new sessions"))]
        pub cluster: Option<String>,
        /// Destinations the seed may dial, as CIDRs with optional port (`10.250.0.0/16`,
        /// `100.64.0.10/32:53`). Everything else is refused (default deny): the cloud metadata
        /// address, for one, is unreachable unless listed. A name is resolved and every address
        /// dialled must be listed.
        #[serde(default, deserialize_with = "null_is_default")]
        #[schemars(length(min = 1), extend("x-reload" = "new streams"))]
        pub allow: Vec<CidrPort>,
        /// Resolving and connecting to a destination. Default `5s`.
        #[serde(default = "dial_timeout_default")]
        #[schemars(extend("x-reload" = "new streams"))]
        pub dial_timeout: Dur,
        /// A stream with no byte either way for this long is closed. Default `1h`.
        #[serde(default = "tunnel_idle_default")]
        #[schemars(extend("x-reload" = "new streams"))]
        pub idle_timeout: Dur,
        /// Exponential back-off with jitter between session attempts; absent or `null`: the
        /// defaults.
        #[serde(default, deserialize_with = "null_is_default")]
        #[schemars(with = "Option<Reconnect>")]
        pub reconnect: Reconnect,
        /// Streams open at once across all sessions; more are refused with `stream_limit` (503).
        /// Default `16384`.
        #[serde(default = "max_streams_default")]
        #[schemars(range(min = 1, max = 1048576), extend("x-reload" = "new streams"))]
        pub max_streams: usize,
        ..SessionSettings,
        /// The node this agent runs on: a session of a new run of the same node supersedes the
        /// earlier run's (dials try those last until they end), and the server shows it (readiness,
        /// logs). Default: `identifiers.host`, else `$NODE_NAME`, else the host name; agents that
        /// share a host name (network namespaces of one machine) are told apart by
        /// `identifiers.host`, so one key names the node for both supersession and `dest_host`.
        #[serde(default)]
        pub node_name: Option<String>,
        /// When a server name starts resolving elsewhere, the agent opens a session to the new
        /// address; the old session stays open for this long (its server may still open streams on
        /// it, and they finish), then gets GOAWAY and is closed. (A move notice from the server
        /// carries its own deadline.) Default `30s`.
        #[serde(default = "rehome_drain_default")]
        pub rehome_drain: Dur,
        /// How sessions reach the servers: `h2` (HTTP/2 over TLS over TCP, the default), `quic`
        /// (QUIC over UDP, to the same `servers` addresses: the server's `agents.quic.listen`), or
        /// `auto` (QUIC first; h2 to the same address when no QUIC handshake completes within
        /// `quic_timeout`; while on h2, QUIC is probed again every `quic_probe_interval` and the
        /// slot moves to it make-before-break).
        #[serde(default)]
        pub transport: Transport,
        /// `auto` only: how long a QUIC handshake may take before the agent falls back to h2.
        /// Default `3s`.
        #[serde(default = "quic_timeout_default")]
        pub quic_timeout: Dur,
        /// `auto` only: while a session runs over h2, how often QUIC is tried again (with jitter:
        /// ¾ to all of it). Default `60s`. A reload applies it from the next probe.
        #[serde(default = "quic_probe_interval_default")]
        pub quic_probe_interval: Dur,
        /// QUIC sessions: let the kernel coalesce up to 64 received packets per read (UDP GRO), and
        /// accept packets of up to 6,500 bytes from the seed. Default `true`. quinn keeps room for 32
        /// such reads per session, of which what bursts fill stays resident (at most 2 MiB: a read
        /// brings at most 64 KiB); `false` turns GRO off, accepts Ethernet-sized packets only, and
        /// the room is 47 KiB per session, at the cost of less than half the bulk throughput from
        /// the seed into the shoot. For nodes where the agent's memory counts more than large
        /// uploads to the shoot.
        #[serde(default = "quic_gro_default")]
        pub quic_gro: bool,
        /// QUIC sessions: the congestion controller of what the agent sends to the seed (the seed's
        /// `agents.quic.congestion_control` sets the other direction): `loss_tolerant` (the
        /// default), `cubic`, `bbr` or `new_reno`. The loss-based ones (`cubic`, `new_reno`) cut
        /// their rate at every lost packet: on a path with random loss a stream keeps a few per cent
        /// of the link. quinn's BBR (experimental upstream) stalled a stream across a 150 ms path.
        #[serde(default)]
        pub quic_congestion_control: CongestionControl,
        /// What the agent tells proxy-server about its node, so that a dial to this node's name or
        /// addresses comes to this agent (`agents.proxy_strategies: [dest_host, ...]`). Default: all
        /// from the downward API's environment (`NODE_NAME`, `HOST_IPS`, `HOST_IP`).
        #[serde(default, deserialize_with = "null_is_default")]
        #[schemars(with = "Option<Identifiers>")]
        pub identifiers: Identifiers,
    }
}

/// The agent's identifiers, announced in its hello (a change shows in the next session's hello).
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("x-reload" = "new sessions"))]
pub struct Identifiers {
    /// The node's name, as dials name it (the server's `dest_host` strategy); also the node
    /// name (`node_name`) unless that is set. Default `null`: `$NODE_NAME` (unset: no host
    /// identifier).
    #[serde(default)]
    pub host: Option<String>,
    /// The node's addresses. Default `null`: `$HOST_IPS` (comma-separated, the downward API's
    /// `status.hostIPs`), else `$HOST_IP` (`status.hostIP`), else none.
    #[serde(default)]
    pub addresses: Option<Vec<std::net::IpAddr>>,
    /// This agent offers a default route: dials that no agent's identifiers claim may come here
    /// when `default_route` is among the server's strategies. Default `false`.
    #[serde(default)]
    pub default_route: bool,
}

/// The tunnel's transport.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// HTTP/2 over TLS over TCP.
    #[default]
    H2,
    /// QUIC over UDP, to the same `servers` addresses.
    Quic,
    /// QUIC when it gets through, else h2 (re-probing QUIC now and then).
    Auto,
}

impl Transport {
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::H2 => "h2",
            Transport::Quic => "quic",
            Transport::Auto => "auto",
        }
    }
}

/// Deadlines of the apiserver proxy's connections.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("x-reload" = "new connections"))]
pub struct Timeouts {
    /// Everything between a successful gateway connect and the first relayed byte: writing the
    /// PROXY header, or sending the CONNECT request and reading the gateway's answer (plus
    /// handing any bytes the gateway sent after its answer to the client). Default `5s`.
    #[serde(default = "handshake_default")]
    pub handshake: Dur,
    /// One gateway TCP connect attempt; also bounds the DNS lookup of the gateway. Default `5s`.
    #[serde(default = "connect_default")]
    pub connect: Dur,
    /// A proxied connection with no byte in either direction for this long is closed. Default `1h`.
    #[serde(default = "idle_default")]
    pub idle: Dur,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self { handshake: handshake_default(), connect: connect_default(), idle: idle_default() }
    }
}

/// Bounds of what the process holds.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("x-reload" = "live"))]
pub struct Limits {
    /// Connections held at once by the whole process (accepting pauses at the limit). Default
    /// `10000`. A reload resizes it at once (slots grow at once, shrink as connections end).
    #[serde(default = "max_connections_default")]
    #[schemars(range(min = 1))]
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self { max_connections: max_connections_default() }
    }
}

/// How the agent tells the seed gateway where the client wanted to go.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, schemars::JsonSchema)]
pub enum Mode {
    /// Gardener GEP-8: a PROXY protocol v2 header whose destination is the address the client
    /// connected to (the apiserver's advertised address), then the client's bytes unchanged.
    #[serde(rename = "proxy-protocol-v2")]
    ProxyProtocolV2,
    /// Gardener GEP-30: an HTTP/1.1 `CONNECT` carrying `destination` in `destination_header`;
    /// bytes flow once the gateway answers `200`.
    #[serde(rename = "http-connect")]
    HttpConnect,
}

impl Mode {
    /// The spelling used in the config, logs and metrics.
    pub fn label(self) -> &'static str {
        match self {
            Mode::ProxyProtocolV2 => "proxy-protocol-v2",
            Mode::HttpConnect => "http-connect",
        }
    }
}

/// The node-local apiserver proxy: in-cluster clients connect to the kube-apiserver's advertised
/// address, which the agent listens on, and the agent forwards each connection to the seed gateway.
///
/// Listener names (metric label `listener`, keys of `--write-addresses`): `listen[0]` is
/// `apiserver-proxy`, `listen[i]` for i ≥ 1 is `apiserver-proxy-<i>`.
///
/// A reload applies `gateway`, `mode`, `destination`, `destination_header`, `authority` and
/// `retries` (and `timeouts`, `drain_grace`) to new connections; live connections keep going.
/// `listen` cannot change on reload: such a reload is refused (naming the key) and the
/// agent must be restarted.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("x-reload" = "new connections"))]
pub struct ApiserverProxy {
    /// IP:port addresses to listen on, usually the apiserver's advertised address (the IP must be
    /// assigned to the node, e.g. on a dummy interface). Required, at least one; port 0 picks a
    /// free port (tests).
    #[schemars(length(min = 1), extend("x-reload" = "restart"))]
    pub listen: Vec<Located<HostPort>>,
    /// The seed gateway (sni-router's proxy-protocol or http-connect listener), `host:port`.
    /// The name is resolved again for every new connection, so a DNS change (control-plane
    /// migration to another seed) takes effect at once. Required.
    pub gateway: HostPort,
    /// `proxy-protocol-v2` or `http-connect`. Required: it must match the gateway's listener.
    pub mode: Mode,
    /// `http-connect` only (required there): the value of `destination_header`, e.g.
    /// `outbound|443||kube-apiserver.shoot--a.svc.cluster.local`. Ignored in
    /// `proxy-protocol-v2` mode. Default `null`.
    #[serde(default)]
    #[schemars(length(min = 1, max = 1024), regex(pattern = r"^[!-~]([ !-~]*[!-~])?$"))]
    pub destination: Option<String>,
    /// `http-connect` only: the request header carrying `destination` (not one the CONNECT
    /// request itself uses: `Host`, `Content-Length`, `Transfer-Encoding`, `Connection`).
    /// Default `X-Gardener-Destination`.
    #[serde(default = "destination_header_default")]
    #[schemars(regex(pattern = r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$"))]
    pub destination_header: String,
    /// `http-connect` only: the CONNECT request target and `Host` header. Default `null` = the
    /// listen address the client connected to (e.g. `10.1.2.3:443`).
    #[serde(default)]
    pub authority: Option<HostPort>,
    /// Connect attempts per client connection in total (1 = no retry), cycling through the
    /// gateway's resolved addresses; only attempts that failed before any byte was sent are
    /// retried. Between 1 and 16. Default `3`.
    #[serde(default = "retries_default")]
    #[schemars(range(min = 1, max = 16))]
    pub retries: u32,
}

impl ApiserverProxy {
    /// The listener name of `listen[index]` (see the type's documentation).
    pub fn listener_name(index: usize) -> String {
        if index == 0 { "apiserver-proxy".to_owned() } else { format!("apiserver-proxy-{index}") }
    }
}

impl AgentConfig {
    /// Token files other than `admin.token_file`: the tunnel's ServiceAccount token.
    pub fn token_files(&self) -> Vec<(String, String)> {
        let file = self.tunnel.as_ref().and_then(|t| t.token_file.clone());
        file.map(|f| ("tunnel.token_file".to_owned(), f)).into_iter().collect()
    }

    /// The tunnel's client identity and the CA of the servers.
    pub fn tls_files(&self) -> Vec<crate::common::TlsFiles> {
        let Some(t) = &self.tunnel else { return Vec::new() };
        let t = &t.tls;
        vec![
            crate::common::TlsFiles::new(crate::common::TlsRole::Client, "tunnel.tls", t.identity(), "ca", Some(&t.ca))
                .with_crl("tunnel.tls", t.crl.as_deref()),
        ]
    }

    /// None: the agent listens on TCP only.
    pub fn unix_sockets(&self) -> Vec<(String, String)> {
        Vec::new()
    }
}

/// Parse and validate a proxy-agent config.
pub fn parse(text: &str, file: &str) -> Result<AgentConfig, ConfigError> {
    crate::yaml::parse(text, file, validate)
}

/// A header value we can write verbatim: visible ASCII and inner spaces, so nothing in the
/// config can end the header early or smuggle a second one.
fn valid_header_value(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= MAX_DESTINATION_LEN
        && v.trim() == v
        && v.bytes().all(|b| b == b' ' || b.is_ascii_graphic())
}

fn validate_tunnel(t: &Located<Tunnel>, p: &mut Problems) {
    let f = "tunnel";
    match (&t.tls.cert, &t.tls.key, &t.token_file) {
        (Some(_), Some(_), _) | (None, None, Some(_)) => {}
        (Some(_), None, _) => p.push(format!("{f}.tls.key"), "give the key of tls.cert"),
        (None, Some(_), _) => p.push(format!("{f}.tls.cert"), "give the certificate of tls.key"),
        (None, None, None) => p.push(format!("{f}.tls.cert"),
            "the agent needs an identity: a client certificate (tls.cert and tls.key), a ServiceAccount token (token_file), or both",
        ),
    }
    if let Some(c) = &t.cluster
        && !crate::server::valid_cluster_name(c)
    {
        p.push(format!("{f}.cluster"), format!("{c:?} is not a valid cluster name"));
    }
    if t.servers.is_empty() {
        p.push(format!("{f}.servers"), "at least one proxy-server address is required");
    }
    let mut seen = HashSet::new();
    for (i, s) in t.servers.iter().enumerate() {
        if !seen.insert(s.clone()) {
            p.push(format!("{f}.servers[{i}]"), format!("{s} is listed twice"));
        }
    }
    if t.allow.is_empty() {
        p.push(
            format!("{f}.allow"),
            "empty: every dial would be refused; list the node, pod and service CIDRs the seed may reach",
        );
    }
    if t.max_streams == 0 || t.max_streams > 1 << 20 {
        p.push(format!("{f}.max_streams"), "must be between 1 and 1048576");
    }
    crate::session::validate(&t.session(), f, p);
    for (name, d) in [
        ("dial_timeout", t.dial_timeout),
        ("idle_timeout", t.idle_timeout),
        ("reconnect.initial", t.reconnect.initial),
        ("reconnect.max", t.reconnect.max),
        ("rehome_drain", t.rehome_drain),
        ("quic_timeout", t.quic_timeout),
        ("quic_probe_interval", t.quic_probe_interval),
    ] {
        if d.get().is_zero() {
            p.push(format!("{f}.{name}"), "must be positive");
        }
    }
    if t.reconnect.max < t.reconnect.initial {
        p.push(format!("{f}.reconnect.max"), "must not be below reconnect.initial");
    }
    if let Some(h) = &t.identifiers.host
        && (h.is_empty() || h.len() > 253 || h.contains(|c: char| c.is_whitespace() || c.is_control() || c == ':'))
    {
        p.push(format!("{f}.identifiers.host"), format!("{h:?} is not a node name"));
    }
}

pub(crate) fn validate(cfg: &AgentConfig, p: &mut Problems) {
    if cfg.limits.max_connections == 0 {
        p.push("limits.max_connections", "must be at least 1");
    }
    crate::common::validate_positive(
        &[
            ("timeouts.handshake", cfg.timeouts.handshake),
            ("timeouts.connect", cfg.timeouts.connect),
            ("timeouts.idle", cfg.timeouts.idle),
        ],
        p,
    );
    if let Some(t) = &cfg.tunnel {
        validate_tunnel(t, p);
    }
    let Some(ap) = &cfg.apiserver_proxy else { return };
    let f = "apiserver_proxy";
    if ap.listen.is_empty() {
        p.push(format!("{f}.listen"), "at least one listen address is required");
    }
    let mut seen = HashSet::new();
    for (i, l) in ap.listen.iter().enumerate() {
        // A host name is allowed: it is resolved (once, at bind) like every listen address.
        if l.port != 0 && !seen.insert(l.value.clone()) {
            p.push(format!("{f}.listen[{i}]"), format!("{} is listed twice", l.value));
        }
    }
    match (ap.mode, &ap.destination) {
        (Mode::HttpConnect, None) => p.push(format!("{f}.destination"),
            "required in http-connect mode (e.g. \"outbound|443||kube-apiserver.<namespace>.svc.cluster.local\")",
        ),
        (_, Some(d)) if !valid_header_value(d) => p.push(format!("{f}.destination"),
            format!("{d:?} is not a valid header value: non-empty, at most {MAX_DESTINATION_LEN} bytes, visible ASCII and inner spaces only"),
        ),
        _ => {}
    }
    if !valid_header_name(&ap.destination_header) {
        p.push(
            format!("{f}.destination_header"),
            format!("{:?} is not a valid HTTP header name", ap.destination_header),
        );
    } else if ["host", "content-length", "transfer-encoding", "connection"]
        .contains(&ap.destination_header.to_ascii_lowercase().as_str())
    {
        p.push(
            format!("{f}.destination_header"),
            format!("{:?} is a header the CONNECT request itself uses; choose another name", ap.destination_header),
        );
    }
    if ap.retries == 0 || ap.retries > MAX_RETRIES {
        p.push(format!("{f}.retries"), format!("must be between 1 and {MAX_RETRIES} (total connect attempts)"));
    }
}

#[cfg(test)]
mod tests;
