//! The slot's errands, as transitions of its machine: re-homing after a move notice or when the live session's name resolves elsewhere, replacing a draining replica, moving `auto` from h2 to QUIC, rescuing a quiet session — each started when due, dialled beside the live session, judged, then swapped in make-before-break or given up.

use super::events::{Carrier, Failure, QueryId};
use super::notes::{Log, Metric};
use super::state::{
    Connected, Cx, Dial, Errand, Notice, Over, Phase, Purpose, RESCUE_PACE, RESCUE_PATIENCE, Session, Why, due,
};
use seedgate_config::HostPort;
use seedgate_config::agent::Transport;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// What starts an errand.
impl Cx {
    /// With no errand running: a rescue of a quiet session, the newest move notice, then a
    /// replacement for a draining replica, then a move to QUIC, then following DNS.
    pub(super) fn errands(&mut self, now: Instant, c: &mut Connected) {
        self.arm_upgrade(now, c);
        if due(c.rescue_at, now) && c.live.quiet {
            c.rescue_at = None;
            let (place, over) = (c.live.target.clone(), Over::configured(self.settings.transport));
            c.errand = Some(Errand::Dialing {
                purpose: Purpose::Rescue,
                dial: self.dial_within(place, over, RESCUE_PATIENCE),
            });
            return;
        }
        if let Some(notice) = self.queued.take() {
            self.resolve(c, notice.next.clone(), Why::Move(notice));
            return;
        }
        if due(c.replace_at, now) {
            if self.slot.replicas.wants_session(self.slot.index) {
                let over = Over::configured(self.settings.transport);
                return self.start(c, Purpose::Replace, self.slot.configured.clone(), over);
            }
            // The other sessions already reach as many replicas as announced.
            c.replace_at = Some(now + self.probe_wait());
        }
        if c.replace_at.is_none() && due(c.upgrade_at, now) {
            c.upgrade_at = None;
            if c.live.up {
                // The same place the h2 session reached; kept if it reached that replica (or
                // another one no other slot holds, not draining).
                let place = c.live.target.clone();
                return self.start(c, Purpose::Upgrade, place, Over::Quic { else_h2: false });
            }
            self.arm_upgrade(now, c);
        }
        if due(c.follow_at, now) {
            c.follow_at = None;
            let name = c.live.target.clone();
            self.resolve(c, name, Why::Follow);
        }
    }

    /// `auto` on h2: the next try to move to QUIC is armed (jittered, so that agents that fell
    /// back at the same moment do not probe in step); otherwise there is none.
    fn arm_upgrade(&mut self, now: Instant, c: &mut Connected) {
        if self.settings.transport != Transport::Auto || c.live.over != Carrier::H2 {
            c.upgrade_at = None;
        } else if c.upgrade_at.is_none() {
            // Between ¾ of the interval and all of it.
            let wait = self.settings.quic_probe_interval.mul_f64(0.75 + 0.25 * (self.draw)().clamp(0.0, 1.0));
            c.upgrade_at = Some(now + wait);
        }
    }

    pub(super) fn queue_move(&mut self, to: &[String], drain_deadline_ms: u64) {
        let next = to.iter().find_map(|s| s.parse::<HostPort>().ok()).unwrap_or_else(|| self.slot.configured.clone());
        let drain = (drain_deadline_ms > 0).then(|| Duration::from_millis(drain_deadline_ms));
        self.count(Metric::Move);
        self.queued = Some(Notice { next, drain });
    }
}

/// Re-homing: where a move notice or the live session's name points.
impl Cx {
    pub(super) fn resolved(
        &mut self,
        now: Instant,
        phase: Phase,
        query: QueryId,
        addrs: Option<Vec<SocketAddr>>,
    ) -> Phase {
        let Phase::Connected(mut c) = phase else { return phase };
        match c.errand.take() {
            Some(Errand::Resolving { query: q, why: Why::Move(notice) }) if q == query => {
                self.move_resolved(&mut c, notice, addrs)
            }
            Some(Errand::Resolving { query: q, why: Why::Follow }) if q == query => {
                self.follow_resolved(now, &mut c, addrs)
            }
            errand => c.errand = errand,
        }
        Phase::Connected(c)
    }

    fn move_resolved(&mut self, c: &mut Connected, notice: Notice, addrs: Option<Vec<SocketAddr>>) {
        // A notice that reaches us after we already moved there (e.g. DNS got us there first,
        // and the old session delivered the notice late) changes nothing.
        if addrs.is_some_and(|a| a.contains(&c.live.peer)) {
            self.log(Log::AlreadyThere { to: notice.next });
            return;
        }
        self.log(Log::Rehoming { from: c.live.target.clone(), to: notice.next.clone() });
        let over = Over::configured(self.settings.transport);
        self.start(c, Purpose::Rehome { drain: notice.drain }, notice.next, over);
    }

    fn follow_resolved(&mut self, now: Instant, c: &mut Connected, addrs: Option<Vec<SocketAddr>>) {
        c.follow_at = Some(now + self.settings.reresolve);
        let (name, old) = (c.live.target.clone(), c.live.peer);
        // Follow DNS: the name we dialled no longer includes the address we are on.
        if let Some(new) = addrs.filter(|a| !a.is_empty() && !a.contains(&old)) {
            self.log(Log::NameMoved { name: name.clone(), old, new });
            self.count(Metric::Move);
            let purpose = Purpose::Rehome { drain: Some(self.settings.rehome_drain) };
            self.start(c, purpose, name, Over::configured(self.settings.transport));
        }
    }
}

/// An errand's session: dialled, judged, kept or not.
impl Cx {
    pub(super) fn candidate_dialed(
        &mut self,
        now: Instant,
        mut c: Box<Connected>,
        purpose: Purpose,
        d: Dial,
        result: Result<SocketAddr, Failure>,
    ) -> Phase {
        match result {
            Ok(peer) => {
                self.fell_back(&d);
                let deadline = now + self.settings.dial_timeout;
                c.errand = Some(Errand::Trying { purpose, session: Self::session(d, peer, now), deadline });
                Phase::Connected(c)
            }
            Err(e) => match self.fallback(&d, &e) {
                Some(dial) => {
                    c.errand = Some(Errand::Dialing { purpose, dial });
                    Phase::Connected(c)
                }
                None => self.not_kept(now, c, purpose, &d.target, e),
            },
        }
    }

    /// The candidate's deadline passed without a verdict.
    pub(super) fn deadline(&mut self, now: Instant, mut c: Box<Connected>) -> Phase {
        match c.errand.take() {
            Some(Errand::Trying { purpose, session, deadline }) if deadline <= now => {
                // A server that announces nothing (an older version) is taken once it is up
                // (a move target would have been taken when it came up).
                let good = session.up;
                self.judged(now, c, purpose, session, good)
            }
            errand => {
                c.errand = errand;
                Phase::Connected(c)
            }
        }
    }

    pub(super) fn judged(
        &mut self,
        now: Instant,
        c: Box<Connected>,
        purpose: Purpose,
        session: Session,
        good: bool,
    ) -> Phase {
        if good {
            return self.swap(now, c, purpose, session);
        }
        self.log(Log::Rejected { id: session.info.as_ref().map(|i| i.id.clone()) });
        // No deadline: the seed may already have opened a stream on it (a fresh session is
        // the least busy one); GOAWAY stops new ones, and the session closes when those end.
        self.retire(session.id, None, "replacement candidate not kept; closing it");
        let why = if session.up { Failure::HeldOrDraining } else { Failure::NotUpInTime };
        match self.not_kept(now, c, purpose, &session.target, why) {
            // The path answers, but behind the name is a replica another slot holds: the next
            // rescue waits for the probe back-off, so that the other replicas are not handed a
            // session every pace while this one's path stays silent.
            Phase::Connected(mut c) if matches!(purpose, Purpose::Rescue) && session.up && c.rescue_at.is_some() => {
                c.rescue_at = Some(now + self.probe_wait().max(RESCUE_PACE));
                Phase::Connected(c)
            }
            phase => phase,
        }
    }

    /// The errand's session did not make it: the live session stays.
    pub(super) fn not_kept(
        &mut self,
        now: Instant,
        mut c: Box<Connected>,
        purpose: Purpose,
        target: &HostPort,
        error: Failure,
    ) -> Phase {
        let target = target.clone();
        match purpose {
            Purpose::Rehome { .. } => self.log(Log::RehomeFailed { target, error }),
            Purpose::Replace => {
                self.log(Log::NoReplacement { error });
                if c.draining() {
                    c.replace_at = Some(now + self.probe_wait());
                }
            }
            Purpose::Upgrade => self.log(Log::StillOnH2 { target, error }),
            Purpose::Rescue => {
                self.log(Log::NoRescue { target, error });
                if c.live.quiet {
                    c.rescue_at = Some(now + self.rescue_pace());
                }
            }
        }
        Phase::Connected(c)
    }
}
