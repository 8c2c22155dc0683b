//! The CONNECT front end: the request head (read under the admission's deadline), the connection slot, proxy credentials, the dial, the 200, and the relay; an absolute-form request hands the connection to [`super::forward`].

use super::admission::{Handshaken, Pre};
use super::forward::forward;
use super::proxy_auth::proxy_auth_cluster;
use super::{BoxIo, Ctx, FrontendRt, Refusal, dial, rejected};
use crate::shared::Shared;
use proxy_core::net::accept::ConnPermit;
use proxy_core::net::guard::Active;
use proxy_core::net::share::Hold;
use proxy_core::relay::copy::{Meters, Outcome, Stop, transfer};
use proxy_core::relay::io::Prefixed;
use proxy_core::tunnel::TunnelStream;
use proxy_wire::http_head::{self, HeadReader, RequestHead};
use std::sync::Arc;
use std::time::Instant;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const READ_CHUNK: usize = 4096;

/// A CONNECT that was answered 200: what the relay needs.
pub(super) struct Ready {
    io: BoxIo,
    stream: TunnelStream,
    pipelined: Vec<u8>,
    ctx: Box<Ctx>,
    /// Its places in the process and cluster limits, boxed: every byte of the relay future is
    /// held by each open stream for its whole life.
    _places: Box<Places>,
}

impl Ready {
    pub(super) fn new(
        io: BoxIo,
        stream: TunnelStream,
        pipelined: Vec<u8>,
        ctx: Ctx,
        permit: ConnPermit,
        share: Hold,
    ) -> Self {
        Self { io, stream, pipelined, ctx: Box::new(ctx), _places: Box::new(Places { _permit: permit, _share: share }) }
    }
}

/// What an established stream holds while it relays.
struct Places {
    /// The established connection's slot.
    _permit: ConnPermit,
    /// The stream's place in its cluster's share.
    _share: Hold,
}

/// Serve one front-end connection (after TLS, if any) up to the relay. `cert_cluster` is the
/// client certificate's CN when the front end derives the cluster from it. `Some` for a CONNECT
/// that was answered 200; everything else is answered (and logged) here.
pub(super) async fn serve(shared: Arc<Shared>, fe: Arc<FrontendRt>, conn: Handshaken) -> Option<Ready> {
    let Handshaken { mut io, peer, cert_cluster, pre } = conn;
    let Pre { admitted, share: pending } = pre;
    let cfg = shared.config.load_full();
    let m = &shared.metrics;
    let conn_id = shared.ids.next();
    let started = Instant::now();
    // With proxy credentials the cluster is known once the request head is read.
    let conn_cluster = fe.cluster.clone().or(cert_cluster);
    if conn_cluster.is_none() && fe.proxy_token.is_none() {
        let r = Refusal::NoClusterIdentity;
        m.conn.connections.with_label_values(&[&fe.name, "-", r.label()]).inc();
        let _ = io.write_all(&r.answer(1)).await;
        return rejected(&shared, &fe, &r);
    }
    let mut ctx = Ctx {
        conn_id,
        fe: fe.clone(),
        peer,
        cluster: conn_cluster.clone().unwrap_or_else(|| "-".into()),
        kind: "-",
        target: "-".into(),
        strategy: "-",
        agent: String::new(),
        started,
        results: m.conn.connections.clone(),
        session: None,
    };

    // Read the request head under what is left of the handshake deadline.
    let mut buf = Vec::with_capacity(1024);
    let read = admitted.within(read_head(&mut io, &mut buf, cfg.limits.request_head_max)).await;
    let head: RequestHead = match read.map_err(Refusal::from).and_then(|r| r) {
        Ok(h) => h,
        Err(r) => return refuse(&shared, &ctx, &mut io, None, &r).await,
    };
    // Routed (the head names where to go): from the pending budget to an established slot.
    drop(pending);
    let permit = match admitted.establish(&shared.limit).await {
        Ok(p) => p,
        Err(r) => return refuse(&shared, &ctx, &mut io, Some(head.version), &r.into()).await,
    };

    if head.is_connect() {
        ctx.kind = "connect";
        ctx.target = head.target.clone();
        let target = match head.connect_authority() {
            Ok((h, p)) if h.contains(':') => format!("[{h}]:{p}"),
            Ok((h, p)) => format!("{h}:{p}"),
            Err(e) => return refuse(&shared, &ctx, &mut io, Some(head.version), &Refusal::BadConnectTarget(e)).await,
        };
        let cluster = match (&fe.proxy_token, conn_cluster) {
            (Some(token), _) => match proxy_auth_cluster(head.header("proxy-authorization"), token) {
                Ok(c) => c,
                Err(e) => return refuse(&shared, &ctx, &mut io, Some(head.version), &Refusal::ProxyAuth(e)).await,
            },
            (None, c) => c.expect("checked above"),
        };
        ctx.cluster = cluster.clone();
        // The target, never the Host header, says where to go.
        let (stream, share) = match dial(&shared, &cluster, &target).await {
            Ok(d) => ctx.dialed(d),
            Err(e) => return refuse(&shared, &ctx, &mut io, Some(head.version), &e.into()).await,
        };
        // 200 alone in its write: the egress dialer fails if tunnel bytes follow the head.
        if io.write_all(&http_head::connect_established(head.version)).await.is_err() {
            ctx.log(200, "client_write_error", 0, 0);
            return None;
        }
        m.requests.with_label_values(&[&fe.name, "connect", "200"]).inc();
        let pipelined = buf.split_off(head.len);
        Some(Ready::new(io, stream, pipelined, ctx, permit, share))
    } else if head.target.starts_with("http://") {
        ctx.kind = "forward";
        ctx.target = head.target.clone();
        drop(head);
        // Hand the connection, with the bytes already read, to an HTTP/1.1 server that
        // forwards each request through its own tunnel stream (keep-alive works as usual).
        let io = Prefixed::new(buf, io);
        forward(shared.clone(), &ctx, io).await;
        drop(permit);
        None
    } else {
        let r = Refusal::NotAProxyRequest { method: head.method.clone(), target: head.target.clone() };
        refuse(&shared, &ctx, &mut io, Some(head.version), &r).await
    }
}

/// Read a request head into `buf` (which keeps any bytes after it).
async fn read_head(io: &mut BoxIo, buf: &mut Vec<u8>, cap: usize) -> Result<RequestHead, Refusal> {
    // One reader across reads, so each read costs only its new bytes.
    let mut reader = HeadReader::new(cap);
    loop {
        if let Some(h) = reader.poll(buf).map_err(Refusal::BadHead)? {
            return Ok(h);
        }
        let old = buf.len();
        buf.resize(old + READ_CHUNK.min(cap + 1 - old), 0);
        match io.read(&mut buf[old..]).await {
            Ok(0) | Err(_) => {
                buf.truncate(old);
                return Err(Refusal::ClosedEarly);
            }
            Ok(n) => buf.truncate(old + n),
        }
    }
}

/// Refuse a front-end connection before its relay: counted by reason, answered where the
/// refusal has an answer, logged. `version`: the request head's, once it was read (then the
/// refusal answers a request, counted in `seedgate_requests_total`); before, the answer is in
/// HTTP/1.1 and no request is counted.
async fn refuse<T>(shared: &Shared, ctx: &Ctx, io: &mut BoxIo, version: Option<u8>, r: &Refusal) -> Option<T> {
    let (m, status) = (&shared.metrics, r.status());
    m.conn.rejects.with_label_values(&[&ctx.fe.name, r.label()]).inc();
    match version {
        _ if status == 0 => {}
        None => {
            let _ = io.write_all(&r.answer(1)).await;
        }
        Some(v) => {
            m.requests.with_label_values(&[&ctx.fe.name, ctx.kind, &status.to_string()]).inc();
            let _ = io.write_all(&r.answer(v)).await;
            let _ = io.shutdown().await;
        }
    }
    ctx.log(status, r.label(), 0, 0);
    None
}

/// Relay a CONNECT client and its tunnel stream until both ends close, the idle timeout, a
/// drain of the cluster, or the end of the shutdown grace period.
pub(super) async fn relay(shared: &Shared, r: Ready) {
    let Ready { io, mut stream, pipelined, ctx, _places } = r;
    let m = &shared.metrics;
    let _active = Active::new(m.streams_active.with_label_values(&[&ctx.cluster]));
    let replayed = pipelined.len() as u64;
    if !pipelined.is_empty() && stream.write_all(&pipelined).await.is_err() {
        ctx.log(200, "tunnel_write_error", 0, 0);
        return;
    }
    drop(pipelined);
    let meters = Meters {
        to_upstream: Some(m.tunnel_bytes.with_label_values(&[&ctx.cluster, "to_shoot"])),
        to_client: Some(m.tunnel_bytes.with_label_values(&[&ctx.cluster, "to_seed"])),
    };
    let idle = shared.config.load().timeouts.idle.get();
    let end = shared.directory.stream_end(&ctx.cluster);
    let mut t = transfer(io, stream, idle, meters);
    let stop = std::pin::pin!(proxy_core::relay::stop_on(&end, &shared.shutdown.kill, Stop::ClusterDrained));
    let done = proxy_core::relay::run(&mut t, stop).await;
    if matches!(done.outcome, Outcome::Stopped(Stop::ClusterDrained)) {
        m.stream_drains.with_label_values(&[&ctx.cluster]).inc();
    }
    ctx.log(200, done.outcome.label(), done.bytes.to_upstream + replayed, done.bytes.to_client);
}
