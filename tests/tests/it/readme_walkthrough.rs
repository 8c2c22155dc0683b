//! The walk-through (docs/getting-started.md), run: its three configs (the blocks marked
//! `walkthrough-*`), taken whole, start the real binaries, and each path the walk-through tries
//! answers. The configs' fixed loopback ports are moved by a fixed offset to unusual ones (so a
//! developer's own walk-through on the documented ports does not collide), and `/tmp/seedgate/`
//! becomes a temp dir.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;
use testbed::docs::example;
use testbed::tls_client::http_get_request;
use testbed::{
    Ca, Proc, TempDir, TlsHttpBackend, bin_path, ensure_built, http_get, metric_sum, poll_until, tls_request,
};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// Added to every walk-through port: 8443 -> 28443 and so on, below the ephemeral range.
const OFFSET: u16 = 20000;
const WALKTHROUGH_DIR: &str = "/tmp/seedgate/";
const APISERVER: &str = "api.shoot-a.example.com";
const TUNNEL_NAME: &str = "proxy.seed.example.com";

/// `127.0.0.1:PORT` -> `127.0.0.1:PORT+OFFSET` everywhere (CIDRs such as `127.0.0.0/8` have no port).
fn shift_ports(yaml: &str, ports: &mut Vec<u16>) -> String {
    const HOST: &str = "127.0.0.1:";
    let mut out = String::new();
    let mut rest = yaml;
    while let Some(at) = rest.find(HOST) {
        out.push_str(&rest[..at + HOST.len()]);
        rest = &rest[at + HOST.len()..];
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let port: u16 = rest[..digits].parse().expect("a port after 127.0.0.1:");
        let moved = port.checked_add(OFFSET).expect("walk-through ports are below 45535");
        ports.push(moved);
        out.push_str(&moved.to_string());
        rest = &rest[digits..];
    }
    out.push_str(rest);
    out
}

fn at(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Send `head` to `proxy` and return the response head's status line and the stream.
async fn proxy_request(proxy: SocketAddr, head: &str) -> anyhow::Result<(String, tokio::net::TcpStream)> {
    let mut s = tokio::net::TcpStream::connect(proxy).await?;
    s.write_all(head.as_bytes()).await?;
    let mut got = Vec::new();
    while !got.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        anyhow::ensure!(s.read(&mut b).await? == 1, "closed before the response head");
        got.push(b[0]);
    }
    Ok((String::from_utf8_lossy(&got).lines().next().unwrap_or("").to_owned(), s))
}

#[tokio::test]
async fn readme_walkthrough_runs() {
    // The binaries of this test's own profile (what `bin_path` runs).
    let profile = bin_path("sni-router").unwrap().parent().and_then(Path::file_name).map(|n| n == "release");
    let profile = if profile == Some(true) { "release" } else { "debug" };
    ensure_built(profile, &["sni-router", "proxy-server", "proxy-agent"]).unwrap();
    let dir = TempDir::new("walkthrough").unwrap();
    let pki = dir.join("pki");
    std::fs::create_dir_all(&pki).unwrap();
    let base = format!("{}/", dir.path().display());

    let mut ports = Vec::new();
    let mut config = |name: &str| {
        let yaml =
            shift_ports(&example(&format!("walkthrough-{name}")).yaml, &mut ports).replace(WALKTHROUGH_DIR, &base);
        dir.write(&format!("{name}.yaml"), yaml).unwrap()
    };
    let (server_cfg, router_cfg, agent_cfg) = (config("proxy-server"), config("sni-router"), config("proxy-agent"));
    // The stand-in kube-apiserver's port: the router's upstream in the walk-through (6443).
    let apiserver = at(6443 + OFFSET);
    ports.push(apiserver.port());
    ports.sort_unstable();
    ports.dedup();
    for p in &ports {
        if let Err(e) = std::net::TcpListener::bind(at(*p)) {
            panic!("this test needs 127.0.0.1:{p} (a walk-through port + {OFFSET}), which is taken: {e}");
        }
    }

    // The files make-test-secrets.sh writes that the configs name (one CA stands for its three).
    let ca = Ca::new("walkthrough CA").unwrap();
    for stem in ["server-ca", "agents-ca"] {
        ca.write(&pki, stem).unwrap();
    }
    ca.server(&[TUNNEL_NAME]).unwrap().write(&pki, "agents-listener").unwrap();
    ca.client("shoot-a").unwrap().write(&pki, "agent-shoot-a").unwrap();
    let api_cert = ca.server(&[APISERVER, "127.0.0.1"]).unwrap();
    let cfg = testbed::pki::server_config(&api_cert, None, &["http/1.1"]).unwrap();
    let _apiserver = TlsHttpBackend::start_with("shoot-a", cfg, apiserver).await.unwrap();

    let start = |bin: &'static str, cfg: std::path::PathBuf| async move {
        Proc::start_seedgate(&bin_path(bin).unwrap(), &cfg, &[]).await.unwrap_or_else(|e| panic!("{bin}: {e:#}"))
    };
    let (server, _) = start("proxy-server", server_cfg).await;
    let (router, _) = start("sni-router", router_cfg).await;
    let (agent, _) = start("proxy-agent", agent_cfg).await;
    let logs =
        || format!("proxy-server:\n{}\nsni-router:\n{}\nproxy-agent:\n{}", server.log(), router.log(), agent.log());
    let client = testbed::pki::client_config(&ca, None, &[]).unwrap();

    // P1 by SNI through the gateway, P2 through the agent's apiserver proxy and the gateway.
    for port in [8443, 9443] {
        let res = tls_request(at(port + OFFSET), Some(APISERVER), client.clone(), &http_get_request(APISERVER, "/"))
            .await
            .unwrap_or_else(|e| panic!("TLS to {APISERVER} via :{port}: {e:#}\n{}", logs()));
        assert!(res.body().contains("backend=shoot-a "), "via :{port}: {}", res.text());
    }

    // P3: the agent's session is up on proxy-server, and sni-router's tunnel route carries it.
    let ready = poll_until(Duration::from_secs(10), Duration::from_millis(50), || async {
        let (code, body) = http_get(at(9902 + OFFSET), "/readyz?verbose").await?;
        anyhow::ensure!(code == 200 && body.contains("1 agents"), "{code} {body}");
        Ok(body)
    })
    .await;
    ready.unwrap_or_else(|e| panic!("no agent session: {e:#}\n{}", logs()));
    let (_, text) = http_get(at(9901 + OFFSET), "/metrics").await.unwrap();
    let routed = metric_sum(&text, "seedgate_connections_total", &[("route", "proxy-server-tunnel"), ("result", "ok")]);
    assert_eq!(routed, 1.0, "sni-router's tunnel route counts the agent's session\n{text}");

    // P4: CONNECT through the plain-HTTP front end and the tunnel, then TLS to the target.
    let egress = at(8090 + OFFSET);
    let (status, s) = proxy_request(egress, &format!("CONNECT {apiserver} HTTP/1.1\r\nHost: {apiserver}\r\n\r\n"))
        .await
        .unwrap_or_else(|e| panic!("CONNECT: {e:#}\n{}", logs()));
    assert!(status.contains(" 200 "), "CONNECT answered {status}\n{}", logs());
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(client.clone()).connect(name, s).await.unwrap();
    tls.write_all(&http_get_request("127.0.0.1", "/")).await.unwrap();
    let mut resp = Vec::new();
    let _ = tls.read_to_end(&mut resp).await;
    assert!(String::from_utf8_lossy(&resp).contains("backend=shoot-a "), "{}", String::from_utf8_lossy(&resp));

    // P5: absolute-form GET of the agent's own metrics through the tunnel.
    let target = at(9903 + OFFSET);
    let head = format!("GET http://{target}/metrics HTTP/1.1\r\nHost: {target}\r\nConnection: close\r\n\r\n");
    let (status, mut s) = proxy_request(egress, &head).await.unwrap();
    let mut body = String::new();
    let _ = s.read_to_string(&mut body).await;
    assert!(status.contains(" 200 ") && body.contains("seedgate_"), "{status}\n{body}");
}
