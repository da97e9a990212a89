//! Features that keep state or a promise on the cached path, across the switch to the backing
//! device alone (`path/alone.rs`): each test holds or places something of the cached path at
//! the switch, then checks what the disk answers after it (s40 review, docs/RELIABILITY.md).
//!
//! Every wait is bounded: a hang is reported as a failure, never waited out.

mod common;

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use logcache_engine::io::BlockDevice;
use logcache_engine::{Engine, Error, OpenOptions};
use logcache_testkit::fault::{FaultDevice, FaultKind, OpKind};
use logcache_testkit::gate::GateDevice;

const KIB: u64 = 1024;
const MIB: u64 = 1 << 20;
const SEG_64K: u64 = 64 * KIB;
const BLOCK: u64 = 4096;
/// How long a step may take before the test calls it a hang (generous: a loaded 2-core CI).
const HANG: Duration = Duration::from_secs(60);

/// Runs `f` on its own thread; panics if it does not return within `HANG`.
fn bounded<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(HANG) {
        Ok(v) => v,
        Err(_) => panic!("{what} hung (no answer in {HANG:?})"),
    }
}

/// A threaded engine whose cache device can fail (`FaultDevice`) and be held (`GateDevice`,
/// outermost), with no background writeback (dirty blocks stay dirty until a test writes
/// them back) and no RAM cache (a read of a block not in the log's RAM goes to the device).
fn engine(pair: &SimPair) -> (Arc<FaultDevice>, Arc<GateDevice>, Engine) {
    let faulty = Arc::new(FaultDevice::new(pair.cache()));
    let gate = Arc::new(GateDevice::new(faulty.clone()));
    let opts = OpenOptions {
        ram_buffer_bytes: 4 * SEG_64K,
        seal_interval_ms: Some(0),
        ..OpenOptions::default()
    };
    let e = Engine::open(gate.clone() as Arc<dyn BlockDevice>, pair.backing(), opts).unwrap();
    e.set_tunable("ram_cache_mib", "0").unwrap();
    e.set_tunable("writeback_idle_ms", "0").unwrap();
    e.set_tunable("writeback_threshold_percent", "100").unwrap();
    (faulty, gate, e)
}

/// Writes more than the log's RAM buffers hold, so earlier blocks are read from the device.
fn push_out_of_ram(e: &Engine) {
    for b in 64..64 + 2 * (4 * SEG_64K / BLOCK) {
        e.write(b * BLOCK, &[0x33; BLOCK as usize], false).unwrap();
    }
}

/// The cache device fails under a flush (every write and read of it fails from now on): the
/// disk goes on from the backing device alone.
fn fail_the_cache(e: &Engine, faulty: &FaultDevice) {
    // A write for the flush to write to the cache device.
    e.write(20 * BLOCK, &[0x6b; BLOCK as usize], false).unwrap();
    faulty.fail_next(OpKind::Write, u64::MAX, FaultKind::Io);
    faulty.fail_next(OpKind::Read, u64::MAX, FaultKind::Io);
    let other = e.clone();
    // Its outcome is not the point (it may report lost unflushed data).
    let _ = bounded("a flush as the cache device fails", move || other.flush());
    assert!(e.stats().serving_alone, "{:?}", e.stats());
}

fn lost(e: &Engine, lba: u64) -> bool {
    e.lost_runs()
        .iter()
        .any(|&(f, n)| f < (lba + 1) * 8 && lba * 8 < f + n)
}

/// A read of a dirty block, planned on the cache device before the switch and held there until
/// after it: its IO then fails, and the block's newest data (only on the cache device) is lost.
/// The read must fail with EIO, never return the older bytes the backing device holds
/// (`path/read.rs` `block_failed` falls back to the backing device for clean blocks only; the
/// request, failed in the cached path, is tried again alone, where the lost set answers).
/// Mutation that fails it: `block_failed` reading a dirty block from the backing device too
/// (kept in the index: the read returned 0x05).
#[test]
fn a_dirty_read_held_across_the_switch_reads_eio_not_older_bytes() {
    let pair = SimPair::new(MIB + 16 * SEG_64K, 16 * MIB, SEG_64K);
    let (faulty, gate, e) = engine(&pair);
    let lba = 3u64;
    // The backing device holds 0x05 (written back), the cache a newer dirty 0x11 on the device.
    e.write(lba * BLOCK, &[0x05; BLOCK as usize], false)
        .unwrap();
    e.flush().unwrap();
    while e.writeback_step(256).unwrap() > 0 {}
    e.write(lba * BLOCK, &[0x11; BLOCK as usize], false)
        .unwrap();
    push_out_of_ram(&e);
    e.flush().unwrap();
    assert!(e.stats().dirty_blocks > 0, "{:?}", e.stats());
    gate.hold(OpKind::Read);
    let reader = e.clone();
    let read = std::thread::spawn(move || {
        let mut buf = vec![0u8; BLOCK as usize];
        let r = reader.read(lba * BLOCK, &mut buf);
        (r, buf)
    });
    assert!(
        gate.wait_held(OpKind::Read, 1, HANG),
        "the read never reached the cache device"
    );
    fail_the_cache(&e, &faulty);
    assert!(
        lost(&e, lba),
        "the dirty block is lost: {:?}",
        e.lost_runs()
    );
    gate.release(OpKind::Read);
    let (r, buf) = bounded("the held read", move || read.join().unwrap());
    match r {
        Err(Error::Io { source, .. }) => assert_eq!(source.raw_os_error(), Some(libc::EIO)),
        Err(other) => panic!("an unexpected error: {other}"),
        Ok(()) => panic!(
            "a lost block read {:#x}.. (the backing device's older bytes), not EIO",
            buf[0]
        ),
    }
    // Written again alone, it reads again.
    e.write(lba * BLOCK, &[0x22; BLOCK as usize], false)
        .unwrap();
    let mut buf = vec![0u8; BLOCK as usize];
    e.read(lba * BLOCK, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 0x22));
}
