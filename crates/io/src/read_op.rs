//! [`ReadOp`]: one read of a batch ([`BlockDevice::read_batch`](crate::BlockDevice::read_batch)).

use std::io;

/// One read of a batch: `buf.len()` bytes at `offset` (the 512-byte contract of `read_at`),
/// and, once the batch returned, its outcome.
pub struct ReadOp<'a> {
    pub buf: &'a mut [u8],
    pub offset: u64,
    pub result: io::Result<()>,
}

impl<'a> ReadOp<'a> {
    pub fn new(buf: &'a mut [u8], offset: u64) -> ReadOp<'a> {
        ReadOp {
            buf,
            offset,
            result: Ok(()),
        }
    }
}

/// Empties `ops` and hands its allocation back with another lifetime, so a caller keeps one
/// `Vec` of ops for every batch (no allocation per request) although each batch borrows
/// different buffers. The element types differ only in lifetime, so `collect` reuses the
/// allocation in place.
pub fn recycle_read_ops<'b>(mut ops: Vec<ReadOp<'_>>) -> Vec<ReadOp<'b>> {
    ops.clear();
    ops.into_iter().map(|_| unreachable!("emptied")).collect()
}
