//! Read-ahead of segment metadata for recovery's walk. The walk follows the log chunk by chunk,
//! and a chunk's place is known only from the one before it; but every segment's first chunk
//! starts at its block 0, so the metadata area of the next segments can be read in parallel
//! before the walk asks for it. One read at a time, a 24 GiB cache of 1 MiB segments takes
//! 24K sequential random reads to resume; with `THREADS` in flight, a fraction of that.
//!
//! Only for reading a cache nobody writes (open and the offline inspection): the bytes are
//! not invalidated by writes.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::geometry::Geometry;
use crate::io::aligned::AlignedBuf;
use crate::io::BlockDevice;

/// Segments read per fill of the window.
const WINDOW_SEGMENTS: usize = 2048;
/// Reads in flight while filling it.
const THREADS: usize = 64;

pub(crate) struct MetaPrefetch {
    /// Bytes kept per segment: the most metadata one chunk can have.
    meta_len: usize,
    buf: AlignedBuf,
    /// The slot whose bytes start `buf`, and how many slots from it are filled.
    first_slot: u32,
    filled: usize,
    /// A read failed: stop prefetching, so the walk meets the error where it reads.
    disabled: bool,
}

impl MetaPrefetch {
    pub fn new(geo: &Geometry, meta_len: usize) -> MetaPrefetch {
        let window = WINDOW_SEGMENTS.min(geo.segment_count as usize);
        MetaPrefetch {
            meta_len,
            buf: AlignedBuf::new(window * meta_len),
            first_slot: 0,
            filled: 0,
            disabled: false,
        }
    }

    /// The first `meta_len` bytes of segment `slot`, from the window (filled from `slot` on if
    /// it does not hold them). `None` once a read has failed.
    pub fn get(&mut self, cache: &dyn BlockDevice, geo: &Geometry, slot: u32) -> Option<&[u8]> {
        if self.disabled {
            return None;
        }
        let count = geo.segment_count;
        let mut rel = ((u64::from(slot) + count - u64::from(self.first_slot)) % count) as usize;
        if rel >= self.filled {
            self.fill(cache, geo, slot);
            if self.disabled {
                return None;
            }
            rel = 0;
        }
        Some(&self.buf[rel * self.meta_len..(rel + 1) * self.meta_len])
    }

    fn fill(&mut self, cache: &dyn BlockDevice, geo: &Geometry, slot: u32) {
        let n = self.buf.len() / self.meta_len;
        let meta_len = self.meta_len;
        let mut lists: Vec<Vec<(u32, &mut [u8])>> = (0..THREADS).map(|_| Vec::new()).collect();
        for (i, chunk) in self.buf.chunks_mut(meta_len).enumerate().take(n) {
            let s = ((u64::from(slot) + i as u64) % geo.segment_count) as u32;
            lists[i % THREADS].push((s, chunk));
        }
        let failed = AtomicBool::new(false);
        std::thread::scope(|scope| {
            for list in lists.into_iter().filter(|l| !l.is_empty()) {
                let failed = &failed;
                let read = move || {
                    for (s, chunk) in list {
                        if cache.read_at(chunk, geo.offset_of(s, 0)).is_err() {
                            failed.store(true, Ordering::Relaxed);
                            return;
                        }
                    }
                };
                if std::thread::Builder::new()
                    .name("logcache-meta-read".into())
                    .spawn_scoped(scope, read)
                    .is_err()
                {
                    // No thread: nothing read for this list; fall back to direct reads.
                    failed.store(true, Ordering::Relaxed);
                }
            }
        });
        if failed.load(Ordering::Relaxed) {
            self.disabled = true;
            self.filled = 0;
        } else {
            self.first_slot = slot;
            self.filled = n;
        }
    }
}
