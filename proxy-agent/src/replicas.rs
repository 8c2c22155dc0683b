//! The proxy-server replicas behind one configured server name: the count they announce, which replica each of the agent's sessions reached, and whether another session is needed.
//!
//! Every configured name has slots, each holding at most one session. Behind a load-balanced
//! name a new session lands on any replica; the replica announces its id, and a session to an
//! id another slot already holds is a duplicate (closed, and dialled again after a jittered
//! back-off). A slot dials only while fewer sessions than the announced count are up and not
//! draining, so the agent converges on one session per replica and stops there.

use proxy_core::prometheus::IntGauge;
use proxy_core::sync::Mutex;
use proxy_core::tunnel::ServerInfo;
use tokio::sync::watch;

/// What one slot holds now.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Slot {
    /// The session passed its HTTP/2 handshake.
    pub up: bool,
    /// The replica it reached, once that replica announced itself (older servers do not).
    pub server: Option<String>,
    /// That replica is shutting down.
    pub draining: bool,
    /// For readiness: where the session is, or why there is none.
    pub detail: String,
    /// When the session came up or went (the status page's).
    pub changed: Option<std::time::Instant>,
    /// What the slot's machine does now (`connected`, `backoff`, `connecting`, `parked`), and
    /// when it dials again while it backs off.
    pub phase: &'static str,
    pub retry_at: Option<std::time::Instant>,
}

#[derive(Debug)]
struct State {
    /// Replicas to reach, as announced by the replica whose announcement is newest.
    count: u32,
    since_ms: u64,
    slots: Vec<Slot>,
}

/// How a slot should treat a session after its replica announced itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Keep it.
    Keep,
    /// Another slot holds a live session to the same replica: close this one.
    Duplicate,
}

pub(crate) struct Replicas {
    pub name: String,
    state: Mutex<State>,
    /// Bumped on every change; slots waiting to dial, and the loop that adds slots, watch it.
    changed: watch::Sender<u64>,
    held_gauge: IntGauge,
    expected_gauge: IntGauge,
}

impl Replicas {
    pub(crate) fn new(name: String, held_gauge: IntGauge, expected_gauge: IntGauge) -> Self {
        expected_gauge.set(1);
        held_gauge.set(0);
        let state = State { count: 1, since_ms: 0, slots: Vec::new() };
        Self { name, state: Mutex::new(state), changed: watch::channel(0).0, held_gauge, expected_gauge }
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Change the state and wake whoever waits on it.
    fn edit<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let mut st = self.state.lock();
        let r = f(&mut st);
        self.held_gauge.set(st.slots.iter().filter(|s| s.up).count() as i64);
        self.expected_gauge.set(i64::from(st.count));
        drop(st);
        self.changed.send_modify(|v| *v += 1);
        r
    }

    /// Add a slot; returns its index.
    pub(crate) fn add_slot(&self) -> usize {
        self.edit(|st| {
            st.slots.push(Slot { detail: "not connected yet".into(), ..Slot::default() });
            st.slots.len() - 1
        })
    }

    /// Add slots until there are as many as the announced count (a count that shrinks leaves
    /// its slots: they park while not needed); returns the new ones.
    pub(crate) fn grow(&self) -> std::ops::Range<usize> {
        let from = self.slots();
        while (self.slots() as u32) < self.count() {
            self.add_slot();
        }
        from..self.slots()
    }

    pub(crate) fn slots(&self) -> usize {
        self.state.lock().slots.len()
    }

    pub(crate) fn count(&self) -> u32 {
        self.state.lock().count
    }

    /// The slot has no session (or one not yet up).
    pub(crate) fn down(&self, slot: usize, detail: &str) {
        let changed = Some(std::time::Instant::now());
        self.edit(|st| {
            let phase = st.slots[slot].phase;
            st.slots[slot] = Slot { detail: detail.to_owned(), changed, phase, ..Slot::default() }
        });
    }

    /// The slot's session passed its handshake (its replica may announce itself later).
    pub(crate) fn up(&self, slot: usize, detail: &str) {
        let changed = Some(std::time::Instant::now());
        self.edit(|st| {
            st.slots[slot] = Slot {
                up: true,
                server: None,
                draining: false,
                detail: detail.to_owned(),
                changed,
                phase: "connected",
                retry_at: None,
            }
        });
    }

    /// What `slot`'s machine does now (see [`Slot::phase`]). Not a change the slots wait on:
    /// nobody is woken.
    pub(crate) fn phase(&self, slot: usize, phase: &'static str, retry_at: Option<std::time::Instant>) {
        if let Some(s) = self.state.lock().slots.get_mut(slot) {
            s.phase = phase;
            s.retry_at = retry_at;
        }
    }

    /// The announced count and every slot, for the status page.
    pub(crate) fn snapshot(&self) -> (u32, Vec<Slot>) {
        let st = self.state.lock();
        (st.count, st.slots.clone())
    }

    /// Take the count of an announcement if it is the newest seen.
    fn learn(st: &mut State, info: &ServerInfo) {
        if info.since_ms >= st.since_ms && info.count >= 1 {
            st.count = info.count.min(seedgate_config::server::MAX_SERVER_COUNT);
            st.since_ms = info.since_ms;
        }
    }

    /// Whether `info`'s replica is held by a live, not draining session of a slot other than `slot`.
    fn taken(st: &State, slot: usize, info: &ServerInfo) -> bool {
        st.slots
            .iter()
            .enumerate()
            .any(|(j, s)| j != slot && s.up && !s.draining && s.server.as_deref() == Some(info.id.as_str()))
    }

    /// The replica of `slot`'s session announced itself (first time, or a change such as
    /// draining). A second session to a replica another slot holds is a duplicate; a session to
    /// a restarted replica with the id of one that is draining is not (that one is going away).
    pub(crate) fn announced(&self, slot: usize, info: &ServerInfo) -> Verdict {
        self.edit(|st| {
            Self::learn(st, info);
            if Self::taken(st, slot, info) {
                return Verdict::Duplicate;
            }
            let s = &mut st.slots[slot];
            s.server = Some(info.id.clone());
            s.draining = info.draining;
            Verdict::Keep
        })
    }

    /// Whether a candidate session of `slot` (to replace its draining one) reached a replica
    /// worth moving to: one not draining and not held by another slot. Learns its count.
    pub(crate) fn acceptable(&self, slot: usize, info: &ServerInfo) -> bool {
        self.edit(|st| {
            Self::learn(st, info);
            !info.draining && !Self::taken(st, slot, info)
        })
    }

    /// Sessions up and not draining.
    fn active(st: &State) -> u32 {
        st.slots.iter().filter(|s| s.up && !s.draining).count() as u32
    }

    /// Whether `slot` should dial: its own session is absent or draining, and fewer sessions
    /// than the announced count are up and not draining.
    pub(crate) fn wants_session(&self, slot: usize) -> bool {
        let st = self.state.lock();
        let mine = &st.slots[slot];
        (!mine.up || mine.draining) && Self::active(&st) < st.count
    }

    /// Readiness: ready while at least one session is up; "degraded" below the count.
    pub(crate) fn check(&self) -> proxy_core::obs::admin::Check {
        let st = self.state.lock();
        let up: Vec<&Slot> = st.slots.iter().filter(|s| s.up).collect();
        let ids: Vec<String> = up
            .iter()
            .map(|s| {
                let id = match &s.server {
                    Some(id) => format!("{id}: {}", s.detail),
                    None => s.detail.clone(),
                };
                if s.draining { format!("{id}, draining") } else { id }
            })
            .collect();
        let (n, want) = (up.len(), st.count as usize);
        let state = match n {
            0 => "not connected",
            n if n < want || up.iter().any(|s| s.draining) => "degraded",
            _ => "connected",
        };
        let mut detail = format!("{state}: {n} of {want} replicas");
        if !ids.is_empty() {
            detail.push_str(&format!(" [{}]", ids.join(", ")));
        }
        if n == 0
            && let Some(s) = st.slots.first()
        {
            detail.push_str(&format!("; {}", s.detail));
        }
        proxy_core::obs::admin::Check::new(format!("tunnel-{}", self.name), n > 0, detail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replicas() -> Replicas {
        Replicas::new("ps:8132".into(), IntGauge::new("h", "h").unwrap(), IntGauge::new("e", "e").unwrap())
    }

    fn info(id: &str, count: u32, since_ms: u64, draining: bool) -> ServerInfo {
        ServerInfo { id: id.into(), count, since_ms, draining }
    }

    #[test]
    fn a_second_session_to_the_same_replica_is_a_duplicate_until_that_one_drains() {
        let r = replicas();
        let (a, b) = (r.add_slot(), r.add_slot());
        r.up(a, "x");
        assert_eq!(r.announced(a, &info("r1", 2, 1, false)), Verdict::Keep);
        r.up(b, "y");
        assert_eq!(r.announced(b, &info("r1", 2, 1, false)), Verdict::Duplicate);
        r.down(b, "duplicate");
        assert!(r.wants_session(b), "1 of 2 replicas held");
        r.up(b, "y");
        assert_eq!(r.announced(b, &info("r2", 2, 1, false)), Verdict::Keep);
        assert!(!r.wants_session(a) && !r.wants_session(b), "2 of 2: nobody dials");
        assert!(r.check().detail.starts_with("connected: 2 of 2"), "{}", r.check().detail);

        // r1 drains: its slot looks for a replacement; a restarted r1 is acceptable, r2 is not.
        assert_eq!(r.announced(a, &info("r1", 2, 1, true)), Verdict::Keep);
        assert!(r.wants_session(a));
        assert!(r.check().detail.starts_with("degraded"), "{}", r.check().detail);
        assert!(!r.acceptable(a, &info("r2", 2, 1, false)));
        assert!(!r.acceptable(a, &info("r3", 2, 1, true)), "another draining replica is no replacement");
        assert!(r.acceptable(a, &info("r1", 2, 5, false)));
        // ... and for another slot, a session to the restarted r1 is not a duplicate of the draining one.
        let c = r.add_slot();
        r.up(c, "z");
        assert_eq!(r.announced(c, &info("r1", 2, 5, false)), Verdict::Keep);
    }

    #[test]
    fn the_newest_count_wins_and_slots_stop_dialing_at_the_count() {
        let r = replicas();
        let a = r.add_slot();
        assert!(r.wants_session(a));
        r.up(a, "x");
        r.announced(a, &info("r1", 3, 100, false));
        assert_eq!(r.count(), 3);
        assert_eq!(r.grow(), 1..3, "a slot per replica announced");
        assert_eq!(r.grow(), 3..3);
        let b = 1;
        // A stale announcement (an older replica that has not reloaded yet) does not shrink it.
        r.up(b, "y");
        r.announced(b, &info("r2", 2, 50, false));
        assert_eq!(r.count(), 3);
        // A reload on the replicas (newer) does.
        r.announced(b, &info("r2", 2, 200, false));
        assert_eq!(r.count(), 2);
        assert_eq!(r.grow(), 3..3, "a count that shrinks leaves the slots there are");
        let c = 2;
        assert!(!r.wants_session(c), "2 of 2 held: the third slot parks");
        r.down(a, "gone");
        assert!(r.wants_session(c) && r.wants_session(a));
        assert!(r.check().ok(), "1 of 2 is degraded, still ready");
        r.down(b, "gone");
        assert!(!r.check().ok(), "none held: not ready");
        assert!(r.check().detail.starts_with("not connected: 0 of 2"), "{}", r.check().detail);
    }

    #[test]
    fn servers_that_do_not_announce_count_as_one_replica() {
        let r = replicas();
        let a = r.add_slot();
        r.up(a, "session up to ps:8132");
        assert!(!r.wants_session(a));
        assert!(r.check().detail.starts_with("connected: 1 of 1"), "{}", r.check().detail);
    }
}
