//! Bookkeeping of IO that bypasses the cache to reach the backing device (write-through,
//! write-around, zero ranges): what is in flight, and which of it a backing sync covers.
//!
//! Writes that reached the backing device outside writeback count up `write_gen`; a sync of
//! the backing device started after generation g sets `synced_gen` to g. Flushes sync the
//! backing device while they differ, and the flusher does before writing a chunk, so a log
//! entry that says "the backing device holds this" is never durable before the data it
//! speaks of.

#[derive(Debug, Default)]
pub struct Bypass {
    write_gen: u64,
    synced_gen: u64,
    /// The backing device's `reconnects()` when the oldest bypass write not yet synced began.
    /// A sync that finds the count moved cannot vouch for writes sent on the replaced
    /// connection (the server may have acknowledged and then lost them): it sets
    /// `writes_maybe_lost`, and the next flush reports that as an error.
    reconnects_seen: u64,
    writes_maybe_lost: bool,
    /// Clean block entries the flusher wrote as holes since the last backing sync: it syncs
    /// the backing device for them once there are `OpenOptions::clean_holes_per_backing_sync`.
    holes_since_sync: u64,
    /// Why a backing sync of the flusher's failed, until a flush reports it. A later sync
    /// that succeeds cannot vouch for the writes the failed one covered (a device may drop
    /// them with the error and report success next time), so the next flush fails once.
    sync_failed: Option<String>,
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
    /// A bypass write starts; `reconnects` is the backing device's count now.
    pub fn begin_write(&mut self, reconnects: u64) {
        if self.in_flight == 0 && self.write_gen == self.synced_gen {
            // The oldest unsynced bypass write starts here: a sync must find the same
            // connections in place to cover it.
            self.reconnects_seen = reconnects;
        }
        self.in_flight += 1;
    }

    /// A bypass write ended (done or failed): a flush now owes a backing sync.
    pub fn end_write(&mut self) {
        self.end_io();
        self.write_gen += 1;
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

    /// Records a successful backing sync that started at generation `target`, with the backing
    /// device's reconnect count `reconnects` now. If a connection was replaced since the oldest
    /// bypass write it covers, that write may have been acknowledged on the old connection and
    /// lost with it, and no sync on the new one vouches for it: the next flush says so.
    pub fn note_synced(&mut self, target: u64, reconnects: u64) {
        assert!(
            target <= self.write_gen,
            "a sync past the last bypass write"
        );
        self.synced_gen = self.synced_gen.max(target);
        self.holes_since_sync = 0;
        if reconnects != self.reconnects_seen {
            self.reconnects_seen = reconnects;
            self.writes_maybe_lost = true;
        }
    }

    /// Whether a sync found a replaced connection since the last call (reported once).
    pub fn take_writes_maybe_lost(&mut self) -> bool {
        std::mem::take(&mut self.writes_maybe_lost)
    }

    /// The flusher's backing sync failed with `msg`: it tries again after as many more
    /// holes, and the next flush reports `msg` (see `sync_failed`).
    pub fn note_sync_failed(&mut self, msg: String) {
        self.holes_since_sync = 0;
        self.sync_failed = Some(msg);
    }

    /// Why a backing sync of the flusher's failed since the last call, if one did (reported
    /// once).
    pub fn take_sync_failed(&mut self) -> Option<String> {
        self.sync_failed.take()
    }
}
