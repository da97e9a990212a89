//! `logcache check` and `logcache dump`: offline, read-only looks at a cache that is not served.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use crate::devices::{lock_backing, lock_cache, open_backing, open_cache};
use crate::guard::refuse_same_device;
use crate::offline;

#[derive(Args)]
pub struct CheckArgs {
    /// The cache device (file or block device) to verify; it must not be served.
    #[arg(long)]
    pub cache: PathBuf,
    /// Also check that this backing device is the one the cache belongs to.
    #[arg(long)]
    pub backing: Option<String>,
}

#[derive(Args)]
pub struct DumpArgs {
    /// The cache device (file or block device) to print; it must not be served.
    #[arg(long)]
    pub cache: PathBuf,
    /// Only this segment.
    #[arg(long)]
    pub segment: Option<u64>,
}

/// Returns whether the check found no errors.
pub fn check(args: &CheckArgs) -> Result<bool> {
    if let Some(backing) = &args.backing {
        refuse_same_device(&args.cache, backing)?;
    }
    let cache = open_cache(&args.cache)?;
    // A served cache or backing device changes under the reader; refuse rather than report
    // nonsense.
    let _lock = lock_cache(&args.cache)?;
    let _backing_lock = args.backing.as_deref().map(lock_backing).transpose()?;
    let backing = args.backing.as_deref().map(open_backing).transpose()?;
    offline::check(cache, backing)
}

pub fn dump(args: &DumpArgs) -> Result<()> {
    let cache = open_cache(&args.cache)?;
    let _lock = lock_cache(&args.cache)?;
    offline::dump(cache, args.segment)
}
