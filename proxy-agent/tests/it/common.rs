//! Test helpers: an in-process agent, admin scraping, polling with a deadline, fake-gateway reads.
#![allow(dead_code)] // not every helper is used by every module

use anyhow::{Context as _, anyhow, bail};
use proxy_core::app::addrs::Addresses;
use proxy_core::app::shutdown::Shutdown;
use proxy_wire::proxy_protocol::{self, ProxyHeader};
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// Upper bound for anything a test waits for; never an expectation of speed.
pub(crate) const DEADLINE: Duration = Duration::from_secs(20);

/// Poll `f` every 20 ms until it returns `Some`, for at most [`DEADLINE`].
pub(crate) async fn poll<T, Fut: Future<Output = Option<T>>>(
    what: &str,
    mut f: impl FnMut() -> Fut,
) -> anyhow::Result<T> {
    let end = tokio::time::Instant::now() + DEADLINE;
    for _ in 0..(DEADLINE.as_millis() / 20 + 1) {
        if let Ok(Some(v)) = tokio::time::timeout_at(end, f()).await {
            return Ok(v);
        }
        if tokio::time::Instant::now() >= end {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    bail!("{what}: not reached within {DEADLINE:?}")
}

/// Run `f` with the test deadline.
pub(crate) async fn within<T>(what: &str, f: impl Future<Output = T>) -> anyhow::Result<T> {
    tokio::time::timeout(DEADLINE, f).await.map_err(|_| anyhow!("{what}: timed out after {DEADLINE:?}"))
}

/// A YAML config for an agent with admin on 127.0.0.1:0 and one listener on 127.0.0.3:0.
pub(crate) fn config(gateway: &str, mode: &str, extra: &str) -> String {
    format!(
        "admin: {{ listen: 127.0.0.1:0 }}\ntimeouts: {{ handshake: 5s, connect: 5s, idle: 5m }}\ndrain_grace: 5s\napiserver_proxy:\n  listen: [127.0.0.3:0]\n  gateway: {gateway}\n  mode: {mode}\n{extra}"
    )
}

/// An agent bound and running in this process.
pub(crate) struct Agent {
    pub addrs: Addresses,
    pub shutdown: Shutdown,
    task: JoinHandle<()>,
}

impl Agent {
    pub(crate) async fn start(yaml: &str) -> anyhow::Result<Self> {
        Self::start_inner(yaml, None).await
    }

    /// Start from a config file that is watched for changes (hot reload).
    pub(crate) async fn start_watching(path: &Path) -> anyhow::Result<Self> {
        let yaml = std::fs::read_to_string(path)?;
        Self::start_inner(&yaml, Some(path.to_owned())).await
    }

    async fn start_inner(yaml: &str, watch: Option<PathBuf>) -> anyhow::Result<Self> {
        // Logs only on request: they go to stderr, past the test harness's capture.
        if std::env::var_os("RUST_LOG").is_some() {
            proxy_core::obs::telemetry::init(proxy_core::obs::telemetry::LogFormat::Text);
        }
        let cfg = seedgate_config::agent::parse(yaml, "test.yaml")?;
        let opts = proxy_agent::Options { config_path: watch, ..Default::default() };
        let bound = proxy_agent::bind(cfg, opts).await?;
        let shutdown = bound.shutdown();
        let addrs = bound.local_addrs();
        let task = tokio::spawn(async move {
            bound.run(std::future::pending()).await;
        });
        Ok(Self { addrs, shutdown, task })
    }

    /// The address of the `apiserver-proxy` listener (`listen[0]`).
    pub(crate) fn listener(&self) -> SocketAddr {
        self.addrs.listener("apiserver-proxy").expect("the apiserver-proxy listener")
    }

    pub(crate) async fn connect(&self) -> anyhow::Result<TcpStream> {
        Ok(TcpStream::connect(self.listener()).await?)
    }

    /// `GET path` on the admin listener: (status, body).
    pub(crate) async fn get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        let admin = self.addrs.admin.context("admin listener")?;
        http_get(admin, path).await
    }

    pub(crate) async fn metrics(&self) -> anyhow::Result<String> {
        Ok(self.get("/metrics").await?.1)
    }

    /// Poll `/metrics` until the sample named `name` with `labels` equals `want`.
    pub(crate) async fn wait_metric(&self, name: &str, labels: &[(&str, &str)], want: f64) -> anyhow::Result<()> {
        let res = poll(name, || async {
            let text = self.metrics().await.ok()?;
            (metric(&text, name, labels) == want).then_some(())
        })
        .await;
        if res.is_err() {
            let text = self.metrics().await.unwrap_or_default();
            bail!("{name}{labels:?} never became {want}; now {}\n{text}", metric(&text, name, labels));
        }
        Ok(())
    }

    /// Stop accepting, drain, and wait for `run` to return.
    pub(crate) async fn stop(self) -> anyhow::Result<()> {
        self.shutdown.stop.cancel();
        within("agent run() to return", self.task).await??;
        Ok(())
    }
}

/// A minimal HTTP/1.0 GET (the admin listener closes after the answer).
pub(crate) async fn http_get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    within("admin GET", async {
        let mut s = TcpStream::connect(addr).await?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: admin\r\n\r\n").as_bytes()).await?;
        let mut out = Vec::new();
        s.take(4 << 20).read_to_end(&mut out).await?;
        let text = String::from_utf8(out)?;
        let (head, body) = text.split_once("\r\n\r\n").context("no response head")?;
        let status = head.split(' ').nth(1).context("no status")?.parse()?;
        Ok((status, body.to_owned()))
    })
    .await?
}

/// The value of the sample `name{labels...}` in a Prometheus text page; 0 when absent.
pub(crate) fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(name) && matches!(l.as_bytes().get(name.len()), Some(b'{') | Some(b' ')))
        .filter(|l| labels.iter().all(|(k, v)| l.contains(&format!("{k}=\"{v}\""))))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A port nothing listens on (bound, then released).
pub(crate) async fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    l.local_addr().unwrap().port()
}

/// Read a PROXY header from a fake gateway's accepted stream: the header and the bytes after it.
pub(crate) async fn read_proxy_header(s: &mut TcpStream) -> anyhow::Result<(ProxyHeader, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 512];
    loop {
        if let Some(h) = proxy_protocol::parse(&buf)? {
            let rest = buf[h.len..].to_vec();
            return Ok((h, rest));
        }
        if buf.len() > proxy_protocol::V2_MAX_LEN {
            bail!("PROXY header too long");
        }
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            bail!("EOF before a complete PROXY header ({} bytes)", buf.len());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Read an HTTP head (up to and including the empty line) byte by byte, so nothing after it
/// is consumed; returns the head as text.
pub(crate) async fn read_http_head(s: &mut TcpStream) -> anyhow::Result<String> {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 16 * 1024 {
            bail!("head too long");
        }
        let b = s.read_u8().await.context("EOF inside the head")?;
        head.push(b);
    }
    Ok(String::from_utf8(head)?)
}

/// Read exactly `n` bytes.
pub(crate) async fn read_n(s: &mut TcpStream, n: usize) -> anyhow::Result<Vec<u8>> {
    let mut v = vec![0u8; n];
    s.read_exact(&mut v).await?;
    Ok(v)
}

/// Read until the peer closes (EOF or reset): the bytes read, and whether it ended in a reset.
pub(crate) async fn read_until_closed(s: &mut TcpStream) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match s.read(&mut chunk).await {
            Ok(0) => return (out, false),
            Ok(n) => out.extend_from_slice(&chunk[..n]),
            Err(_) => return (out, true),
        }
    }
}

/// Echo everything after a PROXY header; FIN when the client's FIN arrives.
pub(crate) async fn echo_after_proxy_header(mut s: TcpStream) -> anyhow::Result<ProxyHeader> {
    let (h, rest) = read_proxy_header(&mut s).await?;
    let (mut r, mut w) = s.split();
    w.write_all(&rest).await?;
    tokio::io::copy(&mut r, &mut w).await?;
    w.shutdown().await?;
    Ok(h)
}
