//! The read path: the newest copy of each sector, from RAM, the cache device or the backing
//! device.
//!
//! A request is served a window of up to `WINDOW_BLOCKS` blocks at a time. Under one hold of
//! the state lock the window's blocks are looked up: RAM copies are copied out at once, blocks
//! on the cache device are pinned and planned, and blocks the cache lacks join miss runs.
//! With the lock released, blocks adjacent on the cache device (and in the request) are read
//! with one device IO per run, each block's CRC checked, then the miss runs are read from the
//! backing device (one IO per run) and the sectors partial blocks never held. The window
//! bounds both the lock hold (its RAM copies) and the run scratch buffer.
//!
//! Planned blocks are looked up in the RAM cache (`path::hot`) before the device runs are
//! formed; what it serves is copied from it and unpinned. A read of at most
//! `hot::ADMIT_MAX_REQUEST_BYTES` looks up each block, and each whole block it verified from
//! the device enters the RAM cache. A larger read looks up a run at a time (blocks adjacent
//! on the device and in the request, what one device IO would read): a run whose first block
//! the RAM cache holds is served from it (the rest of the run in one batched lookup, one
//! hold of each shard's lock: `HotTier::get_many`), the stretches it lacks read from the
//! device (one IO each) and stored again; a run whose first block it lacks is read whole from
//! the device (one IO, as without the RAM cache), so a large read of data not in RAM pays one
//! lookup per run. Its verified blocks enter the RAM cache on the run's second touch
//! (`HotTier::second_touch`, `HotTier::put_large`), so a scan read once leaves the RAM cache
//! as it was.

use std::cell::RefCell;
use std::sync::atomic::Ordering;

use crate::error::{Error, Result};
use crate::format::{BLOCK_SIZE_BYTES, FULL_MASK, SECTOR_SIZE_BYTES};
use crate::geometry::{sector_mask, CacheBlock};
use crate::inner::{check_usable, Inner};
use crate::io::aligned::AlignedBuf;
use crate::io::BlockDevice as _;
use crate::io::{recycle_read_ops, ReadOp};
use crate::path::hot::{HotKey, Want, ADMIT_MAX_REQUEST_BYTES};
use crate::path::prefetch::IndexPrefetch;
use crate::promote;
use crate::state::{Location, State};

const BLOCK: usize = BLOCK_SIZE_BYTES as usize;
const SECTOR: usize = SECTOR_SIZE_BYTES as usize;
/// Blocks looked up per lock hold, and the longest cache-device run read as one IO (1 MiB).
pub(crate) const WINDOW_BLOCKS: usize = 256;
/// How far ahead of its lookup a block's index slot is hinted into the CPU cache: a lookup is
/// ~20 ns of work, a miss ~100 ns, so eight in flight hide it.
const PREFETCH_AHEAD_BLOCKS: u64 = 8;

/// A block of the window whose newest copy is on the cache device, pinned until read.
#[derive(Clone, Copy, Debug)]
struct Planned {
    /// Which read of the batch it belongs to (0 outside `read_batch_if_cached`).
    req: u32,
    lba: u64,
    c: CacheBlock,
    /// The id of the segment in `c`'s slot when planned: with `c`, the RAM cache's key (the
    /// pin keeps the slot from being reused before the read ends).
    segment_id: u64,
    crc: u32,
    /// Where the wanted bytes go in the request's buffer, and where they start in the block.
    dst_start: usize,
    in_block: usize,
    len: usize,
    /// Sectors the cache block holds (the rest come from the backing device).
    valid: u8,
    /// A zero range over the block is being applied: the sectors it lacks are zeros.
    zeroing: bool,
    /// Left to the device by a large read whose run the RAM cache served in part (its first
    /// block was there): stored once verified, without waiting for a second touch.
    refill: bool,
}

/// A block of the window (from RAM or the cache device) with sectors the cache never held.
#[derive(Clone, Copy, Debug)]
struct Partial {
    lba: u64,
    dst_start: usize,
    in_block: usize,
    len: usize,
    missing: u8,
    /// A zero range over the block is being applied: the missing sectors are zeros, not the
    /// backing device's (older) data.
    zeroing: bool,
}

/// Per-thread scratch of the read path, allocated once per thread (no allocation per request).
#[derive(Default)]
struct Scratch {
    planned: Vec<Planned>,
    partials: Vec<Partial>,
    /// Byte ranges of the request's buffer to read from the backing device.
    misses: Vec<(usize, usize)>,
    /// Runs of `planned` read with one IO each.
    runs: Vec<Run>,
    /// The batch of the window's reads (kept empty between windows: only its allocation).
    ops: Vec<ReadOp<'static>>,
    /// Each run's IO outcome, by run.
    outcomes: Vec<std::io::Result<()>>,
    /// Aligned buffer for runs whose destination cannot take the device read directly: the
    /// run starting at planned block `i` uses `[i * BLOCK, ..)`.
    run: Option<AlignedBuf>,
    /// A large read's run looked up in the RAM cache at once (`serve_run`), and what it found.
    wants: Vec<Want>,
    hit: Vec<bool>,
}

/// Planned blocks `[from, to)`, adjacent on the cache device and in the request: one IO.
#[derive(Clone, Copy, Debug)]
struct Run {
    from: usize,
    to: usize,
    /// Read straight into the request's buffer (else into the scratch).
    direct: bool,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

pub fn read(inner: &Inner, offset_bytes: u64, buf: &mut [u8]) -> Result<()> {
    let served = with_scratch(|s| read_windows(inner, offset_bytes, buf, false, s))?;
    debug_assert!(served);
    Ok(())
}

/// Reads like [`read`] only when the cache holds every wanted sector (in RAM or on the cache
/// device) and the range fits one window, so no backing-device IO is needed (unless a cached
/// block fails, see `block_failed`): the server serves such reads on a connection's reader.
/// Otherwise returns `Ok(false)` having done nothing (nothing read, pinned or counted).
pub fn read_if_cached(inner: &Inner, offset_bytes: u64, buf: &mut [u8]) -> Result<bool> {
    if buf.len() > WINDOW_BLOCKS * BLOCK {
        return Ok(false);
    }
    with_scratch(|s| read_windows(inner, offset_bytes, buf, true, s))
}

/// One read of a batch ([`read_batch_if_cached`]).
pub struct CachedRead<'a> {
    pub offset_bytes: u64,
    pub buf: &'a mut [u8],
    /// Once the batch returned: what `read_if_cached` would have returned for this read alone.
    pub served: Result<bool>,
}

impl<'a> CachedRead<'a> {
    pub fn new(offset_bytes: u64, buf: &'a mut [u8]) -> CachedRead<'a> {
        CachedRead {
            offset_bytes,
            buf,
            served: Ok(true),
        }
    }
}

/// Serves each read as [`read_if_cached`] would, with the cache-device IOs of all of them
/// submitted as one batch (one system call through the io_uring read engine, one doorbell for
/// the device): what a worker uses for the reads queued together on a connection. The blocks
/// of all the reads are looked up under one hold of the state lock, at most `WINDOW_BLOCKS` of
/// them (a read that would pass that is declined, `Ok(false)`, like one the cache lacks).
/// A read whose `served` is an error on entry is left as it is.
pub fn read_batch_if_cached(inner: &Inner, reads: &mut [CachedRead<'_>]) {
    with_scratch(|s| {
        {
            let mut st = inner.state.lock();
            for (req, read) in reads.iter_mut().enumerate() {
                if read.served.is_ok() {
                    read.served = plan_cached(inner, &mut st, req, read.offset_bytes, read.buf, s);
                }
            }
        }
        // Every planned block is pinned: `read_planned` unpins each, whatever happens.
        read_planned(inner, reads, s);
    });
}

/// Under the state lock: if the cache holds every sector of the read and its blocks fit what
/// is left of the window, counts it, copies its RAM blocks and plans (pins) its cache-device
/// blocks as request `req`: `Ok(true)`. Else `Ok(false)`, having done nothing.
fn plan_cached(
    inner: &Inner,
    st: &mut State,
    req: usize,
    offset_bytes: u64,
    buf: &mut [u8],
    s: &mut Scratch,
) -> Result<bool> {
    check_usable(st)?;
    let len_bytes = buf.len() as u64;
    let blocks =
        (offset_bytes + len_bytes).div_ceil(BLOCK_SIZE_BYTES) - offset_bytes / BLOCK_SIZE_BYTES;
    if buf.len() > WINDOW_BLOCKS * BLOCK
        || s.planned.len() + blocks as usize > WINDOW_BLOCKS
        || !all_cached(st, offset_bytes, len_bytes)
    {
        return Ok(false);
    }
    // Counted as `read_windows` counts a request (the promotion decision keeps the stream
    // detector's view the same; a hit promotes nothing).
    st.counters.reads += 1;
    st.counters.read_bytes += len_bytes;
    let _ = promote::decide(inner, st, offset_bytes, len_bytes);
    let from = s.planned.len();
    let mut done = 0usize;
    let mut prefetch = IndexPrefetch::new(offset_bytes, len_bytes, PREFETCH_AHEAD_BLOCKS);
    while done < buf.len() {
        let pos = offset_bytes + done as u64;
        prefetch.before(st, pos / BLOCK_SIZE_BYTES);
        let in_block = (pos % BLOCK_SIZE_BYTES) as usize;
        let len = (BLOCK - in_block).min(buf.len() - done);
        let dst = &mut buf[done..done + len];
        let cached = lookup_block(inner, st, pos / BLOCK_SIZE_BYTES, in_block, dst, done, s);
        assert!(
            cached,
            "all_cached said the cache holds lba {}",
            pos / BLOCK_SIZE_BYTES
        );
        done += len;
    }
    // Every wanted sector is cached: nothing for the backing device.
    assert!(s.partials.is_empty() && s.misses.is_empty());
    let req = u32::try_from(req).expect("a batch of at most WINDOW_BLOCKS reads");
    for p in &mut s.planned[from..] {
        p.req = req;
    }
    Ok(true)
}

fn with_scratch<T>(f: impl FnOnce(&mut Scratch) -> T) -> T {
    // Taken out of the thread-local (and put back) so nothing stays borrowed across the IO.
    let mut scratch = SCRATCH.with(|s| std::mem::take(&mut *s.borrow_mut()));
    let result = f(&mut scratch);
    scratch.planned.clear();
    scratch.partials.clear();
    scratch.misses.clear();
    scratch.runs.clear();
    scratch.outcomes.clear();
    SCRATCH.with(|s| *s.borrow_mut() = scratch);
    result
}

/// Whether the cache holds every sector of `[offset_bytes, offset_bytes + len_bytes)`.
fn all_cached(st: &State, offset_bytes: u64, len_bytes: u64) -> bool {
    let end_bytes = offset_bytes + len_bytes;
    let mut pos = offset_bytes;
    let mut prefetch = IndexPrefetch::new(offset_bytes, len_bytes, PREFETCH_AHEAD_BLOCKS);
    while pos < end_bytes {
        prefetch.before(st, pos / BLOCK_SIZE_BYTES);
        let in_block = (pos % BLOCK_SIZE_BYTES) as usize;
        let len = (BLOCK - in_block).min((end_bytes - pos) as usize);
        let want = sector_mask(in_block / SECTOR, len / SECTOR);
        match st.blocks.lookup(pos / BLOCK_SIZE_BYTES) {
            Some(c) if want & !st.blocks.valid(c) == 0 => {}
            _ => return false,
        }
        pos += len as u64;
    }
    true
}

/// Serves the request window by window; with `hits_only`, returns `Ok(false)` before doing
/// anything unless `all_cached` holds (checked under the first window's lock hold, which with
/// `hits_only` covers the whole request, so the answer cannot change before the lookups).
fn read_windows(
    inner: &Inner,
    offset_bytes: u64,
    buf: &mut [u8],
    hits_only: bool,
    s: &mut Scratch,
) -> Result<bool> {
    debug_assert!(!hits_only || buf.len() <= WINDOW_BLOCKS * BLOCK);
    let mut ctx = ReadCtx {
        offset_bytes,
        len_bytes: buf.len() as u64,
        promote: false,
        guard: 0,
    };
    let mut done = 0usize;
    // A pending run of bytes that no cache block covers: [miss_start, done) of `buf`. It may
    // continue into the next window.
    let mut miss_start: Option<usize> = None;
    let mut first = true;
    let mut prefetch = IndexPrefetch::new(offset_bytes, buf.len() as u64, PREFETCH_AHEAD_BLOCKS);
    while done < buf.len() {
        s.planned.clear();
        s.partials.clear();
        s.misses.clear();
        let window_start = done;
        {
            let mut st = inner.state.lock();
            check_usable(&st)?;
            if first && hits_only && !all_cached(&st, offset_bytes, buf.len() as u64) {
                return Ok(false);
            }
            if first {
                // The request is counted under its first lock hold, not with one of its own.
                first = false;
                st.counters.reads += 1;
                st.counters.read_bytes += ctx.len_bytes;
                ctx.guard = st.promotion.guard();
                ctx.promote = promote::decide(inner, &mut st, ctx.offset_bytes, ctx.len_bytes);
            }
            let mut blocks = 0usize;
            while done < buf.len() && blocks < WINDOW_BLOCKS {
                let pos = offset_bytes + done as u64;
                prefetch.before(&st, pos / BLOCK_SIZE_BYTES);
                let in_block = (pos % BLOCK_SIZE_BYTES) as usize;
                let len = (BLOCK - in_block).min(buf.len() - done);
                let cached = lookup_block(
                    inner,
                    &mut st,
                    pos / BLOCK_SIZE_BYTES,
                    in_block,
                    &mut buf[done..done + len],
                    done,
                    s,
                );
                if cached {
                    if let Some(start) = miss_start.take() {
                        s.misses.push((start, done));
                    }
                } else {
                    miss_start.get_or_insert(done);
                }
                done += len;
                blocks += 1;
            }
            debug_assert!(done > window_start);
        }
        // Every planned block is pinned: `read_planned` unpins each, whatever happens.
        let mut target = [CachedRead::new(offset_bytes, &mut *buf)];
        read_planned(inner, &mut target, s);
        let [CachedRead { served, .. }] = target;
        served?;
        if done == buf.len() {
            if let Some(start) = miss_start.take() {
                s.misses.push((start, done));
            }
        }
        for i in 0..s.misses.len() {
            let (start, end) = s.misses[i];
            read_miss(
                inner,
                &ctx,
                offset_bytes + start as u64,
                &mut buf[start..end],
            )?;
        }
        debug_assert!(!hits_only || (s.misses.is_empty() && s.partials.is_empty()));
        for p in &s.partials {
            read_missing_sectors(inner, p, &mut buf[p.dst_start..p.dst_start + p.len])?;
        }
    }
    debug_assert!(miss_start.is_none());
    Ok(true)
}

/// Looks up one block under the state lock; `false` if the cache does not hold it. A RAM copy
/// is copied into `dst` now; a cache-device copy is pinned and planned. Counts the block as a
/// hit (every wanted sector in the cache) or a miss.
fn lookup_block(
    inner: &Inner,
    st: &mut State,
    lba: u64,
    in_block: usize,
    dst: &mut [u8],
    dst_start: usize,
    s: &mut Scratch,
) -> bool {
    let want = sector_mask(in_block / SECTOR, dst.len() / SECTOR);
    let full = want == FULL_MASK;
    let Some(c) = st.blocks.lookup(lba) else {
        count_read(st, false, full);
        if st.bypass.zeroing(lba) {
            // A zero range dropped this block's copies and has not zeroed the backing device
            // yet, whose data may be older than the dropped copy: zeros are the answer.
            dst.fill(0);
            return true;
        }
        return false;
    };
    let zeroing = st.bypass.zeroing(lba);
    let valid = st.blocks.valid(c);
    count_read(st, want & !valid == 0, full);
    match st.locate(c) {
        Location::OpenChunk { buffer } | Location::Ram { buffer } => {
            let off = st.offset_in_buffer(c) + in_block;
            // SAFETY: data blocks in RAM are read under the state lock.
            dst.copy_from_slice(unsafe { inner.buffers.slice(buffer, off, dst.len()) });
            st.counters.read_hits_ram += 1;
        }
        Location::Disk => {
            debug_assert_eq!(st.blocks.lba_of(c), Some(lba));
            let (slot, _) = inner.geo.split(c);
            // Pinned under the lock, so the segment cannot be reclaimed before the read.
            inner.pins[slot as usize].fetch_add(1, Ordering::AcqRel);
            let segment_id = st.ring.segment(slot).id;
            debug_assert_ne!(segment_id, 0, "a block on the device in a free slot");
            s.planned.push(Planned {
                req: 0,
                lba,
                c,
                segment_id,
                crc: st.blocks.crc(c),
                dst_start,
                in_block,
                len: dst.len(),
                valid,
                zeroing,
                refill: false,
            });
            return true;
        }
    }
    let missing = want & !valid;
    if missing != 0 {
        s.partials.push(Partial {
            lba,
            dst_start,
            in_block,
            len: dst.len(),
            missing,
            zeroing,
        });
    }
    true
}

/// Reads the planned blocks, one device IO per run of blocks adjacent both on the cache device
/// and in their request, all runs as one batch (in flight together where the device can), then
/// checks each block's CRC. `targets` are the requests, by `Planned::req`; a request's failure
/// replaces its `served` (its later runs are then only unpinned). Unpins every planned block.
fn read_planned(inner: &Inner, targets: &mut [CachedRead<'_>], s: &mut Scratch) {
    serve_from_ram_cache(inner, targets, s);
    s.runs.clear();
    let mut i = 0;
    while i < s.planned.len() {
        let mut end = i + 1;
        while end < s.planned.len() && adjacent(inner, &s.planned[end - 1], &s.planned[end]) {
            end += 1;
        }
        s.runs.push(Run {
            from: i,
            to: end,
            direct: false,
        });
        i = end;
    }
    if !s.runs.is_empty() {
        read_runs(inner, targets, s);
    }
    for p in &s.planned {
        unpin(inner, p);
    }
}

fn unpin(inner: &Inner, p: &Planned) {
    let (slot, _) = inner.geo.split(p.c);
    let pins_before = inner.pins[slot as usize].fetch_sub(1, Ordering::AcqRel);
    assert!(pins_before > 0, "segment pin count underflow");
}

fn ram_cache_key(p: &Planned) -> HotKey {
    HotKey {
        segment_id: p.segment_id,
        cache_block: p.c,
    }
}

/// Whether block `p` may be served from and enter the RAM cache: whole blocks the cache holds
/// every sector of (partial ones keep their backing-device and zeroing handling).
fn ram_cache_admits(p: &Planned) -> bool {
    p.valid == FULL_MASK
}

/// Whether a read of `request_bytes` uses the RAM cache a run at a time, filling it only on a
/// run's second touch (module docs).
fn large(request_bytes: usize) -> bool {
    request_bytes > ADMIT_MAX_REQUEST_BYTES
}

/// The end of the run of planned blocks starting at `from`: what one device IO reads.
fn run_end(inner: &Inner, planned: &[Planned], from: usize) -> usize {
    let mut end = from + 1;
    while end < planned.len() && adjacent(inner, &planned[end - 1], &planned[end]) {
        end += 1;
    }
    end
}

/// Copies the planned blocks the RAM cache holds into their requests, unpins them and takes
/// them out of the plan (keeping its order), so only the others are read from the device: a
/// small read's block by block; a large read's run by run (`serve_run`). The device runs are
/// formed afterwards from what is left: a run left whole is the run looked up here (blocks of
/// different runs are never adjacent), a run served in part leaves the stretches of blocks
/// the RAM cache lacked, each one device IO.
fn serve_from_ram_cache(inner: &Inner, targets: &mut [CachedRead<'_>], s: &mut Scratch) {
    let hot = &inner.hot;
    // Nothing to find (off, or nothing stored since it was last sized): no walk of the plan.
    if s.planned.is_empty() || !hot.may_hold_any() {
        return;
    }
    let mut kept = 0usize;
    let (mut small_hits, mut large_hits) = (0u64, 0u64);
    let mut i = 0usize;
    while i < s.planned.len() {
        let p = s.planned[i];
        let target = &mut targets[p.req as usize];
        if !large(target.buf.len()) {
            if target.served.is_ok() && ram_cache_admits(&p) {
                let dst = &mut target.buf[p.dst_start..p.dst_start + p.len];
                if hot.get(ram_cache_key(&p), p.lba, p.crc, p.in_block, dst) {
                    unpin(inner, &p);
                    small_hits += 1;
                    i += 1;
                    continue;
                }
            }
            s.planned[kept] = p;
            kept += 1;
            i += 1;
            continue;
        }
        let end = run_end(inner, &s.planned, i);
        if target.served.is_err() {
            s.planned.copy_within(i..end, kept);
            kept += end - i;
            i = end;
            continue;
        }
        let lookups = Lookups {
            wants: &mut s.wants,
            hit: &mut s.hit,
        };
        let (served, left) = serve_run(inner, target.buf, &mut s.planned, i, end, kept, lookups);
        large_hits += served;
        kept += left;
        i = end;
    }
    s.planned.truncate(kept);
    hot.count_hits(small_hits, large_hits);
}

/// The scratch of a large read's batched lookup (`HotTier::get_many`).
struct Lookups<'a> {
    wants: &'a mut Vec<Want>,
    hit: &'a mut Vec<bool>,
}

/// A large read's run, planned blocks `[from, end)`: if the RAM cache holds its first block,
/// each block it holds is copied into `buf` and unpinned, and the others are kept (moved down
/// to `kept..`, marked `refill`) for the device; else the whole run is kept, one lookup spent
/// (a large read of data not in RAM pays one per run). A run is stored whole on its second
/// touch, so one whose first block is in RAM is mostly there: what it lacks (blocks its set
/// evicted) is read in stretches and stored again. The rest of the run is looked up at once,
/// one hold of each shard's lock for its blocks in that shard (`HotTier::get_many`), not one
/// per block. Returns the blocks served and kept.
fn serve_run(
    inner: &Inner,
    buf: &mut [u8],
    planned: &mut [Planned],
    from: usize,
    end: usize,
    kept: usize,
    lookups: Lookups<'_>,
) -> (u64, usize) {
    debug_assert!(from < end && end - from <= WINDOW_BLOCKS && kept <= from);
    let hot = &inner.hot;
    let first = planned[from];
    let first_hit = ram_cache_admits(&first) && {
        let dst = &mut buf[first.dst_start..first.dst_start + first.len];
        hot.get(
            ram_cache_key(&first),
            first.lba,
            first.crc,
            first.in_block,
            dst,
        )
    };
    if !first_hit {
        planned.copy_within(from..end, kept);
        return (0, end - from);
    }
    unpin(inner, &first);
    let Lookups { wants, hit } = lookups;
    // Blocks the RAM cache may not serve (partial ones) are not asked for: `hit` stays false.
    wants.clear();
    let mut asked = [false; WINDOW_BLOCKS];
    for (k, p) in planned[from + 1..end].iter().enumerate() {
        if ram_cache_admits(p) {
            asked[k] = true;
            wants.push(Want {
                key: ram_cache_key(p),
                lba: p.lba,
                crc: p.crc,
                in_block: p.in_block,
                dst_start: p.dst_start,
                len: p.len,
            });
        }
    }
    hit.clear();
    hit.resize(wants.len(), false);
    hot.get_many(wants, buf, hit);
    let (mut served, mut left) = (1u64, 0usize);
    let mut found = hit.iter();
    for (k, i) in (from + 1..end).enumerate() {
        let p = planned[i];
        if asked[k] && *found.next().expect("one outcome per want") {
            unpin(inner, &p);
            served += 1;
        } else {
            planned[kept + left] = Planned { refill: true, ..p };
            left += 1;
        }
    }
    (served, left)
}

/// Whether `b` follows `a` both in the same request and on the cache device.
fn adjacent(inner: &Inner, a: &Planned, b: &Planned) -> bool {
    b.req == a.req
        && b.lba == a.lba + 1
        && inner.geo.block_offset(b.c) == inner.geo.block_offset(a.c) + BLOCK_SIZE_BYTES
}

/// Reads every run with one batch: a run goes straight into its request's buffer when it is
/// whole, aligned blocks, else into its own part of the aligned scratch (planned block `i`
/// at `i * BLOCK`, so runs never share scratch). Then each run is checked in order.
fn read_runs(inner: &Inner, targets: &mut [CachedRead<'_>], s: &mut Scratch) {
    let scratch_bytes = (s.planned.len() * BLOCK).max(WINDOW_BLOCKS * BLOCK);
    if s.run.as_ref().is_none_or(|b| b.len() < scratch_bytes) {
        s.run = Some(AlignedBuf::new(scratch_bytes));
    }
    let scratch = s.run.as_mut().expect("made above");
    let mut ops = recycle_read_ops(std::mem::take(&mut s.ops));
    {
        // Runs come in request order, and within a request in buffer order, so each takes its
        // part of its request's buffer (or of the scratch) from what the runs before it left.
        let mut targets_rest = targets.iter_mut();
        let mut current: Option<u32> = None;
        let mut buf_addr = 0usize;
        let mut buf_rest: &mut [u8] = &mut [];
        let mut buf_at = 0usize;
        let mut scratch_rest: &mut [u8] = &mut scratch[..];
        let mut scratch_at = 0usize;
        for run in s.runs.iter_mut() {
            let count = run.to - run.from;
            debug_assert!(count > 0 && count <= WINDOW_BLOCKS);
            let first = s.planned[run.from];
            let last = s.planned[run.to - 1];
            debug_assert_eq!(first.req, last.req);
            while current != Some(first.req) {
                let next = current.map_or(0, |r| r + 1);
                let buf = &mut *targets_rest
                    .next()
                    .expect("a run of a request past the batch")
                    .buf;
                current = Some(next);
                buf_addr = buf.as_ptr() as usize;
                buf_rest = &mut buf[..];
                buf_at = 0;
            }
            let run_bytes = count * BLOCK;
            let whole = first.in_block == 0 && last.len == BLOCK;
            run.direct = whole && (buf_addr + first.dst_start).is_multiple_of(4096);
            let dst = if run.direct {
                assert!(first.dst_start >= buf_at);
                let rest = std::mem::take(&mut buf_rest);
                let (dst, tail) = rest[first.dst_start - buf_at..].split_at_mut(run_bytes);
                buf_rest = tail;
                buf_at = first.dst_start + run_bytes;
                dst
            } else {
                let at = run.from * BLOCK;
                assert!(at >= scratch_at);
                let rest = std::mem::take(&mut scratch_rest);
                let (dst, tail) = rest[at - scratch_at..].split_at_mut(run_bytes);
                scratch_rest = tail;
                scratch_at = at + run_bytes;
                dst
            };
            ops.push(ReadOp::new(dst, inner.geo.block_offset(first.c)));
        }
        inner.cache.read_batch(&mut ops);
        s.outcomes.clear();
        s.outcomes.extend(ops.drain(..).map(|op| op.result));
    }
    s.ops = recycle_read_ops(ops);
    debug_assert_eq!(s.outcomes.len(), s.runs.len());
    for r in 0..s.runs.len() {
        let outcome = std::mem::replace(&mut s.outcomes[r], Ok(()));
        let target = &mut targets[s.planned[s.runs[r].from].req as usize];
        debug_assert!(
            !matches!(target.served, Ok(false)),
            "a run of a declined read"
        );
        if target.served.is_err() {
            continue;
        }
        if let Err(e) = check_run(inner, target.offset_bytes, target.buf, s, r, outcome) {
            target.served = Err(e);
        }
    }
}

/// After run `r`'s IO: each block's CRC checked and its bytes put in place. A block that
/// fails (the IO, or its CRC) is handled as `block_failed` says.
fn check_run(
    inner: &Inner,
    offset_bytes: u64,
    buf: &mut [u8],
    s: &mut Scratch,
    r: usize,
    outcome: std::io::Result<()>,
) -> Result<()> {
    let Run { from, to, direct } = s.runs[r];
    let count = to - from;
    if let Err(e) = outcome {
        let first = s.planned[from];
        if count == 1 {
            let err = Error::io(
                format!("reading cache block {} (lba {})", first.c, first.lba),
                e,
            );
            return block_failed(inner, offset_bytes, buf, &first, err);
        }
        // Which blocks are bad is unknown: read them one by one, each with its own outcome.
        for i in from..to {
            let p = s.planned[i];
            read_one(inner, offset_bytes, buf, &p)?;
        }
        return Ok(());
    }
    let large_read = large(buf.len());
    // Which verified blocks enter the RAM cache: a small read's all; a large read's on its
    // run's second touch (decided once for the run, by its first block), or at once for the
    // blocks a run served in part from RAM lacked.
    let first = &s.planned[from];
    let ram_cache = inner.hot.enabled()
        && (!large_read
            || if first.refill {
                inner.hot.count_refill(count as u64);
                true
            } else {
                inner.hot.second_touch(ram_cache_key(first), count as u64)
            });
    for i in from..to {
        let p = s.planned[i];
        let (block, dst): (&[u8], &mut [u8]) = if direct {
            let at = p.dst_start;
            (&buf[at..at + BLOCK], &mut [])
        } else {
            let scratch = s.run.as_ref().expect("the run was read into the scratch");
            (
                &scratch[i * BLOCK..(i + 1) * BLOCK],
                &mut buf[p.dst_start..p.dst_start + p.len],
            )
        };
        if !inner.geo.block_verifies(p.lba, block, p.crc) {
            block_failed(inner, offset_bytes, buf, &p, corrupt(&p))?;
            continue;
        }
        // Only verified bytes enter the RAM cache.
        if ram_cache && ram_cache_admits(&p) {
            if large_read {
                inner.hot.put_large(ram_cache_key(&p), p.lba, p.crc, block);
            } else {
                inner.hot.put(ram_cache_key(&p), p.lba, p.crc, block);
            }
        }
        if !direct {
            dst.copy_from_slice(&block[p.in_block..p.in_block + p.len]);
        }
        missing_sectors_of(inner, buf, &p)?;
    }
    Ok(())
}

/// Reads one planned block on its own (after its run's IO failed) and checks its CRC.
fn read_one(inner: &Inner, offset_bytes: u64, buf: &mut [u8], p: &Planned) -> Result<()> {
    let res = crate::verify::SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        inner
            .cache
            .read_at(&mut s, inner.geo.block_offset(p.c))
            .map_err(|e| Error::io(format!("reading cache block {} (lba {})", p.c, p.lba), e))?;
        if !inner.geo.block_verifies(p.lba, &s, p.crc) {
            return Err(corrupt(p));
        }
        buf[p.dst_start..p.dst_start + p.len].copy_from_slice(&s[p.in_block..p.in_block + p.len]);
        Ok(())
    });
    match res {
        Ok(()) => missing_sectors_of(inner, buf, p),
        Err(err) => block_failed(inner, offset_bytes, buf, p, err),
    }
}

fn corrupt(p: &Planned) -> Error {
    Error::Corruption(format!(
        "cache block {} (backing block {}) fails its checksum",
        p.c, p.lba
    ))
}

/// A planned block could not be read or failed its CRC; the error is counted. A clean copy is
/// only a copy: the backing device holds the same data, so the bad copy is dropped (a corrupt
/// one must not be served again) and the block read from there. A dirty block is the only
/// copy: the error goes to the client.
fn block_failed(
    inner: &Inner,
    offset_bytes: u64,
    buf: &mut [u8],
    p: &Planned,
    err: Error,
) -> Result<()> {
    let mut st = inner.state.lock();
    match &err {
        Error::Corruption(_) => st.counters.checksum_errors += 1,
        _ => st.counters.io_errors += 1,
    }
    if st.blocks.lookup(p.lba) == Some(p.c) && st.blocks.dirty(p.c) == 0 {
        st.evict(p.c);
        drop(st);
        let dst = &mut buf[p.dst_start..p.dst_start + p.len];
        return read_backing(inner, offset_bytes + p.dst_start as u64, dst);
    }
    Err(err)
}

/// After a planned block's cache bytes are in place: the sectors it never held.
fn missing_sectors_of(inner: &Inner, buf: &mut [u8], p: &Planned) -> Result<()> {
    let want = sector_mask(p.in_block / SECTOR, p.len / SECTOR);
    let missing = want & !p.valid;
    if missing == 0 {
        return Ok(());
    }
    let partial = Partial {
        lba: p.lba,
        dst_start: p.dst_start,
        in_block: p.in_block,
        len: p.len,
        missing,
        zeroing: p.zeroing,
    };
    read_missing_sectors(inner, &partial, &mut buf[p.dst_start..p.dst_start + p.len])
}

/// What a read request decided once, on its first window.
struct ReadCtx {
    offset_bytes: u64,
    len_bytes: u64,
    /// Promote the blocks it misses.
    promote: bool,
    /// `Promotion::guard` when the request started, before any backing-device read.
    guard: u64,
}

/// Reads a run of blocks the cache does not hold, then promotes its whole blocks.
fn read_miss(inner: &Inner, ctx: &ReadCtx, offset_bytes: u64, buf: &mut [u8]) -> Result<()> {
    read_backing(inner, offset_bytes, buf)?;
    if ctx.promote {
        promote::promote(inner, ctx.guard, offset_bytes, buf);
    }
    Ok(())
}

fn read_backing(inner: &Inner, offset_bytes: u64, buf: &mut [u8]) -> Result<()> {
    inner.backing.read_at(buf, offset_bytes).map_err(|e| {
        inner.state.lock().counters.io_errors += 1;
        Error::io(
            format!(
                "reading {} bytes at {offset_bytes} from the backing device",
                buf.len()
            ),
            e,
        )
    })
}

/// Sectors of a cached block the cache never held come from the backing device, one read per
/// run of them. `dst` is the block's wanted part, already holding the cached sectors.
fn read_missing_sectors(inner: &Inner, p: &Partial, dst: &mut [u8]) -> Result<()> {
    debug_assert_eq!(dst.len(), p.len);
    let mut s = 0usize;
    while s < 8 {
        if p.missing & (1 << s) == 0 {
            s += 1;
            continue;
        }
        let run_start = s;
        while s < 8 && p.missing & (1 << s) != 0 {
            s += 1;
        }
        let from = run_start * SECTOR - p.in_block;
        let to = s * SECTOR - p.in_block;
        if p.zeroing {
            dst[from..to].fill(0);
            continue;
        }
        read_backing(
            inner,
            p.lba * BLOCK_SIZE_BYTES + (run_start * SECTOR) as u64,
            &mut dst[from..to],
        )?;
    }
    Ok(())
}

fn count_read(st: &mut State, hit: bool, full: bool) {
    let c = &mut st.counters;
    crate::stats::count_access(
        hit,
        full,
        [
            &mut c.read_hits_full,
            &mut c.read_hits_partial,
            &mut c.read_misses_full,
            &mut c.read_misses_partial,
        ],
        [&mut c.read_hits, &mut c.read_misses],
    );
}
