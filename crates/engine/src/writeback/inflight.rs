//! Runs a list of independent IOs with several in flight (writeback's backing writes). A device given a queue serves it in its own best order (an SSD
//! in parallel, a disk by position); one IO at a time leaves it idle between them.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::sync::Mutex;

use crate::error::{Error, Result};

/// Calls `op` on every item, up to `depth` at once, taking items in order (so a disk sees them
/// roughly in that order). Stops taking new items after the first error and returns it. With
/// `depth <= 1`, or one item, everything runs on the calling thread in order.
pub(crate) fn run<T: Sync>(
    items: &[T],
    depth: usize,
    op: impl Fn(&T) -> Result<()> + Sync,
) -> Result<()> {
    if depth <= 1 || items.len() <= 1 {
        return items.iter().try_for_each(op);
    }
    let next = AtomicUsize::new(0);
    let failed: Mutex<Option<Error>> = Mutex::new(None);
    let worker = || loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= items.len() || failed.lock().is_some() {
            break;
        }
        if let Err(e) = op(&items[i]) {
            failed.lock().get_or_insert(e);
            break;
        }
    };
    std::thread::scope(|s| {
        for _ in 1..depth.min(items.len()) {
            // A helper that cannot start leaves its share to the others.
            let start = crate::sync::Start::begin();
            if std::thread::Builder::new()
                .name("logcache-io".into())
                .spawn_scoped(s, || {
                    if start.wait() {
                        worker()
                    }
                })
                .is_err()
            {
                break;
            }
        }
        worker();
    });
    match failed.into_inner() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn every_item_once_or_the_first_error() {
        for depth in [1, 2, 8] {
            let seen: Vec<AtomicU32> = (0..100).map(|_| AtomicU32::new(0)).collect();
            let items: Vec<usize> = (0..100).collect();
            run(&items, depth, |&i| {
                seen[i].fetch_add(1, Ordering::Relaxed);
                Ok(())
            })
            .unwrap();
            assert!(seen.iter().all(|s| s.load(Ordering::Relaxed) == 1));
            let err = run(&[1, 2, 3], depth, |&i| {
                if i == 2 {
                    Err(Error::InvalidArgument("two".into()))
                } else {
                    Ok(())
                }
            })
            .unwrap_err();
            assert!(matches!(err, Error::InvalidArgument(_)));
        }
    }
}
