//! One writeback batch, in order (and why):
//! 1. Under the lock, take dirty blocks in log order from the oldest segments, only from chunks
//!    that are durable on the cache device (a chunk a crash may still lose must not reach the
//!    backing device first), and pin their segments so they cannot be reclaimed.
//! 2. Without the lock, read them from the cache device in runs of adjacent cache blocks and
//!    verify their checksums: corrupt data is never written back.
//! 3. Write them to the backing device in backing-address order, runs of adjacent blocks merged,
//!    up to `writeback_io_depth` writes in flight; then sync it (both again if another backing
//!    sync failed in between: it may have dropped them).
//! 4. Under the lock, mark clean each block the index still points at with the same dirty
//!    sectors (a block overwritten meanwhile is dead; its newer copy stays dirty).
//!
//! Runs on the writeback thread, or inline in manual mode (`drain`, `writeback_step`).

use std::sync::atomic::Ordering;

use crate::io::BlockDevice as _;
use crate::sync::MutexGuard;

use super::foreground::{ReadActivity, WRITEBACK_READ_YIELDING_BLOCKS_MAX};
use super::inflight;
use crate::error::{Error, Result};
use crate::format::{BLOCK_SIZE_BYTES, FULL_MASK, SECTOR_SIZE_BYTES};
use crate::inner::{fail_cache_held, Inner};
use crate::io::aligned::AlignedBuf;
use crate::state::State;

const BLOCK: usize = BLOCK_SIZE_BYTES as usize;
const SECTOR: usize = SECTOR_SIZE_BYTES as usize;
/// Longest run of adjacent blocks read or written in one IO.
const RUN_BLOCKS_MAX: usize = 256;
/// Dirty blocks this close together in the log are read with one IO, gaps included: one
/// sequential read of the cache device costs less than many small ones. Less where the device
/// says a gap is worth less (`BlockDevice::read_gap_bytes_max`; memory: none).
const READ_GAP_BLOCKS_MAX: u32 = 32;
/// Times a batch is written and synced while other backing syncs keep failing in between
/// before it gives up (the blocks stay dirty; writeback retries later).
const SYNC_TRIES: u32 = 3;

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
    /// The helpers that keep `writeback_io_depth` writes in flight, kept across batches.
    io: inflight::Helpers,
    /// Whether foreground reads came in since the last batch (its cache reads then yield).
    reads: ReadActivity,
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
            io: inflight::Helpers::default(),
            reads: ReadActivity::default(),
        }
    }
}

/// Takes dirty blocks from durable chunks in log order, pinning their segments. In flush-epoch
/// order (`State::ordered`) only from the oldest epoch holding dirty blocks, and never past a
/// zero range not yet applied: the batch is then a subset of one epoch.
fn collect(inner: &Inner, st: &State, bufs: &mut WritebackBuffers, max_blocks: usize) {
    bufs.blocks.clear();
    bufs.slots.clear();
    let ordered = st.ordered();
    let barrier = if ordered {
        st.writeback.zero_pending_pos()
    } else {
        None
    };
    'segments: for (seg_id, slot, seg) in st.ring.in_log() {
        if bufs.blocks.len() >= max_blocks {
            break;
        }
        let started = !bufs.blocks.is_empty();
        if seg.dirty_blocks == 0 && !(ordered && started) {
            continue;
        }
        let before = bufs.blocks.len();
        for b in 0..seg.synced_blocks {
            if bufs.blocks.len() == max_blocks {
                break;
            }
            let c = inner.geo.cache_block(slot, b);
            if ordered {
                // The next epoch, or a zero range it must not overtake, starts here.
                let at_barrier = barrier.is_some_and(|pos| (seg_id, b) >= pos);
                if at_barrier || (!bufs.blocks.is_empty() && st.epochs.is_start(c)) {
                    if bufs.blocks.len() > before {
                        inner.pins[slot as usize].fetch_add(1, Ordering::AcqRel);
                        bufs.slots.push(slot);
                    }
                    break 'segments;
                }
            }
            let dirty_mask = st.blocks.dirty(c);
            if dirty_mask == 0 {
                continue;
            }
            let lba = st
                .blocks
                .dirty_lba(c)
                .expect("a dirty block is in the index or a shadow");
            bufs.blocks.push(WbBlock {
                cache_block: c,
                lba,
                dirty_mask,
                crc: st.blocks.crc(c),
                buf_index: 0,
            });
        }
        if bufs.blocks.len() > before {
            inner.pins[slot as usize].fetch_add(1, Ordering::AcqRel);
            bufs.slots.push(slot);
        }
    }
    debug_assert!(
        !ordered || {
            let mut lbas: Vec<u64> = bufs.blocks.iter().map(|b| b.lba).collect();
            lbas.sort_unstable();
            lbas.windows(2).all(|w| w[0] != w[1])
        },
        "a batch in epoch order holds one copy per block"
    );
}

/// One batch: collect, read, write, sync, mark clean. Returns the blocks written back.
pub fn batch<'a>(
    inner: &'a Inner,
    mut st: MutexGuard<'a, State>,
    bufs: &mut WritebackBuffers,
    max_blocks: usize,
) -> (MutexGuard<'a, State>, Result<u64>) {
    let max_blocks = max_blocks.min(bufs.data.len() / BLOCK);
    // A zero range must not be overtaken by stale data (see `Inner::backing_order`).
    let order = crate::sync::unlocked(&mut st, || inner.backing_order.lock());
    if let Err(e) = st.health.check_failed() {
        // The cache device failed meanwhile: the backing device may be serving alone now
        // (`path::alone`), and a stale dirty copy must not land on what it wrote.
        drop(order);
        return (st, Err(e));
    }
    collect(inner, &st, bufs, max_blocks);
    if bufs.blocks.is_empty() {
        return (st, Ok(0));
    }
    if let Some(floor) = st.epoch_floor().filter(|_| st.ordered()) {
        // The earlier epochs are all on the backing device: say so before this one starts
        // landing there (see `State::epoch_floor`).
        let limit = st
            .writeback
            .zero_pending_seq()
            .map_or(st.seqs.synced(), |z| st.seqs.synced().min(z - 1));
        if let Err(e) = super::drain::persist_position(inner, &mut st, floor.min(limit)) {
            for &slot in &bufs.slots {
                inner.pins[slot as usize].fetch_sub(1, Ordering::AcqRel);
            }
            drop(order);
            return (st, Err(e));
        }
    }
    // Foreground reads coming in: read the batch off the cache device in smaller pieces, so
    // one of them waits behind at most one (see `foreground`).
    let read_blocks_max = if bufs.reads.active(&st) {
        WRITEBACK_READ_YIELDING_BLOCKS_MAX
    } else {
        RUN_BLOCKS_MAX
    };
    st.writeback.set_busy(true);
    drop(st);
    let res = copy_out(inner, bufs, read_blocks_max);
    let mut st = inner.state.lock();
    drop(order);
    for &slot in &bufs.slots {
        inner.pins[slot as usize].fetch_sub(1, Ordering::AcqRel);
    }
    st.writeback.set_busy(false);
    let (bad, bytes) = match res {
        Ok(v) => v,
        Err(CopyError::CacheRead(e)) if st.ordered() => {
            // The only copy of these dirty blocks cannot be read, and in flush-epoch order
            // nothing newer may pass them: retrying would leave a write-zeroes waiting for
            // them for ever (cache-loss sim seed 1201). As a checksum failure below: the
            // cache device failed, and the engine goes on from the backing device alone.
            fail_cache_held(inner, &mut st, &e);
            return (st, Err(e));
        }
        Err(CopyError::BackingSync(e)) => {
            st.counters.io_errors += 1;
            // The sync covered every write the backing device had: a bypass write no earlier
            // sync covered may be gone with it (`state/lost.rs`).
            st.backing_writes_lost(e.to_string(), inner.backing.failed_syncs());
            return (st, Err(e));
        }
        Err(CopyError::CacheRead(e) | CopyError::Backing(e)) => {
            st.counters.io_errors += 1;
            return (st, Err(e));
        }
    };
    let now = std::time::SystemTime::now();
    let as_of_before = st.backing_consistent_as_of(now);
    let mut cleaned = 0u64;
    for (i, b) in bufs.blocks.iter().enumerate() {
        if bad.contains(&i) {
            continue;
        }
        let c = b.cache_block;
        if st.blocks.shadow_lba(c) == Some(b.lba) {
            // A shadow's sectors never change (its newer copy is elsewhere), but a block taken
            // while live may have had its clean sectors marked dirty again by a failed backing
            // sync (`state/lost.rs`) and only then been replaced: this batch did not write
            // those, so the shadow stays for a later batch (long sweep, cache-loss seed 138563).
            let dirty = st.blocks.dirty(c);
            assert_eq!(
                dirty & b.dirty_mask,
                b.dirty_mask,
                "a shadow lost dirty sectors while written back"
            );
            if dirty == b.dirty_mask {
                st.clean_shadow(c);
                cleaned += 1;
            }
        } else if st.blocks.lba_of(c) == Some(b.lba) && st.blocks.dirty(c) == b.dirty_mask {
            debug_assert_eq!(
                b.dirty_mask & !st.blocks.valid(c),
                0,
                "dirty sectors not valid"
            );
            st.set_dirty_mask(c, 0);
            cleaned += 1;
        }
    }
    st.counters.writeback_blocks += cleaned;
    st.counters.writeback_bytes += bytes;
    st.counters.writeback_batches += 1;
    if bad.is_empty() {
        st.writeback.set_error(None);
    } else {
        st.counters.checksum_errors += bad.len() as u64;
        let lba = bufs.blocks[bad[0]].lba;
        if st.ordered() {
            // Their newest data is gone, and in flush-epoch order nothing newer may reach the
            // backing device before them: writeback could never go on, the log would fill and
            // writers would wait forever. Fail, saying what is lost and what to do.
            // A cache-device failure: the engine goes on from the backing device alone, these
            // blocks (and every other dirty one) lost (`path::alone`).
            let e = Error::Corruption(format!(
                "{} dirty block(s) could not be read back from the cache device (first: block {lba}): their newest data is lost, and writeback in flush-epoch order cannot pass them",
                bad.len()
            ));
            fail_cache_held(inner, &mut st, &e);
        } else {
            st.writeback.set_error(Some(format!(
                "{} dirty block(s) failed their checksum on the cache device (first: block {lba}); they stay dirty and are not written back",
                bad.len()
            )));
        }
    }
    if st.backing_consistent_as_of(now) != as_of_before {
        // An epoch is complete on the backing device: say so on its label.
        super::record::write(inner, &mut st);
    }
    // Clean blocks may be what the relocator needs to make room; drains watch progress.
    inner.flusher_wake.notify_one();
    inner.progress.notify_all();
    (st, Ok(cleaned))
}

/// Reads the batch from the cache device (no read spans more than `read_blocks_max` blocks),
/// verifies it and writes it to the backing device, then syncs that. Returns the indexes of
/// blocks that failed their checksum (not written) and the bytes written.
fn copy_out(
    inner: &Inner,
    bufs: &mut WritebackBuffers,
    read_blocks_max: usize,
) -> std::result::Result<(Vec<usize>, u64), CopyError> {
    debug_assert!((1..=RUN_BLOCKS_MAX).contains(&read_blocks_max));
    let geo = &inner.geo;
    // The log may reuse a segment's place on the cache device only once writeback is done with
    // its blocks: `collect` pinned every segment of the batch, and `reclaim` passes no pinned
    // segment, until this returns (the backing writes below are sent from the batch buffer).
    debug_assert!(
        bufs.blocks.iter().all(|b| {
            let (slot, _) = geo.split(b.cache_block);
            inner.pins[slot as usize].load(Ordering::Acquire) > 0
        }),
        "writeback reads a block whose segment is not pinned"
    );
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
    // Blocks `gap_blocks_max + 1` apart or closer are read in one span (1: only adjacent ones).
    let gap_blocks_max = (inner.cache.read_gap_bytes_max() / BLOCK_SIZE_BYTES)
        .min(u64::from(READ_GAP_BLOCKS_MAX)) as u32;
    let mut i = 0;
    while i < bufs.blocks.len() {
        let first = bufs.blocks[i].cache_block;
        let mut j = i + 1;
        while j < bufs.blocks.len() {
            let c = bufs.blocks[j].cache_block;
            let near = c - bufs.blocks[j - 1].cache_block <= gap_blocks_max + 1;
            if !near || (c - first) as usize >= read_blocks_max {
                break;
            }
            j += 1;
        }
        let span_blocks = (bufs.blocks[j - 1].cache_block - first + 1) as usize;
        let off = geo.block_offset(first);
        let read_err = |e| {
            CopyError::CacheRead(Error::io(
                format!("writeback reading the cache at offset {off}"),
                e,
            ))
        };
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
        } else if gap_blocks_max == 0 {
            // A device whose IOs cost nothing but their copy: each block straight to its place
            // (through the span it would be copied twice).
            debug_assert_eq!(span_blocks, j - i, "a span with gaps on a gapless device");
            for b in &bufs.blocks[i..j] {
                let dst = b.buf_index * BLOCK;
                inner
                    .cache
                    .read_at(
                        &mut bufs.data[dst..dst + BLOCK],
                        geo.block_offset(b.cache_block),
                    )
                    .map_err(|e| {
                        CopyError::CacheRead(Error::io(
                            format!(
                                "writeback reading the cache at offset {}",
                                geo.block_offset(b.cache_block)
                            ),
                            e,
                        ))
                    })?;
            }
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
        if !geo.block_verifies(b.lba, data, b.crc) {
            bad.push(k);
        }
    }
    plan_ios(inner, bufs, &bad);
    let depth = inner.drive.writeback_io_depth(&inner.tunables);
    // Counted before a failed sync returns, and a successful sync returns once every sync in
    // flight beside it has ended (`backing.rs`): a failure that could have dropped the batch
    // shows here even if its thread has not handled it yet.
    let failed_syncs = || inner.backing.failed_syncs();
    for _ in 0..SYNC_TRIES {
        let reconnects = inner.backing.reconnects();
        let losses = failed_syncs();
        let bytes = write_ios(inner, &mut bufs.io, &bufs.data, &bufs.ios, depth)
            .map_err(CopyError::Backing)?;
        inner.backing.flush().map_err(|e| {
            CopyError::BackingSync(Error::io(
                format!("syncing {}", inner.backing.describe()),
                e,
            ))
        })?;
        if inner.backing.reconnects() != reconnects {
            // Some of this batch went over a connection that broke: the server may have lost
            // them even though the flush succeeded. The blocks stay dirty; the batch runs
            // again.
            return Err(CopyError::BackingSync(Error::io(
                format!("writeback to {}", inner.backing.describe()),
                std::io::Error::other(
                    "the backing device reconnected during the batch; writing it again",
                ),
            )));
        }
        if failed_syncs() == losses {
            return Ok((bad, bytes));
        }
        // Another thread's backing sync failed between this batch's writes and its sync. A
        // device may drop unsynced writes with a failed sync and report success to the next
        // one (Linux's page cache after a writeback error), so this sync does not vouch for
        // the batch: marked clean on its strength, a block a failed sync had dropped read
        // its old data after a power cut (sim seed 120988: the rewrite of a lost
        // write-through FUA write, dropped by the flusher's failed sync). Write it again.
        inner.state.lock().counters.writeback_written_again += 1;
    }
    Err(CopyError::Backing(Error::io(
        format!("writeback to {}", inner.backing.describe()),
        std::io::Error::other(format!(
            "other syncs of it failed each time while the batch was being made durable \
             ({SYNC_TRIES} tries); the blocks stay dirty"
        )),
    )))
}

/// Which device a batch's copy failed on: a read of the cache device is that device failing;
/// the rest is the backing device's, which writeback retries.
enum CopyError {
    CacheRead(Error),
    Backing(Error),
    /// Its sync failed or found a connection replaced: bypass writes may be lost too.
    BackingSync(Error),
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
fn write_ios(
    inner: &Inner,
    helpers: &mut inflight::Helpers,
    data: &[u8],
    ios: &[WbIo],
    depth: usize,
) -> Result<u64> {
    helpers.run(ios, depth, |io| {
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
