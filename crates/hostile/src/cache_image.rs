//! [`open_corrupted_cache`]: recovery of a real cache image whose bytes the input changes.

use std::sync::{Arc, OnceLock};

use logcache_engine::format::superblock::{Superblock, SUPERBLOCK_OFFSETS, SUPERBLOCK_SIZE_BYTES};
use logcache_engine::format::{chunk, BLOCK_SIZE_BYTES};
use logcache_engine::io::memory::MemDevice;
use logcache_engine::io::BlockDevice;
use logcache_engine::{format_cache, Engine, FormatOptions, OpenOptions};

use crate::Input;

const SEGMENT_BYTES: u64 = 64 << 10;
const CACHE_BYTES: u64 = (1 << 20) + 8 * SEGMENT_BYTES;
const BACKING_BYTES: u64 = 4 << 20;
const BLOCK: usize = BLOCK_SIZE_BYTES as usize;

/// A crash image: a cache holding dirty data, zero ranges and partial blocks, several chunks
/// in the log and one wrap of the ring, taken while the engine was still open (no clean
/// checkpoint); plus its backing device.
struct Image {
    cache: Vec<u8>,
    backing: Vec<u8>,
    superblock: Superblock,
}

fn image() -> &'static Image {
    static IMAGE: OnceLock<Image> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let cache = Arc::new(MemDevice::new(CACHE_BYTES));
        let backing = Arc::new(MemDevice::new(BACKING_BYTES));
        let opts = FormatOptions {
            segment_size_bytes: SEGMENT_BYTES,
            ..FormatOptions::default()
        };
        format_cache(&*cache, &*backing, &opts).expect("format the base image");
        let open = OpenOptions {
            ram_buffer_bytes: 2 * SEGMENT_BYTES,
            manual_flusher: true,
            seal_interval_ms: Some(0),
            ..OpenOptions::default()
        };
        let e = Engine::open(cache.clone(), backing.clone(), open).expect("open the base image");
        for i in 0..120u64 {
            let lba = (i * 37) % 700;
            e.write(lba * 4096, &[i as u8 + 1; 4096], false)
                .expect("write");
            if i % 9 == 0 {
                e.write(lba * 4096 + 1024, &[0xaa; 512], false)
                    .expect("write a sector");
                e.flush().expect("flush");
            }
            if i % 40 == 39 {
                e.discard(4096 * 8, 4096 * 4, false).expect("discard");
            }
        }
        e.flush().expect("flush");
        let read_all = |d: &MemDevice, size: u64| {
            let mut v = vec![0u8; size as usize];
            d.read_at(&mut v, 0).expect("read the image");
            v
        };
        let cache_bytes = read_all(&cache, CACHE_BYTES);
        let backing_bytes = read_all(&backing, BACKING_BYTES);
        drop(e);
        let superblock = SUPERBLOCK_OFFSETS
            .iter()
            .filter_map(|&off| {
                let at = off as usize;
                Superblock::decode(&cache_bytes[at..at + SUPERBLOCK_SIZE_BYTES])
                    .ok()
                    .flatten()
            })
            .max_by_key(|s| s.generation)
            .expect("the base image has a superblock");
        Image {
            cache: cache_bytes,
            backing: backing_bytes,
            superblock,
        }
    })
}

/// Recomputes the checksum of both superblock copies and of every chunk header found at the
/// start of a segment and after it, so that a change behind a checksum reaches the parser.
fn fix_checksums(cache: &mut [u8], sb: &Superblock) {
    for &off in &SUPERBLOCK_OFFSETS {
        let at = off as usize;
        let b = &mut cache[at..at + SUPERBLOCK_SIZE_BYTES];
        let crc_at = SUPERBLOCK_SIZE_BYTES - 4;
        let crc = crc32c::crc32c(&b[..crc_at]);
        b[crc_at..].copy_from_slice(&crc.to_le_bytes());
    }
    let seg = sb.segment_size_bytes as usize;
    let blocks_per_segment = (seg / BLOCK) as u32;
    for s in 0..sb.segment_count as usize {
        let base = sb.segments_offset_bytes as usize + s * seg;
        let mut block = 0u32;
        while block < blocks_per_segment {
            let at = base + block as usize * BLOCK;
            let Ok(h) =
                chunk::decode_header(&cache[at..at + BLOCK], sb.format_id, blocks_per_segment)
            else {
                break;
            };
            let meta_end = at + h.meta_block_count as usize * BLOCK;
            chunk::seal(&mut cache[at..meta_end], sb.format_id, h.entry_count);
            if h.start_block as u32 != block {
                break;
            }
            block += h.block_count().max(1);
        }
    }
}

/// Changes the base image as the input says, then opens it: recovery must end in a working
/// engine or an error, never a panic. If it opens, every exported block is read and the cache
/// closed.
///
/// Input: a flags byte (bit 0: recompute checksums after the changes; bit 1: change the
/// backing device's label block instead of the cache), then 5-byte edits: a 32-bit
/// little-endian offset (modulo the device size; offsets are steered to metadata by taking
/// the low bits into the superblocks and segment headers half the time) and a byte to XOR in.
/// What recovery made of a changed image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Opened; every block read (or a read refused) and the cache closed.
    Opened,
    /// `open` returned an error.
    Refused,
}

pub fn open_corrupted_cache(data: &[u8]) -> Outcome {
    let base = image();
    let mut input = Input::new(data);
    let flags = input.u8();
    let mut cache = base.cache.clone();
    let mut backing = base.backing.clone();
    let seg = base.superblock.segment_size_bytes as usize;
    let mut edits = 0;
    while !input.is_empty() && edits < 64 {
        edits += 1;
        let raw = input.u32() as usize;
        let xor = input.u8();
        if flags & 2 != 0 {
            let label_at = backing.len() - BLOCK;
            backing[label_at + raw % 64] ^= xor;
            continue;
        }
        let off = if raw & 1 == 0 {
            // Metadata: the superblocks or the first blocks of a segment.
            let which = (raw >> 1) % (base.superblock.segment_count as usize + 1);
            let within = (raw >> 8) % (2 * BLOCK);
            if which == 0 {
                within
            } else {
                base.superblock.segments_offset_bytes as usize + (which - 1) * seg + within
            }
        } else {
            (raw >> 1) % cache.len()
        };
        cache[off] ^= xor;
    }
    if flags & 1 != 0 {
        fix_checksums(&mut cache, &base.superblock);
    }
    let cache_dev = Arc::new(MemDevice::new(cache.len() as u64));
    cache_dev.write_at(&cache, 0).expect("load the image");
    let backing_dev = Arc::new(MemDevice::new(backing.len() as u64));
    backing_dev.write_at(&backing, 0).expect("load the backing");
    let open = OpenOptions {
        ram_buffer_bytes: 2 * SEGMENT_BYTES,
        manual_flusher: true,
        seal_interval_ms: Some(0),
        ..OpenOptions::default()
    };
    let Ok(e) = Engine::open(cache_dev, backing_dev, open) else {
        return Outcome::Refused;
    };
    let size = e.stats().exported_size_bytes;
    let mut buf = vec![0u8; 64 * BLOCK];
    let mut off = 0;
    while off < size {
        let n = (size - off).min(buf.len() as u64) as usize;
        if e.read(off, &mut buf[..n]).is_err() {
            break;
        }
        off += n as u64;
    }
    let _ = e.drain(|_| {});
    let _ = e.close();
    Outcome::Opened
}
