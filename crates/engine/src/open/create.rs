//! Formatting a cache: O(1) in the cache size. A new format id makes every old chunk invisible,
//! so only the superblock copies and the backing label are written.

use crate::error::{Error, Result};
use crate::format::checkpoints::*;
use crate::format::label::{label_offset, Label, WritebackRecord};
use crate::format::superblock::{Checkpoint, PersistedTunables, Superblock, CHECKPOINT_CLEAN};
use crate::format::*;
use crate::io::aligned::AlignedBuf;
use crate::io::BlockDevice;

use crate::log::checkpoint;
use crate::tunables;

#[derive(Clone, Debug)]
pub struct FormatOptions {
    pub segment_size_bytes: u64,
    /// Overwrite a cache that may hold data, or a backing device labelled for another cache.
    pub force: bool,
    /// Periodic seal interval to persist (`None`: the default; `Some(0)`: off).
    pub seal_interval_ms: Option<u32>,
    /// Checkpoints the cache can hold at once (0 to 16; 0: no room for checkpoints). Each
    /// takes two bitmap copies of 8 KiB per 127.5 MiB of disk on the cache device.
    pub checkpoint_slots: u32,
}

impl Default for FormatOptions {
    fn default() -> Self {
        FormatOptions {
            segment_size_bytes: SEGMENT_SIZE_DEFAULT_BYTES,
            force: false,
            seal_interval_ms: None,
            checkpoint_slots: CHECKPOINT_SLOTS_DEFAULT,
        }
    }
}

/// Where the bitmap area and the segments start for `slots` checkpoints of a disk of
/// `exported_bytes`: inside the superblock region after the table when it fits (disks up to a
/// few GiB: the geometry is then the same as without checkpoints), else after the region, the
/// segments moving up to the next MiB.
fn checkpoint_layout(slots: u32, exported_bytes: u64) -> (u64, u32, u64) {
    if slots == 0 {
        return (0, 0, SUPERBLOCK_REGION_BYTES);
    }
    let pages = pages_per_slot(exported_bytes / BLOCK_SIZE_BYTES);
    let area = area_size_bytes(slots, pages);
    let region_room = SUPERBLOCK_REGION_BYTES - AREA_OFFSET_IN_REGION_BYTES;
    if area <= region_room {
        return (AREA_OFFSET_IN_REGION_BYTES, pages, SUPERBLOCK_REGION_BYTES);
    }
    let segments = (SUPERBLOCK_REGION_BYTES + area).next_multiple_of(SUPERBLOCK_REGION_BYTES);
    (SUPERBLOCK_REGION_BYTES, pages, segments)
}

/// Formats `cache` as a cache for `backing`. Returns the new superblock.
pub fn format_cache(
    cache: &dyn BlockDevice,
    backing: &dyn BlockDevice,
    opts: &FormatOptions,
) -> Result<Superblock> {
    let seg = opts.segment_size_bytes;
    if !(SEGMENT_SIZE_MIN_BYTES..=SEGMENT_SIZE_MAX_BYTES).contains(&seg)
        || !seg.is_multiple_of(BLOCK_SIZE_BYTES)
    {
        return Err(Error::InvalidArgument(format!(
            "segment size {seg} must be a multiple of 4 KiB from 32 KiB to 16 MiB"
        )));
    }
    if opts.checkpoint_slots > CHECKPOINT_SLOTS_MAX {
        return Err(Error::InvalidArgument(format!(
            "{} checkpoints asked for; a cache holds at most {CHECKPOINT_SLOTS_MAX}",
            opts.checkpoint_slots
        )));
    }
    let backing_size = backing.size_bytes();
    let exported = label_offset(backing_size).ok_or_else(|| {
        Error::NoSpace(format!(
            "{} is {backing_size} bytes; a backing device needs at least 8 KiB",
            backing.describe()
        ))
    })?;
    let (area_offset, pages, segments_offset) = checkpoint_layout(opts.checkpoint_slots, exported);
    let cache_size = cache.size_bytes();
    let segment_count = cache_size.saturating_sub(segments_offset) / seg;
    let needed = segments_offset + SEGMENT_COUNT_MIN * seg;
    if segment_count < SEGMENT_COUNT_MIN {
        return Err(Error::NoSpace(format!(
            "{} is {cache_size} bytes; a cache with {seg}-byte segments needs at least {needed}",
            cache.describe()
        )));
    }
    if segment_count * (seg / BLOCK_SIZE_BYTES) >= u32::MAX as u64 {
        return Err(Error::InvalidArgument(format!(
            "{} is too large: at most 2^32-1 cache blocks (16 TiB) are supported",
            cache.describe()
        )));
    }

    let old = match checkpoint::read(cache) {
        Ok(sb) => sb,
        Err(e) if opts.force => {
            let _ = e;
            None
        }
        Err(e) => {
            return Err(Error::HoldsData(format!(
                "{} has a damaged logcache superblock ({e}); format with force (logcache format --force) to overwrite it anyway",
                cache.describe()
            )))
        }
    };
    if let Some(sb) = &old {
        let empty = sb.is_clean() && sb.checkpoint.end_seq < sb.checkpoint.head_seq;
        if !empty && !opts.force {
            return Err(Error::HoldsData(format!(
                "{} is a logcache cache that may hold data not yet on its backing device; \
                 drain it first, or format with force (logcache format --force) to discard that data",
                cache.describe()
            )));
        }
    }
    let mut raw = AlignedBuf::new(BLOCK_SIZE_BYTES as usize);
    backing
        .read_at(&mut raw, exported)
        .map_err(|e| Error::io(format!("reading the end of {}", backing.describe()), e))?;
    let old_label = Label::decode(&raw).ok().flatten();
    // A backing device `detach --force` took from its lost cache belongs to no cache: its
    // record says so, or its label's `format_id` 0 (should the record be lost).
    let detached = WritebackRecord::decode_from_label(&raw).is_some_and(|r| r.detached())
        || old_label.is_some_and(|l| l.format_id == 0);
    if let Some(l) = old_label.filter(|_| !detached) {
        let ours = old
            .as_ref()
            .is_some_and(|sb| sb.backing_uuid == l.backing_uuid);
        if !ours && !opts.force {
            return Err(Error::HoldsData(format!(
                "{} is labelled as the backing device of another cache (uuid {}); that cache may \
                 hold its newest data; format with --force to take it over anyway",
                backing.describe(),
                uuid_to_string(&l.backing_uuid)
            )));
        }
    }

    let format_id = random_u64();
    let backing_uuid = new_uuid();
    let label = Label {
        backing_uuid,
        format_id,
        exported_size_bytes: exported,
    };
    raw.copy_from_slice(&label.encode());
    backing
        .write_at(&raw, exported)
        .map_err(|e| Error::io(format!("writing the label of {}", backing.describe()), e))?;
    backing
        .flush()
        .map_err(|e| Error::io(format!("syncing {}", backing.describe()), e))?;

    let sb = Superblock {
        format_id,
        generation: old.as_ref().map_or(1, |s| s.generation + 2),
        segment_size_bytes: seg as u32,
        cache_size_bytes: cache_size,
        segments_offset_bytes: segments_offset,
        segment_count,
        backing_size_bytes: backing_size,
        backing_uuid,
        exported_size_bytes: exported,
        format_time_unix_s: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        checkpoint: Checkpoint {
            flags: CHECKPOINT_CLEAN,
            head_segment_id: 1,
            head_seq: 1,
            epoch: 0,
            cut_seq: 0,
            end_seq: 0,
            writeback_seq: 0,
            zero_applied_seq: 0,
        },
        bitmap_area_offset_bytes: area_offset,
        checkpoint_slots: opts.checkpoint_slots,
        bitmap_pages_per_slot: pages,
        tunables: {
            let mut t = PersistedTunables::default();
            if let Some(ms) = opts.seal_interval_ms {
                t.put(tunables::SPECS[tunables::SEAL_INTERVAL_MS].slot, ms as u64);
            }
            t
        },
    };
    sb.validate()?;
    // An empty checkpoint table in both copies (salted with the new format id, so no table of
    // an older format verifies): a table that later fails to verify is damage, not absence.
    if sb.has_checkpoints() {
        crate::bitmaps::write_empty_tables(cache, &sb)?;
    }
    // Both copies, so no copy of an older format can outrank this one.
    let mut second = sb.clone();
    second.generation += 1;
    checkpoint::write_durable(cache, &sb)?;
    checkpoint::write_durable(cache, &second)?;
    Ok(second)
}
