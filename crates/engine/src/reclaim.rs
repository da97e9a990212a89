//! Making room in the ring: reclaim dead segments at the head, and under space pressure
//! relocate the head segment's live blocks to the open chunk so it can die.
//!
//! Clean blocks (written back, see `writeback/`) are dropped rather than moved; relocation of
//! dirty blocks keeps the log from jamming on a few long-lived blocks while writeback catches up.

use std::sync::atomic::Ordering;

use crate::sync::MutexGuard;

use crate::error::{Error, Result};
use crate::format::{chunk, BLOCK_SIZE_BYTES};
use crate::inner::{fail_cache, Inner};
use crate::state::{Location, State, RESERVE_SEGMENTS};

const BLOCK: usize = BLOCK_SIZE_BYTES as usize;
/// Relocation runs only while live blocks fill at most this share of the ring's data blocks.
pub const RELOCATE_LIVE_MAX_PERCENT: u64 = 90;

/// Advances the head over dead segments: persist the new head first, then free the slots, so a
/// crash never finds the persisted head pointing at a reused slot.
pub fn reclaim<'a>(
    inner: &'a Inner,
    st: MutexGuard<'a, State>,
) -> Result<(MutexGuard<'a, State>, bool)> {
    let new_head =
        st.reclaimable_head(|slot| inner.pins[slot as usize].load(Ordering::Acquire) > 0);
    if new_head == st.ring.head_segment_id() {
        return Ok((st, false));
    }
    let head_seq = st.ring.first_seq_of(new_head, st.seqs.next());
    drop(st);
    // Checkpoints: what leaves the log must be in their persisted bitmaps first.
    crate::bitmaps::fold(inner, head_seq)?;
    let res = inner.superblock.advance_head(new_head, head_seq);
    let mut st = inner.state.lock();
    if let Err(e) = res {
        return Err(fail_cache(inner, st, e));
    }
    st.counters.superblock_writes += 1;
    st.free_segments_before(new_head);
    if !st.ring.open().active {
        st.open_segment(false);
    }
    Ok((st, true))
}

/// What one `relocate_head` call did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeadWork {
    /// Live blocks were copied into the open chunk: the segment dies once that chunk is
    /// sealed and synced.
    pub moved: bool,
    /// Clean blocks were dropped: no log entry, so the segment may be reclaimable at once.
    pub evicted: bool,
}

impl HeadWork {
    pub fn any(self) -> bool {
        self.moved || self.evicted
    }
}

/// A live block of the head segment, as it was when the relocator looked.
struct LiveBlock {
    block_in_segment: u32,
    cache_block: u32,
    lba: u64,
    crc: u32,
}

/// Under space pressure, copies the live blocks of the oldest segment that has any into the
/// open chunk. That segment dies once the chunk holding the copies is sealed and synced; the
/// caller seals, and the next rounds write, sync and reclaim it.
pub fn relocate_head<'a>(
    inner: &'a Inner,
    mut st: MutexGuard<'a, State>,
) -> Result<(MutexGuard<'a, State>, HeadWork)> {
    let nothing = HeadWork::default();
    if !st.under_pressure() || st.health.is_failed() {
        return Ok((st, nothing));
    }
    // The oldest segment that still has live blocks: segments before it are dead and only wait
    // for a sync to be reclaimed. Only segments wholly on the cache device qualify.
    let Some((head, slot)) = st.ring.oldest_live_on_device() else {
        return Ok((st, nothing));
    };
    // Clean blocks are the cheapest room there is: their data is on the backing device, so
    // they are dropped, not moved. Only dirty blocks need relocating.
    let mut evicted = false;
    if st.ring.segment(slot).dirty_blocks < st.ring.segment(slot).live_blocks {
        for b in 0..inner.geo.blocks_per_segment {
            let c = inner.geo.cache_block(slot, b);
            if st.blocks.lba_of(c).is_some() && st.blocks.dirty(c) == 0 {
                st.evict(c);
                evicted = true;
            }
        }
        if st.ring.segment(slot).live_blocks == 0 {
            return Ok((st, HeadWork { evicted, ..nothing }));
        }
    }
    let evicted_only = HeadWork { evicted, ..nothing };
    // In flush-epoch order a moved block would join a later epoch, and shadows have no index
    // entry to move with: writers wait for writeback, which frees the head epoch first.
    if st.ordered() {
        return Ok((st, evicted_only));
    }
    // Moving blocks only makes room if there is room to make: with dirty data near the ring's
    // capacity, relocation would cycle the same blocks forever; writers then wait for
    // writeback. Below the limit, each pass over the ring compacts it and frees the slack.
    // Usable: all but the reserve, the open segment and one for writers to open.
    let usable_segments = inner.geo.segment_count - RESERVE_SEGMENTS - 2;
    let data_per_segment = chunk::plan(inner.geo.blocks_per_segment).1 as u64;
    let live_max = usable_segments * data_per_segment * RELOCATE_LIVE_MAX_PERCENT / 100;
    if st.blocks.dirty_blocks() > live_max {
        return Ok((st, evicted_only));
    }
    // No chunk open and none can open (the ring or the RAM buffers full, the head held, say
    // by a slow backing zeroing): nothing could be moved, so the segment is not read. Before,
    // every flusher wake read it whole and moved nothing.
    if !st.ring.open().active && !st.ring.can_open_segment(true) {
        st.counters.relocations_without_room += 1;
        return Ok((st, evicted_only));
    }
    let mut live = Vec::with_capacity(st.ring.segment(slot).live_blocks as usize);
    for b in 0..inner.geo.blocks_per_segment {
        let c = inner.geo.cache_block(slot, b);
        if let Some(lba) = st.blocks.lba_of(c) {
            live.push(LiveBlock {
                block_in_segment: b,
                cache_block: c,
                lba,
                crc: st.blocks.crc(c),
            });
        }
    }
    assert_eq!(live.len() as u32, st.ring.segment(slot).live_blocks);
    inner.pins[slot as usize].fetch_add(1, Ordering::AcqRel);
    drop(st);
    // One sequential read of the whole segment, then checksums, all without the lock.
    let mut seg_buf = inner.relocate_buf.lock();
    let off = inner.geo.offset_of(slot, 0);
    let read = inner.cache.read_at(&mut seg_buf, off).map_err(|e| {
        Error::io(
            format!("relocator reading segment {head} at offset {off}"),
            e,
        )
    });
    let verified: Vec<bool> = live
        .iter()
        .map(|l| {
            let b = l.block_in_segment as usize * BLOCK;
            read.is_ok()
                && inner
                    .geo
                    .block_verifies(l.lba, &seg_buf[b..b + BLOCK], l.crc)
        })
        .collect();
    let mut st = inner.state.lock();
    if let Err(e) = read {
        // Not retried: the segment holds dirty blocks only the cache has, and a device that
        // fails a read of them will fail writeback's too. Fail the engine, saying why, so
        // status shows it and waiting requests get it (a bare Err stopped the flusher with
        // the engine still "healthy", and every flush then hung).
        inner.pins[slot as usize].fetch_sub(1, Ordering::AcqRel);
        return Err(fail_cache(inner, st, e));
    }
    let mut moved = 0u64;
    let now = crate::sync::now();
    for (l, ok) in live.iter().zip(verified) {
        let seg_buf = &*seg_buf;
        if !ok {
            st.counters.checksum_errors += 1;
            if st.blocks.lookup(l.lba) == Some(l.cache_block) && st.blocks.dirty(l.cache_block) != 0
            {
                // Its newest data is gone, writeback cannot write it and nothing can move it:
                // the head can never pass this segment, and once the ring came round writers
                // would wait for room forever with the engine "healthy". Fail, saying so.
                inner.pins[slot as usize].fetch_sub(1, Ordering::AcqRel);
                let e = Error::Corruption(format!(
                    "dirty block {} fails its checksum on the cache device (cache block {}): its newest data is lost, and the log cannot reclaim the segment holding it, so new writes cannot get room; give the cache up (the backing device holds every other block as last written back)",
                    l.lba, l.cache_block
                ));
                return Err(fail_cache(inner, st, e));
            }
            // A damaged clean block stays where it is; reads of it go to the backing device.
            continue;
        }
        if st.blocks.lookup(l.lba) != Some(l.cache_block) {
            continue; // overwritten while we read
        }
        let Some(nc) = st.reserve_block(&inner.buffers, || now, true) else {
            break;
        };
        let Location::OpenChunk { buffer } = st.locate(nc) else {
            unreachable!("a reserved block is in the open chunk")
        };
        let noff = st.offset_in_buffer(nc);
        let b = l.block_in_segment as usize * BLOCK;
        // SAFETY: the reserved block is in the open chunk and we hold the lock.
        unsafe { inner.buffers.slice_mut(buffer, noff, BLOCK) }
            .copy_from_slice(&seg_buf[b..b + BLOCK]);
        let c = l.cache_block;
        let (dirty, valid) = (st.blocks.dirty(c), st.blocks.valid(c));
        st.set_dirty_mask(nc, dirty);
        st.blocks.set_valid(nc, valid);
        let prev = st.map(l.lba, nc);
        assert_eq!(prev, Some(l.cache_block));
        st.kill(l.cache_block);
        moved += 1;
    }
    inner.pins[slot as usize].fetch_sub(1, Ordering::AcqRel);
    st.counters.blocks_relocated += moved;
    if moved > 0 {
        st.promotion.note_relocation(now);
    }
    // The caller seals once after a batch of relocations, so they share one chunk.
    Ok((
        st,
        HeadWork {
            moved: moved > 0,
            evicted,
        },
    ))
}
