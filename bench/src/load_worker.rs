//! Load that needs more than one CPU: `bench load-worker` processes, one pinned to each load CPU, each serving the backends on ports they all share (`SO_REUSEPORT`) and running the generators the harness asks for (one JSON command per line on stdin, one JSON answer per line on stdout); [`Pool`] is the harness's side.
//!
//! The harness's own generators run on one thread; a system under test given several CPUs needs
//! several CPUs of load, and so do its backends (a TLS backend's handshakes cost more than the
//! proxy's work for the same connection). Every worker binds the same three backend ports, so
//! the kernel spreads the proxy's upstream connections over all of them, and each command names
//! an absolute start time, so that the workers' measuring windows coincide.

use crate::load::{self, Ping, Preamble, Sink, Txn, closed_loop};
use anyhow::{Context as _, bail, ensure};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio::task::JoinSet;
use tokio::time::Instant;

/// `bench load-worker`: where to run and what to serve.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Args {
    /// The CPU this worker runs on (unpinned without it).
    #[arg(long)]
    cpu: Option<usize>,
    /// The CA certificate (PEM) the TLS clients trust.
    #[arg(long)]
    ca: PathBuf,
    /// The TLS backend's certificate and key (PEM).
    #[arg(long)]
    cert: PathBuf,
    #[arg(long)]
    key: PathBuf,
    /// Ports on 127.0.0.1 of the backends, shared with the other workers: one small answer per
    /// connection, a TLS "kube-apiserver", a byte sink.
    #[arg(long)]
    ping: u16,
    #[arg(long)]
    tls: u16,
    #[arg(long)]
    sink: u16,
}

/// A transaction as the harness describes it to a worker.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum TxnSpec {
    /// TCP connect, a full TLS handshake for `sni` (no resumption), `GET /`, the answer.
    Tls { addr: SocketAddr, sni: String },
    /// TCP connect, `pre` and a small request in one write, the answer to EOF.
    Plain { addr: SocketAddr, pre: Vec<u8> },
    /// TCP connect, a CONNECT head, its `200`, a small request, the answer to EOF.
    Connect { addr: SocketAddr, head: Vec<u8> },
}

/// What a bulk stream sends before its bytes.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum PreSpec {
    Raw { bytes: Vec<u8> },
    Connect { head: Vec<u8> },
}

/// One command to a worker. Times are milliseconds since the Unix epoch (the workers' windows
/// start together).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub(crate) enum Command {
    /// Closed loop: `concurrency` clients run `txn` back to back from `start`; completions in
    /// the window after `warmup` count. `latency`: send the times to first byte back.
    Rate { txn: TxnSpec, concurrency: usize, latency: bool, start_ms: u64, warmup_ms: u64, window_ms: u64 },
    /// `streams` connections write bulk bytes to `addr` from `start`; the answer is what this
    /// worker's sink received in the window (the sinks of all workers together receive it all).
    Bulk { addr: SocketAddr, pre: PreSpec, streams: usize, start_ms: u64, warmup_ms: u64, window_ms: u64 },
}

/// A worker's answer.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Reply {
    /// Rate: transactions completed in the window, and the span they were counted over.
    pub done: u64,
    pub span_s: f64,
    pub errors: u64,
    pub first_error: Option<String>,
    /// Rate with `latency`: time to first byte of each counted transaction (µs).
    pub first_byte_us: Vec<u32>,
    /// Bulk: bytes this worker's sink received in the window, and the window's length.
    pub bytes: u64,
    pub secs: f64,
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// The tokio instant of a Unix-epoch time in ms (the clocks agree to the millisecond).
fn instant_of(ms: u64) -> Instant {
    let now_ms = unix_ms(SystemTime::now());
    let now = Instant::now();
    if ms >= now_ms { now + Duration::from_millis(ms - now_ms) } else { now - Duration::from_millis(now_ms - ms) }
}

/// A rustls client trusting the CA in `ca` (PEM), without resumption, offering `http/1.1`.
fn client_config(ca: &Path) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).with_context(|| format!("reading {}", ca.display()))? {
        roots.add(c?)?;
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(testbed::pki::provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    cfg.resumption = rustls::client::Resumption::disabled();
    Ok(Arc::new(cfg))
}

fn server_config(cert: &Path, key: &Path) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let chain = CertificateDer::pem_file_iter(cert)?.collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_file(key).with_context(|| format!("reading {}", key.display()))?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(testbed::pki::provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

impl TxnSpec {
    fn txn(&self, tls: &Arc<rustls::ClientConfig>) -> anyhow::Result<Txn> {
        Ok(match self {
            Self::Tls { addr, sni } => Txn::Tls {
                addr: *addr,
                sni: ServerName::try_from(sni.clone())?,
                cfg: tls.clone(),
                request: format!("GET / HTTP/1.1\r\nHost: {sni}\r\nConnection: close\r\n\r\n").into_bytes().into(),
            },
            Self::Plain { addr, pre } => Txn::Plain { addr: *addr, pre: pre.as_slice().into() },
            Self::Connect { addr, head } => Txn::Connect { addr: *addr, head: head.as_slice().into() },
        })
    }
}

/// The worker process: pin, serve the backends, answer commands until stdin closes.
pub(crate) fn main(a: Args) -> anyhow::Result<()> {
    crate::host::raise_nofile(crate::host::NOFILE)?;
    if let Some(cpu) = a.cpu {
        crate::host::pin_self(cpu)?;
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        let tls = client_config(&a.ca)?;
        let _ping = Ping::start_on(load::bind_shared(a.ping)?)?;
        let sink = Sink::start_on(load::bind_shared(a.sink)?)?;
        let _backend =
            testbed::TlsHttpBackend::serve_on("shoot", server_config(&a.cert, &a.key)?, load::bind_shared(a.tls)?)?;
        let mut out = tokio::io::stdout();
        out.write_all(b"ready\n").await?;
        out.flush().await?;
        let mut lines = BufReader::new(tokio::io::stdin()).lines();
        // One command at a time until the harness closes stdin.
        while let Some(line) = lines.next_line().await? {
            let cmd: Command = serde_json::from_str(&line).with_context(|| format!("command {line:?}"))?;
            let reply = match cmd {
                Command::Rate { txn, concurrency, latency, start_ms, warmup_ms, window_ms } => {
                    let txn = txn.txn(&tls)?;
                    tokio::time::sleep_until(instant_of(start_ms)).await;
                    let (warmup, window) = (Duration::from_millis(warmup_ms), Duration::from_millis(window_ms));
                    let r = closed_loop(&txn, concurrency, warmup, window).await;
                    let done = r.first_byte.len() as u64;
                    Reply {
                        done,
                        span_s: if r.rate > 0.0 { done as f64 / r.rate } else { window.as_secs_f64() },
                        errors: r.errors,
                        first_error: r.first_error,
                        first_byte_us: if latency { r.first_byte.micros() } else { Vec::new() },
                        ..Reply::default()
                    }
                }
                Command::Bulk { addr, pre, streams, start_ms, warmup_ms, window_ms } => {
                    let pre = match pre {
                        PreSpec::Raw { bytes } => Preamble::Raw(bytes.into()),
                        PreSpec::Connect { head } => Preamble::Connect(head.into()),
                    };
                    let start = instant_of(start_ms);
                    let from = start + Duration::from_millis(warmup_ms);
                    let until = from + Duration::from_millis(window_ms);
                    bulk(addr, pre, streams, &sink, start, from, until).await
                }
            };
            let mut text = serde_json::to_vec(&reply)?;
            text.push(b'\n');
            out.write_all(&text).await?;
            out.flush().await?;
        }
        anyhow::Ok(())
    })
}

/// `streams` writers to `addr` from `start` until `until`; the bytes this worker's sink received
/// between `from` and `until`.
async fn bulk(
    addr: SocketAddr,
    pre: Preamble,
    streams: usize,
    sink: &Sink,
    start: Instant,
    from: Instant,
    until: Instant,
) -> Reply {
    tokio::time::sleep_until(start).await;
    let mut tasks = JoinSet::new();
    for _ in 0..streams {
        tasks.spawn(write_until_aborted(addr, pre.clone()));
    }
    tokio::time::sleep_until(from).await;
    let (b0, t0) = (sink.bytes(), Instant::now());
    tokio::time::sleep_until(until).await;
    let (b1, t1) = (sink.bytes(), Instant::now());
    // A writer that ended before the window's end failed (the others are still writing).
    let mut error = None;
    while let Some(j) = tasks.try_join_next() {
        if let Ok(Err(e)) = j {
            error.get_or_insert(format!("{e:#}"));
        }
    }
    tasks.shutdown().await;
    load::settle(sink).await;
    let errors = u64::from(error.is_some());
    Reply { bytes: b1 - b0, secs: (t1 - t0).as_secs_f64(), errors, first_error: error, ..Reply::default() }
}

/// Open a stream through `addr` and write bulk bytes until aborted (or the path breaks).
async fn write_until_aborted(addr: SocketAddr, pre: Preamble) -> anyhow::Result<()> {
    let mut s = load::open(addr, &pre).await?;
    let buf = vec![0xa5u8; 256 * 1024];
    loop {
        s.write_all(&buf).await?;
    }
}

/// The harness's side: one worker process per load CPU.
pub(crate) struct Pool {
    workers: Vec<Worker>,
}

struct Worker {
    cpu: Option<usize>,
    /// Killed when the pool is dropped.
    _child: Child,
    stdin: ChildStdin,
    stdout: tokio::io::Lines<BufReader<ChildStdout>>,
    log: PathBuf,
}

/// Where the workers find their certificates and which ports they share.
#[derive(Debug, Clone)]
pub(crate) struct Backends {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ping: u16,
    pub tls: u16,
    pub sink: u16,
}

impl Backends {
    pub(crate) fn ping(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.ping))
    }
    pub(crate) fn tls(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.tls))
    }
    pub(crate) fn sink(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.sink))
    }
}

/// `total` spread over `n` as evenly as it goes.
pub(crate) fn spread(total: usize, n: usize) -> Vec<usize> {
    let n = n.max(1);
    (0..n).map(|i| total / n + usize::from(i < total % n)).collect()
}

/// How long a worker may take to answer beyond its window.
const REPLY_GRACE: Duration = Duration::from_secs(40);

impl Pool {
    /// One worker on each of `cpus` (one unpinned worker for `None`), every one serving
    /// `backends`; logs go to `dir`.
    pub(crate) async fn start(cpus: Option<&[usize]>, backends: &Backends, dir: &Path) -> anyhow::Result<Self> {
        let cpus: Vec<Option<usize>> = match cpus {
            Some(c) => c.iter().copied().map(Some).collect(),
            None => vec![None],
        };
        ensure!(!cpus.is_empty(), "no CPU left for the load");
        let exe = std::env::current_exe()?;
        let mut workers = Vec::new();
        for (i, cpu) in cpus.into_iter().enumerate() {
            let log = dir.join(format!("load-worker-{}.log", cpu.unwrap_or(i)));
            let mut cmd = tokio::process::Command::new(&exe);
            cmd.arg("load-worker");
            if let Some(c) = cpu {
                cmd.arg("--cpu").arg(c.to_string());
            }
            cmd.arg("--ca").arg(&backends.ca).arg("--cert").arg(&backends.cert).arg("--key").arg(&backends.key);
            for (flag, port) in [("--ping", backends.ping), ("--tls", backends.tls), ("--sink", backends.sink)] {
                cmd.arg(flag).arg(port.to_string());
            }
            cmd.stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::fs::File::create(&log)?)
                .kill_on_drop(true);
            let mut child = cmd.spawn().context("starting a load worker")?;
            let stdin = child.stdin.take().context("worker stdin")?;
            let stdout = BufReader::new(child.stdout.take().context("worker stdout")?).lines();
            workers.push(Worker { cpu, _child: child, stdin, stdout, log });
        }
        for w in &mut workers {
            let line = tokio::time::timeout(Duration::from_secs(15), w.stdout.next_line()).await;
            match line {
                Ok(Ok(Some(l))) if l == "ready" => {}
                other => bail!(
                    "load worker on CPU {:?} did not start ({other:?}): {}",
                    w.cpu,
                    std::fs::read_to_string(&w.log).unwrap_or_default()
                ),
            }
        }
        Ok(Self { workers })
    }

    pub(crate) fn len(&self) -> usize {
        self.workers.len()
    }

    /// A start time far enough ahead for every worker to have its command.
    pub(crate) fn start_time() -> SystemTime {
        SystemTime::now() + Duration::from_millis(150)
    }

    pub(crate) fn ms(t: SystemTime) -> u64 {
        unix_ms(t)
    }

    /// The harness's instant of a start time.
    pub(crate) fn instant(t: SystemTime) -> Instant {
        instant_of(unix_ms(t))
    }

    /// Send each worker its command (in order), then collect every answer.
    pub(crate) async fn call(&mut self, cmds: Vec<Command>, within: Duration) -> anyhow::Result<Vec<Reply>> {
        ensure!(cmds.len() == self.workers.len(), "one command per worker");
        for (w, c) in self.workers.iter_mut().zip(&cmds) {
            let mut line = serde_json::to_vec(c)?;
            line.push(b'\n');
            w.stdin.write_all(&line).await.with_context(|| format!("load worker on CPU {:?}", w.cpu))?;
            w.stdin.flush().await?;
        }
        let deadline = Instant::now() + within + REPLY_GRACE;
        let mut out = Vec::new();
        for w in &mut self.workers {
            let line = tokio::time::timeout_at(deadline, w.stdout.next_line()).await;
            match line {
                Ok(Ok(Some(l))) => out.push(serde_json::from_str(&l).with_context(|| format!("worker answer {l:?}"))?),
                other => bail!(
                    "load worker on CPU {:?} gave no answer ({other:?}); its log:\n{}",
                    w.cpu,
                    std::fs::read_to_string(&w.log).unwrap_or_default()
                ),
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_is_even_and_complete() {
        assert_eq!(spread(64, 5), vec![13, 13, 13, 13, 12]);
        assert_eq!(spread(2, 4), vec![1, 1, 0, 0]);
        assert_eq!(spread(7, 1), vec![7]);
        assert_eq!(spread(3, 0), vec![3]);
    }

    #[test]
    fn commands_survive_the_pipe() {
        let c = Command::Rate {
            txn: TxnSpec::Plain { addr: "127.0.0.1:1".parse().unwrap(), pre: vec![1, 2] },
            concurrency: 3,
            latency: true,
            start_ms: 5,
            warmup_ms: 6,
            window_ms: 7,
        };
        let back: Command = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
        assert!(matches!(back, Command::Rate { concurrency: 3, latency: true, window_ms: 7, .. }));
    }
}
