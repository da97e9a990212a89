//! [`Export`]: the block operations the server's commands need, and the two things it serves:
//! the cache [`Engine`], and a plain [`BlockDevice`] served as it is (for `logcache-bench sim-hdd`,
//! an emulated hard disk over a file).
//!
//! Offsets and lengths reaching an export are multiples of 512 and inside the export (the
//! request loop checks the range, `ops` turns unaligned requests into aligned ones).

use std::sync::Arc;

use logcache_engine::io::BlockDevice;
use logcache_engine::status::device_status;
use logcache_engine::{CachedRead, Engine, Error, Extent, Result, WriteReservation};

pub(crate) trait Export: Send + Sync {
    fn size_bytes(&self) -> u64;
    fn read(&self, offset_bytes: u64, out: &mut [u8]) -> Result<()>;
    /// Reads like `read` only if no slow device is involved (every sector cached, at most
    /// 1 MiB), else returns `Ok(false)` having done nothing: a connection's reader serves such
    /// reads itself.
    fn read_if_cached(&self, offset_bytes: u64, out: &mut [u8]) -> Result<bool>;
    /// Serves each read as `read_if_cached` would (its outcome in `served`), their device IOs
    /// submitted together where the export can: a worker's batch of queued READs.
    fn read_batch_if_cached(&self, reads: &mut [CachedRead<'_>]) {
        for read in reads.iter_mut() {
            read.served = self.read_if_cached(read.offset_bytes, read.buf);
        }
    }
    /// With `fua`, returns once the data is durable.
    fn write(&self, offset_bytes: u64, data: &[u8], fua: bool) -> Result<()>;
    /// Log blocks for a plain (non-FUA) write of whole 4 KiB blocks whose payload is still to
    /// be received: the reader receives it straight into them and a worker commits them (one
    /// copy). None
    /// when the write must go the ordinary way (`write`), which also reports any error.
    fn reserve_write(&self, offset_bytes: u64, length_bytes: u64) -> Option<WriteReservation> {
        let _ = (offset_bytes, length_bytes);
        None
    }
    /// The range reads as zeros afterwards (durable after a later flush).
    fn write_zeroes(&self, offset_bytes: u64, length_bytes: u64) -> Result<()>;
    /// TRIM: the range's contents are no longer needed.
    fn discard(&self, offset_bytes: u64, length_bytes: u64) -> Result<()>;
    /// Every write that returned before this call is durable when it returns.
    fn flush(&self) -> Result<()>;
    /// Extents of data and of holes reading as zeros from `offset_bytes` (any alignment; the
    /// range is inside the export), into `out`: at least one, at most `max_extents`, covering
    /// a prefix of the range. Never a hole where there may be data.
    fn block_status(
        &self,
        offset_bytes: u64,
        length_bytes: u64,
        max_extents: usize,
        out: &mut Vec<Extent>,
    ) -> Result<()>;
    /// The checkpoints (`qemu:dirty-bitmap:NAME` contexts), oldest first.
    fn checkpoint_names(&self) -> Vec<String> {
        Vec::new()
    }
    /// Runs of blocks changed (or not) since checkpoint `name`, as (length, changed), from
    /// `offset_bytes` (any alignment; the range is inside the export), into `out`: at least
    /// one, at most `max_runs`, covering a prefix of the range.
    fn changed_runs(
        &self,
        name: &str,
        offset_bytes: u64,
        length_bytes: u64,
        max_runs: usize,
        out: &mut Vec<(u64, bool)>,
    ) -> Result<()> {
        let _ = (offset_bytes, length_bytes, max_runs, out);
        Err(Error::InvalidArgument(format!(
            "this export has no checkpoint {name:?}"
        )))
    }
    /// Whether requests may each take long enough that the client should have many in flight
    /// (a disk rather than a cache): then every command runs on the connection's workers.
    fn is_slow(&self) -> bool;
    /// Whether a plain (non-FUA) write returns without device IO: it is copied into RAM and
    /// logged later. False when writes go to the backing device first (write-through,
    /// write-around), and then they run on the connection's workers.
    fn writes_stay_in_ram(&self) -> bool;
}

impl Export for Engine {
    fn size_bytes(&self) -> u64 {
        Engine::size_bytes(self)
    }

    fn read(&self, offset_bytes: u64, out: &mut [u8]) -> Result<()> {
        Engine::read(self, offset_bytes, out)
    }

    fn read_if_cached(&self, offset_bytes: u64, out: &mut [u8]) -> Result<bool> {
        Engine::read_if_cached(self, offset_bytes, out)
    }

    fn read_batch_if_cached(&self, reads: &mut [CachedRead<'_>]) {
        Engine::read_batch_if_cached(self, reads)
    }

    fn write(&self, offset_bytes: u64, data: &[u8], fua: bool) -> Result<()> {
        Engine::write(self, offset_bytes, data, fua)
    }

    fn reserve_write(&self, offset_bytes: u64, length_bytes: u64) -> Option<WriteReservation> {
        Engine::reserve_write(self, offset_bytes, length_bytes)
            .ok()
            .flatten()
    }

    fn write_zeroes(&self, offset_bytes: u64, length_bytes: u64) -> Result<()> {
        Engine::write_zeroes(self, offset_bytes, length_bytes, false)
    }

    fn discard(&self, offset_bytes: u64, length_bytes: u64) -> Result<()> {
        Engine::discard(self, offset_bytes, length_bytes, false)
    }

    fn flush(&self) -> Result<()> {
        Engine::flush(self)
    }

    fn block_status(
        &self,
        offset_bytes: u64,
        length_bytes: u64,
        max_extents: usize,
        out: &mut Vec<Extent>,
    ) -> Result<()> {
        Engine::block_status(self, offset_bytes, length_bytes, max_extents, out)
    }

    fn checkpoint_names(&self) -> Vec<String> {
        self.checkpoints().into_iter().map(|c| c.name).collect()
    }

    fn changed_runs(
        &self,
        name: &str,
        offset_bytes: u64,
        length_bytes: u64,
        max_runs: usize,
        out: &mut Vec<(u64, bool)>,
    ) -> Result<()> {
        *out = self.checkpoint_changes(name, offset_bytes, length_bytes, max_runs)?;
        Ok(())
    }

    /// Plain writes answer in about a microsecond (see `transmission`).
    fn is_slow(&self) -> bool {
        false
    }

    fn writes_stay_in_ram(&self) -> bool {
        Engine::mode(self) == "write-back"
    }
}

/// Device errors keep their `io::Error` (and so its errno for the reply) behind a description
/// of the operation, as the engine's do.
impl Export for Arc<dyn BlockDevice> {
    fn size_bytes(&self) -> u64 {
        (**self).size_bytes()
    }

    fn read(&self, offset_bytes: u64, out: &mut [u8]) -> Result<()> {
        self.read_at(out, offset_bytes)
            .map_err(|e| Error::io(format!("reading at offset {offset_bytes}"), e))
    }

    /// A plain device is the slow device itself: its reads all run on workers.
    fn read_if_cached(&self, _offset_bytes: u64, _out: &mut [u8]) -> Result<bool> {
        Ok(false)
    }

    fn write(&self, offset_bytes: u64, data: &[u8], fua: bool) -> Result<()> {
        self.write_at(data, offset_bytes)
            .map_err(|e| Error::io(format!("writing at offset {offset_bytes}"), e))?;
        if fua {
            Export::flush(self)?;
        }
        Ok(())
    }

    fn write_zeroes(&self, offset_bytes: u64, length_bytes: u64) -> Result<()> {
        (**self)
            .write_zeroes(offset_bytes, length_bytes)
            .map_err(|e| Error::io(format!("zeroing at offset {offset_bytes}"), e))
    }

    fn discard(&self, offset_bytes: u64, length_bytes: u64) -> Result<()> {
        (**self)
            .discard(offset_bytes, length_bytes)
            .map_err(|e| Error::io(format!("discarding at offset {offset_bytes}"), e))
    }

    fn flush(&self) -> Result<()> {
        (**self)
            .flush()
            .map_err(|e| Error::io("flushing the device", e))
    }

    fn block_status(
        &self,
        offset_bytes: u64,
        length_bytes: u64,
        max_extents: usize,
        out: &mut Vec<Extent>,
    ) -> Result<()> {
        out.clear();
        device_status(&**self, offset_bytes, length_bytes, max_extents, out)
            .map_err(|e| Error::io(format!("block status at offset {offset_bytes}"), e))?;
        Ok(())
    }

    /// Every request waits for the device; a disk only does its best with many queued.
    fn is_slow(&self) -> bool {
        true
    }

    fn writes_stay_in_ram(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use logcache_engine::io::memory::MemDevice;

    #[test]
    fn device_export_passes_operations_through_and_keeps_the_errno() {
        let device: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(1 << 20));
        let export: &dyn Export = &device;
        assert_eq!(export.size_bytes(), 1 << 20);
        assert!(export.is_slow());
        export.write(4096, &[7u8; 8192], true).unwrap();
        let mut out = vec![0u8; 8192];
        export.read(4096, &mut out).unwrap();
        assert_eq!(out, vec![7u8; 8192]);
        export.write_zeroes(4096, 4096).unwrap();
        export.read(4096, &mut out).unwrap();
        assert_eq!(out[..4096], [0u8; 4096]);
        assert_eq!(out[4096..], [7u8; 4096]);
        export.discard(8192, 4096).unwrap();
        export.flush().unwrap();

        let past_end = export.read(1 << 20, &mut out).unwrap_err();
        assert!(matches!(past_end, Error::Io { .. }), "{past_end}");
        assert!(
            past_end.to_string().contains("offset 1048576"),
            "{past_end}"
        );
    }
}
