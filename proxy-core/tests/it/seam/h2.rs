//! The HTTP/2 transport on the suite's path: TLS over an in-memory duplex pipe that can go silent, and a raw HTTP/2 seed and agent that speak it by hand.

use super::{Path, RawAgent, RawAnswer, RawControl, RawSeed, Transport, pki, within};
use bytes::Bytes;
use proxy_core::tunnel::session::SessionError;
use proxy_core::tunnel::{CONTROL_PATH, ERROR_HEADER, REASON_HEADER, TunnelSettings};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf};

pub(crate) struct H2;

type SeedTls = tokio_rustls::server::TlsStream<PathIo>;
type AgentTls = tokio_rustls::client::TlsStream<PathIo>;

const DUPLEX_BUF: usize = 1 << 20;
/// An HTTP/2 PING frame (9-byte header + 8 bytes of payload); a PING ACK is the same size.
const PING_FRAME: u64 = 17;

impl Transport for H2 {
    type SeedSide = SeedTls;
    type AgentSide = AgentTls;
    type RawSeed = RawH2Seed;
    type RawAgent = RawH2Agent;

    async fn connect(_settings: &TunnelSettings) -> (SeedTls, AgentTls, Path) {
        let path = Path::default();
        let (a, b) = tokio::io::duplex(DUPLEX_BUF);
        let (server, client) = pki::configs();
        let accept = tokio_rustls::TlsAcceptor::from(server).accept(PathIo { io: a, path: path.clone() });
        let name = rustls::pki_types::ServerName::try_from(pki::SERVER_NAME).unwrap();
        let connect = tokio_rustls::TlsConnector::from(client).connect(name, PathIo { io: b, path: path.clone() });
        let (seed, agent) = within("TLS handshake", async { tokio::join!(accept, connect) }).await;
        (seed.unwrap(), agent.unwrap(), path)
    }

    fn silence_noticed_after(s: &TunnelSettings) -> Duration {
        s.ping_every() + s.keepalive_timeout
    }

    fn is_silence(e: &SessionError, s: &TunnelSettings) -> bool {
        matches!(e, SessionError::KeepaliveTimeout(t) if *t == s.keepalive_timeout)
    }

    const HEARD_PER_INTERVAL: u64 = PING_FRAME;
    const DRAINING_REFUSAL_STOPS_OPENS: bool = false;
    const NOTICE_ON_CONTROL: bool = false;
    const CONTROL_FIRST: bool = false;
    const LIVE_PATH_TOLD_IN_VIRTUAL_TIME: bool = true;
}

/// One end of the duplex pipe on a [`Path`]: while the path is silent, reads wait for ever and
/// writes are lost. As over TCP, a write after the other end closed is taken (TCP learns of the
/// close from the peer's answer, later; the pipe would fail the write at once): the close is
/// what reads see.
pub(crate) struct PathIo {
    io: DuplexStream,
    path: Path,
}

impl AsyncRead for PathIo {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        if self.path.silent() {
            return Poll::Pending;
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for PathIo {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        if self.path.silent() {
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut self.io).poll_write(cx, buf).map(|r| taken(r, buf.len()))
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx).map(|r| taken(r, ()))
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx).map(|r| taken(r, ()))
    }
}

/// A write the pipe refused because the other end is gone, as TCP takes it.
fn taken<T>(r: std::io::Result<T>, done: T) -> std::io::Result<T> {
    match r {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(done),
        r => r,
    }
}

/// A raw HTTP/2 client as the seed; its connection is driven in a task.
pub(crate) struct RawH2Seed {
    send: h2::client::SendRequest<Bytes>,
}

pub(crate) struct RawH2Control {
    stream: h2::SendStream<Bytes>,
    body: h2::RecvStream,
}

impl RawSeed for RawH2Seed {
    type Side = SeedTls;
    type Control = RawH2Control;

    async fn start(side: SeedTls) -> Self {
        let (send, conn) = within("raw seed handshake", h2::client::handshake(side)).await.unwrap();
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Self { send }
    }

    async fn control(&mut self) -> (RawH2Control, Vec<u8>) {
        let req = http::Request::builder()
            .method(http::Method::POST)
            .uri(format!("https://agent{CONTROL_PATH}"))
            .body(())
            .unwrap();
        let (resp, stream) = self.send.send_request(req, false).expect("send control request");
        let resp = within("control response", resp).await.expect("control response");
        assert_eq!(resp.status(), 200);
        let mut body = resp.into_body();
        let hello = within("hello", body.data()).await.expect("hello frame").expect("hello data");
        (RawH2Control { stream, body }, hello.to_vec())
    }

    fn connect(&mut self, target: &str) -> impl Future<Output = RawAnswer> + Send + use<> {
        let req = http::Request::builder().method(http::Method::CONNECT).uri(target).body(()).unwrap();
        let (resp, stream) = self.send.send_request(req, false).expect("send CONNECT");
        async move {
            let _keep = stream;
            let resp = resp.await.expect("response");
            let h = |name| resp.headers().get(name).map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
            let (code, reason) = (h(ERROR_HEADER), h(REASON_HEADER));
            RawAnswer { status: Some(resp.status().as_u16()), code, reason, ended: resp.body().is_end_stream() }
        }
    }

    async fn unknown_request_refused(&mut self) {
        let req = http::Request::builder().method(http::Method::GET).uri("https://agent/other").body(()).unwrap();
        let (resp, _s) = self.send.send_request(req, true).unwrap();
        let e = within("refused request", resp).await.expect_err("a GET was answered");
        assert_eq!(e.reason(), Some(h2::Reason::REFUSED_STREAM), "{e:?}");
    }

    async fn closed_for_protocol(&mut self) {
        unreachable!("over HTTP/2 any stream may come first")
    }
}

impl RawControl for RawH2Control {
    async fn send(&mut self, bytes: &[u8]) {
        self.stream.send_data(Bytes::copy_from_slice(bytes), false).unwrap();
    }

    async fn ended_by_agent(&mut self) {
        match within("control stream end", self.body.data()).await {
            Some(Err(e)) => assert!(e.is_reset() && e.reason() == Some(h2::Reason::CANCEL), "{e:?}"),
            other => panic!("control stream not reset by the agent: {other:?}"),
        }
    }
}

/// A raw HTTP/2 server as the agent.
pub(crate) struct RawH2Agent {
    conn: Option<h2::server::Connection<AgentTls, Bytes>>,
}

impl RawAgent for RawH2Agent {
    type Side = AgentTls;

    async fn start(side: AgentTls) -> Self {
        let conn = within("raw agent handshake", h2::server::handshake(side)).await.unwrap();
        Self { conn: Some(conn) }
    }

    async fn answer_foreign(&mut self) -> &'static str {
        let mut conn = self.conn.take().expect("answers once");
        let answered = within("raw agent", async {
            let mut control = None; // keep the control stream open
            while let Some(r) = conn.accept().await {
                let (req, mut respond) = r.unwrap();
                if req.method() == http::Method::CONNECT {
                    let resp = http::Response::builder().status(502).body(()).unwrap();
                    respond.send_response(resp, true).unwrap();
                    return control;
                }
                control = Some(respond);
            }
            panic!("raw agent connection ended");
        })
        .await;
        tokio::spawn(async move {
            let _control = answered;
            while conn.accept().await.is_some() {}
        });
        "502"
    }
}
