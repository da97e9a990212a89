//! The backing-device label: the last 4 KiB of the backing device carry the UUID of the cache
//! formatted for it, so a cache is never attached to the wrong backing device.
//!
//! ```text
//! |  0 |  8 | magic "LCLABEL\x01"
//! |  8 | 16 | backing_uuid
//! | 24 |  8 | format_id of the cache formatted for it
//! | 32 |  8 | exported_size_bytes (the label's own offset)
//! | 40 |  4 | CRC32C of bytes 0..40
//! ```
//! Bytes 44..512 are zero; bytes 512..1024 hold the CLI's owner record; bytes 1024..1536 hold
//! the [`WritebackRecord`] (format version 3): what the backing device alone holds, so a lost
//! cache can be detached knowing how stale the disk is. The exported disk is the backing device
//! without this block, so the backing device stays directly usable after a drain.

use super::*;
use crate::error::{Error, Result};

pub const LABEL_MAGIC: u64 = u64::from_le_bytes(*b"LCLABEL\x01");
pub const LABEL_SIZE_BYTES: u64 = BLOCK_SIZE_BYTES;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Label {
    pub backing_uuid: [u8; 16],
    pub format_id: u64,
    pub exported_size_bytes: u64,
}

/// Where the label lives on a backing device of `backing_size_bytes`, which is also the size of
/// the exported disk; `None` if the device is too small to hold a label and one block.
pub fn label_offset(backing_size_bytes: u64) -> Option<u64> {
    let aligned = backing_size_bytes / BLOCK_SIZE_BYTES * BLOCK_SIZE_BYTES;
    (aligned >= 2 * BLOCK_SIZE_BYTES).then(|| aligned - LABEL_SIZE_BYTES)
}

impl Label {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; LABEL_SIZE_BYTES as usize];
        put_u64(&mut b, 0, LABEL_MAGIC);
        b[8..24].copy_from_slice(&self.backing_uuid);
        put_u64(&mut b, 24, self.format_id);
        put_u64(&mut b, 32, self.exported_size_bytes);
        let crc = crc32c::crc32c(&b[..40]);
        put_u32(&mut b, 40, crc);
        b
    }

    /// `Ok(None)`: no label (magic absent). A label with our magic that fails its CRC is an error.
    pub fn decode(b: &[u8]) -> Result<Option<Label>> {
        if get_u64(b, 0) != LABEL_MAGIC {
            return Ok(None);
        }
        if get_u32(b, 40) != crc32c::crc32c(&b[..40]) {
            return Err(Error::Corruption("backing label checksum mismatch".into()));
        }
        Ok(Some(Label {
            backing_uuid: b[8..24].try_into().expect("16 bytes"),
            format_id: get_u64(b, 24),
            exported_size_bytes: get_u64(b, 32),
        }))
    }
}

/// "LCWBREC" and the record's version, 2 (adds `lost_bytes`); version 1 records (no
/// `lost_bytes`, read as 0) are still read.
pub const RECORD_MAGIC: u64 = u64::from_le_bytes(*b"LCWBREC\x02");
/// The version 1 record: the same fields but `lost_bytes`.
pub const RECORD_MAGIC_V1: u64 = u64::from_le_bytes(*b"LCWBREC\x01");
/// Where the writeback record lives in the label block: its third 512-byte sector (the label
/// uses the first, the owner record the second), written alone so that a torn write can never
/// damage the label itself.
pub const RECORD_OFFSET_IN_LABEL_BYTES: u64 = 1024;
pub const RECORD_SIZE_BYTES: usize = 512;
/// `WritebackRecord::flags`: `logcache detach --force` gave up the cache's data not yet written
/// back; the label's `format_id` is 0 so that no cache opens this backing device again.
pub const RECORD_DETACHED: u32 = 1;
/// `WritebackRecord::flags`: the cache wrote back in `sorted` order; the backing device alone
/// may hold a mixture no disk ever held.
pub const RECORD_SORTED: u32 = 2;
/// `WritebackRecord::flags` (version 2): serve gave up its failed cache device and went on from
/// the backing device alone, which then received every later write: the backing device is the
/// served disk, but for `lost_bytes` whose newest data was only in the failed cache (they hold
/// older data, and read as EIO while that serve ran). Set with `RECORD_DETACHED`.
pub const RECORD_SERVED_ALONE: u32 = 4;

/// What the backing device alone holds, written by the engine whenever it persists its
/// writeback position (at each flush epoch's start and when writeback catches up), after the
/// backing device synced everything the record claims.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WritebackRecord {
    /// The cache this record describes (the label's `format_id` when written).
    pub format_id: u64,
    pub flags: u32,
    /// Wall-clock ms since 1970 of the newest flush point whose writes are all on the backing
    /// device (synced); 0: unknown.
    pub consistent_as_of_unix_ms: u64,
    /// When the record was written (wall-clock ms since 1970).
    pub recorded_unix_ms: u64,
    /// Dirty bytes not yet on the backing device when the record was written.
    pub lag_bytes: u64,
    /// When `detach --force` (or serve, on giving up a failed cache device) marked the backing
    /// device (0: not detached).
    pub detached_unix_ms: u64,
    /// Bytes whose newest data was lost with the cache device, counted exactly when serve gave
    /// up a failed cache device holding dirty data (0: none known; version 1 records).
    pub lost_bytes: u64,
}

impl WritebackRecord {
    pub fn encode(&self) -> [u8; RECORD_SIZE_BYTES] {
        let mut b = [0u8; RECORD_SIZE_BYTES];
        put_u64(&mut b, 0, RECORD_MAGIC);
        put_u64(&mut b, 8, self.format_id);
        put_u32(&mut b, 16, self.flags);
        put_u64(&mut b, 24, self.consistent_as_of_unix_ms);
        put_u64(&mut b, 32, self.recorded_unix_ms);
        put_u64(&mut b, 40, self.lag_bytes);
        put_u64(&mut b, 48, self.detached_unix_ms);
        put_u64(&mut b, 56, self.lost_bytes);
        let crc = crc32c::crc32c(&b[..RECORD_SIZE_BYTES - 4]);
        put_u32(&mut b, RECORD_SIZE_BYTES - 4, crc);
        b
    }

    /// The record in a 4 KiB label block. None: absent (a label written before version 3, or
    /// after `format`), or damaged (a torn write): either way nothing is known.
    pub fn decode_from_label(block: &[u8]) -> Option<WritebackRecord> {
        let at = RECORD_OFFSET_IN_LABEL_BYTES as usize;
        let b = &block[at..at + RECORD_SIZE_BYTES];
        let magic = get_u64(b, 0);
        if (magic != RECORD_MAGIC && magic != RECORD_MAGIC_V1)
            || get_u32(b, RECORD_SIZE_BYTES - 4) != crc32c::crc32c(&b[..RECORD_SIZE_BYTES - 4])
        {
            return None;
        }
        Some(WritebackRecord {
            format_id: get_u64(b, 8),
            flags: get_u32(b, 16),
            consistent_as_of_unix_ms: get_u64(b, 24),
            recorded_unix_ms: get_u64(b, 32),
            lag_bytes: get_u64(b, 40),
            detached_unix_ms: get_u64(b, 48),
            lost_bytes: if magic == RECORD_MAGIC {
                get_u64(b, 56)
            } else {
                0
            },
        })
    }

    pub fn detached(&self) -> bool {
        self.flags & RECORD_DETACHED != 0
    }

    pub fn served_alone(&self) -> bool {
        self.flags & RECORD_SERVED_ALONE != 0
    }

    /// `record` (the label's own, if any) marked detached at `now_unix_ms`: what it said the
    /// backing device holds stays, for whoever reads it later.
    pub fn detached_from(
        record: Option<WritebackRecord>,
        label: &Label,
        now_unix_ms: u64,
    ) -> WritebackRecord {
        WritebackRecord {
            flags: record.map_or(0, |r| r.flags) | RECORD_DETACHED,
            detached_unix_ms: now_unix_ms,
            ..record.unwrap_or(WritebackRecord {
                format_id: label.format_id,
                flags: 0,
                consistent_as_of_unix_ms: 0,
                recorded_unix_ms: 0,
                lag_bytes: 0,
                detached_unix_ms: 0,
                lost_bytes: 0,
            })
        }
    }
}

/// Marks the backing device `dev` (its label at `label_at`) detached from its cache, with
/// `record` (see [`WritebackRecord::detached_from`]): the record first, synced (with it alone,
/// this version already refuses the old cache), then the label with `format_id` 0 (which every
/// version refuses), synced. The sync between them keeps a power cut from leaving the label
/// without the record that says when and why (sim seed 5047: the unsynced label survived the
/// cut, the record did not).
pub fn write_detached(
    dev: &dyn crate::io::BlockDevice,
    label_at: u64,
    label: &Label,
    record: &WritebackRecord,
) -> std::io::Result<()> {
    debug_assert!(record.detached());
    let unlabelled = Label {
        format_id: 0,
        ..*label
    };
    dev.write_at(&record.encode(), label_at + RECORD_OFFSET_IN_LABEL_BYTES)?;
    dev.flush()?;
    dev.write_at(&unlabelled.encode()[..512], label_at)?;
    dev.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_writeback_record_round_trips_and_damage_reads_as_none() {
        let r = WritebackRecord {
            format_id: 7,
            flags: RECORD_DETACHED,
            consistent_as_of_unix_ms: 1_795_618_987_000,
            recorded_unix_ms: 1_795_619_028_000,
            lag_bytes: 230 << 20,
            detached_unix_ms: 1_795_619_100_000,
            lost_bytes: 12 << 20,
        };
        let mut block = vec![0u8; 4096];
        assert_eq!(WritebackRecord::decode_from_label(&block), None);
        block[1024..1536].copy_from_slice(&r.encode());
        assert_eq!(WritebackRecord::decode_from_label(&block), Some(r));
        assert!(r.detached());
        block[1024 + 30] ^= 1;
        assert_eq!(WritebackRecord::decode_from_label(&block), None);
        // A version 1 record (before `lost_bytes`) still reads, with nothing lost known.
        let mut v1 = r.encode();
        v1[..8].copy_from_slice(&RECORD_MAGIC_V1.to_le_bytes());
        v1[56..64].fill(0);
        let crc = crc32c::crc32c(&v1[..RECORD_SIZE_BYTES - 4]);
        v1[RECORD_SIZE_BYTES - 4..].copy_from_slice(&crc.to_le_bytes());
        block[1024..1536].copy_from_slice(&v1);
        assert_eq!(
            WritebackRecord::decode_from_label(&block),
            Some(WritebackRecord { lost_bytes: 0, ..r })
        );
    }

    #[test]
    fn round_trip_and_corruption() {
        let l = Label {
            backing_uuid: [3; 16],
            format_id: 99,
            exported_size_bytes: 1 << 20,
        };
        let raw = l.encode();
        assert_eq!(Label::decode(&raw).unwrap(), Some(l));
        let mut bad = raw.clone();
        bad[20] ^= 1;
        assert!(Label::decode(&bad).is_err());
        assert_eq!(Label::decode(&[0u8; 4096]).unwrap(), None);
    }

    #[test]
    fn offset_is_the_last_whole_block() {
        assert_eq!(label_offset(1 << 20), Some((1 << 20) - 4096));
        assert_eq!(label_offset((1 << 20) + 512), Some((1 << 20) - 4096));
        assert_eq!(label_offset(4096), None);
    }
}
