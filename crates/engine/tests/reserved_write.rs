//! Reserved writes (`Engine::reserve_write`): a large write's blocks taken before its payload
//! arrives, filled by the caller, then published. What must hold: the data reads back and
//! survives a flush and reopen (including blocks in chunks sealed while reserved, whose
//! entries are patched in); a reservation dropped unfilled leaves nothing visible, before and
//! after a reopen; a flush while a reservation is open neither waits for it nor lets it
//! publish (it hands its data back for an ordinary write); a write of the same blocks meanwhile
//! wins over a later commit only by being redone after it, in RAM and on the device alike.

use std::sync::Arc;

use logcache_engine::io::memory::MemDevice;
use logcache_engine::io::BlockDevice;
use logcache_engine::{format_cache, Engine, FormatOptions, OpenOptions};

const MIB: u64 = 1 << 20;

fn devices() -> (Arc<dyn BlockDevice>, Arc<dyn BlockDevice>) {
    let cache: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(32 * MIB));
    let backing: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(64 * MIB));
    // 1 MiB segments (the default): a 1 MiB write spans two chunks, so one is sealed while
    // reserved.
    format_cache(&*cache, &*backing, &FormatOptions::default()).unwrap();
    (cache, backing)
}

fn options(manual: bool) -> OpenOptions {
    OpenOptions {
        ram_buffer_bytes: 8 * MIB,
        manual_flusher: manual,
        ..OpenOptions::default()
    }
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_add((i / 4096) as u8).wrapping_mul(31) ^ (i as u8))
        .collect()
}

fn fill(r: &mut logcache_engine::WriteReservation, data: &[u8]) {
    let mut at = 0;
    for i in 0..r.piece_count() {
        let piece = r.piece(i);
        piece.copy_from_slice(&data[at..at + piece.len()]);
        at += piece.len();
    }
    assert_eq!(at, data.len());
}

fn read(e: &Engine, offset: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    e.read(offset, &mut out).unwrap();
    out
}

#[test]
fn a_reserved_write_reads_back_and_survives_reopen_across_chunks() {
    for manual in [true, false] {
        let (cache, backing) = devices();
        let e = Engine::open(cache.clone(), backing.clone(), options(manual)).unwrap();
        // A small write first, so the 1 MiB ones straddle segment and chunk boundaries.
        e.write(0, &pattern(9, 12288), false).unwrap();
        let mut written = Vec::new();
        let mut redone = 0;
        for k in 0..6u64 {
            let offset = MIB + k * MIB;
            let data = pattern(k as u8, MIB as usize);
            let mut r = e.reserve_write(offset, MIB).unwrap().expect("room");
            assert!(r.piece_count() >= 2, "1 MiB spans chunks");
            fill(&mut r, &data);
            let mut redo = Vec::new();
            if !r.commit(&mut redo) {
                // Nothing races it in manual mode. With the background threads, writeback
                // may ask for a sync (dirty blocks, none durable yet) while the payload is
                // being filled, which cancels the reservation (seen at load 20): the data
                // comes back for an ordinary write, as the contract says.
                assert!(!manual, "nothing raced it in manual mode");
                assert_eq!(redo, data, "the redo holds the write's data");
                e.write(offset, &redo, false).unwrap();
                redone += 1;
            }
            assert_eq!(read(&e, offset, MIB as usize), data);
            written.push((offset, data));
        }
        let c = e.stats().counters;
        // A redone reservation is written the ordinary way: not counted as reserved.
        assert_eq!(c.writes_reserved, 6 - redone);
        assert_eq!(c.reserved_writes_redone, redone);
        e.flush().unwrap();
        drop(e);
        // Not closed: recovery replays the log, entries patched after their seal included.
        let e = Engine::open(cache.clone(), backing.clone(), options(manual)).unwrap();
        assert!(!e.stats().recovery.clean);
        for (offset, data) in &written {
            assert_eq!(&read(&e, *offset, MIB as usize), data, "manual {manual}");
        }
        assert_eq!(read(&e, 0, 12288), pattern(9, 12288));
        e.close().unwrap();
    }
}

#[test]
fn a_reservation_dropped_unfilled_leaves_nothing_visible() {
    for manual in [true, false] {
        let (cache, backing) = devices();
        let e = Engine::open(cache.clone(), backing.clone(), options(manual)).unwrap();
        let old = pattern(1, MIB as usize);
        e.write(2 * MIB, &old, false).unwrap();
        {
            let mut r = e.reserve_write(2 * MIB, MIB).unwrap().expect("room");
            // Half the payload arrives, then the connection closes.
            let half = pattern(2, r.piece(0).len());
            r.piece(0).copy_from_slice(&half);
        }
        assert_eq!(read(&e, 2 * MIB, MIB as usize), old);
        // The log goes on past the holes.
        e.write(5 * MIB, &pattern(3, 8192), false).unwrap();
        e.flush().unwrap();
        assert_eq!(read(&e, 2 * MIB, MIB as usize), old);
        drop(e);
        let e = Engine::open(cache.clone(), backing.clone(), options(manual)).unwrap();
        assert_eq!(read(&e, 2 * MIB, MIB as usize), old, "manual {manual}");
        assert_eq!(read(&e, 5 * MIB, 8192), pattern(3, 8192));
        e.close().unwrap();
    }
}

#[test]
fn a_flush_does_not_wait_for_an_open_reservation_which_then_hands_its_data_back() {
    for manual in [true, false] {
        let (cache, backing) = devices();
        let e = Engine::open(cache.clone(), backing.clone(), options(manual)).unwrap();
        e.write(0, &pattern(4, 4096), false).unwrap();
        let data = pattern(5, MIB as usize);
        let mut r = e.reserve_write(MIB, MIB).unwrap().expect("room");
        // Flushed while the payload is still arriving: returns (it need not cover a write
        // not yet acknowledged), and the write acknowledged before it is durable.
        e.flush().unwrap();
        fill(&mut r, &data);
        let mut redo = Vec::new();
        assert!(
            !r.commit(&mut redo),
            "a flush came between reserve and commit"
        );
        assert_eq!(redo, data);
        e.write(MIB, &redo, false).unwrap();
        assert_eq!(read(&e, MIB, MIB as usize), data);
        assert_eq!(e.stats().counters.reserved_writes_redone, 1);
        e.flush().unwrap();
        drop(e);
        let e = Engine::open(cache.clone(), backing.clone(), options(manual)).unwrap();
        assert_eq!(read(&e, MIB, MIB as usize), data);
        assert_eq!(read(&e, 0, 4096), pattern(4, 4096));
        e.close().unwrap();
    }
}

#[test]
fn a_write_of_the_same_blocks_meanwhile_makes_the_commit_redo_so_ram_and_log_agree() {
    for zero in [false, true] {
        let (cache, backing) = devices();
        let e = Engine::open(cache.clone(), backing.clone(), options(true)).unwrap();
        let data = pattern(6, MIB as usize);
        let mut r = e.reserve_write(MIB, MIB).unwrap().expect("room");
        // Another connection writes (or zeroes) part of the same range, logged after the
        // reserved blocks: publishing them now would lose to it on replay.
        if zero {
            e.write_zeroes(MIB + 8192, 8192, false).unwrap();
        } else {
            e.write(MIB + 8192, &pattern(7, 8192), false).unwrap();
        }
        fill(&mut r, &data);
        let mut redo = Vec::new();
        assert!(!r.commit(&mut redo));
        e.write(MIB, &redo, false).unwrap();
        assert_eq!(read(&e, MIB, MIB as usize), data);
        e.flush().unwrap();
        drop(e);
        let e = Engine::open(cache.clone(), backing.clone(), options(true)).unwrap();
        assert_eq!(read(&e, MIB, MIB as usize), data, "zero {zero}");
        e.close().unwrap();
    }
}

#[test]
fn only_whole_blocks_in_write_back_mode_are_reserved() {
    let (cache, backing) = devices();
    let e = Engine::open(cache, backing, options(true)).unwrap();
    assert!(e.reserve_write(512, MIB).unwrap().is_none(), "unaligned");
    assert!(
        e.reserve_write(0, 4096 + 512).unwrap().is_none(),
        "part of a block"
    );
    assert!(
        e.reserve_write(0, 4 * MIB).unwrap().is_none(),
        "past the largest"
    );
    assert!(
        e.reserve_write(e.size_bytes(), 4096).is_err(),
        "past the end"
    );
    e.set_tunable("cache_mode", "write-through").unwrap();
    assert!(e.reserve_write(0, MIB).unwrap().is_none(), "write-through");
    e.set_tunable("cache_mode", "write-back").unwrap();
    let r = e.reserve_write(0, MIB).unwrap();
    assert!(r.is_some());
}
