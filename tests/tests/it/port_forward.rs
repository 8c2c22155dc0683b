//! Port forwards (`protocol: tcp`): a front end whose every connection goes to one fixed target
//! of one cluster. 16 MiB each way at once with checksums, over TCP and a Unix socket; the access
//! event and metrics as CONNECT's; refusals (a target the agent may not dial, a cluster without
//! agents, the cluster's share of streams); a reload that moves the target; curl getting a page
//! from the shoot through one, as a client that speaks neither CONNECT nor a proxy URL.

use anyhow::Context as _;
use std::path::Path;
use std::time::Duration;
use testbed::tunnel_kit::{
    AgentOpts, BoxStream, Dialer, Fe, FeKind, Pattern, SpeakFirst, TunnelPki, agent_yaml, inproc_agent, inproc_server,
    read_checksum, server_yaml, write_pattern,
};
use testbed::{InProc, TempDir, metric_value, poll_until};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const DEADLINE: Duration = Duration::from_secs(30);
const TICK: Duration = Duration::from_millis(20);
const MIB_16: u64 = 16 << 20;

fn value(m: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    metric_value(m, name, labels).unwrap_or(0.0)
}

/// Front ends `fwd` (TCP) and `fwd-unix` (a socket in `dir`) to `target` in shoot-a, and
/// `fwd-b` to the same target in shoot-b (no agents).
fn server_config(pki: &TunnelPki, dir: &Path, target: &str, extra: &str) -> String {
    let fes = [Fe::new("connect", "shoot-a", FeKind::Plain)];
    let forwards = format!(
        "  - {{ name: fwd, listen: 127.0.0.1:0, cluster: shoot-a, protocol: tcp, target: \"{target}\" }}\n  - {{ name: fwd-unix, unix: {}, cluster: shoot-a, protocol: tcp, target: \"{target}\" }}\n  - {{ name: fwd-b, listen: 127.0.0.1:0, cluster: shoot-b, protocol: tcp, target: \"{target}\" }}\n",
        dir.join("fwd.sock").display()
    );
    server_yaml(pki, "127.0.0.1:0", &fes, &format!("{extra}clusters:\n  shoot-b: {{ state: active }}\n")).replacen(
        "frontends:\n",
        &format!("frontends:\n{forwards}"),
        1,
    )
}

/// Write `len` bytes (seed 11) and read to EOF at once: what came back, as (bytes, checksum).
async fn both_ways(s: BoxStream, len: u64) -> anyhow::Result<(u64, testbed::tunnel_kit::Crc)> {
    let (mut r, mut w) = tokio::io::split(s);
    let send = async {
        write_pattern(&mut w, 11, len).await?;
        w.shutdown().await?;
        anyhow::Ok(())
    };
    let (sent, got) = tokio::time::timeout(DEADLINE, async { tokio::join!(send, read_checksum(&mut r)) })
        .await
        .context("16 MiB each way did not finish in time")?;
    sent?;
    Ok(got?)
}

async fn agent_up(server: &InProc) -> anyhow::Result<()> {
    poll_until(DEADLINE, TICK, || async {
        let n = value(&server.metrics(), "seedgate_agents_connected", &[("cluster", "shoot-a")]);
        anyhow::ensure!(n == 1.0, "{n} agents");
        Ok(())
    })
    .await
}

/// A connection the front end closes without a byte: the refusal of a port forward.
async fn refused(d: &Dialer) -> anyhow::Result<()> {
    let mut s = d.connect().await?;
    let mut b = [0u8; 1];
    let n = tokio::time::timeout(DEADLINE, s.read(&mut b)).await.context("not closed")?.unwrap_or(0);
    anyhow::ensure!(n == 0, "a refused port forward sent {n} bytes");
    Ok(())
}

#[tokio::test]
async fn a_port_forward_carries_16_mib_each_way_over_tcp_and_a_unix_socket() -> anyhow::Result<()> {
    let dir = TempDir::new("port-forward")?;
    let pki = TunnelPki::new(dir.path())?;
    let backend = SpeakFirst::start_on("127.0.0.1:0".parse()?, MIB_16).await?;
    let (server, saddrs) =
        inproc_server(&dir, &server_config(&pki, dir.path(), &backend.addr().to_string(), "")).await?;
    let (_agent, _) = inproc_agent(
        &dir,
        &agent_yaml(&pki, &AgentOpts::new("shoot-a", saddrs.listener("agents")?, &["127.0.0.0/8"]))?,
    )
    .await?;
    agent_up(&server).await?;
    let want_back = (MIB_16, Pattern::checksum(SpeakFirst::SEED, MIB_16));
    let want_there = (MIB_16, Pattern::checksum(11, MIB_16));
    for (i, d) in [Dialer::Tcp(saddrs.listener("fwd")?), Dialer::Unix(saddrs.unix("fwd-unix")?)].iter().enumerate() {
        let got = both_ways(d.connect().await?, MIB_16).await.with_context(|| format!("{d:?}"))?;
        anyhow::ensure!(got == want_back, "{d:?}: the backend's 16 MiB came back as {got:?}");
        poll_until(DEADLINE, TICK, || async {
            let r = backend.received();
            anyhow::ensure!(r.len() == i + 1, "{} connections finished at the backend", r.len());
            anyhow::ensure!(r[i] == want_there, "{d:?}: the backend got {:?}", r[i]);
            Ok(())
        })
        .await?;
    }
    // Accounted as CONNECT is: the request count, bytes, and one access event per connection.
    let m = server.metrics();
    for fe in ["fwd", "fwd-unix"] {
        let ok = value(&m, "seedgate_frontend_requests_total", &[("frontend", fe), ("kind", "tcp"), ("code", "200")]);
        anyhow::ensure!(ok == 1.0, "{fe}: {ok} relayed");
    }
    let up = value(&m, "seedgate_tunnel_bytes_total", &[("cluster", "shoot-a"), ("direction", "to_shoot")]);
    anyhow::ensure!(up >= (2 * MIB_16) as f64, "{up} bytes to the shoot");
    let log = server.log();
    let events: Vec<&str> =
        log.lines().filter(|l| l.contains("connection closed") && l.contains("kind=\"tcp\"")).collect();
    anyhow::ensure!(events.len() == 2, "two access events:\n{log}");
    for e in events {
        anyhow::ensure!(
            e.contains(&format!("bytes_to_upstream={MIB_16}")) && e.contains(&format!("bytes_to_client={MIB_16}")),
            "{e}"
        );
        anyhow::ensure!(e.contains(&format!("target={}", backend.addr())) && e.contains("code=200"), "{e}");
    }
    Ok(())
}

#[tokio::test]
async fn a_port_forward_is_refused_as_connect_would_be_and_a_reload_moves_its_target() -> anyhow::Result<()> {
    let dir = TempDir::new("port-forward-refusals")?;
    let pki = TunnelPki::new(dir.path())?;
    let first = SpeakFirst::start_on("127.0.0.1:0".parse()?, 5).await?;
    let second = SpeakFirst::start_on("127.0.0.2:0".parse()?, 7).await?;
    let limits = "";
    let yaml = server_config(&pki, dir.path(), &first.addr().to_string(), limits).replace(
        "  shoot-b: { state: active }\n",
        "  shoot-b: { state: active }\n  shoot-a: { limits: { max_streams: 1 } }\n",
    );
    let (server, saddrs) = inproc_server(&dir, &yaml).await?;
    // The agent may dial the first backend only.
    let allow = format!("{}/32", first.addr().ip());
    let (_agent, _) =
        inproc_agent(&dir, &agent_yaml(&pki, &AgentOpts::new("shoot-a", saddrs.listener("agents")?, &[&allow]))?)
            .await?;
    agent_up(&server).await?;
    let fwd = Dialer::Tcp(saddrs.listener("fwd")?);

    // The cluster's share of streams: one held open, the next refused.
    let mut held = fwd.connect().await?;
    let mut five = [0u8; 5];
    tokio::time::timeout(DEADLINE, held.read_exact(&mut five)).await.context("no bytes from the target")??;
    refused(&fwd).await?;
    let m = server.metrics();
    let over = value(&m, "seedgate_rejects_total", &[("listener", "fwd"), ("reason", "cluster_stream_limit")]);
    anyhow::ensure!(over == 1.0, "{over} refused for the share");
    // A cluster without agents.
    refused(&Dialer::Tcp(saddrs.listener("fwd-b")?)).await?;
    let m = server.metrics();
    let none = value(&m, "seedgate_rejects_total", &[("listener", "fwd-b"), ("reason", "no_agent")]);
    let code =
        value(&m, "seedgate_frontend_requests_total", &[("frontend", "fwd-b"), ("kind", "tcp"), ("code", "503")]);
    anyhow::ensure!(none == 1.0 && code == 1.0, "no agent: {none} rejects, {code} answered 503");

    // A reload moves the target (and lifts the share): the held connection stays on the old one,
    // new ones go to the new target, which the agent's allowlist refuses.
    let moved = server_config(&pki, dir.path(), &second.addr().to_string(), "");
    server.reload_with(&moved).await?;
    server.wait_reloads(saddrs.admin()?, "success", 1.0).await?;
    refused(&fwd).await?;
    let m = server.metrics();
    let denied = value(&m, "seedgate_rejects_total", &[("listener", "fwd"), ("reason", "not_allowed")]);
    let code = value(&m, "seedgate_frontend_requests_total", &[("frontend", "fwd"), ("kind", "tcp"), ("code", "403")]);
    anyhow::ensure!(denied == 1.0 && code == 1.0, "not allowed: {denied} rejects, {code} answered 403");
    server
        .wait_log_line(
            &["connection closed", "kind=\"tcp\"", &format!("target={}", second.addr()), "reason=\"not_allowed\""],
            DEADLINE,
        )
        .await?;
    held.shutdown().await?;
    let mut rest = Vec::new();
    tokio::time::timeout(DEADLINE, held.read_to_end(&mut rest)).await.context("the held connection did not end")??;
    poll_until(DEADLINE, TICK, || async {
        anyhow::ensure!(first.received().len() == 1, "the held connection reached the first target");
        Ok(())
    })
    .await?;
    Ok(())
}

/// curl, which speaks neither CONNECT nor a proxy URL here, reaches an HTTP target in the shoot
/// through the port forward as if it were the target, over TCP and over the Unix socket.
#[tokio::test]
async fn curl_gets_a_page_from_the_shoot_through_a_port_forward() -> anyhow::Result<()> {
    let dir = TempDir::new("port-forward-curl")?;
    let pki = TunnelPki::new(dir.path())?;
    let page = testbed::HttpBackend::start("text/plain", "pod page\n").await?;
    let (server, saddrs) = inproc_server(&dir, &server_config(&pki, dir.path(), &page.addr().to_string(), "")).await?;
    let (_agent, _) = inproc_agent(
        &dir,
        &agent_yaml(&pki, &AgentOpts::new("shoot-a", saddrs.listener("agents")?, &["127.0.0.0/8"]))?,
    )
    .await?;
    agent_up(&server).await?;
    let tcp = format!("http://{}/metrics", saddrs.listener("fwd")?);
    let sock = saddrs.unix("fwd-unix")?.display().to_string();
    for args in
        [vec!["-sS", "--fail", &tcp], vec!["-sS", "--fail", "--unix-socket", &sock, "http://pod.shoot-a/healthz"]]
    {
        let Some(out) = testbed::peers::curl(&args).await? else { return Ok(()) };
        let body = String::from_utf8_lossy(&out.stdout);
        anyhow::ensure!(
            out.status.success() && body == "pod page\n",
            "curl {args:?}: {}, {body:?}, {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // The requests reached the target as curl sent them: nothing added, nothing read on the way.
    let heads = page.requests();
    anyhow::ensure!(heads.len() == 2, "{heads:?}");
    anyhow::ensure!(heads[0].starts_with("GET /metrics HTTP/1.1"), "{heads:?}");
    anyhow::ensure!(
        heads[1].starts_with("GET /healthz HTTP/1.1") && heads[1].contains("Host: pod.shoot-a"),
        "{heads:?}"
    );
    let m = server.metrics();
    for fe in ["fwd", "fwd-unix"] {
        let ok = value(&m, "seedgate_frontend_requests_total", &[("frontend", fe), ("kind", "tcp"), ("code", "200")]);
        anyhow::ensure!(ok == 1.0, "{fe}: {ok} relayed");
    }
    Ok(())
}
