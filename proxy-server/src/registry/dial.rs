//! The dial path, top to bottom: a front end's dial of `host:port` for a cluster — the cluster's mode, its shares, the proxy strategies, each session's standing, the attempts — to a tunnel stream or a typed refusal.
//!
//! [`SessionDirectory::dial`] is what front ends call (with the configured timeouts and
//! strategies): it checks the cluster's mode, takes its places in the cluster's shares and
//! counts what came of the dial; [`SessionDirectory::dial_agent`]
//! tries up to [`DIAL_ATTEMPTS`] sessions within the dial deadline, each chosen by
//! [`SessionDirectory::next_session`]: the first proxy strategy that names a usable session
//! ([`super::strategy`]), the sessions' standing ([`Session::standing`], asked here and nowhere
//! else on this path), then the least busy of two. One attempt on one session is [`attempt`]:
//! answered, or given up on a session that stays silent (marked so:
//! [`Session::doubt_silent`]) or turns suspect.

use super::refusal::DialRefusal;
use super::session::{self, Session, Standing};
use super::strategy;
use super::tally::Tally;
use super::{Clusters, SessionDirectory};
use crate::metrics::ServerMetrics;
use proxy_core::net::share::{Cap, Hold, Kind};
use proxy_core::tunnel::{DialError, Echoes, Quiet, TunnelStream};
use seedgate_config::server::ProxyStrategy;
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Most sessions one dial is tried on (each at most once, all within the dial deadline).
const DIAL_ATTEMPTS: usize = 3;

/// The sessions a strategy named for a dial, each with its standing, and the strategy.
type Candidates = (ProxyStrategy, Vec<(Arc<Session>, Standing)>);

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
    ) -> Result<Dialed, DialRefusal> {
        let started = Instant::now();
        let r = async {
            let mode = self.mode(cluster);
            if mode.fenced() {
                let msg = format!("cluster {cluster} moved to another seed; this seed no longer serves it");
                return Err(DialError::Moved(msg).into());
            }
            let strategies = mode.strategies.as_deref().unwrap_or(strategies);
            let (share, dialing) = self.take_shares(cluster)?;
            let chosen = self.dial_agent(cluster, target, times, strategies).await;
            drop(dialing);
            let (stream, strategy, s) = chosen?;
            Ok(Dialed { stream, share, strategy, node: s.node(), tally: s.tally.clone() })
        }
        .await;
        self.count_dial(cluster, r.as_ref().map_or_else(DialRefusal::code, |_| "ok"));
        let m = &self.metrics;
        match &r {
            Ok(_) => {
                m.dial_seconds.with_label_values(&[cluster]).observe(started.elapsed().as_secs_f64());
                m.streams_opened.with_label_values(&[cluster]).inc();
            }
            Err(DialRefusal::Dial(e)) => m.dial_failures.with_label_values(&[cluster, e.code()]).inc(),
            Err(DialRefusal::Share { .. }) => {}
        }
        r
    }

    /// Take a place in `cluster`'s share of streams and of pending dials (in that order), or say
    /// why not. The caps and the other clusters are looked at once, under one lock, for both.
    fn take_shares(&self, cluster: &str) -> Result<(Hold, Hold), DialRefusal> {
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
            tenant.try_take_at(kind, cap, in_use).ok_or_else(|| DialRefusal::Share {
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
    /// suspect while the open waits. Returns the stream, the strategy and the session.
    async fn dial_agent(
        &self,
        cluster: &str,
        target: &str,
        times: DialTimes,
        strategies: &[ProxyStrategy],
    ) -> Result<(TunnelStream, ProxyStrategy, Arc<Session>), DialError> {
        let deadline = tokio::time::Instant::now() + times.dial;
        let mut tried: Vec<u64> = Vec::new();
        let sessions = self.sessions(cluster);
        let open = sessions.iter().filter(|s| !s.opener.is_closed());
        let (open, mut suspect) = open.fold((0, 0), |(n, q), s| (n + 1, q + usize::from(s.suspect())));
        let mut last = if sessions.is_empty() {
            DialError::NoAgent(format!("no agent of cluster {cluster} is connected"))
        } else if open > 0 && open == suspect {
            all_suspect(cluster)
        } else {
            DialError::NoAgent(format!(
                "no agent of cluster {cluster} for {target} by proxy strategies {}",
                names(strategies)
            ))
        };
        let mut retry: Option<(&'static str, u64)> = None;
        let mut patience = Patience::new(times.open);
        while tried.len() < DIAL_ATTEMPTS {
            let Some((strategy, s)) = self.next_session(cluster, target, strategies, &tried) else { break };
            if let Some((reason, from)) = retry.take() {
                self.metrics.dial_retries.with_label_values(&[cluster, reason]).inc();
                tracing::info!(cluster, target, reason, from, to = s.id, "dial moved to another agent session");
            }
            tried.push(s.id);
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let others = || self.candidates(cluster, target, strategies, &tried).is_some();
            match attempt(&s, target, left, patience, others, &self.metrics).await {
                Attempt::Answered(Ok(stream)) => {
                    self.metrics.dial_strategy.with_label_values(&[cluster, strategy.as_str()]).inc();
                    if suspect > 0 {
                        self.metrics.dials_around_suspect.with_label_values(&[cluster]).inc();
                    }
                    return Ok((stream, strategy, s));
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
                    last = all_suspect(cluster);
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
            session::preferred(&standings).into_iter().map(|i| candidates[i].0.clone()).collect();
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
        let usable = |s: &Session| !s.opener.is_closed() && !tried.contains(&s.id) && !s.suspect();
        let clusters = self.clusters.read();
        let e = clusters.by_name.get(cluster)?;
        let asked = std::cell::RefCell::new(HashMap::new());
        let standing = |s: &Session| *asked.borrow_mut().entry(s.id).or_insert_with(|| s.standing(&self.metrics));
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

/// Why a dial was refused when its open stalled on the only session that could take it.
pub(crate) fn stalled(cluster: &str, waited: Duration) -> DialError {
    DialError::NoAgent(format!(
        "the agent session of cluster {cluster} acknowledged nothing sent after the stream open for {waited:?} \
         (agents.open_timeout; a quarter of it once a dial moved on from another session): its path is stalled, \
         and the session is treated as suspect for this dial; its open streams wait for the path"
    ))
}

/// Why a dial found only suspect sessions.
pub(crate) fn all_suspect(cluster: &str) -> DialError {
    DialError::NoAgent(format!(
        "every agent session of cluster {cluster} is suspect: no keepalive answer within \
         agents.keepalive.suspect_after (the path to the agent is quiet); its open streams wait for the path"
    ))
}

/// Resolves once the session's path goes quiet (never, where the transport cannot tell).
async fn went_quiet(quiet: &mut Option<watch::Receiver<bool>>) {
    if let Some(rx) = quiet
        && rx.wait_for(|q| *q).await.is_ok()
    {
        return;
    }
    std::future::pending().await
}

/// How one attempt of a dial on one session went.
pub(crate) enum Attempt {
    /// The agent answered (or the open failed by itself).
    Answered(Result<TunnelStream, DialError>),
    /// No answer and no sign that the agent got the open within the open timeout, and another
    /// session may take the dial: the open is abandoned (its stream reset) and the session is suspect.
    Silent,
    /// The session turned suspect (its keepalive unanswered) while the open waited, and another
    /// session may take the dial: the open is abandoned (its stream reset).
    TurnedSuspect,
}

/// How long one attempt waits for signs that the agent got its open.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Patience {
    /// `agents.open_timeout`.
    pub open: Duration,
    /// For the first sign after the open where it is an answered PING ([`in_order`]): `open`
    /// on a dial's first session; a quarter of it once the dial moved on from a session that
    /// stalled or turned suspect, as a live session answers within a round trip, and a dial on a
    /// flapping path is then answered or refused within about one and a quarter open timeouts.
    pub prove: Duration,
}

impl Patience {
    pub(crate) fn new(open: Duration) -> Self {
        Self { open, prove: open }
    }

    /// After an attempt that was given up on a quiet path.
    pub(crate) fn moved_on(self) -> Self {
        Self { prove: self.open / 4, ..self }
    }
}

/// Open a stream to `target` on `s` within `left`. An agent that shows life gets all of `left`
/// (its own dial may be slow); one that stays silent for `open_timeout` is suspected, and given
/// up when `others()` says another session could take the dial; while none could, the wait
/// goes on, looking again every `open_timeout`, until the session turns suspect (its keepalive
/// unanswered): then the dial moves on, or is refused when no other session could take it. A
/// session turning suspect ends the wait of an agent that showed life too. Where the session's
/// PINGs are in order with its streams, what counts as life is stricter: [`in_order`].
pub(crate) async fn attempt(
    s: &Session,
    target: &str,
    left: Duration,
    patience: Patience,
    others: impl Fn() -> bool,
    metrics: &ServerMetrics,
) -> Attempt {
    let heard = s.opener.heard();
    let mut quiet = s.opener.quiet().map(Quiet::watch);
    let open = s.opener.open(target, left);
    tokio::pin!(open);
    if let Some(echoes) = s.opener.echoes() {
        return in_order(s, open, echoes, patience, quiet, others, metrics).await;
    }
    let open_timeout = patience.open;
    let half = open_timeout / 2;
    tokio::select! {
        r = tokio::time::timeout(half, &mut open) => if let Ok(r) = r {
            return Attempt::Answered(r);
        },
        () = went_quiet(&mut quiet) => return given_up(s, others),
    }
    if heard.is_some() && s.opener.heard() == heard {
        // No word since the open: ask for one, so that a live agent answers in time.
        s.opener.probe();
    }
    let mut wait = open_timeout - half;
    loop {
        tokio::select! {
            r = tokio::time::timeout(wait, &mut open) => if let Ok(r) = r {
                return Attempt::Answered(r);
            },
            () = went_quiet(&mut quiet) => return given_up(s, others),
        }
        if heard.is_none() || s.opener.heard() != heard {
            // Alive: the agent's own dial takes its time. Unless the path turns quiet: with one
            // direction silent the agent is still heard, but neither the open nor the answer to
            // it gets through.
            return tokio::select! {
                r = &mut open => Attempt::Answered(r),
                () = went_quiet(&mut quiet) => given_up(s, others),
            };
        }
        s.doubt_silent(heard, open_timeout, metrics);
        if others() {
            return Attempt::Silent;
        }
        wait = open_timeout;
    }
}

/// The wait for an open on a session whose PINGs are in order with its streams (HTTP/2: one TCP
/// connection). Any byte from the agent is no proof there: on a flapping path its own PINGs
/// arrive while what the seed sent waits in the session's TCP behind a lost segment and a
/// retransmission back-off that can outlast the next moment the path is up, and so can the
/// agent's answer. The proof is an answered PING sent after the open, within `patience.prove`,
/// and the agent must go on giving it while the dial waits (a PING goes out every quarter of
/// that meanwhile): once the open timeout has passed since the last answered PING's sending,
/// the session is stalled for this dial, which moves on, or is refused with the reason when no
/// other session could take it. An agent slow to reach its target answers its PINGs all the
/// while and keeps the whole dial timeout.
async fn in_order<F: Future<Output = Result<TunnelStream, DialError>>>(
    s: &Session,
    mut open: std::pin::Pin<&mut F>,
    echoes: &Echoes,
    patience: Patience,
    mut quiet: Option<watch::Receiver<bool>>,
    others: impl Fn() -> bool,
    metrics: &ServerMetrics,
) -> Attempt {
    let heard = s.opener.heard();
    // Queue the open before taking the time: only a PING sent after it shows the open got through.
    if let Poll::Ready(r) = std::future::poll_fn(|cx| Poll::Ready(open.as_mut().poll(cx))).await {
        return Attempt::Answered(r);
    }
    let opened = tokio::time::Instant::now();
    let (open_timeout, tick) = (patience.open, patience.prove / 4);
    loop {
        tokio::select! {
            r = tokio::time::timeout(tick, &mut open) => if let Ok(r) = r {
                return Attempt::Answered(r);
            },
            () = went_quiet(&mut quiet) => return given_up(s, others),
        }
        let (since, limit) = match echoes.last_answered() {
            Some(at) if at >= opened => (at, open_timeout),
            _ => (opened, patience.prove),
        };
        if since.elapsed() < limit {
            s.opener.probe();
            continue;
        }
        s.doubt_silent(heard, open_timeout, metrics);
        return if others() { Attempt::Silent } else { Attempt::Answered(Err(stalled(&s.cluster, limit))) };
    }
}

/// The session turned suspect during an attempt: another session takes the dial, or none can.
fn given_up(s: &Session, others: impl Fn() -> bool) -> Attempt {
    if others() { Attempt::TurnedSuspect } else { Attempt::Answered(Err(all_suspect(&s.cluster))) }
}
