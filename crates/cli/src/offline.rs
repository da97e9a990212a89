//! Renders the engine's offline inspection (`logcache_engine::inspect::{check, dump}`) for
//! humans: `check` prints a summary and then its findings, `dump` a table of the log's chunks.
//! The engine decides what is wrong and says it in words; this file only lays it out.

use std::sync::Arc;

use logcache_engine::format::chunk::{Entry, KIND_DATA, KIND_ZERO};
use logcache_engine::inspect::{
    self, BackingReport, CheckReport, CopyState, DumpReport, Layout, LogReport, SegmentDump,
    Severity,
};
use logcache_engine::io::BlockDevice;

/// Verifies `cache` (and that `backing` is its backing device, if given) and prints what was
/// found. Returns whether no error-severity finding turned up.
pub fn check(
    cache: Arc<dyn BlockDevice>,
    backing: Option<Arc<dyn BlockDevice>>,
) -> anyhow::Result<bool> {
    let report = inspect::check(&*cache, backing.as_deref())?;
    print!("{}", render_check(&report));
    Ok(report.is_ok())
}

/// Prints the log's segments, chunks and entries (only segment `segment`, a segment id, if
/// given).
pub fn dump(cache: Arc<dyn BlockDevice>, segment: Option<u64>) -> anyhow::Result<()> {
    let report = inspect::dump(&*cache, segment)?;
    print!("{}", render_dump(&report));
    Ok(())
}

/// Labels of the summary lines, padded to one width so the values line up.
const LABEL_WIDTH: usize = 12;

/// One summary line; an empty label continues the previous one.
fn line(out: &mut String, label: &str, value: &str) {
    let label = if label.is_empty() {
        String::new()
    } else {
        format!("{label}:")
    };
    out.push_str(&format!("  {label:<LABEL_WIDTH$}{value}\n"));
}

fn render_check(r: &CheckReport) -> String {
    let mut out = format!(
        "cache {} ({} device)\n",
        r.cache,
        human_bytes(r.device_size_bytes)
    );
    render_identity(&mut out, &r.layout);
    let copies: Vec<String> = r
        .copies
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let state = match &c.state {
                CopyState::Valid { generation, .. } => format!("generation {generation}"),
                CopyState::Absent => "no superblock".to_string(),
                CopyState::Corrupt(why) => format!("damaged ({why})"),
            };
            let current = if i == r.current_copy { " (in use)" } else { "" };
            format!("copy {} {state}{current}", c.name)
        })
        .collect();
    line(&mut out, "superblock", &copies.join("; "));
    render_geometry(&mut out, &r.layout);
    let cp = &r.checkpoint;
    let mut state = if r.clean {
        format!("closed cleanly, last chunk {}", cp.end_seq)
    } else {
        "NOT closed cleanly".to_string()
    };
    if cp.writeback_seq > 0 {
        state.push_str(&format!(
            "; written back through chunk {}",
            cp.writeback_seq
        ));
    }
    line(
        &mut out,
        "checkpoint",
        &format!(
            "{state}; epoch {}, head segment {} (chunk {}), cut at chunk {}",
            cp.epoch, cp.head_segment_id, cp.head_seq, cp.cut_seq
        ),
    );
    for (i, t) in r.tunables.iter().enumerate() {
        let origin = if t.persisted { "stored" } else { "default" };
        let label = if i == 0 { "tunables" } else { "" };
        line(
            &mut out,
            label,
            &format!("{} = {} ({origin})", t.name, t.value),
        );
    }
    match &r.log {
        Some(log) => render_log(&mut out, log),
        None => line(&mut out, "log", "not read (see the findings)"),
    }
    if let Some(b) = &r.backing {
        render_backing(&mut out, b);
    }

    out.push_str("\nfindings:\n");
    for f in &r.findings {
        let tag = match f.severity {
            Severity::Error => "ERROR",
            Severity::Warning => "warning",
            Severity::Info => "info",
        };
        out.push_str(&format!("  {tag:<8} {}\n", f.message));
    }
    let (errors, warnings) = (r.count(Severity::Error), r.count(Severity::Warning));
    let verdict = if errors > 0 {
        "the cache has problems (see the errors above)"
    } else if warnings > 0 {
        "no errors"
    } else {
        "the cache is healthy"
    };
    out.push_str(&format!(
        "\nresult: {}, {}: {verdict}\n",
        plural(errors as u64, "error"),
        plural(warnings as u64, "warning")
    ));
    out
}

fn render_identity(out: &mut String, l: &Layout) {
    line(
        out,
        "format",
        &format!(
            "id {:#018x}, backing uuid {}, formatted at unix time {} s",
            l.format_id, l.backing_uuid, l.format_time_unix_s
        ),
    );
}

fn render_geometry(out: &mut String, l: &Layout) {
    line(
        out,
        "geometry",
        &format!(
            "{} segments of {} ({} blocks each) from offset {}; {} cache blocks",
            l.segment_count,
            human_bytes(l.segment_size_bytes),
            l.blocks_per_segment,
            human_bytes(l.segments_offset_bytes),
            l.cache_blocks
        ),
    );
    line(
        out,
        "disk",
        &format!(
            "presents {} of a {} backing device",
            human_bytes(l.exported_size_bytes),
            human_bytes(l.backing_size_bytes)
        ),
    );
}

fn render_log(out: &mut String, log: &LogReport) {
    let chunks = match log.seq_range {
        Some((first, last)) => format!(
            "{} in {} (chunks {first}..={last})",
            plural(log.chunks, "chunk"),
            plural(log.segments, "segment")
        ),
        None => "empty".to_string(),
    };
    line(
        out,
        "log",
        &format!("{chunks}; ends at {}", log.end.describe()),
    );
    let verdict = if log.recoverable {
        "an open would keep"
    } else {
        "an open would REFUSE the cache; the walk keeps"
    };
    line(
        out,
        "recovery",
        &format!(
            "{verdict} {} and discard {}; {} cached, {} of them dirty",
            plural(log.chunks_kept, "chunk"),
            log.chunks_discarded,
            plural(log.blocks_live, "block"),
            log.blocks_dirty
        ),
    );
    line(
        out,
        "entries",
        &format!(
            "{} data, {} hole, {} zero-range, {} drop-range",
            log.data_entries, log.hole_entries, log.zero_entries, log.drop_entries
        ),
    );
    line(
        out,
        "data",
        &format!(
            "{} checked, {} failing their checksum ({} of metadata and {} of data read)",
            plural(log.data_blocks_checked, "block"),
            log.data_blocks_bad,
            human_bytes(log.metadata_bytes_read),
            human_bytes(log.data_bytes_read)
        ),
    );
}

fn render_backing(out: &mut String, b: &BackingReport) {
    let verdict = match &b.problem {
        None => "belongs to this cache".to_string(),
        Some(why) => format!("does NOT belong to this cache: {why}"),
    };
    line(
        out,
        "backing",
        &format!(
            "{} ({}) {verdict}",
            b.description,
            human_bytes(b.size_bytes)
        ),
    );
}

fn render_dump(r: &DumpReport) -> String {
    let l = &r.layout;
    let cp = &r.checkpoint;
    let mut out = format!(
        "cache {}: format id {:#018x}, {} segments of {} ({} blocks), head segment {} (chunk \
         {}), epoch {}, {}\n",
        r.cache,
        l.format_id,
        l.segment_count,
        human_bytes(l.segment_size_bytes),
        l.blocks_per_segment,
        cp.head_segment_id,
        cp.head_seq,
        cp.epoch,
        if r.clean {
            "closed cleanly"
        } else {
            "not closed cleanly"
        }
    );
    out.push_str(
        "masks are hex, bit i = sector i of the block; block = block within the segment\n",
    );
    if r.segments.is_empty() {
        out.push_str("\nthe log holds no chunk\n");
    }
    for s in &r.segments {
        render_segment(&mut out, s);
    }
    out.push_str(&format!("\nthe log ends at {}\n", r.end.describe()));
    out
}

fn render_segment(out: &mut String, s: &SegmentDump) {
    let seqs = match (s.first_seq(), s.last_seq()) {
        (Some(a), Some(b)) if a == b => format!(", chunk {a}"),
        (Some(a), Some(b)) => format!(", chunks {a}..={b}"),
        _ => String::new(),
    };
    out.push_str(&format!(
        "\nsegment {} (slot {}, offset {}){seqs}\n",
        s.segment_id, s.slot, s.offset_bytes
    ));
    if let Some(note) = &s.note {
        out.push_str(&format!("  {note}\n"));
    }
    for c in &s.chunks {
        let h = &c.header;
        let origin = if s.in_log { "" } else { " [not in the log]" };
        out.push_str(&format!(
            "  chunk {} at block {} (offset {}){origin}: segment {}, blocks {} metadata + {} \
             data, {}, epoch {}, synced_seq {}\n",
            h.seq,
            h.start_block,
            c.offset_bytes,
            h.segment_id,
            h.meta_block_count,
            h.data_block_count,
            plural(h.entry_count as u64, "entry"),
            h.epoch,
            h.synced_seq
        ));
        out.push_str(&format!(
            "    {:>5}  {:>5}  {:>14}  {:<4}  {:>5}  {:>5}  {:>10}\n",
            "entry", "block", "lba", "kind", "dirty", "valid", "crc32c"
        ));
        let first_data_block = h.start_block as u32 + h.meta_block_count as u32;
        let mut data_index = 0u32;
        for (i, e) in c.entries.iter().enumerate() {
            let block = if e.has_block() {
                data_index += 1;
                (first_data_block + data_index - 1).to_string()
            } else {
                "-".to_string()
            };
            out.push_str(&format!(
                "    {i:>5}  {block:>5}  {:>14}  {:<4}  {:>5}  {:>5}  {}\n",
                e.lba,
                inspect::kind_name(e.kind),
                format!("{:02x}", e.dirty_mask),
                format!("{:02x}", e.valid_mask),
                crc_column(e)
            ));
        }
    }
}

/// A data entry's CRC; for other kinds the field means something else (or nothing).
fn crc_column(e: &Entry) -> String {
    match e.kind {
        KIND_DATA => format!("{:#010x}", e.data_crc),
        KIND_ZERO => format!("{} blocks", e.data_crc),
        _ => "-".to_string(),
    }
}

/// "1 chunk", "3 chunks", "2 entries".
fn plural(n: u64, unit: &str) -> String {
    match (n, unit) {
        (1, _) => format!("{n} {unit}"),
        (_, "entry") => format!("{n} entries"),
        _ => format!("{n} {unit}s"),
    }
}

/// Bytes in the largest binary unit that divides them evenly ("1 MiB", "1536 KiB"); sizes
/// that are no whole number of KiB show in bytes. Exact, because a size that is 4 KiB short
/// of 4 MiB (the label) must not read as 4 MiB.
fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = n;
    let mut unit = None;
    while value >= 1024 && value.is_multiple_of(1024) && unit.is_none_or(|u| u + 1 < UNITS.len()) {
        value /= 1024;
        unit = Some(unit.map_or(0, |u| u + 1));
    }
    match unit {
        Some(u) => format!("{value} {}", UNITS[u]),
        None => plural(n, "byte"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_plurals_read_naturally() {
        assert_eq!(human_bytes(0), "0 bytes");
        assert_eq!(human_bytes(1), "1 byte");
        assert_eq!(human_bytes(4096), "4 KiB");
        assert_eq!(human_bytes(1 << 20), "1 MiB");
        assert_eq!(human_bytes(3 << 29), "1536 MiB");
        assert_eq!(human_bytes((4 << 20) - 4096), "4092 KiB");
        assert_eq!(human_bytes(1000), "1000 bytes");
        assert_eq!(plural(1, "chunk"), "1 chunk");
        assert_eq!(plural(2, "entry"), "2 entries");
    }

    #[test]
    fn reports_render() {
        use logcache_engine::io::memory::MemDevice;
        use logcache_engine::{format_cache, Engine, FormatOptions, OpenOptions};

        let cache: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(2 << 20));
        let backing: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(1 << 20));
        let opts = FormatOptions {
            segment_size_bytes: 32 << 10,
            ..FormatOptions::default()
        };
        format_cache(&*cache, &*backing, &opts).unwrap();
        let e = Engine::open(cache.clone(), backing.clone(), OpenOptions::default()).unwrap();
        e.write(3 * 4096, &[7u8; 4096], false).unwrap();
        e.write(9 * 4096 + 512, &[8u8; 512], false).unwrap();
        e.close().unwrap();

        let r = inspect::check(&*cache, Some(&*backing)).unwrap();
        let text = render_check(&r);
        assert!(r.is_ok(), "{text}");
        assert!(text.contains("2 blocks cached, 2 of them dirty"), "{text}");
        assert!(text.contains("belongs to this cache"), "{text}");
        assert!(text.contains("the cache is healthy"), "{text}");

        let d = inspect::dump(&*cache, None).unwrap();
        let text = render_dump(&d);
        // The partial write: block 9, sector 1 only.
        assert!(text.contains("   9  data     02     02"), "{text}");
        let one = render_dump(&inspect::dump(&*cache, Some(1)).unwrap());
        assert!(one.contains("segment 1 (slot 1"), "{one}");
    }
}
