//! The workspace's one way to lock: `Mutex` and `RwLock` whose guards are taken as they are, whether or not a thread panicked while holding them.
//!
//! A thread that panics holding a `std::sync` lock poisons it, and every later `lock()` returns
//! an error. Answering that error with a panic turns one bug into a panic of every connection,
//! session or reload that touches the lock afterwards. Every lock of this workspace guards state
//! that is whole between any two steps that could panic (maps, lists, counters, small records
//! replaced whole), so the next holder can take it as the panicking thread left it: these
//! wrappers recover the guard from a poisoned lock. A state that could be left half-updated
//! does not belong behind them.

// This module is the wrapper the workspace's clippy.toml points every other lock at.
#![allow(clippy::disallowed_types)]

use std::sync::PoisonError;
pub use std::sync::{MutexGuard, RwLockReadGuard, RwLockWriteGuard};

/// A mutual-exclusion lock whose [`lock`](Mutex::lock) never fails (see the module documentation).
#[derive(Default)]
pub struct Mutex<T: ?Sized>(std::sync::Mutex<T>);

impl<T> Mutex<T> {
    pub const fn new(value: T) -> Self {
        Self(std::sync::Mutex::new(value))
    }

    pub fn into_inner(self) -> T {
        self.0.into_inner().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: ?Sized> Mutex<T> {
    /// Wait for the lock and take it.
    pub fn lock(&self) -> MutexGuard<'_, T> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn get_mut(&mut self) -> &mut T {
        self.0.get_mut().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: ?Sized + std::fmt::Debug> std::fmt::Debug for Mutex<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Mutex").field(&&*self.lock()).finish()
    }
}

/// A readers-writer lock whose [`read`](RwLock::read) and [`write`](RwLock::write) never fail
/// (see the module documentation).
#[derive(Default)]
pub struct RwLock<T: ?Sized>(std::sync::RwLock<T>);

impl<T> RwLock<T> {
    pub const fn new(value: T) -> Self {
        Self(std::sync::RwLock::new(value))
    }
}

impl<T: ?Sized> RwLock<T> {
    /// Wait for shared access and take it.
    pub fn read(&self) -> RwLockReadGuard<'_, T> {
        self.0.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Wait for exclusive access and take it.
    pub fn write(&self) -> RwLockWriteGuard<'_, T> {
        self.0.write().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A panic while the locks are held leaves them usable, with what was written before it.
    #[test]
    fn a_panic_while_holding_the_lock_does_not_fail_the_next_holder() {
        let m = std::sync::Arc::new(Mutex::new(vec![1]));
        let l = std::sync::Arc::new(RwLock::new(1));
        let (m2, l2) = (m.clone(), l.clone());
        let panicked = std::thread::spawn(move || {
            let _r = l2.write();
            m2.lock().push(2);
            let _g = m2.lock();
            panic!("panicking while holding both locks");
        })
        .join();
        assert!(panicked.is_err());
        assert_eq!(*m.lock(), vec![1, 2]);
        *l.write() += 1;
        assert_eq!(*l.read(), 2);
    }
}
