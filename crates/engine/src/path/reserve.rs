//! Large writes received straight into the log: the caller reserves the blocks first, fills
//! them (an NBD connection's reader `recv`s the payload into them: the only copy after the
//! kernel's), then commits, which publishes them into the index as a write of those blocks
//! would. Nothing is visible before the commit; a reservation let go (the connection closed
//! mid-payload) leaves only holes behind. See `state/reservations.rs` for how chunks wait for
//! reserved blocks and when a reservation gives up publishing: the commit then copies the data
//! out for the caller to write the ordinary way (`path/write.rs`), at the end of the log.

use crate::error::Result;
use crate::format::chunk::{self, Entry, KIND_DATA};
use crate::format::{BLOCK_SIZE_BYTES, FULL_MASK};
use crate::inner::{check_usable, Inner};
use crate::state::reservations::{Run, RUNS_MAX};
use crate::state::State;

const BLOCK: usize = BLOCK_SIZE_BYTES as usize;
/// As `write::PREFETCH_AHEAD_BLOCKS`.
const PREFETCH_AHEAD_BLOCKS: u64 = 4;

/// Blocks reserved for a write of whole blocks `lba..lba + count`.
#[derive(Debug)]
pub struct Reserved {
    id: u64,
    lba: u64,
    count: u64,
    runs: [Run; RUNS_MAX],
    /// Each run's RAM buffer (pinned while reserved).
    buffers: [u32; RUNS_MAX],
    run_count: usize,
}

impl Reserved {
    pub fn len_bytes(&self) -> usize {
        self.count as usize * BLOCK
    }

    /// The runs, in the write's order: run `i` holds its next `count` blocks.
    pub fn runs(&self) -> &[Run] {
        &self.runs[..self.run_count]
    }
}

/// Reserves log blocks for a write of `len_bytes` (whole blocks) at `offset_bytes`; None when
/// there is no room now (or writers wait for it), and the caller writes the ordinary way.
pub fn reserve(inner: &Inner, offset_bytes: u64, len_bytes: u64) -> Result<Option<Reserved>> {
    assert_eq!(
        offset_bytes % BLOCK_SIZE_BYTES,
        0,
        "a reservation of part of a block"
    );
    assert!(len_bytes > 0 && len_bytes.is_multiple_of(BLOCK_SIZE_BYTES));
    let (lba, count) = (
        offset_bytes / BLOCK_SIZE_BYTES,
        len_bytes / BLOCK_SIZE_BYTES,
    );
    let mut st = inner.state.lock();
    check_usable(&st)?;
    let sealed_before = st.counters.chunks_sealed;
    let mut runs = [Run::default(); RUNS_MAX];
    let taken = st.reserve_runs(&inner.buffers, lba, count, crate::sync::now(), &mut runs);
    if st.counters.chunks_sealed != sealed_before {
        inner.flusher_wake.notify_one();
    }
    Ok(taken.map(|(id, run_count)| {
        let mut buffers = [u32::MAX; RUNS_MAX];
        for (b, r) in buffers.iter_mut().zip(&runs[..run_count]) {
            *b = st.ring.segment(r.slot).buffer;
        }
        Reserved {
            id,
            lba,
            count,
            runs,
            buffers,
            run_count,
        }
    }))
}

/// The bytes of run `i` of reservation `res`.
///
/// # Safety
/// `res` must not be committed or released yet, and the caller its only user: reserved blocks
/// are in no index entry, so nobody else reads or writes them (the flusher may write a
/// cancelled one to the device as a hole, never reading it), and their buffer is pinned.
#[allow(clippy::mut_from_ref)]
pub unsafe fn run_bytes<'a>(inner: &'a Inner, res: &Reserved, i: usize) -> &'a mut [u8] {
    let r = &res.runs()[i];
    inner.buffers.slice_mut(
        res.buffers[i],
        r.first_block as usize * BLOCK,
        r.count as usize * BLOCK,
    )
}

/// Publishes a filled reservation: its blocks become the newest copies of their lbas, dirty,
/// as `write::write` would make them. Returns false when it could not (`may_publish` false,
/// it conflicted, was cancelled, or the engine cannot take writes now): then the data was
/// copied into `redo` and the caller must write it the ordinary way before acknowledging the
/// write. Either way the reservation is over.
pub fn commit(inner: &Inner, res: Reserved, redo: &mut Vec<u8>, may_publish: bool) -> bool {
    let mut st = inner.state.lock();
    let fin = st.reservations.finish(res.id);
    if may_publish && fin.publishable && check_usable(&st).is_ok() {
        publish(inner, &mut st, &res);
        return true;
    }
    // Let go (holes), unless a cancel did; the buffers stay pinned until copied out.
    let mut wake = false;
    if fin.pending {
        for r in res.runs() {
            wake |= st.let_go(r);
        }
    }
    st.counters.reserved_writes_redone += 1;
    drop(st);
    if wake {
        inner.flusher_wake.notify_one();
    }
    redo.clear();
    redo.reserve(res.len_bytes());
    for i in 0..res.run_count {
        // SAFETY: still pinned and ours (see `run_bytes`).
        redo.extend_from_slice(unsafe { run_bytes(inner, &res, i) });
    }
    unpin_all(&mut inner.state.lock(), &res);
    false
}

fn unpin_all(st: &mut State, res: &Reserved) {
    for (r, &buffer) in res.runs().iter().zip(&res.buffers) {
        st.ring.unpin(r.slot, buffer, r.count);
    }
}

/// Lets a reservation go unpublished (its payload never fully arrived): its blocks stay holes.
pub fn release(inner: &Inner, res: Reserved) {
    let mut st = inner.state.lock();
    let fin = st.reservations.finish(res.id);
    let mut wake = false;
    if fin.pending {
        for r in res.runs() {
            wake |= st.let_go(r);
        }
    }
    unpin_all(&mut st, &res);
    drop(st);
    if wake {
        inner.flusher_wake.notify_one();
    }
}

fn publish(inner: &Inner, st: &mut State, res: &Reserved) {
    st.zeros.remove(res.lba, res.lba + res.count);
    st.counters.writes += 1;
    st.counters.write_bytes += res.count * BLOCK_SIZE_BYTES;
    st.counters.writes_reserved += 1;
    let seq = st.seqs.next();
    st.changes.mark(res.lba, res.count, seq);
    st.bypass.spoil_trims(res.lba, res.lba + res.count);
    let mut lba = res.lba;
    let mut wake = false;
    for r in res.runs() {
        // A run whose chunk was sealed meanwhile (a hole in its entries so far) gets its
        // entries now: the chunk waits in the queue until it has them, so its metadata is
        // still ours (state/buffers.rs).
        let queued = st
            .ring
            .pending_chunk(r.chunk_seq)
            .map(|sc| (sc.buffer, sc.start_block, sc.meta_blocks));
        for b in r.first_block..r.first_block + r.count {
            // The index slot a few blocks on: its cache miss overlaps this block's work (as
            // in write.rs).
            let ahead = res.lba + res.count - 1;
            st.blocks.prefetch((lba + PREFETCH_AHEAD_BLOCKS).min(ahead));
            let c = st.geo.cache_block(r.slot, b);
            debug_assert!(st.blocks.lba_of(c).is_none());
            st.blocks.set_valid(c, FULL_MASK);
            let prev = st.map(lba, c);
            let prev_dirty = prev.map_or(0, |p| st.blocks.dirty(p));
            if prev_dirty == 0 {
                st.counters.blocks_dirtied += 1;
            }
            st.set_dirty_mask(c, FULL_MASK);
            if let Some(p) = prev {
                // This entry is in the run's chunk, not in the one being filled now.
                st.retire_recorded_in(p, lba, r.chunk_seq);
            }
            super::write::count_write(st, prev.is_some(), FULL_MASK);
            if let Some((buffer, start_block, meta_blocks)) = queued {
                let entry = Entry {
                    lba,
                    data_crc: 0,
                    kind: KIND_DATA,
                    dirty_mask: FULL_MASK,
                    valid_mask: FULL_MASK,
                };
                // SAFETY: the chunk is queued and pending (`pending_chunk`), we hold the lock.
                let meta = unsafe {
                    inner.buffers.slice_mut(
                        buffer,
                        start_block as usize * BLOCK,
                        meta_blocks as usize * BLOCK,
                    )
                };
                chunk::put_entry(meta, (b - start_block - meta_blocks) as usize, &entry);
            }
            lba += 1;
        }
        wake |= st.ring.unpend(r.chunk_seq, r.count);
    }
    unpin_all(st, res);
    assert_eq!(lba, res.lba + res.count, "runs cover the write");
    if wake {
        inner.flusher_wake.notify_one();
    }
}
