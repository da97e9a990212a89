//! Engine behaviours beyond plain read/write: group commit, the periodic seal, a full log and
//! writeback, drain, tunables, device faults, checksum errors, and many writer threads.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use logcache_engine::io::memory::MemDevice;
use logcache_engine::io::BlockDevice;
use logcache_engine::{format_cache, Engine, Error, FormatOptions, OpenOptions};
use logcache_testkit::fault::{FaultDevice, FaultKind, OpKind};
use logcache_testkit::rng::Rng;

const KIB: u64 = 1024;
const MIB: u64 = 1 << 20;

/// A flush after each small write costs a chunk, not a segment: 100 write+flush pairs on
/// 1 MiB segments fit in one or two segments. A flush with nothing new does no IO.
#[test]
fn flushes_do_not_burn_segments() {
    let pair = SimPair::new(MIB + 64 * MIB, 64 * MIB, MIB);
    let e = Engine::open(pair.cache(), pair.backing(), manual(4 * MIB)).unwrap();
    for i in 0..100u64 {
        e.write(i * 4096, &[i as u8; 4096], false).unwrap();
        e.flush().unwrap();
    }
    let s = e.stats();
    assert_eq!(s.counters.chunks_written, 100);
    assert!(
        s.segments_in_use <= 2,
        "{} segments for 100 flushes",
        s.segments_in_use
    );
    let syncs = pair.cache.flush_count();
    let writes = pair.cache.write_count();
    for _ in 0..50 {
        e.flush().unwrap();
    }
    assert_eq!(
        pair.cache.flush_count(),
        syncs,
        "an empty flush synced the device"
    );
    assert_eq!(pair.cache.write_count(), writes, "an empty flush wrote");
}

/// A device whose sync takes a while, so that flushes from many threads overlap.
struct SlowSync(MemDevice);

impl BlockDevice for SlowSync {
    fn size_bytes(&self) -> u64 {
        self.0.size_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.0.write_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        std::thread::sleep(Duration::from_millis(5));
        self.0.flush()
    }
    fn discard(&self, offset: u64, len_bytes: u64) -> std::io::Result<()> {
        self.0.discard(offset, len_bytes)
    }
    fn describe(&self) -> String {
        "slow-sync memory".into()
    }
}

/// Group commit: flushes that arrive while a sync is running share the next sync.
#[test]
fn concurrent_flushes_share_syncs() {
    let cache: Arc<dyn BlockDevice> = Arc::new(SlowSync(MemDevice::new(MIB + 32 * MIB)));
    let backing: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(64 * MIB));
    format_cache(&*cache, &*backing, &FormatOptions::default()).unwrap();
    let e = Engine::open(cache, backing, OpenOptions::default()).unwrap();
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let e = e.clone();
            std::thread::spawn(move || {
                for i in 0..20u64 {
                    e.write((t * 100 + i) * 4096, &[t as u8; 4096], false)
                        .unwrap();
                    e.flush().unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let s = e.stats();
    assert_eq!(s.counters.flushes, 160);
    assert!(
        s.counters.cache_syncs < 100,
        "{} syncs for 160 concurrent flushes: no grouping",
        s.counters.cache_syncs
    );
    e.close().unwrap();
}

/// Unflushed writes do not stay in RAM forever: once the seal interval passes, the flusher
/// seals and syncs them on its own.
#[test]
fn the_periodic_seal_makes_old_writes_durable() {
    let pair = SimPair::new(MIB + 16 * SEG_64K, 16 * MIB, SEG_64K);
    let opts = OpenOptions {
        seal_interval_ms: Some(1000),
        ..manual(4 * SEG_64K)
    };
    let e = Engine::open(pair.cache(), pair.backing(), opts.clone()).unwrap();
    e.write(0, &[7; 4096], false).unwrap();
    let now = Instant::now();
    e.seal_if_due(now);
    e.run_flusher().unwrap();
    assert_eq!(
        e.stats().counters.chunks_written,
        0,
        "sealed before the interval passed"
    );
    e.seal_if_due(now + Duration::from_millis(1500));
    e.run_flusher().unwrap();
    assert_eq!(e.stats().counters.periodic_seals, 1);
    e.crash();
    pair.cache.crash_lose_all();
    let e = Engine::open(pair.cache(), pair.backing(), opts).unwrap();
    let mut b = [0u8; 4096];
    e.read(0, &mut b).unwrap();
    assert_eq!(b, [7u8; 4096]);
}

const SEG_64K: u64 = 64 * KIB;

/// A log full of dirty blocks makes room by writing back (the manual-mode writer does it
/// inline; a threaded writer waits for the writeback thread): four times the cache's capacity
/// of distinct blocks all fit, and all read back.
#[test]
fn a_log_full_of_dirty_data_makes_room_by_writeback() {
    for threaded in [false, true] {
        let pair = SimPair::new(MIB + 8 * SEG_64K, 64 * MIB, SEG_64K);
        let opts = OpenOptions {
            manual_flusher: !threaded,
            ..manual(2 * SEG_64K)
        };
        let e = Engine::open(pair.cache(), pair.backing(), opts).unwrap();
        let blocks = 4 * 8 * 16u64;
        for b in 0..blocks {
            e.write(b * 4096, &[b as u8; 4096], false).unwrap();
        }
        for b in 0..blocks {
            let mut buf = [0u8; 4096];
            e.read(b * 4096, &mut buf).unwrap();
            assert_eq!(buf, [b as u8; 4096], "block {b} (threaded: {threaded})");
        }
        let s = e.stats();
        assert!(s.counters.writeback_blocks > 0);
        assert!(s.counters.blocks_evicted > 0);
        e.close().unwrap();
    }
}

/// While the relocator is moving dirty blocks, read misses are not promoted: each promoted block
/// would cost a relocation and be dropped a ring pass later. The same load with no pause
/// promotes.
#[test]
fn read_misses_are_not_promoted_while_the_relocator_moves_dirty_blocks() {
    for pause in [Duration::ZERO, Duration::from_secs(3600)] {
        let pair = SimPair::new(MIB + 32 * SEG_64K, 64 * MIB, SEG_64K);
        let opts = OpenOptions {
            promote_pause_after_relocation: pause,
            ..manual(2 * SEG_64K)
        };
        let e = Engine::open(pair.cache(), pair.backing(), opts).unwrap();
        // The relocator moves dirty blocks only in sorted writeback order (in flush-epoch order
        // writeback frees the head instead).
        e.set_tunable("writeback_order", "sorted").unwrap();
        // Cold dirty blocks written once, then a small hot set rewritten over and over: the
        // ring wraps onto the cold blocks, which the relocator moves.
        let (cold, hot) = (160u64, 16u64);
        for b in 0..cold {
            e.write(b * 4096, &[b as u8; 4096], false).unwrap();
        }
        for round in 0..64u64 {
            for b in cold..cold + hot {
                e.write(b * 4096, &[round as u8; 4096], false).unwrap();
            }
        }
        let before = e.stats().counters;
        assert!(before.blocks_relocated > 0, "{before:?}");
        let mut buf = [0u8; 4096];
        e.read(32 * MIB, &mut buf).unwrap();
        assert_eq!(buf, [0u8; 4096]);
        let after = e.stats().counters;
        let tried = (after.promotions + after.promotions_raced)
            - (before.promotions + before.promotions_raced);
        let skipped = after.promotions_congested_skipped - before.promotions_congested_skipped;
        if pause.is_zero() {
            assert_eq!((tried, skipped), (1, 0), "{after:?}");
        } else {
            assert_eq!((tried, skipped), (0, 1), "{after:?}");
        }
        e.close().unwrap();
    }
}

/// When writeback cannot make room (the backing device fails writes), a manual-mode writer
/// gets the backing device's error instead of hanging, and what it wrote stays readable.
#[test]
fn a_full_log_with_a_failing_backing_device_is_an_error() {
    let pair = SimPair::new(MIB + 8 * SEG_64K, 64 * MIB, SEG_64K);
    let backing = Arc::new(FaultDevice::new(pair.backing()));
    backing.fail_next(OpKind::Write, u64::MAX, FaultKind::Io);
    let e = Engine::open(pair.cache(), backing.clone(), manual(2 * SEG_64K)).unwrap();
    let mut written = 0u64;
    let err = loop {
        match e.write(written * 4096, &[written as u8; 4096], false) {
            Ok(()) => written += 1,
            Err(err) => break err,
        }
        assert!(written < 1000, "more blocks than the cache holds");
    };
    assert!(matches!(err, Error::Io { .. }), "{err}");
    assert!(written >= 8 * 10, "only {written} blocks fit");
    for b in 0..written {
        let mut buf = [0u8; 4096];
        e.read(b * 4096, &mut buf).unwrap();
        assert_eq!(buf, [b as u8; 4096], "block {b}");
    }
    // Once the backing device works again, writeback drains everything.
    backing.heal();
    e.drain(|_| {}).unwrap();
    assert_eq!(e.stats().dirty_blocks, 0);
    e.close().unwrap();
}

/// Transient backing write errors during background writeback (several writes in flight):
/// counted (`io_errors`), retried by the writeback thread while a drain waits, and nothing is
/// lost: the backing device holds every block. A backing device that keeps failing makes the
/// drain fail, saying why, after a few seconds of retries.
#[test]
fn transient_backing_errors_during_writeback_are_retried_and_lose_nothing() {
    let pair = SimPair::new(MIB + 16 * SEG_64K, 16 * MIB, SEG_64K);
    let backing = Arc::new(FaultDevice::new(pair.backing()));
    let opts = OpenOptions {
        ram_buffer_bytes: 2 * SEG_64K,
        ..OpenOptions::default()
    };
    let e = Engine::open(pair.cache(), backing.clone(), opts).unwrap();
    e.set_tunable("writeback_io_depth", "4").unwrap();
    for b in 0..200u64 {
        e.write(b * 4096, &[b as u8 ^ 0x5a; 4096], false).unwrap();
    }
    e.flush().unwrap();
    backing.fail_next(OpKind::Write, 3, FaultKind::Io);
    e.drain(|_| {}).unwrap();
    assert_eq!(backing.injected(OpKind::Write), 3);
    let stats = e.stats();
    assert_eq!(stats.dirty_blocks, 0);
    assert!(stats.counters.io_errors >= 1, "the errors are counted");
    for b in 0..200u64 {
        let mut buf = [0u8; 4096];
        pair.backing().read_at(&mut buf, b * 4096).unwrap();
        assert_eq!(
            buf,
            [b as u8 ^ 0x5a; 4096],
            "block {b} on the backing device"
        );
    }
    e.write(0, &[1; 4096], false).unwrap();
    e.flush().unwrap();
    backing.fail_next(OpKind::Write, u64::MAX, FaultKind::Io);
    let err = e.drain(|_| {}).unwrap_err();
    assert!(err.to_string().contains("writeback failed"), "{err}");
    backing.heal();
    e.drain(|_| {}).unwrap();
    e.close().unwrap();
}

/// Drain writes everything back, reports progress, leaves the backing device holding the
/// image, and its position is persisted: after a crash nothing comes back dirty.
#[test]
fn drain_empties_the_cache_and_survives_a_crash() {
    let pair = SimPair::new(MIB + 80 * SEG_64K, 64 * MIB, SEG_64K);
    let opts = OpenOptions {
        manual_flusher: false,
        ..manual(4 * SEG_64K)
    };
    let e = Engine::open(pair.cache(), pair.backing(), opts.clone()).unwrap();
    // No background writeback: the drain does it all.
    e.set_tunable("writeback_threshold_percent", "100").unwrap();
    e.set_tunable("writeback_idle_ms", "0").unwrap();
    let mut rng = Rng::new(7);
    let mut image = vec![0u8; 2 * MIB as usize];
    rng.fill(&mut image);
    e.write(0, &image, false).unwrap();
    // A partial block: only its dirty sectors may reach the backing device.
    e.write(3 * MIB, &[0xEE; 1024], false).unwrap();
    let mut reports = Vec::new();
    e.drain(|p| reports.push(p)).unwrap();
    let last = reports.last().copied().unwrap();
    assert_eq!(last.dirty_blocks, 0);
    assert!(last.written_back_blocks >= 513, "{last:?}");
    assert!(reports[0].dirty_blocks_at_start >= 513);
    let mut raw = vec![0u8; 2 * MIB as usize];
    pair.backing.read_at(&mut raw, 0).unwrap();
    assert!(raw == image, "backing image after drain");
    let mut part = vec![0u8; 4096];
    pair.backing.read_at(&mut part, 3 * MIB).unwrap();
    assert!(part[..1024].iter().all(|&b| b == 0xEE));
    assert!(
        part[1024..].iter().all(|&b| b == 0),
        "clean sectors were written back"
    );
    e.crash();
    pair.cache.crash_lose_all();
    pair.backing.crash_lose_all();
    let e = Engine::open(pair.cache(), pair.backing(), opts).unwrap();
    assert_eq!(e.stats().dirty_blocks, 0, "a drained cache came back dirty");
    let mut back = vec![0u8; 2 * MIB as usize];
    e.read(0, &mut back).unwrap();
    assert!(back == image);
    e.close().unwrap();
}

/// Tunables change online, are checked, and persist across a restart.
#[test]
fn tunables_are_checked_and_persisted() {
    let pair = SimPair::new(MIB + 16 * SEG_64K, 64 * MIB, SEG_64K);
    let e = Engine::open(pair.cache(), pair.backing(), manual(2 * SEG_64K)).unwrap();
    e.set_tunable("writeback_threshold_percent", "25").unwrap();
    e.set_tunable("writeback_rate_max_mib", "7").unwrap();
    for (k, v) in [
        ("writeback_threshold_percent", "101"),
        ("writeback_batch_blocks", "1"),
        ("seal_interval_ms", "soon"),
        ("no_such_tunable", "1"),
    ] {
        let err = e.set_tunable(k, v).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{k}={v}: {err}");
    }
    e.close().unwrap();
    let e = Engine::open(pair.cache(), pair.backing(), manual(2 * SEG_64K)).unwrap();
    let get = |name: &str| {
        e.tunables()
            .into_iter()
            .find(|t| t.spec.name == name)
            .unwrap()
            .value
    };
    assert_eq!(get("writeback_threshold_percent"), "25");
    assert_eq!(get("writeback_rate_max_mib"), "7");
    assert_eq!(get("writeback_batch_blocks"), "4096");
    e.close().unwrap();
}

/// A failed write or sync on the cache device stops the engine; what was flushed before
/// survives a reopen once the device works again.
#[test]
fn a_cache_device_error_stops_the_engine_and_loses_nothing_flushed() {
    let mem = Arc::new(MemDevice::new(MIB + 16 * SEG_64K));
    let fault = Arc::new(FaultDevice::new(mem.clone()));
    let backing: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(16 * MIB));
    let fopts = FormatOptions {
        segment_size_bytes: SEG_64K,
        ..FormatOptions::default()
    };
    format_cache(&*fault, &*backing, &fopts).unwrap();
    let e = Engine::open(fault.clone(), backing.clone(), manual(4 * SEG_64K)).unwrap();
    e.write(0, &[1; 8192], false).unwrap();
    e.flush().unwrap();
    fault.fail_next(OpKind::Write, 1, FaultKind::Io);
    e.write(8192, &[2; 4096], false).unwrap(); // acknowledged from RAM
    let err = e.flush().unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err}");
    assert!(matches!(
        e.write(0, &[3; 512], false),
        Err(Error::Failed(_))
    ));
    assert!(matches!(e.flush(), Err(Error::Failed(_))));
    assert!(e.stats().failed.is_some());
    e.crash();
    let e = Engine::open(fault.clone(), backing, manual(4 * SEG_64K)).unwrap();
    let mut b = vec![0u8; 8192];
    e.read(0, &mut b).unwrap();
    assert_eq!(b, vec![1u8; 8192]);
    // A transient read error is reported for that read only.
    e.close().unwrap();
}

/// The same failure with threads (serve), issue 25: the engine goes on from the backing device
/// alone. Writes acknowledged and never flushed whose only copy was on the cache device (their
/// RAM buffers reused) are lost: the flush covering them fails, and keeps failing until they
/// are written again; reads of them fail, never older data; the flushed-then-lost blocks read
/// as EIO too but do not fail flushes; a write still in RAM is written to the backing device;
/// everything written back reads exactly; new writes work.
#[test]
fn a_cache_device_error_with_dirty_data_serves_the_rest_from_the_backing_device() {
    // The writeback thread persists its position at most once a second, on its own clock: on
    // a slow run that superblock write meets the failing syncs below and gives the cache up
    // early, in the filler loop (about 1 run in 40 on a loaded machine).
    // `early_failure_is_consistent` checks what that leaves, and the case runs again on fresh
    // devices until the cache fails where this test means it to.
    for attempt in 1..=8 {
        if cache_error_with_dirty_data_case() {
            return;
        }
        eprintln!("attempt {attempt}: the cache failed early, in the filler loop");
    }
    panic!("in 8 attempts the cache always failed early, in the filler loop");
}

/// One run of the case above: false if the cache failed early (what it left is checked).
fn cache_error_with_dirty_data_case() -> bool {
    let backing: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(16 * MIB));
    let (fault, opts) = failing_cache_for(&backing);
    let opts = OpenOptions {
        ram_buffer_bytes: 2 * SEG_64K,
        ..opts
    };
    let e = Engine::open(fault.clone(), backing.clone(), opts).unwrap();
    // Writeback waits until asked: an idle-time batch's superblock sync would meet the failing
    // flushes below and give the cache up while the filler writes are still in RAM (then
    // written to the backing device, nothing lost: seen 2 in 65 runs beside the other tests).
    e.set_tunable("writeback_idle_ms", "0").unwrap();
    e.set_tunable("writeback_threshold_percent", "100").unwrap();
    e.write(0, &[1; 8192], false).unwrap();
    e.drain(|_| {}).unwrap();
    e.write(8192, &[2; 8192], false).unwrap();
    e.flush().unwrap(); // durable in the cache only
                        // Later writes push those blocks out of RAM; the cache device takes them but never syncs
                        // (written, never durable, their RAM buffers reused): lost and never flushed.
    fault.fail_next(OpKind::Flush, u64::MAX, FaultKind::Io);
    const FILLER_LBA: u64 = 64;
    for b in 0..48u64 {
        e.write((FILLER_LBA + b) * 4096, &[9; 4096], false).unwrap();
    }
    if e.stats().serving_alone {
        early_failure_is_consistent(&e, FILLER_LBA);
        return false;
    }
    fault.fail_next(OpKind::Write, u64::MAX, FaultKind::Io);
    e.write(16384, &[3; 4096], false).unwrap(); // acknowledged from RAM
    let err = e.flush().expect_err("a write the flush covers is lost");
    assert!(
        err.to_string().contains("lost before it was ever durable"),
        "{err}"
    );
    let s = e.stats();
    assert!(s.serving_alone && s.failed.is_none(), "{s:?}");
    let lost = e.lost_runs();
    assert_eq!(
        lost[0],
        (16, 16),
        "the flushed blocks on the cache device: {lost:?}"
    );
    let filler_lost: Vec<(u64, u64)> = lost[1..].to_vec();
    assert!(
        !filler_lost.is_empty() && filler_lost.iter().all(|&(f, _)| f >= FILLER_LBA * 8),
        "{lost:?}"
    );
    assert_eq!(
        s.lost_at_failure_bytes,
        lost.iter().map(|r| r.1 * 512).sum::<u64>(),
        "{s:?}"
    );
    let mut b = vec![0u8; 8192];
    e.read(0, &mut b).unwrap();
    assert_eq!(b, vec![1u8; 8192]);
    for lost in [8192u64, 12288] {
        let err = e.read(lost, &mut b[..4096]).expect_err("lost");
        assert_eq!(err.errno(), libc::EIO, "{err}");
    }
    // Still in RAM at the failure: written to the backing device, not lost.
    e.read(16384, &mut b[..4096]).unwrap();
    assert_eq!(&b[..4096], &[3u8; 4096][..]);
    // Half of an unflushed lost block written again: still lost, flushes still fail.
    let at = filler_lost[0].0 * 512;
    e.write(at, &[4; 2048], false).unwrap();
    assert!(e.read(at, &mut b[..4096]).is_err());
    e.read(at, &mut b[..2048]).unwrap();
    assert_eq!(&b[..2048], &[4u8; 2048][..]);
    assert!(e.flush().is_err());
    e.write(at + 2048, &[4; 2048], false).unwrap();
    for &(first, count) in &filler_lost {
        let data = vec![4u8; count as usize * 512];
        e.write(first * 512, &data, false).unwrap();
    }
    e.flush().unwrap();
    e.read(at, &mut b[..4096]).unwrap();
    assert_eq!(&b[..4096], &[4u8; 4096][..]);
    assert_eq!(e.stats().lost_bytes, 2 * 4096);
    assert!(
        e.drain(|_| {}).is_err(),
        "the backing device does not hold the disk"
    );
    e.close().unwrap();
    let counted = format!("{} bytes", s.lost_at_failure_bytes);
    assert_old_cache_refused(&fault, backing, &counted);
    true
}

/// The cache failed early, in the filler loop: each block reads its newest data, or EIO if
/// it is counted lost (the blocks drained first never are); a flush fails exactly when a lost
/// block was never flushed.
fn early_failure_is_consistent(e: &Engine, filler_lba: u64) {
    let s = e.stats();
    assert!(s.failed.is_none() && s.serving_alone, "{s:?}");
    let lost = e.lost_runs();
    assert_eq!(
        s.lost_bytes,
        lost.iter().map(|r| r.1 * 512).sum::<u64>(),
        "{s:?}"
    );
    let is_lost = |lba: u64| {
        lost.iter()
            .any(|&(f, c)| lba * 8 < f + c && f < lba * 8 + 8)
    };
    let unflushed_lost = lost.iter().any(|&(f, _)| f >= filler_lba * 8);
    assert_eq!(e.flush().is_err(), unflushed_lost, "{lost:?}");
    let mut b = vec![0u8; 4096];
    for (lba, byte) in [(0, 1u8), (1, 1), (2, 2), (3, 2)]
        .into_iter()
        .chain((filler_lba..filler_lba + 48).map(|l| (l, 9)))
    {
        match e.read(lba * 4096, &mut b) {
            Ok(()) => assert!(b.iter().all(|&x| x == byte), "block {lba}: old data"),
            Err(err) => {
                assert!(lba >= 2 && is_lost(lba), "block {lba}: {err} ({lost:?})");
                assert_eq!(err.errno(), libc::EIO, "{err}");
            }
        }
    }
}

/// Issue 25: dirty data only in RAM when the cache device fails (flushed blocks whose segment
/// buffer is still held, a shadow of an older flush epoch, the open chunk with a partial
/// overwrite) is written to the backing device at the switch, in flush-epoch order: every
/// block reads its newest data, nothing reads EIO, nothing is counted lost, flushes work, and
/// the old cache is refused saying nothing was lost.
#[test]
fn dirty_data_still_in_ram_when_the_cache_device_fails_is_written_to_the_backing_device() {
    let backing: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(16 * MIB));
    let (fault, opts) = failing_cache_for(&backing);
    let e = Engine::open(fault.clone(), backing.clone(), opts).unwrap();
    e.set_tunable("writeback_threshold_percent", "100").unwrap();
    // Epoch 1, flushed: durable on the cache device and still in its segment's RAM buffer.
    e.write(0, &[1; 8192], false).unwrap();
    e.write(8192, &[2; 4096], false).unwrap();
    e.flush().unwrap();
    // Epoch 2: block 1 again (block 1's epoch-1 copy stays as a shadow), a partial block.
    e.write(4096, &[3; 4096], false).unwrap();
    e.write(12288 + 512, &[4; 1024], false).unwrap();
    e.flush().unwrap();
    // Epoch 3, in the open chunk: a partial overwrite of block 0 (its epoch-1 copy a shadow too).
    e.write(0, &[5; 512], false).unwrap();
    assert_eq!(e.stats().counters.shadows_kept, 2);
    fault.fail_next(OpKind::Write, u64::MAX, FaultKind::Io);
    fault.fail_next(OpKind::Flush, u64::MAX, FaultKind::Io);
    e.write(20480, &[6; 4096], false).unwrap();
    e.flush().expect("nothing the flush covers was lost");
    let s = e.stats();
    assert!(
        s.serving_alone && s.failed.is_none() && s.cache_failed.is_some(),
        "{s:?}"
    );
    assert_eq!((s.lost_bytes, s.lost_at_failure_bytes), (0, 0), "{s:?}");
    assert_eq!(e.lost_runs(), vec![]);
    let mut want = vec![0u8; 24576];
    want[..8192].fill(1);
    want[..512].fill(5);
    want[4096..8192].fill(3);
    want[8192..12288].fill(2);
    want[12288 + 512..12288 + 1536].fill(4);
    want[20480..].fill(6);
    let mut got = vec![0u8; 24576];
    e.read(0, &mut got).unwrap();
    assert!(
        got == want,
        "served alone, the blocks read their newest data"
    );
    let mut on_backing = vec![0u8; 24576];
    backing.read_at(&mut on_backing, 0).unwrap();
    assert!(
        on_backing == want,
        "the backing device holds the newest data"
    );
    e.write(24576, &[7; 4096], true).unwrap();
    e.flush().unwrap();
    e.drain(|_| {})
        .expect("nothing lost: the backing device holds the disk");
    e.close().unwrap();
    assert_old_cache_refused(&fault, backing, "no data was lost");
}

/// Issue 25: a write-zeroes whose zeros reached the backing device but whose superblock write
/// (recording them applied) fails is a failure of the cache device, given up like any other:
/// the engine goes on from the backing device alone and the write-zeroes succeeds there (it
/// did not fail the engine saying the zeros "could not be applied to the backing device").
#[test]
fn a_failed_superblock_write_after_a_write_zeroes_gives_the_cache_up() {
    let backing: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(16 * MIB));
    let (fault, opts) = failing_cache_for(&backing);
    let e = Engine::open(fault.clone(), backing.clone(), opts).unwrap();
    e.write(0, &[1; 16384], false).unwrap();
    e.drain(|_| {}).unwrap();
    // Both superblock copies (offsets 0 and 4096) fail from now on.
    fault.fail_range(OpKind::Write, 0, 8192, FaultKind::Io);
    e.write_zeroes(4096, 8192, false)
        .expect("tried again from the backing device alone");
    assert!(
        fault.injected(OpKind::Write) > 0,
        "the superblock write failed"
    );
    let s = e.stats();
    assert!(s.serving_alone && s.failed.is_none(), "{s:?}");
    let why = s.cache_failed.clone().unwrap_or_default();
    assert!(
        why.contains("superblock") && !why.contains("could not be applied"),
        "{why}"
    );
    assert_eq!(s.lost_bytes, 0, "{s:?}");
    let mut want = vec![1u8; 16384];
    want[4096..12288].fill(0);
    let mut got = vec![0u8; 16384];
    e.read(0, &mut got).unwrap();
    assert!(got == want);
    backing.read_at(&mut got, 0).unwrap();
    assert!(got == want, "the backing device holds the zeros");
    e.flush().unwrap();
    e.close().unwrap();
}

/// Issue 25: marking the backing device detached when the cache device fails is retried (a
/// backing write failing once does not cost the cache: serve goes on alone); if the label
/// write keeps failing, the engine stays failed with a status line naming `detach --force`,
/// and at restart the old cache is refused with one line saying the mark did not finish and
/// naming `detach --force` (the record, written first, says it was begun).
#[test]
fn marking_the_backing_device_detached_is_retried_and_an_unfinished_mark_names_detach_force() {
    for persistent in [false, true] {
        let backing_mem: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(16 * MIB));
        let backing = Arc::new(FaultDevice::new(backing_mem));
        let (fault, opts) = failing_cache_for(&(backing.clone() as Arc<dyn BlockDevice>));
        let e = Engine::open(fault.clone(), backing.clone(), opts.clone()).unwrap();
        e.set_tunable("writeback_threshold_percent", "100").unwrap();
        e.write(0, &[1; 4096], false).unwrap();
        e.flush().unwrap();
        if persistent {
            // The label's own sector (the record, 1 KiB into the label block, is written).
            let label_at = 16 * MIB - 4096;
            backing.fail_range(OpKind::Write, label_at, 512, FaultKind::Io);
        } else {
            backing.fail_next(OpKind::Write, 1, FaultKind::Io);
        }
        fault.fail_next(OpKind::Write, u64::MAX, FaultKind::Io);
        fault.fail_next(OpKind::Flush, u64::MAX, FaultKind::Io);
        e.write(4096, &[2; 4096], false).unwrap();
        let flushed = e.flush();
        let s = e.stats();
        assert!(backing.injected(OpKind::Write) > 0, "{s:?}");
        if !persistent {
            flushed.expect("the mark was tried again: serving alone, nothing lost");
            assert!(s.serving_alone && s.lost_bytes == 0, "{s:?}");
            let mut b = vec![0u8; 8192];
            e.read(0, &mut b).unwrap();
            assert!(b[..4096] == [1; 4096] && b[4096..] == [2; 4096]);
            e.close().unwrap();
            continue;
        }
        assert!(flushed.is_err() && !s.serving_alone, "{s:?}");
        let why = s.failed.clone().unwrap_or_default();
        assert!(
            why.contains("marking the backing device detached failed")
                && why.contains("3 tries")
                && why.contains("logcache detach --force --backing"),
            "{why}"
        );
        let _ = e.close();
        fault.heal();
        backing.heal();
        let refused = Engine::open(fault.clone(), backing.clone(), opts)
            .err()
            .map(|e| e.to_string());
        assert!(
            refused
                .as_deref()
                .is_some_and(|m| m.contains("only in part")
                    && m.contains("logcache detach --force --backing")),
            "{refused:?}"
        );
    }
}

/// A cache device (64 KiB segments, in memory) whose faults a test injects, formatted for
/// `backing`, and options for opening it with threads and no periodic seal.
/// The cache device healed, the old cache is refused (the backing device was detached), the
/// message saying `says`.
fn assert_old_cache_refused(fault: &Arc<FaultDevice>, backing: Arc<dyn BlockDevice>, says: &str) {
    fault.heal();
    let refused = Engine::open(fault.clone(), backing, OpenOptions::default())
        .err()
        .map(|e| e.to_string());
    assert!(
        refused
            .as_deref()
            .is_some_and(|m| m.contains("detached") && m.contains(says)),
        "{refused:?}"
    );
}

fn failing_cache_for(backing: &Arc<dyn BlockDevice>) -> (Arc<FaultDevice>, OpenOptions) {
    let fault = Arc::new(FaultDevice::new(Arc::new(MemDevice::new(
        MIB + 16 * SEG_64K,
    ))));
    let fopts = FormatOptions {
        segment_size_bytes: SEG_64K,
        ..FormatOptions::default()
    };
    format_cache(&*fault, &**backing, &fopts).unwrap();
    let opts = OpenOptions {
        seal_interval_ms: Some(0),
        ..OpenOptions::default()
    };
    (fault, opts)
}

/// A block whose bytes on the cache device changed is reported as an error, never returned.
#[test]
fn a_corrupted_cache_block_is_an_error_not_wrong_data() {
    let pair = SimPair::new(MIB + 16 * SEG_64K, 16 * MIB, SEG_64K);
    let e = Engine::open(pair.cache(), pair.backing(), manual(2 * SEG_64K)).unwrap();
    // Fill more than the RAM buffers so block 5 is read from the cache device.
    for b in 0..60u64 {
        e.write(b * 4096, &[b as u8; 4096], false).unwrap();
    }
    e.flush().unwrap();
    assert_eq!(
        e.stats().counters.blocks_relocated,
        0,
        "nothing needed relocating"
    );
    e.close().unwrap();
    // Find block 5's copy on the cache device and flip a bit in it.
    let image = pair.cache.read_volatile(0, MIB + 16 * SEG_64K);
    let pos = image
        .chunks(4096)
        .position(|c| c == [5u8; 4096])
        .expect("block 5 is on the cache device");
    pair.cache.corrupt(pos as u64 * 4096 + 100, 0x01);
    let e = Engine::open(pair.cache(), pair.backing(), manual(2 * SEG_64K)).unwrap();
    let mut b = [0u8; 4096];
    let err = e.read(5 * 4096, &mut b).unwrap_err();
    assert!(matches!(err, Error::Corruption(_)), "{err}");
    assert_eq!(e.stats().counters.checksum_errors, 1);
    e.read(6 * 4096, &mut b).unwrap();
    assert_eq!(b, [6u8; 4096]);
    // A read error from the device is reported for that read, and the next one works.
    let fault = Arc::new(FaultDevice::new(pair.cache()));
    e.close().unwrap();
    let e = Engine::open(fault.clone(), pair.backing(), manual(2 * SEG_64K)).unwrap();
    fault.fail_next(OpKind::Read, 1, FaultKind::Io);
    assert!(matches!(e.read(6 * 4096, &mut b), Err(Error::Io { .. })));
    e.read(6 * 4096, &mut b).unwrap();
    assert_eq!(b, [6u8; 4096]);
}

/// A dirty block whose copy fails its checksum in `writeback_order = consistent`: its epoch can
/// never be written back whole, and nothing newer may pass it. It is a cache-device failure,
/// rather than a log filling while writers wait forever (the hang this replaces): with threads
/// (serve) the engine goes on from the backing device alone, every dirty block lost (EIO until
/// written again) and the old cache refused; in manual mode it fails, saying so, and in
/// `sorted` order everything else is written back.
#[test]
fn a_dirty_block_failing_its_checksum_fails_the_engine_in_epoch_order_not_a_hang() {
    for threaded in [false, true] {
        let pair = SimPair::new(MIB + 8 * SEG_64K, 64 * MIB, SEG_64K);
        let e = Engine::open(pair.cache(), pair.backing(), manual(2 * SEG_64K)).unwrap();
        for b in 0..20u64 {
            e.write(b * 4096, &[b as u8 + 1; 4096], false).unwrap();
        }
        e.flush().unwrap();
        e.close().unwrap();
        let image = pair.cache.read_volatile(0, MIB + 8 * SEG_64K);
        let pos = image
            .chunks(4096)
            .position(|c| c == [6u8; 4096])
            .expect("block 5 is on the cache device");
        pair.cache.corrupt(pos as u64 * 4096 + 9, 0x04);
        let opts = OpenOptions {
            manual_flusher: !threaded,
            ..manual(2 * SEG_64K)
        };
        let e = Arc::new(Engine::open(pair.cache(), pair.backing(), opts).unwrap());
        // Write until the log needs writeback to make room; a hang fails the test.
        let (done_tx, done) = std::sync::mpsc::channel();
        let writer = e.clone();
        std::thread::spawn(move || {
            let mut b = 100u64;
            let res = loop {
                if let Err(err) = writer.write(b * 4096, &[7; 4096], false) {
                    break Err(err);
                }
                b += 1;
                if b > 100 + 2000 {
                    break Ok(b);
                }
            };
            let _ = done_tx.send(res);
        });
        let res = done
            .recv_timeout(Duration::from_secs(120))
            .unwrap_or_else(|_| {
                panic!("writers hang behind the corrupt block (threaded: {threaded})")
            });
        if threaded {
            // A cache-device failure (issue 25): serve goes on from the backing device alone;
            // every block dirty then is lost (reads fail, never older data) until written.
            res.expect("writes go on from the backing device alone");
            let s = e.stats();
            assert!(s.serving_alone && s.failed.is_none(), "{s:?}");
            let why = s
                .cache_failed
                .clone()
                .expect("status says the cache failed");
            assert!(
                why.starts_with("cache failed: ") && why.contains("could not be read back"),
                "{why}"
            );
            // Block 5 is lost. Its epoch's good blocks are lost too if they were still dirty
            // at the failure, or not if a writeback batch wrote them back first: which, is
            // timing (with writeback's thread no longer zeroing a 32 MiB buffer at its start,
            // it usually reaches the epoch before the writer fills the ring).
            assert!(s.lost_bytes >= 4096, "{s:?}");
            assert!(
                e.lost_runs().iter().any(|&(f, n)| f <= 40 && 48 <= f + n),
                "block 5 (sectors 40..48) is lost: {:?}",
                e.lost_runs()
            );
            let mut buf = [0u8; 4096];
            let lost = e
                .read(5 * 4096, &mut buf)
                .expect_err("a lost block reads as EIO");
            assert_eq!(lost.errno(), libc::EIO, "{lost}");
            e.write(5 * 4096, &[9; 4096], false).unwrap();
            e.read(5 * 4096, &mut buf).unwrap();
            assert_eq!(buf, [9u8; 4096]);
            e.close().unwrap();
            let refused = Engine::open(pair.cache(), pair.backing(), manual(2 * SEG_64K))
                .err()
                .map(|e| e.to_string());
            assert!(
                refused
                    .as_deref()
                    .is_some_and(|m| m.contains("detached") && m.contains("lost")),
                "{refused:?}"
            );
            continue;
        }
        let err = res.expect_err("more blocks than the cache holds were written");
        let failed = e.stats().failed.expect("the engine failed");
        assert!(
            failed.starts_with("cache failed: ") && failed.contains("could not be read back"),
            "{failed}"
        );
        assert!(err.to_string().contains("could not be read back"), "{err}");
        assert!(e.close().is_err(), "a failed engine does not close cleanly");
        // In sorted order everything but the corrupt block is written back.
        let e = Engine::open(pair.cache(), pair.backing(), manual(2 * SEG_64K)).unwrap();
        e.set_tunable("writeback_order", "sorted").unwrap();
        while e.writeback_step(4096).unwrap() > 0 {}
        assert_eq!(e.stats().dirty_blocks, 1, "threaded: {threaded}");
        assert!(e.stats().writeback_error.is_some());
        let mut buf = [0u8; 4096];
        assert!(matches!(
            e.read(5 * 4096, &mut buf),
            Err(Error::Corruption(_))
        ));
        e.read(6 * 4096, &mut buf).unwrap();
        assert_eq!(buf, [7u8; 4096]);
        e.close().unwrap();
    }
}

/// A clean block is only a copy of the backing device's data: if its copy on the cache device
/// is corrupt or cannot be read, the read is served from the backing device and the bad copy
/// is dropped, rather than failing the read.
#[test]
fn a_corrupted_or_unreadable_clean_block_is_read_from_the_backing_device() {
    let pair = SimPair::new(MIB + 16 * SEG_64K, 16 * MIB, SEG_64K);
    let e = Engine::open(pair.cache(), pair.backing(), manual(2 * SEG_64K)).unwrap();
    for b in 0..60u64 {
        e.write(b * 4096, &[b as u8 + 1; 4096], false).unwrap();
    }
    e.flush().unwrap();
    e.drain(|_| {}).unwrap();
    assert_eq!(e.stats().dirty_blocks, 0);
    e.close().unwrap();
    let image = pair.cache.read_volatile(0, MIB + 16 * SEG_64K);
    let pos = image
        .chunks(4096)
        .position(|c| c == [6u8; 4096])
        .expect("block 5 is on the cache device");
    pair.cache.corrupt(pos as u64 * 4096 + 7, 0x80);
    let e = Engine::open(pair.cache(), pair.backing(), manual(2 * SEG_64K)).unwrap();
    let evicted_before = e.stats().counters.blocks_evicted;
    let mut b = [0u8; 4096];
    e.read(5 * 4096, &mut b).unwrap();
    assert_eq!(b, [6u8; 4096], "served from the backing device");
    let c = e.stats().counters;
    assert_eq!(c.checksum_errors, 1);
    assert_eq!(
        c.blocks_evicted,
        evicted_before + 1,
        "the bad copy is dropped"
    );
    e.read(5 * 4096, &mut b).unwrap();
    assert_eq!(b, [6u8; 4096]);
    assert_eq!(e.stats().counters.checksum_errors, 1, "not read again");
    e.close().unwrap();
    // A transient read error on the cache device: the same.
    let fault = Arc::new(FaultDevice::new(pair.cache()));
    let e = Engine::open(fault.clone(), pair.backing(), manual(2 * SEG_64K)).unwrap();
    fault.fail_next(OpKind::Read, 1, FaultKind::Io);
    e.read(7 * 4096, &mut b).unwrap();
    assert_eq!(b, [8u8; 4096]);
    assert_eq!(fault.injected(OpKind::Read), 1);
    assert_eq!(e.stats().counters.io_errors, 1);
    e.close().unwrap();
}

/// Many threads, each owning a region, write, read and flush at once with the real flusher
/// thread; every read matches the thread's model, and so does the image after a reopen.
#[test]
fn many_writer_threads() {
    let cache: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(MIB + 64 * SEG_64K));
    let backing: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(64 * MIB));
    let fopts = FormatOptions {
        segment_size_bytes: SEG_64K,
        ..FormatOptions::default()
    };
    format_cache(&*cache, &*backing, &fopts).unwrap();
    let opts = OpenOptions {
        ram_buffer_bytes: 4 * SEG_64K,
        ..OpenOptions::default()
    };
    let e = Engine::open(cache.clone(), backing.clone(), opts.clone()).unwrap();
    let region = 256 * KIB;
    let seed = logcache_testkit::rng::seed_from_env("LOGCACHE_SEED");
    let workers: Vec<_> = (0..4u64)
        .map(|t| {
            let e = e.clone();
            std::thread::spawn(move || {
                let mut rng = Rng::new(seed ^ t);
                let base = t * region;
                let mut model = vec![0u8; region as usize];
                for _ in 0..3000 {
                    let off = rng.below(region / 512) * 512;
                    let len = rng.range(1, ((region - off) / 512).min(24)) * 512;
                    let range = off as usize..(off + len) as usize;
                    match rng.below(10) {
                        0..=5 => {
                            let mut d = vec![0u8; len as usize];
                            rng.fill(&mut d);
                            e.write(base + off, &d, rng.chance(1, 50)).unwrap();
                            model[range].copy_from_slice(&d);
                        }
                        6..=8 => {
                            let mut d = vec![0u8; len as usize];
                            e.read(base + off, &mut d).unwrap();
                            assert!(
                                d[..] == model[range],
                                "thread {t} seed {seed}: read differs"
                            );
                        }
                        _ => e.flush().unwrap(),
                    }
                }
                model
            })
        })
        .collect();
    let models: Vec<Vec<u8>> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    e.close().unwrap();
    let e = Engine::open(cache, backing, opts).unwrap();
    for (t, m) in models.iter().enumerate() {
        let mut d = vec![0u8; region as usize];
        e.read(t as u64 * region, &mut d).unwrap();
        assert!(
            d == *m,
            "thread {t} seed {seed}: image after reopen differs"
        );
    }
}

/// A memory device that records what reaches it: discards, write-zeroes, written bytes and the
/// largest single write and read IOs.
#[derive(Default)]
struct Recorded {
    discards: Vec<(u64, u64)>,
    write_zeroes: Vec<(u64, u64)>,
    written_bytes: u64,
    largest_write_bytes: u64,
    largest_read_bytes: u64,
}

impl Recorded {
    fn wrote(&mut self, len_bytes: u64) {
        self.written_bytes += len_bytes;
        self.largest_write_bytes = self.largest_write_bytes.max(len_bytes);
    }
}

struct Recorder(MemDevice, std::sync::Mutex<Recorded>);

impl BlockDevice for Recorder {
    fn size_bytes(&self) -> u64 {
        self.0.size_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let mut r = self.1.lock().unwrap();
        r.largest_read_bytes = r.largest_read_bytes.max(buf.len() as u64);
        drop(r);
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.1.lock().unwrap().wrote(buf.len() as u64);
        self.0.write_at(buf, offset)
    }
    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> std::io::Result<()> {
        let len_bytes: usize = bufs.iter().map(|b| b.len()).sum();
        self.1.lock().unwrap().wrote(len_bytes as u64);
        self.0.write_vectored_at(bufs, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.0.flush()
    }
    fn discard(&self, offset: u64, len_bytes: u64) -> std::io::Result<()> {
        self.1.lock().unwrap().discards.push((offset, len_bytes));
        self.0.discard(offset, len_bytes)
    }
    fn write_zeroes(&self, offset: u64, len_bytes: u64) -> std::io::Result<()> {
        self.1
            .lock()
            .unwrap()
            .write_zeroes
            .push((offset, len_bytes));
        self.0.write_zeroes(offset, len_bytes)
    }
    fn describe(&self) -> String {
        "recording memory".into()
    }
}

/// Background IO is cut to let foreground reads through only while reads come in; a flush
/// done inline (manual mode) and a manual writeback step keep no history of reads, so they
/// write and read whole runs even after reads were served (they once cut every such IO for
/// good after the first read).
#[test]
fn an_inline_flush_after_a_read_writes_whole_runs() {
    let rec = Arc::new(Recorder(
        MemDevice::new(64 * MIB),
        std::sync::Mutex::new(Recorded::default()),
    ));
    let cache: Arc<dyn BlockDevice> = rec.clone();
    let backing: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(64 * MIB));
    format_cache(&*cache, &*backing, &FormatOptions::default()).unwrap();
    let opts = OpenOptions {
        manual_flusher: true,
        ..OpenOptions::default()
    };
    let e = Engine::open(cache, backing, opts).unwrap();
    let mut block = vec![0u8; 4096];
    for round in 0..3u64 {
        e.read(0, &mut block).unwrap();
        rec.1.lock().unwrap().largest_write_bytes = 0;
        for i in 0..32u64 {
            let at = (round * 32 + i) * 64 * KIB;
            e.write(at, &[round as u8 + 1; 64 * KIB as usize], false)
                .unwrap();
        }
        e.flush().unwrap();
        let largest = rec.1.lock().unwrap().largest_write_bytes;
        assert!(
            largest > 512 * KIB,
            "round {round}: the inline flush wrote at most {largest} bytes at once"
        );
    }
    for i in 0..96u64 {
        e.read(i * 64 * KIB, &mut block).unwrap();
        assert!(
            block.iter().all(|&b| b == (i / 32) as u8 + 1),
            "64 KiB piece {i}"
        );
    }
    // Writeback reads the dirty run off the cache device in spans over 128 KiB (the cut size).
    rec.1.lock().unwrap().largest_read_bytes = 0;
    assert!(e.writeback_step(usize::MAX).unwrap() > 0);
    let largest = rec.1.lock().unwrap().largest_read_bytes;
    assert!(
        largest > 128 * KIB,
        "the manual writeback step read at most {largest} bytes at once"
    );
    e.close().unwrap();
}

/// TRIM is a hint: it drops cached copies of its whole blocks (dirty ones too) and passes a
/// discard of them to the backing device, writing no zeros anywhere; partial blocks at its
/// ends keep their data. Write-zeroes still promises zeros, through the backing device's own
/// write-zeroes (no zero blocks written).
#[test]
fn trim_drops_cached_copies_and_passes_a_discard_on_and_write_zeroes_uses_the_device() {
    let cache: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(MIB + 32 * SEG_64K));
    let rec = Arc::new(Recorder(
        MemDevice::new(16 * MIB),
        std::sync::Mutex::new(Recorded::default()),
    ));
    rec.0.write_at(&[0x11; 4 * 4096], 10 * 4096).unwrap();
    let backing: Arc<dyn BlockDevice> = rec.clone();
    let fopts = FormatOptions {
        segment_size_bytes: SEG_64K,
        ..FormatOptions::default()
    };
    format_cache(&*cache, &*backing, &fopts).unwrap();
    let opts = OpenOptions {
        manual_flusher: true,
        seal_interval_ms: Some(0),
        ..OpenOptions::default()
    };
    let e = Engine::open(cache, backing, opts).unwrap();
    // Sorted writeback: a discard may reach the backing device while older data is dirty.
    e.set_tunable("writeback_order", "sorted").unwrap();
    e.write(10 * 4096, &[0x22; 4 * 4096], false).unwrap();
    e.flush().unwrap();
    assert_eq!(e.stats().dirty_blocks, 4);
    let written_before = rec.1.lock().unwrap().written_bytes;
    // Blocks 10 and 11 whole, 512 bytes of block 12: only 10 and 11 are trimmed.
    e.discard(10 * 4096, 2 * 4096 + 512, false).unwrap();
    {
        let r = rec.1.lock().unwrap();
        assert_eq!(r.discards, vec![(10 * 4096, 2 * 4096)]);
        assert!(
            r.write_zeroes.is_empty(),
            "a TRIM zeroed: {:?}",
            r.write_zeroes
        );
        assert_eq!(
            r.written_bytes, written_before,
            "a TRIM wrote to the backing device"
        );
    }
    let s = e.stats();
    assert_eq!(
        s.dirty_blocks, 2,
        "the trimmed dirty blocks are dropped, the others stay"
    );
    assert_eq!(s.counters.discards, 1);
    let mut buf = vec![0u8; 4 * 4096];
    e.read(10 * 4096, &mut buf).unwrap();
    // Trimmed sectors: data written there before, or zeros (the memory device's discard).
    for sector in buf[..2 * 4096].chunks(512) {
        let first = sector[0];
        assert!(
            [0, 0x11, 0x22].contains(&first) && sector.iter().all(|&b| b == first),
            "a trimmed sector holds data never written there: {first:#x}"
        );
    }
    assert!(
        buf[2 * 4096..].iter().all(|&b| b == 0x22),
        "the partial block changed"
    );

    e.write_zeroes(20 * 4096, 4 * 4096, true).unwrap();
    e.read(20 * 4096, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 0));
    {
        let r = rec.1.lock().unwrap();
        assert_eq!(r.write_zeroes, vec![(20 * 4096, 4 * 4096)]);
        assert_eq!(
            r.written_bytes, written_before,
            "zeros were written as blocks"
        );
    }

    // In flush-epoch order a discard must not overtake older dirty data on its way to the
    // backing device: while anything is dirty the hint is dropped; once nothing is, it passes.
    e.set_tunable("writeback_order", "consistent").unwrap();
    e.write(30 * 4096, &[0x33; 4096], true).unwrap();
    e.discard(31 * 4096, 4096, false).unwrap();
    assert_eq!(
        rec.1.lock().unwrap().discards.len(),
        1,
        "a discard overtook dirty data"
    );
    e.drain(|_| {}).unwrap();
    e.discard(31 * 4096, 4096, false).unwrap();
    assert_eq!(
        rec.1.lock().unwrap().discards.last(),
        Some(&(31 * 4096, 4096))
    );
    e.close().unwrap();
}
