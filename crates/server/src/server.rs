//! [`Server`]: owns the listeners and the connections, and their life cycle.
//!
//! Every connection runs on its own thread (`nbd-conn-N`) with its own workers, so a slow or
//! broken client never holds up another. `shutdown` stops the accept loops, shuts the read side
//! of every connection (the reader then sees end of input after the requests already sent),
//! waits for each to finish its requests and send the replies, and joins every thread.

use std::net::{Shutdown, SocketAddr};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use logcache_engine::io::BlockDevice;
use logcache_engine::Engine;
use parking_lot::Mutex;

use crate::config::ServerConfig;
use crate::error::ServerError;
use crate::export::Export;
use crate::limits::SHUTDOWN_GRACE;
use crate::listener::{self, Listener};
use crate::shared::ServerInner;
use crate::stats::ServerStats;

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
    listeners: Mutex<Vec<Listener>>,
    /// Held for the whole of `shutdown`, so a second caller returns only when it is complete.
    shutdown_lock: Mutex<()>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.shutdown();
    }
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
        Server {
            handle: Arc::new(Handle {
                inner: Arc::new(ServerInner::new(export, config)),
                listeners: Mutex::new(Vec::new()),
                shutdown_lock: Mutex::new(()),
            }),
        }
    }

    /// Binds a Unix socket and starts its accept thread. A stale socket file (nobody accepting:
    /// connecting is refused) is replaced; a live one is an error, as is a file that is not a
    /// socket.
    pub fn listen_unix(&self, path: &Path) -> Result<(), ServerError> {
        let inner = &self.handle.inner;
        inner.config.validate()?;
        let mut listeners = self.handle.listeners.lock();
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
        let mut listeners = self.handle.listeners.lock();
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
        self.handle.shutdown();
    }

    /// Connections currently open.
    pub fn active_connections(&self) -> usize {
        self.handle.inner.active_connections()
    }

    pub fn stats(&self) -> ServerStats {
        self.handle.inner.counters.snapshot()
    }
}

impl Handle {
    fn shutdown(&self) {
        let _serialised = self.shutdown_lock.lock();
        self.inner.stopping.store(true, Ordering::SeqCst);
        let listeners = std::mem::take(&mut *self.listeners.lock());
        for listener in listeners {
            listener.stop();
        }
        let (streams, threads) = self.inner.close_registry();
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

// The CLI shuts the server down from a signal-handling thread, so handles must cross threads.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Server>();
};
