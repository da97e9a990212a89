//! The sectors whose newest data was lost with the cache device (issue 25): taken from the RAM
//! index when the cache device failed with dirty data, while the engine goes on from the
//! backing device alone (`path::alone`). Reads touching one fail with EIO, never with the
//! backing device's older bytes; a write or write-zeroes of a sector makes it current again
//! (sector granularity, so a partial overwrite of a lost block leaves the rest of it lost);
//! TRIM does not (it promises no data, and the older bytes are not what was last written).
//!
//! A lost sector whose copy was not yet durable on the cache device (a write acknowledged but
//! never flushed) is also "unflushed": while any is left, a FLUSH fails, since the writes it
//! covers are not all durable (and never will be).
//!
//! A write-zeroes under way when the cache device failed makes its blocks lost too, until it
//! is tried again here (its logged range may have dropped their newest copies).
//!
//! Used only once serving from the backing device alone; its own mutex, never the state lock.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::sync::Mutex;

use crate::format::{SECTORS_PER_BLOCK, SECTOR_SIZE_BYTES};
use crate::state::State;

/// Per backing block: the lost sectors, and those of them never made durable (bit i: sector i).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sectors {
    pub lost: u8,
    pub unflushed: u8,
}

#[derive(Default)]
pub struct Lost {
    blocks: Mutex<HashMap<u64, Sectors>>,
    /// Sectors still lost (a fast "none" for reads once the map is empty).
    lost_sectors: AtomicU64,
    unflushed_sectors: AtomicU64,
    /// Sectors lost when the cache device failed.
    at_failure_sectors: AtomicU64,
    /// The runs lost when the cache device failed (tests: after a power cut those sectors
    /// may hold older data even once written again, if that write was never flushed).
    at_failure_runs: Mutex<Vec<(u64, u64)>>,
    /// Writes sent alone so far, and how many of them a successful backing sync covers.
    written_gen: AtomicU64,
    synced_gen: AtomicU64,
    /// A backing sync failed with writes sent alone not covered by an earlier one: they may be
    /// gone (a later sync does not vouch for them), and no copy of them is left, so every
    /// later flush fails (issue 20's rule for writes that bypass the cache).
    sync_lost: AtomicBool,
    /// The backing device's failed syncs (`Backing::failed_syncs`) noted here so far: a
    /// success that finds more counts as the failure its thread has not noted yet.
    failed_noted: AtomicU64,
}

/// The dirty sectors of the index (and of shadows, older flush epochs' dirty copies that the
/// newer copy does not replace with a clean sector) under the state lock: the only copy of
/// their newest data was in the cache. A copy is durable if its block lies below its segment's
/// synced blocks.
pub fn collect(geo: &crate::geometry::Geometry, st: &State) -> HashMap<u64, Sectors> {
    let mut out: HashMap<u64, Sectors> = HashMap::new();
    // A write-zeroes under way may have dropped the newest (dirty) copies of its blocks with
    // its logged range while the backing device still holds older data there: lost until the
    // request, tried again from the backing device alone, writes its zeros.
    for &(first, end) in st.bypass.zeroing_ranges() {
        for lba in first..end {
            out.entry(lba).or_default().lost = crate::format::FULL_MASK;
        }
    }
    if st.blocks.dirty_blocks() == 0 && st.blocks.shadow_count() == 0 {
        return out;
    }
    for c in 0..geo.cache_block_count() {
        let dirty = st.blocks.dirty(c);
        if dirty == 0 {
            continue;
        }
        let Some(lba) = st.blocks.dirty_lba(c) else {
            continue;
        };
        let newer = st.blocks.lookup(lba).filter(|&n| n != c);
        // A shadow's sector replaced by a newer copy that is clean there is on the backing
        // device already (flush-epoch order writes the older epoch back first).
        let replaced = newer.map_or(0, |n| st.blocks.valid(n) & !st.blocks.dirty(n));
        let lost = dirty & !replaced;
        if lost == 0 {
            continue;
        }
        let (slot, b) = geo.split(c);
        let durable = b < st.ring.segment(slot).synced_blocks;
        let e = out.entry(lba).or_default();
        e.lost |= lost;
        if !durable {
            e.unflushed |= lost;
        }
    }
    out
}

impl Lost {
    /// The set taken at the failure (before serving from the backing device alone).
    pub fn install(&self, blocks: HashMap<u64, Sectors>) {
        let lost: u64 = blocks.values().map(|s| s.lost.count_ones() as u64).sum();
        let unflushed: u64 = blocks
            .values()
            .map(|s| s.unflushed.count_ones() as u64)
            .sum();
        let mut map = self.blocks.lock();
        assert!(map.is_empty(), "the lost set is taken once");
        *map = blocks;
        self.lost_sectors.store(lost, Ordering::Release);
        self.unflushed_sectors.store(unflushed, Ordering::Release);
        self.at_failure_sectors.store(lost, Ordering::Release);
        drop(map);
        *self.at_failure_runs.lock() = self.runs();
    }

    pub fn at_failure_runs(&self) -> Vec<(u64, u64)> {
        self.at_failure_runs.lock().clone()
    }

    pub fn lost_bytes(&self) -> u64 {
        self.lost_sectors.load(Ordering::Acquire) * SECTOR_SIZE_BYTES
    }

    /// A write, write-zeroes or discard reached the backing device alone.
    pub fn note_written(&self) {
        self.written_gen.fetch_add(1, Ordering::AcqRel);
    }

    /// The generation a backing sync started now covers.
    pub fn sync_target(&self) -> u64 {
        self.written_gen.load(Ordering::Acquire)
    }

    /// A backing sync that started at `target` returned `ok`; `failed_syncs` is the backing
    /// device's count of failed syncs now. A success that finds a failure not noted here yet
    /// (a sync in flight beside it failed, and its thread is on its way) counts as that
    /// failure: noted first, it moved `synced_gen` over writes the failed sync had dropped,
    /// and the failure then found them covered (`backing.rs`).
    pub fn note_synced(&self, target: u64, ok: bool, failed_syncs: u64) {
        if ok && failed_syncs <= self.failed_noted.load(Ordering::Acquire) {
            self.synced_gen.fetch_max(target, Ordering::AcqRel);
            return;
        }
        if self.written_gen.load(Ordering::Acquire) > self.synced_gen.load(Ordering::Acquire) {
            self.sync_lost.store(true, Ordering::Release);
        }
        self.failed_noted.fetch_max(failed_syncs, Ordering::AcqRel);
    }

    /// At the switch: bypass writes of the cached engine a failed sync may have lost
    /// (`lost`), or not yet synced (`unsynced`: a failed sync from now on may lose them);
    /// `failed_syncs`, the backing device's failed syncs the cached engine accounted for.
    pub fn carry_bypass(&self, lost: bool, unsynced: bool, failed_syncs: u64) {
        self.failed_noted.fetch_max(failed_syncs, Ordering::AcqRel);
        if lost {
            self.sync_lost.store(true, Ordering::Release);
        }
        if unsynced {
            self.note_written();
        }
    }

    /// Whether a failed backing sync may have lost writes sent alone (see `sync_lost`).
    pub fn sync_lost(&self) -> bool {
        self.sync_lost.load(Ordering::Acquire)
    }

    pub fn unflushed_bytes(&self) -> u64 {
        self.unflushed_sectors.load(Ordering::Acquire) * SECTOR_SIZE_BYTES
    }

    pub fn at_failure_bytes(&self) -> u64 {
        self.at_failure_sectors.load(Ordering::Acquire) * SECTOR_SIZE_BYTES
    }

    /// The first lost sector of `count` sectors from `first`, if any.
    pub fn first_in(&self, first: u64, count: u64) -> Option<u64> {
        if self.lost_sectors.load(Ordering::Acquire) == 0 || count == 0 {
            return None;
        }
        let map = self.blocks.lock();
        let end = first + count;
        let mut b = first / SECTORS_PER_BLOCK;
        while b * SECTORS_PER_BLOCK < end {
            if let Some(s) = map.get(&b) {
                let lo = first.max(b * SECTORS_PER_BLOCK) - b * SECTORS_PER_BLOCK;
                let hi = end.min((b + 1) * SECTORS_PER_BLOCK) - b * SECTORS_PER_BLOCK;
                let want = crate::geometry::sector_mask(lo as usize, (hi - lo) as usize);
                if s.lost & want != 0 {
                    return Some(b * SECTORS_PER_BLOCK + (s.lost & want).trailing_zeros() as u64);
                }
            }
            b += 1;
        }
        None
    }

    /// Sectors `first..first + count` were still in RAM at the failure and are now on the
    /// backing device, synced (`path::in_ram`, before serving alone): not lost. Once a set of
    /// them is done, `found_at_failure` stops counting them as lost at the failure too.
    pub fn found_in_ram(&self, first: u64, count: u64) {
        self.overwritten(first, count);
    }

    /// What is lost now is what was lost at the failure: called while nothing but
    /// `found_in_ram` has changed the set (the switch, before serving alone).
    pub fn found_at_failure(&self) {
        self.at_failure_sectors
            .store(self.lost_sectors.load(Ordering::Acquire), Ordering::Release);
        *self.at_failure_runs.lock() = self.runs();
    }

    /// `count` sectors from `first` hold newly written data (on the backing device): no longer
    /// lost.
    pub fn overwritten(&self, first: u64, count: u64) {
        if self.lost_sectors.load(Ordering::Acquire) == 0 || count == 0 {
            return;
        }
        let mut map = self.blocks.lock();
        let end = first + count;
        let mut b = first / SECTORS_PER_BLOCK;
        let (mut lost, mut unflushed) = (0u64, 0u64);
        while b * SECTORS_PER_BLOCK < end {
            if let Some(s) = map.get_mut(&b) {
                let lo = first.max(b * SECTORS_PER_BLOCK) - b * SECTORS_PER_BLOCK;
                let hi = end.min((b + 1) * SECTORS_PER_BLOCK) - b * SECTORS_PER_BLOCK;
                let now = crate::geometry::sector_mask(lo as usize, (hi - lo) as usize);
                lost += (s.lost & now).count_ones() as u64;
                unflushed += (s.unflushed & now).count_ones() as u64;
                s.lost &= !now;
                s.unflushed &= !now;
                debug_assert_eq!(s.unflushed & !s.lost, 0, "unflushed sectors are lost ones");
                if s.lost == 0 {
                    map.remove(&b);
                }
            }
            b += 1;
        }
        self.lost_sectors.fetch_sub(lost, Ordering::AcqRel);
        self.unflushed_sectors
            .fetch_sub(unflushed, Ordering::AcqRel);
        debug_assert_eq!(
            map.values()
                .map(|s| s.lost.count_ones() as u64)
                .sum::<u64>(),
            self.lost_sectors.load(Ordering::Acquire)
        );
    }

    /// Every lost run as (first sector, count), in order (tests, diagnostics).
    pub fn runs(&self) -> Vec<(u64, u64)> {
        let map = self.blocks.lock();
        let mut blocks: Vec<(&u64, &Sectors)> = map.iter().collect();
        blocks.sort_unstable_by_key(|(b, _)| **b);
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for (b, s) in blocks {
            for i in 0..SECTORS_PER_BLOCK {
                if s.lost & (1 << i) == 0 {
                    continue;
                }
                let sector = b * SECTORS_PER_BLOCK + i;
                match runs.last_mut() {
                    Some((f, n)) if *f + *n == sector => *n += 1,
                    _ => runs.push((sector, 1)),
                }
            }
        }
        runs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(entries: &[(u64, u8, u8)]) -> Lost {
        let l = Lost::default();
        l.install(
            entries
                .iter()
                .map(|&(b, lost, unflushed)| (b, Sectors { lost, unflushed }))
                .collect(),
        );
        l
    }

    #[test]
    fn reads_find_lost_sectors_and_overwrites_clear_them_sector_by_sector() {
        let l = set(&[(1, 0b0000_1100, 0b0000_0100), (3, 0xFF, 0)]);
        assert_eq!(l.lost_bytes(), 10 * 512);
        assert_eq!(l.unflushed_bytes(), 512);
        assert_eq!(l.first_in(0, 10), None);
        assert_eq!(l.first_in(0, 11), Some(10));
        assert_eq!(l.first_in(12, 12), None);
        assert_eq!(l.first_in(12, 13), Some(24));
        assert_eq!(l.runs(), vec![(10, 2), (24, 8)]);
        // A partial overwrite: the rest of the block stays lost.
        l.overwritten(10, 1);
        assert_eq!(l.first_in(8, 8), Some(11));
        assert_eq!(l.unflushed_bytes(), 0);
        l.overwritten(11, 1);
        assert_eq!(l.first_in(8, 8), None);
        l.overwritten(20, 8);
        assert_eq!(l.runs(), vec![(28, 4)]);
        assert_eq!(l.lost_bytes(), 4 * 512);
        assert_eq!(l.at_failure_bytes(), 10 * 512);
        l.overwritten(0, 64);
        assert_eq!(l.lost_bytes(), 0);
        assert_eq!(l.first_in(0, 64), None);
    }
}
