//! What every engine thread shares (`Inner`), and the helpers every layer above the state
//! needs: refusing IO once the engine failed or closes, and marking it failed (the one place).

use std::sync::atomic::AtomicU32;
use std::sync::Arc;
use std::time::Instant;

use crate::sync::{Condvar, Mutex, MutexGuard};

use crate::error::{Error, Result};
use crate::geometry::Geometry;
use crate::io::aligned::AlignedBuf;
use crate::io::BlockDevice;
use crate::log::checkpoint::SuperblockWriter;
use crate::state::buffers::SegmentBuffers;
use crate::state::State;
use crate::stats::RecoveryReport;
use crate::tunables::{self, Tunables};

pub(crate) struct Inner {
    pub geo: Geometry,
    pub cache: Arc<dyn BlockDevice>,
    /// The backing device, its syncs counted (`backing.rs`).
    pub backing: Arc<crate::backing::Backing>,
    pub state: Mutex<State>,
    /// The index's slot table (fixed for the engine's life), for the write path's prefetch
    /// before it takes the state lock.
    pub index_hint: crate::index::SlotHint,
    /// Wakes the flusher (work queued, sync wanted, closing).
    pub flusher_wake: Condvar,
    /// Wakes writers waiting for room and flushes waiting for a sync.
    pub progress: Condvar,
    /// Wakes the writeback thread (drain requested, closing, writers short of room).
    pub writeback_wake: Condvar,
    /// Wakes writers queued for room when the turn passes (`admission`).
    pub room_turn: crate::path::admission::TurnWake,
    pub buffers: SegmentBuffers,
    /// Per slot: readers currently reading blocks of this segment from the cache device.
    pub pins: Vec<AtomicU32>,
    /// Copies of cache-device blocks small reads verified (`path::hot`; `ram_cache_mib`).
    pub hot: crate::path::hot::HotTier,
    pub superblock: SuperblockWriter,
    /// Background threads, or manual (deterministic) mode.
    pub drive: Drive,
    /// `OpenOptions::writeback_sorted`.
    pub writeback_sorted: bool,
    /// `OpenOptions::clean_holes_per_backing_sync`.
    pub clean_holes_per_backing_sync: u64,
    pub tunables: Tunables,
    pub recovery: RecoveryReport,
    /// Serialises inline flusher rounds in manual mode.
    pub flusher_lock: Mutex<()>,
    /// The relocator's segment-sized read buffer, allocated once (only the flusher uses it).
    pub relocate_buf: Mutex<AlignedBuf>,
    /// Held by a writeback batch from collecting its blocks until they are marked clean, and
    /// by a zero range from logging it until the backing device is zeroed: so stale dirty
    /// data in flight can never land on the backing device after the zeros. Taken before the
    /// state lock, never while holding it.
    pub backing_order: Mutex<()>,
    /// When the writeback record was last written to the backing label and the lag it
    /// recorded (threads mode); held across each record write, which it serialises
    /// (`writeback::record`). Taken without the state lock.
    pub last_record: Mutex<Option<(Instant, u64)>>,
    /// A record was due but paced off: the writeback thread writes it once the pace allows.
    pub record_pending: std::sync::atomic::AtomicBool,
    /// Checkpoint persistence; `None` for a cache formatted without room for checkpoints.
    pub bitmaps: Option<crate::bitmaps::Bitmaps>,
    /// Unit tests stop threads here to force interleavings (`failpoint`); absent otherwise.
    #[cfg(test)]
    pub failpoints: crate::failpoint::Failpoints,
    /// Whether requests go to the backing device alone (`path::alone`: `NO`, `DECIDING`,
    /// `YES`, `REFUSED`); changed under the state lock, only away from `NO` and `DECIDING`.
    pub alone: std::sync::atomic::AtomicU8,
    /// Sectors whose newest data was lost with the cache device (`path::lost`): taken when
    /// the engine goes on from the backing device alone.
    pub lost: crate::path::lost::Lost,
    /// This `Inner`, for the thread that gives up a failed cache device (`path::alone`).
    pub me: std::sync::Weak<Inner>,
}

impl Inner {
    pub fn seal_interval_ms(&self) -> u64 {
        self.tunables.get(tunables::SEAL_INTERVAL_MS)
    }
}

/// How background work runs: on the flusher and writeback threads, or (manual mode,
/// `OpenOptions::manual_flusher`) inline on the callers' threads, one IO at a time and reading
/// no clock, so a seeded simulation replays exactly. The one reader of the flag: the values
/// that differ by mode are its methods, and the steps that differ by mode are `drive.rs`'s,
/// the only module that asks `threads` / `inline`.
#[derive(Clone, Copy, Debug)]
pub struct Drive {
    manual: bool,
}

impl Drive {
    pub fn new(manual: bool) -> Drive {
        Drive { manual }
    }

    /// Whether the flusher and writeback threads run.
    pub fn threads(&self) -> bool {
        !self.manual
    }

    /// Whether callers that need the flusher's or writeback's work do it themselves.
    pub fn inline(&self) -> bool {
        self.manual
    }

    /// The current time, or `None` in manual mode.
    pub fn clock(&self) -> Option<Instant> {
        (!self.manual).then(crate::sync::now)
    }

    /// Backing writes a writeback batch keeps in flight: one in manual mode, so a seeded run
    /// replays the same backing-device IO sequence.
    pub fn writeback_io_depth(&self, tunables: &Tunables) -> usize {
        if self.manual {
            1
        } else {
            tunables.get(tunables::WRITEBACK_IO_DEPTH) as usize
        }
    }
}

/// Refuses IO once the engine failed or is closing.
pub fn check_usable(st: &State) -> Result<()> {
    st.health.check_usable()
}

/// Marks the engine failed with `msg` (the first failure's message is kept), counts the
/// error and wakes every waiter so it sees the failure. The one way the engine fails.
pub fn mark_failed(inner: &Inner, st: &mut State, msg: String) {
    st.health.fail(msg);
    st.counters.io_errors += 1;
    inner.progress.notify_all();
}

/// As `mark_failed`, for an error of the cache device itself (a log write or sync, a superblock,
/// checkpoint or writeback-position write, a dirty block it cannot read back). If it is the
/// first failure, the engine goes on from the backing device alone (`path::alone`; threads mode
/// only, manual-mode tests keep the plain failure; a device out of room with dirty data just
/// fails, its data intact): every acknowledged write not dirty in this
/// same lock hold is on the backing device, and no dirty data can come after (every write path
/// checks for failure in the hold that adds it); the dirty sectors are the lost ones.
pub fn fail_cache(inner: &Inner, mut st: MutexGuard<'_, State>, e: Error) -> Error {
    fail_cache_held(inner, &mut st, &e);
    drop(st);
    e
}

/// As `fail_cache`, keeping the lock.
pub fn fail_cache_held(inner: &Inner, st: &mut State, e: &Error) {
    let first = st.health.fail_cache(e.to_string());
    // A cache device out of room (a full file system under a cache file) still holds every
    // dirty block, readable: the operator can copy it somewhere with room and serve the copy
    // (README), so the engine just fails rather than give that data up.
    let full = matches!(e, Error::Io { source, .. }
        if matches!(source.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT | libc::EFBIG)));
    let gives_up = st.blocks.dirty_blocks() == 0 || !full;
    let alone = first && gives_up && inner.drive.threads();
    if alone {
        crate::path::alone::deciding(inner);
    }
    st.counters.io_errors += 1;
    inner.progress.notify_all();
    if alone {
        // On a thread of its own: this one may hold `backing_order`, which the switch waits for.
        crate::path::alone::start_take_over(inner, st);
    }
}

/// Spawns background thread `thread_name` (`what` in messages: "flusher", "writeback") with
/// its whole body, its start included (the simulation's start wait), under `run_background`:
/// a panic anywhere in it fails the engine with its message, so status reports it. A thread
/// whose start panicked outside that used to die with the engine still "healthy".
pub fn spawn_background(
    inner: &Arc<Inner>,
    thread_name: &str,
    what: &'static str,
    on_panic: fn(&Inner, &mut State, String),
    body: impl FnOnce(&Arc<Inner>) + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let i = inner.clone();
    let start = crate::sync::Start::begin();
    let panic_at_start = crate::failpoint::panics_at_start(thread_name);
    std::thread::Builder::new()
        .name(thread_name.into())
        .spawn(move || {
            run_background(&i, what, on_panic, move |i| {
                // Whether the simulation's power was cut before it started: the thread's
                // first step finds the engine failed (or its IO failing) then anyway.
                let _ = start.wait();
                assert!(
                    !panic_at_start,
                    "failpoint: the {what} thread panics at its start"
                );
                body(i)
            })
        })
}

/// `spawn_background`'s `on_panic` for threads whose panic leaves no other duty undone: the
/// engine fails with the message, unless it already failed (the first cause is kept).
pub fn fail_on_panic(inner: &Inner, st: &mut State, why: String) {
    if !st.health.is_failed() {
        mark_failed(inner, st, why);
    }
}

/// Runs a background thread's body. A panic calls `on_panic` with its message under the state
/// lock (failing the engine) before unwinding: a thread that died quietly would leave every
/// flush and every writer waiting for room waiting forever, with status saying all is well.
fn run_background(
    inner: &Arc<Inner>,
    what: &str,
    on_panic: fn(&Inner, &mut State, String),
    body: impl FnOnce(&Arc<Inner>),
) {
    let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(inner))) else {
        return;
    };
    let msg = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".into());
    let mut st = inner.state.lock();
    on_panic(inner, &mut st, format!("the {what} thread panicked: {msg}"));
    assert!(
        st.health.is_failed(),
        "a background thread's panic fails the engine"
    );
    drop(st);
    inner.progress.notify_all();
    inner.flusher_wake.notify_all();
    inner.writeback_wake.notify_all();
    std::panic::resume_unwind(panic);
}
