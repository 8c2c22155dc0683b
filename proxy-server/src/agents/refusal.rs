//! Every refusal of an agent session, in one place: its label (`seedgate_agent_sessions_total`, `seedgate_agent_sessions_ended_total`), the reason logged, and what the agent is told (less to a peer that proved nothing yet).

use super::tokens::ReviewError;
use crate::registry;
use proxy_core::obs::Untrusted;
use proxy_core::tunnel::{ControlMsg, Opener};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How long a refused session stays open so the refusal reaches the agent.
const REFUSAL_LINGER: Duration = Duration::from_secs(1);

/// Why an agent got no session (or lost it). Its text is for proxy-server's log (a peer's claim
/// in it is escaped and cut); the agent is told [`Refusal::told`].
#[derive(Debug, thiserror::Error)]
pub(crate) enum Refusal {
    #[error("the client certificate has no usable CN (the cluster name)")]
    BadIdentity,
    #[error("cluster {0} is fenced on this seed: its agents belong to the seed it moved to")]
    Fenced(String),
    #[error(
        "cluster {0:?} (the certificate's CN) is not served by this proxy-server: no front end or clusters entry names it, and agents.accept_unknown_clusters is false"
    )]
    UnknownCluster(String),
    #[error("cluster {cluster}'s agents must present a client certificate (agent_auth: {auth})")]
    CertificateRequired { cluster: String, auth: &'static str },
    #[error(
        "cluster {cluster}'s agents must present a ServiceAccount token (agent_auth: {auth}): set tunnel.token_file"
    )]
    TokenRequired { cluster: String, auth: &'static str },
    #[error("the client certificate names cluster {cert} but the agent names {named} (tunnel.cluster)")]
    ClusterMismatch { cert: String, named: String },
    #[error("cluster {cluster}'s agent has no token any more (an empty renewal: its tunnel.token_file holds none)")]
    TokenWithdrawn { cluster: String },
    #[error("no cluster to review the token at: {0}")]
    NoTokenCluster(String),
    #[error("no hello with the agent's credentials within {0:?}")]
    NoCredentials(Duration),
    #[error("cluster {cluster}: {error}")]
    Token { cluster: String, error: ReviewError },
    #[error("the token now names ServiceAccount {now}, not {was} as when the session began")]
    AccountChanged { was: String, now: String },
    #[error(
        "cluster {cluster} holds its limit of {cap} agent sessions on this replica (clusters.{cluster}.limits.max_sessions or agents.max_sessions_per_cluster)"
    )]
    SessionLimit { cluster: String, cap: usize },
}

impl From<registry::Refusal> for Refusal {
    fn from(r: registry::Refusal) -> Self {
        match r {
            registry::Refusal::Fenced(cluster) => Refusal::Fenced(cluster),
            registry::Refusal::SessionLimit { cluster, cap } => Refusal::SessionLimit { cluster, cap },
        }
    }
}

impl Refusal {
    /// The `result` label of `seedgate_agent_sessions_total` (and `reason` of
    /// `seedgate_agent_sessions_ended_total`).
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Refusal::BadIdentity => "bad_identity",
            Refusal::Fenced(_) => "cluster_fenced",
            Refusal::UnknownCluster(_) => "unknown_cluster",
            Refusal::CertificateRequired { .. } => "certificate_required",
            Refusal::TokenRequired { .. } => "token_required",
            Refusal::ClusterMismatch { .. } => "cluster_mismatch",
            Refusal::TokenWithdrawn { .. } => "token_required",
            Refusal::NoTokenCluster(_) => "token_cluster_unknown",
            Refusal::NoCredentials(_) => "no_credentials",
            Refusal::Token { error, .. } => error.label(),
            Refusal::AccountChanged { .. } => "token_account",
            Refusal::SessionLimit { .. } => "cluster_session_limit",
        }
    }
}

/// Who is told a refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Peer {
    /// Anyone: nothing proved yet. Told the reason's label and what to set on the agent's
    /// side, never an address, a TLS error or what a kube-apiserver answered.
    Anyone,
    /// An agent that proved its cluster (a valid client certificate, or a token its cluster's
    /// kube-apiserver said yes to): told, besides, the reason as proxy-server logs it where that
    /// concerns the agent alone (its cluster, its limit, the verdict on its own token), still
    /// never how a review failed to be made.
    Authenticated,
}

impl Refusal {
    /// What happened, and what to set where the agent's side can fix it, for anyone.
    fn what(&self) -> &'static str {
        match self {
            Refusal::BadIdentity => "the client certificate's CN is no cluster name",
            Refusal::Fenced(_) => "the cluster is fenced on this seed: its agents belong to the seed it moved to",
            Refusal::UnknownCluster(_) => "this proxy-server does not serve the cluster",
            Refusal::CertificateRequired { .. } => {
                "the cluster's agents must present a client certificate: set tunnel.tls.cert and tunnel.tls.key"
            }
            Refusal::TokenRequired { .. } | Refusal::TokenWithdrawn { .. } => {
                "the cluster's agents must present a ServiceAccount token: set tunnel.token_file to a file that holds one"
            }
            Refusal::ClusterMismatch { .. } => {
                "tunnel.cluster names another cluster than the client certificate's CN: set it to the CN, or leave it out"
            }
            Refusal::NoTokenCluster(_) => {
                "no cluster by that name takes tokens here: set tunnel.cluster to the agent's cluster"
            }
            Refusal::NoCredentials(_) => "no hello with the agent's credentials in time",
            Refusal::Token { error, .. } => match error {
                ReviewError::Unavailable(_) => {
                    "the cluster's kube-apiserver did not review the token; the agent tries again"
                }
                ReviewError::Busy(_) => "too many token reviews of new sessions at once; the agent tries again",
                ReviewError::NoToken => "no token: set tunnel.token_file to a file that holds one",
                ReviewError::Refused(_) | ReviewError::Expiry(_) => {
                    "the cluster's kube-apiserver does not accept the token (expired, revoked, another cluster's, not for proxy-server's audience, or not of an allowed ServiceAccount): check tunnel.token_file and tunnel.cluster"
                }
            },
            Refusal::AccountChanged { .. } => "the renewed token names another ServiceAccount than the session's",
            Refusal::SessionLimit { .. } => "the cluster holds its limit of agent sessions on this replica",
        }
    }

    /// What the agent is told (see [`Peer`]): the label first, then what happened.
    pub(crate) fn told(&self, peer: Peer) -> String {
        let (label, what) = (self.label(), self.what());
        match (peer, self) {
            // How a review failed to be made is proxy-server's business, whoever asks.
            (_, Refusal::Token { error: ReviewError::Unavailable(_) | ReviewError::Busy(_), .. })
            | (Peer::Anyone, _) => {
                format!("{label}: {what}")
            }
            (Peer::Authenticated, Refusal::Token { .. }) => {
                format!("{label}: {what} ({})", Untrusted::new(&self.to_string()).max(1024))
            }
            (Peer::Authenticated, _) => format!("{label}: {}", Untrusted::new(&self.to_string()).max(1024)),
        }
    }
}

/// Send the agent (`peer`) why its session ends, and close the session once the notice had
/// time to arrive.
pub(crate) fn tell_and_close(r: &Refusal, peer: Peer, opener: &Arc<dyn Opener>, stop: &CancellationToken) {
    let _ = opener.control(&ControlMsg::Refused { reason: r.told(peer) });
    // The notice goes out on the control stream once the agent opened it; then close.
    let stop = stop.clone();
    tokio::spawn(async move {
        tokio::time::sleep(REFUSAL_LINGER).await;
        stop.cancel();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What each refusal tells an agent: its label first and, to anyone, nothing internal (no
    /// address, TLS error or kube-apiserver answer); to an authenticated agent, what concerns it.
    #[test]
    fn a_refusal_tells_its_label_and_never_the_internals() {
        use crate::agents::tokens::Unavailable;
        use proxy_wire::token_review::Verdict;
        use seedgate_config::HostPort;
        let at = HostPort { host: "kas.internal".into(), port: 6443 };
        let internal = [
            Refusal::Token {
                cluster: "a".into(),
                error: Unavailable::Connect(at.clone(), std::io::Error::other("refused")).into(),
            },
            Refusal::Token {
                cluster: "a".into(),
                error: Unavailable::Tls { at: at.clone(), what: "CaUsedAsEndEntity".into() }.into(),
            },
            Refusal::Token {
                cluster: "a".into(),
                error: Unavailable::Status { status: 500, why: "failing".into(), message: "etcd at 10.1.2.3".into() }
                    .into(),
            },
        ];
        for r in &internal {
            for peer in [Peer::Anyone, Peer::Authenticated] {
                let t = r.told(peer);
                assert!(t.starts_with("token_review_unavailable: "), "{t}");
                for leak in ["kas.internal", "6443", "refused", "CaUsedAsEndEntity", "500", "10.1.2.3", "etcd"] {
                    assert!(!t.contains(leak), "{peer:?} told {leak:?}: {t}");
                }
            }
        }
        let verdict = Refusal::Token {
            cluster: "a".into(),
            error: Verdict::Unauthenticated("[invalid bearer token, token has expired]".into()).into(),
        };
        let anyone = verdict.told(Peer::Anyone);
        assert!(anyone.starts_with("token_invalid: ") && anyone.contains("tunnel.token_file"), "{anyone}");
        assert!(!anyone.contains("expired]"), "the kube-apiserver's words to anyone: {anyone}");
        let agent = verdict.told(Peer::Authenticated);
        assert!(agent.contains("token has expired"), "its own token's verdict to an authenticated agent: {agent}");
        let required = Refusal::TokenRequired { cluster: "a".into(), auth: "token" }.told(Peer::Anyone);
        assert!(required.starts_with("token_required: ") && required.contains("tunnel.token_file"), "{required}");
        let withdrawn = Refusal::TokenWithdrawn { cluster: "a".into() };
        assert_eq!(withdrawn.label(), "token_required");
        let limit = Refusal::SessionLimit { cluster: "a".into(), cap: 7 };
        assert!(!limit.told(Peer::Anyone).contains('7'), "{}", limit.told(Peer::Anyone));
        let agent = limit.told(Peer::Authenticated);
        assert!(
            agent.starts_with("cluster_session_limit: ")
                && agent.contains("limit of 7")
                && agent.contains("max_sessions"),
            "{agent}"
        );
    }
}
