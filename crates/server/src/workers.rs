//! A per-connection pool of threads for every command that does device IO or may wait: READ
//! (unless the reader served it from the cache), BLOCK_STATUS (the backing device's hole map
//! may be a round trip), FLUSH, FUA writes, WRITE_ZEROES, TRIM, writes that bypass the log
//! (write-through, write-around), and on a slow export every WRITE too. The reader only
//! decodes and hands them on, so many requests of one connection are in flight at the devices at once, and
//! replies go out in whatever order commands finish (each worker sends its own).
//!
//! Threads start on demand, up to `MAX_WORKERS_PER_CONNECTION` (`MAX_WORKERS_PER_SLOW_CONNECTION`
//! on a slow export), and stop when the connection ends. A pool per connection keeps one
//! client's slow commands from delaying another's. The work a connection has queued or running
//! is bounded (`MAX_IN_FLIGHT_JOBS_PER_CONNECTION`, `MAX_IN_FLIGHT_BYTES_PER_CONNECTION`): past
//! it the reader waits for room before it decodes more, so a client cannot make the server hold
//! unbounded payloads or reply buffers.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use logcache_engine::{CachedRead, Result, WriteReservation};
use logcache_nbd::request::{Command, Request};
use parking_lot::{Condvar, Mutex};

use crate::answer::{recycle_reads, LargeReplyBuffer, ReadLayout};
use crate::connection::Connection;
use crate::limits::{
    BATCHED_READ_MAX_BYTES, BUFFER_KEEP_BYTES, LARGE_READ_MIN_BYTES, MAX_BATCHED_READS,
    MAX_IN_FLIGHT_BYTES_PER_CONNECTION, MAX_IN_FLIGHT_JOBS_PER_CONNECTION,
    MAX_WORKERS_PER_CONNECTION, MAX_WORKERS_PER_SLOW_CONNECTION, SECTOR_BYTES,
};
use crate::{answer, ops};

/// A validated request for a worker; WRITE carries its payload in a recycled buffer, or
/// already received into log blocks reserved for it (`reservation`: the worker commits it).
pub(crate) struct Job {
    pub request: Request,
    pub payload: Option<Vec<u8>>,
    /// A READ a batch already tried from the cache alone and handed back: not batched again.
    declined: bool,
    /// A WRITE already received into log blocks reserved for it: the worker commits them.
    pub reservation: Option<WriteReservation>,
}

impl Job {
    pub(crate) fn new(request: Request, payload: Option<Vec<u8>>) -> Job {
        Job {
            request,
            payload,
            declined: false,
            reservation: None,
        }
    }

    /// A WRITE whose payload is in `reservation` (received there by the reader).
    pub(crate) fn with_reservation(mut self, reservation: WriteReservation) -> Job {
        self.reservation = Some(reservation);
        self
    }

    /// The memory the job holds while queued or running: its payload, or its read's reply.
    fn cost_bytes(&self) -> usize {
        match self.request.command {
            Command::Read | Command::Write => self.request.length_bytes as usize,
            _ => 0,
        }
    }
}

struct Queue {
    jobs: VecDeque<Job>,
    /// Workers waiting for a job.
    idle_workers: usize,
    /// Jobs submitted and not yet finished (reply sent), and the bytes they hold.
    in_flight_jobs: usize,
    in_flight_bytes: usize,
    /// The reader is waiting for room (`wait_for_room`).
    reader_waiting: bool,
    closed: bool,
}

impl Queue {
    /// Whether a job of `cost_bytes` fits: always when nothing is in flight, so one request
    /// larger than the budget still runs (alone).
    fn has_room(&self, cost_bytes: usize) -> bool {
        self.in_flight_jobs == 0
            || (self.in_flight_jobs < MAX_IN_FLIGHT_JOBS_PER_CONNECTION
                && self.in_flight_bytes + cost_bytes <= MAX_IN_FLIGHT_BYTES_PER_CONNECTION)
    }
}

struct Shared {
    queue: Mutex<Queue>,
    /// `Queue::in_flight_jobs`, stored under the queue's lock whenever it changes, so the reader
    /// can ask whether the pool is idle without taking the lock the workers contend for.
    in_flight_jobs: AtomicUsize,
    wake: Condvar,
    /// Wakes the reader when a job finishes while it waits for room.
    room: Condvar,
}

pub(crate) struct WorkerPool {
    connection: Arc<Connection>,
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    max_threads: usize,
}

impl WorkerPool {
    pub(crate) fn new(connection: Arc<Connection>) -> WorkerPool {
        let max_threads = if connection.server.export.is_slow() {
            MAX_WORKERS_PER_SLOW_CONNECTION
        } else {
            MAX_WORKERS_PER_CONNECTION
        };
        WorkerPool {
            max_threads,
            connection,
            shared: Arc::new(Shared {
                queue: Mutex::new(Queue {
                    jobs: VecDeque::new(),
                    idle_workers: 0,
                    in_flight_jobs: 0,
                    in_flight_bytes: 0,
                    reader_waiting: false,
                    closed: false,
                }),
                in_flight_jobs: AtomicUsize::new(0),
                wake: Condvar::new(),
                room: Condvar::new(),
            }),
            threads: Vec::new(),
        }
    }

    /// Whether a request of `cost_bytes` (its payload or reply data) can be queued now.
    pub(crate) fn has_room(&self, cost_bytes: usize) -> bool {
        self.shared.queue.lock().has_room(cost_bytes)
    }

    /// Whether no job is queued or running (every reply of a job sent). Only the reader (the
    /// caller) submits jobs, so the count cannot rise meanwhile: a stale value is one a worker
    /// is just lowering, never a false "idle".
    pub(crate) fn is_idle(&self) -> bool {
        self.shared.in_flight_jobs.load(Ordering::Acquire) == 0
    }

    /// Waits until a request of `cost_bytes` can be queued. Workers always make progress (each
    /// finishes its job and sends its reply on its own), so this wait ends; if the client stops
    /// reading replies, the sends fail once the connection is cut, and the jobs still finish.
    pub(crate) fn wait_for_room(&self, cost_bytes: usize) {
        let mut queue = self.shared.queue.lock();
        while !queue.has_room(cost_bytes) {
            queue.reader_waiting = true;
            self.shared.room.wait(&mut queue);
        }
        queue.reader_waiting = false;
    }

    /// Queues a job; starts another worker if every existing one is busy and the pool has room.
    pub(crate) fn submit(&mut self, job: Job) {
        let mut queue = self.shared.queue.lock();
        debug_assert!(!queue.closed, "job submitted after finish");
        queue.in_flight_jobs += 1;
        self.shared
            .in_flight_jobs
            .store(queue.in_flight_jobs, Ordering::Release);
        queue.in_flight_bytes += job.cost_bytes();
        queue.jobs.push_back(job);
        // A worker may take several READs at once and hand back those the cache lacks: enough
        // threads for every job in flight (up to the cap) lets those run side by side then.
        let needs_worker =
            queue.jobs.len() > queue.idle_workers || queue.in_flight_jobs > self.threads.len();
        let wakes_idle = queue.idle_workers > 0;
        drop(queue);
        if needs_worker && self.threads.len() < self.max_threads && self.spawn() {
            return;
        }
        if wakes_idle || self.threads.is_empty() {
            self.shared.wake.notify_one();
        }
    }

    fn spawn(&mut self) -> bool {
        let name = format!("nbd-conn-{}-w{}", self.connection.id, self.threads.len());
        let shared = self.shared.clone();
        let connection = self.connection.clone();
        match std::thread::Builder::new()
            .name(name)
            .spawn(move || work(&shared, &connection))
        {
            Ok(thread) => {
                self.threads.push(thread);
                true
            }
            // The existing workers (or, with none, `finish`) will still run the job.
            Err(_) => false,
        }
    }

    /// Runs every queued job to completion (replies sent), then stops the workers.
    pub(crate) fn finish(&mut self) {
        self.shared.queue.lock().closed = true;
        self.shared.wake.notify_all();
        for thread in self.threads.drain(..) {
            // A panicking worker already cut the connection (see `PanicGuard`).
            let _ = thread.join();
        }
        // Jobs left if no worker could ever be started, or all of them panicked.
        let leftovers: Vec<Job> = self.shared.queue.lock().jobs.drain(..).collect();
        let mut buffers = Buffers::default();
        for job in leftovers {
            let cost_bytes = job.cost_bytes();
            run(&self.connection, job, &mut buffers);
            let mut queue = self.shared.queue.lock();
            finished(&self.shared, &mut queue, cost_bytes);
        }
    }
}

/// Accounts for a finished job (its reply sent) and wakes the reader if it waits for room.
fn finished(shared: &Shared, queue: &mut Queue, cost_bytes: usize) {
    assert!(queue.in_flight_jobs > 0, "a job finished twice");
    queue.in_flight_jobs -= 1;
    shared
        .in_flight_jobs
        .store(queue.in_flight_jobs, Ordering::Release);
    assert!(
        queue.in_flight_bytes >= cost_bytes,
        "in-flight bytes underflow"
    );
    queue.in_flight_bytes -= cost_bytes;
    if queue.reader_waiting {
        shared.room.notify_one();
    }
}

fn work(shared: &Shared, connection: &Connection) {
    let _guard = PanicGuard(connection);
    let mut buffers = Buffers::default();
    let mut batch: Vec<Job> = Vec::with_capacity(MAX_BATCHED_READS);
    // A slow export (a plain device) serves nothing from a cache: its READs are never batched.
    let batches = !connection.server.export.is_slow();
    let mut queue = shared.queue.lock();
    loop {
        if let Some(job) = queue.jobs.pop_front() {
            if batches && batchable(&job) {
                batch.push(job);
                while batch.len() < MAX_BATCHED_READS && queue.jobs.front().is_some_and(batchable) {
                    batch.push(queue.jobs.pop_front().expect("checked above"));
                }
                drop(queue);
                run_reads(connection, &mut batch, &mut buffers);
                queue = shared.queue.lock();
                for cost_bytes in buffers.finished_costs.drain(..) {
                    finished(shared, &mut queue, cost_bytes);
                }
                // The READs the cache could not serve alone go back to the front of the queue,
                // in order, for any worker (misses wait on the backing device: in flight
                // together, not one after another here).
                let handed_back = batch.len();
                while let Some(mut job) = batch.pop() {
                    job.declined = true;
                    queue.jobs.push_front(job);
                }
                for _ in 1..handed_back.min(queue.idle_workers + 1) {
                    shared.wake.notify_one();
                }
                continue;
            }
            drop(queue);
            let cost_bytes = job.cost_bytes();
            run(connection, job, &mut buffers);
            queue = shared.queue.lock();
            finished(shared, &mut queue, cost_bytes);
        } else if queue.closed {
            return;
        } else {
            queue.idle_workers += 1;
            shared.wake.wait(&mut queue);
            queue.idle_workers -= 1;
        }
    }
}

/// A worker's reusable buffers: its read replies, other replies (and read reply headers), and
/// the covering range of an unaligned read; and for a batch of READs, each one's reply and
/// header, layout, read and outcome.
#[derive(Default)]
struct Buffers {
    out: Vec<u8>,
    /// The reply buffer of large READs (huge pages, see `LargeReplyBuffer`).
    large_out: LargeReplyBuffer,
    header: Vec<u8>,
    scratch: Vec<u8>,
    batch_outs: Vec<Vec<u8>>,
    batch_headers: Vec<Vec<u8>>,
    layouts: Vec<ReadLayout>,
    reads: Vec<CachedRead<'static>>,
    served: Vec<Result<bool>>,
    /// The cost of each job of the batch whose reply was sent.
    finished_costs: Vec<usize>,
}

/// A READ a worker may serve in a batch: small and whole sectors (what the export's cached
/// read takes as it is), and not handed back by a batch before.
fn batchable(job: &Job) -> bool {
    let request = &job.request;
    !job.declined
        && request.command == Command::Read
        && request.length_bytes <= BATCHED_READ_MAX_BYTES
        && request.offset_bytes.is_multiple_of(SECTOR_BYTES)
        && u64::from(request.length_bytes) % SECTOR_BYTES == 0
}

/// Serves a batch of READs (`batchable`, one or more) and sends each reply: the ones the cache
/// holds with their device reads submitted together (`Export::read_batch_if_cached`). A batch
/// of one the cache lacks is read the ordinary way here; in a larger batch those are left in
/// `batch` (in order) for the caller to hand back. Each sent reply's cost goes to
/// `buffers.finished_costs`.
fn run_reads(connection: &Connection, batch: &mut Vec<Job>, buffers: &mut Buffers) {
    debug_assert!(!batch.is_empty() && batch.len() <= MAX_BATCHED_READS);
    let Buffers {
        batch_outs: outs,
        batch_headers: headers,
        layouts,
        reads,
        served,
        ..
    } = buffers;
    if outs.len() < batch.len() {
        outs.resize_with(batch.len(), Vec::new);
        headers.resize_with(batch.len(), Vec::new);
    }
    layouts.clear();
    for (i, job) in batch.iter().enumerate() {
        debug_assert!(batchable(job) && job.payload.is_none());
        layouts.push(ReadLayout::new(
            connection,
            &mut outs[i],
            &mut headers[i],
            &job.request,
        ));
    }
    let mut batch_reads = recycle_reads(std::mem::take(reads));
    for ((out, layout), job) in outs.iter_mut().zip(layouts.iter()).zip(batch.iter()) {
        batch_reads.push(CachedRead::new(job.request.offset_bytes, layout.data(out)));
    }
    connection
        .server
        .export
        .read_batch_if_cached(&mut batch_reads);
    served.clear();
    served.extend(batch_reads.drain(..).map(|r| r.served));
    *reads = recycle_reads(batch_reads);
    let alone = batch.len() == 1;
    let mut kept = 0;
    for i in 0..batch.len() {
        let request = batch[i].request;
        let outcome = std::mem::replace(&mut served[i], Ok(false));
        // A failed send already cut the connection; the reader notices and ends it.
        let _ = match outcome {
            // The cache lacks some of it: handed back, or (alone) the ordinary read here,
            // which may wait on the backing device.
            Ok(false) if !alone => {
                batch.swap(kept, i);
                kept += 1;
                continue;
            }
            Ok(false) => connection.sink.send(answer::read_aligned(
                connection,
                &mut outs[i],
                &mut headers[i],
                &mut buffers.scratch,
                &request,
            )),
            outcome => connection.sink.send(layouts[i].finish(
                connection,
                &mut outs[i],
                &mut headers[i],
                &request,
                outcome.map(drop),
            )),
        };
        buffers.finished_costs.push(batch[i].cost_bytes());
    }
    batch.truncate(kept);
}

/// Executes one job and sends its reply.
fn run(connection: &Connection, job: Job, buffers: &mut Buffers) {
    let request = job.request;
    let out = &mut buffers.out;
    // A failed send already cut the connection; the reader notices and ends it.
    if request.command == Command::BlockStatus {
        let reply = &mut buffers.header;
        reply.clear();
        answer::block_status(connection, reply, &request);
        let _ = connection.sink.send(reply);
    } else if request.command == Command::Read && request.length_bytes >= LARGE_READ_MIN_BYTES {
        let reply = answer::read_aligned(
            connection,
            &mut buffers.large_out,
            &mut buffers.header,
            &mut buffers.scratch,
            &request,
        );
        let _ = connection.sink.send(reply);
        if buffers.large_out.len_bytes() > BUFFER_KEEP_BYTES {
            buffers.large_out.release();
        }
    } else if request.command == Command::Read {
        let reply = answer::read_aligned(
            connection,
            out,
            &mut buffers.header,
            &mut buffers.scratch,
            &request,
        );
        let _ = connection.sink.send(reply);
    } else {
        // Built apart from `out`, which keeps its length for the next read (no zero-filling).
        let reply = &mut buffers.header;
        reply.clear();
        let result = match job.reservation {
            Some(reservation) => commit(connection, &request, reservation),
            None => execute(connection, &request, job.payload.as_deref()),
        };
        answer::push_result(reply, connection.session.structured, request.cookie, result);
        let _ = connection.sink.send(reply);
    }
    if out.capacity() > BUFFER_KEEP_BYTES {
        *out = Vec::new();
    }
    if let Some(payload) = job.payload {
        connection.recycle_payload(payload);
    }
}

/// Publishes a WRITE received into reserved log blocks; if the engine gave the reservation
/// up meanwhile (a flush, the same blocks written by someone else), writes the data it handed
/// back the ordinary way.
fn commit(
    connection: &Connection,
    request: &Request,
    reservation: WriteReservation,
) -> logcache_engine::Result<()> {
    let mut redo = connection.take_payload_buffer();
    let result = if reservation.commit(&mut redo) {
        Ok(())
    } else {
        let server = &connection.server;
        ops::write(
            &*server.export,
            &server.unaligned_write_lock,
            request.offset_bytes,
            &redo,
            false,
        )
    };
    connection.recycle_payload(redo);
    result
}

/// Runs a command other than READ on the export.
fn execute(
    connection: &Connection,
    request: &Request,
    payload: Option<&[u8]>,
) -> logcache_engine::Result<()> {
    let server = &connection.server;
    let export = &*server.export;
    let offset_bytes = request.offset_bytes;
    let length_bytes = u64::from(request.length_bytes);
    let fua = request.has_flag(logcache_nbd::consts::CMD_FLAG_FUA);
    match (request.command, payload) {
        (Command::Flush, _) => ops::flush(export),
        (Command::Write, Some(payload)) => ops::write(
            export,
            &server.unaligned_write_lock,
            offset_bytes,
            &payload[..request.length_bytes as usize],
            fua,
        ),
        (Command::WriteZeroes, _) => ops::write_zeroes(
            export,
            &server.unaligned_write_lock,
            offset_bytes,
            length_bytes,
            fua,
        ),
        (Command::Trim, _) => ops::trim(
            export,
            &server.unaligned_write_lock,
            offset_bytes,
            length_bytes,
            fua,
        ),
        (command, _) => {
            debug_assert!(false, "{command:?} is never queued for a worker");
            Err(logcache_engine::Error::InvalidArgument(format!(
                "{command:?} cannot run on a worker"
            )))
        }
    }
}

/// Cuts the connection if a worker panics, so the reader stops instead of waiting for a reply
/// that will never come; other connections are unaffected.
struct PanicGuard<'a>(&'a Connection);

impl Drop for PanicGuard<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.sink.break_connection();
        }
    }
}
