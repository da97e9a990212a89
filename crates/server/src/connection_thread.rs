//! One client connection's thread (`nbd-conn-N`): it runs the handshake, then the transmission
//! phase, then unregisters. Whatever happens to one connection stays inside it.

use std::net::Shutdown;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::connection::Connection;
use crate::limits::HANDSHAKE_TIMEOUT;
use crate::negotiate::{self, HandshakeError, Outcome};
use crate::shared::ServerInner;
use crate::sink::ReplySink;
use crate::stats::Counters;
use crate::stream::Stream;
use crate::transmission::{self, End};

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
        Err(HandshakeError::Tls(reason)) => {
            // The one place the server logs by itself: a refused TLS client is an operator's
            // business (wrong CA, expired certificate, wrong key), and the client may only see
            // a cut connection.
            eprintln!("logcache: NBD connection {id}: {reason}");
            return false;
        }
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
