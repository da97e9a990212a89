//! The export hold: what lets an export (`logcache export-diff`) describe the disk at one
//! moment — the creation of its new checkpoint — while clients keep writing.
//!
//! At the moment, the export takes the runs of blocks it must ship (the old checkpoint's
//! changed blocks); until it has read them, they are *pending*. A change (write, write-zeroes,
//! TRIM) that touches a pending block first copies the block's current content (the moment's:
//! nothing changed it since) into the hold's side area, in RAM; the export reads a piece from
//! the engine and takes the side area's copies over it. Copy-before-overwrite: the log, the
//! index, writeback and reclaim are untouched, so a crash during an export loses nothing but
//! the export (the side area only ever holds copies), and the checkpoints stay valid.
//!
//! Ordering: every change passes `Hold::gate` (shared) from its pending check until it has
//! been applied; the moment is taken holding the gate exclusively, so no change is half-way
//! through it. A pending block leaves the pending set only by being copied or read by the
//! export, both under `Hold::state`, so no change reaches a pending block before its copy.
//!
//! Bounds: one export at a time; the side area holds at most the export's `limit_bytes`;
//! past that (or if copying a block fails) the export is abandoned — changes go on
//! unhindered, and the export fails with one line saying why. Changes outside an export pay
//! an uncontended shared lock and an atomic load.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::sync::{Mutex, RwLock, RwLockReadGuard};

use crate::checkpoints::{self, CheckpointInfo};
use crate::error::{Error, Result};
use crate::format::BLOCK_SIZE_BYTES;
use crate::inner::Inner;
use crate::path::{alone, read};

/// The hold shared by an engine's handles.
#[derive(Default)]
pub struct Hold {
    /// Shared by each change from its pending check to its end; exclusive at a moment.
    gate: RwLock<()>,
    /// An export holds blocks: changes must look at `state`.
    active: AtomicBool,
    /// An export is under way (begun, not yet dropped): one at a time.
    exporting: AtomicBool,
    state: Mutex<Option<Held>>,
}

/// What one export holds.
struct Held {
    /// Runs of blocks (first, count) to ship, sorted and disjoint.
    runs: Vec<(u64, u64)>,
    /// Blocks below this one have been read by the export (or were never held).
    next_block: u64,
    /// Copies of held blocks taken before a change reached them.
    saved: BTreeMap<u64, Box<[u8]>>,
    saved_bytes: u64,
    limit_bytes: u64,
    /// Blocks copied so far (a figure for the caller).
    kept_blocks: u64,
    /// Why the export was abandoned, once it was.
    abandoned: Option<String>,
}

impl Held {
    /// The pending blocks of `[first, end)`, as runs (first, count).
    fn pending_runs(&self, first: u64, end: u64, out: &mut Vec<(u64, u64)>) {
        let from = first.max(self.next_block);
        let i = self.runs.partition_point(|&(f, n)| f + n <= from);
        for &(f, n) in &self.runs[i..] {
            if f >= end {
                break;
            }
            for b in f.max(from)..(f + n).min(end) {
                if self.saved.contains_key(&b) {
                    continue;
                }
                match out.last_mut() {
                    Some(last) if last.0 + last.1 == b => last.1 += 1,
                    _ => out.push((b, 1)),
                }
            }
        }
    }
}

/// A change's pass through the hold: keep it until the change has been applied.
pub struct Pass<'a> {
    _gate: RwLockReadGuard<'a, ()>,
}

impl Hold {
    /// Called by every change of `len_bytes` at `offset_bytes` before it is applied: copies
    /// the pending blocks it touches into the side area. Never fails the change: a copy that
    /// fails, or does not fit, abandons the export instead.
    pub fn pass(&self, inner: &Inner, offset_bytes: u64, len_bytes: u64) -> Pass<'_> {
        let gate = self.gate.read();
        if self.active.load(Ordering::Acquire) {
            self.copy_pending(inner, offset_bytes, len_bytes);
        }
        Pass { _gate: gate }
    }

    /// As `pass`, for a change that must not wait for copies (a reserved write's publish):
    /// None, having done nothing, while an export holds blocks.
    pub fn try_pass(&self) -> Option<Pass<'_>> {
        let gate = self.gate.read();
        (!self.active.load(Ordering::Acquire)).then_some(Pass { _gate: gate })
    }

    fn copy_pending(&self, inner: &Inner, offset_bytes: u64, len_bytes: u64) {
        let first = offset_bytes / BLOCK_SIZE_BYTES;
        let end = (offset_bytes + len_bytes).div_ceil(BLOCK_SIZE_BYTES);
        let mut st = self.state.lock();
        let Some(h) = st.as_mut().filter(|h| h.abandoned.is_none()) else {
            return;
        };
        let mut runs = Vec::new();
        h.pending_runs(first, end, &mut runs);
        for (f, n) in runs {
            let bytes = n * BLOCK_SIZE_BYTES;
            if h.saved_bytes + bytes > h.limit_bytes {
                self.abandon(
                    h,
                    format!(
                        "clients rewrote more than {} of the blocks still to export while export-diff ran, which is all the export keeps in memory; run it again when writes are lighter, or more often so that each diff is smaller",
                        human(h.limit_bytes)
                    ),
                );
                return;
            }
            let mut buf = vec![0u8; bytes as usize];
            if let Err(e) = read::read(inner, f * BLOCK_SIZE_BYTES, &mut buf) {
                self.abandon(
                    h,
                    format!("keeping block {f} for the export failed: {e}; run it again"),
                );
                return;
            }
            if alone::given_up(inner) {
                // The read may have fallen back to a backing device that changes alone reach.
                self.abandon(h, cache_failed_reason());
                return;
            }
            for (i, block) in buf.chunks(BLOCK_SIZE_BYTES as usize).enumerate() {
                let old = h.saved.insert(f + i as u64, block.into());
                assert!(old.is_none(), "a held block is copied once");
            }
            h.saved_bytes += bytes;
            h.kept_blocks += n;
        }
    }

    fn abandon(&self, h: &mut Held, why: String) {
        h.abandoned = Some(why);
        h.saved.clear();
        h.saved_bytes = 0;
        self.active.store(false, Ordering::Release);
    }
}

use crate::format::human_bytes as human;

/// Why an export that met the switch to the backing device alone fails.
fn cache_failed_reason() -> String {
    "the cache device failed while export-diff ran, and changes now go to the backing device alone without being held for the export, so its blocks could be newer than its checkpoint; the checkpoints were on the cache device: take a full backup".into()
}

/// An export under way: the moment's content of its blocks, read in order. Dropping it ends
/// the hold (the checkpoint it created stays; the caller decides).
pub struct Export {
    inner: Arc<Inner>,
    hold: Arc<Hold>,
    since: String,
    name: String,
    info: CheckpointInfo,
    runs: Vec<(u64, u64)>,
}

/// Begins an export of the changes since checkpoint `since`: creates checkpoint `name` (the
/// moment) and holds `since`'s changed blocks until they are read, keeping at most
/// `limit_bytes` of copies.
pub fn begin(
    inner: &Arc<Inner>,
    hold: &Arc<Hold>,
    name: &str,
    since: &str,
    limit_bytes: u64,
) -> Result<Export> {
    if hold.exporting.swap(true, Ordering::AcqRel) {
        return Err(Error::InvalidArgument(
            "another export-diff is running on this disk; wait for it to finish, then run this one again".into(),
        ));
    }
    let created = {
        // Taken before the checkpoint table's lock (a change in flight may wait for the
        // flusher, whose folds take that lock).
        let _moment = hold.gate.write();
        let created = checkpoints::create(inner, name, Some(since));
        if let Ok((_, runs)) = &created {
            let mut st = hold.state.lock();
            assert!(st.is_none(), "one export at a time");
            *st = Some(Held {
                runs: runs.clone(),
                next_block: 0,
                saved: BTreeMap::new(),
                saved_bytes: 0,
                limit_bytes,
                kept_blocks: 0,
                abandoned: None,
            });
            hold.active.store(true, Ordering::Release);
        }
        created
    };
    match created {
        Ok((info, runs)) => Ok(Export {
            inner: inner.clone(),
            hold: hold.clone(),
            since: since.to_string(),
            name: name.to_string(),
            info,
            runs,
        }),
        Err(e) => {
            hold.exporting.store(false, Ordering::Release);
            Err(e)
        }
    }
}

impl Export {
    /// The runs of blocks (first, count) to ship, sorted and disjoint.
    pub fn runs(&self) -> &[(u64, u64)] {
        &self.runs
    }

    /// The checkpoint the export created (its moment).
    pub fn checkpoint(&self) -> &CheckpointInfo {
        &self.info
    }

    /// Blocks clients changed before the export read them, whose moment's copy was kept.
    pub fn kept_blocks(&self) -> u64 {
        self.hold.state.lock().as_ref().map_or(0, |h| h.kept_blocks)
    }

    /// Reads `buf.len() / 4096` blocks from `first_block` as they were at the moment. Pieces
    /// must lie inside one run and come in increasing order.
    pub fn read(&mut self, first_block: u64, buf: &mut [u8]) -> Result<()> {
        let block = BLOCK_SIZE_BYTES as usize;
        assert!(
            !buf.is_empty() && buf.len().is_multiple_of(block),
            "whole blocks"
        );
        let count = (buf.len() / block) as u64;
        assert!(
            self.runs
                .iter()
                .any(|&(f, n)| f <= first_block && first_block + count <= f + n),
            "a piece lies inside one run"
        );
        let mut st = self.hold.state.lock();
        let h = st.as_mut().expect("the hold lasts as long as its export");
        if let Some(why) = &h.abandoned {
            return Err(Error::Export(why.clone()));
        }
        assert!(first_block >= h.next_block, "pieces in increasing order");
        // Holding `state`: no change can reach a pending block of this piece meanwhile — none
        // in the cached path. Once the cache is given up, changes go to the backing device
        // without passing the hold, and a cached block whose read fails is read from there: the
        // bytes may be newer than the moment. The switch only moves forward, so a read that
        // ends with the cache still in use saw no such change.
        read::read(&self.inner, first_block * BLOCK_SIZE_BYTES, buf)?;
        if alone::given_up(&self.inner) {
            let why = cache_failed_reason();
            self.hold.abandon(h, why.clone());
            return Err(Error::Export(why));
        }
        let end = first_block + count;
        let kept: Vec<u64> = h.saved.range(first_block..end).map(|(&b, _)| b).collect();
        for b in &kept {
            let data = h.saved.remove(b).expect("listed");
            let at = ((b - first_block) as usize) * block;
            buf[at..at + block].copy_from_slice(&data);
            h.saved_bytes -= BLOCK_SIZE_BYTES;
        }
        h.next_block = end;
        // Every block of the piece changed since the moment must have been kept: else the
        // bytes would mix two moments (a defect of the hold; fail rather than ship them).
        let changed = checkpoints::changed_runs(
            &self.inner,
            &self.name,
            first_block * BLOCK_SIZE_BYTES,
            count * BLOCK_SIZE_BYTES,
            usize::MAX,
        )?;
        let mut at = first_block;
        for (len_bytes, set) in changed {
            let n = len_bytes / BLOCK_SIZE_BYTES;
            if set {
                if let Some(b) = (at..at + n).find(|b| kept.binary_search(b).is_err()) {
                    return Err(Error::Export(format!(
                        "export-diff since {}: block {b} changed after checkpoint {} was created and was not kept for the export (a defect; please report it)",
                        self.since, self.name
                    )));
                }
            }
            at += n;
        }
        Ok(())
    }
}

impl Drop for Export {
    fn drop(&mut self) {
        let mut st = self.hold.state.lock();
        self.hold.active.store(false, Ordering::Release);
        *st = None;
        drop(st);
        self.hold.exporting.store(false, Ordering::Release);
    }
}
