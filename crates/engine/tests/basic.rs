//! Basic engine behaviour: format, write, read back, flush, close, reopen, and the errors a
//! caller can cause. Each test draws its layout in a comment where it matters.

use std::sync::Arc;

use logcache_engine::io::memory::MemDevice;
use logcache_engine::io::BlockDevice;
use logcache_engine::{format_cache, Engine, Error, FormatOptions, OpenOptions};
use logcache_testkit::sim::SimDevice;

const MIB: u64 = 1 << 20;

fn devices(cache_mib: u64, backing_mib: u64) -> (Arc<dyn BlockDevice>, Arc<dyn BlockDevice>) {
    (
        Arc::new(MemDevice::new(cache_mib * MIB)),
        Arc::new(MemDevice::new(backing_mib * MIB)),
    )
}

fn small_format() -> FormatOptions {
    FormatOptions {
        segment_size_bytes: 64 << 10,
        ..FormatOptions::default()
    }
}

fn manual() -> OpenOptions {
    OpenOptions {
        ram_buffer_bytes: 256 << 10,
        manual_flusher: true,
        ..OpenOptions::default()
    }
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_add((i / 512) as u8).wrapping_mul(31) ^ (i as u8))
        .collect()
}

#[test]
fn write_read_close_reopen() {
    let (cache, backing) = devices(8, 16);
    format_cache(&*cache, &*backing, &small_format()).unwrap();
    for opts in [manual(), OpenOptions::default()] {
        let e = Engine::open(cache.clone(), backing.clone(), opts.clone()).unwrap();
        assert_eq!(e.size_bytes(), 16 * MIB - 4096);
        let data = pattern(1, 12288);
        e.write(4096 * 10, &data, false).unwrap();
        let mut back = vec![0u8; 12288];
        e.read(4096 * 10, &mut back).unwrap();
        assert_eq!(back, data);
        // Unwritten space reads as the backing device's zeros.
        let mut z = vec![1u8; 4096];
        e.read(0, &mut z).unwrap();
        assert!(z.iter().all(|&b| b == 0));
        e.flush().unwrap();
        e.close().unwrap();
        let e = Engine::open(cache.clone(), backing.clone(), opts).unwrap();
        assert!(e.stats().recovery.clean);
        let mut back = vec![0u8; 12288];
        e.read(4096 * 10, &mut back).unwrap();
        assert_eq!(back, data);
        e.close().unwrap();
    }
}

#[test]
fn partial_writes_merge_at_sector_granularity() {
    let (cache, backing) = devices(8, 16);
    // The backing device already holds data under the block.
    let base = pattern(9, 4096);
    backing.write_at(&base, 4096 * 3).unwrap();
    format_cache(&*cache, &*backing, &small_format()).unwrap();
    let e = Engine::open(cache.clone(), backing.clone(), manual()).unwrap();
    let mut model = base.clone();
    // sector 1 in the open chunk, then sector 6 after a flush (older copy sealed in RAM),
    // then sector 3 after the segment went to disk.
    e.write(4096 * 3 + 512, &[0xAA; 512], false).unwrap();
    model[512..1024].fill(0xAA);
    e.flush().unwrap();
    e.write(4096 * 3 + 6 * 512, &[0xBB; 1024], false).unwrap();
    model[3072..4096].fill(0xBB);
    // Fill enough other blocks that the segment holding block 3 is written and released.
    for i in 0..64u64 {
        e.write(4096 * (100 + i), &pattern(i as u8, 4096), false)
            .unwrap();
    }
    e.flush().unwrap();
    e.write(4096 * 3 + 3 * 512, &[0xCC; 512], false).unwrap();
    model[1536..2048].fill(0xCC);
    let mut back = vec![0u8; 4096];
    e.read(4096 * 3, &mut back).unwrap();
    assert_eq!(back, model);
    // A 512-byte read in the middle.
    let mut one = vec![0u8; 512];
    e.read(4096 * 3 + 3 * 512, &mut one).unwrap();
    assert_eq!(one, vec![0xCC; 512]);
    e.close().unwrap();
    let e = Engine::open(cache, backing, manual()).unwrap();
    e.read(4096 * 3, &mut back).unwrap();
    assert_eq!(back, model);
}

#[test]
fn flushed_data_survives_a_crash_and_unflushed_may_not() {
    let cache = SimDevice::new(8 * MIB);
    let backing = SimDevice::new(16 * MIB);
    let (c, b): (Arc<dyn BlockDevice>, Arc<dyn BlockDevice>) =
        (Arc::new(cache.clone()), Arc::new(backing.clone()));
    format_cache(&*c, &*b, &small_format()).unwrap();
    let e = Engine::open(c.clone(), b.clone(), manual()).unwrap();
    e.write(0, &pattern(3, 8192), false).unwrap();
    e.flush().unwrap();
    e.write(8192, &pattern(4, 4096), false).unwrap();
    e.crash();
    cache.crash_lose_all();
    let e = Engine::open(c, b, manual()).unwrap();
    assert!(!e.stats().recovery.clean);
    let mut back = vec![0u8; 8192];
    e.read(0, &mut back).unwrap();
    assert_eq!(back, pattern(3, 8192));
    let mut back = vec![0u8; 4096];
    e.read(8192, &mut back).unwrap();
    assert!(
        back == vec![0u8; 4096],
        "an unflushed write that never reached the device"
    );
}

#[test]
fn user_errors_are_typed() {
    let (cache, backing) = devices(8, 16);
    assert!(matches!(
        Engine::open(cache.clone(), backing.clone(), manual()),
        Err(Error::NotFormatted(_))
    ));
    format_cache(&*cache, &*backing, &small_format()).unwrap();
    // Another backing device of the same size but without our label.
    let other: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(16 * MIB));
    assert!(matches!(
        Engine::open(cache.clone(), other, manual()),
        Err(Error::WrongBacking(_))
    ));
    let bigger: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(32 * MIB));
    assert!(matches!(
        Engine::open(cache.clone(), bigger, manual()),
        Err(Error::WrongBacking(_))
    ));
    let e = Engine::open(cache.clone(), backing.clone(), manual()).unwrap();
    assert!(matches!(
        e.write(100, &[0; 512], false),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        e.write(0, &[0; 100], false),
        Err(Error::InvalidArgument(_))
    ));
    let end = e.size_bytes();
    assert!(matches!(
        e.read(end, &mut [0; 512]),
        Err(Error::InvalidArgument(_))
    ));
    e.write(0, &[1; 4096], false).unwrap();
    e.close().unwrap();
    assert!(matches!(e.write(0, &[0; 512], false), Err(Error::Closed)));
    // The cache now holds data: a second format needs force.
    assert!(matches!(
        format_cache(&*cache, &*backing, &small_format()),
        Err(Error::HoldsData(_))
    ));
    let forced = FormatOptions {
        force: true,
        ..small_format()
    };
    format_cache(&*cache, &*backing, &forced).unwrap();
    let e = Engine::open(cache.clone(), backing.clone(), manual()).unwrap();
    let mut b = [9u8; 4096];
    e.read(0, &mut b).unwrap();
    assert_eq!(b, [0u8; 4096], "a new format forgets the old log");
    // Too small a cache device.
    let tiny: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(MIB));
    assert!(matches!(
        format_cache(&*tiny, &*backing, &forced),
        Err(Error::NoSpace(_))
    ));
}

/// The in-memory index costs at most 32 bytes per cache block (dm-writeboost: about 48), at
/// every cache size, whether the cache is empty or full.
#[test]
fn index_memory_is_at_most_32_bytes_per_block() {
    for cache_mib in [5u64, 17, 64, 257] {
        let (cache, backing) = devices(cache_mib, 2 * cache_mib);
        format_cache(&*cache, &*backing, &FormatOptions::default()).unwrap();
        let e = Engine::open(cache, backing, manual()).unwrap();
        let s = e.stats();
        let per_block = s.index_memory_bytes as f64 / s.cache_blocks as f64;
        assert!(
            per_block <= 32.0,
            "{cache_mib} MiB cache: {per_block:.1} bytes per block"
        );
        assert!(per_block > 8.0, "the accounting counts the index itself");
    }
}

/// Reads and writes are counted once per request; each block of a read is a hit (every wanted
/// sector cached) or a miss.
#[test]
fn request_counters() {
    let (cache, backing) = devices(8, 16);
    format_cache(&*cache, &*backing, &small_format()).unwrap();
    let e = Engine::open(cache, backing, manual()).unwrap();
    e.write(0, &[1; 8192], false).unwrap(); // blocks 0 and 1
    e.write(4 * 4096, &[2; 512], false).unwrap(); // one sector of block 4
    let mut buf = vec![0u8; 6 * 4096];
    e.read(0, &mut buf).unwrap(); // blocks 0..6: hits 0, 1; misses 2, 3, 4 (partial), 5
    e.read(4 * 4096, &mut buf[..512]).unwrap(); // the cached sector of block 4: a hit
    let c = e.stats().counters;
    assert_eq!((c.writes, c.write_bytes), (2, 8192 + 512));
    assert_eq!((c.reads, c.read_bytes), (2, 6 * 4096 + 512));
    assert_eq!((c.read_hits, c.read_misses), (3, 4));
    assert_eq!(&buf[4 * 4096 + 512..4 * 4096 + 1024], &[0u8; 512][..]);
}

#[test]
fn a_writeback_step_of_any_size_writes_back_at_most_one_batch() {
    // `usize::MAX` overflowed the batch buffer's byte size (a multiply panic) before the
    // step was clamped to writeback_batch_blocks' largest value, 8,192.
    let (cache, backing) = devices(8, 16);
    format_cache(&*cache, &*backing, &small_format()).unwrap();
    let e = Engine::open(cache.clone(), backing.clone(), manual()).unwrap();
    let data = pattern(3, 40 * 4096);
    e.write(0, &data, false).unwrap();
    e.flush().unwrap();
    assert_eq!(e.writeback_step(usize::MAX).unwrap(), 40);
    assert_eq!(e.stats().writeback_lag_bytes, 0);
    assert_eq!(e.writeback_step(usize::MAX).unwrap(), 0);
    let mut back = vec![0u8; data.len()];
    backing.read_at(&mut back, 0).unwrap();
    assert!(
        back == data,
        "the backing device holds the written-back blocks"
    );
    e.close().unwrap();
}
