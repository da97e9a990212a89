//! The writeback position: which chunks recovery may replay as clean (persisted as
//! `writeback_seq` in the checkpoint), and the manual-mode `step`. (`drain`, everything written
//! back on the caller's thread, is `drive`'s: it differs by mode.)

use std::time::{Duration, Instant};

use crate::sync::MutexGuard;

use super::batch::{batch, WritebackBuffers};
use super::policy::Pacer;
use crate::error::Result;
use crate::inner::{fail_cache_held, Inner};
use crate::state::State;
use crate::tunables;

/// The writeback position is persisted at most this often (and at close).
const PERSIST_EVERY: Duration = Duration::from_secs(1);

/// Persists the writeback position if it moved and the last write was a while ago (or a
/// drain waits for it).
pub fn maybe_persist(
    inner: &Inner,
    st: &mut MutexGuard<'_, State>,
    pacer: &mut Pacer,
    now: Instant,
) {
    let pos = writeback_position(st);
    if pos <= st.writeback.persisted_seq() {
        return;
    }
    if now.saturating_duration_since(pacer.last_persist) < PERSIST_EVERY && !st.writeback.draining()
    {
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
        .writeback
        .zero_pending_seq()
        .map_or(st.seqs.synced(), |s| st.seqs.synced().min(s - 1));
    st.ring
        .in_log()
        .map(|(_, _, seg)| seg)
        .find(|seg| seg.dirty_blocks > 0 || seg.dead_by_seq > st.seqs.synced())
        .map_or(limit, |seg| seg.first_seq.saturating_sub(1).min(limit))
}

pub fn persist_position(inner: &Inner, st: &mut MutexGuard<'_, State>, pos: u64) -> Result<()> {
    let res = crate::sync::unlocked(st, || inner.superblock.advance_writeback(pos));
    match res {
        Ok(()) => {
            st.writeback.note_persisted(pos);
            st.counters.superblock_writes += 1;
            super::record::write(inner, st);
            Ok(())
        }
        Err(e) => {
            // The superblock copy being written may be torn: a cache-device failure.
            fail_cache_held(inner, st, &e);
            Err(e)
        }
    }
}

/// Manual mode: one writeback batch of up to `max_blocks`, ignoring the policy, and at most
/// `writeback_batch_blocks`' largest value (the batch buffer is sized by it: `usize::MAX`
/// overflowed its byte size). Returns the blocks written back.
pub fn step(inner: &Inner, max_blocks: usize) -> Result<u64> {
    let max_blocks =
        max_blocks.min(tunables::SPECS[tunables::WRITEBACK_BATCH_BLOCKS].max_value() as usize);
    let mut bufs = WritebackBuffers::new(max_blocks);
    let st = inner.state.lock();
    let (mut st, res) = batch(inner, st, &mut bufs, max_blocks);
    let n = res?;
    let pos = writeback_position(&st);
    if pos > st.writeback.persisted_seq() {
        persist_position(inner, &mut st, pos)?;
    }
    Ok(n)
}
