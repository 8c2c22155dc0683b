//! quinn's UDP endpoints as the binaries make them (`quic::endpoint`), on loopback in real time: the packet sizes path MTU discovery reaches, and an agent endpoint with and without receive offload (GRO). The session seam over QUIC is tested with HTTP/2's in `seam`.

use crate::seam::pki;
use proxy_core::tunnel::{TunnelSettings, quic};
use std::future::Future;
use std::time::Duration;

/// Bound on any single wait (real time: quinn runs on real sockets and timers).
const BOUND: Duration = Duration::from_secs(10);

async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, fut).await.unwrap_or_else(|_| panic!("{what}: not done within {BOUND:?}"))
}

/// A quinn connection from an agent endpoint (made with `agent_settings`) to a seed endpoint on
/// loopback, as the binaries make their endpoints (endpoint and transport settings, socket
/// buffers): (seed's, agent's, the endpoints).
async fn connected_with(
    agent_settings: &TunnelSettings,
) -> (quinn::Connection, quinn::Connection, [quinn::Endpoint; 2]) {
    let settings = TunnelSettings::default();
    let (sc, cc) = pki::quic_configs(&settings);
    let local = "127.0.0.1:0".parse().unwrap();
    let seed_ep = quic::endpoint(
        local,
        &settings,
        Some(quic::Server { config: sc, stable: None }),
        "the seed's test endpoint",
        "-",
    )
    .unwrap();
    let agent_ep = quic::endpoint(local, agent_settings, None, "the agent's test endpoint", "-").unwrap();
    let connecting = agent_ep.connect_with(cc, seed_ep.local_addr().unwrap(), pki::SERVER_NAME).unwrap();
    let (agent, seed) = tokio::join!(connecting, async { seed_ep.accept().await.unwrap().await });
    (seed.unwrap(), agent.unwrap(), [seed_ep, agent_ep])
}

/// On loopback (MTU 65,536) path MTU discovery lifts the packet size from 1,200 to the bound,
/// and quinn's GSO batches of such packets still fit one datagram: a bound too large for them
/// makes every batch fail to send, which quinn takes for a black hole and falls back to 1,200.
#[tokio::test]
async fn bulk_data_on_loopback_goes_in_packets_of_the_largest_size_without_a_black_hole() {
    let (seed, agent, _eps) = connected_with(&TunnelSettings::default()).await;
    // The seed opens every stream; the agent sends on its half.
    let (mut seed_tx, mut rx) = seed.open_bi().await.unwrap();
    seed_tx.write_all(b"x").await.unwrap();
    let (mut tx, _agent_rx) = within("the agent's accept", agent.accept_bi()).await.unwrap();
    tx.write_all(b"x").await.unwrap();
    let reader = tokio::spawn(async move { rx.read_to_end(32 << 20).await.unwrap().len() });
    let chunk = vec![7u8; 64 * 1024];
    // 16 MiB: discovery's probes are answered long before the end.
    for _ in 0..256 {
        within("a write", tx.write_all(&chunk)).await.unwrap();
    }
    tx.finish().unwrap();
    assert_eq!(within("the reader", reader).await.unwrap(), 1 + 256 * chunk.len());
    let path = agent.stats().path;
    assert_eq!(path.black_holes_detected, 0, "{path:?}");
    // Above what the default bound (Ethernet's 1,452) would reach; the bound itself once every
    // probe was answered.
    assert!(path.current_mtu > 1_452, "{path:?}");
}

/// The seed sends in packets as large as an agent's endpoint accepts (up to 6,500 with receive
/// offload; quinn's 1,472 without): a bulk transfer arrives whole and in order.
#[tokio::test]
async fn bulk_data_from_the_seed_reaches_an_agent_endpoint_whole() {
    bulk_from_the_seed(&TunnelSettings::default()).await;
}

/// With receive offload off, the agent's endpoint reads one packet per datagram: GRO must be off
/// on its socket too, or the kernel would coalesce packets into reads too small for them and cut
/// off all but the first (the transfer would stall on retransmissions).
#[tokio::test]
async fn bulk_data_from_the_seed_reaches_an_agent_endpoint_without_receive_offload_whole() {
    bulk_from_the_seed(&TunnelSettings { receive_offload: false, ..TunnelSettings::default() }).await;
}

async fn bulk_from_the_seed(agent_settings: &TunnelSettings) {
    let (seed, agent, _eps) = connected_with(agent_settings).await;
    let (mut tx, _rx) = seed.open_bi().await.unwrap();
    let sent: Vec<u8> = (0..16 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    let expected = sent.clone();
    let writer = tokio::spawn(async move {
        tx.write_all(&sent).await.unwrap();
        tx.finish().unwrap();
        tx
    });
    let (_agent_tx, mut rx) = within("the agent's accept", agent.accept_bi()).await.unwrap();
    let got = within("the transfer", rx.read_to_end(32 << 20)).await.unwrap();
    assert!(got == expected, "{} bytes arrived, {} sent, or not in order", got.len(), expected.len());
    drop(within("the writer", writer).await.unwrap());
    // The seed's packets: above the 1,472 quinn accepts by default once discovery ran, where
    // the agent accepts them; never above it for an agent without receive offload.
    let path = seed.stats().path;
    if agent_settings.receive_offload {
        assert!(path.current_mtu > 1_472, "{path:?}");
    } else {
        assert!(path.current_mtu <= 1_472, "{path:?}");
    }
}
