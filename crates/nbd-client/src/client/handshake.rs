//! The client side of the fixed-newstyle handshake: greeting, `NBD_OPT_GO` with
//! `INFO_BLOCK_SIZE` (or `NBD_OPT_EXPORT_NAME` for servers without it), and the checks that turn
//! what the server said into an [`ExportInfo`]. Every error is one line naming the URI.

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::time::Duration;

use logcache_nbd::consts::{
    DEFAULT_MAX_OPTION_BYTES, EXPORT_NAME_REPLY_BYTES, EXPORT_NAME_ZEROES_BYTES,
    FLAG_CAN_MULTI_CONN, FLAG_FIXED_NEWSTYLE, FLAG_HAS_FLAGS, FLAG_NO_ZEROES, FLAG_READ_ONLY,
    FLAG_SEND_FLUSH, FLAG_SEND_FUA, FLAG_SEND_TRIM, FLAG_SEND_WRITE_ZEROES, GREETING_BYTES,
    INFO_BLOCK_SIZE, INFO_EXPORT, NBDMAGIC, OLDSTYLE_MAGIC, OPTION_REPLY_HEADER_BYTES, OPT_ABORT,
    OPT_EXPORT_NAME, OPT_GO, OPT_SET_META_CONTEXT, OPT_STARTTLS, OPT_STRUCTURED_REPLY, REP_ACK,
    REP_ERR_BLOCK_SIZE_REQD, REP_ERR_INVALID, REP_ERR_POLICY, REP_ERR_SHUTDOWN, REP_ERR_TLS_REQD,
    REP_ERR_UNKNOWN, REP_ERR_UNSUP, REP_FLAG_ERROR, REP_INFO, REP_META_CONTEXT,
};
use logcache_nbd::handshake::{
    decode_greeting, ClientFlags, InfoRequest, MetaContextRequest, OptionHeader,
};
use logcache_nbd::option_reply::{
    decode_export_name_reply, BlockSizeConstraints, Info, OptionReplyHeader,
};

use super::stream::{write_all_vectored, Stream};
use super::tls::{self, TlsTarget};
use super::{
    prefix_error, Client, DEFAULT_MAX_REQUEST_BYTES, HANDSHAKE_TIMEOUT, MAX_MINIMUM_BLOCK_BYTES,
    MAX_SERVER_MESSAGE_CHARS, SECTOR_BYTES,
};

/// The one metadata context logcache asks an NBD backing for.
const BASE_ALLOCATION: &str = "base:allocation";

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

    pub fn can_write_zeroes(&self) -> bool {
        self.transmission_flags & FLAG_SEND_WRITE_ZEROES != 0
    }

    /// Whether a flush on one connection covers writes completed on every other connection.
    pub fn can_multi_conn(&self) -> bool {
        self.transmission_flags & FLAG_CAN_MULTI_CONN != 0
    }
}

/// Size, flags and block sizes as negotiated, before validation.
struct Negotiated {
    size_bytes: u64,
    transmission_flags: u16,
    block_size: Option<BlockSizeConstraints>,
    /// The id the server gave `base:allocation`, when block status was asked for and offered.
    base_allocation_id: Option<u32>,
}

/// How long the handshake may take, and then each request.
#[derive(Debug, Clone, Copy)]
pub(super) struct HandshakeTimeouts {
    pub(super) handshake: Duration,
    pub(super) request: Duration,
}

impl HandshakeTimeouts {
    /// The handshake gets the shorter of the request timeout and its own 30 s.
    pub(super) fn for_requests(request: Duration) -> HandshakeTimeouts {
        HandshakeTimeouts {
            handshake: HANDSHAKE_TIMEOUT.min(request),
            request,
        }
    }
}

/// Runs the fixed-newstyle handshake on a connected stream and returns a client in the
/// transmission phase.
#[cfg(test)]
pub(super) fn handshake(
    stream: Stream,
    uri: &str,
    export_name: &str,
    request_timeout: Duration,
) -> io::Result<Client> {
    handshake_with_tls(
        stream,
        uri,
        export_name,
        HandshakeTimeouts::for_requests(request_timeout),
        None,
        false,
    )
}

/// [`handshake`], starting TLS first when `tls` is given (an `nbds` URI): STARTTLS is the first
/// option, so nothing else is said in the clear.
pub(super) fn handshake_with_tls(
    mut stream: Stream,
    uri: &str,
    export_name: &str,
    timeouts: HandshakeTimeouts,
    tls: Option<TlsTarget<'_>>,
    block_status: bool,
) -> io::Result<Client> {
    let HandshakeTimeouts {
        handshake: handshake_timeout,
        request: request_timeout,
    } = timeouts;
    stream
        .set_timeouts(Some(handshake_timeout))
        .map_err(|e| prefix_error(uri, e))?;
    let client_flags = greet(&mut stream, uri).inspect_err(|_| {
        let _ = stream.shutdown(Shutdown::Both);
    })?;
    if let Some(target) = &tls {
        if !client_flags.fixed_newstyle {
            let _ = stream.shutdown(Shutdown::Both);
            return Err(handshake_error(
                uri,
                io::ErrorKind::Unsupported,
                "the server does not speak fixed newstyle, so it cannot start TLS",
            ));
        }
        option_starttls(&mut stream, uri).inspect_err(|_| {
            let _ = stream.shutdown(Shutdown::Both);
        })?;
        stream = tls::connect(stream, uri, target)?;
    }
    let base_allocation_id = if block_status && client_flags.fixed_newstyle {
        option_base_allocation(&mut stream, uri, export_name).inspect_err(|_| {
            let _ = stream.shutdown(Shutdown::Both);
        })?
    } else {
        None
    };
    let mut negotiated =
        negotiate(&mut stream, uri, export_name, client_flags).inspect_err(|_| {
            // Leave the server a clean end of stream rather than a half-finished handshake.
            let _ = stream.shutdown(Shutdown::Both);
        })?;
    negotiated.base_allocation_id = base_allocation_id;
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
        base_allocation_id: negotiated.base_allocation_id,
    })
}

/// Reads the greeting and answers with the client flags.
fn greet(stream: &mut Stream, uri: &str) -> io::Result<ClientFlags> {
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
    Ok(client_flags)
}

/// Structured replies, then `NBD_OPT_SET_META_CONTEXT` for `base:allocation`: the context id,
/// or `None` if the server offers neither (block status then says "data" for everything).
fn option_base_allocation(
    stream: &mut Stream,
    uri: &str,
    export_name: &str,
) -> io::Result<Option<u32>> {
    send_option(stream, uri, OPT_STRUCTURED_REPLY, &[])?;
    let (header, _) = read_option_reply(stream, uri, OPT_STRUCTURED_REPLY)?;
    if header.reply_type != REP_ACK {
        return Ok(None);
    }
    let request = MetaContextRequest {
        export_name: export_name.to_owned(),
        queries: vec![BASE_ALLOCATION.to_owned()],
    }
    .encode()
    .map_err(|e| handshake_error(uri, io::ErrorKind::InvalidInput, &e.to_string()))?;
    send_option(stream, uri, OPT_SET_META_CONTEXT, &request)?;
    let mut id = None;
    loop {
        let (header, data) = read_option_reply(stream, uri, OPT_SET_META_CONTEXT)?;
        match header.reply_type {
            REP_ACK => return Ok(id),
            REP_META_CONTEXT if data.len() >= 4 && &data[4..] == BASE_ALLOCATION.as_bytes() => {
                id = Some(u32::from_be_bytes([data[0], data[1], data[2], data[3]]));
            }
            REP_META_CONTEXT => {}
            // An error (the server knows no contexts): block status is not available.
            _ if header.is_error() => return Ok(None),
            other => {
                return Err(handshake_error(
                    uri,
                    io::ErrorKind::InvalidData,
                    &format!("unexpected reply {other:#x} to NBD_OPT_SET_META_CONTEXT"),
                ))
            }
        }
    }
}

/// One option reply to `option`: its header and data (bounded by the option size cap).
fn read_option_reply(
    stream: &mut Stream,
    uri: &str,
    option: u32,
) -> io::Result<(OptionReplyHeader, Vec<u8>)> {
    let mut header_bytes = [0u8; OPTION_REPLY_HEADER_BYTES];
    read_handshake(stream, &mut header_bytes, uri, "an option reply")?;
    let header = OptionReplyHeader::decode(&header_bytes)
        .map_err(|e| handshake_error(uri, io::ErrorKind::InvalidData, &e.to_string()))?;
    if header.length_bytes > DEFAULT_MAX_OPTION_BYTES || header.option != option {
        return Err(handshake_error(
            uri,
            io::ErrorKind::InvalidData,
            "the server's option reply is malformed",
        ));
    }
    let mut data = vec![0u8; header.length_bytes as usize];
    read_handshake(stream, &mut data, uri, "an option reply")?;
    Ok((header, data))
}

/// `NBD_OPT_STARTTLS`: the server must acknowledge it before the TLS handshake.
fn option_starttls(stream: &mut Stream, uri: &str) -> io::Result<()> {
    send_option(stream, uri, OPT_STARTTLS, &[])?;
    let mut header_bytes = [0u8; OPTION_REPLY_HEADER_BYTES];
    read_handshake(
        stream,
        &mut header_bytes,
        uri,
        "the reply to NBD_OPT_STARTTLS",
    )?;
    let header = OptionReplyHeader::decode(&header_bytes)
        .map_err(|e| handshake_error(uri, io::ErrorKind::InvalidData, &e.to_string()))?;
    if header.length_bytes > DEFAULT_MAX_OPTION_BYTES || header.option != OPT_STARTTLS {
        return Err(handshake_error(
            uri,
            io::ErrorKind::InvalidData,
            "the server's reply to NBD_OPT_STARTTLS is malformed",
        ));
    }
    let mut data = vec![0u8; header.length_bytes as usize];
    read_handshake(stream, &mut data, uri, "the reply to NBD_OPT_STARTTLS")?;
    if header.reply_type == REP_ACK {
        return Ok(());
    }
    let message = one_line(&data);
    Err(handshake_error(
        uri,
        io::ErrorKind::Unsupported,
        &format!(
            "the server does not offer TLS (nbds:// needs it; use nbd:// only on a trusted network){}{message}",
            if message.is_empty() { "" } else { ": " }
        ),
    ))
}

fn negotiate(
    stream: &mut Stream,
    uri: &str,
    export_name: &str,
    client_flags: ClientFlags,
) -> io::Result<Negotiated> {
    if client_flags.fixed_newstyle {
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
                    base_allocation_id: None,
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
            stream,
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
        base_allocation_id: None,
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
pub(super) fn request_limits(constraints: BlockSizeConstraints) -> Result<(u32, u32), String> {
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
        .map_err(|e| handshake_io_error(stream, uri, "sending an option", e))
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
            "the server requires TLS: use an nbds:// or nbds+unix:// URI with tls-certificates= or tls-psk-file=".to_owned(),
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
        .map_err(|e| handshake_io_error(stream, uri, what, e))
}

fn write_handshake(stream: &mut Stream, bytes: &[u8], uri: &str) -> io::Result<()> {
    stream
        .write_all(bytes)
        .map_err(|e| handshake_io_error(stream, uri, "sending the client flags", e))
}

fn handshake_io_error(stream: &Stream, uri: &str, what: &str, e: io::Error) -> io::Error {
    let text = match e.kind() {
        io::ErrorKind::UnexpectedEof => {
            format!("the server closed the connection during the handshake (reading {what})")
        }
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => format!(
            "no answer from the server within {} s (waiting for {what})",
            stream
                .read_timeout()
                .unwrap_or(HANDSHAKE_TIMEOUT)
                .as_secs_f64()
        ),
        _ => format!("handshake failed ({what}): {e}"),
    };
    handshake_error(uri, e.kind(), &text)
}

fn handshake_error(uri: &str, kind: io::ErrorKind, text: &str) -> io::Error {
    io::Error::new(kind, format!("{uri}: {text}"))
}
