//! The lifecycle every binary shares, end to end through the binaries (in this process): host names as listen
//! addresses, the addresses file after a reload, restart-only keys refused by name, and a
//! `limits.max_connections` reload that takes effect.

use anyhow::Context as _;
use std::net::SocketAddr;
use std::time::Duration;
use testbed::tunnel_kit::{AgentOpts, Fe, FeKind, TunnelPki, agent_yaml, server_yaml};
use testbed::{InProc, TempDir, http_get, metric_value, poll_until};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const DEADLINE: Duration = Duration::from_secs(20);
const TICK: Duration = Duration::from_millis(20);

fn router_yaml(admin: &str, listen: &str) -> String {
    format!(
        "admin: {{ listen: {admin} }}\nlisteners:\n  - name: gateway\n    listen: {listen}\n    routes:\n      - name: r\n        sni: [a.example.com]\n        upstreams: [127.0.0.1:9]\n"
    )
}

fn agent_proxy_yaml(admin: &str, listen: &str) -> String {
    format!(
        "admin: {{ listen: {admin} }}\napiserver_proxy:\n  listen: [{listen}]\n  gateway: 127.0.0.1:9\n  mode: proxy-protocol-v2\n"
    )
}

fn tunnel_server_yaml(pki: &TunnelPki, listen: &str, extra: &str) -> String {
    let fe = Fe::new("egress", "shoot-a", FeKind::Plain);
    server_yaml(pki, listen, &[fe], extra).replace("127.0.0.1:0", listen)
}

fn is_loopback(a: &str) -> bool {
    a.parse::<SocketAddr>().is_ok_and(|s| s.ip().is_loopback() && s.port() != 0)
}

async fn healthz(addr: SocketAddr) -> anyhow::Result<()> {
    let (code, _) = http_get(addr, "/healthz").await?;
    anyhow::ensure!(code == 200, "/healthz on {addr} answered {code}");
    Ok(())
}

#[tokio::test]
async fn listen_host_names_work_in_every_binary() -> anyhow::Result<()> {
    let dir = TempDir::new("lifecycle-names")?;
    let pki = TunnelPki::new(dir.path())?;
    let router = InProc::start(&dir, "sni-router", &router_yaml("localhost:0", "localhost:0")).await?;
    let server = InProc::start(&dir, "proxy-server", &tunnel_server_yaml(&pki, "localhost:0", "")).await?;
    let agent = InProc::start(&dir, "proxy-agent", &agent_proxy_yaml("localhost:0", "localhost:0")).await?;
    for (r, names) in
        [(&router, &["gateway"][..]), (&server, &["agents", "egress"][..]), (&agent, &["apiserver-proxy"][..])]
    {
        let a = r.read_addresses().context("addresses")?;
        healthz(a.admin()?).await?;
        for n in names {
            let l = a.listeners.get(*n).with_context(|| format!("listener {n} in {a:?}"))?;
            anyhow::ensure!(is_loopback(l), "{n} bound {l}, not a loopback address from `localhost`");
            TcpStream::connect(l.as_str()).await.with_context(|| format!("connecting to {n} at {l}"))?;
        }
    }
    Ok(())
}

/// A reload that moves the admin listener applies in every binary, and the addresses file says
/// where it went.
#[tokio::test]
async fn addresses_file_rewritten_after_a_reload_in_every_binary() -> anyhow::Result<()> {
    let dir = TempDir::new("lifecycle-addrs")?;
    let pki = TunnelPki::new(dir.path())?;
    let cases = [
        ("sni-router", router_yaml("127.0.0.1:0", "127.0.0.1:0"), router_yaml("127.0.0.2:0", "127.0.0.1:0")),
        ("proxy-server", tunnel_server_yaml(&pki, "127.0.0.1:0", ""), {
            tunnel_server_yaml(&pki, "127.0.0.1:0", "").replacen(
                "admin: { listen: 127.0.0.1:0 }",
                "admin: { listen: 127.0.0.2:0 }",
                1,
            )
        }),
        ("proxy-agent", agent_proxy_yaml("127.0.0.1:0", "127.0.0.1:0"), agent_proxy_yaml("127.0.0.2:0", "127.0.0.1:0")),
    ];
    for (bin, before, after) in cases {
        anyhow::ensure!(before != after, "{bin}: the test must change the config");
        let r = InProc::start(&dir, bin, &before).await?;
        let old = r.read_addresses().context("addresses")?;
        let old_admin = old.admin()?;
        r.reload_with(&after).await?;
        let new = r.addresses_where(|a| a.admin.is_some_and(|x| x.ip().to_string() == "127.0.0.2")).await?;
        let new_admin = new.admin()?;
        healthz(new_admin).await.with_context(|| format!("{bin}: new admin listener"))?;
        r.wait_reloads(new_admin, "success", 1.0).await?;
        anyhow::ensure!(new.listeners == old.listeners, "{bin}: listeners moved: {old:?} -> {new:?}");
        // The old admin listener is closed.
        poll_until(DEADLINE, TICK, || async move {
            match TcpStream::connect(old_admin).await {
                Err(_) => Ok(()),
                Ok(_) => Err(anyhow::anyhow!("old admin still accepting")),
            }
        })
        .await?;
    }
    Ok(())
}

/// Keys a binary cannot apply are refused by name; the running config (and its sockets) stay.
#[tokio::test]
async fn restart_only_keys_are_refused_by_name() -> anyhow::Result<()> {
    let dir = TempDir::new("lifecycle-refused")?;
    let pki = TunnelPki::new(dir.path())?;
    let o = AgentOpts::new("shoot-a", "127.0.0.1:9", &["127.0.0.0/8"]);
    let proxy = "apiserver_proxy:\n  listen: [127.0.0.1:0]\n  gateway: 127.0.0.1:9\n  mode: proxy-protocol-v2\n";
    let ayaml = format!("{}{proxy}", agent_yaml(&pki, &o)?);
    let agent = InProc::start(&dir, "proxy-agent", &ayaml).await?;
    let admin = agent.read_addresses().context("addresses")?.admin()?;
    agent.reload_with(&ayaml.replace("listen: [127.0.0.1:0]", "listen: [127.0.0.2:0]")).await?;
    agent.wait_reloads(admin, "failure", 1.0).await?;
    let log = agent.log();
    anyhow::ensure!(
        log.contains("apiserver_proxy.listen[0] cannot change at runtime; restart proxy-agent to apply it"),
        "the refusal names the key:\n{log}"
    );
    anyhow::ensure!(agent.reloads(admin, "success").await == 0.0);
    Ok(())
}

/// Send a CONNECT on `s` and read the status line of the answer.
async fn connect_status(s: &mut TcpStream) -> anyhow::Result<String> {
    s.write_all(b"CONNECT 127.0.0.1:9 HTTP/1.1\r\nHost: 127.0.0.1:9\r\n\r\n").await?;
    let mut buf = vec![0u8; 256];
    let n = s.read(&mut buf).await?;
    Ok(String::from_utf8_lossy(&buf[..n]).lines().next().unwrap_or_default().to_owned())
}

/// proxy-server: a reload of `limits.max_connections` changes how many front-end connections
/// are served at once (it was accepted and ignored before).
#[tokio::test]
async fn max_connections_reload_takes_effect_on_proxy_server() -> anyhow::Result<()> {
    let dir = TempDir::new("lifecycle-limit")?;
    let pki = TunnelPki::new(dir.path())?;
    // A long handshake deadline: the first connection idles between requests while the test runs.
    let one = tunnel_server_yaml(&pki, "127.0.0.1:0", "limits: { max_connections: 1 }\ntimeouts: { handshake: 60s }\n");
    let server = InProc::start(&dir, "proxy-server", &one).await?;
    let a = server.read_addresses().context("addresses")?;
    let (admin, fe) = (a.admin()?, a.listener("egress")?);
    // The first connection holds the only slot: its request head was read (a slot is taken
    // then, not at accept), and it stays open for the next request (keep-alive).
    let mut first = TcpStream::connect(fe).await?;
    first.write_all(b"GET http://127.0.0.1:9/ HTTP/1.1\r\nHost: 127.0.0.1:9\r\n\r\n").await?;
    let mut buf = vec![0u8; 512];
    let n = tokio::time::timeout(DEADLINE, first.read(&mut buf)).await??;
    anyhow::ensure!(n > 0 && buf.starts_with(b"HTTP/1.1 "), "an answer to the first request");
    // The second waits in the kernel's backlog while the first holds the slot (the process says
    // it is at the limit), until a reload raises the limit, with the first still open. (Were the
    // reload ignored, it would never be answered.)
    let mut second = TcpStream::connect(fe).await?;
    poll_until(DEADLINE, TICK, || async move {
        let text = http_get(admin, "/metrics").await.map(|(_, b)| b).unwrap_or_default();
        let n = metric_value(&text, "seedgate_connection_limit_waiting", &[]).unwrap_or(0.0);
        if n == 1.0 { Ok(()) } else { Err(anyhow::anyhow!("{n} waiting at the limit")) }
    })
    .await?;
    server.reload_with(&one.replace("max_connections: 1", "max_connections: 2")).await?;
    let status = tokio::time::timeout(DEADLINE, connect_status(&mut second))
        .await
        .with_context(|| format!("no answer after raising the limit; log:\n{}", server.log()))??;
    anyhow::ensure!(status.starts_with("HTTP/1.1 503"), "no agent is connected, so 503: {status}");
    // The reload is counted once it finished (after the slots grew and the addresses file was
    // rewritten), which may trail the answer the bigger limit let through.
    server.wait_reloads(admin, "success", 1.0).await?;
    anyhow::ensure!(server.reloads(admin, "success").await == 1.0);
    drop(first);
    Ok(())
}
