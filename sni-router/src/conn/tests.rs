//! Tests of `conn`.

use super::*;
use tokio::net::TcpListener;

/// A valid ClientHello for `sni` padded (extension 21) to exactly `hs_len` handshake bytes, in
/// records of at most 2^14 bytes.
fn padded_hello(sni: &str, hs_len: usize) -> Vec<u8> {
    fn ext(ty: u16, data: &[u8]) -> Vec<u8> {
        [&ty.to_be_bytes()[..], &(data.len() as u16).to_be_bytes(), data].concat()
    }
    let name = sni.as_bytes();
    let list = [&[0u8][..], &(name.len() as u16).to_be_bytes(), name].concat();
    let sni_ext = ext(0, &[&(list.len() as u16).to_be_bytes()[..], &list].concat());
    let versions = ext(43, &[4, 0x03, 0x04, 0x03, 0x03]);
    let body = |pad: usize| {
        let exts = [sni_ext.clone(), versions.clone(), ext(21, &vec![0; pad])].concat();
        let mut b = vec![0x03, 0x03];
        b.extend([7u8; 32]);
        b.extend([0, 0, 2, 0x13, 0x01, 1, 0]);
        b.extend((exts.len() as u16).to_be_bytes());
        b.extend(exts);
        b
    };
    let pad = hs_len - 4 - body(0).len();
    let body = body(pad);
    let mut hs = vec![1];
    hs.extend(&(body.len() as u32).to_be_bytes()[1..]);
    hs.extend(body);
    assert_eq!(hs.len(), hs_len);
    let mut wire = Vec::new();
    for rec in hs.chunks(16384) {
        wire.extend([0x16, 0x03, 0x01]);
        wire.extend((rec.len() as u16).to_be_bytes());
        wire.extend(rec);
    }
    wire
}

async fn route_hello(hello: &[u8]) -> Result<Arc<str>, &'static str> {
    let yaml = "listeners:\n  - name: gw\n    listen: 127.0.0.1:0\n    routes:\n      - name: big\n        sni: [big.example]\n        upstreams: [127.0.0.1:1]\n";
    let shared = Arc::new(crate::shared::test_shared_with(yaml));
    let rt = crate::running::test_listener(&shared);
    let cfg = shared.config.load_full();
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut c = tokio::net::TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
    let (mut s, peer) = l.accept().await.unwrap();
    c.write_all(hello).await.unwrap();
    let mut pre = Pre::new(shared.ids.next(), peer, Instant::now());
    let table = rt.table.load();
    route_tls(&mut s, &mut pre, &table, &cfg).await.map(|r| r.name.clone()).map_err(|r| r.reason)
}

/// The default `limits.client_hello_max` takes a hello filling one maximal record (16,389
/// bytes on the wire), as the docs promise; one handshake byte more needs a second record.
#[tokio::test]
async fn default_cap_takes_a_hello_in_one_maximal_record() {
    let full = padded_hello("big.example", 16384);
    assert_eq!(full.len(), 16389);
    assert_eq!(route_hello(&full).await.as_deref(), Ok("big"));
    let over = padded_hello("big.example", 16385);
    assert_eq!(route_hello(&over).await, Err("client_hello_too_large"));
}

#[tokio::test]
async fn connection_future_stays_small() {
    let shared = std::sync::Arc::new(crate::shared::test_shared());
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let c = tokio::net::TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
    let rt = crate::running::test_listener(&shared);
    let f = super::serve(shared.clone(), rt, c, "127.0.0.1:1".parse().unwrap());
    // Every byte here is held by each open connection for its whole life: keep the relay
    // state lean (the pre-relay phases are boxed and freed before the relay).
    let size = std::mem::size_of_val(&f);
    eprintln!("connection future: {size} bytes");
    assert!(size <= 512, "per-connection future grew to {size} bytes");
}

/// Protocols a client offered cannot end the access log's line or colour a terminal.
#[test]
fn offered_protocols_are_logged_escaped() {
    let offered = ["h2".to_owned(), "x\n2026-01-01T00:00:00Z  INFO connection closed route=admin\u{1b}[31m".to_owned()];
    let shown = Joined(&offered).to_string();
    assert!(!shown.chars().any(char::is_control), "{shown}");
    assert!(shown.starts_with("h2,x\\n2026"), "{shown}");
    assert_eq!(Joined(&[]).to_string(), "-");
}
