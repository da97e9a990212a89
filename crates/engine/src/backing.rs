//! [`Backing`]: the backing device as the engine uses it. Every sync of it goes through here,
//! which counts the failed ones where they happen, so a caller can tell whether a successful
//! sync of its own vouches for the writes it made before it.
//!
//! A device may drop unsynced writes when a sync fails and report success to the next sync
//! (Linux's page cache: pages whose writeback failed are marked clean, and the error is
//! reported once per file description, to whichever `fsync` checks first). So a sync that
//! succeeds vouches for a write made before it only if no sync failed since that write began,
//! including a sync still in flight when ours returned: that one may have taken the error
//! (and dropped our write) before ours checked for it. Counted by the failing thread after
//! its sync had returned, under the state lock, a success in between was believed (the window
//! left open by 56e9a75 for `zeros_synced` and writeback's `copy_out`). Here a failed sync is
//! counted before it returns, and a successful one returns only once every sync in flight when
//! it finished has ended: [`Backing::failed_syncs`] read before the writes and again after the
//! caller's own successful sync then names every failure that could have dropped them.

use std::io;
use std::sync::Arc;

use crate::io::{Allocation, BlockDevice, ReadOp};
use crate::sync::{Condvar, Mutex, MutexGuard};

#[derive(Default)]
struct Syncs {
    /// Syncs started so far; each takes the next number as its ticket.
    started: u64,
    /// Tickets of the syncs whose device call has not returned yet (a handful at most).
    in_flight: Vec<u64>,
    /// Syncs that failed so far.
    failed: u64,
    /// Successful syncs that waited for an older sync still in flight.
    waited: u64,
}

/// Wraps the backing device: every operation is the device's, syncs are counted (module doc).
pub struct Backing {
    dev: Arc<dyn BlockDevice>,
    syncs: Mutex<Syncs>,
    /// Notified whenever a sync's device call returns.
    ended: Condvar,
}

impl Backing {
    pub fn new(dev: Arc<dyn BlockDevice>) -> Backing {
        Backing {
            dev,
            syncs: Mutex::new(Syncs::default()),
            ended: Condvar::new(),
        }
    }

    /// Syncs that failed so far. A caller notes it before its writes and compares after its
    /// own sync succeeded: unchanged, no failed sync can have dropped those writes.
    pub fn failed_syncs(&self) -> u64 {
        self.syncs.lock().failed
    }

    /// Successful syncs that waited for an older one still in flight before returning.
    pub fn syncs_waited(&self) -> u64 {
        self.syncs.lock().waited
    }

    /// The device call of sync `ticket` returned (`ok`) or unwound: no longer in flight.
    fn end_sync(&self, ticket: u64, ok: bool) -> MutexGuard<'_, Syncs> {
        let mut s = self.syncs.lock();
        let at = s
            .in_flight
            .iter()
            .position(|&t| t == ticket)
            .expect("a sync in flight is registered");
        s.in_flight.swap_remove(at);
        if !ok {
            s.failed += 1;
        }
        // A success waiting in `flush` waits for this call's end.
        self.ended.notify_all();
        s
    }
}

/// A sync's device call under way; ends its ticket as a failure if the call unwinds.
struct SyncCall<'a> {
    backing: &'a Backing,
    ticket: u64,
    ended: bool,
}

impl Drop for SyncCall<'_> {
    fn drop(&mut self) {
        if !self.ended {
            drop(self.backing.end_sync(self.ticket, false));
        }
    }
}

impl BlockDevice for Backing {
    fn size_bytes(&self) -> u64 {
        self.dev.size_bytes()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.dev.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.dev.write_at(buf, offset)
    }

    /// The device's sync, counted: a failure before it returns; a success returns once every
    /// sync in flight when it finished has ended (its failure, if any, then counted).
    fn flush(&self) -> io::Result<()> {
        let ticket = {
            let mut s = self.syncs.lock();
            let t = s.started;
            s.started += 1;
            s.in_flight.push(t);
            t
        };
        // A device call that panics still ends its ticket (as a failure): left in flight, every
        // later success would wait for it for ever.
        let mut call = SyncCall {
            backing: self,
            ticket,
            ended: false,
        };
        let res = self.dev.flush();
        call.ended = true;
        let mut s = self.end_sync(ticket, res.is_ok());
        if res.is_ok() {
            // Every sync started before this one returned may have taken (and dropped our
            // writes with) an error ours did not see: wait for each of them to end. Only on
            // the device calls of others, never on another waiter, so no cycle.
            let before = s.started;
            if s.in_flight.iter().any(|&t| t < before) {
                s.waited += 1;
                while s.in_flight.iter().any(|&t| t < before) {
                    self.ended.wait(&mut s);
                }
            }
        }
        res
    }

    fn discard(&self, offset: u64, len_bytes: u64) -> io::Result<()> {
        self.dev.discard(offset, len_bytes)
    }

    fn write_zeroes(&self, offset: u64, len_bytes: u64) -> io::Result<()> {
        self.dev.write_zeroes(offset, len_bytes)
    }

    fn describe(&self) -> String {
        self.dev.describe()
    }

    fn read_batch(&self, ops: &mut [ReadOp<'_>]) {
        self.dev.read_batch(ops)
    }

    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        self.dev.write_vectored_at(bufs, offset)
    }

    fn reconnects(&self) -> u64 {
        self.dev.reconnects()
    }

    fn set_read_ahead_bytes(&self, bytes: u64) {
        self.dev.set_read_ahead_bytes(bytes)
    }

    fn allocation(&self, offset: u64, len_bytes: u64) -> io::Result<(u64, Allocation)> {
        self.dev.allocation(offset, len_bytes)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use logcache_testkit::sim::SimDevice;

    use super::*;

    /// A device whose next sync panics once armed.
    struct PanickingSync {
        dev: SimDevice,
        armed: AtomicBool,
    }

    impl BlockDevice for PanickingSync {
        fn size_bytes(&self) -> u64 {
            self.dev.size_bytes()
        }
        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
            self.dev.read_at(buf, offset)
        }
        fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
            self.dev.write_at(buf, offset)
        }
        fn flush(&self) -> io::Result<()> {
            assert!(!self.armed.swap(false, Ordering::SeqCst), "the armed sync");
            self.dev.flush()
        }
        fn discard(&self, offset: u64, len_bytes: u64) -> io::Result<()> {
            self.dev.discard(offset, len_bytes)
        }
        fn describe(&self) -> String {
            "a device whose sync panics".into()
        }
    }

    #[test]
    fn a_sync_that_unwinds_counts_as_failed_and_holds_no_later_sync() {
        let dev = Arc::new(PanickingSync {
            dev: SimDevice::new(1 << 20),
            armed: AtomicBool::new(true),
        });
        let backing = Backing::new(dev);
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| backing.flush()));
        assert!(unwound.is_err(), "the armed sync panics");
        assert_eq!(backing.failed_syncs(), 1);
        // Returns at once: the unwound sync is not in flight any more.
        backing.flush().expect("a later sync");
        assert_eq!(backing.failed_syncs(), 1);
        assert_eq!(backing.syncs_waited(), 0);
    }
}
