//! `export-diff` on the serving side: the changes since a checkpoint as an `rbd diff v1`
//! stream, describing the disk at one moment: the creation of the new checkpoint.
//!
//! `Engine::export_begin` creates the new checkpoint and takes the old one's changed blocks
//! at one moment, and holds them: a client changing a block not yet exported makes the
//! engine keep the moment's copy first (engine `export.rs`), so clients keep writing while
//! the export reads. Runs of zero blocks become `z` records, the rest `w` records, sorted
//! and disjoint.

use std::io::Write;

use anyhow::{Context, Result};
use logcache_diff::{Encoder, Header};
use logcache_engine::{Engine, Export};

const BLOCK_BYTES: u64 = 4096;
/// Blocks read per engine read.
const PIECE_BLOCKS: u64 = 256;
/// The most RAM an export spends on the moment's copies of blocks clients rewrite before it
/// reads them; past that it fails with one line (the disk is unaffected).
pub const HOLD_LIMIT_BYTES: u64 = 256 << 20;

/// What an export wrote.
pub struct Exported {
    pub checkpoint: String,
    pub data_bytes: u64,
    pub zero_bytes: u64,
    /// Bytes clients rewrote during the export whose moment's copy was kept for it.
    pub kept_bytes: u64,
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
    let mut held = engine.export_begin(&name, since, HOLD_LIMIT_BYTES)?;
    let result = write_stream(engine.size_bytes(), since, new, &mut held, out);
    let kept_bytes = held.kept_blocks() * BLOCK_BYTES;
    drop(held);
    if result.is_err() || new.is_none() {
        let _ = engine.checkpoint_delete(&name);
    }
    result.map(|(data_bytes, zero_bytes)| Exported {
        checkpoint: name,
        data_bytes,
        zero_bytes,
        kept_bytes,
    })
}

fn write_stream(
    size_bytes: u64,
    since: &str,
    new: Option<&str>,
    held: &mut Export,
    out: impl Write,
) -> Result<(u64, u64)> {
    let header = Header {
        from_snap: Some(since.as_bytes().to_vec()),
        to_snap: new.map(|n| n.as_bytes().to_vec()),
        size_bytes,
    };
    let mut enc = Encoder::new(out, &header).context("writing the diff")?;
    let mut buf = vec![0u8; (PIECE_BLOCKS * BLOCK_BYTES) as usize];
    let (mut data_bytes, mut zero_bytes) = (0, 0);
    let runs = held.runs().to_vec();
    for (first, count) in runs {
        let mut lba = first;
        while lba < first + count {
            let n = PIECE_BLOCKS.min(first + count - lba);
            let (off, len) = (lba * BLOCK_BYTES, n * BLOCK_BYTES);
            let piece = &mut buf[..len as usize];
            held.read(lba, piece)?;
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
