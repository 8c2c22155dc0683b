//! Certificate revocation lists made by `openssl ca`: a revoked agent's live session (QUIC or
//! HTTP/2) ends within seconds of the list's change and cannot come back while its neighbour
//! stays; a revoked front-end client (ours and curl) is refused once the list names it, and its
//! live connection (CONNECT or gRPC) ends while its neighbour's stays; an agent refuses a proxy-server whose
//! certificate its list revokes; a list signed by another key under the CA's name revokes
//! nothing, and `--check` warns of it.

use anyhow::Context as _;
use std::path::Path;
use std::time::{Duration, Instant};
use testbed::konnectivity::{Client, Packet, Payload};
use testbed::openssl_ca::OpensslCa;
use testbed::pki::Ca;
use testbed::tunnel_kit::{
    AgentCert, AgentOpts, Dialer, FRONTEND_NAME, Fe, FeKind, TunnelPki, agent_yaml, connect_strict, echo_line,
    ensure_binaries, inproc_agent, inproc_server, server_yaml, wait_agents,
};
use testbed::{TcpEcho, TempDir, bin_path, metric_sum, metric_value, poll_until};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const DEADLINE: Duration = Duration::from_secs(20);
const TICK: Duration = Duration::from_millis(20);

fn value(m: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    metric_value(m, name, labels).unwrap_or(0.0)
}

/// A CONNECT through `fe` to `echo` carries a line back.
#[tokio::test]
async fn a_revoked_agent_loses_its_live_session_within_seconds_and_its_neighbour_stays() -> anyhow::Result<()> {
    let dir = TempDir::new("crl-agents")?;
    let pki = TunnelPki::new(dir.path())?;
    let ca = OpensslCa::new(&pki.ca, dir.path(), "openssl-ca")?;
    let crl = dir.path().join("agents-crl.pem");
    ca.gencrl(&crl)?;
    let yaml = server_yaml(&pki, "127.0.0.1:0", &[Fe::new("egress", "shoot-a", FeKind::Plain)], "")
        .replacen(
            &format!("client_ca: {} }}", pki.ca_file.display()),
            &format!("client_ca: {}, crl: {} }}", pki.ca_file.display(), crl.display()),
            1,
        )
        .replacen("agents:\n", "agents:\n  quic: { listen: 127.0.0.1:0 }\n", 1);
    let (server, saddrs) = inproc_server(&dir, &yaml).await?;
    let echo = TcpEcho::start().await?;
    // Two agents of one cluster, each with a certificate of its own: the one over QUIC is revoked.
    let stolen = pki.ca.client("shoot-a")?.write(dir.path(), "agent-stolen")?;
    let kept = pki.ca.client("shoot-a")?.write(dir.path(), "agent-kept")?;
    let mut o = AgentOpts::new("shoot-a", saddrs.listener("agents-quic")?, &["127.0.0.0/8"]);
    o.cert = AgentCert::Files(stolen.0.clone(), stolen.1.clone());
    o.node_name = "node-stolen".into();
    o.tunnel_extra = "  transport: quic\n".into();
    let (revoked_agent, _) = inproc_agent(&dir, &agent_yaml(&pki, &o)?).await?;
    let mut o = AgentOpts::new("shoot-a", saddrs.listener("agents")?, &["127.0.0.0/8"]);
    o.cert = AgentCert::Files(kept.0.clone(), kept.1.clone());
    o.node_name = "node-kept".into();
    let (_kept_agent, _) = inproc_agent(&dir, &agent_yaml(&pki, &o)?).await?;
    let connected = |want: f64| {
        let server = &server;
        async move {
            let have = value(&server.metrics(), "seedgate_agents_connected", &[("cluster", "shoot-a")]);
            anyhow::ensure!(have == want, "{have} agents connected, want {want}");
            Ok(())
        }
    };
    poll_until(DEADLINE, TICK, || connected(2.0)).await?;
    // The list's nextUpdate (a day ahead: default_crl_days) is published for the staleness alert.
    let next = value(&server.metrics(), "seedgate_tls_crl_next_update_timestamp_seconds", &[("use", "agents")]);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs_f64();
    anyhow::ensure!(next > now + 3600.0 && next < now + 2.0 * 86400.0, "nextUpdate {next}, now {now}");
    let fe = Dialer::Tcp(saddrs.listener("egress")?);
    echo_line(&fe, echo.addr()).await?;

    ca.revoke(&stolen.0)?;
    ca.gencrl(&crl)?;
    let serial = OpensslCa::serial(&stolen.0)?;
    poll_until(DEADLINE, TICK, || connected(1.0)).await.with_context(|| server.log())?;
    let m = server.metrics();
    let ended =
        value(&m, "seedgate_agent_sessions_ended_total", &[("cluster", "shoot-a"), ("reason", "certificate_revoked")]);
    anyhow::ensure!(ended == 1.0, "{ended} sessions ended as revoked");
    let log = server.log();
    anyhow::ensure!(
        log.lines().any(|l| l.contains("its client certificate is revoked") && l.contains(&serial)),
        "the end is logged with the serial {serial}:\n{log}"
    );
    // It cannot come back: its handshakes fail, and the agent is told why.
    revoked_agent.wait_log_line(&["Revoked"], DEADLINE).await?;
    poll_until(DEADLINE, TICK, || async {
        let m = server.metrics();
        let refused =
            value(&m, "seedgate_agent_sessions_total", &[("cluster", "-"), ("result", "tls_handshake_failed")]);
        anyhow::ensure!(refused >= 1.0, "no refused handshake yet");
        Ok(())
    })
    .await?;
    // The other agent of the cluster carries the cluster's streams as before.
    connected(1.0).await?;
    echo_line(&fe, echo.addr()).await?;
    Ok(())
}

#[tokio::test]
async fn a_front_end_refuses_a_client_once_the_list_names_it() -> anyhow::Result<()> {
    let dir = TempDir::new("crl-frontend")?;
    let pki = TunnelPki::new(dir.path())?;
    let ca = OpensslCa::new(&pki.ca, dir.path(), "openssl-ca")?;
    let crl = dir.path().join("frontend-crl.pem");
    ca.gencrl(&crl)?;
    let (fc, fk) = &pki.frontend_cert;
    let yaml = server_yaml(&pki, "127.0.0.1:0", &[Fe::new("egress", "shoot-a", FeKind::Plain)], "").replacen(
        "    listen: 127.0.0.1:0\n",
        &format!(
            "    listen: 127.0.0.1:0\n    tls: {{ cert: {}, key: {}, client_ca: {}, crl: {} }}\n",
            fc.display(),
            fk.display(),
            pki.ca_file.display(),
            crl.display()
        ),
        1,
    );
    let (server, saddrs) = inproc_server(&dir, &yaml).await?;
    let (agent, _) = inproc_agent(
        &dir,
        &agent_yaml(&pki, &AgentOpts::new("shoot-a", saddrs.listener("agents")?, &["127.0.0.0/8"]))?,
    )
    .await?;
    let echo = TcpEcho::start().await?;
    let fe = Dialer::Tls(saddrs.listener("egress")?, pki.apiserver_tls()?, FRONTEND_NAME.into());
    poll_until(DEADLINE, TICK, || echo_line(&fe, echo.addr())).await.with_context(|| agent.log())?;
    // curl as the kube-apiserver: CONNECT through the front end, its client certificate shown.
    let page = testbed::HttpBackend::start("text/plain", "pod page\n").await?;
    let (apiserver_cert, apiserver_key) = pki.apiserver.write(dir.path(), "apiserver-client")?;
    let (proxy, url) = (format!("https://{}", saddrs.listener("egress")?), format!("http://{}/", page.addr()));
    let [cacert, cert, key] = [&pki.ca_file, &apiserver_cert, &apiserver_key].map(|p| p.display().to_string());
    let args = ["-sS", "-p", "-x", &proxy, "--proxy-cacert", &cacert, "--proxy-cert", &cert, "--proxy-key", &key, &url];
    let curl_ok = |out: &std::process::Output| out.status.success() && out.stdout == b"pod page\n";
    let before = testbed::peers::curl(&args).await?;
    if let Some(out) = &before {
        anyhow::ensure!(curl_ok(out), "curl before the revocation: {}", String::from_utf8_lossy(&out.stderr));
    }

    // The kube-apiserver's client certificate is revoked: the next handshakes fail.
    ca.revoke(&apiserver_cert)?;
    ca.gencrl(&crl)?;
    poll_until(DEADLINE, TICK, || async {
        anyhow::ensure!(echo_line(&fe, echo.addr()).await.is_err(), "still accepted");
        Ok(())
    })
    .await?;
    if let Some(out) = testbed::peers::curl(&args).await? {
        anyhow::ensure!(!curl_ok(&out), "curl with the revoked certificate got the page");
        let err = String::from_utf8_lossy(&out.stderr);
        // curl reports the TLS alert the front end sent (certificate revoked) or the reset.
        anyhow::ensure!(out.status.code() == Some(35) || out.status.code() == Some(56), "curl: {}, {err}", out.status);
    }
    // Counted once the server's handshake returned, which may be just after the client saw the alert.
    poll_until(DEADLINE, TICK, || async {
        let m = server.metrics();
        let rejects =
            value(&m, "seedgate_rejects_total", &[("listener", "egress"), ("reason", "tls_handshake_failed")]);
        anyhow::ensure!(rejects >= 1.0, "the refusal is not counted yet");
        Ok(())
    })
    .await?;
    server
        .wait_log_line(&["front-end TLS handshake failed", "is revoked", "the front end's tls.crl"], DEADLINE)
        .await?;
    // Another client of the same CA is served as before.
    let other = pki.ca.client("kube-apiserver-2")?;
    let cfg = testbed::pki::client_config(&pki.ca, Some(&other), &["http/1.1"])?;
    echo_line(&Dialer::Tls(saddrs.listener("egress")?, cfg, FRONTEND_NAME.into()), echo.addr()).await?;
    Ok(())
}

#[tokio::test]
async fn an_agent_refuses_a_server_whose_certificate_its_list_revokes() -> anyhow::Result<()> {
    let dir = TempDir::new("crl-server")?;
    let pki = TunnelPki::new(dir.path())?;
    let ca = OpensslCa::new(&pki.ca, dir.path(), "openssl-ca")?;
    ca.revoke(&pki.agents_cert.0)?;
    let crl = dir.path().join("servers-crl.pem");
    ca.gencrl(&crl)?;
    let yaml = server_yaml(&pki, "127.0.0.1:0", &[Fe::new("egress", "shoot-a", FeKind::Plain)], "");
    let (server, saddrs) = inproc_server(&dir, &yaml).await?;
    let o = AgentOpts::new("shoot-a", saddrs.listener("agents")?, &["127.0.0.0/8"]);
    let with_crl = agent_yaml(&pki, &o)?.replacen(
        &format!("ca: {}, server_name", pki.ca_file.display()),
        &format!("ca: {}, crl: {}, server_name", pki.ca_file.display(), crl.display()),
        1,
    );
    let (agent, _) = inproc_agent(&dir, &with_crl).await?;
    agent
        .wait_log_line(&["proxy-server's certificate (its agents.tls.cert) is revoked", "tunnel.tls.crl"], DEADLINE)
        .await?;
    let connected = value(&server.metrics(), "seedgate_agents_connected", &[("cluster", "shoot-a")]);
    anyhow::ensure!(connected == 0.0, "{connected} sessions with a revoked server");
    Ok(())
}

/// `yaml` with the agents listener's revocation lists in `crl`.
fn agents_crl(yaml: &str, pki: &TunnelPki, crl: &Path) -> String {
    yaml.replacen(
        &format!("client_ca: {} }}", pki.ca_file.display()),
        &format!("client_ca: {}, crl: {} }}", pki.ca_file.display(), crl.display()),
        1,
    )
}

/// Successful reloads of the TLS material `use_`.
fn reloads(m: &str, use_: &str) -> f64 {
    metric_sum(m, "seedgate_tls_reloads_total", &[("use", use_), ("result", "success")])
}

/// A list that names a live agent's serial, signed by another key under the name of the agents'
/// CA: the session stays, new agents of the CA are admitted, and the list is reported as
/// matching no CA. The CA's own list then ends the session.
#[tokio::test]
async fn a_list_signed_by_another_key_under_the_cas_name_revokes_nothing() -> anyhow::Result<()> {
    let dir = TempDir::new("crl-impostor")?;
    let pki = TunnelPki::new(dir.path())?;
    let ca = OpensslCa::new(&pki.ca, dir.path(), "openssl-ca")?;
    let name = x509_parser::parse_x509_certificate(pki.ca.cert_der.as_ref())?.1.subject().to_string();
    let impostor = OpensslCa::new(&Ca::new(&pki.ca.name)?, dir.path(), "impostor-ca")?;
    let crl = dir.path().join("agents-crl.pem");
    ca.gencrl(&crl)?;
    let yaml = server_yaml(&pki, "127.0.0.1:0", &[Fe::new("egress", "shoot-a", FeKind::Plain)], "");
    let (server, saddrs) = inproc_server(&dir, &agents_crl(&yaml, &pki, &crl)).await?;
    let echo = TcpEcho::start().await?;
    let agent = |stem: &str| -> anyhow::Result<(String, std::path::PathBuf)> {
        let (c, k) = pki.ca.client("shoot-a")?.write(dir.path(), stem)?;
        let mut o = AgentOpts::new("shoot-a", saddrs.listener("agents")?, &["127.0.0.0/8"]);
        o.cert = AgentCert::Files(c.clone(), k);
        o.node_name = stem.to_owned();
        Ok((agent_yaml(&pki, &o)?, c))
    };
    let (first_yaml, first_cert) = agent("node-first")?;
    let (second_yaml, _) = agent("node-second")?;
    let _first = inproc_agent(&dir, &first_yaml).await?;
    let connected = |want: f64| {
        let server = &server;
        async move {
            let have = value(&server.metrics(), "seedgate_agents_connected", &[("cluster", "shoot-a")]);
            anyhow::ensure!(have == want, "{have} agents connected, want {want}");
            Ok(())
        }
    };
    poll_until(DEADLINE, TICK, || connected(1.0)).await.with_context(|| server.log())?;

    // The impostor's list names the first agent's serial.
    let before = reloads(&server.metrics(), "agents");
    impostor.revoke(&first_cert)?;
    impostor.gencrl(&crl)?;
    poll_until(DEADLINE, TICK, || async {
        let got = reloads(&server.metrics(), "agents");
        anyhow::ensure!(got > before, "no successful reload yet ({got})");
        Ok(())
    })
    .await?;
    // A new agent of the CA is admitted, and the first agent's session is still there.
    let _second = inproc_agent(&dir, &second_yaml).await?;
    poll_until(DEADLINE, TICK, || connected(2.0)).await.with_context(|| server.log())?;
    echo_line(&Dialer::Tcp(saddrs.listener("egress")?), echo.addr()).await?;
    let ended = |m: &str| {
        value(m, "seedgate_agent_sessions_ended_total", &[("cluster", "shoot-a"), ("reason", "certificate_revoked")])
    };
    anyhow::ensure!(ended(&server.metrics()) == 0.0, "a session ended as revoked:\n{}", server.log());
    server.wait_log_line(&["revocation list 1 of 1 matches no CA", &format!("no CA named {name}")], DEADLINE).await?;

    // The CA's own list revokes it: the session ends.
    ca.revoke(&first_cert)?;
    ca.gencrl(&crl)?;
    poll_until(DEADLINE, TICK, || connected(1.0)).await.with_context(|| server.log())?;
    anyhow::ensure!(ended(&server.metrics()) == 1.0, "the CA's own list ends the session");
    Ok(())
}

/// Two CONNECT tunnels through an mTLS front end with `tls.crl`, each with a client certificate
/// of its own: once the list is rewritten to revoke one, that connection ends within seconds
/// (counted, logged with its serial, its access event's reason `certificate_revoked`) and the
/// other carries on.
#[tokio::test]
async fn a_front_end_connection_ends_once_the_list_names_its_certificate_and_its_neighbour_stays() -> anyhow::Result<()>
{
    let dir = TempDir::new("crl-frontend-live")?;
    let pki = TunnelPki::new(dir.path())?;
    let ca = OpensslCa::new(&pki.ca, dir.path(), "openssl-ca")?;
    let crl = dir.path().join("frontend-crl.pem");
    ca.gencrl(&crl)?;
    let (fc, fk) = &pki.frontend_cert;
    let yaml = server_yaml(&pki, "127.0.0.1:0", &[Fe::new("egress", "shoot-a", FeKind::Plain)], "").replacen(
        "    listen: 127.0.0.1:0\n",
        &format!(
            "    listen: 127.0.0.1:0\n    tls: {{ cert: {}, key: {}, client_ca: {}, crl: {} }}\n",
            fc.display(),
            fk.display(),
            pki.ca_file.display(),
            crl.display()
        ),
        1,
    );
    let (server, saddrs) = inproc_server(&dir, &yaml).await?;
    let (agent, _) = inproc_agent(
        &dir,
        &agent_yaml(&pki, &AgentOpts::new("shoot-a", saddrs.listener("agents")?, &["127.0.0.0/8"]))?,
    )
    .await?;
    let echo = TcpEcho::start().await?;
    let fe = saddrs.listener("egress")?;
    let client = |stem: &str| -> anyhow::Result<(Dialer, std::path::PathBuf)> {
        let id = pki.ca.client("kube-apiserver")?;
        let (cert, _) = id.write(dir.path(), stem)?;
        let cfg = testbed::pki::client_config(&pki.ca, Some(&id), &["http/1.1"])?;
        Ok((Dialer::Tls(fe, cfg, FRONTEND_NAME.into()), cert))
    };
    let (leaked, leaked_cert) = client("apiserver-leaked")?;
    let (neighbour, _) = client("apiserver-neighbour")?;
    poll_until(DEADLINE, TICK, || echo_line(&neighbour, echo.addr())).await.with_context(|| agent.log())?;
    let mut gone = connect_strict(&leaked, &echo.addr().to_string()).await?;
    let mut stays = connect_strict(&neighbour, &echo.addr().to_string()).await?;
    for s in [&mut gone, &mut stays] {
        s.write_all(b"before\n").await?;
        let mut b = [0u8; 7];
        tokio::time::timeout(DEADLINE, s.read_exact(&mut b)).await.context("no echo")??;
    }

    ca.revoke(&leaked_cert)?;
    ca.gencrl(&crl)?;
    let changed = Instant::now();
    // The echo backend sends nothing unasked: a read that ends is the front end ending it.
    let mut b = [0u8; 16];
    let end = tokio::time::timeout(DEADLINE, gone.read(&mut b))
        .await
        .with_context(|| format!("the revoked client's connection still open:\n{}", server.log()))?;
    anyhow::ensure!(!matches!(end, Ok(n) if n > 0), "bytes instead of the end: {end:?}");
    println!("the revoked client's connection ended {:?} after the list changed ({end:?})", changed.elapsed());
    // The neighbour carries on, on its live connection and on a new one.
    stays.write_all(b"after\n").await?;
    let mut b = [0u8; 6];
    tokio::time::timeout(DEADLINE, stays.read_exact(&mut b)).await.context("no echo")??;
    anyhow::ensure!(&b == b"after\n");
    echo_line(&neighbour, echo.addr()).await?;
    let serial = OpensslCa::serial(&leaked_cert)?;
    server.wait_log_line(&["front-end connection ended: its client certificate is revoked", &serial], DEADLINE).await?;
    server.wait_log_line(&["connection closed", "reason=\"certificate_revoked\""], DEADLINE).await?;
    let m = server.metrics();
    let ended = value(&m, "seedgate_connections_total", &[("listener", "egress"), ("result", "certificate_revoked")]);
    anyhow::ensure!(ended == 1.0, "{ended} connections counted as ended for a revoked certificate");
    Ok(())
}

/// Two gRPC clients (kube-apiserver's `proxyProtocol: GRPC`) of an mTLS `protocol: grpc` front
/// end with `tls.crl`, each with a client certificate of its own and a `Proxy` stream to an echo
/// backend: once the list is rewritten to revoke one, that connection's stream ends within
/// seconds and is logged and counted with the reason `certificate_revoked`, as a CONNECT is; the
/// other's stream carries on.
#[tokio::test]
async fn a_grpc_front_end_connection_ends_once_the_list_names_its_certificate_its_streams_as_revoked()
-> anyhow::Result<()> {
    let dir = TempDir::new("crl-grpc-live")?;
    let pki = TunnelPki::new(dir.path())?;
    let ca = OpensslCa::new(&pki.ca, dir.path(), "openssl-ca")?;
    let crl = dir.path().join("frontend-crl.pem");
    ca.gencrl(&crl)?;
    let (fc, fk) = &pki.frontend_cert;
    let fes = [Fe::new("konnectivity", "shoot-a", FeKind::Plain)];
    let yaml = crate::grpc::grpc_server_yaml(&pki, &fes, "").replacen(
        "    listen: 127.0.0.1:0\n",
        &format!(
            "    listen: 127.0.0.1:0\n    tls: {{ cert: {}, key: {}, client_ca: {}, crl: {} }}\n",
            fc.display(),
            fk.display(),
            pki.ca_file.display(),
            crl.display()
        ),
        1,
    );
    let (server, saddrs) = inproc_server(&dir, &yaml).await?;
    let (agent, _) = inproc_agent(
        &dir,
        &agent_yaml(&pki, &AgentOpts::new("shoot-a", saddrs.listener("agents")?, &["127.0.0.0/8"]))?,
    )
    .await?;
    wait_agents(saddrs.admin()?, "shoot-a", 1.0).await.with_context(|| agent.log())?;
    let echo_server = TcpEcho::start().await?;
    let echo = echo_server.addr().to_string();
    let fe = saddrs.listener("konnectivity")?;
    let client = |stem: &str| -> anyhow::Result<(Dialer, std::path::PathBuf)> {
        let id = pki.ca.client("kube-apiserver")?;
        let (cert, _) = id.write(dir.path(), stem)?;
        let cfg = testbed::pki::client_config(&pki.ca, Some(&id), &["h2"])?;
        Ok((Dialer::Tls(fe, cfg, FRONTEND_NAME.into()), cert))
    };
    let (leaked, leaked_cert) = client("apiserver-leaked")?;
    let (neighbour, _) = client("apiserver-neighbour")?;
    let (leaked, neighbour) = (Client::connect(leaked).await?, Client::connect(neighbour).await?);
    let mut gone = leaked.dial(&echo).await?.map_err(anyhow::Error::msg)?;
    let mut stays = neighbour.dial(&echo).await?.map_err(anyhow::Error::msg)?;
    for conn in [&mut gone, &mut stays] {
        conn.send(b"before".to_vec()).await?;
        anyhow::ensure!(conn.read_exact(6).await? == b"before");
    }

    ca.revoke(&leaked_cert)?;
    ca.gencrl(&crl)?;
    // The echo backend sends nothing unasked: the stream's end (or its error) is the front end
    // ending the connection.
    let end = tokio::time::timeout(DEADLINE, gone.stream.rx.message())
        .await
        .with_context(|| format!("the revoked client's stream still open:\n{}", server.log()))?;
    anyhow::ensure!(!matches!(&end, Ok(Some(Packet { payload: Some(Payload::Data(_)), .. }))), "data: {end:?}");
    stays.send(b"after".to_vec()).await?;
    anyhow::ensure!(stays.read_exact(5).await? == b"after", "the neighbour's stream no longer echoes");
    let serial = OpensslCa::serial(&leaked_cert)?;
    server.wait_log_line(&["front-end connection ended: its client certificate is revoked", &serial], DEADLINE).await?;
    let revoked = ["connection closed", "kind=\"grpc\"", "reason=\"certificate_revoked\""];
    server.wait_log_line(&revoked, DEADLINE).await?;
    let m = server.metrics();
    let labels = [("listener", "konnectivity"), ("result", "certificate_revoked")];
    let ended = value(&m, "seedgate_connections_total", &labels);
    anyhow::ensure!(ended == 1.0, "{ended} gRPC streams counted as ended for a revoked certificate");
    Ok(())
}

/// `--check` warns of a list that no CA of the bundle signed (another key under the CA's name),
/// naming the key, the file and why; the config is still valid (exit 0). A list the CA signed
/// draws no warning.
#[test]
fn check_warns_of_a_list_that_matches_no_ca() -> anyhow::Result<()> {
    ensure_binaries()?;
    let dir = TempDir::new("crl-check")?;
    let pki = TunnelPki::new(dir.path())?;
    let own = OpensslCa::new(&pki.ca, dir.path(), "openssl-ca")?;
    let impostor = OpensslCa::new(&Ca::new(&pki.ca.name)?, dir.path(), "impostor-ca")?;
    let (own_crl, other_crl) = (dir.path().join("own-crl.pem"), dir.path().join("other-crl.pem"));
    own.gencrl(&own_crl)?;
    impostor.gencrl(&other_crl)?;
    let yaml = server_yaml(&pki, "127.0.0.1:0", &[], "");
    let check = |crl: &Path, stem: &str| -> anyhow::Result<(i32, String, String)> {
        let cfg = dir.write(&format!("{stem}.yaml"), agents_crl(&yaml, &pki, crl))?;
        let out =
            std::process::Command::new(bin_path("proxy-server")?).arg("--config").arg(&cfg).arg("--check").output()?;
        let (o, e) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        Ok((out.status.code().unwrap_or(-1), o.into_owned(), e.into_owned()))
    };
    let (code, stdout, stderr) = check(&other_crl, "other")?;
    println!("--check with another key's list: exit {code}\n{stdout}{stderr}");
    anyhow::ensure!(code == 0 && stdout.contains(": valid"), "exit {code}: {stdout}{stderr}");
    let warnings: Vec<&str> = stderr.lines().filter(|l| l.starts_with("warning: ")).collect();
    anyhow::ensure!(warnings.len() == 1, "one warning: {stderr}");
    let w = warnings[0];
    for part in [": agents.tls.crl: ", &other_crl.display().to_string(), "matches no CA", "it revokes nothing"] {
        anyhow::ensure!(w.contains(part), "{part:?} missing from {w}");
    }
    let (code, stdout, stderr) = check(&own_crl, "own")?;
    anyhow::ensure!(code == 0 && stdout.contains(": valid") && !stderr.contains("warning"), "{stdout}{stderr}");
    Ok(())
}
