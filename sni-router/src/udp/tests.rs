//! Tests of `udp`.

use super::*;
use crate::flow_budget::FlowBudget;
use proxy_core::prometheus::IntGauge;
use proxy_wire::quic_initial::build;

fn gauge() -> IntGauge {
    IntGauge::new("g", "g").expect("gauge")
}

#[test]
fn the_flow_budget_is_a_hard_bound_and_slots_come_back() {
    let b = Arc::new(FlowBudget::default());
    let g = gauge();
    let slots: Vec<FlowSlot> = (0..3).map(|_| b.try_take(3, g.clone()).expect("below the bound")).collect();
    assert!(b.try_take(3, g.clone()).is_none(), "full");
    assert_eq!((b.used(), g.get()), (3, 3));
    drop(slots);
    assert_eq!((b.used(), g.get()), (0, 0));
    // A lowered limit (reload) refuses until enough flows ended.
    let _a = b.try_take(3, g.clone()).expect("free");
    assert!(b.try_take(1, g.clone()).is_none());
}

#[test]
fn a_pending_queue_is_bounded_in_count_and_bytes() {
    let mut q = Queue::new(3, 3000);
    assert!(q.push(&[0; 1200]));
    assert!(q.push(&[0; 1200]));
    assert!(!q.push(&[0; 1200]), "bytes");
    assert!(q.push(&[0; 100]));
    assert!(!q.push(&[0; 1]), "count");
    assert_eq!((q.items.len(), q.bytes), (3, 2500));
}

#[test]
fn removing_a_pending_flow_takes_only_that_flow() {
    let b = Arc::new(FlowBudget::default());
    let mut flows = Flows::default();
    let peer: SocketAddr = "192.0.2.1:4433".parse().expect("addr");
    let slot = b.try_take(10, gauge()).expect("free");
    let p = Pending {
        id: 7,
        reader: Some(Box::new(InitialReader::new(1024, 4))),
        queue: Queue::new(1, 1),
        routing: false,
        slot,
    };
    flows.map.insert(peer, Flow::Pending(Box::new(p)));
    flows.pending += 1;
    assert!(flows.remove_pending(peer, 8).is_none(), "another flow of the same address");
    assert!(flows.remove_pending(peer, 7).is_some());
    assert_eq!((flows.pending, flows.map.len()), (0, 0));
    // The slot went with it.
    assert_eq!(b.used(), 0);
}

#[tokio::test]
async fn socket_buffers_are_asked_for_and_a_cap_is_not_an_error() {
    let addr: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    let s = bind_udp(addr, 128 * 1024, "test").expect("bind");
    let got = socket2::SockRef::from(&s).recv_buffer_size().expect("SO_RCVBUF");
    assert!(got >= 128 * 1024, "asked 128 KiB, the kernel reports {got}");
    // Far above any default net.core.rmem_max: capped (and logged), still bound.
    bind_udp(addr, 256 * 1024 * 1024, "test").expect("a capped buffer still binds");
    flow_socket(s.local_addr().expect("addr"), 256 * 1024 * 1024).expect("flow socket");
}

/// A client's first Initial: a real ClientHello for `sni` (rustls's QUIC client) in a CRYPTO frame.
fn initial_for(sni: &str) -> Vec<u8> {
    let tls =
        rustls::ClientConfig::builder().with_root_certificates(rustls::RootCertStore::empty()).with_no_client_auth();
    let mut c = rustls::quic::ClientConnection::new(
        Arc::new(tls),
        rustls::quic::Version::V1,
        sni.to_owned().try_into().expect("a server name"),
        vec![0x01, 0x02, 0x43, 0xe8], // a transport parameter: max_idle_timeout 1000
    )
    .expect("client");
    let mut hello = Vec::new();
    let _ = c.write_hs(&mut hello);
    build::initial_v1(&[0x5a; 8], 0, &build::crypto_frame(0, &hello)).expect("sealed")
}

/// A flow whose client went silent (a QUIC session that ended: UDP shows no end) no longer
/// counts for least-connections while the flow lives on, and counts again once its client
/// speaks: after a replica restarts, its agents' new flows must not be sent elsewhere by the
/// flows of their ended sessions.
#[tokio::test]
async fn a_silent_clients_flow_stops_counting_for_balancing_and_counts_again_when_heard() {
    let bound = Duration::from_secs(10);
    let local: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    let (a, b, client) = (
        UdpSocket::bind(local).await.expect("a"),
        UdpSocket::bind(local).await.expect("b"),
        UdpSocket::bind(local).await.expect("client"),
    );
    let yaml = format!(
        "timeouts: {{ udp_idle: 3s }}\nlisteners:\n  - name: q\n    listen: 127.0.0.1:0\n    protocol: udp\n    \
             routes:\n      - name: r\n        sni: [r.example]\n        balance: least-connections\n        \
             upstreams: [{}, {}]\n",
        a.local_addr().expect("a"),
        b.local_addr().expect("b")
    );
    let shared = Arc::new(crate::shared::test_shared_with(&yaml));
    let rt = crate::running::test_listener(&shared);
    let ups = rt.table.load().by_sni("r.example").expect("the route").upstreams.clone();
    let l = UdpListener::new(&shared, rt, bind_udp(local, 64 * 1024, "test").expect("bind"));
    let peer = client.local_addr().expect("client");
    l.on_datagram(&initial_for("r.example"), peer);
    // On a tie the first upstream gets the flow.
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let (_, flow) = tokio::time::timeout(bound, a.recv_from(&mut buf)).await.expect("the Initial").expect("recv");
    assert_eq!((ups[0].active(), ups[1].active()), (1, 0));
    // The upstream goes on sending, so the flow lives; its client says nothing.
    let answers = tokio::spawn(async move {
        for _ in 0..200 {
            let _ = a.send_to(b"answer", flow).await;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let deadline = tokio::time::Instant::now() + bound;
    while ups[0].active() != 0 {
        assert!(tokio::time::Instant::now() < deadline, "a silent client's flow still counts");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(l.flow_count(), 1, "the flow itself lives on");
    // The client's next datagram counts its flow again.
    l.on_datagram(b"\x40 a short-header packet", peer);
    assert_eq!((ups[0].active(), ups[1].active()), (1, 0));
    answers.abort();
}

/// A flood of Initials from many addresses holds at most `limits.udp_flows` flows, and
/// garbage none at all.
#[tokio::test]
async fn a_flood_of_initials_is_bounded_by_the_flow_limit() {
    let shared = Arc::new(crate::shared::test_shared_with(
        "limits: { udp_flows: 5 }\nlisteners:\n  - name: q\n    listen: 127.0.0.1:0\n    protocol: udp\n",
    ));
    let rt = crate::running::test_listener(&shared);
    let sock = bind_udp("127.0.0.1:0".parse().expect("addr"), 64 * 1024, "test").expect("bind");
    let l = UdpListener::new(&shared, rt, sock);
    // Genuine Initials (a PING each: no ClientHello yet, so every one would wait).
    let initial = build::initial_v1(&[0x5a; 8], 0, &[0x01]).expect("sealed");
    let mut forged = initial.clone();
    forged[700] ^= 1;
    for i in 0..50u16 {
        l.on_datagram(b"garbage", SocketAddr::from(([10, 1, 0, 0], i)));
        l.on_datagram(&forged, SocketAddr::from(([10, 2, 0, 0], i)));
    }
    // Garbage and undecryptable Initials hold no flow.
    assert_eq!((l.flow_count(), shared.udp_flows.used()), (0, 0));
    for i in 0..50u16 {
        l.on_datagram(&initial, SocketAddr::from(([10, 0, (i >> 8) as u8, i as u8], 1000 + i)));
    }
    // Real ones up to the bound.
    assert_eq!((l.flow_count(), shared.udp_flows.used()), (5, 5));
    let m = &shared.metrics.udp.dropped;
    assert_eq!(m.with_label_values(&["q", "flows_full"]).get(), 45);
    assert_eq!(m.with_label_values(&["q", "short_header"]).get(), 50);
    assert_eq!(m.with_label_values(&["q", "decrypt"]).get(), 50);
    // A waiting flow that never completes a ClientHello ends at the packet bound.
    let peer = SocketAddr::from(([10, 0, 0, 0], 1000));
    let packets = FlowLimits::of(&shared.config.load()).packets as u64;
    for pn in 1..packets {
        l.on_datagram(&build::initial_v1(&[0x5a; 8], pn, &[0x01]).expect("sealed"), peer);
    }
    assert_eq!(l.flow_count(), 5);
    l.on_datagram(&build::initial_v1(&[0x5a; 8], packets, &[0x01]).expect("sealed"), peer);
    assert_eq!((l.flow_count(), shared.udp_flows.used()), (4, 4));
    let flows = &shared.metrics.udp.flows;
    assert_eq!(flows.with_label_values(&["q", "", "too_large"]).get(), 1);
}
