//! The RAM cache (the "hot tier"): copies of cache-device blocks that small reads read and
//! verified, and that small writes wrote, so a repeated small read of them is a copy out of
//! RAM rather than a device read. It is what a host page cache gives a server that reads and
//! writes its files buffered, kept by the engine, sized by the `ram_cache_mib` tunable, and
//! never trusted beyond what it can prove.
//!
//! **No stale hit without any invalidation.** An entry is keyed by where its bytes came from:
//! the cache block and the id of the segment then in its slot. Segment ids only rise in an
//! engine's life (a slot's next use has a higher id), and a cache block of a segment is
//! written to the cache device once (blocks change only in RAM buffers, before their chunk is
//! written), so a key names one content for ever. The read path looks a block up only when the
//! index maps the wanted lba to that cache block now (planned under the state lock, its segment
//! pinned, so the id read then is the one the block holds until the read ends): a block
//! overwritten, trimmed, evicted or relocated since is never asked for, and its entry ages out.
//! An entry also carries the lba and CRC it was verified against; a hit checks both.
//!
//! **Writes.** A write of at most `ADMIT_MAX_REQUEST_BYTES` marks each block it copies into
//! the open chunk (`keep`, beside the block's ready CRC: `state/buffers.rs`; the last write
//! into a position decides, and a position handed out anew starts unmarked). When the flusher
//! has written the block's chunk to the cache device, and before it releases the chunk's RAM
//! buffer, it stores each marked whole block (its entry's every sector valid) under the key a
//! read would use: the cache block and the id of its segment, read under the state lock when
//! the round took the chunk (`log::flusher::keep_written`), with the lba and the CRC the
//! flusher publishes to the index for it. That keeps the argument above true: a block changes
//! only while its chunk is open (an overwrite there is in place, under the state lock, and
//! leaves the mark and CRC of the last write); once sealed it never changes, and an overwrite
//! goes to another cache block, a new key. So the bytes the flusher stores are the bytes the
//! device holds under that key, taken after the last change any write could make to them: an
//! overwrite in the RAM buffer before the flush leaves no older copy under any key a read can
//! ask for, and one after it maps the lba to a new key, the old entry never asked for again.
//! A block overwritten between its seal and its flush is stored all the same (the flusher
//! checks nothing under the lock): the index no longer maps it, so it is never asked for and
//! ages out, entering unreferenced like every stored block. The store is the flusher's work,
//! off the request path: the write path sets one more bit in a word it already writes. And
//! only when reads came in since the flusher's last look (a workload that only writes keeps
//! nothing) and the flusher has slack (`log::flusher::keeps_writes`: a round short of a full
//! queue, no writer waiting for room, half the RAM buffers free) and within
//! `WRITE_KEEP_BLOCKS_PER_SEC`: a write storm's blocks are read from the device, as before,
//! rather than slow the flusher every writer waits on.
//! Larger writes (a restore, a copy streaming through) store nothing and leave no ghost
//! entries: what they write is read again, if at all, by reads, whose own touches decide;
//! they must not flush what small reads keep hot. Nor do promotions or relocations store.
//!
//! **Layout.** `SHARDS` shards, each behind its own lock, each a table of `WAYS`-way sets with
//! CLOCK (second chance) eviction within a set: a lookup or an insert touches one set, and
//! nothing is allocated on either. A large read's run is looked up in one batch
//! (`HotTier::get_many`): one hold of each shard's lock for all its blocks in that shard,
//! rather than a lock and a copy per block (256 per MiB). Each shard's block copies live in
//! one anonymous mapping (`MAP_NORESERVE`, so memory is used only as blocks are stored).
//!
//! **Admission.** A read of at most `ADMIT_MAX_REQUEST_BYTES` puts every whole block it
//! verified from the device (a small read is a lookup: one read is worth a copy). A larger
//! read puts a device run's blocks only on the run's second touch, and only if the second
//! came soon enough for the copies to live until a third: each shard also keeps a ghost
//! table, one entry per entry the shard has room for, in the same `WAYS`-way sets (a key's
//! ghost entry is in its copy's set; the oldest entry of the set goes), each the 32-bit
//! fingerprint of the first block of a large-read run read from the device and the ghost
//! clock then (blocks of large-read runs read from the device so far, 32 bits). A run whose
//! fingerprint is there, stamped less than the tier's capacity in blocks ago, enters whole;
//! either way its entry is written anew (fingerprint, clock now). So one sequential pass over
//! data read once only writes entries (8 bytes per run; no copy, no eviction of the blocks
//! small reads keep hot); a second pass over data that fits fills the cache; and a loop over
//! more than the cache holds, which would evict each run before its next pass, stores
//! nothing (no copy per block for no hit). A run, not a block, is the unit because a large
//! read uses the cache a run at a time (`path::read`): a run served from it must be there
//! whole. The ghost is only advice: a lost or false entry (a collision, a race, the clock
//! wrapping) costs a copy or a hit, never a wrong answer, since what is served is still
//! checked by key, lba and CRC.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use crate::format::BLOCK_SIZE_BYTES;
use crate::geometry::CacheBlock;
use crate::sync::Mutex;

const BLOCK: usize = BLOCK_SIZE_BYTES as usize;
/// Shards, each with its own lock: enough that the request threads of a 2-64 CPU server rarely
/// meet on one (a lock is held for one 4 KiB copy, or a large read's copies of the blocks of a
/// run that are in the shard, ~1/16 of them).
pub const SHARDS: usize = 16;
/// Entries per set: a lookup compares at most this many keys; CLOCK picks the victim among them.
pub const WAYS: usize = 8;
/// Reads of at most this many bytes look up each block and fill the tier with every block they
/// read from the device. Larger reads use it a device run at a time (a run whose first block
/// it lacks is read whole from the device, one lookup spent: `path::read`) and fill it only on
/// a run's second touch (module docs: a scan read once must neither flush it nor pay a copy
/// per block).
pub const ADMIT_MAX_REQUEST_BYTES: usize = 64 << 10;

/// Blocks of small writes the flusher may keep per second (a token bucket holding at most a
/// second's worth, full at start): 32 MiB/s, above what the `latency` job's foreground writes
/// at iodepth 1 (~8,000 a second at best), while a write storm keeps under 1% of a
/// 1M-writes/s stream and the flusher's time stays its log writes' (a kept block costs a 4 KiB
/// copy, and while the RAM cache fills a page fault, ~5 us on a VM: at every block, `bench
/// engine` wrote 1/15 as fast; at 32,768 a second, ~0.7x with one writer on a loaded machine,
/// the flusher's work taking the writer's CPU). Module docs, "Writes".
pub const WRITE_KEEP_BLOCKS_PER_SEC: u64 = 8_192;

/// The most blocks one `get_many` looks up: a read window (`path::read::WINDOW_BLOCKS`).
pub const MAX_BATCH_BLOCKS: usize = 256;
// `get_many` orders its wants by an index of one byte.
const _: () = assert!(MAX_BATCH_BLOCKS <= 256);

/// A block `HotTier::get_many` wants: `get`'s arguments, with where its bytes go in the batch's
/// buffer.
#[derive(Clone, Copy, Debug)]
pub struct Want {
    pub key: HotKey,
    pub lba: u64,
    pub crc: u32,
    pub in_block: usize,
    pub dst_start: usize,
    pub len: usize,
}

/// How many of a shard's wants ahead `get_many` hints a set's keys into the CPU cache: a lookup
/// is a few ns of work and ~100 ns of waiting for its set's lines otherwise.
const PREFETCH_AHEAD: usize = 4;

/// Hints the line at `at` into the CPU cache: only a hint, never a fault.
#[inline]
fn prefetch(at: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint: it never faults and loads nothing visible.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(at.cast::<i8>())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

/// Where a block's bytes came from: a key names one content for ever (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HotKey {
    /// The id of the segment in the block's slot when it was read (ids start at 1).
    pub segment_id: u64,
    pub cache_block: CacheBlock,
}

/// One way of a set. `segment_id` 0: empty.
#[derive(Clone, Copy, Debug, Default)]
struct Meta {
    segment_id: u64,
    lba: u64,
    cache_block: CacheBlock,
    crc: u32,
}

/// Anonymous memory holding a shard's block copies.
struct Region {
    ptr: *mut u8,
    len_bytes: usize,
}

// SAFETY: the region is owned by its shard and only touched under the shard's lock.
unsafe impl Send for Region {}

impl Region {
    fn empty() -> Region {
        Region {
            ptr: std::ptr::null_mut(),
            len_bytes: 0,
        }
    }

    /// `None` if the kernel refuses the mapping (the tier then stays off).
    fn map(len_bytes: usize) -> Option<Region> {
        assert!(len_bytes > 0);
        // SAFETY: a new private anonymous mapping at an address the kernel picks; nothing
        // existing is touched. MAP_NORESERVE: pages are committed only once written.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len_bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        (raw != libc::MAP_FAILED).then(|| Region {
            ptr: raw.cast::<u8>(),
            len_bytes,
        })
    }

    fn block(&self, i: usize) -> &[u8] {
        assert!((i + 1) * BLOCK <= self.len_bytes);
        // SAFETY: in bounds (checked above); the mapping lives as long as `self`, and `&self`
        // (under the shard's lock) excludes writers.
        unsafe { std::slice::from_raw_parts(self.ptr.add(i * BLOCK), BLOCK) }
    }

    /// Hints block `i`'s first line (and its page's translation) into the CPU cache.
    fn prefetch_block(&self, i: usize) {
        prefetch(self.ptr.wrapping_add(i * BLOCK));
    }

    fn block_mut(&mut self, i: usize) -> &mut [u8] {
        assert!((i + 1) * BLOCK <= self.len_bytes);
        // SAFETY: as `block`, with `&mut self` excluding every other access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(i * BLOCK), BLOCK) }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if self.len_bytes > 0 {
            // SAFETY: the mapping made in `map`, unmapped once; no reference into it outlives
            // `self`.
            let rc = unsafe { libc::munmap(self.ptr.cast(), self.len_bytes) };
            debug_assert_eq!(rc, 0, "munmap of the RAM cache");
        }
    }
}

/// One shard: `sets` sets of `ways` entries; entry `set * ways + way` keeps its copy in block
/// `set * ways + way` of `data`.
struct Shard {
    sets: usize,
    ways: usize,
    meta: Vec<Meta>,
    /// Per set: the CLOCK reference bits, bit `way`.
    referenced: Vec<u8>,
    /// Per set: the CLOCK hand.
    hands: Vec<u8>,
    data: Region,
    held_blocks: u64,
    /// Per entry: the fingerprint (high 32 bits; 0: empty) of the first block of a large-read
    /// run read from the device and the ghost clock then (low 32), in the sets of `meta`, as
    /// many as the shard has entries: the second-touch admission (module docs).
    ghost: Vec<u64>,
}

impl Shard {
    fn off() -> Shard {
        Shard {
            sets: 0,
            ways: 0,
            meta: Vec::new(),
            referenced: Vec::new(),
            hands: Vec::new(),
            data: Region::empty(),
            held_blocks: 0,
            ghost: Vec::new(),
        }
    }

    /// A shard of `blocks` entries (0: off); off if the memory cannot be mapped.
    fn with_blocks(blocks: usize) -> Shard {
        let ways = blocks.min(WAYS);
        if ways == 0 {
            return Shard::off();
        }
        let sets = blocks / ways;
        let Some(data) = Region::map(sets * ways * BLOCK) else {
            return Shard::off();
        };
        Shard {
            sets,
            ways,
            meta: vec![Meta::default(); sets * ways],
            referenced: vec![0; sets],
            hands: vec![0; sets],
            data,
            held_blocks: 0,
            ghost: vec![0; sets * ways],
        }
    }

    fn find(&self, set: usize, key: HotKey) -> Option<usize> {
        let base = set * self.ways;
        (base..base + self.ways).find(|&i| {
            self.meta[i].segment_id == key.segment_id && self.meta[i].cache_block == key.cache_block
        })
    }

    /// `HotTier::get` within the shard (`h` the key's hash, `sets` > 0): copies the held block's
    /// bytes and marks it referenced.
    fn copy_out(
        &mut self,
        h: u64,
        key: HotKey,
        lba: u64,
        crc: u32,
        in_block: usize,
        dst: &mut [u8],
    ) -> bool {
        let Some(i) = self.lookup(h, key, lba, crc) else {
            return false;
        };
        dst.copy_from_slice(&self.data.block(i)[in_block..in_block + dst.len()]);
        self.mark_referenced(i);
        true
    }

    /// The entry holding `key` (`h` its hash, `sets` > 0), if it was verified as backing block
    /// `lba` with `crc`.
    fn lookup(&self, h: u64, key: HotKey, lba: u64, crc: u32) -> Option<usize> {
        let set = (h % self.sets as u64) as usize;
        let i = self.find(set, key)?;
        let m = self.meta[i];
        // A key names one content (module docs): the same place verified as another block
        // would be a bug. Served from the device then, which checks its CRC.
        debug_assert!(
            m.lba == lba && m.crc == crc,
            "RAM cache entry {key:?} holds lba {} crc {:#x}, the read wants lba {lba} crc {crc:#x}",
            m.lba,
            m.crc
        );
        (m.lba == lba && m.crc == crc).then_some(i)
    }

    /// Sets entry `i`'s CLOCK reference bit (it was read).
    fn mark_referenced(&mut self, i: usize) {
        let set = i / self.ways;
        self.referenced[set] |= 1 << (i - set * self.ways);
    }

    /// Hints the keys of the set of hash `h` (`sets` > 0) into the CPU cache.
    fn prefetch_set(&self, h: u64) {
        let base = (h % self.sets as u64) as usize * self.ways;
        let bytes = self.ways * std::mem::size_of::<Meta>();
        let start = self.meta[base..].as_ptr().cast::<u8>();
        for offset in (0..bytes).step_by(64).chain(std::iter::once(bytes - 1)) {
            prefetch(start.wrapping_add(offset));
        }
    }

    /// The way of `set` to fill: an empty one, else CLOCK's victim (the first from the hand
    /// with its reference bit clear, clearing the bits it passes). With `one_step`, the hand
    /// moves once only: `None` if the way it passes was referenced (its bit is cleared, so a
    /// set is never closed for good to those who ask so).
    fn victim(&mut self, set: usize, one_step: bool) -> Option<usize> {
        let base = set * self.ways;
        if let Some(i) = (base..base + self.ways).find(|&i| self.meta[i].segment_id == 0) {
            return Some(i);
        }
        loop {
            let way = self.hands[set] as usize;
            self.hands[set] = ((way + 1) % self.ways) as u8;
            let bit = 1u8 << way;
            if self.referenced[set] & bit == 0 {
                return Some(base + way);
            }
            self.referenced[set] &= !bit;
            if one_step {
                return None;
            }
        }
    }
}

/// The engine's RAM cache (module docs).
pub struct HotTier {
    shards: Box<[Mutex<Shard>]>,
    /// Entries the tier has room for (0: off): the read path's check, without a lock.
    capacity_blocks: AtomicU64,
    /// Block reads served from the tier (`read_hits_ram_cache`).
    hits: AtomicU64,
    /// False only while no block was stored since the last resize: the read path then skips
    /// its lookups (an over-estimate is harmless, so it is set before the store it announces
    /// and cleared before the shards are replaced).
    may_hold: AtomicBool,
    /// Of `hits`, those of reads larger than `ADMIT_MAX_REQUEST_BYTES`.
    large_hits: AtomicU64,
    /// Blocks of large-read runs stored on their run's second touch, and blocks of large-read
    /// runs read from the device and not stored (the run's first touch, or a ghost entry
    /// since overwritten).
    large_admitted: AtomicU64,
    large_first_touches: AtomicU64,
    /// Of `large_admitted`, blocks stored at once because the rest of their run was served
    /// from the tier (`count_refill`).
    large_refilled: AtomicU64,
    /// The ghost clock: blocks of large-read runs read from the device (module docs).
    ghost_clock_blocks: AtomicU64,
    /// Blocks of small writes stored by the flusher (`ram_cache_write_blocks`).
    written: AtomicU64,
    /// The flusher's budget of blocks to keep (`WRITE_KEEP_BLOCKS_PER_SEC`): when it was last
    /// topped up, and the blocks left.
    write_budget: Mutex<(Option<Instant>, u64)>,
    /// The engine's read count (`Counters::reads`) plus one when the flusher last looked
    /// (`reads_came`; 0: never).
    reads_seen_plus_one: AtomicU64,
}

impl HotTier {
    /// A tier of `bytes` (rounded down to whole sets; 0 or too small for one block per shard:
    /// off).
    pub fn new(bytes: u64) -> HotTier {
        let tier = HotTier {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::off())).collect(),
            capacity_blocks: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            may_hold: AtomicBool::new(false),
            large_hits: AtomicU64::new(0),
            large_admitted: AtomicU64::new(0),
            large_first_touches: AtomicU64::new(0),
            large_refilled: AtomicU64::new(0),
            ghost_clock_blocks: AtomicU64::new(0),
            written: AtomicU64::new(0),
            write_budget: Mutex::new((None, WRITE_KEEP_BLOCKS_PER_SEC)),
            reads_seen_plus_one: AtomicU64::new(0),
        };
        tier.resize(bytes);
        tier
    }

    /// Drops every copy and makes room for `bytes` (as `new`). Each shard changes under its
    /// own lock, so reads in flight see either the old shard or the new one, both correct.
    pub fn resize(&self, bytes: u64) {
        let per_shard_blocks = usize::try_from(bytes / BLOCK_SIZE_BYTES / SHARDS as u64)
            .expect("a RAM cache that fits the address space");
        // Off first, so no read counts on a capacity being built.
        self.capacity_blocks.store(0, Ordering::Relaxed);
        // Cleared before the swaps: a store into a new shard sets it again after.
        self.may_hold.store(false, Ordering::Relaxed);
        let mut capacity = 0u64;
        for shard in self.shards.iter() {
            // Mapped before the lock: readers wait only for the swap. The old region is
            // unmapped after the lock is let go.
            let fresh = Shard::with_blocks(per_shard_blocks);
            capacity += (fresh.sets * fresh.ways) as u64;
            let old = std::mem::replace(&mut *shard.lock(), fresh);
            drop(old);
        }
        self.capacity_blocks.store(capacity, Ordering::Relaxed);
    }

    /// Whether the tier holds room for anything.
    pub fn enabled(&self) -> bool {
        self.capacity_blocks.load(Ordering::Relaxed) > 0
    }

    pub fn capacity_bytes(&self) -> u64 {
        self.capacity_blocks.load(Ordering::Relaxed) * BLOCK_SIZE_BYTES
    }

    /// Blocks held now (a snapshot: each shard's count is read under its lock in turn).
    pub fn held_blocks(&self) -> u64 {
        self.shards.iter().map(|s| s.lock().held_blocks).sum()
    }

    /// Whether a lookup may find anything: the tier is on and stored a block since it was
    /// last resized. False: the read path skips its lookups (a cold tier costs a read nothing).
    pub fn may_hold_any(&self) -> bool {
        self.enabled() && self.may_hold.load(Ordering::Relaxed)
    }

    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// Of `hits`, block reads of reads larger than `ADMIT_MAX_REQUEST_BYTES`.
    pub fn large_hits(&self) -> u64 {
        self.large_hits.load(Ordering::Relaxed)
    }

    /// Blocks of large-read runs stored on a second touch.
    pub fn large_admitted(&self) -> u64 {
        self.large_admitted.load(Ordering::Relaxed)
    }

    /// Blocks of large-read runs read from the device and not stored (a first touch).
    pub fn large_first_touches(&self) -> u64 {
        self.large_first_touches.load(Ordering::Relaxed)
    }

    /// Counts block reads served from the tier: `small` of small reads, `large` of large ones.
    pub fn count_hits(&self, small: u64, large: u64) {
        if small + large > 0 {
            self.hits.fetch_add(small + large, Ordering::Relaxed);
        }
        if large > 0 {
            self.large_hits.fetch_add(large, Ordering::Relaxed);
        }
    }

    /// Counts `blocks` blocks of a large read stored without a second touch: the part of a run
    /// the RAM cache lacked when it served the rest (`path::read`), counted as stored on a
    /// second touch.
    pub fn count_refill(&self, blocks: u64) {
        self.large_admitted.fetch_add(blocks, Ordering::Relaxed);
        self.large_refilled.fetch_add(blocks, Ordering::Relaxed);
    }

    /// Blocks of small writes stored once their chunk was written (`put_written`).
    pub fn written_blocks(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }

    /// Of `large_admitted`, blocks stored at once, the rest of their run served from the tier.
    pub fn large_refilled(&self) -> u64 {
        self.large_refilled.load(Ordering::Relaxed)
    }

    /// The admission of a large-read run of `blocks` blocks read from the device, whose first
    /// block is `first`: true on its second touch within the tier's capacity of large-read
    /// device blocks (store the run's verified blocks), else false; the touch is noted either
    /// way (module docs). Counts the run's blocks. One lock of one shard, no allocation.
    pub fn second_touch(&self, first: HotKey, blocks: u64) -> bool {
        debug_assert!(first.segment_id != 0);
        debug_assert!(blocks > 0);
        let capacity_blocks = self.capacity_blocks.load(Ordering::Relaxed);
        if capacity_blocks == 0 {
            return false;
        }
        // The clock before this run: its own blocks do not count against it.
        let now = self.ghost_clock_blocks.fetch_add(blocks, Ordering::Relaxed) as u32;
        let reach_blocks = u32::try_from(capacity_blocks).unwrap_or(u32::MAX);
        let (s, h) = self.place(first);
        let admitted = {
            let mut shard = self.shards[s].lock();
            if shard.ghost.is_empty() {
                return false;
            }
            debug_assert_eq!(shard.ghost.len(), shard.sets * shard.ways);
            // The key's set, as for its copy (`h`'s low bits, under 2^28 sets a shard); the
            // fingerprint is the 32 bits above them (`h` has 60), never 0 (empty).
            let ways = shard.ways;
            let base = (h % shard.sets as u64) as usize * ways;
            let fingerprint = (h >> 28) as u32 | 1;
            let age = |entry: u64| now.wrapping_sub(entry as u32);
            let ghost = &mut shard.ghost[base..base + ways];
            let (slot, seen) = match ghost.iter().position(|&e| (e >> 32) as u32 == fingerprint) {
                Some(i) => (i, age(ghost[i]) < reach_blocks),
                // Else the empty or oldest entry of the set goes.
                None => {
                    let oldest = (0..ghost.len())
                        .max_by_key(|&i| {
                            if ghost[i] == 0 {
                                u32::MAX
                            } else {
                                age(ghost[i])
                            }
                        })
                        .expect("a set has ways");
                    (oldest, false)
                }
            };
            // Stamped anew either way: a run read again and again stays admitted (its blocks
            // evicted meanwhile enter again), a loop too long for the tier never is.
            ghost[slot] = u64::from(fingerprint) << 32 | u64::from(now);
            seen
        };
        let counter = if admitted {
            &self.large_admitted
        } else {
            &self.large_first_touches
        };
        counter.fetch_add(blocks, Ordering::Relaxed);
        admitted
    }

    /// Drops `key`'s copy if held (tests: a block its set evicted).
    #[cfg(test)]
    pub fn forget(&self, key: HotKey) {
        let (s, h) = self.place(key);
        let mut shard = self.shards[s].lock();
        if shard.sets == 0 {
            return;
        }
        let set = (h % shard.sets as u64) as usize;
        if let Some(i) = shard.find(set, key) {
            shard.meta[i] = Meta::default();
            shard.held_blocks -= 1;
        }
    }

    fn place(&self, key: HotKey) -> (usize, u64) {
        // SplitMix64's finaliser: consecutive blocks and ids spread over every shard and set.
        let mut h = key.segment_id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(key.cache_block);
        h = (h ^ (h >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        h = (h ^ (h >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        h ^= h >> 31;
        ((h % SHARDS as u64) as usize, h / SHARDS as u64)
    }

    /// If the tier holds block `key`, verified as backing block `lba` with `crc`, copies its
    /// bytes from `in_block` on into `dst` and returns true.
    pub fn get(&self, key: HotKey, lba: u64, crc: u32, in_block: usize, dst: &mut [u8]) -> bool {
        debug_assert!(key.segment_id != 0);
        assert!(in_block + dst.len() <= BLOCK);
        let (s, h) = self.place(key);
        let mut shard = self.shards[s].lock();
        if shard.sets == 0 {
            return false;
        }
        shard.copy_out(h, key, lba, crc, in_block, dst)
    }

    /// `get` of up to `MAX_BATCH_BLOCKS` blocks into one buffer, with one hold of each shard's
    /// lock for all the wanted blocks it may hold (a large read's run: 16 holds rather than
    /// one per block). Each block is checked as by `get` (key, lba and CRC); `hit[i]` says
    /// whether `wants[i]` was copied into `buf[dst_start..dst_start + len]`. Returns the hits.
    pub fn get_many(&self, wants: &[Want], buf: &mut [u8], hit: &mut [bool]) -> usize {
        assert!(wants.len() <= MAX_BATCH_BLOCKS);
        assert_eq!(hit.len(), wants.len());
        // Each want's shard and hash, then the wants ordered by shard (a counting sort).
        let mut hashes = [0u64; MAX_BATCH_BLOCKS];
        let mut shard_of = [0u8; MAX_BATCH_BLOCKS];
        let mut starts = [0usize; SHARDS + 1];
        for (i, w) in wants.iter().enumerate() {
            debug_assert!(w.key.segment_id != 0);
            assert!(w.in_block + w.len <= BLOCK && w.dst_start + w.len <= buf.len());
            let (s, h) = self.place(w.key);
            hashes[i] = h;
            shard_of[i] = s as u8;
            starts[s + 1] += 1;
            hit[i] = false;
        }
        for s in 0..SHARDS {
            starts[s + 1] += starts[s];
        }
        let mut order = [0u8; MAX_BATCH_BLOCKS];
        let mut next = starts;
        for (i, &s) in shard_of[..wants.len()].iter().enumerate() {
            let s = s as usize;
            order[next[s]] = i as u8;
            next[s] += 1;
        }
        let mut hits = 0;
        // Per want of a shard, the entry found (`usize::MAX`: none).
        let mut found = [usize::MAX; MAX_BATCH_BLOCKS];
        for s in 0..SHARDS {
            let of_shard = &order[starts[s]..starts[s + 1]];
            if of_shard.is_empty() {
                continue;
            }
            let mut shard = self.shards[s].lock();
            if shard.sets == 0 {
                continue;
            }
            // Two passes, so the memory each waits for is asked for ahead: the lookups, each
            // set's keys hinted `PREFETCH_AHEAD` wants before its own (the sets are random
            // lines of a large table: a lookup waits ~100 ns for each otherwise), then the
            // copies, each next block's first line hinted (its page's translation too).
            for &first in of_shard.iter().take(PREFETCH_AHEAD) {
                shard.prefetch_set(hashes[first as usize]);
            }
            for (k, &i) in of_shard.iter().enumerate() {
                if let Some(&ahead) = of_shard.get(k + PREFETCH_AHEAD) {
                    shard.prefetch_set(hashes[ahead as usize]);
                }
                let w = &wants[i as usize];
                found[k] = shard
                    .lookup(hashes[i as usize], w.key, w.lba, w.crc)
                    .unwrap_or(usize::MAX);
            }
            for (k, &i) in of_shard.iter().enumerate() {
                let entry = found[k];
                if entry == usize::MAX {
                    continue;
                }
                if let Some(&next) = found[k + 1..of_shard.len()]
                    .iter()
                    .find(|&&e| e != usize::MAX)
                {
                    shard.data.prefetch_block(next);
                }
                let w = &wants[i as usize];
                buf[w.dst_start..w.dst_start + w.len]
                    .copy_from_slice(&shard.data.block(entry)[w.in_block..w.in_block + w.len]);
                shard.mark_referenced(entry);
                hit[i as usize] = true;
                hits += 1;
            }
        }
        hits
    }

    /// Stores a copy of `block`, read from `key` and verified as backing block `lba` with
    /// `crc` (only verified bytes may enter). Replaces CLOCK's victim of its set.
    pub fn put(&self, key: HotKey, lba: u64, crc: u32, block: &[u8]) {
        self.store(key, lba, crc, block, false);
    }

    /// How many blocks of small writes the flusher may keep now (`WRITE_KEEP_BLOCKS_PER_SEC`);
    /// it spends them with `spend_write_budget`. The flusher is the one caller at a time.
    pub fn write_budget(&self, now: Instant) -> u64 {
        let mut b = self.write_budget.lock();
        if let Some(at) = b.0 {
            let ns = now.saturating_duration_since(at).as_nanos() as u64;
            let earned = ns.saturating_mul(WRITE_KEEP_BLOCKS_PER_SEC) / 1_000_000_000;
            if earned > 0 {
                b.1 = (b.1 + earned).min(WRITE_KEEP_BLOCKS_PER_SEC);
                b.0 = Some(now);
            }
        } else {
            b.0 = Some(now);
        }
        b.1
    }

    /// Whether the engine read anything since the flusher's last look (`reads`: its read
    /// count now; on the first look, whether it ever read): the flusher keeps written blocks
    /// only for a workload that reads.
    pub fn reads_came(&self, reads: u64) -> bool {
        self.reads_seen_plus_one.swap(reads + 1, Ordering::Relaxed) != reads + 1 && reads > 0
    }

    pub fn spend_write_budget(&self, blocks: u64) {
        let mut b = self.write_budget.lock();
        b.1 = b.1.saturating_sub(blocks);
    }

    /// `put` for a block a small write wrote, by the flusher once the block's chunk is on the
    /// cache device (module docs, "Writes"): `block` is the bytes written there under `key`,
    /// `crc` the checksum the index publishes for it. It enters as a small read's block does
    /// (unreferenced: a write is no evidence that it will be read).
    pub fn put_written(&self, key: HotKey, lba: u64, crc: u32, block: &[u8]) {
        if self.store(key, lba, crc, block, false) {
            self.written.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// `put` for a large read's block: it takes an empty way or one not referenced since the
    /// hand last passed, else stores nothing, the hand passing one way (clearing its bit), and
    /// it enters referenced (it was read twice). So the blocks of a loop that overflows a set
    /// keep their places and hit every pass (the one too many misses), rather than each
    /// evicting the next one to be read, so that every block of the loop misses; and blocks
    /// no longer read still age out of the way, a bit per refused store.
    pub fn put_large(&self, key: HotKey, lba: u64, crc: u32, block: &[u8]) {
        self.store(key, lba, crc, block, true);
    }

    /// Whether the block was stored (not when held already, off, or refused a way).
    fn store(&self, key: HotKey, lba: u64, crc: u32, block: &[u8], one_step: bool) -> bool {
        debug_assert!(key.segment_id != 0);
        assert_eq!(block.len(), BLOCK);
        let (s, h) = self.place(key);
        let mut shard = self.shards[s].lock();
        if shard.sets == 0 {
            return false;
        }
        let set = (h % shard.sets as u64) as usize;
        if shard.find(set, key).is_some() {
            return false; // the same bytes (a key names one content)
        }
        let Some(i) = shard.victim(set, one_step) else {
            return false;
        };
        self.may_hold.store(true, Ordering::Relaxed);
        if shard.meta[i].segment_id == 0 {
            shard.held_blocks += 1;
            debug_assert!(shard.held_blocks <= (shard.sets * shard.ways) as u64);
        }
        shard.data.block_mut(i).copy_from_slice(block);
        shard.meta[i] = Meta {
            segment_id: key.segment_id,
            lba,
            cache_block: key.cache_block,
            crc,
        };
        // A small read's new entry starts unreferenced: one read is no evidence of heat, a
        // second one is. A large read's was read twice (its second touch) or is part of a run
        // read from RAM: referenced.
        let way = i - set * shard.ways;
        if one_step {
            shard.referenced[set] |= 1 << way;
        } else {
            shard.referenced[set] &= !(1 << way);
        }
        true
    }
}

/// The tier's size for `ram_cache_mib`: at most an eighth of the memory this process may use
/// (physical memory, or its cgroup's limit if lower), so a default meant for a server never
/// pushes a small machine or a container into swap or the OOM killer.
pub fn size_for_mib(ram_cache_mib: u64) -> u64 {
    let wanted = ram_cache_mib.saturating_mul(1 << 20);
    wanted.min(memory_bytes() / 8)
}

fn memory_bytes() -> u64 {
    // SAFETY: sysconf only reads system configuration.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    if pages <= 0 || page <= 0 {
        return 0; // unknown: no RAM cache rather than a guess
    }
    let physical = (pages as u64).saturating_mul(page as u64);
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    cgroup_limit_paths(&cgroups)
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .filter_map(|text| parse_limit(&text))
        .fold(physical, u64::min)
}

/// The memory-limit files of this process's cgroups, from `/proc/self/cgroup`: v2's
/// `memory.max` (line `0::PATH`) and v1's `memory.limit_in_bytes` (line `N:...memory...:PATH`),
/// at their usual mount points. Limits of ancestor cgroups are not read.
fn cgroup_limit_paths(proc_self_cgroup: &str) -> Vec<String> {
    let mut paths = Vec::new();
    for line in proc_self_cgroup.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let path = path.trim_end_matches('/');
        if id == "0" && controllers.is_empty() {
            paths.push(format!("/sys/fs/cgroup{path}/memory.max"));
        } else if controllers.split(',').any(|c| c == "memory") {
            paths.push(format!("/sys/fs/cgroup/memory{path}/memory.limit_in_bytes"));
        }
    }
    paths
}

/// A cgroup memory limit in bytes; `None` for none ("max", or v1's "unlimited", a number near
/// 2^63) or an unreadable value.
fn parse_limit(text: &str) -> Option<u64> {
    text.trim().parse::<u64>().ok().filter(|&v| v < 1 << 62)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block_of(v: u8) -> Vec<u8> {
        vec![v; BLOCK]
    }

    fn key(segment_id: u64, cache_block: u32) -> HotKey {
        HotKey {
            segment_id,
            cache_block,
        }
    }

    fn get_block(t: &HotTier, k: HotKey, lba: u64, crc: u32) -> Option<Vec<u8>> {
        let mut b = vec![0u8; BLOCK];
        t.get(k, lba, crc, 0, &mut b).then_some(b)
    }

    #[test]
    fn a_stored_block_is_served_whole_and_in_part() {
        let t = HotTier::new(1 << 20);
        assert_eq!(t.capacity_bytes(), 1 << 20);
        let mut b = block_of(0);
        for (i, x) in b.iter_mut().enumerate() {
            *x = (i / 512) as u8;
        }
        t.put(key(3, 17), 99, 0xabc, &b);
        assert_eq!(get_block(&t, key(3, 17), 99, 0xabc), Some(b.clone()));
        let mut part = vec![0u8; 1024];
        assert!(t.get(key(3, 17), 99, 0xabc, 1536, &mut part));
        assert_eq!(part, b[1536..2560]);
        assert_eq!(t.held_blocks(), 1);
    }

    /// The same cache block of a later segment (its slot reused) never hits the old copy.
    #[test]
    fn another_segment_id_never_hits() {
        let t = HotTier::new(1 << 20);
        t.put(key(5, 40), 7, 1, &block_of(1));
        assert!(get_block(&t, key(6, 40), 7, 1).is_none());
        assert!(get_block(&t, key(4, 40), 7, 1).is_none());
        assert!(get_block(&t, key(5, 41), 7, 1).is_none());
        assert!(get_block(&t, key(5, 40), 7, 1).is_some());
        // The new segment's block enters beside it and each key gets its own bytes.
        t.put(key(6, 40), 7, 2, &block_of(2));
        assert_eq!(get_block(&t, key(6, 40), 7, 2), Some(block_of(2)));
        assert_eq!(get_block(&t, key(5, 40), 7, 1), Some(block_of(1)));
    }

    #[test]
    fn off_holds_nothing() {
        for bytes in [0, BLOCK_SIZE_BYTES * (SHARDS as u64 - 1)] {
            let t = HotTier::new(bytes);
            assert!(!t.enabled());
            t.put(key(1, 1), 1, 1, &block_of(1));
            assert!(get_block(&t, key(1, 1), 1, 1).is_none());
            assert_eq!(t.held_blocks(), 0);
        }
    }

    /// More blocks than room: the tier never holds more than its capacity, and CLOCK keeps a
    /// block read again over blocks read once.
    #[test]
    fn eviction_keeps_capacity_and_prefers_referenced_blocks() {
        // One set of WAYS per shard.
        let t = HotTier::new((SHARDS * WAYS) as u64 * BLOCK_SIZE_BYTES);
        let cap = (SHARDS * WAYS) as u64;
        assert_eq!(t.capacity_bytes(), cap * BLOCK_SIZE_BYTES);
        let hot = key(1, 0);
        t.put(hot, 0, 0, &block_of(0xee));
        for c in 1..(cap as u32 * 8) {
            // The hot block is read between inserts, as a hot block is.
            assert!(get_block(&t, hot, 0, 0).is_some(), "evicted after {c}");
            t.put(key(1, c), c as u64, c, &block_of(c as u8));
            assert!(t.held_blocks() <= cap);
        }
        assert_eq!(t.held_blocks(), cap);
        // Every block still held is its own.
        let mut held = 0;
        for c in 0..(cap as u32 * 8) {
            if let Some(b) = get_block(&t, key(1, c), c as u64, c) {
                assert_eq!(
                    b,
                    if c == 0 {
                        block_of(0xee)
                    } else {
                        block_of(c as u8)
                    }
                );
                held += 1;
            }
        }
        assert_eq!(held, cap);
    }

    /// Keys spread over every shard, and a tiny tier (one way per shard) still works.
    #[test]
    fn keys_spread_over_every_shard() {
        let t = HotTier::new(1 << 20);
        let mut seen = [0u32; SHARDS];
        for c in 0..(SHARDS as u32 * 64) {
            seen[t.place(key(1 + u64::from(c / 256), c)).0] += 1;
        }
        assert!(seen.iter().all(|&n| n > 16), "{seen:?}");
        let tiny = HotTier::new(SHARDS as u64 * BLOCK_SIZE_BYTES);
        assert_eq!(tiny.capacity_bytes(), SHARDS as u64 * BLOCK_SIZE_BYTES);
        for c in 0..200u32 {
            tiny.put(key(2, c), c.into(), c, &block_of(c as u8));
            assert_eq!(
                get_block(&tiny, key(2, c), c.into(), c),
                Some(block_of(c as u8))
            );
        }
        assert!(tiny.held_blocks() <= SHARDS as u64);
    }

    /// The ghost: a run's first touch is noted, its second admits (and keeps admitting); other
    /// keys, the same block of another segment among them, are first touches; a resize forgets.
    #[test]
    fn a_second_touch_admits_and_the_first_only_notes() {
        let t = HotTier::new(1 << 20);
        assert!(!t.may_hold_any(), "nothing stored yet");
        assert!(!t.second_touch(key(3, 100), 4));
        assert!(!t.second_touch(key(4, 100), 4));
        assert!(!t.second_touch(key(3, 101), 2));
        assert!(t.second_touch(key(3, 100), 4));
        assert!(t.second_touch(key(3, 100), 4));
        assert_eq!(t.large_admitted(), 8);
        assert_eq!(t.large_first_touches(), 10);
        // Noting touches stores nothing.
        assert_eq!(t.held_blocks(), 0);
        assert!(!t.may_hold_any());
        t.put(key(3, 100), 1, 1, &block_of(1));
        assert!(t.may_hold_any());
        t.resize(1 << 20);
        assert!(!t.may_hold_any());
        assert!(
            !t.second_touch(key(3, 100), 4),
            "a resize forgets the touches"
        );
        let off = HotTier::new(0);
        assert!(!off.second_touch(key(3, 100), 1));
        assert!(!off.second_touch(key(3, 100), 1));
        assert!(!off.may_hold_any());
    }

    /// A scan of many more runs than the ghost holds overwrites its entries: what stays is a
    /// bounded table, and a run touched again right away is still admitted.
    #[test]
    fn the_ghost_is_bounded_and_keeps_recent_runs() {
        let t = HotTier::new(SHARDS as u64 * BLOCK_SIZE_BYTES * 8);
        for c in 0..10_000u32 {
            assert!(!t.second_touch(key(7, c * 4), 4), "run {c} seen before");
            assert!(t.second_touch(key(7, c * 4), 4), "run {c}");
        }
        let entries: usize = t.shards.iter().map(|s| s.lock().ghost.len()).sum();
        assert_eq!(entries, SHARDS * 8);
        // A run longer than the tier is never admitted: it could not be held whole.
        assert!(!t.second_touch(key(8, 0), 200));
        assert!(!t.second_touch(key(8, 0), 200));
    }

    /// Passes over a loop of runs: one that fits the tier is admitted on its second pass; one
    /// larger than the tier (each run would be evicted before its next pass) never is.
    #[test]
    fn only_a_loop_that_fits_is_admitted() {
        // 1,024 entries; runs of 16 blocks.
        let t = HotTier::new(SHARDS as u64 * BLOCK_SIZE_BYTES * 64);
        let pass = |runs: u32, id: u64| -> u32 {
            (0..runs)
                .filter(|&r| t.second_touch(key(id, r * 16), 16))
                .count() as u32
        };
        // 40 runs, 640 blocks: none on the first pass, all on the next ones.
        assert_eq!(pass(40, 1), 0);
        assert_eq!(pass(40, 1), 40);
        assert_eq!(pass(40, 1), 40);
        // 100 runs, 1,600 blocks: never.
        for _ in 0..4 {
            assert_eq!(pass(100, 2), 0);
        }
    }

    /// Nine blocks read in a loop through one set of eight: stored by `put` (CLOCK), each
    /// evicts the next to be read and every read misses; by `put_large`, eight keep their
    /// places and one misses per pass. And a set full of blocks no longer read still takes
    /// a large read's blocks after a few tries.
    #[test]
    fn a_loop_overflowing_a_set_keeps_its_places_with_put_large() {
        // One set of WAYS per shard: keys of one shard share a set.
        let t = HotTier::new((SHARDS * WAYS) as u64 * BLOCK_SIZE_BYTES);
        let keys: Vec<HotKey> = (0..10_000u32)
            .map(|c| key(5, c))
            .filter(|&k| t.place(k).0 == 0)
            .take(WAYS + 1)
            .collect();
        assert_eq!(keys.len(), WAYS + 1);
        let misses_per_pass = |t: &HotTier, large: bool| -> Vec<usize> {
            (0..6)
                .map(|_| {
                    let mut misses = 0;
                    for (i, &k) in keys.iter().enumerate() {
                        if get_block(t, k, i as u64, 0).is_none() {
                            misses += 1;
                            if large {
                                t.put_large(k, i as u64, 0, &block_of(i as u8));
                            } else {
                                t.put(k, i as u64, 0, &block_of(i as u8));
                            }
                        }
                    }
                    misses
                })
                .collect()
        };
        assert_eq!(misses_per_pass(&t, false), [9, 9, 9, 9, 9, 9]);
        t.resize((SHARDS * WAYS) as u64 * BLOCK_SIZE_BYTES);
        assert_eq!(misses_per_pass(&t, true), [9, 1, 1, 1, 1, 1]);
        // Now other blocks, read by large reads, replace the loop's (no longer read) within a
        // few passes: one way's bit is cleared per refused store.
        let others: Vec<HotKey> = (10_000..20_000u32)
            .map(|c| key(6, c))
            .filter(|&k| t.place(k).0 == 0)
            .take(WAYS)
            .collect();
        for _ in 0..3 {
            for (i, &k) in others.iter().enumerate() {
                if get_block(&t, k, 100 + i as u64, 0).is_none() {
                    t.put_large(k, 100 + i as u64, 0, &block_of(i as u8));
                }
            }
        }
        for (i, &k) in others.iter().enumerate() {
            assert_eq!(get_block(&t, k, 100 + i as u64, 0), Some(block_of(i as u8)));
        }
    }

    #[test]
    fn resize_drops_every_copy() {
        let t = HotTier::new(1 << 20);
        t.put(key(1, 1), 1, 1, &block_of(1));
        t.resize(2 << 20);
        assert_eq!(t.capacity_bytes(), 2 << 20);
        assert!(get_block(&t, key(1, 1), 1, 1).is_none());
        t.resize(0);
        assert!(!t.enabled());
    }

    #[test]
    fn the_size_is_capped_at_an_eighth_of_memory() {
        assert_eq!(size_for_mib(0), 0);
        assert_eq!(size_for_mib(1), 1 << 20);
        let memory = memory_bytes();
        assert!(memory > 0);
        assert_eq!(size_for_mib(u64::MAX), memory / 8);
    }

    #[test]
    fn cgroup_limits_are_found_and_read() {
        let v2 = "0::/system.slice/x.service\n";
        assert_eq!(
            cgroup_limit_paths(v2),
            ["/sys/fs/cgroup/system.slice/x.service/memory.max"]
        );
        assert_eq!(cgroup_limit_paths("0::/\n"), ["/sys/fs/cgroup/memory.max"]);
        let v1 = "9:name=systemd:/\n4:memory:/box/7\n3:cpu,cpuacct:/\n0::/\n";
        assert_eq!(
            cgroup_limit_paths(v1),
            [
                "/sys/fs/cgroup/memory/box/7/memory.limit_in_bytes",
                "/sys/fs/cgroup/memory.max"
            ]
        );
        assert!(cgroup_limit_paths("garbage").is_empty());
        assert_eq!(parse_limit("2147483648\n"), Some(2 << 30));
        assert_eq!(parse_limit("max\n"), None);
        assert_eq!(parse_limit("9223372036854771712\n"), None);
        assert_eq!(parse_limit(""), None);
    }

    fn want(k: HotKey, lba: u64, crc: u32, in_block: usize, dst_start: usize, len: usize) -> Want {
        Want {
            key: k,
            lba,
            crc,
            in_block,
            dst_start,
            len,
        }
    }

    /// Block `c` of segment `id`'s bytes: told apart from every other key's.
    fn keyed_block(id: u64, c: u32) -> Vec<u8> {
        let mut b = vec![(id as u8) ^ (c as u8).rotate_left(3); BLOCK];
        b[..8].copy_from_slice(&id.to_le_bytes());
        b[8..12].copy_from_slice(&c.to_le_bytes());
        b
    }

    /// A batched lookup serves what `get` would, block by block, over every shard: held keys
    /// (whole and in part, wherever their bytes go in the buffer) hit, and a key not held, the
    /// same cache block of another segment (its slot reused), another lba or CRC miss and leave
    /// their part of the buffer as it was.
    #[test]
    fn get_many_serves_what_get_would() {
        let t = HotTier::new(4 << 20);
        let blocks = 200u32;
        for c in 0..blocks {
            if c % 7 != 3 {
                t.put(key(5, c), u64::from(c) + 1000, c, &keyed_block(5, c));
            }
        }
        // The reused slot: segment 6 in the same cache block, held beside segment 5's copy.
        t.put(key(6, 10), 2010, 77, &keyed_block(6, 10));
        let mut wants = Vec::new();
        for c in 0..blocks {
            let (lba, crc) = (u64::from(c) + 1000, c);
            let at = c as usize * BLOCK;
            // Another lba or CRC for a held key is a bug the debug build asserts against
            // (a key names one content): only the release build serves them as misses.
            let mismatch = !cfg!(debug_assertions);
            wants.push(match c % 11 {
                // Another lba, another CRC, the next segment's id (not held).
                1 if mismatch => want(key(5, c), lba + 1, crc, 0, at, BLOCK),
                2 if mismatch => want(key(5, c), lba, crc ^ 1, 0, at, BLOCK),
                4 => want(key(7, c), lba, crc, 0, at, BLOCK),
                // In part.
                5 => want(key(5, c), lba, crc, 512, at + 512, 1024),
                _ => want(key(5, c), lba, crc, 0, at, BLOCK),
            });
        }
        wants.push(want(
            key(6, 10),
            2010,
            77,
            0,
            blocks as usize * BLOCK,
            BLOCK,
        ));
        let mut buf = vec![0xccu8; (blocks as usize + 1) * BLOCK];
        let mut hit = vec![false; wants.len()];
        let hits = t.get_many(&wants, &mut buf, &mut hit);
        assert_eq!(hits, hit.iter().filter(|&&h| h).count());
        let mut expected_hits = 0;
        for (i, w) in wants.iter().enumerate() {
            let held = match w.key.segment_id {
                6 => true,
                7 => false,
                _ => {
                    w.key.cache_block % 7 != 3
                        && w.lba == u64::from(w.key.cache_block) + 1000
                        && w.crc == w.key.cache_block
                }
            };
            assert_eq!(hit[i], held, "want {i}: {w:?}");
            expected_hits += usize::from(held);
            let got = &buf[i * BLOCK..(i + 1) * BLOCK];
            let mut want_bytes = vec![0xccu8; BLOCK];
            if held {
                let src = keyed_block(w.key.segment_id, w.key.cache_block);
                let at = w.dst_start - i * BLOCK;
                want_bytes[at..at + w.len].copy_from_slice(&src[w.in_block..w.in_block + w.len]);
            }
            assert!(got == want_bytes, "want {i}: wrong bytes ({w:?})");
            // The same as `get`.
            let mut one = vec![0u8; w.len];
            assert_eq!(t.get(w.key, w.lba, w.crc, w.in_block, &mut one), held);
        }
        assert!(expected_hits > 100 && expected_hits < wants.len());
        // An empty batch, and an off tier: nothing.
        assert_eq!(t.get_many(&[], &mut buf, &mut []), 0);
        let off = HotTier::new(0);
        let mut hit = vec![true; 3];
        assert_eq!(off.get_many(&wants[..3], &mut buf, &mut hit), 0);
        assert_eq!(hit, [false; 3]);
    }

    /// Readers batching lookups of runs while writers store blocks of later segments in the
    /// same cache blocks (slots reused) and evict them: every block a batch serves is the one
    /// its key names, whole (never the older segment's copy, never a torn one).
    #[test]
    fn get_many_under_reuse_serves_only_the_keys_own_bytes() {
        // Small, so stores evict what readers want.
        let t = std::sync::Arc::new(HotTier::new(SHARDS as u64 * 4 * BLOCK_SIZE_BYTES));
        let ids = 6u64;
        let threads: Vec<_> = (0..4u64)
            .map(|n| {
                let t = t.clone();
                std::thread::spawn(move || {
                    let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ n;
                    let mut next = move || {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        rng
                    };
                    let mut buf = vec![0u8; 16 * BLOCK];
                    let (mut served, mut stores) = (0u64, 0u64);
                    for _ in 0..4_000 {
                        let id = 1 + next() % ids;
                        let first = (next() % 48) as u32;
                        if n % 2 == 0 {
                            for c in first..first + 16 {
                                t.put_large(key(id, c), u64::from(c), c, &keyed_block(id, c));
                                stores += 1;
                            }
                            continue;
                        }
                        let wants: Vec<Want> = (0..16u32)
                            .map(|k| {
                                let c = first + k;
                                want(key(id, c), c.into(), c, 0, k as usize * BLOCK, BLOCK)
                            })
                            .collect();
                        let mut hit = vec![false; 16];
                        buf.fill(0);
                        t.get_many(&wants, &mut buf, &mut hit);
                        for (k, w) in wants.iter().enumerate() {
                            if hit[k] {
                                let got = &buf[k * BLOCK..(k + 1) * BLOCK];
                                assert!(
                                    got == keyed_block(id, w.key.cache_block),
                                    "{w:?}: not the key's own bytes"
                                );
                                served += 1;
                            }
                        }
                    }
                    (served, stores)
                })
            })
            .collect();
        let (served, stores) = threads
            .into_iter()
            .map(|th| th.join().unwrap())
            .fold((0, 0), |(a, b), (s, p)| (a + s, b + p));
        // The case was made: batches served blocks while others were stored.
        assert!(
            served > 1000 && stores > 1000,
            "{served} served, {stores} stored"
        );
    }

    /// Threads storing and reading the same blocks concurrently each get whole, right copies.
    #[test]
    fn concurrent_use_returns_whole_copies() {
        let t = std::sync::Arc::new(HotTier::new(64 * BLOCK_SIZE_BYTES));
        let threads: Vec<_> = (0..4u32)
            .map(|n| {
                let t = t.clone();
                std::thread::spawn(move || {
                    for i in 0..20_000u32 {
                        let c = (i * 7 + n) % 300;
                        let v = (c % 251) as u8;
                        if i % 3 == 0 {
                            t.put(key(9, c), c.into(), c, &block_of(v));
                        } else if let Some(b) = get_block(&t, key(9, c), c.into(), c) {
                            assert!(b.iter().all(|&x| x == v), "a torn or foreign copy");
                        }
                    }
                })
            })
            .collect();
        for th in threads {
            th.join().unwrap();
        }
    }
}
