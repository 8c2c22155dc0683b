//! The tunnel's metrics: per server (sessions, reconnects, moves, replicas, transport) and per stream (dials, bytes, limits).

use super::machine::events::Carrier;
use super::machine::notes::Metric;
use proxy_core::obs::metrics::{at_zero, counter_vec, gauge, gauge_vec, seconds_histogram};
use proxy_core::prometheus::{HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Registry};
use proxy_core::tunnel::h2::InflightStats;
use proxy_core::tunnel::quic::congestion::CongestionStats;
use proxy_wire::tunnel::DialError;

#[derive(Clone)]
pub(crate) struct TunnelMetrics {
    pub session: SessionMetrics,
    pub stream: StreamMetrics,
    pub inflight: InflightStats,
    pub quic_congestion: CongestionStats,
}

impl TunnelMetrics {
    pub(crate) fn new(reg: &Registry) -> Self {
        let stream = StreamMetrics::new(reg);
        Self {
            session: SessionMetrics::new(reg, &stream.streams_opened),
            stream,
            inflight: InflightStats::new(reg),
            quic_congestion: CongestionStats::new(reg),
        }
    }
}

/// The sessions to each configured server name and its replicas.
#[derive(Clone)]
pub(crate) struct SessionMetrics {
    pub sessions: IntGaugeVec,
    pub reconnects: IntCounterVec,
    pub moves: IntCounterVec,
    pub server_sessions: IntGaugeVec,
    pub server_sessions_expected: IntGaugeVec,
    pub duplicates: IntCounterVec,
    pub transport: IntGaugeVec,
    pub transport_changes: IntCounterVec,
    pub suspect: IntCounterVec,
    pub replaced: IntCounterVec,
    pub storms_avoided: IntCounterVec,
    /// [`StreamMetrics::streams_opened`], whose series a slot has from the start too.
    streams_opened: IntCounterVec,
}

impl SessionMetrics {
    fn new(reg: &Registry, streams_opened: &IntCounterVec) -> Self {
        let server = &["server"];
        Self {
            streams_opened: streams_opened.clone(),
            sessions: gauge_vec(
                reg,
                "seedgate_tunnel_sessions_connected",
                "1 while the session to a server is up, by server.",
                server,
            ),
            reconnects: counter_vec(
                reg,
                "seedgate_tunnel_reconnects_total",
                "Session (re)connect attempts after the first, by server and result (ok: the session came up, failed: it did not).",
                &["server", "result"],
            ),
            moves: counter_vec(
                reg,
                "seedgate_tunnel_move_notices_total",
                "Move notices received from servers, by server.",
                server,
            ),
            server_sessions: gauge_vec(
                reg,
                "seedgate_agent_server_sessions",
                "Sessions up to distinct replicas behind a configured server name.",
                server,
            ),
            server_sessions_expected: gauge_vec(
                reg,
                "seedgate_agent_server_sessions_expected",
                "Replicas behind a configured server name, as the newest announcement says (1 if none announces).",
                server,
            ),
            duplicates: counter_vec(
                reg,
                "seedgate_agent_duplicate_sessions_total",
                "Sessions closed because they reached a replica another session already held, by server name.",
                server,
            ),
            transport: gauge_vec(
                reg,
                "seedgate_tunnel_transport_info",
                "1 for the transport (h2 or quic) of the live session to a server, by server.",
                &["server", "transport"],
            ),
            transport_changes: counter_vec(
                reg,
                "seedgate_tunnel_transport_changes_total",
                "transport auto: sessions dialled over h2 because QUIC did not get through (from quic, to h2), and moves of a session from h2 to QUIC (from h2, to quic), by server.",
                &["server", "from", "to"],
            ),
            suspect: counter_vec(
                reg,
                "seedgate_tunnel_sessions_suspect_total",
                "Times the live session to a server became suspect (its keepalive unanswered for tunnel.keepalive.suspect_after: the path is quiet), by server. The agent then dials a replacement beside it.",
                server,
            ),
            replaced: counter_vec(
                reg,
                "seedgate_tunnel_sessions_replaced_total",
                "Suspect sessions replaced make-before-break by a new session to the same server, by server (the old one's open streams go on there).",
                server,
            ),
            storms_avoided: counter_vec(
                reg,
                "seedgate_tunnel_reconnect_storms_avoided_total",
                "Sessions that came up and ended before they proved themselves (lived tunnel.reconnect.max or carried a stream), by server: the back-off kept growing instead of redialling at tunnel.reconnect.initial.",
                server,
            ),
        }
    }
}

/// The streams the seed opens and the dials they make in the shoot.
#[derive(Clone)]
pub(crate) struct StreamMetrics {
    pub streams_active: IntGauge,
    pub streams_opened: IntCounterVec,
    pub dial_seconds: HistogramVec,
    pub dial_failures: IntCounterVec,
    pub bytes: IntCounterVec,
    pub limit_hits: IntCounterVec,
}

impl StreamMetrics {
    fn new(reg: &Registry) -> Self {
        let m = Self {
            streams_active: gauge(reg, "seedgate_tunnel_streams_active", "Tunnel streams open now."),
            streams_opened: counter_vec(
                reg,
                "seedgate_tunnel_streams_opened_total",
                "Tunnel streams dialled successfully, by server.",
                &["server"],
            ),
            dial_seconds: seconds_histogram(
                reg,
                "seedgate_tunnel_dial_duration_seconds",
                "Time to connect to a target in the shoot, by result.",
                &["result"],
            ),
            dial_failures: counter_vec(
                reg,
                "seedgate_tunnel_dial_failures_total",
                "Dials refused or failed, by reason.",
                &["reason"],
            ),
            bytes: counter_vec(
                reg,
                "seedgate_tunnel_bytes_total",
                "Bytes carried by tunnel streams, by direction (to_shoot, to_seed).",
                &["direction"],
            ),
            limit_hits: counter_vec(
                reg,
                "seedgate_tunnel_stream_limit_hits_total",
                "Streams refused because a limit was reached, by limit.",
                &["limit"],
            ),
        };
        // Every label value these take is known: each series is exported from the start.
        at_zero(&m.bytes, &[&["to_shoot", "to_seed"]]);
        at_zero(&m.dial_seconds, &[&["ok", "failed"]]);
        at_zero(&m.dial_failures, &[&DialError::AGENT_CODES]);
        at_zero(&m.limit_hits, &[&["max_streams"]]);
        m
    }
}

/// A slot's series at 0 from its start (the transport gauges too: no session is up).
fn zero_slot(m: &SessionMetrics, label: &str, name: &str) {
    let transports = [Carrier::H2, Carrier::Quic].map(Carrier::as_str);
    at_zero(&m.transport, &[&[label], &transports]);
    at_zero(&m.reconnects, &[&[label], &["ok", "failed"]]);
    for (from, to) in [(Carrier::Quic, Carrier::H2), (Carrier::H2, Carrier::Quic)] {
        at_zero(&m.transport_changes, &[&[label], &[from.as_str()], &[to.as_str()]]);
    }
    for c in [&m.moves, &m.suspect, &m.replaced, &m.storms_avoided, &m.streams_opened] {
        at_zero(c, &[&[label]]);
    }
    let _ = m.sessions.with_label_values(&[label]);
    let _ = m.duplicates.with_label_values(&[name]);
}

/// One slot's series (labelled by the slot's label; duplicates by the configured name). Each
/// series is created when first used, as before the slots had their own handle.
#[derive(Clone)]
pub(super) struct SlotMetrics {
    m: SessionMetrics,
    label: String,
    name: String,
}

impl SlotMetrics {
    pub(super) fn new(m: &SessionMetrics, label: &str, name: &str) -> Self {
        zero_slot(m, label, name);
        Self { m: m.clone(), label: label.to_owned(), name: name.to_owned() }
    }

    /// Perform one of the slot machine's metric notes.
    pub(super) fn record(&self, metric: Metric) {
        match metric {
            Metric::Up(over) => self.up(over),
            Metric::Down => self.down(),
            Metric::Reconnect { ok } => self.reconnect(ok),
            Metric::TransportChange { from, to } => self.transport_change(from, to),
            Metric::Move => self.moved(),
            Metric::Suspect => self.suspect(),
            Metric::Replaced => self.replaced(),
            Metric::StormAvoided => self.storm_avoided(),
            Metric::Duplicate => self.duplicate(),
        }
    }

    /// The slot's session is up over `over`.
    fn up(&self, over: Carrier) {
        self.m.sessions.with_label_values(&[&self.label]).set(1);
        for c in [Carrier::H2, Carrier::Quic] {
            self.m.transport.with_label_values(&[&self.label, c.as_str()]).set(i64::from(c == over));
        }
    }

    /// The slot has no session up.
    fn down(&self) {
        self.m.sessions.with_label_values(&[&self.label]).set(0);
    }

    /// A reconnect attempt ended: its session came up (`ok`), or it failed before that.
    fn reconnect(&self, ok: bool) {
        let result = if ok { "ok" } else { "failed" };
        self.m.reconnects.with_label_values(&[&self.label, result]).inc();
    }

    fn transport_change(&self, from: Carrier, to: Carrier) {
        self.m.transport_changes.with_label_values(&[&self.label, from.as_str(), to.as_str()]).inc();
    }

    fn moved(&self) {
        self.m.moves.with_label_values(&[&self.label]).inc();
    }

    fn suspect(&self) {
        self.m.suspect.with_label_values(&[&self.label]).inc();
    }

    fn replaced(&self) {
        self.m.replaced.with_label_values(&[&self.label]).inc();
    }

    fn storm_avoided(&self) {
        self.m.storms_avoided.with_label_values(&[&self.label]).inc();
    }

    #[cfg(test)]
    pub(super) fn counted(&self) -> [u64; 3] {
        [&self.m.suspect, &self.m.replaced, &self.m.storms_avoided].map(|c| c.with_label_values(&[&self.label]).get())
    }

    fn duplicate(&self) {
        self.m.duplicates.with_label_values(&[&self.name]).inc();
    }

    #[cfg(test)]
    pub(super) fn reconnects(&self, result: &str) -> u64 {
        self.m.reconnects.with_label_values(&[&self.label, result]).get()
    }

    #[cfg(test)]
    pub(super) fn transport_changes(&self, from: Carrier, to: Carrier) -> u64 {
        self.m.transport_changes.with_label_values(&[&self.label, from.as_str(), to.as_str()]).get()
    }

    #[cfg(test)]
    pub(super) fn gauges(&self) -> (i64, i64, i64) {
        let t = |c: Carrier| self.m.transport.with_label_values(&[&self.label, c.as_str()]).get();
        (self.m.sessions.with_label_values(&[&self.label]).get(), t(Carrier::H2), t(Carrier::Quic))
    }

    #[cfg(test)]
    pub(super) fn counts(&self) -> (u64, u64) {
        (self.m.moves.with_label_values(&[&self.label]).get(), self.m.duplicates.with_label_values(&[&self.name]).get())
    }
}
