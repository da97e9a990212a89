//! One client connection: its thread (`nbd-conn-N`) runs the handshake, then the transmission
//! phase, then unregisters. Whatever happens to one connection stays inside it.

use std::net::Shutdown;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::limits::{HANDSHAKE_TIMEOUT, PAYLOAD_POOL_BUFFERS, PAYLOAD_POOL_BUFFER_MAX_BYTES};
use crate::negotiate::{self, HandshakeError, Outcome, Session};
use crate::server::ServerInner;
use crate::sink::ReplySink;
use crate::stats::Counters;
use crate::stream::Stream;
use crate::transmission::{self, End};

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

    /// Returns a payload buffer for reuse; large ones are freed rather than kept.
    pub(crate) fn recycle_payload(&self, buffer: Vec<u8>) {
        let mut pool = self.payload_pool.lock();
        if pool.len() < PAYLOAD_POOL_BUFFERS && buffer.capacity() <= PAYLOAD_POOL_BUFFER_MAX_BYTES {
            pool.push(buffer);
        }
    }
}

/// The connection thread's body.
pub(crate) fn run(server: Arc<ServerInner>, stream: Arc<Stream>, id: u64) {
    // Unregisters even if this thread panics, so counts and the registry stay right.
    let _registration = Registration {
        server: &server,
        id,
    };
    if serve(&server, &stream, id) {
        Counters::add(&server.counters.protocol_errors, 1);
    }
    // The registry may still hold the socket for a moment; the client must see the end now.
    stream.shutdown(Shutdown::Both);
}

/// Runs both phases; returns whether the connection ended for a client protocol violation.
fn serve(server: &Arc<ServerInner>, stream: &Arc<Stream>, id: u64) -> bool {
    if stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT)).is_err() {
        return false;
    }
    let session = match negotiate::negotiate(stream, server) {
        Ok(Outcome::Transmission(session)) => session,
        Ok(Outcome::Closed) | Err(HandshakeError::Io) => return false,
        Err(HandshakeError::Violation) => return true,
    };
    if stream.set_read_timeout(None).is_err() {
        return false;
    }
    let connection = Arc::new(Connection {
        id,
        server: server.clone(),
        session,
        stream: stream.clone(),
        sink: ReplySink::new(stream.clone()),
        payload_pool: Mutex::new(Vec::new()),
    });
    transmission::serve(&connection) == End::Violation
}

struct Registration<'a> {
    server: &'a ServerInner,
    id: u64,
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        self.server.unregister_connection(self.id);
    }
}
