//! Encodes transmission-phase replies into a caller's buffer, simple or structured according to
//! what the client negotiated. Success replies on the hot path allocate nothing.

use logcache_nbd::consts::REPLY_FLAG_DONE;
use logcache_nbd::reply::{
    encode_block_status_chunk, encode_none_chunk, encode_offset_data_prefix, BlockDescriptor,
    ErrorPayload, SimpleReply,
};

/// Longest message we put in an `ERROR` chunk (the spec allows 4096; clients show it to a human).
const ERROR_MESSAGE_MAX_BYTES: usize = 256;

/// Appends the reply to a successful request that returns no data.
pub(crate) fn push_success(out: &mut Vec<u8>, structured: bool, cookie: u64) {
    if structured {
        out.extend_from_slice(&encode_none_chunk(cookie));
    } else {
        out.extend_from_slice(&SimpleReply { error: 0, cookie }.encode());
    }
}

/// Appends an error reply. `error` is a non-zero NBD error code; `message` goes into the
/// structured `ERROR` chunk (shortened if needed).
pub(crate) fn push_error(
    out: &mut Vec<u8>,
    structured: bool,
    cookie: u64,
    error: u32,
    message: &str,
) {
    assert_ne!(error, 0, "an error reply needs a non-zero error code");
    if structured {
        let payload = ErrorPayload {
            error,
            message: shorten(message, ERROR_MESSAGE_MAX_BYTES).to_owned(),
            offset_bytes: None,
        };
        match payload.encode_chunk(REPLY_FLAG_DONE, cookie) {
            Ok(chunk) => out.extend_from_slice(&chunk),
            // Unreachable with a shortened message; an empty message always encodes.
            Err(_) => push_error(out, structured, cookie, error, ""),
        }
    } else {
        out.extend_from_slice(&SimpleReply { error, cookie }.encode());
    }
}

/// Appends the header of a successful READ reply; the caller appends exactly `length_bytes` of
/// data right after (read straight into `out`, which saves a copy).
pub(crate) fn push_read_header(
    out: &mut Vec<u8>,
    structured: bool,
    cookie: u64,
    offset_bytes: u64,
    length_bytes: u32,
) {
    if structured {
        // One OFFSET_DATA chunk carrying all the data, marked DONE.
        let prefix = encode_offset_data_prefix(REPLY_FLAG_DONE, cookie, offset_bytes, length_bytes)
            .expect("read length is validated to be 1..=32 MiB");
        out.extend_from_slice(&prefix);
    } else {
        out.extend_from_slice(&SimpleReply { error: 0, cookie }.encode());
    }
}

/// Appends a BLOCK_STATUS chunk: `descriptors` (at least one) for `context_id`; `done` on the
/// reply's last chunk.
pub(crate) fn push_block_status(
    out: &mut Vec<u8>,
    cookie: u64,
    context_id: u32,
    descriptors: &[BlockDescriptor],
    done: bool,
) {
    let flags = if done { REPLY_FLAG_DONE } else { 0 };
    let chunk = encode_block_status_chunk(flags, cookie, context_id, descriptors)
        .expect("a block status chunk has at least one extent");
    out.extend_from_slice(&chunk);
}

/// The longest prefix of `text` of at most `max_bytes` that ends on a character boundary.
pub(crate) fn shorten(text: &str, max_bytes: usize) -> &str {
    if text.len() <= max_bytes {
        return text;
    }
    let mut end = max_bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use logcache_nbd::consts::{
        EINVAL, REPLY_TYPE_BLOCK_STATUS, REPLY_TYPE_ERROR, REPLY_TYPE_NONE, REPLY_TYPE_OFFSET_DATA,
    };
    use logcache_nbd::reply::{decode_block_status_payload, ChunkHeader};

    fn chunk(bytes: &[u8]) -> (ChunkHeader, &[u8]) {
        let header = ChunkHeader::decode(bytes[..20].try_into().unwrap()).unwrap();
        (header, &bytes[20..])
    }

    #[test]
    fn simple_replies() {
        let mut out = Vec::new();
        push_success(&mut out, false, 7);
        push_error(&mut out, false, 8, EINVAL, "ignored");
        push_read_header(&mut out, false, 9, 0, 512);
        assert_eq!(out.len(), 48);
        let third = SimpleReply::decode(out[32..48].try_into().unwrap()).unwrap();
        assert_eq!(
            third,
            SimpleReply {
                error: 0,
                cookie: 9
            }
        );
        let second = SimpleReply::decode(out[16..32].try_into().unwrap()).unwrap();
        assert_eq!(second.error, EINVAL);
    }

    #[test]
    fn structured_replies_are_single_done_chunks() {
        let mut out = Vec::new();
        push_success(&mut out, true, 1);
        let (header, payload) = chunk(&out);
        assert_eq!(
            (header.reply_type, header.is_done()),
            (REPLY_TYPE_NONE, true)
        );
        assert!(payload.is_empty());

        out.clear();
        push_error(&mut out, true, 2, EINVAL, &"é".repeat(300));
        let (header, payload) = chunk(&out);
        assert_eq!(header.reply_type, REPLY_TYPE_ERROR);
        assert!(header.is_done());
        let error = ErrorPayload::decode(header.reply_type, payload).unwrap();
        assert_eq!(error.error, EINVAL);
        assert_eq!(error.message.len(), 256);

        out.clear();
        push_read_header(&mut out, true, 3, 4096, 1024);
        let header = ChunkHeader::decode(out[..20].try_into().unwrap()).unwrap();
        assert_eq!(header.reply_type, REPLY_TYPE_OFFSET_DATA);
        assert_eq!(header.length_bytes, 8 + 1024);
        assert!(header.is_done());

        out.clear();
        let descriptor = BlockDescriptor {
            length_bytes: 65536,
            status_flags: 0,
        };
        push_block_status(&mut out, 4, 1, &[descriptor], true);
        let (header, payload) = chunk(&out);
        assert_eq!(header.reply_type, REPLY_TYPE_BLOCK_STATUS);
        let (context, extents) = decode_block_status_payload(payload).unwrap();
        assert_eq!(context, 1);
        assert_eq!(
            extents,
            [BlockDescriptor {
                length_bytes: 65536,
                status_flags: 0
            }]
        );
    }
}
