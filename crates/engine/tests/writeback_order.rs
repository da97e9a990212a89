//! `OpenOptions::writeback_sorted`: the benchmarks' unsorted baseline writes the same data
//! back, one IO per block, where the default merges adjacent blocks into one IO.

use std::sync::Arc;

use logcache_engine::io::memory::MemDevice;
use logcache_engine::io::BlockDevice;
use logcache_engine::{format_cache, Engine, FormatOptions, OpenOptions};
use logcache_testkit::hdd::{HddDevice, HddParams};

const MIB: u64 = 1 << 20;
const BLOCK: u64 = 4096;

/// An emulated disk over `mem` with tiny costs: used here to count IOs, not to time them.
fn counting_hdd(mem: &Arc<MemDevice>) -> Arc<HddDevice> {
    let params = HddParams {
        rpm: 6_000_000,
        settle_us: 1,
        full_stroke_us: 2,
        bandwidth_bytes_per_s: 1 << 40,
        platter_bytes: 1 << 20,
        flush_us: 1,
        ncq_depth: 32,
    };
    Arc::new(HddDevice::new(mem.clone(), params).unwrap())
}

/// Drains 64 adjacent blocks written in descending order plus 8 scattered ones; returns the
/// backing device IOs the drain issued. Checks the backing device holds the data afterwards.
fn drain_ios(sorted: bool) -> u64 {
    let cache: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(64 * MIB));
    let mem = Arc::new(MemDevice::new(16 * MIB));
    format_cache(&*cache, &*mem, &FormatOptions::default()).unwrap();
    let hdd = counting_hdd(&mem);
    let opts = OpenOptions {
        ram_buffer_bytes: 4 * MIB,
        manual_flusher: true,
        seal_interval_ms: Some(0),
        writeback_sorted: sorted,
        ..OpenOptions::default()
    };
    let e = Engine::open(cache, hdd.clone(), opts).unwrap();
    let lbas: Vec<u64> = (0..64u64)
        .rev()
        .map(|b| 100 + b)
        .chain((0..8).map(|i| 1000 + 37 * i))
        .collect();
    for &lba in &lbas {
        e.write(lba * BLOCK, &[lba as u8; 4096], false).unwrap();
    }
    e.flush().unwrap();
    let before = hdd.stats().ios;
    e.drain(|_| {}).unwrap();
    let ios = hdd.stats().ios - before;
    let mut buf = [0u8; 4096];
    for &lba in &lbas {
        mem.read_at(&mut buf, lba * BLOCK).unwrap();
        assert_eq!(buf, [lba as u8; 4096], "block {lba}, sorted {sorted}");
    }
    e.close().unwrap();
    ios
}

#[test]
fn unsorted_writeback_writes_each_block_alone() {
    let sorted = drain_ios(true);
    let unsorted = drain_ios(false);
    // Sorted: the 64-block run is one write. Unsorted: 64 writes. The rest is the same.
    assert_eq!(unsorted, sorted + 63, "sorted {sorted} unsorted {unsorted}");
}

/// With several writeback IOs in flight (the background thread, not manual mode), every block
/// still reaches its place: runs, scattered blocks and partly dirty blocks alike, over several
/// batches.
#[test]
fn concurrent_writeback_ios_write_every_block_to_its_place() {
    let cache: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(64 * MIB));
    let mem = Arc::new(MemDevice::new(16 * MIB));
    mem.write_at(&vec![0xee; (16 * MIB) as usize], 0).unwrap();
    format_cache(&*cache, &*mem, &FormatOptions::default()).unwrap();
    let hdd = counting_hdd(&mem);
    let e = Engine::open(cache, hdd.clone(), OpenOptions::default()).unwrap();
    e.set_tunable("writeback_io_depth", "8").unwrap();
    e.set_tunable("writeback_batch_blocks", "64").unwrap();
    let mut expect = vec![0xeeu8; (8 * MIB) as usize];
    let mut put = |e: &Engine, off: u64, data: &[u8]| {
        e.write(off, data, false).unwrap();
        expect[off as usize..off as usize + data.len()].copy_from_slice(data);
    };
    // A long run written backwards, scattered blocks, and partly dirty blocks (sectors 1-2 and
    // 5 of a block whose other sectors were never written).
    for b in (0..300u64).rev() {
        put(&e, (200 + b) * BLOCK, &[(b % 251) as u8 + 1; 4096]);
    }
    for i in 0..40u64 {
        put(&e, (600 + 13 * i) * BLOCK, &[i as u8 + 100; 4096]);
    }
    for i in 0..10u64 {
        let base = (900 + 3 * i) * BLOCK;
        put(&e, base + 512, &[i as u8 + 200; 1024]);
        put(&e, base + 5 * 512, &[i as u8 + 210; 512]);
    }
    e.flush().unwrap();
    e.drain(|_| {}).unwrap();
    assert_eq!(e.stats().dirty_blocks, 0);
    let mut got = vec![0u8; expect.len()];
    mem.read_at(&mut got, 0).unwrap();
    for (b, (g, x)) in got.chunks(4096).zip(expect.chunks(4096)).enumerate() {
        assert!(g == x, "block {b} differs on the backing device");
    }
    e.close().unwrap();
}

/// A memory device that counts the reads and bytes read from it and says what
/// `read_gap_bytes_max` it is given (the default's, or memory's 0).
struct CountingReads {
    mem: MemDevice,
    gap_bytes_max: u64,
    reads: std::sync::atomic::AtomicU64,
    read_bytes: std::sync::atomic::AtomicU64,
}

impl BlockDevice for CountingReads {
    fn size_bytes(&self) -> u64 {
        self.mem.size_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.read_bytes
            .fetch_add(buf.len() as u64, std::sync::atomic::Ordering::Relaxed);
        self.mem.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.mem.write_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.mem.flush()
    }
    fn discard(&self, offset: u64, len_bytes: u64) -> std::io::Result<()> {
        self.mem.discard(offset, len_bytes)
    }
    fn describe(&self) -> String {
        "counting memory".into()
    }
    fn read_gap_bytes_max(&self) -> u64 {
        self.gap_bytes_max
    }
}

/// Dirty blocks in `drain_reads`' log: 64 one apart, then a run of 10 adjacent ones.
const DIRTY_BLOCKS: u64 = 74;

/// Drains, in one batch, 64 dirty blocks with a metadata block between each two in the log,
/// then 10 adjacent ones in descending backing order (the batch buffer holds them ascending, so
/// their run cannot be read in place), from a cache device that says `gap_bytes_max`; checks
/// the backing device's data and returns the reads and bytes the drain took from the cache.
fn drain_reads(gap_bytes_max: u64) -> (u64, u64) {
    use std::sync::atomic::Ordering::Relaxed;
    let cache = Arc::new(CountingReads {
        mem: MemDevice::new(64 * MIB),
        gap_bytes_max,
        reads: Default::default(),
        read_bytes: Default::default(),
    });
    let mem = Arc::new(MemDevice::new(16 * MIB));
    format_cache(&*cache, &*mem, &FormatOptions::default()).unwrap();
    let opts = OpenOptions {
        ram_buffer_bytes: 4 * MIB,
        manual_flusher: true,
        seal_interval_ms: Some(0),
        ..OpenOptions::default()
    };
    let e = Engine::open(cache.clone(), mem.clone(), opts).unwrap();
    // Not one batch per flush epoch: the drain takes every block in one batch.
    e.set_tunable("writeback_order", "sorted").unwrap();
    // One chunk per write (each flush seals one): in the log each of these dirty blocks follows
    // its chunk's metadata block.
    let mut lbas: Vec<u64> = (100..164u64).rev().collect();
    for &lba in &lbas {
        e.write(lba * BLOCK, &[lba as u8; 4096], false).unwrap();
        e.flush().unwrap();
    }
    // Then one chunk of 10 adjacent blocks, written in descending order.
    for lba in (300..310u64).rev() {
        e.write(lba * BLOCK, &[lba as u8; 4096], false).unwrap();
        lbas.push(lba);
    }
    e.flush().unwrap();
    assert_eq!(lbas.len() as u64, DIRTY_BLOCKS);
    let (reads, bytes) = (cache.reads.load(Relaxed), cache.read_bytes.load(Relaxed));
    e.drain(|_| {}).unwrap();
    let reads = cache.reads.load(Relaxed) - reads;
    let bytes = cache.read_bytes.load(Relaxed) - bytes;
    assert_eq!(e.stats().dirty_blocks, 0);
    assert_eq!(e.stats().counters.writeback_batches, 1, "one batch");
    let mut buf = [0u8; 4096];
    for &lba in &lbas {
        mem.read_at(&mut buf, lba * BLOCK).unwrap();
        assert_eq!(buf, [lba as u8; 4096], "block {lba}, gap {gap_bytes_max}");
    }
    e.close().unwrap();
    (reads, bytes)
}

/// A cache device that says gaps are worth nothing (memory) has writeback read only the dirty
/// blocks, each straight into its place (one read per block where a run is not in backing
/// order); the default reads spans over the blocks between.
#[test]
fn gapless_cache_device_reads_only_the_dirty_blocks() {
    let dirty_bytes = DIRTY_BLOCKS * BLOCK;
    let (reads, bytes) = drain_reads(0);
    assert_eq!(
        bytes, dirty_bytes,
        "read {bytes} bytes for {dirty_bytes} dirty"
    );
    assert_eq!(
        reads, DIRTY_BLOCKS,
        "{reads} reads for {DIRTY_BLOCKS} dirty blocks"
    );
    let (reads, bytes) = drain_reads(logcache_engine::io::READ_GAP_BYTES_MAX_DEFAULT);
    assert!(
        bytes > dirty_bytes,
        "spans read {bytes} bytes for {dirty_bytes} dirty: no gap read over"
    );
    assert!(reads < DIRTY_BLOCKS, "spans took {reads} reads");
}
