//! `logcache detach --force --backing SPEC [--cache PATH]`: the cache device is gone or
//! unreadable; mark the backing device detached (its cache's data not yet written back is given
//! up) and say what the disk on it now is, from the writeback record the engine keeps in the
//! backing label (docs/FORMAT.md, "Writeback record"). Afterwards the backing device is used
//! alone, or given a new cache with `format` (which accepts it without `--force`).

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use clap::Args;
use logcache_engine::format::label::{
    label_offset, write_detached, Label, WritebackRecord, RECORD_SORTED,
};
use logcache_engine::inspect::read_superblock;

use crate::devices::{lock_backing, open_backing, open_cache};
use crate::owner::refuse_live_owner;
use crate::served::utc_text;
use crate::size::human;

#[derive(Args)]
pub struct DetachArgs {
    /// The backing device whose cache device is lost: a file or block device path, an NBD URI,
    /// or rbd:POOL/IMAGE[?conf=PATH&id=USER].
    #[arg(long)]
    pub backing: String,
    /// Give up the cache's data not yet written back (required: detach is for a lost cache).
    #[arg(long)]
    pub force: bool,
    /// The lost cache device, if its path is known: detach then refuses one that still reads
    /// whole (serve it and drain it instead).
    #[arg(long)]
    pub cache: Option<PathBuf>,
}

pub fn run(args: &DetachArgs) -> Result<()> {
    let spec = &args.backing;
    if !args.force {
        bail!(
            "detach gives up whatever the cache holds that {spec} lacks: if the cache device still works, serve it and run `logcache drain` instead; if it is lost, run `logcache detach --force --backing {spec}`"
        );
    }
    // A serve still running on this backing device would go on writing it.
    let _lock = lock_backing(spec)?;
    let backing = open_backing(spec)?;
    refuse_live_owner(&*backing, spec, false)?;
    let label_at = label_offset(backing.size_bytes())
        .with_context(|| format!("{spec} is too small to carry a logcache label"))?;
    let mut block = vec![0u8; 4096];
    backing
        .read_at(&mut block, label_at)
        .with_context(|| format!("reading the label of {spec}"))?;
    let label = match Label::decode(&block) {
        Ok(Some(l)) => l,
        Ok(None) => bail!(
            "{spec} carries no logcache label: no cache was formatted for it (or it was overwritten); there is nothing to detach"
        ),
        Err(_) => bail!(
            "the logcache label of {spec} is damaged (checksum mismatch); it cannot be detached safely: copy what you need from its first {} bytes",
            label_at
        ),
    };
    let record = WritebackRecord::decode_from_label(&block);
    if let Some(r) = record.filter(|r| r.detached() && label.format_id != 0) {
        // Begun (the record, synced) but not finished (the label still names its cache): serve
        // could not finish marking it when its cache device failed. Finished now.
        write_detached(&*backing, label_at, &label, &r)
            .with_context(|| format!("finishing marking {spec} detached"))?;
        println!(
            "finished detaching {spec} from its cache (begun at {}): {}",
            when(r.detached_unix_ms),
            holds(Some(r))
        );
        println!(
            "use it alone (the disk is its first {label_at} bytes, {}), or give it a new cache: logcache format --cache NEW --backing {spec}",
            human(label_at)
        );
        return Ok(());
    }
    if let Some(r) = record.filter(|r| r.detached()) {
        println!(
            "{spec} was already detached from its cache at {}: {}",
            when(r.detached_unix_ms),
            holds(Some(r))
        );
        return Ok(());
    }
    let record = record.filter(|r| r.format_id == label.format_id);
    if let Some(cache) = &args.cache {
        eprintln!("logcache: {}", probe_cache(cache, spec, &label)?);
    }
    let detached = WritebackRecord::detached_from(record, &label, now_unix_ms());
    write_detached(&*backing, label_at, &label, &detached)
        .with_context(|| format!("marking {spec} detached"))?;
    println!("detached {spec}: {}", holds(record));
    println!(
        "use it alone (the disk is its first {label_at} bytes, {}), or give it a new cache: logcache format --cache NEW --backing {spec}",
        human(label_at)
    );
    Ok(())
}

/// What the backing device alone holds, by its writeback record.
fn holds(record: Option<WritebackRecord>) -> String {
    if let Some(r) = record.filter(|r| r.served_alone()) {
        return if r.lost_bytes == 0 {
            format!(
                "every write: its cache device failed while serving at {} with no dirty data, and serve went on from it alone",
                when(r.detached_unix_ms)
            )
        } else {
            format!(
                "the disk as served, but for {} bytes ({}) whose newest data was lost with the cache device that failed at {}: they hold older data; check its filesystem before use",
                r.lost_bytes,
                human(r.lost_bytes),
                when(r.detached_unix_ms)
            )
        };
    }
    let Some(r) = record else {
        return "the disk as of an unknown time: its label has no writeback record (its cache was last served by a logcache before format version 3); check its filesystem before use".to_string();
    };
    let lag_s = r
        .recorded_unix_ms
        .saturating_sub(r.consistent_as_of_unix_ms)
        / 1000;
    if r.flags & RECORD_SORTED != 0 {
        return format!(
            "not a consistent disk: its cache wrote back in writeback_order=sorted, so it may hold a mixture no disk ever held; check its filesystem before use; about {} of later writes were in the lost cache (at {})",
            human(r.lag_bytes),
            when(r.recorded_unix_ms)
        );
    }
    if r.consistent_as_of_unix_ms == 0 {
        return "the disk as of an unknown time (no flush point recorded yet); check its filesystem before use".to_string();
    }
    if r.lag_bytes == 0 {
        return format!(
            "the disk as of {}, when writeback had caught up; writes after that were in the lost cache",
            when(r.recorded_unix_ms)
        );
    }
    format!(
        "the disk as of {}; about {lag_s} s and {} of later writes were in the lost cache (as recorded at {}; writes after that were lost too)",
        when(r.consistent_as_of_unix_ms),
        human(r.lag_bytes),
        when(r.recorded_unix_ms)
    )
}

/// What became of the cache device: refuses one that still reads whole and belongs to this
/// backing device, or belongs to another.
fn probe_cache(path: &Path, spec: &str, label: &Label) -> Result<String> {
    let shown = path.display();
    if !path.exists() {
        return Ok(format!("cache {shown} is gone"));
    }
    let cache = match open_cache(path) {
        Ok(c) => c,
        Err(e) => return Ok(format!("cache {shown} is unreadable ({e:#})")),
    };
    let sb = match read_superblock(&*cache) {
        Ok(Some(sb)) => sb,
        Ok(None) => return Ok(format!("cache {shown} holds no logcache superblock")),
        Err(e) => return Ok(format!("cache {shown} is unreadable ({e})")),
    };
    if sb.format_id != label.format_id {
        bail!("cache {shown} is not the cache of {spec} (another format); nothing was written");
    }
    if cache.size_bytes() < sb.cache_size_bytes {
        return Ok(format!(
            "cache {shown} is truncated ({} of its {} bytes are left)",
            cache.size_bytes(),
            sb.cache_size_bytes
        ));
    }
    bail!(
        "cache {shown} still reads whole: keep its data by serving it and running `logcache drain`; to give that data up anyway, run detach --force without --cache"
    )
}

/// `2026-11-25 14:03:07 UTC`.
pub fn when(unix_ms: u64) -> String {
    utc_text(unix_ms / 1000)
        .replace('T', " ")
        .replace('Z', " UTC")
}

fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |d| d.as_millis() as u64)
}
