//! Recovery's pass 1 and its verdicts: follow the chain of chunks from the checkpoint's head
//! reading only metadata (`MetaReader`, with segments' metadata read ahead), judge where the
//! log ends and whether a durable chunk is missing (`judge_end`), and which unsynced chunks
//! the tail check cuts (`tail_cut`). Shared with `inspect`.

use std::collections::VecDeque;

use super::prefetch::MetaPrefetch;
use crate::error::{Error, Result};
use crate::format::chunk::{self, ChunkError, ChunkHeader, Entry};
use crate::format::superblock::Superblock;
use crate::format::BLOCK_SIZE_BYTES;
use crate::geometry::Geometry;
use crate::io::aligned::AlignedBuf;
use crate::io::BlockDevice;

const BLOCK: usize = BLOCK_SIZE_BYTES as usize;

/// Where a chunk of the recovered chain lives.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ChunkPos {
    pub header: ChunkHeader,
    pub slot: u32,
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
