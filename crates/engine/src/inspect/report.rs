//! What `check` and `dump` report: findings with their severity, the superblock copies, the
//! layout, the log's end, bad chunks and blocks, and the backing label.

use crate::format::superblock::{Checkpoint, Superblock};
use crate::format::{uuid_to_string, BLOCK_SIZE_BYTES};
use crate::geometry::Geometry;
use crate::open::recover::Walk;
use crate::open::recover::{Reject, WalkStop};

pub(super) const BLOCK: usize = BLOCK_SIZE_BYTES as usize;

/// How much a finding matters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Severity {
    /// Worth knowing; nothing is wrong.
    Info,
    /// Expected after a crash, or harmless damage the next open repairs.
    Warning,
    /// Data is damaged or unreachable, or the cache would not open as it is.
    Error,
}

/// One thing `check` noticed, in plain words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub severity: Severity,
    pub message: String,
}

/// What one superblock copy holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CopyState {
    /// No superblock magic: never written, or overwritten by something else.
    Absent,
    /// Our magic, but it fails its checksum or validation; the reason in words.
    Corrupt(String),
    Valid {
        generation: u64,
        format_id: u64,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SuperblockCopy {
    /// "A" (offset 0) or "B" (offset 4096).
    pub name: &'static str,
    pub offset_bytes: u64,
    pub state: CopyState,
}

/// The identity and geometry a superblock records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub format_id: u64,
    pub backing_uuid: String,
    pub format_time_unix_s: u64,
    /// Cache device size at format time.
    pub cache_size_bytes: u64,
    pub backing_size_bytes: u64,
    /// Size of the disk the cache presents.
    pub exported_size_bytes: u64,
    pub segment_size_bytes: u64,
    pub blocks_per_segment: u32,
    pub segment_count: u64,
    pub segments_offset_bytes: u64,
    pub cache_blocks: u64,
}

impl Layout {
    pub(super) fn new(sb: &Superblock, geo: &Geometry) -> Layout {
        Layout {
            format_id: sb.format_id,
            backing_uuid: uuid_to_string(&sb.backing_uuid),
            format_time_unix_s: sb.format_time_unix_s,
            cache_size_bytes: sb.cache_size_bytes,
            backing_size_bytes: sb.backing_size_bytes,
            exported_size_bytes: sb.exported_size_bytes,
            segment_size_bytes: geo.segment_size_bytes,
            blocks_per_segment: geo.blocks_per_segment,
            segment_count: geo.segment_count,
            segments_offset_bytes: geo.segments_offset_bytes,
            cache_blocks: geo.cache_block_count() as u64,
        }
    }
}

/// A tunable as the superblock stores it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TunableReport {
    pub name: &'static str,
    /// The value an open would use.
    pub value: String,
    pub default: String,
    /// Whether the superblock holds a value (else the built-in default applies).
    pub persisted: bool,
}

/// Where the walk of the log stopped: the place the next chunk would be, and why none is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogEnd {
    pub segment_id: u64,
    pub slot: u32,
    pub block: u32,
    /// The sequence number the next chunk would carry.
    pub seq: u64,
    pub stop: WalkStop,
}

impl LogEnd {
    pub(super) fn from_walk(geo: &Geometry, w: &Walk) -> LogEnd {
        LogEnd {
            segment_id: w.next_segment_id,
            slot: geo.slot_of(w.next_segment_id),
            block: w.next_block,
            seq: w.next_seq,
            stop: w.stop.clone(),
        }
    }

    /// Where and why the log ends, in words.
    pub fn describe(&self) -> String {
        let at = format!(
            "segment {} (slot {}) block {}",
            self.segment_id, self.slot, self.block
        );
        match &self.stop {
            WalkStop::RingFull => "the log fills every segment slot of the ring".to_string(),
            WalkStop::CleanEnd => {
                format!("{at}, where the clean shutdown recorded that the log ends")
            }
            WalkStop::Rejected(r) => format!(
                "{at}, where chunk {} would be: {}",
                self.seq,
                describe_reject(r, self.seq)
            ),
        }
    }
}

fn describe_reject(r: &Reject, expected_seq: u64) -> String {
    match r {
        Reject::NoChunk => {
            "there is no chunk there (the log never reached it, or it was overwritten)".into()
        }
        Reject::OtherFormat => "a chunk left from an earlier format of this device".into(),
        Reject::BadHeader(why) => format!("a damaged chunk header ({why})"),
        Reject::Elsewhere {
            segment_id,
            start_block,
            seq,
        } if *seq < expected_seq => format!(
            "chunk {seq} of segment {segment_id} (block {start_block}), left from an earlier lap \
             of the ring"
        ),
        Reject::Elsewhere {
            segment_id,
            start_block,
            seq,
        } => format!(
            "chunk {seq} of segment {segment_id} (block {start_block}), which does not belong \
             there"
        ),
        Reject::StaleEpoch { epoch } => format!(
            "a chunk session {epoch} wrote after the point the next session recovered to (a tail \
             an earlier recovery discarded)"
        ),
        Reject::EpochBackwards {
            epoch,
            previous_epoch,
        } => format!(
            "a chunk of session {epoch}, older than session {previous_epoch} that wrote the \
             chunk before it"
        ),
        Reject::BadMetadata(why) => format!("a torn or damaged chunk ({why})"),
    }
}

/// A data block whose checksum fails.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadBlock {
    pub block_in_segment: u32,
    /// The backing-device block (4 KiB units) it caches.
    pub lba: u64,
    /// Its entry says some sectors are not on the backing device: they exist nowhere else.
    pub dirty: bool,
    /// It is the newest copy of `lba` recovery would index, so reads reach it (and fail).
    /// `false`: a later chunk supersedes it, or recovery discards its chunk.
    pub live: bool,
}

/// A chunk of the log with data blocks that fail their checksums.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadChunk {
    pub seq: u64,
    pub segment_id: u64,
    pub slot: u32,
    pub start_block: u32,
    pub bad_blocks: Vec<BadBlock>,
    /// Recovery would cut the log at or before this chunk (a torn tail), so its data is lost
    /// rather than unreadable.
    pub discarded: bool,
}

/// What recovery would make of the log, and what verifying every data block found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogReport {
    pub head_segment_id: u64,
    pub head_seq: u64,
    /// Chunks the walk accepted (recovery's pass 1), and the segments they fill.
    pub chunks: u64,
    pub segments: u64,
    /// First and last sequence number of those chunks; `None` for an empty log.
    pub seq_range: Option<(u64, u64)>,
    pub end: LogEnd,
    /// Every chunk at or below this sequence is known durable; later ones may be torn.
    pub synced_seq: u64,
    /// Chunks recovery would replay, and the torn tail it would discard after them.
    pub chunks_kept: u64,
    pub chunks_discarded: u64,
    /// Whether recovery would open the cache (it refuses when durable data is provably lost or
    /// an entry cannot be replayed).
    pub recoverable: bool,
    /// Blocks recovery would index, and how many blocks are dirty (not on the backing device):
    /// indexed ones plus copies of older flush epochs kept for writeback (shadows).
    pub blocks_live: u64,
    pub blocks_dirty: u64,
    /// Entries of each kind in the walked chunks.
    pub data_entries: u64,
    pub hole_entries: u64,
    pub zero_entries: u64,
    /// Drop ranges (writes that went around the cache).
    pub drop_entries: u64,
    /// Data blocks whose checksums were verified, and how many failed.
    pub data_blocks_checked: u64,
    pub data_blocks_bad: u64,
    pub bad_chunks: Vec<BadChunk>,
    pub metadata_bytes_read: u64,
    pub data_bytes_read: u64,
}

/// Whether a backing device is the one this cache was formatted for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackingReport {
    pub description: String,
    pub size_bytes: u64,
    pub matches: bool,
    /// Why it does not match, in words.
    pub problem: Option<String>,
}

/// Everything `check` found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckReport {
    /// The cache device's own description (its path).
    pub cache: String,
    pub device_size_bytes: u64,
    pub copies: [SuperblockCopy; 2],
    /// Index in `copies` of the copy in use: the valid one with the highest generation.
    pub current_copy: usize,
    pub generation: u64,
    pub layout: Layout,
    pub checkpoint: Checkpoint,
    /// The last session closed cleanly.
    pub clean: bool,
    pub tunables: Vec<TunableReport>,
    /// `None` when the device is too short to walk the log (an error finding says so).
    pub log: Option<LogReport>,
    /// `None` when no backing device was given.
    pub backing: Option<BackingReport>,
    /// Most severe first; within a severity, in the order found.
    pub findings: Vec<Finding>,
}

impl CheckReport {
    pub fn count(&self, severity: Severity) -> usize {
        self.findings
            .iter()
            .filter(|f| f.severity == severity)
            .count()
    }

    /// No error-severity finding.
    pub fn is_ok(&self) -> bool {
        self.count(Severity::Error) == 0
    }
}
