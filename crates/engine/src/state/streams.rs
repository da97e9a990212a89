//! Sequential read detection for the read cache: a long sequential stream (a backup, a scan)
//! would flush the useful blocks out of the cache, so reads of a stream are not promoted once
//! it has run past `read_sequential_cutoff_kib` (bcache's `sequential_cutoff`, per stream).
//!
//! A few recent streams are remembered; a read that starts where one ended continues it, any
//! other read starts a new stream in place of the least recently used one. Fixed size, no
//! allocation: it lives in the engine state and is updated under its lock.

/// Streams remembered at once (several sequential readers interleave on one disk).
const STREAMS: usize = 16;

#[derive(Clone, Copy, Debug, Default)]
struct Stream {
    /// Byte offset the next read of this stream would start at.
    next_byte: u64,
    /// Bytes read sequentially so far.
    run_bytes: u64,
    /// Logical clock of the last read, for replacement.
    last_use: u64,
}

#[derive(Clone, Debug, Default)]
pub struct Streams {
    slots: [Stream; STREAMS],
    clock: u64,
}

impl Streams {
    /// Records a read of `len_bytes` at `offset` and returns the length of the sequential run
    /// it belongs to, itself included.
    pub fn observe(&mut self, offset: u64, len_bytes: u64) -> u64 {
        self.clock += 1;
        let clock = self.clock;
        let slot = match self
            .slots
            .iter()
            .position(|s| s.run_bytes > 0 && s.next_byte == offset)
        {
            Some(i) => i,
            None => {
                let (i, _) = self
                    .slots
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, s)| s.last_use)
                    .expect("at least one stream slot");
                self.slots[i] = Stream::default();
                i
            }
        };
        let s = &mut self.slots[slot];
        s.next_byte = offset + len_bytes;
        s.run_bytes = s.run_bytes.saturating_add(len_bytes);
        s.last_use = clock;
        s.run_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_grows_and_random_reads_do_not() {
        let mut s = Streams::default();
        assert_eq!(s.observe(0, 4096), 4096);
        assert_eq!(s.observe(4096, 4096), 8192);
        assert_eq!(s.observe(1 << 30, 4096), 4096);
        // The first stream continues after an unrelated read.
        assert_eq!(s.observe(8192, 65536), 8192 + 65536);
    }

    #[test]
    fn interleaved_streams_are_told_apart() {
        let mut s = Streams::default();
        let (mut a, mut b) = (0u64, 1u64 << 32);
        for i in 1..=10u64 {
            assert_eq!(s.observe(a, 4096), i * 4096);
            assert_eq!(s.observe(b, 4096), i * 4096);
            a += 4096;
            b += 4096;
        }
    }

    #[test]
    fn the_least_recently_used_stream_is_replaced() {
        let mut s = Streams::default();
        s.observe(0, 512);
        for i in 1..STREAMS as u64 {
            s.observe(i << 30, 512);
        }
        // Touch stream 0 so it is the newest; a new stream then replaces stream 1.
        assert_eq!(s.observe(512, 512), 1024);
        s.observe(99 << 30, 512);
        assert_eq!(s.observe(1024, 512), 1536);
        assert_eq!(s.observe((1 << 30) + 512, 512), 512);
    }
}
