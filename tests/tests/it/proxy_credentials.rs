//! A front end with `cluster_from: proxy_authorization`: curl (as Prometheus' Go client does) sends
//! `Proxy-Authorization: Basic base64(cluster:token)` on CONNECT and on absolute-form requests; the
//! user name selects the cluster per request, a wrong or missing token is answered 407.

use anyhow::Context as _;
use testbed::tunnel_kit::{
    AgentOpts, STEP, TunnelPki, agent_yaml, inproc_agent, inproc_server, metrics, server_yaml, wait_agents,
};
use testbed::{HttpBackend, TempDir, metric_value};

const TOKEN: &str = "s3cret-token";

/// curl through the proxy `proxy`; returns (exit success, stdout, `%{http_code} %{http_connect}`).
async fn curl(proxy: &str, args: &[&str]) -> anyhow::Result<(bool, String, String)> {
    let out = tokio::time::timeout(
        STEP,
        tokio::process::Command::new("curl")
            .args(["-sS", "--max-time", "10", "-x", proxy, "-w", "\n%{http_code} %{http_connect}"])
            .args(args)
            .env_remove("no_proxy")
            .env_remove("NO_PROXY")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .context("curl did not finish")?
    .context("running curl (Debian package curl)")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, codes) = text.rsplit_once('\n').unwrap_or(("", &text));
    Ok((out.status.success(), body.to_owned(), codes.to_owned()))
}

#[tokio::test]
async fn proxy_credentials_select_the_cluster_per_request() -> anyhow::Result<()> {
    let dir = TempDir::new("proxy-credentials")?;
    let pki = TunnelPki::new(dir.path())?;
    let token_file = dir.write("prom-token", format!("{TOKEN}\n"))?;
    // No `cluster:`: each request names it.
    let fe = format!(
        "  - name: prom\n    listen: 127.0.0.1:0\n    cluster_from: proxy_authorization\n    proxy_token_file: {}\n",
        token_file.display()
    );
    let (server, saddrs) = inproc_server(&dir, &server_yaml(&pki, "127.0.0.1:0", &[], &fe)).await?;
    let o = AgentOpts::new("shoot-a", saddrs.listener("agents")?, &["127.0.0.1/32"]);
    let (agent, _) = inproc_agent(&dir, &agent_yaml(&pki, &o)?).await?;
    wait_agents(saddrs.admin()?, "shoot-a", 1.0).await.with_context(|| agent.log())?;
    let fe = saddrs.listener("prom")?;
    let page = HttpBackend::start("text/plain", "node metrics\n").await?;
    let url = format!("http://{}/metrics", page.addr());
    let good = format!("http://shoot-a:{TOKEN}@{fe}");

    // Absolute-form (a plain-HTTP scrape target) and CONNECT (`-p`, an https one).
    let (ok, body, codes) = curl(&good, &[&url]).await?;
    assert!(ok && body == "node metrics\n" && codes.starts_with("200"), "{ok} {body:?} {codes}\n{}", server.log());
    let (ok, body, codes) = curl(&good, &["-p", &url]).await?;
    assert!(ok && body == "node metrics\n", "{ok} {body:?} {codes}\n{}", server.log());
    assert!(codes.ends_with(" 200"), "CONNECT answered {codes}");
    // The credentials end at the proxy.
    for h in page.requests() {
        assert!(!h.to_ascii_lowercase().contains("proxy-authorization"), "forwarded: {h}");
    }

    // A wrong token, and none: 407 with the Basic challenge, on both kinds of request.
    let bad = format!("http://shoot-a:wrong@{fe}");
    let (_, body, codes) = curl(&bad, &["-i", &url]).await?;
    assert!(codes.starts_with("407"), "{codes} {body}");
    assert!(body.to_ascii_lowercase().contains("proxy-authenticate: basic realm=\"seedgate\""), "{body}");
    let (ok, _, codes) = curl(&bad, &["-p", &url]).await?;
    assert!(!ok && codes.ends_with(" 407"), "CONNECT with a wrong token: {ok} {codes}");
    let (_, _, codes) = curl(&format!("http://{fe}"), &[&url]).await?;
    assert!(codes.starts_with("407"), "no credentials: {codes}");
    // The user name picks the cluster: shoot-b has no agent here.
    let (_, _, codes) = curl(&format!("http://shoot-b:{TOKEN}@{fe}"), &[&url]).await?;
    assert!(codes.starts_with("503"), "shoot-b: {codes}");

    let m = metrics(saddrs.admin()?).await?;
    let rejects = |reason| metric_value(&m, "seedgate_rejects_total", &[("listener", "prom"), ("reason", reason)]);
    assert_eq!(rejects("proxy_auth_invalid"), Some(2.0), "{m}");
    assert_eq!(rejects("proxy_auth_missing"), Some(1.0), "{m}");
    Ok(())
}
