//! Serving from the backing device alone once the cache device failed while it held no dirty
//! data (issue 25; bcache does the same): every acknowledged write is then on the backing
//! device, so requests go straight there and the cache is never touched again.
//!
//! The switch (`take_over`, after `inner::fail_cache` failed the engine with no dirty block in
//! the same lock hold, so no dirty data can be added after it): the backing device's label is
//! marked detached first, exactly as `logcache detach --force` does, so the old cache is
//! refused if it comes back (its clean copies would be stale once writes go past it); only
//! then does `Inner::alone` turn on. A request that failed in the cached path meanwhile is
//! tried again here (`Engine`'s entry points): it had not been acknowledged.

use std::sync::atomic::Ordering;

/// `Inner::alone`: the cache is in use.
pub const NO: u8 = 0;
/// The cache device failed with no dirty data; the backing device is being marked detached.
pub const DECIDING: u8 = 1;
/// Requests go to the backing device alone.
pub const YES: u8 = 2;
/// Marking the backing device detached failed: the engine stays failed.
pub const REFUSED: u8 = 3;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};
use crate::format::label::{write_detached, Label, WritebackRecord};
use crate::inner::Inner;
use crate::status::{Extent, ExtentKind};

/// Whether requests go to the backing device alone.
pub fn active(inner: &Inner) -> bool {
    inner.alone.load(Ordering::Acquire) == YES
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

/// After the engine failed for a cache-device error with no dirty data: marks the backing
/// device detached and, if that worked, serves from it alone (status says so). If it did not,
/// the engine stays failed.
pub fn take_over(inner: &Inner, cause: &Error) {
    // A writeback record write under way finishes first; none starts after `deciding`.
    let record_guard = inner.last_record.lock();
    let label_at = inner.geo.exported_size_bytes;
    let mut block = vec![0u8; 4096];
    let marked = inner
        .backing
        .read_at(&mut block, label_at)
        .map_err(|e| e.to_string())
        .and_then(|()| match Label::decode(&block) {
            Ok(Some(label)) if label.format_id == inner.geo.format_id => Ok(label),
            _ => Err("its label is not this cache's".to_string()),
        })
        .and_then(|label| {
            let record = WritebackRecord::decode_from_label(&block)
                .filter(|r| r.format_id == label.format_id);
            let now_ms = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(1, |d| d.as_millis() as u64);
            let detached = WritebackRecord::detached_from(record, &label, now_ms);
            write_detached(&*inner.backing, label_at, &label, &detached).map_err(|e| e.to_string())
        });
    drop(record_guard);
    let mut st = inner.state.lock();
    match marked {
        Ok(()) => {
            st.health.serve_alone(format!(
                "cache failed: {cause}; serving from the backing device alone (the cache held \
                 no dirty data; the backing device is detached from it: give it a new cache \
                 with `logcache format` after stopping serve)"
            ));
            inner.alone.store(YES, Ordering::Release);
        }
        Err(e) => {
            st.health.note(format!(
                " (the cache held no dirty data, but marking the backing device detached \
                 failed: {e})"
            ));
            inner.alone.store(REFUSED, Ordering::Release);
        }
    }
    drop(st);
    inner.progress.notify_all();
}

fn backing_err(what: String, e: std::io::Error) -> Error {
    Error::io(format!("{what} (serving from the backing device alone)"), e)
}

pub fn read(inner: &Inner, offset_bytes: u64, buf: &mut [u8]) -> Result<()> {
    let len = buf.len();
    inner
        .backing
        .read_at(buf, offset_bytes)
        .map_err(|e| backing_err(format!("reading {len} bytes at {offset_bytes}"), e))
}

pub fn write(inner: &Inner, offset_bytes: u64, data: &[u8], fua: bool) -> Result<()> {
    inner
        .backing
        .write_at(data, offset_bytes)
        .map_err(|e| backing_err(format!("writing {} bytes at {offset_bytes}", data.len()), e))?;
    durable_if(inner, fua)
}

pub fn flush(inner: &Inner) -> Result<()> {
    inner
        .backing
        .flush()
        .map_err(|e| backing_err("syncing the backing device".into(), e))
}

pub fn write_zeroes(inner: &Inner, offset_bytes: u64, len_bytes: u64, fua: bool) -> Result<()> {
    inner
        .backing
        .write_zeroes(offset_bytes, len_bytes)
        .map_err(|e| backing_err(format!("zeroing {len_bytes} bytes at {offset_bytes}"), e))?;
    durable_if(inner, fua)
}

/// TRIM is a hint: passed on to the backing device.
pub fn discard(inner: &Inner, offset_bytes: u64, len_bytes: u64, fua: bool) -> Result<()> {
    inner
        .backing
        .discard(offset_bytes, len_bytes)
        .map_err(|e| backing_err(format!("discarding {len_bytes} bytes at {offset_bytes}"), e))?;
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

fn durable_if(inner: &Inner, fua: bool) -> Result<()> {
    if fua {
        flush(inner)?;
    }
    Ok(())
}
