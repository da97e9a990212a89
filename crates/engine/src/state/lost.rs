//! Bypass writes a failed backing sync may have lost (`Bypass::lost`): the State operations
//! that span the bypass bookkeeping, the ring and the blocks. A failed sync (or a replaced
//! connection) leaves each bypass write no earlier sync covered either durable or dropped,
//! and no later sync tells which. Their cached copies (write-through) lie in the log from
//! `Bypass::unsynced_from` on: marked dirty, writeback writes them again and syncs, and a
//! flush returns OK only after that (`path::bypass::sync_backing`). Where a copy is missing
//! (write-around, or evicted), nothing can make them durable again: flushes fail until the
//! cache is reopened.

use super::bypass::Lost;
use super::State;
use crate::geometry::CacheBlock;

impl State {
    /// Where the log's next chunk starts: the open chunk's start, or the next segment's.
    pub fn log_pos(&self) -> (u64, u32) {
        let o = self.ring.open();
        if o.active {
            (o.segment_id, o.start_block)
        } else {
            (self.ring.head_segment_id() + self.ring.segments_in_use(), 0)
        }
    }

    /// A position past every block logged so far (the open segment's end).
    fn log_end(&self) -> (u64, u32) {
        let o = self.ring.open();
        if o.active {
            (o.segment_id + 1, 0)
        } else {
            self.log_pos()
        }
    }

    /// A backing sync failed with `why`, or found a connection replaced: bypass writes no
    /// earlier sync covered may be lost. Their cached copies are marked dirty (clean sectors
    /// become dirty: writeback writes them again); if some write has no copy, they stay lost.
    /// `failed_syncs`: the backing device's count of failed syncs now (`Backing`), all of
    /// them handled by this call.
    pub fn backing_writes_lost(&mut self, why: String, failed_syncs: u64) {
        self.bypass.note_failed_syncs_handled(failed_syncs);
        let lost = self.bypass.at_risk().map(|gone| {
            if gone {
                Lost::Gone
            } else {
                self.mark_unsynced_copies_dirty();
                Lost::Rewriting {
                    end: self.log_end(),
                }
            }
        });
        self.bypass.note_sync_failed(why, lost);
    }

    /// A successful backing sync that started at bypass generation `target` with the log's
    /// next chunk at `log_pos`; a replaced connection counts its writes lost instead.
    /// `failed_syncs` is the backing device's count of failed syncs now (`Backing`): one
    /// that failed beside this sync (which returned only once that one ended) and that its
    /// thread has not handled yet may have dropped writes this sync would vouch for. It is
    /// handled here first, so the success goes to `synced_held`, not `synced_gen`: noted
    /// first, the failure then found nothing at risk and the dropped writes counted durable.
    pub fn note_backing_synced(
        &mut self,
        target: u64,
        log_pos: (u64, u32),
        reconnects: u64,
        failed_syncs: u64,
    ) {
        self.counters.backing_syncs += 1;
        if self.bypass.failed_syncs_unhandled(failed_syncs) {
            self.counters.backing_failures_caught_up += 1;
            self.backing_writes_lost(
                "another sync of the backing device failed while this one was in flight".into(),
                failed_syncs,
            );
        }
        if !self.bypass.note_synced(target, log_pos, reconnects) {
            self.backing_writes_lost(
                "a connection to the backing device was replaced after writes bypassing the \
                 cache were sent on it (the server may have lost them)"
                    .into(),
                failed_syncs,
            );
        }
    }

    /// A write-through write of blocks `[first, end)` whose backing write a failed sync may
    /// have covered, its copy logged after that failure was handled: marks its clean
    /// sectors dirty too.
    pub fn mark_copies_dirty(&mut self, first: u64, end: u64) {
        for lba in first..end {
            if let Some(c) = self.blocks.lookup(lba) {
                self.mark_dirty(c);
            }
        }
        let end = self.log_end();
        self.bypass.note_rewriting(end);
    }

    /// Every live block from `Bypass::unsynced_from` on with clean valid sectors: those
    /// sectors become dirty (promoted blocks too: an extra writeback, harmless).
    fn mark_unsynced_copies_dirty(&mut self) {
        let from = self.bypass.unsynced_from();
        let bps = self.geo.blocks_per_segment;
        let slots: Vec<(u32, u32)> = self
            .ring
            .in_log()
            .filter(|&(id, _, _)| id >= from.0)
            .map(|(id, slot, _)| (slot, if id == from.0 { from.1 } else { 0 }))
            .collect();
        for (slot, first) in slots {
            for b in first..bps {
                let c = self.geo.cache_block(slot, b);
                let live = self
                    .blocks
                    .lba_of(c)
                    .is_some_and(|lba| self.blocks.lookup(lba) == Some(c));
                if live {
                    self.mark_dirty(c);
                }
            }
        }
    }

    fn mark_dirty(&mut self, c: CacheBlock) {
        let valid = self.blocks.valid(c);
        if valid & !self.blocks.dirty(c) != 0 {
            self.set_dirty_mask(c, valid);
            self.counters.bypass_copies_redirtied += 1;
        }
    }
}
