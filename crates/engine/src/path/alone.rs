//! Serving from the backing device alone once the cache device failed (issue 25; bcache does
//! the same without dirty data): requests go straight to the backing device and the cache is
//! never touched again. With no dirty data every acknowledged write is on the backing device;
//! with dirty data, the sectors whose newest data was only in the cache are lost
//! (`path::lost`, taken from the RAM index, which outlives the device): reads touching one fail
//! with EIO, never with the older bytes the backing device holds, until it is written again.
//!
//! The switch (`take_over`, on a thread of its own started by `inner::fail_cache`, which failed
//! the engine in the same lock hold as it decided: no dirty data can be added after it, since
//! every write path checks for failure in the hold that adds it): it first waits for
//! `backing_order`, so no writeback batch or zero range is still writing to the backing device
//! (a stale writeback write landing after a new write would undo it), and takes the lost set;
//! then the backing device's label is marked detached, exactly as `logcache detach --force`
//! does, with `RECORD_SERVED_ALONE` and the lost bytes, so the old cache is refused if it
//! comes back (its copies would be stale once writes go past it) and the loss is on record;
//! only then does `Inner::alone` turn on. A request that failed in the cached path meanwhile
//! is tried again here (`Engine`'s entry points): it had not been acknowledged.

use std::sync::atomic::Ordering;
use std::sync::Arc;

/// `Inner::alone`: the cache is in use.
pub const NO: u8 = 0;
/// The cache device failed; the backing device is being marked detached.
pub const DECIDING: u8 = 1;
/// Requests go to the backing device alone.
pub const YES: u8 = 2;
/// Marking the backing device detached failed: the engine stays failed.
pub const REFUSED: u8 = 3;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};
use crate::format::label::{
    write_detached, Label, WritebackRecord, RECORD_OFFSET_IN_LABEL_BYTES, RECORD_SERVED_ALONE,
};
use crate::format::SECTOR_SIZE_BYTES;
use crate::inner::Inner;
use crate::io::BlockDevice as _;
use crate::state::State;
use crate::status::{Extent, ExtentKind};

/// Whether requests go to the backing device alone.
pub fn active(inner: &Inner) -> bool {
    inner.alone.load(Ordering::Acquire) == YES
}

/// Whether the cache was given up (the switch under way, done or refused): from the switch on,
/// changes may reach the backing device without passing the export hold (`export`), so what
/// an export reads there may be newer than its moment.
pub fn given_up(inner: &Inner) -> bool {
    inner.alone.load(Ordering::Acquire) != NO
}

/// Called by `inner::fail_cache` under the state lock, before it fails the engine: requests
/// that fail from now on wait for `take_over`'s decision (`took_over`).
pub fn deciding(inner: &Inner) {
    let was = inner.alone.swap(DECIDING, Ordering::AcqRel);
    assert_eq!(was, NO, "the cache is given up once");
}

/// After a request failed in the cached path: waits while the switch is decided, then says
/// whether the backing device alone serves (the request is then tried there: it was not
/// acknowledged).
pub fn took_over(inner: &Inner) -> bool {
    if inner.alone.load(Ordering::Acquire) == DECIDING {
        let mut st = inner.state.lock();
        while inner.alone.load(Ordering::Acquire) == DECIDING {
            inner.progress.wait(&mut st);
        }
    }
    active(inner)
}

/// Starts `take_over` on a thread of its own (the caller holds the state lock): the thread
/// that met the error may hold `backing_order` (a writeback batch persisting its position),
/// which the switch waits for. If it cannot start, the engine stays failed.
pub fn start_take_over(inner: &Inner, st: &mut State) {
    let spawned = match inner.me.upgrade() {
        // Even after a simulated power cut it runs: requests wait for its decision.
        Some(me) => crate::inner::spawn_background(
            &me,
            "cache-failed",
            "cache-failed",
            switch_panicked,
            take_over,
        )
        .map(drop)
        .map_err(|e| e.to_string()),
        None => Err("the engine is going away".into()),
    };
    if let Err(why) = spawned {
        refuse(inner, st, format!("starting the switch failed: {why}"));
    }
}

/// The switch's thread panicked (`inner::spawn_background`): if it had not decided, nobody
/// will, so the engine stays failed and the requests waiting for the decision get their error
/// (they waited for ever); status says why.
fn switch_panicked(inner: &Inner, st: &mut State, why: String) {
    if inner.alone.load(Ordering::Acquire) == DECIDING {
        refuse(inner, st, why);
    } else {
        crate::inner::fail_on_panic(inner, st, why);
    }
}

/// The engine stays failed: says why it could not go on from the backing device alone.
fn refuse(inner: &Inner, st: &mut State, why: String) {
    st.health.note(format!(
        " (going on from the backing device alone failed: {why})"
    ));
    inner.alone.store(REFUSED, Ordering::Release);
    inner.progress.notify_all();
}

/// After the engine failed for a cache-device error: takes the lost set, marks the backing
/// device detached, writes the dirty blocks still in RAM to it (`path::in_ram`: found again,
/// not lost) and, if the mark worked, serves from it alone (status says so, with what was
/// lost). If it did not, the engine stays failed.
fn take_over(inner: &Arc<Inner>) {
    // No writeback batch or zero range is writing to the backing device after this (the
    // engine failed: none starts); a writeback record write under way finishes first, and
    // none starts after `deciding`.
    let order = inner.backing_order.lock();
    let record_guard = inner.last_record.lock();
    let (lost, in_ram, bypass_lost, bypass_unsynced, failed_syncs) = {
        let st = inner.state.lock();
        let failed_syncs = inner.backing.failed_syncs();
        let unsynced = st.bypass.sync_owed().is_some();
        (
            crate::path::lost::collect(&inner.geo, &st),
            crate::path::in_ram::collect(inner, &st),
            // A failed sync whose thread has not handled it yet counts too.
            st.bypass.lost().is_some()
                || (unsynced && st.bypass.failed_syncs_unhandled(failed_syncs)),
            unsynced,
            failed_syncs,
        )
    };
    // Writes that bypassed the cache keep their rule alone: lost to a failed sync already,
    // or unsynced (a failed sync from now on may lose them).
    inner
        .lost
        .carry_bypass(bypass_lost, bypass_unsynced, failed_syncs);
    let lost_sectors: u64 = lost.values().map(|s| s.lost.count_ones() as u64).sum();
    let lost_bytes = lost_sectors * SECTOR_SIZE_BYTES;
    // Installed before the label is marked (nothing reads it before `YES`): tests that cut
    // the power while the mark is half written know what was lost.
    inner.lost.install(lost);
    // The mark counts the RAM copies lost until they are on the backing device: from the
    // mark on the old cache is refused, so writing past it is safe.
    let record = match mark_detached(inner, lost_bytes) {
        Ok(record) => record,
        Err(e) => {
            drop(record_guard);
            let mut st = inner.state.lock();
            refuse(
                inner,
                &mut st,
                format!(
                    "marking the backing device detached failed: {e}; every request fails. \
                     Nothing reached the backing device past the cache. Stop serve, then run \
                     `logcache detach --force --backing {}`: it finishes the mark (giving up \
                     the {} of dirty data the cache held) and says what the disk holds; use it \
                     alone or give it a new cache with `logcache format`",
                    inner.backing.describe(),
                    crate::format::human_bytes(lost_bytes)
                ),
            );
            drop(st);
            drop(order);
            return;
        }
    };
    if crashed(inner) {
        drop(record_guard);
        drop(order);
        return;
    }
    let mut trouble = String::new();
    let saved_bytes = match crate::path::in_ram::write(inner, &in_ram) {
        Ok(n) => n,
        Err((n, why)) => {
            trouble.push_str(&format!(
                "; writing the dirty data still in RAM to the backing device failed ({why}): \
                 what was not written stays lost"
            ));
            n
        }
    };
    let still_lost = inner.lost.lost_bytes();
    if still_lost != lost_bytes {
        let now = WritebackRecord {
            lost_bytes: still_lost,
            ..record
        };
        if let Err(e) = write_record(inner, &now) {
            trouble.push_str(&format!(
                "; the backing label still counts {} lost (updating it failed: {e})",
                crate::format::human_bytes(lost_bytes)
            ));
        }
    }
    drop(record_guard);
    let saved = if saved_bytes == 0 {
        String::new()
    } else {
        format!(
            "{saved_bytes} bytes ({}) of dirty data still in RAM were written to the backing \
             device and synced",
            crate::format::human_bytes(saved_bytes)
        )
    };
    let note = if still_lost == 0 {
        format!(
            "serving from the backing device alone ({}; nothing was lost; the backing device is \
             detached from the failed cache: give it a new cache with `logcache format` after \
             stopping serve){trouble}",
            if saved.is_empty() {
                "the cache held no dirty data".to_string()
            } else {
                format!("the cache's dirty data was still in RAM: {saved}")
            }
        )
    } else {
        format!(
            "serving from the backing device alone; {still_lost} bytes ({}) written before the \
             failure was only in the cache and is lost: reads of it fail with EIO until it is \
             written again (status lost_bytes), and flushes fail while any of it was never \
             flushed; the backing device is detached and marked as having lost data: copy off \
             what you need, stop serve, check the filesystem, then give it a new cache with \
             `logcache format`{}{trouble}",
            crate::format::human_bytes(still_lost),
            if saved.is_empty() {
                String::new()
            } else {
                format!(" ({saved})")
            }
        )
    };
    let mut st = inner.state.lock();
    if st.health.cache_failed() {
        st.health.serve_alone(note);
        inner.alone.store(YES, Ordering::Release);
    } else {
        // A simulated power cut came meanwhile: nothing serves any more.
        inner.alone.store(REFUSED, Ordering::Release);
    }
    drop(st);
    drop(order);
    inner.progress.notify_all();
}

/// A simulated power cut (`Engine::crash`, tests) came while the switch was under way: it
/// stops where it is (a process that lost its power writes nothing more) and answers the
/// requests waiting for its decision with their error.
fn crashed(inner: &Inner) -> bool {
    let st = inner.state.lock();
    if st.health.cache_failed() {
        return false;
    }
    inner.alone.store(REFUSED, Ordering::Release);
    drop(st);
    inner.progress.notify_all();
    true
}

/// Attempts at each step of marking the backing device detached: a backing device that fails
/// a write once (an NBD server reconnecting) does not cost the cache.
const MARK_ATTEMPTS: u32 = 3;

/// Marks the backing device's label detached from this cache, served alone, with `lost_bytes`
/// lost (as `logcache detach --force` does); returns the record written. Each step is tried
/// `MARK_ATTEMPTS` times; the label is read once, so an attempt that wrote part of the mark
/// is finished by the next.
fn mark_detached(inner: &Inner, lost_bytes: u64) -> std::result::Result<WritebackRecord, String> {
    let label_at = inner.geo.exported_size_bytes;
    let mut block = vec![0u8; 4096];
    retried(|| inner.backing.read_at(&mut block, label_at))?;
    let label = match Label::decode(&block) {
        Ok(Some(label)) if label.format_id == inner.geo.format_id => label,
        _ => return Err("its label is not this cache's".to_string()),
    };
    let record =
        WritebackRecord::decode_from_label(&block).filter(|r| r.format_id == label.format_id);
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |d| d.as_millis() as u64);
    let mut detached = WritebackRecord::detached_from(record, &label, now_ms);
    detached.flags |= RECORD_SERVED_ALONE;
    detached.lost_bytes = lost_bytes;
    retried(|| {
        noting_sync(inner, || {
            write_detached(&*inner.backing, label_at, &label, &detached)
        })
    })?;
    Ok(detached)
}

/// `step`, tried up to `MARK_ATTEMPTS` times in a row; the last error, saying how many tries.
/// No pause between tries: a timed wait here left requests waiting for the switch after the
/// simulation's power cut (its clock stops), and a write failing once is what a retry is for.
fn retried(mut step: impl FnMut() -> std::io::Result<()>) -> std::result::Result<(), String> {
    let mut last = None;
    for _ in 0..MARK_ATTEMPTS {
        match step() {
            Ok(()) => return Ok(()),
            Err(e) => last = Some(e),
        }
    }
    Err(format!(
        "{} ({MARK_ATTEMPTS} tries)",
        last.expect("at least one attempt")
    ))
}

/// Rewrites the (already detached) record alone, synced: one sector, so a torn write leaves
/// the old record or the new one.
fn write_record(inner: &Inner, record: &WritebackRecord) -> std::io::Result<()> {
    debug_assert!(record.detached() && record.served_alone());
    let at = inner.geo.exported_size_bytes + RECORD_OFFSET_IN_LABEL_BYTES;
    noting_sync(inner, || {
        inner.backing.write_at(&record.encode(), at)?;
        inner.backing.flush()
    })
}

/// A step of the switch that syncs the backing device (the label's mark, the record, the
/// copies still in RAM): if it fails, its sync may have dropped bypass writes no earlier sync
/// covered (carried over by `Lost::carry_bypass`), as a failed `sync` may, so flushes fail
/// from then on. Counted on any failure of the step (a failed write beside the sync cannot
/// be told apart): the safe side. Found by the simulation's long sweep, cache-loss seed 100940.
pub fn noting_sync<T, E>(
    inner: &Inner,
    step: impl FnOnce() -> std::result::Result<T, E>,
) -> std::result::Result<T, E> {
    let target = inner.lost.sync_target();
    let res = step();
    if res.is_err() {
        inner
            .lost
            .note_synced(target, false, inner.backing.failed_syncs());
    }
    res
}

fn backing_err(what: String, e: std::io::Error) -> Error {
    Error::io(format!("{what} (serving from the backing device alone)"), e)
}

/// EIO naming the first lost sector of a request (`path::lost`).
fn lost_err(inner: &Inner, what: &str, sector: u64) -> Error {
    Error::io(
        format!(
            "{what}: sector {sector} was lost with the failed cache device ({} still lost; \
             it reads again once written)",
            crate::format::human_bytes(inner.lost.lost_bytes())
        ),
        std::io::Error::from_raw_os_error(libc::EIO),
    )
}

pub fn read(inner: &Inner, offset_bytes: u64, buf: &mut [u8]) -> Result<()> {
    let len = buf.len();
    let (first, count) = sectors(offset_bytes, len as u64);
    if let Some(s) = inner.lost.first_in(first, count) {
        return Err(lost_err(
            inner,
            &format!("reading {len} bytes at {offset_bytes}"),
            s,
        ));
    }
    inner
        .backing
        .read_at(buf, offset_bytes)
        .map_err(|e| backing_err(format!("reading {len} bytes at {offset_bytes}"), e))?;
    // A sector lost while the read ran (it cannot be: sectors are only ever found again).
    debug_assert!(inner.lost.first_in(first, count).is_none());
    Ok(())
}

pub fn write(inner: &Inner, offset_bytes: u64, data: &[u8], fua: bool) -> Result<()> {
    inner
        .backing
        .write_at(data, offset_bytes)
        .map_err(|e| backing_err(format!("writing {} bytes at {offset_bytes}", data.len()), e))?;
    inner.lost.note_written();
    // Written over: current again (before the reply, so a read sent after it finds the data).
    let (first, count) = sectors(offset_bytes, data.len() as u64);
    inner.lost.overwritten(first, count);
    durable_if(inner, fua)
}

/// A FLUSH: the backing device synced; an error while any write acknowledged before the
/// failure was lost before it was ever durable (the flush covers it, and it never will be).
pub fn flush(inner: &Inner) -> Result<()> {
    sync(inner)?;
    sync_lost_check(inner)?;
    let unflushed = inner.lost.unflushed_bytes();
    if unflushed > 0 {
        return Err(Error::io(
            format!(
                "flush: {} acknowledged before the cache device failed was lost before it was \
                 ever durable (flushes fail until it is written again)",
                crate::format::human_bytes(unflushed)
            ),
            std::io::Error::from_raw_os_error(libc::EIO),
        ));
    }
    Ok(())
}

/// Syncs the backing device (FUA, close).
pub fn sync(inner: &Inner) -> Result<()> {
    let target = inner.lost.sync_target();
    let res = inner.backing.flush();
    if res.is_err() {
        crate::failpoint::backing_sync_failed(inner);
    }
    inner
        .lost
        .note_synced(target, res.is_ok(), inner.backing.failed_syncs());
    res.map_err(|e| backing_err("syncing the backing device".into(), e))
}

/// A drain: nothing is dirty, but the backing device does not hold the disk while sectors are
/// lost.
pub fn drain(inner: &Inner) -> Result<()> {
    sync(inner)?;
    let lost = inner.lost.lost_bytes();
    if lost > 0 {
        return Err(Error::Failed(format!(
            "{} written before the cache device failed was lost with it; the backing device \
             holds older data there (it reads as EIO until written again)",
            crate::format::human_bytes(lost)
        )));
    }
    Ok(())
}

pub fn write_zeroes(inner: &Inner, offset_bytes: u64, len_bytes: u64, fua: bool) -> Result<()> {
    inner
        .backing
        .write_zeroes(offset_bytes, len_bytes)
        .map_err(|e| backing_err(format!("zeroing {len_bytes} bytes at {offset_bytes}"), e))?;
    inner.lost.note_written();
    let (first, count) = sectors(offset_bytes, len_bytes);
    inner.lost.overwritten(first, count);
    durable_if(inner, fua)
}

/// TRIM is a hint: passed on to the backing device. A lost sector stays lost (a TRIM promises
/// no data, and the bytes the backing device holds are not the newest written there).
pub fn discard(inner: &Inner, offset_bytes: u64, len_bytes: u64, fua: bool) -> Result<()> {
    inner
        .backing
        .discard(offset_bytes, len_bytes)
        .map_err(|e| backing_err(format!("discarding {len_bytes} bytes at {offset_bytes}"), e))?;
    inner.lost.note_written();
    durable_if(inner, fua)
}

/// Everything is reported as data (always safe).
pub fn block_status(len_bytes: u64, out: &mut Vec<Extent>) {
    out.clear();
    out.push(Extent {
        length_bytes: len_bytes,
        kind: ExtentKind::Data,
    });
}

/// The sectors of a request (requests are sector-aligned).
fn sectors(offset_bytes: u64, len_bytes: u64) -> (u64, u64) {
    debug_assert!(
        offset_bytes.is_multiple_of(SECTOR_SIZE_BYTES)
            && len_bytes.is_multiple_of(SECTOR_SIZE_BYTES)
    );
    (
        offset_bytes / SECTOR_SIZE_BYTES,
        len_bytes / SECTOR_SIZE_BYTES,
    )
}

/// FUA makes this write durable, not the earlier lost ones: the backing device's sync only.
/// But a FUA is a flush point for everything acknowledged before it (the cached path's rule),
/// so it fails as a flush does once a failed sync may have lost writes sent alone.
fn durable_if(inner: &Inner, fua: bool) -> Result<()> {
    if fua {
        sync(inner)?;
        sync_lost_check(inner)?;
    }
    Ok(())
}

/// Fails once a backing sync failed with writes sent alone unsynced (`Lost::sync_lost`).
fn sync_lost_check(inner: &Inner) -> Result<()> {
    if !inner.lost.sync_lost() {
        return Ok(());
    }
    // A later sync does not vouch for writes a failed one may have dropped (fsyncgate).
    Err(Error::io(
        "flush",
        std::io::Error::other(
            "a backing sync failed after writes that bypassed the cache, which may be lost \
             from the backing device and have no other copy; flushes fail until serve is \
             restarted",
        ),
    ))
}
