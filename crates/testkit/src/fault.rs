//! [`FaultDevice`]: wraps a device and makes chosen operations fail, for error-path tests.
//!
//! Rules are set per operation kind and can be combined: fail the next `k` operations
//! (transient), fail every operation once `n` more have succeeded (permanent), or fail every
//! operation touching a byte range. A failed operation never reaches the inner device.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use logcache_io::BlockDevice;

/// An operation kind rules apply to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    Read,
    Write,
    Flush,
    Discard,
}

impl OpKind {
    pub const ALL: [OpKind; 4] = [OpKind::Read, OpKind::Write, OpKind::Flush, OpKind::Discard];

    fn index(self) -> usize {
        self as usize
    }
}

/// The error an injected fault returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// EIO: the device failed.
    Io,
    /// ENOSPC: the device is full (thin provisioning, a full file system under a file).
    NoSpace,
}

impl FaultKind {
    fn error(self) -> io::Error {
        io::Error::from_raw_os_error(match self {
            FaultKind::Io => libc::EIO,
            FaultKind::NoSpace => libc::ENOSPC,
        })
    }
}

/// The rules for one operation kind.
#[derive(Default)]
struct Rules {
    /// Fail this many more operations, then pass again.
    transient: Option<(u64, FaultKind)>,
    /// Let this many more operations through, then fail every one.
    permanent: Option<(u64, FaultKind)>,
    /// Fail every operation overlapping `[start, end)`.
    range: Option<(u64, u64, FaultKind)>,
}

impl Rules {
    fn is_empty(&self) -> bool {
        self.transient.is_none() && self.permanent.is_none() && self.range.is_none()
    }

    /// Decides the fate of one operation on `[offset, offset + len_bytes)` (`None` for
    /// flush), consuming the counters it draws on.
    fn judge(&mut self, range: Option<(u64, u64)>) -> Option<FaultKind> {
        if let Some((0, kind)) = self.permanent {
            return Some(kind);
        }
        if let (Some((start, end, kind)), Some((offset, len_bytes))) = (self.range, range) {
            if len_bytes > 0 && offset < end && start < offset.saturating_add(len_bytes) {
                return Some(kind);
            }
        }
        if let Some((left, kind)) = &mut self.transient {
            let kind = *kind;
            *left -= 1;
            if *left == 0 {
                self.transient = None;
            }
            return Some(kind);
        }
        if let Some((left, _)) = &mut self.permanent {
            *left -= 1;
        }
        None
    }
}

/// Per operation kind: the rules, a fast "any rule set" flag, and the injected-fault count.
#[derive(Default)]
struct OpState {
    armed: AtomicBool,
    rules: Mutex<Rules>,
    injected: AtomicU64,
}

/// A [`BlockDevice`] wrapper that injects errors by rule. With no rule set, each call costs one
/// relaxed atomic load on top of the inner device.
pub struct FaultDevice {
    inner: Arc<dyn BlockDevice>,
    ops: [OpState; 4],
}

impl FaultDevice {
    pub fn new(inner: Arc<dyn BlockDevice>) -> FaultDevice {
        FaultDevice {
            inner,
            ops: Default::default(),
        }
    }

    /// The wrapped device.
    pub fn inner(&self) -> &Arc<dyn BlockDevice> {
        &self.inner
    }

    /// Fails the next `count` operations of kind `op`, then lets them through again.
    pub fn fail_next(&self, op: OpKind, count: u64, kind: FaultKind) {
        self.update(op, |rules| {
            rules.transient = (count > 0).then_some((count, kind))
        });
    }

    /// Lets `successes` more operations of kind `op` through, then fails every one until
    /// healed.
    pub fn fail_after(&self, op: OpKind, successes: u64, kind: FaultKind) {
        self.update(op, |rules| rules.permanent = Some((successes, kind)));
    }

    /// Fails every operation of kind `op` that touches a byte of `[offset, offset + len_bytes)`.
    /// Flushes touch no range, so `op` must not be [`OpKind::Flush`].
    pub fn fail_range(&self, op: OpKind, offset: u64, len_bytes: u64, kind: FaultKind) {
        assert_ne!(op, OpKind::Flush, "flushes have no byte range");
        let end = offset.saturating_add(len_bytes);
        self.update(op, |rules| rules.range = Some((offset, end, kind)));
    }

    /// Removes every rule for `op`.
    pub fn heal_op(&self, op: OpKind) {
        self.update(op, |rules| *rules = Rules::default());
    }

    /// Removes every rule. Injected-fault counts are kept.
    pub fn heal(&self) {
        for op in OpKind::ALL {
            self.heal_op(op);
        }
    }

    /// Faults injected into operations of kind `op` so far.
    pub fn injected(&self, op: OpKind) -> u64 {
        self.ops[op.index()].injected.load(Ordering::Relaxed)
    }

    /// Faults injected so far, all kinds together.
    pub fn injected_total(&self) -> u64 {
        OpKind::ALL.iter().map(|&op| self.injected(op)).sum()
    }

    fn update(&self, op: OpKind, change: impl FnOnce(&mut Rules)) {
        let state = &self.ops[op.index()];
        let mut rules = state.rules.lock();
        change(&mut rules);
        // Under the lock, so the flag never disagrees with the rules for long.
        state.armed.store(!rules.is_empty(), Ordering::Release);
    }

    /// Err if a rule fails this operation; `range` is `(offset, len_bytes)`, None for flush.
    fn gate(&self, op: OpKind, range: Option<(u64, u64)>) -> io::Result<()> {
        let state = &self.ops[op.index()];
        if !state.armed.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut rules = state.rules.lock();
        let verdict = rules.judge(range);
        state.armed.store(!rules.is_empty(), Ordering::Release);
        drop(rules);
        match verdict {
            None => Ok(()),
            Some(kind) => {
                state.injected.fetch_add(1, Ordering::Relaxed);
                Err(kind.error())
            }
        }
    }
}

impl BlockDevice for FaultDevice {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.gate(OpKind::Read, Some((offset, buf.len() as u64)))?;
        self.inner.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.gate(OpKind::Write, Some((offset, buf.len() as u64)))?;
        self.inner.write_at(buf, offset)
    }

    fn flush(&self) -> io::Result<()> {
        self.gate(OpKind::Flush, None)?;
        self.inner.flush()
    }

    fn discard(&self, offset: u64, len_bytes: u64) -> io::Result<()> {
        self.gate(OpKind::Discard, Some((offset, len_bytes)))?;
        self.inner.discard(offset, len_bytes)
    }

    fn write_zeroes(&self, offset: u64, len_bytes: u64) -> io::Result<()> {
        self.gate(OpKind::Write, Some((offset, len_bytes)))?;
        self.inner.write_zeroes(offset, len_bytes)
    }

    fn describe(&self) -> String {
        format!("fault-injecting {}", self.inner.describe())
    }

    fn read_gap_bytes_max(&self) -> u64 {
        self.inner.read_gap_bytes_max()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use logcache_io::memory::MemDevice;

    fn setup() -> (Arc<MemDevice>, FaultDevice) {
        let mem = Arc::new(MemDevice::new(64 * 1024));
        let dev = FaultDevice::new(mem.clone());
        (mem, dev)
    }

    fn errno(r: io::Result<()>) -> Option<i32> {
        r.err()
            .map(|e| e.raw_os_error().expect("injected errors carry an errno"))
    }

    #[test]
    fn passes_through_without_rules() {
        let (mem, dev) = setup();
        assert_eq!(dev.size_bytes(), 64 * 1024);
        assert_eq!(dev.describe(), "fault-injecting memory (65536 bytes)");
        dev.write_at(&[3u8; 4096], 4096).unwrap();
        dev.flush().unwrap();
        let mut buf = [0u8; 4096];
        mem.read_at(&mut buf, 4096).unwrap();
        assert_eq!(buf, [3u8; 4096]);
        dev.discard(4096, 4096).unwrap();
        dev.read_at(&mut buf, 4096).unwrap();
        assert_eq!(buf, [0u8; 4096]);
        // Errors of the inner device come through unchanged.
        assert!(dev.read_at(&mut buf, 100).is_err());
        assert_eq!(dev.injected_total(), 0);
    }

    #[test]
    fn transient_faults_fail_the_next_k_ops_only() {
        let (mem, dev) = setup();
        dev.fail_next(OpKind::Write, 2, FaultKind::Io);
        assert_eq!(errno(dev.write_at(&[1u8; 512], 0)), Some(libc::EIO));
        assert_eq!(errno(dev.write_at(&[1u8; 512], 0)), Some(libc::EIO));
        // A failed write never reached the device.
        let mut buf = [9u8; 512];
        mem.read_at(&mut buf, 0).unwrap();
        assert_eq!(buf, [0u8; 512]);
        dev.write_at(&[1u8; 512], 0).unwrap();
        // Other kinds were never affected.
        dev.flush().unwrap();
        dev.read_at(&mut buf, 0).unwrap();
        assert_eq!(buf, [1u8; 512]);
        assert_eq!(dev.injected(OpKind::Write), 2);
        assert_eq!(dev.injected(OpKind::Read), 0);
    }

    #[test]
    fn permanent_faults_start_after_n_successes_until_healed() {
        let (_mem, dev) = setup();
        dev.fail_after(OpKind::Flush, 2, FaultKind::Io);
        dev.flush().unwrap();
        dev.flush().unwrap();
        for _ in 0..5 {
            assert_eq!(errno(dev.flush()), Some(libc::EIO));
        }
        dev.write_at(&[1u8; 512], 0).unwrap();
        assert_eq!(dev.injected(OpKind::Flush), 5);
        dev.heal();
        dev.flush().unwrap();
        assert_eq!(dev.injected_total(), 5, "heal keeps the counts");
    }

    #[test]
    fn no_space_for_writes() {
        let (_mem, dev) = setup();
        dev.fail_after(OpKind::Write, 0, FaultKind::NoSpace);
        assert_eq!(errno(dev.write_at(&[1u8; 512], 0)), Some(libc::ENOSPC));
        dev.heal_op(OpKind::Write);
        dev.write_at(&[1u8; 512], 0).unwrap();
    }

    #[test]
    fn range_faults_hit_only_overlapping_ops() {
        let (_mem, dev) = setup();
        dev.fail_range(OpKind::Read, 8192, 4096, FaultKind::Io);
        let mut buf = [0u8; 4096];
        dev.read_at(&mut buf, 4096).unwrap(); // ends where the range starts
        dev.read_at(&mut buf, 12288).unwrap(); // starts where it ends
        assert!(dev.read_at(&mut buf, 8192).is_err());
        assert!(dev.read_at(&mut buf[..512], 12288 - 512).is_err());
        let mut big = vec![0u8; 16384];
        assert!(dev.read_at(&mut big, 0).is_err()); // covers it
        dev.read_at(&mut [], 8192).unwrap(); // touches nothing
        dev.write_at(&buf, 8192).unwrap();
        assert_eq!(dev.injected(OpKind::Read), 3);

        dev.fail_range(OpKind::Discard, 0, 512, FaultKind::Io);
        assert!(dev.discard(0, 4096).is_err());
        dev.discard(512, 4096).unwrap();
    }

    #[test]
    fn rules_combine() {
        let (_mem, dev) = setup();
        dev.fail_range(OpKind::Write, 0, 4096, FaultKind::Io);
        dev.fail_next(OpKind::Write, 1, FaultKind::NoSpace);
        dev.fail_after(OpKind::Write, 2, FaultKind::Io);
        // The range rule fails without using up the transient one.
        assert_eq!(errno(dev.write_at(&[0u8; 512], 0)), Some(libc::EIO));
        assert_eq!(errno(dev.write_at(&[0u8; 512], 8192)), Some(libc::ENOSPC));
        dev.write_at(&[0u8; 512], 8192).unwrap();
        dev.write_at(&[0u8; 512], 8192).unwrap();
        assert_eq!(errno(dev.write_at(&[0u8; 512], 8192)), Some(libc::EIO));
        assert_eq!(dev.injected(OpKind::Write), 3);
    }

    #[test]
    fn rules_are_shared_across_threads() {
        let (_mem, dev) = setup();
        let dev = Arc::new(dev);
        dev.fail_next(OpKind::Write, 100, FaultKind::Io);
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let dev = Arc::clone(&dev);
                std::thread::spawn(move || {
                    (0..100)
                        .filter(|_| dev.write_at(&[1u8; 512], t * 512).is_err())
                        .count()
                })
            })
            .collect();
        let failed: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(failed, 100);
        assert_eq!(dev.injected(OpKind::Write), 100);
    }

    #[test]
    #[should_panic(expected = "no byte range")]
    fn range_rule_for_flush_is_refused() {
        let (_mem, dev) = setup();
        dev.fail_range(OpKind::Flush, 0, 512, FaultKind::Io);
    }
}
