//! The engine's locks, condition variables and clock, in one place: every lock acquisition,
//! condition-variable wait and timed decision of the engine goes through these types, so the
//! seeded simulation has one seam to take them over (issue 19: a seed that replays exactly).
//! In the default build they are parking_lot's types and the real clock, nothing added: each
//! method is an inlined call of the one it wraps.

use std::time::{Duration, Instant};

pub use parking_lot::{MutexGuard, RwLockReadGuard, RwLockWriteGuard, WaitTimeoutResult};

/// A mutual-exclusion lock (parking_lot's), whose guards are parking_lot's `MutexGuard`.
#[derive(Default)]
pub struct Mutex<T: ?Sized> {
    inner: parking_lot::Mutex<T>,
}

impl<T> Mutex<T> {
    pub const fn new(value: T) -> Mutex<T> {
        Mutex {
            inner: parking_lot::Mutex::new(value),
        }
    }

    pub fn into_inner(self) -> T {
        self.inner.into_inner()
    }
}

impl<T: ?Sized> Mutex<T> {
    #[inline]
    pub fn lock(&self) -> MutexGuard<'_, T> {
        self.inner.lock()
    }
}

/// Runs `f` with `guard`'s lock released, then takes it again (parking_lot's
/// `MutexGuard::unlocked`, through this seam).
#[inline]
pub fn unlocked<T: ?Sized, R>(guard: &mut MutexGuard<'_, T>, f: impl FnOnce() -> R) -> R {
    MutexGuard::unlocked(guard, f)
}

/// A reader-writer lock (parking_lot's).
#[derive(Default)]
pub struct RwLock<T: ?Sized> {
    inner: parking_lot::RwLock<T>,
}

impl<T: ?Sized> RwLock<T> {
    #[inline]
    pub fn read(&self) -> RwLockReadGuard<'_, T> {
        self.inner.read()
    }

    #[inline]
    pub fn write(&self) -> RwLockWriteGuard<'_, T> {
        self.inner.write()
    }
}

/// A condition variable (parking_lot's) used with [`Mutex`]'s guards.
#[derive(Default)]
pub struct Condvar {
    inner: parking_lot::Condvar,
}

impl Condvar {
    pub const fn new() -> Condvar {
        Condvar {
            inner: parking_lot::Condvar::new(),
        }
    }

    #[inline]
    pub fn wait<T: ?Sized>(&self, guard: &mut MutexGuard<'_, T>) {
        self.inner.wait(guard)
    }

    #[inline]
    pub fn wait_for<T: ?Sized>(
        &self,
        guard: &mut MutexGuard<'_, T>,
        timeout: Duration,
    ) -> WaitTimeoutResult {
        self.inner.wait_for(guard, timeout)
    }

    /// Waits until `deadline`, a time read from [`now`].
    #[inline]
    pub fn wait_until<T: ?Sized>(
        &self,
        guard: &mut MutexGuard<'_, T>,
        deadline: Instant,
    ) -> WaitTimeoutResult {
        self.inner.wait_until(guard, deadline)
    }

    #[inline]
    pub fn notify_one(&self) -> bool {
        self.inner.notify_one()
    }

    #[inline]
    pub fn notify_all(&self) -> usize {
        self.inner.notify_all()
    }
}

/// The time the engine's timed decisions read (the periodic seal, writeback's polling and
/// pacing, retry deadlines). Durations reported to the user (recovery time) read the real
/// clock directly.
#[inline]
pub fn now() -> Instant {
    Instant::now()
}
