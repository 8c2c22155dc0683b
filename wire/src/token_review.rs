//! Kubernetes ServiceAccount tokens as proxy-server checks them: the TokenReview request, what the answer's HTTP status and body say (`authentication.k8s.io/v1`), and a token's expiry read without trusting it.
//!
//! The answer comes from the cluster's kube-apiserver; the token comes from an agent and is
//! untrusted. Nothing here believes a token's own claims about who holds it: only the
//! kube-apiserver's review says that. [`expiry`] reads the token's `exp` claim for one use, to
//! know when to review it again; an `exp` that is no time (out of range, negative, not a
//! number) refuses the token.

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
/// Longest text kept from a kube-apiserver's answer (an error, a user name, a message).
const TEXT_MAX: usize = 256;
/// The latest `exp` taken (9999-12-31T23:59:59Z): a later one is no time a kube-apiserver
/// issues a token for, and would not fit a clock.
pub const EXP_MAX: u64 = 253_402_300_799;

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
    /// The kube-apiserver refused the review request, which holds only the token and the
    /// audiences: a `4xx` other than those about proxy-server itself ([`Answered::TokenRefused`]),
    /// e.g. `400` "token is required" for an empty token.
    #[error("the kube-apiserver refused to review the token ({status}): {message}")]
    Rejected { status: u16, message: String },
}

impl Verdict {
    /// The reason label of metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Verdict::Unauthenticated(_) => "token_invalid",
            Verdict::Audience { .. } => "token_audience",
            Verdict::Account(_) => "token_account",
            Verdict::Malformed(_) => "token_review_malformed",
            Verdict::Rejected { .. } => "token_invalid",
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
        return Err(Verdict::Unauthenticated(s.error.chars().take(TEXT_MAX).collect()));
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
        _ => Err(Verdict::Account(s.user.username.chars().take(TEXT_MAX).collect())),
    }
}

/// What the HTTP status of an answer to a review says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answered {
    /// `2xx`: a review; its body has the verdict ([`verdict`]).
    Review,
    /// A `4xx` about the request, which holds only the token and the audiences (`400`, `413`,
    /// `422`, ...): the token is refused ([`Verdict::Rejected`]).
    TokenRefused,
    /// `401` or `403`: the kube-apiserver refuses proxy-server itself, its credentials or their
    /// RBAC (`create` on `tokenreviews`). No word on the token.
    Credentials,
    /// `404` or `405`: no TokenReview API at that URL (it names something else).
    NotFound,
    /// `408`, `429`, `5xx`, or what no kube-apiserver answers (`1xx`, `3xx`): overloaded or
    /// failing. No word on the token; try again later.
    Unavailable,
}

/// What an answer with HTTP `status` says (see [`Answered`]).
pub fn answered(status: u16) -> Answered {
    match status {
        200..=299 => Answered::Review,
        401 | 403 => Answered::Credentials,
        404 | 405 => Answered::NotFound,
        408 | 429 => Answered::Unavailable,
        400..=499 => Answered::TokenRefused,
        _ => Answered::Unavailable,
    }
}

#[derive(Deserialize, Default)]
struct KubeStatus {
    #[serde(default)]
    message: String,
}

/// The `message` of a kube-apiserver's `Status` answer (cut to 256 characters), else the start
/// of the body as text: for logs and refusals, never trusted.
pub fn status_message(body: &[u8]) -> String {
    match serde_json::from_slice::<KubeStatus>(body) {
        Ok(s) if !s.message.is_empty() => s.message.chars().take(TEXT_MAX).collect(),
        _ => String::from_utf8_lossy(body.get(..body.len().min(TEXT_MAX * 4)).unwrap_or_default())
            .chars()
            .take(TEXT_MAX)
            .collect(),
    }
}

#[derive(Deserialize)]
struct Claims {
    exp: Option<serde_json::Value>,
}

/// A token whose `exp` claim is there but is no time: not a number of Unix seconds from 0 to
/// [`EXP_MAX`]. Its text (JSON, cut) says what it was.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the token's exp claim {0} is not a time (Unix seconds from 0 to {EXP_MAX})")]
pub struct BadExpiry(pub String);

/// The `exp` claim (Unix seconds, a fraction dropped) of a JWT, read without verifying its
/// signature: only to know when to review it again. `Ok(None)` for a token that is not a JWT
/// with a JSON payload, or has no `exp`; [`BadExpiry`] for an `exp` that is no time in range.
pub fn expiry(token: &str) -> Result<Option<u64>, BadExpiry> {
    let mut parts = token.split('.');
    let (Some(_header), Some(payload), Some(_sig), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Ok(None);
    };
    if payload.len() > 16 * 1024 {
        return Ok(None);
    }
    let payload = payload.trim_end_matches('=');
    let Ok(json) = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload) else { return Ok(None) };
    let Ok(claims) = serde_json::from_slice::<Claims>(&json) else { return Ok(None) };
    let bad = |v: &serde_json::Value| BadExpiry(v.to_string().chars().take(40).collect());
    match claims.exp {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::Number(n)) => {
            let secs = match (n.as_u64(), n.as_f64()) {
                (Some(u), _) => Some(u),
                // Checked before the cast: `as` would saturate an out-of-range float to a bound.
                (None, Some(f)) if f.is_finite() && (0.0..=EXP_MAX as f64).contains(&f) => Some(f as u64),
                _ => None,
            };
            match secs {
                Some(s) if s <= EXP_MAX => Ok(Some(s)),
                _ => Err(bad(&serde_json::Value::Number(n))),
            }
        }
        Some(other) => Err(bad(&other)),
    }
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
        assert_eq!(expiry(&jwt(r#"{"aud":["seedgate"],"exp":1700000000,"iat":1}"#)), Ok(Some(1_700_000_000)));
        assert_eq!(expiry(&jwt(r#"{"exp":1700000000.5}"#)), Ok(Some(1_700_000_000)));
        assert_eq!(expiry(&jwt(r#"{"exp":0}"#)), Ok(Some(0)));
        assert_eq!(expiry(&jwt(&format!(r#"{{"exp":{EXP_MAX}}}"#))), Ok(Some(EXP_MAX)));
        assert_eq!(expiry(&jwt(r#"{"sub":"x"}"#)), Ok(None), "a legacy token without exp");
        assert_eq!(expiry(&jwt(r#"{"exp":null}"#)), Ok(None));
        assert_eq!(expiry("a.b"), Ok(None));
        assert_eq!(expiry("a.!!!.c"), Ok(None));
        assert_eq!(expiry("a.b.c.d"), Ok(None));
        assert_eq!(expiry(""), Ok(None));
        assert_eq!(expiry(&jwt("not json")), Ok(None));
        // Cut anywhere before its signature: never a panic, never a value from half a token.
        let t = jwt(r#"{"exp":1700000000}"#);
        for i in 0..=t.rfind('.').unwrap() {
            let cut = t.get(..i).unwrap_or_default();
            assert_eq!(expiry(cut), Ok(None), "{cut}");
        }
    }

    /// An `exp` that is there and no time refuses the token: never a panic, never a clamp.
    #[test]
    fn an_exp_out_of_range_is_an_error() {
        for exp in [
            "9223372036854775808",
            "18446744073709551615",
            "18446744073709551616",
            "1e30",
            "-1e30",
            "253402300800",
            "253402300800.5",
            "-5",
            "-0.5",
            "\"soon\"",
            "true",
            "[1]",
            "{}",
        ] {
            let got = expiry(&jwt(&format!(r#"{{"exp":{exp}}}"#)));
            assert!(matches!(&got, Err(BadExpiry(text)) if text.len() <= 40), "exp {exp}: {got:?}");
        }
        let e = expiry(&jwt(r#"{"exp":1e30}"#)).unwrap_err();
        assert_eq!(e.to_string(), "the token's exp claim 1e+30 is not a time (Unix seconds from 0 to 253402300799)");
    }

    #[test]
    fn a_status_says_whose_fault_it_is() {
        let rows = [
            (200, Answered::Review),
            (201, Answered::Review),
            (400, Answered::TokenRefused),
            (413, Answered::TokenRefused),
            (422, Answered::TokenRefused),
            (401, Answered::Credentials),
            (403, Answered::Credentials),
            (404, Answered::NotFound),
            (405, Answered::NotFound),
            (408, Answered::Unavailable),
            (429, Answered::Unavailable),
            (500, Answered::Unavailable),
            (503, Answered::Unavailable),
            (302, Answered::Unavailable),
            (100, Answered::Unavailable),
        ];
        for (status, want) in rows {
            assert_eq!(answered(status), want, "{status}");
        }
        assert_eq!(Verdict::Rejected { status: 400, message: String::new() }.label(), "token_invalid");
    }

    #[test]
    fn a_status_message_is_read_and_cut() {
        let body = br#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"token is required for TokenReview in authentication","reason":"BadRequest","code":400}"#;
        assert_eq!(status_message(body), "token is required for TokenReview in authentication");
        assert_eq!(status_message(b"<html>oops</html>"), "<html>oops</html>");
        assert_eq!(status_message(&[b'x'; 5000]).len(), 256);
        let long = format!(r#"{{"message":"{}"}}"#, "y".repeat(1000));
        assert_eq!(status_message(long.as_bytes()).len(), 256);
        assert_eq!(status_message(&[0xff, 0xfe]), "\u{fffd}\u{fffd}");
    }
}
