//! The RAM segment buffers: one preallocated, aligned buffer per in-RAM segment, all in one
//! mapping of huge pages.
//!
//! Ownership protocol (why the unsafe accessors are sound):
//! - The open chunk's data blocks, and the metadata blocks of a chunk not yet sealed, are written
//!   only by threads holding the engine's state lock.
//! - Once a chunk is sealed and queued, its blocks never change again: the flusher alone writes
//!   its metadata blocks (checksum fields), without the lock; nobody else reads metadata blocks.
//! - Readers copy data blocks out while holding the state lock.
//! - A block reserved for a large write (`state/reservations.rs`) is in no index entry, so no
//!   reader sees it: the reserving thread alone writes it, without the lock, until it publishes
//!   the block (under the lock; readers come after) or lets it go. A chunk holding it waits in
//!   the flusher's queue meanwhile, and the publisher patches its entries under the lock. A
//!   reservation cancelled (the chunk had to be written) may still be receiving while the
//!   flusher writes its blocks to the device as holes: the device write reads bytes being
//!   written, and what it stores there is never read back (a hole); no Rust code reads them.
//!
//! So any two concurrent accesses to the same bytes are both reads, or that last case.
//!
//! Beside the bytes, each block position keeps a *ready CRC*: the write path computes a whole
//! block's CRC from its source as it copies it in, and the flusher takes that CRC instead of
//! reading the block again. It follows the bytes' protocol (set and cleared
//! under the state lock while the block is in the open chunk, taken by the flusher once the
//! chunk is sealed), and names the backing block it was computed for: a CRC is used only for
//! that block, and the flusher takes (clears) every data position of each chunk it writes, so
//! a buffer reused for another segment starts with none. With it goes a *keep* bit: the last
//! write into the position was a small one (`path::hot::ADMIT_MAX_REQUEST_BYTES`), so the
//! flusher stores the block in the RAM cache once it has written it (`log::flusher`). A
//! position is cleared when it is handed out (`State::reserve_block`, `reserve_runs`):
//! promotions, relocations and reserved (large) writes never keep.

use crate::format::BLOCK_SIZE_BYTES;
use crate::io::aligned::AlignedBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

pub const NO_BUFFER: u32 = u32::MAX;
const BLOCK: usize = BLOCK_SIZE_BYTES as usize;

pub struct SegmentBuffers {
    /// All the buffers, one after another, in one mapping of transparent huge pages: the
    /// flusher's O_DIRECT write of a segment then pins a few huge pages instead of one page
    /// per 4 KiB (`gup_fast_fallback` was a fifth of the flusher's CPU with 4 KiB pages), and
    /// the writers' copies and the socket receives into them miss the TLB less.
    memory: AlignedBuf,
    count: u32,
    segment_size_bytes: usize,
    /// Per block position of every buffer, its ready CRC (see the module's comment).
    /// Relaxed: the state lock and the flusher's queue order every access.
    ready: Vec<ReadyCrc>,
}

#[derive(Default)]
struct ReadyCrc {
    /// The backing block the CRC was computed for, plus one (0: none), or'ed with `KEEP_BIT`.
    lba_plus_one: AtomicU64,
    crc: AtomicU32,
}

/// In `ReadyCrc::lba_plus_one`: the block's last write was small (see the module's comment).
/// Backing blocks number below 2^52 (bytes / 4 KiB), so the bit is never part of an lba.
const KEEP_BIT: u64 = 1 << 63;

/// What the flusher takes for a data block (`SegmentBuffers::take_ready`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ready {
    /// The block's CRC, if the write path computed it for the block's lba.
    pub crc: Option<u32>,
    /// The block's last write was small: store it in the RAM cache once written.
    pub keep: bool,
}

/// Touches every page of `memory` once, so the kernel allocates (and zeroes) it now, at open,
/// rather than under the first write to reach it: with huge pages that first write paid for
/// zeroing 2 MiB, and in `bench engine` the first pass over the buffers was 14% of the writer's
/// CPU samples and writes stalled milliseconds each (BENCHMARKS.md, issue 20). Writing a zero
/// to memory that is already zero changes nothing else.
fn prefault(memory: &AlignedBuf) {
    const PAGE_BYTES: usize = 4096;
    let base = memory.as_mut_ptr();
    for off in (0..memory.len()).step_by(PAGE_BYTES) {
        // SAFETY: `off` is inside the buffer, which nothing else can reach yet; volatile, so the
        // store of a zero over a zero is not optimised away.
        unsafe { base.add(off).write_volatile(0) };
    }
}

impl SegmentBuffers {
    pub fn new(count: u32, segment_size_bytes: u64) -> SegmentBuffers {
        assert!(count >= 2);
        assert_eq!(segment_size_bytes % BLOCK as u64, 0);
        let memory = AlignedBuf::new_huge_pages(count as usize * segment_size_bytes as usize);
        prefault(&memory);
        SegmentBuffers {
            memory,
            count,
            segment_size_bytes: segment_size_bytes as usize,
            ready: (0..count as usize * segment_size_bytes as usize / BLOCK)
                .map(|_| ReadyCrc::default())
                .collect(),
        }
    }

    fn ready_at(&self, buf: u32, offset_bytes: usize) -> &ReadyCrc {
        assert!(offset_bytes.is_multiple_of(BLOCK) && offset_bytes < self.segment_size_bytes);
        let per_buffer = self.segment_size_bytes / BLOCK;
        &self.ready[buf as usize * per_buffer + offset_bytes / BLOCK]
    }

    /// Records `crc` as the CRC of the block at `offset_bytes` of buffer `buf`, as backing
    /// block `lba`, and whether a small write wrote it (`keep`). The caller holds the state
    /// lock and just wrote the whole block.
    #[inline]
    pub fn set_ready_crc(&self, buf: u32, offset_bytes: usize, lba: u64, crc: u32, keep: bool) {
        debug_assert!(lba + 1 < KEEP_BIT);
        let r = self.ready_at(buf, offset_bytes);
        r.crc.store(crc, Relaxed);
        r.lba_plus_one
            .store((lba + 1) | if keep { KEEP_BIT } else { 0 }, Relaxed);
    }

    /// The block at `offset_bytes` of buffer `buf` changed in part (`keep`: by a small
    /// write): its CRC must be computed.
    #[inline]
    pub fn clear_ready_crc(&self, buf: u32, offset_bytes: usize, keep: bool) {
        self.ready_at(buf, offset_bytes)
            .lba_plus_one
            .store(if keep { KEEP_BIT } else { 0 }, Relaxed);
    }

    /// Takes (and clears) the ready CRC of the block at `offset_bytes` of buffer `buf`, if it
    /// was computed for backing block `lba`, and its keep bit.
    pub fn take_ready(&self, buf: u32, offset_bytes: usize, lba: u64) -> Ready {
        let r = self.ready_at(buf, offset_bytes);
        let v = r.lba_plus_one.swap(0, Relaxed);
        Ready {
            crc: (v & !KEEP_BIT == lba + 1).then(|| r.crc.load(Relaxed)),
            keep: v & KEEP_BIT != 0,
        }
    }

    pub fn count(&self) -> u32 {
        self.count
    }

    pub fn memory_bytes(&self) -> usize {
        self.count as usize * self.segment_size_bytes
    }

    fn ptr(&self, buf: u32, offset_bytes: usize, len_bytes: usize) -> *mut u8 {
        assert!(buf < self.count, "buffer {buf} of {}", self.count);
        assert!(offset_bytes + len_bytes <= self.segment_size_bytes);
        let start_bytes = buf as usize * self.segment_size_bytes + offset_bytes;
        // SAFETY: in bounds of the mapping (`count` buffers of `segment_size_bytes`), checked
        // above.
        unsafe { self.memory.as_mut_ptr().add(start_bytes) }
    }

    /// Hints the CPU to bring the block at `offset_bytes` of buffer `buf` into its cache for
    /// writing (a hint only: no access, no fault, no lock needed), when that block is in
    /// bounds. The write path hints the block the open chunk hands out next: each block is a
    /// 4 KiB page of its own, which the hardware prefetcher does not cross, so a copy into a
    /// block nobody touched lately waited for each of its lines (BENCHMARKS.md, issue 20).
    /// The lines go to L2 (`_MM_HINT_T1`), not L1: 64 hints into L1 held the writer at the
    /// hints themselves once the core's L1 fill buffers were all taken; into L2 the writer
    /// measured ~0.9× the CPU per write, the copy then finding its lines in L2.
    #[inline]
    pub fn prefetch_block_for_write(&self, buf: u32, offset_bytes: usize) {
        if buf >= self.count || offset_bytes + BLOCK > self.segment_size_bytes {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        {
            let start = self.ptr(buf, offset_bytes, BLOCK);
            for line in (0..BLOCK).step_by(64) {
                // SAFETY: a prefetch is only a hint; it never faults, and the address is in
                // bounds (checked by `ptr`).
                unsafe {
                    std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(
                        start.add(line).cast::<i8>(),
                    )
                };
            }
        }
    }

    /// Shared view of `len_bytes` at `offset_bytes` of buffer `buf`.
    ///
    /// # Safety
    /// The range must not be written concurrently (see the module's ownership protocol).
    pub unsafe fn slice(&self, buf: u32, offset_bytes: usize, len_bytes: usize) -> &[u8] {
        std::slice::from_raw_parts(self.ptr(buf, offset_bytes, len_bytes), len_bytes)
    }

    /// Exclusive view of `len_bytes` at `offset_bytes` of buffer `buf`.
    ///
    /// # Safety
    /// The caller must own the range under the module's protocol: no other access to it may
    /// happen while the returned slice lives.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut(&self, buf: u32, offset_bytes: usize, len_bytes: usize) -> &mut [u8] {
        std::slice::from_raw_parts_mut(self.ptr(buf, offset_bytes, len_bytes), len_bytes)
    }
}
