//! Writers waiting for log room are served first come, first served by request: a 1 MiB write
//! (256 blocks) is not starved by a crowd of 4 KiB writers racing it for every freed segment.
//! The bound asserted is structural, not timed: while the big write runs, the small writers can
//! finish at most the room that was free when it started plus one request each queued ahead
//! of it (and one each already past the queue).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use logcache_engine::io::memory::MemDevice;
use logcache_engine::io::BlockDevice;
use logcache_engine::{format_cache, Engine, FormatOptions, OpenOptions};

const KIB: u64 = 1024;
const MIB: u64 = 1 << 20;
const SMALL_WRITERS: u64 = 24;
/// Each small writer's own region, wide enough that it never overwrites a block still in the
/// open chunk (such an overwrite needs no room and would not queue).
const REGION_BYTES: u64 = 8 * MIB;

#[test]
fn a_large_write_is_not_starved_when_the_log_is_full() {
    let cache_bytes = MIB + 4 * MIB;
    let cache: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(cache_bytes));
    let backing = Arc::new(MemDevice::new((SMALL_WRITERS + 1) * REGION_BYTES));
    let fopts = FormatOptions {
        segment_size_bytes: 256 * KIB,
        ..FormatOptions::default()
    };
    format_cache(&*cache, &*backing, &fopts).unwrap();
    let e = Arc::new(Engine::open(cache.clone(), backing.clone(), OpenOptions::default()).unwrap());
    // Writeback starts only when writers wait, so the log stays full and every freed segment
    // is raced for.
    e.set_tunable("writeback_threshold_percent", "100").unwrap();
    e.set_tunable("writeback_idle_ms", "0").unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let small_done = Arc::new(AtomicU64::new(0));
    let writers: Vec<_> = (0..SMALL_WRITERS)
        .map(|w| {
            let (e, stop, small_done) = (e.clone(), stop.clone(), small_done.clone());
            std::thread::spawn(move || {
                let base = (w + 1) * REGION_BYTES;
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let off = base + (i * 4096) % REGION_BYTES;
                    e.write(off, &[(w + 1) as u8; 4096], false).unwrap();
                    small_done.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            })
        })
        .collect();
    while e.stats().counters.write_waits == 0 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }

    let bound = cache_bytes / 4096 + 2 * SMALL_WRITERS;
    let mut worst = 0;
    for round in 0..5u8 {
        let big = vec![round + 100; MIB as usize];
        let before = small_done.load(Ordering::Relaxed);
        e.write(0, &big, false).unwrap();
        let during = small_done.load(Ordering::Relaxed) - before;
        worst = worst.max(during);
        let mut back = vec![0u8; MIB as usize];
        e.read(0, &mut back).unwrap();
        assert!(
            back == big,
            "round {round}: the large write reads back wrong"
        );
    }
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.join().unwrap();
    }
    eprintln!("small writes finished during a 1 MiB write: at most {worst} (bound {bound})");
    assert!(
        worst <= bound,
        "a 1 MiB write waited while {worst} small writes finished (bound {bound}): room is not \
         handed out in request order"
    );
    Arc::try_unwrap(e)
        .ok()
        .expect("writers joined")
        .close()
        .unwrap();
}
