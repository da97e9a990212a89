//! A burst of small READs served on a connection's reader: when several READs wait in the
//! input buffer together, the reader serves them itself. Their blocks are looked up under one
//! hold of the engine's state lock and their cache-device reads go to the kernel in one
//! submission (`Export::read_batch_if_cached`); their replies go out in one `sendmsg`, each
//! from the place its data was read into (no copy). No worker is woken for them: with every
//! READ handed to a worker, a profile of 4 KiB reads at iodepth 32 found 2.5 futex calls per
//! read (the job queue's condvar, the reply lock) and a third of the time in task switches.
//!
//! A READ the cache lacks (all or part of it), or one the engine declines (`Ok(false)`: a
//! failed cached read the backing device alone now serves), is handed back to the reader for
//! the workers: the reader never waits on the slow device. A read that fails gets its own
//! error reply among the others.
//!
//! Ordering is the reader's: a burst holds only READs decoded one after another, served
//! before the next request is decoded, so each sees every write decoded before it (see
//! `transmission`).

use std::io::{self, IoSlice};

use logcache_engine::{CachedRead, Result};
use logcache_nbd::request::{Command, Request};

use crate::answer::{self, recycle_reads, DATA_ALIGN_BYTES};
use crate::connection::Connection;
use crate::limits::{BURST_MAX_BYTES, BURST_READ_MAX_BYTES, MAX_BURST_READS, SECTOR_BYTES};
use crate::reply;
use crate::stats::Counters;

/// One READ of the burst: where its reply lies in `Burst::out` (the header at `start`, the
/// data at `data_start`, 4 KiB-aligned so the cache device reads straight into it).
#[derive(Clone, Copy, Debug)]
struct Place {
    start: usize,
    data_start: usize,
    length_bytes: usize,
}

/// The reader's reusable burst state: no allocation per burst once the buffers exist.
pub(crate) struct Burst {
    requests: Vec<Request>,
    places: Vec<Place>,
    /// Every reply of a burst, each READ's data aligned; allocated at the first burst, at its
    /// largest size (`OUT_BYTES`), and never resized (the places depend on its address).
    out: Vec<u8>,
    /// Error replies, and a header's scratch.
    errors: Vec<u8>,
    header: Vec<u8>,
    /// Where each error reply lies in `errors`, by READ (empty range: none).
    error_ranges: Vec<(usize, usize)>,
    reads: Vec<CachedRead<'static>>,
    served: Vec<Result<bool>>,
    /// The burst's READs the cache did not serve: for the workers.
    declined: Vec<Request>,
    data_bytes: usize,
}

/// The most `out` needs: every READ's data, plus per READ its header and the padding that
/// aligns its data.
const OUT_BYTES: usize = BURST_MAX_BYTES as usize + (MAX_BURST_READS + 1) * DATA_ALIGN_BYTES;

/// Whether a READ may join a burst: small, whole sectors (what the engine's cached read takes
/// as it is), on an export that caches (a slow export, a plain device, serves nothing from a
/// cache), not through TLS (the reader would encrypt every reply while the client's next
/// requests wait undecrypted).
pub(crate) fn burstable(connection: &Connection, request: &Request) -> bool {
    request.command == Command::Read
        && request.length_bytes <= BURST_READ_MAX_BYTES
        && request.offset_bytes.is_multiple_of(SECTOR_BYTES)
        && u64::from(request.length_bytes) % SECTOR_BYTES == 0
        && !connection.server.export.is_slow()
        && !connection.stream.is_tls()
}

impl Burst {
    pub(crate) fn new() -> Burst {
        Burst {
            requests: Vec::with_capacity(MAX_BURST_READS),
            places: Vec::with_capacity(MAX_BURST_READS),
            out: Vec::new(),
            errors: Vec::new(),
            header: Vec::new(),
            error_ranges: Vec::with_capacity(MAX_BURST_READS),
            reads: Vec::with_capacity(MAX_BURST_READS),
            served: Vec::with_capacity(MAX_BURST_READS),
            declined: Vec::with_capacity(MAX_BURST_READS),
            data_bytes: 0,
        }
    }

    /// Whether `request` (`burstable`, validated) fits in what is left of the burst.
    pub(crate) fn fits(&self, request: &Request) -> bool {
        self.requests.len() < MAX_BURST_READS
            && self.data_bytes + request.length_bytes as usize <= BURST_MAX_BYTES as usize
    }

    pub(crate) fn push(&mut self, request: Request) {
        assert!(self.fits(&request), "the burst is full");
        self.data_bytes += request.length_bytes as usize;
        self.requests.push(request);
    }

    pub(crate) fn len(&self) -> usize {
        self.requests.len()
    }

    /// Serves the burst's READs the cache holds and sends their replies in one `sendmsg`,
    /// after `pending` (the reader's batched replies, which the caller then clears); returns
    /// the READs left for the workers, in the order received. The burst is empty afterwards.
    /// A failed send already cut the connection (the reader notices at its next receive).
    pub(crate) fn serve(
        &mut self,
        connection: &Connection,
        pending: &[u8],
    ) -> io::Result<&[Request]> {
        assert!(!self.requests.is_empty() && self.requests.len() <= MAX_BURST_READS);
        self.declined.clear();
        self.lay_out(connection);
        let mut reads = recycle_reads(std::mem::take(&mut self.reads));
        let mut rest = &mut self.out[..];
        let mut consumed = 0;
        for (place, request) in self.places.iter().zip(&self.requests) {
            let (_, tail) = rest.split_at_mut(place.data_start - consumed);
            let (data, tail) = tail.split_at_mut(place.length_bytes);
            rest = tail;
            consumed = place.data_start + place.length_bytes;
            reads.push(CachedRead::new(request.offset_bytes, data));
        }
        connection.server.export.read_batch_if_cached(&mut reads);
        self.served.clear();
        self.served.extend(reads.drain(..).map(|read| read.served));
        self.reads = recycle_reads(reads);

        // Error replies first (into `errors`, which may grow), then the parts to send.
        let structured = connection.session.structured;
        self.errors.clear();
        self.error_ranges.clear();
        for (i, request) in self.requests.iter().enumerate() {
            let start = self.errors.len();
            if self.served[i].is_err() {
                // Taken out (its range below says it failed): the reply owns the error.
                let failed = std::mem::replace(&mut self.served[i], Ok(false));
                answer::push_result(
                    &mut self.errors,
                    structured,
                    request.cookie,
                    failed.map(drop),
                );
            }
            self.error_ranges.push((start, self.errors.len()));
        }
        let mut parts = [IoSlice::new(&[]); MAX_BURST_READS + 1];
        parts[0] = IoSlice::new(pending);
        let mut part_count = 1;
        let mut replied = 0u64;
        for (i, request) in self.requests.iter().enumerate() {
            let (error_start, error_end) = self.error_ranges[i];
            let place = self.places[i];
            let reply = if error_start < error_end {
                &self.errors[error_start..error_end]
            } else if self.served[i].as_ref().is_ok_and(|&served| served) {
                &self.out[place.start..place.data_start + place.length_bytes]
            } else {
                self.declined.push(*request);
                continue;
            };
            parts[part_count] = IoSlice::new(reply);
            part_count += 1;
            replied += 1;
        }
        debug_assert_eq!(replied as usize + self.declined.len(), self.requests.len());
        Counters::add(&connection.server.counters.reads_in_bursts, replied);
        self.requests.clear();
        self.data_bytes = 0;
        connection.sink.send_vectored(&mut parts[..part_count])?;
        Ok(&self.declined)
    }

    /// Places each READ's reply in `out`: its header, then its data on the next 4 KiB
    /// boundary (of memory, so O_DIRECT reads need no bounce buffer).
    fn lay_out(&mut self, connection: &Connection) {
        if self.out.len() < OUT_BYTES {
            self.out = vec![0u8; OUT_BYTES];
        }
        let base_address = self.out.as_ptr() as usize;
        let structured = connection.session.structured;
        self.places.clear();
        let mut cursor = 0;
        for request in &self.requests {
            self.header.clear();
            reply::push_read_header(
                &mut self.header,
                structured,
                request.cookie,
                request.offset_bytes,
                request.length_bytes,
            );
            let data_start = answer::aligned_data_start(base_address, cursor, self.header.len());
            let start = data_start - self.header.len();
            let length_bytes = request.length_bytes as usize;
            assert!(
                data_start + length_bytes <= self.out.len(),
                "burst overflows"
            );
            self.out[start..data_start].copy_from_slice(&self.header);
            self.places.push(Place {
                start,
                data_start,
                length_bytes,
            });
            cursor = data_start + length_bytes;
        }
    }
}
