//! Who an agent is: its cluster from its client certificate, or the cluster it names proven by a TokenReview there; and every refusal of an agent session, with its label, the reason logged and what the agent is told, in one place.
//!
//! A token agent names its cluster (a claim); the token is sent to that cluster's
//! kube-apiserver only, and the session belongs to that cluster only if it says yes. A token of
//! cluster A therefore never gets a session for cluster B: B's kube-apiserver does not
//! authenticate it. A certificate agent's cluster is its certificate's CN; a cluster it names
//! must be the same.

use crate::tokens::ReviewError;
use proxy_core::obs::Untrusted;
use proxy_core::tunnel::{ControlMsg, Opener};
use proxy_wire::tunnel::control::HELLO_FIELD_MAX;
use seedgate_config::server::AgentAuth;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How long a refused session stays open so the refusal reaches the agent.
const REFUSAL_LINGER: Duration = Duration::from_secs(1);

/// Why an agent got no session (or lost it). Its text is for proxy-server's log (a peer's claim
/// in it is escaped and cut); the agent is told [`Refused::told`].
#[derive(Debug, thiserror::Error)]
pub(crate) enum Refused {
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

impl From<crate::registry::Refusal> for Refused {
    fn from(r: crate::registry::Refusal) -> Self {
        match r {
            crate::registry::Refusal::Fenced(cluster) => Refused::Fenced(cluster),
            crate::registry::Refusal::SessionLimit { cluster, cap } => Refused::SessionLimit { cluster, cap },
        }
    }
}

impl Refused {
    /// The `result` label of `seedgate_agent_sessions_total` (and `reason` of
    /// `seedgate_agent_sessions_ended_total`).
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Refused::BadIdentity => "bad_identity",
            Refused::Fenced(_) => "cluster_fenced",
            Refused::UnknownCluster(_) => "unknown_cluster",
            Refused::CertificateRequired { .. } => "certificate_required",
            Refused::TokenRequired { .. } => "token_required",
            Refused::ClusterMismatch { .. } => "cluster_mismatch",
            Refused::TokenWithdrawn { .. } => "token_required",
            Refused::NoTokenCluster(_) => "token_cluster_unknown",
            Refused::NoCredentials(_) => "no_credentials",
            Refused::Token { error, .. } => error.label(),
            Refused::AccountChanged { .. } => "token_account",
            Refused::SessionLimit { .. } => "cluster_session_limit",
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

impl Refused {
    /// What happened, and what to set where the agent's side can fix it, for anyone.
    fn what(&self) -> &'static str {
        match self {
            Refused::BadIdentity => "the client certificate's CN is no cluster name",
            Refused::Fenced(_) => "the cluster is fenced on this seed: its agents belong to the seed it moved to",
            Refused::UnknownCluster(_) => "this proxy-server does not serve the cluster",
            Refused::CertificateRequired { .. } => {
                "the cluster's agents must present a client certificate: set tunnel.tls.cert and tunnel.tls.key"
            }
            Refused::TokenRequired { .. } | Refused::TokenWithdrawn { .. } => {
                "the cluster's agents must present a ServiceAccount token: set tunnel.token_file to a file that holds one"
            }
            Refused::ClusterMismatch { .. } => {
                "tunnel.cluster names another cluster than the client certificate's CN: set it to the CN, or leave it out"
            }
            Refused::NoTokenCluster(_) => {
                "no cluster by that name takes tokens here: set tunnel.cluster to the agent's cluster"
            }
            Refused::NoCredentials(_) => "no hello with the agent's credentials in time",
            Refused::Token { error, .. } => match error {
                ReviewError::Unavailable(_) => {
                    "the cluster's kube-apiserver did not review the token; the agent tries again"
                }
                ReviewError::Busy(_) => "too many token reviews of new sessions at once; the agent tries again",
                ReviewError::NoToken => "no token: set tunnel.token_file to a file that holds one",
                ReviewError::Refused(_) | ReviewError::Expiry(_) => {
                    "the cluster's kube-apiserver does not accept the token (expired, revoked, another cluster's, not for proxy-server's audience, or not of an allowed ServiceAccount): check tunnel.token_file and tunnel.cluster"
                }
            },
            Refused::AccountChanged { .. } => "the renewed token names another ServiceAccount than the session's",
            Refused::SessionLimit { .. } => "the cluster holds its limit of agent sessions on this replica",
        }
    }

    /// What the agent is told (see [`Peer`]): the label first, then what happened.
    pub(crate) fn told(&self, peer: Peer) -> String {
        let (label, what) = (self.label(), self.what());
        match (peer, self) {
            // How a review failed to be made is proxy-server's business, whoever asks.
            (_, Refused::Token { error: ReviewError::Unavailable(_) | ReviewError::Busy(_), .. })
            | (Peer::Anyone, _) => {
                format!("{label}: {what}")
            }
            (Peer::Authenticated, Refused::Token { .. }) => {
                format!("{label}: {what} ({})", Untrusted::new(&self.to_string()).max(1024))
            }
            (Peer::Authenticated, _) => format!("{label}: {}", Untrusted::new(&self.to_string()).max(1024)),
        }
    }
}

/// Send the agent (`peer`) why its session ends, and close the session once the notice had
/// time to arrive.
pub(crate) fn tell_and_close(r: &Refused, peer: Peer, opener: &Arc<dyn Opener>, stop: &CancellationToken) {
    let _ = opener.control(&ControlMsg::Refused { reason: r.told(peer) });
    // The notice goes out on the control stream once the agent opened it; then close.
    let stop = stop.clone();
    tokio::spawn(async move {
        tokio::time::sleep(REFUSAL_LINGER).await;
        stop.cancel();
    });
}

/// What an agent showed: its certificate's cluster (its CN, verified), and what it presented on
/// the control stream (`None` until its hello; then the cluster it names and whether it has a
/// token).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shown<'a> {
    pub cert_cluster: Option<&'a str>,
    pub named: &'a str,
    pub token: bool,
}

/// Whether the agent's hello must be read before its session can be admitted: it has no
/// certificate, or its certificate's cluster wants a token too.
pub(crate) fn needs_hello(cert_cluster: Option<&str>, auth_of: impl Fn(&str) -> AgentAuth) -> bool {
    match cert_cluster {
        None => true,
        Some(c) => matches!(auth_of(c), AgentAuth::Token | AgentAuth::MtlsAndToken),
    }
}

/// The agent's cluster, and whether its token must be reviewed there. `auth_of` says how a
/// cluster's agents authenticate; `token_clusters` are the clusters with a `token_review`.
pub(crate) fn decide(
    shown: Shown<'_>,
    auth_of: impl Fn(&str) -> AgentAuth,
    token_clusters: &[String],
) -> Result<(String, bool), Refused> {
    if let Some(cert) = shown.cert_cluster {
        if !shown.named.is_empty() && shown.named != cert {
            let named = Untrusted::new(shown.named).max(HELLO_FIELD_MAX).to_string();
            return Err(Refused::ClusterMismatch { cert: cert.to_owned(), named });
        }
        let auth = auth_of(cert);
        return match auth {
            AgentAuth::Mtls | AgentAuth::MtlsOrToken => Ok((cert.to_owned(), false)),
            AgentAuth::Token | AgentAuth::MtlsAndToken if !shown.token => {
                Err(Refused::TokenRequired { cluster: cert.to_owned(), auth: auth.as_str() })
            }
            AgentAuth::Token | AgentAuth::MtlsAndToken => Ok((cert.to_owned(), true)),
        };
    }
    let cluster = match (shown.named, token_clusters) {
        ("", [only]) => only.clone(),
        ("", list) => {
            return Err(Refused::NoTokenCluster(format!(
                "the agent names no cluster (tunnel.cluster) and {} clusters have a token_review here",
                list.len()
            )));
        }
        (named, list) if !list.iter().any(|c| c == named) => {
            let named = Untrusted::new(named).max(HELLO_FIELD_MAX);
            return Err(Refused::NoTokenCluster(format!("cluster \"{named}\" has no token_review here")));
        }
        (named, _) => named.to_owned(),
    };
    let auth = auth_of(&cluster);
    if !auth.certificate_optional() {
        return Err(Refused::CertificateRequired { cluster, auth: auth.as_str() });
    }
    if !shown.token {
        return Err(Refused::TokenRequired { cluster, auth: auth.as_str() });
    }
    Ok((cluster, true))
}

#[cfg(test)]
mod tests {
    use super::*;
    use AgentAuth::*;

    fn auth(c: &str) -> AgentAuth {
        match c {
            "tok" => Token,
            "both" => MtlsAndToken,
            "either" => MtlsOrToken,
            _ => Mtls,
        }
    }

    fn shown<'a>(cert: Option<&'a str>, named: &'a str, token: bool) -> Shown<'a> {
        Shown { cert_cluster: cert, named, token }
    }

    fn label(r: Result<(String, bool), Refused>) -> String {
        match r {
            Ok((c, review)) => format!("{c}{}", if review { " +review" } else { "" }),
            Err(e) => e.label().to_owned(),
        }
    }

    /// Every combination of certificate, named cluster, token and mode, as a table.
    #[test]
    fn the_cluster_comes_from_the_certificate_or_from_a_review_of_the_named_cluster() {
        let tokens = ["tok".to_owned(), "either".to_owned(), "both".to_owned()];
        let rows: &[(Option<&str>, &str, bool, &str)] = &[
            // A certificate names the cluster; its mode says whether a token is needed too.
            (Some("a"), "", false, "a"),
            (Some("a"), "a", true, "a"),
            (Some("a"), "b", false, "cluster_mismatch"),
            (Some("either"), "", false, "either"),
            (Some("both"), "", false, "token_required"),
            (Some("both"), "both", true, "both +review"),
            (Some("tok"), "", true, "tok +review"),
            // A token alone: the named cluster, reviewed there; never a cluster without a review.
            (None, "tok", true, "tok +review"),
            (None, "either", true, "either +review"),
            (None, "tok", false, "token_required"),
            (None, "both", true, "certificate_required"),
            (None, "a", true, "token_cluster_unknown"),
            (None, "", true, "token_cluster_unknown"),
        ];
        for (cert, named, token, want) in rows {
            let got = label(decide(shown(*cert, named, *token), auth, &tokens));
            assert_eq!(got, *want, "cert {cert:?}, named {named:?}, token {token}");
        }
        // One cluster with reviews: an agent that names none is that cluster's.
        assert_eq!(label(decide(shown(None, "", true), auth, &["tok".to_owned()])), "tok +review");
    }

    /// What each refusal tells an agent: its label first and, to anyone, nothing internal (no
    /// address, TLS error or kube-apiserver answer); to an authenticated agent, what concerns it.
    #[test]
    fn a_refusal_tells_its_label_and_never_the_internals() {
        use crate::tokens::Unavailable;
        use proxy_wire::token_review::Verdict;
        use seedgate_config::HostPort;
        let at = HostPort { host: "kas.internal".into(), port: 6443 };
        let internal = [
            Refused::Token {
                cluster: "a".into(),
                error: Unavailable::Connect(at.clone(), std::io::Error::other("refused")).into(),
            },
            Refused::Token {
                cluster: "a".into(),
                error: Unavailable::Tls { at: at.clone(), what: "CaUsedAsEndEntity".into() }.into(),
            },
            Refused::Token {
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
        let verdict = Refused::Token {
            cluster: "a".into(),
            error: Verdict::Unauthenticated("[invalid bearer token, token has expired]".into()).into(),
        };
        let anyone = verdict.told(Peer::Anyone);
        assert!(anyone.starts_with("token_invalid: ") && anyone.contains("tunnel.token_file"), "{anyone}");
        assert!(!anyone.contains("expired]"), "the kube-apiserver's words to anyone: {anyone}");
        let agent = verdict.told(Peer::Authenticated);
        assert!(agent.contains("token has expired"), "its own token's verdict to an authenticated agent: {agent}");
        let required = Refused::TokenRequired { cluster: "a".into(), auth: "token" }.told(Peer::Anyone);
        assert!(required.starts_with("token_required: ") && required.contains("tunnel.token_file"), "{required}");
        let withdrawn = Refused::TokenWithdrawn { cluster: "a".into() };
        assert_eq!(withdrawn.label(), "token_required");
        let limit = Refused::SessionLimit { cluster: "a".into(), cap: 7 };
        assert!(!limit.told(Peer::Anyone).contains('7'), "{}", limit.told(Peer::Anyone));
        let agent = limit.told(Peer::Authenticated);
        assert!(
            agent.starts_with("cluster_session_limit: ")
                && agent.contains("limit of 7")
                && agent.contains("max_sessions"),
            "{agent}"
        );
    }

    /// A peer's claim reaches the log escaped and cut.
    #[test]
    fn a_claimed_cluster_is_escaped_and_cut_in_the_reason() {
        let claim = format!("x\nforged line\u{1b}[2J{}", "y".repeat(10_000));
        let tokens = ["tok".to_owned()];
        for cert in [None, Some("a")] {
            let r = decide(shown(cert, &claim, true), auth, &tokens).unwrap_err();
            let text = r.to_string();
            assert!(!text.contains('\n') && !text.contains('\u{1b}'), "{text:?}");
            assert!(text.len() < 1024, "{} bytes", text.len());
            assert!(!r.told(Peer::Anyone).contains("forged"), "the claim is not echoed to anyone");
        }
    }

    #[test]
    fn the_hello_is_awaited_only_where_it_decides() {
        assert!(!needs_hello(Some("a"), auth));
        assert!(!needs_hello(Some("either"), auth));
        assert!(needs_hello(Some("both"), auth));
        assert!(needs_hello(Some("tok"), auth));
        assert!(needs_hello(None, auth));
    }
}
