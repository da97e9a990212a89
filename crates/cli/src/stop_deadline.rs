//! A bound on how long `serve` takes to stop. Stopping finishes the NBD requests in flight,
//! writes the cache log, joins the writeback thread and closes the backing device; each of
//! these may wait for the backing device, and a backing device that does not answer (a dead
//! Ceph cluster, an NBD server gone) must not keep a SIGTERMed serve alive for ever. Once armed,
//! a watchdog thread gives the stop `limit`; past it, it prints one line naming the step and the
//! backing device and ends the process with `_exit(1)`. That is no worse than a SIGKILL, which
//! the cache survives by design: what clients flushed is in the cache device's log, and the
//! next serve recovers it and writes the dirty blocks back.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The watchdog's view of the stop.
struct Shared {
    /// The step now running (for the message); `None` once the stop finished.
    step: Mutex<Option<&'static str>>,
    finished: Condvar,
}

pub struct StopDeadline {
    shared: Arc<Shared>,
    limit: Duration,
    backing: String,
    armed: Mutex<bool>,
}

impl StopDeadline {
    /// A deadline of `limit` for the stop of a serve of `backing`; not running until `arm`.
    pub fn new(limit: Duration, backing: &str) -> StopDeadline {
        assert!(!limit.is_zero());
        StopDeadline {
            shared: Arc::new(Shared {
                step: Mutex::new(Some("stopping")),
                finished: Condvar::new(),
            }),
            limit,
            backing: backing.to_string(),
            armed: Mutex::new(false),
        }
    }

    /// Starts the clock (once; later calls do nothing). `dirty_bytes` is the dirty data at
    /// the stop, for the message.
    pub fn arm(&self, dirty_bytes: u64) {
        let mut armed = lock(&self.armed);
        if *armed {
            return;
        }
        *armed = true;
        let shared = self.shared.clone();
        let limit = self.limit;
        let backing = self.backing.clone();
        let deadline = Instant::now() + limit;
        let watchdog = move || {
            let mut step = lock(&shared.step);
            while step.is_some() {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                step = match shared.finished.wait_timeout(step, left) {
                    Ok((guard, _)) => guard,
                    Err(poisoned) => poisoned.into_inner().0,
                };
            }
            let Some(what) = *step else { return };
            eprintln!(
                "logcache: stopping did not finish within {} s ({what}): the backing device {backing} \
                 does not answer; exiting without a clean checkpoint. What clients flushed is in \
                 the cache device's log; the dirty data ({}) stays there, and the next serve \
                 recovers it and writes it back once the backing device answers",
                limit.as_secs(),
                crate::size::human(dirty_bytes),
            );
            // SAFETY: ends the process at once, as a SIGKILL would; no destructor runs (some
            // would wait for the same backing device).
            unsafe { libc::_exit(1) };
        };
        if std::thread::Builder::new()
            .name("stop-deadline".into())
            .spawn(watchdog)
            .is_err()
        {
            eprintln!("logcache: warning: no thread for the stop's deadline; stopping without one");
        }
    }

    /// Names the step now running, for the message if the deadline passes during it.
    pub fn step(&self, what: &'static str) {
        let mut step = lock(&self.shared.step);
        if step.is_some() {
            *step = Some(what);
        }
    }

    /// The stop is over: the watchdog ends without doing anything.
    pub fn finish(&self) {
        *lock(&self.shared.step) = None;
        self.shared.finished.notify_all();
    }
}

impl Drop for StopDeadline {
    fn drop(&mut self) {
        self.finish();
    }
}

/// A lock that a panicking holder poisoned is still usable: the values here are plain.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
