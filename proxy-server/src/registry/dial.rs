//! The dial path, top to bottom: a front end's dial of `host:port` for a cluster — the cluster's mode, its shares, the proxy strategies, each session's standing, the attempts — to a tunnel stream or a typed refusal.
//!
//! [`SessionDirectory::dial`] is what front ends call (with the configured timeouts and
//! strategies): it checks the cluster's mode, takes its places in the cluster's shares and
//! counts what came of the dial; [`SessionDirectory::dial_agent`]
//! tries up to [`DIAL_ATTEMPTS`] sessions within the dial deadline, each chosen by
//! [`SessionDirectory::next_session`]: the first proxy strategy that names a usable session
//! ([`crate::strategy`]), the sessions' standing ([`crate::liveness`], asked here and nowhere
//! else on this path), then the least busy of two. One attempt on one session is
//! [`crate::attempt`].

use super::{Clusters, SessionDirectory};
use crate::attempt::{self, Attempt};
use crate::liveness::{self, Standing};
use crate::session::{Session, Tally};
use crate::strategy;
use proxy_core::net::share::{Cap, Hold, Kind};
use proxy_core::obs::minutes::PerMinute;
use proxy_core::tunnel::{DialError, TunnelStream};
use seedgate_config::server::{ClusterMode, ProxyStrategy};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most sessions one dial is tried on (each at most once, all within the dial deadline).
const DIAL_ATTEMPTS: usize = 3;

/// The sessions a strategy named for a dial, each with its standing, and the strategy.
type Candidates = (ProxyStrategy, Vec<(Arc<Session>, Standing)>);

/// What a dial came to, as a cluster counts its dials per minute for the status page: `ok`, or
/// the refusal's code ([`DialRefused::code`]).
pub(crate) const DIAL_RESULTS: [&str; 14] = [
    "ok",
    "not_allowed",
    "refused",
    "unreachable",
    "resolve_failed",
    "dial_timeout",
    "stream_limit",
    "draining",
    "no_agent",
    "cluster_moved",
    "bad_target",
    "tunnel_error",
    "cluster_stream_limit",
    "cluster_pending_limit",
];

/// A cluster's dials of the last minutes, by [`DIAL_RESULTS`].
pub(crate) type Dials = PerMinute<{ DIAL_RESULTS.len() }>;

/// The place of `code` in [`DIAL_RESULTS`] (a code it does not know counts as `tunnel_error`).
fn result_index(code: &str) -> usize {
    DIAL_RESULTS.iter().position(|c| *c == code).unwrap_or(11)
}

/// Why a dial was not made or failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DialRefused {
    #[error(transparent)]
    Dial(#[from] DialError),
    /// The cluster holds its share of streams or pending dials: refused before any dial.
    #[error("over capacity: cluster {cluster} holds its share of {} ({cap})", share_name(*.kind))]
    Share { cluster: String, kind: Kind, cap: usize },
}

/// What a cluster's share of `kind` counts, as a refusal names it.
fn share_name(kind: Kind) -> &'static str {
    if kind == Kind::Established { "streams" } else { "pending dials" }
}

impl DialRefused {
    pub(crate) fn code(&self) -> &'static str {
        match self {
            DialRefused::Dial(e) => e.code(),
            DialRefused::Share { kind: Kind::Established, .. } => "cluster_stream_limit",
            DialRefused::Share { .. } => "cluster_pending_limit",
        }
    }

    pub(crate) fn http_status(&self) -> u16 {
        match self {
            DialRefused::Dial(e) => e.http_status(),
            DialRefused::Share { .. } => 503,
        }
    }
}

/// The deadlines of one dial.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DialTimes {
    /// The whole dial, every attempt included (`timeouts.dial`).
    pub dial: Duration,
    /// How long one session may stay silent before the dial moves on (`agents.open_timeout`).
    pub open: Duration,
}

/// A dialled tunnel stream, its place in its cluster's share of streams, and how its agent was
/// chosen.
pub(crate) struct Dialed {
    pub stream: TunnelStream,
    pub share: Hold,
    /// The proxy strategy that chose the agent.
    pub strategy: ProxyStrategy,
    /// The node the agent announced (empty when it named none).
    pub node: String,
    /// The session's figures (its streams' bytes are added there when they end).
    pub tally: Arc<Tally>,
}

impl SessionDirectory {
    /// Open a stream to `target` through an agent of `cluster`, within the cluster's shares: a
    /// place among its streams (held by the returned stream) and, while the dial is in flight,
    /// among its pending work, so an agent that does not answer holds at most that share. The
    /// agent is chosen by the cluster's proxy strategies, else `strategies` (the global list).
    /// Counted in the dial metrics (a refusal for the cluster's share is no dial: its caller
    /// counts it as a reject).
    pub(crate) async fn dial(
        &self,
        cluster: &str,
        target: &str,
        times: DialTimes,
        strategies: &[ProxyStrategy],
    ) -> Result<Dialed, DialRefused> {
        let started = Instant::now();
        let (mode, dials) = self.mode_and_dials(cluster);
        let r = async {
            if mode.mode == ClusterMode::Fenced {
                let msg = format!("cluster {cluster} moved to another seed; this seed no longer serves it");
                return Err(DialError::Moved(msg).into());
            }
            let strategies = mode.strategies.as_deref().unwrap_or(strategies);
            let (share, dialing) = self.take_shares(cluster)?;
            let chosen = self.dial_agent(cluster, target, times, strategies).await;
            drop(dialing);
            let (stream, strategy, node, tally) = chosen?;
            Ok(Dialed { stream, share, strategy, node, tally })
        }
        .await;
        dials.add(result_index(r.as_ref().map_or_else(DialRefused::code, |_| "ok")), 1);
        let m = &self.metrics;
        match &r {
            Ok(_) => {
                m.dial_seconds.with_label_values(&[cluster]).observe(started.elapsed().as_secs_f64());
                m.streams_opened.with_label_values(&[cluster]).inc();
            }
            Err(DialRefused::Dial(e)) => m.dial_failures.with_label_values(&[cluster, e.code()]).inc(),
            Err(DialRefused::Share { .. }) => {}
        }
        r
    }

    /// `cluster`'s mode and its count of dials (its entry made if it had none: a front end's
    /// cluster without any agent counts its refused dials too).
    fn mode_and_dials(&self, cluster: &str) -> (super::Mode, Arc<Dials>) {
        if let Some(e) = self.clusters.read().by_name.get(cluster) {
            return (e.mode(), e.dials.clone());
        }
        let mut c = self.clusters.write();
        let e = c.entry(cluster, &self.kill);
        (e.mode(), e.dials.clone())
    }

    /// Take a place in `cluster`'s share of streams and of pending dials (in that order), or say
    /// why not. The caps and the other clusters are looked at once, under one lock, for both.
    fn take_shares(&self, cluster: &str) -> Result<(Hold, Hold), DialRefused> {
        let (caps, alone) = {
            let c = self.clusters.read();
            let caps = [c.cap(cluster, Kind::Established), c.cap(cluster, Kind::Pending)];
            // Nobody else could use what a default share would keep free: only the process
            // limit applies.
            (caps, caps.iter().any(|c| matches!(c, Cap::Share { .. })) && !others_served(&c, cluster))
        };
        let tenant = self.shares.tenant(&[cluster]);
        let take = |kind: Kind, cap: Cap| {
            let cap = if alone && matches!(cap, Cap::Share { .. }) { Cap::Fixed(usize::MAX) } else { cap };
            let in_use = self.shares.total(kind);
            tenant.try_take_at(kind, cap, in_use).ok_or_else(|| DialRefused::Share {
                cluster: cluster.to_owned(),
                kind,
                cap: cap.at(in_use),
            })
        };
        let streams = take(Kind::Established, caps[0])?;
        Ok((streams, take(Kind::Pending, caps[1])?))
    }

    /// Among the sessions [`next_session`](Self::next_session) offers, one attempt after
    /// another. The dial moves to another session (up to [`DIAL_ATTEMPTS`] in all, within
    /// `times.dial`) when the transport failed before the agent answered, when the agent turns
    /// out to be shutting down, when the session stays silent past `times.open`, or when it turns
    /// suspect while the open waits. Returns the stream, the strategy and the agent's node.
    async fn dial_agent(
        &self,
        cluster: &str,
        target: &str,
        times: DialTimes,
        strategies: &[ProxyStrategy],
    ) -> Result<(TunnelStream, ProxyStrategy, String, Arc<Tally>), DialError> {
        let deadline = tokio::time::Instant::now() + times.dial;
        let mut tried: Vec<u64> = Vec::new();
        let sessions = self.sessions(cluster);
        let open = sessions.iter().filter(|s| !s.opener.is_closed());
        let (open, mut suspect) = open.fold((0, 0), |(n, q), s| (n + 1, q + usize::from(attempt::suspect(s))));
        let mut last = if sessions.is_empty() {
            DialError::NoAgent(format!("no agent of cluster {cluster} is connected"))
        } else if open > 0 && open == suspect {
            attempt::all_suspect(cluster)
        } else {
            DialError::NoAgent(format!(
                "no agent of cluster {cluster} for {target} by proxy strategies {}",
                names(strategies)
            ))
        };
        let mut retry: Option<(&'static str, u64)> = None;
        let mut patience = attempt::Patience::new(times.open);
        while tried.len() < DIAL_ATTEMPTS {
            let Some((strategy, s)) = self.next_session(cluster, target, strategies, &tried) else { break };
            if let Some((reason, from)) = retry.take() {
                self.metrics.dial_retries.with_label_values(&[cluster, reason]).inc();
                tracing::info!(cluster, target, reason, from, to = s.id, "dial moved to another agent session");
            }
            tried.push(s.id);
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let others = || self.candidates(cluster, target, strategies, &tried).is_some();
            match attempt::attempt(&s, target, left, patience, others, &self.metrics).await {
                Attempt::Answered(Ok(stream)) => {
                    self.metrics.dial_strategy.with_label_values(&[cluster, strategy.as_str()]).inc();
                    if suspect > 0 {
                        self.metrics.dials_around_suspect.with_label_values(&[cluster]).inc();
                    }
                    return Ok((stream, strategy, attempt::node(&s), s.tally.clone()));
                }
                // Nothing reached the target: another agent may take it.
                Attempt::Answered(Err(e @ (DialError::Transport(_) | DialError::Draining(_)))) => {
                    let reason = if matches!(e, DialError::Transport(_)) { "transport" } else { "draining" };
                    retry = Some((reason, s.id));
                    s.tally.failed(format!("{}: {e}", e.code()));
                    last = e;
                }
                Attempt::Answered(Err(e)) => {
                    s.tally.failed(format!("{}: {e}", e.code()));
                    return Err(e);
                }
                Attempt::Silent => {
                    patience = patience.moved_on();
                    retry = Some(("silent", s.id));
                    last = DialError::Timeout(format!("{target}: no answer from the agent within {:?}", times.open));
                    s.tally.failed(format!("silent: {last}"));
                }
                // Sent into a path that then went quiet: served late by another session rather
                // than refused (the agent may still get the abandoned open once the path heals).
                Attempt::TurnedSuspect => {
                    patience = patience.moved_on();
                    retry = Some(("suspect", s.id));
                    suspect += 1;
                    last = attempt::all_suspect(cluster);
                }
            }
        }
        Err(last)
    }

    /// The session the next attempt goes to, and the strategy that named it: among the
    /// [`candidates`](Self::candidates), those of the best standing, then the least busy of two
    /// random ones.
    fn next_session(
        &self,
        cluster: &str,
        target: &str,
        strategies: &[ProxyStrategy],
        tried: &[u64],
    ) -> Option<(ProxyStrategy, Arc<Session>)> {
        let (strategy, candidates) = self.candidates(cluster, target, strategies, tried)?;
        let standings: Vec<Standing> = candidates.iter().map(|(_, st)| *st).collect();
        let best: Vec<Arc<Session>> =
            liveness::preferred(&standings).into_iter().map(|i| candidates[i].0.clone()).collect();
        Some((strategy, p2c(&best)?))
    }

    /// The sessions of `cluster` the first fitting strategy names (open, not suspect, not tried
    /// yet), each with its standing. A doubted session is tried last: a later strategy's healthy session
    /// comes before it. Each session's standing is asked once per look (asking clears a doubt
    /// the session has outlived, and counts it).
    fn candidates(
        &self,
        cluster: &str,
        target: &str,
        strategies: &[ProxyStrategy],
        tried: &[u64],
    ) -> Option<Candidates> {
        self.file_hellos(cluster);
        // A suspect session (its keepalive unanswered) takes no new dial: its path is quiet.
        let usable = |s: &Session| !s.opener.is_closed() && !tried.contains(&s.id) && !attempt::suspect(s);
        let clusters = self.clusters.read();
        let e = clusters.by_name.get(cluster)?;
        let asked = std::cell::RefCell::new(HashMap::new());
        let standing =
            |s: &Session| *asked.borrow_mut().entry(s.id).or_insert_with(|| attempt::standing(s, &self.metrics));
        let healthy = |s: &Session| usable(s) && standing(s) == Standing::Healthy;
        let (strategy, named) = strategy::candidates(&e.index, &e.sessions, strategies, target, healthy)
            .or_else(|| strategy::candidates(&e.index, &e.sessions, strategies, target, usable))?;
        Some((strategy, named.into_iter().map(|s| (s.clone(), standing(&s))).collect()))
    }
}

/// Whether a cluster other than `cluster` has an agent session. Only such a cluster can want the
/// streams and dials a default share keeps free (without a session it can carry none), so a
/// cluster alone on its proxy-server — the usual deployment, one per control plane — may use
/// the whole process.
fn others_served(c: &Clusters, cluster: &str) -> bool {
    c.by_name.iter().any(|(name, e)| name != cluster && !e.sessions.is_empty())
}

fn names(s: &[ProxyStrategy]) -> String {
    s.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
}

/// Power of two choices on active streams.
fn p2c(c: &[Arc<Session>]) -> Option<Arc<Session>> {
    proxy_core::net::balance::p2c(c.len(), |i| c[i].opener.active_streams()).map(|i| c[i].clone())
}
