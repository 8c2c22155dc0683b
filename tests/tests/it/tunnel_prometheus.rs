//! Path P5 with the real Prometheus (Debian package `prometheus`): `proxy_url` pointing at a
//! proxy-server front end, one plain-HTTP target (absolute-form GET) and one HTTPS target
//! (CONNECT, TLS end to end) in the shoot, checked through Prometheus' own query API.

use anyhow::Context as _;
use std::path::Path;
use std::time::Duration;
use testbed::tunnel_kit::{
    AgentOpts, Fe, FeKind, TlsPage, TunnelPki, agent_yaml, inproc_agent, inproc_server, metrics, metrics_page,
    server_yaml, wait_agents,
};
use testbed::{HttpBackend, Proc, TempDir, http_get, metric_value, poll_until};

const PROMETHEUS: &str = "/usr/bin/prometheus";

/// `GET /api/v1/query?query=<q>`: the instant vector as (labels, value) pairs.
async fn query(prom: std::net::SocketAddr, q: &str) -> anyhow::Result<Vec<(serde_json::Value, f64)>> {
    let (code, body) = http_get(prom, &format!("/api/v1/query?query={q}")).await?;
    anyhow::ensure!(code == 200, "query {q}: {code} {body}");
    let v: serde_json::Value = serde_json::from_str(&body)?;
    let result = v["data"]["result"].as_array().with_context(|| format!("no result in {body}"))?;
    result
        .iter()
        .map(|r| {
            let val = r["value"][1].as_str().and_then(|s| s.parse().ok()).with_context(|| format!("bad sample {r}"))?;
            Ok((r["metric"].clone(), val))
        })
        .collect()
}

#[tokio::test]
async fn prometheus_scrapes_http_and_https_targets_through_the_tunnel() -> anyhow::Result<()> {
    prometheus_scrapes(false).await
}

/// The same with the tunnel over QUIC (the agent dials the server's `agents.quic` UDP address).
#[tokio::test]
async fn prometheus_scrapes_through_the_tunnel_over_quic() -> anyhow::Result<()> {
    prometheus_scrapes(true).await
}

async fn prometheus_scrapes(quic: bool) -> anyhow::Result<()> {
    if !Path::new(PROMETHEUS).exists() {
        if std::env::var("SEEDGATE_SKIP_MISSING").as_deref() == Ok("1") {
            eprintln!("SKIP: {PROMETHEUS} missing (SEEDGATE_SKIP_MISSING=1)");
            return Ok(());
        }
        panic!(
            "{PROMETHEUS} is missing: install the Debian package prometheus (.ci/run does), or set SEEDGATE_SKIP_MISSING=1 to skip"
        );
    }
    let dir = TempDir::new("tunnel-prom")?;
    let pki = TunnelPki::new(dir.path())?;
    let mut yaml = server_yaml(&pki, "127.0.0.1:0", &[Fe::new("prom", "shoot-a", FeKind::Plain)], "");
    if quic {
        yaml = yaml.replacen("agents:\n", "agents:\n  quic: { listen: 127.0.0.1:0 }\n", 1);
    }
    let (server, saddrs) = inproc_server(&dir, &yaml).await?;
    let mut o =
        AgentOpts::new("shoot-a", saddrs.listener(if quic { "agents-quic" } else { "agents" })?, &["127.0.0.1/32"]);
    if quic {
        o.tunnel_extra = "  transport: quic\n".into();
    }
    let (agent, _aaddrs) = inproc_agent(&dir, &agent_yaml(&pki, &o)?).await?;
    wait_agents(saddrs.admin()?, "shoot-a", 1.0).await?;

    let node_exporter = HttpBackend::metrics("node-exporter").await?;
    let (kubelet_id, _, _) = pki.backend("kubelet", &["kubelet.shoot-a.test"])?;
    let kubelet = TlsPage::start_on(
        "127.0.0.1:0".parse()?,
        testbed::pki::server_config(&kubelet_id, None, &["http/1.1"])?,
        "text/plain; version=0.0.4",
        &metrics_page("kubelet"),
    )
    .await?;

    let proxy = saddrs.listener("prom")?;
    let yaml = format!(
        r#"global: {{ scrape_interval: 1s, scrape_timeout: 900ms }}
scrape_configs:
  - job_name: shoot-node-exporter
    proxy_url: http://{proxy}
    static_configs: [{{ targets: ["{http}"] }}]
  - job_name: shoot-kubelet
    scheme: https
    proxy_url: http://{proxy}
    tls_config: {{ ca_file: {ca}, server_name: kubelet.shoot-a.test }}
    static_configs: [{{ targets: ["{https}"] }}]
"#,
        http = node_exporter.addr(),
        https = kubelet.addr(),
        ca = pki.ca_file.display(),
    );
    let cfg = dir.write("prometheus.yml", yaml)?;
    let data = dir.join("prom-data");
    // A free port for its web listener (Prometheus cannot report one it chose itself).
    let web = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let prom = Proc::start(
        PROMETHEUS,
        &[
            "--config.file",
            &cfg.display().to_string(),
            "--storage.tsdb.path",
            &data.display().to_string(),
            "--web.listen-address",
            &web.to_string(),
        ],
        &[],
    )?;
    poll_until(Duration::from_secs(60), Duration::from_millis(100), || async {
        let (code, body) = http_get(web, "/-/ready").await?;
        anyhow::ensure!(code == 200, "{code} {body}");
        Ok(())
    })
    .await
    .with_context(|| format!("prometheus log:\n{}", prom.log()))?;

    let logs = || {
        format!(
            "--- prometheus:\n{}\n--- proxy-server:\n{}\n--- proxy-agent:\n{}",
            prom.log(),
            server.log(),
            agent.log()
        )
    };
    poll_until(Duration::from_secs(60), Duration::from_millis(200), || async {
        let up = query(web, "up").await?;
        let value = |job: &str| up.iter().find(|(m, _)| m["job"] == job).map(|(_, v)| *v);
        let (a, b) = (value("shoot-node-exporter"), value("shoot-kubelet"));
        anyhow::ensure!(a == Some(1.0) && b == Some(1.0), "up: node-exporter {a:?}, kubelet {b:?}");
        Ok(())
    })
    .await
    .with_context(logs)?;
    // What was scraped is the targets' content, not just a reachable socket.
    let t = query(web, "testbed_up").await?;
    let mut names: Vec<String> =
        t.iter().filter(|(_, v)| *v == 1.0).filter_map(|(m, _)| m["target"].as_str().map(str::to_owned)).collect();
    names.sort();
    assert_eq!(names, ["kubelet", "node-exporter"], "{t:?}");

    // Both kinds of proxy request went through the tunnel.
    let m = metrics(saddrs.admin()?).await?;
    let n = |kind| {
        metric_value(&m, "seedgate_frontend_requests_total", &[("frontend", "prom"), ("kind", kind), ("code", "200")])
            .unwrap_or(0.0)
    };
    assert!(n("forward") >= 1.0 && n("connect") >= 1.0, "{m}");
    assert!(
        node_exporter.requests().iter().all(|h| h.starts_with("GET /metrics HTTP/1.1\r\n")),
        "{:?}",
        node_exporter.requests()
    );
    assert!(kubelet.connections() >= 1);
    Ok(())
}
