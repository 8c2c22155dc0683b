//! slowloris: time for a real client to be served through an SNI router while thousands of
//! clients hold connections open without routing them: sni-router, haproxy and nginx with the
//! same connection cap.
//!
//! The stalled clients (2,500; 1,500 in a smoke run) connect from loopback source addresses
//! (127.0.2.1 and up, 50 each, under sni-router's default per-source cap) and send the first
//! three bytes of a TLS record, then nothing. Every system is capped at 1,000 client
//! connections, fewer than the stalled clients, and gives a connection 5 s to show its
//! ClientHello:
//! - sni-router: `max_connections: 1000` (routed connections) and its defaults otherwise
//!   (handshake deadline 5 s, pending budget 2,000 of connections not routed yet);
//! - haproxy: `maxconn 1000`, global and frontend (every accepted connection counts),
//!   `tcp-request inspect-delay 5s`, then accept on a ClientHello and route by its SNI;
//! - nginx: one worker, `worker_connections` enough for 1,000 proxied clients (see
//!   [`NGINX_WORKER_CONNECTIONS`]), `ssl_preread` with `preread_timeout 5s` and a map on
//!   `$ssl_preread_server_name`.
//!
//! Once every stalled client's connect has completed and the system has settled (sni-router:
//! every stalled client pending or refused, by its metrics; an anchor, which has no admin
//! endpoint: its processes' open sockets have stopped changing, i.e. it stopped accepting),
//! real clients from 127.0.0.1 do one full transaction each (TCP connect, TLS 1.3 handshake
//! with the backend through the router, `GET /`, the response), one after the other, each
//! bounded by [`TXN_LIMIT`]; the figure is their time to first response byte. A router that
//! lets stalled clients hold its connection slots makes them wait for a deadline to free one
//! (or refuses them). A real client that fails or times out makes that repeat an error, with
//! what was measured until then. Figures are printed, never asserted.

use super::sni_bulk::{Caps, sni_systems};
use super::{Ctx, record, record_skips};
use crate::load::Txn;
use crate::report::{Better, Kind, Results};
use crate::systems::{Running, Slot};
use anyhow::{Context as _, bail};
use rustls::pki_types::ServerName;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use testbed::{TlsHttpBackend, http_get, metric_value};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::Instant;

pub(super) const SC: &str = "slowloris";
const SNI: &str = "api.bench.example";
/// Client connections each system may hold: sni-router `max_connections`, haproxy `maxconn`.
const MAX_CONNECTIONS: usize = 1000;
/// nginx's equivalent of [`MAX_CONNECTIONS`]. `worker_connections` counts every connection of
/// the (single) worker: a proxied client takes two (client side + upstream side), and the
/// listening socket and the channel to the master take one each. So 2 × 1,000 + 2 lets exactly
/// 1,000 clients be proxied at once, as the other two allow. A client still in preread (a
/// stalled one) has no upstream side yet and takes one, so up to 2,000 stalled clients fit:
/// that is how nginx counts, not something the cap can express. Past it nginx accepts and at
/// once closes new connections ("worker_connections are not enough").
const NGINX_WORKER_CONNECTIONS: u32 = 2 * MAX_CONNECTIONS as u32 + 2;
const PER_SOURCE: usize = 50;
/// How long the stalled clients may take to be accepted and counted.
const SETTLE: Duration = Duration::from_secs(30);
/// How long an anchor's open sockets must stay unchanged for it to count as no longer accepting.
const STILL_FOR: Duration = Duration::from_millis(500);
/// Longest one real client's transaction may take (a starved router may keep it waiting for the
/// 5 s deadline of the stalled connections ahead of it, or longer).
const TXN_LIMIT: Duration = Duration::from_secs(20);

/// How the scenario sees what a system holds: sni-router through its metrics, an anchor (no
/// admin endpoint) through its processes' open sockets beyond the `base` it had before.
enum Watch {
    Admin(SocketAddr),
    Sockets { base: usize },
}

impl Watch {
    async fn of(sys: &Running) -> anyhow::Result<Self> {
        if sys.kind == Kind::Seedgate {
            return Ok(Self::Admin(sys.addr("admin")?));
        }
        // The start-up probe's connection may still be closing.
        tokio::time::sleep(Duration::from_millis(200)).await;
        Ok(Self::Sockets { base: sys.socket_fds() })
    }

    /// Stalled clients the system holds now (pending, for sni-router with its pending budget;
    /// else every connection it holds but the ones just served; an anchor's extra sockets).
    async fn held(&self, sys: &Running) -> anyhow::Result<f64> {
        match self {
            Self::Admin(admin) => {
                let (_, m) = http_get(*admin, "/metrics").await?;
                Ok(metric_value(&m, "seedgate_pending_connections", &[])
                    .or_else(|| metric_value(&m, "seedgate_connections_active", &[("listener", "gateway")]))
                    .unwrap_or(0.0))
            }
            Self::Sockets { base } => Ok(sys.socket_fds().saturating_sub(*base) as f64),
        }
    }
}

/// Connect `n` stalled clients to `front`, `PER_SOURCE` from each source address.
async fn stall(front: SocketAddr, n: usize) -> anyhow::Result<Vec<TcpStream>> {
    let mut held = Vec::with_capacity(n);
    for i in 0..n {
        let src = Ipv4Addr::new(127, 0, 2, 1 + (i / PER_SOURCE) as u8);
        let s = TcpSocket::new_v4()?;
        s.bind(SocketAddr::new(IpAddr::V4(src), 0))?;
        // A full accept queue drops SYNs: the connect completes on a retransmission once the
        // system accepts again (bounded).
        let mut c = tokio::time::timeout(SETTLE, s.connect(front)).await.context("connect timed out")??;
        // Refused at once (per-source cap, eviction, no free slot) is fine: the write error says only that.
        let _ = c.write_all(&[0x16, 0x03, 0x01]).await;
        held.push(c);
    }
    Ok(held)
}

/// Wait until the system has dealt with all `n` stalled clients (their connects have all
/// completed). sni-router: each one pending, refused by the pending budget or cut by the
/// handshake deadline (or, for a router without one, until its connection slots are full). An
/// anchor: until it stops accepting, i.e. its open sockets have not changed for [`STILL_FOR`].
async fn settled(sys: &Running, watch: &Watch, n: usize) -> anyhow::Result<()> {
    let end = Instant::now() + SETTLE;
    match watch {
        Watch::Admin(admin) => {
            let mut last = String::new();
            // Bounded by SETTLE.
            while Instant::now() < end {
                let (_, m) = http_get(*admin, "/metrics").await?;
                let v = |name: &str, labels: &[(&str, &str)]| metric_value(&m, name, labels);
                let done = match v("seedgate_pending_connections", &[]) {
                    Some(p) => {
                        let per_source =
                            v("seedgate_pending_rejects_total", &[("reason", "per_source")]).unwrap_or(0.0);
                        let evicted = v("seedgate_pending_rejects_total", &[("reason", "evicted")]).unwrap_or(0.0);
                        // A slow machine (or a debug build) may take longer to connect them all
                        // than the handshake deadline: the first ones are then cut by it.
                        let deadline = v("seedgate_pending_rejects_total", &[("reason", "deadline")]).unwrap_or(0.0);
                        p + per_source + evicted + deadline >= n as f64
                    }
                    None => {
                        v("seedgate_connections_active", &[("listener", "gateway")]).unwrap_or(0.0)
                            >= MAX_CONNECTIONS.min(n) as f64
                    }
                };
                if done {
                    return Ok(());
                }
                last = m;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let lines: Vec<&str> = last.lines().filter(|l| l.starts_with("seedgate_pending")).collect();
            bail!("stalled clients not all accounted for within {SETTLE:?}: {lines:?}")
        }
        Watch::Sockets { base } => {
            let (mut last, mut since) = (sys.socket_fds(), Instant::now());
            // Bounded by SETTLE.
            while Instant::now() < end {
                tokio::time::sleep(Duration::from_millis(20)).await;
                let now = sys.socket_fds();
                if now != last {
                    (last, since) = (now, Instant::now());
                } else if since.elapsed() >= STILL_FOR {
                    return Ok(());
                }
            }
            bail!(
                "{} still accepting after {SETTLE:?} ({} sockets beyond its {base})",
                sys.label,
                last.saturating_sub(*base)
            )
        }
    }
}

/// Time to first byte of `k` transactions one after the other, each bounded by [`TXN_LIMIT`],
/// in ms: (median, max). The first that fails ends the run with its error and what the ones
/// before it measured.
async fn timed(txn: &Txn, k: usize) -> anyhow::Result<(f64, f64)> {
    let mut ms = Vec::with_capacity(k);
    let summary = |ms: &mut Vec<f64>| {
        ms.sort_by(f64::total_cmp);
        (ms[(ms.len() - 1) / 2], ms[ms.len() - 1])
    };
    for i in 0..k {
        let t0 = Instant::now();
        match txn.run_within(TXN_LIMIT).await {
            Ok(t) => ms.push(t.first_byte.as_secs_f64() * 1e3),
            Err(e) => {
                let before = if ms.is_empty() {
                    "none served before it".to_owned()
                } else {
                    let (p50, max) = summary(&mut ms);
                    format!("the {} before it: first byte median {p50:.1} ms, max {max:.1} ms", ms.len())
                };
                bail!(
                    "real client {} of {k} failed after {:.1} ms ({before}): {e:#}",
                    i + 1,
                    t0.elapsed().as_secs_f64() * 1e3
                );
            }
        }
    }
    Ok(summary(&mut ms))
}

pub(super) async fn run(ctx: &Ctx, res: &mut Results) -> anyhow::Result<()> {
    let s = &ctx.scale;
    let n = s.stalled;
    let backend = TlsHttpBackend::start("shoot", &ctx.ca.server(&[SNI])?, None).await?;
    let caps = Caps {
        router_max_connections: MAX_CONNECTIONS,
        haproxy_maxconn: MAX_CONNECTIONS as u32,
        nginx_worker_connections: NGINX_WORKER_CONNECTIONS,
    };
    let mut slots = sni_systems(ctx, SNI, backend.addr(), false, Some(caps)).await;
    let m_idle = res.metric(SC, "time to first byte, no stalled clients (median)", "ms", Better::Lower);
    let m50 = res.metric(SC, &format!("time to first byte among {n} stalled clients (median)"), "ms", Better::Lower);
    let mmax = res.metric(SC, &format!("time to first byte among {n} stalled clients (max)"), "ms", Better::Lower);
    let m_held = res.metric(SC, "stalled clients still held when the last one was served", "conns", Better::Higher);
    let all = [m_idle, m50, mmax, m_held];
    res.remark(
        SC,
        &format!(
            "{n} clients from 50 loopback addresses send 3 bytes of a TLS record and stall; then {} real clients one after the other \
             (TCP connect + TLS 1.3 handshake with the backend through the router + GET /, each bounded by {} s). The same cap of \
             {MAX_CONNECTIONS} client connections and 5 s to show a ClientHello everywhere: sni-router max_connections \
             {MAX_CONNECTIONS} (routed connections; handshake deadline 5 s, its default pending budget of 2,000 not yet routed); \
             haproxy maxconn {MAX_CONNECTIONS} (global and frontend), tcp-request inspect-delay 5s; nginx 1 worker, \
             worker_connections {NGINX_WORKER_CONNECTIONS} ({MAX_CONNECTIONS} proxied clients × 2 sides + listener + master \
             channel: a stalled client takes one, so up to {} stalled fit), preread_timeout 5s. Settled before the real clients: \
             sni-router by its metrics, an anchor once its open sockets stop changing; an anchor's stalled clients held = its \
             sockets beyond those before the attack",
            s.slowloris_clients,
            TXN_LIMIT.as_secs(),
            2 * MAX_CONNECTIONS,
        ),
    );
    let request: Arc<[u8]> = format!("GET / HTTP/1.1\r\nHost: {SNI}\r\nConnection: close\r\n\r\n").into_bytes().into();
    let sni = ServerName::try_from(SNI)?.to_owned();
    let mut watches = Vec::with_capacity(slots.len());
    for slot in &slots {
        watches.push(match slot {
            Slot::Up(sys) => Some(Watch::of(sys).await?),
            Slot::Skipped { .. } => None,
        });
    }
    for _ in 0..s.repeats {
        for (slot, watch) in slots.iter_mut().zip(&watches) {
            let (Slot::Up(sys), Some(watch)) = (slot, watch) else { continue };
            let txn = Txn::Tls {
                addr: sys.addr("front")?,
                sni: sni.clone(),
                cfg: ctx.tls_client.clone(),
                request: request.clone(),
            };
            let idle = timed(&txn, s.slowloris_clients).await.map(|(p50, _)| p50);
            record(res, m_idle, &sys.label, sys.kind, idle);
            // The real clients' figures, and (even when one of them failed) the stalled clients
            // held after them.
            let r: anyhow::Result<(anyhow::Result<(f64, f64)>, f64)> = async {
                let held = stall(sys.addr("front")?, n).await?;
                settled(sys, watch, n).await?;
                let t = timed(&txn, s.slowloris_clients).await;
                let still = watch.held(sys).await?;
                drop(held);
                Ok((t, still))
            }
            .await;
            match r {
                Ok((t, still)) => {
                    let (p50, max) = match t {
                        Ok((p50, max)) => (Ok(p50), Ok(max)),
                        Err(e) => (Err(anyhow::anyhow!("{e:#}")), Err(e)),
                    };
                    record(res, m50, &sys.label, sys.kind, p50);
                    record(res, mmax, &sys.label, sys.kind, max);
                    record(res, m_held, &sys.label, sys.kind, Ok(still));
                }
                Err(e) => {
                    for m in [m50, mmax, m_held] {
                        record(res, m, &sys.label, sys.kind, Err(anyhow::anyhow!("{e:#}")));
                    }
                }
            }
            // The stalled clients are gone: let the system close their connections before the
            // next repeat (bounded by the deadline).
            if let Err(e) = settled_empty(sys, watch).await {
                eprintln!("bench: {SC}: {}: {e:#}", sys.label);
            }
            sys.check_alive()?;
        }
    }
    record_skips(res, &all, &slots);
    Ok(())
}

/// Wait (bounded) until the system holds no stalled connection, so repeats start alike.
async fn settled_empty(sys: &Running, watch: &Watch) -> anyhow::Result<()> {
    let end = Instant::now() + SETTLE;
    let mut held = 0.0;
    // Bounded by SETTLE.
    while Instant::now() < end {
        held = watch.held(sys).await?;
        if held == 0.0 {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    bail!("{held} connections still held after {SETTLE:?}")
}
