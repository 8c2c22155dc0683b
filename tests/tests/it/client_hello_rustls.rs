//! rustls against the ClientHello fixtures and the re-framing helper of proxy-wire's tests: what the reader is tested with is valid TLS.
// Here rather than in proxy-wire because it needs a TLS stack, which that crate must not depend on.

#[path = "../../../wire/tests/support/refragment.rs"]
#[allow(dead_code)] // shared helpers; only the re-framing is needed here
mod refragment;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use proxy_wire::client_hello::{ClientHelloInfo, DEFAULT_MAX_LEN, HelloParser, Status};
use testbed::pki::provider;

const MULTI_RECORD: &[u8] = include_bytes!("../../../wire/tests/fixtures/client_hello/multi_record.bin");
const TIMEOUT: Duration = Duration::from_secs(5);

fn complete(buf: &[u8]) -> ClientHelloInfo {
    match HelloParser::new(DEFAULT_MAX_LEN).parse(buf) {
        Ok(Status::Complete(i)) => i,
        other => panic!("expected Complete, got {other:?}"),
    }
}

fn server_config(name: &str) -> Arc<rustls::ServerConfig> {
    let ck = rcgen::generate_simple_self_signed(vec![name.to_string()]).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(ck.signing_key.serialize_der().into());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![ck.cert.der().clone()], key)
        .unwrap();
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Arc::new(cfg)
}

/// The fixture bytes themselves, sent over TCP, are accepted by a rustls server, which answers with a ServerHello.
#[test]
fn rustls_server_accepts_multi_record_fixture() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (mut sock, _) = listener.accept().unwrap();
        sock.set_read_timeout(Some(TIMEOUT)).unwrap();
        let mut acceptor = rustls::server::Acceptor::default();
        let accepted = loop {
            assert!(acceptor.read_tls(&mut sock).unwrap() > 0, "client closed before a whole hello");
            if let Some(a) = acceptor.accept().map_err(|(e, _)| e).unwrap() {
                break a;
            }
        };
        let hello = accepted.client_hello();
        let seen =
            (hello.server_name().map(str::to_string), hello.alpn().map(|a| a.map(|p| p.to_vec()).collect::<Vec<_>>()));
        // Proceeds to send ServerHello..Finished, then fails when the client (raw bytes) goes away.
        let mut conn = accepted.into_connection(server_config("api.shoot-a.example.com")).map_err(|(e, _)| e).unwrap();
        let _ = conn.complete_io(&mut sock);
        seen
    });
    let mut client = TcpStream::connect(addr).unwrap();
    client.set_read_timeout(Some(TIMEOUT)).unwrap();
    client.write_all(MULTI_RECORD).unwrap();
    let mut head = [0u8; 6];
    client.read_exact(&mut head).unwrap();
    assert_eq!(head[0], 0x16, "handshake record");
    assert_eq!(head[5], 2, "server_hello");
    drop(client);
    let (sni, alpn) = server.join().unwrap();
    assert_eq!(sni.as_deref(), Some("api.shoot-a.example.com"));
    assert_eq!(alpn, Some(vec![b"h2".to_vec(), b"http/1.1".to_vec()]));
}

/// A live rustls client whose hello is re-framed into 4 records completes a full handshake with a rustls server.
#[test]
fn rustls_full_handshake_with_refragmented_hello() {
    let name = "api.shoot-a.example.com";
    let server_cfg = server_config(name);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();

    // Trust whatever cert the server presents: only the framing of the hello is under test.
    #[derive(Debug)]
    struct AnyCert(Arc<rustls::crypto::CryptoProvider>);
    impl rustls::client::danger::ServerCertVerifier for AnyCert {
        fn verify_server_cert(
            &self,
            _: &rustls::pki_types::CertificateDer<'_>,
            _: &[rustls::pki_types::CertificateDer<'_>],
            _: &rustls::pki_types::ServerName<'_>,
            _: &[u8],
            _: rustls::pki_types::UnixTime,
        ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        }
        fn verify_tls12_signature(
            &self,
            m: &[u8],
            c: &rustls::pki_types::CertificateDer<'_>,
            d: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(m, c, d, &self.0.signature_verification_algorithms)
        }
        fn verify_tls13_signature(
            &self,
            m: &[u8],
            c: &rustls::pki_types::CertificateDer<'_>,
            d: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(m, c, d, &self.0.signature_verification_algorithms)
        }
        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }

    let server = std::thread::spawn(move || {
        let (sock, _) = listener.accept().unwrap();
        sock.set_read_timeout(Some(TIMEOUT)).unwrap();
        let conn = rustls::ServerConnection::new(server_cfg).unwrap();
        let mut tls = rustls::StreamOwned::new(conn, sock);
        let mut ping = [0u8; 4];
        tls.read_exact(&mut ping).unwrap();
        tls.write_all(b"pong").unwrap();
        tls.flush().unwrap();
        (ping, tls.conn.server_name().map(str::to_string))
    });

    let mut client_cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCert(provider())))
        .with_no_client_auth();
    client_cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let mut conn = rustls::ClientConnection::new(Arc::new(client_cfg), name.try_into().unwrap()).unwrap();
    let mut hello = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut hello).unwrap();
    }
    let reframed = refragment::refragment(&hello, &[2, 100, 300, usize::MAX]);
    let parsed = complete(&reframed);
    assert_eq!((parsed.records, parsed.len), (4, reframed.len()));
    assert_eq!(parsed.sni.as_deref(), Some(name));

    let mut sock = TcpStream::connect(addr).unwrap();
    sock.set_read_timeout(Some(TIMEOUT)).unwrap();
    sock.write_all(&reframed).unwrap();
    let mut tls = rustls::Stream::new(&mut conn, &mut sock);
    tls.write_all(b"ping").unwrap();
    let mut pong = [0u8; 4];
    tls.read_exact(&mut pong).unwrap();
    assert_eq!(&pong, b"pong");
    assert_eq!(conn.alpn_protocol(), Some(&b"h2"[..]));
    let (ping, sni) = server.join().unwrap();
    assert_eq!(&ping, b"ping");
    assert_eq!(sni.as_deref(), Some(name));
}
