//! Who waits for log room: the admission queue's tickets (`path::admission` hands them out in
//! order) and the count of writers blocked until the flusher or writeback makes room.

use super::Waiters;

#[derive(Debug, Default)]
pub struct Room {
    /// The next ticket to hand out, and the ticket whose holder may reserve blocks. Equal
    /// when nobody queues.
    next_ticket: u64,
    serving_ticket: u64,
    /// Writers blocked waiting for room (the flusher and writeback make it for them).
    space_waiters: Waiters,
}

impl Room {
    /// Whether nobody queues for room.
    pub fn queue_empty(&self) -> bool {
        debug_assert!(self.serving_ticket <= self.next_ticket);
        self.next_ticket == self.serving_ticket
    }

    /// The ticket whose holder may reserve blocks now.
    pub fn serving(&self) -> u64 {
        self.serving_ticket
    }

    /// Hands out the next ticket (the back of the queue).
    pub fn take_ticket(&mut self) -> u64 {
        let t = self.next_ticket;
        self.next_ticket += 1;
        t
    }

    /// The holder of ticket `t` is done: the next ticket is served. Returns it, and whether
    /// anyone holds it.
    pub fn pass_turn(&mut self, t: u64) -> (u64, bool) {
        assert_eq!(self.serving_ticket, t, "the turn passed on by someone else");
        self.serving_ticket += 1;
        assert!(
            self.serving_ticket <= self.next_ticket,
            "served a ticket never handed out"
        );
        (self.serving_ticket, self.next_ticket != self.serving_ticket)
    }

    /// Writers blocked waiting for room (`enter` before waiting, `leave` after).
    pub fn space_waiters(&mut self) -> &mut Waiters {
        &mut self.space_waiters
    }

    /// Whether any writer waits for room.
    pub fn writers_wait(&self) -> bool {
        self.space_waiters.any()
    }
}
