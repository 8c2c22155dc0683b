//! Why sni-router turns a client connection away, in one place: each refusal's reason label (`seedgate_rejects_total`, `seedgate_connections_total`), what the client is told, and the protocols a connection is routed by.

use proxy_core::net::ConnectFailure;
use proxy_core::net::admission;
use proxy_wire::http_head::HeadError;
use proxy_wire::proxy_protocol::ProxyError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Proto {
    Tls,
    Connect,
    /// Routed by PROXY destination without reading the payload.
    Raw,
    /// Not known yet (rejected before detection).
    Unknown,
}

impl Proto {
    /// The protocols of routed connections, at their [`Proto::index`].
    pub(crate) const ROUTED: [Proto; 3] = [Proto::Tls, Proto::Connect, Proto::Raw];

    pub(crate) fn label(self) -> &'static str {
        match self {
            Proto::Tls => "tls",
            Proto::Connect => "connect",
            Proto::Raw => "proxy_destination",
            Proto::Unknown => "-",
        }
    }

    /// The place of a routed connection's protocol among the listener's handshake histograms.
    pub(crate) fn index(self) -> usize {
        match self {
            Proto::Tls => 0,
            Proto::Connect => 1,
            Proto::Raw | Proto::Unknown => 2,
        }
    }
}

/// What the client is told when it is turned away.
pub(crate) enum Answer {
    /// Close at once, without lingering: the budget of pending connections is the point.
    Abort,
    Close,
    Alert(u8),
    Http(u16, String),
    Redirect(String),
}

pub(crate) struct Reject {
    pub(crate) reason: &'static str,
    pub(crate) answer: Answer,
}

/// Why a TCP listener refuses a connection before it has a route (counted under the route
/// `-`); the reasons of the PROXY header's and the request head's readers are added by
/// [`unrouted_reasons`].
const UNROUTED: [&str; 18] = [
    "pending_per_source",
    "pending_evicted",
    "handshake_timeout",
    "client_closed_early",
    "client_read_error",
    "pp_local_health_check",
    "pp_untrusted_source",
    "pp_too_large",
    "pp_missing",
    "unknown_protocol",
    "client_hello_too_large",
    "not_tls",
    "client_hello_malformed",
    "unknown_sni",
    "no_sni",
    "not_connect",
    "connect_no_route",
    "connection_limit",
];

/// Why a TCP listener refuses a connection once it has a route (counted under the route); the
/// upstream connect's failures are added by [`routed_reasons`].
const ROUTED: [&str; 8] = [
    "source_not_allowed",
    "route_connection_limit",
    "route_pending_limit",
    "connection_limit",
    "pending_evicted",
    "handover_timeout",
    "client_write_error",
    "upstream_write_error",
];

/// Every reason a connection is refused for before it has a route: each has its series in
/// `seedgate_rejects_total` and `seedgate_connections_total{route="-"}` from the start.
pub(crate) fn unrouted_reasons() -> Vec<&'static str> {
    let mut all = UNROUTED.to_vec();
    all.extend(ProxyError::REASONS);
    all.extend(HeadError::REASONS);
    all
}

/// Every reason a routed connection is refused for (its route's series from the start).
pub(crate) fn routed_reasons() -> Vec<&'static str> {
    let mut all = ROUTED.to_vec();
    all.extend(ConnectFailure::ALL.map(ConnectFailure::label));
    all
}

impl Reject {
    pub(crate) fn new(reason: &'static str, answer: Answer) -> Self {
        // A reason missing from the lists would have no series before its first refusal; any
        // test that refuses for it says so.
        debug_assert!(
            unrouted_reasons().contains(&reason) || routed_reasons().contains(&reason),
            "{reason} is not among the reasons refusal.rs lists"
        );
        Self { reason, answer }
    }

    /// The pre-routing phase's verdict, answered as the connection's protocol allows: closed at
    /// once (the budget's), or the refusal's TLS alert or HTTP status, else a plain close.
    pub(crate) fn admission(r: admission::Refusal, proto: Proto) -> Self {
        let answer = match proto {
            _ if r.aborts() => Answer::Abort,
            Proto::Tls => r.tls_alert().map_or(Answer::Close, Answer::Alert),
            Proto::Connect => r.http_status().map_or(Answer::Close, |s| Answer::Http(s, r.to_string())),
            Proto::Raw | Proto::Unknown => Answer::Close,
        };
        Self::new(r.label(), answer)
    }
}

pub(crate) fn closed_early() -> Reject {
    Reject::new("client_closed_early", Answer::Close)
}

pub(crate) fn read_failed(_: std::io::Error) -> Reject {
    Reject::new("client_read_error", Answer::Close)
}
