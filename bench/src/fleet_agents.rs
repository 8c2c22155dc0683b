//! `bench fleet-agents` (internal): many proxy-agent instances served in one process through the
//! library (`proxy_agent::bind` → `run`), each with its own node name, cluster certificate and
//! metrics registry, driven by the fleet scenario over stdin/stdout.
//!
//! Thousands of agent processes would cost the machine more than the seed side being measured
//! (a runtime, an allocator arena and a page-table each); instances in one process share them,
//! so what one instance costs is its sessions, its state and its tasks.
//!
//! The protocol, one line per command on stdin and one answer line on stdout:
//! - (unasked, once every instance is bound) `bound <n> <rss KiB before> <rss KiB after>`
//! - `status` → `status <instances holding a session to every replica> <sessions up>`
//! - `mark <replica id>` → `marked`: from now, each instance's time until it has lost its session
//!   to that replica and holds all replicas again (a session to that id among them) is taken
//! - `times` → `times <instances done> <instances> <ms> <ms> ...` (the times taken so far)
//! - `totals` → `totals <duplicate sessions closed> <reconnects ok> <reconnects failed>`

use anyhow::Context as _;
use proxy_core::app::{Options, Service as _};
use proxy_core::prometheus::Registry;
use std::io::{BufRead as _, Write as _};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often a mark's sweep looks at every instance not done yet.
const SWEEP: Duration = Duration::from_millis(10);
/// A mark's sweep gives up after this (the harness reports who did not make it).
/// Sweeps between two reads of an instance's count of kept sessions (about a second): a loss
/// that healed between two sweeps is then seen up to that much late.
const KEPT_EVERY: usize = 100;
const SWEEP_MAX: Duration = Duration::from_secs(300);

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Instances to serve.
    #[arg(long)]
    count: usize,
    /// Clusters the instances are spread over (instance i is of cluster i mod clusters).
    #[arg(long)]
    clusters: usize,
    /// Replicas each instance should hold a session to.
    #[arg(long)]
    replicas: usize,
    /// The agent config, with `{node}` and `{cluster}` (the cluster's index) to fill in.
    #[arg(long)]
    template: PathBuf,
}

/// One instance: what the harness asks about it.
struct Instance {
    agent: Arc<proxy_agent::Agent>,
    registry: Registry,
}

impl Instance {
    /// Sessions up, and whether they reach every replica (`must_hold`: among them this one).
    fn holds(&self, replicas: usize, must_hold: Option<&str>) -> (usize, bool) {
        let mut up = 0;
        let mut all = true;
        for c in self.agent.ready().into_iter().filter(|c| c.name.starts_with("tunnel-")) {
            // "connected: 3 of 3 replicas [r0: ..., r1: ...]" (see the agent's readiness).
            let counts = c.detail.split_once(": ").map(|(_, r)| r).unwrap_or("");
            let mut words = counts.split(' ');
            let n: usize = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
            let want: usize = words.nth(1).and_then(|w| w.parse().ok()).unwrap_or(0);
            up += n;
            let has = must_hold
                .is_none_or(|id| c.detail.contains(&format!("[{id}: ")) || c.detail.contains(&format!(", {id}: ")));
            all &= c.detail.starts_with("connected:") && n == replicas && want == replicas && has;
        }
        (up, all)
    }

    /// Its session counters: duplicates closed, reconnects that succeeded and that failed (read
    /// from the registry's values, without rendering its text).
    fn sessions(&self) -> [f64; 3] {
        let mut n = [0.0; 3];
        for family in self.registry.gather() {
            for m in family.get_metric() {
                let result = m.get_label().iter().find(|l| l.name() == "result").map(|l| l.value());
                let slot = match (family.name(), result) {
                    ("seedgate_agent_duplicate_sessions_total", _) => 0,
                    ("seedgate_tunnel_reconnects_total", Some("ok")) => 1,
                    ("seedgate_tunnel_reconnects_total", Some("failed")) => 2,
                    _ => continue,
                };
                n[slot] += m.get_counter().get_value();
            }
        }
        n
    }

    /// Sessions that came up and were kept: reconnects that succeeded, less duplicates closed.
    /// It grows only when a session was re-made, so it shows a loss that happened and healed
    /// between two sweeps.
    fn kept(&self) -> f64 {
        let [dup, ok, _] = self.sessions();
        ok - dup
    }

    /// Its tunnel's readiness detail.
    fn detail(&self) -> String {
        self.agent
            .ready()
            .into_iter()
            .filter(|c| c.name.starts_with("tunnel-"))
            .map(|c| c.detail)
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// Per-instance times of the newest mark.
#[derive(Default)]
struct Marked {
    /// `None` until the instance lost its session to the marked replica and got all back.
    done: Vec<Option<Duration>>,
    /// The instance was seen without all its replicas since the mark, or made a session anew.
    lost: Vec<bool>,
    /// [`Instance::kept`] at the mark.
    kept: Vec<f64>,
}

pub(crate) fn main(a: Args) -> anyhow::Result<()> {
    proxy_core::obs::telemetry::init(proxy_core::obs::telemetry::LogFormat::Text);
    // Two workers: the host shares its CPU with the harness; the instances' work is TLS.
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(serve(a))
}

async fn serve(a: Args) -> anyhow::Result<()> {
    let template = std::fs::read_to_string(&a.template).with_context(|| format!("reading {}", a.template.display()))?;
    let rss_before = crate::host::rss_kib(std::process::id()).unwrap_or(0);
    let mut fleet = Vec::with_capacity(a.count);
    for i in 0..a.count {
        let yaml =
            template.replace("{node}", &format!("node-{i:05}")).replace("{cluster}", &(i % a.clusters).to_string());
        let cfg = seedgate_config::agent::parse(&yaml, "fleet-agent.yaml").context("the agent template")?;
        let registry = Registry::new();
        let opts = Options { registry: Some(registry.clone()), ..Options::default() };
        let bound = proxy_agent::bind(cfg, opts).await.with_context(|| format!("binding agent {i}"))?;
        fleet.push(Instance { agent: bound.service().clone(), registry });
        tokio::spawn(bound.run(std::future::pending()));
    }
    let fleet = Arc::new(fleet);
    let rss_after = crate::host::rss_kib(std::process::id()).unwrap_or(0);
    let mut out = std::io::stdout().lock();
    writeln!(out, "bound {} {rss_before} {rss_after}", a.count)?;
    out.flush()?;
    let marked = Arc::new(Mutex::new(Marked::default()));
    let mut sweep: Option<tokio::task::JoinHandle<()>> = None;
    let mut lines = stdin_lines();
    // Until the harness closes stdin (or kills the process).
    while let Some(line) = lines.recv().await {
        let answer = match line.split_whitespace().collect::<Vec<_>>().as_slice() {
            ["status"] => {
                let (mut holding, mut up) = (0, 0);
                for inst in fleet.iter() {
                    let (n, all) = inst.holds(a.replicas, None);
                    up += n;
                    holding += usize::from(all);
                }
                format!("status {holding} {up}")
            }
            ["mark", id] => {
                if let Some(s) = sweep.take() {
                    s.abort();
                }
                let kept = fleet.iter().map(Instance::kept).collect();
                *crate::host::lock(&marked) =
                    Marked { done: vec![None; fleet.len()], lost: vec![false; fleet.len()], kept };
                sweep = Some(tokio::spawn(track(fleet.clone(), marked.clone(), a.replicas, (*id).to_owned())));
                "marked".to_owned()
            }
            ["times"] => {
                let m = crate::host::lock(&marked);
                let done: Vec<String> =
                    m.done.iter().flatten().map(|d| format!("{:.1}", d.as_secs_f64() * 1e3)).collect();
                format!("times {} {} {}", done.len(), m.done.len(), done.join(" "))
            }
            ["totals"] => totals(&fleet),
            // The first few instances not back since the mark, and what their readiness says.
            ["missing"] => {
                let m = crate::host::lock(&marked);
                let missing: Vec<String> = (0..m.done.len())
                    .filter(|&i| m.done[i].is_none())
                    .take(5)
                    .map(|i| format!("node-{i:05} (seen without all replicas: {}): {}", m.lost[i], fleet[i].detail()))
                    .collect();
                format!("missing {}", missing.join(" | "))
            }
            other => format!("error unknown command {other:?}"),
        };
        // A short line to a pipe the harness reads at once: written in place.
        writeln!(out, "{answer}")?;
        out.flush()?;
    }
    Ok(())
}

/// Lines of stdin, read on a thread of their own (the workspace's tokio has no `io-std`).
fn stdin_lines() -> tokio::sync::mpsc::Receiver<String> {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { return };
            if tx.blocking_send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// Sweep every instance not done until all are (or [`SWEEP_MAX`]): first its session to `id`
/// must be gone (at once over h2; over QUIC at the restarted replica's reset or the keepalive
/// timeout), then every replica held again, `id` among them. A loss that healed between two
/// sweeps shows as a session made anew since the mark.
async fn track(fleet: Arc<Vec<Instance>>, marked: Arc<Mutex<Marked>>, replicas: usize, id: String) {
    let t0 = Instant::now();
    let mut left: Vec<usize> = (0..fleet.len()).collect();
    let mut sweeps = 0;
    // Bounded by SWEEP_MAX.
    while !left.is_empty() && t0.elapsed() < SWEEP_MAX {
        tokio::time::sleep(SWEEP).await;
        sweeps += 1;
        let now = t0.elapsed();
        let mut m = crate::host::lock(&marked);
        left.retain(|&i| {
            let (_, all) = fleet[i].holds(replicas, Some(&id));
            // A session lost and made again between two sweeps shows in the count of kept ones.
            // Reading it gathers the instance's registry: each instance's is read once every
            // KEPT_EVERY sweeps (staggered), so the sweep does not burn the agents' own CPU.
            let check = !m.lost[i] && (i + sweeps) % KEPT_EVERY == 0;
            if !all || (check && fleet[i].kept() > m.kept[i]) {
                m.lost[i] = true;
            }
            if !all {
                return true;
            }
            if !m.lost[i] {
                return true;
            }
            m.done[i] = Some(now);
            false
        });
    }
}

/// Sums over every instance's registry.
fn totals(fleet: &[Instance]) -> String {
    let [dup, ok, failed] =
        fleet.iter().map(Instance::sessions).fold([0.0; 3], |a, b| [a[0] + b[0], a[1] + b[1], a[2] + b[2]]);
    format!("totals {dup} {ok} {failed}")
}
