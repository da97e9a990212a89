//! Writeback: copies dirty blocks from the cache device to the backing device, sorted by
//! backing address with adjacent blocks merged, syncs the backing device, and only then marks
//! the blocks clean and persists the new writeback position. Clean blocks are dropped first
//! when the log needs room (`reclaim.rs`).
//!
//! The writeback thread's loop lives here; `policy` decides how fast, `batch` copies one batch
//! (collect, read and verify, write sorted, sync, mark clean), `drain` persists the writeback
//! position (every chunk before the oldest segment still holding dirty blocks is clean, so
//! recovery replays it as clean) and `record` then notes on the backing label how stale the
//! backing device alone is, `inflight` keeps several backing writes in flight.

pub mod batch;
mod drain;
pub mod foreground;
pub mod inflight;
mod policy;
mod record;

use std::time::Duration;

use self::batch::{batch, WritebackBuffers};
use self::policy::{next_batch_plan, wants_full_speed, Pacer, Plan};
use crate::inner::Inner;
use crate::tunables;

pub use self::drain::{persist_position, step, writeback_position};

/// How often an idle writeback thread looks at the dirty level.
const POLL: Duration = Duration::from_millis(100);

/// The writeback thread's loop.
///
/// It runs at the same CPU priority as request handling: its rate policy, not the scheduler,
/// decides how much it does. (At nice 10, on a CPU-bound machine with 64 busy connection
/// threads, it got 6-8% of a CPU while the log filled; the relocator then moved dirty blocks
/// instead, at a higher cost, and throughput fell from ~11K to ~2K requests/s with requests
/// waiting 4.6 s: see docs/RELIABILITY.md, "Load".)
pub fn run(inner: &Inner) {
    let batch_max = tunables::SPECS[tunables::WRITEBACK_BATCH_BLOCKS].max_value() as usize;
    let mut bufs = WritebackBuffers::new(batch_max);
    let mut pacer = Pacer::new(crate::sync::now());
    let mut st = inner.state.lock();
    loop {
        if stopping(&st) {
            break;
        }
        let now = crate::sync::now();
        let plan = next_batch_plan(inner, &st, &mut pacer, now);
        let rate = match plan {
            Plan::Wait => 0,
            Plan::Batch {
                rate_blocks_per_s, ..
            } => rate_blocks_per_s.unwrap_or(u64::MAX),
        };
        st.writeback.set_rate_blocks_per_s(rate);
        let Plan::Batch {
            blocks,
            rate_blocks_per_s,
        } = plan
        else {
            drain::maybe_persist(inner, &mut st, &mut pacer, now);
            record::write_pending(inner, &mut st);
            if !stopping(&st) {
                inner.writeback_wake.wait_for(&mut st, POLL);
            }
            continue;
        };
        let started = crate::sync::now();
        let (guard, res) = batch(inner, st, &mut bufs, blocks);
        st = guard;
        let done = match res {
            Ok(n) => n,
            Err(e) => {
                st.writeback.set_error(Some(e.to_string()));
                inner.progress.notify_all();
                // The backing device failed; try again later rather than spin.
                if !stopping(&st) {
                    inner
                        .writeback_wake
                        .wait_for(&mut st, Duration::from_secs(1));
                }
                continue;
            }
        };
        drain::maybe_persist(inner, &mut st, &mut pacer, crate::sync::now());
        if done == 0 {
            // Dirty blocks exist but none is durable in the log yet: ask for a sync.
            if st.blocks.dirty_blocks() > 0 {
                let written = st.seqs.written();
                st.seqs.want_sync(written);
                inner.flusher_wake.notify_one();
            }
            if !stopping(&st) {
                inner.writeback_wake.wait_for(&mut st, POLL / 10);
            }
            continue;
        }
        if let Some(rate) = rate_blocks_per_s {
            // The pause that keeps the background rate. It ends early once writeback is
            // needed at full speed: whoever makes that so (a writer waiting for room, the
            // flusher seeing the ring's head run low, a drain) wakes this thread.
            let budget = Duration::from_secs_f64(done as f64 / rate as f64);
            let deadline = started + budget;
            while crate::sync::now() < deadline && !st.health.closing() {
                if wants_full_speed(inner, &st) {
                    st.counters.writeback_pauses_cut += 1;
                    break;
                }
                inner.writeback_wake.wait_until(&mut st, deadline);
            }
        }
    }
    // Record the final position in the close checkpoint (done by close, which reads it).
    drop(st);
}

/// The engine failed or is closing: the loop ends at its top. Checked again before each wait,
/// since a batch or a position write released the lock: a stop that came meanwhile (its
/// notification already spent) would otherwise keep `close` or a crash waiting out the wait
/// (up to the 1 s error retry).
fn stopping(st: &crate::state::State) -> bool {
    st.health.is_failed() || st.health.closing()
}
