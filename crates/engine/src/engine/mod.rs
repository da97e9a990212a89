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

mod admission;
mod buffers;
mod checkpoint;
mod create;
mod direct;
mod flusher;
pub mod geometry;
mod inflight;
mod inspect;
mod meta_prefetch;
mod read;
mod reclaim;
mod recover;
mod state;
pub mod stats;
mod streams;
pub mod tunables;
mod write;
mod writeback;

use std::sync::atomic::AtomicU32;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

pub use self::create::{format, FormatOptions};
pub use self::inspect::{
    check, dump, kind_name, BackingReport, BadBlock, BadChunk, CheckReport, ChunkDump, CopyState,
    DumpReport, Finding, Layout, LogEnd, LogReport, Reject, SegmentDump, Severity, SuperblockCopy,
    TunableReport, WalkStop,
};
pub use self::stats::{Counters, RecoveryReport, Stats};
pub use self::writeback::DrainProgress;

use self::buffers::SegmentBuffers;
use self::checkpoint::SuperblockWriter;
use self::geometry::Geometry;
use self::state::State;
use self::tunables::{TunableValue, Tunables};
use crate::error::{Error, Result};
use crate::format::superblock::{Superblock, CHECKPOINT_CLEAN};
use crate::format::{label, BLOCK_SIZE_BYTES, SECTOR_SIZE_BYTES};
use crate::io::aligned::AlignedBuf;
use crate::io::BlockDevice;

/// Default total size of the RAM segment buffers (the seed's 64 MiB).
pub const RAM_BUFFER_DEFAULT_BYTES: u64 = 64 << 20;
/// Default `OpenOptions::promote_pause_after_relocation`: under sustained write load the
/// relocator runs every ring pass (seconds), so a pause of several passes keeps promotions off
/// for as long as the load lasts instead of switching them on and off each pass.
pub const PROMOTE_PAUSE_AFTER_RELOCATION: Duration = Duration::from_secs(10);
/// The flusher syncs the cache device at least once per this many bytes written, which bounds
/// how much data recovery must read to verify the unsynced tail.
pub const SYNC_EVERY_BYTES: u64 = 64 << 20;

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
    /// blocks (the log is congested; see `read::decide_promotion`). With `manual_flusher`,
    /// which reads no clock, a nonzero pause lasts until the engine is reopened.
    pub promote_pause_after_relocation: Duration,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            ram_buffer_bytes: RAM_BUFFER_DEFAULT_BYTES,
            seal_interval_ms: None,
            manual_flusher: false,
            writeback_sorted: true,
            promote_pause_after_relocation: PROMOTE_PAUSE_AFTER_RELOCATION,
        }
    }
}

pub(crate) struct Inner {
    pub geo: Geometry,
    pub cache: Arc<dyn BlockDevice>,
    pub backing: Arc<dyn BlockDevice>,
    pub state: Mutex<State>,
    /// Wakes the flusher (work queued, sync wanted, closing).
    pub flusher_wake: Condvar,
    /// Wakes writers waiting for room and flushes waiting for a sync.
    pub progress: Condvar,
    /// Wakes the writeback thread (drain requested, closing, writers short of room).
    pub writeback_wake: Condvar,
    /// Wakes writers queued for room when the turn passes (`admission`).
    pub room_turn: admission::TurnWake,
    pub buffers: SegmentBuffers,
    /// Per slot: readers currently reading blocks of this segment from the cache device.
    pub pins: Vec<AtomicU32>,
    pub superblock: SuperblockWriter,
    pub manual: bool,
    /// `OpenOptions::writeback_sorted`.
    pub writeback_sorted: bool,
    /// `OpenOptions::promote_pause_after_relocation`.
    pub promote_pause_after_relocation: Duration,
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
}

impl Inner {
    pub fn seal_interval_ms(&self) -> u64 {
        self.tunables.get(tunables::SEAL_INTERVAL_MS)
    }
}

/// A cache opened for IO. Cloning gives another handle to the same engine.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
    /// The flusher and writeback threads.
    threads: Arc<Mutex<Vec<JoinHandle<()>>>>,
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
        let sb = checkpoint::read(&*cache)?.ok_or_else(|| {
            Error::NotFormatted(format!(
                "{} holds no logcache superblock; format it first",
                cache.describe()
            ))
        })?;
        check_cache_size(&sb, &*cache)?;
        check_backing(&sb, &*backing)?;
        let geo = Geometry::from_superblock(&sb);
        let mut recovered = recover::run(&*cache, &geo, &sb)?;
        let segment_bytes = geo.segment_size_bytes;
        let buffer_count = (opts.ram_buffer_bytes / segment_bytes)
            .clamp(2, geo.segment_count - 1)
            .min(u32::MAX as u64 - 1) as u32;
        let buffers = SegmentBuffers::new(buffer_count, segment_bytes);
        let tunables = Tunables::from_persisted(&sb.tunables);
        if let Some(ms) = opts.seal_interval_ms {
            tunables.set(tunables::SEAL_INTERVAL_MS, ms as u64);
        }
        let epoch = sb.checkpoint.epoch + 1;
        let last_seq = recovered.last_seq;
        // Zero ranges a crash may have kept from the backing device (between logging and
        // applying them): apply them again, in log order, before anything can write there.
        if !recovered.zero_ranges.is_empty() {
            for &(lba, count) in &recovered.zero_ranges {
                let (off, len) = (lba * BLOCK_SIZE_BYTES, count * BLOCK_SIZE_BYTES);
                backing.write_zeroes(off, len).map_err(|e| {
                    Error::io(
                        format!("re-applying a logged zero range ({len} bytes at {off}) to the backing device"),
                        e,
                    )
                })?;
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
        superblock.update(|s| {
            s.checkpoint.flags &= !CHECKPOINT_CLEAN;
            s.checkpoint.epoch = epoch;
            s.checkpoint.cut_seq = last_seq;
            // Sequences after the cut are reused by this session: a writeback position past
            // it would make their new dirty chunks replay as clean.
            s.checkpoint.writeback_seq = s.checkpoint.writeback_seq.min(last_seq);
            // Every zero range in the recovered log is applied now (above, or before).
            s.checkpoint.zero_applied_seq = last_seq;
            s.checkpoint.end_seq = 0;
            s.checkpoint.head_segment_id = recovered.head_segment_id;
            s.checkpoint.head_seq = recovered.head_seq;
        })?;
        recovered.report.zero_ranges_reapplied = recovered.zero_ranges.len() as u64;
        recovered.report.duration_us = started.elapsed().as_micros() as u64;
        let report = recovered.report.clone();
        let mut state = recovered.into_state(geo.clone(), epoch, buffer_count);
        state.counters.superblock_writes += 1;
        let pins = (0..geo.segment_count).map(|_| AtomicU32::new(0)).collect();
        let inner = Arc::new(Inner {
            geo,
            cache,
            backing,
            state: Mutex::new(state),
            flusher_wake: Condvar::new(),
            progress: Condvar::new(),
            writeback_wake: Condvar::new(),
            room_turn: admission::TurnWake::new(),
            buffers,
            pins,
            superblock,
            manual: opts.manual_flusher,
            writeback_sorted: opts.writeback_sorted,
            promote_pause_after_relocation: opts.promote_pause_after_relocation,
            tunables,
            recovery: report,
            flusher_lock: Mutex::new(()),
            relocate_buf: Mutex::new(AlignedBuf::new(segment_bytes as usize)),
            backing_order: Mutex::new(()),
        });
        {
            let mut st = inner.state.lock();
            if !st.open.active {
                st.open_segment(false);
            }
        }
        let mut threads = Vec::new();
        if !inner.manual {
            let i = inner.clone();
            threads.push(
                std::thread::Builder::new()
                    .name("logcache-flusher".into())
                    .spawn(move || flusher::run(&i))
                    .map_err(|e| Error::io("starting the flusher thread", e))?,
            );
            let i = inner.clone();
            let wb = std::thread::Builder::new()
                .name("logcache-writeback".into())
                .spawn(move || writeback::run(&i));
            match wb {
                Ok(t) => threads.push(t),
                Err(e) => {
                    inner.state.lock().closing = true;
                    inner.flusher_wake.notify_all();
                    for t in threads {
                        let _ = t.join();
                    }
                    return Err(Error::io("starting the writeback thread", e));
                }
            }
        }
        Ok(Engine {
            inner,
            threads: Arc::new(Mutex::new(threads)),
        })
    }

    /// Size of the disk the cache presents, in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.inner.geo.exported_size_bytes
    }

    /// Reads `buf.len()` bytes at `offset` (both multiples of 512).
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.check_range(offset, buf.len() as u64)?;
        read::read(&self.inner, offset, buf)
    }

    /// Writes `data` at `offset` (both multiples of 512). With `fua`, returns once durable.
    /// In write-through mode it returns once the backing device has the data too; in
    /// write-around mode the data goes to the backing device only.
    pub fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        self.check_range(offset, data.len() as u64)?;
        self.write_mode(offset, data)?;
        if fua {
            self.inner.state.lock().counters.fua_writes += 1;
            self.make_durable()?;
        }
        Ok(())
    }

    fn write_mode(&self, offset: u64, data: &[u8]) -> Result<()> {
        match self.inner.tunables.get(tunables::CACHE_MODE) {
            tunables::MODE_WRITE_THROUGH => direct::write_through(&self.inner, offset, data),
            tunables::MODE_WRITE_AROUND => direct::write_around(&self.inner, offset, data),
            _ => write::write(&self.inner, offset, data, true),
        }
    }

    /// The log, and the backing device if writes bypassed the log since its last sync.
    fn make_durable(&self) -> Result<()> {
        flusher::wait_durable(&self.inner)?;
        direct::sync_backing(&self.inner)
    }

    /// Returns once every write that returned before this call is durable.
    pub fn flush(&self) -> Result<()> {
        self.inner.state.lock().counters.flushes += 1;
        self.make_durable()
    }

    /// Makes `len` bytes at `offset` read as zeros (both multiples of 512), in every mode:
    /// cached copies are dropped, and the backing device gets the zeros (a hole where it can)
    /// in order with the writes around them. With `fua`, returns once durable.
    pub fn write_zeroes(&self, offset: u64, len_bytes: u64, fua: bool) -> Result<()> {
        self.zero(offset, len_bytes, fua, false)
    }

    /// TRIM: the range's data is no longer needed. It reads as zeros afterwards (the same
    /// operation as `write_zeroes`, counted apart); a file backing device gets a hole.
    pub fn discard(&self, offset: u64, len_bytes: u64, fua: bool) -> Result<()> {
        self.zero(offset, len_bytes, fua, true)
    }

    fn zero(&self, offset: u64, len_bytes: u64, fua: bool, discard: bool) -> Result<()> {
        self.check_range(offset, len_bytes)?;
        if len_bytes == 0 {
            return Ok(());
        }
        direct::zero(&self.inner, offset, len_bytes, discard, |off, zeros| {
            self.write_mode(off, zeros)
        })?;
        if fua {
            self.make_durable()?;
        }
        Ok(())
    }

    /// Manual mode: runs flusher rounds until the queue is empty. A no-op otherwise.
    pub fn run_flusher(&self) -> Result<()> {
        if self.inner.manual {
            flusher::drain_inline(&self.inner, false)?;
        }
        Ok(())
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
            if st.closing {
                return Err(Error::Closed);
            }
            st.closing = true;
            if let Some(msg) = &st.failed {
                let msg = msg.clone();
                drop(st);
                self.stop_thread();
                return Err(Error::Failed(msg));
            }
        }
        // Relocation may queue chunks of its own while we wait; repeat until nothing is left.
        let res = loop {
            if let Err(e) = flusher::wait_durable_closing(&self.inner) {
                break Err(e);
            }
            let st = self.inner.state.lock();
            if st.queue.is_empty() && st.synced_seq == st.next_seq - 1 {
                break Ok(());
            }
        };
        self.stop_thread();
        res?;
        let (end_seq, head, head_seq, wb_seq) = {
            let st = self.inner.state.lock();
            assert!(st.queue.is_empty());
            let wb_seq = writeback::writeback_position(&st).max(st.writeback_seq);
            (st.next_seq - 1, st.head_segment_id, st.head_seq(), wb_seq)
        };
        self.inner.superblock.update(|s| {
            s.checkpoint.flags |= CHECKPOINT_CLEAN;
            s.checkpoint.end_seq = end_seq;
            s.checkpoint.head_segment_id = head;
            s.checkpoint.head_seq = head_seq;
            s.checkpoint.writeback_seq = wb_seq;
        })
    }

    fn stop_thread(&self) {
        {
            let mut st = self.inner.state.lock();
            st.closing = true;
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
            st.failed = Some("crashed".into());
        }
        self.stop_thread();
    }

    /// Writes every dirty block back to the backing device and syncs it; returns once none is
    /// dirty, calling `progress` a few times a second. Writes arriving meanwhile are drained
    /// too, so under a steady write load this returns when writeback has caught up.
    pub fn drain(&self, progress: impl FnMut(DrainProgress)) -> Result<()> {
        self.check_usable()?;
        writeback::drain(&self.inner, progress)
    }

    /// Manual mode (tests): one writeback batch of up to `max_blocks` durable dirty blocks,
    /// regardless of policy. Returns how many blocks became clean.
    pub fn writeback_step(&self, max_blocks: usize) -> Result<u64> {
        self.check_usable()?;
        writeback::step(&self.inner, max_blocks)
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
        self.inner.superblock.update(|s| s.tunables = persisted)?;
        self.inner.state.lock().counters.superblock_writes += 1;
        // The flusher's sleep depends on the seal interval.
        self.inner.flusher_wake.notify_all();
        if index == tunables::CACHE_MODE
            && old == tunables::MODE_WRITE_BACK
            && value != tunables::MODE_WRITE_BACK
        {
            // Leaving write-back: new writes already go the new way; write back what is dirty.
            self.inner.writeback_wake.notify_all();
            writeback::drain(&self.inner, |_| {})?;
        }
        Ok(())
    }

    /// The cache mode in force.
    pub fn mode(&self) -> &'static str {
        tunables::MODE_NAMES[self.inner.tunables.get(tunables::CACHE_MODE) as usize]
    }

    fn check_usable(&self) -> Result<()> {
        let st = self.inner.state.lock();
        write::check_usable(&st)
    }

    pub fn stats(&self) -> Stats {
        let st = self.inner.state.lock();
        let g = &self.inner.geo;
        Stats {
            counters: st.counters.clone(),
            recovery: self.inner.recovery.clone(),
            exported_size_bytes: g.exported_size_bytes,
            segment_size_bytes: g.segment_size_bytes,
            segment_count: g.segment_count,
            segments_in_use: st.segments_in_use(),
            cache_blocks: g.cache_block_count() as u64,
            cached_blocks: st.index.len() as u64,
            dirty_blocks: st.dirty_blocks,
            writeback_rate_blocks_per_s: st.writeback_rate_blocks_per_s,
            writeback_seq: st.writeback_seq,
            writeback_error: st.writeback_error.clone(),
            ram_buffers: self.inner.buffers.count(),
            ram_buffers_free: st.free_buffers.len() as u32,
            ram_buffer_bytes: self.inner.buffers.memory_bytes() as u64,
            written_seq: st.written_seq,
            synced_seq: st.synced_seq,
            next_seq: st.next_seq,
            head_segment_id: st.head_segment_id,
            epoch: st.epoch,
            index_memory_bytes: (st.index.memory_bytes()
                + st.dirty_mask.len()
                + st.valid_mask.len()
                + st.data_crc.len() * 4) as u64,
            failed: st.failed.clone(),
            mode: tunables::MODE_NAMES[self.inner.tunables.get(tunables::CACHE_MODE) as usize],
            read_cache: self.inner.tunables.get(tunables::READ_CACHE) != 0,
            segments_in_ram: st.ram_segments.len() as u64,
            segments_on_disk: st.segments_in_use() - st.ram_segments.len() as u64,
            segments_free: st.free_segments(),
        }
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<()> {
        if offset % SECTOR_SIZE_BYTES != 0 || len % SECTOR_SIZE_BYTES != 0 {
            return Err(Error::InvalidArgument(format!(
                "offset {offset} and length {len} must be multiples of {SECTOR_SIZE_BYTES}"
            )));
        }
        match offset.checked_add(len) {
            Some(end) if end <= self.size_bytes() => Ok(()),
            _ => Err(Error::InvalidArgument(format!(
                "range {offset}+{len} runs past the end of the {}-byte disk",
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

/// Checks the cache device is not shorter than when it was formatted.
pub(crate) fn check_cache_size(sb: &Superblock, cache: &dyn BlockDevice) -> Result<()> {
    if cache.size_bytes() < sb.cache_size_bytes {
        return Err(Error::Corruption(format!(
            "{} is {} bytes but was formatted with {} bytes (truncated?)",
            cache.describe(),
            cache.size_bytes(),
            sb.cache_size_bytes
        )));
    }
    Ok(())
}

/// Checks the backing device is the one the cache was formatted for.
fn check_backing(sb: &Superblock, backing: &dyn BlockDevice) -> Result<()> {
    if backing.size_bytes() != sb.backing_size_bytes {
        return Err(Error::WrongBacking(format!(
            "{} is {} bytes, but this cache was formatted for a {}-byte backing device",
            backing.describe(),
            backing.size_bytes(),
            sb.backing_size_bytes
        )));
    }
    let off = label::label_offset(sb.backing_size_bytes)
        .ok_or_else(|| Error::Corruption("backing size in superblock too small".into()))?;
    let mut raw = AlignedBuf::new(BLOCK_SIZE_BYTES as usize);
    backing
        .read_at(&mut raw, off)
        .map_err(|e| Error::io(format!("reading the label of {}", backing.describe()), e))?;
    match label::Label::decode(&raw)? {
        Some(l) if l.backing_uuid == sb.backing_uuid && l.format_id == sb.format_id => Ok(()),
        Some(l) => Err(Error::WrongBacking(format!(
            "{} carries the label of another cache (backing uuid {}); this cache expects {}",
            backing.describe(),
            crate::format::uuid_to_string(&l.backing_uuid),
            crate::format::uuid_to_string(&sb.backing_uuid)
        ))),
        None => Err(Error::WrongBacking(format!(
            "{} has no logcache label; this cache expects backing uuid {}",
            backing.describe(),
            crate::format::uuid_to_string(&sb.backing_uuid)
        ))),
    }
}
