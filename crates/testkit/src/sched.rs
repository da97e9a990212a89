//! [`Scheduler`] and [`SchedDevice`]: a seeded scheduler for IOs issued by real threads.
//!
//! Every operation on a [`SchedDevice`] stops at the scheduler's gate and waits there until the
//! test releases it (or fails it with EIO). The test drives the run one step at a time: it waits
//! until the process is quiescent ([`Scheduler::settle`]: every thread asleep, in the gate or
//! elsewhere, and no arrival at the gate for a moment), looks at the held operations
//! ([`Scheduler::held`], in an order that does not depend on which thread got there first), and
//! lets exactly one of them through, chosen by its seed. So one IO can stay held while many
//! others pass (a slow zeroing, a slow cache sync), and a seed names a schedule.
//!
//! The engine's own blocking points come here too (`logcache_engine::sync`, feature `sim`: a
//! lock found taken, a condition-variable wait, a new thread's start), so while the gate is
//! `Scheduled` one thread runs at a time: the one let go last, until it stops again. The test
//! lets those go one by one ([`Scheduler::ready_sync`], [`Scheduler::release_sync`]), and
//! fires timed waits ([`Scheduler::timers`]): the engine's clock is the scheduler's virtual
//! one ([`Scheduler::now`]), moved only by firing a timer. Every list is in an order that does
//! not depend on timing (thread name, then ticket: tickets are handed out by the one running
//! thread). So the choice at each step is a function of the seed alone, and a seed replays
//! its schedule exactly. Not scheduled (opening the engine, the checks after a crash), locks
//! and waits behave as usual and timed waits fire in real time without moving the clock.
//!
//! Quiescence is read from `/proc/self/task/*/stat`: every thread of the process but the caller
//! and the main thread must be asleep. So a binary using it runs one test at a time (put the
//! test alone in its file).
//!
//! Every wait is bounded: a gate held longer than [`HOLD_MAX`] passes on its own (counted), and
//! `settle` gives up after its timeout, so a lost release fails a test instead of hanging it.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use std::thread::Thread;

use crate::fault::OpKind;
use logcache_io::BlockDevice;

/// The longest an operation stays held before it goes through on its own.
pub const HOLD_MAX: Duration = Duration::from_secs(300);

/// What the gate does with operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GateMode {
    /// Everything passes at once (opening the engine, checking after a crash).
    Open,
    /// Every operation waits for the scheduler.
    Scheduled,
    /// The power is off: every operation, held or new, fails with EIO.
    Dead,
}

/// One operation waiting at the gate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldOp {
    pub ticket: u64,
    /// The issuing thread's name (stable across runs, unlike its id).
    pub thread: String,
    /// Which device (the name given to [`SchedDevice::new`]).
    pub device: &'static str,
    pub kind: OpKind,
    pub offset: u64,
    pub len_bytes: u64,
}

impl HeldOp {
    /// The sort key: independent of arrival order.
    fn key(&self) -> (&str, &str, usize, u64, u64, u64) {
        (
            &self.thread,
            self.device,
            self.kind as usize,
            self.offset,
            self.len_bytes,
            self.ticket,
        )
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Wait,
    Go,
    Fail,
}

struct Gate {
    mode: GateMode,
    next_ticket: u64,
    /// With the thread waiting for each (woken alone when its verdict changes).
    held: Vec<(HeldOp, Verdict, Thread)>,
    /// The engine's own blocking points (`logcache_engine::sync`): locks found taken,
    /// condition-variable waits, thread starts.
    sync: Vec<SyncOp>,
    /// Releases other than lock retries: a lock found taken may have been freed since.
    progress: u64,
    /// The virtual clock, in nanoseconds since `Shared::epoch`: moved only by firing a timer.
    clock_ns: u64,
    timed_out: u64,
    released: u64,
}

/// What a thread stopped at the engine's seam waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncKind {
    /// A lock was taken: it may look again once something else ran.
    Lock,
    /// A condition-variable wait: it goes once notified, or when its timer is fired.
    Wait,
    /// A new thread, before its first step.
    Start,
}

struct SyncOp {
    ticket: u64,
    /// The thread's name: with the ticket, the order in which ready ones are listed.
    thread: String,
    kind: SyncKind,
    /// The lock's or condition variable's address (matching only, never ordering).
    id: usize,
    notified: bool,
    /// A timed wait: its deadline on the virtual clock, and on the real one (used while the
    /// gate is not `Scheduled`).
    deadline_ns: Option<u64>,
    real_deadline: Option<Instant>,
    /// `Gate::progress` when it was registered (a lock retry is due once it moved).
    progress: u64,
    timer_fired: bool,
    verdict: Verdict,
    /// The thread stopped here: woken alone when its verdict changes.
    waiter: Thread,
}

/// A thread stopped at the engine's seam the scheduler may let go now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadySync {
    pub ticket: u64,
    pub kind: SyncKind,
    pub thread: String,
}

/// A timed wait nobody notified: firing it moves the virtual clock to its deadline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Timer {
    pub ticket: u64,
    pub deadline_ns: u64,
    pub thread: String,
}

struct Shared {
    /// Time zero of the virtual clock.
    epoch: Instant,
    driver: Mutex<Option<std::thread::ThreadId>>,
    /// Each waiting thread parks (`std::thread::park`) and is unparked alone when its verdict
    /// changes: a release wakes one thread, not every held one (on a loaded machine each
    /// needless wake-up was a context switch `settle` had to wait out).
    gate: Mutex<Gate>,
    /// Bumped on every arrival, release and [`Scheduler::touch`]: `settle` waits until it stays.
    version: AtomicU64,
}

/// The gate all [`SchedDevice`]s of one simulation share. Cloning shares it.
#[derive(Clone)]
pub struct Scheduler {
    shared: Arc<Shared>,
}

impl Default for Scheduler {
    fn default() -> Self {
        Scheduler::new()
    }
}

impl Scheduler {
    pub fn new() -> Scheduler {
        Scheduler {
            shared: Arc::new(Shared {
                epoch: Instant::now(),
                driver: Mutex::new(None),
                gate: Mutex::new(Gate {
                    mode: GateMode::Open,
                    next_ticket: 0,
                    held: Vec::new(),
                    sync: Vec::new(),
                    progress: 0,
                    clock_ns: 0,
                    timed_out: 0,
                    released: 0,
                }),
                version: AtomicU64::new(0),
            }),
        }
    }

    /// Sets the mode. Leaving `Scheduled` lets held operations go (`Open`) or fail (`Dead`).
    pub fn set_mode(&self, mode: GateMode) {
        let mut g = self.shared.gate.lock();
        g.mode = mode;
        if mode != GateMode::Scheduled {
            let verdict = if mode == GateMode::Dead {
                Verdict::Fail
            } else {
                Verdict::Go
            };
            for (_, v, _) in g.held.iter_mut().filter(|(_, v, _)| *v == Verdict::Wait) {
                *v = verdict;
            }
            // Unscheduled, the seam behaves as plain locks and condition variables: lock
            // retries and starts go, notified waits go, timed waits go at their real deadline.
            for op in g.sync.iter_mut().filter(|op| op.verdict == Verdict::Wait) {
                if op.kind != SyncKind::Wait || op.notified {
                    op.verdict = Verdict::Go;
                }
            }
        }
        // Every waiter looks again (a timed wait's real deadline counts from now on).
        let waiters: Vec<Thread> = (g.held.iter().map(|h| h.2.clone()))
            .chain(g.sync.iter().map(|op| op.waiter.clone()))
            .collect();
        drop(g);
        self.touch();
        waiters.iter().for_each(Thread::unpark);
    }

    pub fn mode(&self) -> GateMode {
        self.shared.gate.lock().mode
    }

    /// Nothing can run and no timer is due: every lock wait becomes due again. A lock waiter
    /// is retried once something moved (`Gate::progress`), but a holder may let go with no
    /// event the scheduler sees (a request that returned after it, its engine failed, doing
    /// no IO): its waiters slept for ever (cache-loss sim seed 104622: a TRIM and a write
    /// waited for an export's gate after the export had ended). A retry of a lock still taken
    /// only registers the wait again.
    pub fn retry_locks(&self) {
        self.shared.gate.lock().progress += 1;
    }

    /// Marks a change the scheduler should wait to settle (a request finished).
    pub fn touch(&self) {
        self.shared.version.fetch_add(1, Ordering::SeqCst);
    }

    /// The operations waiting now, in a stable order (thread name, device, kind, offset).
    pub fn held(&self) -> Vec<HeldOp> {
        let g = self.shared.gate.lock();
        let mut v: Vec<HeldOp> = g
            .held
            .iter()
            .filter(|(_, v, _)| *v == Verdict::Wait)
            .map(|(op, _, _)| op.clone())
            .collect();
        v.sort_by(|a, b| a.key().cmp(&b.key()));
        v
    }

    /// Lets the held operation `ticket` through, or fails it with EIO (`fail`). False if it is
    /// not held (any more).
    pub fn release(&self, ticket: u64, fail: bool) -> bool {
        let mut g = self.shared.gate.lock();
        let Some((_, v, waiter)) = g
            .held
            .iter_mut()
            .find(|(op, v, _)| op.ticket == ticket && *v == Verdict::Wait)
        else {
            return false;
        };
        *v = if fail { Verdict::Fail } else { Verdict::Go };
        let waiter = waiter.clone();
        g.released += 1;
        g.progress += 1;
        drop(g);
        self.touch();
        waiter.unpark();
        true
    }

    /// Operations that passed only because they were held longer than [`HOLD_MAX`].
    pub fn timed_out(&self) -> u64 {
        self.shared.gate.lock().timed_out
    }

    /// Operations released (or failed) by the scheduler so far.
    pub fn released(&self) -> u64 {
        self.shared.gate.lock().released
    }

    /// The threads stopped at the engine's seam that may go now, in ticket order (one thread
    /// runs at a time, so tickets are handed out in the same order on a replay): notified
    /// waits, new threads, and lock retries once something else ran since.
    pub fn ready_sync(&self) -> Vec<ReadySync> {
        let g = self.shared.gate.lock();
        if g.mode != GateMode::Scheduled {
            return Vec::new();
        }
        let mut v: Vec<ReadySync> = g
            .sync
            .iter()
            .filter(|op| op.verdict == Verdict::Wait)
            .filter(|op| match op.kind {
                SyncKind::Lock => op.progress < g.progress,
                SyncKind::Wait => op.notified,
                SyncKind::Start => true,
            })
            .map(|op| ReadySync {
                ticket: op.ticket,
                kind: op.kind,
                thread: op.thread.clone(),
            })
            .collect();
        v.sort_by(|a, b| (&a.thread, a.ticket).cmp(&(&b.thread, b.ticket)));
        v
    }

    /// The timed waits nobody notified, earliest deadline first.
    pub fn timers(&self) -> Vec<Timer> {
        let g = self.shared.gate.lock();
        if g.mode != GateMode::Scheduled {
            return Vec::new();
        }
        let mut v: Vec<Timer> = g
            .sync
            .iter()
            .filter(|op| op.verdict == Verdict::Wait && !op.notified)
            .filter_map(|op| {
                op.deadline_ns.map(|d| Timer {
                    ticket: op.ticket,
                    deadline_ns: d,
                    thread: op.thread.clone(),
                })
            })
            .collect();
        v.sort_by(|a, b| {
            (a.deadline_ns, &a.thread, a.ticket).cmp(&(b.deadline_ns, &b.thread, b.ticket))
        });
        v
    }

    /// Lets a thread stopped at the seam go (`ready_sync`), or fires a timer (`timers`: the
    /// virtual clock moves to its deadline). False if it is not waiting (any more).
    pub fn release_sync(&self, ticket: u64) -> bool {
        let mut g = self.shared.gate.lock();
        let Some(i) = g
            .sync
            .iter()
            .position(|op| op.ticket == ticket && op.verdict == Verdict::Wait)
        else {
            return false;
        };
        if g.sync[i].kind == SyncKind::Wait && !g.sync[i].notified {
            let d = g.sync[i].deadline_ns.expect("only timed waits are fired");
            g.clock_ns = g.clock_ns.max(d);
            g.sync[i].timer_fired = true;
        }
        if g.sync[i].kind != SyncKind::Lock {
            g.progress += 1;
        }
        g.sync[i].verdict = Verdict::Go;
        let waiter = g.sync[i].waiter.clone();
        drop(g);
        self.touch();
        waiter.unpark();
        true
    }

    /// The virtual clock.
    pub fn now(&self) -> Instant {
        self.shared.epoch + Duration::from_nanos(self.shared.gate.lock().clock_ns)
    }

    /// The virtual clock, in nanoseconds since the scheduler was made.
    pub fn clock_ns(&self) -> u64 {
        self.shared.gate.lock().clock_ns
    }

    /// Whether the calling thread runs under the scheduler now: the gate is `Scheduled` and
    /// it is not the thread driving the scheduler (`set_driver`).
    pub fn scheduled(&self) -> bool {
        let driver = *self.shared.driver.lock();
        self.mode() == GateMode::Scheduled && driver != Some(std::thread::current().id())
    }

    /// Names the calling thread as the one driving the scheduler: its locks are plain ones
    /// (it only looks while every other thread is stopped).
    pub fn set_driver(&self) {
        // `settle` sleeps 20-200 us at a time: the default 50 us timer slack would stretch
        // each of those sleeps, thousands of them per schedule.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
        *self.shared.driver.lock() = Some(std::thread::current().id());
    }

    /// A lock was found taken: returns when the thread may look again (at once unless
    /// `Scheduled`).
    pub fn lock_wait(&self, id: usize) {
        let mut g = self.shared.gate.lock();
        if g.mode != GateMode::Scheduled {
            return;
        }
        let t = Self::push_sync(&mut g, SyncKind::Lock, id, None);
        self.touch();
        self.wait_sync(g, t);
    }

    /// A condition-variable wait begins (its lock still held): its ticket.
    pub fn wait_begin(&self, cv: usize, timeout: Option<Duration>) -> u64 {
        let mut g = self.shared.gate.lock();
        let t = Self::push_sync(&mut g, SyncKind::Wait, cv, timeout);
        self.touch();
        t
    }

    /// Blocks until the wait `ticket` may go: true if its timer fired.
    pub fn wait_end(&self, ticket: u64) -> bool {
        let g = self.shared.gate.lock();
        self.wait_sync(g, ticket)
    }

    /// Notifies waits on `cv`: every one, or the oldest.
    pub fn notify(&self, cv: usize, all: bool) {
        let mut g = self.shared.gate.lock();
        let scheduled = g.mode == GateMode::Scheduled;
        let mut any = false;
        // Scheduled, a notified wait only becomes ready (the scheduler lets it go): nobody
        // needs waking until then.
        let mut woken = Vec::new();
        for op in g.sync.iter_mut().filter(|op| {
            op.kind == SyncKind::Wait && op.id == cv && op.verdict == Verdict::Wait && !op.notified
        }) {
            op.notified = true;
            if !scheduled {
                op.verdict = Verdict::Go;
                woken.push(op.waiter.clone());
            }
            any = true;
            if !all {
                break; // `sync` is in ticket order: the oldest wait.
            }
        }
        drop(g);
        if any {
            self.touch();
            woken.iter().for_each(Thread::unpark);
        }
    }

    /// A thread is about to be spawned: its ticket, for `start_wait`.
    pub fn start_begin(&self) -> u64 {
        let mut g = self.shared.gate.lock();
        let t = Self::push_sync(&mut g, SyncKind::Start, 0, None);
        if g.mode != GateMode::Scheduled {
            let i = g.sync.len() - 1;
            g.sync[i].verdict = Verdict::Go;
        }
        self.touch();
        t
    }

    /// Waits until the new thread may start: false if the power is off (`Dead`) by then, so
    /// it never runs (a real power cut leaves no thread to start).
    pub fn start_wait(&self, ticket: u64) -> bool {
        let g = self.shared.gate.lock();
        self.wait_sync(g, ticket);
        self.mode() != GateMode::Dead
    }

    fn push_sync(g: &mut Gate, kind: SyncKind, id: usize, timeout: Option<Duration>) -> u64 {
        let ticket = g.next_ticket;
        g.next_ticket += 1;
        let op = SyncOp {
            ticket,
            thread: std::thread::current()
                .name()
                .unwrap_or("unnamed")
                .to_string(),
            kind,
            id,
            notified: false,
            deadline_ns: timeout.map(|t| g.clock_ns.saturating_add(t.as_nanos() as u64)),
            real_deadline: timeout.map(|t| Instant::now() + t),
            progress: g.progress,
            timer_fired: false,
            verdict: Verdict::Wait,
            waiter: std::thread::current(),
        };
        g.sync.push(op);
        ticket
    }

    /// Waits until the seam's op `ticket` is let go; true if its timer fired. Unscheduled, a
    /// timed wait fires at its real deadline.
    fn wait_sync<'a>(&'a self, mut g: parking_lot::MutexGuard<'a, Gate>, ticket: u64) -> bool {
        loop {
            let i = g
                .sync
                .iter()
                .position(|op| op.ticket == ticket)
                .expect("a waiting thread stays listed until it leaves");
            if g.sync[i].verdict != Verdict::Wait {
                let op = g.sync.remove(i);
                return op.timer_fired;
            }
            // A new thread's start was registered by its spawner: the waiter is this thread.
            g.sync[i].waiter = std::thread::current();
            let real = g.sync[i].real_deadline;
            if g.mode != GateMode::Scheduled && real.is_some_and(|d| Instant::now() >= d) {
                // Not scheduled (opening the engine, checking after a crash): real time
                // passes, the virtual clock does not (how often this fires is the machine's).
                g.sync.remove(i);
                return true;
            }
            let until = match real {
                Some(d) if g.mode != GateMode::Scheduled => d,
                _ => Instant::now() + HOLD_MAX,
            };
            g = Self::park_until(g, until, &self.shared.gate);
        }
    }

    /// Parks the calling thread (the gate unlocked meanwhile) until it is unparked or `until`
    /// passes, and locks the gate again. Wakes may be spurious: callers look again.
    fn park_until<'a>(
        g: parking_lot::MutexGuard<'a, Gate>,
        until: Instant,
        gate: &'a Mutex<Gate>,
    ) -> parking_lot::MutexGuard<'a, Gate> {
        drop(g);
        std::thread::park_timeout(until.saturating_duration_since(Instant::now()));
        gate.lock()
    }

    /// Waits until the process is quiescent: every other thread (but the main one) asleep, and
    /// no arrival, release or touch for two looks in a row. False if `timeout` passed first
    /// (a thread kept running: a busy loop, or a machine too loaded to tell).
    pub fn settle(&self, timeout: Duration) -> bool {
        let until = Instant::now() + timeout;
        let mut pause = Duration::from_micros(20);
        loop {
            let before = self.shared.version.load(Ordering::SeqCst);
            if others_asleep() {
                std::thread::sleep(pause);
                if others_asleep() && self.shared.version.load(Ordering::SeqCst) == before {
                    return true;
                }
            } else {
                std::thread::yield_now();
            }
            if Instant::now() >= until {
                return false;
            }
            pause = (pause * 2).min(Duration::from_micros(200));
        }
    }

    /// The door: returns when the scheduler lets the operation through, or its error.
    fn pass(
        &self,
        device: &'static str,
        kind: OpKind,
        offset: u64,
        len_bytes: u64,
    ) -> io::Result<()> {
        let mut g = self.shared.gate.lock();
        match g.mode {
            GateMode::Open => return Ok(()),
            GateMode::Dead => return Err(eio()),
            GateMode::Scheduled => {}
        }
        let ticket = g.next_ticket;
        g.next_ticket += 1;
        let thread = std::thread::current()
            .name()
            .unwrap_or("unnamed")
            .to_string();
        g.held.push((
            HeldOp {
                ticket,
                thread,
                device,
                kind,
                offset,
                len_bytes,
            },
            Verdict::Wait,
            std::thread::current(),
        ));
        self.touch();
        let until = Instant::now() + HOLD_MAX;
        let verdict = loop {
            let i = g
                .held
                .iter()
                .position(|(op, _, _)| op.ticket == ticket)
                .expect("a held operation stays listed until it leaves");
            let v = g.held[i].1;
            if v != Verdict::Wait {
                g.held.swap_remove(i);
                break v;
            }
            if Instant::now() >= until {
                g.timed_out += 1;
                g.held.swap_remove(i);
                break Verdict::Go;
            }
            g = Self::park_until(g, until, &self.shared.gate);
        };
        drop(g);
        match verdict {
            Verdict::Fail => Err(eio()),
            _ => Ok(()),
        }
    }
}

fn eio() -> io::Error {
    io::Error::from_raw_os_error(libc::EIO)
}

/// Whether every thread of this process but the caller and the main thread is asleep ('S':
/// in a futex, a condition variable, a channel).
///
/// Each thread's stat file stays open between looks (one `pread` per thread instead of an
/// open, a read and a close: `settle` looks thousands of times per schedule, and on a loaded
/// machine its system time was most of the simulation's CPU).
fn others_asleep() -> bool {
    use std::os::unix::fs::FileExt;
    static STATS: Mutex<Vec<(i32, std::fs::File)>> = Mutex::new(Vec::new());
    let me = unsafe { libc::gettid() };
    let pid = std::process::id() as i32;
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return true;
    };
    let mut stats = STATS.lock();
    let mut seen = Vec::with_capacity(stats.len() + 4);
    let mut buf = [0u8; 512];
    let mut asleep = true;
    for entry in dir.flatten() {
        let Some(tid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        if tid == me || tid == pid {
            continue;
        }
        seen.push(tid);
        if !asleep {
            continue; // Only listing the threads, to forget the ones gone.
        }
        let i = match stats.iter().position(|(t, _)| *t == tid) {
            Some(i) => i,
            None => match std::fs::File::open(entry.path().join("stat")) {
                Ok(f) => {
                    stats.push((tid, f));
                    stats.len() - 1
                }
                Err(_) => continue, // The thread exited meanwhile.
            },
        };
        // A thread that exited reads as an error (its id may since be another thread's: that
        // one is opened afresh next time, once this entry is forgotten).
        let Ok(n) = stats[i].1.read_at(&mut buf, 0) else {
            stats.swap_remove(i);
            continue;
        };
        // "tid (comm) S ...": the state follows the last ')' (comm may hold one).
        let stat = &buf[..n];
        let state = stat
            .iter()
            .rposition(|&b| b == b')')
            .and_then(|i| stat[i + 1..].iter().find(|b| !b.is_ascii_whitespace()));
        if !matches!(state, Some(b'S') | Some(b'Z') | Some(b'X') | None) {
            asleep = false;
        }
    }
    stats.retain(|(t, _)| seen.contains(t));
    asleep
}

/// A [`BlockDevice`] wrapper whose every operation passes the [`Scheduler`]'s gate.
pub struct SchedDevice {
    inner: Arc<dyn BlockDevice>,
    name: &'static str,
    sched: Scheduler,
}

impl SchedDevice {
    pub fn new(inner: Arc<dyn BlockDevice>, name: &'static str, sched: Scheduler) -> SchedDevice {
        SchedDevice { inner, name, sched }
    }

    fn pass(&self, kind: OpKind, offset: u64, len_bytes: u64) -> io::Result<()> {
        self.sched.pass(self.name, kind, offset, len_bytes)
    }
}

impl BlockDevice for SchedDevice {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.pass(OpKind::Read, offset, buf.len() as u64)?;
        self.inner.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.pass(OpKind::Write, offset, buf.len() as u64)?;
        self.inner.write_at(buf, offset)
    }

    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        let len = bufs.iter().map(|b| b.len() as u64).sum();
        self.pass(OpKind::Write, offset, len)?;
        self.inner.write_vectored_at(bufs, offset)
    }

    fn flush(&self) -> io::Result<()> {
        self.pass(OpKind::Flush, 0, 0)?;
        self.inner.flush()
    }

    fn discard(&self, offset: u64, len_bytes: u64) -> io::Result<()> {
        self.pass(OpKind::Discard, offset, len_bytes)?;
        self.inner.discard(offset, len_bytes)
    }

    fn write_zeroes(&self, offset: u64, len_bytes: u64) -> io::Result<()> {
        self.pass(OpKind::Discard, offset, len_bytes)?;
        self.inner.write_zeroes(offset, len_bytes)
    }

    fn describe(&self) -> String {
        format!("scheduled {}", self.inner.describe())
    }

    fn read_gap_bytes_max(&self) -> u64 {
        self.inner.read_gap_bytes_max()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::SimDevice;

    #[test]
    fn held_operations_pass_one_at_a_time_in_a_stable_order() {
        let sched = Scheduler::new();
        let dev = Arc::new(SchedDevice::new(
            Arc::new(SimDevice::new(1 << 20)),
            "cache",
            sched.clone(),
        ));
        sched.set_mode(GateMode::Scheduled);
        let threads: Vec<_> = (0..3u64)
            .map(|i| {
                let dev = dev.clone();
                std::thread::Builder::new()
                    .name(format!("t{i}"))
                    .spawn(move || dev.write_at(&[i as u8; 512], i * 512))
                    .unwrap()
            })
            .collect();
        let until = Instant::now() + Duration::from_secs(60);
        while sched.held().len() < 3 {
            assert!(Instant::now() < until, "the writes never reached the gate");
            std::thread::sleep(Duration::from_millis(1));
        }
        let held = sched.held();
        let names: Vec<_> = held.iter().map(|h| h.thread.as_str()).collect();
        assert_eq!(names, ["t0", "t1", "t2"]);
        assert!(sched.release(held[1].ticket, true));
        assert!(!sched.release(held[1].ticket, false), "released twice");
        assert!(sched.release(held[0].ticket, false));
        sched.set_mode(GateMode::Dead);
        let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert!(results[0].is_ok());
        assert!(results[1].is_err() && results[2].is_err());
        assert_eq!(sched.released(), 2);
        sched.set_mode(GateMode::Open);
        dev.flush().unwrap();
        assert_eq!(sched.timed_out(), 0);
    }
}
