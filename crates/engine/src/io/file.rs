//! [`FileDevice`]: a regular file or block device, with O_DIRECT where the file system allows it.
//!
//! Under O_DIRECT the kernel needs the memory 4 KiB aligned and the offset and length aligned to
//! the device's direct IO granularity (512 or 4096 bytes). Requests that are not are served
//! through a per-thread aligned bounce buffer, so callers only need the 512-byte contract.

use std::cell::RefCell;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use super::aligned::{is_aligned, AlignedBuf};
use super::{check_range, BlockDevice, SECTOR_SIZE_BYTES};

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

/// Largest piece a bounced request moves at once; also the most a thread's bounce buffer grows
/// to. A multiple of 4096, so chunk boundaries stay direct-aligned.
const BOUNCE_CHUNK_BYTES: u64 = 1 << 20;

thread_local! {
    /// Reused across requests so bounced IO allocates nothing in steady state.
    static BOUNCE: RefCell<Option<AlignedBuf>> = const { RefCell::new(None) };
}

/// Linux ioctl request encoding (`_IOC` in the kernel headers): mips, powerpc and sparc put a
/// 3-bit direction at bit 29 with "none" = 1; the rest a 2-bit direction at bit 30, "none" = 0.
const fn ioctl_request(read: bool, ty: u32, nr: u32, size_bytes: usize) -> u32 {
    let three_bit_dir = cfg!(any(
        target_arch = "mips",
        target_arch = "mips64",
        target_arch = "powerpc",
        target_arch = "powerpc64",
        target_arch = "sparc",
        target_arch = "sparc64"
    ));
    let (dir_none, dir_shift) = if three_bit_dir { (1, 29) } else { (0, 30) };
    let dir = if read { 2 } else { dir_none };
    (dir << dir_shift) | ((size_bytes as u32) << 16) | (ty << 8) | nr
}

/// `_IOR(0x12, 114, size_t)`: device size in bytes as a u64 (libc does not define it).
const BLKGETSIZE64: u32 = ioctl_request(true, 0x12, 114, std::mem::size_of::<usize>());
/// `_IO(0x12, 119)`: discard a `[offset, length]` u64 pair.
const BLKDISCARD: u32 = ioctl_request(false, 0x12, 119, 0);
/// `_IO(0x12, 127)`: zero a `[offset, length]` u64 pair.
const BLKZEROOUT: u32 = ioctl_request(false, 0x12, 127, 0);

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
}

impl FileDevice {
    /// Opens a regular file or block device as a device.
    pub fn open(path: &Path, opts: FileOptions) -> io::Result<FileDevice> {
        // Check the type first: opening a FIFO would block, and a directory is never a device.
        let meta = std::fs::metadata(path).map_err(|e| annotate(path, "open", e))?;
        let file_type = meta.file_type();
        if !file_type.is_file() && !file_type.is_block_device() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: not a regular file or block device", path.display()),
            ));
        }
        if opts.direct != DirectIo::Never {
            match Self::open_direct(path, opts.writable) {
                Ok(dev) => return Ok(dev),
                Err(DirectFailure::Unsupported(reason)) => {
                    if opts.direct == DirectIo::Require {
                        return Err(io::Error::new(
                            io::ErrorKind::Unsupported,
                            format!(
                                "{}: O_DIRECT is required but not possible here: {reason}",
                                path.display()
                            ),
                        ));
                    }
                }
                Err(DirectFailure::Io(e)) => return Err(e),
            }
        }
        let file = open_file(path, opts.writable, false)?;
        Self::finish(file, path, opts.writable, false, SECTOR_SIZE_BYTES)
    }

    /// Opens with O_DIRECT and finds its alignment, or says why direct IO is not usable.
    fn open_direct(path: &Path, writable: bool) -> Result<FileDevice, DirectFailure> {
        let file = match open_file(path, writable, true) {
            Ok(file) => file,
            // tmpfs and some FUSE file systems refuse O_DIRECT at open.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                return Err(DirectFailure::Unsupported(
                    "open with O_DIRECT failed (EINVAL)".into(),
                ))
            }
            Err(e) => return Err(DirectFailure::Io(e)),
        };
        let align = probe_direct_align(&file)
            .map_err(|e| DirectFailure::Io(annotate(path, "probe read with O_DIRECT", e)))?;
        let Some(align) = align else {
            return Err(DirectFailure::Unsupported(
                "an aligned read with O_DIRECT failed (EINVAL)".into(),
            ));
        };
        let dev = Self::finish(file, path, writable, true, align).map_err(DirectFailure::Io)?;
        // The last block of such a file cannot be read or written whole without growing it.
        if dev.size_bytes % align != 0 {
            return Err(DirectFailure::Unsupported(format!(
                "file length {} is not a multiple of the direct IO alignment {align}",
                dev.size_bytes
            )));
        }
        Ok(dev)
    }

    fn finish(
        file: File,
        path: &Path,
        writable: bool,
        direct: bool,
        direct_align_bytes: u64,
    ) -> io::Result<FileDevice> {
        // Re-check on the open descriptor: the path may have been replaced since.
        let meta = file.metadata().map_err(|e| annotate(path, "stat", e))?;
        let is_block_device = meta.file_type().is_block_device();
        let (size_bytes, discard_align_bytes) = if is_block_device {
            let size = block_device_size_bytes(&file).map_err(|e| annotate(path, "size", e))?;
            let sector = block_device_sector_bytes(&file).unwrap_or(SECTOR_SIZE_BYTES);
            (size, sector)
        } else if meta.is_file() {
            (meta.len(), SECTOR_SIZE_BYTES)
        } else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: not a regular file or block device", path.display()),
            ));
        };
        // Powers of two: alignment checks use masks.
        assert!(direct_align_bytes == 512 || direct_align_bytes == 4096);
        Ok(FileDevice {
            file,
            path: path.to_path_buf(),
            size_bytes: size_bytes - size_bytes % SECTOR_SIZE_BYTES,
            is_block_device,
            writable,
            direct,
            direct_align_bytes,
            discard_align_bytes: discard_align_bytes.max(SECTOR_SIZE_BYTES),
        })
    }

    /// The path the device was opened with.
    pub fn path(&self) -> &Path {
        &self.path
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

    fn check(&self, offset: u64, len_bytes: u64) -> io::Result<()> {
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

    fn pread_exact(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
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

    /// The aligned span covering `[offset, offset + len_bytes)`.
    fn aligned_span(&self, offset: u64, len_bytes: u64) -> (u64, u64) {
        let align = self.direct_align_bytes;
        let start = offset - offset % align;
        let end = (offset + len_bytes).div_ceil(align) * align;
        // Direct mode guarantees the size is a multiple of the alignment.
        debug_assert!(end <= self.size_bytes);
        (start, end)
    }

    /// Reads through the bounce buffer, widening to the aligned span.
    fn read_bounced(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let end = offset + buf.len() as u64;
        let (span_start, span_end) = self.aligned_span(offset, buf.len() as u64);
        with_bounce(span_end - span_start, |bounce| {
            let mut chunk_start = span_start;
            while chunk_start < span_end {
                let chunk_len = (span_end - chunk_start).min(BOUNCE_CHUNK_BYTES);
                let chunk = &mut bounce[..chunk_len as usize];
                self.pread_exact(chunk, chunk_start)?;
                let lo = offset.max(chunk_start);
                let hi = end.min(chunk_start + chunk_len);
                buf[(lo - offset) as usize..(hi - offset) as usize].copy_from_slice(
                    &chunk[(lo - chunk_start) as usize..(hi - chunk_start) as usize],
                );
                chunk_start += chunk_len;
            }
            Ok(())
        })
    }

    /// Writes through the bounce buffer; partly covered edge blocks are read first.
    fn write_bounced(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let align = self.direct_align_bytes;
        let end = offset + buf.len() as u64;
        let (span_start, span_end) = self.aligned_span(offset, buf.len() as u64);
        with_bounce(span_end - span_start, |bounce| {
            let mut chunk_start = span_start;
            while chunk_start < span_end {
                let chunk_len = (span_end - chunk_start).min(BOUNCE_CHUNK_BYTES);
                let chunk_end = chunk_start + chunk_len;
                let chunk = &mut bounce[..chunk_len as usize];
                let lo = offset.max(chunk_start);
                let hi = end.min(chunk_end);
                let head_partial = lo > chunk_start;
                if head_partial {
                    self.pread_exact(&mut chunk[..align as usize], chunk_start)?;
                }
                // Skip re-reading when the head block is also the tail block.
                if hi < chunk_end && !(head_partial && chunk_len == align) {
                    let tail = (chunk_len - align) as usize;
                    self.pread_exact(&mut chunk[tail..], chunk_end - align)?;
                }
                chunk[(lo - chunk_start) as usize..(hi - chunk_start) as usize]
                    .copy_from_slice(&buf[(lo - offset) as usize..(hi - offset) as usize]);
                self.file.write_all_at(chunk, chunk_start)?;
                chunk_start = chunk_end;
            }
            Ok(())
        })
    }

    fn punch_hole(&self, offset: u64, len_bytes: u64) -> io::Result<()> {
        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        retry_eintr(|| {
            // SAFETY: plain syscall on a descriptor we own; no memory is passed.
            unsafe {
                libc::fallocate64(
                    self.file.as_raw_fd(),
                    mode,
                    offset as libc::off64_t,
                    len_bytes as libc::off64_t,
                )
            }
        })
    }

    fn blk_zeroout(&self, offset: u64, len_bytes: u64) -> io::Result<()> {
        self.blk_range_ioctl(BLKZEROOUT, offset, len_bytes)
    }

    fn blk_discard(&self, offset: u64, len_bytes: u64) -> io::Result<()> {
        self.blk_range_ioctl(BLKDISCARD, offset, len_bytes)
    }

    /// An ioctl that takes a `[offset, length]` u64 pair (BLKDISCARD, BLKZEROOUT).
    fn blk_range_ioctl(&self, request: u32, offset: u64, len_bytes: u64) -> io::Result<()> {
        let range: [u64; 2] = [offset, len_bytes];
        retry_eintr(|| {
            // SAFETY: the request reads two u64s from the pointer, which `range` provides.
            unsafe {
                libc::ioctl(
                    self.file.as_raw_fd(),
                    request as libc::Ioctl,
                    range.as_ptr(),
                )
            }
        })
    }
}

/// Why O_DIRECT could not be used: the platform can't (fall back), or a real error (report).
enum DirectFailure {
    Unsupported(String),
    Io(io::Error),
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
        let mut iov: Vec<libc::iovec> = bufs
            .iter()
            .map(|b| libc::iovec {
                iov_base: b.as_ptr() as *mut libc::c_void,
                iov_len: b.len(),
            })
            .collect();
        let mut first = 0;
        let mut at = offset;
        while first < iov.len() {
            // SAFETY: every iovec points into a live borrowed slice of its length; pwritev only
            // reads them. The fd is ours and open for writing.
            let n = unsafe {
                libc::pwritev(
                    self.file.as_raw_fd(),
                    iov[first..].as_ptr(),
                    (iov.len() - first) as libc::c_int,
                    at as libc::off_t,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    "pwritev wrote nothing",
                ));
            }
            // A short write: skip what was written and go on with the rest.
            let mut done = n as usize;
            at += done as u64;
            while first < iov.len() && done >= iov[first].iov_len {
                done -= iov[first].iov_len;
                first += 1;
            }
            if done > 0 {
                let v = &mut iov[first];
                // SAFETY: `done` < the iovec's length, so the pointer stays inside its slice.
                v.iov_base = unsafe { (v.iov_base as *mut u8).add(done) } as *mut libc::c_void;
                v.iov_len -= done;
            }
        }
        Ok(())
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
            self.blk_discard(start, end - start)
        } else {
            self.punch_hole(start, end - start)
        };
        match result {
            // Discard is advisory: a device or file system without it just keeps the data.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EOPNOTSUPP | libc::ENOTTY | libc::EINVAL | libc::ENOSYS)
                ) =>
            {
                Ok(())
            }
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
            self.blk_zeroout(offset, len_bytes)
        } else {
            self.punch_hole(offset, len_bytes)
        };
        match result {
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EOPNOTSUPP | libc::ENOTTY | libc::EINVAL | libc::ENOSYS)
                ) =>
            {
                super::write_zero_blocks(self, offset, len_bytes)
            }
            other => other,
        }
    }

    fn describe(&self) -> String {
        self.path.display().to_string()
    }
}

/// Creates a sparse regular file of `size_bytes`, or extends an existing smaller one (an
/// existing file is never shrunk).
pub fn create_sparse(path: &Path, size_bytes: u64) -> io::Result<()> {
    // Refuse non-files before opening: opening a FIFO would block, and a block device has its
    // own size.
    match std::fs::metadata(path) {
        Ok(meta) if !meta.is_file() => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: exists and is not a regular file", path.display()),
            ))
        }
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(annotate(path, "stat", e)),
    }
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| annotate(path, "create", e))?;
    let len_bytes = file
        .metadata()
        .map_err(|e| annotate(path, "stat", e))?
        .len();
    if len_bytes < size_bytes {
        file.set_len(size_bytes)
            .map_err(|e| annotate(path, "extend", e))?;
    }
    Ok(())
}

fn open_file(path: &Path, writable: bool, direct: bool) -> io::Result<File> {
    let mut opts = OpenOptions::new();
    opts.read(true).write(writable);
    if direct {
        opts.custom_flags(libc::O_DIRECT);
    }
    opts.open(path).map_err(|e| {
        // Keep the bare errno for the EINVAL fallback check in open_direct.
        if direct && e.raw_os_error() == Some(libc::EINVAL) {
            e
        } else {
            annotate(path, "open", e)
        }
    })
}

/// Finds the smallest offset/length granularity O_DIRECT reads accept: Some(512 or 4096), or
/// None when even 4096 is refused with EINVAL.
fn probe_direct_align(file: &File) -> io::Result<Option<u64>> {
    let mut buf = AlignedBuf::new(4096);
    for align in [512u64, 4096] {
        loop {
            // A short read (tiny file) still proves the alignment is accepted.
            match file.read_at(&mut buf[..align as usize], 0) {
                Ok(_) => return Ok(Some(align)),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => break,
                Err(e) => return Err(e),
            }
        }
    }
    Ok(None)
}

fn block_device_size_bytes(file: &File) -> io::Result<u64> {
    let mut size_bytes: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer.
    let rc = unsafe {
        libc::ioctl(
            file.as_raw_fd(),
            BLKGETSIZE64 as libc::Ioctl,
            &mut size_bytes as *mut u64,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(size_bytes)
}

fn block_device_sector_bytes(file: &File) -> io::Result<u64> {
    let mut sector_bytes: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one int through the pointer.
    let rc = unsafe {
        libc::ioctl(
            file.as_raw_fd(),
            libc::BLKSSZGET,
            &mut sector_bytes as *mut libc::c_int,
        )
    };
    if rc < 0 || sector_bytes <= 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(sector_bytes as u64)
}

fn retry_eintr(mut call: impl FnMut() -> libc::c_int) -> io::Result<()> {
    loop {
        if call() == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Runs `f` on this thread's bounce buffer, sized for `span_bytes` (at most one chunk).
fn with_bounce<R>(span_bytes: u64, f: impl FnOnce(&mut [u8]) -> R) -> R {
    let need_bytes = span_bytes.min(BOUNCE_CHUNK_BYTES) as usize;
    BOUNCE.with(|cell| {
        let mut slot = cell.borrow_mut();
        let big_enough = matches!(&*slot, Some(buf) if buf.len() >= need_bytes);
        if !big_enough {
            // Powers of two from 64 KiB: a thread regrows at most a few times.
            let len_bytes = need_bytes.next_power_of_two().max(64 * 1024);
            *slot = Some(AlignedBuf::new(len_bytes.min(BOUNCE_CHUNK_BYTES as usize)));
        }
        let buf = slot.as_mut().expect("bounce buffer just ensured");
        f(&mut buf[..need_bytes])
    })
}

/// Adds the path and operation to an error (the kind is kept; the errno is not).
fn annotate(path: &Path, what: &str, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {what}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;
    use std::os::unix::fs::MetadataExt;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    /// A file path in the temp directory, removed on drop.
    struct TempPath(PathBuf);

    impl TempPath {
        fn new(name: &str) -> TempPath {
            TempPath::in_dir(&std::env::temp_dir(), name)
        }

        fn in_dir(dir: &Path, name: &str) -> TempPath {
            static NEXT: AtomicU64 = AtomicU64::new(0);
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let pid = std::process::id();
            TempPath(dir.join(format!("logcache-file-test-{pid}-{n}-{name}")))
        }
    }

    impl Drop for TempPath {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn make_file(name: &str, size_bytes: u64) -> TempPath {
        let path = TempPath::new(name);
        create_sparse(&path.0, size_bytes).unwrap();
        path
    }

    fn open(path: &Path, direct: DirectIo) -> FileDevice {
        let opts = FileOptions {
            direct,
            writable: true,
        };
        FileDevice::open(path, opts).unwrap()
    }

    fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        Rng::new(seed).fill(&mut v);
        v
    }

    /// A vectored write lands its pieces back to back, with O_DIRECT (aligned pieces, one
    /// pwritev) and without (a misaligned piece: one write each), and is bounds-checked.
    #[test]
    fn vectored_writes_land_back_to_back() {
        for direct in [DirectIo::Auto, DirectIo::Never] {
            let path = make_file("vectored", 1 << 20);
            let dev = open(&path.0, direct);
            let mut a = AlignedBuf::new(8192);
            a.copy_from_slice(&random_bytes(3, 8192));
            let mut b = AlignedBuf::new(4096);
            b.copy_from_slice(&random_bytes(4, 4096));
            let c = random_bytes(5, 4096 + 1)[1..].to_vec(); // not aligned in memory
            dev.write_vectored_at(&[&a, &b], 64 * 1024).unwrap();
            dev.write_vectored_at(&[&b, &c[..]], 128 * 1024).unwrap();
            let mut back = AlignedBuf::new(12288);
            dev.read_at(&mut back, 64 * 1024).unwrap();
            assert_eq!(&back[..8192], &a[..]);
            assert_eq!(&back[8192..], &b[..]);
            let mut back = AlignedBuf::new(8192);
            dev.read_at(&mut back, 128 * 1024).unwrap();
            assert_eq!(&back[..4096], &b[..]);
            assert_eq!(&back[4096..], &c[..]);
            let err = dev
                .write_vectored_at(&[&a, &b], (1 << 20) - 8192)
                .unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        }
    }

    /// Writes and reads back with aligned and misaligned memory, at 4 KiB and 512 granularity.
    fn exercise(dev: &FileDevice) {
        // Aligned memory, aligned range.
        let mut aligned = AlignedBuf::new(16 * 1024);
        aligned.copy_from_slice(&random_bytes(1, 16 * 1024));
        dev.write_at(&aligned, 64 * 1024).unwrap();
        let mut back = AlignedBuf::new(16 * 1024);
        dev.read_at(&mut back, 64 * 1024).unwrap();
        assert_eq!(&back[..], &aligned[..]);

        // Misaligned memory (a Vec slice off by one byte).
        let mut raw = random_bytes(2, 8192 + 1);
        dev.write_at(&raw[1..], 128 * 1024).unwrap();
        let expected = raw[1..].to_vec();
        raw.fill(0);
        dev.read_at(&mut raw[1..], 128 * 1024).unwrap();
        assert_eq!(raw[1..], expected[..]);

        // 512-byte granularity inside a 4 KiB block, neighbours untouched.
        dev.write_at(&[0u8; 4096], 192 * 1024).unwrap();
        let small = random_bytes(3, 1536);
        dev.write_at(&small, 192 * 1024 + 1024).unwrap();
        let mut block = AlignedBuf::new(4096);
        dev.read_at(&mut block, 192 * 1024).unwrap();
        assert!(block[..1024].iter().all(|&b| b == 0));
        assert_eq!(&block[1024..2560], &small[..]);
        assert!(block[2560..].iter().all(|&b| b == 0));
        let mut part = vec![0u8; 512];
        dev.read_at(&mut part, 192 * 1024 + 1536).unwrap();
        assert_eq!(&part[..], &small[512..1024]);

        // A request spanning several bounce chunks, misaligned both in memory and on disk.
        let big = random_bytes(4, 3 * BOUNCE_CHUNK_BYTES as usize + 1024 + 1);
        dev.write_at(&big[1..], 256 * 1024 + 512).unwrap();
        let mut big_back = vec![0u8; big.len()];
        dev.read_at(&mut big_back[1..], 256 * 1024 + 512).unwrap();
        assert!(big_back[1..] == big[1..]);
        dev.flush().unwrap();
    }

    #[test]
    fn round_trips_in_every_mode() {
        for direct in [DirectIo::Never, DirectIo::Auto] {
            let path = make_file("modes", 8 << 20);
            let dev = open(&path.0, direct);
            if direct == DirectIo::Never {
                assert!(!dev.is_direct());
            }
            exercise(&dev);
        }
    }

    #[test]
    fn temp_dir_supports_direct_io() {
        // The test machine's temp dir is ext4, so Auto and Require must both get O_DIRECT;
        // elsewhere Require must fail with a clear message.
        let path = make_file("require", 1 << 20);
        let opts = FileOptions {
            direct: DirectIo::Require,
            writable: true,
        };
        match FileDevice::open(&path.0, opts) {
            Ok(dev) => {
                assert!(dev.is_direct());
                assert!(open(&path.0, DirectIo::Auto).is_direct());
                assert!([512, 4096].contains(&dev.direct_align_bytes()));
            }
            Err(e) => {
                assert_eq!(e.kind(), io::ErrorKind::Unsupported);
                assert!(e.to_string().contains("O_DIRECT"), "{e}");
                assert!(!open(&path.0, DirectIo::Auto).is_direct());
            }
        }
    }

    #[test]
    fn widened_io_for_4k_direct_alignment() {
        // Pretend the device needs 4 KiB direct IO (as a 4Kn disk does): 4 KiB direct IO is
        // valid on 512-byte devices too, so this exercises the widen and read-modify-write
        // paths for real.
        let path = make_file("4kn", 8 << 20);
        let mut dev = open(&path.0, DirectIo::Auto);
        if !dev.is_direct() {
            eprintln!("skipped: no O_DIRECT in the temp dir");
            return;
        }
        dev.direct_align_bytes = 4096;
        exercise(&dev);
        // A single sector at the very end of the device.
        let last = dev.size_bytes() - 512;
        dev.write_at(&[0x5a; 512], last).unwrap();
        let mut buf = vec![0u8; 512];
        dev.read_at(&mut buf, last).unwrap();
        assert_eq!(buf, vec![0x5a; 512]);
    }

    #[test]
    fn size_is_rounded_down_and_fixed() {
        let path = TempPath::new("size");
        std::fs::write(&path.0, vec![1u8; 3 * 4096 + 700]).unwrap();
        // Not a multiple of 512 on the tail: still opens; the partial sector is ignored.
        let dev = open(&path.0, DirectIo::Never);
        assert_eq!(dev.size_bytes(), 3 * 4096 + 512);
        assert!(!dev.is_block_device());
        assert_eq!(dev.describe(), path.0.display().to_string());
        assert_eq!(dev.path(), path.0.as_path());
        // Auto either uses direct IO (512-byte alignment) or falls back: both read the data.
        let auto = open(&path.0, DirectIo::Auto);
        assert_eq!(auto.size_bytes(), 3 * 4096 + 512);
        let mut buf = vec![0u8; 512];
        auto.read_at(&mut buf, 3 * 4096).unwrap();
        assert_eq!(buf, vec![1u8; 512]);
    }

    #[test]
    fn out_of_range_and_unaligned_io_are_errors() {
        let path = make_file("range", 64 * 1024);
        let dev = open(&path.0, DirectIo::Auto);
        let mut buf = AlignedBuf::new(4096);
        for (offset, len) in [
            (64 * 1024, 4096),
            (60 * 1024 + 512, 4096),
            (100, 512),
            (0, 100),
        ] {
            let e = dev.read_at(&mut buf[..len], offset).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
            assert!(e.to_string().contains(&*path.0.to_string_lossy()), "{e}");
            assert!(dev.write_at(&buf[..len], offset).is_err());
        }
        assert!(dev.discard(u64::MAX - 511, 512).is_err());
    }

    #[test]
    fn short_read_is_an_error() {
        let path = make_file("short", 64 * 1024);
        let dev = open(&path.0, DirectIo::Auto);
        // Shrink the file behind the device's back.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path.0)
            .unwrap()
            .set_len(32 * 1024)
            .unwrap();
        let mut buf = AlignedBuf::new(4096);
        let e = dev.read_at(&mut buf, 48 * 1024).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        assert!(e.to_string().contains("short read"), "{e}");
    }

    #[test]
    fn discard_punches_a_hole() {
        for direct in [DirectIo::Never, DirectIo::Auto] {
            let path = make_file("discard", 4 << 20);
            let dev = open(&path.0, direct);
            dev.write_at(&vec![0xEEu8; 4 << 20], 0).unwrap();
            dev.flush().unwrap();
            let blocks_before = std::fs::metadata(&path.0).unwrap().blocks();
            // Unaligned to 4 KiB at both ends, so the file system zeroes partial blocks too.
            dev.discard(512, (2 << 20) + 1024).unwrap();
            let mut all = vec![0u8; 4 << 20];
            dev.read_at(&mut all, 0).unwrap();
            for (i, &b) in all.iter().enumerate() {
                let discarded = (512..512 + (2 << 20) + 1024).contains(&i);
                assert_eq!(b, if discarded { 0 } else { 0xEE }, "byte {i} ({direct:?})");
            }
            let meta = std::fs::metadata(&path.0).unwrap();
            assert_eq!(meta.len(), 4 << 20, "discard must keep the size");
            assert!(meta.blocks() < blocks_before, "no space was freed");
        }
    }

    #[test]
    fn read_only_device_refuses_writes() {
        let path = make_file("ro", 64 * 1024);
        let opts = FileOptions {
            direct: DirectIo::Auto,
            writable: false,
        };
        let dev = FileDevice::open(&path.0, opts).unwrap();
        let mut buf = AlignedBuf::new(4096);
        dev.read_at(&mut buf, 0).unwrap();
        let e = dev.write_at(&buf, 0).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert!(dev.discard(0, 4096).is_err());
        dev.flush().unwrap();
    }

    #[test]
    fn open_errors_name_the_path() {
        let missing = TempPath::new("missing");
        let e = FileDevice::open(&missing.0, FileOptions::default())
            .err()
            .unwrap();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(e.to_string().contains(&*missing.0.to_string_lossy()), "{e}");
        let e = FileDevice::open(&std::env::temp_dir(), FileOptions::default())
            .err()
            .unwrap();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }

    #[test]
    fn create_sparse_creates_and_extends_but_never_shrinks() {
        let path = TempPath::new("sparse");
        create_sparse(&path.0, 1 << 30).unwrap();
        let meta = std::fs::metadata(&path.0).unwrap();
        assert_eq!(meta.len(), 1 << 30);
        assert!(meta.blocks() * 512 < 1 << 20, "file is not sparse");
        std::fs::write(&path.0, [7u8; 1000]).unwrap();
        create_sparse(&path.0, 4096).unwrap();
        assert_eq!(std::fs::metadata(&path.0).unwrap().len(), 4096);
        assert_eq!(&std::fs::read(&path.0).unwrap()[..1000], &[7u8; 1000]);
        create_sparse(&path.0, 512).unwrap();
        assert_eq!(std::fs::metadata(&path.0).unwrap().len(), 4096);
        assert!(create_sparse(&std::env::temp_dir(), 4096).is_err());
    }

    #[test]
    fn tmpfs_opens_in_auto_mode() {
        // tmpfs refuses O_DIRECT on older kernels and accepts it on newer ones; Auto must
        // work either way.
        let shm = Path::new("/dev/shm");
        if !shm.is_dir() {
            return;
        }
        let path = TempPath::in_dir(shm, "tmpfs");
        create_sparse(&path.0, 8 << 20).unwrap();
        exercise(&open(&path.0, DirectIo::Auto));
    }

    #[test]
    fn concurrent_misaligned_io_from_many_threads() {
        // Each thread uses its own bounce buffer; blocks are disjoint per thread.
        let path = make_file("threads", 4 << 20);
        let dev = Arc::new(open(&path.0, DirectIo::Auto));
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let dev = Arc::clone(&dev);
                std::thread::spawn(move || {
                    let mut rng = Rng::new(t);
                    let mut data = vec![0u8; 4097];
                    let mut back = vec![0u8; 4097];
                    for _ in 0..200 {
                        let block = rng.below(256) * 4 + t;
                        rng.fill(&mut data);
                        dev.write_at(&data[1..], block * 4096).unwrap();
                        dev.read_at(&mut back[1..], block * 4096).unwrap();
                        assert!(back[1..] == data[1..]);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn ioctl_numbers_match_the_kernel_headers() {
        assert_eq!(BLKGETSIZE64, 0x8008_1272);
        assert_eq!(BLKDISCARD, 0x1277);
    }

    #[test]
    fn block_device_from_env() {
        // Set LOGCACHE_TEST_BLOCK_DEVICE to a block device to check size and a direct read;
        // it is opened read-only and never written.
        let Ok(dev_path) = std::env::var("LOGCACHE_TEST_BLOCK_DEVICE") else {
            return;
        };
        let opts = FileOptions {
            direct: DirectIo::Auto,
            writable: false,
        };
        let dev = FileDevice::open(Path::new(&dev_path), opts).unwrap();
        assert!(dev.is_block_device());
        assert!(dev.size_bytes() > 0 && dev.size_bytes() & 511 == 0);
        let mut buf = vec![0u8; 4096 + 1];
        dev.read_at(&mut buf[1..], dev.size_bytes() - 4096).unwrap();
        eprintln!(
            "{dev_path}: {} bytes, direct {}, align {}",
            dev.size_bytes(),
            dev.is_direct(),
            dev.direct_align_bytes()
        );
    }

    #[test]
    fn scratch_block_device_from_env() {
        // DESTRUCTIVE: set LOGCACHE_TEST_SCRATCH_BLOCK_DEVICE to a throwaway block device (e.g.
        // a loop device, also one made with `losetup --sector-size 4096`) to run the read/write
        // and discard checks on it.
        let Ok(dev_path) = std::env::var("LOGCACHE_TEST_SCRATCH_BLOCK_DEVICE") else {
            return;
        };
        for direct in [DirectIo::Never, DirectIo::Auto] {
            let dev = open(Path::new(&dev_path), direct);
            assert!(dev.is_block_device());
            eprintln!(
                "{dev_path}: {} bytes, direct {}, align {}, discard align {}",
                dev.size_bytes(),
                dev.is_direct(),
                dev.direct_align_bytes(),
                dev.discard_align_bytes
            );
            exercise(&dev);
            dev.write_at(&vec![0xEEu8; 1 << 20], 0).unwrap();
            dev.discard(0, 1 << 20).unwrap();
            dev.flush().unwrap();
            let mut back = AlignedBuf::new(1 << 20);
            dev.read_at(&mut back, 0).unwrap();
            // Discarded contents are unspecified, but loop devices read zeros back.
            eprintln!("zeros after discard: {}", back.iter().all(|&b| b == 0));
        }
    }
}
