//! proxy-server metrics: agents per cluster, tunnel streams, dials, bytes, front-end requests.

use proxy_core::net::share::TenantSeries;
use proxy_core::obs::metrics::{ConnMetrics, at_zero, counter, counter_vec, gauge, gauge_vec, seconds_histogram};
use proxy_core::prometheus::core::Collector as _;
use proxy_core::prometheus::{HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry};
use proxy_core::tunnel::h2::InflightStats;
use proxy_core::tunnel::quic::congestion::CongestionStats;
use proxy_wire::tunnel::DialError;
use seedgate_config::server::{ClusterMode, Frontend, FrontendProtocol, ProxyStrategy};
use std::collections::BTreeMap;

/// The results of `seedgate_agent_sessions_total` a known cluster's agents are counted with.
const SESSION_RESULTS: [&str; 14] = [
    "accepted",
    "cluster_fenced",
    "cluster_session_limit",
    "certificate_required",
    "token_required",
    "cluster_mismatch",
    "no_credentials",
    "token_cluster_unknown",
    "token_invalid",
    "token_audience",
    "token_account",
    "token_review_malformed",
    "token_review_unavailable",
    "token_review_busy",
];

/// The results counted under the cluster `-`: refusals before the agent's cluster is known, or
/// of a cluster no front end or `clusters` entry knows (its name is not a label).
const UNNAMED_RESULTS: [&str; 6] =
    ["tls_handshake_failed", "bad_alpn", "handshake_timeout", "bad_identity", "no_credentials", "unknown_cluster"];

/// Why a live session ended (`seedgate_agent_sessions_ended_total`).
const ENDED: [&str; 9] = [
    "certificate_revoked",
    "certificate_required",
    "token_cluster_unknown",
    "token_required",
    "token_invalid",
    "token_audience",
    "token_account",
    "token_review_malformed",
    "token_review_unavailable",
];

/// Why a session is doubted (and revived).
const DOUBTS: [&str; 2] = ["superseded", "silent"];

/// Why a dial moved to another session.
const RETRIES: [&str; 4] = ["silent", "suspect", "transport", "draining"];

/// A cluster's shares refused dials for (besides the dial error codes).
const SHARE_REFUSALS: [&str; 2] = ["cluster_stream_limit", "cluster_pending_limit"];

/// The statuses a front end answers with (499: a gRPC client gone before its answer).
const STATUSES: [&str; 9] = ["200", "400", "403", "407", "431", "499", "502", "503", "504"];

/// Each cluster state and its `state` label.
const MODES: [(ClusterMode, &str); 3] =
    [(ClusterMode::Active, "active"), (ClusterMode::Draining, "draining"), (ClusterMode::Fenced, "fenced")];

#[derive(Clone)]
pub struct ServerMetrics {
    pub conn: ConnMetrics,
    pub agents: IntGaugeVec,
    pub agent_sessions: IntCounterVec,
    pub sessions_ended: IntCounterVec,
    pub streams_active: IntGaugeVec,
    pub streams_opened: IntCounterVec,
    pub dial_seconds: HistogramVec,
    pub dial_failures: IntCounterVec,
    pub dial_strategy: IntCounterVec,
    pub tunnel_bytes: IntCounterVec,
    pub requests: IntCounterVec,
    pub cluster_state: IntGaugeVec,
    pub agents_expected: IntGaugeVec,
    pub move_notices: IntCounterVec,
    pub stream_drains: IntCounterVec,
    pub sessions_doubted: IntCounterVec,
    pub sessions_revived: IntCounterVec,
    pub dial_retries: IntCounterVec,
    pub sessions_suspect: IntGaugeVec,
    pub sessions_suspect_total: IntCounterVec,
    pub dials_around_suspect: IntCounterVec,
    pub streams_survived: IntCounterVec,
    pub replica_count: IntGauge,
    pub peers: IntGauge,
    pub announcements: IntCounter,
    pub inflight: InflightStats,
    pub quic_congestion: CongestionStats,
    /// The clusters' shares' series, set by the session directory that owns the shares.
    pub cluster_shares: std::sync::Arc<std::sync::OnceLock<TenantSeries>>,
}

impl ServerMetrics {
    pub fn new(reg: &Registry) -> Self {
        let m = Self {
            conn: ConnMetrics::new(reg),
            agents: gauge_vec(
                reg,
                "seedgate_agents_connected",
                "Agent sessions connected now, by cluster (0 for a known cluster without any).",
                &["cluster"],
            ),
            agent_sessions: counter_vec(
                reg,
                "seedgate_agent_sessions_total",
                "Agent session attempts, by cluster and result (accepted or the reason it was refused).",
                &["cluster", "result"],
            ),
            sessions_ended: counter_vec(
                reg,
                "seedgate_agent_sessions_ended_total",
                "Live agent sessions this replica ended because the agent's identity no longer holds, by cluster and reason: certificate_revoked (a reloaded agents.tls.crl lists its certificate), token_invalid, token_audience, token_account (a review of its expired or renewed token said no, or the kube-apiserver refused the request with a 4xx), token_required (the agent sent an empty renewal: it has no token any more), token_review_unavailable (no review answered within agents.token_review.grace past its token's exp), token_cluster_unknown or certificate_required (a reload: its cluster takes its token no more).",
                &["cluster", "reason"],
            ),
            streams_active: gauge_vec(
                reg,
                "seedgate_tunnel_streams_active",
                "Tunnel streams open now, by cluster.",
                &["cluster"],
            ),
            streams_opened: counter_vec(
                reg,
                "seedgate_tunnel_streams_opened_total",
                "Tunnel streams opened (agent dial succeeded), by cluster.",
                &["cluster"],
            ),
            dial_seconds: seconds_histogram(
                reg,
                "seedgate_tunnel_dial_duration_seconds",
                "Time from sending a dial to the agent's answer, by cluster.",
                &["cluster"],
            ),
            dial_failures: counter_vec(
                reg,
                "seedgate_tunnel_dial_failures_total",
                "Failed dials, by cluster and reason.",
                &["cluster", "reason"],
            ),
            dial_strategy: counter_vec(
                reg,
                "seedgate_tunnel_dial_strategy_total",
                "Dials answered by an agent, by cluster and the proxy strategy that chose it (dest_host, default_route, default).",
                &["cluster", "strategy"],
            ),
            tunnel_bytes: counter_vec(
                reg,
                "seedgate_tunnel_bytes_total",
                "Bytes carried by tunnel streams, by cluster and direction (to_shoot, to_seed).",
                &["cluster", "direction"],
            ),
            requests: counter_vec(
                reg,
                "seedgate_frontend_requests_total",
                "Front-end requests, by front end, kind (connect, forward, tcp: a port forward's connection) and status code.",
                &["frontend", "kind", "code"],
            ),
            cluster_state: gauge_vec(
                reg,
                "seedgate_cluster_state",
                "1 for the state each known cluster is in (active, draining, fenced).",
                &["cluster", "state"],
            ),
            agents_expected: gauge_vec(
                reg,
                "seedgate_cluster_agents_expected",
                "1 for each known cluster whose agents are expected here (state active, not hibernated), 0 for one expected to have none.",
                &["cluster"],
            ),
            move_notices: counter_vec(
                reg,
                "seedgate_agent_move_notices_total",
                "Move notices sent to agents, by cluster.",
                &["cluster"],
            ),
            stream_drains: counter_vec(
                reg,
                "seedgate_tunnel_streams_drained_total",
                "Live streams ended by a drain deadline or fencing, by cluster.",
                &["cluster"],
            ),
            sessions_doubted: counter_vec(
                reg,
                "seedgate_agent_sessions_doubted_total",
                "Agent sessions dials try last, by cluster and reason: superseded (a new run of the same agent connected: it restarted) or silent (no answer to a stream open and no sign that the agent got it within agents.open_timeout; over HTTP/2, no PING sent after it answered).",
                &["cluster", "reason"],
            ),
            sessions_revived: counter_vec(
                reg,
                "seedgate_agent_sessions_revived_total",
                "Doubted agent sessions that showed life again and take dials as before, by cluster and the reason they were doubted (superseded, silent).",
                &["cluster", "reason"],
            ),
            dial_retries: counter_vec(
                reg,
                "seedgate_tunnel_dial_retries_total",
                "Dials moved to another agent session, by cluster and why: silent (no answer and no sign that the agent got the open within agents.open_timeout: a silent or stalled session), suspect (the session's keepalive went unanswered while the open waited), transport (the session failed before the agent answered), draining (the agent is shutting down).",
                &["cluster", "reason"],
            ),
            sessions_suspect: gauge_vec(
                reg,
                "seedgate_agent_sessions_suspect",
                "Agent sessions suspect now, by cluster: their keepalive went unanswered for agents.keepalive.suspect_after (the path is quiet). They take no new dials; their open streams wait for the path until agents.keepalive.timeout.",
                &["cluster"],
            ),
            sessions_suspect_total: counter_vec(
                reg,
                "seedgate_agent_sessions_suspect_total",
                "Times an agent session became suspect (its keepalive unanswered for agents.keepalive.suspect_after), by cluster.",
                &["cluster"],
            ),
            dials_around_suspect: counter_vec(
                reg,
                "seedgate_tunnel_dials_around_suspect_total",
                "Dials served by another agent session of the cluster because a suspect one was passed over, or the session the dial was sent on turned suspect meanwhile, by cluster.",
                &["cluster"],
            ),
            streams_survived: counter_vec(
                reg,
                "seedgate_tunnel_streams_survived_outage_total",
                "Streams open on a suspect agent session when it showed life again, by cluster: they rode out the outage.",
                &["cluster"],
            ),
            replica_count: gauge(
                reg,
                "seedgate_server_replicas_expected",
                "The replica count this proxy-server announces to its agents (agents.server_count or the addresses of agents.peers).",
            ),
            peers: gauge(
                reg,
                "seedgate_server_peers_resolved",
                "Addresses agents.peers resolved to at the last successful lookup.",
            ),
            announcements: counter(
                reg,
                "seedgate_server_announcements_total",
                "Announcements of this replica (id, count, draining) sent to agents.",
            ),
            inflight: InflightStats::new(reg),
            quic_congestion: CongestionStats::new(reg),
            cluster_shares: std::sync::Arc::default(),
        };
        at_zero(&m.agent_sessions, &[&["-"], &UNNAMED_RESULTS]);
        m
    }

    /// A front end's series at 0 from its start: its connections and their refusals (by each
    /// of `refusals`), accept errors, and its requests by kind and status. Its connections'
    /// results are counted by cluster, which may come with each connection: those of a front
    /// end with a `cluster:` only.
    pub fn frontend_at_zero(&self, f: &Frontend, refusals: &[&str]) {
        let name = f.name.as_str();
        self.conn.listener_at_zero(name, refusals);
        if let Some(cluster) = f.cluster.as_deref() {
            at_zero(&self.conn.connections, &[&[name], &[cluster], &["ok"]]);
            if f.tls.as_ref().is_some_and(|t| t.crl.is_some()) {
                at_zero(&self.conn.connections, &[&[name], &[cluster], &["certificate_revoked"]]);
            }
        }
        let kinds: &[&str] = match f.protocol {
            FrontendProtocol::HttpConnect => &["connect", "forward"],
            FrontendProtocol::Grpc => &["grpc"],
            FrontendProtocol::Tcp => &["tcp"],
        };
        at_zero(&self.requests, &[&[name], kinds, &STATUSES]);
    }

    /// Every known cluster's state and agent expectation, and its `seedgate_agents_connected`
    /// (0 until an agent connects), so that a cluster without agents shows as one; a cluster no
    /// longer known loses its state and expectation.
    pub fn publish_clusters(&self, known: &BTreeMap<String, bool>, state: impl Fn(&str) -> ClusterMode) {
        let published: Vec<String> = self
            .agents_expected
            .collect()
            .iter()
            .flat_map(|f| f.get_metric())
            .filter_map(|m| m.get_label().iter().find(|l| l.name() == "cluster").map(|l| l.value().to_owned()))
            .collect();
        for gone in published.iter().filter(|c| !known.contains_key(*c)) {
            let _ = self.agents_expected.remove_label_values(&[gone]);
            for label in MODES.map(|(_, l)| l) {
                let _ = self.cluster_state.remove_label_values(&[gone, label]);
            }
        }
        for (cluster, expected) in known {
            self.set_cluster_state(cluster, state(cluster));
            self.agents_expected.with_label_values(&[cluster]).set(i64::from(*expected));
            // Creates the series at 0 if absent; the count itself is set under the directory's lock.
            let _ = self.agents.with_label_values(&[cluster]);
            self.cluster_at_zero(cluster);
        }
    }

    /// A known cluster's series at 0 (they stay when it goes: its counters are history). Its
    /// TokenReview metrics are the reviewers' (`tokens`), zeroed there for the clusters that
    /// have a `token_review`.
    fn cluster_at_zero(&self, cluster: &str) {
        let c: &[&str] = &[cluster];
        at_zero(&self.agent_sessions, &[c, &SESSION_RESULTS]);
        at_zero(&self.sessions_ended, &[c, &ENDED]);
        at_zero(&self.sessions_doubted, &[c, &DOUBTS]);
        at_zero(&self.sessions_revived, &[c, &DOUBTS]);
        at_zero(&self.dial_retries, &[c, &RETRIES]);
        at_zero(&self.dial_failures, &[c, &DialError::CODES]);
        at_zero(&self.dial_failures, &[c, &SHARE_REFUSALS]);
        let strategies = [ProxyStrategy::DestHost, ProxyStrategy::DefaultRoute, ProxyStrategy::Default];
        at_zero(&self.dial_strategy, &[c, &strategies.map(ProxyStrategy::as_str)]);
        at_zero(&self.tunnel_bytes, &[c, &["to_shoot", "to_seed"]]);
        at_zero(&self.dial_seconds, &[c]);
        for counter in [
            &self.move_notices,
            &self.sessions_suspect_total,
            &self.dials_around_suspect,
            &self.streams_opened,
            &self.stream_drains,
            &self.streams_survived,
        ] {
            at_zero(counter, &[c]);
        }
        at_zero(&self.sessions_suspect, &[c]);
        at_zero(&self.streams_active, &[c]);
        if let Some(shares) = self.cluster_shares.get() {
            shares.at_zero(c);
        }
    }

    pub fn set_cluster_state(&self, cluster: &str, mode: ClusterMode) {
        for (m, label) in MODES {
            self.cluster_state.with_label_values(&[cluster, label]).set(i64::from(m == mode));
        }
    }
}
