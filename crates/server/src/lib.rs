//! logcache's NBD server: serves an [`logcache_engine::Engine`] (or a plain device) to NBD clients
//! over Unix and TCP sockets. (Backing devices given as an NBD URI are opened by the
//! `logcache-nbd-client` crate.)
//!
//! Server modules, one job each, from the top down (no module imports one above it): `server`
//! (life cycle), `listener` (accept loops), `connection_thread` (one client's thread:
//! handshake, then transmission), `transmission` (the request loop), `burst` (small cached READs
//! that arrived together, served on the reader), `workers` (slow commands),
//! `answer` (READ replies and command results, for the reader and the workers alike),
//! `connection` (what a connection's reader and workers share), `negotiate` (handshake),
//! `meta` (metadata contexts for block status),
//! `shared` (what every thread shares, and the registry of live connections), `config` (what
//! is exported), `export` (what is served: the engine or a device), `ops` (block operations on
//! the export, unaligned ones included), `reply` (reply encoding), `sink` (serialised reply
//! writing), `input` (the request buffer), `spin` (the reader's adaptive poll before it
//! sleeps), `stream` (socket calls), `tls` (STARTTLS: credentials and the TLS channel),
//! `errno`, `limits`, `stats`, `error`.

mod answer;
mod burst;
mod config;
mod connection;
mod connection_thread;
mod errno;
mod error;
mod export;
mod input;
mod limits;
mod listener;
mod meta;
mod negotiate;
mod ops;
mod reply;
mod server;
mod shared;
mod sink;
mod spin;
mod stats;
mod stream;
mod tls;
mod transmission;
mod workers;

pub use config::{ServerConfig, DEFAULT_DESCRIPTION, DEFAULT_EXPORT_NAME};
pub use error::ServerError;
pub use limits::MAX_PAYLOAD_BYTES;
pub use listener::{remove_stale_socket, wait_for_client, Readiness, SocketFile};
pub use server::Server;
pub use stats::ServerStats;
pub use tls::{TlsConfig, TlsMode};
