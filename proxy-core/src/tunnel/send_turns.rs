//! Turns at a QUIC connection's send window: streams whose bulk writes found it full take it in turn, oldest first (sans-IO; the caller keeps the clock and wakes).
//!
//! quinn admits a stream's bytes into one send window that all its streams share, first come,
//! first served, and when room frees it wakes every stream that found it full at once. Whichever
//! runs first takes the room; with sixteen or sixty-four bulk streams some took it round after
//! round and others, an open's answer among them, waited seconds or for ever. Here the streams
//! that found the window full queue, and only the one at the head tries again: a write that gets
//! bytes in ends its turn and it goes to the back if it has more. A write of at most
//! [`SMALL_WRITE`] bytes (an answer, a keystroke) never queues: it waits only for room.
//!
//! A head that cannot write for a reason of its own (its reader stopped reading, so the stream's
//! own flow control holds it) would stop every other stream: a turn held longer than the
//! caller's patience ([`SendTurns::expire`]) passes on, and that stream writes without a turn
//! until a write of its gets bytes in.

use std::collections::{HashSet, VecDeque};
use std::time::{Duration, Instant};

/// Writes this small never wait for a turn: what they add to the window is negligible, and an
/// open's answer or an interactive stream's keystroke should not wait behind bulk.
pub const SMALL_WRITE: usize = 1024;

/// The queue of one connection's streams waiting for a turn; `W` is how a stream is woken.
#[derive(Debug)]
pub struct SendTurns<W> {
    queue: VecDeque<(u64, W)>,
    /// When the head's turn began.
    since: Option<Instant>,
    /// Streams whose turn expired: they write without one until a write of theirs gets bytes in.
    passed: HashSet<u64>,
}

impl<W> Default for SendTurns<W> {
    fn default() -> Self {
        Self { queue: VecDeque::new(), since: None, passed: HashSet::new() }
    }
}

impl<W: Clone> SendTurns<W> {
    /// Whether stream `id` may try a write of `len` bytes now: no stream waits, or it is the
    /// head, or the write is small, or its turn expired.
    pub fn may_write(&self, id: u64, len: usize) -> bool {
        len <= SMALL_WRITE || self.passed.contains(&id) || self.queue.front().is_none_or(|(head, _)| *head == id)
    }

    /// Stream `id` found the window full, or must wait its turn: it queues (at the back, if it
    /// was not queued; otherwise it keeps its place and `wake` replaces its waker).
    pub fn wait(&mut self, id: u64, wake: W, now: Instant) {
        if self.passed.contains(&id) {
            return;
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

    /// A write of stream `id` got bytes in: its turn ends (it queues again when it waits). Returns
    /// the next head, to wake.
    pub fn wrote(&mut self, id: u64, now: Instant) -> Option<W> {
        self.passed.remove(&id);
        if self.queue.front().is_some_and(|(head, _)| *head == id) {
            self.queue.pop_front();
            return self.next(now);
        }
        None
    }

    /// Stream `id` writes no more (it ended, reset or was dropped). Returns the next head, to wake,
    /// when it was the head.
    pub fn left(&mut self, id: u64, now: Instant) -> Option<W> {
        self.passed.remove(&id);
        let was_head = self.queue.front().is_some_and(|(head, _)| *head == id);
        self.queue.retain(|(q, _)| *q != id);
        if was_head { self.next(now) } else { None }
    }

    /// The head has held its turn for `patience` without a write getting in: it writes without a
    /// turn from now on (until one of its writes gets in), and the next stream gets the turn.
    /// Returns the next head, to wake.
    pub fn expire(&mut self, now: Instant, patience: Duration) -> Option<W> {
        let since = self.since?;
        if now.saturating_duration_since(since) < patience {
            return None;
        }
        let (head, _) = self.queue.pop_front()?;
        self.passed.insert(head);
        self.next(now)
    }

    /// How many streams wait.
    pub fn waiting(&self) -> usize {
        self.queue.len()
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
}
