//! Address arithmetic of a formatted cache: segment ids ↔ slots ↔ cache blocks ↔ byte offsets.

use crate::format::superblock::Superblock;
use crate::format::{crc_block, BLOCK_SIZE_BYTES};

/// Cache block numbers: `slot * blocks_per_segment + block_in_segment`.
pub type CacheBlock = u32;

#[derive(Clone, Debug)]
pub struct Geometry {
    pub format_id: u64,
    pub segment_size_bytes: u64,
    pub blocks_per_segment: u32,
    pub segment_count: u64,
    pub segments_offset_bytes: u64,
    pub exported_size_bytes: u64,
    pub exported_block_count: u64,
}

impl Geometry {
    pub fn from_superblock(sb: &Superblock) -> Geometry {
        let blocks_per_segment = (sb.segment_size_bytes as u64 / BLOCK_SIZE_BYTES) as u32;
        Geometry {
            format_id: sb.format_id,
            segment_size_bytes: sb.segment_size_bytes as u64,
            blocks_per_segment,
            segment_count: sb.segment_count,
            segments_offset_bytes: sb.segments_offset_bytes,
            exported_size_bytes: sb.exported_size_bytes,
            exported_block_count: sb.exported_size_bytes / BLOCK_SIZE_BYTES,
        }
    }

    /// The ring slot a segment id occupies.
    pub fn slot_of(&self, segment_id: u64) -> u32 {
        (segment_id % self.segment_count) as u32
    }

    pub fn cache_block_count(&self) -> u32 {
        (self.segment_count * self.blocks_per_segment as u64) as u32
    }

    pub fn cache_block(&self, slot: u32, block_in_segment: u32) -> CacheBlock {
        debug_assert!(block_in_segment < self.blocks_per_segment);
        debug_assert!((slot as u64) < self.segment_count);
        slot * self.blocks_per_segment + block_in_segment
    }

    /// (slot, block within segment) of a cache block.
    pub fn split(&self, c: CacheBlock) -> (u32, u32) {
        (c / self.blocks_per_segment, c % self.blocks_per_segment)
    }

    /// Byte offset of block `block_in_segment` of `slot` on the cache device.
    pub fn offset_of(&self, slot: u32, block_in_segment: u32) -> u64 {
        self.segments_offset_bytes
            + slot as u64 * self.segment_size_bytes
            + block_in_segment as u64 * BLOCK_SIZE_BYTES
    }

    pub fn block_offset(&self, c: CacheBlock) -> u64 {
        let (slot, b) = self.split(c);
        self.offset_of(slot, b)
    }

    /// The data CRC of one block of backing block `lba` (the format id and the address are
    /// mixed in, so a block of another cache or another address never verifies).
    pub fn block_crc(&self, lba: u64, data: &[u8]) -> u32 {
        debug_assert_eq!(data.len() as u64, BLOCK_SIZE_BYTES);
        crc_block(self.format_id, lba, data)
    }

    /// Whether `data`, read back as backing block `lba`, matches the CRC its entry recorded:
    /// the one data-CRC check of reads, writeback, the relocator and recovery.
    pub fn block_verifies(&self, lba: u64, data: &[u8], crc: u32) -> bool {
        self.block_crc(lba, data) == crc
    }
}

/// The mask of `count` sectors starting at sector `first` of a block.
pub fn sector_mask(first: usize, count: usize) -> u8 {
    debug_assert!(first + count <= 8 && count > 0);
    (((1u16 << count) - 1) << first) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks() {
        assert_eq!(sector_mask(0, 8), 0xFF);
        assert_eq!(sector_mask(0, 1), 0x01);
        assert_eq!(sector_mask(7, 1), 0x80);
        assert_eq!(sector_mask(2, 3), 0b0001_1100);
    }
}
