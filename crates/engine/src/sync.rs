//! The engine's locks, condition variables and clock, in one place: every lock acquisition,
//! condition-variable wait and timed decision of the engine goes through these types, so the
//! seeded simulation has one seam to take them over (issue 19: a seed that replays exactly).
//! In the default build they are parking_lot's types and the real clock, nothing added: each
//! method is an inlined call of the one it wraps.
//!
//! With the `sim` feature (the engine's own tests turn it on) and a [`sim::Hook`] installed,
//! the simulation runs one engine thread at a time: a lock found taken, a condition-variable
//! wait (woken or timed out), a new thread's start and every IO (the test's devices) are
//! points where the running thread stops and the scheduler picks the next one from its seed,
//! and [`now`] is the scheduler's virtual clock, moved only when it fires a timed wait. A seed
//! then names one schedule, replayed exactly.
//!
//! With the `loom` feature the locks and condition variables are loom's instead (`loom.rs`),
//! for the model checker's exhaustive tests of small protocols (the admission queue); the
//! simulation's seam is off then, and such an engine runs only inside `loom::model`.

#[cfg(not(feature = "loom"))]
use std::time::Duration;
use std::time::Instant;

#[cfg(not(feature = "loom"))]
pub use parking_lot::{MutexGuard, RwLockReadGuard, RwLockWriteGuard, WaitTimeoutResult};

#[cfg(feature = "loom")]
mod loom;
#[cfg(feature = "loom")]
pub use self::loom::{
    unlocked, Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard,
};

#[cfg(not(feature = "loom"))]
/// A mutual-exclusion lock (parking_lot's), whose guards are parking_lot's `MutexGuard`.
#[derive(Default)]
pub struct Mutex<T: ?Sized> {
    inner: parking_lot::Mutex<T>,
}

#[cfg(not(feature = "loom"))]
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

#[cfg(not(feature = "loom"))]
impl<T: ?Sized> Mutex<T> {
    #[inline]
    pub fn lock(&self) -> MutexGuard<'_, T> {
        #[cfg(feature = "sim")]
        sim::wait_mutex_free(&self.inner);
        self.inner.lock()
    }
}

#[cfg(not(feature = "loom"))]
/// Runs `f` with `guard`'s lock released, then takes it again (parking_lot's
/// `MutexGuard::unlocked`, through this seam).
#[inline]
pub fn unlocked<T: ?Sized, R>(guard: &mut MutexGuard<'_, T>, f: impl FnOnce() -> R) -> R {
    #[cfg(feature = "sim")]
    {
        let mutex = MutexGuard::mutex(guard);
        MutexGuard::unlocked(guard, || {
            let r = f();
            sim::wait_mutex_free(mutex);
            r
        })
    }
    #[cfg(not(feature = "sim"))]
    MutexGuard::unlocked(guard, f)
}

#[cfg(not(feature = "loom"))]
/// A reader-writer lock (parking_lot's).
#[derive(Default)]
pub struct RwLock<T: ?Sized> {
    inner: parking_lot::RwLock<T>,
}

#[cfg(not(feature = "loom"))]
impl<T: ?Sized> RwLock<T> {
    #[inline]
    pub fn read(&self) -> RwLockReadGuard<'_, T> {
        #[cfg(feature = "sim")]
        sim::wait_free(&self.inner, |l| l.is_locked_exclusive());
        self.inner.read()
    }

    #[inline]
    pub fn write(&self) -> RwLockWriteGuard<'_, T> {
        #[cfg(feature = "sim")]
        sim::wait_free(&self.inner, |l| l.is_locked());
        self.inner.write()
    }
}

#[cfg(not(feature = "loom"))]
/// A condition variable (parking_lot's) used with [`Mutex`]'s guards.
#[derive(Default)]
pub struct Condvar {
    inner: parking_lot::Condvar,
}

#[cfg(not(feature = "loom"))]
impl Condvar {
    pub const fn new() -> Condvar {
        Condvar {
            inner: parking_lot::Condvar::new(),
        }
    }

    #[inline]
    pub fn wait<T: ?Sized>(&self, guard: &mut MutexGuard<'_, T>) {
        #[cfg(feature = "sim")]
        if sim::wait(self, guard, None).is_some() {
            return;
        }
        self.inner.wait(guard)
    }

    /// Waits for a notification or `timeout`; true if it timed out.
    #[inline]
    pub fn wait_for<T: ?Sized>(&self, guard: &mut MutexGuard<'_, T>, timeout: Duration) -> bool {
        #[cfg(feature = "sim")]
        if let Some(timed_out) = sim::wait(self, guard, Some(timeout)) {
            return timed_out;
        }
        self.inner.wait_for(guard, timeout).timed_out()
    }

    /// Waits until `deadline`, a time read from [`now`]; true if it timed out.
    #[inline]
    pub fn wait_until<T: ?Sized>(&self, guard: &mut MutexGuard<'_, T>, deadline: Instant) -> bool {
        #[cfg(feature = "sim")]
        if let Some(timed_out) =
            sim::wait(self, guard, Some(deadline.saturating_duration_since(now())))
        {
            return timed_out;
        }
        self.inner.wait_until(guard, deadline).timed_out()
    }

    #[inline]
    pub fn notify_one(&self) -> bool {
        #[cfg(feature = "sim")]
        sim::notify(self, false);
        self.inner.notify_one()
    }

    #[inline]
    pub fn notify_all(&self) -> usize {
        #[cfg(feature = "sim")]
        sim::notify(self, true);
        self.inner.notify_all()
    }
}

/// The time the engine's timed decisions read (the periodic seal, writeback's polling and
/// pacing, retry deadlines). Durations reported to the user (recovery time) read the real
/// clock directly.
#[inline]
pub fn now() -> Instant {
    #[cfg(all(feature = "sim", not(feature = "loom")))]
    if let Some(h) = sim::hook() {
        return h.now();
    }
    Instant::now()
}

/// Taken by a thread's spawner before it spawns it; the new thread calls [`Start::wait`]
/// first. Under the simulation the new thread then starts when the scheduler says (not beside
/// its spawner); otherwise nothing (zero-sized).
#[must_use]
pub struct Start {
    #[cfg(all(feature = "sim", not(feature = "loom")))]
    ticket: Option<(std::sync::Arc<dyn sim::Hook>, u64)>,
}

impl Start {
    #[inline]
    pub fn begin() -> Start {
        Start {
            #[cfg(all(feature = "sim", not(feature = "loom")))]
            ticket: sim::hook().map(|h| {
                let t = h.start_begin();
                (h, t)
            }),
        }
    }

    /// Returns when the new thread may run: false if it must not (the simulation's power
    /// was cut before it started). Always true outside the simulation.
    #[inline]
    pub fn wait(self) -> bool {
        #[cfg(all(feature = "sim", not(feature = "loom")))]
        if let Some((h, t)) = self.ticket {
            let go = h.start_wait(t);
            if go {
                sim::injected_panic();
            }
            return go;
        }
        true
    }
}

/// The simulation's seam: a scheduler installed with [`install`] takes over every blocking
/// point of the module above. Test-only (feature `sim`).
#[cfg(all(feature = "sim", not(feature = "loom")))]
pub mod sim {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::MutexGuard;

    /// What the simulation's scheduler does at each blocking point. `id`s are addresses: they
    /// match a wait with its notifications, they never order anything.
    pub trait Hook: Send + Sync {
        /// Whether one thread runs at a time now (else locks and waits behave as usual).
        fn scheduled(&self) -> bool;
        /// The lock at `id` is taken: returns when this thread may look again.
        fn lock_wait(&self, id: usize);
        /// A wait on the condition variable `cv` begins, with its lock still held (so no
        /// notification is missed); `timeout`: a timed wait. Returns its ticket.
        fn wait_begin(&self, cv: usize, timeout: Option<Duration>) -> u64;
        /// Blocks (the lock released) until the scheduler lets the waiter go: true if its timer
        /// fired rather than a notification.
        fn wait_end(&self, ticket: u64) -> bool;
        fn notify(&self, cv: usize, all: bool);
        /// The virtual clock.
        fn now(&self) -> Instant;
        /// A thread is about to be spawned; it calls `start_wait` with the ticket first.
        fn start_begin(&self) -> u64;
        /// False: the simulated power is off by then, the thread must not run.
        fn start_wait(&self, ticket: u64) -> bool;
    }

    static INSTALLED: AtomicBool = AtomicBool::new(false);
    static HOOK: parking_lot::RwLock<Option<Arc<dyn Hook>>> = parking_lot::RwLock::new(None);
    /// `inject_panic`'s thread name, while armed.
    static PANIC_ARMED: AtomicBool = AtomicBool::new(false);
    static PANIC_IN: parking_lot::Mutex<Option<String>> = parking_lot::Mutex::new(None);

    /// Arms (or disarms, `None`) one panic: the next engine thread named `thread` to pass the
    /// seam (a lock, a wait, its start) panics there. For the simulation's own test that a
    /// panicking background thread fails the schedule instead of hanging it or going unseen.
    pub fn inject_panic(thread: Option<&str>) {
        *PANIC_IN.lock() = thread.map(str::to_string);
        PANIC_ARMED.store(thread.is_some(), Ordering::SeqCst);
    }

    /// Whether the armed panic fired (and was disarmed by it).
    pub fn injected_panic_fired() -> bool {
        !PANIC_ARMED.load(Ordering::SeqCst) && PANIC_IN.lock().is_some()
    }

    pub(crate) fn injected_panic() {
        if !PANIC_ARMED.load(Ordering::Relaxed) {
            return;
        }
        let name = std::thread::current().name().unwrap_or("").to_string();
        if PANIC_IN.lock().as_deref() != Some(name.as_str()) {
            return;
        }
        if PANIC_ARMED.swap(false, Ordering::SeqCst) {
            panic!("injected panic in {name} (sync::sim::inject_panic)");
        }
    }

    /// Installs (or removes) the process's scheduler: one simulation per process.
    pub fn install(hook: Option<Arc<dyn Hook>>) {
        INSTALLED.store(hook.is_some(), Ordering::SeqCst);
        *HOOK.write() = hook;
    }

    pub(crate) fn hook() -> Option<Arc<dyn Hook>> {
        if !INSTALLED.load(Ordering::Relaxed) {
            return None;
        }
        HOOK.read().clone()
    }

    /// Returns once `lock` is free, waiting for the scheduler while it is taken. One thread
    /// runs at a time, so it is still free when the caller takes it next.
    pub(crate) fn wait_free<L: ?Sized>(lock: &L, taken: impl Fn(&L) -> bool) {
        let Some(h) = hook() else { return };
        injected_panic();
        while h.scheduled() && taken(lock) {
            h.lock_wait(lock as *const L as *const () as usize);
        }
    }

    pub(crate) fn wait_mutex_free<T: ?Sized>(mutex: &parking_lot::Mutex<T>) {
        wait_free(mutex, |m| m.is_locked());
    }

    /// A wait through the scheduler: `None` if no scheduler is installed.
    pub(crate) fn wait<T: ?Sized>(
        cv: &super::Condvar,
        guard: &mut MutexGuard<'_, T>,
        timeout: Option<Duration>,
    ) -> Option<bool> {
        let h = hook()?;
        injected_panic();
        let ticket = h.wait_begin(cv as *const _ as usize, timeout);
        let mutex = MutexGuard::mutex(guard);
        Some(MutexGuard::unlocked(guard, || {
            let timed_out = h.wait_end(ticket);
            wait_mutex_free(mutex);
            timed_out
        }))
    }

    pub(crate) fn notify(cv: &super::Condvar, all: bool) {
        if let Some(h) = hook() {
            h.notify(cv as *const _ as usize, all);
        }
    }
}
