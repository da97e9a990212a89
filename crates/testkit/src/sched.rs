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
//! What is deterministic, and what is not: the choice at each step is a function of the seed and
//! of the set of held operations. That set is the same on a replay as long as the threads that
//! run between two quiescent points end in the same place, which holds when each step wakes one
//! thread, and usually when it wakes two (a request and the flusher it notified) that touch
//! different state. Two things are not controlled: the wall clock (the engine's timed waits:
//! periodic seal, writeback polling) and lock races between threads a step woke together.
//! A failing seed therefore replays the same schedule in most runs, not by construction.
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

use parking_lot::{Condvar, Mutex};

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
    held: Vec<(HeldOp, Verdict)>,
    timed_out: u64,
    released: u64,
}

struct Shared {
    gate: Mutex<Gate>,
    changed: Condvar,
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
                gate: Mutex::new(Gate {
                    mode: GateMode::Open,
                    next_ticket: 0,
                    held: Vec::new(),
                    timed_out: 0,
                    released: 0,
                }),
                changed: Condvar::new(),
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
            for (_, v) in g.held.iter_mut().filter(|(_, v)| *v == Verdict::Wait) {
                *v = verdict;
            }
        }
        drop(g);
        self.touch();
        self.shared.changed.notify_all();
    }

    pub fn mode(&self) -> GateMode {
        self.shared.gate.lock().mode
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
            .filter(|(_, v)| *v == Verdict::Wait)
            .map(|(op, _)| op.clone())
            .collect();
        v.sort_by(|a, b| a.key().cmp(&b.key()));
        v
    }

    /// Lets the held operation `ticket` through, or fails it with EIO (`fail`). False if it is
    /// not held (any more).
    pub fn release(&self, ticket: u64, fail: bool) -> bool {
        let mut g = self.shared.gate.lock();
        let Some((_, v)) = g
            .held
            .iter_mut()
            .find(|(op, v)| op.ticket == ticket && *v == Verdict::Wait)
        else {
            return false;
        };
        *v = if fail { Verdict::Fail } else { Verdict::Go };
        g.released += 1;
        drop(g);
        self.touch();
        self.shared.changed.notify_all();
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
        ));
        self.touch();
        let until = Instant::now() + HOLD_MAX;
        let verdict = loop {
            let i = g
                .held
                .iter()
                .position(|(op, _)| op.ticket == ticket)
                .expect("a held operation stays listed until it leaves");
            let v = g.held[i].1;
            if v != Verdict::Wait {
                g.held.swap_remove(i);
                break v;
            }
            if self.shared.changed.wait_until(&mut g, until).timed_out() {
                g.timed_out += 1;
                let i = g.held.iter().position(|(op, _)| op.ticket == ticket);
                g.held.swap_remove(i.expect("still listed"));
                break Verdict::Go;
            }
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
fn others_asleep() -> bool {
    let me = unsafe { libc::gettid() };
    let pid = std::process::id() as i32;
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return true;
    };
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
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue; // The thread exited meanwhile.
        };
        // "tid (comm) S ...": the state follows the last ')' (comm may hold one).
        let state = stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].trim_start().chars().next());
        if !matches!(state, Some('S') | Some('Z') | Some('X') | None) {
            return false;
        }
    }
    true
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
