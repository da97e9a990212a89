//! A backing sync that succeeds after another one failed but before the failing thread handled
//! its failure, forced with a `failpoint` (the gap between the failed sync's return and its
//! thread's state lock, which neither the gate devices nor the scheduler can hold open).
//! Noted first, the success moved `synced_gen` over the write-through write the failed sync
//! had dropped and the flush returned OK; the failing thread then found nothing at risk, and a
//! power cut lost the write. Now the success finds the backing device's failed-sync count
//! ahead of what the state handled and handles it first (`State::note_backing_synced`); and
//! the same while serving from the backing device alone (`path::lost::Lost::note_synced`).

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use logcache_testkit::fault::{FaultDevice, FaultKind, OpKind};
use logcache_testkit::sim::SimDevice;

use super::test_setup::{formatted, shared};
use crate::{Engine, OpenOptions};

/// Far longer than a flush needs on memory devices.
const BOUND: Duration = Duration::from_secs(30);

/// A power cut now: a fresh device holding what `dev` made durable.
fn power_cut_copy(dev: &SimDevice) -> SimDevice {
    let image = dev.durable_image();
    let copy = SimDevice::new(image.len() as u64);
    copy.write_raw(0, &image);
    copy
}

#[test]
fn a_sync_that_succeeds_before_a_failed_one_is_handled_does_not_vouch_for_its_writes() {
    let (cache, backing) = formatted((1 << 20) + (16 << 16), 16 << 20, 64 << 10);
    let faulty = Arc::new(FaultDevice::new(shared(&backing)));
    let opts = OpenOptions {
        ram_buffer_bytes: 4 << 16,
        manual_flusher: true,
        seal_interval_ms: Some(0),
        ..OpenOptions::default()
    };
    let e = Engine::open(shared(&cache), faulty.clone(), opts.clone()).expect("open");
    e.set_tunable("cache_mode", "write-through").unwrap();
    e.write(0, &[0x44; 4096], false).unwrap();
    // Flush A's backing sync fails and the device drops the write; A stops before handling it.
    faulty.fail_next(OpKind::Flush, 1, FaultKind::Io);
    let (at_tx, at_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let go_rx = parking_lot::Mutex::new(go_rx);
    e.inner.failpoints.on_backing_sync_failed(move |_| {
        at_tx.send(()).expect("the test waits");
        let _ = go_rx.lock().recv_timeout(BOUND);
    });
    let a = e.clone();
    let flush_a = std::thread::spawn(move || a.flush());
    at_rx
        .recv_timeout(BOUND)
        .expect("flush A's backing sync failed");
    backing.crash_lose_all();
    // Flush B's sync succeeds meanwhile.
    let b = e.clone();
    let flush_b = std::thread::spawn(move || b.flush());
    let (b_tx, b_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = b_tx.send(flush_b.join().expect("flush B"));
    });
    let b_ok = b_rx.recv_timeout(BOUND).expect("flush B returned").is_ok();
    go_tx.send(()).expect("flush A waits");
    assert!(
        flush_a.join().expect("flush A").is_err(),
        "flush A, whose backing sync failed"
    );
    let flushed = b_ok || (0..3).any(|_| e.flush().is_ok());
    assert!(
        flushed,
        "no flush returned OK with the backing device healthy"
    );
    let caught_up = e.stats().counters.backing_failures_caught_up;
    let (cache_cut, backing_cut) = (power_cut_copy(&cache), power_cut_copy(&backing));
    e.crash();
    let e = Engine::open(shared(&cache_cut), shared(&backing_cut), opts).expect("reopen");
    let mut buf = [0u8; 4096];
    e.read(0, &mut buf).unwrap();
    assert!(
        buf.iter().all(|&b| b == 0x44),
        "a write-through write lost after a flush returned OK (reads {:#x}): a sync that \
         succeeded before another thread handled its failed one vouched for it",
        buf[0]
    );
    // The path this test is about: B handled A's failure (or B failed and a later flush
    // rewrote the copy).
    assert!(
        !b_ok || caught_up == 1,
        "flush B returned OK without handling A's failure"
    );
    e.close().unwrap();
}

/// The same gap while serving from the backing device alone (`path::lost`'s own bookkeeping):
/// flush B's success noted first moved `synced_gen` over the write flush A's failed sync had
/// dropped, A then found it covered, and B returned OK over a write that was gone.
#[test]
fn served_alone_a_sync_that_succeeds_before_a_failed_one_is_noted_does_not_vouch_for_it() {
    let (cache, backing) = formatted((1 << 20) + (16 << 16), 16 << 20, 64 << 10);
    let cache_dev = Arc::new(FaultDevice::new(shared(&cache)));
    let faulty = Arc::new(FaultDevice::new(shared(&backing)));
    let opts = OpenOptions {
        ram_buffer_bytes: 4 << 16,
        seal_interval_ms: Some(0),
        ..OpenOptions::default()
    };
    let e = Engine::open(cache_dev.clone(), faulty.clone(), opts).expect("open");
    // The cache device fails with nothing dirty lost: the engine serves from the backing
    // device alone (the flush is answered from there).
    cache_dev.fail_next(OpKind::Write, u64::MAX, FaultKind::Io);
    e.write(0, &[0x11; 4096], false).unwrap();
    let _ = e.flush();
    assert!(
        e.stats().serving_alone,
        "the engine serves from the backing device alone"
    );
    e.flush().expect("a flush served alone");
    e.write(8 << 12, &[0x44; 4096], false).unwrap();
    faulty.fail_next(OpKind::Flush, 1, FaultKind::Io);
    let (at_tx, at_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let go_rx = parking_lot::Mutex::new(go_rx);
    e.inner.failpoints.on_backing_sync_failed(move |_| {
        at_tx.send(()).expect("the test waits");
        let _ = go_rx.lock().recv_timeout(BOUND);
    });
    let a = e.clone();
    let flush_a = std::thread::spawn(move || a.flush());
    at_rx
        .recv_timeout(BOUND)
        .expect("flush A's backing sync failed");
    backing.crash_lose_all();
    let b = e.clone();
    let flush_b = std::thread::spawn(move || b.flush());
    let (b_tx, b_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = b_tx.send(flush_b.join().expect("flush B"));
    });
    let b_res = b_rx.recv_timeout(BOUND).expect("flush B returned");
    go_tx.send(()).expect("flush A waits");
    assert!(
        flush_a.join().expect("flush A").is_err(),
        "flush A, whose backing sync failed"
    );
    let on_backing = backing.durable_image()[8 << 12];
    assert!(
        b_res.is_err() || on_backing == 0x44,
        "flush B returned OK while the write it covers is gone from the backing device \
         (holds {on_backing:#x}): a sync that succeeded before another's failure was noted \
         vouched for it"
    );
    // Nothing can write it again: every later flush fails until reopen.
    assert!(e.flush().is_err(), "a flush after the write was lost");
    e.crash();
}
