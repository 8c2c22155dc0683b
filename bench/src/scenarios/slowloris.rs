//! slowloris: time for a real client to be served through sni-router while thousands of clients hold connections open without routing them.
//!
//! The stalled clients connect from 50 loopback source addresses (127.0.2.1 and up, 50 each,
//! under the default per-source cap) and send the first three bytes of a TLS record, then
//! nothing. The router runs with `max_connections: 1000`, fewer than the stalled clients, and
//! its defaults otherwise (handshake deadline 5 s, pending budget 2,000). Once every stalled
//! client is held or refused, real clients from 127.0.0.1 do one full transaction each (TCP
//! connect, TLS 1.3 handshake with the backend through the router, `GET /`, the response),
//! one after the other; the figure is their time to first response byte. A router that lets
//! stalled clients hold its connection slots makes them wait for a deadline to free one.
//! Figures are printed, never asserted.

use super::{Ctx, record, record_skips};
use crate::load::Txn;
use crate::report::{Better, Results};
use crate::systems::{self, Slot};
use anyhow::Context as _;
use rustls::pki_types::ServerName;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use testbed::{TlsHttpBackend, http_get, metric_value};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpSocket, TcpStream};

const SC: &str = "slowloris";
const SNI: &str = "api.bench.example";
const MAX_CONNECTIONS: usize = 1000;
const PER_SOURCE: usize = 50;
/// How long the stalled clients may take to be accepted and counted.
const SETTLE: Duration = Duration::from_secs(30);

/// Connect `n` stalled clients to `front`, `PER_SOURCE` from each source address.
async fn stall(front: SocketAddr, n: usize) -> anyhow::Result<Vec<TcpStream>> {
    let mut held = Vec::with_capacity(n);
    for i in 0..n {
        let src = Ipv4Addr::new(127, 0, 2, 1 + (i / PER_SOURCE) as u8);
        let s = TcpSocket::new_v4()?;
        s.bind(SocketAddr::new(IpAddr::V4(src), 0))?;
        let mut c = tokio::time::timeout(SETTLE, s.connect(front)).await.context("connect timed out")??;
        // Refused at once (per-source cap, eviction) is fine: the write error says only that.
        let _ = c.write_all(&[0x16, 0x03, 0x01]).await;
        held.push(c);
    }
    Ok(held)
}

/// Wait until the router has dealt with all `n` stalled clients: each one pending or refused by
/// the pending budget (or, for a router without one, until its connection slots are full).
async fn settled(admin: SocketAddr, n: usize) -> anyhow::Result<String> {
    let end = tokio::time::Instant::now() + SETTLE;
    let mut last = String::new();
    for _ in 0..(SETTLE.as_millis() / 20) {
        let (_, m) = http_get(admin, "/metrics").await?;
        let v = |name: &str, labels: &[(&str, &str)]| metric_value(&m, name, labels);
        let done = match v("seedgate_pending_connections", &[]) {
            Some(p) => {
                let per_source = v("seedgate_pending_rejects_total", &[("reason", "per_source")]).unwrap_or(0.0);
                let evicted = v("seedgate_pending_rejects_total", &[("reason", "evicted")]).unwrap_or(0.0);
                p + per_source + evicted >= n as f64
            }
            None => {
                v("seedgate_connections_active", &[("listener", "gateway")]).unwrap_or(0.0)
                    >= MAX_CONNECTIONS.min(n) as f64
            }
        };
        if done {
            return Ok(m);
        }
        last = m;
        if tokio::time::Instant::now() >= end {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let lines: Vec<&str> = last.lines().filter(|l| l.starts_with("seedgate_pending")).collect();
    anyhow::bail!("stalled clients not all accounted for within {SETTLE:?}: {lines:?}")
}

/// Time to first byte of `k` transactions one after the other, in ms: (median, max).
async fn timed(txn: &Txn, k: usize) -> anyhow::Result<(f64, f64)> {
    let mut ms = Vec::with_capacity(k);
    for _ in 0..k {
        ms.push(txn.run().await?.first_byte.as_secs_f64() * 1e3);
    }
    ms.sort_by(f64::total_cmp);
    Ok((ms[(ms.len() - 1) / 2], ms[ms.len() - 1]))
}

pub async fn run(ctx: &Ctx, res: &mut Results) -> anyhow::Result<()> {
    let s = &ctx.scale;
    let n = s.stalled;
    let backend = TlsHttpBackend::start("shoot", &ctx.ca.server(&[SNI])?, None).await?;
    let env = ctx.env();
    let listeners = super::sni_bulk::router_sni_listener(&[("r".into(), SNI.into(), backend.addr())]);
    let limits = format!("limits: {{ max_connections: {MAX_CONNECTIONS} }}\n");
    let r = systems::sni_router_with(&env, "sni-router", &limits, &listeners).await;
    let mut slots = vec![Slot::from("sni-router", crate::report::Kind::Seedgate, r)];
    let m_idle = res.metric(SC, "time to first byte, no stalled clients (median)", "ms", Better::Lower);
    let m50 = res.metric(SC, &format!("time to first byte among {n} stalled clients (median)"), "ms", Better::Lower);
    let mmax = res.metric(SC, &format!("time to first byte among {n} stalled clients (max)"), "ms", Better::Lower);
    let m_held = res.metric(SC, "stalled clients still held when the last one was served", "conns", Better::Higher);
    let all = [m_idle, m50, mmax, m_held];
    res.remark(
        SC,
        &format!(
            "{n} clients from 50 loopback addresses send 3 bytes of a TLS record and stall; sni-router with max_connections {MAX_CONNECTIONS}, \
             handshake deadline 5 s, its default pending budget; then {} real clients one after the other (TCP connect + TLS 1.3 handshake \
             with the backend through the router + GET /); sni-router only (no anchor configured for this attack)",
            s.slowloris_clients
        ),
    );
    let request: Arc<[u8]> = format!("GET / HTTP/1.1\r\nHost: {SNI}\r\nConnection: close\r\n\r\n").into_bytes().into();
    let sni = ServerName::try_from(SNI)?.to_owned();
    for _ in 0..s.repeats {
        for slot in &mut slots {
            let Slot::Up(sys) = slot else { continue };
            let txn = Txn::Tls {
                addr: sys.addr("gateway")?,
                sni: sni.clone(),
                cfg: ctx.tls_client.clone(),
                request: request.clone(),
            };
            let idle = timed(&txn, s.slowloris_clients).await.map(|(p50, _)| p50);
            record(res, m_idle, &sys.label, sys.kind, idle);
            let admin = sys.addr("admin")?;
            let r: anyhow::Result<((f64, f64), f64)> = async {
                let held = stall(sys.addr("gateway")?, n).await?;
                settled(admin, n).await?;
                let t = timed(&txn, s.slowloris_clients).await?;
                // How many stalled clients the router still held then (pending, for a router with
                // a pending budget; else every connection it holds but the ones just served).
                let (_, m) = http_get(admin, "/metrics").await?;
                let still = metric_value(&m, "seedgate_pending_connections", &[])
                    .or_else(|| metric_value(&m, "seedgate_connections_active", &[("listener", "gateway")]))
                    .unwrap_or(0.0);
                drop(held);
                Ok((t, still))
            }
            .await;
            match r {
                Ok(((p50, max), still)) => {
                    for (m, v) in [(m50, p50), (mmax, max), (m_held, still)] {
                        record(res, m, &sys.label, sys.kind, Ok(v));
                    }
                }
                Err(e) => {
                    for m in [m50, mmax, m_held] {
                        record(res, m, &sys.label, sys.kind, Err(anyhow::anyhow!("{e:#}")));
                    }
                }
            }
            // The stalled clients are gone: let the router close their connections before the
            // next repeat (bounded by the handshake deadline).
            let _ = settled_empty(admin).await;
            sys.check_alive()?;
        }
    }
    record_skips(res, &all, &slots);
    Ok(())
}

/// Wait (bounded) until the router holds no pending connection, so repeats start alike.
async fn settled_empty(admin: SocketAddr) -> anyhow::Result<()> {
    for _ in 0..(SETTLE.as_millis() / 20) {
        let (_, m) = http_get(admin, "/metrics").await?;
        let pending = metric_value(&m, "seedgate_pending_connections", &[])
            .or_else(|| metric_value(&m, "seedgate_connections_active", &[("listener", "gateway")]))
            .unwrap_or(0.0);
        if pending == 0.0 {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    anyhow::bail!("connections still held after {SETTLE:?}")
}
