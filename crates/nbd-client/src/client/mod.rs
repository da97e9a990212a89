//! A small blocking NBD client over std sockets, built on this crate's codecs.
//!
//! [`Client`]: one request at a time per connection: every call sends a request and waits for
//! its reply, so the code never has to match replies to requests out of order. [`Pipe`] takes a
//! connected client's socket over for many threads at once: each caller's request goes out
//! whole and a receiver thread matches replies to requests by cookie, in any order.
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
//! One job per file: this file holds [`Client`] and its calls; `ops` the data calls for both
//! transports (local checks, splitting at the request limit); `handshake` negotiates the export
//! and learns its size, flags and block sizes; `exchange` sends one request and reads its reply
//! (and breaks the connection for good on any failure); `pipe` is [`Pipe`]; `stream` is the
//! socket underneath.

mod exchange;
mod handshake;
mod ops;
mod pipe;
#[cfg(test)]
mod pipe_tests;
mod status;
mod stream;
#[cfg(test)]
mod tests;
mod tls;

use std::io::{self, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use logcache_nbd::request::{Command, Request};
use logcache_nbd::uri::{NbdAddress, NbdUri};

pub use self::handshake::ExportInfo;
use self::handshake::{handshake_with_tls, HandshakeTimeouts};
pub use self::pipe::{Pipe, MAX_IN_FLIGHT_PER_CONNECTION};
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
        Self::connect_inner(uri, HandshakeTimeouts::for_requests(request_timeout), false)
    }

    /// [`Client::connect_with_timeout`], the server's greeting and the whole handshake limited
    /// to `handshake_timeout` (and to the request timeout): for an extra connection a server
    /// may leave waiting (one that takes fewer clients than it advertises multi-conn for).
    pub fn connect_with_timeouts(
        uri: &NbdUri,
        request_timeout: Duration,
        handshake_timeout: Duration,
    ) -> io::Result<Client> {
        let mut timeouts = HandshakeTimeouts::for_requests(request_timeout);
        timeouts.handshake = timeouts.handshake.min(handshake_timeout);
        Self::connect_inner(uri, timeouts, false)
    }

    /// A connection for [`Client::block_status`] only: it negotiates structured replies and
    /// `base:allocation` (when the server offers them), which the data calls do not expect. The
    /// handshake is limited like [`Client::connect_with_timeouts`]'.
    pub fn connect_for_block_status(
        uri: &NbdUri,
        request_timeout: Duration,
        handshake_timeout: Duration,
    ) -> io::Result<Client> {
        let mut timeouts = HandshakeTimeouts::for_requests(request_timeout);
        timeouts.handshake = timeouts.handshake.min(handshake_timeout);
        Self::connect_inner(uri, timeouts, true)
    }

    fn connect_inner(
        uri: &NbdUri,
        timeouts: HandshakeTimeouts,
        block_status: bool,
    ) -> io::Result<Client> {
        if timeouts.request.is_zero() || timeouts.handshake.is_zero() {
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
            timeouts,
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
        ops::read_at(self, buf, offset_bytes)
    }

    /// Writes all of `buf` at `offset_bytes`, split like reads. With `fua` the write is durable
    /// when this returns: each request carries `FUA` if the server supports it, otherwise a flush
    /// follows the write.
    pub fn write_at(&mut self, buf: &[u8], offset_bytes: u64, fua: bool) -> io::Result<()> {
        ops::write_at(self, buf, offset_bytes, fua)
    }

    /// Makes every write acknowledged before this call durable (`NBD_CMD_FLUSH`); sends
    /// nothing if the server does not advertise flush (see [`ops::flush`]).
    pub fn flush(&mut self) -> io::Result<()> {
        ops::flush(self)
    }

    /// Tells the server the range is no longer needed (`NBD_CMD_TRIM`), split like writes.
    /// Fails with `Unsupported` if the server does not advertise trim (the caller decides
    /// whether that matters; a trim is only a hint).
    pub fn trim(&mut self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        ops::trim(self, offset_bytes, len_bytes)
    }

    /// Makes the range read as zeros (`NBD_CMD_WRITE_ZEROES`, holes allowed), split like
    /// writes. Fails with `Unsupported` if the server does not advertise it (the caller writes
    /// zero blocks instead).
    pub fn write_zeroes(&mut self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        ops::write_zeroes(self, offset_bytes, len_bytes)
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
            Some(reason) => Err(unusable_error(&self.uri, reason)),
        }
    }

    /// The socket under this connection as three handles (the receiver's, the sender's, and
    /// one to shut it down with), for a [`Pipe`]; the client is consumed without
    /// `NBD_CMD_DISC`. A TLS stream cannot be read and written from two threads: `Unsupported`.
    fn split(mut self) -> io::Result<[Stream; 3]> {
        self.check_usable()?;
        let halves = [
            self.stream.try_clone()?,
            self.stream.try_clone()?,
            self.stream.try_clone()?,
        ];
        // The session goes on through the handles: dropping this one must not end it.
        self.closed = true;
        Ok(halves)
    }
}

/// The error of a call on a connection an earlier failure made unusable.
fn unusable_error(uri: &str, reason: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotConnected,
        format!(
            "{uri}: the NBD connection is unusable after an earlier failure ({reason}); not \
             reconnecting, because writes the server acknowledged but had not flushed may have \
             been lost"
        ),
    )
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
