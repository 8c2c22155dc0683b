//! A stand-in kube-apiserver for TokenReviews (`authentication.k8s.io/v1`, hyper over TLS): the ServiceAccount tokens it issued, each with its account, audiences and expiry, answered as a real one answers (a `400` "token is required" for an empty token); and the ways a real one fails (refusing proxy-server's credentials, slow, down, any status).
//!
//! Tokens are JWT-shaped (`header.payload.signature`, base64url) with an `exp` claim, as projected
//! ServiceAccount tokens are: proxy-server reads `exp` (without trusting it) to know when to
//! review again. What makes a token valid is only that this stand-in issued it and it has not
//! expired, as with a real issuer's signature.

use crate::backend::serve;
use crate::pki::{self, Ca};
use anyhow::Context as _;
use base64::Engine as _;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use proxy_core::sync::Mutex;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};
use tokio::net::TcpListener;

/// What the stand-in knows of a token it issued.
#[derive(Debug, Clone)]
struct Issued {
    /// `system:serviceaccount:<namespace>:<name>`.
    user: String,
    audiences: Vec<String>,
    expires: SystemTime,
}

#[derive(Default)]
struct State {
    tokens: HashMap<String, Issued>,
    /// Each answer waits this long first.
    delay: Duration,
    /// Connections are closed at once, without an answer.
    down: bool,
    /// The bearer token proxy-server must present (its own credentials).
    bearer: String,
    /// How the reviews were answered, in order: `authenticated`, the error, `400`, `401`, `down`,
    /// or a forced status.
    answers: Vec<String>,
    /// The token of each review asked, in order (`spec.token`).
    asked: Vec<String>,
    /// Every review is answered with this status and body (a `Status` object), whatever it asks.
    forced: Option<(u16, String)>,
}

/// A kube-apiserver that reviews tokens, on 127.0.0.1 with a server certificate of `ca`.
pub struct TokenReviewer {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    reviews: Arc<AtomicU64>,
    ca_file: PathBuf,
    credentials_file: PathBuf,
    serial: AtomicU64,
    _serving: crate::backend::Serving,
}

impl std::fmt::Debug for TokenReviewer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenReviewer").field("addr", &self.addr).finish_non_exhaustive()
    }
}

impl TokenReviewer {
    /// Serve on an ephemeral port with a certificate of `ca` for 127.0.0.1; `dir` gets the CA
    /// file (`<stem>-ca.crt`) and proxy-server's credentials (`<stem>-credentials`).
    pub async fn start(ca: &Ca, dir: &Path, stem: &str) -> anyhow::Result<Self> {
        let id = ca.server(&["127.0.0.1"])?;
        let ca_file = ca.write(dir, &format!("{stem}-ca"))?;
        Self::start_with(&id, ca_file, dir, stem).await
    }

    /// [`TokenReviewer::start`] with a serving certificate that is a CA certificate (a
    /// self-signed CA with 127.0.0.1 among its names), which `<stem>-ca.crt` holds too: what an
    /// operator gets by pointing a kube-apiserver at its CA's own certificate.
    pub async fn start_ca_as_leaf(dir: &Path, stem: &str) -> anyhow::Result<Self> {
        let id = pki::ca_as_server(&format!("{stem}-ca"), &["127.0.0.1"])?;
        let ca_file = dir.join(format!("{stem}-ca.crt"));
        std::fs::write(&ca_file, &id.cert_pem).context("writing the CA")?;
        Self::start_with(&id, ca_file, dir, stem).await
    }

    async fn start_with(id: &pki::Issued, ca_file: PathBuf, dir: &Path, stem: &str) -> anyhow::Result<Self> {
        let cfg = pki::server_config(id, None, &["http/1.1"])?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let bearer = format!("proxy-server-credentials-{stem}-{}", addr.port());
        let credentials_file = dir.join(format!("{stem}-credentials"));
        std::fs::write(&credentials_file, format!("{bearer}\n")).context("writing the credentials")?;
        let state = Arc::new(Mutex::new(State { bearer, ..State::default() }));
        let reviews = Arc::new(AtomicU64::new(0));
        let acceptor = tokio_rustls::TlsAcceptor::from(cfg);
        let (st, rv) = (state.clone(), reviews.clone());
        let serving = serve(listener, Arc::new(AtomicU64::new(0)), move |tcp| {
            let (acceptor, state, reviews) = (acceptor.clone(), st.clone(), rv.clone());
            async move {
                if state.lock().down {
                    state.lock().answers.push("down".into());
                    return;
                }
                let Ok(tls) = acceptor.accept(tcp).await else { return };
                let svc = hyper::service::service_fn(move |req| answer(state.clone(), reviews.clone(), req));
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tls), svc).await;
            }
        });
        Ok(Self { addr, state, reviews, ca_file, credentials_file, serial: AtomicU64::new(1), _serving: serving })
    }

    /// A token of ServiceAccount `account` (`<namespace>/<name>`) for `audiences`, valid for
    /// `ttl`.
    pub fn issue(&self, account: &str, audiences: &[&str], ttl: Duration) -> String {
        let expires = SystemTime::now() + ttl;
        let exp = expires.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        self.issue_with_exp(account, audiences, expires, &exp.to_string())
    }

    /// A token valid until `expires` for this stand-in whose JWT `exp` claim is the JSON text
    /// `exp` (a number out of any range, a float, a string): what a kube-apiserver that signs
    /// whatever it is given would authenticate.
    pub fn issue_with_exp(&self, account: &str, audiences: &[&str], expires: SystemTime, exp: &str) -> String {
        let (ns, name) = account.split_once('/').unwrap_or(("default", account));
        let n = self.serial.fetch_add(1, Ordering::Relaxed);
        let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        let aud: Vec<String> = audiences.iter().map(|a| format!("{a:?}")).collect();
        let payload = format!(
            "{{\"aud\":[{}],\"exp\":{exp},\"iss\":\"https://stand-in\",\"sub\":\"system:serviceaccount:{ns}:{name}\",\"jti\":\"{n}\"}}",
            aud.join(",")
        );
        let token = format!("{}.{}.{}", b64("{\"alg\":\"RS256\"}"), b64(&payload), b64(&format!("signature-{n}")));
        let issued = Issued {
            user: format!("system:serviceaccount:{ns}:{name}"),
            audiences: audiences.iter().map(|a| a.to_string()).collect(),
            expires,
        };
        self.state.lock().tokens.insert(token.clone(), issued);
        token
    }

    /// Forget a token (its ServiceAccount was deleted): reviews of it fail from now on.
    pub fn revoke(&self, token: &str) {
        self.state.lock().tokens.remove(token);
    }

    /// Answer every review only after `d`.
    pub fn set_delay(&self, d: Duration) {
        self.state.lock().delay = d;
    }

    /// Close every new connection at once without an answer (a kube-apiserver that is down).
    pub fn set_down(&self, down: bool) {
        self.state.lock().down = down;
    }

    /// Answer every review with `status` and a `Status` object whose message is `message`
    /// (`None`: review again): a kube-apiserver refusing proxy-server (401, 403), overloaded
    /// (429), failing (5xx), or refusing the request (400, 422).
    pub fn set_status(&self, status: Option<(u16, &str)>) {
        self.state.lock().forced = status.map(|(s, m)| (s, m.to_owned()));
    }

    /// The token of every review asked so far, in order.
    pub fn asked(&self) -> Vec<String> {
        self.state.lock().asked.clone()
    }

    /// Reviews answered (or refused for bad credentials).
    pub fn reviews(&self) -> u64 {
        self.reviews.load(Ordering::Relaxed)
    }

    /// How each review was answered, in order.
    pub fn answers(&self) -> Vec<String> {
        self.state.lock().answers.clone()
    }

    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.addr.port())
    }

    /// A cluster's `token_review` section (flow style) for proxy-server: this URL, its CA and
    /// proxy-server's credentials here, and `extra` keys (e.g. `, service_accounts: [a/b]`).
    pub fn section(&self, extra: &str) -> String {
        format!(
            "{{ url: \"{}\", ca: {}, token_file: {}{extra} }}",
            self.url(),
            self.ca_file.display(),
            self.credentials_file.display()
        )
    }
}

/// Answer one request as a kube-apiserver answers a TokenReview create.
async fn answer(
    state: Arc<Mutex<State>>,
    reviews: Arc<AtomicU64>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, std::io::Error> {
    let delay = state.lock().delay;
    tokio::time::sleep(delay).await;
    if state.lock().down {
        // Down: kept-alive connections break too, without an answer.
        state.lock().answers.push("down".into());
        return Err(std::io::Error::other("down"));
    }
    reviews.fetch_add(1, Ordering::Relaxed);
    let json = |status: StatusCode, v: serde_json::Value| {
        Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(v.to_string())))
            .unwrap_or_default()
    };
    let bearer = req.headers().get("authorization").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let path_ok = req.method() == hyper::Method::POST && req.uri().path() == proxy_wire::token_review::PATH;
    let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let mut st = state.lock();
    if bearer.as_deref() != Some(&format!("Bearer {}", st.bearer)) {
        st.answers.push("401".into());
        return Ok(json(StatusCode::UNAUTHORIZED, kube_status(401, "Unauthorized")));
    }
    if !path_ok {
        st.answers.push("404".into());
        return Ok(json(StatusCode::NOT_FOUND, serde_json::json!({"kind":"Status","code":404})));
    }
    let review: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let token = review["spec"]["token"].as_str().unwrap_or_default();
    st.asked.push(token.to_owned());
    if let Some((code, message)) = st.forced.clone() {
        st.answers.push(code.to_string());
        let status = kube_status(code, &message);
        return Ok(json(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), status));
    }
    // As the kube-apiserver's TokenReview storage: an empty token is a bad request.
    if token.is_empty() {
        st.answers.push("400".into());
        let status = kube_status(400, "token is required for TokenReview in authentication");
        return Ok(json(StatusCode::BAD_REQUEST, status));
    }
    let wanted: Vec<String> = review["spec"]["audiences"]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect())
        .unwrap_or_default();
    // As kube-apiserver's token authenticator: a token for none of the audiences asked for is
    // not authenticated; otherwise the answer names the audiences they share.
    let status = match st.tokens.get(token) {
        None => Err("[invalid bearer token, square/go-jose: error in cryptographic primitive]".to_owned()),
        Some(i) if i.expires <= SystemTime::now() => Err("[invalid bearer token, token has expired]".to_owned()),
        Some(i) => {
            let shared: Vec<&String> = i.audiences.iter().filter(|a| wanted.is_empty() || wanted.contains(a)).collect();
            if shared.is_empty() {
                Err(format!(
                    "[invalid bearer token, token audiences {:?} is invalid for the target audiences {:?}]",
                    i.audiences, wanted
                ))
            } else {
                Ok(serde_json::json!({
                    "authenticated": true,
                    "user": {"username": i.user, "uid": "0000", "groups": ["system:serviceaccounts"]},
                    "audiences": shared,
                }))
            }
        }
    };
    let status = match status {
        Ok(s) => {
            st.answers.push("authenticated".into());
            s
        }
        Err(e) => {
            st.answers.push(e.clone());
            serde_json::json!({"user": {}, "error": e})
        }
    };
    let mut out = serde_json::json!({
        "kind": "TokenReview",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"creationTimestamp": null},
        "status": status,
    });
    out["spec"] = serde_json::json!({"token": "", "audiences": wanted});
    Ok(json(StatusCode::CREATED, out))
}

/// A kube-apiserver's `Status` object for an answer with `code`.
fn kube_status(code: u16, message: &str) -> serde_json::Value {
    let reason = match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        422 => "Invalid",
        429 => "TooManyRequests",
        _ => "InternalError",
    };
    serde_json::json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":message,"reason":reason,"code":code})
}
