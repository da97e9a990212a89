//! The superblock: geometry, identity, the checkpoint record and persisted tunables.
//!
//! Two 4 KiB copies live at offsets 0 and 4096 of the cache device. Each write goes to the copy
//! named by its generation's parity, so a torn superblock write always leaves the other, older
//! copy intact; readers take the valid copy with the highest generation.
//!
//! ```text
//! | off | size | field                       |
//! |   0 |    8 | magic "LCSUPER\x01"         |
//! |   8 |    4 | version                     |
//! |  12 |    4 | reserved (0)                |
//! |  16 |    8 | format_id (checksum salt)   |
//! |  24 |    8 | generation                  |
//! |  32 |    4 | block_size_bytes (4096)     |
//! |  36 |    4 | sector_size_bytes (512)     |
//! |  40 |    4 | segment_size_bytes          |
//! |  44 |    4 | reserved (0)                |
//! |  48 |    8 | cache_size_bytes            |
//! |  56 |    8 | segments_offset_bytes       |
//! |  64 |    8 | segment_count               |
//! |  72 |    8 | backing_size_bytes          |
//! |  80 |   16 | backing_uuid                |
//! |  96 |    8 | exported_size_bytes         |
//! | 104 |    8 | format_time_unix_s          |
//! | 128 |  ... | checkpoint record (below)   |
//! | 192 |    8 | bitmap_area_offset_bytes (v4; 0: no checkpoints) |
//! | 200 |    4 | checkpoint_slots (v4)       |
//! | 204 |    4 | bitmap_pages_per_slot (v4)  |
//! | 256 |  264 | tunables (present mask, 32 u64 slots) |
//! |4092 |    4 | CRC32C of bytes 0..4092     |
//! ```

use super::*;
use crate::error::{Error, Result};

pub const SUPERBLOCK_MAGIC: u64 = u64::from_le_bytes(*b"LCSUPER\x01");
pub const SUPERBLOCK_SIZE_BYTES: usize = 4096;
/// Byte offsets of the two copies on the cache device.
pub const SUPERBLOCK_OFFSETS: [u64; 2] = [0, 4096];

const CRC_OFFSET: usize = SUPERBLOCK_SIZE_BYTES - 4;

/// Checkpoint flag: the last session closed cleanly and `end_seq` is exact.
pub const CHECKPOINT_CLEAN: u32 = 1;

/// The checkpoint record: where the log starts, and how the last session ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Checkpoint {
    /// `CHECKPOINT_*` bits.
    pub flags: u32,
    /// Oldest segment still part of the log; recovery starts its walk here.
    pub head_segment_id: u64,
    /// Sequence number of the first chunk of the head segment.
    pub head_seq: u64,
    /// The session number that wrote the log after `cut_seq`. Bumped at every open.
    pub epoch: u64,
    /// The last chunk sequence recovered when this session opened: chunks after it must carry
    /// this superblock's `epoch`, so stale chunks from a discarded tail never rejoin the log.
    pub cut_seq: u64,
    /// With `CHECKPOINT_CLEAN`: the sequence of the last chunk written (all of them synced).
    pub end_seq: u64,
    /// Every chunk with a sequence at or below this has been written back (0: none). Writeback
    /// advances it; until then it stays 0.
    pub writeback_seq: u64,
    /// Every zero range (TRIM, write-zeroes) in a chunk at or below this is applied to the
    /// backing device and synced there: recovery applies only later ones again.
    pub zero_applied_seq: u64,
}

/// Slots in the superblock's tunables area.
pub const TUNABLE_SLOTS: usize = 32;
const TUNABLES_OFFSET: usize = 256;

/// Tunables persisted so a restart keeps them: a bit per slot saying whether it holds a value
/// (absent slots take the built-in default), then one u64 per slot. What each slot means is
/// `engine::tunables::SPECS`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PersistedTunables {
    pub present_mask: u32,
    pub values: [u64; TUNABLE_SLOTS],
}

impl PersistedTunables {
    pub fn get(&self, slot: usize) -> Option<u64> {
        (self.present_mask & (1 << slot) != 0).then_some(self.values[slot])
    }

    pub fn put(&mut self, slot: usize, value: u64) {
        self.present_mask |= 1 << slot;
        self.values[slot] = value;
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    pub format_id: u64,
    pub generation: u64,
    pub segment_size_bytes: u32,
    pub cache_size_bytes: u64,
    pub segments_offset_bytes: u64,
    pub segment_count: u64,
    pub backing_size_bytes: u64,
    pub backing_uuid: [u8; 16],
    pub exported_size_bytes: u64,
    pub format_time_unix_s: u64,
    pub checkpoint: Checkpoint,
    /// Checkpoints (format v4, see `format::checkpoints`): where their bitmap pages start, how
    /// many the table holds, and pages per checkpoint. All zero: formatted without room for
    /// checkpoints (every cache formatted before v4).
    pub bitmap_area_offset_bytes: u64,
    pub checkpoint_slots: u32,
    pub bitmap_pages_per_slot: u32,
    pub tunables: PersistedTunables,
}

impl Superblock {
    pub fn encode(&self) -> [u8; SUPERBLOCK_SIZE_BYTES] {
        let mut b = [0u8; SUPERBLOCK_SIZE_BYTES];
        put_u64(&mut b, 0, SUPERBLOCK_MAGIC);
        put_u32(&mut b, 8, FORMAT_VERSION);
        put_u64(&mut b, 16, self.format_id);
        put_u64(&mut b, 24, self.generation);
        put_u32(&mut b, 32, BLOCK_SIZE_BYTES as u32);
        put_u32(&mut b, 36, SECTOR_SIZE_BYTES as u32);
        put_u32(&mut b, 40, self.segment_size_bytes);
        put_u64(&mut b, 48, self.cache_size_bytes);
        put_u64(&mut b, 56, self.segments_offset_bytes);
        put_u64(&mut b, 64, self.segment_count);
        put_u64(&mut b, 72, self.backing_size_bytes);
        b[80..96].copy_from_slice(&self.backing_uuid);
        put_u64(&mut b, 96, self.exported_size_bytes);
        put_u64(&mut b, 104, self.format_time_unix_s);
        let c = &self.checkpoint;
        put_u32(&mut b, 128, c.flags);
        put_u64(&mut b, 136, c.head_segment_id);
        put_u64(&mut b, 144, c.head_seq);
        put_u64(&mut b, 152, c.epoch);
        put_u64(&mut b, 160, c.cut_seq);
        put_u64(&mut b, 168, c.end_seq);
        put_u64(&mut b, 176, c.writeback_seq);
        put_u64(&mut b, 184, c.zero_applied_seq);
        put_u64(&mut b, 192, self.bitmap_area_offset_bytes);
        put_u32(&mut b, 200, self.checkpoint_slots);
        put_u32(&mut b, 204, self.bitmap_pages_per_slot);
        put_u32(&mut b, TUNABLES_OFFSET, self.tunables.present_mask);
        for (i, v) in self.tunables.values.iter().enumerate() {
            put_u64(&mut b, TUNABLES_OFFSET + 8 + 8 * i, *v);
        }
        let crc = crc32c::crc32c(&b[..CRC_OFFSET]);
        put_u32(&mut b, CRC_OFFSET, crc);
        b
    }

    /// Decodes and validates one superblock copy. `Ok(None)` means "no logcache superblock
    /// here" (wrong magic); a superblock with our magic that fails validation is an error.
    pub fn decode(b: &[u8]) -> Result<Option<Superblock>> {
        assert_eq!(b.len(), SUPERBLOCK_SIZE_BYTES);
        if get_u64(b, 0) != SUPERBLOCK_MAGIC {
            return Ok(None);
        }
        let crc = get_u32(b, CRC_OFFSET);
        if crc != crc32c::crc32c(&b[..CRC_OFFSET]) {
            return Err(Error::Corruption("superblock checksum mismatch".into()));
        }
        let version = get_u32(b, 8);
        if !(FORMAT_VERSION_MIN..=FORMAT_VERSION).contains(&version) {
            return Err(Error::Corruption(format!(
                "superblock has format version {version}; this build reads versions {FORMAT_VERSION_MIN} to {FORMAT_VERSION}"
            )));
        }
        let block = get_u32(b, 32) as u64;
        let sector = get_u32(b, 36) as u64;
        if block != BLOCK_SIZE_BYTES || sector != SECTOR_SIZE_BYTES {
            return Err(Error::Corruption(format!(
                "superblock block/sector size {block}/{sector}; expected {BLOCK_SIZE_BYTES}/{SECTOR_SIZE_BYTES}"
            )));
        }
        let sb = Superblock {
            format_id: get_u64(b, 16),
            generation: get_u64(b, 24),
            segment_size_bytes: get_u32(b, 40),
            cache_size_bytes: get_u64(b, 48),
            segments_offset_bytes: get_u64(b, 56),
            segment_count: get_u64(b, 64),
            backing_size_bytes: get_u64(b, 72),
            backing_uuid: b[80..96].try_into().expect("16 bytes"),
            exported_size_bytes: get_u64(b, 96),
            format_time_unix_s: get_u64(b, 104),
            checkpoint: Checkpoint {
                flags: get_u32(b, 128),
                head_segment_id: get_u64(b, 136),
                head_seq: get_u64(b, 144),
                epoch: get_u64(b, 152),
                cut_seq: get_u64(b, 160),
                end_seq: get_u64(b, 168),
                writeback_seq: get_u64(b, 176),
                zero_applied_seq: get_u64(b, 184),
            },
            // Reserved (zero) before version 4: no checkpoints.
            bitmap_area_offset_bytes: get_u64(b, 192),
            checkpoint_slots: get_u32(b, 200),
            bitmap_pages_per_slot: get_u32(b, 204),
            tunables: PersistedTunables {
                present_mask: get_u32(b, TUNABLES_OFFSET),
                values: std::array::from_fn(|i| get_u64(b, TUNABLES_OFFSET + 8 + 8 * i)),
            },
        };
        sb.validate()?;
        Ok(Some(sb))
    }

    /// Checks the geometry is self-consistent, so later arithmetic cannot overflow or run off
    /// the device.
    pub fn validate(&self) -> Result<()> {
        let seg = self.segment_size_bytes as u64;
        let bad = |what: &str| Err(Error::Corruption(format!("superblock: {what}")));
        if !(SEGMENT_SIZE_MIN_BYTES..=SEGMENT_SIZE_MAX_BYTES).contains(&seg)
            || !seg.is_multiple_of(BLOCK_SIZE_BYTES)
        {
            return bad(&format!("segment size {seg} out of range"));
        }
        if self.segments_offset_bytes < SUPERBLOCK_REGION_BYTES
            || !self.segments_offset_bytes.is_multiple_of(BLOCK_SIZE_BYTES)
        {
            return bad("segments offset");
        }
        if self.segment_count < SEGMENT_COUNT_MIN {
            return bad("too few segments");
        }
        let end = self
            .segment_count
            .checked_mul(seg)
            .and_then(|v| v.checked_add(self.segments_offset_bytes));
        match end {
            Some(end) if end <= self.cache_size_bytes => {}
            _ => return bad("segments run past the cache size"),
        }
        if self.segment_count * (seg / BLOCK_SIZE_BYTES) >= u32::MAX as u64 {
            return bad("more cache blocks than 2^32-1");
        }
        if self.exported_size_bytes == 0
            || !self.exported_size_bytes.is_multiple_of(BLOCK_SIZE_BYTES)
            || self.exported_size_bytes > self.backing_size_bytes
        {
            return bad("exported size");
        }
        self.validate_checkpoint_area()?;
        let c = &self.checkpoint;
        if c.head_segment_id == 0 || c.head_seq == 0 {
            return bad("checkpoint head is zero");
        }
        if c.flags & CHECKPOINT_CLEAN != 0 && (c.end_seq < c.cut_seq || c.end_seq + 1 < c.head_seq)
        {
            return bad("checkpoint end before cut");
        }
        Ok(())
    }

    /// The bitmap area lies between the checkpoint table and the segments and fits the disk.
    fn validate_checkpoint_area(&self) -> Result<()> {
        use super::checkpoints::*;
        let (off, slots, pages) = (
            self.bitmap_area_offset_bytes,
            self.checkpoint_slots,
            self.bitmap_pages_per_slot,
        );
        if slots == 0 && off == 0 && pages == 0 {
            return Ok(());
        }
        let bad = |what: &str| {
            Err(Error::Corruption(format!(
                "superblock: checkpoint area {what}"
            )))
        };
        if slots == 0 || slots > CHECKPOINT_SLOTS_MAX {
            return bad(&format!("has {slots} slots (1 to {CHECKPOINT_SLOTS_MAX})"));
        }
        if pages != pages_per_slot(self.exported_size_bytes / BLOCK_SIZE_BYTES) {
            return bad("does not match the disk size");
        }
        if off < AREA_OFFSET_IN_REGION_BYTES
            || off % BLOCK_SIZE_BYTES != 0
            || off
                .checked_add(area_size_bytes(slots, pages))
                .is_none_or(|end| end > self.segments_offset_bytes)
        {
            return bad("overlaps the table or the segments");
        }
        Ok(())
    }

    /// Whether this cache was formatted with room for checkpoints.
    pub fn has_checkpoints(&self) -> bool {
        self.checkpoint_slots > 0
    }

    pub fn is_clean(&self) -> bool {
        self.checkpoint.flags & CHECKPOINT_CLEAN != 0
    }

    /// Which copy this generation is written to.
    pub fn copy_offset(generation: u64) -> u64 {
        SUPERBLOCK_OFFSETS[(generation % 2) as usize]
    }
}

/// Chooses between the two copies read from the device: the valid one with the highest
/// generation. Returns an error only when a copy is corrupt and no valid copy exists.
pub fn choose(copies: [&[u8]; 2]) -> Result<Option<Superblock>> {
    let mut best: Option<Superblock> = None;
    let mut first_err = None;
    for raw in copies {
        match Superblock::decode(raw) {
            Ok(Some(sb)) => {
                // A re-format writes a higher generation too, so the newest copy always wins.
                if best.as_ref().is_none_or(|b| sb.generation > b.generation) {
                    best = Some(sb);
                }
            }
            Ok(None) => {}
            Err(e) => first_err = first_err.or(Some(e)),
        }
    }
    match (best, first_err) {
        (Some(sb), _) => Ok(Some(sb)),
        (None, Some(e)) => Err(e),
        (None, None) => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample() -> Superblock {
        Superblock {
            format_id: 0x1234_5678_9abc_def0,
            generation: 7,
            segment_size_bytes: 1 << 20,
            cache_size_bytes: 64 << 20,
            segments_offset_bytes: SUPERBLOCK_REGION_BYTES,
            segment_count: 63,
            backing_size_bytes: 1 << 30,
            backing_uuid: [9; 16],
            exported_size_bytes: (1 << 30) - 4096,
            format_time_unix_s: 1_700_000_000,
            checkpoint: Checkpoint {
                flags: CHECKPOINT_CLEAN,
                head_segment_id: 3,
                head_seq: 10,
                epoch: 4,
                cut_seq: 12,
                end_seq: 20,
                writeback_seq: 0,
                zero_applied_seq: 7,
            },
            bitmap_area_offset_bytes: 16384,
            checkpoint_slots: 4,
            bitmap_pages_per_slot: 9,
            tunables: {
                let mut t = PersistedTunables::default();
                t.put(0, 500);
                t.put(5, 0);
                t
            },
        }
    }

    #[test]
    fn round_trip() {
        let sb = sample();
        let raw = sb.encode();
        assert_eq!(Superblock::decode(&raw).unwrap(), Some(sb));
    }

    #[test]
    fn every_covered_byte_is_checked() {
        let raw = sample().encode();
        for off in (0..CRC_OFFSET).step_by(61).chain([8, 16, 136, CRC_OFFSET]) {
            let mut bad = raw;
            bad[off] ^= 0x10;
            let r = Superblock::decode(&bad);
            if off < 8 {
                // A damaged magic reads as "no superblock".
                assert!(matches!(r, Ok(None)), "offset {off}");
            } else {
                assert!(
                    matches!(r, Err(Error::Corruption(_))),
                    "offset {off}: {r:?}"
                );
            }
        }
    }

    #[test]
    fn zeros_are_not_a_superblock() {
        assert_eq!(Superblock::decode(&[0u8; 4096]).unwrap(), None);
    }

    #[test]
    fn impossible_geometry_is_rejected() {
        let mut sb = sample();
        sb.segment_count = 1000; // 1000 MiB of segments on a 64 MiB device
        let raw = sb.encode();
        assert!(matches!(
            Superblock::decode(&raw),
            Err(Error::Corruption(_))
        ));
        let mut sb = sample();
        sb.segment_size_bytes = 4096;
        assert!(Superblock::decode(&sb.encode()).is_err());
    }

    #[test]
    fn newest_valid_copy_wins() {
        let a = sample();
        let mut b = sample();
        b.generation = 8;
        b.checkpoint.head_seq = 11;
        let (ra, rb) = (a.encode(), b.encode());
        assert_eq!(choose([&ra, &rb]).unwrap().unwrap().generation, 8);
        let mut torn = rb;
        torn[200] ^= 1;
        assert_eq!(choose([&ra, &torn]).unwrap().unwrap().generation, 7);
        let zero = [0u8; 4096];
        assert!(choose([&zero, &torn]).is_err());
        assert!(choose([&zero, &zero]).unwrap().is_none());
    }

    /// Version 1 and 2 caches open (v1 chunks carry no flags: one flush epoch; v2 lacks only
    /// the backing label's writeback record); an unknown version is refused with a message
    /// naming the versions this build reads.
    #[test]
    fn versions_1_and_2_are_read_and_later_versions_refused() {
        let with_version = |v: u32| {
            let mut b = sample().encode();
            put_u32(&mut b, 8, v);
            let crc = crc32c::crc32c(&b[..CRC_OFFSET]);
            put_u32(&mut b, CRC_OFFSET, crc);
            b
        };
        for v in [1, 2, 3] {
            assert_eq!(
                Superblock::decode(&with_version(v)).unwrap(),
                Some(sample())
            );
        }
        assert_eq!(get_u32(&sample().encode(), 8), FORMAT_VERSION);
        let err = Superblock::decode(&with_version(FORMAT_VERSION + 1))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("format version 5") && err.contains("1 to 4"),
            "{err}"
        );
    }
}
