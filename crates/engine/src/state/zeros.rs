//! Ranges of blocks known to read as zeros because a WRITE_ZEROES covered them and nothing has
//! been written or trimmed there since: block status reports them with the zero flag over any
//! backing device (a block device or RBD image cannot say which of its ranges are zero).
//!
//! The only unsafe mistake is a block called zero that holds data, so every write removes its
//! blocks before it returns, and forgetting a range is always allowed. That is what keeps this
//! bounded: a sorted array of disjoint ranges with a fixed capacity, allocated once. A zero
//! range that finds it full is not recorded, and a write that would split a range in two when
//! full keeps the larger piece; both make block status say "data" there, which is safe. No
//! operation allocates, so the write path pays a length check when nothing is recorded, and a
//! binary search otherwise.

/// Most ranges recorded (16 bytes each: 64 KiB). Adjacent and overlapping ranges merge, so
/// this bounds fragmentation, not the zeroed size.
pub const MAX_ZERO_RANGES: usize = 4096;

#[derive(Debug)]
pub struct Zeros {
    /// `[first, end)` block ranges: sorted, disjoint, never adjacent, never empty.
    ranges: Vec<(u64, u64)>,
    capacity: usize,
    /// Blocks that read as zeros but were forgotten for want of room (reported as data).
    forgotten_blocks: u64,
}

impl Default for Zeros {
    fn default() -> Zeros {
        Zeros::with_capacity(MAX_ZERO_RANGES)
    }
}

impl Zeros {
    pub fn with_capacity(capacity: usize) -> Zeros {
        assert!(capacity >= 1);
        Zeros {
            ranges: Vec::with_capacity(capacity),
            capacity,
            forgotten_blocks: 0,
        }
    }

    /// Blocks `[first, end)` now read as zeros (a zero range was logged over them).
    pub fn insert(&mut self, first: u64, end: u64) {
        assert!(first < end, "an empty zero range");
        // Ranges overlapping or adjacent to the new one merge with it.
        let lo = self.ranges.partition_point(|&(_, e)| e < first);
        let hi = self.ranges.partition_point(|&(f, _)| f <= end);
        if lo == hi && self.ranges.len() == self.capacity {
            self.forgotten_blocks += end - first;
            return;
        }
        let mut merged = (first, end);
        if lo < hi {
            merged.0 = merged.0.min(self.ranges[lo].0);
            merged.1 = merged.1.max(self.ranges[hi - 1].1);
            self.ranges[lo] = merged;
            self.ranges.drain(lo + 1..hi);
        } else {
            self.ranges.insert(lo, merged);
        }
        self.check();
    }

    /// Blocks `[first, end)` may hold anything but zeros now (written, or trimmed).
    pub fn remove(&mut self, first: u64, end: u64) {
        assert!(first < end, "an empty range");
        if self.ranges.is_empty() {
            return;
        }
        let lo = self.ranges.partition_point(|&(_, e)| e <= first);
        let hi = self.ranges.partition_point(|&(f, _)| f < end);
        if lo >= hi {
            return;
        }
        let (lo_first, _) = self.ranges[lo];
        let (_, hi_end) = self.ranges[hi - 1];
        let left = (lo_first < first).then_some((lo_first, first));
        let right = (end < hi_end).then_some((end, hi_end));
        match (left, right) {
            (Some(l), Some(r)) if lo + 1 == hi && self.ranges.len() == self.capacity => {
                // A split needs one more slot: keep the larger piece, forget the other.
                let (keep, lose) = if l.1 - l.0 >= r.1 - r.0 {
                    (l, r)
                } else {
                    (r, l)
                };
                self.forgotten_blocks += lose.1 - lose.0;
                self.ranges[lo] = keep;
            }
            (Some(l), Some(r)) => {
                self.ranges[lo] = l;
                if lo + 1 == hi {
                    self.ranges.insert(hi, r);
                } else {
                    self.ranges[hi - 1] = r;
                    self.ranges.drain(lo + 1..hi - 1);
                }
            }
            (Some(l), None) => {
                self.ranges[lo] = l;
                self.ranges.drain(lo + 1..hi);
            }
            (None, Some(r)) => {
                self.ranges[hi - 1] = r;
                self.ranges.drain(lo..hi - 1);
            }
            (None, None) => {
                self.ranges.drain(lo..hi);
            }
        }
        self.check();
    }

    /// Whether block `lba` reads as zeros, and where the run of blocks with the same answer
    /// ends (capped at `end`).
    pub fn run(&self, lba: u64, end: u64) -> (bool, u64) {
        assert!(lba < end);
        let i = self.ranges.partition_point(|&(_, e)| e <= lba);
        match self.ranges.get(i) {
            Some(&(f, e)) if f <= lba => (true, e.min(end)),
            Some(&(f, _)) => (false, f.min(end)),
            None => (false, end),
        }
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Ranges recorded now.
    pub fn range_count(&self) -> usize {
        self.ranges.len()
    }

    /// Zeroed blocks forgotten for want of room since open (reported as data).
    pub fn forgotten_blocks(&self) -> u64 {
        self.forgotten_blocks
    }

    fn check(&self) {
        assert!(self.ranges.len() <= self.capacity);
        assert!(
            self.ranges.capacity() == self.capacity,
            "the ranges never reallocate"
        );
        if cfg!(debug_assertions) {
            for (i, &(f, e)) in self.ranges.iter().enumerate() {
                assert!(f < e, "an empty range at {i}");
                if i > 0 {
                    assert!(self.ranges[i - 1].1 < f, "ranges overlap or touch at {i}");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use logcache_testkit::rng::Rng;

    fn ranges(z: &Zeros) -> Vec<(u64, u64)> {
        z.ranges.clone()
    }

    #[test]
    fn inserts_merge_and_removes_split() {
        let mut z = Zeros::with_capacity(8);
        z.insert(10, 20);
        z.insert(30, 40);
        z.insert(20, 25);
        assert_eq!(ranges(&z), [(10, 25), (30, 40)]);
        z.insert(24, 31);
        assert_eq!(ranges(&z), [(10, 40)]);
        z.remove(15, 16);
        assert_eq!(ranges(&z), [(10, 15), (16, 40)]);
        z.remove(0, 12);
        z.remove(39, 100);
        assert_eq!(ranges(&z), [(12, 15), (16, 39)]);
        assert_eq!(z.run(13, 100), (true, 15));
        assert_eq!(z.run(15, 100), (false, 16));
        assert_eq!(z.run(39, 100), (false, 100));
        assert_eq!(z.run(0, 5), (false, 5));
        z.remove(14, 17);
        assert_eq!(ranges(&z), [(12, 14), (17, 39)]);
        z.remove(0, 1000);
        assert!(z.is_empty());
    }

    #[test]
    fn a_full_table_forgets_but_never_claims_zeros() {
        let mut z = Zeros::with_capacity(2);
        z.insert(0, 10);
        z.insert(20, 30);
        z.insert(40, 50);
        assert_eq!(ranges(&z), [(0, 10), (20, 30)]);
        assert_eq!(z.forgotten_blocks(), 10);
        z.remove(2, 3);
        assert_eq!(ranges(&z), [(3, 10), (20, 30)]);
        assert_eq!(z.forgotten_blocks(), 12);
        z.insert(9, 21); // merges: room again
        assert_eq!(ranges(&z), [(3, 30)]);
    }

    /// Against a block-by-block model: the table never calls a block zero the model does not,
    /// and with room to spare it agrees exactly.
    #[test]
    fn matches_a_model_seeded() {
        for seed in 0..200u64 {
            let mut rng = Rng::new(seed);
            let capacity = if seed % 2 == 0 { 4 } else { 64 };
            let mut z = Zeros::with_capacity(capacity);
            let mut model = vec![false; 256];
            for _ in 0..200 {
                let first = rng.below(256);
                let end = (first + 1 + rng.below(40)).min(256);
                if rng.below(3) == 0 {
                    z.insert(first, end);
                    model[first as usize..end as usize].fill(true);
                } else {
                    z.remove(first, end);
                    model[first as usize..end as usize].fill(false);
                }
                let mut lba = 0;
                while lba < 256 {
                    let (zero, run_end) = z.run(lba, 256);
                    assert!(run_end > lba);
                    for b in lba..run_end {
                        if zero {
                            assert!(model[b as usize], "seed {seed}: block {b} called zero");
                        } else if z.forgotten_blocks() == 0 {
                            assert!(!model[b as usize], "seed {seed}: block {b} lost");
                        }
                    }
                    lba = run_end;
                }
            }
        }
    }
}
