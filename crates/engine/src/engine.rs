//! The engine: owns the state, the RAM buffers and the flusher, and exposes block IO.
//!
//! Durability contract (also in `docs/ARCHITECTURE.md`):
//! - `write` returns once the data is in a RAM segment: later reads see it, a crash may lose it.
//! - `flush` returns once every write that returned before it is durable on the cache device.
//! - `write` with `fua` returns once that write is durable.
//! - After a crash, every sector holds either the data of the last write to it that was made
//!   durable, or of a later write; never anything else. A torn chunk write loses that chunk and
//!   the chunks after it in log order, never an earlier one.
//! - Unflushed writes stay in RAM at most about `seal_interval_ms` before the flusher makes them
//!   durable on its own.

use std::sync::atomic::AtomicU32;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::sync::{Condvar, Mutex};

use crate::checkpoints::{self, CheckpointInfo};
use crate::drive::{self, DrainProgress};
use crate::error::{Error, Result};
use crate::export::{self, Export};
use crate::format::{BLOCK_SIZE_BYTES, SECTOR_SIZE_BYTES};
use crate::geometry::Geometry;
use crate::inner::{self, Inner};
use crate::io::aligned::AlignedBuf;
use crate::io::BlockDevice;
use crate::log::checkpoint::{self, SuperblockWriter};
use crate::log::flusher;
use crate::open::{self, recover};
use crate::path::admission::{TurnWake, TURN_WAKE_SLOTS};
use crate::path::read::CachedRead;
use crate::path::{alone, bypass, read, write};
use crate::state::buffers::SegmentBuffers;
use crate::stats::Stats;
use crate::status::{self, Extent};
use crate::tunables::{self, TunableValue, Tunables};
use crate::writeback;

/// Default total size of the RAM segment buffers (the seed's 64 MiB).
pub const RAM_BUFFER_DEFAULT_BYTES: u64 = 64 << 20;
/// Default `OpenOptions::clean_holes_per_backing_sync`: under write-through load at queue
/// depth 16 on the emulated HDD, about one backing sync per 256 writes instead of one per ~7.
pub const CLEAN_HOLES_PER_BACKING_SYNC: u64 = 256;
/// Default `OpenOptions::promote_pause_after_relocation`: under sustained write load the
/// relocator runs every ring pass (seconds), so a pause of several passes keeps promotions off
/// for as long as the load lasts instead of switching them on and off each pass.
pub const PROMOTE_PAUSE_AFTER_RELOCATION: Duration = Duration::from_secs(10);

mod reserved_write;
pub use reserved_write::{WriteReservation, RESERVED_WRITE_MAX_BYTES};

#[cfg(test)]
mod bypass_room_race_tests;
#[cfg(test)]
mod close_race_tests;
#[cfg(test)]
mod pause_cut_tests;
#[cfg(test)]
mod ram_cache_tests;
#[cfg(test)]
mod room_wake_tests;
#[cfg(test)]
mod round_wake_tests;
#[cfg(test)]
mod sync_catch_up_tests;
#[cfg(test)]
mod test_setup;
#[cfg(test)]
mod thread_start_tests;

#[derive(Clone, Debug)]
pub struct OpenOptions {
    /// Total bytes of RAM segment buffers (at least two segments' worth is always allocated).
    pub ram_buffer_bytes: u64,
    /// Periodic seal interval; `None` keeps the persisted value (or the default). `Some(0)`
    /// turns the periodic seal off.
    pub seal_interval_ms: Option<u32>,
    /// Run no background thread: flushing happens inside `flush`, `run_flusher` and writers
    /// that need room. Deterministic, for simulation tests.
    pub manual_flusher: bool,
    /// Benchmarks only: false writes dirty blocks back in log order, one IO per block, to
    /// measure what sorting buys.
    pub writeback_sorted: bool,
    /// How long read misses are not promoted after the relocator last had to move dirty
    /// blocks (the log is congested; see `promote::decide`). With `manual_flusher`,
    /// which reads no clock, a nonzero pause lasts until the engine is reopened.
    pub promote_pause_after_relocation: Duration,
    /// The flusher syncs the backing device before writing a chunk whose clean entries no sync
    /// covers only once this many clean entries were written as holes since the last backing
    /// sync (0: before every such chunk). Fewer syncs keep a backing disk's queue free of
    /// barriers under write-through load; a hole costs only that block's copy after a crash.
    pub clean_holes_per_backing_sync: u64,
    /// The RAM cache's size in bytes (`path::hot`), whatever `ram_cache_mib` says, until that
    /// tunable is set: tests give a tiny one, so its blocks are evicted and replaced. `None`:
    /// the tunable's size.
    pub ram_cache_bytes: Option<u64>,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            ram_buffer_bytes: RAM_BUFFER_DEFAULT_BYTES,
            seal_interval_ms: None,
            manual_flusher: false,
            writeback_sorted: true,
            promote_pause_after_relocation: PROMOTE_PAUSE_AFTER_RELOCATION,
            clean_holes_per_backing_sync: CLEAN_HOLES_PER_BACKING_SYNC,
            ram_cache_bytes: None,
        }
    }
}

/// A cache opened for IO. Cloning gives another handle to the same engine.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
    /// The flusher and writeback threads.
    threads: Arc<Mutex<Vec<JoinHandle<()>>>>,
    /// Keeps an export's blocks as they were at its moment (every change passes it).
    hold: Arc<export::Hold>,
}

impl Engine {
    /// Opens a formatted cache: checks the backing device is the one it was formatted for,
    /// recovers the log and starts the flusher.
    pub fn open(
        cache: Arc<dyn BlockDevice>,
        backing: Arc<dyn BlockDevice>,
        opts: OpenOptions,
    ) -> Result<Engine> {
        let started = Instant::now();
        // Every sync of the backing device, recovery's included, is counted (`backing.rs`).
        let backing = Arc::new(crate::backing::Backing::new(backing));
        let sb = checkpoint::read(&*cache)?.ok_or_else(|| {
            Error::NotFormatted(format!(
                "{} holds no logcache superblock; format it first",
                cache.describe()
            ))
        })?;
        open::check_cache_size(&sb, &*cache)?;
        let record = open::check_backing(&sb, &*backing)?;
        let geo = Geometry::from_superblock(&sb);
        let tunables = Tunables::from_persisted(&sb.tunables);
        let consistent = tunables.get(tunables::WRITEBACK_ORDER) == tunables::ORDER_CONSISTENT;
        backing.set_read_ahead_bytes(tunables.get(tunables::BACKING_READ_AHEAD_KIB) * 1024);
        let mut checkpoint_report = crate::stats::RecoveryReport::default();
        let mut loaded = checkpoints::load(&*cache, &sb, &mut checkpoint_report)?;
        let mut recovered = recover::run(&*cache, &geo, &sb, consistent, &mut |h, entries| {
            checkpoints::note_recovered_chunk(&mut loaded.tracked, h, entries)
        })?;
        recovered.report.checkpoint_pages_unreadable =
            checkpoint_report.checkpoint_pages_unreadable;
        recovered.report.checkpoint_table_unreadable =
            checkpoint_report.checkpoint_table_unreadable;
        checkpoints::clamp_starts(&*cache, &mut loaded, recovered.last_seq + 1)?;
        let segment_bytes = geo.segment_size_bytes;
        let buffer_count = (opts.ram_buffer_bytes / segment_bytes)
            .clamp(2, geo.segment_count - 1)
            .min(u32::MAX as u64 - 1) as u32;
        let buffers = SegmentBuffers::new(buffer_count, segment_bytes);
        if let Some(ms) = opts.seal_interval_ms {
            tunables.set(tunables::SEAL_INTERVAL_MS, ms as u64);
        }
        let epoch = sb.checkpoint.epoch + 1;
        let last_seq = recovered.last_seq;
        // Zero ranges a crash may have kept from the backing device (between logging and
        // applying them): apply them again, in log order, before anything can write there. In
        // flush-epoch order that waits for the older epochs' writeback, so it happens below,
        // once writeback runs; otherwise here, at once.
        let deferred_zeros = if consistent {
            recovered.zero_ranges.clone()
        } else {
            Vec::new()
        };
        if !recovered.zero_ranges.is_empty() && !consistent {
            for z in &recovered.zero_ranges {
                bypass::reapply_zeros(&*backing, z)?;
            }
            recovered.write_back_distrusted(&geo, &*cache, &*backing)?;
            backing
                .flush()
                .map_err(|e| Error::io(format!("syncing {}", backing.describe()), e))?;
            recovered.distrusted_written_back();
        }
        let superblock = SuperblockWriter::new(cache.clone(), sb);
        // Before anything new is written: the new epoch and the cut, so chunks a crash left
        // after `last_seq` can never rejoin the log. The sync also makes durable every chunk
        // recovery read (they may have been only in the page cache).
        // Zero ranges still to apply keep the mark before them, so a crash meanwhile applies
        // them again.
        let zero_applied_seq = deferred_zeros.first().map_or(last_seq, |z| z.seq - 1);
        superblock.begin_session(
            epoch,
            last_seq,
            zero_applied_seq,
            recovered.head_segment_id,
            recovered.head_seq,
        )?;
        recovered.report.zero_ranges_reapplied = recovered.zero_ranges.len() as u64;
        recovered.report.duration_us = started.elapsed().as_micros() as u64;
        let report = recovered.report.clone();
        let mut state = recovered.into_state(
            geo.clone(),
            epoch,
            buffer_count,
            opts.promote_pause_after_relocation,
            tunables.get(tunables::WRITEBACK_ORDER) == tunables::ORDER_CONSISTENT,
            record
                .filter(|r| r.consistent_as_of_unix_ms != 0)
                .map(|r| std::time::UNIX_EPOCH + Duration::from_millis(r.consistent_as_of_unix_ms)),
        );
        state.counters.superblock_writes += 1;
        state.changes.tracked = loaded.tracked;
        let pins = (0..geo.segment_count).map(|_| AtomicU32::new(0)).collect();
        let index_hint = state.blocks.slot_hint();
        let hot = crate::path::hot::HotTier::new(opts.ram_cache_bytes.unwrap_or_else(|| {
            crate::path::hot::size_for_mib(tunables.get(tunables::RAM_CACHE_MIB))
        }));
        let inner = Arc::new_cyclic(|me| Inner {
            me: me.clone(),
            lost: Default::default(),
            geo,
            cache,
            backing,
            state: Mutex::new(state),
            index_hint,
            flusher_wake: Condvar::new(),
            progress: Condvar::new(),
            writeback_wake: Condvar::new(),
            room_turn: TurnWake::new(TURN_WAKE_SLOTS),
            buffers,
            pins,
            hot,
            superblock,
            drive: inner::Drive::new(opts.manual_flusher),
            writeback_sorted: opts.writeback_sorted,
            clean_holes_per_backing_sync: opts.clean_holes_per_backing_sync,
            tunables,
            recovery: report,
            flusher_lock: Mutex::new(()),
            relocate_buf: Mutex::new(AlignedBuf::new(segment_bytes as usize)),
            backing_order: Mutex::new(()),
            last_record: Mutex::new(None),
            record_pending: std::sync::atomic::AtomicBool::new(false),
            bitmaps: loaded.bitmaps,
            #[cfg(test)]
            failpoints: Default::default(),
            alone: std::sync::atomic::AtomicU8::new(alone::NO),
        });
        {
            let mut st = inner.state.lock();
            if !st.ring.open().active {
                st.open_segment(false);
            }
        }
        let threads = drive::start_threads(&inner)?;
        let engine = Engine {
            inner,
            threads: Arc::new(Mutex::new(threads)),
            hold: Arc::default(),
        };
        if let Err(e) = bypass::apply_recovered_zeros(&engine.inner, &deferred_zeros) {
            engine.crash();
            return Err(e);
        }
        Ok(engine)
    }

    /// Size of the disk the cache presents, in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.inner.geo.exported_size_bytes
    }

    /// Reads `buf.len()` bytes at `offset_bytes` (both multiples of 512).
    pub fn read(&self, offset_bytes: u64, buf: &mut [u8]) -> Result<()> {
        self.check_range(offset_bytes, buf.len() as u64)?;
        if !self.alone() {
            match read::read(&self.inner, offset_bytes, buf) {
                Err(_) if self.took_over() => {}
                r => return r,
            }
        }
        alone::read(&self.inner, offset_bytes, buf)
    }

    /// Serving from the backing device alone (the cache device failed with no dirty data):
    /// checked before each request, and again when one fails in the cached path (it was not
    /// acknowledged, so it is tried again there).
    fn alone(&self) -> bool {
        alone::active(&self.inner)
    }

    /// After a request failed in the cached path: whether the backing device alone serves now
    /// (waiting, if the switch is being decided).
    fn took_over(&self) -> bool {
        alone::took_over(&self.inner)
    }

    /// Reads like [`read`](Self::read) if the cache holds every wanted sector and the range is
    /// at most 1 MiB, so only RAM and the cache device are touched; else returns `Ok(false)`
    /// having done nothing (the caller then uses `read`, e.g. on a thread that may wait).
    pub fn read_if_cached(&self, offset_bytes: u64, buf: &mut [u8]) -> Result<bool> {
        self.check_range(offset_bytes, buf.len() as u64)?;
        if self.alone() {
            return Ok(false);
        }
        match read::read_if_cached(&self.inner, offset_bytes, buf) {
            Err(_) if self.took_over() => Ok(false),
            r => r,
        }
    }

    /// Serves each read as [`read_if_cached`](Self::read_if_cached) would, their cache-device
    /// IOs submitted together as one batch; each read's outcome is in its `served`.
    pub fn read_batch_if_cached(&self, reads: &mut [CachedRead<'_>]) {
        let mut tried = false;
        for read in reads.iter_mut() {
            read.served = self
                .check_range(read.offset_bytes, read.buf.len() as u64)
                .map(|()| true);
            tried |= read.served.is_ok();
        }
        if !tried {
            return;
        }
        if self.alone() {
            for read in reads.iter_mut().filter(|r| r.served.is_ok()) {
                read.served = Ok(false);
            }
            return;
        }
        read::read_batch_if_cached(&self.inner, reads);
        // A read that failed in the cached path is tried again on the backing device alone,
        // if that serves now (a bad range keeps its error).
        if reads.iter().any(|r| r.served.is_err()) && self.took_over() {
            for read in reads.iter_mut() {
                let in_range = self
                    .check_range(read.offset_bytes, read.buf.len() as u64)
                    .is_ok();
                if read.served.is_err() && in_range {
                    read.served = Ok(false);
                }
            }
        }
    }

    /// Writes `data` at `offset_bytes` (both multiples of 512). With `fua`, returns once durable.
    /// In write-through mode it returns once the backing device has the data too; in
    /// write-around mode the data goes to the backing device only.
    pub fn write(&self, offset_bytes: u64, data: &[u8], fua: bool) -> Result<()> {
        self.check_range(offset_bytes, data.len() as u64)?;
        if !self.alone() {
            match self.write_cached(offset_bytes, data, fua) {
                Err(_) if self.took_over() => {}
                r => return r,
            }
        }
        alone::write(&self.inner, offset_bytes, data, fua)
    }

    fn write_cached(&self, offset_bytes: u64, data: &[u8], fua: bool) -> Result<()> {
        {
            let _pass = self.hold.pass(&self.inner, offset_bytes, data.len() as u64);
            self.write_mode(offset_bytes, data)?;
        }
        if fua {
            self.inner.state.lock().counters.fua_writes += 1;
            self.make_durable()?;
        }
        Ok(())
    }

    fn write_mode(&self, offset_bytes: u64, data: &[u8]) -> Result<()> {
        match self.inner.tunables.get(tunables::CACHE_MODE) {
            tunables::MODE_WRITE_THROUGH => bypass::write_through(&self.inner, offset_bytes, data),
            tunables::MODE_WRITE_AROUND => bypass::write_around(&self.inner, offset_bytes, data),
            _ => write::write(&self.inner, offset_bytes, data, true),
        }
    }

    /// The log, and the backing device if writes bypassed the log since its last sync.
    fn make_durable(&self) -> Result<()> {
        drive::flush_point(&self.inner)?;
        bypass::sync_backing(&self.inner)
    }

    /// Returns once every write that returned before this call is durable.
    pub fn flush(&self) -> Result<()> {
        if !self.alone() {
            self.inner.state.lock().counters.flushes += 1;
            match self.make_durable() {
                Err(_) if self.took_over() => {}
                r => return r,
            }
        }
        alone::flush(&self.inner)
    }

    /// Makes `len_bytes` bytes at `offset_bytes` read as zeros (both multiples of 512), in every mode:
    /// cached copies are dropped, and the backing device gets the zeros (its own write-zeroes,
    /// a hole where it can) in order with the writes around them. With `fua`, returns once
    /// durable.
    pub fn write_zeroes(&self, offset_bytes: u64, len_bytes: u64, fua: bool) -> Result<()> {
        self.check_range(offset_bytes, len_bytes)?;
        if len_bytes == 0 {
            return Ok(());
        }
        if !self.alone() {
            let r = {
                let _pass = self.hold.pass(&self.inner, offset_bytes, len_bytes);
                bypass::zero(&self.inner, offset_bytes, len_bytes, |off, zeros| {
                    self.write_mode(off, zeros)
                })
            }
            .and_then(|()| self.durable_if(fua));
            match r {
                Err(_) if self.took_over() => {}
                r => return r,
            }
        }
        alone::write_zeroes(&self.inner, offset_bytes, len_bytes, fua)
    }

    /// TRIM, a hint: the range's data is no longer needed, and until it is written again it
    /// reads as data written there before, zeros, or what the backing device's discard left
    /// (never data never written there). Cached copies of its whole blocks are dropped, dirty
    /// ones too, and the backing device gets a discard in order with the writes around it.
    pub fn discard(&self, offset_bytes: u64, len_bytes: u64, fua: bool) -> Result<()> {
        self.check_range(offset_bytes, len_bytes)?;
        if len_bytes == 0 {
            return Ok(());
        }
        if !self.alone() {
            let r = {
                let _pass = self.hold.pass(&self.inner, offset_bytes, len_bytes);
                bypass::trim(&self.inner, offset_bytes, len_bytes)
            }
            .and_then(|()| self.durable_if(fua));
            match r {
                Err(_) if self.took_over() => {}
                r => return r,
            }
        }
        alone::discard(&self.inner, offset_bytes, len_bytes, fua)
    }

    fn durable_if(&self, fua: bool) -> Result<()> {
        if fua {
            self.make_durable()?;
        }
        Ok(())
    }

    /// Block status of `len_bytes` at `offset_bytes` (any alignment, inside the disk): extents
    /// that are data or holes reading as zeros, into `out` (see [`status`](crate::status)). They
    /// cover a prefix of the range, at least one byte, in at most `max_extents` extents.
    pub fn block_status(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
        max_extents: usize,
        out: &mut Vec<Extent>,
    ) -> Result<()> {
        assert!(len_bytes > 0 && max_extents > 0, "empty block status query");
        self.check_within(offset_bytes, len_bytes)?;
        if !self.alone() {
            match status::block_status(&self.inner, offset_bytes, len_bytes, max_extents, out) {
                Err(_) if self.took_over() => {}
                r => return r,
            }
        }
        alone::block_status(len_bytes, out);
        Ok(())
    }

    /// Manual mode: runs flusher rounds until the queue is empty. A no-op otherwise.
    pub fn run_flusher(&self) -> Result<()> {
        drive::run_flusher(&self.inner)
    }

    /// Seals the open chunk if its oldest write is older than the seal interval (the flusher
    /// thread does this on its own; manual-mode tests call it).
    pub fn seal_if_due(&self, now: Instant) {
        flusher::seal_if_due(&self.inner, &mut self.inner.state.lock(), now);
    }

    /// Stops IO, makes everything durable and writes a clean checkpoint, so the next open is
    /// fast. Other handles to the engine get `Error::Closed` afterwards.
    pub fn close(&self) -> Result<()> {
        {
            let mut st = self.inner.state.lock();
            if st.health.closing() {
                return Err(Error::Closed);
            }
            st.health.begin_close();
            if let Err(e) = st.health.check_failed() {
                drop(st);
                self.stop_thread();
                if self.took_over() {
                    // Nothing to write to the cache: the backing device holds the disk (but
                    // for the lost sectors, which status and the label report).
                    return alone::sync(&self.inner);
                }
                return Err(e);
            }
            // Seal and ask for the final sync in the same lock hold as `begin_close`: a
            // flusher thread that sees `closing` with no sync asked exits, and a chunk sealed
            // after that would wait for it forever (a hang seen in `model.rs`). An error here
            // is met again, and returned, by the wait below.
            let _ = flusher::want_durable(&self.inner, &mut st);
        }
        crate::failpoint::close_between_holds(&self.inner);
        // Relocation may queue chunks of its own while we wait; repeat until nothing is left.
        let res = loop {
            if let Err(e) = drive::wait_durable_closing(&self.inner) {
                break Err(e);
            }
            let st = self.inner.state.lock();
            if st.ring.queue_is_empty() && st.seqs.synced() == st.seqs.last_sealed() {
                break Ok(());
            }
        };
        self.stop_thread();
        res?;
        let (end_seq, head, head_seq, wb_seq) = {
            let st = self.inner.state.lock();
            assert!(st.ring.queue_is_empty());
            let wb_seq = writeback::writeback_position(&st).max(st.writeback.persisted_seq());
            (
                st.seqs.last_sealed(),
                st.ring.head_segment_id(),
                st.head_seq(),
                wb_seq,
            )
        };
        self.inner
            .superblock
            .close_clean(end_seq, head, head_seq, wb_seq)
    }

    fn stop_thread(&self) {
        {
            let mut st = self.inner.state.lock();
            st.health.begin_close();
        }
        self.inner.flusher_wake.notify_all();
        self.inner.writeback_wake.notify_all();
        let threads = std::mem::take(&mut *self.threads.lock());
        for t in threads {
            // A panicking thread already recorded nothing more useful than its message.
            let _ = t.join();
        }
    }

    /// Simulates a crash of this process for tests: stops the flusher without sealing or
    /// writing a checkpoint. RAM-only data is lost, as it would be.
    pub fn crash(self) {
        {
            let mut st = self.inner.state.lock();
            st.health.crash();
        }
        self.stop_thread();
    }

    /// Writes every dirty block back to the backing device and syncs it; returns once none is
    /// dirty, calling `progress` a few times a second. Writes arriving meanwhile are drained
    /// too, so under a steady write load this returns when writeback has caught up.
    pub fn drain(&self, progress: impl FnMut(DrainProgress)) -> Result<()> {
        if self.alone() {
            return alone::drain(&self.inner); // nothing is dirty
        }
        self.check_usable()?;
        drive::drain(&self.inner, progress)
    }

    /// Manual mode (tests): one writeback batch of up to `max_blocks` durable dirty blocks
    /// (at most 8,192, `writeback_batch_blocks`' largest value), regardless of policy. Returns
    /// how many blocks became clean.
    pub fn writeback_step(&self, max_blocks: usize) -> Result<u64> {
        self.check_usable()?;
        writeback::step(&self.inner, max_blocks)
    }

    /// Creates checkpoint `name`: from now on every block that changes is tracked (see
    /// docs/CHECKPOINTS.md). Returns once it is durable. A duplicate name, a name that is not
    /// 1 to 64 bytes without spaces, '/' or ':', a full table, and a cache formatted without
    /// room for checkpoints are errors that say what to do.
    pub fn checkpoint_create(&self, name: &str) -> Result<CheckpointInfo> {
        self.check_usable()?;
        checkpoints::create(&self.inner, name, None).map(|(info, _)| info)
    }

    /// Begins an export of the changes since checkpoint `since` as of one moment: creates
    /// checkpoint `name` (the moment) and, until the returned [`Export`] is dropped, keeps in
    /// RAM the moment's copy of each block still to export that a client changes (at most
    /// `hold_limit_bytes`; past that the export fails, the disk never does). One at a time.
    pub fn export_begin(&self, name: &str, since: &str, hold_limit_bytes: u64) -> Result<Export> {
        self.check_usable()?;
        export::begin(&self.inner, &self.hold, name, since, hold_limit_bytes)
    }

    /// Deletes checkpoint `name`, durably.
    pub fn checkpoint_delete(&self, name: &str) -> Result<()> {
        self.check_usable()?;
        checkpoints::delete(&self.inner, name)
    }

    /// Every checkpoint with the bytes changed since it, oldest first.
    pub fn checkpoints(&self) -> Vec<CheckpointInfo> {
        checkpoints::list(&self.inner)
    }

    /// The changed and unchanged runs of checkpoint `name` from `offset_bytes` for up to
    /// `len_bytes` (inside the disk), as (length in bytes, changed), at most `max_runs`; they
    /// cover a prefix of the range, at least one byte. Granularity 4 KiB.
    pub fn checkpoint_changes(
        &self,
        name: &str,
        offset_bytes: u64,
        len_bytes: u64,
        max_runs: usize,
    ) -> Result<Vec<(u64, bool)>> {
        assert!(len_bytes > 0 && max_runs > 0, "empty checkpoint query");
        self.check_within(offset_bytes, len_bytes)?;
        let runs = checkpoints::changed_runs(&self.inner, name, offset_bytes, len_bytes, max_runs)?;
        // Served from the backing device alone, changes are not tracked (the checkpoints were
        // on the cache device): an answer would leave them out, and a backup built on it would
        // miss them. The switch only moves forward, so an answer made before it is complete.
        if alone::given_up(&self.inner) {
            return Err(Error::Export(format!(
                "checkpoint {name:?} no longer tracks changes: the cache device failed and the disk is served from the backing device alone, where changes are not tracked (the checkpoints were on the cache device); take a full backup"
            )));
        }
        Ok(runs)
    }

    /// Every tunable with its current value, default and range.
    pub fn tunables(&self) -> Vec<TunableValue> {
        self.inner.tunables.list()
    }

    /// Changes a tunable while serving and persists it in the superblock, so a restart keeps
    /// it. Unknown names, values out of range and tunables that cannot change online are
    /// `InvalidArgument` errors that say what is allowed.
    pub fn set_tunable(&self, name: &str, value: &str) -> Result<()> {
        let (index, value) = tunables::parse(name, value)?;
        if !tunables::SPECS[index].online {
            return Err(Error::InvalidArgument(format!(
                "{name} cannot change while the cache is served; stop it and pass --set {name}=... to serve"
            )));
        }
        self.set_tunable_value(index, value)
    }

    fn set_tunable_value(&self, index: usize, value: u64) -> Result<()> {
        self.check_usable()?;
        let old = self.inner.tunables.get(index);
        self.inner.tunables.set(index, value);
        let persisted = self.inner.tunables.to_persisted();
        if let Err(e) = self.inner.superblock.set_tunables(persisted) {
            // As for every superblock writer: the copy on the device may be torn now.
            return Err(inner::fail_cache(&self.inner, self.inner.state.lock(), e));
        }
        {
            let mut st = self.inner.state.lock();
            st.counters.superblock_writes += 1;
            let consistent =
                self.inner.tunables.get(tunables::WRITEBACK_ORDER) == tunables::ORDER_CONSISTENT;
            st.epochs.set_consistent(consistent);
        }
        if index == tunables::BACKING_READ_AHEAD_KIB {
            self.inner.backing.set_read_ahead_bytes(value * 1024);
        }
        if index == tunables::RAM_CACHE_MIB && value != old {
            self.inner.hot.resize(crate::path::hot::size_for_mib(value));
        }
        // The flusher's sleep depends on the seal interval.
        self.inner.flusher_wake.notify_all();
        if index == tunables::CACHE_MODE
            && old == tunables::MODE_WRITE_BACK
            && value != tunables::MODE_WRITE_BACK
        {
            // Leaving write-back: new writes already go the new way; write back what is dirty.
            self.inner.writeback_wake.notify_all();
            drive::drain(&self.inner, |_| {})?;
        }
        Ok(())
    }

    /// The cache mode in force.
    pub fn mode(&self) -> &'static str {
        tunables::MODE_NAMES[self.inner.tunables.get(tunables::CACHE_MODE) as usize]
    }

    fn check_usable(&self) -> Result<()> {
        let st = self.inner.state.lock();
        inner::check_usable(&st)
    }

    /// The sectors lost with the cache device, as (first sector, count) runs, while serving
    /// from the backing device alone: reads touching them fail (tests check it).
    #[doc(hidden)]
    pub fn lost_runs(&self) -> Vec<(u64, u64)> {
        self.inner.lost.runs()
    }

    /// The runs lost when the cache device failed (see [`lost_runs`](Self::lost_runs)).
    #[doc(hidden)]
    pub fn lost_at_failure_runs(&self) -> Vec<(u64, u64)> {
        self.inner.lost.at_failure_runs()
    }

    /// Pins held on segments by reads and relocation under way (0 when nothing is in
    /// flight): tests use it to show a failed read left no pin behind.
    #[doc(hidden)]
    pub fn segment_pins(&self) -> u64 {
        let pins = &self.inner.pins;
        pins.iter()
            .map(|p| u64::from(p.load(std::sync::atomic::Ordering::Acquire)))
            .sum()
    }

    pub fn stats(&self) -> Stats {
        let st = self.inner.state.lock();
        let g = &self.inner.geo;
        let mut counters = st.counters.clone();
        counters.backing_syncs_waited = self.inner.backing.syncs_waited();
        counters.read_hits_ram_cache = self.inner.hot.hits();
        counters.read_hits_ram_cache_large = self.inner.hot.large_hits();
        counters.ram_cache_second_touch_blocks = self.inner.hot.large_admitted();
        counters.ram_cache_first_touch_blocks = self.inner.hot.large_first_touches();
        counters.ram_cache_refill_blocks = self.inner.hot.large_refilled();
        counters.ram_cache_write_blocks = self.inner.hot.written_blocks();
        Stats {
            counters,
            recovery: self.inner.recovery.clone(),
            exported_size_bytes: g.exported_size_bytes,
            segment_size_bytes: g.segment_size_bytes,
            segment_count: g.segment_count,
            segments_in_use: st.ring.segments_in_use(),
            cache_blocks: g.cache_block_count() as u64,
            cached_blocks: st.blocks.cached_blocks(),
            dirty_blocks: st.blocks.dirty_blocks(),
            writeback_rate_blocks_per_s: st.writeback.rate_blocks_per_s(),
            writeback_seq: st.writeback.persisted_seq(),
            writeback_error: st.writeback.error().map(str::to_string),
            writeback_order: tunables::ORDER_NAMES
                [self.inner.tunables.get(tunables::WRITEBACK_ORDER) as usize],
            backing_consistent_as_of_unix_ms: st
                .backing_consistent_as_of(std::time::SystemTime::now())
                .map(|t| {
                    t.duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_millis() as u64)
                }),
            writeback_lag_bytes: st.blocks.dirty_blocks() * BLOCK_SIZE_BYTES,
            ram_buffers: self.inner.buffers.count(),
            ram_buffers_free: st.ring.free_buffer_count(),
            ram_buffer_bytes: self.inner.buffers.memory_bytes() as u64,
            written_seq: st.seqs.written(),
            synced_seq: st.seqs.synced(),
            next_seq: st.seqs.next(),
            head_segment_id: st.ring.head_segment_id(),
            epoch: st.seqs.epoch(),
            index_memory_bytes: st.blocks.memory_bytes(),
            zero_ranges: st.zeros.range_count() as u64,
            zero_blocks_forgotten: st.zeros.forgotten_blocks(),
            failed: st
                .health
                .failed()
                .filter(|_| !self.alone())
                .map(|f| st.health.cache_failure().unwrap_or_else(|| f.to_string())),
            cache_failed: st.health.cache_failure(),
            serving_alone: self.alone(),
            lost_bytes: self.inner.lost.lost_bytes(),
            lost_at_failure_bytes: self.inner.lost.at_failure_bytes(),
            mode: tunables::MODE_NAMES[self.inner.tunables.get(tunables::CACHE_MODE) as usize],
            read_cache: self.inner.tunables.get(tunables::READ_CACHE) != 0,
            segments_in_ram: st.ring.ram_segment_count(),
            segments_on_disk: st.ring.segments_in_use() - st.ring.ram_segment_count(),
            segments_free: st.ring.free_segments(),
            ram_cache_bytes: self.inner.hot.capacity_bytes(),
            ram_cache_blocks: self.inner.hot.held_blocks(),
        }
    }

    fn check_range(&self, offset_bytes: u64, len_bytes: u64) -> Result<()> {
        if !offset_bytes.is_multiple_of(SECTOR_SIZE_BYTES)
            || !len_bytes.is_multiple_of(SECTOR_SIZE_BYTES)
        {
            return Err(Error::InvalidArgument(format!(
                "offset {offset_bytes} and length {len_bytes} must be multiples of {SECTOR_SIZE_BYTES}"
            )));
        }
        self.check_within(offset_bytes, len_bytes)
    }

    /// The range lies inside the disk (any alignment: block status and checkpoint queries).
    fn check_within(&self, offset_bytes: u64, len_bytes: u64) -> Result<()> {
        match offset_bytes.checked_add(len_bytes) {
            Some(end) if end <= self.size_bytes() => Ok(()),
            _ => Err(Error::InvalidArgument(format!(
                "range {offset_bytes}+{len_bytes} runs past the end of the {}-byte disk",
                self.size_bytes()
            ))),
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // The last user handle going away without close() stops the flusher: an unclean stop,
        // which the next open recovers from like a crash.
        if Arc::strong_count(&self.threads) == 1 {
            self.stop_thread();
        }
    }
}
