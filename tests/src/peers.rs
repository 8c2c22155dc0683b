//! Third-party peers (haproxy, nginx, curl) for end-to-end tests, and the small client helpers
//! the path-P2 tests share: finding a program (or skipping with `SEEDGATE_SKIP_MISSING=1`), a
//! free port for programs that cannot listen on port 0, waiting until a socket listens (read
//! from `/proc/net/tcp`, so no probe connection disturbs the peer or its upstream's metrics),
//! TLS from a chosen source address, and reading an HTTP response head.

use crate::proc::Proc;
use crate::tmp::TempDir;
use anyhow::{Context as _, bail};
use rustls::ClientConfig;
use rustls_pki_types::ServerName;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncReadExt as _;
use tokio::net::{TcpSocket, TcpStream};
use tokio_rustls::client::TlsStream;

/// Set to `1` to skip (with a `SKIP:` line) tests whose third-party program is not installed.
pub const SKIP_MISSING_ENV: &str = "SEEDGATE_SKIP_MISSING";

/// How long a third-party peer may take to start listening.
pub const PEER_START_DEADLINE: Duration = Duration::from_secs(20);

const NGINX_STREAM_MODULE: &str = "/usr/lib/nginx/modules/ngx_stream_module.so";

/// The path of `program` (searched in `$PATH`, then `/usr/sbin`, `/usr/bin`). When it is
/// missing: `Ok(None)` after printing `SKIP:` if `SEEDGATE_SKIP_MISSING=1`, else an error that
/// names the Debian package to install.
pub fn require(program: &str, package: &str) -> anyhow::Result<Option<PathBuf>> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs = std::env::split_paths(&path).chain(["/usr/sbin".into(), "/usr/bin".into(), "/sbin".into()]);
    for d in dirs {
        let p = d.join(program);
        if p.is_file() {
            return Ok(Some(p));
        }
    }
    missing(&format!("{program} is not installed (apt-get install {package})"))
}

/// `Ok(None)` after printing `SKIP:` if skipping is allowed, else an error saying how to install it.
pub(crate) fn missing<T>(what: &str) -> anyhow::Result<Option<T>> {
    if std::env::var(SKIP_MISSING_ENV).as_deref() == Ok("1") {
        println!("SKIP: {what}");
        eprintln!("SKIP: {what}");
        return Ok(None);
    }
    bail!("{what}; .ci/run installs it, or set {SKIP_MISSING_ENV}=1 to skip this test")
}

/// A port that is free on every one of `ips` right now (bound and released at once), for
/// programs that cannot listen on port 0. Use it at once: another process could take it.
pub fn free_port(ips: &[Ipv4Addr]) -> anyhow::Result<u16> {
    let first = *ips.first().context("free_port needs at least one address")?;
    // A handful of attempts: a port free on the first address is almost always free on the
    // others too (loopback addresses share nothing but the port space of wildcard binds).
    for _ in 0..20 {
        let l = std::net::TcpListener::bind((first, 0)).context("binding a probe socket")?;
        let port = l.local_addr()?.port();
        let others: Vec<_> = ips[1..].iter().map(|ip| std::net::TcpListener::bind((*ip, port))).collect();
        if others.iter().all(Result::is_ok) {
            return Ok(port);
        }
    }
    bail!("no port free on all of {ips:?} in 20 attempts")
}

/// Whether `/proc/net/tcp` lists a listening socket on `addr` (or on 0.0.0.0 with its port).
/// IPv4 only, which is all the loopback tests use.
pub fn is_listening(addr: SocketAddr) -> bool {
    let IpAddr::V4(ip) = addr.ip() else { return false };
    let Ok(table) = std::fs::read_to_string("/proc/net/tcp") else {
        return false;
    };
    table.lines().skip(1).any(|l| {
        let mut f = l.split_whitespace();
        let (Some(_), Some(local), Some(_), Some(state)) = (f.next(), f.next(), f.next(), f.next()) else {
            return false;
        };
        let Some((h, p)) = local.split_once(':') else { return false };
        let (Ok(h), Ok(p)) = (u32::from_str_radix(h, 16), u16::from_str_radix(p, 16)) else {
            return false;
        };
        // The kernel prints the network-order address as a native integer.
        let a = Ipv4Addr::from(h.to_ne_bytes());
        state == "0A" && p == addr.port() && (a == ip || a.is_unspecified())
    })
}

/// A running third-party program and the directory holding its config (removed on drop,
/// after the process is killed).
#[derive(Debug)]
pub struct Peer {
    pub proc: Proc,
    pub dir: TempDir,
}

impl Peer {
    /// Wait until every one of `addrs` listens; fails early (with the log) if the program exits.
    pub async fn wait_listening(&mut self, addrs: &[SocketAddr]) -> anyhow::Result<()> {
        let proc = &mut self.proc;
        let r = crate::poll::poll_until(PEER_START_DEADLINE, Duration::from_millis(20), || {
            let running = proc.running();
            async move {
                if !running {
                    return Ok(Err(anyhow::anyhow!("exited")));
                }
                if addrs.iter().all(|a| is_listening(*a)) {
                    Ok(Ok(()))
                } else {
                    Err(anyhow::anyhow!("not listening on all of {addrs:?} yet"))
                }
            }
        })
        .await;
        match r {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) | Err(e) => Err(e.context(format!("log:\n{}", self.proc.log()))),
        }
    }
}

/// Start `haproxy -db -f <cfg>` (foreground) with `config` and wait until it listens on
/// `listens`. `Ok(None)`: haproxy is missing and skipping is allowed.
pub async fn start_haproxy(config: &str, listens: &[SocketAddr]) -> anyhow::Result<Option<Peer>> {
    let Some(bin) = require("haproxy", "haproxy")? else { return Ok(None) };
    let dir = TempDir::new("haproxy")?;
    let cfg = dir.write("haproxy.cfg", config)?;
    let cfg_s = cfg.to_string_lossy().into_owned();
    let check = std::process::Command::new(&bin).args(["-c", "-q", "-f", &cfg_s]).output()?;
    anyhow::ensure!(
        check.status.success(),
        "haproxy -c rejects the config:\n{config}\n{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    let proc = Proc::start(&bin, &["-db", "-f", &cfg_s], &[])?;
    let mut peer = Peer { proc, dir };
    peer.wait_listening(listens).await.context("haproxy did not start")?;
    Ok(Some(peer))
}

/// Start nginx in the foreground with only a `stream { ... }` block (`stream_block` is its
/// inside), one process (`master_process off`, so killing it leaves no worker behind), logs and
/// pid in its own directory; wait until it listens on `listens`.
pub async fn start_nginx(stream_block: &str, listens: &[SocketAddr]) -> anyhow::Result<Option<Peer>> {
    let Some(bin) = require("nginx", "nginx libnginx-mod-stream")? else { return Ok(None) };
    if !Path::new(NGINX_STREAM_MODULE).exists() {
        return missing(&format!("{NGINX_STREAM_MODULE} is not installed (apt-get install libnginx-mod-stream)"));
    }
    let dir = TempDir::new("nginx")?;
    let d = dir.path().display().to_string();
    let conf = format!(
        "load_module {NGINX_STREAM_MODULE};\nmaster_process off;\nworker_processes 1;\n\
         error_log {d}/error.log info;\npid {d}/nginx.pid;\nevents {{ worker_connections 64; }}\n\
         stream {{\n{stream_block}\n}}\n"
    );
    let cfg = dir.write("nginx.conf", &conf)?;
    let cfg_s = cfg.to_string_lossy().into_owned();
    let err_log = format!("{d}/error.log");
    let check = std::process::Command::new(&bin).args(["-t", "-p", &d, "-e", &err_log, "-c", &cfg_s]).output()?;
    anyhow::ensure!(
        check.status.success(),
        "nginx -t rejects the config:\n{conf}\n{}",
        String::from_utf8_lossy(&check.stderr)
    );
    let proc = Proc::start(&bin, &["-p", &d, "-e", &err_log, "-c", &cfg_s, "-g", "daemon off;"], &[])?;
    let mut peer = Peer { proc, dir };
    let r = peer.wait_listening(listens).await;
    if let Err(e) = r {
        let log = std::fs::read_to_string(&err_log).unwrap_or_default();
        return Err(e.context(format!("nginx did not start; error.log:\n{log}")));
    }
    Ok(Some(peer))
}

/// Run curl with `args` (bounded by 30 s); `Ok(None)` when curl is missing and skipping is allowed.
pub async fn curl(args: &[&str]) -> anyhow::Result<Option<std::process::Output>> {
    let Some(bin) = require("curl", "curl")? else { return Ok(None) };
    let mut cmd = tokio::process::Command::new(bin);
    cmd.args(args).stdin(std::process::Stdio::null()).kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(30), cmd.output())
        .await
        .with_context(|| format!("curl {args:?} did not finish within 30s"))?
        .with_context(|| format!("running curl {args:?}"))?;
    Ok(Some(out))
}

/// A TCP connection to `addr` from `src` (an address of this host, port chosen by the kernel).
pub async fn connect_from(src: IpAddr, addr: SocketAddr) -> anyhow::Result<TcpStream> {
    let sock = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    sock.bind(SocketAddr::new(src, 0)).with_context(|| format!("binding {src}"))?;
    let s = tokio::time::timeout(Duration::from_secs(10), sock.connect(addr))
        .await
        .with_context(|| format!("connecting {addr} timed out"))?
        .with_context(|| format!("connecting {addr} from {src}"))?;
    s.set_nodelay(true)?;
    Ok(s)
}

/// A TLS handshake over an already connected stream (for example one that carries a PROXY
/// header or went through a CONNECT), bounded by 10 s.
pub async fn tls_over(tcp: TcpStream, sni: &str, cfg: Arc<ClientConfig>) -> anyhow::Result<TlsStream<TcpStream>> {
    let name = ServerName::try_from(sni.to_owned()).with_context(|| format!("bad SNI {sni:?}"))?;
    let connector = tokio_rustls::TlsConnector::from(cfg);
    tokio::time::timeout(Duration::from_secs(10), connector.connect(name, tcp))
        .await
        .context("TLS handshake timed out")?
        .context("TLS handshake")
}

/// Read until the end of an HTTP response head (`\r\n\r\n`), within 10 s and 64 KiB. Returns
/// everything read, which may run past the head if the peer sent more at once: callers that
/// promise "the head arrives alone" compare it with the head.
pub async fn read_response_head(s: &mut TcpStream) -> anyhow::Result<Vec<u8>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    tokio::time::timeout(Duration::from_secs(10), async {
        // Each round reads at least one byte or returns; the size is capped.
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            anyhow::ensure!(buf.len() < 64 * 1024, "no end of head in 64 KiB");
            let n = s.read(&mut chunk).await?;
            anyhow::ensure!(n > 0, "EOF before the end of the head; got {:?}", String::from_utf8_lossy(&buf));
            buf.extend_from_slice(&chunk[..n]);
        }
        anyhow::Ok(())
    })
    .await
    .context("response head timed out")??;
    Ok(buf)
}

/// Read to EOF within 10 s; a reset after some bytes still returns them.
pub async fn read_to_close(s: &mut TcpStream) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    let r = tokio::time::timeout(Duration::from_secs(10), (&mut *s).take(1 << 20).read_to_end(&mut out))
        .await
        .context("the peer did not close within 10s")?;
    match r {
        Ok(_) => Ok(out),
        Err(_) if !out.is_empty() => Ok(out),
        Err(e) => Err(e.into()),
    }
}
