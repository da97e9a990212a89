//! `dump`: every chunk of every segment slot (or one segment), as the log holds them.

use super::check::read_copies;
use super::report::*;
use crate::error::{Error, Result};
use crate::format::chunk::{ChunkHeader, Entry, KIND_DATA, KIND_DROP, KIND_HOLE, KIND_ZERO};
use crate::format::superblock::Checkpoint;
use crate::geometry::Geometry;
use crate::io::BlockDevice;
use crate::open::recover::Reject;
use crate::open::recover::{self, MetaReader};

/// Name of an entry kind, for display.
pub fn kind_name(kind: u8) -> &'static str {
    match kind {
        KIND_HOLE => "hole",
        KIND_DATA => "data",
        KIND_ZERO => "zero",
        KIND_DROP => "drop",
        _ => "?",
    }
}

/// One chunk as stored: where it starts, its header and its entries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkDump {
    /// Byte offset of its first metadata block on the cache device.
    pub offset_bytes: u64,
    pub header: ChunkHeader,
    pub entries: Vec<Entry>,
}

/// The chunks of one segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentDump {
    pub segment_id: u64,
    pub slot: u32,
    pub offset_bytes: u64,
    /// Whether these chunks are part of the log recovery walks. `false`: the segment is not in
    /// the log, and `chunks` is what a scan of its slot found, decoded without the log's checks.
    pub in_log: bool,
    pub chunks: Vec<ChunkDump>,
    /// For a scan outside the log: what the slot holds and why the scan stopped, in words.
    pub note: Option<String>,
}

impl SegmentDump {
    pub fn first_seq(&self) -> Option<u64> {
        self.chunks.first().map(|c| c.header.seq)
    }

    pub fn last_seq(&self) -> Option<u64> {
        self.chunks.last().map(|c| c.header.seq)
    }
}

/// Segment metadata for humans.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DumpReport {
    pub cache: String,
    pub layout: Layout,
    pub checkpoint: Checkpoint,
    pub clean: bool,
    pub segments: Vec<SegmentDump>,
    /// Where the walk of the log stopped.
    pub end: LogEnd,
}

/// Lists the chunks of the log, segment by segment, with every header field and entry, as
/// recovery's walk accepts them (metadata only: `check` verifies data). With `segment_id`, only
/// that segment (a segment id, as the log and `check` name segments; its slot is the id modulo
/// the segment count). A segment id not in the log shows what its slot holds instead.
pub fn dump(cache: &dyn BlockDevice, segment_id: Option<u64>) -> Result<DumpReport> {
    if segment_id == Some(0) {
        return Err(Error::InvalidArgument(
            "segment ids start at 1 (check prints the log's segment ids)".into(),
        ));
    }
    let (_, sb, _) = read_copies(cache)?;
    crate::open::check_cache_size(&sb, cache)?;
    let geo = Geometry::from_superblock(&sb);
    let mut reader = MetaReader::new(cache, &geo);
    let mut segments: Vec<SegmentDump> = Vec::new();
    let mut last_in_log = None;
    let w = recover::walk(&mut reader, &sb, |h, entries| {
        last_in_log = Some(h.segment_id);
        if segment_id.is_some_and(|n| n != h.segment_id) {
            return;
        }
        let slot = geo.slot_of(h.segment_id);
        if segments.last().is_none_or(|s| s.segment_id != h.segment_id) {
            segments.push(SegmentDump {
                segment_id: h.segment_id,
                slot,
                offset_bytes: geo.offset_of(slot, 0),
                in_log: true,
                chunks: Vec::new(),
                note: None,
            });
        }
        let seg = segments.last_mut().expect("pushed above");
        seg.chunks.push(ChunkDump {
            offset_bytes: geo.offset_of(slot, h.start_block as u32),
            header: *h,
            entries,
        });
    })?;
    if let Some(n) = segment_id {
        if segments.is_empty() {
            let in_log = last_in_log.map(|last| (sb.checkpoint.head_segment_id, last));
            segments.push(scan_slot(&mut reader, &geo, n, in_log)?);
        }
    }
    Ok(DumpReport {
        cache: cache.describe(),
        layout: Layout::new(&sb, &geo),
        checkpoint: sb.checkpoint,
        clean: sb.is_clean(),
        end: LogEnd::from_walk(&geo, &w),
        segments,
    })
}

/// Decodes the chunks in the slot of segment `segment_id`, which is not in the log (whose
/// segments are `log_segments`, if any): from block 0, as long as each header and its checksum
/// verify and the chunks follow each other in one segment.
fn scan_slot(
    reader: &mut MetaReader,
    geo: &Geometry,
    segment_id: u64,
    log_segments: Option<(u64, u64)>,
) -> Result<SegmentDump> {
    let slot = geo.slot_of(segment_id);
    let mut chunks: Vec<ChunkDump> = Vec::new();
    let mut block = 0u32;
    let stop = loop {
        if geo.blocks_per_segment - block < 2 {
            break "it reached the end of the slot".to_string();
        }
        let h = match reader.read_header(slot, block)? {
            Ok(h) => h,
            Err(r) => break format!("at block {block}: {}", describe_scan_reject(&r)),
        };
        if h.start_block as u32 != block {
            break format!(
                "at block {block}: the header there says it starts at block {}",
                h.start_block
            );
        }
        if let Some(first) = chunks.first() {
            if h.segment_id != first.header.segment_id {
                break format!(
                    "at block {block}: a chunk of segment {} follows chunks of segment {}",
                    h.segment_id, first.header.segment_id
                );
            }
        }
        let (h, entries) = match reader.read_entries(slot, block, &h)? {
            Ok(chunk) => chunk,
            Err(r) => break format!("at block {block}: {}", describe_scan_reject(&r)),
        };
        chunks.push(ChunkDump {
            offset_bytes: geo.offset_of(slot, block),
            header: h,
            entries,
        });
        block += h.block_count();
    };
    let log = match log_segments {
        Some((head, last)) => format!("the log holds segments {head}..={last}"),
        None => "the log is empty".to_string(),
    };
    let holds = match chunks.first() {
        Some(c) if c.header.segment_id == segment_id => format!(
            "slot {slot} still holds chunks of it, shown as decoded without the log's checks; \
             the scan stopped {stop}"
        ),
        Some(c) => format!(
            "slot {slot} holds chunks of segment {}, shown as decoded without the log's checks; \
             the scan stopped {stop}",
            c.header.segment_id
        ),
        None => format!("slot {slot} holds no chunk: {stop}"),
    };
    Ok(SegmentDump {
        segment_id,
        slot,
        offset_bytes: geo.offset_of(slot, 0),
        in_log: false,
        note: Some(format!(
            "segment {segment_id} is not in the log ({log}); {holds}"
        )),
        chunks,
    })
}

fn describe_scan_reject(r: &Reject) -> String {
    match r {
        Reject::NoChunk => "no chunk header".into(),
        Reject::OtherFormat => "a chunk of an earlier format".into(),
        Reject::BadHeader(why) | Reject::BadMetadata(why) => format!("a damaged chunk ({why})"),
        // The scan makes no chain checks, so these never stop it.
        Reject::Elsewhere { .. } | Reject::StaleEpoch { .. } | Reject::EpochBackwards { .. } => {
            format!("{r:?}")
        }
    }
}
