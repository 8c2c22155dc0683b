//! Front ends: where kube-apiserver's egress and Prometheus enter the tunnel — the connection's life from accept to relay, and what every protocol shares (its context, its access event, the dial).
//!
//! A connection is admitted and handshaken ([`admission`]), then served by its front end's
//! protocol: HTTP CONNECT (kube-apiserver egress, Prometheus https targets; [`connect`]),
//! absolute-form forward proxying (Prometheus http targets; [`forward`]), konnectivity's gRPC
//! ([`grpc`]), or a fixed port forward to one target (`protocol: tcp`; [`port_forward`]). Each refuses what it cannot serve with a [`Refusal`]; proxy credentials are read by
//! [`proxy_auth`].

mod admission;
mod connect;
mod forward;
mod grpc;
mod h2_normalise;
mod port_forward;
mod proxy_auth;
mod refusal;

use crate::registry::dial::{DialRefused, DialTimes, Dialed};
use crate::shared::Shared;
use admission::Handshaken;
use proxy_core::net::guard::Active;
use proxy_core::net::ids::ConnId;
use proxy_core::net::share::Hold;
use proxy_core::prometheus::IntCounterVec;
use proxy_core::relay::access::Bytes as Moved;
use proxy_core::relay::io::Resettable;
use proxy_core::tunnel::TunnelStream;
pub(crate) use refusal::Refusal;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

/// A running front end.
pub(crate) struct FrontendRt {
    pub name: Arc<str>,
    /// Fixed cluster, or `None` when the client certificate's CN or the proxy credentials name it.
    pub cluster: Option<String>,
    /// `cluster_from: proxy_authorization`: the token each request's proxy credentials must carry
    /// as the password (their user name is the cluster).
    pub proxy_token: Option<Arc<str>>,
    /// `grpc`: konnectivity's `ProxyService` over HTTP/2 rather than CONNECT.
    pub grpc: bool,
    /// `tcp`: a port forward, every connection to this target.
    pub target: Option<Arc<str>>,
}

/// Everything known about one front-end connection (or gRPC `Proxy` stream), for its access log.
pub(crate) struct Ctx {
    pub(crate) conn_id: ConnId,
    pub(crate) fe: Arc<FrontendRt>,
    pub(crate) peer: String,
    pub(crate) cluster: String,
    pub(crate) kind: &'static str,
    pub(crate) target: String,
    /// How the agent was chosen (the proxy strategy) and its node, once a dial succeeded.
    pub(crate) strategy: &'static str,
    pub(crate) agent: String,
    pub(crate) started: Instant,
    /// `seedgate_connections_total`, counted once per connection when it is logged.
    pub(crate) results: IntCounterVec,
    /// The figures of the agent session a dial reached (its bytes are added when logged).
    pub(crate) session: Option<Arc<crate::session::Tally>>,
}

impl Ctx {
    /// The access event of the connection's end, and its count by result (`ok` for a CONNECT
    /// answered 200 or a forward-proxy connection, else the reject reason).
    pub(crate) fn log(&self, code: u16, reason: &str, up: u64, down: u64) {
        if let Some(t) = &self.session {
            t.ended(up, down);
        }
        let result = if code == 200 || self.kind == "forward" { "ok" } else { reason };
        self.results.with_label_values(&[&*self.fe.name, self.cluster.as_str(), result]).inc();
        proxy_core::access_event!(
            "connection closed", Moved::new(up, down), self.started, reason;
            conn_id = %self.conn_id,
            frontend = %self.fe.name,
            client = %self.peer,
            cluster = %self.cluster,
            kind = self.kind,
            target = %self.target,
            strategy = self.strategy,
            agent = %self.agent,
            code
        );
    }

    /// The agent a dial reached: its stream and its place in the cluster's share, with how it
    /// was chosen noted for the access event.
    pub(crate) fn dialed(&mut self, d: Dialed) -> (TunnelStream, Hold) {
        self.strategy = d.strategy.as_str();
        self.agent = d.node;
        self.session = Some(d.tally);
        (d.stream, d.share)
    }
}

/// A front-end stream of any kind (TCP, TLS over TCP, Unix socket), boxed so every kind of
/// front end shares one (small) relay future.
pub(crate) type BoxIo = Box<dyn Resettable>;

/// An accepted front-end connection, before any handshake.
pub(crate) enum Accepted {
    Tcp(tokio::net::TcpStream, Option<tokio_rustls::TlsAcceptor>),
    Unix(tokio::net::UnixStream),
}

/// Serve one accepted front-end connection to its end. The handshake, the request head and
/// the dial run in a boxed future that is freed before the relay, so a long-lived (mostly
/// idle) stream holds only the relay's state. `ip`: the TCP peer's address (`None` for a Unix
/// socket), which the pending budget counts by.
pub(crate) fn connection(
    shared: Arc<Shared>,
    fe: Arc<FrontendRt>,
    conn: Accepted,
    peer: String,
    ip: Option<IpAddr>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let active = Active::new(shared.metrics.conn.active.with_label_values(&[&fe.name]));
    let prepare = Box::pin(admission::prepare(shared.clone(), fe, conn, peer, ip));
    async move {
        let _active = active;
        if let Some(r) = prepare.await {
            connect::relay(&shared, r).await;
        }
    }
}

/// Serve a connection by its front end's protocol: gRPC to its end, a port forward or a CONNECT
/// up to the relay.
async fn by_protocol(shared: Arc<Shared>, fe: Arc<FrontendRt>, conn: Handshaken) -> Option<connect::Ready> {
    if fe.grpc {
        grpc::serve(shared, fe, conn).await;
        return None;
    }
    if let Some(target) = fe.target.clone() {
        return port_forward::serve(shared, fe, target, conn).await;
    }
    connect::serve(shared, fe, conn).await
}

/// Count a connection refused before anything about it is known but its front end (no access
/// event; nothing is answered).
pub(crate) fn rejected<T>(shared: &Shared, fe: &FrontendRt, r: &Refusal) -> Option<T> {
    shared.metrics.conn.rejects.with_label_values(&[&fe.name, r.label()]).inc();
    None
}

/// Dial `target` through an agent of `cluster` with the configured timeouts and proxy
/// strategies (the dial path: [`crate::registry::dial`]).
pub(crate) async fn dial(shared: &Shared, cluster: &str, target: &str) -> Result<Dialed, DialRefused> {
    let cfg = shared.config.load();
    let times = DialTimes { dial: cfg.timeouts.dial.get(), open: cfg.agents.open_timeout.get() };
    shared.directory.dial(cluster, target, times, &cfg.agents.proxy_strategies).await
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn connection_future_stays_small() {
        let shared = crate::shared::test_shared();
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = tokio::net::TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let fe = std::sync::Arc::new(super::FrontendRt {
            name: "fe".into(),
            cluster: Some("c".into()),
            proxy_token: None,
            grpc: false,
            target: None,
        });
        let f = super::connection(shared, fe, super::Accepted::Tcp(c, None), "peer".into(), None);
        // Every byte here is held by each open tunnel stream for its whole life (the pre-relay
        // phases are boxed and freed before the relay).
        let size = std::mem::size_of_val(&f);
        eprintln!("front-end connection future: {size} bytes");
        assert!(size <= 768, "per-connection future grew to {size} bytes");
    }
}
