//! A small per-connection pool of threads for commands that may take long (FLUSH, FUA writes,
//! WRITE_ZEROES, TRIM; on a slow export, READ and WRITE too), so the reader keeps serving fast
//! requests meanwhile and replies go out in whatever order commands finish.
//!
//! Threads start on demand, up to `MAX_WORKERS_PER_CONNECTION` (`MAX_WORKERS_PER_SLOW_CONNECTION`
//! on a slow export, where every worker is one request in flight at the device), and stop when
//! the connection ends. A pool per connection keeps one client's slow commands from delaying
//! another's.

use std::collections::VecDeque;
use std::sync::Arc;
use std::thread::JoinHandle;

use logcache_nbd::request::{Command, Request};
use parking_lot::{Condvar, Mutex};

use crate::connection::Connection;
use crate::limits::{
    BUFFER_KEEP_BYTES, MAX_WORKERS_PER_CONNECTION, MAX_WORKERS_PER_SLOW_CONNECTION,
};
use crate::{answer, ops};

/// A validated request for a worker; WRITE carries its payload in a recycled buffer.
pub(crate) struct Job {
    pub request: Request,
    pub payload: Option<Vec<u8>>,
}

struct Queue {
    jobs: VecDeque<Job>,
    /// Workers waiting for a job.
    idle_workers: usize,
    closed: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
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
                    closed: false,
                }),
                wake: Condvar::new(),
            }),
            threads: Vec::new(),
        }
    }

    /// Queues a job; starts another worker if every existing one is busy and the pool has room.
    pub(crate) fn submit(&mut self, job: Job) {
        let mut queue = self.shared.queue.lock();
        debug_assert!(!queue.closed, "job submitted after finish");
        queue.jobs.push_back(job);
        let needs_worker = queue.jobs.len() > queue.idle_workers;
        drop(queue);
        if needs_worker && self.threads.len() < self.max_threads && self.spawn() {
            return;
        }
        self.shared.wake.notify_one();
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
            run(&self.connection, job, &mut buffers);
        }
    }
}

fn work(shared: &Shared, connection: &Connection) {
    let _guard = PanicGuard(connection);
    let mut buffers = Buffers::default();
    let mut queue = shared.queue.lock();
    loop {
        if let Some(job) = queue.jobs.pop_front() {
            drop(queue);
            run(connection, job, &mut buffers);
            queue = shared.queue.lock();
        } else if queue.closed {
            return;
        } else {
            queue.idle_workers += 1;
            shared.wake.wait(&mut queue);
            queue.idle_workers -= 1;
        }
    }
}

/// A worker's reusable buffers: its reply, and the covering range of an unaligned read.
#[derive(Default)]
struct Buffers {
    out: Vec<u8>,
    scratch: Vec<u8>,
}

/// Executes one job and sends its reply.
fn run(connection: &Connection, job: Job, buffers: &mut Buffers) {
    let request = job.request;
    let out = &mut buffers.out;
    out.clear();
    if request.command == Command::Read {
        answer::read(connection, out, &mut buffers.scratch, &request);
    } else {
        let result = execute(connection, &request, job.payload.as_deref());
        answer::push_result(out, connection.session.structured, request.cookie, result);
    }
    // A failed send already cut the connection; the reader notices and ends it.
    let _ = connection.sink.send(out);
    if out.capacity() > BUFFER_KEEP_BYTES {
        *out = Vec::new();
    }
    if let Some(payload) = job.payload {
        connection.recycle_payload(payload);
    }
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
