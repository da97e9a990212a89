//! `sync`'s types over loom's (feature `loom`): the same calls the engine makes on parking_lot's
//! types (a guard passed by `&mut` to a wait, `unlocked`), so the engine's own code runs under
//! the model checker unchanged. Loom does not model time: a timed wait here waits for a
//! notification like an untimed one, and never times out (so a protocol that needs a timeout
//! to make progress shows up as a deadlock).

use std::ops::{Deref, DerefMut};
use std::time::{Duration, Instant};

pub use ::loom::sync::{RwLockReadGuard, RwLockWriteGuard};

/// A mutual-exclusion lock (loom's).
#[derive(Default)]
pub struct Mutex<T> {
    inner: ::loom::sync::Mutex<T>,
}

/// Loom's guard and the lock it came from, so a wait can give the lock up and take it again
/// through `&mut`, as parking_lot's guards do.
pub struct MutexGuard<'a, T> {
    mutex: &'a ::loom::sync::Mutex<T>,
    /// `None` only inside a wait or `unlocked`.
    guard: Option<::loom::sync::MutexGuard<'a, T>>,
}

impl<T> Mutex<T> {
    pub fn new(value: T) -> Mutex<T> {
        Mutex {
            inner: ::loom::sync::Mutex::new(value),
        }
    }

    pub fn into_inner(self) -> T {
        self.inner.into_inner().expect("a poisoned lock")
    }

    pub fn lock(&self) -> MutexGuard<'_, T> {
        MutexGuard {
            mutex: &self.inner,
            guard: Some(self.inner.lock().expect("a poisoned lock")),
        }
    }
}

impl<'a, T> MutexGuard<'a, T> {
    fn release(&mut self) -> ::loom::sync::MutexGuard<'a, T> {
        self.guard.take().expect("the guard holds its lock")
    }
}

impl<T> Deref for MutexGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.guard.as_deref().expect("the guard holds its lock")
    }
}

impl<T> DerefMut for MutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.guard.as_deref_mut().expect("the guard holds its lock")
    }
}

/// Runs `f` with `guard`'s lock released, then takes it again.
pub fn unlocked<T, R>(guard: &mut MutexGuard<'_, T>, f: impl FnOnce() -> R) -> R {
    drop(guard.guard.take().expect("the guard holds its lock"));
    let r = f();
    guard.guard = Some(guard.mutex.lock().expect("a poisoned lock"));
    r
}

/// A reader-writer lock (loom's).
#[derive(Default)]
pub struct RwLock<T> {
    inner: ::loom::sync::RwLock<T>,
}

impl<T> RwLock<T> {
    pub fn read(&self) -> RwLockReadGuard<'_, T> {
        self.inner.read().expect("a poisoned lock")
    }

    pub fn write(&self) -> RwLockWriteGuard<'_, T> {
        self.inner.write().expect("a poisoned lock")
    }
}

/// A condition variable (loom's) used with [`Mutex`]'s guards.
#[derive(Default)]
pub struct Condvar {
    inner: ::loom::sync::Condvar,
}

impl Condvar {
    pub fn new() -> Condvar {
        Condvar {
            inner: ::loom::sync::Condvar::new(),
        }
    }

    pub fn wait<T>(&self, guard: &mut MutexGuard<'_, T>) {
        let g = self.inner.wait(guard.release()).expect("a poisoned lock");
        guard.guard = Some(g);
    }

    /// Waits for a notification (loom never times out); false: not timed out.
    pub fn wait_for<T>(&self, guard: &mut MutexGuard<'_, T>, _timeout: Duration) -> bool {
        self.wait(guard);
        false
    }

    /// As [`Condvar::wait_for`].
    pub fn wait_until<T>(&self, guard: &mut MutexGuard<'_, T>, _deadline: Instant) -> bool {
        self.wait(guard);
        false
    }

    /// Loom does not say whether anyone was woken: true, as if someone was.
    pub fn notify_one(&self) -> bool {
        self.inner.notify_one();
        true
    }

    /// Loom does not say how many were woken: 0.
    pub fn notify_all(&self) -> usize {
        self.inner.notify_all();
        0
    }
}
