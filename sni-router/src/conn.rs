//! One client connection: PROXY header(s), protocol detection, routing, upstream connect, replay, relay, access log.

use crate::refusal::{Answer, Proto, Reject, closed_early, read_failed};
use crate::running::ListenerRt;
use crate::shared::Shared;
use crate::table::{ConnectQuery, Route, Table};
use crate::upstream::{self, Connected};
use bytes::BufMut as _;
use proxy_core::net::ConnectFailure;
use proxy_core::net::accept::ConnPermit;
use proxy_core::net::ids::ConnId;
use proxy_core::net::share::{Cap, Hold, Kind};
use proxy_core::obs::Untrusted;
use proxy_core::prometheus::IntGauge;
use proxy_core::relay::access::Bytes;
use proxy_core::relay::copy::{Meters, Stop, transfer_tcp};
use proxy_wire::client_hello::{self, HelloError, HelloParser, Status};
use proxy_wire::http_head::{self, Detect3, HeadReader, RequestHead};
use proxy_wire::proxy_protocol::{self, Command, Detect, V2Options};
use seedgate_config::RouterConfig;
use seedgate_config::router::{ConnectUnmatched, ProxyProtocolMode, SendProxy};
use socket2::SockRef;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tracing::Instrument;

/// Largest PROXY header accepted (v2 with TLVs); one header per stacking level.
const PROXY_MAX: usize = 4096;
/// Bytes read per call while looking for the routing information.
const READ_CHUNK: usize = 4096;
/// How long a rejected client gets to read our answer before the socket closes.
const LINGER: Duration = Duration::from_secs(1);
const LINGER_BYTES: usize = 64 * 1024;

/// Everything learnt before the upstream is chosen.
struct Pre {
    buf: Vec<u8>,
    /// Start of the payload (after PROXY headers).
    off: usize,
    /// Bytes at `off` that belong to us, not the upstream (the CONNECT head).
    head_len: usize,
    client: SocketAddr,
    dst: Option<SocketAddr>,
    proto: Proto,
    sni: Option<Box<str>>,
    /// The protocols offered, joined only if the access event is logged.
    alpn: Vec<String>,
    connect_target: Option<Box<str>>,
    http_version: u8,
    // For the access log:
    conn_id: ConnId,
    peer: SocketAddr,
    up_addr: Option<SocketAddr>,
    started: Instant,
    replayed: u64,
}

impl Pre {
    fn new(conn_id: ConnId, peer: SocketAddr, started: Instant) -> Self {
        Self {
            buf: Vec::with_capacity(READ_CHUNK),
            off: 0,
            head_len: 0,
            client: peer,
            dst: None,
            proto: Proto::Unknown,
            sni: None,
            alpn: Vec::new(),
            connect_target: None,
            http_version: 1,
            conn_id,
            peer,
            up_addr: None,
            started,
            replayed: 0,
        }
    }
}

/// Read more bytes into `buf`, up to `cap` in total. `Ok(false)` at end of stream.
async fn fill(s: &mut TcpStream, buf: &mut Vec<u8>, cap: usize) -> std::io::Result<bool> {
    let want = cap.saturating_sub(buf.len()).min(READ_CHUNK);
    if want == 0 {
        return Ok(true);
    }
    buf.reserve(want);
    // Into the spare capacity: zeroing the bytes first, only for the read to overwrite them,
    // had been an eighth of a connection's instructions.
    let n = s.read_buf(&mut (&mut *buf).limit(want)).await?;
    Ok(n > 0)
}

/// Read PROXY header(s) if the listener takes them. Returns (real client, inner destination).
async fn read_proxy_headers(
    s: &mut TcpStream,
    buf: &mut Vec<u8>,
    off: &mut usize,
    peer: SocketAddr,
    table: &Table,
    depth: u8,
) -> Result<(SocketAddr, Option<SocketAddr>), Reject> {
    let mut client = peer;
    let mut dst = None;
    let mut seen = 0u8;
    let mut local_only = false;
    // Who wrote the next header: the TCP peer for the outermost one, then the host the
    // previous header names as its source (a load balancer relays the node's header).
    let mut sender = peer;
    while seen < depth {
        match proxy_protocol::detect(&buf[*off..]) {
            Detect::NotProxy => break,
            Detect::Incomplete => {
                if !fill(s, buf, *off + PROXY_MAX).await.map_err(read_failed)? {
                    return Err(if local_only {
                        Reject::new("pp_local_health_check", Answer::Close)
                    } else {
                        closed_early()
                    });
                }
            }
            Detect::ProxyV1 | Detect::ProxyV2 => {
                if !table.trusted(sender.ip()) {
                    return Err(Reject::new("pp_untrusted_source", Answer::Close));
                }
                let h = loop {
                    match proxy_protocol::parse(&buf[*off..]) {
                        Ok(Some(h)) => break h,
                        Ok(None) => {
                            if buf.len() - *off >= PROXY_MAX {
                                return Err(Reject::new("pp_too_large", Answer::Close));
                            }
                            if !fill(s, buf, *off + PROXY_MAX).await.map_err(read_failed)? {
                                return Err(closed_early());
                            }
                        }
                        Err(e) => return Err(Reject::new(e.reason(), Answer::Close)),
                    }
                };
                *off += h.len;
                seen += 1;
                // LOCAL (load balancer health check), UNSPEC and UNIX carry no usable address:
                // the connection keeps the addresses it had.
                match (h.command, h.source, h.destination) {
                    (Command::Proxy, Some(src), Some(d)) => {
                        // The outermost header names the real client (for logs and source
                        // ACLs); the innermost one names where the client was going (routing).
                        if seen == 1 {
                            client = src;
                        }
                        sender = src;
                        dst = Some(d);
                        local_only = false;
                        // A destination route takes the connection without reading the
                        // payload: when nothing follows yet, do not wait for bytes that may be
                        // another header (a server-speaks-first upstream would never send them).
                        if *off == buf.len() && table.by_destination(d).is_some() {
                            break;
                        }
                    }
                    _ => local_only = seen == 1 || local_only,
                }
            }
        }
    }
    if seen == 0 && table.proxy_mode() == ProxyProtocolMode::Required {
        return Err(Reject::new("pp_missing", Answer::Close));
    }
    Ok((client, dst))
}

/// The pre-routing phase (run under the handshake deadline by the caller).
async fn preroute(s: &mut TcpStream, pre: &mut Pre, table: &Table, cfg: &RouterConfig) -> Result<Arc<Route>, Reject> {
    if table.proxy_mode() != ProxyProtocolMode::Off {
        let depth = cfg.limits.proxy_protocol_depth;
        let (client, dst) = read_proxy_headers(s, &mut pre.buf, &mut pre.off, pre.client, table, depth).await?;
        pre.client = client;
        pre.dst = dst;
    }
    if let Some(d) = pre.dst
        && let Some(r) = table.by_destination(d)
    {
        pre.proto = Proto::Raw;
        return Ok(r.clone());
    }
    // Detect what follows: a TLS handshake record or an HTTP request line.
    loop {
        let rest = &pre.buf[pre.off..];
        if let Some(&b) = rest.first() {
            if b == 0x16 {
                pre.proto = Proto::Tls;
                break;
            }
            match http_head::looks_like_http(rest) {
                Detect3::Yes => {
                    pre.proto = Proto::Connect;
                    break;
                }
                Detect3::No => return Err(Reject::new("unknown_protocol", Answer::Close)),
                Detect3::Incomplete => {}
            }
        }
        if !fill(s, &mut pre.buf, pre.off + READ_CHUNK).await.map_err(read_failed)? {
            return Err(closed_early());
        }
    }
    match pre.proto {
        Proto::Tls => route_tls(s, pre, table, cfg).await,
        _ => route_connect(s, pre, table, cfg).await,
    }
}

async fn route_tls(s: &mut TcpStream, pre: &mut Pre, table: &Table, cfg: &RouterConfig) -> Result<Arc<Route>, Reject> {
    let cap = cfg.limits.client_hello_max;
    let mut parser = HelloParser::new(cap);
    let info = loop {
        match parser.parse(&pre.buf[pre.off..]) {
            Ok(Status::Complete(info)) => break info,
            Ok(Status::Incomplete) => {
                if pre.buf.len() - pre.off >= cap {
                    return Err(Reject::new("client_hello_too_large", Answer::Alert(client_hello::ALERT_DECODE_ERROR)));
                }
                if !fill(s, &mut pre.buf, pre.off + cap).await.map_err(read_failed)? {
                    return Err(closed_early());
                }
            }
            Err(e) => {
                let reason = match e {
                    HelloError::NotTls => "not_tls",
                    HelloError::TooLarge => "client_hello_too_large",
                    HelloError::Malformed(_) => "client_hello_malformed",
                };
                tracing::debug!(error = %e, "bad ClientHello");
                return Err(Reject::new(reason, Answer::Alert(client_hello::ALERT_DECODE_ERROR)));
            }
        }
    };
    pre.alpn = info.alpn;
    pre.sni = info.sni.map(String::into_boxed_str);
    let route = match &pre.sni {
        Some(name) => table
            .by_sni(name)
            .or_else(|| table.default_route())
            .ok_or_else(|| Reject::new("unknown_sni", Answer::Alert(client_hello::ALERT_UNRECOGNIZED_NAME)))?,
        None => table
            .default_route()
            .ok_or_else(|| Reject::new("no_sni", Answer::Alert(client_hello::ALERT_UNRECOGNIZED_NAME)))?,
    };
    Ok(route.clone())
}

async fn route_connect(
    s: &mut TcpStream,
    pre: &mut Pre,
    table: &Table,
    cfg: &RouterConfig,
) -> Result<Arc<Route>, Reject> {
    let cap = cfg.limits.connect_head_max;
    // One reader across reads, so each read costs only its new bytes.
    let mut reader = HeadReader::new(cap);
    let head: RequestHead = loop {
        match reader.poll(&pre.buf[pre.off..]) {
            Ok(Some(h)) => break h,
            Ok(None) => {
                if !fill(s, &mut pre.buf, pre.off + cap).await.map_err(read_failed)? {
                    return Err(closed_early());
                }
            }
            Err(e) => {
                let status = if matches!(e, http_head::HeadError::TooLarge) { 431 } else { 400 };
                return Err(Reject::new(e.reason(), Answer::Http(status, format!("bad request: {e}"))));
            }
        }
    };
    pre.head_len = head.len;
    pre.http_version = head.version;
    if !head.is_connect() {
        return Err(Reject::new(
            "not_connect",
            Answer::Http(405, format!("method {} not allowed: this port serves CONNECT and TLS", head.method)),
        ));
    }
    let (host, port) = head
        .connect_authority()
        .map_err(|e| Reject::new(e.reason(), Answer::Http(400, format!("bad CONNECT target: {e}"))))?;
    pre.connect_target = Some(head.target.as_str().into());
    let authority = if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") };
    let header = |name: &str| head.header(name);
    let q = ConnectQuery { authority: &authority, header: &header };
    // CONNECT never falls back to the default route: the allowlist is strict.
    match table.by_connect(&q) {
        Some(r) => Ok(r.clone()),
        None => {
            // Name what was asked for (the routing header values when present) in the reason.
            let asked = table
                .connect_headers()
                .find_map(|h| head.header(h).map(|v| format!("{h}: {}", String::from_utf8_lossy(v))))
                .unwrap_or_else(|| format!("authority {authority}"));
            Err(match table.connect_unmatched() {
                ConnectUnmatched::Forbidden => {
                    Reject::new("connect_no_route", Answer::Http(403, format!("no route for {asked}")))
                }
                ConnectUnmatched::Redirect => {
                    Reject::new("connect_no_route", Answer::Redirect(format!("https://{host}:443")))
                }
            })
        }
    }
}

/// Send the answer (alert or HTTP status), then close without resetting the client before it
/// could read it: shut our side, discard what it still sends for a moment.
async fn refuse(mut s: TcpStream, answer: &Answer, http_version: u8) {
    let bytes = match answer {
        Answer::Abort => return,
        Answer::Close => Vec::new(),
        Answer::Alert(code) => client_hello::alert_record(*code).to_vec(),
        Answer::Http(status, msg) => http_head::error_response(http_version, *status, msg),
        Answer::Redirect(loc) => http_head::redirect_response(http_version, loc),
    };
    if !bytes.is_empty() {
        let _ = tokio::time::timeout(LINGER, s.write_all(&bytes)).await;
    }
    linger_close(&mut s).await;
}

async fn linger_close(s: &mut TcpStream) {
    let _ = SockRef::from(&*s).shutdown(std::net::Shutdown::Write);
    let mut sink = [0u8; 2048];
    let mut total = 0;
    let _ = tokio::time::timeout(LINGER, async {
        while total < LINGER_BYTES {
            match s.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
        }
    })
    .await;
}

/// The PROXY header to send upstream, if the route wants one.
fn proxy_header_out(route: &Route, pre: &Pre, client: &TcpStream) -> Option<Vec<u8>> {
    if route.send_proxy == SendProxy::Off {
        return None;
    }
    // The original destination: the PROXY one when there was one, else our listener address.
    let dst = pre.dst.or_else(|| client.local_addr().ok()).unwrap_or(pre.peer);
    match route.send_proxy {
        SendProxy::Off => None,
        SendProxy::V1 => Some(proxy_protocol::encode_v1(pre.client, dst)),
        SendProxy::V2 => {
            let id = pre.conn_id.to_string();
            let opts =
                V2Options { authority: pre.sni.as_deref(), unique_id: Some(id.as_bytes()), ..V2Options::default() };
            proxy_protocol::try_encode_v2(pre.client, dst, &opts).ok()
        }
    }
}

/// A connection ready to relay: the two sockets and the route inline, the rest in one box.
struct Ready {
    client: TcpStream,
    up: TcpStream,
    route: Arc<Route>,
    held: Box<Held>,
}

/// What a relayed connection holds but rarely touches. Kept out of the task's future so the
/// task stays in a smaller allocation (tokio rounds task cells up to 128-byte multiples).
struct Held {
    /// What was learnt before the relay, for the access log (its buffer is already freed).
    log: Pre,
    _permit: proxy_core::net::accept::ConnPermit,
    /// The connection's place in its route's share.
    _share: Hold,
    _active: proxy_core::net::guard::Active<IntGauge>,
    _guard: upstream::UpstreamGuard,
    idle: std::time::Duration,
}

/// Serve one accepted connection to its end.
pub(crate) fn serve(
    shared: Arc<Shared>,
    lst: Arc<ListenerRt>,
    stream: TcpStream,
    peer: SocketAddr,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let conn_id = shared.ids.next();
    // DEBUG level: a recorded span costs ~450 B per open connection; at INFO the access-log
    // event carries everything, and the events inside a connection are DEBUG anyway.
    let span = tracing::debug_span!("conn", id = %conn_id, listener = %lst.name);
    // Everything before the relay is a boxed future of its own: its state is freed when it
    // finishes, so a long-lived (mostly idle) connection carries only the relay's small state.
    // The span covers the phases that log (at DEBUG); the relay logs only the access event,
    // which carries the connection id itself, so the long-lived future does not hold a span.
    let prepare = Box::pin(prepare(shared.clone(), lst.clone(), stream, peer, conn_id).instrument(span));
    async move {
        let Some(Ready { client, up, route, held }) = prepare.await else { return };
        let meters = Meters {
            to_upstream: Some(route.meters.to_upstream.clone()),
            to_client: Some(route.meters.to_client.clone()),
        };
        let mut relay = transfer_tcp(client, up, held.idle, meters);
        // The route's token ends its connections: at a drain deadline after a reload changed the
        // route, or (as a child of the kill token) at the end of the shutdown grace.
        let stop = std::pin::pin!(proxy_core::relay::stop_on(&route.end, &shared.shutdown.kill, Stop::RouteDrained));
        let done = proxy_core::relay::run(&mut relay, stop).await;
        let reason = done.outcome.label();
        if let Some(c) = lst.closes(&shared.metrics, &done.outcome) {
            c.inc();
        }
        let log = &held.log;
        let bytes = Bytes::new(done.bytes.to_upstream + log.replayed, done.bytes.to_client);
        access_log(&lst.name, log, Some(&route.name), bytes, reason);
    }
}

/// Pre-routing, routing, upstream connect and hand-over. `None` when the connection was
/// refused (answered, counted and logged here).
async fn prepare(
    shared: Arc<Shared>,
    lst: Arc<ListenerRt>,
    mut client: TcpStream,
    peer: SocketAddr,
    conn_id: ConnId,
) -> Option<Ready> {
    let started = Instant::now();
    let active = lst.active_guard();
    let cfg = shared.config.load_full();
    let name = &*lst.name;

    let mut pre = Pre::new(conn_id, peer, started);
    let (route, holds, permit) = match admit(&shared, &lst, &mut client, &mut pre, &cfg).await {
        Ok(admitted) => admitted,
        Err((rej, route)) => {
            reject(&shared, name, client, &pre, route.as_ref(), rej).await;
            return None;
        }
    };

    let connect_timeout = cfg.timeouts.connect.get();
    let connected = connect_upstream(&shared, name, &route, &pre, &cfg).await;
    // Connected or failed: no longer pending work of the route.
    drop(holds.pending);
    let Connected { stream: mut up, addr: up_addr, guard } = match connected {
        Ok(c) => c,
        Err(rej) => {
            reject(&shared, name, client, &pre, Some(&route), rej).await;
            return None;
        }
    };
    pre.up_addr = Some(up_addr);
    let handover = hand_over(&mut client, &mut up, &route, &pre);
    let replayed = match tokio::time::timeout(connect_timeout, handover).await.unwrap_or(Err("handover_timeout")) {
        Ok(n) => n,
        Err(reason) => {
            let m = &shared.metrics;
            m.conn.rejects.with_label_values(&[name, reason]).inc();
            m.conn.connections.with_label_values(&[name, &route.name, reason]).inc();
            access_log(name, &pre, Some(&route.name), Bytes::default(), reason);
            return None;
        }
    };
    pre.replayed = replayed;
    route.meters.to_upstream.inc_by(pre.replayed);
    route.meters.ok.inc();
    route.minutes.add(crate::table::ROUTED, 1);
    // The pre-routing buffer is not needed any more: an idle relay holds no buffer.
    pre.buf = Vec::new();
    Some(Ready {
        client,
        up,
        route,
        held: Box::new(Held {
            log: pre,
            _permit: permit,
            _share: holds.established,
            _active: active,
            _guard: guard,
            idle: cfg.timeouts.idle.get(),
        }),
    })
}

/// A connection's way from accept to an established slot: its place in the pending budget, the
/// pre-routing phase under that admission's deadline, the route's source check and shares, then
/// the connection limit. A refusal comes with the route, once known.
async fn admit(
    shared: &Shared,
    lst: &ListenerRt,
    client: &mut TcpStream,
    pre: &mut Pre,
    cfg: &RouterConfig,
) -> Result<(Arc<Route>, RouteHolds, ConnPermit), (Reject, Option<Arc<Route>>)> {
    let table = lst.table.load_full();
    let name = &*lst.name;
    // The pending budget is keyed by the TCP peer: a PROXY header is itself unrouted input. A
    // trusted proxy's clients all share its address, so it is exempt from the per-source cap.
    let exempt = table.proxy_mode() != ProxyProtocolMode::Off && table.trusted(pre.peer.ip());
    let admitted =
        shared.pending.admit(pre.peer.ip(), exempt).map_err(|r| (Reject::admission(r.into(), pre.proto), None))?;
    let routed = admitted.within(preroute(client, pre, &table, cfg)).await;
    let route = match routed.map_err(|r| Reject::admission(r, pre.proto)).and_then(|r| r) {
        Ok(r) => r,
        Err(rej) => return Err((rej, None)),
    };
    let m = &shared.metrics;
    if let Some(h) = lst.handshake_seconds(m, pre.proto.index(), pre.proto.label()) {
        h.observe(pre.started.elapsed().as_secs_f64());
    }

    if !route.source_allowed(pre.client.ip()) {
        let answer = match pre.proto {
            Proto::Tls => Answer::Alert(49), // access_denied
            Proto::Connect => Answer::Http(403, format!("source {} not allowed for this destination", pre.client.ip())),
            Proto::Raw | Proto::Unknown => Answer::Close,
        };
        return Err((Reject::new("source_not_allowed", answer), Some(route)));
    }
    // The route's share of the process limits, taken at once or refused: one shoot's flood (or
    // its upstream that does not answer) cannot take what the other routes need.
    let holds = match take_shares(shared, name, &route, cfg) {
        Ok(h) => h,
        Err(full) => {
            let msg = format!("over capacity: route {} holds its share of {}", route.name, full.what());
            return Err((Reject::new(full.label(), over_capacity(pre.proto, msg)), Some(route)));
        }
    };
    // Routed: from the pending budget to an established slot. At the connection limit it waits
    // (still pending, so still evictable) for what is left of its deadline.
    match admitted.establish(&lst.limit).await {
        Ok(permit) => Ok((route, holds, permit)),
        Err(r) => Err((Reject::admission(r, pre.proto), Some(route))),
    }
}

/// A route's share taken by one connection: routed (until it ends) and pending (until its
/// upstream connect is done).
struct RouteHolds {
    established: Hold,
    pending: Hold,
}

/// Which of a route's shares was full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ShareFull {
    Connections,
    Pending,
}

impl ShareFull {
    fn label(self) -> &'static str {
        match self {
            ShareFull::Connections => "route_connection_limit",
            ShareFull::Pending => "route_pending_limit",
        }
    }

    /// What the share counts, as the refusal names it.
    fn what(self) -> &'static str {
        match self {
            ShareFull::Connections => "connections",
            ShareFull::Pending => "pending",
        }
    }
}

/// Take the connection's place in its route's shares of routed and pending connections, or say
/// which share is full.
fn take_shares(shared: &Shared, listener: &str, route: &Route, cfg: &RouterConfig) -> Result<RouteHolds, ShareFull> {
    let (l, own) = (&cfg.limits, route.cfg.limits.unwrap_or_default());
    let tenant = route.tenant(&shared.shares, listener);
    let pending_cap = Cap::new(own.max_pending, l.tenant_share, l.max_pending);
    let pending =
        tenant.try_take_at(Kind::Pending, pending_cap, shared.shares.total(Kind::Pending)).ok_or(ShareFull::Pending)?;
    let cap = Cap::new(own.max_connections, l.tenant_share, l.max_connections);
    let established =
        tenant.try_take_at(Kind::Established, cap, shared.connections.in_use()).ok_or(ShareFull::Connections)?;
    Ok(RouteHolds { established, pending })
}

/// The answer to a connection refused for capacity, as its protocol allows.
fn over_capacity(proto: Proto, msg: String) -> Answer {
    match proto {
        Proto::Tls => Answer::Alert(client_hello::ALERT_INTERNAL_ERROR),
        Proto::Connect => Answer::Http(503, msg),
        Proto::Raw | Proto::Unknown => Answer::Close,
    }
}

/// Connect to one of the route's upstreams, or say how to refuse the client.
async fn connect_upstream(
    shared: &Shared,
    name: &str,
    route: &Route,
    pre: &Pre,
    cfg: &RouterConfig,
) -> Result<Connected, Reject> {
    let m = &shared.metrics.conn;
    let timeout = cfg.timeouts.connect.get();
    let connected = upstream::connect(
        &route.upstreams,
        route.balance,
        timeout,
        cfg.upstream_eject.get(),
        |took, fail| match fail {
            None => route
                .meters
                .connect_seconds
                .get_or_init(|| m.connect_seconds.with_label_values(&[name, &route.name]))
                .observe(took.as_secs_f64()),
            Some(f) => {
                m.connect_failures.with_label_values(&[name, &route.name, f.label()]).inc();
                route.minutes.add(crate::table::UPSTREAM_FAILED, 1);
            }
        },
    )
    .await;
    connected.map_err(|fail| {
        let answer = match pre.proto {
            Proto::Tls => Answer::Alert(client_hello::ALERT_INTERNAL_ERROR),
            Proto::Connect if fail.last == ConnectFailure::Timeout => {
                Answer::Http(504, format!("upstream timed out: {}", fail.detail))
            }
            Proto::Connect => Answer::Http(502, format!("upstream unavailable: {}", fail.detail)),
            Proto::Raw | Proto::Unknown => Answer::Close,
        };
        tracing::debug!(detail = %fail.detail, "all upstreams failed");
        Reject::new(fail.last.label(), answer)
    })
}

/// Hand over what was read: our PROXY header (if the route sends one), then the client's bytes.
/// A CONNECT client gets its 200 first, in a write of its own, and only the bytes after its head
/// go upstream. Returns the client bytes replayed.
async fn hand_over(client: &mut TcpStream, up: &mut TcpStream, route: &Route, pre: &Pre) -> Result<u64, &'static str> {
    let header = proxy_header_out(route, pre, client);
    let payload = &pre.buf[pre.off + pre.head_len..];
    if pre.proto == Proto::Connect {
        client.write_all(&http_head::connect_established(pre.http_version)).await.map_err(|_| "client_write_error")?;
    }
    match header {
        Some(mut h) => {
            h.extend_from_slice(payload);
            up.write_all(&h).await
        }
        None if payload.is_empty() => Ok(()),
        None => up.write_all(payload).await,
    }
    .map_err(|_| "upstream_write_error")?;
    Ok(payload.len() as u64)
}

async fn reject(
    shared: &Shared,
    listener: &str,
    client: TcpStream,
    pre: &Pre,
    route: Option<&Arc<Route>>,
    rej: Reject,
) {
    let m = &shared.metrics.conn;
    m.rejects.with_label_values(&[listener, rej.reason]).inc();
    let route = route.map(|r| &*r.name);
    m.connections.with_label_values(&[listener, route.unwrap_or("-"), rej.reason]).inc();
    access_log(listener, pre, route, Bytes::default(), rej.reason);
    refuse(client, &rej.answer, pre.http_version).await;
}

/// Protocols as the access event shows them: joined by commas, `-` for none.
struct Joined<'a>(&'a [String]);

impl std::fmt::Display for Joined<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The client chose these bytes before any route: shown escaped, so none can end the
        // log line or colour a terminal.
        match self.0 {
            [] => f.write_str("-"),
            [first, rest @ ..] => {
                write!(f, "{}", Untrusted::new(first).max(ALPN_SHOWN))?;
                rest.iter().try_for_each(|p| write!(f, ",{}", Untrusted::new(p).max(ALPN_SHOWN)))
            }
        }
    }
}

/// Characters of one offered protocol shown in the access log (a protocol is at most 255 octets).
const ALPN_SHOWN: usize = 255;

fn access_log(listener: &str, pre: &Pre, route: Option<&str>, bytes: Bytes, reason: &str) {
    proxy_core::access_event!(
        "connection closed", bytes, pre.started, reason;
        conn_id = %pre.conn_id,
        listener,
        client = %pre.client,
        peer = %pre.peer,
        proxy_destination = pre.dst.map(|d| d.to_string()).as_deref().unwrap_or("-"),
        protocol = pre.proto.label(),
        sni = pre.sni.as_deref().unwrap_or("-"),
        alpn = %Joined(&pre.alpn),
        connect = pre.connect_target.as_deref().unwrap_or("-"),
        route = route.unwrap_or("-"),
        upstream = pre.up_addr.map(|u| u.to_string()).as_deref().unwrap_or("-")
    );
}

#[cfg(test)]
mod tests;
