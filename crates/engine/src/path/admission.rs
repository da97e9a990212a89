//! Fair admission of writers to log room.
//!
//! When the log is full, writers wait for writeback and reclaim to free a segment. Without a
//! queue, every freed segment goes to whichever waiter wins the state lock first, and a large
//! request (a 1 MiB write reserves 256 blocks one at a time) can lose that race over and over:
//! under sustained load some requests waited several times the average. Here the first writer
//! that finds no room takes a ticket, and from then on writers reserve blocks in ticket order;
//! a ticket is held until its request has reserved all its blocks, so room is handed out
//! first-come first-served by request. Writers that find no queue and room to spare never
//! touch a ticket (the hot path stays one comparison).

use crate::state::room::Room;
use crate::sync::{Condvar, Mutex, MutexGuard};

/// Condition variables for queued writers, by ticket modulo this: passing the turn wakes the
/// next ticket's holder (and whoever shares its variable), not every queued writer. With one
/// variable, each pass woke all 63 other connections' writers under a 64-connection load and
/// the futex traffic took more CPU than the copying.
pub const TURN_WAKE_SLOTS: usize = 64;

/// Where queued writers sleep (`Inner::room_turn`).
pub struct TurnWake {
    slots: Vec<Condvar>,
}

impl TurnWake {
    /// `slot_count` variables (the engine's: `TURN_WAKE_SLOTS`; the loom tests take fewer, so
    /// that tickets share one as tickets 64 apart do).
    pub fn new(slot_count: usize) -> TurnWake {
        assert!(slot_count > 0);
        TurnWake {
            slots: (0..slot_count).map(|_| Condvar::new()).collect(),
        }
    }

    pub fn slot(&self, ticket: u64) -> &Condvar {
        &self.slots[(ticket % self.slots.len() as u64) as usize]
    }
}

/// A writer's place in the queue for room, from its first wait to the end of its request.
/// The queue lives in the state behind the engine's state lock (`S`: the engine's `State`, or
/// a loom test's model of it).
#[derive(Debug, Default)]
pub struct Turn {
    ticket: Option<u64>,
}

impl Turn {
    /// Whether this writer may reserve a block now: nobody queues, or it is this writer's turn.
    pub fn may_reserve(&self, room: &Room) -> bool {
        match self.ticket {
            Some(t) => {
                // Only the holder advances the queue, so a held ticket is always being served.
                assert_eq!(t, room.serving(), "a held ticket is not being served");
                true
            }
            None => room.queue_empty(),
        }
    }

    /// Joins the back of the queue and waits until it is this writer's turn.
    pub fn queue<'a, S: AsMut<Room>>(
        &mut self,
        wake: &TurnWake,
        mut st: MutexGuard<'a, S>,
    ) -> MutexGuard<'a, S> {
        assert!(self.ticket.is_none(), "a writer queues once per request");
        let t = st.as_mut().take_ticket();
        self.ticket = Some(t);
        // Waiting on after a failure is fine: every holder ahead fails at once and passes on.
        while st.as_mut().serving() != t {
            wake.slot(t).wait(&mut st);
        }
        st
    }

    /// Takes the turn before waiting for room when nobody queues (`may_reserve` held without a
    /// ticket), so writers arriving meanwhile queue behind this one.
    pub fn hold(&mut self, room: &mut Room) {
        if self.ticket.is_none() {
            assert!(room.queue_empty());
            self.ticket = Some(room.take_ticket());
        }
    }

    /// Passes the turn on at the end of the request (done or failed). Takes the state lock:
    /// call it without holding it.
    pub fn release<S: AsMut<Room>>(self, state: &Mutex<S>, wake: &TurnWake) {
        let Some(t) = self.ticket else { return };
        let mut st = state.lock();
        let (next, waiting) = st.as_mut().pass_turn(t);
        drop(st);
        if waiting {
            // Everyone on that variable wakes: tickets `TURN_WAKE_SLOTS` apart share it.
            wake.slot(next).notify_all();
        }
    }

    /// The ticket held, if any (for the loom tests' checks).
    #[cfg(all(test, feature = "loom"))]
    pub fn ticket(&self) -> Option<u64> {
        self.ticket
    }
}

#[cfg(all(test, feature = "loom"))]
mod loom_tests;
