//! Option replies the server sends during fixed-newstyle haggling, and the old-style
//! `OPT_EXPORT_NAME` reply.

use crate::consts::{
    EXPORT_NAME_REPLY_BYTES, EXPORT_NAME_ZEROES_BYTES, INFO_BLOCK_SIZE, INFO_DESCRIPTION,
    INFO_EXPORT, INFO_NAME, OPTION_REPLY_HEADER_BYTES, OPTION_REPLY_MAGIC, REP_ACK, REP_FLAG_ERROR,
    REP_INFO, REP_META_CONTEXT, REP_SERVER,
};
use crate::error::{ProtocolError, Result};
use crate::wire::{check_string_length, to_u32, validate_string, Reader};

/// Header of an option reply; `length_bytes` of data follow it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionReplyHeader {
    /// The option being answered, echoed from the client's header.
    pub option: u32,
    /// One of the `REP_*` constants.
    pub reply_type: u32,
    pub length_bytes: u32,
}

impl OptionReplyHeader {
    pub fn encode(&self) -> [u8; OPTION_REPLY_HEADER_BYTES] {
        let mut out = [0u8; OPTION_REPLY_HEADER_BYTES];
        out[0..8].copy_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
        out[8..12].copy_from_slice(&self.option.to_be_bytes());
        out[12..16].copy_from_slice(&self.reply_type.to_be_bytes());
        out[16..20].copy_from_slice(&self.length_bytes.to_be_bytes());
        out
    }

    /// Decodes a header (client side, and for tests).
    pub fn decode(bytes: &[u8; OPTION_REPLY_HEADER_BYTES]) -> Result<Self> {
        let mut reader = Reader::new(bytes, "option reply header");
        let magic = reader.u64()?;
        if magic != OPTION_REPLY_MAGIC {
            return Err(ProtocolError::BadMagic {
                what: "option reply header",
                expected: OPTION_REPLY_MAGIC,
                actual: magic,
            });
        }
        Ok(Self {
            option: reader.u32()?,
            reply_type: reader.u32()?,
            length_bytes: reader.u32()?,
        })
    }

    pub fn is_error(&self) -> bool {
        self.reply_type & REP_FLAG_ERROR != 0
    }
}

/// Encodes a complete option reply: header followed by `data`.
pub fn encode_option_reply(option: u32, reply_type: u32, data: &[u8]) -> Result<Vec<u8>> {
    let header = OptionReplyHeader {
        option,
        reply_type,
        length_bytes: to_u32(data.len(), "option reply length")?,
    };
    let mut out = Vec::with_capacity(OPTION_REPLY_HEADER_BYTES + data.len());
    out.extend_from_slice(&header.encode());
    out.extend_from_slice(data);
    Ok(out)
}

/// `REP_ACK`: the option succeeded (or a list finished).
pub fn encode_ack(option: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(OPTION_REPLY_HEADER_BYTES);
    out.extend_from_slice(
        &OptionReplyHeader {
            option,
            reply_type: REP_ACK,
            length_bytes: 0,
        }
        .encode(),
    );
    out
}

/// `REP_SERVER`: one export in answer to `OPT_LIST` (name only, no description).
pub fn encode_server(option: u32, export_name: &str) -> Result<Vec<u8>> {
    check_string_length(export_name.len(), "export name")?;
    let mut data = Vec::with_capacity(4 + export_name.len());
    data.extend_from_slice(&to_u32(export_name.len(), "export name")?.to_be_bytes());
    data.extend_from_slice(export_name.as_bytes());
    encode_option_reply(option, REP_SERVER, &data)
}

/// `REP_META_CONTEXT`: a context id the client will see in block status chunks, and its name.
pub fn encode_meta_context(option: u32, context_id: u32, name: &str) -> Result<Vec<u8>> {
    check_string_length(name.len(), "meta context name")?;
    let mut data = Vec::with_capacity(4 + name.len());
    data.extend_from_slice(&context_id.to_be_bytes());
    data.extend_from_slice(name.as_bytes());
    encode_option_reply(option, REP_META_CONTEXT, &data)
}

/// An error reply (`REP_ERR_*`) with a human-readable message, which may be empty.
pub fn encode_error(option: u32, reply_type: u32, message: &str) -> Result<Vec<u8>> {
    if reply_type & REP_FLAG_ERROR == 0 {
        return Err(ProtocolError::NotAnErrorType { reply_type });
    }
    check_string_length(message.len(), "error message")?;
    encode_option_reply(option, reply_type, message.as_bytes())
}

/// The server's size constraints, as sent in `INFO_BLOCK_SIZE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockSizeConstraints {
    pub minimum_bytes: u32,
    pub preferred_bytes: u32,
    pub maximum_payload_bytes: u32,
}

/// One `REP_INFO` item, in answer to `OPT_INFO` / `OPT_GO`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Info {
    Export {
        size_bytes: u64,
        transmission_flags: u16,
    },
    Name(String),
    Description(String),
    BlockSize(BlockSizeConstraints),
    /// A type we do not know; clients must ignore these, so decoding keeps rather than rejects.
    Unknown {
        info_type: u16,
        data: Vec<u8>,
    },
}

impl Info {
    /// Encodes the `REP_INFO` data (info type + payload), without the reply header.
    pub fn encode_data(&self) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        match self {
            Info::Export {
                size_bytes,
                transmission_flags,
            } => {
                out.extend_from_slice(&INFO_EXPORT.to_be_bytes());
                out.extend_from_slice(&size_bytes.to_be_bytes());
                out.extend_from_slice(&transmission_flags.to_be_bytes());
            }
            Info::Name(name) => {
                check_string_length(name.len(), "export name")?;
                out.extend_from_slice(&INFO_NAME.to_be_bytes());
                out.extend_from_slice(name.as_bytes());
            }
            Info::Description(description) => {
                check_string_length(description.len(), "export description")?;
                out.extend_from_slice(&INFO_DESCRIPTION.to_be_bytes());
                out.extend_from_slice(description.as_bytes());
            }
            Info::BlockSize(sizes) => {
                out.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
                out.extend_from_slice(&sizes.minimum_bytes.to_be_bytes());
                out.extend_from_slice(&sizes.preferred_bytes.to_be_bytes());
                out.extend_from_slice(&sizes.maximum_payload_bytes.to_be_bytes());
            }
            Info::Unknown { info_type, data } => {
                out.extend_from_slice(&info_type.to_be_bytes());
                out.extend_from_slice(data);
            }
        }
        Ok(out)
    }

    /// Encodes a complete `REP_INFO` reply to `option`.
    pub fn encode_reply(&self, option: u32) -> Result<Vec<u8>> {
        encode_option_reply(option, REP_INFO, &self.encode_data()?)
    }

    /// Decodes `REP_INFO` data (client side, and for tests); known types must have the exact
    /// length the spec fixes.
    pub fn decode_data(data: &[u8]) -> Result<Self> {
        let mut reader = Reader::new(data, "info reply");
        let info_type = reader.u16()?;
        let info = match info_type {
            INFO_EXPORT => Info::Export {
                size_bytes: reader.u64()?,
                transmission_flags: reader.u16()?,
            },
            INFO_NAME => {
                let rest = reader.take(reader.remaining_bytes())?;
                Info::Name(validate_string(rest, "export name")?.to_owned())
            }
            INFO_DESCRIPTION => {
                let rest = reader.take(reader.remaining_bytes())?;
                Info::Description(validate_string(rest, "export description")?.to_owned())
            }
            INFO_BLOCK_SIZE => Info::BlockSize(BlockSizeConstraints {
                minimum_bytes: reader.u32()?,
                preferred_bytes: reader.u32()?,
                maximum_payload_bytes: reader.u32()?,
            }),
            _ => Info::Unknown {
                info_type,
                data: reader.take(reader.remaining_bytes())?.to_vec(),
            },
        };
        reader.finish()?;
        Ok(info)
    }
}

/// The reply ending option haggling after `OPT_EXPORT_NAME`: size, flags, and the 124 reserved
/// zero bytes unless the client negotiated `NO_ZEROES`.
pub fn encode_export_name_reply(
    size_bytes: u64,
    transmission_flags: u16,
    no_zeroes: bool,
) -> Vec<u8> {
    let zeroes_bytes = if no_zeroes {
        0
    } else {
        EXPORT_NAME_ZEROES_BYTES
    };
    let mut out = Vec::with_capacity(10 + zeroes_bytes);
    out.extend_from_slice(&size_bytes.to_be_bytes());
    out.extend_from_slice(&transmission_flags.to_be_bytes());
    out.resize(10 + zeroes_bytes, 0);
    out
}

/// Decodes the size and transmission flags that start an `OPT_EXPORT_NAME` reply (client side);
/// the caller then skips the reserved zeroes unless `NO_ZEROES` was negotiated.
pub fn decode_export_name_reply(bytes: &[u8; EXPORT_NAME_REPLY_BYTES]) -> (u64, u16) {
    let mut size = [0u8; 8];
    size.copy_from_slice(&bytes[..8]);
    (
        u64::from_be_bytes(size),
        u16::from_be_bytes([bytes[8], bytes[9]]),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consts::{
        FLAG_HAS_FLAGS, FLAG_SEND_FLUSH, MAX_STRING_BYTES, OPT_GO, OPT_LIST, OPT_SET_META_CONTEXT,
        REP_ERR_POLICY, REP_ERR_UNSUP,
    };

    fn split(reply: &[u8]) -> (OptionReplyHeader, &[u8]) {
        let header: [u8; OPTION_REPLY_HEADER_BYTES] =
            reply[..OPTION_REPLY_HEADER_BYTES].try_into().unwrap();
        let header = OptionReplyHeader::decode(&header).unwrap();
        let data = &reply[OPTION_REPLY_HEADER_BYTES..];
        assert_eq!(header.length_bytes as usize, data.len());
        (header, data)
    }

    #[test]
    fn info_export_reply_has_exact_bytes() {
        let info = Info::Export {
            size_bytes: 0x1_0000_0000,
            transmission_flags: FLAG_HAS_FLAGS | FLAG_SEND_FLUSH,
        };
        let reply = info.encode_reply(OPT_GO).unwrap();
        let expected: [u8; 32] = [
            0x00, 0x03, 0xe8, 0x89, 0x04, 0x55, 0x65, 0xa9, // reply magic
            0, 0, 0, 7, // OPT_GO
            0, 0, 0, 3, // REP_INFO
            0, 0, 0, 12, // length
            0, 0, // INFO_EXPORT
            0, 0, 0, 1, 0, 0, 0, 0, // size
            0, 5, // flags
        ];
        assert_eq!(reply, expected);
        let (header, data) = split(&reply);
        assert_eq!(header.reply_type, REP_INFO);
        assert_eq!(Info::decode_data(data), Ok(info));
    }

    #[test]
    fn every_info_kind_round_trips() {
        let infos = [
            Info::Name("disk".to_owned()),
            Info::Description("a cache".to_owned()),
            Info::BlockSize(BlockSizeConstraints {
                minimum_bytes: 1,
                preferred_bytes: 4096,
                maximum_payload_bytes: 32 << 20,
            }),
            Info::Unknown {
                info_type: 99,
                data: vec![1, 2, 3],
            },
        ];
        for info in infos {
            let reply = info.encode_reply(OPT_GO).unwrap();
            let (header, data) = split(&reply);
            assert_eq!(header.option, OPT_GO);
            assert_eq!(Info::decode_data(data), Ok(info));
        }
        let block_size = Info::BlockSize(BlockSizeConstraints {
            minimum_bytes: 512,
            preferred_bytes: 4096,
            maximum_payload_bytes: 1 << 25,
        });
        assert_eq!(block_size.encode_data().unwrap().len(), 14);
    }

    #[test]
    fn info_decode_rejects_wrong_lengths() {
        assert!(Info::decode_data(&[]).is_err());
        assert!(Info::decode_data(&[0, 0, 0, 0]).is_err());
        let mut export = Info::Export {
            size_bytes: 1,
            transmission_flags: 1,
        }
        .encode_data()
        .unwrap();
        export.push(0);
        assert!(matches!(
            Info::decode_data(&export),
            Err(ProtocolError::TrailingBytes { .. })
        ));
        assert!(Info::decode_data(&[0, 3, 0, 0, 2, 0]).is_err());
    }

    #[test]
    fn ack_server_and_meta_context_round_trip() {
        let reply = encode_ack(OPT_LIST);
        let (header, data) = split(&reply);
        assert_eq!((header.option, header.reply_type), (OPT_LIST, REP_ACK));
        assert!(data.is_empty());

        let reply = encode_server(OPT_LIST, "disk0").unwrap();
        let (header, data) = split(&reply);
        assert_eq!(header.reply_type, REP_SERVER);
        assert_eq!(data, [0, 0, 0, 5, b'd', b'i', b's', b'k', b'0']);

        let reply = encode_meta_context(OPT_SET_META_CONTEXT, 1, "base:allocation").unwrap();
        let (header, data) = split(&reply);
        assert_eq!(header.reply_type, REP_META_CONTEXT);
        assert_eq!(&data[..4], &[0, 0, 0, 1]);
        assert_eq!(&data[4..], b"base:allocation");
    }

    #[test]
    fn error_replies_require_bit_31_and_carry_the_message() {
        let reply = encode_error(OPT_GO, REP_ERR_UNSUP, "no such option").unwrap();
        let (header, data) = split(&reply);
        assert!(header.is_error());
        assert_eq!(header.reply_type, 0x8000_0001);
        assert_eq!(data, b"no such option");
        assert!(encode_error(OPT_GO, REP_ERR_POLICY, "").is_ok());
        assert_eq!(
            encode_error(OPT_GO, REP_ACK, "x"),
            Err(ProtocolError::NotAnErrorType {
                reply_type: REP_ACK
            })
        );
        assert!(encode_error(OPT_GO, REP_ERR_UNSUP, &"m".repeat(MAX_STRING_BYTES + 1)).is_err());
    }

    #[test]
    fn option_reply_header_rejects_bad_magic() {
        let mut bytes = OptionReplyHeader {
            option: 1,
            reply_type: REP_ACK,
            length_bytes: 0,
        }
        .encode();
        bytes[2] = 0;
        assert!(matches!(
            OptionReplyHeader::decode(&bytes),
            Err(ProtocolError::BadMagic { .. })
        ));
    }

    #[test]
    fn export_name_reply_pads_unless_no_zeroes() {
        let padded = encode_export_name_reply(4096, FLAG_HAS_FLAGS, false);
        assert_eq!(padded.len(), 134);
        assert_eq!(&padded[..10], &[0, 0, 0, 0, 0, 0, 0x10, 0, 0, 1]);
        assert!(padded[10..].iter().all(|&byte| byte == 0));
        let bare = encode_export_name_reply(4096, FLAG_HAS_FLAGS, true);
        assert_eq!(bare, padded[..10]);
        let head: [u8; EXPORT_NAME_REPLY_BYTES] = bare.as_slice().try_into().unwrap();
        assert_eq!(decode_export_name_reply(&head), (4096, FLAG_HAS_FLAGS));
    }
}
