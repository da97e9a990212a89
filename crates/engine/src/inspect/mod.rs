//! Offline inspection of a cache device, behind `logcache check` and `logcache dump`: what the
//! superblock copies say, what recovery would make of the log, and whether every data block
//! still matches its checksum.
//!
//! Read-only: unlike `Engine::open`, nothing here writes to the cache device (open bumps the
//! epoch in the superblock before it serves), so a cache can be examined after a crash without
//! changing what its next open will see. Only `read_at` is ever called.
//!
//! The walk and its verdicts are recovery's own code (`recover::walk`, `judge_end`, `tail_cut`,
//! `check_replayable`), and the backing check is `Engine::open`'s, so what `check` reports is
//! what an open would do. The one difference is deliberate: `check` verifies the data of every
//! chunk in the log, where recovery reads only the possibly torn tail.
//!
//! `report` holds what they return, `check` and `dump` the two passes.

mod check;
mod dump;
mod report;

pub use self::check::check;
pub use self::dump::{dump, kind_name, ChunkDump, DumpReport, SegmentDump};
pub use self::report::{
    BackingReport, BadBlock, BadChunk, CheckReport, CopyState, Finding, Layout, LogEnd, LogReport,
    Severity, SuperblockCopy, TunableReport,
};
pub use crate::open::recover::{Reject, WalkStop};

/// The newest valid superblock of `cache` (None: not formatted). `detach --force` reads it to
/// tell a cache device that still reads whole from a lost one.
pub fn read_superblock(
    cache: &dyn crate::io::BlockDevice,
) -> crate::Result<Option<crate::format::superblock::Superblock>> {
    crate::log::checkpoint::read(cache)
}
