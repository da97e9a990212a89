//! logcache's NBD server: serves an [`logcache_engine::Engine`] (or a plain device) to NBD clients
//! over Unix and TCP sockets, and opens backing devices given as a path or an NBD URI.
//!
//! Server modules, one job each: `config` (what is exported), `server` (life cycle),
//! `listener` (accept loops), `connection` (one client's thread), `negotiate` (handshake),
//! `transmission` (the request loop), `workers` (slow commands), `export` (what is served: the
//! engine or a device), `ops` (block operations on the export, unaligned ones included),
//! `reply` (reply encoding), `sink` (serialised reply writing), `input` (the request buffer),
//! `stream` (socket calls), `errno`, `limits`, `stats`, `error`.

pub mod backing;
mod config;
mod connection;
mod errno;
mod error;
mod export;
mod input;
mod limits;
mod listener;
mod negotiate;
mod ops;
mod reply;
mod server;
mod sink;
mod stats;
mod stream;
mod transmission;
mod workers;

pub use config::{ServerConfig, DEFAULT_DESCRIPTION, DEFAULT_EXPORT_NAME};
pub use error::ServerError;
pub use limits::MAX_PAYLOAD_BYTES;
pub use listener::remove_stale_socket;
pub use server::Server;
pub use stats::ServerStats;
