//! The RAM cache (`path::hot`) across a segment's reuse: a block a small read put in the RAM
//! cache stays there while its segment is reclaimed and its slot reused by a later segment; a
//! read of whatever the new segment holds at that same cache block must get the new data (its
//! key carries the new segment id), never the old copy. The test checks it really made that
//! case: the old copy is still in the RAM cache, under the same cache block, when it reads.

use super::test_setup::{formatted, shared};
use crate::format::BLOCK_SIZE_BYTES;
use crate::path::hot::HotKey;
use crate::state::Location;
use crate::{Engine, OpenOptions};

const BLOCK: usize = BLOCK_SIZE_BYTES as usize;
/// Blocks the writes cycle over: twice the cache's ring, so it wraps and reuses every slot.
const WORKING_SET_BLOCKS: u64 = 512;

/// Block `lba`'s content at version `v`: both written into it, so a stale copy is told apart.
fn content(lba: u64, v: u64) -> Vec<u8> {
    let mut b = vec![(lba as u8) ^ (v as u8) ^ 0x5a; BLOCK];
    b[..8].copy_from_slice(&lba.to_le_bytes());
    b[8..16].copy_from_slice(&v.to_le_bytes());
    b
}

/// Where the index puts `lba` if its newest copy is on the cache device: the RAM cache's key
/// for it and its CRC.
fn on_device(e: &Engine, lba: u64) -> Option<(HotKey, u32)> {
    let st = e.inner.state.lock();
    let c = st.blocks.lookup(lba)?;
    if st.locate(c) != Location::Disk {
        return None;
    }
    let (slot, _) = e.inner.geo.split(c);
    let key = HotKey {
        segment_id: st.ring.segment(slot).id,
        cache_block: c,
    };
    Some((key, st.blocks.crc(c)))
}

fn read_block(e: &Engine, lba: u64) -> Vec<u8> {
    let mut b = vec![0u8; BLOCK];
    e.read(lba * BLOCK_SIZE_BYTES, &mut b).expect("read");
    b
}

#[test]
fn a_reused_segment_never_serves_the_old_copy_from_the_ram_cache() {
    // 16 segments of 64 KiB after the 1 MiB superblock region: 256 blocks of ring.
    let (cache, backing) = formatted(2 << 20, 8 << 20, 64 << 10);
    let opts = OpenOptions {
        manual_flusher: true,
        ram_buffer_bytes: 4 * (64 << 10),
        ram_cache_bytes: Some(1 << 20),
        ..OpenOptions::default()
    };
    let e = Engine::open(shared(&cache), shared(&backing), opts).expect("open");
    assert!(e.inner.hot.enabled());
    let mut version = vec![0u64; WORKING_SET_BLOCKS as usize];
    let mut write = |e: &Engine, lba: u64| {
        version[lba as usize] += 1;
        let v = version[lba as usize];
        e.write(lba * BLOCK_SIZE_BYTES, &content(lba, v), false)
            .expect("write");
        v
    };
    // Fill the first segments, write them to the cache device and back to the backing device.
    for lba in 0..64 {
        write(&e, lba);
    }
    e.flush().expect("flush");
    e.drain(|_| {}).expect("drain");
    let old_lba = (0..64)
        .find(|&lba| on_device(&e, lba).is_some())
        .expect("a block on the cache device");
    let (old_key, old_crc) = on_device(&e, old_lba).unwrap();
    assert_eq!(read_block(&e, old_lba), content(old_lba, 1));
    let mut probe = vec![0u8; BLOCK];
    assert!(
        e.inner.hot.get(old_key, old_lba, old_crc, 0, &mut probe),
        "a small read's verified block enters the RAM cache"
    );
    assert_eq!(probe, content(old_lba, 1));
    let hits_before = e.stats().counters.read_hits_ram_cache;
    assert_eq!(read_block(&e, old_lba), content(old_lba, 1));
    assert_eq!(e.stats().counters.read_hits_ram_cache, hits_before + 1);

    // Write on (the old block too) until the old block's slot holds a later segment whose
    // block at the same place is on the cache device.
    let mut found = None;
    for i in 0..(20 * WORKING_SET_BLOCKS) {
        let lba = (64 + i) % WORKING_SET_BLOCKS;
        write(&e, lba);
        if i % 16 == 15 {
            e.flush().expect("flush");
        }
        if i % 64 == 63 {
            e.drain(|_| {}).expect("drain");
        }
        let st = e.inner.state.lock();
        let (slot, _) = e.inner.geo.split(old_key.cache_block);
        let reused = st.ring.segment(slot).id > old_key.segment_id;
        let now = st.blocks.lba_of(old_key.cache_block);
        drop(st);
        if let Some(new_lba) = now.filter(|_| reused) {
            if let Some((new_key, _)) = on_device(&e, new_lba) {
                assert_eq!(new_key.cache_block, old_key.cache_block);
                found = Some((new_lba, new_key));
                break;
            }
        }
    }
    let (new_lba, new_key) = found.expect("the ring wrapped and reused the old block's slot");
    assert!(new_key.segment_id > old_key.segment_id);
    // The old copy is still in the RAM cache, under the same cache block ...
    assert!(
        e.inner.hot.get(old_key, old_lba, old_crc, 0, &mut probe),
        "the old copy left the RAM cache: the test no longer covers a reused slot"
    );
    // ... and the read of the block now there gets the new data, from the cache device.
    let hits_before = e.stats().counters.read_hits_ram_cache;
    let want = content(new_lba, version[new_lba as usize]);
    assert_eq!(read_block(&e, new_lba), want, "lba {new_lba}");
    assert_eq!(e.stats().counters.read_hits_ram_cache, hits_before);
    // It entered the RAM cache under its own key, and is served from there next.
    assert_eq!(read_block(&e, new_lba), want);
    assert_eq!(e.stats().counters.read_hits_ram_cache, hits_before + 1);
    // The old lba reads its newest data too (wherever that is now).
    assert_eq!(
        read_block(&e, old_lba),
        content(old_lba, version[old_lba as usize])
    );
    e.close().expect("close");
}

/// Large reads neither use nor fill the RAM cache; `ram_cache_mib` resizes it online (the
/// copies dropped) and 0 turns it off.
#[test]
fn large_reads_pass_the_ram_cache_and_the_tunable_resizes_it() {
    let (cache, backing) = formatted(4 << 20, 8 << 20, 64 << 10);
    let opts = OpenOptions {
        manual_flusher: true,
        ram_cache_bytes: Some(1 << 20),
        ..OpenOptions::default()
    };
    let e = Engine::open(shared(&cache), shared(&backing), opts).expect("open");
    for lba in 0..128u64 {
        e.write(lba * BLOCK_SIZE_BYTES, &content(lba, 1), false)
            .expect("write");
    }
    e.flush().expect("flush");
    e.drain(|_| {}).expect("drain");
    let on_disk: Vec<u64> = (0..128).filter(|&l| on_device(&e, l).is_some()).collect();
    assert!(on_disk.len() >= 32, "{on_disk:?}");
    // One 512 KiB read: nothing enters.
    let mut big = vec![0u8; 128 * BLOCK];
    e.read(0, &mut big).expect("read");
    for lba in 0..128u64 {
        let b = &big[lba as usize * BLOCK..(lba as usize + 1) * BLOCK];
        assert_eq!(b, &content(lba, 1)[..]);
    }
    assert_eq!(e.stats().ram_cache_blocks, 0);
    // 64 KiB reads: every whole block read from the cache device enters.
    for chunk in 0..8u64 {
        let mut b = vec![0u8; 16 * BLOCK];
        e.read(chunk * 16 * BLOCK_SIZE_BYTES, &mut b).expect("read");
    }
    assert_eq!(e.stats().ram_cache_blocks, on_disk.len() as u64);
    // Served from it now, a sub-block read too.
    let hits = e.stats().counters.read_hits_ram_cache;
    let lba = on_disk[3];
    let mut part = vec![0u8; 1024];
    e.read(lba * BLOCK_SIZE_BYTES + 2048, &mut part)
        .expect("read");
    assert_eq!(part, content(lba, 1)[2048..3072]);
    assert_eq!(e.stats().counters.read_hits_ram_cache, hits + 1);
    e.set_tunable("ram_cache_mib", "2").expect("set");
    assert_eq!(e.stats().ram_cache_bytes, 2 << 20);
    assert_eq!(e.stats().ram_cache_blocks, 0);
    e.set_tunable("ram_cache_mib", "0").expect("set");
    assert_eq!(e.stats().ram_cache_bytes, 0);
    assert_eq!(read_block(&e, lba), content(lba, 1));
    assert_eq!(e.stats().ram_cache_blocks, 0);
    e.close().expect("close");
}
