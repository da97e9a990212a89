//! logcache's device seam: every byte the engine moves goes through [`BlockDevice`].
//!
//! Production implementations: [`file::FileDevice`] (a regular file or block device, O_DIRECT
//! where the file system allows it) and [`memory::MemDevice`] (RAM); [`aligned::AlignedBuf`] is
//! the 4 KiB-aligned buffer O_DIRECT needs. Devices for tests and benchmarks (simulated crash,
//! fault injection, hard-disk timing) live in the `logcache-testkit` crate, which production
//! crates do not depend on. Wrappers add cross-cutting behaviour; the engine never touches a
//! file descriptor.

pub mod aligned;
pub mod crc32c;
pub mod file;
pub mod memory;
mod read_op;

pub use read_op::{recycle_read_ops, ReadOp};

use std::io;

/// The sector size every device must accept as its unit of alignment.
pub const SECTOR_SIZE_BYTES: u64 = 512;

/// [`BlockDevice::read_gap_bytes_max`] of a device that does not say: 128 KiB, about what one
/// IO's fixed cost is worth on a disk or an SSD behind a file system.
pub const READ_GAP_BYTES_MAX_DEFAULT: u64 = 128 << 10;

/// A block device addressed by byte offset.
///
/// Contract (asserted by the simulated device in tests):
/// - `offset` and `buf.len()` of `read_at`/`write_at` are multiples of 512; callers that can
///   use 4 KiB-aligned memory should (O_DIRECT needs it, and `FileDevice` otherwise bounces).
/// - A write that returned is visible to later reads, but durable only after a later `flush`
///   returned. Writes not yet flushed may be lost or torn at 512-byte granularity by a crash.
/// - Calls may come from many threads at once; overlapping concurrent writes are the caller's bug.
pub trait BlockDevice: Send + Sync {
    /// Size of the device in bytes (a multiple of 512).
    fn size_bytes(&self) -> u64;
    /// Reads exactly `buf.len()` bytes at `offset`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes all of `buf` at `offset`.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Makes every write that returned before this call durable.
    fn flush(&self) -> io::Result<()>;
    /// Tells the device the range's contents are no longer needed; afterwards it may read as
    /// anything. Devices without discard support return Ok and do nothing.
    fn discard(&self, offset: u64, len_bytes: u64) -> io::Result<()>;
    /// Makes the range read as zeros, like writes of zeros (durable after a later `flush`).
    /// Devices that can deallocate while guaranteeing zeros (a hole in a file) should; the
    /// default writes zero blocks.
    fn write_zeroes(&self, offset: u64, len_bytes: u64) -> io::Result<()> {
        write_zero_blocks(self, offset, len_bytes)
    }
    /// A short human description (path, "memory", ...) for messages.
    fn describe(&self) -> String;
    /// Reads every op (each its own buffer and offset), setting each op's `result`: the IOs of
    /// one request, which a device may have in flight together (a file with the io_uring read
    /// engine submits them in one system call). The default reads them one by one.
    fn read_batch(&self, ops: &mut [ReadOp<'_>]) {
        for op in ops.iter_mut() {
            op.result = self.read_at(op.buf, op.offset);
        }
    }
    /// Writes `bufs` one after another from `offset`, as one IO where the device can (a file:
    /// one `pwritev`). The default writes them one by one.
    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        let mut at = offset;
        for b in bufs {
            self.write_at(b, at)?;
            at += b.len() as u64;
        }
        Ok(())
    }
    /// How many times the device has reconnected to its server (0 for local devices). Writes
    /// that returned before a reconnect may have been lost without an error (the server may
    /// have restarted), so a `flush` covers only writes since the last reconnect: a caller that
    /// wrote, then flushed, and sees this number change in between must write again.
    fn reconnects(&self) -> u64 {
        0
    }
    /// How far ahead of a sequential reader the device may read on its own (0: not at all):
    /// the `backing_read_ahead_kib` tunable. Only devices that read ahead themselves (RBD,
    /// whose librbd cache is off) use it; the default ignores it.
    fn set_read_ahead_bytes(&self, bytes: u64) {
        let _ = bytes;
    }
    /// The longest gap (in bytes) a reader of scattered blocks should read over, rather than
    /// split around it into two IOs: what one IO's fixed cost (a system call, a seek, a round
    /// trip) is worth in transferred bytes. Writeback reads a segment's dirty blocks as spans
    /// with gaps up to this long. A device whose IOs have no fixed cost (memory: an IO is a
    /// copy, and a gap's bytes cost as much as the wanted ones) says 0.
    fn read_gap_bytes_max(&self) -> u64 {
        READ_GAP_BYTES_MAX_DEFAULT
    }
    /// The run of bytes starting at `offset` that has one [`Allocation`]: its length (1 to
    /// `len_bytes`) and kind, for block status. Must never call a range a hole unless it reads
    /// as zeros; the default, right for any device, says "data" for the whole range.
    fn allocation(&self, offset: u64, len_bytes: u64) -> io::Result<(u64, Allocation)> {
        debug_assert!(len_bytes > 0);
        let _ = offset;
        Ok((len_bytes, Allocation::Data))
    }
}

/// What a run of a device's bytes holds, as far as the device can tell without reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allocation {
    /// May hold data (the answer that is always safe).
    Data,
    /// Nothing is stored there and it reads as zeros: a hole in a sparse file.
    ZeroHole,
}

/// Writes zeros over a range in 1 MiB pieces: the fallback of [`BlockDevice::write_zeroes`].
pub fn write_zero_blocks<D: BlockDevice + ?Sized>(
    dev: &D,
    offset: u64,
    len_bytes: u64,
) -> io::Result<()> {
    const PIECE_BYTES: u64 = 1 << 20;
    check_range(dev.size_bytes(), offset, len_bytes)?;
    let zeros = aligned::AlignedBuf::new(PIECE_BYTES.min(len_bytes) as usize);
    let mut done = 0u64;
    while done < len_bytes {
        let n = (len_bytes - done).min(PIECE_BYTES);
        dev.write_at(&zeros[..n as usize], offset + done)?;
        done += n;
    }
    Ok(())
}

/// Checks the alignment contract shared by all devices (wrappers in other crates use it too).
pub fn check_range(dev_size_bytes: u64, offset: u64, len_bytes: u64) -> io::Result<()> {
    if !offset.is_multiple_of(SECTOR_SIZE_BYTES) || !len_bytes.is_multiple_of(SECTOR_SIZE_BYTES) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("unaligned device IO: offset {offset} length {len_bytes}"),
        ));
    }
    match offset.checked_add(len_bytes) {
        Some(end) if end <= dev_size_bytes => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "device IO past the end: offset {offset} length {len_bytes} size {dev_size_bytes}"
            ),
        )),
    }
}
