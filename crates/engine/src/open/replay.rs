//! Recovery's pass 3: replay the kept chunks into the block tables (the newest entry per block
//! wins; ranges drop what they cover; chunks up to the writeback position replay clean), write
//! back blocks a re-applied zero range may have made wrong, and hand the result over as the
//! engine's starting `State`.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::format::chunk::{ChunkHeader, Entry, KIND_DATA, KIND_DROP, KIND_HOLE, KIND_ZERO};
use crate::format::BLOCK_SIZE_BYTES;
use crate::geometry::Geometry;
use crate::index::BlockIndex;
use crate::io::aligned::AlignedBuf;
use crate::io::BlockDevice;
use crate::state::blocks::Blocks;
use crate::state::buffers::NO_BUFFER;
use crate::state::bypass::Bypass;
use crate::state::epochs::Epochs;
use crate::state::health::Health;
use crate::state::promotion::Promotion;
use crate::state::room::Room;
use crate::state::seqs::Seqs;
use crate::state::writeback::WritebackState;
use crate::state::zeros::Zeros;
use crate::state::{Ring, SegmentInfo, State};
use crate::stats::{Counters, RecoveryReport};

const BLOCK: usize = BLOCK_SIZE_BYTES as usize;

/// A zero range recovery found logged and not yet applied to the backing device.
#[derive(Clone, Copy, Debug)]
pub struct ZeroRange {
    pub lba: u64,
    pub count: u64,
    /// The chunk holding it: sequence, segment id, first block.
    pub seq: u64,
    pub segment_id: u64,
    pub block: u32,
}

pub struct Recovered {
    pub head_segment_id: u64,
    pub head_seq: u64,
    pub last_seq: u64,
    /// Where the next chunk goes: block `end_block` of segment `end_segment_id`.
    pub(super) end_segment_id: u64,
    pub(super) end_block: u32,
    pub(super) index: BlockIndex,
    pub(super) dirty_mask: Vec<u8>,
    pub(super) valid_mask: Vec<u8>,
    pub(super) data_crc: Vec<u32>,
    pub(super) segments: Vec<SegmentInfo>,
    pub(super) dirty_blocks: u64,
    /// The persisted writeback position: chunks up to it replay as clean.
    pub(super) writeback_seq: u64,
    pub(super) zero_applied_seq: u64,
    /// Zero ranges after both the writeback position and the checkpoint's `zero_applied_seq`,
    /// in log order: a crash cut their application short, so open applies them again before
    /// anything else.
    pub zero_ranges: Vec<ZeroRange>,
    /// `writeback_order = consistent`: zero ranges to apply again are applied in log order, after
    /// the older dirty blocks are written back (`Engine::open` runs writeback until then), so
    /// the backing device stays a past state of the disk. Older-epoch dirty copies a range
    /// covers are kept as shadows for that, and blocks logged clean after it replay dirty.
    pub(super) consistent: bool,
    /// Blocks logged as (partly) clean after a zero range to apply again: the zeros may undo
    /// their "clean", so open writes them back (cache block, lba) before anything else.
    pub distrusted: Vec<(u32, u64)>,
    /// Blocks the log's zero ranges left reading as zeros, not written or trimmed since (in
    /// log order; a block's own later entry removes it).
    pub(super) zeros: Zeros,
    pub(super) blocks_per_segment: u32,
    /// Chunks that start a flush epoch (`FLAG_FLUSH_BEFORE`): first cache block, segment id,
    /// block in segment, sequence; in log order.
    pub(super) epoch_starts: Vec<(u32, u64, u32, u64)>,
    /// Dirty copies replaced by a write of a later flush epoch: writeback still owes them to
    /// the backing device in their own epoch (cache block → backing block).
    pub(super) shadows: HashMap<u32, u64>,
    pub report: RecoveryReport,
}

impl Recovered {
    pub(super) fn replay(
        &mut self,
        geo: &Geometry,
        slot: u32,
        h: &ChunkHeader,
        entries: &[Entry],
    ) -> Result<()> {
        let seg = &mut self.segments[slot as usize];
        if seg.id != h.segment_id {
            assert_eq!(
                h.start_block, 0,
                "a segment's first chunk starts at block 0"
            );
            *seg = SegmentInfo {
                id: h.segment_id,
                buffer: NO_BUFFER,
                ram_start_block: 0,
                live_blocks: 0,
                dead_by_seq: 0,
                first_seq: h.seq,
                full: true,
                last_sealed_seq: h.seq,
                dirty_blocks: 0,
                synced_blocks: 0,
                reserved_blocks: 0,
            };
        }
        seg.last_sealed_seq = h.seq;
        if h.flush_before() {
            self.epoch_starts.push((
                geo.cache_block(slot, h.start_block as u32),
                h.segment_id,
                h.start_block as u32,
                h.seq,
            ));
        }
        let epoch_start = self
            .epoch_starts
            .last()
            .map_or((0, 0), |&(_, s, b, _)| (s, b));
        // Every replayed chunk is durable once open syncs the new epoch.
        seg.synced_blocks =
            h.start_block as u32 + h.meta_block_count as u32 + h.data_block_count as u32;
        // Chunks up to the writeback position were written back: their blocks are clean.
        let written_back = h.seq <= self.writeback_seq;
        // Ranges first: every live block entry of a chunk was written after its ranges.
        for e in entries.iter().filter(|e| e.is_range()) {
            check_replayable(geo, h, e)?;
            let count = e.range_blocks() as u64;
            let reapply = e.kind == KIND_ZERO && !written_back && h.seq > self.zero_applied_seq;
            // Applied in order later: what older epochs hold there still goes first.
            let keep_before = (reapply && self.consistent).then_some(epoch_start);
            self.drop_range(e.lba, count, keep_before);
            if e.kind == KIND_ZERO {
                self.zeros.insert(e.lba, e.lba + count);
            } else {
                self.zeros.remove(e.lba, e.lba + count);
            }
            if reapply {
                self.zero_ranges.push(ZeroRange {
                    lba: e.lba,
                    count,
                    seq: h.seq,
                    segment_id: h.segment_id,
                    block: h.start_block as u32,
                });
            }
        }
        // Once a zero range is to be applied again, a later block's "clean" may be undone by
        // it: such blocks replay dirty, and open writes them back after the zeros.
        let distrust_clean = !self.zero_ranges.is_empty();
        let mut blk = h.start_block as u32 + h.meta_block_count as u32;
        const PREFETCH_AHEAD: usize = 8;
        for e in entries.iter().take(PREFETCH_AHEAD) {
            self.index.prefetch(e.lba);
        }
        for (i, e) in entries.iter().enumerate().filter(|(_, e)| e.has_block()) {
            if let Some(ahead) = entries.get(i + PREFETCH_AHEAD) {
                self.index.prefetch(ahead.lba);
            }
            check_replayable(geo, h, e)?;
            match e.kind {
                KIND_HOLE => blk += 1,
                KIND_DATA => {
                    // Written after the chunk's ranges (a hole entry names no block, and what
                    // replaced its write is an entry of this chunk).
                    self.zeros.remove(e.lba, e.lba + 1);
                    let c = geo.cache_block(slot, blk);
                    blk += 1;
                    if let Some(prev) = self.index.insert(e.lba, c) {
                        // A dirty copy of an older flush epoch is still owed to the backing
                        // device in its epoch (as `State::retire` keeps it while serving).
                        let prev_pos = (
                            self.segments[self.index_geo_slot(prev)].id,
                            prev % self.blocks_per_segment,
                        );
                        if self.dirty_mask[prev as usize] != 0 && prev_pos < epoch_start {
                            self.shadows.insert(prev, e.lba);
                        } else {
                            self.drop_block(prev);
                        }
                    }
                    let dirty_mask = if written_back {
                        0
                    } else if distrust_clean {
                        if e.dirty_mask != e.valid_mask {
                            self.distrusted.push((c, e.lba));
                        }
                        e.valid_mask
                    } else {
                        e.dirty_mask
                    };
                    self.segments[slot as usize].live_blocks += 1;
                    self.dirty_mask[c as usize] = dirty_mask;
                    self.valid_mask[c as usize] = e.valid_mask;
                    self.data_crc[c as usize] = e.data_crc;
                    if dirty_mask != 0 {
                        self.dirty_blocks += 1;
                        self.segments[slot as usize].dirty_blocks += 1;
                    }
                }
                k => unreachable!("kind {k} takes no data block"),
            }
        }
        Ok(())
    }

    /// After the zero ranges were applied again: writes the distrusted blocks still indexed
    /// back to the backing device (it is synced by the caller), so their "clean" holds.
    pub fn write_back_distrusted(
        &self,
        geo: &Geometry,
        cache: &dyn BlockDevice,
        backing: &dyn BlockDevice,
    ) -> Result<()> {
        let mut buf = AlignedBuf::new(BLOCK);
        for &(c, lba) in &self.distrusted {
            if self.index.lba_of(c) != Some(lba) {
                continue; // replaced later in the log
            }
            let off = geo.block_offset(c);
            cache
                .read_at(&mut buf, off)
                .map_err(|e| Error::io(format!("reading cache block {c} (lba {lba})"), e))?;
            if !geo.block_verifies(lba, &buf, self.data_crc[c as usize]) {
                return Err(Error::Corruption(format!(
                    "cache block {c} (backing block {lba}) fails its checksum"
                )));
            }
            let valid = self.valid_mask[c as usize];
            for s in 0..8usize {
                if valid & (1 << s) != 0 {
                    let at = lba * BLOCK as u64 + (s * 512) as u64;
                    backing
                        .write_at(&buf[s * 512..(s + 1) * 512], at)
                        .map_err(|e| Error::io(format!("writing back block {lba}"), e))?;
                }
            }
        }
        Ok(())
    }

    /// Marks the distrusted blocks clean again once `write_back_distrusted` is synced, and
    /// drops the shadows of those blocks: the backing device now holds newer data than they
    /// do. (Kept, writeback wrote them over it later, and once the clean newest copy was
    /// evicted the block read the older data: found by the SIGKILL soak, issue 19.)
    pub fn distrusted_written_back(&mut self) {
        let mut written_back = HashSet::new();
        for (c, lba) in std::mem::take(&mut self.distrusted) {
            if self.index.lba_of(c) != Some(lba) {
                continue; // replaced later in the log; `write_back_distrusted` skipped it
            }
            written_back.insert(lba);
            if self.dirty_mask[c as usize] != 0 {
                let slot = self.index_geo_slot(c);
                self.dirty_mask[c as usize] = 0;
                self.dirty_blocks -= 1;
                self.segments[slot].dirty_blocks -= 1;
            }
        }
        if self.shadows.is_empty() || written_back.is_empty() {
            return;
        }
        let older: Vec<u32> = self
            .shadows
            .iter()
            .filter(|&(_, lba)| written_back.contains(lba))
            .map(|(&c, _)| c)
            .collect();
        for c in older {
            self.shadows.remove(&c);
            self.drop_block(c);
            assert_eq!(self.dirty_mask[c as usize], 0, "a dropped shadow is clean");
        }
    }

    /// Accounts for cache block `c` leaving the index.
    fn drop_block(&mut self, c: u32) {
        let slot = self.index_geo_slot(c);
        self.segments[slot].live_blocks -= 1;
        if self.dirty_mask[c as usize] != 0 {
            self.dirty_blocks -= 1;
            self.segments[slot].dirty_blocks -= 1;
            self.dirty_mask[c as usize] = 0;
        }
        self.valid_mask[c as usize] = 0;
    }

    fn index_geo_slot(&self, c: u32) -> usize {
        (c / self.blocks_per_segment) as usize
    }

    /// Drops every cached copy of blocks `lba..lba + count`, shadows included: the range is
    /// newer than them, and a shadow written back after the range reached the backing device
    /// would undo it there. With `keep_before` (a zero range applied in order later), dirty
    /// copies logged before that position (the range's flush epoch) are kept as shadows
    /// instead, and existing shadows stay: writeback owes them to the backing device first.
    fn drop_range(&mut self, lba: u64, count: u64, keep_before: Option<(u64, u32)>) {
        let gone = |r: &mut Recovered, c: u32, l: u64| {
            let pos = (r.segments[r.index_geo_slot(c)].id, c % r.blocks_per_segment);
            if r.dirty_mask[c as usize] != 0 && keep_before.is_some_and(|k| pos < k) {
                r.shadows.insert(c, l);
            } else {
                r.drop_block(c);
            }
        };
        if !self.shadows.is_empty() && keep_before.is_none() {
            let gone: Vec<u32> = self
                .shadows
                .iter()
                .filter(|&(_, &l)| l >= lba && l - lba < count)
                .map(|(&c, _)| c)
                .collect();
            for c in gone {
                self.shadows.remove(&c);
                self.drop_block(c);
            }
        }
        if count <= self.index.block_count() as u64 {
            for l in lba..lba + count {
                if let Some(c) = self.index.remove(l) {
                    gone(self, c, l);
                }
            }
        } else {
            for c in 0..self.index.block_count() {
                match self.index.lba_of(c) {
                    Some(l) if l >= lba && l - lba < count => {
                        self.index.remove_block(c);
                        gone(self, c, l);
                    }
                    _ => {}
                }
            }
        }
    }

    /// Turns the recovered log into the engine's starting state; the next chunk continues the
    /// log where it ended.
    pub fn into_state(
        self,
        geo: Geometry,
        epoch: u64,
        buffer_count: u32,
        promote_pause: Duration,
        consistent: bool,
        recovered_floor: Option<std::time::SystemTime>,
    ) -> State {
        let mut epochs = Epochs::new(geo.cache_block_count(), consistent);
        epochs.set_recovered_floor(recovered_floor);
        for &(c, segment_id, block, seq) in &self.epoch_starts {
            epochs.mark_start(c, segment_id, block, seq, None);
        }
        let ring = Ring::recovered(
            &geo,
            self.segments,
            self.head_segment_id,
            self.end_segment_id,
            self.end_block,
            self.last_seq + 1,
            buffer_count,
        );
        State {
            geo,
            blocks: Blocks::new(
                self.index,
                self.dirty_mask,
                self.valid_mask,
                self.data_crc,
                self.dirty_blocks,
                self.shadows,
            ),
            ring,
            seqs: Seqs::new(self.last_seq, epoch),
            health: Health::default(),
            room: Room::default(),
            writeback: {
                let mut w = WritebackState::new(self.writeback_seq.min(self.last_seq));
                if self.consistent {
                    for z in &self.zero_ranges {
                        w.zero_pending(z.seq, z.segment_id, z.block);
                    }
                }
                w
            },
            epochs,
            zeros: self.zeros,
            promotion: Promotion::new(promote_pause),
            bypass: Bypass::default(),
            streams: Default::default(),
            changes: Default::default(),
            reservations: Default::default(),
            counters: Counters::default(),
        }
    }
}

/// Whether replay can apply `e` of chunk `h`: data and ranges within the exported disk. The
/// error says why not.
pub(crate) fn check_replayable(geo: &Geometry, h: &ChunkHeader, e: &Entry) -> Result<()> {
    match e.kind {
        KIND_DATA if e.lba >= geo.exported_block_count => Err(Error::Corruption(format!(
            "chunk {} maps backing block {} past the end of the disk",
            h.seq, e.lba
        ))),
        KIND_ZERO | KIND_DROP
            if e.lba.saturating_add(e.range_blocks() as u64) > geo.exported_block_count =>
        {
            Err(Error::Corruption(format!(
                "chunk {} holds a range of {} blocks from backing block {} past the end of the disk",
                h.seq,
                e.range_blocks(),
                e.lba
            )))
        }
        _ => Ok(()),
    }
}
