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
//!
//! The passes' pieces (`walk`, `judge_end`, `tail_cut`, `check_replayable`) are shared with
//! `inspect`, so an offline check reports exactly what an open would do.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::prefetch::MetaPrefetch;
use crate::error::{Error, Result};
use crate::format::chunk::{
    self, ChunkError, ChunkHeader, Entry, KIND_DATA, KIND_DROP, KIND_HOLE, KIND_ZERO,
};
use crate::format::superblock::Superblock;
use crate::format::BLOCK_SIZE_BYTES;
use crate::geometry::Geometry;
use crate::index::BlockIndex;
use crate::io::aligned::AlignedBuf;
use crate::io::BlockDevice;
use crate::state::buffers::NO_BUFFER;
use crate::state::bypass::Bypass;
use crate::state::promotion::Promotion;
use crate::state::{OpenChunk, SegmentInfo, State};
use crate::stats::{Counters, RecoveryReport};

const BLOCK: usize = BLOCK_SIZE_BYTES as usize;

/// Where a chunk of the recovered chain lives.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ChunkPos {
    pub header: ChunkHeader,
    pub slot: u32,
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
    /// The persisted writeback position: chunks up to it replay as clean.
    writeback_seq: u64,
    zero_applied_seq: u64,
    /// Zero ranges (first block, count) after both the writeback position and the checkpoint's
    /// `zero_applied_seq`, in log order: a crash cut their application short, so open applies
    /// them again before anything else.
    pub zero_ranges: Vec<(u64, u64)>,
    /// Blocks logged as (partly) clean after a zero range to apply again: the zeros may undo
    /// their "clean", so open writes them back (cache block, lba) before anything else.
    pub distrusted: Vec<(u32, u64)>,
    blocks_per_segment: u32,
    pub report: RecoveryReport,
}

/// Why no chunk continues the log at the place the walk expected one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reject {
    /// No chunk header there: never written since the device was new, or overwritten.
    NoChunk,
    /// A chunk header of an earlier format of this device.
    OtherFormat,
    /// A chunk header whose fields are out of range: torn or damaged.
    BadHeader(String),
    /// A well-formed header that belongs elsewhere in the log (most often an older lap of the
    /// ring that was never overwritten).
    Elsewhere {
        segment_id: u64,
        start_block: u16,
        seq: u64,
    },
    /// A chunk after the checkpoint's cut from another session: the tail of a crashed session
    /// that its successor's recovery discarded.
    StaleEpoch { epoch: u64 },
    /// A chunk of an older session than the chunk before it.
    EpochBackwards { epoch: u64, previous_epoch: u64 },
    /// The header checksum or an entry does not verify: a torn or damaged chunk.
    BadMetadata(String),
}

impl Reject {
    /// Whether the place held a damaged chunk rather than something that simply is not part of
    /// this log (the usual end of a log).
    pub fn is_damage(&self) -> bool {
        matches!(self, Reject::BadHeader(_) | Reject::BadMetadata(_))
    }
}

/// Why the walk of the log stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WalkStop {
    /// It visited every segment slot of the ring.
    RingFull,
    /// The checkpoint is clean and the walk reached the last chunk it records.
    CleanEnd,
    /// The expected place holds no chunk that continues the log.
    Rejected(Reject),
}

/// Reads chunk metadata into a reusable buffer.
pub(crate) struct MetaReader<'a> {
    cache: &'a dyn BlockDevice,
    geo: &'a Geometry,
    buf: AlignedBuf,
    pub bytes_read: u64,
    /// Segments' metadata read ahead of the walk, in parallel.
    prefetch: MetaPrefetch,
    /// `buf` holds the whole metadata area of the last header read, not just its first block.
    buf_has_area: bool,
}

impl<'a> MetaReader<'a> {
    pub fn new(cache: &'a dyn BlockDevice, geo: &'a Geometry) -> MetaReader<'a> {
        let max_meta_blocks = chunk::plan(geo.blocks_per_segment).0 as usize;
        MetaReader {
            cache,
            geo,
            buf: AlignedBuf::new(max_meta_blocks * BLOCK),
            bytes_read: 0,
            prefetch: MetaPrefetch::new(geo, max_meta_blocks * BLOCK),
            buf_has_area: false,
        }
    }

    /// Reads and fully verifies the chunk expected at (`segment_id`, `block`) with sequence
    /// `seq`. `Ok(Err(_))`: no valid chunk there (the log ends), and why.
    pub fn read(
        &mut self,
        segment_id: u64,
        block: u32,
        seq: u64,
        sb: &Superblock,
        prev_epoch: u64,
    ) -> Result<std::result::Result<(ChunkHeader, Vec<Entry>), Reject>> {
        let h = match self.read_header(self.geo.slot_of(segment_id), block)? {
            Ok(h) => h,
            Err(r) => return Ok(Err(r)),
        };
        let cp = &sb.checkpoint;
        let epoch_ok = if h.seq > cp.cut_seq {
            h.epoch == cp.epoch
        } else {
            h.epoch <= cp.epoch
        };
        if h.segment_id != segment_id || h.start_block as u32 != block || h.seq != seq {
            return Ok(Err(Reject::Elsewhere {
                segment_id: h.segment_id,
                start_block: h.start_block,
                seq: h.seq,
            }));
        }
        if !epoch_ok {
            return Ok(Err(Reject::StaleEpoch { epoch: h.epoch }));
        }
        if h.epoch < prev_epoch {
            return Ok(Err(Reject::EpochBackwards {
                epoch: h.epoch,
                previous_epoch: prev_epoch,
            }));
        }
        self.read_entries(self.geo.slot_of(segment_id), block, &h)
    }

    /// Reads and decodes the header at `block` of `slot`, with no expectations about it.
    pub fn read_header(
        &mut self,
        slot: u32,
        block: u32,
    ) -> Result<std::result::Result<ChunkHeader, Reject>> {
        self.bytes_read += BLOCK as u64;
        self.read_header_uncounted(slot, block)
    }

    /// `read_header` without counting the read (the recovery report never counted its probe).
    fn read_header_uncounted(
        &mut self,
        slot: u32,
        block: u32,
    ) -> Result<std::result::Result<ChunkHeader, Reject>> {
        let off = self.geo.offset_of(slot, block);
        let ahead = (block == 0)
            .then(|| self.prefetch.get(self.cache, self.geo, slot))
            .flatten();
        self.buf_has_area = ahead.is_some();
        match ahead {
            Some(bytes) => self.buf.copy_from_slice(bytes),
            None => self
                .cache
                .read_at(&mut self.buf[..BLOCK], off)
                .map_err(|e| Error::io(format!("reading chunk metadata at offset {off}"), e))?,
        }
        let first = &self.buf[..BLOCK];
        Ok(
            match chunk::decode_header(first, self.geo.format_id, self.geo.blocks_per_segment) {
                Ok(h) => Ok(h),
                Err(ChunkError::NoChunk) => Err(Reject::NoChunk),
                Err(ChunkError::OtherFormat) => Err(Reject::OtherFormat),
                Err(e) => Err(Reject::BadHeader(e.to_string())),
            },
        )
    }

    /// Reads the rest of the metadata of the chunk whose header `read_header` just decoded from
    /// `block` of `slot`, verifies its checksum and decodes the entries.
    pub fn read_entries(
        &mut self,
        slot: u32,
        block: u32,
        h: &ChunkHeader,
    ) -> Result<std::result::Result<(ChunkHeader, Vec<Entry>), Reject>> {
        let off = self.geo.offset_of(slot, block);
        let meta_len = h.meta_block_count as usize * BLOCK;
        // No chunk has more metadata blocks than one that fills a whole segment (the buffer's
        // size); a header claiming more is damaged, though its checksum is not checked yet.
        if meta_len > self.buf.len() {
            return Ok(Err(Reject::BadHeader(format!(
                "chunk header claims {} metadata blocks; chunks of this segment size have at \
                 most {}",
                h.meta_block_count,
                self.buf.len() / BLOCK
            ))));
        }
        // Read ahead, the whole metadata area came with the header.
        if meta_len > BLOCK && !self.buf_has_area {
            self.cache
                .read_at(&mut self.buf[BLOCK..meta_len], off + BLOCK as u64)
                .map_err(|e| Error::io(format!("reading chunk metadata at offset {off}"), e))?;
            self.bytes_read += (meta_len - BLOCK) as u64;
        }
        match chunk::decode_entries(&self.buf[..meta_len], self.geo.format_id, h) {
            Ok(entries) => Ok(Ok((*h, entries))),
            Err(e) => Ok(Err(Reject::BadMetadata(e.to_string()))),
        }
    }
}

/// The chain of chunks pass 1 accepted, and where it stopped.
pub(crate) struct Walk {
    pub chain: VecDeque<ChunkPos>,
    /// Where the next chunk would go: block `next_block` of segment `next_segment_id`, with
    /// sequence `next_seq`.
    pub next_segment_id: u64,
    pub next_block: u32,
    pub next_seq: u64,
    /// The largest `synced_seq` any accepted chunk records.
    pub max_synced_seq: u64,
    pub stop: WalkStop,
}

/// Pass 1: follows the chain of chunks from the checkpoint's head, reading only metadata.
/// `visit` sees each accepted chunk's header and entries, in log order.
pub(crate) fn walk(
    reader: &mut MetaReader,
    sb: &Superblock,
    mut visit: impl FnMut(&ChunkHeader, Vec<Entry>),
) -> Result<Walk> {
    let geo = reader.geo;
    let cp = &sb.checkpoint;
    let clean = sb.is_clean();
    let mut chain: VecDeque<ChunkPos> = VecDeque::new();
    let (mut seg_id, mut block, mut seq) = (cp.head_segment_id, 0u32, cp.head_seq);
    let mut prev_epoch = 0;
    let mut max_synced = 0;
    let stop = loop {
        if seg_id - cp.head_segment_id >= geo.segment_count {
            break WalkStop::RingFull; // every slot visited
        }
        if clean && seq > cp.end_seq {
            break WalkStop::CleanEnd;
        }
        let (h, entries) = match reader.read(seg_id, block, seq, sb, prev_epoch)? {
            Ok(chunk) => chunk,
            Err(reject) => break WalkStop::Rejected(reject),
        };
        chain.push_back(ChunkPos {
            header: h,
            slot: geo.slot_of(seg_id),
        });
        visit(&h, entries);
        max_synced = max_synced.max(h.synced_seq);
        prev_epoch = h.epoch;
        seq += 1;
        block += h.block_count();
        if geo.blocks_per_segment - block < 2 {
            seg_id += 1;
            block = 0;
        }
    };
    Ok(Walk {
        chain,
        next_segment_id: seg_id,
        next_block: block,
        next_seq: seq,
        max_synced_seq: max_synced,
        stop,
    })
}

/// What the end of the walk means, as recovery judges it.
pub(crate) struct WalkEnd {
    /// Every chunk with a sequence at or below this is known durable; only later ones may be
    /// torn.
    pub synced_seq: u64,
    /// Why the log cannot be trusted as walked (recovery refuses to open), if it cannot.
    pub damage: Option<String>,
}

/// Judges the walk's end: with a clean checkpoint the log must end exactly at `end_seq`;
/// otherwise no later chunk of this session may prove the missing chunk durable.
pub(crate) fn judge_end(reader: &mut MetaReader, sb: &Superblock, w: &Walk) -> Result<WalkEnd> {
    let cp = &sb.checkpoint;
    if sb.is_clean() {
        let damage = (w.next_seq != cp.end_seq + 1).then(|| {
            format!(
                "the cache closed cleanly at chunk {} but its log ends at chunk {}; the cache device is damaged",
                cp.end_seq,
                w.next_seq - 1
            )
        });
        return Ok(WalkEnd {
            synced_seq: cp.end_seq,
            damage,
        });
    }
    // The open that wrote this superblock synced every chunk up to its cut.
    let damage =
        probe_for_lost_durable_chunk(reader, sb, w.next_segment_id, w.next_block, w.next_seq)?;
    Ok(WalkEnd {
        synced_seq: w.max_synced_seq.max(cp.cut_seq),
        damage,
    })
}

/// Pass 2's rule: chunks after `synced_seq` may be torn, and the first of them whose data
/// fails (`data_ok(index in chain, chunk)` is false) ends the log there. Returns the index of
/// the first chunk cut off, if any.
pub(crate) fn tail_cut(
    chain: &VecDeque<ChunkPos>,
    synced_seq: u64,
    mut data_ok: impl FnMut(usize, &ChunkPos) -> Result<bool>,
) -> Result<Option<usize>> {
    let Some(first_unsynced) = chain.iter().position(|p| p.header.seq > synced_seq) else {
        return Ok(None);
    };
    for (i, p) in chain.iter().enumerate().skip(first_unsynced) {
        if !data_ok(i, p)? {
            return Ok(Some(i));
        }
    }
    Ok(None)
}

/// Most chunk entries recovery keeps in memory between the walk and the replay (16 bytes
/// each: 256 MiB, a 64 GiB cache full of 4 KiB blocks); chunks beyond are read again.
const KEPT_ENTRIES_MAX: usize = 16 << 20;

pub fn run(cache: &dyn BlockDevice, geo: &Geometry, sb: &Superblock) -> Result<Recovered> {
    let started = Instant::now();
    let clean = sb.is_clean();
    let mut reader = MetaReader::new(cache, geo);
    let mut report = RecoveryReport {
        clean,
        ..RecoveryReport::default()
    };

    // Pass 1: walk the chain.
    let cp = &sb.checkpoint;
    // The walk's entries are kept for the replay (up to a budget), so the metadata is read once.
    let mut kept: Vec<Option<Vec<Entry>>> = Vec::new();
    let mut kept_entries = 0usize;
    let w = walk(&mut reader, sb, |_, entries| {
        if kept_entries + entries.len() <= KEPT_ENTRIES_MAX {
            kept_entries += entries.len();
            kept.push(Some(entries));
        } else {
            kept.push(None);
        }
    })?;
    let end = judge_end(&mut reader, sb, &w)?;
    if let Some(damage) = end.damage {
        return Err(Error::Corruption(damage));
    }
    let Walk {
        mut chain,
        next_segment_id: mut seg_id,
        next_block: mut block,
        next_seq: mut seq,
        ..
    } = w;

    // Pass 2: verify the data of chunks that may be torn; cut the log at the first bad one.
    let mut data_buf = AlignedBuf::new(geo.segment_size_bytes as usize);
    let cut = tail_cut(&chain, end.synced_seq, |i, p| {
        report.chunks_data_verified += 1;
        let h = p.header;
        let reread;
        let entries = match &kept[i] {
            Some(e) => e,
            None => {
                reread = reread_entries(&mut reader, sb, &h)?;
                &reread
            }
        };
        let data_len = h.data_block_count as usize * BLOCK;
        let off = geo.offset_of(p.slot, h.start_block as u32 + h.meta_block_count as u32);
        cache
            .read_at(&mut data_buf[..data_len], off)
            .map_err(|e| Error::io(format!("reading chunk {} data at offset {off}", h.seq), e))?;
        report.data_bytes_read += data_len as u64;
        Ok(data_verifies(geo, entries, &data_buf[..data_len]))
    })?;
    if let Some(i) = cut {
        report.chunks_discarded = (chain.len() - i) as u64;
        let cut = &chain[i].header;
        seg_id = cut.segment_id;
        block = cut.start_block as u32;
        seq = cut.seq;
        chain.truncate(i);
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
        writeback_seq: cp.writeback_seq,
        zero_applied_seq: cp.zero_applied_seq,
        zero_ranges: Vec::new(),
        distrusted: Vec::new(),
        blocks_per_segment: geo.blocks_per_segment,
        report: RecoveryReport::default(),
    };
    for (i, p) in chain.iter().enumerate() {
        let h = p.header;
        let entries = match kept[i].take() {
            Some(e) => e,
            None => reread_entries(&mut reader, sb, &h)?,
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

/// Reads a chunk of the walked chain again (the walk keeps headers only, not entries). The
/// chain was verified moments ago, so a chunk that no longer reads back is corruption.
fn reread_entries(reader: &mut MetaReader, sb: &Superblock, h: &ChunkHeader) -> Result<Vec<Entry>> {
    match reader.read(h.segment_id, h.start_block as u32, h.seq, sb, 0)? {
        Ok((_, entries)) => Ok(entries),
        Err(_) => Err(Error::Corruption(format!(
            "chunk {} changed during recovery",
            h.seq
        ))),
    }
}

/// The data blocks of a chunk whose checksums fail, as (data block index in the chunk, entry).
/// `data` holds the chunk's data blocks, which `decode_entries` proved match its entries.
pub(crate) fn failing_data_blocks<'a>(
    geo: &'a Geometry,
    entries: &'a [Entry],
    data: &'a [u8],
) -> impl Iterator<Item = (usize, &'a Entry)> + 'a {
    entries
        .iter()
        .filter(|e| e.has_block())
        .enumerate()
        .filter(move |(k, e)| {
            e.kind == KIND_DATA
                && !geo.block_verifies(e.lba, &data[k * BLOCK..(k + 1) * BLOCK], e.data_crc)
        })
}

fn data_verifies(geo: &Geometry, entries: &[Entry], data: &[u8]) -> bool {
    failing_data_blocks(geo, entries, data).next().is_none()
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

/// The walk ended at (`seg_id`, `block`) expecting chunk `seq`. If the next segment starts with
/// a chunk of this session that says chunk `seq` was already synced, the end is not a torn tail
/// but damage to durable data: returns what was lost, in words.
fn probe_for_lost_durable_chunk(
    reader: &mut MetaReader,
    sb: &Superblock,
    seg_id: u64,
    block: u32,
    seq: u64,
) -> Result<Option<String>> {
    // Whether the walk stopped mid-segment or at a segment's start, the log's next segment (if
    // the log went on) starts at block 0 of the following id.
    let probe = seg_id + 1;
    if probe - sb.checkpoint.head_segment_id >= reader.geo.segment_count {
        return Ok(None);
    }
    let slot = reader.geo.slot_of(probe);
    if let Ok(h) = reader.read_header_uncounted(slot, 0)? {
        if h.segment_id == probe
            && h.epoch == sb.checkpoint.epoch
            && h.seq > seq
            && h.synced_seq >= seq
        {
            return Ok(Some(format!(
                "chunk {seq} (segment {seg_id}, block {block}) does not verify, yet chunk {} of \
                 segment {probe} records it as synced: the cache device lost durable data",
                h.seq
            )));
        }
    }
    Ok(None)
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
                dirty_blocks: 0,
                synced_blocks: 0,
            };
        }
        seg.last_sealed_seq = h.seq;
        // Every replayed chunk is durable once open syncs the new epoch.
        seg.synced_blocks =
            h.start_block as u32 + h.meta_block_count as u32 + h.data_block_count as u32;
        // Chunks up to the writeback position were written back: their blocks are clean.
        let written_back = h.seq <= self.writeback_seq;
        // Ranges first: every live block entry of a chunk was written after its ranges.
        for e in entries.iter().filter(|e| e.is_range()) {
            check_replayable(geo, h, e)?;
            self.drop_range(e.lba, e.range_blocks() as u64);
            if e.kind == KIND_ZERO && !written_back && h.seq > self.zero_applied_seq {
                self.zero_ranges.push((e.lba, e.range_blocks() as u64));
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
                    let c = geo.cache_block(slot, blk);
                    blk += 1;
                    if let Some(prev) = self.index.insert(e.lba, c) {
                        self.drop_block(prev);
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

    /// Marks the distrusted blocks clean again once `write_back_distrusted` is synced.
    pub fn distrusted_written_back(&mut self) {
        for (c, lba) in std::mem::take(&mut self.distrusted) {
            if self.index.lba_of(c) == Some(lba) && self.dirty_mask[c as usize] != 0 {
                let slot = self.index_geo_slot(c);
                self.dirty_mask[c as usize] = 0;
                self.dirty_blocks -= 1;
                self.segments[slot].dirty_blocks -= 1;
            }
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

    /// Drops every cached copy of blocks `lba..lba + count`.
    fn drop_range(&mut self, lba: u64, count: u64) {
        if count <= self.index.block_count() as u64 {
            for l in lba..lba + count {
                if let Some(c) = self.index.remove(l) {
                    self.drop_block(c);
                }
            }
        } else {
            for c in 0..self.index.block_count() {
                if matches!(self.index.lba_of(c), Some(l) if l >= lba && l - lba < count) {
                    self.index.remove_block(c);
                    self.drop_block(c);
                }
            }
        }
    }

    /// Turns the recovered log into the engine's starting state; the next chunk continues the
    /// log where it ended.
    pub fn into_state(
        mut self,
        geo: Geometry,
        epoch: u64,
        buffer_count: u32,
        promote_pause: Duration,
    ) -> State {
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
            room_next_ticket: 0,
            room_serving_ticket: 0,
            dirty_blocks: self.dirty_blocks,
            unsynced_ends: Vec::new(),
            drain_requests: 0,
            writeback_seq: self.writeback_seq.min(self.last_seq),
            writeback_busy: false,
            writeback_rate_blocks_per_s: 0,
            writeback_error: None,
            open_ranges: Vec::with_capacity(chunk::entry_capacity(1) as usize),
            zero_pending_seq: None,
            promotion: Promotion::new(promote_pause),
            bypass: Bypass::default(),
            streams: Default::default(),
            counters: Counters::default(),
        }
    }
}
