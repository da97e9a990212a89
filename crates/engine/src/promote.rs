//! Promotion of read misses: whole blocks read from the backing device are copied into the
//! open chunk as clean blocks, when read caching is on, the read is not part of a long
//! sequential stream, the log is not congested and nothing could have made them stale.
//! Runs on the reader's thread after its backing read; it never waits for room.

use crate::format::{BLOCK_SIZE_BYTES, FULL_MASK};
use crate::inner::{check_usable, Inner};
use crate::state::{Location, State};
use crate::tunables;

const BLOCK: usize = BLOCK_SIZE_BYTES as usize;

/// Whether this request's misses should be promoted: read caching on, not part of a stream
/// past the sequential cutoff, the log not congested, and no write bypassing the cache in
/// flight. The log is congested while the relocator has moved dirty blocks lately: the ring is
/// then full of dirty data, so each promoted (clean) block costs log bandwidth and room that
/// relocations need, and lives only until the head comes round, which under such load is
/// seconds (bcache likewise bypasses a congested cache device).
pub fn decide(inner: &Inner, st: &mut State, offset_bytes: u64, len_bytes: u64) -> bool {
    if inner.tunables.get(tunables::READ_CACHE) == 0 {
        return false;
    }
    let run_bytes = st.streams.observe(offset_bytes, len_bytes);
    let cutoff_bytes = inner.tunables.get(tunables::READ_SEQUENTIAL_CUTOFF_KIB) * 1024;
    if cutoff_bytes > 0 && run_bytes > cutoff_bytes {
        st.counters.promotions_sequential_skipped += 1;
        return false;
    }
    let congested = st.promotion.congested(inner.drive.clock());
    if congested {
        st.counters.promotions_congested_skipped += 1;
        return false;
    }
    !st.bypass.in_flight()
}

/// Copies the whole blocks of `data` (read from the backing device at `offset`) into the log
/// as clean blocks. Gives up if anything that could make them stale happened since the request
/// started (`guard`), or the log is short of room: a promotion never waits.
pub fn promote(inner: &Inner, guard: u64, offset_bytes: u64, data: &[u8]) {
    let first = offset_bytes.div_ceil(BLOCK_SIZE_BYTES);
    let end = (offset_bytes + data.len() as u64) / BLOCK_SIZE_BYTES;
    if first >= end {
        return;
    }
    let mut st = inner.state.lock();
    if check_usable(&st).is_err() {
        return;
    }
    if st.promotion.guard() != guard || st.bypass.in_flight() || st.under_pressure() {
        st.counters.promotions_raced += end - first;
        return;
    }
    let sealed_before = st.counters.chunks_sealed;
    for lba in first..end {
        if st.blocks.lookup(lba).is_some() {
            continue; // written since it was read: the cache has newer data
        }
        let Some(c) = st.reserve_block(&inner.buffers, crate::sync::now, false) else {
            st.counters.promotions_raced += end - lba;
            break;
        };
        let Location::OpenChunk { buffer } = st.locate(c) else {
            unreachable!("a reserved block is in the open chunk")
        };
        let off = st.offset_in_buffer(c);
        let src = ((lba * BLOCK_SIZE_BYTES - offset_bytes) as usize)..;
        // SAFETY: the reserved block is in the open chunk and we hold the lock.
        unsafe { inner.buffers.slice_mut(buffer, off, BLOCK) }.copy_from_slice(&data[src][..BLOCK]);
        st.blocks.set_valid(c, FULL_MASK);
        let prev = st.map(lba, c);
        assert!(prev.is_none());
        st.counters.promotions += 1;
        st.counters.promotion_bytes += BLOCK_SIZE_BYTES;
    }
    if st.counters.chunks_sealed != sealed_before {
        inner.flusher_wake.notify_one();
    }
}
