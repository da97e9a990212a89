//! What the in-crate engine tests (`*_tests.rs`) set up alike: memory devices formatted as a
//! cache and its backing device, and a close that must return within a bound.

use std::sync::mpsc;
use std::sync::Arc;

use logcache_testkit::sim::SimDevice;

use crate::error::Result;
use crate::io::BlockDevice;
use crate::{format_cache, Engine, FormatOptions};

/// A cache device of `cache_bytes` formatted over a backing device of `backing_bytes`, with
/// segments of `segment_size_bytes`. Clones of a `SimDevice` share its contents, so a test
/// can open the pair again after a close.
pub(super) fn formatted(
    cache_bytes: u64,
    backing_bytes: u64,
    segment_size_bytes: u64,
) -> (SimDevice, SimDevice) {
    let cache = SimDevice::new(cache_bytes);
    let backing = SimDevice::new(backing_bytes);
    let fopts = FormatOptions {
        segment_size_bytes,
        ..FormatOptions::default()
    };
    format_cache(&cache, &backing, &fopts).expect("format");
    (cache, backing)
}

/// `device` as the engine takes it.
pub(super) fn shared(device: &SimDevice) -> Arc<dyn BlockDevice> {
    Arc::new(device.clone())
}

/// Closes `e` on a thread of its own: the test waits on the receiver with a bound, so a close
/// that hangs fails the test instead of hanging CI.
pub(super) fn close_on_a_thread(e: Engine) -> mpsc::Receiver<Result<()>> {
    let (done_tx, done_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = done_tx.send(e.close());
    });
    done_rx
}
