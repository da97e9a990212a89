//! Applying an `rbd diff v1` stream (crate `logcache-diff`) to a block device: each `w` record
//! written, each `z` record made to read as zeros (the device's write-zeroes: a hole in a file,
//! `NBD_CMD_WRITE_ZEROES`, librbd's write-zeroes), then one flush. Ceph's records may start or end
//! inside a 512-byte sector (librbd writes bytes); devices take whole sectors, so a record's
//! partial sectors are read, patched and written back. One thread, records in stream order, so
//! two records sharing a sector never race.
//!
//! Applying a stream is idempotent: each record sets its bytes outright, so applying the same
//! stream again over a partly updated target finishes the job. Error messages say so.

use std::io::Read;

use anyhow::{bail, Context, Result};
use logcache_diff::{Decoder, Piece};
use logcache_engine::io::{BlockDevice, SECTOR_SIZE_BYTES};

/// What an import did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// Bytes written from `w` records.
    pub data_bytes: u64,
    /// Bytes made zero by `z` records.
    pub zero_bytes: u64,
    /// Partial sectors read, patched and written back.
    pub partial_sectors: u64,
}

/// Applies the rest of `decoder`'s stream to `target` and flushes it. `stream` and `target_name`
/// name them in errors. The caller has checked the stream's header against the target.
pub fn apply<R: Read>(
    decoder: &mut Decoder<R>,
    target: &dyn BlockDevice,
    stream: &str,
    target_name: &str,
) -> Result<Applied> {
    assert_eq!(decoder.header().size_bytes, target.size_bytes());
    let reconnects = target.reconnects();
    let mut applied = Applied::default();
    loop {
        let piece = match decoder.next_piece() {
            Ok(Some(piece)) => piece,
            Ok(None) => break,
            Err(e) => bail!(
                "the diff {stream} is damaged: {e}; {target_name} is partly updated: apply an \
                 intact stream (applying one again is harmless)"
            ),
        };
        let (offset_bytes, result) = match piece {
            Piece::Data {
                offset_bytes,
                bytes,
            } => {
                applied.data_bytes += bytes.len() as u64;
                let r = write_bytes(target, offset_bytes, Some(bytes), bytes.len() as u64);
                (offset_bytes, r)
            }
            Piece::Zero {
                offset_bytes,
                length_bytes,
            } => {
                applied.zero_bytes += length_bytes;
                (
                    offset_bytes,
                    write_bytes(target, offset_bytes, None, length_bytes),
                )
            }
        };
        applied.partial_sectors += result.with_context(|| {
            format!(
                "writing {target_name} at byte {offset_bytes}; it is partly updated: apply the \
                 diff again once it can be written"
            )
        })?;
    }
    target.flush().with_context(|| {
        format!("flushing {target_name}; apply the diff again once it can be flushed")
    })?;
    // Writes acknowledged before a reconnect may be lost (the server may have restarted).
    if target.reconnects() != reconnects {
        bail!(
            "the connection to {target_name} was re-established during the import, so writes \
             before it may be lost; apply the diff again (applying it twice is harmless)"
        );
    }
    Ok(applied)
}

/// Writes `data` (or zeros, when `None`) over `length_bytes` from `offset_bytes`: the whole
/// sectors in one call, each partial sector at either end read, patched and written back.
/// Returns how many partial sectors there were.
fn write_bytes(
    target: &dyn BlockDevice,
    offset_bytes: u64,
    data: Option<&[u8]>,
    length_bytes: u64,
) -> std::io::Result<u64> {
    debug_assert!(data.is_none_or(|d| d.len() as u64 == length_bytes));
    let end_bytes = offset_bytes + length_bytes;
    let whole_start = offset_bytes.next_multiple_of(SECTOR_SIZE_BYTES);
    let whole_end = end_bytes - end_bytes % SECTOR_SIZE_BYTES;
    let part = |from: u64, to: u64| {
        data.map(|d| &d[(from - offset_bytes) as usize..(to - offset_bytes) as usize])
    };
    if whole_start > whole_end {
        // Inside one sector.
        patch_sector(
            target,
            offset_bytes,
            part(offset_bytes, end_bytes),
            length_bytes,
        )?;
        return Ok(1);
    }
    let mut partial = 0;
    if offset_bytes < whole_start {
        patch_sector(
            target,
            offset_bytes,
            part(offset_bytes, whole_start),
            whole_start - offset_bytes,
        )?;
        partial += 1;
    }
    if whole_start < whole_end {
        match part(whole_start, whole_end) {
            Some(bytes) => target.write_at(bytes, whole_start)?,
            None => target.write_zeroes(whole_start, whole_end - whole_start)?,
        }
    }
    if whole_end < end_bytes {
        patch_sector(
            target,
            whole_end,
            part(whole_end, end_bytes),
            end_bytes - whole_end,
        )?;
        partial += 1;
    }
    Ok(partial)
}

/// Read-modify-write of the sector holding `offset_bytes`: `length_bytes` of `data` (or
/// zeros) from there, all inside that sector.
fn patch_sector(
    target: &dyn BlockDevice,
    offset_bytes: u64,
    data: Option<&[u8]>,
    length_bytes: u64,
) -> std::io::Result<()> {
    let sector_bytes = offset_bytes - offset_bytes % SECTOR_SIZE_BYTES;
    let at = (offset_bytes - sector_bytes) as usize;
    assert!(at as u64 + length_bytes <= SECTOR_SIZE_BYTES);
    let mut sector = [0u8; SECTOR_SIZE_BYTES as usize];
    target.read_at(&mut sector, sector_bytes)?;
    let span = &mut sector[at..at + length_bytes as usize];
    match data {
        Some(d) => span.copy_from_slice(d),
        None => span.fill(0),
    }
    target.write_at(&sector, sector_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use logcache_diff::{Encoder, Header};
    use logcache_engine::io::memory::MemDevice;
    use logcache_testkit::rng::{seed_from_env, Rng};

    fn header(size_bytes: u64) -> Header {
        Header {
            from_snap: None,
            to_snap: None,
            size_bytes,
        }
    }

    /// Random streams with unaligned and aligned records, applied to a device holding random
    /// bytes, must give exactly what applying them to a byte array gives.
    #[test]
    fn random_streams_apply_exactly() {
        let seed = seed_from_env("LOGCACHE_SEED");
        let mut rng = Rng::new(seed);
        for case in 0..60 {
            let size_bytes = 512 * rng.range(1, 4096);
            let dev = MemDevice::new(size_bytes);
            let mut model = vec![0u8; size_bytes as usize];
            rng.fill(&mut model);
            dev.write_at(&model, 0).unwrap();
            let mut e = Encoder::new(Vec::new(), &header(size_bytes)).unwrap();
            let mut at = 0u64;
            loop {
                let end_of_last = at;
                at += rng.below(size_bytes / 6 + 1);
                // Aligning down must not reach back into the last record: the encoder
                // refuses overlapping records (and asserts on them).
                if rng.chance(1, 2) && at - at % 512 >= end_of_last {
                    at -= at % 512;
                }
                if at >= size_bytes {
                    break;
                }
                let max_len = if rng.chance(1, 8) { 3 << 20 } else { 9000 };
                let mut len = rng.range(1, (size_bytes - at).min(max_len));
                if rng.chance(1, 2) && len >= 512 {
                    len -= len % 512;
                }
                let range = at as usize..(at + len) as usize;
                if rng.chance(1, 2) {
                    let mut data = vec![0u8; len as usize];
                    rng.fill(&mut data);
                    e.data(at, &data).unwrap();
                    model[range].copy_from_slice(&data);
                } else {
                    e.zero(at, len).unwrap();
                    model[range].fill(0);
                }
                at += len;
            }
            let stream = e.finish().unwrap();
            let mut d = Decoder::new(&stream[..]).unwrap();
            apply(&mut d, &dev, "s", "t").unwrap();
            let mut got = vec![0u8; size_bytes as usize];
            dev.read_at(&mut got, 0).unwrap();
            assert!(
                got == model,
                "LOGCACHE_SEED={seed} case {case}: the device differs"
            );
        }
    }

    #[test]
    fn records_inside_one_sector_and_across_sectors() {
        let dev = MemDevice::new(4096);
        dev.write_at(&[0xEE; 4096], 0).unwrap();
        let mut e = Encoder::new(Vec::new(), &header(4096)).unwrap();
        e.data(10, &[1, 2, 3]).unwrap();
        e.zero(100, 20).unwrap();
        e.data(500, &[7; 1100]).unwrap();
        e.zero(1700, 1000).unwrap();
        let stream = e.finish().unwrap();
        let mut d = Decoder::new(&stream[..]).unwrap();
        let applied = apply(&mut d, &dev, "s", "t").unwrap();
        assert_eq!(applied.data_bytes, 1103);
        assert_eq!(applied.zero_bytes, 1020);
        // 10..13 and 100..120 in one sector each; 500..1600 and 1700..2700 partial at both ends.
        assert_eq!(applied.partial_sectors, 6);
        let mut got = vec![0u8; 4096];
        dev.read_at(&mut got, 0).unwrap();
        let mut want = vec![0xEE; 4096];
        want[10..13].copy_from_slice(&[1, 2, 3]);
        want[100..120].fill(0);
        want[500..1600].fill(7);
        want[1700..2700].fill(0);
        assert_eq!(got, want);
    }

    #[test]
    fn a_damaged_stream_says_what_and_that_applying_again_is_harmless() {
        let dev = MemDevice::new(4096);
        let mut e = Encoder::new(Vec::new(), &header(4096)).unwrap();
        e.data(0, &[1; 512]).unwrap();
        let mut stream = e.finish().unwrap();
        stream.pop();
        let mut d = Decoder::new(&stream[..]).unwrap();
        let err = apply(&mut d, &dev, "in.diff", "copy.img").unwrap_err();
        let line = crate::exit::one_line(&err);
        assert!(
            line.starts_with("the diff in.diff is damaged: the stream ends early"),
            "{line}"
        );
        assert!(line.contains("copy.img is partly updated"), "{line}");
    }
}
