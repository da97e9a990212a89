//! Reading one cache block back from the cache device and checking its data CRC, for every
//! thread that needs a block's bytes outside RAM (reads, partial-write merges). The CRC check
//! itself is `Geometry::block_verifies`, shared with writeback, the relocator and recovery.

use std::cell::RefCell;
use std::sync::atomic::Ordering;

use crate::sync::MutexGuard;

use crate::error::{Error, Result};
use crate::format::BLOCK_SIZE_BYTES;
use crate::geometry::CacheBlock;
use crate::inner::Inner;
use crate::io::aligned::AlignedBuf;
use crate::state::State;

thread_local! {
    /// Scratch for reading a block from the cache device (aligned, as O_DIRECT needs).
    pub(crate) static SCRATCH: RefCell<AlignedBuf> =
        RefCell::new(AlignedBuf::new(BLOCK_SIZE_BYTES as usize));
}

/// Reads cache block `c` (the current copy of `lba`) with the state lock released, verifies its
/// checksum and hands the bytes to `use_block`; they stay in this thread's `SCRATCH` afterwards.
/// The segment is pinned meanwhile, so it cannot be reclaimed under the read. Errors are
/// counted; the lock is held again on return.
pub(crate) fn read_verified<'a>(
    inner: &'a Inner,
    st: MutexGuard<'a, State>,
    lba: u64,
    c: CacheBlock,
    use_block: impl FnOnce(&[u8]),
) -> (MutexGuard<'a, State>, Result<()>) {
    let (slot, _) = inner.geo.split(c);
    let crc = st.blocks.crc(c);
    debug_assert_eq!(
        st.blocks.lba_of(c),
        Some(lba),
        "reading a block the index does not hold"
    );
    inner.pins[slot as usize].fetch_add(1, Ordering::AcqRel);
    drop(st);
    let res = SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        inner
            .cache
            .read_at(&mut s, inner.geo.block_offset(c))
            .map_err(|e| Error::io(format!("reading cache block {c} (lba {lba})"), e))?;
        if !inner.geo.block_verifies(lba, &s, crc) {
            return Err(Error::Corruption(format!(
                "cache block {c} (backing block {lba}) fails its checksum"
            )));
        }
        use_block(&s);
        Ok(())
    });
    let pins_before = inner.pins[slot as usize].fetch_sub(1, Ordering::AcqRel);
    assert!(pins_before > 0, "segment pin count underflow");
    let mut st = inner.state.lock();
    match &res {
        Err(Error::Corruption(_)) => st.counters.checksum_errors += 1,
        Err(_) => st.counters.io_errors += 1,
        Ok(()) => {}
    }
    (st, res)
}
