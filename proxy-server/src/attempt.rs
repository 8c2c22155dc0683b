//! One dial attempt on one agent session, under the open timeout, and what it and the session's keepalive learn of its liveness (marks, counts and logs).

use crate::liveness::Standing;
use crate::metrics::ServerMetrics;
use crate::session::Session;
use proxy_core::tunnel::{DialError, Echoes, Quiet, TunnelStream};
use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// How `s` stands for new dials now (a doubt it outlived is cleared and noted).
pub(crate) fn standing(s: &Session, metrics: &ServerMetrics) -> Standing {
    let (standing, cleared) = s.liveness.standing(|| s.opener.heard());
    revived(s, cleared, metrics);
    standing
}

/// `s`'s keepalive went unanswered for the suspect time: it takes no new dials.
pub(crate) fn suspect(s: &Session) -> bool {
    s.opener.quiet().is_some_and(Quiet::is_silent)
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
        doubt(s, heard, open_timeout, metrics);
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
    let opened = Instant::now();
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
        doubt(s, heard, open_timeout, metrics);
        return if others() { Attempt::Silent } else { Attempt::Answered(Err(stalled(&s.cluster, limit))) };
    }
}

/// `s` left an open unanswered, with no sign the agent got it, for `open_timeout`: it is tried
/// last until it shows life (counted and logged once per doubt).
fn doubt(s: &Session, heard: Option<u64>, open_timeout: Duration, metrics: &ServerMetrics) {
    if s.liveness.doubt(Standing::Suspect, heard) {
        metrics.sessions_doubted.with_label_values(&[&s.cluster, "silent"]).inc();
        tracing::warn!(cluster = %s.cluster, session = s.id, peer = %s.peer, node = %node(s), ?open_timeout, "agent session silent: no answer to a stream open and no sign that the agent got it; tried last until it shows life");
    }
}

/// The session turned suspect during an attempt: another session takes the dial, or none can.
fn given_up(s: &Session, others: impl Fn() -> bool) -> Attempt {
    if others() { Attempt::TurnedSuspect } else { Attempt::Answered(Err(all_suspect(&s.cluster))) }
}

/// The node `s`'s agent named (empty before its hello, or when it named none).
pub(crate) fn node(s: &Session) -> String {
    s.hello.get().map(|h| h.node.clone()).unwrap_or_default()
}

/// Note a doubt of `s` that [`Liveness::standing`](crate::liveness::Liveness::standing) cleared, if any: counted, and logged — a
/// superseded session that shows life is another live agent with the same node name.
pub(crate) fn revived(s: &Session, cleared: Option<Standing>, metrics: &ServerMetrics) {
    let Some(was) = cleared else { return };
    let reason = if was == Standing::Superseded { "superseded" } else { "silent" };
    metrics.sessions_revived.with_label_values(&[&s.cluster, reason]).inc();
    let node = node(s);
    match was {
        Standing::Superseded => tracing::warn!(
            cluster = %s.cluster, session = s.id, peer = %s.peer, %node,
            "a session superseded by a new run of its node is alive: two agents claim node {node:?} (give each its own tunnel.identifiers.host or tunnel.node_name); both take dials"
        ),
        _ => {
            tracing::info!(cluster = %s.cluster, session = s.id, peer = %s.peer, %node, "suspect agent session showed life again")
        }
    }
}

/// Count and log `session`'s keepalive turning suspect and back, until the session is gone.
/// Holds it weakly: the watch ends when the session (and its transport) is dropped.
pub(crate) fn watch_suspect(metrics: ServerMetrics, session: &Arc<Session>) {
    let Some(mut quiet) = session.opener.quiet().map(proxy_core::tunnel::Quiet::watch) else { return };
    let (weak, cluster, id, peer) =
        (Arc::downgrade(session), session.cluster.clone(), session.id, session.peer.clone());
    let gauge = metrics.sessions_suspect.with_label_values(&[&cluster]);
    tokio::spawn(async move {
        let mut since: Option<tokio::time::Instant> = None;
        while quiet.changed().await.is_ok() {
            let silent = *quiet.borrow_and_update();
            let Some(s) = weak.upgrade() else { break };
            match (silent, since) {
                (true, None) => {
                    since = Some(tokio::time::Instant::now());
                    gauge.inc();
                    metrics.sessions_suspect_total.with_label_values(&[&cluster]).inc();
                    let streams = s.opener.active_streams();
                    tracing::warn!(%cluster, session = id, %peer, node = %node(&s), streams, "agent session suspect: its keepalive went unanswered (the path is quiet); no new dials go to it, its open streams wait for the path");
                }
                (false, Some(at)) => {
                    since = None;
                    gauge.dec();
                    let streams = s.opener.active_streams();
                    metrics.streams_survived.with_label_values(&[&cluster]).inc_by(streams as u64);
                    tracing::info!(%cluster, session = id, %peer, quiet = ?at.elapsed(), streams, "suspect agent session answers again: it takes dials, its open streams rode out the outage");
                }
                _ => {}
            }
        }
        if since.is_some() {
            gauge.dec();
        }
    });
}
