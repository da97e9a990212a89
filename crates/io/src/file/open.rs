//! Opening a [`FileDevice`]: the file's kind and size, whether O_DIRECT works on it and at what
//! alignment, and creating sparse backing files.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::Path;

use super::sys::{block_device_sector_bytes, block_device_size_bytes};
use super::{annotate, DirectIo, FileDevice, FileOptions};
use crate::aligned::AlignedBuf;
use crate::SECTOR_SIZE_BYTES;

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
            read_engine: super::ReadEngine::Sync,
        })
    }
}

/// Why O_DIRECT could not be used: the platform can't (fall back), or a real error (report).
enum DirectFailure {
    Unsupported(String),
    Io(io::Error),
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
