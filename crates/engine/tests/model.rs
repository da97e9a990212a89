//! Model-based test: random reads (which promote misses), writes of any size and alignment,
//! TRIM (a hint: a trimmed sector must read as zeros or as a value it held before, until it is
//! written again) and write-zeroes, flushes, FUA writes, cache-mode switches, read-cache tunables,
//! writeback, drains and clean close/reopen, checked byte for byte against a plain in-memory
//! disk; after a drain, the backing device alone must hold the model's image.
//!
//! Method: each seed picks a geometry (segment size, cache size, RAM buffers, hot region) and a
//! mode (manual flusher or the real thread), then runs a few hundred operations. Every read is
//! compared with the model; at the end the whole hot region is. The caches are small, so the
//! ring wraps, segments are reclaimed and live blocks relocated many times per case.

mod common;

use common::*;
use logcache_engine::io::BlockDevice;
use logcache_engine::{Engine, OpenOptions};
use logcache_testkit::rng::Rng;

const KIB: u64 = 1024;
const MODES: [&str; 3] = ["write-back", "write-through", "write-around"];
const SECTOR: usize = 512;

/// The model's disk: its bytes, and per sector whether a TRIM left it open (and the values it
/// held before, as hashes).
struct Disk {
    bytes: Vec<u8>,
    trimmed: Vec<bool>,
    history: Vec<Vec<u64>>,
}

fn hash(sector: &[u8]) -> u64 {
    // FNV-1a: enough to tell this test's random sectors apart.
    sector.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

impl Disk {
    fn new(bytes: Vec<u8>) -> Disk {
        let history = bytes.chunks(SECTOR).map(|s| vec![hash(s)]).collect();
        let trimmed = vec![false; bytes.len() / SECTOR];
        Disk {
            bytes,
            trimmed,
            history,
        }
    }

    /// Sets `[off, off + data.len())` (sector-aligned) to `data`.
    fn write(&mut self, off: u64, data: &[u8]) {
        let off = off as usize;
        self.bytes[off..off + data.len()].copy_from_slice(data);
        for s in off / SECTOR..(off + data.len()) / SECTOR {
            self.trimmed[s] = false;
            let h = hash(&self.bytes[s * SECTOR..(s + 1) * SECTOR]);
            self.history[s].push(h);
        }
    }

    fn trim(&mut self, off: u64, len: u64) {
        for s in off as usize / SECTOR..(off + len) as usize / SECTOR {
            self.trimmed[s] = true;
        }
    }

    /// Whether `got` may be what `[off, off + got.len())` reads as: the model's bytes, except
    /// that a trimmed sector may read as zeros or any value it held before.
    fn matches(&self, off: u64, got: &[u8]) -> bool {
        let off = off as usize;
        got.chunks(SECTOR).enumerate().all(|(i, g)| {
            let s = off / SECTOR + i;
            if !self.trimmed[s] {
                return g == &self.bytes[s * SECTOR..(s + 1) * SECTOR];
            }
            g.iter().all(|&b| b == 0) || self.history[s].contains(&hash(g))
        })
    }
}

fn run_case(seed: u64) {
    let mut rng = Rng::new(seed);
    let segment = [32 * KIB, 64 * KIB, 128 * KIB][rng.below(3) as usize];
    let cache_bytes = (1 << 20) + segment * rng.range(6, 40);
    let backing_bytes = 4 << 20;
    // The hot region is sometimes larger than the cache: writeback then makes room, clean
    // blocks are evicted and reads come back from the backing device.
    let cache_data_bytes = live_bytes_max(cache_bytes, segment);
    let region_cap = if rng.chance(1, 2) {
        cache_data_bytes
    } else {
        3 * cache_data_bytes
    };
    let region_bytes = 512 * rng.range(8, (region_cap / 512).min(4096));
    let threaded = rng.chance(1, 4);
    let opts = OpenOptions {
        ram_buffer_bytes: segment * rng.range(2, 6),
        manual_flusher: !threaded,
        seal_interval_ms: Some(0),
        ..OpenOptions::default()
    };
    let pair = SimPair::new(cache_bytes, backing_bytes, segment);
    // Random initial backing content, so reads that merge with it are checked too.
    let mut initial = vec![0u8; region_bytes as usize];
    rng.fill(&mut initial);
    pair.backing.write_raw(0, &initial);
    let mut model = Disk::new(initial);
    let mut e = Engine::open(pair.cache(), pair.backing(), opts.clone()).unwrap();
    let ops = rng.range(100, 600);
    let trace = std::env::var("LOGCACHE_TRACE").is_ok();
    for op in 0..ops {
        let off = rng.below(region_bytes / 512) * 512;
        let max_len = (region_bytes - off).min(64 * KIB);
        let len = rng.range(1, max_len / 512) * 512;
        let what = rng.below(100);
        if trace {
            let s = e.stats();
            eprintln!(
                "op {op}: kind {what} {off}+{len} (blocks {}..{}) mode {} dirty {} seq {}",
                off / 4096,
                (off + len).div_ceil(4096),
                s.mode,
                s.dirty_blocks,
                s.next_seq
            );
        }
        match what {
            0..=44 => {
                let mut data = vec![0u8; len as usize];
                rng.fill(&mut data);
                let fua = rng.chance(1, 20);
                e.write(off, &data, fua)
                    .unwrap_or_else(|err| panic!("op {op}: write {off}+{len}: {err}"));
                model.write(off, &data);
            }
            45..=79 => {
                let mut buf = vec![0u8; len as usize];
                e.read(off, &mut buf)
                    .unwrap_or_else(|err| panic!("op {op}: read {off}+{len}: {err}"));
                assert!(
                    model.matches(off, &buf),
                    "op {op}: read {off}+{len} differs from the model"
                );
            }
            80..=83 => {
                let fua = rng.chance(1, 10);
                if rng.chance(1, 2) {
                    e.discard(off, len, fua)
                        .unwrap_or_else(|err| panic!("op {op}: trim {off}+{len}: {err}"));
                    model.trim(off, len);
                } else {
                    e.write_zeroes(off, len, fua)
                        .unwrap_or_else(|err| panic!("op {op}: zero {off}+{len}: {err}"));
                    model.write(off, &vec![0u8; len as usize]);
                }
            }
            84..=85 => {
                let mode = MODES[rng.below(3) as usize];
                e.set_tunable("cache_mode", mode)
                    .unwrap_or_else(|err| panic!("op {op}: mode {mode}: {err}"));
                if mode != "write-back" {
                    // Leaving write-back drains; staying out of it keeps nothing dirty for long.
                    assert_eq!(e.mode(), mode);
                }
            }
            86..=89 => {
                let (name, value) = match rng.below(3) {
                    0 => ("read_cache", if rng.chance(1, 2) { "on" } else { "off" }),
                    1 => ("read_sequential_cutoff_kib", "8"),
                    _ => ("read_sequential_cutoff_kib", "0"),
                };
                e.set_tunable(name, value).unwrap();
            }
            90..=94 => e.flush().unwrap(),
            95 => {
                if threaded {
                    e.drain(|_| {}).unwrap();
                    assert_eq!(e.stats().dirty_blocks, 0, "op {op}: dirty after drain");
                } else {
                    e.writeback_step(rng.range(1, 300) as usize).unwrap();
                }
            }
            96 => {
                e.drain(|_| {}).unwrap();
                assert_eq!(e.stats().dirty_blocks, 0, "op {op}: dirty after drain");
                // Drained: the backing device alone holds the image.
                let mut raw = vec![0u8; region_bytes as usize];
                pair.backing.read_at(&mut raw, 0).unwrap();
                assert!(
                    model.matches(0, &raw),
                    "op {op}: backing image after drain differs"
                );
            }
            _ => {
                e.close().unwrap();
                e = Engine::open(pair.cache(), pair.backing(), opts.clone()).unwrap();
                assert!(e.stats().recovery.clean);
            }
        }
    }
    let mut all = vec![0u8; region_bytes as usize];
    e.read(0, &mut all).unwrap();
    assert!(model.matches(0, &all), "final image differs from the model");
    e.close().unwrap();
    let e = Engine::open(pair.cache(), pair.backing(), opts).unwrap();
    e.read(0, &mut all).unwrap();
    if let Some(s) = (0..all.len() / SECTOR)
        .find(|&s| !model.matches((s * SECTOR) as u64, &all[s * SECTOR..(s + 1) * SECTOR]))
    {
        panic!(
            "image after a clean reopen differs from the model at sector {s} (block {})",
            s * SECTOR / 4096
        );
    }
    e.close().unwrap();
}

#[test]
fn model_based() {
    for_each_seed(
        "model",
        cases_from_env("LOGCACHE_MODEL_CASES", 300),
        run_case,
    );
}
