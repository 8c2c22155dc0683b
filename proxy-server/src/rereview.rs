//! A token agent's live session: its token reviewed again when it expires or when the agent sends a renewed one; the session closed when a review says no, left alone when the kube-apiserver does not answer.

use crate::identity::Refused;
use crate::session::Session;
use crate::shared::Shared;
use crate::tokens::{ClusterReview, ReviewError, Reviewed};
use proxy_core::tunnel::session::Presented;
use std::time::{Duration, SystemTime};
use tokio_util::sync::CancellationToken;

/// Soonest a review follows the last one: a token whose `exp` already passed by this replica's
/// clock (skew) is not reviewed in a loop.
const FLOOR: Duration = Duration::from_secs(10);
/// How often a token without `exp` (a legacy Secret's token) is reviewed again.
const NO_EXPIRY: Duration = Duration::from_secs(600);
/// How soon a review the kube-apiserver did not answer is tried again.
const RETRY: Duration = Duration::from_secs(10);

/// A token agent's session as it was admitted: what its later reviews compare with.
pub(crate) struct TokenState {
    pub presented: tokio::sync::watch::Receiver<Option<Presented>>,
    pub reviewed: Reviewed,
    pub settings: ClusterReview,
}

/// When the token reviewed as `expires` must be reviewed again, from `now`.
fn next_review(expires: Option<SystemTime>, now: SystemTime) -> Duration {
    match expires {
        None => NO_EXPIRY,
        Some(e) => e.duration_since(now).unwrap_or_default().max(FLOOR),
    }
}

/// Review the session's token whenever it expires or is renewed, until a review refuses it:
/// then the session is refused (the agent is told why) and this returns. Runs as long as the
/// session (its caller drops it with the session).
pub(crate) async fn keep(shared: &Shared, sess: &Session, mut t: TokenState, stop: &CancellationToken) {
    let mut wait = next_review(t.reviewed.expires, SystemTime::now());
    loop {
        let renewed = async {
            match t.presented.changed().await {
                Ok(()) => {}
                // The control stream is gone: only the deadline is left.
                Err(_) => std::future::pending().await,
            }
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = renewed => {}
        }
        let token = t.presented.borrow_and_update().as_ref().map(|p| p.token.clone()).unwrap_or_default();
        let result = shared.reviewers.review(&sess.cluster, &t.settings, &token).await;
        let refused = match result {
            Ok(r) if r.account == t.reviewed.account => {
                wait = next_review(r.expires, SystemTime::now());
                t.reviewed = r;
                continue;
            }
            Ok(r) => Refused::AccountChanged { was: t.reviewed.account.to_string(), now: r.account.to_string() },
            Err(ReviewError::Unavailable(e)) => {
                tracing::warn!(cluster = %sess.cluster, session = sess.id, error = %e, "token review again: the kube-apiserver did not answer; the session stays");
                wait = RETRY;
                continue;
            }
            Err(error) => Refused::Token { cluster: sess.cluster.clone(), error },
        };
        shared.metrics.sessions_ended.with_label_values(&[&sess.cluster, refused.label()]).inc();
        tracing::warn!(cluster = %sess.cluster, session = sess.id, peer = %sess.peer, reason = refused.label(), "agent session ended: {refused}");
        crate::identity::tell_and_close(&refused, &sess.opener, stop);
        return;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_reviewed_again_at_its_expiry_and_never_in_a_loop() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        assert_eq!(next_review(Some(now + Duration::from_secs(3600)), now), Duration::from_secs(3600));
        assert_eq!(next_review(Some(now + Duration::from_secs(3)), now), FLOOR);
        assert_eq!(next_review(Some(now - Duration::from_secs(30)), now), FLOOR, "past by this clock");
        assert_eq!(next_review(None, now), NO_EXPIRY);
    }
}
