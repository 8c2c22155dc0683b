//! Talking to the seed gateway: fresh resolution, connect with retries, the PROXY v2 header and the CONNECT exchange.

use proxy_core::net::{self, ConnectFailure};
use proxy_wire::http_head::{ResponseHeadError, ResponseHeadReader};
use proxy_wire::proxy_protocol::{V2Options, encode_v2};
use seedgate_config::HostPort;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// Largest gateway response head to a CONNECT we buffer; a gateway answer is a few lines.
pub(crate) const MAX_RESPONSE_HEAD: usize = 8 * 1024;

/// Resolve the gateway afresh (no cache: a DNS change moves the next connection), bounded by
/// `timeout`. An empty answer is an error.
pub(crate) async fn resolve(gateway: &HostPort, timeout: Duration) -> io::Result<Vec<SocketAddr>> {
    net::resolve_within(gateway, timeout).await
}

/// Metric label for a failed connect attempt.
pub(crate) fn failure_label(e: &io::Error) -> &'static str {
    ConnectFailure::classify(e).label()
}

/// An IPv4-mapped IPv6 address (dual-stack listener) as plain IPv4, so the gateway sees TCP4.
pub(crate) fn canonical(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(a.ip().to_canonical(), a.port())
}

/// The PROXY v2 header: source = the client, destination = the address it connected to.
pub(crate) fn proxy_v2_header(client: SocketAddr, local: SocketAddr) -> Vec<u8> {
    encode_v2(canonical(client), canonical(local), &V2Options::default())
}

/// The CONNECT request head. `authority` and `destination` were validated by the config (or
/// come from a socket address), so they cannot break the head.
pub(crate) fn connect_request(authority: &str, header: &str, destination: &str) -> Vec<u8> {
    format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n{header}: {destination}\r\n\r\n").into_bytes()
}

/// Why the CONNECT exchange did not end in a tunnel.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HandshakeError {
    #[error("gateway answered {0}")]
    Status(u16),
    #[error("gateway closed the connection before answering")]
    Closed,
    #[error("gateway response head is not valid HTTP: {0}")]
    BadResponse(httparse::Error),
    #[error("gateway response head exceeds {MAX_RESPONSE_HEAD} bytes")]
    TooLarge,
    #[error("gateway connection failed: {0}")]
    Io(#[from] io::Error),
}

impl HandshakeError {
    /// Reject reason for metrics and the access log.
    pub(crate) fn reason(&self) -> String {
        match self {
            Self::Status(code) => format!("gateway_status_{code}"),
            Self::Closed => "gateway_closed".into(),
            Self::BadResponse(_) => "gateway_bad_response".into(),
            Self::TooLarge => "gateway_response_too_large".into(),
            Self::Io(_) => "gateway_io_error".into(),
        }
    }
}

impl From<ResponseHeadError> for HandshakeError {
    fn from(e: ResponseHeadError) -> Self {
        match e {
            ResponseHeadError::Malformed(e) => Self::BadResponse(e),
            ResponseHeadError::TooLarge => Self::TooLarge,
        }
    }
}

/// Read the gateway's answer to our CONNECT. On `200`, returns the bytes the gateway already
/// sent after the head (the start of the tunnel, owed to the client). The caller bounds the time.
pub(crate) async fn read_connect_response(gw: &mut TcpStream) -> Result<Vec<u8>, HandshakeError> {
    let mut buf = vec![0u8; MAX_RESPONSE_HEAD];
    let mut len = 0;
    // One reader across reads: each call looks only at the bytes the last read added.
    let mut reader = ResponseHeadReader::new(MAX_RESPONSE_HEAD);
    loop {
        let n = gw.read(&mut buf[len..]).await?;
        if n == 0 {
            return Err(HandshakeError::Closed);
        }
        len += n;
        if let Some(head) = reader.poll(&buf[..len])? {
            if head.status != 200 {
                return Err(HandshakeError::Status(head.status));
            }
            buf.truncate(len);
            buf.drain(..head.len);
            return Ok(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    #[test]
    fn handshake_errors() {
        // The response head itself is read (and tested) in proxy_wire::http_head.
        let bad = HandshakeError::from(ResponseHeadError::Malformed(httparse::Error::Version));
        assert!(matches!(bad, HandshakeError::BadResponse(httparse::Error::Version)));
        assert_eq!(bad.reason(), "gateway_bad_response");
        let big = HandshakeError::from(ResponseHeadError::TooLarge);
        assert_eq!(big.reason(), "gateway_response_too_large");
        assert_eq!(big.to_string(), format!("gateway response head exceeds {MAX_RESPONSE_HEAD} bytes"));
        assert_eq!(HandshakeError::Status(503).reason(), "gateway_status_503");
    }

    #[test]
    fn request_and_header_bytes() {
        assert_eq!(
            connect_request("10.1.2.3:443", "X-Gardener-Destination", "outbound|443||k.svc"),
            b"CONNECT 10.1.2.3:443 HTTP/1.1\r\nHost: 10.1.2.3:443\r\nX-Gardener-Destination: outbound|443||k.svc\r\n\r\n"
        );
        let h = proxy_v2_header("[::ffff:10.0.0.9]:40000".parse().unwrap(), "[::ffff:10.1.2.3]:443".parse().unwrap());
        let p = proxy_wire::proxy_protocol::parse(&h).unwrap().unwrap();
        assert_eq!(p.transport, proxy_wire::proxy_protocol::Transport::Tcp4);
        assert_eq!(p.source, Some("10.0.0.9:40000".parse().unwrap()));
        assert_eq!(p.destination, Some("10.1.2.3:443".parse().unwrap()));
    }

    #[tokio::test]
    async fn pipelined_tunnel_bytes_are_returned() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (mut s, _) = l.accept().await.unwrap();
        // Split the head across writes to exercise the read loop.
        s.write_all(b"HTTP/1.1 200 Connection established\r\n").await.unwrap();
        s.write_all(b"\r\nhello").await.unwrap();
        let rest = read_connect_response(&mut c).await.unwrap();
        // The two writes may arrive in one or two reads; the head ends after the empty line either way.
        assert_eq!(rest, b"hello");
        drop(s);
        let l2 = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut c = TcpStream::connect(l2.local_addr().unwrap()).await.unwrap();
        let (s, _) = l2.accept().await.unwrap();
        drop(s);
        assert!(matches!(read_connect_response(&mut c).await, Err(HandshakeError::Closed)));
    }

    #[tokio::test]
    async fn non_http_gateway_is_refused_before_it_closes() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (mut s, _) = l.accept().await.unwrap();
        // A server-speaks-first peer that then waits: the banner alone must settle it.
        s.write_all(b"SSH-2.0-OpenSSH_9.2").await.unwrap();
        let r = tokio::time::timeout(Duration::from_secs(5), read_connect_response(&mut c)).await;
        assert!(matches!(r, Ok(Err(HandshakeError::BadResponse(httparse::Error::Version)))), "{r:?}");
        drop(s);
    }
}
