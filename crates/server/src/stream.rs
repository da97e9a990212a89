//! A connected client socket (Unix or TCP) with the few raw operations the server needs, and
//! the TLS session it switches to after STARTTLS (then every read and write goes through it).
//!
//! Reads and writes go through `recv`/`send` directly: `send` with `MSG_NOSIGNAL` so a client
//! that went away gives `EPIPE` instead of killing the process with `SIGPIPE`, and `recv` with
//! `MSG_DONTWAIT` while shutting down, so a connection stops once its queued requests are read.
//! Both take `&self`, so the reader and the reply writers share one socket without locking reads.

use std::io;
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::OnceLock;
use std::time::Duration;

use openssl::ssl::SslContext;

use crate::limits::UNIX_SEND_BUFFER_BYTES;
use crate::tls::{self, TlsChannel};

pub(crate) struct Stream {
    socket: Socket,
    /// Set once, by STARTTLS; from then on all traffic is TLS.
    tls: OnceLock<TlsChannel>,
}

pub(crate) enum Socket {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl From<UnixStream> for Stream {
    fn from(socket: UnixStream) -> Stream {
        Stream::new(Socket::Unix(socket))
    }
}

impl From<TcpStream> for Stream {
    fn from(socket: TcpStream) -> Stream {
        Stream::new(Socket::Tcp(socket))
    }
}

impl Stream {
    fn new(socket: Socket) -> Stream {
        Stream {
            socket,
            tls: OnceLock::new(),
        }
    }

    /// Reads what is available (at least one byte unless `dont_wait`); `Ok(0)` is end of stream.
    pub(crate) fn recv(&self, buf: &mut [u8], dont_wait: bool) -> io::Result<usize> {
        match self.tls.get() {
            Some(tls) => tls.recv(&self.socket, buf, dont_wait),
            None => self.socket.recv(buf, dont_wait),
        }
    }

    /// Fills `buf` completely, failing with `UnexpectedEof` if the peer closes first.
    pub(crate) fn recv_exact(&self, mut buf: &mut [u8]) -> io::Result<()> {
        while !buf.is_empty() {
            let received = self.recv(buf, false)?;
            if received == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            buf = &mut buf[received..];
        }
        Ok(())
    }

    /// Writes all of `bytes`. Callers serialise concurrent writers (see `sink`).
    pub(crate) fn send_all(&self, bytes: &[u8]) -> io::Result<()> {
        match self.tls.get() {
            Some(tls) => tls.send_all(&self.socket, bytes),
            None => self.socket.send_all(bytes),
        }
    }

    /// Writes all of `parts`, in order: one `sendmsg` for all of them where the socket takes
    /// them at once (a reader's burst of READ replies), each part on its own through TLS.
    /// `parts` is used up (advanced past what was sent).
    pub(crate) fn send_all_vectored(&self, parts: &mut [io::IoSlice<'_>]) -> io::Result<()> {
        match self.tls.get() {
            Some(tls) => parts
                .iter()
                .try_for_each(|part| tls.send_all(&self.socket, part)),
            None => self.socket.send_all_vectored(parts),
        }
    }

    /// Runs the TLS handshake (after STARTTLS was acknowledged); on failure, one line saying why.
    pub(crate) fn start_tls(&self, context: &SslContext) -> Result<(), String> {
        let channel = tls::accept(context, &self.socket)?;
        self.tls
            .set(channel)
            .map_err(|_| "TLS was already started on this connection".to_owned())
    }

    pub(crate) fn is_tls(&self) -> bool {
        self.tls.get().is_some()
    }

    pub(crate) fn shutdown(&self, how: Shutdown) {
        self.socket.shutdown(how)
    }

    pub(crate) fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.socket.set_read_timeout(timeout)
    }

    pub(crate) fn set_blocking(&self) -> io::Result<()> {
        self.socket.set_blocking()
    }

    /// Asks for a send buffer of `UNIX_SEND_BUFFER_BYTES` on a Unix socket, so a large READ
    /// reply goes out in one `send` without its worker sleeping until the client has drained
    /// the default ~208 KiB (a 1 MiB reply slept about five times, each wake-up a trip through
    /// the run queue of a loaded machine). The kernel caps it at `net.core.wmem_max`; failing
    /// leaves the default, which only costs speed. TCP keeps its autotuning (setting the size
    /// would turn that off).
    pub(crate) fn enlarge_send_buffer(&self) {
        let Socket::Unix(socket) = &self.socket else {
            return;
        };
        let bytes = libc::c_int::try_from(UNIX_SEND_BUFFER_BYTES).expect("fits a c_int");
        // SAFETY: the descriptor is open while `socket` is borrowed; the option value is a
        // c_int of the size passed.
        unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_SNDBUF,
                (&bytes as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }

    /// The socket's send buffer as the kernel reports it (it doubles what was asked for).
    #[cfg(test)]
    fn send_buffer_bytes(&self) -> usize {
        let mut bytes: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: as above; `bytes` and `len` are valid for writes.
        let rc = unsafe {
            libc::getsockopt(
                self.socket.fd(),
                libc::SOL_SOCKET,
                libc::SO_SNDBUF,
                (&mut bytes as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0, "{}", io::Error::last_os_error());
        bytes as usize
    }
}

impl Socket {
    fn fd(&self) -> RawFd {
        match self {
            Socket::Unix(socket) => socket.as_raw_fd(),
            Socket::Tcp(socket) => socket.as_raw_fd(),
        }
    }

    /// Reads what is available (at least one byte unless `dont_wait`); `Ok(0)` is end of stream.
    pub(crate) fn recv(&self, buf: &mut [u8], dont_wait: bool) -> io::Result<usize> {
        let flags = if dont_wait { libc::MSG_DONTWAIT } else { 0 };
        loop {
            // SAFETY: `buf` is valid for writes of `buf.len()` bytes, and the descriptor stays
            // open for as long as `self` is borrowed.
            let received =
                unsafe { libc::recv(self.fd(), buf.as_mut_ptr().cast(), buf.len(), flags) };
            if received >= 0 {
                return Ok(received as usize);
            }
            let error = io::Error::last_os_error();
            if error.kind() != io::ErrorKind::Interrupted {
                return Err(error);
            }
        }
    }

    /// Writes all of `bytes`. Callers serialise concurrent writers (see `sink`).
    pub(crate) fn send_all(&self, mut bytes: &[u8]) -> io::Result<()> {
        while !bytes.is_empty() {
            // SAFETY: `bytes` is valid for reads of `bytes.len()` bytes; the descriptor is open.
            let sent = unsafe {
                libc::send(
                    self.fd(),
                    bytes.as_ptr().cast(),
                    bytes.len(),
                    libc::MSG_NOSIGNAL,
                )
            };
            let Some(sent) = sent_bytes(sent)? else {
                continue;
            };
            bytes = &bytes[sent..];
        }
        Ok(())
    }

    /// Writes all of `parts` with `sendmsg` (`MSG_NOSIGNAL`, as `send_all`), resuming after a
    /// partial send. Callers serialise concurrent writers (see `sink`).
    pub(crate) fn send_all_vectored(&self, mut parts: &mut [io::IoSlice<'_>]) -> io::Result<()> {
        io::IoSlice::advance_slices(&mut parts, 0);
        while !parts.is_empty() {
            // SAFETY: `msghdr` is plain data; all-zero is a valid empty message.
            let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
            // `IoSlice` is ABI-compatible with `iovec` (documented on `IoSlice`); the kernel
            // only reads through these pointers.
            message.msg_iov = parts.as_mut_ptr().cast();
            message.msg_iovlen = parts.len().min(libc::UIO_MAXIOV as usize) as _;
            // SAFETY: `message` points at `parts`, valid for reads for the duration of the
            // call; the descriptor is open.
            let sent = unsafe { libc::sendmsg(self.fd(), &message, libc::MSG_NOSIGNAL) };
            let Some(sent) = sent_bytes(sent)? else {
                continue;
            };
            io::IoSlice::advance_slices(&mut parts, sent);
        }
        Ok(())
    }

    /// Shuts down one or both directions. Errors (e.g. the peer already left) change nothing we
    /// could act on, so they are ignored.
    pub(crate) fn shutdown(&self, how: Shutdown) {
        let _ = match self {
            Socket::Unix(socket) => socket.shutdown(how),
            Socket::Tcp(socket) => socket.shutdown(how),
        };
    }

    pub(crate) fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Socket::Unix(socket) => socket.set_read_timeout(timeout),
            Socket::Tcp(socket) => socket.set_read_timeout(timeout),
        }
    }

    /// Undoes a listener's non-blocking mode, which some platforms let accepted sockets inherit.
    pub(crate) fn set_blocking(&self) -> io::Result<()> {
        match self {
            Socket::Unix(socket) => socket.set_nonblocking(false),
            Socket::Tcp(socket) => socket.set_nonblocking(false),
        }
    }
}

/// What a `send`/`sendmsg` returned: the bytes sent, `None` if interrupted before sending
/// anything (send again), or the error (nothing sent of a non-empty message is one).
fn sent_bytes(sent: isize) -> io::Result<Option<usize>> {
    if sent < 0 {
        let error = io::Error::last_os_error();
        if error.kind() == io::ErrorKind::Interrupted {
            return Ok(None);
        }
        return Err(error);
    }
    if sent == 0 {
        return Err(io::ErrorKind::WriteZero.into());
    }
    Ok(Some(sent as usize))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_unix_socket_gets_a_larger_send_buffer() {
        let (a, _b) = UnixStream::pair().unwrap();
        let a = Stream::from(a);
        let before_bytes = a.send_buffer_bytes();
        a.enlarge_send_buffer();
        // The kernel caps the size at net.core.wmem_max (then doubles it), which is at least
        // the default: the buffer grows unless the default is already the cap.
        let wmem_max_bytes: usize = std::fs::read_to_string("/proc/sys/net/core/wmem_max")
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        if before_bytes < 2 * wmem_max_bytes {
            assert!(a.send_buffer_bytes() > before_bytes);
        }
        assert!(a.send_buffer_bytes() <= 2 * UNIX_SEND_BUFFER_BYTES.max(wmem_max_bytes));
    }

    #[test]
    fn send_recv_and_end_of_stream() {
        let (a, b) = UnixStream::pair().unwrap();
        let (a, b) = (Stream::from(a), Stream::from(b));
        a.send_all(b"hello").unwrap();
        let mut buf = [0u8; 5];
        b.recv_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"hello");
        let error = b.recv(&mut buf, true).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::WouldBlock);
        a.shutdown(Shutdown::Write);
        assert_eq!(b.recv(&mut buf, false).unwrap(), 0);
        assert_eq!(
            b.recv_exact(&mut buf).unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
    }

    #[test]
    fn a_vectored_send_arrives_whole_and_in_order_even_past_the_socket_buffer() {
        let (a, b) = UnixStream::pair().unwrap();
        let (a, b) = (Stream::from(a), Stream::from(b));
        // More than a Unix socket's buffer, so the first `sendmsg` is partial and resumes
        // mid-part.
        let parts: Vec<Vec<u8>> = (0..40u8).map(|i| vec![i; 37 * 1024 + 1]).collect();
        let expected: Vec<u8> = parts.concat();
        let reader = std::thread::spawn(move || {
            let mut got = vec![0u8; expected.len()];
            b.recv_exact(&mut got).unwrap();
            assert!(got == expected, "the parts arrived changed or out of order");
        });
        let mut slices: Vec<io::IoSlice<'_>> = parts.iter().map(|p| io::IoSlice::new(p)).collect();
        // An empty part among them is skipped, not an end of stream.
        slices.insert(3, io::IoSlice::new(&[]));
        a.send_all_vectored(&mut slices).unwrap();
        reader.join().unwrap();
    }

    #[test]
    fn sending_to_a_closed_peer_is_an_error_not_a_signal() {
        let (a, b) = UnixStream::pair().unwrap();
        drop(b);
        let a = Stream::from(a);
        assert!(a.send_all(&[0u8; 4096]).is_err());
    }
}
