//! The log ring: the segment table, the head and next segment ids, the open chunk and its range
//! entries, the RAM buffers segments are filled in, the queue of sealed chunks waiting for the
//! flusher, and the chunks written but not yet synced.
//!
//! Segment life cycle (one `SegmentInfo` per ring slot; each slot is in exactly one phase):
//!
//! ```text
//! free --open--> open (RAM buffer, chunks appended) --full--> full, in RAM (chunks queued)
//!      --all chunks written--> on the cache device --every block dead or written back-->
//!      reclaimable --head persisted past it--> free
//! ```
//!
//! Invariants kept here: head ≤ next and both only rise; the slots of ids `head..next` hold
//! those ids and every other slot is free; a slot holds a RAM buffer exactly when it is in
//! `ram_segments` (in id order), and those plus the free buffers and the detached ones (written
//! segments' buffers that given-up reservations still receive into) are all the buffers; at most
//! one segment is open, the open chunk's; per segment, dirty ≤ live blocks.

use std::collections::VecDeque;
use std::time::Instant;

use super::buffers::NO_BUFFER;
use crate::format::chunk::{self, Entry};
use crate::format::BLOCK_SIZE_BYTES;
use crate::geometry::Geometry;

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
    /// Blocks a write reserved and has not published or let go (`state/reservations.rs`):
    /// the RAM buffer stays while any is (the receiving thread writes into it).
    pub reserved_blocks: u32,
}

/// Where a slot is in the segment life cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Free,
    /// Chunks are still appended (in a RAM buffer).
    Open,
    /// Full, some chunks still only in RAM.
    FullInRam,
    /// Every chunk written to the cache device.
    OnDevice,
}

impl SegmentInfo {
    fn free() -> SegmentInfo {
        SegmentInfo {
            buffer: NO_BUFFER,
            ..SegmentInfo::default()
        }
    }

    /// The one phase this slot is in; panics on a combination no phase allows.
    pub fn phase(&self) -> Phase {
        assert!(
            self.dirty_blocks <= self.live_blocks,
            "more dirty than live"
        );
        match (self.id, self.buffer != NO_BUFFER, self.full) {
            (0, false, _) => {
                assert_eq!(self.live_blocks, 0, "a free slot has live blocks");
                assert_eq!(self.reserved_blocks, 0, "a free slot has reserved blocks");
                Phase::Free
            }
            (0, true, _) => panic!("a free slot holds a RAM buffer"),
            (_, true, false) => Phase::Open,
            (_, true, true) => Phase::FullInRam,
            (_, false, true) => Phase::OnDevice,
            (_, false, false) => panic!("segment {} is open without a RAM buffer", self.id),
        }
    }
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
    /// Reserved blocks not yet published (holes until they are; `state/reservations.rs`).
    pub pending_blocks: u32,
    /// When the oldest write still only in this chunk arrived (for the periodic seal).
    pub first_write_at: Option<Instant>,
}

impl OpenChunk {
    pub fn data_start(&self) -> u32 {
        self.start_block + self.meta_blocks
    }

    fn inactive(seq: u64) -> OpenChunk {
        OpenChunk {
            active: false,
            slot: 0,
            segment_id: 0,
            seq,
            start_block: 0,
            meta_blocks: 0,
            data_capacity: 0,
            data_count: 0,
            pending_blocks: 0,
            first_write_at: None,
        }
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
    /// 0 if no block entry of the chunk has a clean valid sector; else the bypass write
    /// generation at its seal (`Bypass::write_gen`): its clean sectors may speak of backing
    /// data that new, so they stay in its entries only once a backing sync covers it (else
    /// clean entries become holes and partly dirty ones keep only their dirty sectors).
    pub vouch_gen: u64,
    /// Reserved blocks not yet published or let go: the flusher leaves the chunk (and those
    /// after it) queued until none are.
    pub pending_blocks: u32,
}

impl SealedChunk {
    /// The block after the chunk's last one.
    pub fn end_block(&self) -> u32 {
        self.start_block + self.meta_blocks + self.data_count
    }

    pub fn size_bytes(&self) -> u64 {
        (self.meta_blocks + self.data_count) as u64 * BLOCK_SIZE_BYTES
    }
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

pub struct Ring {
    segment_count: u64,
    blocks_per_segment: u32,
    segments: Vec<SegmentInfo>,
    /// The oldest segment still in the log.
    head_segment_id: u64,
    /// The id the next opened segment gets.
    next_segment_id: u64,
    open: OpenChunk,
    /// Range entries (zero, drop) of the open chunk; they follow its block entries.
    open_ranges: Vec<Entry>,
    buffer_count: u32,
    free_buffers: Vec<u32>,
    /// Buffers of segments written and gone from RAM that reservations given up still receive
    /// into: (buffer, blocks still reserved). Free once none are.
    detached: Vec<(u32, u32)>,
    /// Slots of the segments holding a RAM buffer, oldest first.
    ram_segments: VecDeque<u32>,
    queue: VecDeque<SealedChunk>,
    /// Bytes written to the cache device since its last sync.
    unsynced_bytes: u64,
    /// Chunks written since the last sync: (slot, segment id, end block). A sync makes them
    /// durable and advances their segments' `synced_blocks`.
    unsynced_ends: Vec<(u32, u64, u32)>,
    /// The oldest write of the chunks sealed since the periodic seal last asked for a sync
    /// (`take_sealed_write_at`): a chunk a writer sealed because it was full is due a sync
    /// by its own first write's deadline, not the next chunk's (which may never start: with
    /// no RAM buffer free the next segment does not open; sim seed 118513).
    sealed_write_at: Option<Instant>,
}

impl Ring {
    /// The ring recovery found: `segments` as replayed (all full, on the device), the log ending
    /// at block `end_block` of segment `end_segment_id`, whose chunk gets `next_seq`. A log
    /// ending inside a segment continues in it (its earlier blocks stay on the device).
    pub fn recovered(
        geo: &Geometry,
        mut segments: Vec<SegmentInfo>,
        head_segment_id: u64,
        end_segment_id: u64,
        end_block: u32,
        next_seq: u64,
        buffer_count: u32,
    ) -> Ring {
        assert_eq!(segments.len() as u64, geo.segment_count);
        assert!(buffer_count >= 2, "at least two buffers");
        let mut free_buffers: Vec<u32> = (0..buffer_count).rev().collect();
        let mut open = OpenChunk::inactive(next_seq);
        let mut ram_segments = VecDeque::new();
        let next_segment_id = if end_block > 0 {
            let end_slot = geo.slot_of(end_segment_id);
            ram_segments.push_back(end_slot);
            let seg = &mut segments[end_slot as usize];
            assert_eq!(seg.id, end_segment_id);
            seg.full = false;
            seg.buffer = free_buffers.pop().expect("at least two buffers");
            seg.ram_start_block = end_block;
            let (meta, data) = chunk::plan(geo.blocks_per_segment - end_block);
            open = OpenChunk {
                active: true,
                slot: end_slot,
                segment_id: end_segment_id,
                seq: next_seq,
                start_block: end_block,
                meta_blocks: meta,
                data_capacity: data,
                data_count: 0,
                pending_blocks: 0,
                first_write_at: None,
            };
            end_segment_id + 1
        } else {
            end_segment_id
        };
        let ring = Ring {
            segment_count: geo.segment_count,
            blocks_per_segment: geo.blocks_per_segment,
            segments,
            head_segment_id,
            next_segment_id,
            open,
            open_ranges: Vec::with_capacity(chunk::entry_capacity(1) as usize),
            buffer_count,
            free_buffers,
            detached: Vec::new(),
            ram_segments,
            queue: VecDeque::new(),
            unsynced_bytes: 0,
            unsynced_ends: Vec::new(),
            sealed_write_at: None,
        };
        ring.check();
        ring
    }

    fn slot_of(&self, segment_id: u64) -> u32 {
        (segment_id % self.segment_count) as u32
    }

    /// Asserts every invariant in the module header (a walk over the ring: debug builds only,
    /// called where the ring's shape changes).
    fn check(&self) {
        if !cfg!(debug_assertions) {
            return;
        }
        assert!(self.head_segment_id <= self.next_segment_id);
        assert!(self.next_segment_id - self.head_segment_id <= self.segment_count);
        assert_eq!(
            self.free_buffers.len() + self.ram_segments.len() + self.detached.len(),
            self.buffer_count as usize,
            "buffers lost or doubled"
        );
        let mut in_ram = 0;
        let mut open = 0;
        for (slot, seg) in self.segments.iter().enumerate() {
            let phase = seg.phase();
            let in_ring = (self.head_segment_id..self.next_segment_id).contains(&seg.id);
            assert_eq!(phase != Phase::Free, in_ring, "slot {slot} out of the ring");
            if in_ring {
                assert_eq!(self.slot_of(seg.id) as usize, slot);
            }
            if phase == Phase::Open {
                open += 1;
                assert!(self.open.active && self.open.slot as usize == slot);
            }
            in_ram += (seg.buffer != NO_BUFFER) as usize;
        }
        assert_eq!(open, self.open.active as usize, "open segments");
        assert_eq!(in_ram, self.ram_segments.len(), "segments in RAM");
        let ids = self
            .ram_segments
            .iter()
            .map(|&s| self.segments[s as usize].id);
        assert!(ids.clone().zip(ids.skip(1)).all(|(a, b)| a < b));
    }

    pub fn head_segment_id(&self) -> u64 {
        self.head_segment_id
    }

    /// Slots in use.
    pub fn segments_in_use(&self) -> u64 {
        self.next_segment_id - self.head_segment_id
    }

    /// Free slots in the ring.
    pub fn free_segments(&self) -> u64 {
        self.segment_count - self.segments_in_use()
    }

    /// Whether the relocator should move the head: the ring is (nearly) out of free segments.
    /// Writers that wait for a RAM buffer instead wait for the flusher, not for room in the ring.
    pub fn under_pressure(&self) -> bool {
        self.free_segments() < free_segments_low(self.segment_count)
    }

    /// Whether the ring is low on free segments and the oldest segment with live blocks holds
    /// dirty ones, which only writeback can make droppable in flush-epoch order (where the
    /// relocator does not move them): writeback should run ahead of the head before writers
    /// wait. Twice the relocator's margin, so writeback starts a batch's time earlier.
    pub fn head_wants_writeback(&self) -> bool {
        if self.free_segments() >= 2 * free_segments_low(self.segment_count) {
            return false;
        }
        self.in_log()
            .find(|(_, _, seg)| seg.live_blocks > 0)
            .is_some_and(|(_, _, seg)| seg.dirty_blocks > 0)
    }

    pub fn segment(&self, slot: u32) -> &SegmentInfo {
        &self.segments[slot as usize]
    }

    /// The segments in the log, oldest first, as (id, slot, segment).
    pub fn in_log(&self) -> impl Iterator<Item = (u64, u32, &SegmentInfo)> {
        (self.head_segment_id..self.next_segment_id).map(|id| {
            let slot = self.slot_of(id);
            let seg = &self.segments[slot as usize];
            assert_eq!(seg.id, id, "segment ring out of order");
            (id, slot, seg)
        })
    }

    /// Sequence of the first chunk of segment `id` (the log's `next_seq` if not opened yet).
    pub fn first_seq_of(&self, id: u64, next_seq: u64) -> u64 {
        assert!(id >= self.head_segment_id && id <= self.next_segment_id);
        if id < self.next_segment_id {
            self.segments[self.slot_of(id) as usize].first_seq
        } else {
            next_seq
        }
    }

    pub fn open(&self) -> &OpenChunk {
        &self.open
    }

    fn is_open_slot(&self, slot: u32) -> bool {
        self.open.active && self.open.slot == slot
    }

    /// Where block `b` of slot `slot` is: the open chunk, a sealed chunk in RAM, or the device.
    pub fn locate(&self, slot: u32, b: u32) -> Location {
        let seg = &self.segments[slot as usize];
        if self.is_open_slot(slot) && b >= self.open.data_start() {
            Location::OpenChunk { buffer: seg.buffer }
        } else if seg.buffer != NO_BUFFER && b >= seg.ram_start_block {
            Location::Ram { buffer: seg.buffer }
        } else {
            Location::Disk
        }
    }

    pub fn free_buffer_count(&self) -> u32 {
        self.free_buffers.len() as u32
    }

    pub fn ram_segment_count(&self) -> u64 {
        self.ram_segments.len() as u64
    }

    /// The oldest segment with live blocks, as (id, slot), if every segment up to it is wholly
    /// on the cache device (the ones before it are dead and only wait to be reclaimed).
    pub fn oldest_live_on_device(&self) -> Option<(u64, u32)> {
        for (id, slot, seg) in self.in_log() {
            if seg.phase() != Phase::OnDevice || self.is_open_slot(slot) {
                return None;
            }
            if seg.live_blocks > 0 {
                return Some((id, slot));
            }
        }
        None
    }

    // --- Block accounting (the index lives in `Blocks`; `State` keeps the two in step) ---

    pub fn add_dirty(&mut self, slot: u32) {
        let seg = &mut self.segments[slot as usize];
        seg.dirty_blocks += 1;
        assert!(
            seg.dirty_blocks <= seg.live_blocks,
            "more dirty than live blocks"
        );
    }

    pub fn drop_dirty(&mut self, slot: u32) {
        let seg = &mut self.segments[slot as usize];
        assert!(seg.dirty_blocks > 0, "segment dirty count underflow");
        seg.dirty_blocks -= 1;
    }

    /// A clean block of `slot` left the index. With `killer_seq`, the chunk that records why:
    /// the segment is reclaimable only once that chunk is durable.
    pub fn drop_live(&mut self, slot: u32, killer_seq: Option<u64>) {
        let seg = &mut self.segments[slot as usize];
        assert!(
            seg.live_blocks > seg.dirty_blocks,
            "dropping a block of a segment with no clean live blocks"
        );
        seg.live_blocks -= 1;
        if let Some(seq) = killer_seq {
            seg.dead_by_seq = seg.dead_by_seq.max(seq);
        }
    }

    /// A dirty block of `slot` left the index but stays live as a shadow (writeback still owes
    /// it to the backing device): the chunk `killer_seq` records its replacement, so once the
    /// shadow is written back the segment is reclaimable only when that chunk is durable.
    pub fn note_shadowed(&mut self, slot: u32, killer_seq: u64) {
        let seg = &mut self.segments[slot as usize];
        assert!(seg.dirty_blocks > 0, "a shadow is dirty");
        seg.dead_by_seq = seg.dead_by_seq.max(killer_seq);
    }

    // --- The open chunk ---

    /// Whether the open chunk has no room for another block or range entry.
    pub fn open_entries_full(&self) -> bool {
        let o = &self.open;
        o.active
            && (o.data_count == o.data_capacity
                || o.data_count + self.open_ranges.len() as u32
                    >= chunk::entry_capacity(o.meta_blocks))
    }

    /// Takes the open chunk's next data block, as (slot, block in segment); it is live from
    /// now on. `now` is called only for the chunk's first block (the periodic seal's start):
    /// a clock read per write was ~2% of the writer's time (issue 20).
    pub fn take_data_block(&mut self, now: impl FnOnce() -> Instant) -> (u32, u32) {
        let o = &mut self.open;
        assert!(o.active && o.data_count < o.data_capacity);
        let b = o.data_start() + o.data_count;
        o.data_count += 1;
        o.first_write_at.get_or_insert_with(now);
        let seg = &mut self.segments[o.slot as usize];
        seg.live_blocks += 1;
        assert!(b < self.blocks_per_segment);
        (o.slot, b)
    }

    /// Takes up to `max` of the open chunk's next data blocks for a reservation, as (slot, first
    /// block, count): live, pending in the chunk and pinning the segment's buffer from now on.
    pub fn take_data_run(&mut self, max: u32, now: Instant) -> (u32, u32, u32) {
        assert!(self.open.active && !self.open_entries_full() && max > 0);
        let o = &mut self.open;
        let by_entries =
            chunk::entry_capacity(o.meta_blocks) - o.data_count - self.open_ranges.len() as u32;
        let count = max.min(o.data_capacity - o.data_count).min(by_entries);
        let b = o.data_start() + o.data_count;
        o.data_count += count;
        o.pending_blocks += count;
        o.first_write_at.get_or_insert(now);
        let seg = &mut self.segments[o.slot as usize];
        seg.live_blocks += count;
        seg.reserved_blocks += count;
        assert!(b + count <= self.blocks_per_segment);
        (o.slot, b, count)
    }

    /// `count` reserved blocks of chunk `seq` were published or let go: it no longer waits for
    /// them. Returns whether that chunk is now the queue's first and ready (wake the flusher).
    pub fn unpend(&mut self, seq: u64, count: u32) -> bool {
        if self.open.active && self.open.seq == seq {
            assert!(
                self.open.pending_blocks >= count,
                "open chunk pending underflow"
            );
            self.open.pending_blocks -= count;
            return false;
        }
        let i = self
            .queue
            .iter()
            .position(|c| c.seq == seq)
            .expect("a chunk with pending blocks is open or queued");
        let c = &mut self.queue[i];
        assert!(c.pending_blocks >= count, "queued chunk pending underflow");
        c.pending_blocks -= count;
        i == 0 && c.pending_blocks == 0
    }

    /// A reservation's blocks of `slot`, received into `buffer`, no longer need it kept.
    pub fn unpin(&mut self, slot: u32, buffer: u32, count: u32) {
        let seg = &mut self.segments[slot as usize];
        if seg.buffer == buffer {
            assert!(seg.reserved_blocks >= count, "reserved blocks underflow");
            seg.reserved_blocks -= count;
            return;
        }
        let i = self
            .detached
            .iter()
            .position(|&(b, _)| b == buffer)
            .expect("a pinned buffer is its segment's or detached");
        let left = &mut self.detached[i].1;
        assert!(*left >= count, "detached reserved blocks underflow");
        *left -= count;
        if *left == 0 {
            self.detached.swap_remove(i);
            self.free_buffers.push(buffer);
        }
    }

    /// All the RAM buffers, wherever they are.
    pub fn buffer_count(&self) -> u32 {
        self.buffer_count
    }

    /// Whether the queue's first chunk waits for reserved blocks.
    pub fn front_pending(&self) -> bool {
        self.queue.front().is_some_and(|c| c.pending_blocks > 0)
    }

    /// Queued chunk `seq` if it waits for reserved blocks (so the flusher has not taken it and
    /// its metadata is still the lock holder's).
    pub fn pending_chunk(&self, seq: u64) -> Option<&SealedChunk> {
        self.queue
            .iter()
            .find(|c| c.seq == seq)
            .filter(|c| c.pending_blocks > 0)
    }

    /// Appends a range entry to the open chunk, which must have room for it.
    pub fn push_range(&mut self, entry: Entry, now: Instant) {
        assert!(entry.is_range());
        assert!(self.open.active && !self.open_entries_full());
        self.open_ranges.push(entry);
        self.open.first_write_at.get_or_insert(now);
    }

    /// Whether the open chunk holds anything to seal.
    pub fn open_has_entries(&self) -> bool {
        self.open.active && (self.open.data_count > 0 || !self.open_ranges.is_empty())
    }

    /// The open chunk's range entries, for sealing: `take_sealed` must follow in the same lock
    /// hold.
    pub fn open_range_count(&self) -> u32 {
        self.open_ranges.len() as u32
    }

    pub fn drain_open_ranges(&mut self) -> std::vec::Drain<'_, Entry> {
        self.open_ranges.drain(..)
    }

    /// The open chunk's RAM buffer.
    pub fn open_buffer(&self) -> u32 {
        assert!(self.open.active);
        let buffer = self.segments[self.open.slot as usize].buffer;
        assert_ne!(buffer, NO_BUFFER);
        buffer
    }

    /// The open chunk (its metadata encoded, its range entries drained) is sealed: queue it for
    /// the flusher and open the next chunk, with `next_seq`, after it (or the next segment).
    pub fn queue_sealed(&mut self, sealed: SealedChunk, next_seq: u64) {
        let o = self.open.clone();
        assert!(o.active && self.open_ranges.is_empty());
        assert_eq!((sealed.slot, sealed.seq), (o.slot, o.seq));
        assert_eq!(
            sealed.pending_blocks, o.pending_blocks,
            "pending blocks lost at seal"
        );
        assert!(next_seq > o.seq, "sequence numbers only rise");
        let next_start = sealed.end_block();
        self.segments[o.slot as usize].last_sealed_seq = o.seq;
        self.queue.push_back(sealed);
        self.sealed_write_at = match (self.sealed_write_at, o.first_write_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if self.blocks_per_segment - next_start >= 2 {
            self.open_chunk_at(o.slot, o.segment_id, next_start, next_seq);
        } else {
            self.segments[o.slot as usize].full = true;
            self.open.active = false;
            self.open.seq = next_seq;
            self.open.pending_blocks = 0;
            // Its writes are in the sealed chunk now (`sealed_write_at`); an inactive chunk
            // holding a stale time had the flusher wake every millisecond to seal nothing.
            self.open.first_write_at = None;
            self.open_segment(false, next_seq);
        }
    }

    /// The oldest write of the chunks sealed since the last call, if any (see
    /// `sealed_write_at`); the caller asks for a sync of every chunk sealed so far.
    pub fn take_sealed_write_at(&mut self) -> Option<Instant> {
        self.sealed_write_at.take()
    }

    /// The oldest write of the chunks sealed since `take_sealed_write_at` last ran.
    pub fn sealed_write_at(&self) -> Option<Instant> {
        self.sealed_write_at
    }

    fn open_chunk_at(&mut self, slot: u32, segment_id: u64, start_block: u32, seq: u64) {
        let (meta, data) = chunk::plan(self.blocks_per_segment - start_block);
        self.open = OpenChunk {
            active: true,
            slot,
            segment_id,
            seq,
            start_block,
            meta_blocks: meta,
            data_capacity: data,
            data_count: 0,
            pending_blocks: 0,
            first_write_at: None,
        };
    }

    /// Opens segment `next_segment_id` if its slot and a RAM buffer are free; its first chunk
    /// gets `next_seq`. Writers leave `RESERVE_SEGMENTS` free for the relocator
    /// (`use_reserve`), so it can always make room.
    /// Whether `open_segment(use_reserve, ..)` would open one now: a free segment beyond the
    /// reserve (all of them with `use_reserve`) and a free RAM buffer.
    pub fn can_open_segment(&self, use_reserve: bool) -> bool {
        let keep_free = if use_reserve { 0 } else { RESERVE_SEGMENTS };
        self.free_segments() > keep_free && !self.free_buffers.is_empty()
    }

    pub fn open_segment(&mut self, use_reserve: bool, next_seq: u64) -> bool {
        assert!(!self.open.active);
        let keep_free = if use_reserve { 0 } else { RESERVE_SEGMENTS };
        if self.free_segments() < 1 + keep_free {
            return false; // the head must be reclaimed first
        }
        let id = self.next_segment_id;
        let slot = self.slot_of(id);
        assert_eq!(self.segments[slot as usize].phase(), Phase::Free);
        let Some(buffer) = self.free_buffers.pop() else {
            return false;
        };
        self.segments[slot as usize] = SegmentInfo {
            id,
            buffer,
            ram_start_block: 0,
            live_blocks: 0,
            dead_by_seq: 0,
            first_seq: next_seq,
            full: false,
            last_sealed_seq: 0,
            dirty_blocks: 0,
            synced_blocks: 0,
            reserved_blocks: 0,
        };
        self.next_segment_id += 1;
        self.ram_segments.push_back(slot);
        self.open_chunk_at(slot, id, 0, next_seq);
        self.check();
        true
    }

    // --- The flusher's side ---

    pub fn queue_is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// How many sealed chunks wait for the flusher.
    pub fn queue_len(&self) -> usize {
        self.queue.len()
    }

    /// The sealed chunks waiting for the flusher, oldest first.
    pub fn queued(&self) -> impl Iterator<Item = &SealedChunk> {
        self.queue.iter()
    }

    /// Takes up to `max` sealed chunks, oldest first, for the flusher to write.
    /// Stops before a chunk still waiting for reserved blocks.
    pub fn take_queued(&mut self, max: usize) -> Vec<SealedChunk> {
        let ready = self
            .queue
            .iter()
            .take_while(|c| c.pending_blocks == 0)
            .count();
        let take = ready.min(max);
        self.queue.drain(..take).collect()
    }

    /// Chunk `sc` reached the cache device (not yet synced).
    pub fn note_written(&mut self, sc: &SealedChunk) {
        let id = self.segments[sc.slot as usize].id;
        assert_ne!(id, 0, "a written chunk's segment is free");
        self.unsynced_ends.push((sc.slot, id, sc.end_block()));
        self.unsynced_bytes += sc.size_bytes();
    }

    pub fn unsynced_bytes(&self) -> u64 {
        self.unsynced_bytes
    }

    /// A sync completed: every chunk written before it is durable.
    pub fn note_synced(&mut self) {
        self.unsynced_bytes = 0;
        for (slot, id, end) in std::mem::take(&mut self.unsynced_ends) {
            let seg = &mut self.segments[slot as usize];
            assert_eq!(seg.id, id, "a segment with unsynced chunks was reclaimed");
            seg.synced_blocks = seg.synced_blocks.max(end);
        }
    }

    /// Chunks up to `written_seq` reached the cache device: release the buffers of full
    /// segments whose chunks are all written. One that reservations (given up: a pending one
    /// keeps its chunk unwritten) still receive into is detached instead, and freed when the
    /// last lets go: the segment itself leaves RAM, so reclaim and relocation pass it (a
    /// client that stops mid-payload holds up no one).
    pub fn release_written_buffers(&mut self, written_seq: u64) {
        // Segments are written in id order, so the in-RAM ones form a FIFO.
        while let Some(&slot) = self.ram_segments.front() {
            let seg = &mut self.segments[slot as usize];
            assert_ne!(seg.buffer, NO_BUFFER);
            if !seg.full || seg.last_sealed_seq > written_seq {
                break;
            }
            if seg.reserved_blocks > 0 {
                self.detached.push((seg.buffer, seg.reserved_blocks));
                seg.reserved_blocks = 0;
            } else {
                self.free_buffers.push(seg.buffer);
            }
            seg.buffer = NO_BUFFER;
            self.ram_segments.pop_front();
        }
    }

    // --- Reclaim ---

    /// How far the head could advance now: the id of the first segment that must stay.
    /// `synced_seq`: the durable log; `keep_from_seq`: chunks from this sequence on must stay
    /// (a zero range not yet applied to the backing device).
    pub fn reclaimable_head(
        &self,
        synced_seq: u64,
        keep_from_seq: u64,
        pinned: impl Fn(u32) -> bool,
    ) -> u64 {
        let unsynced_from = self.first_unsynced_segment();
        for (id, slot, seg) in self.in_log() {
            if self.is_open_slot(slot)
                || seg.phase() != Phase::OnDevice
                || seg.live_blocks != 0
                || seg.dead_by_seq > synced_seq
                || seg.last_sealed_seq >= keep_from_seq
                || id >= unsynced_from
                || pinned(slot)
            {
                return id;
            }
        }
        self.next_segment_id
    }

    /// The oldest segment holding a chunk written but not yet synced (`u64::MAX`: none). It
    /// stays until the sync (`note_synced` finds its slot by id); a segment emptied by
    /// dropping clean blocks right after its last chunk was written is one.
    fn first_unsynced_segment(&self) -> u64 {
        self.unsynced_ends
            .iter()
            .map(|&(_, id, _)| id)
            .min()
            .unwrap_or(u64::MAX)
    }

    /// Whether the head segment is dead and only waits for a sync: of the chunks that killed
    /// it, or of its own last chunks.
    pub fn head_waits_for_sync(&self, synced_seq: u64) -> bool {
        let seg = &self.segments[self.slot_of(self.head_segment_id) as usize];
        seg.id == self.head_segment_id
            && seg.full
            && seg.live_blocks == 0
            && (seg.dead_by_seq > synced_seq || self.first_unsynced_segment() <= seg.id)
    }

    /// Frees the slots of segments before `new_head`, whose reclaim the superblock now records.
    /// Returns how many were freed.
    pub fn free_segments_before(&mut self, new_head: u64) -> u64 {
        assert!(new_head >= self.head_segment_id, "the head only advances");
        assert!(new_head <= self.next_segment_id, "the head passes the tail");
        let freed = new_head - self.head_segment_id;
        while self.head_segment_id < new_head {
            let slot = self.slot_of(self.head_segment_id) as usize;
            let seg = &self.segments[slot];
            assert_eq!(seg.phase(), Phase::OnDevice);
            assert_eq!(seg.live_blocks, 0);
            self.segments[slot] = SegmentInfo::free();
            self.head_segment_id += 1;
        }
        self.check();
        freed
    }
}
