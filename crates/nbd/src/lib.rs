//! The NBD wire protocol as pure data transformations: constants, encoders and decoders.
//!
//! This crate does no I/O (the client that does lives in `logcache-nbd-client`). Headers decode from fixed-size arrays so a server can read exactly that
//! many bytes from a socket first; variable payloads decode from slices whose length the server
//! already learned from a header (and capped, see [`handshake::decode_option_header`]). Every
//! decoder returns a [`ProtocolError`] for malformed input instead of panicking, because all of
//! these bytes come from an untrusted peer. Everything is big-endian, as the spec requires.

pub mod consts;
pub mod error;
pub mod handshake;
pub mod option_reply;
pub mod psk;
pub mod reply;
pub mod request;
pub mod uri;
mod wire;

pub use error::{ProtocolError, Result};

#[cfg(test)]
mod tests {
    //! Every slice decoder must turn arbitrary bytes into a value or an error, never a panic.

    use crate::consts::{REPLY_TYPE_ERROR, REPLY_TYPE_ERROR_OFFSET};
    use crate::handshake::{decode_export_name, InfoRequest, MetaContextRequest};
    use crate::option_reply::Info;
    use crate::reply::{
        decode_block_status_payload, decode_offset_data_payload, decode_offset_hole_payload,
        ErrorPayload,
    };
    use crate::request::Request;

    #[test]
    fn decoders_survive_pseudo_random_input() {
        // A fixed LCG keeps the test deterministic without a dependency; small values are
        // biased in so length fields sometimes point inside the buffer.
        let mut state: u64 = 0x2545_f491_4f6c_dd1d;
        for round in 0..2000 {
            let length_bytes = round % 64;
            let bytes: Vec<u8> = (0..length_bytes)
                .map(|_| {
                    state = state
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1_442_695_040_888_963_407);
                    let byte = (state >> 56) as u8;
                    if byte & 0x80 != 0 {
                        byte & 0x07
                    } else {
                        byte
                    }
                })
                .collect();
            let _ = decode_export_name(&bytes);
            let _ = InfoRequest::decode(&bytes);
            let _ = MetaContextRequest::decode(&bytes);
            let _ = Info::decode_data(&bytes);
            let _ = Request::decode_prefix(&bytes);
            let _ = decode_offset_data_payload(&bytes);
            let _ = decode_offset_hole_payload(&bytes);
            let _ = decode_block_status_payload(&bytes);
            let _ = ErrorPayload::decode(REPLY_TYPE_ERROR, &bytes);
            let _ = ErrorPayload::decode(REPLY_TYPE_ERROR_OFFSET, &bytes);
        }
    }
}
