//! The engine's in-memory state, guarded by one mutex that is never held across device IO.
//!
//! Segment life cycle (one `SegmentInfo` per ring slot):
//!
//! ```text
//! free --open--> open (RAM buffer, chunks appended) --full--> full, in RAM (chunks queued)
//!      --all chunks written--> on the cache device --every block dead or written back-->
//!      reclaimable --head persisted past it--> free
//! ```
//!
//! A cache block is "dead" once the index no longer points at it (overwritten, or in future
//! written back and dropped). A segment is reclaimed in ring order from the head, only when all
//! its blocks are dead, the entries that killed them are synced, and no reader has it pinned.

use std::collections::VecDeque;
use std::time::Instant;

pub mod blocks;
pub mod buffers;
pub mod bypass;
pub mod chunk_meta;
pub mod health;
pub mod promotion;
pub mod room;
pub mod seqs;
pub mod streams;
pub mod writeback;

use self::blocks::Blocks;
use self::buffers::{SegmentBuffers, NO_BUFFER};
use self::bypass::Bypass;
use self::health::Health;
use self::promotion::Promotion;
use self::room::Room;
use self::seqs::Seqs;
use self::writeback::WritebackState;
use crate::format::chunk::{self, ChunkHeader, Entry, KIND_DATA};
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

/// Segments writers leave free, so the relocator can always move a head segment's live blocks.
pub const RESERVE_SEGMENTS: u64 = 1;

/// Free segments below which the relocator works ahead of writers, so they rarely wait for it.
pub fn free_segments_low(segment_count: u64) -> u64 {
    RESERVE_SEGMENTS + 1 + segment_count / 32
}

#[derive(Clone, Debug, Default)]
pub struct SegmentInfo {
    /// Segment id in this slot; 0 when the slot is free.
    pub id: u64,
    /// RAM buffer holding the segment's blocks from `ram_start_block` on, or `NO_BUFFER`.
    pub buffer: u32,
    pub ram_start_block: u32,
    /// Cache blocks of this segment that the index points at.
    pub live_blocks: u32,
    /// The newest chunk holding an entry that made one of this segment's blocks dead: the
    /// segment may be reclaimed only once that chunk is synced.
    pub dead_by_seq: u64,
    /// Sequence of the first chunk in this segment.
    pub first_seq: u64,
    /// No more chunks will be opened in this segment.
    pub full: bool,
    /// Sequence of the last chunk sealed in this segment (0: none yet).
    pub last_sealed_seq: u64,
    /// Live blocks of this segment with at least one dirty sector.
    pub dirty_blocks: u32,
    /// Blocks `0..synced_blocks` belong to chunks that are durable on the cache device; only
    /// those may be written back (a chunk that might still be lost must not reach the backing
    /// device before it is durable in the log).
    pub synced_blocks: u32,
}

/// The chunk writers append to.
#[derive(Clone, Debug)]
pub struct OpenChunk {
    /// False while the log has no room for a new segment (writers wait).
    pub active: bool,
    pub slot: u32,
    pub segment_id: u64,
    pub seq: u64,
    pub start_block: u32,
    pub meta_blocks: u32,
    pub data_capacity: u32,
    pub data_count: u32,
    /// When the oldest write still only in this chunk arrived (for the periodic seal).
    pub first_write_at: Option<Instant>,
}

impl OpenChunk {
    pub fn data_start(&self) -> u32 {
        self.start_block + self.meta_blocks
    }
}

/// A sealed chunk waiting for the flusher. Its metadata is encoded in the buffer, except for
/// the fields only the flusher knows (data CRCs, `synced_seq`, the header CRC).
#[derive(Clone, Debug)]
pub struct SealedChunk {
    pub slot: u32,
    pub buffer: u32,
    pub seq: u64,
    pub start_block: u32,
    pub meta_blocks: u32,
    pub data_count: u32,
    /// Block entries plus range entries.
    pub entry_count: u32,
}

/// Where the newest copy of a cached block is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Location {
    /// In the open chunk: may be overwritten in place.
    OpenChunk { buffer: u32 },
    /// In a RAM buffer whose chunk is sealed: read-only.
    Ram { buffer: u32 },
    /// Only on the cache device.
    Disk,
}

pub struct State {
    pub geo: Geometry,
    /// The index, masks and CRCs of every cache block.
    pub blocks: Blocks,
    pub segments: Vec<SegmentInfo>,
    pub head_segment_id: u64,
    pub next_segment_id: u64,
    pub open: OpenChunk,
    pub free_buffers: Vec<u32>,
    /// Slots of the segments holding a RAM buffer, oldest first.
    pub ram_segments: VecDeque<u32>,
    pub queue: VecDeque<SealedChunk>,
    /// Sequence numbers: next, written, synced, wanted; the epoch.
    pub seqs: Seqs,
    /// Failed or closing: whether IO is accepted.
    pub health: Health,
    /// The admission queue's tickets and the writers waiting for room.
    pub room: Room,
    /// Bytes written to the cache device since its last sync.
    pub unsynced_bytes: u64,
    /// Chunks written since the last sync: (slot, segment id, end block). A sync makes them
    /// durable and advances their segments' `synced_blocks`.
    pub unsynced_ends: Vec<(u32, u64, u32)>,
    /// Range entries (zero, drop) of the open chunk; they follow its block entries.
    pub open_ranges: Vec<Entry>,
    /// The promotion guard and the pause after relocations.
    pub promotion: Promotion,
    /// IO bypassing the cache in flight, and the backing syncs owed for it.
    pub bypass: Bypass,
    /// Recent read streams, for the sequential cutoff.
    pub streams: streams::Streams,
    /// Drains, the persisted writeback position, batch state, pending zero ranges.
    pub writeback: WritebackState,
    pub counters: Counters,
}

impl State {
    pub fn locate(&self, c: CacheBlock) -> Location {
        let (slot, b) = self.geo.split(c);
        if self.open.active && slot == self.open.slot && b >= self.open.data_start() {
            return Location::OpenChunk {
                buffer: self.segments[slot as usize].buffer,
            };
        }
        let seg = &self.segments[slot as usize];
        if seg.buffer != NO_BUFFER && b >= seg.ram_start_block {
            Location::Ram { buffer: seg.buffer }
        } else {
            Location::Disk
        }
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
        let seg = &mut self.segments[slot as usize];
        match self.blocks.set_dirty(c, mask) {
            (false, true) => {
                seg.dirty_blocks += 1;
                assert!(
                    seg.dirty_blocks <= seg.live_blocks,
                    "more dirty than live blocks"
                );
            }
            (true, false) => {
                assert!(seg.dirty_blocks > 0, "segment dirty count underflow");
                seg.dirty_blocks -= 1;
            }
            _ => {}
        }
    }

    /// Marks a block the index no longer points at as dead in its segment. The chunk being
    /// filled now records its replacement, so the segment may be reclaimed only once that
    /// chunk is durable (`dead_by_seq`).
    pub fn kill(&mut self, c: CacheBlock) {
        assert!(
            self.blocks.lba_of(c).is_none(),
            "killing a block the index maps"
        );
        self.drop_live(c);
        let (slot, _) = self.geo.split(c);
        let killer_seq = self.seqs.next();
        let seg = &mut self.segments[slot as usize];
        seg.dead_by_seq = seg.dead_by_seq.max(killer_seq);
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
        self.drop_live(c);
        self.counters.blocks_evicted += 1;
        self.promotion.invalidate();
    }

    fn drop_live(&mut self, c: CacheBlock) {
        self.set_dirty_mask(c, 0);
        self.blocks.set_valid(c, 0);
        let (slot, _) = self.geo.split(c);
        let seg = &mut self.segments[slot as usize];
        assert!(
            seg.live_blocks > 0,
            "killing a block of a segment with no live blocks"
        );
        seg.live_blocks -= 1;
    }

    /// A sync that started with chunks up to `target` written completed: they are durable.
    pub fn note_synced(&mut self, target: u64) {
        self.seqs.note_synced(target);
        self.unsynced_bytes = 0;
        self.mark_written_synced();
    }

    /// After a sync: every chunk written before it is durable.
    fn mark_written_synced(&mut self) {
        for (slot, id, end) in std::mem::take(&mut self.unsynced_ends) {
            let seg = &mut self.segments[slot as usize];
            assert_eq!(seg.id, id, "a segment with unsynced chunks was reclaimed");
            seg.synced_blocks = seg.synced_blocks.max(end);
        }
    }

    /// Takes the next data block of the open chunk, sealing and opening chunks and segments as
    /// needed. `None` when the log or the RAM buffers are full: the caller must wait.
    /// `use_reserve`: the relocator may take the last free segment, which writers leave to it.
    pub fn reserve_block(
        &mut self,
        buffers: &SegmentBuffers,
        now: Instant,
        use_reserve: bool,
    ) -> Option<CacheBlock> {
        if self.open.active && self.open_entries_full() {
            self.seal(buffers);
        }
        if !self.open.active && !self.open_segment(use_reserve) {
            return None;
        }
        let o = &mut self.open;
        assert!(o.data_count < o.data_capacity);
        let b = o.data_start() + o.data_count;
        o.data_count += 1;
        if o.first_write_at.is_none() {
            o.first_write_at = Some(now);
        }
        let c = self.geo.cache_block(o.slot, b);
        self.segments[o.slot as usize].live_blocks += 1;
        debug_assert_eq!(self.blocks.dirty(c), 0);
        self.blocks.set_valid(c, 0);
        debug_assert!(
            self.blocks.lba_of(c).is_none(),
            "a reserved block is mapped"
        );
        Some(c)
    }

    /// Whether the open chunk has no room for another block or range entry.
    fn open_entries_full(&self) -> bool {
        let o = &self.open;
        o.data_count == o.data_capacity
            || o.data_count + self.open_ranges.len() as u32 >= chunk::entry_capacity(o.meta_blocks)
    }

    /// Appends a range entry to the open chunk (sealing it first if its entries are full).
    /// False when the log has no room for a new segment: the caller waits and retries.
    pub fn add_range(&mut self, buffers: &SegmentBuffers, entry: Entry, now: Instant) -> bool {
        assert!(entry.is_range());
        if self.open.active && self.open_entries_full() {
            self.seal(buffers);
        }
        if !self.open.active && !self.open_segment(false) {
            return false;
        }
        self.open_ranges.push(entry);
        if self.open.first_write_at.is_none() {
            self.open.first_write_at = Some(now);
        }
        true
    }

    /// Drops every cached copy of blocks `lba..lba + count` (dirty or clean): the caller logs
    /// a range entry saying why. Returns how many blocks were dropped.
    pub fn kill_range(&mut self, lba: u64, count: u64) -> u64 {
        let mut killed = 0;
        if count <= self.blocks.block_count() as u64 {
            for l in lba..lba + count {
                if let Some(c) = self.blocks.remove(l) {
                    self.kill(c);
                    killed += 1;
                }
            }
        } else {
            // A range wider than the cache: cheaper to look at every cache block once.
            for c in 0..self.blocks.block_count() {
                match self.blocks.lba_of(c) {
                    Some(l) if l >= lba && l - lba < count => {
                        self.blocks.remove_block(c);
                        self.kill(c);
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
        if !self.open.active || (self.open.data_count == 0 && self.open_ranges.is_empty()) {
            return false;
        }
        let o = self.open.clone();
        let seg_buffer = self.segments[o.slot as usize].buffer;
        assert_ne!(seg_buffer, NO_BUFFER);
        // SAFETY: the metadata blocks of the open chunk are owned by the lock holder until it
        // is queued below.
        let meta = unsafe {
            buffers.slice_mut(
                seg_buffer,
                o.start_block as usize * BLOCK_SIZE_BYTES as usize,
                o.meta_blocks as usize * BLOCK_SIZE_BYTES as usize,
            )
        };
        let entry_count = o.data_count + self.open_ranges.len() as u32;
        let header = ChunkHeader {
            segment_id: o.segment_id,
            seq: o.seq,
            synced_seq: 0,
            epoch: self.seqs.epoch(),
            start_block: o.start_block as u16,
            meta_block_count: o.meta_blocks as u16,
            entry_count: entry_count as u16,
            data_block_count: o.data_count as u16,
        };
        let (geo, blocks) = (&self.geo, &self.blocks);
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
            self.open_ranges.drain(..),
        );
        self.queue.push_back(SealedChunk {
            slot: o.slot,
            buffer: seg_buffer,
            seq: o.seq,
            start_block: o.start_block,
            meta_blocks: o.meta_blocks,
            data_count: o.data_count,
            entry_count,
        });
        self.counters.chunks_sealed += 1;
        self.segments[o.slot as usize].last_sealed_seq = o.seq;
        assert_eq!(
            o.seq,
            self.seqs.next(),
            "the open chunk carries the next sequence"
        );
        self.seqs.advance_next();
        let next_start = o.start_block + o.meta_blocks + o.data_count;
        if self.geo.blocks_per_segment - next_start >= 2 {
            self.open_chunk_at(o.slot, o.segment_id, next_start);
        } else {
            self.segments[o.slot as usize].full = true;
            self.open.active = false;
            self.open_segment(false);
        }
        true
    }

    fn open_chunk_at(&mut self, slot: u32, segment_id: u64, start_block: u32) {
        let (meta, data) = chunk::plan(self.geo.blocks_per_segment - start_block);
        self.open = OpenChunk {
            active: true,
            slot,
            segment_id,
            seq: self.seqs.next(),
            start_block,
            meta_blocks: meta,
            data_capacity: data,
            data_count: 0,
            first_write_at: None,
        };
    }

    /// Free slots in the ring.
    pub fn free_segments(&self) -> u64 {
        self.geo.segment_count - (self.next_segment_id - self.head_segment_id)
    }

    /// Whether the relocator should move the head: the ring is (nearly) out of free segments.
    /// Writers that wait for a RAM buffer instead wait for the flusher, not for room in the ring.
    pub fn under_pressure(&self) -> bool {
        self.free_segments() < free_segments_low(self.geo.segment_count)
    }

    /// Opens segment `next_segment_id` if its slot and a RAM buffer are free. Writers leave
    /// `RESERVE_SEGMENTS` free for the relocator (`use_reserve`), so it can always make room.
    pub fn open_segment(&mut self, use_reserve: bool) -> bool {
        assert!(!self.open.active);
        let keep_free = if use_reserve { 0 } else { RESERVE_SEGMENTS };
        if self.free_segments() < 1 + keep_free {
            return false; // the head must be reclaimed first
        }
        let id = self.next_segment_id;
        let slot = self.geo.slot_of(id);
        assert_eq!(
            self.segments[slot as usize].id, 0,
            "a free slot is occupied"
        );
        assert!(id - self.head_segment_id < self.geo.segment_count);
        let Some(buffer) = self.free_buffers.pop() else {
            return false;
        };
        self.segments[slot as usize] = SegmentInfo {
            id,
            buffer,
            ram_start_block: 0,
            live_blocks: 0,
            dead_by_seq: 0,
            first_seq: self.seqs.next(),
            full: false,
            last_sealed_seq: 0,
            dirty_blocks: 0,
            synced_blocks: 0,
        };
        self.next_segment_id += 1;
        self.ram_segments.push_back(slot);
        self.open_chunk_at(slot, id, 0);
        assert!(self.next_segment_id - self.head_segment_id <= self.geo.segment_count);
        debug_assert!(
            self.ram_segments.len() + self.free_buffers.len() <= self.geo.segment_count as usize
        );
        true
    }

    /// After chunks up to `written_seq` reached the cache device: release the buffers of full
    /// segments whose chunks are all written.
    pub fn release_written_buffers(&mut self) {
        // Segments are written in id order, so the in-RAM ones form a FIFO.
        while let Some(&slot) = self.ram_segments.front() {
            let seg = &mut self.segments[slot as usize];
            assert_ne!(seg.buffer, NO_BUFFER);
            if !seg.full || seg.last_sealed_seq > self.seqs.written() {
                break;
            }
            self.free_buffers.push(seg.buffer);
            seg.buffer = NO_BUFFER;
            self.ram_segments.pop_front();
        }
    }

    /// How far the head could advance now: the id of the first segment that must stay.
    pub fn reclaimable_head(&self, pinned: impl Fn(u32) -> bool) -> u64 {
        // A zero range not yet applied to the backing device must stay in the log (recovery
        // re-applies it): a zero entry is no live block, and without this the head passed it
        // and the dirty blocks it killed, and a crash then read the backing's older data.
        let zero_pending_seq = self.writeback.zero_pending_seq().unwrap_or(u64::MAX);
        let mut id = self.head_segment_id;
        while id < self.next_segment_id {
            let slot = self.geo.slot_of(id);
            let seg = &self.segments[slot as usize];
            assert_eq!(seg.id, id, "segment ring out of order");
            let in_open = self.open.active && self.open.slot == slot;
            if in_open
                || seg.buffer != NO_BUFFER
                || !seg.full
                || seg.live_blocks != 0
                || seg.dead_by_seq > self.seqs.synced()
                || seg.last_sealed_seq >= zero_pending_seq
                || pinned(slot)
            {
                break;
            }
            id += 1;
        }
        id
    }

    /// Whether the head segment is dead and only waits for the chunks that killed it to sync.
    pub fn head_waits_for_sync(&self) -> bool {
        let seg = &self.segments[self.geo.slot_of(self.head_segment_id) as usize];
        seg.id == self.head_segment_id
            && seg.full
            && seg.live_blocks == 0
            && seg.dead_by_seq > self.seqs.synced()
    }

    /// Frees the slots of segments before `new_head`, whose reclaim the superblock now records.
    pub fn free_segments_before(&mut self, new_head: u64) {
        assert!(new_head <= self.next_segment_id, "the head passes the tail");
        while self.head_segment_id < new_head {
            let slot = self.geo.slot_of(self.head_segment_id) as usize;
            assert_eq!(self.segments[slot].live_blocks, 0);
            assert_eq!(self.segments[slot].dirty_blocks, 0);
            self.segments[slot] = SegmentInfo {
                buffer: NO_BUFFER,
                ..SegmentInfo::default()
            };
            self.head_segment_id += 1;
            self.counters.segments_reclaimed += 1;
        }
    }

    /// Sequence of the first chunk of the head segment (persisted in the checkpoint).
    pub fn head_seq(&self) -> u64 {
        let slot = self.geo.slot_of(self.head_segment_id) as usize;
        if self.segments[slot].id == self.head_segment_id {
            self.segments[slot].first_seq
        } else {
            // The head segment is not open yet: its first chunk will be the next one.
            self.seqs.next()
        }
    }

    /// Slots in use, for statistics.
    pub fn segments_in_use(&self) -> u64 {
        self.next_segment_id - self.head_segment_id
    }
}
