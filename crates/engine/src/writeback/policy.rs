//! The writeback rate policy (`next_batch_plan`): full speed while a `drain` waits, writers
//! wait for room in a ring out of free segments (not for a RAM buffer: that is the flusher's
//! work), the ring runs low on free segments with dirty blocks at its head in flush-epoch
//! order, or the front end has been idle for `writeback_idle_ms`. Above
//! `writeback_threshold_percent`, a proportional controller (bcache's model): the excess over
//! the threshold is written back over about `SETTLE_S`, so under a steady load the dirty level
//! settles where writeback matches the dirtying rate. Between `HIGH_WATER_PERCENT` and
//! `FULL_SPEED_PERCENT` of the cache dirty, the rate ramps up to full speed, so a load the
//! controller cannot settle meets a steadily faster writeback rather than a full log (the cliff
//! bcache and Open CAS users hit). Below the threshold, nothing: overwrites of a hot working
//! set are absorbed, not written back again and again. Runs on the writeback thread.

use std::time::{Duration, Instant};

use crate::format::BLOCK_SIZE_BYTES;
use crate::inner::Inner;
use crate::state::State;
use crate::tunables;

/// Above the threshold, the excess is written back over about this many seconds.
const SETTLE_S: u64 = 20;
/// From this share of the cache dirty, the rate ramps up...
const HIGH_WATER_PERCENT: u64 = 70;
/// ...to full speed here.
const FULL_SPEED_PERCENT: u64 = 90;
/// The slowest background rate above the threshold: 1 MiB/s.
const RATE_MIN_BLOCKS_PER_S: u64 = 256;

/// How the next batch should run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Nothing to do now.
    Wait,
    /// Write back up to this many blocks, then pace to this rate (None: no pacing).
    Batch {
        blocks: usize,
        rate_blocks_per_s: Option<u64>,
    },
}

/// What the policy remembers between batches.
pub struct Pacer {
    last_ops: u64,
    last_ops_change: Instant,
    pub last_persist: Instant,
}

impl Pacer {
    pub fn new(now: Instant) -> Pacer {
        Pacer {
            last_ops: 0,
            last_ops_change: now,
            last_persist: now,
        }
    }
}

/// Whether writeback must run at full speed now, whatever its background rate (the cases
/// `next_batch_plan` lists first). A paced pause between batches ends as soon as this holds
/// (`super::run`): a writer waiting for room, or a ring head waiting for its dirty blocks,
/// waited out the pause otherwise (80-200 ms at a time in `bench engine`, a quarter of the
/// run; BENCHMARKS.md, issue 20, 2026-11-27).
pub fn wants_full_speed(inner: &Inner, st: &State) -> bool {
    st.writeback.draining()
        || (st.room.writers_wait() && st.under_pressure())
        || (st.ordered() && st.ring.head_wants_writeback())
        || inner.tunables.get(tunables::CACHE_MODE) != tunables::MODE_WRITE_BACK
}

pub fn next_batch_plan(inner: &Inner, st: &State, pacer: &mut Pacer, now: Instant) -> Plan {
    let batch_max = inner.tunables.get(tunables::WRITEBACK_BATCH_BLOCKS) as usize;
    // Is the front end idle?
    let ops = st.counters.reads + st.counters.writes;
    if ops != pacer.last_ops {
        pacer.last_ops = ops;
        pacer.last_ops_change = now;
    }
    if st.blocks.dirty_blocks() == 0 {
        return Plan::Wait;
    }
    let full = Plan::Batch {
        blocks: batch_max,
        rate_blocks_per_s: None,
    };
    // Outside write-back mode dirty blocks are leftovers of it: write them back now. Writers
    // waiting for room in a ring that is out of free segments need writeback; writers waiting
    // for a RAM buffer need the flusher, and writeback would only compete with it.
    // In flush-epoch order the relocator does not move dirty blocks: writeback alone lets the
    // head pass them, so it starts as the ring runs low, not once writers already wait (they
    // then waited for every batch: half a writer's time in `bench engine`, issue 20).
    if wants_full_speed(inner, st) {
        return full;
    }
    let rate_max_blocks =
        inner.tunables.get(tunables::WRITEBACK_RATE_MAX_MIB) * (1 << 20) / BLOCK_SIZE_BYTES;
    let capped = |rate: Option<u64>| -> Plan {
        let rate = match (rate, rate_max_blocks) {
            (r, 0) => r,
            (None, m) => Some(m),
            (Some(r), m) => Some(r.min(m)),
        };
        match rate {
            None => full,
            Some(r) => Plan::Batch {
                // About four batches a second, so pacing stays smooth.
                blocks: ((r / 4) as usize).clamp(16, batch_max),
                rate_blocks_per_s: Some(r.max(1)),
            },
        }
    };
    let idle_ms = inner.tunables.get(tunables::WRITEBACK_IDLE_MS);
    if idle_ms > 0
        && now.saturating_duration_since(pacer.last_ops_change) >= Duration::from_millis(idle_ms)
    {
        return capped(None);
    }
    let cache_blocks = inner.geo.cache_block_count() as u64;
    let threshold_percent = inner.tunables.get(tunables::WRITEBACK_THRESHOLD_PERCENT);
    let threshold_blocks = cache_blocks * threshold_percent / 100;
    if st.blocks.dirty_blocks() <= threshold_blocks {
        return Plan::Wait;
    }
    let full_blocks = cache_blocks * FULL_SPEED_PERCENT / 100;
    if st.blocks.dirty_blocks() >= full_blocks {
        return capped(None);
    }
    let excess = st.blocks.dirty_blocks() - threshold_blocks;
    let mut rate = (excess / SETTLE_S).max(RATE_MIN_BLOCKS_PER_S);
    let high_blocks = cache_blocks * HIGH_WATER_PERCENT / 100;
    if st.blocks.dirty_blocks() > high_blocks {
        // Linear from the settling rate to "the whole cache in a second" at full speed.
        let f = (st.blocks.dirty_blocks() - high_blocks) as f64
            / (full_blocks - high_blocks).max(1) as f64;
        rate += (f * cache_blocks as f64) as u64;
    }
    capped(Some(rate))
}
