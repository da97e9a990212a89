//! Flush epochs: the writes between two flush points (a FLUSH, a FUA write), in log order.
//! `writeback_order = consistent` writes the backing device back one epoch at a time, so it
//! only ever holds a past state of the disk (every epoch before some flush point, plus a subset
//! of the next epoch).
//!
//! A flush seals the open chunk, so an epoch is a run of whole chunks; the first chunk sealed
//! after a flush point carries `FLAG_FLUSH_BEFORE` in its header. In memory: one bit per cache
//! block, set at the first block of each chunk that starts an epoch (writeback stops a batch
//! there), and where the newest epoch started (writes decide whether the copy they replace
//! belongs to an older epoch, and so must still be written back in its own).

use std::collections::VecDeque;
use std::time::SystemTime;

use crate::geometry::CacheBlock;

/// A chunk that starts a flush epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct EpochStart {
    segment_id: u64,
    block: u32,
    seq: u64,
    /// When the flush point before it happened (unknown for recovered epochs).
    flushed_at: Option<SystemTime>,
}

#[derive(Debug)]
pub struct Epochs {
    /// Bit per cache block: a chunk starting at this block starts an epoch.
    starts: Vec<u64>,
    /// A flush point came after the last sealed chunk: the next chunk sealed starts an epoch.
    flush_pending: bool,
    /// When that flush point happened.
    pending_at: Option<SystemTime>,
    /// The epochs that start in the ring (and the newest one before it), oldest first.
    list: VecDeque<EpochStart>,
    /// `writeback_order = consistent`: overwritten copies of older epochs stay for writeback.
    consistent: bool,
    /// The age of recovered epochs: the flush point the backing label's writeback record says
    /// the backing device held when the cache was last open. Flush times are not logged; the
    /// backing device holds at least that state (a recovered epoch it already holds is only
    /// written again, unchanged), so status reports it rather than nothing.
    recovered_floor: Option<SystemTime>,
}

impl Epochs {
    pub fn new(cache_block_count: u32, consistent: bool) -> Epochs {
        Epochs {
            starts: vec![0; (cache_block_count as usize).div_ceil(64)],
            // A reopened cache's next writes come after everything recovered: a new epoch.
            flush_pending: true,
            pending_at: Some(SystemTime::now()),
            list: VecDeque::new(),
            consistent,
            recovered_floor: None,
        }
    }

    /// See `recovered_floor`.
    pub fn set_recovered_floor(&mut self, at: Option<SystemTime>) {
        self.recovered_floor = at;
    }

    pub fn consistent(&self) -> bool {
        self.consistent
    }

    pub fn set_consistent(&mut self, consistent: bool) {
        self.consistent = consistent;
    }

    /// A flush point came after the last sealed chunk: the open chunk starts the next epoch.
    pub fn flush_pending(&self) -> bool {
        self.flush_pending
    }

    /// A flush point: writes after it belong to the next epoch.
    pub fn note_flush_point(&mut self, now: SystemTime) {
        self.flush_pending = true;
        self.pending_at = Some(now);
    }

    /// The open chunk `seq` at (`segment_id`, `start_block`), first block `c`, is being
    /// sealed: returns whether it starts an epoch (its header's `FLAG_FLUSH_BEFORE`).
    pub fn on_seal(&mut self, c: CacheBlock, segment_id: u64, start_block: u32, seq: u64) -> bool {
        if !std::mem::take(&mut self.flush_pending) {
            return false;
        }
        let at = self.pending_at.take();
        self.mark_start(c, segment_id, start_block, seq, at);
        true
    }

    /// The chunk `seq` at (`segment_id`, `start_block`), first block `c`, starts an epoch
    /// (recovery passes no time: flush times are not logged).
    pub fn mark_start(
        &mut self,
        c: CacheBlock,
        segment_id: u64,
        block: u32,
        seq: u64,
        flushed_at: Option<SystemTime>,
    ) {
        self.starts[c as usize / 64] |= 1 << (c % 64);
        if let Some(last) = self.list.back() {
            assert!(
                (segment_id, block) > (last.segment_id, last.block) && seq > last.seq,
                "epochs start in log order"
            );
        }
        self.list.push_back(EpochStart {
            segment_id,
            block,
            seq,
            flushed_at,
        });
    }

    /// A slot is reused: its old chunk starts are gone.
    pub fn clear_blocks(&mut self, first: CacheBlock, count: u32) {
        for c in first..first + count {
            self.starts[c as usize / 64] &= !(1 << (c % 64));
        }
    }

    #[inline]
    pub fn is_start(&self, c: CacheBlock) -> bool {
        self.starts[c as usize / 64] & (1 << (c % 64)) != 0
    }

    /// Whether a sealed block at (`segment_id`, `block`) belongs to an epoch before the one
    /// writes go to now.
    pub fn before_current(&self, segment_id: u64, block: u32) -> bool {
        self.flush_pending
            || self
                .list
                .back()
                .is_some_and(|e| (segment_id, block) < (e.segment_id, e.block))
    }

    /// The epoch holding position (`segment_id`, `block`): its first chunk's sequence and when
    /// the flush point before it happened (if known). None: it started before any epoch start
    /// still known (the log's first epoch).
    fn holding(&self, segment_id: u64, block: u32) -> Option<&EpochStart> {
        let i = self
            .list
            .partition_point(|e| (e.segment_id, e.block) <= (segment_id, block));
        i.checked_sub(1).map(|i| &self.list[i])
    }

    /// The sequence of the first chunk of the epoch holding (`segment_id`, `block`).
    pub fn start_seq(&self, segment_id: u64, block: u32) -> Option<u64> {
        self.holding(segment_id, block).map(|e| e.seq)
    }

    /// When the epoch holding (`segment_id`, `block`) began: the time of the flush point
    /// before it, if known.
    pub fn started_at(&self, segment_id: u64, block: u32) -> Option<SystemTime> {
        self.holding(segment_id, block)
            .map_or(self.recovered_floor, |e| {
                e.flushed_at.or(self.recovered_floor)
            })
    }

    /// Forgets epochs that start in segments before `head` (reclaimed), keeping the newest of
    /// them: the head may be in it.
    pub fn forget_before(&mut self, head: u64) {
        while self.list.len() > 1 && self.list[1].segment_id < head {
            self.list.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flush_point_marks_the_next_sealed_chunk() {
        let mut e = Epochs::new(256, true);
        // Opening starts an epoch.
        assert!(e.on_seal(0, 1, 0, 5));
        assert!(e.is_start(0));
        assert!(!e.on_seal(10, 1, 10, 6));
        assert!(!e.is_start(10));
        assert!(!e.before_current(1, 10));
        let t = SystemTime::now();
        e.note_flush_point(t);
        // Before the next chunk seals, every sealed block is older than the new epoch.
        assert!(e.before_current(1, 10));
        assert!(e.on_seal(20, 1, 20, 7));
        assert!(e.before_current(1, 10));
        assert!(!e.before_current(1, 20));
        assert_eq!(e.start_seq(1, 15), Some(5));
        assert_eq!(e.start_seq(1, 25), Some(7));
        assert_eq!(e.started_at(1, 25), Some(t));
        assert_eq!(e.start_seq(0, 3), None);
        e.clear_blocks(0, 256);
        assert!(!e.is_start(20));
    }

    #[test]
    fn reclaimed_epochs_are_forgotten_but_the_head_one() {
        let mut e = Epochs::new(64, true);
        for i in 0..10u64 {
            e.note_flush_point(SystemTime::now());
            e.on_seal(0, i + 1, 0, 100 + i);
        }
        e.forget_before(5);
        // The epoch that started in segment 4 holds segment 5's start until 5's own.
        assert_eq!(e.start_seq(4, 9), Some(103));
        assert_eq!(e.list.len(), 7);
        assert_eq!(e.start_seq(3, 0), None);
    }
}
