//! `check`: the superblock copies, the tunables, the log as recovery would walk it with every
//! chunk's data verified, and the backing label; findings in words.

use std::collections::HashMap;

use super::report::*;
use crate::error::{Error, Result};
use crate::format::chunk::{ChunkHeader, Entry, KIND_DATA, KIND_DROP, KIND_HOLE, KIND_ZERO};
use crate::format::superblock::{self, Superblock, SUPERBLOCK_OFFSETS, SUPERBLOCK_SIZE_BYTES};
use crate::format::uuid_to_string;
use crate::geometry::Geometry;
use crate::io::aligned::AlignedBuf;
use crate::io::BlockDevice;
use crate::open::recover::WalkStop;
use crate::open::recover::{self, MetaReader};
use crate::tunables::{Tunables, SPECS};

// Both copies are read with one IO.
const _: () =
    assert!(SUPERBLOCK_OFFSETS[0] == 0 && SUPERBLOCK_OFFSETS[1] == SUPERBLOCK_SIZE_BYTES as u64);

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
pub(super) fn read_copies(
    cache: &dyn BlockDevice,
) -> Result<([SuperblockCopy; 2], Superblock, usize)> {
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
                    v.spec.name, v.value
                )));
            }
            TunableReport {
                name: v.spec.name,
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
    // Dirty copies a write of a later flush epoch replaced (recovery keeps them for writeback,
    // as `Recovered::replay` does), by backing block.
    let mut shadows: Vec<u64> = Vec::new();
    let mut epoch_start = (0u64, 0u32);
    let mut replay_problem = None;
    'replay: for (p, es) in w.chain.iter().zip(&entries).take(kept) {
        let mut block = p.header.start_block as u32 + p.header.meta_block_count as u32;
        if p.header.flush_before() {
            epoch_start = (p.header.segment_id, p.header.start_block as u32);
        }
        // As in recovery: a chunk's ranges come before its live data in time.
        for e in es.iter().filter(|e| e.is_range()) {
            if let Err(why) = recover::check_replayable(geo, &p.header, e) {
                replay_problem = Some(why);
                break 'replay;
            }
            let (lba, count) = (e.lba, e.range_blocks() as u64);
            newest.retain(|&l, _| l < lba || l - lba >= count);
            shadows.retain(|&l| l < lba || l - lba >= count);
        }
        for e in es.iter().filter(|e| e.has_block()) {
            if let Err(why) = recover::check_replayable(geo, &p.header, e) {
                replay_problem = Some(why);
                break 'replay;
            }
            if e.kind == KIND_DATA {
                let at = Newest {
                    segment_id: p.header.segment_id,
                    slot: p.slot,
                    block_in_segment: block,
                    dirty: dirty(&p.header, e),
                };
                if let Some(old) = newest.insert(e.lba, at) {
                    if old.dirty && (old.segment_id, old.block_in_segment) < epoch_start {
                        shadows.push(e.lba);
                    }
                }
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
        blocks_dirty: newest.values().filter(|n| n.dirty).count() as u64 + shadows.len() as u64,
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
    segment_id: u64,
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
        Ok(record) => {
            findings.push(info(match record {
                Some(r) if r.consistent_as_of_unix_ms != 0 => format!(
                    "the backing label's writeback record: alone, the backing device holds the disk as of unix time {} s ({} bytes behind when recorded at {} s; `logcache detach --force` reports this if the cache is lost)",
                    r.consistent_as_of_unix_ms / 1000,
                    r.lag_bytes,
                    r.recorded_unix_ms / 1000
                ),
                Some(_) => "the backing label's writeback record: the backing device alone is not known to be a consistent disk (sorted writeback, or no flush point written back yet)".to_string(),
                None => "the backing label has no writeback record yet (written once writeback persists its position)".to_string(),
            }));
            None
        }
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
