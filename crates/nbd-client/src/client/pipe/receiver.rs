//! A [`Pipe`](super::Pipe)'s receiver thread: reads simple replies in the order the server
//! sends them, finds each one's slot by its cookie, puts a READ's data in the slot and wakes the
//! owner. The first failure breaks the connection (every request in flight fails with it) and
//! ends the thread; so does the pipe being dropped.

use std::io::{self, Read};
use std::time::Instant;

use logcache_nbd::consts::{ESHUTDOWN, SIMPLE_REPLY_HEADER_BYTES, STRUCTURED_REPLY_MAGIC};
use logcache_nbd::reply::SimpleReply;
use logcache_nbd::request::Command;

use super::slots::State;
use super::{Shared, Stream};
use crate::client::exchange::command_name;

type Failure = (io::ErrorKind, String);

/// What the receiver was reading when the stream failed, for the reason.
#[derive(Clone, Copy)]
enum Reading {
    Reply,
    Data(Command),
}

impl Reading {
    fn describe(self) -> String {
        match self {
            Reading::Reply => "a reply".into(),
            Reading::Data(command) => format!("{} data", command_name(command)),
        }
    }
}

pub(super) fn run(shared: &Shared, mut stream: Stream) {
    // However the thread ends (a panic included), the pipe breaks, so no caller waits for a
    // reply nobody will read; a reason given below wins over this one.
    let _guard = BreakOnExit(shared);
    let mut last_progress = Instant::now();
    let (kind, reason) = loop {
        if let Err(failure) = receive_one(shared, &mut stream, &mut last_progress) {
            break failure;
        }
    };
    shared.break_with(kind, reason);
}

/// Reads one reply (and its data) and hands it to its request's owner.
fn receive_one(
    shared: &Shared,
    stream: &mut Stream,
    last_progress: &mut Instant,
) -> Result<(), Failure> {
    let mut header = [0u8; SIMPLE_REPLY_HEADER_BYTES];
    read_full(shared, stream, &mut header, last_progress, Reading::Reply)?;
    let reply = SimpleReply::decode(&header).map_err(|e| {
        let reason = if header[..4] == STRUCTURED_REPLY_MAGIC.to_be_bytes() {
            "the server sent a structured reply, which was not negotiated".to_owned()
        } else {
            format!("a reply is not NBD: {e}")
        };
        (io::ErrorKind::InvalidData, reason)
    })?;
    let mut slots = shared.slots.lock();
    let Some(index) = slots.waiting(reply.cookie) else {
        return Err((
            io::ErrorKind::InvalidData,
            format!(
                "a reply carries cookie {:#x}, which names no request in flight",
                reply.cookie
            ),
        ));
    };
    let command = slots.entries[index].command;
    let data_bytes = slots.entries[index].reply_data_bytes as usize;
    if reply.error != 0 || data_bytes == 0 {
        // A simple error reply has no data, even for a read, so the stream stays in step.
        slots.complete(index, reply.error);
        drop(slots);
        shared.done[index].notify_one();
        if reply.error == ESHUTDOWN {
            // The spec asks the client to disconnect softly when the server shuts down.
            shared.send_disconnect();
            return Err((
                io::ErrorKind::NotConnected,
                format!(
                    "the server is shutting down (ESHUTDOWN on {})",
                    command_name(command)
                ),
            ));
        }
        return Ok(());
    }
    // The data goes into the slot's own buffer, read outside the lock; the slot stays Waiting
    // (its owner keeps waiting) until it is back.
    let generation = slots.entries[index].generation;
    let mut data = std::mem::take(&mut slots.entries[index].data);
    drop(slots);
    if data.len() < data_bytes {
        data.resize(data_bytes, 0);
    }
    read_full(
        shared,
        stream,
        &mut data[..data_bytes],
        last_progress,
        Reading::Data(command),
    )?;
    let mut slots = shared.slots.lock();
    let slot = &mut slots.entries[index];
    if slot.state != State::Waiting || slot.generation != generation {
        // Failed meanwhile (the pipe broke or was dropped); the owner has gone on.
        return Ok(());
    }
    slot.data = data;
    slots.complete(index, 0);
    drop(slots);
    shared.done[index].notify_one();
    Ok(())
}

/// Fills `buf` from the stream. The socket's read timeout is a tick: at each, the connection
/// breaks if requests wait and the server has sent nothing for the request timeout (since the
/// last byte, or since the first of them was claimed, whichever is later).
fn read_full(
    shared: &Shared,
    stream: &mut Stream,
    buf: &mut [u8],
    last_progress: &mut Instant,
    reading: Reading,
) -> Result<(), Failure> {
    let mut got_bytes = 0;
    while got_bytes < buf.len() {
        match stream.read(&mut buf[got_bytes..]) {
            Ok(0) => {
                let in_flight = shared.slots.lock().in_flight;
                let reason = match (reading, in_flight) {
                    (Reading::Reply, 0) if got_bytes == 0 => {
                        "the server closed the connection".to_owned()
                    }
                    (Reading::Reply, _) if got_bytes == 0 => format!(
                        "the server closed the connection with {in_flight} requests unanswered"
                    ),
                    _ => format!(
                        "the server closed the connection in the middle of {}",
                        reading.describe()
                    ),
                };
                return Err((io::ErrorKind::UnexpectedEof, reason));
            }
            Ok(n) => {
                got_bytes += n;
                *last_progress = Instant::now();
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                let slots = shared.slots.lock();
                if let Some((kind, reason)) = &slots.broken {
                    return Err((*kind, reason.clone()));
                }
                if got_bytes == 0 && slots.in_flight == 0 {
                    continue; // idle: nothing is owed
                }
                let since = slots.busy_since.max(*last_progress);
                if since.elapsed() >= shared.request_timeout {
                    return Err((
                        io::ErrorKind::TimedOut,
                        format!(
                            "no answer from the server within {} s (the request timeout) while \
                             reading {}",
                            shared.request_timeout.as_secs_f64(),
                            reading.describe()
                        ),
                    ));
                }
            }
            Err(e) => {
                return Err((
                    e.kind(),
                    format!("receiving {} failed: {e}", reading.describe()),
                ))
            }
        }
    }
    Ok(())
}

struct BreakOnExit<'a>(&'a Shared);

impl Drop for BreakOnExit<'_> {
    fn drop(&mut self) {
        self.0.break_with(
            io::ErrorKind::Other,
            "the NBD reply thread stopped".to_owned(),
        );
    }
}
