//! End-to-end tests of sni-router's UDP listeners: real quinn clients reach quinn echo servers through the router, routed by the SNI of their Initial packets.

use anyhow::Context as _;
use proxy_wire::quic_initial::build;
use rustls::crypto::CryptoProvider;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use testbed::pki::provider;
use testbed::quic::{Nat, QuicEcho, client, client_tls, connect, echo};
use testbed::{Addresses, Ca, InProc, Proc, TempDir, http_get, metric_sum, metric_value, poll_until};
use tokio::net::UdpSocket;

const WAIT: Duration = Duration::from_secs(15);
const TICK: Duration = Duration::from_millis(20);

struct World {
    dir: TempDir,
    ca: Ca,
    a: QuicEcho,
    b: QuicEcho,
}

fn world() -> anyhow::Result<World> {
    let dir = TempDir::new("quic-sni")?;
    let ca = Ca::new("seedgate-test-ca")?;
    let a = QuicEcho::start("backend-a", &ca.server(&["a.quic.example"])?)?;
    let b = QuicEcho::start("backend-b", &ca.server(&["b.quic.example"])?)?;
    Ok(World { dir, ca, a, b })
}

fn router_config(w: &World, with_b: bool) -> anyhow::Result<String> {
    let mut y = format!(
        "admin: {{ listen: 127.0.0.1:0 }}\ntimeouts: {{ handshake: 2s, udp_idle: 30s }}\ndrain_grace: 1s\nlisteners:\n  - name: quic\n    listen: 127.0.0.1:0\n    protocol: udp\n    routes:\n      - name: shoot-a\n        sni: [a.quic.example]\n        upstreams: [{}]\n",
        w.a.addr()?
    );
    if with_b {
        y.push_str(&format!(
            "      - name: shoot-b\n        sni: [\"*.quic.example\"]\n        upstreams: [{}]\n",
            w.b.addr()?
        ));
    }
    Ok(y)
}

/// The router in this process.
async fn start_router(dir: &TempDir, yaml: &str) -> anyhow::Result<(InProc, Addresses)> {
    InProc::serve(dir, "sni-router", yaml).await
}

/// The router as a process, for SIGHUP.
async fn start_router_process(dir: &TempDir, yaml: &str) -> anyhow::Result<(Proc, Addresses, PathBuf)> {
    Proc::start_with_config(dir, "sni-router", "router", yaml).await
}

async fn metrics(addrs: &Addresses) -> anyhow::Result<String> {
    let (code, body) = http_get(addrs.admin()?, "/metrics").await?;
    anyhow::ensure!(code == 200, "metrics answered {code}");
    Ok(body)
}

fn write_atomic(path: &Path, text: &str) -> anyhow::Result<()> {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// A provider whose only key exchange group is X25519MLKEM768: its 1,216-byte key share makes
/// the ClientHello longer than one Initial packet can carry.
fn post_quantum() -> Arc<CryptoProvider> {
    let mut p = rustls::crypto::aws_lc_rs::default_provider();
    p.kx_groups = vec![rustls::crypto::aws_lc_rs::kx_group::X25519MLKEM768];
    Arc::new(p)
}

/// The size of the ClientHello a QUIC client with `tls` sends (the CRYPTO data of its Initials).
fn hello_len(tls: rustls::ClientConfig) -> anyhow::Result<usize> {
    Ok(hello(tls)?.len())
}

/// The ClientHello a QUIC client with `tls` sends.
fn hello(tls: rustls::ClientConfig) -> anyhow::Result<Vec<u8>> {
    let mut c = rustls::quic::ClientConnection::new(
        Arc::new(tls),
        rustls::quic::Version::V1,
        "a.quic.example".try_into()?,
        vec![0x01, 0x02, 0x43, 0xe8], // a transport parameter: max_idle_timeout 1000
    )?;
    let mut out = Vec::new();
    let _ = c.write_hs(&mut out);
    Ok(out)
}

/// A new flow's waiting datagrams (the client's Initials) reach the upstream at once: none is
/// dropped while the flow's upstream socket is new (a dropped Initial costs the client a
/// retransmission timeout, about a second, before its handshake can go on).
#[tokio::test]
async fn a_new_flow_loses_none_of_its_first_datagrams() -> anyhow::Result<()> {
    let w = world()?;
    let (_r, addrs) = start_router(&w.dir, &router_config(&w, false)?).await?;
    let gw = addrs.listener("quic")?;
    for (i, p) in [provider(), post_quantum()].into_iter().enumerate() {
        for k in 0..3 {
            let ep = client(client_tls(&w.ca, p.clone())?, WAIT)?;
            let c = connect(&ep, gw, "a.quic.example").await.with_context(|| format!("client {i}/{k}"))?;
            assert_eq!(echo(&c, "first").await?, "backend-a:first");
        }
    }
    let m = metrics(&addrs).await?;
    assert_eq!(metric_sum(&m, "seedgate_udp_flows_total", &[("result", "ok")]), 6.0, "{m}");
    assert_eq!(metric_sum(&m, "seedgate_udp_datagrams_dropped_total", &[]), 0.0, "{m}");
    Ok(())
}

#[tokio::test]
async fn quic_is_routed_by_sni_to_two_backends() -> anyhow::Result<()> {
    let w = world()?;
    let (_r, addrs) = start_router(&w.dir, &router_config(&w, true)?).await?;
    let gw = addrs.listener("quic")?;
    // One endpoint (UDP socket) per connection: the router's flows are keyed by client address.
    let ep = client(client_tls(&w.ca, provider())?, WAIT)?;
    let ep2 = client(client_tls(&w.ca, provider())?, WAIT)?;

    let a = connect(&ep, gw, "a.quic.example").await.context("a through the router")?;
    assert_eq!(echo(&a, "hello a").await?, "backend-a:hello a");
    let b = connect(&ep2, gw, "b.quic.example").await.context("b through the router")?;
    assert_eq!(echo(&b, "hello b").await?, "backend-b:hello b");
    // Several streams on one flow.
    for i in 0..3 {
        assert_eq!(echo(&a, &format!("again {i}")).await?, format!("backend-a:again {i}"));
    }

    let m = metrics(&addrs).await?;
    let flows = |route, result| metric_value(&m, "seedgate_udp_flows_total", &[("route", route), ("result", result)]);
    assert_eq!(flows("shoot-a", "ok"), Some(1.0), "{m}");
    assert_eq!(flows("shoot-b", "ok"), Some(1.0), "{m}");
    assert_eq!(metric_value(&m, "seedgate_udp_flows_active", &[("listener", "quic")]), Some(2.0));
    assert!(metric_sum(&m, "seedgate_proxied_bytes_total", &[("route", "shoot-a"), ("direction", "to_client")]) > 0.0);
    assert!(
        metric_sum(&m, "seedgate_proxied_bytes_total", &[("route", "shoot-b"), ("direction", "to_upstream")]) > 0.0
    );
    a.close(0u32.into(), b"done");
    b.close(0u32.into(), b"done");
    Ok(())
}

#[tokio::test]
async fn a_client_hello_spanning_several_initials_is_routed() -> anyhow::Result<()> {
    let w = world()?;
    let (_r, addrs) = start_router(&w.dir, &router_config(&w, true)?).await?;
    let gw = addrs.listener("quic")?;
    let tls = client_tls(&w.ca, post_quantum())?;
    // Beyond what one 1,200-byte Initial carries: the router must reassemble.
    let len = hello_len(tls.clone())?;
    assert!(len > 1200, "the ClientHello is {len} bytes");

    let ep = client(tls.clone(), WAIT)?;
    let a = connect(&ep, gw, "a.quic.example").await.context("post-quantum client through the router")?;
    assert_eq!(echo(&a, "big hello").await?, "backend-a:big hello");
    let ep2 = client(tls, WAIT)?;
    let b = connect(&ep2, gw, "b.quic.example").await.context("the wildcard route")?;
    assert_eq!(echo(&b, "big hello").await?, "backend-b:big hello");
    Ok(())
}

#[tokio::test]
async fn unknown_names_and_garbage_are_dropped_and_counted() -> anyhow::Result<()> {
    let w = world()?;
    let (_r, addrs) = start_router(&w.dir, &router_config(&w, false)?).await?;
    let gw = addrs.listener("quic")?;

    // No route for this name: the handshake never completes.
    let ep = client(client_tls(&w.ca, provider())?, Duration::from_secs(1))?;
    let e = connect(&ep, gw, "b.quic.example").await;
    assert!(e.is_err(), "an unknown name must not connect");

    let raw = UdpSocket::bind("127.0.0.1:0").await?;
    raw.send_to(b"\x00 not quic", gw).await?;
    raw.send_to(b"GET / HTTP/1.1\r\n\r\n", gw).await?;
    // A well-formed Initial that is not encrypted with its connection ID's keys.
    let mut forged = build::initial_v1(&[7; 8], 0, &[0x01]).context("sealed")?;
    forged[600] ^= 0xff;
    raw.send_to(&forged, gw).await?;
    // A short-header packet from an address without a flow.
    raw.send_to(&[0x40; 64], gw).await?;

    let m = poll_until(WAIT, TICK, || async {
        let m = metrics(&addrs).await.ok()?;
        let dropped = |reason| {
            metric_value(&m, "seedgate_udp_datagrams_dropped_total", &[("listener", "quic"), ("reason", reason)])
                .unwrap_or(0.0)
        };
        (dropped("not_quic") >= 1.0
            && dropped("short_header") >= 2.0
            && dropped("decrypt") >= 1.0
            && dropped("unknown_sni") >= 1.0)
            .then_some(m)
    })
    .await
    .context("drops counted")?;
    assert!(
        metric_value(&m, "seedgate_udp_flows_total", &[("route", ""), ("result", "unknown_sni")]).unwrap_or(0.0) >= 1.0,
        "{m}"
    );
    // Nothing was routed, and no flow is held for any of it once refused.
    assert_eq!(metric_sum(&m, "seedgate_udp_flows_total", &[("result", "ok")]), 0.0);
    // The listener still serves.
    let ok = client(client_tls(&w.ca, provider())?, WAIT)?;
    let a = connect(&ok, gw, "a.quic.example").await?;
    assert_eq!(echo(&a, "still").await?, "backend-a:still");
    Ok(())
}

#[tokio::test]
async fn a_flow_survives_a_reload_that_adds_a_route() -> anyhow::Result<()> {
    let w = world()?;
    let (mut p, addrs, cfg) = start_router_process(&w.dir, &router_config(&w, false)?).await?;
    let gw = addrs.listener("quic")?;
    let ep = client(client_tls(&w.ca, provider())?, WAIT)?;
    let a = connect(&ep, gw, "a.quic.example").await?;
    assert_eq!(echo(&a, "before").await?, "backend-a:before");

    write_atomic(&cfg, &router_config(&w, true)?)?;
    p.signal(libc::SIGHUP)?;
    poll_until(WAIT, TICK, || async {
        let m = metrics(&addrs).await.ok()?;
        let routes = metric_value(&m, "seedgate_routes", &[("listener", "quic")]).unwrap_or(0.0);
        (routes == 2.0).then_some(())
    })
    .await
    .context("the reload added the route")?;

    // The flow admitted before the reload goes on, to the same backend, on the same connection.
    assert_eq!(echo(&a, "after").await?, "backend-a:after");
    // New flows see the new table.
    let ep2 = client(client_tls(&w.ca, provider())?, WAIT)?;
    let b = connect(&ep2, gw, "b.quic.example").await.context("the added route")?;
    assert_eq!(echo(&b, "new").await?, "backend-b:new");
    let m = metrics(&addrs).await?;
    assert_eq!(metric_value(&m, "seedgate_udp_flows_total", &[("route", "shoot-a"), ("result", "ok")]), Some(1.0));
    assert!(metric_value(&m, "seedgate_config_reloads_total", &[("result", "success")]).unwrap_or(0.0) >= 1.0);
    Ok(())
}

/// A flow follows its client to a new address: after the NAT in front of the client rebinds,
/// the client's short-header packets, addressed to the connection ID the backend gave itself,
/// move the flow; the connection carries on, and no new flow is made.
#[tokio::test]
async fn a_flow_follows_its_client_to_a_new_address() -> anyhow::Result<()> {
    let w = world()?;
    let (_r, addrs) = start_router(&w.dir, &router_config(&w, false)?).await?;
    let nat = Nat::start(addrs.listener("quic")?).await?;
    let ep = client(client_tls(&w.ca, provider())?, WAIT)?;
    let a = connect(&ep, nat.addr, "a.quic.example").await.context("through the NAT and the router")?;
    assert_eq!(echo(&a, "before").await?, "backend-a:before");

    nat.rebind.send("127.0.0.9".parse()?).await?;
    for i in 0..5 {
        let got = echo(&a, &format!("after {i}")).await.context("the connection after the client's address changed")?;
        assert_eq!(got, format!("backend-a:after {i}"));
    }
    let m = metrics(&addrs).await?;
    let v = |name, labels: &[(&str, &str)]| metric_value(&m, name, labels);
    assert_eq!(v("seedgate_udp_flows_migrated_total", &[("route", "shoot-a")]), Some(1.0), "{m}");
    assert_eq!(v("seedgate_udp_flows_total", &[("route", "shoot-a"), ("result", "ok")]), Some(1.0), "{m}");
    // The old address is forgotten: one flow, at its new address.
    assert_eq!(v("seedgate_udp_flows_active", &[("listener", "quic")]), Some(1.0), "{m}");
    a.close(0u32.into(), b"done");
    Ok(())
}

/// Writes the first datagrams real quinn clients send (rustls's default key shares, X25519MLKEM768
/// and X25519, and X25519MLKEM768 alone: either ClientHello spans two Initials) to the `quic_initial`
/// fuzz corpus, in the target's datagram mode (a 0 byte, then each datagram after its u16
/// length); and such ClientHellos (rustls's, as quinn sends them) in its sealed mode, cut in
/// three pieces, shuffled, one sent twice.
/// `cargo test -p seedgate-tests --test it -- --ignored write_quic_initial_corpus`
#[tokio::test]
#[ignore = "writes wire/fuzz/corpus/quic_initial/"]
async fn write_quic_initial_corpus() -> anyhow::Result<()> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../wire/fuzz/corpus/quic_initial");
    std::fs::create_dir_all(&dir)?;
    let ca = Ca::new("seedgate-test-ca")?;
    for (name, kx) in [("quinn_default.bin", provider()), ("quinn_mlkem.bin", post_quantum())] {
        // Nothing answers: the client's first flight is all there is to read.
        let sink = UdpSocket::bind("127.0.0.1:0").await?;
        let tls = client_tls(&ca, kx)?;
        // Layout: 3 pieces, cut at 256 and 1024, two swaps, piece 1 again, one per packet, PINGs.
        let mut sealed = vec![1u8, 0, 12, 2, 1, 0, 4, 0, 1, 1, 0x81, 1, 3, 1, 3];
        sealed.extend(hello(tls.clone())?);
        std::fs::write(dir.join(name.replace(".bin", "_hello.bin")), sealed)?;
        let ep = client(tls, WAIT)?;
        let _connecting = ep.connect(sink.local_addr()?, "a.quic.example")?;
        let mut datagrams = Vec::new();
        let mut buf = vec![0u8; 65536];
        // Before the client's first retransmission (its initial PTO is about a second).
        while let Ok(got) = tokio::time::timeout(Duration::from_millis(300), sink.recv_from(&mut buf)).await {
            datagrams.push(buf[..got?.0].to_vec());
        }
        let mut reader = proxy_wire::quic_initial::InitialReader::new(16 * 1024, 32);
        let mut verdict = None;
        for d in &datagrams {
            verdict = Some(reader.push(d));
        }
        match verdict {
            Some(Ok(proxy_wire::client_hello::Status::Complete(info))) => {
                assert_eq!(info.sni.as_deref(), Some("a.quic.example"), "{name}")
            }
            other => panic!("{name}: {} datagrams read as {other:?}", datagrams.len()),
        }
        let mut seed = vec![0u8];
        for d in &datagrams {
            seed.extend(u16::try_from(d.len())?.to_be_bytes());
            seed.extend(d);
        }
        std::fs::write(dir.join(name), seed)?;
        eprintln!(
            "{name}: {} datagrams of {:?} bytes",
            datagrams.len(),
            datagrams.iter().map(Vec::len).collect::<Vec<_>>()
        );
    }
    Ok(())
}
