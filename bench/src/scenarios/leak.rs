//! leak: what every seedgate process holds (fds, tokio tasks, RSS) before and after N short connections of every kind.
//!
//! One sni-router (SNI passthrough, PROXY-v2 and CONNECT listeners) and one proxy-server +
//! proxy-agent pair (a CONNECT / forward-proxy front end) are started with a short handshake
//! deadline. Connections go round-robin over five paths — SNI passthrough, the PROXY-v2
//! listener, CONNECT (all sni-router), CONNECT through the reverse tunnel and an absolute-form
//! GET through the tunnel's front end — and end in four ways: 70% complete an exchange with a
//! backend, 10% are reset by the client mid-stream (SO_LINGER 0 after data went both ways), 10%
//! stall before their head is complete (the handshake deadline closes them) and 10% ask for an
//! upstream whose port is closed. At most `leak_concurrency` are in flight.
//!
//! Each process is read from outside (`/proc/<pid>/fd`, VmRSS) and through its admin endpoint
//! (`seedgate_runtime_alive_tasks`): after a warm-up (so pools and lazily built state exist),
//! and again once the connections are done and the counts stopped falling (polled every second,
//! bounded). The report gives both and the difference — figures, never a verdict. [`Topology`],
//! [`Targets`] and the sampling are shared with the soak scenario.

use super::{Ctx, record};
use crate::host;
use crate::load::{Echo, PING_REQUEST, Ping, client_hello, connect_head, proxy_v2, read_connect_response};
use crate::report::{Better, Kind, MetricId, Results};
use crate::systems::{self, Running};
use anyhow::{Context as _, ensure};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::task::JoinSet;
use tokio::time::Instant;

pub(super) const SC: &str = "leak";
/// The handshake deadline both front ends get, so stalled clients are closed quickly.
pub(super) const HANDSHAKE: &str = "500ms";
/// One connection of any kind must be over within this (a stalled one takes the deadline).
const CONN_TIMEOUT: Duration = Duration::from_secs(10);
/// The CONNECT destinations (header values) of sni-router's CONNECT routes.
const DEST: [&str; 3] = ["leak-ping", "leak-echo", "leak-refused"];
const CONNECT_HEADER: &str = "X-Gardener-Destination";
/// SNI names and PROXY-v2 destinations of the routes to ping, echo and the closed port.
const SNI: [&str; 3] = ["ping.leak.bench", "echo.leak.bench", "refused.leak.bench"];
const PP_DST: [&str; 3] = ["10.1.2.1:443", "10.1.2.2:443", "10.1.2.3:443"];
/// The alive-tasks gauge every binary exports.
const TASKS_METRIC: &str = "seedgate_runtime_alive_tasks";

/// The five ways through seedgate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Path {
    Sni,
    ProxyV2,
    Connect,
    TunnelConnect,
    Forward,
}

impl Path {
    pub(super) const ALL: [Path; 5] = [Self::Sni, Self::ProxyV2, Self::Connect, Self::TunnelConnect, Self::Forward];

    pub(super) fn label(self) -> &'static str {
        match self {
            Self::Sni => "SNI passthrough",
            Self::ProxyV2 => "PROXY v2",
            Self::Connect => "CONNECT",
            Self::TunnelConnect => "tunnel CONNECT",
            Self::Forward => "forward proxy",
        }
    }

    /// Whether the client waits for a `200` before its payload.
    fn connect_first(self) -> bool {
        matches!(self, Self::Connect | Self::TunnelConnect)
    }
}

/// How a connection ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ending {
    /// A request and the whole answer, closed in order.
    Complete,
    /// Data both ways, then the client resets (SO_LINGER 0).
    Reset,
    /// Part of the head, then nothing: the proxy's handshake deadline closes it.
    Stall,
    /// Routed to an upstream whose port is closed.
    Refused,
}

impl Ending {
    pub(super) const ALL: [Ending; 4] = [Self::Complete, Self::Reset, Self::Stall, Self::Refused];

    pub(super) fn label(self) -> &'static str {
        match self {
            Self::Complete => "complete",
            Self::Reset => "client reset",
            Self::Stall => "stalled (handshake timeout)",
            Self::Refused => "refused dial",
        }
    }
}

/// Connection number `i`: the path round-robin, the ending 7:1:1:1 within each ten of a path.
pub(super) fn kind_of(i: u64) -> (Path, Ending) {
    let path = Path::ALL[(i % 5) as usize];
    let ending = match (i / 5) % 10 {
        7 => Ending::Reset,
        8 => Ending::Stall,
        9 => Ending::Refused,
        _ => Ending::Complete,
    };
    (path, ending)
}

/// Everything a client needs to make a connection of any kind (cheap to share).
pub(super) struct Targets {
    sni: SocketAddr,
    pp: SocketAddr,
    gateway: SocketAddr,
    tunnel: SocketAddr,
    /// Ping, echo and the closed port.
    backends: [SocketAddr; 3],
    hellos: [Vec<u8>; 3],
    pp_headers: [Vec<u8>; 3],
}

/// Backend index: the ping (one answer, then FIN), the echo, the closed port.
const PING: usize = 0;
const ECHO: usize = 1;
const CLOSED: usize = 2;

impl Targets {
    fn front(&self, p: Path) -> SocketAddr {
        match p {
            Path::Sni => self.sni,
            Path::ProxyV2 => self.pp,
            Path::Connect => self.gateway,
            Path::TunnelConnect | Path::Forward => self.tunnel,
        }
    }

    /// The first bytes towards backend `b`: a ClientHello, a PROXY header, a CONNECT head or a
    /// forward-proxy request head (for the echo a POST whose body never ends).
    fn opening(&self, p: Path, b: usize) -> Vec<u8> {
        let target = self.backends[b];
        match p {
            Path::Sni => self.hellos[b].clone(),
            Path::ProxyV2 => self.pp_headers[b].clone(),
            Path::Connect => connect_head(&target.to_string(), &format!("{CONNECT_HEADER}: {}\r\n", DEST[b])),
            Path::TunnelConnect => connect_head(&target.to_string(), ""),
            // The forward path has no echo: its reset sends a long body to the ping instead.
            Path::Forward if b == ECHO => format!(
                "POST http://{ping}/leak HTTP/1.1\r\nHost: {ping}\r\nContent-Length: 1048576\r\n\r\n",
                ping = self.backends[PING]
            )
            .into_bytes(),
            Path::Forward => {
                format!("GET http://{target}/leak HTTP/1.1\r\nHost: {target}\r\nConnection: close\r\n\r\n").into_bytes()
            }
        }
    }

    /// Make one connection of the kind; `Err` when seedgate did not behave as expected for it.
    pub(super) async fn run(&self, p: Path, e: Ending) -> anyhow::Result<()> {
        tokio::time::timeout(CONN_TIMEOUT, self.run_inner(p, e)).await.context("timed out")?
    }

    async fn run_inner(&self, p: Path, e: Ending) -> anyhow::Result<()> {
        let mut s = TcpStream::connect(self.front(p)).await.context("connect")?;
        s.set_nodelay(true)?;
        match e {
            Ending::Complete => {
                self.open(&mut s, p, PING).await?;
                if p != Path::Forward {
                    s.write_all(PING_REQUEST).await?;
                }
                let answer = read_to_close(&mut s).await?;
                ensure!(answer.starts_with(b"HTTP/1.1 200"), "answered {:?}", first_line(&answer));
            }
            Ending::Reset => {
                self.open(&mut s, p, ECHO).await?;
                s.write_all(&[0x5a; 1024]).await?;
                // Something came back (the echo, or the ping's answer): established end to end.
                let mut b = [0u8; 1024];
                let n = s.read(&mut b).await?;
                ensure!(n > 0, "EOF before any answer");
                // More in flight when the reset goes out.
                let _ = s.write_all(&[0xa5; 16 * 1024]).await;
                s.set_zero_linger()?;
                drop(s);
            }
            Ending::Stall => {
                let head = self.opening(p, PING);
                s.write_all(&head[..3]).await?;
                // The proxy closes at its handshake deadline (any answer before that is fine).
                read_to_close(&mut s).await?;
            }
            Ending::Refused => {
                let mut msg = self.opening(p, CLOSED);
                if matches!(p, Path::Sni | Path::ProxyV2) {
                    msg.extend_from_slice(PING_REQUEST);
                }
                s.write_all(&msg).await?;
                let answer = read_to_close(&mut s).await?;
                ensure!(!answer.starts_with(b"HTTP/1.1 200"), "a closed port answered {:?}", first_line(&answer));
            }
        }
        Ok(())
    }

    /// Send the opening towards backend `b`; for CONNECT wait for the `200`.
    async fn open(&self, s: &mut TcpStream, p: Path, b: usize) -> anyhow::Result<()> {
        s.write_all(&self.opening(p, b)).await?;
        if p.connect_first() {
            read_connect_response(s).await?;
        }
        Ok(())
    }
}

fn first_line(b: &[u8]) -> String {
    String::from_utf8_lossy(b.split(|&c| c == b'\r').next().unwrap_or_default()).chars().take(80).collect()
}

/// Read until the peer closes (a reset counts as closed); at most 1 MiB is kept.
async fn read_to_close(s: &mut TcpStream) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    // Bounded by the caller's timeout and the size check.
    loop {
        match s.read(&mut buf).await {
            Ok(0) => return Ok(out),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe) => {
                return Ok(out);
            }
            Err(e) => return Err(e.into()),
        }
        ensure!(out.len() < 1 << 20, "more than 1 MiB came back");
    }
}

/// Connections made and those that did not go as expected, by path and ending.
#[derive(Debug, Default, Clone)]
pub(super) struct Tally {
    pub done: [[u64; 4]; 5],
    pub unexpected: [[u64; 4]; 5],
    pub first_unexpected: Option<String>,
}

impl Tally {
    pub(super) fn add(&mut self, p: Path, e: Ending, r: &anyhow::Result<()>) {
        let (pi, ei) = (p as usize, e as usize);
        self.done[pi][ei] += 1;
        if let Err(err) = r {
            self.unexpected[pi][ei] += 1;
            self.first_unexpected.get_or_insert_with(|| format!("{} / {}: {err:#}", p.label(), e.label()));
        }
    }

    pub(super) fn total(&self) -> u64 {
        self.done.iter().flatten().sum()
    }

    pub(super) fn total_unexpected(&self) -> u64 {
        self.unexpected.iter().flatten().sum()
    }

    /// One line per ending: how many, and how many went otherwise than expected, by path.
    pub(super) fn describe(&self) -> String {
        let mut parts = Vec::new();
        for e in Ending::ALL {
            let n: u64 = Path::ALL.iter().map(|&p| self.done[p as usize][e as usize]).sum();
            let bad: Vec<String> = Path::ALL
                .iter()
                .filter(|&&p| self.unexpected[p as usize][e as usize] > 0)
                .map(|&p| format!("{} {}", p.label(), self.unexpected[p as usize][e as usize]))
                .collect();
            let bad = if bad.is_empty() { String::new() } else { format!(" (not as expected: {})", bad.join(", ")) };
            parts.push(format!("{} {n}{bad}", e.label()));
        }
        parts.join("; ")
    }
}

/// `n` connections numbered from `first`, `concurrency` at a time.
pub(super) async fn mix(targets: &Arc<Targets>, first: u64, n: u64, concurrency: usize) -> Tally {
    let next = Arc::new(AtomicU64::new(first));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let end = first + n;
    let mut workers = JoinSet::new();
    for _ in 0..concurrency.max(1) {
        let (targets, next, tally) = (targets.clone(), next.clone(), tally.clone());
        workers.spawn(async move {
            // Each worker takes the next number until all are taken (every connection is bounded).
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= end {
                    break;
                }
                let (p, e) = kind_of(i);
                let r = targets.run(p, e).await;
                tally.lock().unwrap_or_else(|e| e.into_inner()).add(p, e, &r);
            }
        });
    }
    while workers.join_next().await.is_some() {}
    tally.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// One quantity read from each process, as both scenarios report it.
pub(super) struct Figure {
    pub name: &'static str,
    pub unit: &'static str,
    /// Unit of a change (difference, slope) and its factor from `unit`: RSS is read in MiB and
    /// changes in KiB.
    pub change_unit: &'static str,
    pub change_scale: f64,
    pub get: fn(&Sample) -> Option<f64>,
}

pub(super) const FIGURES: [Figure; 3] = [
    Figure { name: "open fds", unit: "fds", change_unit: "fds", change_scale: 1.0, get: |s| Some(s.fds) },
    Figure { name: "alive tokio tasks", unit: "tasks", change_unit: "tasks", change_scale: 1.0, get: |s| s.tasks },
    Figure { name: "RSS", unit: "MiB", change_unit: "KiB", change_scale: 1024.0, get: |s| Some(s.rss_kib / 1024.0) },
];

/// A seedgate process the scenario reads: by pid from outside, by admin address from inside.
#[derive(Debug, Clone)]
pub(super) struct Watched {
    pub name: &'static str,
    pub pid: u32,
    pub admin: SocketAddr,
}

/// One reading of a process.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Sample {
    pub fds: f64,
    /// `None` when the admin endpoint did not answer.
    pub tasks: Option<f64>,
    pub rss_kib: f64,
}

/// Read a process now: fds and RSS from `/proc` first (the scrape's own connection is not
/// counted), then the alive tasks from `/metrics`.
pub(super) async fn sample(w: &Watched) -> Sample {
    let fds = std::fs::read_dir(format!("/proc/{}/fd", w.pid)).map(|d| d.count() as f64).unwrap_or(f64::NAN);
    let rss_kib = host::rss_kib(w.pid).map_or(f64::NAN, |k| k as f64);
    let tasks = match testbed::admin::http_get(w.admin, "/metrics").await {
        Ok((200, text)) => testbed::admin::metric_value(&text, TASKS_METRIC, &[]),
        _ => None,
    };
    Sample { fds, tasks, rss_kib }
}

pub(super) async fn sample_all(ws: &[Watched]) -> Vec<Sample> {
    let mut out = Vec::with_capacity(ws.len());
    for w in ws {
        out.push(sample(w).await);
    }
    out
}

/// Poll every second until no process's fds or tasks reached a new low for three polls in a
/// row, or `max` passed; returns the last reading and the time taken.
pub(super) async fn settle(ws: &[Watched], max: Duration) -> (Vec<Sample>, Duration) {
    let t0 = Instant::now();
    let mut last = sample_all(ws).await;
    let mut lows: Vec<(f64, f64)> = last.iter().map(|s| (s.fds, s.tasks.unwrap_or(f64::INFINITY))).collect();
    let mut quiet = 0;
    // Bounded by `max`.
    while quiet < 3 && t0.elapsed() < max {
        tokio::time::sleep(Duration::from_secs(1)).await;
        last = sample_all(ws).await;
        let mut fell = false;
        for (low, s) in lows.iter_mut().zip(&last) {
            let tasks = s.tasks.unwrap_or(f64::INFINITY);
            if s.fds < low.0 || tasks < low.1 {
                fell = true;
            }
            *low = (low.0.min(s.fds), low.1.min(tasks));
        }
        quiet = if fell { 0 } else { quiet + 1 };
    }
    (last, t0.elapsed())
}

/// The systems and backends of the leak and soak scenarios.
pub(super) struct Topology {
    pub router: Running,
    pub tunnel: Running,
    pub targets: Arc<Targets>,
    pub watched: Vec<Watched>,
    _ping: Ping,
    _echo: Echo,
}

impl Topology {
    pub(super) async fn start(ctx: &Ctx, label: &str) -> anyhow::Result<Self> {
        let ping = Ping::start().await?;
        let echo = Echo::start().await?;
        // A port nothing listens on: bound, its address taken, closed again.
        let closed = host::free_port([127, 0, 0, 1])?;
        let ups = [ping.addr(), echo.addr(), closed];
        let env = ctx.env();
        let mut listeners = String::new();
        listeners.push_str("  - name: sni\n    listen: 127.0.0.1:0\n    routes:\n");
        for (i, up) in ups.iter().enumerate() {
            listeners
                .push_str(&format!("      - name: sni-{i}\n        sni: [{}]\n        upstreams: [{up}]\n", SNI[i]));
        }
        listeners.push_str(
            "  - name: pp\n    listen: 127.0.0.1:0\n    proxy_protocol: required\n    trusted_proxies: [127.0.0.0/8]\n    routes:\n",
        );
        for (i, up) in ups.iter().enumerate() {
            let ip = PP_DST[i].split(':').next().unwrap_or_default();
            listeners.push_str(&format!(
                "      - name: pp-{i}\n        destination: [{ip}/32]\n        upstreams: [{up}]\n"
            ));
        }
        listeners.push_str("  - name: gateway\n    listen: 127.0.0.1:0\n    routes:\n");
        for (i, up) in ups.iter().enumerate() {
            listeners.push_str(&format!(
                "      - name: connect-{i}\n        connect: {{ header: {CONNECT_HEADER}, values: [\"{}\"] }}\n        upstreams: [{up}]\n",
                DEST[i]
            ));
        }
        // No per-source cap: every client is 127.0.0.1.
        let top = format!(
            "timeouts: {{ handshake: {HANDSHAKE}, connect: 5s, idle: 1h }}\nlimits: {{ max_connections: 19000, pending_per_source: 0 }}\n"
        );
        let router = systems::sni_router_top(&env, &format!("{label} sni-router"), &top, &listeners).await?;
        let server_top = format!(
            "timeouts: {{ handshake: {HANDSHAKE} }}\nlimits: {{ max_connections: 19000, pending_per_source: 0 }}\n"
        );
        let tunnel =
            systems::seedgate_tunnel_with(&env, &format!("{label} tunnel"), ping.addr(), &server_top, false).await?;

        let hello = |sni: &str| client_hello(ctx.tls_client.clone(), sni);
        let pp = |dst: &str| -> anyhow::Result<Vec<u8>> { proxy_v2("10.9.9.9:40000".parse()?, dst.parse()?) };
        let targets = Arc::new(Targets {
            sni: router.addr("sni")?,
            pp: router.addr("pp")?,
            gateway: router.addr("gateway")?,
            tunnel: tunnel.addr("frontend")?,
            backends: ups,
            hellos: [hello(SNI[0])?, hello(SNI[1])?, hello(SNI[2])?],
            pp_headers: [pp(PP_DST[0])?, pp(PP_DST[1])?, pp(PP_DST[2])?],
        });
        let (rp, tp) = (router.pids(), tunnel.pids());
        ensure!(rp.len() == 1 && tp.len() == 2, "expected 1 + 2 processes, got {rp:?} and {tp:?}");
        let watched = vec![
            Watched { name: "sni-router", pid: rp[0], admin: router.addr("admin")? },
            Watched { name: "proxy-server", pid: tp[0], admin: tunnel.addr("server-admin")? },
            Watched { name: "proxy-agent", pid: tp[1], admin: tunnel.addr("agent-admin")? },
        ];
        Ok(Self { router, tunnel, targets, watched, _ping: ping, _echo: echo })
    }

    /// An error naming any process that exited.
    pub(super) fn check_alive(&mut self) -> anyhow::Result<()> {
        self.router.check_alive()?;
        self.tunnel.check_alive()
    }
}

/// The mix described in the remarks of both scenarios.
pub(super) fn mix_remark() -> String {
    format!(
        "paths round-robin: SNI passthrough, PROXY-v2 listener and CONNECT (sni-router), CONNECT through the reverse tunnel and \
         absolute-form GET (proxy-server front end → proxy-agent); endings per path: 70% complete (request, answer, orderly close), \
         10% client reset mid-stream (data both ways, then SO_LINGER 0), 10% stalled after 3 bytes of the head (handshake deadline \
         {HANDSHAKE} closes them), 10% refused dials (route or target on a closed port)"
    )
}

pub(super) async fn run(ctx: &Ctx, res: &mut Results) -> anyhow::Result<()> {
    let s = &ctx.scale;
    let mut topo = Topology::start(ctx, SC).await?;
    let started = Instant::now();
    // Warm-up at full concurrency: buffer pools and lazily built state reach their working size.
    let warm = mix(&topo.targets, 0, s.leak_warmup, s.leak_concurrency).await;
    let (before, _) = settle(&topo.watched, s.settle_max).await;
    eprintln!("  leak: warm-up of {} connections; {}", warm.total(), describe(&topo.watched, &before));
    let t = Instant::now();
    let tally = mix(&topo.targets, s.leak_warmup, s.leak_conns, s.leak_concurrency).await;
    let took = t.elapsed();
    eprintln!(
        "  leak: {} connections in {:.1} s ({:.0}/s); {}",
        tally.total(),
        took.as_secs_f64(),
        tally.total() as f64 / took.as_secs_f64(),
        tally.describe()
    );
    let (after, settled) = settle(&topo.watched, s.settle_max).await;
    eprintln!("  leak: after {:.0} s of settling: {}", settled.as_secs_f64(), describe(&topo.watched, &after));
    let alive = topo.check_alive();

    for f in FIGURES {
        let m_before = res.metric(SC, &format!("{} before", f.name), f.unit, Better::Lower);
        let m_after = res.metric(SC, &format!("{} after", f.name), f.unit, Better::Lower);
        let m_delta = res.metric(SC, &format!("{}, after − before", f.name), f.change_unit, Better::Lower);
        for (i, w) in topo.watched.iter().enumerate() {
            let (b, a) = ((f.get)(&before[i]), (f.get)(&after[i]));
            let one = |v: Option<f64>| -> anyhow::Result<f64> {
                if let Err(e) = &alive {
                    anyhow::bail!("{e:#}");
                }
                v.filter(|x| x.is_finite()).context("not readable")
            };
            record_fig(res, m_before, w.name, one(b));
            record_fig(res, m_after, w.name, one(a));
            record_fig(res, m_delta, w.name, one(b.zip(a).map(|(b, a)| (a - b) * f.change_scale)));
        }
    }
    res.remark(
        SC,
        &format!(
            "{} connections ({} in flight at most) after a warm-up of {}; {}",
            tally.total(),
            s.leak_concurrency,
            warm.total(),
            mix_remark()
        ),
    );
    res.remark(
        SC,
        &format!(
            "took {:.1} s ({:.0} connections/s); endings: {}; settled {:.0} s (polled each second until no count fell for 3 s, at most {:.0} s)",
            took.as_secs_f64(),
            tally.total() as f64 / took.as_secs_f64(),
            tally.describe(),
            settled.as_secs_f64(),
            s.settle_max.as_secs_f64()
        ),
    );
    if let Some(first) = &tally.first_unexpected {
        res.remark(
            SC,
            &format!("{} connections went otherwise than expected; the first: {first}", tally.total_unexpected()),
        );
    }
    res.remark(
        SC,
        "fds: entries of /proc/<pid>/fd; RSS: VmRSS; tasks: `seedgate_runtime_alive_tasks` from the admin endpoint (the scrape's own \
         connection task included, before and after alike)",
    );
    eprintln!("  leak: whole scenario {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}

fn record_fig(res: &mut Results, m: MetricId, name: &str, v: anyhow::Result<f64>) {
    record(res, m, name, Kind::Seedgate, v);
}

/// `name fds/tasks/RSS` of every process, for progress lines.
pub(super) fn describe(ws: &[Watched], s: &[Sample]) -> String {
    ws.iter()
        .zip(s)
        .map(|(w, s)| {
            format!(
                "{} {} fds / {} tasks / {:.1} MiB",
                w.name,
                s.fds,
                s.tasks.map_or("?".into(), |t| t.to_string()),
                s.rss_kib / 1024.0
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_robin_with_the_seven_one_one_one_split() {
        let mut t = Tally::default();
        for i in 0..1000 {
            let (p, e) = kind_of(i);
            t.add(p, e, &Ok(()));
        }
        for p in Path::ALL {
            assert_eq!(t.done[p as usize], [140, 20, 20, 20], "{p:?}");
        }
        assert_eq!(t.total(), 1000);
        assert_eq!(t.total_unexpected(), 0);
    }
}
