//! What a slot's machine holds between events (its phase, the live session, the errand under way, the back-offs) and the small steps every transition shares.

use super::events::{Action, Carrier, Draw, Failure, QueryId, SessionId, Settings, Slot};
use super::notes::{Log, Metric, Note};
use proxy_core::net::backoff::Backoff;
use proxy_core::tunnel::ServerInfo;
use seedgate_config::HostPort;
use seedgate_config::agent::Transport;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Longest wait between attempts to reach one more replica while the ones reached answer:
/// after a duplicate, or while looking for a draining replica's replacement.
const PROBE_MAX: Duration = Duration::from_secs(5);

/// Longest a rescue dial may take: a path that answers completes a handshake (a few round trips)
/// well within it, and a silent one is tried again soon.
pub(super) const RESCUE_PATIENCE: Duration = Duration::from_secs(1);

/// Wait between one rescue dial's failure and the next: from half of this to all of it.
pub(super) const RESCUE_PACE: Duration = Duration::from_millis(500);

/// How one dial goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Over {
    /// `after_quic`: `auto`'s fallback, QUIC did not get through.
    H2 { after_quic: bool },
    /// `else_h2`: under `auto`, h2 is dialled when this fails.
    Quic { else_h2: bool },
}

impl Over {
    pub(super) fn configured(t: Transport) -> Self {
        match t {
            Transport::H2 => Over::H2 { after_quic: false },
            Transport::Quic => Over::Quic { else_h2: false },
            Transport::Auto => Over::Quic { else_h2: true },
        }
    }

    fn carrier(self) -> Carrier {
        match self {
            Over::H2 { .. } => Carrier::H2,
            Over::Quic { .. } => Carrier::Quic,
        }
    }
}

/// Everything the transitions read and write besides the phase.
pub(super) struct Cx {
    pub(super) slot: Slot,
    pub(super) settings: Settings,
    pub(super) draw: Draw,
    /// Reconnects after a failure or a session's end.
    pub(super) backoff: Backoff,
    /// Retries after reaching a replica already held (or a draining one): the server answered,
    /// so this is not a failure to back off from for long; a replica that just came up should
    /// be found within seconds.
    pub(super) probe: Backoff,
    /// Where the slot's next dial goes: the configured name, or where a move sent it.
    pub(super) target: HostPort,
    /// No dial was made yet (the first one is not a reconnect).
    pub(super) first: bool,
    /// Dials in a row that nothing answered: the slot probes (see [`Cx::probe_silent`]).
    pub(super) unanswered: u32,
    next_id: u64,
    /// The newest move notice not acted on yet (the slot was busy, or had no session).
    pub(super) queued: Option<Notice>,
    out: Vec<Action>,
    notes: Vec<Note>,
}

pub(super) enum Phase {
    /// No session; at this time the slot dials again (or parks).
    Waiting(Instant),
    /// No session, and the replicas need none from this slot: it waits for a change.
    Parked,
    /// Dialing the slot's session.
    Dialing(Dial),
    Connected(Box<Connected>),
    Stopped,
}

pub(super) struct Dial {
    pub(super) id: SessionId,
    pub(super) target: HostPort,
    pub(super) over: Over,
    /// Not the slot's first attempt: its outcome counts as a reconnect.
    pub(super) reconnect: bool,
    /// Bounds the dial (a rescue), and its fallback to h2 under `auto`.
    pub(super) patience: Option<Duration>,
}

pub(super) struct Session {
    pub(super) id: SessionId,
    pub(super) target: HostPort,
    pub(super) peer: SocketAddr,
    pub(super) over: Carrier,
    pub(super) since: Instant,
    pub(super) reconnect: bool,
    pub(super) up: bool,
    pub(super) info: Option<ServerInfo>,
    /// Its keepalive is unanswered now.
    pub(super) quiet: bool,
    /// The seed opened a stream on it: it proved itself.
    pub(super) carried: bool,
}

pub(super) struct Connected {
    pub(super) live: Session,
    /// At most one errand at a time; the timers below wait while one runs.
    pub(super) errand: Option<Errand>,
    /// While the live session's replica drains: the next look for a replacement.
    pub(super) replace_at: Option<Instant>,
    /// `auto`, while the live session runs over h2: the next try to move it to QUIC.
    pub(super) upgrade_at: Option<Instant>,
    /// The live session's target is a name: when to check that it still includes the peer.
    pub(super) follow_at: Option<Instant>,
    /// While the live session is quiet: the next rescue dial.
    pub(super) rescue_at: Option<Instant>,
}

pub(super) enum Errand {
    /// Checking where `why` points before moving there.
    Resolving { query: QueryId, why: Why },
    /// A session to take the live one's place is being dialled.
    Dialing { purpose: Purpose, dial: Dial },
    /// ... is running; it takes over when `purpose` says so, or is closed at `deadline`.
    Trying { purpose: Purpose, session: Session, deadline: Instant },
}

pub(super) enum Why {
    Move(Notice),
    /// The live session's target name, resolved again.
    Follow,
}

/// A move notice: where to go, and how long the old session's streams may run.
pub(super) struct Notice {
    pub(super) next: HostPort,
    pub(super) drain: Option<Duration>,
}

#[derive(Debug, Clone, Copy)]
pub(super) enum Purpose {
    /// A move notice, or the name resolving elsewhere: takes over once up.
    Rehome { drain: Option<Duration> },
    /// The live replica drains: takes over once its replica proves to be neither held by
    /// another slot nor draining (a server that announces nothing: once up, at the deadline).
    Replace,
    /// `auto` on h2: the same place over QUIC, judged as a replacement.
    Upgrade,
    /// The live session is quiet: the same place again, judged as a replacement.
    Rescue,
}

/// Which back-off the wait after losing the live session comes from.
pub(super) enum Wait {
    Backoff,
    Probe,
}

pub(super) fn due(at: Option<Instant>, now: Instant) -> bool {
    at.is_some_and(|at| at <= now)
}

impl Phase {
    /// When the machine wants a timer event next (none: only other events move it on).
    pub(super) fn timeout(&self) -> Option<Instant> {
        match self {
            Phase::Waiting(at) => Some(*at),
            Phase::Connected(c) => match &c.errand {
                Some(Errand::Trying { deadline, .. }) => Some(*deadline),
                Some(_) => None,
                // No move to QUIC while a replacement is looked for.
                None => [c.rescue_at, c.replace_at, c.upgrade_at.filter(|_| c.replace_at.is_none()), c.follow_at]
                    .into_iter()
                    .flatten()
                    .min(),
            },
            Phase::Parked | Phase::Dialing(_) | Phase::Stopped => None,
        }
    }
}

impl Connected {
    pub(super) fn new(live: Session, now: Instant, reresolve: Duration) -> Box<Self> {
        let follow_at = live.target.socket_addr().is_none().then(|| now + reresolve);
        Box::new(Self { live, errand: None, replace_at: None, upgrade_at: None, follow_at, rescue_at: None })
    }

    pub(super) fn draining(&self) -> bool {
        self.live.info.as_ref().is_some_and(|i| i.draining)
    }
}

/// The context's life: made with the slot, reconfigured on reload, emptied after each step.
impl Cx {
    /// The slot has no session yet: its gauge says so from the first step.
    pub(super) fn new(slot: Slot, settings: Settings, draw: Draw) -> Self {
        Self {
            backoff: Backoff::new(settings.reconnect_initial, settings.reconnect_max),
            probe: Backoff::new(settings.reconnect_initial, settings.reconnect_max.min(PROBE_MAX)),
            target: slot.configured.clone(),
            slot,
            settings,
            draw,
            first: true,
            unanswered: 0,
            next_id: 0,
            queued: None,
            out: Vec::new(),
            notes: vec![Note::Metric(Metric::Down)],
        }
    }

    /// Take the config in force (a reload changes bounds and the transport for what comes next).
    pub(super) fn configure(&mut self, s: Settings) {
        if s != self.settings {
            self.backoff.set_bounds(s.reconnect_initial, s.reconnect_max);
            self.probe.set_bounds(s.reconnect_initial, s.reconnect_max.min(PROBE_MAX));
            self.settings = s;
        }
    }

    /// What the step decided: its notes, then its actions.
    pub(super) fn output(&mut self) -> (Vec<Note>, Vec<Action>) {
        (std::mem::take(&mut self.notes), std::mem::take(&mut self.out))
    }
}

/// Small steps shared by the transitions.
impl Cx {
    pub(super) fn log(&mut self, log: Log) {
        self.notes.push(Note::Log(log));
    }

    pub(super) fn count(&mut self, metric: Metric) {
        self.notes.push(Note::Metric(metric));
    }

    pub(super) fn dial(&mut self, target: HostPort, over: Over, reconnect: bool) -> Dial {
        self.dial_patient(target, over, reconnect, None)
    }

    /// A reconnect dial bounded by `patience`.
    pub(super) fn dial_within(&mut self, target: HostPort, over: Over, patience: Duration) -> Dial {
        self.dial_patient(target, over, true, Some(patience))
    }

    pub(super) fn dial_patient(
        &mut self,
        target: HostPort,
        over: Over,
        reconnect: bool,
        patience: Option<Duration>,
    ) -> Dial {
        let id = SessionId(self.next_id);
        self.next_id += 1;
        self.out.push(Action::Dial { id, target: target.clone(), over: over.carrier(), patience });
        Dial { id, target, over, reconnect, patience }
    }

    pub(super) fn start(&mut self, c: &mut Connected, purpose: Purpose, target: HostPort, over: Over) {
        c.errand = Some(Errand::Dialing { purpose, dial: self.dial(target, over, true) });
    }

    pub(super) fn resolve(&mut self, c: &mut Connected, name: HostPort, why: Why) {
        let query = QueryId(self.next_id);
        self.next_id += 1;
        self.out.push(Action::Resolve { query, name });
        c.errand = Some(Errand::Resolving { query, why });
    }

    pub(super) fn retire(&mut self, id: SessionId, drain: Option<Duration>, why: &'static str) {
        self.retire_open(id, drain, false, why);
    }

    /// As [`Cx::retire`]; with `open`, GOAWAY waits for the end of `drain`.
    pub(super) fn retire_open(&mut self, id: SessionId, drain: Option<Duration>, open: bool, why: &'static str) {
        self.out.push(Action::Retire { id, drain, open, why });
    }

    pub(super) fn session(d: Dial, peer: SocketAddr, now: Instant) -> Session {
        let over = d.over.carrier();
        let (id, target, reconnect) = (d.id, d.target, d.reconnect);
        Session { id, target, peer, over, since: now, reconnect, up: false, info: None, quiet: false, carried: false }
    }

    pub(super) fn backoff_wait(&mut self) -> Duration {
        let draw = (self.draw)();
        self.backoff.next_wait_drawn(draw)
    }

    pub(super) fn probe_wait(&mut self) -> Duration {
        let draw = (self.draw)();
        self.probe.next_wait_drawn(draw)
    }

    /// The next rescue (or probe of a silent server) after a failed one: from half of
    /// [`RESCUE_PACE`] to all of it.
    pub(super) fn rescue_pace(&mut self) -> Duration {
        let draw = (self.draw)().clamp(0.0, 1.0);
        RESCUE_PACE.mul_f64(0.5 + 0.5 * draw)
    }

    /// Nothing answered the dial: the next one follows at the rescue pace (the back-off stands),
    /// so that a path that heals is used within about a second. Bounded by the tries themselves:
    /// each waits its patience for an answer that costs the server nothing when it never comes.
    pub(super) fn probe_silent(&mut self) -> Duration {
        self.unanswered = self.unanswered.saturating_add(1);
        self.rescue_pace()
    }

    /// The slot's session is gone (ended, or given up as a duplicate).
    pub(super) fn lost(&mut self, detail: &str) {
        self.slot.replicas.down(self.slot.index, detail);
        self.count(Metric::Down);
    }

    pub(super) fn report_up(&mut self, s: &Session) {
        let (target, peer, over) = (s.target.clone(), s.peer, s.over);
        let detail = format!("session up to {target} ({peer}) over {}", over.as_str());
        self.log(Log::Up { target, peer, over });
        self.slot.replicas.up(self.slot.index, &detail);
        self.count(Metric::Up(over));
        if s.reconnect {
            self.count(Metric::Reconnect { ok: true });
        }
    }

    /// `auto`: QUIC did not get through, so the same place is dialled over h2.
    pub(super) fn fallback(&mut self, d: &Dial, error: &Failure) -> Option<Dial> {
        if d.over != (Over::Quic { else_h2: true }) {
            return None;
        }
        self.log(Log::FallBack { target: d.target.clone(), error: error.clone() });
        Some(self.dial_patient(d.target.clone(), Over::H2 { after_quic: true }, d.reconnect, d.patience))
    }

    /// A dial made it: count `auto`'s fallback once it got through over h2.
    pub(super) fn fell_back(&mut self, d: &Dial) {
        if d.over == (Over::H2 { after_quic: true }) {
            self.count(Metric::TransportChange { from: Carrier::Quic, to: Carrier::H2 });
        }
    }
}
