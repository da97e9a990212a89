//! The flusher: the one owner of log writes. It takes sealed chunks in sequence order, fills in
//! their checksums, writes each as one sequential IO, syncs the cache device when a flush waits
//! (one sync covers every flush that arrived before it: group commit), releases RAM buffers and
//! reclaims dead segments at the head of the ring.

use std::time::{Duration, Instant};

use crate::io::BlockDevice as _;
use crate::sync::MutexGuard;

use crate::error::{Error, Result};
use crate::format::chunk;
use crate::format::{BLOCK_SIZE_BYTES, FULL_MASK};
use crate::geometry::CacheBlock;
use crate::inner::{fail_cache, mark_failed, Inner};
use crate::path::hot::HotKey;
use crate::reclaim;
use crate::state::{self, SealedChunk, State, RESERVE_SEGMENTS};
use crate::writeback::foreground::{ReadActivity, FLUSH_IO_YIELDING_BYTES_MAX};

const BLOCK: usize = BLOCK_SIZE_BYTES as usize;
/// The flusher syncs the cache device at least once per this many bytes written, which bounds
/// how much data recovery must read to verify the unsynced tail.
pub const SYNC_EVERY_BYTES: u64 = 64 << 20;
/// At most this many chunks per round, so buffers are released and waiters woken often.
const CHUNKS_PER_ROUND_MAX: usize = 32;
/// At most this many head segments relocated per round.
const RELOCATIONS_PER_ROUND_MAX: usize = 8;
/// At most this many head segments looked at per round (each a scan of its blocks under the
/// lock, ~1 µs). Dropping clean blocks is no IO and no log entry, so a round drops them from
/// many segments and reclaims them at once: a log wrapping at 2.6 GB/s needs ~2,600 segments a
/// second, and at 8 per round writers waited for a round every 8 MiB (issue 20).
const HEAD_SEGMENTS_PER_ROUND_MAX: usize = 32;
/// How often an idle flusher looks again at the periodic seal and pinned segments.
const IDLE_WAKE: Duration = Duration::from_millis(100);
/// Sealed chunks that wait before the flusher starts a round for them alone (`queue_wants_round`
/// has the exceptions). Each round takes the state lock several times, and a writer that finds
/// it held parks; woken per chunk, the flusher took it six times as often once the block CRCs
/// left its round (BENCHMARKS.md, "What the writer sleeps on since 9ec4a33"). The cost: a flush
/// may find up to this many chunks still to write (it would have found about one).
pub const ROUND_CHUNKS: usize = 4;
/// Sealed chunks fewer than `ROUND_CHUNKS` get a round once they waited about this long (the
/// flusher sleeps at most this long while any is queued), so a slow writer's chunks do not
/// wait in RAM for the seal interval.
const QUEUED_WAKE: Duration = Duration::from_millis(2);

/// The flusher thread's loop.
pub fn run(inner: &Inner) {
    let mut st = inner.state.lock();
    // Since when sealed chunks have waited for a round without being worth one
    // (`queue_wants_round`): after `QUEUED_WAKE` they get one anyway.
    let mut queued_since: Option<Instant> = None;
    let mut reads = ReadActivity::default();
    loop {
        if st.health.is_failed() {
            break;
        }
        let now = crate::sync::now();
        // Before the work check, not only when idle: under ring pressure there is always
        // "work" (the relocator's), and acknowledged writes must still be sealed and synced
        // within the seal interval.
        seal_if_due(inner, &mut st, now);
        let queue_overdue =
            queued_since.is_some_and(|t| now.saturating_duration_since(t) >= QUEUED_WAKE);
        if !has_work(&st, queue_overdue) {
            crate::failpoint::flusher_pass_done(inner);
            if st.health.closing() {
                break;
            }
            queued_since = if st.ring.queue_is_empty() {
                None
            } else {
                Some(queued_since.unwrap_or(now))
            };
            let timeout = next_wake(inner, &st);
            inner.flusher_wake.wait_for(&mut st, timeout);
            continue;
        }
        // A round takes the whole queue (up to `CHUNKS_PER_ROUND_MAX`).
        queued_since = None;
        match step(inner, st, &mut reads) {
            Ok((guard, progressed)) => {
                st = guard;
                crate::failpoint::flusher_pass_done(inner);
                if !progressed {
                    // Nothing could move (e.g. waiting writers but no reclaimable segment).
                    // Wake in time for the periodic seal.
                    let timeout = next_wake(inner, &st);
                    inner.flusher_wake.wait_for(&mut st, timeout);
                }
            }
            Err(e) => {
                // Every error path of a round fails the engine; should one not, failing it
                // here keeps the flusher from stopping silently while waiters wait forever.
                st = inner.state.lock();
                if !st.health.is_failed() {
                    mark_failed(inner, &mut st, format!("the flusher stopped: {e}"));
                }
                break;
            }
        }
    }
    drop(st);
    inner.progress.notify_all();
}

/// Whether the sealed chunks queued are worth a round now: `ROUND_CHUNKS` of them, or any when
/// someone waits on the flusher (a flush, a writer for room, close) or the RAM buffers (half of
/// them, with few) or free segments run low: writers must not come to wait for room because
/// the flusher slept. A chunk left queued still has its seal deadline (`seal_if_due`).
pub fn queue_wants_round(st: &State) -> bool {
    let queued = st.ring.queue_len();
    queued > 0
        && (queued >= ROUND_CHUNKS
            || st.seqs.sync_wanted()
            || st.room.writers_wait()
            || st.health.closing()
            || st.ring.free_buffer_count() <= (st.ring.buffer_count() / 2).min(ROUND_CHUNKS as u32)
            || st.ring.free_segments() <= RESERVE_SEGMENTS + 2 * ROUND_CHUNKS as u64)
}

/// A writer (or promotion) sealed a chunk: wakes the flusher if the queue is worth a round.
pub fn chunk_sealed(inner: &Inner, st: &State) {
    if queue_wants_round(st) {
        inner.flusher_wake.notify_one();
    }
}

/// `queue_overdue`: sealed chunks have waited `QUEUED_WAKE` for a round.
fn has_work(st: &State, queue_overdue: bool) -> bool {
    let durability_work = queue_wants_round(st)
        || (queue_overdue && !st.ring.queue_is_empty())
        || st.seqs.sync_wanted();
    // Closing: only what close waits for. Room-making may never finish (a log full of dirty
    // blocks waits for writeback, which has stopped) and nobody needs it any more.
    if st.health.closing() {
        return durability_work;
    }
    durability_work || st.room.writers_wait() || st.under_pressure()
}

fn next_wake(inner: &Inner, st: &State) -> Duration {
    let oldest = match (st.ring.open().first_write_at, st.ring.sealed_write_at()) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let wake = match (inner.seal_interval_ms(), oldest) {
        (ms, Some(t)) if ms > 0 => {
            let due = t + Duration::from_millis(ms);
            due.saturating_duration_since(crate::sync::now())
                .clamp(Duration::from_millis(1), IDLE_WAKE)
        }
        _ => IDLE_WAKE,
    };
    // A front chunk still receiving reserved blocks cannot be taken; whoever finishes it
    // wakes the flusher (`path/reserve.rs`), so no need to look every `QUEUED_WAKE`.
    if st.ring.queue_is_empty() || st.ring.front_pending() {
        wake
    } else {
        wake.min(QUEUED_WAKE)
    }
}

/// Seals the open chunk if its oldest write waited the seal interval, and asks for a sync;
/// asks for one too when a chunk sealed meanwhile for another reason (full, by a writer) holds
/// a write that waited the interval: nobody else may ever ask for its sync.
pub fn seal_if_due(inner: &Inner, st: &mut State, now: Instant) {
    let interval_ms = inner.seal_interval_ms();
    if interval_ms == 0 || st.health.is_failed() {
        return;
    }
    let due = |t: Option<Instant>| {
        t.is_some_and(|t| now.saturating_duration_since(t) >= Duration::from_millis(interval_ms))
    };
    let open_due = due(st.ring.open().first_write_at);
    if !open_due && !due(st.ring.sealed_write_at()) {
        return;
    }
    if open_due && st.seal(&inner.buffers) {
        st.counters.periodic_seals += 1;
    }
    // The sync asked for below covers every chunk sealed so far, this one's too.
    st.ring.take_sealed_write_at();
    let last = st.seqs.last_sealed();
    st.seqs.want_sync(last);
}

/// One round: write the queued chunks, sync if anyone needs it, publish, reclaim. Called with
/// the lock held; releases it around IO. Returns whether anything changed.
fn step<'a>(
    inner: &'a Inner,
    mut st: MutexGuard<'a, State>,
    reads: &mut ReadActivity,
) -> Result<(MutexGuard<'a, State>, bool)> {
    // Chunks may say "the backing device holds this" (clean blocks: write-through copies,
    // promotions, relocations): that must not reach the cache device before the backing
    // device has it for sure. A chunk whose clean entries no backing sync covers yet
    // (`vouch_gen`) is written with them as holes; the backing device is synced for them only
    // once `clean_holes_per_backing_sync` were holed since its last sync. A backing sync per
    // round would be a barrier on the backing device every few write-through writes (an HDD
    // then reorders among those few instead of its whole queue); a hole costs only the copy
    // after a crash. Whether a chunk is covered is decided after the sync, per chunk: one
    // sealed while it ran may hold a clean entry whose backing write ended after it began.
    let synced_gen = st.bypass.synced_gen();
    let needs_backing_sync = st
        .ring
        .queued()
        .take(CHUNKS_PER_ROUND_MAX)
        .any(|sc| sc.vouch_gen > synced_gen);
    let holes_due = st.bypass.holes_since_sync() >= inner.clean_holes_per_backing_sync;
    if let (true, true, Some(target)) = (needs_backing_sync, holes_due, st.bypass.sync_owed()) {
        let log_pos = st.log_pos();
        drop(st);
        let res = inner.backing.flush();
        st = inner.state.lock();
        match res {
            Ok(()) => st.note_backing_synced(
                target,
                log_pos,
                inner.backing.reconnects(),
                inner.backing.failed_syncs(),
            ),
            Err(e) => {
                // The backing device is away (a remote server restarting, say): not a cache
                // failure, and nothing waits for this sync; the clean sectors stay out of the
                // entries and the next try comes after as many more holes. The writes this
                // sync covered have no sync that vouches for them, whatever a later one says:
                // flushes fail until they are durable again (`state/lost.rs`).
                st.counters.io_errors += 1;
                st.backing_writes_lost(
                    Error::io(format!("syncing {}", inner.backing.describe()), e).to_string(),
                    inner.backing.failed_syncs(),
                );
            }
        }
    }
    // A chunk waits in the queue while a large write receives into blocks it reserved there
    // (state/reservations.rs). When someone needs it written (a flush, a writer waiting for
    // room, close, or a caller doing the flusher's work in manual mode), the reservations give
    // up instead: a client that stops mid-payload holds up no one.
    if st.ring.front_pending()
        && (st.seqs.sync_wanted()
            || st.room.writers_wait()
            || st.health.closing()
            || inner.drive.inline())
    {
        st.cancel_reservations();
    }
    let batch = st.ring.take_queued(CHUNKS_PER_ROUND_MAX);
    let synced_gen = st.bypass.synced_gen();
    let synced_for_headers = st.seqs.synced();
    let mut progressed = !batch.is_empty();
    let io_max_bytes = if reads.active(&st) {
        FLUSH_IO_YIELDING_BYTES_MAX
    } else {
        usize::MAX
    };
    // The id of each chunk's segment, read under the lock (the segment in the slot now is the
    // one the chunk belongs to, and it cannot be reclaimed before its chunks are written):
    // the RAM cache's key for the blocks kept below. None: nothing kept this round.
    let keep_ids: Option<Vec<u64>> = keeps_writes(inner, &st, batch.len())
        .then(|| batch.iter().map(|sc| st.ring.segment(sc.slot).id).collect());
    let keep_budget = if keep_ids.is_some() {
        inner.hot.write_budget(crate::sync::now())
    } else {
        0
    };
    drop(st);

    let bytes: u64 = batch.iter().map(SealedChunk::size_bytes).sum();
    let mut crcs = Vec::new();
    let mut kept = Vec::new();
    let written = write_chunks(
        inner,
        &batch,
        ChunkKeys {
            synced_seq: synced_for_headers,
            synced_gen,
            segment_ids: keep_ids.as_deref(),
            budget_blocks: keep_budget,
        },
        io_max_bytes,
        &mut crcs,
        &mut kept,
    );
    if written.is_ok() && !kept.is_empty() {
        keep_written(inner, &kept);
        inner.hot.spend_write_budget(kept.len() as u64);
    }
    let mut st = inner.state.lock();
    let unvouched = match written {
        Ok(n) => n,
        Err(e) => return Err(fail_cache(inner, st, e)),
    };
    // Publish the data checksums (for reads from the cache device; a block whose clean
    // sectors were taken out of its entry is still cached, clean), then free fully written
    // buffers.
    for &(cb, crc) in &crcs {
        st.blocks.set_crc(cb, crc);
    }
    for sc in &batch {
        st.seqs.note_written(sc.seq);
        st.ring.note_written(sc);
    }
    st.bypass.note_holed(unvouched);
    st.counters.clean_entries_holed += unvouched;
    st.counters.chunks_written += batch.len() as u64;
    st.counters.chunk_bytes_written += bytes;
    st.release_written_buffers();

    // Sync when a flush waits, when enough is unsynced that recovery's tail check would grow,
    // or when room is short (dead segments can be reclaimed only once their killers are synced).
    let need_sync = st.seqs.written() > st.seqs.synced()
        && (st.seqs.sync_wanted()
            || st.ring.unsynced_bytes() >= SYNC_EVERY_BYTES
            || ((st.room.writers_wait() || st.under_pressure()) && st.head_waits_for_sync()));
    if need_sync {
        let target = st.seqs.written();
        drop(st);
        let res = inner.cache.flush();
        st = inner.state.lock();
        if let Err(e) = res {
            // A failed sync may have lost any unsynced write: stop, and let recovery sort it out.
            let e = Error::io(
                format!("syncing the cache device {}", inner.cache.describe()),
                e,
            );
            return Err(fail_cache(inner, st, e));
        }
        st.note_synced(target);
        // Newly durable chunks are what a waiting writeback can take.
        if st.writeback.draining() || st.room.writers_wait() {
            inner.writeback_wake.notify_one();
        }
        st.counters.cache_syncs += 1;
        progressed = true;
    }
    let (st, mut reclaimed) = reclaim::reclaim(inner, st)?;
    // Several head segments per round, so that one sync lets all of them be reclaimed.
    let (mut relocations, mut evicted) = (0, false);
    let mut st = st;
    for _ in 0..HEAD_SEGMENTS_PER_ROUND_MAX {
        let (guard, work) = reclaim::relocate_head(inner, st)?;
        st = guard;
        if !work.any() {
            break;
        }
        evicted |= work.evicted;
        if work.moved {
            relocations += 1;
            if relocations == RELOCATIONS_PER_ROUND_MAX {
                break;
            }
        }
    }
    if relocations > 0 {
        st.seal(&inner.buffers);
        let last = st.seqs.last_sealed();
        st.seqs.want_sync(last);
    }
    if evicted {
        // Segments emptied by dropping clean blocks need no sync of their own (their other
        // blocks died by chunks the reclaim above already checked against): reclaim them now
        // rather than a round later, which writers waiting for room would wait out.
        let (guard, more) = reclaim::reclaim(inner, st)?;
        st = guard;
        reclaimed |= more;
    }
    let progressed = progressed || reclaimed || relocations > 0 || evicted;
    if st.ordered() && st.ring.head_wants_writeback() && st.writeback.error().is_none() {
        // The ring runs low with dirty blocks at its head, which in flush-epoch order only
        // writeback can let pass: it may be pausing at its background rate, and nobody else
        // tells it before writers come to wait for room (`writeback::policy::wants_full_speed`).
        // Not while its last batch failed: it retries after its own pause, not every round.
        inner.writeback_wake.notify_one();
    }
    if progressed {
        // Only a change is news. A writer waiting for room that is woken by a round that
        // changed nothing finds no room, waits again and wakes the flusher, whose next round
        // wakes it again: both burnt CPU for as long as the head could not move (a backing
        // zeroing held; cache-loss sim seeds 3176, 3180, 6198).
        inner.progress.notify_all();
    }
    Ok((st, progressed))
}

/// The metadata blocks of a queued chunk.
///
/// # Safety
/// Only the flusher may call this, between taking the chunk off the queue and releasing its
/// buffer (the metadata blocks are the flusher's then; see state/buffers.rs).
#[allow(clippy::mut_from_ref)]
unsafe fn chunk_meta<'a>(inner: &'a Inner, sc: &SealedChunk) -> &'a mut [u8] {
    inner.buffers.slice_mut(
        sc.buffer,
        sc.start_block as usize * BLOCK,
        sc.meta_blocks as usize * BLOCK,
    )
}

/// Whether a round of `chunks` chunks keeps their small-write blocks in the RAM cache: only
/// when it is on, reads came in since the last round that looked (`HotTier::reads_came`: a
/// workload that only writes reads nothing back, and a kept block would cost the flusher's
/// CPU for nothing: `bench engine` and 4 KiB writes at iodepth 64 through NBD measured it)
/// and the flusher has slack: the round is short of `ROUND_CHUNKS` (it came for a flush or a
/// chunk's wait, not a full queue), no writer waits for room, and at least half the RAM
/// buffers are free; within `hot::WRITE_KEEP_BLOCKS_PER_SEC` besides. A copy per
/// block (and, while the RAM cache fills, a page fault per block, ~5 us on a VM) is work the
/// flusher does instead of log writes: writes that outran it would come to wait for buffers
/// (`bench engine`, keeping every block, wrote ~1/15 as fast). Their blocks are then read from
/// the cache device, as before.
fn keeps_writes(inner: &Inner, st: &State, chunks: usize) -> bool {
    // The read count is looked at last: only a round that could keep uses up the news.
    (1..ROUND_CHUNKS).contains(&chunks)
        && inner.hot.enabled()
        && !st.room.writers_wait()
        && st.ring.free_buffer_count() > st.ring.buffer_count() / 2
        && inner.hot.reads_came(st.counters.reads)
}

/// A block of a small write the flusher stores in the RAM cache once its chunk is written
/// (`path::hot`, "Writes"): its key, what it was verified as, and where its bytes are.
#[derive(Clone, Copy, Debug)]
struct Kept {
    key: HotKey,
    lba: u64,
    crc: u32,
    buffer: u32,
    offset_bytes: usize,
}

/// What a round's chunks are prepared with: the sync state their headers and entries speak
/// for, each chunk's segment id (None: nothing is kept) and how many blocks may be kept.
#[derive(Clone, Copy)]
struct ChunkKeys<'a> {
    synced_seq: u64,
    synced_gen: u64,
    segment_ids: Option<&'a [u64]>,
    budget_blocks: u64,
}

/// Stores the kept blocks of chunks just written in the RAM cache, outside the state lock:
/// their buffers are not released before the flusher publishes them under it, and a sealed
/// chunk's data blocks never change (`state/buffers.rs`), so the bytes are the ones the cache
/// device now holds under each key.
fn keep_written(inner: &Inner, kept: &[Kept]) {
    for k in kept {
        // SAFETY: a data block of a sealed chunk the flusher wrote and has not released:
        // immutable (kept blocks are never reserved ones), others only read it.
        let block = unsafe { inner.buffers.slice(k.buffer, k.offset_bytes, BLOCK) };
        inner.hot.put_written(k.key, k.lba, k.crc, block);
    }
}

/// Fills in a sealed chunk's checksums (data CRCs from its entries, `synced_seq`, the header
/// CRC), and takes its clean sectors out of its entries unless a backing sync covered its
/// `vouch_gen` (covered up to `synced_gen`); pushes (cache block, data CRC) of each data entry
/// to `crcs`, and with a `segment_id`, each whole data block a small write wrote last to
/// `kept`; returns where its bytes go on the cache device, the bytes, and how many entries
/// lost clean sectors.
fn prepare_chunk<'a>(
    inner: &'a Inner,
    sc: &SealedChunk,
    synced_seq: u64,
    synced_gen: u64,
    segment_id: Option<u64>,
    crcs: &mut Vec<(CacheBlock, u32)>,
    kept: &mut Vec<Kept>,
) -> (u64, &'a [u8], u64) {
    let meta_len = sc.meta_blocks as usize * BLOCK;
    let meta_off = sc.start_block as usize * BLOCK;
    let total_len = meta_len + sc.data_count as usize * BLOCK;
    // SAFETY: called by the flusher on a chunk it took off the queue; its data blocks are
    // immutable, and others only read them (see state/buffers.rs).
    let meta = unsafe { chunk_meta(inner, sc) };
    let data = unsafe {
        inner
            .buffers
            .slice(sc.buffer, meta_off + meta_len, total_len - meta_len)
    };
    let unvouched = sc.vouch_gen > synced_gen;
    let first_crc = crcs.len();
    let first_kept = kept.len();
    let data_start = sc.start_block + sc.meta_blocks;
    let n = state::chunk_meta::finish(
        meta,
        state::chunk_meta::ChunkData {
            bytes: data,
            ready: |i, lba| {
                let off = meta_off + meta_len + i * BLOCK;
                let ready = inner.buffers.take_ready(sc.buffer, off, lba);
                if let (true, Some(segment_id)) = (ready.keep, segment_id) {
                    // Its CRC is filled in below, once `finish` has it.
                    kept.push(Kept {
                        key: HotKey {
                            segment_id,
                            cache_block: inner.geo.cache_block(sc.slot, data_start + i as u32),
                        },
                        lba,
                        crc: 0,
                        buffer: sc.buffer,
                        offset_bytes: off,
                    });
                }
                ready.crc
            },
        },
        &inner.geo,
        synced_seq,
        sc.entry_count,
        unvouched,
        crcs,
    );
    assert!(n == 0 || unvouched, "a covered chunk lost clean sectors");
    // Kept: data entries (`crcs`, in index order as `kept`) of whole blocks, as their entries
    // now say (a block entry's valid sectors; a clean entry made a hole keeps nothing).
    let mut w = first_kept;
    let mut j = first_crc;
    for r in first_kept..kept.len() {
        let k = kept[r];
        let i = (k.offset_bytes - meta_off - meta_len) / BLOCK;
        while j < crcs.len() && (crcs[j].0 as usize) < i {
            j += 1;
        }
        if j < crcs.len() && crcs[j].0 as usize == i {
            let e = chunk::entry_at(meta, i);
            if e.valid_mask == FULL_MASK && e.lba == k.lba {
                kept[w] = Kept {
                    crc: crcs[j].1,
                    ..k
                };
                w += 1;
            }
        }
    }
    kept.truncate(w);
    // `finish` names data blocks by their index in the chunk.
    for (i, _) in &mut crcs[first_crc..] {
        *i = inner.geo.cache_block(sc.slot, data_start + *i);
    }
    // SAFETY: as above; the whole chunk is now immutable until its buffer is released.
    let whole = unsafe { inner.buffers.slice(sc.buffer, meta_off, total_len) };
    (
        inner.geo.offset_of(sc.slot, sc.start_block),
        whole,
        u64::from(n),
    )
}

/// Writes a round's chunks, in order; chunks that follow one another on the cache device (the
/// ring's next slots, or the next chunk of a segment) go out as one vectored IO. With small
/// segments that turns many small writes, each paying a syscall and a device round trip, into
/// a few large ones. No IO is larger than `io_max_bytes` (pieces go out one after another: see
/// `writeback::foreground`). `crcs` gets each data entry's (cache block, CRC), `kept` the
/// blocks to store in the RAM cache once written; returns how many entries lost clean sectors
/// (`prepare_chunk`).
fn write_chunks(
    inner: &Inner,
    batch: &[SealedChunk],
    keys: ChunkKeys<'_>,
    io_max_bytes: usize,
    crcs: &mut Vec<(CacheBlock, u32)>,
    kept: &mut Vec<Kept>,
) -> Result<u64> {
    let mut unvouched = 0;
    let prepared: Vec<(u64, &[u8])> = batch
        .iter()
        .enumerate()
        .map(|(c, sc)| {
            // Within the budget: a chunk after it ran out keeps nothing.
            let segment_id = keys
                .segment_ids
                .filter(|_| (kept.len() as u64) < keys.budget_blocks)
                .map(|ids| ids[c]);
            let (off, bytes, n) = prepare_chunk(
                inner,
                sc,
                keys.synced_seq,
                keys.synced_gen,
                segment_id,
                crcs,
                kept,
            );
            unvouched += n;
            (off, bytes)
        })
        .collect();
    let mut i = 0;
    while i < prepared.len() {
        let (off, first) = prepared[i];
        let mut end = off + first.len() as u64;
        let mut j = i + 1;
        while j < prepared.len() && prepared[j].0 == end {
            end += prepared[j].1.len() as u64;
            j += 1;
        }
        let pieces: Vec<&[u8]> = prepared[i..j].iter().map(|p| p.1).collect();
        for (at, io) in split_ios(off, &pieces, io_max_bytes) {
            inner.cache.write_vectored_at(&io, at).map_err(|e| {
                // Status shows this line: it names the device that failed.
                Error::io(
                    format!(
                        "writing chunks {}..={} to the cache device {} at offset {at}",
                        batch[i].seq,
                        batch[j - 1].seq,
                        inner.cache.describe()
                    ),
                    e,
                )
            })?;
        }
        i = j;
    }
    Ok(unvouched)
}

/// Cuts one contiguous write (`pieces` from offset `off`, whole blocks) into IOs of at most
/// `max_bytes` each (rounded down to whole blocks, at least one), in order: `(offset, pieces)`
/// per IO.
fn split_ios<'a>(off: u64, pieces: &[&'a [u8]], max_bytes: usize) -> Vec<(u64, Vec<&'a [u8]>)> {
    let max_bytes = (max_bytes / BLOCK).max(1) * BLOCK;
    let mut ios = Vec::new();
    let mut at = off;
    let mut cur: Vec<&'a [u8]> = Vec::new();
    let mut cur_bytes = 0;
    for &piece in pieces {
        let mut rest = piece;
        while !rest.is_empty() {
            let take = rest.len().min(max_bytes - cur_bytes);
            cur.push(&rest[..take]);
            cur_bytes += take;
            rest = &rest[take..];
            if cur_bytes == max_bytes {
                ios.push((at, std::mem::take(&mut cur)));
                at += cur_bytes as u64;
                cur_bytes = 0;
            }
        }
    }
    if !cur.is_empty() {
        ios.push((at, cur));
    }
    ios
}

/// Seals the open chunk and asks for a sync covering every chunk sealed so far: returns the
/// sequence to wait for, or `None` when it is durable already. `drive` then waits for the
/// flusher thread (`wait_synced`) or runs its rounds (`sync_inline`).
pub fn want_durable(inner: &Inner, st: &mut State) -> Result<Option<u64>> {
    st.health.check_failed()?;
    // A write still receiving into reserved blocks was not acknowledged, so the flush need
    // not cover it; it gives up publishing (written afterwards at the log's end) rather than
    // hold the flush, or straddle a flush point.
    st.cancel_reservations();
    st.seal(&inner.buffers);
    let target = st.seqs.last_sealed();
    if st.seqs.synced() >= target {
        return Ok(None);
    }
    st.seqs.want_sync(target);
    Ok(Some(target))
}

/// Waits for the flusher thread to sync chunks up to `target`.
pub fn wait_synced(inner: &Inner, mut st: MutexGuard<'_, State>, target: u64) -> Result<()> {
    inner.flusher_wake.notify_one();
    while st.seqs.synced() < target {
        st.health.check_failed()?;
        inner.progress.wait(&mut st);
    }
    Ok(())
}

/// Manual mode: runs flusher rounds on this thread until chunks up to `target` are synced.
pub fn sync_inline(inner: &Inner, target: u64) -> Result<()> {
    let _serial = inner.flusher_lock.lock();
    loop {
        let st = inner.state.lock();
        st.health.check_failed()?;
        if st.seqs.synced() >= target {
            return Ok(());
        }
        let (_st, progressed) = step(inner, st, &mut ReadActivity::default())?;
        assert!(
            progressed,
            "a flush target {target} the flusher cannot reach"
        );
    }
}

/// Manual mode: runs flusher rounds until nothing is queued (or, with `for_room`, until writers
/// have room again; it also syncs so dead segments can be reclaimed). Returns whether anything
/// changed.
pub fn drain_inline(inner: &Inner, for_room: bool) -> Result<bool> {
    let _serial = inner.flusher_lock.lock();
    let mut any = false;
    // A backstop against a livelock bug: each pass over the ring nets at least the slack the
    // relocator's live-data cap leaves, so this many rounds always make room.
    let rounds_max = 4 * inner.geo.segment_count + 64;
    for _ in 0..rounds_max {
        let mut st = inner.state.lock();
        st.health.check_failed()?;
        let done = if for_room {
            st.ring.open().active
        } else {
            st.ring.queue_is_empty()
        };
        if done {
            return Ok(any);
        }
        if for_room {
            st.room.space_waiters().enter();
        }
        let (mut st, progressed) = step(inner, st, &mut ReadActivity::default())?;
        if for_room {
            st.room.space_waiters().leave();
        }
        any |= progressed;
        if !progressed {
            return Ok(any);
        }
    }
    panic!("the flusher made progress {rounds_max} rounds in a row without making room");
}

#[cfg(test)]
mod split_tests {
    use super::split_ios;

    const B: usize = super::BLOCK_SIZE_BYTES as usize;

    /// The IOs cover the write exactly, in order, none over the limit, each starting where the
    /// previous one ended; without a limit, one IO.
    #[test]
    fn split_ios_covers_the_write_in_order_within_the_limit() {
        let data: Vec<u8> = (0..40 * B).map(|i| (i / B) as u8).collect();
        let pieces: Vec<&[u8]> = vec![&data[..3 * B], &data[3 * B..20 * B], &data[20 * B..]];
        for max in [B, 4 * B, 5 * B + 100, 16 * B, 40 * B, usize::MAX] {
            let ios = split_ios(1 << 20, &pieces, max);
            let limit = (max / B).max(1) * B;
            let mut at = 1u64 << 20;
            let mut joined = Vec::new();
            for (off, io) in &ios {
                assert_eq!(*off, at, "contiguous, in order");
                let len: usize = io.iter().map(|p| p.len()).sum();
                assert!(len <= limit && len > 0 && len.is_multiple_of(B));
                at += len as u64;
                for p in io {
                    joined.extend_from_slice(p);
                }
            }
            assert_eq!(joined, data, "max {max}");
            if max >= 40 * B {
                assert_eq!(ios.len(), 1);
            } else {
                assert_eq!(ios.len(), (40 * B).div_ceil(limit));
            }
        }
    }
}
