//! The WAN link emulator (`testbed::link`) does what it is told: packets cross in order and no
//! sooner than the delay, the rate bounds a transfer from below, a black hole drops everything one
//! way until lifted, loss of 100 % drops all, the same seed loses the same packets, the bottleneck
//! drops at its tail, a second path is shaped apart, and nothing (namespaces, devices,
//! forwarders) outlives the link, not even after a panic. Behaviour only: no figure here depends
//! on how fast the machine is.

use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};
use testbed::link::{Dir, LinkOpts, Shape, Wan};
use testbed::netns::{Netns, require_root};

/// How long a datagram that should arrive may take (far beyond any delay configured here).
const ARRIVE: Duration = Duration::from_secs(10);

/// A UDP socket bound to `ip:port` inside `ns`.
fn udp(ns: &Netns, ip: Ipv4Addr, port: u16) -> UdpSocket {
    let _inside = ns.enter().unwrap();
    let s = UdpSocket::bind(SocketAddr::from((ip, port))).unwrap();
    s.set_read_timeout(Some(ARRIVE)).unwrap();
    s
}

/// A pair of sockets across the link: (seed side, shoot side), each connected to the other.
fn pair(wan: &Wan, path: usize) -> (UdpSocket, UdpSocket) {
    let l = wan.path(path).unwrap();
    let a = udp(wan.seed(), l.seed_ip(), 0);
    let b = udp(wan.shoot(), l.shoot_ip(), 0);
    a.connect(b.local_addr().unwrap()).unwrap();
    b.connect(a.local_addr().unwrap()).unwrap();
    (a, b)
}

fn send_seq(s: &UdpSocket, from: u32, n: u32, size: usize) {
    for i in from..from + n {
        let mut d = vec![0u8; size.max(4)];
        d[..4].copy_from_slice(&i.to_be_bytes());
        s.send(&d).unwrap();
    }
}

fn recv_seq(s: &UdpSocket) -> u32 {
    let mut b = [0u8; 2048];
    let n = s.recv(&mut b).expect("a datagram that should arrive");
    assert!(n >= 4);
    u32::from_be_bytes(b[..4].try_into().unwrap())
}

/// Nothing is waiting on `s`.
fn nothing_waiting(s: &UdpSocket) -> bool {
    s.set_nonblocking(true).unwrap();
    let mut b = [0u8; 2048];
    let empty = matches!(s.recv(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
    s.set_nonblocking(false).unwrap();
    empty
}

/// Wait (bounded) until `cond` holds on the link's counters.
fn until(what: &str, cond: impl Fn() -> bool) {
    let end = Instant::now() + ARRIVE;
    // Bounded by the deadline.
    while !cond() {
        assert!(Instant::now() < end, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn datagrams_cross_in_order_and_no_sooner_than_the_delay() {
    if !require_root() {
        return;
    }
    let delay = Duration::from_millis(20);
    let wan = Wan::new("wan-order", 1, Shape { delay, ..Shape::CLEAR }, LinkOpts::default()).unwrap();
    let (a, b) = pair(&wan, 0);
    // All arrive at once (no rate limit): few enough for the receiver's default socket buffer.
    send_seq(&a, 0, 50, 1000);
    for i in 0..50 {
        assert_eq!(recv_seq(&b), i);
    }
    // A round trip crosses the delay twice.
    for _ in 0..3 {
        let t0 = Instant::now();
        a.send(b"ping").unwrap();
        let mut buf = [0u8; 16];
        let n = b.recv(&mut buf).unwrap();
        b.send(&buf[..n]).unwrap();
        let n = a.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"ping");
        assert!(t0.elapsed() >= 2 * delay, "a round trip took {:?}, less than twice {delay:?}", t0.elapsed());
    }
    let s = wan.link().stats(Dir::ToShoot);
    assert!(s.delivered >= 53 && s.dropped() == 0, "{s:?}");
}

#[test]
fn a_black_hole_drops_everything_one_way_until_lifted() {
    if !require_root() {
        return;
    }
    let wan = Wan::new("wan-hole", 2, Shape::CLEAR, LinkOpts::default()).unwrap();
    let link = wan.link();
    let (a, b) = pair(&wan, 0);
    send_seq(&a, 0, 1, 100);
    assert_eq!(recv_seq(&b), 0);
    // The receiver may see a datagram before the forwarder has counted it.
    until("the first datagram was counted", || link.stats(Dir::ToShoot).delivered == 1);

    link.black_hole(&[Dir::ToShoot], true);
    let before = link.stats(Dir::ToShoot);
    send_seq(&a, 1, 20, 100);
    until("the forwarder saw the 20 datagrams", || link.stats(Dir::ToShoot).black_holed >= 20);
    let after = link.stats(Dir::ToShoot);
    assert_eq!(after.delivered, before.delivered, "{after:?}");
    assert!(nothing_waiting(&b));
    // The other direction still carries.
    send_seq(&b, 100, 5, 100);
    for i in 100..105 {
        assert_eq!(recv_seq(&a), i);
    }

    link.black_hole(&[Dir::ToShoot], false);
    assert!(!link.shape(Dir::ToShoot).black_hole);
    send_seq(&a, 21, 1, 100);
    assert_eq!(recv_seq(&b), 21, "the first datagram after the black hole lifted");
}

#[test]
fn loss_of_all_drops_everything_and_no_loss_drops_nothing() {
    if !require_root() {
        return;
    }
    let wan = Wan::new("wan-loss", 3, Shape::CLEAR.with_loss(1.0), LinkOpts::default()).unwrap();
    let link = wan.link();
    let (a, b) = pair(&wan, 0);
    send_seq(&a, 0, 50, 100);
    until("50 datagrams were lost", || link.stats(Dir::ToShoot).lost >= 50);
    assert!(nothing_waiting(&b));
    assert_eq!(link.stats(Dir::ToShoot).delivered, 0);

    link.update(Dir::BOTH, |s| s.loss = 0.0);
    send_seq(&a, 50, 50, 100);
    for i in 50..100 {
        assert_eq!(recv_seq(&b), i);
    }
}

/// The sequence numbers of `n` datagrams that crossed a link losing `p` with generator seed `seed`.
fn survivors(net: u8, seed: u64, p: f64, n: u32) -> Vec<u32> {
    let opts = LinkOpts { rng_seed: seed, ..LinkOpts::default() };
    let wan = Wan::new("wan-seed", net, Shape::CLEAR.with_loss(p), opts).unwrap();
    let link = wan.link();
    let (a, b) = pair(&wan, 0);
    send_seq(&a, 0, n, 100);
    until("every datagram was delivered or lost", || {
        let s = link.stats(Dir::ToShoot);
        s.delivered + s.lost >= u64::from(n)
    });
    let delivered = link.stats(Dir::ToShoot).delivered;
    (0..delivered).map(|_| recv_seq(&b)).collect()
}

#[test]
fn the_same_seed_loses_the_same_datagrams() {
    if !require_root() {
        return;
    }
    let first = survivors(4, 9, 0.5, 200);
    let again = survivors(5, 9, 0.5, 200);
    let other = survivors(6, 10, 0.5, 200);
    assert_eq!(first, again);
    assert_ne!(first, other);
    assert!((40..160).contains(&first.len()), "{} of 200 crossed at 50 % loss", first.len());
    assert!(first.windows(2).all(|w| w[0] < w[1]), "in order: {first:?}");
}

#[test]
fn the_bottleneck_keeps_the_head_and_drops_the_tail() {
    if !require_root() {
        return;
    }
    // 1,000-byte packets (972 bytes of UDP payload) at 16 kbit/s: 0.5 s each; the queue holds four.
    let shape = Shape { rate: Some(16_000), queue: 4000, ..Shape::CLEAR };
    let wan = Wan::new("wan-tail", 7, shape, LinkOpts::default()).unwrap();
    let link = wan.link();
    let (a, b) = pair(&wan, 0);
    send_seq(&a, 0, 20, 972);
    until("the forwarder saw the 20 packets", || link.stats(Dir::ToShoot).packets >= 20);
    let s = link.stats(Dir::ToShoot);
    assert_eq!(s.tail_dropped, 16, "{s:?}");
    // Full, less what left while the packets came in (a few bytes' worth of the first one).
    assert!((3900..=4000).contains(&s.max_queue_bytes), "{s:?}");
    for i in 0..4 {
        assert_eq!(recv_seq(&b), i);
    }
    assert!(nothing_waiting(&b));
    // A new part of a run starts its peak over; the counts go on.
    link.reset_peaks();
    let s = link.stats(Dir::ToShoot);
    assert_eq!((s.max_queue_bytes, s.max_late, s.tail_dropped), (0, Duration::ZERO, 16), "{s:?}");
    send_seq(&a, 20, 1, 972);
    assert_eq!(recv_seq(&b), 20);
    let s = link.stats(Dir::ToShoot);
    assert!((1..=1000).contains(&s.max_queue_bytes), "one packet's peak: {s:?}");
}

#[test]
fn a_tcp_stream_crosses_intact_and_no_faster_than_the_rate() {
    if !require_root() {
        return;
    }
    let rate = 20_000_000;
    let wan = Wan::new("wan-tcp", 8, Shape::wan(Duration::from_millis(10), rate), LinkOpts::default()).unwrap();
    let link = wan.link();
    let listener = {
        let _inside = wan.shoot().enter().unwrap();
        TcpListener::bind(SocketAddr::from((link.shoot_ip(), 0))).unwrap()
    };
    let to = listener.local_addr().unwrap();
    let data: Vec<u8> = (0..4_000_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
    let expect = data.clone();
    let reader = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).unwrap();
        got
    });
    let t0 = Instant::now();
    let mut s = {
        let _inside = wan.seed().enter().unwrap();
        TcpStream::connect_timeout(&to, ARRIVE).unwrap()
    };
    s.write_all(&data).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let got = reader.join().unwrap();
    let took = t0.elapsed();
    assert!(got == expect, "the stream arrived altered ({} of {} bytes)", got.len(), expect.len());
    // 4 MB at 20 Mbit/s take 1.6 s on the wire, headers aside.
    let floor = Duration::from_secs_f64(expect.len() as f64 * 8.0 / rate as f64);
    assert!(took >= floor, "{} bytes took {took:?}, less than {floor:?} at the configured rate", expect.len());
    assert!(link.stats(Dir::ToShoot).delivered_bytes > expect.len() as u64);
}

#[test]
fn a_second_path_is_shaped_apart_from_the_first() {
    if !require_root() {
        return;
    }
    let mut wan = Wan::new("wan-paths", 9, Shape::CLEAR, LinkOpts::default()).unwrap();
    let second = wan.add_path(10, Shape::CLEAR, LinkOpts::default()).unwrap();
    assert!(wan.add_path(10, Shape::CLEAR, LinkOpts::default()).is_err(), "a path's subnet is its own");
    wan.link().black_hole(Dir::BOTH, true);
    let (a, b) = pair(&wan, second);
    send_seq(&a, 0, 10, 100);
    for i in 0..10 {
        assert_eq!(recv_seq(&b), i);
    }
    let (c, d) = pair(&wan, 0);
    send_seq(&c, 0, 10, 100);
    until("the first path swallowed 10 datagrams", || wan.link().stats(Dir::ToShoot).black_holed >= 10);
    assert!(nothing_waiting(&d));
}

#[test]
fn namespaces_devices_and_forwarders_are_gone_after_a_panic() {
    if !require_root() {
        return;
    }
    let names = std::sync::Mutex::new(Vec::new());
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let wan =
            Wan::new("wan-panic", 11, Shape::wan(Duration::from_millis(50), 10_000_000), LinkOpts::default()).unwrap();
        names.lock().unwrap().extend([wan.seed().name().to_owned(), wan.shoot().name().to_owned()]);
        assert_eq!(forwarders("wan11"), 1, "the forwarder runs while the link is up");
        panic!("a test failing with the link up");
    }));
    assert!(r.is_err());
    let names = names.into_inner().unwrap();
    assert_eq!(names.len(), 2);
    let list = std::process::Command::new("ip").args(["netns", "list"]).output().unwrap();
    let list = String::from_utf8_lossy(&list.stdout);
    for n in &names {
        assert!(!list.lines().any(|l| l.split_whitespace().next() == Some(n)), "{n} is still there: {list}");
    }
    assert_eq!(forwarders("wan11"), 0, "the forwarder outlived the link");
}

/// Threads of this process whose name starts with `prefix`.
fn forwarders(prefix: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with(prefix)))
        .count()
}

#[test]
fn new_connections_take_the_congestion_control_set_on_the_link() {
    if !require_root() {
        return;
    }
    let wan = Wan::new("wan-cc", 12, Shape::CLEAR, LinkOpts::default()).unwrap();
    let link = wan.link();
    let listener = {
        let _inside = wan.shoot().enter().unwrap();
        TcpListener::bind(SocketAddr::from((link.shoot_ip(), 0))).unwrap()
    };
    let to = listener.local_addr().unwrap();
    // What `ss` says of the seed's connection to the listener.
    let cc_of = |c: &TcpStream| {
        let port = c.local_addr().unwrap().port().to_string();
        let out = wan.seed().exec("ss", &["-tin", "sport", "=", &format!(":{port}")]).unwrap();
        ["cubic", "bbr", "reno"].into_iter().find(|cc| out.contains(cc)).map(str::to_owned)
    };
    let connect = || {
        let _inside = wan.seed().enter().unwrap();
        let c = TcpStream::connect_timeout(&to, ARRIVE).unwrap();
        let _ = listener.accept().unwrap();
        c
    };
    for cc in ["cubic", "reno", "bbr"] {
        wan.set_congestion_control(cc).unwrap();
        let c = connect();
        assert_eq!(cc_of(&c).as_deref(), Some(cc));
    }
}
