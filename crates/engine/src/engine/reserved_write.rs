//! The reserved-write entry points: a large write whose payload is still to arrive takes its
//! log blocks first, the caller receives the payload straight into them, then commits
//! (`path/reserve.rs`). One copy (the caller's `recv`) instead of two.

use std::sync::Arc;

use super::Engine;
use crate::error::Result;
use crate::export::Hold;
use crate::format::BLOCK_SIZE_BYTES;
use crate::inner::Inner;
use crate::path::{alone, reserve};
use crate::tunables;

/// The largest write that can be reserved (the reservation table's runs fit it: see
/// `state/reservations.rs`).
pub const RESERVED_WRITE_MAX_BYTES: u64 = 2 << 20;

/// Log blocks reserved for one write. Fill every byte of `pieces` (in order, the write's data),
/// then `commit` (on any thread: it owns what it needs). Dropped without a commit (the payload
/// never arrived), it leaves nothing visible: its blocks stay holes in the log.
pub struct WriteReservation {
    inner: Arc<Inner>,
    hold: Arc<Hold>,
    reserved: Option<reserve::Reserved>,
    offset_bytes: u64,
}

impl Engine {
    /// Reserves the log blocks for a write-back write of `len_bytes` at `offset_bytes`, both
    /// multiples of 4 KiB, at most `RESERVED_WRITE_MAX_BYTES`. None when the write must take
    /// the ordinary path (`write`): not in write-back mode, served from the backing device
    /// alone, an export holding blocks, or no room in the log now (a reservation never waits,
    /// so the caller's thread does not either).
    pub fn reserve_write(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
    ) -> Result<Option<WriteReservation>> {
        self.check_range(offset_bytes, len_bytes)?;
        let whole_blocks = offset_bytes.is_multiple_of(BLOCK_SIZE_BYTES)
            && len_bytes.is_multiple_of(BLOCK_SIZE_BYTES)
            && len_bytes > 0
            && len_bytes <= RESERVED_WRITE_MAX_BYTES;
        if !whole_blocks || !plain_write_back(&self.inner) {
            return Ok(None);
        }
        let reserved = reserve::reserve(&self.inner, offset_bytes, len_bytes)?;
        Ok(reserved.map(|r| WriteReservation {
            inner: self.inner.clone(),
            hold: self.hold.clone(),
            reserved: Some(r),
            offset_bytes,
        }))
    }
}

/// Whether a write now would go into the log the write-back way.
fn plain_write_back(inner: &Inner) -> bool {
    inner.tunables.get(tunables::CACHE_MODE) == tunables::MODE_WRITE_BACK && !alone::active(inner)
}

impl WriteReservation {
    pub fn offset_bytes(&self) -> u64 {
        self.offset_bytes
    }

    pub fn len_bytes(&self) -> usize {
        self.reserved
            .as_ref()
            .map_or(0, reserve::Reserved::len_bytes)
    }

    /// How many pieces the reserved bytes come in (runs in separate log chunks).
    pub fn piece_count(&self) -> usize {
        self.reserved.as_ref().map_or(0, |r| r.runs().len())
    }

    /// Piece `i` of the reserved bytes, for the caller to fill; the pieces, in order, are the
    /// write's data.
    pub fn piece(&mut self, i: usize) -> &mut [u8] {
        let r = self.reserved.as_ref().expect("not committed");
        // SAFETY: the reservation is live and `&mut self` makes this its only user.
        unsafe { reserve::run_bytes(&self.inner, r, i) }
    }

    /// Publishes the filled blocks: reads see the write from now on, and a later flush makes
    /// it durable, as after `Engine::write`. Returns false when the reservation had to give up
    /// (the same blocks changed meanwhile, a flush or a writer waiting for room needed its
    /// chunks written, the cache mode changed, an export holds blocks, or the engine cannot
    /// take writes): the data is then in `redo`, and the caller must `write` it before
    /// acknowledging the write.
    pub fn commit(mut self, redo: &mut Vec<u8>) -> bool {
        let r = self.reserved.take().expect("committed once");
        let pass = self.hold.try_pass();
        let may_publish = pass.is_some() && plain_write_back(&self.inner);
        reserve::commit(&self.inner, r, redo, may_publish)
    }
}

impl Drop for WriteReservation {
    fn drop(&mut self) {
        if let Some(r) = self.reserved.take() {
            reserve::release(&self.inner, r);
        }
    }
}

impl std::fmt::Debug for WriteReservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteReservation")
            .field("offset_bytes", &self.offset_bytes)
            .field("len_bytes", &self.len_bytes())
            .finish()
    }
}
