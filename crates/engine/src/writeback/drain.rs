//! The writeback position and draining: which chunks recovery may replay as clean (persisted
//! as `writeback_seq` in the checkpoint), `drain` (everything written back, on the caller's
//! thread) and the manual-mode `step`.

use std::time::{Duration, Instant};

use parking_lot::MutexGuard;

use super::batch::{batch, WritebackBuffers};
use super::policy::Pacer;
use crate::error::{Error, Result};
use crate::inner::{mark_failed, Inner};
use crate::log::flusher::wait_durable;
use crate::state::State;
use crate::tunables;

/// The writeback position is persisted at most this often (and at close).
const PERSIST_EVERY: Duration = Duration::from_secs(1);
/// A drain fails once writeback has kept failing for this long (it retries meanwhile).
const DRAIN_ERROR_PATIENCE: Duration = Duration::from_secs(3);

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

fn persist_position(inner: &Inner, st: &mut MutexGuard<'_, State>, pos: u64) -> Result<()> {
    let res = MutexGuard::unlocked(st, || inner.superblock.advance_writeback(pos));
    match res {
        Ok(()) => {
            st.writeback.note_persisted(pos);
            st.counters.superblock_writes += 1;
            Ok(())
        }
        Err(e) => {
            mark_failed(inner, st, e.to_string());
            Err(e)
        }
    }
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
        st.writeback.drain_requests().enter();
        (st.blocks.dirty_blocks(), st.counters.writeback_blocks)
    };
    let res = (|| {
        let mut failing_since: Option<Instant> = None;
        let mut bufs = inner.drive.inline().then(|| {
            WritebackBuffers::new(inner.tunables.get(tunables::WRITEBACK_BATCH_BLOCKS) as usize)
        });
        loop {
            // Writeback takes only durable chunks: seal and sync what is in RAM.
            wait_durable(inner)?;
            let mut st = inner.state.lock();
            let p = DrainProgress {
                dirty_blocks_at_start: start,
                dirty_blocks: st.blocks.dirty_blocks(),
                written_back_blocks: st.counters.writeback_blocks - wb0,
            };
            progress(p);
            if st.blocks.dirty_blocks() == 0 {
                let pos = writeback_position(&st);
                if pos > st.writeback.persisted_seq() {
                    persist_position(inner, &mut st, pos)?;
                }
                return Ok(());
            }
            // Writeback retries a failed batch; give up only once it has kept failing for a
            // while, so a transient backing error (a network blip) does not fail the drain.
            match st.writeback.error() {
                Some(e) => {
                    let since = *failing_since.get_or_insert_with(Instant::now);
                    if bufs.is_some() || since.elapsed() >= DRAIN_ERROR_PATIENCE {
                        return Err(Error::Io {
                            what: "drain stopped: writeback failed".into(),
                            source: std::io::Error::other(e.to_string()),
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
            st.health.check_failed()?;
        }
    })();
    inner.state.lock().writeback.drain_requests().leave();
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
    if pos > st.writeback.persisted_seq() {
        persist_position(inner, &mut st, pos)?;
    }
    Ok(n)
}
