//! The front ends' wing: what only front-end connections use — their ids, the established slots (`limits.max_connections`), the pending budget, the live TLS connections by client certificate — beside what every wing shares; each running front end's settings; and a connection as it goes from step to step of the pipeline: accepted, handshaken (still pending), its context for the access event, ready to relay, or the exit it leaves by.

use super::refusal::Refusal;
use super::revocation::{self, Live};
use crate::registry::{DialRefusal, DialTimes, Dialed, Tally};
use crate::shared::Shared;
use proxy_core::net::accept::{ConnLimit, ConnPermit};
use proxy_core::net::ids::{ConnId, ConnIds};
use proxy_core::net::pending::{Admitted, Pending};
use proxy_core::net::share::Hold;
use proxy_core::prometheus::IntCounterVec;
use proxy_core::relay::access::Bytes as Moved;
use proxy_core::relay::io::Resettable;
use proxy_core::tunnel::TunnelStream;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

/// Everything a front-end connection uses, from its accept to the end of its relay.
pub(crate) struct Frontends {
    pub(crate) shared: Arc<Shared>,
    pub(crate) ids: ConnIds,
    /// The front ends' established connections (`limits.max_connections`), taken once the
    /// request head is read.
    pub(crate) limit: ConnLimit,
    /// Front-end connections in the TLS handshake or request head (`limits.max_pending` ...).
    pub(crate) pending: Arc<Pending>,
    /// The live TLS front-end connections with a client certificate, ended when revoked.
    pub(crate) certs: Live,
}

/// A front end's connections as the status page shows them.
#[derive(Debug, Default)]
pub(crate) struct FrontendCounts {
    /// Open now.
    pub open: u64,
    /// So far, by result (`ok`, or the reason).
    pub results: BTreeMap<String, u64>,
    /// Refused so far, by reason (`seedgate_rejects_total`).
    pub refusals: BTreeMap<String, u64>,
}

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

impl Frontends {
    pub(crate) fn new(shared: Arc<Shared>, pending: Arc<Pending>, limit: ConnLimit) -> Self {
        Self { shared, ids: ConnIds::default(), limit, pending, certs: Live::default() }
    }

    /// Dial `target` through an agent of `cluster` with the configured timeouts and proxy
    /// strategies (the dial path: [`crate::registry::dial`]).
    pub(crate) async fn dial(&self, cluster: &str, target: &str) -> Result<Dialed, DialRefusal> {
        let cfg = self.shared.config.load();
        let times = DialTimes { dial: cfg.timeouts.dial.get(), open: cfg.agents.open_timeout.get() };
        self.shared.directory.dial(cluster, target, times, &cfg.agents.proxy_strategies).await
    }

    /// What the status page shows of the front end `name`'s connections (read from its metrics).
    pub(crate) fn counts(&self, name: &str) -> FrontendCounts {
        use proxy_core::obs::status::{readings, sum_by};
        let conn = &self.shared.metrics.conn;
        let open = readings(&conn.active)
            .iter()
            .filter(|r| r.label("listener") == name)
            .map(|r| r.value.max(0.0) as u64)
            .sum();
        FrontendCounts {
            open,
            results: sum_by(&readings(&conn.connections), Some(("listener", name)), "result"),
            refusals: sum_by(&readings(&conn.rejects), Some(("listener", name)), "reason"),
        }
    }

    /// Count a connection refused before anything about it is known but its front end (no
    /// access event; nothing is answered).
    pub(crate) fn rejected(&self, fe: &FrontendRt, r: &Refusal) {
        self.shared.metrics.conn.rejects.with_label_values(&[&fe.name, r.label()]).inc();
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

/// A front-end connection after its TLS handshake (if any), still pending.
pub(crate) struct Handshaken {
    pub(crate) io: BoxIo,
    pub(crate) peer: String,
    /// The client certificate's CN.
    pub(crate) cert_cluster: Option<String>,
    pub(crate) pre: Pre,
}

/// A front-end connection before its request head is read: its place in the pending budget,
/// and in its cluster's count of pending work when its front end names the cluster.
pub(crate) struct Pre {
    pub(crate) admitted: Admitted,
    pub(crate) share: Option<Hold>,
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
    pub(crate) session: Option<Arc<Tally>>,
}

impl Ctx {
    /// A connection (or stream) of `fe` from `peer`, started now, with a new id.
    pub(crate) fn new(fes: &Frontends, fe: Arc<FrontendRt>, peer: String, cluster: String, kind: &'static str) -> Self {
        Self {
            conn_id: fes.ids.next(),
            fe,
            peer,
            cluster,
            kind,
            target: "-".into(),
            strategy: "-",
            agent: String::new(),
            started: Instant::now(),
            results: fes.shared.metrics.conn.connections.clone(),
            session: None,
        }
    }

    /// The access event of the connection's end, and its count by result (`ok` for a CONNECT
    /// answered 200 or a forward-proxy connection, unless its client certificate was revoked
    /// while it ran; else the reject reason).
    pub(crate) fn log(&self, code: u16, reason: &str, up: u64, down: u64) {
        if let Some(t) = &self.session {
            t.ended(up, down);
        }
        let ok = (code == 200 || self.kind == "forward") && reason != revocation::REASON;
        let result = if ok { "ok" } else { reason };
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

/// A connection whose protocol is done with it before the relay (a CONNECT answered 200, a
/// port forward dialled): what the relay needs.
pub(crate) struct Ready {
    pub(crate) io: BoxIo,
    pub(crate) stream: TunnelStream,
    /// Bytes the client sent after its request head, for the tunnel stream first.
    pub(crate) pipelined: Vec<u8>,
    pub(crate) ctx: Box<Ctx>,
    /// Its places in the process and cluster limits, boxed: every byte of the relay future is
    /// held by each open stream for its whole life.
    pub(crate) places: Box<Places>,
}

/// What an established stream holds while it relays.
pub(crate) struct Places {
    /// The established connection's slot.
    _permit: ConnPermit,
    /// The stream's place in its cluster's share.
    _share: Hold,
}

impl Ready {
    pub(crate) fn new(
        io: BoxIo,
        stream: TunnelStream,
        pipelined: Vec<u8>,
        ctx: Ctx,
        permit: ConnPermit,
        share: Hold,
    ) -> Self {
        let places = Box::new(Places { _permit: permit, _share: share });
        Self { io, stream, pipelined, ctx: Box::new(ctx), places }
    }
}

/// How a connection leaves the pipeline instead of going on to the relay.
pub(crate) enum Exit {
    /// Served to its end by its protocol (a forward-proxy or gRPC connection).
    Served,
    /// Refused before anything about it is known but its front end: counted, nothing answered,
    /// no access event.
    Early(Refusal),
    /// Refused with what is known about it: counted, answered as its protocol answers, logged.
    Late(Box<Late>),
}

/// A refusal with the connection's context ([`Exit::Late`]).
pub(crate) struct Late {
    pub(crate) ctx: Ctx,
    pub(crate) io: BoxIo,
    pub(crate) reply: Reply,
    pub(crate) refusal: Refusal,
}

/// How a refusal with context is answered.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Reply {
    /// In HTTP/1.x, where the refusal has an answer: before the request head was read (`None`:
    /// in HTTP/1.1, no request counted) or after it (its minor version: the request counted).
    Http(Option<u8>),
    /// Closed unanswered (a port forward: the protocol has no other way to say it), the request
    /// it stands for counted with the status a CONNECT would have been answered with.
    Close,
}

impl Exit {
    /// Refused with `ctx`: see [`Exit::Late`].
    pub(crate) fn late(ctx: Ctx, io: BoxIo, reply: Reply, refusal: Refusal) -> Self {
        Exit::Late(Box::new(Late { ctx, io, reply, refusal }))
    }
}

/// The front ends of [`crate::shared::test_shared`]: ten slots, the default pending budget.
#[cfg(test)]
pub(crate) fn test_frontends() -> Arc<Frontends> {
    let shared = crate::shared::test_shared();
    let budget = shared.config.load().pending_budget();
    let pending = Pending::new(budget, proxy_core::net::pending::PendingMetrics::unregistered());
    let limit = ConnLimit::new(proxy_core::net::accept::Slots::new(10), None);
    Arc::new(Frontends::new(shared, pending, limit))
}
