//! [`ServerInner`]: what the server handle, the accept loops and the connections share (the
//! export, its configuration, the counters), and the registry of live connections, which only
//! this module touches.
//!
//! It sits below every thread's code: the accept loops hand in the connection thread's body
//! when they start one, so nothing here calls up into the connection or the listeners.

use std::collections::HashMap;
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::Mutex;

use crate::config::ServerConfig;
use crate::export::Export;
use crate::stats::Counters;
use crate::stream::Stream;

/// State shared by the server handle, the accept loops and the connections.
pub(crate) struct ServerInner {
    pub export: Box<dyn Export>,
    pub config: ServerConfig,
    pub export_size_bytes: u64,
    pub transmission_flags: u16,
    /// Set once by `shutdown`: no new connections, readers stop waiting for input.
    pub stopping: AtomicBool,
    /// Serialises read-modify-write of unaligned writes across all connections (see `ops`).
    pub unaligned_write_lock: Mutex<()>,
    pub counters: Counters,
    registry: Mutex<Registry>,
    next_connection_id: AtomicU64,
}

/// Live connections' sockets (so `shutdown` can reach them) and every connection thread not yet
/// joined.
#[derive(Default)]
struct Registry {
    streams: HashMap<u64, Arc<Stream>>,
    threads: Vec<JoinHandle<()>>,
    closed: bool,
}

/// The body of a connection thread: the server, the accepted socket and the connection's id.
pub(crate) type ConnectionBody = fn(Arc<ServerInner>, Arc<Stream>, u64);

impl ServerInner {
    pub(crate) fn new(export: Box<dyn Export>, config: ServerConfig) -> ServerInner {
        ServerInner {
            export_size_bytes: export.size_bytes(),
            transmission_flags: config.transmission_flags(),
            export,
            config,
            stopping: AtomicBool::new(false),
            unaligned_write_lock: Mutex::new(()),
            counters: Counters::default(),
            registry: Mutex::new(Registry::default()),
            next_connection_id: AtomicU64::new(1),
        }
    }

    /// Starts the thread (`nbd-conn-N`) that runs `body` for an accepted connection (called by
    /// the accept loops), unless the server is closing.
    pub(crate) fn start_connection(self: &Arc<Self>, stream: Stream, body: ConnectionBody) {
        let stream = Arc::new(stream);
        let mut registry = self.registry.lock();
        reap_finished(&mut registry.threads);
        if registry.closed {
            stream.shutdown(Shutdown::Both);
            return;
        }
        let id = self.next_connection_id.fetch_add(1, Ordering::Relaxed);
        let inner = self.clone();
        let thread_stream = stream.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("nbd-conn-{id}"))
            .spawn(move || body(inner, thread_stream, id));
        match spawned {
            Ok(thread) => {
                // Registered under the lock, so the thread's own unregistering comes after.
                registry.streams.insert(id, stream);
                registry.threads.push(thread);
                Counters::add(&self.counters.connections_total, 1);
                Counters::add(&self.counters.connections_active, 1);
            }
            // Out of threads: refuse this client rather than fail the server.
            Err(_) => stream.shutdown(Shutdown::Both),
        }
    }

    /// Called by a connection thread as it ends (also on panic): drops its socket at once.
    pub(crate) fn unregister_connection(&self, id: u64) {
        let mut registry = self.registry.lock();
        if registry.streams.remove(&id).is_some() {
            self.counters
                .connections_active
                .fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Connections currently open.
    pub(crate) fn active_connections(&self) -> usize {
        self.registry.lock().streams.len()
    }

    /// Refuses every later connection and returns the live sockets and the threads to join.
    pub(crate) fn close_registry(&self) -> (Vec<Arc<Stream>>, Vec<JoinHandle<()>>) {
        let mut registry = self.registry.lock();
        registry.closed = true;
        let streams: Vec<Arc<Stream>> = registry.streams.values().cloned().collect();
        (streams, std::mem::take(&mut registry.threads))
    }
}

/// Joins connection threads that have finished, so the list does not grow without bound.
fn reap_finished(threads: &mut Vec<JoinHandle<()>>) {
    let mut index = 0;
    while index < threads.len() {
        if threads[index].is_finished() {
            let _ = threads.swap_remove(index).join();
        } else {
            index += 1;
        }
    }
}
