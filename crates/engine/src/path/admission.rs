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

use crate::sync::MutexGuard;

use crate::inner::Inner;
use crate::state::State;

/// A writer's place in the queue for room, from its first wait to the end of its request.
#[derive(Debug, Default)]
pub struct Turn {
    ticket: Option<u64>,
}

impl Turn {
    /// Whether this writer may reserve a block now: nobody queues, or it is this writer's turn.
    pub fn may_reserve(&self, st: &State) -> bool {
        match self.ticket {
            Some(t) => {
                // Only the holder advances the queue, so a held ticket is always being served.
                assert_eq!(t, st.room.serving(), "a held ticket is not being served");
                true
            }
            None => st.room.queue_empty(),
        }
    }

    /// Joins the back of the queue and waits until it is this writer's turn.
    pub fn queue<'a>(
        &mut self,
        inner: &'a Inner,
        mut st: MutexGuard<'a, State>,
    ) -> MutexGuard<'a, State> {
        assert!(self.ticket.is_none(), "a writer queues once per request");
        let t = st.room.take_ticket();
        self.ticket = Some(t);
        // Waiting on after a failure is fine: every holder ahead fails at once and passes on.
        while st.room.serving() != t {
            inner.room_turn.slot(t).wait(&mut st);
        }
        st
    }

    /// Takes the turn before waiting for room when nobody queues (`may_reserve` held without a
    /// ticket), so writers arriving meanwhile queue behind this one.
    pub fn hold(&mut self, st: &mut State) {
        if self.ticket.is_none() {
            assert!(st.room.queue_empty());
            self.ticket = Some(st.room.take_ticket());
        }
    }

    /// Passes the turn on at the end of the request (done or failed). Takes the state lock:
    /// call it without holding it.
    pub fn release(self, inner: &Inner) {
        let Some(t) = self.ticket else { return };
        let mut st = inner.state.lock();
        let (next, waiting) = st.room.pass_turn(t);
        drop(st);
        if waiting {
            // Everyone on that variable wakes: tickets 64 apart share it.
            inner.room_turn.slot(next).notify_all();
        }
    }
}
