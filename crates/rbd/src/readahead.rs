//! Read-ahead of sequential reads: the decisions, without the IO (`session.rs` submits and
//! waits for the reads this asks for, so this module is tested on its own against a model).
//!
//! Why: every read that misses logcache's cache is one RBD round trip, waited for by the
//! request that wants it, so a sequential reader at iodepth 1 pays a full OSD round trip per
//! request plus the NBD hop that fio's in-process rbd engine does not pay. librbd reads ahead
//! only with its own cache on (`rbd_cache`), which logcache keeps off. So once
//! `TRIGGER_REQUESTS` reads in a row belong to one stream, the session reads up to the window
//! (`backing_read_ahead_kib`, at most `SLOTS * PREFETCH_BYTES`) ahead into `SLOTS` buffers, and
//! later reads inside a buffer are copied from it.
//!
//! A stream: reads that each start within `REORDER_BYTES` of the furthest end the stream
//! reached, and that together cover at least half of the range they span. Reads are counted as
//! they complete, and at iodepth > 1 they complete out of order, so "each starts where the
//! last ended" missed most streams; the coverage rule keeps a strided or random reader from
//! passing for one.
//!
//! Coherence (the image's exclusive lock means every write to it passes through this
//! session): a write, discard or write-zeroes marks every overlapping buffer stale before it is
//! submitted, and no read-ahead is submitted while any of them is in flight. So a buffer that
//! is not stale holds what the image held when its read was submitted, and nothing was written
//! to that range since: what a read submitted now would return. A stale buffer is never served.

/// Bytes read ahead per slot: one RBD object (the default `order` 22), one OSD op.
pub const PREFETCH_BYTES: usize = 4 << 20;
/// Buffers, so one is read ahead while the reader consumes the other.
pub const SLOTS: usize = 4;
/// Reads in a row of one stream before reading ahead.
pub const TRIGGER_REQUESTS: u32 = 3;
/// How far from the stream's furthest end a read may start and still belong to it: reads
/// completing out of order within a queue of this many bytes.
pub const REORDER_BYTES: u64 = PREFETCH_BYTES as u64;
/// The largest window: every buffer ahead.
pub const MAX_WINDOW_BYTES: u64 = (SLOTS * PREFETCH_BYTES) as u64;
/// Read-ahead pieces are never smaller (a smaller window is rounded up to it).
const MIN_PIECE_BYTES: u64 = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// No read-ahead in it (its buffer may still be allocated).
    Empty,
    /// A read-ahead into its buffer is in flight.
    Pending,
    /// The read-ahead finished: `[start, start + len)` of the image is in its buffer.
    Ready,
}

/// One read-ahead buffer's bookkeeping. `T` is the in-flight IO's handle (librbd's completion
/// in `session.rs`, a number in the tests).
#[derive(Debug)]
pub struct Slot<T> {
    pub start: u64,
    pub len: usize,
    pub state: State,
    /// A write overlapped it after its read was submitted: never served again.
    pub stale: bool,
    /// Readers copying from it or waiting for its read; it is not reused while any are.
    pub users: u32,
    /// Readers inside a wait for its read: its handle is not released while any are.
    pub waiters: u32,
    /// The read's handle, from submission until it is reaped (released), which happens once
    /// the read finished and no reader waits on it.
    pub io: Option<T>,
}

impl<T> Slot<T> {
    fn empty() -> Slot<T> {
        Slot {
            start: 0,
            len: 0,
            state: State::Empty,
            stale: false,
            users: 0,
            waiters: 0,
            io: None,
        }
    }

    /// Holds (or will hold) servable data.
    fn live(&self) -> bool {
        self.state != State::Empty && !self.stale
    }

    fn end(&self) -> u64 {
        self.start + self.len as u64
    }

    fn covers(&self, offset: u64, len: usize) -> bool {
        offset >= self.start && offset + len as u64 <= self.start + self.len as u64
    }

    fn overlaps(&self, offset: u64, len: u64) -> bool {
        self.state != State::Empty
            && offset < self.start + self.len as u64
            && self.start < offset + len
    }
}

/// What a read should do.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup<T> {
    /// Copy from slot `slot`'s buffer at `at`. The slot counts the caller as a user until
    /// [`Readahead::release`]. With `wait`, its read is in flight: wait for that handle, then
    /// call [`Readahead::waited`] (the handle stays valid until then).
    Hit {
        slot: usize,
        at: usize,
        wait: Option<T>,
    },
    /// Read from the image.
    Miss,
}

/// A read-ahead to submit now: `len` bytes at `start` into slot `slot`'s buffer. The slot is
/// `Pending` already; the caller calls [`Readahead::submitted`] or [`Readahead::failed`].
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub struct Plan {
    pub slot: usize,
    pub start: u64,
    pub len: usize,
}

#[derive(Debug)]
pub struct Readahead<T> {
    size_bytes: u64,
    /// How far ahead of the reader to read (0: not at all), at most `MAX_WINDOW_BYTES`.
    window_bytes: u64,
    /// The current stream: the lowest offset and the furthest end of its reads, the bytes
    /// they read, and how many reads in a row belonged to it (0: no stream yet).
    stream_start: u64,
    stream_end: u64,
    stream_bytes: u64,
    run: u32,
    pub slots: [Slot<T>; SLOTS],
}

impl<T> Readahead<T> {
    pub fn new(size_bytes: u64) -> Readahead<T> {
        Readahead {
            size_bytes,
            window_bytes: MAX_WINDOW_BYTES,
            stream_start: 0,
            stream_end: 0,
            stream_bytes: 0,
            run: 0,
            slots: std::array::from_fn(|_| Slot::empty()),
        }
    }

    /// Sets the window (the tunable `backing_read_ahead_kib`): 0 turns read-ahead off (buffers
    /// already read stay servable until reused); larger than `MAX_WINDOW_BYTES` is capped.
    pub fn set_window(&mut self, window_bytes: u64) {
        self.window_bytes = window_bytes.min(MAX_WINDOW_BYTES);
    }

    /// Bytes per read-ahead: half the window (so that one piece is read while the reader
    /// consumes the other), at most a buffer, at least `MIN_PIECE_BYTES`.
    fn piece_bytes(&self) -> u64 {
        (self.window_bytes / 2 / MIN_PIECE_BYTES * MIN_PIECE_BYTES)
            .clamp(MIN_PIECE_BYTES, PREFETCH_BYTES as u64)
    }

    /// Where a read of `len` bytes at `offset` comes from.
    pub fn lookup(&mut self, offset: u64, len: usize) -> Lookup<T>
    where
        T: Copy,
    {
        for (i, s) in self.slots.iter_mut().enumerate() {
            if s.state != State::Empty && !s.stale && s.covers(offset, len) {
                s.users += 1;
                let wait = if s.state == State::Pending {
                    let io =
                        s.io.expect("a pending slot's read is submitted under the lock");
                    s.waiters += 1;
                    Some(io)
                } else {
                    None
                };
                return Lookup::Hit {
                    slot: i,
                    at: (offset - s.start) as usize,
                    wait,
                };
            }
        }
        Lookup::Miss
    }

    /// A reader's wait for `slot`'s read returned: the read finished with `ok`. Returns the
    /// handle to release if no other reader still waits on it.
    pub fn waited(&mut self, slot: usize, ok: bool) -> Option<T> {
        let s = &mut self.slots[slot];
        assert!(s.waiters > 0 && s.users > 0);
        s.waiters -= 1;
        if s.state == State::Pending {
            s.state = if ok { State::Ready } else { State::Empty };
            if !ok {
                // Its range must not be served; the slot is reusable once released.
                s.stale = true;
            }
        }
        if s.waiters == 0 {
            s.io.take()
        } else {
            None
        }
    }

    /// A user of `slot` is done with it.
    pub fn release(&mut self, slot: usize) {
        let s = &mut self.slots[slot];
        assert!(s.users > 0, "read-ahead slot released more than taken");
        s.users -= 1;
    }

    /// Whether `slot` may be served now (not stale, its read finished).
    pub fn servable(&self, slot: usize) -> bool {
        let s = &self.slots[slot];
        !s.stale && s.state == State::Ready
    }

    /// Reaps every finished read no reader waits on: `poll(io)` says whether it finished
    /// (and how), `release(io)` frees the handle.
    pub fn reap(&mut self, mut poll: impl FnMut(&T) -> Option<bool>, mut release: impl FnMut(T)) {
        for s in &mut self.slots {
            if s.waiters > 0 {
                continue;
            }
            let Some(ok) = s.io.as_ref().and_then(&mut poll) else {
                continue;
            };
            release(s.io.take().expect("polled above"));
            if s.state == State::Pending {
                s.state = if ok { State::Ready } else { State::Empty };
            }
        }
    }

    /// Handles of reads still in flight or not reaped, for the session's close to wait for
    /// (no reader can be waiting then).
    pub fn take_all_io(&mut self) -> impl Iterator<Item = T> + '_ {
        self.slots.iter_mut().filter_map(|s| {
            assert_eq!(s.waiters, 0, "closing with a reader waiting");
            s.io.take()
        })
    }

    /// Counts a read of `len` bytes at `offset` (served either way) and returns the
    /// read-aheads to start. None while a write is in flight (`writing`), nor while other
    /// reads of the image in flight hold `queued_bytes` of at least `PREFETCH_BYTES`: a client
    /// whose queue of sequential reads already covers that much keeps the image busy itself,
    /// and a read-ahead would only read again what its requests in flight are reading (1 MiB
    /// reads at iodepth 32 lost 40% to it). A shallower queue (4 KiB reads at iodepth 32:
    /// 128 KiB) still gains from it.
    pub fn observe(
        &mut self,
        offset: u64,
        len: usize,
        queued_bytes: u64,
        writing: bool,
    ) -> [Option<Plan>; SLOTS] {
        let mut plans = [None; SLOTS];
        let end = offset + len as u64;
        let near = offset <= self.stream_end.saturating_add(REORDER_BYTES)
            && end.saturating_add(REORDER_BYTES) >= self.stream_end;
        if self.run > 0 && near {
            self.run = self.run.saturating_add(1);
            self.stream_start = self.stream_start.min(offset);
            self.stream_end = self.stream_end.max(end);
            self.stream_bytes = self.stream_bytes.saturating_add(len as u64);
        } else {
            self.run = 1;
            self.stream_start = offset;
            self.stream_end = end;
            self.stream_bytes = len as u64;
        }
        let dense = self.stream_bytes.saturating_mul(2) >= self.stream_end - self.stream_start;
        if self.run < TRIGGER_REQUESTS
            || !dense
            || self.window_bytes == 0
            || writing
            || queued_bytes >= PREFETCH_BYTES as u64
        {
            return plans;
        }
        // Keep the window ahead of the stream's furthest end read (the reader's position; a
        // read completing late is behind it): the next range starts where the chain of live
        // buffers from there ends (each found by where the last ends).
        let reader = self.stream_end;
        let piece = self.piece_bytes();
        let window_end = reader + self.window_bytes.max(piece);
        for plan in plans.iter_mut() {
            let horizon = self.horizon(reader);
            if horizon >= self.size_bytes || horizon >= window_end {
                break;
            }
            // A slot free for reuse: no read in flight, no users, and nothing in it the reader
            // will want (empty, stale, or outside `[reader, window_end)`: behind the reader,
            // or left far ahead by a stream that jumped back).
            let free = self.slots.iter().position(|s| {
                s.users == 0
                    && s.waiters == 0
                    && s.io.is_none()
                    && s.state != State::Pending
                    && (!s.live() || s.end() <= reader || s.start >= window_end)
            });
            let Some(i) = free else { break };
            // Up to the next live buffer, so that no range is read ahead twice.
            let next_start = self
                .slots
                .iter()
                .filter(|s| s.live() && s.start > horizon)
                .map(|s| s.start)
                .min()
                .unwrap_or(u64::MAX);
            let len = (self.size_bytes - horizon)
                .min(next_start - horizon)
                .min(piece) as usize;
            assert!(len > 0 && len <= PREFETCH_BYTES);
            let s = &mut self.slots[i];
            s.start = horizon;
            s.len = len;
            s.state = State::Pending;
            s.stale = false;
            *plan = Some(Plan {
                slot: i,
                start: horizon,
                len,
            });
        }
        plans
    }

    /// The read-ahead of `plan` is in flight with handle `io`.
    pub fn submitted(&mut self, slot: usize, io: T) {
        let s = &mut self.slots[slot];
        assert_eq!(s.state, State::Pending);
        assert!(s.io.is_none());
        s.io = Some(io);
    }

    /// The read-ahead planned for `slot` could not be submitted, or finished with an error.
    pub fn failed(&mut self, slot: usize) {
        let s = &mut self.slots[slot];
        s.state = State::Empty;
        s.io = None;
    }

    /// Where the chain of live buffers from `end` (the reader's position) ends: the next
    /// read-ahead starts there.
    fn horizon(&self, end: u64) -> u64 {
        let mut horizon = end;
        for _ in 0..SLOTS {
            let Some(next) = self
                .slots
                .iter()
                .filter(|s| s.live() && s.start <= horizon && s.end() > horizon)
                .map(Slot::end)
                .max()
            else {
                break;
            };
            horizon = next;
        }
        horizon
    }

    /// A write (or discard, or write-zeroes) of `[offset, offset + len)` is about to be
    /// submitted: every overlapping buffer goes stale. The caller counts the write as in
    /// flight before this (so that no read-ahead is planned until it finished: `observe`'s
    /// `writing`) and stops counting it once it finished, without this lock.
    pub fn write_begin(&mut self, offset: u64, len: u64) {
        for s in &mut self.slots {
            if s.overlaps(offset, len) {
                s.stale = true;
            }
        }
    }
}

#[cfg(test)]
mod tests;
