//! noisy-neighbour: shoot B's time to first byte through an SNI gateway, quiet and while shoot A
//! floods the gateway at its connection limit: sni-router, haproxy and nginx with the same
//! process cap and, where they have one, the same per-route cap.
//!
//! One gateway, two routes by SNI: shoot A's name to a sink that holds every connection open,
//! shoot B's to a TLS backend. Every system is capped at [`LIMIT`] client connections:
//! - sni-router: `limits.max_connections: 1000` and its default route share (`tenant_share`
//!   0.25 of each process limit when the process is full, up to half while the rest is idle);
//! - haproxy: `maxconn 1000` (global and frontend) and, per route, `maxconn 500` on the
//!   backend's server with `timeout queue 5s` (the same half; the rest waits in the queue);
//! - nginx: one worker with `worker_connections` for 1,000 proxied clients (two connections
//!   each) and no per-route cap: the stream module's `limit_conn` runs before `ssl_preread`, so
//!   the server name is not known yet when it counts.
//!
//! Shoot B's client does full transactions (TCP connect, TLS 1.3 handshake with B's backend
//! through the gateway, `GET /`, the response) at a fixed rate; its time to first byte p50 and
//! p99 are measured with the gateway quiet, then while [`FLOODERS`] clients of shoot A each open
//! a connection with a real ClientHello for A's name and hold it, opening it again about
//! [`RETRY`] (jittered) after the gateway refused or closed it, so the gateway stays at its limit. A B transaction
//! that fails or takes longer than the load generator's timeout makes its run an error row.
//! Figures are printed, never asserted.

use super::sni_bulk::{haproxy_sni_frontend, nginx_sni_server, router_sni_listener};
use super::{Ctx, record_rate, record_skips};
use crate::host;
use crate::load::{Preamble, Sink, Txn, client_hello, open, open_loop};
use crate::report::{Better, FigureId, Kind, Results, Targets, fmt_num, of};
use crate::systems::{self, Running, Slot};
use rustls::pki_types::ServerName;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use testbed::TlsHttpBackend;
use tokio::io::AsyncReadExt;
use tokio::sync::watch;
use tokio::task::JoinSet;

pub(super) const SC: &str = "noisy-neighbour";
const P99_QUIET: FigureId = FigureId::new(SC, "b-ttfb-p99-quiet");
const P99_FLOOD: FigureId = FigureId::new(SC, "b-ttfb-p99-flooding");
const SNI_A: &str = "api.shoot-a.bench.example";
const SNI_B: &str = "api.shoot-b.bench.example";
/// Client connections every system may hold.
const LIMIT: usize = 1000;
/// Shoot A's clients: half again the process limit, so the gateway is always at it.
const FLOODERS: usize = LIMIT * 3 / 2;
/// How long a refused or closed shoot-A client waits before it opens its connection again, on
/// average: each wait is drawn from half to one and a half times it, as clients with jittered
/// back-off do (without it every refused client would come back in the same millisecond).
const RETRY: Duration = Duration::from_secs(1);
/// How long shoot A floods before shoot B is measured: every flooder has connected (or been
/// refused) and the first retries have come.
const RAMP: Duration = Duration::from_secs(3);

/// The three gateways, each exposing the role `front`.
async fn gateways(ctx: &Ctx, a: SocketAddr, b: SocketAddr) -> Vec<Slot> {
    let env = ctx.env();
    let mut slots = Vec::new();
    let yaml = router_sni_listener(&[("shoot-a".into(), SNI_A.into(), a), ("shoot-b".into(), SNI_B.into(), b)]);
    let limits = format!("limits: {{ max_connections: {LIMIT} }}\n");
    let r = systems::sni_router_with(&env, "sni-router", &limits, &yaml).await.and_then(|mut r| {
        r.set_addr("front", r.addr("gateway")?);
        Ok(r)
    });
    slots.push(Slot::from("sni-router", Kind::Seedgate, r));
    let r = async {
        let front = host::free_port([127, 0, 0, 1])?;
        let per_route = LIMIT / 2;
        let body = format!(
            "{}backend be_a\n    timeout queue 5s\n    server up {a} maxconn {per_route}\n\
             backend be_b\n    timeout queue 5s\n    server up {b} maxconn {per_route}\n",
            haproxy_sni_frontend(front, "sni.map")
        );
        let files = [("sni.map", format!("{SNI_A} be_a\n{SNI_B} be_b\n"))];
        systems::haproxy_with(&env, "haproxy", &body, &files, &[("front", front)], false, Some(LIMIT as u32)).await
    }
    .await;
    slots.push(Slot::from("haproxy", Kind::Anchor, r));
    let r = async {
        let front = host::free_port([127, 0, 0, 1])?;
        let body = nginx_sni_server(front, &format!("        {SNI_A} {a};\n        {SNI_B} {b};\n"));
        let wc = Some(2 * LIMIT as u32 + 2);
        systems::nginx_with(&env, "nginx", &body, &[], &[("front", front)], false, wc).await
    }
    .await;
    slots.push(Slot::from("nginx", Kind::Anchor, r));
    slots
}

/// Shoot A's flood: [`FLOODERS`] clients holding connections, until dropped.
struct Flood {
    stop: watch::Sender<bool>,
    tasks: JoinSet<()>,
    /// Connections open now (connected, not yet closed by the gateway).
    open: Arc<AtomicUsize>,
}

impl Flood {
    fn start(front: SocketAddr, hello: Arc<[u8]>) -> Self {
        let (stop, rx) = watch::channel(false);
        let open_now = Arc::new(AtomicUsize::new(0));
        let mut tasks = JoinSet::new();
        for i in 0..FLOODERS {
            let (mut rx, pre, open_now) = (rx.clone(), Preamble::Raw(hello.clone()), open_now.clone());
            let mut rng = 0x9e37_79b9_7f4a_7c15_u64 ^ (i as u64 + 1);
            tasks.spawn(async move {
                // Ends when told to stop: every wait below also watches `rx`.
                while !*rx.borrow() {
                    if let Ok(Ok(mut s)) = tokio::time::timeout(RETRY, open(front, &pre)).await {
                        open_now.fetch_add(1, Ordering::Relaxed);
                        let mut buf = [0u8; 512];
                        // Held until the gateway closes it (a refusal) or the flood stops.
                        loop {
                            tokio::select! {
                                _ = rx.changed() => break,
                                r = s.read(&mut buf) => if !matches!(r, Ok(n) if n > 0) { break },
                            }
                        }
                        open_now.fetch_sub(1, Ordering::Relaxed);
                    }
                    tokio::select! {
                        _ = rx.changed() => {}
                        _ = tokio::time::sleep(jittered(&mut rng)) => {}
                    }
                }
            });
        }
        Self { stop, tasks, open: open_now }
    }

    async fn stop(mut self) -> usize {
        let held = self.open.load(Ordering::Relaxed);
        let _ = self.stop.send(true);
        while self.tasks.join_next().await.is_some() {}
        held
    }
}

/// [`RETRY`] times a factor from 0.5 to 1.5 (xorshift64: the flood needs spread, not secrecy).
fn jittered(state: &mut u64) -> Duration {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    RETRY.mul_f64(0.5 + (*state % 1000) as f64 / 1000.0)
}

pub(super) async fn run(ctx: &Ctx, res: &mut Results) -> anyhow::Result<()> {
    let s = &ctx.scale;
    let sink = Sink::start().await?;
    let backend = TlsHttpBackend::start("shoot-b", &ctx.ca.server(&[SNI_B])?, None).await?;
    let mut slots = gateways(ctx, sink.addr(), backend.addr()).await;
    let rate = s.fixed_rate;
    let m_q50 = res.metric(SC, &format!("shoot B time to first byte p50, quiet, {rate} conn/s"), "µs", Better::Lower);
    let m_q99 =
        res.figure(P99_QUIET, &format!("shoot B time to first byte p99, quiet, {rate} conn/s"), "µs", Better::Lower);
    let m_f50 = res.metric(SC, "shoot B time to first byte p50, shoot A flooding", "µs", Better::Lower);
    let m_f99 = res.figure(P99_FLOOD, "shoot B time to first byte p99, shoot A flooding", "µs", Better::Lower);
    let all = [m_q50, m_q99, m_f50, m_f99];
    res.remark(
        SC,
        &format!(
            "every gateway capped at {LIMIT} client connections; haproxy: server maxconn {} per route with a 5 s queue; \
             nginx: no per-route cap (stream limit_conn runs before ssl_preread); shoot A: {FLOODERS} clients holding \
             connections (a ClientHello, then silence), each opening again 0.5-1.5 × {RETRY:?} after a refusal; shoot B: full TLS \
             transactions at {rate} conn/s",
            LIMIT / 2
        ),
    );
    let hello: Arc<[u8]> = client_hello(ctx.tls_client.clone(), SNI_A)?.into();
    let request: Arc<[u8]> =
        format!("GET / HTTP/1.1\r\nHost: {SNI_B}\r\nConnection: close\r\n\r\n").into_bytes().into();
    let sni = ServerName::try_from(SNI_B)?.to_owned();
    for _ in 0..s.repeats {
        for slot in &mut slots {
            let Slot::Up(sys) = slot else { continue };
            let front = sys.addr("front")?;
            let txn = Txn::Tls { addr: front, sni: sni.clone(), cfg: ctx.tls_client.clone(), request: request.clone() };
            let r = open_loop(&txn, rate, s.warmup, s.window, 1000).await;
            record_rate(
                res,
                sys,
                &r,
                &[(m_q50, r.first_byte.quantile_us(0.5)), (m_q99, r.first_byte.quantile_us(0.99))],
            );
            let flood = Flood::start(front, hello.clone());
            tokio::time::sleep(RAMP).await;
            let r = open_loop(&txn, rate, s.warmup, s.window, 1000).await;
            let held = flood.stop().await;
            eprintln!("  {SC} | {} | shoot A connections open at the end of the run: {held}", sys.label);
            record_rate(
                res,
                sys,
                &r,
                &[(m_f50, r.first_byte.quantile_us(0.5)), (m_f99, r.first_byte.quantile_us(0.99))],
            );
            settle(sys).await;
        }
    }
    record_skips(res, &all, &slots);
    Ok(())
}

/// Wait (bounded) until the gateway has let go of shoot A's connections, so the next system's
/// or repeat's quiet run is quiet.
async fn settle(sys: &Running) {
    let mut last = sys.socket_fds();
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = sys.socket_fds();
        if now == last && now < LIMIT / 10 {
            return;
        }
        last = now;
    }
}

/// Shoot B's p99 under shoot A's flood against its quiet p99, through sni-router.
pub(super) fn targets(t: &mut Targets<'_>) {
    t.check(
        "shoot B's p99 with shoot A flooding ≤ 1.5× quiet",
        &[of(P99_FLOOD, "sni-router"), of(P99_QUIET, "sni-router")],
        |v| {
            let (flood, quiet) = (v[0], v[1]);
            (quiet > 0.0).then(|| {
                (format!("{} ÷ {} µs = {:.2}×", fmt_num(flood), fmt_num(quiet), flood / quiet), flood / quiet <= 1.5)
            })
        },
    );
}
