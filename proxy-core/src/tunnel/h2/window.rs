//! An HTTP/2 session's stream window that follows its path: a bandwidth-delay estimate from PING round trips and the bytes that arrived meanwhile (sans-IO).
//!
//! One stream can move at most its window per round trip, so a fixed window that suits loopback
//! (512 KiB, a few microseconds' worth) caps a stream across a WAN at window ÷ RTT (84 Mbit/s at
//! 50 ms, 28 at 150). The session samples its path with PINGs: a sample is one PING's round
//! trip and the bytes the session received while it was out. The rate those bytes represent,
//! times the smallest round trip seen (the path without its queues), estimates the
//! bandwidth-delay product. While that is more than half the window, the window may be what
//! limits the session (h2 re-opens a window only once a good part of it was read, so a stream
//! moves less than its window per round trip), and the window doubles, or becomes twice the
//! estimate, up to a cap: it settles at two to four times the path's product. A path that
//! limits on its own shows a longer round trip (its bottleneck queue fills) at the same rate,
//! so its estimate stays what the path holds and growth stops; on a local path (below
//! [`LOCAL_RTT`]) it never grows. The window never shrinks: what a stream does not use costs
//! nothing (h2 holds only bytes received and not yet read).

use std::time::Duration;

// On a local path the default window already allows gigabytes a second per stream: its windows
// never grow, whatever a sample says (a PING queued behind bulk at both ends takes far longer
// than the path).
use crate::tunnel::path::LOCAL_RTT;

/// How one session's stream window follows its path.
#[derive(Debug, Clone)]
pub struct WindowTuner {
    window: u32,
    cap: u32,
    min_rtt: Option<Duration>,
}

impl WindowTuner {
    /// Starting at `window`, growing up to `cap` (never below `window`).
    pub fn new(window: u32, cap: u32) -> Self {
        Self { window, cap: cap.max(window), min_rtt: None }
    }

    /// The window now.
    pub fn window(&self) -> u32 {
        self.window
    }

    /// True while the window may still grow: samples are worth taking often (never again once
    /// the path showed itself local).
    pub fn growing(&self) -> bool {
        self.window < self.cap && self.min_rtt.is_none_or(|m| m >= LOCAL_RTT)
    }

    /// One PING's round trip `rtt`, during which the session received `bytes`. Returns the new
    /// window when it grows.
    pub fn sample(&mut self, rtt: Duration, bytes: u64) -> Option<u32> {
        if rtt.is_zero() {
            return None;
        }
        let min_rtt = self.min_rtt.map_or(rtt, |m| m.min(rtt));
        self.min_rtt = Some(min_rtt);
        if min_rtt < LOCAL_RTT {
            return None;
        }
        // bytes ÷ rtt × min_rtt, in u128 so that no product overflows.
        let bdp = u128::from(bytes) * min_rtt.as_nanos() / rtt.as_nanos();
        if bdp * 2 < u128::from(self.window) || !self.growing() {
            return None;
        }
        let want = (bdp * 2).max(u128::from(self.window) * 2);
        self.window = u32::try_from(want).unwrap_or(u32::MAX).min(self.cap);
        Some(self.window)
    }
}

/// The most a stream's window may grow to on a session whose connection window is
/// `connection_window`: `max_stream_window`, but no more than a quarter of the connection
/// window, so that streams whose readers stall (each holding its full window) cannot take the
/// whole session's window until at least four of them do; never below `floor` (the configured
/// stream window).
pub fn stream_window_cap(floor: u32, max_stream_window: u32, connection_window: u32) -> u32 {
    max_stream_window.min(connection_window / 4).max(floor)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB: u32 = 1024;
    const MIB: u32 = 1024 * KIB;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_window_limited_wan_session_doubles_up_to_the_cap() {
        // 512 KiB per 150 ms round trip, the round trip as idle: the window is the limit.
        let mut t = WindowTuner::new(512 * KIB, 16 * MIB);
        let mut seen = vec![];
        for _ in 0..10 {
            let w = t.window();
            if let Some(n) = t.sample(ms(150), u64::from(w)) {
                seen.push(n);
            }
        }
        assert_eq!(seen, [MIB, 2 * MIB, 4 * MIB, 8 * MIB, 16 * MIB]);
        assert!(!t.growing());
        assert_eq!(t.sample(ms(150), u64::from(16 * MIB)), None, "never above the cap");
    }

    #[test]
    fn a_session_limited_by_its_path_keeps_its_window() {
        // 100 Mbit/s at 50 ms is 625 KB per round trip; once the bottleneck's queue fills, the
        // round trip doubles while the rate stays: the estimate is the idle round trip's worth.
        let mut t = WindowTuner::new(4 * MIB, 16 * MIB);
        assert_eq!(t.sample(ms(50), 625_000), None);
        assert_eq!(t.sample(ms(100), 1_250_000), None);
        assert_eq!(t.window(), 4 * MIB);
    }

    #[test]
    fn loopback_keeps_the_default_window() {
        // 2 GB/s at a 50 µs round trip, a PING delayed to 2 ms behind queued bulk, and one
        // whose bytes alone would be window-limited.
        let mut t = WindowTuner::new(512 * KIB, 16 * MIB);
        assert_eq!(t.sample(Duration::from_micros(50), 100_000), None);
        assert_eq!(t.sample(ms(2), 4_000_000), None);
        assert_eq!(t.sample(Duration::from_micros(400), 800_000), None);
        assert_eq!(t.window(), 512 * KIB);
        assert!(!t.growing(), "a local path is not sampled again");
    }

    #[test]
    fn an_estimate_above_twice_the_window_jumps_to_twice_the_estimate() {
        let mut t = WindowTuner::new(512 * KIB, 16 * MIB);
        assert_eq!(t.sample(ms(300), u64::from(3 * MIB)), Some(6 * MIB));
    }

    #[test]
    fn an_idle_session_or_a_zero_round_trip_changes_nothing() {
        let mut t = WindowTuner::new(512 * KIB, 16 * MIB);
        assert_eq!(t.sample(ms(50), 0), None);
        assert_eq!(t.sample(Duration::ZERO, u64::MAX), None);
        assert_eq!(t.sample(ms(50), u64::MAX), Some(16 * MIB), "no overflow");
    }

    #[test]
    fn a_cap_below_the_window_means_no_growth() {
        let mut t = WindowTuner::new(MIB, 64 * KIB);
        assert!(!t.growing());
        assert_eq!(t.sample(ms(100), u64::from(MIB)), None);
    }

    #[test]
    fn the_cap_leaves_the_connection_window_room_for_four_full_streams() {
        assert_eq!(stream_window_cap(512 * KIB, 16 * MIB, 64 * MIB), 16 * MIB);
        assert_eq!(stream_window_cap(512 * KIB, 16 * MIB, 8 * MIB), 2 * MIB);
        assert_eq!(stream_window_cap(512 * KIB, 16 * MIB, MIB), 512 * KIB, "never below the stream window");
        assert_eq!(stream_window_cap(512 * KIB, 256 * KIB, 64 * MIB), 512 * KIB);
    }
}
