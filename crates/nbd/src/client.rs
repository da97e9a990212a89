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

use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use crate::consts::{
    CMD_FLAG_FUA, DEFAULT_MAX_OPTION_BYTES, EXPORT_NAME_REPLY_BYTES, EXPORT_NAME_ZEROES_BYTES,
    FLAG_CAN_MULTI_CONN, FLAG_FIXED_NEWSTYLE, FLAG_HAS_FLAGS, FLAG_NO_ZEROES, FLAG_READ_ONLY,
    FLAG_SEND_FLUSH, FLAG_SEND_FUA, FLAG_SEND_TRIM, GREETING_BYTES, INFO_BLOCK_SIZE, INFO_EXPORT,
    NBDMAGIC, OLDSTYLE_MAGIC, OPTION_REPLY_HEADER_BYTES, OPT_ABORT, OPT_EXPORT_NAME, OPT_GO,
    REP_ACK, REP_ERR_BLOCK_SIZE_REQD, REP_ERR_INVALID, REP_ERR_POLICY, REP_ERR_SHUTDOWN,
    REP_ERR_TLS_REQD, REP_ERR_UNKNOWN, REP_ERR_UNSUP, REP_FLAG_ERROR, REP_INFO,
    SIMPLE_REPLY_HEADER_BYTES, STRUCTURED_REPLY_MAGIC,
};
use crate::handshake::{decode_greeting, ClientFlags, InfoRequest, OptionHeader};
use crate::option_reply::{
    decode_export_name_reply, BlockSizeConstraints, Info, OptionReplyHeader,
};
use crate::reply::SimpleReply;
use crate::request::{Command, Request};
use crate::uri::{NbdAddress, NbdUri};

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

/// What the handshake established about the export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportInfo {
    /// The size the server reported.
    pub reported_size_bytes: u64,
    /// The usable size: `reported_size_bytes` rounded down to a multiple of [`SECTOR_BYTES`].
    /// Requests beyond it are refused locally.
    pub size_bytes: u64,
    /// `FLAG_*` transmission flags (zero if the server did not set `FLAG_HAS_FLAGS`).
    pub transmission_flags: u16,
    /// The server's `INFO_BLOCK_SIZE` answer, if it sent one.
    pub block_size: Option<BlockSizeConstraints>,
    /// Minimum block size requests must respect (1 if the server advertised none).
    pub minimum_block_bytes: u32,
    /// Largest READ/WRITE payload (and TRIM length) this client sends in one request; larger
    /// calls are split. A multiple of 512 and of the minimum block size whenever the server's
    /// maximum allows it.
    pub max_request_bytes: u32,
}

impl ExportInfo {
    pub fn is_read_only(&self) -> bool {
        self.transmission_flags & FLAG_READ_ONLY != 0
    }

    pub fn can_flush(&self) -> bool {
        self.transmission_flags & FLAG_SEND_FLUSH != 0
    }

    pub fn can_fua(&self) -> bool {
        self.transmission_flags & FLAG_SEND_FUA != 0
    }

    pub fn can_trim(&self) -> bool {
        self.transmission_flags & FLAG_SEND_TRIM != 0
    }

    /// Whether a flush on one connection covers writes completed on every other connection.
    pub fn can_multi_conn(&self) -> bool {
        self.transmission_flags & FLAG_CAN_MULTI_CONN != 0
    }
}

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
        handshake(stream, uri.as_str(), &uri.export_name, request_timeout)
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
        let chunk_bytes = self.info.max_request_bytes as usize;
        let mut piece_offset_bytes = offset_bytes;
        for piece in buf.chunks_mut(chunk_bytes) {
            let length_bytes = piece.len() as u32;
            self.transact(
                Command::Read,
                0,
                piece_offset_bytes,
                length_bytes,
                &[],
                piece,
            )?;
            piece_offset_bytes += u64::from(length_bytes);
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
        let chunk_bytes = self.info.max_request_bytes as usize;
        let mut piece_offset_bytes = offset_bytes;
        for piece in buf.chunks(chunk_bytes) {
            let length_bytes = piece.len() as u32;
            self.transact(
                Command::Write,
                flags,
                piece_offset_bytes,
                length_bytes,
                piece,
                &mut [],
            )?;
            piece_offset_bytes += u64::from(length_bytes);
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
        let chunk_bytes = u64::from(self.info.max_request_bytes);
        let end_bytes = offset_bytes + len_bytes;
        let mut piece_offset_bytes = offset_bytes;
        while piece_offset_bytes < end_bytes {
            let length_bytes = (end_bytes - piece_offset_bytes).min(chunk_bytes);
            self.transact(
                Command::Trim,
                0,
                piece_offset_bytes,
                length_bytes as u32,
                &[],
                &mut [],
            )?;
            piece_offset_bytes += length_bytes;
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

    /// Sends one request (with `payload` for writes) and waits for its simple reply, reading
    /// `read_into.len()` bytes of data after a successful reply to a read.
    fn transact(
        &mut self,
        command: Command,
        flags: u16,
        offset_bytes: u64,
        length_bytes: u32,
        payload: &[u8],
        read_into: &mut [u8],
    ) -> io::Result<()> {
        self.check_usable()?;
        let cookie = self.take_cookie();
        let request = Request {
            flags,
            command,
            cookie,
            offset_bytes,
            length_bytes,
        };
        let name = command_name(command);
        if let Err(e) = write_all_vectored(&mut self.stream, &[&request.encode(), payload]) {
            return Err(self.mark_broken(e.kind(), format!("sending {name} failed: {e}")));
        }
        let mut header = [0u8; SIMPLE_REPLY_HEADER_BYTES];
        if let Err(e) = self.stream.read_exact(&mut header) {
            let reason = match e.kind() {
                io::ErrorKind::UnexpectedEof => {
                    format!("the server closed the connection instead of answering {name}")
                }
                _ => format!("receiving the reply to {name} failed: {e}"),
            };
            return Err(self.mark_broken(e.kind(), reason));
        }
        let reply = match SimpleReply::decode(&header) {
            Ok(reply) => reply,
            Err(e) => {
                let reason = if header[..4] == STRUCTURED_REPLY_MAGIC.to_be_bytes() {
                    format!("the server answered {name} with a structured reply, which was not negotiated")
                } else {
                    format!("the reply to {name} is not NBD: {e}")
                };
                return Err(self.mark_broken(io::ErrorKind::InvalidData, reason));
            }
        };
        if reply.cookie != cookie {
            return Err(self.mark_broken(
                io::ErrorKind::InvalidData,
                format!(
                    "the reply to {name} carries cookie {:#x}, expected {cookie:#x}",
                    reply.cookie
                ),
            ));
        }
        if reply.error != 0 {
            // A simple error reply has no data, even for a read, so the stream stays in step.
            if reply.error == crate::consts::ESHUTDOWN {
                // The spec asks the client to disconnect softly when the server shuts down.
                self.broken = Some(format!("the server is shutting down (ESHUTDOWN on {name})"));
                let _ = self.send_disconnect();
            }
            return Err(io::Error::from_raw_os_error(local_errno(reply.error)));
        }
        if let Err(e) = self.stream.read_exact(read_into) {
            let reason = match e.kind() {
                io::ErrorKind::UnexpectedEof => {
                    format!("the server closed the connection in the middle of {name} data")
                }
                _ => format!("receiving {name} data failed: {e}"),
            };
            return Err(self.mark_broken(e.kind(), reason));
        }
        Ok(())
    }

    /// Records why the connection is unusable, closes the socket so the server notices, and
    /// returns the error for the call that found out.
    fn mark_broken(&mut self, kind: io::ErrorKind, reason: String) -> io::Error {
        let _ = self.stream.shutdown(Shutdown::Both);
        self.closed = true;
        let error = io::Error::new(
            kind,
            format!("{}: {reason}; the NBD connection is now unusable", self.uri),
        );
        self.broken = Some(reason);
        error
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

/// Maps an NBD wire error to the local errno (the spec fixes the wire values, which happen to be
/// Linux's; other platforms number some of them differently). Unknown values become EIO.
fn local_errno(wire_error: u32) -> i32 {
    use crate::consts as c;
    match wire_error {
        c::EPERM => libc::EPERM,
        c::EIO => libc::EIO,
        c::ENOMEM => libc::ENOMEM,
        c::EINVAL => libc::EINVAL,
        c::ENOSPC => libc::ENOSPC,
        c::EOVERFLOW => libc::EOVERFLOW,
        c::ENOTSUP => libc::ENOTSUP,
        c::ESHUTDOWN => libc::ESHUTDOWN,
        _ => libc::EIO,
    }
}

fn command_name(command: Command) -> &'static str {
    match command {
        Command::Read => "NBD_CMD_READ",
        Command::Write => "NBD_CMD_WRITE",
        Command::Disconnect => "NBD_CMD_DISC",
        Command::Flush => "NBD_CMD_FLUSH",
        Command::Trim => "NBD_CMD_TRIM",
        Command::Cache => "NBD_CMD_CACHE",
        Command::WriteZeroes => "NBD_CMD_WRITE_ZEROES",
        Command::BlockStatus => "NBD_CMD_BLOCK_STATUS",
        Command::Resize => "NBD_CMD_RESIZE",
        Command::Unknown(_) => "unknown NBD command",
    }
}

// --- Handshake ---------------------------------------------------------------------------------

/// Size, flags and block sizes as negotiated, before validation.
struct Negotiated {
    size_bytes: u64,
    transmission_flags: u16,
    block_size: Option<BlockSizeConstraints>,
}

/// Runs the fixed-newstyle handshake on a connected stream and returns a client in the
/// transmission phase.
fn handshake(
    mut stream: Stream,
    uri: &str,
    export_name: &str,
    request_timeout: Duration,
) -> io::Result<Client> {
    stream
        .set_timeouts(Some(HANDSHAKE_TIMEOUT.min(request_timeout)))
        .map_err(|e| prefix_error(uri, e))?;
    let negotiated = negotiate(&mut stream, uri, export_name).inspect_err(|_| {
        // Leave the server a clean end of stream rather than a half-finished handshake.
        let _ = stream.shutdown(Shutdown::Both);
    })?;
    // A server that stops answering (stopped, or a network that drops packets silently) must
    // not hang its caller forever: a request unanswered this long breaks the connection.
    stream
        .set_timeouts(Some(request_timeout))
        .map_err(|e| prefix_error(uri, e))?;
    let info = export_info(&negotiated).map_err(|reason| {
        let _ = stream.shutdown(Shutdown::Both);
        io::Error::new(io::ErrorKind::InvalidData, format!("{uri}: {reason}"))
    })?;
    Ok(Client {
        stream,
        uri: uri.to_owned(),
        export_name: export_name.to_owned(),
        info,
        next_cookie: 1,
        broken: None,
        closed: false,
    })
}

fn negotiate(stream: &mut Stream, uri: &str, export_name: &str) -> io::Result<Negotiated> {
    let mut greeting = [0u8; GREETING_BYTES];
    read_handshake(stream, &mut greeting, uri, "the server greeting")?;
    if greeting[..8] != NBDMAGIC.to_be_bytes() {
        return Err(handshake_error(
            uri,
            io::ErrorKind::InvalidData,
            "the server is not an NBD server (its greeting lacks NBDMAGIC)",
        ));
    }
    if greeting[8..16] == OLDSTYLE_MAGIC.to_be_bytes() {
        return Err(handshake_error(
            uri,
            io::ErrorKind::Unsupported,
            "the server uses oldstyle negotiation, which is not supported (use a newstyle server, e.g. nbd-server, qemu-nbd or nbdkit without -o)",
        ));
    }
    let handshake_flags = decode_greeting(&greeting)
        .map_err(|e| handshake_error(uri, io::ErrorKind::InvalidData, &e.to_string()))?;
    let fixed_newstyle = handshake_flags & FLAG_FIXED_NEWSTYLE != 0;
    // Only echo what the server offered: the spec makes it drop clients sending other bits.
    let client_flags = ClientFlags {
        fixed_newstyle,
        no_zeroes: handshake_flags & FLAG_NO_ZEROES != 0,
    };
    write_handshake(stream, &client_flags.to_wire().to_be_bytes(), uri)?;
    if fixed_newstyle {
        if let Some(negotiated) = option_go(stream, uri, export_name)? {
            return Ok(negotiated);
        }
    }
    option_export_name(stream, uri, export_name, client_flags.no_zeroes)
}

/// `NBD_OPT_GO` asking for `INFO_BLOCK_SIZE`; `Ok(None)` if the server does not know the option.
fn option_go(stream: &mut Stream, uri: &str, export_name: &str) -> io::Result<Option<Negotiated>> {
    let payload = InfoRequest {
        export_name: export_name.to_owned(),
        info_types: vec![INFO_BLOCK_SIZE],
    }
    .encode()
    .map_err(|e| handshake_error(uri, io::ErrorKind::InvalidInput, &e.to_string()))?;
    send_option(stream, uri, OPT_GO, &payload)?;

    let mut export = None;
    let mut block_size = None;
    loop {
        let mut header_bytes = [0u8; OPTION_REPLY_HEADER_BYTES];
        read_handshake(stream, &mut header_bytes, uri, "the reply to NBD_OPT_GO")?;
        let header = OptionReplyHeader::decode(&header_bytes)
            .map_err(|e| handshake_error(uri, io::ErrorKind::InvalidData, &e.to_string()))?;
        if header.option != OPT_GO {
            return Err(handshake_error(
                uri,
                io::ErrorKind::InvalidData,
                &format!(
                    "the server answered option {} while NBD_OPT_GO was pending",
                    header.option
                ),
            ));
        }
        // Real replies are a few short strings; refuse to allocate for anything bigger.
        if header.length_bytes > DEFAULT_MAX_OPTION_BYTES {
            return Err(handshake_error(
                uri,
                io::ErrorKind::InvalidData,
                &format!(
                    "option reply of {} bytes exceeds the {DEFAULT_MAX_OPTION_BYTES}-byte limit",
                    header.length_bytes
                ),
            ));
        }
        let mut data = vec![0u8; header.length_bytes as usize];
        read_handshake(stream, &mut data, uri, "the reply to NBD_OPT_GO")?;
        match header.reply_type {
            REP_INFO => match Info::decode_data(&data) {
                Ok(Info::Export {
                    size_bytes,
                    transmission_flags,
                }) => export = Some((size_bytes, transmission_flags)),
                Ok(Info::BlockSize(constraints)) => block_size = Some(constraints),
                Ok(_) => {}
                Err(e) => {
                    // Only the items we rely on must be well formed; others are ignored.
                    let info_type = data.get(..2).map(|b| u16::from_be_bytes([b[0], b[1]]));
                    if matches!(info_type, Some(INFO_EXPORT | INFO_BLOCK_SIZE)) {
                        return Err(handshake_error(
                            uri,
                            io::ErrorKind::InvalidData,
                            &e.to_string(),
                        ));
                    }
                }
            },
            REP_ACK => {
                let (size_bytes, transmission_flags) = export.ok_or_else(|| {
                    handshake_error(
                        uri,
                        io::ErrorKind::InvalidData,
                        "the server accepted NBD_OPT_GO without sending the export size",
                    )
                })?;
                return Ok(Some(Negotiated {
                    size_bytes,
                    transmission_flags,
                    block_size,
                }));
            }
            REP_ERR_UNSUP => return Ok(None),
            reply_type if reply_type & REP_FLAG_ERROR != 0 => {
                // Politely end the session; the error below is what matters.
                let _ = send_option(stream, uri, OPT_ABORT, &[]);
                return Err(option_error(uri, export_name, reply_type, &data));
            }
            reply_type => {
                return Err(handshake_error(
                    uri,
                    io::ErrorKind::InvalidData,
                    &format!("unexpected reply type {reply_type:#x} to NBD_OPT_GO"),
                ))
            }
        }
    }
}

/// The old way in: `NBD_OPT_EXPORT_NAME`, which a server answers by closing the connection if
/// the export does not exist.
fn option_export_name(
    stream: &mut Stream,
    uri: &str,
    export_name: &str,
    no_zeroes: bool,
) -> io::Result<Negotiated> {
    send_option(stream, uri, OPT_EXPORT_NAME, export_name.as_bytes())?;
    let mut reply = [0u8; EXPORT_NAME_REPLY_BYTES];
    if let Err(e) = stream.read_exact(&mut reply) {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            return Err(handshake_error(
                uri,
                io::ErrorKind::NotFound,
                &format!(
                    "the server closed the connection when asked for export {export_name:?}; \
                     it probably does not exist"
                ),
            ));
        }
        return Err(handshake_io_error(
            uri,
            "the reply to NBD_OPT_EXPORT_NAME",
            e,
        ));
    }
    if !no_zeroes {
        let mut zeroes = [0u8; EXPORT_NAME_ZEROES_BYTES];
        read_handshake(stream, &mut zeroes, uri, "the reply to NBD_OPT_EXPORT_NAME")?;
    }
    let (size_bytes, transmission_flags) = decode_export_name_reply(&reply);
    Ok(Negotiated {
        size_bytes,
        transmission_flags,
        block_size: None,
    })
}

/// Validates what the server said and derives the request limits.
fn export_info(negotiated: &Negotiated) -> Result<ExportInfo, String> {
    // Without HAS_FLAGS the other bits mean nothing, so assume no optional features.
    let transmission_flags = if negotiated.transmission_flags & FLAG_HAS_FLAGS != 0 {
        negotiated.transmission_flags
    } else {
        0
    };
    let (minimum_block_bytes, max_request_bytes) = match negotiated.block_size {
        None => (1, DEFAULT_MAX_REQUEST_BYTES),
        Some(constraints) => request_limits(constraints)?,
    };
    Ok(ExportInfo {
        reported_size_bytes: negotiated.size_bytes,
        size_bytes: negotiated.size_bytes - negotiated.size_bytes % SECTOR_BYTES,
        transmission_flags,
        block_size: negotiated.block_size,
        minimum_block_bytes,
        max_request_bytes,
    })
}

/// Returns (minimum block size, largest request) for advertised constraints.
fn request_limits(constraints: BlockSizeConstraints) -> Result<(u32, u32), String> {
    let minimum = constraints.minimum_bytes;
    if !minimum.is_power_of_two() || minimum > MAX_MINIMUM_BLOCK_BYTES {
        return Err(format!(
            "the server advertised an invalid minimum block size of {minimum} bytes"
        ));
    }
    let maximum = constraints.maximum_payload_bytes;
    if maximum < minimum {
        return Err(format!(
            "the server advertised a maximum block size of {maximum} bytes, below its minimum \
             of {minimum}"
        ));
    }
    let capped = maximum.min(DEFAULT_MAX_REQUEST_BYTES);
    // Prefer pieces that are whole sectors so split requests stay sector aligned; fall back to
    // the minimum block size for servers whose maximum is below a sector.
    let sector_multiple = minimum.max(SECTOR_BYTES as u32);
    let max_request = if capped >= sector_multiple {
        capped - capped % sector_multiple
    } else {
        capped - capped % minimum
    };
    Ok((minimum, max_request))
}

fn send_option(stream: &mut Stream, uri: &str, option: u32, payload: &[u8]) -> io::Result<()> {
    let length_bytes = u32::try_from(payload.len()).map_err(|_| {
        handshake_error(uri, io::ErrorKind::InvalidInput, "option payload too large")
    })?;
    let header = OptionHeader {
        option,
        length_bytes,
    }
    .encode();
    write_all_vectored(stream, &[&header, payload])
        .map_err(|e| handshake_io_error(uri, "sending an option", e))
}

/// Turns an option error reply into one clear line.
fn option_error(uri: &str, export_name: &str, reply_type: u32, data: &[u8]) -> io::Error {
    let (kind, what) = match reply_type {
        REP_ERR_UNKNOWN => (
            io::ErrorKind::NotFound,
            format!("export {export_name:?} not found on the server"),
        ),
        REP_ERR_POLICY => (
            io::ErrorKind::PermissionDenied,
            format!("the server refused access to export {export_name:?}"),
        ),
        REP_ERR_TLS_REQD => (
            io::ErrorKind::Unsupported,
            "the server requires TLS, which logcache's NBD client does not support".to_owned(),
        ),
        REP_ERR_SHUTDOWN => (
            io::ErrorKind::ConnectionAborted,
            "the server is shutting down".to_owned(),
        ),
        REP_ERR_INVALID => (
            io::ErrorKind::InvalidInput,
            format!("the server rejected the request for export {export_name:?} as invalid"),
        ),
        REP_ERR_BLOCK_SIZE_REQD => (
            io::ErrorKind::Unsupported,
            "the server insists on block size negotiation it did not complete".to_owned(),
        ),
        other => (
            io::ErrorKind::Other,
            format!(
                "the server refused export {export_name:?} (error {:#x})",
                other & !REP_FLAG_ERROR
            ),
        ),
    };
    let message = one_line(data);
    let text = if message.is_empty() {
        what
    } else {
        format!("{what}: {message}")
    };
    handshake_error(uri, kind, &text)
}

/// A server-supplied message made safe to print on one line.
fn one_line(data: &[u8]) -> String {
    let text = String::from_utf8_lossy(data);
    let mut line: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(MAX_SERVER_MESSAGE_CHARS)
        .collect();
    if text.chars().count() > MAX_SERVER_MESSAGE_CHARS {
        line.push('…');
    }
    line.trim().to_owned()
}

fn read_handshake(stream: &mut Stream, buf: &mut [u8], uri: &str, what: &str) -> io::Result<()> {
    stream
        .read_exact(buf)
        .map_err(|e| handshake_io_error(uri, what, e))
}

fn write_handshake(stream: &mut Stream, bytes: &[u8], uri: &str) -> io::Result<()> {
    stream
        .write_all(bytes)
        .map_err(|e| handshake_io_error(uri, "sending the client flags", e))
}

fn handshake_io_error(uri: &str, what: &str, e: io::Error) -> io::Error {
    let text = match e.kind() {
        io::ErrorKind::UnexpectedEof => {
            format!("the server closed the connection during the handshake (reading {what})")
        }
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => format!(
            "no answer from the server within {} s (waiting for {what})",
            HANDSHAKE_TIMEOUT.as_secs()
        ),
        _ => format!("handshake failed ({what}): {e}"),
    };
    handshake_error(uri, e.kind(), &text)
}

fn handshake_error(uri: &str, kind: io::ErrorKind, text: &str) -> io::Error {
    io::Error::new(kind, format!("{uri}: {text}"))
}

fn prefix_error(uri: &str, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{uri}: {e}"))
}

// --- Transport ---------------------------------------------------------------------------------

fn connect_tcp(host: &str, port: u16) -> io::Result<TcpStream> {
    let mut last_error = None;
    for address in (host, port).to_socket_addrs()? {
        match TcpStream::connect_timeout(&address, HANDSHAKE_TIMEOUT) {
            Ok(stream) => return Ok(stream),
            Err(e) => last_error = Some(e),
        }
    }
    Err(last_error.unwrap_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            "the host name resolved to no address",
        )
    }))
}

/// Writes every part, in order, with as few system calls as the kernel allows (a request header
/// and its payload usually go in one `writev`).
fn write_all_vectored(writer: &mut impl Write, parts: &[&[u8]]) -> io::Result<()> {
    let mut slices: Vec<IoSlice<'_>> = parts
        .iter()
        .filter(|part| !part.is_empty())
        .map(|part| IoSlice::new(part))
        .collect();
    let mut remaining = &mut slices[..];
    while !remaining.is_empty() {
        match writer.write_vectored(remaining) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(written) => IoSlice::advance_slices(&mut remaining, written),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The two socket kinds, behind one Read/Write.
enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    fn set_timeouts(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => {
                s.set_read_timeout(timeout)?;
                s.set_write_timeout(timeout)
            }
            Stream::Unix(s) => {
                s.set_read_timeout(timeout)?;
                s.set_write_timeout(timeout)
            }
        }
    }

    fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.shutdown(how),
            Stream::Unix(s) => s.shutdown(how),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write_vectored(bufs),
            Stream::Unix(s) => s.write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! The client against scripted fake servers built from this crate's server-side encoders,
    //! for the cases real servers will not produce on demand (bad cookies, protocol violations,
    //! error codes). `crates/server/tests/nbd_backing.rs` covers real servers.

    use super::*;
    use crate::consts::{
        CMD_FLAG_FUA, EINVAL, EIO, ENOSPC, ENOTSUP, EPERM, ESHUTDOWN, FLAG_SEND_FLUSH,
        OPTION_HEADER_BYTES, REQUEST_HEADER_BYTES,
    };
    use crate::handshake::{decode_client_flags, decode_option_header, encode_greeting};
    use crate::option_reply::{encode_ack, encode_error, encode_export_name_reply};
    use crate::reply::ChunkHeader;
    use std::thread::{self, JoinHandle};

    const URI: &str = "nbd+unix:///disk?socket=/fake";
    const ALL_FLAGS: u16 =
        FLAG_HAS_FLAGS | FLAG_SEND_FLUSH | FLAG_SEND_FUA | FLAG_SEND_TRIM | FLAG_CAN_MULTI_CONN;

    type Log = Vec<(Command, u16, u64, u32)>;

    /// Runs `server` on one end of a socket pair and the client handshake on the other.
    fn start<T: Send + 'static>(
        server: impl FnOnce(UnixStream) -> T + Send + 'static,
    ) -> (io::Result<Client>, JoinHandle<T>) {
        let (client_end, server_end) = UnixStream::pair().unwrap();
        let handle = thread::spawn(move || server(server_end));
        (
            handshake(Stream::Unix(client_end), URI, "disk", REQUEST_TIMEOUT),
            handle,
        )
    }

    fn greet(s: &mut UnixStream, handshake_flags: u16) -> ClientFlags {
        s.write_all(&encode_greeting(handshake_flags)).unwrap();
        let mut flags = [0u8; 4];
        s.read_exact(&mut flags).unwrap();
        decode_client_flags(&flags, handshake_flags).expect("client sent unadvertised flags")
    }

    fn read_option(s: &mut UnixStream) -> (u32, Vec<u8>) {
        let mut header = [0u8; OPTION_HEADER_BYTES];
        s.read_exact(&mut header).unwrap();
        let header = decode_option_header(&header, DEFAULT_MAX_OPTION_BYTES).unwrap();
        let mut payload = vec![0u8; header.length_bytes as usize];
        s.read_exact(&mut payload).unwrap();
        (header.option, payload)
    }

    /// A well-behaved fixed-newstyle handshake ending in `NBD_OPT_GO` success.
    fn accept_go(
        s: &mut UnixStream,
        size_bytes: u64,
        transmission_flags: u16,
        block_size: Option<BlockSizeConstraints>,
    ) {
        let flags = greet(s, FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
        assert!(flags.fixed_newstyle && flags.no_zeroes);
        let (option, payload) = read_option(s);
        assert_eq!(option, OPT_GO);
        let request = InfoRequest::decode(&payload).unwrap();
        assert_eq!(request.export_name, "disk");
        assert!(request.info_types.contains(&INFO_BLOCK_SIZE));
        let export = Info::Export {
            size_bytes,
            transmission_flags,
        };
        s.write_all(&export.encode_reply(OPT_GO).unwrap()).unwrap();
        if let Some(constraints) = block_size {
            let reply = Info::BlockSize(constraints).encode_reply(OPT_GO).unwrap();
            s.write_all(&reply).unwrap();
        }
        // An item the client does not know must be ignored.
        let unknown = Info::Unknown {
            info_type: 77,
            data: vec![1, 2, 3],
        };
        s.write_all(&unknown.encode_reply(OPT_GO).unwrap()).unwrap();
        s.write_all(&encode_ack(OPT_GO)).unwrap();
    }

    /// Reads one request and its write payload; `None` at end of stream.
    fn read_request(s: &mut UnixStream) -> Option<(Request, Vec<u8>)> {
        let mut header = [0u8; REQUEST_HEADER_BYTES];
        s.read_exact(&mut header).ok()?;
        let request = Request::decode(&header).unwrap();
        let mut payload = vec![0u8; request.payload_length_bytes() as usize];
        s.read_exact(&mut payload).unwrap();
        Some((request, payload))
    }

    fn reply(s: &mut UnixStream, cookie: u64, error: u32, data: &[u8]) {
        s.write_all(&SimpleReply { error, cookie }.encode())
            .unwrap();
        s.write_all(data).unwrap();
    }

    /// Serves a RAM disk until `NBD_CMD_DISC` or end of stream, failing requests over
    /// `max_request_bytes` with EINVAL as a strict server would. Returns the request log.
    fn serve_disk(s: &mut UnixStream, disk: &mut [u8], max_request_bytes: u32) -> Log {
        let mut log = Vec::new();
        while let Some((request, payload)) = read_request(s) {
            let r = &request;
            log.push((r.command, r.flags, r.offset_bytes, r.length_bytes));
            let start = r.offset_bytes as usize;
            let end = start + r.length_bytes as usize;
            match r.command {
                Command::Disconnect => break,
                _ if r.length_bytes > max_request_bytes => reply(s, r.cookie, EINVAL, &[]),
                Command::Read => {
                    let data = disk[start..end].to_vec();
                    reply(s, r.cookie, 0, &data);
                }
                Command::Write => {
                    disk[start..end].copy_from_slice(&payload);
                    reply(s, r.cookie, 0, &[]);
                }
                Command::Trim => {
                    disk[start..end].fill(0);
                    reply(s, r.cookie, 0, &[]);
                }
                _ => reply(s, r.cookie, 0, &[]),
            }
        }
        log
    }

    fn pattern(len_bytes: usize, seed: u8) -> Vec<u8> {
        (0..len_bytes)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    #[test]
    fn handshake_learns_size_flags_and_limits() {
        let constraints = BlockSizeConstraints {
            minimum_bytes: 1,
            preferred_bytes: 4096,
            maximum_payload_bytes: 0xffff_ffff,
        };
        let (client, server) = start(move |mut s| {
            accept_go(&mut s, (1 << 20) + 100, ALL_FLAGS, Some(constraints));
            serve_disk(&mut s, &mut [], 0)
        });
        let client = client.unwrap();
        let info = *client.info();
        assert_eq!(info.reported_size_bytes, (1 << 20) + 100);
        // Rounded down to whole sectors.
        assert_eq!(info.size_bytes, 1 << 20);
        assert_eq!(client.size_bytes(), 1 << 20);
        assert_eq!(info.transmission_flags, ALL_FLAGS);
        assert!(info.can_flush() && info.can_fua() && info.can_trim() && info.can_multi_conn());
        assert!(!info.is_read_only());
        assert_eq!(info.block_size, Some(constraints));
        assert_eq!(info.minimum_block_bytes, 1);
        // A huge advertised maximum is capped.
        assert_eq!(info.max_request_bytes, DEFAULT_MAX_REQUEST_BYTES);
        assert_eq!(client.uri(), URI);
        assert_eq!(client.export_name(), "disk");
        client.disconnect().unwrap();
        let log = server.join().unwrap();
        assert_eq!(log.len(), 1);
        assert_eq!(log[0].0, Command::Disconnect);
    }

    #[test]
    fn large_requests_are_split_at_the_maximum_and_round_trip() {
        let constraints = BlockSizeConstraints {
            minimum_bytes: 512,
            preferred_bytes: 4096,
            maximum_payload_bytes: 4096,
        };
        let (client, server) = start(move |mut s| {
            accept_go(&mut s, 1 << 20, ALL_FLAGS, Some(constraints));
            let mut disk = vec![0u8; 1 << 20];
            let log = serve_disk(&mut s, &mut disk, 4096);
            (log, disk)
        });
        let mut client = client.unwrap();
        assert_eq!(client.info().max_request_bytes, 4096);
        let data = pattern(3 * 4096 + 512, 7);
        client.write_at(&data, 8192 + 512, false).unwrap();
        let mut back = vec![0u8; data.len()];
        client.read_at(&mut back, 8192 + 512).unwrap();
        assert!(back == data);
        client.trim(100_000, 10_000).unwrap();
        client.write_at(&data[..512], 0, true).unwrap();
        drop(client);
        let (log, disk) = server.join().unwrap();
        assert!(disk[8192 + 512..8192 + 512 + data.len()] == data[..]);
        let writes: Vec<_> = log.iter().filter(|e| e.0 == Command::Write).collect();
        let reads: Vec<_> = log.iter().filter(|e| e.0 == Command::Read).collect();
        let trims: Vec<_> = log.iter().filter(|e| e.0 == Command::Trim).collect();
        assert_eq!(writes.len(), 5);
        assert_eq!(reads.len(), 4);
        assert_eq!(
            writes[..4].iter().map(|e| (e.2, e.3)).collect::<Vec<_>>(),
            [(8704, 4096), (12800, 4096), (16896, 4096), (20992, 512)]
        );
        assert_eq!(
            trims.iter().map(|e| (e.2, e.3)).collect::<Vec<_>>(),
            [(100_000, 4096), (104_096, 4096), (108_192, 1808)]
        );
        // FUA is sent natively when advertised, and only then.
        assert_eq!(writes[4].1, CMD_FLAG_FUA);
        assert!(writes[..4].iter().all(|e| e.1 == 0));
        assert_eq!(log.last().unwrap().0, Command::Disconnect);
    }

    #[test]
    fn fua_without_server_support_becomes_write_then_flush() {
        let (client, server) = start(|mut s| {
            accept_go(&mut s, 8192, FLAG_HAS_FLAGS | FLAG_SEND_FLUSH, None);
            serve_disk(&mut s, &mut [0u8; 8192], u32::MAX)
        });
        let mut client = client.unwrap();
        assert_eq!(client.info().max_request_bytes, DEFAULT_MAX_REQUEST_BYTES);
        client.write_at(&[1u8; 512], 512, true).unwrap();
        drop(client);
        let log = server.join().unwrap();
        let commands: Vec<_> = log.iter().map(|e| (e.0, e.1)).collect();
        assert_eq!(
            commands,
            [
                (Command::Write, 0),
                (Command::Flush, 0),
                (Command::Disconnect, 0)
            ]
        );
    }

    #[test]
    fn flush_and_trim_without_server_support_send_nothing() {
        let (client, server) = start(|mut s| {
            accept_go(&mut s, 8192, FLAG_HAS_FLAGS, None);
            serve_disk(&mut s, &mut [0u8; 8192], u32::MAX)
        });
        let mut client = client.unwrap();
        client.flush().unwrap();
        let e = client.trim(0, 512).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::Unsupported);
        assert!(!client.is_broken());
        drop(client);
        let log = server.join().unwrap();
        assert_eq!(log.len(), 1, "{log:?}");
        assert_eq!(log[0].0, Command::Disconnect);
    }

    #[test]
    fn server_errors_map_to_errno_and_keep_the_connection() {
        let wire_errors = [EPERM, EIO, ENOSPC, EINVAL, ENOTSUP, 12, 75, 9999];
        let (client, server) = start(move |mut s| {
            accept_go(&mut s, 8192, ALL_FLAGS, None);
            for error in wire_errors {
                let (request, _) = read_request(&mut s).unwrap();
                reply(&mut s, request.cookie, error, &[]);
            }
            serve_disk(&mut s, &mut [9u8; 8192], u32::MAX)
        });
        let mut client = client.unwrap();
        let expected = [
            libc::EPERM,
            libc::EIO,
            libc::ENOSPC,
            libc::EINVAL,
            libc::ENOTSUP,
            libc::ENOMEM,
            libc::EOVERFLOW,
            libc::EIO,
        ];
        let mut buf = [0u8; 512];
        for (index, errno) in expected.into_iter().enumerate() {
            let e = if index % 2 == 0 {
                client.read_at(&mut buf, 0).unwrap_err()
            } else {
                client.write_at(&buf, 0, false).unwrap_err()
            };
            assert_eq!(e.raw_os_error(), Some(errno), "{e}");
            assert!(!client.is_broken());
        }
        // The stream stayed in step: the next read gets its data.
        client.read_at(&mut buf, 512).unwrap();
        assert_eq!(buf, [9u8; 512]);
        drop(client);
        server.join().unwrap();
    }

    #[test]
    fn wrong_cookie_breaks_the_connection_for_good() {
        let (client, server) = start(|mut s| {
            accept_go(&mut s, 8192, ALL_FLAGS, None);
            let (request, _) = read_request(&mut s).unwrap();
            reply(&mut s, request.cookie + 100, 0, &[]);
            // The client must close without sending anything more.
            read_request(&mut s).map(|(r, _)| r.command)
        });
        let mut client = client.unwrap();
        let mut buf = [0u8; 512];
        let e = client.read_at(&mut buf, 0).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("cookie"), "{e}");
        assert!(e.to_string().contains(URI), "{e}");
        assert!(client.is_broken());
        assert!(client.broken_reason().unwrap().contains("cookie"));
        assert!(!client.broken_reason().unwrap().contains(URI));
        for e in [
            client.read_at(&mut buf, 0).unwrap_err(),
            client.write_at(&buf, 0, false).unwrap_err(),
            client.flush().unwrap_err(),
            client.trim(0, 512).unwrap_err(),
        ] {
            assert_eq!(e.kind(), io::ErrorKind::NotConnected);
            assert!(e.to_string().contains("cookie"), "{e}");
            assert!(e.to_string().contains("not reconnecting"), "{e}");
        }
        assert!(client.disconnect().is_err());
        assert_eq!(server.join().unwrap(), None);
    }

    #[test]
    fn end_of_stream_breaks_the_connection() {
        let (client, server) = start(|mut s| {
            accept_go(&mut s, 8192, ALL_FLAGS, None);
            // Answer one request, then die halfway through the data of the next.
            let (request, _) = read_request(&mut s).unwrap();
            reply(&mut s, request.cookie, 0, &[]);
            let (request, _) = read_request(&mut s).unwrap();
            reply(&mut s, request.cookie, 0, &[0u8; 100]);
        });
        let mut client = client.unwrap();
        client.flush().unwrap();
        let mut buf = [0u8; 512];
        let e = client.read_at(&mut buf, 0).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        assert!(e.to_string().contains("closed the connection"), "{e}");
        server.join().unwrap();
        let e = client.flush().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotConnected);
    }

    #[test]
    fn server_gone_before_a_request_is_an_error() {
        let (client, server) = start(|mut s| accept_go(&mut s, 8192, ALL_FLAGS, None));
        let mut client = client.unwrap();
        server.join().unwrap();
        // Either the send or the reply read fails; both mark the connection broken.
        assert!(client.write_at(&[0u8; 512], 0, false).is_err());
        assert!(client.is_broken());
    }

    #[test]
    fn structured_reply_is_a_protocol_violation() {
        let (client, server) = start(|mut s| {
            accept_go(&mut s, 8192, ALL_FLAGS, None);
            let (request, _) = read_request(&mut s).unwrap();
            let chunk = ChunkHeader {
                flags: 1,
                reply_type: 0,
                cookie: request.cookie,
                length_bytes: 0,
            };
            s.write_all(&chunk.encode()).unwrap();
        });
        let mut client = client.unwrap();
        let e = client.read_at(&mut [0u8; 512], 0).unwrap_err();
        assert!(e.to_string().contains("structured reply"), "{e}");
        assert!(client.is_broken());
        server.join().unwrap();
    }

    #[test]
    fn eshutdown_makes_the_client_disconnect() {
        let (client, server) = start(|mut s| {
            accept_go(&mut s, 8192, ALL_FLAGS, None);
            let (request, _) = read_request(&mut s).unwrap();
            reply(&mut s, request.cookie, ESHUTDOWN, &[]);
            read_request(&mut s).map(|(r, _)| r.command)
        });
        let mut client = client.unwrap();
        let e = client.flush().unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ESHUTDOWN));
        assert_eq!(server.join().unwrap(), Some(Command::Disconnect));
        let e = client.flush().unwrap_err();
        assert!(e.to_string().contains("shutting down"), "{e}");
    }

    #[test]
    fn read_only_exports_refuse_writes_locally() {
        let (client, server) = start(|mut s| {
            accept_go(&mut s, 8192, ALL_FLAGS | FLAG_READ_ONLY, None);
            serve_disk(&mut s, &mut [5u8; 8192], u32::MAX)
        });
        let mut client = client.unwrap();
        assert!(client.info().is_read_only());
        let e = client.write_at(&[0u8; 512], 0, false).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EROFS));
        let e = client.trim(0, 512).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EROFS));
        let mut buf = [0u8; 512];
        client.read_at(&mut buf, 0).unwrap();
        assert_eq!(buf, [5u8; 512]);
        drop(client);
        let log = server.join().unwrap();
        assert_eq!(
            log.len(),
            2,
            "only the read and DISC reach the server: {log:?}"
        );
    }

    #[test]
    fn out_of_range_requests_are_refused_locally() {
        let (client, server) = start(|mut s| {
            accept_go(&mut s, 8192 + 7, ALL_FLAGS, None);
            serve_disk(&mut s, &mut [0u8; 8192], u32::MAX)
        });
        let mut client = client.unwrap();
        let mut buf = [0u8; 512];
        for e in [
            client.read_at(&mut buf, 8192).unwrap_err(),
            client.write_at(&buf, 7680 + 1, false).unwrap_err(),
            client.trim(u64::MAX, 2).unwrap_err(),
        ] {
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
            assert!(e.to_string().contains("past the end"), "{e}");
        }
        // Zero-length calls succeed without a round trip.
        client.read_at(&mut [], 0).unwrap();
        client.write_at(&[], 8192, false).unwrap();
        client.trim(8192, 0).unwrap();
        assert!(!client.is_broken());
        drop(client);
        assert_eq!(server.join().unwrap().len(), 1);
    }

    #[test]
    fn unknown_export_is_one_clear_line() {
        let (client, server) = start(|mut s| {
            greet(&mut s, FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
            let (option, _) = read_option(&mut s);
            assert_eq!(option, OPT_GO);
            let reply = encode_error(OPT_GO, REP_ERR_UNKNOWN, "no such\nexport").unwrap();
            s.write_all(&reply).unwrap();
            // The client says goodbye with NBD_OPT_ABORT.
            read_option(&mut s).0
        });
        let e = client.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        let text = e.to_string();
        assert!(text.starts_with(URI), "{text}");
        assert!(text.contains("\"disk\" not found"), "{text}");
        assert!(text.contains("no such export"), "{text}");
        assert!(!text.contains('\n'), "{text}");
        assert_eq!(server.join().unwrap(), OPT_ABORT);
    }

    #[test]
    fn option_errors_have_specific_messages() {
        for (reply_type, kind, needle) in [
            (REP_ERR_POLICY, io::ErrorKind::PermissionDenied, "refused"),
            (REP_ERR_TLS_REQD, io::ErrorKind::Unsupported, "TLS"),
            (
                REP_ERR_SHUTDOWN,
                io::ErrorKind::ConnectionAborted,
                "shutting down",
            ),
            (REP_ERR_INVALID, io::ErrorKind::InvalidInput, "invalid"),
            (REP_FLAG_ERROR | 50, io::ErrorKind::Other, "error 0x32"),
        ] {
            let (client, server) = start(move |mut s| {
                greet(&mut s, FLAG_FIXED_NEWSTYLE);
                read_option(&mut s);
                s.write_all(&encode_error(OPT_GO, reply_type, "").unwrap())
                    .unwrap();
            });
            let e = client.unwrap_err();
            assert_eq!(e.kind(), kind, "{e}");
            assert!(e.to_string().contains(needle), "{e}");
            server.join().unwrap();
        }
    }

    #[test]
    fn servers_without_opt_go_get_opt_export_name() {
        let (client, server) = start(|mut s| {
            // Fixed newstyle without NO_ZEROES, and no NBD_OPT_GO.
            let flags = greet(&mut s, FLAG_FIXED_NEWSTYLE);
            assert!(!flags.no_zeroes);
            let (option, _) = read_option(&mut s);
            assert_eq!(option, OPT_GO);
            s.write_all(&encode_error(OPT_GO, REP_ERR_UNSUP, "").unwrap())
                .unwrap();
            let (option, name) = read_option(&mut s);
            assert_eq!((option, name.as_slice()), (OPT_EXPORT_NAME, &b"disk"[..]));
            s.write_all(&encode_export_name_reply(4096, ALL_FLAGS, false))
                .unwrap();
            serve_disk(&mut s, &mut [3u8; 4096], u32::MAX)
        });
        let mut client = client.unwrap();
        assert_eq!(client.size_bytes(), 4096);
        assert_eq!(client.info().block_size, None);
        let mut buf = [0u8; 1024];
        client.read_at(&mut buf, 1024).unwrap();
        assert_eq!(buf, [3u8; 1024]);
        drop(client);
        server.join().unwrap();
    }

    #[test]
    fn plain_newstyle_server_gets_opt_export_name_and_its_eof_means_unknown_export() {
        let (client, server) = start(|mut s| {
            let flags = greet(&mut s, 0);
            assert_eq!(flags, ClientFlags::default());
            let (option, _) = read_option(&mut s);
            assert_eq!(option, OPT_EXPORT_NAME);
            // Unknown export: a server can only hang up.
        });
        let e = client.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(e.to_string().contains("\"disk\""), "{e}");
        server.join().unwrap();
    }

    #[test]
    fn oldstyle_and_non_nbd_servers_are_refused_clearly() {
        let (client, server) = start(|mut s| {
            let mut greeting = Vec::new();
            greeting.extend_from_slice(&NBDMAGIC.to_be_bytes());
            greeting.extend_from_slice(&OLDSTYLE_MAGIC.to_be_bytes());
            greeting.extend_from_slice(&[0u8; 2]);
            let _ = s.write_all(&greeting);
        });
        let e = client.unwrap_err();
        assert!(e.to_string().contains("oldstyle"), "{e}");
        server.join().unwrap();

        let (client, server) = start(|mut s| {
            let _ = s.write_all(b"SSH-2.0-OpenSSH_9.2\r\n");
        });
        let e = client.unwrap_err();
        assert!(e.to_string().contains("not an NBD server"), "{e}");
        server.join().unwrap();

        let (client, server) = start(drop::<UnixStream>);
        let e = client.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        assert!(e.to_string().contains("during the handshake"), "{e}");
        server.join().unwrap();
    }

    #[test]
    fn handshake_protocol_violations_are_errors() {
        // ACK without the export size.
        let (client, server) = start(|mut s| {
            greet(&mut s, FLAG_FIXED_NEWSTYLE);
            read_option(&mut s);
            s.write_all(&encode_ack(OPT_GO)).unwrap();
        });
        assert!(client.unwrap_err().to_string().contains("export size"));
        server.join().unwrap();

        // A huge reply length must not be allocated.
        let (client, server) = start(|mut s| {
            greet(&mut s, FLAG_FIXED_NEWSTYLE);
            read_option(&mut s);
            let header = OptionReplyHeader {
                option: OPT_GO,
                reply_type: REP_INFO,
                length_bytes: u32::MAX,
            };
            s.write_all(&header.encode()).unwrap();
        });
        assert!(client.unwrap_err().to_string().contains("limit"));
        server.join().unwrap();

        // Invalid block size constraints.
        for (minimum_bytes, maximum_payload_bytes) in [(3, 4096), (1 << 17, 1 << 20), (4096, 512)] {
            let constraints = BlockSizeConstraints {
                minimum_bytes,
                preferred_bytes: 4096,
                maximum_payload_bytes,
            };
            let (client, server) =
                start(move |mut s| accept_go(&mut s, 8192, ALL_FLAGS, Some(constraints)));
            let e = client.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData);
            assert!(e.to_string().contains("block size"), "{e}");
            server.join().unwrap();
        }
    }

    #[test]
    fn request_limits_prefer_whole_sectors() {
        let limits = |minimum_bytes, maximum_payload_bytes| {
            request_limits(BlockSizeConstraints {
                minimum_bytes,
                preferred_bytes: 4096,
                maximum_payload_bytes,
            })
        };
        assert_eq!(limits(1, 65536), Ok((1, 65536)));
        assert_eq!(limits(1, 65537), Ok((1, 65536)));
        assert_eq!(limits(4096, 1 << 30), Ok((4096, DEFAULT_MAX_REQUEST_BYTES)));
        assert_eq!(limits(1, 100), Ok((1, 100)));
        assert_eq!(limits(64, 300), Ok((64, 256)));
        assert!(limits(0, 512).is_err());
    }

    #[test]
    fn connect_errors_name_the_uri() {
        let text = "nbd+unix:///x?socket=/nonexistent/logcache-test.sock";
        let e = Client::connect_str(text).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(e.to_string().starts_with(text), "{e}");
        let e = Client::connect_str("nbds://host/x").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("TLS"), "{e}");
    }

    #[test]
    fn write_all_vectored_handles_short_writes() {
        /// Accepts at most 3 bytes per call, to force partial progress through the slices.
        struct Trickle(Vec<u8>);
        impl Write for Trickle {
            fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
                let n = buf.len().min(3);
                self.0.extend_from_slice(&buf[..n]);
                Ok(n)
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let mut sink = Trickle(Vec::new());
        write_all_vectored(&mut sink, &[b"abcde", b"", b"fghij"]).unwrap();
        assert_eq!(sink.0, b"abcdefghij");
    }
}
