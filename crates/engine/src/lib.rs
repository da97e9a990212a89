//! logcache's engine: a checksummed, log-structured write-back cache for block devices.
//!
//! Writes are copied into a RAM segment and acknowledged at once; sealed segment chunks go to the
//! cache device as one sequential write with their metadata and checksums; reads take the newest
//! copy from RAM, the cache device or the backing device. See `docs/ARCHITECTURE.md` for the data
//! path, the module tree and who owns what, and `docs/FORMAT.md` for every byte on the cache
//! device.
//!
//! Layers, bottom up (a module uses only those below it):
//! `format`, `io`, `geometry`, `tunables`, `stats`, `index` → `state` → `inner`, `verify` →
//! `bitmaps` → `reclaim` → `log` → `writeback` → `promote`, `path`, `status`, `checkpoints` → `export`, `open`, `inspect` → `engine`.

mod backing;
mod bitmaps;
mod checkpoints;
mod drive;
pub mod engine;
pub mod error;
mod export;
mod failpoint;
pub mod format;
pub mod geometry;
pub mod index;
mod inner;
pub mod inspect;
mod log;
mod open;
mod path;
mod promote;
mod reclaim;
mod state;
pub mod stats;
pub mod status;
pub mod sync;
pub mod tunables;
mod verify;
mod writeback;

/// The device seam lives in its own crate (`logcache-io`); re-exported so `crate::io::...` and
/// `logcache_engine::io::...` keep naming it.
pub use logcache_io as io;

pub use checkpoints::CheckpointInfo;
pub use drive::DrainProgress;
pub use engine::{Engine, OpenOptions, WriteReservation, RESERVED_WRITE_MAX_BYTES};
pub use error::{Error, Result};
pub use export::Export;
pub use open::create::{format_cache, FormatOptions};
pub use path::read::CachedRead;
pub use stats::{Counters, RecoveryReport, Stats};
pub use status::{Extent, ExtentKind};
