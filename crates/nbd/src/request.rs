//! Transmission-phase requests: the 28-byte header and its typed form.

use crate::consts::{
    CMD_BLOCK_STATUS, CMD_CACHE, CMD_DISC, CMD_FLAG_DF, CMD_FLAG_FAST_ZERO, CMD_FLAG_FUA,
    CMD_FLAG_NO_HOLE, CMD_FLAG_REQ_ONE, CMD_FLUSH, CMD_READ, CMD_RESIZE, CMD_TRIM, CMD_WRITE,
    CMD_WRITE_ZEROES, REQUEST_HEADER_BYTES, REQUEST_MAGIC,
};
use crate::error::{ProtocolError, Result};
use crate::wire::Reader;

/// A request type. Unknown values decode rather than fail, so the server can answer `EINVAL`
/// and keep the connection instead of losing its place in the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Command {
    Read,
    Write,
    Disconnect,
    Flush,
    Trim,
    Cache,
    WriteZeroes,
    BlockStatus,
    Resize,
    Unknown(u16),
}

impl Command {
    pub fn from_wire(value: u16) -> Self {
        match value {
            CMD_READ => Command::Read,
            CMD_WRITE => Command::Write,
            CMD_DISC => Command::Disconnect,
            CMD_FLUSH => Command::Flush,
            CMD_TRIM => Command::Trim,
            CMD_CACHE => Command::Cache,
            CMD_WRITE_ZEROES => Command::WriteZeroes,
            CMD_BLOCK_STATUS => Command::BlockStatus,
            CMD_RESIZE => Command::Resize,
            other => Command::Unknown(other),
        }
    }

    pub fn to_wire(self) -> u16 {
        match self {
            Command::Read => CMD_READ,
            Command::Write => CMD_WRITE,
            Command::Disconnect => CMD_DISC,
            Command::Flush => CMD_FLUSH,
            Command::Trim => CMD_TRIM,
            Command::Cache => CMD_CACHE,
            Command::WriteZeroes => CMD_WRITE_ZEROES,
            Command::BlockStatus => CMD_BLOCK_STATUS,
            Command::Resize => CMD_RESIZE,
            Command::Unknown(other) => other,
        }
    }

    /// Command flags the spec documents for this command (FUA is valid on all of them).
    pub fn permitted_flags(self) -> u16 {
        match self {
            Command::Read => CMD_FLAG_FUA | CMD_FLAG_DF,
            Command::WriteZeroes => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
            Command::BlockStatus => CMD_FLAG_FUA | CMD_FLAG_REQ_ONE,
            _ => CMD_FLAG_FUA,
        }
    }
}

/// A decoded request header. For `Write`, `length_bytes` of data follow on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Raw `CMD_FLAG_*` bits, kept raw so unknown bits are visible to validation.
    pub flags: u16,
    pub command: Command,
    /// Opaque client value echoed in every reply to this request.
    pub cookie: u64,
    pub offset_bytes: u64,
    pub length_bytes: u32,
}

impl Request {
    /// Decodes a request header. Only a wrong magic fails: every other field value is
    /// representable, and judging it is left to the validation helpers and the server.
    pub fn decode(bytes: &[u8; REQUEST_HEADER_BYTES]) -> Result<Self> {
        let mut reader = Reader::new(bytes, "request header");
        let magic = reader.u32()?;
        if magic != REQUEST_MAGIC {
            return Err(ProtocolError::BadMagic {
                what: "request header",
                expected: u64::from(REQUEST_MAGIC),
                actual: u64::from(magic),
            });
        }
        Ok(Self {
            flags: reader.u16()?,
            command: Command::from_wire(reader.u16()?),
            cookie: reader.u64()?,
            offset_bytes: reader.u64()?,
            length_bytes: reader.u32()?,
        })
    }

    /// Decodes a header from the front of `bytes`, returning it and the bytes consumed.
    pub fn decode_prefix(bytes: &[u8]) -> Result<(Self, usize)> {
        let header: &[u8; REQUEST_HEADER_BYTES] = bytes
            .get(..REQUEST_HEADER_BYTES)
            .and_then(|prefix| prefix.try_into().ok())
            .ok_or(ProtocolError::Truncated {
                what: "request header",
                needed_bytes: REQUEST_HEADER_BYTES,
                available_bytes: bytes.len(),
            })?;
        Ok((Self::decode(header)?, REQUEST_HEADER_BYTES))
    }

    /// Encodes the header (client side, and for tests).
    pub fn encode(&self) -> [u8; REQUEST_HEADER_BYTES] {
        let mut out = [0u8; REQUEST_HEADER_BYTES];
        out[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        out[4..6].copy_from_slice(&self.flags.to_be_bytes());
        out[6..8].copy_from_slice(&self.command.to_wire().to_be_bytes());
        out[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        out[16..24].copy_from_slice(&self.offset_bytes.to_be_bytes());
        out[24..28].copy_from_slice(&self.length_bytes.to_be_bytes());
        out
    }

    pub fn has_flag(&self, flag: u16) -> bool {
        self.flags & flag != 0
    }

    /// Flag bits set that the spec does not document for this command (non-zero → `EINVAL`).
    pub fn unexpected_flags(&self) -> u16 {
        self.flags & !self.command.permitted_flags()
    }

    /// Bytes of data that follow this header on the wire; the server must read (or discard)
    /// them even when it rejects the request, or the stream desynchronises.
    pub fn payload_length_bytes(&self) -> u32 {
        match self.command {
            Command::Write => self.length_bytes,
            _ => 0,
        }
    }

    /// One past the last byte addressed, or `None` if `offset + length` overflows u64.
    pub fn end_offset_bytes(&self) -> Option<u64> {
        self.offset_bytes.checked_add(u64::from(self.length_bytes))
    }

    /// Whether the addressed range lies inside an export of `export_size_bytes`.
    pub fn within_export(&self, export_size_bytes: u64) -> bool {
        self.end_offset_bytes()
            .is_some_and(|end| end <= export_size_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_request() -> Request {
        Request {
            flags: CMD_FLAG_FUA,
            command: Command::Write,
            cookie: 0x0102_0304_0506_0708,
            offset_bytes: 4096,
            length_bytes: 512,
        }
    }

    #[test]
    fn request_header_has_exact_bytes_and_round_trips() {
        let request = write_request();
        let bytes = request.encode();
        let expected: [u8; 28] = [
            0x25, 0x60, 0x95, 0x13, // magic
            0, 1, // FUA
            0, 1, // WRITE
            1, 2, 3, 4, 5, 6, 7, 8, // cookie
            0, 0, 0, 0, 0, 0, 0x10, 0, // offset
            0, 0, 2, 0, // length
        ];
        assert_eq!(bytes, expected);
        assert_eq!(Request::decode(&bytes), Ok(request));
    }

    #[test]
    fn every_command_round_trips_through_the_wire_value() {
        for value in 0..=20u16 {
            let command = Command::from_wire(value);
            assert_eq!(command.to_wire(), value);
            assert_eq!(matches!(command, Command::Unknown(_)), value > CMD_RESIZE);
        }
    }

    #[test]
    fn unknown_command_decodes_as_unknown() {
        let mut bytes = write_request().encode();
        bytes[6..8].copy_from_slice(&0xbeefu16.to_be_bytes());
        let request = Request::decode(&bytes).unwrap();
        assert_eq!(request.command, Command::Unknown(0xbeef));
        assert_eq!(request.payload_length_bytes(), 0);
    }

    #[test]
    fn wrong_magic_and_truncation_are_errors() {
        let mut bytes = write_request().encode();
        bytes[0] = 0x12;
        assert!(matches!(
            Request::decode(&bytes),
            Err(ProtocolError::BadMagic { .. })
        ));
        let good = write_request().encode();
        assert!(matches!(
            Request::decode_prefix(&good[..27]),
            Err(ProtocolError::Truncated {
                needed_bytes: 28,
                available_bytes: 27,
                ..
            })
        ));
        let mut longer = good.to_vec();
        longer.extend_from_slice(&[0xaa; 4]);
        assert_eq!(
            Request::decode_prefix(&longer),
            Ok((write_request(), REQUEST_HEADER_BYTES))
        );
    }

    #[test]
    fn validation_helpers() {
        let mut request = write_request();
        assert!(request.has_flag(CMD_FLAG_FUA));
        assert_eq!(request.payload_length_bytes(), 512);
        assert_eq!(request.unexpected_flags(), 0);
        request.flags |= CMD_FLAG_DF;
        assert_eq!(request.unexpected_flags(), CMD_FLAG_DF);
        request.command = Command::Read;
        assert_eq!(request.unexpected_flags(), 0);
        assert_eq!(request.payload_length_bytes(), 0);

        assert_eq!(request.end_offset_bytes(), Some(4608));
        assert!(request.within_export(4608));
        assert!(!request.within_export(4607));
        request.offset_bytes = u64::MAX;
        assert_eq!(request.end_offset_bytes(), None);
        assert!(!request.within_export(u64::MAX));
    }
}
