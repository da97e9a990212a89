//! Requests O_DIRECT would refuse (memory or offset not aligned to the device's granularity) go
//! through a per-thread aligned bounce buffer, widened to whole aligned blocks; partly covered
//! edge blocks are read first on a write.

use std::cell::RefCell;
use std::io;
use std::os::unix::fs::FileExt;

use super::FileDevice;
use crate::aligned::AlignedBuf;

/// Largest piece a bounced request moves at once; also the most a thread's bounce buffer grows
/// to. A multiple of 4096, so chunk boundaries stay direct-aligned.
pub(super) const BOUNCE_CHUNK_BYTES: u64 = 1 << 20;

thread_local! {
    /// Reused across requests so bounced IO allocates nothing in steady state.
    static BOUNCE: RefCell<Option<AlignedBuf>> = const { RefCell::new(None) };
}

impl FileDevice {
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
    pub(super) fn read_bounced(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let end = offset + buf.len() as u64;
        let (span_start, span_end) = self.aligned_span(offset, buf.len() as u64);
        with_bounce(span_end - span_start, |bounce| {
            for (chunk_start, chunk_end) in bounce_chunks(span_start, span_end) {
                let chunk = &mut bounce[..(chunk_end - chunk_start) as usize];
                self.pread_exact(chunk, chunk_start)?;
                let lo = offset.max(chunk_start);
                let hi = end.min(chunk_end);
                buf[(lo - offset) as usize..(hi - offset) as usize].copy_from_slice(
                    &chunk[(lo - chunk_start) as usize..(hi - chunk_start) as usize],
                );
            }
            Ok(())
        })
    }

    /// Writes through the bounce buffer; partly covered edge blocks are read first.
    pub(super) fn write_bounced(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let align = self.direct_align_bytes;
        let end = offset + buf.len() as u64;
        let (span_start, span_end) = self.aligned_span(offset, buf.len() as u64);
        with_bounce(span_end - span_start, |bounce| {
            for (chunk_start, chunk_end) in bounce_chunks(span_start, span_end) {
                let chunk_len = chunk_end - chunk_start;
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
            }
            Ok(())
        })
    }
}

/// The aligned span cut into bounce-buffer-sized pieces, as (start, end) byte offsets.
fn bounce_chunks(span_start: u64, span_end: u64) -> impl Iterator<Item = (u64, u64)> {
    (span_start..span_end)
        .step_by(BOUNCE_CHUNK_BYTES as usize)
        .map(move |start| (start, span_end.min(start + BOUNCE_CHUNK_BYTES)))
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
