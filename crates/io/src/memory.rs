//! [`MemDevice`]: a block device in RAM, striped-locked so many threads can do IO at once.

use std::io;
use std::ptr::NonNull;

use parking_lot::RwLock;

use crate::{check_range, BlockDevice};

/// Memory is locked in pieces of this size; a request copies one piece at a time.
const PIECE_BYTES: u64 = 64 * 1024;
/// Number of locks the pieces share (piece index modulo this). Enough that two threads doing
/// random 4 KiB IO rarely meet on one lock.
const STRIPE_COUNT: usize = 256;

/// Writes of at least this many bytes bypass the CPU's caches (`copy_streaming`): whole blocks
/// and chunks, which nobody reads again soon (the flusher's chunks, writeback's blocks). Smaller
/// writes (metadata, superblocks) are often read back at once and keep the cached copy.
const STREAM_MIN_BYTES: usize = 4096;

/// One lock on its own cache line, so threads taking neighbouring stripes don't false-share.
#[repr(align(64))]
struct Stripe(RwLock<()>);

/// A RAM-backed [`BlockDevice`], zero-filled at creation. Flush is a no-op; discard zeroes.
///
/// The memory is an anonymous private mapping, so untouched pages cost nothing: a device of
/// several GiB only uses RAM for the parts that were written.
pub struct MemDevice {
    base: NonNull<u8>,
    size_bytes: u64,
    /// Length of the mapping (at least one page, so `mmap` never sees 0).
    map_len_bytes: usize,
    stripes: Box<[Stripe]>,
}

// SAFETY: the mapping is owned by the device; every access to its bytes happens under the
// stripe lock of the piece it falls in (shared for reads, exclusive for writes).
unsafe impl Send for MemDevice {}
// SAFETY: as above.
unsafe impl Sync for MemDevice {}

impl MemDevice {
    /// Creates a zeroed device of `size_bytes` (a multiple of 512).
    ///
    /// Panics if the size is not a multiple of 512 or the address space cannot hold it.
    pub fn new(size_bytes: u64) -> MemDevice {
        Self::with_flags(size_bytes, 0)
    }

    /// Like [`MemDevice::new`], but every page is faulted in now (`MAP_POPULATE`), so that
    /// benchmarks measure the steady state rather than the kernel zeroing fresh pages.
    pub fn new_prefaulted(size_bytes: u64) -> MemDevice {
        Self::with_flags(size_bytes, libc::MAP_POPULATE)
    }

    fn with_flags(size_bytes: u64, extra_flags: libc::c_int) -> MemDevice {
        assert_eq!(
            size_bytes % crate::SECTOR_SIZE_BYTES,
            0,
            "memory device size {size_bytes} is not a multiple of 512"
        );
        let size_usize = usize::try_from(size_bytes).expect("memory device size exceeds usize");
        let page_bytes = page_size_bytes();
        let map_len_bytes = size_usize.max(1).next_multiple_of(page_bytes);
        // mmap rather than alloc_zeroed: with 4 KiB alignment the std allocator memsets the
        // whole block (committing every page up front); a fresh anonymous mapping is zero and
        // paged in lazily.
        // SAFETY: anonymous mapping with no address hint; the result is checked below.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len_bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | extra_flags,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            panic!(
                "memory device: mmap of {map_len_bytes} bytes failed: {}",
                io::Error::last_os_error()
            );
        }
        let base = NonNull::new(raw.cast::<u8>()).expect("mmap returned null");
        let stripes = (0..STRIPE_COUNT)
            .map(|_| Stripe(RwLock::new(())))
            .collect::<Vec<_>>()
            .into_boxed_slice();
        MemDevice {
            base,
            size_bytes,
            map_len_bytes,
            stripes,
        }
    }

    fn stripe(&self, piece_index: u64) -> &RwLock<()> {
        &self.stripes[(piece_index % STRIPE_COUNT as u64) as usize].0
    }

    /// Calls `f(device_offset, buf_pos, len)` for each piece-bounded chunk of
    /// `[offset, offset + len_bytes)`, in order. The range must already be checked.
    fn for_each_piece(&self, offset: u64, len_bytes: u64, mut f: impl FnMut(u64, usize, usize)) {
        debug_assert!(offset + len_bytes <= self.size_bytes);
        let end = offset + len_bytes;
        let mut pos = offset;
        while pos < end {
            let piece_end = (pos / PIECE_BYTES + 1) * PIECE_BYTES;
            let chunk_end = piece_end.min(end);
            f(pos, (pos - offset) as usize, (chunk_end - pos) as usize);
            pos = chunk_end;
        }
    }

    /// Pointer to the byte at `offset` (in bounds by the caller's range check).
    fn at(&self, offset: u64) -> *mut u8 {
        debug_assert!(offset <= self.size_bytes);
        // SAFETY: offset <= size_bytes <= map_len_bytes, so the result is inside (or one past)
        // the mapping.
        unsafe { self.base.as_ptr().add(offset as usize) }
    }
}

impl Drop for MemDevice {
    fn drop(&mut self) {
        // SAFETY: base/map_len_bytes are exactly what mmap returned in new(); nothing borrows
        // the mapping once the device is being dropped.
        let rc = unsafe { libc::munmap(self.base.as_ptr().cast(), self.map_len_bytes) };
        debug_assert_eq!(rc, 0, "munmap failed");
    }
}

impl BlockDevice for MemDevice {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_range(self.size_bytes, offset, buf.len() as u64)?;
        let dst = buf.as_mut_ptr();
        self.for_each_piece(offset, buf.len() as u64, |dev_pos, buf_pos, len| {
            let _shared = self.stripe(dev_pos / PIECE_BYTES).read();
            // SAFETY: both ranges are in bounds (range checked above); writers of this piece
            // are excluded by the stripe lock; `buf` is a caller-owned slice, so it cannot
            // overlap the mapping.
            unsafe { std::ptr::copy_nonoverlapping(self.at(dev_pos), dst.add(buf_pos), len) };
        });
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        check_range(self.size_bytes, offset, buf.len() as u64)?;
        let src = buf.as_ptr();
        self.for_each_piece(offset, buf.len() as u64, |dev_pos, buf_pos, len| {
            let _exclusive = self.stripe(dev_pos / PIECE_BYTES).write();
            // SAFETY: in bounds as above; the exclusive stripe lock excludes every other
            // access to this piece; `buf` is caller-owned, so it cannot overlap the mapping.
            // The streaming copy's stores are fenced before it returns, so they are ordered
            // before the lock's release below.
            unsafe {
                if len >= STREAM_MIN_BYTES {
                    copy_streaming(src.add(buf_pos), self.at(dev_pos), len);
                } else {
                    std::ptr::copy_nonoverlapping(src.add(buf_pos), self.at(dev_pos), len);
                }
            };
        });
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        // RAM has nothing volatile behind it.
        Ok(())
    }

    fn discard(&self, offset: u64, len_bytes: u64) -> io::Result<()> {
        check_range(self.size_bytes, offset, len_bytes)?;
        self.for_each_piece(offset, len_bytes, |dev_pos, _, len| {
            let _exclusive = self.stripe(dev_pos / PIECE_BYTES).write();
            // SAFETY: in bounds; exclusive stripe lock held.
            unsafe { std::ptr::write_bytes(self.at(dev_pos), 0, len) };
        });
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len_bytes: u64) -> io::Result<()> {
        // Discard already zeroes exactly the range.
        self.discard(offset, len_bytes)
    }

    fn describe(&self) -> String {
        format!("memory ({} bytes)", self.size_bytes)
    }

    fn read_gap_bytes_max(&self) -> u64 {
        // A read is a copy: every gap byte read over is copied for nothing.
        0
    }
}

/// Copies `len` bytes from `src` to `dst` like `copy_nonoverlapping`, but on x86_64 the
/// 64-byte-aligned part of the destination is written with non-temporal stores, which go to
/// memory without first reading each destination line into the cache and without evicting
/// what the caller's threads work on. The emulated device's write then costs what a DMA from
/// the buffer would: the flusher's copy of each chunk into the memory cache device was ~0.8 µs
/// of `bench engine`'s ~2 µs of CPU per write, mostly those destination misses (BENCHMARKS.md,
/// issue 20). Elsewhere it is `copy_nonoverlapping`.
///
/// # Safety
/// As `copy_nonoverlapping`: `src` valid for `len` bytes of reads, `dst` for `len` bytes of
/// writes, the two not overlapping. On return every store is complete (fenced), so a lock
/// released afterwards publishes the bytes like an ordinary copy's.
unsafe fn copy_streaming(src: *const u8, dst: *mut u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        let kernel: LineKernel = if std::arch::is_x86_feature_detected!("avx512f") {
            stream_lines_avx512
        } else {
            stream_lines_sse2
        };
        // SAFETY: the caller's contract; the AVX-512 kernel only where the CPU has it.
        unsafe { copy_streaming_with(src, dst, len, kernel) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: the caller's contract.
    unsafe {
        std::ptr::copy_nonoverlapping(src, dst, len)
    };
}

/// Copies `lines × 64` bytes to a 64-byte-aligned destination with streaming stores, unfenced.
#[cfg(target_arch = "x86_64")]
type LineKernel = unsafe fn(*const u8, *mut u8, usize);

/// [`copy_streaming`] with the line kernel given (so tests can run each one).
///
/// # Safety
/// As [`copy_streaming`], and the CPU must have what `kernel` needs.
#[cfg(target_arch = "x86_64")]
unsafe fn copy_streaming_with(src: *const u8, dst: *mut u8, len: usize, kernel: LineKernel) {
    const LINE: usize = 64;
    // Head up to the first 64-byte boundary of the destination, body in whole lines, tail.
    let head = (dst as usize).wrapping_neg() % LINE;
    if head >= len {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
        return;
    }
    let lines = (len - head) / LINE;
    let body = lines * LINE;
    // SAFETY: every access stays within [0, len) of both ranges (head + body <= len), and
    // dst + head is 64-byte aligned, as the kernels need.
    unsafe {
        std::ptr::copy_nonoverlapping(src, dst, head);
        let (s, d) = (src.add(head), dst.add(head));
        kernel(s, d, lines);
        // Streaming stores are weakly ordered: without the fence, a later store (the stripe
        // lock's release) could become visible to another thread before them.
        std::arch::x86_64::_mm_sfence();
        std::ptr::copy_nonoverlapping(s.add(body), d.add(body), len - head - body);
    }
}

/// SSE2 (the x86_64 baseline): four 16-byte loads, then four streaming stores that fill the
/// line's write-combining buffer whole.
///
/// # Safety
/// `src` readable and `dst` (64-byte aligned) writable for `lines × 64` bytes, not overlapping.
#[cfg(target_arch = "x86_64")]
unsafe fn stream_lines_sse2(src: *const u8, dst: *mut u8, lines: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
    for i in (0..lines * 64).step_by(64) {
        // SAFETY: the caller's contract; each store is 16-byte aligned.
        unsafe {
            let a = _mm_loadu_si128(src.add(i).cast::<__m128i>());
            let b = _mm_loadu_si128(src.add(i + 16).cast::<__m128i>());
            let c = _mm_loadu_si128(src.add(i + 32).cast::<__m128i>());
            let e = _mm_loadu_si128(src.add(i + 48).cast::<__m128i>());
            _mm_stream_si128(dst.add(i).cast::<__m128i>(), a);
            _mm_stream_si128(dst.add(i + 16).cast::<__m128i>(), b);
            _mm_stream_si128(dst.add(i + 32).cast::<__m128i>(), c);
            _mm_stream_si128(dst.add(i + 48).cast::<__m128i>(), e);
        }
    }
}

/// AVX-512: one 64-byte load and one streaming store per line.
///
/// # Safety
/// As [`stream_lines_sse2`], and the CPU must have AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn stream_lines_avx512(src: *const u8, dst: *mut u8, lines: usize) {
    use std::arch::x86_64::{__m512i, _mm512_loadu_si512, _mm512_stream_si512};
    for i in (0..lines * 64).step_by(64) {
        // SAFETY: the caller's contract; each store is 64-byte aligned.
        unsafe {
            let a = _mm512_loadu_si512(src.add(i).cast::<__m512i>());
            _mm512_stream_si512(dst.add(i).cast::<__m512i>(), a);
        }
    }
}

fn page_size_bytes() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if page > 0 {
        page as usize
    } else {
        4096
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aligned::AlignedBuf;
    use logcache_testkit::rng::Rng;
    use std::sync::Arc;

    #[test]
    fn starts_zeroed_and_round_trips() {
        let dev = MemDevice::new(1 << 20);
        assert_eq!(dev.size_bytes(), 1 << 20);
        assert_eq!(dev.describe(), "memory (1048576 bytes)");
        let mut buf = vec![0xffu8; 4096];
        dev.read_at(&mut buf, 8192).unwrap();
        assert!(buf.iter().all(|&b| b == 0));

        let data: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
        dev.write_at(&data, 8192).unwrap();
        dev.flush().unwrap();
        dev.read_at(&mut buf, 8192).unwrap();
        assert_eq!(buf, data);
    }

    #[test]
    fn io_spanning_pieces() {
        // Crosses several 64 KiB pieces, starting and ending mid-piece, unaligned memory.
        let dev = MemDevice::new(1 << 20);
        let mut rng = Rng::new(3);
        let mut data = vec![0u8; 200 * 1024 + 1];
        rng.fill(&mut data);
        let data = &data[1..]; // deliberately misaligned source
        let offset = PIECE_BYTES - 512;
        dev.write_at(data, offset).unwrap();
        let mut back = AlignedBuf::new(data.len());
        dev.read_at(&mut back, offset).unwrap();
        assert_eq!(&back[..], data);
        // The bytes around the write stay zero.
        let mut edge = vec![1u8; 512];
        dev.read_at(&mut edge, offset - 512).unwrap();
        assert!(edge.iter().all(|&b| b == 0));
        dev.read_at(&mut edge, offset + data.len() as u64).unwrap();
        assert!(edge.iter().all(|&b| b == 0));
    }

    /// Every copy `copy_streaming` may use on this machine: itself, and on x86_64 each line
    /// kernel the CPU has (the SSE2 fallback always).
    #[allow(clippy::type_complexity)]
    fn streaming_copies() -> Vec<(&'static str, unsafe fn(*const u8, *mut u8, usize))> {
        let mut copies: Vec<(&'static str, unsafe fn(*const u8, *mut u8, usize))> =
            vec![("copy_streaming", copy_streaming)];
        #[cfg(target_arch = "x86_64")]
        {
            unsafe fn sse2(src: *const u8, dst: *mut u8, len: usize) {
                // SAFETY: the caller's contract; SSE2 is in the x86_64 baseline.
                unsafe { copy_streaming_with(src, dst, len, stream_lines_sse2) }
            }
            unsafe fn avx512(src: *const u8, dst: *mut u8, len: usize) {
                // SAFETY: the caller's contract; listed only where the CPU has AVX-512F.
                unsafe { copy_streaming_with(src, dst, len, stream_lines_avx512) }
            }
            copies.push(("sse2", sse2));
            if std::arch::is_x86_feature_detected!("avx512f") {
                copies.push(("avx512", avx512));
            }
        }
        copies
    }

    #[test]
    fn streaming_copy_equals_a_plain_copy() {
        // Every alignment of source and destination (head, whole lines, tail), lengths around
        // the line size and the streaming threshold; the bytes around the destination stay.
        for (name, copy) in streaming_copies() {
            streaming_copy_case(name, copy);
        }
    }

    fn streaming_copy_case(name: &str, copy: unsafe fn(*const u8, *mut u8, usize)) {
        let mut rng = Rng::new(11);
        let mut src = vec![0u8; 2 * STREAM_MIN_BYTES + 256];
        rng.fill(&mut src);
        for len in [
            0,
            1,
            63,
            64,
            65,
            200,
            511,
            4096,
            4097,
            8191,
            2 * STREAM_MIN_BYTES,
        ] {
            for src_shift in [0, 1, 8, 16, 63] {
                for dst_shift in [0, 1, 15, 16, 48, 63] {
                    let mut dst = AlignedBuf::new((len + 256).next_multiple_of(512));
                    dst.fill(0xa5);
                    let from = &src[src_shift..src_shift + len];
                    // SAFETY: from and dst[dst_shift..] hold len bytes each, distinct buffers;
                    // each kernel runs only where the CPU has it.
                    unsafe { copy(from.as_ptr(), dst.as_mut_ptr().add(dst_shift), len) };
                    assert_eq!(&dst[dst_shift..dst_shift + len], from, "{name}, len {len}");
                    assert!(
                        dst[..dst_shift].iter().all(|&b| b == 0xa5),
                        "{name}: before, len {len}"
                    );
                    assert!(
                        dst[dst_shift + len..].iter().all(|&b| b == 0xa5),
                        "{name}: after, len {len}"
                    );
                }
            }
        }
    }

    #[test]
    fn large_writes_round_trip_at_every_alignment() {
        // Writes at and above the streaming threshold, from misaligned memory, read back
        // exactly, with their neighbours untouched.
        let dev = MemDevice::new(1 << 20);
        let mut rng = Rng::new(12);
        let mut data = vec![0u8; 3 * PIECE_BYTES as usize + 64];
        rng.fill(&mut data);
        for (shift, len, offset) in [
            (0, STREAM_MIN_BYTES, 0),
            (1, STREAM_MIN_BYTES, 512),
            (7, 3 * PIECE_BYTES as usize, PIECE_BYTES - 4096),
            (3, 5 * 512, 8192),
        ] {
            let src = &data[shift..shift + len];
            dev.write_at(src, offset).unwrap();
            let mut back = vec![0u8; len + 1024];
            dev.read_at(&mut back, offset - offset.min(512)).unwrap();
            let lead = offset.min(512) as usize;
            assert_eq!(&back[lead..lead + len], src, "write of {len} at {offset}");
            assert!(back[..lead].iter().all(|&b| b == 0), "before {offset}");
            assert!(back[lead + len..].iter().all(|&b| b == 0), "after {offset}");
            dev.discard(0, dev.size_bytes()).unwrap();
        }
    }

    #[test]
    fn discard_zeroes_exactly_the_range() {
        let dev = MemDevice::new(512 * 1024);
        dev.write_at(&vec![7u8; 512 * 1024], 0).unwrap();
        dev.discard(1024, 130 * 1024).unwrap();
        let mut all = vec![0u8; 512 * 1024];
        dev.read_at(&mut all, 0).unwrap();
        for (i, &b) in all.iter().enumerate() {
            let discarded = (1024..1024 + 130 * 1024).contains(&i);
            assert_eq!(b, if discarded { 0 } else { 7 }, "byte {i}");
        }
    }

    #[test]
    fn bad_ranges_are_errors() {
        let dev = MemDevice::new(8192);
        let mut buf = vec![0u8; 512];
        let e = dev.read_at(&mut buf, 100).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(dev.write_at(&buf[..100], 0).is_err());
        assert!(dev.write_at(&buf, 8192).is_err());
        assert!(dev.read_at(&mut buf, u64::MAX - 511).is_err());
        assert!(dev.discard(7680, 1024).is_err());
        // Empty IO at the end is fine.
        dev.read_at(&mut [], 8192).unwrap();
    }

    #[test]
    fn zero_size_device() {
        let dev = MemDevice::new(0);
        assert_eq!(dev.size_bytes(), 0);
        assert!(dev.write_at(&[0u8; 512], 0).is_err());
        dev.read_at(&mut [], 0).unwrap();
    }

    #[test]
    #[should_panic(expected = "not a multiple of 512")]
    fn unaligned_size_panics() {
        MemDevice::new(1000);
    }

    #[test]
    fn large_device_is_lazy() {
        // 8 GiB of address space; only touched pages are backed, so this is instant.
        let dev = MemDevice::new(8 << 30);
        let last = dev.size_bytes() - 4096;
        dev.write_at(&[9u8; 4096], last).unwrap();
        let mut buf = [0u8; 4096];
        dev.read_at(&mut buf, last).unwrap();
        assert_eq!(buf, [9u8; 4096]);
    }

    #[test]
    fn concurrent_writers_and_readers_see_whole_blocks() {
        // Each thread owns a disjoint set of 4 KiB blocks and checks its own writes; readers
        // check that no block is ever seen half-written (a block lies within one piece).
        let dev = Arc::new(MemDevice::new(4 << 20));
        let blocks = (4 << 20) / 4096u64;
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let dev = Arc::clone(&dev);
                std::thread::spawn(move || {
                    let mut rng = Rng::new(t);
                    let mut buf = vec![0u8; 4096];
                    for i in 0..2000u64 {
                        let block = rng.below(blocks / 4) * 4 + t;
                        let tag = (i % 250 + 1) as u8;
                        if t < 2 {
                            dev.write_at(&[tag; 4096], block * 4096).unwrap();
                            dev.read_at(&mut buf, block * 4096).unwrap();
                            assert!(buf.iter().all(|&b| b == tag));
                        } else {
                            let other = rng.below(blocks);
                            dev.read_at(&mut buf, other * 4096).unwrap();
                            assert!(buf.iter().all(|&b| b == buf[0]), "torn block");
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }
}
