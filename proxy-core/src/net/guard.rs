//! Counts something as active for as long as a guard lives: a gauge, an atomic, an upstream's load.

use prometheus::IntGauge;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A count that goes up when a guard is made and down when it is dropped.
pub trait Tally: Send + Sync {
    fn up(&self);
    fn down(&self);
}

impl Tally for IntGauge {
    fn up(&self) {
        self.inc();
    }
    fn down(&self) {
        self.dec();
    }
}

impl Tally for AtomicUsize {
    fn up(&self) {
        self.fetch_add(1, Ordering::Relaxed);
    }
    fn down(&self) {
        self.fetch_sub(1, Ordering::Relaxed);
    }
}

impl<T: Tally + ?Sized> Tally for Arc<T> {
    fn up(&self) {
        (**self).up();
    }
    fn down(&self) {
        (**self).down();
    }
}

impl<T: Tally + ?Sized> Tally for &T {
    fn up(&self) {
        (**self).up();
    }
    fn down(&self) {
        (**self).down();
    }
}

/// Holds one unit of `T` until dropped, however the holder ends (return, error, panic, abort).
pub struct Active<T: Tally>(T);

impl<T: Tally> Active<T> {
    pub fn new(t: T) -> Self {
        t.up();
        Self(t)
    }

    /// Take over a unit already counted (e.g. by a check-and-increment against a limit).
    pub fn adopt(t: T) -> Self {
        Self(t)
    }

    pub fn get(&self) -> &T {
        &self.0
    }
}

impl<T: Tally> Drop for Active<T> {
    fn drop(&mut self) {
        self.0.down();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_while_held() {
        let n = Arc::new(AtomicUsize::new(0));
        let g = IntGauge::new("g", "g").unwrap();
        {
            let _a = Active::new(n.clone());
            let _b = Active::new(n.clone());
            let _c = Active::new(g.clone());
            assert_eq!(n.load(Ordering::Relaxed), 2);
            assert_eq!(g.get(), 1);
        }
        assert_eq!(n.load(Ordering::Relaxed), 0);
        assert_eq!(g.get(), 0);
    }
}
