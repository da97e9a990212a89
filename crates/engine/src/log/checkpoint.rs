//! Reading and writing the superblock (and its checkpoint record) on the cache device. The
//! checkpoint's fields change only here, through named transitions (`SuperblockWriter`).

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::format::superblock::{
    self, PersistedTunables, Superblock, CHECKPOINT_CLEAN, SUPERBLOCK_OFFSETS,
    SUPERBLOCK_SIZE_BYTES,
};
use crate::io::aligned::AlignedBuf;
use crate::io::BlockDevice;

/// Reads both superblock copies and returns the newest valid one.
pub fn read(cache: &dyn BlockDevice) -> Result<Option<Superblock>> {
    if cache.size_bytes() < SUPERBLOCK_OFFSETS[1] + SUPERBLOCK_SIZE_BYTES as u64 {
        return Ok(None);
    }
    let mut raw = AlignedBuf::new(2 * SUPERBLOCK_SIZE_BYTES);
    cache
        .read_at(&mut raw, 0)
        .map_err(|e| Error::io(format!("reading the superblock of {}", cache.describe()), e))?;
    let (a, b) = raw.split_at(SUPERBLOCK_SIZE_BYTES);
    superblock::choose([a, b])
}

/// Owns the in-memory copy of the superblock; every change is written with the next
/// generation to the other copy, then synced.
pub struct SuperblockWriter {
    cache: Arc<dyn BlockDevice>,
    current: crate::sync::Mutex<Superblock>,
}

impl SuperblockWriter {
    pub fn new(cache: Arc<dyn BlockDevice>, sb: Superblock) -> SuperblockWriter {
        SuperblockWriter {
            cache,
            current: crate::sync::Mutex::new(sb),
        }
    }

    /// A new session begins (open, after recovery and before anything new is written): the
    /// new epoch and the cut, so chunks a crash left after `cut_seq` can never rejoin the log;
    /// zero ranges applied up to chunk `zero_applied_seq` (`cut_seq` unless open still applies
    /// some); the head recovery found; the checkpoint is no longer clean.
    pub fn begin_session(
        &self,
        epoch: u64,
        cut_seq: u64,
        zero_applied_seq: u64,
        head_segment_id: u64,
        head_seq: u64,
    ) -> Result<()> {
        self.update(|s| {
            assert!(epoch > s.checkpoint.epoch, "epochs only rise");
            let cp = &mut s.checkpoint;
            cp.flags &= !CHECKPOINT_CLEAN;
            cp.epoch = epoch;
            cp.cut_seq = cut_seq;
            // Sequences after the cut are reused by this session: a writeback position past
            // it would make their new dirty chunks replay as clean.
            cp.writeback_seq = cp.writeback_seq.min(cut_seq);
            // Every zero range in the recovered log up to here is applied (by open, or before).
            assert!(zero_applied_seq <= cut_seq);
            cp.zero_applied_seq = zero_applied_seq;
            cp.end_seq = 0;
            cp.head_segment_id = head_segment_id;
            cp.head_seq = head_seq;
        })
    }

    /// The head advanced past reclaimed segments (persisted before their slots are reused).
    pub fn advance_head(&self, head_segment_id: u64, head_seq: u64) -> Result<()> {
        self.update(|s| {
            let cp = &mut s.checkpoint;
            assert!(
                head_segment_id > cp.head_segment_id,
                "the head only advances"
            );
            assert!(head_seq >= cp.head_seq, "the head's sequence only rises");
            cp.head_segment_id = head_segment_id;
            cp.head_seq = head_seq;
        })
    }

    /// Chunks up to `seq` may replay as clean (the writeback position; it never moves back).
    pub fn advance_writeback(&self, seq: u64) -> Result<()> {
        self.update(|s| s.checkpoint.writeback_seq = s.checkpoint.writeback_seq.max(seq))
    }

    /// Zero ranges up to chunk `seq` are applied to the backing device: recovery must not
    /// apply them again.
    pub fn advance_zero_applied(&self, seq: u64) -> Result<()> {
        self.update(|s| s.checkpoint.zero_applied_seq = s.checkpoint.zero_applied_seq.max(seq))
    }

    /// A clean close: the log ends at `end_seq`, so the next open need not verify its tail.
    pub fn close_clean(
        &self,
        end_seq: u64,
        head_segment_id: u64,
        head_seq: u64,
        writeback_seq: u64,
    ) -> Result<()> {
        self.update(|s| {
            let cp = &mut s.checkpoint;
            assert!(
                head_segment_id >= cp.head_segment_id,
                "the head only advances"
            );
            cp.flags |= CHECKPOINT_CLEAN;
            cp.end_seq = end_seq;
            cp.head_segment_id = head_segment_id;
            cp.head_seq = head_seq;
            cp.writeback_seq = writeback_seq;
        })
    }

    /// Persists the tunables' values.
    pub fn set_tunables(&self, tunables: PersistedTunables) -> Result<()> {
        self.update(|s| s.tunables = tunables)
    }

    /// Applies `change` and makes the result durable. Serialised by the inner lock, which is
    /// held across the IO: superblock writes are rare (open, close, reclaim) and off the IO path.
    fn update(&self, change: impl FnOnce(&mut Superblock)) -> Result<()> {
        let mut cur = self.current.lock();
        let mut next = cur.clone();
        change(&mut next);
        next.generation = cur.generation + 1;
        next.validate()?;
        write_durable(&*self.cache, &next)?;
        *cur = next;
        Ok(())
    }
}

/// Writes `sb` to the copy its generation selects and syncs the device.
pub fn write_durable(cache: &dyn BlockDevice, sb: &Superblock) -> Result<()> {
    let mut raw = AlignedBuf::new(SUPERBLOCK_SIZE_BYTES);
    raw.copy_from_slice(&sb.encode());
    let off = Superblock::copy_offset(sb.generation);
    cache
        .write_at(&raw, off)
        .map_err(|e| Error::io(format!("writing the superblock of {}", cache.describe()), e))?;
    cache
        .flush()
        .map_err(|e| Error::io(format!("syncing the superblock of {}", cache.describe()), e))
}
