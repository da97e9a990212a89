//! The flusher starts a round for sealed chunks only once `ROUND_CHUNKS` of them wait (or
//! someone waits on it): woken per chunk, it took the state lock so often that writers parked
//! on it (BENCHMARKS.md, "What the writer sleeps on since 9ec4a33"). Fewer chunks than that
//! must still be written without a flush, a seal deadline or more writes to push them.

use std::time::{Duration, Instant};

use super::test_setup::{formatted, shared};
use crate::log::flusher::ROUND_CHUNKS;
use crate::{Engine, OpenOptions};

/// Far longer than anything here takes on memory devices.
const BOUND: Duration = Duration::from_secs(60);
const SEGMENT_BYTES: u64 = 64 << 10;

#[test]
fn sealed_chunks_short_of_a_round_are_written_without_a_flush() {
    let (cache, backing) = formatted((1 << 20) + 64 * SEGMENT_BYTES, 16 << 20, SEGMENT_BYTES);
    let opts = OpenOptions {
        // Many RAM buffers (none runs short) and no periodic seal: nothing but the flusher's
        // own wake-up may write these chunks.
        ram_buffer_bytes: 32 * SEGMENT_BYTES,
        seal_interval_ms: Some(0),
        ..OpenOptions::default()
    };
    let e = Engine::open(shared(&cache), shared(&backing), opts).expect("open");
    // Whole segments' worth of blocks until fewer than a round's chunks are sealed.
    let mut lba = 0u64;
    while e.stats().counters.chunks_sealed < (ROUND_CHUNKS - 1) as u64 {
        e.write(lba * 4096, &[lba as u8; 4096], false)
            .expect("write");
        lba += 1;
    }
    let sealed = e.stats().counters.chunks_sealed;
    assert!(sealed < ROUND_CHUNKS as u64, "sealed {sealed} chunks");
    let until = Instant::now() + BOUND;
    while e.stats().counters.chunks_written < sealed {
        assert!(
            Instant::now() < until,
            "{sealed} sealed chunks were not written in {BOUND:?}: {:?}",
            e.stats().counters
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // And what was written reads back after a flush and a reopen.
    e.flush().expect("flush");
    e.close().expect("close");
    let e = Engine::open(shared(&cache), shared(&backing), OpenOptions::default()).expect("reopen");
    let mut buf = [0u8; 4096];
    for l in 0..lba {
        e.read(l * 4096, &mut buf).expect("read");
        assert!(
            buf.iter().all(|&b| b == l as u8),
            "block {l} reads back wrong"
        );
    }
    e.close().expect("close");
}
