//! The writeback record in the backing device's label (`format::label::WritebackRecord`): what
//! the backing device alone holds, kept there so that `logcache detach --force` can say how
//! stale the disk is when the cache device is lost. Written after each persisted writeback
//! position and each flush epoch written back whole, at most once a second while writeback is
//! behind and once when it catches up: everything it claims is synced on the backing device by
//! then. It is written without a sync of its own (the next
//! batch's sync carries it) except when nothing is left behind: a crash may leave the previous
//! record, which claims less, never more.

use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::io::BlockDevice as _;
use crate::sync::MutexGuard;

use crate::format::label::{WritebackRecord, RECORD_OFFSET_IN_LABEL_BYTES, RECORD_SORTED};
use crate::format::BLOCK_SIZE_BYTES;
use crate::inner::Inner;
use crate::state::State;

/// How often the record is rewritten while writeback is behind (threads mode; manual mode reads
/// no clock and writes it every time, so a seeded run replays the same IOs).
const RECORD_EVERY: Duration = Duration::from_secs(1);

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(1, |d| d.as_millis() as u64)
        .max(1)
}

/// Writes the record for the state now. A failure is counted and left to the next position
/// change (the writeback batches report a failing backing device themselves).
pub fn write(inner: &Inner, st: &mut MutexGuard<'_, State>) {
    if inner.alone.load(Ordering::Acquire) != crate::path::alone::NO {
        // The cache is being given up: the label is marked detached (`path::alone`).
        return;
    }
    let now = SystemTime::now();
    let as_of = st.backing_consistent_as_of(now);
    let lag_bytes = st.blocks.dirty_blocks() * BLOCK_SIZE_BYTES;
    if as_of.is_none() && st.ordered() {
        // Recovered epochs of unknown age: the record already there still holds (it claims
        // less than the truth).
        return;
    }
    let record = WritebackRecord {
        format_id: inner.geo.format_id,
        flags: if st.ordered() { 0 } else { RECORD_SORTED },
        consistent_as_of_unix_ms: as_of.map_or(0, unix_ms),
        recorded_unix_ms: unix_ms(now),
        lag_bytes,
        detached_unix_ms: 0,
        lost_bytes: 0,
    };
    // The label is the exported disk's end: `exported_size_bytes` is its offset.
    let offset = inner.geo.exported_size_bytes + RECORD_OFFSET_IN_LABEL_BYTES;
    let raw = record.encode();
    let clock = inner.drive.clock();
    let res = crate::sync::unlocked(st, || {
        // One record write at a time (the writeback thread, a drain, close): two writes of
        // one range must not be in flight together. Taken without the state lock.
        let mut last = inner.last_record.lock();
        if let Some(now) = clock {
            // A far seek on a disk: at most once a second (a record claiming an older state is
            // still true; the writeback thread writes a paced-off one later, `pending`), and at
            // once when writeback catches up after being behind.
            let due = last.is_none_or(|(at, lag)| {
                now.saturating_duration_since(at) >= RECORD_EVERY || (lag_bytes == 0 && lag != 0)
            });
            if !due {
                inner.record_pending.store(true, Ordering::Relaxed);
                return Ok(());
            }
            inner.record_pending.store(false, Ordering::Relaxed);
            *last = Some((now, lag_bytes));
        }
        inner.backing.write_at(&raw, offset).map_err(Ok)?;
        if lag_bytes == 0 {
            // Err(Err(_)): the sync failed (a bypass write may be gone with it).
            inner.backing.flush().map_err(Err)?;
        }
        Ok::<(), Result<std::io::Error, std::io::Error>>(())
    });
    match res {
        Ok(()) => {}
        Err(Ok(_)) => st.counters.io_errors += 1,
        Err(Err(e)) => {
            st.counters.io_errors += 1;
            st.backing_writes_lost(
                format!("syncing {}: {e}", inner.backing.describe()),
                inner.backing.failed_syncs(),
            );
        }
    }
}

/// Writes a record paced off earlier, if any (the writeback thread, when idle).
pub fn write_pending(inner: &Inner, st: &mut MutexGuard<'_, State>) {
    if inner.record_pending.load(Ordering::Relaxed) {
        write(inner, st);
    }
}
