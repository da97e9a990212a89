//! Checkpoints: a checkpoint's bitmap holds every block changed since it was created, through
//! writeback, log wrap and reclaim, clean restarts and crashes (after a crash it may
//! over-report, never under-report).
//!
//! The crash model: a seeded schedule of writes (512 B up to the region), TRIM, write-zeroes,
//! reads (promotions), writeback steps, mode switches, flushes, and checkpoint creates and
//! deletes, on a small cache so the log wraps and segments are reclaimed (which folds the
//! bitmaps). Per checkpoint the model keeps the blocks of every operation that returned
//! after it was created (`acked`), and of those made durable by a later flush or FUA
//! (`durable`). While running, the engine's bits must cover `acked`; after a power cut (the
//! cache device keeps, loses or tears each unsynced write) or a failure at an IO boundary,
//! the reopened engine's bits must cover `durable`. Blocks reported that no operation after
//! the checkpoint touched are the over-report, summed and printed.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::*;
use logcache_engine::{Engine, FormatOptions};
use logcache_testkit::rng::Rng;
use logcache_testkit::sim::SimDevice;

const KIB: u64 = 1024;
const BLOCK: u64 = 4096;

#[derive(Default, Clone)]
struct Truth {
    /// Blocks of operations acknowledged since the checkpoint was created.
    acked: BTreeSet<u64>,
    /// Blocks of those operations a flush or FUA made durable.
    durable: BTreeSet<u64>,
    /// Blocks of operations attempted since (acknowledged or not): what may be reported.
    touched: BTreeSet<u64>,
}

#[derive(Default)]
struct Model {
    /// Checkpoints the engine surely has.
    known: BTreeMap<String, Truth>,
    /// Operations acknowledged since the last flush: their blocks, and the checkpoints that
    /// existed when they were acknowledged.
    unflushed: Vec<(Vec<u64>, Vec<String>)>,
}

impl Model {
    fn attempted(&mut self, blocks: &[u64]) {
        for t in self.known.values_mut() {
            t.touched.extend(blocks);
        }
    }

    fn acked(&mut self, blocks: Vec<u64>, durable: bool) {
        for t in self.known.values_mut() {
            t.acked.extend(&blocks);
        }
        self.unflushed
            .push((blocks, self.known.keys().cloned().collect()));
        if durable {
            self.flushed();
        }
    }

    /// A TRIM acknowledged: required of the bits while running, never after a restart. Under
    /// flush-epoch order with older data owed to the backing device the engine leaves a TRIM
    /// out altogether (a hint), so the blocks keep their content and logging nothing about
    /// them is right; a TRIM that was applied logs a drop range, which recovery counts.
    fn acked_trim(&mut self, blocks: Vec<u64>) {
        for t in self.known.values_mut() {
            t.acked.extend(&blocks);
        }
    }

    fn flushed(&mut self) {
        for (blocks, names) in self.unflushed.drain(..) {
            for name in names {
                if let Some(t) = self.known.get_mut(&name) {
                    t.durable.extend(&blocks);
                }
            }
        }
    }

    /// The bits of every checkpoint the model knows must cover `pick(truth)`. Returns the
    /// over-report (blocks reported that no operation since touched) and the blocks reported.
    fn check(&self, e: &Engine, pick: fn(&Truth) -> &BTreeSet<u64>, when: &str) -> (u64, u64) {
        let (mut over, mut reported) = (0, 0);
        for (name, truth) in &self.known {
            let runs = e
                .checkpoint_changes(name, 0, e.size_bytes(), usize::MAX)
                .unwrap_or_else(|err| panic!("{when}: checkpoint {name} is gone: {err}"));
            let mut set = BTreeSet::new();
            let mut pos = 0;
            for (len, changed) in runs {
                if changed {
                    set.extend(pos / BLOCK..(pos + len) / BLOCK);
                }
                pos += len;
            }
            assert_eq!(pos, e.size_bytes(), "{when}: runs cover the disk");
            for b in pick(truth) {
                assert!(
                    set.contains(b),
                    "{when}: checkpoint {name} under-reports block {b}"
                );
            }
            let listed = e.checkpoints();
            let info = listed.iter().find(|c| &c.name == name).expect("listed");
            assert_eq!(
                info.changed_bytes,
                set.len() as u64 * BLOCK,
                "{when}: list agrees"
            );
            reported += set.len() as u64;
            over += set.iter().filter(|b| !truth.touched.contains(b)).count() as u64;
        }
        (over, reported)
    }
}

/// Blocks a sector range touches (writes, write-zeroes).
fn touched(first: u64, count: u64) -> Vec<u64> {
    (first / 8..(first + count).div_ceil(8)).collect()
}

/// Blocks a sector range covers whole (TRIM changes only those).
fn whole(first: u64, count: u64) -> Vec<u64> {
    (first.div_ceil(8)..(first + count) / 8).collect()
}

struct Totals {
    over: u64,
    reported: u64,
}

fn run_case(seed: u64, totals: &mut Totals) {
    let mut rng = Rng::new(seed);
    let segment = [32 * KIB, 64 * KIB][rng.below(2) as usize];
    let cache_bytes = (1 << 20) + segment * rng.range(8, 20);
    let region_sectors = rng.range(64, (live_bytes_max(cache_bytes, segment) / 512).min(2048));
    let pair = SimPair::new(cache_bytes, 4 << 20, segment);
    let opts = manual(segment * rng.range(2, 4));
    let mut model = Model::default();
    let mut next_name = 0u64;
    for cycle in 0..rng.range(1, 5) {
        let e = Engine::open(pair.cache(), pair.backing(), opts.clone())
            .unwrap_or_else(|err| panic!("cycle {cycle}: open: {err}"));
        // Checkpoints a failed create or delete may or may not have left: adopt what the
        // engine has (nothing to check for them), and drop what it lost only if uncertain.
        for c in e.checkpoints() {
            model.known.entry(c.name).or_default();
        }
        if rng.chance(1, 3) {
            pair.cache.fail_after_ops(rng.range(0, 60));
        }
        if rng.chance(1, 8) {
            pair.backing.fail_after_ops(rng.range(0, 40));
        }
        let mut uncertain: BTreeSet<String> = BTreeSet::new();
        for _ in 0..rng.range(10, 150) {
            match rng.below(20) {
                0..=8 => {
                    let first = rng.below(region_sectors);
                    let count = rng.range(1, (region_sectors - first).min(256));
                    let blocks = touched(first, count);
                    model.attempted(&blocks);
                    let fua = rng.chance(1, 10);
                    let data = vec![rng.below(256) as u8; count as usize * 512];
                    if e.write(first * 512, &data, fua).is_ok() {
                        model.acked(blocks, fua);
                    }
                }
                9 | 10 => {
                    let first = rng.below(region_sectors);
                    let count = rng.range(1, (region_sectors - first).min(128));
                    let fua = rng.chance(1, 10);
                    if rng.chance(1, 2) {
                        let b = whole(first, count);
                        model.attempted(&b);
                        if e.discard(first * 512, count * 512, fua).is_ok() {
                            model.acked_trim(b);
                        }
                    } else {
                        let b = touched(first, count);
                        model.attempted(&b);
                        if e.write_zeroes(first * 512, count * 512, fua).is_ok() {
                            model.acked(b, fua);
                        }
                    }
                }
                11 => {
                    let first = rng.below(region_sectors);
                    let count = rng.range(1, (region_sectors - first).min(64));
                    let mut buf = vec![0u8; count as usize * 512];
                    let _ = e.read(first * 512, &mut buf);
                }
                12 | 13 => {
                    let _ = e.writeback_step(rng.range(1, 64) as usize);
                }
                14 => {
                    let mode =
                        ["write-back", "write-through", "write-around"][rng.below(3) as usize];
                    let _ = e.set_tunable("cache_mode", mode);
                }
                15 | 16 => {
                    let name = format!("c{next_name}");
                    next_name += 1;
                    match e.checkpoint_create(&name) {
                        Ok(_) => {
                            model.known.insert(name, Truth::default());
                        }
                        Err(_) => {
                            uncertain.insert(name);
                        }
                    }
                }
                17 => {
                    let Some(name) = model.known.keys().nth(rng.below(4) as usize).cloned() else {
                        continue;
                    };
                    if e.checkpoint_delete(&name).is_err() {
                        uncertain.insert(name.clone());
                    }
                    model.known.remove(&name);
                }
                _ => {
                    if e.flush().is_ok() {
                        model.flushed();
                    }
                }
            }
        }
        if !pair.cache.is_failing() && !pair.backing.is_failing() && e.stats().failed.is_none() {
            model.check(&e, |t| &t.acked, &format!("cycle {cycle}, running"));
        }
        match rng.below(3) {
            0 => {
                // A clean stop (which may fail if a device failed: then it was a crash).
                let _ = e.close();
                pair.cache.crash_keep_all();
                pair.backing.crash_keep_all();
            }
            _ => {
                e.crash();
                pair.cache.crash(&mut rng);
                pair.backing.crash(&mut rng);
            }
        }
        // What was not made durable may be gone.
        model.unflushed.clear();
        for t in model.known.values_mut() {
            t.acked = t.durable.clone();
        }
        let e = Engine::open(pair.cache(), pair.backing(), opts.clone())
            .unwrap_or_else(|err| panic!("cycle {cycle}: reopen: {err}"));
        let names: BTreeSet<String> = e.checkpoints().into_iter().map(|c| c.name).collect();
        for name in model.known.keys() {
            assert!(
                names.contains(name),
                "cycle {cycle}: checkpoint {name} lost across the restart"
            );
        }
        for name in names.difference(&model.known.keys().cloned().collect()) {
            assert!(
                uncertain.contains(name),
                "cycle {cycle}: checkpoint {name} came back though its delete returned"
            );
        }
        let (over, reported) =
            model.check(&e, |t| &t.durable, &format!("cycle {cycle}, after restart"));
        totals.over += over;
        totals.reported += reported;
        e.crash();
    }
}

#[test]
fn checkpoints_never_under_report_through_crashes() {
    let totals = std::sync::Mutex::new(Totals {
        over: 0,
        reported: 0,
    });
    for_each_seed(
        "checkpoints",
        cases_from_env("LOGCACHE_CHECKPOINT_CASES", 100),
        |seed| run_case(seed, &mut totals.lock().unwrap()),
    );
    let t = totals.lock().unwrap();
    eprintln!(
        "checkpoints: after restarts {} blocks reported, {} of them ({:.1}%) touched by no operation since the checkpoint (over-report)",
        t.reported,
        t.over,
        100.0 * t.over as f64 / t.reported.max(1) as f64
    );
    assert!(t.reported > 0, "the schedule reported changes");
}

/// Bitmaps of more than one page persist across a clean restart and a crash, pages on both
/// sides of a boundary, with the log wrapping in between.
#[test]
fn multi_page_bitmaps_persist() {
    // 2 pages of 32,640 blocks (127.5 MiB each).
    let backing_bytes = (128 << 20) + (4 << 20);
    let pair = SimPair::new((1 << 20) + 16 * 64 * KIB, backing_bytes, 64 * KIB);
    let e = Engine::open(pair.cache(), pair.backing(), manual(4 * 64 * KIB)).unwrap();
    e.write(0, &[1u8; 4096], false).unwrap();
    e.checkpoint_create("a").unwrap();
    let boundary = 32_640u64;
    let lbas = [
        0,
        5,
        boundary - 1,
        boundary,
        boundary + 70,
        2 * boundary - 40,
    ];
    for round in 0..40u64 {
        for &l in &lbas {
            if l * BLOCK < e.size_bytes() {
                e.write(l * BLOCK, &[round as u8; 4096], false).unwrap();
            }
        }
        e.flush().unwrap();
        e.writeback_step(64).unwrap();
    }
    assert!(e.stats().counters.segments_reclaimed > 0, "the log wrapped");
    assert!(
        e.stats().counters.checkpoint_pages_written > 0,
        "folds wrote pages"
    );
    let expect: BTreeSet<u64> = lbas
        .iter()
        .copied()
        .filter(|l| l * BLOCK < e.size_bytes())
        .collect();
    let check = |e: &Engine, when: &str| {
        let info = &e.checkpoints()[0];
        assert_eq!(info.name, "a");
        assert_eq!(info.changed_bytes, expect.len() as u64 * BLOCK, "{when}");
        for &l in &expect {
            let r = e.checkpoint_changes("a", l * BLOCK, BLOCK, 1).unwrap();
            assert_eq!(r, vec![(BLOCK, true)], "{when}: block {l}");
        }
    };
    check(&e, "running");
    e.close().unwrap();
    let e = Engine::open(pair.cache(), pair.backing(), manual(4 * 64 * KIB)).unwrap();
    check(&e, "after a clean restart");
    e.crash();
    pair.cache.crash_lose_all();
    let e = Engine::open(pair.cache(), pair.backing(), manual(4 * 64 * KIB)).unwrap();
    check(&e, "after a crash");
}

/// The refusals: duplicate names, bad names, a full table, unknown names, and a cache
/// formatted without room (each one line saying what to do).
#[test]
fn refusals_say_what_to_do() {
    let pair = SimPair::new((1 << 20) + 8 * 64 * KIB, 4 << 20, 64 * KIB);
    let e = Engine::open(pair.cache(), pair.backing(), manual(4 * 64 * KIB)).unwrap();
    e.checkpoint_create("one").unwrap();
    let dup = e.checkpoint_create("one").unwrap_err().to_string();
    assert!(
        dup.contains("exists") && dup.contains("checkpoint delete one"),
        "{dup}"
    );
    let bad = e.checkpoint_create("a b").unwrap_err().to_string();
    assert!(bad.contains("may not contain"), "{bad}");
    for n in ["two", "three", "four"] {
        e.checkpoint_create(n).unwrap();
    }
    let full = e.checkpoint_create("five").unwrap_err().to_string();
    assert!(
        full.contains("all 4 checkpoint slots") && full.contains("delete"),
        "{full}"
    );
    let missing = e.checkpoint_delete("nope").unwrap_err().to_string();
    assert!(missing.contains("one, two, three, four"), "{missing}");
    e.checkpoint_delete("two").unwrap();
    e.checkpoint_create("five").unwrap();
    let names: Vec<String> = e.checkpoints().into_iter().map(|c| c.name).collect();
    assert_eq!(names, ["one", "three", "four", "five"]);
    for msg in [&dup, &bad, &full, &missing] {
        assert!(!msg.contains('\n'), "one line: {msg}");
    }
    e.close().unwrap();

    let cache = SimDevice::new((1 << 20) + 8 * 64 * KIB);
    let backing = SimDevice::new(4 << 20);
    let opts = FormatOptions {
        segment_size_bytes: 64 * KIB,
        checkpoint_slots: 0,
        ..FormatOptions::default()
    };
    logcache_engine::format_cache(&cache, &backing, &opts).unwrap();
    let e = Engine::open(
        std::sync::Arc::new(cache),
        std::sync::Arc::new(backing),
        manual(4 * 64 * KIB),
    )
    .unwrap();
    let none = e.checkpoint_create("x").unwrap_err().to_string();
    assert!(
        none.contains("without room for checkpoints") && none.contains("--checkpoints"),
        "{none}"
    );
    assert!(e.checkpoints().is_empty());
}
