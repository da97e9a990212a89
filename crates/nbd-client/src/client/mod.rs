//! A small blocking NBD client over std sockets, built on this crate's codecs.
//!
//! One request at a time per connection: every call sends a request and waits for its reply, so
//! the code never has to match replies to requests out of order. Callers that want parallelism
//! open several connections (only safe for flushes when the server advertises `CAN_MULTI_CONN`).
//!
//! Only simple replies are used: structured replies are never negotiated, which keeps the read
//! path to "header, then exactly the requested bytes".
//!
//! Failure policy: if the stream breaks (EOF, socket error, a reply that does not parse or does
//! not answer the request just sent) the connection is marked broken and every later call fails
//! with an error naming the first failure. The client never reconnects by itself: the server may
//! have acknowledged writes it had not yet flushed, and those may be gone with the old
//! connection, so the failure has to reach whoever can decide what that means.
//!
//! One job per file: this file holds [`Client`] and its calls; `handshake` negotiates the export
//! and learns its size, flags and block sizes; `exchange` sends one request and reads its reply
//! (and breaks the connection for good on any failure); `stream` is the socket underneath.

mod exchange;
mod handshake;
mod status;
mod stream;
#[cfg(test)]
mod tests;
mod tls;

use std::io::{self, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use logcache_nbd::consts::CMD_FLAG_FUA;
use logcache_nbd::request::{Command, Request};
use logcache_nbd::uri::{NbdAddress, NbdUri};

use self::handshake::handshake_with_tls;
pub use self::handshake::ExportInfo;
use self::stream::{connect_tcp, Stream};

/// Largest READ or WRITE payload sent in one request, whatever the server advertises: the spec's
/// interoperable default when the server advertises nothing, and a sane cap otherwise (larger
/// requests gain nothing and some servers reject them despite advertising more).
pub const DEFAULT_MAX_REQUEST_BYTES: u32 = 32 << 20;

/// The unit the exported size is rounded down to. The cache addresses its backing device in
/// 512-byte sectors, so a partial trailing sector could never be used consistently anyway.
pub const SECTOR_BYTES: u64 = 512;

/// How long connecting and the handshake may take. Not used after the handshake: a slow backing
/// device is allowed to be slow, and a dead server closes its socket, which reads as EOF.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a request may go unanswered before the connection counts as broken, by default.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = REQUEST_TIMEOUT;
/// Longest wait for a reply (or for room to send a request) once connected.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// The largest legal minimum block size (the spec caps it at 64 KiB).
const MAX_MINIMUM_BLOCK_BYTES: u32 = 64 * 1024;

/// Server messages are shown to users on one line, so they are trimmed to this many characters.
const MAX_SERVER_MESSAGE_CHARS: usize = 200;

/// A connected NBD client in the transmission phase.
pub struct Client {
    stream: Stream,
    uri: String,
    export_name: String,
    info: ExportInfo,
    next_cookie: u64,
    /// Why the connection became unusable; set once, never cleared.
    broken: Option<String>,
    /// `NBD_CMD_DISC` was sent (or the stream was shut down), so drop has nothing left to do.
    closed: bool,
    /// Set on a connection opened by [`Client::connect_for_block_status`] when the server
    /// offers `base:allocation`: the id its block status chunks carry.
    base_allocation_id: Option<u32>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("uri", &self.uri)
            .field("info", &self.info)
            .field("broken", &self.broken)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// Connects (TCP with `TCP_NODELAY`, or a Unix socket) and negotiates the URI's export with
    /// `NBD_OPT_GO` (falling back to `NBD_OPT_EXPORT_NAME` for servers without it). Errors are
    /// one line naming the URI.
    pub fn connect(uri: &NbdUri) -> io::Result<Client> {
        Self::connect_with_timeout(uri, REQUEST_TIMEOUT)
    }

    /// [`Client::connect`] with another limit on how long the server may take to answer a
    /// request; the handshake gets the shorter of this and its own 30 s.
    pub fn connect_with_timeout(uri: &NbdUri, request_timeout: Duration) -> io::Result<Client> {
        Self::connect_inner(uri, request_timeout, false)
    }

    /// A connection for [`Client::block_status`] only: it negotiates structured replies and
    /// `base:allocation` (when the server offers them), which the data calls do not expect.
    pub fn connect_for_block_status(uri: &NbdUri, request_timeout: Duration) -> io::Result<Client> {
        Self::connect_inner(uri, request_timeout, true)
    }

    fn connect_inner(
        uri: &NbdUri,
        request_timeout: Duration,
        block_status: bool,
    ) -> io::Result<Client> {
        if request_timeout.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{uri}: a request timeout must be longer than zero"),
            ));
        }
        let stream = match &uri.address {
            NbdAddress::Tcp { host, port } => {
                let stream = connect_tcp(host, *port).map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!("{uri}: cannot connect to {host} port {port}: {e}"),
                    )
                })?;
                // Requests are small header+payload writes followed by a wait for the reply:
                // Nagle's algorithm would only add latency.
                stream
                    .set_nodelay(true)
                    .map_err(|e| prefix_error(uri.as_str(), e))?;
                Stream::Tcp(stream)
            }
            NbdAddress::Unix { socket_path } => {
                Stream::Unix(UnixStream::connect(socket_path).map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!(
                            "{uri}: cannot connect to Unix socket {}: {e}",
                            socket_path.display()
                        ),
                    )
                })?)
            }
        };
        let tls = uri.tls.as_ref().map(|settings| tls::TlsTarget {
            settings,
            host: match &uri.address {
                NbdAddress::Tcp { host, .. } => Some(host.as_str()),
                NbdAddress::Unix { .. } => None,
            },
        });
        handshake_with_tls(
            stream,
            uri.as_str(),
            &uri.export_name,
            request_timeout,
            tls,
            block_status,
        )
    }

    /// Parses `uri` and connects; a convenience for callers holding a string.
    pub fn connect_str(uri: &str) -> io::Result<Client> {
        let uri = NbdUri::parse(uri)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        Self::connect(&uri)
    }

    pub fn info(&self) -> &ExportInfo {
        &self.info
    }

    /// Usable size in bytes (a multiple of 512; see [`ExportInfo::size_bytes`]).
    pub fn size_bytes(&self) -> u64 {
        self.info.size_bytes
    }

    pub fn uri(&self) -> &str {
        &self.uri
    }

    pub fn export_name(&self) -> &str {
        &self.export_name
    }

    /// Whether an earlier failure made the connection unusable.
    pub fn is_broken(&self) -> bool {
        self.broken.is_some()
    }

    /// Why the connection is unusable (without the URI), if it is.
    pub fn broken_reason(&self) -> Option<&str> {
        self.broken.as_deref()
    }

    /// Reads exactly `buf.len()` bytes at `offset_bytes`, in requests of at most
    /// `max_request_bytes`.
    pub fn read_at(&mut self, buf: &mut [u8], offset_bytes: u64) -> io::Result<()> {
        self.check_usable()?;
        self.check_range(offset_bytes, buf.len() as u64)?;
        for (at, r) in pieces(offset_bytes, buf.len(), self.info.max_request_bytes) {
            let length_bytes = r.len() as u32;
            self.transact(Command::Read, 0, at, length_bytes, &[], &mut buf[r])?;
        }
        Ok(())
    }

    /// Writes all of `buf` at `offset_bytes`, split like reads. With `fua` the write is durable
    /// when this returns: each request carries `FUA` if the server supports it, otherwise a flush
    /// follows the write.
    pub fn write_at(&mut self, buf: &[u8], offset_bytes: u64, fua: bool) -> io::Result<()> {
        self.check_usable()?;
        self.check_writable()?;
        self.check_range(offset_bytes, buf.len() as u64)?;
        let native_fua = fua && self.info.can_fua();
        let flags = if native_fua { CMD_FLAG_FUA } else { 0 };
        for (at, r) in pieces(offset_bytes, buf.len(), self.info.max_request_bytes) {
            let length_bytes = r.len() as u32;
            self.transact(Command::Write, flags, at, length_bytes, &buf[r], &mut [])?;
        }
        if fua && !native_fua && !buf.is_empty() {
            self.flush()?;
        }
        Ok(())
    }

    /// Makes every write acknowledged before this call durable (`NBD_CMD_FLUSH`).
    ///
    /// If the server does not advertise `FLAG_SEND_FLUSH` this sends nothing and succeeds: the
    /// spec forbids sending the command then, and such a server is claiming that a write is
    /// durable once it has replied to it.
    pub fn flush(&mut self) -> io::Result<()> {
        self.check_usable()?;
        if !self.info.can_flush() {
            return Ok(());
        }
        self.transact(Command::Flush, 0, 0, 0, &[], &mut [])
    }

    /// Tells the server the range is no longer needed (`NBD_CMD_TRIM`), split like writes.
    /// Fails with `Unsupported` if the server does not advertise trim (the caller decides
    /// whether that matters; a trim is only a hint).
    pub fn trim(&mut self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        self.check_usable()?;
        self.check_writable()?;
        self.check_range(offset_bytes, len_bytes)?;
        if !self.info.can_trim() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("{}: the server does not support trim", self.uri),
            ));
        }
        self.send_range(Command::Trim, offset_bytes, len_bytes)
    }

    /// Makes the range read as zeros (`NBD_CMD_WRITE_ZEROES`, holes allowed), split like
    /// writes. Fails with `Unsupported` if the server does not advertise it (the caller writes
    /// zero blocks instead).
    pub fn write_zeroes(&mut self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        self.check_usable()?;
        self.check_writable()?;
        self.check_range(offset_bytes, len_bytes)?;
        if !self.info.can_write_zeroes() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("{}: the server does not support write zeroes", self.uri),
            ));
        }
        self.send_range(Command::WriteZeroes, offset_bytes, len_bytes)
    }

    /// A payload-free command over a range, in pieces of at most `max_request_bytes` (servers
    /// may refuse longer ones).
    fn send_range(
        &mut self,
        command: Command,
        offset_bytes: u64,
        len_bytes: u64,
    ) -> io::Result<()> {
        let len = usize::try_from(len_bytes).expect("a range on this machine fits in usize");
        for (piece_offset_bytes, piece) in pieces(offset_bytes, len, self.info.max_request_bytes) {
            self.transact(
                command,
                0,
                piece_offset_bytes,
                piece.len() as u32,
                &[],
                &mut [],
            )?;
        }
        Ok(())
    }

    /// Ends the session cleanly with `NBD_CMD_DISC` (which has no reply) and closes the socket.
    /// Dropping the client does the same, ignoring errors.
    pub fn disconnect(mut self) -> io::Result<()> {
        self.check_usable()?;
        self.send_disconnect()
    }

    fn send_disconnect(&mut self) -> io::Result<()> {
        if self.closed {
            return Ok(());
        }
        self.closed = true;
        let request = Request {
            flags: 0,
            command: Command::Disconnect,
            cookie: self.take_cookie(),
            offset_bytes: 0,
            length_bytes: 0,
        };
        let result = self.stream.write_all(&request.encode());
        // Shutting down the write side tells the server nothing more is coming; it then closes.
        let _ = self.stream.shutdown(Shutdown::Write);
        result.map_err(|e| prefix_error(&self.uri, e))
    }

    fn take_cookie(&mut self) -> u64 {
        let cookie = self.next_cookie;
        self.next_cookie = self.next_cookie.wrapping_add(1);
        cookie
    }

    fn check_usable(&self) -> io::Result<()> {
        match &self.broken {
            None if self.closed => Err(io::Error::new(
                io::ErrorKind::NotConnected,
                format!("{}: the NBD connection was closed", self.uri),
            )),
            None => Ok(()),
            Some(reason) => Err(io::Error::new(
                io::ErrorKind::NotConnected,
                format!(
                    "{}: the NBD connection is unusable after an earlier failure ({reason}); \
                     not reconnecting, because writes the server acknowledged but had not \
                     flushed may have been lost",
                    self.uri
                ),
            )),
        }
    }

    fn check_writable(&self) -> io::Result<()> {
        if self.info.is_read_only() {
            // Refused locally (the spec has the server fail them anyway); EROFS keeps the errno
            // meaningful for callers that forward it, e.g. to their own NBD clients.
            return Err(io::Error::from_raw_os_error(libc::EROFS));
        }
        Ok(())
    }

    fn check_range(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        match offset_bytes.checked_add(len_bytes) {
            Some(end) if end <= self.info.size_bytes => Ok(()),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{}: request at offset {offset_bytes} of {len_bytes} bytes is past the end \
                     of the {}-byte export",
                    self.uri, self.info.size_bytes
                ),
            )),
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        // Best effort: a clean NBD_CMD_DISC lets the server finish up without logging an error.
        if self.broken.is_none() {
            let _ = self.send_disconnect();
        }
    }
}

/// Puts the URI in front of an error's text (the kind is kept).
fn prefix_error(uri: &str, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{uri}: {e}"))
}

/// Splits `len_bytes` at `offset_bytes` into requests of at most `max_request_bytes`: each as
/// (its offset on the export, its range in the caller's buffer).
fn pieces(
    offset_bytes: u64,
    len_bytes: usize,
    max_request_bytes: u32,
) -> impl Iterator<Item = (u64, std::ops::Range<usize>)> {
    let step = max_request_bytes as usize;
    assert!(step > 0, "a server's request limit is positive");
    (0..len_bytes).step_by(step).map(move |start| {
        (
            offset_bytes + start as u64,
            start..len_bytes.min(start + step),
        )
    })
}
