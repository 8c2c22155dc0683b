//! Path P2 end to end: a TLS client on the "node side" connects to the real proxy-agent's
//! apiserver proxy, which feeds the real sni-router in both modes (PROXY v2 → `destination`
//! route; HTTP CONNECT → `connect` route); the router's PROXY out checked by nginx; and stacked
//! PROXY headers with haproxy as the cloud load balancer between the agent and the router.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;
use testbed::peers::{connect_from, free_port, read_to_close, start_haproxy, start_nginx, tls_over};
use testbed::pki::client_config;
use testbed::tls_client::{http_get_request, peer_info};
use testbed::{Addresses, Ca, InProc, TempDir, TlsHttpBackend, http_get, metric_value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const WAIT: Duration = Duration::from_secs(15);
const IN_CLUSTER: &str = "kubernetes.default.svc";
const CN_A: &str = "kube-apiserver.shoot--a.svc.cluster.local";
const CN_B: &str = "kube-apiserver.shoot--b.svc.cluster.local";
const API_DEST: &str = "outbound|443||kube-apiserver.shoot--a.svc.cluster.local";
/// The pod the in-cluster client runs in.
const POD: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 9));

struct World {
    dir: TempDir,
    ca: Ca,
    a: TlsHttpBackend,
    b: TlsHttpBackend,
}

async fn world() -> anyhow::Result<World> {
    let dir = TempDir::new("p2-agent")?;
    let ca = Ca::new("p2-agent-ca")?;
    let a = TlsHttpBackend::start("shoot-a", &ca.server(&[CN_A, IN_CLUSTER])?, None).await?;
    let b = TlsHttpBackend::start("shoot-b", &ca.server(&[CN_B, IN_CLUSTER])?, None).await?;
    Ok(World { dir, ca, a, b })
}

async fn start_router(dir: &TempDir, listeners: &str) -> anyhow::Result<(InProc, Addresses)> {
    let yaml = format!(
        "admin: {{ listen: 127.0.0.1:0 }}\ntimeouts: {{ handshake: 2s, connect: 2s, idle: 1h }}\ndrain_grace: 1s\nlisteners:\n{listeners}"
    );
    InProc::serve(dir, "sni-router", &yaml).await
}

/// A proxy-agent running only the apiserver proxy on `listen` (port 0), towards `gateway`.
async fn start_agent(
    dir: &TempDir,
    listen: &[&str],
    gateway: SocketAddr,
    mode: &str,
) -> anyhow::Result<(InProc, Addresses)> {
    let yaml = format!(
        "admin: {{ listen: 127.0.0.1:0 }}\ntimeouts: {{ handshake: 2s, connect: 2s, idle: 1h }}\ndrain_grace: 1s\n\
         apiserver_proxy:\n  listen: [{}]\n  gateway: {gateway}\n  {mode}\n",
        listen.join(", ")
    );
    InProc::serve(dir, "proxy-agent", &yaml).await
}

async fn metrics(addrs: &Addresses) -> anyhow::Result<String> {
    let (code, body) = http_get(addrs.admin()?, "/metrics").await?;
    anyhow::ensure!(code == 200, "/metrics answered {code}");
    Ok(body)
}

/// What a pod sees when it talks TLS to `addr` (the agent) from [`POD`]: its own address, the
/// certificate CN and the response.
async fn pod_request(w: &World, addr: SocketAddr, path: &str) -> anyhow::Result<(SocketAddr, Option<String>, String)> {
    let tcp = connect_from(POD, addr).await?;
    let me = tcp.local_addr()?;
    let mut tls = tls_over(tcp, IN_CLUSTER, client_config(&w.ca, None, &["http/1.1"])?).await?;
    let cn = peer_info(&tls).0;
    tls.write_all(&http_get_request(IN_CLUSTER, path)).await?;
    let mut out = Vec::new();
    let r = tokio::time::timeout(WAIT, tls.read_to_end(&mut out)).await?;
    if let Err(e) = r {
        anyhow::ensure!(!out.is_empty(), "reading the response: {e}");
    }
    Ok((me, cn, String::from_utf8_lossy(&out).into_owned()))
}

async fn access_line(p: &InProc, needles: &[&str]) -> anyhow::Result<String> {
    let mut all = vec!["access", "connection closed"];
    all.extend_from_slice(needles);
    p.wait_log_line(&all, WAIT).await
}

#[tokio::test]
async fn agent_proxy_protocol_v2_into_router_destination_routes() -> anyhow::Result<()> {
    let w = world().await?;
    let listeners = format!(
        "  - name: apiserver-proxy\n    listen: 127.0.0.1:0\n    proxy_protocol: required\n    trusted_proxies: [127.0.0.0/8]\n    routes:\n\
         \x20     - name: shoot-a\n        destination: [127.0.0.3/32]\n        upstreams: [{}]\n        send_proxy_protocol: v2\n\
         \x20     - name: shoot-b\n        destination: [127.0.0.4/32]\n        upstreams: [{}]\n",
        w.a.addr(),
        w.b.addr()
    );
    let (router, raddrs) = start_router(&w.dir, &listeners).await?;
    let gw = raddrs.listener("apiserver-proxy")?;
    let (agent, aaddrs) = start_agent(&w.dir, &["127.0.0.3:0", "127.0.0.4:0"], gw, "mode: proxy-protocol-v2").await?;
    let (to_a, to_b) = (aaddrs.listener("apiserver-proxy")?, aaddrs.listener("apiserver-proxy-1")?);

    let (me, cn, resp) = pod_request(&w, to_a, "/a").await?;
    assert_eq!(cn.as_deref(), Some(CN_A), "{resp}");
    // The router's own PROXY header to A carries the pod, as the agent reported it.
    assert!(resp.contains("backend=shoot-a ") && resp.contains(&format!("proxy={me}\n")), "{resp}");
    access_line(&router, &[&format!("client={me} "), &format!("proxy_destination=\"{to_a}\""), "route=\"shoot-a\""])
        .await?;
    access_line(&agent, &[&format!("client={me} "), &format!("local={to_a} ")]).await?;

    let (me, cn, resp) = pod_request(&w, to_b, "/b").await?;
    assert_eq!(cn.as_deref(), Some(CN_B), "{resp}");
    assert!(resp.contains("backend=shoot-b ") && resp.contains("proxy=-"), "{resp}");
    access_line(&router, &[&format!("client={me} "), &format!("proxy_destination=\"{to_b}\""), "route=\"shoot-b\""])
        .await?;

    let m = metrics(&raddrs).await?;
    assert_eq!(metric_value(&m, "seedgate_connections_total", &[("route", "shoot-a"), ("result", "ok")]), Some(1.0));
    assert_eq!(metric_value(&m, "seedgate_connections_total", &[("route", "shoot-b"), ("result", "ok")]), Some(1.0));
    let m = metrics(&aaddrs).await?;
    assert_eq!(
        metric_value(&m, "seedgate_connections_total", &[("listener", "apiserver-proxy"), ("result", "ok")]),
        Some(1.0)
    );
    Ok(())
}

#[tokio::test]
async fn agent_http_connect_into_router_connect_route() -> anyhow::Result<()> {
    let w = world().await?;
    let listeners = format!(
        "  - name: apiserver-proxy\n    listen: 127.0.0.1:0\n    routes:\n\
         \x20     - name: shoot-a-connect\n        connect: {{ header: X-Gardener-Destination, values: [\"{API_DEST}\"] }}\n        upstreams: [{}]\n",
        w.a.addr()
    );
    let (router, raddrs) = start_router(&w.dir, &listeners).await?;
    let gw = raddrs.listener("apiserver-proxy")?;
    let mode = format!("mode: http-connect\n  destination: \"{API_DEST}\"");
    let (agent, aaddrs) = start_agent(&w.dir, &["127.0.0.3:0"], gw, &mode).await?;
    let to_a = aaddrs.listener("apiserver-proxy")?;

    let (me, cn, resp) = pod_request(&w, to_a, "/connect").await?;
    assert_eq!(cn.as_deref(), Some(CN_A), "{resp}");
    assert!(resp.contains("backend=shoot-a ") && resp.contains("path=/connect"), "{resp}");
    // The CONNECT target defaults to the address the pod connected to.
    access_line(&router, &[&format!("connect=\"{to_a}\""), "route=\"shoot-a-connect\"", "protocol=\"connect\""])
        .await?;
    access_line(&agent, &[&format!("client={me} "), "mode=", "http-connect"]).await?;

    // An agent whose destination the router does not list: the router answers 403, the agent
    // closes the pod's connection and counts the gateway's status.
    let mode = "mode: http-connect\n  destination: \"outbound|443||kube-apiserver.shoot--zzz.svc.cluster.local\"";
    let (_stranger, saddrs) = start_agent(&w.dir, &["127.0.0.4:0"], gw, mode).await?;
    let r = pod_request(&w, saddrs.listener("apiserver-proxy")?, "/nope").await;
    assert!(r.is_err(), "an unlisted destination must not get through: {r:?}");
    let m = metrics(&saddrs).await?;
    assert_eq!(metric_value(&m, "seedgate_rejects_total", &[("reason", "gateway_status_403")]), Some(1.0), "{m}");
    let m = metrics(&raddrs).await?;
    assert_eq!(metric_value(&m, "seedgate_rejects_total", &[("reason", "connect_no_route")]), Some(1.0), "{m}");
    assert_eq!(w.a.connections(), 1);
    Ok(())
}

/// nginx (stream, `listen ... proxy_protocol`) checks the PROXY header the router sends on
/// after the agent's: it answers with the client and destination it parsed.
#[tokio::test]
async fn router_proxy_out_after_the_agent_is_what_nginx_reads() -> anyhow::Result<()> {
    let w = world().await?;
    let port = free_port(&[Ipv4Addr::LOCALHOST])?;
    let nginx_addr = SocketAddr::from(([127, 0, 0, 1], port));
    let block = format!(
        "  server {{\n    listen {nginx_addr} proxy_protocol;\n    proxy_protocol_timeout 5s;\n    \
         return \"$proxy_protocol_addr:$proxy_protocol_port $proxy_protocol_server_addr:$proxy_protocol_server_port\\n\";\n  }}"
    );
    let Some(_nginx) = start_nginx(&block, &[nginx_addr]).await? else { return Ok(()) };
    let listeners = format!(
        "  - name: apiserver-proxy\n    listen: 127.0.0.1:0\n    proxy_protocol: required\n    trusted_proxies: [127.0.0.0/8]\n    routes:\n\
         \x20     - name: nginx-v2\n        destination: [127.0.0.3/32]\n        upstreams: [{nginx_addr}]\n        send_proxy_protocol: v2\n\
         \x20     - name: nginx-v1\n        destination: [127.0.0.4/32]\n        upstreams: [{nginx_addr}]\n        send_proxy_protocol: v1\n"
    );
    let (router, raddrs) = start_router(&w.dir, &listeners).await?;
    let gw = raddrs.listener("apiserver-proxy")?;
    let (_agent, aaddrs) = start_agent(&w.dir, &["127.0.0.3:0", "127.0.0.4:0"], gw, "mode: proxy-protocol-v2").await?;

    for listener in ["apiserver-proxy", "apiserver-proxy-1"] {
        let node = aaddrs.listener(listener)?;
        let mut s = connect_from(POD, node).await?;
        let me = s.local_addr()?;
        let got = read_to_close(&mut s).await?;
        assert_eq!(String::from_utf8_lossy(&got), format!("{me} {node}\n"), "via {listener}\n{}", router.log());
    }
    let m = metrics(&raddrs).await?;
    for route in ["nginx-v1", "nginx-v2"] {
        assert_eq!(
            metric_value(&m, "seedgate_connections_total", &[("route", route), ("result", "ok")]),
            Some(1.0),
            "{m}"
        );
    }
    Ok(())
}

/// pod → agent (PROXY v2) → haproxy (the cloud load balancer, adds its own v2 header and
/// connects from 127.0.0.7) → router. The outer header names the client for logs and ACLs
/// (here the agent's node address, 127.0.0.1); the inner header's destination routes.
#[tokio::test]
async fn stacked_headers_outer_source_inner_destination() -> anyhow::Result<()> {
    let w = world().await?;
    let listeners = format!(
        "  - name: apiserver-proxy\n    listen: 127.0.0.1:0\n    proxy_protocol: required\n    trusted_proxies: [127.0.0.0/8]\n    routes:\n\
         \x20     - name: outer-allowed\n        destination: [127.0.0.3/32]\n        upstreams: [{}]\n        allowed_sources: [127.0.0.1/32]\n\
         \x20     - name: outer-not-allowed\n        destination: [127.0.0.4/32]\n        upstreams: [{}]\n        allowed_sources: [127.0.0.7/32, 127.0.0.9/32]\n",
        w.a.addr(),
        w.b.addr()
    );
    let (router, raddrs) = start_router(&w.dir, &listeners).await?;
    let gw = raddrs.listener("apiserver-proxy")?;

    let lb_ip = Ipv4Addr::new(127, 0, 0, 6);
    let lb = SocketAddr::from((lb_ip, free_port(&[lb_ip])?));
    let hcfg = format!(
        "global\n    maxconn 100\ndefaults\n    mode tcp\n    timeout connect 5s\n    timeout client 30s\n    timeout server 30s\n\
         frontend seed_lb\n    bind {lb}\n    default_backend router\n\
         backend router\n    server r {gw} source 127.0.0.7 send-proxy-v2\n"
    );
    let Some(_haproxy) = start_haproxy(&hcfg, &[lb]).await? else { return Ok(()) };
    let (_agent, aaddrs) = start_agent(&w.dir, &["127.0.0.3:0", "127.0.0.4:0"], lb, "mode: proxy-protocol-v2").await?;
    let (to_a, to_b) = (aaddrs.listener("apiserver-proxy")?, aaddrs.listener("apiserver-proxy-1")?);

    let (me, cn, resp) = pod_request(&w, to_a, "/stacked").await?;
    assert_eq!(cn.as_deref(), Some(CN_A), "{resp}");
    assert!(resp.contains("backend=shoot-a "), "{resp}");
    let line = access_line(&router, &["route=\"outer-allowed\"", &format!("proxy_destination=\"{to_a}\"")]).await?;
    assert!(line.contains("client=127.0.0.1:"), "the outer source is the client: {line}");
    assert!(line.contains("peer=127.0.0.7:"), "the TCP peer is haproxy: {line}");
    assert!(!line.contains(&me.to_string()), "the inner source is not the client: {line}");

    // The inner source (the pod) and the TCP peer (haproxy) are allowed, the outer source is not.
    let r = pod_request(&w, to_b, "/acl").await;
    assert!(r.is_err(), "allowed_sources must be checked against the outer source: {r:?}");
    let line = access_line(&router, &["reason=\"source_not_allowed\""]).await?;
    assert!(line.contains("client=127.0.0.1:") && line.contains(&format!("proxy_destination=\"{to_b}\"")), "{line}");
    assert_eq!(w.b.connections(), 0);
    let m = metrics(&raddrs).await?;
    assert_eq!(metric_value(&m, "seedgate_rejects_total", &[("reason", "source_not_allowed")]), Some(1.0), "{m}");
    Ok(())
}
