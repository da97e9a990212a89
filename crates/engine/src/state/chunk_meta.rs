//! A log chunk's metadata from seal to write, in one place: `encode` fills it in under the
//! state lock when the open chunk is sealed (header and entries: all but what only the flusher
//! knows), `finish` completes it on the flusher (data CRCs computed from the data blocks,
//! `synced_seq`, the header CRC), and `data_crcs` hands the CRCs back for reads from the cache
//! device. The bytes themselves are `format::chunk`'s.
//!
//! Why this is in `state/` and not `log/`: sealing happens inside `State`, under the lock, and
//! is called from `State::reserve_block` and `State::add_range` when the open chunk's entries
//! are full (a writer's reservation seals in the same lock hold). `log/` sits above `state/`
//! (the flusher locks `State`), so a chunk writer in `log/` would make `state` import `log`: a
//! cycle. The flusher's half (`finish`, `data_crcs`) stays here beside `encode` so the chunk's
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

/// Completes a sealed chunk's metadata before it is written: each data entry's CRC over its
/// block in `data`, the newest `synced_seq`, and the header CRC over header and entries.
pub fn finish(meta: &mut [u8], data: &[u8], geo: &Geometry, synced_seq: u64, entry_count: u32) {
    let data_count = data.len() / BLOCK;
    assert_eq!(data.len(), data_count * BLOCK);
    for i in 0..data_count {
        let e = chunk::entry_at(meta, i);
        if e.kind == KIND_DATA {
            let crc = geo.block_crc(e.lba, &data[i * BLOCK..(i + 1) * BLOCK]);
            chunk::put_entry_crc(meta, i, crc);
        }
    }
    chunk::put_synced_seq(meta, synced_seq);
    chunk::seal(meta, geo.format_id, entry_count as u16);
}

/// The data CRCs `finish` recorded, as (data block index, CRC) for each data entry.
pub fn data_crcs(meta: &[u8], data_count: u32) -> impl Iterator<Item = (u32, u32)> + '_ {
    (0..data_count).filter_map(move |i| {
        let e = chunk::entry_at(meta, i as usize);
        (e.kind == KIND_DATA).then_some((i, e.data_crc))
    })
}
