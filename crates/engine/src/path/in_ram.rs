//! Dirty blocks still in RAM when the cache device failed (issue 25): the open chunk, chunks
//! sealed but not yet written, and written chunks whose segment buffer is still held. Their
//! newest data is readable from RAM, so the switch (`path::alone`) writes them to the backing
//! device instead of leaving them lost: it copies them out under the state lock in the same
//! hold as it takes the lost set (`collect`), and once the backing device is marked detached it
//! writes them in flush-epoch order, syncing the backing device after each epoch, and only
//! then finds their sectors again in the lost set (`write`).
//!
//! Why a newer epoch may go to the backing device while an older epoch's blocks are lost (on
//! the dead device): those lost sectors read EIO, the label says data was lost and the old
//! cache is refused, so the backing device is no longer "a past state of the disk" either way;
//! what is left to keep is that every sector that reads returns its newest data, which writing
//! these blocks does (they are the newest copies: RAM holds the end of the log). When nothing
//! older is lost, the epochs in RAM are the next ones after what writeback wrote, and writing
//! them one epoch at a time, synced in between, keeps the backing device a past state at every
//! moment, power cuts included.

use crate::format::{BLOCK_SIZE_BYTES, SECTORS_PER_BLOCK, SECTOR_SIZE_BYTES};
use crate::inner::Inner;
use crate::io::BlockDevice as _;
use crate::state::{Location, State};

const BLOCK: usize = BLOCK_SIZE_BYTES as usize;

/// One dirty copy in RAM: its flush epoch (the sequence of the epoch's first chunk; `u64::MAX`
/// for the open chunk after a flush point), its backing block and the sectors it holds the
/// newest data of.
#[derive(Clone, Copy, Debug)]
struct Copy {
    epoch: u64,
    lba: u64,
    sectors: u8,
}

/// The dirty copies in RAM at the failure, oldest epoch first, and their data (`BLOCK` bytes
/// each, in the same order).
#[derive(Default)]
pub struct InRam {
    copies: Vec<Copy>,
    data: Vec<u8>,
}

/// Copies out the dirty blocks in RAM (under the state lock, as reads do: sealed blocks never
/// change, the open chunk changes only under the lock). Their sectors are the ones
/// `path::lost::collect` counts lost for them in the same hold: an index copy's dirty sectors,
/// a shadow's dirty sectors its newer copy does not hold clean; none in a block a write-zeroes
/// under way covers. A shadow is taken only if its
/// newer copy is in RAM too (RAM holds the end of the log, so it always is; a newer copy lost
/// on the device must not be passed by older data found again).
pub fn collect(inner: &Inner, st: &State) -> InRam {
    let geo = &inner.geo;
    let mut found: Vec<(Copy, u32, usize)> = Vec::new();
    if st.blocks.dirty_blocks() > 0 {
        for c in 0..geo.cache_block_count() {
            let dirty = st.blocks.dirty(c);
            if dirty == 0 {
                continue;
            }
            let (buffer, open) = match st.locate(c) {
                Location::OpenChunk { buffer } => (buffer, true),
                Location::Ram { buffer } => (buffer, false),
                Location::Disk => continue,
            };
            let Some(lba) = st.blocks.dirty_lba(c) else {
                continue;
            };
            // A write-zeroes under way may already have dropped this block's newer copies
            // (a shadow left here is older than its zeros): its blocks stay lost until the
            // request, tried again from the backing device alone, writes the zeros
            // (`path::lost::collect`). Writing this copy and marking it found would serve
            // data older than both (sim cache-loss seed 50030).
            if st.bypass.zeroing_any(lba, lba + 1) {
                continue;
            }
            let newer = st.blocks.lookup(lba).filter(|&n| n != c);
            if newer.is_some_and(|n| st.locate(n) == Location::Disk) {
                debug_assert!(false, "a shadow in RAM whose newer copy is on the device");
                continue;
            }
            let replaced = newer.map_or(0, |n| st.blocks.valid(n) & !st.blocks.dirty(n));
            let sectors = dirty & !replaced;
            if sectors == 0 {
                continue;
            }
            let (slot, b) = geo.split(c);
            let epoch = if open && st.epochs.flush_pending() {
                u64::MAX
            } else {
                st.epochs
                    .start_seq(st.ring.segment(slot).id, b)
                    .unwrap_or(0)
            };
            found.push((
                Copy {
                    epoch,
                    lba,
                    sectors,
                },
                buffer,
                st.offset_in_buffer(c),
            ));
        }
    }
    // Oldest epoch first; by address within one (an epoch holds one copy of a block).
    found.sort_unstable_by_key(|(copy, _, _)| (copy.epoch, copy.lba));
    let mut data = vec![0u8; found.len() * BLOCK];
    for ((_, buffer, off), dst) in found.iter().zip(data.chunks_exact_mut(BLOCK)) {
        // SAFETY: data blocks in RAM are read under the state lock (`state::buffers`).
        dst.copy_from_slice(unsafe { inner.buffers.slice(*buffer, *off, BLOCK) });
    }
    InRam {
        copies: found.into_iter().map(|(copy, _, _)| copy).collect(),
        data,
    }
}

/// Backing-device syncs an epoch's writes are tried again across (a remote backing device
/// that reconnected may have dropped writes that returned before).
const RECONNECT_RETRIES: u32 = 3;

/// Writes the copies to the backing device one flush epoch at a time, each synced before the
/// next, and marks each epoch's sectors found again (`path::lost`) once synced. Runs before
/// requests go to the backing device alone, under `backing_order`. Returns the bytes found
/// again; on an error, the epochs not synced stay lost and the error says why.
pub fn write(inner: &Inner, in_ram: &InRam) -> Result<u64, (u64, String)> {
    let lost_before = inner.lost.lost_bytes();
    let saved = || lost_before - inner.lost.lost_bytes();
    let newest = newest_sectors(in_ram);
    let mut start = 0usize;
    while start < in_ram.copies.len() {
        let epoch = in_ram.copies[start].epoch;
        let end = start
            + in_ram.copies[start..]
                .iter()
                .take_while(|c| c.epoch == epoch)
                .count();
        write_epoch(inner, in_ram, start..end).map_err(|e| (saved(), e))?;
        for (copy, &sectors) in in_ram.copies[start..end].iter().zip(&newest[start..end]) {
            for (first, count) in runs(sectors) {
                inner
                    .lost
                    .found_in_ram(copy.lba * SECTORS_PER_BLOCK + first, count);
            }
        }
        inner.lost.found_at_failure();
        start = end;
    }
    Ok(saved())
}

/// Per copy, the sectors no later epoch's copy of its block holds: only those are found again
/// once its epoch is synced. A sector an older epoch's sync found while a newer epoch's copy of
/// it then failed to land was no longer counted lost, and a flush returned OK over it (the long
/// sweep, cache-loss seed 101575: after the power cut the sector held the older epoch's data).
fn newest_sectors(in_ram: &InRam) -> Vec<u8> {
    let mut later: std::collections::HashMap<u64, u8> = std::collections::HashMap::new();
    let mut out = vec![0u8; in_ram.copies.len()];
    for (i, copy) in in_ram.copies.iter().enumerate().rev() {
        let seen = later.entry(copy.lba).or_default();
        out[i] = copy.sectors & !*seen;
        *seen |= copy.sectors;
    }
    out
}

/// One epoch's copies written and synced, again if the backing device reconnected meanwhile.
fn write_epoch(inner: &Inner, in_ram: &InRam, range: std::ops::Range<usize>) -> Result<(), String> {
    for _ in 0..RECONNECT_RETRIES {
        let reconnects = inner.backing.reconnects();
        let mut prev_lba = None;
        for i in range.clone() {
            let copy = in_ram.copies[i];
            debug_assert!(prev_lba < Some(copy.lba), "one copy of a block per epoch");
            prev_lba = Some(copy.lba);
            let block = &in_ram.data[i * BLOCK..(i + 1) * BLOCK];
            for (first, count) in runs(copy.sectors) {
                let at = copy.lba * BLOCK_SIZE_BYTES + first * SECTOR_SIZE_BYTES;
                let bytes = &block[(first * SECTOR_SIZE_BYTES) as usize
                    ..((first + count) * SECTOR_SIZE_BYTES) as usize];
                inner
                    .backing
                    .write_at(bytes, at)
                    .map_err(|e| format!("writing {} bytes at {at}: {e}", bytes.len()))?;
            }
        }
        crate::path::alone::noting_sync(inner, || inner.backing.flush())
            .map_err(|e| format!("syncing the backing device: {e}"))?;
        if inner.backing.reconnects() == reconnects {
            return Ok(());
        }
    }
    Err(format!(
        "the backing device reconnected {RECONNECT_RETRIES} times while they were written"
    ))
}

/// The runs of set bits of a sector mask, as (first sector, count).
fn runs(mask: u8) -> impl Iterator<Item = (u64, u64)> {
    let mut i = 0u64;
    std::iter::from_fn(move || {
        while i < SECTORS_PER_BLOCK && mask & (1 << i) == 0 {
            i += 1;
        }
        if i == SECTORS_PER_BLOCK {
            return None;
        }
        let first = i;
        while i < SECTORS_PER_BLOCK && mask & (1 << i) != 0 {
            i += 1;
        }
        Some((first, i - first))
    })
}

#[cfg(test)]
mod tests {
    use super::runs;

    #[test]
    fn runs_of_a_sector_mask() {
        assert_eq!(runs(0).count(), 0);
        assert_eq!(runs(0xFF).collect::<Vec<_>>(), vec![(0, 8)]);
        assert_eq!(
            runs(0b1011_0001).collect::<Vec<_>>(),
            vec![(0, 1), (4, 2), (7, 1)]
        );
    }
}
