//! A headless Chromium driven over WebDriver (chromedriver's HTTP JSON API, through the testbed's own HTTP/1.1 client): load a page, read the DOM with a script, click, type, read the console, take a screenshot.
//!
//! chromedriver and the browser it starts run in a process group of their own, killed with the
//! [`Browser`]: nothing outlives a test that fails half-way.

use anyhow::{Context as _, bail};
use base64::Engine as _;
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long chromedriver may take to answer its first `/status`.
const START: Duration = Duration::from_secs(30);

/// One WebDriver command's wait for its answer.
const COMMAND: Duration = Duration::from_secs(30);

/// `method path` with a JSON `body` to chromedriver at `addr` (hyper's HTTP/1.1 client: the
/// driver keeps the connection open after its answer, so reading to the end would not do).
async fn http_request(addr: SocketAddr, method: &str, path: &str, body: Option<&str>) -> anyhow::Result<(u16, String)> {
    use http_body_util::BodyExt as _;
    let exchange = async {
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        let (mut send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp)).await?;
        let conn = tokio::spawn(conn);
        let req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", addr.to_string())
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(hyper::body::Bytes::from(body.unwrap_or_default().to_owned())))?;
        let resp = send.send_request(req).await?;
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await?.to_bytes();
        conn.abort();
        anyhow::Ok((status, String::from_utf8_lossy(&body).into_owned()))
    };
    tokio::time::timeout(COMMAND, exchange)
        .await
        .with_context(|| format!("{method} {path}: no answer within {COMMAND:?}"))?
}

/// Where Debian's `chromium` and `chromium-driver` put their programs.
const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// One browser session.
pub struct Browser {
    driver: SocketAddr,
    session: String,
    child: std::process::Child,
    _profile: crate::TempDir,
}

impl std::fmt::Debug for Browser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Browser").field("driver", &self.driver).field("session", &self.session).finish()
    }
}

/// The browser and its driver, when both are installed (`apt-get install chromium chromium-driver`).
pub fn installed() -> Option<(PathBuf, PathBuf)> {
    let (b, d) = (PathBuf::from(CHROMIUM), PathBuf::from(CHROMEDRIVER));
    (b.exists() && d.exists()).then_some((b, d))
}

fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

impl Browser {
    /// Start chromedriver and a headless Chromium session with a fresh profile, a window of
    /// `width`×`height` and the browser's console kept for [`Browser::console`].
    pub async fn start(width: u32, height: u32) -> anyhow::Result<Self> {
        let (browser, driver) = installed().context("chromium and chromium-driver are not installed")?;
        let profile = crate::TempDir::new("chromium-profile")?;
        let port = free_port()?;
        let log = profile.join("chromedriver.log");
        let mut cmd = std::process::Command::new(&driver);
        cmd.arg(format!("--port={port}"))
            .arg(format!("--log-path={}", log.display()))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let child = cmd.spawn().with_context(|| format!("starting {}", driver.display()))?;
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let mut b = Self { driver: addr, session: String::new(), child, _profile: profile };
        crate::poll::poll_until(START, Duration::from_millis(50), || async {
            let (code, body) = http_request(addr, "GET", "/status", None).await?;
            anyhow::ensure!(code == 200 && body.contains("\"ready\":true"), "chromedriver not ready: {code} {body}");
            Ok(())
        })
        .await
        .context("chromedriver did not come up")?;
        let args = [
            "--headless=new".to_owned(),
            "--no-sandbox".into(),
            "--disable-gpu".into(),
            "--disable-dev-shm-usage".into(),
            "--disable-background-networking".into(),
            "--disable-component-update".into(),
            "--disable-sync".into(),
            "--no-first-run".into(),
            "--hide-scrollbars".into(),
            format!("--window-size={width},{height}"),
            format!("--user-data-dir={}", b._profile.join("profile").display()),
        ];
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": browser, "args": args},
            "goog:loggingPrefs": {"browser": "ALL"},
            "unhandledPromptBehavior": "ignore",
        }}});
        let v = b.call("POST", "/session", Some(caps)).await.context("creating the browser session")?;
        b.session = v["sessionId"].as_str().context("no sessionId")?.to_owned();
        Ok(b)
    }

    /// One WebDriver command; its `value`, or the error it answered.
    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
        let body = body.map(|b| b.to_string());
        let (code, text) = http_request(self.driver, method, path, body.as_deref()).await?;
        let v: Value = serde_json::from_str(&text).with_context(|| format!("{method} {path}: {code} {text}"))?;
        let value = v.get("value").cloned().unwrap_or(Value::Null);
        if code != 200 {
            let error = value["error"].as_str().unwrap_or("?");
            let message = value["message"].as_str().unwrap_or("");
            bail!("{method} {path}: {code} {error}: {message}");
        }
        Ok(value)
    }

    fn at(&self, tail: &str) -> String {
        format!("/session/{}{tail}", self.session)
    }

    /// Load `url` and wait for it (the document's load).
    pub async fn goto(&self, url: &str) -> anyhow::Result<()> {
        self.call("POST", &self.at("/url"), Some(json!({"url": url}))).await.map(drop)
    }

    /// Run `script` (a function body: `return ...`) in the page; its result.
    pub async fn eval(&self, script: &str) -> anyhow::Result<Value> {
        self.call("POST", &self.at("/execute/sync"), Some(json!({"script": script, "args": []}))).await
    }

    /// Run `script`, which ends by calling `done(value)` (the last of its `arguments`); that value.
    pub async fn eval_async(&self, script: &str) -> anyhow::Result<Value> {
        let script = format!("const done = arguments[arguments.length - 1];\n{script}");
        self.call("POST", &self.at("/execute/async"), Some(json!({"script": script, "args": []}))).await
    }

    /// The first element `css` selects (its WebDriver reference).
    pub async fn find(&self, css: &str) -> anyhow::Result<Value> {
        let v = self.call("POST", &self.at("/element"), Some(json!({"using": "css selector", "value": css}))).await?;
        Ok(v)
    }

    fn element_id(el: &Value) -> anyhow::Result<String> {
        el.as_object()
            .and_then(|o| o.values().next())
            .and_then(Value::as_str)
            .map(str::to_owned)
            .context("not an element reference")
    }

    /// Click the element `css` selects, as a user would.
    pub async fn click(&self, css: &str) -> anyhow::Result<()> {
        let id = Self::element_id(&self.find(css).await?)?;
        self.call("POST", &self.at(&format!("/element/{id}/click")), Some(json!({}))).await.map(drop)
    }

    /// Type `text` into the element `css` selects.
    pub async fn type_into(&self, css: &str, text: &str) -> anyhow::Result<()> {
        let id = Self::element_id(&self.find(css).await?)?;
        self.call("POST", &self.at(&format!("/element/{id}/value")), Some(json!({"text": text}))).await.map(drop)
    }

    /// The browser console's entries since the last call (each with `level` and `message`).
    pub async fn console(&self) -> anyhow::Result<Vec<Value>> {
        let v = self.call("POST", &self.at("/se/log"), Some(json!({"type": "browser"}))).await?;
        Ok(v.as_array().cloned().unwrap_or_default())
    }

    /// The text of an open alert, prompt or confirm dialog, if one is open.
    pub async fn alert(&self) -> anyhow::Result<Option<String>> {
        match self.call("GET", &self.at("/alert/text"), None).await {
            Ok(v) => Ok(Some(v.as_str().unwrap_or_default().to_owned())),
            Err(e) if e.to_string().contains("no such alert") => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// A PNG of the viewport.
    pub async fn screenshot(&self) -> anyhow::Result<Vec<u8>> {
        let v = self.call("GET", &self.at("/screenshot"), None).await?;
        base64::engine::general_purpose::STANDARD.decode(v.as_str().context("no screenshot")?).context("screenshot")
    }

    /// Save a PNG of the viewport as `path`.
    pub async fn save_screenshot(&self, path: &Path) -> anyhow::Result<()> {
        std::fs::write(path, self.screenshot().await?).with_context(|| format!("writing {}", path.display()))
    }

    /// End the session (the browser quits) and the driver.
    pub async fn close(mut self) -> anyhow::Result<()> {
        let r = self.call("DELETE", &self.at(""), None).await.map(drop);
        self.kill();
        r
    }

    fn kill(&mut self) {
        if let Ok(pgid) = libc::pid_t::try_from(self.child.id()) {
            // SAFETY: kill(2) with integers only; the group is the one this handle started (the
            // driver leads it, the browser it started belongs to it).
            #[allow(unsafe_code)]
            unsafe {
                libc::kill(-pgid, libc::SIGKILL);
            }
        }
        let _ = self.child.wait();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.kill();
        }
    }
}
