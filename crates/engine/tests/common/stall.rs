//! The concurrent simulation's hang detector: progress is a client request completing (or no
//! request waiting), nothing else. IO passing the gate is not progress: a background thread
//! that keeps doing IO (writeback retrying a dead cache device's reads once a second) kept an
//! older detector reset while a write-zeroes waited for ever behind it (cache-loss seed 1201),
//! and the run became a CI timeout instead of a failing seed.
//!
//! Requests waiting with none completing hang once the harness has spent `idle_limit` waiting
//! for timers meanwhile (nothing held, nothing to start: only timed retries and polls can move
//! anything), or once `ios_limit` IOs went through the gate meanwhile (a retry loop with no
//! timer), or, as a backstop, after `wall_limit`: threads that wake each other in a loop are
//! rarely all asleep, so each step waits long for quiescence and the run crawls without
//! either count growing (the writer/flusher livelock did that: sweeps ran past their time
//! limit with nothing printed). The wall limit is far above the longest legitimate wait seen
//! (19.9 s, at load 23); the summary prints the largest of each seen.
//!
//! A stall names what is stuck: the IO let through meanwhile, per thread, device and kind;
//! the IO held now; each thread's state and the CPU it burnt meanwhile (a thread that spins
//! shows here, one asleep for ever shows as 0).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use logcache_testkit::sched::HeldOp;

/// Watches one run of requests for a stall. Call [`Stall::look`] at every step.
pub struct Stall {
    /// Time spent waiting for timers with none completing, while some wait, that is a hang.
    idle_limit: Duration,
    /// IOs through the gate with none completing that is a hang.
    ios_limit: u64,
    /// Wall time with none completing that is a hang.
    wall_limit: Duration,
    /// Requests completed at the last progress.
    completed: u64,
    since: Instant,
    /// Waiting for timers since the last progress, and whether the last look was such a wait
    /// (then the time until this look counts).
    idle: Duration,
    last_look: Option<(Instant, bool)>,
    /// Looks taken since the last progress.
    looks: u64,
    /// Held IOs seen since the last progress (tickets), and their count per thread, device
    /// and kind.
    seen: BTreeSet<u64>,
    ios: BTreeMap<String, u64>,
    /// Each thread's CPU time (clock ticks) at the last progress, by thread id.
    cpu_at: BTreeMap<i32, u64>,
    /// The largest idle time, IO count and wall time of one wait so far (the limits' margins).
    longest: (Duration, u64, Duration),
}

impl Stall {
    pub fn new(idle_limit: Duration, ios_limit: u64, wall_limit: Duration) -> Stall {
        Stall {
            idle_limit,
            ios_limit,
            wall_limit,
            completed: 0,
            since: Instant::now(),
            idle: Duration::ZERO,
            last_look: None,
            looks: 0,
            seen: BTreeSet::new(),
            ios: BTreeMap::new(),
            cpu_at: cpu_by_thread(),
            longest: (Duration::ZERO, 0, Duration::ZERO),
        }
    }

    /// The largest time spent waiting for timers in one wait, the most IOs through the gate in
    /// one, and the longest one, so far.
    pub fn longest(&self) -> (Duration, u64, Duration) {
        self.longest
    }

    /// One step: `completed` requests have completed so far, `waiting` are running now,
    /// `held` is the IO held at the gate, and `idle` says the caller will now wait for a timer
    /// (nothing held, nothing to start). `Err` describes a hang.
    pub fn look(
        &mut self,
        completed: u64,
        waiting: usize,
        held: &[HeldOp],
        idle: bool,
    ) -> Result<(), String> {
        let now = Instant::now();
        if let Some((at, true)) = self.last_look {
            self.idle += now - at;
        }
        self.last_look = Some((now, idle));
        if completed != self.completed || waiting == 0 {
            self.progress(completed);
            return Ok(());
        }
        self.looks += 1;
        for h in held {
            if self.seen.insert(h.ticket) {
                let what = format!("{} {} {:?}", h.thread, h.device, h.kind);
                *self.ios.entry(what).or_insert(0) += 1;
            }
        }
        if self.idle <= self.idle_limit
            && (self.seen.len() as u64) < self.ios_limit
            && self.since.elapsed() <= self.wall_limit
        {
            return Ok(());
        }
        Err(self.report(waiting, held))
    }

    fn progress(&mut self, completed: u64) {
        self.longest = (
            self.longest.0.max(self.idle),
            self.longest.1.max(self.seen.len() as u64),
            self.longest.2.max(self.since.elapsed()),
        );
        self.completed = completed;
        self.since = Instant::now();
        self.idle = Duration::ZERO;
        self.looks = 0;
        self.seen.clear();
        self.ios.clear();
        self.cpu_at = cpu_by_thread();
    }

    fn report(&self, waiting: usize, held: &[HeldOp]) -> String {
        let mut s = format!(
            "{waiting} request(s) waited {:.1?} with none completing ({:.1?} of it waiting for \
             timers, {} looks, {} IOs through the gate); IO let through meanwhile: ",
            self.since.elapsed(),
            self.idle,
            self.looks,
            self.seen.len()
        );
        if self.ios.is_empty() {
            s.push_str("none");
        }
        for (what, n) in &self.ios {
            let _ = write!(s, "[{what} x{n}] ");
        }
        s.push_str("; held now: ");
        if held.is_empty() {
            s.push_str("none");
        }
        for h in held {
            let _ = write!(
                s,
                "[{} {} {:?} {}+{}] ",
                h.thread, h.device, h.kind, h.offset, h.len_bytes
            );
        }
        s.push_str("; threads (state, CPU ms meanwhile): ");
        let tick_ms = 1000 / clock_ticks_per_second().max(1);
        for t in threads() {
            let before = self.cpu_at.get(&t.tid).copied().unwrap_or(0);
            let _ = write!(
                s,
                "[{} {} {}] ",
                t.name,
                t.state,
                t.cpu_ticks.saturating_sub(before) * tick_ms
            );
        }
        s
    }
}

/// The names of the process's threads that are running or runnable now (state 'R'), for a
/// message about a process that never became quiescent.
pub fn running_threads() -> Vec<String> {
    threads()
        .into_iter()
        .filter(|t| t.state == 'R')
        .map(|t| t.name)
        .collect()
}

fn cpu_by_thread() -> BTreeMap<i32, u64> {
    threads()
        .into_iter()
        .map(|t| (t.tid, t.cpu_ticks))
        .collect()
}

struct ThreadStat {
    tid: i32,
    name: String,
    state: char,
    cpu_ticks: u64,
}

/// Every thread of this process, from `/proc/self/task/*/stat` (threads that exit meanwhile
/// are skipped).
fn threads() -> Vec<ThreadStat> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    let mut out: Vec<ThreadStat> = dir
        .flatten()
        .filter_map(|entry| {
            let tid = entry.file_name().to_str()?.parse::<i32>().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // "tid (comm) S ppid ...": comm may hold ')', so split at the last one. After it,
            // field 0 is the state, 11 utime, 12 stime (proc(5)).
            let open = stat.find('(')?;
            let close = stat.rfind(')')?;
            let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
            let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
            Some(ThreadStat {
                tid,
                name: stat[open + 1..close].to_string(),
                state: fields.first()?.chars().next()?,
                cpu_ticks: ticks(11)? + ticks(12)?,
            })
        })
        .collect();
    out.sort_by(|a, b| (&a.name, a.tid).cmp(&(&b.name, b.tid)));
    out
}

fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf reads a constant of the system; no memory is passed.
    let n = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if n > 0 {
        n as u64
    } else {
        100
    }
}
