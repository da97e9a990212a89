//! The raw kernel calls a [`FileDevice`](super::FileDevice) makes: block-device ioctls (size,
//! sector size, discard, zero-out), hole punching, and vectored writes; each retries EINTR.

use std::fs::File;
use std::io;
use std::os::unix::io::AsRawFd;

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
pub(super) const BLKGETSIZE64: u32 = ioctl_request(true, 0x12, 114, std::mem::size_of::<usize>());
/// `_IO(0x12, 119)`: discard a `[offset, length]` u64 pair.
pub(super) const BLKDISCARD: u32 = ioctl_request(false, 0x12, 119, 0);
/// `_IO(0x12, 127)`: zero a `[offset, length]` u64 pair.
const BLKZEROOUT: u32 = ioctl_request(false, 0x12, 127, 0);

/// Deallocates a range of a regular file, keeping its size: the range then reads as zeros.
pub(super) fn punch_hole(file: &File, offset: u64, len_bytes: u64) -> io::Result<()> {
    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    retry_eintr(|| {
        // SAFETY: plain syscall on a descriptor we own; no memory is passed.
        unsafe {
            libc::fallocate64(
                file.as_raw_fd(),
                mode,
                offset as libc::off64_t,
                len_bytes as libc::off64_t,
            )
        }
    })
}

/// Has the kernel zero a range of a block device.
pub(super) fn blk_zeroout(file: &File, offset: u64, len_bytes: u64) -> io::Result<()> {
    blk_range_ioctl(file, BLKZEROOUT, offset, len_bytes)
}

/// Discards a range of a block device.
pub(super) fn blk_discard(file: &File, offset: u64, len_bytes: u64) -> io::Result<()> {
    blk_range_ioctl(file, BLKDISCARD, offset, len_bytes)
}

/// An ioctl that takes a `[offset, length]` u64 pair (BLKDISCARD, BLKZEROOUT).
fn blk_range_ioctl(file: &File, request: u32, offset: u64, len_bytes: u64) -> io::Result<()> {
    let range: [u64; 2] = [offset, len_bytes];
    retry_eintr(|| {
        // SAFETY: the request reads two u64s from the pointer, which `range` provides.
        unsafe { libc::ioctl(file.as_raw_fd(), request as libc::Ioctl, range.as_ptr()) }
    })
}

/// Writes `bufs` back to back from `offset` with `pwritev` (at most IOV_MAX pieces, each
/// acceptable to the kernel as is), going on after short writes.
pub(super) fn pwritev_all(file: &File, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
    assert!(bufs.len() <= 1024, "more pieces than IOV_MAX");
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
                file.as_raw_fd(),
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

/// A block device's size in bytes.
pub(super) fn block_device_size_bytes(file: &File) -> io::Result<u64> {
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

/// A block device's logical sector size in bytes.
pub(super) fn block_device_sector_bytes(file: &File) -> io::Result<u64> {
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

/// `lseek` with `SEEK_DATA` or `SEEK_HOLE` from `offset`: the offset found, or `None` when the
/// kernel says there is none (ENXIO: no data at or after `offset`).
pub(super) fn seek_data_or_hole(file: &File, offset: u64, data: bool) -> io::Result<Option<u64>> {
    let whence = if data {
        libc::SEEK_DATA
    } else {
        libc::SEEK_HOLE
    };
    loop {
        // SAFETY: plain syscall on a descriptor we own; it only moves the (unused) file offset,
        // since every IO of a FileDevice is positional.
        let found = unsafe { libc::lseek64(file.as_raw_fd(), offset as libc::off64_t, whence) };
        if found >= 0 {
            return Ok(Some(found as u64));
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::ENXIO) => return Ok(None),
            _ => return Err(e),
        }
    }
}

/// Whether a hole punch, discard or zero-out failed only because the device or file system
/// does not offer it (the caller then falls back or, for an advisory discard, does nothing).
pub(super) fn is_unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EOPNOTSUPP | libc::ENOTTY | libc::EINVAL | libc::ENOSYS)
    )
}

/// Repeats a call that returns 0 or -1 with errno until it succeeds or fails other than EINTR.
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
