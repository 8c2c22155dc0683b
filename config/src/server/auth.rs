//! How agents prove their cluster to proxy-server: the auth modes and the TokenReview settings, with their checks.

use crate::common::{Dur, default_fn};
use crate::error::Problems;
use serde::{Deserialize, Serialize};

/// How agents prove who they are (`agents.auth`, `clusters.<name>.agent_auth`).
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AgentAuth {
    /// A client certificate from `agents.tls.client_ca`; its CN names the cluster.
    #[default]
    Mtls,
    /// A ServiceAccount token of the cluster, checked by a TokenReview at its kube-apiserver
    /// (`clusters.<name>.token_review`). A client certificate is not needed; one presented must
    /// name the same cluster.
    Token,
    /// Both: a client certificate naming the cluster, and a token of that cluster.
    MtlsAndToken,
    /// Either: a client certificate, or a token.
    MtlsOrToken,
}

impl AgentAuth {
    /// The config spelling (logs, refusals).
    pub fn as_str(self) -> &'static str {
        match self {
            AgentAuth::Mtls => "mtls",
            AgentAuth::Token => "token",
            AgentAuth::MtlsAndToken => "mtls_and_token",
            AgentAuth::MtlsOrToken => "mtls_or_token",
        }
    }

    /// An agent may come without a client certificate.
    pub fn certificate_optional(self) -> bool {
        matches!(self, AgentAuth::Token | AgentAuth::MtlsOrToken)
    }

    /// Agents may authenticate with a client certificate.
    pub fn uses_certificates(self) -> bool {
        self != AgentAuth::Token
    }

    /// Agents may (or must) authenticate with a token.
    pub fn uses_tokens(self) -> bool {
        self != AgentAuth::Mtls
    }
}

default_fn! {
    review_audiences_default: Vec<String> = vec!["seedgate".into()];
    review_accounts_default: Vec<String> = vec!["kube-system/proxy-agent".into()];
    review_cache_ttl_default: Dur = Dur::secs(10);
    review_cache_size_default: usize = 4096;
    review_timeout_default: Dur = Dur::secs(5);
    review_in_flight_default: usize = 8;
    review_grace_default: Dur = Dur::secs(300);
}

/// How ServiceAccount tokens are reviewed (`agents.token_review`): the defaults of every
/// cluster's `token_review`, the review cache, and how long a live session may go without an
/// answer. A reload applies to new sessions and to the next review of live ones.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("x-reload" = "live"))]
pub struct TokenReviews {
    /// The audiences a token must have one of (the review's `spec.audiences`; the agent's
    /// projected volume names one of them). Default `[seedgate]`.
    #[serde(default = "review_audiences_default")]
    pub audiences: Vec<String>,
    /// The ServiceAccounts whose tokens are accepted: `<namespace>/<name>`, or `<namespace>/*`
    /// for every account of a namespace. Default `[kube-system/proxy-agent]`.
    #[serde(default = "review_accounts_default")]
    pub service_accounts: Vec<String>,
    /// How long a review's answer is reused for the same token and question: a yes for new
    /// sessions with that token (never past the token's expiry), a no (not authenticated, another
    /// audience or account, a refused request) for any session presenting it. `0s`: every token
    /// is asked about. Default `10s`.
    #[serde(default = "review_cache_ttl_default")]
    pub cache_ttl: Dur,
    /// Most review answers kept (yes and no); the oldest make room. Default `4096`.
    #[serde(default = "review_cache_size_default")]
    #[schemars(range(min = 1, max = 1048576))]
    pub cache_size: usize,
    /// A whole review: connect, TLS handshake, answer. Past it the kube-apiserver counts as not
    /// answering: a new session is refused (`token_review_unavailable`), a live one is reviewed
    /// again 10s later, within `grace`. Default `5s`.
    #[serde(default = "review_timeout_default")]
    pub timeout: Dur,
    /// Reviews in flight at once to one cluster's kube-apiserver for new sessions, and as many
    /// again for live sessions' reviews (a renewed or expiring token), which new sessions never
    /// hold up. New sessions' reviews held at once (in flight, or waiting for a place within
    /// `timeout`) are at most twice this per cluster, and one source address holds at most an
    /// eighth of those once they are all taken (up to half while the rest is free); a session
    /// over either is refused at once as `token_review_busy`. Default `8`.
    #[serde(default = "review_in_flight_default")]
    #[schemars(range(min = 1, max = 1024))]
    pub max_in_flight: usize,
    /// How long past its token's `exp` a live session stays while no review answers (the
    /// kube-apiserver down, overloaded, or refusing proxy-server's own credentials: `401`,
    /// `403`, `429`, `5xx`, no connection); then it ends (`token_review_unavailable`), once the
    /// review under way then, if any, has found no answer within `timeout`. Long enough to ride
    /// out a kube-apiserver's restart, short enough that a stolen token is not kept alive by an
    /// outage. `0s`: a session ends at its token's `exp` unless the review then (of a renewed
    /// token, or of its own) says yes. At most `24h`. Default `5m`.
    #[serde(default = "review_grace_default")]
    pub grace: Dur,
}

impl Default for TokenReviews {
    fn default() -> Self {
        Self {
            audiences: review_audiences_default(),
            service_accounts: review_accounts_default(),
            cache_ttl: review_cache_ttl_default(),
            cache_size: review_cache_size_default(),
            timeout: review_timeout_default(),
            max_in_flight: review_in_flight_default(),
            grace: review_grace_default(),
        }
    }
}

/// Where and how a cluster's agents' tokens are reviewed (`clusters.<name>.token_review`). A
/// reload applies to new sessions and to the next review of live ones; removing it ends the
/// cluster's sessions that came in with a token alone.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("x-reload" = "live"))]
pub struct TokenReview {
    /// The cluster's kube-apiserver: `https://host[:port]` (port default 443). Reviews are
    /// `POST /apis/authentication.k8s.io/v1/tokenreviews` there.
    #[schemars(regex(pattern = r"^https://[^/\s]+/?$"))]
    pub url: String,
    /// The CA (PEM) of the kube-apiserver's serving certificate (read for every new connection).
    pub ca: String,
    /// proxy-server's own credentials there: a bearer token (a file, read again for every
    /// review: it may be a rotating token). Give this or `cert` and `key`. Whoever they name
    /// needs `create` on `tokenreviews` (the `system:auth-delegator` ClusterRole has it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<String>,
    /// proxy-server's client certificate (PEM) there, with `key`: instead of `token_file`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert: Option<String>,
    /// The private key (PEM) of `cert`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// This cluster's own `agents.token_review.audiences`; `null` (the default): those.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audiences: Option<Vec<String>>,
    /// This cluster's own `agents.token_review.service_accounts`; `null` (the default): those.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_accounts: Option<Vec<String>>,
}

impl TokenReview {
    /// The host and port of `url` (validated).
    pub fn authority(&self) -> Option<(String, u16)> {
        let rest = self.url.strip_prefix("https://")?.trim_end_matches('/');
        if rest.is_empty() || rest.contains(['/', '@', ' ']) {
            return None;
        }
        if let Some(v6) = rest.strip_prefix('[') {
            let (host, after) = v6.split_once(']')?;
            let port = match after {
                "" => 443,
                p => p.strip_prefix(':')?.parse().ok()?,
            };
            return Some((host.to_owned(), port));
        }
        match rest.rsplit_once(':') {
            Some((h, p)) => Some((h.to_owned(), p.parse().ok()?)),
            None => Some((rest.to_owned(), 443)),
        }
        .filter(|(h, _)| !h.is_empty())
    }
}

/// `<namespace>/<name>` or `<namespace>/*`, each part a Kubernetes name.
fn valid_account_pattern(s: &str) -> bool {
    let name = |n: &str| {
        !n.is_empty()
            && n.len() <= 253
            && n.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    };
    matches!(s.split_once('/'), Some((ns, n)) if name(ns) && (n == "*" || name(n)))
}

fn validate_lists(key: &str, audiences: Option<&[String]>, accounts: Option<&[String]>, p: &mut Problems) {
    if let Some(a) = audiences
        && (a.is_empty() || a.iter().any(|a| a.is_empty()))
    {
        p.push(format!("{key}.audiences"), "give at least one audience, none empty");
    }
    if let Some(a) = accounts {
        if a.is_empty() {
            p.push(format!("{key}.service_accounts"), "give at least one <namespace>/<name>");
        }
        for s in a.iter().filter(|s| !valid_account_pattern(s)) {
            p.push(format!("{key}.service_accounts"), format!("{s:?} is not <namespace>/<name> or <namespace>/*"));
        }
    }
}

pub(super) fn validate_reviews(r: &TokenReviews, p: &mut Problems) {
    let key = "agents.token_review";
    validate_lists(key, Some(&r.audiences), Some(&r.service_accounts), p);
    if r.timeout.get().is_zero() {
        p.push(format!("{key}.timeout"), "must be positive");
    }
    if !(1..=1 << 20).contains(&r.cache_size) {
        p.push(format!("{key}.cache_size"), "must be between 1 and 1048576");
    }
    if !(1..=1024).contains(&r.max_in_flight) {
        p.push(format!("{key}.max_in_flight"), "must be between 1 and 1024");
    }
    if r.grace.get() > std::time::Duration::from_secs(24 * 3600) {
        p.push(format!("{key}.grace"), "must be at most 24h");
    }
}

pub(super) fn validate_review(key: &str, t: &TokenReview, p: &mut Problems) {
    if t.authority().is_none() {
        p.push(format!("{key}.url"), format!("{:?} is not https://host[:port]", t.url));
    }
    match (&t.token_file, &t.cert, &t.key) {
        (Some(_), None, None) | (None, Some(_), Some(_)) => {}
        (None, None, None) => {
            p.push(key.to_owned(), "give proxy-server's credentials at the kube-apiserver: token_file, or cert and key")
        }
        (Some(_), _, _) => p.push(format!("{key}.token_file"), "give token_file or cert and key, not both"),
        (None, _, _) => p.push(format!("{key}.cert"), "give cert and key together"),
    }
    validate_lists(key, t.audiences.as_deref(), t.service_accounts.as_deref(), p);
}
