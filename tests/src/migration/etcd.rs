//! A real long watch through a move: etcd (TLS) as the shoot's API server, a writer putting one
//! numbered key at a steady rate, and `etcdctl watch` in the shoot reaching it through the
//! seed's SNI route; the report says whether every event arrived once, in order, and the gap.

use super::{SHOOT_API, TICK, WAIT};
use crate::netns::Netns;
use crate::pki::client_config;
use crate::{Ca, Proc, TempDir, tls_request};
use anyhow::Context as _;
use base64::Engine as _;
use rustls::ClientConfig;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt as _, BufReader};

/// Key prefix of the watched events.
const PREFIX: &str = "ev/";
const MISSING: &str = "etcd is not installed (Debian: apt-get install etcd-server etcd-client)";

/// One etcd member serving clients over TLS (certificate for [`SHOOT_API`]) on port 2379 of
/// every address in `ips` (all must be assigned here).
pub struct Etcd {
    proc: Proc,
    endpoint: SocketAddr,
    tls: Arc<ClientConfig>,
    pub ca_file: PathBuf,
}

impl Etcd {
    pub async fn start(dir: &TempDir, ca: &Ca, ips: &[String]) -> anyhow::Result<Self> {
        let first = ips.first().context("etcd needs an address")?;
        let (crt, key) = ca.server(&[SHOOT_API])?.write(dir.path(), "etcd")?;
        let clients: Vec<String> = ips.iter().map(|ip| format!("https://{ip}:2379")).collect();
        let peer = format!("http://{first}:2380");
        let mut cmd = std::process::Command::new("etcd");
        cmd.arg("--name=shoot")
            .arg(format!("--data-dir={}", dir.join("etcd-data").display()))
            .arg(format!("--listen-client-urls={}", clients.join(",")))
            .arg(format!("--advertise-client-urls={}", clients[0]))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=shoot={peer}"))
            .arg(format!("--cert-file={}", crt.display()))
            .arg(format!("--key-file={}", key.display()))
            .args(["--logger=zap", "--log-level=warn"]);
        let proc = Proc::spawn(cmd).context(MISSING)?;
        let tls = client_config(ca, None, &["http/1.1"])?;
        let etcd = Self { proc, endpoint: format!("{first}:2379").parse()?, tls, ca_file: ca.write(dir.path(), "ca")? };
        crate::poll_until(WAIT, TICK, || async {
            let r =
                etcd.request(&format!("GET /health HTTP/1.1\r\nHost: {SHOOT_API}\r\nConnection: close\r\n\r\n")).await;
            r.ok().filter(|b| b.contains("\"true\"")).map(|_| ())
        })
        .await
        .with_context(|| format!("etcd did not become healthy; log:\n{}", etcd.proc.log()))?;
        Ok(etcd)
    }

    /// One HTTP/1.1 request to etcd's JSON gateway; the body of a 200 answer.
    async fn request(&self, req: &str) -> anyhow::Result<String> {
        let res = tls_request(self.endpoint, Some(SHOOT_API), self.tls.clone(), req.as_bytes()).await?;
        anyhow::ensure!(res.status() == Some(200), "etcd answered {:?}", res.text().lines().next());
        Ok(res.body())
    }

    /// Put `ev/<seq>` = `<seq>`.
    async fn put(&self, seq: u64) -> anyhow::Result<()> {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let body = format!(r#"{{"key":"{}","value":"{}"}}"#, b64(&format!("{PREFIX}{seq:08}")), b64(&seq.to_string()));
        let req = format!(
            "POST /v3/kv/put HTTP/1.1\r\nHost: {SHOOT_API}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        self.request(&req).await.map(|_| ())
    }

    pub fn log(&self) -> String {
        self.proc.log()
    }
}

/// Puts numbered keys at a steady rate, straight to etcd (the control plane's own writer).
pub struct EtcdWriter {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<anyhow::Result<u64>>,
}

impl EtcdWriter {
    pub fn start(etcd: Arc<Etcd>, every: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let task = tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(180);
            let mut tick = tokio::time::interval(every);
            let mut seq = 0;
            while !s.load(Ordering::Relaxed) && Instant::now() < deadline {
                tick.tick().await;
                etcd.put(seq + 1).await.with_context(|| format!("etcd put {}", seq + 1))?;
                seq += 1;
            }
            Ok(seq)
        });
        Self { stop, task }
    }

    /// Stop writing; the last sequence number written.
    pub async fn finish(self) -> anyhow::Result<u64> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await?
    }
}

/// `etcdctl watch --prefix ev/` inside the shoot, against `https://api.shoot.test:443` (the
/// name the shoot's hosts file resolves), every event's arrival time recorded.
pub struct EtcdWatch {
    child: tokio::process::Child,
    events: Arc<Mutex<Vec<(Instant, u64)>>>,
    stderr: Arc<Mutex<String>>,
}

/// How a watch went.
#[derive(Debug, Clone)]
pub struct WatchReport {
    pub events: usize,
    pub first: u64,
    pub last: u64,
    /// Sequence numbers between the first received and the last written that never arrived.
    pub missing: Vec<u64>,
    /// Events that arrived twice, or before one with a smaller number.
    pub duplicates_or_reordered: usize,
    /// The longest time between two events' arrivals.
    pub max_gap: Duration,
    /// When that gap ended, after the watch started.
    pub max_gap_end: Duration,
    /// What etcdctl wrote to stderr (errors, warnings).
    pub stderr: String,
    pub still_running: bool,
}

impl EtcdWatch {
    pub fn start(shoot: &Netns, ca_file: &Path) -> anyhow::Result<Self> {
        let mut cmd = tokio::process::Command::from(shoot.command("etcdctl"));
        cmd.env("ETCDCTL_API", "3")
            .arg(format!("--endpoints=https://{SHOOT_API}:443"))
            .arg(format!("--cacert={}", ca_file.display()))
            .args(["--dial-timeout=5s", "watch", "--prefix", PREFIX])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().context(MISSING)?;
        let (out, err) = (child.stdout.take().context("stdout")?, child.stderr.take().context("stderr")?);
        let events: Arc<Mutex<Vec<(Instant, u64)>>> = Arc::default();
        let stderr: Arc<Mutex<String>> = Arc::default();
        let ev = events.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(out).lines();
            while let Ok(Some(l)) = lines.next_line().await {
                if let Some(seq) = l.strip_prefix(PREFIX).and_then(|s| s.parse().ok()) {
                    ev.lock().expect("lock").push((Instant::now(), seq));
                }
            }
        });
        let e = stderr.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(err).lines();
            while let Ok(Some(l)) = lines.next_line().await {
                let mut e = e.lock().expect("lock");
                if e.len() < 64 << 10 {
                    e.push_str(&l);
                    e.push('\n');
                }
            }
        });
        Ok(Self { child, events, stderr })
    }

    /// Events received so far.
    pub fn received(&self) -> usize {
        self.events.lock().expect("lock").len()
    }

    /// Wait until the event numbered `last` arrived (or [`WAIT`] passed), then report.
    pub async fn report(&mut self, started: Instant, last: u64) -> WatchReport {
        let has_last = || self.events.lock().expect("lock").iter().any(|&(_, s)| s == last);
        let _ = crate::poll_until(WAIT, TICK, || async { has_last().then_some(()) }).await;
        let still_running = matches!(self.child.try_wait(), Ok(None));
        let events = self.events.lock().expect("lock").clone();
        let first = events.first().map_or(0, |e| e.1);
        let seen: std::collections::BTreeSet<u64> = events.iter().map(|e| e.1).collect();
        let missing = (first..=last).filter(|s| !seen.contains(s)).collect();
        let duplicates_or_reordered = events.windows(2).filter(|w| w[1].1 <= w[0].1).count();
        let (mut max_gap, mut max_gap_end) = (Duration::ZERO, Duration::ZERO);
        for w in events.windows(2) {
            let gap = w[1].0.duration_since(w[0].0);
            if gap > max_gap {
                (max_gap, max_gap_end) = (gap, w[1].0.duration_since(started));
            }
        }
        let stderr = self.stderr.lock().expect("lock").clone();
        WatchReport {
            events: events.len(),
            first,
            last,
            missing,
            duplicates_or_reordered,
            max_gap,
            max_gap_end,
            stderr,
            still_running,
        }
    }
}
