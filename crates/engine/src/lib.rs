//! logcache's engine: a checksummed, log-structured write-back cache for block devices.
//!
//! Writes are copied into a RAM segment and acknowledged at once; sealed segment chunks go to the
//! cache device as one sequential write with their metadata and checksums; reads take the newest
//! copy from RAM, the cache device or the backing device. See `docs/ARCHITECTURE.md` for the data
//! path and `docs/FORMAT.md` for every byte on the cache device.

pub mod engine;
pub mod error;
pub mod format;
pub mod index;

/// The device seam lives in its own crate (`logcache-io`); re-exported so `crate::io::...` and
/// `logcache_engine::io::...` keep naming it.
pub use logcache_io as io;

pub use engine::{format, Engine, FormatOptions, OpenOptions, Stats};
pub use error::{Error, Result};
