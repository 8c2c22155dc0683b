//! sni-connrate: new connections/s with full TLS handshakes through SNI routing, and time to
//! the first response byte.
//!
//! Each transaction: TCP connect, a full TLS 1.3 handshake (rustls client, resumption off) with
//! testbed's TLS backend through the proxy, `GET /`, the response to its end. Two runs per
//! system and repeat: closed loop with `concurrency` clients (saturation: connections/s and
//! latency under load), and open loop at a fixed offered rate (latency when not saturated: the
//! added latency per connection).

use super::sni_bulk::sni_systems;
use super::{Ctx, record_rate, record_skips};
use crate::load::{Txn, closed_loop, open_loop};
use crate::report::{Better, FigureId, Results, Targets, of};
use crate::systems::{Running, Slot};
use rustls::pki_types::ServerName;
use std::sync::Arc;
use testbed::TlsHttpBackend;

pub(super) const SC: &str = "sni-connrate";
const FULL_TLS: FigureId = FigureId::new(SC, "full-tls");
const TTFB_P50: FigureId = FigureId::new(SC, "ttfb-p50-fixed-rate");
const TTFB_P99: FigureId = FigureId::new(SC, "ttfb-p99-fixed-rate");
const SNI: &str = "api.bench.example";

pub(super) async fn run(ctx: &Ctx, res: &mut Results) -> anyhow::Result<()> {
    let s = &ctx.scale;
    let backend = TlsHttpBackend::start("shoot", &ctx.ca.server(&[SNI])?, None).await?;
    let mut slots = vec![Slot::Up(Running::direct(&[("front", backend.addr())]))];
    slots.extend(sni_systems(ctx, SNI, backend.addr(), false, None).await);
    let rate = s.fixed_rate;
    let m_sat = res.figure(
        FULL_TLS,
        &format!("full-TLS connections/s ({} concurrent)", s.concurrency),
        "conn/s",
        Better::Higher,
    );
    let m_sat50 = res.metric(SC, "time to first byte p50 at saturation", "µs", Better::Lower);
    let m_sat99 = res.metric(SC, "time to first byte p99 at saturation", "µs", Better::Lower);
    let m50 = res.figure(TTFB_P50, &format!("time to first byte p50 at {rate} conn/s"), "µs", Better::Lower);
    let m99 = res.figure(TTFB_P99, &format!("time to first byte p99 at {rate} conn/s"), "µs", Better::Lower);
    let m999 = res.metric(SC, &format!("time to first byte p99.9 at {rate} conn/s"), "µs", Better::Lower);
    let all = [m_sat, m_sat50, m_sat99, m50, m99, m999];
    res.remark(
        SC,
        "transaction = TCP connect + full TLS 1.3 handshake (rustls, no resumption, ECDSA P-256 certificate) + GET / + response to close; \
         client and TLS backend share the load CPU, so direct is bounded by the harness's own crypto",
    );
    let request: Arc<[u8]> = format!("GET / HTTP/1.1\r\nHost: {SNI}\r\nConnection: close\r\n\r\n").into_bytes().into();
    let sni = ServerName::try_from(SNI)?.to_owned();
    for _ in 0..s.repeats {
        for slot in &mut slots {
            let Slot::Up(sys) = slot else { continue };
            let txn = Txn::Tls {
                addr: sys.addr("front")?,
                sni: sni.clone(),
                cfg: ctx.tls_client.clone(),
                request: request.clone(),
            };
            let r = closed_loop(&txn, s.concurrency, s.warmup, s.window).await;
            let figs =
                [(m_sat, r.rate), (m_sat50, r.first_byte.quantile_us(0.5)), (m_sat99, r.first_byte.quantile_us(0.99))];
            record_rate(res, sys, &r, &figs);
            let r = open_loop(&txn, rate, s.warmup, s.window, 1000).await;
            let figs = [
                (m50, r.first_byte.quantile_us(0.5)),
                (m99, r.first_byte.quantile_us(0.99)),
                (m999, r.first_byte.quantile_us(0.999)),
            ];
            record_rate(res, sys, &r, &figs);
        }
    }
    record_skips(res, &all, &slots);
    Ok(())
}

/// Connections/s against direct, and the latency sni-router adds at the fixed rate (200/s).
pub(super) fn targets(t: &mut Targets<'_>) {
    t.ratio_at_least(
        "full-TLS connections/s ≥ 0.8× direct",
        of(FULL_TLS, "sni-router"),
        of(FULL_TLS, "direct"),
        0.8,
        "conn/s",
    );
    t.check("added median latency ≤ 15 µs", &[of(TTFB_P50, "sni-router"), of(TTFB_P50, "direct")], |v| {
        let added = v[0] - v[1];
        Some((format!("{added:+.0} µs (at 200 conn/s)"), added <= 15.0))
    });
    let p99 = |sys| of(TTFB_P99, sys);
    t.check("added p99 latency ≤ ½ haproxy's", &[p99("sni-router"), p99("haproxy"), p99("direct")], |v| {
        let (ours, theirs) = (v[0] - v[2], v[1] - v[2]);
        Some((format!("{ours:+.0} µs vs haproxy {theirs:+.0} µs"), ours <= theirs / 2.0))
    });
}
