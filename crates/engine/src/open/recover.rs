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
use std::time::Instant;

pub(crate) use super::replay::{check_replayable, Recovered, ZeroRange};
pub(crate) use super::walk::{judge_end, tail_cut, walk, MetaReader, Walk};
pub use super::walk::{Reject, WalkStop};
use crate::error::{Error, Result};
use crate::format::chunk::{ChunkHeader, Entry, KIND_DATA};
use crate::format::superblock::Superblock;
use crate::format::BLOCK_SIZE_BYTES;
use crate::geometry::Geometry;
use crate::index::BlockIndex;
use crate::io::aligned::AlignedBuf;
use crate::io::BlockDevice;
use crate::state::buffers::NO_BUFFER;
use crate::state::SegmentInfo;
use crate::stats::RecoveryReport;

const BLOCK: usize = BLOCK_SIZE_BYTES as usize;

/// Most chunk entries recovery keeps in memory between the walk and the replay (16 bytes
/// each: 256 MiB, a 64 GiB cache full of 4 KiB blocks); chunks beyond are read again.
const KEPT_ENTRIES_MAX: usize = 16 << 20;

/// `on_chunk` sees every chunk replayed (the log as recovered), in log order: checkpoints
/// take their changes from it. `consistent`: `writeback_order = consistent` (see
/// `Recovered::consistent`).
pub fn run(
    cache: &dyn BlockDevice,
    geo: &Geometry,
    sb: &Superblock,
    consistent: bool,
    on_chunk: &mut dyn FnMut(&ChunkHeader, &[Entry]),
) -> Result<Recovered> {
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
        consistent,
        distrusted: Vec::new(),
        zeros: Default::default(),
        epoch_starts: Vec::new(),
        shadows: Default::default(),
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
        on_chunk(&h, &entries);
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
