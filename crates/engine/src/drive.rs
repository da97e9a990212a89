//! How callers get the background work done: the flusher and writeback threads do it and
//! callers wait for them, or (manual mode, `OpenOptions::manual_flusher`) callers do it
//! themselves, inline, one IO at a time and reading no clock, so a seeded simulation replays
//! exactly. Every step that differs by mode is here, the only module that asks `Inner::drive`;
//! the rest of the engine calls these and does not know the mode.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::sync::MutexGuard;

use crate::error::{Error, Result};
use crate::inner::{self, check_usable, Inner};
use crate::log::flusher;
use crate::state::State;
use crate::tunables;
use crate::writeback::batch::{batch, WritebackBuffers};
use crate::writeback::{self, persist_position, writeback_position};

/// A drain, or a flush waiting for lost bypass writes to be written again, fails once
/// background writeback has kept failing for this long (it retries meanwhile).
pub const WRITEBACK_ERROR_PATIENCE: Duration = Duration::from_secs(3);

/// For a waiter on background writeback: how long writeback has kept failing. Writeback
/// retries a failed batch, so a waiter gives up only once it has failed for
/// `WRITEBACK_ERROR_PATIENCE`: an error from before a backing reconnection (or a blip) does not
/// fail a wait its next batch would satisfy.
#[derive(Debug, Default)]
pub struct WritebackPatience {
    failing_since: Option<Instant>,
}

impl WritebackPatience {
    /// Given writeback's current error: whether it has now failed for the whole patience.
    pub fn run_out(&mut self, error: Option<&str>) -> bool {
        if error.is_none() {
            self.failing_since = None;
            return false;
        }
        let since = *self.failing_since.get_or_insert_with(crate::sync::now);
        crate::sync::now().saturating_duration_since(since) >= WRITEBACK_ERROR_PATIENCE
    }
}

/// Starts the flusher and writeback threads (none in manual mode).
pub fn start_threads(inner: &Arc<Inner>) -> Result<Vec<JoinHandle<()>>> {
    let mut threads = Vec::new();
    if !inner.drive.threads() {
        return Ok(threads);
    }
    threads.push(
        inner::spawn_background(
            inner,
            "logcache-flusher",
            "flusher",
            inner::fail_on_panic,
            |i| flusher::run(i),
        )
        .map_err(|e| Error::io("starting the flusher thread", e))?,
    );
    let wb = inner::spawn_background(
        inner,
        "logcache-writeback",
        "writeback",
        inner::fail_on_panic,
        |i| writeback::run(i),
    );
    match wb {
        Ok(t) => threads.push(t),
        Err(e) => {
            inner.state.lock().health.begin_close();
            inner.flusher_wake.notify_all();
            for t in threads {
                let _ = t.join();
            }
            return Err(Error::io("starting the writeback thread", e));
        }
    }
    Ok(threads)
}

/// Manual mode: runs flusher rounds until the queue is empty. A no-op otherwise.
pub fn run_flusher(inner: &Inner) -> Result<()> {
    if inner.drive.inline() {
        flusher::drain_inline(inner, false)?;
    }
    Ok(())
}

/// Returns once every write acknowledged before the call is durable (flush and FUA).
pub fn wait_durable(inner: &Inner) -> Result<()> {
    {
        let st = inner.state.lock();
        check_usable(&st)?;
    }
    wait_durable_closing(inner)
}

/// As `wait_durable`, but also while closing (the close path's final flush).
pub fn wait_durable_closing(inner: &Inner) -> Result<()> {
    durable(inner, false)
}

/// A client's flush point (FLUSH, or after a FUA write): as `wait_durable`, and the writes
/// after it start a new flush epoch. Internal waits (room, drains, bypass IO) are no flush
/// points: they would only split epochs and keep more overwritten copies for writeback.
pub fn flush_point(inner: &Inner) -> Result<()> {
    {
        let st = inner.state.lock();
        check_usable(&st)?;
    }
    durable(inner, true)
}

fn durable(inner: &Inner, is_flush_point: bool) -> Result<()> {
    let mut st = inner.state.lock();
    let target = flusher::want_durable(inner, &mut st)?;
    if is_flush_point {
        // `want_durable` sealed the open chunk in this lock hold: every write that returned
        // before this call is in a sealed chunk, and the next chunk starts a new flush epoch.
        st.epochs.note_flush_point(std::time::SystemTime::now());
    }
    let Some(target) = target else {
        return Ok(());
    };
    if inner.drive.inline() {
        drop(st);
        flusher::sync_inline(inner, target)
    } else {
        flusher::wait_synced(inner, st, target)
    }
}

/// A writer found no room in the log or no free RAM buffer: wait for the flusher (or, in
/// manual mode, do its work here).
pub fn wait_for_room<'a>(
    inner: &'a Inner,
    mut st: MutexGuard<'a, State>,
) -> Result<MutexGuard<'a, State>> {
    st.counters.write_waits += 1;
    if inner.drive.inline() {
        drop(st);
        let mut progressed = flusher::drain_inline(inner, true)?;
        if !progressed {
            // The log is full of dirty blocks: make it durable, write back, then reclaim.
            wait_durable(inner)?;
            let batch = inner.tunables.get(tunables::WRITEBACK_BATCH_BLOCKS) as usize;
            if writeback::step(inner, batch)? > 0 {
                flusher::drain_inline(inner, true)?;
                progressed = true;
            }
        }
        let st = inner.state.lock();
        if !progressed && !st.ring.open().active {
            return Err(Error::NoSpace(
                "the log is full of live data and nothing can be reclaimed".into(),
            ));
        }
        return Ok(st);
    }
    if st.ring.free_buffer_count() == 0 {
        st.counters.write_waits_for_buffers += 1;
    }
    // Two clock reads per wait (a few hundred a second at most), for `write_wait_us`.
    let waited_from = crate::sync::now();
    st.room.space_waiters().enter();
    inner.flusher_wake.notify_one();
    // A log full of dirty blocks needs writeback to make room.
    inner.writeback_wake.notify_one();
    inner.progress.wait(&mut st);
    st.room.space_waiters().leave();
    st.counters.write_wait_us += crate::sync::now()
        .saturating_duration_since(waited_from)
        .as_micros() as u64;
    Ok(st)
}

/// One writeback step of at most `batch_blocks` on the calling thread, with the state lock
/// released meanwhile, in manual mode; `None` when the writeback thread does this work (the
/// caller then waits for its progress). Returns the blocks written back.
pub fn writeback_step_here(
    inner: &Inner,
    st: &mut MutexGuard<'_, State>,
    batch_blocks: usize,
) -> Option<Result<u64>> {
    if !inner.drive.inline() {
        return None;
    }
    Some(crate::sync::unlocked(st, || {
        writeback::step(inner, batch_blocks)
    }))
}

/// Progress of a drain, for a progress bar.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DrainProgress {
    pub dirty_blocks_at_start: u64,
    pub dirty_blocks: u64,
    pub written_back_blocks: u64,
}

/// Writes back everything: returns once no block is dirty and the backing device is synced,
/// calling `progress` a few times a second. Writes that arrive meanwhile are drained too.
pub fn drain(inner: &Inner, mut progress: impl FnMut(DrainProgress)) -> Result<()> {
    let (start, wb0) = {
        let mut st = inner.state.lock();
        st.writeback.drain_requests().enter();
        (st.blocks.dirty_blocks(), st.counters.writeback_blocks)
    };
    let res = (|| {
        let mut patience = WritebackPatience::default();
        let mut bufs = inner.drive.inline().then(|| {
            WritebackBuffers::new(inner.tunables.get(tunables::WRITEBACK_BATCH_BLOCKS) as usize)
        });
        loop {
            // Writeback takes only durable chunks: seal and sync what is in RAM.
            wait_durable(inner)?;
            let mut st = inner.state.lock();
            let p = DrainProgress {
                dirty_blocks_at_start: start,
                dirty_blocks: st.blocks.dirty_blocks(),
                written_back_blocks: st.counters.writeback_blocks - wb0,
            };
            progress(p);
            if st.blocks.dirty_blocks() == 0 {
                let pos = writeback_position(&st);
                if pos > st.writeback.persisted_seq() {
                    persist_position(inner, &mut st, pos)?;
                }
                return Ok(());
            }
            // Inline (`bufs`), the batch's own error fails the drain at once.
            let run_out = patience.run_out(st.writeback.error());
            if let Some(e) = st.writeback.error().filter(|_| bufs.is_some() || run_out) {
                return Err(Error::Io {
                    what: "drain stopped: writeback failed".into(),
                    source: std::io::Error::other(e.to_string()),
                });
            }
            if let Some(bufs) = bufs.as_mut() {
                let batch_blocks = inner.tunables.get(tunables::WRITEBACK_BATCH_BLOCKS) as usize;
                let (st2, res) = batch(inner, st, bufs, batch_blocks);
                if let Err(e) = res {
                    drop(st2);
                    return Err(e);
                }
                continue;
            }
            inner.writeback_wake.notify_one();
            inner.progress.wait_for(&mut st, Duration::from_millis(250));
            st.health.check_failed()?;
        }
    })();
    inner.state.lock().writeback.drain_requests().leave();
    res
}
