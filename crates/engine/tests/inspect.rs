//! Offline inspection (`check`, `dump`): what it reports for clean, crashed, damaged and
//! mismatched caches, that it agrees with what an open then recovers, and that it never writes.
//!
//! Segments here are 32 KiB: 8 blocks, so a chunk that fills a segment is 1 metadata block + 7
//! data blocks; a flush seals a shorter chunk and the next one continues in the same segment.

mod common;

use common::*;
use logcache_engine::format::chunk::KIND_DATA;
use logcache_engine::inspect::{check, dump, CheckReport, CopyState, Reject, Severity, WalkStop};
use logcache_engine::io::memory::MemDevice;
use logcache_engine::io::BlockDevice;
use logcache_engine::{Engine, Error, OpenOptions};
use logcache_testkit::rng::Rng;
use logcache_testkit::sim::SimDevice;

const KIB: u64 = 1024;
const SEG: u64 = 32 * KIB;
const CACHE_BYTES: u64 = (1 << 20) + 16 * SEG;
const BACKING_BYTES: u64 = 4 << 20;

fn manual() -> OpenOptions {
    common::manual(2 * SEG)
}

fn pair() -> SimPair {
    SimPair::new(CACHE_BYTES, BACKING_BYTES, SEG)
}

/// Writes blocks `first..first+count`, each filled with `fill`.
fn write_blocks(e: &Engine, first: u64, count: u64, fill: u8) {
    for b in first..first + count {
        e.write(b * 4096, &[fill; 4096], false).unwrap();
    }
}

fn findings(r: &CheckReport, severity: Severity) -> Vec<String> {
    r.findings
        .iter()
        .filter(|f| f.severity == severity)
        .map(|f| f.message.clone())
        .collect()
}

/// Runs `check` and asserts it neither wrote nor synced the cache.
fn check_read_only(cache: &SimDevice, backing: Option<&SimDevice>) -> CheckReport {
    let (writes, flushes) = (cache.write_count(), cache.flush_count());
    let image = cache.read_volatile(0, cache.size_bytes());
    let r = check(cache, backing.map(|b| b as &dyn BlockDevice)).unwrap();
    assert_eq!(cache.write_count(), writes, "check wrote to the cache");
    assert_eq!(cache.flush_count(), flushes, "check synced the cache");
    assert!(cache.read_volatile(0, cache.size_bytes()) == image);
    r
}

#[test]
fn a_cleanly_closed_cache_checks_clean() {
    let p = pair();
    let e = Engine::open(p.cache(), p.backing(), manual()).unwrap();
    write_blocks(&e, 0, 10, 0x11);
    write_blocks(&e, 3, 1, 0x12); // an overwrite: still 10 distinct blocks
    e.write(20 * 4096 + 512, &[0x13; 512], false).unwrap(); // one sector of block 20
    e.flush().unwrap();
    e.close().unwrap();

    let r = check_read_only(&p.cache, Some(&p.backing));
    assert!(r.is_ok(), "{:#?}", r.findings);
    assert!(r.clean);
    assert_eq!(r.count(Severity::Warning), 0, "{:#?}", r.findings);
    // Format writes both copies and each open/close one more: both valid, the newest in use.
    let gens: Vec<u64> = r
        .copies
        .iter()
        .map(|c| match c.state {
            CopyState::Valid { generation, .. } => generation,
            ref other => panic!("copy {}: {other:?}", c.name),
        })
        .collect();
    assert_eq!(r.generation, gens[r.current_copy]);
    assert_eq!(r.generation, gens.iter().copied().max().unwrap());
    assert_eq!(r.layout.segment_size_bytes, SEG);
    assert_eq!(r.layout.blocks_per_segment, 8);
    assert_eq!(r.layout.segment_count, 16);
    assert_eq!(r.layout.exported_size_bytes, BACKING_BYTES - 4096);
    assert!(!r.tunables.is_empty());

    let log = r.log.as_ref().unwrap();
    assert_eq!(log.end.stop, WalkStop::CleanEnd);
    assert!(log.recoverable);
    assert_eq!(log.blocks_live, 11);
    assert_eq!(log.blocks_dirty, 11);
    assert_eq!(
        log.data_entries, 12,
        "every block written plus the overwrite"
    );
    assert_eq!(log.data_blocks_checked, 12);
    assert_eq!(log.data_blocks_bad, 0);
    assert_eq!(log.chunks_discarded, 0);
    assert_eq!(log.chunks_kept, log.chunks);
    let (first, last) = log.seq_range.unwrap();
    assert_eq!(last - first + 1, log.chunks);
    assert_eq!(last, r.checkpoint.end_seq);
    assert!(r.backing.as_ref().unwrap().matches);

    // What check predicted is what an open finds.
    let e = Engine::open(p.cache(), p.backing(), manual()).unwrap();
    let s = e.stats();
    assert_eq!(s.recovery.chunks_replayed, log.chunks_kept);
    assert_eq!(s.recovery.blocks_recovered, log.blocks_live);
    assert_eq!(s.dirty_blocks, log.blocks_dirty);
}

#[test]
fn a_crash_without_close_reports_unclean_and_the_flushed_blocks() {
    let p = pair();
    let e = Engine::open(p.cache(), p.backing(), manual()).unwrap();
    write_blocks(&e, 0, 9, 0x21); // more than a segment's worth
    e.flush().unwrap();
    write_blocks(&e, 40, 3, 0x22); // never flushed: lost with the crash
    e.crash();
    p.cache.crash_lose_all();

    let r = check_read_only(&p.cache, Some(&p.backing));
    assert!(!r.clean);
    assert!(r.is_ok(), "{:#?}", r.findings);
    assert!(
        findings(&r, Severity::Warning)
            .iter()
            .any(|m| m.contains("not closed cleanly")),
        "{:#?}",
        r.findings
    );
    let log = r.log.as_ref().unwrap();
    assert_eq!(log.blocks_live, 9);
    assert_eq!(log.blocks_dirty, 9);
    assert!(log.segments >= 2, "{log:#?}");
    assert!(log.recoverable);
    assert!(matches!(log.end.stop, WalkStop::Rejected(_)), "{log:#?}");

    let e = Engine::open(p.cache(), p.backing(), manual()).unwrap();
    let s = e.stats();
    assert_eq!(s.recovery.chunks_replayed, log.chunks_kept);
    assert_eq!(s.recovery.blocks_recovered, log.blocks_live);
}

/// Offset on the cache device of data block `k` (in entry order) of the first chunk of the log.
fn first_chunk_data_offset(cache: &SimDevice, k: u32) -> (u64, u64) {
    let d = dump(cache, None).unwrap();
    let c = &d.segments[0].chunks[0];
    let lba = c.entries.iter().filter(|e| e.has_block()).nth(k as usize);
    let off = c.offset_bytes + (c.header.meta_block_count as u64 + k as u64) * 4096;
    (off, lba.unwrap().lba)
}

#[test]
fn a_damaged_data_block_is_an_error() {
    let p = pair();
    let e = Engine::open(p.cache(), p.backing(), manual()).unwrap();
    write_blocks(&e, 100, 5, 0x31);
    e.flush().unwrap();
    e.close().unwrap();
    let (off, lba) = first_chunk_data_offset(&p.cache, 2);
    p.cache.corrupt(off + 700, 0x40);

    let r = check_read_only(&p.cache, None);
    assert!(!r.is_ok());
    let errors = findings(&r, Severity::Error);
    assert!(
        errors
            .iter()
            .any(|m| m.contains("checksum") && m.contains(&lba.to_string())),
        "{errors:#?}"
    );
    let log = r.log.as_ref().unwrap();
    assert_eq!(log.data_blocks_bad, 1);
    assert_eq!(log.bad_chunks.len(), 1);
    assert!(!log.bad_chunks[0].discarded, "a clean log has no torn tail");
    assert_eq!(log.bad_chunks[0].bad_blocks[0].lba, lba);
    // Recovery keeps the chunk (its data is checked on read), so the block stays counted.
    assert_eq!(log.blocks_live, 5);
    assert!(log.recoverable);
}

/// A chunk written after the last sync whose data is torn: recovery cuts the log there, and
/// check says so as a warning, agreeing with the open that follows.
#[test]
fn a_torn_unsynced_tail_is_a_warning_that_matches_recovery() {
    let p = pair();
    let e = Engine::open(p.cache(), p.backing(), manual()).unwrap();
    write_blocks(&e, 0, 7, 0x41);
    e.flush().unwrap(); // chunk 1, synced
    write_blocks(&e, 10, 7, 0x42);
    write_blocks(&e, 20, 7, 0x43);
    // Chunks 2 and 3 reach the device, then the sync fails and the process dies.
    p.cache.fail_after_writes(2);
    assert!(e.flush().is_err());
    e.crash();
    p.cache.crash_keep_all();
    p.cache.heal();
    // Tear chunk 2 (segment 2): a sector of its third data block never landed.
    let chunk2 = (1 << 20) + 2 * SEG;
    p.cache.corrupt(chunk2 + 3 * 4096 + 512, 0xFF);

    let r = check_read_only(&p.cache, None);
    assert!(r.is_ok(), "{:#?}", r.findings);
    let log = r.log.as_ref().unwrap();
    assert_eq!(log.chunks, 3, "{log:#?}");
    assert_eq!(log.chunks_kept, 1);
    assert_eq!(log.chunks_discarded, 2);
    assert_eq!(log.blocks_live, 7);
    assert!(log.bad_chunks.iter().all(|b| b.discarded));
    assert!(
        findings(&r, Severity::Warning)
            .iter()
            .any(|m| m.contains("would discard chunks 2..=3")),
        "{:#?}",
        r.findings
    );

    let e = Engine::open(p.cache(), p.backing(), manual()).unwrap();
    let rec = e.stats().recovery;
    assert_eq!(rec.chunks_replayed, log.chunks_kept);
    assert_eq!(rec.chunks_discarded, log.chunks_discarded);
    assert_eq!(rec.blocks_recovered, log.blocks_live);
}

/// A torn chunk header at the end of the log ends the walk with a warning; a damaged
/// superblock copy is a warning too, and the other copy is used.
#[test]
fn a_torn_header_and_a_damaged_superblock_copy_are_warnings() {
    let p = pair();
    let e = Engine::open(p.cache(), p.backing(), manual()).unwrap();
    write_blocks(&e, 0, 7, 0x51);
    e.flush().unwrap(); // chunk 1 fills segment 1
    write_blocks(&e, 10, 2, 0x52);
    e.flush().unwrap(); // chunk 2 starts segment 2
    e.crash();
    p.cache.crash_keep_all();
    // Chunk 2's header fails its checksum (a flipped bit in its first entry).
    p.cache.corrupt((1 << 20) + 2 * SEG + 64, 0x01);
    let before = check_read_only(&p.cache, None);
    let stale = 1 - before.current_copy;
    p.cache.corrupt(stale as u64 * 4096 + 100, 0x01);

    let r = check_read_only(&p.cache, None);
    assert_eq!(r.current_copy, before.current_copy);
    assert!(matches!(r.copies[stale].state, CopyState::Corrupt(_)));
    let log = r.log.as_ref().unwrap();
    assert_eq!(log.chunks, 1);
    assert_eq!(log.end.segment_id, 2);
    assert_eq!(log.end.block, 0);
    assert!(
        matches!(log.end.stop, WalkStop::Rejected(Reject::BadMetadata(_))),
        "{:?}",
        log.end
    );
    let warnings = findings(&r, Severity::Warning);
    assert!(
        warnings.iter().any(|m| m.contains("torn or damaged chunk")),
        "{warnings:#?}"
    );
    assert!(
        warnings.iter().any(|m| m.contains("is damaged")),
        "{warnings:#?}"
    );
    // Chunk 2 was synced (its flush returned), but nothing after it proves that, so recovery
    // opens the cache without it, as check predicts.
    assert!(log.recoverable);
    let e = Engine::open(p.cache(), p.backing(), manual()).unwrap();
    assert_eq!(e.stats().recovery.blocks_recovered, log.blocks_live);
}

/// A damaged header that claims more metadata blocks than any chunk has (its checksum is only
/// checked after the metadata is read) ends the log like any other damage: no panic, in check
/// or in recovery.
#[test]
fn a_header_claiming_too_many_metadata_blocks_is_damage_not_a_panic() {
    let p = pair();
    let e = Engine::open(p.cache(), p.backing(), manual()).unwrap();
    write_blocks(&e, 0, 7, 0x71);
    e.flush().unwrap(); // chunk 1 fills segment 1
    write_blocks(&e, 10, 2, 0x72);
    e.flush().unwrap(); // chunk 2: segment 2, 1 metadata + 2 data blocks
    e.crash();
    p.cache.crash_keep_all();
    // meta_block_count (header byte 50) 1 → 3: still inside the segment, but 3 metadata blocks
    // are more than an 8-block segment's chunks ever have.
    p.cache.corrupt((1 << 20) + 2 * SEG + 50, 0x02);

    let r = check_read_only(&p.cache, None);
    let log = r.log.as_ref().unwrap();
    assert_eq!(log.chunks, 1);
    assert!(
        matches!(log.end.stop, WalkStop::Rejected(Reject::BadHeader(_))),
        "{:?}",
        log.end
    );
    let e = Engine::open(p.cache(), p.backing(), manual()).unwrap();
    assert_eq!(e.stats().recovery.chunks_replayed, 1);
    assert_eq!(e.stats().recovery.blocks_recovered, log.blocks_live);
}

#[test]
fn a_wrong_backing_device_is_an_error() {
    let p = pair();
    let other = pair(); // a second cache with its own backing device and uuid
    let r = check_read_only(&p.cache, Some(&other.backing));
    let b = r.backing.as_ref().unwrap();
    assert!(!b.matches);
    assert!(
        b.problem.as_ref().unwrap().contains("another cache"),
        "{b:?}"
    );
    assert!(!r.is_ok());

    let small = SimDevice::new(BACKING_BYTES / 2);
    let r = check_read_only(&p.cache, Some(&small));
    assert!(!r.backing.as_ref().unwrap().matches);
    assert!(
        findings(&r, Severity::Error)
            .iter()
            .any(|m| m.contains("wrong backing device")),
        "{:#?}",
        r.findings
    );
    // And with the right one, a freshly formatted cache is healthy and empty.
    let r = check_read_only(&p.cache, Some(&p.backing));
    assert!(r.is_ok(), "{:#?}", r.findings);
    assert_eq!(r.log.as_ref().unwrap().chunks, 0);
}

#[test]
fn dump_lists_the_chunks_and_entries_written() {
    let p = pair();
    let e = Engine::open(p.cache(), p.backing(), manual()).unwrap();
    write_blocks(&e, 5, 3, 0x61);
    e.flush().unwrap(); // chunk 1: segment 1, blocks 0..=3
    e.write(50 * 4096 + 3 * 512, &[0x62; 1024], false).unwrap(); // sectors 3 and 4
    write_blocks(&e, 60, 1, 0x63);
    e.flush().unwrap(); // chunk 2: the same segment, from block 4
    e.close().unwrap();

    let (writes, reads_before) = (p.cache.write_count(), p.cache.read_count());
    let d = dump(&p.cache, None).unwrap();
    assert_eq!(p.cache.write_count(), writes, "dump wrote to the cache");
    assert!(p.cache.read_count() > reads_before);
    assert!(d.clean);
    assert_eq!(d.end.stop, WalkStop::CleanEnd);
    assert_eq!(d.segments.len(), 1, "{d:#?}");
    let s = &d.segments[0];
    assert!(s.in_log);
    assert_eq!((s.segment_id, s.slot), (1, 1));
    assert_eq!((s.first_seq(), s.last_seq()), (Some(1), Some(2)));
    assert_eq!(s.chunks.len(), 2);
    let (c1, c2) = (&s.chunks[0], &s.chunks[1]);
    assert_eq!(c1.header.start_block, 0);
    assert_eq!(c1.offset_bytes, (1 << 20) + SEG);
    let lbas: Vec<u64> = c1.entries.iter().map(|e| e.lba).collect();
    assert_eq!(lbas, [5, 6, 7]);
    assert!(c1
        .entries
        .iter()
        .all(|e| e.kind == KIND_DATA && e.dirty_mask == 0xFF && e.valid_mask == 0xFF));
    assert_eq!(c2.header.start_block as u32, c1.header.block_count());
    assert_eq!(c2.header.seq, 2);
    let partial = c2.entries.iter().find(|e| e.lba == 50).unwrap();
    assert_eq!((partial.dirty_mask, partial.valid_mask), (0x18, 0x18));
    assert!(c2.entries.iter().any(|e| e.lba == 60));

    // One segment by id; the same content.
    let one = dump(&p.cache, Some(1)).unwrap();
    assert_eq!(one.segments, d.segments);
    // A segment the log never reached: its slot is scanned and found empty.
    let none = dump(&p.cache, Some(5)).unwrap();
    assert_eq!(none.segments.len(), 1);
    assert!(!none.segments[0].in_log);
    assert!(none.segments[0].chunks.is_empty());
    assert!(none.segments[0]
        .note
        .as_ref()
        .unwrap()
        .contains("not in the log"));
    // Segment 17 shares slot 1 with segment 1: the scan shows segment 1's chunks there.
    let lap = dump(&p.cache, Some(17)).unwrap();
    assert_eq!(lap.segments[0].slot, 1);
    assert_eq!(lap.segments[0].chunks.len(), 2);
    assert!(!lap.segments[0].in_log);
    assert!(matches!(
        dump(&p.cache, Some(0)),
        Err(Error::InvalidArgument(_))
    ));
}

/// Random writes (partial blocks too), flushes and unsynced chunk writes, then a power loss
/// that keeps, loses or tears each unsynced write: whatever state results, check predicts
/// exactly what the next open recovers. Several crash cycles per case, so later walks cross
/// cuts, epochs and stale tails.
#[test]
fn check_predicts_recovery_after_random_crashes() {
    for_each_seed(
        "inspect",
        cases_from_env("LOGCACHE_INSPECT_CASES", 60),
        |seed| {
            let mut rng = Rng::new(seed);
            let p = pair();
            for cycle in 0..4 {
                let e = Engine::open(p.cache(), p.backing(), manual()).unwrap();
                for _ in 0..rng.below(40) {
                    match rng.below(10) {
                        0..=7 => {
                            let block = rng.below(48);
                            let first = rng.below(8);
                            let sectors = rng.range(1, 8 - first + 1);
                            let data = vec![rng.below(256) as u8; sectors as usize * 512];
                            e.write(block * 4096 + first * 512, &data, false).unwrap();
                        }
                        8 => e.flush().unwrap(),
                        _ => e.run_flusher().unwrap(), // chunk writes with no sync after them
                    }
                }
                e.crash();
                p.cache.crash(&mut rng);

                let r = check_read_only(&p.cache, Some(&p.backing));
                assert!(r.is_ok(), "cycle {cycle}: {:#?}", r.findings);
                let log = r.log.as_ref().unwrap();
                let e = Engine::open(p.cache(), p.backing(), manual())
                    .unwrap_or_else(|err| panic!("cycle {cycle}: open failed: {err}"));
                assert!(log.recoverable, "cycle {cycle}");
                let s = e.stats();
                let got = (
                    s.recovery.chunks_replayed,
                    s.recovery.chunks_discarded,
                    s.recovery.blocks_recovered,
                    s.dirty_blocks,
                );
                let predicted = (
                    log.chunks_kept,
                    log.chunks_discarded,
                    log.blocks_live,
                    log.blocks_dirty,
                );
                assert_eq!(
                    got, predicted,
                    "cycle {cycle}: (chunks kept, discarded, blocks, dirty)"
                );
                e.crash();
            }
        },
    );
}

#[test]
fn an_unformatted_device_is_not_formatted() {
    let dev = MemDevice::new(4 << 20);
    assert!(matches!(check(&dev, None), Err(Error::NotFormatted(_))));
    assert!(matches!(dump(&dev, None), Err(Error::NotFormatted(_))));
    let tiny = MemDevice::new(4096);
    assert!(matches!(check(&tiny, None), Err(Error::NotFormatted(_))));
    // Both copies damaged: formatted, but unusable.
    let p = pair();
    p.cache.corrupt(100, 0x01);
    p.cache.corrupt(4096 + 100, 0x01);
    assert!(matches!(check(&p.cache, None), Err(Error::Corruption(_))));
}
