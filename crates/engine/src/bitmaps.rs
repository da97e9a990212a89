//! Checkpoint persistence on the cache device: the two-copy table and the bitmap pages
//! (`format::checkpoints` encodes them), and the fold that writes the pages set since their
//! last write before a segment leaves the log.
//!
//! The rule (docs/CHECKPOINTS.md): a checkpoint's changes are its persisted pages plus every
//! change entry still in the log from its start on. Reclaim frees a segment only after
//! `fold` synced every page whose bits changed (a superset of that segment's changes), so a
//! change is always in one place or the other, and a crash may over-report, never under-report.
//!
//! Every IO here is done holding `Bitmaps::table` (never the state lock): table and page
//! writes are serialised, so page generations reach the device in order.

use crate::sync::Mutex;

use crate::error::{Error, Result};
use crate::format::checkpoints::*;
use crate::format::superblock::Superblock;
use crate::inner::{fail_cache, Inner};
use crate::io::aligned::AlignedBuf;
use crate::io::BlockDevice;
use crate::state::changes::{PageWrite, Tracked};

/// Pages read or written per IO when a whole slot is read or initialised.
const PAGES_PER_IO: u32 = 128;

/// Where checkpoints live on this cache (from the superblock).
#[derive(Clone, Copy, Debug)]
pub struct AreaGeo {
    pub format_id: u64,
    pub area_offset: u64,
    pub slots: u32,
    pub pages: u32,
}

impl AreaGeo {
    pub fn of(sb: &Superblock) -> AreaGeo {
        AreaGeo {
            format_id: sb.format_id,
            area_offset: sb.bitmap_area_offset_bytes,
            slots: sb.checkpoint_slots,
            pages: sb.bitmap_pages_per_slot,
        }
    }
}

/// The table as last written; its mutex orders every checkpoint IO.
pub struct Bitmaps {
    pub geo: AreaGeo,
    pub table: Mutex<Table>,
}

fn io_err(cache: &dyn BlockDevice, what: &str, e: std::io::Error) -> Error {
    Error::io(format!("{what} on {}", cache.describe()), e)
}

/// Format: both copies of an empty table (generations 0 and 1), synced.
pub fn write_empty_tables(cache: &dyn BlockDevice, sb: &Superblock) -> Result<()> {
    let mut table = Table::empty(sb.checkpoint_slots);
    let mut buf = AlignedBuf::new(TABLE_SIZE_BYTES);
    for generation in 0..2 {
        table.generation = generation;
        buf.copy_from_slice(&table.encode(sb.format_id));
        cache
            .write_at(&buf, Table::copy_offset(generation))
            .map_err(|e| io_err(cache, "writing the checkpoint table", e))?;
    }
    cache
        .flush()
        .map_err(|e| io_err(cache, "syncing the checkpoint table", e))
}

/// Writes `table` with the next generation to the other copy, and syncs.
pub fn write_table(cache: &dyn BlockDevice, geo: &AreaGeo, table: &mut Table) -> Result<()> {
    table.generation += 1;
    let mut buf = AlignedBuf::new(TABLE_SIZE_BYTES);
    buf.copy_from_slice(&table.encode(geo.format_id));
    cache
        .write_at(&buf, Table::copy_offset(table.generation))
        .map_err(|e| io_err(cache, "writing the checkpoint table", e))?;
    cache
        .flush()
        .map_err(|e| io_err(cache, "syncing the checkpoint table", e))
}

/// Reads the table: `None` when neither copy verifies (damage: the format wrote both).
pub fn read_table(cache: &dyn BlockDevice, geo: &AreaGeo) -> Result<Option<Table>> {
    let mut buf = AlignedBuf::new(2 * TABLE_SIZE_BYTES);
    cache
        .read_at(&mut buf, TABLE_OFFSETS[0])
        .map_err(|e| io_err(cache, "reading the checkpoint table", e))?;
    let (a, b) = buf.split_at(TABLE_SIZE_BYTES);
    Ok(Table::choose([a, b], geo.format_id, geo.slots))
}

/// A new checkpoint's pages: zeros in both copies (generations 0 and 1), synced. Its
/// `Tracked` starts at generation 1.
pub fn init_pages(cache: &dyn BlockDevice, geo: &AreaGeo, slot: u32, serial: u64) -> Result<()> {
    let zeros = vec![0u64; PAGE_WORDS];
    let mut page = 0;
    while page < geo.pages {
        let n = PAGES_PER_IO.min(geo.pages - page);
        let mut buf = AlignedBuf::new(n as usize * 2 * PAGE_SIZE_BYTES);
        for (i, copy) in buf.chunks_mut(PAGE_SIZE_BYTES).enumerate() {
            encode_page(copy, &zeros, serial, (i % 2) as u64, geo.format_id);
        }
        let off = page_offset(geo.area_offset, geo.pages, slot, page, 0);
        cache
            .write_at(&buf, off)
            .map_err(|e| io_err(cache, "initialising checkpoint bitmap pages", e))?;
        page += n;
    }
    cache
        .flush()
        .map_err(|e| io_err(cache, "syncing checkpoint bitmap pages", e))
}

/// Loads a checkpoint's pages: per page the valid copy with the higher generation; a page
/// with none reads as all ones. Returns how many pages had none.
pub fn load_pages(cache: &dyn BlockDevice, geo: &AreaGeo, t: &mut Tracked) -> Result<u64> {
    let mut unreadable = 0;
    let mut words = [vec![0u64; PAGE_WORDS], vec![0u64; PAGE_WORDS]];
    let mut page = 0;
    while page < geo.pages {
        let n = PAGES_PER_IO.min(geo.pages - page);
        let mut buf = AlignedBuf::new(n as usize * 2 * PAGE_SIZE_BYTES);
        let off = page_offset(geo.area_offset, geo.pages, t.slot, page, 0);
        cache
            .read_at(&mut buf, off)
            .map_err(|e| io_err(cache, "reading checkpoint bitmap pages", e))?;
        for i in 0..n {
            let at = i as usize * 2 * PAGE_SIZE_BYTES;
            let a = &buf[at..at + PAGE_SIZE_BYTES];
            let b = &buf[at + PAGE_SIZE_BYTES..at + 2 * PAGE_SIZE_BYTES];
            let [wa, wb] = &mut words;
            let ga = decode_page(a, wa, t.serial, geo.format_id);
            let gb = decode_page(b, wb, t.serial, geo.format_id);
            let best = match (ga, gb) {
                (Some(x), Some(y)) if y > x => Some((&wb[..], y)),
                (Some(x), _) => Some((&wa[..], x)),
                (None, Some(y)) => Some((&wb[..], y)),
                (None, None) => None,
            };
            if best.is_none() {
                unreadable += 1;
            }
            t.load_page(page + i, best);
        }
        page += n;
    }
    Ok(unreadable)
}

/// Before segments leave the log (reclaim, ahead of moving the head to chunk `head_seq`):
/// persist every page holding a change of a chunk before `head_seq` not yet written. Pages
/// whose changes are all still in the log wait (recovery re-marks those from the log), so with
/// changes spread over the disk each page is written about once per lap of the log. The state
/// lock is held to list the pages and then for one
/// page's copy at a time (4 KiB), so writers never wait for a whole fold's copying. A bit set
/// meanwhile may ride along in this write (a superset) and dirties its page for the next fold.
/// A failed write fails the engine (the copies on the device may be torn; the other copy of
/// each page is intact, and nothing left the log).
pub fn fold(inner: &Inner, head_seq: u64) -> Result<()> {
    let Some(bitmaps) = &inner.bitmaps else {
        return Ok(());
    };
    let _order = bitmaps.table.lock();
    let pages = inner.state.lock().changes.take_due(head_seq);
    if pages.is_empty() {
        return Ok(());
    }
    let written = pages.len() as u64;
    if let Err(e) = write_pages(inner, &bitmaps.geo, &pages) {
        return Err(fail_cache(inner, inner.state.lock(), e));
    }
    inner.state.lock().counters.checkpoint_pages_written += written;
    Ok(())
}

/// Writes `pages` (each to the copy its generation names) and syncs.
fn write_pages(inner: &Inner, geo: &AreaGeo, pages: &[PageWrite]) -> Result<()> {
    let cache = &*inner.cache;
    let mut words = vec![0u64; PAGE_WORDS];
    let mut buf = AlignedBuf::new(PAGE_SIZE_BYTES);
    for p in pages {
        inner.state.lock().changes.copy_page(p, &mut words);
        encode_page(&mut buf, &words, p.serial, p.generation, geo.format_id);
        let off = page_offset(geo.area_offset, geo.pages, p.slot, p.page, p.generation % 2);
        cache
            .write_at(&buf, off)
            .map_err(|e| io_err(cache, "writing a checkpoint bitmap page", e))?;
    }
    cache
        .flush()
        .map_err(|e| io_err(cache, "syncing checkpoint bitmap pages", e))
}
