//! Reading and writing the superblock (and its checkpoint record) on the cache device.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::format::superblock::{self, Superblock, SUPERBLOCK_OFFSETS, SUPERBLOCK_SIZE_BYTES};
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
    current: parking_lot::Mutex<Superblock>,
}

impl SuperblockWriter {
    pub fn new(cache: Arc<dyn BlockDevice>, sb: Superblock) -> SuperblockWriter {
        SuperblockWriter {
            cache,
            current: parking_lot::Mutex::new(sb),
        }
    }

    /// Applies `change` and makes the result durable. Serialised by the inner lock, which is
    /// held across the IO: superblock writes are rare (open, close, reclaim) and off the IO path.
    pub fn update(&self, change: impl FnOnce(&mut Superblock)) -> Result<()> {
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
