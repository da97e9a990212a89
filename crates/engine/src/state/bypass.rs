//! Bookkeeping of IO that bypasses the cache to reach the backing device (write-through,
//! write-around, zero ranges): what is in flight, and which of it a backing sync covers.
//!
//! Writes that reached the backing device outside writeback count up `write_gen`; a sync of
//! the backing device started after generation g sets `synced_gen` to g. Flushes sync the
//! backing device while they differ, and the flusher does before writing a chunk, so a log
//! entry that says "the backing device holds this" is never durable before the data it
//! speaks of.
//!
//! A backing sync that fails (or finds a replaced connection) may have lost every bypass write
//! no earlier sync covered, and no later sync vouches for them (a device may drop them with
//! the error and report success next time: Linux's page cache does). Then `lost` holds until
//! they are durable again: write-through copies still cached are marked dirty, so writeback
//! writes them again and syncs (`State::backing_writes_lost`); a write-around write, or a
//! copy evicted meanwhile, has no copy left, and flushes fail until the cache is reopened.

/// Bypass writes a failed backing sync may have lost, until they are durable again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lost {
    /// Their cached copies are marked dirty: writeback writes them again; resolved once no
    /// dirty block lies before log position `end` (segment id, block).
    Rewriting { end: (u64, u32) },
    /// Some have no copy in the cache (write-around, or evicted): no flush can promise them.
    Gone,
}

#[derive(Debug, Default)]
pub struct Bypass {
    write_gen: u64,
    synced_gen: u64,
    /// The backing device's `reconnects()` when the oldest bypass write not yet synced began.
    /// A sync that finds the count moved cannot vouch for writes sent on the replaced
    /// connection (the server may have acknowledged and then lost them): they count as lost.
    reconnects_seen: u64,
    /// Log position (segment id, block) from which clean copies of bypass writes no
    /// completed backing sync covers may lie: the open chunk's start when the oldest such
    /// write began, moved on to the open chunk's start when a sync covering it began.
    unsynced_from: (u64, u32),
    /// The newest log position of a clean block evicted (or dropped) so far: a copy at or
    /// after `unsynced_from` may have been a bypass write's, which a lost sync leaves with no
    /// copy.
    evicted_last: Option<(u64, u32)>,
    /// `write_gen` of the newest write-around write (its data is in no log).
    around_gen: u64,
    /// Backing syncs failed (or replaced connections found) so far: a write-through write
    /// that saw this move while under way marks its own copy dirty.
    losses: u64,
    /// The backing device's count of failed syncs (`Backing::failed_syncs`) as of the last
    /// failure handled: a success that finds it behind handles the rest first.
    failed_syncs_handled: u64,
    /// Bypass writes a failed sync may have lost, until durable again (module doc).
    lost: Option<Lost>,
    /// Why, for the error flushes return meanwhile.
    lost_why: String,
    /// The newest target of a sync that succeeded while `lost`: `synced_gen` moves there
    /// once the lost writes are durable again (until then no clean entry at or below the
    /// failure may be vouched for).
    synced_held: u64,
    /// Clean block entries the flusher wrote as holes since the last backing sync: it syncs
    /// the backing device for them once there are `OpenOptions::clean_holes_per_backing_sync`.
    holes_since_sync: u64,
    /// Writes to the backing device outside writeback in flight: read misses are not promoted
    /// meanwhile (they could read the old data).
    in_flight: u32,
    /// Zero ranges `[first, end)` (blocks) being applied: logged, cached copies dropped, the
    /// backing device not yet zeroed. A read miss there returns zeros, not the backing
    /// device's old data (older than the dirty copies the range dropped).
    zeroing: Vec<(u64, u64)>,
    /// Write-through and write-around writes `[first, end)` (blocks) between their drop range's
    /// logging and their end (for write-through: its clean copy logged). A zero range over them
    /// waits: logged meanwhile, its zeros could land on the backing device after their data,
    /// behind a clean copy logged after the range.
    writing: Vec<(u64, u64)>,
    /// TRIMs `[first, end)` (blocks) between their start and their discard, and whether a
    /// write, bypass write or zero range of their blocks began meanwhile: then the discard is
    /// left out (a hint), since it could land on the backing device after that newer data.
    trimming: Vec<(u64, u64, bool)>,
}

impl Bypass {
    /// A bypass write starts; `reconnects` is the backing device's count now, `log_pos` where
    /// the log's next chunk starts (its clean copy, if any, goes there or later).
    pub fn begin_write(&mut self, reconnects: u64, log_pos: (u64, u32)) {
        if self.in_flight == 0 && self.write_gen == self.synced_gen {
            // The oldest unsynced bypass write starts here: a sync must find the same
            // connections in place to cover it, and no unsynced copy lies before `log_pos`.
            self.reconnects_seen = reconnects;
            if self.lost.is_none() {
                self.unsynced_from = self.unsynced_from.max(log_pos);
            }
        }
        self.in_flight += 1;
    }

    /// A bypass write ended (done or failed): a flush now owes a backing sync. `around`: a
    /// write-around write, whose data no cached copy holds.
    pub fn end_write(&mut self, around: bool) {
        self.end_io();
        self.write_gen += 1;
        if around {
            self.around_gen = self.write_gen;
        }
        assert!(self.write_gen > self.synced_gen);
    }

    /// An IO that syncs the backing device itself (a zero range) starts: only promotions
    /// need to know.
    pub fn begin_io(&mut self) {
        self.in_flight += 1;
    }

    pub fn end_io(&mut self) {
        assert!(self.in_flight > 0, "bypass IO count underflow");
        self.in_flight -= 1;
    }

    /// A zero range over blocks `[first, end)` starts dropping cached copies.
    pub fn begin_zeroing(&mut self, first: u64, end: u64) {
        assert!(first < end, "an empty zero range");
        self.zeroing.push((first, end));
    }

    /// The zero range `[first, end)` is applied to the backing device (or failed).
    pub fn end_zeroing(&mut self, first: u64, end: u64) {
        let i = self
            .zeroing
            .iter()
            .position(|&r| r == (first, end))
            .expect("ending a zero range that did not begin");
        self.zeroing.swap_remove(i);
    }

    /// Whether block `lba` is in a zero range being applied (a miss there reads as zeros).
    pub fn zeroing(&self, lba: u64) -> bool {
        self.zeroing
            .iter()
            .any(|&(first, end)| first <= lba && lba < end)
    }

    /// A bypass write to blocks `[first, end)` is under way (see `writing`).
    pub fn begin_writing(&mut self, first: u64, end: u64) {
        assert!(first < end, "an empty bypass write");
        self.writing.push((first, end));
    }

    /// The bypass write to blocks `[first, end)` is over (done or failed).
    pub fn end_writing(&mut self, first: u64, end: u64) {
        let i = self
            .writing
            .iter()
            .position(|&r| r == (first, end))
            .expect("ending a bypass write that did not begin");
        self.writing.swap_remove(i);
    }

    /// A TRIM of blocks `[first, end)` starts dropping cached copies.
    pub fn begin_trimming(&mut self, first: u64, end: u64) {
        assert!(first < end, "an empty TRIM");
        self.trimming.push((first, end, false));
    }

    /// Blocks `[first, end)` take newer data (a write, a bypass write, a zero range): a TRIM
    /// under way over any of them must not send its discard. Cheap when no TRIM is under way.
    pub fn spoil_trims(&mut self, first: u64, end: u64) {
        for r in self.trimming.iter_mut() {
            if r.0 < end && first < r.1 {
                r.2 = true;
            }
        }
    }

    /// Whether a block of the TRIM `[first, end)` took newer data since it began.
    pub fn trim_spoiled(&self, first: u64, end: u64) -> bool {
        self.trimming
            .iter()
            .find(|r| (r.0, r.1) == (first, end))
            .expect("asking about a TRIM that did not begin")
            .2
    }

    /// The TRIM of blocks `[first, end)` is over (discarded, left out or failed).
    pub fn end_trimming(&mut self, first: u64, end: u64) {
        let i = self
            .trimming
            .iter()
            .position(|r| (r.0, r.1) == (first, end))
            .expect("ending a TRIM that did not begin");
        self.trimming.swap_remove(i);
    }

    /// Whether a bypass write under way touches a block of `[first, end)`.
    pub fn writing_any(&self, first: u64, end: u64) -> bool {
        self.writing.iter().any(|&(f, e)| f < end && first < e)
    }

    /// Block ranges (first, end) being zeroed: logged or about to be, not yet on the backing
    /// device.
    pub fn zeroing_ranges(&self) -> &[(u64, u64)] {
        &self.zeroing
    }

    /// Whether a zero range being applied covers a block of `[first, end)`.
    pub fn zeroing_any(&self, first: u64, end: u64) -> bool {
        self.zeroing.iter().any(|&(f, e)| f < end && first < e)
    }

    /// Whether any bypass IO is in flight (read misses are not promoted meanwhile).
    pub fn in_flight(&self) -> bool {
        self.in_flight > 0
    }

    /// Bypass writes ended so far: a clean entry logged now speaks of data no newer.
    pub fn write_gen(&self) -> u64 {
        self.write_gen
    }

    /// The newest generation a completed backing sync covers.
    pub fn synced_gen(&self) -> u64 {
        self.synced_gen
    }

    /// The flusher wrote `count` clean block entries as holes (no backing sync covered them).
    pub fn note_holed(&mut self, count: u64) {
        self.holes_since_sync += count;
    }

    /// Clean block entries written as holes since the last backing sync.
    pub fn holes_since_sync(&self) -> u64 {
        self.holes_since_sync
    }

    /// The generation a backing sync started now would cover, if one is owed.
    pub fn sync_owed(&self) -> Option<u64> {
        debug_assert!(self.synced_gen <= self.write_gen);
        (self.write_gen > self.synced_gen).then_some(self.write_gen)
    }

    /// Records a successful backing sync that started at generation `target` with the log's
    /// next chunk at `log_pos`, with the backing device's reconnect count `reconnects` now.
    /// False if a connection was replaced since the oldest bypass write it covers: that write
    /// may have been acknowledged on the old connection and lost with it, and no sync on the
    /// new one vouches for it (the caller counts the writes lost).
    #[must_use]
    pub fn note_synced(&mut self, target: u64, log_pos: (u64, u32), reconnects: u64) -> bool {
        assert!(
            target <= self.write_gen,
            "a sync past the last bypass write"
        );
        self.holes_since_sync = 0;
        if reconnects != self.reconnects_seen {
            self.reconnects_seen = reconnects;
            return false;
        }
        if self.lost.is_some() {
            self.synced_held = self.synced_held.max(target);
        } else {
            self.synced_gen = self.synced_gen.max(target);
            self.unsynced_from = self.unsynced_from.max(log_pos);
        }
        true
    }

    /// A backing sync failed with `why` (or found a replaced connection) and `lost` is the
    /// outcome `State::backing_writes_lost` decided (`None`: nothing unsynced). A flusher
    /// retries after as many more holes.
    pub fn note_sync_failed(&mut self, why: String, lost: Option<Lost>) {
        self.holes_since_sync = 0;
        self.losses += 1;
        let Some(lost) = lost else {
            return;
        };
        self.lost_why = why;
        self.lost = match (self.lost.take(), lost) {
            (Some(Lost::Gone), _) | (_, Lost::Gone) => Some(Lost::Gone),
            (Some(Lost::Rewriting { end: a }), Lost::Rewriting { end: b }) => {
                Some(Lost::Rewriting { end: a.max(b) })
            }
            (None, l) => Some(l),
        };
    }

    /// A write-through write under way when a sync failed marked its copy dirty: the lost
    /// writes are durable again once no dirty block lies before `end` either.
    pub fn note_rewriting(&mut self, end: (u64, u32)) {
        self.lost = match self.lost.take() {
            Some(Lost::Gone) => Some(Lost::Gone),
            Some(Lost::Rewriting { end: a }) => Some(Lost::Rewriting { end: a.max(end) }),
            None => {
                self.lost_why =
                    "a backing sync failed while a write-through write was under way".into();
                Some(Lost::Rewriting { end })
            }
        };
    }

    /// A write-around write under way when a backing sync failed (its data may have landed
    /// before the failure, which did not count it): no copy of it is left, so no flush can
    /// promise it.
    pub fn note_around_lost(&mut self) {
        if self.lost.is_none() {
            self.lost_why = "a backing sync failed while a write-around write was under way".into();
        }
        self.lost = Some(Lost::Gone);
    }

    /// Whether a backing sync could have lost something now: bypass writes no completed sync
    /// covers, and whether one of them has no cached copy (write-around, or a clean block at
    /// or after `unsynced_from` evicted since).
    pub fn at_risk(&self) -> Option<bool> {
        (self.write_gen > self.synced_gen).then(|| {
            self.around_gen > self.synced_gen
                || self.evicted_last.is_some_and(|p| p >= self.unsynced_from)
        })
    }

    /// Where clean copies of bypass writes no completed sync covers may start in the log.
    pub fn unsynced_from(&self) -> (u64, u32) {
        self.unsynced_from
    }

    /// A clean block at log position `pos` was evicted or dropped.
    pub fn note_evicted(&mut self, pos: (u64, u32)) {
        self.evicted_last = Some(self.evicted_last.map_or(pos, |p| p.max(pos)));
    }

    /// Failed backing syncs so far (see `losses`).
    pub fn losses(&self) -> u64 {
        self.losses
    }

    /// The backing device had counted `failed_syncs` failed syncs when one was handled.
    pub fn note_failed_syncs_handled(&mut self, failed_syncs: u64) {
        self.failed_syncs_handled = self.failed_syncs_handled.max(failed_syncs);
    }

    /// Whether some of the backing device's `failed_syncs` failed syncs were not handled yet.
    pub fn failed_syncs_unhandled(&self, failed_syncs: u64) -> bool {
        failed_syncs > self.failed_syncs_handled
    }

    /// Bypass writes a failed sync may have lost, and why, while not durable again.
    pub fn lost(&self) -> Option<(&Lost, &str)> {
        self.lost.as_ref().map(|l| (l, self.lost_why.as_str()))
    }

    /// The lost writes were written again from their cached copies and synced: syncs since
    /// vouch for what they covered again.
    pub fn note_rewritten(&mut self) {
        assert!(
            matches!(self.lost, Some(Lost::Rewriting { .. })),
            "rewritten while {:?}",
            self.lost
        );
        self.lost = None;
        self.synced_gen = self.synced_gen.max(self.synced_held);
    }
}
