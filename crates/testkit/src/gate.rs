//! [`GateDevice`]: wraps a device so that a test can hold chosen operations at the device's
//! door and let them through when it wants, to open a window between two threads on purpose
//! (a slow cache sync, a slow backing zeroing) and act inside it.
//!
//! Every wait is bounded: an operation held longer than `HOLD_MAX` goes through anyway and is
//! counted (`timed_out`), and `wait_held` gives up after its timeout, so a test that forgets to
//! release, or an engine that never issues the IO, fails instead of hanging.

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::fault::OpKind;
use logcache_io::BlockDevice;

/// The longest an operation stays held before it goes through on its own.
pub const HOLD_MAX: Duration = Duration::from_secs(120);

#[derive(Default)]
struct Doors {
    /// Per operation kind: whether new operations of that kind are held.
    closed: [bool; 4],
    /// Per operation kind: if set, only operations overlapping this byte range `[start, end)`
    /// are held (a sync has no range and is held whenever its kind is).
    only: [Option<(u64, u64)>; 4],
    /// Per operation kind: held after it was done (before it returns) instead of before.
    after: [bool; 4],
    /// Per operation kind: if set, how many more operations are held; the ones after pass.
    quota: [Option<u32>; 4],
    /// Per operation kind: operations waiting at the door now.
    waiting: [u32; 4],
    /// Per operation kind: operations that were held and then went through.
    passed: [u64; 4],
    /// Operations that went through because `HOLD_MAX` passed.
    timed_out: u64,
}

/// A [`BlockDevice`] wrapper whose operations a test can hold and release, per kind.
pub struct GateDevice {
    inner: Arc<dyn BlockDevice>,
    doors: Mutex<Doors>,
    changed: Condvar,
}

impl GateDevice {
    pub fn new(inner: Arc<dyn BlockDevice>) -> GateDevice {
        GateDevice {
            inner,
            doors: Mutex::new(Doors::default()),
            changed: Condvar::new(),
        }
    }

    /// Holds every later operation of kind `op` (write-zeroes counts as `Discard`) until
    /// `release(op)`.
    pub fn hold(&self, op: OpKind) {
        let mut d = self.doors.lock();
        d.closed[op as usize] = true;
        d.only[op as usize] = None;
        d.after[op as usize] = false;
        d.quota[op as usize] = None;
    }

    /// Holds every later operation of kind `op` after the device did it, before it returns
    /// (a sync that has covered what was written before it and has not told its caller yet),
    /// until `release(op)`.
    pub fn hold_after(&self, op: OpKind) {
        let mut d = self.doors.lock();
        d.closed[op as usize] = true;
        d.only[op as usize] = None;
        d.after[op as usize] = true;
        d.quota[op as usize] = None;
    }

    /// Holds the next operation of kind `op` after the device did it, before it returns (a
    /// sync that failed and has not told its caller yet), until `release(op)`; the ones after
    /// it pass (another thread's sync runs meanwhile).
    pub fn hold_next_after(&self, op: OpKind) {
        let mut d = self.doors.lock();
        d.closed[op as usize] = true;
        d.only[op as usize] = None;
        d.after[op as usize] = true;
        d.quota[op as usize] = Some(1);
    }

    /// Holds later operations of kind `op` that overlap bytes `[offset, offset + len_bytes)`
    /// until `release(op)`; the others of that kind pass (to hold one write while others run).
    pub fn hold_range(&self, op: OpKind, offset: u64, len_bytes: u64) {
        assert!(len_bytes > 0, "an empty range holds nothing");
        let mut d = self.doors.lock();
        d.closed[op as usize] = true;
        d.only[op as usize] = Some((offset, offset + len_bytes));
        d.after[op as usize] = false;
        d.quota[op as usize] = None;
    }

    /// Lets held and later operations of kind `op` through.
    pub fn release(&self, op: OpKind) {
        self.doors.lock().closed[op as usize] = false;
        self.changed.notify_all();
    }

    /// Waits until at least `count` operations of kind `op` are held; false if `timeout`
    /// passed first.
    pub fn wait_held(&self, op: OpKind, count: u32, timeout: Duration) -> bool {
        let until = Instant::now() + timeout;
        let mut d = self.doors.lock();
        while d.waiting[op as usize] < count {
            if self.changed.wait_until(&mut d, until).timed_out() {
                return d.waiting[op as usize] >= count;
            }
        }
        true
    }

    /// Operations of kind `op` that were held and then went through.
    pub fn passed(&self, op: OpKind) -> u64 {
        self.doors.lock().passed[op as usize]
    }

    /// Operations that went through only because they were held longer than `HOLD_MAX`.
    pub fn timed_out(&self) -> u64 {
        self.doors.lock().timed_out
    }

    /// The door every operation passes: waits while its kind is held (at most `HOLD_MAX`).
    fn pass(&self, op: OpKind, range: Option<(u64, u64)>, done: bool) {
        let i = op as usize;
        let mut d = self.doors.lock();
        if !d.closed[i] || d.after[i] != done {
            return;
        }
        if let (Some((start, end)), Some((offset, len))) = (d.only[i], range) {
            if offset + len <= start || offset >= end {
                return;
            }
        }
        match &mut d.quota[i] {
            Some(0) => return,
            Some(n) => *n -= 1,
            None => {}
        }
        let until = Instant::now() + HOLD_MAX;
        d.waiting[i] += 1;
        self.changed.notify_all();
        while d.closed[i] {
            if self.changed.wait_until(&mut d, until).timed_out() {
                d.timed_out += 1;
                break;
            }
        }
        d.waiting[i] -= 1;
        d.passed[i] += 1;
    }
}

impl BlockDevice for GateDevice {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let range = Some((offset, buf.len() as u64));
        self.pass(OpKind::Read, range, false);
        let r = self.inner.read_at(buf, offset);
        self.pass(OpKind::Read, range, true);
        r
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let range = Some((offset, buf.len() as u64));
        self.pass(OpKind::Write, range, false);
        let r = self.inner.write_at(buf, offset);
        self.pass(OpKind::Write, range, true);
        r
    }

    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        let len = bufs.iter().map(|b| b.len() as u64).sum();
        self.pass(OpKind::Write, Some((offset, len)), false);
        let r = self.inner.write_vectored_at(bufs, offset);
        self.pass(OpKind::Write, Some((offset, len)), true);
        r
    }

    fn flush(&self) -> io::Result<()> {
        self.pass(OpKind::Flush, None, false);
        let r = self.inner.flush();
        self.pass(OpKind::Flush, None, true);
        r
    }

    fn discard(&self, offset: u64, len_bytes: u64) -> io::Result<()> {
        self.pass(OpKind::Discard, Some((offset, len_bytes)), false);
        let r = self.inner.discard(offset, len_bytes);
        self.pass(OpKind::Discard, Some((offset, len_bytes)), true);
        r
    }

    fn write_zeroes(&self, offset: u64, len_bytes: u64) -> io::Result<()> {
        self.pass(OpKind::Discard, Some((offset, len_bytes)), false);
        let r = self.inner.write_zeroes(offset, len_bytes);
        self.pass(OpKind::Discard, Some((offset, len_bytes)), true);
        r
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn read_gap_bytes_max(&self) -> u64 {
        self.inner.read_gap_bytes_max()
    }

    fn reconnects(&self) -> u64 {
        self.inner.reconnects()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::SimDevice;

    #[test]
    fn held_operations_wait_for_release_and_others_pass() {
        let gate = Arc::new(GateDevice::new(Arc::new(SimDevice::new(1 << 20))));
        gate.hold(OpKind::Flush);
        let g = gate.clone();
        let t = std::thread::spawn(move || g.flush().unwrap());
        assert!(gate.wait_held(OpKind::Flush, 1, Duration::from_secs(60)));
        // Other kinds pass while the flush is held.
        gate.write_at(&[1; 4096], 0).unwrap();
        assert_eq!(gate.passed(OpKind::Flush), 0);
        gate.release(OpKind::Flush);
        t.join().unwrap();
        assert_eq!(gate.passed(OpKind::Flush), 1);
        assert_eq!(gate.timed_out(), 0);
    }

    #[test]
    fn a_range_hold_holds_only_operations_that_overlap_it() {
        let gate = Arc::new(GateDevice::new(Arc::new(SimDevice::new(1 << 20))));
        gate.hold_range(OpKind::Write, 8192, 4096);
        gate.write_at(&[1; 4096], 4096).unwrap();
        gate.write_at(&[1; 4096], 12288).unwrap();
        let g = gate.clone();
        let t = std::thread::spawn(move || g.write_at(&[2; 512], 8192 + 512).unwrap());
        assert!(gate.wait_held(OpKind::Write, 1, Duration::from_secs(60)));
        gate.release(OpKind::Write);
        t.join().unwrap();
        assert_eq!(gate.passed(OpKind::Write), 1);
    }

    #[test]
    fn an_operation_held_after_is_done_before_it_returns() {
        let dev = SimDevice::new(1 << 20);
        let gate = Arc::new(GateDevice::new(Arc::new(dev.clone())));
        gate.write_at(&[7; 4096], 0).unwrap();
        gate.hold_after(OpKind::Flush);
        let g = gate.clone();
        let t = std::thread::spawn(move || g.flush().unwrap());
        assert!(gate.wait_held(OpKind::Flush, 1, Duration::from_secs(60)));
        assert_eq!(dev.durable_image()[0], 7, "the held sync was done");
        gate.release(OpKind::Flush);
        t.join().unwrap();
    }

    #[test]
    fn a_hold_of_the_next_operation_lets_the_later_ones_pass() {
        let dev = SimDevice::new(1 << 20);
        let gate = Arc::new(GateDevice::new(Arc::new(dev.clone())));
        gate.hold_next_after(OpKind::Flush);
        let g = gate.clone();
        let t = std::thread::spawn(move || g.flush().unwrap());
        assert!(gate.wait_held(OpKind::Flush, 1, Duration::from_secs(60)));
        // A later sync passes (and makes this write durable) while the first is held.
        gate.write_at(&[9; 4096], 0).unwrap();
        gate.flush().unwrap();
        assert_eq!(dev.durable_image()[0], 9);
        assert_eq!(
            gate.passed(OpKind::Flush),
            0,
            "the first sync is still held"
        );
        gate.release(OpKind::Flush);
        t.join().unwrap();
        assert_eq!(gate.passed(OpKind::Flush), 1);
    }

    #[test]
    fn waiting_for_an_operation_that_never_comes_times_out() {
        let gate = GateDevice::new(Arc::new(SimDevice::new(1 << 20)));
        gate.hold(OpKind::Read);
        assert!(!gate.wait_held(OpKind::Read, 1, Duration::from_millis(10)));
    }
}
