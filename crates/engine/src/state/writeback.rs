//! Writeback bookkeeping under the state lock: drains waiting, the writeback position last
//! persisted, whether a batch is in flight, its rate and last error, and the oldest zero range
//! not yet applied to the backing device (the position must stay before it).

use super::Waiters;

#[derive(Debug, Default)]
pub struct WritebackState {
    /// Callers of `drain` waiting: writeback runs at full speed while any do.
    drain_requests: Waiters,
    /// The writeback position last persisted in the checkpoint (only rises).
    persisted_seq: u64,
    /// The writeback thread is between collecting a batch and applying it.
    busy: bool,
    /// Current writeback rate target, blocks per second (for statistics).
    rate_blocks_per_s: u64,
    /// The last writeback error, cleared by a successful batch.
    error: Option<String>,
    /// Zero ranges logged and not yet applied to the backing device: the sequence of the
    /// chunk holding the first entry and that chunk's position (segment id, first block),
    /// oldest first. The writeback position must stay before the oldest (recovery re-applies
    /// later ones); with `writeback_order = consistent` writeback does not pass it either.
    zero_pending: Vec<(u64, u64, u32)>,
}

impl WritebackState {
    /// Starts from the position the checkpoint holds.
    pub fn new(persisted_seq: u64) -> WritebackState {
        WritebackState {
            persisted_seq,
            ..WritebackState::default()
        }
    }

    /// Callers of `drain` waiting (`enter` when one starts, `leave` when it ends).
    pub fn drain_requests(&mut self) -> &mut Waiters {
        &mut self.drain_requests
    }

    /// Whether a drain waits (writeback then runs at full speed).
    pub fn draining(&self) -> bool {
        self.drain_requests.any()
    }

    pub fn persisted_seq(&self) -> u64 {
        self.persisted_seq
    }

    /// The checkpoint now records position `seq`.
    pub fn note_persisted(&mut self, seq: u64) {
        self.persisted_seq = self.persisted_seq.max(seq);
    }

    /// A batch is collected (`true`) or applied (`false`).
    pub fn set_busy(&mut self, busy: bool) {
        assert_ne!(self.busy, busy, "writeback batches do not nest");
        self.busy = busy;
    }

    pub fn rate_blocks_per_s(&self) -> u64 {
        self.rate_blocks_per_s
    }

    pub fn set_rate_blocks_per_s(&mut self, rate: u64) {
        self.rate_blocks_per_s = rate;
    }

    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    /// The last batch's outcome: `None` once one succeeded.
    pub fn set_error(&mut self, error: Option<String>) {
        self.error = error;
    }

    /// A zero range is logged from chunk `seq` on, at (`segment_id`, `block`), and not yet
    /// applied. Once per range, with its first chunk.
    pub fn zero_pending(&mut self, seq: u64, segment_id: u64, block: u32) {
        assert!(seq > 0);
        let i = self.zero_pending.partition_point(|&(s, _, _)| s < seq);
        self.zero_pending.insert(i, (seq, segment_id, block));
    }

    /// The oldest zero range logged and not yet applied, if any.
    pub fn zero_pending_seq(&self) -> Option<u64> {
        self.zero_pending.first().map(|z| z.0)
    }

    /// Where the oldest zero range not yet applied is in the log (segment id, block).
    pub fn zero_pending_pos(&self) -> Option<(u64, u32)> {
        self.zero_pending.first().map(|z| (z.1, z.2))
    }

    /// The zero range first logged in chunk `seq` is applied and durable: unless an older one
    /// still pends, the writeback position may pass it.
    pub fn zero_applied(&mut self, seq: u64) {
        if let Some(i) = self.zero_pending.iter().position(|z| z.0 == seq) {
            self.zero_pending.remove(i);
        }
    }
}
