//! proxy-server's HTTP CONNECT and forward-proxy front end on a Unix socket with the request forms clients send there, with a `Host` header that names the target, kube-apiserver's `127.0.0.1`, `localhost`, the socket's path as it is or percent-encoded (what a client that fills `Host` from its dial target sends), or none.
//!
//! curl reaches a proxy on a Unix socket only by writing the proxy request itself
//! (`--unix-socket` turns `-x` off): `--request-target` makes its absolute-form request, and its
//! plain request (origin-form, `Host: localhost`) is refused with a 400 that says why. CONNECT
//! is written as kube-apiserver's egress dialer writes it. The target alone says where to go:
//! `Host` is never parsed as an authority, so no form of it is refused (the gRPC front end's
//! `:authority` is, by hyper's HTTP/2, and needs the request normaliser).

use anyhow::Context as _;
use std::path::PathBuf;
use testbed::tunnel_kit::{
    AgentOpts, Dialer, Fe, FeKind, TunnelPki, agent_yaml, connect_with, inproc_agent, inproc_server, server_yaml,
    wait_agents,
};
use testbed::{HttpBackend, InProc, TcpEcho, TempDir};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

struct World {
    _dir: TempDir,
    sock: PathBuf,
    _server: InProc,
    _agent: InProc,
}

impl World {
    async fn start() -> anyhow::Result<Self> {
        let dir = TempDir::new("uds-clients")?;
        let pki = TunnelPki::new(dir.path())?;
        let sock = dir.join("run/egress.sock");
        let fes = [Fe::new("uds", "shoot-a", FeKind::Unix(sock.clone()))];
        let (server, saddrs) = inproc_server(&dir, &server_yaml(&pki, "127.0.0.1:0", &fes, "")).await?;
        let o = AgentOpts::new("shoot-a", saddrs.listener("agents")?, &["127.0.0.1/32"]);
        let (agent, _) = inproc_agent(&dir, &agent_yaml(&pki, &o)?).await?;
        wait_agents(saddrs.admin()?, "shoot-a", 1.0).await.with_context(|| agent.log())?;
        Ok(Self { _dir: dir, sock, _server: server, _agent: agent })
    }

    /// `Host` values besides the target: kube-apiserver's, curl's for `http://localhost`, the
    /// socket's path, and the path percent-encoded as gRPC core writes an authority.
    fn hosts(&self) -> Vec<String> {
        let path = self.sock.display().to_string();
        let encoded = path.trim_start_matches('/').replace('/', "%2F");
        vec!["127.0.0.1".into(), "localhost".into(), path, encoded]
    }
}

/// curl through the socket: its status line and body.
async fn curl(args: &[&str]) -> anyhow::Result<Option<(String, String)>> {
    let Some(out) = testbed::peers::curl(args).await? else { return Ok(None) };
    anyhow::ensure!(out.status.success(), "curl {args:?}: {}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").with_context(|| format!("no head in {text:?}"))?;
    Ok(Some((head.lines().next().unwrap_or_default().to_owned(), body.to_owned())))
}

/// curl's absolute-form request through the socket (`--request-target`), with its own `Host`
/// (`localhost`, from the URL) and each other form: forwarded with the client's `Host`.
#[tokio::test]
async fn curl_absolute_form_through_the_socket_with_any_host() -> anyhow::Result<()> {
    let w = World::start().await?;
    let page = HttpBackend::start("text/plain", "forwarded").await?;
    let target = format!("http://{}/forward", page.addr());
    let sock = w.sock.display().to_string();
    let mut hosts = vec![None];
    hosts.extend(w.hosts().into_iter().map(Some));
    for host in hosts {
        let header = host.as_ref().map(|h| format!("Host: {h}"));
        let mut args = vec!["-sS", "-i", "--max-time", "20", "--unix-socket", &sock, "--request-target", &target];
        if let Some(h) = &header {
            args.extend(["-H", h]);
        }
        args.push("http://localhost/forward");
        let Some((status, body)) = curl(&args).await? else { return Ok(()) };
        anyhow::ensure!(status.contains(" 200 ") && body == "forwarded", "Host {host:?}: {status} {body:?}");
        let want = format!("host: {}", host.as_deref().unwrap_or("localhost"));
        let seen = page.requests().pop().unwrap_or_default();
        anyhow::ensure!(seen.to_ascii_lowercase().contains(&want.to_ascii_lowercase()), "{want} not in {seen}");
    }
    anyhow::ensure!(page.connections() == 5, "{} connections to the page", page.connections());
    Ok(())
}

/// curl's plain request on the socket (what `-x` with `--unix-socket` comes to): a 400 that
/// says it is not a proxy request.
#[tokio::test]
async fn curl_origin_form_on_the_socket_is_refused_with_a_reason() -> anyhow::Result<()> {
    let w = World::start().await?;
    let sock = w.sock.display().to_string();
    let args = ["-sS", "-i", "--max-time", "20", "--unix-socket", &sock, "-x", "http://localhost", "http://10.0.0.1/x"];
    let Some((status, body)) = curl(&args).await? else { return Ok(()) };
    anyhow::ensure!(status.contains(" 400 "), "{status}");
    anyhow::ensure!(body.contains("neither CONNECT nor an absolute-form http:// request"), "{body}");
    Ok(())
}

/// CONNECT through the socket as kube-apiserver writes it, with each `Host` form and with none
/// (HTTP/1.0 and 1.1): the tunnel carries bytes both ways.
#[tokio::test]
async fn connect_through_the_socket_with_any_host() -> anyhow::Result<()> {
    let w = World::start().await?;
    let echo = TcpEcho::start().await?;
    let target = echo.addr().to_string();
    let mut heads: Vec<String> =
        w.hosts().iter().map(|h| format!("CONNECT {target} HTTP/1.1\r\nHost: {h}\r\n\r\n")).collect();
    heads.push(format!("CONNECT {target} HTTP/1.1\r\n\r\n"));
    heads.push(format!("CONNECT {target} HTTP/1.0\r\n\r\n"));
    for head in heads {
        let mut s = connect_with(&Dialer::Unix(w.sock.clone()), &head).await.with_context(|| head.clone())?;
        s.write_all(b"ping").await?;
        let mut back = [0u8; 4];
        tokio::time::timeout(std::time::Duration::from_secs(10), s.read_exact(&mut back)).await??;
        anyhow::ensure!(&back == b"ping", "{head:?}: {back:?}");
    }
    Ok(())
}
