//! [`FileDevice`]: a regular file or block device, with O_DIRECT where the file system allows it.
//!
//! Under O_DIRECT the kernel needs the memory 4 KiB aligned and the offset and length aligned to
//! the device's direct IO granularity (512 or 4096 bytes). Requests that are not are served
//! through a per-thread aligned bounce buffer, so callers only need the 512-byte contract.
//!
//! One job per file: this file holds the device type and its [`BlockDevice`] contract checks;
//! `open` finds the file's kind, size and direct-IO alignment; `bounce` serves requests the
//! kernel would refuse under O_DIRECT; `sys` makes the raw kernel calls (ioctl, fallocate,
//! pwritev).

mod bounce;
mod open;
mod sys;
#[cfg(test)]
mod tests;
mod uring;

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::aligned::is_aligned;
use crate::{check_range, Allocation, BlockDevice, ReadOp};

pub use open::create_sparse;

/// How a [`FileDevice`] serves a batch of reads ([`BlockDevice::read_batch`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadEngine {
    /// One positional read (`pread`) after another, on the calling thread.
    Sync,
    /// The batch submitted to the kernel at once through a per-thread io_uring (O_DIRECT
    /// batches of two reads or more; a single read is one `pread`, as cheap as a submission).
    IoUring,
}

impl ReadEngine {
    /// The `--io-engine` spelling.
    pub fn name(self) -> &'static str {
        match self {
            ReadEngine::Sync => "sync",
            ReadEngine::IoUring => "io_uring",
        }
    }

    /// io_uring where the kernel allows it (probed now), else `Sync` with the reason.
    pub fn detect() -> (ReadEngine, Option<io::Error>) {
        match uring::probe() {
            Ok(()) => (ReadEngine::IoUring, None),
            Err(e) => (ReadEngine::Sync, Some(e)),
        }
    }

    /// Batches served through io_uring in this process so far (every device).
    pub fn io_uring_batches() -> u64 {
        uring::batches()
    }

    /// `IoUring` only if the kernel allows it: the error says why not.
    pub fn require_io_uring() -> io::Result<ReadEngine> {
        uring::probe().map(|()| ReadEngine::IoUring)
    }
}

/// Whether to bypass the page cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirectIo {
    /// Use O_DIRECT when the file system supports it, buffered IO otherwise.
    Auto,
    /// Always buffered IO.
    Never,
    /// O_DIRECT or fail to open.
    Require,
}

/// How to open a [`FileDevice`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileOptions {
    pub direct: DirectIo,
    pub writable: bool,
}

impl Default for FileOptions {
    fn default() -> Self {
        FileOptions {
            direct: DirectIo::Auto,
            writable: true,
        }
    }
}

/// A [`BlockDevice`] on a regular file or a block device.
///
/// Size is fixed at open: a regular file's length rounded down to 512, or the block device's
/// size. IO errors from the kernel are returned unchanged (keeping the errno for NBD replies);
/// errors this type constructs name the path.
///
/// When requests narrower than the direct alignment are served by read-modify-write (a 512-byte
/// write on a 4 KiB-sector device), two concurrent writes into the same aligned block could
/// undo each other. The engine never writes one 4 KiB block from two threads at once.
pub struct FileDevice {
    file: File,
    path: PathBuf,
    size_bytes: u64,
    is_block_device: bool,
    writable: bool,
    direct: bool,
    /// Offset/length granularity O_DIRECT needs: 512 or 4096 (512 when not direct).
    direct_align_bytes: u64,
    /// Granularity discards are trimmed to (the logical sector size of a block device).
    discard_align_bytes: u64,
    read_engine: ReadEngine,
}

impl FileDevice {
    /// The path the device was opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Serves read batches with `engine` from now on (`Sync` at open); an engine the kernel
    /// refuses is the caller's to probe first ([`ReadEngine::detect`]).
    pub fn set_read_engine(&mut self, engine: ReadEngine) {
        self.read_engine = engine;
    }

    pub fn read_engine(&self) -> ReadEngine {
        self.read_engine
    }

    /// True when IO bypasses the page cache (O_DIRECT).
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// Offset/length granularity of direct IO (512 or 4096); 512 when not direct.
    pub fn direct_align_bytes(&self) -> u64 {
        self.direct_align_bytes
    }

    /// True for a block device, false for a regular file.
    pub fn is_block_device(&self) -> bool {
        self.is_block_device
    }

    pub(super) fn check(&self, offset: u64, len_bytes: u64) -> io::Result<()> {
        check_range(self.size_bytes, offset, len_bytes).map_err(|e| annotate(&self.path, "IO", e))
    }

    fn check_writable(&self, what: &str) -> io::Result<()> {
        if self.writable {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "{}: {what} on a device opened read-only",
                    self.path.display()
                ),
            ))
        }
    }

    /// True when the kernel takes this request as is (always, without O_DIRECT).
    fn direct_ok(&self, buf: &[u8], offset: u64) -> bool {
        !self.direct
            || ((offset | buf.len() as u64) & (self.direct_align_bytes - 1) == 0 && is_aligned(buf))
    }

    pub(super) fn pread_exact(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, offset).map_err(|e| {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                // The size was fixed at open, so the file must have shrunk under us.
                io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "{}: short read at offset {offset} length {} (file shrank?)",
                        self.path.display(),
                        buf.len()
                    ),
                )
            } else {
                e
            }
        })
    }
}

impl BlockDevice for FileDevice {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check(offset, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(());
        }
        if self.direct_ok(buf, offset) {
            self.pread_exact(buf, offset)
        } else {
            self.read_bounced(buf, offset)
        }
    }

    fn read_batch(&self, ops: &mut [ReadOp<'_>]) {
        // To the ring: reads the kernel takes as they are. The rest (a buffer or range that
        // needs bouncing, a bad range that gets its own error) go the ordinary way.
        let ringable = |op: &ReadOp<'_>| {
            !op.buf.is_empty()
                && self.direct_ok(op.buf, op.offset)
                && self.check(op.offset, op.buf.len() as u64).is_ok()
        };
        // A single read is one `pread`: as cheap as one submission, and no ring is needed.
        let use_ring = self.read_engine == ReadEngine::IoUring
            && ops.iter().filter(|op| ringable(op)).nth(1).is_some();
        if use_ring && uring::read_batch(&self.file, ops, ringable).is_ok() {
            for op in ops.iter_mut().filter(|op| !ringable(op)) {
                op.result = self.read_at(op.buf, op.offset);
            }
            return;
        }
        for op in ops.iter_mut() {
            op.result = self.read_at(op.buf, op.offset);
        }
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.check(offset, buf.len() as u64)?;
        self.check_writable("write")?;
        if buf.is_empty() {
            return Ok(());
        }
        if self.direct_ok(buf, offset) {
            self.file.write_all_at(buf, offset)
        } else {
            self.write_bounced(buf, offset)
        }
    }

    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        let total: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        self.check(offset, total)?;
        self.check_writable("write")?;
        let mut at = offset;
        let all_direct = bufs.iter().all(|b| {
            let ok = self.direct_ok(b, at);
            at += b.len() as u64;
            ok
        });
        // pwritev takes at most IOV_MAX (1024 on Linux) pieces; unaligned pieces need bouncing.
        if !all_direct || bufs.len() > 1024 || bufs.len() < 2 {
            let mut at = offset;
            for b in bufs {
                self.write_at(b, at)?;
                at += b.len() as u64;
            }
            return Ok(());
        }
        sys::pwritev_all(&self.file, bufs, offset)
    }

    fn flush(&self) -> io::Result<()> {
        // Also needed under O_DIRECT: it flushes the drive's cache and allocation metadata.
        self.file.sync_data()
    }

    fn discard(&self, offset: u64, len_bytes: u64) -> io::Result<()> {
        self.check(offset, len_bytes)?;
        self.check_writable("discard")?;
        // Trim inward to whole sectors: discarding less than asked is allowed.
        let align = self.discard_align_bytes;
        let start = offset.div_ceil(align) * align;
        let end = (offset + len_bytes) / align * align;
        if start >= end {
            return Ok(());
        }
        let result = if self.is_block_device {
            sys::blk_discard(&self.file, start, end - start)
        } else {
            sys::punch_hole(&self.file, start, end - start)
        };
        match result {
            // Discard is advisory: a device or file system without it just keeps the data.
            Err(e) if sys::is_unsupported(&e) => Ok(()),
            other => other,
        }
    }

    fn write_zeroes(&self, offset: u64, len_bytes: u64) -> io::Result<()> {
        self.check(offset, len_bytes)?;
        self.check_writable("write zeroes")?;
        if len_bytes == 0 {
            return Ok(());
        }
        // A hole reads as zeros and frees the space; a block device zeroes in the kernel.
        let result = if self.is_block_device {
            sys::blk_zeroout(&self.file, offset, len_bytes)
        } else {
            sys::punch_hole(&self.file, offset, len_bytes)
        };
        match result {
            Err(e) if sys::is_unsupported(&e) => crate::write_zero_blocks(self, offset, len_bytes),
            other => other,
        }
    }

    fn describe(&self) -> String {
        self.path.display().to_string()
    }

    /// A regular file's holes, from `SEEK_DATA`/`SEEK_HOLE` (which see writes not yet synced).
    /// A block device, or a file system without the calls, is all data.
    fn allocation(&self, offset: u64, len_bytes: u64) -> io::Result<(u64, Allocation)> {
        assert!(len_bytes > 0, "allocation of an empty range");
        let all_data = Ok((len_bytes, Allocation::Data));
        if self.is_block_device {
            return all_data;
        }
        let end = offset.saturating_add(len_bytes);
        let data_start = match sys::seek_data_or_hole(&self.file, offset, true) {
            Ok(Some(data_start)) => data_start,
            // No data from `offset` to the end of the file.
            Ok(None) => return Ok((len_bytes, Allocation::ZeroHole)),
            Err(e) if sys::is_unsupported(&e) => return all_data,
            Err(e) => return Err(annotate(&self.path, "SEEK_DATA", e)),
        };
        if data_start > offset {
            return Ok((data_start.min(end) - offset, Allocation::ZeroHole));
        }
        let hole_start = match sys::seek_data_or_hole(&self.file, offset, false) {
            Ok(found) => found.unwrap_or(end),
            Err(e) if sys::is_unsupported(&e) => return all_data,
            Err(e) => return Err(annotate(&self.path, "SEEK_HOLE", e)),
        };
        // A hole punched between the two calls can put `hole_start` at `offset`: say data.
        let run_bytes = hole_start.min(end).saturating_sub(offset).max(1);
        assert!(run_bytes <= len_bytes);
        Ok((run_bytes, Allocation::Data))
    }
}

/// Adds the path and operation to an error (the kind is kept; the errno is not).
fn annotate(path: &Path, what: &str, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {what}: {e}", path.display()))
}
