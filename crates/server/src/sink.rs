//! The write side of a connection: one mutex so replies from the reader and from workers never
//! interleave mid-message.
//!
//! The reader batches its replies in a buffer of its own and hands the whole batch over at once;
//! workers hand over one reply each. Whoever holds the lock writes straight to the socket.

use std::io;
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::stream::Stream;

pub(crate) struct ReplySink {
    stream: Arc<Stream>,
    write_lock: Mutex<()>,
    /// Set once a write failed: the stream may hold half a message, so nothing more may follow.
    failed: AtomicBool,
}

impl ReplySink {
    pub(crate) fn new(stream: Arc<Stream>) -> ReplySink {
        ReplySink {
            stream,
            write_lock: Mutex::new(()),
            failed: AtomicBool::new(false),
        }
    }

    /// Writes whole messages. After a failure the connection is cut in both directions, which
    /// also wakes the reader if it is blocked waiting for requests.
    pub(crate) fn send(&self, bytes: &[u8]) -> io::Result<()> {
        self.write_with(|stream| stream.send_all(bytes))
    }

    /// Writes whole messages given in parts (one `sendmsg`: a reader's burst of READ replies,
    /// each from where its data was read), as `send` does.
    pub(crate) fn send_vectored(&self, parts: &mut [io::IoSlice<'_>]) -> io::Result<()> {
        self.write_with(|stream| stream.send_all_vectored(parts))
    }

    /// Runs one whole write under the write lock; after a failure the connection is cut.
    fn write_with(&self, write: impl FnOnce(&Stream) -> io::Result<()>) -> io::Result<()> {
        let _writing = self.write_lock.lock();
        if self.failed.load(Ordering::Relaxed) {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        let result = write(&self.stream);
        if result.is_err() {
            self.break_connection();
        }
        result
    }

    /// Ends the connection from any thread (a failed write, a panicking worker).
    pub(crate) fn break_connection(&self) {
        self.failed.store(true, Ordering::Relaxed);
        self.stream.shutdown(Shutdown::Both);
    }
}
