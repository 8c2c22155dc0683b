//! Kubernetes ServiceAccount tokens as proxy-server checks them: the TokenReview request and the verdict on its answer (`authentication.k8s.io/v1`), and a token's expiry read without trusting it.
//!
//! The answer comes from the cluster's kube-apiserver; the token comes from an agent and is
//! untrusted. Nothing here believes a token's own claims about who holds it: only the
//! kube-apiserver's review says that. [`expiry`] reads the token's `exp` claim for one use, to
//! know when to review it again.

#![deny(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used)]

use base64::Engine as _;
use serde::{Deserialize, Serialize};

/// The `apiVersion` of the reviews sent and answers accepted.
pub const API_VERSION: &str = "authentication.k8s.io/v1";
/// Where a TokenReview is created on a kube-apiserver.
pub const PATH: &str = "/apis/authentication.k8s.io/v1/tokenreviews";
/// Largest answer read (a review's status is a few hundred bytes; groups and extra can add some).
pub const ANSWER_MAX: usize = 64 * 1024;
/// The prefix of a ServiceAccount's user name: `system:serviceaccount:<namespace>:<name>`.
const SA_PREFIX: &str = "system:serviceaccount:";

#[derive(Serialize)]
struct Request<'a> {
    #[serde(rename = "apiVersion")]
    api_version: &'a str,
    kind: &'a str,
    spec: Spec<'a>,
}

#[derive(Serialize)]
struct Spec<'a> {
    token: &'a str,
    audiences: &'a [String],
}

/// The body of a TokenReview of `token` for `audiences` (JSON).
pub fn request(token: &str, audiences: &[String]) -> Vec<u8> {
    let r = Request { api_version: API_VERSION, kind: "TokenReview", spec: Spec { token, audiences } };
    serde_json::to_vec(&r).unwrap_or_default()
}

#[derive(Deserialize, Default)]
struct Answer {
    #[serde(default, rename = "apiVersion")]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    status: Status,
}

#[derive(Deserialize, Default)]
struct Status {
    #[serde(default)]
    authenticated: bool,
    #[serde(default)]
    user: User,
    #[serde(default)]
    audiences: Vec<String>,
    #[serde(default)]
    error: String,
}

#[derive(Deserialize, Default)]
struct User {
    #[serde(default)]
    username: String,
}

/// A ServiceAccount, as `<namespace>/<name>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for Account {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

impl Account {
    /// Whether `pattern` (`<namespace>/<name>`, or `<namespace>/*` for any account of the
    /// namespace) names this account.
    pub fn matches(&self, pattern: &str) -> bool {
        match pattern.split_once('/') {
            Some((ns, "*")) => ns == self.namespace,
            Some((ns, name)) => ns == self.namespace && name == self.name,
            None => false,
        }
    }
}

/// Why a review did not admit the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Verdict {
    /// The kube-apiserver does not authenticate the token (expired, revoked, another cluster's,
    /// garbage); its own words, if it gave any.
    #[error("the kube-apiserver does not authenticate the token{}", if .0.is_empty() { String::new() } else { format!(": {}", .0) })]
    Unauthenticated(String),
    /// Authenticated, but for none of the audiences asked for.
    #[error("the token is not for audience {wanted} (the kube-apiserver's answer names {got})")]
    Audience { wanted: String, got: String },
    /// Authenticated as a user that is not one of the allowed ServiceAccounts.
    #[error("the token's user {0:?} is not an allowed ServiceAccount")]
    Account(String),
    /// Not a TokenReview answer at all.
    #[error("not a TokenReview answer: {0}")]
    Malformed(String),
}

impl Verdict {
    /// The reason label of metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Verdict::Unauthenticated(_) => "token_invalid",
            Verdict::Audience { .. } => "token_audience",
            Verdict::Account(_) => "token_account",
            Verdict::Malformed(_) => "token_review_malformed",
        }
    }
}

/// The kube-apiserver's answer `body` to a review asking for `audiences`: the ServiceAccount it
/// names, when the token is authenticated for one of `audiences` and that account is one of
/// `allowed` (see [`Account::matches`]).
pub fn verdict(body: &[u8], audiences: &[String], allowed: &[String]) -> Result<Account, Verdict> {
    let a: Answer = serde_json::from_slice(body).map_err(|e| Verdict::Malformed(e.to_string()))?;
    if a.kind != "TokenReview" || a.api_version != API_VERSION {
        return Err(Verdict::Malformed(format!("kind {:?}, apiVersion {:?}", a.kind, a.api_version)));
    }
    let s = a.status;
    if !s.authenticated {
        return Err(Verdict::Unauthenticated(s.error.chars().take(256).collect()));
    }
    // Asked with audiences, an authenticator that checked them answers the ones the token has
    // among them; none means it did not check, which is no answer to rely on.
    if !s.audiences.iter().any(|got| audiences.contains(got)) {
        return Err(Verdict::Audience { wanted: audiences.join(", "), got: s.audiences.join(", ") });
    }
    let account = s
        .user
        .username
        .strip_prefix(SA_PREFIX)
        .and_then(|rest| rest.split_once(':'))
        .filter(|(ns, name)| !ns.is_empty() && !name.is_empty() && !name.contains(':'))
        .map(|(ns, name)| Account { namespace: ns.to_owned(), name: name.to_owned() });
    match account {
        Some(acc) if allowed.iter().any(|p| acc.matches(p)) => Ok(acc),
        _ => Err(Verdict::Account(s.user.username.chars().take(256).collect())),
    }
}

#[derive(Deserialize)]
struct Claims {
    exp: Option<serde_json::Number>,
}

/// The `exp` claim (Unix seconds) of a JWT, read without verifying its signature: only to know
/// when to review it again. `None` for anything that is not a JWT with a numeric `exp`.
pub fn expiry(token: &str) -> Option<u64> {
    let mut parts = token.split('.');
    let (_header, payload, _sig) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || payload.len() > 16 * 1024 {
        return None;
    }
    let payload = payload.trim_end_matches('=');
    let json = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload).ok()?;
    let claims: Claims = serde_json::from_slice(&json).ok()?;
    let exp = claims.exp?;
    exp.as_u64().or_else(|| exp.as_f64().filter(|f| f.is_finite() && *f >= 0.0).map(|f| f as u64))
}

#[cfg(test)]
#[allow(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn answer(status: &str) -> Vec<u8> {
        format!("{{\"kind\":\"TokenReview\",\"apiVersion\":\"authentication.k8s.io/v1\",\"status\":{status}}}")
            .into_bytes()
    }

    fn aud() -> Vec<String> {
        vec!["seedgate".into()]
    }

    fn allowed() -> Vec<String> {
        vec!["kube-system/seedgate-agent".into(), "tools/*".into()]
    }

    const OK: &str = r#"{"authenticated":true,"user":{"username":"system:serviceaccount:kube-system:seedgate-agent","uid":"1","groups":["system:serviceaccounts"]},"audiences":["seedgate"]}"#;

    #[test]
    fn an_authenticated_allowed_account_for_the_audience_is_admitted() {
        let acc = verdict(&answer(OK), &aud(), &allowed()).expect("admitted");
        assert_eq!(acc.to_string(), "kube-system/seedgate-agent");
        let any_in_ns = r#"{"authenticated":true,"user":{"username":"system:serviceaccount:tools:x"},"audiences":["other","seedgate"]}"#;
        assert_eq!(verdict(&answer(any_in_ns), &aud(), &allowed()).map(|a| a.name), Ok("x".into()));
    }

    #[test]
    fn every_refusal_says_why() {
        let unauth = r#"{"authenticated":false,"error":"[invalid bearer token, token has expired]"}"#;
        assert_eq!(
            verdict(&answer(unauth), &aud(), &allowed()),
            Err(Verdict::Unauthenticated("[invalid bearer token, token has expired]".into()))
        );
        assert_eq!(verdict(&answer("{}"), &aud(), &allowed()), Err(Verdict::Unauthenticated(String::new())));
        let wrong_aud = OK.replace("[\"seedgate\"]", "[\"https://kubernetes.default.svc\"]");
        let e = verdict(&answer(&wrong_aud), &aud(), &allowed()).unwrap_err();
        assert_eq!(e.label(), "token_audience");
        assert!(e.to_string().contains("https://kubernetes.default.svc"), "{e}");
        let no_aud = OK.replace(",\"audiences\":[\"seedgate\"]", "");
        assert_eq!(verdict(&answer(&no_aud), &aud(), &allowed()).unwrap_err().label(), "token_audience");
        for user in [
            "system:serviceaccount:kube-system:other",
            "system:serviceaccount:default:seedgate-agent",
            "admin",
            "system:serviceaccount:kube-system",
            "system:serviceaccount::x",
            "system:serviceaccount:kube-system:seedgate-agent:extra",
        ] {
            let a = OK.replace("system:serviceaccount:kube-system:seedgate-agent", user);
            assert_eq!(verdict(&answer(&a), &aud(), &allowed()), Err(Verdict::Account(user.into())), "{user}");
        }
        assert_eq!(verdict(b"<html>", &aud(), &allowed()).unwrap_err().label(), "token_review_malformed");
        let status = br#"{"kind":"Status","apiVersion":"v1","status":"Failure","code":403}"#;
        assert_eq!(verdict(status, &aud(), &allowed()).unwrap_err().label(), "token_review_malformed");
    }

    #[test]
    fn the_request_follows_the_v1_schema() {
        let r = request("tok", &aud());
        let v: serde_json::Value = serde_json::from_slice(&r).unwrap();
        assert_eq!(v["apiVersion"], "authentication.k8s.io/v1");
        assert_eq!(v["kind"], "TokenReview");
        assert_eq!(v["spec"]["token"], "tok");
        assert_eq!(v["spec"]["audiences"][0], "seedgate");
    }

    fn jwt(payload: &str) -> String {
        let e = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        format!("{}.{}.sig", e(r#"{"alg":"RS256"}"#), e(payload))
    }

    #[test]
    fn expiry_is_read_from_any_jwt_and_nothing_else() {
        assert_eq!(expiry(&jwt(r#"{"aud":["seedgate"],"exp":1700000000,"iat":1}"#)), Some(1_700_000_000));
        assert_eq!(expiry(&jwt(r#"{"exp":1700000000.5}"#)), Some(1_700_000_000));
        assert_eq!(expiry(&jwt(r#"{"sub":"x"}"#)), None, "a legacy token without exp");
        assert_eq!(expiry(&jwt(r#"{"exp":"soon"}"#)), None);
        assert_eq!(expiry(&jwt(r#"{"exp":-5}"#)), None);
        assert_eq!(expiry("a.b"), None);
        assert_eq!(expiry("a.!!!.c"), None);
        assert_eq!(expiry("a.b.c.d"), None);
        assert_eq!(expiry(""), None);
        // Cut anywhere before its signature: never a panic, never a value from half a token.
        let t = jwt(r#"{"exp":1700000000}"#);
        for i in 0..=t.rfind('.').unwrap() {
            let cut = t.get(..i).unwrap_or_default();
            assert_eq!(expiry(cut), None, "{cut}");
        }
    }
}
