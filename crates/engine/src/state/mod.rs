//! The engine's in-memory state, guarded by one mutex that is never held across device IO: a
//! struct of sub-states, each owning its invariants, plus the few methods that must keep two of
//! them in step (a block entering or leaving the index changes its segment's counts; sealing
//! encodes the index's entries into the ring's open chunk).
//!
//! A cache block is "dead" once the index no longer points at it (overwritten, or in future
//! written back and dropped). A segment is reclaimed in ring order from the head, only when all
//! its blocks are dead, the entries that killed them are synced, and no reader has it pinned.

use std::time::{Instant, SystemTime};

pub mod blocks;
pub mod buffers;
pub mod bypass;
pub mod changes;
pub mod chunk_meta;
pub mod epochs;
pub mod health;
mod lost;
pub mod promotion;
pub mod reservations;
pub mod ring;
pub mod room;
pub mod seqs;
pub mod streams;
pub mod writeback;
pub mod zeros;

use self::blocks::Blocks;
use self::buffers::SegmentBuffers;
use self::bypass::Bypass;
use self::epochs::Epochs;
use self::health::Health;
use self::promotion::Promotion;
use self::reservations::{Reservations, Run, RUNS_MAX};
pub use self::ring::{Location, Ring, SealedChunk, SegmentInfo, RESERVE_SEGMENTS};
use self::room::Room;
use self::seqs::Seqs;
use self::writeback::WritebackState;
use self::zeros::Zeros;
use crate::format::chunk::{ChunkHeader, Entry, FLAG_FLUSH_BEFORE, KIND_DATA};
use crate::format::BLOCK_SIZE_BYTES;
use crate::geometry::{CacheBlock, Geometry};
use crate::index::NO_LBA;
use crate::stats::Counters;

/// How many threads wait for something (writers for room, callers of `drain`): entered and
/// left in pairs, never below zero.
#[derive(Debug, Default)]
pub struct Waiters(u32);

impl Waiters {
    pub fn enter(&mut self) {
        self.0 += 1;
    }

    pub fn leave(&mut self) {
        assert!(self.0 > 0, "more waiters left than entered");
        self.0 -= 1;
    }

    pub fn any(&self) -> bool {
        self.0 > 0
    }
}

pub struct State {
    pub geo: Geometry,
    /// The index, masks and CRCs of every cache block.
    pub blocks: Blocks,
    /// Segments, the open chunk, RAM buffers, the flusher's queue.
    pub ring: Ring,
    /// Sequence numbers: next, written, synced, wanted; the epoch.
    pub seqs: Seqs,
    /// Failed or closing: whether IO is accepted.
    pub health: Health,
    /// The admission queue's tickets and the writers waiting for room.
    pub room: Room,
    /// The promotion guard and the pause after relocations.
    pub promotion: Promotion,
    /// IO bypassing the cache in flight, and the backing syncs owed for it.
    pub bypass: Bypass,
    /// Recent read streams, for the sequential cutoff.
    pub streams: streams::Streams,
    /// Drains, the persisted writeback position, batch state, pending zero ranges.
    pub writeback: WritebackState,
    /// Flush epochs: where each starts, the newest one, `writeback_order`.
    pub epochs: Epochs,
    /// Blocks a WRITE_ZEROES left reading as zeros, not written or trimmed since.
    pub zeros: Zeros,
    /// What changed since each checkpoint (set by every logged change).
    pub changes: changes::Changes,
    /// Blocks large writes reserved before their payload arrived (`path/reserve.rs`).
    pub reservations: Reservations,
    pub counters: Counters,
}

/// The admission queue's view of the state (`path::admission::Turn`).
impl AsMut<room::Room> for State {
    fn as_mut(&mut self) -> &mut room::Room {
        &mut self.room
    }
}

impl State {
    pub fn locate(&self, c: CacheBlock) -> Location {
        let (slot, b) = self.geo.split(c);
        self.ring.locate(slot, b)
    }

    /// Byte offset of cache block `c` inside its segment's buffer.
    pub fn offset_in_buffer(&self, c: CacheBlock) -> usize {
        let (_, b) = self.geo.split(c);
        b as usize * BLOCK_SIZE_BYTES as usize
    }

    /// Sets a live block's dirty sectors, keeping the dirty block counts (global and per
    /// segment) in step.
    pub fn set_dirty_mask(&mut self, c: CacheBlock, mask: u8) {
        let (slot, _) = self.geo.split(c);
        match self.blocks.set_dirty(c, mask) {
            (false, true) => self.ring.add_dirty(slot),
            (true, false) => self.ring.drop_dirty(slot),
            _ => {}
        }
    }

    /// Marks a block the index no longer points at as dead in its segment. The chunk being
    /// filled now records its replacement, so the segment may be reclaimed only once that
    /// chunk is durable (`dead_by_seq`).
    pub fn kill(&mut self, c: CacheBlock) {
        self.kill_recorded_in(c, self.seqs.next());
    }

    /// `kill`, with the replacement recorded in chunk `seq`.
    fn kill_recorded_in(&mut self, c: CacheBlock, seq: u64) {
        assert!(
            self.blocks.lba_of(c).is_none(),
            "killing a block the index maps"
        );
        self.drop_live(c, Some(seq));
    }

    /// A block the index no longer points at (`lba`'s older copy): with `writeback_order =
    /// consistent`, a dirty copy sealed in an older flush epoch than the one writes go to now
    /// stays as a shadow until writeback writes it back in its epoch; otherwise it dies. The
    /// chunk being filled now records its replacement.
    pub fn retire(&mut self, c: CacheBlock, lba: u64) {
        self.retire_recorded_in(c, lba, self.seqs.next());
    }

    /// `retire`, with the replacement recorded in chunk `seq`: a reserved write's blocks are
    /// in the chunk it reserved them in, often sealed before it publishes. Charging the chunk
    /// being filled then was wrong when none could open (the log full): the dead segment's
    /// reclaim waited for a chunk that could only open after that reclaim, and writers
    /// waited for room for ever (sim seed 203777).
    pub fn retire_recorded_in(&mut self, c: CacheBlock, lba: u64, seq: u64) {
        if self.epochs.consistent() && self.blocks.dirty(c) != 0 && self.in_older_epoch(c) {
            self.blocks.add_shadow(c, lba);
            let (slot, _) = self.geo.split(c);
            self.ring.note_shadowed(slot, seq);
            self.counters.shadows_kept += 1;
        } else {
            self.kill_recorded_in(c, seq);
        }
    }

    /// Whether `c` is in a sealed chunk of an epoch before the newest.
    fn in_older_epoch(&self, c: CacheBlock) -> bool {
        if matches!(self.locate(c), Location::OpenChunk { .. }) {
            return false;
        }
        let (slot, b) = self.geo.split(c);
        self.epochs.before_current(self.ring.segment(slot).id, b)
    }

    /// A shadow was written back: it dies.
    pub fn clean_shadow(&mut self, c: CacheBlock) {
        self.blocks.remove_shadow(c);
        self.drop_live(c, None);
    }

    /// Whether writeback must go in flush-epoch order: `writeback_order = consistent`, or
    /// shadows from when it was remain (a shadow and its newer copy must never share a batch).
    pub fn ordered(&self) -> bool {
        self.epochs.consistent() || self.blocks.shadow_count() > 0
    }

    /// Whether a dirty block lies before position (`segment_id`, `block`) in the log.
    pub fn dirty_before(&self, segment_id: u64, block: u32) -> bool {
        for (id, slot, seg) in self.ring.in_log() {
            if id > segment_id {
                break;
            }
            if seg.dirty_blocks == 0 {
                continue;
            }
            if id < segment_id
                || (0..block).any(|b| self.blocks.dirty(self.geo.cache_block(slot, b)) != 0)
            {
                return true;
            }
        }
        false
    }

    /// The log position (segment id, block) of the oldest dirty block, if any.
    pub fn oldest_dirty(&self) -> Option<(u64, u32)> {
        if self.blocks.dirty_blocks() == 0 {
            return None;
        }
        let (id, slot, _) = self
            .ring
            .in_log()
            .find(|(_, _, seg)| seg.dirty_blocks > 0)
            .expect("dirty blocks are in the ring");
        let b = (0..self.geo.blocks_per_segment)
            .find(|&b| self.blocks.dirty(self.geo.cache_block(slot, b)) != 0)
            .expect("a segment counting dirty blocks has one");
        Some((id, b))
    }

    /// In flush-epoch order, the writeback position the checkpoint must hold before writeback
    /// writes anything of the epoch holding the oldest dirty block: the chunk before that
    /// epoch. Otherwise a crash would replay earlier epochs' shadows as dirty, and writing them
    /// again over the newer epoch's blocks would take the backing device back to a state no
    /// disk held. None when the position need not move.
    pub fn epoch_floor(&self) -> Option<u64> {
        let (id, b) = self.oldest_dirty()?;
        let floor = self.epochs.start_seq(id, b)?.checked_sub(1)?;
        (floor > self.writeback.persisted_seq()).then_some(floor)
    }

    /// When the disk was in the state the backing device alone holds (see
    /// `Stats::backing_consistent_as_of_unix_ms`).
    pub fn backing_consistent_as_of(&self, now: SystemTime) -> Option<SystemTime> {
        let oldest = match (self.oldest_dirty(), self.writeback.zero_pending_pos()) {
            (None, None) => return Some(now),
            (Some(d), None) => d,
            (None, Some(z)) => z,
            (Some(d), Some(z)) => d.min(z),
        };
        if !self.ordered() {
            return None;
        }
        self.epochs.started_at(oldest.0, oldest.1)
    }

    /// The cached copy of `lba`, if any, is about to be dropped while its data may be needed to
    /// write a bypass write again (`state/lost.rs`): recorded as an eviction is.
    pub fn note_copy_dropped(&mut self, lba: u64) {
        if let Some(c) = self.blocks.lookup(lba) {
            self.note_evicted(c);
        }
    }

    /// Records `c`'s log position as evicted: its copy may have been a bypass write's that a
    /// failed sync then loses.
    fn note_evicted(&mut self, c: CacheBlock) {
        let (slot, b) = self.geo.split(c);
        self.bypass.note_evicted((self.ring.segment(slot).id, b));
    }

    /// Drops a clean block from the cache (its data is on the backing device). No log entry
    /// records this: if a crash brings the block back, it holds what the backing device holds.
    pub fn evict(&mut self, c: CacheBlock) {
        assert_eq!(self.blocks.dirty(c), 0, "evicting a dirty block");
        let lba = self
            .blocks
            .remove_block(c)
            .expect("evicting a block not in the index");
        debug_assert!(self.blocks.lookup(lba).is_none());
        self.note_evicted(c);
        self.drop_live(c, None);
        self.counters.blocks_evicted += 1;
        self.promotion.invalidate();
    }

    fn drop_live(&mut self, c: CacheBlock, killer_seq: Option<u64>) {
        self.set_dirty_mask(c, 0);
        self.blocks.set_valid(c, 0);
        let (slot, _) = self.geo.split(c);
        self.ring.drop_live(slot, killer_seq);
    }

    /// A sync that started with chunks up to `target` written completed: they are durable.
    pub fn note_synced(&mut self, target: u64) {
        self.seqs.note_synced(target);
        self.ring.note_synced();
    }

    /// Opens the next segment if the ring and the RAM buffers have room (see
    /// `Ring::open_segment`).
    pub fn open_segment(&mut self, use_reserve: bool) -> bool {
        self.ring.open_segment(use_reserve, self.seqs.next())
    }

    /// Takes the next data block of the open chunk, sealing and opening chunks and segments as
    /// needed. `None` when the log or the RAM buffers are full: the caller must wait. `now`:
    /// the clock, read only for a chunk's first block.
    /// `use_reserve`: the relocator may take the last free segment, which writers leave to it.
    pub fn reserve_block(
        &mut self,
        buffers: &SegmentBuffers,
        now: impl FnOnce() -> Instant,
        use_reserve: bool,
    ) -> Option<CacheBlock> {
        if self.ring.open_entries_full() {
            self.seal(buffers);
        }
        if !self.ring.open().active && !self.open_segment(use_reserve) {
            return None;
        }
        let (slot, b) = self.ring.take_data_block(now);
        // A CRC left at this position by an earlier use of the buffer is not this block's.
        buffers.clear_ready_crc(
            self.ring.open_buffer(),
            b as usize * BLOCK_SIZE_BYTES as usize,
            false,
        );
        let c = self.geo.cache_block(slot, b);
        debug_assert_eq!(self.blocks.dirty(c), 0);
        self.blocks.set_valid(c, 0);
        debug_assert!(
            self.blocks.lba_of(c).is_none(),
            "a reserved block is mapped"
        );
        Some(c)
    }

    /// Maps `lba` to the new block `c` (a write, a promotion, a relocation: a block entry
    /// logged now): returns the block it mapped before. A reservation of `lba` pending now
    /// can no longer publish (this entry follows its blocks in the log).
    pub fn map(&mut self, lba: u64, c: CacheBlock) -> Option<CacheBlock> {
        self.reservations.touch(lba, lba + 1);
        self.blocks.insert(lba, c)
    }

    /// Reserves blocks for a write of whole blocks `lba..lba + count`, in up to `RUNS_MAX` runs
    /// (sealing and opening chunks as needed), into `runs`. None, with nothing taken, when the
    /// log, the RAM buffers or the reservation table lack room, or writers wait for room
    /// (they come first): the caller writes the ordinary way.
    pub fn reserve_runs(
        &mut self,
        buffers: &SegmentBuffers,
        lba: u64,
        count: u64,
        now: Instant,
        runs: &mut [Run; RUNS_MAX],
    ) -> Option<(u64, usize)> {
        if !self.reservations.has_room() || self.room.writers_wait() || !self.room.queue_empty() {
            return None;
        }
        // Enough room for every run, counted before anything is taken: the open chunk's free
        // data blocks plus whole free RAM buffers (a chunk per segment at least).
        let o = self.ring.open();
        let in_open = if o.active {
            u64::from(o.data_capacity - o.data_count)
        } else {
            0
        };
        let per_segment = u64::from(self.geo.blocks_per_segment) - 2;
        let spare_segments = self.ring.free_buffer_count().min(
            self.ring
                .free_segments()
                .saturating_sub(ring::RESERVE_SEGMENTS) as u32,
        );
        if in_open + u64::from(spare_segments) * per_segment < count {
            return None;
        }
        let mut n = 0;
        let mut left = count;
        while left > 0 {
            if n == RUNS_MAX {
                break;
            }
            if self.ring.open_entries_full() {
                self.seal(buffers);
            }
            if !self.ring.open().active && !self.open_segment(false) {
                break;
            }
            let seq = self.ring.open().seq;
            let (slot, first_block, taken) = self.ring.take_data_run(left as u32, now);
            for b in first_block..first_block + taken {
                buffers.clear_ready_crc(
                    self.ring.open_buffer(),
                    b as usize * BLOCK_SIZE_BYTES as usize,
                    false,
                );
                let c = self.geo.cache_block(slot, b);
                debug_assert_eq!(self.blocks.dirty(c), 0);
                debug_assert!(
                    self.blocks.lba_of(c).is_none(),
                    "a reserved block is mapped"
                );
                self.blocks.set_valid(c, 0);
            }
            runs[n] = Run {
                slot,
                first_block,
                count: taken,
                chunk_seq: seq,
            };
            n += 1;
            left -= u64::from(taken);
        }
        // Reservations leave at least one RAM buffer unpinned (and a written segment's pinned
        // buffer is detached from it: `Ring::release_written_buffers`), so the log moves on
        // while clients stall mid-payload.
        let pins_max = self.ring.buffer_count() as usize - 1;
        if left > 0 || self.reservations.runs_held() + n > pins_max {
            // Fewer chunks than counted (small ones after a flush), or too many buffers
            // pinned: give back what was taken.
            for r in &runs[..n] {
                let buffer = self.ring.segment(r.slot).buffer;
                self.let_go(r);
                self.ring.unpin(r.slot, buffer, r.count);
            }
            return None;
        }
        let id = self.reservations.add(lba, lba + count, &runs[..n]);
        Some((id, n))
    }

    /// Lets reserved blocks go unpublished: no longer pending in their chunk (holes there),
    /// dead in their segment. Their buffer stays pinned (`Ring::unpin` once the receiving
    /// thread is done with it). Returns whether the flusher's first chunk became ready.
    pub fn let_go(&mut self, r: &Run) -> bool {
        let ready = self.ring.unpend(r.chunk_seq, r.count);
        for _ in 0..r.count {
            // Its chunk (holes for them) must be durable before the segment may be reclaimed,
            // as for any block whose replacement a chunk records (crash seed
            // 2473363062700597338: a segment holding only holes was reclaimed with its chunk
            // written but not synced).
            self.ring.drop_live(r.slot, Some(r.chunk_seq));
        }
        ready
    }

    /// Cancels every pending reservation (a flush point or a waiter needs their chunks
    /// written): their blocks are let go now; the reservations will not publish. Returns how
    /// many were cancelled.
    pub fn cancel_reservations(&mut self) -> usize {
        if !self.reservations.any() {
            return 0;
        }
        let mut runs = [Run::default(); reservations::RESERVATIONS_MAX * RUNS_MAX];
        let mut n = 0;
        let cancelled = self.reservations.cancel_all(&mut |r| {
            runs[n] = r;
            n += 1;
        });
        for r in &runs[..n] {
            self.let_go(r);
        }
        cancelled
    }

    /// Appends a range entry to the open chunk (sealing it first if its entries are full).
    /// False when the log has no room for a new segment: the caller waits and retries.
    pub fn add_range(&mut self, buffers: &SegmentBuffers, entry: Entry, now: Instant) -> bool {
        assert!(entry.is_range());
        if self.ring.open_entries_full() {
            self.seal(buffers);
        }
        if !self.ring.open().active && !self.open_segment(false) {
            return false;
        }
        self.ring.push_range(entry, now);
        self.reservations
            .touch(entry.lba, entry.lba + u64::from(entry.data_crc));
        // A zero or drop range changes what its blocks read (TRIM, write-zeroes, writes
        // bypassing the cache).
        let seq = self.seqs.next();
        self.changes.mark(entry.lba, entry.data_crc as u64, seq);
        true
    }

    /// Drops every cached copy of blocks `lba..lba + count` (dirty or clean): the caller logs
    /// a range entry saying why. Returns how many blocks were dropped.
    pub fn kill_range(&mut self, lba: u64, count: u64) -> u64 {
        let mut killed = 0;
        if count <= self.blocks.block_count() as u64 {
            for l in lba..lba + count {
                if let Some(c) = self.blocks.remove(l) {
                    self.retire(c, l);
                    killed += 1;
                }
            }
        } else {
            // A range wider than the cache: cheaper to look at every cache block once.
            for c in 0..self.blocks.block_count() {
                match self.blocks.lba_of(c) {
                    Some(l) if l >= lba && l - lba < count => {
                        self.blocks.remove_block(c);
                        self.retire(c, l);
                        killed += 1;
                    }
                    _ => {}
                }
            }
        }
        debug_assert!(lba.checked_add(count).is_some_and(|e| e < NO_LBA));
        self.promotion.invalidate();
        killed
    }

    /// Seals the open chunk if it holds data: encodes its metadata into the buffer, queues it
    /// for the flusher and opens the next chunk (or marks the log full). Returns whether a chunk
    /// was sealed.
    pub fn seal(&mut self, buffers: &SegmentBuffers) -> bool {
        if !self.ring.open_has_entries() {
            return false;
        }
        let o = self.ring.open().clone();
        let seg_buffer = self.ring.open_buffer();
        // SAFETY: the metadata blocks of the open chunk are owned by the lock holder until it
        // is queued below.
        let meta = unsafe {
            buffers.slice_mut(
                seg_buffer,
                o.start_block as usize * BLOCK_SIZE_BYTES as usize,
                o.meta_blocks as usize * BLOCK_SIZE_BYTES as usize,
            )
        };
        let entry_count = o.data_count + self.ring.open_range_count();
        let first = self.geo.cache_block(o.slot, o.start_block);
        let flush_before = self
            .epochs
            .on_seal(first, o.segment_id, o.start_block, o.seq);
        let header = ChunkHeader {
            segment_id: o.segment_id,
            seq: o.seq,
            synced_seq: 0,
            epoch: self.seqs.epoch(),
            start_block: o.start_block as u16,
            meta_block_count: o.meta_blocks as u16,
            entry_count: entry_count as u16,
            data_block_count: o.data_count as u16,
            flags: if flush_before { FLAG_FLUSH_BEFORE } else { 0 },
        };
        let (geo, blocks) = (&self.geo, &self.blocks);
        // A valid sector that is not dirty says "the backing device holds this", in a clean
        // block or in a partly dirty one alike.
        let has_clean = (0..o.data_count).any(|i| {
            let c = geo.cache_block(o.slot, o.data_start() + i);
            blocks.lba_of(c).is_some() && blocks.valid(c) & !blocks.dirty(c) != 0
        });
        let vouch_gen = if has_clean {
            self.bypass.write_gen()
        } else {
            0
        };
        let block_entries = (0..o.data_count).map(|i| {
            let c = geo.cache_block(o.slot, o.data_start() + i);
            match blocks.lba_of(c) {
                Some(lba) => Entry {
                    lba,
                    data_crc: 0,
                    kind: KIND_DATA,
                    dirty_mask: blocks.dirty(c),
                    valid_mask: blocks.valid(c),
                },
                None => Entry::hole(),
            }
        });
        chunk_meta::encode(
            meta,
            geo.format_id,
            &header,
            block_entries,
            self.ring.drain_open_ranges(),
        );
        assert_eq!(
            o.seq,
            self.seqs.next(),
            "the open chunk carries the next sequence"
        );
        self.seqs.advance_next();
        self.ring.queue_sealed(
            SealedChunk {
                slot: o.slot,
                buffer: seg_buffer,
                seq: o.seq,
                start_block: o.start_block,
                meta_blocks: o.meta_blocks,
                data_count: o.data_count,
                entry_count,
                vouch_gen,
                pending_blocks: o.pending_blocks,
            },
            self.seqs.next(),
        );
        self.counters.chunks_sealed += 1;
        true
    }

    /// After chunks reached the cache device: release the buffers of full segments whose
    /// chunks are all written.
    pub fn release_written_buffers(&mut self) {
        self.ring.release_written_buffers(self.seqs.written());
    }

    /// Whether the relocator should move the head: the ring is (nearly) out of free segments.
    pub fn under_pressure(&self) -> bool {
        self.ring.under_pressure()
    }

    /// How far the head could advance now: the id of the first segment that must stay.
    pub fn reclaimable_head(&self, pinned: impl Fn(u32) -> bool) -> u64 {
        // A zero range not yet applied to the backing device must stay in the log (recovery
        // re-applies it): a zero entry is no live block, and without this the head passed it
        // and the dirty blocks it killed, and a crash then read the backing's older data.
        let zero_pending_seq = self.writeback.zero_pending_seq().unwrap_or(u64::MAX);
        self.ring
            .reclaimable_head(self.seqs.synced(), zero_pending_seq, pinned)
    }

    /// Whether the head segment is dead and only waits for the chunks that killed it to sync.
    pub fn head_waits_for_sync(&self) -> bool {
        self.ring.head_waits_for_sync(self.seqs.synced())
    }

    /// Frees the slots of segments before `new_head`, whose reclaim the superblock now records.
    pub fn free_segments_before(&mut self, new_head: u64) {
        for id in self.ring.head_segment_id()..new_head {
            // The slot's next segment starts its chunks elsewhere.
            let slot = self.geo.slot_of(id);
            self.epochs
                .clear_blocks(self.geo.cache_block(slot, 0), self.geo.blocks_per_segment);
        }
        self.counters.segments_reclaimed += self.ring.free_segments_before(new_head);
        self.epochs.forget_before(new_head);
    }

    /// Sequence of the first chunk of the head segment (persisted in the checkpoint).
    pub fn head_seq(&self) -> u64 {
        self.ring
            .first_seq_of(self.ring.head_segment_id(), self.seqs.next())
    }
}
