//! Why a front end turned a connection, a forwarded request or a gRPC `Proxy` stream away: each refusal's reason label, HTTP status and message in one place.

use super::proxy_auth::{PROXY_CHALLENGE, ProxyAuth};
use crate::registry::DialRefusal;
use proxy_core::net::admission;
use proxy_wire::http_head::{self, HeadError};
use proxy_wire::tunnel::DialError;

/// A refusal of a front end. Its [`label`](Refusal::label) is the reason counted in
/// `seedgate_rejects_total` and written in the access event; its [`status`](Refusal::status)
/// and text are the answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Refusal {
    /// The pre-routing phase's verdict: the pending budget, the deadline, the connection limit.
    #[error(transparent)]
    Admission(#[from] admission::Refusal),
    #[error("TLS handshake failed")]
    TlsHandshake,
    /// Neither the front end nor the client certificate names a cluster.
    #[error("client certificate names no cluster")]
    NoClusterIdentity,
    /// The client closed (or its read failed) before its request was complete.
    #[error("the client closed before its request was complete")]
    ClosedEarly,
    #[error("bad request: {0}")]
    BadHead(HeadError),
    #[error("bad CONNECT target: {0}")]
    BadConnectTarget(HeadError),
    #[error("proxy credentials required: user = cluster name, password = the front end's token")]
    ProxyAuth(ProxyAuth),
    #[error("{method} {target} is neither CONNECT nor an absolute-form http:// request")]
    NotAProxyRequest { method: String, target: String },
    #[error("expected an absolute http:// URI, got {0}")]
    NotAbsoluteUri(String),
    /// The dial: the cluster's share, or what the agent (or the tunnel) answered.
    #[error(transparent)]
    Dial(#[from] DialRefusal),
    /// A forwarded request's target failed to answer.
    #[error("target {target}: {error}")]
    Target { target: String, error: String },
    /// A gRPC front end's client did not open with the HTTP/2 preface.
    #[error("not HTTP/2")]
    NotHttp2,
    /// A gRPC front end's client sent HTTP/2 no server takes (see `h2_normalise`).
    #[error("malformed HTTP/2")]
    Http2Malformed,
    /// A `Proxy` stream whose first packet is not a `DIAL_REQ`.
    #[error("the first packet is not a DIAL_REQ")]
    NotADialRequest,
}

/// The labels of the variants without an error of their own (see [`Refusal::labels`]).
const OWN_LABELS: [&str; 10] = [
    "tls_handshake_failed",
    "no_cluster_identity",
    "client_closed_early",
    "proxy_auth_missing",
    "proxy_auth_invalid",
    "not_a_proxy_request",
    "not_absolute_uri",
    "target_error",
    "not_http2",
    "http2_malformed",
];

impl Refusal {
    /// Every reason label a refusal may have: a front end's series of each are exported from
    /// its start.
    pub(crate) fn labels() -> Vec<&'static str> {
        let mut all = OWN_LABELS.to_vec();
        all.push("not_a_dial_request");
        all.extend(admission::Refusal::ALL.map(admission::Refusal::label));
        all.extend(HeadError::REASONS);
        all.extend(DialError::CODES);
        all.extend(["cluster_stream_limit", "cluster_pending_limit"]);
        all
    }

    /// The reason label (bounded: one per variant, or the typed error's own).
    pub(crate) fn label(&self) -> &'static str {
        let label = self.own_label();
        // A label missing from `labels` would have no series before its first refusal; any
        // test that refuses for it says so.
        debug_assert!(Self::labels().contains(&label), "{label} is not among Refusal::labels");
        label
    }

    fn own_label(&self) -> &'static str {
        match self {
            Refusal::Admission(r) => r.label(),
            Refusal::TlsHandshake => "tls_handshake_failed",
            Refusal::NoClusterIdentity => "no_cluster_identity",
            Refusal::ClosedEarly => "client_closed_early",
            Refusal::BadHead(e) | Refusal::BadConnectTarget(e) => e.reason(),
            Refusal::ProxyAuth(ProxyAuth::Missing) => "proxy_auth_missing",
            Refusal::ProxyAuth(ProxyAuth::Invalid) => "proxy_auth_invalid",
            Refusal::NotAProxyRequest { .. } => "not_a_proxy_request",
            Refusal::NotAbsoluteUri(_) => "not_absolute_uri",
            Refusal::Dial(e) => e.code(),
            Refusal::Target { .. } => "target_error",
            Refusal::NotHttp2 => "not_http2",
            Refusal::Http2Malformed => "http2_malformed",
            Refusal::NotADialRequest => "not_a_dial_request",
        }
    }

    /// The HTTP status of the answer; 0: none (the client is gone, or stalled and not owed one).
    pub(crate) fn status(&self) -> u16 {
        match self {
            Refusal::Admission(r) => r.http_status().unwrap_or(0),
            Refusal::TlsHandshake | Refusal::ClosedEarly | Refusal::NotHttp2 | Refusal::Http2Malformed => 0,
            Refusal::NoClusterIdentity => 403,
            Refusal::BadHead(HeadError::TooLarge) => 431,
            Refusal::BadHead(_) | Refusal::BadConnectTarget(_) => 400,
            Refusal::NotAProxyRequest { .. } | Refusal::NotAbsoluteUri(_) | Refusal::NotADialRequest => 400,
            Refusal::ProxyAuth(_) => 407,
            Refusal::Dial(e) => e.http_status(),
            Refusal::Target { .. } => 502,
        }
    }

    /// The gRPC status a `Proxy` stream is answered with when its connection is refused before
    /// it could be served: the code gRPC gives the HTTP status (`503`: `UNAVAILABLE`, as for
    /// a refusal without an answer: the connection is gone), with this refusal's text.
    pub(crate) fn grpc_status(&self) -> tonic::Status {
        use tonic::Code;
        let code = match self.status() {
            0 | 429 | 502 | 503 | 504 => Code::Unavailable,
            400 => Code::Internal,
            401 | 407 => Code::Unauthenticated,
            403 => Code::PermissionDenied,
            404 => Code::Unimplemented,
            _ => Code::Unknown,
        };
        tonic::Status::new(code, self.to_string())
    }

    /// The HTTP/1.x answer (`version`: the request's minor version): the status with this
    /// refusal's text, and the Basic challenge with a 407.
    pub(crate) fn answer(&self, version: u8) -> Vec<u8> {
        let r = http_head::error_response(version, self.status(), &self.to_string());
        if !matches!(self, Refusal::ProxyAuth(_)) {
            return r;
        }
        let at = r.windows(2).position(|w| w == b"\r\n").map_or(r.len(), |p| p + 2);
        let mut out = r[..at].to_vec();
        out.extend_from_slice(format!("Proxy-Authenticate: {PROXY_CHALLENGE}\r\n").as_bytes());
        out.extend_from_slice(&r[at..]);
        out
    }
}
