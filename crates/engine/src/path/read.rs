//! The read path: the newest copy of each sector, from RAM, the cache device or the backing
//! device. Runs of blocks missing from the cache become one backing-device read.

use crate::error::{Error, Result};
use crate::format::{BLOCK_SIZE_BYTES, FULL_MASK, SECTOR_SIZE_BYTES};
use crate::geometry::sector_mask;
use crate::inner::{check_usable, Inner};
use crate::promote;
use crate::state::{Location, State};
use crate::verify::read_verified;

const BLOCK: usize = BLOCK_SIZE_BYTES as usize;
const SECTOR: usize = SECTOR_SIZE_BYTES as usize;

pub fn read(inner: &Inner, offset_bytes: u64, buf: &mut [u8]) -> Result<()> {
    let mut ctx = ReadCtx {
        offset_bytes,
        len_bytes: buf.len() as u64,
        promote: false,
        guard: 0,
    };
    let mut done = 0usize;
    // A pending run of bytes that no cache block covers: [miss_start, done) of `buf`.
    let mut miss_start: Option<usize> = None;
    while done < buf.len() {
        let pos = offset_bytes + done as u64;
        let lba = pos / BLOCK_SIZE_BYTES;
        let in_block = (pos % BLOCK_SIZE_BYTES) as usize;
        let len = (BLOCK - in_block).min(buf.len() - done);
        // The request is counted under the first block's lock hold, not with a lock of its own.
        let first = done == 0;
        let dst = &mut buf[done..done + len];
        match read_block(inner, lba, in_block / SECTOR, dst, first, &mut ctx)? {
            BlockRead::NotCached => {
                miss_start.get_or_insert(done);
            }
            BlockRead::Done => {
                if let Some(start) = miss_start.take() {
                    read_miss(
                        inner,
                        &ctx,
                        offset_bytes + start as u64,
                        &mut buf[start..done],
                    )?;
                }
            }
        }
        done += len;
    }
    if let Some(start) = miss_start {
        read_miss(inner, &ctx, offset_bytes + start as u64, &mut buf[start..])?;
    }
    Ok(())
}

/// What a read request decided once, on its first block.
struct ReadCtx {
    offset_bytes: u64,
    len_bytes: u64,
    /// Promote the blocks it misses.
    promote: bool,
    /// `Promotion::guard` when the request started, before any backing-device read.
    guard: u64,
}

/// What `read_block` did with one block.
enum BlockRead {
    /// Not in the cache: the caller reads it from the backing device, merged with its
    /// neighbours into one IO.
    NotCached,
    /// `dst` holds the block's newest data.
    Done,
}

/// Reads a run of blocks the cache does not hold, then promotes its whole blocks.
fn read_miss(inner: &Inner, ctx: &ReadCtx, offset_bytes: u64, buf: &mut [u8]) -> Result<()> {
    read_backing(inner, offset_bytes, buf)?;
    if ctx.promote {
        promote::promote(inner, ctx.guard, offset_bytes, buf);
    }
    Ok(())
}

fn read_backing(inner: &Inner, offset_bytes: u64, buf: &mut [u8]) -> Result<()> {
    inner.backing.read_at(buf, offset_bytes).map_err(|e| {
        inner.state.lock().counters.io_errors += 1;
        Error::io(
            format!(
                "reading {} bytes at {offset_bytes} from the backing device",
                buf.len()
            ),
            e,
        )
    })
}

/// Reads part of one block if it is cached, taking the state lock once. Counts the block as a
/// hit (every wanted sector in the cache) or a miss, and on the request's `first` block the
/// request itself (deciding then whether its misses are promoted).
fn read_block(
    inner: &Inner,
    lba: u64,
    first_sector: usize,
    dst: &mut [u8],
    first: bool,
    ctx: &mut ReadCtx,
) -> Result<BlockRead> {
    let want = sector_mask(first_sector, dst.len() / SECTOR);
    let in_block = first_sector * SECTOR;
    let mut st = inner.state.lock();
    check_usable(&st)?;
    if first {
        st.counters.reads += 1;
        st.counters.read_bytes += ctx.len_bytes;
        ctx.guard = st.promotion.guard();
        ctx.promote = promote::decide(inner, &mut st, ctx.offset_bytes, ctx.len_bytes);
    }
    let full = want == FULL_MASK;
    let Some(c) = st.blocks.lookup(lba) else {
        count_read(&mut st, false, full);
        return Ok(BlockRead::NotCached);
    };
    let hit = want & !st.blocks.valid(c) == 0;
    count_read(&mut st, hit, full);
    let valid = st.blocks.valid(c);
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
            if let Err(e) = res {
                // A clean copy is only a copy: the backing device holds the same data. Drop
                // the bad copy (a corrupt one must not be served again) and read from there.
                // A dirty block is the only copy: the error goes to the client.
                if st.blocks.lookup(lba) == Some(c) && st.blocks.dirty(c) == 0 {
                    st.evict(c);
                    return Ok(BlockRead::NotCached);
                }
                return Err(e);
            }
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

fn count_read(st: &mut State, hit: bool, full: bool) {
    let c = &mut st.counters;
    match (hit, full) {
        (true, true) => c.read_hits_full += 1,
        (true, false) => c.read_hits_partial += 1,
        (false, true) => c.read_misses_full += 1,
        (false, false) => c.read_misses_partial += 1,
    }
    if hit {
        c.read_hits += 1;
    } else {
        c.read_misses += 1;
    }
}
