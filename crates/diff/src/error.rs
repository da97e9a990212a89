//! Why bytes are not a valid `rbd diff v1` stream. Every variant names the stream byte where the
//! problem was found, so that a user can look at it (`cmp`, `xxd -s`).

use std::io;

/// A decoding error. Reading errors of the underlying reader are kept as [`DiffError::Read`].
#[derive(Debug, thiserror::Error)]
pub enum DiffError {
    #[error("reading the diff stream: {0}")]
    Read(#[source] io::Error),
    #[error("the stream is empty: not even a header")]
    Empty,
    #[error("not an rbd diff v1 stream: it starts with {found:?}, not \"rbd diff v1\\n\"")]
    NotADiff { found: String },
    #[error(
        "the stream is an rbd diff v2 (found only inside `rbd export --export-format 2`); \
         only v1, as `rbd export-diff` writes it, is supported"
    )]
    Version2,
    #[error("the stream ends early, at byte {at_byte}, in {inside}: it was cut short")]
    Truncated { at_byte: u64, inside: &'static str },
    #[error("unknown record tag {tag:#04x} at byte {at_byte}")]
    UnknownTag { tag: u8, at_byte: u64 },
    #[error(
        "a '{tag}' record at byte {at_byte} comes after a data record; the metadata records \
         (f, t, s) must all come first"
    )]
    MetadataAfterData { tag: char, at_byte: u64 },
    #[error("a second '{tag}' record at byte {at_byte}")]
    Duplicate { tag: char, at_byte: u64 },
    #[error("no size record ('s') before byte {at_byte}, where the data records begin")]
    MissingSize { at_byte: u64 },
    #[error("a snapshot name of {len_bytes} bytes{} (at most {} allowed)", at(*at_byte), crate::MAX_NAME_BYTES)]
    NameTooLong {
        len_bytes: u64,
        at_byte: Option<u64>,
    },
    #[error("a '{tag}' record at byte {at_byte} covers no bytes (offset {offset_bytes})")]
    EmptyRecord {
        tag: char,
        at_byte: u64,
        offset_bytes: u64,
    },
    #[error(
        "a '{tag}' record at byte {at_byte} (offset {offset_bytes}, length {length_bytes}) \
         starts before the previous record ends (at {previous_end_bytes}): records must be \
         sorted by offset and must not overlap"
    )]
    OutOfOrder {
        tag: char,
        at_byte: u64,
        offset_bytes: u64,
        length_bytes: u64,
        previous_end_bytes: u64,
    },
    #[error(
        "a '{tag}' record at byte {at_byte} (offset {offset_bytes}, length {length_bytes}) ends \
         past the image size, {size_bytes} bytes"
    )]
    PastEnd {
        tag: char,
        at_byte: u64,
        offset_bytes: u64,
        length_bytes: u64,
        size_bytes: u64,
    },
    #[error("bytes follow the end record ('e') at byte {at_byte}")]
    TrailingBytes { at_byte: u64 },
}

fn at(at_byte: Option<u64>) -> String {
    at_byte.map(|b| format!(" at byte {b}")).unwrap_or_default()
}
