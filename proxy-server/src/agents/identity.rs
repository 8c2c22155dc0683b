//! Who an agent is: its cluster from its client certificate, or the cluster it names proven by a TokenReview there, by its cluster's rules of the moment (the config, the cluster files and the admin overrides: each cluster's mode of authentication and its token review settings).
//!
//! A token agent names its cluster (a claim); the token is sent to that cluster's
//! kube-apiserver only, and the session belongs to that cluster only if it says yes. A token of
//! cluster A therefore never gets a session for cluster B: B's kube-apiserver does not
//! authenticate it. A certificate agent's cluster is its certificate's CN; a cluster it names
//! must be the same. Why an agent is refused, and what it is told: [`super::refusal`].

use super::refusal::Refusal;
use super::tokens::ClusterReview;
use crate::shared::Shared;
use proxy_core::obs::Untrusted;
use proxy_wire::tunnel::control::HELLO_FIELD_MAX;
use seedgate_config::server::{AgentAuth, ClusterState};
use std::collections::BTreeMap;

/// How an agent's sessions are checked, per cluster: its mode and the clusters with reviews.
pub(crate) struct Rules {
    states: BTreeMap<String, ClusterState>,
    default: AgentAuth,
}

impl Rules {
    /// The rules in force now (config, cluster files, overrides).
    pub(crate) fn now(shared: &Shared) -> Self {
        Self { states: shared.effective_states(), default: shared.config.load().agents.auth }
    }

    pub(crate) fn auth(&self, cluster: &str) -> AgentAuth {
        self.states.get(cluster).and_then(|s| s.agent_auth).unwrap_or(self.default)
    }

    /// The clusters with a `token_review`.
    pub(crate) fn token_clusters(&self) -> Vec<String> {
        self.states.iter().filter(|(_, s)| s.token_review.is_some()).map(|(c, _)| c.clone()).collect()
    }

    /// The cluster's review settings, if it takes tokens.
    pub(crate) fn review(&self, shared: &Shared, cluster: &str) -> Option<ClusterReview> {
        let r = self.states.get(cluster)?.token_review.as_ref()?;
        Some(ClusterReview::of(r, &shared.config.load().agents.token_review))
    }
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
) -> Result<(String, bool), Refusal> {
    if let Some(cert) = shown.cert_cluster {
        if !shown.named.is_empty() && shown.named != cert {
            let named = Untrusted::new(shown.named).max(HELLO_FIELD_MAX).to_string();
            return Err(Refusal::ClusterMismatch { cert: cert.to_owned(), named });
        }
        let auth = auth_of(cert);
        return match auth {
            AgentAuth::Mtls | AgentAuth::MtlsOrToken => Ok((cert.to_owned(), false)),
            AgentAuth::Token | AgentAuth::MtlsAndToken if !shown.token => {
                Err(Refusal::TokenRequired { cluster: cert.to_owned(), auth: auth.as_str() })
            }
            AgentAuth::Token | AgentAuth::MtlsAndToken => Ok((cert.to_owned(), true)),
        };
    }
    let cluster = match (shown.named, token_clusters) {
        ("", [only]) => only.clone(),
        ("", list) => {
            return Err(Refusal::NoTokenCluster(format!(
                "the agent names no cluster (tunnel.cluster) and {} clusters have a token_review here",
                list.len()
            )));
        }
        (named, list) if !list.iter().any(|c| c == named) => {
            let named = Untrusted::new(named).max(HELLO_FIELD_MAX);
            return Err(Refusal::NoTokenCluster(format!("cluster \"{named}\" has no token_review here")));
        }
        (named, _) => named.to_owned(),
    };
    let auth = auth_of(&cluster);
    if !auth.certificate_optional() {
        return Err(Refusal::CertificateRequired { cluster, auth: auth.as_str() });
    }
    if !shown.token {
        return Err(Refusal::TokenRequired { cluster, auth: auth.as_str() });
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

    fn label(r: Result<(String, bool), Refusal>) -> String {
        match r {
            Ok((c, review)) => format!("{c}{}", if review { " +review" } else { "" }),
            Err(e) => e.label().to_owned(),
        }
    }

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
            assert!(
                !r.told(super::super::refusal::Peer::Anyone).contains("forged"),
                "the claim is not echoed to anyone"
            );
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
