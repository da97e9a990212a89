//! Shared helpers for the engine's integration tests: seeded case loops, sector patterns that
//! identify which write put them there, and small device setups.
#![allow(dead_code)]

use std::sync::Arc;

pub mod epoch_log;
pub mod epochs;
pub mod stall;
pub mod wait;

use logcache_engine::io::BlockDevice;
use logcache_engine::{format_cache, Engine, FormatOptions, OpenOptions};
use logcache_testkit::rng::{seed_from_env, Rng};
use logcache_testkit::sim::SimDevice;

pub mod history;

pub const SECTOR: usize = 512;

/// 512 bytes that say "write `write_id` put this at sector `sector`": bytes 0..8 the write id,
/// 8..16 the sector, the rest a stream derived from both.
pub fn sector_pattern(write_id: u64, sector: u64, out: &mut [u8]) {
    assert_eq!(out.len(), SECTOR);
    out[..8].copy_from_slice(&write_id.to_le_bytes());
    out[8..16].copy_from_slice(&sector.to_le_bytes());
    let mut r = Rng::new(write_id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ sector);
    r.fill(&mut out[16..]);
}

/// Which write a sector's bytes came from, or `None` if they match no write's pattern for it.
pub fn identify(sector: u64, bytes: &[u8]) -> Option<u64> {
    let w = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    let mut expect = [0u8; SECTOR];
    sector_pattern(w, sector, &mut expect);
    (expect[..] == bytes[..]).then_some(w)
}

/// How many cases to run: the environment variable `var`, or `default`.
pub fn cases_from_env(var: &str, default: u64) -> u64 {
    match std::env::var(var) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{var} must be a whole number, got {v:?}")),
        Err(_) => default,
    }
}

/// Runs `case` for each seed: `LOGCACHE_SEED` alone if set, else `count` seeds from a base the
/// clock picks. A failure says how to replay it.
pub fn for_each_seed(name: &str, count: u64, case: impl Fn(u64)) {
    let fixed = std::env::var("LOGCACHE_SEED").is_ok();
    let base = seed_from_env("LOGCACHE_SEED");
    let n = if fixed { 1 } else { count };
    for i in 0..n {
        let seed = base.wrapping_add(i.wrapping_mul(0x2545_F491_4F6C_DD1D));
        if std::env::var("LOGCACHE_PRINT_SEEDS").is_ok() {
            eprintln!("{name}: seed {seed}");
        }
        let started = std::time::Instant::now();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| case(seed)));
        if std::env::var("LOGCACHE_PRINT_SEEDS").is_ok() {
            eprintln!("{name}: seed {seed} took {:?}", started.elapsed());
        }
        if let Err(e) = r {
            eprintln!(
                "\n{name} failed with seed {seed}; replay it with:\n  LOGCACHE_SEED={seed} cargo test -p logcache-engine --test {name}\n"
            );
            std::panic::resume_unwind(e);
        }
    }
}

/// Open options for a deterministic engine: background work inline (manual mode), no periodic
/// seal, `ram` bytes of RAM buffers.
pub fn manual(ram: u64) -> OpenOptions {
    OpenOptions {
        ram_buffer_bytes: ram,
        manual_flusher: true,
        seal_interval_ms: Some(0),
        ..OpenOptions::default()
    }
}

/// A simulated cache and backing pair, formatted.
pub struct SimPair {
    pub cache: SimDevice,
    pub backing: SimDevice,
}

impl SimPair {
    pub fn new(cache_bytes: u64, backing_bytes: u64, segment_size_bytes: u64) -> SimPair {
        let p = SimPair {
            cache: SimDevice::new(cache_bytes),
            backing: SimDevice::new(backing_bytes),
        };
        let opts = FormatOptions {
            segment_size_bytes,
            ..FormatOptions::default()
        };
        format_cache(&p.cache, &p.backing, &opts).expect("format");
        p
    }

    /// Fills the backing device's first `sectors` sectors with write 0's pattern (its
    /// original content, as the models call it), durable.
    pub fn write_original(&self, sectors: u64) {
        let mut buf = vec![0u8; SECTOR];
        for s in 0..sectors {
            sector_pattern(0, s, &mut buf);
            self.backing.write_raw(s * SECTOR as u64, &buf);
        }
    }

    pub fn cache(&self) -> Arc<dyn BlockDevice> {
        Arc::new(self.cache.clone())
    }

    pub fn backing(&self) -> Arc<dyn BlockDevice> {
        Arc::new(self.backing.clone())
    }
}

/// How much live data a test may keep in a cache without writeback (which a later issue adds):
/// 80% of what the relocator can compact into (all segments but the reserve, the open one and
/// one to open, each less its metadata block).
pub fn live_bytes_max(cache_bytes: u64, segment_bytes: u64) -> u64 {
    let segments = (cache_bytes - (1 << 20)) / segment_bytes;
    (segments - 3) * (segment_bytes - 4096) * 8 / 10
}

/// A write the way a connection's reader does a large one (`Engine::reserve_write`): the whole
/// blocks inside it reserved, the payload received into them (`receive` stands for the socket:
/// the simulation holds an IO at its gate there, so others run meanwhile and flushes cancel
/// it), then committed, or written the ordinary way when the commit gives up. The partial
/// blocks at its ends are ordinary writes. Write ids 6 mod 8 give the reservation up filled
/// but uncommitted (a connection closed mid-payload) and then write the ordinary way (the
/// client resent it). A failed receipt drops the reservation and fails the write.
pub fn reserved_write(
    e: &Engine,
    offset: u64,
    data: &[u8],
    id: u64,
    receive: &mut dyn FnMut() -> std::io::Result<()>,
) -> logcache_engine::Result<()> {
    const BLOCK: u64 = 4096;
    let end = offset + data.len() as u64;
    let (first, last) = (offset.div_ceil(BLOCK) * BLOCK, end / BLOCK * BLOCK);
    if first >= last {
        return e.write(offset, data, false);
    }
    let at = |o: u64| (o - offset) as usize;
    if offset < first {
        e.write(offset, &data[..at(first)], false)?;
    }
    let middle = &data[at(first)..at(last)];
    let reserved = e.reserve_write(first, last - first)?;
    match reserved {
        None => e.write(first, middle, false)?,
        Some(mut r) => {
            if let Err(err) = receive() {
                drop(r);
                return Err(logcache_engine::Error::io("the payload's receipt", err));
            }
            let mut done = 0;
            for i in 0..r.piece_count() {
                let piece = r.piece(i);
                piece.copy_from_slice(&middle[done..done + piece.len()]);
                done += piece.len();
            }
            assert_eq!(done, middle.len());
            let mut redo = Vec::new();
            if id % 8 == 6 {
                drop(r);
                e.write(first, middle, false)?;
            } else if !r.commit(&mut redo) {
                assert_eq!(redo, middle, "a reservation gave back other data");
                e.write(first, &redo, false)?;
            }
        }
    }
    if last < end {
        e.write(last, &data[at(last)..], false)?;
    }
    Ok(())
}
