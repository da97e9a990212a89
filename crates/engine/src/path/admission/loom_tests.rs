//! The admission queue under loom's model checker: every interleaving of three writers, the
//! flusher making room one block at a time, and (in one test) the engine failing, explored
//! exhaustively (feature `loom`: `cargo test -p logcache-engine --features loom --lib loom`).
//!
//! What runs is the engine's own code: `Turn`, `Room` and `TurnWake` with `sync`'s locks and
//! condition variables, which this feature makes loom's. The writer's reservation loop
//! (`path::write::write_block`), the wait for room (`drive::wait_for_room`, threads mode) and
//! the flusher's room-making (`log::flusher::run`) are models of the real ones, step for step:
//! the real ones reach devices, buffers and the whole `State`, which loom cannot run (its
//! threads are coroutines on one OS thread: a device's own std or parking_lot lock contended
//! there deadlocks it, and each of thousands of executions would format and open a cache).
//!
//! Checked on every interleaving:
//! - first come, first served by request: once a writer finds no room, nobody else reserves a
//!   block until its request has all of its blocks (or failed);
//! - a held ticket is always the one served (`Turn::may_reserve`'s assertion);
//! - no lost wakeup, no deadlock: every request ends (loom fails an execution in which every
//!   thread is blocked), the queue is empty at the end and nobody waits for room;
//! - after a failure, every writer (queued, waiting for room or about to) returns its error.

use std::sync::atomic::{AtomicUsize, Ordering};

use loom::sync::Arc;
use loom::thread;

use super::{Turn, TurnWake};
use crate::state::room::Room;
use crate::sync::{Condvar, Mutex};

/// What the engine's state lock guards, as far as admission sees it.
struct Model {
    room: Room,
    /// Blocks the log has room for now (`State::reserve_block` succeeds while this is > 0).
    free_blocks: u32,
    /// Blocks the flusher may still free (exactly what the writers lack, so room runs short
    /// but every request can finish).
    frees_left: u32,
    failed: bool,
    closing: bool,
    /// The writer that found no room and has not finished its request.
    short_of_room: Option<usize>,
    /// Blocks reserved, by writer.
    reserved: Vec<u32>,
}

impl AsMut<Room> for Model {
    fn as_mut(&mut self) -> &mut Room {
        &mut self.room
    }
}

/// The pieces of `Inner` admission uses.
struct Engine {
    state: Mutex<Model>,
    room_turn: TurnWake,
    flusher_wake: Condvar,
    progress: Condvar,
}

#[derive(Debug)]
struct Failed;

/// `path::write::write`: a request of `blocks` blocks holds its turn to its end.
fn write(e: &Engine, id: usize, blocks: u32) -> Result<(), Failed> {
    let mut turn = Turn::default();
    let result = (0..blocks).try_for_each(|_| write_block(e, id, &mut turn));
    {
        let mut st = e.state.lock();
        if st.short_of_room == Some(id) {
            st.short_of_room = None;
        }
    }
    turn.release(&e.state, &e.room_turn);
    result
}

/// `path::write::write_block`'s loop, from `check_usable` to the reservation.
fn write_block(e: &Engine, id: usize, turn: &mut Turn) -> Result<(), Failed> {
    let mut st = e.state.lock();
    loop {
        if st.failed {
            return Err(Failed);
        }
        if !turn.may_reserve(&st.room) {
            st = turn.queue(&e.room_turn, st);
            continue;
        }
        if st.free_blocks == 0 {
            turn.hold(&mut st.room);
            if st.short_of_room.is_none() {
                st.short_of_room = Some(id);
            }
            // `drive::wait_for_room`, threads mode.
            st.room.space_waiters().enter();
            e.flusher_wake.notify_one();
            e.progress.wait(&mut st);
            st.room.space_waiters().leave();
            continue;
        }
        if let Some(w) = st.short_of_room {
            assert_eq!(
                w, id,
                "writer {id} took room while writer {w}, short of it first, still waits"
            );
        }
        if !st.room.queue_empty() {
            assert_eq!(
                turn.ticket(),
                Some(st.room.serving()),
                "reserved out of turn"
            );
        }
        st.free_blocks -= 1;
        st.reserved[id] += 1;
        return Ok(());
    }
}

/// `log::flusher::run` as far as room goes: it works while writers wait for room, frees a
/// block when it can and wakes them only on progress; it stops on failure or close. Its real
/// wait times out (`IDLE_WAKE`); loom's never does, so a wakeup the flusher misses here is a
/// deadlock where the engine would lose 100 ms: stricter than the engine needs.
fn flusher(e: &Engine) {
    let mut st = e.state.lock();
    loop {
        if st.failed || st.closing {
            break;
        }
        if st.room.writers_wait() && st.free_blocks == 0 && st.frees_left > 0 {
            st.free_blocks += 1;
            st.frees_left -= 1;
            e.progress.notify_all();
            continue;
        }
        e.flusher_wake.wait(&mut st);
    }
    drop(st);
    e.progress.notify_all();
}

/// What one check explores.
struct Case {
    /// Blocks per request, one writer thread each.
    requests: &'static [u32],
    /// Room at the start.
    free_blocks: u32,
    /// Turn variables (`TurnWake`).
    wake_slots: usize,
    /// The engine fails once every thread is started.
    fail: bool,
    /// Loom's preemption bound: `None` explores every interleaving; `Some(n)`, those with at
    /// most n preemptions. `LOOM_MAX_PREEMPTIONS` overrides it (the long runs by hand).
    preemptions: Option<usize>,
}

/// Runs `case` under loom; returns the number of executions it explored.
fn check(case: Case) -> usize {
    static EXECUTIONS: AtomicUsize = AtomicUsize::new(0);
    let Case {
        requests,
        free_blocks,
        wake_slots,
        fail,
        preemptions,
    } = case;
    EXECUTIONS.store(0, Ordering::SeqCst);
    let needed: u32 = requests.iter().sum();
    assert!(needed > free_blocks, "room must run short");
    let mut builder = loom::model::Builder::new();
    if std::env::var_os("LOOM_MAX_PREEMPTIONS").is_none() {
        builder.preemption_bound = preemptions;
    }
    let bound = builder.preemption_bound;
    let started = std::time::Instant::now();
    builder.check(move || {
        EXECUTIONS.fetch_add(1, Ordering::Relaxed);
        let e = Arc::new(Engine {
            state: Mutex::new(Model {
                room: Room::default(),
                free_blocks,
                frees_left: needed - free_blocks,
                failed: false,
                closing: false,
                short_of_room: None,
                reserved: vec![0; requests.len()],
            }),
            room_turn: TurnWake::new(wake_slots),
            flusher_wake: Condvar::new(),
            progress: Condvar::new(),
        });
        let f = {
            let e = e.clone();
            thread::spawn(move || flusher(&e))
        };
        let writers: Vec<_> = requests
            .iter()
            .enumerate()
            .map(|(id, &blocks)| {
                let e = e.clone();
                thread::spawn(move || write(&e, id, blocks))
            })
            .collect();
        if fail {
            // `inner::mark_failed` wakes `progress`; the flusher's timed wait would see the
            // failure on its own, loom's needs the notification.
            let mut st = e.state.lock();
            st.failed = true;
            e.progress.notify_all();
            e.flusher_wake.notify_all();
        }
        let results: Vec<_> = writers.into_iter().map(|w| w.join().unwrap()).collect();
        {
            let mut st = e.state.lock();
            st.closing = true;
            e.flusher_wake.notify_all();
        }
        f.join().unwrap();
        let st = e.state.lock();
        assert!(st.room.queue_empty(), "tickets left in the queue");
        assert!(!st.room.writers_wait(), "a writer still counted waiting");
        assert_eq!(st.short_of_room, None);
        for (id, r) in results.iter().enumerate() {
            match r {
                Ok(()) => assert_eq!(st.reserved[id], requests[id], "writer {id}"),
                Err(Failed) => assert!(st.failed, "writer {id} failed with no failure"),
            }
        }
        if !st.failed {
            assert_eq!(st.free_blocks, 0);
            assert_eq!(st.frees_left, 0);
        }
    });
    let n = EXECUTIONS.load(Ordering::SeqCst);
    eprintln!(
        "loom: {n} executions in {:.1} s (preemption bound {bound:?}): requests {requests:?}, \
         {free_blocks} free, {wake_slots} turn variables, fail {fail}",
        started.elapsed().as_secs_f64()
    );
    n
}

/// Two writers, both short of room: every interleaving, no bound.
#[test]
fn loom_admission_two_writers_every_interleaving() {
    assert!(
        check(Case {
            requests: &[1, 1],
            free_blocks: 0,
            wake_slots: 1,
            fail: false,
            preemptions: None,
        }) > 1
    );
}

/// Three writers of two blocks each with room for one: at least two find no room and queue.
/// One turn variable: every pass wakes every queued writer, as tickets 64 apart share one.
#[test]
fn loom_admission_serves_requests_in_order_with_room_short() {
    assert!(
        check(Case {
            requests: &[2, 2, 2],
            free_blocks: 1,
            wake_slots: 1,
            fail: false,
            preemptions: Some(1),
        }) > 1
    );
}

/// As above with a variable per ticket: a pass wakes only the next ticket's holder, so a
/// missed or misdirected wakeup is a deadlock.
#[test]
fn loom_admission_wakes_the_next_ticket_with_a_variable_each() {
    assert!(
        check(Case {
            requests: &[2, 2, 1],
            free_blocks: 1,
            wake_slots: 4,
            fail: false,
            preemptions: Some(1),
        }) > 1
    );
}

/// The engine fails while writers queue, wait for room or are about to: every one returns
/// the error (none waits forever for a turn a failed writer ahead would never pass). Two
/// writers with up to two preemptions, three with one (unbounded, two writers and a failure
/// did not finish in 10 minutes here).
#[test]
fn loom_admission_a_failure_ends_every_queued_writer() {
    let two = check(Case {
        requests: &[1, 1],
        free_blocks: 1,
        wake_slots: 1,
        fail: true,
        preemptions: Some(2),
    });
    let three = check(Case {
        requests: &[2, 2, 1],
        free_blocks: 1,
        wake_slots: 1,
        fail: true,
        preemptions: Some(1),
    });
    assert!(two > 1 && three > 1);
}
