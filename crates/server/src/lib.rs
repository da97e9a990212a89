//! logcache's NBD server: serves an [`logcache_engine::Engine`] to NBD clients over Unix and TCP
//! sockets, and opens backing devices given as a path or an NBD URI.

pub mod backing;
