//! A bypass write (write-around, write-through) whose drop range finds no room in the log waits
//! for room with the state lock released. A write of the same block that goes the write-back
//! way meanwhile installs that block's only dirty copy; the drop range, logged after the wait,
//! killed it, and reads of the sectors only that write covered returned older backing data
//! (sim seed 181568, where the other write had found the block dirty and so gone the
//! write-back way; fixed in `path::bypass::log_drop_range`, which looks at its blocks again
//! after each wait). The window is held open with a `failpoint` on the bypass write's thread:
//! which of two writers waiting for room gets it first is the OS scheduler's choice, which the
//! gate devices cannot order.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use super::test_setup::{formatted, shared};
use crate::{Engine, OpenOptions};

/// Far longer than anything here takes on memory devices.
const BOUND: Duration = Duration::from_secs(60);
const SEGMENT_BYTES: u64 = 64 << 10;
const SECTOR_BYTES: u64 = 512;
/// The block both writes reach: sectors 8..16.
const LBA: u64 = 1;

#[test]
fn a_drop_range_logged_after_a_wait_for_room_keeps_a_dirty_copy_made_meanwhile() {
    for mode in ["write-around", "write-through"] {
        let (cache, backing) = formatted((1 << 20) + 32 * SEGMENT_BYTES, 16 << 20, SEGMENT_BYTES);
        backing.write_raw(LBA * 4096, &[0x11; 4096]);
        // Manual mode: nothing writes the RAM buffers out behind the test's back.
        let opts = OpenOptions {
            ram_buffer_bytes: 2 * SEGMENT_BYTES,
            manual_flusher: true,
            seal_interval_ms: Some(0),
            ..OpenOptions::default()
        };
        let e = Engine::open(shared(&cache), shared(&backing), opts.clone()).expect("open");
        e.set_tunable("cache_mode", mode).unwrap();
        // Promoted read misses (clean copies, scattered so no stream) fill both RAM buffers:
        // the log has no room for the bypass write's drop range.
        let mut buf = vec![0u8; 4096];
        let mut filler = 0u64;
        while e.inner.state.lock().ring.open().active {
            assert!(
                filler < 2_000,
                "read misses never filled the RAM buffers: {:?}",
                e.stats()
            );
            e.read((100 + 2 * filler) * 4096, &mut buf)
                .expect("filler read");
            filler += 1;
        }
        // While the bypass write (sectors 9..14) waits for room, a write of sectors 14..16
        // goes the write-back way (as it does in these modes when the block is dirty) and
        // installs the block's only copy of them.
        let hooked = Arc::new(AtomicBool::new(false));
        let hooked_in = hooked.clone();
        e.inner.failpoints.on_bypass_waited_for_room(move |inner| {
            let res = crate::path::write::write(
                inner,
                LBA * 4096 + 6 * SECTOR_BYTES,
                &[0x16; 2 * SECTOR_BYTES as usize],
                true,
            );
            res.expect("the write-back way write");
            hooked_in.store(true, Ordering::SeqCst);
        });
        let (done_tx, done_rx) = mpsc::channel();
        let writer = e.clone();
        std::thread::spawn(move || {
            let res = writer.write(
                LBA * 4096 + SECTOR_BYTES,
                &[0x19; 5 * SECTOR_BYTES as usize],
                false,
            );
            let _ = done_tx.send(res);
        });
        done_rx
            .recv_timeout(BOUND)
            .expect("the bypass write returned")
            .expect("the bypass write");
        assert!(
            hooked.load(Ordering::SeqCst),
            "{mode}: the bypass write never waited for room in the log"
        );
        let mut expect = [0x11u8; 4096];
        expect[SECTOR_BYTES as usize..6 * SECTOR_BYTES as usize].fill(0x19);
        expect[6 * SECTOR_BYTES as usize..].fill(0x16);
        let check = |e: &Engine, when: &str| {
            let mut got = [0u8; 4096];
            e.read(LBA * 4096, &mut got).expect("read");
            for (i, (g, x)) in got.chunks(512).zip(expect.chunks(512)).enumerate() {
                assert!(
                    g == x,
                    "{mode}, {when}: sector {} reads {:#x}, not {:#x} (the write-back way \
                     write's copy was killed by the drop range logged after the wait)",
                    LBA * 8 + i as u64,
                    g[0],
                    x[0]
                );
            }
        };
        check(&e, "at once");
        e.flush().expect("flush");
        e.close().expect("close");
        let e = Engine::open(shared(&cache), shared(&backing), opts).expect("reopen");
        check(&e, "after a reopen");
        e.close().expect("close");
    }
}
