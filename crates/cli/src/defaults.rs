//! The embedded default: what `logcache serve` runs with neither `--cache` nor `--backing`.
//! Sparse files under `./logcache-data/`, formatted on first start.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use logcache_engine::io::file::create_sparse;

pub const DATA_DIR: &str = "logcache-data";
pub const CACHE_SIZE_BYTES: u64 = 1 << 30;
pub const BACKING_SIZE_BYTES: u64 = 8 << 30;
pub const TCP_LISTEN: &str = "127.0.0.1:10809";

pub fn cache_path() -> PathBuf {
    Path::new(DATA_DIR).join("cache.img")
}

pub fn backing_path() -> PathBuf {
    Path::new(DATA_DIR).join("backing.img")
}

pub fn socket_path() -> PathBuf {
    Path::new(DATA_DIR).join("nbd.sock")
}

/// The control socket `status`, `set` and `drain` use when not told otherwise: the embedded
/// default cache's.
pub fn control_path() -> PathBuf {
    crate::devices::control_path_for(&cache_path())
}

/// Creates the directory and the sparse files if missing. Returns whether the cache file was
/// created now (so it must be formatted).
pub fn ensure_files() -> Result<bool> {
    std::fs::create_dir_all(DATA_DIR).with_context(|| format!("creating ./{DATA_DIR}"))?;
    let cache = cache_path();
    let backing = backing_path();
    let fresh = !cache.exists();
    if !backing.exists() {
        create_sparse(&backing, BACKING_SIZE_BYTES)
            .with_context(|| format!("creating {}", backing.display()))?;
    }
    if fresh {
        create_sparse(&cache, CACHE_SIZE_BYTES)
            .with_context(|| format!("creating {}", cache.display()))?;
    }
    Ok(fresh)
}
