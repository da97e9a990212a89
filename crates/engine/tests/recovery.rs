//! Recovery scenarios forged byte by byte: each test builds one on-disk state that a crash can
//! produce and checks what recovery makes of it.
//!
//! Segments here are 32 KiB: 8 blocks, so a full chunk is 1 metadata block + 7 data blocks and
//! fills its segment. Block `b` of segment slot `s` is at 1 MiB + s * 32 KiB + b * 4 KiB.

mod common;

use common::*;
use logcache_engine::{Engine, OpenOptions};

const KIB: u64 = 1024;
const SEG: u64 = 32 * KIB;

fn manual() -> OpenOptions {
    common::manual(2 * SEG)
}

/// Writes blocks `first..first+count`, each filled with `fill`.
fn write_blocks(e: &Engine, first: u64, count: u64, fill: u8) {
    for b in first..first + count {
        e.write(b * 4096, &[fill; 4096], false).unwrap();
    }
}

fn read_block(e: &Engine, b: u64) -> Vec<u8> {
    let mut buf = vec![0u8; 4096];
    e.read(b * 4096, &mut buf).unwrap();
    buf
}

fn slot_offset(cache_bytes: u64, segment_id: u64) -> u64 {
    let slots = (cache_bytes - (1 << 20)) / SEG;
    (1 << 20) + (segment_id % slots) * SEG
}

/// A tail discarded by one recovery must never come back in a later one.
///
/// ```text
/// session 1: [seg1: chunk1 X1 synced] [seg2: chunk2 X2, torn] [seg3: chunk3 X3, intact]
/// recovery 1 keeps chunk 1 only (chunk 2 is torn, so 3 goes too)
/// session 2: [seg2: chunk2' Y synced]            seg3 still holds the stale chunk 3
/// recovery 2 must stop at chunk 2': chunk 3 was written by session 1 after its cut
/// ```
#[test]
fn a_discarded_tail_stays_discarded() {
    let cache_bytes = (1 << 20) + 16 * SEG;
    let pair = SimPair::new(cache_bytes, 4 << 20, SEG);
    let e = Engine::open(pair.cache(), pair.backing(), manual()).unwrap();
    write_blocks(&e, 0, 7, 0x11);
    e.flush().unwrap(); // chunk 1 → segment 1, synced
                        // Chunks 2 and 3 reach the device, but the sync after them fails: the process dies there.
    write_blocks(&e, 10, 7, 0x22);
    write_blocks(&e, 20, 7, 0x33);
    pair.cache.fail_after_writes(2);
    assert!(e.flush().is_err());
    e.crash();
    pair.cache.crash_keep_all();
    // Tear chunk 2: one sector of its third data block never made it.
    pair.cache
        .corrupt(slot_offset(cache_bytes, 2) + 3 * 4096 + 512, 0xFF);

    let e = Engine::open(pair.cache(), pair.backing(), manual()).unwrap();
    // Reads below must not add chunks of promoted blocks to the log this test counts.
    e.set_tunable("read_cache", "off").unwrap();
    let r = e.stats().recovery;
    assert_eq!(r.chunks_replayed, 1, "{r:?}");
    assert_eq!(r.chunks_discarded, 2, "{r:?}");
    assert_eq!(
        read_block(&e, 20),
        vec![0u8; 4096],
        "chunk 3 went with the torn chunk 2"
    );
    write_blocks(&e, 30, 7, 0x44);
    e.flush().unwrap(); // chunk 2' → segment 2, synced; segment 3 still holds stale chunk 3
    e.crash();
    pair.cache.crash_keep_all();

    let e = Engine::open(pair.cache(), pair.backing(), manual()).unwrap();
    let r = e.stats().recovery;
    assert_eq!(r.chunks_replayed, 2, "{r:?}");
    assert_eq!(read_block(&e, 30), vec![0x44; 4096]);
    assert_eq!(read_block(&e, 0), vec![0x11; 4096]);
    assert_eq!(
        read_block(&e, 20),
        vec![0u8; 4096],
        "a chunk discarded by the previous recovery came back"
    );
}

/// dm-writeboost's hazard: after the ring wraps, a torn write whose header never reached the
/// device leaves the previous lap's (valid) header in the slot. Recovery must keep every valid
/// segment before it, including FUA-acknowledged data.
///
/// Every chunk here is 7 blocks written together, so each fills a whole segment.
#[test]
fn a_torn_header_after_the_ring_wraps_loses_only_the_tail() {
    let cache_bytes = (1 << 20) + 6 * SEG; // 6 slots
    let pair = SimPair::new(cache_bytes, 4 << 20, SEG);
    let e = Engine::open(pair.cache(), pair.backing(), manual()).unwrap();
    // Overwrite the same 7 blocks lap after lap: old segments die and are reclaimed, and the
    // ring wraps several times.
    for lap in 0..20u8 {
        write_blocks(&e, 0, 7, lap);
        e.flush().unwrap();
    }
    // 7 blocks whose last write is FUA: durable on return.
    write_blocks(&e, 100, 6, 0xF0);
    e.write(106 * 4096, &[0xF0; 4096], true).unwrap();
    assert!(e.stats().head_segment_id > 6, "the ring has wrapped");
    let before = pair.cache.read_volatile(0, cache_bytes);
    // The next chunk reaches the device, then the sync fails and the process dies.
    write_blocks(&e, 200, 7, 0xEE);
    pair.cache.fail_after_writes(1);
    assert!(e.flush().is_err());
    e.crash();
    pair.cache.crash_keep_all();
    // Its header sector did not land: the slot still shows the previous lap's header there.
    let slot = (0..6u64)
        .find(|s| pair.cache.read_volatile((1 << 20) + s * SEG + 4096, 4096) == vec![0xEE; 4096])
        .expect("the last chunk is on the device");
    let header = (1 << 20) + slot * SEG;
    pair.cache
        .write_raw(header, &before[header as usize..header as usize + 512]);

    let e = Engine::open(pair.cache(), pair.backing(), manual()).unwrap();
    for b in 100..107 {
        assert_eq!(read_block(&e, b), vec![0xF0; 4096], "FUA data lost");
    }
    for b in 0..7 {
        assert_eq!(read_block(&e, b), vec![19u8; 4096], "flushed data lost");
    }
    assert_eq!(
        read_block(&e, 200),
        vec![0u8; 4096],
        "the torn chunk is gone"
    );
    assert_eq!(
        e.stats().recovery.chunks_discarded,
        0,
        "the walk ends at the stale header"
    );
}

/// Opening a cache reads metadata, not data: after a clean close none, after a crash only the
/// unsynced tail.
#[test]
fn recovery_does_not_read_every_data_block() {
    let cache_bytes = (1 << 20) + 64 * SEG;
    let pair = SimPair::new(cache_bytes, 8 << 20, SEG);
    let e = Engine::open(pair.cache(), pair.backing(), manual()).unwrap();
    for b in 0..200 {
        e.write(b * 4096, &[b as u8; 4096], false).unwrap();
    }
    e.close().unwrap();
    let e = Engine::open(pair.cache(), pair.backing(), manual()).unwrap();
    let r = e.stats().recovery;
    assert!(r.clean);
    assert_eq!(r.data_bytes_read, 0, "{r:?}");
    assert!(r.chunks_replayed >= 28, "{r:?}");
    assert!(
        r.metadata_bytes_read <= r.chunks_replayed * 4096 * 2,
        "{r:?}"
    );
    e.flush().unwrap();
    // A crash after a flush: every chunk is covered by a sync, nothing needs data reads.
    e.crash();
    pair.cache.crash_lose_all();
    let e = Engine::open(pair.cache(), pair.backing(), manual()).unwrap();
    let r = e.stats().recovery;
    assert!(!r.clean);
    assert!(r.data_bytes_read <= 2 * SEG, "{r:?}");
    for b in 0..200 {
        assert_eq!(read_block(&e, b), vec![b as u8; 4096]);
    }
}
