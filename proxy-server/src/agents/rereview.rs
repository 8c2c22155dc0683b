//! A token agent's live session: its renewals (empty, the same, too soon, or reviewed), its token reviewed again at its expiry and after each renewal with the cluster's rules of the moment, and the session ended when a review says no, when the agent has no token any more, when its cluster no longer takes its token, or when no review answered within the grace past its token's `exp`.
//!
//! [`Renewals`] decides, without I/O or clock (its tests run on a virtual one); [`keep`] is the
//! tokio glue: it sleeps until what [`Renewals`] says, reads renewals off the control stream,
//! asks for reviews, and ends the session.

use super::identity::Rules;
use super::refusal::{Peer, Refusal, tell_and_close};
use super::tokens::{Asker, ClusterReview, ReviewError, Reviewed, Unavailable};
use super::wing::Agents;
use crate::registry::Session;
use proxy_core::tunnel::Secret;
use proxy_core::tunnel::session::Presented;
use seedgate_config::server::AgentAuth;
use std::time::{Duration, Instant, SystemTime};
use tokio_util::sync::CancellationToken;

/// Least time between two reviews of one session: renewals in between wait (only the latest is
/// reviewed then), an unanswered review is tried again this much later, and a token whose
/// `exp` already passed by this replica's clock (skew) is not reviewed in a loop. A yes counts
/// for at least this long.
pub(crate) const GAP: Duration = Duration::from_secs(10);
/// How often a token without `exp` (a legacy Secret's token) is reviewed again.
const NO_EXPIRY: Duration = Duration::from_secs(600);

/// What a renewal was worth: the `result` label of `seedgate_token_renewals_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewal {
    /// A new token, reviewed now.
    Review,
    /// A new token, too soon after the last review: reviewed once the gap passed, if it is
    /// still the latest then.
    Deferred,
    /// Replaced by a later renewal before it was looked at: never reviewed.
    Superseded,
    /// The session's token (or the one already waiting) again: not reviewed.
    Unchanged,
    /// No token: the agent has none any more, and the session ends.
    Empty,
}

impl Renewal {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Renewal::Review => "review",
            Renewal::Deferred => "deferred",
            Renewal::Superseded => "superseded",
            Renewal::Unchanged => "unchanged",
            Renewal::Empty => "empty",
        }
    }
}

/// What the session does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Next {
    /// Review this token now (the one waiting, else the session's own at its expiry).
    Review(Secret),
    /// Nothing until then (or a renewal, or a change of rules).
    Sleep(Instant),
    /// No review answered within the grace past the token's `exp`: end the session.
    End,
}

/// The renewal and re-review rules of one token session (see the module documentation).
#[derive(Debug)]
pub(crate) struct Renewals {
    /// The token the last yes was for.
    current: Secret,
    /// Until when that yes counts: the token's `exp`, but at least [`GAP`] past the yes (a
    /// skewed clock), or [`NO_EXPIRY`] past it for a token without `exp`.
    valid_until: Instant,
    /// When the last review began (the admission's included).
    last: Instant,
    /// A renewed token waiting for its review.
    pending: Option<Secret>,
    /// The last review found no answer: try again [`GAP`] after it.
    retrying: bool,
    /// Renewals counted so far (the control stream's count).
    seen: u64,
}

impl Renewals {
    /// A session admitted at `now` by a yes for `token` (whose `exp` is `expires_in` away), after
    /// `seen` renewals.
    pub(crate) fn new(now: Instant, token: Secret, expires_in: Option<Duration>, seen: u64) -> Self {
        Self {
            current: token,
            valid_until: Self::until(now, expires_in),
            last: now,
            pending: None,
            retrying: false,
            seen,
        }
    }

    fn until(now: Instant, expires_in: Option<Duration>) -> Instant {
        now + expires_in.map_or(NO_EXPIRY, |left| left.max(GAP))
    }

    /// When the next review is due.
    fn due(&self) -> Instant {
        if self.retrying || self.pending.is_some() {
            // A yes counts for a gap at least, so a renewal waiting for the gap is reviewed
            // before the session's yes runs out.
            self.last + GAP
        } else {
            self.valid_until.max(self.last + GAP)
        }
    }

    /// When the session ends without a yes: `grace` past its token's expiry.
    pub(crate) fn deadline(&self, grace: Duration) -> Option<Instant> {
        self.valid_until.checked_add(grace)
    }

    /// The control stream counts `count` renewals, the latest carrying `token`: what each new one
    /// was worth, with how many of each. [`Renewal::Empty`] means the session must end.
    pub(crate) fn renewed(&mut self, now: Instant, token: Secret, count: u64) -> Vec<(Renewal, u64)> {
        let new = count.saturating_sub(self.seen);
        self.seen = self.seen.max(count);
        if new == 0 {
            return Vec::new();
        }
        let latest = if token.is_empty() {
            Renewal::Empty
        } else if token == self.current {
            // Back to the session's own token: nothing waits any more.
            self.pending = None;
            Renewal::Unchanged
        } else if self.pending.as_ref() == Some(&token) {
            Renewal::Unchanged
        } else {
            self.pending = Some(token);
            if self.due() <= now { Renewal::Review } else { Renewal::Deferred }
        };
        let mut out = Vec::with_capacity(2);
        if new > 1 {
            out.push((Renewal::Superseded, new - 1));
        }
        out.push((latest, 1));
        out
    }

    /// What to do at `now`, a session living `grace` past its token's expiry without a yes.
    /// [`Next::Review`] starts a review: answer it with [`Renewals::answered`] or
    /// [`Renewals::unanswered`].
    pub(crate) fn next(&mut self, now: Instant, grace: Duration) -> Next {
        let deadline = self.deadline(grace);
        let due = self.due();
        // A review due by the deadline is asked, even at it: its answer decides.
        if now >= due && deadline.is_none_or(|d| due <= d) {
            self.last = now;
            self.retrying = false;
            return Next::Review(self.pending.clone().unwrap_or_else(|| self.current.clone()));
        }
        match deadline {
            Some(d) if now >= d => Next::End,
            Some(d) => Next::Sleep(d.min(due)),
            None => Next::Sleep(due),
        }
    }

    /// The review of `token` said yes at `now`; its `exp` is `expires_in` away.
    pub(crate) fn answered(&mut self, now: Instant, token: Secret, expires_in: Option<Duration>) {
        if self.pending.as_ref() == Some(&token) {
            self.pending = None;
        }
        self.current = token;
        self.valid_until = Self::until(now, expires_in);
    }

    /// The review found no answer: tried again [`GAP`] after it began, within the grace.
    pub(crate) fn unanswered(&mut self) {
        self.retrying = true;
    }
}

/// A token agent's session as it was admitted: its token's yes and the control stream's renewals.
pub(crate) struct TokenState {
    pub presented: tokio::sync::watch::Receiver<Option<Presented>>,
    /// The token admitted, and the renewals counted before the admission's review.
    pub token: Secret,
    pub seen: u64,
    pub reviewed: Reviewed,
}

/// Whether the cluster's rules of the moment still take the session's token: its review
/// settings (`None`: its certificate alone admits it now, no review needed), or why not.
fn rules_now(agents: &Agents, sess: &Session) -> Result<Option<ClusterReview>, Refusal> {
    let rules = Rules::now(&agents.shared);
    let cluster = &sess.cluster;
    let auth = rules.auth(cluster);
    match (sess.identity.cert.is_some(), auth) {
        (true, AgentAuth::Mtls | AgentAuth::MtlsOrToken) => return Ok(None),
        (false, a) if !a.certificate_optional() => {
            return Err(Refusal::CertificateRequired { cluster: cluster.clone(), auth: a.as_str() });
        }
        _ => {}
    }
    match rules.review(&agents.shared, cluster) {
        Some(r) => Ok(Some(r)),
        None => Err(Refusal::NoTokenCluster(format!("cluster {cluster:?} has no token_review here any more"))),
    }
}

/// Keep the session's token under review (see the module documentation) until the session
/// must end: then it is refused (the agent is told why) and this returns. Runs as long as the
/// session (its caller drops it with the session).
pub(crate) async fn keep(agents: &Agents, sess: &Session, t: TokenState, stop: &CancellationToken) {
    let refused = watch(agents, sess, t).await;
    agents.shared.metrics.sessions_ended.with_label_values(&[&sess.cluster, refused.label()]).inc();
    let reason = proxy_core::obs::Untrusted::new(&refused.to_string()).max(1024).to_string();
    tracing::warn!(cluster = %sess.cluster, session = sess.id, peer = %sess.peer, reason = refused.label(), "agent session ended: {reason}");
    tell_and_close(&refused, Peer::Authenticated, &sess.opener, stop);
}

/// Follow the session until it must end; why it must.
async fn watch(agents: &Agents, sess: &Session, t: TokenState) -> Refusal {
    let cluster = &sess.cluster;
    let TokenState { mut presented, token, seen, reviewed } = t;
    let mut policy = Renewals::new(Instant::now(), token, reviewed.expires_in(SystemTime::now()), seen);
    let account = reviewed.account;
    let mut rules = agents.shared.rules_changed();
    let mut stream_open = true;
    loop {
        let grace = agents.shared.config.load().agents.token_review.grace.get();
        let token = match policy.next(Instant::now(), grace) {
            Next::End => {
                return Refusal::Token { cluster: cluster.clone(), error: Unavailable::PastGrace(grace).into() };
            }
            Next::Review(token) => token,
            Next::Sleep(until) => {
                tokio::select! {
                    () = tokio::time::sleep_until(until.into()) => {}
                    changed = presented.changed(), if stream_open => match changed {
                        Ok(()) => {
                            let p = presented.borrow_and_update().clone().unwrap_or_default();
                            for (r, n) in policy.renewed(Instant::now(), p.token, p.renewals) {
                                agents.reviewers.count_renewals(cluster, r.label(), n);
                                if r == Renewal::Empty {
                                    return Refusal::TokenWithdrawn { cluster: cluster.clone() };
                                }
                            }
                        }
                        // The control stream is gone: only the deadlines are left.
                        Err(_) => stream_open = false,
                    },
                    _ = rules.changed() => match rules_now(agents, sess) {
                        Err(r) => return r,
                        Ok(None) => return std::future::pending().await,
                        Ok(Some(_)) => {}
                    },
                }
                continue;
            }
        };
        // The cluster's rules of the moment: a reload applies from this review on.
        let settings = match rules_now(agents, sess) {
            Err(r) => return r,
            Ok(None) => return std::future::pending().await,
            Ok(Some(s)) => s,
        };
        // Bounded by the review's own timeout.
        match agents.reviewers.review(cluster, &settings, &token, Asker::Live).await {
            Ok(r) if r.account == account => {
                policy.answered(Instant::now(), token, r.expires_in(SystemTime::now()));
            }
            Ok(r) => return Refusal::AccountChanged { was: account.to_string(), now: r.account.to_string() },
            Err(ReviewError::Unavailable(e)) => {
                let error = proxy_core::obs::Untrusted::new(&e.to_string()).max(1024).to_string();
                tracing::warn!(%cluster, session = sess.id, %error, "token review again: the kube-apiserver did not answer; the session stays within agents.token_review.grace past its token's exp");
                policy.unanswered();
            }
            Err(error) => return Refusal::Token { cluster: cluster.clone(), error },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);
    const GRACE: Duration = Duration::from_secs(300);

    fn s(t: &str) -> Secret {
        Secret::new(t)
    }

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    /// A session admitted at `t0` with token `a`, valid for an hour.
    fn admitted() -> (Instant, Renewals) {
        let t0 = Instant::now();
        (t0, Renewals::new(t0, s("a"), Some(HOUR), 0))
    }

    #[test]
    fn a_token_is_reviewed_again_at_its_expiry_and_never_in_a_loop() {
        let (t0, mut r) = admitted();
        assert_eq!(r.next(t0, GRACE), Next::Sleep(t0 + HOUR));
        assert_eq!(r.next(t0 + HOUR, GRACE), Next::Review(s("a")));
        // A yes whose exp already passed by this clock (skew): it counts for the gap, no less.
        r.answered(t0 + HOUR, s("a"), Some(Duration::ZERO));
        assert_eq!(r.next(t0 + HOUR + secs(1), GRACE), Next::Sleep(t0 + HOUR + GAP));
        // A token that expires in seconds is reviewed no sooner than the gap after the last.
        let mut r = Renewals::new(t0, s("a"), Some(secs(3)), 0);
        assert_eq!(r.next(t0, Duration::ZERO), Next::Sleep(t0 + GAP));
        assert_eq!(r.next(t0 + GAP, Duration::ZERO), Next::Review(s("a")));
        // No exp: every ten minutes.
        let mut r = Renewals::new(t0, s("a"), None, 0);
        assert_eq!(r.next(t0, GRACE), Next::Sleep(t0 + NO_EXPIRY));
    }

    /// Every kind of renewal, row by row on a virtual clock: what it counts as, and what the
    /// session does next.
    #[test]
    fn renewals_row_by_row() {
        let (t0, mut r) = admitted();
        // The same token: not reviewed.
        assert_eq!(r.renewed(t0 + secs(1), s("a"), 1), vec![(Renewal::Unchanged, 1)]);
        assert_eq!(r.next(t0 + secs(1), GRACE), Next::Sleep(t0 + HOUR));
        // A new one too soon after the admission's review: deferred to the gap.
        assert_eq!(r.renewed(t0 + secs(2), s("b"), 2), vec![(Renewal::Deferred, 1)]);
        assert_eq!(r.next(t0 + secs(2), GRACE), Next::Sleep(t0 + GAP));
        // Two more arrive before it is looked at: one superseded, the latest waits instead.
        assert_eq!(r.renewed(t0 + secs(3), s("d"), 4), vec![(Renewal::Superseded, 1), (Renewal::Deferred, 1)]);
        // The one waiting, again: unchanged.
        assert_eq!(r.renewed(t0 + secs(4), s("d"), 5), vec![(Renewal::Unchanged, 1)]);
        // No new renewal counted (a spurious wake): nothing.
        assert_eq!(r.renewed(t0 + secs(4), s("d"), 5), vec![]);
        // At the gap the latest is reviewed, and only it.
        assert_eq!(r.next(t0 + GAP, GRACE), Next::Review(s("d")));
        r.answered(t0 + GAP, s("d"), Some(HOUR));
        assert_eq!(r.next(t0 + GAP, GRACE), Next::Sleep(t0 + GAP + HOUR));
        // A new one a gap later: reviewed at once.
        assert_eq!(r.renewed(t0 + GAP + GAP, s("e"), 6), vec![(Renewal::Review, 1)]);
        assert_eq!(r.next(t0 + GAP + GAP, GRACE), Next::Review(s("e")));
        // Back to the session's token while "e" is asked about: "e" no longer waits after it.
        r.answered(t0 + GAP + GAP, s("e"), Some(HOUR));
        // Empty: the agent has no token any more.
        assert_eq!(r.renewed(t0 + secs(30), Secret::default(), 7), vec![(Renewal::Empty, 1)]);
    }

    /// A renewal every second for 25 s costs at most one review per gap, and the latest is
    /// always reviewed in the end.
    #[test]
    fn a_renewal_every_second_costs_one_review_per_gap() {
        let (t0, mut r) = admitted();
        let mut reviews = Vec::new();
        for i in 1..=25u64 {
            let now = t0 + secs(i);
            r.renewed(now, s(&format!("t{i}")), i);
            if let Next::Review(t) = r.next(now, GRACE) {
                r.answered(now, t.clone(), Some(HOUR));
                reviews.push((i, t));
            }
        }
        assert_eq!(reviews, vec![(10, s("t10")), (20, s("t20"))]);
        assert_eq!(r.next(t0 + secs(30), GRACE), Next::Review(s("t25")));
    }

    /// A renewal waits for the gap, and a review due by the deadline is asked even at it: a
    /// renewal sent before the token's expiry is reviewed, even with no grace.
    #[test]
    fn a_renewal_sent_before_the_expiry_is_reviewed_even_with_no_grace() {
        let t0 = Instant::now();
        // A token with 3 s left: its yes counts for the gap.
        let mut r = Renewals::new(t0, s("a"), Some(secs(3)), 0);
        assert_eq!(r.renewed(t0 + secs(2), s("b"), 1), vec![(Renewal::Deferred, 1)]);
        assert_eq!(r.next(t0 + secs(2), Duration::ZERO), Next::Sleep(t0 + GAP));
        assert_eq!(r.next(t0 + GAP, Duration::ZERO), Next::Review(s("b")));
        r.unanswered();
        // No answer, no grace: the session ends.
        assert_eq!(r.next(t0 + GAP + secs(1), Duration::ZERO), Next::End);
    }

    /// No answer: tried again each gap, and the session ends `grace` past its token's expiry.
    #[test]
    fn unanswered_reviews_keep_a_session_only_within_the_grace() {
        let (t0, mut r) = admitted();
        let grace = secs(25);
        assert_eq!(r.next(t0 + HOUR, grace), Next::Review(s("a")));
        r.unanswered();
        assert_eq!(r.next(t0 + HOUR + secs(1), grace), Next::Sleep(t0 + HOUR + GAP));
        assert_eq!(r.next(t0 + HOUR + GAP, grace), Next::Review(s("a")));
        r.unanswered();
        assert_eq!(r.next(t0 + HOUR + GAP + GAP, grace), Next::Review(s("a")));
        r.unanswered();
        // The next try would be at 30 s: the deadline at 25 s comes first.
        assert_eq!(r.next(t0 + HOUR + secs(21), grace), Next::Sleep(t0 + HOUR + grace));
        assert_eq!(r.next(t0 + HOUR + grace, grace), Next::End);
        // A renewed token that came too late changes nothing to the deadline.
        let (t0, mut r) = admitted();
        assert_eq!(r.next(t0 + HOUR, Duration::ZERO), Next::Review(s("a")));
        r.unanswered();
        r.renewed(t0 + HOUR + secs(1), s("b"), 1);
        assert_eq!(r.next(t0 + HOUR + secs(1), Duration::ZERO), Next::End);
        // A grace beyond any clock never ends it for lack of an answer.
        let (t0, mut r) = admitted();
        assert_eq!(r.deadline(Duration::MAX), None);
        assert_eq!(r.next(t0 + HOUR, Duration::MAX), Next::Review(s("a")));
    }

    /// A yes for the renewed token makes it the session's, with its own expiry.
    #[test]
    fn a_yes_moves_the_session_to_the_renewed_token() {
        let (t0, mut r) = admitted();
        r.renewed(t0 + GAP, s("b"), 1);
        assert_eq!(r.next(t0 + GAP, GRACE), Next::Review(s("b")));
        r.answered(t0 + GAP, s("b"), Some(HOUR));
        assert_eq!(r.renewed(t0 + GAP + secs(1), s("b"), 2), vec![(Renewal::Unchanged, 1)]);
        assert_eq!(r.next(t0 + GAP + secs(1), GRACE), Next::Sleep(t0 + GAP + HOUR));
        // Admitted after renewals: those are not counted again.
        let mut r = Renewals::new(t0, s("a"), Some(HOUR), 3);
        assert_eq!(r.renewed(t0, s("a"), 3), vec![]);
        assert_eq!(r.renewed(t0, s("a"), 4), vec![(Renewal::Unchanged, 1)]);
    }
}
