//! On-disk checkpoints (format v4): the checkpoint table and the per-checkpoint bitmap pages.
//!
//! The table has two 4 KiB copies at 8 KiB and 12 KiB of the cache device, written alternately
//! like the superblock (`generation mod 2`, then synced): the valid copy with the higher
//! generation wins. The bitmap area (offset and shape in the superblock) holds, per table slot,
//! `bitmap_pages_per_slot` pages, each in two copies (A, B) side by side; a page write goes to
//! copy `generation mod 2`, so a torn page write leaves the other copy intact.
//!
//! ```text
//! table:  |   0 |   8 | magic "LCCKPT\x01\x00"   |
//!         |   8 |   8 | generation               |
//!         |  16 |   8 | next_serial              |
//!         |  24 |   4 | slot_count               |
//!         |  64 | 128 | entry per slot (below)   |
//!         |4092 |   4 | CRC32C salted with format_id |
//! entry:  |   0 |   8 | serial (0: slot free)    |
//!         |   8 |   8 | start_seq                |
//!         |  16 |   8 | created_unix_ms          |
//!         |  24 |   2 | name_len (1..=64)        |
//!         |  32 |  64 | name (UTF-8, zero padded)|
//! page:   |   0 |4080 | bits, LSB first: bit i = disk block page*32640 + i changed |
//!         |4080 |   4 | serial (low 32 bits)     |
//!         |4084 |   8 | generation               |
//!         |4092 |   4 | CRC32C salted with format_id |
//! ```

use super::*;
use crate::error::{Error, Result};

pub const TABLE_MAGIC: u64 = u64::from_le_bytes(*b"LCCKPT\x01\x00");
/// Byte offsets of the two table copies (inside the superblock region, reserved before v4).
pub const TABLE_OFFSETS: [u64; 2] = [8192, 12288];
pub const TABLE_SIZE_BYTES: usize = 4096;
/// Where the bitmap area starts when it fits in the superblock region.
pub const AREA_OFFSET_IN_REGION_BYTES: u64 = 16384;
/// Most checkpoints a cache can hold (the table's room).
pub const CHECKPOINT_SLOTS_MAX: u32 = 16;
/// Checkpoint slots `format` reserves unless told otherwise.
pub const CHECKPOINT_SLOTS_DEFAULT: u32 = 4;
/// Longest checkpoint name, in bytes of UTF-8.
pub const NAME_MAX_BYTES: usize = 64;
pub const PAGE_SIZE_BYTES: usize = 4096;
/// Bitmap bytes per page; the rest is the trailer.
pub const PAGE_BITS_BYTES: usize = 4080;
/// Disk blocks (4 KiB) one page covers.
pub const BLOCKS_PER_PAGE: u64 = PAGE_BITS_BYTES as u64 * 8;
/// u64 words of bits per page.
pub const PAGE_WORDS: usize = PAGE_BITS_BYTES / 8;

const ENTRIES_OFFSET: usize = 64;
const ENTRY_SIZE_BYTES: usize = 128;
const CRC_OFFSET: usize = TABLE_SIZE_BYTES - 4;

const _: () =
    assert!(ENTRIES_OFFSET + ENTRY_SIZE_BYTES * CHECKPOINT_SLOTS_MAX as usize <= CRC_OFFSET);
const _: () = assert!(PAGE_BITS_BYTES.is_multiple_of(8));

/// Bitmap pages one checkpoint needs for a disk of `exported_blocks` blocks.
pub fn pages_per_slot(exported_blocks: u64) -> u32 {
    exported_blocks.div_ceil(BLOCKS_PER_PAGE) as u32
}

/// Bytes of the bitmap area: every slot's pages, two copies each.
pub fn area_size_bytes(slots: u32, pages_per_slot: u32) -> u64 {
    slots as u64 * pages_per_slot as u64 * 2 * PAGE_SIZE_BYTES as u64
}

/// Byte offset of copy `copy` (0 A, 1 B) of page `page` of slot `slot`.
pub fn page_offset(area_offset: u64, pages_per_slot: u32, slot: u32, page: u32, copy: u64) -> u64 {
    debug_assert!(copy < 2 && page < pages_per_slot);
    area_offset
        + ((slot as u64 * pages_per_slot as u64 + page as u64) * 2 + copy) * PAGE_SIZE_BYTES as u64
}

/// One used slot of the table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableEntry {
    /// Never reused (the table's `next_serial` only rises): pages of an older checkpoint in
    /// the same slot never verify for a new one.
    pub serial: u64,
    /// The first chunk whose changes count for this checkpoint.
    pub start_seq: u64,
    pub created_unix_ms: u64,
    pub name: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Table {
    pub generation: u64,
    pub next_serial: u64,
    /// One per slot of the cache (`checkpoint_slots`).
    pub slots: Vec<Option<TableEntry>>,
}

/// Checks a checkpoint name: 1 to 64 bytes of UTF-8, printable, no '/' or ':' (names appear
/// in `qemu:dirty-bitmap:NAME` and in file names of backup scripts).
pub fn check_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > NAME_MAX_BYTES {
        return Err(Error::InvalidArgument(format!(
            "checkpoint name {name:?} must be 1 to {NAME_MAX_BYTES} bytes"
        )));
    }
    if name
        .chars()
        .any(|c| c.is_control() || c.is_whitespace() || c == '/' || c == ':')
    {
        return Err(Error::InvalidArgument(format!(
            "checkpoint name {name:?} may not contain spaces, control characters, '/' or ':'"
        )));
    }
    Ok(())
}

impl Table {
    pub fn empty(slots: u32) -> Table {
        Table {
            generation: 0,
            next_serial: 1,
            slots: vec![None; slots as usize],
        }
    }

    pub fn encode(&self, format_id: u64) -> [u8; TABLE_SIZE_BYTES] {
        assert!(self.slots.len() <= CHECKPOINT_SLOTS_MAX as usize);
        let mut b = [0u8; TABLE_SIZE_BYTES];
        put_u64(&mut b, 0, TABLE_MAGIC);
        put_u64(&mut b, 8, self.generation);
        put_u64(&mut b, 16, self.next_serial);
        put_u32(&mut b, 24, self.slots.len() as u32);
        for (i, e) in self.slots.iter().enumerate() {
            let Some(e) = e else { continue };
            assert!(e.serial != 0 && e.serial < self.next_serial);
            assert!(e.name.len() <= NAME_MAX_BYTES && !e.name.is_empty());
            let o = ENTRIES_OFFSET + i * ENTRY_SIZE_BYTES;
            put_u64(&mut b, o, e.serial);
            put_u64(&mut b, o + 8, e.start_seq);
            put_u64(&mut b, o + 16, e.created_unix_ms);
            b[o + 24..o + 26].copy_from_slice(&(e.name.len() as u16).to_le_bytes());
            b[o + 32..o + 32 + e.name.len()].copy_from_slice(e.name.as_bytes());
        }
        let crc = crc_salted(format_id, &b[..CRC_OFFSET]);
        put_u32(&mut b, CRC_OFFSET, crc);
        b
    }

    /// `None`: not a valid table copy of this cache (zeros, torn, another format's).
    pub fn decode(b: &[u8], format_id: u64, slots: u32) -> Option<Table> {
        assert_eq!(b.len(), TABLE_SIZE_BYTES);
        if get_u64(b, 0) != TABLE_MAGIC
            || get_u32(b, CRC_OFFSET) != crc_salted(format_id, &b[..CRC_OFFSET])
            || get_u32(b, 24) != slots
        {
            return None;
        }
        let next_serial = get_u64(b, 16);
        let mut table = Table {
            generation: get_u64(b, 8),
            next_serial,
            slots: Vec::with_capacity(slots as usize),
        };
        for i in 0..slots as usize {
            let o = ENTRIES_OFFSET + i * ENTRY_SIZE_BYTES;
            let serial = get_u64(b, o);
            if serial == 0 {
                table.slots.push(None);
                continue;
            }
            let len = u16::from_le_bytes([b[o + 24], b[o + 25]]) as usize;
            if serial >= next_serial || len == 0 || len > NAME_MAX_BYTES {
                return None;
            }
            let name = std::str::from_utf8(&b[o + 32..o + 32 + len])
                .ok()?
                .to_string();
            table.slots.push(Some(TableEntry {
                serial,
                start_seq: get_u64(b, o + 8),
                created_unix_ms: get_u64(b, o + 16),
                name,
            }));
        }
        Some(table)
    }

    /// The valid copy with the higher generation, if any.
    pub fn choose(copies: [&[u8]; 2], format_id: u64, slots: u32) -> Option<Table> {
        copies
            .into_iter()
            .filter_map(|c| Table::decode(c, format_id, slots))
            .max_by_key(|t| t.generation)
    }

    /// Which copy this generation goes to.
    pub fn copy_offset(generation: u64) -> u64 {
        TABLE_OFFSETS[(generation % 2) as usize]
    }
}

/// Encodes one bitmap page copy: `words` are its bits (bit i of word w is block 64w + i).
pub fn encode_page(out: &mut [u8], words: &[u64], serial: u64, generation: u64, format_id: u64) {
    assert_eq!(out.len(), PAGE_SIZE_BYTES);
    assert_eq!(words.len(), PAGE_WORDS);
    for (i, w) in words.iter().enumerate() {
        put_u64(out, i * 8, *w);
    }
    put_u32(out, PAGE_BITS_BYTES, serial as u32);
    put_u64(out, PAGE_BITS_BYTES + 4, generation);
    let crc = crc_salted(format_id, &out[..PAGE_SIZE_BYTES - 4]);
    put_u32(out, PAGE_SIZE_BYTES - 4, crc);
}

/// Decodes one page copy into `words`; returns its generation, or `None` when it is not a
/// valid page of checkpoint `serial` (torn, never written, another checkpoint's).
pub fn decode_page(b: &[u8], words: &mut [u64], serial: u64, format_id: u64) -> Option<u64> {
    assert_eq!(b.len(), PAGE_SIZE_BYTES);
    if get_u32(b, PAGE_SIZE_BYTES - 4) != crc_salted(format_id, &b[..PAGE_SIZE_BYTES - 4])
        || get_u32(b, PAGE_BITS_BYTES) != serial as u32
    {
        return None;
    }
    for (i, w) in words.iter_mut().enumerate() {
        *w = get_u64(b, i * 8);
    }
    Some(get_u64(b, PAGE_BITS_BYTES + 4))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Table {
        let mut t = Table::empty(4);
        t.generation = 5;
        t.next_serial = 9;
        t.slots[2] = Some(TableEntry {
            serial: 7,
            start_seq: 1234,
            created_unix_ms: 1_700_000_000_000,
            name: "daily-2026-11-25".into(),
        });
        t
    }

    #[test]
    fn table_round_trip_and_choice() {
        let t = sample();
        let raw = t.encode(42);
        assert_eq!(Table::decode(&raw, 42, 4), Some(t.clone()));
        assert_eq!(Table::decode(&raw, 43, 4), None, "another format's table");
        assert_eq!(Table::decode(&raw, 42, 5), None, "another slot count");
        let mut newer = t.clone();
        newer.generation = 6;
        newer.slots[2] = None;
        let raw_newer = newer.encode(42);
        assert_eq!(Table::choose([&raw, &raw_newer], 42, 4), Some(newer));
        let mut torn = raw_newer;
        torn[100] ^= 1;
        assert_eq!(Table::choose([&raw, &torn], 42, 4), Some(t));
        assert_eq!(Table::choose([&[0u8; 4096], &[0u8; 4096]], 42, 4), None);
        for off in (0..TABLE_SIZE_BYTES).step_by(97) {
            let mut bad = raw;
            bad[off] ^= 0x40;
            assert_eq!(Table::decode(&bad, 42, 4), None, "offset {off}");
        }
    }

    #[test]
    fn page_round_trip_checks_serial_and_crc() {
        let mut words = vec![0u64; PAGE_WORDS];
        words[0] = 0b1011;
        words[PAGE_WORDS - 1] = 1 << 63;
        let mut raw = vec![0u8; PAGE_SIZE_BYTES];
        encode_page(&mut raw, &words, 7, 3, 42);
        let mut back = vec![0u64; PAGE_WORDS];
        assert_eq!(decode_page(&raw, &mut back, 7, 42), Some(3));
        assert_eq!(back, words);
        assert_eq!(decode_page(&raw, &mut back, 8, 42), None);
        assert_eq!(decode_page(&raw, &mut back, 7, 41), None);
        raw[17] ^= 1;
        assert_eq!(decode_page(&raw, &mut back, 7, 42), None);
    }

    #[test]
    fn names() {
        assert!(check_name("daily").is_ok());
        assert!(check_name(&"x".repeat(64)).is_ok());
        assert!(check_name(&"x".repeat(65)).is_err());
        assert!(check_name("").is_err());
        assert!(check_name("a b").is_err());
        assert!(check_name("a:b").is_err());
    }

    #[test]
    fn geometry() {
        assert_eq!(pages_per_slot(1), 1);
        assert_eq!(pages_per_slot(BLOCKS_PER_PAGE), 1);
        assert_eq!(pages_per_slot(BLOCKS_PER_PAGE + 1), 2);
        // 1 TiB of disk: 8,225 pages (docs/CHECKPOINTS.md).
        assert_eq!(pages_per_slot((1u64 << 40) / 4096), 8225);
        assert_eq!(
            page_offset(16384, 3, 1, 2, 1),
            16384 + ((3 + 2) * 2 + 1) * 4096
        );
    }
}
