//! Opening a device by the name a command line gives it: the cache (a file or block device)
//! and the backing SPEC (an NBD URI, an RBD image `rbd:POOL/IMAGE[?conf=PATH&id=USER]`, or a
//! file or block device path). The `logcache` binary and `logcache-bench` both open devices
//! here; the locks that keep a device from being served twice stay with the CLI.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use logcache_io::file::{FileDevice, FileOptions, ReadEngine};
use logcache_io::BlockDevice;
use logcache_nbd::uri::is_nbd_uri;
use logcache_nbd_client::NbdDevice;
use logcache_rbd::{is_rbd_spec, RbdDevice};

pub use logcache_nbd_client::DEFAULT_REQUEST_TIMEOUT;
/// RBD sessions whose close was given up on a cluster that did not answer (their lock stays
/// with this client until the cluster drops it).
pub use logcache_rbd::closes_abandoned as rbd_closes_abandoned;

/// Connections the NBD backing client opens when the server allows several. Each carries up to
/// 64 requests at once (a pipe; one over TLS), so the depth the backing device sees is the
/// callers' (read misses at iodepth 32 reached 0.98–1.02 of the emulated HDD alone with 4,
/// against 0.71 with 4 connections of one request each: BENCHMARKS, issue 20).
const NBD_BACKING_CONNECTIONS: usize = 4;

/// Why a device could not be opened; each says what to do.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(
        "cache {0} does not exist; create it (e.g. truncate -s 1G {0}) and run logcache format"
    )]
    CacheMissing(String),
    #[error(
        "backing device {0} does not exist; give a file, a block device, an NBD URI or rbd:POOL/IMAGE"
    )]
    BackingMissing(String),
    #[error("backing device {0:?} is neither a path nor an nbd:// or nbd+unix:// URI")]
    UnknownScheme(String),
    /// Opening or connecting failed; `what` names the device, `source` says why.
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    /// An RBD image's own error names the image and says what to do.
    #[error(transparent)]
    Rbd(io::Error),
}

/// Opens a file or block device for reading and writing; `what` names it in the error
/// ("opening cache /dev/sdb").
pub fn open_file(path: &Path, what: impl FnOnce() -> String) -> Result<FileDevice, OpenError> {
    FileDevice::open(path, FileOptions::default()).map_err(|source| OpenError::Io {
        what: what(),
        source,
    })
}

/// Opens the cache device (a file or block device) for reading and writing.
pub fn open_cache(path: &Path) -> Result<Arc<dyn BlockDevice>, OpenError> {
    open_cache_with_engine(path, ReadEngine::Sync)
}

/// [`open_cache`], its read batches (the read hit path) served by `engine`.
pub fn open_cache_with_engine(
    path: &Path,
    engine: ReadEngine,
) -> Result<Arc<dyn BlockDevice>, OpenError> {
    if !path.exists() {
        return Err(OpenError::CacheMissing(path.display().to_string()));
    }
    let mut dev = open_file(path, || format!("opening cache {}", path.display()))?;
    dev.set_read_engine(engine);
    Ok(Arc::new(dev))
}

/// Opens a backing SPEC; an NBD backing server (or a Ceph cluster) may take `request_timeout`
/// to answer a request.
pub fn open_backing(
    spec: &str,
    request_timeout: Duration,
) -> Result<Arc<dyn BlockDevice>, OpenError> {
    if is_nbd_uri(spec) {
        let dev = NbdDevice::open_with_timeout(spec, NBD_BACKING_CONNECTIONS, request_timeout)
            .map_err(|source| OpenError::Io {
                what: format!("connecting to backing device {spec}"),
                source,
            })?;
        return Ok(Arc::new(dev));
    }
    if is_rbd_spec(spec) {
        let dev = RbdDevice::open(spec, request_timeout).map_err(OpenError::Rbd)?;
        return Ok(Arc::new(dev));
    }
    if spec.contains("://") {
        return Err(OpenError::UnknownScheme(spec.to_string()));
    }
    let path = PathBuf::from(spec);
    if !path.exists() {
        return Err(OpenError::BackingMissing(path.display().to_string()));
    }
    let dev = open_file(&path, || {
        format!("opening backing device {}", path.display())
    })?;
    Ok(Arc::new(dev))
}
