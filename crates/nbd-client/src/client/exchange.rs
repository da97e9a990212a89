//! One request and its simple reply on a [`Client`]'s stream: the cookie check, the wire error
//! mapped to a local errno, and the rule that any failure of the stream leaves the connection
//! unusable for good (the client never resynchronises or reconnects by itself).

use std::io::{self, Read};
use std::net::Shutdown;

use logcache_nbd::consts::{SIMPLE_REPLY_HEADER_BYTES, STRUCTURED_REPLY_MAGIC};
use logcache_nbd::reply::SimpleReply;
use logcache_nbd::request::{Command, Request};

use super::ops::Requests;
use super::stream::write_all_vectored;
use super::{Client, ExportInfo};

impl Requests for Client {
    fn info(&self) -> &ExportInfo {
        &self.info
    }

    fn uri(&self) -> &str {
        &self.uri
    }

    fn check_usable(&self) -> io::Result<()> {
        Client::check_usable(self)
    }

    /// Sends one request (with `payload` for writes) and waits for its simple reply, reading
    /// `read_into.len()` bytes of data after a successful reply to a read.
    fn request(
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
            if reply.error == logcache_nbd::consts::ESHUTDOWN {
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
}

impl Client {
    /// Records why the connection is unusable, closes the socket so the server notices, and
    /// returns the error for the call that found out.
    pub(super) fn fail(&mut self, kind: io::ErrorKind, reason: String) -> io::Error {
        self.mark_broken(kind, reason)
    }

    fn mark_broken(&mut self, kind: io::ErrorKind, reason: String) -> io::Error {
        let _ = self.stream.shutdown(Shutdown::Both);
        self.closed = true;
        let error = broken_error(&self.uri, kind, &reason);
        self.broken = Some(reason);
        error
    }
}

/// The error of the call that met a connection's failure (or was in flight when it came).
pub(super) fn broken_error(uri: &str, kind: io::ErrorKind, reason: &str) -> io::Error {
    io::Error::new(
        kind,
        format!("{uri}: {reason}; the NBD connection is now unusable"),
    )
}

/// Maps an NBD wire error to the local errno (the spec fixes the wire values, which happen to be
/// Linux's; other platforms number some of them differently). Unknown values become EIO.
pub(super) fn local_errno(wire_error: u32) -> i32 {
    use logcache_nbd::consts as c;
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

pub(super) fn command_name(command: Command) -> &'static str {
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
