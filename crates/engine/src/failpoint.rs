//! Test-only failpoints: places where a unit test can stop one engine thread to force an
//! interleaving the scheduler cannot reach (the gap between two lock holds of one thread).
//! Compiled only with `cfg(test)`: in every other build the calls are empty inline functions.

#[cfg(test)]
pub use imp::Failpoints;

/// In `Engine::close`, after the lock hold that begins closing and before the wait for the
/// final sync.
#[inline(always)]
pub fn close_between_holds(_inner: &crate::inner::Inner) {
    #[cfg(test)]
    imp::close_between_holds(_inner);
}

/// In `path::bypass::sync_backing` (and `path::alone::sync`), after the backing device's sync
/// failed and before its thread handles the failure.
#[inline(always)]
pub fn backing_sync_failed(_inner: &crate::inner::Inner) {
    #[cfg(test)]
    imp::backing_sync_failed(_inner);
}

/// In `path::bypass::log_drop_range`, after a bypass write waited for room in the log and
/// before it looks at its blocks again: the hook runs with the state lock released, as it was
/// during the wait, so a test can put another write of those blocks in that window.
#[inline(always)]
pub fn bypass_waited_for_room(
    _inner: &crate::inner::Inner,
    _st: &mut crate::sync::MutexGuard<'_, crate::state::State>,
) {
    #[cfg(test)]
    imp::bypass_waited_for_room(_inner, _st);
}

/// The flusher finished one pass of its loop (it is about to wait, step again or exit); called
/// with the state lock held, so a test that saw the count move knows the pass's decision.
#[inline(always)]
pub fn flusher_pass_done(_inner: &crate::inner::Inner) {
    #[cfg(test)]
    _inner.failpoints.pass_done();
}

/// Whether background thread `thread_name`, spawned now by this thread, panics at its start
/// (armed on the spawning thread with `panic_at_next_start`: parallel tests do not see it).
#[inline(always)]
pub fn panics_at_start(_thread_name: &str) -> bool {
    #[cfg(test)]
    return imp::panics_at_start(_thread_name);
    #[cfg(not(test))]
    false
}

#[cfg(test)]
pub use imp::panic_at_next_start;

#[cfg(test)]
mod imp {
    use std::time::Duration;

    use parking_lot::{Condvar, Mutex};

    use crate::inner::Inner;

    type Hook = Box<dyn Fn(&Inner) + Send + Sync>;

    #[derive(Default)]
    pub struct Failpoints {
        close_between_holds: Mutex<Option<Hook>>,
        backing_sync_failed: Mutex<Option<Hook>>,
        bypass_waited_for_room: Mutex<Option<Hook>>,
        flusher_passes: Mutex<u64>,
        flusher_passed: Condvar,
    }

    impl Failpoints {
        /// Runs `hook` (once) at `close_between_holds`.
        pub fn on_close_between_holds(&self, hook: impl Fn(&Inner) + Send + Sync + 'static) {
            *self.close_between_holds.lock() = Some(Box::new(hook));
        }

        /// Runs `hook` (once) at `backing_sync_failed`.
        pub fn on_backing_sync_failed(&self, hook: impl Fn(&Inner) + Send + Sync + 'static) {
            *self.backing_sync_failed.lock() = Some(Box::new(hook));
        }

        /// Runs `hook` (once, with the state lock released) at `bypass_waited_for_room`.
        pub fn on_bypass_waited_for_room(&self, hook: impl Fn(&Inner) + Send + Sync + 'static) {
            *self.bypass_waited_for_room.lock() = Some(Box::new(hook));
        }

        pub fn flusher_passes(&self) -> u64 {
            *self.flusher_passes.lock()
        }

        /// Waits (at most `max`) until the flusher finished a pass after the `seen`th; whether it
        /// did.
        pub fn wait_flusher_pass_after(&self, seen: u64, max: Duration) -> bool {
            let mut n = self.flusher_passes.lock();
            let until = std::time::Instant::now() + max;
            while *n <= seen {
                if self.flusher_passed.wait_until(&mut n, until).timed_out() {
                    return *n > seen;
                }
            }
            true
        }

        pub(super) fn pass_done(&self) {
            *self.flusher_passes.lock() += 1;
            self.flusher_passed.notify_all();
        }
    }

    std::thread_local! {
        static PANIC_AT_START: std::cell::RefCell<Option<String>> =
            const { std::cell::RefCell::new(None) };
    }

    /// The next background thread named `thread_name` this thread spawns panics at its start.
    pub fn panic_at_next_start(thread_name: &str) {
        PANIC_AT_START.with(|p| *p.borrow_mut() = Some(thread_name.to_string()));
    }

    pub(super) fn panics_at_start(thread_name: &str) -> bool {
        PANIC_AT_START.with(|p| {
            let mut p = p.borrow_mut();
            let hit = p.as_deref() == Some(thread_name);
            if hit {
                *p = None;
            }
            hit
        })
    }

    pub(super) fn backing_sync_failed(inner: &Inner) {
        let hook = inner.failpoints.backing_sync_failed.lock().take();
        if let Some(hook) = hook {
            hook(inner);
        }
    }

    pub(super) fn bypass_waited_for_room(
        inner: &Inner,
        st: &mut crate::sync::MutexGuard<'_, crate::state::State>,
    ) {
        let hook = inner.failpoints.bypass_waited_for_room.lock().take();
        if let Some(hook) = hook {
            crate::sync::unlocked(st, || hook(inner));
        }
    }

    pub(super) fn close_between_holds(inner: &Inner) {
        let hook = inner.failpoints.close_between_holds.lock().take();
        if let Some(hook) = hook {
            hook(inner);
        }
    }
}
