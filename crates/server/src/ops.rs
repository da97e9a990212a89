//! The block operations behind the commands, on top of the export's 512-byte-aligned API:
//! unaligned reads and writes, zeroing, trim and flush.

use logcache_engine::Result;
use parking_lot::Mutex;

use crate::export::Export;
use crate::limits::SECTOR_BYTES;

/// Reads `out.len()` bytes at `offset_bytes`. An unaligned range is read as the covering
/// sector-aligned range into `scratch`, and the slice copied out.
pub(crate) fn read(
    export: &dyn Export,
    offset_bytes: u64,
    out: &mut [u8],
    scratch: &mut Vec<u8>,
) -> Result<()> {
    let length_bytes = out.len() as u64;
    if is_aligned(offset_bytes, length_bytes) {
        return export.read(offset_bytes, out);
    }
    let (cover_offset_bytes, cover_length_bytes) = covering(offset_bytes, length_bytes);
    scratch.clear();
    scratch.resize(cover_length_bytes as usize, 0);
    export.read(cover_offset_bytes, scratch)?;
    let head_bytes = (offset_bytes - cover_offset_bytes) as usize;
    out.copy_from_slice(&scratch[head_bytes..head_bytes + out.len()]);
    Ok(())
}

/// Writes `data` at `offset_bytes`; with `fua`, returns once it is durable. Unaligned writes
/// are read-modify-write of the covering range under `unaligned_lock` (see [`modify`]).
pub(crate) fn write(
    export: &dyn Export,
    unaligned_lock: &Mutex<()>,
    offset_bytes: u64,
    data: &[u8],
    fua: bool,
) -> Result<()> {
    if is_aligned(offset_bytes, data.len() as u64) {
        return export.write(offset_bytes, data, fua);
    }
    modify(
        export,
        unaligned_lock,
        offset_bytes,
        data.len() as u64,
        fua,
        |range| range.copy_from_slice(data),
    )
}

/// WRITE_ZEROES: the range reads as zeros afterwards. With `fua`, returns once durable. The
/// sector-aligned middle goes to the export's `write_zeroes`; bytes of partial sectors at the
/// ends are zeroed by read-modify-write.
pub(crate) fn write_zeroes(
    export: &dyn Export,
    unaligned_lock: &Mutex<()>,
    offset_bytes: u64,
    length_bytes: u64,
    fua: bool,
) -> Result<()> {
    if length_bytes == 0 {
        return Ok(());
    }
    let end_bytes = offset_bytes + length_bytes;
    let (aligned_start_bytes, aligned_end_bytes) = whole_sectors(offset_bytes, length_bytes);
    let zero_bytes = |start: u64, end: u64| {
        modify(export, unaligned_lock, start, end - start, false, |range| {
            range.fill(0)
        })
    };
    if aligned_start_bytes >= aligned_end_bytes {
        // No whole sector inside: one small read-modify-write.
        zero_bytes(offset_bytes, end_bytes)?;
    } else {
        if offset_bytes < aligned_start_bytes {
            zero_bytes(offset_bytes, aligned_start_bytes)?;
        }
        export.write_zeroes(aligned_start_bytes, aligned_end_bytes - aligned_start_bytes)?;
        if aligned_end_bytes < end_bytes {
            zero_bytes(aligned_end_bytes, end_bytes)?;
        }
    }
    flush_if(export, fua)
}

/// TRIM, a hint: the spec lets a client assume nothing about a trimmed range until it writes
/// it again. The whole sectors inside go to the export's `discard` (the engine drops cached
/// copies and passes a discard on; a device punches a hole where it can); partial sectors at
/// the ends keep their data, so a trim never needs a read-modify-write nor the unaligned lock.
pub(crate) fn trim(
    export: &dyn Export,
    _unaligned_lock: &Mutex<()>,
    offset_bytes: u64,
    length_bytes: u64,
    fua: bool,
) -> Result<()> {
    let (aligned_start_bytes, aligned_end_bytes) = whole_sectors(offset_bytes, length_bytes);
    if aligned_start_bytes < aligned_end_bytes {
        export.discard(aligned_start_bytes, aligned_end_bytes - aligned_start_bytes)?;
    }
    flush_if(export, fua)
}

/// The sector-aligned part `[start, end)` of a byte range (empty when `start >= end`).
fn whole_sectors(offset_bytes: u64, length_bytes: u64) -> (u64, u64) {
    let end_bytes = offset_bytes + length_bytes;
    (
        offset_bytes.next_multiple_of(SECTOR_BYTES),
        end_bytes - end_bytes % SECTOR_BYTES,
    )
}

/// With `fua`, the export's flush: it covers every piece that returned before it.
fn flush_if(export: &dyn Export, fua: bool) -> Result<()> {
    if fua {
        export.flush()?;
    }
    Ok(())
}

/// FLUSH: every write that returned before is durable when this returns.
pub(crate) fn flush(export: &dyn Export) -> Result<()> {
    export.flush()
}

/// Read-modify-write of the sector-aligned range covering `[offset, offset + length)`: `apply`
/// changes exactly the requested bytes.
///
/// The lock is server-wide so two unaligned writes (from any connections) into one sector
/// cannot lose each other's bytes. An aligned write racing with an unaligned one over the same
/// sector can still be undone by the write-back, but two clients writing one sector at once
/// without ordering is a race in the clients, whatever the server does. Unaligned IO is rare
/// (the advertised preferred size is 4 KiB), so one lock and a fresh buffer are fine here.
fn modify(
    export: &dyn Export,
    unaligned_lock: &Mutex<()>,
    offset_bytes: u64,
    length_bytes: u64,
    fua: bool,
    apply: impl FnOnce(&mut [u8]),
) -> Result<()> {
    let (cover_offset_bytes, cover_length_bytes) = covering(offset_bytes, length_bytes);
    let head_bytes = (offset_bytes - cover_offset_bytes) as usize;
    let mut buffer = vec![0u8; cover_length_bytes as usize];
    let _serialised = unaligned_lock.lock();
    export.read(cover_offset_bytes, &mut buffer)?;
    apply(&mut buffer[head_bytes..head_bytes + length_bytes as usize]);
    export.write(cover_offset_bytes, &buffer, fua)
}

fn is_aligned(offset_bytes: u64, length_bytes: u64) -> bool {
    offset_bytes.is_multiple_of(SECTOR_BYTES) && length_bytes.is_multiple_of(SECTOR_BYTES)
}

/// The smallest sector-aligned range containing `[offset, offset + length)`, as (offset, length).
fn covering(offset_bytes: u64, length_bytes: u64) -> (u64, u64) {
    let start_bytes = offset_bytes - offset_bytes % SECTOR_BYTES;
    let end_bytes = (offset_bytes + length_bytes).next_multiple_of(SECTOR_BYTES);
    (start_bytes, end_bytes - start_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use logcache_engine::io::memory::MemDevice;
    use logcache_engine::io::BlockDevice;
    use logcache_engine::{format_cache, Engine, FormatOptions, OpenOptions};

    fn engine() -> Engine {
        let cache: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(8 << 20));
        let backing: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(4 << 20));
        let options = FormatOptions {
            segment_size_bytes: 64 << 10,
            ..FormatOptions::default()
        };
        format_cache(&*cache, &*backing, &options).unwrap();
        let open = OpenOptions {
            ram_buffer_bytes: 256 << 10,
            manual_flusher: true,
            ..OpenOptions::default()
        };
        Engine::open(cache, backing, open).unwrap()
    }

    fn read_all(engine: &Engine, length_bytes: usize) -> Vec<u8> {
        let mut out = vec![0u8; length_bytes];
        engine.read(0, &mut out).unwrap();
        out
    }

    #[test]
    fn covering_ranges() {
        assert_eq!(covering(0, 512), (0, 512));
        assert_eq!(covering(1000, 3000), (512, 3584));
        assert_eq!(covering(511, 2), (0, 1024));
        assert_eq!(covering(512, 1), (512, 512));
    }

    #[test]
    fn unaligned_write_and_read_touch_exactly_their_bytes() {
        let engine = engine();
        let lock = Mutex::new(());
        write(&engine, &lock, 0, &[0xab; 8192], false).unwrap();
        write(&engine, &lock, 1000, &[7; 3000], false).unwrap();
        let mut model = vec![0xab; 8192];
        model[1000..4000].fill(7);
        assert_eq!(read_all(&engine, 8192), model);

        let mut scratch = Vec::new();
        let mut out = vec![0u8; 3002];
        read(&engine, 999, &mut out, &mut scratch).unwrap();
        assert_eq!(out, model[999..4001]);
    }

    #[test]
    fn write_zeroes_covers_unaligned_ends_and_large_ranges() {
        let engine = engine();
        let lock = Mutex::new(());
        let total_bytes = 3 << 20;
        write(&engine, &lock, 0, &vec![0x5a; total_bytes], false).unwrap();
        let mut model = vec![0x5a; total_bytes];
        for (offset, length) in [
            (100u64, 10u64),
            (700, 1000),
            (4096, (2 << 20) + 512),
            (3000, 0),
        ] {
            write_zeroes(&engine, &lock, offset, length, true).unwrap();
            model[offset as usize..(offset + length) as usize].fill(0);
            assert_eq!(
                read_all(&engine, total_bytes),
                model,
                "zeroing {offset}+{length}"
            );
        }
    }
}
