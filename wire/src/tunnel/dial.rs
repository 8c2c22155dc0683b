//! Why a dial through the tunnel failed: the codes on the wire and the HTTP statuses a front end answers with.

#![deny(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used)]

/// Why a dial through the tunnel failed. The agent sends the code ([`DialError::code`]) and the
/// detail; the seed rebuilds the error with [`DialError::from_code`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DialError {
    #[error("destination not allowed: {0}")]
    NotAllowed(String),
    #[error("connection refused: {0}")]
    Refused(String),
    #[error("destination unreachable: {0}")]
    Unreachable(String),
    #[error("cannot resolve destination: {0}")]
    Resolve(String),
    #[error("dial timed out: {0}")]
    Timeout(String),
    #[error("agent stream limit reached: {0}")]
    Limit(String),
    #[error("agent is draining: {0}")]
    Draining(String),
    #[error("no agent connected: {0}")]
    NoAgent(String),
    #[error("cluster moved: {0}")]
    Moved(String),
    #[error("bad destination: {0}")]
    BadTarget(String),
    #[error("tunnel failure: {0}")]
    Transport(String),
}

impl DialError {
    /// Every code ([`DialError::code`]): the `reason` label values of the dial metrics.
    pub const CODES: [&'static str; 11] = [
        "not_allowed",
        "refused",
        "unreachable",
        "resolve_failed",
        "dial_timeout",
        "stream_limit",
        "draining",
        "no_agent",
        "cluster_moved",
        "bad_target",
        "tunnel_error",
    ];

    /// The codes an agent's own dial fails with (the others are the seed's).
    pub const AGENT_CODES: [&'static str; 6] =
        ["not_allowed", "refused", "unreachable", "resolve_failed", "dial_timeout", "bad_target"];

    /// The code on the wire (and the `reason` label of metrics).
    pub fn code(&self) -> &'static str {
        match self {
            DialError::NotAllowed(_) => "not_allowed",
            DialError::Refused(_) => "refused",
            DialError::Unreachable(_) => "unreachable",
            DialError::Resolve(_) => "resolve_failed",
            DialError::Timeout(_) => "dial_timeout",
            DialError::Limit(_) => "stream_limit",
            DialError::Draining(_) => "draining",
            DialError::NoAgent(_) => "no_agent",
            DialError::Moved(_) => "cluster_moved",
            DialError::BadTarget(_) => "bad_target",
            DialError::Transport(_) => "tunnel_error",
        }
    }

    /// The HTTP status a front end answers with.
    pub fn http_status(&self) -> u16 {
        match self {
            DialError::NotAllowed(_) => 403,
            DialError::Refused(_) | DialError::Unreachable(_) | DialError::Resolve(_) | DialError::Transport(_) => 502,
            DialError::Timeout(_) => 504,
            DialError::Limit(_) | DialError::Draining(_) | DialError::NoAgent(_) | DialError::Moved(_) => 503,
            DialError::BadTarget(_) => 400,
        }
    }

    pub fn detail(&self) -> &str {
        match self {
            DialError::NotAllowed(s)
            | DialError::Refused(s)
            | DialError::Unreachable(s)
            | DialError::Resolve(s)
            | DialError::Timeout(s)
            | DialError::Limit(s)
            | DialError::Draining(s)
            | DialError::NoAgent(s)
            | DialError::Moved(s)
            | DialError::BadTarget(s)
            | DialError::Transport(s) => s,
        }
    }

    /// Rebuild from the wire (code and reason). Codes an agent does not send (those made on the
    /// seed) and unknown ones arrive as a transport error naming the code.
    pub fn from_code(code: &str, reason: String) -> Self {
        match code {
            "not_allowed" => DialError::NotAllowed(reason),
            "refused" => DialError::Refused(reason),
            "unreachable" => DialError::Unreachable(reason),
            "resolve_failed" => DialError::Resolve(reason),
            "dial_timeout" => DialError::Timeout(reason),
            "stream_limit" => DialError::Limit(reason),
            "draining" => DialError::Draining(reason),
            "bad_target" => DialError::BadTarget(reason),
            _ => DialError::Transport(format!("{code}: {reason}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_an_agent_sends_come_back_as_the_same_error() {
        let sent = [
            DialError::NotAllowed("a".into()),
            DialError::Refused("b".into()),
            DialError::Unreachable("c".into()),
            DialError::Resolve("d".into()),
            DialError::Timeout("e".into()),
            DialError::Limit("f".into()),
            DialError::Draining("g".into()),
            DialError::BadTarget("h".into()),
        ];
        for e in &sent {
            assert_eq!(&DialError::from_code(e.code(), e.detail().to_owned()), e);
        }
        let seed_only = DialError::Moved("x".into());
        let seed_made = [DialError::NoAgent(String::new()), seed_only.clone(), DialError::Transport(String::new())];
        let codes: Vec<&str> = sent.iter().chain(&seed_made).map(DialError::code).collect();
        assert_eq!(codes.len(), DialError::CODES.len());
        assert!(codes.iter().all(|c| DialError::CODES.contains(c)), "{codes:?}");
        assert_eq!(DialError::from_code(seed_only.code(), "x".into()), DialError::Transport("cluster_moved: x".into()));
    }
}
