//! The server's error type: each message says what is wrong and what to do about it.

use std::io;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// Another process accepts connections on the socket path.
    #[error("{} is in use by another server; stop that server or choose another socket path", path.display())]
    SocketInUse { path: PathBuf },
    /// The path exists but is a regular file, directory, ...; we never delete those.
    #[error("{} exists and is not a socket; remove it or choose another socket path", path.display())]
    NotASocket { path: PathBuf },
    /// Checking whether an existing socket file is live failed for another reason than "refused".
    #[error("cannot tell whether {} is in use ({source}); check its permissions or choose another socket path", path.display())]
    SocketCheck { path: PathBuf, source: io::Error },
    #[error("cannot listen on Unix socket {} ({source}); check that its directory exists and is writable and that the path is shorter than 108 bytes", path.display())]
    BindUnix { path: PathBuf, source: io::Error },
    #[error("TCP address {addr} is already in use; stop the other server or choose another port")]
    AddressInUse { addr: String },
    #[error("cannot listen on TCP address {addr} ({source}); give HOST:PORT with a local address, e.g. 127.0.0.1:10809")]
    BindTcp { addr: String, source: io::Error },
    #[error("invalid server configuration: {0}")]
    InvalidConfig(String),
    #[error("the server has been shut down; create a new Server to listen again")]
    ShutDown,
    #[error("cannot start the {what} thread ({source}); the system is out of threads or memory")]
    Thread {
        what: &'static str,
        source: io::Error,
    },
}
