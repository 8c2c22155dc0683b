//! A konnectivity client, as kube-apiserver speaks it with `proxyProtocol: GRPC`: tonic code generated from the proto (build.rs), over a [`Dialer`]'s connection.
//!
//! One [`Client`] is one gRPC (HTTP/2) connection; [`Client::dial`] opens a `Proxy` stream on it
//! and sends the `DIAL_REQ`, as konnectivity-client does for every dial.

use crate::tunnel_kit::{BoxStream, Dialer};
use anyhow::Context as _;
use hyper_util::rt::TokioIo;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::mpsc;
use tonic::transport::{Channel, Endpoint};

#[allow(clippy::all, clippy::pedantic, missing_docs, rust_2018_idioms)]
pub mod pb {
    tonic::include_proto!("_");
}

pub use pb::packet::Payload;
use pb::proxy_service_client::ProxyServiceClient;
pub use pb::{Packet, PacketType};

/// How long one step (connect, an answer) may take.
const STEP: Duration = Duration::from_secs(10);

/// Opens the connection through the [`Dialer`] for tonic's channel.
#[derive(Clone, Debug)]
struct Connector(Dialer);

impl tonic::codegen::Service<tonic::codegen::http::Uri> for Connector {
    type Response = TokioIo<BoxStream>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: tonic::codegen::http::Uri) -> Self::Future {
        let d = self.0.clone();
        Box::pin(async move { d.connect().await.map(TokioIo::new).map_err(std::io::Error::other) })
    }
}

/// One gRPC connection to a gRPC front end.
#[derive(Clone, Debug)]
pub struct Client {
    inner: ProxyServiceClient<Channel>,
}

/// A `Proxy` stream: the packets we send, the packets the server sends.
#[derive(Debug)]
pub struct ProxyStream {
    pub tx: mpsc::Sender<Packet>,
    pub rx: tonic::Streaming<Packet>,
}

/// A dialled connection: its stream and connect id.
#[derive(Debug)]
pub struct Conn {
    pub stream: ProxyStream,
    pub connect_id: i64,
}

/// The next random dial id (konnectivity-client's are random 63-bit; unique is what matters).
fn random() -> i64 {
    static NEXT: AtomicI64 = AtomicI64::new(0x1234_5678_9abc);
    NEXT.fetch_add(7919, Ordering::Relaxed)
}

pub fn dial_request(address: &str, random: i64) -> Packet {
    let d = pb::DialRequest { protocol: "tcp".into(), address: address.into(), random };
    Packet { r#type: PacketType::DialReq.into(), payload: Some(Payload::DialRequest(d)) }
}

pub fn data(connect_id: i64, bytes: impl Into<Vec<u8>>) -> Packet {
    let d = pb::Data { connect_id, error: String::new(), data: bytes.into() };
    Packet { r#type: PacketType::Data.into(), payload: Some(Payload::Data(d)) }
}

pub fn close_request(connect_id: i64) -> Packet {
    Packet {
        r#type: PacketType::CloseReq.into(),
        payload: Some(Payload::CloseRequest(pb::CloseRequest { connect_id })),
    }
}

pub fn close_dial(random: i64) -> Packet {
    Packet { r#type: PacketType::DialCls.into(), payload: Some(Payload::CloseDial(pb::CloseDial { random })) }
}

impl Client {
    /// Open a gRPC connection through `dialer` (HTTP/2 with prior knowledge; for TLS the
    /// dialer's config must offer ALPN `h2`).
    pub async fn connect(dialer: Dialer) -> anyhow::Result<Self> {
        let ch = Endpoint::from_static("http://konnectivity.invalid")
            .connect_timeout(STEP)
            .connect_with_connector(Connector(dialer.clone()))
            .await
            .with_context(|| format!("gRPC connection to {dialer:?}"))?;
        Ok(Self { inner: ProxyServiceClient::new(ch) })
    }

    /// Open a `Proxy` stream whose first packet is `first`.
    pub async fn open(&self, first: Packet) -> anyhow::Result<ProxyStream> {
        let (tx, rx) = mpsc::channel::<Packet>(16);
        tx.send(first).await.context("queueing the first packet")?;
        let out = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|p| (p, rx)) });
        let mut c = self.inner.clone();
        let rx = tokio::time::timeout(STEP, c.proxy(out)).await.context("Proxy timed out")??.into_inner();
        Ok(ProxyStream { tx, rx })
    }

    /// Dial `address` as konnectivity-client does: `Ok(Err(error))` is the `DIAL_RSP`'s error.
    pub async fn dial(&self, address: &str) -> anyhow::Result<Result<Conn, String>> {
        let random = random();
        let mut stream = self.open(dial_request(address, random)).await?;
        let rsp = match stream.next().await? {
            Some(Packet { payload: Some(Payload::DialResponse(r)), .. }) => r,
            other => anyhow::bail!("expected DIAL_RSP, got {other:?}"),
        };
        anyhow::ensure!(rsp.random == random, "DIAL_RSP for dial {} instead of {random}", rsp.random);
        if !rsp.error.is_empty() {
            return Ok(Err(rsp.error));
        }
        anyhow::ensure!(rsp.connect_id != 0, "DIAL_RSP without a connect id");
        Ok(Ok(Conn { stream, connect_id: rsp.connect_id }))
    }
}

impl ProxyStream {
    /// The next packet from the server (`None`: the stream ended), within [`STEP`].
    pub async fn next(&mut self) -> anyhow::Result<Option<Packet>> {
        Ok(tokio::time::timeout(STEP, self.rx.message()).await.context("no packet from the server")??)
    }
}

/// What the server sent on a dialled connection up to its `CLOSE_RSP`.
#[derive(Debug, Default)]
pub struct Received {
    pub data: Vec<u8>,
    /// A `CLOSE_RSP` with the connection's id arrived.
    pub closed: bool,
}

impl Conn {
    pub async fn send(&self, bytes: impl Into<Vec<u8>>) -> anyhow::Result<()> {
        self.stream.tx.send(data(self.connect_id, bytes)).await.context("the Proxy stream is gone")
    }

    /// Read `DATA` until `n` bytes arrived.
    pub async fn read_exact(&mut self, n: usize) -> anyhow::Result<Vec<u8>> {
        let mut got = Vec::with_capacity(n);
        while got.len() < n {
            match self.stream.next().await? {
                Some(Packet { payload: Some(Payload::Data(d)), .. }) => {
                    anyhow::ensure!(
                        d.connect_id == self.connect_id,
                        "DATA for {} on {}",
                        d.connect_id,
                        self.connect_id
                    );
                    got.extend_from_slice(&d.data);
                }
                other => anyhow::bail!("after {} of {n} bytes: {other:?}", got.len()),
            }
        }
        Ok(got)
    }

    /// Read `DATA` until `CLOSE_RSP` or the stream's end.
    pub async fn read_to_close(&mut self) -> anyhow::Result<Received> {
        let mut r = Received::default();
        loop {
            match self.stream.next().await? {
                Some(Packet { payload: Some(Payload::Data(d)), .. }) => r.data.extend_from_slice(&d.data),
                Some(Packet { payload: Some(Payload::CloseResponse(c)), .. }) => {
                    anyhow::ensure!(c.connect_id == self.connect_id, "CLOSE_RSP for {}", c.connect_id);
                    r.closed = true;
                }
                Some(other) => anyhow::bail!("unexpected {other:?}"),
                None => return Ok(r),
            }
        }
    }
}
