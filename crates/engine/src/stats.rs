//! Counters kept under the state lock (free on the hot path: the lock is already held) and the
//! snapshot handed to callers.

/// Raw counters, updated under the state lock.
#[derive(Clone, Debug, Default)]
pub struct Counters {
    pub reads: u64,
    pub read_bytes: u64,
    /// Block reads served wholly from the cache (RAM or cache device).
    pub read_hits: u64,
    /// Block reads that needed the backing device for at least one sector.
    pub read_misses: u64,
    pub read_hits_ram: u64,
    /// Of `read_hits`, block reads served from the RAM cache (`path::hot`): copies of blocks
    /// on the cache device (`read_hits_ram` counts blocks still in the log's RAM buffers).
    pub read_hits_ram_cache: u64,
    /// Of `read_hits_ram_cache`, those of reads larger than 64 KiB (served a run at a time).
    pub read_hits_ram_cache_large: u64,
    /// Blocks of reads larger than 64 KiB, read from the cache device in runs: stored in the
    /// RAM cache (on the run's second touch, or at once when the rest of the run came from
    /// it; a full set may still refuse one), or not stored (its first touch, noted in the
    /// ghost table).
    pub ram_cache_second_touch_blocks: u64,
    pub ram_cache_first_touch_blocks: u64,
    /// Of `ram_cache_second_touch_blocks`, blocks stored at once because the RAM cache served
    /// the rest of their run (it lacked them: their set had evicted them).
    pub ram_cache_refill_blocks: u64,
    /// Blocks of writes of at most 64 KiB stored in the RAM cache by the flusher once written
    /// to the cache device, so a read of them soon after is a copy out of RAM.
    pub ram_cache_write_blocks: u64,
    pub writes: u64,
    pub write_bytes: u64,
    /// Block writes to a block already in the cache.
    pub write_hits: u64,
    pub write_misses: u64,
    /// Block writes that covered only part of a block.
    pub write_partial: u64,
    /// Writes done in place in the open chunk.
    pub write_in_place: u64,
    /// Partial writes that had to read the block's older data from the cache device.
    pub write_merge_reads: u64,
    pub flushes: u64,
    pub fua_writes: u64,
    pub chunks_sealed: u64,
    pub periodic_seals: u64,
    pub chunks_written: u64,
    pub chunk_bytes_written: u64,
    pub cache_syncs: u64,
    pub segments_reclaimed: u64,
    /// Live blocks copied from the head segment to the open chunk to free the head.
    pub blocks_relocated: u64,
    /// Relocations not tried (the head segment not read) for want of room to move blocks to.
    pub relocations_without_room: u64,
    pub superblock_writes: u64,
    /// Checkpoint bitmap pages written by folds (before segments left the log).
    pub checkpoint_pages_written: u64,
    /// Times a writer waited for room in the log or for a RAM buffer.
    pub write_waits: u64,
    /// Of `write_waits`, those that found every RAM buffer taken (the flusher's pace); the
    /// rest found the ring out of free segments (the head's: reclaim, writeback).
    pub write_waits_for_buffers: u64,
    /// Time writers spent in those waits, summed (threads mode; manual mode reads no clock).
    pub write_wait_us: u64,
    /// Paced pauses of writeback cut short because it was needed at full speed (a writer
    /// waiting for room, the ring's head waiting for dirty blocks, a drain).
    pub writeback_pauses_cut: u64,
    pub checksum_errors: u64,
    pub io_errors: u64,
    /// Writes that made a clean (or uncached) block dirty: the rate writeback must match.
    pub blocks_dirtied: u64,
    /// Blocks written back to the backing device.
    pub writeback_blocks: u64,
    pub writeback_bytes: u64,
    /// Writeback batches (each ends with a sync of the backing device).
    pub writeback_batches: u64,
    /// Writeback batches written and synced to the backing device again because another
    /// backing sync failed between their writes and their sync (it may have dropped them).
    pub writeback_written_again: u64,
    /// Successful backing syncs that found another, failed sync not yet handled by its
    /// thread, and handled it first (`State::note_backing_synced`).
    pub backing_failures_caught_up: u64,
    /// Successful backing syncs that waited, before returning, for older syncs still in
    /// flight (one may have dropped the writes this one would vouch for: `backing.rs`).
    pub backing_syncs_waited: u64,
    /// Clean blocks dropped to make room.
    pub blocks_evicted: u64,
    /// Dirty copies kept after an overwrite from a later flush epoch, to be written back in
    /// their own (`writeback_order = consistent`).
    pub shadows_kept: u64,
    /// dm-writeboost's matrix, per 4 KiB block touched: read/write × hit/miss × the request
    /// covering the whole block or part of it.
    pub read_hits_full: u64,
    pub read_hits_partial: u64,
    pub read_misses_full: u64,
    pub read_misses_partial: u64,
    pub write_hits_full: u64,
    pub write_hits_partial: u64,
    pub write_misses_full: u64,
    pub write_misses_partial: u64,
    /// Read-miss blocks copied into the cache as clean blocks.
    pub promotions: u64,
    pub promotion_bytes: u64,
    /// Read misses not promoted because their stream ran past the sequential cutoff.
    pub promotions_sequential_skipped: u64,
    /// Read misses not promoted because the relocator was moving dirty blocks (the log is
    /// congested: every block promoted then costs a relocation, and is dropped a ring pass later).
    pub promotions_congested_skipped: u64,
    /// Promotions given up because the cache or the backing device changed under the read,
    /// or the log had no room.
    pub promotions_raced: u64,
    /// TRIM requests and bytes (they read as zeros afterwards).
    pub discards: u64,
    pub discard_bytes: u64,
    pub write_zeroes: u64,
    pub write_zeroes_bytes: u64,
    /// Write-zeroes whose zeros were written and synced again because another backing sync
    /// failed (or the connection was replaced) between their zeroing and their own sync.
    pub zeros_written_again: u64,
    /// Cached blocks dropped by TRIM, write-zeroes and write-around writes.
    pub blocks_invalidated: u64,
    /// Write requests handled in write-through and write-around mode.
    pub write_through_writes: u64,
    pub write_around_writes: u64,
    /// Syncs of the backing device for writes that bypassed the log: by flushes, and by the
    /// flusher every `clean_holes_per_backing_sync` clean entries written as holes.
    pub backing_syncs: u64,
    /// Clean block entries (write-through copies, promotions) the flusher wrote as holes, and
    /// partly dirty ones it wrote with only their dirty sectors valid, no backing sync covering
    /// their clean sectors yet: after a crash those sectors are read from the backing device.
    pub clean_entries_holed: u64,
    /// Large writes received straight into reserved log blocks and published there (no copy
    /// after the socket's), and those that gave their reservation up (a change to the same
    /// blocks, or a flush, meanwhile) and were written the ordinary way.
    pub writes_reserved: u64,
    pub reserved_writes_redone: u64,
    /// Cached copies of bypass writes whose clean sectors were marked dirty because a backing
    /// sync failed (or a connection was replaced) before any sync covered them: writeback
    /// writes them again (`state/lost.rs`).
    pub bypass_copies_redirtied: u64,
}

impl Counters {
    /// Every counter by name, for status output and metrics (names are part of the CLI's JSON
    /// contract: add, never rename).
    pub fn fields(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("reads", self.reads),
            ("read_bytes", self.read_bytes),
            ("read_hits", self.read_hits),
            ("read_misses", self.read_misses),
            ("read_hits_ram", self.read_hits_ram),
            ("read_hits_ram_cache", self.read_hits_ram_cache),
            ("read_hits_ram_cache_large", self.read_hits_ram_cache_large),
            (
                "ram_cache_second_touch_blocks",
                self.ram_cache_second_touch_blocks,
            ),
            (
                "ram_cache_first_touch_blocks",
                self.ram_cache_first_touch_blocks,
            ),
            ("ram_cache_refill_blocks", self.ram_cache_refill_blocks),
            ("ram_cache_write_blocks", self.ram_cache_write_blocks),
            ("writes", self.writes),
            ("write_bytes", self.write_bytes),
            ("write_hits", self.write_hits),
            ("write_misses", self.write_misses),
            ("write_partial", self.write_partial),
            ("write_in_place", self.write_in_place),
            ("write_merge_reads", self.write_merge_reads),
            ("flushes", self.flushes),
            ("fua_writes", self.fua_writes),
            ("chunks_sealed", self.chunks_sealed),
            ("periodic_seals", self.periodic_seals),
            ("chunks_written", self.chunks_written),
            ("chunk_bytes_written", self.chunk_bytes_written),
            ("cache_syncs", self.cache_syncs),
            ("segments_reclaimed", self.segments_reclaimed),
            ("blocks_relocated", self.blocks_relocated),
            ("relocations_without_room", self.relocations_without_room),
            ("superblock_writes", self.superblock_writes),
            ("checkpoint_pages_written", self.checkpoint_pages_written),
            ("write_waits", self.write_waits),
            ("write_waits_for_buffers", self.write_waits_for_buffers),
            ("write_wait_us", self.write_wait_us),
            ("writeback_pauses_cut", self.writeback_pauses_cut),
            ("checksum_errors", self.checksum_errors),
            ("io_errors", self.io_errors),
            ("blocks_dirtied", self.blocks_dirtied),
            ("writeback_blocks", self.writeback_blocks),
            ("writeback_bytes", self.writeback_bytes),
            ("writeback_batches", self.writeback_batches),
            ("blocks_evicted", self.blocks_evicted),
            ("shadows_kept", self.shadows_kept),
            ("read_hits_full", self.read_hits_full),
            ("read_hits_partial", self.read_hits_partial),
            ("read_misses_full", self.read_misses_full),
            ("read_misses_partial", self.read_misses_partial),
            ("write_hits_full", self.write_hits_full),
            ("write_hits_partial", self.write_hits_partial),
            ("write_misses_full", self.write_misses_full),
            ("write_misses_partial", self.write_misses_partial),
            ("promotions", self.promotions),
            ("promotion_bytes", self.promotion_bytes),
            (
                "promotions_sequential_skipped",
                self.promotions_sequential_skipped,
            ),
            (
                "promotions_congested_skipped",
                self.promotions_congested_skipped,
            ),
            ("promotions_raced", self.promotions_raced),
            ("discards", self.discards),
            ("discard_bytes", self.discard_bytes),
            ("write_zeroes", self.write_zeroes),
            ("write_zeroes_bytes", self.write_zeroes_bytes),
            ("zeros_written_again", self.zeros_written_again),
            ("writeback_written_again", self.writeback_written_again),
            (
                "backing_failures_caught_up",
                self.backing_failures_caught_up,
            ),
            ("backing_syncs_waited", self.backing_syncs_waited),
            ("blocks_invalidated", self.blocks_invalidated),
            ("write_through_writes", self.write_through_writes),
            ("write_around_writes", self.write_around_writes),
            ("backing_syncs", self.backing_syncs),
            ("clean_entries_holed", self.clean_entries_holed),
            ("writes_reserved", self.writes_reserved),
            ("reserved_writes_redone", self.reserved_writes_redone),
            ("bypass_copies_redirtied", self.bypass_copies_redirtied),
        ]
    }
}

/// What recovery found when the cache was opened.
#[derive(Clone, Debug, Default)]
pub struct RecoveryReport {
    pub clean: bool,
    pub chunks_replayed: u64,
    pub segments_replayed: u64,
    /// Chunks dropped at the tail because their data did not verify (torn writes).
    pub chunks_discarded: u64,
    /// Chunks whose data blocks were read and verified (those after the last synced point).
    pub chunks_data_verified: u64,
    pub blocks_recovered: u64,
    pub metadata_bytes_read: u64,
    pub data_bytes_read: u64,
    /// Zero ranges applied to the backing device again (see `open/replay.rs`).
    pub zero_ranges_reapplied: u64,
    /// Checkpoint bitmap pages with no valid copy, read as all ones (every block changed).
    pub checkpoint_pages_unreadable: u64,
    /// 1 when neither copy of the checkpoint table verified: the checkpoints are gone.
    pub checkpoint_table_unreadable: u64,
    pub duration_us: u64,
}

impl RecoveryReport {
    /// Every field by name, for status output and metrics.
    pub fn fields(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("clean", self.clean as u64),
            ("chunks_replayed", self.chunks_replayed),
            ("segments_replayed", self.segments_replayed),
            ("chunks_discarded", self.chunks_discarded),
            ("chunks_data_verified", self.chunks_data_verified),
            ("blocks_recovered", self.blocks_recovered),
            ("metadata_bytes_read", self.metadata_bytes_read),
            ("data_bytes_read", self.data_bytes_read),
            ("zero_ranges_reapplied", self.zero_ranges_reapplied),
            (
                "checkpoint_pages_unreadable",
                self.checkpoint_pages_unreadable,
            ),
            (
                "checkpoint_table_unreadable",
                self.checkpoint_table_unreadable,
            ),
            ("duration_us", self.duration_us),
        ]
    }
}

/// A consistent snapshot of the engine.
#[derive(Clone, Debug)]
pub struct Stats {
    pub counters: Counters,
    pub recovery: RecoveryReport,
    pub exported_size_bytes: u64,
    pub segment_size_bytes: u64,
    pub segment_count: u64,
    pub segments_in_use: u64,
    pub cache_blocks: u64,
    pub cached_blocks: u64,
    pub dirty_blocks: u64,
    pub writeback_rate_blocks_per_s: u64,
    pub writeback_seq: u64,
    pub writeback_error: Option<String>,
    /// `writeback_order`: "consistent" or "sorted".
    pub writeback_order: &'static str,
    /// The backing device alone holds the disk as it was at this flush point (ms since 1970,
    /// UTC): every write before it, none after it except a subset of the next epoch. `None`
    /// when unknown: in sorted order with dirty data (the backing device may be torn), or the
    /// oldest dirty data was recovered from an earlier session (flush times are not logged).
    pub backing_consistent_as_of_unix_ms: Option<u64>,
    /// Bytes of dirty data (whole 4 KiB blocks) the backing device is behind by.
    pub writeback_lag_bytes: u64,
    pub ram_buffers: u32,
    pub ram_buffers_free: u32,
    pub ram_buffer_bytes: u64,
    pub written_seq: u64,
    pub synced_seq: u64,
    pub next_seq: u64,
    pub head_segment_id: u64,
    pub epoch: u64,
    pub index_memory_bytes: u64,
    /// Block ranges recorded as reading zeros (WRITE_ZEROES, not written since) for block
    /// status, and zeroed blocks forgotten for want of room (reported as data, which is safe).
    pub zero_ranges: u64,
    pub zero_blocks_forgotten: u64,
    /// The engine failed and refuses IO: why (for a cache-device failure, the same line as
    /// `cache_failed`). `None` while serving from the backing device alone.
    pub failed: Option<String>,
    /// The cache device failed: `cache failed: <reason>`, and when serving from the backing
    /// device alone, what that means and what to do.
    pub cache_failed: Option<String>,
    /// Requests go to the backing device alone (the cache device failed).
    pub serving_alone: bool,
    /// Bytes whose newest data was lost with the cache device and not written since (reads of
    /// them fail with EIO), and how many were lost when it failed.
    pub lost_bytes: u64,
    pub lost_at_failure_bytes: u64,
    /// `cache_mode`: "write-back", "write-through" or "write-around".
    pub mode: &'static str,
    pub read_cache: bool,
    /// Segments by state: holding a RAM buffer (open or being written), on the cache device
    /// only, free.
    pub segments_in_ram: u64,
    pub segments_on_disk: u64,
    pub segments_free: u64,
    /// The RAM cache (`ram_cache_mib`, capped at 1/8 of physical memory or the cgroup limit; 0: off): its room,
    /// and the 4 KiB copies it holds now.
    pub ram_cache_bytes: u64,
    pub ram_cache_blocks: u64,
}

/// Counts one access in a (hit | miss) × (full | partial) table and in the hit / miss totals:
/// `table` is [hits full, hits partial, misses full, misses partial], `totals` [hits, misses].
pub fn count_access(hit: bool, full: bool, table: [&mut u64; 4], totals: [&mut u64; 2]) {
    let [hits_full, hits_partial, misses_full, misses_partial] = table;
    *match (hit, full) {
        (true, true) => hits_full,
        (true, false) => hits_partial,
        (false, true) => misses_full,
        (false, false) => misses_partial,
    } += 1;
    let [hits, misses] = totals;
    *if hit { hits } else { misses } += 1;
}
