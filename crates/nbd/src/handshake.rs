//! Handshake-phase messages the client sends, plus the server greeting that precedes them.
//!
//! Option replies (server to client) live in `option_reply`.

use crate::consts::{
    CLIENT_FLAGS_BYTES, FLAG_C_FIXED_NEWSTYLE, FLAG_C_NO_ZEROES, FLAG_FIXED_NEWSTYLE,
    FLAG_NO_ZEROES, GREETING_BYTES, IHAVEOPT, NBDMAGIC, OPTION_HEADER_BYTES,
};
use crate::error::{ProtocolError, Result};
use crate::wire::{check_string_length, to_u16, to_u32, validate_string, Reader};

/// Encodes the fixed-newstyle greeting: NBDMAGIC, IHAVEOPT, then the handshake flags.
pub fn encode_greeting(handshake_flags: u16) -> [u8; GREETING_BYTES] {
    let mut out = [0u8; GREETING_BYTES];
    out[0..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
    out[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    out[16..18].copy_from_slice(&handshake_flags.to_be_bytes());
    out
}

/// Decodes a greeting (client side, and for tests); returns the handshake flags.
pub fn decode_greeting(bytes: &[u8; GREETING_BYTES]) -> Result<u16> {
    let mut reader = Reader::new(bytes, "greeting");
    expect_magic64(&mut reader, NBDMAGIC, "greeting")?;
    expect_magic64(&mut reader, IHAVEOPT, "greeting")?;
    reader.u16()
}

/// What the client agreed to in its flags field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClientFlags {
    pub fixed_newstyle: bool,
    /// The 124 reserved zero bytes after an `OPT_EXPORT_NAME` reply must be omitted.
    pub no_zeroes: bool,
}

impl ClientFlags {
    /// The wire form of these flags.
    pub fn to_wire(self) -> u32 {
        let mut flags = 0;
        if self.fixed_newstyle {
            flags |= FLAG_C_FIXED_NEWSTYLE;
        }
        if self.no_zeroes {
            flags |= FLAG_C_NO_ZEROES;
        }
        flags
    }
}

/// Parses the client flags, given the handshake flags we advertised.
///
/// The spec says the server must drop the connection on unknown flags or flags matching nothing
/// it advertised, so both are errors here.
pub fn decode_client_flags(
    bytes: &[u8; CLIENT_FLAGS_BYTES],
    server_handshake_flags: u16,
) -> Result<ClientFlags> {
    let flags = u32::from_be_bytes(*bytes);
    let mut allowed = 0;
    if server_handshake_flags & FLAG_FIXED_NEWSTYLE != 0 {
        allowed |= FLAG_C_FIXED_NEWSTYLE;
    }
    if server_handshake_flags & FLAG_NO_ZEROES != 0 {
        allowed |= FLAG_C_NO_ZEROES;
    }
    let rejected = flags & !allowed;
    if rejected != 0 {
        return Err(ProtocolError::BadClientFlags { flags, rejected });
    }
    Ok(ClientFlags {
        fixed_newstyle: flags & FLAG_C_FIXED_NEWSTYLE != 0,
        no_zeroes: flags & FLAG_C_NO_ZEROES != 0,
    })
}

/// An option header; `length_bytes` of payload follow it on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeader {
    /// One of the `OPT_*` constants, or an unknown value the server should answer with
    /// `REP_ERR_UNSUP` after skipping the payload.
    pub option: u32,
    pub length_bytes: u32,
}

impl OptionHeader {
    /// Encodes the header (client side, and for tests).
    pub fn encode(&self) -> [u8; OPTION_HEADER_BYTES] {
        let mut out = [0u8; OPTION_HEADER_BYTES];
        out[0..8].copy_from_slice(&IHAVEOPT.to_be_bytes());
        out[8..12].copy_from_slice(&self.option.to_be_bytes());
        out[12..16].copy_from_slice(&self.length_bytes.to_be_bytes());
        out
    }
}

/// Decodes an option header, rejecting payloads over `max_option_bytes` before the server
/// allocates a buffer for them (see `consts::DEFAULT_MAX_OPTION_BYTES`).
pub fn decode_option_header(
    bytes: &[u8; OPTION_HEADER_BYTES],
    max_option_bytes: u32,
) -> Result<OptionHeader> {
    let mut reader = Reader::new(bytes, "option header");
    expect_magic64(&mut reader, IHAVEOPT, "option header")?;
    let option = reader.u32()?;
    let length_bytes = reader.u32()?;
    if length_bytes > max_option_bytes {
        return Err(ProtocolError::OptionTooLong {
            length_bytes,
            max_bytes: max_option_bytes,
        });
    }
    Ok(OptionHeader {
        option,
        length_bytes,
    })
}

/// Decodes an `OPT_EXPORT_NAME` payload, which is the bare name.
pub fn decode_export_name(payload: &[u8]) -> Result<String> {
    validate_string(payload, "export name").map(str::to_owned)
}

/// Payload of `OPT_INFO` and `OPT_GO`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct InfoRequest {
    /// Empty means the default export.
    pub export_name: String,
    /// Requested `INFO_*` types in the client's order; unknown ones are kept so the server can
    /// ignore them as the spec asks.
    pub info_types: Vec<u16>,
}

impl InfoRequest {
    /// Decodes the payload; any inconsistency should be answered with `REP_ERR_INVALID`.
    pub fn decode(payload: &[u8]) -> Result<Self> {
        let mut reader = Reader::new(payload, "info request");
        let export_name = reader.u32_prefixed_string("export name")?;
        let count = reader.u16()?;
        // Each request is 2 bytes, so a count beyond the remaining bytes is caught by the reads;
        // capping the capacity keeps a lying count from pre-allocating.
        let mut info_types =
            Vec::with_capacity(usize::from(count).min(reader.remaining_bytes() / 2));
        for _ in 0..count {
            info_types.push(reader.u16()?);
        }
        reader.finish()?;
        Ok(Self {
            export_name,
            info_types,
        })
    }

    /// Encodes the payload (client side, and for tests).
    pub fn encode(&self) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        put_u32_prefixed_string(&mut out, &self.export_name, "export name")?;
        let count = to_u16(self.info_types.len(), "info request count")?;
        out.extend_from_slice(&count.to_be_bytes());
        for info_type in &self.info_types {
            out.extend_from_slice(&info_type.to_be_bytes());
        }
        Ok(out)
    }
}

/// Payload of `OPT_LIST_META_CONTEXT` and `OPT_SET_META_CONTEXT`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MetaContextRequest {
    pub export_name: String,
    /// Queries such as `base:allocation`; an empty list means "all" for LIST.
    pub queries: Vec<String>,
}

impl MetaContextRequest {
    /// Decodes the payload; any inconsistency should be answered with `REP_ERR_INVALID`.
    pub fn decode(payload: &[u8]) -> Result<Self> {
        let mut reader = Reader::new(payload, "meta context request");
        let export_name = reader.u32_prefixed_string("export name")?;
        let count = reader.u32()?;
        // Each query needs at least its 4-byte length, which bounds any honest count.
        let capacity = (count as usize).min(reader.remaining_bytes() / 4);
        let mut queries = Vec::with_capacity(capacity);
        for _ in 0..count {
            queries.push(reader.u32_prefixed_string("meta context query")?);
        }
        reader.finish()?;
        Ok(Self {
            export_name,
            queries,
        })
    }

    /// Encodes the payload (client side, and for tests).
    pub fn encode(&self) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        put_u32_prefixed_string(&mut out, &self.export_name, "export name")?;
        let count = to_u32(self.queries.len(), "meta context query count")?;
        out.extend_from_slice(&count.to_be_bytes());
        for query in &self.queries {
            put_u32_prefixed_string(&mut out, query, "meta context query")?;
        }
        Ok(out)
    }
}

fn put_u32_prefixed_string(out: &mut Vec<u8>, text: &str, what: &'static str) -> Result<()> {
    check_string_length(text.len(), what)?;
    out.extend_from_slice(&to_u32(text.len(), what)?.to_be_bytes());
    out.extend_from_slice(text.as_bytes());
    Ok(())
}

fn expect_magic64(reader: &mut Reader<'_>, expected: u64, what: &'static str) -> Result<()> {
    let actual = reader.u64()?;
    if actual != expected {
        return Err(ProtocolError::BadMagic {
            what,
            expected,
            actual,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consts::{
        DEFAULT_MAX_OPTION_BYTES, INFO_BLOCK_SIZE, INFO_EXPORT, MAX_STRING_BYTES, OPT_GO,
    };

    #[test]
    fn greeting_has_exact_bytes() {
        let greeting = encode_greeting(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
        let mut expected = Vec::new();
        expected.extend_from_slice(b"NBDMAGIC");
        expected.extend_from_slice(b"IHAVEOPT");
        expected.extend_from_slice(&[0x00, 0x03]);
        assert_eq!(greeting.as_slice(), expected.as_slice());
        assert_eq!(decode_greeting(&greeting), Ok(3));
    }

    #[test]
    fn greeting_with_wrong_magic_is_rejected() {
        let mut greeting = encode_greeting(FLAG_FIXED_NEWSTYLE);
        greeting[0] ^= 0xff;
        assert!(matches!(
            decode_greeting(&greeting),
            Err(ProtocolError::BadMagic { .. })
        ));
    }

    #[test]
    fn client_flags_round_trip_and_reject_unadvertised_bits() {
        let server = FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES;
        let flags = ClientFlags {
            fixed_newstyle: true,
            no_zeroes: true,
        };
        assert_eq!(
            decode_client_flags(&flags.to_wire().to_be_bytes(), server),
            Ok(flags)
        );
        assert_eq!(
            decode_client_flags(&[0, 0, 0, 0], server),
            Ok(ClientFlags::default())
        );
        // NO_ZEROES is only acceptable if we advertised it.
        assert_eq!(
            decode_client_flags(&[0, 0, 0, 3], FLAG_FIXED_NEWSTYLE),
            Err(ProtocolError::BadClientFlags {
                flags: 3,
                rejected: 2
            })
        );
        assert!(decode_client_flags(&[0x80, 0, 0, 1], server).is_err());
    }

    #[test]
    fn option_header_round_trips_with_exact_bytes() {
        let header = OptionHeader {
            option: OPT_GO,
            length_bytes: 10,
        };
        let bytes = header.encode();
        assert_eq!(&bytes[0..8], b"IHAVEOPT");
        assert_eq!(&bytes[8..16], &[0, 0, 0, 7, 0, 0, 0, 10]);
        assert_eq!(
            decode_option_header(&bytes, DEFAULT_MAX_OPTION_BYTES),
            Ok(header)
        );
    }

    #[test]
    fn option_header_rejects_oversized_length_and_bad_magic() {
        let header = OptionHeader {
            option: OPT_GO,
            length_bytes: DEFAULT_MAX_OPTION_BYTES + 1,
        };
        assert_eq!(
            decode_option_header(&header.encode(), DEFAULT_MAX_OPTION_BYTES),
            Err(ProtocolError::OptionTooLong {
                length_bytes: DEFAULT_MAX_OPTION_BYTES + 1,
                max_bytes: DEFAULT_MAX_OPTION_BYTES
            })
        );
        let mut bytes = header.encode();
        bytes[7] = b'X';
        assert!(matches!(
            decode_option_header(&bytes, u32::MAX),
            Err(ProtocolError::BadMagic { .. })
        ));
    }

    #[test]
    fn export_name_decodes_and_rejects_nul() {
        assert_eq!(decode_export_name(b"disk0"), Ok("disk0".to_owned()));
        assert_eq!(decode_export_name(b""), Ok(String::new()));
        assert!(decode_export_name(b"di\0sk").is_err());
    }

    #[test]
    fn info_request_round_trips_with_exact_bytes() {
        let request = InfoRequest {
            export_name: "ab".to_owned(),
            info_types: vec![INFO_EXPORT, INFO_BLOCK_SIZE],
        };
        let bytes = request.encode().unwrap();
        assert_eq!(bytes, [0, 0, 0, 2, b'a', b'b', 0, 2, 0, 0, 0, 3]);
        assert_eq!(InfoRequest::decode(&bytes), Ok(request));
    }

    #[test]
    fn info_request_rejects_malformed_payloads() {
        let good = InfoRequest {
            export_name: "x".to_owned(),
            info_types: vec![INFO_EXPORT],
        }
        .encode()
        .unwrap();
        // Every strict prefix is truncated somewhere.
        for cut in 0..good.len() {
            assert!(
                InfoRequest::decode(&good[..cut]).is_err(),
                "prefix {cut} accepted"
            );
        }
        let mut trailing = good.clone();
        trailing.push(0);
        assert!(matches!(
            InfoRequest::decode(&trailing),
            Err(ProtocolError::TrailingBytes { .. })
        ));
        // Name length pointing past the payload.
        assert!(InfoRequest::decode(&[0xff, 0xff, 0xff, 0xff, 0, 0]).is_err());
        // Count claiming more requests than present.
        assert!(InfoRequest::decode(&[0, 0, 0, 0, 0xff, 0xff, 0, 1]).is_err());
    }

    #[test]
    fn meta_context_request_round_trips() {
        let request = MetaContextRequest {
            export_name: "disk".to_owned(),
            queries: vec!["base:allocation".to_owned(), "base:".to_owned()],
        };
        let bytes = request.encode().unwrap();
        assert_eq!(MetaContextRequest::decode(&bytes), Ok(request));
        let empty = MetaContextRequest::default();
        assert_eq!(empty.encode().unwrap(), [0u8; 8]);
        assert_eq!(
            MetaContextRequest::decode(&empty.encode().unwrap()),
            Ok(empty)
        );
    }

    #[test]
    fn meta_context_request_rejects_malformed_payloads() {
        // Count of u32::MAX with no queries must fail cleanly, without a huge allocation.
        let mut bytes = vec![0, 0, 0, 0];
        bytes.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(
            MetaContextRequest::decode(&bytes),
            Err(ProtocolError::Truncated { .. })
        ));
        // Query length beyond the payload.
        bytes = vec![0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 9, b'b'];
        assert!(MetaContextRequest::decode(&bytes).is_err());
        // Strings over the spec limit are refused on encode.
        let too_long = MetaContextRequest {
            export_name: "e".repeat(MAX_STRING_BYTES + 1),
            queries: Vec::new(),
        };
        assert!(matches!(
            too_long.encode(),
            Err(ProtocolError::StringTooLong { .. })
        ));
    }
}
