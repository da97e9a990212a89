//! [`Pipe`]: one NBD connection shared by many threads, each with its own request in flight at
//! once (up to [`MAX_IN_FLIGHT_PER_CONNECTION`]), so one socket carries a deep queue to the
//! server (a disk that reorders its queue sees it).
//!
//! A caller claims a slot (its cookie), sends its request whole under the send lock and waits;
//! the receiver thread (`receiver`) reads replies in whatever order the server sends them (NBD
//! allows any order, matching by cookie), puts a READ's data in the slot's buffer and wakes the
//! owner, who copies it out. Only simple replies are negotiated: a reply is a header, then for a
//! successful READ exactly the requested bytes.
//!
//! Failure policy, as for [`Client`]: anything that breaks the stream (end of stream, a socket
//! error, a reply that does not parse or answers nothing in flight, no progress for the
//! request timeout while requests wait) breaks the connection for good: every request in
//! flight fails with the reason, later calls fail at once, and nothing reconnects here (the
//! server may have lost writes it acknowledged; the owner of the pipe decides).

mod receiver;
mod slots;

use std::io;
use std::net::Shutdown;
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use logcache_nbd::request::{Command, Request};
use parking_lot::{Condvar, Mutex};

use self::slots::{Slots, State, Ticket};
use super::exchange::{broken_error, command_name, local_errno};
use super::ops::{self, Requests};
use super::stream::{write_all_vectored, Stream};
use super::{unusable_error, Client, ExportInfo};

/// Requests one connection carries at once; more callers wait for a slot. Above the queue
/// servers serve per connection (qemu-nbd 16, nbdkit's default 16 threads, logcache's slow
/// exports 64), so the server, not this, is the limit.
pub const MAX_IN_FLIGHT_PER_CONNECTION: usize = 64;

/// The receiver wakes at least this often while it waits, to check for a server that stopped
/// answering; a quarter of the request timeout, within these bounds.
const MIN_RECEIVE_TICK: Duration = Duration::from_millis(10);
const MAX_RECEIVE_TICK: Duration = Duration::from_secs(1);

/// What the callers and the receiver of one connection share.
struct Shared {
    uri: String,
    slots: Mutex<Slots>,
    /// One per slot: its owner waits here for the reply.
    done: Box<[Condvar]>,
    /// Callers waiting for a free slot.
    room: Condvar,
    /// The socket's write side: whoever holds it sends one whole request.
    sender: Mutex<Stream>,
    /// A handle to shut the socket down with, without waiting for a sender.
    control: Stream,
    request_timeout: Duration,
}

impl Shared {
    /// Breaks the connection (the first reason wins): every request in flight fails, every
    /// waiter wakes, and the socket is shut down so the receiver and a blocked sender return.
    fn break_with(&self, kind: io::ErrorKind, reason: String) {
        let failed = self.slots.lock().fail_all(kind, reason);
        if failed {
            for done in self.done.iter() {
                done.notify_all();
            }
        }
        self.room.notify_all();
        let _ = self.control.shutdown(Shutdown::Both);
    }

    /// Best effort `NBD_CMD_DISC` (no reply comes).
    fn send_disconnect(&self) {
        let request = Request {
            flags: 0,
            command: Command::Disconnect,
            cookie: 0,
            offset_bytes: 0,
            length_bytes: 0,
        };
        let _ = write_all_vectored(&mut *self.sender.lock(), &[&request.encode()]);
    }

    fn unusable(&self) -> Option<io::Error> {
        let slots = self.slots.lock();
        let (_, reason) = slots.broken.as_ref()?;
        Some(unusable_error(&self.uri, reason))
    }
}

/// One NBD connection in the transmission phase, many requests in flight on it.
pub struct Pipe {
    info: ExportInfo,
    shared: Arc<Shared>,
    receiver: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Pipe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipe")
            .field("uri", &self.shared.uri)
            .field("info", &self.info)
            .field("broken", &self.broken_reason())
            .finish_non_exhaustive()
    }
}

impl Pipe {
    /// Takes over a freshly connected client's socket (a plain TCP or Unix socket: a TLS
    /// session cannot be split between threads, `Unsupported`) and starts its receiver.
    /// `request_timeout`: how long the server may go without sending anything while requests
    /// wait before the connection counts as broken.
    pub fn new(client: Client, request_timeout: Duration) -> io::Result<Pipe> {
        Self::with_depth(client, request_timeout, MAX_IN_FLIGHT_PER_CONNECTION)
    }

    /// [`Pipe::new`] with at most `depth` requests in flight.
    pub fn with_depth(client: Client, request_timeout: Duration, depth: usize) -> io::Result<Pipe> {
        assert!(depth > 0, "a pipe carries at least one request");
        assert!(
            !request_timeout.is_zero(),
            "checked when the client connected"
        );
        let uri = client.uri().to_owned();
        let info = *client.info();
        let [receive, send, control] = client.split()?;
        let tick = (request_timeout / 4).clamp(MIN_RECEIVE_TICK, MAX_RECEIVE_TICK);
        receive
            .set_read_timeout(Some(tick))
            .map_err(|e| super::prefix_error(&uri, e))?;
        let shared = Arc::new(Shared {
            uri,
            slots: Mutex::new(Slots::new(depth)),
            done: (0..depth).map(|_| Condvar::new()).collect(),
            room: Condvar::new(),
            sender: Mutex::new(send),
            control,
            request_timeout,
        });
        let for_receiver = Arc::clone(&shared);
        let receiver = thread::Builder::new()
            .name("nbd-replies".into())
            .spawn(move || receiver::run(&for_receiver, receive))
            .map_err(|e| {
                let _ = shared.control.shutdown(Shutdown::Both);
                io::Error::new(
                    e.kind(),
                    format!("{}: starting the NBD reply thread: {e}", shared.uri),
                )
            })?;
        Ok(Pipe {
            info,
            shared,
            receiver: Some(receiver),
        })
    }

    pub fn info(&self) -> &ExportInfo {
        &self.info
    }

    pub fn uri(&self) -> &str {
        &self.shared.uri
    }

    /// Whether a failure made the connection unusable (the server closed it, restarted, or
    /// stopped answering, even with nothing in flight: the receiver notices at once).
    pub fn is_broken(&self) -> bool {
        self.shared.slots.lock().broken.is_some()
    }

    /// Why the connection is unusable (without the URI), if it is.
    pub fn broken_reason(&self) -> Option<String> {
        self.shared
            .slots
            .lock()
            .broken
            .as_ref()
            .map(|(_, r)| r.clone())
    }

    /// Requests sent and not yet answered.
    pub fn in_flight(&self) -> usize {
        self.shared.slots.lock().in_flight
    }

    /// See [`Client::read_at`].
    pub fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> io::Result<()> {
        ops::read_at(&mut &*self, buf, offset_bytes)
    }

    /// See [`Client::write_at`].
    pub fn write_at(&self, buf: &[u8], offset_bytes: u64, fua: bool) -> io::Result<()> {
        ops::write_at(&mut &*self, buf, offset_bytes, fua)
    }

    /// See [`Client::flush`]: it covers the writes whose replies came before it was sent.
    pub fn flush(&self) -> io::Result<()> {
        ops::flush(&mut &*self)
    }

    /// See [`Client::trim`].
    pub fn trim(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        ops::trim(&mut &*self, offset_bytes, len_bytes)
    }

    /// See [`Client::write_zeroes`].
    pub fn write_zeroes(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        ops::write_zeroes(&mut &*self, offset_bytes, len_bytes)
    }

    /// A free slot for a request, waiting while all are in flight; fails once broken.
    fn claim(&self, command: Command, reply_data_bytes: u32) -> io::Result<Ticket> {
        let mut slots = self.shared.slots.lock();
        loop {
            if let Some((_, reason)) = &slots.broken {
                return Err(unusable_error(&self.shared.uri, reason));
            }
            if let Some(ticket) = slots.claim(command, reply_data_bytes) {
                return Ok(ticket);
            }
            self.shared.room.wait(&mut slots);
        }
    }

    /// Waits for the reply to `ticket`'s request, copies a READ's data into `read_into`, and
    /// gives the slot back.
    fn finish(&self, ticket: Ticket, read_into: &mut [u8]) -> io::Result<()> {
        let index = ticket.index;
        let mut slots = self.shared.slots.lock();
        while slots.entries[index].state == State::Waiting {
            self.shared.done[index].wait(&mut slots);
        }
        let result = match slots.entries[index].state {
            State::Replied { wire_error: 0 } => Ok(()),
            State::Replied { wire_error } => {
                Err(io::Error::from_raw_os_error(local_errno(wire_error)))
            }
            State::Failed => {
                let (kind, reason) = slots.broken.as_ref().expect("failed only when broken");
                Err(broken_error(&self.shared.uri, *kind, reason))
            }
            state => unreachable!("slot {index} was {state:?} while its owner waited"),
        };
        if result.is_ok() && !read_into.is_empty() {
            // Copied outside the lock; the slot stays ours (Replied) meanwhile.
            let data = std::mem::take(&mut slots.entries[index].data);
            drop(slots);
            read_into.copy_from_slice(&data[..read_into.len()]);
            slots = self.shared.slots.lock();
            slots.entries[index].data = data;
        }
        slots.release(index);
        drop(slots);
        self.shared.room.notify_one();
        result
    }
}

impl Requests for &Pipe {
    fn info(&self) -> &ExportInfo {
        &self.info
    }

    fn uri(&self) -> &str {
        &self.shared.uri
    }

    fn check_usable(&self) -> io::Result<()> {
        match self.shared.unusable() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn request(
        &mut self,
        command: Command,
        flags: u16,
        offset_bytes: u64,
        length_bytes: u32,
        payload: &[u8],
        read_into: &mut [u8],
    ) -> io::Result<()> {
        let reply_data_bytes = if command == Command::Read {
            length_bytes
        } else {
            0
        };
        assert_eq!(read_into.len(), reply_data_bytes as usize);
        let payload_bytes = if command == Command::Write {
            length_bytes as usize
        } else {
            0
        };
        assert_eq!(payload.len(), payload_bytes);
        let ticket = self.claim(command, reply_data_bytes)?;
        let request = Request {
            flags,
            command,
            cookie: ticket.cookie,
            offset_bytes,
            length_bytes,
        };
        let sent = write_all_vectored(
            &mut *self.shared.sender.lock(),
            &[&request.encode(), payload],
        );
        if let Err(e) = sent {
            // Our slot fails with everyone else's; `finish` reports it.
            let name = command_name(command);
            self.shared
                .break_with(e.kind(), format!("sending {name} failed: {e}"));
        }
        self.finish(ticket, read_into)
    }
}

impl Drop for Pipe {
    fn drop(&mut self) {
        // Nothing is in flight (every caller holds the pipe until its reply). Best effort: a
        // clean NBD_CMD_DISC lets the server finish up without logging an error.
        if !self.is_broken() {
            self.shared.send_disconnect();
        }
        self.shared.break_with(
            io::ErrorKind::NotConnected,
            "the NBD connection was closed".into(),
        );
        if let Some(receiver) = self.receiver.take() {
            let _ = receiver.join();
        }
    }
}
