//! `logcache format --cache PATH --backing SPEC [--segment-size SIZE] [--force] [--checkpoints N]`

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use logcache_engine::{format_cache, FormatOptions};

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
    Ok(())
}
