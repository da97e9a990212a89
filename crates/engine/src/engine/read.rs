//! The read path: the newest copy of each sector, from RAM, the cache device or the backing
//! device. Runs of blocks missing from the cache become one backing-device read.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use parking_lot::MutexGuard;

use super::reclaim;
use super::state::{Location, State};
use super::tunables;
use super::write::{check_usable, sector_mask, SCRATCH};
use super::Inner;
use crate::error::{Error, Result};
use crate::format::{crc_block, BLOCK_SIZE_BYTES, FULL_MASK, SECTOR_SIZE_BYTES};

const BLOCK: usize = BLOCK_SIZE_BYTES as usize;
const SECTOR: usize = SECTOR_SIZE_BYTES as usize;

pub fn read(inner: &Inner, offset: u64, buf: &mut [u8]) -> Result<()> {
    let mut ctx = ReadCtx {
        offset,
        len_bytes: buf.len() as u64,
        promote: false,
        guard: 0,
    };
    let mut done = 0usize;
    // A pending run of bytes that no cache block covers: [miss_start, done) of `buf`.
    let mut miss_start: Option<usize> = None;
    while done < buf.len() {
        let pos = offset + done as u64;
        let lba = pos / BLOCK_SIZE_BYTES;
        let in_block = (pos % BLOCK_SIZE_BYTES) as usize;
        let len = (BLOCK - in_block).min(buf.len() - done);
        // The request is counted under the first block's lock hold, not with a lock of its own.
        let first = done == 0;
        let dst = &mut buf[done..done + len];
        match read_block(inner, lba, in_block / SECTOR, dst, first, &mut ctx)? {
            BlockRead::NotCached => {
                miss_start.get_or_insert(done);
            }
            BlockRead::Done => {
                if let Some(start) = miss_start.take() {
                    read_miss(inner, &ctx, offset + start as u64, &mut buf[start..done])?;
                }
            }
        }
        done += len;
    }
    if let Some(start) = miss_start {
        read_miss(inner, &ctx, offset + start as u64, &mut buf[start..])?;
    }
    Ok(())
}

/// What a read request decided once, on its first block.
struct ReadCtx {
    offset: u64,
    len_bytes: u64,
    /// Promote the blocks it misses.
    promote: bool,
    /// `State::promote_guard` when the request started, before any backing-device read.
    guard: u64,
}

/// What `read_block` did with one block.
enum BlockRead {
    /// Not in the cache: the caller reads it from the backing device, merged with its
    /// neighbours into one IO.
    NotCached,
    /// `dst` holds the block's newest data.
    Done,
}

/// Longest pause, in doublings of `OpenOptions::promote_pause_after_relocation` (10 s → 160 s).
pub const PROMOTE_PAUSE_DOUBLINGS_MAX: u32 = 4;

/// The current pause of promotions after a relocation.
fn promote_pause(inner: &Inner, st: &State) -> Duration {
    inner.promote_pause_after_relocation * (1u32 << st.promote_pause_doublings)
}

/// Records that the relocator moved dirty blocks at `now`, and adapts the pause. Promotions
/// resuming into a log that is still congested fill it again and bring the relocator straight
/// back: in a 10-minute 64 × 64 soak every relocated block followed a burst of promotions,
/// 2.6 relocated per promoted, each burst a latency spike. So relocation within another
/// pause after promotions resumed doubles the pause; a log quiet for that long resets it.
pub fn note_relocation(inner: &Inner, st: &mut State, now: Instant) {
    if let Some(prev) = st.relocated_at {
        let since = now.saturating_duration_since(prev);
        st.promote_pause_doublings =
            next_pause_doublings(st.promote_pause_doublings, since, promote_pause(inner, st));
    }
    st.relocated_at = Some(now);
}

/// The pause's doublings after a relocation `since` the previous one, under a pause of `pause`.
fn next_pause_doublings(doublings: u32, since: Duration, pause: Duration) -> u32 {
    if since < pause {
        // Promotions were paused: this relocation is the writers' own.
        doublings
    } else if since < pause * 2 {
        (doublings + 1).min(PROMOTE_PAUSE_DOUBLINGS_MAX)
    } else {
        0
    }
}

/// Whether this request's misses should be promoted: read caching on, not part of a stream
/// past the sequential cutoff, the log not congested, and no write bypassing the cache in
/// flight. The log is congested while the relocator has moved dirty blocks lately: the ring is
/// then full of dirty data, so each promoted (clean) block costs log bandwidth and room that
/// relocations need, and lives only until the head comes round, which under such load is
/// seconds (bcache likewise bypasses a congested cache device).
fn decide_promotion(inner: &Inner, st: &mut State, ctx: &ReadCtx) -> bool {
    if inner.tunables.get(tunables::READ_CACHE) == 0 {
        return false;
    }
    let run_bytes = st.streams.observe(ctx.offset, ctx.len_bytes);
    let cutoff_bytes = inner.tunables.get(tunables::READ_SEQUENTIAL_CUTOFF_KIB) * 1024;
    if cutoff_bytes > 0 && run_bytes > cutoff_bytes {
        st.counters.promotions_sequential_skipped += 1;
        return false;
    }
    // Manual mode promises replayable runs, so it reads no clock: there any pause lasts until
    // the engine is reopened.
    let pause = promote_pause(inner, st);
    let congested = st.relocated_at.is_some_and(|at| {
        if inner.manual {
            !pause.is_zero()
        } else {
            at.elapsed() < pause
        }
    });
    if congested {
        st.counters.promotions_congested_skipped += 1;
        return false;
    }
    st.direct_writes_in_flight == 0
}

/// Reads a run of blocks the cache does not hold, then promotes its whole blocks.
fn read_miss(inner: &Inner, ctx: &ReadCtx, offset: u64, buf: &mut [u8]) -> Result<()> {
    read_backing(inner, offset, buf)?;
    if ctx.promote {
        promote(inner, ctx.guard, offset, buf);
    }
    Ok(())
}

/// Copies the whole blocks of `data` (read from the backing device at `offset`) into the log
/// as clean blocks. Gives up if anything that could make them stale happened since the request
/// started (`guard`), or the log is short of room: a promotion never waits.
fn promote(inner: &Inner, guard: u64, offset: u64, data: &[u8]) {
    let first = offset.div_ceil(BLOCK_SIZE_BYTES);
    let end = (offset + data.len() as u64) / BLOCK_SIZE_BYTES;
    if first >= end {
        return;
    }
    let mut st = inner.state.lock();
    if check_usable(&st).is_err() {
        return;
    }
    if st.promote_guard != guard || st.direct_writes_in_flight > 0 || reclaim::under_pressure(&st) {
        st.counters.promotions_raced += end - first;
        return;
    }
    let sealed_before = st.counters.chunks_sealed;
    for lba in first..end {
        if st.index.get(lba).is_some() {
            continue; // written since it was read: the cache has newer data
        }
        let Some(c) = st.reserve_block(&inner.buffers, Instant::now(), false) else {
            st.counters.promotions_raced += end - lba;
            break;
        };
        let Location::OpenChunk { buffer } = st.locate(c) else {
            unreachable!("a reserved block is in the open chunk")
        };
        let off = st.offset_in_buffer(c);
        let src = ((lba * BLOCK_SIZE_BYTES - offset) as usize)..;
        // SAFETY: the reserved block is in the open chunk and we hold the lock.
        unsafe { inner.buffers.slice_mut(buffer, off, BLOCK) }.copy_from_slice(&data[src][..BLOCK]);
        st.valid_mask[c as usize] = FULL_MASK;
        let prev = st.index.insert(lba, c);
        assert!(prev.is_none());
        st.counters.promotions += 1;
        st.counters.promotion_bytes += BLOCK_SIZE_BYTES;
    }
    if st.counters.chunks_sealed != sealed_before {
        inner.flusher_wake.notify_one();
    }
}

fn read_backing(inner: &Inner, offset: u64, buf: &mut [u8]) -> Result<()> {
    inner.backing.read_at(buf, offset).map_err(|e| {
        inner.state.lock().counters.io_errors += 1;
        Error::io(
            format!(
                "reading {} bytes at {offset} from the backing device",
                buf.len()
            ),
            e,
        )
    })
}

/// Reads part of one block if it is cached, taking the state lock once. Counts the block as a
/// hit (every wanted sector in the cache) or a miss, and on the request's `first` block the
/// request itself (deciding then whether its misses are promoted).
fn read_block(
    inner: &Inner,
    lba: u64,
    first_sector: usize,
    dst: &mut [u8],
    first: bool,
    ctx: &mut ReadCtx,
) -> Result<BlockRead> {
    let want = sector_mask(first_sector, dst.len() / SECTOR);
    let in_block = first_sector * SECTOR;
    let mut st = inner.state.lock();
    check_usable(&st)?;
    if first {
        st.counters.reads += 1;
        st.counters.read_bytes += ctx.len_bytes;
        ctx.guard = st.promote_guard;
        ctx.promote = decide_promotion(inner, &mut st, ctx);
    }
    let full = want == FULL_MASK;
    let Some(c) = st.index.get(lba) else {
        count_read(&mut st, false, full);
        return Ok(BlockRead::NotCached);
    };
    let hit = want & !st.valid_mask[c as usize] == 0;
    count_read(&mut st, hit, full);
    let valid = st.valid_mask[c as usize];
    match st.locate(c) {
        Location::OpenChunk { buffer } | Location::Ram { buffer } => {
            let off = st.offset_in_buffer(c) + in_block;
            // SAFETY: data blocks in RAM are read under the state lock.
            dst.copy_from_slice(unsafe { inner.buffers.slice(buffer, off, dst.len()) });
            st.counters.read_hits_ram += 1;
        }
        Location::Disk => {
            let (guard, res) = read_verified(inner, st, lba, c, |block| {
                dst.copy_from_slice(&block[in_block..in_block + dst.len()]);
            });
            st = guard;
            if let Err(e) = res {
                // A clean copy is only a copy: the backing device holds the same data. Drop
                // the bad copy (a corrupt one must not be served again) and read from there.
                // A dirty block is the only copy: the error goes to the client.
                if st.index.get(lba) == Some(c) && st.dirty_mask[c as usize] == 0 {
                    st.evict(c);
                    return Ok(BlockRead::NotCached);
                }
                return Err(e);
            }
        }
    }
    drop(st);
    let missing = want & !valid;
    if missing == 0 {
        return Ok(BlockRead::Done);
    }
    // Sectors the cache never held come from the backing device, one read per run.
    debug_assert!(valid != FULL_MASK);
    let mut s = 0usize;
    while s < 8 {
        if missing & (1 << s) == 0 {
            s += 1;
            continue;
        }
        let run_start = s;
        while s < 8 && missing & (1 << s) != 0 {
            s += 1;
        }
        let from = run_start * SECTOR - in_block;
        let to = s * SECTOR - in_block;
        read_backing(
            inner,
            lba * BLOCK_SIZE_BYTES + (run_start * SECTOR) as u64,
            &mut dst[from..to],
        )?;
    }
    Ok(BlockRead::Done)
}

fn count_read(st: &mut State, hit: bool, full: bool) {
    let c = &mut st.counters;
    match (hit, full) {
        (true, true) => c.read_hits_full += 1,
        (true, false) => c.read_hits_partial += 1,
        (false, true) => c.read_misses_full += 1,
        (false, false) => c.read_misses_partial += 1,
    }
    if hit {
        c.read_hits += 1;
    } else {
        c.read_misses += 1;
    }
}

/// Reads cache block `c` (the current copy of `lba`) with the state lock released, verifies its
/// checksum and hands the bytes to `use_block`. The segment is pinned meanwhile, so it cannot be
/// reclaimed under the read. Errors are counted; the lock is held again on return.
pub(crate) fn read_verified<'a>(
    inner: &'a Inner,
    st: MutexGuard<'a, State>,
    lba: u64,
    c: u32,
    use_block: impl FnOnce(&[u8]),
) -> (MutexGuard<'a, State>, Result<()>) {
    let (slot, _) = inner.geo.split(c);
    let crc = st.data_crc[c as usize];
    inner.pins[slot as usize].fetch_add(1, Ordering::AcqRel);
    drop(st);
    let res = SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        inner
            .cache
            .read_at(&mut s, inner.geo.block_offset(c))
            .map_err(|e| Error::io(format!("reading cache block {c} (lba {lba})"), e))?;
        if crc_block(inner.geo.format_id, lba, &s) != crc {
            return Err(Error::Corruption(format!(
                "cache block {c} (backing block {lba}) fails its checksum"
            )));
        }
        use_block(&s);
        Ok(())
    });
    inner.pins[slot as usize].fetch_sub(1, Ordering::AcqRel);
    let mut st = inner.state.lock();
    match &res {
        Err(Error::Corruption(_)) => st.counters.checksum_errors += 1,
        Err(_) => st.counters.io_errors += 1,
        Ok(()) => {}
    }
    (st, res)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_promotion_pause_backs_off_while_promotions_refill_the_log() {
        let pause = Duration::from_secs(10);
        // Relocations during the pause leave it alone.
        assert_eq!(next_pause_doublings(0, Duration::from_secs(3), pause), 0);
        assert_eq!(next_pause_doublings(2, Duration::from_secs(3), pause), 2);
        // Relocation soon after promotions resumed doubles it, up to the cap.
        assert_eq!(next_pause_doublings(0, Duration::from_secs(12), pause), 1);
        assert_eq!(
            next_pause_doublings(PROMOTE_PAUSE_DOUBLINGS_MAX, Duration::from_secs(12), pause),
            PROMOTE_PAUSE_DOUBLINGS_MAX
        );
        // A log quiet for another pause after promotions resumed resets it.
        assert_eq!(next_pause_doublings(3, Duration::from_secs(20), pause), 0);
    }
}
