//! A proxy-server front end's keep-alive forward-proxy connection, with curl as the client over the real binaries: the connection's `connection closed` access event carries what its requests moved (the sums of their tunnel streams' bytes, the status of the last one).

use testbed::tunnel_kit::{
    AgentOpts, Fe, FeKind, STEP, TunnelPki, agent_yaml, server_yaml, start_agent, start_server, wait_agents,
};
use testbed::{HttpBackend, TempDir};

/// The value of `key=<number>` in a log line.
fn field(line: &str, key: &str) -> anyhow::Result<u64> {
    let needle = format!(" {key}=");
    let at = line.find(&needle).ok_or_else(|| anyhow::anyhow!("no {key} in {line}"))? + needle.len();
    let digits: String = line[at..].chars().take_while(char::is_ascii_digit).collect();
    Ok(digits.parse()?)
}

#[tokio::test]
async fn a_keep_alive_forward_connection_logs_what_its_requests_moved() -> anyhow::Result<()> {
    let dir = TempDir::new("forward-totals")?;
    let pki = TunnelPki::new(dir.path())?;
    let yaml = server_yaml(&pki, "127.0.0.1:0", &[Fe::new("egress", "shoot-a", FeKind::Plain)], "");
    let (server, saddrs) = start_server(&dir, "server", &yaml).await?;
    let o = AgentOpts::new("shoot-a", saddrs.listener("agents")?, &["127.0.0.1/32"]);
    let (_agent, _) = start_agent(&dir, "agent", &agent_yaml(&pki, &o)?, None).await?;
    wait_agents(saddrs.admin()?, "shoot-a", 1.0).await?;

    let page = HttpBackend::start("text/plain", "pod page\n").await?;
    let ok = format!("http://{}/metrics", page.addr());
    // Nothing listens there: the agent's dial is refused, the front end answers 502.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let refused = format!("http://{closed}/metrics");
    let proxy = format!("http://{}", saddrs.listener("egress")?);
    let args = ["-sS", "--max-time", "10", "-o", "/dev/null", "-o", "/dev/null", "-o", "/dev/null", "-x", &proxy];
    let Some(out) = testbed::peers::curl(&[&args[..], &[&ok, &ok, &refused]].concat()).await? else { return Ok(()) };
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    anyhow::ensure!(out.status.success(), "curl failed: {stdout}{stderr}");
    assert_eq!(page.requests().len(), 2);

    // One connection (curl reuses it), three requests, each with its own event.
    let end = server.wait_log_line(&["connection closed", "kind=\"forward\""], STEP).await?;
    let log = server.log();
    let requests: Vec<&str> = log.lines().filter(|l| l.contains("request forwarded")).collect();
    assert_eq!(requests.len(), 3, "{log}");
    assert!(requests[2].contains("code=502") && requests[2].contains("reason=\"refused\""), "{}", requests[2]);
    for key in ["bytes_to_upstream", "bytes_to_client"] {
        let sum = requests.iter().map(|l| field(l, key)).sum::<anyhow::Result<u64>>()?;
        assert_eq!(field(&end, key)?, sum, "{key}: {end}");
    }
    // Both answers of the page went through the tunnel; the refused request moved nothing.
    assert!(field(&end, "bytes_to_client")? > 2 * "pod page\n".len() as u64, "{end}");
    assert_eq!(field(requests[2], "bytes_to_client")?, 0);
    assert!(end.contains(" code=502 "), "the connection's code is its last request's: {end}");
    Ok(())
}
