//! The write path: copy into the open chunk and return. No device IO happens here except the
//! read of an older on-disk copy that a partial-block write must merge with.

use crate::sync::MutexGuard;

use super::admission::Turn;
use super::hot::ADMIT_MAX_REQUEST_BYTES;
use super::prefetch::IndexPrefetch;
use crate::error::Result;
use crate::format::{BLOCK_SIZE_BYTES, FULL_MASK, SECTOR_SIZE_BYTES};
use crate::geometry::sector_mask;
use crate::inner::{check_usable, Inner};
use crate::state::{Location, State};
use crate::verify::{read_verified, SCRATCH};

const BLOCK: usize = BLOCK_SIZE_BYTES as usize;
const SECTOR: usize = SECTOR_SIZE_BYTES as usize;
/// How many blocks ahead a multi-block write hints the index slot it will probe
/// (`IndexPrefetch`): a few blocks of work (~1 µs) hide a miss.
const PREFETCH_AHEAD_BLOCKS: u64 = 4;

/// Copies `data` into the log. `dirty`: the backing device does not hold it yet (write-back);
/// otherwise the caller already wrote it there (write-through) and the blocks stay clean.
pub fn write(inner: &Inner, offset_bytes: u64, data: &[u8], dirty: bool) -> Result<()> {
    let mut turn = Turn::default();
    let result = write_blocks(inner, offset_bytes, data, dirty, &mut turn);
    turn.release(&inner.state, &inner.room_turn);
    result
}

fn write_blocks(
    inner: &Inner,
    offset_bytes: u64,
    data: &[u8],
    dirty: bool,
    turn: &mut Turn,
) -> Result<()> {
    let mut done = 0usize;
    let mut prefetch = IndexPrefetch::new(offset_bytes, data.len() as u64, PREFETCH_AHEAD_BLOCKS);
    // A small write's blocks go to the RAM cache once the flusher has written them, as a host
    // page cache keeps what a buffered write wrote; a large one's (a restore, a copy streaming
    // through) would only flush what small reads keep hot (`path::hot`, "Writes").
    let keep = data.len() <= ADMIT_MAX_REQUEST_BYTES;
    while done < data.len() {
        let pos = offset_bytes + done as u64;
        let lba = pos / BLOCK_SIZE_BYTES;
        let in_block = (pos % BLOCK_SIZE_BYTES) as usize;
        let len = (BLOCK - in_block).min(data.len() - done);
        // The request is counted under the first block's lock hold, not with a lock of its own.
        let request_bytes = if done == 0 { data.len() as u64 } else { 0 };
        let place = InRequest {
            request_bytes,
            keep,
            prefetch: &mut prefetch,
        };
        write_block(
            inner,
            lba,
            in_block / SECTOR,
            &data[done..done + len],
            place,
            dirty,
            turn,
        )?;
        done += len;
    }
    Ok(())
}

/// Where a block sits in its request: the request's size (counted with its first block only),
/// whether the request is small enough for its blocks to be kept in the RAM cache, and the
/// request's index prefetch.
struct InRequest<'a> {
    request_bytes: u64,
    keep: bool,
    prefetch: &'a mut IndexPrefetch,
}

/// Older data a partial write merges with, read from the cache device outside the lock.
struct OnDiskCopy {
    block: u32,
}

fn write_block(
    inner: &Inner,
    lba: u64,
    first_sector: usize,
    src: &[u8],
    place: InRequest<'_>,
    dirty: bool,
    turn: &mut Turn,
) -> Result<()> {
    let InRequest {
        request_bytes,
        keep,
        prefetch,
    } = place;
    debug_assert_eq!(src.len() % SECTOR, 0);
    let new_mask = sector_mask(first_sector, src.len() / SECTOR);
    let new_dirty = if dirty { new_mask } else { 0 };
    let in_block = first_sector * SECTOR;
    let mut disk_copy: Option<OnDiskCopy> = None;
    // The index slot the lookup under the lock will probe, hinted first: its cache miss then
    // overlaps the CRC below instead of lengthening the lock hold.
    inner.index_hint.prefetch(lba);
    // A whole block's CRC, from the source while it is in the CPU's cache and before the lock
    // (writers wait for each other there): the flusher takes it instead of reading the block
    // again (`copy_in`).
    let src_crc = (src.len() == BLOCK).then(|| inner.geo.block_crc(lba, src));
    let mut st = inner.state.lock();
    prefetch.before(&st, lba);
    check_usable(&st)?;
    // No longer zeros, from before the write can return (early is safe: a write is in flight).
    st.zeros.remove(lba, lba + 1);
    if request_bytes > 0 {
        st.counters.writes += 1;
        st.counters.write_bytes += request_bytes;
    }
    loop {
        check_usable(&st)?;
        let old = st.blocks.lookup(lba);
        // An overwrite of a block in the open chunk happens in place.
        if let Some(c) = old {
            if let Location::OpenChunk { buffer } = st.locate(c) {
                let block_off = st.offset_in_buffer(c);
                // SAFETY: open-chunk blocks are written only under the state lock, held here.
                let dst = unsafe {
                    inner
                        .buffers
                        .slice_mut(buffer, block_off + in_block, src.len())
                };
                copy_in(inner, buffer, block_off, lba, src, src_crc, keep, dst);
                let old_dirty = st.blocks.dirty(c);
                if old_dirty == 0 && dirty {
                    st.counters.blocks_dirtied += 1;
                }
                st.set_dirty_mask(c, old_dirty | new_dirty);
                st.blocks.add_valid(c, new_mask);
                st.counters.write_in_place += 1;
                let seq = st.seqs.next();
                st.changes.mark(lba, 1, seq);
                st.bypass.spoil_trims(lba, lba + 1);
                count_write(&mut st, true, new_mask);
                return Ok(());
            }
        }
        // A partial overwrite of a block whose sectors live only on the cache device needs them.
        let needs_disk = old
            .is_some_and(|c| st.locate(c) == Location::Disk && st.blocks.valid(c) & !new_mask != 0);
        if needs_disk && disk_copy.as_ref().map(|d| d.block) != old {
            let c = old.expect("checked above");
            st = read_old_copy(inner, st, lba, c, &mut disk_copy)?;
            continue; // the state may have changed while the lock was released
        }
        if !turn.may_reserve(&st.room) {
            // Writers already wait for room: take a place behind them.
            st = turn.queue(&inner.room_turn, st);
            continue;
        }
        let sealed_before = st.counters.chunks_sealed;
        let Some(nc) = st.reserve_block(&inner.buffers, crate::sync::now, false) else {
            turn.hold(&mut st.room);
            st = crate::drive::wait_for_room(inner, st)?;
            continue;
        };
        if st.counters.chunks_sealed != sealed_before {
            // A chunk is ready: the flusher may be asleep (woken per few chunks, not each).
            crate::log::flusher::chunk_sealed(inner, &st);
        }
        // Fill the new block: older data first (if any sector survives), then the new sectors.
        let loc_new = st.locate(nc);
        let Location::OpenChunk { buffer: nbuf } = loc_new else {
            unreachable!("a reserved block is in the open chunk, not {loc_new:?}")
        };
        let noff = st.offset_in_buffer(nc);
        // SAFETY: the reserved block is in the open chunk and we hold the lock.
        let dst = unsafe { inner.buffers.slice_mut(nbuf, noff, BLOCK) };
        let (old_valid, old_dirty) = match old {
            Some(c) => (st.blocks.valid(c), st.blocks.dirty(c)),
            None => (0, 0),
        };
        if old_valid & !new_mask != 0 {
            let c = old.expect("old_valid is non-zero only for a cached block");
            match st.locate(c) {
                Location::OpenChunk { buffer } | Location::Ram { buffer } => {
                    let ooff = st.offset_in_buffer(c);
                    // SAFETY: data blocks in RAM are read under the lock.
                    dst.copy_from_slice(unsafe { inner.buffers.slice(buffer, ooff, BLOCK) });
                }
                Location::Disk => {
                    let d = disk_copy.as_ref().expect("read above");
                    assert_eq!(d.block, c);
                    SCRATCH.with(|s| dst.copy_from_slice(&s.borrow()));
                }
            }
        } else if new_mask != FULL_MASK {
            dst.fill(0); // sectors not valid are never read, but keep the log deterministic
        }
        copy_in(
            inner,
            nbuf,
            noff,
            lba,
            src,
            src_crc,
            keep,
            &mut dst[in_block..in_block + src.len()],
        );
        st.blocks.set_valid(nc, old_valid | new_mask);
        st.set_dirty_mask(nc, old_dirty | new_dirty);
        if old_dirty == 0 && dirty {
            st.counters.blocks_dirtied += 1;
        }
        let hit = if let Some(prev) = st.map(lba, nc) {
            assert_eq!(Some(prev), old);
            st.retire(prev, lba);
            true
        } else {
            false
        };
        let seq = st.seqs.next();
        st.changes.mark(lba, 1, seq);
        st.bypass.spoil_trims(lba, lba + 1);
        count_write(&mut st, hit, new_mask);
        drop(st);
        // The next block of this chunk is most likely the next write's: hinted now, outside
        // the lock, its lines arrive while the caller works instead of under the next copy.
        inner.buffers.prefetch_block_for_write(nbuf, noff + BLOCK);
        return Ok(());
    }
}

/// Copies `src` into `dst`, part or all of the open-chunk block at `block_off` of buffer `buf`
/// (backing block `lba`). A whole block comes with its CRC (`src_crc`), left for the flusher
/// (`SegmentBuffers::set_ready_crc`), which would otherwise read the block again after it has
/// left the CPU's cache to checksum it; after a partial write the flusher computes it.
/// (One pass that copies and checksums together measured no faster than a copy and a CRC of
/// the cache-hot source: the CRC instructions bound both. BENCHMARKS.md, issue 20.) `keep`:
/// a small write, whose block the flusher stores in the RAM cache (the last write into the
/// position decides).
#[allow(clippy::too_many_arguments)]
fn copy_in(
    inner: &Inner,
    buf: u32,
    block_off: usize,
    lba: u64,
    src: &[u8],
    src_crc: Option<u32>,
    keep: bool,
    dst: &mut [u8],
) {
    dst.copy_from_slice(src);
    match src_crc {
        Some(crc) => {
            debug_assert_eq!(dst.len(), BLOCK);
            inner.buffers.set_ready_crc(buf, block_off, lba, crc, keep);
        }
        None => inner.buffers.clear_ready_crc(buf, block_off, keep),
    }
}

/// Counts one block written (`hit`: the block was cached) covering sectors `mask`.
pub(super) fn count_write(st: &mut State, hit: bool, mask: u8) {
    let c = &mut st.counters;
    let full = mask == FULL_MASK;
    if !full {
        c.write_partial += 1;
    }
    crate::stats::count_access(
        hit,
        full,
        [
            &mut c.write_hits_full,
            &mut c.write_hits_partial,
            &mut c.write_misses_full,
            &mut c.write_misses_partial,
        ],
        [&mut c.write_hits, &mut c.write_misses],
    );
}

/// Reads the on-disk copy `c` of `lba` into this thread's scratch buffer (see
/// `verify::read_verified`), for a partial write to merge with.
fn read_old_copy<'a>(
    inner: &'a Inner,
    mut st: MutexGuard<'a, State>,
    lba: u64,
    c: u32,
    out: &mut Option<OnDiskCopy>,
) -> Result<MutexGuard<'a, State>> {
    st.counters.write_merge_reads += 1;
    let (mut st, res) = read_verified(inner, st, lba, c, |_| {});
    if let Err(e) = res {
        // A clean copy is only a copy (the backing device holds the same data): drop it, as
        // reads do, and write over the backing device's data instead of failing the write.
        // A dirty block is the only copy: the error goes to the client.
        if st.blocks.lookup(lba) == Some(c) && st.blocks.dirty(c) == 0 {
            st.evict(c);
            return Ok(st);
        }
        return Err(e);
    }
    *out = Some(OnDiskCopy { block: c });
    Ok(st)
}
