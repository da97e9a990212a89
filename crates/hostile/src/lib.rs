//! Hostile-input targets: each takes arbitrary bytes and feeds them to one of logcache's
//! parsers, the way an attacker (a hostile NBD peer) or a corrupted disk would. A target must
//! return for every input: a parser may reject, never panic, hang or allocate without bound.
//!
//! The same functions run under cargo-fuzz (`fuzz/`, long campaigns, by hand) and under the
//! seeded tests in `tests/hostile_inputs.rs` (short, in CI), so a crash found by either is
//! replayed by both.
//!
//! Targets: [`nbd_handshake`] and [`nbd_request`] (what a client sends the server),
//! [`nbd_replies`] (what a server sends our NBD backing client), [`on_disk_metadata`] (the
//! superblock, label and chunk decoders, with checksums fixed up so the fields behind them are
//! reached), [`open_corrupted_cache`] (recovery of a real cache image with bytes changed),
//! [`rbd_diff`] (an `rbd diff v1` stream, as `logcache import-diff` reads it), and
//! [`tls_settings`] (an NBD URI with TLS parameters, and a psktool key file), and
//! [`nbd_session`] (one client session against a live in-process server: block status
//! requests past the end, of length zero, with unknown flags; TLS handshakes cut short and
//! garbage after STARTTLS; the server must then still serve). `nbd_session` is not in [`all`]:
//! each case is a connection, too slow for the dispatcher's thousands of cases.
//! `crates/server/tests/hostile_clients.rs` runs more hostile clients at once beside a
//! well-behaved one.

mod cache_image;
mod nbd_session;

pub use nbd_session::nbd_session;

use logcache_diff::{Decoder, Encoder, Piece};
use logcache_engine::format::{chunk, label::Label, superblock};
use logcache_nbd::consts::{
    CLIENT_FLAGS_BYTES, EXPORT_NAME_REPLY_BYTES, GREETING_BYTES, OPTION_HEADER_BYTES,
    OPTION_REPLY_HEADER_BYTES, REQUEST_HEADER_BYTES, SIMPLE_REPLY_HEADER_BYTES,
    STRUCTURED_REPLY_HEADER_BYTES,
};
use logcache_nbd::handshake::{self, InfoRequest, MetaContextRequest};
use logcache_nbd::option_reply::{self, Info, OptionReplyHeader};
use logcache_nbd::reply::{self, ChunkHeader, ErrorPayload, SimpleReply};
use logcache_nbd::request::Request;

pub use cache_image::{open_corrupted_cache, Outcome};

/// Reads a fuzz input front to back; past its end it yields zeros, so every input is usable.
pub(crate) struct Input<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Input<'a> {
    pub(crate) fn new(data: &'a [u8]) -> Input<'a> {
        Input { data, pos: 0 }
    }

    pub(crate) fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }

    pub(crate) fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    pub(crate) fn array<const N: usize>(&mut self) -> [u8; N] {
        std::array::from_fn(|_| self.u8())
    }

    /// The rest of the input.
    pub(crate) fn rest(&mut self) -> &'a [u8] {
        let rest = self.data.get(self.pos..).unwrap_or(&[]);
        self.pos = self.data.len();
        rest
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.pos >= self.data.len()
    }
}

/// Handshake messages a client sends: greeting (as a client would parse ours), client flags,
/// option headers and every option payload the server decodes. Whatever decodes must encode
/// back to the same bytes, where the format is canonical.
pub fn nbd_handshake(data: &[u8]) {
    let mut input = Input::new(data);
    let selector = input.u8();
    match selector % 6 {
        0 => {
            let _ = handshake::decode_greeting(&input.array::<GREETING_BYTES>());
        }
        1 => {
            let flags = input.array::<CLIENT_FLAGS_BYTES>();
            let server_flags = u16::from(input.u8()) | (u16::from(input.u8()) << 8);
            let _ = handshake::decode_client_flags(&flags, server_flags);
        }
        2 => {
            let bytes = input.array::<OPTION_HEADER_BYTES>();
            let max = input.u32();
            if let Ok(h) = handshake::decode_option_header(&bytes, max) {
                assert!(h.length_bytes <= max);
                assert_eq!(h.encode(), bytes);
            }
        }
        3 => {
            let _ = handshake::decode_export_name(input.rest());
        }
        4 => {
            let payload = input.rest();
            if let Ok(r) = InfoRequest::decode(payload) {
                assert_eq!(r.encode().expect("a decoded request encodes"), payload);
            }
        }
        _ => {
            let payload = input.rest();
            if let Ok(r) = MetaContextRequest::decode(payload) {
                assert_eq!(r.encode().expect("a decoded request encodes"), payload);
            }
        }
    }
}

/// Request headers as the server's request loop sees them: decoded from the front of a buffer,
/// then judged against an export size drawn from the input.
pub fn nbd_request(data: &[u8]) {
    let mut input = Input::new(data);
    let export_size_bytes = u64::from(input.u32()) << (input.u8() % 32);
    let bytes = input.rest();
    if let Ok((r, used)) = Request::decode_prefix(bytes) {
        assert_eq!(used, REQUEST_HEADER_BYTES);
        assert_eq!(&r.encode()[..], &bytes[..REQUEST_HEADER_BYTES]);
        let _ = r.payload_length_bytes();
        let _ = r.unexpected_flags();
        let within = r.within_export(export_size_bytes);
        if within {
            let end = r
                .end_offset_bytes()
                .expect("a request within the export ends");
            assert!(end <= export_size_bytes);
        }
        let _ = r.command.permitted_flags();
    }
}

/// What a remote NBD server may send our backing client: option replies and their data, the
/// old-style export reply, simple and structured reply headers and every chunk payload.
pub fn nbd_replies(data: &[u8]) {
    let mut input = Input::new(data);
    match input.u8() % 7 {
        0 => {
            let _ = OptionReplyHeader::decode(&input.array::<OPTION_REPLY_HEADER_BYTES>());
        }
        1 => {
            let _ = Info::decode_data(input.rest());
        }
        2 => {
            let _ =
                option_reply::decode_export_name_reply(&input.array::<EXPORT_NAME_REPLY_BYTES>());
        }
        3 => {
            let _ = SimpleReply::decode(&input.array::<SIMPLE_REPLY_HEADER_BYTES>());
        }
        4 => {
            let _ = ChunkHeader::decode(&input.array::<STRUCTURED_REPLY_HEADER_BYTES>());
        }
        5 => {
            let kind = input.u8();
            let payload = input.rest();
            match kind % 3 {
                0 => {
                    let _ = reply::decode_offset_data_payload(payload);
                }
                1 => {
                    let _ = reply::decode_offset_hole_payload(payload);
                }
                _ => {
                    let _ = reply::decode_block_status_payload(payload);
                }
            }
        }
        _ => {
            let reply_type = u16::from(input.u8()) | (u16::from(input.u8()) << 8);
            let _ = ErrorPayload::decode(reply_type, input.rest());
        }
    }
}

/// The on-disk decoders, fed a block of input. With the selector's high bit set, the block's
/// checksum is recomputed first, so the fields behind it are what gets tested.
pub fn on_disk_metadata(data: &[u8]) {
    let mut input = Input::new(data);
    let selector = input.u8();
    let fix_crc = selector & 0x80 != 0;
    let mut block = vec![0u8; superblock::SUPERBLOCK_SIZE_BYTES];
    let rest = input.rest();
    let n = rest.len().min(block.len());
    block[..n].copy_from_slice(&rest[..n]);
    match selector % 3 {
        0 => {
            if fix_crc {
                let crc_at = block.len() - 4;
                let crc = crc32c_of(&block[..crc_at]);
                block[crc_at..].copy_from_slice(&crc.to_le_bytes());
            }
            if let Ok(Some(sb)) = superblock::Superblock::decode(&block) {
                // A superblock that validates must survive a round trip.
                let again = superblock::Superblock::decode(&sb.encode()).expect("re-decodes");
                assert_eq!(again, Some(sb));
            }
            let other = block.clone();
            let _ = superblock::choose([&block, &other]);
        }
        1 => {
            if fix_crc {
                let crc = crc32c_of(&block[..40]);
                block[40..44].copy_from_slice(&crc.to_le_bytes());
            }
            let _ = Label::decode(&block);
        }
        _ => {
            let format_id = u64::from_le_bytes(block[8..16].try_into().expect("8 bytes"));
            let blocks_per_segment = 1 + u32::from(block[4095]) * 4;
            let Ok(h) = chunk::decode_header(&block, format_id, blocks_per_segment) else {
                return;
            };
            let mut meta = vec![0u8; h.meta_block_count as usize * 4096];
            meta[..block.len()].copy_from_slice(&block);
            if fix_crc {
                chunk::seal(&mut meta, format_id, h.entry_count);
            }
            let _ = chunk::decode_entries(&meta, format_id, &h);
        }
    }
}

pub(crate) fn crc32c_of(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

/// An `rbd diff v1` stream. What decodes must obey the stream's rules (records sorted, disjoint,
/// inside the image; no more data than the input held), and must encode again into a stream
/// that decodes to the same header and pieces. Returns whether the stream decoded whole (the
/// seeded test checks that both outcomes occur).
pub fn rbd_diff(data: &[u8]) -> bool {
    let Ok(mut d) = Decoder::new(data) else {
        return false;
    };
    let header = d.header().clone();
    let mut pieces = Vec::new();
    let mut next_offset_bytes = 0u64;
    let mut data_bytes = 0u64;
    loop {
        match d.next_piece() {
            Ok(Some(p)) => {
                let (offset_bytes, length_bytes) = match p {
                    Piece::Data {
                        offset_bytes,
                        bytes,
                    } => {
                        data_bytes += bytes.len() as u64;
                        pieces.push((offset_bytes, Some(bytes.to_vec()), bytes.len() as u64));
                        (offset_bytes, bytes.len() as u64)
                    }
                    Piece::Zero {
                        offset_bytes,
                        length_bytes,
                    } => {
                        pieces.push((offset_bytes, None, length_bytes));
                        (offset_bytes, length_bytes)
                    }
                };
                assert!(length_bytes > 0);
                assert!(offset_bytes >= next_offset_bytes, "pieces out of order");
                next_offset_bytes = offset_bytes + length_bytes;
                assert!(next_offset_bytes <= header.size_bytes, "piece past the end");
                assert!(data_bytes <= data.len() as u64, "more data than input");
            }
            Ok(None) => break,
            Err(_) => return false,
        }
    }
    assert_eq!(
        d.position_bytes(),
        data.len() as u64,
        "a valid stream is read whole"
    );
    let mut e = Encoder::new(Vec::new(), &header).expect("encodes to memory");
    for (offset_bytes, bytes, length_bytes) in &pieces {
        match bytes {
            Some(b) => e.data(*offset_bytes, b),
            None => e.zero(*offset_bytes, *length_bytes),
        }
        .expect("encodes to memory");
    }
    let again = e.finish().expect("encodes to memory");
    let mut d = Decoder::new(&again[..]).expect("a re-encoded stream decodes");
    assert_eq!(d.header(), &header);
    for (offset_bytes, bytes, length_bytes) in &pieces {
        let p = d.next_piece().expect("a re-encoded stream decodes");
        let same = match (p, bytes) {
            (
                Some(Piece::Data {
                    offset_bytes: o,
                    bytes: b,
                }),
                Some(want),
            ) => o == *offset_bytes && b == &want[..],
            (
                Some(Piece::Zero {
                    offset_bytes: o,
                    length_bytes: l,
                }),
                None,
            ) => o == *offset_bytes && l == *length_bytes,
            _ => false,
        };
        assert!(same, "re-encoded stream differs at offset {offset_bytes}");
    }
    assert!(matches!(d.next_piece(), Ok(None)));
    true
}

/// Text a user or a configuration hands the TLS code: an NBD URI (TLS parameters included) and
/// a psktool key file. A URI that parses prints back as given and never carries both kinds of
/// credentials; a key file that parses holds named keys of 1 to 256 bytes.
pub fn tls_settings(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if let Ok(uri) = logcache_nbd::uri::parse(&text) {
        assert_eq!(uri.to_string(), text);
        if let Some(tls) = &uri.tls {
            assert!(tls.certificates.is_none() || tls.psk_file.is_none());
        }
    }
    if let Ok(keys) = logcache_nbd::psk::parse_psk_file(&text) {
        for (name, key) in keys {
            assert!(!name.is_empty() && !name.contains(':'));
            assert!((1..=logcache_nbd::psk::MAX_PSK_BYTES).contains(&key.len()));
        }
    }
}

/// Runs every target on `data`; the fuzz target `all` and the seeded tests use it.
pub fn all(data: &[u8]) {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    match which % 7 {
        0 => nbd_handshake(rest),
        1 => nbd_request(rest),
        2 => nbd_replies(rest),
        3 => on_disk_metadata(rest),
        4 => {
            rbd_diff(rest);
        }
        5 => tls_settings(rest),
        _ => {
            open_corrupted_cache(rest);
        }
    }
}
