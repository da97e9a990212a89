//! The one error type for every protocol decode or encode failure.

use thiserror::Error;

/// Why bytes could not be decoded, or a message could not be encoded.
///
/// Decoders return these for anything a peer could send; the server decides whether a given error
/// means "reply with an error code" or "drop the connection".
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ProtocolError {
    /// The input ended before the field being read.
    #[error("truncated {what}: needed {needed_bytes} bytes, only {available_bytes} available")]
    Truncated {
        what: &'static str,
        needed_bytes: usize,
        available_bytes: usize,
    },
    /// A magic number did not match, so the stream is not (or no longer) NBD.
    #[error("bad magic in {what}: expected {expected:#x}, got {actual:#x}")]
    BadMagic {
        what: &'static str,
        expected: u64,
        actual: u64,
    },
    /// An option's announced length exceeds what we are willing to buffer.
    #[error("option length {length_bytes} bytes exceeds the limit of {max_bytes} bytes")]
    OptionTooLong { length_bytes: u32, max_bytes: u32 },
    /// The client set flags we do not know or did not advertise (the spec says to disconnect).
    #[error("client flags {flags:#x} contain unknown or unadvertised bits {rejected:#x}")]
    BadClientFlags { flags: u32, rejected: u32 },
    /// A string exceeds the spec's 4096-byte limit.
    #[error("{what} is {length_bytes} bytes, over the {max_bytes}-byte limit")]
    StringTooLong {
        what: &'static str,
        length_bytes: usize,
        max_bytes: usize,
    },
    /// A string is not UTF-8 or contains NUL, both forbidden by the spec.
    #[error("{what} is not a valid NBD string (UTF-8 without NUL)")]
    InvalidString { what: &'static str },
    /// A message carried bytes beyond its last field.
    #[error("{what} has {extra_bytes} unexpected trailing bytes")]
    TrailingBytes {
        what: &'static str,
        extra_bytes: usize,
    },
    /// A length or count does not fit the wire field that must carry it.
    #[error("{what} of {value} does not fit its wire field")]
    FieldOverflow { what: &'static str, value: u64 },
    /// A header's length field is impossible for its message type.
    #[error("{what} has invalid length {length_bytes} bytes")]
    BadLength {
        what: &'static str,
        length_bytes: u64,
    },
    /// A field holds a value the spec forbids (e.g. a zero errno in an error chunk).
    #[error("{what} has forbidden value {value}")]
    InvalidValue { what: &'static str, value: u64 },
    /// An option error reply was requested with a reply type lacking bit 31.
    #[error("reply type {reply_type:#x} is not an error type")]
    NotAnErrorType { reply_type: u32 },
}

/// Result alias used throughout the crate.
pub type Result<T> = std::result::Result<T, ProtocolError>;
