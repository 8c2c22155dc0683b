//! The proxy-server config: the agents' tunnel listener, the CONNECT/forward-proxy front ends, and per-cluster state.

use crate::common::{
    AdminConfig, CongestionControl, Dur, FileMode, HostPort, Located, config_file, default_fn,
    limits_with_pending_budget, null_is_default, pending_budget_of, timeouts_with_pending_budget,
    validate_pending_budget,
};
use crate::error::{ConfigError, Problems};
use crate::session::with_session_settings;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

mod auth;
mod strategy;
pub use auth::{AgentAuth, TokenReview, TokenReviews};
use auth::{validate_review, validate_reviews};
pub use strategy::ProxyStrategy;
use strategy::{proxy_strategies_default, validate_strategies};

default_fn! {
    admin_default: AdminConfig = AdminConfig::on(9902);
    drain_grace_default: Dur = Dur::secs(30);
    dial_default: Dur = Dur::secs(10);
    idle_default: Dur = Dur::secs(3600);
    max_connections_default: usize = 10_000;
    head_max_default: usize = 8 * 1024;
    accept_unknown_default: bool = true;
    tenant_share_default: f64 = 0.25;
    open_timeout_default: Dur = Dur::secs(2);
    settle_time_default: Dur = Dur::secs(30);
    max_sessions_default: usize = 4096;
}

config_file! {
    /// The whole proxy-server config file.
    #[derive(Debug, Clone, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub struct ServerConfig {
        /// The admin listener (`/metrics`, `/healthz`, `/readyz`, `/config`, the status page `/`
        /// and `/status`, and with a `token_file` `/control/clusters/<name>`); absent or `null`:
        /// `{ listen: 127.0.0.1:9902 }`.
        pub admin,
        /// Deadlines of front-end connections and dials; absent or `null`: every default.
        pub timeouts,
        /// After SIGTERM: how long live connections and streams may continue before the process
        /// exits (the grace in force at SIGTERM counts).
        pub drain_grace,
        /// Bounds of the front ends; absent or `null`: every default.
        pub limits (reload = "new connections"),
        /// The agents' tunnel listener. Required.
        #[schemars(extend("x-reload" = "live"))]
        pub agents: Agents,
        /// The front ends kube-apiserver (egress selector) and Prometheus (`proxy_url`) connect to.
        /// A reload starts a new front end listening; a removed one stops accepting while its live
        /// connections continue; one whose address changed moves (the new socket is bound first).
        #[serde(default, deserialize_with = "null_is_default")]
        #[schemars(with = "Option<Vec<Frontend>>", extend("x-reload" = "live"))]
        pub frontends: Vec<Frontend>,
        /// Per-cluster state for control-plane migration, by cluster name; a cluster not listed is
        /// `active`. Admin overrides (`/control/clusters/<name>`) win over it.
        #[serde(default, deserialize_with = "null_is_default")]
        #[schemars(
            with = "Option<BTreeMap<String, ClusterState>>",
            extend("x-reload" = "live", "propertyNames" = { "pattern": CLUSTER_NAME_PATTERN })
        )]
        pub clusters: BTreeMap<String, ClusterState>,
        /// A directory of cluster-state files (`*.yaml`), watched and merged with `clusters`;
        /// `null` (the default): none.
        #[serde(default)]
        #[schemars(extend("x-reload" = "restart"))]
        pub clusters_dir: Option<String>,
    }
}

timeouts_with_pending_budget! {
    /// Deadlines of front-end connections and of dials through the tunnel.
    pub struct Timeouts {
        /// Front-end pre-relay phase: TLS handshake and the request head, together.
        pub handshake,
        /// What `handshake` shrinks to for a front-end connection accepted while the pending budget
        /// is full (linearly from half full). At or above `handshake`: no shrinking.
        pub handshake_floor,
        /// From sending a dial to the agent until its answer (includes the agent's own connect).
        /// Expired: `504`.
        #[serde(default = "dial_default")]
        pub dial: Dur,
        /// A front-end connection with no byte in either direction for this long is closed.
        #[serde(default = "idle_default")]
        pub idle: Dur,
    }
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            handshake: handshake_default(),
            handshake_floor: handshake_floor_default(),
            dial: dial_default(),
            idle: idle_default(),
        }
    }
}

limits_with_pending_budget! {
    /// Bounds of the front ends (the agents listener is not limited by them: agents authenticate
    /// with client certificates).
    pub struct Limits {
        /// Front-end connections past their request head held at once (accepting pauses at the
        /// limit). Connections still in the TLS handshake or request head count in `max_pending`.
        /// A reload resizes it at once (slots grow at once, shrink as connections end).
        pub max_connections,
        /// Front-end connections in the TLS handshake or request head; when full, the oldest of them
        /// is closed to make room for a new one.
        pub max_pending,
        /// One source's share of a full budget of such connections (TCP peer address masked by
        /// `source_prefix_v4` / `source_prefix_v6`), wider while the budget has room, as in
        /// sni-router; more are closed at once. 0 (the default): no per-source cap — the
        /// front ends' clients are a few kube-apiservers and Prometheus, each one source that opens
        /// bursts of connections (hundreds of streams at once); `max_pending` with its eviction still
        /// bounds them. Set it for a front end reachable by many clients. Unix-socket front ends are
        /// exempt.
        pub pending_per_source = 0,
        /// Largest CONNECT / proxy request head, in bytes. Larger: `431`.
        #[serde(default = "head_max_default", deserialize_with = "crate::size::de")]
        #[schemars(schema_with = "crate::schema::size::<256, 65536>")]
        pub request_head_max: usize,
        /// The default share of each cluster, as a fraction of `max_connections` (its tunnel
        /// streams) and of `max_pending` (its front-end connections in their handshake and its dials
        /// in flight), for clusters without their own `clusters.<name>.limits`. A cluster may hold up
        /// to half of the process limit while at most half of it is in use; the share tightens
        /// linearly to this fraction as it fills. The default share applies only while another
        /// cluster has an agent connected: a cluster alone on its proxy-server may use it all.
        #[serde(default = "tenant_share_default")]
        pub tenant_share: f64,
    }
}
pending_budget_of!(ServerConfig);

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: max_connections_default(),
            max_pending: max_pending_default(),
            pending_per_source: pending_per_source_default(),
            source_prefix_v4: source_prefix_v4_default(),
            source_prefix_v6: source_prefix_v6_default(),
            request_head_max: head_max_default(),
            tenant_share: tenant_share_default(),
        }
    }
}

/// Paths of a TLS identity and, optionally, the CA that client certificates must chain to.
/// The files themselves are watched: a changed file is reloaded within a second, without a
/// config reload, and new handshakes use it.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ServerTls {
    /// The certificate chain (PEM), leaf first.
    pub cert: String,
    /// The private key (PEM) of `cert`.
    pub key: String,
    /// The CA(s) (PEM) client certificates must chain to; `null`: no client certificate asked.
    #[serde(default)]
    pub client_ca: Option<String>,
    /// Certificate revocation lists (PEM `X509 CRL` blocks, or one DER list) of `client_ca`'s
    /// issuers: a client certificate whose serial a list of its issuer names is refused in the
    /// handshake. Watched like the certificates: a changed list applies to new handshakes within
    /// seconds, and at `agents.tls` it also ends the live agent sessions it revokes. Only the
    /// client's own certificate is checked, and only against a list its issuer published. A
    /// list past its `nextUpdate` is still used (refusing every client would be worse):
    /// `seedgate_tls_crl_next_update_timestamp_seconds` and its alert show it. `null` (the
    /// default): none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crl: Option<String>,
}

with_session_settings! {
    /// The agents' tunnel listener: TLS 1.3 (ALPN `seedgate-tunnel/1`) with client certificates,
    /// ServiceAccount tokens or both, HTTP/2 or QUIC inside.
    #[derive(Debug, Clone, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    #[schemars(extend(
        "x-reload" = "new sessions",
        // Unless every agent comes with a token alone, the listener needs the agents' CA.
        "if" = { "properties": { "auth": { "const": "token" } }, "required": ["auth"] },
        "else" = { "properties": { "tls": { "required": ["client_ca"], "properties": { "client_ca": { "type": "string" } } } } }
    ))]
    pub struct Agents {
        /// TCP `host:port`. A reload moves it; sessions made on the old socket continue.
        #[schemars(extend("x-reload" = "live"))]
        pub listen: HostPort,
        /// The listener's certificate and the CA of the agents' client certificates: an agent's
        /// certificate from `client_ca` names its cluster by its CN. `client_ca` is required unless
        /// every agent authenticates with a token alone (`auth: token`).
        pub tls: ServerTls,
        /// How agents prove who they are, for clusters without their own
        /// `clusters.<name>.agent_auth`: `mtls` (the default: a client certificate from
        /// `tls.client_ca`, whose CN names the cluster), `token` (a ServiceAccount token, checked by
        /// a TokenReview at the cluster's kube-apiserver, `clusters.<name>.token_review`),
        /// `mtls_and_token` (both, of the same cluster) or `mtls_or_token` (either, while a fleet
        /// moves from one to the other). Where an agent may come with a token alone (`token` or
        /// `mtls_or_token`, here or for a cluster of this file), the TLS handshake asks for a client
        /// certificate without requiring one. Applies to new sessions.
        #[serde(default)]
        pub auth: AgentAuth,
        /// How ServiceAccount tokens are reviewed: what a cluster's `token_review` does not set
        /// itself; absent or `null`: every default. A reload applies to new sessions and to the
        /// next review of live ones.
        #[serde(default, deserialize_with = "null_is_default")]
        #[schemars(with = "Option<TokenReviews>", extend("x-reload" = "live"))]
        pub token_review: TokenReviews,
        /// How long a stream open may go without the agent's answer and without a sign that the
        /// agent got it before the dial moves to another session of the cluster, within
        /// `timeouts.dial`. Over QUIC the sign is any packet from the agent. Over HTTP/2 it is the
        /// answer to a PING sent after the open (one TCP connection delivers in order), asked for
        /// every quarter of this while the dial waits, and the agent must go on answering: a dial
        /// whose session answered no PING sent within this time is stalled (a path that lost what
        /// was sent and retransmits on TCP's back-off), and is refused with `503` and the reason
        /// when no other session could take it; the next session a dial moves to has a quarter of
        /// this to show it got the open. The silent session is then suspect: tried last until it
        /// shows life again. A live agent that is only slow to reach its target keeps the whole
        /// `timeouts.dial`. Keep it above twice the path's round trip under load. Default `2s`.
        #[serde(default = "open_timeout_default")]
        #[schemars(extend("x-reload" = "new connections"))]
        pub open_timeout: Dur,
        ..SessionSettings,
        /// An agent whose certificate names a cluster that no front end and no `clusters` entry
        /// knows (often a typo in the CN): `true` (the default) accepts its session and logs a
        /// warning once per cluster name; `false` refuses it, telling the agent why.
        #[serde(default = "accept_unknown_default")]
        pub accept_unknown_clusters: bool,
        /// This replica's identity, announced to every agent so that an agent holding sessions to
        /// several replicas behind one name can tell them apart. Default: `$POD_NAME`, else the host
        /// name. Replicas must have distinct ids.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(length(min = 1, max = 253), regex(pattern = r"^\S+$"), extend("x-reload" = "live"))]
        pub server_id: Option<String>,
        /// How many replicas of this proxy-server run behind the agents' server name: each agent
        /// keeps a session to that many distinct replicas. Default `1`. Give this or `peers`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(range(min = 1, max = 64), extend("x-reload" = "live"))]
        pub server_count: Option<u32>,
        /// A name that resolves to one address per replica (a Kubernetes headless Service,
        /// `host:port`; the port is not dialled): the replica count is the number of addresses, read
        /// again every `peers_interval` (a failed lookup keeps the last count). Instead of a static
        /// `server_count`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(extend("x-reload" = "live"))]
        pub peers: Option<HostPort>,
        /// How often `peers` is resolved again; at least `1s`.
        #[serde(default = "peers_interval_default")]
        #[schemars(extend("x-reload" = "live"))]
        pub peers_interval: Dur,
        /// After a start, the longest this replica stays unready while it waits for agents: it turns
        /// ready once every cluster it knows (front ends, `clusters`, cluster files) that is `active`
        /// and not `hibernated` has an agent connected here, or when this much time has passed,
        /// whichever comes first. From then on its readiness never depends on agents: a cluster
        /// without agents answers its own dials with `503` and leaves every other cluster's alone.
        /// `0s`: ready at once. Default `30s`.
        #[serde(default = "settle_time_default")]
        #[schemars(extend("x-reload" = "live"))]
        pub settle_time: Dur,
        /// The tunnel's QUIC transport: a UDP listener beside the TCP one, with the same TLS
        /// material (`tls`), identity and rules. Default `null`: TCP only. A reload adds, moves or
        /// removes it (the new socket is bound first); sessions made on an old socket continue and
        /// keep its port until they end.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(extend("x-reload" = "live"))]
        pub quic: Option<AgentsQuic>,
        /// How a dial picks the agent of its cluster, tried in order until one names a connected
        /// agent: `dest_host` (the agent whose identifiers include the destination's host),
        /// `default_route` (an agent that offers a default route), `default` (any agent). Among
        /// equals the least loaded. Default `[default]`. A cluster may override it
        /// (`clusters.<name>.proxy_strategies`).
        #[serde(default = "proxy_strategies_default", deserialize_with = "null_is_default")]
        #[schemars(with = "Option<Vec<ProxyStrategy>>", extend("x-reload" = "new connections"))]
        pub proxy_strategies: Vec<ProxyStrategy>,
        /// Agent sessions one cluster may hold on this replica, for clusters without their own
        /// `clusters.<name>.limits.max_sessions`: one per node of the cluster (each agent holds one
        /// session per replica) and some room for restarts. At the limit a new session is refused
        /// (`cluster_session_limit`, the agent is told why and tries again later); live sessions are
        /// never ended for it. Default `4096`.
        #[serde(default = "max_sessions_default")]
        #[schemars(range(min = 1, max = 1048576))]
        pub max_sessions_per_cluster: usize,
    }
}

/// The agents' QUIC listener.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("x-reload" = "live"))]
pub struct AgentsQuic {
    /// UDP `host:port`; for agents with `transport: auto`, the same port number as `listen`.
    pub listen: HostPort,
    /// The congestion controller of what the server sends to agents over QUIC (an agent's
    /// `tunnel.quic_congestion_control` sets the other direction): `loss_tolerant` (the
    /// default), `cubic`, `bbr` or `new_reno`. The loss-based ones (`cubic`, `new_reno`) cut
    /// their rate at every lost packet: on a path with random loss a stream keeps a few per cent
    /// of the link. quinn's BBR (experimental upstream) stalled a stream across a 150 ms path.
    #[serde(default)]
    #[schemars(extend("x-reload" = "new sessions"))]
    pub congestion_control: CongestionControl,
}

fn peers_interval_default() -> Dur {
    Dur::secs(10)
}

/// Most replicas an agent keeps sessions to behind one name (bounds the agent's sessions).
pub const MAX_SERVER_COUNT: u32 = 64;

/// A front end: HTTP CONNECT and absolute-form requests (or konnectivity's gRPC, or a fixed port
/// forward), carried to the cluster's agents.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("x-reload" = "new connections"))]
pub struct Frontend {
    /// The front end's name: unique; the metric label `frontend`.
    #[schemars(extend("x-reload" = "live"))]
    pub name: Located<String>,
    /// TCP `host:port`; give this or `unix`. A reload moves it (the new socket is bound first;
    /// if that fails the reload is refused and nothing changes).
    #[serde(default)]
    #[schemars(extend("x-reload" = "live"))]
    pub listen: Option<HostPort>,
    /// Unix socket path (kube-apiserver's egress selector `transport.uds`); no TLS. A missing
    /// parent directory is created (mode 0750, group `unix_group`).
    #[serde(default)]
    #[schemars(extend("x-reload" = "live"))]
    pub unix: Option<String>,
    /// Permission bits of the socket file, octal as a string (`"0660"`: owner and group may
    /// connect). Default `null`: as the process umask leaves them. A reload applies it to the
    /// existing socket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-reload" = "live"))]
    pub unix_mode: Option<FileMode>,
    /// Group of the socket file (and of a parent directory it creates): a name from
    /// `/etc/group` or a numeric gid. Default `null`: the process's group. A reload applies it
    /// to the existing socket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-reload" = "live"))]
    pub unix_group: Option<String>,
    /// TLS for a TCP front end; `null`: plain TCP. With `client_ca`, clients must present a
    /// certificate from it (and without `cluster`, its CN names the cluster).
    #[serde(default)]
    pub tls: Option<ServerTls>,
    /// The cluster whose agents carry this front end's streams. Absent: `cluster_from` names it.
    #[serde(default)]
    #[schemars(regex(pattern = CLUSTER_NAME_PATTERN))]
    pub cluster: Option<String>,
    /// Where the cluster comes from without `cluster`: the client certificate's CN (the default;
    /// needs `tls.client_ca`), or each request's proxy credentials (`proxy_authorization`: the
    /// user name is the cluster, the password the token in `proxy_token_file`).
    #[serde(default, skip_serializing_if = "ClusterFrom::is_default")]
    pub cluster_from: ClusterFrom,
    /// The token a `proxy_authorization` front end requires as the password (trailing
    /// whitespace trimmed); read at start and on every reload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_token_file: Option<String>,
    /// What clients speak: `http-connect` (the default: HTTP CONNECT and absolute-form
    /// requests) or `grpc` (konnectivity's `ProxyService`, kube-apiserver's
    /// `proxyProtocol: GRPC`).
    #[serde(default, skip_serializing_if = "FrontendProtocol::is_default")]
    #[schemars(with = "Option<FrontendProtocol>")]
    pub protocol: FrontendProtocol,
    /// `protocol: tcp` only: where every connection goes, `host:port` as the cluster's agents
    /// dial it (a node's kubelet, a Service's cluster IP or name, a pod): the port forward's
    /// fixed target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<HostPort>,
}

/// The protocol of a front end.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum FrontendProtocol {
    /// HTTP CONNECT and absolute-form forward-proxy requests (HTTP/1.1).
    #[default]
    HttpConnect,
    /// konnectivity's gRPC `ProxyService.Proxy` over HTTP/2 (TLS with ALPN `h2`, or cleartext
    /// on a Unix socket or plain TCP).
    Grpc,
    /// A port forward: every connection's bytes, as they come, to `target` in the cluster (no
    /// request to read: for clients that speak neither CONNECT nor a proxy URL).
    Tcp,
}

impl FrontendProtocol {
    fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// The config spelling (logs, `kind` of access events).
    pub fn as_str(self) -> &'static str {
        match self {
            FrontendProtocol::HttpConnect => "http-connect",
            FrontendProtocol::Grpc => "grpc",
            FrontendProtocol::Tcp => "tcp",
        }
    }
}

/// Where a front end without a fixed `cluster` takes the cluster from.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ClusterFrom {
    #[default]
    ClientCertificate,
    ProxyAuthorization,
}

impl ClusterFrom {
    fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// A cluster's state on this proxy-server.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ClusterMode {
    /// Agents connect, dials are served.
    #[default]
    Active,
    /// Every agent of the cluster gets a move notice (to `move_to`); new dials still work while
    /// agents are connected; live streams end `drain_deadline` after the drain started.
    Draining,
    /// No agent session and no dial is accepted for the cluster (`503 cluster moved`), and its
    /// remaining sessions are closed.
    Fenced,
}

/// The state of one cluster (control-plane migration).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("x-reload" = "live"))]
pub struct ClusterState {
    /// `active` (the default), `draining` or `fenced`.
    #[serde(default, deserialize_with = "null_is_default")]
    #[schemars(with = "Option<ClusterMode>")]
    pub state: ClusterMode,
    /// Tunnel addresses of the destination seed, sent to the agents with the move notice
    /// (`draining` only).
    #[serde(default, deserialize_with = "null_is_default")]
    #[schemars(with = "Option<Vec<HostPort>>")]
    pub move_to: Vec<HostPort>,
    /// When draining: live streams end this long after the drain started.
    #[serde(default)]
    pub drain_deadline: Option<Dur>,
    /// This cluster's own `agents.proxy_strategies`; `null` (the default): the global list.
    /// Applies to dials made after a reload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_strategies: Option<Vec<ProxyStrategy>>,
    /// This cluster's own share of the process limits; unset keys take the default share
    /// (`limits.tenant_share`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<ClusterLimits>,
    /// `true`: the cluster is expected to have no agents (hibernated: its nodes scaled to zero;
    /// or not created yet). A starting replica does not wait for its agents
    /// (`agents.settle_time`), `seedgate_cluster_agents_expected` is `0` so the alert on a
    /// cluster without agents (`SeedgateNoAgentForCluster`) stays quiet, and `/readyz?verbose`
    /// says so. Dials are served as for
    /// any cluster whenever an agent is connected. `null` (the default): `false`; an admin
    /// override that does not name it keeps the value of the config or cluster file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hibernated: Option<bool>,
    /// How this cluster's agents prove who they are (see `agents.auth`); `null` (the
    /// default): `agents.auth`. A reload applies to new sessions, and ends live sessions that
    /// came in with a token alone if it no longer lets a token alone in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-reload" = "new sessions"))]
    pub agent_auth: Option<AgentAuth>,
    /// The kube-apiserver that reviews this cluster's agents' tokens, and proxy-server's
    /// credentials there. Only this cluster's kube-apiserver is asked about a token that names
    /// this cluster, so a token of another cluster never gets a session here. `null` (the
    /// default): agents of this cluster cannot authenticate with a token. A reload applies to
    /// new sessions and to the next review of live ones; removing it ends the live sessions
    /// whose token it reviewed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-reload" = "live"))]
    pub token_review: Option<TokenReview>,
}

/// One cluster's limits: hard caps, whatever else the process holds.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("x-reload" = "new streams"))]
pub struct ClusterLimits {
    /// Tunnel streams of this cluster open at once (CONNECTs relaying, forwarded requests).
    #[serde(default)]
    pub max_streams: Option<usize>,
    /// Work of this cluster not relaying yet: front-end connections of its front ends in their
    /// TLS handshake or request head, and dials in flight to its agents.
    #[serde(default)]
    pub max_pending: Option<usize>,
    /// Agent sessions of this cluster on this replica (`agents.max_sessions_per_cluster` when
    /// unset): a new session at the limit is refused. Applies to sessions made after a reload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-reload" = "new sessions"))]
    pub max_sessions: Option<usize>,
}

impl ServerConfig {
    /// The agents listener's and every TLS front end's files.
    pub fn tls_files(&self) -> Vec<crate::common::TlsFiles> {
        let files = |section: &str, t: &ServerTls| {
            crate::common::TlsFiles::new(
                crate::common::TlsRole::Server,
                section,
                Some((&t.cert, &t.key)),
                "client_ca",
                t.client_ca.as_deref(),
            )
            .with_crl(section, t.crl.as_deref())
        };
        let mut out = vec![files("agents.tls", &self.agents.tls)];
        for (i, f) in self.frontends.iter().enumerate() {
            if let Some(t) = &f.tls {
                out.push(files(&format!("frontends[{i}].tls"), t));
            }
        }
        out
    }

    /// The front ends' proxy token files.
    pub fn token_files(&self) -> Vec<(String, String)> {
        let f = self.frontends.iter().enumerate();
        f.filter_map(|(i, f)| Some((format!("frontends[{i}].proxy_token_file"), f.proxy_token_file.clone()?))).collect()
    }

    /// The Unix-socket front ends' paths.
    pub fn unix_sockets(&self) -> Vec<(String, String)> {
        let f = self.frontends.iter().enumerate();
        f.filter_map(|(i, f)| Some((format!("frontends[{i}].unix"), f.unix.clone()?))).collect()
    }
}

pub fn parse(text: &str, file: &str) -> Result<ServerConfig, ConfigError> {
    crate::yaml::parse(text, file, validate)
}

/// [`valid_cluster_name`] as a JSON Schema pattern.
pub const CLUSTER_NAME_PATTERN: &str = "^[A-Za-z0-9._-]{1,253}$";

/// A cluster name: a DNS-label-like word (it is a metric label and a certificate CN).
pub fn valid_cluster_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
}

pub(crate) fn validate(cfg: &ServerConfig, p: &mut Problems) {
    validate_limits(cfg, p);
    validate_agents(cfg, p);
    let mut names = HashSet::new();
    for (i, f) in cfg.frontends.iter().enumerate() {
        if !names.insert(f.name.value.clone()) {
            p.push(format!("frontends[{i}].name"), format!("duplicate front end name {:?}", *f.name));
        }
        validate_frontend(&format!("frontends[{i}]"), f, p);
    }
    validate_strategies("agents.proxy_strategies", &cfg.agents.proxy_strategies, p);
    for (name, c) in &cfg.clusters {
        validate_cluster(name, c, p);
        if let Some(a) = c.agent_auth
            && a.certificate_optional()
            && !cfg.agents.auth.certificate_optional()
        {
            p.push(format!("clusters.{name}.agent_auth"),
                format!(
                    "the agents listener requires a client certificate (agents.auth: {}): set agents.auth to mtls_or_token to let agents come with a token alone",
                    cfg.agents.auth.as_str()
                ),
            );
        }
    }
    crate::common::validate_positive(
        &[
            ("timeouts.handshake", cfg.timeouts.handshake),
            ("timeouts.handshake_floor", cfg.timeouts.handshake_floor),
            ("timeouts.dial", cfg.timeouts.dial),
            ("timeouts.idle", cfg.timeouts.idle),
            ("agents.open_timeout", cfg.agents.open_timeout),
        ],
        p,
    );
}

fn validate_limits(cfg: &ServerConfig, p: &mut Problems) {
    if cfg.limits.max_connections == 0 {
        p.push("limits.max_connections", "must be at least 1");
    }
    validate_pending_budget(&cfg.pending_budget(), p);
    if cfg.limits.request_head_max < 256 || cfg.limits.request_head_max > 64 * 1024 {
        p.push("limits.request_head_max", "must be between 256 and 65536 bytes (64Ki)");
    }
    crate::common::validate_share(cfg.limits.tenant_share, "limits.tenant_share", p);
}

fn validate_agents(cfg: &ServerConfig, p: &mut Problems) {
    let agents = &cfg.agents;
    let certificates = agents.auth.uses_certificates()
        || cfg.clusters.values().any(|c| c.agent_auth.is_some_and(AgentAuth::uses_certificates));
    if agents.tls.client_ca.is_none() && certificates {
        p.push(
            "agents.tls.client_ca",
            "agents authenticate with client certificates: give the CA that issued them (or agents.auth: token)",
        );
    }
    validate_crl("agents.tls", &agents.tls, p);
    validate_reviews(&agents.token_review, p);
    crate::session::validate(&agents.session(), "agents", p);
    if let Some(n) = agents.server_count
        && !(1..=MAX_SERVER_COUNT).contains(&n)
    {
        p.push("agents.server_count", format!("must be between 1 and {MAX_SERVER_COUNT}"));
    }
    if agents.server_count.is_some() && agents.peers.is_some() {
        p.push("agents.peers", "give agents.server_count or agents.peers, not both");
    }
    if let Some(id) = &agents.server_id
        && (id.is_empty() || id.len() > 253 || id.chars().any(|c| c.is_control() || c.is_whitespace()))
    {
        p.push("agents.server_id", "must be 1 to 253 characters without spaces");
    }
    if !(1..=1 << 20).contains(&agents.max_sessions_per_cluster) {
        p.push("agents.max_sessions_per_cluster", "must be between 1 and 1048576");
    }
    if agents.peers_interval.get() < Duration::from_secs(1) {
        p.push("agents.peers_interval", "must be at least 1s");
    }
}

/// One front end, `ff` its path in the config (`frontends[i]`).
fn validate_frontend(ff: &str, f: &Frontend, p: &mut Problems) {
    match (&f.listen, &f.unix) {
        (Some(_), Some(_)) => p.push(ff, "give either listen or unix, not both"),
        (None, None) => p.push(ff, "give listen (TCP) or unix (socket path)"),
        (None, Some(_)) if f.tls.is_some() => p.push(format!("{ff}.tls"), "a unix socket front end takes no TLS"),
        _ => {}
    }
    if f.unix.is_none() {
        for (key, set) in [("unix_mode", f.unix_mode.is_some()), ("unix_group", f.unix_group.is_some())] {
            if set {
                p.push(format!("{ff}.{key}"), "only a unix socket front end (unix: PATH) has this");
            }
        }
    }
    if let Some(g) = &f.unix_group
        && (g.is_empty() || g.contains([':', '\n']) || g.contains(char::is_whitespace))
    {
        p.push(format!("{ff}.unix_group"), format!("{g:?} is neither a group name nor a gid"));
    }
    let by_auth = f.cluster_from == ClusterFrom::ProxyAuthorization;
    if by_auth && f.cluster.is_some() {
        p.push(format!("{ff}.cluster_from"), "give cluster or cluster_from: proxy_authorization, not both");
    }
    if by_auth && f.protocol == FrontendProtocol::Grpc {
        p.push(
            format!("{ff}.cluster_from"),
            "a grpc front end has no proxy credentials: give cluster, or tls.client_ca",
        )
    }
    if by_auth && f.protocol == FrontendProtocol::Tcp {
        p.push(format!("{ff}.cluster_from"),
            "a port forward (protocol: tcp) reads no request and so no proxy credentials: give cluster, or tls.client_ca",
        )
    }
    match (f.protocol, &f.target) {
        (FrontendProtocol::Tcp, None) => {
            p.push(format!("{ff}.target"), "a port forward (protocol: tcp) needs its target host:port")
        }
        (FrontendProtocol::Tcp, Some(t)) if t.port == 0 => {
            p.push(format!("{ff}.target"), "the target needs a port other than 0")
        }
        (FrontendProtocol::Tcp, Some(_)) => {}
        (_, Some(_)) => p.push(format!("{ff}.target"), "only a port forward (protocol: tcp) has a target"),
        (_, None) => {}
    }
    match (by_auth, &f.proxy_token_file) {
        (true, None) => p.push(
            format!("{ff}.proxy_token_file"),
            "cluster_from: proxy_authorization needs the token that proxy credentials must carry",
        ),
        (false, Some(_)) => p.push(format!("{ff}.proxy_token_file"), "only with cluster_from: proxy_authorization"),
        _ => {}
    }
    if let Some(t) = &f.tls {
        validate_crl(&format!("{ff}.tls"), t, p);
    }
    match &f.cluster {
        Some(c) if !valid_cluster_name(c) => {
            p.push(format!("{ff}.cluster"), format!("{c:?} is not a valid cluster name"))
        }
        None if !by_auth && f.tls.as_ref().is_none_or(|t| t.client_ca.is_none()) => {
            p.push(format!("{ff}.cluster"), "without a cluster, the client certificate names it: set tls.client_ca")
        }
        _ => {}
    }
}

fn validate_cluster(name: &str, c: &ClusterState, p: &mut Problems) {
    let cf = format!("clusters.{name}");
    if !valid_cluster_name(name) {
        p.push(cf.clone(), "not a valid cluster name");
    }
    if c.state != ClusterMode::Draining && !c.move_to.is_empty() {
        p.push(format!("{cf}.move_to"), "move_to only applies to state draining");
    }
    if c.drain_deadline.is_some_and(|d| d.get().is_zero()) {
        p.push(format!("{cf}.drain_deadline"), "must be positive");
    }
    if let Some(l) = &c.limits {
        let keys = [("max_streams", l.max_streams), ("max_pending", l.max_pending), ("max_sessions", l.max_sessions)];
        crate::common::validate_tenant_limits(&keys, &format!("{cf}.limits"), p);
    }
    if let Some(s) = &c.proxy_strategies {
        validate_strategies(&format!("{cf}.proxy_strategies"), s, p);
    }
    if let Some(a) = c.agent_auth
        && a.uses_tokens()
        && c.token_review.is_none()
    {
        p.push(
            format!("{cf}.token_review"),
            format!("agent_auth {} needs the kube-apiserver that reviews the agents' tokens", a.as_str()),
        );
    }
    if let Some(t) = &c.token_review {
        validate_review(&format!("{cf}.token_review"), t, p);
    }
}

fn validate_crl(section: &str, t: &ServerTls, p: &mut Problems) {
    if t.crl.is_some() && t.client_ca.is_none() {
        p.push(format!("{section}.crl"), "revocation lists apply to client certificates: give client_ca");
    }
}

/// The contents of one file of `clusters_dir`.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ClusterFile {
    /// Cluster states, as in the main config's `clusters`; a cluster may be defined in one
    /// place only.
    #[serde(default)]
    #[schemars(extend("x-reload" = "live", "propertyNames" = { "pattern": CLUSTER_NAME_PATTERN }))]
    clusters: BTreeMap<String, ClusterState>,
}

/// Parse and validate one file of `clusters_dir`: its cluster states, each checked as the main
/// config's `clusters` are. A cluster also defined elsewhere is the merging caller's to refuse.
pub fn parse_cluster_file(text: &str, file: &str) -> Result<BTreeMap<String, ClusterState>, ConfigError> {
    if text.trim().is_empty() {
        return Ok(BTreeMap::new());
    }
    let f: ClusterFile = crate::yaml::parse(text, file, |f: &ClusterFile, p| {
        for (name, c) in &f.clusters {
            validate_cluster(name, c, p);
        }
    })?;
    Ok(f.clusters)
}

#[cfg(test)]
mod tests;
