//! The gRPC front end (konnectivity's `ProxyService`, kube-apiserver's `proxyProtocol: GRPC`) beside the CONNECT one of the same proxy-server: opens/s, bulk upload and idle memory per connection, and their gRPC ÷ CONNECT ratios.
//!
//! Both front ends are plain TCP on one proxy-server with one agent, so a ratio is the cost of
//! gRPC's framing (HTTP/2, protobuf `Packet`s) over CONNECT's raw bytes. The gRPC client is
//! konnectivity-client's shape: one gRPC connection, one `Proxy` stream per dial.

use super::{SC, Targets, Tunnel};
use crate::load::{self, PING_REQUEST, PING_RESPONSE, Preamble, Sink, Txn, bulk_upload, closed_loop, connect_head};
use crate::report::{Better, MetricId, Results};
use crate::scenarios::{Ctx, record, record_rate};
use crate::systems::Running;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use testbed::konnectivity::{Client, Conn, data};
use testbed::tunnel_kit::Dialer;

const GRPC: &str = "proxy-server + proxy-agent (h2), gRPC front end";
const CONNECT: &str = "proxy-server + proxy-agent (h2), CONNECT front end";
/// Bytes per `DATA` packet of the upload (kube-apiserver writes what its client wrote, up to
/// 32 KiB at a time through io.Copy).
const UPLOAD_CHUNK: usize = 32 * 1024;

struct Figures {
    opens: MetricId,
    bulk: MetricId,
    mem: MetricId,
    n: usize,
}

pub(super) async fn run(ctx: &Ctx, res: &mut Results, t: &Targets, sink: &Sink) -> anyhow::Result<()> {
    // `--only` naming another system (profiling one transport) leaves the front ends out: their
    // system is the h2 tunnel, and not starting it is what was asked, not a failure.
    if let Err(why) = crate::systems::check_only(Tunnel::Seedgate.label()) {
        res.remark(SC, &format!("front ends: not measured, {why}"));
        return Ok(());
    }
    let s = &ctx.scale;
    let n = s.streams[0];
    let f = Figures {
        opens: res.metric(
            SC,
            &format!("front ends: dial + small request/s ({} concurrent)", s.concurrency),
            "conn/s",
            Better::Higher,
        ),
        bulk: res.metric(SC, "front ends: bulk upload, 1 connection", "Gbit/s", Better::Higher),
        mem: res.metric(
            SC,
            &format!("front ends: memory per idle connection at {n} (both ends)"),
            "KiB",
            Better::Lower,
        ),
        n,
    };
    res.remark(
        SC,
        "front ends: one proxy-server + agent, its CONNECT and gRPC (konnectivity ProxyService, one gRPC connection, one Proxy stream per dial) front ends on plain TCP; \
         small request = dial the ping target, 39 bytes out, 66 back, closed by the target",
    );
    for _ in 0..s.repeats {
        let mut sys = Tunnel::Seedgate.start(ctx, t).await?;
        sys.label = CONNECT.into();
        connect_figures(ctx, res, &mut sys, t, sink, &f).await?;
        grpc_figures(ctx, res, &mut sys, t, sink, &f).await?;
    }
    ratios(res, &f);
    Ok(())
}

async fn connect_figures(
    ctx: &Ctx,
    res: &mut Results,
    sys: &mut Running,
    t: &Targets,
    sink: &Sink,
    f: &Figures,
) -> anyhow::Result<()> {
    let s = &ctx.scale;
    let fe = sys.addr("frontend")?;
    let head = |to: std::net::SocketAddr| Preamble::Connect(connect_head(&to.to_string(), "").into());
    let Preamble::Connect(h) = head(t.ping) else { unreachable!() };
    let r = closed_loop(&Txn::Connect { addr: fe, head: h }, s.concurrency, s.warmup, s.window).await;
    record_rate(res, sys, &r, &[(f.opens, r.rate)]);
    let r = bulk_upload(fe, &head(t.sink), 1, sink, s.warmup, s.window).await;
    record(res, f.bulk, CONNECT, sys.kind, r.and_then(|v| sys.check_alive().map(|()| v)));
    let echo = head(t.echo);
    let _ = load::hold(fe, &echo, b"w", 1, 20, 20).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = sys.rss_kib();
    let held = load::hold(fe, &echo, b"x", 1, f.n, 256).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let per = held.map(|h| (sys.rss_kib().saturating_sub(before) as f64 / f.n as f64, h));
    record(res, f.mem, CONNECT, sys.kind, per.map(|(v, _held)| v));
    Ok(())
}

async fn grpc_figures(
    ctx: &Ctx,
    res: &mut Results,
    sys: &mut Running,
    t: &Targets,
    sink: &Sink,
    f: &Figures,
) -> anyhow::Result<()> {
    let s = &ctx.scale;
    let client = Client::connect(Dialer::Tcp(sys.addr("grpc")?)).await?;
    let r = opens(&client, &t.ping.to_string(), s.concurrency, s.warmup, s.window).await;
    record(res, f.opens, GRPC, sys.kind, r.and_then(|v| sys.check_alive().map(|()| v)));
    let r = upload(&client, &t.sink.to_string(), sink, s.warmup, s.window).await;
    record(res, f.bulk, GRPC, sys.kind, r.and_then(|v| sys.check_alive().map(|()| v)));
    let echo = t.echo.to_string();
    let _ = hold(&client, &echo, 20).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = sys.rss_kib();
    let held = hold(&client, &echo, f.n).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let per = held.map(|h| (sys.rss_kib().saturating_sub(before) as f64 / f.n as f64, h));
    record(res, f.mem, GRPC, sys.kind, per.map(|(v, _held)| v));
    Ok(())
}

/// One small request through a `Proxy` stream: dial, send, read the answer up to `CLOSE_RSP`.
async fn small_request(client: &Client, target: &str) -> anyhow::Result<()> {
    let mut conn = client.dial(target).await?.map_err(anyhow::Error::msg)?;
    conn.send(PING_REQUEST.to_vec()).await?;
    let r = conn.read_to_close().await?;
    anyhow::ensure!(r.data == PING_RESPONSE && r.closed, "answer {} bytes, closed {}", r.data.len(), r.closed);
    Ok(())
}

/// Closed loop of small requests from `concurrency` workers on one gRPC connection: the rate
/// completed in the measuring window.
async fn opens(
    client: &Client,
    target: &str,
    concurrency: usize,
    warmup: Duration,
    window: Duration,
) -> anyhow::Result<f64> {
    let t0 = Instant::now();
    let (ws, we) = (t0 + warmup, t0 + warmup + window);
    let (done, errors) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let first_err = Arc::new(std::sync::Mutex::new(None::<String>));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let (client, target) = (client.clone(), target.to_owned());
        let (done, errors, first_err) = (done.clone(), errors.clone(), first_err.clone());
        // Bounded by the window's end.
        tasks.spawn(async move {
            while Instant::now() < we {
                let r = small_request(&client, &target).await;
                let now = Instant::now();
                match r {
                    Ok(()) if now > ws && now <= we => _ = done.fetch_add(1, Ordering::Relaxed),
                    Ok(()) => {}
                    Err(e) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        first_err.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(format!("{e:#}"));
                    }
                }
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    let (d, e) = (done.load(Ordering::Relaxed), errors.load(Ordering::Relaxed));
    let first = first_err.lock().unwrap_or_else(|e| e.into_inner()).clone().unwrap_or_default();
    anyhow::ensure!(d > 0 && e * 100 <= d + e, "{e} errors, {d} completed (first: {first})");
    Ok(d as f64 / window.as_secs_f64())
}

/// One `Proxy` stream uploading to the sink as fast as it takes it: Gbit/s in the window.
async fn upload(client: &Client, target: &str, sink: &Sink, warmup: Duration, window: Duration) -> anyhow::Result<f64> {
    let conn = client.dial(target).await?.map_err(anyhow::Error::msg)?;
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, id, st) = (conn.stream.tx.clone(), conn.connect_id, stop.clone());
    let writer = tokio::spawn(async move {
        let chunk = vec![0xa5u8; UPLOAD_CHUNK];
        // Until told to stop (or the stream breaks).
        while !st.load(Ordering::Relaxed) && tx.send(data(id, chunk.clone())).await.is_ok() {}
    });
    tokio::time::sleep(warmup).await;
    let (b0, t0) = (sink.bytes(), Instant::now());
    tokio::time::sleep(window).await;
    let (b1, t1) = (sink.bytes(), Instant::now());
    stop.store(true, Ordering::Relaxed);
    let broke = writer.is_finished();
    drop(conn);
    writer.abort();
    anyhow::ensure!(!broke, "the upload stream broke");
    Ok((b1 - b0) as f64 * 8.0 / 1e9 / (t1 - t0).as_secs_f64())
}

/// `n` `Proxy` streams to the echo target, each with one byte echoed, held open.
async fn hold(client: &Client, target: &str, n: usize) -> anyhow::Result<Vec<Conn>> {
    let mut held = Vec::with_capacity(n);
    let mut tasks = tokio::task::JoinSet::new();
    // In batches of 256 at once, as load::hold opens its connections.
    for chunk in (0..n).collect::<Vec<_>>().chunks(256) {
        for _ in chunk {
            let (client, target) = (client.clone(), target.to_owned());
            tasks.spawn(async move {
                let mut c = client.dial(&target).await?.map_err(anyhow::Error::msg)?;
                c.send(b"x".to_vec()).await?;
                c.read_exact(1).await?;
                anyhow::Ok(c)
            });
        }
        while let Some(r) = tasks.join_next().await {
            held.push(r??);
        }
    }
    Ok(held)
}

/// gRPC ÷ CONNECT (medians) of each figure, as a remark.
fn ratios(res: &mut Results, f: &Figures) {
    let mut parts = Vec::new();
    for id in [f.opens, f.bulk, f.mem] {
        let m = &res.metrics[id.0];
        let med = |label: &str| m.rows.iter().find(|r| r.system == label).and_then(|r| r.median());
        if let (Some(c), Some(g)) = (med(CONNECT), med(GRPC))
            && c != 0.0
        {
            parts.push(format!("{}: {}", m.name, crate::report::fmt_num(g / c)));
        }
    }
    if !parts.is_empty() {
        res.remark(SC, &format!("gRPC ÷ CONNECT front end (medians): {}", parts.join("; ")));
    }
}
