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
use crate::report::{Better, Results};
use crate::systems::{Running, Slot};
use rustls::pki_types::ServerName;
use std::sync::Arc;
use testbed::TlsHttpBackend;

const SC: &str = "sni-connrate";
const SNI: &str = "api.bench.example";

pub(super) async fn run(ctx: &Ctx, res: &mut Results) -> anyhow::Result<()> {
    let s = &ctx.scale;
    let backend = TlsHttpBackend::start("shoot", &ctx.ca.server(&[SNI])?, None).await?;
    let mut slots = vec![Slot::Up(Running::direct(&[("front", backend.addr())]))];
    slots.extend(sni_systems(ctx, SNI, backend.addr(), false, None).await);
    let rate = s.fixed_rate;
    let m_sat =
        res.metric(SC, &format!("full-TLS connections/s ({} concurrent)", s.concurrency), "conn/s", Better::Higher);
    let m_sat50 = res.metric(SC, "time to first byte p50 at saturation", "µs", Better::Lower);
    let m_sat99 = res.metric(SC, "time to first byte p99 at saturation", "µs", Better::Lower);
    let m50 = res.metric(SC, &format!("time to first byte p50 at {rate} conn/s"), "µs", Better::Lower);
    let m99 = res.metric(SC, &format!("time to first byte p99 at {rate} conn/s"), "µs", Better::Lower);
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
