//! The admin HTTP listener: `/metrics`, `/healthz`, `/readyz[?verbose]`, `/config`, the status page (`/status`, `/`), and authenticated control endpoints.

use crate::obs::status::{self, StatusPage, StatusQuery};
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use prometheus::Registry;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// One line of `/readyz?verbose`: a check that passes or fails readiness, or information.
#[derive(Debug, Clone)]
pub struct Check {
    pub name: String,
    pub status: Status,
    pub detail: String,
}

/// What a [`Check`] says about readiness.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// A condition of readiness, met: `[+]name ok: detail`.
    Pass,
    /// A condition of readiness, not met: `[-]name failed: detail`; the process is not ready.
    Fail,
    /// Listed for operators, never a condition of readiness: `[i]name info: detail`. For what a
    /// process reports but should not be taken out of service for (a tenant's state, a limit
    /// reached, a peer's fault).
    Info,
}

impl Check {
    /// A condition of readiness, met when `ok`.
    pub fn new(name: impl Into<String>, ok: bool, detail: impl Into<String>) -> Self {
        let status = if ok { Status::Pass } else { Status::Fail };
        Self { name: name.into(), status, detail: detail.into() }
    }

    /// A line that informs and never fails readiness.
    pub fn info(name: impl Into<String>, detail: impl Into<String>) -> Self {
        Self { name: name.into(), status: Status::Info, detail: detail.into() }
    }

    /// Whether this line lets the process be ready.
    pub fn ok(&self) -> bool {
        self.status != Status::Fail
    }

    /// The line `/readyz?verbose` shows.
    pub fn line(&self) -> String {
        let (mark, word) = match self.status {
            Status::Pass => ("+", "ok"),
            Status::Fail => ("-", "failed"),
            Status::Info => ("i", "info"),
        };
        match self.detail.is_empty() {
            true => format!("[{mark}]{} {word}", self.name),
            false => format!("[{mark}]{} {word}: {}", self.name, self.detail),
        }
    }
}

/// A control request that passed authentication.
pub struct ControlRequest<'a> {
    pub method: &'a Method,
    pub path: &'a str,
    pub query: Option<&'a str>,
    pub body: &'a [u8],
}

/// What a binary plugs into its admin listener.
pub trait AdminHooks: Send + Sync + 'static {
    /// Readiness checks and information lines; the process is ready when no check fails.
    fn ready(&self) -> Vec<Check>;
    /// The running config with secrets redacted.
    fn config(&self) -> serde_json::Value;
    /// State-changing endpoints (under `/control/`), called only with a valid bearer token.
    /// `None` means "no such endpoint" (404).
    fn control(&self, _req: ControlRequest<'_>) -> Option<(StatusCode, String)> {
        None
    }
    /// The status document and page (`/status`, `/`) for `query`; `None`: this binary has none
    /// (404). Called off the runtime's workers (it may take milliseconds at thousands of rows).
    fn status(&self, _query: &StatusQuery) -> Option<StatusPage> {
        None
    }
}

/// The bearer token of `/control/` (`admin.token_file`), replaced when a reload reads a new one.
pub type Token = Arc<crate::sync::RwLock<Option<Arc<str>>>>;

/// Everything the admin listener serves from.
#[derive(Clone)]
pub struct AdminState {
    pub registry: Registry,
    pub hooks: Arc<dyn AdminHooks>,
    /// Bearer token for `/control/`; without one those endpoints answer 403. Swapped on reload.
    pub token: Token,
    /// Cancelled when the process drains: `/readyz` then fails so load balancers move away.
    pub draining: CancellationToken,
    /// Who may read the status page, and how many pages are made at once.
    pub status: StatusAccess,
}

impl AdminState {
    /// The state of an admin listener whose status page is open to anyone who reaches it.
    pub fn new(registry: Registry, hooks: Arc<dyn AdminHooks>, token: Token, draining: CancellationToken) -> Self {
        Self { registry, hooks, token, draining, status: StatusAccess::default() }
    }
}

/// Status pages made at once; a request beyond waits up to [`STATUS_WAIT`] for its turn.
const STATUS_AT_ONCE: usize = 2;
/// How long a status request waits for its turn before it is answered 503.
const STATUS_WAIT: Duration = Duration::from_secs(5);

/// Who may read `/status` and `/` (`admin.status_requires_token`, set on reload), and the turns
/// that bound how many are made at once.
#[derive(Clone)]
pub struct StatusAccess {
    /// The admin token is required, as for `/control/`.
    pub requires_token: Arc<AtomicBool>,
    turns: Arc<tokio::sync::Semaphore>,
}

impl Default for StatusAccess {
    fn default() -> Self {
        Self {
            requires_token: Arc::new(AtomicBool::new(false)),
            turns: Arc::new(tokio::sync::Semaphore::new(STATUS_AT_ONCE)),
        }
    }
}

const MAX_BODY: usize = 64 * 1024;
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Serve admin requests on `listener` until `stop` is cancelled. The admin listener keeps
/// answering while the data plane drains, so `/readyz` can report the drain.
pub async fn serve(listener: TcpListener, state: AdminState, stop: CancellationToken) {
    loop {
        let (stream, _) = tokio::select! {
            _ = stop.cancelled() => return,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::debug!(error = %e, "admin accept error");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let state = state.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let state = state.clone();
                async move { Ok::<_, std::convert::Infallible>(handle(&state, req).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), svc);
            tokio::select! {
                _ = conn => {}
                _ = stop.cancelled() => {}
            }
        });
    }
}

/// Bind the admin address (a plain tokio listener: admin traffic needs no tuning).
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", "text/plain; charset=utf-8")
        .body(Full::new(body.into()))
        .expect("valid response")
}

fn authorized(token: Option<&str>, req: &Request<Incoming>) -> bool {
    let Some(token) = token else { return false };
    let Some(given) = req.headers().get("authorization").and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let Some(given) = given.strip_prefix("Bearer ") else { return false };
    same(given.as_bytes(), token.as_bytes())
}

/// Compare without an early exit so the time taken does not reveal the matching prefix.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether a status request carries the admin token: as a bearer token (scripts, `curl`), or as
/// the password of Basic credentials (what a browser sends after its login prompt; any user name).
fn status_authorized(token: Option<&str>, req: &Request<Incoming>) -> bool {
    let Some(t) = token else { return false };
    if authorized(token, req) {
        return true;
    }
    let Some(given) = req.headers().get("authorization").and_then(|v| v.to_str().ok()) else { return false };
    let Some(basic) = given.strip_prefix("Basic ") else { return false };
    proxy_wire::proxy_auth::basic(basic.as_bytes()).is_ok_and(|c| same(c.password.as_bytes(), t.as_bytes()))
}

/// A response for the status page: no caching, no sniffing, no referrer, and the page's CSP.
fn status_response(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .header("cache-control", "no-store")
        .header("x-content-type-options", "nosniff")
        .header("referrer-policy", "no-referrer")
        .header("content-security-policy", status::CSP)
        .body(Full::new(body.into()))
        .expect("valid response")
}

/// `/status` (JSON) or `/` (the page): made off the runtime's workers, a few at a time.
async fn serve_status(
    state: &AdminState,
    req: &Request<Incoming>,
    query: Option<&str>,
    html: bool,
) -> Response<Full<Bytes>> {
    if state.status.requires_token.load(Ordering::Relaxed) {
        let token = state.token.read().clone();
        if token.is_none() {
            return text(StatusCode::FORBIDDEN, "the status page needs the admin token: set admin.token_file\n");
        }
        if !status_authorized(token.as_deref(), req) {
            let mut r = text(
                StatusCode::UNAUTHORIZED,
                "the status page needs the admin token: Authorization: Bearer <token>, or Basic with the token as password\n",
            );
            r.headers_mut().insert(
                "www-authenticate",
                http::HeaderValue::from_static("Basic realm=\"seedgate admin\", charset=\"UTF-8\""),
            );
            return r;
        }
    }
    let Ok(Ok(_turn)) = tokio::time::timeout(STATUS_WAIT, state.status.turns.clone().acquire_owned()).await else {
        return text(StatusCode::SERVICE_UNAVAILABLE, "busy making other status pages; try again\n");
    };
    let hooks = state.hooks.clone();
    let query = StatusQuery::parse(query);
    let made = tokio::task::spawn_blocking(move || {
        let page = hooks.status(&query)?;
        Some(match html {
            true => status::render(page.page, &page.doc.to_tree(), &query),
            false => page.doc.to_json() + "\n",
        })
    })
    .await;
    match made {
        Ok(Some(body)) if html => status_response(StatusCode::OK, "text/html; charset=utf-8", body),
        Ok(Some(body)) => status_response(StatusCode::OK, "application/json", body),
        Ok(None) => text(StatusCode::NOT_FOUND, "this binary has no status page\n"),
        Err(_) => text(StatusCode::INTERNAL_SERVER_ERROR, "making the status failed\n"),
    }
}

async fn handle(state: &AdminState, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_owned();
    let query = req.uri().query().map(str::to_owned);
    match (req.method(), path.as_str()) {
        (&Method::GET, "/metrics") => Response::builder()
            .header("content-type", "text/plain; version=0.0.4; charset=utf-8")
            .body(Full::new(Bytes::from(crate::obs::metrics::render(&state.registry))))
            .expect("valid response"),
        (&Method::GET, "/healthz") => text(StatusCode::OK, "ok\n"),
        (&Method::GET, "/status") => serve_status(state, &req, query.as_deref(), false).await,
        (&Method::GET, "/") => serve_status(state, &req, query.as_deref(), true).await,
        (&Method::GET, "/status.js") => {
            status_response(StatusCode::OK, "text/javascript; charset=utf-8", status::SCRIPT)
        }
        (&Method::GET, "/status.css") => status_response(StatusCode::OK, "text/css; charset=utf-8", status::STYLE),
        (&Method::GET, "/readyz") => {
            let mut checks = state.hooks.ready();
            checks.insert(
                0,
                Check::new(
                    "not-draining",
                    !state.draining.is_cancelled(),
                    if state.draining.is_cancelled() { "draining for shutdown" } else { "" },
                ),
            );
            let ok = checks.iter().all(Check::ok);
            let status = if ok { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
            let verbose =
                query.as_deref().is_some_and(|q| q.split('&').any(|kv| kv == "verbose" || kv.starts_with("verbose=")));
            if verbose {
                let mut body = String::new();
                for c in &checks {
                    body.push_str(&c.line());
                    body.push('\n');
                }
                body.push_str(if ok { "readyz check passed\n" } else { "readyz check failed\n" });
                text(status, body)
            } else {
                text(status, if ok { "ok\n" } else { "not ready\n" })
            }
        }
        (&Method::GET, "/config") => {
            let body = serde_json::to_string_pretty(&state.hooks.config()).unwrap_or_default();
            Response::builder()
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(body + "\n")))
                .expect("valid response")
        }
        (_, p) if p.starts_with("/control/") => {
            let token = state.token.read().clone();
            if token.is_none() {
                return text(StatusCode::FORBIDDEN, "control endpoints are disabled: set admin.token_file\n");
            }
            if !authorized(token.as_deref(), &req) {
                return text(StatusCode::UNAUTHORIZED, "missing or wrong bearer token\n");
            }
            let method = req.method().clone();
            let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
                Ok(b) => b.to_bytes(),
                Err(_) => return text(StatusCode::PAYLOAD_TOO_LARGE, "body too large or unreadable\n"),
            };
            match state.hooks.control(ControlRequest {
                method: &method,
                path: &path,
                query: query.as_deref(),
                body: &body,
            }) {
                Some((status, msg)) => text(status, msg),
                None => text(StatusCode::NOT_FOUND, "no such control endpoint\n"),
            }
        }
        _ => text(StatusCode::NOT_FOUND, "not found; try / /status /metrics /healthz /readyz /config\n"),
    }
}

/// Read the admin bearer token from `admin.token_file` (trailing whitespace trimmed).
pub fn load_token(file: Option<&str>) -> std::io::Result<Option<Arc<str>>> {
    match file {
        None => Ok(None),
        Some(f) => {
            let t = std::fs::read_to_string(f)?;
            let t = t.trim();
            if t.is_empty() {
                return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{f} is empty")));
            }
            Ok(Some(Arc::from(t)))
        }
    }
}
