//! The read path's runs: blocks adjacent on the cache device are read with one device IO, each
//! block's CRC still checked; the newest copy still wins (RAM, cache device, backing device),
//! sub-block valid masks still fetch the sectors the cache never held, and a device error in
//! the middle of a multi-run read fails only what it must.

mod common;

use std::sync::Arc;

use common::*;
use logcache_engine::io::BlockDevice;
use logcache_engine::{CachedRead, Engine, Error};
use logcache_testkit::fault::{FaultDevice, FaultKind, OpKind};

const MIB: u64 = 1 << 20;
const BLOCK: u64 = 4096;

fn block_of(b: u64) -> [u8; 4096] {
    [b as u8 + 1; 4096]
}

/// `manual` with the RAM cache off: every read of a cached block reads the cache device, for
/// tests of what a device failure does (with it on, a read repeated would be served from RAM:
/// a large read's blocks are stored on its second touch, `path::hot`).
fn device_reads(ram: u64) -> logcache_engine::OpenOptions {
    logcache_engine::OpenOptions {
        ram_cache_bytes: Some(0),
        ..manual(ram)
    }
}

/// The cache device offset of the one block holding `pattern`.
fn cache_offset_of(pair: &SimPair, cache_bytes: u64, pattern: &[u8; 4096]) -> u64 {
    let image = pair.cache.read_volatile(0, cache_bytes);
    let pos = image
        .chunks(4096)
        .position(|c| c == pattern)
        .expect("the block is on the cache device");
    pos as u64 * BLOCK
}

/// A sequential read of data written sequentially and on the cache device takes a few device
/// reads, not one per block, and returns exactly what was written.
#[test]
fn a_sequential_read_of_cached_data_is_a_few_large_device_reads() {
    let cache_bytes = MIB + 16 * MIB;
    let pair = SimPair::new(cache_bytes, 64 * MIB, MIB);
    let e = Engine::open(pair.cache(), pair.backing(), manual(4 * MIB)).unwrap();
    let blocks = 128u64;
    for b in 0..blocks {
        e.write(b * BLOCK, &block_of(b), false).unwrap();
    }
    e.flush().unwrap();
    e.close().unwrap();
    // Reopened, every block's copy is on the cache device only.
    let e = Engine::open(pair.cache(), pair.backing(), manual(4 * MIB)).unwrap();
    let reads_before = pair.cache.read_count();
    let mut out = vec![0u8; (blocks * BLOCK) as usize];
    e.read(0, &mut out).unwrap();
    let reads = pair.cache.read_count() - reads_before;
    for b in 0..blocks {
        let at = (b * BLOCK) as usize;
        assert_eq!(out[at..at + 4096], block_of(b), "block {b}");
    }
    assert!(
        reads <= 4,
        "{reads} cache device reads for {blocks} adjacent blocks"
    );
    assert_eq!(e.stats().counters.read_hits, blocks);
    // An unaligned read inside the run goes through the same runs.
    let mut part = vec![0u8; 3 * 4096 + 512];
    e.read(5 * BLOCK + 1024, &mut part).unwrap();
    let mut model = Vec::new();
    for b in 5..10 {
        model.extend_from_slice(&block_of(b));
    }
    assert_eq!(part, model[1024..1024 + part.len()]);
}

/// Blocks 0..64 on the cache device (written, flushed, reopened), then RAM copies in the
/// middle of the runs, a sub-block write past them (and, with `sub_block_in_run`, one inside
/// them), a hole of misses: the engine and the 96 blocks' model (the backing device's own data,
/// 0xEE, where the cache holds nothing).
fn every_kind_of_copy(pair: &SimPair, sub_block_in_run: bool) -> (Engine, Vec<u8>) {
    pair.backing
        .write_raw(0, &vec![0xEE; (96 * BLOCK) as usize]);
    let e = Engine::open(pair.cache(), pair.backing(), manual(4 * MIB)).unwrap();
    for b in 0..64 {
        e.write(b * BLOCK, &block_of(b), false).unwrap();
    }
    e.flush().unwrap();
    e.close().unwrap();
    let e = Engine::open(pair.cache(), pair.backing(), manual(4 * MIB)).unwrap();
    let mut model = vec![0xEE; (96 * BLOCK) as usize];
    for b in 0..64u64 {
        model[(b * BLOCK) as usize..((b + 1) * BLOCK) as usize].copy_from_slice(&block_of(b));
    }
    e.write(20 * BLOCK, &[0xA0; 4096], false).unwrap();
    model[(20 * BLOCK) as usize..(21 * BLOCK) as usize].fill(0xA0);
    if sub_block_in_run {
        e.write(40 * BLOCK + 512, &[0xA1; 1024], false).unwrap();
        model[(40 * BLOCK + 512) as usize..(40 * BLOCK + 1536) as usize].fill(0xA1);
    }
    e.write(70 * BLOCK + 3 * 512, &[0xA2; 512], false).unwrap();
    model[(70 * BLOCK + 1536) as usize..(70 * BLOCK + 2048) as usize].fill(0xA2);
    (e, model)
}

/// One request over RAM copies, cache-device runs, sub-block copies and misses: each sector
/// comes from where its newest copy is.
#[test]
fn a_read_over_every_kind_of_copy_returns_the_newest() {
    let cache_bytes = MIB + 16 * MIB;
    let pair = SimPair::new(cache_bytes, 64 * MIB, MIB);
    let (e, model) = every_kind_of_copy(&pair, true);
    let mut out = vec![0u8; (96 * BLOCK) as usize];
    e.read(0, &mut out).unwrap();
    assert!(out == model, "the read differs from the model");
    // The same with the block that RAM held now on the cache device too.
    e.flush().unwrap();
    e.close().unwrap();
    let e = Engine::open(pair.cache(), pair.backing(), manual(4 * MIB)).unwrap();
    out.fill(0);
    e.read(0, &mut out).unwrap();
    assert!(
        out == model,
        "the read after reopening differs from the model"
    );
}

/// The cached-only read (what a connection's reader serves itself): it serves a range every
/// sector of which the cache holds, RAM and cache-device copies alike, without touching the
/// backing device; a range with a miss, a sector the cache never held or more than one window
/// is refused with nothing done, and the full read then serves it.
#[test]
fn a_cached_only_read_serves_hits_and_refuses_the_rest_untouched() {
    let pair = SimPair::new(MIB + 16 * MIB, 64 * MIB, MIB);
    let (e, model) = every_kind_of_copy(&pair, false);
    let backing_reads = pair.backing.read_count();
    let cache_reads = pair.cache.read_count();
    let reads = e.stats().counters.reads;
    let mut out = vec![0u8; (64 * BLOCK) as usize];
    assert!(
        e.read_if_cached(0, &mut out).unwrap(),
        "every block is cached"
    );
    assert!(out == model[..out.len()], "the cached-only read differs");
    assert!(
        pair.cache.read_count() > cache_reads,
        "no cache device read"
    );
    assert_eq!(e.stats().counters.reads, reads + 1);
    // The sector written alone in block 70 is served; its neighbours never were cached.
    let mut sector = vec![0u8; 512];
    assert!(e.read_if_cached(70 * BLOCK + 1536, &mut sector).unwrap());
    assert!(sector == model[(70 * BLOCK + 1536) as usize..(70 * BLOCK + 2048) as usize]);
    assert_eq!(
        pair.backing.read_count(),
        backing_reads,
        "a hit read the backing device"
    );

    let refused = [
        (60 * BLOCK, 8 * BLOCK), // runs into misses
        (70 * BLOCK, BLOCK),     // a block whose other sectors the cache never held
        (80 * BLOCK, BLOCK),     // a miss
        (0, 256 * BLOCK + 4096), // more than one window
    ];
    let reads = e.stats().counters.reads;
    for (offset, length) in refused {
        let mut out = vec![0x55u8; length as usize];
        assert!(
            !e.read_if_cached(offset, &mut out).unwrap(),
            "{offset}+{length}"
        );
        assert!(
            out.iter().all(|&b| b == 0x55),
            "a refused read wrote the buffer"
        );
    }
    assert_eq!(
        e.stats().counters.reads,
        reads,
        "a refused read was counted"
    );
    assert_eq!(
        pair.backing.read_count(),
        backing_reads,
        "a refused read did IO"
    );
    let mut out = vec![0u8; (8 * BLOCK) as usize];
    e.read(60 * BLOCK, &mut out).unwrap();
    assert!(out == model[(60 * BLOCK) as usize..(68 * BLOCK) as usize]);
}

/// A device error on one block in the middle of a multi-run read: a dirty block (the only
/// copy) fails the read with the IO error; a clean block is served from the backing device and
/// its copy dropped; the other blocks of the failing run are read on their own and served.
#[test]
fn a_device_error_in_the_middle_of_a_multi_run_read() {
    let cache_bytes = MIB + 16 * MIB;
    let pair = SimPair::new(cache_bytes, 64 * MIB, MIB);
    let e = Engine::open(pair.cache(), pair.backing(), device_reads(4 * MIB)).unwrap();
    // Blocks 0..32 clean (written back), 32..64 dirty; a hole of misses between the two runs.
    for b in 0..32 {
        e.write(b * BLOCK, &block_of(b), false).unwrap();
    }
    e.flush().unwrap();
    e.drain(|_| {}).unwrap();
    for b in 34..64 {
        e.write(b * BLOCK, &block_of(b), false).unwrap();
    }
    e.flush().unwrap();
    assert_eq!(e.stats().dirty_blocks, 30);
    e.close().unwrap();
    let mut model = vec![0u8; (64 * BLOCK) as usize];
    for b in (0..32).chain(34..64) {
        model[(b * BLOCK) as usize..((b + 1) * BLOCK) as usize].copy_from_slice(&block_of(b));
    }
    let dirty_at = cache_offset_of(&pair, cache_bytes, &block_of(40));
    let clean_at = cache_offset_of(&pair, cache_bytes, &block_of(10));

    let fault = Arc::new(FaultDevice::new(pair.cache()));
    let cache: Arc<dyn BlockDevice> = fault.clone();
    let e = Engine::open(cache, pair.backing(), device_reads(4 * MIB)).unwrap();
    let mut out = vec![0u8; (64 * BLOCK) as usize];

    // The dirty block's copy cannot be read: the read fails, with the device's error.
    fault.fail_range(OpKind::Read, dirty_at, BLOCK, FaultKind::Io);
    let err = e.read(0, &mut out).unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err}");
    assert!(fault.injected(OpKind::Read) >= 1);
    // The same read not touching the bad block works, as does everything after healing.
    e.read(0, &mut out[..(40 * BLOCK) as usize]).unwrap();
    assert!(out[..(40 * BLOCK) as usize] == model[..(40 * BLOCK) as usize]);
    fault.heal();
    e.read(0, &mut out).unwrap();
    assert!(out == model, "the read after healing differs");

    // The clean block's copy cannot be read: served from the backing device, copy dropped.
    let evicted_before = e.stats().counters.blocks_evicted;
    let errors_before = e.stats().counters.io_errors;
    fault.fail_range(OpKind::Read, clean_at, BLOCK, FaultKind::Io);
    out.fill(0);
    e.read(0, &mut out).unwrap();
    assert!(out == model, "a clean block's failure changed the data");
    let c = e.stats().counters;
    assert_eq!(
        c.blocks_evicted,
        evicted_before + 1,
        "the bad copy is dropped"
    );
    assert_eq!(c.io_errors, errors_before + 1, "one block failed");
    let injected = fault.injected(OpKind::Read);
    out.fill(0);
    e.read(0, &mut out).unwrap();
    assert!(out == model);
    assert_eq!(
        fault.injected(OpKind::Read),
        injected,
        "the dropped copy is not read again"
    );

    // A corrupt clean block in a run: its CRC fails, the rest of the run is served.
    e.close().unwrap();
    let corrupt_at = cache_offset_of(&pair, cache_bytes, &block_of(12));
    pair.cache.corrupt(corrupt_at + 9, 0x40);
    let e = Engine::open(pair.cache(), pair.backing(), device_reads(4 * MIB)).unwrap();
    out.fill(0);
    e.read(0, &mut out).unwrap();
    assert!(out == model, "a corrupt clean block changed the data");
    assert_eq!(e.stats().counters.checksum_errors, 1);
    // A corrupt dirty block in a run: the read fails, never returns wrong data.
    e.close().unwrap();
    let corrupt_at = cache_offset_of(&pair, cache_bytes, &block_of(50));
    pair.cache.corrupt(corrupt_at + 9, 0x40);
    let e = Engine::open(pair.cache(), pair.backing(), device_reads(4 * MIB)).unwrap();
    let err = e.read(0, &mut out).unwrap_err();
    assert!(matches!(err, Error::Corruption(_)), "{err}");
}

/// A miss spanning several windows (4 MiB, the windows are 1 MiB) is one backing-device read,
/// not one per window: the run of blocks the cache lacks carries over from window to window,
/// so a large miss has all of its bytes in flight at the backing device at once.
#[test]
fn a_large_miss_is_one_backing_read() {
    let pair = SimPair::new(MIB + 16 * MIB, 64 * MIB, MIB);
    let miss_bytes = 4 * MIB as usize;
    pair.backing.write_raw(8 * MIB, &vec![0xC3; miss_bytes]);
    let e = Engine::open(pair.cache(), pair.backing(), manual(4 * MIB)).unwrap();
    let reads_before = pair.backing.read_count();
    let mut out = vec![0u8; miss_bytes];
    e.read(8 * MIB, &mut out).unwrap();
    assert!(
        out.iter().all(|&b| b == 0xC3),
        "the miss returned wrong data"
    );
    assert_eq!(
        pair.backing.read_count() - reads_before,
        1,
        "a 4 MiB miss took more than one backing read"
    );
}

/// The same failure on a real cache file read through the IO engine (io_uring where the kernel
/// allows it, its runs in one batch): three runs of dirty blocks, the middle one past the end
/// of the cache file (cut short under the engine, so its read fails with a short read while
/// the runs around it in the same batch succeed). The request fails with an IO error (no
/// data of it is served), no segment pin stays behind, the runs around it still read right,
/// and the engine closes.
#[test]
fn a_device_read_failing_in_the_middle_of_a_batched_multi_run_read_fails_the_request_cleanly() {
    use logcache_engine::io::file::{create_sparse, DirectIo, FileDevice, FileOptions, ReadEngine};
    use logcache_engine::{format_cache, FormatOptions};
    let dir = std::env::temp_dir();
    let tag = format!("logcache-read-runs-{}", std::process::id());
    let cache_path = dir.join(format!("{tag}-cache.img"));
    let backing_path = dir.join(format!("{tag}-backing.img"));
    struct Remove(Vec<std::path::PathBuf>);
    impl Drop for Remove {
        fn drop(&mut self) {
            for p in &self.0 {
                let _ = std::fs::remove_file(p);
            }
        }
    }
    let _remove = Remove(vec![cache_path.clone(), backing_path.clone()]);
    let cache_bytes = MIB + 16 * MIB;
    create_sparse(&cache_path, cache_bytes).unwrap();
    create_sparse(&backing_path, 64 * MIB).unwrap();
    let (engine_kind, why) = ReadEngine::detect();
    if let Some(e) = why {
        eprintln!("io_uring unavailable ({e}): the batch goes through the sync engine");
    }
    let open_devices = || {
        let opts = FileOptions {
            direct: DirectIo::Auto,
            writable: true,
        };
        let mut cache = FileDevice::open(&cache_path, opts).unwrap();
        cache.set_read_engine(engine_kind);
        let backing = FileDevice::open(&backing_path, opts).unwrap();
        (
            Arc::new(cache) as Arc<dyn BlockDevice>,
            Arc::new(backing) as Arc<dyn BlockDevice>,
        )
    };
    let (cache, backing) = open_devices();
    let format = FormatOptions {
        segment_size_bytes: MIB,
        ..FormatOptions::default()
    };
    format_cache(&*cache, &*backing, &format).unwrap();
    let e = Engine::open(cache, backing, manual(4 * MIB)).unwrap();
    // Blocks 0..8, then 16..24, then 8..16: reading 0..24 is three runs, the middle one
    // (8..16) last on the cache device.
    for range in [0..8u64, 16..24, 8..16] {
        for b in range {
            e.write(b * BLOCK, &block_of(b), false).unwrap();
        }
        e.flush().unwrap();
    }
    e.close().unwrap();
    let image = std::fs::read(&cache_path).unwrap();
    let at = |b: u64| {
        image
            .chunks(4096)
            .position(|c| c == block_of(b))
            .expect("the block is on the cache device") as u64
            * BLOCK
    };
    assert!(
        at(16) > at(7) + BLOCK && at(8) > at(23),
        "three runs, the middle one last"
    );
    let cut_at = at(8);

    let (cache, backing) = open_devices();
    let e = Engine::open(cache, backing, manual(4 * MIB)).unwrap();
    let mut out = logcache_engine::io::aligned::AlignedBuf::new((24 * BLOCK) as usize);
    e.read(0, &mut out).unwrap();
    for b in 0..24u64 {
        assert!(
            out[(b * BLOCK) as usize..][..4096] == block_of(b),
            "block {b}"
        );
    }
    // The file is cut at block 8's copy: the middle run (and only it) now reads short.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&cache_path)
        .unwrap()
        .set_len(cut_at)
        .unwrap();
    let batches_before = ReadEngine::io_uring_batches();
    let errors_before = e.stats().counters.io_errors;
    // Not the right data already: a run whose failure went unnoticed would verify.
    out.fill(0);
    let err = e.read(0, &mut out).unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err}");
    if engine_kind == ReadEngine::IoUring {
        assert!(
            ReadEngine::io_uring_batches() > batches_before,
            "the runs went through the ring"
        );
    }
    assert!(e.stats().counters.io_errors > errors_before);
    assert_eq!(e.segment_pins(), 0, "a failed read left a segment pinned");
    // The runs around the bad one still read right, alone and together.
    for (from, to) in [(0u64, 8u64), (16, 24)] {
        let mut part =
            logcache_engine::io::aligned::AlignedBuf::new(((to - from) * BLOCK) as usize);
        e.read(from * BLOCK, &mut part).unwrap();
        for b in from..to {
            assert!(
                part[((b - from) * BLOCK) as usize..][..4096] == block_of(b),
                "block {b}"
            );
        }
    }
    // The dirty blocks are the only copies: every read of them keeps failing, never zeros.
    assert!(e.read(8 * BLOCK, &mut out[..4096]).is_err());
    assert_eq!(e.segment_pins(), 0);
    e.close().unwrap();
}

/// A worker's batch of cached-only reads (`read_batch_if_cached`): each read gets its own
/// outcome, as if read alone. Hits on the cache device and in RAM, two reads of the same
/// blocks and adjacent reads (their blocks never merged into one run across reads) are served;
/// a miss and a partly cached block are declined untouched; a read past the end fails with its
/// own error; a dirty block whose copy cannot be read fails only the read holding it.
#[test]
fn a_batch_of_cached_reads_gives_each_read_its_own_outcome() {
    let cache_bytes = MIB + 16 * MIB;
    let pair = SimPair::new(cache_bytes, 64 * MIB, MIB);
    let (e, model) = every_kind_of_copy(&pair, false);
    let dirty_at = cache_offset_of(&pair, cache_bytes, &block_of(30));
    e.close().unwrap();
    let fault = Arc::new(FaultDevice::new(pair.cache()));
    let cache: Arc<dyn BlockDevice> = fault.clone();
    let e = Engine::open(cache, pair.backing(), manual(4 * MIB)).unwrap();
    e.write(20 * BLOCK, &[0xA0; 4096], false).unwrap(); // a RAM copy again
    let ranges = [
        (0, 4 * BLOCK),           // cache device, one run
        (4 * BLOCK, 2 * BLOCK),   // right after it: its own run
        (0, 4 * BLOCK),           // the same blocks again
        (19 * BLOCK, 3 * BLOCK),  // around the RAM copy
        (80 * BLOCK, BLOCK),      // a miss: declined
        (70 * BLOCK, BLOCK),      // sectors the cache never held: declined
        (28 * BLOCK, 4 * BLOCK),  // holds block 30, whose copy fails (dirty): its error
        (u64::MAX - 4095, BLOCK), // past the end: its own error
        (40 * BLOCK + 512, 1536), // sub-block, unaligned in its block
    ];
    fault.fail_range(OpKind::Read, dirty_at, BLOCK, FaultKind::Io);
    let mut bufs: Vec<Vec<u8>> = ranges
        .iter()
        .map(|&(_, len)| vec![0x55u8; len as usize])
        .collect();
    let backing_reads = pair.backing.read_count();
    let reads_before = e.stats().counters.reads;
    let mut reads: Vec<CachedRead> = ranges
        .iter()
        .zip(bufs.iter_mut())
        .map(|(&(offset, _), buf)| CachedRead::new(offset, buf))
        .collect();
    e.read_batch_if_cached(&mut reads);
    let served: Vec<_> = reads.into_iter().map(|r| r.served).collect();
    for (i, ((offset, len), outcome)) in ranges.iter().zip(&served).enumerate() {
        let (offset, len) = (*offset as usize, *len as usize);
        match i {
            4 | 5 => {
                assert!(matches!(outcome, Ok(false)), "read {i}: {outcome:?}");
                assert!(
                    bufs[i].iter().all(|&b| b == 0x55),
                    "declined read {i} wrote"
                );
            }
            6 => assert!(matches!(outcome, Err(Error::Io { .. })), "{outcome:?}"),
            7 => assert!(outcome.is_err(), "past the end: {outcome:?}"),
            _ => {
                assert!(matches!(outcome, Ok(true)), "read {i}: {outcome:?}");
                assert!(bufs[i] == model[offset..offset + len], "read {i} differs");
            }
        }
    }
    assert_eq!(
        e.stats().counters.reads,
        reads_before + 6,
        "each served read counted once (the failing one too)"
    );
    assert_eq!(
        pair.backing.read_count(),
        backing_reads,
        "a batch of cached reads read the backing device"
    );
}
