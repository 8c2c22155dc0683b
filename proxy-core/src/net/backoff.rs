//! Exponential back-off with jitter, for reconnect loops and accept-error pauses.

use std::time::Duration;

/// Doubles from `initial` up to `max`. Each wait is drawn from 50–100 % of the current step, so
/// many peers that lost the same server do not retry in lock step.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    step: Duration,
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Self {
        let initial = initial.min(max);
        Self { initial, max, step: initial }
    }

    /// The next wait; the step after it is twice as long (up to `max`).
    pub fn next_wait(&mut self) -> Duration {
        self.next_wait_drawn(rand::random_range(0.0..=1.0))
    }

    /// [`Self::next_wait`] with the random draw given (`0.0..=1.0`, from half the step to all of
    /// it), for callers that inject their randomness (deterministic tests).
    pub fn next_wait_drawn(&mut self, draw: f64) -> Duration {
        let wait = self.step.mul_f64(0.5 + 0.5 * draw.clamp(0.0, 1.0));
        self.step = (self.step * 2).min(self.max);
        wait
    }

    /// Start again from `initial` (after a success).
    pub fn reset(&mut self) {
        self.step = self.initial;
    }

    /// Take new bounds (a reload); the current step is clamped to them.
    pub fn set_bounds(&mut self, initial: Duration, max: Duration) {
        self.initial = initial.min(max);
        self.max = max;
        self.step = self.step.clamp(self.initial, self.max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_with_jitter_up_to_the_cap_and_resets() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(100), ms(1000));
        for step in [100, 200, 400, 800, 1000, 1000] {
            let w = b.next_wait();
            assert!(w >= ms(step / 2) && w <= ms(step), "step {step}: waited {w:?}");
        }
        b.reset();
        assert!(b.next_wait() <= ms(100));
        b.set_bounds(ms(10), ms(50));
        assert!(b.next_wait() <= ms(50));
        let mut b = Backoff::new(ms(100), ms(1000));
        assert_eq!([0.0, 1.0, 0.5].map(|d| b.next_wait_drawn(d)), [ms(50), ms(200), ms(300)]);
    }

    #[test]
    fn jitter_spreads_waits() {
        let mut seen = std::collections::HashSet::new();
        for _ in 0..50 {
            seen.insert(Backoff::new(Duration::from_secs(1), Duration::from_secs(1)).next_wait());
        }
        assert!(seen.len() > 10, "waits are not spread: {seen:?}");
    }
}
