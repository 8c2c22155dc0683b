//! A refused certificate is logged with what to fix: the real proxy-server and proxy-agent, an agent
//! whose client certificate is from another CA or lacks clientAuth, a front-end client from
//! another CA; both ends' logs name the config key to check.

use std::time::Duration;
use testbed::TempDir;
use testbed::pki::{self, Ca};
use testbed::tunnel_kit::{
    AgentOpts, Dialer, FRONTEND_NAME, Fe, FeKind, TunnelPki, agent_yaml, connect, inproc_agent, inproc_server,
    server_yaml,
};

const DEADLINE: Duration = Duration::from_secs(20);

/// Start an agent of shoot-a whose client certificate is the one `bad` issues (with a key of its
/// own), and wait for both logs to carry the hints.
async fn agent_refused(
    bad: impl FnOnce(&TunnelPki) -> anyhow::Result<pki::Issued>,
    server_needle: &[&str],
    agent_needle: &[&str],
) -> anyhow::Result<()> {
    let dir = TempDir::new("cert-errors")?;
    let pki = TunnelPki::new(dir.path())?;
    let (server, saddrs) = inproc_server(&dir, &server_yaml(&pki, "127.0.0.1:0", &[], "")).await?;
    let o = AgentOpts::new("shoot-a", saddrs.listener("agents")?, &["127.0.0.1/32"]);
    let yaml = agent_yaml(&pki, &o)?;
    // agent_yaml wrote a good certificate; the agent reads these files instead.
    bad(&pki)?.write(dir.path(), "agent-shoot-a")?;
    let (agent, _) = inproc_agent(&dir, &yaml).await?;
    eprintln!("{}", server.wait_log_line(server_needle, DEADLINE).await?);
    eprintln!("{}", agent.wait_log_line(agent_needle, DEADLINE).await?);
    Ok(())
}

#[tokio::test]
async fn an_agent_certificate_from_another_ca_is_refused_naming_agents_tls_client_ca() -> anyhow::Result<()> {
    agent_refused(
        |_| Ca::new("some-other-ca")?.client("shoot-a"),
        &["agent TLS handshake failed", "is not signed by a CA in agents.tls.client_ca (UnknownIssuer)"],
        &["tunnel session", "is not signed by a CA in proxy-server", "agents.tls.client_ca (UnknownCA)"],
    )
    .await
}

#[tokio::test]
async fn an_agent_certificate_without_client_auth_is_refused_naming_the_usage() -> anyhow::Result<()> {
    agent_refused(
        // Issued by the CA the server trusts, but for serverAuth only.
        |pki| pki.ca.server(&["shoot-a"]),
        &["agent TLS handshake failed", "has no clientAuth extended key usage", "(InvalidPurpose)"],
        &["tunnel session", "it needs clientAuth (UnsupportedCertificate)"],
    )
    .await
}

#[tokio::test]
async fn a_front_end_client_from_another_ca_is_refused_naming_the_front_ends_client_ca() -> anyhow::Result<()> {
    let dir = TempDir::new("cert-errors-fe")?;
    let pki = TunnelPki::new(dir.path())?;
    let fes = [Fe::new("egress-mtls", "shoot-a", FeKind::Mtls)];
    let (server, saddrs) = inproc_server(&dir, &server_yaml(&pki, "127.0.0.1:0", &fes, "")).await?;
    let other = Ca::new("some-other-ca")?;
    let cfg = pki::client_config(&pki.ca, Some(&other.client("shoot-a")?), &["http/1.1"])?;
    let d = Dialer::Tls(saddrs.listener("egress-mtls")?, cfg, FRONTEND_NAME.into());
    assert!(connect(&d, "127.0.0.1:1").await.is_err(), "a client certificate from another CA must be refused");
    server
        .wait_log_line(
            &[
                "front-end TLS handshake failed",
                "is not signed by a CA in the front end",
                "tls.client_ca (UnknownIssuer)",
            ],
            DEADLINE,
        )
        .await?;
    Ok(())
}
