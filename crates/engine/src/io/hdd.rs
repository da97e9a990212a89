//! [`HddDevice`]: an EMULATION of a 7200 rpm hard disk's timing, for tests and benchmarks only.
//! It is not a feature and never a device to serve: it wraps any [`BlockDevice`] (usually a
//! [`super::memory::MemDevice`]), passes the data through unchanged, and sleeps as long as a
//! disk would take, so that writeback can be measured against a slow, seek-bound backing
//! device on a machine that has none.
//!
//! The cost model ([`HddModel`], a pure function of the IO sequence and a seed):
//! - one actuator: IOs are served one at a time, in arrival order;
//! - an IO that starts exactly where the previous one ended pays only its transfer time;
//! - any other IO pays a seek that grows with the distance from the previous IO's end
//!   (a settle time plus the rest of a full stroke scaled by the square root of the distance
//!   as a share of the device: short seeks are dominated by acceleration, so they cost more
//!   than their share of a full stroke), plus a rotational delay drawn uniformly from one
//!   revolution (seeded, so a run replays exactly; half a revolution on average), plus the
//!   transfer;
//! - reads and writes cost the same; `flush` costs a small fixed amount (writes are modelled
//!   as reaching the platter, so there is no volatile cache to empty); discard is free.
//!
//! Not modelled: zoned recording (bandwidth is the same everywhere), command queueing and
//! rotational-position reordering, an on-disk write cache, head switches and track skew.

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::{check_range, BlockDevice};
use crate::rng::Rng;

/// The knobs of the emulated disk. The defaults are a typical 7200 rpm SATA disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HddParams {
    /// Spindle speed; one revolution takes `60_000_000 / rpm` µs.
    pub rpm: u32,
    /// Cost of the shortest seek (head settle), in µs.
    pub settle_us: u64,
    /// Cost of a seek across the whole device, in µs.
    pub full_stroke_us: u64,
    /// Media transfer rate, bytes per second.
    pub bandwidth_bytes_per_s: u64,
    /// Cost of a flush, in µs.
    pub flush_us: u64,
    /// Seed of the rotational delays.
    pub seed: u64,
}

impl Default for HddParams {
    fn default() -> Self {
        HddParams {
            rpm: 7200,
            settle_us: 500,
            full_stroke_us: 8000,
            bandwidth_bytes_per_s: 150_000_000,
            flush_us: 200,
            seed: 0x4dd,
        }
    }
}

impl HddParams {
    /// Duration of one revolution, in µs.
    pub fn revolution_us(&self) -> u64 {
        60_000_000 / u64::from(self.rpm.max(1))
    }

    /// Rejects parameters the model cannot use, as `InvalidInput`.
    pub fn check(&self) -> io::Result<()> {
        let bad = |what: String| Err(io::Error::new(io::ErrorKind::InvalidInput, what));
        if self.rpm == 0 || self.rpm > 60_000_000 {
            return bad(format!(
                "emulated disk: rpm {} must be 1..=60000000",
                self.rpm
            ));
        }
        if self.bandwidth_bytes_per_s == 0 {
            return bad("emulated disk: bandwidth must be positive".into());
        }
        if self.full_stroke_us < self.settle_us {
            return bad(format!(
                "emulated disk: full stroke {} us is shorter than the settle time {} us",
                self.full_stroke_us, self.settle_us
            ));
        }
        Ok(())
    }
}

/// The parts of one IO's modelled cost, in µs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoCost {
    pub seek_us: u64,
    pub rotation_us: u64,
    pub transfer_us: u64,
}

impl IoCost {
    pub fn total_us(&self) -> u64 {
        self.seek_us + self.rotation_us + self.transfer_us
    }
}

/// The disk's timing model: where the head is, and what the next IO costs. No clock, no
/// sleeping: tests drive it directly.
#[derive(Clone, Debug)]
pub struct HddModel {
    params: HddParams,
    capacity_bytes: u64,
    /// End of the previous IO: an IO starting here is sequential.
    head_bytes: u64,
    rng: Rng,
}

impl HddModel {
    /// A model of a disk of `capacity_bytes` (the distance a full stroke covers), head at 0.
    pub fn new(params: HddParams, capacity_bytes: u64) -> HddModel {
        HddModel {
            params,
            capacity_bytes: capacity_bytes.max(1),
            head_bytes: 0,
            rng: Rng::new(params.seed),
        }
    }

    pub fn params(&self) -> &HddParams {
        &self.params
    }

    /// Seek time over `distance_bytes`, without rotation (0 for no movement).
    pub fn seek_us(&self, distance_bytes: u64) -> u64 {
        if distance_bytes == 0 {
            return 0;
        }
        let share = (distance_bytes as f64 / self.capacity_bytes as f64).min(1.0);
        let span_us = (self.params.full_stroke_us - self.params.settle_us) as f64;
        self.params.settle_us + (span_us * share.sqrt()).round() as u64
    }

    /// Time to move `len_bytes` under the head.
    pub fn transfer_us(&self, len_bytes: u64) -> u64 {
        let us = (u128::from(len_bytes) * 1_000_000)
            .div_ceil(u128::from(self.params.bandwidth_bytes_per_s.max(1)));
        us as u64
    }

    /// The cost of an IO of `len_bytes` at `offset`, by part; moves the head to its end.
    pub fn cost(&mut self, offset: u64, len_bytes: u64) -> IoCost {
        let transfer_us = self.transfer_us(len_bytes);
        let cost = if offset == self.head_bytes {
            IoCost {
                transfer_us,
                ..IoCost::default()
            }
        } else {
            IoCost {
                seek_us: self.seek_us(offset.abs_diff(self.head_bytes)),
                rotation_us: self.rng.below(self.params.revolution_us()),
                transfer_us,
            }
        };
        self.head_bytes = offset.saturating_add(len_bytes);
        cost
    }

    /// The total cost of an IO of `len_bytes` at `offset`, in µs; moves the head to its end.
    pub fn cost_us(&mut self, offset: u64, len_bytes: u64) -> u64 {
        self.cost(offset, len_bytes).total_us()
    }
}

/// What the emulated disk has done so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HddStats {
    /// Reads, writes and flushes charged.
    pub ios: u64,
    /// Modelled time the disk was busy, in µs (what the sleeps add up to, without the
    /// scheduler's overshoot).
    pub busy_us: u64,
}

struct Timeline {
    model: HddModel,
    /// When the actuator finishes the last IO charged so far.
    busy_until: Instant,
    stats: HddStats,
}

/// EMULATION for tests and benchmarks, never a feature: a [`BlockDevice`] that behaves like
/// `inner` but takes as long as a 7200 rpm hard disk would (see the module documentation).
pub struct HddDevice {
    inner: Arc<dyn BlockDevice>,
    timeline: Mutex<Timeline>,
}

impl HddDevice {
    /// Wraps `inner`; a full stroke spans its whole size. Invalid parameters are
    /// `InvalidInput` errors.
    pub fn new(inner: Arc<dyn BlockDevice>, params: HddParams) -> io::Result<HddDevice> {
        params.check()?;
        let model = HddModel::new(params, inner.size_bytes());
        Ok(HddDevice {
            inner,
            timeline: Mutex::new(Timeline {
                model,
                busy_until: Instant::now(),
                stats: HddStats::default(),
            }),
        })
    }

    pub fn stats(&self) -> HddStats {
        self.timeline.lock().stats
    }

    /// Books `cost_us` of actuator time after whatever is already queued and returns when
    /// that booking ends. Booking under the lock and sleeping outside it queues concurrent
    /// callers behind one another, as on one actuator, without holding the lock while asleep.
    fn book(&self, cost: impl FnOnce(&mut HddModel) -> u64) -> Instant {
        let mut t = self.timeline.lock();
        let cost_us = cost(&mut t.model);
        let start = t.busy_until.max(Instant::now());
        t.busy_until = start + Duration::from_micros(cost_us);
        t.stats.ios += 1;
        t.stats.busy_us += cost_us;
        t.busy_until
    }

    fn wait_until(done: Instant) {
        let now = Instant::now();
        if done > now {
            std::thread::sleep(done - now);
        }
    }
}

impl BlockDevice for HddDevice {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        // A rejected IO never reaches the disk, so it costs nothing.
        check_range(self.inner.size_bytes(), offset, buf.len() as u64)?;
        let done = self.book(|m| m.cost_us(offset, buf.len() as u64));
        let res = self.inner.read_at(buf, offset);
        Self::wait_until(done);
        res
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        check_range(self.inner.size_bytes(), offset, buf.len() as u64)?;
        let done = self.book(|m| m.cost_us(offset, buf.len() as u64));
        let res = self.inner.write_at(buf, offset);
        Self::wait_until(done);
        res
    }

    fn flush(&self) -> io::Result<()> {
        let done = self.book(|m| m.params().flush_us);
        let res = self.inner.flush();
        Self::wait_until(done);
        res
    }

    fn discard(&self, offset: u64, len_bytes: u64) -> io::Result<()> {
        self.inner.discard(offset, len_bytes)
    }

    fn describe(&self) -> String {
        let p = self.timeline.lock().model.params;
        format!(
            "emulated {} rpm hard disk (timing emulation for tests and benchmarks) over {}",
            p.rpm,
            self.inner.describe()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::memory::MemDevice;

    const GIB: u64 = 1 << 30;
    const BLOCK: u64 = 4096;

    /// Distinct random 4 KiB-aligned offsets over `span_bytes`.
    fn random_offsets(count: usize, span_bytes: u64, seed: u64) -> Vec<u64> {
        let mut rng = Rng::new(seed);
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::with_capacity(count);
        while out.len() < count {
            let off = rng.below(span_bytes / BLOCK) * BLOCK;
            if seen.insert(off) {
                out.push(off);
            }
        }
        out
    }

    fn total_us(model: &mut HddModel, offsets: &[u64]) -> u64 {
        offsets.iter().map(|&o| model.cost_us(o, BLOCK)).sum()
    }

    #[test]
    fn sequential_pays_only_transfer() {
        let mut m = HddModel::new(HddParams::default(), 8 * GIB);
        let first = m.cost(GIB, BLOCK);
        assert!(first.seek_us >= 500);
        let next = m.cost(GIB + BLOCK, BLOCK);
        assert_eq!(
            next,
            IoCost {
                seek_us: 0,
                rotation_us: 0,
                transfer_us: m.transfer_us(BLOCK)
            }
        );
        // 4 KiB at 150 MB/s is 27.3 µs, far below any seek.
        assert_eq!(next.total_us(), 28);
        // Skipping one block forward is not sequential.
        let skip = m.cost(GIB + 3 * BLOCK, BLOCK);
        assert!(skip.seek_us >= 500);
    }

    #[test]
    fn transfer_follows_bandwidth() {
        let m = HddModel::new(HddParams::default(), 8 * GIB);
        assert_eq!(m.transfer_us(150_000_000), 1_000_000);
        assert_eq!(m.transfer_us(1 << 20), 6991);
        assert_eq!(m.transfer_us(0), 0);
    }

    #[test]
    fn seeks_grow_with_distance_sublinearly() {
        let p = HddParams::default();
        let m = HddModel::new(p, 8 * GIB);
        assert_eq!(m.seek_us(0), 0);
        assert_eq!(m.seek_us(8 * GIB), p.full_stroke_us);
        assert_eq!(m.seek_us(100 * GIB), p.full_stroke_us);
        let mut last = m.seek_us(BLOCK);
        assert!(last >= p.settle_us);
        for shift in 13..=33 {
            let s = m.seek_us(1u64 << shift);
            assert!(s >= last, "seek over 2^{shift} bytes: {s} < {last}");
            last = s;
        }
        // Sub-linear: a quarter stroke costs more than a quarter of the stroke's span.
        let quarter = m.seek_us(2 * GIB) - p.settle_us;
        assert!(quarter * 4 > p.full_stroke_us - p.settle_us);
    }

    #[test]
    fn far_ios_cost_more_than_near_ones_on_average() {
        let mut m = HddModel::new(HddParams::default(), 8 * GIB);
        let (mut near_us, mut far_us) = (0, 0);
        for i in 0..1000u64 {
            // Alternate between 1 MiB hops and full strokes, from a known head position.
            let base = (i % 2) * 4 * GIB;
            m.cost(base, BLOCK);
            near_us += m.cost_us(base + (1 << 20), BLOCK);
            m.cost(0, BLOCK);
            far_us += m.cost_us(8 * GIB - BLOCK, BLOCK);
        }
        assert!(
            far_us > near_us + 1000 * 5000,
            "far {far_us} near {near_us}"
        );
    }

    #[test]
    fn rotation_averages_half_a_revolution() {
        let p = HddParams::default();
        let mut m = HddModel::new(p, 8 * GIB);
        let n = 20_000u64;
        let mut sum = 0;
        for off in random_offsets(n as usize, 8 * GIB, 5) {
            let c = m.cost(off, BLOCK);
            assert!(c.rotation_us < p.revolution_us());
            sum += c.rotation_us;
        }
        let mean = sum / n;
        let half = p.revolution_us() / 2;
        assert!(
            mean.abs_diff(half) < half / 20,
            "mean rotation {mean} µs, half {half}"
        );
    }

    #[test]
    fn same_seed_same_costs() {
        let offsets = random_offsets(500, 8 * GIB, 9);
        let p = HddParams::default();
        let a = total_us(&mut HddModel::new(p, 8 * GIB), &offsets);
        let b = total_us(&mut HddModel::new(p, 8 * GIB), &offsets);
        assert_eq!(a, b);
        let other = HddParams { seed: 1, ..p };
        assert_ne!(a, total_us(&mut HddModel::new(other, 8 * GIB), &offsets));
    }

    #[test]
    fn sorted_random_ios_cost_much_less_than_unsorted() {
        let p = HddParams::default();
        // Sparse: 2000 blocks over 8 GiB. Sorting shortens every seek; rotation remains.
        let mut offsets = random_offsets(2000, 8 * GIB, 7);
        let unsorted = total_us(&mut HddModel::new(p, 8 * GIB), &offsets);
        offsets.sort_unstable();
        let sorted = total_us(&mut HddModel::new(p, 8 * GIB), &offsets);
        assert!(
            sorted * 3 < unsorted * 2,
            "sorted {sorted} unsorted {unsorted}"
        );
        // Dense: every block of 16 MiB, shuffled. Sorted, it is one sequential stream.
        let mut dense: Vec<u64> = (0..4096).map(|b| GIB + b * BLOCK).collect();
        let mut rng = Rng::new(3);
        for i in (1..dense.len()).rev() {
            dense.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let unsorted = total_us(&mut HddModel::new(p, 8 * GIB), &dense);
        dense.sort_unstable();
        let sorted = total_us(&mut HddModel::new(p, 8 * GIB), &dense);
        assert!(
            sorted * 50 < unsorted,
            "sorted {sorted} unsorted {unsorted}"
        );
    }

    /// Parameters that keep the device tests fast: a 10 µs revolution, tiny seeks.
    fn quick() -> HddParams {
        HddParams {
            rpm: 6_000_000,
            settle_us: 1,
            full_stroke_us: 2,
            bandwidth_bytes_per_s: 1 << 40,
            flush_us: 1,
            seed: 1,
        }
    }

    #[test]
    fn device_passes_data_through_and_counts_modelled_time() {
        let mem: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(1 << 20));
        let dev = HddDevice::new(mem.clone(), quick()).unwrap();
        assert_eq!(dev.size_bytes(), 1 << 20);
        assert!(dev.describe().starts_with("emulated 6000000 rpm hard disk"));
        assert!(dev.describe().contains("memory"));
        dev.write_at(&[5u8; 8192], 8192).unwrap();
        dev.flush().unwrap();
        let mut buf = [0u8; 4096];
        dev.read_at(&mut buf, 12288).unwrap();
        assert_eq!(buf, [5u8; 4096]);
        mem.read_at(&mut buf, 8192).unwrap();
        assert_eq!(buf, [5u8; 4096]);

        // The same IOs through a bare model give the same busy time.
        let mut m = HddModel::new(quick(), 1 << 20);
        let expected = m.cost_us(8192, 8192) + quick().flush_us + m.cost_us(12288, 4096);
        assert_eq!(
            dev.stats(),
            HddStats {
                ios: 3,
                busy_us: expected
            }
        );
    }

    #[test]
    fn rejected_ios_cost_nothing() {
        let mem: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(8192));
        let dev = HddDevice::new(mem, quick()).unwrap();
        let mut buf = [0u8; 512];
        assert_eq!(
            dev.read_at(&mut buf, 100).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        assert!(dev.write_at(&buf, 8192).is_err());
        assert_eq!(dev.stats(), HddStats::default());
    }

    #[test]
    fn bad_parameters_are_errors() {
        let mem: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(8192));
        for p in [
            HddParams { rpm: 0, ..quick() },
            HddParams {
                bandwidth_bytes_per_s: 0,
                ..quick()
            },
            HddParams {
                settle_us: 3,
                ..quick()
            },
        ] {
            let e = HddDevice::new(mem.clone(), p).err().expect("rejected");
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        }
    }
}
