//! IO that reaches the backing device outside writeback: write-through and write-around
//! writes, write-zeroes and TRIM (a discard passed on), and the backing-device syncs that
//! flushes owe for them.
//!
//! The rule they all follow: before the backing device's data for a block changes, a durable
//! log entry drops every cached copy of it (a drop or zero range). Otherwise a crash could
//! replay an older clean copy over newer data on the backing device, and, worse, an evicted
//! clean block's entry could come back from the log (eviction is not logged). The cost is a
//! cache-device sync per such request, shared by concurrent ones (group commit in the flusher).
//!
//! A block with a dirty cached copy is written the write-back way even in the other modes:
//! writeback may have that copy in flight to the backing device, and the new data must not
//! race it there. Outside write-back mode writeback runs at full speed, so such blocks do not
//! stay dirty for long.

use crate::sync::MutexGuard;

use super::write;
use crate::drive::wait_durable;
use crate::drive::wait_for_room;
use crate::drive::writeback_step_here;
use crate::drive::WritebackPatience;
use crate::error::{Error, Result};
use crate::format::chunk::{Entry, KIND_DROP, KIND_ZERO};
use crate::format::BLOCK_SIZE_BYTES;
use crate::inner::{check_usable, fail_cache_held, mark_failed, Inner};
use crate::io::BlockDevice;
use crate::open::recover::ZeroRange;
use crate::state::bypass::Lost;
use crate::state::State;
use crate::tunables;
use std::time::Duration;

/// Zeros for the partial blocks at the ends of a zeroed range.
static ZERO_BLOCK: [u8; BLOCK_SIZE_BYTES as usize] = [0; BLOCK_SIZE_BYTES as usize];

/// Blocks `[first, end)` a byte range touches.
fn blocks_of(offset_bytes: u64, len_bytes: u64) -> (u64, u64) {
    (
        offset_bytes / BLOCK_SIZE_BYTES,
        (offset_bytes + len_bytes).div_ceil(BLOCK_SIZE_BYTES),
    )
}

/// Whether the write must go the write-back way: a block of the range has a dirty cached copy,
/// or (in flush-epoch order) anything older is owed to the backing device, a dirty block or a
/// zero range not yet applied, since data reaching the backing device now would overtake older
/// epochs (a zero range's epoch may have lost its killed dirty copies for good: sim seed 141);
/// or a write-zeroes of a block of the range is on its way to the backing device, where its
/// zeros could land after this write's data (the cache would then keep a clean copy the
/// backing device no longer holds).
fn any_dirty(st: &State, first: u64, end: u64) -> bool {
    if st.bypass.zeroing_any(first, end) {
        return true;
    }
    if st.ordered() {
        return st.blocks.dirty_blocks() > 0 || st.writeback.zero_pending_seq().is_some();
    }
    if st.blocks.dirty_blocks() == 0 {
        return false;
    }
    (first..end).any(|lba| {
        st.blocks
            .lookup(lba)
            .is_some_and(|c| st.blocks.dirty(c) != 0)
    })
}

/// Logs range entries of `kind` over blocks `[lba, end)` and drops their cached copies, as far
/// as the log has room. Returns the first block not logged yet (`end` when done), the
/// sequences of the chunks holding the first and the last entry (0 if none was logged), and
/// where the first of those chunks is (segment id, first block).
fn log_range_some(
    st: &mut State,
    inner: &Inner,
    kind: u8,
    mut lba: u64,
    end: u64,
) -> (u64, u64, u64, (u64, u32)) {
    let mut seq = 0;
    let mut last_seq = 0;
    let mut pos = (0, 0);
    while lba < end {
        let count = (end - lba).min(u32::MAX as u64) as u32;
        if !st.add_range(
            &inner.buffers,
            Entry::range(kind, lba, count),
            crate::sync::now(),
        ) {
            break;
        }
        if seq == 0 {
            let o = st.ring.open();
            seq = o.seq;
            pos = (o.segment_id, o.start_block);
        }
        last_seq = st.ring.open().seq;
        let dropped = st.kill_range(lba, count as u64);
        // A zero range reads as zeros from now on; a drop range (TRIM, or a write bypassing the
        // cache) may leave anything.
        if kind == KIND_ZERO {
            st.zeros.insert(lba, lba + count as u64);
        } else {
            st.zeros.remove(lba, lba + count as u64);
        }
        st.counters.blocks_invalidated += dropped;
        lba += count as u64;
    }
    (lba, seq, last_seq, pos)
}

/// Logs the drop range of a bypass write of blocks `[first, end)` (`begin_bypass_write`),
/// waiting for room in the log until it is all logged. `false`, with the rest not logged: while
/// this write waited for room, a block of the range got a dirty copy (a write that went the
/// write-back way meanwhile) or another bypass write of them began. A drop range logged then
/// would kill that dirty copy, newest data of sectors this write does not cover among them
/// (sim seed 181568: a write-around's drop range, logged after its wait, killed a concurrent
/// partial write's only copy, and reads of its sectors returned the backing device's older
/// data); the caller starts over.
fn log_drop_range<'a>(
    inner: &'a Inner,
    mut st: MutexGuard<'a, State>,
    first: u64,
    end: u64,
) -> Result<(MutexGuard<'a, State>, bool)> {
    let mut lba = first;
    loop {
        check_usable(&st)?;
        (lba, _, _, _) = log_range_some(&mut st, inner, KIND_DROP, lba, end);
        if lba == end {
            return Ok((st, true));
        }
        st = wait_for_room(inner, st)?;
        crate::failpoint::bypass_waited_for_room(inner, &mut st);
        if any_dirty(&st, first, end) || st.bypass.writing_any(first, end) {
            return Ok((st, false));
        }
    }
}

fn backing_write(inner: &Inner, offset_bytes: u64, data: &[u8]) -> Result<()> {
    inner.backing.write_at(data, offset_bytes).map_err(|e| {
        Error::io(
            format!(
                "writing {} bytes at {offset_bytes} to the backing device",
                data.len()
            ),
            e,
        )
    })
}

/// Runs `io` against the backing device as a bypass write: promotions stay off while it is in
/// flight, and flushes learn they owe a backing-device sync. It counts as in flight from `st`,
/// the lock hold that logged its drop range: a read miss after that point reads backing data
/// the write is about to replace, and must not promote it.
///
/// A write is counted unsynced (`write_gen`) only when it ends, so a backing sync that failed
/// while it was under way, after its data landed, may have dropped it unseen: the failure's
/// handler found nothing unsynced, and the next sync's success would vouch for it. So a
/// write-around write (no copy to write again) that saw a sync fail meanwhile counts as lost;
/// a write-through write marks its copy dirty instead (`end_bypass_write`). And one that ends
/// after the cache was given up returns an error: the switch took its unsynced writes before
/// this one counted, so it is written again from the backing device alone, where a failed sync
/// counts it (cache-loss sim seed 150057: the switch's sync failed after this write's data
/// landed, and a flush then returned OK without it).
fn bypass_io<'a>(
    inner: &'a Inner,
    mut st: MutexGuard<'a, State>,
    around: bool,
    io: impl FnOnce() -> Result<()>,
) -> Result<()> {
    let log_pos = st.log_pos();
    st.bypass.begin_write(inner.backing.reconnects(), log_pos);
    // Read before the data can land: a failure counted after it may have dropped the write.
    let failed_syncs_before = inner.backing.failed_syncs();
    drop(st);
    let mut res = io();
    let mut st = inner.state.lock();
    st.bypass.end_write(around);
    st.promotion.invalidate();
    if res.is_err() {
        st.counters.io_errors += 1;
    } else if inner.alone.load(std::sync::atomic::Ordering::Acquire) != crate::path::alone::NO {
        // Not acknowledged here: `Engine::write` sends it again once the switch decided.
        res = Err(check_usable(&st).err().unwrap_or_else(|| {
            Error::Failed("the cache device failed while the write was under way".into())
        }));
    } else if around && inner.backing.failed_syncs() != failed_syncs_before {
        st.bypass.note_around_lost();
    }
    res
}

/// Logs the drop range of a write-through or write-around of blocks `[first, end)` and marks it
/// under way (`Bypass::writing`), once no other such write of those blocks is: overlapping
/// ones go one after the other, so a clean copy is never logged after a newer write's drop
/// range (a power cut that lost the newer clean copy would replay the older one over the
/// backing device's newer data; without a cut the cache would keep the older one). `None`: the
/// write must go the write-back way instead (`any_dirty`).
fn begin_bypass_write(
    inner: &Inner,
    offset_bytes: u64,
    len_bytes: u64,
) -> Result<Option<MutexGuard<'_, State>>> {
    let (first, end) = blocks_of(offset_bytes, len_bytes);
    let mut st = inner.state.lock();
    loop {
        check_usable(&st)?;
        if any_dirty(&st, first, end) {
            return Ok(None);
        }
        if st.bypass.writing_any(first, end) {
            inner.progress.wait_for(&mut st, Duration::from_millis(100));
            continue;
        }
        // A block this write covers only in part loses the cached copy's other sectors with
        // the drop range (the new copy holds this write's sectors only): as an eviction, a
        // failed sync may then have lost a bypass write nothing can write again (cache-loss
        // sim seed 101855: a partial write-through over a block a dropped write-through wrote).
        for lba in [first, end - 1] {
            let covered_bytes = (offset_bytes + len_bytes).min((lba + 1) * BLOCK_SIZE_BYTES)
                - offset_bytes.max(lba * BLOCK_SIZE_BYTES);
            if covered_bytes < BLOCK_SIZE_BYTES {
                st.note_copy_dropped(lba);
            }
        }
        let logged;
        (st, logged) = log_drop_range(inner, st, first, end)?;
        // Otherwise another write (or a zeroing) of these blocks began while this one waited
        // for room in the log: check again from the start (it may have to go the write-back
        // way now, or wait for the other write and log the range again).
        if logged {
            debug_assert!(!st.bypass.writing_any(first, end) && !any_dirty(&st, first, end));
            st.bypass.begin_writing(first, end);
            st.bypass.spoil_trims(first, end);
            return Ok(Some(st));
        }
    }
}

/// A bypass write is over: a write or zero range of its blocks waiting for it may go on.
/// `logged_since_losses`: a write-through write whose clean copy is logged, with the count of
/// failed backing syncs (`Bypass::losses`) when it began. If one failed since, it came after
/// this write's data reached the backing device and may have missed the copy logged since
/// (`state/lost.rs`): that copy goes dirty too. Checked in the same lock hold that ends the
/// write, so the rule costs no extra lock.
fn end_bypass_write(inner: &Inner, first: u64, end: u64, logged_since_losses: Option<u64>) {
    let mut st = inner.state.lock();
    if logged_since_losses.is_some_and(|losses| st.bypass.losses() != losses) {
        st.mark_copies_dirty(first, end);
    }
    st.bypass.end_writing(first, end);
    drop(st);
    inner.progress.notify_all();
}

/// Write-through: the data reaches the backing device, then the log as a clean block. Under
/// way until the clean copy is logged: a zero range logged before that could land its zeros
/// after this data and leave the clean copy wrong.
pub fn write_through(inner: &Inner, offset_bytes: u64, data: &[u8]) -> Result<()> {
    let (first, end) = blocks_of(offset_bytes, data.len() as u64);
    let Some(mut st) = begin_bypass_write(inner, offset_bytes, data.len() as u64)? else {
        return write::write(inner, offset_bytes, data, true);
    };
    st.counters.write_through_writes += 1;
    let losses = st.bypass.losses();
    let res = bypass_io(inner, st, false, || {
        wait_durable(inner)?;
        backing_write(inner, offset_bytes, data)
    })
    .and_then(|()| write::write(inner, offset_bytes, data, false));
    end_bypass_write(inner, first, end, res.is_ok().then_some(losses));
    res
}

/// Write-around: the data goes to the backing device only; cached copies are dropped.
pub fn write_around(inner: &Inner, offset_bytes: u64, data: &[u8]) -> Result<()> {
    let (first, end) = blocks_of(offset_bytes, data.len() as u64);
    let Some(mut st) = begin_bypass_write(inner, offset_bytes, data.len() as u64)? else {
        return write::write(inner, offset_bytes, data, true);
    };
    st.counters.writes += 1;
    st.counters.write_bytes += data.len() as u64;
    st.counters.write_around_writes += 1;
    // In flight from the logging on (defect: raised after the sync, a read miss in between
    // promoted the old backing data, and nothing killed that copy).
    let res = bypass_io(inner, st, true, || {
        wait_durable(inner)?;
        backing_write(inner, offset_bytes, data)
    });
    end_bypass_write(inner, first, end, None);
    res
}

/// Write-zeroes: afterwards the range reads as zeros in every mode.
///
/// Whole blocks: a zero range is logged and made durable, dropping every cached copy, then the
/// backing device zeroes the range with its own write-zeroes (a hole where it can) and is
/// synced. Recovery re-applies zero ranges the writeback position has not passed, so a crash
/// between the two steps still ends with zeros. Partial blocks at the ends are written as zeros
/// by the current mode.
pub fn zero(
    inner: &Inner,
    offset_bytes: u64,
    len_bytes: u64,
    write_partial: impl Fn(u64, &[u8]) -> Result<()>,
) -> Result<()> {
    {
        let mut st = inner.state.lock();
        check_usable(&st)?;
        st.counters.write_zeroes += 1;
        st.counters.write_zeroes_bytes += len_bytes;
    }
    let end_byte = offset_bytes + len_bytes;
    let (first, end) = whole_blocks_of(offset_bytes, len_bytes);
    if first >= end {
        // Within one block, or across one boundary without a whole block.
        let mut pos = offset_bytes;
        while pos < end_byte {
            let n = (BLOCK_SIZE_BYTES - pos % BLOCK_SIZE_BYTES).min(end_byte - pos);
            write_partial(pos, &ZERO_BLOCK[..n as usize])?;
            pos += n;
        }
        return Ok(());
    }
    let head = first * BLOCK_SIZE_BYTES - offset_bytes;
    if head > 0 {
        write_partial(offset_bytes, &ZERO_BLOCK[..head as usize])?;
    }
    let tail = end_byte - end * BLOCK_SIZE_BYTES;
    if tail > 0 {
        write_partial(end * BLOCK_SIZE_BYTES, &ZERO_BLOCK[..tail as usize])?;
    }
    zero_blocks(inner, first, end)
}

/// Blocks `[first, end)` a byte range covers whole.
fn whole_blocks_of(offset_bytes: u64, len_bytes: u64) -> (u64, u64) {
    (
        offset_bytes.div_ceil(BLOCK_SIZE_BYTES),
        (offset_bytes + len_bytes) / BLOCK_SIZE_BYTES,
    )
}

/// TRIM: a hint. NBD lets a client assume nothing about a trimmed range until it writes it
/// again, so nothing is zeroed: cached copies of the whole blocks (dirty ones too) are dropped
/// by a durable drop range, then the backing device gets a discard of them, under
/// `backing_order` so no writeback batch lands older data after it. Afterwards each trimmed
/// sector reads as data written there before, zeros, or what the backing device's discard
/// left: never data never written there. A crash changes nothing in that: the drop range is
/// durable before the discard is sent, and a discard the crash lost leaves older data, which
/// the rule allows; so no recovery bookkeeping (unlike write-zeroes' zero ranges). Partial
/// blocks at the ends are left as they are.
///
/// In flush-epoch order the TRIM does anything (drop range, discard) only when nothing older
/// waits for the backing device (no dirty block or shadow, no zero range pending): sent earlier
/// the discard would overtake older epochs, and the drop range would lose older epochs' dirty
/// copies at a power cut; the backing device would no longer be a past state of the disk. A
/// hint may be dropped, so it is then left out rather than waited for.
pub fn trim(inner: &Inner, offset_bytes: u64, len_bytes: u64) -> Result<()> {
    {
        let mut st = inner.state.lock();
        check_usable(&st)?;
        st.counters.discards += 1;
        st.counters.discard_bytes += len_bytes;
    }
    let (first, end) = whole_blocks_of(offset_bytes, len_bytes);
    if first >= end {
        return Ok(());
    }
    // The order lock is not held while waiting for room in the log: writeback may make it.
    // It is taken while logging, so no writeback batch holding a dropped block is in flight
    // (a batch holds it from collecting to marking clean), and once the drop range is logged
    // no batch can collect one; so it is let go while the drop range is synced (writeback
    // need not stall for that) and taken again only for the discard, which must not overtake
    // a batch in flight.
    let mut lba = first;
    let mut begun = false;
    loop {
        let order = inner.backing_order.lock();
        let mut st = inner.state.lock();
        if let Err(e) = check_usable(&st) {
            if begun {
                st.bypass.end_trimming(first, end);
            }
            return Err(e);
        }
        if !trim_in_order(&st) {
            // In flush-epoch order, with older data still owed to the backing device, the hint
            // is left out altogether: a drop range would also drop dirty copies of older epochs,
            // which the running engine keeps as shadows but recovery cannot (it cannot tell a
            // TRIM's drop range from a write-around's), so after a power cut the backing device
            // would miss them until writeback reached this epoch (found by the simulation's
            // backing check, CYCLES=3 seed 25). The content is then unchanged, but checkpoints
            // still count the blocks while running (an over-report is allowed); after a power
            // cut they may forget them, which is right since nothing there changed.
            let seq = st.seqs.next();
            st.changes.mark(lba, end - lba, seq);
            if begun {
                st.bypass.end_trimming(first, end);
            }
            return Ok(());
        }
        if !begun {
            st.bypass.begin_trimming(first, end);
            begun = true;
        }
        (lba, _, _, _) = log_range_some(&mut st, inner, KIND_DROP, lba, end);
        if lba == end {
            st.bypass.begin_io();
            break;
        }
        drop(order);
        match wait_for_room(inner, st) {
            Ok(st) => drop(st),
            Err(e) => {
                inner.state.lock().bypass.end_trimming(first, end);
                return Err(e);
            }
        }
    }
    let mut order = None;
    let res = (|| {
        wait_durable(inner)?;
        order = Some(inner.backing_order.lock());
        let st = inner.state.lock();
        // A write of these blocks since the TRIM began may already be on the backing device
        // (writeback ran while the drop range was synced): the discard must not land on it.
        if !trim_in_order(&st) || st.bypass.trim_spoiled(first, end) {
            return Ok(());
        }
        drop(st);
        let off = first * BLOCK_SIZE_BYTES;
        let len = (end - first) * BLOCK_SIZE_BYTES;
        // Devices without discard do nothing; either way the data there is older data.
        inner.backing.discard(off, len).map_err(|e| {
            Error::io(
                format!("discarding {len} bytes at {off} on the backing device"),
                e,
            )
        })
    })();
    let mut st = inner.state.lock();
    st.bypass.end_io();
    st.bypass.end_trimming(first, end);
    st.promotion.invalidate();
    if res.is_err() {
        // Not a failed engine: the cached copies are dropped for good and the backing device
        // holds older data, which a trimmed range may read as.
        st.counters.io_errors += 1;
    }
    drop(st);
    drop(order);
    res
}

/// Whether a TRIM may drop cached copies and pass its discard on now: in flush-epoch order only
/// while nothing older waits for the backing device (no dirty block or shadow, no zero range
/// pending).
fn trim_in_order(st: &State) -> bool {
    !st.ordered() || (st.blocks.dirty_blocks() == 0 && st.writeback.zero_pending_seq().is_none())
}

fn zero_blocks(inner: &Inner, first: u64, end: u64) -> Result<()> {
    // Writeback must not have a batch in flight: it could land stale data after the zeros. The
    // order lock is not held while waiting for room in the log: writeback may be what makes it.
    let mut lba = first;
    let mut seq_min = u64::MAX;
    let mut seq_max = 0;
    let mut ordered = false;
    // From the first logging on, a read miss in the range returns zeros: the backing device
    // still holds data older than the dirty copies the range drops (found by the concurrent
    // simulation: such a read returned data older than the newest acknowledged write).
    let mut begun = false;
    // Whether logging the range killed a dirty copy (its newest data then only on the way as
    // zeros: lost if the cache is given up before they land).
    let mut dropped_dirty = false;
    let abort = |begun: bool, dropped_dirty: bool| {
        if begun {
            end_zeroing(inner, &mut inner.state.lock(), first, end, dropped_dirty);
        }
    };
    let order = loop {
        let order = inner.backing_order.lock();
        let mut st = inner.state.lock();
        if let Err(e) = check_usable(&st) {
            drop(st);
            abort(begun, dropped_dirty);
            return Err(e);
        }
        if !begun {
            if st.bypass.writing_any(first, end) {
                // A write-through or write-around of the range is under way: the zeros go
                // after it (logged first, they could land before its data on the backing
                // device while its copy is logged clean after them). Later ones see this
                // zeroing and go the write-back way.
                drop(order);
                inner.progress.wait_for(&mut st, Duration::from_millis(100));
                continue;
            }
            st.bypass.begin_zeroing(first, end);
            st.bypass.spoil_trims(first, end);
            begun = true;
        }
        let dirty_before = st.blocks.dirty_blocks();
        let (next, seq, last, pos) = log_range_some(&mut st, inner, KIND_ZERO, lba, end);
        dropped_dirty |= st.blocks.dirty_blocks() < dirty_before;
        if next > lba {
            if seq_min == u64::MAX {
                // Pending from its first entry on: the writeback position must not pass it.
                st.writeback.zero_pending(seq, pos.0, pos.1);
                ordered = st.ordered();
            }
            seq_min = seq_min.min(seq);
            seq_max = last;
        }
        lba = next;
        if lba == end {
            st.bypass.begin_io();
            break order;
        }
        drop(order);
        if let Err(e) = wait_for_room(inner, st) {
            abort(begun, dropped_dirty);
            return Err(e);
        }
    };
    let mut order = Some(order);
    // The cache device's own failure (the superblock write below), not the backing device's.
    let mut cache_err = false;
    let res = (|| {
        wait_durable(inner)?;
        if ordered {
            // In flush-epoch order the zeros land after everything older in the log is on the
            // backing device, and before anything newer (writeback stops at the range).
            drop(order.take());
            wait_for_older(inner, seq_min)?;
            order = Some(inner.backing_order.lock());
        }
        let off = first * BLOCK_SIZE_BYTES;
        let len = (end - first) * BLOCK_SIZE_BYTES;
        // The range is registered as zeroing and `backing_order` is held: writing the zeros
        // again cannot wipe anything newer.
        zeros_synced(inner, || {
            inner.backing.write_zeroes(off, len).map_err(|e| {
                Error::io(
                    format!("zeroing {len} bytes at {off} on the backing device"),
                    e,
                )
            })
        })?;
        // Recovery must not apply it again: writes that reach the backing device after it
        // (write-around) are in no log, and zeros applied again would wipe them. An older
        // zero range whose application failed holds the mark back (it is re-applied).
        let older_pending = inner
            .state
            .lock()
            .writeback
            .zero_pending_seq()
            .is_some_and(|s| s < seq_min);
        if !older_pending {
            inner
                .superblock
                .advance_zero_applied(seq_max)
                .inspect_err(|_| cache_err = true)?;
            inner.state.lock().counters.superblock_writes += 1;
        }
        Ok(())
    })();
    let mut st = inner.state.lock();
    st.bypass.end_io();
    end_zeroing(inner, &mut st, first, end, dropped_dirty && res.is_err());
    st.promotion.invalidate();
    match &res {
        // Applied and durable: the writeback position may pass it.
        Ok(()) => {
            st.writeback.zero_applied(seq_min);
            // The next zero range may be waiting for its turn; writeback may go on.
            inner.progress.notify_all();
            inner.writeback_wake.notify_one();
        }
        // The zeros are on the backing device, synced; the cache device failed recording it:
        // the cache is given up like any other failure of it (the request is then tried
        // again from the backing device alone).
        Err(e) if cache_err => fail_cache_held(inner, &mut st, e),
        // Writes after a zero range that is logged but not applied could be wiped when
        // recovery applies it again: stop here instead; the next open applies it.
        Err(e) => mark_failed(
            inner,
            &mut st,
            format!(
                "a write-zeroes could not be applied to the backing device ({e}); restart to apply it again"
            ),
        ),
    }
    drop(st);
    drop(order);
    res
}

/// The zeroing of blocks `first..end` is over, unless it failed having killed dirty copies
/// (`dropped_dirty`) while the cache is being given up: then the range stays registered, so
/// the switch counts its blocks lost (`path::lost::collect`: the backing device still holds
/// data older than those copies) until the request, tried again from the backing device
/// alone, writes its zeros. Ended here first, a read served alone before that returned the
/// older data (cache-loss sim seeds 1001, 1051).
fn end_zeroing(inner: &Inner, st: &mut State, first: u64, end: u64, dropped_dirty: bool) {
    let giving_up =
        inner.alone.load(std::sync::atomic::Ordering::Acquire) != crate::path::alone::NO;
    if !(dropped_dirty && giving_up) {
        st.bypass.end_zeroing(first, end);
    }
}

/// How many times a zeroing is written and synced again because another backing sync failed
/// (or the connection was replaced) between its write and its own sync.
const ZEROS_SYNC_TRIES: u32 = 3;

/// Backing syncs that failed so far and the backing device's reconnects: if either moved
/// across a write and a sync, the sync may not cover the write. Counted by the backing
/// device's wrapper before a failed sync returns, and a successful one returns only once the
/// syncs in flight beside it have ended (`backing.rs`): counted by the failing thread after
/// its sync returned (`Bypass::losses`), a sync of ours that ended in between was believed.
fn sync_risk(inner: &Inner) -> (u64, u64) {
    (inner.backing.failed_syncs(), inner.backing.reconnects())
}

/// Runs `write` (zeros onto the backing device) and syncs the backing device; again if another
/// thread's backing sync failed (or the connection was replaced) in between. A device may drop
/// unsynced writes with a failed sync and report success to the next one (Linux's page cache
/// after a writeback error), so that success does not vouch for zeros written before the
/// failure: marked applied on its strength, recovery kept the zero range (block status called
/// the range zero) without applying it again while the backing device held the old data
/// (concurrent simulation seed 107844: the writeback record's sync failed between a
/// write-zeroes' zeroing and its sync). The caller holds `backing_order`.
fn zeros_synced(inner: &Inner, write: impl Fn() -> Result<()>) -> Result<()> {
    let sync_err = |e| Error::io(format!("syncing {}", inner.backing.describe()), e);
    for _ in 0..ZEROS_SYNC_TRIES {
        let before = sync_risk(inner);
        write()?;
        inner.backing.flush().map_err(sync_err)?;
        if sync_risk(inner) == before {
            return Ok(());
        }
        inner.state.lock().counters.zeros_written_again += 1;
    }
    Err(sync_err(std::io::Error::other(format!(
        "other syncs of it failed each time while zeros were being made durable \
         ({ZEROS_SYNC_TRIES} tries)"
    ))))
}

/// Writes recovered zero range `z` to the backing device (not synced).
pub fn reapply_zeros(backing: &dyn BlockDevice, z: &ZeroRange) -> Result<()> {
    let (off, len) = (z.lba * BLOCK_SIZE_BYTES, z.count * BLOCK_SIZE_BYTES);
    backing.write_zeroes(off, len).map_err(|e| {
        Error::io(
            format!("re-applying a logged zero range ({len} bytes at {off}) to the backing device"),
            e,
        )
    })
}

/// Open, with `writeback_order = consistent`: applies the zero ranges recovery found logged
/// and not applied (registered as pending, so writeback stops at them), in log order, each once
/// every dirty block logged before it is on the backing device, so that device stays a past
/// state of the disk (applied at once, they landed before older epochs). Open waits for it, so
/// no request can read or write the ranges meanwhile.
pub fn apply_recovered_zeros(inner: &Inner, zeros: &[ZeroRange]) -> Result<()> {
    // Failed backing syncs and reconnects since the chunk's first range was written.
    let mut chunk_risk = None;
    for (i, z) in zeros.iter().enumerate() {
        wait_for_older(inner, z.seq)?;
        let last_of_chunk = zeros.get(i + 1).is_none_or(|next| next.seq != z.seq);
        {
            let _order = inner.backing_order.lock();
            let risk = *chunk_risk.get_or_insert_with(|| sync_risk(inner));
            reapply_zeros(&*inner.backing, z)?;
            if last_of_chunk {
                chunk_risk = None;
                inner
                    .backing
                    .flush()
                    .map_err(|e| Error::io(format!("syncing {}", inner.backing.describe()), e))?;
                if sync_risk(inner) != risk {
                    // A failed sync may have dropped zeros of this chunk (see `zeros_synced`);
                    // writing them again here could wipe blocks written back since. Not marked
                    // applied: the next open applies them again.
                    return Err(Error::io(
                        format!("syncing {}", inner.backing.describe()),
                        std::io::Error::other(
                            "another sync of it failed while logged zeros were being applied \
                             again; open the cache again to apply them",
                        ),
                    ));
                }
                inner.superblock.advance_zero_applied(z.seq)?;
            }
        }
        let mut st = inner.state.lock();
        st.writeback.zero_applied(z.seq);
        if last_of_chunk {
            st.counters.superblock_writes += 1;
            inner.progress.notify_all();
            inner.writeback_wake.notify_one();
        }
    }
    Ok(())
}

/// Waits until the zero range first logged in chunk `seq` is the oldest not yet applied and
/// no dirty block lies before it in the log, running writeback at full speed meanwhile (in
/// manual mode, on this thread).
fn wait_for_older(inner: &Inner, seq: u64) -> Result<()> {
    let mut st = inner.state.lock();
    st.writeback.drain_requests().enter();
    inner.writeback_wake.notify_one();
    let res = loop {
        if let Err(e) = check_usable(&st) {
            break Err(e);
        }
        let my_turn = st.writeback.zero_pending_seq() == Some(seq);
        let clear = st
            .writeback
            .zero_pending_pos()
            .is_some_and(|(id, b)| !st.dirty_before(id, b));
        if my_turn && clear {
            break Ok(());
        }
        if my_turn {
            // Small steps: each allocates its buffer, and only what precedes the range is due.
            let batch = (inner.tunables.get(tunables::WRITEBACK_BATCH_BLOCKS) as usize).min(256);
            match writeback_step_here(inner, &mut st, batch) {
                None => {}
                Some(Err(e)) => break Err(e),
                Some(Ok(0)) => {
                    // Nothing before the range can be written back (it fails its checksum):
                    // the zeros cannot land in order.
                    break Err(Error::Corruption(format!(
                        "dirty blocks logged before a write-zeroes cannot be written back ({})",
                        st.writeback.error().unwrap_or("no progress")
                    )));
                }
                Some(Ok(_)) => continue,
            }
        }
        inner.progress.wait_for(&mut st, Duration::from_millis(100));
    };
    st.writeback.drain_requests().leave();
    res
}

/// Syncs the backing device if writes reached it outside writeback since its last sync; then,
/// if a backing sync failed (or found a replaced connection) before any sync covered some
/// bypass writes, makes them durable again or fails (`rewrite_lost`). So a flush that returns
/// OK never rests on a sync that came after a failed one.
pub fn sync_backing(inner: &Inner) -> Result<()> {
    let owed = {
        let st = inner.state.lock();
        st.bypass.sync_owed().map(|target| (target, st.log_pos()))
    };
    if let Some((target, log_pos)) = owed {
        let res = inner.backing.flush();
        if res.is_err() {
            crate::failpoint::backing_sync_failed(inner);
        }
        let mut st = inner.state.lock();
        match res {
            Ok(()) => st.note_backing_synced(
                target,
                log_pos,
                inner.backing.reconnects(),
                inner.backing.failed_syncs(),
            ),
            Err(e) => {
                let e = Error::io(format!("syncing {}", inner.backing.describe()), e);
                st.counters.io_errors += 1;
                st.backing_writes_lost(e.to_string(), inner.backing.failed_syncs());
                return Err(e);
            }
        }
    }
    rewrite_lost(inner)
}

/// Waits until the bypass writes a failed backing sync may have lost are durable again: their
/// cached copies, marked dirty (`state/lost.rs`), written back and synced, running writeback
/// at full speed meanwhile (in manual mode, on this thread). Fails if writeback fails, and
/// while some of them have no copy left.
fn rewrite_lost(inner: &Inner) -> Result<()> {
    let mut st = inner.state.lock();
    if st.bypass.lost().is_none() {
        return Ok(());
    }
    st.writeback.drain_requests().enter();
    inner.writeback_wake.notify_one();
    let mut patience = WritebackPatience::default();
    let res = loop {
        let end = match st.bypass.lost() {
            None => break Ok(()),
            Some((Lost::Gone, why)) => break Err(lost_error(why, "the cache holds no copy of some of them, so no flush can promise them; reopen the cache (restart serve) to go on without them")),
            Some((&Lost::Rewriting { end }, _)) => end,
        };
        if !st.dirty_before(end.0, end.1) {
            st.bypass.note_rewritten();
            break Ok(());
        }
        if let Err(e) = check_usable(&st) {
            break Err(e);
        }
        let run_out = patience.run_out(st.writeback.error());
        if let Some(e) = st.writeback.error().filter(|_| run_out) {
            let e = format!("writing their cached copies again failed: {e}");
            break Err(lost_error(st.bypass.lost().map_or("", |l| l.1), &e));
        }
        // Writeback takes durable chunks only, and copies marked dirty may be in RAM.
        if let Err(e) = crate::sync::unlocked(&mut st, || wait_durable(inner)) {
            break Err(e);
        }
        let batch = (inner.tunables.get(tunables::WRITEBACK_BATCH_BLOCKS) as usize).min(256);
        match writeback_step_here(inner, &mut st, batch) {
            None => {
                inner.progress.wait_for(&mut st, Duration::from_millis(100));
            }
            Some(Err(e)) => break Err(e),
            Some(Ok(0)) => {
                let why = st.bypass.lost().map_or("", |l| l.1);
                break Err(lost_error(
                    why,
                    "writeback cannot write their cached copies again",
                ));
            }
            Some(Ok(_)) => {}
        }
    };
    st.writeback.drain_requests().leave();
    res
}

/// The error a flush returns while bypass writes a failed backing sync may have lost are not
/// durable again.
fn lost_error(why: &str, what_now: &str) -> Error {
    Error::io(
        "a flush",
        std::io::Error::other(format!(
            "{why}; writes that bypassed the cache before it may be lost from the backing \
             device, and {what_now}"
        )),
    )
}
