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

/// The size (and alignment) of an x86-64 transparent huge page.
pub const HUGE_PAGE_BYTES: usize = 2 << 20;

/// A fresh private anonymous mapping of `len_bytes` (zero-filled, page-aligned), owned by the
/// caller; out of memory ends the process as a failed allocation does.
fn map_anonymous(len_bytes: usize) -> *mut libc::c_void {
    // SAFETY: a new mapping at an address the kernel picks; no existing memory is touched.
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
        std::alloc::handle_alloc_error(AlignedBuf::layout(len_bytes));
    }
    raw
}

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
            let raw = map_anonymous(len_bytes);
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

    /// A buffer of at least `len_bytes` (rounded up to whole 2 MiB huge pages) whose start is
    /// 2 MiB-aligned and which the kernel is asked to back with transparent huge pages
    /// (`MADV_HUGEPAGE`; without them it is an ordinary mapped buffer). For a large buffer
    /// reused for many O_DIRECT reads: the kernel pins a read's pages for each IO, one page
    /// table entry per 4 KiB page, and that cost ~4.5% of the server's CPU for 1 MiB cached
    /// reads; with huge pages it is a few entries (and the CRC pass and the reply's copy miss
    /// the TLB less).
    pub fn new_huge_pages(len_bytes: usize) -> Self {
        assert!(len_bytes > 0);
        let len_bytes = len_bytes.next_multiple_of(HUGE_PAGE_BYTES);
        // Mapped one huge page larger, then trimmed to the aligned part: mmap promises only
        // 4 KiB alignment.
        let mapped_bytes = len_bytes + HUGE_PAGE_BYTES;
        let raw = map_anonymous(mapped_bytes);
        let base = raw as usize;
        let start = base.next_multiple_of(HUGE_PAGE_BYTES);
        let head_bytes = start - base;
        let tail_bytes = mapped_bytes - head_bytes - len_bytes;
        // SAFETY: the head and tail lie inside the mapping made above and outside the part
        // kept; unmapping them cannot fail but for bad arguments, which these are not.
        unsafe {
            if head_bytes > 0 {
                let rc = libc::munmap(raw, head_bytes);
                assert_eq!(rc, 0, "munmap of a huge-page buffer's head");
            }
            if tail_bytes > 0 {
                let rc = libc::munmap((start + len_bytes) as *mut libc::c_void, tail_bytes);
                assert_eq!(rc, 0, "munmap of a huge-page buffer's tail");
            }
            // Only a hint: where the kernel refuses, the buffer works with small pages.
            let _ = libc::madvise(start as *mut libc::c_void, len_bytes, libc::MADV_HUGEPAGE);
        }
        let ptr = NonNull::new(start as *mut u8).expect("mmap returned a null mapping");
        debug_assert!(len_bytes >= MAP_MIN_BYTES, "dropped as a mapping");
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
    (buf.as_ptr() as usize).is_multiple_of(BUFFER_ALIGN_BYTES)
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

    #[test]
    fn huge_page_buffers_are_whole_aligned_huge_pages_and_zeroed() {
        for len in [1usize, 4096, (1 << 20) + 4096, 2 << 20, (2 << 20) + 1] {
            let mut b = AlignedBuf::new_huge_pages(len);
            assert_eq!(b.as_ptr() as usize % HUGE_PAGE_BYTES, 0);
            assert_eq!(b.len(), len.next_multiple_of(HUGE_PAGE_BYTES));
            assert!(b.iter().all(|&x| x == 0));
            let last = b.len() - 1;
            b[0] = 1;
            b[last] = 7;
            assert_eq!((b[0], b[last]), (1, 7));
        }
    }
}
