//! Runs a list of independent IOs with several in flight (writeback's backing writes). A device given a queue serves it in its own best order (an SSD
//! in parallel, a disk by position); one IO at a time leaves it idle between them.
//!
//! The helpers (`logcache-io`) are long-lived: started on first use and kept by their owner
//! (the writeback thread's `WritebackBuffers`) until it is dropped, asleep on a condition
//! variable between batches. Up to 15 threads created and joined per batch (as scoped threads
//! did) cost CPU on a small machine, where a foreground reader waits for it (issue 20's read
//! tail): writeback of 16-block batches took 0.65× the server CPU per block with kept helpers
//! (docs/BENCHMARKS.md, "Writeback's IO helpers kept").

use std::any::Any;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::sync::{Condvar, Mutex};

use crate::error::{Error, Result};

/// A batch's work as the helpers see it: the caller's `worker` closure with its lifetime
/// erased. Sound because `Helpers::run` does not return (nor unwind) before every helper that
/// took the job has finished it, and it takes the job back first so no helper takes it later.
#[derive(Clone, Copy)]
struct Job(*const (dyn Fn() + Sync + 'static));

// SAFETY: the closure behind the pointer is `Sync`; `run` keeps it alive while helpers use it.
unsafe impl Send for Job {}

#[derive(Default)]
struct Slot {
    /// The current batch's job, while helpers may still take it.
    job: Option<Job>,
    /// Counts jobs handed out, so a helper takes each job at most once.
    generation: u64,
    /// Helpers that may still take the current job (the caller asked for that many).
    wanted: usize,
    /// Helpers running the current job now.
    running: usize,
    /// A helper's panic (payload), raised on the caller at the end of its batch.
    panic: Option<Box<dyn Any + Send>>,
    stop: bool,
}

#[derive(Default)]
struct Shared {
    slot: Mutex<Slot>,
    /// A new job, or stop.
    work: Condvar,
    /// A helper finished its share.
    done: Condvar,
}

/// Up to `depth - 1` long-lived IO helpers of one owner (one `run` at a time: `&mut self`).
#[derive(Default)]
pub struct Helpers {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl Helpers {
    /// Calls `op` on every item, up to `depth` at once (the caller and `depth - 1` helpers),
    /// taking items in order (so a disk sees them roughly in that order). Stops taking new
    /// items after the first error and returns it. With `depth <= 1`, or one item, everything
    /// runs on the calling thread in order, and no helper is started.
    pub(crate) fn run<T: Sync>(
        &mut self,
        items: &[T],
        depth: usize,
        op: impl Fn(&T) -> Result<()> + Sync,
    ) -> Result<()> {
        if depth <= 1 || items.len() <= 1 {
            return items.iter().try_for_each(op);
        }
        let want = depth.min(items.len()) - 1;
        self.start(want);
        let next = AtomicUsize::new(0);
        let failed: Mutex<Option<Error>> = Mutex::new(None);
        let worker = || loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= items.len() || failed.lock().is_some() {
                break;
            }
            if let Err(e) = op(&items[i]) {
                failed.lock().get_or_insert(e);
                break;
            }
        };
        let erased: &(dyn Fn() + Sync) = &worker;
        // SAFETY: see `Job`: the job is taken back and every helper running it has finished
        // before this function returns or unwinds (`Finish`'s drop).
        let job = Job(unsafe {
            std::mem::transmute::<*const (dyn Fn() + Sync + '_), *const (dyn Fn() + Sync + 'static)>(
                erased,
            )
        });
        {
            let mut slot = self.shared.slot.lock();
            assert!(
                slot.job.is_none() && slot.running == 0,
                "one batch at a time"
            );
            slot.job = Some(job);
            slot.generation += 1;
            slot.wanted = want.min(self.threads.len());
            // One wake-up per helper wanted: a batch of a few IOs wakes a few, not all.
            for _ in 0..slot.wanted {
                self.shared.work.notify_one();
            }
        }
        let finish = Finish(&self.shared);
        worker();
        drop(finish);
        if let Some(panic) = self.shared.slot.lock().panic.take() {
            std::panic::resume_unwind(panic);
        }
        match failed.into_inner() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Starts helpers until there are `want` (fewer if the system refuses threads: the others
    /// and the caller then do their share).
    fn start(&mut self, want: usize) {
        while self.threads.len() < want {
            let shared = self.shared.clone();
            let start = crate::sync::Start::begin();
            let spawned = std::thread::Builder::new()
                .name("logcache-io".into())
                .spawn(move || {
                    if start.wait() {
                        helper(&shared);
                    }
                });
            match spawned {
                Ok(t) => self.threads.push(t),
                Err(_) => break,
            }
        }
    }
}

/// Takes the batch's job back and waits for the helpers running it, also while the caller's
/// own share unwinds: the job borrows the caller's stack.
struct Finish<'a>(&'a Shared);

impl Drop for Finish<'_> {
    fn drop(&mut self) {
        let mut slot = self.0.slot.lock();
        slot.job = None;
        slot.wanted = 0;
        while slot.running > 0 {
            self.0.done.wait(&mut slot);
        }
    }
}

impl Drop for Helpers {
    fn drop(&mut self) {
        self.shared.slot.lock().stop = true;
        self.shared.work.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// A helper's life: wait for a job it has not run, run it, say so; until stop. A panic
/// anywhere in it (the job's, or one injected at a seam by the simulation) ends the helper and
/// is raised on the writeback thread at the end of its next batch (the engine then fails, as
/// for a panic of writeback itself): a helper never dies unseen.
fn helper(shared: &Shared) {
    // Whether this helper is counted in `running` (set and cleared under the slot's lock).
    let running = std::cell::Cell::new(false);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        helper_loop(shared, &running)
    }));
    if let Err(panic) = r {
        // In one lock hold: the caller, done waiting for `running`, finds the panic and raises
        // it (as a scoped thread's was raised at the scope's end); unwind safety is the
        // caller's, which sees the batch's state.
        let mut slot = shared.slot.lock();
        if running.get() {
            slot.running -= 1;
        }
        slot.panic.get_or_insert(panic);
        shared.done.notify_all();
    }
}

fn helper_loop(shared: &Shared, running: &std::cell::Cell<bool>) {
    let mut seen = 0u64;
    loop {
        let job = {
            let mut slot = shared.slot.lock();
            loop {
                if slot.stop {
                    return;
                }
                if slot.generation != seen && slot.wanted > 0 {
                    if let Some(job) = slot.job {
                        seen = slot.generation;
                        slot.wanted -= 1;
                        slot.running += 1;
                        running.set(true);
                        break job;
                    }
                }
                shared.work.wait(&mut slot);
            }
        };
        // SAFETY: `running` counts this helper until the decrement below (or `helper`'s, if
        // this panics first), so the caller's `Finish` keeps the job alive until then.
        unsafe { (*job.0)() };
        let mut slot = shared.slot.lock();
        slot.running -= 1;
        running.set(false);
        shared.done.notify_all();
    }
}

/// Calls `op` on every item with up to `depth` in flight, on helpers started for this call
/// only (tests and one-off callers; writeback keeps its `Helpers`).
#[cfg(test)]
pub(crate) fn run<T: Sync>(
    items: &[T],
    depth: usize,
    op: impl Fn(&T) -> Result<()> + Sync,
) -> Result<()> {
    Helpers::default().run(items, depth, op)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn every_item_once_or_the_first_error() {
        for depth in [1, 2, 8] {
            let seen: Vec<AtomicU32> = (0..100).map(|_| AtomicU32::new(0)).collect();
            let items: Vec<usize> = (0..100).collect();
            run(&items, depth, |&i| {
                seen[i].fetch_add(1, Ordering::Relaxed);
                Ok(())
            })
            .unwrap();
            assert!(seen.iter().all(|s| s.load(Ordering::Relaxed) == 1));
            let err = run(&[1, 2, 3], depth, |&i| {
                if i == 2 {
                    Err(Error::InvalidArgument("two".into()))
                } else {
                    Ok(())
                }
            })
            .unwrap_err();
            assert!(matches!(err, Error::InvalidArgument(_)));
        }
    }

    /// The helpers outlive a batch: many batches on one `Helpers` start `depth - 1` threads
    /// once, every batch still runs every item once, and the items of one batch do run on
    /// several threads at once (a batch waits until `depth` items are in flight together).
    #[test]
    fn helpers_are_kept_across_batches_and_run_items_together() {
        let mut helpers = Helpers::default();
        let depth = 4;
        for _ in 0..50 {
            let seen: Vec<AtomicU32> = (0..depth).map(|_| AtomicU32::new(0)).collect();
            let in_flight = AtomicUsize::new(0);
            let items: Vec<usize> = (0..depth).collect();
            helpers
                .run(&items, depth, |&i| {
                    seen[i].fetch_add(1, Ordering::Relaxed);
                    in_flight.fetch_add(1, Ordering::SeqCst);
                    // Every item waits for all of them: only `depth` threads at once finish.
                    while in_flight.load(Ordering::SeqCst) < depth {
                        std::thread::yield_now();
                    }
                    Ok(())
                })
                .unwrap();
            assert!(seen.iter().all(|s| s.load(Ordering::Relaxed) == 1));
            assert_eq!(
                helpers.threads.len(),
                depth - 1,
                "helpers started once, kept"
            );
        }
    }

    /// A helper's panic reaches the caller at the end of its batch (as a scoped thread's did),
    /// and the helpers still serve the next batch.
    #[test]
    fn a_helpers_panic_is_raised_on_the_caller() {
        let mut helpers = Helpers::default();
        let items: Vec<usize> = (0..2).collect();
        let caller = std::thread::current().id();
        let started = AtomicUsize::new(0);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            helpers.run(&items, 2, |_| {
                started.fetch_add(1, Ordering::SeqCst);
                if std::thread::current().id() != caller {
                    panic!("helper panic");
                }
                // The caller holds its item until the helper took the other one.
                while started.load(Ordering::SeqCst) < 2 {
                    std::thread::yield_now();
                }
                Ok(())
            })
        }));
        let msg = r.expect_err("the helper's panic reaches the caller");
        assert_eq!(msg.downcast_ref::<&str>(), Some(&"helper panic"));
        let seen = AtomicU32::new(0);
        helpers
            .run(&items, 2, |_| {
                seen.fetch_add(1, Ordering::Relaxed);
                Ok(())
            })
            .unwrap();
        assert_eq!(seen.load(Ordering::Relaxed), 2);
    }
}
