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
    pub superblock_writes: u64,
    /// Times a writer waited for room in the log or for a RAM buffer.
    pub write_waits: u64,
    pub checksum_errors: u64,
    pub io_errors: u64,
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
    pub duration_us: u64,
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
    pub ram_buffers: u32,
    pub ram_buffers_free: u32,
    pub ram_buffer_bytes: u64,
    pub written_seq: u64,
    pub synced_seq: u64,
    pub next_seq: u64,
    pub head_segment_id: u64,
    pub epoch: u64,
    pub index_memory_bytes: u64,
    pub failed: Option<String>,
}
