//! The node-local apiserver proxy against fake gateways: PROXY v2, CONNECT, bad peers, reload, drain.

use crate::common;

use anyhow::{Context as _, ensure};
use common::*;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const DEST: &str = "outbound|443||kube-apiserver.shoot--a.svc.cluster.local";

async fn gateway() -> anyhow::Result<(TcpListener, String)> {
    let l = TcpListener::bind("127.0.0.1:0").await?;
    let a = l.local_addr()?.to_string();
    Ok((l, a))
}

#[tokio::test]
async fn proxy_v2_names_the_client_and_the_advertised_address() -> anyhow::Result<()> {
    let (gw, gw_addr) = gateway().await?;
    let agent = Agent::start(&config(&gw_addr, "proxy-protocol-v2", "")).await?;
    assert_eq!(agent.listener().ip().to_string(), "127.0.0.3");

    let mut client = agent.connect().await?;
    let (conn, _) = within("gateway accept", gw.accept()).await??;
    let gw_task = tokio::spawn(echo_after_proxy_header(conn));
    client.write_all(b"\x16\x03\x01 not really TLS, passed through untouched").await?;
    let back = within("echo", read_n(&mut client, 44)).await??;
    assert_eq!(back, b"\x16\x03\x01 not really TLS, passed through untouched");
    client.shutdown().await?;
    let (rest, reset) = within("close", read_until_closed(&mut client)).await?;
    assert!(rest.is_empty() && !reset);

    let h = gw_task.await??;
    assert_eq!(h.version, 2);
    assert_eq!(h.command, proxy_wire::proxy_protocol::Command::Proxy);
    assert_eq!(h.transport, proxy_wire::proxy_protocol::Transport::Tcp4);
    assert_eq!(h.source, Some(client.local_addr()?), "source = the client as the agent saw it");
    assert_eq!(h.destination, Some(agent.listener()), "destination = the address the client connected to");

    let ok = [("listener", "apiserver-proxy"), ("route", "gateway"), ("result", "ok")];
    agent.wait_metric("seedgate_connections_total", &ok, 1.0).await?;
    agent.wait_metric("seedgate_connection_closes_total", &[("reason", "closed")], 1.0).await?;
    agent.wait_metric("seedgate_connections_active", &[("listener", "apiserver-proxy")], 0.0).await?;
    let m = agent.metrics().await?;
    assert_eq!(metric(&m, "seedgate_proxied_bytes_total", &[("direction", "to_upstream")]), 44.0);
    assert_eq!(metric(&m, "seedgate_proxied_bytes_total", &[("direction", "to_client")]), 44.0);
    assert_eq!(metric(&m, "seedgate_upstream_connect_duration_seconds_count", &[("route", "gateway")]), 1.0);
    assert_eq!(metric(&m, "seedgate_handshake_duration_seconds_count", &[("protocol", "proxy-protocol-v2")]), 1.0);
    agent.stop().await
}

#[tokio::test]
async fn half_close_works_both_ways() -> anyhow::Result<()> {
    let (gw, gw_addr) = gateway().await?;
    let agent = Agent::start(&config(&gw_addr, "proxy-protocol-v2", "")).await?;

    // Client finishes first; the gateway still answers after the client's FIN.
    let mut client = agent.connect().await?;
    let (mut conn, _) = within("accept", gw.accept()).await??;
    client.write_all(b"request").await?;
    client.shutdown().await?;
    let (_, rest) = read_proxy_header(&mut conn).await?;
    let (more, reset) = within("client FIN", read_until_closed(&mut conn)).await?;
    assert_eq!([rest, more].concat(), b"request");
    assert!(!reset);
    conn.write_all(b"response after your FIN").await?;
    conn.shutdown().await?;
    let (got, reset) = within("gateway FIN", read_until_closed(&mut client)).await?;
    assert_eq!(got, b"response after your FIN");
    assert!(!reset);

    // Gateway finishes first; the client still sends after the gateway's FIN.
    let mut client = agent.connect().await?;
    let (mut conn, _) = within("accept", gw.accept()).await??;
    let (_, rest) = read_proxy_header(&mut conn).await?;
    assert!(rest.is_empty());
    conn.write_all(b"server done").await?;
    conn.shutdown().await?;
    let (got, _) = within("gateway FIN", read_until_closed(&mut client)).await?;
    assert_eq!(got, b"server done");
    client.write_all(b"client still talking").await?;
    client.shutdown().await?;
    let (got, _) = within("client FIN", read_until_closed(&mut conn)).await?;
    assert_eq!(got, b"client still talking");

    agent.wait_metric("seedgate_connection_closes_total", &[("reason", "closed")], 2.0).await?;
    agent.stop().await
}

fn fnv1a(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf29ce484222325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100000001b3))
}

#[tokio::test]
async fn large_transfer_arrives_intact() -> anyhow::Result<()> {
    let (gw, gw_addr) = gateway().await?;
    let agent = Agent::start(&config(&gw_addr, "proxy-protocol-v2", "")).await?;
    let client = agent.connect().await?;
    let (conn, _) = within("accept", gw.accept()).await??;
    tokio::spawn(echo_after_proxy_header(conn));

    const LEN: usize = 24 << 20;
    let payload: Vec<u8> = (0..LEN as u64).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    let sum = fnv1a(&payload);
    let (mut r, mut w) = client.into_split();
    let writer = tokio::spawn(async move {
        w.write_all(&payload).await?;
        w.shutdown().await?;
        anyhow::Ok(())
    });
    let mut back = Vec::with_capacity(LEN);
    within("echo of 24 MiB", r.read_to_end(&mut back)).await??;
    writer.await??;
    assert_eq!(back.len(), LEN);
    assert_eq!(fnv1a(&back), sum, "checksum of the echoed bytes");
    agent.wait_metric("seedgate_proxied_bytes_total", &[("direction", "to_client")], LEN as f64).await?;
    agent.stop().await
}

#[tokio::test]
async fn http_connect_sends_the_exact_head_and_keeps_early_client_bytes() -> anyhow::Result<()> {
    let (gw, gw_addr) = gateway().await?;
    let agent = Agent::start(&config(&gw_addr, "http-connect", &format!("  destination: \"{DEST}\"\n"))).await?;
    let mut client = agent.connect().await?;
    // The client speaks first (a TLS ClientHello would): these bytes must wait for the 200.
    client.write_all(b"early-").await?;
    let (mut conn, _) = within("accept", gw.accept()).await??;
    let head = within("CONNECT head", read_http_head(&mut conn)).await??;
    let l = agent.listener();
    assert_eq!(head, format!("CONNECT {l} HTTP/1.1\r\nHost: {l}\r\nX-Gardener-Destination: {DEST}\r\n\r\n"));
    // Nothing of the client's may follow the head before the gateway said 200.
    let mut probe = [0u8; 1];
    let early = tokio::time::timeout(Duration::from_millis(200), conn.read(&mut probe)).await;
    assert!(early.is_err(), "client bytes were sent before the 200: {early:?}");

    conn.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").await?;
    conn.write_all(b"tunnel bytes").await?;
    assert_eq!(within("tunnel bytes", read_n(&mut client, 12)).await??, b"tunnel bytes");
    client.write_all(b"later").await?;
    client.shutdown().await?;
    let (got, _) = within("client bytes", read_until_closed(&mut conn)).await?;
    assert_eq!(got, b"early-later", "early bytes first, in order, none lost");
    drop(conn);

    let ok = [("result", "ok")];
    agent.wait_metric("seedgate_connections_total", &ok, 1.0).await?;
    let m = agent.metrics().await?;
    assert_eq!(metric(&m, "seedgate_handshake_duration_seconds_count", &[("protocol", "http-connect")]), 1.0);
    agent.stop().await
}

#[tokio::test]
async fn http_connect_uses_the_configured_header_and_authority() -> anyhow::Result<()> {
    let (gw, gw_addr) = gateway().await?;
    let extra = "  destination: shoot-a\n  destination_header: X-Route\n  authority: kubernetes.default.svc:443\n";
    let agent = Agent::start(&config(&gw_addr, "http-connect", extra)).await?;
    let mut client = agent.connect().await?;
    let (mut conn, _) = within("accept", gw.accept()).await??;
    let head = within("CONNECT head", read_http_head(&mut conn)).await??;
    assert_eq!(
        head,
        "CONNECT kubernetes.default.svc:443 HTTP/1.1\r\nHost: kubernetes.default.svc:443\r\nX-Route: shoot-a\r\n\r\n"
    );
    // HTTP/1.0 and a longer reason phrase are fine too.
    conn.write_all(b"HTTP/1.0 200 OK\r\nServer: fake\r\n\r\n").await?;
    client.write_all(b"ping").await?;
    assert_eq!(within("ping", read_n(&mut conn, 4)).await??, b"ping");
    drop((client, conn));
    agent.stop().await
}

#[tokio::test]
async fn http_connect_refused_by_the_gateway_closes_the_client() -> anyhow::Result<()> {
    let (gw, gw_addr) = gateway().await?;
    let agent = Agent::start(&config(&gw_addr, "http-connect", &format!("  destination: \"{DEST}\"\n"))).await?;
    let mut client = agent.connect().await?;
    client.write_all(b"hello?").await?;
    let (mut conn, _) = within("accept", gw.accept()).await??;
    read_http_head(&mut conn).await?;
    conn.write_all(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n").await?;
    // The gateway keeps its side open: the agent alone must close the client.
    let (got, _) = within("client closed after 403", read_until_closed(&mut client)).await?;
    assert!(got.is_empty(), "no gateway bytes reach the client after a refusal: {got:?}");
    let labels = [("listener", "apiserver-proxy"), ("reason", "gateway_status_403")];
    agent.wait_metric("seedgate_rejects_total", &labels, 1.0).await?;
    agent.wait_metric("seedgate_connections_total", &[("result", "gateway_status_403")], 1.0).await?;
    agent.wait_metric("seedgate_connections_active", &[], 0.0).await?;
    drop(conn);
    agent.stop().await
}

#[tokio::test]
async fn http_connect_bytes_pipelined_after_the_200_reach_the_client() -> anyhow::Result<()> {
    let (gw, gw_addr) = gateway().await?;
    let agent = Agent::start(&config(&gw_addr, "http-connect", &format!("  destination: \"{DEST}\"\n"))).await?;
    let mut client = agent.connect().await?;
    let (mut conn, _) = within("accept", gw.accept()).await??;
    read_http_head(&mut conn).await?;
    // One write: the head and the first tunnel bytes arrive together.
    conn.write_all(b"HTTP/1.1 200 OK\r\n\r\nserver speaks first").await?;
    assert_eq!(within("pipelined bytes", read_n(&mut client, 19)).await??, b"server speaks first");
    client.write_all(b"reply").await?;
    assert_eq!(within("reply", read_n(&mut conn, 5)).await??, b"reply");
    drop(conn);
    let (rest, _) = within("close", read_until_closed(&mut client)).await?;
    assert!(rest.is_empty());
    drop(client);
    agent.wait_metric("seedgate_proxied_bytes_total", &[("direction", "to_client")], 19.0).await?;
    agent.stop().await
}

#[tokio::test]
async fn a_gateway_that_never_answers_is_cut_at_the_handshake_timeout() -> anyhow::Result<()> {
    let (gw, gw_addr) = gateway().await?;
    let yaml = config(&gw_addr, "http-connect", &format!("  destination: \"{DEST}\"\n"))
        .replace("handshake: 5s", "handshake: 300ms");
    let agent = Agent::start(&yaml).await?;
    let mut client = agent.connect().await?;
    let (mut conn, _) = within("accept", gw.accept()).await??;
    read_http_head(&mut conn).await?;
    // Silence. The agent must give up by itself and close both sides.
    let (got, _) = within("client closed", read_until_closed(&mut client)).await?;
    assert!(got.is_empty());
    let (_, _) = within("gateway side closed", read_until_closed(&mut conn)).await?;
    agent.wait_metric("seedgate_rejects_total", &[("reason", "handshake_timeout")], 1.0).await?;
    agent.stop().await
}

#[tokio::test]
async fn an_unreachable_gateway_closes_the_client_after_the_retries() -> anyhow::Result<()> {
    let port = free_port().await;
    let agent = Agent::start(&config(&format!("127.0.0.1:{port}"), "proxy-protocol-v2", "")).await?;
    let mut client = agent.connect().await?;
    let (got, _) = within("client closed", read_until_closed(&mut client)).await?;
    assert!(got.is_empty());
    agent.wait_metric("seedgate_rejects_total", &[("reason", "gateway_unreachable")], 1.0).await?;
    let refused = [("route", "gateway"), ("reason", "connect_refused")];
    agent.wait_metric("seedgate_upstream_connect_failures_total", &refused, 3.0).await?;
    agent.stop().await
}

#[tokio::test]
async fn a_gateway_name_is_resolved_and_reported_ready() -> anyhow::Result<()> {
    let (gw, gw_addr) = gateway().await?;
    let port = gw_addr.rsplit_once(':').context("port")?.1;
    let agent = Agent::start(&config(&format!("localhost:{port}"), "proxy-protocol-v2", "")).await?;
    let body = poll("ready", || async {
        let (status, body) = agent.get("/readyz?verbose").await.ok()?;
        (status == 200).then_some(body)
    })
    .await?;
    // localhost may also resolve to ::1 (nothing listens there: the retry moves on to 127.0.0.1).
    let line = body.lines().find(|l| l.starts_with("[+]gateway-resolves ok: ")).context("gateway check")?;
    assert!(line.starts_with(&format!("[+]gateway-resolves ok: localhost:{port} -> ")), "{body}");
    assert!(line.contains(&format!("127.0.0.1:{port}")), "{body}");
    assert!(body.contains(&format!("[+]listener-apiserver-proxy ok: bound {}", agent.listener())), "{body}");

    for i in 0..2u8 {
        let mut client = agent.connect().await?;
        let (conn, _) = within("accept", gw.accept()).await??;
        let gw_task = tokio::spawn(echo_after_proxy_header(conn));
        client.write_all(&[i]).await?;
        assert_eq!(within("echo", read_n(&mut client, 1)).await??, [i]);
        client.shutdown().await?;
        gw_task.await??;
    }
    agent.stop().await
}

#[tokio::test]
async fn an_unresolvable_gateway_is_not_ready_and_refuses_clients() -> anyhow::Result<()> {
    let yaml = config("no-such-gateway.invalid:8443", "proxy-protocol-v2", "").replace("connect: 5s", "connect: 2s");
    let agent = Agent::start(&yaml).await?;
    let body = poll("resolution failure reported", || async {
        let (status, body) = agent.get("/readyz?verbose").await.ok()?;
        (status == 503
            && body.contains("[-]gateway-resolves failed: no-such-gateway.invalid:8443:")
            && !body.contains("not resolved yet"))
        .then_some(body)
    })
    .await?;
    assert!(body.contains("readyz check failed"), "{body}");
    let mut client = agent.connect().await?;
    within("client closed", read_until_closed(&mut client)).await?;
    agent.wait_metric("seedgate_upstream_connect_failures_total", &[("reason", "resolve_failed")], 1.0).await?;
    agent.wait_metric("seedgate_rejects_total", &[("reason", "gateway_unreachable")], 1.0).await?;
    agent.stop().await
}

#[tokio::test]
async fn a_client_that_vanishes_mid_stream_is_passed_on() -> anyhow::Result<()> {
    let (gw, gw_addr) = gateway().await?;
    let agent = Agent::start(&config(&gw_addr, "proxy-protocol-v2", "")).await?;

    // A reset from the client reaches the gateway as a reset (or at least an end).
    let client = agent.connect().await?;
    let (mut conn, _) = within("accept", gw.accept()).await??;
    let (_, _) = read_proxy_header(&mut conn).await?;
    let mut client = client;
    client.write_all(b"partial").await?;
    assert_eq!(within("partial", read_n(&mut conn, 7)).await??, b"partial");
    client.set_zero_linger()?;
    drop(client);
    within("gateway sees the end", read_until_closed(&mut conn)).await?;
    agent.wait_metric("seedgate_connection_closes_total", &[("reason", "client_reset")], 1.0).await?;
    agent.wait_metric("seedgate_connections_active", &[("listener", "apiserver-proxy")], 0.0).await?;

    // A client that just disappears (FIN) while the gateway still has data to send.
    let mut client = agent.connect().await?;
    let (mut conn, _) = within("accept", gw.accept()).await??;
    read_proxy_header(&mut conn).await?;
    client.write_all(b"bye").await?;
    drop(client);
    let (got, _) = within("gateway sees the end", read_until_closed(&mut conn)).await?;
    assert_eq!(got, b"bye");
    drop(conn);
    agent.wait_metric("seedgate_connections_active", &[("listener", "apiserver-proxy")], 0.0).await?;
    agent.stop().await
}

/// Writes `text` to `path` atomically, so the watcher never reads half a file.
fn write_config(path: &std::path::Path, text: &str) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// A gateway that answers every connection with `tag` + the echo of its bytes.
fn tagged_echo_gateway(l: TcpListener, tag: &'static str) {
    tokio::spawn(async move {
        for _ in 0..1000 {
            let Ok((mut s, _)) = l.accept().await else { return };
            tokio::spawn(async move {
                let Ok((_, rest)) = read_proxy_header(&mut s).await else { return };
                let (mut r, mut w) = s.split();
                let _ = w.write_all(tag.as_bytes()).await;
                let _ = w.write_all(&rest).await;
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
}

#[tokio::test]
async fn reload_moves_new_connections_and_keeps_live_ones() -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("proxy-agent-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("agent.yaml");
    let (g1, a1) = gateway().await?;
    let (g2, a2) = gateway().await?;
    tagged_echo_gateway(g1, "g1:");
    tagged_echo_gateway(g2, "g2:");
    let yaml = config(&a1, "proxy-protocol-v2", "");
    write_config(&path, &yaml)?;
    let agent = Agent::start_watching(&path).await?;

    let mut live = agent.connect().await?;
    live.write_all(b"a").await?;
    assert_eq!(within("first", read_n(&mut live, 4)).await??, b"g1:a");

    write_config(&path, &yaml.replace(&a1, &a2))?;
    poll("a new connection reaches the new gateway", || async {
        let mut c = agent.connect().await.ok()?;
        c.write_all(b"x").await.ok()?;
        let got = read_n(&mut c, 4).await.ok()?;
        (got == b"g2:x").then_some(())
    })
    .await?;
    agent.wait_metric("seedgate_config_reloads_total", &[("result", "success")], 1.0).await?;
    live.write_all(b"b").await?;
    assert_eq!(within("live connection still relays", read_n(&mut live, 1)).await??, b"b");
    let (_, cfg) = agent.get("/config").await?;
    let cfg: serde_json::Value = serde_json::from_str(&cfg)?;
    assert_eq!(cfg["apiserver_proxy"]["gateway"], a2.as_str());

    // Listen addresses are bound at start: a reload that changes them is refused, nothing changes.
    write_config(&path, &yaml.replace(&a1, &a2).replace("127.0.0.3:", "127.0.0.4:"))?;
    agent.wait_metric("seedgate_config_reloads_total", &[("result", "failure")], 1.0).await?;
    let mut c = agent.connect().await?;
    c.write_all(b"y").await?;
    assert_eq!(within("still the reloaded gateway", read_n(&mut c, 4)).await??, b"g2:y");
    // An invalid file is refused too.
    write_config(&path, "apiserver_proxy: {}\n")?;
    agent.wait_metric("seedgate_config_reloads_total", &[("result", "failure")], 2.0).await?;

    live.shutdown().await?;
    drop((live, c));
    agent.stop().await?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

#[tokio::test]
async fn stop_refuses_new_connections_and_drains_live_ones() -> anyhow::Result<()> {
    let (gw, gw_addr) = gateway().await?;
    let agent = Agent::start(&config(&gw_addr, "proxy-protocol-v2", "")).await?;
    let listener = agent.listener();
    let mut client = agent.connect().await?;
    let (conn, _) = within("accept", gw.accept()).await??;
    let gw_task = tokio::spawn(echo_after_proxy_header(conn));
    client.write_all(b"1").await?;
    assert_eq!(within("echo", read_n(&mut client, 1)).await??, b"1");

    agent.shutdown.stop.cancel();
    let (status, _) = agent.get("/readyz").await?;
    assert_eq!(status, 503, "draining is not ready");
    poll("listener closed", || async { TcpStream::connect(listener).await.is_err().then_some(()) }).await?;
    // The live connection keeps working during the drain.
    client.write_all(b"2").await?;
    assert_eq!(within("echo while draining", read_n(&mut client, 1)).await??, b"2");
    client.shutdown().await?;
    within("close", read_until_closed(&mut client)).await?;
    gw_task.await??;
    agent.stop().await
}

#[tokio::test]
async fn the_drain_grace_ends_connections_that_stay() -> anyhow::Result<()> {
    let (gw, gw_addr) = gateway().await?;
    let yaml = config(&gw_addr, "proxy-protocol-v2", "").replace("drain_grace: 5s", "drain_grace: 200ms");
    let agent = Agent::start(&yaml).await?;
    let mut client = agent.connect().await?;
    let (mut conn, _) = within("accept", gw.accept()).await??;
    read_proxy_header(&mut conn).await?;
    let admin = agent.addrs.admin.context("admin")?;
    agent.stop().await?;
    within("client closed by the drain", read_until_closed(&mut client)).await?;
    within("gateway side closed by the drain", read_until_closed(&mut conn)).await?;
    poll("admin listener closed after the drain", || async { TcpStream::connect(admin).await.is_err().then_some(()) })
        .await?;
    Ok(())
}

#[tokio::test]
async fn admin_endpoints_answer() -> anyhow::Result<()> {
    let (_gw, gw_addr) = gateway().await?;
    let agent = Agent::start(&config(&gw_addr, "proxy-protocol-v2", "")).await?;
    assert_eq!(agent.get("/healthz").await?, (200, "ok\n".to_owned()));
    let (status, body) = agent.get("/config").await?;
    ensure!(status == 200, "{status}");
    let cfg: serde_json::Value = serde_json::from_str(&body)?;
    assert_eq!(cfg["apiserver_proxy"]["mode"], "proxy-protocol-v2");
    assert_eq!(cfg["apiserver_proxy"]["destination_header"], "X-Gardener-Destination");
    assert_eq!(cfg["limits"]["max_connections"], 10000);
    let m = agent.metrics().await?;
    assert_eq!(metric(&m, "seedgate_build_info", &[("binary", "proxy-agent")]), 1.0);
    assert!(metric(&m, "seedgate_config_last_reload_success_timestamp_seconds", &[]) > 0.0);
    agent.stop().await
}
