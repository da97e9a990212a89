//! [`Connection`]: what the reader and the workers of one client connection share (its
//! negotiated session, socket, reply sink and recycled payload buffers). The thread that runs a
//! connection is in `connection_thread`.

use std::sync::Arc;

use parking_lot::Mutex;

use crate::limits::{PAYLOAD_POOL_BUFFERS, PAYLOAD_POOL_BUFFER_MAX_BYTES};
use crate::negotiate::Session;
use crate::shared::ServerInner;
use crate::sink::ReplySink;
use crate::stream::Stream;

/// What the reader and the workers of one connection share.
pub(crate) struct Connection {
    pub id: u64,
    pub server: Arc<ServerInner>,
    pub session: Session,
    pub stream: Arc<Stream>,
    pub sink: ReplySink,
    /// Recycled payload buffers for writes handed to workers (see `workers`).
    pub payload_pool: Mutex<Vec<Vec<u8>>>,
}

impl Connection {
    /// A copy of `data` in a recycled buffer (or a new one), for a write handed to a worker.
    pub(crate) fn copy_payload(&self, data: &[u8]) -> Vec<u8> {
        let mut buffer = self.payload_pool.lock().pop().unwrap_or_default();
        buffer.clear();
        buffer.extend_from_slice(data);
        buffer
    }

    /// A recycled payload buffer (or a new one), contents unspecified, to receive into.
    pub(crate) fn take_payload_buffer(&self) -> Vec<u8> {
        self.payload_pool.lock().pop().unwrap_or_default()
    }

    /// Returns a payload buffer for reuse; large ones are freed rather than kept.
    pub(crate) fn recycle_payload(&self, buffer: Vec<u8>) {
        let mut pool = self.payload_pool.lock();
        if pool.len() < PAYLOAD_POOL_BUFFERS && buffer.capacity() <= PAYLOAD_POOL_BUFFER_MAX_BYTES {
            pool.push(buffer);
        }
    }
}
