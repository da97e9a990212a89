//! A writer waiting for room and the flusher wake each other only on progress. When the head
//! cannot move (a backing zeroing held: the zero range must stay in the log until the zeros
//! land), a flusher round that changed nothing used to wake every waiter anyway; the writer
//! found no room, waited again and woke the flusher, whose next round woke it again. Both
//! burnt CPU until the zeroing landed, and the simulation's loss schedules (seeds 3176, 3180,
//! 6198) ended in "the process never became quiescent". Counted here, not timed: the writer's
//! waits per flusher round.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use logcache_testkit::fault::OpKind;
use logcache_testkit::gate::GateDevice;

use super::test_setup::{formatted, shared};
use crate::io::BlockDevice;
use crate::{Engine, OpenOptions};

/// Far longer than anything here takes on memory devices.
const BOUND: Duration = Duration::from_secs(60);
const SEGMENT_BYTES: u64 = 64 << 10;
/// Flusher rounds counted while the writer waits.
const ROUNDS: u64 = 12;

#[test]
fn a_writer_waiting_for_room_is_not_woken_by_flusher_rounds_that_change_nothing() {
    let (cache, backing_mem) = formatted((1 << 20) + 32 * SEGMENT_BYTES, 16 << 20, SEGMENT_BYTES);
    let backing = Arc::new(GateDevice::new(shared(&backing_mem)));
    let opts = OpenOptions {
        ram_buffer_bytes: 4 * SEGMENT_BYTES,
        seal_interval_ms: Some(0),
        ..OpenOptions::default()
    };
    let b: Arc<dyn BlockDevice> = backing.clone();
    let e = Engine::open(shared(&cache), b, opts).expect("open");
    // A write-zeroes whose backing zeroing is held keeps its zero range, and the head, in the
    // log until the zeros land.
    let lba = 200u64;
    e.write(lba * 4096, &[0x33; 4096], false).expect("write");
    backing.hold(OpKind::Discard);
    let zeroer = e.clone();
    let zeroing = std::thread::spawn(move || zeroer.write_zeroes(lba * 4096, 4096, false));
    assert!(
        backing.wait_held(OpKind::Discard, 1, BOUND),
        "the write-zeroes never zeroed the backing device"
    );
    e.flush().expect("flush");
    // Rewrites of a pool of blocks, with no flush, until the ring is full and a write waits.
    let stop = Arc::new(AtomicBool::new(false));
    let (writer, stop2) = (e.clone(), stop.clone());
    let rewrites = std::thread::spawn(move || {
        for i in 0..1_000_000u64 {
            if stop2.load(Ordering::SeqCst) {
                return;
            }
            let block = 1000 + i % 64;
            if writer.write(block * 4096, &[i as u8; 4096], false).is_err() {
                return;
            }
        }
    });
    let until = Instant::now() + BOUND;
    let waits_before = e.stats().counters.write_waits;
    while !(e.stats().segments_free <= 1 && e.stats().counters.write_waits > waits_before) {
        assert!(
            Instant::now() < until,
            "the rewrites never filled the ring: {:?}",
            e.stats()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // Let what is still moving settle (the last chunks written, relocations), then count.
    let passes = &e.inner.failpoints;
    let wait_rounds = |n: u64| {
        let seen = passes.flusher_passes();
        for i in 0..n {
            assert!(
                passes.wait_flusher_pass_after(seen + i, BOUND),
                "the flusher made no round in {BOUND:?}"
            );
        }
    };
    wait_rounds(ROUNDS);
    let (s0, waits0) = (e.stats(), e.stats().counters.write_waits);
    wait_rounds(ROUNDS);
    let s1 = e.stats();
    let waits = s1.counters.write_waits - waits0;
    assert_eq!(
        (s0.head_segment_id, s0.segments_free),
        (s1.head_segment_id, s1.segments_free),
        "room changed while the zeroing was held"
    );
    assert!(
        waits * 2 < ROUNDS,
        "the writer waited for room {waits} times in {ROUNDS} flusher rounds that changed \
         nothing: each round woke it, and each of its waits woke the flusher"
    );
    stop.store(true, Ordering::SeqCst);
    backing.release(OpKind::Discard);
    zeroing
        .join()
        .expect("zeroing thread")
        .expect("write-zeroes");
    rewrites.join().expect("rewrite thread");
    e.close().expect("close");
}
