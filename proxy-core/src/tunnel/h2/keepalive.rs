//! An HTTP/2 session's keepalive: a PING every so often and on demand, the path quiet or the session failed when one goes unanswered, and the samples that let its stream window follow the path.

use super::tuning::Tuning;
use crate::tunnel::session::SessionError;
use crate::tunnel::{Echoes, TunnelSettings};
use h2::{Ping, PingPong};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// How often a busy session whose window may still grow samples its path (a PING each).
const SAMPLE_GAP: Duration = Duration::from_millis(100);
/// How often an idle session looks whether bytes flow again (an atomic load, no PING).
const IDLE_CHECK: Duration = Duration::from_secs(1);
/// Bytes received since the last look that make a session busy: more than PINGs and a trickle.
const BUSY: u64 = 64 * 1024;

/// Send a PING every [`TunnelSettings::ping_every`], and at once when `probes` asks for one (the seed: a dial wants a
/// sign of life; a request made while a PING is out gets one after it). A PING unanswered for
/// the suspect time makes the path quiet (`quiet(true)`; `quiet(false)` once one is answered):
/// the session goes on, its streams wait for the path. It fails when one goes unanswered for the
/// timeout. While the session is busy and its window may still grow, a PING every
/// [`SAMPLE_GAP`] also samples the path for `tuning`. Each answered PING's sending time goes to
/// `echoes`.
pub(super) fn keepalive(
    mut pp: PingPong,
    settings: &TunnelSettings,
    probes: Option<Arc<Notify>>,
    echoes: Arc<Echoes>,
    quiet: impl Fn(bool) + Send + Sync + 'static,
    mut tuning: Tuning,
) -> impl Future<Output = SessionError> + Send + 'static {
    let (interval, timeout) = (settings.ping_every(), settings.keepalive_timeout);
    let suspect = settings.suspect();
    async move {
        let mut due = Instant::now() + interval;
        let mut seen = tuning.received();
        loop {
            let probed = async {
                match &probes {
                    Some(p) => p.notified().await,
                    None => std::future::pending().await,
                }
            };
            let growing = tuning.tuner.growing();
            let look = Instant::now() + if growing { IDLE_CHECK.min(interval) } else { interval };
            let mut asked = false;
            tokio::select! {
                () = tokio::time::sleep_until(look.min(due)) => {}
                () = probed => asked = true,
            }
            // Bytes since the last look: a busy session samples now and again after SAMPLE_GAP.
            let mut busy = growing && tuning.received().saturating_sub(seen) >= BUSY;
            if !busy {
                seen = tuning.received();
            }
            while asked || busy || Instant::now() >= due {
                let (sent, before) = (Instant::now(), tuning.received());
                if let Err(e) = ping_once(&mut pp, suspect, timeout, &quiet, &echoes).await {
                    return e;
                }
                due = Instant::now() + interval;
                seen = tuning.received();
                if let Some(w) = tuning.tuner.sample(sent.elapsed(), seen.saturating_sub(before)) {
                    tracing::debug!(window = w, "the session's stream window grows with its path");
                    let _ = tuning.apply.send(w);
                }
                if !(busy && tuning.tuner.growing()) {
                    break;
                }
                tokio::time::sleep(SAMPLE_GAP).await;
                busy = tuning.received().saturating_sub(seen) >= BUSY;
                asked = false;
            }
        }
    }
}

/// One PING and its answer: quiet after `suspect` without one, failed after `timeout`.
async fn ping_once(
    pp: &mut PingPong,
    suspect: Duration,
    timeout: Duration,
    quiet: &impl Fn(bool),
    echoes: &Echoes,
) -> Result<(), SessionError> {
    // Taken before it is queued: a dial that took the time after queueing its open knows that a
    // PING sent later cannot have gone out ahead of the open.
    let sent = Instant::now();
    let ping = pp.ping(Ping::opaque());
    tokio::pin!(ping);
    let answer = match tokio::time::timeout(suspect, &mut ping).await {
        Ok(answer) => answer,
        Err(_) => {
            quiet(true);
            tokio::time::timeout(timeout - suspect, &mut ping)
                .await
                .map_err(|_| SessionError::KeepaliveTimeout(timeout))?
        }
    };
    match answer {
        Ok(_) => {
            echoes.answered(sent);
            quiet(false);
            Ok(())
        }
        Err(e) => Err(SessionError::transport("session failed", e)),
    }
}
