//! [`SimDevice`]: an in-memory device for crash tests. It remembers which writes are not yet
//! flushed and, on a simulated power loss, keeps, loses or tears each of them at random.
//!
//! It also enforces the [`BlockDevice`] contract by panicking: an unaligned or out-of-range IO,
//! or two overlapping writes in flight at once, is an engine bug, and a panic shows where.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::rng::Rng;
use logcache_io::{BlockDevice, SECTOR_SIZE_BYTES};

/// A simulated disk with a volatile write cache.
///
/// `SimDevice` is a cheap handle: `clone()` shares the same disk (an `Arc` inside). Give the
/// engine `Arc::new(dev.clone())` and keep `dev` to call [`SimDevice::crash`] and inspect the
/// image after the engine is dropped.
#[derive(Clone)]
pub struct SimDevice {
    shared: Arc<Shared>,
}

struct Shared {
    size_bytes: u64,
    state: Mutex<State>,
    /// Ranges `[start, end)` of writes currently inside `write_at`, to catch overlapping ones.
    in_flight: Mutex<Vec<(u64, u64)>>,
    reads: AtomicU64,
    writes: AtomicU64,
    flushes: AtomicU64,
    discards: AtomicU64,
    bytes_written: AtomicU64,
    /// What `read_gap_bytes_max` says (`set_read_gap_bytes_max`): 0 plays a memory device.
    read_gap_bytes_max: AtomicU64,
}

struct State {
    /// What survives a power loss.
    durable: Vec<u8>,
    /// What reads see: `durable` with every pending write applied in order (and the writes a
    /// failed sync dropped, `fail_sync_dropping`, until overwritten or a power loss).
    volatile: Vec<u8>,
    /// Writes (and discards, as writes of zeros) since the last flush, in issue order.
    pending: Vec<(u64, Vec<u8>)>,
    failpoints: Failpoints,
}

/// Injected failures. Budgets count successful operations still allowed; `None` is disarmed.
#[derive(Default)]
struct Failpoints {
    writes_left: Option<u64>,
    ops_left: Option<u64>,
    /// Set once a budget ran out: every write, flush and discard fails until healed.
    tripped: bool,
    fail_reads: bool,
}

/// Which budget an operation draws from.
#[derive(Clone, Copy, PartialEq)]
enum Mutation {
    Write,
    Flush,
    Discard,
}

impl Failpoints {
    /// Decides whether the next mutating operation fails, consuming budget if it succeeds.
    fn admit(&mut self, op: Mutation) -> io::Result<()> {
        if self.tripped {
            return Err(eio());
        }
        // Once a budget is spent the process is "dead": nothing that changes the disk succeeds,
        // whichever budget ran out.
        if self.writes_left == Some(0) || self.ops_left == Some(0) {
            self.tripped = true;
            return Err(eio());
        }
        if op == Mutation::Write {
            if let Some(left) = &mut self.writes_left {
                *left -= 1;
            }
        }
        if let Some(left) = &mut self.ops_left {
            *left -= 1;
        }
        Ok(())
    }
}

fn eio() -> io::Error {
    io::Error::from_raw_os_error(libc::EIO)
}

impl SimDevice {
    /// Creates a zeroed device of `size_bytes` (a multiple of 512).
    pub fn new(size_bytes: u64) -> SimDevice {
        assert_eq!(
            size_bytes % SECTOR_SIZE_BYTES,
            0,
            "sim device size {size_bytes} is not a multiple of 512"
        );
        let len = usize::try_from(size_bytes).expect("sim device size exceeds usize");
        SimDevice {
            shared: Arc::new(Shared {
                size_bytes,
                state: Mutex::new(State {
                    durable: vec![0; len],
                    volatile: vec![0; len],
                    pending: Vec::new(),
                    failpoints: Failpoints::default(),
                }),
                in_flight: Mutex::new(Vec::new()),
                reads: AtomicU64::new(0),
                writes: AtomicU64::new(0),
                flushes: AtomicU64::new(0),
                discards: AtomicU64::new(0),
                bytes_written: AtomicU64::new(0),
                read_gap_bytes_max: AtomicU64::new(logcache_io::READ_GAP_BYTES_MAX_DEFAULT),
            }),
        }
    }

    /// Sets what [`BlockDevice::read_gap_bytes_max`] says (all clones share it): 0 makes readers
    /// of scattered blocks read each run on its own, as they do on a memory device.
    pub fn set_read_gap_bytes_max(&self, bytes: u64) {
        self.shared
            .read_gap_bytes_max
            .store(bytes, Ordering::Relaxed);
    }

    /// Panics unless `[offset, offset + len_bytes)` is sector-aligned and inside the device.
    fn assert_contract(&self, what: &str, offset: u64, len_bytes: u64) {
        assert!(
            (offset | len_bytes) & (SECTOR_SIZE_BYTES - 1) == 0,
            "BlockDevice contract: {what} at offset {offset} length {len_bytes} is not 512-byte aligned"
        );
        let size = self.shared.size_bytes;
        assert!(
            offset.checked_add(len_bytes).is_some_and(|end| end <= size),
            "BlockDevice contract: {what} at offset {offset} length {len_bytes} runs past the end ({size} bytes)"
        );
    }

    /// Simulates power loss: each unflushed write is, at random and independently, applied
    /// whole (1/3), lost (1/3) or torn (1/3: each of its 512-byte sectors applied with
    /// probability 1/2), in issue order on top of the durable image. The result becomes both
    /// durable and visible; failpoints are healed (the machine restarts).
    ///
    /// The outcome depends only on the pending writes and `rng`, so a seed replays it.
    pub fn crash(&self, rng: &mut Rng) {
        self.crash_with(CrashMode::Random(rng));
    }

    /// A process crash where the page cache survives: every unflushed write is kept.
    /// Failpoints are healed.
    pub fn crash_keep_all(&self) {
        self.crash_with(CrashMode::KeepAll);
    }

    /// A power loss that loses every unflushed write. Failpoints are healed.
    pub fn crash_lose_all(&self) {
        self.crash_with(CrashMode::LoseAll);
    }

    fn crash_with(&self, mut mode: CrashMode<'_>) {
        let mut guard = self.shared.state.lock();
        let state = &mut *guard;
        settle_pending(state, &mut mode);
        state.volatile.copy_from_slice(&state.durable);
        state.failpoints = Failpoints::default();
    }

    /// A sync that fails the way Linux's page cache reports a writeback error: each unsynced
    /// write is, at random, made durable, dropped or torn (as at a power loss), while reads
    /// still see every one of them until overwritten or the power fails; a later sync that
    /// succeeds does not bring back the dropped ones (fsyncgate). Call it when the flush
    /// itself is failed by a wrapper (a scheduler's or a fault device's verdict).
    pub fn fail_sync_dropping(&self, rng: &mut Rng) {
        let mut guard = self.shared.state.lock();
        settle_pending(&mut guard, &mut CrashMode::Random(rng));
    }

    /// After `n` more successful writes, every write, flush and discard fails with EIO until
    /// [`SimDevice::heal`] (or a crash): the process "dies" at that IO boundary.
    pub fn fail_after_writes(&self, n: u64) {
        self.shared.state.lock().failpoints.writes_left = Some(n);
    }

    /// Like [`SimDevice::fail_after_writes`], counting writes, flushes and discards. Reads do
    /// not count: they change nothing, so they add no distinct crash points.
    pub fn fail_after_ops(&self, n: u64) {
        self.shared.state.lock().failpoints.ops_left = Some(n);
    }

    /// While set, every read fails with EIO.
    pub fn fail_reads(&self, fail: bool) {
        self.shared.state.lock().failpoints.fail_reads = fail;
    }

    /// Disarms every failpoint and lets IO succeed again.
    pub fn heal(&self) {
        self.shared.state.lock().failpoints = Failpoints::default();
    }

    /// True once a failpoint fired and until healed.
    pub fn is_failing(&self) -> bool {
        self.shared.state.lock().failpoints.tripped
    }

    /// Successful `write_at` calls so far.
    pub fn write_count(&self) -> u64 {
        self.shared.writes.load(Ordering::Relaxed)
    }

    /// Successful `flush` calls so far.
    pub fn flush_count(&self) -> u64 {
        self.shared.flushes.load(Ordering::Relaxed)
    }

    /// Successful `read_at` calls so far.
    pub fn read_count(&self) -> u64 {
        self.shared.reads.load(Ordering::Relaxed)
    }

    /// Successful `discard` calls so far.
    pub fn discard_count(&self) -> u64 {
        self.shared.discards.load(Ordering::Relaxed)
    }

    /// Bytes accepted by successful `write_at` calls so far.
    pub fn bytes_written(&self) -> u64 {
        self.shared.bytes_written.load(Ordering::Relaxed)
    }

    /// Writes and discards not yet made durable by a flush.
    pub fn pending_write_count(&self) -> usize {
        self.shared.state.lock().pending.len()
    }

    /// A copy of what would survive a power loss that lost every unflushed write.
    pub fn durable_image(&self) -> Vec<u8> {
        self.shared.state.lock().durable.clone()
    }

    /// The bytes a read would return now (any offset and length inside the device).
    pub fn read_volatile(&self, offset: u64, len_bytes: u64) -> Vec<u8> {
        let range = self.byte_range(offset, len_bytes);
        self.shared.state.lock().volatile[range].to_vec()
    }

    /// Flips the bits of `xor_mask` in the byte at `offset`, in every version of it (durable,
    /// visible and any pending write covering it), so the damage shows whatever a crash keeps.
    pub fn corrupt(&self, offset: u64, xor_mask: u8) {
        self.patch_everywhere(offset, 1, |byte, _| *byte ^= xor_mask);
    }

    /// Writes `data` at `offset` (any alignment) as if written and flushed long ago: into the
    /// durable and visible images and over any pending write covering it, so it survives every
    /// crash outcome. Not counted, never fails; for tests that forge on-disk states.
    pub fn write_raw(&self, offset: u64, data: &[u8]) {
        self.patch_everywhere(offset, data.len() as u64, |byte, i| *byte = data[i]);
    }

    /// Applies `f(byte, index_in_range)` to every copy of the bytes in the range.
    fn patch_everywhere(&self, offset: u64, len_bytes: u64, mut f: impl FnMut(&mut u8, usize)) {
        let range = self.byte_range(offset, len_bytes);
        let mut guard = self.shared.state.lock();
        let state = &mut *guard;
        for (i, at) in range.clone().enumerate() {
            f(&mut state.durable[at], i);
            f(&mut state.volatile[at], i);
        }
        for (write_offset, data) in &mut state.pending {
            let write_start = *write_offset as usize;
            let lo = range.start.max(write_start);
            let hi = range.end.min(write_start + data.len());
            for at in lo..hi {
                f(&mut data[at - write_start], at - range.start);
            }
        }
    }

    fn byte_range(&self, offset: u64, len_bytes: u64) -> std::ops::Range<usize> {
        let size = self.shared.size_bytes;
        let end = offset.checked_add(len_bytes).filter(|&end| end <= size);
        let end = end.unwrap_or_else(|| {
            panic!("sim device: range at {offset} length {len_bytes} is outside {size} bytes")
        });
        offset as usize..end as usize
    }

    /// Registers a mutation of `[offset, offset + len_bytes)` as in flight, panicking if it
    /// overlaps one already in flight. The range is released when the guard drops.
    fn enter_mutation(&self, what: &str, offset: u64, len_bytes: u64) -> InFlight<'_> {
        let end = offset + len_bytes;
        if len_bytes > 0 {
            let mut in_flight = self.shared.in_flight.lock();
            if let Some(&(other_start, other_end)) =
                in_flight.iter().find(|&&(s, e)| s < end && offset < e)
            {
                drop(in_flight);
                panic!(
                    "BlockDevice contract: {what} of [{offset}, {end}) overlaps a write of \
                     [{other_start}, {other_end}) still in flight"
                );
            }
            in_flight.push((offset, end));
        }
        // Widen the window in which a racing overlapping write can be caught.
        std::thread::yield_now();
        InFlight {
            dev: self,
            range: (offset, end),
        }
    }
}

/// How [`SimDevice::crash_with`] treats each pending write.
/// Applies each pending write to the durable image as `mode` says (volatile left alone).
fn settle_pending(state: &mut State, mode: &mut CrashMode<'_>) {
    for (offset, data) in state.pending.drain(..) {
        let start = offset as usize;
        match mode {
            CrashMode::KeepAll => {
                state.durable[start..start + data.len()].copy_from_slice(&data);
            }
            CrashMode::LoseAll => {}
            CrashMode::Random(rng) => match rng.below(3) {
                0 => state.durable[start..start + data.len()].copy_from_slice(&data),
                1 => {}
                _ => {
                    let sector = SECTOR_SIZE_BYTES as usize;
                    for (i, chunk) in data.chunks(sector).enumerate() {
                        if rng.chance(1, 2) {
                            let at = start + i * sector;
                            state.durable[at..at + chunk.len()].copy_from_slice(chunk);
                        }
                    }
                }
            },
        }
    }
}

enum CrashMode<'a> {
    Random(&'a mut Rng),
    KeepAll,
    LoseAll,
}

/// An in-flight write range; unregisters itself on drop (also when the write fails).
struct InFlight<'a> {
    dev: &'a SimDevice,
    range: (u64, u64),
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self.range.0 == self.range.1 {
            return;
        }
        let mut in_flight = self.dev.shared.in_flight.lock();
        if let Some(i) = in_flight.iter().position(|&r| r == self.range) {
            in_flight.swap_remove(i);
        }
    }
}

impl BlockDevice for SimDevice {
    fn size_bytes(&self) -> u64 {
        self.shared.size_bytes
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.assert_contract("read", offset, buf.len() as u64);
        let state = self.shared.state.lock();
        if state.failpoints.fail_reads {
            return Err(eio());
        }
        let start = offset as usize;
        buf.copy_from_slice(&state.volatile[start..start + buf.len()]);
        self.shared.reads.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.assert_contract("write", offset, buf.len() as u64);
        let _in_flight = self.enter_mutation("write", offset, buf.len() as u64);
        let mut guard = self.shared.state.lock();
        let state = &mut *guard;
        state.failpoints.admit(Mutation::Write)?;
        let start = offset as usize;
        state.volatile[start..start + buf.len()].copy_from_slice(buf);
        if !buf.is_empty() {
            state.pending.push((offset, buf.to_vec()));
        }
        self.shared.writes.fetch_add(1, Ordering::Relaxed);
        self.shared
            .bytes_written
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        let mut guard = self.shared.state.lock();
        let state = &mut *guard;
        state.failpoints.admit(Mutation::Flush)?;
        for (offset, data) in state.pending.drain(..) {
            let start = offset as usize;
            state.durable[start..start + data.len()].copy_from_slice(&data);
        }
        self.shared.flushes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Zeroes the range. Like a write, the zeroes are volatile until the next flush (a crash
    /// may keep the old contents, per sector) and the range must not overlap a write in flight.
    fn discard(&self, offset: u64, len_bytes: u64) -> io::Result<()> {
        self.assert_contract("discard", offset, len_bytes);
        let _in_flight = self.enter_mutation("discard", offset, len_bytes);
        let mut guard = self.shared.state.lock();
        let state = &mut *guard;
        state.failpoints.admit(Mutation::Discard)?;
        let range = offset as usize..(offset + len_bytes) as usize;
        state.volatile[range.clone()].fill(0);
        if !range.is_empty() {
            state.pending.push((offset, vec![0; range.len()]));
        }
        self.shared.discards.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len_bytes: u64) -> io::Result<()> {
        // This device's discard is a write of zeros, crash semantics included.
        self.discard(offset, len_bytes)
    }

    fn describe(&self) -> String {
        format!("sim ({} bytes)", self.shared.size_bytes)
    }

    fn read_gap_bytes_max(&self) -> u64 {
        self.shared.read_gap_bytes_max.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECTOR: usize = SECTOR_SIZE_BYTES as usize;

    fn read(dev: &SimDevice, offset: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        dev.read_at(&mut buf, offset).unwrap();
        buf
    }

    #[test]
    fn reads_see_pending_writes_and_flush_makes_them_durable() {
        let dev = SimDevice::new(64 * 1024);
        dev.write_at(&[1u8; 4096], 4096).unwrap();
        assert_eq!(read(&dev, 4096, 4096), vec![1u8; 4096]);
        assert_eq!(dev.pending_write_count(), 1);
        assert!(dev.durable_image()[4096..8192].iter().all(|&b| b == 0));
        dev.flush().unwrap();
        assert_eq!(dev.pending_write_count(), 0);
        assert_eq!(dev.durable_image(), dev.read_volatile(0, 64 * 1024));
        assert_eq!(dev.write_count(), 1);
        assert_eq!(dev.flush_count(), 1);
        assert_eq!(dev.read_count(), 1);
        assert_eq!(dev.bytes_written(), 4096);
        assert_eq!(dev.describe(), "sim (65536 bytes)");
    }

    #[test]
    fn crash_keeps_synced_data_and_only_old_or_new_sectors() {
        const SIZE: usize = 256 * 1024;
        for seed in 0..50u64 {
            let dev = SimDevice::new(SIZE as u64);
            let mut rng = Rng::new(seed);
            // Synced base: 0xAA everywhere.
            dev.write_at(&vec![0xAA; SIZE], 0).unwrap();
            dev.flush().unwrap();
            // Unsynced writes of 0xBB over the first half, several sectors each.
            for i in 0..16u64 {
                dev.write_at(&[0xBB; 8 * SECTOR], i * 8 * SECTOR as u64)
                    .unwrap();
            }
            dev.crash(&mut rng);
            let image = dev.durable_image();
            assert_eq!(image, dev.read_volatile(0, SIZE as u64));
            assert_eq!(dev.pending_write_count(), 0);
            for (i, sector) in image.chunks(SECTOR).enumerate() {
                let first = sector[0];
                assert!(
                    sector.iter().all(|&b| b == first),
                    "seed {seed}: sector {i} mixed"
                );
                if i >= 16 * 8 {
                    assert_eq!(first, 0xAA, "seed {seed}: synced sector {i} changed");
                } else {
                    assert!(first == 0xAA || first == 0xBB, "seed {seed}: sector {i}");
                }
            }
        }
    }

    #[test]
    fn crash_outcomes_vary_and_replay_by_seed() {
        let run = |seed: u64| {
            let dev = SimDevice::new(128 * 1024);
            for i in 0..32u64 {
                dev.write_at(&[i as u8 + 1; 4 * SECTOR], i * 4 * SECTOR as u64)
                    .unwrap();
            }
            dev.crash(&mut Rng::new(seed));
            dev.durable_image()
        };
        assert_eq!(run(42), run(42));
        let image = run(42);
        let sectors: Vec<u8> = image.chunks(SECTOR).map(|s| s[0]).collect();
        // With 32 writes, some were kept, some lost, and some torn (a write partly kept).
        assert!(sectors.contains(&0));
        assert!(sectors.iter().any(|&b| b != 0));
        let torn = sectors
            .chunks(4)
            .filter(|w| w.contains(&0) && w.iter().any(|&b| b != 0))
            .count();
        assert!(torn > 0, "expected a torn write among 32");
        assert_ne!(run(42), run(43));
    }

    #[test]
    fn later_writes_to_the_same_sector_land_in_order() {
        let dev = SimDevice::new(4096);
        dev.write_at(&[1u8; 512], 0).unwrap();
        dev.write_at(&[2u8; 512], 0).unwrap();
        dev.crash_keep_all();
        assert_eq!(read(&dev, 0, 512), vec![2u8; 512]);
        dev.write_at(&[3u8; 512], 0).unwrap();
        dev.crash_lose_all();
        assert_eq!(read(&dev, 0, 512), vec![2u8; 512]);
        // Random crash: each write kept or not, so the result is one of the three versions.
        for seed in 0..20 {
            dev.write_at(&[4u8; 512], 0).unwrap();
            dev.write_at(&[5u8; 512], 0).unwrap();
            dev.crash(&mut Rng::new(seed));
            let b = read(&dev, 0, 512)[0];
            assert!([2, 4, 5].contains(&b), "seed {seed}: {b}");
            dev.write_raw(0, &[2u8; 512]);
        }
    }

    #[test]
    fn discard_zeroes_and_is_volatile_until_flush() {
        let dev = SimDevice::new(8192);
        dev.write_at(&[9u8; 8192], 0).unwrap();
        dev.flush().unwrap();
        dev.discard(0, 4096).unwrap();
        assert_eq!(read(&dev, 0, 4096), vec![0u8; 4096]);
        assert_eq!(dev.discard_count(), 1);
        dev.crash_lose_all();
        assert_eq!(read(&dev, 0, 4096), vec![9u8; 4096]);
        dev.discard(0, 4096).unwrap();
        dev.flush().unwrap();
        dev.crash_lose_all();
        assert_eq!(read(&dev, 0, 8192)[..4096], [0u8; 4096]);
        assert_eq!(read(&dev, 0, 8192)[4096..], [9u8; 4096]);
    }

    #[test]
    fn failpoint_after_writes_stops_writes_and_flushes() {
        let dev = SimDevice::new(8192);
        dev.fail_after_writes(2);
        dev.write_at(&[1u8; 512], 0).unwrap();
        dev.flush().unwrap(); // flushes don't draw from the write budget
        dev.write_at(&[2u8; 512], 512).unwrap();
        assert!(!dev.is_failing());
        let e = dev.write_at(&[3u8; 512], 1024).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EIO));
        assert!(dev.is_failing());
        assert_eq!(dev.flush().unwrap_err().raw_os_error(), Some(libc::EIO));
        assert!(dev.discard(0, 512).is_err());
        // Reads still work; the failed write changed nothing.
        assert_eq!(read(&dev, 1024, 512), vec![0u8; 512]);
        assert_eq!(dev.write_count(), 2);
        assert_eq!(dev.flush_count(), 1);
        // A crash restarts the machine: the unflushed second write may or may not survive.
        dev.crash_lose_all();
        assert!(!dev.is_failing());
        assert_eq!(read(&dev, 0, 1024)[..512], [1u8; 512]);
        assert_eq!(read(&dev, 0, 1024)[512..], [0u8; 512]);
        dev.write_at(&[4u8; 512], 0).unwrap();
    }

    #[test]
    fn failpoint_after_ops_counts_flushes_and_heal_resets() {
        let dev = SimDevice::new(8192);
        dev.fail_after_ops(0);
        assert!(dev.flush().is_err());
        dev.heal();
        dev.fail_after_ops(3);
        dev.write_at(&[1u8; 512], 0).unwrap();
        dev.flush().unwrap();
        dev.discard(512, 512).unwrap();
        assert!(dev.write_at(&[1u8; 512], 0).is_err());
        // Re-arming does not revive a failed device; heal does.
        dev.fail_after_ops(10);
        assert!(dev.flush().is_err());
        dev.heal();
        dev.flush().unwrap();
        dev.fail_reads(true);
        let mut buf = [0u8; 512];
        assert_eq!(
            dev.read_at(&mut buf, 0).unwrap_err().raw_os_error(),
            Some(libc::EIO)
        );
        dev.write_at(&[2u8; 512], 0).unwrap();
        dev.fail_reads(false);
        dev.read_at(&mut buf, 0).unwrap();
        assert_eq!(buf, [2u8; 512]);
    }

    #[test]
    fn corrupt_and_write_raw_survive_any_crash() {
        for seed in 0..20 {
            let dev = SimDevice::new(4096);
            dev.write_at(&[0x0F; 1024], 0).unwrap();
            dev.corrupt(10, 0xF0);
            dev.write_raw(600, b"forged");
            assert_eq!(dev.read_volatile(10, 1), vec![0xFF]);
            assert_eq!(dev.durable_image()[10], 0xF0);
            dev.crash(&mut Rng::new(seed));
            let image = dev.durable_image();
            // The pending write may or may not survive, but the flip shows either way.
            assert!(image[10] == 0xF0 || image[10] == 0xFF, "seed {seed}");
            assert_eq!(&image[600..606], b"forged");
        }
    }

    #[test]
    fn clones_share_the_disk() {
        let dev = SimDevice::new(4096);
        let engine_side: Arc<dyn BlockDevice> = Arc::new(dev.clone());
        engine_side.write_at(&[5u8; 512], 512).unwrap();
        engine_side.flush().unwrap();
        drop(engine_side);
        dev.crash_lose_all();
        assert_eq!(read(&dev, 512, 512), vec![5u8; 512]);
    }

    #[test]
    #[should_panic(expected = "not 512-byte aligned")]
    fn unaligned_write_panics() {
        SimDevice::new(4096).write_at(&[0u8; 100], 0).ok();
    }

    #[test]
    #[should_panic(expected = "runs past the end")]
    fn read_past_end_panics() {
        let mut buf = [0u8; 1024];
        SimDevice::new(4096).read_at(&mut buf, 3584).ok();
    }

    #[test]
    #[should_panic(expected = "overlaps a write")]
    fn overlapping_in_flight_writes_panic() {
        let dev = SimDevice::new(8192);
        // Pretend a write of [0, 4096) is still in flight, then issue an overlapping one.
        let _held = dev.enter_mutation("write", 0, 4096);
        dev.write_at(&[0u8; 512], 3584).ok();
    }

    #[test]
    fn adjacent_in_flight_writes_are_fine() {
        let dev = SimDevice::new(8192);
        let _held = dev.enter_mutation("write", 0, 4096);
        dev.write_at(&[1u8; 4096], 4096).unwrap();
        drop(_held);
        dev.write_at(&[1u8; 4096], 0).unwrap();
    }

    #[test]
    fn concurrent_overlapping_writers_are_caught() {
        // Two threads hammering the same sector: the overlap check must fire in one of them.
        let dev = SimDevice::new(4096);
        let start = Arc::new(std::sync::Barrier::new(2));
        let panicked: usize = (0..2)
            .map(|_| {
                let dev = dev.clone();
                let start = Arc::clone(&start);
                std::thread::spawn(move || {
                    start.wait();
                    for _ in 0..100_000 {
                        dev.write_at(&[1u8; 512], 0).unwrap();
                    }
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().is_err() as usize)
            .sum();
        assert!(panicked >= 1);
    }
}
