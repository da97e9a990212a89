//! Crash simulation: the durability contract under power loss.
//!
//! Method: a seeded schedule of writes (any size and alignment), flushes and FUA writes runs on
//! simulated devices. Every sector written carries a pattern naming the write that put it there.
//! At a random moment the "power fails": the engine is dropped without closing, and the cache
//! device keeps, loses or tears (at 512-byte granularity) each write it had not synced. Some
//! crashes come from a failpoint instead: after a random number of device operations every
//! write and sync fails, as if the process died at that IO boundary. Then the cache is reopened
//! and every sector of the hot region is checked:
//!
//! - it holds exactly the pattern of some write to that sector, or the backing device's
//!   original pattern (never anything else);
//! - that write is the last one made durable (by a completed flush or FUA write) or a later one.
//!
//! What recovery returned is then durable (open syncs it), so it becomes each sector's new floor,
//! and the next cycle runs on the recovered cache. Each case runs several crash cycles, which
//! exercises the epoch/cut logic that keeps a discarded tail from coming back.
//!
//! Writeback runs between writes (manual mode: `writeback_step`), and the backing device crashes
//! too (losing writes it had not synced) or fails at an IO boundary, so the order "sync the
//! backing device, then mark clean, then persist the writeback position" is under test.
//!
//! The schedule also has TRIM and write-zeroes (their sectors must read as zeros if they are
//! the newest data), reads (which promote misses as clean blocks) and cache-mode switches, so
//! write-through and write-around writes and their drop ranges crash too.
//!
//! Not checked here: concurrency (one thread, manual flusher).

mod common;

use common::*;
use logcache_engine::{Engine, OpenOptions};
use logcache_testkit::rng::Rng;

const KIB: u64 = 1024;

/// Per sector: the write id that is durable for certain, and the ids written after it.
struct SectorModel {
    floor: Vec<u64>,
    later: Vec<Vec<u64>>,
}

/// Ids of TRIM / write-zeroes operations carry this bit: their sectors read as zeros.
const ZERO_OP: u64 = 1 << 63;

impl SectorModel {
    fn allows(&self, sector: usize, id: u64) -> bool {
        self.floor[sector] == id || self.later[sector].contains(&id)
    }

    /// For a sector that reads as zeros: the zeroing operation it may come from, if any.
    fn zero_op_allowed(&self, sector: usize) -> Option<u64> {
        if self.floor[sector] & ZERO_OP != 0 {
            return Some(self.floor[sector]);
        }
        self.later[sector]
            .iter()
            .rev()
            .find(|&&id| id & ZERO_OP != 0)
            .copied()
    }

    /// Writes acknowledged before a completed flush are durable: each sector's newest write
    /// becomes its floor.
    fn flushed(&mut self, acked_newest: &[Option<u64>]) {
        for (s, newest) in acked_newest.iter().enumerate() {
            if let Some(id) = newest {
                let pos = self.later[s]
                    .iter()
                    .position(|x| x == id)
                    .expect("newest is later");
                self.floor[s] = *id;
                self.later[s].drain(..=pos);
            }
        }
    }
}

fn run_case(seed: u64) {
    let mut rng = Rng::new(seed);
    let segment = [32 * KIB, 64 * KIB, 128 * KIB][rng.below(3) as usize];
    let cache_bytes = (1 << 20) + segment * rng.range(8, 32);
    let cache_data_bytes = live_bytes_max(cache_bytes, segment);
    let region_sectors = rng.range(16, (cache_data_bytes / 512).min(1024));
    let opts = OpenOptions {
        ram_buffer_bytes: segment * rng.range(2, 4),
        manual_flusher: true,
        seal_interval_ms: Some(0),
        ..OpenOptions::default()
    };
    let pair = SimPair::new(cache_bytes, 4 << 20, segment);
    // Write id 0 is the backing device's original content.
    let mut buf = vec![0u8; 512];
    for s in 0..region_sectors {
        sector_pattern(0, s, &mut buf);
        pair.backing.write_raw(s * 512, &buf);
    }
    let n = region_sectors as usize;
    let mut model = SectorModel {
        floor: vec![0; n],
        later: vec![Vec::new(); n],
    };
    // Newest acknowledged write per sector since the last completed flush.
    let mut acked_newest: Vec<Option<u64>> = vec![None; n];
    let mut next_id = 1u64;
    let cycles = rng.range(1, 4);
    for cycle in 0..cycles {
        let e = Engine::open(pair.cache(), pair.backing(), opts.clone())
            .unwrap_or_else(|err| panic!("cycle {cycle}: open: {err}"));
        // Sometimes the process dies at an IO boundary instead of between operations.
        if rng.chance(1, 3) {
            pair.cache.fail_after_ops(rng.range(0, 40));
        }
        // Or the backing device fails under writeback.
        if rng.chance(1, 6) {
            pair.backing.fail_after_ops(rng.range(0, 40));
        }
        let ops = rng.range(5, 120);
        for _ in 0..ops {
            match rng.below(16) {
                0..=8 => {
                    let first = rng.below(region_sectors);
                    let count = rng.range(1, (region_sectors - first).min(48));
                    let id = next_id;
                    next_id += 1;
                    let mut data = vec![0u8; count as usize * 512];
                    for i in 0..count {
                        let s = first + i;
                        sector_pattern(id, s, &mut data[i as usize * 512..(i as usize + 1) * 512]);
                        // Even a write that fails may have reached the log in part.
                        model.later[s as usize].push(id);
                    }
                    let fua = rng.chance(1, 10);
                    if e.write(first * 512, &data, fua).is_ok() {
                        for i in 0..count {
                            acked_newest[(first + i) as usize] = Some(id);
                        }
                        if fua {
                            // A FUA write is durable on return, and so is everything before it
                            // (the engine makes it durable with a flush).
                            model.flushed(&acked_newest);
                            acked_newest.fill(None);
                        }
                    }
                }
                12 => {
                    // TRIM or write-zeroes: the range reads as zeros afterwards.
                    let first = rng.below(region_sectors);
                    let count = rng.range(1, (region_sectors - first).min(64));
                    let id = next_id | ZERO_OP;
                    next_id += 1;
                    for s in first..first + count {
                        model.later[s as usize].push(id);
                    }
                    let fua = rng.chance(1, 10);
                    let res = if rng.chance(1, 2) {
                        e.discard(first * 512, count * 512, fua)
                    } else {
                        e.write_zeroes(first * 512, count * 512, fua)
                    };
                    if res.is_ok() {
                        for s in first..first + count {
                            acked_newest[s as usize] = Some(id);
                        }
                        if fua {
                            model.flushed(&acked_newest);
                            acked_newest.fill(None);
                        }
                    }
                }
                13 => {
                    // Reads promote misses into the log as clean blocks.
                    let first = rng.below(region_sectors);
                    let count = rng.range(1, (region_sectors - first).min(64));
                    let mut buf = vec![0u8; count as usize * 512];
                    let _ = e.read(first * 512, &mut buf);
                }
                14 => {
                    // Switching modes; leaving write-back drains (which may fail here).
                    let mode =
                        ["write-back", "write-through", "write-around"][rng.below(3) as usize];
                    let _ = e.set_tunable("cache_mode", mode);
                }
                9 => {
                    // Writeback of durable dirty blocks; clean blocks may then be evicted, so
                    // later reads come from the backing device.
                    let _ = e.writeback_step(rng.range(1, 64) as usize);
                }
                _ => {
                    if e.flush().is_ok() {
                        model.flushed(&acked_newest);
                        acked_newest.fill(None);
                    }
                }
            }
        }
        // Power fails.
        e.crash();
        pair.cache.crash(&mut rng);
        pair.backing.crash(&mut rng);
        acked_newest.fill(None);
        let e = Engine::open(pair.cache(), pair.backing(), opts.clone())
            .unwrap_or_else(|err| panic!("cycle {cycle}: reopen after crash: {err}"));
        let mut image = vec![0u8; n * 512];
        e.read(0, &mut image).expect("read after recovery");
        for s in 0..n {
            let bytes = &image[s * 512..(s + 1) * 512];
            let id = if bytes.iter().all(|&b| b == 0) {
                model.zero_op_allowed(s).unwrap_or_else(|| {
                    panic!(
                        "cycle {cycle}: sector {s} reads as zeros, but no TRIM or write-zeroes \
                         may be its newest data (durable {}, later {:?})",
                        model.floor[s], model.later[s]
                    )
                })
            } else {
                identify(s as u64, bytes).unwrap_or_else(|| {
                    panic!("cycle {cycle}: sector {s} holds bytes no write put there")
                })
            };
            assert!(
                model.allows(s, id),
                "cycle {cycle}: sector {s} holds write {id}, but write {} was durable and only {:?} came after",
                model.floor[s],
                model.later[s]
            );
            // Recovery's answer is durable now.
            model.floor[s] = id;
            model.later[s].clear();
        }
        e.crash();
    }
}

#[test]
fn crash_recovery_keeps_the_durability_contract() {
    for_each_seed(
        "crash",
        cases_from_env("LOGCACHE_CRASH_CASES", 3000),
        run_case,
    );
}
