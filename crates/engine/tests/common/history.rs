//! The per-sector model shared by the crash tests: what each sector may read as, during a run
//! (the read checker) and after a power loss (the recovery check), given the history of the
//! operations on it. Operations may overlap in time (the concurrent simulation), so each one
//! carries the logical times it was sent (`invoke`) and acknowledged (`complete`).
//!
//! The rules, per sector:
//! - a value is legal only if some operation put it there (a write's pattern, the zeros of a
//!   write-zeroes) and that operation was sent before the read finished;
//! - during a run, a read may not return a value some acknowledged operation had already
//!   replaced before the read was sent: `o` is replaced by `d` when `d` was sent after `o` was
//!   acknowledged and `d` was acknowledged before the read was sent;
//! - after a power loss, the same, with `d` limited to operations made durable (acknowledged
//!   before a flush that then completed, or FUA);
//! - a TRIM is a hint: while not replaced, it allows zeros or any data ever written to that
//!   sector (old data, zeros or the discard's result), never data never written there.
//!
//! An operation that failed may or may not have happened: it stays a legal value and replaces
//! nothing. What recovery returned is durable, so it becomes the sector's one entry.

use super::{identify, sector_pattern, SECTOR};

/// What a sector reads as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Val {
    /// The pattern of write `id` (id 0: the backing device's original content).
    Data(u64),
    Zeros,
}

/// What an operation did to a sector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    Data(u64),
    /// Write-zeroes: reads as zeros.
    Zeros,
    /// TRIM: zeros, or any data ever written there.
    Trim,
}

const NEVER: u64 = u64::MAX;

#[derive(Clone, Debug)]
struct Entry {
    effect: Effect,
    invoke: u64,
    /// `NEVER` until acknowledged (and for ever if it failed).
    complete: u64,
    durable: bool,
}

impl Entry {
    fn allows(&self, v: Val, ever: &[u64]) -> bool {
        match (self.effect, v) {
            (Effect::Data(a), Val::Data(b)) => a == b,
            (Effect::Zeros, Val::Zeros) | (Effect::Trim, Val::Zeros) => true,
            (Effect::Trim, Val::Data(id)) => ever.contains(&id),
            _ => false,
        }
    }
}

/// An operation in flight: what `History::end` needs.
#[derive(Clone, Debug)]
pub struct Token {
    pub first: usize,
    pub count: usize,
    pub invoke: u64,
}

/// Decodes a sector: zeros, a write's pattern, or `None` (bytes no write put there).
pub fn decode(sector: u64, bytes: &[u8]) -> Option<Val> {
    if bytes.iter().all(|&b| b == 0) {
        return Some(Val::Zeros);
    }
    identify(sector, bytes).map(Val::Data)
}

/// Fills `out` (whole sectors from `first`) with write `id`'s pattern.
pub fn fill_pattern(id: u64, first: u64, out: &mut [u8]) {
    for (i, s) in out.chunks_mut(SECTOR).enumerate() {
        sector_pattern(id, first + i as u64, s);
    }
}

pub struct History {
    sectors: Vec<Vec<Entry>>,
    /// Per sector: every write id ever sent there (the TRIM rule).
    ever: Vec<Vec<u64>>,
    clock: u64,
    next_id: u64,
    /// Set at a power loss: acknowledgements after it do not count.
    dead: bool,
    /// When each read still running was sent: what they may return is not pruned.
    reads_in_flight: Vec<u64>,
}

impl History {
    /// `n` sectors, each holding write 0 (the backing device's original content), durable.
    pub fn new(n: usize) -> History {
        let floor = Entry {
            effect: Effect::Data(0),
            invoke: 0,
            complete: 0,
            durable: true,
        };
        History {
            sectors: vec![vec![floor]; n],
            ever: vec![vec![0]; n],
            clock: 1,
            next_id: 1,
            dead: false,
            reads_in_flight: Vec::new(),
        }
    }

    pub fn sector_count(&self) -> usize {
        self.sectors.len()
    }

    /// The next logical time.
    pub fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// A read is sent now; returns its time (give it to `check_read`).
    pub fn begin_read(&mut self) -> u64 {
        let ri = self.tick();
        self.reads_in_flight.push(ri);
        ri
    }

    /// A fresh write id.
    pub fn next_write_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Registers an operation on `count` sectors from `first`, sent now.
    pub fn begin(&mut self, first: usize, count: usize, effect: Effect) -> Token {
        let invoke = self.tick();
        for s in first..first + count {
            self.sectors[s].push(Entry {
                effect,
                invoke,
                complete: NEVER,
                durable: false,
            });
            if let Effect::Data(id) = effect {
                self.ever[s].push(id);
            }
        }
        Token {
            first,
            count,
            invoke,
        }
    }

    /// The operation returned; `ok` if it succeeded. Returns its completion time.
    pub fn end(&mut self, t: &Token, ok: bool) -> u64 {
        let now = self.tick();
        if !ok || self.dead {
            return NEVER;
        }
        for s in t.first..t.first + t.count {
            let e = self.sectors[s]
                .iter_mut()
                .find(|e| e.invoke == t.invoke)
                .expect("a registered operation stays until replaced");
            e.complete = now;
        }
        now
    }

    /// A flush sent at `invoke` completed: everything acknowledged before it is durable.
    pub fn flushed(&mut self, invoke: u64) {
        if self.dead {
            return;
        }
        for entries in &mut self.sectors {
            for e in entries.iter_mut() {
                if e.complete < invoke {
                    e.durable = true;
                }
            }
        }
        self.prune();
    }

    /// The operation `t` (acknowledged) is durable: FUA, or sealed and synced on its own.
    pub fn durable(&mut self, t: &Token) {
        if self.dead {
            return;
        }
        for s in t.first..t.first + t.count {
            for e in self.sectors[s].iter_mut() {
                if e.invoke == t.invoke && e.complete != NEVER {
                    e.durable = true;
                }
            }
        }
        self.prune();
    }

    /// Drops entries a durable one replaced: no read or recovery may return them again (a
    /// read still running may, if it was sent before the durable one was acknowledged).
    fn prune(&mut self) {
        let horizon = self.reads_in_flight.iter().copied().min().unwrap_or(NEVER);
        for entries in &mut self.sectors {
            let newest = entries
                .iter()
                .filter(|e| e.durable && e.complete < horizon)
                .map(|e| e.invoke)
                .max()
                .unwrap_or(0);
            entries.retain(|e| e.complete == NEVER || e.complete >= newest);
        }
    }

    /// What each sector holds as far as the model knows: after `check_recovered`, the
    /// recovered value (`Trim` where only a TRIM allowed it).
    pub fn recovered_effects(&self) -> Vec<Effect> {
        self.sectors
            .iter()
            .map(|entries| {
                assert_eq!(entries.len(), 1, "called right after check_recovered");
                entries[0].effect
            })
            .collect()
    }

    /// Whether the power is off (acknowledgements do not count).
    pub fn is_dead(&self) -> bool {
        self.dead
    }

    /// The power fails now: acknowledgements from here on do not count.
    pub fn power_off(&mut self) {
        self.dead = true;
    }

    /// The read sent at `ri` returned: checks each of its sectors (`vals[i]` is what sector
    /// `first + i` read as). The first violation, if any.
    pub fn end_read(&mut self, ri: u64, first: usize, vals: &[Option<Val>]) -> Result<(), String> {
        let rc = self.end_query(ri);
        for (i, v) in vals.iter().enumerate() {
            self.check(first + i, *v, |d| d.complete < ri, rc)?;
        }
        Ok(())
    }

    /// An export sent at `ri` (with `begin_read`) had taken its moment by `at` (a `tick`
    /// after it did), and read `vals` from sector `first` afterwards, however much later:
    /// each must be what a read sent at `ri` and returned at `at` could have returned.
    /// Ends the query when `last`.
    pub fn check_as_of(
        &mut self,
        ri: u64,
        at: u64,
        first: usize,
        vals: &[Option<Val>],
        last: bool,
    ) -> Result<(), String> {
        assert!(ri < at, "the moment comes after the export is sent");
        if last {
            self.end_query(ri);
        }
        for (i, v) in vals.iter().enumerate() {
            self.check(first + i, *v, |d| d.complete < ri, at)?;
        }
        Ok(())
    }

    /// A block status query sent at `ri` (with `begin_read`) returned, calling sector
    /// `first + i` zero where `zero[i]`: each such sector must be one a read sent then could
    /// have returned as zeros. Sectors called data promise nothing.
    pub fn end_status(&mut self, ri: u64, first: usize, zero: &[bool]) -> Result<(), String> {
        let rc = self.end_query(ri);
        for (i, _) in zero.iter().enumerate().filter(|(_, &z)| z) {
            self.check(first + i, Some(Val::Zeros), |d| d.complete < ri, rc)
                .map_err(|msg| format!("block status called it zero: {msg}"))?;
        }
        Ok(())
    }

    /// A read or status query sent at `ri` ends: returns the time it ended.
    fn end_query(&mut self, ri: u64) -> u64 {
        let rc = self.tick();
        let i = self
            .reads_in_flight
            .iter()
            .position(|&t| t == ri)
            .expect("a read ends once");
        self.reads_in_flight.swap_remove(i);
        rc
    }

    fn check(
        &self,
        s: usize,
        v: Option<Val>,
        counts: impl Fn(&Entry) -> bool,
        sent_before: u64,
    ) -> Result<(), String> {
        let entries = &self.sectors[s];
        let Some(v) = v else {
            return Err(format!("sector {s} holds bytes no write put there"));
        };
        let ok = entries.iter().any(|o| {
            o.invoke < sent_before
                && o.allows(v, &self.ever[s])
                && !entries
                    .iter()
                    .any(|d| d.complete != NEVER && counts(d) && d.invoke > o.complete)
        });
        if ok {
            return Ok(());
        }
        Err(format!(
            "sector {s} reads {v:?}, which no operation may have left there: {}",
            self.describe(s)
        ))
    }

    /// The history of sector `s`, for messages.
    pub fn describe(&self, s: usize) -> String {
        let list: Vec<String> = self.sectors[s]
            .iter()
            .map(|e| {
                let done = if e.complete == NEVER {
                    "-".to_string()
                } else {
                    e.complete.to_string()
                };
                let durable = if e.durable { " durable" } else { "" };
                format!("{:?} [{}..{}]{}", e.effect, e.invoke, done, durable)
            })
            .collect();
        list.join(", ")
    }

    /// Checks a recovered image of the whole region against the durable history, then makes
    /// what it holds each sector's one durable entry (recovery synced it).
    pub fn check_recovered(&mut self, image: &[u8]) -> Result<(), String> {
        self.check_recovered_except(image, &[])
    }

    /// As `check_recovered`, skipping the sectors `skip` marks (lost with a failed cache
    /// device); they are taken as trimmed (unknown) from then on.
    pub fn check_recovered_except(&mut self, image: &[u8], skip: &[bool]) -> Result<(), String> {
        let n = self.sectors.len();
        assert_eq!(image.len(), n * SECTOR);
        let skipped = |s: usize| skip.get(s).copied().unwrap_or(false);
        let vals: Vec<Option<Val>> = (0..n)
            .map(|s| {
                if skipped(s) {
                    Some(Val::Zeros)
                } else {
                    decode(s as u64, &image[s * SECTOR..(s + 1) * SECTOR])
                }
            })
            .collect();
        for (s, v) in vals.iter().enumerate() {
            if !skipped(s) {
                self.check(s, *v, |d| d.durable, NEVER)?;
            }
        }
        let now = self.tick();
        for (s, v) in vals.into_iter().enumerate() {
            let effect = match v.expect("checked") {
                Val::Data(id) => Effect::Data(id),
                Val::Zeros => Effect::Zeros,
            };
            // A sector a TRIM may have been the last to touch stays trimmed: its content is
            // unspecified until written again, so a later read may find another older value (a
            // replayed cached copy now, the backing device's after an eviction). That holds when
            // only a TRIM allowed the value (older data, or zeros), and also when a TRIM not
            // replaced by a durable operation overlapped the operation that put the value
            // there: NBD leaves overlapping requests unordered, so the TRIM may have come after
            // it (sim seed 49: recovery returned a write sent while a TRIM of it was in flight,
            // and the backing device then held the TRIM's zeros).
            let entries = &self.sectors[s];
            let live = |o: &Entry| {
                !entries
                    .iter()
                    .any(|d| d.complete != NEVER && d.durable && d.invoke > o.complete)
            };
            let trimmed_after = |d: &Entry| {
                entries
                    .iter()
                    .any(|t| t.effect == Effect::Trim && live(t) && t.complete >= d.invoke)
            };
            let direct: Vec<&Entry> = entries
                .iter()
                .filter(|e| e.effect == effect && live(e))
                .collect();
            // Zeros are also what a live TRIM itself may leave (the backing device's discard,
            // or a clean copy promoted from it), so recovered zeros stay trimmed whenever a
            // TRIM not replaced by a durable operation is in the history, even if a write-zeroes
            // explains them too: one that failed or was never made durable may not have
            // happened (crash seed 12593308766140456607: a write-zeroes failed on a dead
            // engine, the zeros were a clean copy read after an earlier TRIM, and an eviction
            // two power cuts later left the backing device's original data, which the TRIM
            // allows). A durable write-zeroes after the TRIM replaces it, so it stays zeros.
            let trim_zeros = effect == Effect::Zeros
                && entries.iter().any(|t| t.effect == Effect::Trim && live(t));
            let effect = if skipped(s)
                || direct.is_empty()
                || trim_zeros
                || direct.iter().any(|d| trimmed_after(d))
            {
                Effect::Trim
            } else {
                effect
            };
            self.sectors[s] = vec![Entry {
                effect,
                invoke: now,
                complete: now,
                durable: true,
            }];
        }
        self.dead = false;
        Ok(())
    }
}
