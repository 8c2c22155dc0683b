//! Turns at a QUIC connection's send window: streams whose bulk writes found it full take it in turn, oldest first, and small writes go before them (sans-IO; the caller keeps the clock and wakes).
//!
//! quinn admits a stream's bytes into one send window that all its streams share, first come,
//! first served, and when room frees it wakes every stream that found it full at once. Whichever
//! runs first takes the room; with sixteen or sixty-four bulk streams some took it round after
//! round and others, an open's answer among them, waited seconds or for ever. Here the streams
//! that found the window full queue, and only the one at the head tries again: a write that gets
//! bytes in ends its turn and it goes to the back if it has more.
//!
//! A write of at most [`SMALL_WRITE`] bytes (a stream's header or answer, a keystroke, a control
//! message) never queues for a turn, and while one waits for room no bulk write tries: woken
//! together, the bulk stream's task ran first every time (the scheduler runs the task woken last
//! first, and quinn wakes the stream that found the window full last, first), took all the room
//! an acknowledgement freed, and an open waited behind one bulk stream until its dial timed out.
//!
//! A stream that cannot write for a reason of its own (its reader stopped reading, so the
//! stream's own flow control holds it) would stop every other stream, as the head or as a small
//! write waiting: held longer than the caller's patience ([`SendTurns::expire`]), the turn
//! passes on, or the small write stops holding bulk back, and that stream writes without a turn
//! until a write of its gets bytes in.

use std::collections::{HashSet, VecDeque};
use std::time::{Duration, Instant};

/// Writes this small never wait for a turn, and bulk writes wait for them: what they add to the
/// window is negligible, and an open's answer or an interactive stream's keystroke should not
/// wait behind bulk.
pub const SMALL_WRITE: usize = 1024;

/// The queue of one connection's streams waiting for a turn; `W` is how a stream is woken.
#[derive(Debug)]
pub struct SendTurns<W> {
    queue: VecDeque<(u64, W)>,
    /// When the head's turn began (or the small writes that held it back got in).
    since: Option<Instant>,
    /// Streams whose small write found the window full, and since when: while any waits, no bulk
    /// write tries (quinn wakes the small write's stream when room frees).
    small: Vec<(u64, Instant)>,
    /// Streams that waited past patience: they write without a turn, and hold nobody back,
    /// until a write of theirs gets bytes in.
    passed: HashSet<u64>,
}

impl<W> Default for SendTurns<W> {
    fn default() -> Self {
        Self { queue: VecDeque::new(), since: None, small: Vec::new(), passed: HashSet::new() }
    }
}

impl<W: Clone> SendTurns<W> {
    /// Whether stream `id` may try a write of `len` bytes now: a small write always may; a bulk
    /// one when no small write waits for room, and no stream waits or it is the head or its
    /// turn expired.
    pub fn may_write(&self, id: u64, len: usize) -> bool {
        if len <= SMALL_WRITE {
            return true;
        }
        !self.held_back(id) && (self.passed.contains(&id) || self.queue.front().is_none_or(|(head, _)| *head == id))
    }

    /// Stream `id` found the window full with a bulk write, or must wait its turn: it queues (at
    /// the back, if it was not queued; otherwise it keeps its place and `wake` replaces its
    /// waker). A stream whose turn expired does not queue (quinn wakes it when room frees)
    /// unless small writes hold it back: then it gives up its pass and queues.
    pub fn wait(&mut self, id: u64, wake: W, now: Instant) {
        if self.passed.contains(&id) {
            if !self.held_back(id) {
                return;
            }
            self.passed.remove(&id);
        }
        if let Some((_, w)) = self.queue.iter_mut().find(|(q, _)| *q == id) {
            *w = wake;
            return;
        }
        if self.queue.is_empty() {
            self.since = Some(now);
        }
        self.queue.push_back((id, wake));
    }

    /// Stream `id`'s small write found the window full: until it gets in (or waits past
    /// patience), bulk writes wait for it. Waiting again keeps its time.
    pub fn wait_small(&mut self, id: u64, now: Instant) {
        if self.passed.contains(&id) || self.small.iter().any(|(s, _)| *s == id) {
            return;
        }
        self.small.push((id, now));
    }

    /// A write of stream `id` got bytes in: its turn ends (it queues again when it waits), and
    /// so does its small write's wait. Returns the head to wake: the next one, or the one the
    /// small writes held back.
    pub fn wrote(&mut self, id: u64, now: Instant) -> Option<W> {
        self.passed.remove(&id);
        let released = self.small_done(id, now);
        if self.queue.front().is_some_and(|(head, _)| *head == id) {
            self.queue.pop_front();
            return self.next(now);
        }
        if released { self.head() } else { None }
    }

    /// Stream `id` writes no more (it ended, reset or was dropped). Returns the head to wake,
    /// when it was the head or the last small write waiting.
    pub fn left(&mut self, id: u64, now: Instant) -> Option<W> {
        self.passed.remove(&id);
        let released = self.small_done(id, now);
        let was_head = self.queue.front().is_some_and(|(head, _)| *head == id);
        self.queue.retain(|(q, _)| *q != id);
        if was_head {
            self.next(now)
        } else if released {
            self.head()
        } else {
            None
        }
    }

    /// Waits past `patience`: small writes stop holding bulk back, and a head that held its turn
    /// (with no small write holding it back) writes without a turn from now on (until one of
    /// its writes gets in) while the next stream gets the turn. Returns the head to wake.
    pub fn expire(&mut self, now: Instant, patience: Duration) -> Option<W> {
        let held = !self.small.is_empty();
        let passed = &mut self.passed;
        self.small.retain(|(id, since)| {
            let waits = now.saturating_duration_since(*since) < patience;
            if !waits {
                passed.insert(*id);
            }
            waits
        });
        if !self.small.is_empty() {
            return None;
        }
        if held {
            // The head's turn starts now: until now it could not write.
            self.since = Some(now);
            return self.head();
        }
        let since = self.since?;
        if now.saturating_duration_since(since) < patience {
            return None;
        }
        let (head, _) = self.queue.pop_front()?;
        self.passed.insert(head);
        self.next(now)
    }

    /// How many streams wait: for a turn, or with a small write for room.
    pub fn waiting(&self) -> usize {
        self.queue.len() + self.small.len()
    }

    /// Stream `id`'s small write waits no more; whether that was the last one, which releases bulk.
    fn small_done(&mut self, id: u64, now: Instant) -> bool {
        // Every write that gets in comes here: nothing to do unless a small write waits.
        if self.small.is_empty() {
            return false;
        }
        self.small.retain(|(s, _)| *s != id);
        let released = self.small.is_empty();
        if released {
            self.since = Some(now);
        }
        released
    }

    /// Whether a small write of another stream than `id` waits for room, holding `id`'s bulk
    /// writes back.
    fn held_back(&self, id: u64) -> bool {
        self.small.iter().any(|(s, _)| *s != id)
    }

    fn head(&self) -> Option<W> {
        self.queue.front().map(|(_, w)| w.clone())
    }

    fn next(&mut self, now: Instant) -> Option<W> {
        let (_, w) = self.queue.front()?;
        self.since = Some(now);
        Some(w.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BULK: usize = 64 * 1024;

    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    #[test]
    fn with_nobody_waiting_every_stream_writes() {
        let t: SendTurns<u64> = SendTurns::default();
        assert!(t.may_write(1, BULK) && t.may_write(2, BULK));
    }

    #[test]
    fn streams_that_found_the_window_full_write_in_turn_oldest_first() {
        let t0 = Instant::now();
        let mut t = SendTurns::default();
        for id in [1, 2, 3] {
            t.wait(id, id, t0);
        }
        assert!(t.may_write(1, BULK) && !t.may_write(2, BULK) && !t.may_write(3, BULK));
        assert!(!t.may_write(4, BULK), "a newcomer queues behind them");
        assert_eq!(t.wrote(1, at(t0, 1)), Some(2), "the next head is woken");
        t.wait(1, 1, at(t0, 1));
        assert!(t.may_write(2, BULK) && !t.may_write(1, BULK));
        assert_eq!(t.wrote(2, at(t0, 2)), Some(3));
        assert_eq!(t.wrote(3, at(t0, 3)), Some(1), "round and round");
        assert_eq!(t.wrote(1, at(t0, 4)), None, "nobody left waiting");
        assert_eq!(t.waiting(), 0);
    }

    #[test]
    fn waiting_again_keeps_a_streams_place_and_takes_its_new_waker() {
        let t0 = Instant::now();
        let mut t = SendTurns::default();
        t.wait(1, 10, t0);
        t.wait(2, 20, t0);
        t.wait(2, 21, t0);
        t.wait(1, 11, t0);
        assert_eq!(t.waiting(), 2);
        assert_eq!(t.wrote(1, t0), Some(21));
    }

    #[test]
    fn a_small_write_never_waits_for_a_turn() {
        let t0 = Instant::now();
        let mut t = SendTurns::default();
        t.wait(1, 1, t0);
        assert!(t.may_write(2, SMALL_WRITE) && !t.may_write(2, SMALL_WRITE + 1));
        assert_eq!(t.wrote(2, t0), None, "a write out of turn passes nobody's turn on");
        assert!(t.may_write(1, BULK));
    }

    #[test]
    fn a_stream_that_leaves_gives_its_turn_to_the_next() {
        let t0 = Instant::now();
        let mut t = SendTurns::default();
        for id in [1, 2, 3] {
            t.wait(id, id, t0);
        }
        assert_eq!(t.left(2, t0), None, "not the head: nobody to wake");
        assert_eq!(t.left(1, t0), Some(3));
        assert!(t.may_write(3, BULK));
    }

    #[test]
    fn a_turn_held_past_patience_passes_on_and_that_stream_writes_without_one_until_it_gets_in() {
        let t0 = Instant::now();
        let patience = Duration::from_millis(100);
        let mut t = SendTurns::default();
        t.wait(1, 1, t0);
        t.wait(2, 2, at(t0, 50));
        assert_eq!(t.expire(at(t0, 99), patience), None);
        assert_eq!(t.expire(at(t0, 100), patience), Some(2));
        assert!(t.may_write(1, BULK), "stalled by its own reader: it tries whenever quinn wakes it");
        t.wait(1, 1, at(t0, 101));
        assert_eq!(t.waiting(), 1, "without queueing");
        assert_eq!(t.expire(at(t0, 199), patience), None, "the new head's patience counts from its turn");
        assert_eq!(t.wrote(1, at(t0, 150)), None);
        assert!(!t.may_write(1, BULK), "once it got in, it takes turns again");
        assert_eq!(t.expire(at(t0, 200), patience), None, "nobody behind the head to wake");
        assert_eq!(t.waiting(), 0);
    }
    #[test]
    fn a_small_write_waiting_for_room_holds_bulk_back_until_it_gets_in() {
        let t0 = Instant::now();
        let mut t = SendTurns::default();
        t.wait(1, 1, t0);
        t.wait_small(2, at(t0, 1));
        assert!(!t.may_write(1, BULK), "not even the head takes the room the small write waits for");
        assert!(!t.may_write(3, BULK));
        assert!(t.may_write(2, SMALL_WRITE) && t.may_write(4, 1), "small writes go");
        assert_eq!(t.waiting(), 2);
        assert_eq!(t.wrote(2, at(t0, 2)), Some(1), "the head it held back is woken");
        assert!(t.may_write(1, BULK));
        assert_eq!(t.wrote(1, at(t0, 3)), None);
        assert_eq!(t.waiting(), 0);
    }

    #[test]
    fn a_small_write_holds_back_a_bulk_write_that_has_not_queued_yet() {
        let t0 = Instant::now();
        let mut t = SendTurns::default();
        t.wait_small(2, t0);
        t.wait_small(2, at(t0, 5));
        assert!(!t.may_write(1, BULK));
        t.wait(1, 1, t0);
        t.wait_small(3, at(t0, 1));
        assert_eq!(t.wrote(2, at(t0, 2)), None, "another small write still waits");
        assert!(!t.may_write(1, BULK));
        assert_eq!(t.left(3, at(t0, 3)), Some(1), "the last one leaving releases the head");
        assert!(t.may_write(1, BULK));
    }

    #[test]
    fn a_streams_own_small_write_does_not_hold_back_its_bulk_write() {
        let t0 = Instant::now();
        let mut t: SendTurns<u64> = SendTurns::default();
        t.wait_small(1, t0);
        assert!(t.may_write(1, BULK) && !t.may_write(2, BULK));
    }

    #[test]
    fn a_passed_stream_held_back_by_a_small_write_queues_again() {
        let t0 = Instant::now();
        let patience = Duration::from_millis(100);
        let mut t = SendTurns::default();
        t.wait(1, 1, t0);
        t.wait(2, 2, t0);
        assert_eq!(t.expire(at(t0, 100), patience), Some(2));
        assert!(t.may_write(1, BULK), "passed");
        t.wait_small(3, at(t0, 101));
        assert!(!t.may_write(1, BULK) && !t.may_write(2, BULK));
        t.wait(1, 1, at(t0, 102));
        assert_eq!(t.waiting(), 3, "1 queued behind 2, beside the small write");
        assert_eq!(t.wrote(3, at(t0, 103)), Some(2));
        assert!(t.may_write(2, BULK) && !t.may_write(1, BULK));
    }

    #[test]
    fn a_small_write_waiting_past_patience_stops_holding_bulk_back_until_a_write_of_its_gets_in() {
        let t0 = Instant::now();
        let patience = Duration::from_millis(100);
        let mut t = SendTurns::default();
        t.wait(1, 1, t0);
        t.wait_small(2, t0);
        assert_eq!(t.expire(at(t0, 99), patience), None);
        assert_eq!(t.expire(at(t0, 100), patience), Some(1), "held by its own flow control: bulk goes on");
        assert!(t.may_write(1, BULK));
        t.wait_small(2, at(t0, 150));
        assert!(t.may_write(1, BULK), "it holds nobody back while it waits on");
        assert_eq!(t.wrote(2, at(t0, 160)), None);
        t.wait_small(2, at(t0, 170));
        assert!(!t.may_write(1, BULK), "once it got in, its next wait holds bulk back again");
    }

    #[test]
    fn a_heads_patience_does_not_run_while_small_writes_hold_it_back() {
        let t0 = Instant::now();
        let patience = Duration::from_millis(100);
        let mut t = SendTurns::default();
        t.wait(1, 1, t0);
        t.wait(2, 2, t0);
        t.wait_small(9, at(t0, 10));
        assert_eq!(t.expire(at(t0, 100), patience), None, "the head could not write: its turn stands");
        assert_eq!(t.wrote(9, at(t0, 120)), Some(1));
        assert_eq!(t.expire(at(t0, 219), patience), None, "its turn counts from the release");
        assert_eq!(t.expire(at(t0, 220), patience), Some(2));
    }
}
