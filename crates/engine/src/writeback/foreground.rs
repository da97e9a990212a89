//! Background IO on the cache device yields to foreground reads (issue 20's read tail).
//!
//! On a virtual disk whose host serves one request at a time (Firecracker's virtio-blk, this
//! project's benchmark machine), a 4 KiB foreground read queued behind the flusher's 4 MiB
//! segment write waits for all of it: traced per request, reads issued while a flusher write
//! was in flight took 2.2 ms at the median against 95 µs otherwise, and they were half of the
//! device reads over 1 ms (docs/BENCHMARKS.md, "Where a slow foreground read waits at low
//! load"). While foreground reads come in, background IO is cut into pieces issued one after
//! another, so such a read waits behind one piece at most; with no reads, whole runs (a write
//! stream keeps the device's large-IO throughput).

use crate::state::State;

/// The flusher's largest cache write while foreground reads come in (a device read waits
/// behind about 0.35 ms of it here, against 2-3 ms behind a 4 MiB round).
pub const FLUSH_IO_YIELDING_BYTES_MAX: usize = 512 << 10;
/// Writeback's largest cache read while foreground reads come in (in blocks: 128 KiB).
pub const WRITEBACK_READ_YIELDING_BLOCKS_MAX: usize = 32;

/// Whether foreground reads came in since the owner's last look: the request counter moved.
/// One per background thread, kept across its rounds; looked at under the state lock. A fresh
/// one has no history: its first look says "no reads", so an owner that keeps none (an inline
/// round in manual mode, a manual writeback step) writes and reads whole runs. (Counting every
/// read ever as "since the last look" cut every such round for good after the first read.)
#[derive(Debug, Default)]
pub struct ReadActivity {
    reads_seen: Option<u64>,
}

impl ReadActivity {
    /// True when reads were counted since the previous call (on the first call: false).
    pub fn active(&mut self, st: &State) -> bool {
        let reads = st.counters.reads;
        let moved = self.reads_seen.is_some_and(|seen| seen != reads);
        self.reads_seen = Some(reads);
        moved
    }
}
