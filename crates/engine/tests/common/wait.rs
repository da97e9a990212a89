//! Waiting in tests with threads: a step that must end, a condition that must come true, both
//! bounded by `HANG`, so a defect that hangs fails the test with a line saying what hung.

use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long a step may take before a test calls it a hang (generous: a loaded 2-core CI).
pub const HANG: Duration = Duration::from_secs(60);

/// Runs `f` on its own thread; panics if it does not return within `HANG`.
pub fn bounded<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(HANG) {
        Ok(v) => v,
        Err(_) => panic!("{what} hung (no answer in {HANG:?})"),
    }
}

/// Polls `cond` until it holds or `HANG` passes; returns whether it held.
pub fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + HANG;
    while Instant::now() < until {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    cond()
}
