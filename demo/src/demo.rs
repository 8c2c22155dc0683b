//! The demo: real seedgate binaries against stand-in kube-apiservers, real TLS clients, and a
//! report of what each client saw. Doubles as a smoke check (false = something expected failed).

use rustls::AlertDescription;
use std::fmt::Write as _;
use std::time::Duration;
use testbed::admin::{http_get, metric_sum};
use testbed::konnectivity::Client;
use testbed::pki::{self, Ca};
use testbed::tls_client::{TlsFailure, http_get_request, tls_request};
use testbed::tunnel_kit::Dialer;
use testbed::{Proc, TempDir, TlsHttpBackend, ensure_built, poll_until};

/// The binaries the demo runs.
const BINARIES: &[&str] = &["sni-router", "proxy-agent", "proxy-server"];

const SHOOT_A: &str = "api.shoot-a.example.com";
const SHOOT_B: &str = "api.shoot-b.example.com";
const NOBODY: &str = "api.nobody.example.com";
const CLIENT_CN: &str = "demo-client";
/// The kube-apiserver's "advertised address" each node-local proxy listens on (loopback here).
const P2_PP_IP: &str = "127.0.0.3";
const P2_CONNECT_IP: &str = "127.0.0.4";
const P2_DEST: &str = "outbound|443||kube-apiserver.shoot--a.svc.cluster.local";
const CLUSTER: &str = "shoot-a";
const PROXY_NAME: &str = "proxy.seed.local";
/// sni-router's route from the agents' port to proxy-server's agents listener.
const TUNNEL_ROUTE: &str = "proxy-server-tunnel";
/// sni-router's route from its UDP port to proxy-server-quic's QUIC listener.
const QUIC_ROUTE: &str = "proxy-server-quic";

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Which build of the seedgate binaries to run (built first if missing or stale).
    #[arg(long, default_value = "release", value_parser = ["debug", "release"])]
    profile: String,
    /// Keep the temp dir (certificates, configs, process logs) and print its path.
    #[arg(long)]
    keep: bool,
}

/// Collects check results and prints one line each.
#[derive(Default)]
struct Report {
    failed: Vec<String>,
    passed: usize,
}

impl Report {
    fn heading(&self, title: &str) {
        println!("\n{title}");
    }

    fn note(&self, text: &str) {
        println!("  note: {text}");
    }

    fn check(&mut self, ok: bool, what: &str, saw: &str) {
        println!("  {} {what}: {saw}", if ok { "ok  " } else { "FAIL" });
        if ok {
            self.passed += 1;
        } else {
            self.failed.push(format!("{what}: {saw}"));
        }
    }
}

/// Run the demo; `Ok(false)` when an expected result did not happen.
pub async fn run(args: Args) -> anyhow::Result<bool> {
    let bins = ensure_built(&args.profile, BINARIES)?;
    let router_bin = &bins[0];
    let mut dir = TempDir::new("demo")?;
    if args.keep {
        dir.keep();
    }

    // PKI: one CA signs the stand-in apiservers and the demo client.
    let ca = Ca::new("seedgate demo CA")?;
    let cert_a = ca.server(&[SHOOT_A])?;
    let cert_b = ca.server(&[SHOOT_B])?;
    let client = ca.client(CLIENT_CN)?;
    let backend_a = TlsHttpBackend::start("shoot-a", &cert_a, None).await?;
    // shoot-b requires a client certificate: mTLS runs end to end through the router.
    let backend_b = TlsHttpBackend::start("shoot-b", &cert_b, Some(&ca)).await?;

    // proxy-server first: the router's tunnel route names its agents listener.
    let (seed, _) = start_proxy_server(&dir, &bins, &ca, "proxy-server", "").await?;
    // A second seed's proxy-server takes its agents over QUIC too (UDP, beside its TCP listener).
    let (quic_seed, q) =
        start_proxy_server(&dir, &bins, &ca, "proxy-server-quic", "  quic: { listen: 127.0.0.1:0 }\n").await?;
    let quic_agents = q.listener("agents-quic")?;

    // Four listeners, as a seed's gateway has: the public gateway (P1, SNI), the port the
    // node-local apiserver proxies send to (P2: PROXY v2 destination or CONNECT header), the
    // port agents dial (P3: SNI passthrough to proxy-server), as Gardener's :443, :8443 and :8132,
    // and a UDP port agents dial over QUIC (routed by the SNI of their Initial packets).
    let config = format!(
        "\
admin: {{ listen: 127.0.0.1:0 }}
timeouts: {{ handshake: 5s, connect: 2s, idle: 5m }}
drain_grace: 2s
listeners:
  - name: gateway
    listen: 127.0.0.1:0
    routes:
      - name: shoot-a-api
        sni: [{SHOOT_A}]
        upstreams: [{a}]
      - name: shoot-b
        sni: [\"*.shoot-b.example.com\"]
        upstreams: [{b}]
  - name: apiserver-proxy
    listen: 127.0.0.1:0
    proxy_protocol: optional
    trusted_proxies: [127.0.0.0/8]
    routes:
      - name: shoot-a-legacy
        destination: [{P2_PP_IP}/32]
        upstreams: [{a}]
      - name: shoot-a-connect
        connect: {{ header: X-Gardener-Destination, values: [\"{P2_DEST}\"] }}
        upstreams: [{a}]
  - name: quic
    listen: 127.0.0.1:0
    protocol: udp
    routes:
      - name: {QUIC_ROUTE}
        sni: [{PROXY_NAME}]
        upstreams: [{quic_agents}]
  - name: tunnel
    listen: 127.0.0.1:0
    routes:
      - name: {TUNNEL_ROUTE}
        sni: [{PROXY_NAME}]
        upstreams: [{agents}]
",
        a = backend_a.addr(),
        b = backend_b.addr(),
        agents = seed.agents,
    );
    let config_path = dir.write("sni-router.yaml", &config)?;
    let (mut router, addrs) = Proc::start_seedgate(router_bin, &config_path, &[]).await?;
    let gateway = addrs.listener("gateway")?;
    let admin = addrs.admin()?;
    let via = Gateway { tunnel: addrs.listener("tunnel")?, admin, pid: router.pid() };
    let quic_gw = addrs.listener("quic")?;

    println!("seedgate demo: sni-router ({})", router_bin.display());
    println!("  router   gateway {gateway}, tunnel {} -> proxy-server {}, admin {admin}", via.tunnel, seed.agents);
    println!("  router   quic {quic_gw} (UDP) -> proxy-server-quic {quic_agents} (QUIC)");
    println!("  backend  shoot-a {} (TLS, {SHOOT_A})", backend_a.addr());
    println!("  backend  shoot-b {} (TLS, {SHOOT_B}, requires a client certificate)", backend_b.addr());
    println!("  client   trusts the demo CA, presents CN={CLIENT_CN}, offers ALPN h2, http/1.1");

    let mut r = Report::default();
    // The client offers h2 first; the backends speak http/1.1 only, so seeing http/1.1 shows
    // the negotiation happened with the backend, through the router.
    let cfg = pki::client_config(&ca, Some(&client), &["h2", "http/1.1"])?;

    for (sni, title, backend, mtls) in [
        (SHOOT_A, "exact route shoot-a-api", "shoot-a", false),
        (SHOOT_B, "wildcard route *.shoot-b.example.com, mTLS to the backend", "shoot-b", true),
    ] {
        r.heading(&format!("P1 {sni}  ({title})"));
        match tls_request(gateway, Some(sni), cfg.clone(), &http_get_request(sni, "/version")).await {
            Ok(res) => {
                let cn = res.peer_cn.clone().unwrap_or_default();
                r.check(
                    cn == sni && res.peer_sans.iter().any(|s| s == sni),
                    "certificate",
                    &format!("CN={cn} SAN={}", res.peer_sans.join(",")),
                );
                r.check(res.alpn.as_deref() == Some("http/1.1"), "ALPN", res.alpn.as_deref().unwrap_or("none"));
                let body = res.body();
                let line = body.trim();
                let want_cn = if mtls { CLIENT_CN } else { "-" };
                r.check(
                    res.status() == Some(200)
                        && line.contains(&format!("backend={backend} "))
                        && line.contains(&format!("sni={sni} "))
                        && line.contains(&format!("client_cn={want_cn} ")),
                    "answered by",
                    line,
                );
            }
            Err(e) => r.check(false, "request", &format!("{e:#}")),
        }
    }

    r.heading(&format!("P1 {NOBODY}  (no route)"));
    match tls_request(gateway, Some(NOBODY), cfg.clone(), &http_get_request(NOBODY, "/version")).await {
        Ok(res) => r.check(false, "rejected", &format!("unexpectedly answered: {}", res.text().trim())),
        Err(e) => {
            let f = TlsFailure::of(&e);
            r.check(f.is_alert(AlertDescription::UnrecognisedName), "rejected", &f.to_string());
        }
    }

    let mut others = Vec::new();
    p2(&mut r, &args, &dir, &bins, &ca, &cfg, &addrs, &mut others).await?;
    let tw = tunnel(&mut r, &dir, &bins, &ca, seed, &via, &mut others).await?;
    migration(&mut r, &dir, &bins, &ca, &tw, &mut others).await?;
    let router_cfg = RouterCfg { path: &config_path, yaml: &config, admin, tunnel: via.tunnel };
    ha(&mut r, &dir, &bins, &ca, &tw, &mut router, &router_cfg, &mut others).await?;
    let qs = QuicSeed { seed: quic_seed, agents: quic_agents, gateway: quic_gw };
    quic(&mut r, &dir, &bins, &ca, &tw, qs, &via, &mut others).await?;
    identity(&mut r, &dir, &bins, &ca, &tw, &mut others).await?;

    r.heading(&format!("metrics  (GET http://{admin}/metrics)"));
    metrics(&mut r, admin).await;
    for p in &mut others {
        let _ = p.signal(libc::SIGTERM);
    }

    r.heading("shutdown  (SIGTERM)");
    router.signal(libc::SIGTERM)?;
    match router.wait_exit(Duration::from_secs(15)).await {
        Some(st) => r.check(st.success(), "exit status", &format!("{st}").replace("exit status: ", "")),
        None => r.check(false, "exit status", "still running 15s after SIGTERM"),
    }

    println!();
    if r.failed.is_empty() {
        println!("demo: all {} checks passed", r.passed);
        Ok(true)
    } else {
        println!("demo: {} of {} checks FAILED:", r.failed.len(), r.failed.len() + r.passed);
        for f in &r.failed {
            println!("  - {f}");
        }
        let mut tail = String::new();
        for l in router.log().lines().rev().take(20).collect::<Vec<_>>().into_iter().rev() {
            let _ = writeln!(tail, "    {l}");
        }
        println!("sni-router log (last lines):\n{tail}");
        Ok(false)
    }
}

/// P2: the node-local apiserver proxy in both modes, into the router's `apiserver-proxy`
/// listener, with a TLS client on the "node side" that must see the shoot-a apiserver.
#[allow(clippy::too_many_arguments)]
async fn p2(
    r: &mut Report,
    _args: &Args,
    dir: &TempDir,
    bins: &[std::path::PathBuf],
    ca: &Ca,
    cfg: &std::sync::Arc<rustls::ClientConfig>,
    router: &testbed::Addresses,
    procs: &mut Vec<Proc>,
) -> anyhow::Result<()> {
    let gateway = router.listener("apiserver-proxy")?;
    let _ = ca;
    for (mode, ip, extra) in [
        ("proxy-protocol-v2", P2_PP_IP, String::new()),
        ("http-connect", P2_CONNECT_IP, format!("  destination: \"{P2_DEST}\"\n")),
    ] {
        let yaml = format!(
            "admin: {{ listen: 127.0.0.1:0 }}\napiserver_proxy:\n  listen: [{ip}:0]\n  gateway: {gateway}\n  mode: {mode}\n{extra}"
        );
        let path = dir.write(&format!("proxy-agent-{mode}.yaml"), &yaml)?;
        let (agent, a) = Proc::start_seedgate(&bins[1], &path, &[]).await?;
        let listen = a.listener("apiserver-proxy")?;
        r.heading(&format!("P2 pod -> proxy-agent {listen} ({mode}) -> sni-router {gateway} -> shoot-a apiserver"));
        match tls_request(listen, Some(SHOOT_A), cfg.clone(), &http_get_request(SHOOT_A, "/api")).await {
            Ok(res) => {
                let cn = res.peer_cn.clone().unwrap_or_default();
                r.check(cn == SHOOT_A, "certificate", &format!("CN={cn}"));
                let body = res.body();
                r.check(body.contains("backend=shoot-a "), "answered by", body.trim());
            }
            Err(e) => r.check(false, "request", &format!("{e:#}")),
        }
        procs.push(agent);
    }
    Ok(())
}

/// What the migration section needs from the tunnel section.
struct TunnelWorld {
    server_yaml: String,
    agents: std::net::SocketAddr,
    egress: std::net::SocketAddr,
    admin: std::net::SocketAddr,
    kubelet: TlsHttpBackend,
}

const ADMIN_TOKEN: &str = "demo-admin-token";

/// proxy-server A (the seed's end of the tunnel), with its config for the migration section.
struct SeedServer {
    proc: Proc,
    yaml: String,
    agents: std::net::SocketAddr,
    egress: std::net::SocketAddr,
    /// The Unix socket of the front end kube-apiserver's `proxyProtocol: GRPC` reaches
    /// (konnectivity's protocol; kube-apiserver speaks it only over a Unix socket).
    grpc: std::path::PathBuf,
    admin: std::net::SocketAddr,
}

/// What the agent dials: sni-router's tunnel listener, and what shows the session went through it.
struct Gateway {
    tunnel: std::net::SocketAddr,
    admin: std::net::SocketAddr,
    pid: u32,
}

/// A proxy-server for `CLUSTER` named `stem` (its config and certificate files); `agents_extra`
/// goes into its `agents:` block (two-space indented lines).
async fn start_proxy_server(
    dir: &TempDir,
    bins: &[std::path::PathBuf],
    ca: &Ca,
    stem: &str,
    agents_extra: &str,
) -> anyhow::Result<(SeedServer, testbed::Addresses)> {
    let (srv_crt, srv_key) = ca.server(&[PROXY_NAME])?.write(dir.path(), stem)?;
    let ca_path = ca.write(dir.path(), "ca")?;
    let token = dir.write("admin-token", ADMIN_TOKEN)?;
    let yaml = format!(
        "admin: {{ listen: 127.0.0.1:0, token_file: {} }}\nagents:\n  listen: 127.0.0.1:0\n{agents_extra}  tls: {{ cert: {}, key: {}, client_ca: {} }}\n  keepalive: {{ interval: 1s, timeout: 3s }}\nfrontends:\n  - name: egress\n    listen: 127.0.0.1:0\n    cluster: {CLUSTER}\n\
         \x20 - name: grpc\n    unix: {}\n    cluster: {CLUSTER}\n    protocol: grpc\n",
        token.display(),
        srv_crt.display(),
        srv_key.display(),
        ca_path.display(),
        dir.join(format!("{stem}-konnectivity.sock")).display()
    );
    let (proc, s) = Proc::start_seedgate(&bins[2], &dir.write(&format!("{stem}.yaml"), &yaml)?, &[]).await?;
    let seed = SeedServer {
        agents: s.listener("agents")?,
        egress: s.listener("egress")?,
        grpc: s.unix("grpc")?,
        admin: s.admin()?,
        proc,
        yaml,
    };
    Ok((seed, s))
}

/// A proxy-agent's tunnel config: a client certificate for `cluster` (files `<stem>.*`), one
/// server address, the TLS name it sends; `extra` goes into the `tunnel:` block.
fn agent_tunnel_yaml(
    dir: &TempDir,
    ca: &Ca,
    cluster: &str,
    stem: &str,
    server: std::net::SocketAddr,
    server_name: &str,
    extra: &str,
) -> anyhow::Result<String> {
    let (crt, key) = ca.client(cluster)?.write(dir.path(), stem)?;
    Ok(format!(
        "admin: {{ listen: 127.0.0.1:0 }}\ntunnel:\n  servers: [{server}]\n  tls: {{ cert: {}, key: {}, ca: {}, server_name: {server_name} }}\n  allow: [127.0.0.0/8]\n{extra}",
        crt.display(),
        key.display(),
        ca.write(dir.path(), "ca")?.display()
    ))
}

/// P3-P5: a proxy-agent that dials out to proxy-server through sni-router's tunnel listener (as
/// an agent reaches a seed: one gateway, SNI passthrough); a seed-side CONNECT to a TLS backend
/// "in the shoot", and a forward-proxied plain-HTTP GET (what Prometheus sends).
#[allow(clippy::too_many_arguments)]
async fn tunnel(
    r: &mut Report,
    dir: &TempDir,
    bins: &[std::path::PathBuf],
    ca: &Ca,
    seed: SeedServer,
    via: &Gateway,
    procs: &mut Vec<Proc>,
) -> anyhow::Result<TunnelWorld> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let kubelet = TlsHttpBackend::start("kubelet", &ca.server(&["10.250.0.5", "kubelet.shoot-a"])?, None).await?;
    let node_exporter = testbed::HttpBackend::metrics("node-exporter").await?;
    let SeedServer { proc: server, yaml: server_yaml, agents, egress, grpc, admin: s_admin } = seed;
    let agent_yaml = agent_tunnel_yaml(dir, ca, CLUSTER, "agent-shoot-a", via.tunnel, PROXY_NAME, "")?;
    let (agent, agent_addrs) =
        Proc::start_seedgate(&bins[1], &dir.write("proxy-agent-tunnel.yaml", &agent_yaml)?, &[]).await?;
    let agent_pid = agent.pid();
    let agent_admin = agent_addrs.admin()?;
    procs.push(server);
    procs.push(agent);

    r.heading(&format!(
        "P3 proxy-agent dials out to sni-router {} (SNI {PROXY_NAME}) -> proxy-server {agents} (mTLS, CN={CLUSTER})",
        via.tunnel
    ));
    let up = poll_until(Duration::from_secs(10), Duration::from_millis(50), || async {
        let (code, body) = http_get(s_admin, "/readyz?verbose").await?;
        anyhow::ensure!(code == 200, "not ready yet");
        Ok(body)
    })
    .await;
    let mut peer = None;
    match up {
        Ok(body) => {
            let line = body.lines().find(|l| l.contains("cluster-")).unwrap_or("").trim().to_owned();
            peer = session_peer(&line);
            r.check(true, "proxy-server /readyz", &line)
        }
        Err(e) => r.check(false, "proxy-server /readyz", &format!("{e:#}")),
    }
    // The router counts a routed connection when its upstream connects, and holds it open while
    // the session lives.
    let routed = poll_until(Duration::from_secs(5), Duration::from_millis(50), || async {
        let (_, text) = http_get(via.admin, "/metrics").await?;
        let total = metric_sum(
            &text,
            "seedgate_connections_total",
            &[("listener", "tunnel"), ("route", TUNNEL_ROUTE), ("result", "ok")],
        );
        let active = metric_sum(&text, "seedgate_connections_active", &[("listener", "tunnel")]);
        anyhow::ensure!(total >= 1.0 && active >= 1.0, "total {total}, active {active}");
        Ok((total, active))
    })
    .await;
    match routed {
        Ok((total, active)) => r.check(
            true,
            &format!("sni-router routed it (route {TUNNEL_ROUTE})"),
            &format!("seedgate_connections_total {total}, seedgate_connections_active{{listener=\"tunnel\"}} {active}"),
        ),
        Err(e) => r.check(false, &format!("sni-router routed it (route {TUNNEL_ROUTE})"), &format!("{e:#}")),
    }
    // Which process holds the other end of proxy-server's agent connection: sni-router's
    // upstream socket, not the agent's own.
    let owner = peer.map(|p| (p, tcp_socket_owner(p, agents, &[(via.pid, "sni-router"), (agent_pid, "proxy-agent")])));
    match owner {
        Some((p, Ok(Some(name)))) => r.check(
            name == "sni-router",
            "proxy-server's agent peer",
            &format!("{p} is a socket of {name} (connected to {agents})"),
        ),
        Some((p, Ok(None))) => r.check(false, "proxy-server's agent peer", &format!("no demo process holds {p}")),
        Some((_, Err(e))) => r.check(false, "proxy-server's agent peer", &format!("{e:#}")),
        None => r.check(false, "proxy-server's agent peer", "no session listed by /readyz?verbose"),
    }

    r.heading(&format!(
        "P4 CONNECT {} through proxy-server {egress} and the tunnel (kube-apiserver -> kubelet)",
        kubelet.addr()
    ));
    let connect = async {
        let (s, status) = connect_head(egress, kubelet.addr()).await?;
        let cc = pki::client_config(ca, None, &[])?;
        let name = rustls::pki_types::ServerName::try_from("kubelet.shoot-a")?;
        let mut tls = tokio_rustls::TlsConnector::from(cc).connect(name, s).await?;
        tls.write_all(&http_get_request("kubelet.shoot-a", "/containerLogs/kube-system/etcd-0/etcd")).await?;
        let mut resp = Vec::new();
        let _ = tls.read_to_end(&mut resp).await;
        anyhow::Ok((status, String::from_utf8_lossy(&resp).into_owned()))
    };
    match tokio::time::timeout(Duration::from_secs(10), connect).await {
        Ok(Ok((status, resp))) => {
            r.check(status.contains(" 200 "), "proxy-server answered", &status);
            let body = resp.split("\r\n\r\n").nth(1).unwrap_or("").trim().to_owned();
            r.check(body.contains("backend=kubelet "), "TLS through the tunnel, answered by", &body);
        }
        Ok(Err(e)) => r.check(false, "CONNECT", &format!("{e:#}")),
        Err(_) => r.check(false, "CONNECT", "no answer within 10s"),
    }

    r.heading(&format!("P5 GET http://{}/metrics through proxy-server (Prometheus proxy_url)", node_exporter.addr()));
    let get = async {
        let req =
            format!("GET http://{0}/metrics HTTP/1.1\r\nHost: {0}\r\nConnection: close\r\n\r\n", node_exporter.addr());
        exchange(egress, req.as_bytes()).await
    };
    match tokio::time::timeout(Duration::from_secs(10), get).await {
        Ok(Ok(resp)) => {
            let status = resp.lines().next().unwrap_or("").to_owned();
            r.check(status.contains(" 200 "), "status", &status);
            let sample = resp.lines().find(|l| l.starts_with("node_") || l.contains("up")).unwrap_or("").to_owned();
            r.check(!sample.is_empty(), "scraped", &sample);
        }
        Ok(Err(e)) => r.check(false, "GET", &format!("{e:#}")),
        Err(_) => r.check(false, "GET", "no answer within 10s"),
    }

    r.heading(&format!(
        "P4 gRPC: a konnectivity Proxy dial to {} through proxy-server's Unix socket {} (kube-apiserver's proxyProtocol: GRPC)",
        node_exporter.addr(),
        grpc.display()
    ));
    grpc_dial(r, &grpc, node_exporter.addr()).await;

    r.heading("P4 CONNECT 169.254.169.254:80 (not on the agent's allowlist)");
    let refused = async { exchange(egress, b"CONNECT 169.254.169.254:80 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").await };
    match tokio::time::timeout(Duration::from_secs(10), refused).await {
        Ok(Ok(resp)) => {
            let status = resp.lines().next().unwrap_or("").to_owned();
            let reason = resp.split("\r\n\r\n").nth(1).unwrap_or("").trim().to_owned();
            r.check(status.contains(" 403 "), "refused", &format!("{status} -- {reason}"));
        }
        Ok(Err(e)) => r.check(false, "CONNECT", &format!("{e:#}")),
        Err(_) => r.check(false, "CONNECT", "no answer within 10s"),
    }

    r.heading("status pages  (GET /status and / of each binary's admin listener)");
    status_pages(r, &[("sni-router", via.admin), ("proxy-server", s_admin), ("proxy-agent", agent_admin)]).await;

    r.heading(&format!("proxy-server metrics  (GET http://{s_admin}/metrics)"));
    if let Ok((_, text)) = http_get(s_admin, "/metrics").await {
        for l in text.lines().filter(|l| {
            l.starts_with("seedgate_agents_connected")
                || l.starts_with("seedgate_tunnel_streams_opened_total")
                || l.starts_with("seedgate_tunnel_dial_failures_total")
                || l.starts_with("seedgate_frontend_requests_total")
        }) {
            println!("       {l}");
        }
        let opened = metric_sum(&text, "seedgate_tunnel_streams_opened_total", &[("cluster", CLUSTER)]);
        r.check(opened >= 3.0, "streams opened through the tunnel", &format!("{opened}"));
    }
    Ok(TunnelWorld { server_yaml, agents, egress, admin: s_admin, kubelet })
}

/// What each binary's status document shows of this topology, in a line: sni-router's tunnel
/// route, proxy-server's cluster and its agent session, the agent's slot; `None` when it does
/// not show it.
fn status_line(binary: &str, doc: &serde_json::Value) -> Option<String> {
    let n = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
    let sum =
        |v: &serde_json::Value| v.as_array().map_or(0, |a| a.iter().filter_map(serde_json::Value::as_u64).sum::<u64>());
    match binary {
        "sni-router" => {
            let route = doc["routes"].as_array()?.iter().find(|r| r["name"] == TUNNEL_ROUTE)?;
            (n(&route["connections"]) >= 1).then(|| {
                format!(
                    "{} listeners, {} routes; route {TUNNEL_ROUTE}: {}, {} connections open, {} routed in {} min",
                    n(&doc["totals"]["listeners"]),
                    n(&doc["totals"]["routes"]),
                    route["health"].as_str().unwrap_or("?"),
                    n(&route["connections"]),
                    sum(&route["routed"]),
                    n(&doc["minutes"]),
                )
            })
        }
        "proxy-server" => {
            let c = doc["clusters"].as_array()?.iter().find(|c| c["name"] == CLUSTER)?;
            let s = c["sessions"].as_array()?.first()?;
            Some(format!(
                "{} clusters, {} sessions; {CLUSTER}: {}, {} agents, {} dials ok in {} min; its session: node {:?} {} over {}, {} streams",
                n(&doc["totals"]["clusters"]),
                n(&doc["totals"]["sessions"]),
                c["health"].as_str().unwrap_or("?"),
                n(&c["sessions_here"]),
                sum(&c["dials"]["ok"]),
                n(&doc["minutes"]),
                s["node"].as_str().unwrap_or(""),
                s["standing"].as_str().unwrap_or("?"),
                s["transport"].as_str().unwrap_or("?"),
                n(&s["streams"]),
            ))
        }
        _ => {
            let slot = doc["servers"].as_array()?.first()?["slots"].as_array()?.first()?;
            (slot["state"] == "connected").then(|| {
                format!(
                    "{} servers, {} sessions up; slot {}: {} to replica {} over {}",
                    n(&doc["totals"]["servers"]),
                    n(&doc["totals"]["sessions_up"]),
                    slot["slot"].as_str().unwrap_or("?"),
                    slot["state"].as_str().unwrap_or("?"),
                    slot["replica"].as_str().unwrap_or("?"),
                    slot["transport"].as_str().unwrap_or("?"),
                )
            })
        }
    }
}

/// Each binary's `/status` (a line of what it shows; fails when missing or when it does not
/// show the topology) and `/` (the page, with its Content-Security-Policy).
async fn status_pages(r: &mut Report, admins: &[(&str, std::net::SocketAddr)]) {
    for (binary, admin) in admins {
        let doc = async {
            let (code, body) = http_get(*admin, "/status").await?;
            anyhow::ensure!(code == 200, "/status answered {code}");
            let doc: serde_json::Value = serde_json::from_str(&body)?;
            anyhow::ensure!(doc["version"] == 1 && doc["binary"] == *binary, "not {binary}'s version 1: {body}");
            anyhow::Ok(doc)
        };
        match doc.await {
            Ok(doc) => match status_line(binary, &doc) {
                Some(line) => r.check(true, &format!("{binary} /status"), &line),
                None => r.check(false, &format!("{binary} /status"), &format!("does not show the topology: {doc}")),
            },
            Err(e) => r.check(false, &format!("{binary} /status"), &format!("{e:#}")),
        }
        match testbed::admin::http_get_with(*admin, "/", &[]).await {
            Ok(a) => {
                let csp = a.header("content-security-policy").unwrap_or("");
                let tables = a.body.matches("<table ").count();
                r.check(
                    a.status == 200 && csp.contains("script-src 'self'") && tables >= 1,
                    &format!("{binary} /"),
                    &format!("{} {} KiB, {tables} tables, CSP {csp:?}", a.status, a.body.len() / 1024),
                );
            }
            Err(e) => r.check(false, &format!("{binary} /"), &format!("{e:#}")),
        }
    }
}

/// Send `request` to `egress` and read until the proxy closes: the whole answer as text.
async fn exchange(egress: std::net::SocketAddr, request: &[u8]) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(egress).await?;
    s.write_all(request).await?;
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).await?;
    Ok(String::from_utf8_lossy(&resp).into_owned())
}

/// Send `CONNECT target` to `egress` and read the response head byte by byte (nothing past it):
/// the stream and the status line.
async fn connect_head(
    egress: std::net::SocketAddr,
    target: std::net::SocketAddr,
) -> anyhow::Result<(tokio::net::TcpStream, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(egress).await?;
    s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").as_bytes()).await?;
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        anyhow::ensure!(s.read(&mut b).await? == 1, "closed before the response head");
        head.push(b[0]);
    }
    let status = String::from_utf8_lossy(&head).lines().next().unwrap_or("").to_owned();
    Ok((s, status))
}

/// A CONNECT through `egress` to `target`: the response status line, and for 200 the body of a
/// TLS request made through the tunnel (`Err` text for anything else).
async fn connect_through(
    egress: std::net::SocketAddr,
    target: std::net::SocketAddr,
    ca: &Ca,
) -> anyhow::Result<(String, String)> {
    use tokio::io::AsyncReadExt;
    let (mut s, status) = connect_head(egress, target).await?;
    if !status.contains(" 200 ") {
        let mut body = String::new();
        let _ = s.read_to_string(&mut body).await;
        return Ok((status, body.trim().to_owned()));
    }
    Ok((status, kubelet_healthz(s, ca).await?))
}

/// TLS to the stand-in kubelet over `s` (a tunnel stream), `GET /healthz`: the answer's body.
async fn kubelet_healthz(s: tokio::net::TcpStream, ca: &Ca) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let cc = pki::client_config(ca, None, &[])?;
    let name = rustls::pki_types::ServerName::try_from("kubelet.shoot-a")?;
    let mut tls = tokio_rustls::TlsConnector::from(cc).connect(name, s).await?;
    tls.write_all(&http_get_request("kubelet.shoot-a", "/healthz")).await?;
    let mut resp = Vec::new();
    let _ = tls.read_to_end(&mut resp).await;
    let text = String::from_utf8_lossy(&resp).into_owned();
    Ok(text.split("\r\n\r\n").nth(1).unwrap_or("").trim().to_owned())
}

/// P6: the shoot's tunnel moves from proxy-server A (the one above) to a new proxy-server B:
/// A drains with a move notice, the agent opens its session to B first, then A is fenced.
async fn migration(
    r: &mut Report,
    dir: &TempDir,
    bins: &[std::path::PathBuf],
    ca: &Ca,
    tw: &TunnelWorld,
    procs: &mut Vec<Proc>,
) -> anyhow::Result<()> {
    // B is another seed's proxy-server: the same config but for its gRPC front end's socket.
    let b_yaml = tw.server_yaml.replace("proxy-server-konnectivity.sock", "proxy-server-b-konnectivity.sock");
    let (server_b, b) = Proc::start_seedgate(&bins[2], &dir.write("proxy-server-b.yaml", &b_yaml)?, &[]).await?;
    procs.push(server_b);
    let (b_agents, b_egress, b_admin) = (b.listener("agents")?, b.listener("egress")?, b.admin()?);
    let agents_of = |admin| async move {
        let (_, text) = http_get(admin, "/metrics").await.ok()?;
        testbed::metric_value(&text, "seedgate_agents_connected", &[("cluster", CLUSTER)])
    };
    // B stands for another seed; the move notice names its agents listener directly.
    r.heading(&format!("P6 migrate {CLUSTER}'s tunnel: proxy-server A {} -> proxy-server B {b_agents}", tw.admin));
    let body = format!(r#"{{"state":"draining","move_to":["{b_agents}"],"drain_deadline":"5s"}}"#);
    let put = testbed::admin::http_request(
        tw.admin,
        "PUT",
        &format!("/control/clusters/{CLUSTER}"),
        Some(&body),
        Some(ADMIN_TOKEN),
    )
    .await?;
    r.check(put.0 == 200, "A: PUT /control/clusters/shoot-a draining, move_to B", put.1.trim());
    let started = std::time::Instant::now();
    let moved = poll_until(Duration::from_secs(10), Duration::from_millis(20), || async {
        (agents_of(b_admin).await == Some(1.0)).then_some(())
    })
    .await;
    r.check(
        moved.is_ok(),
        "agent session on B (make-before-break)",
        &format!("{:?} after the move notice", started.elapsed()),
    );
    let left = poll_until(Duration::from_secs(10), Duration::from_millis(20), || async {
        (agents_of(tw.admin).await == Some(0.0)).then_some(())
    })
    .await;
    r.check(left.is_ok(), "old session on A closed", &format!("{:?} after the move notice", started.elapsed()));
    let put = testbed::admin::http_request(
        tw.admin,
        "PUT",
        &format!("/control/clusters/{CLUSTER}"),
        Some(r#"{"state":"fenced"}"#),
        Some(ADMIN_TOKEN),
    )
    .await?;
    r.check(put.0 == 200, "A: fenced", put.1.trim());
    match connect_through(tw.egress, tw.kubelet.addr(), ca).await {
        Ok((status, body)) => r.check(
            status.contains(" 503 ") && body.contains("cluster moved"),
            "dial through A",
            &format!("{status} -- {body}"),
        ),
        Err(e) => r.check(false, "dial through A", &format!("{e:#}")),
    }
    match connect_through(b_egress, tw.kubelet.addr(), ca).await {
        Ok((status, body)) => r.check(
            status.contains(" 200 ") && body.contains("backend=kubelet "),
            "dial through B",
            &format!("{status} -- {body}"),
        ),
        Err(e) => r.check(false, "dial through B", &format!("{e:#}")),
    }
    if let Ok((_, text)) = http_get(tw.admin, "/readyz?verbose").await {
        let line = text.lines().find(|l| l.contains("cluster-")).unwrap_or("").trim().to_owned();
        r.check(line.contains("fenced"), "A /readyz?verbose", &line);
    }
    Ok(())
}

/// sni-router's config file and text, for the HA section's reload.
struct RouterCfg<'a> {
    path: &'a std::path::Path,
    yaml: &'a str,
    admin: std::net::SocketAddr,
    tunnel: std::net::SocketAddr,
}

const HA_NAME: &str = "proxy-ha.seed.local";
const HA_CLUSTER: &str = "shoot-b";

/// One proxy-server replica of the HA section: `server_id: ha-<i>`, two replicas announced.
async fn start_ha_replica(
    dir: &TempDir,
    bins: &[std::path::PathBuf],
    ca: &Ca,
    i: usize,
    port: u16,
) -> anyhow::Result<(Proc, std::net::SocketAddr, std::net::SocketAddr)> {
    let (c, k) = ca.server(&[HA_NAME])?.write(dir.path(), &format!("proxy-ha-{i}"))?;
    let ca = ca.write(dir.path(), "ca")?;
    let yaml = format!(
        "admin: {{ listen: 127.0.0.1:0 }}\ndrain_grace: 2s\nagents:\n  listen: 127.0.0.1:{port}\n  tls: {{ cert: {}, key: {}, client_ca: {} }}\n  keepalive: {{ interval: 1s, timeout: 3s }}\n  server_id: ha-{i}\n  server_count: 2\nfrontends:\n  - name: egress\n    listen: 127.0.0.1:0\n    cluster: {HA_CLUSTER}\n",
        c.display(),
        k.display(),
        ca.display()
    );
    let (p, a) = Proc::start_seedgate(&bins[2], &dir.write(&format!("proxy-server-ha-{i}.yaml"), &yaml)?, &[]).await?;
    Ok((p, a.listener("egress")?, a.admin()?))
}

/// HA: two proxy-server replicas behind one gateway name (a second SNI route on the router's
/// tunnel listener, added by a reload). An agent that knows only the gateway reaches both; a
/// replica is restarted (SIGTERM, start again) and the agent reaches it again by itself.
#[allow(clippy::too_many_arguments)]
async fn ha(
    r: &mut Report,
    dir: &TempDir,
    bins: &[std::path::PathBuf],
    ca: &Ca,
    tw: &TunnelWorld,
    router: &mut Proc,
    rc: &RouterCfg<'_>,
    procs: &mut Vec<Proc>,
) -> anyhow::Result<()> {
    let free = || -> anyhow::Result<u16> { Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port()) };
    let ports = [free()?, free()?];
    let mut replicas = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        replicas.push(start_ha_replica(dir, bins, ca, i, *port).await?);
    }
    r.heading(&format!(
        "HA {HA_CLUSTER}: proxy-server replicas ha-0 127.0.0.1:{} and ha-1 127.0.0.1:{} behind one gateway name ({HA_NAME})",
        ports[0], ports[1]
    ));
    // The tunnel listener is the last one in the router's config: its route list ends the file.
    let yaml = format!(
        "{}      - name: proxy-server-ha\n        sni: [{HA_NAME}]\n        upstreams: [127.0.0.1:{}, 127.0.0.1:{}]\n        balance: least-connections\n",
        rc.yaml, ports[0], ports[1]
    );
    let tmp = rc.path.with_extension("yaml.new");
    std::fs::write(&tmp, yaml)?;
    std::fs::rename(&tmp, rc.path)?;
    router.signal(libc::SIGHUP)?;
    let reloaded = poll_until(Duration::from_secs(10), Duration::from_millis(20), || async {
        let (_, t) = http_get(rc.admin, "/metrics").await?;
        let n = metric_sum(&t, "seedgate_config_reloads_total", &[("result", "success")]);
        anyhow::ensure!(n >= 1.0, "no successful reload yet");
        Ok(n)
    })
    .await;
    r.check(reloaded.is_ok(), "sni-router reloaded with the route to both replicas", "SIGHUP");

    let reconnect = "  reconnect: { initial: 100ms, max: 1s }\n";
    let agent_yaml = agent_tunnel_yaml(dir, ca, HA_CLUSTER, "agent-shoot-b", rc.tunnel, HA_NAME, reconnect)?;
    let started = std::time::Instant::now();
    let (agent, a) = Proc::start_seedgate(&bins[1], &dir.write("proxy-agent-ha.yaml", &agent_yaml)?, &[]).await?;
    procs.push(agent);
    let agent_admin = a.admin()?;
    let tunnel_line = |want: &'static str| async move {
        poll_until(Duration::from_secs(15), Duration::from_millis(20), || async {
            let (_, body) = http_get(agent_admin, "/readyz?verbose").await?;
            let line = body.lines().find(|l| l.contains("tunnel-")).unwrap_or("").trim().to_owned();
            // Two sessions up are not yet one on each replica: a slot names its replica once
            // that announced itself (a duplicate is closed and dialled again then).
            let on_both = line.contains("ha-0:") && line.contains("ha-1:");
            anyhow::ensure!(line.contains(want) && (on_both || !want.starts_with("connected")), "{line}");
            Ok(line)
        })
        .await
    };
    match tunnel_line("connected: 2 of 2 replicas").await {
        Ok(line) => r.check(true, "agent /readyz?verbose", &format!("{line}  ({:?} after start)", started.elapsed())),
        Err(e) => r.check(false, "agent /readyz?verbose", &format!("{e:#}")),
    }
    for (i, (_, egress, _)) in replicas.iter().enumerate() {
        match connect_through(*egress, tw.kubelet.addr(), ca).await {
            Ok((status, body)) => r.check(
                status.contains(" 200 ") && body.contains("backend=kubelet "),
                &format!("dial through ha-{i}"),
                &format!("{status} -- {body}"),
            ),
            Err(e) => r.check(false, &format!("dial through ha-{i}"), &format!("{e:#}")),
        }
    }

    // A rolling restart of ha-0: it announces "draining", the agent reports the degradation,
    // and reaches the new ha-0 once it listens again.
    let (mut old, _, _) = replicas.remove(0);
    old.signal(libc::SIGTERM)?;
    match tunnel_line("degraded").await {
        Ok(line) => r.check(true, "ha-0 got SIGTERM: agent", &line),
        Err(e) => r.check(false, "ha-0 got SIGTERM: agent", &format!("{e:#}")),
    }
    let exited = old.wait_exit(Duration::from_secs(10)).await;
    r.check(exited.is_some_and(|s| s.success()), "ha-0 drained and exited", &format!("{exited:?}"));
    let restarted = std::time::Instant::now();
    let (new0, egress0, admin0) = start_ha_replica(dir, bins, ca, 0, ports[0]).await?;
    procs.push(new0);
    match tunnel_line("connected: 2 of 2 replicas").await {
        Ok(line) => {
            r.check(true, "new ha-0 started: agent", &format!("{line}  ({:?} after start)", restarted.elapsed()))
        }
        Err(e) => r.check(false, "new ha-0 started: agent", &format!("{e:#}")),
    }
    let ready = poll_until(Duration::from_secs(10), Duration::from_millis(20), || async {
        let (code, _) = http_get(admin0, "/readyz").await?;
        anyhow::ensure!(code == 200, "{code}");
        Ok(())
    })
    .await;
    r.check(ready.is_ok(), "new ha-0 /readyz", &format!("200 after {:?}", restarted.elapsed()));
    match connect_through(egress0, tw.kubelet.addr(), ca).await {
        Ok((status, body)) => r.check(
            status.contains(" 200 ") && body.contains("backend=kubelet "),
            "dial through the new ha-0",
            &format!("{status} -- {body}"),
        ),
        Err(e) => r.check(false, "dial through the new ha-0", &format!("{e:#}")),
    }
    for (p, _, _) in replicas {
        procs.push(p);
    }
    Ok(())
}

/// The QUIC section's proxy-server, its QUIC (UDP) agents listener, and sni-router's UDP listener.
struct QuicSeed {
    seed: SeedServer,
    agents: std::net::SocketAddr,
    gateway: std::net::SocketAddr,
}

/// QUIC: the tunnel over QUIC as production runs it: a proxy-agent with `transport: quic` dials
/// sni-router's UDP listener, which routes its Initials by SNI to proxy-server-quic's QUIC
/// listener; a CONNECT through that proxy-server reaches the kubelet over the QUIC session. A
/// second agent with `transport: auto` dials the TCP-only gateway port (nothing takes UDP there)
/// and falls back to h2.
#[allow(clippy::too_many_arguments)]
async fn quic(
    r: &mut Report,
    dir: &TempDir,
    bins: &[std::path::PathBuf],
    ca: &Ca,
    tw: &TunnelWorld,
    qs: QuicSeed,
    via: &Gateway,
    procs: &mut Vec<Proc>,
) -> anyhow::Result<()> {
    let QuicSeed { seed, agents, gateway } = qs;
    let (s_admin, egress) = (seed.admin, seed.egress);
    procs.push(seed.proc);
    let yaml = agent_tunnel_yaml(dir, ca, CLUSTER, "agent-quic", gateway, PROXY_NAME, "  transport: quic\n")?;
    let (agent, a) = Proc::start_seedgate(&bins[1], &dir.write("proxy-agent-quic.yaml", &yaml)?, &[]).await?;
    let (agent_pid, agent_admin) = (agent.pid(), a.admin()?);
    procs.push(agent);
    // Started now so that its QUIC attempt times out while the QUIC agent is checked.
    let auto_yaml = agent_tunnel_yaml(
        dir,
        ca,
        "shoot-c",
        "agent-auto",
        via.tunnel,
        PROXY_NAME,
        "  transport: auto\n  quic_timeout: 500ms\n",
    )?;
    let (auto, au) = Proc::start_seedgate(&bins[1], &dir.write("proxy-agent-auto.yaml", &auto_yaml)?, &[]).await?;
    let auto_admin = au.admin()?;
    procs.push(auto);
    let started = std::time::Instant::now();

    r.heading(&format!(
        "QUIC proxy-agent (transport: quic) dials sni-router {gateway}/udp (SNI {PROXY_NAME}) -> proxy-server-quic {agents}/udp"
    ));
    let tunnel_line = |admin| async move {
        poll_until(Duration::from_secs(10), Duration::from_millis(20), || async move {
            let (code, body) = http_get(admin, "/readyz?verbose").await?;
            let line = body.lines().find(|l| l.contains("tunnel-")).unwrap_or("").trim().to_owned();
            anyhow::ensure!(code == 200, "{code}: {line}");
            Ok(line)
        })
        .await
    };
    match tunnel_line(agent_admin).await {
        Ok(line) => r.check(
            line.contains("transport quic"),
            "agent /readyz?verbose",
            &format!("{line}  ({:?} after start)", started.elapsed()),
        ),
        Err(e) => r.check(false, "agent /readyz?verbose", &format!("{e:#}")),
    }
    // The session's peer as proxy-server-quic sees it: sni-router's upstream UDP socket.
    let peer = match http_get(s_admin, "/readyz?verbose").await {
        Ok((_, body)) => session_peer(body.lines().find(|l| l.contains("cluster-")).unwrap_or("")),
        Err(_) => None,
    };
    let pids = [(via.pid, "sni-router"), (agent_pid, "proxy-agent")];
    match peer.map(|p| (p, socket_owner("/proc/net/udp", p, None, &pids))) {
        Some((p, Ok(Some(name)))) => {
            r.check(name == "sni-router", "proxy-server-quic's agent peer", &format!("{p} is a UDP socket of {name}"))
        }
        Some((p, Ok(None))) => r.check(false, "proxy-server-quic's agent peer", &format!("no demo process holds {p}")),
        Some((_, Err(e))) => r.check(false, "proxy-server-quic's agent peer", &format!("{e:#}")),
        None => r.check(false, "proxy-server-quic's agent peer", "no session listed by /readyz?verbose"),
    }
    match connect_through(egress, tw.kubelet.addr(), ca).await {
        Ok((status, body)) => r.check(
            status.contains(" 200 ") && body.contains("backend=kubelet "),
            &format!("CONNECT {} through proxy-server-quic {egress}", tw.kubelet.addr()),
            &format!("{status} -- {body}"),
        ),
        Err(e) => r.check(false, "CONNECT through proxy-server-quic", &format!("{e:#}")),
    }
    match http_get(via.admin, "/metrics").await {
        Ok((_, text)) => {
            let flows = metric_sum(
                &text,
                "seedgate_udp_flows_total",
                &[("listener", "quic"), ("route", QUIC_ROUTE), ("result", "ok")],
            );
            let active = metric_sum(&text, "seedgate_udp_flows_active", &[("listener", "quic")]);
            r.check(
                flows >= 1.0 && active >= 1.0,
                &format!("sni-router routed it (route {QUIC_ROUTE})"),
                &format!("seedgate_udp_flows_total{{result=\"ok\"}} {flows}, seedgate_udp_flows_active {active}"),
            );
        }
        Err(e) => r.check(false, "sni-router /metrics", &format!("{e:#}")),
    }
    match http_get(agent_admin, "/metrics").await {
        Ok((_, text)) => {
            let quic = metric_sum(&text, "seedgate_tunnel_transport_info", &[("transport", "quic")]);
            let h2 = metric_sum(&text, "seedgate_tunnel_transport_info", &[("transport", "h2")]);
            r.check(
                quic == 1.0 && h2 == 0.0,
                "agent metrics",
                &format!("seedgate_tunnel_transport_info{{transport=\"quic\"}} {quic}, {{transport=\"h2\"}} {h2}"),
            );
        }
        Err(e) => r.check(false, "agent /metrics", &format!("{e:#}")),
    }

    r.heading(&format!(
        "QUIC proxy-agent (transport: auto) dials sni-router {} (TCP only) -> proxy-server {}",
        via.tunnel, tw.agents
    ));
    let fallback = poll_until(Duration::from_secs(10), Duration::from_millis(20), || async {
        let (code, body) = http_get(auto_admin, "/readyz?verbose").await?;
        let line = body.lines().find(|l| l.contains("tunnel-")).unwrap_or("").trim().to_owned();
        anyhow::ensure!(code == 200, "{code}: {line}");
        let (_, text) = http_get(auto_admin, "/metrics").await?;
        let fell = metric_sum(&text, "seedgate_tunnel_transport_changes_total", &[("from", "quic"), ("to", "h2")]);
        Ok((line, fell))
    })
    .await;
    match fallback {
        Ok((line, fell)) => {
            // The line ends with the configured transport (auto); each session names its own.
            r.check(
                line.contains(" over h2]") && !line.contains(" over quic"),
                "agent /readyz?verbose",
                &format!("{line}  ({:?} after start)", started.elapsed()),
            );
            r.check(
                fell >= 1.0,
                "agent metrics",
                &format!("seedgate_tunnel_transport_changes_total{{from=\"quic\",to=\"h2\"}} {fell}"),
            );
        }
        Err(e) => r.check(false, "agent /readyz?verbose", &format!("{e:#}")),
    }
    Ok(())
}

/// The cluster of the identity section's token agents.
const TOKEN_CLUSTER: &str = "shoot-t";

/// Identity and port forwards: a proxy-server whose cluster `shoot-t` takes agents with a
/// ServiceAccount token (reviewed by a stand-in kube-apiserver, in this process) and holds at
/// most one agent session; a token agent (no client certificate) dials it, a port forward
/// (`protocol: tcp`) carries a TLS request to the kubelet through that agent, and a second agent
/// of the cluster is refused at the cap, saying why.
async fn identity(
    r: &mut Report,
    dir: &TempDir,
    bins: &[std::path::PathBuf],
    ca: &Ca,
    tw: &TunnelWorld,
    procs: &mut Vec<Proc>,
) -> anyhow::Result<()> {
    let kas = testbed::token_review::TokenReviewer::start(ca, dir.path(), "shoot-t-kas").await?;
    let (crt, key) = ca.server(&[PROXY_NAME])?.write(dir.path(), "proxy-server-token")?;
    let ca_path = ca.write(dir.path(), "ca")?;
    let kubelet = tw.kubelet.addr();
    let yaml = format!(
        "admin: {{ listen: 127.0.0.1:0 }}\nagents:\n  listen: 127.0.0.1:0\n  tls: {{ cert: {}, key: {} }}\n  auth: token\n  \
         keepalive: {{ interval: 1s, timeout: 3s }}\nfrontends:\n  - name: kubelet-forward\n    listen: 127.0.0.1:0\n    \
         protocol: tcp\n    cluster: {TOKEN_CLUSTER}\n    target: \"{kubelet}\"\nclusters:\n  {TOKEN_CLUSTER}:\n    \
         limits: {{ max_sessions: 1 }}\n    token_review: {}\n",
        crt.display(),
        key.display(),
        kas.section("")
    );
    let (server, s) = Proc::start_seedgate(&bins[2], &dir.write("proxy-server-token.yaml", &yaml)?, &[]).await?;
    let (agents, forward, s_admin) = (s.listener("agents")?, s.listener("kubelet-forward")?, s.admin()?);
    procs.push(server);
    let token = kas.issue("kube-system/proxy-agent", &["seedgate"], Duration::from_secs(3600));
    let token_file = dir.write("shoot-t-token", &token)?;
    let agent_yaml = |node: &str| {
        format!(
            "admin: {{ listen: 127.0.0.1:0 }}\ntunnel:\n  servers: [{agents}]\n  tls: {{ ca: {}, server_name: {PROXY_NAME} }}\n  \
             token_file: {}\n  cluster: {TOKEN_CLUSTER}\n  node_name: {node}\n  allow: [127.0.0.0/8]\n  \
             reconnect: {{ initial: 200ms, max: 2s }}\n",
            ca_path.display(),
            token_file.display()
        )
    };
    let (agent, _) =
        Proc::start_seedgate(&bins[1], &dir.write("proxy-agent-token.yaml", agent_yaml("node-1"))?, &[]).await?;
    procs.push(agent);

    r.heading(&format!(
        "IDENTITY proxy-agent with a ServiceAccount token (no client certificate) -> proxy-server {agents}; TokenReview at the stand-in {TOKEN_CLUSTER} kube-apiserver {}",
        kas.url()
    ));
    let up = poll_until(Duration::from_secs(10), Duration::from_millis(50), || async {
        let (_, text) = http_get(s_admin, "/metrics").await?;
        let n = metric_sum(&text, "seedgate_agents_connected", &[("cluster", TOKEN_CLUSTER)]);
        anyhow::ensure!(n == 1.0, "{n} agents");
        Ok(text)
    })
    .await;
    match up {
        Ok(text) => {
            let reviewed = metric_sum(
                &text,
                "seedgate_token_reviews_total",
                &[("cluster", TOKEN_CLUSTER), ("result", "authenticated")],
            );
            r.check(
                reviewed >= 1.0 && kas.answers().first().map(String::as_str) == Some("authenticated"),
                "session admitted by a TokenReview",
                &format!(
                    "seedgate_agents_connected{{cluster=\"{TOKEN_CLUSTER}\"}} 1, seedgate_token_reviews_total{{result=\"authenticated\"}} {reviewed}, the kube-apiserver answered {:?}",
                    kas.answers()
                ),
            );
        }
        Err(e) => r.check(false, "session admitted by a TokenReview", &format!("{e:#}")),
    }

    r.heading(&format!("PORT FORWARD 127.0.0.1 -> proxy-server {forward} (protocol: tcp, target {kubelet}) -> the token agent -> kubelet"));
    let forwarded = async { kubelet_healthz(tokio::net::TcpStream::connect(forward).await?, ca).await };
    match tokio::time::timeout(Duration::from_secs(10), forwarded).await {
        Ok(Ok(body)) => {
            r.check(
                body.contains("backend=kubelet "),
                "TLS to the kubelet through the port forward, answered by",
                &body,
            );
            // Counted as a CONNECT is, by its front end and kind.
            let counted = http_get(s_admin, "/metrics").await.map(|(_, text)| {
                let labels = [("frontend", "kubelet-forward"), ("kind", "tcp"), ("code", "200")];
                metric_sum(&text, "seedgate_frontend_requests_total", &labels)
            });
            match counted {
                Ok(n) => r.check(
                    n == 1.0,
                    "proxy-server metrics",
                    &format!(
                        "seedgate_frontend_requests_total{{frontend=\"kubelet-forward\",kind=\"tcp\",code=\"200\"}} {n}"
                    ),
                ),
                Err(e) => r.check(false, "proxy-server metrics", &format!("{e:#}")),
            }
        }
        Ok(Err(e)) => r.check(false, "port forward", &format!("{e:#}")),
        Err(_) => r.check(false, "port forward", "no answer within 10s"),
    }

    r.heading(&format!(
        "LIMITS a second token agent of {TOKEN_CLUSTER} (clusters.{TOKEN_CLUSTER}.limits.max_sessions: 1)"
    ));
    let (second, _) =
        Proc::start_seedgate(&bins[1], &dir.write("proxy-agent-token-2.yaml", agent_yaml("node-2"))?, &[]).await?;
    let refused = second
        .wait_log_line(&["proxy-server refused this agent's session", "holds its limit"], Duration::from_secs(10))
        .await;
    procs.push(second);
    match refused {
        Ok(line) => {
            let reason = line.split("reason=").nth(1).unwrap_or(&line).trim().to_owned();
            r.check(true, "refused, and told why", &reason);
        }
        Err(e) => r.check(false, "refused, and told why", &format!("{e:#}")),
    }
    match http_get(s_admin, "/metrics").await {
        Err(e) => r.check(false, "proxy-server metrics", &format!("{e:#}")),
        Ok((_, text)) => {
            let capped = metric_sum(
                &text,
                "seedgate_agent_sessions_total",
                &[("cluster", TOKEN_CLUSTER), ("result", "cluster_session_limit")],
            );
            let cached =
                metric_sum(&text, "seedgate_token_reviews_total", &[("cluster", TOKEN_CLUSTER), ("result", "cached")]);
            let connected = metric_sum(&text, "seedgate_agents_connected", &[("cluster", TOKEN_CLUSTER)]);
            let shown = format!(
                "seedgate_agent_sessions_total{{result=\"cluster_session_limit\"}} {capped}, seedgate_agents_connected \
                 {connected}, seedgate_token_reviews_total{{result=\"cached\"}} {cached} (the same token again)"
            );
            r.check(capped >= 1.0 && connected == 1.0, "proxy-server metrics", &shown);
        }
    }
    Ok(())
}

/// The counters the demo's traffic must have moved: (what, met?).
fn counter_checks(t: &str) -> [(&'static str, bool); 4] {
    let sum = |name, labels: &[(&str, &str)]| metric_sum(t, name, labels);
    [
        (
            "connections counted per route",
            sum("seedgate_connections_total", &[("route", "shoot-a-api"), ("result", "ok")]) >= 1.0
                && sum("seedgate_connections_total", &[("route", "shoot-b"), ("result", "ok")]) >= 1.0,
        ),
        ("unknown name counted as a reject", sum("seedgate_rejects_total", &[]) >= 1.0),
        (
            "bytes counted both ways",
            sum("seedgate_proxied_bytes_total", &[("direction", "to_upstream")]) > 0.0
                && sum("seedgate_proxied_bytes_total", &[("direction", "to_client")]) > 0.0,
        ),
        // Only routed handshakes are guaranteed an observation; rejects may not be.
        ("handshakes timed", sum("seedgate_handshake_duration_seconds_count", &[]) >= 2.0),
    ]
}

/// Print the `seedgate_` series the demo exercised, and check they moved. Counters are updated
/// when a connection closes, which may trail the client by a moment: poll, don't sleep.
async fn metrics(r: &mut Report, admin: std::net::SocketAddr) {
    let polled = poll_until(Duration::from_secs(5), Duration::from_millis(50), || async {
        let (status, text) = http_get(admin, "/metrics").await?;
        anyhow::ensure!(status == 200, "/metrics answered {status}");
        anyhow::ensure!(counter_checks(&text).iter().all(|(_, ok)| *ok), "counters have not moved yet");
        Ok(text)
    })
    .await;
    // On timeout, judge the last page anyway so the report names what is missing.
    let text = match polled {
        Ok(t) => t,
        Err(e) => match http_get(admin, "/metrics").await {
            Ok((_, t)) => t,
            Err(_) => return r.check(false, "GET /metrics", &format!("{e:#}")),
        },
    };
    print_series(&text);
    for (what, ok) in counter_checks(&text) {
        r.check(ok, what, if ok { "yes" } else { "no" });
    }
}

fn print_series(text: &str) {
    const SHOWN: &[&str] = &[
        "seedgate_connections_total",
        "seedgate_rejects_total",
        "seedgate_proxied_bytes_total",
        "seedgate_handshake_duration_seconds_count",
    ];
    for l in text.lines().filter(|l| SHOWN.iter().any(|s| l.starts_with(s))) {
        println!("       {l}");
    }
}

/// The first agent's address in a `/readyz?verbose` cluster line (`[i]cluster-NAME info: active: 1
/// agents [ip:port (node), ...]`; the node appears once the agent's hello arrived).
fn session_peer(line: &str) -> Option<std::net::SocketAddr> {
    let list = line.rsplit_once(" agents [")?.1;
    list.split([' ', ',', ']']).next()?.parse().ok()
}

/// Which of `pids` holds the IPv4 TCP socket `local` -> `remote`: its inode from
/// /proc/net/tcp, then the process whose file descriptors include that socket.
fn tcp_socket_owner(
    local: std::net::SocketAddr,
    remote: std::net::SocketAddr,
    pids: &[(u32, &'static str)],
) -> anyhow::Result<Option<&'static str>> {
    socket_owner("/proc/net/tcp", local, Some(remote), pids)
}

/// Which of `pids` holds the IPv4 socket bound to `local` (and connected to `remote`, when
/// given) in `table` (/proc/net/tcp or /proc/net/udp).
fn socket_owner(
    table: &str,
    local: std::net::SocketAddr,
    remote: Option<std::net::SocketAddr>,
    pids: &[(u32, &'static str)],
) -> anyhow::Result<Option<&'static str>> {
    use anyhow::Context as _;
    // "0100007F:1F90": the address as the kernel's u32 in host byte order, the port in hex.
    let parse = |s: &str| -> Option<std::net::SocketAddr> {
        let (ip, port) = s.split_once(':')?;
        let ip = u32::from_str_radix(ip, 16).ok()?;
        let port = u16::from_str_radix(port, 16).ok()?;
        Some(std::net::SocketAddr::from((ip.to_ne_bytes(), port)))
    };
    // A socket bound to the unspecified address holds `local` too.
    let holds = |a: Option<std::net::SocketAddr>| {
        a.is_some_and(|a| a.port() == local.port() && (a.ip() == local.ip() || a.ip().is_unspecified()))
    };
    let text = std::fs::read_to_string(table).with_context(|| format!("reading {table}"))?;
    let inode = text
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.len() > 9 && holds(parse(f[1])) && remote.is_none_or(|r| parse(f[2]) == Some(r)))
        .map(|f| f[9].to_owned())
        .with_context(|| format!("no socket {local} -> {remote:?} in {table}"))?;
    let want = format!("socket:[{inode}]");
    for (pid, name) in pids {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { continue };
        if fds.flatten().any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == want.as_str())) {
            return Ok(Some(name));
        }
    }
    Ok(None)
}

/// The demo's gRPC dial: with gRPC core (Python grpcio, as `.ci/run` installs it) when it is
/// there, once with its own `:authority` for a Unix socket (the path, percent-encoded) and once
/// with the raw path (grpc-go as kube-apiserver dials, grpc-java); else with the tests' tonic
/// client, whose valid authority shows nothing of what real clients send, which the report says.
async fn grpc_dial(r: &mut Report, sock: &std::path::Path, target: std::net::SocketAddr) {
    use testbed::grpc_core::{GrpcCore, Target};
    if testbed::grpc_core::python().is_none() {
        r.note(&format!(
            "client: tonic (gRPC core, Python grpcio, is not in {}: .ci/run installs it); tonic sends a valid \
             :authority, unlike kube-apiserver's gRPC stack",
            testbed::grpc_core::VENV
        ));
        let dialled = async {
            let client = Client::connect(Dialer::Unix(sock.to_path_buf())).await?;
            let mut conn = match client.dial(&target.to_string()).await? {
                Ok(conn) => conn,
                Err(e) => anyhow::bail!("DIAL_RSP error: {e}"),
            };
            conn.send(format!("GET /metrics HTTP/1.1\r\nHost: {target}\r\nConnection: close\r\n\r\n")).await?;
            let got = conn.read_to_close().await?;
            let text = String::from_utf8_lossy(&got.data);
            anyhow::Ok((text.lines().next().unwrap_or("").to_owned(), got.data.len(), got.closed))
        };
        grpc_checks(r, "tonic", tokio::time::timeout(Duration::from_secs(10), dialled).await);
        return;
    }
    let path = sock.display().to_string();
    for (what, authority) in [
        ("its own :authority for a unix: target (the path, percent-encoded)", None),
        ("the raw path as :authority (grpc-go as kube-apiserver dials; grpc-java)", Some(path.as_str())),
    ] {
        let dialled = async {
            let mut c = GrpcCore::start(&Target::Unix(sock.to_path_buf()), authority)
                .await?
                .ok_or_else(|| anyhow::anyhow!("grpcio is missing"))?;
            let got = c.run(&format!("http_get {target} /metrics")).await?;
            let status = got["status"].as_str().unwrap_or_default().to_owned();
            let len = got["bytes"].as_u64().unwrap_or(0) as usize;
            anyhow::Ok((c.version.clone(), (status, len, got["closed"] == true)))
        };
        match tokio::time::timeout(Duration::from_secs(30), dialled).await {
            Ok(Ok((version, got))) => grpc_checks(r, &format!("gRPC core (grpcio {version}), {what}"), Ok(Ok(got))),
            Ok(Err(e)) => grpc_checks(r, &format!("gRPC core, {what}"), Ok(Err(e))),
            Err(e) => grpc_checks(r, &format!("gRPC core, {what}"), Err(e)),
        }
    }
}

/// The report's lines for one gRPC dial: (status line, bytes, whether CLOSE_RSP came).
fn grpc_checks(
    r: &mut Report,
    client: &str,
    got: Result<anyhow::Result<(String, usize, bool)>, tokio::time::error::Elapsed>,
) {
    match got {
        Ok(Ok((status, len, closed))) => {
            r.check(
                status.contains(" 200 "),
                &format!("client: {client}: DIAL_RSP, then the response in DATA packets"),
                &status,
            );
            r.check(closed, "the shoot side closed: CLOSE_RSP", &format!("{len} bytes before it"));
        }
        Ok(Err(e)) => r.check(false, &format!("client: {client}: gRPC dial"), &format!("{e:#}")),
        Err(_) => r.check(false, &format!("client: {client}: gRPC dial"), "no answer in time"),
    }
}
