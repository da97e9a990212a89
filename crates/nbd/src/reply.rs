//! Transmission-phase replies: the simple reply and structured reply chunks with their payloads.

use crate::consts::{
    REPLY_FLAG_DONE, REPLY_TYPE_BLOCK_STATUS, REPLY_TYPE_ERROR, REPLY_TYPE_ERROR_OFFSET,
    REPLY_TYPE_FLAG_ERROR, REPLY_TYPE_NONE, REPLY_TYPE_OFFSET_DATA, REPLY_TYPE_OFFSET_HOLE,
    SIMPLE_REPLY_HEADER_BYTES, SIMPLE_REPLY_MAGIC, STRUCTURED_REPLY_HEADER_BYTES,
    STRUCTURED_REPLY_MAGIC,
};
use crate::error::{ProtocolError, Result};
use crate::wire::{check_string_length, to_u16, to_u32, Reader};

/// Bytes of an `OFFSET_DATA` chunk before its data: header plus the 8-byte offset.
pub const OFFSET_DATA_PREFIX_BYTES: usize = STRUCTURED_REPLY_HEADER_BYTES + 8;
/// Bytes of a whole `OFFSET_HOLE` chunk: header, offset and hole length.
pub const OFFSET_HOLE_CHUNK_BYTES: usize = STRUCTURED_REPLY_HEADER_BYTES + 12;

/// A simple reply header; for a successful read, the data follows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimpleReply {
    /// Wire errno (see `consts::E*`); zero for success.
    pub error: u32,
    pub cookie: u64,
}

impl SimpleReply {
    pub fn encode(&self) -> [u8; SIMPLE_REPLY_HEADER_BYTES] {
        let mut out = [0u8; SIMPLE_REPLY_HEADER_BYTES];
        out[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
        out[4..8].copy_from_slice(&self.error.to_be_bytes());
        out[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        out
    }

    /// Decodes a header (client side, and for tests).
    pub fn decode(bytes: &[u8; SIMPLE_REPLY_HEADER_BYTES]) -> Result<Self> {
        let mut reader = Reader::new(bytes, "simple reply");
        expect_magic32(&mut reader, SIMPLE_REPLY_MAGIC, "simple reply")?;
        Ok(Self {
            error: reader.u32()?,
            cookie: reader.u64()?,
        })
    }
}

/// A structured reply chunk header; `length_bytes` of payload follow it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkHeader {
    /// `REPLY_FLAG_DONE` marks the last chunk of a reply.
    pub flags: u16,
    /// One of the `REPLY_TYPE_*` constants.
    pub reply_type: u16,
    pub cookie: u64,
    pub length_bytes: u32,
}

impl ChunkHeader {
    pub fn encode(&self) -> [u8; STRUCTURED_REPLY_HEADER_BYTES] {
        let mut out = [0u8; STRUCTURED_REPLY_HEADER_BYTES];
        out[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
        out[4..6].copy_from_slice(&self.flags.to_be_bytes());
        out[6..8].copy_from_slice(&self.reply_type.to_be_bytes());
        out[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        out[16..20].copy_from_slice(&self.length_bytes.to_be_bytes());
        out
    }

    /// Decodes a header (client side, and for tests).
    pub fn decode(bytes: &[u8; STRUCTURED_REPLY_HEADER_BYTES]) -> Result<Self> {
        let mut reader = Reader::new(bytes, "structured reply chunk");
        expect_magic32(
            &mut reader,
            STRUCTURED_REPLY_MAGIC,
            "structured reply chunk",
        )?;
        Ok(Self {
            flags: reader.u16()?,
            reply_type: reader.u16()?,
            cookie: reader.u64()?,
            length_bytes: reader.u32()?,
        })
    }

    pub fn is_done(&self) -> bool {
        self.flags & REPLY_FLAG_DONE != 0
    }

    pub fn is_error(&self) -> bool {
        self.reply_type & REPLY_TYPE_FLAG_ERROR != 0
    }
}

/// `NONE` chunk: ends a reply with nothing more to say; the spec requires `DONE` on it.
pub fn encode_none_chunk(cookie: u64) -> [u8; STRUCTURED_REPLY_HEADER_BYTES] {
    ChunkHeader {
        flags: REPLY_FLAG_DONE,
        reply_type: REPLY_TYPE_NONE,
        cookie,
        length_bytes: 0,
    }
    .encode()
}

/// Header and offset of an `OFFSET_DATA` chunk; the caller sends `data_length_bytes` of data
/// right after, which avoids copying read buffers into a new vector.
pub fn encode_offset_data_prefix(
    flags: u16,
    cookie: u64,
    offset_bytes: u64,
    data_length_bytes: u32,
) -> Result<[u8; OFFSET_DATA_PREFIX_BYTES]> {
    // The spec requires at least one data byte, and the 8-byte offset must still fit a u32 length.
    let length_bytes = data_length_bytes
        .checked_add(8)
        .filter(|_| data_length_bytes > 0)
        .ok_or(ProtocolError::BadLength {
            what: "offset data chunk",
            length_bytes: u64::from(data_length_bytes) + 8,
        })?;
    let header = ChunkHeader {
        flags,
        reply_type: REPLY_TYPE_OFFSET_DATA,
        cookie,
        length_bytes,
    };
    let mut out = [0u8; OFFSET_DATA_PREFIX_BYTES];
    out[..STRUCTURED_REPLY_HEADER_BYTES].copy_from_slice(&header.encode());
    out[STRUCTURED_REPLY_HEADER_BYTES..].copy_from_slice(&offset_bytes.to_be_bytes());
    Ok(out)
}

/// Splits an `OFFSET_DATA` payload into its offset and data.
pub fn decode_offset_data_payload(payload: &[u8]) -> Result<(u64, &[u8])> {
    let mut reader = Reader::new(payload, "offset data chunk");
    let offset_bytes = reader.u64()?;
    if reader.remaining_bytes() == 0 {
        return Err(ProtocolError::BadLength {
            what: "offset data chunk",
            length_bytes: payload.len() as u64,
        });
    }
    Ok((offset_bytes, reader.take(reader.remaining_bytes())?))
}

/// A whole `OFFSET_HOLE` chunk: `hole_length_bytes` at `offset_bytes` read as zeroes.
pub fn encode_offset_hole_chunk(
    flags: u16,
    cookie: u64,
    offset_bytes: u64,
    hole_length_bytes: u32,
) -> Result<[u8; OFFSET_HOLE_CHUNK_BYTES]> {
    if hole_length_bytes == 0 {
        return Err(ProtocolError::BadLength {
            what: "offset hole",
            length_bytes: 0,
        });
    }
    let header = ChunkHeader {
        flags,
        reply_type: REPLY_TYPE_OFFSET_HOLE,
        cookie,
        length_bytes: 12,
    };
    let mut out = [0u8; OFFSET_HOLE_CHUNK_BYTES];
    out[..STRUCTURED_REPLY_HEADER_BYTES].copy_from_slice(&header.encode());
    out[20..28].copy_from_slice(&offset_bytes.to_be_bytes());
    out[28..32].copy_from_slice(&hole_length_bytes.to_be_bytes());
    Ok(out)
}

/// Decodes an `OFFSET_HOLE` payload into (offset, hole length).
pub fn decode_offset_hole_payload(payload: &[u8]) -> Result<(u64, u32)> {
    let mut reader = Reader::new(payload, "offset hole chunk");
    let offset_bytes = reader.u64()?;
    let hole_length_bytes = reader.u32()?;
    reader.finish()?;
    if hole_length_bytes == 0 {
        return Err(ProtocolError::BadLength {
            what: "offset hole",
            length_bytes: 0,
        });
    }
    Ok((offset_bytes, hole_length_bytes))
}

/// Payload of an `ERROR` or `ERROR_OFFSET` chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorPayload {
    /// Wire errno; the spec requires non-zero.
    pub error: u32,
    pub message: String,
    /// Present for `ERROR_OFFSET`: where the error happened.
    pub offset_bytes: Option<u64>,
}

impl ErrorPayload {
    /// The chunk type this payload is sent as.
    pub fn reply_type(&self) -> u16 {
        match self.offset_bytes {
            Some(_) => REPLY_TYPE_ERROR_OFFSET,
            None => REPLY_TYPE_ERROR,
        }
    }

    /// Encodes a whole error chunk (header and payload).
    pub fn encode_chunk(&self, flags: u16, cookie: u64) -> Result<Vec<u8>> {
        if self.error == 0 {
            return Err(ProtocolError::InvalidValue {
                what: "error chunk errno",
                value: 0,
            });
        }
        check_string_length(self.message.len(), "error message")?;
        let message_length_bytes = to_u16(self.message.len(), "error message")?;
        let mut payload = Vec::with_capacity(14 + self.message.len());
        payload.extend_from_slice(&self.error.to_be_bytes());
        payload.extend_from_slice(&message_length_bytes.to_be_bytes());
        payload.extend_from_slice(self.message.as_bytes());
        if let Some(offset_bytes) = self.offset_bytes {
            payload.extend_from_slice(&offset_bytes.to_be_bytes());
        }
        encode_chunk(flags, self.reply_type(), cookie, &payload)
    }

    /// Decodes the payload of a chunk of `reply_type` `ERROR` or `ERROR_OFFSET`.
    pub fn decode(reply_type: u16, payload: &[u8]) -> Result<Self> {
        let mut reader = Reader::new(payload, "error chunk");
        let error = reader.u32()?;
        let message_length_bytes = reader.u16()?;
        let message = reader.string(usize::from(message_length_bytes), "error message")?;
        let offset_bytes = match reply_type {
            REPLY_TYPE_ERROR_OFFSET => Some(reader.u64()?),
            _ => None,
        };
        reader.finish()?;
        Ok(Self {
            error,
            message,
            offset_bytes,
        })
    }
}

/// One extent in a `BLOCK_STATUS` chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockDescriptor {
    /// Must be non-zero per the spec.
    pub length_bytes: u32,
    /// Context-specific flags, e.g. `STATE_HOLE | STATE_ZERO` for `base:allocation`.
    pub status_flags: u32,
}

/// A whole `BLOCK_STATUS` chunk for one metadata context.
pub fn encode_block_status_chunk(
    flags: u16,
    cookie: u64,
    context_id: u32,
    descriptors: &[BlockDescriptor],
) -> Result<Vec<u8>> {
    // The spec requires at least one descriptor, each with a non-zero length.
    if descriptors.is_empty() || descriptors.iter().any(|d| d.length_bytes == 0) {
        return Err(ProtocolError::BadLength {
            what: "block status chunk",
            length_bytes: 4 + 8 * descriptors.len() as u64,
        });
    }
    let mut payload = Vec::with_capacity(4 + 8 * descriptors.len());
    payload.extend_from_slice(&context_id.to_be_bytes());
    for descriptor in descriptors {
        payload.extend_from_slice(&descriptor.length_bytes.to_be_bytes());
        payload.extend_from_slice(&descriptor.status_flags.to_be_bytes());
    }
    encode_chunk(flags, REPLY_TYPE_BLOCK_STATUS, cookie, &payload)
}

/// Decodes a `BLOCK_STATUS` payload into its context id and descriptors.
pub fn decode_block_status_payload(payload: &[u8]) -> Result<(u32, Vec<BlockDescriptor>)> {
    let descriptors_bytes = payload.len().checked_sub(4);
    if !descriptors_bytes.is_some_and(|bytes| bytes > 0 && bytes % 8 == 0) {
        return Err(ProtocolError::BadLength {
            what: "block status chunk",
            length_bytes: payload.len() as u64,
        });
    }
    let mut reader = Reader::new(payload, "block status chunk");
    let context_id = reader.u32()?;
    let mut descriptors = Vec::with_capacity(reader.remaining_bytes() / 8);
    while reader.remaining_bytes() > 0 {
        descriptors.push(BlockDescriptor {
            length_bytes: reader.u32()?,
            status_flags: reader.u32()?,
        });
    }
    Ok((context_id, descriptors))
}

/// Encodes a chunk header followed by `payload`.
pub fn encode_chunk(flags: u16, reply_type: u16, cookie: u64, payload: &[u8]) -> Result<Vec<u8>> {
    let header = ChunkHeader {
        flags,
        reply_type,
        cookie,
        length_bytes: to_u32(payload.len(), "structured reply payload")?,
    };
    let mut out = Vec::with_capacity(STRUCTURED_REPLY_HEADER_BYTES + payload.len());
    out.extend_from_slice(&header.encode());
    out.extend_from_slice(payload);
    Ok(out)
}

fn expect_magic32(reader: &mut Reader<'_>, expected: u32, what: &'static str) -> Result<()> {
    let actual = reader.u32()?;
    if actual != expected {
        return Err(ProtocolError::BadMagic {
            what,
            expected: u64::from(expected),
            actual: u64::from(actual),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consts::{EINVAL, EIO, STATE_HOLE, STATE_ZERO};

    fn split(chunk: &[u8]) -> (ChunkHeader, &[u8]) {
        let header: [u8; STRUCTURED_REPLY_HEADER_BYTES] =
            chunk[..STRUCTURED_REPLY_HEADER_BYTES].try_into().unwrap();
        let header = ChunkHeader::decode(&header).unwrap();
        let payload = &chunk[STRUCTURED_REPLY_HEADER_BYTES..];
        assert_eq!(header.length_bytes as usize, payload.len());
        (header, payload)
    }

    #[test]
    fn simple_reply_has_exact_bytes_and_round_trips() {
        let reply = SimpleReply {
            error: EIO,
            cookie: 0xdead_beef,
        };
        let bytes = reply.encode();
        assert_eq!(
            bytes,
            [0x67, 0x44, 0x66, 0x98, 0, 0, 0, 5, 0, 0, 0, 0, 0xde, 0xad, 0xbe, 0xef]
        );
        assert_eq!(SimpleReply::decode(&bytes), Ok(reply));
        let mut bad = bytes;
        bad[3] = 0;
        assert!(matches!(
            SimpleReply::decode(&bad),
            Err(ProtocolError::BadMagic { .. })
        ));
    }

    #[test]
    fn offset_data_prefix_has_exact_bytes() {
        let prefix = encode_offset_data_prefix(REPLY_FLAG_DONE, 7, 0x200, 4).unwrap();
        let expected: [u8; 28] = [
            0x66, 0x8e, 0x33, 0xef, // magic
            0, 1, // DONE
            0, 1, // OFFSET_DATA
            0, 0, 0, 0, 0, 0, 0, 7, // cookie
            0, 0, 0, 12, // length = 8 + 4
            0, 0, 0, 0, 0, 0, 2, 0, // offset
        ];
        assert_eq!(prefix, expected);
        let mut chunk = prefix.to_vec();
        chunk.extend_from_slice(b"data");
        let (header, payload) = split(&chunk);
        assert!(header.is_done() && !header.is_error());
        assert_eq!(
            decode_offset_data_payload(payload),
            Ok((0x200, &b"data"[..]))
        );
    }

    #[test]
    fn offset_data_rejects_empty_and_overflowing_lengths() {
        assert!(encode_offset_data_prefix(0, 1, 0, 0).is_err());
        assert!(encode_offset_data_prefix(0, 1, 0, u32::MAX - 7).is_err());
        assert!(encode_offset_data_prefix(0, 1, 0, u32::MAX - 8).is_ok());
        assert!(decode_offset_data_payload(&[0; 8]).is_err());
        assert!(decode_offset_data_payload(&[0; 3]).is_err());
    }

    #[test]
    fn offset_hole_round_trips() {
        let chunk = encode_offset_hole_chunk(0, 9, 4096, 8192).unwrap();
        let (header, payload) = split(&chunk);
        assert_eq!(header.reply_type, REPLY_TYPE_OFFSET_HOLE);
        assert_eq!(header.cookie, 9);
        assert_eq!(decode_offset_hole_payload(payload), Ok((4096, 8192)));
        assert!(encode_offset_hole_chunk(0, 9, 4096, 0).is_err());
        assert!(decode_offset_hole_payload(&payload[..11]).is_err());
        assert!(decode_offset_hole_payload(&[0; 12]).is_err());
    }

    #[test]
    fn none_chunk_is_done_with_no_payload() {
        let chunk = encode_none_chunk(3);
        let (header, payload) = split(&chunk);
        assert_eq!(header.reply_type, REPLY_TYPE_NONE);
        assert!(header.is_done());
        assert!(payload.is_empty());
    }

    #[test]
    fn error_chunks_round_trip() {
        for offset_bytes in [None, Some(1 << 40)] {
            let error = ErrorPayload {
                error: EINVAL,
                message: "bad range".to_owned(),
                offset_bytes,
            };
            let chunk = error.encode_chunk(REPLY_FLAG_DONE, 5).unwrap();
            let (header, payload) = split(&chunk);
            assert!(header.is_error());
            assert_eq!(&payload[..6], &[0, 0, 0, 22, 0, 9]);
            assert_eq!(ErrorPayload::decode(header.reply_type, payload), Ok(error));
        }
        let zero = ErrorPayload {
            error: 0,
            message: String::new(),
            offset_bytes: None,
        };
        assert!(zero.encode_chunk(0, 1).is_err());
    }

    #[test]
    fn error_chunk_decode_rejects_lying_message_length() {
        // Message length 0xffff with a 1-byte message.
        let payload = [0, 0, 0, 5, 0xff, 0xff, b'x'];
        assert!(ErrorPayload::decode(REPLY_TYPE_ERROR, &payload).is_err());
        // ERROR_OFFSET missing its offset.
        let payload = [0, 0, 0, 5, 0, 1, b'x'];
        assert!(ErrorPayload::decode(REPLY_TYPE_ERROR_OFFSET, &payload).is_err());
        // Messages must be valid NBD strings.
        let payload = [0, 0, 0, 5, 0, 1, 0];
        assert!(matches!(
            ErrorPayload::decode(REPLY_TYPE_ERROR, &payload),
            Err(ProtocolError::InvalidString { .. })
        ));
    }

    #[test]
    fn block_status_round_trips_and_validates() {
        let descriptors = [
            BlockDescriptor {
                length_bytes: 65536,
                status_flags: 0,
            },
            BlockDescriptor {
                length_bytes: 4096,
                status_flags: STATE_HOLE | STATE_ZERO,
            },
        ];
        let chunk = encode_block_status_chunk(REPLY_FLAG_DONE, 11, 1, &descriptors).unwrap();
        let (header, payload) = split(&chunk);
        assert_eq!(header.reply_type, REPLY_TYPE_BLOCK_STATUS);
        assert_eq!(payload.len(), 4 + 16);
        assert_eq!(
            decode_block_status_payload(payload),
            Ok((1, descriptors.to_vec()))
        );
        assert!(encode_block_status_chunk(0, 1, 1, &[]).is_err());
        assert!(decode_block_status_payload(&payload[..4]).is_err());
        assert!(decode_block_status_payload(&payload[..19]).is_err());
        assert!(decode_block_status_payload(&[]).is_err());
    }

    #[test]
    fn chunk_header_rejects_bad_magic() {
        let mut bytes = encode_none_chunk(1);
        bytes[0] = 0x67;
        assert!(matches!(
            ChunkHeader::decode(&bytes),
            Err(ProtocolError::BadMagic { .. })
        ));
    }
}
