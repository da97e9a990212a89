//! Regression tests for defects found in review (issue 19), each confirmed failing before its
//! fix: a relocator read error that stopped the flusher silently (a hang), the periodic seal
//! that stopped under ring pressure, a write-around read that promoted stale backing data, and
//! a zero range that left the log before the zeros reached the backing device.
//!
//! The threaded tests bound every wait: a hang is reported as a failure, never waited out.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::wait::{bounded, eventually, HANG};
use common::*;
use logcache_engine::io::BlockDevice;
use logcache_engine::{Engine, Error, OpenOptions};
use logcache_testkit::fault::{FaultDevice, FaultKind, OpKind};
use logcache_testkit::gate::GateDevice;
use logcache_testkit::sim::SimDevice;

const KIB: u64 = 1024;
const MIB: u64 = 1 << 20;
const SEG_64K: u64 = 64 * KIB;

/// An engine on `pair` whose backing device can fail (`FaultDevice`) and be held (`GateDevice`,
/// outermost).
fn faulty_gated_engine(
    pair: &SimPair,
    opts: OpenOptions,
) -> (Arc<FaultDevice>, Arc<GateDevice>, Engine) {
    let faulty = Arc::new(FaultDevice::new(pair.backing()));
    let backing = Arc::new(GateDevice::new(faulty.clone()));
    let e = Engine::open(pair.cache(), backing.clone(), opts).unwrap();
    (faulty, backing, e)
}

/// Manual mode with a one-second periodic seal (`seal_if_due` seals only when told the time).
fn sealing_each_second() -> OpenOptions {
    OpenOptions {
        seal_interval_ms: Some(1000),
        ..manual(4 * SEG_64K)
    }
}

/// Defect 3: a cache read error in the relocator (background threads) fails the engine with a
/// reason that status shows and requests receive; before the fix the flusher thread exited
/// quietly, and every later flush and room-waiting write hung.
/// An engine over `pair` whose backing device is behind a gate (small RAM, no periodic seal).
fn gated_engine(pair: &SimPair) -> (Arc<GateDevice>, Engine) {
    let backing = Arc::new(GateDevice::new(pair.backing()));
    let opts = OpenOptions {
        ram_buffer_bytes: 4 * SEG_64K,
        seal_interval_ms: Some(0),
        ..OpenOptions::default()
    };
    let e = Engine::open(pair.cache(), backing.clone(), opts).unwrap();
    (backing, e)
}

/// An engine whose cache device can be made to fail (`FaultDevice`), over `backing`, with the
/// options `gated_engine` uses.
fn failing_cache_engine(
    pair: &SimPair,
    backing: Arc<dyn BlockDevice>,
) -> (Arc<FaultDevice>, Engine) {
    let cache = Arc::new(FaultDevice::new(pair.cache()));
    let opts = OpenOptions {
        ram_buffer_bytes: 4 * SEG_64K,
        seal_interval_ms: Some(0),
        ..OpenOptions::default()
    };
    let e = Engine::open(cache.clone(), backing, opts).unwrap();
    (cache, e)
}

/// Fails the cache device under a write-back write's flush (of block 20): the disk goes on from
/// the backing device alone.
fn fail_cache_under_a_flush(e: &Engine, cache: &FaultDevice) {
    cache.fail_next(OpKind::Write, u64::MAX, FaultKind::Io);
    let other = e.clone();
    bounded("a write and flush as the cache device fails", move || {
        other.write(20 * 4096, &[0x6b; 4096], false)?;
        other.flush()
    })
    .expect("answered from the backing device alone");
    assert!(e.stats().serving_alone, "{:?}", e.stats());
}

/// Starts a write-zeroes of block `lba` and waits until its backing zeroing is held.
fn held_zeroing(
    e: &Engine,
    backing: &GateDevice,
    lba: u64,
) -> std::thread::JoinHandle<Result<(), Error>> {
    backing.hold(OpKind::Discard);
    let zeroer = e.clone();
    let zeroing = std::thread::spawn(move || zeroer.write_zeroes(lba * 4096, 4096, false));
    assert!(
        backing.wait_held(OpKind::Discard, 1, HANG),
        "the write-zeroes never zeroed the backing device"
    );
    zeroing
}

#[test]
fn a_relocator_read_error_fails_the_engine_instead_of_hanging() {
    let pair = SimPair::new(MIB + 32 * SEG_64K, 64 * MIB, SEG_64K);
    let cache = Arc::new(FaultDevice::new(pair.cache()));
    // No writeback (the backing device fails writes): the ring wraps onto dirty blocks, which
    // only the relocator can move.
    let backing = Arc::new(FaultDevice::new(pair.backing()));
    backing.fail_next(OpKind::Write, u64::MAX, FaultKind::Io);
    let opts = OpenOptions {
        ram_buffer_bytes: 2 * SEG_64K,
        seal_interval_ms: Some(0),
        ..OpenOptions::default()
    };
    let e = Engine::open(cache.clone(), backing, opts).unwrap();
    // The relocator moves dirty blocks only in sorted writeback order.
    e.set_tunable("writeback_order", "sorted").unwrap();
    let (cold, hot) = (160u64, 16u64);
    for b in 0..cold {
        e.write(b * 4096, &[b as u8; 4096], false).unwrap();
    }
    e.flush().unwrap();
    // Every cache read fails from now on: the relocator's read of the head segment too.
    cache.fail_next(OpKind::Read, u64::MAX, FaultKind::Io);
    let writer = e.clone();
    let err = bounded("writes while the relocator fails", move || {
        for round in 0..256u64 {
            for b in cold..cold + hot {
                writer.write(b * 4096, &[round as u8; 4096], false)?;
            }
            writer.flush()?;
        }
        Ok::<(), Error>(())
    })
    .expect_err("the relocator never read the head segment");
    assert!(cache.injected(OpKind::Read) > 0);
    assert!(matches!(err, Error::Failed(_)), "{err}");
    let failed = e.stats().failed.expect("status shows the failure");
    assert!(failed.contains("relocator"), "{failed}");
    let flusher = e.clone();
    let err = bounded("a flush", move || flusher.flush()).expect_err("flush on a failed engine");
    assert!(matches!(err, Error::Failed(_)), "{err}");
    let closer = e.clone();
    bounded("close", move || closer.close()).expect_err("close of a failed engine");
}

/// Defect 4: the periodic seal runs while the ring is under pressure and writeback cannot make
/// room (here the backing device fails every write): an acknowledged write not flushed is
/// sealed and synced within the seal interval, and survives a crash. Before the fix the
/// flusher, always busy with "room work", never sealed it.
#[test]
fn the_periodic_seal_runs_under_ring_pressure() {
    let segments = 8u64;
    let pair = SimPair::new(MIB + segments * SEG_64K, 64 * MIB, SEG_64K);
    let backing = Arc::new(FaultDevice::new(pair.backing()));
    backing.fail_next(OpKind::Write, u64::MAX, FaultKind::Io);
    let opts = OpenOptions {
        ram_buffer_bytes: 2 * SEG_64K,
        seal_interval_ms: Some(50),
        ..OpenOptions::default()
    };
    let e = Engine::open(pair.cache(), backing, opts.clone()).unwrap();
    // Distinct blocks until the ring is down to its last free segments (under pressure: the
    // relocator may not move them, dirty data being above its limit, and writeback fails).
    let writer = e.clone();
    let written = bounded("filling the ring", move || {
        let mut b = 0u64;
        while writer.stats().segments_free > 1 {
            writer.write(b * 4096, &[b as u8 | 1; 4096], false).unwrap();
            b += 1;
            assert!(b < 1000, "more blocks than the cache holds");
        }
        b
    });
    assert!(written > 0);
    let before = e.stats().counters.periodic_seals;
    let lba = written;
    e.write(lba * 4096, &[0xA5; 4096], false).unwrap();
    let sealed = eventually(|| {
        let s = e.stats();
        s.counters.periodic_seals > before && s.synced_seq + 1 >= s.next_seq
    });
    assert!(
        sealed,
        "no periodic seal under ring pressure: {:?}",
        e.stats()
    );
    e.crash();
    pair.cache.crash_lose_all();
    let e = Engine::open(pair.cache(), pair.backing(), opts).unwrap();
    let mut buf = [0u8; 4096];
    e.read(lba * 4096, &mut buf).unwrap();
    assert_eq!(buf, [0xA5; 4096], "the acknowledged write was lost");
    e.close().unwrap();
}

/// Defect 2: a read miss in the window between a write-around's logged drop range and its
/// backing write reads the old backing data; it must not stay cached. The cache sync the
/// write-around waits for is held, a read runs meanwhile, then the write completes: every
/// later read returns the new data. Before the fix the read promoted the old data as a clean
/// block that nothing killed. The same for a partial-block zeroing in write-around mode.
#[test]
fn a_read_during_a_write_around_does_not_cache_stale_data() {
    for zeroing in [false, true] {
        let pair = SimPair::new(MIB + 16 * SEG_64K, 16 * MIB, SEG_64K);
        let lba = 100u64;
        pair.backing.write_raw(lba * 4096, &[0x11; 4096]);
        let cache = Arc::new(GateDevice::new(pair.cache()));
        let opts = OpenOptions {
            ram_buffer_bytes: 4 * SEG_64K,
            seal_interval_ms: Some(0),
            ..OpenOptions::default()
        };
        let e = Engine::open(cache.clone(), pair.backing(), opts.clone()).unwrap();
        e.set_tunable("cache_mode", "write-around").unwrap();
        cache.hold(OpKind::Flush);
        let writer = e.clone();
        let write = std::thread::spawn(move || {
            if zeroing {
                writer.write_zeroes(lba * 4096 + 512, 1024, false)
            } else {
                writer.write(lba * 4096, &[0x22; 4096], false)
            }
        });
        assert!(
            cache.wait_held(OpKind::Flush, 1, HANG),
            "the write-around never synced the cache"
        );
        let mut buf = [0u8; 4096];
        e.read(lba * 4096, &mut buf).unwrap();
        assert_eq!(buf, [0x11; 4096], "the write is not acknowledged yet");
        cache.release(OpKind::Flush);
        write.join().unwrap().unwrap();
        let mut expect = [0x22u8; 4096];
        if zeroing {
            expect = [0x11; 4096];
            expect[512..1536].fill(0);
        }
        e.read(lba * 4096, &mut buf).unwrap();
        assert_eq!(buf, expect, "a stale copy is cached (zeroing: {zeroing})");
        e.close().unwrap();
        // Nor does a stale clean entry come back after a restart.
        let e = Engine::open(pair.cache(), pair.backing(), opts).unwrap();
        e.read(lba * 4096, &mut buf).unwrap();
        assert_eq!(buf, expect, "after reopening (zeroing: {zeroing})");
        e.close().unwrap();
    }
}

/// A power cut now: fresh devices holding what `dev` has made durable.
fn power_cut_copy(dev: &SimDevice) -> SimDevice {
    let image = dev.durable_image();
    let copy = SimDevice::new(image.len() as u64);
    copy.write_raw(0, &image);
    copy
}

/// Defect 1: a write-zeroes' zero range must not leave the log (the head must not pass it)
/// before the zeros reach the backing device. (Found with TRIM, which then zeroed; TRIM is a
/// hint now and write-zeroes keeps the zero range.) Write D to block L; zero L (the zero range
/// kills D's copy in the same flush epoch, so D is never written back) while the backing
/// device's zeroing is held; flush (D is durable: L may read D or zeros, never older data);
/// then rewrite a pool of other blocks round and round, with no flush (in flush-epoch order a
/// rewrite in a later epoch would keep the older copy as a shadow, which writeback cannot take
/// past the pending range, and the segments would never die), until the head passes the zero
/// range's segment or writers wait for room; cut the power. Before the fix the head passed it
/// and recovery found neither D nor the range. (With a flush between D and the zeroing, as
/// this test did before 2026-11-26, flush-epoch order writes D back before the zeroing and the
/// test passed with the fix removed.)
#[test]
fn a_zero_range_stays_in_the_log_until_the_backing_device_has_the_zeros() {
    let pair = SimPair::new(MIB + 32 * SEG_64K, 16 * MIB, SEG_64K);
    let lba = 200u64;
    pair.backing.write_raw(lba * 4096, &[0x11; 4096]);
    let backing = Arc::new(GateDevice::new(pair.backing()));
    let opts = OpenOptions {
        ram_buffer_bytes: 4 * SEG_64K,
        seal_interval_ms: Some(0),
        ..OpenOptions::default()
    };
    let e = Engine::open(pair.cache(), backing.clone(), opts.clone()).unwrap();
    e.write(lba * 4096, &[0x33; 4096], false).unwrap();
    backing.hold(OpKind::Discard);
    let trimmer = e.clone();
    let trim = std::thread::spawn(move || trimmer.write_zeroes(lba * 4096, 4096, false));
    assert!(
        backing.wait_held(OpKind::Discard, 1, HANG),
        "the write-zeroes never zeroed the backing device"
    );
    let s = e.stats();
    let zero_segment = s.head_segment_id + s.segments_in_use - 1;
    e.flush().unwrap();
    // Rewrites of a pool of 64 blocks, round and round: every copy is dead a round later.
    let stop = Arc::new(AtomicBool::new(false));
    let (writer, stop2) = (e.clone(), stop.clone());
    let rewrites = std::thread::spawn(move || {
        for i in 0..100_000u64 {
            if stop2.load(Ordering::SeqCst) {
                return;
            }
            let b = 1000 + i % 64;
            if writer.write(b * 4096, &[i as u8; 4096], false).is_err() {
                return;
            }
        }
    });
    let waits_before = s.counters.write_waits;
    assert!(
        eventually(|| {
            let s = e.stats();
            // The head passed the zero range, or the ring is full (writers wait for room; a
            // write may also wait for a RAM buffer, so the count alone does not say that).
            s.head_segment_id > zero_segment
                || (s.segments_free <= 1 && s.counters.write_waits > waits_before)
        }),
        "the rewrites neither moved the head nor filled the ring: {:?}",
        e.stats()
    );
    let head = e.stats().head_segment_id;
    let (cache_cut, backing_cut) = (power_cut_copy(&pair.cache), power_cut_copy(&pair.backing));
    stop.store(true, Ordering::SeqCst);
    backing.release(OpKind::Discard);
    trim.join().unwrap().unwrap();
    rewrites.join().unwrap();
    e.close().unwrap();
    let e2 = Engine::open(Arc::new(cache_cut), Arc::new(backing_cut), opts).unwrap();
    let mut buf = [0u8; 4096];
    e2.read(lba * 4096, &mut buf).unwrap();
    assert!(
        buf == [0x33; 4096] || buf == [0u8; 4096],
        "block {lba} reads {:#x}.. after a power cut (head {head}, zero range in segment \
         <= {zero_segment}): neither the flushed write nor zeros",
        buf[0]
    );
    e2.close().unwrap();
}

/// A failed superblock write while setting a tunable gives the cache up, as every other
/// superblock writer does (it used to return the error and carry on): a cache-device failure
/// (`cache failed: …`), and with nothing dirty the engine goes on from the backing device alone
/// with nothing lost (issue 25).
#[test]
fn a_failed_tunable_write_fails_the_engine() {
    let pair = SimPair::new(MIB + 16 * SEG_64K, 16 * MIB, SEG_64K);
    let cache = Arc::new(FaultDevice::new(pair.cache()));
    let opts = OpenOptions {
        seal_interval_ms: Some(0),
        ..OpenOptions::default()
    };
    let e = Engine::open(cache.clone(), pair.backing(), opts).unwrap();
    cache.fail_next(OpKind::Write, u64::MAX, FaultKind::Io);
    e.set_tunable("writeback_io_depth", "4")
        .expect_err("the superblock write failed");
    cache.heal();
    // The switch is decided on a thread of its own; a request waits for it.
    e.write(0, &[1; 4096], false).unwrap();
    let s = e.stats();
    assert!(s.serving_alone && s.failed.is_none(), "{s:?}");
    let why = s.cache_failed.clone().expect("status shows the failure");
    assert!(why.starts_with("cache failed: "), "{why}");
    assert_eq!(s.lost_bytes, 0, "{s:?}");
    let mut buf = [0u8; 4096];
    e.read(0, &mut buf).unwrap();
    assert_eq!(buf, [1; 4096]);
}

/// Found by the concurrent simulation (seeds 0 and 168 of `sim.rs`): a read while a
/// write-zeroes is being applied. The zero range drops the block's dirty copy when it is
/// logged, and the backing device gets the zeros only later: a read in between must return
/// the dropped data or zeros, never the backing device's older data. Also for the sectors a
/// later partial write did not cover. Before the fix both reads returned the backing data.
#[test]
fn a_read_during_a_zeroing_returns_zeros_not_older_backing_data() {
    let pair = SimPair::new(MIB + 32 * SEG_64K, 16 * MIB, SEG_64K);
    let lba = 300u64;
    pair.backing.write_raw(lba * 4096, &[0x11; 4096]);
    let (backing, e) = gated_engine(&pair);
    // Writeback stays out of the way: the block stays dirty, the backing device old.
    e.set_tunable("writeback_threshold_percent", "100").unwrap();
    e.write(lba * 4096, &[0x33; 4096], false).unwrap();
    e.flush().unwrap();
    let zeroing = held_zeroing(&e, &backing, lba);
    let mut buf = [0u8; 4096];
    e.read(lba * 4096, &mut buf).unwrap();
    assert!(
        buf == [0x33; 4096] || buf == [0; 4096],
        "a read during the zeroing returned {:#x}.. (the backing device's older data)",
        buf[0]
    );
    // A partial write now: the block is cached again with one valid sector.
    e.write(lba * 4096, &[0x44; 512], false).unwrap();
    e.read(lba * 4096, &mut buf).unwrap();
    assert_eq!(buf[..512], [0x44; 512]);
    assert!(
        buf[512..].iter().all(|&b| b == 0 || b == 0x33),
        "sectors the partial write did not cover read {:#x} (the backing device's older data)",
        buf[512]
    );
    backing.release(OpKind::Discard);
    zeroing.join().unwrap().unwrap();
    e.read(lba * 4096, &mut buf).unwrap();
    assert_eq!(buf[..512], [0x44; 512]);
    assert_eq!(buf[512..], [0; 3584]);
    e.close().unwrap();
}

/// Issue 19 (smaller finding): a partial write over a clean cached block whose copy on the
/// cache device fails its checksum drops the copy and writes over the backing device's data,
/// as a read does, instead of failing with EIO (a clean copy is only a copy).
#[test]
fn a_partial_write_over_a_corrupt_clean_block_uses_the_backing_data() {
    let pair = SimPair::new(MIB + 16 * SEG_64K, 16 * MIB, SEG_64K);
    let lba = 40u64;
    pair.backing.write_raw(lba * 4096, &[0x11; 4096]);
    let opts = OpenOptions {
        seal_interval_ms: Some(0),
        ..OpenOptions::default()
    };
    let e = Engine::open(pair.cache(), pair.backing(), opts.clone()).unwrap();
    let mut buf = [0u8; 4096];
    e.read(lba * 4096, &mut buf).unwrap();
    assert!(
        e.stats().counters.promotions > 0,
        "the read miss was not promoted"
    );
    e.close().unwrap();
    // The promoted copy is on the cache device now: damage it there.
    let image = pair.cache.durable_image();
    let at = image
        .chunks(4096)
        .position(|b| b == [0x11; 4096])
        .expect("the promoted block is on the cache device");
    pair.cache.corrupt(at as u64 * 4096 + 100, 0xFF);
    let e = Engine::open(pair.cache(), pair.backing(), opts).unwrap();
    assert_eq!(
        e.stats().cached_blocks,
        1,
        "the clean copy is cached after reopening"
    );
    e.write(lba * 4096, &[0x22; 512], false)
        .expect("a partial write over a corrupt clean copy");
    e.read(lba * 4096, &mut buf).unwrap();
    assert_eq!(buf[..512], [0x22; 512]);
    assert_eq!(buf[512..], [0x11; 3584]);
    e.close().unwrap();
}

/// Issue 19 (smaller finding): a write-through block's clean log entry says "the backing device
/// holds this", so it must not become durable before a backing sync that covers the backing
/// write. The flusher syncs the backing device before writing queued chunks when a bypass
/// write is unsynced; a chunk sealed while that sync runs may hold a clean entry whose backing
/// write ended after the sync began. Window, opened on purpose (manual mode, so the flusher
/// runs where the test says): write-through W's backing write is held; write-through X ends
/// (a sync is owed) and its chunk is sealed; a flusher round's backing sync is done (covering
/// X, not W) and held before it returns;
/// W's backing write ends and its chunk is sealed; the sync ends and the round writes and
/// syncs the queued chunks. A power cut then keeps W's clean entry but loses W's unsynced
/// backing write: the cache serves data the backing device does not hold (and would lose
/// it at eviction). Before the fix the round took W's chunk too.
#[test]
fn a_write_through_clean_entry_is_not_durable_before_its_backing_sync() {
    let pair = SimPair::new(MIB + 16 * SEG_64K, 16 * MIB, SEG_64K);
    let (w_lba, x_lba) = (40u64, 80u64);
    pair.backing.write_raw(w_lba * 4096, &[0x11; 4096]);
    let backing = Arc::new(GateDevice::new(pair.backing()));
    let opts = OpenOptions {
        seal_interval_ms: Some(1000),
        // A backing sync before every chunk with clean entries no sync covers (the window
        // is in that sync; by default most such chunks are written with holes instead).
        clean_holes_per_backing_sync: 0,
        ..manual(4 * SEG_64K)
    };
    let e = Engine::open(pair.cache(), backing.clone(), opts).unwrap();
    e.set_tunable("cache_mode", "write-through").unwrap();
    // Seals the open chunk now (a due periodic seal; manual mode reads no clock).
    let later = || Instant::now() + Duration::from_secs(3600);

    backing.hold_range(OpKind::Write, w_lba * 4096, 4096);
    let we = e.clone();
    let w = std::thread::spawn(move || we.write(w_lba * 4096, &[0x22; 4096], false));
    assert!(
        backing.wait_held(OpKind::Write, 1, HANG),
        "W never reached the backing device"
    );
    e.write(x_lba * 4096, &[0x33; 4096], false).unwrap();
    e.seal_if_due(later());
    backing.hold_after(OpKind::Flush);
    let fe = e.clone();
    let round = std::thread::spawn(move || fe.run_flusher());
    assert!(
        backing.wait_held(OpKind::Flush, 1, HANG),
        "the flusher round did not sync the backing device first"
    );
    backing.release(OpKind::Write);
    bounded("W's write-through", move || w.join().unwrap()).unwrap();
    e.seal_if_due(later());
    backing.release(OpKind::Flush);
    bounded("the flusher round", move || round.join().unwrap()).unwrap();

    let (cache_cut, backing_cut) = (power_cut_copy(&pair.cache), power_cut_copy(&pair.backing));
    let mut on_backing = [0u8; 4096];
    backing_cut.read_at(&mut on_backing, w_lba * 4096).unwrap();
    let e2 = Engine::open(
        Arc::new(cache_cut),
        Arc::new(backing_cut),
        manual(4 * SEG_64K),
    )
    .unwrap();
    let mut buf = [0u8; 4096];
    e2.read(w_lba * 4096, &mut buf).unwrap();
    assert_eq!(
        buf[0], on_backing[0],
        "after a power cut block {w_lba} reads {:#x} from a clean cached copy while the backing \
         device holds {:#x}",
        buf[0], on_backing[0]
    );
    e2.close().unwrap();
    e.close().unwrap();
}

/// Issue 20: write-through writes do not wait for backing syncs. Each write-through write
/// waits for its drop range to be durable in the log; the chunk that carries it also carries
/// the clean copies of the writes before it, which say "the backing device holds this". The
/// flusher used to sync the backing device before every such chunk: one backing flush per
/// few writes, a barrier that kept an HDD from reordering its queue. Now such a chunk's clean
/// entries no backing sync covers are written as holes (the blocks stay cached, clean, until
/// a crash). Window: every backing flush is held; 12 write-through writes must still finish
/// (before the fix the second one hung in the flusher's backing sync), their data reads back
/// from the cache, and after a power cut that loses the unsynced backing writes no block reads
/// a clean copy the backing device does not hold.
#[test]
fn write_through_writes_do_not_wait_for_a_backing_sync() {
    let pair = SimPair::new(MIB + 16 * SEG_64K, 16 * MIB, SEG_64K);
    let writes = 12u64;
    for i in 0..writes {
        pair.backing.write_raw(i * 8 * 4096, &[0x11; 4096]);
    }
    let backing = Arc::new(GateDevice::new(pair.backing()));
    let e = Engine::open(pair.cache(), backing.clone(), manual(4 * SEG_64K)).unwrap();
    e.set_tunable("cache_mode", "write-through").unwrap();
    backing.hold(OpKind::Flush);
    let we = e.clone();
    bounded(
        "write-through writes with backing flushes held",
        move || {
            for i in 0..writes {
                we.write(i * 8 * 4096, &[0x20 + i as u8; 4096], false)
                    .unwrap();
            }
        },
    );
    let c = e.stats().counters;
    assert_eq!(c.backing_syncs, 0, "a write waited for a backing sync");
    assert!(
        c.clean_entries_holed >= writes - 1,
        "{} of {} clean copies written as holes",
        c.clean_entries_holed,
        writes - 1
    );
    // Still cached, clean: every read is a hit.
    let hits_before = e.stats().counters.read_hits;
    let mut buf = [0u8; 4096];
    for i in 0..writes {
        e.read(i * 8 * 4096, &mut buf).unwrap();
        assert_eq!(buf, [0x20 + i as u8; 4096], "block {}", i * 8);
    }
    assert_eq!(e.stats().counters.read_hits - hits_before, writes);

    let cache_cut = power_cut_copy(&pair.cache);
    let backing_cut = Arc::new(power_cut_copy(&pair.backing));
    let e2 = Engine::open(
        Arc::new(cache_cut),
        backing_cut.clone(),
        manual(4 * SEG_64K),
    )
    .unwrap();
    let mut on_backing = [0u8; 4096];
    for i in 0..writes {
        backing_cut.read_at(&mut on_backing, i * 8 * 4096).unwrap();
        e2.read(i * 8 * 4096, &mut buf).unwrap();
        assert_eq!(
            buf[0],
            on_backing[0],
            "after a power cut block {} reads {:#x} while the backing device holds {:#x}",
            i * 8,
            buf[0],
            on_backing[0]
        );
    }
    e2.close().unwrap();
    backing.release(OpKind::Flush);
    e.close().unwrap();
}

/// Issue 20: the holes are bounded. After `clean_holes_per_backing_sync` clean entries were
/// written as holes the flusher syncs the backing device before the next chunk that needs it,
/// and that chunk's clean entries go to the log as entries: after a power cut their blocks
/// are cached (and read what the backing device holds, which the sync made durable).
#[test]
fn a_backing_sync_every_so_many_holes_lets_clean_entries_into_the_log() {
    let pair = SimPair::new(MIB + 16 * SEG_64K, 16 * MIB, SEG_64K);
    let writes = 12u64;
    let opts = OpenOptions {
        clean_holes_per_backing_sync: 3,
        ..manual(4 * SEG_64K)
    };
    let e = Engine::open(pair.cache(), pair.backing(), opts.clone()).unwrap();
    e.set_tunable("cache_mode", "write-through").unwrap();
    for i in 0..writes {
        e.write(i * 8 * 4096, &[0x20 + i as u8; 4096], false)
            .unwrap();
    }
    let c = e.stats().counters;
    // Write k's drop range goes out with write k-1's clean copy: 11 chunks need a sync; every
    // fourth gets one (3 holes, then a sync).
    assert_eq!(c.backing_syncs, 2, "flusher backing syncs");
    assert_eq!(c.clean_entries_holed, writes - 1 - 2, "clean entries holed");
    let cache_cut = power_cut_copy(&pair.cache);
    let backing_cut = Arc::new(power_cut_copy(&pair.backing));
    let e2 = Engine::open(Arc::new(cache_cut), backing_cut.clone(), opts).unwrap();
    assert_eq!(
        e2.stats().cached_blocks,
        2,
        "the clean copies a backing sync covered are cached after the power cut"
    );
    let (mut buf, mut on_backing) = ([0u8; 4096], [0u8; 4096]);
    for i in 0..writes {
        backing_cut.read_at(&mut on_backing, i * 8 * 4096).unwrap();
        e2.read(i * 8 * 4096, &mut buf).unwrap();
        assert_eq!(buf, on_backing, "block {} after the power cut", i * 8);
    }
    e2.close().unwrap();
    e.close().unwrap();
}

/// Issue 20, CI's crash seed 11569655912972376080 on the first try of the holes (1e93459): a
/// write-back write of part of a block whose cached copy is a write-through write's clean copy
/// makes a partly dirty entry, and its clean sectors say "the backing device holds this" as a
/// clean entry does. Only wholly clean entries became holes, so with every backing sync
/// failing the log vouched for the write-through data the backing device then lost in the
/// power cut: recovery served it from the cache, and once the block was written back and its
/// copy dropped, the same sectors read the older data. Now an unvouched partly dirty entry
/// keeps only its dirty sectors valid.
#[test]
fn a_partly_dirty_block_does_not_vouch_for_a_write_through_copy_no_sync_covered() {
    let pair = SimPair::new(MIB + 16 * SEG_64K, 16 * MIB, SEG_64K);
    let lba_bytes = 8 * 4096;
    pair.backing.write_raw(lba_bytes, &[0x11; 4096]);
    let backing = Arc::new(FaultDevice::new(pair.backing()));
    let e = Engine::open(pair.cache(), backing.clone(), manual(4 * SEG_64K)).unwrap();
    e.set_tunable("cache_mode", "write-through").unwrap();
    backing.fail_after(OpKind::Flush, 0, FaultKind::Io);
    e.write(lba_bytes, &[0x22; 4096], false).unwrap();
    e.set_tunable("cache_mode", "write-back").unwrap();
    // Sectors 4..8 dirty; 0..4 are the write-through copy's, clean.
    e.write(lba_bytes + 2048, &[0x33; 2048], false).unwrap();
    assert!(
        e.flush().is_err(),
        "a flush with every backing sync failing"
    );
    // The power cut loses the write-through write on the backing device.
    let cache_cut = power_cut_copy(&pair.cache);
    let backing_cut = power_cut_copy(&pair.backing);
    e.crash();
    let e2 = Engine::open(
        Arc::new(cache_cut),
        Arc::new(backing_cut.clone()),
        manual(4 * SEG_64K),
    )
    .unwrap();
    let mut first = [0u8; 2048];
    e2.read(lba_bytes, &mut first).unwrap();
    let mut on_backing = [0u8; 2048];
    backing_cut.read_at(&mut on_backing, lba_bytes).unwrap();
    assert_eq!(
        first[0], on_backing[0],
        "after the power cut the cache serves clean sectors the backing device does not hold"
    );
    // The dirty half goes to the backing device; a write-around write drops the cached copy.
    e2.writeback_step(64).unwrap();
    e2.set_tunable("cache_mode", "write-around").unwrap();
    e2.write(lba_bytes + 3584, &[0x44; 512], false).unwrap();
    let mut again = [0u8; 2048];
    e2.read(lba_bytes, &mut again).unwrap();
    assert_eq!(
        again[0], first[0],
        "sectors nobody wrote since changed from {:#x} to {:#x}",
        first[0], again[0]
    );
    let mut half = [0u8; 1536];
    e2.read(lba_bytes + 2048, &mut half).unwrap();
    assert_eq!(half, [0x33; 1536], "the dirty sectors after writeback");
    e2.close().unwrap();
}

/// Cuts the power under `e` (both devices of `pair` lose what they did not sync), reopens
/// with `opts`, and checks that each (offset, byte) block reads its byte: writes a flush
/// returned OK for before the cut.
fn after_a_power_cut_blocks_read(
    pair: &SimPair,
    e: Engine,
    opts: OpenOptions,
    blocks: &[(u64, u8)],
) {
    let cache_cut = power_cut_copy(&pair.cache);
    let backing_cut = power_cut_copy(&pair.backing);
    e.crash();
    let e2 = Engine::open(Arc::new(cache_cut), Arc::new(backing_cut), opts).unwrap();
    let mut buf = [0u8; 4096];
    for &(offset, byte) in blocks {
        e2.read(offset, &mut buf).unwrap();
        assert!(
            buf.iter().all(|&b| b == byte),
            "a write-through write at {offset} lost after a flush returned OK (reads {:#x}, \
             not {byte:#x})",
            buf[0]
        );
    }
    e2.close().unwrap();
}

/// Issue 20: a flush fails after a backing sync of the flusher's failed. With clean copies
/// written as holes no chunk waits for that sync any more, so a flush that found the log
/// durable and its own backing sync successful returned OK (1e93459 removed the check that
/// failed it), although the failed sync may have dropped the write-through writes it covered
/// (a device may lose them with the error and report success next time, as Linux's page
/// cache can). 0813f0b failed the next flush once; the one after it returned OK with the
/// write still gone (fsyncgate's trap), and a power cut then lost a flushed write. Now the
/// failed sync marks the write-through copies no sync covered dirty, and a flush returns OK
/// only once writeback wrote them again and synced: the block survives the power cut.
#[test]
fn a_flush_after_the_flushers_backing_sync_failed_is_truthful() {
    let pair = SimPair::new(MIB + 16 * SEG_64K, 16 * MIB, SEG_64K);
    let backing = Arc::new(FaultDevice::new(pair.backing()));
    let opts = OpenOptions {
        // The flusher syncs the backing device before every chunk with clean copies.
        clean_holes_per_backing_sync: 0,
        ..manual(4 * SEG_64K)
    };
    let e = Engine::open(pair.cache(), backing.clone(), opts.clone()).unwrap();
    e.set_tunable("cache_mode", "write-through").unwrap();
    e.write(0, &[0x22; 4096], false).unwrap();
    // The next write's drop range goes out with the first write's clean copy, behind a
    // backing sync of the flusher's: that sync fails, and the device drops what it had.
    backing.fail_next(OpKind::Flush, 1, FaultKind::Io);
    e.write(8 * 4096, &[0x33; 4096], false).unwrap();
    assert_eq!(
        backing.injected(OpKind::Flush),
        1,
        "the flusher's backing sync"
    );
    pair.backing.crash_lose_all();
    // Fails or not (this one rewrites the copy first and returns OK), but the first flush
    // that returns OK must have made both writes durable.
    let flushed = (0..3).any(|_| e.flush().is_ok());
    assert!(
        flushed,
        "no flush returned OK with the backing device healthy"
    );
    assert!(e.stats().counters.bypass_copies_redirtied >= 1);
    after_a_power_cut_blocks_read(&pair, e, opts, &[(0, 0x22), (8 * 4096, 0x33)]);
}

/// Issue 20, the same for the flush's own backing sync: it fails, the device drops the
/// write-through write; the next flush's sync succeeds, and returned OK before (nothing
/// recorded the failure). Now the next flush writes the cached copy again first.
#[test]
fn a_flush_after_its_own_backing_sync_failed_is_truthful() {
    let pair = SimPair::new(MIB + 16 * SEG_64K, 16 * MIB, SEG_64K);
    let backing = Arc::new(FaultDevice::new(pair.backing()));
    let e = Engine::open(pair.cache(), backing.clone(), manual(4 * SEG_64K)).unwrap();
    e.set_tunable("cache_mode", "write-through").unwrap();
    e.write(0, &[0x44; 4096], false).unwrap();
    backing.fail_next(OpKind::Flush, 1, FaultKind::Io);
    assert!(e.flush().is_err(), "the flush whose backing sync failed");
    pair.backing.crash_lose_all();
    e.flush()
        .expect("a flush with the backing device healthy again");
    after_a_power_cut_blocks_read(&pair, e, manual(4 * SEG_64K), &[(0, 0x44)]);
}

/// Issue 20: a write-around write keeps no copy, so once a backing sync failed before any
/// sync covered it nothing can make it durable again: every later flush fails (0813f0b failed
/// only the next one), and the cache must be reopened to go on.
#[test]
fn flushes_keep_failing_after_a_failed_sync_lost_a_write_around_write() {
    let pair = SimPair::new(MIB + 16 * SEG_64K, 16 * MIB, SEG_64K);
    let backing = Arc::new(FaultDevice::new(pair.backing()));
    let e = Engine::open(pair.cache(), backing.clone(), manual(4 * SEG_64K)).unwrap();
    e.set_tunable("cache_mode", "write-around").unwrap();
    e.write(0, &[0x55; 4096], false).unwrap();
    backing.fail_next(OpKind::Flush, 1, FaultKind::Io);
    assert!(e.flush().is_err(), "the flush whose backing sync failed");
    pair.backing.crash_lose_all();
    for _ in 0..3 {
        let err = e
            .flush()
            .expect_err("a flush after a write-around write was lost");
        assert!(err.to_string().contains("reopen"), "{err}");
    }
    e.close().unwrap();
}

/// A backing device whose connection count the test moves (an NBD backing's reconnect).
struct Reconnecting {
    inner: Arc<dyn BlockDevice>,
    reconnects: std::sync::atomic::AtomicU64,
}

impl BlockDevice for Reconnecting {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
    fn discard(&self, offset: u64, len_bytes: u64) -> std::io::Result<()> {
        self.inner.discard(offset, len_bytes)
    }
    fn describe(&self) -> String {
        "a reconnecting test device".into()
    }
    fn reconnects(&self) -> u64 {
        self.reconnects.load(Ordering::SeqCst)
    }
}

/// Issue 20: the NBD backing's reconnect rule had the same hole: a sync that found the
/// connection replaced after a write-through write was sent failed the next flush once, and
/// the flush after returned OK though the server may have lost the write. Now the copy is
/// written again from the cache first.
#[test]
fn a_flush_after_a_replaced_connection_is_truthful() {
    let pair = SimPair::new(MIB + 16 * SEG_64K, 16 * MIB, SEG_64K);
    let backing = Arc::new(Reconnecting {
        inner: pair.backing(),
        reconnects: Default::default(),
    });
    let e = Engine::open(pair.cache(), backing.clone(), manual(4 * SEG_64K)).unwrap();
    e.set_tunable("cache_mode", "write-through").unwrap();
    e.write(0, &[0x66; 4096], false).unwrap();
    // The server restarts and loses what it had not synced; the device connects again.
    pair.backing.crash_lose_all();
    backing.reconnects.fetch_add(1, Ordering::SeqCst);
    let flushed = (0..3).any(|_| e.flush().is_ok());
    assert!(
        flushed,
        "no flush returned OK with the backing device healthy"
    );
    after_a_power_cut_blocks_read(&pair, e, manual(4 * SEG_64K), &[(0, 0x66)]);
}

/// Issue 19 (smaller finding): a TRIM held `backing_order`, which every writeback batch takes,
/// from logging its drop range to the end of its backing discard, so writeback stalled for the
/// TRIM's cache sync too (and, before TRIM became a hint, its zeroing, a backing sync and a
/// superblock write). The order matters only where the discard is sent: once the drop range
/// is logged no batch holds the dropped blocks. Window: the TRIM's cache sync is held; a
/// writeback batch of another block must still run. Before the fix it waited for the sync.
#[test]
fn writeback_runs_while_a_trim_waits_for_its_cache_sync() {
    let pair = SimPair::new(MIB + 16 * SEG_64K, 16 * MIB, SEG_64K);
    let cache = Arc::new(GateDevice::new(pair.cache()));
    let e = Engine::open(cache.clone(), pair.backing(), manual(4 * SEG_64K)).unwrap();
    // Sorted order: the batch needs no superblock write (which would wait for the held sync).
    e.set_tunable("writeback_order", "sorted").unwrap();
    e.write(0, &[0x44; 4096], false).unwrap();
    e.write(100 * 4096, &[0x55; 4096], false).unwrap();
    e.flush().unwrap();
    cache.hold(OpKind::Flush);
    let te = e.clone();
    let trim = std::thread::spawn(move || te.discard(100 * 4096, 4096, false));
    assert!(
        cache.wait_held(OpKind::Flush, 1, HANG),
        "the TRIM never synced its drop range"
    );
    let we = e.clone();
    let written_back = bounded(
        "a writeback batch while a TRIM waits for its cache sync",
        move || we.writeback_step(64),
    );
    cache.release(OpKind::Flush);
    let written_back = written_back.unwrap();
    bounded("the TRIM", move || trim.join().unwrap()).unwrap();
    assert_eq!(written_back, 1, "block 0 is written back");
    let mut buf = [0u8; 4096];
    pair.backing.read_at(&mut buf, 0).unwrap();
    assert_eq!(buf, [0x44; 4096]);
    e.close().unwrap();
}

/// Issue 19 (smaller finding), the reclaim side: a dirty block whose copy on the cache device
/// fails its checksum can be neither written back nor moved by the relocator. In sorted order
/// writeback goes on around it, so the ring comes round to its segment, which the head can
/// never pass: writers then waited for room forever while status said healthy. Now the
/// relocator gives the cache up, saying what is lost (issue 25: the engine goes on from the
/// backing device alone, the dirty blocks lost; in consistent order writeback itself stops at
/// such a block and does the same). Before the fix the writes hung.
#[test]
fn a_corrupt_dirty_block_the_head_cannot_pass_fails_the_engine() {
    let pair = SimPair::new(MIB + 16 * SEG_64K, 64 * MIB, SEG_64K);
    let opts = OpenOptions {
        ram_buffer_bytes: 2 * SEG_64K,
        seal_interval_ms: Some(0),
        ..OpenOptions::default()
    };
    let e = Engine::open(pair.cache(), pair.backing(), opts.clone()).unwrap();
    e.set_tunable("writeback_order", "sorted").unwrap();
    e.set_tunable("writeback_threshold_percent", "100").unwrap();
    for b in 0..8u64 {
        e.write(b * 4096, &[0xA0 + b as u8; 4096], false).unwrap();
    }
    e.flush().unwrap();
    e.close().unwrap();
    let image = pair.cache.read_volatile(0, MIB + 16 * SEG_64K);
    let pos = image
        .chunks(4096)
        .position(|c| c == [0xA5; 4096])
        .expect("block 5 is on the cache device");
    pair.cache.corrupt(pos as u64 * 4096 + 100, 0x01);

    let e = Engine::open(pair.cache(), pair.backing(), opts).unwrap();
    // Everything else is written back at once; block 5 stays dirty.
    e.set_tunable("writeback_threshold_percent", "0").unwrap();
    let w = e.clone();
    let res = bounded("writes that wrap the ring", move || {
        for i in 0..3000u64 {
            w.write((100 + i % 500) * 4096, &[i as u8; 4096], false)?;
        }
        Ok::<(), Error>(())
    });
    res.expect("writes go on from the backing device alone");
    let s = e.stats();
    assert!(s.serving_alone && s.failed.is_none(), "{s:?}");
    let why = s.cache_failed.clone().expect("status shows the failure");
    assert!(
        why.starts_with("cache failed: ") && why.contains("checksum") && why.contains("block 5"),
        "{why}"
    );
    assert!(s.lost_bytes >= 4096, "{s:?}");
    let mut buf = [0u8; 4096];
    let lost = e
        .read(5 * 4096, &mut buf)
        .expect_err("the damaged block is lost");
    assert_eq!(lost.errno(), libc::EIO, "{lost}");
    // Written back before the failure: read from the backing device alone.
    e.read(0, &mut buf).unwrap();
    assert_eq!(buf, [0xA0; 4096]);
}

/// A write-through (or write-around) write to a block whose write-zeroes is still on its way to
/// the backing device goes the write-back way: sent there directly it could land before the
/// zeros, which then wipe it on the backing device while the cache keeps it as a clean copy (a
/// later eviction, or the backing device alone, then says zeros).
#[test]
fn a_write_through_during_a_zeroing_is_not_wiped_by_it() {
    for mode in ["write-through", "write-around"] {
        let pair = SimPair::new(MIB + 32 * SEG_64K, 16 * MIB, SEG_64K);
        let lba = 300u64;
        let (backing, e) = gated_engine(&pair);
        e.set_tunable("cache_mode", mode).unwrap();
        let zeroing = held_zeroing(&e, &backing, lba);
        // Whichever way the write goes, it returns without the held zeroing, which must then
        // not overtake it on the backing device.
        let writer = e.clone();
        bounded("the write", move || {
            writer.write(lba * 4096, &[0x55; 4096], false)
        })
        .unwrap();
        backing.release(OpKind::Discard);
        zeroing.join().unwrap().unwrap();
        e.drain(|_| {}).unwrap();
        let mut buf = [0u8; 4096];
        e.read(lba * 4096, &mut buf).unwrap();
        assert_eq!(buf, [0x55; 4096], "{mode}: the disk");
        e.close().unwrap();
        assert!(
            pair.backing.read_volatile(lba * 4096, 4096) == vec![0x55; 4096],
            "{mode}: the backing device lost the write (the zeros wiped it)"
        );
    }
}

/// Two write-through writes of the same block go one after the other: sent together, the
/// older one's clean copy could be logged after the newer one's drop range, so a power cut that
/// lost the newer clean copy replayed the older one over the backing device's newer data (found
/// by the concurrent simulation, `LOGCACHE_SIM_CYCLES=3` seed 107: recovery returned write 66,
/// the backing device held write 67, so an eviction would bring the lost write back).
#[test]
fn overlapping_write_through_writes_go_one_after_the_other() {
    let pair = SimPair::new(MIB + 32 * SEG_64K, 16 * MIB, SEG_64K);
    let lba = 300u64;
    let (backing, e) = gated_engine(&pair);
    e.set_tunable("cache_mode", "write-through").unwrap();
    // Only the block's writes (the label's writeback record may be written meanwhile).
    backing.hold_range(OpKind::Write, lba * 4096, 4096);
    let w1 = e.clone();
    let first = std::thread::spawn(move || w1.write(lba * 4096, &[0x61; 4096], false));
    assert!(
        backing.wait_held(OpKind::Write, 1, HANG),
        "the first write never reached the backing device"
    );
    let w2 = e.clone();
    let second = std::thread::spawn(move || w2.write(lba * 4096 + 512, &[0x62; 1024], false));
    // The second may not reach the backing device while the first is under way (it would
    // within moments if it could: nothing else holds it).
    assert!(
        !backing.wait_held(OpKind::Write, 2, Duration::from_secs(2)),
        "the second write reached the backing device while the first was under way"
    );
    backing.release(OpKind::Write);
    first.join().unwrap().unwrap();
    second.join().unwrap().unwrap();
    let mut buf = [0u8; 4096];
    e.read(lba * 4096, &mut buf).unwrap();
    assert!(
        buf[..512] == [0x61; 512] && buf[512..1536] == [0x62; 1024] && buf[1536..] == [0x61; 2560]
    );
    e.close().unwrap();
    assert!(
        pair.backing.read_volatile(lba * 4096, 4096) == buf.to_vec(),
        "the backing device"
    );
}

/// Found by the SIGKILL soak (issue 19, its long run with write-zeroes: a partial write lost
/// one cycle after it was verified). A dirty copy replaced by a write of a later flush epoch
/// replays as a shadow (writeback still owes it). When recovery applies a zero range again, it
/// writes the blocks logged after it straight to the backing device and marks them clean; the
/// older shadow of the same block stayed dirty, and writeback then wrote it over the newer
/// data. The cache's copy, clean, read right until it was evicted; then the block read the
/// older data. Here: promote block L (all sectors valid, clean), write sectors 0-1 and flush,
/// hold a write-zeroes of another block at the backing device, write sectors 0-5 and flush,
/// cut the power, recover and drain. Before the fix the backing device held the older write in
/// sectors 0-1.
#[test]
fn an_older_shadow_is_not_written_back_over_a_block_recovery_wrote_back() {
    let pair = SimPair::new(MIB + 32 * SEG_64K, 16 * MIB, SEG_64K);
    let (lba, other) = (400u64, 500u64);
    pair.backing.write_raw(lba * 4096, &[0x55; 4096]);
    let (backing, e) = gated_engine(&pair);
    // Sorted order (the soak's): recovery applies the zero range at once and writes back the
    // blocks logged after it (flush-epoch order defers both to writeback). Writeback stays out
    // of the way: the older write stays dirty.
    e.set_tunable("writeback_order", "sorted").unwrap();
    e.set_tunable("writeback_threshold_percent", "100").unwrap();
    e.set_tunable("writeback_idle_ms", "0").unwrap();
    let mut buf = [0u8; 4096];
    e.read(lba * 4096, &mut buf).unwrap();
    assert_eq!(
        e.stats().counters.promotions,
        1,
        "the read promotes the block"
    );
    e.write(lba * 4096, &[0x11; 1024], false).unwrap();
    e.flush().unwrap();
    let zeroing = held_zeroing(&e, &backing, other);
    // Logged after the zero range, in a later flush epoch than the older write.
    e.write(lba * 4096, &[0x22; 3072], false).unwrap();
    e.flush().unwrap();
    let (cache_cut, backing_cut) = (power_cut_copy(&pair.cache), power_cut_copy(&pair.backing));
    backing.release(OpKind::Discard);
    zeroing.join().unwrap().unwrap();
    e.close().unwrap();
    let backing_cut = Arc::new(backing_cut);
    let opts = OpenOptions {
        ram_buffer_bytes: 4 * SEG_64K,
        seal_interval_ms: Some(0),
        ..OpenOptions::default()
    };
    let e2 = Engine::open(Arc::new(cache_cut), backing_cut.clone(), opts).unwrap();
    assert_eq!(e2.stats().recovery.zero_ranges_reapplied, 1);
    e2.drain(|_| {}).unwrap();
    e2.read(lba * 4096, &mut buf).unwrap();
    assert_eq!(buf[..3072], [0x22; 3072], "the cache's copy");
    // What the block reads once the clean copy is evicted.
    let mut on_backing = [0u8; 4096];
    backing_cut.read_at(&mut on_backing, lba * 4096).unwrap();
    for s in 0..8 {
        let want = if s < 6 { 0x22 } else { 0x55 };
        assert_eq!(
            on_backing[s * 512],
            want,
            "sector {s} of block {lba} on the backing device after recovery and a drain"
        );
    }
    e2.close().unwrap();
}

/// Concurrent simulation, CYCLES=3 seed 49: a TRIM lets `backing_order` go while its drop range
/// is synced (so writeback need not stall), and a write of the same block in that window could
/// be written back before the TRIM took the order lock again for its discard, which then landed
/// on the newer data: the backing device held the discard's result under a clean cached copy of
/// the write (the block changed once that copy was evicted), and it was no past state of the
/// disk. Now a write, bypass write or zero range of the TRIM's blocks since it began makes it
/// leave the discard out (a hint). Which of the two takes the order lock first is a race the
/// manual engine cannot stage, so this checks the discard itself: before the fix it was sent
/// after the write; a TRIM with no such write still sends it.
#[test]
fn a_trim_leaves_out_its_discard_after_a_write_of_its_blocks() {
    let pair = SimPair::new(MIB + 16 * SEG_64K, 16 * MIB, SEG_64K);
    let cache = Arc::new(GateDevice::new(pair.cache()));
    let e = Engine::open(cache.clone(), pair.backing(), manual(4 * SEG_64K)).unwrap();
    e.set_tunable("writeback_order", "sorted").unwrap();
    e.write(100 * 4096, &[0x55; 4096], false).unwrap();
    e.flush().unwrap();
    // A TRIM alone sends its discard.
    let discards = pair.backing.discard_count();
    e.discard(200 * 4096, 4096, false).unwrap();
    assert_eq!(
        pair.backing.discard_count(),
        discards + 1,
        "a lone TRIM's discard"
    );
    cache.hold(OpKind::Flush);
    let te = e.clone();
    let trim = std::thread::spawn(move || te.discard(100 * 4096, 4096, false));
    assert!(
        cache.wait_held(OpKind::Flush, 1, HANG),
        "the TRIM never synced its drop range"
    );
    e.write(100 * 4096, &[0x66; 4096], false).unwrap();
    cache.release(OpKind::Flush);
    bounded("the TRIM", move || trim.join().unwrap()).unwrap();
    assert_eq!(
        pair.backing.discard_count(),
        discards + 1,
        "the TRIM sent its discard after a write of its block"
    );
    e.drain(|_| {}).unwrap();
    let mut buf = [0u8; 4096];
    pair.backing.read_at(&mut buf, 100 * 4096).unwrap();
    assert_eq!(buf, [0x66; 4096]);
    e.close().unwrap();
}

/// In flush-epoch order a write-through or write-around may not reach the backing device while
/// an older zero range is still owed to it (sim `LOGCACHE_SIM_CYCLES=3` seed 141: a sector held
/// a write older than one made durable by a flush, while a write sent after that flush was
/// already there). A write of block z, then a write-zeroes of z that kills its dirty copy in the
/// same flush epoch (so writeback never writes it), its backing zeroing held; a flush makes the
/// write durable: the disk now reads the write or zeros at z, never what z held before. After a
/// switch to a bypass mode (nothing is dirty), a bypass write of another block found no dirty
/// block and went straight to the backing device, whose z still held the old data: no moment
/// of the disk looks like that.
#[test]
fn a_bypass_write_waits_for_an_older_zero_range_in_flush_epoch_order() {
    for mode in ["write-through", "write-around"] {
        let pair = SimPair::new(MIB + 32 * SEG_64K, 16 * MIB, SEG_64K);
        let (z, w) = (300u64, 500u64);
        let (backing, e) = gated_engine(&pair);
        e.write(z * 4096, &[0x31; 4096], false).unwrap();
        let zeroing = held_zeroing(&e, &backing, z);
        let flusher = e.clone();
        bounded("the flush", move || flusher.flush()).unwrap();
        let switcher = e.clone();
        bounded("the mode switch", move || {
            switcher.set_tunable("cache_mode", mode)
        })
        .unwrap();
        let writer = e.clone();
        bounded("the write of w", move || {
            writer.write(w * 4096, &[0x77; 4096], false)
        })
        .unwrap();
        assert!(
            pair.backing.read_volatile(w * 4096, 4096) != vec![0x77; 4096],
            "{mode}: the write of w reached the backing device before the zeros of z, older \
             in flush-epoch order (z still holds data older than a durable write)"
        );
        backing.release(OpKind::Discard);
        zeroing.join().unwrap().unwrap();
        e.drain(|_| {}).unwrap();
        let mut buf = [0u8; 4096];
        e.read(z * 4096, &mut buf).unwrap();
        assert_eq!(buf, [0; 4096], "{mode}: z");
        e.read(w * 4096, &mut buf).unwrap();
        assert_eq!(buf, [0x77; 4096], "{mode}: w");
        e.close().unwrap();
        assert!(
            pair.backing.read_volatile(w * 4096, 4096) == vec![0x77; 4096],
            "{mode}: the backing device lost the write of w"
        );
    }
}

/// Sim seed 5047: a power cut while serve marked the backing device detached (the cache device
/// had failed with no dirty data) kept the label's `format_id` 0 but lost the record written
/// just before it (no sync between them), and open then said the backing device "carries the
/// label of another cache (backing uuid U); this cache expects U". Each cut of the mark's
/// writes (every IO budget, every keep/lose/tear choice) must leave either no mark or one that
/// open calls detached, with the record that says when.
#[test]
fn a_power_cut_while_marking_the_backing_device_detached_leaves_the_record_or_nothing() {
    use logcache_engine::format::label::{write_detached, Label, WritebackRecord};
    use logcache_testkit::rng::Rng;
    for budget in 0..4u64 {
        for seed in 0..32u64 {
            let pair = SimPair::new(MIB + 16 * SEG_64K, 4 * MIB, SEG_64K);
            let label_at = 4 * MIB - 4096;
            let block = pair.backing.read_volatile(label_at, 4096);
            let label = Label::decode(&block).unwrap().expect("formatted");
            let record = WritebackRecord::detached_from(None, &label, 1_795_619_100_000);
            pair.backing.fail_after_ops(budget);
            let marked = write_detached(&pair.backing, label_at, &label, &record).is_ok();
            pair.backing.crash(&mut Rng::new(seed));
            pair.backing.heal();
            let after = pair.backing.read_volatile(label_at, 4096);
            let now = Label::decode(&after).unwrap().expect("a label stays");
            let rec = WritebackRecord::decode_from_label(&after).filter(|r| r.detached());
            if now.format_id == 0 {
                assert!(
                    rec.is_some(),
                    "budget {budget} seed {seed}: the label says detached, its record is lost"
                );
            }
            let opened = Engine::open(pair.cache(), pair.backing(), manual(4 * SEG_64K));
            match (rec.is_some() || now.format_id == 0, opened) {
                (false, Ok(e)) => {
                    assert!(!marked, "budget {budget}: the mark returned Ok but is gone");
                    e.crash();
                }
                (true, Err(err)) => {
                    let msg = err.to_string();
                    assert!(msg.contains("was detached"), "budget {budget}: {msg}");
                }
                (mark, r) => panic!(
                    "budget {budget} seed {seed}: marked {mark}, open {:?}",
                    r.map(|_| ())
                ),
            }
        }
    }
}

/// A backing device whose label says `format_id` 0 (the detached mark) with no record (lost, or
/// written by a build that did not sync between them) is refused as detached, not as another
/// cache's, and `format` takes it without `--force` like any detached device.
#[test]
fn a_detached_label_without_its_record_is_refused_as_detached() {
    use logcache_engine::format::label::Label;
    use logcache_engine::{format_cache, FormatOptions};
    let pair = SimPair::new(MIB + 16 * SEG_64K, 4 * MIB, SEG_64K);
    let label_at = 4 * MIB - 4096;
    let block = pair.backing.read_volatile(label_at, 4096);
    let label = Label::decode(&block).unwrap().expect("formatted");
    let unlabelled = Label {
        format_id: 0,
        ..label
    };
    pair.backing
        .write_raw(label_at, &unlabelled.encode()[..512]);
    let msg = Engine::open(pair.cache(), pair.backing(), manual(4 * SEG_64K))
        .err()
        .expect("the old cache is refused")
        .to_string();
    assert!(msg.contains("was detached from this cache"), "{msg}");
    let fresh = SimDevice::new(MIB + 16 * SEG_64K);
    let opts = FormatOptions {
        segment_size_bytes: SEG_64K,
        ..FormatOptions::default()
    };
    format_cache(&fresh, &pair.backing, &opts)
        .expect("a detached backing device takes a new cache");
}

/// Cache-loss sim seed 1201 (a hang): the cache device's reads fail (it died) while a
/// write-zeroes waits, in flush-epoch order, for the dirty blocks logged before it to reach the
/// backing device. Writeback could not read them back and retried every second for ever, the
/// engine never failed, and the write-zeroes (holding the export gate, so an export-diff
/// waited too) never returned. A writeback read error is now the cache device failing, as a
/// checksum failure already was: the engine goes on from the backing device alone with those
/// blocks lost, and the write-zeroes is answered there.
#[test]
fn a_cache_device_failing_reads_does_not_leave_a_write_zeroes_waiting_for_writeback() {
    let pair = SimPair::new(MIB + 32 * SEG_64K, 16 * MIB, SEG_64K);
    let (cache, e) = failing_cache_engine(&pair, pair.backing());
    // Writeback waits until asked: the dirty block stays in the log.
    e.set_tunable("writeback_idle_ms", "0").unwrap();
    e.set_tunable("writeback_threshold_percent", "100").unwrap();
    let (d, z) = (10u64, 300u64);
    e.write(d * 4096, &[0x5a; 4096], false).unwrap();
    e.flush().unwrap();
    assert_eq!(e.stats().dirty_blocks, 1, "the write is still dirty");
    cache.fail_next(OpKind::Read, u64::MAX, FaultKind::Io);
    let zeroer = e.clone();
    bounded(
        "a write-zeroes after the cache device's reads failed",
        move || zeroer.write_zeroes(z * 4096, 4096, false),
    )
    .expect("the write-zeroes is answered from the backing device alone");
    assert!(
        cache.injected(OpKind::Read) > 0,
        "writeback never read the cache"
    );
    let why = e
        .stats()
        .cache_failed
        .expect("status says the cache device failed");
    assert!(why.contains("writeback reading the cache"), "{why}");
    let mut buf = [0xffu8; 4096];
    e.read(z * 4096, &mut buf).unwrap();
    assert_eq!(buf, [0; 4096], "the zeroed block");
    // The dirty block's only durable copy was on the failed cache device; if its chunk was
    // still in RAM at the switch it was written to the backing device (`path::in_ram`). Either
    // way a read never returns the older data.
    match e.read(d * 4096, &mut buf) {
        Ok(()) => assert_eq!(buf, [0x5a; 4096], "the dirty block, saved from RAM"),
        Err(err) => assert_eq!(err.errno(), libc::EIO, "{err}"),
    }
}

/// Found by the concurrent simulation (seed 10091): a write-zeroes whose logged range dropped a
/// flushed dirty block's only copy, and that failed with the cache device, ended its zeroing
/// before the cache-loss switch (which waits for `backing_order`) took the lost set from the
/// zero ranges under way: the block was left out of the sectors lost at the failure, so after
/// a power cut that lost the retried zeros the backing device's older data there was taken as
/// current. Here the zeroing holds `backing_order` until its cache write fails, so the switch
/// always collects after it ended. Before the fix the set at the failure was empty.
#[test]
fn a_write_zeroes_failed_with_the_cache_keeps_its_blocks_in_the_lost_set() {
    let pair = SimPair::new(MIB + 16 * SEG_64K, 16 * MIB, SEG_64K);
    let lba = 300u64;
    pair.backing.write_raw(lba * 4096, &[0x11; 4096]);
    let (cache, e) = failing_cache_engine(&pair, pair.backing());
    // Sorted order: the logged range drops the dirty copy outright (in flush-epoch order an
    // older epoch's copy stays as a shadow, which the lost set counts anyway).
    e.set_tunable("writeback_order", "sorted").unwrap();
    e.set_tunable("writeback_threshold_percent", "100").unwrap();
    e.write(lba * 4096, &[0x44; 4096], false).unwrap();
    e.flush().unwrap();
    cache.fail_next(OpKind::Write, u64::MAX, FaultKind::Io);
    let z = e.clone();
    bounded("the write-zeroes", move || {
        z.write_zeroes(lba * 4096, 4096, false)
    })
    .expect("the write-zeroes is tried again from the backing device alone");
    let s = e.stats();
    assert!(s.serving_alone && s.failed.is_none(), "{s:?}");
    let first = lba * 8;
    let runs = e.lost_at_failure_runs();
    assert!(
        runs.iter().any(|&(f, n)| f <= first && first + 8 <= f + n),
        "sectors {first}..{} (the write-zeroes' block, whose dirty copy its logged range \
         dropped) are not in the set lost at the failure: {runs:?}",
        first + 8
    );
    // Its retry wrote the zeros: current again.
    let mut buf = [0xFFu8; 4096];
    e.read(lba * 4096, &mut buf).unwrap();
    assert_eq!(buf, [0u8; 4096]);
}

/// Seen by the concurrent simulation (a debug assertion on the `cache-failed` thread, which the
/// simulation does not watch): a power cut (`Engine::crash`) while the switch to the backing
/// device alone was marking the label. The switch then went on to serve alone on a crashed
/// engine; its assertion killed the thread before it answered, and a request waiting for its
/// decision waited for ever. Now a switch that finds the engine no longer failed for its cache
/// device stops there, and the waiting request gets its error.
#[test]
fn a_power_cut_during_the_cache_loss_switch_answers_the_waiting_request() {
    let pair = SimPair::new(MIB + 16 * SEG_64K, 16 * MIB, SEG_64K);
    let backing = Arc::new(GateDevice::new(pair.backing()));
    let (cache, e) = failing_cache_engine(&pair, backing.clone());
    e.set_tunable("writeback_threshold_percent", "100").unwrap();
    e.write(10 * 4096, &[0x5a; 4096], false).unwrap();
    e.flush().unwrap();
    // The switch's first backing write is the label's mark: hold it.
    backing.hold(OpKind::Write);
    cache.fail_next(OpKind::Write, u64::MAX, FaultKind::Io);
    let writer = e.clone();
    let flush = std::thread::spawn(move || {
        writer.write(20 * 4096, &[0x6b; 4096], false)?;
        writer.flush()
    });
    assert!(
        backing.wait_held(OpKind::Write, 1, HANG),
        "the switch never marked the backing device"
    );
    let watcher = e.clone();
    let crash = std::thread::spawn(move || e.crash());
    assert!(
        eventually(|| watcher.stats().cache_failed.is_none()),
        "the power cut never reached the engine's health"
    );
    backing.release(OpKind::Write);
    let answered = bounded("a flush waiting for the switch's decision", move || {
        flush.join().expect("the flush thread")
    });
    assert!(
        answered.is_err(),
        "the flush cannot succeed on a crashed engine"
    );
    bounded("the power cut", move || crash.join().expect("the crash"));
}

/// Concurrent simulation seed 107844: a write-zeroes' zeros reached the backing device, then
/// another thread's backing sync failed and the device dropped what no sync covered, the zeros
/// included (as Linux's page cache may after a writeback error); the write-zeroes' own sync
/// then succeeded and it marked the range applied, so recovery neither applied it again nor
/// forgot it: after a power cut the block read its old data while block status called it zero,
/// and a write-zeroes that had returned was undone. Now a zeroing whose write and sync a
/// failed sync came between is written and synced again.
#[test]
fn a_write_zeroes_is_not_marked_applied_by_a_sync_after_one_that_dropped_its_zeros() {
    let pair = SimPair::new(MIB + 16 * SEG_64K, 16 * MIB, SEG_64K);
    let lba = 40u64;
    pair.backing.write_raw(lba * 4096, &[0x11; 4096]);
    let opts = manual(4 * SEG_64K);
    let (faulty, backing, e) = faulty_gated_engine(&pair, opts.clone());
    e.set_tunable("cache_mode", "write-through").unwrap();
    // A write-through write, so the flush below owes the backing device a sync.
    e.write(8 * 4096, &[0x22; 4096], false).unwrap();
    // The zeroing reaches the backing device and is held before it returns.
    backing.hold_after(OpKind::Discard);
    let zeroer = e.clone();
    let zeroing = std::thread::spawn(move || zeroer.write_zeroes(lba * 4096, 4096, false));
    assert!(
        backing.wait_held(OpKind::Discard, 1, HANG),
        "the write-zeroes never zeroed the backing device"
    );
    // Meanwhile the flush's backing sync fails, and the device drops every unsynced write.
    faulty.fail_next(OpKind::Flush, 1, FaultKind::Io);
    let flusher = e.clone();
    assert!(
        bounded("the flush", move || flusher.flush()).is_err(),
        "the flush whose backing sync failed"
    );
    pair.backing.crash_lose_all();
    backing.release(OpKind::Discard);
    bounded("the write-zeroes", move || zeroing.join().unwrap())
        .expect("the write-zeroes with the backing device healthy again");
    let cache_cut = power_cut_copy(&pair.cache);
    let backing_cut = power_cut_copy(&pair.backing);
    let written_again = e.stats().counters.zeros_written_again;
    e.crash();
    let e2 = Engine::open(Arc::new(cache_cut), Arc::new(backing_cut), opts).unwrap();
    let mut buf = [0u8; 4096];
    e2.read(lba * 4096, &mut buf).unwrap();
    let mut extents = Vec::new();
    e2.block_status(lba * 4096, 4096, 8, &mut extents).unwrap();
    assert!(
        buf == [0u8; 4096],
        "block {lba} reads {:#x}.. after a power cut, not the zeros of a write-zeroes that \
         returned OK (block status: {extents:?})",
        buf[0]
    );
    assert_eq!(written_again, 1, "the zeros written again once");
    e2.close().unwrap();
}

/// A backing device whose first sync after a write of `trigger` at offset 0 fails and drops
/// every write no sync covered (as Linux's page cache may after a writeback error).
struct DropsAfter {
    inner: Arc<SimDevice>,
    trigger: u8,
    armed: AtomicBool,
    failed: AtomicBool,
}

impl BlockDevice for DropsAfter {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        if offset == 0 && buf.first() == Some(&self.trigger) && !self.failed.load(Ordering::SeqCst)
        {
            self.armed.store(true, Ordering::SeqCst);
        }
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        if self.armed.swap(false, Ordering::SeqCst) {
            self.failed.store(true, Ordering::SeqCst);
            self.inner.crash_lose_all();
            return Err(std::io::Error::other(
                "injected: a sync that dropped what it covered",
            ));
        }
        self.inner.flush()
    }
    fn discard(&self, offset: u64, len_bytes: u64) -> std::io::Result<()> {
        self.inner.discard(offset, len_bytes)
    }
    fn describe(&self) -> String {
        "a backing device dropping writes with a failed sync".into()
    }
}

/// Long sweep, cache-loss seed 101575: the switch to the backing device alone writes the dirty
/// copies still in RAM one flush epoch at a time, each synced. Block 0's older epoch's copy
/// landed and was synced, which found its sectors again (no longer lost); the newer epoch's
/// copy then failed to land (its sync failed, dropping it). The block read the older epoch's
/// data, and a flush returned OK over the newest write, acknowledged and now gone. Now a sector
/// is found again only with its newest epoch: it stays lost (reads EIO, flushes fail).
#[test]
fn a_sector_whose_newest_epoch_in_ram_failed_to_land_stays_lost() {
    let pair = SimPair::new(MIB + 16 * SEG_64K, 16 * MIB, SEG_64K);
    let cache = Arc::new(FaultDevice::new(pair.cache()));
    let backing = Arc::new(DropsAfter {
        inner: Arc::new(pair.backing.clone()),
        trigger: 3,
        armed: AtomicBool::new(false),
        failed: AtomicBool::new(false),
    });
    let opts = OpenOptions {
        seal_interval_ms: Some(0),
        ..OpenOptions::default()
    };
    let e = Engine::open(cache.clone(), backing.clone(), opts).unwrap();
    e.set_tunable("writeback_threshold_percent", "100").unwrap();
    // Epoch 1, flushed: durable on the cache device and still in its segment's RAM buffer.
    e.write(0, &[1; 4096], false).unwrap();
    e.flush().unwrap();
    // Epoch 2, in the open chunk: block 0 again (its epoch-1 copy kept as a shadow).
    e.write(0, &[3; 4096], false).unwrap();
    cache.fail_next(OpKind::Write, u64::MAX, FaultKind::Io);
    cache.fail_next(OpKind::Flush, u64::MAX, FaultKind::Io);
    let _ = e.flush();
    assert!(
        eventually(|| e.stats().serving_alone),
        "the engine never served from the backing device alone: {:?}",
        e.stats()
    );
    assert!(
        backing.failed.load(Ordering::SeqCst),
        "the newer epoch's sync never failed"
    );
    let mut buf = [0u8; 4096];
    if e.read(0, &mut buf).is_ok() {
        assert!(
            buf == [3; 4096],
            "block 0 reads {:#x}.., older than its newest acknowledged write",
            buf[0]
        );
    }
    assert!(
        e.flush().is_err(),
        "a flush returned OK while the newest write of block 0 is gone"
    );
    e.crash();
}

/// Long sweep, cache-loss seed 101855: a write-through write of block 0 reached the backing
/// device; a partial write-through of the same block then dropped its cached copy (the new
/// copy holds only its own sector); a backing sync failed, dropping both writes. Writeback
/// wrote the partial copy again and the next flush returned OK, with sector 0 back to its old
/// data. Now the dropped copy counts as evicted: nothing can write the first write again, so
/// flushes fail (until the cache is reopened) instead of returning OK.
#[test]
fn a_partial_write_through_over_an_unsynced_one_keeps_flushes_truthful() {
    let pair = SimPair::new(MIB + 16 * SEG_64K, 16 * MIB, SEG_64K);
    let backing = Arc::new(FaultDevice::new(pair.backing()));
    let opts = manual(4 * SEG_64K);
    let e = Engine::open(pair.cache(), backing.clone(), opts.clone()).unwrap();
    e.set_tunable("cache_mode", "write-through").unwrap();
    e.write(0, &[0x44; 4096], false).unwrap();
    e.write(512, &[0x55; 512], false).unwrap();
    backing.fail_next(OpKind::Flush, 1, FaultKind::Io);
    assert!(e.flush().is_err(), "the flush whose backing sync failed");
    pair.backing.crash_lose_all();
    for _ in 0..3 {
        if e.flush().is_ok() {
            let image = pair.backing.durable_image();
            assert!(
                image[..512] == [0x44; 512] && image[512..1024] == [0x55; 512],
                "a flush returned OK with block 0 not durable: sector 0 holds {:#x}..",
                image[0]
            );
        }
    }
    e.crash();
}

/// Long sweep, seed 118513: a writer that finds the open chunk full seals it (a chunk full of
/// acknowledged writes) and puts its own write in the next chunk, or waits for room when no
/// RAM buffer is free for the next segment. Nothing asked for a sync of the sealed chunk: the
/// periodic seal looked only at the open chunk's oldest write, so the sealed chunk's writes
/// waited for the next chunk's deadline (a whole interval late), or, with the next segment
/// never opened, for ever; a power cut after the interval lost writes the seal interval
/// promised durable. Now the periodic seal keeps the oldest write of chunks sealed meanwhile
/// and asks for their sync at its deadline.
#[test]
fn a_chunk_a_writer_sealed_is_synced_by_its_own_writes_deadline() {
    let pair = SimPair::new(MIB + 16 * SEG_64K, 16 * MIB, SEG_64K);
    let opts = OpenOptions {
        seal_interval_ms: Some(1000),
        ..manual(4 * SEG_64K)
    };
    let e = Engine::open(pair.cache(), pair.backing(), opts.clone()).unwrap();
    e.write(0, &[7; 4096], false).unwrap();
    // Block 0's write arrived before this moment; the writes below fill its chunk.
    let after_first = Instant::now();
    std::thread::sleep(Duration::from_millis(2));
    let mut lba = 1u64;
    while e.stats().counters.chunks_sealed == 0 {
        assert!(
            lba < 64,
            "no chunk was sealed by a writer after {lba} writes"
        );
        e.write(lba * 4096, &[7; 4096], false).unwrap();
        lba += 1;
    }
    // Block 0's deadline has passed; the open chunk's (the last write's, later) has not.
    e.seal_if_due(after_first + Duration::from_millis(1000));
    e.run_flusher().unwrap();
    e.crash();
    pair.cache.crash_lose_all();
    let e = Engine::open(pair.cache(), pair.backing(), opts).unwrap();
    let mut b = [0u8; 4096];
    e.read(0, &mut b).unwrap();
    assert!(
        b == [7u8; 4096],
        "block 0 reads {:#x}.. after a power cut, though its write waited the seal interval \
         (its chunk was sealed by a later write, {} writes in all)",
        b[0],
        lba
    );
    e.close().unwrap();
}

/// A dirty block (40) durable in the cache, a write-through write (block 8) whose sync a flush
/// owes the backing device, and a writeback batch of block 40 held on the backing device after
/// its write, before it returns (the set-up of the two failed-sync tests below).
struct HeldBatch {
    pair: SimPair,
    faulty: Arc<FaultDevice>,
    backing: Arc<GateDevice>,
    e: Engine,
    lba: u64,
    batch: std::thread::JoinHandle<logcache_engine::Result<u64>>,
}

/// A write-through write of block 8, so a flush owes the backing device a sync (switching to
/// write-through drains dirty blocks: this comes first); then `data` written at
/// `offset_bytes` the write-back way, durable in the cache (a due periodic seal, not a flush:
/// a flush would pay the sync owed).
fn dirty_in_the_cache_with_a_sync_owed(e: &Engine, offset_bytes: u64, data: &[u8]) {
    e.set_tunable("cache_mode", "write-through").unwrap();
    e.write(8 * 4096, &[0x33; 4096], false).unwrap();
    e.set_tunable("cache_mode", "write-back").unwrap();
    e.write(offset_bytes, data, false).unwrap();
    e.seal_if_due(Instant::now() + Duration::from_secs(3600));
    e.run_flusher().unwrap();
}

/// A writeback batch on its own thread, returned once its write reached the backing device and
/// is held there before it returns.
fn writeback_held_after_its_write(
    e: &Engine,
    backing: &GateDevice,
) -> std::thread::JoinHandle<logcache_engine::Result<u64>> {
    backing.hold_after(OpKind::Write);
    let wb = e.clone();
    let batch = std::thread::spawn(move || wb.writeback_step(16));
    assert!(
        backing.wait_held(OpKind::Write, 1, HANG),
        "writeback never wrote the dirty block"
    );
    batch
}

fn writeback_batch_held_at_its_write() -> HeldBatch {
    let pair = SimPair::new(MIB + 16 * SEG_64K, 16 * MIB, SEG_64K);
    let lba = 40u64;
    pair.backing.write_raw(lba * 4096, &[0x11; 4096]);
    let (faulty, backing, e) = faulty_gated_engine(&pair, sealing_each_second());
    dirty_in_the_cache_with_a_sync_owed(&e, lba * 4096, &[0x22; 4096]);
    let batch = writeback_held_after_its_write(&e, &backing);
    HeldBatch {
        pair,
        faulty,
        backing,
        e,
        lba,
        batch,
    }
}

/// Long sweep, seed 120988: a writeback batch wrote its blocks to the backing device; another
/// thread's backing sync then failed, and the device dropped every write no sync covered (as
/// Linux's page cache may after a writeback error), the batch's included; the batch's own
/// sync succeeded and it marked the blocks clean on its strength. In the sim the batch was the
/// rewrite of a write-through FUA write that an earlier failed sync had lost; its cached copy
/// was a hole in the log, so after a power cut the sector read its old data. Now a batch
/// whose writes and sync a failed sync came between is written and synced again.
#[test]
fn a_writeback_batch_is_not_marked_clean_by_a_sync_after_one_that_dropped_it() {
    let HeldBatch {
        pair,
        faulty,
        backing,
        e,
        lba,
        batch,
    } = writeback_batch_held_at_its_write();
    // Meanwhile the flush's backing sync fails, and the device drops every unsynced write.
    faulty.fail_next(OpKind::Flush, 1, FaultKind::Io);
    let flusher = e.clone();
    assert!(
        bounded("the flush", move || flusher.flush()).is_err(),
        "the flush whose backing sync failed"
    );
    pair.backing.crash_lose_all();
    backing.release(OpKind::Write);
    let cleaned = bounded("the writeback batch", move || batch.join().unwrap())
        .expect("the batch, with the backing device healthy again");
    // (The write-through copy of block 8 became dirty with the failed sync; block 40 is the
    // batch's one block.)
    assert_eq!(cleaned, 1, "the batch marked block {lba} clean");
    let on_backing = pair.backing.durable_image()[(lba * 4096) as usize];
    assert!(
        on_backing == 0x22,
        "block {lba} marked clean while the backing device holds {on_backing:#x}.. for \
         good, not its data"
    );
    assert_eq!(e.stats().counters.writeback_written_again, 1);
    e.crash();
}

/// Polls until `done` or the engine shows a backing sync waiting for an older one still in
/// flight; panics after `HANG`.
fn until_done_or_a_sync_waits(e: &Engine, done: impl Fn() -> bool) {
    assert!(
        eventually(|| done() || e.stats().counters.backing_syncs_waited > 0),
        "neither finished nor waited for the held sync"
    );
}

/// The window the check above left open (56e9a75, RELIABILITY "left open"): the failing
/// thread counted its failure (`Bypass::losses`) only after its sync returned, so a batch
/// whose own sync succeeded in between, while the failed one was still on its way back,
/// was marked clean on its strength though the failed sync had dropped its writes. Now the
/// backing device's wrapper counts a failure before the failed sync returns, and a successful
/// sync returns only once every sync in flight beside it has ended (`backing.rs`).
#[test]
fn a_writeback_batch_is_not_marked_clean_while_the_sync_that_dropped_it_returns() {
    let HeldBatch {
        pair,
        faulty,
        backing,
        e,
        lba,
        batch,
    } = writeback_batch_held_at_its_write();
    // A flush's backing sync fails, the device drops every unsynced write, and the failed
    // sync is held before it returns to its thread.
    backing.hold_next_after(OpKind::Flush);
    faulty.fail_next(OpKind::Flush, 1, FaultKind::Io);
    let f = e.clone();
    let flush = std::thread::spawn(move || f.flush());
    assert!(
        backing.wait_held(OpKind::Flush, 1, HANG),
        "the flush never synced the backing device"
    );
    pair.backing.crash_lose_all();
    // The batch goes on: its own sync succeeds while the failed one is still held.
    backing.release(OpKind::Write);
    until_done_or_a_sync_waits(&e, || batch.is_finished());
    backing.release(OpKind::Flush);
    assert!(
        bounded("the flush", move || flush.join().unwrap()).is_err(),
        "the flush whose backing sync failed"
    );
    let cleaned = bounded("the writeback batch", move || batch.join().unwrap())
        .expect("the batch, with the backing device healthy again");
    assert_eq!(cleaned, 1, "the batch marked block {lba} clean");
    let on_backing = pair.backing.durable_image()[(lba * 4096) as usize];
    assert!(
        on_backing == 0x22,
        "block {lba} marked clean while the backing device holds {on_backing:#x}.. for \
         good, not its data (a sync that failed beside the batch's had not returned)"
    );
    assert_eq!(e.stats().counters.writeback_written_again, 1);
    e.crash();
}

/// The same window for a sync that vouches for write-through writes: flush A's backing sync
/// fails and drops a write-through write, and is held before it returns; flush B's sync
/// succeeds meanwhile. B noted the writes synced (`synced_gen`) and returned OK; A then found
/// nothing at risk, and a power cut lost the write a flush had returned OK for. Now B's sync
/// returns once A's has ended, and B handles A's failure first if A's thread has not yet
/// (`State::note_backing_synced`), so B rewrites the copy or fails.
#[test]
fn a_flush_is_not_vouched_for_by_a_sync_beside_one_that_failed() {
    let pair = SimPair::new(MIB + 16 * SEG_64K, 16 * MIB, SEG_64K);
    let (faulty, backing, e) = faulty_gated_engine(&pair, manual(4 * SEG_64K));
    e.set_tunable("cache_mode", "write-through").unwrap();
    e.write(0, &[0x44; 4096], false).unwrap();
    backing.hold_next_after(OpKind::Flush);
    faulty.fail_next(OpKind::Flush, 1, FaultKind::Io);
    let a = e.clone();
    let flush_a = std::thread::spawn(move || a.flush());
    assert!(
        backing.wait_held(OpKind::Flush, 1, HANG),
        "flush A never synced the backing device"
    );
    pair.backing.crash_lose_all();
    let b = e.clone();
    let flush_b = std::thread::spawn(move || b.flush());
    until_done_or_a_sync_waits(&e, || flush_b.is_finished());
    backing.release(OpKind::Flush);
    assert!(
        bounded("flush A", move || flush_a.join().unwrap()).is_err(),
        "flush A, whose backing sync failed"
    );
    let b_ok = bounded("flush B", move || flush_b.join().unwrap()).is_ok();
    let flushed = b_ok || (0..3).any(|_| e.flush().is_ok());
    assert!(
        flushed,
        "no flush returned OK with the backing device healthy"
    );
    after_a_power_cut_blocks_read(&pair, e, manual(4 * SEG_64K), &[(0, 0x44)]);
}

/// Sim seed 203777: a reserved write (a large write received straight into the log) that
/// publishes after a writer sealed its chunk and found the log full charged the older copy it
/// replaced to the chunk being filled next, which could open only once the head passed that
/// copy's segment: every writer waited for room for ever. Set-up: block 0's copy in the head
/// segment, the ring filled to its last usable segment with writeback held (the head cannot
/// move); a flush whose chunk write is held keeps the flusher from cancelling the
/// reservation; a reservation of block 0; a large write fills the chunk and waits for room;
/// the reservation publishes; everything is released. The large write must complete.
#[test]
fn a_reserved_write_published_with_the_log_full_does_not_stop_the_head() {
    let segments = 8u64;
    let pair = SimPair::new(MIB + segments * SEG_64K, 64 * MIB, SEG_64K);
    let cache = Arc::new(GateDevice::new(pair.cache()));
    let backing = Arc::new(GateDevice::new(pair.backing()));
    let opts = OpenOptions {
        ram_buffer_bytes: segments * SEG_64K,
        seal_interval_ms: Some(0),
        ..OpenOptions::default()
    };
    let e = Engine::open(cache.clone(), backing.clone(), opts).unwrap();
    backing.hold(OpKind::Write);
    e.write(0, &[0xA0; 4096], false).unwrap();
    // Other blocks until the last segment writers may open is open.
    let mut lba = 1u64;
    while e.stats().segments_free > 1 {
        assert!(lba < 1000, "the ring never filled: {:?}", e.stats());
        e.write(lba * 4096, &[lba as u8; 4096], false).unwrap();
        lba += 1;
    }
    // Log writes only (the superblock and checkpoints, before the log, pass).
    cache.hold_range(OpKind::Write, MIB, segments * SEG_64K);
    let sealed_before = e.stats().counters.chunks_sealed;
    let flusher = e.clone();
    let flush = std::thread::spawn(move || flusher.flush());
    // The flush sealed its chunk (cancelling reservations then: none yet), and the flusher is
    // held writing.
    assert!(
        eventually(|| e.stats().counters.chunks_sealed > sealed_before),
        "the flush never sealed its chunk"
    );
    assert!(
        cache.wait_held(OpKind::Write, 1, HANG),
        "the flusher never wrote a chunk"
    );
    let mut reservation = e
        .reserve_write(0, 4096)
        .unwrap()
        .expect("room for a reservation in the last segment");
    for i in 0..reservation.piece_count() {
        reservation.piece(i).fill(0xB0);
    }
    let waits_before = e.stats().counters.write_waits;
    let writer = e.clone();
    let (done_tx, done_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = done_tx.send(writer.write(2000 * 4096, &vec![0xC0; 64 * 4096], false));
    });
    assert!(
        eventually(|| e.stats().counters.write_waits > waits_before),
        "the large write never waited for room"
    );
    let mut redo = Vec::new();
    assert!(
        reservation.commit(&mut redo),
        "the reservation gave up publishing"
    );
    cache.release(OpKind::Write);
    backing.release(OpKind::Write);
    flush.join().unwrap().unwrap();
    done_rx
        .recv_timeout(HANG)
        .expect("the large write waited for room for ever: the head segment waits for the sync of a chunk that cannot open")
        .unwrap();
    let mut buf = [0u8; 4096];
    e.read(0, &mut buf).unwrap();
    assert!(buf == [0xB0; 4096], "block 0 reads {:#x}", buf[0]);
    e.close().unwrap();
}

/// Long sweep, cache-loss seed 138563: a writeback batch took a partly dirty block (one
/// sector dirty, the rest clean); a failed backing sync then marked its clean sectors dirty
/// again (`state/lost.rs`: a write-through write no sync covered may be gone, and every copy
/// logged after it is written back again), and a write of the block after that flush made the
/// batch's copy a shadow (a dirty copy of an older flush epoch). The batch, finding a shadow
/// whose dirty sectors were not the ones it took, asserted "a shadow changed": the writeback
/// thread panicked and the engine failed. Now the shadow stays dirty for a later batch.
#[test]
fn a_block_marked_dirty_again_and_shadowed_while_written_back_stays_for_the_next_batch() {
    let pair = SimPair::new(MIB + 16 * SEG_64K, 16 * MIB, SEG_64K);
    let lba = 40u64;
    let (faulty, backing, e) = faulty_gated_engine(&pair, sealing_each_second());
    // Block 40 cached whole and clean.
    e.write(lba * 4096, &[0x11; 4096], false).unwrap();
    e.flush().unwrap();
    while e.writeback_step(16).unwrap() > 0 {}
    // A write-through write, so a failed sync leaves a write at risk; sector 3 of block 40
    // dirty, the rest clean, durable in the cache. Writeback takes that copy (one dirty
    // sector) and is held after its backing write.
    dirty_in_the_cache_with_a_sync_owed(&e, lba * 4096 + 3 * 512, &[0x22; 512]);
    let batch = writeback_held_after_its_write(&e, &backing);
    // A flush's backing sync fails: the clean sectors of the batch's copy become dirty.
    let redirtied = e.stats().counters.bypass_copies_redirtied;
    faulty.fail_next(OpKind::Flush, 1, FaultKind::Io);
    let f = e.clone();
    assert!(
        bounded("the flush", move || f.flush()).is_err(),
        "the flush whose backing sync failed"
    );
    assert!(
        e.stats().counters.bypass_copies_redirtied >= redirtied + 2,
        "the failed sync marked the copies of blocks 8 and {lba} dirty again"
    );
    // Sector 6 written after that flush: the batch's copy becomes a shadow.
    let shadows = e.stats().counters.shadows_kept;
    e.write(lba * 4096 + 6 * 512, &[0x44; 512], false).unwrap();
    assert_eq!(
        e.stats().counters.shadows_kept,
        shadows + 1,
        "the batch's copy of block {lba} kept as a shadow"
    );
    backing.release(OpKind::Write);
    let joined = bounded("the writeback batch", move || batch.join());
    assert!(
        joined.is_ok(),
        "the writeback batch panicked on the shadow it had taken while live"
    );
    // Everything written back with the backing device healthy; a flush then succeeds.
    let mut steps = 0;
    while e.writeback_step(16).unwrap() > 0 {
        steps += 1;
        assert!(steps < 64, "writeback never finished");
    }
    e.flush().unwrap();
    assert_eq!(
        e.stats().dirty_blocks,
        0,
        "dirty blocks left after the drain"
    );
    let image = pair.backing.durable_image();
    let block = &image[(lba * 4096) as usize..((lba + 1) * 4096) as usize];
    for (s, sector) in block.chunks(512).enumerate() {
        let want = match s {
            3 => 0x22,
            6 => 0x44,
            _ => 0x11,
        };
        assert!(
            sector.iter().all(|&x| x == want),
            "sector {s} of block {lba} holds {:#x}.. on the backing device, not {want:#x}",
            sector[0]
        );
    }
    assert!(image[(8 * 4096) as usize..(9 * 4096) as usize]
        .iter()
        .all(|&x| x == 0x33));
    e.close().unwrap();
}

/// After a failed backing sync that dropped what no sync covered (`crash_lose_all`), a flush
/// either fails or the backing device holds `data` at block `lba` for good.
fn a_flush_vouches_only_for_what_the_backing_device_holds(
    e: &Engine,
    pair: &SimPair,
    lba: u64,
    data: u8,
) {
    pair.backing.crash_lose_all();
    if e.flush().is_ok() {
        let image = pair.backing.durable_image();
        let block = &image[(lba * 4096) as usize..((lba + 1) * 4096) as usize];
        assert!(
            block.iter().all(|&x| x == data),
            "a flush returned OK, but block {lba} holds {:#x}.. on the backing device, not the \
             acknowledged {data:#x}",
            block[0]
        );
    }
}

/// Starts a write of 0x77 over block `lba` and waits until the backing device holds it.
fn write_around_held_at_the_backing_device(
    e: &Engine,
    backing: &GateDevice,
    lba: u64,
) -> std::thread::JoinHandle<Result<(), Error>> {
    let writer = e.clone();
    let write = std::thread::spawn(move || writer.write(lba * 4096, &[0x77; 4096], false));
    assert!(
        backing.wait_held(OpKind::Write, 1, HANG),
        "the write-around write never reached the backing device"
    );
    write
}

/// Cache-loss sim seed 150057: a write-around write was under way when the cache device failed.
/// The switch to the backing device alone took the unsynced bypass writes (none: this one had
/// not ended) and then its own sync failed after the write's data had landed, dropping it; the
/// write then ended in the cached path and was acknowledged, and a flush served alone returned
/// OK, since no write sent alone was unsynced. Now such a write returns an error to the cached
/// path and is sent again from the backing device alone. Here the sync that fails comes after
/// the switch; before the fix the second flush returned OK with the block's data gone.
#[test]
fn a_write_around_under_way_when_the_cache_fails_is_sent_again_alone() {
    let pair = SimPair::new(MIB + 16 * SEG_64K, 16 * MIB, SEG_64K);
    let faulty = Arc::new(FaultDevice::new(pair.backing()));
    let backing = Arc::new(GateDevice::new(faulty.clone()));
    let (cache, e) = failing_cache_engine(&pair, backing.clone());
    e.set_tunable("cache_mode", "write-around").unwrap();
    let lba = 10u64;
    backing.hold_range(OpKind::Write, lba * 4096, 4096);
    let write = write_around_held_at_the_backing_device(&e, &backing, lba);
    e.set_tunable("cache_mode", "write-back").unwrap();
    fail_cache_under_a_flush(&e, &cache);
    backing.release(OpKind::Write);
    bounded("the write-around write", move || write.join().unwrap())
        .expect("the write, sent again alone if need be");
    faulty.fail_next(OpKind::Flush, 1, FaultKind::Io);
    assert!(e.flush().is_err(), "the flush whose backing sync failed");
    a_flush_vouches_only_for_what_the_backing_device_holds(&e, &pair, lba, 0x77);
}

/// Found reviewing the fix above: a write-around write whose data had landed when another
/// thread's backing sync failed was not counted by that failure's handler (a bypass write is
/// counted unsynced only when it ends), so once it ended the next sync vouched for it though
/// the failure may have dropped it (it has no copy to write again). Now a write-around write
/// that saw a sync fail while under way counts as lost: flushes fail. Before the fix the
/// second flush returned OK with the block's data gone.
#[test]
fn a_write_around_under_way_when_a_backing_sync_fails_counts_as_lost() {
    let pair = SimPair::new(MIB + 16 * SEG_64K, 16 * MIB, SEG_64K);
    let (faulty, backing, e) = faulty_gated_engine(&pair, manual(4 * SEG_64K));
    // A write-through write the flush's sync owes: its copy is written again after the failure.
    e.set_tunable("cache_mode", "write-through").unwrap();
    e.write(5 * 4096, &[0x55; 4096], false).unwrap();
    e.set_tunable("cache_mode", "write-around").unwrap();
    let lba = 10u64;
    // Held once its data is on the device, before the write returns to the engine.
    backing.hold_after(OpKind::Write);
    let write = write_around_held_at_the_backing_device(&e, &backing, lba);
    faulty.fail_next(OpKind::Flush, 1, FaultKind::Io);
    assert!(e.flush().is_err(), "the flush whose backing sync failed");
    backing.release(OpKind::Write);
    bounded("the write-around write", move || write.join().unwrap())
        .expect("the write-around write");
    a_flush_vouches_only_for_what_the_backing_device_holds(&e, &pair, lba, 0x77);
}

/// Cache-loss sim seed 190738: an export (`export_begin`) planned a read of a clean cached
/// block; before its cache-device read ended, the cache device failed, the disk went on from
/// the backing device alone, and a write changed that block there. Changes served alone never
/// pass the export's hold (no copy of the moment's content is kept), and the read, failing
/// at the cache device, took the clean block from the backing device: the export shipped bytes
/// written after its moment. Now an export that meets the switch fails, saying why (its
/// checkpoints were on the cache device). Before the fix the read returned the later bytes.
#[test]
fn an_export_under_way_when_the_cache_fails_ships_nothing_newer_than_its_moment() {
    let pair = SimPair::new(MIB + 16 * SEG_64K, 16 * MIB, SEG_64K);
    let faulty = Arc::new(FaultDevice::new(pair.cache()));
    let gate = Arc::new(GateDevice::new(faulty.clone()));
    let opts = OpenOptions {
        ram_buffer_bytes: 4 * SEG_64K,
        seal_interval_ms: Some(0),
        ..OpenOptions::default()
    };
    let e = Engine::open(gate.clone(), pair.backing(), opts).unwrap();
    // Every read of the block goes to the cache device (no RAM-cache copy can answer it).
    e.set_tunable("ram_cache_mib", "0").unwrap();
    e.checkpoint_create("since").unwrap();
    // A block changed since the checkpoint, cached and clean (written back).
    let lba = 3u64;
    e.write(lba * 4096, &[0x11; 4096], false).unwrap();
    // More than the log's RAM buffers hold after it, so the block is read from the device.
    for b in 64..64 + 2 * (4 * SEG_64K / 4096) {
        e.write(b * 4096, &[0x33; 4096], false).unwrap();
    }
    e.flush().unwrap();
    while e.writeback_step(256).unwrap() > 0 {}
    assert_eq!(e.stats().dirty_blocks, 0, "{:?}", e.stats());
    let mut export = e.export_begin("moment", "since", MIB).unwrap();
    assert!(
        export.runs().iter().any(|&(f, n)| f <= lba && lba < f + n),
        "the block is one to export: {:?}",
        export.runs()
    );
    // A write for the flush below to write to the cache device (its block is not one to
    // export: it passes the hold at once).
    e.write(20 * 4096, &[0x6b; 4096], false).unwrap();
    // The export's read of the block, held at the cache device (holding the hold: a write in
    // the cached path would wait for it).
    gate.hold(OpKind::Read);
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 4096];
        let r = export.read(lba, &mut buf);
        (r, buf)
    });
    assert!(
        gate.wait_held(OpKind::Read, 1, HANG),
        "the export never read the cache device"
    );
    // The cache device fails under the flush: the disk goes on from the backing device alone.
    faulty.fail_next(OpKind::Write, u64::MAX, FaultKind::Io);
    faulty.fail_next(OpKind::Read, u64::MAX, FaultKind::Io);
    let other = e.clone();
    bounded("a flush as the cache device fails", move || other.flush())
        .expect("answered from the backing device alone");
    assert!(e.stats().serving_alone, "{:?}", e.stats());
    // A change after the moment, served alone: it never passes the export's hold.
    e.write(lba * 4096, &[0x22; 4096], false).unwrap();
    gate.release(OpKind::Read);
    let (r, buf) = bounded("the export's read", move || reader.join().unwrap());
    match r {
        Ok(()) => assert!(
            buf.iter().all(|&b| b == 0x11),
            "the export shipped bytes written after its moment (first byte {:#x})",
            buf[0]
        ),
        Err(Error::Export(why)) => assert!(why.contains("cache device failed"), "{why}"),
        Err(other) => panic!("an unexpected error: {other}"),
    }
}

/// Found reviewing the fix above: a checkpoint's changed blocks (`checkpoint_changes`, what
/// NBD block status answers for `qemu:dirty-bitmap:NAME`) were still answered once the disk was
/// served from the backing device alone, where changes are not tracked: a backup tool asking
/// which blocks changed was told nothing of the writes made alone, and its incremental backup
/// silently missed them. Now the query fails, saying why. Before the fix it answered with the
/// block written alone unchanged.
#[test]
fn a_checkpoint_served_alone_does_not_answer_without_the_changes_made_alone() {
    let pair = SimPair::new(MIB + 16 * SEG_64K, 16 * MIB, SEG_64K);
    let (cache, e) = failing_cache_engine(&pair, pair.backing());
    e.checkpoint_create("since").unwrap();
    let lba = 7u64;
    let changed = |e: &Engine| {
        e.checkpoint_changes("since", lba * 4096, 4096, 4)
            .map(|runs| runs.iter().any(|&(_, set)| set))
    };
    assert!(!changed(&e).unwrap(), "nothing changed yet");
    fail_cache_under_a_flush(&e, &cache);
    e.write(lba * 4096, &[0x22; 4096], false).unwrap();
    match changed(&e) {
        Ok(set) => assert!(set, "the block written alone is reported unchanged"),
        Err(Error::Export(why)) => assert!(why.contains("no longer tracks changes"), "{why}"),
        Err(other) => panic!("an unexpected error: {other}"),
    }
}
