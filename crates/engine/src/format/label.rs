//! The backing-device label: the last 4 KiB of the backing device carry the UUID of the cache
//! formatted for it, so a cache is never attached to the wrong backing device.
//!
//! ```text
//! |  0 |  8 | magic "LCLABEL\x01"
//! |  8 | 16 | backing_uuid
//! | 24 |  8 | format_id of the cache formatted for it
//! | 32 |  8 | exported_size_bytes (the label's own offset)
//! | 40 |  4 | CRC32C of bytes 0..40
//! ```
//! Everything after byte 44 is zero. The exported disk is the backing device without this block,
//! so the backing device stays directly usable after a drain.

use super::*;
use crate::error::{Error, Result};

pub const LABEL_MAGIC: u64 = u64::from_le_bytes(*b"LCLABEL\x01");
pub const LABEL_SIZE_BYTES: u64 = BLOCK_SIZE_BYTES;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Label {
    pub backing_uuid: [u8; 16],
    pub format_id: u64,
    pub exported_size_bytes: u64,
}

/// Where the label lives on a backing device of `backing_size_bytes`, which is also the size of
/// the exported disk; `None` if the device is too small to hold a label and one block.
pub fn label_offset(backing_size_bytes: u64) -> Option<u64> {
    let aligned = backing_size_bytes / BLOCK_SIZE_BYTES * BLOCK_SIZE_BYTES;
    (aligned >= 2 * BLOCK_SIZE_BYTES).then(|| aligned - LABEL_SIZE_BYTES)
}

impl Label {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; LABEL_SIZE_BYTES as usize];
        put_u64(&mut b, 0, LABEL_MAGIC);
        b[8..24].copy_from_slice(&self.backing_uuid);
        put_u64(&mut b, 24, self.format_id);
        put_u64(&mut b, 32, self.exported_size_bytes);
        let crc = crc32c::crc32c(&b[..40]);
        put_u32(&mut b, 40, crc);
        b
    }

    /// `Ok(None)`: no label (magic absent). A label with our magic that fails its CRC is an error.
    pub fn decode(b: &[u8]) -> Result<Option<Label>> {
        if get_u64(b, 0) != LABEL_MAGIC {
            return Ok(None);
        }
        if get_u32(b, 40) != crc32c::crc32c(&b[..40]) {
            return Err(Error::Corruption("backing label checksum mismatch".into()));
        }
        Ok(Some(Label {
            backing_uuid: b[8..24].try_into().expect("16 bytes"),
            format_id: get_u64(b, 24),
            exported_size_bytes: get_u64(b, 32),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_corruption() {
        let l = Label {
            backing_uuid: [3; 16],
            format_id: 99,
            exported_size_bytes: 1 << 20,
        };
        let raw = l.encode();
        assert_eq!(Label::decode(&raw).unwrap(), Some(l));
        let mut bad = raw.clone();
        bad[20] ^= 1;
        assert!(Label::decode(&bad).is_err());
        assert_eq!(Label::decode(&[0u8; 4096]).unwrap(), None);
    }

    #[test]
    fn offset_is_the_last_whole_block() {
        assert_eq!(label_offset(1 << 20), Some((1 << 20) - 4096));
        assert_eq!(label_offset((1 << 20) + 512), Some((1 << 20) - 4096));
        assert_eq!(label_offset(4096), None);
    }
}
