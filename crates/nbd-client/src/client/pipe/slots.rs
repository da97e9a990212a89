//! The requests in flight on one [`Pipe`](super::Pipe): a fixed table of slots, claimed by a
//! caller before it sends, completed by the receiver when the reply comes (or failed, all at
//! once, when the connection breaks), released by the caller once it has the result.
//!
//! A cookie names its slot and the slot's generation, so a reply finds its request without a
//! search and a stale or made-up cookie is caught. The table is allocated when the connection
//! opens; a slot's read buffer grows to the largest read it carried and is reused after.

use std::io;
use std::time::Instant;

use logcache_nbd::request::Command;

/// Where a slot's request stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    /// Nobody's: on the free list.
    Free,
    /// Claimed; sent or about to be; no reply yet.
    Waiting,
    /// The server answered: 0, or the wire error (read data, if any, is in `data`).
    Replied { wire_error: u32 },
    /// The connection broke before the reply came (the table's `broken` says why).
    Failed,
}

pub(super) struct Slot {
    pub(super) state: State,
    /// Bumped at every claim; the high half of the cookie.
    pub(super) generation: u32,
    pub(super) command: Command,
    /// Bytes of data that follow a successful reply (a READ's length, else 0).
    pub(super) reply_data_bytes: u32,
    /// Where the receiver puts a READ's data; taken out by the receiver while it reads.
    pub(super) data: Vec<u8>,
}

/// A claimed slot: its index and the cookie its request carries.
#[derive(Debug, Clone, Copy)]
pub(super) struct Ticket {
    pub(super) index: usize,
    pub(super) cookie: u64,
}

pub(super) struct Slots {
    pub(super) entries: Vec<Slot>,
    free: Vec<usize>,
    /// Requests sent (or being sent) and not yet answered or failed.
    pub(super) in_flight: usize,
    /// When `in_flight` last went from 0 to 1: with the last byte received, the start of the
    /// current wait for the server.
    pub(super) busy_since: Instant,
    /// Why the connection is unusable (its error kind and reason); set once, never cleared.
    pub(super) broken: Option<(io::ErrorKind, String)>,
}

impl Slots {
    pub(super) fn new(capacity: usize) -> Slots {
        assert!(capacity > 0 && capacity <= u32::MAX as usize);
        Slots {
            entries: (0..capacity)
                .map(|_| Slot {
                    state: State::Free,
                    generation: 0,
                    command: Command::Flush,
                    reply_data_bytes: 0,
                    data: Vec::new(),
                })
                .collect(),
            // Popped from the end: slot 0 first.
            free: (0..capacity).rev().collect(),
            in_flight: 0,
            busy_since: Instant::now(),
            broken: None,
        }
    }

    /// A free slot for a request, if one is free (the caller waits for room otherwise).
    pub(super) fn claim(&mut self, command: Command, reply_data_bytes: u32) -> Option<Ticket> {
        debug_assert!(self.broken.is_none(), "claims are refused once broken");
        let index = self.free.pop()?;
        let slot = &mut self.entries[index];
        assert_eq!(
            slot.state,
            State::Free,
            "slot {index} on the free list is in use"
        );
        slot.state = State::Waiting;
        slot.generation = slot.generation.wrapping_add(1);
        slot.command = command;
        slot.reply_data_bytes = reply_data_bytes;
        if self.in_flight == 0 {
            self.busy_since = Instant::now();
        }
        self.in_flight += 1;
        Some(Ticket {
            index,
            cookie: (u64::from(slot.generation) << 32) | index as u64,
        })
    }

    /// The waiting slot a reply's cookie names, or `None` if it names none (a protocol
    /// violation: a reply to nothing, or a second reply to one request).
    pub(super) fn waiting(&self, cookie: u64) -> Option<usize> {
        let index = usize::try_from(cookie & u64::from(u32::MAX)).ok()?;
        let slot = self.entries.get(index)?;
        (slot.state == State::Waiting && u64::from(slot.generation) == cookie >> 32)
            .then_some(index)
    }

    /// Records the reply of the waiting slot `index`.
    pub(super) fn complete(&mut self, index: usize, wire_error: u32) {
        let slot = &mut self.entries[index];
        assert_eq!(
            slot.state,
            State::Waiting,
            "a reply completes a waiting slot"
        );
        slot.state = State::Replied { wire_error };
        assert!(self.in_flight > 0);
        self.in_flight -= 1;
    }

    /// Marks the connection broken (the first reason wins) and fails every waiting request.
    /// Returns whether any request was failed (the caller wakes its waiters).
    pub(super) fn fail_all(&mut self, kind: io::ErrorKind, reason: String) -> bool {
        if self.broken.is_none() {
            self.broken = Some((kind, reason));
        }
        let mut failed = false;
        for slot in &mut self.entries {
            if slot.state == State::Waiting {
                slot.state = State::Failed;
                failed = true;
            }
        }
        self.in_flight = 0;
        failed
    }

    /// Gives slot `index` back once its owner has taken the result.
    pub(super) fn release(&mut self, index: usize) {
        let slot = &mut self.entries[index];
        assert!(
            matches!(slot.state, State::Replied { .. } | State::Failed),
            "slot {index} released before its request ended ({:?})",
            slot.state
        );
        slot.state = State::Free;
        debug_assert!(!self.free.contains(&index));
        self.free.push(index);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_name_their_slot_and_generation_only() {
        let mut slots = Slots::new(2);
        let a = slots.claim(Command::Read, 512).unwrap();
        let b = slots.claim(Command::Write, 0).unwrap();
        assert!(
            slots.claim(Command::Flush, 0).is_none(),
            "two slots, two claims"
        );
        assert_eq!(slots.in_flight, 2);
        assert_eq!(slots.waiting(a.cookie), Some(a.index));
        assert_eq!(
            slots.waiting(b.cookie + (1 << 32)),
            None,
            "wrong generation"
        );
        assert_eq!(slots.waiting(7), None, "no such slot");
        slots.complete(a.index, 0);
        assert_eq!(
            slots.waiting(a.cookie),
            None,
            "a second reply to one request"
        );
        slots.release(a.index);
        let again = slots.claim(Command::Read, 512).unwrap();
        assert_eq!(again.index, a.index);
        assert_ne!(again.cookie, a.cookie, "a reused slot carries a new cookie");
        assert_eq!(slots.waiting(a.cookie), None, "the old cookie is stale");
    }

    #[test]
    fn breaking_fails_every_waiting_request_and_keeps_the_first_reason() {
        let mut slots = Slots::new(4);
        let a = slots.claim(Command::Read, 512).unwrap();
        let b = slots.claim(Command::Write, 0).unwrap();
        slots.complete(b.index, 0);
        assert!(slots.fail_all(io::ErrorKind::UnexpectedEof, "first".into()));
        assert!(!slots.fail_all(io::ErrorKind::Other, "second".into()));
        assert_eq!(slots.entries[a.index].state, State::Failed);
        assert_eq!(
            slots.entries[b.index].state,
            State::Replied { wire_error: 0 }
        );
        assert_eq!(slots.in_flight, 0);
        assert_eq!(slots.broken.as_ref().unwrap().1, "first");
        slots.release(a.index);
        slots.release(b.index);
    }
}
