//! Offline inspection of a cache device, behind `logcache check` and `logcache dump`: what the
//! superblock copies say, what recovery would make of the log, and whether every data block
//! still matches its checksum.
//!
//! Read-only: unlike `Engine::open`, nothing here writes to the cache device (open bumps the
//! epoch in the superblock before it serves), so a cache can be examined after a crash without
//! changing what its next open will see. Only `read_at` is ever called.
//!
//! The walk and its verdicts are recovery's own code (`recover::walk`, `judge_end`, `tail_cut`,
//! `check_replayable`), and the backing check is `Engine::open`'s, so what `check` reports is
//! what an open would do. The one difference is deliberate: `check` verifies the data of every
//! chunk in the log, where recovery reads only the possibly torn tail.

use std::collections::HashMap;

use crate::error::{Error, Result};
use crate::format::chunk::{ChunkHeader, Entry, KIND_DATA, KIND_DROP, KIND_HOLE, KIND_ZERO};
use crate::format::superblock::{
    self, Checkpoint, Superblock, SUPERBLOCK_OFFSETS, SUPERBLOCK_SIZE_BYTES,
};
use crate::format::{uuid_to_string, BLOCK_SIZE_BYTES};
use crate::geometry::Geometry;
use crate::io::aligned::AlignedBuf;
use crate::io::BlockDevice;
use crate::open::recover::{self, MetaReader, Walk};
pub use crate::open::recover::{Reject, WalkStop};
use crate::tunables::{Tunables, SPECS};

const BLOCK: usize = BLOCK_SIZE_BYTES as usize;

// Both copies are read with one IO.
const _: () =
    assert!(SUPERBLOCK_OFFSETS[0] == 0 && SUPERBLOCK_OFFSETS[1] == SUPERBLOCK_SIZE_BYTES as u64);

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
    fn new(sb: &Superblock, geo: &Geometry) -> Layout {
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
    fn from_walk(geo: &Geometry, w: &Walk) -> LogEnd {
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
    /// Blocks recovery would index, and how many of them are dirty (not on the backing device).
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

/// Verifies a cache offline: both superblock copies, the checkpoint, the log as recovery would
/// walk it, every data block's checksum, and (if given) the backing device's label. Problems
/// are findings in the report; only IO errors and a device with no usable superblock are
/// errors (`NotFormatted`, or `Corruption` when both copies are damaged).
pub fn check(cache: &dyn BlockDevice, backing: Option<&dyn BlockDevice>) -> Result<CheckReport> {
    let mut findings = Vec::new();
    let (copies, sb, current_copy) = read_copies(cache)?;
    judge_copies(&copies, current_copy, &mut findings);
    let geo = Geometry::from_superblock(&sb);
    let clean = sb.is_clean();
    let cp = sb.checkpoint;
    if clean && cp.end_seq < cp.head_seq {
        findings.push(info(
            "the cache closed cleanly with an empty log (or was never opened since format)"
                .to_string(),
        ));
    } else if clean {
        findings.push(info(format!(
            "the last session closed cleanly; its last chunk was {}",
            cp.end_seq
        )));
    } else {
        findings.push(warning(
            "the cache was not closed cleanly: it is open elsewhere right now (then this check \
             sees a log in motion), or its last session crashed; the next open runs crash \
             recovery"
                .to_string(),
        ));
    }
    let tunables = tunables_report(&sb, &mut findings);
    let device_size_bytes = cache.size_bytes();
    let log = if device_size_bytes < sb.cache_size_bytes {
        findings.push(error(format!(
            "{} is {device_size_bytes} bytes but was formatted with {} bytes (truncated?); the \
             cache will not open, and its log was not read",
            cache.describe(),
            sb.cache_size_bytes
        )));
        None
    } else {
        Some(check_log(cache, &geo, &sb, &mut findings)?)
    };
    let backing = match backing {
        Some(b) => Some(check_backing(&sb, b, &mut findings)?),
        None => None,
    };
    // Stable: within a severity, the order found.
    findings.sort_by_key(|f| std::cmp::Reverse(f.severity));
    Ok(CheckReport {
        cache: cache.describe(),
        device_size_bytes,
        generation: sb.generation,
        layout: Layout::new(&sb, &geo),
        checkpoint: cp,
        clean,
        copies,
        current_copy,
        tunables,
        log,
        backing,
        findings,
    })
}

fn info(message: String) -> Finding {
    Finding {
        severity: Severity::Info,
        message,
    }
}

fn warning(message: String) -> Finding {
    Finding {
        severity: Severity::Warning,
        message,
    }
}

fn error(message: String) -> Finding {
    Finding {
        severity: Severity::Error,
        message,
    }
}

/// Reads and decodes both copies; picks the current one by the engine's own rule.
fn read_copies(cache: &dyn BlockDevice) -> Result<([SuperblockCopy; 2], Superblock, usize)> {
    let not_formatted = || {
        Error::NotFormatted(format!(
            "{} holds no logcache superblock; format it first",
            cache.describe()
        ))
    };
    if cache.size_bytes() < SUPERBLOCK_OFFSETS[1] + SUPERBLOCK_SIZE_BYTES as u64 {
        return Err(not_formatted());
    }
    let mut raw = AlignedBuf::new(2 * SUPERBLOCK_SIZE_BYTES);
    cache
        .read_at(&mut raw, 0)
        .map_err(|e| Error::io(format!("reading the superblock of {}", cache.describe()), e))?;
    let (a, b) = raw.split_at(SUPERBLOCK_SIZE_BYTES);
    let copy = |name: &'static str, offset_bytes: u64, bytes: &[u8]| SuperblockCopy {
        name,
        offset_bytes,
        state: match Superblock::decode(bytes) {
            Ok(Some(sb)) => CopyState::Valid {
                generation: sb.generation,
                format_id: sb.format_id,
            },
            Ok(None) => CopyState::Absent,
            Err(Error::Corruption(why)) => CopyState::Corrupt(why),
            Err(e) => CopyState::Corrupt(e.to_string()),
        },
    };
    let copies = [
        copy("A", SUPERBLOCK_OFFSETS[0], a),
        copy("B", SUPERBLOCK_OFFSETS[1], b),
    ];
    let sb = match superblock::choose([a, b]) {
        Ok(Some(sb)) => sb,
        Ok(None) => return Err(not_formatted()),
        Err(_) => {
            let why = |c: &SuperblockCopy| match &c.state {
                CopyState::Corrupt(why) => why.clone(),
                _ => "no superblock".to_string(),
            };
            return Err(Error::Corruption(format!(
                "neither superblock copy of {} is usable (A: {}; B: {}); the cache cannot be \
                 opened",
                cache.describe(),
                why(&copies[0]),
                why(&copies[1])
            )));
        }
    };
    let current = copies
        .iter()
        .position(|c| {
            c.state
                == CopyState::Valid {
                    generation: sb.generation,
                    format_id: sb.format_id,
                }
        })
        .expect("the chosen superblock is one of the copies");
    Ok((copies, sb, current))
}

fn judge_copies(copies: &[SuperblockCopy; 2], current: usize, findings: &mut Vec<Finding>) {
    let other = &copies[1 - current];
    let cur = &copies[current];
    match &other.state {
        CopyState::Absent => findings.push(warning(format!(
            "superblock copy {} holds no superblock (format writes both); copy {} is in use, and \
             the next superblock write rewrites {}",
            other.name, cur.name, other.name
        ))),
        CopyState::Corrupt(why) => findings.push(warning(format!(
            "superblock copy {} is damaged ({why}); copy {} is in use. A superblock write torn \
             by a crash leaves this, and the next superblock write rewrites {}",
            other.name, cur.name, other.name
        ))),
        CopyState::Valid { .. } => {}
    }
    for (i, c) in copies.iter().enumerate() {
        if let CopyState::Valid { generation, .. } = c.state {
            if Superblock::copy_offset(generation) != SUPERBLOCK_OFFSETS[i] {
                findings.push(warning(format!(
                    "superblock copy {} holds generation {generation}, which belongs in the \
                     other copy",
                    c.name
                )));
            }
        }
    }
    if let (CopyState::Valid { generation: ga, .. }, CopyState::Valid { generation: gb, .. }) =
        (&copies[0].state, &copies[1].state)
    {
        if ga.abs_diff(*gb) != 1 {
            findings.push(warning(format!(
                "the superblock copies' generations ({ga} and {gb}) are not consecutive: a \
                 superblock write was lost or interrupted"
            )));
        }
    }
}

fn tunables_report(sb: &Superblock, findings: &mut Vec<Finding>) -> Vec<TunableReport> {
    let effective = Tunables::from_persisted(&sb.tunables);
    effective
        .list()
        .into_iter()
        .zip(SPECS)
        .enumerate()
        .map(|(i, (v, spec))| {
            let stored = sb.tunables.get(spec.slot);
            if let Some(raw) = stored.filter(|&raw| raw != effective.get(i)) {
                findings.push(warning(format!(
                    "the superblock stores {raw} for tunable {}, which is out of range; an open \
                     uses {} instead",
                    v.name, v.value
                )));
            }
            TunableReport {
                name: v.name,
                value: v.value,
                default: v.default,
                persisted: stored.is_some(),
            }
        })
        .collect()
}

fn check_log(
    cache: &dyn BlockDevice,
    geo: &Geometry,
    sb: &Superblock,
    findings: &mut Vec<Finding>,
) -> Result<LogReport> {
    let mut reader = MetaReader::new(cache, geo);
    let mut entries: Vec<Vec<Entry>> = Vec::new();
    let w = recover::walk(&mut reader, sb, |_, e| entries.push(e))?;
    assert_eq!(entries.len(), w.chain.len(), "one visit per accepted chunk");
    let end = recover::judge_end(&mut reader, sb, &w)?;

    // Every chunk's data, not only the tail recovery reads: offline there is time to look.
    let mut data_buf = AlignedBuf::new(geo.segment_size_bytes as usize);
    let mut data_ok = Vec::with_capacity(w.chain.len());
    let mut bad_chunks = Vec::new();
    let (mut data_blocks_checked, mut data_blocks_bad, mut data_bytes_read) = (0u64, 0u64, 0u64);
    // Replay's rule: chunks up to the persisted writeback position were written back, so their
    // blocks are clean whatever their entries say.
    let dirty =
        |h: &ChunkHeader, e: &Entry| e.dirty_mask != 0 && h.seq > sb.checkpoint.writeback_seq;
    for (p, es) in w.chain.iter().zip(&entries) {
        let h = &p.header;
        let data_start = h.start_block as u32 + h.meta_block_count as u32;
        let data_len = h.data_block_count as usize * BLOCK;
        if data_len > 0 {
            let off = geo.offset_of(p.slot, data_start);
            cache.read_at(&mut data_buf[..data_len], off).map_err(|e| {
                Error::io(format!("reading chunk {} data at offset {off}", h.seq), e)
            })?;
            data_bytes_read += data_len as u64;
        }
        data_blocks_checked += es.iter().filter(|e| e.kind == KIND_DATA).count() as u64;
        let bad_blocks: Vec<BadBlock> =
            recover::failing_data_blocks(geo, es, &data_buf[..data_len])
                .map(|(k, e)| BadBlock {
                    block_in_segment: data_start + k as u32,
                    lba: e.lba,
                    dirty: dirty(h, e),
                    live: false, // known after the replay below
                })
                .collect();
        data_blocks_bad += bad_blocks.len() as u64;
        data_ok.push(bad_blocks.is_empty());
        if !bad_blocks.is_empty() {
            bad_chunks.push(BadChunk {
                seq: h.seq,
                segment_id: h.segment_id,
                slot: p.slot,
                start_block: h.start_block as u32,
                bad_blocks,
                discarded: false,
            });
        }
    }
    // Recovery's own rule decides which bad chunks are a torn tail.
    let cut = recover::tail_cut(&w.chain, end.synced_seq, |i, _| Ok(data_ok[i]))?;
    let kept = cut.unwrap_or(w.chain.len());
    let cut_seq = cut.map(|i| w.chain[i].header.seq);
    for b in &mut bad_chunks {
        b.discarded = cut_seq.is_some_and(|c| b.seq >= c);
    }

    // Replay as recovery would, into a map instead of the index: the newest data entry per
    // backing block wins; holes take a data block but change no mapping.
    let mut newest: HashMap<u64, Newest> = HashMap::new();
    let mut replay_problem = None;
    'replay: for (p, es) in w.chain.iter().zip(&entries).take(kept) {
        let mut block = p.header.start_block as u32 + p.header.meta_block_count as u32;
        // As in recovery: a chunk's ranges come before its live data in time.
        for e in es.iter().filter(|e| e.is_range()) {
            if let Err(why) = recover::check_replayable(geo, &p.header, e) {
                replay_problem = Some(why);
                break 'replay;
            }
            let (lba, count) = (e.lba, e.range_blocks() as u64);
            newest.retain(|&l, _| l < lba || l - lba >= count);
        }
        for e in es.iter().filter(|e| e.has_block()) {
            if let Err(why) = recover::check_replayable(geo, &p.header, e) {
                replay_problem = Some(why);
                break 'replay;
            }
            if e.kind == KIND_DATA {
                let at = Newest {
                    slot: p.slot,
                    block_in_segment: block,
                    dirty: dirty(&p.header, e),
                };
                newest.insert(e.lba, at);
            }
            block += e.has_block() as u32;
        }
    }
    for c in &mut bad_chunks {
        for b in &mut c.bad_blocks {
            b.live = newest
                .get(&b.lba)
                .is_some_and(|n| (n.slot, n.block_in_segment) == (c.slot, b.block_in_segment));
        }
    }
    let count_kind = |kind: u8| entries.iter().flatten().filter(|e| e.kind == kind).count() as u64;
    // The walk enters every segment at block 0, so each segment has one chunk starting there.
    let segments = w.chain.iter().filter(|p| p.header.start_block == 0).count() as u64;
    let log_end = LogEnd::from_walk(geo, &w);
    let report = LogReport {
        head_segment_id: sb.checkpoint.head_segment_id,
        head_seq: sb.checkpoint.head_seq,
        chunks: w.chain.len() as u64,
        segments,
        seq_range: w
            .chain
            .front()
            .zip(w.chain.back())
            .map(|(a, b)| (a.header.seq, b.header.seq)),
        end: log_end.clone(),
        synced_seq: end.synced_seq,
        chunks_kept: kept as u64,
        chunks_discarded: (w.chain.len() - kept) as u64,
        recoverable: end.damage.is_none() && replay_problem.is_none(),
        blocks_live: newest.len() as u64,
        blocks_dirty: newest.values().filter(|n| n.dirty).count() as u64,
        data_entries: count_kind(KIND_DATA),
        hole_entries: count_kind(KIND_HOLE),
        zero_entries: count_kind(KIND_ZERO),
        drop_entries: count_kind(KIND_DROP),
        data_blocks_checked,
        data_blocks_bad,
        bad_chunks,
        metadata_bytes_read: reader.bytes_read,
        data_bytes_read,
    };

    // Findings, in the order a reader follows the log.
    let stop_is_damage = matches!(&w.stop, WalkStop::Rejected(r) if r.is_damage());
    if w.chain.is_empty() && !stop_is_damage {
        findings.push(info("the log is empty: nothing is cached".to_string()));
    } else if stop_is_damage && !sb.is_clean() {
        findings.push(warning(format!(
            "the log ends at {}. A chunk write torn by a crash leaves this, and loses only writes \
             that had not been flushed",
            log_end.describe()
        )));
    } else {
        findings.push(info(format!("the log ends at {}", log_end.describe())));
    }
    if let Some(damage) = &end.damage {
        findings.push(error(format!(
            "recovery would refuse to open this cache: {damage}"
        )));
    }
    if let Some(i) = cut {
        let first = &w.chain[i].header;
        let last = &w.chain[w.chain.len() - 1].header;
        findings.push(warning(format!(
            "chunk {} (segment {}, block {}) was written after the last sync and its data is \
             torn: recovery would discard chunks {}..={} ({} chunks), writes that had not been \
             flushed before the crash",
            first.seq,
            first.segment_id,
            first.start_block,
            first.seq,
            last.seq,
            w.chain.len() - i
        )));
    }
    for c in report.bad_chunks.iter().filter(|c| !c.discarded) {
        findings.push(bad_chunk_finding(c));
    }
    if let Some(why) = replay_problem {
        findings.push(error(format!(
            "recovery would refuse to open this cache: {why}"
        )));
    }
    if data_blocks_bad == 0 && data_blocks_checked > 0 {
        findings.push(info(format!(
            "all {data_blocks_checked} data blocks in the log match their checksums"
        )));
    }
    Ok(report)
}

/// Where the newest copy of a backing block lives, as replay would index it.
struct Newest {
    slot: u32,
    block_in_segment: u32,
    dirty: bool,
}

/// Damaged data in a chunk recovery keeps: an error if reads reach it, else a warning.
fn bad_chunk_finding(c: &BadChunk) -> Finding {
    let where_ = format!(
        "chunk {} (segment {}, block {})",
        c.seq, c.segment_id, c.start_block
    );
    let live: Vec<&BadBlock> = c.bad_blocks.iter().filter(|b| b.live).collect();
    if live.is_empty() {
        let all: Vec<&BadBlock> = c.bad_blocks.iter().collect();
        return warning(format!(
            "{where_}: {}, but newer copies supersede the damaged data, so reads never reach it",
            blocks_fail(&all)
        ));
    }
    let dirty = live.iter().filter(|b| b.dirty).count();
    let consequence = match dirty {
        0 => "the backing device holds the data",
        n if n == live.len() => "the data is dirty and exists nowhere else",
        _ => "some of it is dirty and exists nowhere else",
    };
    error(format!(
        "{where_}: {}; reads of it fail with a corruption error, and {consequence}",
        blocks_fail(&live)
    ))
}

/// "data block 7 (backing block 12) fails its checksum", or the plural.
fn blocks_fail(blocks: &[&BadBlock]) -> String {
    match blocks {
        [b] => format!(
            "data block {} (backing block {}) fails its checksum",
            b.block_in_segment, b.lba
        ),
        _ => {
            let lbas: Vec<String> = blocks.iter().map(|b| b.lba.to_string()).collect();
            format!(
                "{} data blocks (backing blocks {}) fail their checksums",
                blocks.len(),
                lbas.join(", ")
            )
        }
    }
}

/// `Engine::open`'s backing check, as a report and a finding.
fn check_backing(
    sb: &Superblock,
    backing: &dyn BlockDevice,
    findings: &mut Vec<Finding>,
) -> Result<BackingReport> {
    let problem = match crate::open::check_backing(sb, backing) {
        Ok(()) => None,
        Err(Error::WrongBacking(why)) => Some(why),
        Err(Error::Corruption(why)) => Some(format!("{}: {why}", backing.describe())),
        Err(e) => return Err(e),
    };
    match &problem {
        None => findings.push(info(format!(
            "{} is this cache's backing device (uuid {}, {} bytes)",
            backing.describe(),
            uuid_to_string(&sb.backing_uuid),
            sb.backing_size_bytes
        ))),
        Some(why) => findings.push(error(format!(
            "wrong backing device, the cache will not open with it: {why}"
        ))),
    }
    Ok(BackingReport {
        description: backing.describe(),
        size_bytes: backing.size_bytes(),
        matches: problem.is_none(),
        problem,
    })
}

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
