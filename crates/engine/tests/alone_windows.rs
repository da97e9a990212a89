//! Features that keep state or a promise on the cached path, across the switch to the backing
//! device alone (`path/alone.rs`): each test holds or places something of the cached path at
//! the switch, then checks what the disk answers after it (s40 review, docs/RELIABILITY.md).
//!
//! Every wait is bounded: a hang is reported as a failure, never waited out.

mod common;

use std::sync::Arc;

use common::wait::{bounded, HANG};
use common::*;
use logcache_engine::io::BlockDevice;
use logcache_engine::{CachedRead, Engine, Error, ExtentKind, OpenOptions};
use logcache_testkit::fault::{FaultDevice, FaultKind, OpKind};
use logcache_testkit::gate::GateDevice;

const KIB: u64 = 1024;
const MIB: u64 = 1 << 20;
const SEG_64K: u64 = 64 * KIB;
const BLOCK: u64 = 4096;

/// A threaded engine whose cache device can fail (`FaultDevice`) and be held (`GateDevice`,
/// outermost), with no background writeback (dirty blocks stay dirty until a test writes
/// them back) and no RAM cache (a read of a block not in the log's RAM goes to the device).
fn engine(pair: &SimPair) -> (Arc<FaultDevice>, Arc<GateDevice>, Engine) {
    engine_on(pair, pair.backing())
}

/// As `engine`, over `backing`.
fn engine_on(
    pair: &SimPair,
    backing: Arc<dyn BlockDevice>,
) -> (Arc<FaultDevice>, Arc<GateDevice>, Engine) {
    let faulty = Arc::new(FaultDevice::new(pair.cache()));
    let gate = Arc::new(GateDevice::new(faulty.clone()));
    let opts = OpenOptions {
        ram_buffer_bytes: 4 * SEG_64K,
        seal_interval_ms: Some(0),
        ..OpenOptions::default()
    };
    let e = Engine::open(gate.clone() as Arc<dyn BlockDevice>, backing, opts).unwrap();
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

/// A checkpoint's changed bytes (`Engine::checkpoints`, what `logcache checkpoint list` shows)
/// once the disk is served from the backing device alone, where writes are not tracked: the
/// count must not leave them out (a backup script reading "nothing changed since" would skip
/// an incremental that had changes). Now every block counts as changed once the cache is given
/// up. Before the fix the list said 4 KiB changed (the one block written before the switch)
/// after two more blocks were written alone.
#[test]
fn a_checkpoint_list_served_alone_does_not_leave_out_the_changes_made_alone() {
    let pair = SimPair::new(MIB + 16 * SEG_64K, 16 * MIB, SEG_64K);
    let (faulty, _gate, e) = engine(&pair);
    e.checkpoint_create("since").unwrap();
    let changed = |e: &Engine| {
        let list = e.checkpoints();
        assert_eq!(list.len(), 1, "{list:?}");
        list[0].changed_bytes
    };
    assert_eq!(changed(&e), 0, "nothing changed yet");
    fail_the_cache(&e, &faulty);
    for lba in [7u64, 9] {
        e.write(lba * BLOCK, &[0x22; BLOCK as usize], false)
            .unwrap();
    }
    let bytes = changed(&e);
    assert!(
        bytes >= 3 * BLOCK,
        "{bytes} bytes changed since the checkpoint, with three blocks written since (two alone)"
    );
}

/// A reserved write (`Engine::reserve_write`, the reader's large writes) reserved before the
/// cache device failed and committed while the switch is being decided (its lost set and the
/// dirty data still in RAM already taken; the backing device's label being marked, held here).
/// Published then, it would be acknowledged as a dirty copy in a cache nobody reads again,
/// neither lost nor saved: the read alone would return the backing device's older bytes. The
/// commit must give the data back (`redo`) for the ordinary write, which goes alone. Guard:
/// `reserve::commit` publishes only while the engine is usable (the commit's check that the
/// disk is not served alone does not cover this window). Mutation that fails it: that check
/// removed (the commit published, and the block read zeros).
#[test]
fn a_reserved_write_committed_while_the_switch_is_decided_is_written_alone() {
    let pair = SimPair::new(MIB + 16 * SEG_64K, 16 * MIB, SEG_64K);
    let backing = Arc::new(GateDevice::new(pair.backing()));
    let (faulty, _gate, e) = engine_on(&pair, backing.clone());
    let lba = 5u64;
    let mut r = e
        .reserve_write(lba * BLOCK, BLOCK)
        .unwrap()
        .expect("a whole block in write-back mode is reserved");
    assert_eq!(r.piece_count(), 1);
    r.piece(0).fill(0x44);
    // The cache device fails under a tunable's superblock write (a flush would seal the open
    // chunk, cancelling the reservation); the switch holds at its first backing write (the
    // label's mark).
    backing.hold(OpKind::Write);
    faulty.fail_next(OpKind::Write, u64::MAX, FaultKind::Io);
    faulty.fail_next(OpKind::Read, u64::MAX, FaultKind::Io);
    assert!(e.set_tunable("writeback_rate_max_mib", "1").is_err());
    assert!(
        backing.wait_held(OpKind::Write, 1, HANG),
        "the switch never marked the backing device"
    );
    assert!(!e.stats().serving_alone, "the switch is being decided");
    let mut redo = Vec::new();
    let published = r.commit(&mut redo);
    // Given back, it is written the ordinary way (which waits for the decision).
    let writer = e.clone();
    let write = std::thread::spawn(move || {
        if !published {
            assert_eq!(redo.len() as u64, BLOCK);
            writer.write(lba * BLOCK, &redo, false)?;
        }
        Ok::<(), Error>(())
    });
    backing.release(OpKind::Write);
    bounded("the reserved write", move || write.join().unwrap())
        .expect("the reserved write, acknowledged");
    assert!(e.stats().serving_alone, "{:?}", e.stats());
    let mut buf = vec![0u8; BLOCK as usize];
    match e.read(lba * BLOCK, &mut buf) {
        Ok(()) => assert!(
            buf.iter().all(|&b| b == 0x44),
            "an acknowledged reserved write reads {:#x}.. alone (published: {published})",
            buf[0]
        ),
        Err(err) => panic!("an acknowledged reserved write reads an error alone: {err}"),
    }
}

/// Reads after the switch, of blocks the given-up cache still holds (a clean copy in the RAM
/// cache and on the cache device, a dirty one in the log's RAM buffers, saved to the backing
/// device by the switch), each written again alone: every read path (`read`, and the reader's
/// `read_if_cached` and `read_batch_if_cached`) answers with the bytes written alone, never the
/// cache's. Two guards, either enough: `Engine`'s entry points go alone once the switch is
/// done, and the cached path refuses a failed engine under its lookup's lock hold
/// (`check_usable`). Mutation that fails it: both removed for the reader's paths (0x11 read).
#[test]
fn reads_after_the_switch_never_come_from_the_given_up_cache() {
    let pair = SimPair::new(MIB + 16 * SEG_64K, 16 * MIB, SEG_64K);
    let (faulty, _gate, e) = engine(&pair);
    e.set_tunable("ram_cache_mib", "1").unwrap();
    let (clean, in_ram) = (3u64, 5u64);
    e.write(clean * BLOCK, &[0x11; BLOCK as usize], false)
        .unwrap();
    push_out_of_ram(&e);
    e.flush().unwrap();
    while e.writeback_step(256).unwrap() > 0 {}
    let mut buf = vec![0u8; BLOCK as usize];
    for _ in 0..2 {
        e.read(clean * BLOCK, &mut buf).unwrap();
    }
    assert!(e.stats().ram_cache_blocks > 0, "{:?}", e.stats());
    e.write(in_ram * BLOCK, &[0x12; BLOCK as usize], false)
        .unwrap();
    fail_the_cache(&e, &faulty);
    for lba in [clean, in_ram] {
        e.write(lba * BLOCK, &[0x22; BLOCK as usize], false)
            .unwrap();
        let newest = |buf: &[u8], how: &str| {
            assert!(
                buf.iter().all(|&b| b == 0x22),
                "{how} of block {lba} after it was written alone read {:#x}..",
                buf[0]
            )
        };
        let mut buf = vec![0u8; BLOCK as usize];
        e.read(lba * BLOCK, &mut buf).unwrap();
        newest(&buf, "a read");
        let mut buf = vec![0u8; BLOCK as usize];
        if e.read_if_cached(lba * BLOCK, &mut buf).unwrap() {
            newest(&buf, "a read served on the reader");
        }
        let mut bufs = [vec![0u8; BLOCK as usize], vec![0u8; BLOCK as usize]];
        let [a, b] = &mut bufs;
        let mut reads = [
            CachedRead::new(lba * BLOCK, a),
            CachedRead::new(clean * BLOCK, b),
        ];
        e.read_batch_if_cached(&mut reads);
        for r in &reads {
            if *r.served.as_ref().unwrap() {
                newest(&r.buf[..], "a batched read");
            }
        }
    }
}

/// Block status after the switch, of a block the cache's zero ranges call zero (a write-zeroes
/// before the failure) and written again alone: it must say data (never "reads as zeros" for a
/// block holding data). Two guards, either enough: `Engine::block_status` answers alone once
/// the switch is done, and the cached walk refuses a failed engine under its lock hold
/// (`status::cached_run`, `check_usable`). Mutation that fails it: both removed (zero).
#[test]
fn block_status_after_the_switch_says_data_where_a_write_alone_landed() {
    let pair = SimPair::new(MIB + 16 * SEG_64K, 16 * MIB, SEG_64K);
    let (faulty, _gate, e) = engine(&pair);
    let lba = 6u64;
    e.write_zeroes(lba * BLOCK, BLOCK, false).unwrap();
    let mut out = Vec::new();
    e.block_status(lba * BLOCK, BLOCK, 4, &mut out).unwrap();
    assert_ne!(out[0].kind, ExtentKind::Data, "zeroed: {out:?}");
    fail_the_cache(&e, &faulty);
    e.write(lba * BLOCK, &[0x22; BLOCK as usize], false)
        .unwrap();
    e.block_status(lba * BLOCK, BLOCK, 4, &mut out).unwrap();
    assert_eq!(out[0].kind, ExtentKind::Data, "written alone: {out:?}");
}
