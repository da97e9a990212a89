//! What a process or a thread used over a measurement, from `getrusage`: CPU time, context
//! switches and page faults, so a benchmark can report them per operation (they hold on a
//! loaded machine where the operations per second do not).

use std::ops::Sub;

#[derive(Clone, Copy, Debug, Default)]
pub struct Usage {
    /// User + system CPU time.
    pub cpu_seconds: f64,
    /// Context switches: waits (voluntary) and preemptions (involuntary).
    pub voluntary_switches: u64,
    pub involuntary_switches: u64,
    /// Page faults served without IO (a fresh page zeroed, a page mapped in).
    pub minor_faults: u64,
}

impl Usage {
    /// Every thread of this process so far.
    pub fn process() -> Usage {
        Usage::of(libc::RUSAGE_SELF)
    }

    /// The calling thread so far.
    pub fn thread() -> Usage {
        Usage::of(libc::RUSAGE_THREAD)
    }

    fn of(who: libc::c_int) -> Usage {
        // SAFETY: getrusage writes only the struct it is given.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        let rc = unsafe { libc::getrusage(who, &mut ru) };
        assert_eq!(rc, 0, "getrusage({who}) cannot fail");
        let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        Usage {
            cpu_seconds: secs(ru.ru_utime) + secs(ru.ru_stime),
            voluntary_switches: ru.ru_nvcsw as u64,
            involuntary_switches: ru.ru_nivcsw as u64,
            minor_faults: ru.ru_minflt as u64,
        }
    }

    /// The sum of two threads' usage.
    pub fn plus(self, o: Usage) -> Usage {
        Usage {
            cpu_seconds: self.cpu_seconds + o.cpu_seconds,
            voluntary_switches: self.voluntary_switches + o.voluntary_switches,
            involuntary_switches: self.involuntary_switches + o.involuntary_switches,
            minor_faults: self.minor_faults + o.minor_faults,
        }
    }

    /// Per operation, as JSON fields named `{prefix}_cpu_us_per_write` and so on.
    pub fn per_op_json(
        &self,
        prefix: &str,
        ops: u64,
    ) -> serde_json::Map<String, serde_json::Value> {
        let n = ops.max(1) as f64;
        let round = |x: f64, places: i32| {
            let f = 10f64.powi(places);
            (x * f).round() / f
        };
        let mut m = serde_json::Map::new();
        m.insert(
            format!("{prefix}_cpu_us_per_write"),
            round(self.cpu_seconds * 1e6 / n, 3).into(),
        );
        m.insert(
            format!("{prefix}_waits_per_write"),
            round(self.voluntary_switches as f64 / n, 6).into(),
        );
        m.insert(
            format!("{prefix}_preemptions_per_write"),
            round(self.involuntary_switches as f64 / n, 6).into(),
        );
        m.insert(
            format!("{prefix}_page_faults_per_write"),
            round(self.minor_faults as f64 / n, 6).into(),
        );
        m
    }
}

/// Where the calling thread's time went so far, from `/proc/thread-self/schedstat`: on a CPU,
/// and runnable but waiting for one (preempted, or woken and not yet run). The rest of the wall
/// time it slept (a lock parked, a wait for room). None where the file is missing.
#[derive(Clone, Copy, Debug, Default)]
pub struct SchedTime {
    pub on_cpu_ns: u64,
    pub runnable_ns: u64,
}

impl SchedTime {
    pub fn thread() -> Option<SchedTime> {
        let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
        let mut f = s.split_whitespace().map(|x| x.parse::<u64>().ok());
        Some(SchedTime {
            on_cpu_ns: f.next()??,
            runnable_ns: f.next()??,
        })
    }

    pub fn since(self, before: SchedTime) -> SchedTime {
        SchedTime {
            on_cpu_ns: self.on_cpu_ns - before.on_cpu_ns,
            runnable_ns: self.runnable_ns - before.runnable_ns,
        }
    }

    pub fn plus(self, o: SchedTime) -> SchedTime {
        SchedTime {
            on_cpu_ns: self.on_cpu_ns + o.on_cpu_ns,
            runnable_ns: self.runnable_ns + o.runnable_ns,
        }
    }
}

impl Sub for Usage {
    type Output = Usage;

    fn sub(self, o: Usage) -> Usage {
        Usage {
            cpu_seconds: self.cpu_seconds - o.cpu_seconds,
            voluntary_switches: self.voluntary_switches - o.voluntary_switches,
            involuntary_switches: self.involuntary_switches - o.involuntary_switches,
            minor_faults: self.minor_faults - o.minor_faults,
        }
    }
}
