//! What both transports read of a session's path: whether it is local, and the queueing delay above its minimum round trip that reads as a standing queue at its bottleneck (sans-IO).
//!
//! QUIC's `loss_tolerant` congestion controller ([`super::quic::congestion`]) and the HTTP/2
//! session socket's in-flight bound ([`super::h2::inflight`]) read a path the same way: nothing of
//! it on a local path, and a queue past the same margin; both take it from here.

use std::time::Duration;

/// Below this round trip a path is local: a grown HTTP/2 window, the in-flight bound and QUIC's
/// reading of a queue from its round trips stay off there (defined in `net`, whose unsent limit
/// reads it too).
pub use crate::net::LOCAL_RTT;

/// The smallest queueing delay read as a standing queue, whatever the minimum round trip: below
/// it, scheduling and timer noise at the ends (a few hundred microseconds on a busy host) would
/// read as congestion on short paths.
pub const MIN_QUEUE_MARGIN: Duration = Duration::from_millis(2);

/// The largest queueing delay read as no queue, however long the path. The window holds while the
/// queue is within twice the margin, so twice it must fit in the bottleneck's queue, which is often
/// no deeper than a few tens of milliseconds: an eighth of 300 ms held a 50 ms queue full, and
/// every overflow cost an interactive stream behind the bulk a retransmission's round trip.
pub const MAX_QUEUE_MARGIN: Duration = Duration::from_millis(10);

/// The queueing delay read as a standing queue is the minimum round trip over this (between
/// [`MIN_QUEUE_MARGIN`] and [`MAX_QUEUE_MARGIN`]): 6.25 ms at 50 ms, 10 ms from 80 ms on, a few
/// packets' worth of a window.
const QUEUE_FRACTION: u32 = 8;

/// What the smoothed round trip says of the bottleneck queue (see [`queue_margin`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Queue {
    /// Within the margin of the minimum: none, or one too short to matter.
    None,
    /// Past the margin, within twice it: the path is full.
    Standing,
    /// Past twice the margin.
    Long { min: Duration },
}

/// The queueing delay above the minimum round trip `min` read as a standing queue.
pub(crate) fn queue_margin(min: Duration) -> Duration {
    (min / QUEUE_FRACTION).clamp(MIN_QUEUE_MARGIN, MAX_QUEUE_MARGIN)
}

/// What a smoothed round trip `srtt` shows of the bottleneck queue of a path whose minimum round
/// trip is `min`.
pub(crate) fn read_queue(srtt: Duration, min: Duration) -> Queue {
    let margin = queue_margin(min);
    if srtt > min + 2 * margin {
        Queue::Long { min }
    } else if srtt > min + margin {
        Queue::Standing
    } else {
        Queue::None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);
    const MICROS: Duration = Duration::from_micros(1);

    #[test]
    fn the_margin_is_an_eighth_of_the_path_within_its_limits() {
        assert_eq!(queue_margin(50 * MS), 6250 * MICROS);
        assert_eq!(queue_margin(5 * MS), MIN_QUEUE_MARGIN);
        assert_eq!(queue_margin(80 * MS), MAX_QUEUE_MARGIN);
        assert_eq!(queue_margin(300 * MS), MAX_QUEUE_MARGIN);
    }
}
