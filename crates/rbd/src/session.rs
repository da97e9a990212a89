//! One connection to an RBD image: a librados cluster handle, an IO context on the pool, the
//! open image with its exclusive lock held, and asynchronous IO on it. The only module that
//! calls into librados/librbd (through `ffi`); `device.rs` decides when to open a new one.

use std::ffi::CString;
use std::io;
use std::os::raw::{c_char, c_int};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::ffi;
use crate::readahead::{Lookup, Readahead, PREFETCH_BYTES, SLOTS};
use crate::spec::RbdSpec;

/// A failed librados/librbd call: which call, and the errno it returned (positive).
#[derive(Debug, thiserror::Error)]
#[error("{call} failed: {}", io::Error::from_raw_os_error(*errno))]
pub struct CallError {
    pub call: &'static str,
    pub errno: i32,
}

impl CallError {
    fn check(call: &'static str, rc: isize) -> Result<(), CallError> {
        if rc < 0 {
            let errno = i32::try_from(-rc).unwrap_or(libc::EIO);
            Err(CallError { call, errno })
        } else {
            Ok(())
        }
    }

    /// Whether the error means the connection to the cluster is gone (an operation timed out,
    /// the cluster blocklisted this client, the image's lock was taken away): a new session
    /// may succeed where this one cannot.
    pub fn is_connection_lost(&self) -> bool {
        // ESHUTDOWN is Ceph's EBLOCKLISTED.
        matches!(
            self.errno,
            libc::ETIMEDOUT | libc::ESHUTDOWN | libc::ENOTCONN | libc::ECONNRESET | libc::EROFS
        )
    }

    /// The `io::ErrorKind` of the errno.
    pub fn kind(&self) -> io::ErrorKind {
        io::Error::from_raw_os_error(self.errno).kind()
    }
}

/// An open image with its exclusive lock. Dropping it releases the lock and closes everything,
/// waiting for IO in flight.
pub struct Session {
    cluster: ffi::RadosT,
    ioctx: ffi::RadosIoctxT,
    image: ffi::RbdImageT,
    locked: bool,
    size_bytes: u64,
    /// How long dropping the session waits for librbd to close it (the op timeout).
    close_timeout: Duration,
    /// Set when an operation found the connection gone: dropping then does not wait for the
    /// close at all (it would only wait out more timeouts on a cluster that is not answering).
    lost: AtomicBool,
    /// Read-ahead of sequential reads (`readahead.rs`) into `ra_buf`, `SLOTS` buffers of
    /// `PREFETCH_BYTES` each, allocated at open and freed only after every read-ahead into
    /// them finished (see `Drop`).
    ra: Mutex<Readahead<RaIo>>,
    ra_buf: *mut [u8],
    /// Bytes of reads of the image in flight (`read` calls), for the read-ahead's queue rule.
    read_bytes_in_flight: AtomicU64,
    /// Writes, discards and write-zeroes in flight: no read-ahead is planned while any is.
    /// Outside `ra`, so a write takes that lock once (to mark buffers stale), not twice.
    writes_in_flight: AtomicU32,
}

/// A read-ahead in flight: its completion and the bytes it must return.
#[derive(Clone, Copy, Debug)]
struct RaIo {
    c: ffi::RbdCompletionT,
    len: usize,
}

impl RaIo {
    /// Whether it finished, and then whether it read all its bytes.
    fn poll(&self) -> Option<bool> {
        // SAFETY: a submitted completion not yet released (the read-ahead state releases it
        // only after this, once).
        if unsafe { ffi::rbd_aio_is_complete(self.c) } == 0 {
            return None;
        }
        Some(self.succeeded())
    }

    /// After it finished: whether it read all its bytes.
    fn succeeded(&self) -> bool {
        // SAFETY: as in `poll`; the IO finished.
        let rc = unsafe { ffi::rbd_aio_get_return_value(self.c) };
        usize::try_from(rc).is_ok_and(|n| n == self.len)
    }

    fn wait(&self) {
        // SAFETY: as in `poll`; a reader waiting is counted (`waiters`), so nobody releases
        // the completion under it.
        unsafe { ffi::rbd_aio_wait_for_complete(self.c) };
    }

    fn release(self) {
        // SAFETY: finished (or waited for), released once: the read-ahead state hands each
        // handle out for release exactly once.
        unsafe { ffi::rbd_aio_release(self.c) };
    }
}

/// Counts a write in flight for the read-ahead until dropped, after marking the buffers it
/// overlaps stale (`write_begin`).
struct WriteInFlight<'a>(&'a AtomicU32);

impl<'a> WriteInFlight<'a> {
    fn new(session: &'a Session, offset: u64, len_bytes: u64) -> WriteInFlight<'a> {
        // Counted before the lock: a read-ahead planned after this write's stale marking sees
        // the count (the lock orders them), one planned before is marked stale.
        session.writes_in_flight.fetch_add(1, Ordering::AcqRel);
        session.ra.lock().write_begin(offset, len_bytes);
        WriteInFlight(&session.writes_in_flight)
    }
}

impl Drop for WriteInFlight<'_> {
    fn drop(&mut self) {
        // The write finished: a read-ahead submitted from now on reads what it wrote.
        let before = self.0.fetch_sub(1, Ordering::AcqRel);
        assert!(before > 0, "a write counted out more than in");
    }
}

// SAFETY: librados cluster handles, IO contexts and librbd image handles may be used from any
// thread and by several threads at once (librbd serializes internally); the raw pointers are
// owned by this struct and freed only in Drop, after every borrower (`&self`) is gone.
unsafe impl Send for Session {}
// SAFETY: as above; every `&self` method only submits and waits for asynchronous IO.
unsafe impl Sync for Session {}

/// What opening failed at, for the caller's message.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("{0}")]
    Call(#[from] CallError),
    #[error("{0}")]
    Refused(String),
}

fn cstring(what: &str, s: &str) -> Result<CString, OpenError> {
    CString::new(s).map_err(|_| OpenError::Refused(format!("{what} {s:?} contains a NUL byte")))
}

impl Session {
    /// Connects to the cluster of `spec`, opens the image, takes its exclusive lock.
    /// Operations on the cluster that take longer than `op_timeout` fail with ETIMEDOUT
    /// instead of waiting forever (librados' default).
    pub fn open(spec: &RbdSpec, op_timeout: Duration) -> Result<Session, OpenError> {
        assert!(
            !op_timeout.is_zero(),
            "a zero timeout means none to librados"
        );
        let id = spec.id.as_deref().map(|id| cstring("id", id)).transpose()?;
        let conf = match &spec.conf {
            Some(p) => Some(cstring("conf path", &p.to_string_lossy())?),
            None => None,
        };
        let pool = cstring("pool", &spec.pool)?;
        let image_name = cstring("image", &spec.image)?;
        let mut s = Session {
            cluster: ptr::null_mut(),
            ioctx: ptr::null_mut(),
            image: ptr::null_mut(),
            locked: false,
            size_bytes: 0,
            close_timeout: op_timeout,
            lost: AtomicBool::new(false),
            ra: Mutex::new(Readahead::new(0)),
            ra_buf: Box::into_raw(vec![0u8; SLOTS * PREFETCH_BYTES].into_boxed_slice()),
            read_bytes_in_flight: AtomicU64::new(0),
            writes_in_flight: AtomicU32::new(0),
        };
        let id_ptr = id.as_ref().map_or(ptr::null(), |c| c.as_ptr());
        // SAFETY: `s.cluster` is a valid out-pointer; `id_ptr` is NUL-terminated or null
        // (librados' default id), and outlives the call.
        let rc = unsafe { ffi::rados_create(&mut s.cluster, id_ptr) };
        CallError::check("rados_create", rc as isize)?;
        let conf_ptr = conf.as_ref().map_or(ptr::null(), |c| c.as_ptr());
        // SAFETY: `s.cluster` was created above; `conf_ptr` is NUL-terminated or null (search
        // the default places).
        let rc = unsafe { ffi::rados_conf_read_file(s.cluster, conf_ptr) };
        if rc < 0 {
            let where_ = match &spec.conf {
                Some(p) => format!("cannot read the Ceph config {}", p.display()),
                None => "no Ceph config found in the default places ($CEPH_CONF, \
                         /etc/ceph/ceph.conf); give one with ?conf=PATH"
                    .to_owned(),
            };
            return Err(OpenError::Refused(format!(
                "{where_}: {}",
                io::Error::from_raw_os_error(-rc)
            )));
        }
        let timeout_s = format!("{}", op_timeout.as_secs_f64().max(1.0));
        // No librbd cache: logcache is the cache; with librbd's on, a write would be
        // acknowledged before it reached the OSDs and a flush would have more to do.
        for (option, value) in [
            ("rbd_cache", "false"),
            ("rados_osd_op_timeout", timeout_s.as_str()),
            ("rados_mon_op_timeout", timeout_s.as_str()),
            ("client_mount_timeout", timeout_s.as_str()),
        ] {
            let (o, v) = (cstring("option", option)?, cstring("value", value)?);
            // SAFETY: both strings are NUL-terminated and outlive the call.
            let rc = unsafe { ffi::rados_conf_set(s.cluster, o.as_ptr(), v.as_ptr()) };
            CallError::check("rados_conf_set", rc as isize)?;
        }
        // SAFETY: a created, configured, not yet connected cluster handle.
        let rc = unsafe { ffi::rados_connect(s.cluster) };
        if rc < 0 {
            return Err(OpenError::Refused(format!(
                "cannot connect to the Ceph cluster (monitors in {}) within {timeout_s} s: {}",
                spec.conf
                    .as_ref()
                    .map_or("the default config".into(), |p| p.display().to_string()),
                io::Error::from_raw_os_error(-rc)
            )));
        }
        // SAFETY: a connected cluster; `pool` is NUL-terminated; `s.ioctx` a valid out-pointer.
        let rc = unsafe { ffi::rados_ioctx_create(s.cluster, pool.as_ptr(), &mut s.ioctx) };
        if rc == -libc::ENOENT {
            return Err(OpenError::Refused(format!(
                "pool {} does not exist; create it (ceph osd pool create {0}; rbd pool init {0})",
                spec.pool
            )));
        }
        CallError::check("rados_ioctx_create", rc as isize)?;
        // SAFETY: a valid IO context; `image_name` NUL-terminated; no snapshot (null).
        let rc = unsafe {
            ffi::rbd_open(
                s.ioctx,
                image_name.as_ptr(),
                &mut s.image,
                ptr::null::<c_char>(),
            )
        };
        if rc == -libc::ENOENT {
            return Err(OpenError::Refused(format!(
                "image {}/{} does not exist; create it (rbd create --size SIZE {0}/{1})",
                spec.pool, spec.image
            )));
        }
        CallError::check("rbd_open", rc as isize)?;
        let mut features = 0u64;
        // SAFETY: an open image; `features` a valid out-pointer.
        let rc = unsafe { ffi::rbd_get_features(s.image, &mut features) };
        CallError::check("rbd_get_features", rc as isize)?;
        if features & ffi::RBD_FEATURE_EXCLUSIVE_LOCK == 0 {
            return Err(OpenError::Refused(format!(
                "image {}/{} lacks the exclusive-lock feature, without which nothing stops a \
                 second writer; enable it (rbd feature enable {0}/{1} exclusive-lock)",
                spec.pool, spec.image
            )));
        }
        // SAFETY: an open image with the exclusive-lock feature.
        let rc = unsafe { ffi::rbd_lock_acquire(s.image, ffi::RBD_LOCK_MODE_EXCLUSIVE) };
        if rc < 0 {
            return Err(OpenError::Refused(format!(
                "cannot take the exclusive lock of image {}/{} ({}): another client holds it \
                 (another logcache serving it?); stop that client (rbd status {0}/{1} lists \
                 its watchers)",
                spec.pool,
                spec.image,
                io::Error::from_raw_os_error(-rc)
            )));
        }
        s.locked = true;
        // SAFETY: an open image; `s.size_bytes` a valid out-pointer.
        let rc = unsafe { ffi::rbd_get_size(s.image, &mut s.size_bytes) };
        CallError::check("rbd_get_size", rc as isize)?;
        *s.ra.get_mut() = Readahead::new(s.size_bytes);
        Ok(s)
    }

    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    /// Records that the connection is gone (the caller drops this session for a new one).
    pub fn mark_lost(&self) {
        self.lost.store(true, Ordering::Release);
    }

    /// Reads `buf.len()` bytes at `offset`: from a read-ahead buffer when one holds them,
    /// else from the image; then starts the read-aheads a sequential stream calls for, up to
    /// `read_ahead_bytes` ahead (0: none).
    pub fn read(
        &self,
        buf: &mut [u8],
        offset: u64,
        read_ahead_bytes: u64,
    ) -> Result<(), CallError> {
        let len_bytes = buf.len() as u64;
        let queued_before = self
            .read_bytes_in_flight
            .fetch_add(len_bytes, Ordering::AcqRel);
        let result = if self.read_ahead_hit(buf, offset) {
            Ok(())
        } else {
            self.read_image(buf, offset)
        };
        let queued_after = self
            .read_bytes_in_flight
            .fetch_sub(len_bytes, Ordering::AcqRel)
            - len_bytes;
        result?;
        self.read_ahead(
            offset,
            buf.len(),
            queued_before.max(queued_after),
            read_ahead_bytes,
        );
        Ok(())
    }

    /// Copies `[offset, offset + buf.len())` from a read-ahead buffer if one holds it (waiting
    /// for its read if in flight); `false` if none does (or its read failed or went stale).
    fn read_ahead_hit(&self, buf: &mut [u8], offset: u64) -> bool {
        let lookup = {
            let mut ra = self.ra.lock();
            ra.reap(RaIo::poll, RaIo::release);
            ra.lookup(offset, buf.len())
        };
        let Lookup::Hit { slot, at, wait } = lookup else {
            return false;
        };
        let servable = match wait {
            None => true,
            Some(io) => {
                io.wait();
                let ok = io.succeeded();
                let mut ra = self.ra.lock();
                if let Some(done) = ra.waited(slot, ok) {
                    done.release();
                }
                ra.servable(slot)
            }
        };
        if servable {
            let src = self.ra_slot(slot);
            // SAFETY: the slot is Ready and counts us as a user, so it is neither reused nor
            // read into until `release` below; `at + len` is inside it (`lookup` checked).
            unsafe { std::ptr::copy_nonoverlapping(src.add(at), buf.as_mut_ptr(), buf.len()) };
        }
        self.ra.lock().release(slot);
        servable
    }

    /// Counts the read and submits the read-aheads it calls for (under the lock, so that a
    /// planned slot is in flight before anyone can look it up). A read-ahead that cannot be
    /// submitted is dropped: reads go to the image as before.
    fn read_ahead(&self, offset: u64, len: usize, queued_bytes: u64, window_bytes: u64) {
        let mut ra = self.ra.lock();
        ra.set_window(window_bytes);
        let writing = self.writes_in_flight.load(Ordering::Acquire) > 0;
        for plan in ra
            .observe(offset, len, queued_bytes, writing)
            .into_iter()
            .flatten()
        {
            let Ok(c) = Completion::new() else {
                ra.failed(plan.slot);
                continue;
            };
            // SAFETY: the slot's buffer is ours alone while its read is in flight (nobody
            // copies from a Pending slot, and `Drop` waits for it before freeing the buffer).
            let rc = unsafe {
                ffi::rbd_aio_read(
                    self.image,
                    plan.start,
                    plan.len,
                    self.ra_slot(plan.slot).cast(),
                    c.raw,
                )
            };
            match c.submitted("rbd_aio_read", rc) {
                Ok(mut submitted) => {
                    let raw = submitted.raw.take().expect("just submitted");
                    ra.submitted(
                        plan.slot,
                        RaIo {
                            c: raw,
                            len: plan.len,
                        },
                    );
                }
                Err(_) => ra.failed(plan.slot),
            }
        }
    }

    /// The start of read-ahead slot `slot`'s buffer.
    fn ra_slot(&self, slot: usize) -> *mut u8 {
        assert!(slot < SLOTS);
        // SAFETY: `ra_buf` is SLOTS * PREFETCH_BYTES long and lives as long as `self`.
        unsafe { self.ra_buf.cast::<u8>().add(slot * PREFETCH_BYTES) }
    }

    fn read_image(&self, buf: &mut [u8], offset: u64) -> Result<(), CallError> {
        let len = buf.len();
        let c = Completion::new()?;
        // SAFETY: `buf` stays borrowed (alive, exclusively ours) until `c` completes: `wait`
        // below, or Completion's Drop on any early exit, waits for it.
        let rc =
            unsafe { ffi::rbd_aio_read(self.image, offset, len, buf.as_mut_ptr().cast(), c.raw) };
        let rc = c.submitted("rbd_aio_read", rc)?.wait();
        CallError::check("rbd_aio_read", rc)?;
        // librbd returns the bytes read; a short read would leave part of `buf` stale.
        if rc as usize != len {
            return Err(CallError {
                call: "rbd_aio_read (short read)",
                errno: libc::EIO,
            });
        }
        Ok(())
    }

    /// Writes `bufs` one after another from `offset`, all in flight at once.
    pub fn write_vectored(&self, bufs: &[&[u8]], offset: u64) -> Result<(), CallError> {
        // Up to this many writes in flight per call; more pieces go in further rounds.
        const MAX_IN_FLIGHT: usize = 32;
        let len_bytes = bufs.iter().map(|b| b.len() as u64).sum();
        let _writing = WriteInFlight::new(self, offset, len_bytes);
        let mut at = offset;
        for round in bufs.chunks(MAX_IN_FLIGHT) {
            let mut pending: [Option<Submitted>; MAX_IN_FLIGHT] = Default::default();
            let mut first_err = None;
            for (slot, b) in pending.iter_mut().zip(round) {
                match self.submit_write(b, at) {
                    Ok(s) => *slot = Some(s),
                    Err(e) => {
                        first_err = Some(e);
                        break;
                    }
                }
                at += b.len() as u64;
            }
            // Every submitted write is waited for, error or not: the buffers must outlive them.
            for s in pending.into_iter().flatten() {
                let rc = s.wait();
                if first_err.is_none() {
                    first_err = CallError::check("rbd_aio_write", rc).err();
                }
            }
            if let Some(e) = first_err {
                return Err(e);
            }
        }
        Ok(())
    }

    fn submit_write(&self, buf: &[u8], offset: u64) -> Result<Submitted, CallError> {
        let c = Completion::new()?;
        // SAFETY: `buf` is borrowed by the caller until the returned `Submitted` is waited for
        // or dropped (Drop waits), and librbd only reads it.
        let rc = unsafe {
            ffi::rbd_aio_write(self.image, offset, buf.len(), buf.as_ptr().cast(), c.raw)
        };
        c.submitted("rbd_aio_write", rc)
    }

    pub fn flush(&self) -> Result<(), CallError> {
        let c = Completion::new()?;
        // SAFETY: an open image and a fresh completion; no buffer.
        let rc = unsafe { ffi::rbd_aio_flush(self.image, c.raw) };
        CallError::check("rbd_aio_flush", c.submitted("rbd_aio_flush", rc)?.wait())
    }

    pub fn discard(&self, offset: u64, len_bytes: u64) -> Result<(), CallError> {
        let _writing = WriteInFlight::new(self, offset, len_bytes);
        let c = Completion::new()?;
        // SAFETY: an open image and a fresh completion; no buffer.
        let rc = unsafe { ffi::rbd_aio_discard(self.image, offset, len_bytes, c.raw) };
        CallError::check(
            "rbd_aio_discard",
            c.submitted("rbd_aio_discard", rc)?.wait(),
        )
    }

    pub fn write_zeroes(&self, offset: u64, len_bytes: u64) -> Result<(), CallError> {
        let len = usize::try_from(len_bytes).expect("a 64-bit usize");
        let _writing = WriteInFlight::new(self, offset, len_bytes);
        let c = Completion::new()?;
        // SAFETY: an open image and a fresh completion; no buffer; no flags.
        let rc = unsafe { ffi::rbd_aio_write_zeroes(self.image, offset, len, c.raw, 0, 0) };
        CallError::check(
            "rbd_aio_write_zeroes",
            c.submitted("rbd_aio_write_zeroes", rc)?.wait(),
        )
    }
}

/// Sessions whose close was given up (see `Drop for Session`) since the process started.
static CLOSES_ABANDONED: AtomicU64 = AtomicU64::new(0);

/// How many sessions were dropped without librbd finishing their close within the op timeout
/// (a dead cluster): their exclusive lock stays with this client until the cluster times out
/// its watch, and their handles are leaked.
pub fn closes_abandoned() -> u64 {
    CLOSES_ABANDONED.load(Ordering::Acquire)
}

/// The handles of a session being closed, moved to the thread that closes them.
struct Handles {
    cluster: ffi::RadosT,
    ioctx: ffi::RadosIoctxT,
    image: ffi::RbdImageT,
    locked: bool,
    /// Read-aheads not yet reaped, and the buffer they read into: freed once they finished.
    read_aheads: Vec<RaIo>,
    ra_buf: *mut [u8],
}

// SAFETY: librados/librbd handles may be used from any thread; after `Session::drop` moves
// them here, nothing else refers to them.
unsafe impl Send for Handles {}

impl Handles {
    fn close(self) {
        for io in self.read_aheads {
            io.wait();
            io.release();
        }
        // SAFETY: created by `Box::into_raw` at open, freed once, here, after every read into
        // it finished.
        drop(unsafe { Box::from_raw(self.ra_buf) });
        // SAFETY: each handle is either null (never created) or created by `open` and not yet
        // freed; they are freed in reverse order of creation, exactly once. No IO is in flight:
        // every IO method waits for its completions while borrowing the session.
        unsafe {
            if self.locked {
                // A failure (the lock was already taken from us) leaves nothing to release.
                let _ = ffi::rbd_lock_release(self.image);
            }
            if !self.image.is_null() {
                ffi::rbd_close(self.image);
            }
            if !self.ioctx.is_null() {
                ffi::rados_ioctx_destroy(self.ioctx);
            }
            if !self.cluster.is_null() {
                ffi::rados_shutdown(self.cluster);
            }
        }
    }
}

impl Drop for Session {
    /// Releases the lock and closes the image, waiting at most the op timeout. librbd's close
    /// has no timeout of its own: it unwatches the image's header, an operation the op timeouts
    /// do not cover, so on a dead cluster `rbd_close` waited forever (seen: `serve` hung on
    /// SIGTERM). The close runs on its own thread; past the timeout it is left there and its
    /// handles leak, which costs less than a thread (or the whole stop) that never returns.
    fn drop(&mut self) {
        let handles = Handles {
            cluster: std::mem::replace(&mut self.cluster, ptr::null_mut()),
            ioctx: std::mem::replace(&mut self.ioctx, ptr::null_mut()),
            image: std::mem::replace(&mut self.image, ptr::null_mut()),
            locked: std::mem::take(&mut self.locked),
            read_aheads: self.ra.get_mut().take_all_io().collect(),
            ra_buf: self.ra_buf,
        };
        let (done_tx, done_rx) = mpsc::sync_channel::<()>(1);
        let spawned = std::thread::Builder::new()
            .name("rbd-close".into())
            .spawn(move || {
                handles.close();
                let _ = done_tx.send(());
            });
        match spawned {
            // A lost session's close goes on alone; the caller is opening a new session (the
            // writeback thread, a request), and the old lock is broken by the new one anyway.
            Ok(_) if self.lost.load(Ordering::Acquire) => {}
            Ok(_) => {
                if let Err(mpsc::RecvTimeoutError::Timeout) = done_rx.recv_timeout(
                    self.close_timeout
                        .max(Duration::from_secs(1))
                        .saturating_add(Duration::from_secs(1)),
                ) {
                    CLOSES_ABANDONED.fetch_add(1, Ordering::AcqRel);
                }
            }
            // No thread to be had (the process is out of them): leak the handles rather than
            // risk a close that never returns on this thread.
            Err(_) => {
                CLOSES_ABANDONED.fetch_add(1, Ordering::AcqRel);
            }
        }
    }
}

/// An `rbd_completion_t` not yet handed to an IO call.
struct Completion {
    raw: ffi::RbdCompletionT,
}

impl Completion {
    fn new() -> Result<Completion, CallError> {
        let mut raw = ptr::null_mut();
        // SAFETY: a valid out-pointer; no callback (we wait), so no callback argument.
        let rc = unsafe { ffi::rbd_aio_create_completion(ptr::null_mut(), None, &mut raw) };
        CallError::check("rbd_aio_create_completion", rc as isize)?;
        assert!(!raw.is_null());
        Ok(Completion { raw })
    }

    /// The completion after the IO call that took it returned `rc`: in flight if `rc` is 0.
    fn submitted(self, call: &'static str, rc: c_int) -> Result<Submitted, CallError> {
        CallError::check(call, rc as isize)?;
        let raw = self.raw;
        std::mem::forget(self);
        Ok(Submitted { raw: Some(raw) })
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        // SAFETY: never submitted (`submitted` forgets self), so librbd holds no other
        // reference and no IO will complete into it.
        unsafe { ffi::rbd_aio_release(self.raw) };
    }
}

/// A completion whose IO is in flight. Dropping it waits for the IO, so that a buffer the IO
/// uses is never freed under it.
struct Submitted {
    raw: Option<ffi::RbdCompletionT>,
}

impl Submitted {
    /// Waits for the IO; its return value (negative errno on failure).
    fn wait(mut self) -> isize {
        let raw = self.raw.take().expect("waited once");
        // SAFETY: a submitted completion, waited for once, then released once.
        unsafe {
            ffi::rbd_aio_wait_for_complete(raw);
            let rc = ffi::rbd_aio_get_return_value(raw);
            ffi::rbd_aio_release(raw);
            rc
        }
    }
}

impl Drop for Submitted {
    fn drop(&mut self) {
        if let Some(raw) = self.raw.take() {
            // SAFETY: as in `wait`.
            unsafe {
                ffi::rbd_aio_wait_for_complete(raw);
                ffi::rbd_aio_release(raw);
            }
        }
    }
}
