//! Numeric constants from the NBD protocol spec (`doc/proto.md`), named as there minus `NBD_`.

// --- Magic numbers -------------------------------------------------------------------------------

/// ASCII "NBDMAGIC": first 8 bytes the server sends.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// ASCII "IHAVEOPT": newstyle greeting magic, also prefixes every client option.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Second magic of an oldstyle greeting (instead of IHAVEOPT); only recognised, to say clearly
/// that oldstyle servers are not supported.
pub const OLDSTYLE_MAGIC: u64 = 0x0000_4202_8186_1253;
/// Prefix of every fixed-newstyle option reply.
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Prefix of every transmission-phase request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Prefix of a simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Prefix of a structured reply chunk.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

// --- Fixed sizes ---------------------------------------------------------------------------------

/// Greeting: NBDMAGIC + IHAVEOPT + handshake flags.
pub const GREETING_BYTES: usize = 18;
/// Client flags field.
pub const CLIENT_FLAGS_BYTES: usize = 4;
/// Option header: IHAVEOPT + option + length.
pub const OPTION_HEADER_BYTES: usize = 16;
/// Option reply header: magic + option + reply type + length.
pub const OPTION_REPLY_HEADER_BYTES: usize = 20;
/// Size and transmission flags at the start of an `OPT_EXPORT_NAME` reply.
pub const EXPORT_NAME_REPLY_BYTES: usize = 10;
/// Reserved zeroes after an `OPT_EXPORT_NAME` reply unless `NO_ZEROES` was negotiated.
pub const EXPORT_NAME_ZEROES_BYTES: usize = 124;
/// Request header: magic + flags + type + cookie + offset + length.
pub const REQUEST_HEADER_BYTES: usize = 28;
/// Simple reply header: magic + error + cookie.
pub const SIMPLE_REPLY_HEADER_BYTES: usize = 16;
/// Structured reply chunk header: magic + flags + type + cookie + length.
pub const STRUCTURED_REPLY_HEADER_BYTES: usize = 20;
/// The spec's hard limit for any string (export names, messages, queries).
pub const MAX_STRING_BYTES: usize = 4096;
/// Default cap on option payloads, so a hostile client cannot make us allocate gigabytes; real
/// options are a few strings of at most 4 KiB each.
pub const DEFAULT_MAX_OPTION_BYTES: u32 = 64 * 1024;

// --- Handshake flags (server, 16 bits) -----------------------------------------------------------

pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;

// --- Client flags (32 bits) ----------------------------------------------------------------------

pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

// --- Transmission flags (16 bits) ----------------------------------------------------------------

pub const FLAG_HAS_FLAGS: u16 = 1 << 0;
pub const FLAG_READ_ONLY: u16 = 1 << 1;
pub const FLAG_SEND_FLUSH: u16 = 1 << 2;
pub const FLAG_SEND_FUA: u16 = 1 << 3;
pub const FLAG_ROTATIONAL: u16 = 1 << 4;
pub const FLAG_SEND_TRIM: u16 = 1 << 5;
pub const FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const FLAG_SEND_DF: u16 = 1 << 7;
pub const FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub const FLAG_SEND_RESIZE: u16 = 1 << 9;
pub const FLAG_SEND_CACHE: u16 = 1 << 10;
pub const FLAG_SEND_FAST_ZERO: u16 = 1 << 11;

// --- Option types (32 bits) ----------------------------------------------------------------------

pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;

// --- Option reply types (32 bits) ----------------------------------------------------------------

pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
/// Bit 31 marks every error reply type.
pub const REP_FLAG_ERROR: u32 = 1 << 31;
pub const REP_ERR_UNSUP: u32 = REP_FLAG_ERROR | 1;
pub const REP_ERR_POLICY: u32 = REP_FLAG_ERROR | 2;
pub const REP_ERR_INVALID: u32 = REP_FLAG_ERROR | 3;
pub const REP_ERR_PLATFORM: u32 = REP_FLAG_ERROR | 4;
pub const REP_ERR_TLS_REQD: u32 = REP_FLAG_ERROR | 5;
pub const REP_ERR_UNKNOWN: u32 = REP_FLAG_ERROR | 6;
pub const REP_ERR_SHUTDOWN: u32 = REP_FLAG_ERROR | 7;
pub const REP_ERR_BLOCK_SIZE_REQD: u32 = REP_FLAG_ERROR | 8;
pub const REP_ERR_TOO_BIG: u32 = REP_FLAG_ERROR | 9;

// --- Info types (16 bits, inside REP_INFO and OPT_INFO/OPT_GO) ------------------------------------

pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

// --- Commands (16 bits) --------------------------------------------------------------------------

pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;
pub const CMD_RESIZE: u16 = 8;

// --- Command flags (16 bits) ---------------------------------------------------------------------

pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

// --- Structured replies --------------------------------------------------------------------------

pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
/// Bit 15 marks every error chunk type.
pub const REPLY_TYPE_FLAG_ERROR: u16 = 1 << 15;
pub const REPLY_TYPE_ERROR: u16 = REPLY_TYPE_FLAG_ERROR | 1;
pub const REPLY_TYPE_ERROR_OFFSET: u16 = REPLY_TYPE_FLAG_ERROR | 2;

// --- Error values on the wire (fixed by the spec, not the host's errno) ----------------------------

pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const ENOMEM: u32 = 12;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;
pub const ESHUTDOWN: u32 = 108;

// --- base:allocation metadata context ------------------------------------------------------------

/// Name of the one metadata context the spec defines.
pub const META_CONTEXT_BASE_ALLOCATION: &str = "base:allocation";
pub const STATE_HOLE: u32 = 1 << 0;
pub const STATE_ZERO: u32 = 1 << 1;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magics_spell_their_ascii_names() {
        assert_eq!(&NBDMAGIC.to_be_bytes(), b"NBDMAGIC");
        assert_eq!(&IHAVEOPT.to_be_bytes(), b"IHAVEOPT");
    }

    #[test]
    fn error_types_have_the_spec_values() {
        assert_eq!(REP_ERR_UNSUP, 2_147_483_649);
        assert_eq!(REP_ERR_TOO_BIG, (1 << 31) + 9);
        assert_eq!(REPLY_TYPE_ERROR, 32_769);
        assert_eq!(REPLY_TYPE_ERROR_OFFSET, 32_770);
    }
}
