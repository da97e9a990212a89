//! Open-time code: formatting a cache, and recovering the log into the in-memory state
//! (walk the chunk chain with metadata read ahead, judge where the log ends, replay it).

pub mod create;
pub mod prefetch;
pub mod recover;
mod replay;
mod walk;

use crate::error::{Error, Result};
use crate::format::label;
use crate::format::superblock::Superblock;
use crate::format::BLOCK_SIZE_BYTES;
use crate::io::aligned::AlignedBuf;
use crate::io::BlockDevice;

/// Checks the cache device is not shorter than when it was formatted.
pub(crate) fn check_cache_size(sb: &Superblock, cache: &dyn BlockDevice) -> Result<()> {
    if cache.size_bytes() < sb.cache_size_bytes {
        return Err(Error::Corruption(format!(
            "{} is {} bytes but was formatted with {} bytes (truncated?)",
            cache.describe(),
            cache.size_bytes(),
            sb.cache_size_bytes
        )));
    }
    Ok(())
}

/// Checks the backing device is the one the cache was formatted for, and was not detached
/// from it; returns the writeback record its label carries (if any).
pub(crate) fn check_backing(
    sb: &Superblock,
    backing: &dyn BlockDevice,
) -> Result<Option<label::WritebackRecord>> {
    if backing.size_bytes() != sb.backing_size_bytes {
        return Err(Error::WrongBacking(format!(
            "{} is {} bytes, but this cache was formatted for a {}-byte backing device",
            backing.describe(),
            backing.size_bytes(),
            sb.backing_size_bytes
        )));
    }
    let off = label::label_offset(sb.backing_size_bytes)
        .ok_or_else(|| Error::Corruption("backing size in superblock too small".into()))?;
    let mut raw = AlignedBuf::new(BLOCK_SIZE_BYTES as usize);
    backing
        .read_at(&mut raw, off)
        .map_err(|e| Error::io(format!("reading the label of {}", backing.describe()), e))?;
    let record = label::WritebackRecord::decode_from_label(&raw);
    let still_labelled = matches!(
        label::Label::decode(&raw),
        Ok(Some(l)) if l.format_id == sb.format_id
    );
    if let Some(r) = record.filter(|r| {
        r.detached() && r.served_alone() && r.format_id == sb.format_id && still_labelled
    }) {
        // The record of serve's mark is written (and synced) before the label: the mark was
        // begun when the cache device failed and did not finish, so serve never went on alone.
        return Err(Error::WrongBacking(format!(
            "{} was detached from this cache only in part: its cache device failed while serving and the mark did not finish (nothing reached it past the cache; {} of dirty data in the cache was given up); run `logcache detach --force --backing {}` to finish it and see what the disk holds, then use it alone or give it a new cache with `logcache format`",
            backing.describe(),
            crate::format::human_bytes(r.lost_bytes),
            backing.describe()
        )));
    }
    if let Some(r) =
        record.filter(|r| r.detached() && r.served_alone() && r.format_id == sb.format_id)
    {
        let lost = if r.lost_bytes == 0 {
            "no data was lost".to_string()
        } else {
            format!(
                "{} bytes ({}) written before the failure were lost with it: the backing device holds older data there, check its filesystem",
                r.lost_bytes,
                crate::format::human_bytes(r.lost_bytes)
            )
        };
        return Err(Error::WrongBacking(format!(
            "{} was detached from this cache when the cache device failed while serving, and was served alone since ({lost}); give it a new cache with `logcache format`",
            backing.describe()
        )));
    }
    // The detached mark: the record (written first), or the label with `format_id` 0 for
    // this backing device (a mark whose record was lost: written by a build that did not sync
    // between the two, or damaged since).
    let unlabelled = matches!(
        label::Label::decode(&raw),
        Ok(Some(l)) if l.format_id == 0 && l.backing_uuid == sb.backing_uuid
    );
    if unlabelled || record.is_some_and(|r| r.detached() && r.format_id == sb.format_id) {
        return Err(Error::WrongBacking(format!(
            "{} was detached from this cache (by `logcache detach --force`, giving up its data not yet written back, or by serve when this cache device failed) and may have been used alone since; give it a new cache with `logcache format`",
            backing.describe()
        )));
    }
    match label::Label::decode(&raw)? {
        Some(l) if l.backing_uuid == sb.backing_uuid && l.format_id == sb.format_id => {
            Ok(record.filter(|r| r.format_id == sb.format_id))
        }
        Some(l) => Err(Error::WrongBacking(format!(
            "{} carries the label of another cache (backing uuid {}); this cache expects {}",
            backing.describe(),
            crate::format::uuid_to_string(&l.backing_uuid),
            crate::format::uuid_to_string(&sb.backing_uuid)
        ))),
        None => Err(Error::WrongBacking(format!(
            "{} has no logcache label; this cache expects backing uuid {}",
            backing.describe(),
            crate::format::uuid_to_string(&sb.backing_uuid)
        ))),
    }
}
