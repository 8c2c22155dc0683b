//! One apiserver-proxy connection: dial the gateway, say where the client wanted to go, relay, log.

use crate::Shared;
use crate::gateway;
use proxy_core::accept::ConnPermit;
use proxy_core::copy::{Meters, Outcome, Side, SplicePump, Transfer, transfer_tcp};
use proxy_core::metrics::ConnMetrics;
use proxy_core::net;
use proxy_core::prometheus::{Histogram, IntCounter, IntGauge};
use seedgate_config::agent::{ApiserverProxy, Mode, Timeouts};
use std::borrow::Cow;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tracing::Instrument;

/// The `route` label of every apiserver-proxy metric: all traffic goes to the gateway.
pub const ROUTE: &str = "gateway";

/// One listening address and the metric handles its connections share.
pub struct Listener {
    pub name: String,
    shared: Arc<Shared>,
    active: IntGauge,
    to_gateway: IntCounter,
    to_client: IntCounter,
    connect_seconds: Histogram,
    metrics: ConnMetrics,
}

impl Listener {
    pub fn new(name: String, shared: Arc<Shared>) -> Self {
        let m = shared.metrics.clone();
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

/// Keeps `seedgate_connections_active` right however the task ends.
struct ActiveGuard(IntGauge);

impl ActiveGuard {
    fn new(g: &IntGauge) -> Self {
        g.inc();
        Self(g.clone())
    }
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// What the access log says about a connection; filled in as the connection progresses.
struct Record {
    gateway: Option<SocketAddr>,
    to_gateway: u64,
    to_client: u64,
    /// Bytes the gateway sent with its `200`, written to the client before the relay.
    early: u64,
    relayed: bool,
    reason: Cow<'static, str>,
}

/// Serve one accepted client connection until it closes or the drain grace runs out.
pub async fn handle(l: Arc<Listener>, client: TcpStream, peer: SocketAddr, permit: ConnPermit) {
    let _permit = permit;
    let _active = ActiveGuard::new(&l.active);
    let started = Instant::now();
    let local = match client.local_addr() {
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
        let mut rec = Record { gateway: None, to_gateway: 0, to_client: 0, early: 0, relayed: false, reason: "".into() };
        let kill = l.shared.kill.clone();
        tokio::select! {
            () = serve(&l, ap, &cfg.timeouts, client, peer, local, started, &mut rec) => {}
            () = kill.cancelled() => {
                if !rec.relayed {
                    reject(&l, "shutdown");
                }
                rec.reason = "shutdown".into();
            }
        }
        if rec.relayed {
            l.metrics.closes.with_label_values(&[l.name.as_str(), rec.reason.as_ref()]).inc();
        }
        tracing::info!(
            target: "access",
            listener = %l.name,
            client = %peer,
            local = %local,
            mode = ap.mode.label(),
            gateway = %rec.gateway.map_or_else(|| "-".to_owned(), |a| a.to_string()),
            gateway_name = %ap.gateway,
            bytes_to_gateway = rec.to_gateway,
            bytes_to_client = rec.to_client,
            duration_ms = started.elapsed().as_millis() as u64,
            reason = %rec.reason,
            "connection closed"
        );
    }
    .instrument(span)
    .await;
}

fn reject(l: &Listener, reason: &str) {
    l.metrics.rejects.with_label_values(&[&l.name, reason]).inc();
    l.metrics.connections.with_label_values(&[&l.name, ROUTE, reason]).inc();
}

/// Run `f` until `deadline`; `None` when the time ran out.
async fn until<T>(deadline: tokio::time::Instant, f: impl Future<Output = T>) -> Option<T> {
    tokio::time::timeout_at(deadline, f).await.ok()
}

#[allow(clippy::too_many_arguments)]
async fn serve(
    l: &Listener,
    ap: &ApiserverProxy,
    t: &Timeouts,
    mut client: TcpStream,
    peer: SocketAddr,
    local: SocketAddr,
    started: Instant,
    rec: &mut Record,
) {
    let fail = |rec: &mut Record, reason: Cow<'static, str>| {
        reject(l, &reason);
        rec.reason = reason;
    };

    // Resolve on every connection: this is how clients follow the gateway to another seed.
    let resolved = gateway::resolve(&ap.gateway, t.connect.get()).await;
    l.shared.gateway.record(&ap.gateway, &resolved);
    let addrs = match resolved {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!(gateway = %ap.gateway, error = %e, "gateway name does not resolve");
            l.metrics.connect_failures.with_label_values(&[&l.name, ROUTE, "resolve_failed"]).inc();
            return fail(rec, "gateway_unreachable".into());
        }
    };
    let connect_started = Instant::now();
    let connected = gateway::connect_any(&addrs, ap.retries, t.connect.get(), |addr, e| {
        tracing::debug!(gateway = %addr, error = %e, "gateway connect attempt failed");
        l.metrics.connect_failures.with_label_values(&[&l.name, ROUTE, gateway::failure_label(e)]).inc();
    })
    .await;
    let mut gw = match connected {
        Ok((s, addr)) => {
            l.connect_seconds.observe(connect_started.elapsed().as_secs_f64());
            rec.gateway = Some(addr);
            s
        }
        Err(e) => {
            tracing::warn!(gateway = %ap.gateway, attempts = ap.retries, error = %e, "gateway unreachable");
            return fail(rec, "gateway_unreachable".into());
        }
    };

    // The handshake: nothing is read from the client meanwhile, so its early bytes wait in the
    // socket buffer (bounded by the kernel) and follow the head in order once the relay starts.
    let deadline = tokio::time::Instant::now() + t.handshake.get();
    let handshake = async {
        match ap.mode {
            Mode::ProxyProtocolV2 => {
                gw.write_all(&gateway::proxy_v2_header(peer, local)).await?;
                Ok(Vec::new())
            }
            Mode::HttpConnect => {
                let authority = match &ap.authority {
                    Some(a) => a.to_string(),
                    None => gateway::canonical(local).to_string(),
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
            return fail(rec, "handshake_timeout".into());
        }
        Some(Err(e)) => {
            tracing::warn!(gateway = ?rec.gateway, error = %e, "gateway handshake failed");
            return fail(rec, e.reason().into());
        }
        Some(Ok(early)) => early,
    };
    // Tunnel bytes the gateway sent together with its 200 belong to the client.
    if !early.is_empty() {
        match until(deadline, client.write_all(&early)).await {
            Some(Ok(())) => {
                rec.early = early.len() as u64;
                rec.to_client = rec.early;
                l.to_client.inc_by(early.len() as u64);
            }
            Some(Err(_)) => return fail(rec, "client_gone".into()),
            None => return fail(rec, "handshake_timeout".into()),
        }
    }
    l.metrics.handshake_seconds.with_label_values(&[&l.name, ap.mode.label()]).observe(started.elapsed().as_secs_f64());
    l.metrics.connections.with_label_values(&[&l.name, ROUTE, "ok"]).inc();
    rec.relayed = true;

    let meters = Meters { to_upstream: Some(l.to_gateway.clone()), to_client: Some(l.to_client.clone()) };
    let mut relay = transfer_tcp(client, gw, t.idle.get(), meters);
    // Counted as they move, so a drain kill in the middle still logs what was relayed.
    let outcome = RelayCounts { relay: &mut relay, rec }.await;
    rec.reason = outcome.label().into();
    let (client, gw) = relay.into_inner();
    // Pass a reset (or a broken stream) on to the other side instead of a clean FIN.
    match outcome {
        Outcome::Reset(Side::Client) | Outcome::Error(Side::Client, _) => net::reset_on_close(&gw),
        Outcome::Reset(Side::Upstream) | Outcome::Error(Side::Upstream, _) => net::reset_on_close(&client),
        Outcome::Closed | Outcome::Idle => {}
    }
}

/// Polls the relay and copies its byte counts into the access-log record after every poll.
struct RelayCounts<'a> {
    relay: &'a mut Transfer<TcpStream, TcpStream, SplicePump>,
    rec: &'a mut Record,
}

impl Future for RelayCounts<'_> {
    type Output = Outcome;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Outcome> {
        let this = self.get_mut();
        let r = Pin::new(&mut *this.relay).poll(cx);
        let (up, down) = this.relay.counts();
        this.rec.to_gateway = up;
        this.rec.to_client = this.rec.early + down;
        r
    }
}
