//! `NBD_CMD_BLOCK_STATUS` for `base:allocation` on a connection opened for it
//! ([`Client::connect_for_block_status`]): one request with `REQ_ONE`, its structured chunks
//! read to the last, the first extent returned. Any reply that breaks the rules breaks the
//! connection, as on the data path.

use std::io::{self, Read};

use logcache_nbd::consts::{
    CMD_FLAG_REQ_ONE, REPLY_TYPE_BLOCK_STATUS, REPLY_TYPE_NONE, SIMPLE_REPLY_HEADER_BYTES,
    SIMPLE_REPLY_MAGIC, STRUCTURED_REPLY_HEADER_BYTES,
};
use logcache_nbd::reply::{decode_block_status_payload, ChunkHeader, ErrorPayload, SimpleReply};
use logcache_nbd::request::{Command, Request};

use super::exchange::local_errno;
use super::stream::write_all_vectored;
use super::Client;

/// Longest chunk payload accepted (a block status reply for one extent is 12 bytes; servers may
/// send more extents despite `REQ_ONE`, and error messages up to 4 KiB).
const MAX_CHUNK_PAYLOAD_BYTES: u32 = 1 << 20;

/// Largest length asked in one request (a multiple of 4 KiB below 4 GiB).
const MAX_QUERY_BYTES: u64 = (u32::MAX as u64) & !4095;

impl Client {
    /// The first extent at `offset_bytes` (at most `len_bytes` long): its length and
    /// `base:allocation` flags (`STATE_HOLE`, `STATE_ZERO`). `Ok(None)` when the server offers
    /// no block status (the caller then treats the range as data).
    pub fn block_status(
        &mut self,
        offset_bytes: u64,
        len_bytes: u64,
    ) -> io::Result<Option<(u64, u32)>> {
        self.check_usable()?;
        let Some(context_id) = self.base_allocation_id else {
            return Ok(None);
        };
        let len_bytes = len_bytes
            .min(MAX_QUERY_BYTES)
            .min(self.info.size_bytes.saturating_sub(offset_bytes));
        if len_bytes == 0 {
            return Ok(None);
        }
        let cookie = self.take_cookie();
        let request = Request {
            flags: CMD_FLAG_REQ_ONE,
            command: Command::BlockStatus,
            cookie,
            offset_bytes,
            length_bytes: len_bytes as u32,
        };
        if let Err(e) = write_all_vectored(&mut self.stream, &[&request.encode()]) {
            return Err(self.fail(
                e.kind(),
                format!("sending NBD_CMD_BLOCK_STATUS failed: {e}"),
            ));
        }
        let mut extent = None;
        loop {
            let mut magic = [0u8; 4];
            self.read_status(&mut magic)?;
            if u32::from_be_bytes(magic) == SIMPLE_REPLY_MAGIC {
                // Only an error may come as a simple reply once structured replies are on.
                let mut bytes = [0u8; SIMPLE_REPLY_HEADER_BYTES];
                bytes[..4].copy_from_slice(&magic);
                self.read_status(&mut bytes[4..])?;
                let reply = SimpleReply::decode(&bytes)
                    .map_err(|e| self.fail(io::ErrorKind::InvalidData, e.to_string()))?;
                if reply.cookie != cookie || reply.error == 0 {
                    return Err(self.fail(
                        io::ErrorKind::InvalidData,
                        "a simple reply to NBD_CMD_BLOCK_STATUS that is not an error".into(),
                    ));
                }
                return Err(io::Error::from_raw_os_error(local_errno(reply.error)));
            }
            let mut bytes = [0u8; STRUCTURED_REPLY_HEADER_BYTES];
            bytes[..4].copy_from_slice(&magic);
            self.read_status(&mut bytes[4..])?;
            let header = ChunkHeader::decode(&bytes)
                .map_err(|e| self.fail(io::ErrorKind::InvalidData, e.to_string()))?;
            if header.cookie != cookie || header.length_bytes > MAX_CHUNK_PAYLOAD_BYTES {
                return Err(self.fail(
                    io::ErrorKind::InvalidData,
                    format!(
                        "a block status chunk with cookie {:#x} and {} bytes",
                        header.cookie, header.length_bytes
                    ),
                ));
            }
            let mut payload = vec![0u8; header.length_bytes as usize];
            self.read_status(&mut payload)?;
            if header.is_error() {
                let error = ErrorPayload::decode(header.reply_type, &payload)
                    .map_err(|e| self.fail(io::ErrorKind::InvalidData, e.to_string()))?;
                // Read to the last chunk so the stream stays in step, then fail the call.
                if !header.is_done() {
                    continue;
                }
                return Err(io::Error::from_raw_os_error(local_errno(error.error)));
            }
            match header.reply_type {
                REPLY_TYPE_BLOCK_STATUS => {
                    let (id, descriptors) = decode_block_status_payload(&payload)
                        .map_err(|e| self.fail(io::ErrorKind::InvalidData, e.to_string()))?;
                    if id == context_id && extent.is_none() {
                        let first = descriptors[0];
                        let length_bytes = u64::from(first.length_bytes);
                        if length_bytes == 0 || length_bytes > len_bytes {
                            return Err(self.fail(
                                io::ErrorKind::InvalidData,
                                format!("a block status extent of {length_bytes} bytes for a query of {len_bytes}"),
                            ));
                        }
                        extent = Some((length_bytes, first.status_flags));
                    }
                }
                REPLY_TYPE_NONE => {}
                other => {
                    return Err(self.fail(
                        io::ErrorKind::InvalidData,
                        format!("chunk type {other} in a reply to NBD_CMD_BLOCK_STATUS"),
                    ))
                }
            }
            if header.is_done() {
                break;
            }
        }
        // A server that answered without our context says nothing about the range: data.
        Ok(Some(extent.unwrap_or((len_bytes, 0))))
    }

    fn read_status(&mut self, buf: &mut [u8]) -> io::Result<()> {
        if let Err(e) = self.stream.read_exact(buf) {
            return Err(self.fail(
                e.kind(),
                format!("receiving the reply to NBD_CMD_BLOCK_STATUS failed: {e}"),
            ));
        }
        Ok(())
    }
}
