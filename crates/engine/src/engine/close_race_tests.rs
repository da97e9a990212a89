//! `Engine::close` against the flusher's idle wake, forced with the `failpoint`s: the window
//! b6204ea closed. `close` used to set `closing`, let the lock go, and only then seal and ask
//! for the final sync; a flusher waking in that gap saw `closing` with nothing asked and
//! exited, and `close` then waited forever for a sync (an intermittent hang of `model.rs`).
//! Here the gap is held open on purpose: `close` stops between its two lock holds until the
//! flusher has made one decision. The wait for `close` is bounded, so a regression fails the
//! test instead of hanging CI.

use std::sync::mpsc;
use std::time::Duration;

use super::test_setup::{close_on_a_thread, formatted, shared};
use crate::{Engine, OpenOptions};

/// Far longer than the flusher needs for one pass and one sync on memory devices.
const BOUND: Duration = Duration::from_secs(30);

#[test]
fn close_survives_a_flusher_wake_between_its_lock_holds() {
    let (cache, backing) = formatted(4 << 20, 4 << 20, 64 << 10);
    let opts = OpenOptions {
        // No periodic seal: the write stays in the open chunk until `close` seals it.
        seal_interval_ms: Some(0),
        ..OpenOptions::default()
    };
    let open = || Engine::open(shared(&cache), shared(&backing), opts.clone()).expect("open");
    let e = open();
    let data = vec![0x5au8; 4096];
    e.write(8192, &data, false).expect("write");

    let (woke_tx, woke_rx) = mpsc::channel();
    e.inner.failpoints.on_close_between_holds(move |inner| {
        // The flusher's idle wake (its timer, or any notify) lands in the gap.
        let seen = inner.failpoints.flusher_passes();
        inner.flusher_wake.notify_all();
        let woke = inner.failpoints.wait_flusher_pass_after(seen, BOUND);
        woke_tx.send(woke).expect("the test waits");
    });
    let done_rx = close_on_a_thread(e.clone());
    assert!(
        woke_rx
            .recv_timeout(BOUND)
            .expect("close reached the failpoint"),
        "the flusher made no decision while close was between its lock holds"
    );
    match done_rx.recv_timeout(BOUND) {
        Ok(r) => r.expect("close"),
        Err(_) => panic!(
            "close hangs: the flusher woke between close's lock holds, saw closing with no sync \
             asked and exited, so the final sync never comes"
        ),
    }
    // Closed cleanly: the unflushed write is on the cache device and reads back.
    let e = open();
    let mut back = vec![0u8; 4096];
    e.read(8192, &mut back).expect("read");
    assert_eq!(back, data, "the write close made durable");
    e.close().expect("close again");
}
