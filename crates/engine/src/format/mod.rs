//! On-disk format v4: constants, checksums and the encoders/decoders of every on-disk structure.
//!
//! Every multi-byte field is little-endian. `docs/FORMAT.md` documents each field; keep them in
//! step. Nothing here does IO: callers read and write the bytes.

pub mod checkpoints;
pub mod chunk;
pub mod label;
pub mod superblock;

// Our own CRC32C (AVX-512 carry-less fold where the CPU has it), same values as the crate.
use logcache_io::crc32c;

/// The unit of caching and of every cache-device IO.
pub const BLOCK_SIZE_BYTES: u64 = 4096;
/// The unit of dirty/valid tracking: one mask bit per sector.
pub const SECTOR_SIZE_BYTES: u64 = 512;
pub const SECTORS_PER_BLOCK: u64 = BLOCK_SIZE_BYTES / SECTOR_SIZE_BYTES;
/// A mask with every sector of a block set.
pub const FULL_MASK: u8 = 0xFF;
/// Format version written by this code. Version 2 added the chunk flag `FLUSH_BEFORE`; a
/// version 1 cache reads as version 2 whose chunks carry no flags (its whole log one flush
/// epoch), and its superblock is written as version 2 at the next open. Version 3 added the
/// writeback record in the backing label (`label::WritebackRecord`) and `detach --force`'s mark
/// there; versions 1 and 2 open and are written as version 3, and earlier builds refuse a
/// version 3 cache (they would neither keep the record nor see the mark).
/// Version 4 added checkpoints (the table, the bitmap area and three superblock fields that
/// versions 1 to 3 left zero: such a cache has no room for checkpoints); older caches are
/// written as version 4 at the next open.
pub const FORMAT_VERSION: u32 = 4;
/// The oldest format version this code opens.
pub const FORMAT_VERSION_MIN: u32 = 1;
/// The superblock region at the start of the cache device; segments start after it.
pub const SUPERBLOCK_REGION_BYTES: u64 = 1 << 20;
/// Segment sizes accepted at format time.
pub const SEGMENT_SIZE_MIN_BYTES: u64 = 32 << 10;
pub const SEGMENT_SIZE_MAX_BYTES: u64 = 16 << 20;
pub const SEGMENT_SIZE_DEFAULT_BYTES: u64 = 1 << 20;
/// Fewest segments a cache may have: one open, one being written, one to reclaim into.
pub const SEGMENT_COUNT_MIN: u64 = 4;

const _: () = assert!(SECTORS_PER_BLOCK == 8, "masks are one byte");
const _: () = assert!(SUPERBLOCK_REGION_BYTES.is_multiple_of(BLOCK_SIZE_BYTES));
const _: () = assert!(SEGMENT_SIZE_MIN_BYTES.is_multiple_of(BLOCK_SIZE_BYTES));
const _: () = assert!(SEGMENT_SIZE_MAX_BYTES / BLOCK_SIZE_BYTES <= u16::MAX as u64);

/// CRC32C of `bytes`, salted with the cache's format id so that structures from an earlier
/// format of the same device never verify.
pub fn crc_salted(format_id: u64, bytes: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&format_id.to_le_bytes()), bytes)
}

/// CRC32C of one data block, salted with the format id and the block's backing address, so a
/// block read from the wrong place (or written for another address) never verifies.
pub fn crc_block(format_id: u64, lba: u64, data: &[u8]) -> u32 {
    debug_assert_eq!(data.len() as u64, BLOCK_SIZE_BYTES);
    let mut salt = [0u8; 16];
    salt[..8].copy_from_slice(&format_id.to_le_bytes());
    salt[8..].copy_from_slice(&lba.to_le_bytes());
    crc32c::crc32c_append(crc32c::crc32c(&salt), data)
}

/// A checked reader of little-endian fields at fixed offsets.
pub(crate) fn get_u64(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}
pub(crate) fn get_u32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().expect("4 bytes"))
}
pub(crate) fn put_u64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}
pub(crate) fn put_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

/// Fresh random bytes from the kernel (format ids, UUIDs).
pub fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    fill_random(&mut b);
    u64::from_le_bytes(b)
}

pub fn fill_random(buf: &mut [u8]) {
    let mut filled = 0;
    while filled < buf.len() {
        // SAFETY: the pointer and length describe the unfilled tail of `buf`.
        let n = unsafe {
            libc::getrandom(
                buf[filled..].as_mut_ptr() as *mut libc::c_void,
                buf.len() - filled,
                0,
            )
        };
        if n > 0 {
            filled += n as usize;
        } else {
            // getrandom only fails with EINTR here (the buffer is small and valid); retry.
            assert!(n == -1, "getrandom returned {n}");
        }
    }
}

/// A 16-byte UUID (version 4, random) and its usual text form.
pub fn new_uuid() -> [u8; 16] {
    let mut u = [0u8; 16];
    fill_random(&mut u);
    u[6] = (u[6] & 0x0F) | 0x40;
    u[8] = (u[8] & 0x3F) | 0x80;
    u
}

pub fn uuid_to_string(u: &[u8; 16]) -> String {
    let h: Vec<String> = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        h[0..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..16].concat()
    )
}

/// A size for messages: whole MiB, else whole KiB, else bytes.
pub fn human_bytes(bytes: u64) -> String {
    if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else if bytes >= 1 << 10 {
        format!("{} KiB", bytes >> 10)
    } else {
        format!("{bytes} bytes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn salted_crcs_differ_by_salt() {
        let data = vec![7u8; BLOCK_SIZE_BYTES as usize];
        assert_ne!(crc_salted(1, &data), crc_salted(2, &data));
        assert_ne!(crc_block(1, 10, &data), crc_block(1, 11, &data));
        assert_ne!(crc_block(1, 10, &data), crc_block(2, 10, &data));
        assert_eq!(crc_block(3, 4, &data), crc_block(3, 4, &data));
    }

    #[test]
    fn uuid_has_version_4_and_text_form() {
        let u = new_uuid();
        assert_eq!(u[6] >> 4, 4);
        let s = uuid_to_string(&u);
        assert_eq!(s.len(), 36);
        assert_eq!(s.matches('-').count(), 4);
        assert_ne!(new_uuid(), u);
    }
}
