//! One dial attempt on one agent session, under the open timeout: answered, or given up on a session that stays silent (marked so: [`Session::doubt_silent`]) or turns suspect.

use super::session::Session;
use crate::metrics::ServerMetrics;
use proxy_core::tunnel::{DialError, Echoes, Quiet, TunnelStream};
use std::future::Future;
use std::task::Poll;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

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
        s.doubt_silent(heard, open_timeout, metrics);
        return if others() { Attempt::Silent } else { Attempt::Answered(Err(stalled(&s.cluster, limit))) };
    }
}

/// The session turned suspect during an attempt: another session takes the dial, or none can.
fn given_up(s: &Session, others: impl Fn() -> bool) -> Attempt {
    if others() { Attempt::TurnedSuspect } else { Attempt::Answered(Err(all_suspect(&s.cluster))) }
}
