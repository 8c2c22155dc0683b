//! Where each event goes: to the slot's own dial, its live session, the errand's session, or nowhere (a session nobody waits for); and what the passing of time starts.

use super::events::{Event, Failure, SessionId};
use super::notes::{Log, Metric};
use super::state::{Cx, Errand, Over, Phase, Purpose, RESCUE_PATIENCE};
use proxy_core::tunnel::ServerInfo;
use std::net::SocketAddr;
use std::time::Instant;

/// Event dispatch, and what the passing of time starts.
impl Cx {
    pub(super) fn on(&mut self, now: Instant, phase: Phase, event: Event) -> Phase {
        match event {
            Event::Dialed { id, result } => self.dialed(now, phase, id, result),
            Event::Up(id) => self.up(now, phase, id),
            Event::Quiet { id, silent } => self.quiet(now, phase, id, silent),
            Event::Carried(id) => self.carried(phase, id),
            Event::Announced(id, info) => self.announced(now, phase, id, info),
            Event::Ended { id, error } => self.ended(now, phase, id, error),
            Event::Move { to, drain_deadline_ms } => {
                self.queue_move(&to, drain_deadline_ms);
                phase
            }
            Event::Resolved { query, addrs } => self.resolved(now, phase, query, addrs),
            Event::Timer | Event::Wanted | Event::Stop => phase,
        }
    }

    /// Start what is due at `now`: a dial, a candidate's verdict at its deadline, an errand.
    pub(super) fn tend(&mut self, now: Instant, phase: Phase) -> Phase {
        match phase {
            Phase::Waiting(at) if at <= now => self.dial_or_park(),
            Phase::Parked => self.dial_or_park(),
            Phase::Connected(c) => match self.deadline(now, c) {
                Phase::Connected(mut c) if c.errand.is_none() => {
                    self.errands(now, &mut c);
                    Phase::Connected(c)
                }
                phase => phase,
            },
            phase => phase,
        }
    }

    fn dial_or_park(&mut self) -> Phase {
        if !self.slot.replicas.wants_session(self.slot.index) {
            // Enough sessions to distinct replicas: wait until one goes or the count grows.
            return Phase::Parked;
        }
        let reconnect = !std::mem::replace(&mut self.first, false);
        let (target, over) = (self.target.clone(), Over::configured(self.settings.transport));
        // Probing a silent server: short tries, every fourth one with the configured timeouts.
        let patience = (!self.unanswered.is_multiple_of(4)).then_some(RESCUE_PATIENCE);
        Phase::Dialing(self.dial_patient(target, over, reconnect, patience))
    }

    fn dialed(&mut self, now: Instant, phase: Phase, id: SessionId, result: Result<SocketAddr, Failure>) -> Phase {
        match phase {
            Phase::Dialing(d) if d.id == id => self.slot_dialed(now, d, result),
            Phase::Connected(mut c) => match c.errand.take() {
                Some(Errand::Dialing { purpose, dial }) if dial.id == id => {
                    self.candidate_dialed(now, c, purpose, dial, result)
                }
                errand => {
                    c.errand = errand;
                    self.unwanted(id, &result);
                    Phase::Connected(c)
                }
            },
            phase => {
                self.unwanted(id, &result);
                phase
            }
        }
    }

    /// A session nobody waits for any more is closed.
    fn unwanted(&mut self, id: SessionId, result: &Result<SocketAddr, Failure>) {
        if result.is_ok() {
            self.retire(id, None, "tunnel session no longer wanted; closing it");
        }
    }

    fn up(&mut self, now: Instant, phase: Phase, id: SessionId) -> Phase {
        let Phase::Connected(mut c) = phase else { return phase };
        if c.live.id == id {
            if !c.live.up {
                c.live.up = true;
                self.report_up(&c.live);
            }
            return Phase::Connected(c);
        }
        match c.errand.take() {
            Some(Errand::Trying { purpose, mut session, deadline }) if session.id == id => {
                session.up = true;
                if let Purpose::Rehome { .. } = purpose {
                    return self.swap(now, c, purpose, session);
                }
                c.errand = Some(Errand::Trying { purpose, session, deadline });
            }
            errand => c.errand = errand,
        }
        Phase::Connected(c)
    }

    /// The live session went quiet (rescue dials start) or showed life again (they stop; one
    /// under way still takes over if it comes up).
    fn quiet(&mut self, now: Instant, phase: Phase, id: SessionId, silent: bool) -> Phase {
        let Phase::Connected(mut c) = phase else { return phase };
        if c.live.id != id || c.live.quiet == silent {
            return Phase::Connected(c);
        }
        c.live.quiet = silent;
        let (target, peer) = (c.live.target.clone(), c.live.peer);
        if silent {
            self.log(Log::Suspect { target, peer });
            self.count(Metric::Suspect);
            c.rescue_at = Some(now);
        } else {
            self.log(Log::AnswersAgain { target, peer });
            c.rescue_at = None;
        }
        Phase::Connected(c)
    }

    /// The seed opened a stream on `id`: the session proved itself.
    fn carried(&mut self, phase: Phase, id: SessionId) -> Phase {
        let Phase::Connected(mut c) = phase else { return phase };
        if c.live.id == id {
            c.live.carried = true;
        } else if let Some(Errand::Trying { session, .. }) = &mut c.errand
            && session.id == id
        {
            session.carried = true;
        }
        Phase::Connected(c)
    }

    fn announced(&mut self, now: Instant, phase: Phase, id: SessionId, info: ServerInfo) -> Phase {
        let Phase::Connected(mut c) = phase else { return phase };
        if c.live.id == id {
            return self.live_announced(now, c, info);
        }
        match c.errand.take() {
            Some(Errand::Trying { purpose: Purpose::Rehome { drain }, mut session, deadline }) if session.id == id => {
                // Judged once it is the live session.
                session.info = Some(info);
                c.errand = Some(Errand::Trying { purpose: Purpose::Rehome { drain }, session, deadline });
            }
            Some(Errand::Trying { purpose, mut session, .. }) if session.id == id => {
                let good = self.slot.replicas.acceptable(self.slot.index, &info);
                session.info = Some(info);
                return self.judged(now, c, purpose, session, good);
            }
            errand => c.errand = errand,
        }
        Phase::Connected(c)
    }

    fn ended(&mut self, now: Instant, phase: Phase, id: SessionId, error: Option<Failure>) -> Phase {
        let Phase::Connected(mut c) = phase else { return phase };
        if c.live.id == id {
            return self.live_ended(now, c, error);
        }
        match c.errand.take() {
            Some(Errand::Trying { purpose, session, .. }) if session.id == id => {
                let why = error.unwrap_or(Failure::Closed);
                self.not_kept(now, c, purpose, &session.target, why)
            }
            errand => {
                c.errand = errand;
                Phase::Connected(c)
            }
        }
    }
}
