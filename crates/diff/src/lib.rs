//! The `rbd diff v1` stream: the changes between two states of a disk image, as Ceph's
//! `rbd export-diff` writes and `rbd import-diff` applies it (Ceph's `doc/dev/rbd-diff.rst`).
//! A pure codec: bytes in through [`std::io::Read`], bytes out through [`std::io::Write`], no
//! other IO; applying a stream to a device is the CLI's job (`logcache import-diff`).
//!
//! The stream is a header, metadata records (from-snapshot name, to-snapshot name, image
//! size), data records (bytes written at an offset, or a range that reads as zeros), and an end
//! record; [`encode`] draws the byte layout. Both sides hold the stream to WalB's *wdiff*
//! property: data records sorted by offset, none overlapping another, none past the image size.
//! The encoder asserts it (a violation is a bug in the caller); the decoder refuses a stream
//! that breaks it with a typed [`DiffError`] naming the byte where it went wrong.

pub mod decode;
pub mod encode;
mod error;

pub use decode::{Decoder, Piece};
pub use encode::Encoder;
pub use error::DiffError;

/// The first bytes of every v1 stream.
pub const MAGIC_V1: &[u8; 12] = b"rbd diff v1\n";
/// The first bytes of a v2 stream (only inside `rbd export --export-format 2`), to name it
/// when refused.
pub const MAGIC_V2: &[u8; 12] = b"rbd diff v2\n";

/// Record tags (one byte each).
pub const TAG_FROM_SNAP: u8 = b'f';
pub const TAG_TO_SNAP: u8 = b't';
pub const TAG_SIZE: u8 = b's';
pub const TAG_DATA: u8 = b'w';
pub const TAG_ZERO: u8 = b'z';
pub const TAG_END: u8 = b'e';

/// The longest snapshot name accepted. The format allows 4 GiB; a hostile stream must not make
/// the decoder allocate that, and no real snapshot name comes near it.
pub const MAX_NAME_BYTES: usize = 4096;

/// The metadata of a stream: what it applies to and what it produces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// The snapshot (or checkpoint) the changes are relative to; `None` for a diff from an
    /// empty image (every byte that is not zero is in the stream).
    pub from_snap: Option<Vec<u8>>,
    /// The snapshot (or checkpoint) the changes lead to; `None` for the image's head.
    pub to_snap: Option<Vec<u8>>,
    /// The image's size after the changes, in bytes.
    pub size_bytes: u64,
}

/// Checks a snapshot name against [`MAX_NAME_BYTES`], so that callers can refuse a name
/// before the encoder asserts on it.
pub fn check_name(name: &[u8]) -> Result<(), DiffError> {
    if name.len() > MAX_NAME_BYTES {
        return Err(DiffError::NameTooLong {
            len_bytes: name.len() as u64,
            at_byte: None,
        });
    }
    Ok(())
}

/// A name as text for messages (names are bytes in the format; Ceph's are UTF-8 in practice).
pub fn name_text(name: &[u8]) -> String {
    String::from_utf8_lossy(name).into_owned()
}
