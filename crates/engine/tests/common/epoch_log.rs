//! Issue 25's backing-device check (`epochs::check_backing_image`) for histories whose
//! operations overlap in time (the concurrent simulation).
//!
//! The guarantee, as in `epochs`: the backing device alone holds a state a power cut at some
//! past moment T could have left the disk in. With overlapping operations that state is judged
//! per sector, like `history`'s recovery check, but with one T for every sector (that is what
//! makes it an epoch prefix, not a per-sector "old or new"):
//! - an operation is durable at T if a flush point completed at or before T covers it (a
//!   FLUSH covers what was acknowledged before it was sent; a FUA operation covers that and
//!   itself);
//! - a sector may hold the value of an operation sent before T that no operation durable at T
//!   replaced (sent after it was acknowledged), TRIM allowing zeros or any data ever written.
//!
//! The durable set changes only at flush points, so the candidate moments are the flush
//! points' completions (each taken as late as possible: just before the next one). After a
//! power cut the recovered disk is logged as one durable write per sector: the backing device
//! may still be behind it (writeback catches up later), never anywhere else.

use super::history::{Effect, Val};

const NEVER: u64 = u64::MAX;

#[derive(Clone, Debug)]
struct Op {
    effect: Effect,
    invoke: u64,
    /// `NEVER` if not (yet) acknowledged, or failed.
    complete: u64,
}

/// A flush point: at `at`, operations acknowledged before `covers_before` are durable, and
/// `fua`'s (first sector, count, invoke) too.
#[derive(Clone, Debug)]
struct Barrier {
    at: u64,
    covers_before: u64,
    fua: Option<(usize, usize, u64)>,
}

/// The operations of a run, per sector, with the flush points between them.
pub struct EpochLog {
    sectors: Vec<Vec<Op>>,
    /// Per sector, every data id ever sent there (the TRIM rule).
    ever: Vec<Vec<u64>>,
    /// In completion order.
    barriers: Vec<Barrier>,
}

impl EpochLog {
    /// `n` sectors holding write 0 (the backing device's original content).
    pub fn new(n: usize) -> EpochLog {
        let floor = Op {
            effect: Effect::Data(0),
            invoke: 0,
            complete: 0,
        };
        EpochLog {
            sectors: vec![vec![floor]; n],
            ever: vec![vec![0]; n],
            barriers: vec![Barrier {
                at: 0,
                covers_before: 1,
                fua: None,
            }],
        }
    }

    /// An operation on `count` sectors from `first`, sent at `invoke` (a `History` time).
    pub fn begin(&mut self, first: usize, count: usize, effect: Effect, invoke: u64) {
        for s in first..first + count {
            self.sectors[s].push(Op {
                effect,
                invoke,
                complete: NEVER,
            });
            if let Effect::Data(id) = effect {
                self.ever[s].push(id);
            }
        }
    }

    /// The operation sent at `invoke` was acknowledged at `complete`.
    pub fn end(&mut self, first: usize, count: usize, invoke: u64, complete: u64) {
        for s in first..first + count {
            let op = self.sectors[s]
                .iter_mut()
                .find(|o| o.invoke == invoke)
                .expect("a logged operation");
            op.complete = complete;
        }
    }

    /// A FLUSH sent at `invoke` completed at `at`.
    pub fn flushed(&mut self, invoke: u64, at: u64) {
        self.barrier(Barrier {
            at,
            covers_before: invoke,
            fua: None,
        });
    }

    /// A FUA operation (sent at `invoke`, on `count` sectors from `first`) completed at `at`.
    pub fn fua(&mut self, first: usize, count: usize, invoke: u64, at: u64) {
        self.barrier(Barrier {
            at,
            covers_before: invoke,
            fua: Some((first, count, invoke)),
        });
    }

    fn barrier(&mut self, b: Barrier) {
        let last = self.barriers.last().expect("the floor").at;
        assert!(b.at >= last, "flush points are logged as they complete");
        self.barriers.push(b);
    }

    /// After a power cut, recovery returned `effects` (`History::recovered_effects`: its
    /// values, `Trim` where only a TRIM allowed them) at time `at`: logged as one write per
    /// sector, durable at once.
    pub fn recovered(&mut self, effects: &[Effect], at: u64) {
        assert_eq!(effects.len(), self.sectors.len());
        // What was in flight at the cut is over: it happened or not before `at`.
        for ops in &mut self.sectors {
            for o in ops.iter_mut().filter(|o| o.complete == NEVER) {
                o.complete = at - 1;
            }
        }
        for (s, &effect) in effects.iter().enumerate() {
            self.sectors[s].push(Op {
                effect,
                invoke: at,
                complete: at,
            });
        }
        self.barrier(Barrier {
            at,
            covers_before: at + 1,
            fua: None,
        });
    }

    /// Checks that `image` (the backing device's region, sector values; `None` for bytes no
    /// write put there) is a crash state for some moment: returns the index of the newest
    /// flush point that fits, or why none does (the candidate with the fewest misfits).
    pub fn check(&self, image: &[Option<Val>]) -> Result<usize, String> {
        self.check_except(image, &[])
    }

    /// As `check`, skipping the sectors `skip` marks (lost with a failed cache device: the
    /// backing device holds older data there, which reads never return).
    pub fn check_except(&self, image: &[Option<Val>], skip: &[bool]) -> Result<usize, String> {
        assert_eq!(image.len(), self.sectors.len());
        let skipped = |s: usize| skip.get(s).copied().unwrap_or(false);
        let image: Vec<Option<Val>> = image
            .iter()
            .enumerate()
            .map(|(s, v)| if skipped(s) { Some(Val::Zeros) } else { *v })
            .collect();
        let image = &image[..];
        if let Some(s) = image.iter().position(Option::is_none) {
            return Err(format!("sector {s} holds bytes no write put there"));
        }
        let mut closest: (usize, String) = (usize::MAX, String::new());
        for k in (0..self.barriers.len()).rev() {
            let until = self.barriers.get(k + 1).map_or(NEVER, |b| b.at);
            let mut bad = self.misfits(k, until, image);
            bad.retain(|&s| !skipped(s));
            if bad.is_empty() {
                return Ok(k);
            }
            if bad.len() < closest.0 {
                let s = bad[0];
                closest = (
                    bad.len(),
                    format!(
                        "{} sector(s) fit no crash state; closest: after flush point {k} of {} \
                         (at {}), sector {s} holds {:?}; its operations: {}",
                        bad.len(),
                        self.barriers.len(),
                        self.barriers[k].at,
                        image[s].expect("checked above"),
                        self.describe(s)
                    ),
                );
            }
        }
        Err(closest.1)
    }

    /// The sectors of `image` that cannot be the disk at a moment before `until` with flush
    /// points `0..=k` done.
    fn misfits(&self, k: usize, until: u64, image: &[Option<Val>]) -> Vec<usize> {
        let done = &self.barriers[..=k];
        let covers_before = done.iter().map(|b| b.covers_before).max().unwrap_or(0);
        let durable = |s: usize, o: &Op| {
            o.complete != NEVER
                && (o.complete < covers_before
                    || done.iter().any(|b| {
                        b.fua.is_some_and(|(first, count, invoke)| {
                            invoke == o.invoke && s >= first && s < first + count
                        })
                    }))
        };
        let mut bad = Vec::new();
        for (s, v) in image.iter().enumerate() {
            let v = v.expect("checked above");
            let ops = &self.sectors[s];
            // An operation is replaced by a durable one sent after it was acknowledged.
            let newest_durable = ops
                .iter()
                .filter(|o| durable(s, o))
                .map(|o| o.invoke)
                .max()
                .unwrap_or(0);
            let ok = ops.iter().any(|o| {
                o.invoke < until
                    && allows(o.effect, v, &self.ever[s])
                    && o.complete >= newest_durable
            });
            if !ok {
                bad.push(s);
            }
        }
        bad
    }

    /// Sector `s`'s operations, for messages.
    fn describe(&self, s: usize) -> String {
        let list: Vec<String> = self.sectors[s]
            .iter()
            .map(|o| {
                let done = if o.complete == NEVER {
                    "-".to_string()
                } else {
                    o.complete.to_string()
                };
                format!("{:?} [{}..{}]", o.effect, o.invoke, done)
            })
            .collect();
        let barriers: Vec<String> = self
            .barriers
            .iter()
            .map(|b| format!("{}<{}", b.at, b.covers_before))
            .collect();
        format!(
            "{}; flush points (at<covering): {}",
            list.join(", "),
            barriers.join(" ")
        )
    }
}

fn allows(effect: Effect, v: Val, ever: &[u64]) -> bool {
    match (effect, v) {
        (Effect::Data(a), Val::Data(b)) => a == b,
        (Effect::Zeros, Val::Zeros) | (Effect::Trim, Val::Zeros) => true,
        (Effect::Trim, Val::Data(id)) => ever.contains(&id),
        _ => false,
    }
}
