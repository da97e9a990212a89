//! `export-diff` on the serving side: the changes since a checkpoint as an `rbd diff v1`
//! stream, describing the disk at one moment: the creation of the new checkpoint.
//!
//! The new checkpoint and a frozen copy of the old one's changed blocks are taken in one lock
//! hold (`Engine::checkpoint_create_since`). Each run of frozen blocks is then read through the
//! engine, and the new checkpoint's bits for that run are checked after the read: none set
//! means no write touched those blocks since the moment, so the bytes read are the moment's.
//! A write to a block not yet exported makes the export fail with one line (never a stream
//! mixing two moments); writes elsewhere, or to blocks already exported, do not matter.
//! Runs of zero blocks become `z` records, the rest `w` records, sorted and disjoint.

use std::io::Write;

use anyhow::{bail, Context, Result};
use logcache_diff::{Encoder, Header};
use logcache_engine::Engine;

const BLOCK_BYTES: u64 = 4096;
/// Blocks read per engine read.
const PIECE_BLOCKS: u64 = 256;

/// What an export wrote.
pub struct Exported {
    pub checkpoint: String,
    pub data_bytes: u64,
    pub zero_bytes: u64,
}

/// Writes the diff since `since` to `out`. With `new`, checkpoint `new` is created and kept
/// (the next export's `--since`); without, a temporary one is created and deleted. A failed
/// export deletes the checkpoint it created.
pub fn export(
    engine: &Engine,
    since: &str,
    new: Option<&str>,
    out: impl Write,
) -> Result<Exported> {
    let name = match new {
        Some(n) => n.to_string(),
        None => format!(
            "export-diff-{}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        ),
    };
    let (_, frozen) = engine.checkpoint_create_since(&name, since)?;
    let result = write_stream(engine, since, new, &name, &frozen, out);
    if result.is_err() || new.is_none() {
        let _ = engine.checkpoint_delete(&name);
    }
    result.map(|(data_bytes, zero_bytes)| Exported {
        checkpoint: name,
        data_bytes,
        zero_bytes,
    })
}

fn write_stream(
    engine: &Engine,
    since: &str,
    new: Option<&str>,
    moment: &str,
    frozen: &[(u64, u64)],
    out: impl Write,
) -> Result<(u64, u64)> {
    let header = Header {
        from_snap: Some(since.as_bytes().to_vec()),
        to_snap: new.map(|n| n.as_bytes().to_vec()),
        size_bytes: engine.size_bytes(),
    };
    let mut enc = Encoder::new(out, &header).context("writing the diff")?;
    let mut buf = vec![0u8; (PIECE_BLOCKS * BLOCK_BYTES) as usize];
    let (mut data_bytes, mut zero_bytes) = (0, 0);
    for &(first, count) in frozen {
        let mut lba = first;
        while lba < first + count {
            let n = PIECE_BLOCKS.min(first + count - lba);
            let (off, len) = (lba * BLOCK_BYTES, n * BLOCK_BYTES);
            let piece = &mut buf[..len as usize];
            engine.read(off, piece)?;
            let runs = engine.checkpoint_changes(moment, off, len, 1)?;
            if runs[0].1 || runs[0].0 < len {
                bail!(
                    "a client wrote to the disk near byte {off} while export-diff read it; the diff would mix two moments, so none was written: retry while writes pause"
                );
            }
            let zero_block = |i: u64| {
                piece[(i * BLOCK_BYTES) as usize..((i + 1) * BLOCK_BYTES) as usize]
                    .iter()
                    .all(|&b| b == 0)
            };
            let mut i = 0;
            while i < n {
                let zero = zero_block(i);
                let mut j = i + 1;
                while j < n && zero_block(j) == zero {
                    j += 1;
                }
                let (at, bytes) = (off + i * BLOCK_BYTES, (j - i) * BLOCK_BYTES);
                if zero {
                    enc.zero(at, bytes)?;
                    zero_bytes += bytes;
                } else {
                    let range = (i * BLOCK_BYTES) as usize..(j * BLOCK_BYTES) as usize;
                    enc.data(at, &piece[range])?;
                    data_bytes += bytes;
                }
                i = j;
            }
            lba += n;
        }
    }
    enc.finish()?.flush().context("writing the diff")?;
    Ok((data_bytes, zero_bytes))
}
