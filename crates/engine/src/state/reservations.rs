//! Reservations: blocks of the log a large write took before its payload arrived, so the
//! payload can be received straight into the RAM segment (one copy, socket → segment) and
//! published into the index afterwards (`path/reserve.rs`).
//!
//! A reserved block is live in its segment but in no index entry, so a chunk sealed meanwhile
//! encodes it as a hole; the chunk then waits in the flusher's queue (`pending_blocks`) until
//! the reservation is published (its entries patched from holes into data entries) or let go.
//! The segment's RAM buffer stays while any block of it is reserved (`reserved_blocks`; once
//! the segment is written it is detached from it instead), so the receiving thread never
//! writes into a buffer reused by another segment.
//!
//! Two things make a reservation give up publishing (the caller then writes the payload the
//! ordinary way, at the end of the log): a conflict, any other change logged for its blocks
//! while it was pending (an index insert or a zero or drop range after it in the log would
//! win on replay, so publishing would make RAM and the cache device disagree); and a cancel,
//! when a flush point or a waiter needs the chunks it holds written (a client that stops
//! sending mid-payload must not hold up anyone else).
//!
//! At most `RESERVATIONS_MAX` at once (one per connection's reader at a time), each at most
//! `RUNS_MAX` runs of blocks adjacent in one chunk: the table is allocated once.

/// Reservations in flight at once; past it, large writes take the ordinary path.
pub const RESERVATIONS_MAX: usize = 16;
/// Runs (pieces in separate chunks) one reservation may take: a 2 MiB write on 1 MiB segments
/// needs at most 4 (the rest of one chunk, two whole ones, the start of a fourth).
pub const RUNS_MAX: usize = 4;

/// Blocks `first_block..first_block + count` of the segment in `slot`, all in the chunk `seq`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Run {
    pub slot: u32,
    pub first_block: u32,
    pub count: u32,
    pub chunk_seq: u64,
}

#[derive(Clone, Copy, Debug)]
struct Active {
    id: u64,
    first_lba: u64,
    end_lba: u64,
    runs: [Run; RUNS_MAX],
    run_count: usize,
    /// Another change to its blocks was logged after it: it must not publish.
    conflicted: bool,
    /// Its blocks still count in their chunks' `pending_blocks` and as live in their
    /// segments (false once cancelled: let go then).
    pending: bool,
}

pub struct Reservations {
    table: Vec<Option<Active>>,
    next_id: u64,
    live: usize,
}

impl Default for Reservations {
    fn default() -> Reservations {
        Reservations {
            table: vec![None; RESERVATIONS_MAX],
            next_id: 1,
            live: 0,
        }
    }
}

/// What a finished reservation may still do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Finished {
    pub runs: [Run; RUNS_MAX],
    pub run_count: usize,
    /// Neither conflicted nor cancelled: it may publish.
    pub publishable: bool,
    /// Its blocks still count in their chunks' `pending_blocks` and as live (not cancelled).
    pub pending: bool,
}

impl Reservations {
    pub fn has_room(&self) -> bool {
        self.live < RESERVATIONS_MAX
    }

    pub fn any(&self) -> bool {
        self.live > 0
    }

    /// Runs of every reservation in the table (each pins at most one segment's buffer).
    pub fn runs_held(&self) -> usize {
        self.table.iter().flatten().map(|a| a.run_count).sum()
    }

    /// Records a reservation of blocks `first_lba..end_lba` held in `runs`; returns its id.
    pub fn add(&mut self, first_lba: u64, end_lba: u64, runs: &[Run]) -> u64 {
        assert!(self.has_room(), "a reservation past the table");
        assert!(!runs.is_empty() && runs.len() <= RUNS_MAX);
        assert_eq!(
            runs.iter().map(|r| u64::from(r.count)).sum::<u64>(),
            end_lba - first_lba,
            "runs disagree with the range"
        );
        let id = self.next_id;
        self.next_id += 1;
        let mut all = [Run::default(); RUNS_MAX];
        all[..runs.len()].copy_from_slice(runs);
        let slot = self
            .table
            .iter_mut()
            .find(|a| a.is_none())
            .expect("has_room checked");
        *slot = Some(Active {
            id,
            first_lba,
            end_lba,
            runs: all,
            run_count: runs.len(),
            conflicted: false,
            pending: true,
        });
        self.live += 1;
        id
    }

    /// A change to blocks `first..end` is logged now: every reservation overlapping them
    /// conflicts.
    pub fn touch(&mut self, first: u64, end: u64) {
        if self.live == 0 {
            return;
        }
        for a in self.table.iter_mut().flatten() {
            if a.first_lba < end && first < a.end_lba {
                a.conflicted = true;
            }
        }
    }

    /// Cancels every reservation still pending: pushes the runs the caller must let go now
    /// (`State::let_go`). They will not publish.
    pub fn cancel_all(&mut self, out: &mut impl FnMut(Run)) -> usize {
        let mut cancelled = 0;
        for a in self.table.iter_mut().flatten() {
            if a.pending {
                a.pending = false;
                cancelled += 1;
                a.runs[..a.run_count].iter().for_each(|&r| out(r));
            }
        }
        cancelled
    }

    /// Removes reservation `id` from the table.
    pub fn finish(&mut self, id: u64) -> Finished {
        let slot = self
            .table
            .iter_mut()
            .find(|a| a.is_some_and(|a| a.id == id))
            .expect("finishing a reservation not in the table");
        let a = slot.take().expect("found above");
        self.live -= 1;
        Finished {
            runs: a.runs,
            run_count: a.run_count,
            publishable: a.pending && !a.conflicted,
            pending: a.pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(count: u32, seq: u64) -> Run {
        Run {
            slot: 0,
            first_block: 2,
            count,
            chunk_seq: seq,
        }
    }

    #[test]
    fn a_change_to_its_blocks_spoils_a_reservation_and_nothing_else_does() {
        let mut r = Reservations::default();
        let a = r.add(10, 20, &[run(4, 1), run(6, 2)]);
        let b = r.add(30, 32, &[run(2, 2)]);
        r.touch(20, 30); // between them
        r.touch(19, 20);
        let fa = r.finish(a);
        assert!(!fa.publishable && fa.pending);
        let fb = r.finish(b);
        assert!(fb.publishable);
        assert!(!r.any());
    }

    #[test]
    fn cancel_releases_each_pending_run_once() {
        let mut r = Reservations::default();
        let a = r.add(0, 5, &[run(5, 7)]);
        let mut runs = Vec::new();
        assert_eq!(r.cancel_all(&mut |x| runs.push(x)), 1);
        assert_eq!(r.cancel_all(&mut |x| runs.push(x)), 0);
        assert_eq!(runs, vec![run(5, 7)]);
        let f = r.finish(a);
        assert!(!f.publishable && !f.pending);
    }

    #[test]
    fn the_table_is_bounded() {
        let mut r = Reservations::default();
        let ids: Vec<u64> = (0..RESERVATIONS_MAX as u64)
            .map(|i| r.add(i, i + 1, &[run(1, 1)]))
            .collect();
        assert!(!r.has_room());
        r.finish(ids[3]);
        assert!(r.has_room());
    }
}
