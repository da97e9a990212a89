//! [`Server`]: owns the listeners and the connections, and their life cycle.
//!
//! Every connection runs on its own thread (`nbd-conn-N`) with its own workers, so a slow or
//! broken client never holds up another. `shutdown` stops the accept loops, shuts the read side
//! of every connection (the reader then sees end of input after the requests already sent),
//! waits for each to finish its requests and send the replies, and joins every thread.

use std::collections::HashMap;
use std::net::{Shutdown, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use logcache_engine::io::BlockDevice;
use logcache_engine::Engine;
use parking_lot::Mutex;

use crate::config::ServerConfig;
use crate::connection;
use crate::error::ServerError;
use crate::export::Export;
use crate::limits::SHUTDOWN_GRACE;
use crate::listener::{self, Listener};
use crate::stats::{Counters, ServerStats};
use crate::stream::Stream;

/// An NBD server exporting one engine (or one plain device). Cloning gives another handle to the same server; when
/// the last handle is dropped the server shuts down as if `shutdown` had been called.
#[derive(Clone)]
pub struct Server {
    handle: Arc<Handle>,
}

/// Shuts the server down when the last `Server` handle goes away (threads hold `ServerInner`,
/// not this, so they do not keep the server alive on their own).
struct Handle {
    inner: Arc<ServerInner>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.inner.shutdown();
    }
}

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
    listeners: Mutex<Vec<Listener>>,
    registry: Mutex<Registry>,
    next_connection_id: AtomicU64,
    /// Held for the whole of `shutdown`, so a second caller returns only when it is complete.
    shutdown_lock: Mutex<()>,
}

/// Live connections' sockets (so `shutdown` can reach them) and every connection thread not yet
/// joined.
#[derive(Default)]
struct Registry {
    streams: HashMap<u64, Arc<Stream>>,
    threads: Vec<JoinHandle<()>>,
    closed: bool,
}

impl Server {
    pub fn new(engine: Engine, config: ServerConfig) -> Server {
        Server::with_export(Box::new(engine), config)
    }

    /// Serves a device as it is, with no cache in front: every request goes straight to it,
    /// many at once (for an emulated disk, which only shows its real speed with a full queue).
    pub fn for_device(device: Arc<dyn BlockDevice>, config: ServerConfig) -> Server {
        Server::with_export(Box::new(device), config)
    }

    fn with_export(export: Box<dyn Export>, config: ServerConfig) -> Server {
        let inner = ServerInner {
            export_size_bytes: export.size_bytes(),
            transmission_flags: config.transmission_flags(),
            export,
            config,
            stopping: AtomicBool::new(false),
            unaligned_write_lock: Mutex::new(()),
            counters: Counters::default(),
            listeners: Mutex::new(Vec::new()),
            registry: Mutex::new(Registry::default()),
            next_connection_id: AtomicU64::new(1),
            shutdown_lock: Mutex::new(()),
        };
        Server {
            handle: Arc::new(Handle {
                inner: Arc::new(inner),
            }),
        }
    }

    /// Binds a Unix socket and starts its accept thread. A stale socket file (nobody accepting:
    /// connecting is refused) is replaced; a live one is an error, as is a file that is not a
    /// socket.
    pub fn listen_unix(&self, path: &Path) -> Result<(), ServerError> {
        let inner = &self.handle.inner;
        inner.config.validate()?;
        let mut listeners = inner.listeners.lock();
        if inner.stopping.load(Ordering::SeqCst) {
            return Err(ServerError::ShutDown);
        }
        listeners.push(listener::listen_unix(inner, path)?);
        Ok(())
    }

    /// Binds a TCP address (`HOST:PORT`; port 0 picks a free one) and starts its accept thread.
    /// Returns the bound address. Accepted sockets get `TCP_NODELAY`.
    pub fn listen_tcp(&self, addr: &str) -> Result<SocketAddr, ServerError> {
        let inner = &self.handle.inner;
        inner.config.validate()?;
        let mut listeners = inner.listeners.lock();
        if inner.stopping.load(Ordering::SeqCst) {
            return Err(ServerError::ShutDown);
        }
        let (listener, local_addr) = listener::listen_tcp(inner, addr)?;
        listeners.push(listener);
        Ok(local_addr)
    }

    /// Stops accepting, lets every connection finish the requests it already received (replies
    /// sent), closes the connections, joins all threads and removes the Unix socket files.
    /// Idempotent; safe to call from any thread.
    pub fn shutdown(&self) {
        self.handle.inner.shutdown();
    }

    /// Connections currently open.
    pub fn active_connections(&self) -> usize {
        self.handle.inner.registry.lock().streams.len()
    }

    pub fn stats(&self) -> ServerStats {
        self.handle.inner.counters.snapshot()
    }
}

impl ServerInner {
    /// Starts the thread for an accepted connection (called by the accept loops).
    pub(crate) fn start_connection(self: &Arc<Self>, stream: Stream) {
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
            .spawn(move || connection::run(inner, thread_stream, id));
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

    fn shutdown(&self) {
        let _serialised = self.shutdown_lock.lock();
        self.stopping.store(true, Ordering::SeqCst);
        let listeners = std::mem::take(&mut *self.listeners.lock());
        for listener in listeners {
            listener.stop();
        }
        let (streams, threads) = {
            let mut registry = self.registry.lock();
            registry.closed = true;
            let streams: Vec<Arc<Stream>> = registry.streams.values().cloned().collect();
            (streams, std::mem::take(&mut registry.threads))
        };
        // Each reader now gets end of input once it has read what the client already sent.
        for stream in &streams {
            stream.shutdown(Shutdown::Read);
        }
        let deadline = Instant::now() + SHUTDOWN_GRACE;
        while threads.iter().any(|thread| !thread.is_finished()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        // A client that stopped reading its replies would block us forever: cut it off.
        for stream in &streams {
            stream.shutdown(Shutdown::Both);
        }
        for thread in threads {
            // A panicked connection thread has already cleaned up after itself.
            let _ = thread.join();
        }
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

// The CLI shuts the server down from a signal-handling thread, so handles must cross threads.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Server>();
};
