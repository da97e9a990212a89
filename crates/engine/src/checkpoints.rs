//! Checkpoints: create, delete, list, and what each says changed (docs/CHECKPOINTS.md).
//!
//! A checkpoint names a moment; from then on every logged change sets its blocks' bits
//! (`state::changes`). Its start sequence `S` is the first chunk whose changes count:
//! `create` seals the open chunk under the same lock hold that starts the tracking, so every
//! write acknowledged before `create` is in a chunk before `S`, and every later change in one
//! at or after it. The bits are persisted by `bitmaps::fold` before segments leave the log;
//! after a restart, recovery sets the bits of every change entry in the log from `S` on.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::bitmaps::{self, AreaGeo, Bitmaps};
use crate::error::{Error, Result};
use crate::format::checkpoints::{check_name, Table, TableEntry};
use crate::format::chunk::{ChunkHeader, Entry};
use crate::format::superblock::Superblock;
use crate::format::BLOCK_SIZE_BYTES;
use crate::inner::{check_usable, fail_cache, Inner};
use crate::io::BlockDevice;
use crate::path::alone;
use crate::state::changes::Tracked;
use crate::stats::RecoveryReport;

/// One checkpoint, as `checkpoint list` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointInfo {
    pub name: String,
    pub created_unix_ms: u64,
    /// Bytes of the disk changed since (4 KiB per changed block; after a crash possibly more
    /// than really changed, never less; the whole disk once it is served from the backing
    /// device alone, where changes are not tracked).
    pub changed_bytes: u64,
    /// The first log chunk whose changes count.
    pub start_seq: u64,
}

/// What open found: the table and each checkpoint's persisted bits (recovery adds the log's).
pub struct Loaded {
    pub bitmaps: Option<Bitmaps>,
    pub tracked: Vec<Tracked>,
}

/// Reads the checkpoint table and bitmaps of a cache being opened.
pub fn load(
    cache: &dyn BlockDevice,
    sb: &Superblock,
    report: &mut RecoveryReport,
) -> Result<Loaded> {
    if !sb.has_checkpoints() {
        return Ok(Loaded {
            bitmaps: None,
            tracked: Vec::new(),
        });
    }
    let geo = AreaGeo::of(sb);
    let table = match bitmaps::read_table(cache, &geo)? {
        Some(t) => t,
        None => {
            // Format wrote both copies, so this is damage: the checkpoints are gone (a backup
            // tool then finds its checkpoint missing and takes a full backup; nothing is
            // reported as unchanged that changed).
            report.checkpoint_table_unreadable = 1;
            let mut t = Table::empty(geo.slots);
            t.generation = 1;
            t
        }
    };
    let mut tracked = Vec::new();
    for (slot, e) in table.slots.iter().enumerate() {
        let Some(e) = e else { continue };
        let mut t = Tracked::new(
            slot as u32,
            e.serial,
            e.name.clone(),
            e.start_seq,
            e.created_unix_ms,
            geo.pages,
            0,
        );
        report.checkpoint_pages_unreadable += bitmaps::load_pages(cache, &geo, &mut t)?;
        tracked.push(t);
    }
    Ok(Loaded {
        bitmaps: Some(Bitmaps {
            geo,
            table: crate::sync::Mutex::new(table),
        }),
        tracked,
    })
}

/// Recovery's view of one replayed chunk: its changes count for checkpoints started at or
/// before it.
pub fn note_recovered_chunk(tracked: &mut [Tracked], h: &ChunkHeader, entries: &[Entry]) {
    for t in tracked.iter_mut().filter(|t| h.seq >= t.start_seq) {
        for (lba, count) in entries.iter().filter_map(Entry::changed_blocks) {
            t.mark(lba, count, h.seq);
        }
    }
}

/// After recovery, before anything new is written: a checkpoint whose start is past the
/// recovered log's end (a crash lost chunks it came after) starts at the next chunk instead,
/// persisted now. The new session reuses those sequence numbers, and its changes must count.
pub fn clamp_starts(cache: &dyn BlockDevice, loaded: &mut Loaded, next_seq: u64) -> Result<()> {
    let Some(b) = &loaded.bitmaps else {
        return Ok(());
    };
    let mut table = b.table.lock();
    let mut changed = false;
    for t in &mut loaded.tracked {
        if t.start_seq > next_seq {
            t.start_seq = next_seq;
            let e = table.slots[t.slot as usize]
                .as_mut()
                .expect("a tracked checkpoint has a table entry");
            e.start_seq = next_seq;
            changed = true;
        }
    }
    if changed {
        bitmaps::write_table(cache, &b.geo, &mut table)?;
    }
    Ok(())
}

fn no_room(inner: &Inner) -> Result<&Bitmaps> {
    inner.bitmaps.as_ref().ok_or_else(|| {
        Error::InvalidArgument(
            "this cache was formatted without room for checkpoints (before format version 4, or with --checkpoints 0); drain it, then format it again with logcache format --checkpoints N".into(),
        )
    })
}

fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Creates checkpoint `name`: from now on every change counts. Returns once it is durable.
/// With `freeze`, also returns the runs of blocks (first, count) checkpoint `freeze` had
/// changed at that same moment.
pub fn create(
    inner: &Inner,
    name: &str,
    freeze: Option<&str>,
) -> Result<(CheckpointInfo, Vec<(u64, u64)>)> {
    let b = no_room(inner)?;
    check_name(name)?;
    let mut table = b.table.lock();
    let used: Vec<&str> = table
        .slots
        .iter()
        .flatten()
        .map(|e| e.name.as_str())
        .collect();
    if used.contains(&name) {
        return Err(Error::InvalidArgument(format!(
            "a checkpoint named {name:?} exists; delete it first (logcache checkpoint delete {name}) or pick another name"
        )));
    }
    let Some(slot) = table.slots.iter().position(Option::is_none) else {
        return Err(Error::NoSpace(format!(
            "all {} checkpoint slots of this cache are in use ({}); delete one with logcache checkpoint delete NAME",
            table.slots.len(),
            used.join(", ")
        )));
    };
    if let Some(f) = freeze {
        if !used.contains(&f) {
            return Err(not_found(&table, f));
        }
    }
    let serial = table.next_serial;
    let created_unix_ms = now_unix_ms();
    let (start_seq, frozen) = {
        let mut st = inner.state.lock();
        check_usable(&st)?;
        let frozen = freeze
            .and_then(|f| st.changes.get(f))
            .map(|t| t.set_runs())
            .unwrap_or_default();
        // Writes acknowledged before now are all in sealed chunks; later changes land in the
        // next chunk or after, and set the bits from here on. A reserved write not yet
        // published would land in a chunk before it: it gives up (path/reserve.rs).
        st.cancel_reservations();
        if st.seal(&inner.buffers) {
            inner.flusher_wake.notify_one();
        }
        let start_seq = st.seqs.next();
        st.changes.tracked.push(Tracked::new(
            slot as u32,
            serial,
            name.to_string(),
            start_seq,
            created_unix_ms,
            b.geo.pages,
            1,
        ));
        (start_seq, frozen)
    };
    let persisted =
        bitmaps::init_pages(&*inner.cache, &b.geo, slot as u32, serial).and_then(|()| {
            table.next_serial += 1;
            table.slots[slot] = Some(TableEntry {
                serial,
                start_seq,
                created_unix_ms,
                name: name.to_string(),
            });
            bitmaps::write_table(&*inner.cache, &b.geo, &mut table)
        });
    if let Err(e) = persisted {
        // The table copy being written may be torn: stop here, as for the superblock.
        let mut st = inner.state.lock();
        st.changes.tracked.retain(|t| t.serial != serial);
        return Err(fail_cache(inner, st, e));
    }
    Ok((
        CheckpointInfo {
            name: name.to_string(),
            created_unix_ms,
            changed_bytes: 0,
            start_seq,
        },
        frozen,
    ))
}

/// Deletes checkpoint `name` (durably); its bits are forgotten.
pub fn delete(inner: &Inner, name: &str) -> Result<()> {
    let b = no_room(inner)?;
    let mut table = b.table.lock();
    let Some(slot) = table
        .slots
        .iter()
        .position(|e| e.as_ref().is_some_and(|e| e.name == name))
    else {
        return Err(not_found(&table, name));
    };
    table.slots[slot] = None;
    if let Err(e) = bitmaps::write_table(&*inner.cache, &b.geo, &mut table) {
        return Err(fail_cache(inner, inner.state.lock(), e));
    }
    inner
        .state
        .lock()
        .changes
        .tracked
        .retain(|t| t.slot != slot as u32);
    Ok(())
}

fn not_found(table: &Table, name: &str) -> Error {
    let names: Vec<&str> = table
        .slots
        .iter()
        .flatten()
        .map(|e| e.name.as_str())
        .collect();
    Error::InvalidArgument(if names.is_empty() {
        format!(
            "no checkpoint named {name:?}: this cache has none (logcache checkpoint create NAME)"
        )
    } else {
        format!(
            "no checkpoint named {name:?}; this cache has: {}",
            names.join(", ")
        )
    })
}

/// Every checkpoint, oldest first.
pub fn list(inner: &Inner) -> Vec<CheckpointInfo> {
    let st = inner.state.lock();
    // Once the cache is given up, writes go to the backing device alone untracked: every
    // block may have changed. Exact under the lock: the switch begins under it, and no write
    // goes alone before it.
    let untracked = alone::given_up(inner);
    let mut out: Vec<CheckpointInfo> = st
        .changes
        .tracked
        .iter()
        .map(|t| CheckpointInfo {
            name: t.name.clone(),
            created_unix_ms: t.created_unix_ms,
            changed_bytes: if untracked {
                inner.geo.exported_size_bytes
            } else {
                t.set_blocks() * BLOCK_SIZE_BYTES
            },
            start_seq: t.start_seq,
        })
        .collect();
    out.sort_by_key(|c| (c.start_seq, c.created_unix_ms));
    out
}

/// The changed runs of checkpoint `name` from `offset_bytes` (block aligned down) for at most
/// `len_bytes`, as (length in bytes, changed), in order, at most `max_runs`; the first run
/// starts at `offset_bytes` itself and the last ends at most at the range's end.
pub fn changed_runs(
    inner: &Inner,
    name: &str,
    offset_bytes: u64,
    len_bytes: u64,
    max_runs: usize,
) -> Result<Vec<(u64, bool)>> {
    let st = inner.state.lock();
    let Some(t) = st.changes.get(name) else {
        drop(st);
        let table = no_room(inner)?.table.lock();
        return Err(not_found(&table, name));
    };
    let end_bytes = offset_bytes + len_bytes;
    let end_block = end_bytes.div_ceil(BLOCK_SIZE_BYTES);
    let mut out = Vec::new();
    let mut pos = offset_bytes;
    while pos < end_bytes && out.len() < max_runs {
        let lba = pos / BLOCK_SIZE_BYTES;
        let (set, blocks) = t.run_at(lba, end_block);
        let run_end = ((lba + blocks) * BLOCK_SIZE_BYTES).min(end_bytes);
        out.push((run_end - pos, set));
        pos = run_end;
    }
    Ok(out)
}
