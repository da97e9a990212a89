//! The read-ahead decisions against a model image, seeded: reads (sequential streams and
//! jumps), writes that overlap buffers in flight and ready, read-aheads finishing in random
//! order and reading the image at submission or at completion. Every read served from a
//! buffer must equal the image at that moment.

use super::*;

/// xorshift64*: small, seeded, enough for schedules.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const IMAGE_BYTES: u64 = 6 * PREFETCH_BYTES as u64 + 3 * 4096;

/// A read-ahead's handle: its slot and a serial number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Io {
    slot: usize,
    id: u32,
}

struct World {
    image: Vec<u8>,
    ra: Readahead<Io>,
    /// The buffers, as `session.rs` has them.
    bufs: Vec<Vec<u8>>,
    /// Per slot: its read in flight has run (copied the image into the buffer).
    done: [bool; SLOTS],
    next_io: u32,
    served_from_buffers: u64,
    stale_refused: u64,
}

impl World {
    fn new() -> World {
        let mut image = vec![0u8; IMAGE_BYTES as usize];
        for (i, sector) in image.chunks_mut(512).enumerate() {
            sector.fill(i as u8);
        }
        World {
            image,
            ra: Readahead::new(IMAGE_BYTES),
            bufs: vec![vec![0u8; PREFETCH_BYTES]; SLOTS],
            done: [false; SLOTS],
            next_io: 0,
            served_from_buffers: 0,
            stale_refused: 0,
        }
    }

    /// Runs slot `i`'s read: copies the image's current content into its buffer.
    fn run_io(&mut self, i: usize) {
        let s = &self.ra.slots[i];
        let (start, len) = (s.start as usize, s.len);
        self.bufs[i][..len].copy_from_slice(&self.image[start..start + len]);
        self.done[i] = true;
    }

    fn submit(&mut self, plans: [Option<Plan>; SLOTS], rng: &mut Rng) {
        for p in plans.into_iter().flatten() {
            if rng.below(20) == 0 {
                self.ra.failed(p.slot);
                continue;
            }
            self.next_io += 1;
            self.done[p.slot] = false;
            self.ra.submitted(
                p.slot,
                Io {
                    slot: p.slot,
                    id: self.next_io,
                },
            );
            if rng.below(2) == 0 {
                self.run_io(p.slot); // the OSD read it at once; completion comes later
            }
        }
    }

    /// A whole read of `len` at `offset`, as `Session::read` does it, with nothing else in
    /// between (the interleavings come from writes and reads-ahead left in flight).
    fn read(&mut self, offset: u64, len: usize, rng: &mut Rng) {
        let want = self.image[offset as usize..offset as usize + len].to_vec();
        match self.ra.lookup(offset, len) {
            Lookup::Miss => {}
            Lookup::Hit { slot, at, wait } => {
                let mut ok = true;
                if wait.is_some() {
                    if !self.done[slot] {
                        self.run_io(slot);
                    }
                    ok = rng.below(30) != 0; // now and then the read-ahead failed
                    if let Some(io) = self.ra.waited(slot, ok) {
                        assert_eq!(Some(io), wait);
                    }
                }
                if ok && self.ra.servable(slot) {
                    assert_eq!(
                        &self.bufs[slot][at..at + len],
                        &want[..],
                        "read of {len} at {offset} served stale data from slot {slot}"
                    );
                    self.served_from_buffers += 1;
                } else {
                    self.stale_refused += 1;
                }
                self.ra.release(slot);
            }
        }
        let plans = self.ra.observe(offset, len, 0, false);
        self.submit(plans, rng);
        // Live buffers never overlap: each range is read ahead once.
        let live: Vec<_> = self.ra.slots.iter().filter(|s| s.live()).collect();
        for (i, a) in live.iter().enumerate() {
            for b in &live[i + 1..] {
                assert!(
                    a.end() <= b.start || b.end() <= a.start,
                    "two live read-ahead buffers overlap: {a:?} {b:?}"
                );
            }
        }
    }

    /// Finishes reads in flight nobody waits for, at random.
    fn reap(&mut self, rng: &mut Rng) {
        for i in 0..SLOTS {
            if self.ra.slots[i].io.is_some() && rng.below(3) == 0 && !self.done[i] {
                self.run_io(i);
            }
        }
        let done = self.done;
        self.ra.reap(|io| done[io.slot].then_some(true), |_| {});
    }
}

fn write(w: &mut World, offset: u64, len: usize, value: u8, rng: &mut Rng) {
    w.ra.write_begin(offset, len as u64);
    // While the write is in flight, reads-ahead neither start nor see it yet.
    if rng.below(2) == 0 {
        let plans = w.ra.observe(offset, 4096, 0, true);
        assert!(
            plans.iter().all(Option::is_none),
            "read-ahead during a write"
        );
    }
    w.image[offset as usize..offset as usize + len].fill(value);
}

#[test]
fn reads_served_from_read_ahead_always_equal_the_image_seeded() {
    let mut total_served = 0;
    for seed in 1..=60u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let mut w = World::new();
        let mut pos = 0u64;
        for step in 0..400 {
            match rng.below(10) {
                0..=5 => {
                    let len = [4096usize, 65536, 1 << 20][rng.below(3) as usize];
                    if pos + 2 * len as u64 > IMAGE_BYTES || rng.below(40) == 0 {
                        pos = rng.below(IMAGE_BYTES / 4096 - 512) * 4096;
                    }
                    let len = len.min((IMAGE_BYTES - pos) as usize / 2);
                    if rng.below(4) == 0 {
                        // Two reads completing out of order.
                        w.read(pos + len as u64, len, &mut rng);
                        w.read(pos, len, &mut rng);
                        pos += 2 * len as u64;
                    } else {
                        w.read(pos, len, &mut rng);
                        pos += len as u64;
                    }
                }
                8 if rng.below(8) == 0 => {
                    // The tunable changed: off, small, or up to every buffer.
                    let windows = [0, 4096, 1 << 20, 6 << 20, MAX_WINDOW_BYTES];
                    w.ra.set_window(windows[rng.below(5) as usize]);
                }
                6 | 7 => {
                    // A write near the reader (inside or just ahead of the buffers) or anywhere.
                    let at = if rng.below(2) == 0 {
                        (pos + rng.below(2 * PREFETCH_BYTES as u64)).min(IMAGE_BYTES - 4096)
                    } else {
                        rng.below(IMAGE_BYTES - 4096)
                    } / 512
                        * 512;
                    let len = (512 * (1 + rng.below(64)) as usize).min((IMAGE_BYTES - at) as usize);
                    write(&mut w, at, len, (step % 251) as u8 + 1, &mut rng);
                }
                _ => w.reap(&mut rng),
            }
        }
        total_served += w.served_from_buffers;
    }
    // The schedules must exercise the buffers, or the check above proved nothing.
    assert!(
        total_served > 2_000,
        "only {total_served} reads served from read-ahead"
    );
}

#[test]
fn read_ahead_starts_after_the_trigger_and_stays_ahead_of_the_reader() {
    let mut ra: Readahead<u32> = Readahead::new(64 << 20);
    let mb = 1u64 << 20;
    for i in 0..u64::from(TRIGGER_REQUESTS) - 1 {
        assert_eq!(ra.lookup(i * mb, 1 << 20), Lookup::Miss);
        assert!(ra
            .observe(i * mb, 1 << 20, 0, false)
            .iter()
            .all(Option::is_none));
    }
    let at = u64::from(TRIGGER_REQUESTS - 1) * mb;
    let plans = ra.observe(at, 1 << 20, 0, false);
    let p0 = plans[0].expect("read-ahead after the trigger");
    let p1 = plans[1].expect("both buffers fill");
    assert_eq!((p0.start, p0.len), (at + mb, PREFETCH_BYTES));
    assert_eq!(p1.start, at + mb + PREFETCH_BYTES as u64);
    ra.submitted(p0.slot, 1);
    ra.submitted(p1.slot, 2);
    // The next read waits for the first buffer's read, then is served from it.
    let Lookup::Hit {
        slot,
        at: 0,
        wait: Some(1),
    } = ra.lookup(at + mb, 1 << 20)
    else {
        panic!("expected a hit on the pending buffer");
    };
    assert_eq!(ra.waited(slot, true), Some(1));
    assert!(ra.servable(slot));
    ra.release(slot);
    // A jump elsewhere resets the run: no read-ahead, and the buffers are not served there.
    assert_eq!(ra.lookup(40 * mb, 4096), Lookup::Miss);
    assert!(ra
        .observe(40 * mb, 4096, 0, false)
        .iter()
        .all(Option::is_none));
}

#[test]
fn a_write_makes_overlapping_buffers_stale_and_holds_off_new_read_ahead() {
    let mut ra: Readahead<u32> = Readahead::new(64 << 20);
    let mut plans = [None; SLOTS];
    for i in 0..u64::from(TRIGGER_REQUESTS) {
        plans = ra.observe(i * 4096, 4096, 0, false);
    }
    let p = plans[0].expect("read-ahead");
    ra.submitted(p.slot, 7);
    ra.reap(|_| Some(true), |io| assert_eq!(io, 7));
    assert!(ra.servable(p.slot));
    ra.write_begin(p.start + 100 * 512, 512);
    assert!(!ra.servable(p.slot));
    assert_eq!(ra.lookup(p.start, 4096), Lookup::Miss);
    let next = p.start;
    assert!(ra.observe(next, 4096, 0, true).iter().all(Option::is_none));
    // After the write the stream goes on, and the stale buffer is reused.
    let again = ra.observe(next + 4096, 4096, 0, false);
    assert!(again.iter().flatten().any(|q| q.slot == p.slot));
}

#[test]
fn a_stream_that_starts_again_behind_its_buffers_reads_ahead_anew() {
    let mut ra: Readahead<u32> = Readahead::new(256 << 20);
    let mb = 1u64 << 20;
    let mut io = 0;
    let mut stream = |ra: &mut Readahead<u32>, from: u64, reads: u64| {
        let mut planned = 0;
        for i in 0..reads {
            let at = from + i * mb;
            if let Lookup::Hit { slot, wait, .. } = ra.lookup(at, 1 << 20) {
                if wait.is_some() {
                    ra.waited(slot, true);
                }
                ra.release(slot);
            }
            for p in ra.observe(at, 1 << 20, 0, false).into_iter().flatten() {
                io += 1;
                ra.submitted(p.slot, io);
                planned += 1;
            }
            ra.reap(|_| Some(true), |_| {});
        }
        planned
    };
    assert!(stream(&mut ra, 0, 40) >= 9, "a 40 MiB stream reads ahead");
    // The same stream from the start again: its buffers are 40 MiB ahead, of no use.
    assert!(
        stream(&mut ra, 0, 8) >= SLOTS,
        "read-ahead resumes for the new stream"
    );
}

#[test]
fn a_queue_of_reads_covering_a_read_ahead_gets_none() {
    let mut ra: Readahead<u32> = Readahead::new(64 << 20);
    let mb = 1u64 << 20;
    // 1 MiB reads at iodepth 32: 31 MiB in flight besides each.
    for i in 0..16 {
        let plans = ra.observe(i * mb, 1 << 20, 31 * mb, false);
        assert!(
            plans.iter().all(Option::is_none),
            "read {i} of a deep queue read ahead"
        );
    }
    // The same stream with a shallow queue (4 KiB reads at iodepth 32: 124 KiB besides) reads
    // ahead at once: the run was counted all along.
    assert!(ra.observe(16 * mb, 1 << 20, 124 << 10, false)[0].is_some());
}

#[test]
fn reads_completing_out_of_order_still_trigger_read_ahead() {
    // 4 KiB reads at iodepth 8 completing last-first: no read starts where the one counted
    // before it ended, yet they are one stream.
    let mut ra: Readahead<u32> = Readahead::new(64 << 20);
    let mut first_plan = None;
    for i in (0..8u64).rev() {
        let plans = ra.observe(i * 4096, 4096, 7 * 4096, false);
        if first_plan.is_none() {
            first_plan = plans[0];
        }
    }
    let p = first_plan.expect("a reordered sequential stream reads ahead");
    // Ahead of the furthest end the stream reached, not of the late read that triggered it.
    assert_eq!(p.start, 8 * 4096);
    assert_eq!(p.len, PREFETCH_BYTES);
}

#[test]
fn a_strided_or_random_reader_is_not_a_stream() {
    // 4 KiB every 64 KiB: each read near the last, but covering 1/16 of the range.
    let mut ra: Readahead<u32> = Readahead::new(1 << 30);
    for i in 0..64u64 {
        let plans = ra.observe(i * 65536, 4096, 0, false);
        assert!(
            plans.iter().all(Option::is_none),
            "strided read {i} read ahead"
        );
    }
    let mut rng = Rng(0x5eed);
    for i in 0..10_000 {
        let at = rng.below((1 << 30) / 4096) * 4096;
        let plans = ra.observe(at, 4096, 0, false);
        assert!(
            plans.iter().all(Option::is_none),
            "random read {i} read ahead"
        );
    }
}

#[test]
fn the_window_bounds_read_ahead_and_zero_turns_it_off() {
    let mb = 1u64 << 20;
    let mut ra: Readahead<u32> = Readahead::new(256 << 20);
    ra.set_window(0);
    for i in 0..32u64 {
        assert!(
            ra.observe(i * mb, 1 << 20, 0, false)
                .iter()
                .all(Option::is_none),
            "read-ahead with the window at 0 (read {i})"
        );
    }
    // A 1 MiB window: 512 KiB pieces, never past the reader's position plus 1 MiB.
    ra.set_window(mb);
    let mut io = 0;
    for i in 32..64u64 {
        let reader = (i + 1) * mb;
        for p in ra.observe(i * mb, 1 << 20, 0, false).into_iter().flatten() {
            assert_eq!(p.len as u64, mb / 2);
            assert!(
                p.start >= reader && p.start + p.len as u64 <= reader + mb,
                "{p:?}"
            );
            io += 1;
            ra.submitted(p.slot, io);
        }
        ra.reap(|_| Some(true), |_| {});
    }
    assert!(io >= 32, "a 1 MiB window reads ahead ({io} reads)");
    // Larger than the buffers hold: capped.
    ra.set_window(u64::MAX);
    let plans = ra.observe(64 * mb, 1 << 20, 0, false);
    assert!(plans.iter().flatten().all(|p| p.len == PREFETCH_BYTES));
}
