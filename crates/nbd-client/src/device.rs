//! A backing device served over NBD, so the cache's slow device can be any NBD export (qemu-nbd,
//! nbdkit, another logcache).
//!
//! [`NbdDevice`] keeps a small pool of connections. Over a plain socket each is a [`Pipe`]:
//! every calling thread's request goes out at once and many are in flight per connection, so
//! the server (and a disk behind it that reorders its queue) sees the callers' whole queue. Over
//! TLS (one session cannot be read and written from two threads) each is a blocking [`Client`]
//! behind its own mutex, one request in flight per connection. A broken connection is replaced
//! by a new one on its next use: see [`NbdDevice`].

use std::fmt;
use std::io;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use logcache_io::{Allocation, BlockDevice, SECTOR_SIZE_BYTES};
use logcache_nbd::consts::{STATE_HOLE, STATE_ZERO};
use logcache_nbd::uri::NbdUri;
use parking_lot::{Mutex, MutexGuard};

use crate::client::{Client, ExportInfo, Pipe, DEFAULT_REQUEST_TIMEOUT};

/// Connections opened when the caller has no better number and the server allows several.
pub const DEFAULT_CONNECTIONS: usize = 4;

/// How long the server may take to greet a connection beyond the first at open. A server that
/// advertises multi-conn but takes fewer clients (qemu-nbd `-e N`) leaves an extra connection
/// waiting for its greeting forever; the device then keeps the connections it has.
pub const EXTRA_CONNECTION_GREETING_TIMEOUT: Duration = Duration::from_secs(3);

/// After a block-status connection was not greeted in time, how long `allocation` answers
/// "data" without asking.
const STATUS_RETRY_AFTER: Duration = Duration::from_secs(60);

/// The block-status connection, and whether the server lacked room for it lately.
#[derive(Default)]
struct StatusLink {
    client: Option<Client>,
    no_room_until: Option<Instant>,
}

/// One connection of the pool.
enum Link {
    /// A plain socket: shared by every caller, many requests in flight.
    Pipe(Arc<Pipe>),
    /// TLS: one request at a time, its caller holding the pool slot's mutex.
    Serial(Client),
}

impl Link {
    fn broken_reason(&self) -> Option<String> {
        match self {
            Link::Pipe(pipe) => pipe.broken_reason(),
            Link::Serial(client) => client.broken_reason().map(str::to_owned),
        }
    }

    fn info(&self) -> &ExportInfo {
        match self {
            Link::Pipe(pipe) => pipe.info(),
            Link::Serial(client) => client.info(),
        }
    }
}

/// A data call, run on whichever connection the pool picks.
enum Op<'a> {
    Read(&'a mut [u8], u64),
    Write(&'a [u8], u64),
    Flush,
    Trim(u64, u64),
    WriteZeroes(u64, u64),
}

/// An NBD export as a [`BlockDevice`].
///
/// Failure policy: every call in flight on a connection that breaks (the server died or
/// restarted, the network dropped, the server sent nothing for the request timeout (a minute
/// unless [`NbdDevice::open_with_timeout`] says otherwise) while requests waited, the server
/// broke the protocol) fails. A pipe notices a closed connection even with nothing in flight.
/// The next call on a broken connection first connects again; while that fails, calls fail at
/// once with the reason, so the cache keeps absorbing writes and retries writeback later. The
/// new connection must show the same export (size and flags), or the device refuses it.
///
/// The server may have acknowledged writes on the broken connection that it had not flushed,
/// and lost them: a flush on the new connection does not cover them. [`BlockDevice::reconnects`]
/// counts reconnections so that writeback, which writes a batch and then flushes, notices one
/// in between and writes the batch again.
pub struct NbdDevice {
    uri: String,
    parsed: NbdUri,
    info: ExportInfo,
    /// Every connection is a pipe (plain sockets) or every one is serial (TLS).
    pipelined: bool,
    connections: Vec<Mutex<Link>>,
    /// Where the next call starts looking for a free connection (round robin).
    next_connection: AtomicUsize,
    /// Successful reconnections so far.
    reconnects: AtomicU64,
    /// How long the server may take to answer before a connection counts as broken.
    request_timeout: Duration,
    /// A connection for block status only (it negotiates structured replies, which the data
    /// connections do not), opened on first use and again after it breaks.
    status: Mutex<StatusLink>,
}

impl NbdDevice {
    /// Connects to the export at `uri` (`nbd://HOST[:PORT][/EXPORT]` or
    /// `nbd+unix:///[EXPORT]?socket=PATH`).
    ///
    /// Opens `connections` connections if the server advertises `CAN_MULTI_CONN`, otherwise
    /// exactly one: without multi-conn a flush on one connection need not cover writes completed
    /// on another, so spreading writes over several connections would make `flush` meaningless.
    /// The connections beyond the first must be greeted within
    /// [`EXTRA_CONNECTION_GREETING_TIMEOUT`]; the device keeps those that were.
    pub fn open(uri: &str, connections: usize) -> io::Result<NbdDevice> {
        Self::open_with_timeout(uri, connections, DEFAULT_REQUEST_TIMEOUT)
    }

    /// [`NbdDevice::open`] with the time the server may take to answer a request (or a
    /// handshake, on a reconnection) before its connection counts as broken and the call fails.
    pub fn open_with_timeout(
        uri: &str,
        connections: usize,
        request_timeout: Duration,
    ) -> io::Result<NbdDevice> {
        let parsed = NbdUri::parse(uri)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        if connections == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{uri}: at least one NBD connection is needed"),
            ));
        }
        let pipelined = parsed.tls.is_none();
        let first = Client::connect_with_timeout(&parsed, request_timeout)?;
        let info = *first.info();
        let sector_bytes = SECTOR_SIZE_BYTES as u32;
        // The engine issues 512-byte-aligned IO of any multiple of 512 bytes; a server that
        // needs larger units would see requests it may reject.
        if info.minimum_block_bytes > sector_bytes || info.max_request_bytes < sector_bytes {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "{uri}: the server's block size limits (minimum {} bytes, maximum {} bytes) \
                     do not allow 512-byte requests, which the cache needs",
                    info.minimum_block_bytes, info.max_request_bytes
                ),
            ));
        }
        let count = if info.can_multi_conn() {
            connections
        } else {
            1
        };
        let mut links = Vec::with_capacity(count);
        links.push(Mutex::new(link(first, pipelined, request_timeout)?));
        for _ in 1..count {
            // A server that advertises multi-conn may still take fewer clients: keep what it
            // greeted (the first connection is enough; the queue rides on pipes anyway).
            let Ok(client) = Client::connect_with_timeouts(
                &parsed,
                request_timeout,
                EXTRA_CONNECTION_GREETING_TIMEOUT,
            ) else {
                break;
            };
            let other = client.info();
            if other.size_bytes != info.size_bytes
                || other.transmission_flags != info.transmission_flags
            {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "{uri}: connections to the same export disagree (size {} vs {} bytes, \
                         flags {:#x} vs {:#x})",
                        info.size_bytes,
                        other.size_bytes,
                        info.transmission_flags,
                        other.transmission_flags
                    ),
                ));
            }
            links.push(Mutex::new(link(client, pipelined, request_timeout)?));
        }
        Ok(NbdDevice {
            uri: uri.to_owned(),
            parsed,
            info,
            pipelined,
            connections: links,
            next_connection: AtomicUsize::new(0),
            reconnects: AtomicU64::new(0),
            request_timeout,
            status: Mutex::new(StatusLink::default()),
        })
    }

    /// What the handshake established (size, flags, block size limits).
    pub fn info(&self) -> &ExportInfo {
        &self.info
    }

    /// Connections in the pool (1 unless the server advertises `CAN_MULTI_CONN`; fewer than
    /// asked if the server did not greet the extra ones in time).
    pub fn connection_count(&self) -> usize {
        self.connections.len()
    }

    /// Whether each connection carries many requests at once (plain sockets) rather than one
    /// (TLS).
    pub fn is_pipelined(&self) -> bool {
        self.pipelined
    }

    /// Whether some connection is broken now (it reconnects on its next use).
    pub fn has_failed(&self) -> bool {
        self.connections.iter().any(|c| {
            c.try_lock()
                .is_some_and(|link| link.broken_reason().is_some())
        })
    }

    /// A new connection to replace a broken one, if the server answers with the same export.
    fn reconnect(&self) -> io::Result<Link> {
        let client = Client::connect_with_timeout(&self.parsed, self.request_timeout)?;
        let other = client.info();
        if other.size_bytes != self.info.size_bytes
            || other.transmission_flags != self.info.transmission_flags
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{}: the export changed while reconnecting (size {} vs {} bytes, flags {:#x} \
                     vs {:#x}); refusing to use it as the same backing device",
                    self.uri,
                    other.size_bytes,
                    self.info.size_bytes,
                    other.transmission_flags,
                    self.info.transmission_flags
                ),
            ));
        }
        link(client, self.pipelined, self.request_timeout)
    }

    /// Runs `op` on a connection: a pipe round robin (it takes every caller at once), or the
    /// first free serial connection (starting round robin, waiting for the starting one if all
    /// are busy). A broken connection reconnects first.
    fn run(&self, op: Op<'_>) -> io::Result<()> {
        let count = self.connections.len();
        let start = self.next_connection.fetch_add(1, Ordering::Relaxed) % count;
        let mut link: MutexGuard<'_, Link> = if self.pipelined {
            self.connections[start].lock()
        } else {
            (0..count)
                .find_map(|step| self.connections[(start + step) % count].try_lock())
                .unwrap_or_else(|| self.connections[start].lock())
        };
        if let Some(reason) = link.broken_reason() {
            match self.reconnect() {
                Ok(fresh) => {
                    *link = fresh;
                    self.reconnects.fetch_add(1, Ordering::AcqRel);
                }
                Err(e) => {
                    return Err(io::Error::new(
                        io::ErrorKind::NotConnected,
                        format!(
                            "NBD backing device {} is unreachable (the connection broke: \
                             {reason}; reconnecting failed: {e}); dirty data stays in the cache \
                             and is written back once it answers again",
                            self.uri
                        ),
                    ))
                }
            }
        }
        debug_assert_eq!(link.info().size_bytes, self.info.size_bytes);
        match &mut *link {
            Link::Pipe(pipe) => {
                // The pool slot is free again at once: other callers share the pipe.
                let pipe = Arc::clone(pipe);
                drop(link);
                op.run_on_pipe(&pipe)
            }
            Link::Serial(client) => op.run_on_client(client),
        }
    }

    fn check_range(&self, offset: u64, len_bytes: u64) -> io::Result<()> {
        if !offset.is_multiple_of(SECTOR_SIZE_BYTES) || !len_bytes.is_multiple_of(SECTOR_SIZE_BYTES)
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("unaligned device IO: offset {offset} length {len_bytes}"),
            ));
        }
        match offset.checked_add(len_bytes) {
            Some(end) if end <= self.info.size_bytes => Ok(()),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "device IO past the end: offset {offset} length {len_bytes} size {}",
                    self.info.size_bytes
                ),
            )),
        }
    }
}

impl BlockDevice for NbdDevice {
    /// The export size rounded down to whole 512-byte sectors.
    fn size_bytes(&self) -> u64 {
        self.info.size_bytes
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check_range(offset, buf.len() as u64)?;
        self.run(Op::Read(buf, offset))
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.check_range(offset, buf.len() as u64)?;
        if self.info.is_read_only() {
            return Err(io::Error::from_raw_os_error(libc::EROFS));
        }
        self.run(Op::Write(buf, offset))
    }

    /// `NBD_CMD_FLUSH` on one connection. That covers every connection's completed writes: with
    /// one connection trivially, with several because the server advertised `CAN_MULTI_CONN`,
    /// whose meaning is exactly that a flush's effect is visible across connections.
    ///
    /// If the server does not advertise flush this is a no-op: such a server is claiming that a
    /// write is durable once it has replied to it (and the spec forbids sending the command).
    fn flush(&self) -> io::Result<()> {
        if !self.info.can_flush() {
            return Ok(());
        }
        self.run(Op::Flush)
    }

    /// `NBD_CMD_TRIM` when the server advertises it; otherwise (or on a read-only export) Ok and
    /// nothing, as the trait allows.
    fn discard(&self, offset: u64, len_bytes: u64) -> io::Result<()> {
        self.check_range(offset, len_bytes)?;
        if !self.info.can_trim() || self.info.is_read_only() || len_bytes == 0 {
            return Ok(());
        }
        self.run(Op::Trim(offset, len_bytes))
    }

    /// `NBD_CMD_WRITE_ZEROES` when the server advertises it; otherwise zero blocks are written.
    fn write_zeroes(&self, offset: u64, len_bytes: u64) -> io::Result<()> {
        self.check_range(offset, len_bytes)?;
        if len_bytes == 0 {
            return Ok(());
        }
        if !self.info.can_write_zeroes() || self.info.is_read_only() {
            return logcache_io::write_zero_blocks(self, offset, len_bytes);
        }
        self.run(Op::WriteZeroes(offset, len_bytes))
    }

    fn describe(&self) -> String {
        self.uri.clone()
    }

    /// The server's own `base:allocation`, so a sparse remote export stays sparse through the
    /// cache. Asked on a connection of its own, and only of a server that advertises
    /// `CAN_MULTI_CONN`: then a write flushed on a data connection (as writeback does before a
    /// block stops being dirty) shows in the status connection's answer, so a range is never
    /// called a hole after data reached it. (A server without multi-conn may also refuse a
    /// second connection; one that does not greet it within
    /// [`EXTRA_CONNECTION_GREETING_TIMEOUT`] has no room for it: the answer is then "data" for
    /// the next minute.) A hole reads as zeros only with both `STATE_HOLE` and `STATE_ZERO`.
    fn allocation(&self, offset: u64, len_bytes: u64) -> io::Result<(u64, Allocation)> {
        debug_assert!(len_bytes > 0);
        if !self.info.can_multi_conn() {
            return Ok((len_bytes, Allocation::Data));
        }
        let mut status = self.status.lock();
        if status.client.as_ref().is_none_or(Client::is_broken) {
            if status.no_room_until.is_some_and(|t| Instant::now() < t) {
                return Ok((len_bytes, Allocation::Data));
            }
            let client = match Client::connect_for_block_status(
                &self.parsed,
                self.request_timeout,
                EXTRA_CONNECTION_GREETING_TIMEOUT,
            ) {
                Ok(client) => client,
                // Not greeted in time: the server takes no more clients (qemu-nbd `-e N`, all
                // taken by the data connections). "Data" is always a true answer; ask again
                // later rather than make every block status wait for a greeting.
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
                    ) =>
                {
                    status.no_room_until = Some(Instant::now() + STATUS_RETRY_AFTER);
                    return Ok((len_bytes, Allocation::Data));
                }
                Err(e) => return Err(e),
            };
            if client.size_bytes() != self.info.size_bytes {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}: the export changed size", self.uri),
                ));
            }
            status.client = Some(client);
            status.no_room_until = None;
        }
        let client = status.client.as_mut().expect("connected above");
        Ok(match client.block_status(offset, len_bytes)? {
            Some((length_bytes, flags)) => {
                let length_bytes = length_bytes.min(len_bytes);
                if flags & STATE_HOLE != 0 && flags & STATE_ZERO != 0 {
                    (length_bytes, Allocation::ZeroHole)
                } else {
                    (length_bytes, Allocation::Data)
                }
            }
            None => (len_bytes, Allocation::Data),
        })
    }

    fn reconnects(&self) -> u64 {
        self.reconnects.load(Ordering::Acquire)
    }
}

impl fmt::Debug for NbdDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NbdDevice")
            .field("uri", &self.uri)
            .field("info", &self.info)
            .field("connections", &self.connections.len())
            .field("pipelined", &self.pipelined)
            .field("reconnects", &self.reconnects.load(Ordering::Relaxed))
            .finish()
    }
}

/// A freshly connected client as a pool connection.
fn link(client: Client, pipelined: bool, request_timeout: Duration) -> io::Result<Link> {
    Ok(if pipelined {
        Link::Pipe(Arc::new(Pipe::new(client, request_timeout)?))
    } else {
        Link::Serial(client)
    })
}

impl Op<'_> {
    fn run_on_pipe(self, pipe: &Pipe) -> io::Result<()> {
        match self {
            Op::Read(buf, offset) => pipe.read_at(buf, offset),
            Op::Write(buf, offset) => pipe.write_at(buf, offset, false),
            Op::Flush => pipe.flush(),
            Op::Trim(offset, len_bytes) => pipe.trim(offset, len_bytes),
            Op::WriteZeroes(offset, len_bytes) => pipe.write_zeroes(offset, len_bytes),
        }
    }

    fn run_on_client(self, client: &mut Client) -> io::Result<()> {
        match self {
            Op::Read(buf, offset) => client.read_at(buf, offset),
            Op::Write(buf, offset) => client.write_at(buf, offset, false),
            Op::Flush => client.flush(),
            Op::Trim(offset, len_bytes) => client.trim(offset, len_bytes),
            Op::WriteZeroes(offset, len_bytes) => client.write_zeroes(offset, len_bytes),
        }
    }
}
