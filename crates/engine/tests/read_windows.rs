//! Windows between a read and the threads that change what it reads (s40 concurrency review,
//! docs/RELIABILITY.md): a read planned under the state lock whose segment dies and whose slot
//! the ring wants again while the read is still at the cache device; the RAM cache resized and
//! turned off and on while small, batched and large reads use it and writes replace its
//! blocks. Each test opens its window on purpose (testkit's gate holds the IO) or runs the
//! threads against one another many times, and checks what every read returned; every wait is
//! bounded, so a hang fails the test instead of stalling CI.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use common::wait::{eventually, HANG};
use common::*;
use logcache_engine::{CachedRead, Engine, OpenOptions};
use logcache_testkit::fault::OpKind;
use logcache_testkit::gate::GateDevice;
use logcache_testkit::rng::Rng;

const KIB: u64 = 1024;
const MIB: u64 = 1 << 20;
const BLOCK: u64 = 4096;
const SEG_64K: u64 = 64 * KIB;
/// How many times `the_ram_cache_resized_under_reads_and_writes_serves_only_current_blocks`
/// resizes the RAM cache.
const RESIZES: usize = 300;

/// Block `lba`'s content at version `v`: both written into it (and a fill derived from them),
/// so a copy of another block, another version or a torn one is told apart.
fn content(lba: u64, v: u64) -> Vec<u8> {
    let mut b = vec![(lba as u8) ^ (v as u8).wrapping_mul(37) ^ 0x5a; BLOCK as usize];
    b[..8].copy_from_slice(&lba.to_le_bytes());
    b[8..16].copy_from_slice(&v.to_le_bytes());
    b
}

/// The (lba, version) a block read back says it holds, if it is whole: its stamp and its fill
/// agree. Version 0 is the formatted backing device's zeros.
fn decode(block: &[u8]) -> Option<(u64, u64)> {
    if block.iter().all(|&x| x == 0) {
        return Some((u64::MAX, 0));
    }
    let lba = u64::from_le_bytes(block[..8].try_into().unwrap());
    let v = u64::from_le_bytes(block[8..16].try_into().unwrap());
    (block == content(lba, v).as_slice()).then_some((lba, v))
}

/// Writes blocks `lba..lba + count` at version `v` in one request.
fn write_run(e: &Engine, lba: u64, count: u64, v: u64) {
    let mut data = Vec::with_capacity((count * BLOCK) as usize);
    for b in lba..lba + count {
        data.extend_from_slice(&content(b, v));
    }
    e.write(lba * BLOCK, &data, false).expect("write");
}

/// A read planned on the cache device keeps its segment pinned until its IO is done: with the
/// read held at the device, its block overwritten (the segment dies) and the ring written round
/// several times, the head stops at the pinned segment (writers wait for room rather than
/// reuse its slot), the read returns the data it planned, and once it ends the writers go on.
/// The guard is `State::reclaimable_head`'s `pinned(slot)` (reclaim.rs); without it the slot
/// is reused under the read, which then reads another block's bytes there (a checksum error).
#[test]
fn a_read_at_the_cache_device_keeps_its_segment_from_reuse() {
    let segments = 16u64;
    let cache_bytes = MIB + segments * SEG_64K;
    let pair = SimPair::new(cache_bytes, 16 * MIB, SEG_64K);
    let gate = Arc::new(GateDevice::new(pair.cache()));
    let opts = OpenOptions {
        ram_buffer_bytes: 4 * SEG_64K,
        seal_interval_ms: Some(0),
        // Every read of a cached block goes to the device (nothing served from RAM).
        ram_cache_bytes: Some(0),
        ..OpenOptions::default()
    };
    let e = Engine::open(gate.clone(), pair.backing(), opts).unwrap();
    // No writeback: nothing else reads the cache device, and no block turns clean. Sorted
    // order: an overwritten block dies at once (consistent order keeps an older epoch's copy
    // as a shadow for writeback, which would keep the segment alive on its own).
    e.set_tunable("writeback_idle_ms", "0").unwrap();
    e.set_tunable("writeback_threshold_percent", "100").unwrap();
    e.set_tunable("writeback_order", "sorted").unwrap();

    // The block the read wants: on the cache device, its RAM buffer long reused.
    write_run(&e, 0, 8, 1);
    e.flush().unwrap();
    for v in 2..10 {
        write_run(&e, 100, 15, v);
        e.flush().unwrap();
    }
    let image = pair.cache.read_volatile(0, cache_bytes);
    let wanted = content(0, 1);
    let at = image
        .chunks(BLOCK as usize)
        .position(|c| c == wanted.as_slice())
        .expect("block 0 is on the cache device") as u64
        * BLOCK;
    gate.hold_range(OpKind::Read, at, BLOCK);
    let reader = {
        let e = e.clone();
        std::thread::spawn(move || {
            let mut out = vec![0u8; BLOCK as usize];
            e.read(0, &mut out).map(|()| out)
        })
    };
    assert!(
        gate.wait_held(OpKind::Read, 1, HANG),
        "the read never reached the cache device"
    );
    assert!(e.segment_pins() > 0, "the held read pins nothing");

    // Its segment dies (block 0 and its neighbours written again), then the ring is written
    // round three times: its slot is wanted again.
    let (head_before, waits_before) = {
        let s = e.stats();
        (s.head_segment_id, s.counters.write_waits)
    };
    let (done_tx, done_rx) = mpsc::channel();
    let writer = {
        let e = e.clone();
        std::thread::spawn(move || {
            write_run(&e, 0, 8, 20);
            e.flush().unwrap();
            for v in 21..21 + 3 * segments {
                write_run(&e, 100, 15, v);
                e.flush().unwrap();
            }
            let _ = done_tx.send(());
        })
    };
    // Wait until the writer either finished (the slot was reused under the read) or waits for
    // room with the ring full and the head still at the read's segment.
    let mut writer_done = false;
    let decided = eventually(|| {
        writer_done |= done_rx.try_recv().is_ok();
        let s = e.stats();
        writer_done
            || (s.head_segment_id == head_before
                && s.segments_free == 0
                && s.counters.write_waits > waits_before)
    });
    assert!(decided, "the writer neither finished nor waited for room");
    assert_eq!(gate.passed(OpKind::Read), 0, "the read went through early");

    gate.release(OpKind::Read);
    let got = reader.join().unwrap();
    assert!(
        got.as_ref().is_ok_and(|b| *b == wanted),
        "the held read returned {:?}, not the block it planned (its slot reused: {writer_done})",
        got.map(|b| decode(&b))
    );
    assert!(
        !writer_done,
        "the ring was written round past a segment a read still had pinned"
    );
    assert!(
        eventually(|| done_rx.try_recv().is_ok()),
        "the writers stayed stuck after the read ended"
    );
    writer.join().unwrap();
    assert_eq!(e.segment_pins(), 0);
    let mut out = vec![0u8; (8 * BLOCK) as usize];
    e.read(0, &mut out).unwrap();
    for (i, block) in out.chunks(BLOCK as usize).enumerate() {
        assert_eq!(decode(block), Some((i as u64, 20)), "block {i}");
    }
    e.close().unwrap();
}

/// What the reads of `the_ram_cache_resized_under_reads_and_writes_serves_only_current_blocks`
/// may return for each block: at least the version
/// acknowledged before the read began, at most the newest one begun before it ended.
struct Versions {
    acked: Vec<AtomicU64>,
    started: Vec<AtomicU64>,
}

impl Versions {
    fn new(blocks: u64, v: u64) -> Versions {
        Versions {
            acked: (0..blocks).map(|_| AtomicU64::new(v)).collect(),
            started: (0..blocks).map(|_| AtomicU64::new(v)).collect(),
        }
    }

    fn floor(&self, lba: u64, count: u64) -> Vec<u64> {
        (lba..lba + count)
            .map(|b| self.acked[b as usize].load(Ordering::Acquire))
            .collect()
    }

    /// Checks a read of `lba..` that returned `got`, `floor` taken before it began.
    fn check(&self, what: &str, lba: u64, floor: &[u64], got: &[u8]) {
        for (i, block) in got.chunks(BLOCK as usize).enumerate() {
            let b = lba + i as u64;
            let ceiling = self.started[b as usize].load(Ordering::Acquire);
            let seen = decode(block);
            assert!(
                seen.is_some_and(|(l, v)| l == b && v >= floor[i] && v <= ceiling),
                "{what} of block {b}: read {seen:?}, wanted a version in {}..={ceiling}",
                floor[i]
            );
        }
    }
}

/// The RAM cache resized, turned off and on again (`ram_cache_mib`) over and over while two
/// threads read (small reads, batches of them, cached-only reads and large reads of a few
/// extents, so their runs enter on a second touch and are served through
/// `HotTier::get_many`) and a writer keeps replacing blocks (the ring wraps: slots are
/// reused, keys change). Every block read is whole, its own, and no older than the version
/// acknowledged before the read began, and no read fails. The guards (hot.rs): each shard is
/// swapped under its own lock, so a lookup sees the old shard or the new one whole, and every
/// use of a shard (`get`, `get_many`, `store`, `second_touch`) checks under that lock that it
/// has room (a read that saw the tier on before a resize to 0 reaches a shard with none).
/// Without `get_many`'s check, the batch divides by a shard's zero sets and the reader panics.
#[test]
fn the_ram_cache_resized_under_reads_and_writes_serves_only_current_blocks() {
    let blocks = 2048u64;
    let pair = SimPair::new(MIB + 24 * MIB, 32 * MIB, MIB);
    let opts = OpenOptions {
        ram_buffer_bytes: 4 * MIB,
        seal_interval_ms: Some(0),
        ram_cache_bytes: Some(2 * MIB),
        ..OpenOptions::default()
    };
    let e = Engine::open(pair.cache(), pair.backing(), opts).unwrap();
    for lba in (0..blocks).step_by(256) {
        write_run(&e, lba, 256, 1);
    }
    e.flush().unwrap();
    let versions = Arc::new(Versions::new(blocks, 1));
    let readers_done = Arc::new(AtomicBool::new(false));
    let next_version = Arc::new(AtomicU64::new(2));

    let writer = {
        let (e, versions, done) = (e.clone(), versions.clone(), readers_done.clone());
        let next_version = next_version.clone();
        std::thread::spawn(move || {
            let mut rng = Rng::new(0x5ee_d001);
            let mut writes = 0u64;
            // Most writes in the first half, where the large reads' extents are.
            while !done.load(Ordering::Acquire) && writes < 20_000 {
                let count = rng.range(1, 5);
                let lba = if rng.chance(3, 4) {
                    rng.below(blocks / 2 - count)
                } else {
                    rng.below(blocks - count)
                };
                let v = next_version.fetch_add(1, Ordering::AcqRel);
                for b in lba..lba + count {
                    versions.started[b as usize].fetch_max(v, Ordering::AcqRel);
                }
                write_run(&e, lba, count, v);
                for b in lba..lba + count {
                    versions.acked[b as usize].fetch_max(v, Ordering::AcqRel);
                }
                writes += 1;
                if writes.is_multiple_of(64) {
                    e.flush().unwrap();
                }
            }
            writes
        })
    };
    let resizes_done = Arc::new(AtomicBool::new(false));
    let resizer = {
        let (e, done) = (e.clone(), resizes_done.clone());
        std::thread::spawn(move || {
            // Off every other time: a read's batch may meet a shard turned off under it.
            let sizes = ["1", "0", "2", "0", "3", "1", "0", "2"];
            for i in 0..RESIZES {
                e.set_tunable("ram_cache_mib", sizes[i % sizes.len()])
                    .unwrap();
                // Long enough for reads to fill the new tier between two resizes.
                std::thread::sleep(Duration::from_micros(300));
            }
            done.store(true, Ordering::Release);
        })
    };
    let readers: Vec<_> = (0..2u64)
        .map(|n| {
            let (e, versions) = (e.clone(), versions.clone());
            let resizes_done = resizes_done.clone();
            std::thread::spawn(move || {
                let mut rng = Rng::new(0xbead_0000 + n);
                let mut buf = vec![0u8; MIB as usize];
                // At least 1,500 reads, and on until every resize is done.
                for i in 0..50_000 {
                    if i >= 1_500 && resizes_done.load(Ordering::Acquire) {
                        break;
                    }
                    match rng.below(8) {
                        // A large read of one of four 1 MiB extents: served run by run from
                        // the RAM cache on its later touches.
                        0..=2 => {
                            let lba = rng.below(4) * 256;
                            let floor = versions.floor(lba, 256);
                            e.read(lba * BLOCK, &mut buf).unwrap();
                            versions.check("large read", lba, &floor, &buf);
                        }
                        // Small reads: block by block from the RAM cache.
                        3..=4 => {
                            let count = rng.range(1, 17);
                            let lba = rng.below(blocks / 2 - count);
                            let out = &mut buf[..(count * BLOCK) as usize];
                            let floor = versions.floor(lba, count);
                            e.read(lba * BLOCK, out).unwrap();
                            versions.check("small read", lba, &floor, out);
                        }
                        // A worker's batch of small reads, those the cache holds.
                        5..=6 => {
                            let mut asked = Vec::new();
                            let mut rest = &mut buf[..];
                            let mut reads = Vec::new();
                            for _ in 0..4 {
                                let count = rng.range(1, 5);
                                let lba = rng.below(blocks / 2 - count);
                                let (out, tail) = std::mem::take(&mut rest)
                                    .split_at_mut((count * BLOCK) as usize);
                                rest = tail;
                                asked.push((lba, versions.floor(lba, count)));
                                reads.push(CachedRead::new(lba * BLOCK, out));
                            }
                            e.read_batch_if_cached(&mut reads);
                            for (read, (lba, floor)) in reads.iter().zip(&asked) {
                                match &read.served {
                                    Ok(true) => {
                                        versions.check("batched read", *lba, floor, read.buf)
                                    }
                                    Ok(false) => {}
                                    Err(err) => panic!("batched read of block {lba}: {err}"),
                                }
                            }
                        }
                        // The reader's cached-only read.
                        _ => {
                            let lba = rng.below(blocks / 2 - 32);
                            let out = &mut buf[..(32 * BLOCK) as usize];
                            let floor = versions.floor(lba, 32);
                            if e.read_if_cached(lba * BLOCK, out).unwrap() {
                                versions.check("cached-only read", lba, &floor, out);
                            }
                        }
                    }
                }
            })
        })
        .collect();
    for reader in readers {
        reader.join().expect("a reader failed");
    }
    readers_done.store(true, Ordering::Release);
    let writes = writer.join().expect("the writer failed");
    resizer.join().expect("the resizer failed");
    assert!(
        resizes_done.load(Ordering::Acquire),
        "the reads ended before the resizes did"
    );
    let stats = e.stats();
    let c = &stats.counters;
    // The case was made: the tier was resized under reads it served, small and large, while
    // writes replaced blocks.
    assert!(writes >= 200, "{writes} writes");
    assert!(
        c.read_hits_ram_cache > c.read_hits_ram_cache_large && c.read_hits_ram_cache_large > 0,
        "RAM cache hits: {} in all, {} of large reads",
        c.read_hits_ram_cache,
        c.read_hits_ram_cache_large
    );
    e.close().unwrap();
}

/// Writeback's reads are reads planned under the state lock too: with a batch's read of the
/// cache device held, its blocks overwritten (the segment dies) and the ring written round
/// three times, the head stops at the batch's segment (writers wait for room), and once the
/// read goes through, writeback finishes with what it read (verified), the writers go on and
/// the engine stays healthy. The guard is the pin `writeback::batch::collect` takes on each
/// segment of a batch, which `reclaimable_head` honours; without it the ring is written round
/// past the batch's segment while its read is held (its slot reused under it; only dead
/// blocks were there, and the drain still succeeded).
#[test]
fn a_writeback_read_keeps_its_segment_from_reuse() {
    let segments = 16u64;
    let cache_bytes = MIB + segments * SEG_64K;
    let pair = SimPair::new(cache_bytes, 16 * MIB, SEG_64K);
    let gate = Arc::new(GateDevice::new(pair.cache()));
    let opts = OpenOptions {
        ram_buffer_bytes: 4 * SEG_64K,
        seal_interval_ms: Some(0),
        ram_cache_bytes: Some(0),
        ..OpenOptions::default()
    };
    let e = Engine::open(gate.clone(), pair.backing(), opts).unwrap();
    // Writeback only when the test drains; sorted order, so overwritten blocks die at once.
    e.set_tunable("writeback_idle_ms", "0").unwrap();
    e.set_tunable("writeback_threshold_percent", "100").unwrap();
    e.set_tunable("writeback_order", "sorted").unwrap();
    write_run(&e, 0, 8, 1);
    e.flush().unwrap();
    for v in 2..10 {
        write_run(&e, 100, 15, v);
        e.flush().unwrap();
    }
    let image = pair.cache.read_volatile(0, cache_bytes);
    let at = image
        .chunks(BLOCK as usize)
        .position(|c| c == content(0, 1).as_slice())
        .expect("block 0 is on the cache device") as u64
        * BLOCK;
    gate.hold_range(OpKind::Read, at, BLOCK);
    let drainer = {
        let e = e.clone();
        std::thread::spawn(move || e.drain(|_| {}))
    };
    assert!(
        gate.wait_held(OpKind::Read, 1, HANG),
        "writeback never read block 0 from the cache device"
    );
    assert!(e.segment_pins() > 0, "the held writeback read pins nothing");

    let (head_before, waits_before) = {
        let s = e.stats();
        (s.head_segment_id, s.counters.write_waits)
    };
    let (done_tx, done_rx) = mpsc::channel();
    let writer = {
        let e = e.clone();
        std::thread::spawn(move || {
            write_run(&e, 0, 8, 20);
            e.flush().unwrap();
            for v in 21..21 + 3 * segments {
                write_run(&e, 100, 15, v);
                e.flush().unwrap();
            }
            let _ = done_tx.send(());
        })
    };
    let mut writer_done = false;
    let decided = eventually(|| {
        writer_done |= done_rx.try_recv().is_ok();
        let s = e.stats();
        writer_done
            || (s.head_segment_id == head_before
                && s.segments_free == 0
                && s.counters.write_waits > waits_before)
    });
    assert!(decided, "the writer neither finished nor waited for room");
    gate.release(OpKind::Read);
    let drained = drainer.join().unwrap();
    let failure = e.stats().writeback_error;
    assert!(
        drained.is_ok() && failure.is_none(),
        "writeback after its held read: {drained:?}, {failure:?} (its slot reused: {writer_done})"
    );
    assert!(
        !writer_done,
        "the ring was written round past a segment a writeback batch still had pinned"
    );
    assert!(
        eventually(|| done_rx.try_recv().is_ok()),
        "the writers stayed stuck after writeback's read ended"
    );
    writer.join().unwrap();
    e.drain(|_| {}).unwrap();
    assert_eq!(e.segment_pins(), 0);
    let mut out = vec![0u8; (8 * BLOCK) as usize];
    e.read(0, &mut out).unwrap();
    for (i, block) in out.chunks(BLOCK as usize).enumerate() {
        assert_eq!(decode(block), Some((i as u64, 20)), "block {i}");
    }
    // What the backing device holds is the newest data too (every block drained).
    let backing = pair.backing.read_volatile(0, 8 * BLOCK);
    for (i, block) in backing.chunks(BLOCK as usize).enumerate() {
        assert_eq!(decode(block), Some((i as u64, 20)), "backing block {i}");
    }
    e.close().unwrap();
}
