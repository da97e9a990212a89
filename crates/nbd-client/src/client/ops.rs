//! The data calls (read, write, flush, trim, write zeroes) once, for both transports: a
//! [`Client`](super::Client) (one request at a time) and a [`Pipe`](super::Pipe) (many in
//! flight). Each checks what can be refused locally, splits long ranges at the server's request
//! limit, and hands every piece to the transport's `request`.

use std::io;

use logcache_nbd::consts::CMD_FLAG_FUA;
use logcache_nbd::request::Command;

use super::ExportInfo;

/// One request and its reply, as a transport carries it.
pub(super) trait Requests {
    fn info(&self) -> &ExportInfo;
    fn uri(&self) -> &str;
    /// Fails if an earlier failure made the connection unusable.
    fn check_usable(&self) -> io::Result<()>;
    /// Sends one request (with `payload` for writes) and waits for its reply, reading
    /// `read_into.len()` bytes of data after a successful reply to a read.
    fn request(
        &mut self,
        command: Command,
        flags: u16,
        offset_bytes: u64,
        length_bytes: u32,
        payload: &[u8],
        read_into: &mut [u8],
    ) -> io::Result<()>;
}

/// Reads exactly `buf.len()` bytes at `offset_bytes`, in requests of at most
/// `max_request_bytes`.
pub(super) fn read_at(r: &mut impl Requests, buf: &mut [u8], offset_bytes: u64) -> io::Result<()> {
    r.check_usable()?;
    check_range(r, offset_bytes, buf.len() as u64)?;
    for (at, piece) in pieces(offset_bytes, buf.len(), r.info().max_request_bytes) {
        let length_bytes = piece.len() as u32;
        r.request(Command::Read, 0, at, length_bytes, &[], &mut buf[piece])?;
    }
    Ok(())
}

/// Writes all of `buf` at `offset_bytes`, split like reads. With `fua` the write is durable
/// when this returns: each request carries `FUA` if the server supports it, otherwise a flush
/// follows the write.
pub(super) fn write_at(
    r: &mut impl Requests,
    buf: &[u8],
    offset_bytes: u64,
    fua: bool,
) -> io::Result<()> {
    r.check_usable()?;
    check_writable(r.info())?;
    check_range(r, offset_bytes, buf.len() as u64)?;
    let native_fua = fua && r.info().can_fua();
    let flags = if native_fua { CMD_FLAG_FUA } else { 0 };
    for (at, piece) in pieces(offset_bytes, buf.len(), r.info().max_request_bytes) {
        let length_bytes = piece.len() as u32;
        r.request(
            Command::Write,
            flags,
            at,
            length_bytes,
            &buf[piece],
            &mut [],
        )?;
    }
    if fua && !native_fua && !buf.is_empty() {
        flush(r)?;
    }
    Ok(())
}

/// Makes every write acknowledged before this call durable (`NBD_CMD_FLUSH`).
///
/// If the server does not advertise `FLAG_SEND_FLUSH` this sends nothing and succeeds: the
/// spec forbids sending the command then, and such a server is claiming that a write is
/// durable once it has replied to it.
pub(super) fn flush(r: &mut impl Requests) -> io::Result<()> {
    r.check_usable()?;
    if !r.info().can_flush() {
        return Ok(());
    }
    r.request(Command::Flush, 0, 0, 0, &[], &mut [])
}

/// Tells the server the range is no longer needed (`NBD_CMD_TRIM`), split like writes.
/// Fails with `Unsupported` if the server does not advertise trim (the caller decides whether
/// that matters; a trim is only a hint).
pub(super) fn trim(r: &mut impl Requests, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
    r.check_usable()?;
    check_writable(r.info())?;
    check_range(r, offset_bytes, len_bytes)?;
    if !r.info().can_trim() {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("{}: the server does not support trim", r.uri()),
        ));
    }
    send_range(r, Command::Trim, offset_bytes, len_bytes)
}

/// Makes the range read as zeros (`NBD_CMD_WRITE_ZEROES`, holes allowed), split like writes.
/// Fails with `Unsupported` if the server does not advertise it (the caller writes zero
/// blocks instead).
pub(super) fn write_zeroes(
    r: &mut impl Requests,
    offset_bytes: u64,
    len_bytes: u64,
) -> io::Result<()> {
    r.check_usable()?;
    check_writable(r.info())?;
    check_range(r, offset_bytes, len_bytes)?;
    if !r.info().can_write_zeroes() {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("{}: the server does not support write zeroes", r.uri()),
        ));
    }
    send_range(r, Command::WriteZeroes, offset_bytes, len_bytes)
}

/// A payload-free command over a range, in pieces of at most `max_request_bytes` (servers may
/// refuse longer ones).
fn send_range(
    r: &mut impl Requests,
    command: Command,
    offset_bytes: u64,
    len_bytes: u64,
) -> io::Result<()> {
    let len = usize::try_from(len_bytes).expect("a range on this machine fits in usize");
    for (at, piece) in pieces(offset_bytes, len, r.info().max_request_bytes) {
        r.request(command, 0, at, piece.len() as u32, &[], &mut [])?;
    }
    Ok(())
}

fn check_writable(info: &ExportInfo) -> io::Result<()> {
    if info.is_read_only() {
        // Refused locally (the spec has the server fail them anyway); EROFS keeps the errno
        // meaningful for callers that forward it, e.g. to their own NBD clients.
        return Err(io::Error::from_raw_os_error(libc::EROFS));
    }
    Ok(())
}

pub(super) fn check_range(r: &impl Requests, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
    let size_bytes = r.info().size_bytes;
    match offset_bytes.checked_add(len_bytes) {
        Some(end) if end <= size_bytes => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{}: request at offset {offset_bytes} of {len_bytes} bytes is past the end of \
                 the {size_bytes}-byte export",
                r.uri()
            ),
        )),
    }
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
