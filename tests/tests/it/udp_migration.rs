//! End-to-end tests of when a QUIC flow through sni-router follows its client to a new address: not for a spoofer that copies the flow's connection ID while the client is active, and still for a real NAT rebinding.
//!
//! sni-router runs in this process; a quinn client reaches a quinn echo server through a
//! stand-in NAT, which also reads the server's connection ID off the wire as an observer on the
//! path can. Every wait polls with a deadline.

use anyhow::Context as _;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use testbed::inproc::InProc;
use testbed::pki::provider;
use testbed::quic::{Nat, QuicEcho, client, client_tls, connect, echo};
use testbed::{Ca, TempDir, metric_value};
use tokio::net::UdpSocket;

const WAIT: Duration = Duration::from_secs(15);
/// Spoofed datagrams sent after each of the client's echoes.
const SPOOFED_PER_ECHO: usize = 10;
const ECHOES: usize = 30;

/// sni-router in this process with a UDP listener `quic` routing `a.quic.example` to `backend`,
/// for sources in 127.0.0.0/8 (the spoofer's address is inside the allow list).
async fn router(backend: SocketAddr) -> anyhow::Result<(TempDir, InProc)> {
    let yaml = format!(
        "admin: {{ listen: 127.0.0.1:0 }}\ntimeouts: {{ handshake: 2s, udp_idle: 30s }}\ndrain_grace: 1s\n\
         listeners:\n  - name: quic\n    listen: 127.0.0.1:0\n    protocol: udp\n    routes:\n\
         \x20     - name: shoot-a\n        sni: [a.quic.example]\n        upstreams: [{backend}]\n\
         \x20       allowed_sources: [127.0.0.0/8]\n"
    );
    let dir = TempDir::new("udp-migration")?;
    let r = InProc::start(&dir, "sni-router", &yaml).await?;
    Ok((dir, r))
}

/// A short-header QUIC packet addressed to `cid`, with `n` making every one different (so none
/// is a copy of another): what a spoofer who read the connection ID off the wire can send.
fn spoofed(cid: &[u8], n: usize) -> Vec<u8> {
    let mut d = vec![0x40 | (n as u8 & 0x3f)];
    d.extend_from_slice(cid);
    d.extend_from_slice(&(n as u64).to_be_bytes());
    d.resize(64, 0xa5);
    d
}

fn count(m: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    metric_value(m, name, labels).unwrap_or(0.0)
}

/// A spoofer inside the allow list (another port of the client's host, then another host of
/// 127.0.0.0/8) sends fresh datagrams addressed to the flow's connection ID while the real
/// client keeps talking: the flow never moves, the spoofer gets nothing back, every attempt is
/// counted. Then the client's NAT rebinds (the old address stops): the flow follows it and the
/// connection carries on.
#[tokio::test]
async fn a_spoofed_connection_id_does_not_move_a_live_flow_a_rebinding_does() -> anyhow::Result<()> {
    let ca = Ca::new("seedgate-test-ca")?;
    let backend = QuicEcho::start("backend-a", &ca.server(&["a.quic.example"])?)?;
    let (_dir, r) = router(backend.addr()?).await?;
    let nat = Nat::start(r.listener("quic")?).await?;
    let ep = client(client_tls(&ca, provider())?, WAIT)?;
    let conn = connect(&ep, nat.addr, "a.quic.example").await.context("through the NAT and the router")?;
    assert_eq!(echo(&conn, "before").await?, "backend-a:before");
    let cid = nat.server_cid()?;

    let spoofers = [UdpSocket::bind("127.0.0.1:0").await?, UdpSocket::bind("127.0.0.7:0").await?];
    let gw = r.listener("quic")?;
    let mut sent = 0;
    for i in 0..ECHOES {
        for _ in 0..SPOOFED_PER_ECHO {
            spoofers[i % 2].send_to(&spoofed(&cid, sent), gw).await?;
            sent += 1;
        }
        assert_eq!(echo(&conn, &format!("live {i}")).await?, format!("backend-a:live {i}"));
    }
    let m = r.metrics();
    assert_eq!(count(&m, "seedgate_udp_flows_migrated_total", &[("route", "shoot-a")]), 0.0, "{m}");
    let refused =
        count(&m, "seedgate_udp_migrations_refused_total", &[("route", "shoot-a"), ("reason", "client_active")]);
    assert!(refused >= 1.0 && refused <= sent as f64, "{refused} of {sent} spoofed datagrams refused\n{m}");
    for s in &spoofers {
        let mut buf = [0u8; 2048];
        assert!(s.try_recv_from(&mut buf).is_err(), "the spoofer {} received the flow's datagrams", s.local_addr()?);
    }

    // The NAT rebinds; the client goes on. The flow follows once the old address has been quiet.
    let rebound = Instant::now();
    nat.rebind.send("127.0.0.9".parse()?).await?;
    assert_eq!(echo(&conn, "after").await.context("after the NAT rebinding")?, "backend-a:after");
    eprintln!("first echo after the rebinding: {:?}", rebound.elapsed());
    for i in 0..3 {
        assert_eq!(echo(&conn, &format!("after {i}")).await?, format!("backend-a:after {i}"));
    }
    let m = r.metrics();
    assert_eq!(count(&m, "seedgate_udp_flows_migrated_total", &[("route", "shoot-a")]), 1.0, "{m}");
    assert_eq!(count(&m, "seedgate_udp_flows_total", &[("route", "shoot-a"), ("result", "ok")]), 1.0, "{m}");
    assert_eq!(count(&m, "seedgate_udp_flows_active", &[("listener", "quic")]), 1.0, "{m}");
    conn.close(0u32.into(), b"done");
    Ok(())
}
