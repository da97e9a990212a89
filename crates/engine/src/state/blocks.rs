//! Per cache block: which backing block it holds (the index, both ways), which sectors are
//! valid and dirty, and its data CRC; and the count of dirty blocks, kept in step with the
//! masks. Per-segment counts are the ring's (`State::set_dirty_mask` keeps both).
//!
//! Shadows: with `writeback_order = consistent`, a dirty copy replaced by a write of a later
//! flush epoch leaves the index but stays dirty and live in its segment, so writeback can still
//! write it back in its own epoch. Reads never see it.

use std::collections::HashMap;

use crate::geometry::CacheBlock;
use crate::index::BlockIndex;

pub struct Blocks {
    index: BlockIndex,
    /// Per cache block: sectors not yet on the backing device.
    dirty_mask: Vec<u8>,
    /// Per cache block: sectors whose data the block holds.
    valid_mask: Vec<u8>,
    /// Per cache block: CRC of its data, valid once its chunk is written.
    data_crc: Vec<u32>,
    /// Blocks with at least one dirty sector.
    dirty_blocks: u64,
    /// Shadow cache blocks and the backing block each holds an older copy of.
    shadows: HashMap<CacheBlock, u64>,
}

impl Blocks {
    /// Takes the tables recovery rebuilt; `dirty_blocks` must agree with `dirty_mask`.
    pub fn new(
        index: BlockIndex,
        dirty_mask: Vec<u8>,
        valid_mask: Vec<u8>,
        data_crc: Vec<u32>,
        dirty_blocks: u64,
        shadows: impl IntoIterator<Item = (CacheBlock, u64)>,
    ) -> Blocks {
        let n = index.block_count() as usize;
        assert!(dirty_mask.len() == n && valid_mask.len() == n && data_crc.len() == n);
        let mut b = Blocks {
            index,
            dirty_mask,
            valid_mask,
            data_crc,
            dirty_blocks,
            shadows: HashMap::new(),
        };
        for (c, lba) in shadows {
            b.add_shadow(c, lba);
        }
        b.debug_check();
        b
    }

    /// The cache block holding the newest copy of `lba`, if cached.
    #[inline]
    pub fn lookup(&self, lba: u64) -> Option<CacheBlock> {
        self.index.get(lba)
    }

    /// Hints the CPU to load the index slot `lookup(lba)` will probe first (a hint only).
    #[inline]
    pub fn prefetch(&self, lba: u64) {
        self.index.prefetch(lba);
    }

    /// The index's slot table, for hints made without the state lock (`SlotHint`).
    pub fn slot_hint(&self) -> crate::index::SlotHint {
        self.index.slot_hint()
    }

    #[inline]
    pub fn lba_of(&self, c: CacheBlock) -> Option<u64> {
        self.index.lba_of(c)
    }

    /// Maps `lba` to `c`; returns the block it replaces (the caller kills it).
    pub fn insert(&mut self, lba: u64, c: CacheBlock) -> Option<CacheBlock> {
        let prev = self.index.insert(lba, c);
        debug_assert_ne!(prev, Some(c), "a block mapped twice");
        prev
    }

    pub fn remove(&mut self, lba: u64) -> Option<CacheBlock> {
        self.index.remove(lba)
    }

    pub fn remove_block(&mut self, c: CacheBlock) -> Option<u64> {
        self.index.remove_block(c)
    }

    pub fn block_count(&self) -> u32 {
        self.index.block_count()
    }

    /// Blocks the index maps.
    pub fn cached_blocks(&self) -> u64 {
        self.index.len() as u64
    }

    /// Blocks with at least one dirty sector.
    #[inline]
    pub fn dirty_blocks(&self) -> u64 {
        self.dirty_blocks
    }

    #[inline]
    pub fn dirty(&self, c: CacheBlock) -> u8 {
        self.dirty_mask[c as usize]
    }

    #[inline]
    pub fn valid(&self, c: CacheBlock) -> u8 {
        self.valid_mask[c as usize]
    }

    #[inline]
    pub fn crc(&self, c: CacheBlock) -> u32 {
        self.data_crc[c as usize]
    }

    /// The flusher computed `c`'s data CRC as its chunk went out.
    pub fn set_crc(&mut self, c: CacheBlock, crc: u32) {
        self.data_crc[c as usize] = crc;
    }

    #[inline]
    pub fn set_valid(&mut self, c: CacheBlock, mask: u8) {
        self.valid_mask[c as usize] = mask;
    }

    #[inline]
    pub fn add_valid(&mut self, c: CacheBlock, mask: u8) {
        self.valid_mask[c as usize] |= mask;
    }

    /// Sets `c`'s dirty sectors, keeping the dirty block count in step. Returns whether the
    /// block was dirty before and is now, for the segment's count. Dirty sectors are valid.
    #[inline]
    pub fn set_dirty(&mut self, c: CacheBlock, mask: u8) -> (bool, bool) {
        let old = std::mem::replace(&mut self.dirty_mask[c as usize], mask);
        match (old != 0, mask != 0) {
            (false, true) => self.dirty_blocks += 1,
            (true, false) => {
                assert!(self.dirty_blocks > 0, "dirty block count underflow");
                self.dirty_blocks -= 1;
            }
            _ => {}
        }
        (old != 0, mask != 0)
    }

    /// `c`, just removed from the index, keeps its dirty copy of `lba` for writeback.
    pub fn add_shadow(&mut self, c: CacheBlock, lba: u64) {
        assert!(
            self.index.lba_of(c).is_none(),
            "a shadow is not in the index"
        );
        assert_ne!(self.dirty_mask[c as usize], 0, "a shadow is dirty");
        let prev = self.shadows.insert(c, lba);
        assert!(prev.is_none(), "cache block {c} shadowed twice");
    }

    /// The backing block shadow `c` holds an older copy of, if `c` is a shadow.
    #[inline]
    pub fn shadow_lba(&self, c: CacheBlock) -> Option<u64> {
        if self.shadows.is_empty() {
            return None;
        }
        self.shadows.get(&c).copied()
    }

    /// The backing block a dirty block is for: the index's, or the shadow's.
    #[inline]
    pub fn dirty_lba(&self, c: CacheBlock) -> Option<u64> {
        self.index.lba_of(c).or_else(|| self.shadow_lba(c))
    }

    pub fn shadow_count(&self) -> u64 {
        self.shadows.len() as u64
    }

    /// Forgets shadow `c` (written back, or dropped by recovery); the caller clears its masks.
    pub fn remove_shadow(&mut self, c: CacheBlock) -> u64 {
        self.shadows
            .remove(&c)
            .expect("removing a block that is no shadow")
    }

    /// Memory the tables take, for statistics.
    pub fn memory_bytes(&self) -> u64 {
        (self.index.memory_bytes()
            + self.dirty_mask.len()
            + self.valid_mask.len()
            + self.data_crc.len() * 4
            + self.shadows.len() * 32) as u64
    }

    /// O(n) check that the dirty count agrees with the masks and that only mapped blocks are
    /// dirty (debug builds only).
    pub fn debug_check(&self) {
        if cfg!(debug_assertions) {
            let dirty = self.dirty_mask.iter().filter(|&&m| m != 0).count() as u64;
            assert_eq!(
                dirty, self.dirty_blocks,
                "dirty block count disagrees with the masks"
            );
            for (c, &m) in self.dirty_mask.iter().enumerate() {
                assert!(
                    m == 0 || self.dirty_lba(c as CacheBlock).is_some(),
                    "cache block {c} is dirty but neither mapped nor a shadow"
                );
            }
        }
    }
}
