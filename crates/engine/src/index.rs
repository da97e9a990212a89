//! The in-memory block index: backing-device block (`lba`, 4 KiB units) → cache block that holds
//! its newest copy, and cache block → lba.
//!
//! Two arrays, both allocated once in [`BlockIndex::new`]; nothing allocates afterwards:
//!
//! * `lba_of_block[block]` — the reverse map (`NO_LBA` = the block is unmapped), 8 bytes a block;
//! * `slots` — an open-addressing hash table of cache block numbers (`EMPTY` = free slot). A
//!   slot's key is not stored: it is `lba_of_block[slot]`, so each mapping costs one `u32` in the
//!   table. The table length is a power of two ≥ `block_count × 4/3`, so the load factor stays
//!   ≤ 0.75 even with every block mapped, and there is always at least one `EMPTY` slot.
//!
//! Probing is linear from `hash(lba) & mask`; deletion shifts later entries of the probe run
//! backwards (no tombstones), so probe runs never degrade however long the cache runs.
//!
//! Memory, worst case: the table has fewer than `2 × ⌈4n/3⌉` slots (just past a power of two), so
//! it costs < `8n/3 × 4 B + 8 B ≈ 10.7 B` a block; with the reverse map that is ≈ 18.7 B per cache
//! block (16 B for a single block), under the 24 B budget. See the `memory_budget` test.

/// "No block" as a raw value (e.g. in arrays kept by callers); the API itself returns `Option`.
pub const NO_BLOCK: u32 = u32::MAX;
/// Marks an unmapped cache block in the reverse map. `u64::MAX` is therefore not a valid lba.
pub const NO_LBA: u64 = u64::MAX;
/// A free slot of the hash table.
const EMPTY: u32 = u32::MAX;

/// The lba ↔ cache-block index. See the module documentation.
#[derive(Clone, Debug)]
pub struct BlockIndex {
    /// `lba_of_block[b]` is the lba cache block `b` holds, or `NO_LBA`.
    lba_of_block: Vec<u64>,
    /// Open-addressing table of cache block numbers, or `EMPTY`.
    slots: Vec<u32>,
    /// `slots.len() - 1` (the length is a power of two).
    mask: usize,
    /// Mapped lbas (= mapped blocks = occupied slots).
    len: usize,
}

/// The slot table's address and size, to hint a slot into the CPU cache from a thread that
/// does not hold the state lock (the write path, before it takes the lock). A prefetch reads
/// nothing the program sees and never faults: it needs no lock, and is at worst wasted.
#[derive(Clone, Copy, Debug)]
pub struct SlotHint {
    base_addr: usize,
    mask: usize,
}

impl SlotHint {
    /// Hints the slot `lookup(lba)` will probe first.
    #[inline]
    pub fn prefetch(self, lba: u64) {
        #[cfg(target_arch = "x86_64")]
        {
            let slot = (self.base_addr as *const u32).wrapping_add(mix(lba) as usize & self.mask);
            // SAFETY: a prefetch is only a hint: it never faults and loads nothing visible.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                    slot.cast::<i8>(),
                )
            };
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = lba;
    }
}

/// A strong 64-bit mix (the MurmurHash3 `fmix64` finalizer): every input bit affects every output
/// bit, so lbas that differ only in high bits or share their low bits still spread evenly.
#[inline]
fn mix(lba: u64) -> u64 {
    let mut h = lba;
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// Table length for `block_count` blocks: the smallest power of two ≥ `block_count × 4/3`
/// (at least 1). Always > `block_count`, so a probe always meets an `EMPTY` slot.
fn table_len(block_count: u32) -> usize {
    let want = (block_count as u64 * 4)
        .div_ceil(3)
        .max(1)
        .next_power_of_two();
    usize::try_from(want).expect("block index table does not fit in the address space")
}

impl BlockIndex {
    /// An empty index for `block_count` cache blocks (`block_count < u32::MAX`).
    pub fn new(block_count: u32) -> Self {
        assert!(block_count < u32::MAX, "block_count must be < u32::MAX");
        let n = table_len(block_count);
        BlockIndex {
            lba_of_block: vec![NO_LBA; block_count as usize],
            slots: vec![EMPTY; n],
            mask: n - 1,
            len: 0,
        }
    }

    /// Number of cache blocks this index covers.
    pub fn block_count(&self) -> u32 {
        self.lba_of_block.len() as u32
    }

    /// Number of mapped lbas (equivalently, mapped cache blocks).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Heap bytes of both arrays.
    pub fn memory_bytes(&self) -> usize {
        self.lba_of_block.capacity() * std::mem::size_of::<u64>()
            + self.slots.capacity() * std::mem::size_of::<u32>()
    }

    #[inline]
    fn home(&self, lba: u64) -> usize {
        mix(lba) as usize & self.mask
    }

    /// The slot position holding `lba`, if mapped.
    #[inline]
    fn find(&self, lba: u64) -> Option<usize> {
        let mut pos = self.home(lba);
        // Bounded: the table always has an EMPTY slot, so this returns within `slots.len()` steps.
        for _ in 0..self.slots.len() {
            let b = self.slots[pos];
            if b == EMPTY {
                return None;
            }
            if self.lba_of_block[b as usize] == lba {
                return Some(pos);
            }
            pos = (pos + 1) & self.mask;
        }
        unreachable!("block index probe found no EMPTY slot");
    }

    /// The cache block holding the newest copy of `lba`.
    #[inline]
    pub fn get(&self, lba: u64) -> Option<u32> {
        if lba == NO_LBA {
            return None;
        }
        self.find(lba).map(|pos| self.slots[pos])
    }

    /// The lba cache block `block` holds, if mapped.
    #[inline]
    pub fn lba_of(&self, block: u32) -> Option<u64> {
        match self.lba_of_block[block as usize] {
            NO_LBA => None,
            lba => Some(lba),
        }
    }

    /// Hints the CPU to load the table slot `lba` probes first. Recovery inserts millions of
    /// lbas into a table far larger than the CPU caches; issuing the load a few inserts ahead
    /// overlaps those cache misses instead of paying them one after another.
    #[inline]
    pub fn prefetch(&self, lba: u64) {
        #[cfg(target_arch = "x86_64")]
        {
            let slot: *const u32 = &self.slots[self.home(lba)];
            // SAFETY: a prefetch is only a hint; it never faults, and the pointer is in bounds.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                    slot.cast::<i8>(),
                )
            };
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = lba;
    }

    /// Where the slot table is, for [`SlotHint::prefetch`] without the state lock. The table
    /// is allocated once and never moves, so the hint stays right for the index's life.
    pub fn slot_hint(&self) -> SlotHint {
        SlotHint {
            base_addr: self.slots.as_ptr() as usize,
            mask: self.mask,
        }
    }

    /// Maps `lba` → `block`. `block` must be unmapped (panics otherwise). If `lba` was mapped to
    /// another block, that block becomes unmapped and is returned.
    pub fn insert(&mut self, lba: u64, block: u32) -> Option<u32> {
        assert!(lba != NO_LBA, "lba u64::MAX is not a valid lba");
        assert!(
            block < self.block_count(),
            "cache block {block} out of range (block_count {})",
            self.block_count()
        );
        assert_eq!(
            self.lba_of_block[block as usize], NO_LBA,
            "cache block {block} is already mapped"
        );
        let mut pos = self.home(lba);
        for _ in 0..self.slots.len() {
            let b = self.slots[pos];
            if b == EMPTY {
                // New mapping. `len < block_count < slots.len()` here, since `block` is free.
                self.slots[pos] = block;
                self.lba_of_block[block as usize] = lba;
                self.len += 1;
                return None;
            }
            if self.lba_of_block[b as usize] == lba {
                // Replace in place: the probe position depends on the lba only.
                self.slots[pos] = block;
                self.lba_of_block[b as usize] = NO_LBA;
                self.lba_of_block[block as usize] = lba;
                return Some(b);
            }
            pos = (pos + 1) & self.mask;
        }
        unreachable!("block index probe found no EMPTY slot");
    }

    /// Unmaps `lba`; returns the block that held it.
    pub fn remove(&mut self, lba: u64) -> Option<u32> {
        if lba == NO_LBA {
            return None;
        }
        let pos = self.find(lba)?;
        let block = self.slots[pos];
        self.lba_of_block[block as usize] = NO_LBA;
        self.delete_at(pos);
        Some(block)
    }

    /// Unmaps cache block `block` if it is mapped; returns the lba it held.
    pub fn remove_block(&mut self, block: u32) -> Option<u64> {
        let lba = self.lba_of(block)?;
        let pos = self
            .find(lba)
            .expect("block index: mapped block missing from the table");
        debug_assert_eq!(self.slots[pos], block);
        self.lba_of_block[block as usize] = NO_LBA;
        self.delete_at(pos);
        Some(lba)
    }

    /// Empties slot `hole` and closes the gap by backward shift: each later entry of the probe run
    /// whose home position does not lie cyclically in `(hole, pos]` moves into the hole.
    fn delete_at(&mut self, mut hole: usize) {
        let mask = self.mask;
        let mut pos = hole;
        for _ in 0..self.slots.len() {
            pos = (pos + 1) & mask;
            let b = self.slots[pos];
            if b == EMPTY {
                self.slots[hole] = EMPTY;
                self.len -= 1;
                return;
            }
            let home = self.home(self.lba_of_block[b as usize]);
            // The entry may move back to `hole` iff it is at least as far from home as `hole` is
            // from `pos`, i.e. its home is not strictly after the hole.
            if (pos.wrapping_sub(home) & mask) >= (pos.wrapping_sub(hole) & mask) {
                self.slots[hole] = b;
                hole = pos;
            }
        }
        unreachable!("block index probe found no EMPTY slot");
    }

    /// Unmaps everything (O(block_count); no allocation).
    pub fn clear(&mut self) {
        self.lba_of_block.fill(NO_LBA);
        self.slots.fill(EMPTY);
        self.len = 0;
    }

    /// All `(lba, block)` mappings, in cache-block order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.lba_of_block
            .iter()
            .enumerate()
            .filter(|&(_, &lba)| lba != NO_LBA)
            .map(|(b, &lba)| (lba, b as u32))
    }

    /// Verifies every structural invariant, panicking with a description on the first violation.
    /// O(table length); meant for tests and debug checks, not the hot path (it allocates).
    pub fn check_invariants(&self) {
        let n = self.slots.len();
        assert!(
            n.is_power_of_two() && self.mask == n - 1,
            "bad table length"
        );
        assert!(
            n > self.lba_of_block.len(),
            "table not larger than block_count"
        );
        let mut seen = vec![false; self.lba_of_block.len()];
        let mut occupied = 0;
        for (pos, &b) in self.slots.iter().enumerate() {
            if b == EMPTY {
                continue;
            }
            occupied += 1;
            let bi = b as usize;
            assert!(bi < seen.len(), "slot {pos} holds out-of-range block {b}");
            assert!(!seen[bi], "block {b} is in more than one slot");
            seen[bi] = true;
            assert!(
                self.lba_of_block[bi] != NO_LBA,
                "slot {pos} holds unmapped block {b}"
            );
        }
        assert_eq!(occupied, self.len, "occupied slots != len");
        let mut mapped = 0;
        for (b, &lba) in self.lba_of_block.iter().enumerate() {
            if lba != NO_LBA {
                mapped += 1;
                assert!(seen[b], "mapped block {b} (lba {lba}) is in no slot");
                assert_eq!(self.get(lba), Some(b as u32), "get({lba}) misses block {b}");
            }
        }
        assert_eq!(mapped, self.len, "mapped blocks != len");
        // Reachability: walking forwards from just after an EMPTY slot, `run` counts the occupied
        // slots since the last EMPTY; an entry at distance `d` from its home is reachable without
        // crossing an EMPTY iff `d <= run`.
        let start = self
            .slots
            .iter()
            .position(|&b| b == EMPTY)
            .expect("table has no EMPTY slot");
        let mut run = 0;
        for i in 1..=n {
            let pos = (start + i) & self.mask;
            let b = self.slots[pos];
            if b == EMPTY {
                run = 0;
                continue;
            }
            let lba = self.lba_of_block[b as usize];
            let dist = pos.wrapping_sub(self.home(lba)) & self.mask;
            assert!(
                dist <= run,
                "slot {pos} (lba {lba}) is {dist} from home but the run before it is only {run}"
            );
            run += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use logcache_testkit::rng::{seed_from_env, Rng};
    use std::collections::HashMap;

    fn seed() -> u64 {
        seed_from_env("LOGCACHE_SEED")
    }

    /// Compares the index with the model in full.
    fn check_against(ix: &BlockIndex, model: &HashMap<u64, u32>, seed: u64) {
        ix.check_invariants();
        assert_eq!(ix.len(), model.len(), "seed {seed}");
        for (&lba, &b) in model {
            assert_eq!(ix.get(lba), Some(b), "seed {seed}: get({lba})");
            assert_eq!(ix.lba_of(b), Some(lba), "seed {seed}: lba_of({b})");
        }
        assert_eq!(ix.iter().count(), model.len(), "seed {seed}");
        for (lba, b) in ix.iter() {
            assert_eq!(model.get(&lba), Some(&b), "seed {seed}: iter ({lba}, {b})");
        }
    }

    fn random_ops(block_count: u32, ops: usize, seed: u64) {
        let mut rng = Rng::new(seed ^ block_count as u64);
        let mut ix = BlockIndex::new(block_count);
        let mut model: HashMap<u64, u32> = HashMap::new();
        let mut free: Vec<u32> = (0..block_count).collect();
        // A small lba domain gives many hits and replacements; a few far-away lbas too.
        let domain = block_count as u64 * 2 + 2;
        let pick_lba = |rng: &mut Rng| {
            if rng.chance(1, 20) {
                rng.range(1 << 40, u64::MAX - 1)
            } else {
                rng.below(domain)
            }
        };
        let check_every = (ops / 50).max(1);
        for op in 0..ops {
            match rng.below(10) {
                0..=4 => {
                    if free.is_empty() {
                        // Evict a random block, as the engine does when the cache is full.
                        let b = rng.below(block_count as u64) as u32;
                        let lba = ix.remove_block(b).expect("full cache: every block mapped");
                        assert_eq!(model.remove(&lba), Some(b), "seed {seed} op {op}");
                        free.push(b);
                    }
                    let block = free.swap_remove(rng.below(free.len() as u64) as usize);
                    let lba = pick_lba(&mut rng);
                    let old = ix.insert(lba, block);
                    assert_eq!(old, model.insert(lba, block), "seed {seed} op {op}: insert");
                    if let Some(old) = old {
                        assert_eq!(ix.lba_of(old), None, "seed {seed} op {op}");
                        free.push(old);
                    }
                }
                5 | 6 => {
                    let lba = pick_lba(&mut rng);
                    let got = ix.remove(lba);
                    assert_eq!(got, model.remove(&lba), "seed {seed} op {op}: remove");
                    free.extend(got);
                }
                7 => {
                    let b = rng.below(block_count as u64) as u32;
                    let expect = ix.lba_of(b);
                    let got = ix.remove_block(b);
                    assert_eq!(got, expect, "seed {seed} op {op}: remove_block");
                    if let Some(lba) = got {
                        assert_eq!(model.remove(&lba), Some(b), "seed {seed} op {op}");
                        free.push(b);
                    }
                }
                _ => {
                    let lba = pick_lba(&mut rng);
                    assert_eq!(ix.get(lba), model.get(&lba).copied(), "seed {seed} op {op}");
                }
            }
            assert_eq!(
                ix.len() + free.len(),
                block_count as usize,
                "seed {seed} op {op}"
            );
            if op % check_every == 0 {
                check_against(&ix, &model, seed);
            }
        }
        check_against(&ix, &model, seed);
        let before = ix.memory_bytes();
        ix.clear();
        assert!(ix.is_empty() && ix.iter().next().is_none(), "seed {seed}");
        assert_eq!(ix.memory_bytes(), before);
        ix.check_invariants();
    }

    #[test]
    fn random_against_hashmap_small() {
        let seed = seed();
        for bc in [1, 2, 3, 7, 64] {
            random_ops(bc, 20_000, seed);
        }
    }

    #[test]
    fn random_against_hashmap_large() {
        let seed = seed();
        random_ops(100_000, 300_000, seed);
    }

    #[test]
    fn full_table_then_remove_all() {
        let seed = seed();
        for bc in [1u32, 2, 3, 4, 1000, 4096, 4097] {
            let mut rng = Rng::new(seed ^ bc as u64);
            let mut ix = BlockIndex::new(bc);
            let mut lbas = Vec::new();
            for b in 0..bc {
                // Distinct lbas: a random high part plus the block number.
                let lba = (rng.below(1 << 30) << 32) | b as u64;
                assert_eq!(ix.insert(lba, b), None, "seed {seed}");
                lbas.push(lba);
            }
            assert_eq!(ix.len(), bc as usize);
            ix.check_invariants();
            for (b, &lba) in lbas.iter().enumerate() {
                assert_eq!(ix.get(lba), Some(b as u32), "seed {seed} bc {bc}");
            }
            assert_eq!(ix.get(u64::MAX - 1), None);
            for (b, &lba) in lbas.iter().enumerate() {
                if b % 2 == 0 {
                    assert_eq!(ix.remove(lba), Some(b as u32), "seed {seed} bc {bc}");
                } else {
                    assert_eq!(ix.remove_block(b as u32), Some(lba), "seed {seed} bc {bc}");
                }
                if b % 97 == 0 {
                    ix.check_invariants();
                }
            }
            assert!(ix.is_empty());
            assert!(ix.slots.iter().all(|&s| s == EMPTY), "seed {seed} bc {bc}");
            ix.check_invariants();
        }
    }

    #[test]
    fn replace_returns_old_block() {
        let mut ix = BlockIndex::new(4);
        assert_eq!(ix.insert(10, 0), None);
        assert_eq!(ix.insert(10, 1), Some(0));
        assert_eq!(ix.lba_of(0), None);
        assert_eq!(ix.lba_of(1), Some(10));
        assert_eq!(ix.get(10), Some(1));
        assert_eq!(ix.len(), 1);
        assert_eq!(ix.insert(10, 0), Some(1));
        assert_eq!(ix.remove(10), Some(0));
        assert_eq!(ix.remove(10), None);
        assert_eq!(ix.remove_block(0), None);
        assert_eq!(ix.get(NO_LBA), None);
        assert_eq!(ix.remove(NO_LBA), None);
        ix.check_invariants();
    }

    #[test]
    #[should_panic(expected = "already mapped")]
    fn insert_into_mapped_block_panics() {
        let mut ix = BlockIndex::new(4);
        ix.insert(1, 2);
        ix.insert(5, 2);
    }

    #[test]
    #[should_panic(expected = "not a valid lba")]
    fn insert_invalid_lba_panics() {
        BlockIndex::new(4).insert(NO_LBA, 0);
    }

    #[test]
    #[should_panic(expected = "out of range")]
    fn insert_block_out_of_range_panics() {
        BlockIndex::new(4).insert(1, 4);
    }

    #[test]
    fn zero_blocks() {
        let ix = BlockIndex::new(0);
        assert_eq!(ix.get(0), None);
        assert!(ix.is_empty());
        ix.check_invariants();
    }

    #[test]
    fn memory_budget() {
        // Worst case ≈ 8 + 32/3 ≈ 18.7 B per block (table just past a power of two), see module docs.
        for bc in [1u32, 2, 3, 1000, 3072, 3073, 4096, 4097, 262_144, 1_000_000] {
            let ix = BlockIndex::new(bc);
            let per_block = ix.memory_bytes() as f64 / bc as f64;
            assert!(per_block <= 24.0, "{bc} blocks: {per_block} B per block");
            // Load factor ≤ 0.75 with every block mapped.
            assert!(bc as usize * 4 <= ix.slots.len() * 3, "{bc} blocks");
        }
    }

    #[test]
    fn colliding_lbas() {
        let seed = seed();
        let mut rng = Rng::new(seed);
        // Same low 32 bits, different high bits: the mix must still spread them.
        let mut ix = BlockIndex::new(4096);
        for b in 0..4096u32 {
            assert_eq!(ix.insert(((b as u64) << 32) | 0xabcd, b), None);
        }
        ix.check_invariants();
        for b in 0..4096u32 {
            assert_eq!(ix.get(((b as u64) << 32) | 0xabcd), Some(b));
        }
        // True collisions: lbas that all hash to the last slot, so their run wraps past the end.
        for bc in [3u32, 7, 64, 1000] {
            let mut ix = BlockIndex::new(bc);
            let mask = ix.mask;
            let want = bc.min(40) as usize;
            let mut lbas: Vec<u64> = (0..u64::MAX)
                .filter(|&lba| mix(lba) as usize & mask == mask)
                .take(want)
                .collect();
            for (b, &lba) in lbas.iter().enumerate() {
                assert_eq!(ix.insert(lba, b as u32), None, "seed {seed} bc {bc}");
                ix.check_invariants();
            }
            for (b, &lba) in lbas.iter().enumerate() {
                assert_eq!(ix.get(lba), Some(b as u32), "seed {seed} bc {bc}");
            }
            // Remove in random order, re-checking the backward shift each time.
            for i in (1..lbas.len()).rev() {
                lbas.swap(i, rng.below(i as u64 + 1) as usize);
            }
            for (i, &lba) in lbas.iter().enumerate() {
                assert!(ix.remove(lba).is_some(), "seed {seed} bc {bc}");
                ix.check_invariants();
                for &rest in &lbas[i + 1..] {
                    assert!(ix.get(rest).is_some(), "seed {seed} bc {bc}: lost {rest}");
                }
            }
            assert!(ix.is_empty());
        }
    }
}
