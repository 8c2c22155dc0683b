//! Tests of `quic_initial`.

use super::build::crypto_frame;
use super::*;

fn seal(version: u32, dcid: &[u8], header: &[u8], pn: u64, payload: &[u8]) -> Vec<u8> {
    build::seal(version, dcid, header, pn, payload).unwrap()
}

fn initial(version: u32, dcid: &[u8], pn: u64, frames: &[u8]) -> Vec<u8> {
    initial_sized(version, dcid, pn, frames, MIN_INITIAL_DATAGRAM)
}

fn initial_sized(version: u32, dcid: &[u8], pn: u64, frames: &[u8], size: usize) -> Vec<u8> {
    build::client_initial(version, dcid, pn, frames, size).unwrap()
}

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

/// RFC 9001 Appendix A.
const DCID: &str = "8394c8f03e515708";
/// A.2: the client's CRYPTO frame (a ClientHello for example.com), padded to 1162 bytes.
const A2_CRYPTO_FRAME: &str = "
        060040f1010000ed0303ebf8fa56f12939b9584a3896472ec40bb863cfd3e868
        04fe3a47f06a2b69484c00000413011302010000c000000010000e00000b6578
        616d706c652e636f6dff01000100000a00080006001d00170018001000070005
        04616c706e000500050100000000003300260024001d00209370b2c9caa47fba
        baf4559fedba753de171fa71f50f1ce15d43e994ec74d748002b000302030400
        0d0010000e0403050306030203080408050806002d00020101001c0002400100
        3900320408ffffffffffffffff05048000ffff07048000ffff08011001048000
        75300901100f088394c8f03e51570806048000ffff";
const A2_UNPROTECTED_HEADER: &str = "c300000001088394c8f03e5157080000449e00000002";
const A2_PROTECTED_HEADER: &str = "c000000001088394c8f03e5157080000449e7b9aec34";
const A2_SAMPLE: &str = "d1b1c98dd7689fb8ec11d242b123dc9b";
const A2_PROTECTED_SUFFIX: &str = "
        7e78bfe706ca4cf5e9c5453e9f7cfd2b8b4c8d169a44e55c88d4a9a7f9474241
        e221af44860018ab0856972e194cd934";

/// A ClientHello handshake message for `sni` with a padding extension of `pad` bytes.
fn hello(sni: &str, pad: usize) -> Vec<u8> {
    let mut exts = Vec::new();
    let name = sni.as_bytes();
    exts.extend_from_slice(&[0, 0]);
    exts.extend_from_slice(&((name.len() + 5) as u16).to_be_bytes());
    exts.extend_from_slice(&((name.len() + 3) as u16).to_be_bytes());
    exts.push(0);
    exts.extend_from_slice(&(name.len() as u16).to_be_bytes());
    exts.extend_from_slice(name);
    exts.extend_from_slice(&[0, 21]);
    exts.extend_from_slice(&(pad as u16).to_be_bytes());
    exts.resize(exts.len() + pad, 0);
    let mut body = vec![3, 3];
    body.extend_from_slice(&[7; 32]);
    body.push(0); // session id
    body.extend_from_slice(&[0, 2, 0x13, 0x01]);
    body.extend_from_slice(&[1, 0]);
    body.extend_from_slice(&(exts.len() as u16).to_be_bytes());
    body.extend_from_slice(&exts);
    let mut msg = vec![1];
    msg.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    msg.extend_from_slice(&body);
    msg
}

fn reader() -> InitialReader {
    InitialReader::new(16 * 1024, 16)
}

fn sni(st: Status) -> Option<String> {
    match st {
        Status::Complete(info) => info.sni,
        Status::Incomplete => panic!("incomplete"),
    }
}

#[test]
fn rfc9001_appendix_a_client_initial() {
    let mut frames = hex(A2_CRYPTO_FRAME);
    frames.resize(1162, 0);
    let dgram = seal(VERSION_1, &hex(DCID), &hex(A2_UNPROTECTED_HEADER), 2, &frames);
    // The derived keys and header protection give the RFC's bytes exactly.
    assert_eq!(dgram.len(), 1200);
    assert_eq!(dgram[..22], hex(A2_PROTECTED_HEADER)[..]);
    assert_eq!(dgram[22..38], hex(A2_SAMPLE)[..]);
    assert_eq!(dgram[1200 - 48..], hex(A2_PROTECTED_SUFFIX)[..]);

    assert_eq!(looks_like_initial(&dgram), Ok(()));
    let mut r = reader();
    let st = r.push(&dgram).unwrap();
    let Status::Complete(info) = st else { panic!("incomplete") };
    assert_eq!(info.sni.as_deref(), Some("example.com"));
    assert_eq!(info.alpn, ["alpn"]);
    assert!(info.supported_versions_tls13);
    assert_eq!(r.version(), Some(VERSION_1));
    // The verdict is final.
    assert!(matches!(r.push(b"garbage"), Ok(Status::Complete(_))));
}

/// Writes the Appendix A client Initial to the `quic_initial` fuzz corpus: the datagram as
/// is, and its ClientHello for the target's sealed mode, whole and cut into shuffled pieces.
/// `cargo test -p proxy-wire --lib -- --ignored write_fuzz_seeds`
#[test]
#[ignore = "writes wire/fuzz/corpus/quic_initial/"]
fn write_fuzz_seeds() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/quic_initial");
    std::fs::create_dir_all(&dir).unwrap();
    let mut frames = hex(A2_CRYPTO_FRAME);
    frames.resize(1162, 0);
    let dgram = seal(VERSION_1, &hex(DCID), &hex(A2_UNPROTECTED_HEADER), 2, &frames);
    let mut raw = vec![0x00];
    raw.extend((dgram.len() as u16).to_be_bytes());
    raw.extend(&dgram);
    std::fs::write(dir.join("rfc9001_a2.bin"), raw).unwrap();
    // The frame's data: type 0x06, offset 0, length 0x40f1 (2 bytes), then the hello.
    let msg = &hex(A2_CRYPTO_FRAME)[4..];
    // Count 4, cuts 50/120/200, three swaps, piece 1 again, then packing and PINGs.
    let layout = [3, 0, 50, 0, 120, 0, 200, 3, 1, 0, 0x81, 0, 1, 2, 3, 1];
    for (name, flags, layout) in [
        ("rfc9001_a2_hello.bin", 0x01, &[][..]),
        ("rfc9001_a2_hello_cut.bin", 0x01, &layout[..]),
        ("rfc9001_a2_hello_v2.bin", 0x03, &layout[..]),
    ] {
        let mut seed = vec![flags];
        seed.extend((layout.len() as u16).to_be_bytes());
        seed.extend(layout);
        seed.extend(msg);
        std::fs::write(dir.join(name), seed).unwrap();
    }
}

#[test]
fn a_hello_across_two_initials_in_either_order() {
    let dcid = [0x11; 8];
    let msg = hello("api.shoot-a.example.com", 1500);
    let cut = 900;
    let p0 = initial(VERSION_1, &dcid, 0, &crypto_frame(0, &msg[..cut]));
    let p1 = initial(VERSION_1, &dcid, 1, &crypto_frame(cut, &msg[cut..]));
    for order in [[&p0, &p1], [&p1, &p0]] {
        let mut r = reader();
        assert_eq!(r.push(order[0]), Ok(Status::Incomplete));
        assert!(r.buffered() > 0);
        assert_eq!(sni(r.push(order[1]).unwrap()).as_deref(), Some("api.shoot-a.example.com"));
        assert_eq!(r.buffered(), 0, "nothing held after the verdict");
    }
}

#[test]
fn every_cut_of_the_crypto_stream_gives_the_same_verdict() {
    let dcid = [0x12; 8];
    let msg = hello("cut.example", 700);
    for cut in (1..msg.len()).step_by(23) {
        let p0 = initial(VERSION_1, &dcid, 0, &crypto_frame(0, &msg[..cut]));
        let p1 = initial(VERSION_1, &dcid, 1, &crypto_frame(cut, &msg[cut..]));
        let mut r = reader();
        assert_eq!(r.push(&p0), Ok(Status::Incomplete), "{cut}");
        assert_eq!(sni(r.push(&p1).unwrap()).as_deref(), Some("cut.example"), "{cut}");
    }
}

#[test]
fn out_of_order_frames_in_one_packet_and_retransmissions() {
    let dcid = [0x22; 12];
    let msg = hello("b.example", 200);
    let mut frames = crypto_frame(100, &msg[100..]);
    frames.extend([0x01]); // PING
    frames.extend([0x02, 0x00, 0x00, 0x00, 0x00]); // ACK
    frames.extend(crypto_frame(0, &msg[..50]));
    frames.extend(crypto_frame(20, &msg[20..100])); // overlaps
    let mut r = reader();
    assert_eq!(sni(r.push(&initial(VERSION_1, &dcid, 0, &frames)).unwrap()).as_deref(), Some("b.example"));
}

#[test]
fn version_2_is_read_too() {
    let dcid = [0x33; 8];
    let msg = hello("v2.example", 0);
    let mut r = reader();
    assert_eq!(
        sni(r.push(&initial(VERSION_2, &dcid, 0, &crypto_frame(0, &msg))).unwrap()).as_deref(),
        Some("v2.example")
    );
    assert_eq!(r.version(), Some(VERSION_2));
}

#[test]
fn coalesced_packets_after_the_initial_are_skipped() {
    let dcid = [0x44; 8];
    let msg = hello("c.example", 0);
    let mut dgram = initial(VERSION_1, &dcid, 0, &crypto_frame(0, &msg));
    // A Handshake (type 2) packet and a short-header packet after it.
    dgram.extend([0xe0, 0, 0, 0, 1, 8]);
    dgram.extend(dcid);
    dgram.extend([0, 5, 1, 2, 3, 4, 5]);
    dgram.extend([0x40, 9, 9, 9]);
    assert_eq!(sni(reader().push(&dgram).unwrap()).as_deref(), Some("c.example"));
}

#[test]
fn bad_datagrams_are_refused_with_their_reason() {
    let dcid = [0x55; 8];
    let msg = hello("d.example", 0);
    let good = initial(VERSION_1, &dcid, 0, &crypto_frame(0, &msg));
    let e = |d: &[u8]| reader().push(d).unwrap_err();

    assert_eq!(e(b""), InitialError::NotQuic);
    assert_eq!(e(b"\x16\x03\x01 a TLS record"), InitialError::NotQuic);
    assert_eq!(e(&[0x40; 1200]), InitialError::ShortHeader);
    assert_eq!(e(&good[..600]), InitialError::Malformed("length"));
    assert_eq!(e(&good[..3]), InitialError::Malformed("version"));
    let mut short = initial(VERSION_1, &dcid, 0, &crypto_frame(0, &msg));
    short.truncate(1100);
    assert!(matches!(e(&short), InitialError::Malformed(_)));
    let mut v = good.clone();
    v[1..5].copy_from_slice(&0xff00_001du32.to_be_bytes());
    assert_eq!(e(&v), InitialError::UnknownVersion(0xff00_001d));
    assert_eq!(looks_like_initial(&v), Err(InitialError::UnknownVersion(0xff00_001d)));
    let mut handshake = good.clone();
    handshake[0] = 0xe3;
    assert_eq!(e(&handshake), InitialError::NotInitial);
    assert_eq!(looks_like_initial(&handshake), Err(InitialError::NotInitial));
    let mut flipped = good.clone();
    flipped[600] ^= 1;
    assert_eq!(e(&flipped), InitialError::Decrypt);
    let mut wrong_cid = good.clone();
    wrong_cid[6] ^= 1;
    assert_eq!(e(&wrong_cid), InitialError::Decrypt);
    // A forbidden frame (STREAM) inside a well-protected Initial.
    assert_eq!(e(&initial(VERSION_1, &dcid, 0, &[0x08, 0, 1, 2])), InitialError::Frame(8));
    // Garbage in the CRYPTO stream.
    assert_eq!(
        e(&initial(VERSION_1, &dcid, 0, &crypto_frame(0, &[2, 0, 0, 4, 1, 2, 3, 4]))),
        InitialError::Hello(HelloError::Malformed("handshake type"))
    );
    // A small datagram cannot carry a client Initial (RFC 9000 §14.1).
    let small = initial_sized(VERSION_1, &dcid, 0, &crypto_frame(0, &msg), 300);
    assert_eq!(e(&small), InitialError::ShortDatagram(small.len()));
    assert_eq!(looks_like_initial(&small), Err(InitialError::ShortDatagram(small.len())));
}

#[test]
fn an_initial_longer_than_a_two_byte_length_is_read_as_any_other() {
    // A client may send one Initial of up to 65527 bytes; its Length then needs a 4-byte varint.
    let dcid = [0x12; 8];
    let msg = hello("api.shoot-a.example.com", 9000);
    let frames = [&[0x01][..], &crypto_frame(0, &msg)].concat();
    for size in [16_383, 16_400, 20_000, 65_527] {
        let pkt = initial_sized(VERSION_1, &dcid, 0, &frames, size);
        assert!(pkt.len() >= size, "padded to {size}");
        let mut r = reader();
        assert_eq!(sni(r.push(&pkt).unwrap()).as_deref(), Some("api.shoot-a.example.com"), "a datagram of {size}");
    }
}

#[test]
fn caps_bound_bytes_and_packets() {
    let dcid = [0x66; 8];
    // A CRYPTO offset beyond the cap.
    let mut r = InitialReader::new(2048, 8);
    assert_eq!(r.push(&initial(VERSION_1, &dcid, 0, &crypto_frame(4000, &[1; 10]))), Err(InitialError::TooLarge));
    // A hello declaring more than the cap.
    let msg = hello("e.example", 3000);
    let mut r = InitialReader::new(2048, 8);
    assert_eq!(
        r.push(&initial(VERSION_1, &dcid, 0, &crypto_frame(0, &msg[..500]))),
        Err(InitialError::Hello(HelloError::TooLarge))
    );
    // Packets that never complete the hello.
    let mut r = InitialReader::new(16 * 1024, 3);
    for pn in 0..3 {
        assert_eq!(r.push(&initial(VERSION_1, &dcid, pn, &[0x01])), Ok(Status::Incomplete));
    }
    assert_eq!(r.push(&initial(VERSION_1, &dcid, 3, &[0x01])), Err(InitialError::TooLarge));
    // Another connection's Initial as a whole datagram.
    let mut r = reader();
    assert_eq!(r.push(&initial(VERSION_1, &dcid, 0, &[0x01])), Ok(Status::Incomplete));
    assert_eq!(r.push(&initial(VERSION_1, &[0x67; 8], 1, &[0x01])), Err(InitialError::OtherConnection));
}

#[test]
fn packet_numbers_decode_near_the_expected_one() {
    assert_eq!(decode_packet_number(None, 2, 4), 2);
    // RFC 9000 §A.3 example.
    assert_eq!(decode_packet_number(Some(0xa82f30ea), 0x9b32, 2), 0xa82f9b32);
    assert_eq!(decode_packet_number(Some(255), 1, 1), 257);
}
