//! idle-memory: RSS per established, idle proxied connection.
//!
//! For each system, freshly started for every repeat: warm the path up with 20 connections
//! (closed again), read the RSS of all its processes (VmRSS, summed over the process tree; both
//! ends for tunnels), open N connections through it to the echo helper (each completes a round
//! trip, so it is routed and established end to end), wait 500 ms, read the RSS again:
//! (after − before) / N. The echo helper is a separate process so that the harness (N client
//! sockets) and the backend (N sockets) each stay under the 20,000-fd limit.

use super::connect::{CONNECT_JS, DEST_PING, head, nginx_connect_server, router_connect_listener};
use super::sni_bulk::{haproxy_sni_frontend, nginx_sni_server, router_sni_listener};
use super::{Ctx, record};
use crate::host;
use crate::load::{self, Preamble, client_hello};
use crate::report::{Better, FigureId, Kind, MetricId, Results, Targets, of};
use crate::systems::{self, Running};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

pub(super) const SC: &str = "idle-memory";
const PER_ROUTED: FigureId = FigureId::new(SC, "sni-per-connection");
const PER_CONNECT: FigureId = FigureId::new(SC, "connect-per-connection");
const PER_STREAM: FigureId = FigureId::new(SC, "tunnel-per-stream");
const SNI: &str = "idle.bench.example";

#[derive(Debug, Clone, Copy, PartialEq)]
enum Sys {
    RouterSni,
    HaproxySni,
    NginxSni,
    RouterConnect,
    Squid,
    Tinyproxy,
    NginxConnect,
    Tunnel,
    Rathole { tls: bool },
    Ssh,
}

impl Sys {
    const ALL: [Sys; 11] = [
        Self::RouterSni,
        Self::HaproxySni,
        Self::NginxSni,
        Self::RouterConnect,
        Self::Squid,
        Self::Tinyproxy,
        Self::NginxConnect,
        Self::Tunnel,
        Self::Rathole { tls: false },
        Self::Rathole { tls: true },
        Self::Ssh,
    ];

    fn label(self) -> &'static str {
        match self {
            Self::RouterSni => "sni-router",
            Self::HaproxySni => "haproxy",
            Self::NginxSni => "nginx",
            Self::RouterConnect => "sni-router",
            Self::Squid => "squid",
            Self::Tinyproxy => "tinyproxy",
            Self::NginxConnect => "nginx njs",
            Self::Tunnel => "proxy-server + proxy-agent",
            Self::Rathole { tls: false } => "rathole (tcp)",
            Self::Rathole { tls: true } => "rathole (tls)",
            Self::Ssh => "ssh -R",
        }
    }

    fn kind(self) -> Kind {
        match self {
            Self::RouterSni | Self::RouterConnect | Self::Tunnel => Kind::Seedgate,
            _ => Kind::Anchor,
        }
    }

    /// 0: SNI passthrough, 1: HTTP CONNECT, 2: reverse tunnel.
    fn group(self) -> usize {
        match self {
            Self::RouterSni | Self::HaproxySni | Self::NginxSni => 0,
            Self::RouterConnect | Self::Squid | Self::Tinyproxy | Self::NginxConnect => 1,
            _ => 2,
        }
    }

    /// Start the system in front of `echo`; returns it with the client address and preamble.
    async fn start(
        self,
        ctx: &Ctx,
        echo: SocketAddr,
        hello: &Arc<[u8]>,
    ) -> anyhow::Result<(Running, SocketAddr, Preamble)> {
        let env = ctx.env();
        let sni_pre = Preamble::Raw(hello.clone());
        let connect_pre = Preamble::Connect(head(echo, DEST_PING));
        let label = self.label();
        Ok(match self {
            Self::RouterSni => {
                let r =
                    systems::sni_router(&env, label, &router_sni_listener(&[("r".into(), SNI.into(), echo)])).await?;
                let a = r.addr("gateway")?;
                (r, a, sni_pre)
            }
            Self::HaproxySni => {
                let front = host::free_port([127, 0, 0, 1])?;
                let body = format!("{}backend be_up\n    server up {echo}\n", haproxy_sni_frontend(front, "sni.map"));
                let r = systems::haproxy(
                    &env,
                    label,
                    &body,
                    &[("sni.map", format!("{SNI} be_up\n"))],
                    &[("front", front)],
                    false,
                )
                .await?;
                (r, front, sni_pre)
            }
            Self::NginxSni => {
                let front = host::free_port([127, 0, 0, 1])?;
                let r = systems::nginx(
                    &env,
                    label,
                    &nginx_sni_server(front, &format!("        {SNI} {echo};\n")),
                    &[],
                    &[("front", front)],
                    false,
                )
                .await?;
                (r, front, sni_pre)
            }
            Self::RouterConnect => {
                let r = systems::sni_router(&env, label, &router_connect_listener(echo, echo)).await?;
                let a = r.addr("gateway")?;
                (r, a, connect_pre)
            }
            Self::Squid => {
                let r = systems::squid(&env, label).await?;
                let a = r.addr("proxy")?;
                (r, a, connect_pre)
            }
            Self::Tinyproxy => {
                let r = systems::tinyproxy(&env, label).await?;
                let a = r.addr("proxy")?;
                (r, a, connect_pre)
            }
            Self::NginxConnect => {
                let front = host::free_port([127, 0, 0, 1])?;
                let body = nginx_connect_server(front, echo, echo);
                let r = systems::nginx(
                    &env,
                    label,
                    &body,
                    &[("connect.js", CONNECT_JS.to_owned())],
                    &[("proxy", front)],
                    true,
                )
                .await?;
                (r, front, connect_pre)
            }
            Self::Tunnel => {
                // The tunnel's readiness probe needs a server that answers a request: echo does.
                let r = systems::seedgate_tunnel(&env, label, echo).await?;
                let a = r.addr("frontend")?;
                (r, a, Preamble::Connect(load::connect_head(&echo.to_string(), "").into()))
            }
            Self::Rathole { tls } => {
                let r = systems::rathole(&env, label, &[("echo", echo)], tls).await?;
                let a = r.addr("echo")?;
                (r, a, Preamble::None)
            }
            Self::Ssh => {
                let r = systems::ssh_reverse(&env, label, &[("echo", echo)]).await?;
                let a = r.addr("echo")?;
                (r, a, Preamble::None)
            }
        })
    }
}

pub(super) async fn run(ctx: &Ctx, res: &mut Results) -> anyhow::Result<()> {
    let s = &ctx.scale;
    let n = s.idle_conns;
    let (_helper, echo) = systems::echo_helper(ctx.dir.path()).await?;
    let hello: Arc<[u8]> = client_hello(ctx.tls_client.clone(), SNI)?.into();
    let metrics: [MetricId; 3] = [
        res.figure(PER_ROUTED, &format!("SNI passthrough: RSS per idle connection, {n} held"), "KiB", Better::Lower),
        res.figure(PER_CONNECT, &format!("HTTP CONNECT: RSS per idle connection, {n} held"), "KiB", Better::Lower),
        res.figure(
            PER_STREAM,
            &format!("reverse tunnel: RSS per idle stream, {n} held (both ends)"),
            "KiB",
            Better::Lower,
        ),
    ];
    res.remark(
        SC,
        "RSS = VmRSS summed over every process of the system (nginx master + worker, sshd + its session processes, both tunnel ends); \
         each connection completed an echo round trip through the system before the second reading",
    );
    for _ in 0..s.repeats {
        for sys in Sys::ALL {
            let (label, kind, m) = (sys.label(), sys.kind(), metrics[sys.group()]);
            let (mut run, addr, pre) = match sys.start(ctx, echo, &hello).await {
                Ok(x) => x,
                Err(e) => {
                    let why = format!("{e:#}");
                    if !why.contains("not installed") && !why.contains("missing") && !why.contains("filtered out") {
                        eprintln!("bench: {label} did not start: {why}");
                    }
                    res.skip(m, label, kind, why.lines().next().unwrap_or(""));
                    continue;
                }
            };
            let r = measure(&mut run, addr, &pre, hello.len(), n).await;
            if let Ok((_, Some(split))) = &r {
                eprintln!("  {label}: KiB per connection by process: {split}");
                res.note_split(m, label, kind, &format!("by process (KiB/conn, last repeat): {split}"));
            }
            record(res, m, label, kind, r.map(|(v, _)| v));
            drop(run);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(())
}

async fn measure(
    run: &mut Running,
    addr: SocketAddr,
    pre: &Preamble,
    hello_len: usize,
    n: usize,
) -> anyhow::Result<(f64, Option<String>)> {
    // The SNI preamble is echoed back; the CONNECT/forward ones get a one-byte probe.
    let (probe, back): (&[u8], usize) = match pre {
        Preamble::Raw(_) => (b"", hello_len),
        _ => (b"x", 1),
    };
    let warm = load::hold(addr, pre, probe, back, 20, 20).await?;
    drop(warm);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = run.rss_kib();
    let parts0 = run.rss_by_process();
    let held = load::hold(addr, pre, probe, back, n, 256).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = run.rss_kib();
    let parts1 = run.rss_by_process();
    run.check_alive()?;
    drop(held);
    // Where it goes, for systems of several processes (both tunnel ends).
    let split = (parts0.len() > 1).then(|| {
        parts0
            .iter()
            .zip(&parts1)
            .map(|((name, b), (_, a))| format!("{name} {:.1}", a.saturating_sub(*b) as f64 / n as f64))
            .collect::<Vec<_>>()
            .join(" + ")
    });
    Ok((after.saturating_sub(before) as f64 / n as f64, split))
}

/// Memory per idle routed connection and per idle tunnel stream.
pub(super) fn targets(t: &mut Targets<'_>) {
    t.value(
        "idle memory ≤ 2 KiB per routed connection (sni-router)",
        of(PER_ROUTED, "sni-router"),
        |v| format!("{v:.1} KiB"),
        |v| v <= 2.0,
    );
    t.value(
        "idle memory ≤ 4.5 KiB per tunnel stream (both ends)",
        of(PER_STREAM, "proxy-server"),
        |v| format!("{v:.2} KiB"),
        |v| v <= 4.5,
    );
}
