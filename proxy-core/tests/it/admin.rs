//! In-process tests of the admin HTTP listener (`proxy_core::obs::admin::serve`): health, metrics, readiness and draining, config, the status page and its token, token-protected control endpoints, body limit, unknown paths, header-read timeout and stop.
//!
//! The server runs on `127.0.0.1:0` with a test `AdminHooks`; requests are written by hand over a
//! TCP stream (HTTP/1.1, `Connection: close`) and the answer is read to EOF. Every wait is bounded.

use proxy_core::obs::admin::{AdminHooks, AdminState, Check, ControlRequest, serve};
use proxy_core::obs::status::{self, Format, Page, StatusPage, StatusQuery, Table, col};
use proxy_core::prometheus::{IntCounter, Registry};
use std::io::{ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Bound on any single wait (real time).
const BOUND: Duration = Duration::from_secs(20);
const TOKEN: &str = "s3cret-admin-token";

async fn within<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(BOUND, fut).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: not done within {BOUND:?}"),
    }
}

/// What a control call saw.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    method: String,
    path: String,
    query: Option<String>,
    body: Vec<u8>,
}

struct Hooks {
    checks: Mutex<Vec<Check>>,
    seen: Mutex<Vec<Seen>>,
    /// Whether the binary has a status page.
    status: Mutex<bool>,
}

/// The test's status page: one table of the document's `rows`.
const PAGE: Page = Page {
    title: "toy",
    summary: &[col("name", "name", Format::Text)],
    tables: &[Table {
        key: "rows",
        title: "Rows",
        row_key: "name",
        state: "state",
        columns: &[col("name", "row", Format::Text), col("state", "state", Format::State)],
        nested: None,
        paged: false,
        empty: "no rows",
    }],
};

impl AdminHooks for Hooks {
    fn ready(&self) -> Vec<Check> {
        self.checks.lock().unwrap().clone()
    }
    fn config(&self) -> serde_json::Value {
        config_json()
    }
    fn control(&self, req: ControlRequest<'_>) -> Option<(http::StatusCode, String)> {
        self.seen.lock().unwrap().push(Seen {
            method: req.method.to_string(),
            path: req.path.to_owned(),
            query: req.query.map(str::to_owned),
            body: req.body.to_vec(),
        });
        match req.path {
            "/control/move" => Some((http::StatusCode::ACCEPTED, format!("moving, {} bytes\n", req.body.len()))),
            _ => None,
        }
    }
    fn status(&self, query: &StatusQuery) -> Option<StatusPage> {
        if !*self.status.lock().unwrap() {
            return None;
        }
        // The filter comes back as a row: what a peer sends, to be escaped.
        let asked = query.get("q").unwrap_or_default();
        let json = serde_json::json!({"version": 1, "name": "toy", "rows": [{"name": asked, "state": "up"}]});
        Some(StatusPage::new(json, &PAGE))
    }
}

fn config_json() -> serde_json::Value {
    serde_json::json!({
        "listeners": [{"name": "https", "port": 443}],
        "admin": {"token_file": "<redacted>"},
        "limits": {"max_connections": 10000}
    })
}

struct Admin {
    addr: SocketAddr,
    hooks: Arc<Hooks>,
    /// `admin.status_requires_token`.
    status_locked: Arc<std::sync::atomic::AtomicBool>,
    draining: CancellationToken,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

async fn start(token: Option<&str>) -> Admin {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let registry = Registry::new();
    let counter = IntCounter::new("seedgate_admin_test_total", "A counter registered by the admin test").unwrap();
    registry.register(Box::new(counter.clone())).unwrap();
    counter.inc_by(3);
    let hooks = Arc::new(Hooks {
        checks: Mutex::new(vec![Check::new("tunnel-a", true, "session up"), Check::new("config", true, "")]),
        seen: Mutex::new(Vec::new()),
        status: Mutex::new(true),
    });
    let (draining, stop) = (CancellationToken::new(), CancellationToken::new());
    let state = AdminState::new(
        registry,
        hooks.clone(),
        Arc::new(proxy_core::sync::RwLock::new(token.map(Arc::from))),
        draining.clone(),
    );
    let status_locked = state.status.requires_token.clone();
    let task = tokio::spawn(serve(listener, state, stop.clone()));
    Admin { addr, hooks, status_locked, draining, stop, task }
}

#[derive(Debug)]
struct Resp {
    status: u16,
    /// Header lines, names lower-cased.
    headers: Vec<(String, String)>,
    body: String,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

fn parse_response(raw: &[u8]) -> Resp {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no complete response head in {text:?}"));
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap();
    let status = status_line.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("{status_line}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Resp { status, headers, body: body.to_owned() }
}

/// Send `raw` on a fresh connection and read the answer to EOF. A reset after the answer has
/// arrived (the server closing with request bytes unread) is tolerated.
async fn send_raw(addr: SocketAddr, raw: &[u8]) -> Resp {
    within("admin request", async {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(raw).await.unwrap();
        let mut got = Vec::new();
        let mut buf = vec![0u8; 8192];
        loop {
            match s.read(&mut buf).await {
                Ok(0) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::ConnectionReset && !got.is_empty() => break,
                Err(e) => panic!("reading the answer: {e}"),
            }
        }
        parse_response(&got)
    })
    .await
}

async fn request(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
    let mut raw = format!("{method} {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n");
    for (n, v) in headers {
        raw.push_str(&format!("{n}: {v}\r\n"));
    }
    if !body.is_empty() || method == "POST" {
        raw.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    raw.push_str("\r\n");
    let mut raw = raw.into_bytes();
    raw.extend_from_slice(body);
    send_raw(addr, &raw).await
}

async fn get(addr: SocketAddr, path: &str) -> Resp {
    request(addr, "GET", path, &[], b"").await
}

#[tokio::test]
async fn healthz_answers_ok() {
    let admin = start(None).await;
    let r = get(admin.addr, "/healthz").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body, "ok\n");
}

#[tokio::test]
async fn metrics_are_served_in_the_text_format_with_registered_metrics() {
    let admin = start(None).await;
    let r = get(admin.addr, "/metrics").await;
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").unwrap().starts_with("text/plain; version=0.0.4"), "{:?}", r.headers);
    assert!(r.body.contains("# TYPE seedgate_admin_test_total counter\n"), "{}", r.body);
    assert!(r.body.contains("\nseedgate_admin_test_total 3\n"), "{}", r.body);
}

#[tokio::test]
async fn readyz_follows_the_checks_and_verbose_lists_each() {
    let admin = start(None).await;
    let r = get(admin.addr, "/readyz").await;
    assert_eq!((r.status, r.body.as_str()), (200, "ok\n"));
    let r = get(admin.addr, "/readyz?verbose").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body, "[+]not-draining ok\n[+]tunnel-a ok: session up\n[+]config ok\nreadyz check passed\n");

    admin.hooks.checks.lock().unwrap().push(Check::new("tunnel-b", false, "not connected"));
    let r = get(admin.addr, "/readyz").await;
    assert_eq!((r.status, r.body.as_str()), (503, "not ready\n"));
    for q in ["verbose", "verbose=1", "x=y&verbose"] {
        let r = get(admin.addr, &format!("/readyz?{q}")).await;
        assert_eq!(r.status, 503, "?{q}");
        assert_eq!(
            r.body,
            "[+]not-draining ok\n[+]tunnel-a ok: session up\n[+]config ok\n[-]tunnel-b failed: not connected\nreadyz check failed\n",
            "?{q}"
        );
    }
    // Recovers as soon as the check passes again.
    admin.hooks.checks.lock().unwrap().pop();
    assert_eq!(get(admin.addr, "/readyz").await.status, 200);
}

#[tokio::test]
async fn information_lines_are_listed_and_never_fail_readiness() {
    let admin = start(None).await;
    admin.hooks.checks.lock().unwrap().push(Check::info("cluster-b", "active: 0 agents"));
    admin.hooks.checks.lock().unwrap().push(Check::info("limits", ""));
    let r = get(admin.addr, "/readyz").await;
    assert_eq!((r.status, r.body.as_str()), (200, "ok\n"));
    let r = get(admin.addr, "/readyz?verbose").await;
    assert_eq!(
        (r.status, r.body.as_str()),
        (
            200,
            "[+]not-draining ok\n[+]tunnel-a ok: session up\n[+]config ok\n[i]cluster-b info: active: 0 agents\n[i]limits info\nreadyz check passed\n"
        )
    );
    // Beside a failing check, the information is still listed and the check still fails.
    admin.hooks.checks.lock().unwrap().push(Check::new("tunnel-b", false, "not connected"));
    let r = get(admin.addr, "/readyz?verbose").await;
    assert_eq!(r.status, 503);
    assert!(
        r.body.contains("[i]cluster-b info: active: 0 agents\n[i]limits info\n[-]tunnel-b failed: not connected\n"),
        "{}",
        r.body
    );
}

#[tokio::test]
async fn readyz_fails_with_draining_once_draining_starts_while_healthz_stays_ok() {
    let admin = start(None).await;
    assert_eq!(get(admin.addr, "/readyz").await.status, 200);
    admin.draining.cancel();
    let r = get(admin.addr, "/readyz").await;
    assert_eq!((r.status, r.body.as_str()), (503, "not ready\n"));
    let r = get(admin.addr, "/readyz?verbose").await;
    assert_eq!(r.status, 503);
    assert!(r.body.starts_with("[-]not-draining failed: draining for shutdown\n"), "{}", r.body);
    assert!(r.body.ends_with("readyz check failed\n"), "{}", r.body);
    // The listener keeps serving while draining.
    assert_eq!(get(admin.addr, "/healthz").await.status, 200);
}

#[tokio::test]
async fn config_returns_the_hooks_json() {
    let admin = start(None).await;
    let r = get(admin.addr, "/config").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(v, config_json());
}

#[tokio::test]
async fn control_is_forbidden_without_a_configured_token() {
    let admin = start(None).await;
    for auth in [None, Some(format!("Bearer {TOKEN}")), Some("Bearer ".to_owned())] {
        let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("Authorization", a.as_str())).collect();
        let r = request(admin.addr, "POST", "/control/move", &headers, b"{}").await;
        assert_eq!(r.status, 403, "{auth:?}");
    }
    assert!(admin.hooks.seen.lock().unwrap().is_empty(), "the hook ran without a token configured");
}

#[tokio::test]
async fn control_needs_the_exact_bearer_token() {
    let admin = start(Some(TOKEN)).await;
    let wrong = [
        None,
        Some("Bearer wrong".to_owned()),
        Some(format!("Bearer {}", &TOKEN[..TOKEN.len() - 1])),
        Some(format!("Bearer {TOKEN}x")),
        Some(format!("Bearer {}X", &TOKEN[..TOKEN.len() - 1])),
        Some(format!("Basic {TOKEN}")),
        Some(TOKEN.to_owned()),
    ];
    for auth in &wrong {
        let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("Authorization", a.as_str())).collect();
        let r = request(admin.addr, "POST", "/control/move", &headers, b"{}").await;
        assert_eq!(r.status, 401, "{auth:?}");
    }
    assert!(admin.hooks.seen.lock().unwrap().is_empty(), "the hook ran for an unauthenticated request");

    let auth = format!("Bearer {TOKEN}");
    let r = request(admin.addr, "POST", "/control/move?now=1", &[("Authorization", &auth)], b"{\"to\":[]}").await;
    assert_eq!((r.status, r.body.as_str()), (202, "moving, 9 bytes\n"));
    let seen = admin.hooks.seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        [Seen {
            method: "POST".into(),
            path: "/control/move".into(),
            query: Some("now=1".into()),
            body: b"{\"to\":[]}".to_vec()
        }]
    );
}

#[tokio::test]
async fn control_path_the_hook_does_not_know_is_404() {
    let admin = start(Some(TOKEN)).await;
    let auth = format!("Bearer {TOKEN}");
    let r = request(admin.addr, "POST", "/control/reboot", &[("Authorization", &auth)], b"").await;
    assert_eq!(r.status, 404);
    assert_eq!(admin.hooks.seen.lock().unwrap().len(), 1, "the hook was asked");
}

#[tokio::test]
async fn control_body_over_64_kib_is_413_and_up_to_64_kib_is_passed_on() {
    let admin = start(Some(TOKEN)).await;
    let auth = format!("Bearer {TOKEN}");
    let r = request(admin.addr, "POST", "/control/move", &[("Authorization", &auth)], &vec![b'x'; 64 * 1024 + 1]).await;
    assert_eq!(r.status, 413);
    assert!(admin.hooks.seen.lock().unwrap().is_empty(), "the hook ran with an oversized body");
    let r = request(admin.addr, "POST", "/control/move", &[("Authorization", &auth)], &vec![b'x'; 64 * 1024]).await;
    assert_eq!((r.status, r.body.as_str()), (202, "moving, 65536 bytes\n"));
}

#[tokio::test]
async fn the_status_page_and_its_json_are_served_with_the_csp() {
    let admin = start(None).await;
    let r = get(admin.addr, "/status?q=a%20b").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("content-security-policy"), Some(status::CSP));
    assert_eq!(r.header("cache-control"), Some("no-store"));
    let doc: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(doc["rows"][0]["name"], "a b", "the query reaches the hook decoded");

    let r = get(admin.addr, "/?q=%3Cscript%3Ealert(1)%3C/script%3E").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
    assert_eq!(r.header("content-security-policy"), Some(status::CSP));
    assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
    assert!(
        r.body.contains("<tbody data-row=\"&lt;script&gt;alert(1)&lt;/script&gt;\" class=\"st-up\">"),
        "{}",
        r.body
    );
    assert!(!r.body.contains("<script>alert"), "{}", r.body);

    for (path, kind, body) in
        [("/status.js", "text/javascript", status::SCRIPT), ("/status.css", "text/css", status::STYLE)]
    {
        let r = get(admin.addr, path).await;
        assert_eq!(r.status, 200, "{path}");
        assert!(r.header("content-type").unwrap().starts_with(kind), "{path}: {:?}", r.headers);
        assert_eq!(r.body, body, "{path}");
    }

    // A binary without a status page.
    *admin.hooks.status.lock().unwrap() = false;
    assert_eq!(get(admin.addr, "/status").await.status, 404);
    assert_eq!(get(admin.addr, "/").await.status, 404);
}

#[tokio::test]
async fn with_status_requires_token_the_page_takes_the_token_as_bearer_or_as_basic_password() {
    let basic = |user: &str, password: &str| format!("Basic {}", proxy_wire::proxy_auth::encode_basic(user, password));
    let bearer = format!("Bearer {TOKEN}");
    let open = start(None).await;
    open.status_locked.store(true, std::sync::atomic::Ordering::Relaxed);
    let r = get(open.addr, "/status").await;
    assert_eq!(r.status, 403, "no token configured: nobody may read it");
    assert!(r.body.contains("admin.token_file"), "{}", r.body);

    let admin = start(Some(TOKEN)).await;
    assert_eq!(get(admin.addr, "/status").await.status, 200, "open unless asked");
    admin.status_locked.store(true, std::sync::atomic::Ordering::Relaxed);
    for path in ["/status", "/"] {
        let r = get(admin.addr, path).await;
        assert_eq!(r.status, 401, "{path}");
        assert_eq!(r.header("www-authenticate"), Some("Basic realm=\"seedgate admin\", charset=\"UTF-8\""));
        for (how, value, want) in [
            ("bearer", bearer.as_str(), 200),
            ("basic, any user", basic("me", TOKEN).as_str(), 200),
            ("basic, no user", basic("", TOKEN).as_str(), 200),
            ("basic, wrong password", basic("me", "s3cret-admin-toke").as_str(), 401),
            ("the token as user name", basic(TOKEN, "").as_str(), 401),
            ("bearer, wrong", "Bearer s3cret-admin-token-", 401),
        ] {
            let r = request(admin.addr, "GET", path, &[("Authorization", value)], b"").await;
            assert_eq!(r.status, want, "{path}, {how}");
        }
    }
    assert_eq!(get(admin.addr, "/status.css").await.status, 200, "the assets hold no data");
    // Basic credentials open the status page only: the endpoints that change state want the bearer token.
    let r = request(admin.addr, "POST", "/control/move", &[("Authorization", &basic("me", TOKEN))], b"{}").await;
    assert_eq!(r.status, 401);
}

#[tokio::test]
async fn unknown_paths_and_methods_are_404() {
    let admin = start(Some(TOKEN)).await;
    for (method, path) in
        [("POST", "/"), ("GET", "/nope"), ("POST", "/healthz"), ("DELETE", "/metrics"), ("GET", "/control")]
    {
        let r = request(admin.addr, method, path, &[], b"").await;
        assert_eq!(r.status, 404, "{method} {path}");
    }
    assert!(admin.hooks.seen.lock().unwrap().is_empty());
}

/// A client that stops in the middle of a request head is cut off by the header-read timeout
/// (10 s). The client runs on a plain thread with a real-time read timeout as the bound; the
/// runtime's clock is paused once the server waits for the second head, so the server's timer
/// fires as soon as the runtime idles.
#[tokio::test]
async fn a_connection_that_never_completes_its_head_is_closed_by_the_header_timeout() {
    let admin = start(None).await;
    let addr = admin.addr;
    let t0 = tokio::time::Instant::now();
    let (first_tx, first_rx) = tokio::sync::oneshot::channel();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(BOUND)).unwrap();
        // A complete first request on a kept-alive connection: the server is then waiting for
        // the next head.
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: admin\r\n\r\n").unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while !got.ends_with(b"ok\n") {
            let n = s.read(&mut buf).expect("first response");
            assert!(n > 0, "connection closed after the first request");
            got.extend_from_slice(&buf[..n]);
        }
        let _ = first_tx.send(parse_response(&got).status);
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: adm").unwrap();
        let end = loop {
            match s.read(&mut buf) {
                Ok(0) => break Ok(()),
                Ok(_) => continue, // an error answer before the close is fine
                Err(e) if e.kind() == ErrorKind::ConnectionReset => break Ok(()),
                Err(e) => break Err(e.to_string()),
            }
        };
        let _ = done_tx.send(end);
    });
    assert_eq!(first_rx.await.expect("first response read"), 200);
    tokio::time::pause();
    let end = done_rx.await.expect("client thread finished");
    assert_eq!(end, Ok(()), "the stalled connection was not closed");
    assert!(t0.elapsed() >= Duration::from_secs(10), "closed before the header timeout: {:?}", t0.elapsed());
}

#[tokio::test]
async fn stop_ends_serve_and_closes_open_connections() {
    let admin = start(None).await;
    // A kept-alive connection with one request done.
    let mut s = TcpStream::connect(admin.addr).await.unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: admin\r\n\r\n").await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    within("first response", async {
        while !got.ends_with(b"ok\n") {
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "connection closed after the first request");
            got.extend_from_slice(&buf[..n]);
        }
    })
    .await;
    admin.stop.cancel();
    within("serve returns", admin.task).await.unwrap();
    let r = within("open connection closed", s.read(&mut buf)).await;
    assert!(matches!(r, Ok(0)) || r.as_ref().is_err_and(|e| e.kind() == ErrorKind::ConnectionReset), "{r:?}");
    let c = TcpStream::connect(admin.addr).await;
    assert!(c.is_err(), "the listener still accepts after stop");
}
