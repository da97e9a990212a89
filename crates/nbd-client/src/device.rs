//! A backing device served over NBD, so the cache's slow device can be any NBD export (qemu-nbd,
//! nbdkit, another logcache).
//!
//! [`NbdDevice`] keeps a small pool of blocking [`Client`] connections, each behind its own
//! mutex, so calls from several threads run in parallel (one request in flight per connection).
//! A broken connection is replaced by a new one on its next use: see [`NbdDevice`].

use std::fmt;
use std::io;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use logcache_io::{Allocation, BlockDevice, SECTOR_SIZE_BYTES};
use logcache_nbd::consts::{STATE_HOLE, STATE_ZERO};
use logcache_nbd::uri::NbdUri;
use parking_lot::{Mutex, MutexGuard};

use crate::client::{Client, ExportInfo, DEFAULT_REQUEST_TIMEOUT};

/// Connections opened when the caller has no better number and the server allows several.
pub const DEFAULT_CONNECTIONS: usize = 4;

/// An NBD export as a [`BlockDevice`].
///
/// Failure policy: a call on a connection that broke (the server died or restarted, the
/// network dropped, a request went unanswered for the request timeout (a minute unless
/// [`NbdDevice::open_with_timeout`] says otherwise), the server broke the protocol)
/// fails. The next call on that connection first connects again; while that fails, calls fail
/// at once with the reason, so the cache keeps absorbing writes and retries writeback later.
/// The new connection must show the same export (size and flags), or the device refuses it.
///
/// The server may have acknowledged writes on the broken connection that it had not flushed,
/// and lost them: a flush on the new connection does not cover them. [`BlockDevice::reconnects`]
/// counts reconnections so that writeback, which writes a batch and then flushes, notices one
/// in between and writes the batch again.
pub struct NbdDevice {
    uri: String,
    parsed: NbdUri,
    info: ExportInfo,
    connections: Vec<Mutex<Client>>,
    /// Where the next call starts looking for a free connection (round robin).
    next_connection: AtomicUsize,
    /// Successful reconnections so far.
    reconnects: AtomicU64,
    /// How long the server may take to answer before a connection counts as broken.
    request_timeout: Duration,
    /// A connection for block status only (it negotiates structured replies, which the data
    /// connections do not), opened on first use and again after it breaks.
    status: Mutex<Option<Client>>,
}

impl NbdDevice {
    /// Connects to the export at `uri` (`nbd://HOST[:PORT][/EXPORT]` or
    /// `nbd+unix:///[EXPORT]?socket=PATH`).
    ///
    /// Opens `connections` connections if the server advertises `CAN_MULTI_CONN`, otherwise
    /// exactly one: without multi-conn a flush on one connection need not cover writes completed
    /// on another, so spreading writes over several connections would make `flush` meaningless.
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
        let mut clients = Vec::with_capacity(count);
        clients.push(Mutex::new(first));
        for _ in 1..count {
            let client = Client::connect_with_timeout(&parsed, request_timeout)?;
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
            clients.push(Mutex::new(client));
        }
        Ok(NbdDevice {
            uri: uri.to_owned(),
            parsed,
            info,
            connections: clients,
            next_connection: AtomicUsize::new(0),
            reconnects: AtomicU64::new(0),
            request_timeout,
            status: Mutex::new(None),
        })
    }

    /// What the handshake established (size, flags, block size limits).
    pub fn info(&self) -> &ExportInfo {
        &self.info
    }

    /// Connections in the pool (1 unless the server advertises `CAN_MULTI_CONN`).
    pub fn connection_count(&self) -> usize {
        self.connections.len()
    }

    /// Whether some connection is broken now (it reconnects on its next use).
    pub fn has_failed(&self) -> bool {
        self.connections
            .iter()
            .any(|c| c.try_lock().is_some_and(|c| c.is_broken()))
    }

    /// A new connection to replace a broken one, if the server answers with the same export.
    fn reconnect(&self) -> io::Result<Client> {
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
        Ok(client)
    }

    /// Runs `op` on a free connection (the first that `try_lock` gets, starting round robin),
    /// or waits for the starting one if all are busy. A broken connection reconnects first.
    fn with_connection<T>(&self, op: impl FnOnce(&mut Client) -> io::Result<T>) -> io::Result<T> {
        let count = self.connections.len();
        let start = self.next_connection.fetch_add(1, Ordering::Relaxed) % count;
        let mut client: MutexGuard<'_, Client> = (0..count)
            .find_map(|step| self.connections[(start + step) % count].try_lock())
            .unwrap_or_else(|| self.connections[start].lock());
        if let Some(reason) = client.broken_reason() {
            let reason = reason.to_owned();
            match self.reconnect() {
                Ok(fresh) => {
                    *client = fresh;
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
        op(&mut client)
    }

    fn check_range(&self, offset: u64, len_bytes: u64) -> io::Result<()> {
        if offset % SECTOR_SIZE_BYTES != 0 || len_bytes % SECTOR_SIZE_BYTES != 0 {
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
        self.with_connection(|client| client.read_at(buf, offset))
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.check_range(offset, buf.len() as u64)?;
        if self.info.is_read_only() {
            return Err(io::Error::from_raw_os_error(libc::EROFS));
        }
        self.with_connection(|client| client.write_at(buf, offset, false))
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
        self.with_connection(|client| client.flush())
    }

    /// `NBD_CMD_TRIM` when the server advertises it; otherwise (or on a read-only export) Ok and
    /// nothing, as the trait allows.
    fn discard(&self, offset: u64, len_bytes: u64) -> io::Result<()> {
        self.check_range(offset, len_bytes)?;
        if !self.info.can_trim() || self.info.is_read_only() || len_bytes == 0 {
            return Ok(());
        }
        self.with_connection(|client| client.trim(offset, len_bytes))
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
        self.with_connection(|client| client.write_zeroes(offset, len_bytes))
    }

    fn describe(&self) -> String {
        self.uri.clone()
    }

    /// The server's own `base:allocation`, so a sparse remote export stays sparse through the
    /// cache. Asked on a connection of its own, and only of a server that advertises
    /// `CAN_MULTI_CONN`: then a write flushed on a data connection (as writeback does before a
    /// block stops being dirty) shows in the status connection's answer, so a range is never
    /// called a hole after data reached it. (A server without multi-conn may also refuse a
    /// second connection.) A hole reads as zeros only with both `STATE_HOLE` and `STATE_ZERO`.
    fn allocation(&self, offset: u64, len_bytes: u64) -> io::Result<(u64, Allocation)> {
        debug_assert!(len_bytes > 0);
        if !self.info.can_multi_conn() {
            return Ok((len_bytes, Allocation::Data));
        }
        let mut status = self.status.lock();
        if status.as_ref().is_none_or(Client::is_broken) {
            let client = Client::connect_for_block_status(&self.parsed, self.request_timeout)?;
            if client.size_bytes() != self.info.size_bytes {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}: the export changed size", self.uri),
                ));
            }
            *status = Some(client);
        }
        let client = status.as_mut().expect("connected above");
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
            .field("reconnects", &self.reconnects.load(Ordering::Relaxed))
            .finish()
    }
}
