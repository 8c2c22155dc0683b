//! Each reader's list of its errors' reason labels (what the binaries export at 0 from their
//! start) is exactly the labels its errors give.

use proxy_wire::client_hello::HelloError;
use proxy_wire::http_head::HeadError;
use proxy_wire::proxy_protocol::ProxyError;
use proxy_wire::quic_initial::InitialError;
use proxy_wire::tunnel::DialError;

fn same(listed: &[&str], given: impl IntoIterator<Item = &'static str>, what: &str) {
    let given: Vec<&str> = given.into_iter().collect();
    assert_eq!(listed, given.as_slice(), "{what}: the list and the labels differ");
}

#[test]
fn every_error_label_is_listed_once() {
    use ProxyError::*;
    let pp = [
        BadSignature,
        V1TooLong,
        V1Malformed(""),
        BadVersion(0),
        BadCommand(0),
        BadFamily(0),
        V2BadLength { declared: 0, required: 0 },
        V2TooLong(0),
        TlvOverrun { tlv_type: 0, nested: false },
        TlvBadValue { tlv_type: 0, what: "" },
        TlvDuplicate(0),
        CrcMismatch { expected: 0, computed: 0 },
        UniqueIdTooLong(0),
    ];
    same(&ProxyError::REASONS, pp.iter().map(ProxyError::reason), "PROXY header");
    use HeadError as H;
    let head = [
        H::TooLarge,
        H::TooManyHeaders,
        H::Malformed(""),
        H::BadVersion,
        H::NotConnect,
        H::BadAuthority(""),
        H::BadTarget(""),
    ];
    same(&HeadError::REASONS, head.iter().map(HeadError::reason), "request head");
    let hello = [HelloError::NotTls, HelloError::TooLarge, HelloError::Malformed("")];
    same(&HelloError::REASONS, hello.iter().map(HelloError::reason), "ClientHello");
    use InitialError as I;
    let initial = [
        I::NotQuic,
        I::ShortHeader,
        I::NotInitial,
        I::UnknownVersion(0),
        I::ShortDatagram(0),
        I::OtherConnection,
        I::Malformed(""),
        I::Decrypt,
        I::Frame(0),
        I::TooLarge,
    ];
    same(&InitialError::REASONS, initial.iter().map(InitialError::reason), "QUIC Initial");
    for h in hello {
        assert_eq!(I::Hello(h).reason(), h.reason(), "an Initial's ClientHello error keeps its label");
    }
    assert!(DialError::AGENT_CODES.iter().all(|c| DialError::CODES.contains(c)));
}
