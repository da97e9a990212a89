//! Writeback at a background rate pauses between batches. A writer that comes to wait for
//! room (or a ring head that waits for its dirty blocks) meanwhile needs writeback now: the
//! pause ends then instead of at its deadline. Before, the writer waited the pause out
//! (80-200 ms at a time in `bench engine`, a quarter of its run: BENCHMARKS.md, issue 20).
//! Counted, not timed: a pause cut short is counted only when it ended before its deadline.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::test_setup::{formatted, shared};
use crate::{Engine, OpenOptions};

/// Far longer than anything here takes on memory devices.
const BOUND: Duration = Duration::from_secs(60);
const SEGMENT_BYTES: u64 = 64 << 10;

#[test]
fn a_writer_waiting_for_room_cuts_writebacks_paced_pause_short() {
    let (cache, backing) = formatted((1 << 20) + 32 * SEGMENT_BYTES, 16 << 20, SEGMENT_BYTES);
    let opts = OpenOptions {
        ram_buffer_bytes: 4 * SEGMENT_BYTES,
        ..OpenOptions::default()
    };
    let e = Engine::open(shared(&cache), shared(&backing), opts).expect("open");
    // Every dirty block over the threshold, at the slowest rate: 256 blocks a second, a
    // pause of about a quarter second after each batch.
    e.set_tunable("writeback_threshold_percent", "0")
        .expect("threshold");
    e.set_tunable("writeback_rate_max_mib", "1").expect("rate");
    // Rewrites of a span half the ring's size, so its head always holds dirty blocks.
    let stop = Arc::new(AtomicBool::new(false));
    let (writer, stop2) = (e.clone(), stop.clone());
    let rewrites = std::thread::spawn(move || {
        let mut i = 0u64;
        while !stop2.load(Ordering::SeqCst) {
            let block = (i * 7919) % 256;
            writer
                .write(block * 4096, &[i as u8; 4096], false)
                .expect("write");
            i += 1;
        }
    });
    let until = Instant::now() + BOUND;
    while e.stats().counters.writeback_pauses_cut == 0 {
        assert!(
            Instant::now() < until,
            "no paced pause of writeback was cut short in {BOUND:?} of writers waiting for \
             room: {:?}",
            e.stats().counters
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    stop.store(true, Ordering::SeqCst);
    rewrites.join().expect("the writer");
    let c = e.stats().counters;
    assert!(c.write_waits > 0 && c.writeback_batches > 0, "{c:?}");
    e.close().expect("close");
}
