//! Chunks: the unit of log writes. A segment fills with one or more chunks, each written to the
//! cache device as one sequential write: metadata blocks, then the data blocks they describe.
//!
//! ```text
//! chunk = | meta block 0 | ... | meta block m-1 | data block 0 | ... | data block d-1 |
//! meta  = | header (64 B) | entry 0 (16 B) | entry 1 | ... | zero padding |
//!
//! header                                   entry
//! |  0 | 8 | magic "LCCHUNK\x01"           |  0 | 8 | lba (backing block, 4 KiB units)
//! |  8 | 8 | format_id                     |  8 | 4 | data CRC32C (kind 1), 0 (kind 0), count
//! | 16 | 8 | segment_id                    | 12 | 1 | kind: 0 hole, 1 data, 2 zero, 3 drop
//! | 24 | 8 | seq (log order, +1 per chunk) | 13 | 1 | dirty_mask (bit i: sector i dirty)
//! | 32 | 8 | synced_seq                    | 14 | 1 | valid_mask (bit i: sector i present)
//! | 40 | 8 | epoch                         | 15 | 1 | reserved (0)
//! | 48 | 2 | start_block (in segment)
//! | 50 | 2 | meta_block_count
//! | 52 | 2 | entry_count
//! | 54 | 2 | data_block_count
//! | 56 | 4 | flags (bit 0: FLUSH_BEFORE)
//! | 60 | 4 | CRC32C (salted) of header with this field zero + all entries
//! ```
//!
//! Hole and data entries take data blocks in order (entry k of those kinds ↔ data block k); a
//! hole is a block dropped before its chunk was sealed. Range entries (kinds 2 and 3: `count`
//! blocks from `lba`, the count in the CRC field) take no data block and follow the block
//! entries. A zero range (TRIM, write-zeroes) says the blocks read as zeros; a drop range (a
//! write that went around the cache) says the backing device holds their newest data. Either
//! way, older cached copies of those blocks are gone. Within a chunk, ranges come before the
//! chunk's live data in time: a block written after a range in the same chunk is the only
//! survivor, since the range killed everything older.

use super::*;

/// Why bytes do not decode as a chunk. Recovery tells the usual end of a log (`NoChunk`,
/// `OtherFormat`) from damage (the rest) by the variant, never by looking at the bytes.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ChunkError {
    /// No chunk magic: never written, or overwritten by something else.
    #[error("chunk magic mismatch")]
    NoChunk,
    /// A chunk of an earlier format of this device.
    #[error("chunk from another format")]
    OtherFormat,
    /// A header whose fields are out of range (torn or damaged).
    #[error("chunk header fields out of range: {0}")]
    BadHeader(String),
    /// The metadata checksum does not verify.
    #[error("chunk seq {seq} checksum mismatch")]
    Checksum { seq: u64 },
    /// An entry is invalid or the entries disagree with the header.
    #[error("chunk seq {seq} {what}")]
    BadEntry { seq: u64, what: String },
}

impl From<ChunkError> for crate::error::Error {
    fn from(e: ChunkError) -> Self {
        crate::error::Error::Corruption(e.to_string())
    }
}

/// Header flag: a flush point (FLUSH, or a FUA write) came between the previous chunk and this
/// one, so this chunk starts a flush epoch (format v2; v1 chunks carry no flags).
pub const FLAG_FLUSH_BEFORE: u32 = 1;
/// Every flag this code knows; a chunk with another set is refused as damaged.
const FLAGS_KNOWN: u32 = FLAG_FLUSH_BEFORE;

pub const CHUNK_MAGIC: u64 = u64::from_le_bytes(*b"LCCHUNK\x01");
pub const HEADER_SIZE_BYTES: usize = 64;
pub const ENTRY_SIZE_BYTES: usize = 16;
const CRC_OFFSET: usize = 60;

/// Entry kinds.
pub const KIND_HOLE: u8 = 0;
pub const KIND_DATA: u8 = 1;
pub const KIND_ZERO: u8 = 2;
pub const KIND_DROP: u8 = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkHeader {
    pub segment_id: u64,
    pub seq: u64,
    /// Every chunk with a sequence at or below this was durable before this chunk was written.
    pub synced_seq: u64,
    pub epoch: u64,
    pub start_block: u16,
    pub meta_block_count: u16,
    pub entry_count: u16,
    pub data_block_count: u16,
    /// `FLAG_*` bits.
    pub flags: u32,
}

impl ChunkHeader {
    /// Whether a flush point precedes this chunk (it starts a flush epoch).
    pub fn flush_before(&self) -> bool {
        self.flags & FLAG_FLUSH_BEFORE != 0
    }

    /// Blocks the chunk occupies in its segment.
    pub fn block_count(&self) -> u32 {
        self.meta_block_count as u32 + self.data_block_count as u32
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub lba: u64,
    pub data_crc: u32,
    pub kind: u8,
    pub dirty_mask: u8,
    pub valid_mask: u8,
}

impl Entry {
    pub fn hole() -> Entry {
        Entry {
            lba: 0,
            data_crc: 0,
            kind: KIND_HOLE,
            dirty_mask: 0,
            valid_mask: 0,
        }
    }

    /// A range entry: `count` blocks from `lba`, of kind `KIND_ZERO` or `KIND_DROP`.
    pub fn range(kind: u8, lba: u64, count: u32) -> Entry {
        assert!(kind == KIND_ZERO || kind == KIND_DROP);
        assert!(count > 0);
        Entry {
            lba,
            data_crc: count,
            kind,
            dirty_mask: 0,
            valid_mask: 0,
        }
    }

    /// The blocks `(lba, count)` whose content this entry records a change of, as recovery
    /// reads the log for checkpoints: a data block written dirty (write-back; a relocated
    /// dirty block too, which the format cannot tell apart: an over-report), a zero or drop
    /// range. A clean data block (a promotion, the copy of a write-through write, whose drop
    /// range is the change) and a hole are none.
    pub fn changed_blocks(&self) -> Option<(u64, u64)> {
        match self.kind {
            KIND_DATA if self.dirty_mask != 0 => Some((self.lba, 1)),
            KIND_ZERO | KIND_DROP => Some((self.lba, self.data_crc as u64)),
            _ => None,
        }
    }

    /// Whether the entry takes a data block.
    pub fn has_block(&self) -> bool {
        self.kind == KIND_HOLE || self.kind == KIND_DATA
    }

    /// Whether this is a zero or drop range.
    pub fn is_range(&self) -> bool {
        self.kind == KIND_ZERO || self.kind == KIND_DROP
    }

    /// Blocks a range entry covers.
    pub fn range_blocks(&self) -> u32 {
        debug_assert!(self.is_range());
        self.data_crc
    }
}

/// How many entries `meta_blocks` metadata blocks hold.
pub const fn entry_capacity(meta_blocks: u32) -> u32 {
    (meta_blocks * BLOCK_SIZE_BYTES as u32 - HEADER_SIZE_BYTES as u32) / ENTRY_SIZE_BYTES as u32
}

/// For a chunk that may use `remaining_blocks` blocks of its segment: the fewest metadata
/// blocks that let it fill the segment, and how many data blocks it can then hold.
pub fn plan(remaining_blocks: u32) -> (u32, u32) {
    assert!(
        remaining_blocks >= 2,
        "a chunk needs a metadata and a data block"
    );
    let mut meta = 1;
    while meta + entry_capacity(meta) < remaining_blocks {
        meta += 1;
    }
    let data = entry_capacity(meta).min(remaining_blocks - meta);
    assert!(data >= 1);
    (meta, data)
}

/// Writes the header fields (not the CRC) into the first metadata block.
pub fn put_header(meta: &mut [u8], format_id: u64, h: &ChunkHeader) {
    assert!(meta.len() >= HEADER_SIZE_BYTES);
    meta[..HEADER_SIZE_BYTES].fill(0);
    put_u64(meta, 0, CHUNK_MAGIC);
    put_u64(meta, 8, format_id);
    put_u64(meta, 16, h.segment_id);
    put_u64(meta, 24, h.seq);
    put_u64(meta, 32, h.synced_seq);
    put_u64(meta, 40, h.epoch);
    meta[48..50].copy_from_slice(&h.start_block.to_le_bytes());
    meta[50..52].copy_from_slice(&h.meta_block_count.to_le_bytes());
    meta[52..54].copy_from_slice(&h.entry_count.to_le_bytes());
    meta[54..56].copy_from_slice(&h.data_block_count.to_le_bytes());
    put_u32(meta, 56, h.flags);
}

pub fn put_entry(meta: &mut [u8], index: usize, e: &Entry) {
    let off = HEADER_SIZE_BYTES + index * ENTRY_SIZE_BYTES;
    let b = &mut meta[off..off + ENTRY_SIZE_BYTES];
    put_u64(b, 0, e.lba);
    put_u32(b, 8, e.data_crc);
    b[12] = e.kind;
    b[13] = e.dirty_mask;
    b[14] = e.valid_mask;
    b[15] = 0;
}

/// Reads entry `index` as encoded, without validating it (for the writer's own metadata).
pub fn entry_at(meta: &[u8], index: usize) -> Entry {
    let off = HEADER_SIZE_BYTES + index * ENTRY_SIZE_BYTES;
    let b = &meta[off..off + ENTRY_SIZE_BYTES];
    Entry {
        lba: get_u64(b, 0),
        data_crc: get_u32(b, 8),
        kind: b[12],
        dirty_mask: b[13],
        valid_mask: b[14],
    }
}

/// Sets the `synced_seq` field of an encoded header (the flusher knows it only at write time).
pub fn put_synced_seq(meta: &mut [u8], synced_seq: u64) {
    put_u64(meta, 32, synced_seq);
}

/// Sets the data CRC of an encoded entry.
pub fn put_entry_crc(meta: &mut [u8], index: usize, data_crc: u32) {
    put_u32(
        meta,
        HEADER_SIZE_BYTES + index * ENTRY_SIZE_BYTES + 8,
        data_crc,
    );
}

/// Computes and stores the header CRC; call last, after every other field is final.
pub fn seal(meta: &mut [u8], format_id: u64, entry_count: u16) {
    let covered = HEADER_SIZE_BYTES + entry_count as usize * ENTRY_SIZE_BYTES;
    assert!(covered <= meta.len());
    put_u32(meta, CRC_OFFSET, 0);
    let crc = crc_salted(format_id, &meta[..covered]);
    put_u32(meta, CRC_OFFSET, crc);
}

/// Decodes the header from a chunk's first metadata block, checking what can be checked before
/// the rest of the metadata is read. `blocks_per_segment` bounds the counts.
pub fn decode_header(
    first: &[u8],
    format_id: u64,
    blocks_per_segment: u32,
) -> std::result::Result<ChunkHeader, ChunkError> {
    if get_u64(first, 0) != CHUNK_MAGIC {
        return Err(ChunkError::NoChunk);
    }
    if get_u64(first, 8) != format_id {
        return Err(ChunkError::OtherFormat);
    }
    let u16_at = |off: usize| u16::from_le_bytes([first[off], first[off + 1]]);
    let h = ChunkHeader {
        segment_id: get_u64(first, 16),
        seq: get_u64(first, 24),
        synced_seq: get_u64(first, 32),
        epoch: get_u64(first, 40),
        start_block: u16_at(48),
        meta_block_count: u16_at(50),
        entry_count: u16_at(52),
        data_block_count: u16_at(54),
        flags: get_u32(first, 56),
    };
    let meta = h.meta_block_count as u32;
    if meta == 0
        || h.entry_count as u32 > entry_capacity(meta)
        || h.data_block_count as u32 > h.entry_count as u32
        || h.start_block as u32 + h.block_count() > blocks_per_segment
        || h.synced_seq >= h.seq
        || h.flags & !FLAGS_KNOWN != 0
    {
        return Err(ChunkError::BadHeader(format!("{h:?}")));
    }
    Ok(h)
}

/// Verifies the header CRC over the whole metadata area and decodes the entries.
pub fn decode_entries(
    meta: &[u8],
    format_id: u64,
    h: &ChunkHeader,
) -> std::result::Result<Vec<Entry>, ChunkError> {
    let covered = HEADER_SIZE_BYTES + h.entry_count as usize * ENTRY_SIZE_BYTES;
    assert!(meta.len() >= covered);
    let stored = get_u32(meta, CRC_OFFSET);
    let mut scratch = meta[..covered].to_vec();
    put_u32(&mut scratch, CRC_OFFSET, 0);
    if crc_salted(format_id, &scratch) != stored {
        return Err(ChunkError::Checksum { seq: h.seq });
    }
    let mut entries = Vec::with_capacity(h.entry_count as usize);
    let mut blocks = 0u32;
    for i in 0..h.entry_count as usize {
        let e = entry_at(meta, i);
        let reserved = meta[HEADER_SIZE_BYTES + i * ENTRY_SIZE_BYTES + 15];
        let ok = match e.kind {
            KIND_HOLE => true,
            KIND_DATA => e.valid_mask != 0 && e.dirty_mask & !e.valid_mask == 0,
            KIND_ZERO | KIND_DROP => {
                e.data_crc != 0
                    && e.dirty_mask == 0
                    && e.valid_mask == 0
                    && e.lba.checked_add(e.data_crc as u64).is_some()
            }
            _ => false,
        };
        // Block entries first, then ranges: the flusher fills in data CRCs by position.
        if e.has_block() && i as u32 != blocks {
            return Err(ChunkError::BadEntry {
                seq: h.seq,
                what: format!("entry {i} takes a data block after a range entry"),
            });
        }
        if !ok || reserved != 0 {
            return Err(ChunkError::BadEntry {
                seq: h.seq,
                what: format!("entry {i} is invalid: {e:?}"),
            });
        }
        blocks += e.has_block() as u32;
        entries.push(e);
    }
    if blocks != h.data_block_count as u32 {
        return Err(ChunkError::BadEntry {
            seq: h.seq,
            what: format!(
                "has {blocks} block entries but {} data blocks",
                h.data_block_count
            ),
        });
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> ChunkHeader {
        ChunkHeader {
            segment_id: 5,
            seq: 42,
            synced_seq: 40,
            epoch: 3,
            start_block: 0,
            meta_block_count: 2,
            entry_count: 3,
            data_block_count: 3,
            flags: FLAG_FLUSH_BEFORE,
        }
    }

    fn encoded(format_id: u64) -> Vec<u8> {
        let h = header();
        let mut meta = vec![0u8; 2 * BLOCK_SIZE_BYTES as usize];
        put_header(&mut meta, format_id, &h);
        let entries = [
            Entry {
                lba: 100,
                data_crc: 1,
                kind: KIND_DATA,
                dirty_mask: 0xFF,
                valid_mask: 0xFF,
            },
            Entry::hole(),
            Entry {
                lba: 7,
                data_crc: 2,
                kind: KIND_DATA,
                dirty_mask: 0x01,
                valid_mask: 0x0F,
            },
        ];
        for (i, e) in entries.iter().enumerate() {
            put_entry(&mut meta, i, e);
        }
        seal(&mut meta, format_id, h.entry_count);
        meta
    }

    #[test]
    fn round_trip() {
        let meta = encoded(11);
        let h = decode_header(&meta, 11, 256).unwrap();
        assert_eq!(h, header());
        let e = decode_entries(&meta, 11, &h).unwrap();
        assert_eq!(e.len(), 3);
        assert_eq!(e[0].lba, 100);
        assert_eq!(e[1].kind, KIND_HOLE);
        assert_eq!(e[2].valid_mask, 0x0F);
    }

    #[test]
    fn any_flipped_covered_bit_is_rejected() {
        let meta = encoded(11);
        let covered = HEADER_SIZE_BYTES + 3 * ENTRY_SIZE_BYTES;
        for off in 0..covered {
            let mut bad = meta.clone();
            bad[off] ^= 0x04;
            let r = decode_header(&bad, 11, 256).and_then(|h| decode_entries(&bad, 11, &h));
            assert!(r.is_err(), "flip at byte {off} went unnoticed");
        }
    }

    #[test]
    fn other_format_is_rejected() {
        let meta = encoded(11);
        assert!(decode_header(&meta, 12, 256).is_err());
    }

    #[test]
    fn plan_fills_segments() {
        assert_eq!(entry_capacity(1), 252);
        // 1 MiB segment: 256 blocks.
        assert_eq!(plan(256), (2, 254));
        assert_eq!(plan(253), (1, 252));
        assert_eq!(plan(2), (1, 1));
        // 32 KiB segment: 8 blocks.
        assert_eq!(plan(8), (1, 7));
        // 16 MiB segment: 4096 blocks.
        let (m, d) = plan(4096);
        assert_eq!(m + d, 4096);
        for r in 2..=4096 {
            let (m, d) = plan(r);
            assert!(m + d <= r && d <= entry_capacity(m), "remaining {r}");
        }
    }

    #[test]
    fn header_bounds_are_checked() {
        let mut meta = encoded(11);
        // A chunk claiming more blocks than the segment has.
        meta[54] = 0xFF;
        assert!(decode_header(&meta, 11, 256).is_err());
    }
}
