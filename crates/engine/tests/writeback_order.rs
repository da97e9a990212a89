//! `OpenOptions::writeback_sorted`: the benchmarks' unsorted baseline writes the same data
//! back, one IO per block, where the default merges adjacent blocks into one IO.

use std::sync::Arc;

use logcache_engine::io::hdd::{HddDevice, HddParams};
use logcache_engine::io::memory::MemDevice;
use logcache_engine::io::BlockDevice;
use logcache_engine::{format, Engine, FormatOptions, OpenOptions};

const MIB: u64 = 1 << 20;
const BLOCK: u64 = 4096;

/// Drains 64 adjacent blocks written in descending order plus 8 scattered ones; returns the
/// backing device IOs the drain issued. Checks the backing device holds the data afterwards.
fn drain_ios(sorted: bool) -> u64 {
    let cache: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(64 * MIB));
    let mem = Arc::new(MemDevice::new(16 * MIB));
    format(&*cache, &*mem, &FormatOptions::default()).unwrap();
    // Tiny costs: the device is used here only to count IOs.
    let params = HddParams {
        rpm: 6_000_000,
        settle_us: 1,
        full_stroke_us: 2,
        bandwidth_bytes_per_s: 1 << 40,
        flush_us: 1,
        seed: 1,
    };
    let hdd = Arc::new(HddDevice::new(mem.clone(), params).unwrap());
    let opts = OpenOptions {
        ram_buffer_bytes: 4 * MIB,
        manual_flusher: true,
        seal_interval_ms: Some(0),
        writeback_sorted: sorted,
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
