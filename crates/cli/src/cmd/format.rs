//! `logcache format --cache PATH --backing SPEC [--segment-size SIZE] [--force] [--checkpoints N]`

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use logcache_engine::format::label::{label_offset, WritebackRecord};
use logcache_engine::io::BlockDevice;
use logcache_engine::{format_cache, FormatOptions};

use crate::cmd::detach::when;
use crate::devices::{lock_backing, lock_cache, open_backing, open_cache};
use crate::guard::refuse_same_device;
use crate::owner::refuse_live_owner;
use crate::size::{human, parse_size};

#[derive(Args)]
pub struct FormatArgs {
    /// The cache device: a file or block device (it must exist).
    #[arg(long)]
    pub cache: PathBuf,
    /// The backing device: a file or block device path, an NBD URI, or rbd:POOL/IMAGE[?conf=PATH&id=USER].
    #[arg(long)]
    pub backing: String,
    /// Segment size, a multiple of 4K from 32K to 16M.
    #[arg(long, default_value = "1M", value_parser = parse_size)]
    pub segment_size: u64,
    /// Format even if the cache may hold data not yet written back, or the backing device
    /// carries another cache's label.
    #[arg(long)]
    pub force: bool,
    /// Checkpoints the cache can hold at once (0 to 16; see `logcache checkpoint`). Each
    /// takes 64 KiB of the cache device per GiB of disk (two bitmap copies).
    #[arg(long, default_value_t = 4)]
    pub checkpoints: u32,
}

pub fn run(args: &FormatArgs) -> Result<()> {
    refuse_same_device(&args.cache, &args.backing)?;
    let cache = open_cache(&args.cache)?;
    let _lock = lock_cache(&args.cache)?;
    // Even with --force: another process serving this backing device would go on writing it.
    let _backing_lock = lock_backing(&args.backing)?;
    let backing = open_backing(&args.backing)?;
    // An NBD backing has no local lock: its owner record says whether another serve has it.
    refuse_live_owner(&*backing, &args.backing, args.force)?;
    let (cache_bytes, backing_bytes) = (cache.size_bytes(), backing.size_bytes());
    if cache_bytes > backing_bytes {
        eprintln!(
            "logcache: warning: the cache ({}) is larger than the backing device it caches ({}); at most the disk's size of it can ever hold live data",
            human(cache_bytes),
            human(backing_bytes)
        );
    }
    // What the label says the backing device lost with a previous cache: format replaces the
    // label, so this is the last moment to say it.
    let earlier_loss = earlier_loss(&*backing, &args.backing);
    let sb = format_cache(
        &*cache,
        &*backing,
        &FormatOptions {
            segment_size_bytes: args.segment_size,
            force: args.force,
            seal_interval_ms: None,
            checkpoint_slots: args.checkpoints,
        },
    )
    .with_context(|| format!("formatting {}", args.cache.display()))?;
    println!(
        "formatted {}: {} segments of {} KiB caching {} ({} bytes exported = {}: the backing device minus its last 4 KiB, logcache's label)",
        args.cache.display(),
        sb.segment_count,
        sb.segment_size_bytes / 1024,
        args.backing,
        sb.exported_size_bytes,
        human(sb.exported_size_bytes)
    );
    if let Some(line) = earlier_loss {
        println!("{line}");
    }
    Ok(())
}

/// One line if the backing device's label records data lost with a previous cache (served
/// alone after its cache device failed holding dirty data, or detached with data not yet
/// written back): how much, and when.
fn earlier_loss(backing: &dyn BlockDevice, spec: &str) -> Option<String> {
    let label_at = label_offset(backing.size_bytes())?;
    let mut block = vec![0u8; 4096];
    backing.read_at(&mut block, label_at).ok()?;
    let r = WritebackRecord::decode_from_label(&block).filter(|r| r.detached())?;
    let at = when(r.detached_unix_ms);
    if r.served_alone() && r.lost_bytes > 0 {
        return Some(format!(
            "note: {spec} lost {} bytes ({}) with its previous cache, whose device failed at {at}: those sectors hold older data than was last written there (check its filesystem if not done yet)",
            r.lost_bytes,
            human(r.lost_bytes)
        ));
    }
    if r.served_alone() {
        return None; // its cache device failed holding no dirty data: nothing was lost
    }
    let behind = if r.lag_bytes > 0 {
        format!(
            " (at least {}, as recorded at {})",
            human(r.lag_bytes),
            when(r.recorded_unix_ms)
        )
    } else {
        String::new()
    };
    Some(format!(
        "note: {spec} was detached from its previous cache at {at}, giving up that cache's writes not yet written back{behind}: check its filesystem if not done yet"
    ))
}
