//! The status page of every binary (`GET /status`, `GET /`) against a live topology — agents through sni-router to proxy-server, one agent naming its node with markup and script — over plain HTTP (the document's fields, paging and filters, escaping, the CSP, the token) and in headless Chromium (the tables, a session turning suspect within a refresh, sorting and filtering, no console error, no alert, screenshots).
//!
//! The browser test needs Debian's `chromium` and `chromium-driver` (`.ci/run` installs them);
//! without them it says so and passes. `SEEDGATE_SCREENSHOTS=<dir>` keeps its screenshots there
//! (the documentation's come from `SEEDGATE_SCREENSHOTS=docs/images`).

use anyhow::Context as _;
use serde_json::Value;
use std::net::SocketAddr;
use std::time::Duration;
use testbed::admin::http_get_with;
use testbed::proc::Proc;
use testbed::tunnel_kit::{
    AgentOpts, Dialer, Fe, FeKind, SERVER_NAME, TunnelPki, agent_yaml, connect, echo_line, inproc_agent, inproc_server,
    refusal_of, server_yaml, start_agent, wait_agents,
};
use testbed::webdriver::Browser;
use testbed::{InProc, TcpEcho, TempDir, http_get, poll_until};

/// What one agent says its node is: markup and script, which every page must show as text.
const EVIL: &str = "<img src=x onerror=alert(1)><script>alert(\"node\")</script>";
const TOKEN: &str = "status-page-token";
/// Both ends: a silent path makes a session suspect within a second; nothing dies of it here.
const KEEPALIVE: &str = "keepalive: { interval: 200ms, suspect_after: 1s, timeout: 60s }";
const KIT_KEEPALIVE: &str = "keepalive: { interval: 500ms, suspect_after: 2s, timeout: 2s }";
const WAIT: Duration = Duration::from_secs(20);
const TICK: Duration = Duration::from_millis(50);

/// The evil agent: in process, or as a process (to stop it with SIGSTOP).
enum Evil {
    InProc(InProc),
    Proc(Proc),
}

/// proxy-server with two front ends (shoot-a, whose two agents come through sni-router, and
/// shoot-b, which has none), the router, and the agents.
struct World {
    dir: TempDir,
    server: InProc,
    server_yaml: String,
    router: InProc,
    evil: Evil,
    live: InProc,
    echo: TcpEcho,
    egress: SocketAddr,
    egress_b: SocketAddr,
}

impl World {
    fn server_admin(&self) -> SocketAddr {
        self.server.admin().expect("admin")
    }

    fn logs(&self) -> String {
        let evil = match &self.evil {
            Evil::InProc(p) => p.log(),
            Evil::Proc(p) => p.log(),
        };
        format!(
            "--- server:\n{}\n--- router:\n{}\n--- evil agent:\n{evil}\n--- live agent:\n{}",
            self.server.log(),
            self.router.log(),
            self.live.log()
        )
    }
}

async fn world(label: &str, evil_as_process: bool) -> anyhow::Result<World> {
    let dir = TempDir::new(label)?;
    let pki = TunnelPki::new(dir.path())?;
    let token = dir.write("admin-token", TOKEN)?;
    let fes = [Fe::new("egress", "shoot-a", FeKind::Plain), Fe::new("egress-b", "shoot-b", FeKind::Plain)];
    let server_yaml = server_yaml(&pki, "127.0.0.1:0", &fes, "").replace(KIT_KEEPALIVE, KEEPALIVE).replace(
        "admin: { listen: 127.0.0.1:0 }",
        &format!("admin: {{ listen: 127.0.0.1:0, token_file: {} }}", token.display()),
    );
    let (server, saddrs) = inproc_server(&dir, &server_yaml).await?;
    let router_yaml = format!(
        "admin: {{ listen: 127.0.0.1:0 }}\nlisteners:\n  - name: gateway\n    listen: 127.0.0.1:0\n    routes:\n      - name: tunnel\n        sni: [{SERVER_NAME}]\n        upstreams: [{}]\n",
        saddrs.listener("agents")?
    );
    let (router, raddrs) = InProc::serve(&dir, "sni-router", &router_yaml).await?;
    let gateway = raddrs.listener("gateway")?;

    let mut o = AgentOpts::new("shoot-a", gateway, &["127.0.0.1/32"]);
    o.node_name = format!("'{EVIL}'");
    let evil_yaml = agent_yaml(&pki, &o)?.replace(KIT_KEEPALIVE, KEEPALIVE);
    let evil = match evil_as_process {
        true => Evil::Proc(start_agent(&dir, "agent-evil", &evil_yaml, None).await?.0),
        false => Evil::InProc(inproc_agent(&dir, &evil_yaml).await?.0),
    };
    o.node_name = "node-live".into();
    let (live, _) = inproc_agent(&dir, &agent_yaml(&pki, &o)?.replace(KIT_KEEPALIVE, KEEPALIVE)).await?;
    let echo = TcpEcho::start().await?;
    let w = World {
        dir,
        server,
        server_yaml,
        router,
        evil,
        live,
        echo,
        egress: saddrs.listener("egress")?,
        egress_b: saddrs.listener("egress-b")?,
    };
    wait_agents(w.server_admin(), "shoot-a", 2.0).await.with_context(|| w.logs())?;
    // Their hellos (which name their nodes) follow the sessions on the control stream.
    poll_until(WAIT, TICK, || async {
        let doc = json(w.server_admin(), "/status?cluster=shoot-a").await?;
        let nodes: Vec<&Value> =
            doc["clusters"][0]["sessions"].as_array().context("sessions")?.iter().map(|s| &s["node"]).collect();
        anyhow::ensure!(
            nodes.contains(&&Value::from(EVIL)) && nodes.contains(&&Value::from("node-live")),
            "nodes so far: {nodes:?}"
        );
        Ok(())
    })
    .await
    .with_context(|| w.logs())?;
    Ok(w)
}

/// `GET path` of `admin` as JSON (answered 200).
async fn json(admin: SocketAddr, path: &str) -> anyhow::Result<Value> {
    let (code, body) = http_get(admin, path).await?;
    anyhow::ensure!(code == 200, "{path} answered {code}: {body}");
    serde_json::from_str(&body).with_context(|| format!("{path}: {body}"))
}

fn cluster<'a>(doc: &'a Value, name: &str) -> Option<&'a Value> {
    doc["clusters"].as_array()?.iter().find(|c| c["name"] == name)
}

fn sum(v: &Value) -> u64 {
    v.as_array().map_or(0, |a| a.iter().filter_map(Value::as_u64).sum())
}

/// Dials that the page counts: one served for shoot-a, one refused for shoot-b (no agent).
async fn dial_both(w: &World) -> anyhow::Result<()> {
    echo_line(&Dialer::Tcp(w.egress), w.echo.addr()).await.with_context(|| w.logs())?;
    let refused = connect(&Dialer::Tcp(w.egress_b), &w.echo.addr().to_string()).await;
    let e = refused.err().context("shoot-b has no agent: its dial must be refused")?;
    anyhow::ensure!(refusal_of(&e).is_some_and(|r| r.status == 503), "{e:#}");
    Ok(())
}

#[tokio::test]
async fn the_status_document_paging_escaping_csp_and_token_over_plain_http() -> anyhow::Result<()> {
    let w = world("status-http", false).await?;
    let admin = w.server_admin();
    dial_both(&w).await?;

    // proxy-server's document: its clusters, sessions (what the agent sent, as it sent it), dials.
    let doc = poll_until(WAIT, TICK, || async {
        let doc = json(admin, "/status").await?;
        let a = cluster(&doc, "shoot-a").context("no shoot-a")?;
        let moved: u64 =
            a["sessions"].as_array().context("sessions")?.iter().filter_map(|s| s["bytes_to_shoot"].as_u64()).sum();
        anyhow::ensure!(moved >= 5, "the echo stream's bytes are not on its session yet: {a}");
        Ok(doc)
    })
    .await
    .with_context(|| w.logs())?;
    assert_eq!(doc["version"], 1);
    assert_eq!(doc["binary"], "proxy-server");
    assert!(doc["generated_at_ms"].as_u64().is_some_and(|t| t > 0));
    assert_eq!(doc["totals"]["clusters"], 2);
    assert_eq!(doc["totals"]["sessions"], 2);
    assert_eq!(doc["totals"]["clusters_without_agents"], 1);
    assert_eq!(doc["page"]["total"], 2);
    let a = cluster(&doc, "shoot-a").context("shoot-a")?;
    assert_eq!(
        (&a["state"], &a["health"], &a["sessions_here"]),
        (&Value::from("active"), &Value::from("up"), &Value::from(2))
    );
    assert!(sum(&a["dials"]["ok"]) >= 1, "{a}");
    let sessions = a["sessions"].as_array().context("sessions")?;
    let evil =
        sessions.iter().find(|s| s["node"] == EVIL).with_context(|| format!("no session names {EVIL:?}: {a}"))?;
    assert_eq!((&evil["standing"], &evil["transport"]), (&Value::from("active"), &Value::from("h2")));
    assert_eq!(evil["replica"], doc["replica"]["id"]);
    assert!(sessions.iter().any(|s| s["node"] == "node-live"));
    let b = cluster(&doc, "shoot-b").context("shoot-b")?;
    assert_eq!((&b["health"], &b["sessions_here"]), (&Value::from("no-agents"), &Value::from(0)));
    assert!(sum(&b["dials"]["no_agent"]) >= 1, "{b}");
    assert_eq!(sum(&b["dials"]["no_agent"]), sum(&b["dials_failed"]));
    let fe =
        doc["frontends"].as_array().and_then(|f| f.iter().find(|f| f["name"] == "egress-b")).context("egress-b")?;
    assert_eq!(fe["kind"], "http-connect");
    assert!(fe["refusals"]["no_agent"].as_u64().is_some_and(|n| n >= 1), "{fe}");
    assert!(doc["token_reviews"]["cache_size"].as_u64().is_some());

    // Paging and filters: totals whatever the page holds.
    let one = json(admin, "/status?limit=1").await?;
    assert_eq!((one["clusters"].as_array().map(Vec::len), &one["page"]["matched"]), (Some(1), &Value::from(2)));
    assert_eq!(one["clusters"][0]["name"], "shoot-a");
    let next = json(admin, "/status?limit=1&offset=1").await?;
    assert_eq!(next["clusters"][0]["name"], "shoot-b");
    let only_b = json(admin, "/status?cluster=shoot-b").await?;
    assert_eq!(
        (only_b["clusters"].as_array().map(Vec::len), &only_b["totals"]["clusters"]),
        (Some(1), &Value::from(2))
    );
    let by_node = json(admin, "/status?q=onerror%3Dalert").await?;
    let names: Vec<&Value> = by_node["clusters"].as_array().context("clusters")?.iter().map(|c| &c["name"]).collect();
    assert_eq!(names, [&Value::from("shoot-a")], "a node name finds its cluster");

    // The page: escaped, with its CSP; its assets from the binary.
    let page = http_get_with(admin, "/", &[]).await?;
    assert_eq!(page.status, 200);
    assert_eq!(page.header("content-type"), Some("text/html; charset=utf-8"));
    assert_eq!(page.header("content-security-policy"), Some(proxy_core::obs::status::CSP));
    assert_eq!(page.header("x-content-type-options"), Some("nosniff"));
    assert!(!page.body.contains(EVIL) && !page.body.contains("<img"), "markup from an agent reached the page");
    assert!(
        page.body.contains("&lt;img src=x onerror=alert(1)&gt;&lt;script&gt;alert(&quot;node&quot;)&lt;/script&gt;")
    );
    assert!(page.body.contains("<tbody data-row=\"shoot-b\" class=\"st-down\">"), "shoot-b has no agent: red");
    assert!(page.body.contains("<tbody data-row=\"shoot-a\" class=\"st-up\">"));
    let filtered = http_get_with(admin, "/?cluster=shoot-b", &[]).await?;
    assert!(!filtered.body.contains("data-row=\"shoot-a\""), "the page takes the same filters");
    for (path, kind) in [("/status.js", "text/javascript"), ("/status.css", "text/css")] {
        let a = http_get_with(admin, path, &[]).await?;
        assert_eq!(a.status, 200);
        assert!(a.header("content-type").is_some_and(|t| t.starts_with(kind)), "{path}: {:?}", a.headers);
    }

    // sni-router's document: its listener and the route the two agents' sessions hold.
    let rdoc = json(w.router.admin()?, "/status").await?;
    assert_eq!(rdoc["binary"], "sni-router");
    assert_eq!(rdoc["listeners"][0]["name"], "gateway");
    let route = &rdoc["routes"][0];
    assert_eq!(
        (&route["name"], &route["health"], &route["connections"]),
        (&Value::from("tunnel"), &Value::from("up"), &Value::from(2))
    );
    assert!(sum(&route["routed"]) >= 2, "{route}");
    assert!(rdoc["listeners"][0]["since_reload_s"].as_u64().is_some());
    assert!(json(w.router.admin()?, "/status?route=none").await?["routes"].as_array().is_some_and(Vec::is_empty));

    // proxy-agent's document: the server name through the router, the replica its slot holds.
    let Evil::InProc(evil) = &w.evil else { unreachable!("in process here") };
    let adoc = json(evil.admin()?, "/status").await?;
    assert_eq!((&adoc["binary"], &adoc["agent"]["node"]), (&Value::from("proxy-agent"), &Value::from(EVIL)));
    let slot = &adoc["servers"][0]["slots"][0];
    assert_eq!((&slot["state"], &slot["transport"]), (&Value::from("connected"), &Value::from("h2")), "{adoc}");
    assert_eq!(slot["replica"], doc["replica"]["id"]);
    let agent_page = http_get_with(evil.admin()?, "/", &[]).await?;
    assert!(!agent_page.body.contains("<img") && agent_page.body.contains("&lt;img src=x"));

    // With `admin.status_requires_token`: the token as a bearer token, or as Basic's password.
    let locked = w.server_yaml.replace("token_file:", "status_requires_token: true, token_file:");
    w.server.reload_with(&locked).await?;
    w.server.wait_reloads(admin, "success", 1.0).await?;
    let basic = |user: &str, password: &str| format!("Basic {}", proxy_wire::proxy_auth::encode_basic(user, password));
    let refused = http_get_with(admin, "/status", &[]).await?;
    assert_eq!(refused.status, 401);
    assert_eq!(refused.header("www-authenticate"), Some("Basic realm=\"seedgate admin\", charset=\"UTF-8\""));
    let bearer = format!("Bearer {TOKEN}");
    for (how, value, want) in [
        ("bearer", bearer.as_str(), 200),
        ("basic", &basic("operator", TOKEN), 200),
        ("wrong basic", &basic("operator", "guess"), 401),
        ("wrong bearer", "Bearer guess", 401),
    ] {
        let a = http_get_with(admin, "/", &[("Authorization", value)]).await?;
        assert_eq!(a.status, want, "{how}");
    }
    assert_eq!(http_get_with(admin, "/status.js", &[]).await?.status, 200, "the script holds no data");
    Ok(())
}

/// The state class and standing badge of the evil agent's session row, and the cluster row's class.
const EVIL_ROW: &str = r#"
    const cluster = document.querySelector('#t-clusters > tbody[data-row="shoot-a"]');
    if (!cluster) return null;
    for (const b of cluster.querySelectorAll('table.inner > tbody')) {
      const cells = b.rows[0].cells;
      if (cells[0].textContent === arguments_node) {
        return {row: b.className, badge: cells[1].textContent, cluster: cluster.className,
                open: cluster.querySelector('details').open, marker: window.__marker === 1,
                updated: document.getElementById('updated').textContent};
      }
    }
    return {missing: true};
"#;

fn evil_row_script() -> String {
    EVIL_ROW.replace("arguments_node", &serde_json::to_string(EVIL).expect("string"))
}

/// Errors the browser's console logged.
async fn console_errors(b: &Browser) -> anyhow::Result<Vec<Value>> {
    Ok(b.console().await?.into_iter().filter(|e| e["level"] == "SEVERE").collect())
}

async fn shot(b: &Browser, w: &World, name: &str) -> anyhow::Result<()> {
    let dir = match std::env::var_os("SEEDGATE_SCREENSHOTS") {
        Some(d) => std::path::PathBuf::from(d),
        None => w.dir.path().to_owned(),
    };
    b.save_screenshot(&dir.join(name)).await
}

#[tokio::test]
async fn each_page_in_chromium_shows_the_topology_and_a_session_turning_suspect_within_a_refresh() -> anyhow::Result<()>
{
    if testbed::webdriver::installed().is_none() {
        eprintln!("skipped: chromium and chromium-driver are not installed (.ci/run installs them)");
        return Ok(());
    }
    let mut w = world("status-browser", true).await?;
    dial_both(&w).await?;
    let b = Browser::start(1360, 900).await?;
    let server = format!("http://{}/", w.server_admin());
    b.goto(&server).await?;
    let rows = b
        .eval("return Array.from(document.querySelectorAll('#t-clusters > tbody[data-row]')).map(b => b.dataset.row)")
        .await?;
    assert_eq!(rows, serde_json::json!(["shoot-a", "shoot-b"]));
    // A cluster's row opens its sessions (a <details>: no script needed, and kept open across refreshes).
    b.click("#t-clusters > tbody[data-row=\"shoot-a\"] summary").await?;
    let seen = b.eval(&evil_row_script()).await?;
    assert_eq!(
        (&seen["row"], &seen["badge"], &seen["open"]),
        (&Value::from("st-up"), &Value::from("active"), &Value::from(true)),
        "{seen}"
    );
    // What the agent sent is text: no element came of it.
    let elements = b.eval("return document.querySelectorAll('main img, main script, main iframe').length").await?;
    assert_eq!(elements, 0);
    b.eval("window.__marker = 1; return true").await?;

    // The evil agent stops answering (SIGSTOP: its socket stays open): the page, refreshing
    // itself, shows the session suspect (amber) without a reload.
    let Evil::Proc(agent) = &mut w.evil else { unreachable!("a process here") };
    agent.signal(libc::SIGSTOP)?;
    let suspect = poll_until(WAIT, Duration::from_millis(200), || async {
        let seen = b.eval(&evil_row_script()).await?;
        anyhow::ensure!(seen["badge"] == "suspect", "not suspect on the page yet: {seen}");
        Ok(seen)
    })
    .await;
    let Evil::Proc(agent) = &mut w.evil else { unreachable!("a process here") };
    agent.signal(libc::SIGCONT)?;
    let suspect = suspect.with_context(|| w.logs())?;
    assert_eq!(suspect["row"], "st-warn", "{suspect}");
    assert_eq!(suspect["cluster"], "st-warn", "a cluster with a suspect session is degraded: {suspect}");
    assert_eq!(
        (&suspect["marker"], &suspect["open"]),
        (&Value::from(true), &Value::from(true)),
        "refreshed in place, still open"
    );
    assert_ne!(suspect["updated"], seen["updated"], "the 'updated at' moved on");
    shot(&b, &w, "status-proxy-server.png").await?;

    // Sorting by a header, both ways; the filter box hides what does not match.
    let order = "return Array.from(document.querySelectorAll('#t-clusters > tbody[data-row]')).map(b => b.dataset.row)";
    b.click("#t-clusters th[data-key=\"name\"]").await?;
    b.click("#t-clusters th[data-key=\"name\"]").await?;
    assert_eq!(b.eval(order).await?, serde_json::json!(["shoot-b", "shoot-a"]));
    assert_eq!(
        b.eval("return document.querySelector('#t-clusters th[data-key=\"name\"]').getAttribute('aria-sort')").await?,
        "descending"
    );
    b.type_into("#filter", "shoot-b").await?;
    let hidden = b.eval("return document.querySelector('#t-clusters > tbody[data-row=\"shoot-a\"]').hidden").await?;
    assert_eq!(hidden, true);

    // sni-router's page and the live agent's.
    b.goto(&format!("http://{}/", w.router.admin()?)).await?;
    let route = b.eval("return document.querySelector('#t-routes > tbody[data-row=\"tunnel\"]').className").await?;
    assert_eq!(route, "st-up");
    shot(&b, &w, "status-sni-router.png").await?;
    b.goto(&format!("http://{}/", w.live.admin()?)).await?;
    b.click("#t-servers > tbody summary").await?;
    let slot = b.eval("return document.querySelector('#t-servers table.inner > tbody').className").await?;
    assert_eq!(slot, "st-up");
    shot(&b, &w, "status-proxy-agent.png").await?;

    let errors = console_errors(&b).await?;
    assert!(errors.is_empty(), "console errors: {errors:?}");
    assert_eq!(b.alert().await?, None, "no script of the agent's ran");
    b.close().await?;
    Ok(())
}

/// Not a test: how long Chromium takes to show a large status page, at `SEEDGATE_STATUS_URL`
/// (e.g. the replica of 1,000 clusters and 10,000 sessions that
/// `proxy-server`'s `admin::status::tests::a_thousand_clusters_of_ten_sessions` serves): the page's load
/// (the server-rendered tables) and then, five times, the script's refresh (from the end of the
/// `/status` answer to the re-rendered tables).
#[tokio::test]
#[ignore = "a measurement, not a test: run it with --ignored --nocapture and SEEDGATE_STATUS_URL"]
async fn render_time_of_a_large_page() -> anyhow::Result<()> {
    let url = std::env::var("SEEDGATE_STATUS_URL").context("set SEEDGATE_STATUS_URL")?;
    let b = Browser::start(1360, 900).await?;
    let started = std::time::Instant::now();
    b.goto(&url).await?;
    let loaded = started.elapsed();
    let nav = b
        .eval(
            "const n = performance.getEntriesByType('navigation')[0]; \
             const p = performance.getEntriesByType('paint').find(e => e.name === 'first-contentful-paint'); \
             return {response_ms: n.responseEnd - n.startTime, interactive_ms: n.domInteractive - n.startTime, \
                     loaded_ms: n.loadEventEnd - n.startTime, paint_ms: p ? p.startTime : null, bytes: n.transferSize, \
                     rows: document.querySelectorAll('tbody').length}",
        )
        .await?;
    eprintln!("{url}: goto returned after {loaded:?}; navigation {nav}");
    for i in 0..5 {
        let refresh = b
            .eval_async(
                "const at = document.getElementById('updated'); \
                 const o = new MutationObserver(() => { o.disconnect(); \
                   const now = performance.now(); \
                   const r = performance.getEntriesByType('resource').filter(e => e.name.includes('/status?') || e.name.endsWith('/status')).pop(); \
                   done({render_ms: r ? now - r.responseEnd : null, fetch_ms: r ? r.responseEnd - r.startTime : null, bytes: r ? r.transferSize : null}); }); \
                 o.observe(at, {childList: true, characterData: true, subtree: true});",
            )
            .await?;
        eprintln!("refresh {i}: {refresh}");
    }
    let errors = console_errors(&b).await?;
    anyhow::ensure!(errors.is_empty(), "console errors: {errors:?}");
    b.close().await
}
