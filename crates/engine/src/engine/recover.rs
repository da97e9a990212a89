//! Recovery: rebuild the index from the log, as a pipeline of three passes.
//!
//! 1. Walk: from the checkpoint's head, follow the chain of chunks (segment id, sequence,
//!    start block, epoch and header CRC must all match what the previous chunk implies), reading
//!    only metadata. The walk ends at the first chunk that does not verify.
//! 2. Verify the tail: chunks written after the newest point the log records as synced may be
//!    torn, so their data blocks are read and checked; the first bad chunk ends the log there.
//!    Earlier chunks were synced before a later chunk was written, so their data is checked
//!    lazily, on read. A clean checkpoint means nothing needs this pass.
//! 3. Replay: re-read the metadata of the kept chunks in order; the newest entry per block wins.
//!
//! Only the walk's end can be torn. If a chunk that a later chunk proves durable fails to
//! verify, the cache device is damaged and recovery refuses to guess.

use std::collections::VecDeque;
use std::time::Instant;

use super::buffers::NO_BUFFER;
use super::geometry::Geometry;
use super::state::{OpenChunk, SegmentInfo, State};
use super::stats::{Counters, RecoveryReport};
use crate::error::{Error, Result};
use crate::format::chunk::{self, ChunkHeader, Entry, KIND_DATA, KIND_HOLE, KIND_ZERO};
use crate::format::superblock::Superblock;
use crate::format::{crc_block, BLOCK_SIZE_BYTES};
use crate::index::BlockIndex;
use crate::io::aligned::AlignedBuf;
use crate::io::BlockDevice;

const BLOCK: usize = BLOCK_SIZE_BYTES as usize;

/// Where a chunk of the recovered chain lives.
#[derive(Clone, Copy, Debug)]
struct ChunkPos {
    header: ChunkHeader,
    slot: u32,
}

pub struct Recovered {
    pub head_segment_id: u64,
    pub head_seq: u64,
    pub last_seq: u64,
    /// Where the next chunk goes: block `end_block` of segment `end_segment_id`.
    end_segment_id: u64,
    end_block: u32,
    index: BlockIndex,
    dirty_mask: Vec<u8>,
    valid_mask: Vec<u8>,
    data_crc: Vec<u32>,
    segments: Vec<SegmentInfo>,
    dirty_blocks: u64,
    pub report: RecoveryReport,
}

/// Reads chunk metadata into a reusable buffer.
struct MetaReader<'a> {
    cache: &'a dyn BlockDevice,
    geo: &'a Geometry,
    buf: AlignedBuf,
    bytes_read: u64,
}

impl MetaReader<'_> {
    /// Reads and fully verifies the chunk expected at (`segment_id`, `block`) with sequence
    /// `seq`. `Ok(None)`: no valid chunk there (the log ends).
    fn read(
        &mut self,
        segment_id: u64,
        block: u32,
        seq: u64,
        sb: &Superblock,
        prev_epoch: u64,
    ) -> Result<Option<(ChunkHeader, Vec<Entry>)>> {
        let slot = self.geo.slot_of(segment_id);
        let off = self.geo.offset_of(slot, block);
        self.cache
            .read_at(&mut self.buf[..BLOCK], off)
            .map_err(|e| Error::io(format!("reading chunk metadata at offset {off}"), e))?;
        self.bytes_read += BLOCK as u64;
        let Ok(h) = chunk::decode_header(
            &self.buf[..BLOCK],
            self.geo.format_id,
            self.geo.blocks_per_segment,
        ) else {
            return Ok(None);
        };
        let cp = &sb.checkpoint;
        let epoch_ok = if h.seq > cp.cut_seq {
            h.epoch == cp.epoch
        } else {
            h.epoch <= cp.epoch
        };
        if h.segment_id != segment_id
            || h.start_block as u32 != block
            || h.seq != seq
            || !epoch_ok
            || h.epoch < prev_epoch
        {
            return Ok(None);
        }
        let meta_len = h.meta_block_count as usize * BLOCK;
        if meta_len > BLOCK {
            self.cache
                .read_at(&mut self.buf[BLOCK..meta_len], off + BLOCK as u64)
                .map_err(|e| Error::io(format!("reading chunk metadata at offset {off}"), e))?;
            self.bytes_read += (meta_len - BLOCK) as u64;
        }
        match chunk::decode_entries(&self.buf[..meta_len], self.geo.format_id, &h) {
            Ok(entries) => Ok(Some((h, entries))),
            Err(_) => Ok(None),
        }
    }
}

pub fn run(cache: &dyn BlockDevice, geo: &Geometry, sb: &Superblock) -> Result<Recovered> {
    let started = Instant::now();
    let clean = sb.is_clean();
    let max_meta_blocks = chunk::plan(geo.blocks_per_segment).0 as usize;
    let mut reader = MetaReader {
        cache,
        geo,
        buf: AlignedBuf::new(max_meta_blocks * BLOCK),
        bytes_read: 0,
    };
    let mut report = RecoveryReport {
        clean,
        ..RecoveryReport::default()
    };

    // Pass 1: walk the chain.
    let cp = &sb.checkpoint;
    let mut chain: VecDeque<ChunkPos> = VecDeque::new();
    let (mut seg_id, mut block, mut seq) = (cp.head_segment_id, 0u32, cp.head_seq);
    let mut prev_epoch = 0;
    let mut max_synced = 0;
    loop {
        if seg_id - cp.head_segment_id >= geo.segment_count {
            break; // every slot visited
        }
        if clean && seq > cp.end_seq {
            break;
        }
        let Some((h, _)) = reader.read(seg_id, block, seq, sb, prev_epoch)? else {
            break;
        };
        chain.push_back(ChunkPos {
            header: h,
            slot: geo.slot_of(seg_id),
        });
        max_synced = max_synced.max(h.synced_seq);
        prev_epoch = h.epoch;
        seq += 1;
        block += h.block_count();
        if geo.blocks_per_segment - block < 2 {
            seg_id += 1;
            block = 0;
        }
    }
    if clean {
        if seq != cp.end_seq + 1 {
            return Err(Error::Corruption(format!(
                "the cache closed cleanly at chunk {} but its log ends at chunk {}; the cache device is damaged",
                cp.end_seq,
                seq - 1
            )));
        }
        max_synced = cp.end_seq;
    } else {
        // The open that wrote this superblock synced every chunk up to its cut.
        max_synced = max_synced.max(cp.cut_seq);
        probe_for_lost_durable_chunk(&mut reader, sb, seg_id, block, seq)?;
    }

    // Pass 2: verify the data of chunks that may be torn; cut the log at the first bad one.
    let mut data_buf = AlignedBuf::new(geo.segment_size_bytes as usize);
    if let Some(first_unsynced) = chain.iter().position(|p| p.header.seq > max_synced) {
        for i in first_unsynced..chain.len() {
            let p = chain[i];
            report.chunks_data_verified += 1;
            let h = p.header;
            let Some((_, entries)) =
                reader.read(h.segment_id, h.start_block as u32, h.seq, sb, 0)?
            else {
                return Err(Error::Corruption(format!(
                    "chunk {} changed during recovery",
                    h.seq
                )));
            };
            let data_len = h.data_block_count as usize * BLOCK;
            let off = geo.offset_of(p.slot, h.start_block as u32 + h.meta_block_count as u32);
            cache.read_at(&mut data_buf[..data_len], off).map_err(|e| {
                Error::io(format!("reading chunk {} data at offset {off}", h.seq), e)
            })?;
            report.data_bytes_read += data_len as u64;
            if !data_verifies(geo, &entries, &data_buf[..data_len]) {
                report.chunks_discarded = (chain.len() - i) as u64;
                let cut = &chain[i].header;
                seg_id = cut.segment_id;
                block = cut.start_block as u32;
                seq = cut.seq;
                chain.truncate(i);
                break;
            }
        }
    }

    // Pass 3: replay.
    let block_count = geo.cache_block_count();
    let mut r = Recovered {
        head_segment_id: cp.head_segment_id,
        head_seq: cp.head_seq,
        last_seq: seq - 1,
        end_segment_id: seg_id,
        end_block: block,
        index: BlockIndex::new(block_count),
        dirty_mask: vec![0; block_count as usize],
        valid_mask: vec![0; block_count as usize],
        data_crc: vec![0; block_count as usize],
        segments: vec![
            SegmentInfo {
                buffer: NO_BUFFER,
                ..SegmentInfo::default()
            };
            geo.segment_count as usize
        ],
        dirty_blocks: 0,
        report: RecoveryReport::default(),
    };
    for p in &chain {
        let h = p.header;
        let Some((_, entries)) = reader.read(h.segment_id, h.start_block as u32, h.seq, sb, 0)?
        else {
            return Err(Error::Corruption(format!(
                "chunk {} changed during recovery",
                h.seq
            )));
        };
        r.replay(geo, p.slot, &h, &entries)?;
        report.chunks_replayed += 1;
    }
    report.segments_replayed = r.segments.iter().filter(|s| s.id != 0).count() as u64;
    report.blocks_recovered = r.index.len() as u64;
    report.metadata_bytes_read = reader.bytes_read;
    report.duration_us = started.elapsed().as_micros() as u64;
    r.report = report;
    Ok(r)
}

fn data_verifies(geo: &Geometry, entries: &[Entry], data: &[u8]) -> bool {
    let mut k = 0usize;
    for e in entries {
        if !e.has_block() {
            continue;
        }
        if e.kind == KIND_DATA
            && crc_block(geo.format_id, e.lba, &data[k * BLOCK..(k + 1) * BLOCK]) != e.data_crc
        {
            return false;
        }
        k += 1;
    }
    true
}

/// The walk ended at (`seg_id`, `block`) expecting chunk `seq`. If the next segment starts with
/// a chunk of this session that says chunk `seq` was already synced, the end is not a torn tail
/// but damage to durable data.
fn probe_for_lost_durable_chunk(
    reader: &mut MetaReader,
    sb: &Superblock,
    seg_id: u64,
    block: u32,
    seq: u64,
) -> Result<()> {
    // Whether the walk stopped mid-segment or at a segment's start, the log's next segment (if
    // the log went on) starts at block 0 of the following id.
    let probe = seg_id + 1;
    let _ = block;
    if probe - sb.checkpoint.head_segment_id >= reader.geo.segment_count {
        return Ok(());
    }
    let slot = reader.geo.slot_of(probe);
    let off = reader.geo.offset_of(slot, 0);
    reader
        .cache
        .read_at(&mut reader.buf[..BLOCK], off)
        .map_err(|e| Error::io(format!("reading chunk metadata at offset {off}"), e))?;
    if let Ok(h) = chunk::decode_header(
        &reader.buf[..BLOCK],
        reader.geo.format_id,
        reader.geo.blocks_per_segment,
    ) {
        if h.segment_id == probe
            && h.epoch == sb.checkpoint.epoch
            && h.seq > seq
            && h.synced_seq >= seq
        {
            return Err(Error::Corruption(format!(
                "chunk {seq} (segment {seg_id}, block {block}) does not verify, yet chunk {} of \
                 segment {probe} records it as synced: the cache device lost durable data",
                h.seq
            )));
        }
    }
    Ok(())
}

impl Recovered {
    fn replay(
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
            };
        }
        seg.last_sealed_seq = h.seq;
        let mut blk = h.start_block as u32 + h.meta_block_count as u32;
        for e in entries {
            match e.kind {
                KIND_HOLE => blk += 1,
                KIND_DATA => {
                    if e.lba >= geo.exported_block_count {
                        return Err(Error::Corruption(format!(
                            "chunk {} maps backing block {} past the end of the disk",
                            h.seq, e.lba
                        )));
                    }
                    let c = geo.cache_block(slot, blk);
                    blk += 1;
                    if let Some(prev) = self.index.insert(e.lba, c) {
                        let (ps, _) = geo.split(prev);
                        self.segments[ps as usize].live_blocks -= 1;
                        if self.dirty_mask[prev as usize] != 0 {
                            self.dirty_blocks -= 1;
                        }
                    }
                    self.segments[slot as usize].live_blocks += 1;
                    self.dirty_mask[c as usize] = e.dirty_mask;
                    self.valid_mask[c as usize] = e.valid_mask;
                    self.data_crc[c as usize] = e.data_crc;
                    if e.dirty_mask != 0 {
                        self.dirty_blocks += 1;
                    }
                }
                KIND_ZERO => {
                    return Err(Error::Corruption(format!(
                        "chunk {} holds a zero-range entry, which this build cannot replay",
                        h.seq
                    )))
                }
                k => unreachable!("decode_entries rejects kind {k}"),
            }
        }
        Ok(())
    }

    /// Turns the recovered log into the engine's starting state; the next chunk continues the
    /// log where it ended.
    pub fn into_state(mut self, geo: Geometry, epoch: u64, buffer_count: u32) -> State {
        let mut free_buffers: Vec<u32> = (0..buffer_count).rev().collect();
        let next_seq = self.last_seq + 1;
        let end_slot = geo.slot_of(self.end_segment_id);
        let mut open = OpenChunk {
            active: false,
            slot: 0,
            segment_id: 0,
            seq: next_seq,
            start_block: 0,
            meta_blocks: 0,
            data_capacity: 0,
            data_count: 0,
            first_write_at: None,
        };
        let next_segment_id;
        let mut ram_segments = VecDeque::new();
        if self.end_block > 0 {
            ram_segments.push_back(end_slot);
            // Continue in the segment the log ended in; its earlier blocks stay on disk.
            let seg = &mut self.segments[end_slot as usize];
            assert_eq!(seg.id, self.end_segment_id);
            seg.full = false;
            seg.buffer = free_buffers.pop().expect("at least two buffers");
            seg.ram_start_block = self.end_block;
            let (meta, data) = chunk::plan(geo.blocks_per_segment - self.end_block);
            open = OpenChunk {
                active: true,
                slot: end_slot,
                segment_id: self.end_segment_id,
                seq: next_seq,
                start_block: self.end_block,
                meta_blocks: meta,
                data_capacity: data,
                data_count: 0,
                first_write_at: None,
            };
            next_segment_id = self.end_segment_id + 1;
        } else {
            next_segment_id = self.end_segment_id;
        }
        State {
            geo,
            index: self.index,
            dirty_mask: self.dirty_mask,
            valid_mask: self.valid_mask,
            data_crc: self.data_crc,
            segments: self.segments,
            head_segment_id: self.head_segment_id,
            next_segment_id,
            open,
            free_buffers,
            ram_segments,
            queue: VecDeque::new(),
            next_seq,
            epoch,
            written_seq: self.last_seq,
            synced_seq: self.last_seq,
            sync_wanted_seq: self.last_seq,
            unsynced_bytes: 0,
            failed: None,
            closing: false,
            space_waiters: 0,
            dirty_blocks: self.dirty_blocks,
            counters: Counters::default(),
        }
    }
}
