//! Block status (for NBD's `base:allocation`): which runs of the disk hold data, which read as
//! zeros, and which are holes reading as zeros, so copy and backup tools can skip them.
//!
//! The one rule: never call a range zero unless it reads as zeros. A block with a dirty
//! cached copy is always data (only the cache has its newest bytes). A block a WRITE_ZEROES
//! covered and nothing wrote or trimmed since (`state::zeros`) is zero over any backing device.
//! Anywhere else the backing device holds what a read returns (a clean cached copy is a copy
//! of it), so its answer stands: a hole for a sparse file's `SEEK_HOLE` ranges, data for
//! devices that cannot tell. The state is asked first and the backing device after, as the
//! read path does: a write that returned is dirty in the index or, once written back, on the
//! backing device before its block is marked clean, so it is seen by one of the two; and every
//! write removes its blocks from the zero ranges before it returns.

use crate::error::{Error, Result};
use crate::format::BLOCK_SIZE_BYTES;
use crate::inner::{check_usable, Inner};
use crate::io::{Allocation, BlockDevice};

/// Blocks looked up per hold of the state lock, so a long walk does not stall IO.
const BLOCKS_PER_LOCK_HOLD: u64 = 4096;
/// Most bytes one query walks; the caller gets a shorter answer and asks again (the NBD spec
/// lets a server describe less than was asked).
pub const MAX_STATUS_WALK_BYTES: u64 = 1 << 30;

/// What a run of the disk holds, as far as block status can tell without reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExtentKind {
    /// May hold data (the answer that is always safe).
    Data,
    /// Reads as zeros (a WRITE_ZEROES not overwritten since); storage may be allocated.
    Zero,
    /// Nothing is stored there and it reads as zeros.
    ZeroHole,
}

/// One run of the disk with one status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub length_bytes: u64,
    pub kind: ExtentKind,
}

/// Which source answers for a run of blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// A dirty cached copy: data.
    Dirty,
    /// Zeroed and not written since: zero, or a hole if the backing device says so.
    Zeroed,
    /// The backing device.
    Backing,
}

/// Appends extents describing `[offset_bytes, offset_bytes + len_bytes)` of the engine's disk
/// to `out` (emptied first): at least one, at most `max_extents`, adjacent ones of equal status
/// merged, covering a prefix of the range (shorter when the walk cap or `max_extents` is hit).
pub(crate) fn block_status(
    inner: &Inner,
    offset_bytes: u64,
    len_bytes: u64,
    max_extents: usize,
    out: &mut Vec<Extent>,
) -> Result<()> {
    assert!(len_bytes > 0 && max_extents > 0);
    out.clear();
    let end_bytes = offset_bytes + len_bytes.min(MAX_STATUS_WALK_BYTES);
    let mut pos = offset_bytes;
    while pos < end_bytes {
        let (source, run_end_bytes) = cached_run(inner, pos, end_bytes)?;
        assert!(run_end_bytes > pos && run_end_bytes <= end_bytes);
        if source == Source::Dirty {
            if !push(out, max_extents, run_end_bytes - pos, ExtentKind::Data) {
                break;
            }
            pos = run_end_bytes;
            continue;
        }
        let covered_bytes = device_status_as(
            &*inner.backing,
            pos,
            run_end_bytes - pos,
            max_extents,
            source == Source::Zeroed,
            out,
        )
        .map_err(|e| Error::io("asking the backing device for its holes", e))?;
        pos += covered_bytes;
        if pos < run_end_bytes {
            break; // `out` is full.
        }
    }
    assert!(!out.is_empty() && out.len() <= max_extents);
    assert!(out.iter().map(|e| e.length_bytes).sum::<u64>() <= len_bytes);
    Ok(())
}

/// Appends the allocation of `[offset_bytes, offset_bytes + len_bytes)` of `device` to `out`
/// (merging with its last extent) until covered or `out` holds `max_extents`; returns the bytes
/// covered. Also serves a plain device exported as it is.
pub fn device_status(
    device: &dyn BlockDevice,
    offset_bytes: u64,
    len_bytes: u64,
    max_extents: usize,
    out: &mut Vec<Extent>,
) -> std::io::Result<u64> {
    device_status_as(device, offset_bytes, len_bytes, max_extents, false, out)
}

/// As [`device_status`]; with `zeroed` (the range is known to read as zeros), what the device
/// calls data is reported as zero.
fn device_status_as(
    device: &dyn BlockDevice,
    offset_bytes: u64,
    len_bytes: u64,
    max_extents: usize,
    zeroed: bool,
    out: &mut Vec<Extent>,
) -> std::io::Result<u64> {
    assert!(max_extents > 0);
    let mut covered_bytes = 0;
    while covered_bytes < len_bytes {
        let pos = offset_bytes + covered_bytes;
        let (run_bytes, allocation) = device.allocation(pos, len_bytes - covered_bytes)?;
        assert!(run_bytes > 0 && run_bytes <= len_bytes - covered_bytes);
        let kind = match allocation {
            Allocation::ZeroHole => ExtentKind::ZeroHole,
            Allocation::Data if zeroed => ExtentKind::Zero,
            Allocation::Data => ExtentKind::Data,
        };
        if !push(out, max_extents, run_bytes, kind) {
            break;
        }
        covered_bytes += run_bytes;
    }
    Ok(covered_bytes)
}

/// Which source answers for the block holding `pos`, and where the run of blocks with the same
/// answer ends (capped at `end_bytes` and at one lock hold's worth of blocks).
fn cached_run(inner: &Inner, pos: u64, end_bytes: u64) -> Result<(Source, u64)> {
    assert!(pos < end_bytes);
    let st = inner.state.lock();
    check_usable(&st)?;
    let first_lba = pos / BLOCK_SIZE_BYTES;
    let end_lba = end_bytes.div_ceil(BLOCK_SIZE_BYTES);
    // The zero ranges change only at their edges: one lookup caps the run.
    let (zeroed, zero_run_end_lba) = st.zeros.run(first_lba, end_lba);
    let undirtied = if zeroed {
        Source::Zeroed
    } else {
        Source::Backing
    };
    if st.blocks.dirty_blocks() == 0 {
        return Ok((
            undirtied,
            (zero_run_end_lba * BLOCK_SIZE_BYTES).min(end_bytes),
        ));
    }
    let source_of = |lba| {
        let dirty = st
            .blocks
            .lookup(lba)
            .is_some_and(|c| st.blocks.dirty(c) != 0);
        if dirty {
            Source::Dirty
        } else {
            undirtied
        }
    };
    let end_lba = zero_run_end_lba.min(first_lba + BLOCKS_PER_LOCK_HOLD);
    let source = source_of(first_lba);
    let mut lba = first_lba + 1;
    while lba < end_lba && source_of(lba) == source {
        lba += 1;
    }
    Ok((source, (lba * BLOCK_SIZE_BYTES).min(end_bytes)))
}

/// Adds a run to `out`, merged into the last extent when the status is the same; `false` (and
/// nothing added) when that needs a new extent and `out` is full.
fn push(out: &mut Vec<Extent>, max_extents: usize, length_bytes: u64, kind: ExtentKind) -> bool {
    assert!(length_bytes > 0);
    if let Some(last) = out.last_mut() {
        if last.kind == kind {
            last.length_bytes += length_bytes;
            return true;
        }
    }
    if out.len() >= max_extents {
        return false;
    }
    out.push(Extent { length_bytes, kind });
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::memory::MemDevice;

    /// A device with holes at fixed 4 KiB blocks, to check the merging and the caps.
    struct Holes(Vec<bool>);

    impl BlockDevice for Holes {
        fn size_bytes(&self) -> u64 {
            self.0.len() as u64 * 4096
        }
        fn read_at(&self, _: &mut [u8], _: u64) -> std::io::Result<()> {
            unreachable!()
        }
        fn write_at(&self, _: &[u8], _: u64) -> std::io::Result<()> {
            unreachable!()
        }
        fn flush(&self) -> std::io::Result<()> {
            Ok(())
        }
        fn discard(&self, _: u64, _: u64) -> std::io::Result<()> {
            Ok(())
        }
        fn describe(&self) -> String {
            "holes".into()
        }
        fn allocation(&self, offset: u64, len_bytes: u64) -> std::io::Result<(u64, Allocation)> {
            let hole = self.0[(offset / 4096) as usize];
            let run = (4096 - offset % 4096).min(len_bytes);
            Ok((
                run,
                if hole {
                    Allocation::ZeroHole
                } else {
                    Allocation::Data
                },
            ))
        }
    }

    #[test]
    fn device_status_merges_runs_and_stops_when_full() {
        let device = Holes(vec![true, true, false, true, false, false]);
        let mut out = Vec::new();
        let covered = device_status(&device, 100, 6 * 4096 - 100, 8, &mut out).unwrap();
        assert_eq!(covered, 6 * 4096 - 100);
        let lengths: Vec<(u64, bool)> = out
            .iter()
            .map(|e| (e.length_bytes, e.kind == ExtentKind::ZeroHole))
            .collect();
        assert_eq!(
            lengths,
            [
                (8192 - 100, true),
                (4096, false),
                (4096, true),
                (8192, false)
            ]
        );
        out.clear();
        let covered = device_status(&device, 0, 6 * 4096, 1, &mut out).unwrap();
        assert_eq!((covered, out.len()), (8192, 1));
        assert_eq!(out[0].kind, ExtentKind::ZeroHole);
    }

    #[test]
    fn default_allocation_is_all_data() {
        let device = MemDevice::new(1 << 20);
        let mut out = Vec::new();
        assert_eq!(
            device_status(&device, 512, 4096, 4, &mut out).unwrap(),
            4096
        );
        assert_eq!(
            out,
            [Extent {
                length_bytes: 4096,
                kind: ExtentKind::Data
            }]
        );
    }
}
