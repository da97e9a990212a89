//! The cache and backing devices named on the command line (opened by `logcache_backing`), and
//! the locks that keep a device from being served twice.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use logcache_backing::DEFAULT_REQUEST_TIMEOUT;
use logcache_engine::io::file::ReadEngine;
use logcache_engine::io::BlockDevice;
use logcache_nbd::uri::is_nbd_uri;

use crate::guard::{lock_holder, try_flock};

/// Opens the cache device (a file or block device) for reading and writing.
pub fn open_cache(path: &Path) -> Result<Arc<dyn BlockDevice>> {
    Ok(logcache_backing::open_cache(path)?)
}

/// `serve --io-engine`: how the cache device's read batches (the read hit path) are served.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum IoEngineArg {
    /// io_uring where the kernel allows it, else `sync` (with a one-line note saying why).
    Auto,
    /// io_uring, or refuse to start where the kernel does not allow it.
    #[value(name = "io_uring")]
    IoUring,
    /// Positional reads (pread), one after another.
    Sync,
}

/// Picks the read engine `arg` asks for: `auto` falls back to `sync` with a note on stderr,
/// `io_uring` refuses with one line where the kernel forbids it.
pub fn pick_read_engine(arg: IoEngineArg) -> Result<ReadEngine> {
    match arg {
        IoEngineArg::Sync => Ok(ReadEngine::Sync),
        IoEngineArg::IoUring => ReadEngine::require_io_uring().map_err(|e| {
            anyhow::anyhow!(
                "--io-engine io_uring: this kernel refuses io_uring ({e}); use --io-engine sync"
            )
        }),
        IoEngineArg::Auto => {
            let (engine, why) = ReadEngine::detect();
            if let Some(e) = why {
                eprintln!("logcache: note: io_uring unavailable ({e}); reading the cache device with pread (--io-engine sync)");
            }
            Ok(engine)
        }
    }
}

/// Opens the cache device for `serve`, its read hits served by `engine`.
pub fn open_cache_for_serving(path: &Path, engine: ReadEngine) -> Result<Arc<dyn BlockDevice>> {
    Ok(logcache_backing::open_cache_with_engine(path, engine)?)
}

/// Opens a backing SPEC: an NBD URI, an RBD image (`rbd:POOL/IMAGE[?conf=PATH&id=USER]`) or a
/// file/block device path.
pub fn open_backing(spec: &str) -> Result<Arc<dyn BlockDevice>> {
    open_backing_with_timeout(spec, DEFAULT_REQUEST_TIMEOUT)
}

/// [`open_backing`]; an NBD backing server (or a Ceph cluster) may take `request_timeout` to
/// answer a request.
pub fn open_backing_with_timeout(
    spec: &str,
    request_timeout: Duration,
) -> Result<Arc<dyn BlockDevice>> {
    Ok(logcache_backing::open_backing(spec, request_timeout)?)
}

/// An exclusive advisory lock on the cache file, held while the process lives: a second
/// `serve` (or `format`) of the same cache fails at once instead of corrupting it.
pub struct CacheLock {
    _file: File,
}

pub fn lock_cache(path: &Path) -> Result<CacheLock> {
    lock_exclusive(path, |holder| {
        format!(
            "cache {} is in use by {holder}; stop it first (logcache status shows it)",
            path.display()
        )
    })
}

/// The same lock on a backing file or block device, held by `serve` (and by `format` and
/// `check` while they run): two caches on one backing device destroy each other's data. An NBD
/// backing has no local lock (None); its label names its cache.
pub fn lock_backing(spec: &str) -> Result<Option<CacheLock>> {
    if is_nbd_uri(spec) || !Path::new(spec).exists() {
        return Ok(None);
    }
    let lock = lock_exclusive(Path::new(spec), |holder| {
        format!(
            "backing device {spec} is in use by {holder}; a backing device serves one cache at a time: stop that process first (nothing was written)"
        )
    })?;
    Ok(Some(lock))
}

/// The same lock on any file; `in_use` says what to do when another process holds it, given
/// the holder ("process PID (COMMAND)", or "another process" when /proc does not tell).
pub fn lock_exclusive(path: &Path, in_use: impl FnOnce(&str) -> String) -> Result<CacheLock> {
    let file =
        File::open(path).with_context(|| format!("opening {} to lock it", path.display()))?;
    if !try_flock(&file).with_context(|| format!("locking {}", path.display()))? {
        let holder = lock_holder(&file).unwrap_or_else(|| "another process".to_string());
        bail!("{}", in_use(&holder));
    }
    Ok(CacheLock { _file: file })
}

/// The control socket beside a cache file: `<cache>.ctl`.
pub fn control_path_for(cache: &Path) -> PathBuf {
    let mut name = cache.as_os_str().to_owned();
    name.push(".ctl");
    PathBuf::from(name)
}
