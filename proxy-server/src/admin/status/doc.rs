//! proxy-server's `/status` document: its typed fields, as serde writes them (version [`proxy_core::obs::status::VERSION`]; the admin reference documents each).

use proxy_core::obs::minutes::MINUTES;
use proxy_core::obs::status::{Header, Paging};
use serde::Serialize;
use std::collections::BTreeMap;

/// proxy-server's `/status` document (version [`proxy_core::obs::status::VERSION`]).
#[derive(Debug, Serialize)]
pub(crate) struct ServerStatus {
    #[serde(flatten)]
    pub header: Header,
    pub replica: Replica,
    pub totals: Totals,
    /// Which clusters this document holds (`?limit=`, `?offset=`, filtered by `?cluster=` or `?q=`).
    pub page: Paging,
    pub clusters: Vec<Cluster>,
    pub frontends: Vec<Frontend>,
    pub token_reviews: TokenReviews,
}

/// This replica as it announces itself to its agents.
#[derive(Debug, Serialize)]
pub(crate) struct Replica {
    pub id: String,
    /// The replica count it announces.
    pub count: u32,
    /// It is shutting down (its agents look for another replica).
    pub draining: bool,
}

/// Counts over every cluster, whatever the page holds.
#[derive(Debug, Default, Serialize)]
pub(crate) struct Totals {
    pub clusters: usize,
    /// Clusters whose agents are expected here and that have none.
    pub clusters_without_agents: usize,
    pub sessions: usize,
    /// Sessions not `active` (suspect, doubted, draining, fenced).
    pub sessions_not_active: usize,
    /// Tunnel streams open now.
    pub streams: usize,
}

/// One cluster.
#[derive(Debug, Serialize)]
pub(crate) struct Cluster {
    pub name: String,
    /// `active`, `draining` or `fenced`.
    pub state: &'static str,
    /// What the page colours it by: `up`, `degraded` (a session not active), `no-agents`
    /// (expected here, none connected: its dials answer 503), `hibernated`, `draining`, `fenced`.
    pub health: &'static str,
    pub hibernated: bool,
    /// Its agents are expected here (active, not hibernated).
    pub expected: bool,
    /// Something in the config names it (a front end, `clusters`, a cluster file, an override).
    pub known: bool,
    pub move_to: Vec<String>,
    /// Its agent sessions on this replica.
    pub sessions_here: usize,
    /// Its tunnel streams open now (on its sessions here), and dials in flight.
    pub streams: usize,
    pub pending: usize,
    /// Its cap of streams at its last dial (its share of `limits.max_connections`; 0 before any).
    pub streams_cap: usize,
    /// Dials and streams refused for its share so far.
    pub share_refused: u64,
    /// Its dials of the last [`Header::minutes`] minutes: `ok` and each refusal's code, each an
    /// array of per-minute counts, oldest first (codes without any are left out).
    pub dials: BTreeMap<&'static str, [u64; MINUTES]>,
    /// The same minutes: dials that failed (every code but `ok`), summed per minute.
    pub dials_failed: [u64; MINUTES],
    /// Its tunnel bytes so far (`seedgate_tunnel_bytes_total`), by direction.
    pub bytes_to_shoot: u64,
    pub bytes_to_seed: u64,
    /// Agent sessions so far, by result: `accepted` or why one was refused.
    pub agent_sessions: BTreeMap<String, u64>,
    pub sessions: Vec<SessionStatus>,
}

/// One agent session.
#[derive(Debug, Serialize)]
pub(crate) struct SessionStatus {
    pub id: u64,
    /// What its agent said in its hello (empty before it came).
    pub node: String,
    pub instance: String,
    pub version: String,
    pub host: String,
    /// The agent's address as this replica sees it.
    pub peer: String,
    /// `h2` or `quic`.
    pub transport: &'static str,
    /// The replica it is on (this one).
    pub replica: String,
    pub age_s: u64,
    /// `active`, `suspect` (its keepalive unanswered: no new dials), `doubted` (dials try it
    /// last: see `doubt`), `draining` (the agent or the cluster is going away), `fenced`.
    pub standing: &'static str,
    /// Why it is doubted: `superseded` (a new run of its node connected) or `silent` (a stream
    /// open it left unanswered).
    pub doubt: Option<&'static str>,
    /// Streams open on it now.
    pub streams: usize,
    /// Bytes of its streams that have ended (a stream's bytes count when it ends).
    pub bytes_to_shoot: u64,
    pub bytes_to_seed: u64,
    /// Its last failed dial (the code and the reason), and how long ago.
    pub last_error: Option<String>,
    pub last_error_age_s: Option<u64>,
    /// The ServiceAccount a token review named, if it came with a token.
    pub account: Option<String>,
}

/// One front end.
#[derive(Debug, Serialize)]
pub(crate) struct Frontend {
    pub name: String,
    /// `http-connect`, `grpc` or `tcp`.
    pub kind: &'static str,
    /// `ip:port` or `unix:<path>`.
    pub listen: String,
    /// Its cluster, or where it takes it from (`client_certificate`, `proxy_authorization`).
    pub cluster: String,
    pub tls: bool,
    /// Connections open now.
    pub connections: u64,
    /// Connections so far, by result (`ok`, or the reason).
    pub results: BTreeMap<String, u64>,
    /// Connections refused so far, by reason (`seedgate_rejects_total`).
    pub refusals: BTreeMap<String, u64>,
}

/// The TokenReviews of agents that come with ServiceAccount tokens.
#[derive(Debug, Serialize)]
pub(crate) struct TokenReviews {
    /// Positive answers cached now, and the cache's size.
    pub cached: usize,
    pub cache_size: usize,
    /// Reviews in flight now, in all and by cluster.
    pub in_flight: usize,
    pub in_flight_by_cluster: BTreeMap<String, usize>,
    /// Reviews so far by result: `authenticated`, `cached`, or why the token was refused.
    pub results: BTreeMap<String, u64>,
}
