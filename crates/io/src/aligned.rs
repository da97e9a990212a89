//! Heap buffers aligned to 4 KiB, as O_DIRECT needs.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// Alignment of every buffer the engine hands to a device.
pub const BUFFER_ALIGN_BYTES: usize = 4096;

/// Buffers of at least this size are mapped from the kernel (zero pages until first written)
/// rather than allocated and zeroed: the allocator zeroes a 4 KiB-aligned allocation with a
/// `memset`, which for writeback's 32 MiB batch buffer cost every engine open a 32 MiB write
/// and every close the unmapping of it, used or not.
const MAP_MIN_BYTES: usize = 1 << 20;

/// A zero-initialised byte buffer whose start is 4 KiB-aligned.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len_bytes: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out &[u8].
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Allocates `len_bytes` zeroed bytes. `len_bytes` must be a non-zero multiple of 512.
    pub fn new(len_bytes: usize) -> Self {
        assert!(len_bytes > 0);
        assert_eq!(len_bytes % 512, 0, "aligned buffers are whole sectors");
        let layout = Self::layout(len_bytes);
        if len_bytes >= MAP_MIN_BYTES {
            // SAFETY: a fresh private anonymous mapping, owned by the buffer until drop.
            let raw = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len_bytes,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if raw == libc::MAP_FAILED {
                std::alloc::handle_alloc_error(layout);
            }
            let ptr = NonNull::new(raw as *mut u8).expect("mmap returned a null mapping");
            // Pages are at least 4 KiB: the mapping's start is aligned.
            debug_assert_eq!(ptr.as_ptr() as usize % BUFFER_ALIGN_BYTES, 0);
            return AlignedBuf { ptr, len_bytes };
        }
        // SAFETY: layout has non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len_bytes }
    }

    fn layout(len_bytes: usize) -> Layout {
        Layout::from_size_align(len_bytes, BUFFER_ALIGN_BYTES).expect("buffer layout")
    }

    /// Raw pointer to the first byte (for buffers shared under external synchronisation).
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len_bytes initialised bytes for the life of self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len_bytes) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self guarantees exclusivity.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len_bytes) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.len_bytes >= MAP_MIN_BYTES {
            // SAFETY: mapped in new() with this length; nothing refers to it after drop.
            let rc = unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len_bytes) };
            debug_assert_eq!(rc, 0, "munmap of an aligned buffer");
            return;
        }
        // SAFETY: allocated in new() with the same layout.
        unsafe { dealloc(self.ptr.as_ptr(), Self::layout(self.len_bytes)) }
    }
}

/// True when `buf` starts on a 4 KiB boundary.
pub fn is_aligned(buf: &[u8]) -> bool {
    (buf.as_ptr() as usize) % BUFFER_ALIGN_BYTES == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_and_zeroed() {
        // Both kinds: allocated (below 1 MiB) and mapped, each written and dropped.
        for len in [512usize, 4096, (1 << 20) - 512, 1 << 20, 32 << 20] {
            let mut b = AlignedBuf::new(len);
            assert!(is_aligned(&b));
            assert_eq!(b.len(), len);
            assert!(b.iter().all(|&x| x == 0));
            b[len - 1] = 7;
            assert_eq!(b[len - 1], 7);
        }
    }
}
