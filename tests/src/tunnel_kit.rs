//! What the reverse-tunnel end-to-end tests (paths P3-P5) share: certificates on disk, proxy-server
//! and proxy-agent configs, CONNECT clients (TCP, mTLS, Unix socket; a strict one that behaves like
//! kube-apiserver's egress dialer), stand-in backends for tunnel traffic (checksum sink, stall,
//! speak-first, TLS page), a checksum, process metrics and descriptor counts.

use crate::admin::http_get;
use crate::backend::{Serving, serve};
use crate::inproc::InProc;
use crate::pki::{self, Ca, Issued};
use crate::proc::{Addresses, Proc, bin_path};
use crate::tmp::TempDir;
use anyhow::{Context as _, bail};
use rustls::ClientConfig;
use rustls_pki_types::ServerName;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream, UnixStream};

/// The name on the agents' listener certificate; agents verify it through `tunnel.tls.server_name`.
pub const SERVER_NAME: &str = "proxy.seed.test";
/// The name on the mTLS front end's certificate (kube-apiserver's egress `tlsConfig.serverName`).
pub const FRONTEND_NAME: &str = "proxy-server.shoot--a.svc";
/// One step (connect, CONNECT exchange, a read that must come) must finish within this.
pub const STEP: Duration = Duration::from_secs(15);
/// Longest CONNECT response head accepted.
const HEAD_MAX: usize = 16 * 1024;

// ---------------------------------------------------------------------------------------------
// Certificates

/// One CA for everything, with the files the binaries read.
pub struct TunnelPki {
    pub ca: Ca,
    pub ca_file: PathBuf,
    /// Certificate and key of the agents' listener (DNS name [`SERVER_NAME`]).
    pub agents_cert: (PathBuf, PathBuf),
    /// Certificate and key of mTLS front ends ([`FRONTEND_NAME`] and 127.0.0.1).
    pub frontend_cert: (PathBuf, PathBuf),
    /// The client identity kube-apiserver presents to an mTLS front end.
    pub apiserver: Issued,
    dir: PathBuf,
}

impl std::fmt::Debug for TunnelPki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TunnelPki").field("dir", &self.dir).finish_non_exhaustive()
    }
}

impl TunnelPki {
    pub fn new(dir: &Path) -> anyhow::Result<Self> {
        let ca = Ca::new("seedgate-tunnel-test-ca")?;
        let ca_file = ca.write(dir, "ca")?;
        let agents_cert = ca.server(&[SERVER_NAME])?.write(dir, "agents-listener")?;
        let frontend_cert = ca.server(&[FRONTEND_NAME, "127.0.0.1"])?.write(dir, "frontend")?;
        let apiserver = ca.client("kube-apiserver")?;
        Ok(Self { ca, ca_file, agents_cert, frontend_cert, apiserver, dir: dir.to_path_buf() })
    }

    /// Write the client certificate of an agent of `cluster` (CN = cluster name).
    pub fn agent(&self, cluster: &str) -> anyhow::Result<(PathBuf, PathBuf)> {
        self.ca.client(cluster)?.write(&self.dir, &format!("agent-{cluster}"))
    }

    /// A server certificate for a backend, written as `<stem>.crt/.key`.
    pub fn backend(&self, stem: &str, names: &[&str]) -> anyhow::Result<(Issued, PathBuf, PathBuf)> {
        let id = self.ca.server(names)?;
        let (c, k) = id.write(&self.dir, stem)?;
        Ok((id, c, k))
    }

    /// The client config kube-apiserver uses towards an mTLS front end.
    pub fn apiserver_tls(&self) -> anyhow::Result<Arc<ClientConfig>> {
        pki::client_config(&self.ca, Some(&self.apiserver), &["http/1.1"])
    }
}

// ---------------------------------------------------------------------------------------------
// Configs and processes

/// A proxy-server front end.
#[derive(Debug, Clone)]
pub enum FeKind {
    /// Plain TCP on 127.0.0.1:0.
    Plain,
    /// TCP on 127.0.0.1:0 with TLS and a required client certificate from the test CA.
    Mtls,
    /// A Unix socket at this path.
    Unix(PathBuf),
}

#[derive(Debug, Clone)]
pub struct Fe {
    pub name: String,
    pub cluster: String,
    pub kind: FeKind,
}

impl Fe {
    pub fn new(name: &str, cluster: &str, kind: FeKind) -> Self {
        Self { name: name.into(), cluster: cluster.into(), kind }
    }
}

/// proxy-server YAML: admin on 127.0.0.1:0, agents on `agents_listen`, short keepalive (see [`agent_yaml`]), the
/// given front ends; `extra` is appended at the top level (e.g. `drain_grace: 1s\n`).
pub fn server_yaml(pki: &TunnelPki, agents_listen: &str, frontends: &[Fe], extra: &str) -> String {
    let (c, k) = &pki.agents_cert;
    let mut y = format!(
        "admin: {{ listen: 127.0.0.1:0 }}\nagents:\n  listen: {agents_listen}\n  tls: {{ cert: {}, key: {}, client_ca: {} }}\n  keepalive: {{ interval: 500ms, suspect_after: 2s, timeout: 2s }}\nfrontends:\n",
        c.display(),
        k.display(),
        pki.ca_file.display()
    );
    for f in frontends {
        y.push_str(&format!("  - name: {}\n    cluster: {}\n", f.name, f.cluster));
        match &f.kind {
            FeKind::Plain => y.push_str("    listen: 127.0.0.1:0\n"),
            FeKind::Mtls => {
                let (c, k) = &pki.frontend_cert;
                y.push_str(&format!(
                    "    listen: 127.0.0.1:0\n    tls: {{ cert: {}, key: {}, client_ca: {} }}\n",
                    c.display(),
                    k.display(),
                    pki.ca_file.display()
                ));
            }
            FeKind::Unix(p) => y.push_str(&format!("    unix: {}\n", p.display())),
        }
    }
    y.push_str(extra);
    y
}

/// What differs between the agents of the tests.
#[derive(Debug, Clone)]
pub struct AgentOpts {
    pub cluster: String,
    pub servers: Vec<String>,
    pub allow: Vec<String>,
    pub node_name: String,
    pub dial_timeout: String,
    /// Extra keys inside `tunnel:` (indented by two spaces), e.g. `  max_streams: 10\n`.
    pub tunnel_extra: String,
    /// The agent's client certificate.
    pub cert: AgentCert,
}

/// Which client certificate an agent presents.
#[derive(Debug, Clone, Default)]
pub enum AgentCert {
    /// One of the test CA for its cluster (CN = cluster name), written by [`agent_yaml`].
    #[default]
    OfCluster,
    /// These files (certificate, key).
    Files(PathBuf, PathBuf),
    /// None: the agent authenticates with a token alone.
    None,
}

impl AgentOpts {
    pub fn new(cluster: &str, server: impl ToString, allow: &[&str]) -> Self {
        Self {
            cluster: cluster.into(),
            servers: vec![server.to_string()],
            allow: allow.iter().map(|s| s.to_string()).collect(),
            node_name: format!("{cluster}-node-1"),
            dial_timeout: "5s".into(),
            tunnel_extra: String::new(),
            cert: AgentCert::OfCluster,
        }
    }
}

/// proxy-agent YAML (writes the agent's certificate): keepalive 500ms/2s, reconnect 100ms..1s.
/// A session is suspect only when it is dead (`suspect_after` = `timeout`): a PING answered
/// late on a loaded CI machine must not turn dials away in tests about something else; the
/// tests of suspect sessions ask for a suspect time of their own.
pub fn agent_yaml(pki: &TunnelPki, o: &AgentOpts) -> anyhow::Result<String> {
    let cert = match &o.cert {
        AgentCert::OfCluster => Some(pki.agent(&o.cluster)?),
        AgentCert::Files(c, k) => Some((c.clone(), k.clone())),
        AgentCert::None => None,
    };
    let identity = cert.map(|(c, k)| format!("cert: {}, key: {}, ", c.display(), k.display())).unwrap_or_default();
    let list = |v: &[String]| v.iter().map(|s| format!("\"{s}\"")).collect::<Vec<_>>().join(", ");
    Ok(format!(
        "admin: {{ listen: 127.0.0.1:0 }}\ndrain_grace: 1s\ntunnel:\n  servers: [{}]\n  tls: {{ {identity}ca: {}, server_name: {SERVER_NAME} }}\n  allow: [{}]\n  dial_timeout: {}\n  keepalive: {{ interval: 500ms, suspect_after: 2s, timeout: 2s }}\n  reconnect: {{ initial: 100ms, max: 1s }}\n  node_name: {}\n{}",
        list(&o.servers),
        pki.ca_file.display(),
        list(&o.allow),
        o.dial_timeout,
        o.node_name,
        o.tunnel_extra,
    ))
}

/// Make sure the seedgate binaries the tunnel tests run are built and fresh (a no-op when they
/// are; `cargo build --workspace --bins` before `cargo test` makes it one).
pub fn ensure_binaries() -> anyhow::Result<()> {
    let p = bin_path("proxy-server")?;
    let profile =
        if p.parent().and_then(Path::file_name).is_some_and(|n| n == "release") { "release" } else { "debug" };
    crate::proc::ensure_built(profile, &["proxy-server", "proxy-agent"])?;
    Ok(())
}

/// Start proxy-server with `yaml` (written to `<dir>/<stem>.yaml`).
pub async fn start_server(dir: &TempDir, stem: &str, yaml: &str) -> anyhow::Result<(Proc, Addresses)> {
    ensure_binaries()?;
    Proc::start_with_config(dir, "proxy-server", stem, yaml).await.map(|(p, a, _)| (p, a))
}

/// Start proxy-agent with `yaml`, inside `ns` when given.
pub async fn start_agent(
    dir: &TempDir,
    stem: &str,
    yaml: &str,
    ns: Option<&crate::netns::Netns>,
) -> anyhow::Result<(Proc, Addresses)> {
    ensure_binaries()?;
    let cfg = dir.write(&format!("{stem}.yaml"), yaml)?;
    let bin = bin_path("proxy-agent")?;
    let cmd = match ns {
        Some(ns) => ns.command(&bin),
        None => std::process::Command::new(&bin),
    };
    Proc::spawn_seedgate(cmd, &cfg, &[]).await
}

/// proxy-server with `yaml`, in this process.
pub async fn inproc_server(dir: &TempDir, yaml: &str) -> anyhow::Result<(InProc, Addresses)> {
    InProc::serve(dir, "proxy-server", yaml).await
}

/// proxy-agent with `yaml`, in this process.
pub async fn inproc_agent(dir: &TempDir, yaml: &str) -> anyhow::Result<(InProc, Addresses)> {
    InProc::serve(dir, "proxy-agent", yaml).await
}

/// `GET /metrics` of an admin listener.
pub async fn metrics(admin: SocketAddr) -> anyhow::Result<String> {
    let (code, body) = http_get(admin, "/metrics").await?;
    anyhow::ensure!(code == 200, "{admin}/metrics answered {code}");
    Ok(body)
}

/// Poll until proxy-server counts `n` agent sessions of `cluster`.
pub async fn wait_agents(server_admin: SocketAddr, cluster: &str, n: f64) -> anyhow::Result<()> {
    crate::poll::poll_until(STEP, Duration::from_millis(20), || async {
        let m = metrics(server_admin).await?;
        let have = crate::admin::metric_value(&m, "seedgate_agents_connected", &[("cluster", cluster)]).unwrap_or(0.0);
        anyhow::ensure!(have == n, "{have} agents of {cluster} connected, want {n}");
        Ok(())
    })
    .await
}

/// Open file descriptors of a process (entries of `/proc/<pid>/fd`).
pub fn fd_count(pid: u32) -> anyhow::Result<usize> {
    Ok(std::fs::read_dir(format!("/proc/{pid}/fd")).with_context(|| format!("/proc/{pid}/fd"))?.count())
}

// ---------------------------------------------------------------------------------------------
// Clients

/// Any byte stream a front end gives (TCP, TLS over TCP, Unix socket).
pub trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}
pub type BoxStream = Box<dyn Stream>;

/// How a client reaches a front end.
#[derive(Clone)]
pub enum Dialer {
    Tcp(SocketAddr),
    /// TLS with the client identity in the config; the server name verified.
    Tls(SocketAddr, Arc<ClientConfig>, String),
    Unix(PathBuf),
}

impl std::fmt::Debug for Dialer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Dialer::Tcp(a) => write!(f, "tcp:{a}"),
            Dialer::Tls(a, _, n) => write!(f, "tls:{a} ({n})"),
            Dialer::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

impl Dialer {
    pub async fn connect(&self) -> anyhow::Result<BoxStream> {
        let s: BoxStream = tokio::time::timeout(STEP, async {
            anyhow::Ok(match self {
                Dialer::Tcp(a) => Box::new(TcpStream::connect(a).await?) as BoxStream,
                Dialer::Unix(p) => Box::new(UnixStream::connect(p).await?),
                Dialer::Tls(a, cfg, name) => {
                    let tcp = TcpStream::connect(a).await?;
                    let sn = ServerName::try_from(name.clone())?;
                    Box::new(tokio_rustls::TlsConnector::from(cfg.clone()).connect(sn, tcp).await?)
                }
            })
        })
        .await
        .with_context(|| format!("connecting to the front end {self:?} timed out"))?
        .with_context(|| format!("connecting to the front end {self:?}"))?;
        Ok(s)
    }
}

/// The answer to a CONNECT that was not 200.
#[derive(Debug, Clone)]
pub struct Refusal {
    pub status: u16,
    pub head: String,
    pub body: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CONNECT answered {}: {:?}", self.status, self.body)
    }
}

impl std::error::Error for Refusal {}

/// Read a response head with large reads, as a buffered reader does; returns the head (without
/// the blank line) and every byte that arrived after it in the same reads.
async fn read_response_head<S: AsyncRead + Unpin + ?Sized>(s: &mut S) -> anyhow::Result<(String, Vec<u8>)> {
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    tokio::time::timeout(STEP, async {
        // Each round reads at least one byte or returns; the buffer is capped.
        loop {
            if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let rest = buf.split_off(p + 4);
                buf.truncate(p);
                return Ok((String::from_utf8_lossy(&buf).into_owned(), rest));
            }
            anyhow::ensure!(buf.len() <= HEAD_MAX, "response head larger than {HEAD_MAX} bytes");
            let n = s.read(&mut chunk).await?;
            anyhow::ensure!(n > 0, "EOF before the end of the response head (got {:?})", String::from_utf8_lossy(&buf));
            buf.extend_from_slice(&chunk[..n]);
        }
    })
    .await
    .context("no complete response head in time")?
}

fn status_of(head: &str) -> anyhow::Result<u16> {
    head.split(' ').nth(1).and_then(|s| s.parse().ok()).with_context(|| format!("bad status line in {head:?}"))
}

/// Read the rest of a refusal: the body by Content-Length (the front end closes after it).
async fn refusal<S: AsyncRead + Unpin + ?Sized>(s: &mut S, status: u16, head: String, mut rest: Vec<u8>) -> Refusal {
    let len = head
        .lines()
        .find_map(|l| l.split_once(':').filter(|(k, _)| k.trim().eq_ignore_ascii_case("content-length")))
        .and_then(|(_, v)| v.trim().parse::<usize>().ok());
    if let Some(len) = len {
        let mut chunk = [0u8; 1024];
        // Bounded by the length and the step deadline.
        let _ = tokio::time::timeout(STEP, async {
            while rest.len() < len {
                match s.read(&mut chunk).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => rest.extend_from_slice(&chunk[..n]),
                }
            }
        })
        .await;
    }
    Refusal { status, head, body: String::from_utf8_lossy(&rest).into_owned() }
}

/// `CONNECT target` exactly as kube-apiserver's egress dialer sends it
/// (`CONNECT <target> HTTP/1.1`, `Host: 127.0.0.1`, nothing else). On 200 it checks what Go's
/// dialer checks (`br.Buffered() > 0` is an error: no byte may follow the head before the client
/// speaks) and, stricter, that a short read attempt right after the head finds nothing either.
/// A non-200 answer is an error carrying a [`Refusal`].
pub async fn connect_strict(dialer: &Dialer, target: &str) -> anyhow::Result<BoxStream> {
    let mut s = dialer.connect().await?;
    s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").as_bytes()).await?;
    let (head, rest) = read_response_head(&mut s).await?;
    let status = status_of(&head)?;
    if status != 200 {
        return Err(refusal(&mut s, status, head, rest).await.into());
    }
    if !rest.is_empty() {
        bail!("unexpected {} bytes of buffered data from CONNECT proxy after {head:?}", rest.len());
    }
    let mut one = [0u8; 1];
    if let Ok(r) = tokio::time::timeout(Duration::from_millis(100), s.read(&mut one)).await {
        match r {
            Ok(0) => bail!("the CONNECT proxy closed right after 200"),
            Ok(_) => bail!("a byte ({:?}) followed the 200 head before the client spoke", one[0] as char),
            Err(e) => bail!("read after the 200 head failed: {e}"),
        }
    }
    Ok(s)
}

/// `CONNECT target HTTP/1.1` with `Host: target`, as curl and Go's proxy support send it; on
/// 200 returns the stream, which first yields any bytes that arrived with the head (a backend
/// that speaks first may be that quick). Non-200 is a [`Refusal`] error.
pub async fn connect(dialer: &Dialer, target: &str) -> anyhow::Result<BoxStream> {
    connect_with(dialer, &format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n")).await
}

/// [`connect`] with a request head of the caller's (its request line and headers, ending with
/// the blank line).
pub async fn connect_with(dialer: &Dialer, head: &str) -> anyhow::Result<BoxStream> {
    let mut s = dialer.connect().await?;
    s.write_all(head.as_bytes()).await?;
    let (head, rest) = read_response_head(&mut s).await?;
    let status = status_of(&head)?;
    if status != 200 {
        return Err(refusal(&mut s, status, head, rest).await.into());
    }
    Ok(Box::new(proxy_core::relay::io::Prefixed::new(rest, s)))
}

/// [`connect`] over plain TCP, keeping the TcpStream (for socket options such as a zero linger);
/// also returns the bytes that arrived with the head.
pub async fn connect_tcp(frontend: SocketAddr, target: &str) -> anyhow::Result<(TcpStream, Vec<u8>)> {
    let mut s = tokio::time::timeout(STEP, TcpStream::connect(frontend)).await.context("connect timed out")??;
    s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes()).await?;
    let (head, rest) = read_response_head(&mut s).await?;
    let status = status_of(&head)?;
    if status != 200 {
        return Err(refusal(&mut s, status, head, rest).await.into());
    }
    Ok((s, rest))
}

/// A CONNECT through `dialer` to an echo backend at `echo` carries a line there and back.
pub async fn echo_line(dialer: &Dialer, echo: SocketAddr) -> anyhow::Result<()> {
    let mut s = connect_strict(dialer, &echo.to_string()).await?;
    s.write_all(b"ping\n").await?;
    let mut b = [0u8; 5];
    tokio::time::timeout(STEP, s.read_exact(&mut b)).await.context("no echo")??;
    anyhow::ensure!(&b == b"ping\n", "echoed {b:?}");
    Ok(())
}

/// The [`Refusal`] in an error from [`connect`] / [`connect_strict`], if that is what it was.
pub fn refusal_of(e: &anyhow::Error) -> Option<&Refusal> {
    e.downcast_ref::<Refusal>()
}

/// TLS to `name` over an established tunnel stream; one HTTP/1.1 GET; the whole response.
pub async fn tls_get_over(s: BoxStream, ca: &Ca, name: &str, path: &str) -> anyhow::Result<String> {
    let cfg = pki::client_config(ca, None, &["http/1.1"])?;
    let sn = ServerName::try_from(name.to_owned())?;
    tokio::time::timeout(STEP, async {
        let mut tls = tokio_rustls::TlsConnector::from(cfg).connect(sn, s).await.context("TLS through the tunnel")?;
        tls.write_all(format!("GET {path} HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n").as_bytes()).await?;
        let mut out = Vec::new();
        (&mut tls).take(1 << 20).read_to_end(&mut out).await?;
        anyhow::Ok(String::from_utf8_lossy(&out).into_owned())
    })
    .await
    .context("TLS request through the tunnel timed out")?
}

// ---------------------------------------------------------------------------------------------
// Data and checksums

/// CRC-32C (hardware-assisted in the `crc32c` crate, which is built optimised even in test
/// builds): enough to tell a reordered, dropped or duplicated byte from a faithful copy, at
/// memory speed, so that checking a transfer costs far less than making it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Crc(pub u32);

impl Crc {
    pub fn update(&mut self, data: &[u8]) {
        self.0 = crc32c::crc32c_append(self.0, data);
    }
}

/// A deterministic byte stream (xorshift64*) of a given length, generated chunk by chunk.
#[derive(Debug, Clone)]
pub struct Pattern {
    state: u64,
    left: u64,
}

impl Pattern {
    pub fn new(seed: u64, len: u64) -> Self {
        Self { state: seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1, left: len }
    }

    /// Fill up to `buf.len()` bytes; returns how many (0 at the end).
    pub fn fill(&mut self, buf: &mut [u8]) -> usize {
        let n = (buf.len() as u64).min(self.left) as usize;
        for c in buf[..n].chunks_mut(8) {
            self.state ^= self.state >> 12;
            self.state ^= self.state << 25;
            self.state ^= self.state >> 27;
            let v = self.state.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
        self.left -= n as u64;
        n
    }

    /// The checksum of the whole stream.
    pub fn checksum(seed: u64, len: u64) -> Crc {
        let mut p = Pattern::new(seed, len);
        let mut f = Crc::default();
        let mut buf = vec![0u8; 64 * 1024];
        // Bounded by len / buf.len().
        loop {
            let n = p.fill(&mut buf);
            if n == 0 {
                return f;
            }
            f.update(&buf[..n]);
        }
    }
}

/// Write `len` pattern bytes of `seed`; returns their checksum.
pub async fn write_pattern<W: AsyncWrite + Unpin + ?Sized>(w: &mut W, seed: u64, len: u64) -> std::io::Result<Crc> {
    let mut p = Pattern::new(seed, len);
    let mut f = Crc::default();
    let mut buf = vec![0u8; 64 * 1024];
    // Bounded by len / buf.len().
    loop {
        let n = p.fill(&mut buf);
        if n == 0 {
            return Ok(f);
        }
        f.update(&buf[..n]);
        w.write_all(&buf[..n]).await?;
    }
}

/// Read to EOF; returns the byte count and checksum.
pub async fn read_checksum<R: AsyncRead + Unpin + ?Sized>(r: &mut R) -> std::io::Result<(u64, Crc)> {
    let mut f = Crc::default();
    let mut n = 0u64;
    let mut buf = vec![0u8; 64 * 1024];
    // Ends at EOF or an error; callers bound it with a deadline.
    loop {
        let k = r.read(&mut buf).await?;
        if k == 0 {
            return Ok((n, f));
        }
        n += k as u64;
        f.update(&buf[..k]);
    }
}

// ---------------------------------------------------------------------------------------------
// Backends

/// Reads every byte until EOF, then answers `<bytes> <crc32c hex>\n`, then `trailer` pattern bytes
/// (seed = the byte count), then closes. So a client learns that its FIN arrived (the answer
/// comes only after it) and that the backend can still send after it.
#[derive(Debug)]
pub struct ChecksumSink {
    addr: SocketAddr,
    accepted: Arc<AtomicU64>,
    _serving: Serving,
}

impl ChecksumSink {
    pub async fn start_on(addr: SocketAddr, trailer: u64) -> anyhow::Result<Self> {
        let l = TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
        let addr = l.local_addr()?;
        let accepted = Arc::new(AtomicU64::new(0));
        let serving = serve(l, accepted.clone(), move |mut s| async move {
            let Ok((n, f)) = read_checksum(&mut s).await else { return };
            if s.write_all(format!("{n} {:08x}\n", f.0).as_bytes()).await.is_err() {
                return;
            }
            let _ = write_pattern(&mut s, n, trailer).await;
            let _ = s.shutdown().await;
        });
        Ok(Self { addr, accepted, _serving: serving })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn connections(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }
}

/// Parse a [`ChecksumSink`] answer line.
pub fn parse_sum_line(line: &str) -> anyhow::Result<(u64, Crc)> {
    let (n, f) = line.trim().split_once(' ').with_context(|| format!("bad checksum line {line:?}"))?;
    Ok((n.parse()?, Crc(u32::from_str_radix(f, 16)?)))
}

/// Accepts and never reads (nor writes, nor closes): the stalled reader of head-of-line tests.
#[derive(Debug)]
pub struct Stall {
    addr: SocketAddr,
    accepted: Arc<AtomicU64>,
    _serving: Serving,
}

impl Stall {
    pub async fn start_on(addr: SocketAddr) -> anyhow::Result<Self> {
        let l = TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
        let addr = l.local_addr()?;
        let accepted = Arc::new(AtomicU64::new(0));
        let serving = serve(l, accepted.clone(), |s| async move {
            let _held = s;
            std::future::pending::<()>().await;
        });
        Ok(Self { addr, accepted, _serving: serving })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn connections(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }
}

/// Speaks first: sends `len` pattern bytes (seed 7) and its FIN at once, then reads until the
/// client's EOF and records `(bytes, checksum)` of what the client sent after that FIN.
#[derive(Debug)]
pub struct SpeakFirst {
    addr: SocketAddr,
    received: Arc<Mutex<Vec<(u64, Crc)>>>,
    _serving: Serving,
}

impl SpeakFirst {
    pub const SEED: u64 = 7;

    pub async fn start_on(addr: SocketAddr, len: u64) -> anyhow::Result<Self> {
        let l = TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
        let addr = l.local_addr()?;
        let received = Arc::new(Mutex::new(Vec::new()));
        let r = received.clone();
        let serving = serve(l, Arc::new(AtomicU64::new(0)), move |mut s| {
            let received = r.clone();
            async move {
                if write_pattern(&mut s, Self::SEED, len).await.is_err() || s.shutdown().await.is_err() {
                    return;
                }
                if let Ok(x) = read_checksum(&mut s).await {
                    received.lock().unwrap_or_else(|e| e.into_inner()).push(x);
                }
            }
        });
        Ok(Self { addr, received, _serving: serving })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// What each finished connection received from its client.
    pub fn received(&self) -> Vec<(u64, Crc)> {
        self.received.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// How a [`Watcher`] connection ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// The client's FIN (orderly end of stream).
    Eof,
    /// The client reset the connection (ECONNRESET).
    Reset,
    /// The watcher reset it itself (`reset_after`).
    ResetSent,
    Other(String),
}

/// Reads and counts; records how each connection ended. With `reset_after`, resets the
/// connection (RST, zero linger) once that many bytes arrived.
#[derive(Debug)]
pub struct Watcher {
    addr: SocketAddr,
    bytes: Arc<AtomicU64>,
    ends: Arc<Mutex<Vec<End>>>,
    _serving: Serving,
}

impl Watcher {
    pub async fn start_on(addr: SocketAddr, reset_after: Option<u64>) -> anyhow::Result<Self> {
        let l = TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
        let addr = l.local_addr()?;
        let bytes = Arc::new(AtomicU64::new(0));
        let ends = Arc::new(Mutex::new(Vec::new()));
        let (b, e) = (bytes.clone(), ends.clone());
        let serving = serve(l, Arc::new(AtomicU64::new(0)), move |mut s| {
            let (bytes, ends) = (b.clone(), e.clone());
            async move {
                let mut buf = vec![0u8; 64 * 1024];
                let mut got = 0u64;
                // Ends at EOF, an error or the reset point.
                let end = loop {
                    if reset_after.is_some_and(|n| got >= n) {
                        let _ = s.set_zero_linger();
                        drop(s);
                        break End::ResetSent;
                    }
                    match s.read(&mut buf).await {
                        Ok(0) => break End::Eof,
                        Ok(n) => {
                            got += n as u64;
                            bytes.fetch_add(n as u64, Ordering::Relaxed);
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break End::Reset,
                        Err(e) => break End::Other(e.to_string()),
                    }
                };
                ends.lock().unwrap_or_else(|e| e.into_inner()).push(end);
            }
        });
        Ok(Self { addr, bytes, ends, _serving: serving })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Bytes received over all connections.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    pub fn ends(&self) -> Vec<End> {
        self.ends.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// HTTPS: answers every request `200` with `body` (`Content-Type` as given, `Connection:
/// close`). With a Prometheus text body it is an HTTPS scrape target.
#[derive(Debug)]
pub struct TlsPage {
    addr: SocketAddr,
    accepted: Arc<AtomicU64>,
    _serving: Serving,
}

impl TlsPage {
    pub async fn start_on(
        addr: SocketAddr,
        cfg: Arc<rustls::ServerConfig>,
        content_type: &str,
        body: &str,
    ) -> anyhow::Result<Self> {
        let l = TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
        let addr = l.local_addr()?;
        let accepted = Arc::new(AtomicU64::new(0));
        let resp: Arc<[u8]> = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
        .into();
        let acceptor = tokio_rustls::TlsAcceptor::from(cfg);
        let serving = serve(l, accepted.clone(), move |s| {
            let (acceptor, resp) = (acceptor.clone(), resp.clone());
            async move {
                let _ = tokio::time::timeout(STEP, async {
                    let mut tls = acceptor.accept(s).await?;
                    let _ = read_response_head(&mut tls).await?;
                    tls.write_all(&resp).await?;
                    tls.shutdown().await?;
                    anyhow::Ok(())
                })
                .await;
            }
        });
        Ok(Self { addr, accepted, _serving: serving })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn connections(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }
}

/// A Prometheus text page with `testbed_up{target="<name>"} 1`.
pub fn metrics_page(name: &str) -> String {
    format!("# HELP testbed_up A stand-in scrape target.\n# TYPE testbed_up gauge\ntestbed_up{{target=\"{name}\"}} 1\n")
}

/// A rustls server config from PEM files (the stand-in binary's backends).
pub fn server_config_from_files(cert: &Path, key: &Path, alpn: &[&str]) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    use rustls_pki_types::pem::PemObject as _;
    let cert_pem = std::fs::read(cert).with_context(|| format!("reading {}", cert.display()))?;
    let key_pem = std::fs::read(key).with_context(|| format!("reading {}", key.display()))?;
    let chain = rustls_pki_types::CertificateDer::pem_slice_iter(&cert_pem).collect::<Result<Vec<_>, _>>()?;
    let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(&key_pem)?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(pki::provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    cfg.alpn_protocols = alpn.iter().map(|a| a.as_bytes().to_vec()).collect();
    Ok(Arc::new(cfg))
}

/// A listener whose accept queue is full and never drained: once `fill` returned, every further
/// SYN is dropped by the kernel (`listen(fd, 0)` holds one queued connection; a SYN that finds
/// the queue full is discarded without an answer), so a connect to it can only time out. No
/// packet filter and no route tricks, and it works on loopback and on a veth address alike.
#[derive(Debug)]
pub struct SilentPort {
    addr: SocketAddr,
    _listener: TcpListener,
    _fillers: Vec<TcpStream>,
}

impl SilentPort {
    pub async fn start_on(addr: SocketAddr) -> anyhow::Result<Self> {
        let sock = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
        sock.bind(addr)?;
        let listener = sock.listen(0)?;
        let addr = listener.local_addr()?;
        let filler =
            tokio::time::timeout(STEP, TcpStream::connect(addr)).await.context("filler connect timed out")??;
        // The queue is full once the kernel counts the filler in the listener's backlog
        // (the rx_queue of a LISTEN socket in /proc/net/tcp is the accept-queue length).
        crate::poll::poll_until(STEP, Duration::from_millis(5), || async { listen_queue(addr).filter(|&n| n >= 1) })
            .await
            .context("the filler connection never reached the accept queue")?;
        Ok(Self { addr, _listener: listener, _fillers: vec![filler] })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// The accept-queue length of the LISTEN socket on `addr` (from /proc/net/tcp of this namespace).
fn listen_queue(addr: SocketAddr) -> Option<u64> {
    let SocketAddr::V4(a) = addr else { return None };
    let text = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let want = format!("{:08X}:{:04X}", u32::from_ne_bytes(a.ip().octets()), a.port());
    text.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        // local_address, rem_address, st (0A = LISTEN), tx_queue:rx_queue
        (f.len() > 4 && f[1] == want && f[3] == "0A")
            .then(|| f[4].split_once(':').and_then(|(_, rx)| u64::from_str_radix(rx, 16).ok()))
            .flatten()
    })
}

// ---------------------------------------------------------------------------------------------
// Routes

/// A route added with `ip route add ...` in the test's namespace, deleted on drop.
#[derive(Debug)]
pub struct RouteGuard(Vec<String>);

impl RouteGuard {
    /// E.g. `RouteGuard::add(&["unreachable", "10.250.7.0/24"])`.
    pub fn add(spec: &[&str]) -> anyhow::Result<Self> {
        let out = std::process::Command::new("ip")
            .args(["route", "add"])
            .args(spec)
            .output()
            .context("running ip route add")?;
        anyhow::ensure!(out.status.success(), "ip route add {spec:?}: {}", String::from_utf8_lossy(&out.stderr).trim());
        Ok(Self(spec.iter().map(|s| s.to_string()).collect()))
    }
}

impl Drop for RouteGuard {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip").args(["route", "del"]).args(&self.0).output();
    }
}
