//! logcache's NBD client side, built on `logcache-nbd`'s codecs (which do no IO):
//!
//! - [`client`]: a blocking client over std sockets, one request at a time per connection
//!   (`handshake`, `exchange` of one request and its reply, the `stream` underneath), and
//!   [`Pipe`], one connection many threads share with many requests in flight (replies matched
//!   by cookie, in any order);
//! - [`device`]: [`NbdDevice`], an NBD export as a [`logcache_io::BlockDevice`], over a pool of
//!   pipes (or, over TLS, serial clients) that reconnect, so the cache's backing device can be
//!   any NBD export.

pub mod client;
pub mod device;

pub use client::{Client, ExportInfo, Pipe, DEFAULT_REQUEST_TIMEOUT};
pub use device::{NbdDevice, DEFAULT_CONNECTIONS, EXTRA_CONNECTION_GREETING_TIMEOUT};
