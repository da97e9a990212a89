//! Writeback: copies dirty blocks from the cache device to the backing device, sorted by
//! backing address with adjacent blocks merged, syncs the backing device, and only then marks
//! the blocks clean and persists the new writeback position. Clean blocks are dropped first
//! when the log needs room (`reclaim.rs`).
//!
//! Order of a batch, and why:
//! 1. Under the lock, take dirty blocks in log order from the oldest segments, only from chunks
//!    that are durable on the cache device (a chunk a crash may still lose must not reach the
//!    backing device first), and pin their segments so they cannot be reclaimed.
//! 2. Without the lock, read them from the cache device in runs of adjacent cache blocks and
//!    verify their checksums: corrupt data is never written back.
//! 3. Write them to the backing device in backing-address order, runs of adjacent blocks merged,
//!    up to `writeback_io_depth` writes in flight; then sync it.
//! 4. Under the lock, mark clean each block the index still points at with the same dirty
//!    sectors (a block overwritten meanwhile is dead; its newer copy stays dirty).
//! 5. Persist `writeback_seq`: every chunk before the oldest segment still holding dirty blocks
//!    is clean, so recovery replays it as clean.
//!
//! The policy (`next_batch_plan`): full speed while a `drain` waits, writers wait for room in a
//! ring out of free segments (not for a RAM buffer: that is the flusher's work), or
//! the front end has been idle for `writeback_idle_ms`. Above `writeback_threshold_percent`,
//! a proportional controller (bcache's model): the excess over the threshold is written back
//! over about `SETTLE_S`, so under a steady load the dirty level settles where writeback
//! matches the dirtying rate. Between `HIGH_WATER_PERCENT` and `FULL_SPEED_PERCENT` of the cache
//! dirty, the rate ramps up to full speed, so a load the controller cannot settle meets a
//! steadily faster writeback rather than a full log (the cliff bcache and Open CAS users hit).
//! Below the threshold, nothing: overwrites of a hot working set are absorbed, not written back
//! again and again.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use parking_lot::MutexGuard;

use super::flusher::wait_durable;
use super::inflight;
use super::reclaim;
use super::state::State;
use super::tunables;
use super::Inner;
use crate::error::{Error, Result};
use crate::format::{crc_block, BLOCK_SIZE_BYTES, FULL_MASK, SECTOR_SIZE_BYTES};
use crate::io::aligned::AlignedBuf;

const BLOCK: usize = BLOCK_SIZE_BYTES as usize;
const SECTOR: usize = SECTOR_SIZE_BYTES as usize;
/// Above the threshold, the excess is written back over about this many seconds.
const SETTLE_S: u64 = 20;
/// From this share of the cache dirty, the rate ramps up...
const HIGH_WATER_PERCENT: u64 = 70;
/// ...to full speed here.
const FULL_SPEED_PERCENT: u64 = 90;
/// The slowest background rate above the threshold: 1 MiB/s.
const RATE_MIN_BLOCKS_PER_S: u64 = 256;
/// How often an idle writeback thread looks at the dirty level.
const POLL: Duration = Duration::from_millis(100);
/// The writeback position is persisted at most this often (and at close).
const PERSIST_EVERY: Duration = Duration::from_secs(1);
/// A drain fails once writeback has kept failing for this long (it retries meanwhile).
const DRAIN_ERROR_PATIENCE: Duration = Duration::from_secs(3);
/// Longest run of adjacent blocks read or written in one IO.
const RUN_BLOCKS_MAX: usize = 256;
/// Dirty blocks this close together in the log are read with one IO, gaps included: one
/// sequential read of the cache device costs less than many small ones.
const READ_GAP_BLOCKS_MAX: u32 = 32;

/// A dirty block taken for writeback.
#[derive(Clone, Copy, Debug)]
struct WbBlock {
    cache_block: u32,
    lba: u64,
    dirty_mask: u8,
    crc: u32,
    /// Where its data is in the batch buffer (in write order).
    buf_index: usize,
}

/// The writeback thread's reusable memory.
pub struct WritebackBuffers {
    data: AlignedBuf,
    /// A read span with gaps lands here first.
    span: AlignedBuf,
    blocks: Vec<WbBlock>,
    slots: Vec<u32>,
    /// Indexes into `blocks` in write order.
    order: Vec<usize>,
    ios: Vec<WbIo>,
}

impl WritebackBuffers {
    pub fn new(batch_blocks_max: usize) -> WritebackBuffers {
        WritebackBuffers {
            data: AlignedBuf::new(batch_blocks_max * BLOCK),
            span: AlignedBuf::new(RUN_BLOCKS_MAX * BLOCK),
            blocks: Vec::with_capacity(batch_blocks_max),
            slots: Vec::new(),
            order: Vec::with_capacity(batch_blocks_max),
            ios: Vec::with_capacity(batch_blocks_max),
        }
    }
}

/// How the next batch should run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plan {
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
    last_persist: Instant,
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

fn next_batch_plan(inner: &Inner, st: &State, pacer: &mut Pacer, now: Instant) -> Plan {
    let batch_max = inner.tunables.get(tunables::WRITEBACK_BATCH_BLOCKS) as usize;
    // Is the front end idle?
    let ops = st.counters.reads + st.counters.writes;
    if ops != pacer.last_ops {
        pacer.last_ops = ops;
        pacer.last_ops_change = now;
    }
    if st.dirty_blocks == 0 {
        return Plan::Wait;
    }
    let full = Plan::Batch {
        blocks: batch_max,
        rate_blocks_per_s: None,
    };
    // Outside write-back mode dirty blocks are leftovers of it: write them back now. Writers
    // waiting for room in a ring that is out of free segments need writeback; writers waiting
    // for a RAM buffer need the flusher, and writeback would only compete with it.
    if st.drain_requests > 0
        || (st.space_waiters > 0 && reclaim::under_pressure(st))
        || inner.tunables.get(tunables::CACHE_MODE) != tunables::MODE_WRITE_BACK
    {
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
    if st.dirty_blocks <= threshold_blocks {
        return Plan::Wait;
    }
    let full_blocks = cache_blocks * FULL_SPEED_PERCENT / 100;
    if st.dirty_blocks >= full_blocks {
        return capped(None);
    }
    let excess = st.dirty_blocks - threshold_blocks;
    let mut rate = (excess / SETTLE_S).max(RATE_MIN_BLOCKS_PER_S);
    let high_blocks = cache_blocks * HIGH_WATER_PERCENT / 100;
    if st.dirty_blocks > high_blocks {
        // Linear from the settling rate to "the whole cache in a second" at full speed.
        let f = (st.dirty_blocks - high_blocks) as f64 / (full_blocks - high_blocks).max(1) as f64;
        rate += (f * cache_blocks as f64) as u64;
    }
    capped(Some(rate))
}

/// The writeback thread's loop.
///
/// It runs at the same CPU priority as request handling: its rate policy, not the scheduler,
/// decides how much it does. (At nice 10, on a CPU-bound machine with 64 busy connection
/// threads, it got 6-8% of a CPU while the log filled; the relocator then moved dirty blocks
/// instead, at a higher cost, and throughput fell from ~11K to ~2K requests/s with requests
/// waiting 4.6 s: see docs/RELIABILITY.md, "Load".)
pub fn run(inner: &Inner) {
    let batch_max = tunables::SPECS[tunables::WRITEBACK_BATCH_BLOCKS].max_value() as usize;
    let mut bufs = WritebackBuffers::new(batch_max);
    let mut pacer = Pacer::new(Instant::now());
    let mut st = inner.state.lock();
    loop {
        if st.failed.is_some() || st.closing {
            break;
        }
        let now = Instant::now();
        let plan = next_batch_plan(inner, &st, &mut pacer, now);
        st.writeback_rate_blocks_per_s = match plan {
            Plan::Wait => 0,
            Plan::Batch {
                rate_blocks_per_s, ..
            } => rate_blocks_per_s.unwrap_or(u64::MAX),
        };
        let Plan::Batch {
            blocks,
            rate_blocks_per_s,
        } = plan
        else {
            maybe_persist(inner, &mut st, &mut pacer, now);
            inner.writeback_wake.wait_for(&mut st, POLL);
            continue;
        };
        let started = Instant::now();
        let (guard, res) = batch(inner, st, &mut bufs, blocks);
        st = guard;
        let done = match res {
            Ok(n) => n,
            Err(e) => {
                st.writeback_error = Some(e.to_string());
                inner.progress.notify_all();
                // The backing device failed; try again later rather than spin.
                inner
                    .writeback_wake
                    .wait_for(&mut st, Duration::from_secs(1));
                continue;
            }
        };
        maybe_persist(inner, &mut st, &mut pacer, Instant::now());
        if done == 0 {
            // Dirty blocks exist but none is durable in the log yet: ask for a sync.
            if st.dirty_blocks > 0 {
                st.sync_wanted_seq = st.sync_wanted_seq.max(st.written_seq);
                inner.flusher_wake.notify_one();
            }
            inner.writeback_wake.wait_for(&mut st, POLL / 10);
            continue;
        }
        if let Some(rate) = rate_blocks_per_s {
            let budget = Duration::from_secs_f64(done as f64 / rate as f64);
            let deadline = started + budget;
            while Instant::now() < deadline && !st.closing && st.drain_requests == 0 {
                inner.writeback_wake.wait_until(&mut st, deadline);
            }
        }
    }
    // Record the final position in the close checkpoint (done by close, which reads it).
    drop(st);
}

/// Persists the writeback position if it moved and the last write was a while ago (or a
/// drain waits for it).
fn maybe_persist(inner: &Inner, st: &mut MutexGuard<'_, State>, pacer: &mut Pacer, now: Instant) {
    let pos = writeback_position(st);
    if pos <= st.writeback_seq {
        return;
    }
    if now.saturating_duration_since(pacer.last_persist) < PERSIST_EVERY && st.drain_requests == 0 {
        return;
    }
    pacer.last_persist = now;
    if persist_position(inner, st, pos).is_err() {
        // `persist_position` recorded the failure; the engine stops.
    }
}

/// The newest chunk sequence recovery may replay as clean: every chunk before the oldest
/// segment that still holds dirty blocks, or whose blocks died by writes not yet durable.
/// (A dirty block killed by an unsynced overwrite is dirty again if a crash loses that
/// overwrite, so its segment must hold the position back.) Never past the durable log: a new
/// session's chunks reuse sequence numbers after a discarded tail.
pub fn writeback_position(st: &State) -> u64 {
    // Nor past a zero range not yet applied to the backing device: recovery re-applies only
    // those after the position.
    let limit = st
        .zero_pending_seq
        .map_or(st.synced_seq, |s| st.synced_seq.min(s - 1));
    let mut id = st.head_segment_id;
    while id < st.next_segment_id {
        let seg = &st.segments[st.geo.slot_of(id) as usize];
        if seg.dirty_blocks > 0 || seg.dead_by_seq > st.synced_seq {
            return seg.first_seq.saturating_sub(1).min(limit);
        }
        id += 1;
    }
    limit
}

fn persist_position(inner: &Inner, st: &mut MutexGuard<'_, State>, pos: u64) -> Result<()> {
    let res = MutexGuard::unlocked(st, || {
        inner
            .superblock
            .update(|s| s.checkpoint.writeback_seq = s.checkpoint.writeback_seq.max(pos))
    });
    match res {
        Ok(()) => {
            st.writeback_seq = st.writeback_seq.max(pos);
            st.counters.superblock_writes += 1;
            Ok(())
        }
        Err(e) => {
            if st.failed.is_none() {
                st.failed = Some(e.to_string());
            }
            st.counters.io_errors += 1;
            inner.progress.notify_all();
            Err(e)
        }
    }
}

/// Takes dirty blocks from durable chunks in log order, pinning their segments.
fn collect(inner: &Inner, st: &State, bufs: &mut WritebackBuffers, max_blocks: usize) {
    bufs.blocks.clear();
    bufs.slots.clear();
    let mut id = st.head_segment_id;
    while id < st.next_segment_id && bufs.blocks.len() < max_blocks {
        let slot = inner.geo.slot_of(id);
        let seg = &st.segments[slot as usize];
        id += 1;
        if seg.dirty_blocks == 0 {
            continue;
        }
        let before = bufs.blocks.len();
        for b in 0..seg.synced_blocks {
            if bufs.blocks.len() == max_blocks {
                break;
            }
            let c = inner.geo.cache_block(slot, b);
            let dirty_mask = st.dirty_mask[c as usize];
            if dirty_mask == 0 {
                continue;
            }
            let lba = st.index.lba_of(c).expect("a dirty block is in the index");
            bufs.blocks.push(WbBlock {
                cache_block: c,
                lba,
                dirty_mask,
                crc: st.data_crc[c as usize],
                buf_index: 0,
            });
        }
        if bufs.blocks.len() > before {
            inner.pins[slot as usize].fetch_add(1, Ordering::AcqRel);
            bufs.slots.push(slot);
        }
    }
}

/// One batch: collect, read, write, sync, mark clean. Returns the blocks written back.
fn batch<'a>(
    inner: &'a Inner,
    mut st: MutexGuard<'a, State>,
    bufs: &mut WritebackBuffers,
    max_blocks: usize,
) -> (MutexGuard<'a, State>, Result<u64>) {
    let max_blocks = max_blocks.min(bufs.data.len() / BLOCK);
    // A zero range must not be overtaken by stale data (see `Inner::backing_order`).
    let order = MutexGuard::unlocked(&mut st, || inner.backing_order.lock());
    collect(inner, &st, bufs, max_blocks);
    if bufs.blocks.is_empty() {
        return (st, Ok(0));
    }
    st.writeback_busy = true;
    drop(st);
    let res = copy_out(inner, bufs);
    let mut st = inner.state.lock();
    drop(order);
    for &slot in &bufs.slots {
        inner.pins[slot as usize].fetch_sub(1, Ordering::AcqRel);
    }
    st.writeback_busy = false;
    let (bad, bytes) = match res {
        Ok(v) => v,
        Err(e) => {
            st.counters.io_errors += 1;
            return (st, Err(e));
        }
    };
    let mut cleaned = 0u64;
    for (i, b) in bufs.blocks.iter().enumerate() {
        if bad.contains(&i) {
            continue;
        }
        let c = b.cache_block;
        if st.index.lba_of(c) == Some(b.lba) && st.dirty_mask[c as usize] == b.dirty_mask {
            st.set_dirty_mask(c, 0);
            cleaned += 1;
        }
    }
    st.counters.writeback_blocks += cleaned;
    st.counters.writeback_bytes += bytes;
    st.counters.writeback_batches += 1;
    if bad.is_empty() {
        st.writeback_error = None;
    } else {
        st.counters.checksum_errors += bad.len() as u64;
        let lba = bufs.blocks[bad[0]].lba;
        st.writeback_error = Some(format!(
            "{} dirty block(s) failed their checksum on the cache device (first: block {lba}); they stay dirty and are not written back",
            bad.len()
        ));
    }
    // Clean blocks may be what the relocator needs to make room; drains watch progress.
    inner.flusher_wake.notify_one();
    inner.progress.notify_all();
    (st, Ok(cleaned))
}

/// Reads the batch from the cache device, verifies it and writes it to the backing device,
/// then syncs that. Returns the indexes of blocks that failed their checksum (not written)
/// and the bytes written.
fn copy_out(inner: &Inner, bufs: &mut WritebackBuffers) -> Result<(Vec<usize>, u64)> {
    let geo = &inner.geo;
    // Read in cache order: the log is sequential, so blocks of a segment are close together.
    bufs.blocks.sort_unstable_by_key(|b| b.cache_block);
    // Each block's data lands at its place in write order, so that a run of blocks adjacent on
    // the backing device is contiguous in memory and goes out as one IO from `data` itself.
    // Sorted: backing order. Unsorted (the benchmarks' baseline): cache-block order, which is
    // log order unless the batch spans the ring's wrap.
    bufs.order.clear();
    bufs.order.extend(0..bufs.blocks.len());
    if inner.writeback_sorted {
        let blocks = &bufs.blocks;
        bufs.order.sort_unstable_by_key(|&k| blocks[k].lba);
    }
    for (pos, &k) in bufs.order.iter().enumerate() {
        bufs.blocks[k].buf_index = pos;
    }
    let mut i = 0;
    while i < bufs.blocks.len() {
        let first = bufs.blocks[i].cache_block;
        let mut j = i + 1;
        while j < bufs.blocks.len() {
            let c = bufs.blocks[j].cache_block;
            let near = c - bufs.blocks[j - 1].cache_block <= READ_GAP_BLOCKS_MAX;
            if !near || (c - first) as usize >= RUN_BLOCKS_MAX {
                break;
            }
            j += 1;
        }
        let span_blocks = (bufs.blocks[j - 1].cache_block - first + 1) as usize;
        let off = geo.block_offset(first);
        let read_err = |e| Error::io(format!("writeback reading the cache at offset {off}"), e);
        let to = bufs.blocks[i].buf_index;
        let in_place = span_blocks == j - i
            && bufs.blocks[i..j]
                .iter()
                .enumerate()
                .all(|(k, b)| b.buf_index == to + k);
        if in_place {
            inner
                .cache
                .read_at(&mut bufs.data[to * BLOCK..(to + j - i) * BLOCK], off)
                .map_err(read_err)?;
        } else {
            inner
                .cache
                .read_at(&mut bufs.span[..span_blocks * BLOCK], off)
                .map_err(read_err)?;
            for b in &bufs.blocks[i..j] {
                let at = (b.cache_block - first) as usize * BLOCK;
                let dst = b.buf_index * BLOCK;
                bufs.data[dst..dst + BLOCK].copy_from_slice(&bufs.span[at..at + BLOCK]);
            }
        }
        i = j;
    }
    let mut bad = Vec::new();
    for (k, b) in bufs.blocks.iter().enumerate() {
        let data = &bufs.data[b.buf_index * BLOCK..(b.buf_index + 1) * BLOCK];
        if crc_block(geo.format_id, b.lba, data) != b.crc {
            bad.push(k);
        }
    }
    plan_ios(inner, bufs, &bad);
    // Manual mode (the simulation tests) keeps one IO in flight, so a seeded run replays the
    // same backing-device IO sequence.
    let depth = if inner.manual {
        1
    } else {
        inner.tunables.get(tunables::WRITEBACK_IO_DEPTH) as usize
    };
    let reconnects = inner.backing.reconnects();
    let bytes = write_ios(inner, &bufs.data, &bufs.ios, depth)?;
    inner
        .backing
        .flush()
        .map_err(|e| Error::io(format!("syncing {}", inner.backing.describe()), e))?;
    if inner.backing.reconnects() != reconnects {
        // Some of this batch went over a connection that broke: the server may have lost
        // them even though the flush succeeded. The blocks stay dirty; the batch runs again.
        return Err(Error::io(
            format!("writeback to {}", inner.backing.describe()),
            std::io::Error::other(
                "the backing device reconnected during the batch; writing it again",
            ),
        ));
    }
    Ok((bad, bytes))
}

/// One write to the backing device: `len` bytes of the batch buffer from `start`.
#[derive(Clone, Copy, Debug)]
struct WbIo {
    offset_bytes: u64,
    start: usize,
    len: usize,
}

/// The writes of a batch, in write order: runs of whole dirty blocks adjacent on the backing
/// device merge into one IO (sorted mode only); a partly dirty block writes only its dirty
/// sectors (the others are not in the cache, or already on the backing device).
fn plan_ios(inner: &Inner, bufs: &mut WritebackBuffers, bad: &[usize]) {
    let run_blocks_max = if inner.writeback_sorted {
        RUN_BLOCKS_MAX
    } else {
        1
    };
    let blocks = &bufs.blocks;
    let at = |pos: usize| blocks[bufs.order[pos]];
    let skip = |pos: usize| bad.contains(&bufs.order[pos]);
    bufs.ios.clear();
    let mut pos = 0;
    while pos < bufs.order.len() {
        let first = at(pos);
        if skip(pos) {
            pos += 1;
            continue;
        }
        if first.dirty_mask != FULL_MASK {
            let mut s = 0usize;
            while s < 8 {
                if first.dirty_mask & (1 << s) == 0 {
                    s += 1;
                    continue;
                }
                let mut e = s + 1;
                while e < 8 && first.dirty_mask & (1 << e) != 0 {
                    e += 1;
                }
                bufs.ios.push(WbIo {
                    offset_bytes: first.lba * BLOCK_SIZE_BYTES + (s * SECTOR) as u64,
                    start: pos * BLOCK + s * SECTOR,
                    len: (e - s) * SECTOR,
                });
                s = e;
            }
            pos += 1;
            continue;
        }
        let mut end = pos + 1;
        while end < bufs.order.len() && end - pos < run_blocks_max {
            let b = at(end);
            if skip(end) || b.dirty_mask != FULL_MASK || b.lba != at(end - 1).lba + 1 {
                break;
            }
            end += 1;
        }
        bufs.ios.push(WbIo {
            offset_bytes: first.lba * BLOCK_SIZE_BYTES,
            start: pos * BLOCK,
            len: (end - pos) * BLOCK,
        });
        pos = end;
    }
}

/// Issues `ios` with up to `depth` in flight (see `inflight`). Returns the bytes written; on an
/// error, the first one (the rest of the batch is abandoned; it stays dirty).
fn write_ios(inner: &Inner, data: &[u8], ios: &[WbIo], depth: usize) -> Result<u64> {
    inflight::run(ios, depth, |io| {
        inner
            .backing
            .write_at(&data[io.start..io.start + io.len], io.offset_bytes)
            .map_err(|e| {
                Error::io(
                    format!(
                        "writeback writing the backing device at {}",
                        io.offset_bytes
                    ),
                    e,
                )
            })
    })?;
    Ok(ios.iter().map(|io| io.len as u64).sum())
}

/// Progress of a drain, for a progress bar.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DrainProgress {
    pub dirty_blocks_at_start: u64,
    pub dirty_blocks: u64,
    pub written_back_blocks: u64,
}

/// Writes back everything: returns once no block is dirty and the backing device is synced,
/// calling `progress` a few times a second. Writes that arrive meanwhile are drained too.
pub fn drain(inner: &Inner, mut progress: impl FnMut(DrainProgress)) -> Result<()> {
    let (start, wb0) = {
        let mut st = inner.state.lock();
        st.drain_requests += 1;
        (st.dirty_blocks, st.counters.writeback_blocks)
    };
    let res = (|| {
        let mut failing_since: Option<Instant> = None;
        let mut bufs = inner.manual.then(|| {
            WritebackBuffers::new(inner.tunables.get(tunables::WRITEBACK_BATCH_BLOCKS) as usize)
        });
        loop {
            // Writeback takes only durable chunks: seal and sync what is in RAM.
            wait_durable(inner)?;
            let mut st = inner.state.lock();
            let p = DrainProgress {
                dirty_blocks_at_start: start,
                dirty_blocks: st.dirty_blocks,
                written_back_blocks: st.counters.writeback_blocks - wb0,
            };
            progress(p);
            if st.dirty_blocks == 0 {
                let pos = writeback_position(&st);
                if pos > st.writeback_seq {
                    persist_position(inner, &mut st, pos)?;
                }
                return Ok(());
            }
            // Writeback retries a failed batch; give up only once it has kept failing for a
            // while, so a transient backing error (a network blip) does not fail the drain.
            match &st.writeback_error {
                Some(e) => {
                    let since = *failing_since.get_or_insert_with(Instant::now);
                    if bufs.is_some() || since.elapsed() >= DRAIN_ERROR_PATIENCE {
                        return Err(Error::Io {
                            what: "drain stopped: writeback failed".into(),
                            source: std::io::Error::other(e.clone()),
                        });
                    }
                }
                None => failing_since = None,
            }
            if let Some(bufs) = bufs.as_mut() {
                let batch_blocks = inner.tunables.get(tunables::WRITEBACK_BATCH_BLOCKS) as usize;
                let (st2, res) = batch(inner, st, bufs, batch_blocks);
                if let Err(e) = res {
                    drop(st2);
                    return Err(e);
                }
                continue;
            }
            inner.writeback_wake.notify_one();
            inner.progress.wait_for(&mut st, Duration::from_millis(250));
            if let Some(m) = &st.failed {
                return Err(Error::Failed(m.clone()));
            }
        }
    })();
    inner.state.lock().drain_requests -= 1;
    res
}

/// Manual mode: one writeback batch of up to `max_blocks`, ignoring the policy. Returns the
/// blocks written back.
pub fn step(inner: &Inner, max_blocks: usize) -> Result<u64> {
    let mut bufs = WritebackBuffers::new(max_blocks);
    let st = inner.state.lock();
    let (mut st, res) = batch(inner, st, &mut bufs, max_blocks);
    let n = res?;
    let pos = writeback_position(&st);
    if pos > st.writeback_seq {
        persist_position(inner, &mut st, pos)?;
    }
    Ok(n)
}
