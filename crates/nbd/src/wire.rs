//! Bounds-checked big-endian cursor used by every decoder, so no decoder can index out of range.

use crate::consts::MAX_STRING_BYTES;
use crate::error::{ProtocolError, Result};

/// Reads big-endian fields from a slice, failing with `Truncated` instead of panicking.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    position: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    /// `what` names the message in errors so a log line says which message was malformed.
    pub(crate) fn new(bytes: &'a [u8], what: &'static str) -> Self {
        Self {
            bytes,
            position: 0,
            what,
        }
    }

    pub(crate) fn remaining_bytes(&self) -> usize {
        self.bytes.len() - self.position
    }

    pub(crate) fn take(&mut self, length_bytes: usize) -> Result<&'a [u8]> {
        let available_bytes = self.remaining_bytes();
        if length_bytes > available_bytes {
            return Err(ProtocolError::Truncated {
                what: self.what,
                needed_bytes: length_bytes,
                available_bytes,
            });
        }
        let start = self.position;
        self.position += length_bytes;
        Ok(&self.bytes[start..self.position])
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    pub(crate) fn u16(&mut self) -> Result<u16> {
        self.array().map(u16::from_be_bytes)
    }

    pub(crate) fn u32(&mut self) -> Result<u32> {
        self.array().map(u32::from_be_bytes)
    }

    pub(crate) fn u64(&mut self) -> Result<u64> {
        self.array().map(u64::from_be_bytes)
    }

    /// Reads a string whose length was announced elsewhere; the length is checked against the
    /// 4096-byte limit before touching the data.
    pub(crate) fn string(&mut self, length_bytes: usize, what: &'static str) -> Result<String> {
        let bytes = self.take(length_bytes)?;
        validate_string(bytes, what).map(str::to_owned)
    }

    /// Reads a string prefixed by a u32 length, as in option payloads.
    pub(crate) fn u32_prefixed_string(&mut self, what: &'static str) -> Result<String> {
        let length_bytes = self.u32()?;
        self.string(length_bytes as usize, what)
    }

    /// Fails unless every byte was consumed; the spec treats extra bytes as a malformed message.
    pub(crate) fn finish(&self) -> Result<()> {
        match self.remaining_bytes() {
            0 => Ok(()),
            extra_bytes => Err(ProtocolError::TrailingBytes {
                what: self.what,
                extra_bytes,
            }),
        }
    }
}

/// Checks a byte string against the spec's string rules: at most 4096 bytes, UTF-8, no NUL.
pub(crate) fn validate_string<'b>(bytes: &'b [u8], what: &'static str) -> Result<&'b str> {
    check_string_length(bytes.len(), what)?;
    let text = std::str::from_utf8(bytes).map_err(|_| ProtocolError::InvalidString { what })?;
    if text.contains('\0') {
        return Err(ProtocolError::InvalidString { what });
    }
    Ok(text)
}

pub(crate) fn check_string_length(length_bytes: usize, what: &'static str) -> Result<()> {
    if length_bytes > MAX_STRING_BYTES {
        return Err(ProtocolError::StringTooLong {
            what,
            length_bytes,
            max_bytes: MAX_STRING_BYTES,
        });
    }
    Ok(())
}

/// Converts a length to a u32 wire field, failing instead of truncating.
pub(crate) fn to_u32(value: usize, what: &'static str) -> Result<u32> {
    u32::try_from(value).map_err(|_| ProtocolError::FieldOverflow {
        what,
        value: value as u64,
    })
}

/// Converts a length to a u16 wire field, failing instead of truncating.
pub(crate) fn to_u16(value: usize, what: &'static str) -> Result<u16> {
    u16::try_from(value).map_err(|_| ProtocolError::FieldOverflow {
        what,
        value: value as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_big_endian_fields_and_reports_truncation() {
        let bytes = [0x12, 0x34, 0, 0, 0, 1, 9];
        let mut reader = Reader::new(&bytes, "test");
        assert_eq!(reader.u16().unwrap(), 0x1234);
        assert_eq!(reader.u32().unwrap(), 1);
        assert_eq!(reader.remaining_bytes(), 1);
        assert_eq!(
            reader.u16(),
            Err(ProtocolError::Truncated {
                what: "test",
                needed_bytes: 2,
                available_bytes: 1
            })
        );
        assert!(matches!(
            reader.finish(),
            Err(ProtocolError::TrailingBytes { extra_bytes: 1, .. })
        ));
    }

    #[test]
    fn rejects_bad_strings() {
        assert!(validate_string(b"ok", "s").is_ok());
        assert!(validate_string(b"a\0b", "s").is_err());
        assert!(validate_string(&[0xff, 0xfe], "s").is_err());
        assert!(matches!(
            validate_string(&[b'a'; MAX_STRING_BYTES + 1], "s"),
            Err(ProtocolError::StringTooLong { .. })
        ));
    }

    #[test]
    fn huge_announced_string_length_is_an_error_not_an_allocation() {
        let bytes = u32::MAX.to_be_bytes();
        let mut reader = Reader::new(&bytes, "test");
        assert!(matches!(
            reader.u32_prefixed_string("name"),
            Err(ProtocolError::Truncated { .. })
        ));
    }
}
