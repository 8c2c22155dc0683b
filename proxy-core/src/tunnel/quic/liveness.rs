//! Whether a QUIC session's path is quiet, from its connection's counters, and the task that watches each connection: its path, its send window, its send turns.

use super::config::send_window;
use super::stream::Turns;
use crate::tunnel::TunnelSettings;
use bytes::Bytes;
use quinn::Connection;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a connection's send window follows its congestion window: a few times per round
/// trip of a WAN path, and cheap (a copy of the connection's counters under its lock).
const SEND_WINDOW_EVERY: Duration = Duration::from_millis(50);

/// How long a stream may hold its turn at the send window ([`SendTurns`]) without getting a write
/// in: room frees with every acknowledgement, so a head that waits two round trips (at least
/// 100 ms) is held by its own stream's flow control.
fn turn_patience(rtt: Duration) -> Duration {
    (rtt * 2).clamp(Duration::from_millis(100), Duration::from_secs(1))
}

/// Whether what a connection sends is being acknowledged, from its counters: the path is quiet
/// once something that asks for an acknowledgement (a keep-alive PING, stream data) has gone out
/// and no acknowledgement came back for the suspect time. An acknowledgement shows as a new
/// round-trip sample (quinn takes one from every ACK that newly acknowledges an ack-eliciting
/// packet, and the smoothed RTT moves with it by the nanosecond). Datagrams or ACK frames
/// received would not do: with only the seed's direction lost, the agent's packets (and the old
/// ACK ranges they repeat) still arrive while nothing the seed sends does. Fed samples; sans-IO.
#[derive(Debug, Default)]
pub struct Hearing {
    acked: u64,
    asked: u64,
    /// The first sample that saw a request for an acknowledgement go out since the last datagram.
    waiting_since: Option<tokio::time::Instant>,
    /// The last sample saw an acknowledgement and, since the one before, more requests for one:
    /// the acknowledgement may not cover them.
    unsure: bool,
}

impl Hearing {
    /// Take a sample (`acked`: changes with every acknowledgement, the smoothed RTT in
    /// nanoseconds; `asked`: frames out that ask for one) at `now`; true while the path is quiet.
    /// `can_ask`: the caller sends a request of its own ([`Hearing::unsure`]) when the counters
    /// cannot tell whether what went out last was acknowledged; without one such frames count
    /// as acknowledged (a silence is then noticed from the next request on).
    pub fn sample(
        &mut self,
        now: tokio::time::Instant,
        acked: u64,
        asked: u64,
        suspect: Duration,
        can_ask: bool,
    ) -> bool {
        self.unsure = false;
        if acked != self.acked {
            // What went out since the last sample may be just what this acknowledgement left
            // unanswered (a dial's first packet into a path that failed a moment ago): it waits
            // from now, until the caller's request is acknowledged.
            self.unsure = can_ask && asked != self.asked;
            (self.acked, self.asked, self.waiting_since) = (acked, asked, self.unsure.then_some(now));
        } else if asked != self.asked {
            self.asked = asked;
            self.waiting_since.get_or_insert(now);
        }
        self.waiting_since.is_some_and(|t| now.duration_since(t) >= suspect)
    }

    /// The last sample could not tell whether the latest requests were acknowledged: ask for
    /// an acknowledgement (one the counters in `asked` do not count).
    pub fn unsure(&self) -> bool {
        self.unsure
    }
}

/// Frames sent that ask for an acknowledgement (those a live peer answers within its ACK delay);
/// not datagrams: the only ones sent are [`watch_quiet`]'s own requests.
fn asked(s: &quinn::ConnectionStats) -> u64 {
    let f = &s.frame_tx;
    f.ping + f.stream + f.reset_stream + f.stop_sending + f.max_data + f.max_stream_data + f.crypto
}

/// While the path is quiet, this often a probe asks the peer for an acknowledgement.
const PROBE_PACE: Duration = Duration::from_millis(200);

/// Tell `quiet` whether `conn`'s path is quiet ([`Hearing`]), sampled eight times per suspect
/// time (at most every 500 ms: a dial waits for the verdict, and the first thing sent into the
/// silence is seen one sample late), until the connection closes. A sample copies the
/// connection's counters under its lock: some microseconds. A one-byte datagram (ack-eliciting)
/// goes out when a sample is [`Hearing::unsure`] (on a busy connection, about one per sample),
/// and while the path is quiet every [`PROBE_PACE`], the samples following it: quinn's
/// own retransmissions back off exponentially during an outage, so without this the first
/// acknowledgement after the path heals could come seconds later; with it, within a round trip
/// and a pace. The same task keeps the connection's send window at [`send_window`] of its
/// congestion window and passes on a turn at it ([`SendTurns`]) held past [`turn_patience`].
pub(super) fn watch_quiet(
    conn: Connection,
    settings: &TunnelSettings,
    turns: Arc<Turns>,
    quiet: impl Fn(bool) + Send + 'static,
) {
    let suspect = settings.suspect();
    let tick = (suspect / 8).clamp(Duration::from_millis(20), Duration::from_millis(500));
    let cap = u64::from(settings.connection_window);
    tokio::spawn(async move {
        let mut hearing = Hearing::default();
        let mut sent_window = send_window(0, cap);
        let mut hear_at = tokio::time::Instant::now() + tick;
        let mut busy = false;
        loop {
            // Between samples of the path: while the send window moves or streams wait for a
            // turn, every [`SEND_WINDOW_EVERY`]; an idle connection wakes only to sample.
            let at = if busy { hear_at.min(tokio::time::Instant::now() + SEND_WINDOW_EVERY) } else { hear_at };
            tokio::select! {
                _ = conn.closed() => return,
                () = tokio::time::sleep_until(at) => {}
            }
            // One copy of the counters serves the send window, the turns and the path sample.
            let s = conn.stats();
            let window = send_window(s.path.cwnd, cap);
            busy = window != sent_window;
            if busy {
                conn.set_send_window(window);
                sent_window = window;
            }
            let mut t = turns.lock();
            let expired = t.expire(Instant::now(), turn_patience(s.path.rtt));
            busy |= t.waiting() > 0;
            drop(t);
            if let Some(w) = expired {
                w.wake();
            }
            if tokio::time::Instant::now() < hear_at {
                continue;
            }
            let acked = u64::try_from(s.path.rtt.as_nanos()).unwrap_or(u64::MAX);
            // A peer that takes no datagrams would close the connection on one.
            let can_ask = conn.max_datagram_size().is_some();
            let silent = hearing.sample(tokio::time::Instant::now(), acked, asked(&s), suspect, can_ask);
            quiet(silent);
            if can_ask && (silent || hearing.unsure()) {
                let _ = conn.send_datagram(Bytes::from_static(b"p"));
            }
            hear_at = tokio::time::Instant::now() + if silent { tick.min(PROBE_PACE) } else { tick };
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A [`Hearing`] fed samples at milliseconds from a start, with a suspect time of 3 s.
    struct Samples {
        t0: tokio::time::Instant,
        h: Hearing,
    }

    impl Samples {
        fn new() -> Self {
            Self { t0: tokio::time::Instant::now(), h: Hearing::default() }
        }

        fn at(&mut self, ms: u64, acked: u64, asked: u64, can_ask: bool) -> bool {
            self.h.sample(self.t0 + Duration::from_millis(ms), acked, asked, Duration::from_secs(3), can_ask)
        }
    }

    /// Quiet only once something asked for an acknowledgement and none came back for the
    /// suspect time; the next acknowledgement clears it.
    #[test]
    fn a_path_is_quiet_once_an_ack_eliciting_frame_waits_the_suspect_time_unanswered() {
        let mut s = Samples::new();
        let mut sample = |ms, acked, asked| s.at(ms, acked, asked, true);
        assert!(!sample(0, 10, 5), "acknowledged");
        assert!(!sample(100, 11, 5), "the request the first sample was unsure of is acknowledged");
        assert!(!sample(5_000, 11, 5), "idle both ways is not quiet: nothing was asked");
        assert!(!sample(6_000, 11, 6), "a PING went out");
        assert!(!sample(8_000, 11, 7), "2 s unanswered");
        assert!(sample(9_000, 11, 7), "3 s since the first unanswered PING");
        assert!(sample(20_000, 11, 9), "still nothing heard");
        assert!(!sample(20_100, 12, 9), "an acknowledgement: the path is back");
        assert!(!sample(30_000, 12, 9));
        // An acknowledgement arrives in the same sample as something new goes out, then nothing:
        // what went out waits from that sample on.
        assert!(!sample(31_000, 13, 10), "acknowledged, and asked again");
        assert!(!sample(33_000, 13, 10), "2 s unanswered");
        assert!(sample(34_000, 13, 10), "3 s since it went out unanswered");
        assert!(!sample(34_100, 14, 10), "acknowledged, nothing new: the path is back");
    }

    /// The watch asks for an acknowledgement exactly when a sample cannot tell; a caller that
    /// cannot ask counts such frames as acknowledged.
    #[test]
    fn an_acknowledgement_that_may_not_cover_the_latest_requests_is_settled_by_asking() {
        let mut s = Samples::new();
        assert!(!s.at(0, 10, 5, true));
        assert!(s.h.unsure(), "acknowledged and asked since the last sample");
        assert!(!s.at(100, 11, 5, true));
        assert!(!s.h.unsure(), "acknowledged, nothing new");
        assert!(!s.at(200, 12, 6, false));
        assert!(!s.h.unsure(), "cannot ask");
        assert!(!s.at(9_000, 12, 6, false), "taken as acknowledged");
    }
}
