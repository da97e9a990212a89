//! A log chunk's metadata from seal to write, in one place: `encode` fills it in under the
//! state lock when the open chunk is sealed (header and entries: all but what only the flusher
//! knows), `finish` completes it on the flusher (data CRCs taken from the write path or computed
//! from the data blocks, and handed back for reads from the cache device; clean sectors no backing sync vouches for
//! taken out of the entries; `synced_seq`, the header CRC). The bytes themselves are `format::chunk`'s.
//!
//! Why this is in `state/` and not `log/`: sealing happens inside `State`, under the lock, and
//! is called from `State::reserve_block` and `State::add_range` when the open chunk's entries
//! are full (a writer's reservation seals in the same lock hold). `log/` sits above `state/`
//! (the flusher locks `State`), so a chunk writer in `log/` would make `state` import `log`: a
//! cycle. The flusher's half (`finish`) stays here beside `encode` so the chunk's
//! metadata has one home.

use crate::format::chunk::{self, ChunkHeader, Entry, KIND_DATA};
use crate::format::BLOCK_SIZE_BYTES;
use crate::geometry::Geometry;

const BLOCK: usize = BLOCK_SIZE_BYTES as usize;

/// Encodes the metadata of a chunk being sealed: `header`, then one entry per data block
/// (`block_entries`, in data block order), then the range entries. The metadata blocks are
/// zeroed first, so the padding is deterministic.
pub fn encode(
    meta: &mut [u8],
    format_id: u64,
    header: &ChunkHeader,
    block_entries: impl Iterator<Item = Entry>,
    range_entries: impl Iterator<Item = Entry>,
) {
    assert_eq!(meta.len(), header.meta_block_count as usize * BLOCK);
    assert!(header.entry_count as u32 <= chunk::entry_capacity(header.meta_block_count as u32));
    meta.fill(0);
    chunk::put_header(meta, format_id, header);
    let data_count = header.data_block_count as usize;
    let mut count = 0usize;
    for (i, e) in block_entries.chain(range_entries).enumerate() {
        // Block entries first, one per data block, then ranges (the order decoding checks).
        assert_eq!(e.has_block(), i < data_count, "entry {i} out of place");
        chunk::put_entry(meta, i, &e);
        count = i + 1;
    }
    assert_eq!(
        count, header.entry_count as usize,
        "entries disagree with the header"
    );
}

/// A sealed chunk's data blocks, and the CRCs the write path left for them.
pub struct ChunkData<'a, F: FnMut(usize, u64) -> Option<u32>> {
    pub bytes: &'a [u8],
    /// `ready(i, lba)` takes the CRC the write path computed for data block `i` as backing
    /// block `lba`, if any; `finish` calls it for every data block, so each one's is cleared.
    pub ready: F,
}

/// Completes a sealed chunk's metadata before it is written: each data entry's CRC over its
/// block in `data`, the newest `synced_seq`, and the header CRC over header and entries. Every
/// data entry's (data block index, CRC) goes to `crcs`, for reads from the cache device.
/// A CRC the write path left (`ChunkData::ready`) is used instead of computing it.
///
/// With `unvouched` (no backing sync covers what the chunk's clean sectors say the backing
/// device holds), no entry may say so: a clean entry is written as a hole, and a partly dirty
/// one (a write-back write of part of a block whose cached copy was clean) keeps only its
/// dirty sectors valid. After a crash those sectors are read from the backing device, which
/// then holds whatever it kept. (Left valid, the clean sectors of a partly dirty entry were
/// served after a crash although the backing device had lost them, and read older data once
/// the block was written back and dropped: CI's crash seed 11569655912972376080.) Returns how
/// many entries lost their clean sectors.
pub fn finish<F: FnMut(usize, u64) -> Option<u32>>(
    meta: &mut [u8],
    data: ChunkData<'_, F>,
    geo: &Geometry,
    synced_seq: u64,
    entry_count: u32,
    unvouched: bool,
    crcs: &mut Vec<(u32, u32)>,
) -> u32 {
    let ChunkData {
        bytes: data,
        mut ready,
    } = data;
    let data_count = data.len() / BLOCK;
    assert_eq!(data.len(), data_count * BLOCK);
    let mut unvouched_entries = 0;
    for i in 0..data_count {
        let mut e = chunk::entry_at(meta, i);
        let ready_crc = ready(i, e.lba);
        if e.kind != KIND_DATA {
            continue;
        }
        assert_eq!(e.dirty_mask & !e.valid_mask, 0, "a dirty sector not valid");
        let block = &data[i * BLOCK..(i + 1) * BLOCK];
        let crc = match ready_crc {
            Some(crc) => {
                // Every test run checks every CRC the write path left.
                debug_assert_eq!(crc, geo.block_crc(e.lba, block), "ready CRC of block {i}");
                crc
            }
            None => geo.block_crc(e.lba, block),
        };
        crcs.push((i as u32, crc));
        let clean_sectors = e.valid_mask & !e.dirty_mask;
        if unvouched && clean_sectors != 0 {
            unvouched_entries += 1;
            e = if e.dirty_mask == 0 {
                Entry::hole()
            } else {
                Entry {
                    data_crc: crc,
                    valid_mask: e.dirty_mask,
                    ..e
                }
            };
            chunk::put_entry(meta, i, &e);
        } else {
            chunk::put_entry_crc(meta, i, crc);
        }
    }
    chunk::put_synced_seq(meta, synced_seq);
    chunk::seal(meta, geo.format_id, entry_count as u16);
    unvouched_entries
}
