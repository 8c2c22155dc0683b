//! One apiserver-proxy connection: dial the gateway, say where the client wanted to go, relay, log.

use crate::gateway;
use crate::shared::Shared;
use proxy_core::net;
use proxy_core::net::accept::ConnPermit;
use proxy_core::net::guard::Active;
use proxy_core::obs::metrics::ConnMetrics;
use proxy_core::prometheus::{Histogram, IntCounter, IntGauge};
use proxy_core::relay;
use proxy_core::relay::access::Bytes;
use proxy_core::relay::copy::{Meters, Stop, transfer_tcp};
use seedgate_config::agent::{ApiserverProxy, Mode, Timeouts};
use std::borrow::Cow;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tracing::Instrument;

/// The `route` label of every apiserver-proxy metric: all traffic goes to the gateway.
pub const ROUTE: &str = "gateway";

/// One listening address and the metric handles its connections share.
pub(crate) struct Listener {
    pub name: String,
    shared: Arc<Shared>,
    active: IntGauge,
    to_gateway: IntCounter,
    to_client: IntCounter,
    connect_seconds: Histogram,
    metrics: ConnMetrics,
}

/// Every reason an apiserver-proxy connection is refused for (the gateway's answers other than
/// `200` aside: `gateway_status_<code>`, which comes with the first such answer).
const REFUSALS: [&str; 9] = [
    "client_gone",
    "not_configured",
    "shutdown",
    "gateway_unreachable",
    "handshake_timeout",
    "gateway_closed",
    "gateway_bad_response",
    "gateway_response_too_large",
    "gateway_io_error",
];

/// How an apiserver-proxy relay may end (its only stop is the shutdown).
const OUTCOMES: [&str; 7] =
    ["closed", "idle_timeout", "client_reset", "upstream_reset", "client_error", "upstream_error", "shutdown"];

impl Listener {
    pub(crate) fn new(name: String, shared: Arc<Shared>) -> Self {
        let m = shared.metrics.clone();
        // Every series these connections count in is exported from the start.
        m.listener_at_zero(&name, &REFUSALS);
        m.route_at_zero(&name, ROUTE, &REFUSALS);
        let modes = [Mode::ProxyProtocolV2, Mode::HttpConnect].map(Mode::label);
        m.relays_at_zero(&name, &modes, &OUTCOMES);
        Self {
            active: m.active.with_label_values(&[&name]),
            to_gateway: m.bytes.with_label_values(&[&name, ROUTE, "to_upstream"]),
            to_client: m.bytes.with_label_values(&[&name, ROUTE, "to_client"]),
            connect_seconds: m.connect_seconds.with_label_values(&[&name, ROUTE]),
            metrics: m,
            name,
            shared,
        }
    }
}

/// What the access log says about a connection; filled in as the connection progresses.
struct Record {
    gateway: Option<SocketAddr>,
    bytes: Bytes,
    /// Bytes the gateway sent with its `200`, written to the client before the relay.
    early: u64,
    relayed: bool,
    reason: Cow<'static, str>,
}

/// One accepted client connection, before the gateway is chosen.
struct Client {
    stream: TcpStream,
    peer: SocketAddr,
    /// The address the client connected to: the PROXY destination / CONNECT authority.
    local: SocketAddr,
    started: Instant,
}

/// Serve one accepted client connection until it closes or the drain grace runs out.
pub(crate) async fn handle(l: Arc<Listener>, stream: TcpStream, peer: SocketAddr, permit: ConnPermit) {
    let _held = (permit, Active::new(l.active.clone()));
    let started = Instant::now();
    let local = match stream.local_addr() {
        Ok(a) => a,
        Err(e) => {
            // The client is already gone (reset between accept and here).
            reject(&l, "client_gone");
            tracing::info!(target: "access", listener = %l.name, client = %peer, error = %e, reason = "client_gone", "connection closed");
            return;
        }
    };
    // One snapshot per connection: a reload changes new connections only.
    let cfg = l.shared.config.load_full();
    let span = tracing::info_span!("conn", listener = %l.name, client = %peer, local = %local);
    async move {
        let Some(ap) = cfg.apiserver_proxy.as_deref() else {
            // Unreachable while listen changes need a restart; kept so a future change cannot panic.
            reject(&l, "not_configured");
            tracing::info!(target: "access", listener = %l.name, client = %peer, local = %local, reason = "not_configured", "connection closed");
            return;
        };
        let mut rec = Record { gateway: None, bytes: Bytes::default(), early: 0, relayed: false, reason: "".into() };
        let kill = l.shared.kill.clone();
        let client = Client { stream, peer, local, started };
        // The end of the drain grace cuts the phases before the relay; the relay itself ends by
        // the shared policy (a FIN both ways).
        let ready = tokio::select! {
            r = prepare(&l, ap, &cfg.timeouts, client, &mut rec) => r,
            () = kill.cancelled() => {
                reject(&l, "shutdown");
                rec.reason = "shutdown".into();
                None
            }
        };
        if let Some((client, gw)) = ready {
            let meters = Meters { to_upstream: Some(l.to_gateway.clone()), to_client: Some(l.to_client.clone()) };
            let mut relay = transfer_tcp(client, gw, cfg.timeouts.idle.get(), meters);
            let stop = std::pin::pin!(relay::stop_on(&kill, &kill, Stop::Shutdown));
            let done = relay::run(&mut relay, stop).await;
            rec.bytes = Bytes::new(done.bytes.to_upstream, rec.early + done.bytes.to_client);
            rec.reason = done.outcome.label().into();
            l.metrics.closes.with_label_values(&[l.name.as_str(), done.outcome.label()]).inc();
        }
        proxy_core::access_event!(
            "connection closed", rec.bytes, started, &rec.reason;
            listener = %l.name,
            client = %peer,
            local = %local,
            mode = ap.mode.label(),
            gateway = %rec.gateway.map_or_else(|| "-".to_owned(), |a| a.to_string()),
            gateway_name = %ap.gateway
        );
    }
    .instrument(span)
    .await;
}

fn reject(l: &Listener, reason: &str) {
    l.metrics.rejects.with_label_values(&[&l.name, reason]).inc();
    l.metrics.connections.with_label_values(&[&l.name, ROUTE, reason]).inc();
}

fn fail<T>(l: &Listener, rec: &mut Record, reason: Cow<'static, str>) -> Option<T> {
    reject(l, &reason);
    rec.reason = reason;
    None
}

/// Run `f` until `deadline`; `None` when the time ran out.
async fn until<T>(deadline: tokio::time::Instant, f: impl Future<Output = T>) -> Option<T> {
    tokio::time::timeout_at(deadline, f).await.ok()
}

/// Resolve the gateway (on every connection: this is how clients follow it to another seed)
/// and connect, retrying other addresses before any byte was sent.
async fn connect_gateway(l: &Listener, ap: &ApiserverProxy, t: &Timeouts, rec: &mut Record) -> Option<TcpStream> {
    let resolved = gateway::resolve(&ap.gateway, t.connect.get()).await;
    l.shared.gateway.record(&ap.gateway, &resolved);
    let addrs = match resolved {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!(gateway = %ap.gateway, error = %e, "gateway name does not resolve");
            l.metrics.connect_failures.with_label_values(&[&l.name, ROUTE, "resolve_failed"]).inc();
            return fail(l, rec, "gateway_unreachable".into());
        }
    };
    let connect_started = Instant::now();
    let connected = net::connect_in_turn(&addrs, ap.retries as usize, t.connect.get(), |addr, e| {
        tracing::debug!(gateway = %addr, error = %e, "gateway connect attempt failed");
        l.metrics.connect_failures.with_label_values(&[&l.name, ROUTE, gateway::failure_label(e)]).inc();
    })
    .await;
    match connected {
        Ok((s, addr)) => {
            l.connect_seconds.observe(connect_started.elapsed().as_secs_f64());
            rec.gateway = Some(addr);
            Some(s)
        }
        Err(e) => {
            tracing::warn!(gateway = %ap.gateway, attempts = ap.retries, error = %e, "gateway unreachable");
            fail(l, rec, "gateway_unreachable".into())
        }
    }
}

/// Everything before the relay: gateway connect, then the PROXY header or the CONNECT exchange.
/// `Some` = both sockets ready to relay; otherwise the connection was refused (and counted).
async fn prepare(
    l: &Listener,
    ap: &ApiserverProxy,
    t: &Timeouts,
    mut client: Client,
    rec: &mut Record,
) -> Option<(TcpStream, TcpStream)> {
    let mut gw = connect_gateway(l, ap, t, rec).await?;
    // The handshake: nothing is read from the client meanwhile, so its early bytes wait in the
    // socket buffer (bounded by the kernel) and follow the head in order once the relay starts.
    let deadline = tokio::time::Instant::now() + t.handshake.get();
    let handshake = async {
        match ap.mode {
            Mode::ProxyProtocolV2 => {
                gw.write_all(&gateway::proxy_v2_header(client.peer, client.local)).await?;
                Ok(Vec::new())
            }
            Mode::HttpConnect => {
                let authority = match &ap.authority {
                    Some(a) => a.to_string(),
                    None => gateway::canonical(client.local).to_string(),
                };
                let head = gateway::connect_request(
                    &authority,
                    &ap.destination_header,
                    ap.destination.as_deref().unwrap_or_default(),
                );
                gw.write_all(&head).await?;
                gateway::read_connect_response(&mut gw).await
            }
        }
    };
    let early = match until(deadline, handshake).await {
        None => {
            tracing::warn!(gateway = ?rec.gateway, timeout = ?t.handshake.get(), "gateway handshake timed out");
            return fail(l, rec, "handshake_timeout".into());
        }
        Some(Err(e)) => {
            tracing::warn!(gateway = ?rec.gateway, error = %e, "gateway handshake failed");
            return fail(l, rec, e.reason().into());
        }
        Some(Ok(early)) => early,
    };
    // Tunnel bytes the gateway sent together with its 200 belong to the client.
    if !early.is_empty() {
        match until(deadline, client.stream.write_all(&early)).await {
            Some(Ok(())) => {
                rec.early = early.len() as u64;
                l.to_client.inc_by(rec.early);
            }
            Some(Err(_)) => return fail(l, rec, "client_gone".into()),
            None => return fail(l, rec, "handshake_timeout".into()),
        }
    }
    l.metrics
        .handshake_seconds
        .with_label_values(&[&l.name, ap.mode.label()])
        .observe(client.started.elapsed().as_secs_f64());
    l.metrics.connections.with_label_values(&[&l.name, ROUTE, "ok"]).inc();
    rec.relayed = true;
    Some((client.stream, gw))
}
