//! The slot's own dial and its live session: taking a session as the live one, its announcement, its end, and the errand's session taking its place make-before-break.

use super::events::{Carrier, Failure};
use super::notes::{Log, Metric};
use super::state::{Connected, Cx, Dial, Errand, Phase, Purpose, Session, Wait, Why};
use crate::replicas::Verdict;
use proxy_core::tunnel::ServerInfo;
use seedgate_config::HostPort;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// The slot's own dial and its live session.
impl Cx {
    pub(super) fn slot_dialed(&mut self, now: Instant, d: Dial, result: Result<SocketAddr, Failure>) -> Phase {
        let e = match result {
            Ok(peer) => {
                self.fell_back(&d);
                self.unanswered = 0;
                return self.adopt(now, Self::session(d, peer, now));
            }
            Err(e) => e,
        };
        if let Some(h2) = self.fallback(&d, &e) {
            return Phase::Dialing(h2);
        }
        let target = d.target.clone();
        if !e.silent() || self.unanswered == 0 {
            self.log(Log::Failed { target, error: e.clone() });
        } else {
            self.log(Log::StillNoAnswer { target, error: e.clone(), tries: self.unanswered });
        }
        self.lost(&format!("not connected: {e}"));
        if d.reconnect {
            self.count(Metric::Reconnect { ok: false });
        }
        // A move target that does not answer is not kept: fall back to the name.
        self.target = self.slot.configured.clone();
        if e.silent() {
            return Phase::Waiting(now + self.probe_silent());
        }
        self.unanswered = 0;
        Phase::Waiting(now + self.backoff_wait())
    }

    /// `live` is the slot's session now: report it if up, and act on its announcement.
    pub(super) fn adopt(&mut self, now: Instant, mut live: Session) -> Phase {
        if live.up {
            self.report_up(&live);
        }
        let info = live.info.take();
        let c = Connected::new(live, now, self.settings.reresolve);
        match info {
            Some(info) => self.live_announced(now, c, info),
            None => Phase::Connected(c),
        }
    }

    pub(super) fn live_announced(&mut self, now: Instant, mut c: Box<Connected>, info: ServerInfo) -> Phase {
        if c.live.info.as_ref() == Some(&info) {
            return Phase::Connected(c);
        }
        if self.slot.replicas.announced(self.slot.index, &info) == Verdict::Duplicate {
            self.log(Log::Duplicate { id: info.id.clone() });
            self.count(Metric::Duplicate);
            // No deadline, as for a candidate: streams the seed opened on it run to their end.
            self.retire(c.live.id, None, "closing the duplicate session");
            // Dial the same place again (a move target stays the target: behind it is the
            // replica set the slot was sent to); a failed connect falls back to the name.
            self.lost("closed a duplicate session; dialing again");
            return self.gone(now, c, Wait::Probe);
        }
        self.log(Log::Announced { id: info.id.clone(), count: info.count, draining: info.draining });
        self.probe.reset();
        if !info.draining {
            c.replace_at = None;
        } else if c.replace_at.is_none() {
            self.log(Log::Draining { target: c.live.target.clone() });
            c.replace_at = Some(now);
        }
        c.live.info = Some(info);
        Phase::Connected(c)
    }

    pub(super) fn live_ended(&mut self, now: Instant, c: Box<Connected>, error: Option<Failure>) -> Phase {
        let was_up = c.live.up;
        match error {
            None => self.log(Log::Closed),
            // TLS passed on our side but the seed never spoke the transport's protocol:
            // typically it refused our certificate (its verdict comes after our handshake).
            Some(error) if !was_up => self.log(Log::FailedBeforeUp { error }),
            Some(error) => self.log(Log::Ended { error }),
        }
        self.lost("not connected");
        if !was_up && c.live.reconnect {
            self.count(Metric::Reconnect { ok: false });
        }
        // Only a session that proved itself — it lived at least `reconnect.max`, or carried a
        // stream — resets the back-off: the next failure is fresh. One that came up and ended
        // sooner does not, so a server (or a middlebox) that accepts sessions and closes them at
        // once is redialled at a growing interval, not every `reconnect.initial`.
        let lived = now.saturating_duration_since(c.live.since);
        if c.live.carried || lived >= self.settings.reconnect_max {
            self.backoff.reset();
        } else if was_up {
            self.log(Log::Unproven { lived });
            self.count(Metric::StormAvoided);
        }
        self.gone(now, c, Wait::Backoff)
    }

    /// The live session is gone: a session on its way to replace it takes its place; else the
    /// slot dials again after `wait`.
    fn gone(&mut self, now: Instant, c: Box<Connected>, wait: Wait) -> Phase {
        match c.errand {
            Some(Errand::Dialing { purpose, dial }) => {
                self.arrive(purpose, &dial.target);
                Phase::Dialing(dial)
            }
            Some(Errand::Trying { purpose, session, .. }) => {
                self.arrive(purpose, &session.target);
                self.adopt(now, session)
            }
            errand => {
                if let Some(Errand::Resolving { why: Why::Move(notice), .. }) = errand {
                    self.target = notice.next;
                }
                let wait = match wait {
                    Wait::Backoff => self.backoff_wait(),
                    Wait::Probe => self.probe_wait(),
                };
                Phase::Waiting(now + wait)
            }
        }
    }

    /// Make-before-break: `session` is up (and judged good); it takes over, then the old live
    /// session is retired. After a re-homing the seed it leaves can still open streams on it
    /// until the drain deadline: that seed's kube-apiserver serves until the move completes
    /// (its clients' connections drain there), and its dials must not fail meanwhile. Fencing
    /// the cluster there ends the session earlier.
    pub(super) fn swap(&mut self, now: Instant, c: Box<Connected>, purpose: Purpose, session: Session) -> Phase {
        let (drain, why) = self.arrive(purpose, &session.target);
        let open = matches!(purpose, Purpose::Rehome { .. });
        self.retire_open(c.live.id, drain, open, why);
        self.adopt(now, session)
    }

    /// The errand's session takes the slot's place: the slot is where it went now. Returns the
    /// old session's drain deadline and the reason logged when it is retired (see
    /// [`super::events::Action::Retire`]).
    fn arrive(&mut self, purpose: Purpose, target: &HostPort) -> (Option<Duration>, &'static str) {
        self.target = target.clone();
        match purpose {
            Purpose::Rehome { drain } => (drain, "tunnel session replaced; draining the old one"),
            Purpose::Replace => {
                self.probe.reset();
                // The draining replica ends the old session's streams at its own deadline.
                (None, "replica draining: replaced; its streams finish there")
            }
            Purpose::Rescue => {
                self.count(Metric::Replaced);
                // Its streams wait for the path until they end or its keepalive gives up.
                (None, "tunnel session suspect: replaced; its open streams go on there")
            }
            Purpose::Upgrade => {
                self.count(Metric::TransportChange { from: Carrier::H2, to: Carrier::Quic });
                // Make-before-break, as for re-homing: GOAWAY on the h2 session, whose streams
                // run to their end.
                (
                    None,
                    "transport auto: QUIC gets through now; moved the session to QUIC, the h2 session's streams finish there",
                )
            }
        }
    }
}
