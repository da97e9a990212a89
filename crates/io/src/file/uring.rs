//! The io_uring read engine of a [`FileDevice`](super::FileDevice): one request's reads
//! submitted together in one system call and waited for together, so a request split into
//! several runs has them all at the device at once. Each thread has its own ring (made on
//! its first batch, no lock between threads), so every server thread serving a request has
//! its own batch in flight: several requests at the device at once.
//!
//! Where the kernel refuses io_uring (`probe`), the device keeps to positional reads.

use std::cell::RefCell;
use std::fs::File;
use std::io;
use std::os::unix::io::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};

use io_uring::{opcode, types, IoUring};

use crate::ReadOp;

/// Entries per thread's ring: the most reads of one submission (a batch longer than this is
/// submitted in pieces). One request's runs are at most 256 (a 1 MiB window of 4 KiB blocks).
const RING_ENTRIES: u32 = 64;

/// Batches read through a ring since the process started (for tests and status: whether the
/// engine is really in use).
static BATCHES: AtomicU64 = AtomicU64::new(0);

pub fn batches() -> u64 {
    BATCHES.load(Ordering::Relaxed)
}

thread_local! {
    static RING: RefCell<Option<IoUring>> = const { RefCell::new(None) };
}

/// Whether this kernel lets us set up a ring; the error says why not (seccomp, sysctl
/// `kernel.io_uring_disabled`, an old kernel).
pub fn probe() -> io::Result<()> {
    IoUring::new(2).map(drop)
}

/// Reads the ops `take` picks (checked and O_DIRECT-ready) through this thread's ring, leaving
/// the others untouched; `Err` only when no ring can be made here (nothing was read: the
/// caller falls back).
pub(super) fn read_batch(
    file: &File,
    ops: &mut [ReadOp<'_>],
    take: impl Fn(&ReadOp<'_>) -> bool,
) -> io::Result<()> {
    RING.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(IoUring::new(RING_ENTRIES)?);
        }
        BATCHES.fetch_add(1, Ordering::Relaxed);
        for piece in ops.chunks_mut(RING_ENTRIES as usize) {
            let ring = slot.as_mut().expect("made above");
            if let Err(Broken) = read_piece(ring, file, piece, &take) {
                // Its unsubmitted entries go with it; the next batch makes a new ring.
                *slot = None;
                for op in piece.iter_mut().filter(|op| take(op) && op.result.is_err()) {
                    op.result = positional(file, op.buf, op.offset);
                }
                if slot.is_none() {
                    *slot = Some(IoUring::new(RING_ENTRIES)?);
                }
            }
        }
        Ok(())
    })
}

/// The kernel refused a submission; nothing of it is in flight.
struct Broken;

/// Submits the ops of one piece (≤ `RING_ENTRIES`) that `take` picks and waits for all of
/// their completions. On `Broken`, the ops not read carry an error.
fn read_piece(
    ring: &mut IoUring,
    file: &File,
    ops: &mut [ReadOp<'_>],
    take: &impl Fn(&ReadOp<'_>) -> bool,
) -> Result<(), Broken> {
    assert!(ops.len() <= RING_ENTRIES as usize);
    debug_assert!(
        ring.completion().is_empty(),
        "a completion left from a past batch"
    );
    let fd = types::Fd(file.as_raw_fd());
    let mut waiting = 0usize;
    for (i, op) in ops.iter_mut().enumerate() {
        if !take(op) {
            continue;
        }
        assert!(op.buf.len() <= u32::MAX as usize);
        let entry = opcode::Read::new(fd, op.buf.as_mut_ptr(), op.buf.len() as u32)
            .offset(op.offset)
            .build()
            .user_data(i as u64);
        // SAFETY: each buffer is a distinct `&mut` borrow that outlives this function, and the
        // function returns only after every submitted entry's completion (below), so the
        // kernel never writes memory we no longer own.
        unsafe { ring.submission().push(&entry) }.expect("the ring has room for one piece");
        op.result = Err(io::Error::other("not read"));
        waiting += 1;
    }
    // Which ops have completed: one bit each (≤ 64, no allocation).
    let mut completed = 0u64;
    while waiting > 0 {
        if let Err(e) = ring.submit_and_wait(waiting) {
            if matches!(
                e.raw_os_error(),
                Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)
            ) {
                continue;
            }
            // A failed io_uring_enter took no entry; completions already reaped are kept.
            let unsubmitted = ring.submission().len();
            assert_eq!(
                unsubmitted, waiting,
                "io_uring_enter failed ({e}) with reads of ours in flight"
            );
            return Err(Broken);
        }
        for cqe in ring.completion() {
            let i = cqe.user_data() as usize;
            assert!(
                i < ops.len() && completed & (1 << i) == 0,
                "unexpected completion {i}"
            );
            completed |= 1 << i;
            waiting -= 1;
            let op = &mut ops[i];
            let res = cqe.result();
            op.result = if res < 0 {
                Err(io::Error::from_raw_os_error(-res))
            } else if res as usize == op.buf.len() {
                Ok(())
            } else {
                // A short read (a file that shrank, an interrupted read): the rest the
                // ordinary way, which says which.
                let got = res as usize;
                positional(file, &mut op.buf[got..], op.offset + got as u64)
            };
        }
    }
    Ok(())
}

fn positional(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    file.read_exact_at(buf, offset)
}
