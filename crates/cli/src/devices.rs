//! Opening the cache and backing devices named on the command line, and the lock that keeps a
//! cache from being served twice.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use logcache_engine::io::file::{FileDevice, FileOptions};
use logcache_engine::io::BlockDevice;
use logcache_nbd::uri::is_nbd_uri;
use logcache_nbd_client::{NbdDevice, DEFAULT_REQUEST_TIMEOUT};
use logcache_rbd::{is_rbd_spec, RbdDevice};

use crate::guard::{lock_holder, try_flock};

/// Connections the NBD backing client opens when the server allows several.
const NBD_BACKING_CONNECTIONS: usize = 4;

/// Opens the cache device (a file or block device) for reading and writing.
pub fn open_cache(path: &Path) -> Result<Arc<dyn BlockDevice>> {
    if !path.exists() {
        bail!(
            "cache {} does not exist; create it (e.g. truncate -s 1G {}) and run logcache format",
            path.display(),
            path.display()
        );
    }
    let dev = FileDevice::open(path, FileOptions::default())
        .with_context(|| format!("opening cache {}", path.display()))?;
    Ok(Arc::new(dev))
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
    if is_nbd_uri(spec) {
        let dev = NbdDevice::open_with_timeout(spec, NBD_BACKING_CONNECTIONS, request_timeout)
            .with_context(|| format!("connecting to backing device {spec}"))?;
        return Ok(Arc::new(dev));
    }
    if is_rbd_spec(spec) {
        // The error names the image and says what to do.
        return Ok(Arc::new(RbdDevice::open(spec, request_timeout)?));
    }
    if spec.contains("://") {
        bail!("backing device {spec:?} is neither a path nor an nbd:// or nbd+unix:// URI");
    }
    let path = PathBuf::from(spec);
    if !path.exists() {
        bail!(
            "backing device {} does not exist; give a file, a block device, an NBD URI or rbd:POOL/IMAGE",
            path.display()
        );
    }
    let dev = FileDevice::open(&path, FileOptions::default())
        .with_context(|| format!("opening backing device {}", path.display()))?;
    Ok(Arc::new(dev))
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
