//! The transmission phase of one connection: its thread is the reader.
//!
//! The reader pulls many requests per `recv` into a large input buffer and decodes them in
//! place. It never waits on the slow device: READ, and every command that may wait for a
//! device (FLUSH, FUA writes, WRITE_ZEROES, TRIM, BLOCK_STATUS, writes in write-through and
//! write-around modes; on a slow export, every WRITE) goes to the connection's workers, many at
//! once, and each worker sends its reply when its command completes, out of order. Two kinds
//! run inline. Plain write-back writes whose payload fits the input buffer: the engine copies
//! them from the input buffer into its RAM segment in about a microsecond per block. A larger
//! one of whole blocks (up to 2 MiB) is received straight into log blocks the engine reserves
//! for it (`Engine::reserve_write`, which never waits), and a worker publishes it by an index
//! update and replies: no copy after the socket's. (Without room for that, or another larger
//! one, it is received into
//! a buffer of its own, which a worker takes without a copy: its copy into the segment then
//! overlaps the receipt of the next request, and one waiting for room in the log does not stop
//! the reader.) And a READ the cache holds
//! entirely (RAM or the cache device, at most 128 KiB: a larger one would keep the requests
//! behind it undecoded for its device read and send) when no other request waits in the input
//! buffer: handing it to a worker would cost a second thread wake-up per request, and nothing
//! queues behind it (a READ that needs the backing device is refused by the engine untouched
//! and goes to a worker). A larger one, up to 1 MiB, is served here too when it is the
//! connection's only request (nothing buffered, nothing on a worker: a client at iodepth 1).
//! Small READs that arrive together (whole sectors, at most 64 KiB each, two or more one
//! after another in the input buffer) are served here as a burst (`burst`): one
//! engine call reads all those the cache holds, with their device reads submitted together,
//! and their replies go out in one `sendmsg`; those it lacks go to the workers. Write replies,
//! and the reader's other inline replies (errors, CACHE), accumulate
//! in a buffer and go out in one `send` when the reader is about to wait for more input (or
//! the batch is large), so a burst costs one syscall each way; an inline READ's reply goes
//! out at once, after that batch. Before it sleeps in `recv` for a client that has every
//! reply (nothing buffered, nothing on a worker), the reader may poll its socket for up to
//! 50 µs (`spin`, adaptive: only while such polls recently found the next request in time),
//! so a client at iodepth 1 does not wake a sleeping reader on another CPU.
//!
//! Ordering: inline writes run before the next request is even decoded, so every one received
//! before a FLUSH is in the engine by the time the FLUSH is queued, and the engine's flush
//! covers it. That includes every write already replied to, which is what the spec asks;
//! a write still on a worker has not been replied to, so it need not be covered. A worker
//! replies to a write only after the export returned it, so a FLUSH covers every write
//! replied to before it was received, the same guarantee. A READ (or BLOCK_STATUS) is queued,
//! or served inline, after every write decoded before it is in the engine, or replied to, so
//! it sees every write whose reply the client (any client) had before sending the READ. A
//! burst holds only READs decoded one after another and is served before the next request is
//! decoded, so the same holds for each of its READs.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use logcache_nbd::consts::{
    CMD_FLAG_DF, CMD_FLAG_FAST_ZERO, CMD_FLAG_FUA, EINVAL, ENOTSUP, EOVERFLOW, EPERM,
    REQUEST_HEADER_BYTES,
};
use logcache_nbd::request::{Command, Request};

use crate::answer::LargeReplyBuffer;
use crate::burst::{self, Burst};
use crate::connection::Connection;
use crate::input::InputBuffer;
use crate::limits::{
    BUFFER_KEEP_BYTES, INLINE_READ_MAX_BYTES, INPUT_BUFFER_BYTES, LARGE_READ_MIN_BYTES,
    LONE_INLINE_READ_MAX_BYTES, MAX_PAYLOAD_BYTES, OUTPUT_FLUSH_BYTES,
};
use crate::spin::{self, SpinPolicy, Spun, READER_SPIN_BUDGET};
use crate::stats::Counters;
use crate::workers::{Job, WorkerPool};
use crate::{answer, ops, reply};

/// Why the transmission phase ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    /// The client sent DISC.
    Disconnect,
    /// The client closed its side, or the server is shutting down and no requests are left.
    InputClosed,
    /// The client broke the protocol (bad magic, oversized payload); we hang up.
    Violation,
    /// The socket failed.
    Io,
}

/// Serves requests until the connection ends; every request received by then is finished and
/// its reply sent before this returns.
pub(crate) fn serve(connection: &Arc<Connection>) -> End {
    let mut reader = Reader {
        connection: connection.clone(),
        input: InputBuffer::new(INPUT_BUFFER_BYTES),
        replies: Vec::with_capacity(2 * OUTPUT_FLUSH_BYTES),
        large_payload: Vec::new(),
        read_out: Vec::new(),
        read_large_out: LargeReplyBuffer::default(),
        read_header: Vec::new(),
        workers: WorkerPool::new(connection.clone()),
        burst: Burst::new(),
        unpublished_requests: 0,
        spin: SpinPolicy::default(),
    };
    let end = loop {
        match reader.serve_one() {
            Ok(None) => {}
            Ok(Some(end)) => break end,
            Err(_) => break End::Io,
        }
    };
    // Inline replies first, then whatever the workers still have (they send their own).
    let _ = reader.flush_replies();
    reader.workers.finish();
    end
}

struct Reader {
    connection: Arc<Connection>,
    input: InputBuffer,
    /// Batched replies not yet sent.
    replies: Vec<u8>,
    /// Payloads too large for the input buffer.
    large_payload: Vec<u8>,
    /// The reply buffer and header scratch of READs served on the reader (see `read_inline`).
    read_out: Vec<u8>,
    /// The reply buffer of a lone large READ served here (huge pages, `LARGE_READ_MIN_BYTES`
    /// and up, as a worker's; at most `LONE_INLINE_READ_MAX_BYTES`, so it is kept).
    read_large_out: LargeReplyBuffer,
    read_header: Vec<u8>,
    workers: WorkerPool,
    /// Small READs that arrived together, served here (`burst`).
    burst: Burst,
    /// Requests counted since the server-wide counter was last updated.
    unpublished_requests: u64,
    /// Whether to poll the socket before sleeping in `recv` (`spin`).
    spin: SpinPolicy,
}

/// A request refused before touching the engine: the error code and a message for the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Rejection {
    error: u32,
    message: &'static str,
}

impl Reader {
    /// Decodes and handles one request; `Some` when the connection should end.
    fn serve_one(&mut self) -> io::Result<Option<End>> {
        if !self.fill_to(REQUEST_HEADER_BYTES)? {
            return Ok(Some(End::InputClosed));
        }
        let Ok((request, _)) = Request::decode_prefix(self.input.buffered()) else {
            // Bad magic: we have lost (or never had) the request boundaries.
            return Ok(Some(End::Violation));
        };
        self.unpublished_requests += 1;
        if request.command == Command::Disconnect {
            self.input.consume(REQUEST_HEADER_BYTES);
            return Ok(Some(End::Disconnect));
        }
        let payload_bytes = request.payload_length_bytes() as usize;
        if payload_bytes > MAX_PAYLOAD_BYTES as usize {
            // The spec lets us hang up on a client exceeding the advertised maximum; skipping
            // an arbitrary amount of data would just waste our time.
            return Ok(Some(End::Violation));
        }
        let verdict = validate(&request, &self.connection);
        // Bound what the workers hold: the reader waits (its batch sent first, as the client
        // may wait for those replies) before it takes on more.
        let cost_bytes = match request.command {
            Command::Read | Command::Write => request.length_bytes as usize,
            _ => 0,
        };
        if !self.workers.has_room(cost_bytes) {
            self.flush_replies()?;
            self.workers.wait_for_room(cost_bytes);
        }
        let total_bytes = REQUEST_HEADER_BYTES + payload_bytes;
        if payload_bytes == 0 {
            self.input.consume(REQUEST_HEADER_BYTES);
            if verdict.is_ok() && burst::burstable(&self.connection, &request) {
                if let Some(next) = self.next_burst_read() {
                    self.serve_burst(request, next)?;
                    if self.replies.len() >= OUTPUT_FLUSH_BYTES {
                        self.flush_replies()?;
                    }
                    return Ok(None);
                }
            }
            // Not through TLS: the reader would encrypt the whole reply while the client's
            // next requests wait undecrypted in the TLS layer, unseen by the test above
            // (measured: 1 MiB TLS reads at qd8 fell to a quarter of plain ones).
            let inline = request.command == Command::Read
                && verdict.is_ok()
                && self.input.buffered_bytes() < REQUEST_HEADER_BYTES
                && !self.connection.stream.is_tls()
                && self.read_inline(&request)?;
            if !inline {
                self.handle(request, verdict, Payload::Borrowed(&[]));
            }
        } else if total_bytes <= self.input.capacity_bytes() {
            // The payload is read even for a rejected write, to stay in step with the stream.
            if !self.fill_to(total_bytes)? {
                return Ok(Some(End::InputClosed));
            }
            let Reader {
                input,
                replies,
                workers,
                connection,
                ..
            } = self;
            let payload = &input.buffered()[REQUEST_HEADER_BYTES..total_bytes];
            let payload = Payload::Borrowed(payload);
            handle(connection, replies, workers, request, verdict, payload);
            self.input.consume(total_bytes);
        } else {
            self.input.consume(REQUEST_HEADER_BYTES);
            let connection = self.connection.clone();
            let reserved = (verdict.is_ok() && plain_write(&connection, &request))
                .then(|| {
                    let export = &*connection.server.export;
                    export.reserve_write(request.offset_bytes, payload_bytes as u64)
                })
                .flatten();
            if let Some(reservation) = reserved {
                if !self.receive_reserved(&connection, &request, reservation)? {
                    return Ok(Some(End::InputClosed));
                }
                if self.replies.len() >= OUTPUT_FLUSH_BYTES {
                    self.flush_replies()?;
                }
                return Ok(None);
            }
            if !self.read_large_payload(payload_bytes)? {
                return Ok(Some(End::InputClosed));
            }
            let mut payload = std::mem::take(&mut self.large_payload);
            self.handle(
                request,
                verdict,
                Payload::Owned(&mut payload, payload_bytes),
            );
            // Empty if a worker took it; the next large payload then takes a pooled buffer.
            self.large_payload = payload;
            if self.large_payload.capacity() > BUFFER_KEEP_BYTES {
                self.large_payload = Vec::new();
            }
        }
        if self.replies.len() >= OUTPUT_FLUSH_BYTES {
            self.flush_replies()?;
        }
        Ok(None)
    }

    fn handle(&mut self, request: Request, verdict: Result<(), Rejection>, payload: Payload) {
        handle(
            &self.connection,
            &mut self.replies,
            &mut self.workers,
            request,
            verdict,
            payload,
        );
    }

    /// The request waiting next in the input buffer (whole header), if it is a READ that may
    /// join a burst (`burst::burstable`, and valid); nothing is consumed.
    fn next_burst_read(&self) -> Option<Request> {
        let buffered = self.input.buffered();
        if buffered.len() < REQUEST_HEADER_BYTES {
            return None;
        }
        let (request, _) = Request::decode_prefix(buffered).ok()?;
        (burst::burstable(&self.connection, &request)
            && validate(&request, &self.connection).is_ok())
        .then_some(request)
    }

    /// Serves `first` (already consumed), `next` (still buffered) and the READs right behind
    /// them as one burst on the reader (`burst`), while they fit; the READs the cache lacks
    /// go to the workers afterwards, in order, each after room for it (so the burst's
    /// replies, and the reader's batch, are sent before the reader may wait).
    fn serve_burst(&mut self, first: Request, next: Request) -> io::Result<()> {
        self.burst.push(first);
        let mut next = Some(next);
        while let Some(request) = next.filter(|request| self.burst.fits(request)) {
            self.input.consume(REQUEST_HEADER_BYTES);
            self.unpublished_requests += 1;
            self.burst.push(request);
            next = self.next_burst_read();
        }
        debug_assert!(self.burst.len() >= 2);
        let Reader {
            connection,
            burst,
            replies,
            workers,
            ..
        } = self;
        let result = burst.serve(connection, replies);
        replies.clear();
        for &request in result? {
            let cost_bytes = request.length_bytes as usize;
            if !workers.has_room(cost_bytes) {
                workers.wait_for_room(cost_bytes);
            }
            workers.submit(Job::new(request, None));
        }
        Ok(())
    }

    /// Serves a READ here, without handing it to a worker, when the cache holds all of it (so
    /// only RAM and the fast cache device are touched: the reader never waits on the slow
    /// device) and no other request is waiting in the input buffer (so none waits behind it).
    /// A client with one request in flight then costs one thread wake-up per request, not
    /// two. Up to `INLINE_READ_MAX_BYTES`; a larger one (up to `LONE_INLINE_READ_MAX_BYTES`)
    /// only when no job is queued or running on a worker either: a client at iodepth 1, whose
    /// next request comes only after this reply. With other requests in flight a large one
    /// goes to a worker, so the reader keeps decoding while its device read, CRCs and send
    /// run. `false` (nothing done) when the read must go to a worker.
    fn read_inline(&mut self, request: &Request) -> io::Result<bool> {
        let lone_large = request.length_bytes > INLINE_READ_MAX_BYTES;
        if lone_large
            && (request.length_bytes > LONE_INLINE_READ_MAX_BYTES || !self.workers.is_idle())
        {
            return Ok(false);
        }
        let Reader {
            connection,
            read_out,
            read_large_out,
            read_header,
            ..
        } = self;
        let max_bytes = LONE_INLINE_READ_MAX_BYTES;
        let reply = if request.length_bytes >= LARGE_READ_MIN_BYTES {
            answer::read_cached(connection, read_large_out, read_header, request, max_bytes)
        } else {
            answer::read_cached(connection, read_out, read_header, request, max_bytes)
        };
        let Some(reply) = reply else {
            return Ok(false);
        };
        if !self.replies.is_empty() {
            let result = self.connection.sink.send(&self.replies);
            self.replies.clear();
            result?;
        }
        if lone_large {
            Counters::add(&self.connection.server.counters.lone_large_reads_inline, 1);
        }
        self.connection.sink.send(reply)?;
        Ok(true)
    }

    /// Makes at least `needed_bytes` available in the input buffer; `false` at end of input.
    /// Before each read (which may wait for the client) the batched replies are sent.
    fn fill_to(&mut self, needed_bytes: usize) -> io::Result<bool> {
        debug_assert!(needed_bytes <= self.input.capacity_bytes());
        while self.input.buffered_bytes() < needed_bytes {
            self.flush_replies()?;
            // While shutting down, serve what the client already sent but wait for nothing.
            let stopping = self.connection.server.stopping.load(Ordering::Relaxed);
            if !stopping && self.may_spin() && self.spin.should_spin() {
                let counters = &self.connection.server.counters;
                Counters::add(&counters.reader_spins, 1);
                match spin::spin_receive(
                    &mut self.input,
                    &self.connection.stream,
                    READER_SPIN_BUDGET,
                )? {
                    Spun::Closed => return Ok(false),
                    Spun::Received { in_time } => {
                        Counters::add(&counters.reader_spin_hits, 1);
                        self.spin.record(in_time);
                        continue;
                    }
                    Spun::Nothing => self.spin.record(false),
                }
            }
            match self.input.fill(&self.connection.stream, stopping) {
                Ok(0) => return Ok(false),
                Ok(_) => {}
                Err(error) if stopping && error.kind() == io::ErrorKind::WouldBlock => {
                    return Ok(false)
                }
                Err(error) => return Err(error),
            }
        }
        Ok(true)
    }

    /// Whether the reader may poll its socket before this wait (`spin`): nothing is buffered
    /// and nothing is on a worker, so the client has every reply and its next request is what
    /// comes next (a client at iodepth 1); not through TLS (a record may arrive in pieces).
    fn may_spin(&self) -> bool {
        self.input.buffered_bytes() == 0
            && self.workers.is_idle()
            && !self.connection.stream.is_tls()
    }

    /// Receives a large plain write's payload straight into the log blocks reserved for it
    /// (one copy: the kernel's, socket → RAM segment; only the part that arrived with earlier
    /// requests is copied from the input buffer), then hands it to a worker, which publishes
    /// it and replies (`workers::commit`). `false` at end of input: the reservation is
    /// dropped, nothing published, nothing acknowledged.
    fn receive_reserved(
        &mut self,
        connection: &Arc<Connection>,
        request: &Request,
        mut reservation: logcache_engine::WriteReservation,
    ) -> io::Result<bool> {
        debug_assert_eq!(reservation.len_bytes(), request.length_bytes as usize);
        for i in 0..reservation.piece_count() {
            let piece = reservation.piece(i);
            let buffered_bytes = piece.len().min(self.input.buffered_bytes());
            piece[..buffered_bytes].copy_from_slice(&self.input.buffered()[..buffered_bytes]);
            self.input.consume(buffered_bytes);
            if buffered_bytes < piece.len() {
                self.flush_replies()?;
                match connection.stream.recv_exact(&mut piece[buffered_bytes..]) {
                    Ok(()) => {}
                    Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => return Ok(false),
                    Err(error) => return Err(error),
                }
            }
        }
        // Publishing is an index update per block (tens of µs for 1 MiB): on a worker, it
        // overlaps the receipt of the next request, as the copy it replaces did.
        self.workers
            .submit(Job::new(*request, None).with_reservation(reservation));
        Ok(true)
    }

    /// Reads a payload larger than the input buffer into `large_payload[..payload_bytes]`
    /// (one copy, from the socket; the buffer is reused without being cleared, so it is not
    /// zero-filled per request); `false` at end of input.
    fn read_large_payload(&mut self, payload_bytes: usize) -> io::Result<bool> {
        let buffered_bytes = payload_bytes.min(self.input.buffered_bytes());
        if self.large_payload.capacity() == 0 {
            self.large_payload = self.connection.take_payload_buffer();
        }
        if self.large_payload.len() < payload_bytes {
            self.large_payload.resize(payload_bytes, 0);
        }
        self.large_payload[..buffered_bytes]
            .copy_from_slice(&self.input.buffered()[..buffered_bytes]);
        self.input.consume(buffered_bytes);
        if buffered_bytes < payload_bytes {
            self.flush_replies()?;
            match self
                .connection
                .stream
                .recv_exact(&mut self.large_payload[buffered_bytes..payload_bytes])
            {
                Ok(()) => {}
                Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => return Ok(false),
                Err(error) => return Err(error),
            }
        }
        Ok(true)
    }

    /// Sends the batched replies (one syscall) and publishes the request count.
    fn flush_replies(&mut self) -> io::Result<()> {
        if self.unpublished_requests > 0 {
            let counters = &self.connection.server.counters;
            Counters::add(&counters.requests, self.unpublished_requests);
            self.unpublished_requests = 0;
        }
        if self.replies.is_empty() {
            return Ok(());
        }
        let result = self.connection.sink.send(&self.replies);
        self.replies.clear();
        if self.replies.capacity() > BUFFER_KEEP_BYTES {
            self.replies.shrink_to(2 * OUTPUT_FLUSH_BYTES);
        }
        result
    }
}

/// Checks a request against the spec and the export before anything runs.
fn validate(request: &Request, connection: &Connection) -> Result<(), Rejection> {
    let server = &connection.server;
    let reject = |error, message| Err(Rejection { error, message });
    let command = request.command;
    if matches!(command, Command::Resize | Command::Unknown(_)) {
        return reject(EINVAL, "unsupported command");
    }
    // DF is documented for READ, but only usable when advertised, and we do not advertise it.
    let permitted_flags = command.permitted_flags() & !CMD_FLAG_DF;
    if request.flags & !permitted_flags != 0 {
        return reject(EINVAL, "command flags not supported for this command");
    }
    let writes = matches!(
        command,
        Command::Write | Command::Trim | Command::WriteZeroes
    );
    if writes && server.config.read_only {
        return reject(EPERM, "the export is read-only");
    }
    let length_bytes = request.length_bytes;
    match command {
        Command::Read | Command::Write if length_bytes == 0 => {
            return reject(EINVAL, "zero-length read or write");
        }
        Command::Read if length_bytes > MAX_PAYLOAD_BYTES => {
            // The spec reserves EOVERFLOW for structured replies.
            let error = if connection.session.structured {
                EOVERFLOW
            } else {
                EINVAL
            };
            return reject(error, "read longer than the advertised 32 MiB maximum");
        }
        Command::BlockStatus if connection.session.contexts.is_empty() => {
            return reject(
                EINVAL,
                "block status needs a metadata context (SET_META_CONTEXT base:allocation)",
            );
        }
        Command::BlockStatus if length_bytes == 0 => {
            return reject(EINVAL, "zero-length block status");
        }
        _ => {}
    }
    // FLUSH's offset and length are reserved; everything else addresses a range.
    if command != Command::Flush && !request.within_export(server.export_size_bytes) {
        return reject(EINVAL, "range runs past the end of the export");
    }
    Ok(())
}

/// A WRITE's data (empty for other commands): in the input buffer, or a large payload received
/// into a buffer of its own (its first `usize` bytes), which a worker takes without a copy.
enum Payload<'a> {
    Borrowed(&'a [u8]),
    Owned(&'a mut Vec<u8>, usize),
}

impl Payload<'_> {
    /// A payload larger than the input buffer: received into a buffer of its own.
    fn is_large(&self) -> bool {
        matches!(self, Payload::Owned(..))
    }

    fn bytes(&self) -> &[u8] {
        match self {
            Payload::Borrowed(bytes) => bytes,
            Payload::Owned(buffer, length_bytes) => &buffer[..*length_bytes],
        }
    }

    /// The data in a buffer a worker can own: the large payload's own, else a pooled copy.
    fn into_owned(self, connection: &Connection) -> Vec<u8> {
        match self {
            Payload::Borrowed(bytes) => connection.copy_payload(bytes),
            Payload::Owned(buffer, length_bytes) => {
                let mut owned = std::mem::take(buffer);
                owned.truncate(length_bytes);
                owned
            }
        }
    }
}

/// Whether a WRITE is one the reader may put into the engine itself: no FUA, a fast export
/// keeping writes in RAM (the cache mode is read each time: it may change online).
fn plain_write(connection: &Connection, request: &Request) -> bool {
    let export = &*connection.server.export;
    request.command == Command::Write
        && !request.has_flag(CMD_FLAG_FUA)
        && !export.is_slow()
        && export.writes_stay_in_ram()
}

/// Runs one validated request inline or queues it for a worker; inline replies are appended to
/// `replies`.
fn handle(
    connection: &Arc<Connection>,
    replies: &mut Vec<u8>,
    workers: &mut WorkerPool,
    request: Request,
    verdict: Result<(), Rejection>,
    payload: Payload,
) {
    let structured = connection.session.structured;
    let cookie = request.cookie;
    if let Err(rejection) = verdict {
        Counters::add(&connection.server.counters.protocol_errors, 1);
        reply::push_error(
            replies,
            structured,
            cookie,
            rejection.error,
            rejection.message,
        );
        return;
    }
    let server = &connection.server;
    let result = match request.command {
        Command::Write if !payload.is_large() && plain_write(connection, &request) => ops::write(
            &*server.export,
            &server.unaligned_write_lock,
            request.offset_bytes,
            payload.bytes(),
            false,
        ),
        Command::WriteZeroes if request.has_flag(CMD_FLAG_FAST_ZERO) => {
            // The spec's meaning of FAST_ZERO: fail at once unless zeroing is faster than
            // writing zeroes, which for us it is not.
            reply::push_error(
                replies,
                structured,
                cookie,
                ENOTSUP,
                "fast zeroing is not supported",
            );
            return;
        }
        // What may wait for a device goes to a worker: reads, FUA (it waits for durability),
        // writes that go to the backing device first, and on a slow export everything.
        Command::Read | Command::Write | Command::Flush | Command::Trim | Command::WriteZeroes => {
            let payload =
                (request.command == Command::Write).then(|| payload.into_owned(connection));
            workers.submit(Job::new(request, payload));
            return;
        }
        // A prefetch hint: the export reads on demand, so there is nothing to do.
        Command::Cache => Ok(()),
        // The engine answers from its index and the backing device's hole map, which on a
        // remote backing device is a round trip: a worker's job.
        Command::BlockStatus => {
            workers.submit(Job::new(request, None));
            return;
        }
        // `validate` rejects these, and DISC never gets here.
        Command::Disconnect | Command::Resize | Command::Unknown(_) => {
            reply::push_error(replies, structured, cookie, EINVAL, "unsupported command");
            return;
        }
    };
    answer::push_result(replies, structured, cookie, result);
}
