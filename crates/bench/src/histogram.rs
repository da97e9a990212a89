//! A fixed-size latency histogram: log-linear buckets (16 per power of two) over nanoseconds,
//! so recording costs no allocation and percentiles are within ~6%.

const SUB_BUCKETS: usize = 16;
const POWERS: usize = 40; // up to 2^40 ns ≈ 18 minutes

pub struct Histogram {
    counts: Box<[u64]>,
    total: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; SUB_BUCKETS * POWERS].into_boxed_slice(),
            total: 0,
        }
    }
}

impl Histogram {
    fn bucket(ns: u64) -> usize {
        if ns < SUB_BUCKETS as u64 {
            return ns as usize;
        }
        let power = 63 - ns.leading_zeros() as usize; // ns >= 16, so power >= 4
        let sub = ((ns >> (power - 4)) & (SUB_BUCKETS as u64 - 1)) as usize;
        ((power - 3) * SUB_BUCKETS + sub).min(SUB_BUCKETS * POWERS - 1)
    }

    /// Lower bound, in ns, of a bucket's range.
    fn bucket_floor(b: usize) -> u64 {
        if b < SUB_BUCKETS {
            return b as u64;
        }
        let power = b / SUB_BUCKETS + 3;
        let sub = (b % SUB_BUCKETS) as u64;
        (1u64 << power) + (sub << (power - 4))
    }

    pub fn record(&mut self, ns: u64) {
        self.counts[Self::bucket(ns)] += 1;
        self.total += 1;
    }

    /// Samples recorded.
    pub fn count(&self) -> u64 {
        self.total
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a += b;
        }
        self.total += other.total;
    }

    /// Estimated total ns of the samples in buckets whose lower bound is at least `from_ns`
    /// (each counted at that bound, so within ~6% below the truth): the time a run spent in
    /// its slow calls.
    pub fn sum_ns_from(&self, from_ns: u64) -> u64 {
        self.counts
            .iter()
            .enumerate()
            .map(|(b, &c)| (Self::bucket_floor(b), c))
            .filter(|&(floor, _)| floor >= from_ns)
            .map(|(floor, c)| floor * c)
            .sum()
    }

    /// The latency in ns below which `q` (0..=1) of the samples fall (a bucket's lower bound).
    pub fn quantile_ns(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((self.total as f64 * q).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (b, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Self::bucket_floor(b);
            }
        }
        unreachable!("rank is at most the total")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_tight() {
        let mut last = 0;
        for ns in [0u64, 1, 15, 16, 17, 100, 999, 1000, 1_000_000, 123_456_789] {
            let b = Histogram::bucket(ns);
            assert!(b >= last);
            last = b;
            let floor = Histogram::bucket_floor(b);
            assert!(floor <= ns, "{ns}: floor {floor}");
            assert!(ns - floor <= ns / 16 + 1, "{ns}: floor {floor}");
        }
    }

    #[test]
    fn quantiles() {
        let mut h = Histogram::default();
        for ns in 1..=1000u64 {
            h.record(ns * 1000);
        }
        let p50 = h.quantile_ns(0.5);
        assert!((470_000..=500_000).contains(&p50), "{p50}");
        let p99 = h.quantile_ns(0.99);
        assert!((930_000..=990_000).contains(&p99), "{p99}");
        assert_eq!(Histogram::default().quantile_ns(0.5), 0);
        // From a bucket's floor, every sample at or above it is counted, each a little low.
        let from = Histogram::bucket_floor(Histogram::bucket(900_000));
        let slow = h.sum_ns_from(from);
        let exact: u64 = (1..=1000u64)
            .map(|us| us * 1000)
            .filter(|&ns| ns >= from)
            .sum();
        assert!(
            slow <= exact && slow >= exact - exact / 16,
            "{slow} vs {exact}"
        );
        assert_eq!(h.sum_ns_from(2_000_000), 0);
    }
}
