//! One slot's session logic as a sans-IO state machine: events and the time in, actions out (no I/O, no timers, no tasks).
//!
//! A slot keeps one session to one replica behind a configured server name. Its driver performs
//! the [`Action`]s (dial a session, resolve a name, retire a session), feeds back what came of
//! them and what the sessions report as [`Event`]s, each with the time, and wakes the machine at
//! [`Machine::poll_timeout`]. What the slot decides is decided here: back-off, make-before-break,
//! replacing a draining replica, closing duplicates, re-homing after a move notice or when the
//! name resolves elsewhere, and `auto`'s fallback to h2 and its moves back to QUIC.
//!
//! At most two of the slot's sessions are not retired at any time: the live one, and the one an
//! errand (a re-home, a replacement, a move to QUIC) dialled to take its place. The new session
//! takes over only once it is up (and, for a replacement, once its replica is known to be a good
//! one); only then is the old one retired: GOAWAY, and its streams run to their end or to the
//! drain deadline. The errands' transitions are in [`errands`]; a failed dial comes in typed
//! ([`EstablishError`]), as the driver got it.
//!
//! A live session whose keepalive goes unanswered for the suspect time is quiet: the slot dials
//! the same place again beside it (a rescue), each try bounded by [`RESCUE_PATIENCE`] and the
//! next one [`RESCUE_PACE`] (jittered) after, so that a healed path is used within about a
//! second; the first that comes up takes over, and the quiet session's open streams go on there
//! until they end or its keepalive timeout does. Its next sign of life stops the tries. Without a
//! session, a server that does not answer at all ([`EstablishError::silent`]) is probed the same
//! way — every fourth try with the full dial timeout, for a path slower than the patience — and
//! the back-off is kept for servers that refuse or fail.

use super::establish::EstablishError;
use super::metrics::SlotMetrics;
use crate::replicas::{Replicas, Verdict};
use proxy_core::net::backoff::Backoff;
use proxy_core::tunnel::ServerInfo;
use seedgate_config::HostPort;
use seedgate_config::agent::{Transport, Tunnel as TunnelCfg};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest wait between attempts to reach one more replica while the ones reached answer:
/// after a duplicate, or while looking for a draining replica's replacement.
const PROBE_MAX: Duration = Duration::from_secs(5);

/// Longest a rescue dial may take: a path that answers completes a handshake (a few round trips)
/// well within it, and a silent one is tried again soon.
pub(super) const RESCUE_PATIENCE: Duration = Duration::from_secs(1);

/// Wait between one rescue dial's failure and the next: from half of this to all of it.
const RESCUE_PACE: Duration = Duration::from_millis(500);

/// A session the machine asked for; never reused within a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SessionId(u64);

/// A name resolution the machine asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct QueryId(u64);

/// What a session runs over (`auto` is a choice between these, made per dial).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Carrier {
    H2,
    Quic,
}

impl Carrier {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Carrier::H2 => "h2",
            Carrier::Quic => "quic",
        }
    }
}

/// How one dial goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Over {
    /// `after_quic`: `auto`'s fallback, QUIC did not get through.
    H2 { after_quic: bool },
    /// `else_h2`: under `auto`, h2 is dialled when this fails.
    Quic { else_h2: bool },
}

impl Over {
    fn configured(t: Transport) -> Self {
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

/// The part of the tunnel config the slot acts on; the driver hands it over again before every
/// event, so a reload applies to the next decision.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Settings {
    pub transport: Transport,
    pub reconnect_initial: Duration,
    pub reconnect_max: Duration,
    /// How long a replacement (or a move target) may take to come up and announce itself.
    pub dial_timeout: Duration,
    pub rehome_drain: Duration,
    pub quic_probe_interval: Duration,
    /// How often the name of the live session's target is resolved again (to follow DNS).
    pub reresolve: Duration,
}

impl From<&TunnelCfg> for Settings {
    fn from(c: &TunnelCfg) -> Self {
        Self {
            transport: c.transport,
            reconnect_initial: c.reconnect.initial.get(),
            reconnect_max: c.reconnect.max.get(),
            dial_timeout: c.dial_timeout.get(),
            rehome_drain: c.rehome_drain.get(),
            quic_probe_interval: c.quic_probe_interval.get(),
            reresolve: c.keepalive.interval.get(),
        }
    }
}

/// What happened, as the driver tells it.
#[derive(Debug)]
pub(super) enum Event {
    /// A dial finished: the session runs (not up yet) with the peer it reached, or why it failed.
    Dialed { id: SessionId, result: Result<SocketAddr, EstablishError> },
    /// The session passed its handshake (the seed spoke the transport's protocol).
    Up(SessionId),
    /// The session's keepalive went unanswered for the suspect time (`silent`), or it showed
    /// life again.
    Quiet { id: SessionId, silent: bool },
    /// The seed opened a stream on the session (the first one is reported).
    Carried(SessionId),
    /// The session's replica announced itself (first time, or a change such as draining).
    Announced(SessionId, ServerInfo),
    /// The session ended (`error`: why, if it did not end cleanly).
    Ended { id: SessionId, error: Option<String> },
    /// A server (on any of the slot's sessions) asked the agent to move.
    Move { to: Vec<String>, drain_deadline_ms: u64 },
    /// A resolution finished (`None`: it failed or timed out).
    Resolved { query: QueryId, addrs: Option<Vec<SocketAddr>> },
    /// The time of [`Machine::poll_timeout`] came.
    Timer,
    /// The replica set changed: the slot may be wanted (or not) now.
    Wanted,
    /// The slot ends; its sessions get GOAWAY from their own stop tokens.
    Stop,
}

/// What the driver does.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Action {
    /// Establish a session to `target` (resolved afresh) over `over`, within `patience` (`None`:
    /// the configured timeouts); answer with [`Event::Dialed`].
    Dial { id: SessionId, target: HostPort, over: Carrier, patience: Option<Duration> },
    /// Resolve `name`; answer with [`Event::Resolved`].
    Resolve { query: QueryId, name: HostPort },
    /// GOAWAY on the session now (with `open`: only once `drain` is over, so the server it
    /// leaves can still open streams until then); end its streams after `drain` (`None`: when
    /// the server ends them), then close it. `why` is logged.
    Retire { id: SessionId, drain: Option<Duration>, open: bool, why: &'static str },
}

/// Who the slot is, for its whole life.
pub(super) struct Slot {
    pub index: usize,
    /// The name in logs and metrics (`name`, `name#1`, ...).
    pub label: String,
    pub configured: HostPort,
    pub replicas: Arc<Replicas>,
    pub metrics: SlotMetrics,
}

/// The random draw (`0.0..=1.0`) behind every jittered wait; injected so tests are deterministic.
pub(super) type Draw = Box<dyn FnMut() -> f64 + Send>;

pub(super) struct Machine {
    cx: Cx,
    phase: Phase,
}

/// Everything the transitions read and write besides the phase.
struct Cx {
    slot: Slot,
    settings: Settings,
    draw: Draw,
    /// Reconnects after a failure or a session's end.
    backoff: Backoff,
    /// Retries after reaching a replica already held (or a draining one): the server answered,
    /// so this is not a failure to back off from for long; a replica that just came up should
    /// be found within seconds.
    probe: Backoff,
    /// Where the slot's next dial goes: the configured name, or where a move sent it.
    target: HostPort,
    /// No dial was made yet (the first one is not a reconnect).
    first: bool,
    /// Dials in a row that nothing answered: the slot probes (see [`Cx::probe_silent`]).
    unanswered: u32,
    next_id: u64,
    /// The newest move notice not acted on yet (the slot was busy, or had no session).
    queued: Option<Notice>,
    out: Vec<Action>,
}

enum Phase {
    /// No session; at this time the slot dials again (or parks).
    Waiting(Instant),
    /// No session, and the replicas need none from this slot: it waits for a change.
    Parked,
    /// Dialing the slot's session.
    Dialing(Dial),
    Connected(Box<Connected>),
    Stopped,
}

struct Dial {
    id: SessionId,
    target: HostPort,
    over: Over,
    /// Not the slot's first attempt: its outcome counts as a reconnect.
    reconnect: bool,
    /// Bounds the dial (a rescue), and its fallback to h2 under `auto`.
    patience: Option<Duration>,
}

struct Session {
    id: SessionId,
    target: HostPort,
    peer: SocketAddr,
    over: Carrier,
    since: Instant,
    reconnect: bool,
    up: bool,
    info: Option<ServerInfo>,
    /// Its keepalive is unanswered now.
    quiet: bool,
    /// The seed opened a stream on it: it proved itself.
    carried: bool,
}

struct Connected {
    live: Session,
    /// At most one errand at a time; the timers below wait while one runs.
    errand: Option<Errand>,
    /// While the live session's replica drains: the next look for a replacement.
    replace_at: Option<Instant>,
    /// `auto`, while the live session runs over h2: the next try to move it to QUIC.
    upgrade_at: Option<Instant>,
    /// The live session's target is a name: when to check that it still includes the peer.
    follow_at: Option<Instant>,
    /// While the live session is quiet: the next rescue dial.
    rescue_at: Option<Instant>,
}

enum Errand {
    /// Checking where `why` points before moving there.
    Resolving { query: QueryId, why: Why },
    /// A session to take the live one's place is being dialled.
    Dialing { purpose: Purpose, dial: Dial },
    /// ... is running; it takes over when `purpose` says so, or is closed at `deadline`.
    Trying { purpose: Purpose, session: Session, deadline: Instant },
}

enum Why {
    Move(Notice),
    /// The live session's target name, resolved again.
    Follow,
}

/// A move notice: where to go, and how long the old session's streams may run.
struct Notice {
    next: HostPort,
    drain: Option<Duration>,
}

#[derive(Debug, Clone, Copy)]
enum Purpose {
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
enum Wait {
    Backoff,
    Probe,
}

impl Machine {
    /// A slot that dials at `now` (if the replicas want a session from it).
    pub(super) fn new(now: Instant, slot: Slot, settings: Settings, draw: Draw) -> Self {
        slot.metrics.down();
        let cx = Cx {
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
        };
        Self { cx, phase: Phase::Waiting(now) }
    }

    /// Take the config in force (a reload changes bounds and the transport for what comes next).
    pub(super) fn configure(&mut self, s: Settings) {
        if s != self.cx.settings {
            self.cx.backoff.set_bounds(s.reconnect_initial, s.reconnect_max);
            self.cx.probe.set_bounds(s.reconnect_initial, s.reconnect_max.min(PROBE_MAX));
            self.cx.settings = s;
        }
    }

    /// Act on `event` at `now`; returns what the driver must do, in order.
    pub(super) fn handle(&mut self, now: Instant, event: Event) -> Vec<Action> {
        let phase = std::mem::replace(&mut self.phase, Phase::Stopped);
        self.phase = match (phase, event) {
            (Phase::Stopped, _) | (_, Event::Stop) => Phase::Stopped,
            (phase, event) => {
                let phase = self.cx.on(now, phase, event);
                self.cx.tend(now, phase)
            }
        };
        std::mem::take(&mut self.cx.out)
    }

    /// What the slot is doing, as the status page names it, and when it dials again while it
    /// waits: `backoff` (until then), `parked` (the replicas need no session from it),
    /// `connecting`, `connected`, `stopped`.
    pub(super) fn phase(&self) -> (&'static str, Option<Instant>) {
        match &self.phase {
            Phase::Waiting(at) => ("backoff", Some(*at)),
            Phase::Parked => ("parked", None),
            Phase::Dialing(_) => ("connecting", None),
            Phase::Connected(_) => ("connected", None),
            Phase::Stopped => ("stopped", None),
        }
    }

    /// When the machine wants [`Event::Timer`] next (none: only other events move it on).
    pub(super) fn poll_timeout(&self) -> Option<Instant> {
        match &self.phase {
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

fn due(at: Option<Instant>, now: Instant) -> bool {
    at.is_some_and(|at| at <= now)
}

impl Connected {
    fn new(live: Session, now: Instant, reresolve: Duration) -> Box<Self> {
        let follow_at = live.target.socket_addr().is_none().then(|| now + reresolve);
        Box::new(Self { live, errand: None, replace_at: None, upgrade_at: None, follow_at, rescue_at: None })
    }

    fn draining(&self) -> bool {
        self.live.info.as_ref().is_some_and(|i| i.draining)
    }
}

/// Event dispatch, and what the passing of time starts.
impl Cx {
    fn on(&mut self, now: Instant, phase: Phase, event: Event) -> Phase {
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
    fn tend(&mut self, now: Instant, phase: Phase) -> Phase {
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

    /// With no errand running: a rescue of a quiet session, the newest move notice, then a
    /// replacement for a draining replica, then a move to QUIC, then following DNS.
    fn errands(&mut self, now: Instant, c: &mut Connected) {
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

    fn queue_move(&mut self, to: &[String], drain_deadline_ms: u64) {
        let next = to.iter().find_map(|s| s.parse::<HostPort>().ok()).unwrap_or_else(|| self.slot.configured.clone());
        let drain = (drain_deadline_ms > 0).then(|| Duration::from_millis(drain_deadline_ms));
        self.slot.metrics.moved();
        self.queued = Some(Notice { next, drain });
    }
}

/// Small steps shared by the transitions.
impl Cx {
    fn dial(&mut self, target: HostPort, over: Over, reconnect: bool) -> Dial {
        self.dial_patient(target, over, reconnect, None)
    }

    /// A reconnect dial bounded by `patience`.
    fn dial_within(&mut self, target: HostPort, over: Over, patience: Duration) -> Dial {
        self.dial_patient(target, over, true, Some(patience))
    }

    fn dial_patient(&mut self, target: HostPort, over: Over, reconnect: bool, patience: Option<Duration>) -> Dial {
        let id = SessionId(self.next_id);
        self.next_id += 1;
        self.out.push(Action::Dial { id, target: target.clone(), over: over.carrier(), patience });
        Dial { id, target, over, reconnect, patience }
    }

    fn start(&mut self, c: &mut Connected, purpose: Purpose, target: HostPort, over: Over) {
        c.errand = Some(Errand::Dialing { purpose, dial: self.dial(target, over, true) });
    }

    fn resolve(&mut self, c: &mut Connected, name: HostPort, why: Why) {
        let query = QueryId(self.next_id);
        self.next_id += 1;
        self.out.push(Action::Resolve { query, name });
        c.errand = Some(Errand::Resolving { query, why });
    }

    fn retire(&mut self, id: SessionId, drain: Option<Duration>, why: &'static str) {
        self.out.push(Action::Retire { id, drain, open: false, why });
    }

    fn session(d: Dial, peer: SocketAddr, now: Instant) -> Session {
        let over = d.over.carrier();
        let (id, target, reconnect) = (d.id, d.target, d.reconnect);
        Session { id, target, peer, over, since: now, reconnect, up: false, info: None, quiet: false, carried: false }
    }

    fn backoff_wait(&mut self) -> Duration {
        let draw = (self.draw)();
        self.backoff.next_wait_drawn(draw)
    }

    fn probe_wait(&mut self) -> Duration {
        let draw = (self.draw)();
        self.probe.next_wait_drawn(draw)
    }

    /// The slot's session is gone (ended, or given up as a duplicate).
    fn lost(&self, detail: &str) {
        self.slot.replicas.down(self.slot.index, detail);
        self.slot.metrics.down();
    }

    fn report_up(&mut self, s: &Session) {
        let (server, target, peer, transport) = (&self.slot.label, &s.target, s.peer, s.over.as_str());
        tracing::info!(%server, %target, %peer, transport, "tunnel session up");
        self.slot.replicas.up(self.slot.index, &format!("session up to {target} ({peer}) over {transport}"));
        self.slot.metrics.up(s.over);
        if s.reconnect {
            self.slot.metrics.reconnect(true);
        }
    }

    /// `auto`: QUIC did not get through, so the same place is dialled over h2.
    fn fallback(&mut self, d: &Dial, error: &EstablishError) -> Option<Dial> {
        if d.over != (Over::Quic { else_h2: true }) {
            return None;
        }
        let (server, target) = (&self.slot.label, &d.target);
        tracing::info!(%server, %target, %error, "transport auto: QUIC did not get through; using h2");
        Some(self.dial_patient(d.target.clone(), Over::H2 { after_quic: true }, d.reconnect, d.patience))
    }

    /// A dial made it: count `auto`'s fallback once it got through over h2.
    fn fell_back(&self, d: &Dial) {
        if d.over == (Over::H2 { after_quic: true }) {
            self.slot.metrics.transport_change(Carrier::Quic, Carrier::H2);
        }
    }
}

/// The slot's own dial and its live session.
impl Cx {
    fn dialed(
        &mut self,
        now: Instant,
        phase: Phase,
        id: SessionId,
        result: Result<SocketAddr, EstablishError>,
    ) -> Phase {
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
    fn unwanted(&mut self, id: SessionId, result: &Result<SocketAddr, EstablishError>) {
        if result.is_ok() {
            self.retire(id, None, "tunnel session no longer wanted; closing it");
        }
    }

    fn slot_dialed(&mut self, now: Instant, d: Dial, result: Result<SocketAddr, EstablishError>) -> Phase {
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
        let (server, target) = (&self.slot.label, &d.target);
        if !e.silent() || self.unanswered == 0 {
            tracing::warn!(%server, %target, error = %e, "tunnel session failed");
        } else {
            tracing::debug!(%server, %target, error = %e, tries = self.unanswered, "tunnel session failed: still no answer");
        }
        self.lost(&format!("not connected: {e}"));
        if d.reconnect {
            self.slot.metrics.reconnect(false);
        }
        // A move target that does not answer is not kept: fall back to the name.
        self.target = self.slot.configured.clone();
        if e.silent() {
            return Phase::Waiting(now + self.probe_silent());
        }
        self.unanswered = 0;
        Phase::Waiting(now + self.backoff_wait())
    }

    /// Nothing answered the dial: the next one follows at the rescue pace (the back-off stands),
    /// so that a path that heals is used within about a second. Bounded by the tries themselves:
    /// each waits its patience for an answer that costs the server nothing when it never comes.
    fn probe_silent(&mut self) -> Duration {
        self.unanswered = self.unanswered.saturating_add(1);
        RESCUE_PACE.mul_f64(0.5 + 0.5 * (self.draw)().clamp(0.0, 1.0))
    }

    /// `live` is the slot's session now: report it if up, and act on its announcement.
    fn adopt(&mut self, now: Instant, mut live: Session) -> Phase {
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
        let (server, target, peer) = (&self.slot.label, &c.live.target, c.live.peer);
        if silent {
            tracing::warn!(%server, %target, %peer, "tunnel session suspect: its keepalive went unanswered (the path is quiet); dialing a replacement beside it, its open streams wait for the path");
            self.slot.metrics.suspect();
            c.rescue_at = Some(now);
        } else {
            tracing::info!(%server, %target, %peer, "suspect tunnel session answers again");
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

    fn live_announced(&mut self, now: Instant, mut c: Box<Connected>, info: ServerInfo) -> Phase {
        if c.live.info.as_ref() == Some(&info) {
            return Phase::Connected(c);
        }
        let server = &self.slot.label;
        if self.slot.replicas.announced(self.slot.index, &info) == Verdict::Duplicate {
            tracing::info!(%server, id = %info.id, "session reached a replica another session holds; closing it and dialing again");
            self.slot.metrics.duplicate();
            // No deadline, as for a candidate: streams the seed opened on it run to their end.
            self.retire(c.live.id, None, "closing the duplicate session");
            // Dial the same place again (a move target stays the target: behind it is the
            // replica set the slot was sent to); a failed connect falls back to the name.
            self.lost("closed a duplicate session; dialing again");
            return self.gone(now, c, Wait::Probe);
        }
        tracing::info!(%server, id = %info.id, count = info.count, draining = info.draining, "server replica announced");
        self.probe.reset();
        if !info.draining {
            c.replace_at = None;
        } else if c.replace_at.is_none() {
            let target = &c.live.target;
            tracing::info!(%server, %target, "replica is draining: keeping its live streams, looking for a replacement");
            c.replace_at = Some(now);
        }
        c.live.info = Some(info);
        Phase::Connected(c)
    }

    fn ended(&mut self, now: Instant, phase: Phase, id: SessionId, error: Option<String>) -> Phase {
        let Phase::Connected(mut c) = phase else { return phase };
        if c.live.id == id {
            return self.live_ended(now, c, error);
        }
        match c.errand.take() {
            Some(Errand::Trying { purpose, session, .. }) if session.id == id => {
                let why = error.unwrap_or_else(|| "the session closed".into());
                self.not_kept(now, c, purpose, &session.target, &why)
            }
            errand => {
                c.errand = errand;
                Phase::Connected(c)
            }
        }
    }

    fn live_ended(&mut self, now: Instant, c: Box<Connected>, error: Option<String>) -> Phase {
        let (server, was_up) = (&self.slot.label, c.live.up);
        match &error {
            None => tracing::info!(%server, "tunnel session closed"),
            // TLS passed on our side but the seed never spoke the transport's protocol:
            // typically it refused our certificate (its verdict comes after our handshake).
            Some(e) if !was_up => {
                tracing::warn!(%server, error = %e, "tunnel session failed before it was up (is this agent's certificate accepted by the server?)")
            }
            Some(e) => tracing::warn!(%server, error = %e, "tunnel session ended"),
        }
        self.lost("not connected");
        if !was_up && c.live.reconnect {
            self.slot.metrics.reconnect(false);
        }
        // Only a session that proved itself — it lived at least `reconnect.max`, or carried a
        // stream — resets the back-off: the next failure is fresh. One that came up and ended
        // sooner does not, so a server (or a middlebox) that accepts sessions and closes them at
        // once is redialled at a growing interval, not every `reconnect.initial`.
        if c.live.carried || now.saturating_duration_since(c.live.since) >= self.settings.reconnect_max {
            self.backoff.reset();
        } else if was_up {
            tracing::info!(server = %self.slot.label, lived = ?now.saturating_duration_since(c.live.since), "tunnel session ended before it proved itself (lived tunnel.reconnect.max or carried a stream): backing off");
            self.slot.metrics.storm_avoided();
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
}

mod errands;

#[cfg(test)]
mod tests;
