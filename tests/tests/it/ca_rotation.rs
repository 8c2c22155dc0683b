//! A CA rotation the way Gardener does it — prepare (old + new CA trusted), reissue (every
//! certificate from the new CA), complete (new CA only) — with the files swapped in secret-volume
//! style and no signal, no restart: proxy-server on the seed, proxy-agent in its own network
//! namespace (root only). And a rotation that keeps the CA's name, with the old CA's revocation
//! list still configured (in process).

use anyhow::Context as _;
use rustls::pki_types::ServerName;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use testbed::netns::{Netns, require_root, veth};
use testbed::openssl_ca::OpensslCa;
use testbed::pki::{Ca, Issued, provider};
use testbed::proc::Running;
use testbed::secret_volume::SecretVolume;
use testbed::tunnel_kit::{
    AgentCert, AgentOpts, Dialer, FRONTEND_NAME, Fe, FeKind, SERVER_NAME, TunnelPki, agent_yaml, connect_strict,
    inproc_agent, inproc_server, server_yaml, wait_agents,
};
use testbed::{Proc, TempDir, bin_path, http_get, metric_sum, metric_value, poll_until};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const DEADLINE: Duration = Duration::from_secs(20);
const TICK: Duration = Duration::from_millis(50);
const SEED: &str = "10.219.1.1";
const NODE: &str = "10.219.1.2";
const POD: &str = "10.220.1.5";

fn bundle(cas: &[&Ca]) -> String {
    cas.iter().map(|c| c.cert_pem.as_str()).collect()
}

fn tls_files<'a>(id: &'a Issued, ca: &'a str) -> [(&'static str, &'a str); 3] {
    [("tls.crt", id.cert_pem.as_str()), ("tls.key", id.key_pem.as_str()), ("ca.crt", ca)]
}

/// A client trusting both CAs (it checks which one issued what it is shown), presenting `id`.
fn client(cas: &[&Ca], id: &Issued, alpn: &str) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    for c in cas {
        roots.add(c.cert_der.clone())?;
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_client_auth_cert(id.chain(), id.key())?;
    cfg.alpn_protocols = vec![alpn.as_bytes().to_vec()];
    Ok(Arc::new(cfg))
}

/// The issuer CN of the certificate `addr` presents to a client with `cfg`.
async fn issuer_seen(addr: SocketAddr, cfg: Arc<rustls::ClientConfig>, name: &str) -> anyhow::Result<String> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let tls = tokio_rustls::TlsConnector::from(cfg).connect(ServerName::try_from(name.to_owned())?, tcp).await?;
    let der = tls.get_ref().1.peer_certificates().context("no certificate")?[0].clone();
    let (_, x) = x509_parser::parse_x509_certificate(der.as_ref())?;
    Ok(x.issuer().iter_common_name().next().and_then(|n| n.as_str().ok()).unwrap_or("").to_owned())
}

async fn reloads(admin: SocketAddr, use_: &str) -> f64 {
    let text = http_get(admin, "/metrics").await.map(|(_, b)| b).unwrap_or_default();
    metric_sum(&text, "seedgate_tls_reloads_total", &[("use", use_), ("result", "success")])
}

/// The TLS uses (admin, `use` label) the rotation touches.
type Uses = [(SocketAddr, &'static str); 3];

/// Publish with `publish`, then poll until every use in `uses` counted a successful reload.
async fn rotate(
    uses: Uses,
    publish: impl FnOnce() -> anyhow::Result<()>,
    log: impl Fn() -> String,
) -> anyhow::Result<()> {
    let mut before = Vec::new();
    for (admin, use_) in uses {
        before.push(reloads(admin, use_).await);
    }
    publish()?;
    for ((admin, use_), b) in uses.into_iter().zip(before) {
        poll_until(DEADLINE, TICK, || async move {
            let got = reloads(admin, use_).await;
            if got > b { Ok(()) } else { Err(anyhow::anyhow!("{use_}: no successful reload yet ({got})")) }
        })
        .await
        .with_context(&log)?;
    }
    Ok(())
}

async fn echo_once(s: &mut testbed::tunnel_kit::BoxStream, msg: &[u8]) -> anyhow::Result<()> {
    s.write_all(msg).await?;
    let mut back = vec![0u8; msg.len()];
    tokio::time::timeout(DEADLINE, s.read_exact(&mut back)).await.context("no echo")??;
    anyhow::ensure!(back == msg);
    Ok(())
}

#[tokio::test]
async fn ca_rotation_without_restart() -> anyhow::Result<()> {
    if !require_root() {
        return Ok(());
    }
    let dir = TempDir::new("ca-rotation")?;
    let (old, new) = (Ca::new("old-ca")?, Ca::new("new-ca")?);
    let shoot = Netns::create("shoot")?;
    let _link = veth(None, Some(&shoot), &format!("{SEED}/24"), &format!("{NODE}/24"))?;
    shoot.ip(&["addr", "add", &format!("{POD}/32"), "dev", "lo"])?;
    let mut echo_cmd = shoot.command(bin_path("stand-in")?);
    echo_cmd.args(["echo", "--listen", &format!("{POD}:0")]);
    let echo_proc = Proc::spawn(echo_cmd)?;
    let line = echo_proc.wait_log_line(&["listening "], DEADLINE).await?;
    let echo: SocketAddr = line.trim().trim_start_matches("listening ").parse()?;

    // Every identity from the old CA, in three secret volumes.
    let mut agents_vol = SecretVolume::new(dir.join("agents-tls"))?;
    let mut fe_vol = SecretVolume::new(dir.join("frontend-tls"))?;
    let mut agent_vol = SecretVolume::new(dir.join("agent-tls"))?;
    let ids = |ca: &Ca| -> anyhow::Result<(Issued, Issued, Issued, Issued)> {
        Ok((
            ca.server(&[SERVER_NAME])?,
            ca.server(&[FRONTEND_NAME, SEED])?,
            ca.client("shoot-a")?,
            ca.client("kube-apiserver")?,
        ))
    };
    let (old_agents, old_fe, old_agent, old_apiserver) = ids(&old)?;
    let (new_agents, new_fe, new_agent, new_apiserver) = ids(&new)?;
    let (only_old, both, only_new) = (bundle(&[&old]), bundle(&[&old, &new]), bundle(&[&new]));
    agents_vol.publish(&tls_files(&old_agents, &only_old))?;
    fe_vol.publish(&tls_files(&old_fe, &only_old))?;
    agent_vol.publish(&tls_files(&old_agent, &only_old))?;

    let p = |v: &SecretVolume, f: &str| v.path(f).display().to_string();
    let server_yaml = format!(
        "admin: {{ listen: 127.0.0.1:0 }}\nagents:\n  listen: {SEED}:0\n  tls: {{ cert: {}, key: {}, client_ca: {} }}\n  keepalive: {{ interval: 500ms, suspect_after: 2s, timeout: 2s }}\nfrontends:\n  - name: egress\n    listen: {SEED}:0\n    cluster: shoot-a\n    tls: {{ cert: {}, key: {}, client_ca: {} }}\n",
        p(&agents_vol, "tls.crt"),
        p(&agents_vol, "tls.key"),
        p(&agents_vol, "ca.crt"),
        p(&fe_vol, "tls.crt"),
        p(&fe_vol, "tls.key"),
        p(&fe_vol, "ca.crt"),
    );
    let server = Running::start(&dir, "proxy-server", &server_yaml).await?;
    let a = server.read_addresses().context("server addresses")?;
    let (sadmin, agents_addr, fe) = (a.admin()?, a.listener("agents")?, a.listener("egress")?);
    let agent_yaml = format!(
        "admin: {{ listen: {NODE}:0 }}\ntunnel:\n  servers: [\"{agents_addr}\"]\n  tls: {{ cert: {}, key: {}, ca: {}, server_name: {SERVER_NAME} }}\n  allow: [{POD}/32]\n  keepalive: {{ interval: 500ms, suspect_after: 2s, timeout: 2s }}\n  reconnect: {{ initial: 100ms, max: 1s }}\n",
        p(&agent_vol, "tls.crt"),
        p(&agent_vol, "tls.key"),
        p(&agent_vol, "ca.crt"),
    );
    let agent = Running::start_in(&dir, "proxy-agent", &agent_yaml, Some(&shoot)).await?;
    let aadmin = agent.read_addresses().context("agent addresses")?.admin()?;
    let logs = || format!("server:\n{}\nagent:\n{}", server.proc.log(), agent.proc.log());
    wait_agents(sadmin, "shoot-a", 1.0).await.with_context(logs)?;

    let cas = [&old, &new];
    let old_client = Dialer::Tls(fe, client(&cas, &old_apiserver, "http/1.1")?, FRONTEND_NAME.into());
    let new_client = Dialer::Tls(fe, client(&cas, &new_apiserver, "http/1.1")?, FRONTEND_NAME.into());
    let mut live = connect_strict(&old_client, &echo.to_string()).await.with_context(logs)?;
    echo_once(&mut live, b"before").await?;
    anyhow::ensure!(connect_strict(&new_client, &echo.to_string()).await.is_err(), "the new CA is not trusted yet");

    let uses: Uses = [(sadmin, "agents"), (sadmin, "frontend egress"), (aadmin, "tunnel")];
    // Prepare: every trust bundle holds both CAs.
    let prepare = || {
        agents_vol.publish(&tls_files(&old_agents, &both))?;
        fe_vol.publish(&tls_files(&old_fe, &both))?;
        agent_vol.publish(&tls_files(&old_agent, &both))
    };
    rotate(uses, prepare, logs).await?;
    connect_strict(&new_client, &echo.to_string()).await.context("prepare: a new-CA client is accepted")?;
    echo_once(&mut live, b"after prepare").await?;

    // Reissue: every certificate from the new CA.
    let reissue = || {
        agents_vol.publish(&tls_files(&new_agents, &both))?;
        fe_vol.publish(&tls_files(&new_fe, &both))?;
        agent_vol.publish(&tls_files(&new_agent, &both))
    };
    rotate(uses, reissue, logs).await?;
    let agent_client = client(&cas, &new_agent, "seedgate-tunnel/1")?;
    anyhow::ensure!(issuer_seen(agents_addr, agent_client, SERVER_NAME).await? == "new-ca", "agents listener");
    let fe_client = client(&cas, &new_apiserver, "http/1.1")?;
    anyhow::ensure!(issuer_seen(fe, fe_client, FRONTEND_NAME).await? == "new-ca", "front end");
    echo_once(&mut live, b"after reissue").await?;

    // Complete: the new CA only.
    let complete = || {
        agents_vol.publish(&tls_files(&new_agents, &only_new))?;
        fe_vol.publish(&tls_files(&new_fe, &only_new))?;
        agent_vol.publish(&tls_files(&new_agent, &only_new))
    };
    rotate(uses, complete, logs).await?;
    anyhow::ensure!(
        connect_strict(&old_client, &echo.to_string()).await.is_err(),
        "complete: an old-CA client is refused"
    );
    let mut fresh = connect_strict(&new_client, &echo.to_string()).await.context("complete: new-CA client")?;
    echo_once(&mut fresh, b"new client").await?;
    echo_once(&mut live, b"after complete: the stream opened before the rotation still works").await?;

    // A fresh agent session: cut the agent's TCP connection; it dials again with its new
    // certificate, which only the new CA vouches for, and is accepted.
    let accepted = |text: &str| {
        metric_sum(text, "seedgate_agent_sessions_total", &[("cluster", "shoot-a"), ("result", "accepted")])
    };
    let before = accepted(&http_get(sadmin, "/metrics").await?.1);
    shoot.exec("ss", &["-K", "dst", SEED])?;
    poll_until(DEADLINE, TICK, || async move {
        let text = http_get(sadmin, "/metrics").await.map(|(_, b)| b).unwrap_or_default();
        if accepted(&text) > before { Ok(()) } else { Err(anyhow::anyhow!("no new session yet")) }
    })
    .await
    .with_context(logs)?;
    wait_agents(sadmin, "shoot-a", 1.0).await.with_context(logs)?;
    let mut after = connect_strict(&new_client, &echo.to_string()).await.context("a stream over the new session")?;
    echo_once(&mut after, b"over the new session").await?;
    Ok(())
}

/// A rotation that keeps the CA's name (a new key under the same subject), with the old CA's
/// revocation list still in `agents.tls.crl`: with both CAs trusted, and then the new one alone,
/// every agent of the new CA is admitted, and the old CA's list still refuses the agent it
/// revokes (and no other agent of the old CA).
#[tokio::test]
async fn a_ca_replaced_under_its_own_name_is_not_judged_by_the_old_cas_list() -> anyhow::Result<()> {
    let dir = TempDir::new("ca-same-name")?;
    let pki = TunnelPki::new(dir.path())?;
    let (old, new) = (Ca::new("agents-ca")?, Ca::new("agents-ca")?);
    let old_ca = OpensslCa::new(&old, dir.path(), "old-ca")?;
    let revoked = old.client("shoot-a")?.write(dir.path(), "old-revoked")?;
    let kept = old.client("shoot-a")?.write(dir.path(), "old-kept")?;
    old_ca.revoke(&revoked.0)?;
    let crl = dir.path().join("agents-crl.pem");
    old_ca.gencrl(&crl)?;
    // Prepare: the old and the new CA in the bundle (in this order, as the rotation appends).
    let ca_file = dir.write("agents-ca.crt", bundle(&[&old, &new]))?;
    let yaml = server_yaml(&pki, "127.0.0.1:0", &[Fe::new("egress", "shoot-a", FeKind::Plain)], "").replacen(
        &format!("client_ca: {} }}", pki.ca_file.display()),
        &format!("client_ca: {}, crl: {} }}", ca_file.display(), crl.display()),
        1,
    );
    let (server, saddrs) = inproc_server(&dir, &yaml).await?;
    let agents = saddrs.listener("agents")?;
    let mut running = Vec::new();
    let start = |stem: &str, cert: (std::path::PathBuf, std::path::PathBuf)| {
        let mut o = AgentOpts::new("shoot-a", agents, &["127.0.0.0/8"]);
        o.cert = AgentCert::Files(cert.0, cert.1);
        o.node_name = stem.to_owned();
        agent_yaml(&pki, &o)
    };
    const NEW_AGENTS: usize = 3;
    for i in 0..NEW_AGENTS {
        let yaml = start(&format!("new-{i}"), new.client("shoot-a")?.write(dir.path(), &format!("new-{i}"))?)?;
        running.push(inproc_agent(&dir, &yaml).await?.0);
    }
    running.push(inproc_agent(&dir, &start("old-kept", kept)?).await?.0);
    let (revoked_agent, _) = inproc_agent(&dir, &start("old-revoked", revoked)?).await?;
    let connected = || metric_value(&server.metrics(), "seedgate_agents_connected", &[("cluster", "shoot-a")]);
    let want = (NEW_AGENTS + 1) as f64;
    let admitted = poll_until(DEADLINE, TICK, || async {
        let have = connected().unwrap_or(0.0);
        if have == want { Ok(have) } else { Err(anyhow::anyhow!("{have} of {want} agents admitted")) }
    })
    .await
    .with_context(|| server.log())?;
    println!("prepare: {admitted} of {want} agents admitted (new CA: {NEW_AGENTS}, the old CA's unrevoked one: 1)");
    revoked_agent.wait_log_line(&["Revoked"], DEADLINE).await?;

    // Complete: the new CA alone; the old CA's list is left in `crl` and now matches no CA.
    let before = reloads(saddrs.admin()?, "agents").await;
    let tmp = dir.write("agents-ca.crt.new", bundle(&[&new]))?;
    std::fs::rename(&tmp, &ca_file)?;
    let admin = saddrs.admin()?;
    poll_until(DEADLINE, TICK, || async move {
        let got = reloads(admin, "agents").await;
        if got > before { Ok(()) } else { Err(anyhow::anyhow!("no successful reload yet ({got})")) }
    })
    .await
    .with_context(|| server.log())?;
    server.wait_log_line(&["revocation list 1 of 1 matches no CA", "agents-ca.crt"], DEADLINE).await?;
    let yaml = start("new-after", new.client("shoot-a")?.write(dir.path(), "new-after")?)?;
    running.push(inproc_agent(&dir, &yaml).await?.0);
    // The old CA's live session stays (a CA change ends no session); the new agent joins it.
    let want = want + 1.0;
    poll_until(DEADLINE, TICK, || async {
        let have = connected().unwrap_or(0.0);
        if have == want { Ok(()) } else { Err(anyhow::anyhow!("{have} of {want} agents admitted")) }
    })
    .await
    .with_context(|| server.log())?;
    let m = server.metrics();
    let ended = metric_sum(&m, "seedgate_agent_sessions_ended_total", &[("reason", "certificate_revoked")]);
    anyhow::ensure!(ended == 0.0, "{ended} sessions ended as revoked");
    Ok(())
}
