//! The socket under a [`Client`](super::Client): TCP (`TCP_NODELAY`) or a Unix socket, behind
//! one Read/Write, with the timeouts the handshake and requests set.

use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use openssl::ssl::SslStream;

use super::HANDSHAKE_TIMEOUT;

pub(super) fn connect_tcp(host: &str, port: u16) -> io::Result<TcpStream> {
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

/// The two socket kinds, and TLS over either, behind one Read/Write.
pub(super) enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
    /// After STARTTLS (`nbds` URIs).
    Tls(Box<SslStream<Stream>>),
}

impl Stream {
    pub(super) fn set_timeouts(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => {
                s.set_read_timeout(timeout)?;
                s.set_write_timeout(timeout)
            }
            Stream::Unix(s) => {
                s.set_read_timeout(timeout)?;
                s.set_write_timeout(timeout)
            }
            Stream::Tls(s) => s.get_ref().set_timeouts(timeout),
        }
    }

    /// Another handle on the same socket (TLS state cannot be shared: `Unsupported`).
    pub(super) fn try_clone(&self) -> io::Result<Stream> {
        match self {
            Stream::Tcp(s) => Ok(Stream::Tcp(s.try_clone()?)),
            Stream::Unix(s) => Ok(Stream::Unix(s.try_clone()?)),
            Stream::Tls(_) => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "a TLS session cannot be split between threads",
            )),
        }
    }

    /// The socket's receive timeout (`None` if reading cannot tell).
    pub(super) fn read_timeout(&self) -> Option<Duration> {
        match self {
            Stream::Tcp(s) => s.read_timeout().ok().flatten(),
            Stream::Unix(s) => s.read_timeout().ok().flatten(),
            Stream::Tls(s) => s.get_ref().read_timeout(),
        }
    }

    /// The socket's receive timeout alone (the send timeout stays as it is).
    pub(super) fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(timeout),
            Stream::Unix(s) => s.set_read_timeout(timeout),
            Stream::Tls(s) => s.get_ref().set_read_timeout(timeout),
        }
    }

    pub(super) fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.shutdown(how),
            Stream::Unix(s) => s.shutdown(how),
            Stream::Tls(s) => s.get_ref().shutdown(how),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write_vectored(bufs),
            Stream::Unix(s) => s.write_vectored(bufs),
            Stream::Tls(s) => s.write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Writes every part, in order, with as few system calls as the kernel allows (a request header
/// and its payload usually go in one `writev`).
pub(super) fn write_all_vectored(writer: &mut impl Write, parts: &[&[u8]]) -> io::Result<()> {
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
