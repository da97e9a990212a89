//! The read path: the newest copy of each sector, from RAM, the cache device or the backing
//! device. Runs of blocks missing from the cache become one backing-device read.

use std::sync::atomic::Ordering;

use parking_lot::MutexGuard;

use super::state::{Location, State};
use super::write::{check_usable, sector_mask, SCRATCH};
use super::Inner;
use crate::error::{Error, Result};
use crate::format::{crc_block, BLOCK_SIZE_BYTES, FULL_MASK, SECTOR_SIZE_BYTES};

const BLOCK: usize = BLOCK_SIZE_BYTES as usize;
const SECTOR: usize = SECTOR_SIZE_BYTES as usize;

pub fn read(inner: &Inner, offset: u64, buf: &mut [u8]) -> Result<()> {
    let mut done = 0usize;
    // A pending run of bytes that no cache block covers: [miss_start, done) of `buf`.
    let mut miss_start: Option<usize> = None;
    while done < buf.len() {
        let pos = offset + done as u64;
        let lba = pos / BLOCK_SIZE_BYTES;
        let in_block = (pos % BLOCK_SIZE_BYTES) as usize;
        let len = (BLOCK - in_block).min(buf.len() - done);
        // The request is counted under the first block's lock hold, not with a lock of its own.
        let request_bytes = if done == 0 { buf.len() as u64 } else { 0 };
        let dst = &mut buf[done..done + len];
        match read_block(inner, lba, in_block / SECTOR, dst, request_bytes)? {
            BlockRead::NotCached => {
                miss_start.get_or_insert(done);
            }
            BlockRead::Done => {
                if let Some(start) = miss_start.take() {
                    read_backing(inner, offset + start as u64, &mut buf[start..done])?;
                }
            }
        }
        done += len;
    }
    if let Some(start) = miss_start {
        read_backing(inner, offset + start as u64, &mut buf[start..])?;
    }
    Ok(())
}

/// What `read_block` did with one block.
enum BlockRead {
    /// Not in the cache: the caller reads it from the backing device, merged with its
    /// neighbours into one IO.
    NotCached,
    /// `dst` holds the block's newest data.
    Done,
}

fn read_backing(inner: &Inner, offset: u64, buf: &mut [u8]) -> Result<()> {
    inner.backing.read_at(buf, offset).map_err(|e| {
        inner.state.lock().counters.io_errors += 1;
        Error::io(
            format!(
                "reading {} bytes at {offset} from the backing device",
                buf.len()
            ),
            e,
        )
    })
}

/// Reads part of one block if it is cached, taking the state lock once. Counts the block as a
/// hit (every wanted sector in the cache) or a miss, and the request when `request_bytes > 0`.
fn read_block(
    inner: &Inner,
    lba: u64,
    first_sector: usize,
    dst: &mut [u8],
    request_bytes: u64,
) -> Result<BlockRead> {
    let want = sector_mask(first_sector, dst.len() / SECTOR);
    let in_block = first_sector * SECTOR;
    let mut st = inner.state.lock();
    check_usable(&st)?;
    if request_bytes > 0 {
        st.counters.reads += 1;
        st.counters.read_bytes += request_bytes;
    }
    let Some(c) = st.index.get(lba) else {
        st.counters.read_misses += 1;
        return Ok(BlockRead::NotCached);
    };
    if want & !st.valid_mask[c as usize] == 0 {
        st.counters.read_hits += 1;
    } else {
        st.counters.read_misses += 1;
    }
    let valid = st.valid_mask[c as usize];
    match st.locate(c) {
        Location::OpenChunk { buffer } | Location::Ram { buffer } => {
            let off = st.offset_in_buffer(c) + in_block;
            // SAFETY: data blocks in RAM are read under the state lock.
            dst.copy_from_slice(unsafe { inner.buffers.slice(buffer, off, dst.len()) });
            st.counters.read_hits_ram += 1;
        }
        Location::Disk => {
            let (guard, res) = read_verified(inner, st, lba, c, |block| {
                dst.copy_from_slice(&block[in_block..in_block + dst.len()]);
            });
            st = guard;
            res?;
        }
    }
    drop(st);
    let missing = want & !valid;
    if missing == 0 {
        return Ok(BlockRead::Done);
    }
    // Sectors the cache never held come from the backing device, one read per run.
    debug_assert!(valid != FULL_MASK);
    let mut s = 0usize;
    while s < 8 {
        if missing & (1 << s) == 0 {
            s += 1;
            continue;
        }
        let run_start = s;
        while s < 8 && missing & (1 << s) != 0 {
            s += 1;
        }
        let from = run_start * SECTOR - in_block;
        let to = s * SECTOR - in_block;
        read_backing(
            inner,
            lba * BLOCK_SIZE_BYTES + (run_start * SECTOR) as u64,
            &mut dst[from..to],
        )?;
    }
    Ok(BlockRead::Done)
}

/// Reads cache block `c` (the current copy of `lba`) with the state lock released, verifies its
/// checksum and hands the bytes to `use_block`. The segment is pinned meanwhile, so it cannot be
/// reclaimed under the read. Errors are counted; the lock is held again on return.
pub(crate) fn read_verified<'a>(
    inner: &'a Inner,
    st: MutexGuard<'a, State>,
    lba: u64,
    c: u32,
    use_block: impl FnOnce(&[u8]),
) -> (MutexGuard<'a, State>, Result<()>) {
    let (slot, _) = inner.geo.split(c);
    let crc = st.data_crc[c as usize];
    inner.pins[slot as usize].fetch_add(1, Ordering::AcqRel);
    drop(st);
    let res = SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        inner
            .cache
            .read_at(&mut s, inner.geo.block_offset(c))
            .map_err(|e| Error::io(format!("reading cache block {c} (lba {lba})"), e))?;
        if crc_block(inner.geo.format_id, lba, &s) != crc {
            return Err(Error::Corruption(format!(
                "cache block {c} (backing block {lba}) fails its checksum"
            )));
        }
        use_block(&s);
        Ok(())
    });
    inner.pins[slot as usize].fetch_sub(1, Ordering::AcqRel);
    let mut st = inner.state.lock();
    match &res {
        Err(Error::Corruption(_)) => st.counters.checksum_errors += 1,
        Err(_) => st.counters.io_errors += 1,
        Ok(()) => {}
    }
    (st, res)
}
