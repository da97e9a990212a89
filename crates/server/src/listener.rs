//! Listening sockets (Unix and TCP) and their accept loops.
//!
//! Each accept loop polls its listening socket together with a wake-up socket; `stop` writes to
//! the wake-up socket, so the loop ends without relying on how a platform treats `shutdown` or
//! `close` of a socket another thread is blocked on.

use std::io::{self, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::connection_thread;
use crate::error::ServerError;
use crate::shared::ServerInner;
use crate::stream::Stream;

/// Pause after an accept error such as "too many open files", so the loop does not spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

pub(crate) struct Listener {
    thread: JoinHandle<()>,
    /// Writing to (or dropping) this wakes the accept loop to stop.
    waker: UnixStream,
    /// The socket file we created, with its identity, to remove it on stop if it is still ours.
    unix_socket: Option<SocketFile>,
}

/// A socket file this process bound, with its identity, so that it is removed on stop only if
/// it is still that file (a newer server may own the path; the file may be gone).
pub struct SocketFile {
    path: PathBuf,
    device: u64,
    inode: u64,
}

impl SocketFile {
    /// The file now at `path` (just bound by the caller).
    pub fn of(path: &Path) -> io::Result<SocketFile> {
        let metadata = std::fs::symlink_metadata(path)?;
        Ok(SocketFile {
            path: path.to_owned(),
            device: metadata.dev(),
            inode: metadata.ino(),
        })
    }

    /// Removes the file if it is still the one bound.
    pub fn remove_if_ours(&self) {
        if let Ok(metadata) = std::fs::symlink_metadata(&self.path) {
            if metadata.dev() == self.device && metadata.ino() == self.inode {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}

/// What [`wait_for_client`] saw.
#[derive(Debug, PartialEq, Eq)]
pub enum Readiness {
    /// The listening socket has a client to accept (or an error to take).
    Client,
    /// The wake-up socket was written to or closed: the loop stops.
    Stop,
}

/// An accept loop's wait: until the (non-blocking) listening socket `listener` is readable or
/// `wake` is written to. Polling both, a stop never depends on the socket file still being
/// there, or on how a platform treats `shutdown` of a socket another thread waits on.
pub fn wait_for_client(listener: RawFd, wake: &UnixStream) -> Readiness {
    loop {
        let mut poll_fds = [poll_fd(listener), poll_fd(wake.as_raw_fd())];
        // SAFETY: `poll_fds` is a valid array of two pollfd structures for the whole call.
        let ready = unsafe { libc::poll(poll_fds.as_mut_ptr(), 2, -1) };
        if ready < 0 {
            if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                std::thread::sleep(ACCEPT_ERROR_PAUSE);
            }
            continue;
        }
        if poll_fds[1].revents != 0 {
            return Readiness::Stop;
        }
        if poll_fds[0].revents != 0 {
            return Readiness::Client;
        }
    }
}

enum Socket {
    Unix(UnixListener),
    Tcp(TcpListener),
}

impl Listener {
    /// Stops the accept loop, joins it and removes the socket file.
    pub(crate) fn stop(mut self) {
        let _ = self.waker.write_all(&[1]);
        let _ = self.thread.join();
        if let Some(file) = &self.unix_socket {
            file.remove_if_ours();
        }
    }
}

pub(crate) fn listen_unix(server: &Arc<ServerInner>, path: &Path) -> Result<Listener, ServerError> {
    remove_stale_socket(path)?;
    let socket = UnixListener::bind(path).map_err(|source| match source.kind() {
        // Another server won a race for the path.
        io::ErrorKind::AddrInUse => ServerError::SocketInUse {
            path: path.to_owned(),
        },
        _ => ServerError::BindUnix {
            path: path.to_owned(),
            source,
        },
    })?;
    let bind_error = |source| ServerError::BindUnix {
        path: path.to_owned(),
        source,
    };
    let file = SocketFile::of(path).map_err(bind_error)?;
    socket.set_nonblocking(true).map_err(bind_error)?;
    match start(server, Socket::Unix(socket), "nbd-accept-unix") {
        Ok((thread, waker)) => Ok(Listener {
            thread,
            waker,
            unix_socket: Some(file),
        }),
        Err(error) => {
            let _ = std::fs::remove_file(path);
            Err(error)
        }
    }
}

pub(crate) fn listen_tcp(
    server: &Arc<ServerInner>,
    addr: &str,
) -> Result<(Listener, SocketAddr), ServerError> {
    let socket = TcpListener::bind(addr).map_err(|source| match source.kind() {
        io::ErrorKind::AddrInUse => ServerError::AddressInUse {
            addr: addr.to_owned(),
        },
        _ => ServerError::BindTcp {
            addr: addr.to_owned(),
            source,
        },
    })?;
    let bind_error = |source| ServerError::BindTcp {
        addr: addr.to_owned(),
        source,
    };
    let local_addr = socket.local_addr().map_err(bind_error)?;
    socket.set_nonblocking(true).map_err(bind_error)?;
    let (thread, waker) = start(server, Socket::Tcp(socket), "nbd-accept-tcp")?;
    let listener = Listener {
        thread,
        waker,
        unix_socket: None,
    };
    Ok((listener, local_addr))
}

/// Removes a socket file nobody listens on; refuses a live socket or a file of another type.
pub fn remove_stale_socket(path: &Path) -> Result<(), ServerError> {
    let metadata = match std::fs::symlink_metadata(path) {
        Ok(metadata) => metadata,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(ServerError::SocketCheck {
                path: path.to_owned(),
                source,
            })
        }
    };
    if !metadata.file_type().is_socket() {
        return Err(ServerError::NotASocket {
            path: path.to_owned(),
        });
    }
    match UnixStream::connect(path) {
        Ok(_) => Err(ServerError::SocketInUse {
            path: path.to_owned(),
        }),
        Err(error) if error.kind() == io::ErrorKind::ConnectionRefused => {
            match std::fs::remove_file(path) {
                Ok(()) => Ok(()),
                Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
                Err(source) => Err(ServerError::SocketCheck {
                    path: path.to_owned(),
                    source,
                }),
            }
        }
        Err(source) => Err(ServerError::SocketCheck {
            path: path.to_owned(),
            source,
        }),
    }
}

fn start(
    server: &Arc<ServerInner>,
    socket: Socket,
    name: &'static str,
) -> Result<(JoinHandle<()>, UnixStream), ServerError> {
    let thread_error = |source| ServerError::Thread { what: name, source };
    let (waker, wake_listener) = UnixStream::pair().map_err(thread_error)?;
    let server = server.clone();
    let thread = std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || accept_loop(&server, &socket, &wake_listener))
        .map_err(thread_error)?;
    Ok((thread, waker))
}

fn accept_loop(server: &Arc<ServerInner>, socket: &Socket, wake: &UnixStream) {
    while wait_for_client(socket.fd(), wake) == Readiness::Client {
        match socket.accept() {
            Ok(stream) => {
                if stream.set_blocking().is_ok() {
                    stream.enlarge_send_buffer();
                    server.start_connection(stream, connection_thread::run);
                }
            }
            Err(error)
                if matches!(
                    error.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::Interrupted
                        | io::ErrorKind::ConnectionAborted
                ) => {}
            // E.g. EMFILE: existing connections keep working; try again shortly.
            Err(_) => std::thread::sleep(ACCEPT_ERROR_PAUSE),
        }
    }
}

fn poll_fd(fd: RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

impl Socket {
    fn fd(&self) -> RawFd {
        match self {
            Socket::Unix(listener) => listener.as_raw_fd(),
            Socket::Tcp(listener) => listener.as_raw_fd(),
        }
    }

    fn accept(&self) -> io::Result<Stream> {
        match self {
            Socket::Unix(listener) => listener.accept().map(|(stream, _)| Stream::from(stream)),
            Socket::Tcp(listener) => {
                let (stream, _) = listener.accept()?;
                // Replies are batched already; Nagle would only add latency on top.
                stream.set_nodelay(true)?;
                Ok(Stream::from(stream))
            }
        }
    }
}
