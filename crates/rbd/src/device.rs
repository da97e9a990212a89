//! [`RbdDevice`]: an RBD image as the cache's backing [`BlockDevice`], with a lost connection
//! to the cluster replaced by a new one on the next call (as the NBD backing device does).

use std::fmt;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use logcache_io::{BlockDevice, SECTOR_SIZE_BYTES};
use parking_lot::RwLock;

use crate::session::{CallError, OpenError, Session};
use crate::spec::RbdSpec;

/// An RBD image as a [`BlockDevice`], through librbd with its cache off: a write returns once
/// the OSDs have it, a flush covers every write that returned before it.
///
/// Calls from many threads run at once (each submits asynchronous IO and waits for it), so the
/// image sees as many requests in flight as the engine issues; a vectored write puts all its
/// pieces in flight together. Sequential reads are read ahead (`readahead.rs`: up to the
/// window, by default four 4 MiB buffers, ahead of a reader whose last three reads belonged to
/// one stream, even out of order, unless the reads in flight already cover 4 MiB), kept
/// coherent with every write, discard and write-zeroes of this device.
///
/// Failure policy: a call whose cluster operation times out (the op timeout given to
/// [`RbdDevice::open`]), or that finds this client blocklisted or its exclusive lock taken
/// away, fails, and the session is dropped. The next call opens a new session (connect, open,
/// take the lock); while that fails, calls fail at once with the reason, so the cache keeps
/// absorbing writes and retries writeback later. The image must still have the same size.
/// [`BlockDevice::reconnects`] counts new sessions, so writeback writes again a batch whose
/// flush came after one.
pub struct RbdDevice {
    spec: RbdSpec,
    size_bytes: u64,
    op_timeout: Duration,
    /// The session in use; `None` after it was lost, until the next call opens another.
    session: RwLock<Option<Arc<Session>>>,
    /// Why the last session was dropped, for the message while reconnecting fails.
    lost_reason: RwLock<String>,
    reconnects: AtomicU64,
    /// How far ahead of a sequential reader to read (`set_read_ahead_bytes`; 0: off).
    read_ahead_bytes: AtomicU64,
}

impl RbdDevice {
    /// Opens `spec` (`rbd:POOL/IMAGE[?conf=PATH&id=USER]`), taking the image's exclusive lock.
    pub fn open(spec: &str, op_timeout: Duration) -> io::Result<RbdDevice> {
        let parsed = RbdSpec::parse(spec)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        let session = Session::open(&parsed, op_timeout).map_err(|e| open_error(&parsed, e))?;
        let size_bytes = session.size_bytes();
        if size_bytes < SECTOR_SIZE_BYTES || size_bytes % SECTOR_SIZE_BYTES != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "image {}/{} is {size_bytes} bytes, not a positive multiple of 512; \
                     resize it (rbd resize --size SIZE {0}/{1})",
                    parsed.pool, parsed.image
                ),
            ));
        }
        Ok(RbdDevice {
            spec: parsed,
            size_bytes,
            op_timeout,
            session: RwLock::new(Some(Arc::new(session))),
            lost_reason: RwLock::new(String::new()),
            reconnects: AtomicU64::new(0),
            read_ahead_bytes: AtomicU64::new(crate::readahead::MAX_WINDOW_BYTES),
        })
    }

    /// Whether the session was lost and not yet replaced.
    pub fn has_failed(&self) -> bool {
        self.session.read().is_none()
    }

    /// The session to use: the current one, or a new one if it was lost.
    fn session(&self) -> io::Result<Arc<Session>> {
        if let Some(s) = self.session.read().as_ref() {
            return Ok(s.clone());
        }
        let mut slot = self.session.write();
        if let Some(s) = slot.as_ref() {
            return Ok(s.clone()); // Another thread reconnected meanwhile.
        }
        let fresh = Session::open(&self.spec, self.op_timeout)
            .map_err(|e| open_error(&self.spec, e))
            .and_then(|s| {
                if s.size_bytes() == self.size_bytes {
                    Ok(s)
                } else {
                    Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "the image changed size while reconnecting ({} vs {} bytes); \
                             refusing to use it as the same backing device",
                            s.size_bytes(),
                            self.size_bytes
                        ),
                    ))
                }
            });
        match fresh {
            Ok(s) => {
                let s = Arc::new(s);
                *slot = Some(s.clone());
                self.reconnects.fetch_add(1, Ordering::AcqRel);
                Ok(s)
            }
            Err(e) => Err(io::Error::new(
                io::ErrorKind::NotConnected,
                format!(
                    "RBD backing device {} is unreachable (the session was lost: {}; \
                     reconnecting failed: {e}); dirty data stays in the cache and is written \
                     back once it answers again",
                    self.spec,
                    self.lost_reason.read()
                ),
            )),
        }
    }

    /// Runs `op` on the session; an error that means the connection is gone drops the session
    /// (if no other thread replaced it already), so the next call opens a new one.
    fn with_session<T>(&self, op: impl FnOnce(&Session) -> Result<T, CallError>) -> io::Result<T> {
        let session = self.session()?;
        match op(&session) {
            Ok(v) => Ok(v),
            Err(e) => {
                if e.is_connection_lost() {
                    session.mark_lost();
                    let mut slot = self.session.write();
                    if slot.as_ref().is_some_and(|cur| Arc::ptr_eq(cur, &session)) {
                        *slot = None;
                        *self.lost_reason.write() = e.to_string();
                    }
                }
                Err(io::Error::new(
                    e.kind(),
                    format!("RBD backing device {}: {e}", self.spec),
                ))
            }
        }
    }

    fn check_range(&self, offset: u64, len_bytes: u64) -> io::Result<()> {
        logcache_io::check_range(self.size_bytes, offset, len_bytes)
    }
}

/// A failed open as one line naming the image.
fn open_error(spec: &RbdSpec, e: OpenError) -> io::Error {
    let kind = match &e {
        OpenError::Call(c) => c.kind(),
        OpenError::Refused(_) => io::ErrorKind::Other,
    };
    io::Error::new(kind, format!("opening RBD image {spec}: {e}"))
}

impl BlockDevice for RbdDevice {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check_range(offset, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(());
        }
        let read_ahead_bytes = self.read_ahead_bytes.load(Ordering::Relaxed);
        self.with_session(|s| s.read(buf, offset, read_ahead_bytes))
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.write_vectored_at(&[buf], offset)
    }

    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        let len_bytes: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        self.check_range(offset, len_bytes)?;
        if len_bytes == 0 {
            return Ok(());
        }
        self.with_session(|s| s.write_vectored(bufs, offset))
    }

    /// `rbd_aio_flush`: with librbd's cache off, writes that returned are already on the OSDs
    /// (which acknowledge only durable writes); the flush is still issued, so that the contract
    /// holds whatever cache setting librbd was built or configured with.
    fn flush(&self) -> io::Result<()> {
        self.with_session(|s| s.flush())
    }

    fn discard(&self, offset: u64, len_bytes: u64) -> io::Result<()> {
        self.check_range(offset, len_bytes)?;
        if len_bytes == 0 {
            return Ok(());
        }
        self.with_session(|s| s.discard(offset, len_bytes))
    }

    /// `rbd_aio_write_zeroes`: librbd deallocates whole objects and zeroes the rest.
    fn write_zeroes(&self, offset: u64, len_bytes: u64) -> io::Result<()> {
        self.check_range(offset, len_bytes)?;
        if len_bytes == 0 {
            return Ok(());
        }
        self.with_session(|s| s.write_zeroes(offset, len_bytes))
    }

    fn describe(&self) -> String {
        self.spec.to_string()
    }

    fn reconnects(&self) -> u64 {
        self.reconnects.load(Ordering::Acquire)
    }

    /// The read-ahead window (the `backing_read_ahead_kib` tunable), capped at 16 MiB: the
    /// next read of a session uses it.
    fn set_read_ahead_bytes(&self, bytes: u64) {
        self.read_ahead_bytes.store(
            bytes.min(crate::readahead::MAX_WINDOW_BYTES),
            Ordering::Relaxed,
        );
    }
}

impl fmt::Debug for RbdDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RbdDevice")
            .field("spec", &self.spec)
            .field("size_bytes", &self.size_bytes)
            .field("connected", &!self.has_failed())
            .field("reconnects", &self.reconnects.load(Ordering::Relaxed))
            .finish()
    }
}
