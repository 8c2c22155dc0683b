//! A fresh binary's `/metrics`, before any traffic, has every metric family the metrics reference
//! lists for it (a series of each label value known at start, at 0), so that an alert or a
//! dashboard reads 0 rather than "no data"; the exceptions are listed with why.

use super::*;
use std::time::Duration;
use testbed::openssl_ca::OpensslCa;
use testbed::{InProc, poll_until};

/// Families a fresh binary cannot show yet: their labels come with their first event.
const ABSENT_AT_START: &[(&str, &str, &str)] = &[
    (
        "proxy-server",
        "seedgate_proxied_bytes_total",
        "registered by every binary's shared connection metrics; proxy-server's front ends count in \
         seedgate_tunnel_bytes_total instead",
    ),
    ("proxy-server", "seedgate_handshake_duration_seconds", "as above: sni-router's and the apiserver proxy's"),
    ("proxy-server", "seedgate_upstream_connect_duration_seconds", "as above"),
    ("proxy-server", "seedgate_upstream_connect_failures_total", "as above"),
    ("proxy-server", "seedgate_connection_closes_total", "as above"),
];

/// How long the binaries get to start the tasks that make their first series (an agent's
/// session slots are spawned once it serves).
const DEADLINE: Duration = Duration::from_secs(20);
const TICK: Duration = Duration::from_millis(50);

/// The families of `/metrics` (their `# TYPE` lines).
fn families(text: &str) -> BTreeSet<String> {
    text.lines().filter_map(|l| Some(l.strip_prefix("# TYPE ")?.split(' ').next()?.to_owned())).collect()
}

/// The metrics reference's rows: (metric, the binaries it lists).
fn documented() -> Vec<(String, Vec<String>)> {
    let page = read("docs/reference/metrics.md");
    page.lines()
        .filter(|l| l.starts_with("| `seedgate_"))
        .map(|l| {
            let cells: Vec<&str> = l.split(" | ").collect();
            let name = cells[0].trim_start_matches("| ").trim_matches('`').to_owned();
            (name, cells[3].split(", ").map(str::to_owned).collect())
        })
        .collect()
}

/// Each binary's config with every part whose metrics have labels known at start: a route on
/// a TCP and on a UDP listener, a front end of each protocol and a known cluster, revocation
/// lists, the apiserver proxy and a configured server name.
fn configs(dir: &TempDir) -> anyhow::Result<[String; 3]> {
    let files = dir.join("files");
    std::fs::create_dir_all(&files)?;
    let router = format!(
        "admin: {{ listen: 127.0.0.1:0 }}\nroutes_dir: {}\nlisteners:\n  - name: tcp\n    listen: 127.0.0.1:0\n    routes:\n      - {{ name: r, sni: [a.example], upstreams: [127.0.0.1:1] }}\n  - name: quic\n    listen: 127.0.0.1:0\n    protocol: udp\n    routes:\n      - {{ name: q, sni: [q.example], upstreams: [127.0.0.1:1] }}\n",
        files.display()
    );
    let pki = TunnelPki::new(dir.path())?;
    let ca = OpensslCa::new(&pki.ca, dir.path(), "openssl-ca")?;
    let crl = dir.path().join("crl.pem");
    ca.gencrl(&crl)?;
    let fe = [Fe::new("egress", "shoot-a", FeKind::Plain)];
    let credentials = dir.path().join("review-credentials");
    std::fs::write(&credentials, "proxy-server's token\n")?;
    let server = server_yaml(&pki, "127.0.0.1:0", &fe, &format!("clusters_dir: {}\n", files.display()))
        .replacen(
            &format!("client_ca: {} }}", pki.ca_file.display()),
            &format!("client_ca: {}, crl: {} }}", pki.ca_file.display(), crl.display()),
            1,
        )
        .replacen("agents:\n", "agents:\n  quic: { listen: 127.0.0.1:0 }\n", 1)
        .replacen(
            "frontends:\n",
            &format!(
                "frontends:\n  - {{ name: konnectivity, cluster: shoot-a, listen: 127.0.0.1:0, protocol: grpc }}\n  - {{ name: ssh, cluster: shoot-a, listen: 127.0.0.1:0, protocol: tcp, target: \"10.0.0.1:22\" }}\n  - {{ name: mtls, cluster: shoot-a, listen: 127.0.0.1:0, tls: {{ cert: {}, key: {}, client_ca: {}, crl: {} }} }}\n",
                pki.frontend_cert.0.display(),
                pki.frontend_cert.1.display(),
                pki.ca_file.display(),
                crl.display()
            ),
            1,
        )
        // A cluster whose agents come with tokens: its review series.
        + &format!(
            "clusters:\n  shoot-t: {{ agent_auth: mtls_and_token, token_review: {{ url: \"https://127.0.0.1:1\", ca: {}, token_file: {} }} }}\n",
            pki.ca_file.display(),
            credentials.display()
        );
    let agent = agent_yaml(&pki, &AgentOpts::new("shoot-a", "127.0.0.1:1", &["10.0.0.0/8"]))?.replacen(
        &format!("ca: {},", pki.ca_file.display()),
        &format!("ca: {}, crl: {},", pki.ca_file.display(), crl.display()),
        1,
    ) + "apiserver_proxy:\n  listen: [127.0.0.1:0]\n  gateway: 127.0.0.1:1\n  mode: proxy-protocol-v2\n";
    Ok([router, server, agent])
}

/// One binary's first scrapes: what it exported once every family the reference lists for it
/// (bar the exceptions) was there, or at the deadline with what it lacked.
struct Fresh {
    bin: &'static str,
    text: String,
    lacking: Option<String>,
}

/// Start each binary with [`configs`] and scrape its admin listener as Prometheus does until
/// it exports every family the reference lists for it (some series come from tasks a binary
/// spawns as it starts serving), or the deadline passes.
async fn scrape_fresh(dir: &TempDir) -> anyhow::Result<Vec<Fresh>> {
    let [router, server, agent] = configs(dir)?;
    anyhow::ensure!(agent.contains("crl: "), "the agent's config names a revocation list:\n{agent}");
    let documented = documented();
    let mut out = Vec::new();
    for (bin, yaml) in [("sni-router", router), ("proxy-server", server), ("proxy-agent", agent)] {
        let (p, addrs) = InProc::serve(dir, bin, &yaml).await?;
        let want: BTreeSet<String> = documented
            .iter()
            .filter(|(name, bins)| {
                bins.iter().any(|b| b == bin) && !ABSENT_AT_START.iter().any(|(b, n, _)| *b == bin && n == name)
            })
            .map(|(name, _)| name.clone())
            .collect();
        let admin = addrs.admin()?;
        let polled = poll_until(DEADLINE, TICK, || async {
            let text = testbed::tunnel_kit::metrics(admin).await?;
            let lacking: Vec<String> = want.difference(&families(&text)).cloned().collect();
            anyhow::ensure!(lacking.is_empty(), "{bin} exports none of {lacking:?}");
            Ok(text)
        })
        .await;
        let fresh = match polled {
            Ok(text) => Fresh { bin, text, lacking: None },
            Err(e) => Fresh { bin, text: testbed::tunnel_kit::metrics(admin).await?, lacking: Some(format!("{e:#}")) },
        };
        out.push(fresh);
        drop(p);
    }
    Ok(out)
}

/// Every line of each fresh binary's first full scrape.
pub(super) async fn fresh_scrapes(dir: &TempDir) -> anyhow::Result<Vec<String>> {
    let all = scrape_fresh(dir).await?;
    Ok(all.iter().flat_map(|f| f.text.lines().map(str::to_owned)).collect())
}

/// Every family the reference lists for a binary is in its first scrapes (over its admin
/// listener, as Prometheus reads it), but the listed exceptions; and each exception is still
/// absent, so the list cannot outlive its reason.
#[tokio::test]
async fn every_documented_metric_is_exported_before_any_traffic() -> anyhow::Result<()> {
    let dir = TempDir::new("docs-fresh")?;
    let mut missing = Vec::new();
    for f in scrape_fresh(&dir).await? {
        missing.extend(f.lacking);
        let have = families(&f.text);
        for (b, name, why) in ABSENT_AT_START.iter().filter(|(b, _, _)| *b == f.bin) {
            assert!(
                !have.contains(*name),
                "{b} now exports {name} from its start: drop it from ABSENT_AT_START ({why})"
            );
        }
    }
    assert!(missing.is_empty(), "families absent before any traffic:\n  {}", missing.join("\n  "));
    Ok(())
}
