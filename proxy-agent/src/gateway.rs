//! Talking to the seed gateway: fresh resolution, connect with retries, the PROXY v2 header and the CONNECT exchange.

use proxy_core::net::{self, ConnectFailure};
use proxy_core::proxy_protocol::{V2Options, encode_v2};
use seedgate_config::HostPort;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// Largest gateway response head to a CONNECT we buffer; a gateway answer is a few lines.
pub const MAX_RESPONSE_HEAD: usize = 8 * 1024;
/// Headers a CONNECT response may carry before we call it malformed.
const MAX_RESPONSE_HEADERS: usize = 32;

/// Resolve the gateway afresh (no cache: a DNS change moves the next connection), bounded by
/// `timeout`. An empty answer is an error.
pub async fn resolve(gateway: &HostPort, timeout: Duration) -> io::Result<Vec<SocketAddr>> {
    net::resolve_within(gateway, timeout).await
}

/// Metric label for a failed connect attempt.
pub fn failure_label(e: &io::Error) -> &'static str {
    ConnectFailure::classify(e).label()
}

/// An IPv4-mapped IPv6 address (dual-stack listener) as plain IPv4, so the gateway sees TCP4.
pub fn canonical(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(a.ip().to_canonical(), a.port())
}

/// The PROXY v2 header: source = the client, destination = the address it connected to.
pub fn proxy_v2_header(client: SocketAddr, local: SocketAddr) -> Vec<u8> {
    encode_v2(canonical(client), canonical(local), &V2Options::default())
}

/// The CONNECT request head. `authority` and `destination` were validated by the config (or
/// come from a socket address), so they cannot break the head.
pub fn connect_request(authority: &str, header: &str, destination: &str) -> Vec<u8> {
    format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n{header}: {destination}\r\n\r\n").into_bytes()
}

/// Why the CONNECT exchange did not end in a tunnel.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
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
    pub fn reason(&self) -> String {
        match self {
            Self::Status(code) => format!("gateway_status_{code}"),
            Self::Closed => "gateway_closed".into(),
            Self::BadResponse(_) => "gateway_bad_response".into(),
            Self::TooLarge => "gateway_response_too_large".into(),
            Self::Io(_) => "gateway_io_error".into(),
        }
    }
}

/// Sans-IO: the status and head length of a complete response head at the start of `buf`,
/// `None` if more bytes are needed.
pub fn parse_response_head(buf: &[u8]) -> Result<Option<(u16, usize)>, HandshakeError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_RESPONSE_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    match resp.parse(buf) {
        Ok(httparse::Status::Complete(len)) => Ok(Some((resp.code.unwrap_or(0), len))),
        Ok(httparse::Status::Partial) if buf.len() >= MAX_RESPONSE_HEAD => Err(HandshakeError::TooLarge),
        Ok(httparse::Status::Partial) => Ok(None),
        Err(e) => Err(HandshakeError::BadResponse(e)),
    }
}

/// Read the gateway's answer to our CONNECT. On `200`, returns the bytes the gateway already
/// sent after the head (the start of the tunnel, owed to the client). The caller bounds the time.
pub async fn read_connect_response(gw: &mut TcpStream) -> Result<Vec<u8>, HandshakeError> {
    let mut buf = vec![0u8; MAX_RESPONSE_HEAD];
    let mut len = 0;
    loop {
        let n = gw.read(&mut buf[len..]).await?;
        if n == 0 {
            return Err(HandshakeError::Closed);
        }
        len += n;
        if let Some((status, head_len)) = parse_response_head(&buf[..len])? {
            if status != 200 {
                return Err(HandshakeError::Status(status));
            }
            buf.truncate(len);
            buf.drain(..head_len);
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
    fn response_heads() {
        assert_eq!(parse_response_head(b"HTTP/1.1 200 OK\r\n").unwrap(), None);
        assert_eq!(parse_response_head(b"HTTP/1.1 200 OK\r\n\r\nxyz").unwrap(), Some((200, 19)));
        assert_eq!(parse_response_head(b"HTTP/1.0 403 Forbidden\r\nA: b\r\n\r\n").unwrap(), Some((403, 32)));
        assert!(matches!(parse_response_head(b"SSH-2.0-x\r\n\r\n"), Err(HandshakeError::BadResponse(_))));
        let long = [b"HTTP/1.1 200 OK\r\nX: ".as_slice(), &vec![b'a'; MAX_RESPONSE_HEAD]].concat();
        assert!(matches!(parse_response_head(&long), Err(HandshakeError::TooLarge)));
        assert_eq!(HandshakeError::Status(503).reason(), "gateway_status_503");
    }

    #[test]
    fn request_and_header_bytes() {
        assert_eq!(
            connect_request("10.1.2.3:443", "X-Gardener-Destination", "outbound|443||k.svc"),
            b"CONNECT 10.1.2.3:443 HTTP/1.1\r\nHost: 10.1.2.3:443\r\nX-Gardener-Destination: outbound|443||k.svc\r\n\r\n"
        );
        let h = proxy_v2_header("[::ffff:10.0.0.9]:40000".parse().unwrap(), "[::ffff:10.1.2.3]:443".parse().unwrap());
        let p = proxy_core::proxy_protocol::parse(&h).unwrap().unwrap();
        assert_eq!(p.transport, proxy_core::proxy_protocol::Transport::Tcp4);
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
}
