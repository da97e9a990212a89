//! The log's sequence numbers: the chunk being filled (`next`), the last written to the cache
//! device, the last durable there, and the newest a flush waits for. Each only rises, and
//! synced ≤ written < next.

#[derive(Debug)]
pub struct Seqs {
    /// Sequence the next sealed chunk gets (the open chunk's).
    next: u64,
    /// Every chunk up to this sequence is written to the cache device.
    written: u64,
    /// Every chunk up to this sequence is durable on the cache device.
    synced: u64,
    /// A flush or FUA write waits for this sequence to be synced.
    sync_wanted: u64,
    /// This session's epoch (in every chunk header it writes).
    epoch: u64,
}

impl Seqs {
    /// Recovery ended the log at `last` (written and synced: open synced it).
    pub fn new(last: u64, epoch: u64) -> Seqs {
        Seqs {
            next: last + 1,
            written: last,
            synced: last,
            sync_wanted: last,
            epoch,
        }
    }

    #[inline]
    pub fn next(&self) -> u64 {
        self.next
    }

    /// The last sealed chunk's sequence.
    pub fn last_sealed(&self) -> u64 {
        self.next - 1
    }

    pub fn written(&self) -> u64 {
        self.written
    }

    pub fn synced(&self) -> u64 {
        self.synced
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// A chunk was sealed: the next one gets the next sequence.
    pub fn advance_next(&mut self) {
        self.next += 1;
    }

    /// Chunk `seq` reached the cache device; chunks reach it in order.
    pub fn note_written(&mut self, seq: u64) {
        assert_eq!(
            seq,
            self.written + 1,
            "chunks must reach the device in order"
        );
        assert!(seq < self.next, "written a chunk never sealed");
        self.written = seq;
    }

    /// A sync that started with chunks up to `target` written completed.
    pub fn note_synced(&mut self, target: u64) {
        assert!(target >= self.synced, "the synced sequence only rises");
        assert!(target <= self.written, "synced past what was written");
        self.synced = target;
    }

    /// Someone waits for chunks up to `seq` to be durable.
    pub fn want_sync(&mut self, seq: u64) {
        self.sync_wanted = self.sync_wanted.max(seq);
    }

    /// Whether a flush waits for a sync that has not happened.
    pub fn sync_wanted(&self) -> bool {
        self.sync_wanted > self.synced
    }
}
