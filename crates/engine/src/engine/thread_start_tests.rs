//! A background thread that panics at its very start, before its loop, fails the engine: status
//! reports it and requests get the error. The start (the simulation's start wait) used to run
//! outside the thread's `catch_unwind`, so such a panic left the engine with no flusher (or no
//! writeback) while it reported itself healthy, and every flush then waited for ever (issue
//! 19). The panic is a test-only failpoint at the start (`failpoint::panic_at_next_start`);
//! the engine runs with real threads and the real clock, no simulation.

use std::time::{Duration, Instant};

use super::test_setup::{close_on_a_thread, formatted, shared};
use crate::{Engine, OpenOptions};

/// Far longer than a thread needs to start and fail the engine.
const BOUND: Duration = Duration::from_secs(30);

#[test]
fn a_flusher_panicking_at_its_start_fails_the_engine() {
    fails_the_engine_at_start("logcache-flusher", "flusher");
}

#[test]
fn a_writeback_thread_panicking_at_its_start_fails_the_engine() {
    fails_the_engine_at_start("logcache-writeback", "writeback");
}

fn fails_the_engine_at_start(thread_name: &str, what: &str) {
    let (cache, backing) = formatted(4 << 20, 4 << 20, 64 << 10);
    crate::failpoint::panic_at_next_start(thread_name);
    let e = Engine::open(shared(&cache), shared(&backing), OpenOptions::default()).expect("open");
    let until = Instant::now() + BOUND;
    let failed = loop {
        if let Some(failed) = e.stats().failed {
            break failed;
        }
        assert!(
            Instant::now() < until,
            "the {what} thread panicked at its start and status still says healthy after {BOUND:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(
        failed.contains(&format!("the {what} thread panicked"))
            && failed.contains("panics at its start"),
        "status: {failed}"
    );
    // Requests get the reason instead of waiting for a thread that is gone.
    let err = e
        .write(0, &[0x5a; 4096], true)
        .expect_err("a write to a failed engine");
    assert!(
        err.to_string()
            .contains(&format!("the {what} thread panicked")),
        "{err}"
    );
    assert!(e.flush().is_err(), "a flush on a failed engine");
    // And close returns (it used to wait for a sync no flusher would do).
    let _closed = close_on_a_thread(e)
        .recv_timeout(BOUND)
        .expect("close returned on the failed engine");
}
