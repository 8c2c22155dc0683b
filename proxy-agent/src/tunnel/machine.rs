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
//! drain deadline. The errands' transitions are in [`errands`].
//!
//! A live session whose keepalive goes unanswered for the suspect time is quiet: the slot dials
//! the same place again beside it (a rescue), each try bounded by [`state::RESCUE_PATIENCE`] and the
//! next one [`state::RESCUE_PACE`] (jittered) after, so that a healed path is used within about a
//! second; the first that comes up takes over, and the quiet session's open streams go on there
//! until they end or its keepalive timeout does. Its next sign of life stops the tries. Without a
//! session, a server that does not answer at all ([`events::Failure::Unanswered`]) is probed the same
//! way — every fourth try with the full dial timeout, for a path slower than the patience — and
//! the back-off is kept for servers that refuse or fail.
//!
//! The machine counts and logs nothing itself: each step returns, besides its [`Action`]s, the
//! [`Note`]s its driver turns into the slot's metrics and log lines (in [`notes`]), and the
//! failures it reasons about are its own ([`events::Failure`]), which the driver builds from what it saw.
//!
//! By file: [`events`] (what goes in and out), [`state`] (what the machine holds, the steps all
//! transitions share), [`dispatch`] (where an event goes, what time starts), [`live`] (the slot's
//! own dial and live session), [`errands`].

mod dispatch;
mod errands;
pub(super) mod events;
mod live;
pub(super) mod notes;
mod state;

use events::{Action, Draw, Event, Settings, Slot};
use notes::Note;
use state::{Cx, Phase};
use std::time::Instant;

/// One step's output: the notes to count and log first, then the actions to perform, each in order.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Step {
    pub notes: Vec<Note>,
    pub actions: Vec<Action>,
}

pub(super) struct Machine {
    cx: Cx,
    phase: Phase,
}

impl Machine {
    /// A slot that dials at `now` (if the replicas want a session from it). Its first step
    /// notes that it has no session yet.
    pub(super) fn new(now: Instant, slot: Slot, settings: Settings, draw: Draw) -> Self {
        Self { cx: Cx::new(slot, settings, draw), phase: Phase::Waiting(now) }
    }

    /// Take the config in force (a reload changes bounds and the transport for what comes next).
    pub(super) fn configure(&mut self, s: Settings) {
        self.cx.configure(s);
    }

    /// Act on `event` at `now`; returns what the driver must note and do, in order.
    pub(super) fn handle(&mut self, now: Instant, event: Event) -> Step {
        let phase = std::mem::replace(&mut self.phase, Phase::Stopped);
        self.phase = match (phase, event) {
            (Phase::Stopped, _) | (_, Event::Stop) => Phase::Stopped,
            (phase, event) => {
                let phase = self.cx.on(now, phase, event);
                self.cx.tend(now, phase)
            }
        };
        let (notes, actions) = self.cx.output();
        Step { notes, actions }
    }

    /// What the slot is doing, as the status page names it, and when it dials again while it
    /// waits: `backoff` (until then), `parked` (the replicas need no session from it),
    /// `connecting`, `connected`, `suspect` (connected, its keepalive unanswered: a rescue is
    /// dialled beside it), `stopped`.
    pub(super) fn phase(&self) -> (&'static str, Option<Instant>) {
        match &self.phase {
            Phase::Waiting(at) => ("backoff", Some(*at)),
            Phase::Parked => ("parked", None),
            Phase::Dialing(_) => ("connecting", None),
            Phase::Connected(c) if c.live.quiet => ("suspect", None),
            Phase::Connected(_) => ("connected", None),
            Phase::Stopped => ("stopped", None),
        }
    }

    /// When the machine wants [`Event::Timer`] next (none: only other events move it on).
    pub(super) fn poll_timeout(&self) -> Option<Instant> {
        self.phase.timeout()
    }
}

#[cfg(test)]
mod tests;
