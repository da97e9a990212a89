//! The engine's one error type. Each variant says what the caller can do about it.

use std::io;

/// Result alias used throughout the engine.
pub type Result<T> = std::result::Result<T, Error>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A device returned an error. `what` names the operation and where it was.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    /// Bytes on the cache device are not what the engine wrote (checksum or magic mismatch,
    /// impossible field). `what` says where.
    #[error("corruption: {0}")]
    Corruption(String),
    /// The device does not hold a logcache cache (no valid superblock).
    #[error("not formatted: {0}")]
    NotFormatted(String),
    /// The cache belongs to another backing device, or the backing device changed size.
    #[error("wrong backing device: {0}")]
    WrongBacking(String),
    /// A request or option is outside what the engine accepts.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The operation would destroy data that may exist nowhere else (use force to proceed).
    #[error("{0}")]
    HoldsData(String),
    /// The device is too small for what was asked.
    #[error("no space: {0}")]
    NoSpace(String),
    /// The engine stopped accepting IO after an unrecoverable device error; reopen to recover.
    #[error("engine failed earlier and accepts no more IO: {0}")]
    Failed(String),
    /// The engine is closed.
    #[error("engine is closed")]
    Closed,
    /// An export could not describe its moment (abandoned, or a defect caught); the disk and
    /// the checkpoints are fine. The message says what to do.
    #[error("{0}")]
    Export(String),
}

impl Error {
    /// Wraps an `io::Error` with a description of the operation.
    pub fn io(what: impl Into<String>, source: io::Error) -> Self {
        Error::Io {
            what: what.into(),
            source,
        }
    }

    /// The errno an NBD server should report for this error.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            Error::InvalidArgument(_) | Error::HoldsData(_) => libc::EINVAL,
            Error::NoSpace(_) => libc::ENOSPC,
            Error::Closed | Error::Failed(_) | Error::Export(_) => libc::EIO,
            Error::Corruption(_) | Error::NotFormatted(_) | Error::WrongBacking(_) => libc::EIO,
        }
    }
}
