//! Steady loads through a move: in-cluster requests through the node-local apiserver proxies, and
//! seed-side CONNECTs through proxy-server's egress front ends to the shoot.

use super::{API_NAME, WAIT, connect_echo, echo_once};
use crate::pki::client_config;
use crate::tls_client::http_get_request;
use crate::{Ca, tls_request};
use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Longest a load runs, whatever its caller does (every loop is bounded).
const MAX_RUN: Duration = Duration::from_secs(180);
/// Requests in flight at most (an offered rate the path cannot take waits here).
const IN_FLIGHT: usize = 64;

/// What a load saw: successes by who answered, failures with their first errors.
#[derive(Default, Debug)]
pub struct LoadTally {
    pub ok: AtomicU64,
    pub failed: AtomicU64,
    pub answered_by: Mutex<BTreeMap<String, u64>>,
    /// The first errors (at most 20), for the failure message.
    pub errors: Mutex<Vec<String>>,
}

impl LoadTally {
    pub fn ok(&self) -> u64 {
        self.ok.load(Ordering::Relaxed)
    }
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }
    pub fn by(&self) -> BTreeMap<String, u64> {
        self.answered_by.lock().expect("lock").clone()
    }
    pub fn first_errors(&self) -> Vec<String> {
        self.errors.lock().expect("lock").clone()
    }

    fn count(&self, r: Result<String, String>) {
        match r {
            Ok(who) => {
                self.ok.fetch_add(1, Ordering::Relaxed);
                *self.answered_by.lock().expect("lock").entry(who).or_default() += 1;
            }
            Err(e) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                let mut errs = self.errors.lock().expect("lock");
                if errs.len() < 20 {
                    errs.push(e.chars().take(300).collect());
                }
            }
        }
    }
}

/// A running load: its tally, and the task that ends when `stop` is set.
pub struct Running {
    pub tally: Arc<LoadTally>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Stop offering, wait for the requests in flight, return the tally.
    pub async fn finish(self) -> anyhow::Result<Arc<LoadTally>> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await?;
        Ok(self.tally)
    }
}

/// Offer `one(k)` every `every` (k = 0, 1, ...), at most [`IN_FLIGHT`] at once, until stopped.
fn drive<F, Fut>(every: Duration, one: F) -> Running
where
    F: Fn(u64) -> Fut + Send + 'static,
    Fut: Future<Output = Result<String, String>> + Send + 'static,
{
    let (tally, stop) = (Arc::new(LoadTally::default()), Arc::new(AtomicBool::new(false)));
    let (t, s) = (tally.clone(), stop.clone());
    let task = tokio::spawn(async move {
        let deadline = Instant::now() + MAX_RUN;
        let permits = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
        let mut tick = tokio::time::interval(every);
        let mut inflight = tokio::task::JoinSet::new();
        let mut k = 0;
        while !s.load(Ordering::Relaxed) && Instant::now() < deadline {
            tick.tick().await;
            let Ok(permit) = permits.clone().acquire_owned().await else { break };
            let (t, fut) = (t.clone(), one(k));
            inflight.spawn(async move {
                t.count(fut.await);
                drop(permit);
            });
            k += 1;
            while inflight.try_join_next().is_some() {}
        }
        while inflight.join_next().await.is_some() {}
    });
    Running { tally, stop, task }
}

/// In-cluster clients: TLS requests to the kube-apiserver through the node-local proxies
/// (round robin over `proxies`), each answered by `backend=<name>` of the control plane.
pub struct PodLoad;

impl PodLoad {
    pub fn start(ca: &Ca, proxies: Vec<SocketAddr>, every: Duration) -> anyhow::Result<Running> {
        anyhow::ensure!(!proxies.is_empty(), "no apiserver proxy to send to");
        let cfg = client_config(ca, None, &["http/1.1"])?;
        Ok(drive(every, move |k| {
            let (addr, cfg) = (proxies[k as usize % proxies.len()], cfg.clone());
            async move {
                let r = tokio::time::timeout(
                    Duration::from_secs(10),
                    tls_request(addr, Some(API_NAME), cfg, &http_get_request(API_NAME, "/api")),
                )
                .await;
                match r {
                    Ok(Ok(res)) if res.status() == Some(200) => Ok(res
                        .body()
                        .split_whitespace()
                        .find_map(|w| w.strip_prefix("backend="))
                        .unwrap_or("?")
                        .to_owned()),
                    other => Err(format!("via {addr}: {other:?}")),
                }
            }
        }))
    }
}

/// Seed-side clients (kube-apiserver's egress): CONNECTs to the shoot's echo backend, round
/// robin over the egress front ends currently in `targets` (labelled; the caller switches them
/// from A's replicas to B's), each echoing a few bytes.
pub struct ConnectLoad;

/// Where the seed-side load dials (`(label, egress address)` pairs), and how many of its dials
/// are under way to each label: a caller that switches the targets waits until none is under way
/// to the old ones before it fences them.
#[derive(Clone)]
pub struct Targets(Arc<Mutex<TargetsInner>>);

struct TargetsInner {
    list: Vec<(String, SocketAddr)>,
    under_way: BTreeMap<String, usize>,
}

impl Targets {
    pub fn new(list: Vec<(String, SocketAddr)>) -> Self {
        Self(Arc::new(Mutex::new(TargetsInner { list, under_way: BTreeMap::new() })))
    }

    /// Dial these from now on.
    pub fn set(&self, list: Vec<(String, SocketAddr)>) {
        self.0.lock().expect("lock").list = list;
    }

    /// Dials under way to a target no longer in the list.
    pub fn stale(&self) -> usize {
        let t = self.0.lock().expect("lock");
        t.under_way.iter().filter(|(l, _)| !t.list.iter().any(|(x, _)| x == *l)).map(|(_, n)| n).sum()
    }

    /// The `k`th dial's target, counted as under way until [`Self::done`].
    fn pick(&self, k: u64) -> Option<(String, SocketAddr)> {
        let mut t = self.0.lock().expect("lock");
        let pick = (!t.list.is_empty()).then(|| t.list[k as usize % t.list.len()].clone())?;
        *t.under_way.entry(pick.0.clone()).or_default() += 1;
        Some(pick)
    }

    fn done(&self, label: &str) {
        if let Some(n) = self.0.lock().expect("lock").under_way.get_mut(label) {
            *n = n.saturating_sub(1);
        }
    }
}

impl ConnectLoad {
    pub fn start(targets: Targets, every: Duration) -> Running {
        drive(every, move |k| {
            let pick = targets.pick(k);
            let targets = targets.clone();
            async move {
                let (label, egress) = pick.ok_or("no egress target")?;
                let r = tokio::time::timeout(WAIT, async {
                    let mut s = connect_echo(egress).await?.map_err(anyhow::Error::msg)?;
                    echo_once(&mut s, format!("dial {k}").as_bytes()).await
                })
                .await;
                targets.done(&label);
                match r {
                    Ok(Ok(())) => Ok(label),
                    Ok(Err(e)) => Err(format!("via {label} ({egress}): {e:#}")),
                    Err(_) => Err(format!("via {label} ({egress}): no echo within {WAIT:?}")),
                }
            }
        })
    }
}
